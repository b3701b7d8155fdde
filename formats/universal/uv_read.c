/* uv_read.c: describing a universal checkpoint folder (universal.h) for reshard.
 *
 * zero/optimizer_state.pt gives the stage, the step (stage 3) and the param groups; the
 * carried model-states file the manifest (uv_manifest.c); each zero/<param>/<state>.pt one
 * tensor, checked against param_shapes. Per-parameter files are opened one
 * at a time and closed again (a model may have thousands of params); their stores reopen
 * the file for each read, which happens in large ranges. The rank-0 model file and
 * optimizer_state.pt stay open: writers carry their pickled objects over. */
#include "uv_internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io.h"
#include "manifest.h"

#include "hash_xxh3.h"

static bool zck__uv_is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool zck__uv_is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The tag latest_universal in dir names (trimmed), or NULL (error set) if unreadable or
 * not a folder name; *was_read (optional): the file was there and read, so its error is
 * about what it says. */
static zck_status zck__uv_latest(const char *dir, char **out, char **lu_path, bool *was_read) {
  *out = NULL;
  if (was_read) *was_read = false;
  char *lu = zck__path_join(dir, "latest_universal");
  if (!lu) return ZCK_ERR_NO_MEMORY;
  char *tag = NULL;
  size_t n = 0;
  zck_status st = zck__read_small_file(lu, 4096, &tag, &n);
  if (st != ZCK_OK) {
    free(lu);
    return st;
  }
  if (was_read) *was_read = true;
  size_t a = 0;
  while (a < n && (tag[a] == ' ' || tag[a] == '\n' || tag[a] == '\r' || tag[a] == '\t')) a++;
  while (n > a && (tag[n - 1] == ' ' || tag[n - 1] == '\n' || tag[n - 1] == '\r' || tag[n - 1] == '\t')) n--;
  tag[n] = 0;
  const char *t = tag + a;
  if (!*t) st = zck__fail(ZCK_ERR_FORMAT, "%s: empty", lu);
  else if (strchr(t, '/') || strchr(t, '\\') || !strcmp(t, "..") || !strcmp(t, ".") || strlen(t) != n - a)
    st = zck__fail(ZCK_ERR_FORMAT, "%s: \"%s\" is not a folder name", lu, t);
  if (st == ZCK_OK && !(*out = zck__strdup(t))) st = ZCK_ERR_NO_MEMORY;
  free(tag);
  if (lu_path && st == ZCK_OK) *lu_path = lu;
  else free(lu);
  return st;
}

/* path: the folder itself (it has zero/), or a parent with latest_universal.
 * *root: the folder whose latest_universal names the universal folder, or NULL. */
static zck_status zck__uv_resolve(const char *path, char **dir, char **root) {
  *root = NULL;
  char *zero = zck__path_join(path, "zero");
  bool direct = zero && zck__uv_is_dir(zero);
  free(zero);
  if (direct) {
    if (!(*dir = zck__strdup(path))) return ZCK_ERR_NO_MEMORY;
    /* the parent is the save root when its latest_universal names this folder */
    char *p = zck__strdup(path);
    if (!p) return ZCK_ERR_NO_MEMORY;
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = 0;
    char *slash = strrchr(p, '/');
    const char *base = slash ? slash + 1 : p;
    char *parent = slash ? (slash == p ? zck__strdup("/") : zck__sprintf("%.*s", (int)(slash - p), p)) : zck__strdup(".");
    char *tag = NULL;
    if (parent && zck__uv_latest(parent, &tag, NULL, NULL) == ZCK_OK && !strcmp(tag, base)) *root = parent;
    else free(parent);
    zck_clear_error();
    free(tag);
    free(p);
    return ZCK_OK;
  }
  char *lu = NULL, *tag = NULL;
  bool was_read = false;
  zck_status st = zck__uv_latest(path, &tag, &lu, &was_read);
  if (st == ZCK_ERR_NO_MEMORY) return st;
  if (st != ZCK_OK && was_read) return st;   /* latest_universal is there: what is wrong with it */
  if (st != ZCK_OK)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: not a universal checkpoint (no zero/ folder, no latest_universal)", path);
  *dir = zck__path_join(path, tag);
  if (!*dir) st = ZCK_ERR_NO_MEMORY;
  else if (!zck__uv_is_dir(*dir)) {
    st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: names %s, which does not exist", lu, tag);
    free(*dir);
    *dir = NULL;
  } else if (!(*root = zck__strdup(path))) {
    st = ZCK_ERR_NO_MEMORY;
  }
  free(tag);
  free(lu);
  return st;
}

static int zck__uv_zero_stage(const zck_pk *n) {
  int64_t v;
  if (!n) return -1;
  if (n->kind == ZCK_PK_INT) return zck_pk_as_int(n, &v) && v >= 0 && v <= 3 ? (int)v : -1;
  if (n->kind != ZCK_PK_OBJECT || !n->u.obj.args || n->u.obj.args->kind != ZCK_PK_TUPLE) return -1;
  const zck_pk *a = n->u.obj.args;
  if (zck_pk_is_global(n->u.obj.callable, "deepspeed.runtime.zero.config", "ZeroStageEnum"))
    return a->u.seq.len == 1 && zck_pk_as_int(a->u.seq.items[0], &v) && v >= 0 && v <= 3 ? (int)v : -1;
  if (zck_pk_is_global(n->u.obj.callable, "builtins", "getattr") && a->u.seq.len == 2) {
    const char *s = zck_pk_as_str(a->u.seq.items[1]);
    static const char *names[] = {"disabled", "optimizer_states", "gradients", "weights"};
    for (int i = 0; s && i < 4; i++)
      if (!strcmp(s, names[i])) return i;
  }
  return -1;
}

/* An optimizer step: an int / float (FusedAdam, CPUAdam) or a one-element tensor (torch
 * Adam / AdamW), as the DeepSpeed reader takes it. */
static zck_status zck__uv_step_value(const zck_torch_file *f, const zck_pk *node, double *v, bool *is_tensor,
                                     const char *what) {
  const zck_torch_tensor *t = node ? zck_torch_tensor_of(f, node) : NULL;
  if (t) {
    uint8_t raw[16];
    if (zck_torch_tensor_numel(t) != 1 || zck_dtype_size(t->dtype) > sizeof raw || !zck_dtype_convertible(ZCK_F64, t->dtype))
      return zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a scalar", zck_torch_name(f), what);
    ZCK_TRY(zck_torch_tensor_read(f, t, raw, 0, 1));
    ZCK_TRY(zck_convert(ZCK_F64, v, t->dtype, raw, 1));
    *is_tensor = true;
    return ZCK_OK;
  }
  if (node && (node->kind == ZCK_PK_INT || node->kind == ZCK_PK_FLOAT) && zck_pk_as_double(node, v)) {
    *is_tensor = false;
    return ZCK_OK;
  }
  return zck__fail(ZCK_ERR_FORMAT, "%s: %s is neither an int nor a tensor", zck_torch_name(f), what);
}

// ---- tensor files

static int cmp_uv_piece(const void *a, const void *b) {
  const zck__uv_piece *x = a, *y = b;
  return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The record's CRC once the pieces read cover the tensor: the pieces in order (a piece read
 * twice counted once), the bytes of the record around the tensor read from s. */
static zck_status uv_check_record(zck__uv_tstore *t, const zck__source *s) {
  qsort(t->got, t->n_got, sizeof *t->got, cmp_uv_piece);
  uint64_t pos = t->rec.off, end = t->rec.off + t->rec.size;
  uint32_t crc = 0;
  uint8_t buf[4096];
  for (size_t i = 0; i <= t->n_got; i++) {
    uint64_t lo = i < t->n_got ? t->got[i].lo : end;
    if (i < t->n_got && t->got[i].hi <= pos) continue;
    if (lo < pos) return ZCK_OK; /* overlapping pieces of unequal bounds: not checked */
    for (; pos < lo;) {          /* bytes of the record outside the tensor */
      size_t n = lo - pos < sizeof buf ? (size_t)(lo - pos) : sizeof buf;
      ZCK_TRY(zck__source_read(s, buf, n, pos));
      crc = zck_crc32_combine(crc, zck_crc32_update(0, buf, n), n);
      pos += n;
    }
    if (i == t->n_got) break;
    crc = zck_crc32_combine(crc, t->got[i].crc, t->got[i].hi - t->got[i].lo);
    pos = t->got[i].hi;
  }
  if (crc != t->rec.crc32)
    return zck__fail(ZCK_ERR_DAMAGED, "%s: %s: CRC-32 mismatch (stored %08x, read %08x)", t->path,
                     t->rec.what ? t->rec.what : "tensor record", t->rec.crc32, crc);
  return ZCK_OK;
}

/* The manifest's XXH3 of the whole tensor, once the pieces read cover it: from the hash the
 * pieces fed in order, or, where some came out of order, from the tensor read again. */
static zck_status uv_check_xxh3(zck__uv_tstore *t, const zck__source *s) {
  uint64_t end = t->base + t->numel * t->es, got;
  if (t->hash_state && t->hashed_to == end) {
    got = XXH3_64bits_digest(t->hash_state);
  } else {
    XXH3_state_t *h = t->hash_state ? t->hash_state : XXH3_createState();
    t->hash_state = h;
    uint8_t *buf = h ? zck__malloc(1 << 20) : NULL;
    if (!buf) return ZCK_ERR_NO_MEMORY;
    XXH3_64bits_reset(h);
    zck_status st = ZCK_OK;
    for (uint64_t pos = t->base; st == ZCK_OK && pos < end; pos += 1 << 20) {
      size_t n = end - pos < (1 << 20) ? (size_t)(end - pos) : (size_t)1 << 20;
      st = zck__source_read(s, buf, n, pos);
      if (st == ZCK_OK) XXH3_64bits_update(h, buf, n);
    }
    free(buf);
    ZCK_TRY(st);
    got = XXH3_64bits_digest(h);
  }
  if (got != t->xxh3)
    return zck__fail(ZCK_ERR_DAMAGED, "%s: tensor bytes [%llu, %llu) differ from " ZCK_MANIFEST_NAME " (XXH3 stored %016llx, "
                     "read %016llx): replaced or damaged since zckpt wrote it", t->path, (unsigned long long)t->base,
                     (unsigned long long)end, (unsigned long long)t->xxh3, (unsigned long long)got);
  return ZCK_OK;
}

void zck__uv_tstore_free(zck__uv_tstore *t) {
  free(t->path);
  free(t->got);
  free(t->what);
  XXH3_freeState(t->hash_state);
}

zck_status zck__uv_tstore_read(void *ctx, void *dst, uint64_t off, uint64_t count) {
  zck__uv_tstore *t = ctx;
  zck__source s;
  ZCK_TRY(zck__source_open(&s, t->path));
  uint64_t at = t->base + off * t->es, n = count * t->es;
  zck_status st = zck__source_read(&s, dst, (size_t)n, at);
  if (st == ZCK_OK && (t->has_rec || t->has_xxh3) && n) {
    uint32_t crc = t->has_rec ? zck_crc32_update(0, dst, (size_t)n) : 0;
    while (atomic_flag_test_and_set_explicit(&t->lock, memory_order_acquire)) {}
    if (!t->done && t->has_xxh3 && at == t->hashed_to) {   /* in order: into the hash */
      if (!t->hash_state && at == t->base && (t->hash_state = XXH3_createState())) XXH3_64bits_reset(t->hash_state);
      if (t->hash_state) {
        XXH3_64bits_update(t->hash_state, dst, (size_t)n);
        t->hashed_to = at + n;
      }
    }
    if (!t->done) {
      bool dup = false;
      for (size_t i = 0; i < t->n_got && !dup; i++) dup = t->got[i].lo == at && t->got[i].hi == at + n;
      if (!dup && t->n_got == t->cap_got) {
        size_t nc = t->cap_got ? 2 * t->cap_got : 4;
        zck__uv_piece *g = realloc(t->got, nc * sizeof *g);
        if (g) {
          t->got = g;
          t->cap_got = nc;
        } else {
          t->done = true; /* no memory for the bookkeeping: this tensor goes unchecked */
        }
      }
      if (!dup && !t->done) {
        t->got[t->n_got++] = (zck__uv_piece){at, at + n, crc};
        t->covered += n;
      }
      if (!t->done && t->covered >= t->numel * t->es) {
        t->done = true;
        if (t->has_rec) st = uv_check_record(t, &s);
        if (st == ZCK_OK && t->has_xxh3) st = uv_check_xxh3(t, &s);
      }
    }
    atomic_flag_clear_explicit(&t->lock, memory_order_release);
  }
  zck__source_close(&s);
  return st;
}

/* Opens zero/<name>/<state>.pt, checks it against the param and records its store. */
static zck_status zck__uv_open_state(zck_uv_ckpt *c, const zck_uv_open_opts *o, const zck_param *p, const char *state,
                                     zck__uv_tstore *ts, zck_dtype *dtype, bool *missing) {
  char *path = zck__sprintf("%s/zero/%s/%s.pt", c->dir, p->name, state);
  if (!path) return ZCK_ERR_NO_MEMORY;
  *missing = !zck__uv_is_file(path);
  if (*missing) {
    free(path);
    return ZCK_OK;
  }
  zck_torch_file *f = NULL;
  zck_status st = zck_torch_open(path, &o->torch, &f);
  const zck_pk *root = f ? zck_torch_root(f) : NULL;
  const zck_pk *node = root;
  if (st == ZCK_OK && c->info.stage <= 2) {
    /* {'cat_dim': d, 'param': T}; AutoTP: {'param': T} (+ 'vocab_tensor'), no cat_dim */
    if (!root || root->kind != ZCK_PK_DICT || !zck_pk_dict_get(root, "param") ||
        (!zck_pk_dict_get(root, "cat_dim") && c->info.tp_size <= 1))
      st = zck__fail(ZCK_ERR_FORMAT, "%s: not a {'cat_dim', 'param'} dict", path);
    else node = zck_pk_dict_get(root, "param");
  } else if (st == ZCK_OK && root && root->kind == ZCK_PK_DICT && zck_pk_dict_get(root, "param")) {
    node = zck_pk_dict_get(root, "param");  /* stage 3 with AutoTP uses the dict too */
  }
  const zck_torch_tensor *t = st == ZCK_OK ? zck_torch_tensor_of(f, node) : NULL;
  if (st == ZCK_OK && !t) st = zck__fail(ZCK_ERR_FORMAT, "%s: holds no tensor", path);
  /* stage 3's files are flat, but AutoEP's expert files are whole at every stage: w1 over w2 has their numel */
  if (st == ZCK_OK && (c->info.stage <= 2 || zck__uv_autoep_mult(c, p->name))) {
    bool same = t->ndim == p->ndim;
    for (int i = 0; same && i < p->ndim; i++) same = t->shape[i] == p->shape[i];
    if (!same) {
      char a[128], b[128];
      st = zck__fail(ZCK_ERR_MISMATCH, "%s: shape %s, param_shapes says %s", path,
                     zck_shape_str(t->ndim > ZCK_MAX_DIMS ? 0 : t->ndim, t->shape, a, sizeof a),
                     zck_shape_str(p->ndim, p->shape, b, sizeof b));
    }
  } else if (st == ZCK_OK && t->numel != p->numel) {
    st = zck__fail(ZCK_ERR_MISMATCH, "%s: %llu elements, param %s has %llu", path, (unsigned long long)t->numel,
                   p->name, (unsigned long long)p->numel);
  }
  if (st == ZCK_OK && !zck_torch_tensor_contiguous(t))
    st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: tensor is not contiguous", path);
  if (st == ZCK_OK && t->dtype != ZCK_F32 && t->dtype != ZCK_BF16 && t->dtype != ZCK_F16 && t->dtype != ZCK_F64)
    st = zck__fail(ZCK_ERR_FORMAT, "%s: %s tensor where a floating state is expected", path, zck_dtype_name(t->dtype));
  /* a well-formed state file may still be another state's copy (uv_identity.c); checked
   * after the structure so a file of the wrong form says so */
  if (st == ZCK_OK) st = zck__uv_check_identity(f, path);
  if (st == ZCK_OK) {
    ts->path = path;
    ts->base = zck_torch_tensor_file_offset(f, t);
    ts->es = zck_dtype_size(t->dtype);
    ts->numel = t->numel;
    atomic_flag_clear(&ts->lock);
    ts->has_rec = !o->no_verify && zck_torch_tensor_record(f, t, &ts->rec);
    ts->rec.what = "tensor record";
    *dtype = t->dtype;
    path = NULL;
  }
  zck_torch_close(f);
  free(path);
  return st;
}

/* fp32 / exp_avg / exp_avg_sq of every trainable param with elements, in flat order. A
 * param missing a state its peers have is refused, naming the file. */
static zck_status zck__uv_states(zck_uv_ckpt *c, const zck_uv_open_opts *o, uint32_t *params) {
  static const char *states[3] = {"fp32", "exp_avg", "exp_avg_sq"};
  size_t k = 0, n_state = 0;
  const char *first_without = NULL, *first_with = NULL;
  for (size_t i = 0; i < c->n_flat; i++) {
    const zck_param *pa = &c->m->params[c->flat[i]];
    ZCK_TRY(zck_uv_check_name(pa->name));
    /* stage 1/2: a param without elements has no fragments, hence no state files (only
     * ds_to_universal's module fallback); nothing to copy either */
    if (!pa->numel) continue;
    bool missing[3];
    zck_dtype dt[3] = {0};
    for (int s = 0; s < 3; s++) ZCK_TRY(zck__uv_open_state(c, o, pa, states[s], &c->ts[s][k], &dt[s], &missing[s]));
    if (missing[0])
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s/zero/%s/fp32.pt: missing for trainable param %s", c->dir, pa->name, pa->name);
    if (missing[1] != missing[2])
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s/zero/%s: has %s but not %s", c->dir, pa->name,
                       missing[1] ? "exp_avg_sq.pt" : "exp_avg.pt", missing[1] ? "exp_avg.pt" : "exp_avg_sq.pt");
    if (!missing[1]) n_state++;
    if (missing[1] && !first_without) first_without = pa->name;
    if (!missing[1] && !first_with) first_with = pa->name;
    if (!c->info.master_dtype) c->info.master_dtype = dt[0];
    if (!missing[1] && !c->info.state_dtype) c->info.state_dtype = dt[1];
    params[k] = c->flat[i];
    for (int s = 0; s < 3; s++)
      if (!missing[s])
        c->stores[s][k] = zck_store_callback(zck__uv_tstore_read, NULL, &c->ts[s][k], dt[s], pa->numel, c->ts[s][k].path);
    k++;
  }
  c->n_stores = k;
  if (n_state && n_state != k)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s/zero/%s/exp_avg.pt: missing, while %s and %zu other params of %zu have their "
                     "optimizer state (exp_avg, exp_avg_sq)", c->dir, first_without, first_with, n_state - 1, k);
  c->info.has_optimizer_state = k && n_state == k;
  if (!c->info.master_dtype) c->info.master_dtype = ZCK_F32;
  return ZCK_OK;
}

/* The optimizer step: stage 1/2 zero/<param>/step.pt (every param of the optimizer state
 * has one, all equal: a DeepSpeed checkpoint holds one step); stage 3 optimizer_state.pt's
 * optimizer_state_dict['state'][0]['step']. */
static zck_status zck__uv_step(zck_uv_ckpt *c, const zck_uv_open_opts *o, const uint32_t *params) {
  if (!c->info.has_optimizer_state) return ZCK_OK;
  if (c->info.stage == 3) {
    const zck_pk *osd = zck_pk_dict_get(zck_torch_root(c->optim), "optimizer_state_dict");
    const zck_pk *state = zck_pk_dict_get(osd, "state");
    const zck_pk *s0 = state && state->kind == ZCK_PK_DICT && state->u.dict.len ? state->u.dict.values[0] : NULL;
    const zck_pk *step = zck_pk_dict_get(s0, "step");
    if (!step)
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s: optimizer_state_dict['state'][0] has no 'step' while the params have "
                       "exp_avg / exp_avg_sq", zck_torch_name(c->optim));
    return zck__uv_step_value(c->optim, step, &c->info.step, &c->info.step_is_tensor, "optimizer_state_dict['state'][0]['step']");
  }
  const char *first = NULL;
  for (size_t i = 0; i < c->n_stores; i++) {
    const char *name = c->m->params[params[i]].name;
    char *sp = zck__sprintf("%s/zero/%s/step.pt", c->dir, name);
    if (!sp) return ZCK_ERR_NO_MEMORY;
    if (!zck__uv_is_file(sp)) {
      zck_status st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: missing (the Adam step of the param's exp_avg / exp_avg_sq%s%s)",
                                sp, first ? "; present for " : "", first ? first : "");
      free(sp);
      return st;
    }
    zck_torch_file *f = NULL;
    zck_status st = zck__uv_torch_open(sp, &o->torch, &f);
    double v = 0;
    bool is_t = false;
    if (st == ZCK_OK) st = zck__uv_step_value(f, zck_torch_root(f), &v, &is_t, "the step");
    zck_torch_close(f);
    if (st == ZCK_OK && first && (v != c->info.step || is_t != c->info.step_is_tensor))
      st = zck__fail(ZCK_ERR_MISMATCH, "%s: step %g, but %s has %g: a DeepSpeed checkpoint holds one step for "
                     "every group (a param folder of another step?)", sp, v, first, c->info.step);
    free(sp);
    ZCK_TRY(st);
    if (!first) {
      first = name;
      c->info.step = v;
      c->info.step_is_tensor = is_t;
    }
  }
  return ZCK_OK;
}

/* ds_config (sub_group_size, round_robin_gradients, parameter_alignment, gradient_clipping)
 * and optimizer_state.pt (clip_grad, param_alignment_paddings), as the DeepSpeed reader. */
static void zck__uv_config(zck_uv_ckpt *c) {
  zck_uv_info *in = &c->info;
  in->sub_group_size = 1000000000ull;
  in->param_align = 1;
  const zck_pk *cfg = zck_uv_ds_config(c), *optim = zck_torch_root(c->optim);
  const zck_pk *zo = cfg && cfg->kind == ZCK_PK_DICT ? zck_pk_dict_get(cfg, "zero_optimization") : NULL;
  double d;
  if (in->stage == 3 && cfg && cfg->kind == ZCK_PK_DICT && zck_pk_as_double(zck_pk_dict_get(cfg, "gradient_clipping"), &d))
    in->clip_grad = d;
  if (in->stage <= 2 && zck_pk_as_double(zck_pk_dict_get(optim, "clip_grad"), &d)) in->clip_grad = d;
  if (zo && zo->kind == ZCK_PK_DICT) {
    if (zck_pk_as_double(zck_pk_dict_get(zo, "sub_group_size"), &d) && d >= 1 && d < 1e18) in->sub_group_size = (uint64_t)d;
    const zck_pk *rr = zck_pk_dict_get(zo, "round_robin_gradients");
    if (rr && rr->kind == ZCK_PK_BOOL) in->round_robin = rr->u.b;
  }
}

/* parameter_alignment (stage 1/2): on in ds_config, or any non-zero saved padding; the
 * multiple is DeepSpeed's 16 / gcd(16, lp element size). */
static void zck__uv_param_align(zck_uv_ckpt *c) {
  if (c->info.stage == 3) return;
  const zck_pk *cfg = zck_uv_ds_config(c);
  const zck_pk *zo = cfg && cfg->kind == ZCK_PK_DICT ? zck_pk_dict_get(cfg, "zero_optimization") : NULL;
  const zck_pk *pa = zo && zo->kind == ZCK_PK_DICT ? zck_pk_dict_get(zo, "parameter_alignment") : NULL;
  bool any = pa && pa->kind == ZCK_PK_BOOL && pa->u.b;
  const zck_pk *pp = zck_pk_dict_get(zck_torch_root(c->optim), "param_alignment_paddings");
  for (size_t g = 0; pp && pp->kind == ZCK_PK_LIST && g < pp->u.seq.len; g++) {
    const zck_pk *l = pp->u.seq.items[g];
    int64_t v;
    for (size_t i = 0; l && (l->kind == ZCK_PK_LIST || l->kind == ZCK_PK_TUPLE) && i < l->u.seq.len; i++)
      any |= zck_pk_as_int(l->u.seq.items[i], &v) && v != 0;
  }
  if (!any) return;
  unsigned es = (unsigned)zck_dtype_size(c->info.lp_dtype), g = 16;
  for (unsigned a = 16, b = es ? es : 1; b;) {
    unsigned t = a % b;
    a = b;
    b = t;
    g = a;
  }
  c->info.param_align = 16 / g;
}

// ---- open

zck_status zck_uv_open(const char *path, const zck_uv_open_opts *opts, zck_uv_ckpt **out) {
  *out = NULL;
  zck_uv_open_opts o = ZCK_UV_OPEN_OPTS_INIT;
  if (opts) o = *opts;
  zck_uv_ckpt *c = zck__calloc(1, sizeof *c);
  if (!c) return ZCK_ERR_NO_MEMORY;
  uint32_t *params = NULL;
  c->no_verify = o.no_verify;
  zck_status st = zck__uv_resolve(path, &c->dir, &c->root);
  c->info.dir = c->dir;
  c->info.root = c->root;
  char *opath = st == ZCK_OK ? zck__path_join(c->dir, "zero/optimizer_state.pt") : NULL;
  if (st == ZCK_OK && !opath) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK && !zck__uv_is_file(opath)) st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: missing", opath);
  if (st == ZCK_OK) st = zck__uv_torch_open(opath, &o.torch, &c->optim);
  const zck_pk *optim = c->optim ? zck_torch_root(c->optim) : NULL;
  if (st == ZCK_OK && (!optim || optim->kind != ZCK_PK_DICT)) st = zck__fail(ZCK_ERR_FORMAT, "%s: not a dict", opath);
  if (st == ZCK_OK) {
    int zs = zck__uv_zero_stage(zck_pk_dict_get(optim, "zero_stage"));
    c->info.stage = zs < 0 ? 1 : zs;   /* BF16_Optimizer files have none: ds_to_universal treats them as stage 1 */
    if (zs == 0) st = zck__fail(ZCK_ERR_FORMAT, "%s: zero_stage 0", opath);
  }
  if (st == ZCK_OK) {
    c->param_groups = zck_pk_dict_get(optim, "param_groups");
    if (!c->param_groups || c->param_groups->kind != ZCK_PK_LIST)
      st = zck__fail(ZCK_ERR_FORMAT, "%s: 'param_groups' missing or not a list: the optimizer groups and their "
                     "hyper-parameters are unknown", opath);
  }
  if (st == ZCK_OK) {
    char *mp = zck__path_join(c->dir, c->info.stage == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt");
    st = mp ? zck__uv_torch_open(mp, &o.torch, &c->model0) : ZCK_ERR_NO_MEMORY;
    free(mp);
  }
  if (st == ZCK_OK) zck__uv_config(c);
  c->topts = &o.torch;
  if (st == ZCK_OK) st = zck__uv_build_manifest(c);
  c->topts = NULL;
  if (st == ZCK_OK) {
    /* the lp dtype: the module's trainable params (stage-3 placeholders keep the dtype) */
    for (size_t p = 0; p < c->m->n_params && !c->info.lp_dtype; p++)
      if (!c->m->params[p].frozen && c->m->params[p].tied_to < 0) c->info.lp_dtype = c->m->params[p].dtype;
  }
  size_t n = c->n_flat;
  for (int k = 0; st == ZCK_OK && k < 3; k++) {
    c->stores[k] = zck__calloc(n + 1, sizeof *c->stores[k]);
    c->ts[k] = zck__calloc(n + 1, sizeof *c->ts[k]);
    if (!c->stores[k] || !c->ts[k]) st = ZCK_ERR_NO_MEMORY;
  }
  if (st == ZCK_OK && !(params = zck__calloc(n + 1, sizeof *params))) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck__uv_states(c, &o, params);
  if (st == ZCK_OK && !c->info.lp_dtype) c->info.lp_dtype = c->info.master_dtype;
  if (st == ZCK_OK) st = zck__uv_step(c, &o, params);
  if (st == ZCK_OK) zck__uv_param_align(c);
  if (st == ZCK_OK) {
    uint64_t *numel = zck__calloc(c->m->n_params + 1, sizeof *numel);
    if (!numel) st = ZCK_ERR_NO_MEMORY;
    else {
      zck_model_numels(c->m, numel);
      st = zck_layout_whole(c->m->n_params, numel, params, c->n_stores, &c->layout);
      free(numel);
    }
  }
  if (st == ZCK_OK) {
    size_t nf = zck_frozen_params(c->m, NULL);
    c->cap_aux = nf * (c->info.stage == 3 ? c->info.world_size : 1) * (c->info.tp_size > 1 ? c->info.tp_size : 1) +
                 c->m->n_buffers;
    if (!(c->aux = zck__calloc(c->cap_aux + 1, sizeof *c->aux))) st = ZCK_ERR_NO_MEMORY;
  }
  if (st == ZCK_OK) st = zck__uv_build_frozen(c, &o.torch);
  if (st == ZCK_OK) st = zck__uv_build_buffers(c);
  if (st == ZCK_OK) st = zck__uv_build_outputs(c);
  if (st == ZCK_OK && !o.no_verify) st = zck__uv_expect_manifest(c);
  if (st == ZCK_OK) st = zck__uv_check_masters(c, params);   /* after the manifest: a replaced file is said as such */
  free(opath);
  free(params);
  if (st != ZCK_OK) {
    zck_uv_close(c);
    return st;
  }
  *out = c;
  return ZCK_OK;
}

void zck_uv_close(zck_uv_ckpt *c) {
  if (!c) return;
  for (int s = 0; s < 3; s++) {
    for (size_t i = 0; c->ts[s] && i <= c->n_flat; i++) zck__uv_tstore_free(&c->ts[s][i]);
    free(c->ts[s]);
    free(c->stores[s]);
  }
  for (size_t i = 0; i < c->n_aux; i++) zck__uv_tstore_free(&c->aux[i]);
  free(c->aux);
  zck_layout_free(c->layout);
  zck_layout_free(c->frozen_layout);
  zck_layout_free(c->buffer_layout);
  free(c->frozen_stores);
  free(c->buffer_stores);
  zck_model_free(c->m);
  free(c->module);
  free(c->param_mod);
  free(c->buffer_mod);
  free(c->flat);
  free(c->unsaved_pairs);
  free(c->outputs);
  zck__uv_autoep_free(c->autoep);
  zck__uv_pipe_free(c->pipe);
  zck_torch_close(c->model0);
  zck_torch_close(c->optim);
  free(c->ds_version);
  free(c->dir);
  free(c->root);
  free(c);
}

const zck_uv_info *zck_uv_info_of(const zck_uv_ckpt *c) { return &c->info; }
const zck_model *zck_uv_model(const zck_uv_ckpt *c) { return c->m; }

zck_status zck_uv_get(const zck_uv_ckpt *c, zck_uv_part part, const zck_layout **layout, const zck_store **stores) {
  ZCK_ASSERT(part >= 0 && part < ZCK_UV_PART_COUNT);
  if (part == ZCK_UV_FROZEN) {
    if (!c->frozen_layout) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no frozen parameters", c->dir);
    *layout = c->frozen_layout;
    *stores = c->frozen_stores;
    return ZCK_OK;
  }
  if (part != ZCK_UV_FP32 && !c->info.has_optimizer_state)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no exp_avg / exp_avg_sq files", c->dir);
  *layout = c->layout;
  *stores = c->stores[part];
  return ZCK_OK;
}

void zck_uv_buffers(const zck_uv_ckpt *c, const zck_layout **layout, const zck_store **stores) {
  *layout = c->buffer_layout;
  *stores = c->buffer_stores;
}

const zck_pk *zck_uv_ds_config(const zck_uv_ckpt *c) {
  return c->model0 ? zck_pk_dict_get(zck_torch_root(c->model0), "ds_config") : NULL;
}
const zck_pk *zck_uv_lr_scheduler(const zck_uv_ckpt *c) {
  return c->model0 ? zck_pk_dict_get(zck_torch_root(c->model0), "lr_scheduler") : NULL;
}
const zck_pk *zck_uv_module_attrs(const zck_uv_ckpt *c) {
  const zck_pk *module = c->model0 ? zck_pk_dict_get(zck_torch_root(c->model0), "module") : NULL;
  return module && module->kind == ZCK_PK_DICT ? module->u.dict.attrs : NULL;
}
const zck_pk *zck_uv_loss_scaler(const zck_uv_ckpt *c) {
  return c->optim ? zck_pk_dict_get(zck_torch_root(c->optim), "loss_scaler") : NULL;
}

const char *const *zck_uv_unsaved_ties(const zck_uv_ckpt *c, size_t *n) {
  *n = c->n_unsaved;
  return c->unsaved_pairs;
}

bool zck_uv_frozen_excluded(const zck_uv_ckpt *c) { return c->frozen_excluded; }
