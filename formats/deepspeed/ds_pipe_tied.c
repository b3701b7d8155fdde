/* ds_pipe_tied.c: TiedLayerSpec weights of a PipelineModule checkpoint (one weight used by layers of several stages,
 * as a GPT's embedding is by its LM head).
 *
 * What DeepSpeed 0.19.8 writes for them (runtime/pipe/module.py; checked on the CPU, tests/fixtures/deepspeed-pipe):
 *   - every stage that uses the key builds the module once, as tied_modules.<key> (registered before the layers, so
 *     its params come first in the stage's param_shapes and flat group), and trains its own copy: the copies' grads
 *     are all-reduced between those stages (allreduce_tied_weight_gradients), so their fp32 masters and Adam state
 *     stay equal, and load_state_dir broadcasts the first stage's weights to the others (_synchronize_tied_weights);
 *   - layer_<XX>-model_states.pt holds the tied module's state_dict (keys <K>, not <XX>.<K>) for each use of the
 *     layer without a forward_fn; a use with a forward_fn writes no layer file at all. Nothing in the checkpoint says
 *     which key a layer file belongs to: its keys and shapes do.
 * zckpt keeps the weight once, under DeepSpeed's name tied_modules.<key>.<K> (what named_parameters gives, the name
 * ds_to_universal.py writes), from the first stage holding it: the copies of later stages are recorded as replicas
 * and left out of the model (their elements still count in their flat group's partition); reshard writes them from
 * the first stage's copy (jobs/reshard_pipe.c). */
#include "ds_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define ZCK__TIED_PREFIX "tied_modules."

/* "tied_modules.<key>.<K>": the key's length, 0 if name is not one */
static size_t tied_key_len(const char *name) {
  size_t n = strlen(ZCK__TIED_PREFIX);
  if (strncmp(name, ZCK__TIED_PREFIX, n)) return 0;
  const char *dot = strchr(name + n, '.');
  return dot && dot > name + n ? (size_t)(dot - name - n) : 0;
}

static zck_status add_key(struct zck__ds_pipe *p, const char *name, size_t len) {
  const char *key = name + strlen(ZCK__TIED_PREFIX);
  for (size_t i = 0; i < p->n_tied; i++)
    if (strlen(p->tied[i].key) == len && !strncmp(p->tied[i].key, key, len)) return ZCK_OK;
  if (!ZCK__GROW(p->tied, p->cap_tied, p->n_tied + 1)) return ZCK_ERR_NO_MEMORY;
  if (!(p->tied[p->n_tied].key = zck__strndup(key, len))) return ZCK_ERR_NO_MEMORY;
  p->tied[p->n_tied++].layer = -1;
  return ZCK_OK;
}

static zck_status keys_of(struct zck__ds_pipe *p, const zck__ds_model_file *mf) {
  for (size_t g = 0; g < mf->n_param_shapes; g++)
    for (size_t j = 0; j < mf->param_shapes[g].n; j++) {
      size_t len = tied_key_len(mf->param_shapes[g].v[j].name);
      if (len) ZCK_TRY(add_key(p, mf->param_shapes[g].v[j].name, len));
    }
  return ZCK_OK;
}

zck_status zck__ds_pipe_tied_keys(zck_ds_ckpt *c) {
  struct zck__ds_pipe *p = c->pipe;
  ZCK_TRY(keys_of(p, &c->models[0]));
  for (uint32_t s = 1; s < p->n_stages; s++) ZCK_TRY(keys_of(p, &p->stages[s - 1]->models[0]));
  return ZCK_OK;
}

zck_status zck__ds_pipe_layer_tied(const zck_ds_ckpt *c, const zck__strmap *shapes, const zck__ds_rankfile *lf,
                                   const char *const *keys, size_t n_keys, int64_t *tied) {
  const struct zck__ds_pipe *p = c->pipe;
  *tied = -1;
  if (!n_keys || !p->n_tied) return ZCK_OK;
  char name[1024];
  snprintf(name, sizeof name, "%u.%s", lf->rank, keys[0]);
  if (zck__strmap_find(shapes, name) >= 0) return ZCK_OK;   /* a layer of its own: "<XX>.<K>" */
  for (size_t t = 0; t < p->n_tied; t++) {
    bool all = true;
    for (size_t k = 0; all && k < n_keys; k++) {
      snprintf(name, sizeof name, ZCK__TIED_PREFIX "%s.%s", p->tied[t].key, keys[k]);
      all = zck__strmap_find(shapes, name) >= 0;
    }
    if (!all) continue;
    if (*tied >= 0)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: its keys fit the TiedLayerSpec weights of both '%s' and '%s': which "
                       "one it holds is not recorded in the checkpoint: not supported", lf->path,
                       p->tied[*tied].key, p->tied[t].key);
    *tied = (int64_t)t;
  }
  return ZCK_OK;
}

// ---- the copies of later stages

zck_status zck__ds_pipe_take_replicas(zck_ds_ckpt *c, zck_ds_ckpt *sub, uint32_t s, size_t first,
                                      const zck__strmap *earlier) {
  struct zck__ds_pipe *p = c->pipe;
  zck__ds_model_file *ms = &sub->models[0];
  for (size_t g = 0; g < ms->n_param_shapes; g++) {
    zck__ds_shape_list *l = &ms->param_shapes[g];
    size_t keep = 0;
    for (size_t j = 0; j < l->n; j++) {
      zck__ds_named_shape *ps = &l->v[j];
      if (zck__strmap_find(earlier, ps->name) < 0) {
        l->v[keep++] = *ps;
        continue;
      }
      if (!tied_key_len(ps->name))
        return zck__fail(ZCK_ERR_MISMATCH, "%s: param '%s' is also an earlier pipeline stage's, and not a TiedLayerSpec "
                         "weight (tied_modules.<key>.*): stale file from another run?", ms->file->path, ps->name);
      if (!ZCK__GROW(p->replicas, p->cap_replicas, p->n_replicas + 1)) return ZCK_ERR_NO_MEMORY;
      p->replicas[p->n_replicas++] = (zck__ds_pipe_replica){ps->name, s, first + g, j, ps->numel, 0};
    }
    l->n = keep;
  }
  return ZCK_OK;
}

static bool is_replica(const struct zck__ds_pipe *p, size_t group, const char *name, size_t *pos) {
  for (size_t i = 0; i < p->n_replicas; i++)
    if (p->replicas[i].group == group && !strcmp(p->replicas[i].name, name)) {
      if (pos) *pos = p->replicas[i].pos;
      return true;
    }
  return false;
}

/* so's flat group g is c's group first + g: its replicas' fragments and alignment paddings taken out */
zck_status zck__ds_pipe_strip_optim(const struct zck__ds_pipe *p, zck__ds_optim_file *so, size_t first) {
  if (!p->n_replicas) return ZCK_OK;
  for (size_t g = 0; g < so->n_flat; g++) {
    if (so->psm_names) {
      size_t keep = 0;
      for (size_t i = 0; i < so->n_psm[g]; i++) {
        if (is_replica(p, first + g, so->psm_names[g][i], NULL)) {
          free(so->psm_names[g][i]);
          continue;
        }
        so->psm_names[g][keep] = so->psm_names[g][i];
        so->psm_start[g][keep] = so->psm_start[g][i];
        so->psm_numel[g][keep++] = so->psm_numel[g][i];
      }
      so->n_psm[g] = keep;
    }
    if (so->has_param_paddings) {  /* one entry per param of the group, in param_shapes order */
      size_t keep = 0;
      for (size_t i = 0; i < so->n_param_paddings[g]; i++) {
        bool drop = false;
        for (size_t r = 0; r < p->n_replicas && !drop; r++)
          drop = p->replicas[r].group == first + g && p->replicas[r].pos == i;
        if (!drop) so->param_paddings[g][keep++] = so->param_paddings[g][i];
      }
      so->n_param_paddings[g] = keep;
    }
  }
  return ZCK_OK;
}

// ---- verify: the copies equal the first stage's

#define ZCK__TIED_BLOCK ((uint64_t)1 << 16)   /* elements compared at a time */

/* Elements [off, off + n) of flat group g (of partition P) as kind k (0 fp32, 1 exp_avg, 2 exp_avg_sq) holds them,
 * n not crossing a rank's partition. */
static zck_status read_flat(const zck_ds_ckpt *c, size_t g, uint64_t P, int k, uint64_t off, uint64_t n, float *out) {
  const zck__ds_optim_file *o = &c->optims[off / P];
  const zck__ds_flat *f = &o->flat[g];
  const zck__ds_tref *t = k == 0 ? &f->fp32 : k == 1 ? &f->exp_avg : &f->exp_avg_sq;
  return zck__source_read(f->src ? f->src : &o->src, out, n * 4, t->offset + (off % P) * 4);
}

static uint32_t stage_of_group(const struct zck__ds_pipe *p, size_t g) {
  uint32_t s = 0;
  while (s + 1 < p->n_stages && p->first_group[s + 1] <= g) s++;
  return s;
}

static zck_status check_replica(const zck_ds_ckpt *c, const zck__ds_pipe_replica *r, float *a, float *b) {
  const zck_layout *L = c->train_layout;
  int64_t p = zck_model_find_param(c->model, r->name);
  ZCK_ASSERT(p >= 0);
  uint64_t Pr = L->groups[r->group].partition;
  int kinds = c->info.has_optimizer_state && c->info.state_dtype == ZCK_F32 ? 3 : 1;
  static const char *what[] = {"fp32 master", "exp_avg", "exp_avg_sq"};
  for (size_t q = L->param_first[p]; q < L->param_first[p + 1]; q++) {
    const zck_piece *pc = &L->pieces[q];   /* ZeRO-1: contiguous in its store */
    const zck_layout_store *st = &L->stores[pc->store];
    uint64_t Po = L->groups[st->group].partition;
    for (uint64_t done = 0; done < pc->count;) {
      uint64_t e = pc->param_off + done, at = r->offset + e, n = pc->count - done;
      if (n > ZCK__TIED_BLOCK) n = ZCK__TIED_BLOCK;
      if (n > Pr - at % Pr) n = Pr - at % Pr;   /* the replica's rank boundary */
      for (int k = 0; k < kinds; k++) {
        ZCK_TRY(read_flat(c, (size_t)st->group, Po, k, (uint64_t)st->rank * Po + pc->store_off + done, n, a));
        ZCK_TRY(read_flat(c, r->group, Pr, k, at, n, b));
        for (uint64_t i = 0; i < n; i++)
          if (memcmp(&a[i], &b[i], 4)) {
            const zck__ds_optim_file *o = &c->optims[(at + i) / Pr];
            const zck__ds_flat *f = &o->flat[r->group];
            return zck__fail(ZCK_ERR_DAMAGED, "%s: element %llu of '%s' (its copy in pipeline stage %u) is not stage "
                             "%u's %s: DeepSpeed keeps a TiedLayerSpec weight's copies equal: a stage file of another "
                             "save?", f->path ? f->path : o->file->path, (unsigned long long)(e + i), r->name, r->stage,
                             stage_of_group(c->pipe, (size_t)st->group), what[k]);
          }
      }
      done += n;
    }
  }
  return ZCK_OK;
}

zck_status zck__ds_pipe_check_replicas(const zck_ds_ckpt *c) {
  const struct zck__ds_pipe *p = c->pipe;
  if (!p || !p->n_replicas || c->info.master_dtype != ZCK_F32 || !c->train_layout) return ZCK_OK;
  float *a = zck__calloc(ZCK__TIED_BLOCK, sizeof *a), *b = zck__calloc(ZCK__TIED_BLOCK, sizeof *b);
  zck_status s = a && b ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t r = 0; s == ZCK_OK && r < p->n_replicas; r++) s = check_replica(c, &p->replicas[r], a, b);
  free(a);
  free(b);
  return s;
}

// ---- the training layout

zck_status zck__ds_pipe_train(zck_ds_ckpt *c, size_t n_params, const uint64_t *numels, const zck_group_spec *specs,
                              size_t n_flat, uint32_t w, uint32_t param_align, zck_layout **out) {
  struct zck__ds_pipe *p = c->pipe;
  *out = NULL;
  size_t nx = n_params + p->n_replicas, total = 0;
  for (size_t g = 0; g < n_flat; g++) total += specs[g].n_params;
  uint64_t *xnum = zck__calloc(nx + 1, sizeof *xnum);
  uint32_t *xpar = zck__calloc(total + p->n_replicas + 1, sizeof *xpar);
  zck_group_spec *xs = zck__calloc(n_flat + 1, sizeof *xs);
  zck_layout *base = NULL, *l = NULL;
  zck_piece *pieces = NULL;
  zck_status s = xnum && xpar && xs ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) {
    memcpy(xnum, numels, n_params * sizeof *xnum);
    size_t k = 0;
    for (size_t g = 0; g < n_flat; g++) {   /* each group's params with its replicas back in their places */
      xs[g] = specs[g];
      xs[g].params = xpar + k;
      size_t i = 0, n = specs[g].n_params, slots = n;
      for (size_t q = 0; q < p->n_replicas; q++) slots += p->replicas[q].group == g;
      for (size_t pos = 0; pos < slots; pos++) {
        size_t r = p->n_replicas;
        for (size_t q = 0; q < p->n_replicas && r == p->n_replicas; q++)
          if (p->replicas[q].group == g && p->replicas[q].pos == pos) r = q;
        if (r < p->n_replicas) {
          xnum[n_params + r] = p->replicas[r].numel;
          xpar[k++] = (uint32_t)(n_params + r);
        } else {
          ZCK_ASSERT(i < n);   /* take_replicas recorded each replica's place among the group's params */
          xpar[k++] = specs[g].params[i++];
        }
      }
      xs[g].n_params = slots;
    }
    s = zck_layout_zero12(nx, xnum, xs, n_flat, w, param_align, &base);
  }
  if (s == ZCK_OK && !(pieces = zck__calloc(base->n_pieces + 1, sizeof *pieces))) s = ZCK_ERR_NO_MEMORY;
  size_t np = 0;
  if (s == ZCK_OK) {
    for (size_t i = 0; i < base->n_pieces; i++)
      if (base->pieces[i].param < n_params) pieces[np++] = base->pieces[i];
    s = zck_layout_custom(n_params, numels, base->stores, base->n_stores, pieces, np, &l);
  }
  if (s == ZCK_OK) {  /* the groups, for build_train's checks: their geometry counts the replicas */
    l->kind = base->kind;
    l->world = w;
    if (!(l->groups = zck__calloc(n_flat + 1, sizeof *l->groups))) s = ZCK_ERR_NO_MEMORY;
    for (size_t g = 0; s == ZCK_OK && g < n_flat; g++) {
      const zck_layout_group *from = &base->groups[g];
      for (size_t i = 0; i < from->n_params; i++)   /* where each replica lies in its flat group (verify reads it) */
        if (from->params[i] >= n_params) p->replicas[from->params[i] - n_params].offset = from->offsets[i];
      zck_layout_group *to = &l->groups[g];
      *to = *from;
      size_t n = from->n_params ? from->n_params : 1;
      to->params = zck__malloc(n * sizeof *to->params);
      to->offsets = zck__calloc(n, sizeof *to->offsets);
      l->n_groups = g + 1;
      if (!to->params || !to->offsets) { s = ZCK_ERR_NO_MEMORY; break; }
      to->n_params = 0;
      for (size_t i = 0; i < from->n_params; i++) {
        if (from->params[i] >= n_params) continue;
        to->params[to->n_params] = from->params[i];
        to->offsets[to->n_params++] = from->offsets[i];
      }
    }
  }
  free(pieces);
  free(xnum);
  free(xpar);
  free(xs);
  zck_layout_free(base);
  if (s != ZCK_OK) { zck_layout_free(l); return s; }
  *out = l;
  return ZCK_OK;
}
