/* ds_moe_ep.c: deepspeed.moe.layer.MoE with expert parallelism (ep_size E > 1) at ZeRO-1/2, read as one model.
 *
 * What DeepSpeed 0.19.8 saves (runtime/engine.py _save_moe_checkpoint, zero/stage_1_and_2.py state_dict), with W
 * ranks in its default order (utils/groups.py _create_expert_and_data_parallel: rank r is EP rank e = r % E and
 * expert-data-parallel rank d = r / E, D = W / E):
 *   - each MoE layer keeps num_experts / E local experts per EP rank, named by their local id
 *     (<m>.deepspeed_moe.experts.deepspeed_experts.<l>); EP rank e's local expert l is global expert e * local + l;
 *   - the experts form one optimizer group ('ep_size_<E>', 'moe': True) whose flat holds EP rank e's local experts
 *     and is partitioned over its D expert-data-parallel ranks: partition_count lists D for it, W for the others;
 *     rank r's file holds partition d of EP rank e's flat, its param_slice_mappings under the local names;
 *   - mp_rank_00_model_states.pt (rank 0's) has param_shapes of EP rank 0's experts only (local names = global
 *     ids 0 .. local - 1), num_experts [per layer], `module` without the experts;
 *   - layer_<L>_expert_<G>_mp_rank_00_model_states.pt per global expert G, written by the ranks of edp rank 0,
 *     under the global names.
 * Read here by rewriting those records into the ep_size 1 shape before the manifest is built: the experts'
 * param_shapes group lists every global expert (per layer, EP rank 0's then 1's ..., which is the module order of
 * the same model at ep_size 1), each rank's param_slice_mappings name its global experts, and the layout
 * (zck__ds_moe_layout) puts EP rank e's local flat, partitioned over its D ranks, at its global experts. The output
 * is then the model the ep_size 1 run trains, under the same names. ds_to_universal.py fails on this layout (it
 * merges two ranks' different experts, both named deepspeed_experts.0, as fragments of one param): to-universal
 * refuses it by name (zck_ds_moe_ep_refuse). */
#include "ds_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MOE_EXPERTS ".deepspeed_experts."

void zck__ds_moe_free(struct zck__ds_moe *m) {
  if (!m) return;
  free(m->pos);
  free(m);
}

/* The layer prefix of an expert name ("<m>.deepspeed_moe.experts.deepspeed_experts."), its length; 0: none. */
static size_t prefix_len(const char *name) {
  const char *p = strstr(name, MOE_EXPERTS);
  return p ? (size_t)(p - name) + sizeof MOE_EXPERTS - 1 : 0;
}

char *zck__ds_moe_renamed(const char *name, long delta) {
  size_t pl = prefix_len(name);
  char *end;
  long id = strtol(name + pl, &end, 10);
  return zck__sprintf("%.*s%ld%s", (int)pl, name, id + delta, end);
}

/* One MoE layer's run of entries in the experts' param_shapes group. */
typedef struct run {
  size_t first, n;     /* entries [first, first + n) */
  long local;          /* experts per EP rank */
} run;

/* The runs of the experts' group, one per MoE layer (module order), each checked against num_experts. */
static zck_status layer_runs(const zck_ds_ckpt *c, const zck__ds_shape_list *l, uint32_t E, run **out, size_t *n_out) {
  const char *path = c->models[0].file->path;
  const zck_pk *ne = zck_pk_dict_get(zck_torch_root(c->model0), "num_experts");
  if (!ne || ne->kind != ZCK_PK_LIST)
    return zck__fail(ZCK_ERR_FORMAT, "%s: num_experts is not a list of expert counts (needed for ep_size %u)", path, E);
  run *r = zck__calloc(l->n + 1, sizeof *r);
  if (!r) return ZCK_ERR_NO_MEMORY;
  size_t n = 0;
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < l->n && s == ZCK_OK; i++) {
    const char *name = l->v[i].name;
    size_t pl = prefix_len(name);
    long id = zck__ds_moe_expert_id(name);
    if (!pl || id < 0) {
      s = zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes holds '%s' in the experts' group (partitioned over %u of the %u "
                    "ranks)", path, name, c->info.world_size / E, c->info.world_size);
      break;
    }
    if (!n || strncmp(l->v[r[n - 1].first].name, name, pl) || prefix_len(l->v[r[n - 1].first].name) != pl) {
      for (size_t k = 0; k < n && s == ZCK_OK; k++)
        if (prefix_len(l->v[r[k].first].name) == pl && !strncmp(l->v[r[k].first].name, name, pl))
          s = zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes lists the experts of '%.*s' in two places", path, (int)pl,
                        name);
      r[n++] = (run){i, 0, 0};
    }
    r[n - 1].n++;
    if (id + 1 > r[n - 1].local) r[n - 1].local = id + 1;
  }
  if (s == ZCK_OK && n != ne->u.seq.len)
    s = zck__fail(ZCK_ERR_FORMAT, "%s: num_experts lists %zu MoE layers; param_shapes has the experts of %zu", path,
                  ne->u.seq.len, n);
  for (size_t k = 0; k < n && s == ZCK_OK; k++) {
    int64_t want;
    if (!zck_pk_as_int(ne->u.seq.items[k], &want) || want != r[k].local * (int64_t)E)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: MoE layer %zu has %ld local experts in param_shapes; num_experts[%zu] over "
                    "ep_size %u needs %lld", path, k, r[k].local, k, E, (long long)want / E);
  }
  if (s != ZCK_OK) { free(r); return s; }
  *out = r;
  *n_out = n;
  return ZCK_OK;
}

/* Rank r's param_slice_mappings of the experts' group under its global names (EP rank r % E). */
static zck_status rename_slices(zck__ds_optim_file *o, size_t g, long shift_per_local, const run *runs, size_t n_runs,
                                const zck__ds_shape_list *l) {
  for (size_t k = 0; o->psm_names && k < o->n_psm[g]; k++) {
    char *name = o->psm_names[g][k];
    size_t pl = prefix_len(name);
    const run *ru = NULL;
    for (size_t i = 0; i < n_runs && !ru; i++)
      if (prefix_len(l->v[runs[i].first].name) == pl && !strncmp(l->v[runs[i].first].name, name, pl)) ru = &runs[i];
    if (!pl || !ru)
      return zck__fail(ZCK_ERR_FORMAT, "%s: param_slice_mappings[%zu] names '%s', not an expert of the MoE layers in "
                       "param_shapes", o->file->path, g, name);
    char *to = zck__ds_moe_renamed(name, shift_per_local * ru->local);
    if (!to) return ZCK_ERR_NO_MEMORY;
    free(name);
    o->psm_names[g][k] = to;
  }
  return ZCK_OK;
}

zck_status zck__ds_moe_expand_ep(zck_ds_ckpt *c) {
  const uint32_t W = c->info.world_size;
  zck__ds_optim_file *o0 = &c->optims[0];
  zck__ds_model_file *m0 = &c->models[0];
  size_t eg = (size_t)-1;
  for (size_t g = 0; g < o0->n_counts; g++)
    if (o0->counts[g] != (int64_t)W) {
      if (eg != (size_t)-1)
        return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: partition_count %lld and %lld: deepspeed.moe layers of several "
                         "ep_size values are not supported", o0->file->path, (long long)o0->counts[eg],
                         (long long)o0->counts[g]);
      eg = g;
    }
  for (uint32_t r = 1; r < W; r++) {
    const zck__ds_optim_file *o = &c->optims[r];
    if (o->n_counts != o0->n_counts || memcmp(o->counts, o0->counts, o0->n_counts * sizeof *o->counts))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: partition_count differs from %s's", o->file->path, o0->file->name);
  }
  if (eg == (size_t)-1) return zck__fail(ZCK_ERR_FORMAT, "%s: no group of partition_count below %u", o0->file->path, W);
  int64_t D = o0->counts[eg];
  if (D < 1 || W % D || eg >= m0->n_param_shapes || eg >= o0->n_flat)
    return zck__fail(ZCK_ERR_FORMAT, "%s: partition_count[%zu] is %lld, not a divisor of the %u ranks", o0->file->path,
                     eg, (long long)D, W);
  const uint32_t E = W / (uint32_t)D;
  for (size_t g = 0; g < m0->n_param_shapes; g++)
    for (size_t i = 0; g != eg && i < m0->param_shapes[g].n; i++)
      if (zck__ds_moe_expert_id(m0->param_shapes[g].v[i].name) >= 0)
        return zck__fail(ZCK_ERR_FORMAT, "%s: expert '%s' in param_shapes[%zu], a group partitioned over all %u ranks "
                         "(the experts' is group %zu)", m0->file->path, m0->param_shapes[g].v[i].name, g, W, eg);
  /* parameter_alignment pads between params of a flat, which would differ between the E copies' positions */
  for (uint32_t r = 0; r < W; r++) {
    const zck__ds_optim_file *o = &c->optims[r];
    for (size_t g = 0; o->has_param_paddings && g < o->n_flat; g++)
      for (size_t i = 0; i < o->n_param_paddings[g]; i++)
        if (o->param_paddings[g][i])
          return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: deepspeed.moe with ep_size %u and parameter_alignment: not "
                           "supported", o->file->path, E);
  }
  zck__ds_shape_list *l = &m0->param_shapes[eg];
  run *runs = NULL;
  size_t n_runs = 0;
  ZCK_TRY(layer_runs(c, l, E, &runs, &n_runs));
  const size_t n_local = l->n;
  struct zck__ds_moe *mo = zck__calloc(1, sizeof *mo);
  zck__ds_named_shape *v = zck__calloc(E * n_local + 1, sizeof *v);
  uint32_t *pos = zck__calloc(E * n_local + 1, sizeof *pos);
  zck_status s = mo && v && pos ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t n = 0;
  for (size_t k = 0; k < n_runs && s == ZCK_OK; k++)
    for (uint32_t e = 0; e < E && s == ZCK_OK; e++)
      for (size_t i = runs[k].first; i < runs[k].first + runs[k].n; i++) {
        v[n] = l->v[i];
        if (!(v[n].name = zck__ds_moe_renamed(l->v[i].name, (long)e * runs[k].local))) { s = ZCK_ERR_NO_MEMORY; break; }
        pos[e * n_local + i] = (uint32_t)n++;
      }
  for (uint32_t r = 1; r < W && s == ZCK_OK; r++)  /* EP rank 0's names are already the global ones */
    if (r % E) s = rename_slices(&c->optims[r], eg, (long)(r % E), runs, n_runs, l);
  for (uint32_t r = 0; r < W && s == ZCK_OK; r++) {  /* the paddings (all 0) of the expanded group */
    zck__ds_optim_file *o = &c->optims[r];
    if (!o->has_param_paddings || eg >= o->n_flat) continue;
    int64_t *z = zck__calloc(E * n_local + 1, sizeof *z);
    if (!z) { s = ZCK_ERR_NO_MEMORY; break; }
    free(o->param_paddings[eg]);
    o->param_paddings[eg] = z;
    o->n_param_paddings[eg] = E * n_local;
  }
  if (s != ZCK_OK) {
    for (size_t i = 0; v && i < n; i++) free(v[i].name);
    free(v);
    free(pos);
    free(mo);
    free(runs);
    return s;
  }
  for (size_t i = 0; i < n_local; i++) free(l->v[i].name);
  free(l->v);
  l->v = v;
  l->n = n;
  *mo = (struct zck__ds_moe){E, (uint32_t)D, eg, n_local, pos};
  c->moe = mo;
  for (uint32_t r = 0; r < W; r++) c->optims[r].mixed_counts = false;   /* read as described above */
  free(runs);
  return ZCK_OK;
}

/* ---- the train layout */

zck_status zck__ds_moe_layout(size_t n_params, const uint64_t *numels, const zck_group_spec *specs, size_t n_flat,
                              uint32_t w, uint32_t param_align, size_t eg, uint32_t E, size_t n_local,
                              const uint32_t *pos, zck_layout **out) {
  *out = NULL;
  const uint32_t D = w / E;
  zck_layout *base = NULL, *loc = NULL, *l = NULL;
  uint32_t *lparams = zck__calloc(n_local + 1, sizeof *lparams);
  int64_t *local_of = zck__malloc((n_params + 1) * sizeof *local_of);   /* EP rank 0's param -> its local index */
  bool *in_eg = zck__calloc(n_params + 1, sizeof *in_eg);
  zck_layout_store *stores = NULL;
  zck_piece *pieces = NULL;
  zck_status s = lparams && local_of && in_eg ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; s == ZCK_OK && p < n_params; p++) local_of[p] = -1;
  for (size_t i = 0; s == ZCK_OK && i < specs[eg].n_params; i++) in_eg[specs[eg].params[i]] = true;
  for (size_t i = 0; s == ZCK_OK && i < n_local; i++) {
    lparams[i] = specs[eg].params[pos[i]];
    local_of[lparams[i]] = (int64_t)i;
  }
  zck_group_spec ls = {lparams, n_local, specs[eg].opt_group};
  if (s == ZCK_OK) s = zck_layout_zero12(n_params, numels, specs, n_flat, w, param_align, &base);
  if (s == ZCK_OK) s = zck_layout_zero12(n_params, numels, &ls, 1, D, param_align, &loc);
  if (s == ZCK_OK && (!(stores = zck__calloc(base->n_stores + 1, sizeof *stores)) ||
                      !(pieces = zck__calloc(base->n_pieces + E * loc->n_pieces + 1, sizeof *pieces))))
    s = ZCK_ERR_NO_MEMORY;
  size_t np = 0;
  if (s == ZCK_OK) {
    memcpy(stores, base->stores, base->n_stores * sizeof *stores);
    for (uint32_t d = 0; d < D; d++)
      for (uint32_t e = 0; e < E; e++) {
        zck_layout_store st = loc->stores[d];
        st.rank = (int32_t)(d * E + e);
        st.group = (int32_t)eg;
        stores[eg * w + d * E + e] = st;
      }
    for (size_t i = 0; i < base->n_pieces; i++)
      if (!in_eg[base->pieces[i].param]) pieces[np++] = base->pieces[i];
    for (uint32_t e = 0; e < E; e++)
      for (size_t i = 0; i < loc->n_pieces; i++) {
        zck_piece p = loc->pieces[i];
        uint32_t d = p.store;
        p.param = specs[eg].params[pos[e * n_local + (size_t)local_of[p.param]]];
        p.store = (uint32_t)(eg * w + d * E + e);
        pieces[np++] = p;
      }
    s = zck_layout_custom(n_params, numels, stores, base->n_stores, pieces, np, &l);
  }
  if (s == ZCK_OK) {  /* the groups, for the checks against the files: the experts' geometry is loc's (local flat) */
    l->kind = base->kind;
    l->world = w;
    if (!(l->groups = zck__calloc(n_flat + 1, sizeof *l->groups))) s = ZCK_ERR_NO_MEMORY;
    for (size_t g = 0; s == ZCK_OK && g < n_flat; g++) {
      s = zck_layout_group_dup(&l->groups[g], g == eg ? &loc->groups[0] : &base->groups[g]);
      l->groups[g].opt_group = base->groups[g].opt_group;
      l->n_groups = g + 1;
    }
  }
  free(stores);
  free(pieces);
  free(lparams);
  free(local_of);
  free(in_eg);
  zck_layout_free(base);
  zck_layout_free(loc);
  if (s != ZCK_OK) { zck_layout_free(l); return s; }
  *out = l;
  return ZCK_OK;
}

zck_status zck__ds_moe_train(const zck_ds_ckpt *c, size_t n_params, const uint64_t *numels, const zck_group_spec *specs,
                             size_t n_flat, uint32_t w, uint32_t param_align, zck_layout **out) {
  const struct zck__ds_moe *m = c->moe;
  return zck__ds_moe_layout(n_params, numels, specs, n_flat, w, param_align, m->group, m->ep_size, m->n_local, m->pos,
                            out);
}

zck_status zck_ds_moe_ep_refuse(const zck_ds_ckpt *c, const char *job) {
  if (!c || !c->moe) return ZCK_OK;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: deepspeed.moe with expert parallelism (ep_size %u > 1): %s is not "
                   "supported (DeepSpeed's ds_to_universal.py fails on it too)", c->info.dir, c->moe->ep_size, job);
}

zck_status zck_ds_moe_keep_ep(const zck_ds_ckpt *c, uint32_t ep_size) {
  if (!c || !c->legacy_moe || !ep_size) return ZCK_OK;
  uint32_t have = c->moe ? c->moe->ep_size : 1;
  if (ep_size == have) return ZCK_OK;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: deepspeed.moe at ep_size %u: reshard keeps the EP size (--to-ep-size %u "
                   "is not supported)", c->info.dir, have, ep_size);
}
