/* uv_manifest.c: the model manifest of a universal checkpoint, by the DeepSpeed reader's
 * builder (deepspeed/ds_manifest.h), from the model-states file the universal folder
 * carries byte for byte and zero/optimizer_state.pt's param_groups: a reshard from the
 * universal folder lays out every flat group, sub-group, frozen fragment and `module`
 * entry exactly as a reshard from the original checkpoint.
 *
 * Also the frozen-parameter part (module tensors, or frozen_param_fragments of every rank
 * file in stage 3) and the buffers. */
#include "uv_internal.h"

#include "deepspeed/deepspeed.h"
#include "deepspeed/ds_manifest.h"
#include "strmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// ---- pickle helpers

static zck_status zck__uv_tref_of(const zck_torch_file *f, const zck_pk *node, const char *name, zck__uv_tref *out) {
  const zck_torch_tensor *t = zck_torch_tensor_of(f, node);
  if (!t) return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is not a tensor", zck_torch_name(f), name);
  if (t->ndim > ZCK_MAX_DIMS)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: '%s' has %d dimensions (at most %d supported)", zck_torch_name(f), name,
                     t->ndim, ZCK_MAX_DIMS);
  memset(out, 0, sizeof *out);
  out->name = name;
  out->dtype = t->dtype;
  out->ndim = t->ndim;
  for (int i = 0; i < t->ndim; i++) out->shape[i] = t->shape[i];
  out->numel = zck_torch_tensor_numel(t);
  out->offset = zck_torch_tensor_file_offset(f, t);
  out->contiguous = zck_torch_tensor_contiguous(t) != 0;
  out->has_rec = zck_torch_tensor_record(f, t, &out->rec);
  return ZCK_OK;
}

static zck_status zck__uv_need_int(const zck_pk *root, const char *key, int64_t *out, const char *path) {
  const zck_pk *v = zck_pk_dict_get(root, key);
  if (!v) return zck__fail(ZCK_ERR_FORMAT, "%s: key '%s' missing (DeepSpeed's loader needs it)", path, key);
  if (v->kind != ZCK_PK_INT || !zck_pk_as_int(v, out)) return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is not an int", path, key);
  return ZCK_OK;
}

// ---- the manifest

/* The model file's records as the builder takes them: names borrowed from the pickle,
 * shapes parsed. */
typedef struct uv_records {
  zck__ds_shape_list *shapes;        /* [n_shapes] param_shapes */
  size_t n_shapes;
  zck__ds_shape_list frozen;
  const char **buffers, **alias, **src;
  zck__ds_module_entry *module;
} uv_records;

static void uv_records_free(uv_records *u) {
  for (size_t g = 0; g < u->n_shapes; g++) zck__ds_shape_list_free(&u->shapes[g]);
  free(u->shapes);
  zck__ds_shape_list_free(&u->frozen);
  free(u->buffers);
  free(u->alias);
  free(u->src);
  free(u->module);
}

/* param_shapes (an AutoEP expert's entry is one rank's experts: times the EP size) and
 * frozen_param_shapes (NULL: None). */
static zck_status read_shapes(const zck_uv_ckpt *c, const char *path, const zck_pk *shapes, const zck_pk *frozen,
                              uv_records *u, zck__ds_records *r) {
  size_t ng = shapes->u.seq.len;
  if (!(u->shapes = zck__calloc(ng + 1, sizeof *u->shapes))) return ZCK_ERR_NO_MEMORY;
  for (size_t g = 0; g < ng; g++) {
    char what[64];
    snprintf(what, sizeof what, "param_shapes[%zu]", g);
    u->n_shapes++;
    ZCK_TRY(zck__ds_read_shape_dict(shapes->u.seq.items[g], &u->shapes[g], path, what));
    for (size_t i = 0; i < u->shapes[g].n; i++) {
      zck__ds_named_shape *ps = &u->shapes[g].v[i];
      int64_t ep = zck__uv_autoep_mult(c, ps->name);
      if (ep && ps->ndim) {
        ps->shape[0] *= ep;
        ps->numel *= (uint64_t)ep;
      }
    }
  }
  r->param_shapes = u->shapes;
  r->n_flat = ng;
  if (frozen) {
    ZCK_TRY(zck__ds_read_shape_dict(frozen, &u->frozen, path, "frozen_param_shapes"));
    r->frozen_shapes = &u->frozen;
  }
  return ZCK_OK;
}

/* buffer_names, shared_params and c->module (experts and a pipeline's params added). */
static zck_status read_names(const zck_uv_ckpt *c, const char *path, const zck_pk *bn, const zck_pk *shared,
                             uv_records *u, zck__ds_records *r) {
  size_t nb = bn->u.seq.len, ns = shared ? shared->u.dict.len : 0;
  u->buffers = zck__calloc(nb + 1, sizeof *u->buffers);
  u->alias = zck__calloc(ns + 1, sizeof *u->alias);
  u->src = zck__calloc(ns + 1, sizeof *u->src);
  u->module = zck__calloc(c->n_module + 1, sizeof *u->module);
  if (!u->buffers || !u->alias || !u->src || !u->module) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < nb; i++)
    if (!(u->buffers[i] = zck_pk_as_str(bn->u.seq.items[i])))
      return zck__fail(ZCK_ERR_FORMAT, "%s: buffer_names[%zu] is not a string", path, i);
  for (size_t i = 0; i < ns; i++) {
    u->alias[i] = zck_pk_as_str(shared->u.dict.keys[i]);
    u->src[i] = zck_pk_as_str(shared->u.dict.values[i]);
    if (!u->alias[i] || !u->src[i]) return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params entry %zu is not str -> str", path, i);
  }
  for (size_t i = 0; i < c->n_module; i++) {
    const zck__uv_tref *t = &c->module[i];
    u->module[i] = (zck__ds_module_entry){t->name, t->dtype, t->ndim, t->shape, t->numel};
  }
  r->buffer_names = u->buffers;
  r->n_buffers = nb;
  r->shared_alias = u->alias;
  r->shared_src = u->src;
  r->n_shared = ns;
  r->module = u->module;
  r->n_module = c->n_module;
  return ZCK_OK;
}

/* c->m and its indices, by the DeepSpeed reader's rules (universal folders say no warnings). */
static zck_status build_model(zck_uv_ckpt *c, const char *path, const zck_pk *shapes, const zck_pk *frozen,
                              const zck_pk *shared, const zck_pk *bn) {
  uv_records u;
  memset(&u, 0, sizeof u);
  zck__ds_records r = {.path = path, .optim_path = zck_torch_name(c->optim), .stage = c->info.stage,
                       .round_robin = c->info.round_robin, .world_size = c->info.world_size,
                       .param_groups = c->param_groups};
  zck_status st = read_shapes(c, path, shapes, frozen, &u, &r);
  if (st == ZCK_OK) st = read_names(c, path, bn, shared, &u, &r);
  zck__ds_manifest o;
  memset(&o, 0, sizeof o);
  if (st == ZCK_OK) {
    st = zck__ds_manifest_build(&r, &o);
    for (size_t g = 0; g < r.n_flat; g++) c->n_flat += r.param_shapes[g].n;
    c->info.n_flat_groups = r.n_flat;
  }
  c->m = o.model;
  c->param_mod = o.param_mod;
  c->buffer_mod = o.buffer_mod;
  c->flat = o.flat_params;
  c->unsaved_pairs = o.unsaved_pairs;
  c->n_unsaved = o.n_unsaved;
  free(o.flat_first);
  free(o.unsaved_ties);
  uv_records_free(&u);
  return st;
}

zck_status zck__uv_build_manifest(zck_uv_ckpt *c) {
  const zck_torch_file *mf = c->model0;
  const char *path = zck_torch_name(mf);
  const zck_pk *root = zck_torch_root(mf);
  if (!root || root->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: not a model-states dict", path);
  const zck_pk *bn = zck_pk_dict_get(root, "buffer_names");
  if (!bn) return zck__fail(ZCK_ERR_FORMAT, "%s: is not a model state checkpoint (no 'buffer_names')", path);
  if (bn->kind != ZCK_PK_LIST) return zck__fail(ZCK_ERR_FORMAT, "%s: 'buffer_names' is not a list", path);
  const zck_pk *module = zck_pk_dict_get(root, "module"), *shapes = zck_pk_dict_get(root, "param_shapes");
  const zck_pk *frozen = zck_pk_dict_get(root, "frozen_param_shapes"), *shared = zck_pk_dict_get(root, "shared_params");
  bool pipe = module && module->kind == ZCK_PK_NONE;   /* PipelineModule: uv_pipe.c */
  if (!pipe && (!module || module->kind != ZCK_PK_DICT))
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'module' missing or not a dict", path);
  if (!shapes || shapes->kind != ZCK_PK_LIST)
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'param_shapes' missing or not a list of dicts: not a ZeRO checkpoint", path);
  if (frozen && frozen->kind == ZCK_PK_NONE) frozen = NULL;
  if (frozen && frozen->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: 'frozen_param_shapes' is not a dict", path);
  if (shared && shared->kind == ZCK_PK_NONE) shared = NULL;
  if (shared && shared->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: 'shared_params' is not a dict", path);
  int64_t dp, mp = 1;
  ZCK_TRY(zck__uv_need_int(root, "dp_world_size", &dp, path));
  ZCK_TRY(zck__uv_need_int(root, "global_steps", &c->info.global_steps, path));
  ZCK_TRY(zck__uv_need_int(root, "skipped_steps", &c->info.skipped_steps, path));
  /* a zckpt reshard of FP16_UnfusedOptimizer's checkpoint: its step is one ahead (deepspeed.h) */
  const zck_pk *sa = zck_pk_dict_get(root, "zckpt_step_ahead");
  if (sa && (sa->kind != ZCK_PK_INT || !zck_pk_as_int(sa, &c->info.step_ahead) || c->info.step_ahead < 0 ||
             c->info.step_ahead > 1))
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'zckpt_step_ahead' is not 0 or 1", path);
  if (zck_pk_dict_get(root, "mp_world_size")) ZCK_TRY(zck__uv_need_int(root, "mp_world_size", &mp, path));
  if (mp < 1 || mp > 4096)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: mp_world_size %lld: tensor/pipeline-parallel checkpoints are not supported",
                     path, (long long)mp);
  c->info.tp_size = (uint32_t)mp;  /* > 1: AutoTP, its shapes set by uv_autotp.c */
  if (dp < 1 || dp > (1 << 20)) return zck__fail(ZCK_ERR_FORMAT, "%s: dp_world_size %lld is not a world size", path, (long long)dp);
  c->info.world_size = (uint32_t)dp;
  c->info.global_samples = -1;
  const zck_pk *gs = zck_pk_dict_get(root, "global_samples");
  if (gs && (gs->kind != ZCK_PK_INT || !zck_pk_as_int(gs, &c->info.global_samples)))
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'global_samples' is not an int", path);
  const zck_pk *ver = zck_pk_dict_get(root, "ds_version");
  if (ver && ver->kind != ZCK_PK_NONE) {
    if (!zck_pk_as_str(ver)) return zck__fail(ZCK_ERR_FORMAT, "%s: 'ds_version' is not a string", path);
    if (!(c->ds_version = zck__strdup(zck_pk_as_str(ver)))) return ZCK_ERR_NO_MEMORY;
    c->info.ds_version = c->ds_version;
  }
  /* module tensors (other values, e.g. _extra_state objects, are skipped as DeepSpeed's
   * reader does) */
  size_t nm = pipe ? 0 : module->u.dict.len;
  if (!(c->module = zck__calloc(nm + 1, sizeof *c->module))) return ZCK_ERR_NO_MEMORY;
  zck__strmap seen = {0};
  zck_status st = zck__strmap_init(&seen, nm);
  for (size_t i = 0; st == ZCK_OK && i < nm; i++) {
    const char *name = zck_pk_as_str(module->u.dict.keys[i]);
    bool dup = false;
    if (!name) st = zck__fail(ZCK_ERR_FORMAT, "%s: module: key %zu is not a string", path, i);
    else st = zck__strmap_put(&seen, name, i, &dup, NULL);
    if (st == ZCK_OK && dup) st = zck__fail(ZCK_ERR_FORMAT, "%s: module: duplicate key '%s'", path, name);
    else if (st == ZCK_OK && zck_torch_tensor_of(mf, module->u.dict.values[i]))
      st = zck__uv_tref_of(mf, module->u.dict.values[i], name, &c->module[c->n_module++]);
  }
  zck__strmap_free(&seen);
  if (st == ZCK_OK) st = zck__uv_autoep_module(c, root);
  if (st == ZCK_OK && !pipe) st = zck__uv_moe_module(c, root);
  if (st == ZCK_OK && pipe) st = zck__uv_pipe_open(c, root, &shapes);   /* every stage's params, tp_size 1 */
  c->frozen_excluded = c->info.stage >= 2 && !frozen;
  if (st == ZCK_OK) st = build_model(c, path, shapes, frozen, shared, bn);
  if (st == ZCK_OK && c->info.tp_size > 1) st = zck__uv_autotp(c);
  return st;
}

// ---- frozen params and buffers

static zck_status zck__uv_aux(zck_uv_ckpt *c, const char *path, const zck__uv_tref *t, const char *what, zck_store *out) {
  if (!t->contiguous) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s is a strided view", path, what);
  ZCK_ASSERT(c->n_aux < c->cap_aux);
  zck__uv_tstore *a = &c->aux[c->n_aux];
  if (!(a->path = zck__strdup(path))) return ZCK_ERR_NO_MEMORY;
  c->n_aux++;
  a->base = t->offset;
  a->es = zck_dtype_size(t->dtype);
  a->numel = t->numel;
  atomic_flag_clear(&a->lock);
  /* its zip record's CRC-32, checked as the tensor is read (as for the state files) */
  a->has_rec = !c->no_verify && t->has_rec;
  if (a->has_rec) {
    a->rec = t->rec;
    if (!(a->what = zck__strdup(what))) return ZCK_ERR_NO_MEMORY;
    a->rec.what = a->what;
  }
  *out = zck_store_callback(zck__uv_tstore_read, NULL, a, t->dtype, t->numel, a->path);
  return ZCK_OK;
}

/* A model file's frozen_param_fragments, indexed: it is looked up once per frozen param,
 * and a LoRA model's params are mostly frozen. */
static zck_status zck__uv_fragments_index(const zck_torch_file *f, zck_pk_dict_index *x) {
  return zck_pk_dict_index_init(x, zck_pk_dict_get(zck_torch_root(f), "frozen_param_fragments"));
}

/* frozen_param_fragments[name] of one model file (ffx: its index), checked to hold what the
 * stage keeps of p (lib/layout_lp.c). */
static zck_status zck__uv_fragment(zck_uv_ckpt *c, const zck_torch_file *f, const zck_pk_dict_index *ffx,
                                   const zck_param *p, zck_store *out) {
  const char *path = zck_torch_name(f);
  const zck_pk *node = zck_pk_dict_index_get(ffx, p->name);
  if (!node) return zck_frozen_fragment_missing(path, p->name);
  zck__uv_tref t;
  ZCK_TRY(zck__uv_tref_of(f, node, p->name, &t));
  char what[600];
  snprintf(what, sizeof what, "frozen_param_fragments['%.500s']", p->name);
  ZCK_TRY(zck_frozen_fragment_check(path, what, t.numel, p->numel, c->info.stage, c->info.world_size));
  return zck__uv_aux(c, path, &t, what, out);
}

/* The model-states file of TP rank t (AutoTP) and dp rank r (stage 3: every dp rank has
 * one), opened unless it is model0. */
static zck_status zck__uv_rank_model(const zck_uv_ckpt *c, uint32_t t, uint32_t r, const zck_torch_open_opts *topts,
                                     zck_torch_file **f, const char **why) {
  char *p = c->info.stage == 3 ? zck__sprintf("%s/zero_pp_rank_%u_mp_rank_%02u_model_states.pt", c->dir, r, t)
                               : zck__sprintf("%s/mp_rank_%02u_model_states.pt", c->dir, t);
  struct stat sb;
  zck_status st = ZCK_OK;
  if (!p) return ZCK_ERR_NO_MEMORY;
  if (stat(p, &sb) != 0) st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: missing (%s)", p, why ? *why : "a rank's frozen params");
  else st = zck__uv_torch_open(p, topts, f);
  free(p);
  return st;
}

/* AutoTP (stage 1/2/3): every TP rank's model files hold its slices of the frozen params
 * (module, or frozen_param_fragments); laid out per TP rank over its shard shapes, then
 * merged onto the full shapes by the affine map. */
static zck_status zck__uv_build_frozen_tp(zck_uv_ckpt *c, const zck_torch_open_opts *topts, const uint32_t *fp,
                                          size_t nf, bool frags) {
  const zck_model *m = c->m;
  uint32_t T = c->info.tp_size, w = c->info.world_size;
  int stage = c->info.stage;
  const zck_pk *uci = zck_pk_dict_get(zck_torch_root(c->model0), "universal_checkpoint_info");
  zck_layout **ls = zck__calloc(T, sizeof *ls);
  zck_model **sm = zck__calloc(T, sizeof *sm);
  uint64_t *numel = zck__calloc(m->n_params + 1, sizeof *numel);
  size_t n_stores = 0;
  zck_status st = ls && sm && numel ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (uint32_t t = 0; st == ZCK_OK && t < T; t++) {
    st = zck_ds_autotp_shard_model(uci, m, t, &sm[t]);
    if (st != ZCK_OK) { st = zck__error_prepend(st, "%s", zck_torch_name(c->model0)); break; }
    zck_model_numels(sm[t], numel);
    st = zck_layout_frozen(m->n_params, numel, fp, nf, stage, w, &ls[t]);
    if (st == ZCK_OK) n_stores += ls[t]->n_stores;
  }
  if (st == ZCK_OK && !(c->frozen_stores = zck__calloc(n_stores + 1, sizeof *c->frozen_stores))) st = ZCK_ERR_NO_MEMORY;
  size_t base = 0;
  zck_torch_file *rf = NULL;
  for (uint32_t t = 0; st == ZCK_OK && t < T; t++) {
    for (uint32_t r = 0; st == ZCK_OK && r < (stage == 3 ? w : 1); r++) {
      const zck_torch_file *f = c->model0;
      if (t || r) {
        const char *why = "a TP rank's slices of the frozen params";
        st = zck__uv_rank_model(c, t, r, topts, &rf, &why);
        f = rf;
      }
      zck_pk_dict_index idx = {0};   /* frozen_param_fragments or module, whichever this reads */
      if (st == ZCK_OK)
        st = frags ? zck__uv_fragments_index(f, &idx)
                   : zck_pk_dict_index_init(&idx, zck_pk_dict_get(zck_torch_root(f), "module"));
      for (size_t i = 0; st == ZCK_OK && i < nf; i++) {
        const zck_param *p = &sm[t]->params[fp[i]];
        zck_store *out = &c->frozen_stores[base + zck_layout_store_id(ls[t], (uint32_t)i, r)];
        if (frags) {
          st = zck__uv_fragment(c, f, &idx, p, out);
          continue;
        }
        const zck_pk *node = zck_pk_dict_index_get(&idx, p->name);
        zck__uv_tref tr;
        char what[600];
        snprintf(what, sizeof what, "module['%.500s']", p->name);
        if (!node) {
          st = zck__fail(ZCK_ERR_FORMAT, "%s: frozen parameter '%s' missing from module", zck_torch_name(f), p->name);
          break;
        }
        st = zck__uv_tref_of(f, node, p->name, &tr);
        if (st == ZCK_OK && tr.numel != p->numel) {
          char a[128], b[128];
          st = zck__fail(ZCK_ERR_MISMATCH, "%s: %s has shape %s but the affine map gives TP rank %u %s",
                         zck_torch_name(f), what, zck_shape_str(tr.ndim, tr.shape, a, sizeof a), t,
                         zck_shape_str(p->ndim, p->shape, b, sizeof b));
        }
        if (st == ZCK_OK) st = zck__uv_aux(c, zck_torch_name(f), &tr, what, out);
      }
      zck_pk_dict_index_free(&idx);
      zck_torch_close(rf);
      rf = NULL;
    }
    if (st == ZCK_OK) base += ls[t]->n_stores;
  }
  if (st == ZCK_OK &&
      (st = zck_ds_autotp_merge(uci, m, T, fp, nf, (const zck_layout *const *)ls, &c->frozen_layout)) != ZCK_OK)
    st = zck__error_prepend(st, "%s", zck_torch_name(c->model0));
  for (uint32_t t = 0; ls && sm && t < T; t++) {
    zck_layout_free(ls[t]);
    zck_model_free(sm[t]);
  }
  free(ls);
  free(sm);
  free(numel);
  return st;
}

zck_status zck__uv_build_frozen(zck_uv_ckpt *c, const zck_torch_open_opts *topts) {
  const zck_model *m = c->m;
  uint32_t w = c->info.world_size;
  int stage = c->info.stage;
  size_t nf = zck_frozen_params(m, NULL);
  const zck_pk *root = zck_torch_root(c->model0);
  const zck_pk *ff = zck_pk_dict_get(root, "frozen_param_fragments");
  bool frags = ff && ff->kind != ZCK_PK_NONE;
  const zck_pk *fs = zck_pk_dict_get(root, "frozen_param_shapes");
  if (frags && (ff->kind != ZCK_PK_DICT || !fs || fs->kind != ZCK_PK_DICT || ff->u.dict.len != fs->u.dict.len))
    return zck__fail(ZCK_ERR_MISMATCH, "%s: frozen_param_fragments does not match frozen_param_shapes",
                     zck_torch_name(c->model0));
  if (!nf) return ZCK_OK;
  uint32_t *fp = zck__calloc(nf, sizeof *fp);
  uint64_t *numel = zck__calloc(m->n_params + 1, sizeof *numel);
  zck_torch_file *rf = NULL;
  zck_status st = fp && numel ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) {
    zck_frozen_params(m, fp);
    zck_model_numels(m, numel);
  }
  if (st == ZCK_OK && c->info.tp_size > 1 && (stage != 3 || frags)) {
    st = zck__uv_build_frozen_tp(c, topts, fp, nf, stage == 3 || (stage == 2 && frags));
    free(fp);
    free(numel);
    return st;
  }
  if (st == ZCK_OK && stage == 3 && !frags) st = zck_frozen_fragments_absent(zck_torch_name(c->model0), m->params[fp[0]].name);
  if (st == ZCK_OK) st = zck_layout_frozen(m->n_params, numel, fp, nf, stage, w, &c->frozen_layout);
  if (st == ZCK_OK && !(c->frozen_stores = zck__calloc(c->frozen_layout->n_stores + 1, sizeof *c->frozen_stores)))
    st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK && stage == 3) {
    /* every rank's model file holds its slice of each frozen param */
    for (uint32_t r = 0; st == ZCK_OK && r < w; r++) {
      const zck_torch_file *f = c->model0;
      if (r) {
        char *p = zck__sprintf("%s/zero_pp_rank_%u_mp_rank_00_model_states.pt", c->dir, r);
        struct stat sb;
        if (!p) st = ZCK_ERR_NO_MEMORY;
        else if (stat(p, &sb) != 0)
          st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: missing (the frozen_param_fragments of dp rank %u of %u)", p, r, w);
        else st = zck__uv_torch_open(p, topts, &rf);
        free(p);
        f = rf;
      }
      zck_pk_dict_index ffx = {0};
      if (st == ZCK_OK) st = zck__uv_fragments_index(f, &ffx);
      for (size_t i = 0; st == ZCK_OK && i < nf; i++)
        st = zck__uv_fragment(c, f, &ffx, &m->params[fp[i]],
                              &c->frozen_stores[zck_layout_store_id(c->frozen_layout, (uint32_t)i, r)]);
      zck_pk_dict_index_free(&ffx);
      zck_torch_close(rf);
      rf = NULL;
    }
  } else {
    const char *path = zck_torch_name(c->model0);
    zck_pk_dict_index ffx = {0};
    if (st == ZCK_OK && stage == 2 && frags) st = zck__uv_fragments_index(c->model0, &ffx);
    for (size_t i = 0; st == ZCK_OK && i < nf; i++) {
      const zck_param *p = &m->params[fp[i]];
      if (stage == 2 && frags) {
        st = zck__uv_fragment(c, c->model0, &ffx, p, &c->frozen_stores[i]);
      } else {
        char what[600];
        snprintf(what, sizeof what, "module['%.500s']", p->name);
        st = zck__uv_aux(c, path, &c->module[c->param_mod[fp[i]]], what, &c->frozen_stores[i]);
      }
    }
    zck_pk_dict_index_free(&ffx);
  }
  free(fp);
  free(numel);
  return st;
}

zck_status zck__uv_build_buffers(zck_uv_ckpt *c) {
  const zck_model *m = c->m;
  if (!m->n_buffers) return ZCK_OK;
  uint64_t *numel = zck__calloc(m->n_buffers, sizeof *numel);
  if (!numel) return ZCK_ERR_NO_MEMORY;
  for (size_t b = 0; b < m->n_buffers; b++) numel[b] = m->buffers[b].numel;
  zck_status st = zck_layout_whole(m->n_buffers, numel, NULL, m->n_buffers, &c->buffer_layout);
  free(numel);
  ZCK_TRY(st);
  if (!(c->buffer_stores = zck__calloc(m->n_buffers, sizeof *c->buffer_stores))) return ZCK_ERR_NO_MEMORY;
  for (size_t b = 0; b < m->n_buffers; b++) {
    char what[600];
    snprintf(what, sizeof what, "buffer module['%.500s']", m->buffers[b].name);
    ZCK_TRY(zck__uv_aux(c, zck_torch_name(c->model0), &c->module[c->buffer_mod[b]], what, &c->buffer_stores[b]));
  }
  return ZCK_OK;
}
