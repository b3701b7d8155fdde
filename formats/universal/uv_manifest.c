/* uv_manifest.c: the model manifest of a universal checkpoint, by the DeepSpeed reader's
 * rules (formats/deepspeed/ds_manifest.c), applied to the model-states file the universal
 * folder carries byte for byte and to zero/optimizer_state.pt's param_groups. Built the
 * same way, a reshard from the universal folder lays out every flat group, sub-group,
 * frozen fragment and `module` entry exactly as a reshard from the original checkpoint.
 *
 * Param order = the `module` keys minus buffers (module.parameters() order). A key is a
 * buffer (buffer_names), a tied alias (shared_params), trainable (param_shapes: shape from
 * there, stage-3 module entries are [0]-shaped placeholders), frozen (frozen_param_shapes,
 * or anything else in stage 1 and pre-0.9.1 stage-2 files). Optimizer group g = flat group
 * g in stage 1/2 (round-robin order undone); in stage 3 param_groups[g]['params'] lists
 * the sub-groups of group g, in creation order.
 *
 * Also the frozen-parameter part (module tensors, or frozen_param_fragments of every rank
 * file in stage 3) and the buffers. */
#include "uv_internal.h"

#include "deepspeed/deepspeed.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

// ---- name -> index lookups (lib/strmap.h)

/* Inserts key (borrowed) -> i unless it is there (*was_there then says so). */
static zck_status map_put(zck__strmap *m, const char *key, size_t i, bool *was_there) {
  return zck__strmap_put(m, key, i, was_there, NULL);
}

// ---- pickle helpers

static zck_status zck__uv_shape_of(const zck_pk *node, int *ndim, int64_t *shape, const char *path, const char *what,
                                   const char *name) {
  if (!node || (node->kind != ZCK_PK_TUPLE && node->kind != ZCK_PK_LIST))
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s['%s']: shape is not a torch.Size, tuple or list", path, what, name);
  if (node->u.seq.len > ZCK_MAX_DIMS)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s['%s']: %zu dimensions (at most %d supported)", path, what, name,
                     node->u.seq.len, ZCK_MAX_DIMS);
  for (size_t i = 0; i < node->u.seq.len; i++) {
    int64_t v;
    const zck_pk *it = node->u.seq.items[i];
    if (!it || it->kind != ZCK_PK_INT || !zck_pk_as_int(it, &v) || v < 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: %s['%s']: shape dimension %zu is not a non-negative int", path, what, name, i);
    shape[i] = v;
  }
  *ndim = (int)node->u.seq.len;
  return ZCK_OK;
}

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

static bool zck__uv_same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
  if (na != nb) return false;
  for (int i = 0; i < na; i++)
    if (a[i] != b[i]) return false;
  return true;
}

static zck_status zck__uv_need_int(const zck_pk *root, const char *key, int64_t *out, const char *path) {
  const zck_pk *v = zck_pk_dict_get(root, key);
  if (!v) return zck__fail(ZCK_ERR_FORMAT, "%s: key '%s' missing (DeepSpeed's loader needs it)", path, key);
  if (v->kind != ZCK_PK_INT || !zck_pk_as_int(v, out)) return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is not an int", path, key);
  return ZCK_OK;
}

/* Plain hyper-parameters of a param_groups entry (tensors and objects are not carried:
 * a writer checks that what an optimizer needs, 'lr', is there). */
static zck_status zck__uv_hparams(zck_model *m, uint32_t g, const zck_pk *group) {
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
    default: break;
    }
  }
  return ZCK_OK;
}

// ---- the manifest

typedef struct zck__uv_build {
  const char *path;            /* the model-states file */
  const zck_pk *module, *shapes, *frozen, *shared;
  zck__strmap train, fz, buffers, alias, modmap;  /* name -> index */
  size_t n_train;
  size_t *flat_first;          /* [n_flat groups + 1] into the flat order */
  const char **train_name;     /* flat index -> name */
  const zck_pk **train_shape;  /* flat index -> shape node */
  int64_t *train_param, *frozen_param, *alias_param;
} zck__uv_build;

static void zck__uv_build_free(zck__uv_build *b) {
  zck__strmap_free(&b->train);
  zck__strmap_free(&b->fz);
  zck__strmap_free(&b->buffers);
  zck__strmap_free(&b->alias);
  zck__strmap_free(&b->modmap);
  free(b->flat_first);
  free(b->train_name);
  free(b->train_shape);
  free(b->train_param);
  free(b->frozen_param);
  free(b->alias_param);
}

/* The name maps of param_shapes, frozen_param_shapes, buffer_names and shared_params. */
static zck_status zck__uv_index(zck_uv_ckpt *c, zck__uv_build *b, const zck_pk *bn) {
  const char *path = b->path;
  size_t ng = b->shapes->u.seq.len, nt = 0;
  for (size_t g = 0; g < ng; g++) {
    const zck_pk *d = b->shapes->u.seq.items[g];
    if (!d || d->kind != ZCK_PK_DICT)
      return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes[%zu] is not a dict of shapes", path, g);
    nt += d->u.dict.len;
  }
  b->n_train = nt;
  b->flat_first = zck__calloc(ng + 1, sizeof *b->flat_first);
  b->train_name = zck__calloc(nt + 1, sizeof *b->train_name);
  b->train_shape = zck__calloc(nt + 1, sizeof *b->train_shape);
  b->train_param = zck__calloc(nt + 1, sizeof *b->train_param);
  if (!b->flat_first || !b->train_name || !b->train_shape || !b->train_param) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck__strmap_init(&b->train, nt));
  size_t k = 0;
  for (size_t g = 0; g < ng; g++) {
    const zck_pk *d = b->shapes->u.seq.items[g];
    b->flat_first[g] = k;
    for (size_t i = 0; i < d->u.dict.len; i++, k++) {
      const char *name = zck_pk_as_str(d->u.dict.keys[i]);
      if (!name) return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes[%zu]: key %zu is not a string", path, g, i);
      b->train_name[k] = name;
      b->train_shape[k] = d->u.dict.values[i];
      b->train_param[k] = -1;
      bool dup;
      size_t prev;
      ZCK_TRY(zck__strmap_put(&b->train, name, k, &dup, &prev));
      if (dup) {  /* a param in two flat groups */
        size_t g0 = 0;
        while (g0 + 1 < ng && b->flat_first[g0 + 1] <= (size_t)prev) g0++;
        return zck__fail(ZCK_ERR_FORMAT, "%s: parameter '%s' appears twice in param_shapes (groups %zu and %zu): one "
                         "parameter in two groups cannot be laid out", path, name, g0, g);
      }
    }
  }
  b->flat_first[ng] = k;
  size_t nf = b->frozen ? b->frozen->u.dict.len : 0;
  b->frozen_param = zck__calloc(nf + 1, sizeof *b->frozen_param);
  if (!b->frozen_param) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck__strmap_init(&b->fz, nf));
  for (size_t i = 0; i < nf; i++) {
    const char *name = zck_pk_as_str(b->frozen->u.dict.keys[i]);
    if (!name) return zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes: key %zu is not a string", path, i);
    b->frozen_param[i] = -1;
    bool dup;
    ZCK_TRY(map_put(&b->fz, name, i, &dup));
    if (dup)
      return zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes lists '%s' twice", path, name);
    if (zck__strmap_find(&b->train, name) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is in both param_shapes and frozen_param_shapes", path, name);
  }
  ZCK_TRY(zck__strmap_init(&b->buffers, bn->u.seq.len));
  for (size_t i = 0; i < bn->u.seq.len; i++) {
    const char *s = zck_pk_as_str(bn->u.seq.items[i]);
    if (!s) return zck__fail(ZCK_ERR_FORMAT, "%s: buffer_names[%zu] is not a string", path, i);
    bool dup;
    ZCK_TRY(map_put(&b->buffers, s, i, &dup));
  }
  size_t ns = b->shared ? b->shared->u.dict.len : 0;
  b->alias_param = zck__calloc(ns + 1, sizeof *b->alias_param);
  if (!b->alias_param) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck__strmap_init(&b->alias, ns));
  for (size_t i = 0; i < ns; i++) {
    const char *a = zck_pk_as_str(b->shared->u.dict.keys[i]), *s = zck_pk_as_str(b->shared->u.dict.values[i]);
    if (!a || !s) return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params entry %zu is not str -> str", path, i);
    b->alias_param[i] = -1;
    bool dup;
    ZCK_TRY(map_put(&b->alias, a, i, &dup));
    if (zck__strmap_find(&b->train, a) >= 0 || zck__strmap_find(&b->fz, a) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params alias '%s' is itself a saved parameter", path, a);
    if (!strcmp(a, s)) return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params maps '%s' to itself", path, a);
  }
  for (size_t i = 0; i < ns; i++) {
    const char *s = zck_pk_as_str(b->shared->u.dict.values[i]);
    if (zck__strmap_find(&b->alias, s) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params: source '%s' of '%s' is itself an alias (chain or cycle)", path,
                       s, zck_pk_as_str(b->shared->u.dict.keys[i]));
  }
  (void)c;
  return ZCK_OK;
}

/* A shared_params source is saved when it is a param of the files (as the DeepSpeed
 * reader's ds_manifest.c decides): one left out by exclude_frozen_parameters (HF + PEFT's
 * lm_head -> wte) is not, and its alias is no parameter. */
static bool zck__uv_source_saved(const zck_uv_ckpt *c, const zck__uv_build *b, const char *src) {
  if (zck__strmap_find(&b->train, src) >= 0 || zck__strmap_find(&b->fz, src) >= 0) return true;
  bool module_holds_frozen = c->info.stage == 1 || (c->info.stage == 2 && !b->frozen);
  return module_holds_frozen && zck__strmap_find(&b->modmap, src) >= 0 && zck__strmap_find(&b->buffers, src) < 0 &&
         zck__strmap_find(&b->alias, src) < 0;
}

/* One `module` entry: a buffer, or a param classified as the DeepSpeed reader does. */
static zck_status zck__uv_module_entry(zck_uv_ckpt *c, zck__uv_build *b, size_t i) {
  const zck__uv_tref *t = &c->module[i];
  const char *name = t->name, *path = b->path;
  zck_model *m = c->m;
  int stage = c->info.stage;
  uint32_t idx;
  if (zck__strmap_find(&b->buffers, name) >= 0) {
    ZCK_TRY_CTX(zck_model_add_buffer(m, name, t->ndim, t->shape, t->dtype, &idx), "%s", path);
    c->buffer_mod[idx] = (int64_t)i;
    return ZCK_OK;
  }
  int ndim = t->ndim;
  int64_t shape[ZCK_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  bool frozen = false;
  int64_t ai = zck__strmap_find(&b->alias, name), k;
  const char *shape_of = ai >= 0 ? zck_pk_as_str(b->shared->u.dict.values[ai]) : name;
  if (ai >= 0 && !zck__uv_source_saved(c, b, shape_of)) return ZCK_OK;   /* its source was not saved */
  if ((k = zck__strmap_find(&b->train, shape_of)) >= 0) {
    int nd;
    int64_t ps[ZCK_MAX_DIMS];
    ZCK_TRY(zck__uv_shape_of(b->train_shape[k], &nd, ps, path, "param_shapes", shape_of));
    int64_t ep = zck__uv_autoep_mult(c, shape_of);   /* AutoEP: one rank's experts there */
    if (ep && nd) ps[0] *= ep;
    if (stage <= 2 && !zck__uv_same_shape(ndim, shape, nd, ps)) {
      char x[96], y[96];
      return zck__fail(ZCK_ERR_MISMATCH, "%s: module['%s'] has shape %s but param_shapes says %s", path, name,
                       zck_shape_str(ndim, shape, x, sizeof x), zck_shape_str(nd, ps, y, sizeof y));
    }
    ndim = nd;
    memcpy(shape, ps, sizeof shape);
  } else if ((k = zck__strmap_find(&b->fz, shape_of)) >= 0) {
    int nd;
    int64_t fs[ZCK_MAX_DIMS];
    ZCK_TRY(zck__uv_shape_of(b->frozen->u.dict.values[k], &nd, fs, path, "frozen_param_shapes", shape_of));
    if (stage <= 2 && !zck__uv_same_shape(ndim, shape, nd, fs)) {
      char x[96], y[96];
      return zck__fail(ZCK_ERR_MISMATCH, "%s: module['%s'] has shape %s but frozen_param_shapes says %s", path, name,
                       zck_shape_str(ndim, shape, x, sizeof x), zck_shape_str(nd, fs, y, sizeof y));
    }
    ndim = nd;
    memcpy(shape, fs, sizeof shape);
    frozen = true;
  } else if (stage <= 2 && (stage == 1 || !b->frozen)) {
    frozen = true;   /* stage 1 / pre-0.9.1 stage 2: frozen params exist only in module */
  } else if (ai < 0) {
    return zck__fail(ZCK_ERR_FORMAT, "%s: module['%s'] is neither a buffer, a trainable param (param_shapes), a frozen "
                     "param (frozen_param_shapes) nor a tied alias (shared_params)", path, name);
  } else if (stage == 3) {
    return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params alias '%s': source '%s' is not a saved parameter", path, name,
                     shape_of);
  }
  ZCK_TRY_CTX(zck_model_add_param(m, name, ndim, shape, t->dtype, &idx), "%s", path);
  c->param_mod[idx] = (int64_t)i;
  if (ai >= 0) b->alias_param[ai] = idx;
  else if ((k = zck__strmap_find(&b->train, name)) >= 0) b->train_param[k] = idx;
  else if ((k = zck__strmap_find(&b->fz, name)) >= 0) b->frozen_param[k] = idx;
  if (frozen && ai < 0) zck_model_set_frozen(m, idx, true);
  return ZCK_OK;
}

/* Optimizer group of every flat group / sub-group, from optimizer_state.pt param_groups. */
static zck_status zck__uv_groups(zck_uv_ckpt *c, zck__uv_build *b) {
  zck_model *m = c->m;
  const zck_pk *pg = c->param_groups;
  const char *opath = zck_torch_name(c->optim);
  size_t n_flat = b->shapes->u.seq.len;
  if (c->info.stage <= 2 && pg->u.seq.len != n_flat)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: param_groups has %zu groups but param_shapes (%s) has %zu flat groups: the "
                     "group of each parameter is unknown", opath, pg->u.seq.len, b->path, n_flat);
  int32_t *opt_of = zck__calloc(n_flat + 1, sizeof *opt_of);
  zck_status st = opt_of ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t next = 0;
  for (size_t g = 0; st == ZCK_OK && g < pg->u.seq.len; g++) {
    const zck_pk *grp = pg->u.seq.items[g];
    if (!grp || grp->kind != ZCK_PK_DICT) {
      st = zck__fail(ZCK_ERR_FORMAT, "%s: param_groups[%zu] is not a dict", opath, g);
      break;
    }
    uint32_t gi;
    st = zck_model_add_group(m, &gi);
    if (st == ZCK_OK) st = zck__uv_hparams(m, gi, grp);
    if (st != ZCK_OK || c->info.stage <= 2) {
      if (st == ZCK_OK) opt_of[g] = (int32_t)g;
      continue;
    }
    /* stage 3: params = the sub-group ids of this group, numbered in creation order */
    const zck_pk *ids = zck_pk_dict_get(grp, "params");
    if (!ids || (ids->kind != ZCK_PK_LIST && ids->kind != ZCK_PK_TUPLE)) {
      st = zck__fail(ZCK_ERR_FORMAT, "%s: param_groups[%zu]['params'] is not a list of sub-group ids", opath, g);
      break;
    }
    for (size_t j = 0; st == ZCK_OK && j < ids->u.seq.len; j++) {
      int64_t v;
      if (!zck_pk_as_int(ids->u.seq.items[j], &v) || v != (int64_t)next || next >= n_flat)
        st = zck__fail(ZCK_ERR_FORMAT, "%s: param_groups[%zu]['params'][%zu]: expected sub-group %zu of the %zu in "
                       "param_shapes: a sub-group in two groups, or out of order", opath, g, j, next, n_flat);
      else
        opt_of[next++] = (int32_t)g;
    }
  }
  if (st == ZCK_OK && c->info.stage == 3 && next != n_flat)
    st = zck__fail(ZCK_ERR_MISMATCH, "%s: param_groups cover %zu sub-groups but param_shapes (%s) has %zu: the group of "
                   "the others is unknown", opath, next, b->path, n_flat);
  /* param_shapes is in flat order: round-robin order in stage 1/2 with round_robin_gradients */
  if (st == ZCK_OK &&
      (st = zck_layout_groups_to_model(m, c->flat, b->flat_first, n_flat, opt_of,
                                       c->info.stage <= 2 && c->info.round_robin, c->info.world_size)) != ZCK_OK)
    st = zck__error_prepend(st, "%s", opath);
  free(opt_of);
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
  zck__uv_build b;
  memset(&b, 0, sizeof b);
  b.path = path;
  b.module = zck_pk_dict_get(root, "module");
  b.shapes = zck_pk_dict_get(root, "param_shapes");
  b.frozen = zck_pk_dict_get(root, "frozen_param_shapes");
  b.shared = zck_pk_dict_get(root, "shared_params");
  bool pipe = b.module && b.module->kind == ZCK_PK_NONE;   /* PipelineModule: uv_pipe.c */
  if (!pipe && (!b.module || b.module->kind != ZCK_PK_DICT))
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'module' missing or not a dict", path);
  if (!b.shapes || b.shapes->kind != ZCK_PK_LIST)
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'param_shapes' missing or not a list of dicts: not a ZeRO checkpoint", path);
  if (b.frozen && b.frozen->kind == ZCK_PK_NONE) b.frozen = NULL;
  if (b.frozen && b.frozen->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: 'frozen_param_shapes' is not a dict", path);
  if (b.shared && b.shared->kind == ZCK_PK_NONE) b.shared = NULL;
  if (b.shared && b.shared->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: 'shared_params' is not a dict", path);
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
  size_t nm = pipe ? 0 : b.module->u.dict.len;
  c->module = zck__calloc(nm + 1, sizeof *c->module);
  c->param_mod = zck__calloc(nm + 1, sizeof *c->param_mod);
  c->buffer_mod = zck__calloc(nm + 1, sizeof *c->buffer_mod);
  if (!c->module || !c->param_mod || !c->buffer_mod || !(c->m = zck_model_new())) return ZCK_ERR_NO_MEMORY;
  zck__strmap seen = {0};
  zck_status st = zck__strmap_init(&seen, nm);
  for (size_t i = 0; st == ZCK_OK && i < nm; i++) {
    const char *name = zck_pk_as_str(b.module->u.dict.keys[i]);
    bool dup = false;
    if (!name) st = zck__fail(ZCK_ERR_FORMAT, "%s: module: key %zu is not a string", path, i);
    else st = map_put(&seen, name, i, &dup);
    if (st == ZCK_OK && dup) st = zck__fail(ZCK_ERR_FORMAT, "%s: module: duplicate key '%s'", path, name);
    else if (st == ZCK_OK && zck_torch_tensor_of(mf, b.module->u.dict.values[i]))
      st = zck__uv_tref_of(mf, b.module->u.dict.values[i], name, &c->module[c->n_module++]);
  }
  zck__strmap_free(&seen);
  if (st == ZCK_OK) st = zck__uv_autoep_module(c, root);
  if (st == ZCK_OK && !pipe) st = zck__uv_moe_module(c, root);
  if (st == ZCK_OK && pipe) st = zck__uv_pipe_open(c, root, &b.shapes);   /* every stage's params, tp_size 1 */
  if (st == ZCK_OK && c->n_module > nm) {   /* experts or a pipeline's params added to module */
    int64_t *pm = zck__realloc(c->param_mod, (c->n_module + 1) * sizeof *pm);
    if (pm) c->param_mod = pm;
    int64_t *bm = pm ? zck__realloc(c->buffer_mod, (c->n_module + 1) * sizeof *bm) : NULL;
    if (bm) c->buffer_mod = bm;
    if (!bm) st = ZCK_ERR_NO_MEMORY;
  }
  if (st == ZCK_OK) st = zck__uv_index(c, &b, bn);
  if (st == ZCK_OK) st = zck__strmap_init(&b.modmap, c->n_module);
  for (size_t i = 0; st == ZCK_OK && i < c->n_module; i++) {
    bool dup;
    st = map_put(&b.modmap, c->module[i].name, i, &dup);
  }
  c->n_flat = b.n_train;
  c->info.n_flat_groups = b.shapes->u.seq.len;
  if (st == ZCK_OK && !(c->flat = zck__calloc(b.n_train + 1, sizeof *c->flat))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < c->n_module; i++) st = zck__uv_module_entry(c, &b, i);
  for (size_t k = 0; st == ZCK_OK && k < b.n_train; k++) {
    if (b.train_param[k] < 0) {
      size_t g = 0;
      while (b.flat_first[g + 1] <= k) g++;
      st = zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes[%zu] names '%s', which is not in module", path, g, b.train_name[k]);
    } else {
      c->flat[k] = (uint32_t)b.train_param[k];
    }
  }
  for (size_t i = 0; st == ZCK_OK && b.frozen && i < b.frozen->u.dict.len; i++)
    if (b.frozen_param[i] < 0)
      st = zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes names '%s', which is not in module", path,
                     zck_pk_as_str(b.frozen->u.dict.keys[i]));
  c->frozen_excluded = c->info.stage >= 2 && !b.frozen;
  size_t nsh = b.shared ? b.shared->u.dict.len : 0;
  if (st == ZCK_OK && !(c->unsaved_pairs = zck__calloc(2 * nsh + 1, sizeof *c->unsaved_pairs))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < nsh; i++) {
    const char *src = zck_pk_as_str(b.shared->u.dict.values[i]);
    if (zck__uv_source_saved(c, &b, src)) continue;
    c->unsaved_pairs[2 * c->n_unsaved] = zck_pk_as_str(b.shared->u.dict.keys[i]);
    c->unsaved_pairs[2 * c->n_unsaved + 1] = src;
    c->n_unsaved++;
  }
  for (size_t i = 0; st == ZCK_OK && b.shared && i < b.shared->u.dict.len; i++) {
    if (b.alias_param[i] < 0) continue;   /* an alias missing from module (or of an unsaved source): ignored */
    const char *src = zck_pk_as_str(b.shared->u.dict.values[i]);
    int64_t si = zck_model_find_param(c->m, src);
    if (si < 0 || c->m->params[si].tied_to >= 0)
      st = zck__fail(ZCK_ERR_FORMAT, "%s: shared_params: source '%s' of alias '%s' is not a parameter", path, src,
                     zck_pk_as_str(b.shared->u.dict.keys[i]));
    else st = zck_model_set_tied(c->m, (uint32_t)b.alias_param[i], (uint32_t)si);
    if (st == ZCK_OK) zck_model_set_frozen(c->m, (uint32_t)b.alias_param[i], c->m->params[si].frozen);
  }
  if (st == ZCK_OK) st = zck__uv_groups(c, &b);
  if (st == ZCK_OK && c->info.tp_size > 1) st = zck__uv_autotp(c);
  zck__uv_build_free(&b);
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
