/* ds_pipe.c: DeepSpeed PipelineModule checkpoints, read as one ZeRO checkpoint of the whole model.
 *
 * What DeepSpeed 0.19.8 writes for a pipeline of P stages (runtime/pipe/module.py, runtime/engine.py):
 *   mp_rank_<stage>_model_states.pt    one per stage: `module` None, that stage's param_shapes,
 *                                      mp_world_size = checkpoint_parallel_dimensions['pp_degree'] = P
 *   [bf16_]zero_pp_rank_<d>_mp_rank_<stage>_optim_states.pt   the stage's ZeRO-1 shards over its dp group
 *   layer_<XX>-model_states.pt         each layer's state_dict (XX: the global layer index, {:02d}), written
 *                                      by dp rank 0 of the stage holding it (save_state_dict)
 * PipelineModule registers layer XX under the name str(XX), so key K of layer file XX is the model's
 * "XX.K": the names param_shapes gives (load_state_dir reads them back by the same rule). Every stage has
 * the same dp size and flat groups of its own, so stage s's flat groups appended after those of the stages
 * before it give the layout of one ZeRO checkpoint of the whole model: stage 0's files stay c's, the records
 * of the others are appended to c's (each flat group keeping the file it lies in), and the layer files'
 * tensors become c's module entries. ds_to_universal.py reads such a folder the same way (one zero/<name>
 * per param of every stage; optimizer_state.pt from stage 0's files).
 *
 * TiedLayerSpec weights (tied_modules.<key>.*, a copy in every stage that uses the key): ds_pipe_tied.c.
 *
 * Not read (refused by name): pipeline with tensor parallelism (layer_XX-model_YY-model_states.pt, refused in
 * ds_files.c), and ZeRO-0 pipelines (no optimizer shards). */
#include "ds_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"


void zck__ds_pipe_free(struct zck__ds_pipe *p) {
  if (!p) return;
  for (uint32_t s = 1; s < p->n_stages; s++) zck_ds_close(p->stages[s - 1]);
  free(p->stages);
  free(p->first_group);
  for (size_t i = 0; i < p->n_layers; i++)
    if (p->layer_open[i]) zck__source_close(&p->layer_src[i]);
  free(p->layer_src);
  free(p->layer_open);
  zck_pk_doc_free(p->doc);
  for (size_t i = 0; i < p->n_replicas; i++) free(p->replicas[i].name);
  free(p->replicas);
  for (size_t i = 0; i < p->n_tied; i++) free(p->tied[i].key);
  free(p->tied);
  free(p);
}

size_t zck__ds_pipe_model_files(const zck_ds_ckpt *c) { return c->pipe ? c->pipe->n_stages - 1 : 0; }

const zck__ds_rankfile *zck__ds_pipe_model_file(const zck_ds_ckpt *c, size_t i) {
  return &c->pipe->stages[i]->fs.model;
}

const zck_torch_file *zck_ds_stage_optim(const zck_ds_ckpt *c, uint32_t stage, size_t *first_group) {
  *first_group = 0;
  if (!stage) return c->optim0;
  if (!c->pipe || stage >= c->pipe->n_stages) return NULL;
  *first_group = c->pipe->first_group[stage];
  return c->pipe->stages[stage - 1]->optim0;
}

uint32_t zck_ds_pipe_stages(const zck_ds_ckpt *c) { return c->pipe ? c->pipe->n_stages : 1; }

zck_status zck_ds_pipe_refuse(const zck_ds_ckpt *c, const char *job) {
  if (!c || !c->pipe) return ZCK_OK;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule checkpoint (%u stages, layer_<XX>-model_states.pt): %s does "
                   "not write its layout yet (consolidate, to-universal, inspect and verify read it)", c->info.dir,
                   c->pipe->n_stages, job);
}

size_t zck_ds_pipe_layer_files(const zck_ds_ckpt *c) { return c->pipe ? c->fs.n_layers : 0; }

const char *zck_ds_pipe_layer_file(const zck_ds_ckpt *c, size_t i) { return c->fs.layers[i].path; }

/* The params of stage s: those of param_shapes[first_group[s] .. first_group[s + 1]) (merge_shapes appended each
 * stage's groups in stage order, and the model lists param_shapes' params in that order), after the copies of
 * TiedLayerSpec weights an earlier stage holds (tied_modules are registered before the layers). */
zck_status zck_ds_pipe_stage_model(const zck_ds_ckpt *c, uint32_t s, zck_model **out, uint32_t **src_of) {
  *out = NULL;
  *src_of = NULL;
  const struct zck__ds_pipe *p = c->pipe;
  const zck_model *m = c->model;
  const zck__ds_model_file *m0 = &c->models[0];
  ZCK_ASSERT(p && s < p->n_stages);
  size_t g0 = p->first_group[s], g1 = s + 1 < p->n_stages ? p->first_group[s + 1] : m0->n_param_shapes;
  int64_t lo = -1, hi = -1;
  for (size_t g = g0; g < g1; g++)
    for (size_t j = 0; j < m0->param_shapes[g].n; j++) {
      int64_t i = zck_model_find_param(m, m0->param_shapes[g].v[j].name);
      if (i < 0 || (hi >= 0 && i != hi))
        return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: pipeline stage %u's param '%s' is not where its stage's params are "
                         "in the model: reshard does not write it", c->info.dir, s, m0->param_shapes[g].v[j].name);
      if (lo < 0) lo = i;
      hi = i + 1;
    }
  if (lo < 0) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: pipeline stage %u has no params of its own", c->info.dir, s);
  size_t nr = 0;
  for (size_t r = 0; r < p->n_replicas; r++) nr += p->replicas[r].stage == s;
  size_t n = nr + (size_t)(hi - lo);
  uint32_t *src = zck__calloc(n + 1, sizeof *src);
  int64_t *local = zck__calloc(m->n_params + 1, sizeof *local);   /* source param -> stage param, -1 */
  zck_model *sm = zck_model_new();
  zck_status st = src && local && sm ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < m->n_params; i++) local[i] = -1;
  size_t k = 0;
  for (size_t r = 0; st == ZCK_OK && r < p->n_replicas; r++) {
    if (p->replicas[r].stage != s) continue;
    int64_t i = zck_model_find_param(m, p->replicas[r].name);
    ZCK_ASSERT(i >= 0);   /* an earlier stage's param of that name */
    local[i] = (int64_t)k;
    src[k++] = (uint32_t)i;
  }
  for (int64_t i = lo; st == ZCK_OK && i < hi; i++) {
    local[i] = (int64_t)k;
    src[k++] = (uint32_t)i;
  }
  for (size_t j = 0; st == ZCK_OK && j < n; j++) {
    const zck_param *pp = &m->params[src[j]];
    if (pp->tied_to >= 0 || pp->frozen)
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: '%s' is a %s param of a pipeline stage: reshard does not write it",
                     c->info.dir, pp->name, pp->frozen ? "frozen" : "tied");
    else
      st = zck_model_add_param(sm, pp->name, pp->ndim, pp->shape, pp->dtype, NULL);
  }
  /* the stage's optimizer groups: those of its own params (a stage's optimizer is its own), each replica put back at
   * its place in the group it lay in (the group of the flat group's other params) */
  for (size_t g = 0; st == ZCK_OK && g < m->n_groups; g++) {
    const zck_param_group *pg = &m->groups[g];
    size_t in = 0;
    for (size_t q = 0; q < pg->n_params; q++) in += (int64_t)pg->params[q] >= lo && (int64_t)pg->params[q] < hi;
    if (!in) continue;
    if (in != pg->n_params) {
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: optimizer group %zu spans pipeline stages", c->info.dir, g);
      break;
    }
    uint32_t ng;
    st = zck_model_add_group(sm, &ng);
    if (st == ZCK_OK) st = zck_model_group_copy_settings(sm, ng, pg);
    size_t q = 0, pos = 0;
    while (st == ZCK_OK && (q < pg->n_params || pos < pg->n_params + nr)) {
      size_t r = p->n_replicas;
      for (size_t x = 0; x < p->n_replicas && r == p->n_replicas; x++) {
        const zck__ds_pipe_replica *rp = &p->replicas[x];
        size_t f = rp->group;   /* the model group of its flat group: that of the flat group's first param */
        bool here = rp->stage == s && rp->pos == pos && c->flat_first[f] < c->flat_first[f + 1] &&
                    m->params[c->flat_params[c->flat_first[f]]].group == (int32_t)g;
        if (here) r = x;
      }
      if (r < p->n_replicas) {
        st = zck_model_group_add_param(sm, ng, (uint32_t)local[zck_model_find_param(m, p->replicas[r].name)]);
      } else if (q < pg->n_params) {
        st = zck_model_group_add_param(sm, ng, (uint32_t)local[pg->params[q++]]);
      } else {
        break;
      }
      pos++;
    }
  }
  for (size_t j = 0; st == ZCK_OK && j < n; j++)
    if (sm->params[j].group < 0)
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: '%s' is alone in its flat group of pipeline stage %u: reshard does not "
                     "write it", c->info.dir, sm->params[j].name, s);
  free(local);
  if (st != ZCK_OK) {
    zck_model_free(sm);
    free(src);
    return st;
  }
  *out = sm;
  *src_of = src;
  return ZCK_OK;
}

// ---- the stages

/* A stage's files agree with stage 0's: the same run, step and dp group. */
static zck_status check_stage(const zck_ds_ckpt *c, const zck_ds_ckpt *sub, uint32_t s) {
  const zck__ds_model_file *m0 = &c->models[0], *ms = &sub->models[0];
  const char *p = ms->file->path;
  if (sub->zero0)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule stage without ZeRO optimizer files: not supported", p);
  if (ms->n_module)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: 'module' is not None, but %s is a PipelineModule stage's: stale file from "
                     "another run?", p, m0->file->name);
  if (sub->info.stage != c->info.stage || sub->info.bf16_optimizer != c->info.bf16_optimizer ||
      sub->fs.prefix != c->fs.prefix)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: pipeline stage %u was saved at another ZeRO stage or precision than stage 0 "
                     "(%s): stale files from another run?", sub->optims[0].file->path, s, c->optims[0].file->name);
  if (sub->info.world_size != c->info.world_size)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: pipeline stage %u has %u data-parallel ranks but stage 0 has %u",
                     sub->optims[0].file->path, s, sub->info.world_size, c->info.world_size);
  if (ms->global_steps != m0->global_steps || ms->skipped_steps != m0->skipped_steps)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: global_steps %lld (skipped %lld) but %s has %lld (skipped %lld): a stage "
                     "from another step or run", p, (long long)ms->global_steps, (long long)ms->skipped_steps,
                     m0->file->name, (long long)m0->global_steps, (long long)m0->skipped_steps);
  if (ms->n_shared || ms->has_frozen_frags)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a pipeline stage with shared or frozen-fragment params: not supported", p);
  if (!sub->param_groups != !c->param_groups)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: %s optimizer param_groups but stage 0 %s", sub->optims[0].file->path,
                     sub->param_groups ? "has" : "lacks", c->param_groups ? "has them" : "does not");
  return ZCK_OK;
}

// ---- the layer files: module entries "XX.K" (a TiedLayerSpec's: "tied_modules.<key>.K")

/* The layer index a param name starts with ("12.weight" -> 12), -1: none. */
static long layer_of_name(const char *name) {
  if (name[0] < '0' || name[0] > '9') return -1;
  char *end;
  long v = strtol(name, &end, 10);
  return *end == '.' && v >= 0 && v < 1000000 ? v : -1;
}

static const zck__ds_rankfile *find_layer(const zck_ds_ckpt *c, long idx) {
  for (size_t i = 0; i < c->fs.n_layers; i++)
    if ((long)c->fs.layers[i].rank == idx) return &c->fs.layers[i];
  return NULL;
}

/* The TiedLayerSpec a name of tied_modules.<key>.* is a weight of, -1: none. */
static int64_t tied_of_name(const struct zck__ds_pipe *p, const char *name) {
  size_t n = strlen("tied_modules.");
  if (strncmp(name, "tied_modules.", n)) return -1;
  for (size_t t = 0; t < p->n_tied; t++) {
    size_t k = strlen(p->tied[t].key);
    if (!strncmp(name + n, p->tied[t].key, k) && name[n + k] == '.') return (int64_t)t;
  }
  return -1;
}

/* The layer file holding a param's weight (NULL: none). */
static const zck__ds_rankfile *layer_of_param(const zck_ds_ckpt *c, const char *name) {
  int64_t t = tied_of_name(c->pipe, name);
  if (t >= 0) return c->pipe->tied[t].layer >= 0 ? &c->fs.layers[c->pipe->tied[t].layer] : NULL;
  long idx = layer_of_name(name);
  return idx < 0 ? NULL : find_layer(c, idx);
}

/* Every param of every stage names a layer whose file is here. */
static zck_status check_names(const zck_ds_ckpt *c, const zck__ds_model_file *mf) {
  for (size_t g = 0; g < mf->n_param_shapes; g++)
    for (size_t j = 0; j < mf->param_shapes[g].n; j++) {
      const char *name = mf->param_shapes[g].v[j].name;
      long idx = layer_of_name(name);
      int64_t t = tied_of_name(c->pipe, name);
      if (t >= 0 && c->pipe->tied[t].layer < 0)
        return zck__fail(ZCK_ERR_NOT_FOUND, "%s: '%s' (TiedLayerSpec '%s') is in no layer file here: the layer file "
                         "of its use is missing, or every use has a forward_fn (DeepSpeed saves no file for those)",
                         mf->file->path, name, c->pipe->tied[t].key);
      if (t >= 0) continue;
      if (idx < 0)
        return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: param '%s' is not under a layer index: not supported",
                         mf->file->path, name);
      if (!find_layer(c, idx))
        return zck__fail(ZCK_ERR_NOT_FOUND, "%s/layer_%02ld-model_states.pt: missing: it holds '%s' of %s", c->fs.dir,
                         idx, name, mf->file->name);
    }
  return ZCK_OK;
}

static int by_rank(const void *a, const void *b) {
  uint32_t x = ((const zck__ds_rankfile *)a)->rank, y = ((const zck__ds_rankfile *)b)->rank;
  return x < y ? -1 : x > y;
}

static zck_status grow_module(zck__ds_model_file *mf, size_t *cap) {
  if (mf->n_module < *cap) return ZCK_OK;
  size_t c0 = *cap, c1 = *cap, c2 = *cap;
  if (!ZCK__GROW(mf->module_names, c0, mf->n_module + 1) || !ZCK__GROW(mf->module_t, c1, mf->n_module + 1) ||
      !ZCK__GROW(mf->module_src, c2, mf->n_module + 1) || !ZCK__GROW(mf->module_path, *cap, mf->n_module + 1))
    return ZCK_ERR_NO_MEMORY;
  return ZCK_OK;
}

/* One layer file's tensors appended to the module entries of mf, under "<XX>.<K>", or "tied_modules.<key>.<K>" when
 * its keys are a TiedLayerSpec's (the first such file of a key: a later one is another stage's module copy). */
static zck_status read_layer(zck_ds_ckpt *c, zck__ds_model_file *mf, const zck__strmap *shapes, size_t i, size_t *cap) {
  struct zck__ds_pipe *p = c->pipe;
  const zck__ds_rankfile *lf = &c->fs.layers[i];
  ZCK_TRY(zck__source_open(&p->layer_src[i], lf->path));
  p->layer_open[i] = true;
  zck_torch_file *tf = NULL;
  ZCK_TRY(zck_torch_open_source(&p->layer_src[i], &c->topts, &tf));
  zck_status s = ZCK_OK;
  /* torch.save names the archive after the file it wrote: a layer file renamed or swapped holds another's */
  const char *arch = zck_torch_prefix(tf);
  size_t stem = strlen(lf->name) - 3;
  if (arch && (strlen(arch) != stem || strncmp(arch, lf->name, stem)))
    s = zck__fail(ZCK_ERR_MISMATCH, "%s: holds '%.200s' (its archive name): a layer file renamed or swapped", lf->path,
                  arch);
  const zck_pk *root = zck_torch_root(tf);
  if (s == ZCK_OK && (!root || root->kind != ZCK_PK_DICT))
    s = zck__fail(ZCK_ERR_FORMAT, "%s: not a layer's state_dict (a dict of tensors)", lf->path);
  const char **keys = s == ZCK_OK ? zck__calloc(root->u.dict.len + 1, sizeof *keys) : NULL;
  if (s == ZCK_OK && !keys) s = ZCK_ERR_NO_MEMORY;
  for (size_t k = 0; s == ZCK_OK && k < root->u.dict.len; k++) {
    keys[k] = zck_pk_as_str(root->u.dict.keys[k]);
    if (!keys[k] || !zck_torch_tensor_of(tf, root->u.dict.values[k]))
      s = zck__fail(ZCK_ERR_FORMAT, "%s: entry %zu of the layer's state_dict is not a named tensor", lf->path, k);
  }
  int64_t tied = -1;
  if (s == ZCK_OK) s = zck__ds_pipe_layer_tied(c, shapes, lf, keys, root->u.dict.len, &tied);
  bool copy = tied >= 0 && p->tied[tied].layer >= 0;   /* a later stage's copy: its entries are not the module's */
  if (s == ZCK_OK && tied >= 0 && !copy) p->tied[tied].layer = (int64_t)i;
  for (size_t k = 0; s == ZCK_OK && !copy && k < root->u.dict.len; k++) {
    if ((s = grow_module(mf, cap)) != ZCK_OK) break;
    size_t n = mf->n_module;
    char what[300];
    snprintf(what, sizeof what, "'%.200s'", keys[k]);
    if ((s = zck__ds_tensor(tf, root->u.dict.values[k], &mf->module_t[n], what)) != ZCK_OK) break;
    mf->module_names[n] = tied >= 0 ? zck__sprintf("tied_modules.%s.%s", p->tied[tied].key, keys[k])
                                    : zck__sprintf("%u.%s", lf->rank, keys[k]);
    if (!mf->module_names[n]) { s = ZCK_ERR_NO_MEMORY; break; }
    mf->module_src[n] = &p->layer_src[i];
    mf->module_path[n] = lf->path;
    mf->n_module++;
  }
  free(keys);
  zck_torch_close(tf);
  return s;
}

/* A layer tensor has the shape its param_shapes entry gives (a swapped file of another shape names itself). */
static zck_status check_shapes(const zck_ds_ckpt *c, const zck__strmap *names, const zck__ds_model_file *mf) {
  const zck__ds_model_file *m0 = &c->models[0];
  for (size_t g = 0; g < mf->n_param_shapes; g++)
    for (size_t j = 0; j < mf->param_shapes[g].n; j++) {
      const zck__ds_named_shape *ps = &mf->param_shapes[g].v[j];
      const char *key = tied_of_name(c->pipe, ps->name) >= 0 ? ps->name : strchr(ps->name, '.') + 1;
      size_t i;
      if (!zck__strmap_get(names, ps->name, &i))
        return zck__fail(ZCK_ERR_MISMATCH, "%s: no '%s', which %s names '%s': a layer file swapped or from another run",
                         layer_of_param(c, ps->name)->path, key, mf->file->name, ps->name);
      const zck__ds_tref *t = &m0->module_t[i];
      bool same = t->ndim == ps->ndim;
      for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == ps->shape[d];
      if (!same)
        return zck__fail(ZCK_ERR_MISMATCH, "%s: '%s' has %d dims / %llu elements but %s gives '%s' %d dims / %llu: a "
                         "layer file swapped or from another run", m0->module_path[i], key, t->ndim,
                         (unsigned long long)t->numel, mf->file->name, ps->name, ps->ndim, (unsigned long long)ps->numel);
    }
  return ZCK_OK;
}

/* The names of every stage's param_shapes (borrowed). */
static zck_status all_shapes(const zck_ds_ckpt *c, zck__strmap *m) {
  const struct zck__ds_pipe *p = c->pipe;
  for (uint32_t s = 0; s < p->n_stages; s++) {
    const zck__ds_model_file *mf = s ? &p->stages[s - 1]->models[0] : &c->models[0];
    for (size_t g = 0; g < mf->n_param_shapes; g++)
      for (size_t j = 0; j < mf->param_shapes[g].n; j++) {
        bool dup;
        ZCK_TRY(zck__strmap_put(m, mf->param_shapes[g].v[j].name, 0, &dup, NULL));
      }
  }
  return ZCK_OK;
}

static zck_status read_layers(zck_ds_ckpt *c) {
  struct zck__ds_pipe *p = c->pipe;
  zck__ds_model_file *m0 = &c->models[0];
  size_t n = c->fs.n_layers;
  qsort(c->fs.layers, n, sizeof *c->fs.layers, by_rank);  /* the module's order: layer by layer */
  p->layer_src = zck__calloc(n + 1, sizeof *p->layer_src);
  p->layer_open = zck__calloc(n + 1, sizeof *p->layer_open);
  if (!p->layer_src || !p->layer_open) return ZCK_ERR_NO_MEMORY;
  p->n_layers = n;
  ZCK_TRY(zck__ds_pipe_tied_keys(c));
  zck__strmap shapes = {0};
  zck_status st = all_shapes(c, &shapes);
  size_t cap = 0;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) st = read_layer(c, m0, &shapes, i, &cap);
  zck__strmap_free(&shapes);
  ZCK_TRY(st);
  ZCK_TRY(check_names(c, m0));
  for (uint32_t s = 1; s < p->n_stages; s++) ZCK_TRY(check_names(c, &p->stages[s - 1]->models[0]));
  zck__strmap names = {0};
  st = zck__strmap_init(&names, m0->n_module);
  for (size_t i = 0; st == ZCK_OK && i < m0->n_module; i++) {
    bool dup = false;
    st = zck__strmap_put(&names, m0->module_names[i], i, &dup, NULL);
  }
  if (st == ZCK_OK) st = check_shapes(c, &names, m0);
  for (uint32_t s = 1; st == ZCK_OK && s < p->n_stages; s++) st = check_shapes(c, &names, &p->stages[s - 1]->models[0]);
  zck__strmap_free(&names);
  return st;
}

// ---- the records of stages 1.. appended to c's

/* *v (n elements) grown to hold m more and a spare one, the new ones zeroed */
#define ZCK__PIPE_GROW(v, n, m) ((void)(cap_ = (n)), ZCK__GROW((v), cap_, (n) + (m) + 1))

static zck_status merge_shapes(zck_ds_ckpt *c, zck_ds_ckpt *sub) {
  zck__ds_model_file *m0 = &c->models[0], *ms = &sub->models[0];
  size_t cap_;
  if (!ZCK__PIPE_GROW(m0->param_shapes, m0->n_param_shapes, ms->n_param_shapes)) return ZCK_ERR_NO_MEMORY;
  memcpy(m0->param_shapes + m0->n_param_shapes, ms->param_shapes, ms->n_param_shapes * sizeof *m0->param_shapes);
  m0->n_param_shapes += ms->n_param_shapes;
  ms->n_param_shapes = 0;  /* the names are m0's now */
  if (!ZCK__PIPE_GROW(m0->buffer_names, m0->n_buffer_names, ms->n_buffer_names)) return ZCK_ERR_NO_MEMORY;
  memcpy(m0->buffer_names + m0->n_buffer_names, ms->buffer_names, ms->n_buffer_names * sizeof *m0->buffer_names);
  m0->n_buffer_names += ms->n_buffer_names;
  ms->n_buffer_names = 0;
  return ZCK_OK;
}

#define ZCK__PIPE_APPEND(field, count)                                                         \
  do {                                                                                         \
    if (!ZCK__PIPE_GROW(o->field, o->count, so->count)) return ZCK_ERR_NO_MEMORY;              \
    memcpy(o->field + o->count, so->field, so->count * sizeof *o->field);                      \
  } while (0)

/* Rank r's flat groups of the stage appended after c's, each keeping its own file. */
static zck_status merge_flats(zck_ds_ckpt *c, zck_ds_ckpt *sub, uint32_t r) {
  zck__ds_optim_file *o = &c->optims[r], *so = &sub->optims[r];
  size_t cap_;
  if (o->has_param_paddings != so->has_param_paddings || !o->psm_names != !so->psm_names)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: param_alignment_paddings or param_slice_mappings present in one pipeline "
                     "stage's files and not in %s", so->file->path, o->file->name);
  ZCK_TRY(zck__ds_pipe_strip_optim(c->pipe, so, o->n_flat));
  for (size_t g = 0; g < so->n_flat; g++) {
    so->flat[g].src = &so->src;
    so->flat[g].path = so->file->path;
  }
  size_t n = so->n_flat;
  ZCK__PIPE_APPEND(flat, n_flat);
  ZCK__PIPE_APPEND(group_paddings, n_flat);
  if (o->has_param_paddings) {
    ZCK__PIPE_APPEND(param_paddings, n_flat);
    ZCK__PIPE_APPEND(n_param_paddings, n_flat);
  }
  if (o->psm_names) {
    ZCK__PIPE_APPEND(psm_names, n_flat);
    ZCK__PIPE_APPEND(psm_start, n_flat);
    ZCK__PIPE_APPEND(psm_numel, n_flat);
    ZCK__PIPE_APPEND(n_psm, n_flat);
  }
  ZCK__PIPE_APPEND(counts, n_counts);
  o->n_counts += so->n_counts;
  o->n_flat += n;
  so->n_flat = 0;  /* what the arrays point to is o's now */
  so->n_counts = 0;
  if (so->partition_count > o->partition_count) o->partition_count = so->partition_count;
  return ZCK_OK;
}

/* param_groups: stage 0's, then each later stage's (one optimizer group per flat group at ZeRO-1). */
static zck_status merge_groups(zck_ds_ckpt *c) {
  struct zck__ds_pipe *p = c->pipe;
  if (!c->param_groups) return ZCK_OK;
  if (!(p->doc = zck_pk_doc_new())) return ZCK_ERR_NO_MEMORY;
  zck_pk *list = zck_pk_new_list(p->doc);
  if (!list) return ZCK_ERR_NO_MEMORY;
  for (uint32_t s = 0; s < p->n_stages; s++) {
    const zck_pk *pg = s ? p->stages[s - 1]->param_groups : c->param_groups;
    if (!pg || pg->kind != ZCK_PK_LIST) continue;  /* read_optim_file refused that already */
    for (size_t i = 0; i < pg->u.seq.len; i++)
      if (!zck_pk_append(p->doc, list, (zck_pk *)pg->u.seq.items[i])) return ZCK_ERR_NO_MEMORY;
  }
  c->param_groups = list;
  return ZCK_OK;
}

/* The names of m0's param_shapes (borrowed), so far. */
static zck_status names_so_far(const zck__ds_model_file *m0, zck__strmap *m) {
  for (size_t g = 0; g < m0->n_param_shapes; g++)
    for (size_t j = 0; j < m0->param_shapes[g].n; j++) {
      bool dup;
      ZCK_TRY(zck__strmap_put(m, m0->param_shapes[g].v[j].name, 0, &dup, NULL));
    }
  return ZCK_OK;
}

zck_status zck__ds_pipe_prepare(zck_ds_ckpt *c, const char *path, const zck_ds_open_opts *o) {
  const zck__ds_model_file *m0 = &c->models[0];
  if (c->zero0)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule checkpoint without ZeRO optimizer files: not supported",
                     c->fs.dir);
  if (m0->n_module)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: a PipelineModule layer file beside %s, whose 'module' is not None: stale "
                     "file from another run?", c->fs.layers[0].path, m0->file->name);
  if (c->info.stage != 1 && !c->info.bf16_optimizer)  /* PipelineEngine refuses ZeRO-2 and 3 */
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule checkpoint at ZeRO stage %d: not supported",
                     c->optims[0].file->path, c->info.stage);
  uint32_t P = c->fs.n_mp;
  if (P > 4096) return zck__fail(ZCK_ERR_LIMIT, "%s: %u pipeline stages", c->fs.dir, P);
  struct zck__ds_pipe *p = zck__calloc(1, sizeof *p);
  if (!p) return ZCK_ERR_NO_MEMORY;
  c->pipe = p;
  p->n_stages = 1;
  if (!(p->stages = zck__calloc(P, sizeof *p->stages)) || !(p->first_group = zck__calloc(P, sizeof *p->first_group)))
    return ZCK_ERR_NO_MEMORY;
  for (uint32_t s = 1; s < P; s++) {
    ZCK_TRY(zck__ds_open_files(path, o, s, &p->stages[s - 1]));
    p->n_stages = s + 1;
    ZCK_TRY(check_stage(c, p->stages[s - 1], s));
  }
  ZCK_TRY(read_layers(c));
  for (uint32_t s = 1; s < P; s++) {
    zck_ds_ckpt *sub = p->stages[s - 1];
    p->first_group[s] = c->optims[0].n_flat;
    zck__strmap earlier = {0};
    zck_status st = names_so_far(&c->models[0], &earlier);
    if (st == ZCK_OK) st = zck__ds_pipe_take_replicas(c, sub, s, p->first_group[s], &earlier);
    zck__strmap_free(&earlier);
    ZCK_TRY(st);
    ZCK_TRY(merge_shapes(c, sub));
    for (uint32_t r = 0; r < c->info.world_size; r++) ZCK_TRY(merge_flats(c, sub, r));
    for (size_t i = 0; i < sub->n_warnings; i++) ZCK_TRY(zck__ds_warn(c, "%s", sub->warnings[i]));
  }
  return merge_groups(c);
}

bool zck__ds_pipe_has_replicas(const zck_ds_ckpt *c) { return c->pipe && c->pipe->n_replicas; }
