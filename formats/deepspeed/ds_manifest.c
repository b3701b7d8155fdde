/* ds_manifest.c: the model manifest of a DeepSpeed model-states file (ds_manifest.h), from
 * its module, buffer_names, param_shapes, frozen_param_shapes and shared_params and the
 * optimizer's param_groups; and the DeepSpeed reader's call of it (rank 0's model file).
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
 * Optimizer group g = flat group g in stage 1/2 (round-robin order undone); in stage 3 the
 * torch optimizer numbers sub-groups 0..S-1 and param_groups[g]['params'] lists the
 * sub-groups of group g, in creation order. */
#include "ds_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct build {
  const zck__ds_records *r;
  zck__ds_manifest *out;
  zck__strmap train, frozen, buffers, alias, module;  /* name -> index */
  size_t n_train;
  /* the model param each name became (-1: none yet) */
  int64_t *train_param;        /* flat index (param_shapes order) -> param */
  int64_t *frozen_param;       /* frozen_param_shapes index -> param */
  int64_t *alias_param;        /* shared_params index -> param */
} build;

static zck_status warning(const build *b, const char *fmt, ...) ZCK__PRINTF(2, 3);
static zck_status warning(const build *b, const char *fmt, ...) {
  if (!b->r->warn) return ZCK_OK;
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return b->r->warn(b->r->warn_ctx, buf);
}

static size_t n_frozen(const zck__ds_records *r) {
  return r->frozen_shapes ? r->frozen_shapes->n : 0;
}

// ---- hyper-parameters and groups

/* The plain values of a param_groups entry (tensors and objects are not carried: a writer
 * checks that what an optimizer needs, 'lr', is there). */
static zck_status add_hparams(const build *b, uint32_t g, const zck_pk *group) {
  const char *path = b->r->optim_path;
  zck_model *m = b->out->model;
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
      ZCK_TRY(warning(b, "%s: param_groups[%u]['%s'] = %s is not a plain value; not carried over", path, g, key, sum));
    }
    }
  }
  return ZCK_OK;
}

/* Stage 3: param_groups[g]['params'] = the sub-groups of group g, numbered in creation
 * order (DS-62); *next: the first sub-group not yet given a group. */
static zck_status subgroups_of(const build *b, size_t g, const zck_pk *group, int32_t *opt_of, size_t *next) {
  const char *path = b->r->optim_path;
  size_t n_flat = b->r->n_flat;
  const zck_pk *ids = zck_pk_dict_get(group, "params");
  if (!ids || (ids->kind != ZCK_PK_LIST && ids->kind != ZCK_PK_TUPLE))
    return zck__fail(ZCK_ERR_FORMAT, "%s: param_groups[%zu]['params'] is not a list of sub-group ids", path, g);
  for (size_t j = 0; j < ids->u.seq.len; j++) {
    int64_t v;
    if (!zck_pk_as_int(ids->u.seq.items[j], &v) || v != (int64_t)*next || *next >= n_flat)
      return zck__fail(ZCK_ERR_FORMAT, "%s: param_groups[%zu]['params'][%zu]: expected sub-group %zu of the %zu in "
                       "param_shapes: a sub-group in two groups, or out of order", path, g, j, *next, n_flat);
    opt_of[(*next)++] = (int32_t)g;
  }
  return ZCK_OK;
}

/* The optimizer's groups, with their hyper-parameters; opt_of: the group of every flat group. */
static zck_status add_groups_of(const build *b, int32_t *opt_of) {
  const zck__ds_records *r = b->r;
  const zck_pk *pg = r->param_groups;
  size_t n_flat = r->n_flat;
  uint32_t gi;
  if (!pg) {   /* none saved: a group per flat group (stage 3: one for all) */
    if (r->stage == 3) ZCK_TRY(warning(b, "%s: no optimizer param_groups: all sub-groups assigned to one group", r->optim_path));
    size_t n_opt = r->stage == 3 ? (n_flat ? 1 : 0) : n_flat;
    for (size_t s = 0; s < n_flat; s++) opt_of[s] = r->stage == 3 ? 0 : (int32_t)s;
    for (size_t g = 0; g < n_opt; g++) ZCK_TRY(zck_model_add_group(b->out->model, &gi));
    return ZCK_OK;
  }
  if (r->stage <= 2 && pg->u.seq.len != n_flat)  /* DS-54 */
    return zck__fail(ZCK_ERR_MISMATCH, "%s: param_groups has %zu groups but param_shapes (%s) has %zu flat groups: the "
                     "group of each parameter is unknown", r->optim_path, pg->u.seq.len, r->path, n_flat);
  size_t next = 0;
  for (size_t g = 0; g < pg->u.seq.len; g++) {
    const zck_pk *group = pg->u.seq.items[g];
    if (!group || group->kind != ZCK_PK_DICT)
      return zck__fail(ZCK_ERR_FORMAT, "%s: param_groups[%zu] is not a dict", r->optim_path, g);
    ZCK_TRY(zck_model_add_group(b->out->model, &gi));
    ZCK_TRY(add_hparams(b, gi, group));
    if (r->stage <= 2) opt_of[g] = (int32_t)g;
    else ZCK_TRY(subgroups_of(b, g, group, opt_of, &next));
  }
  if (r->stage == 3 && next != n_flat)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: param_groups cover %zu sub-groups but param_shapes (%s) has %zu: the group "
                     "of the others is unknown", r->optim_path, next, r->path, n_flat);
  return ZCK_OK;
}

/* The groups and their params in group order. */
static zck_status add_groups(const build *b) {
  const zck__ds_records *r = b->r;
  int32_t *opt_of = zck__calloc(r->n_flat + 1, sizeof *opt_of);
  if (!opt_of) return ZCK_ERR_NO_MEMORY;
  zck_status s = add_groups_of(b, opt_of);
  if (s == ZCK_OK &&
      (s = zck_layout_groups_to_model(b->out->model, b->out->flat_params, b->out->flat_first, r->n_flat, opt_of,
                                      r->stage >= 1 && r->stage <= 2 && r->round_robin, r->world_size)) != ZCK_OK)
    s = zck__error_prepend(s, "%s", r->optim_path);
  free(opt_of);
  return s;
}

// ---- names

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
static bool source_saved(const build *b, const char *src) {
  if (zck__strmap_find(&b->train, src) >= 0 || zck__strmap_find(&b->frozen, src) >= 0) return true;
  int stage = b->r->stage;
  bool module_holds_frozen = stage <= 1 || (stage == 2 && !b->r->frozen_shapes);
  return module_holds_frozen && zck__strmap_find(&b->module, src) >= 0 && zck__strmap_find(&b->buffers, src) < 0 &&
         zck__strmap_find(&b->alias, src) < 0;
}

static bool same_shape(int nd_a, const int64_t *a, int nd_b, const int64_t *b) {
  if (nd_a != nd_b) return false;
  for (int i = 0; i < nd_a; i++)
    if (a[i] != b[i]) return false;
  return true;
}

/* param_shapes' names in flat order (flat_first: where each flat group starts), each once. */
static zck_status index_trainable(build *b) {
  const zck__ds_records *r = b->r;
  zck__ds_manifest *o = b->out;
  size_t nt = 0;
  for (size_t g = 0; g < r->n_flat; g++) nt += r->param_shapes[g].n;
  b->n_train = nt;
  ZCK_TRY(zck__strmap_init(&b->train, nt));
  o->flat_first = zck__calloc(r->n_flat + 1, sizeof *o->flat_first);
  o->flat_params = zck__calloc(nt + 1, sizeof *o->flat_params);
  if (!o->flat_first || !o->flat_params) return ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t g = 0; g < r->n_flat; g++) {
    o->flat_first[g] = k;
    for (size_t i = 0; i < r->param_shapes[g].n; i++, k++) {
      bool existed;
      size_t v;
      const char *name = r->param_shapes[g].v[i].name;
      ZCK_TRY(zck__strmap_put(&b->train, name, k, &existed, &v));
      if (existed) {  /* DS-23: zero_to_fp32 would silently collapse them */
        size_t g0 = 0;
        while (g0 + 1 < r->n_flat && o->flat_first[g0 + 1] <= v) g0++;
        return zck__fail(ZCK_ERR_FORMAT, "%s: parameter '%s' appears twice in param_shapes (groups %zu and %zu): one "
                         "parameter in two groups cannot be laid out", r->path, name, g0, g);
      }
    }
  }
  o->flat_first[r->n_flat] = k;
  return ZCK_OK;
}

/* The name maps of param_shapes, frozen_param_shapes, buffer_names, module and shared_params. */
static zck_status index_names(build *b) {
  const zck__ds_records *r = b->r;
  const char *path = r->path;
  bool existed;
  ZCK_TRY(index_trainable(b));
  ZCK_TRY(zck__strmap_init(&b->frozen, n_frozen(r)));
  for (size_t i = 0; i < n_frozen(r); i++) {
    const char *name = r->frozen_shapes->v[i].name;
    ZCK_TRY(zck__strmap_put(&b->frozen, name, i, &existed, NULL));
    if (existed) return zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes lists '%s' twice", path, name);
    if (zck__strmap_find(&b->train, name) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is in both param_shapes and frozen_param_shapes", path, name);
  }
  ZCK_TRY(zck__strmap_init(&b->buffers, r->n_buffers));
  for (size_t i = 0; i < r->n_buffers; i++) ZCK_TRY(zck__strmap_put(&b->buffers, r->buffer_names[i], i, &existed, NULL));
  ZCK_TRY(zck__strmap_init(&b->module, r->n_module));
  for (size_t i = 0; i < r->n_module; i++) ZCK_TRY(zck__strmap_put(&b->module, r->module[i].name, i, &existed, NULL));
  ZCK_TRY(zck__strmap_init(&b->alias, r->n_shared));
  for (size_t i = 0; i < r->n_shared; i++) {
    const char *a = r->shared_alias[i], *s = r->shared_src[i];
    ZCK_TRY(zck__strmap_put(&b->alias, a, i, &existed, NULL));
    /* DS-25 */
    if (zck__strmap_find(&b->train, a) >= 0 || zck__strmap_find(&b->frozen, a) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params alias '%s' is itself a saved parameter", path, a);
    if (!strcmp(a, s)) return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params maps '%s' to itself", path, a);
  }
  for (size_t i = 0; i < r->n_shared; i++)
    if (zck__strmap_find(&b->alias, r->shared_src[i]) >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params: source '%s' of '%s' is itself an alias (chain or cycle)",
                       path, r->shared_src[i], r->shared_alias[i]);
  return ZCK_OK;
}

// ---- params

/* The shape of module entry e: param_shapes' for a trainable param (stage-3 module entries
 * are [0]-shaped placeholders), frozen_param_shapes' for a frozen one, else the entry's own;
 * *frozen when it is a frozen param. ai: its shared_params index, or -1. */
static zck_status param_shape(const build *b, const zck__ds_module_entry *e, int64_t ai, int *ndim,
                              const int64_t **shape, bool *frozen) {
  const zck__ds_records *r = b->r;
  const char *path = r->path, *name = e->name;
  int stage = r->stage;
  const char *shape_of = ai >= 0 ? r->shared_src[ai] : name;   /* an alias has its source's shape */
  char x[96], y[96];
  int64_t k;
  *ndim = e->ndim;
  *shape = e->shape;
  *frozen = false;
  if ((k = zck__strmap_find(&b->train, shape_of)) >= 0) {
    size_t g = 0;
    while (b->out->flat_first[g + 1] <= (size_t)k) g++;
    const zck__ds_named_shape *ps = &r->param_shapes[g].v[k - (int64_t)b->out->flat_first[g]];
    if (stage <= 2 && !same_shape(e->ndim, e->shape, ps->ndim, ps->shape))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: module['%s'] has shape %s but param_shapes[%zu] says %s", path, name,
                       zck_shape_str(e->ndim, e->shape, x, sizeof x), g, zck_shape_str(ps->ndim, ps->shape, y, sizeof y));
    if (stage == 3 && ai < 0 && e->numel != 0)  /* DS-27 */
      ZCK_TRY(warning(b, "%s: module['%s'] is not a [0]-shaped placeholder; DeepSpeed's strict load would fail", path, name));
    *shape = ps->shape;
    *ndim = ps->ndim;
  } else if ((k = zck__strmap_find(&b->frozen, shape_of)) >= 0) {
    const zck__ds_named_shape *fs = &r->frozen_shapes->v[k];
    if (stage <= 2 && !same_shape(e->ndim, e->shape, fs->ndim, fs->shape))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: module['%s'] has shape %s but frozen_param_shapes says %s", path, name,
                       zck_shape_str(e->ndim, e->shape, x, sizeof x), zck_shape_str(fs->ndim, fs->shape, y, sizeof y));
    *shape = fs->shape;
    *ndim = fs->ndim;
    *frozen = true;
  } else if (stage <= 2 && (stage == 1 || !r->frozen_shapes)) {
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
static zck_status add_module_entries(build *b) {
  const zck__ds_records *r = b->r;
  zck__ds_manifest *o = b->out;
  for (size_t i = 0; i < r->n_module; i++) {
    const zck__ds_module_entry *e = &r->module[i];
    uint32_t idx;
    if (zck__strmap_find(&b->buffers, e->name) >= 0) {
      ZCK_TRY_CTX(zck_model_add_buffer(o->model, e->name, e->ndim, e->shape, e->dtype, &idx), "%s", r->path);
      o->buffer_mod[idx] = (int64_t)i;
      continue;
    }
    int64_t ai = zck__strmap_find(&b->alias, e->name), k;
    if (ai >= 0 && !source_saved(b, r->shared_src[ai])) continue;  /* unsaved source: add_ties keeps it aside */
    int ndim;
    const int64_t *shape;
    bool frozen;
    ZCK_TRY(param_shape(b, e, ai, &ndim, &shape, &frozen));
    ZCK_TRY_CTX(zck_model_add_param(o->model, e->name, ndim, shape, e->dtype, &idx), "%s", r->path);
    o->param_mod[idx] = (int64_t)i;
    if (ai >= 0) b->alias_param[ai] = idx;
    else if ((k = zck__strmap_find(&b->train, e->name)) >= 0) b->train_param[k] = idx;
    else if ((k = zck__strmap_find(&b->frozen, e->name)) >= 0) b->frozen_param[k] = idx;
    if (frozen && ai < 0) zck_model_set_frozen(o->model, idx, true);
  }
  return ZCK_OK;
}

/* Every name of param_shapes and frozen_param_shapes is a module entry; the flat groups'
 * params in their order. */
static zck_status check_listed(const build *b) {
  const zck__ds_records *r = b->r;
  for (size_t g = 0, k = 0; g < r->n_flat; g++)
    for (size_t i = 0; i < r->param_shapes[g].n; i++, k++) {
      if (b->train_param[k] < 0)
        return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes[%zu] names '%s', which is not in module", r->path, g,
                         r->param_shapes[g].v[i].name);
      b->out->flat_params[k] = (uint32_t)b->train_param[k];
    }
  for (size_t i = 0; i < n_frozen(r); i++)
    if (b->frozen_param[i] < 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes names '%s', which is not in module", r->path,
                       r->frozen_shapes->v[i].name);
  return ZCK_OK;
}

/* shared_params: each alias tied to its source, or (an unsaved source) kept aside. */
static zck_status add_ties(const build *b) {
  const zck__ds_records *r = b->r;
  zck__ds_manifest *o = b->out;
  zck_model *m = o->model;
  o->unsaved_ties = zck__calloc(r->n_shared + 1, sizeof *o->unsaved_ties);
  o->unsaved_pairs = zck__calloc(2 * r->n_shared + 1, sizeof *o->unsaved_pairs);
  if (!o->unsaved_ties || !o->unsaved_pairs) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < r->n_shared; i++) {
    const char *alias = r->shared_alias[i], *src = r->shared_src[i];
    if (!source_saved(b, src)) {
      /* exclude_frozen_parameters left out a frozen tied source (PEFT's lm_head ->
       * wte): zero_to_fp32 drops the alias, ds_to_universal converts the rest. Not a
       * parameter here; kept for inspect and the outputs' metadata. */
      o->unsaved_pairs[2 * o->n_unsaved] = alias;
      o->unsaved_pairs[2 * o->n_unsaved + 1] = src;
      o->unsaved_ties[o->n_unsaved++] = i;
      continue;
    }
    if (b->alias_param[i] < 0) {
      ZCK_TRY(warning(b, "%s: shared_params alias '%s' is not in module; ignored", r->path, alias));
      continue;
    }
    int64_t si = zck_model_find_param(m, src);
    if (si < 0 || m->params[si].tied_to >= 0)  /* DS-25 */
      return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params: source '%s' of alias '%s' is not a parameter", r->path, src,
                       alias);
    ZCK_TRY(zck_model_set_tied(m, (uint32_t)b->alias_param[i], (uint32_t)si));
    zck_model_set_frozen(m, (uint32_t)b->alias_param[i], m->params[si].frozen);
  }
  return ZCK_OK;
}

// ---- the manifest

static int64_t *unset_indices(size_t n) {
  int64_t *v = zck__calloc(n + 1, sizeof *v);
  for (size_t i = 0; v && i < n; i++) v[i] = -1;
  return v;
}

zck_status zck__ds_manifest_build(const zck__ds_records *r, zck__ds_manifest *out) {
  memset(out, 0, sizeof *out);
  build b;
  memset(&b, 0, sizeof b);
  b.r = r;
  b.out = out;
  if (!(out->model = zck_model_new())) return ZCK_ERR_NO_MEMORY;
  zck_status s = index_names(&b);
  if (s == ZCK_OK) {
    out->param_mod = zck__calloc(r->n_module + 1, sizeof *out->param_mod);
    out->buffer_mod = zck__calloc(r->n_module + 1, sizeof *out->buffer_mod);
    b.train_param = unset_indices(b.n_train);
    b.frozen_param = unset_indices(n_frozen(r));
    b.alias_param = unset_indices(r->n_shared);
    if (!out->param_mod || !out->buffer_mod || !b.train_param || !b.frozen_param || !b.alias_param)
      s = ZCK_ERR_NO_MEMORY;
  }
  if (s == ZCK_OK) s = add_module_entries(&b);
  if (s == ZCK_OK) s = check_listed(&b);
  if (s == ZCK_OK) s = add_ties(&b);
  if (s == ZCK_OK) s = add_groups(&b);
  build_free(&b);
  return s;
}

// ---- the DeepSpeed reader's: rank 0's model file

static zck_status ds_warn(void *c, const char *msg) {
  return zck__ds_warn(c, "%s", msg);
}

zck_status zck__ds_build_manifest(zck_ds_ckpt *c) {
  const zck__ds_model_file *m0 = &c->models[0];
  if (m0->n_param_shapes != c->optims[0].n_flat)  /* DS-50 / DS-60 */
    return zck__fail(ZCK_ERR_MISMATCH, "%s: param_shapes has %zu groups but %s has %zu flat groups", m0->file->path,
                     m0->n_param_shapes, c->optims[0].file->name, c->optims[0].n_flat);
  zck__ds_module_entry *module = zck__calloc(m0->n_module + 1, sizeof *module);
  if (!module) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < m0->n_module; i++) {
    const zck__ds_tref *t = &m0->module_t[i];
    module[i] = (zck__ds_module_entry){m0->module_names[i], t->dtype, t->ndim, t->shape, t->numel};
  }
  zck__ds_records r = {
    .path = m0->file->path, .optim_path = c->optims[0].file->path,
    .stage = c->info.stage, .round_robin = c->info.round_robin, .world_size = c->info.world_size,
    .param_shapes = m0->param_shapes, .n_flat = m0->n_param_shapes,
    .frozen_shapes = m0->has_frozen_shapes ? &m0->frozen_shapes : NULL,
    .buffer_names = (const char *const *)m0->buffer_names, .n_buffers = m0->n_buffer_names,
    .module = module, .n_module = m0->n_module,
    .shared_alias = (const char *const *)m0->shared_alias, .shared_src = (const char *const *)m0->shared_src,
    .n_shared = m0->n_shared,
    .param_groups = c->param_groups,
    .warn = ds_warn, .warn_ctx = c,
  };
  zck__ds_manifest o;
  zck_status s = zck__ds_manifest_build(&r, &o);
  free(module);
  c->model = o.model;
  c->param_mod = o.param_mod;
  c->buffer_mod = o.buffer_mod;
  c->flat_params = o.flat_params;
  c->flat_first = o.flat_first;
  c->unsaved_ties = o.unsaved_ties;
  c->unsaved_pairs = o.unsaved_pairs;
  c->n_unsaved_ties = o.n_unsaved;
  return s;
}
