/* uv_read.c: describing a universal checkpoint folder (universal.h) for reshard.
 *
 * The model-states file gives the trainable params in flat order (param_shapes), frozen
 * shapes, tied aliases and buffers; zero/optimizer_state.pt the stage, step and param
 * groups; each zero/<param>/<state>.pt one tensor, checked against param_shapes (DS-70..DS-75).
 * Files are opened one at a time and closed again (a model may have thousands of
 * params); the stores reopen the file for each read, which happens in large ranges. */
#include "universal/universal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io.h"

typedef struct zck__uv_tstore {
  char *path;
  uint64_t base;               /* absolute byte offset of element 0 */
  size_t es;
} zck__uv_tstore;

struct zck_uv_ckpt {
  zck_uv_info info;
  char *dir;
  char *ds_version;
  zck_model *m;
  zck_layout *layout;                      /* whole, one store per trainable param */
  zck_store *stores[ZCK_UV_PART_COUNT];
  zck__uv_tstore *ts[ZCK_UV_PART_COUNT];
  size_t n_stores, n_alloc;
  uint32_t *trainable;                     /* param index of store i */
};

static bool zck__uv_is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool zck__uv_is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* path: the folder itself (it has zero/), or a parent with latest_universal (DS-70). */
static zck_status zck__uv_resolve(const char *path, char **dir) {
  char *zero = zck__path_join(path, "zero");
  bool direct = zero && zck__uv_is_dir(zero);
  free(zero);
  if (direct) return (*dir = zck__strdup(path)) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  char *lu = zck__path_join(path, "latest_universal");
  char *tag = NULL;
  size_t n = 0;
  zck_status st = lu ? zck__read_small_file(lu, 4096, &tag, &n) : ZCK_ERR_NO_MEMORY;
  if (st != ZCK_OK) {
    free(lu);
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: not a universal checkpoint (no zero/ folder, no latest_universal) (DS-70)", path);
  }
  size_t a = 0;
  while (a < n && (tag[a] == ' ' || tag[a] == '\n' || tag[a] == '\r' || tag[a] == '\t')) a++;
  while (n > a && (tag[n - 1] == ' ' || tag[n - 1] == '\n' || tag[n - 1] == '\r' || tag[n - 1] == '\t')) n--;
  tag[n] = 0;
  const char *t = tag + a;
  if (!*t) st = zck__fail(ZCK_ERR_FORMAT, "%s: empty (DS-70)", lu);
  else if (strchr(t, '/') || strchr(t, '\\') || !strcmp(t, "..") || !strcmp(t, ".") || strlen(t) != n - a)
    st = zck__fail(ZCK_ERR_FORMAT, "%s: \"%s\" is not a folder name (DS-70)", lu, t);
  if (st == ZCK_OK) {
    *dir = zck__path_join(path, t);
    if (!*dir) st = ZCK_ERR_NO_MEMORY;
    else if (!zck__uv_is_dir(*dir)) {
      st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: names %s, which does not exist (DS-70)", lu, t);
      free(*dir);
      *dir = NULL;
    }
  }
  free(tag);
  free(lu);
  return st;
}

// ---- small pickle helpers

static zck_status zck__uv_shape(const zck_pk *node, int *ndim, int64_t *shape, uint64_t *numel, const char *what) {
  if (!node || (node->kind != ZCK_PK_TUPLE && node->kind != ZCK_PK_LIST))
    return zck__fail(ZCK_ERR_FORMAT, "%s: shape is not a torch.Size, tuple or list", what);
  if (node->u.seq.len > ZCK_MAX_DIMS) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: too many dimensions", what);
  *numel = 1;
  for (size_t i = 0; i < node->u.seq.len; i++) {
    int64_t v;
    if (!zck_pk_as_int(node->u.seq.items[i], &v) || node->u.seq.items[i]->kind != ZCK_PK_INT || v < 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shape dimension %zu is not a non-negative int", what, i);
    shape[i] = v;
    if (!zck__mul_u64(*numel, (uint64_t)v, numel) || *numel > ((uint64_t)1 << 62))
      return zck__fail(ZCK_ERR_FORMAT, "%s: element count overflows", what);
  }
  *ndim = (int)node->u.seq.len;
  return ZCK_OK;
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

static zck_status zck__uv_hparams(zck_model *m, uint32_t g, const zck_pk *group) {
  if (!group || group->kind != ZCK_PK_DICT) return ZCK_OK;
  for (size_t i = 0; i < group->u.dict.len; i++) {
    const char *k = zck_pk_as_str(group->u.dict.keys[i]);
    const zck_pk *v = group->u.dict.values[i];
    if (!k || !strcmp(k, "params")) continue;
    double f[ZCK_HP_MAX_FLOATS];
    switch (v->kind) {
    case ZCK_PK_NONE: ZCK_TRY(zck_model_group_set_none(m, g, k)); break;
    case ZCK_PK_BOOL: ZCK_TRY(zck_model_group_set_bool(m, g, k, v->u.b)); break;
    case ZCK_PK_INT: ZCK_TRY(zck_model_group_set_int(m, g, k, v->u.i)); break;
    case ZCK_PK_FLOAT: ZCK_TRY(zck_model_group_set_float(m, g, k, v->u.f)); break;
    case ZCK_PK_STR: ZCK_TRY(zck_model_group_set_string(m, g, k, v->u.str.data)); break;
    case ZCK_PK_TUPLE: case ZCK_PK_LIST: {
      size_t n = v->u.seq.len;
      bool ok = n <= ZCK_HP_MAX_FLOATS;
      for (size_t j = 0; ok && j < n; j++) ok = zck_pk_as_double(v->u.seq.items[j], &f[j]);
      if (ok) ZCK_TRY(zck_model_group_set_floats(m, g, k, f, (int)n));
      break;
    }
    default: break; /* tensors (a capturable lr) and objects are not hyper-parameters we carry */
    }
  }
  return ZCK_OK;
}

// ---- tensor files

static zck_status zck__uv_tstore_read(void *ctx, void *dst, uint64_t off, uint64_t count) {
  zck__uv_tstore *t = ctx;
  zck__source s;
  ZCK_TRY(zck__source_open(&s, t->path));
  zck_status st = zck__source_read(&s, dst, (size_t)(count * t->es), t->base + off * t->es);
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
    /* DS-73: {'cat_dim': d, 'param': T} */
    if (!root || root->kind != ZCK_PK_DICT || !zck_pk_dict_get(root, "param") || !zck_pk_dict_get(root, "cat_dim"))
      st = zck__fail(ZCK_ERR_FORMAT, "%s: not a {'cat_dim', 'param'} dict (DS-73)", path);
    else node = zck_pk_dict_get(root, "param");
  } else if (st == ZCK_OK && root && root->kind == ZCK_PK_DICT && zck_pk_dict_get(root, "param")) {
    node = zck_pk_dict_get(root, "param");  /* stage 3 with AutoTP uses the dict too */
  }
  const zck_torch_tensor *t = st == ZCK_OK ? zck_torch_tensor_of(f, node) : NULL;
  if (st == ZCK_OK && !t) st = zck__fail(ZCK_ERR_FORMAT, "%s: holds no tensor", path);
  if (st == ZCK_OK && c->info.stage <= 2) {
    bool same = t->ndim == p->ndim;
    for (int i = 0; same && i < p->ndim; i++) same = t->shape[i] == p->shape[i];
    if (!same) {
      char a[128], b[128];
      st = zck__fail(ZCK_ERR_MISMATCH, "%s: shape %s, param_shapes says %s (%s)", path,
                     zck_shape_str(t->ndim > ZCK_MAX_DIMS ? 0 : t->ndim, t->shape, a, sizeof a),
                     zck_shape_str(p->ndim, p->shape, b, sizeof b), strcmp(state, "fp32") ? "DS-75" : "DS-73");
    }
  } else if (st == ZCK_OK && t->numel != p->numel) {
    st = zck__fail(ZCK_ERR_MISMATCH, "%s: %llu elements, param %s has %llu (%s)", path, (unsigned long long)t->numel,
                   p->name, (unsigned long long)p->numel, strcmp(state, "fp32") ? "DS-75" : "DS-74");
  }
  if (st == ZCK_OK && !zck_torch_tensor_contiguous(t))
    st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: tensor is not contiguous", path);
  if (st == ZCK_OK && t->dtype != ZCK_F32 && t->dtype != ZCK_BF16 && t->dtype != ZCK_F16 && t->dtype != ZCK_F64)
    st = zck__fail(ZCK_ERR_FORMAT, "%s: %s tensor where a floating state is expected", path, zck_dtype_name(t->dtype));
  if (st == ZCK_OK) {
    ts->path = path;
    ts->base = zck_torch_tensor_file_offset(f, t);
    ts->es = zck_dtype_size(t->dtype);
    *dtype = t->dtype;
    path = NULL;
  }
  zck_torch_close(f);
  free(path);
  return st;
}

// ---- open

static zck_status zck__uv_model_file(zck_uv_ckpt *c, const zck_uv_open_opts *o, zck_torch_file **mf) {
  const char *name = c->info.stage == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt";
  char *p = zck__path_join(c->dir, name);
  if (!p) return ZCK_ERR_NO_MEMORY;
  zck_status st = zck_torch_open(p, &o->torch, mf);
  free(p);
  return st;
}

static zck_status zck__uv_manifest(zck_uv_ckpt *c, const zck_torch_file *mf, const zck_pk *optim) {
  const char *mname = zck_torch_name(mf);
  const zck_pk *root = zck_torch_root(mf);
  const zck_pk *module = zck_pk_dict_get(root, "module");
  const zck_pk *shapes = zck_pk_dict_get(root, "param_shapes");
  if (!module || module->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: no module dict (DS-21)", mname);
  if (!shapes || shapes->kind != ZCK_PK_LIST) return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes is not a list (DS-22)", mname);
  int64_t v;
  if (zck_pk_as_int(zck_pk_dict_get(root, "dp_world_size"), &v) && v > 0) c->info.world_size = (uint32_t)v;
  c->info.global_steps = zck_pk_as_int(zck_pk_dict_get(root, "global_steps"), &v) ? v : 0;
  c->info.skipped_steps = zck_pk_as_int(zck_pk_dict_get(root, "skipped_steps"), &v) ? v : 0;
  const char *ver = zck_pk_as_str(zck_pk_dict_get(root, "ds_version"));
  if (ver && !(c->ds_version = zck__strdup(ver))) return ZCK_ERR_NO_MEMORY;
  c->info.ds_version = c->ds_version;
  /* the lp dtype: any module tensor that is not a buffer */
  const zck_pk *bn = zck_pk_dict_get(root, "buffer_names");
  zck_model *m = c->m;
  /* optimizer groups: stage <= 2 one per param_shapes entry; stage 3 per param_groups */
  const zck_pk *pgs = zck_pk_dict_get(optim, "param_groups");
  size_t n_groups = c->info.stage <= 2 ? shapes->u.seq.len : (pgs && pgs->kind == ZCK_PK_LIST ? pgs->u.seq.len : 1);
  if (!n_groups) n_groups = 1;
  for (size_t g = 0; g < n_groups; g++) {
    uint32_t gi;
    ZCK_TRY(zck_model_add_group(m, &gi));
    if (pgs && pgs->kind == ZCK_PK_LIST && g < pgs->u.seq.len) ZCK_TRY(zck__uv_hparams(m, gi, pgs->u.seq.items[g]));
  }
  for (size_t s = 0; s < shapes->u.seq.len; s++) {
    const zck_pk *d = shapes->u.seq.items[s];
    if (!d || d->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes[%zu] is not a dict (DS-22)", mname, s);
    uint32_t g = (uint32_t)s;
    if (c->info.stage == 3) {
      g = 0;  /* the group whose param_groups entry lists sub-group s */
      for (size_t i = 0; pgs && pgs->kind == ZCK_PK_LIST && i < pgs->u.seq.len; i++) {
        const zck_pk *ps = zck_pk_dict_get(pgs->u.seq.items[i], "params");
        for (size_t j = 0; ps && (ps->kind == ZCK_PK_LIST || ps->kind == ZCK_PK_TUPLE) && j < ps->u.seq.len; j++)
          if (zck_pk_as_int(ps->u.seq.items[j], &v) && v == (int64_t)s) g = (uint32_t)i;
      }
    }
    for (size_t i = 0; i < d->u.dict.len; i++) {
      const char *name = zck_pk_as_str(d->u.dict.keys[i]);
      if (!name) return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes[%zu] has a non-string key (DS-22)", mname, s);
      int nd;
      int64_t shape[ZCK_MAX_DIMS];
      uint64_t numel;
      ZCK_TRY_CTX(zck__uv_shape(d->u.dict.values[i], &nd, shape, &numel, name), "%s", mname);
      const zck_torch_tensor *t = zck_torch_tensor_of(mf, zck_pk_dict_get(module, name));
      uint32_t pi;
      ZCK_TRY_CTX(zck_model_add_param(m, name, nd, shape, t ? t->dtype : ZCK_DTYPE_INVALID, &pi), "%s (DS-23)", mname);
      if (t && !c->info.lp_dtype) c->info.lp_dtype = t->dtype;
      ZCK_TRY(zck_model_group_add_param(m, g < n_groups ? g : 0, pi));
    }
  }
  /* frozen params: frozen_param_shapes, or (stage 1) module params outside param_shapes */
  const zck_pk *fz = zck_pk_dict_get(root, "frozen_param_shapes");
  const zck_pk *shared = zck_pk_dict_get(root, "shared_params");
  for (size_t i = 0; fz && fz->kind == ZCK_PK_DICT && i < fz->u.dict.len; i++) {
    const char *name = zck_pk_as_str(fz->u.dict.keys[i]);
    int nd;
    int64_t shape[ZCK_MAX_DIMS];
    uint64_t numel;
    if (!name) return zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes has a non-string key", mname);
    ZCK_TRY_CTX(zck__uv_shape(fz->u.dict.values[i], &nd, shape, &numel, name), "%s", mname);
    uint32_t pi;
    ZCK_TRY_CTX(zck_model_add_param(m, name, nd, shape, c->info.lp_dtype, &pi), "%s", mname);
    zck_model_set_frozen(m, pi, true);
  }
  for (size_t i = 0; shared && shared->kind == ZCK_PK_DICT && i < shared->u.dict.len; i++) {
    const char *alias = zck_pk_as_str(shared->u.dict.keys[i]);
    const char *src = zck_pk_as_str(shared->u.dict.values[i]);
    int64_t si = src ? zck_model_find_param(m, src) : -1;
    if (!alias || si < 0 || zck_model_find_param(m, alias) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params entry %s -> %s names no parameter (DS-25)", mname,
                       alias ? alias : "?", src ? src : "?");
    const zck_param *sp = &m->params[si];
    uint32_t pi;
    ZCK_TRY(zck_model_add_param(m, alias, sp->ndim, sp->shape, sp->dtype, &pi));
    ZCK_TRY_CTX(zck_model_set_tied(m, pi, (uint32_t)si), "%s (DS-25)", mname);
  }
  for (size_t i = 0; bn && bn->kind == ZCK_PK_LIST && i < bn->u.seq.len; i++) {
    const char *name = zck_pk_as_str(bn->u.seq.items[i]);
    const zck_torch_tensor *t = name ? zck_torch_tensor_of(mf, zck_pk_dict_get(module, name)) : NULL;
    if (!t) continue;
    if (t->ndim > ZCK_MAX_DIMS) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: buffer %s has too many dimensions", mname, name);
    ZCK_TRY_CTX(zck_model_add_buffer(m, name, t->ndim, t->shape, t->dtype, NULL), "%s", mname);
  }
  if (c->info.stage <= 2 && (!fz || fz->kind != ZCK_PK_DICT)) {
    for (size_t i = 0; i < module->u.dict.len; i++) {
      const char *name = zck_pk_as_str(module->u.dict.keys[i]);
      const zck_torch_tensor *t = name ? zck_torch_tensor_of(mf, module->u.dict.values[i]) : NULL;
      if (!t || zck_model_find_param(m, name) >= 0 || zck_model_find_buffer(m, name) >= 0 || t->ndim > ZCK_MAX_DIMS) continue;
      uint32_t pi;
      ZCK_TRY_CTX(zck_model_add_param(m, name, t->ndim, t->shape, t->dtype, &pi), "%s", mname);
      zck_model_set_frozen(m, pi, true);
    }
  }
  return ZCK_OK;
}

zck_status zck_uv_open(const char *path, const zck_uv_open_opts *opts, zck_uv_ckpt **out) {
  *out = NULL;
  zck_uv_open_opts o = ZCK_UV_OPEN_OPTS_INIT;
  if (opts) o = *opts;
  zck_uv_ckpt *c = zck__calloc(1, sizeof *c);
  if (!c) return ZCK_ERR_NO_MEMORY;
  zck_torch_file *of = NULL, *mf = NULL;
  zck_status st = zck__uv_resolve(path, &c->dir);
  c->info.dir = c->dir;
  char *opath = st == ZCK_OK ? zck__path_join(c->dir, "zero/optimizer_state.pt") : NULL;
  if (st == ZCK_OK && !opath) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK && !zck__uv_is_file(opath)) st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: missing (DS-71)", opath);
  if (st == ZCK_OK) st = zck_torch_open(opath, &o.torch, &of);
  const zck_pk *optim = of ? zck_torch_root(of) : NULL;
  if (st == ZCK_OK && (!optim || optim->kind != ZCK_PK_DICT)) st = zck__fail(ZCK_ERR_FORMAT, "%s: not a dict", opath);
  if (st == ZCK_OK) {
    int zs = zck__uv_zero_stage(zck_pk_dict_get(optim, "zero_stage"));
    c->info.stage = zs < 0 ? 1 : zs;   /* BF16_Optimizer files have none: ds_to_universal treats them as stage 1 */
    if (zs == 0) st = zck__fail(ZCK_ERR_FORMAT, "%s: zero_stage 0", opath);
  }
  if (st == ZCK_OK && c->info.stage == 3) {
    const zck_pk *inner = zck_pk_dict_get(optim, "optimizer_state_dict");
    const zck_pk *state = zck_pk_dict_get(inner, "state");
    const zck_pk *s0 = state && state->kind == ZCK_PK_DICT && state->u.dict.len ? state->u.dict.values[0] : NULL;
    const zck_pk *step = zck_pk_dict_get(s0, "step");
    const zck_torch_tensor *t = step ? zck_torch_tensor_of(of, step) : NULL;
    float fv;
    if (t && t->numel == 1 && t->dtype == ZCK_F32 && zck_torch_tensor_read(of, t, &fv, 0, 1) == ZCK_OK) {
      c->info.step = fv;
      c->info.step_is_tensor = true;
    } else {
      zck_pk_as_double(step, &c->info.step);
    }
  }
  if (st == ZCK_OK) st = zck__uv_model_file(c, &o, &mf);
  if (st == ZCK_OK && !(c->m = zck_model_new())) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck__uv_manifest(c, mf, optim);
  zck_torch_close(mf);
  zck_torch_close(of);
  free(opath);
  /* the trainable params: those of param_shapes, in flat order */
  size_t n = 0;
  if (st == ZCK_OK) {
    for (size_t g = 0; g < c->m->n_groups; g++) n += c->m->groups[g].n_params;
    c->trainable = zck__calloc(n ? n : 1, sizeof *c->trainable);
    c->n_alloc = n ? n : 1;
    for (int k = 0; k < ZCK_UV_PART_COUNT; k++) {
      c->stores[k] = zck__calloc(n ? n : 1, sizeof *c->stores[k]);
      c->ts[k] = zck__calloc(n ? n : 1, sizeof *c->ts[k]);
      if (!c->stores[k] || !c->ts[k]) st = ZCK_ERR_NO_MEMORY;
    }
    if (!c->trainable) st = ZCK_ERR_NO_MEMORY;
  }
  size_t k = 0, n_state = 0;
  for (uint32_t p = 0; st == ZCK_OK && p < c->m->n_params; p++) {
    const zck_param *pa = &c->m->params[p];
    if (pa->group < 0) continue;
    st = zck_uv_check_name(pa->name);
    static const char *states[ZCK_UV_PART_COUNT] = {"fp32", "exp_avg", "exp_avg_sq"};
    bool missing[ZCK_UV_PART_COUNT];
    zck_dtype dt[ZCK_UV_PART_COUNT] = {0};
    for (int s = 0; st == ZCK_OK && s < ZCK_UV_PART_COUNT; s++)
      st = zck__uv_open_state(c, &o, pa, states[s], &c->ts[s][k], &dt[s], &missing[s]);
    if (st != ZCK_OK) break;
    if (missing[0]) {
      st = zck__fail(ZCK_ERR_NOT_FOUND, "%s/zero/%s/fp32.pt: missing for trainable param %s (DS-72)", c->dir, pa->name, pa->name);
      break;
    }
    if (missing[1] != missing[2]) {
      st = zck__fail(ZCK_ERR_NOT_FOUND, "%s/zero/%s: has %s but not %s", c->dir, pa->name, missing[1] ? "exp_avg_sq.pt" : "exp_avg.pt",
                     missing[1] ? "exp_avg.pt" : "exp_avg_sq.pt");
      break;
    }
    if (!missing[1]) n_state++;
    if (!c->info.master_dtype) c->info.master_dtype = dt[0];
    if (!missing[1] && !c->info.state_dtype) c->info.state_dtype = dt[1];
    c->trainable[k] = p;
    for (int s = 0; s < ZCK_UV_PART_COUNT; s++)
      if (!missing[s])
        c->stores[s][k] = zck_store_callback(zck__uv_tstore_read, NULL, &c->ts[s][k], dt[s], pa->numel, c->ts[s][k].path);
    k++;
  }
  if (st == ZCK_OK && n_state && n_state != k)
    st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: exp_avg / exp_avg_sq present for %zu of %zu params", c->dir, n_state, k);
  c->n_stores = k;
  c->info.has_optimizer_state = k && n_state == k;
  if (st == ZCK_OK && c->info.stage <= 2) {
    /* step.pt of the first param (all agree in what DeepSpeed writes) */
    for (size_t i = 0; i < k; i++) {
      char *sp = zck__sprintf("%s/zero/%s/step.pt", c->dir, c->m->params[c->trainable[i]].name);
      if (!sp) { st = ZCK_ERR_NO_MEMORY; break; }
      if (zck__uv_is_file(sp)) {
        zck_torch_file *f = NULL;
        st = zck_torch_open(sp, &o.torch, &f);
        const zck_pk *r = f ? zck_torch_root(f) : NULL;
        const zck_torch_tensor *t = r ? zck_torch_tensor_of(f, r) : NULL;
        float fv;
        if (st == ZCK_OK && t && t->numel == 1 && t->dtype == ZCK_F32 && zck_torch_tensor_read(f, t, &fv, 0, 1) == ZCK_OK) {
          c->info.step = fv;
          c->info.step_is_tensor = true;
        } else if (st == ZCK_OK && !zck_pk_as_double(r, &c->info.step)) {
          st = zck__fail(ZCK_ERR_FORMAT, "%s: not a step value", sp);
        }
        zck_torch_close(f);
        free(sp);
        break;
      }
      free(sp);
    }
  }
  if (st == ZCK_OK) {
    uint64_t *numel = zck__calloc(c->m->n_params ? c->m->n_params : 1, sizeof *numel);
    if (!numel) st = ZCK_ERR_NO_MEMORY;
    else {
      zck_model_numels(c->m, numel);
      st = zck_layout_whole(c->m->n_params, numel, c->trainable, k, &c->layout);
      free(numel);
    }
  }
  if (st != ZCK_OK) {
    zck_uv_close(c);
    return st;
  }
  *out = c;
  return ZCK_OK;
}

void zck_uv_close(zck_uv_ckpt *c) {
  if (!c) return;
  for (int s = 0; s < ZCK_UV_PART_COUNT; s++) {
    for (size_t i = 0; c->ts[s] && i < c->n_alloc; i++) free(c->ts[s][i].path);
    free(c->ts[s]);
    free(c->stores[s]);
  }
  zck_layout_free(c->layout);
  zck_model_free(c->m);
  free(c->trainable);
  free(c->ds_version);
  free(c->dir);
  free(c);
}

const zck_uv_info *zck_uv_info_of(const zck_uv_ckpt *c) { return &c->info; }
const zck_model *zck_uv_model(const zck_uv_ckpt *c) { return c->m; }

zck_status zck_uv_get(const zck_uv_ckpt *c, zck_uv_part part, const zck_layout **layout, const zck_store **stores) {
  if (part != ZCK_UV_FP32 && !c->info.has_optimizer_state)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no exp_avg / exp_avg_sq files", c->dir);
  *layout = c->layout;
  *stores = c->stores[part];
  return ZCK_OK;
}
