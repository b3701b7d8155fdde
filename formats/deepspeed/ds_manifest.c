/* ds_manifest.c: the model manifest of a DeepSpeed checkpoint, from rank 0's model file
 * (module, buffer_names, param_shapes, frozen_param_shapes, shared_params) and the
 * optimizer's param_groups.
 *
 * Param order = module.parameters() order = the `module` state-dict keys minus buffers,
 * with tied aliases kept (marked tied_to their source, which DeepSpeed names with the
 * first name of named_parameters, so the source comes first). A module key is:
 *   - a buffer if it is in buffer_names;
 *   - a tied alias if it is a key of shared_params;
 *   - trainable if it is in param_shapes (shape from there: stage-3 module entries are
 *     [0]-shaped placeholders);
 *   - frozen if it is in frozen_param_shapes, or, in stage 0/1 (which never save frozen
 *     info) and in pre-0.9.1 stage-2 files, anything else (shape from the module tensor).
 * ZeRO-0 files have no param_shapes / shared_params: ds_zero0.c writes them first.
 * Optimizer group g = flat group g in stage 1/2; in stage 3 the torch optimizer numbers
 * sub-groups 0..S-1 and param_groups[g]['params'] lists the sub-groups of group g. */
#include "ds_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- hyper-parameters */

static zck_status add_hparams(zck_ds_ckpt *c, uint32_t g, const zck_pk *group, const char *path) {
  zck_model *m = c->model;
  if (!group || group->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_FORMAT, "%s: param_groups[%u] is not a dict", path, g);
  for (size_t i = 0; i < group->u.dict.len; i++) {
    const char *key = zck_pk_as_str(group->u.dict.keys[i]);
    const zck_pk *v = group->u.dict.values[i];
    if (!key) return zck__fail(ZCK_ERR_FORMAT, "%s: param_groups[%u]: key %zu is not a string", path, g, i);
    if (!strcmp(key, "params")) continue;
    switch (v->kind) {
    case ZCK_PK_NONE: ZCK_TRY(zck_model_group_set_none(m, g, key)); break;
    case ZCK_PK_BOOL: ZCK_TRY(zck_model_group_set_bool(m, g, key, v->u.b)); break;
    case ZCK_PK_INT: ZCK_TRY(zck_model_group_set_int(m, g, key, v->u.i)); break;
    case ZCK_PK_FLOAT: ZCK_TRY(zck_model_group_set_float(m, g, key, v->u.f)); break;
    case ZCK_PK_STR: ZCK_TRY(zck_model_group_set_string(m, g, key, v->u.str.data)); break;
    case ZCK_PK_TUPLE: case ZCK_PK_LIST: {
      double f[ZCK_HP_MAX_FLOATS];
      size_t n = v->u.seq.len;
      bool ok = n <= ZCK_HP_MAX_FLOATS;
      for (size_t k = 0; ok && k < n; k++) ok = zck_pk_as_double(v->u.seq.items[k], &f[k]);
      if (ok) {
        ZCK_TRY(zck_model_group_set_floats(m, g, key, f, (int)n));
        break;
      }
    } /* fall through */
    default: {
      char sum[96];
      zck_pk_summary(v, sum, sizeof sum);
      ZCK_TRY(zck__ds_warn(c, "%s: param_groups[%u]['%s'] = %s is not a plain value; not carried over", path, g, key, sum));
    }
    }
  }
  return ZCK_OK;
}

/* Optimizer group of every flat group (stage 3: from param_groups[g]['params']). */
static zck_status opt_groups_of_flats(zck_ds_ckpt *c, size_t n_flat, int32_t *opt_of, size_t *n_opt) {
  const char *path = c->optims[0].file->path;
  const zck_pk *pg = c->param_groups;
  if (c->info.stage <= 2) {
    if (pg && pg->u.seq.len != n_flat)  /* DS-54 */
      return zck__fail(ZCK_ERR_MISMATCH, "%s: base_optimizer_state has %zu param_groups but there are %zu flat groups",
                       path, pg->u.seq.len, n_flat);
    for (size_t s = 0; s < n_flat; s++) opt_of[s] = (int32_t)s;
    *n_opt = n_flat;
    return ZCK_OK;
  }
  if (!pg) {
    ZCK_TRY(zck__ds_warn(c, "%s: no optimizer param_groups: all sub-groups assigned to one group", path));
    for (size_t s = 0; s < n_flat; s++) opt_of[s] = 0;
    *n_opt = n_flat ? 1 : 0;
    return ZCK_OK;
  }
  size_t next = 0;
  for (size_t g = 0; g < pg->u.seq.len; g++) {
    int64_t *ids;
    size_t n;
    char what[96];
    snprintf(what, sizeof what, "optimizer_state_dict['param_groups'][%zu]['params']", g);
    ZCK_TRY_CTX(zck__ds_int_list(zck_pk_dict_get(pg->u.seq.items[g], "params"), &ids, &n, what), "%s", path);
    for (size_t k = 0; k < n; k++) {
      if (ids[k] != (int64_t)next || next >= n_flat) {
        free(ids);  /* DS-62: sub-groups are numbered in creation order, group by group */
        return zck__fail(ZCK_ERR_FORMAT, "%s: %s: expected sub-group %zu of %zu, found %lld", path, what, next, n_flat,
                         (long long)ids[k]);
      }
      opt_of[next++] = (int32_t)g;
    }
    free(ids);
  }
  if (next != n_flat)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: param_groups cover %zu sub-groups but param_shapes has %zu", path, next,
                     n_flat);
  *n_opt = pg->u.seq.len;
  return ZCK_OK;
}

/* ---- the manifest */

typedef struct build {
  zck__strmap train, frozen, buffers, alias, module;  /* name -> index */
  size_t n_train;
  /* the model param each name became (-1: none yet) */
  int64_t *train_param;        /* flat index (param_shapes order) -> param */
  int64_t *frozen_param;       /* frozen_param_shapes index -> param */
  int64_t *alias_param;        /* shared_params index -> param */
} build;

static void build_free(build *b) {
  zck__strmap_free(&b->train);
  zck__strmap_free(&b->frozen);
  zck__strmap_free(&b->buffers);
  zck__strmap_free(&b->alias);
  zck__strmap_free(&b->module);
  free(b->train_param);
  free(b->frozen_param);
  free(b->alias_param);
}

/* A shared_params source is saved when it is a trainable or frozen param of the files or
 * (stage 1, pre-0.9.1 stage 2) a non-buffer `module` entry. One saved with
 * exclude_frozen_parameters (HF Trainer + PEFT) is not: its alias is no parameter. */
static bool source_saved(const zck_ds_ckpt *c, const build *b, const char *src) {
  if (zck__strmap_find(&b->train, src) >= 0 || zck__strmap_find(&b->frozen, src) >= 0) return true;
  const zck__ds_model_file *m0 = &c->models[0];
  bool module_holds_frozen = c->info.stage <= 1 || (c->info.stage == 2 && !m0->has_frozen_shapes);
  return module_holds_frozen && zck__strmap_find(&b->module, src) >= 0 && zck__strmap_find(&b->buffers, src) < 0 &&
         zck__strmap_find(&b->alias, src) < 0;
}

static bool same_shape(int nd_a, const int64_t *a, int nd_b, const int64_t *b) {
  if (nd_a != nd_b) return false;
  for (int i = 0; i < nd_a; i++)
    if (a[i] != b[i]) return false;
  return true;
}

static zck_status index_names(zck_ds_ckpt *c, build *b) {
  const zck__ds_model_file *m0 = &c->models[0];
  const char *path = m0->file->path;
  size_t nt = 0;
  for (size_t g = 0; g < m0->n_param_shapes; g++) nt += m0->param_shapes[g].n;
  b->n_train = nt;
  ZCK_TRY(zck__strmap_init(&b->train, nt));
  c->flat_first = zck__calloc(m0->n_param_shapes + 1, sizeof *c->flat_first);
  c->flat_params = zck__calloc(nt ? nt : 1, sizeof *c->flat_params);
  if (!c->flat_first || !c->flat_params) return ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t g = 0; g < m0->n_param_shapes; g++) {
    c->flat_first[g] = k;
    for (size_t i = 0; i < m0->param_shapes[g].n; i++, k++) {
      bool existed;
      size_t v;
      ZCK_TRY(zck__strmap_put(&b->train, m0->param_shapes[g].v[i].name, k, &existed, &v));
      if (existed) {  /* DS-23: zero_to_fp32 would silently collapse them */
        size_t g0 = 0;
        while (g0 + 1 < m0->n_param_shapes && c->flat_first[g0 + 1] <= v) g0++;
        return zck__fail(ZCK_ERR_FORMAT, "%s: parameter '%s' appears twice in param_shapes (groups %zu and %zu)", path,
                         m0->param_shapes[g].v[i].name, g0, g);
      }
    }
  }
  c->flat_first[m0->n_param_shapes] = k;
  ZCK_TRY(zck__strmap_init(&b->frozen, m0->frozen_shapes.n));
  for (size_t i = 0; i < m0->frozen_shapes.n; i++) {
    bool existed;
    ZCK_TRY(zck__strmap_put(&b->frozen, m0->frozen_shapes.v[i].name, i, &existed, NULL));
    if (existed) return zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes lists '%s' twice", path, m0->frozen_shapes.v[i].name);
    if (zck__strmap_find(&b->train, m0->frozen_shapes.v[i].name) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is in both param_shapes and frozen_param_shapes", path,
                       m0->frozen_shapes.v[i].name);
  }
  ZCK_TRY(zck__strmap_init(&b->buffers, m0->n_buffer_names));
  for (size_t i = 0; i < m0->n_buffer_names; i++) {
    bool existed;
    ZCK_TRY(zck__strmap_put(&b->buffers, m0->buffer_names[i], i, &existed, NULL));
  }
  ZCK_TRY(zck__strmap_init(&b->module, m0->n_module));
  for (size_t i = 0; i < m0->n_module; i++) {
    bool existed;
    ZCK_TRY(zck__strmap_put(&b->module, m0->module_names[i], i, &existed, NULL));
  }
  ZCK_TRY(zck__strmap_init(&b->alias, m0->n_shared));
  for (size_t i = 0; i < m0->n_shared; i++) {
    const char *a = m0->shared_alias[i], *s = m0->shared_src[i];
    bool existed;
    ZCK_TRY(zck__strmap_put(&b->alias, a, i, &existed, NULL));
    /* DS-25 */
    if (zck__strmap_find(&b->train, a) >= 0 || zck__strmap_find(&b->frozen, a) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params alias '%s' is itself a saved parameter", path, a);
    if (!strcmp(a, s)) return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params maps '%s' to itself", path, a);
  }
  for (size_t i = 0; i < m0->n_shared; i++)
    if (zck__strmap_find(&b->alias, m0->shared_src[i]) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params: source '%s' of '%s' is itself an alias (chain or cycle)",
                       path, m0->shared_src[i], m0->shared_alias[i]);
  return ZCK_OK;
}

/* The shape of module entry i (name, t): param_shapes' for a trainable param (stage-3
 * module entries are [0]-shaped placeholders), frozen_param_shapes' for a frozen one, else
 * the entry's own; *frozen when it is a frozen param. ai: its shared_params index, or -1. */
static zck_status param_shape(zck_ds_ckpt *c, const build *b, const char *name, const zck__ds_tref *t, int64_t ai,
                              int *ndim, const int64_t **shape, bool *frozen) {
  const zck__ds_model_file *m0 = &c->models[0];
  const char *path = m0->file->path;
  int stage = c->info.stage;
  const char *shape_of = ai >= 0 ? m0->shared_src[ai] : name;   /* an alias has its source's shape */
  char a[96], bb[96];
  int64_t k;
  *ndim = t->ndim;
  *shape = t->shape;
  *frozen = false;
  if ((k = zck__strmap_find(&b->train, shape_of)) >= 0) {
    size_t g = 0;
    while (c->flat_first[g + 1] <= (size_t)k) g++;
    const zck__ds_named_shape *ps = &m0->param_shapes[g].v[k - (int64_t)c->flat_first[g]];
    if (stage <= 2 && !same_shape(t->ndim, t->shape, ps->ndim, ps->shape))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: module['%s'] has shape %s but param_shapes[%zu] says %s", path, name,
                       zck_shape_str(t->ndim, t->shape, a, sizeof a), g, zck_shape_str(ps->ndim, ps->shape, bb, sizeof bb));
    if (stage == 3 && ai < 0 && t->numel != 0)  /* DS-27 */
      ZCK_TRY(zck__ds_warn(c, "%s: module['%s'] is not a [0]-shaped placeholder; DeepSpeed's strict load would fail",
                           path, name));
    *shape = ps->shape;
    *ndim = ps->ndim;
  } else if ((k = zck__strmap_find(&b->frozen, shape_of)) >= 0) {
    const zck__ds_named_shape *fs = &m0->frozen_shapes.v[k];
    if (stage <= 2 && !same_shape(t->ndim, t->shape, fs->ndim, fs->shape))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: module['%s'] has shape %s but frozen_param_shapes says %s", path, name,
                       zck_shape_str(t->ndim, t->shape, a, sizeof a), zck_shape_str(fs->ndim, fs->shape, bb, sizeof bb));
    *shape = fs->shape;
    *ndim = fs->ndim;
    *frozen = true;
  } else if (stage <= 2 && (stage == 1 || !m0->has_frozen_shapes)) {
    *frozen = true;   /* stage 1 / pre-0.9.1 stage 2: frozen params exist only in module */
  } else if (ai < 0) {
    return zck__fail(ZCK_ERR_FORMAT, "%s: module['%s'] is neither a buffer, a trainable param (param_shapes), a frozen "
                     "param (frozen_param_shapes) nor a tied alias (shared_params)", path, name);
  } else if (stage == 3) {
    return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params alias '%s': source '%s' is not a saved parameter", path, name,
                     shape_of);
  }
  return ZCK_OK;
}

/* Every module entry a buffer or a param of the model, in module order. */
static zck_status add_module_entries(zck_ds_ckpt *c, build *b) {
  const zck__ds_model_file *m0 = &c->models[0];
  zck_model *m = c->model;
  for (size_t i = 0; i < m0->n_module; i++) {
    const char *name = m0->module_names[i];
    const zck__ds_tref *t = &m0->module_t[i];
    uint32_t idx;
    if (zck__strmap_find(&b->buffers, name) >= 0) {
      ZCK_TRY(zck_model_add_buffer(m, name, t->ndim, t->shape, t->dtype, &idx));
      c->buffer_mod[idx] = (int64_t)i;
      continue;
    }
    int64_t ai = zck__strmap_find(&b->alias, name), k;
    if (ai >= 0 && !source_saved(c, b, m0->shared_src[ai])) continue;  /* unsaved source: kept in c->unsaved_ties */
    int ndim;
    const int64_t *shape;
    bool frozen;
    ZCK_TRY(param_shape(c, b, name, t, ai, &ndim, &shape, &frozen));
    ZCK_TRY(zck_model_add_param(m, name, ndim, shape, t->dtype, &idx));
    c->param_mod[idx] = (int64_t)i;
    if (ai >= 0) b->alias_param[ai] = idx;
    else if ((k = zck__strmap_find(&b->train, name)) >= 0) b->train_param[k] = idx;
    else if ((k = zck__strmap_find(&b->frozen, name)) >= 0) b->frozen_param[k] = idx;
    if (frozen && ai < 0) zck_model_set_frozen(m, idx, true);
  }
  return ZCK_OK;
}

/* Every name of param_shapes and frozen_param_shapes is a module entry; the flat groups'
 * params in their order. */
static zck_status check_listed(zck_ds_ckpt *c, const build *b) {
  const zck__ds_model_file *m0 = &c->models[0];
  const char *path = m0->file->path;
  for (size_t g = 0, k = 0; g < m0->n_param_shapes; g++)
    for (size_t i = 0; i < m0->param_shapes[g].n; i++, k++) {
      if (b->train_param[k] < 0)
        return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes[%zu] names '%s', which is not in module", path, g,
                         m0->param_shapes[g].v[i].name);
      c->flat_params[k] = (uint32_t)b->train_param[k];
    }
  for (size_t i = 0; i < m0->frozen_shapes.n; i++)
    if (b->frozen_param[i] < 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes names '%s', which is not in module", path,
                       m0->frozen_shapes.v[i].name);
  return ZCK_OK;
}

/* shared_params: each alias tied to its source, or (an unsaved source) kept aside. */
static zck_status add_ties(zck_ds_ckpt *c, const build *b) {
  const zck__ds_model_file *m0 = &c->models[0];
  const char *path = m0->file->path;
  zck_model *m = c->model;
  c->unsaved_ties = zck__calloc(m0->n_shared + 1, sizeof *c->unsaved_ties);
  c->unsaved_pairs = zck__calloc(2 * m0->n_shared + 1, sizeof *c->unsaved_pairs);
  if (!c->unsaved_ties || !c->unsaved_pairs) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < m0->n_shared; i++) {
    if (!source_saved(c, b, m0->shared_src[i])) {
      /* exclude_frozen_parameters left out a frozen tied source (PEFT's lm_head ->
       * wte): zero_to_fp32 drops the alias, ds_to_universal converts the rest. Not a
       * parameter here; kept for inspect and the outputs' metadata. */
      c->unsaved_pairs[2 * c->n_unsaved_ties] = m0->shared_alias[i];
      c->unsaved_pairs[2 * c->n_unsaved_ties + 1] = m0->shared_src[i];
      c->unsaved_ties[c->n_unsaved_ties++] = i;
      continue;
    }
    if (b->alias_param[i] < 0) {
      ZCK_TRY(zck__ds_warn(c, "%s: shared_params alias '%s' is not in module; ignored", path, m0->shared_alias[i]));
      continue;
    }
    int64_t src = zck_model_find_param(m, m0->shared_src[i]);
    if (src < 0 || m->params[src].tied_to >= 0)  /* DS-25 */
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params: source '%s' of alias '%s' is not a parameter", path,
                       m0->shared_src[i], m0->shared_alias[i]);
    ZCK_TRY(zck_model_set_tied(m, (uint32_t)b->alias_param[i], (uint32_t)src));
    zck_model_set_frozen(m, (uint32_t)b->alias_param[i], m->params[src].frozen);
  }
  return ZCK_OK;
}

/* The optimizer's groups (with their hyper-parameters) and their params in group order. */
static zck_status add_groups(zck_ds_ckpt *c) {
  const zck__ds_model_file *m0 = &c->models[0];
  zck_model *m = c->model;
  size_t n_flat = m0->n_param_shapes, n_opt = 0;
  int32_t *opt_of = zck__calloc(n_flat + 1, sizeof *opt_of);
  zck_status s = opt_of ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) s = opt_groups_of_flats(c, n_flat, opt_of, &n_opt);
  for (size_t g = 0; s == ZCK_OK && g < n_opt; g++) {
    uint32_t gi;
    s = zck_model_add_group(m, &gi);
    if (s == ZCK_OK && c->param_groups) s = add_hparams(c, gi, c->param_groups->u.seq.items[g], c->optims[0].file->path);
  }
  bool rr = c->info.stage >= 1 && c->info.stage <= 2 && c->info.round_robin;
  if (s == ZCK_OK)
    s = zck_layout_groups_to_model(m, c->flat_params, c->flat_first, n_flat, opt_of, rr, c->info.world_size);
  free(opt_of);
  return s;
}

zck_status zck__ds_build_manifest(zck_ds_ckpt *c) {
  const zck__ds_model_file *m0 = &c->models[0];
  const char *path = m0->file->path;
  if (m0->n_param_shapes != c->optims[0].n_flat)  /* DS-50 / DS-60 */
    return zck__fail(ZCK_ERR_MISMATCH, "%s: param_shapes has %zu groups but %s has %zu flat groups", path,
                     m0->n_param_shapes, c->optims[0].file->name, c->optims[0].n_flat);
  if (!(c->model = zck_model_new())) return ZCK_ERR_NO_MEMORY;
  build b;
  memset(&b, 0, sizeof b);
  zck_status s = index_names(c, &b);
  if (s == ZCK_OK) {
    c->param_mod = zck__calloc(m0->n_module + 1, sizeof *c->param_mod);
    c->buffer_mod = zck__calloc(m0->n_module + 1, sizeof *c->buffer_mod);
    b.train_param = zck__calloc(b.n_train + 1, sizeof *b.train_param);
    b.frozen_param = zck__calloc(m0->frozen_shapes.n + 1, sizeof *b.frozen_param);
    b.alias_param = zck__calloc(m0->n_shared + 1, sizeof *b.alias_param);
    if (!c->param_mod || !c->buffer_mod || !b.train_param || !b.frozen_param || !b.alias_param) s = ZCK_ERR_NO_MEMORY;
  }
  if (s == ZCK_OK) {
    for (size_t i = 0; i < b.n_train; i++) b.train_param[i] = -1;
    for (size_t i = 0; i < m0->frozen_shapes.n; i++) b.frozen_param[i] = -1;
    for (size_t i = 0; i < m0->n_shared; i++) b.alias_param[i] = -1;
    s = add_module_entries(c, &b);
  }
  if (s == ZCK_OK) s = check_listed(c, &b);
  if (s == ZCK_OK) s = add_ties(c, &b);
  if (s == ZCK_OK) s = add_groups(c);
  build_free(&b);
  return s;
}
