/* uv_pipe.c: a universal folder made from a DeepSpeed PipelineModule checkpoint, by ds_to_universal.py 0.19.8 or
 * `zckpt to-universal` (the same files).
 *
 * The folder carries the source's mp_rank_<stage>_model_states.pt, one per pipeline stage (`module` None,
 * mp_world_size = checkpoint_parallel_dimensions['pp_degree'] = P, that stage's param_shapes), and zero/<name>/ for
 * every param of every stage; not the layer files: ds_to_universal.py skips a model file whose module is None, and
 * DeepSpeed's universal load takes every weight from zero/. zero/optimizer_state.pt holds stage 0's param_groups
 * (_save_optimizer_state reads the first optimizer file); DeepSpeed's universal load gives them to every stage.
 * Read here as the DeepSpeed reader reads the pipeline itself (ds_pipe.c): stage s's flat groups appended after
 * those of the stages before it, each with stage 0's group of its index, and the params under their names "XX.K"
 * (XX the layer index) in param_shapes order, which is module order, the dtype the run's config gives. Frozen
 * params and buffers lived in the layer files only: a stage naming some is refused. A TiedLayerSpec weight is read once
 * (merge_stages). */
#include "uv_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strmap.h"

struct zck__uv_pipe {
  zck_torch_file **stages;   /* [n_stages - 1]: mp_rank_01.. */
  uint32_t n_stages;
  zck_pk_doc *doc;           /* the merged param_shapes and param_groups lists */
};

void zck__uv_pipe_free(struct zck__uv_pipe *p) {
  if (!p) return;
  for (uint32_t s = 1; s < p->n_stages; s++) zck_torch_close(p->stages[s - 1]);
  free(p->stages);
  zck_pk_doc_free(p->doc);
  free(p);
}

static bool is_empty(const zck_pk *v) {
  return !v || v->kind == ZCK_PK_NONE || ((v->kind == ZCK_PK_LIST || v->kind == ZCK_PK_TUPLE) && !v->u.seq.len) ||
         (v->kind == ZCK_PK_DICT && !v->u.dict.len);
}

/* A stage's model file agrees with stage 0's and holds what the folder can read. */
static zck_status check_stage(const zck_pk *r0, const zck_pk *r, const char *path) {
  const zck_pk *mod = zck_pk_dict_get(r, "module");
  if (!mod || mod->kind != ZCK_PK_NONE)
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'module' is not None: not a PipelineModule stage's model file", path);
  static const char *same[] = {"dp_world_size", "mp_world_size", "global_steps", "skipped_steps"};
  for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
    int64_t a, b;
    if (!zck_pk_as_int(zck_pk_dict_get(r, same[i]), &b) || !zck_pk_as_int(zck_pk_dict_get(r0, same[i]), &a) || a != b)
      return zck__fail(ZCK_ERR_MISMATCH, "%s: '%s' differs from stage 0's (another run or save)", path, same[i]);
  }
  if (!is_empty(zck_pk_dict_get(r, "buffer_names")) || !is_empty(zck_pk_dict_get(r, "frozen_param_shapes")))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule stage with buffers or frozen params: their values were "
                     "in the layer files, which a universal folder does not carry (read the pipeline checkpoint itself)",
                     path);
  if (!is_empty(zck_pk_dict_get(r, "shared_params")))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule stage with shared params: not supported", path);
  const zck_pk *ps = zck_pk_dict_get(r, "param_shapes");
  if (!ps || ps->kind != ZCK_PK_LIST)
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'param_shapes' missing or not a list of dicts", path);
  return ZCK_OK;
}

/* The run's 16-bit dtype (the layer files' dtype, which the folder does not carry). */
static zck_dtype module_dtype(const zck_pk *root) {
  const zck_pk *cfg = zck_pk_dict_get(root, "ds_config");
  static const struct { const char *key; zck_dtype dt; } lp[] = {{"bf16", ZCK_BF16}, {"bfloat16", ZCK_BF16}, {"fp16", ZCK_F16}};
  for (size_t i = 0; cfg && cfg->kind == ZCK_PK_DICT && i < sizeof lp / sizeof *lp; i++) {
    const zck_pk *e = zck_pk_dict_get(zck_pk_dict_get(cfg, lp[i].key), "enabled");
    if (e && e->kind == ZCK_PK_BOOL && e->u.b) return lp[i].dt;
  }
  return ZCK_F32;
}

/* Every stage's param_shapes and param_groups appended to shp and grp, in stage order; a later stage's copy of a
 * TiedLayerSpec weight (tied_modules.<key>.*, in the param_shapes of every stage using it) left out: zero/ holds the
 * weight once, and the pipeline reader keeps the first stage's (formats/deepspeed/ds_pipe_tied.c). */
static zck_status merge_stages(zck_uv_ckpt *c, struct zck__uv_pipe *p, const zck_pk *pg0, zck_pk *shp, zck_pk *grp,
                               zck__strmap *seen, size_t *n_names) {
  *n_names = 0;
  for (uint32_t s = 0; s < p->n_stages; s++) {
    const zck_torch_file *f = s ? p->stages[s - 1] : c->model0;
    const zck_pk *ps = zck_pk_dict_get(zck_torch_root(f), "param_shapes");
    if (ps->u.seq.len != pg0->u.seq.len)
      return zck__fail(ZCK_ERR_MISMATCH, "%s: %zu flat groups, but zero/optimizer_state.pt has %zu param_groups (stage "
                       "0's, which DeepSpeed gives every stage)", zck_torch_name(f), ps->u.seq.len, pg0->u.seq.len);
    for (size_t g = 0; g < ps->u.seq.len; g++) {
      const zck_pk *d = ps->u.seq.items[g];
      if (!d || d->kind != ZCK_PK_DICT)
        return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes[%zu] is not a dict of shapes", zck_torch_name(f), g);
      zck_pk *own = NULL;   /* d without the copies of TiedLayerSpec weights an earlier stage holds */
      for (size_t i = 0; i < d->u.dict.len; i++) {
        const char *name = zck_pk_as_str(d->u.dict.keys[i]);
        char *end = NULL;
        if (name && name[0] >= '0' && name[0] <= '9') (void)strtol(name, &end, 10);
        size_t tp_len = strlen("tied_modules.");
        bool tied = name && !strncmp(name, "tied_modules.", tp_len) && strchr(name + tp_len, '.');
        if (!tied && (!end || *end != '.'))
          return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: param '%s' is neither under a layer index nor a TiedLayerSpec "
                           "weight (tied_modules.<key>.*): not supported", zck_torch_name(f), name ? name : "?");
        bool dup = false;
        ZCK_TRY(zck__strmap_put(seen, name, 0, &dup, NULL));
        if (dup && !tied)
          return zck__fail(ZCK_ERR_MISMATCH, "%s: param '%s' is also an earlier stage's", zck_torch_name(f), name);
        if (dup && !own) {   /* the names before it, then those after it that are the stage's own */
          if (!(own = zck_pk_new_dict(p->doc, 1))) return ZCK_ERR_NO_MEMORY;
          for (size_t k = 0; k < i; k++)
            if (!zck_pk_dict_set(p->doc, own, d->u.dict.keys[k], d->u.dict.values[k])) return ZCK_ERR_NO_MEMORY;
        } else if (!dup && own && !zck_pk_dict_set(p->doc, own, d->u.dict.keys[i], d->u.dict.values[i])) {
          return ZCK_ERR_NO_MEMORY;
        }
      }
      if (own) d = own;
      *n_names += d->u.dict.len;
      if (!zck_pk_append(p->doc, shp, (zck_pk *)d) || !zck_pk_append(p->doc, grp, (zck_pk *)pg0->u.seq.items[g]))
        return ZCK_ERR_NO_MEMORY;
    }
  }
  return ZCK_OK;
}

zck_status zck__uv_pipe_open(zck_uv_ckpt *c, const zck_pk *root, const zck_pk **shapes) {
  const char *path = zck_torch_name(c->model0);
  const zck_pk *cpd = zck_pk_dict_get(root, "checkpoint_parallel_dimensions");
  int64_t pp = 0, tp = 1, mp = 0;
  if (!cpd || !zck_pk_as_int(zck_pk_dict_get(cpd, "pp_degree"), &pp) || pp < 2)
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'module' is None but checkpoint_parallel_dimensions names no pipeline "
                     "(pp_degree): not a PipelineModule stage's model file", path);
  if (zck_pk_dict_get(cpd, "tp_degree") && (!zck_pk_as_int(zck_pk_dict_get(cpd, "tp_degree"), &tp) || tp != 1))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a pipeline with tensor parallelism (tp_degree %lld): not supported", path,
                     (long long)tp);
  if (!zck_pk_as_int(zck_pk_dict_get(root, "mp_world_size"), &mp) || mp != pp || pp > 4096)
    return zck__fail(ZCK_ERR_FORMAT, "%s: mp_world_size is not pp_degree %lld", path, (long long)pp);
  struct zck__uv_pipe *p = zck__calloc(1, sizeof *p);
  if (!p) return ZCK_ERR_NO_MEMORY;
  c->pipe = p;
  if (!(p->stages = zck__calloc((size_t)pp, sizeof *p->stages)) || !(p->doc = zck_pk_doc_new())) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(check_stage(root, root, path));
  for (uint32_t s = 1; s < (uint32_t)pp; s++) {
    char *sp = zck__sprintf("%s/mp_rank_%02u_model_states.pt", c->dir, s);
    if (!sp) return ZCK_ERR_NO_MEMORY;
    FILE *f = fopen(sp, "rb");
    zck_status st = f ? ZCK_OK : zck__fail(ZCK_ERR_NOT_FOUND, "%s: missing (stage %u of the %lld of the pipeline)", sp, s,
                                           (long long)pp);
    if (f) fclose(f);
    if (st == ZCK_OK) st = zck__uv_torch_open(sp, c->topts, &p->stages[s - 1]);
    if (st == ZCK_OK) p->n_stages = s + 1;
    const zck_pk *r = st == ZCK_OK ? zck_torch_root(p->stages[s - 1]) : NULL;
    if (st == ZCK_OK && (!r || r->kind != ZCK_PK_DICT)) st = zck__fail(ZCK_ERR_FORMAT, "%s: not a model-states dict", sp);
    if (st == ZCK_OK) st = check_stage(root, r, sp);
    free(sp);
    ZCK_TRY(st);
  }
  p->n_stages = (uint32_t)pp;
  /* param_shapes and param_groups of every stage, in stage order */
  zck_pk *shp = zck_pk_new_list(p->doc), *grp = zck_pk_new_list(p->doc);
  if (!shp || !grp) return ZCK_ERR_NO_MEMORY;
  const zck_pk *pg0 = c->param_groups;
  size_t n_names = 0;
  zck__strmap seen = {0};   /* names of the stages so far (borrowed from their files) */
  zck_status st = merge_stages(c, p, pg0, shp, grp, &seen, &n_names);
  zck__strmap_free(&seen);
  ZCK_TRY(st);
  /* `module`: every param, no bytes (the weights are only in zero/) */
  zck__uv_tref *m = zck__calloc(n_names + 1, sizeof *m);
  if (!m) return ZCK_ERR_NO_MEMORY;
  free(c->module);
  c->module = m;
  c->n_module = 0;
  zck_dtype dt = module_dtype(root);
  for (size_t g = 0; g < shp->u.seq.len; g++) {
    const zck_pk *d = shp->u.seq.items[g];
    for (size_t i = 0; i < d->u.dict.len; i++) {
      zck__uv_tref *t = &m[c->n_module++];
      const zck_pk *s = d->u.dict.values[i];
      t->name = zck_pk_as_str(d->u.dict.keys[i]);
      t->dtype = dt;
      if (!s || (s->kind != ZCK_PK_TUPLE && s->kind != ZCK_PK_LIST) || s->u.seq.len > ZCK_MAX_DIMS)
        return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes['%s']: shape is not a torch.Size, tuple or list", path, t->name);
      t->ndim = (int)s->u.seq.len;
      t->numel = 1;
      for (int q = 0; q < t->ndim; q++) {
        if (!zck_pk_as_int(s->u.seq.items[q], &t->shape[q]) || t->shape[q] < 0)
          return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes['%s']: shape dimension %d is not a non-negative int", path,
                           t->name, q);
        t->numel *= (uint64_t)t->shape[q];
      }
    }
  }
  *shapes = shp;
  c->param_groups = grp;
  c->info.tp_size = 1;
  return ZCK_OK;
}

zck_status zck__uv_pipe_refuse(const zck_uv_ckpt *c, const char *job) {
  if (!c->pipe) return ZCK_OK;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a universal folder of a PipelineModule checkpoint (%u stages): %s does not "
                   "write its layout from it: the folder carries no layer files (consolidate, inspect and verify read "
                   "it; reshard the pipeline checkpoint itself)", c->dir, c->pipe->n_stages, job);
}
