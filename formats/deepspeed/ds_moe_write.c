/* ds_moe_write.c: the deepspeed.moe parts of zck_ds_writer: a legacy DeepSpeed-MoE checkpoint (deepspeed.moe.layer.MoE)
 * written at another world size W and ZeRO stage 1 or 2 with its EP size kept, as DeepSpeed 0.19.8 saves it
 * (runtime/engine.py _save_moe_checkpoint) and loads it with load_checkpoint (load_moe_state_dict: each rank reads
 * the expert files of its local experts; each rank its own optimizer file):
 *   - ep_size 1: the experts' param group ('name': 'ep_size_1', 'moe': True, kept from the source) is partitioned
 *     over all W ranks like any group (its expert-data-parallel group is the whole world): the plain ZeRO layout;
 *   - ep_size E > 1 (W a multiple of E): the group holds EP rank e's experts on ranks d * E + e, partitioned over
 *     those W / E ranks (partition_count W / E; ds_moe_ep.c's layout, the reader's); param_shapes,
 *     param_slice_mappings and param_alignment_paddings list EP rank 0's experts, whose names are the local names
 *     every EP rank uses;
 *   - mp_rank_00_model_states.pt: `module` without the experts (_get_non_moe_state_dict), param_shapes with them
 *     (plain tuples, as that path saves them), then num_experts (the source's) and ds_autoep_layers None;
 *   - layer_<L>_expert_<E>_mp_rank_00_model_states.pt: {<name>: tensor} of global expert E of MoE layer L (L counts
 *     the MoE layers in module order), its params in module order, in the module dtype: the fp32 masters cast,
 *     which is what DeepSpeed's 16-bit copy holds after a step.
 * The file set is the source's (it does not depend on W); the target checks that it names them alike. Stage 3 is
 * refused here, another EP size by the reshard job (zck_ds_moe_keep_ep). */
#include "ds_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zck_ds_moe_target {
  uint32_t ep_size;         /* the source's (kept) */
  size_t n_params;
  int32_t *file_of;         /* [n_params]: the expert file of an expert param, else -1 */
  size_t n_files;
  int64_t *layer, *expert;  /* [n_files]: file i is layer_<layer[i]>_expert_<expert[i]> */
  const zck_pk *num_experts;  /* the source's root['num_experts'] (a list: one count per MoE layer) */
};

void zck_ds_moe_target_free(zck_ds_moe_target *t) {
  if (!t) return;
  free(t->file_of);
  free(t->layer);
  free(t->expert);
  free(t);
}

static void file_name(char *buf, size_t cap, int64_t layer, int64_t expert) {
  snprintf(buf, cap, "layer_%lld_expert_%lld_mp_rank_00_model_states.pt", (long long)layer, (long long)expert);
}

/* The MoE layer a param name belongs to: its text before ".deepspeed_experts." (one per MoE module). */
static size_t layer_len(const char *name) { return (size_t)(strstr(name, ".deepspeed_experts.") - name); }

/* Numbers the (layer, expert) files as DeepSpeed does and maps each expert param to its file. */
static zck_status map_files(const zck_ds_ckpt *c, zck_ds_moe_target *t) {
  const zck_model *m = zck_ds_model(c);
  const char *dir = c->info.dir;
  const zck_pk *ne = t->num_experts;
  size_t n_layers = ne->u.seq.len;
  size_t *first = zck__calloc(n_layers + 1, sizeof *first);       /* the first param of each layer seen */
  if (!first) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  size_t seen = 0;
  for (size_t l = 0; l < n_layers && s == ZCK_OK; l++) {
    const zck_pk *v = ne->u.seq.items[l];
    if (v->kind != ZCK_PK_INT || v->u.i < 1 || v->u.i > (1 << 20))
      s = zck__fail(ZCK_ERR_FORMAT, "%s: num_experts[%zu] is not a count of experts", c->fs.model.path, l);
    else t->n_files += (size_t)v->u.i;
  }
  if (s == ZCK_OK && (!(t->file_of = zck__malloc((m->n_params + 1) * sizeof *t->file_of)) ||
                      !(t->layer = zck__calloc(t->n_files + 1, sizeof *t->layer)) ||
                      !(t->expert = zck__calloc(t->n_files + 1, sizeof *t->expert))))
    s = ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; s == ZCK_OK && p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    long e = zck__ds_moe_expert_id(pp->name);
    t->file_of[p] = -1;
    if (e < 0) continue;
    size_t l = 0, len = layer_len(pp->name);
    while (l < seen && !(layer_len(m->params[first[l]].name) == len && !strncmp(m->params[first[l]].name, pp->name, len)))
      l++;
    if (l == seen) {
      if (seen == n_layers) {
        s = zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is in MoE layer %zu; num_experts lists %zu", c->fs.model.path, pp->name,
                      seen, n_layers);
        break;
      }
      first[seen++] = p;
    }
    if (pp->frozen || pp->tied_to >= 0) {
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: deepspeed.moe expert '%s' is frozen or tied: not written", dir, pp->name);
      break;
    }
    size_t base = 0;
    for (size_t k = 0; k < l; k++) base += (size_t)ne->u.seq.items[k]->u.i;
    if (e >= ne->u.seq.items[l]->u.i) {
      s = zck__fail(ZCK_ERR_FORMAT, "%s: expert '%s' beyond the %lld experts of its layer", dir, pp->name,
                    (long long)ne->u.seq.items[l]->u.i);
      break;
    }
    t->file_of[p] = (int32_t)(base + (size_t)e);
    t->layer[base + (size_t)e] = (int64_t)l;
    t->expert[base + (size_t)e] = e;
  }
  if (s == ZCK_OK && seen != n_layers)
    s = zck__fail(ZCK_ERR_FORMAT, "%s: num_experts lists %zu MoE layers; the params name %zu", c->fs.model.path, n_layers,
                  seen);
  for (size_t b = 0; s == ZCK_OK && b < m->n_buffers; b++)
    if (zck__ds_moe_expert_id(m->buffers[b].name) >= 0)
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: deepspeed.moe expert buffer '%s': not written", dir, m->buffers[b].name);
  /* every file written is one the source has: the numbering is DeepSpeed's */
  for (size_t i = 0; s == ZCK_OK && i < t->n_files; i++) {
    char want[96];
    bool found = false, used = false;
    for (size_t p = 0; p < m->n_params && !used; p++) used = t->file_of[p] == (int32_t)i;
    if (!used) {
      s = zck__fail(ZCK_ERR_FORMAT, "%s: no expert param for expert file %zu of %zu", dir, i, t->n_files);
      break;
    }
    file_name(want, sizeof want, t->layer[i], t->expert[i]);
    for (size_t k = 0; k < c->fs.n_experts && !found; k++) found = !strcmp(c->fs.experts[k].name, want);
    if (!found)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: no %s for the experts numbered so (the layer numbering is not DeepSpeed's)",
                    dir, want);
  }
  if (s == ZCK_OK && c->fs.n_experts != t->n_files)
    s = zck__fail(ZCK_ERR_FORMAT, "%s: %zu expert files; num_experts makes %zu", dir, c->fs.n_experts, t->n_files);
  free(first);
  return s;
}

zck_status zck_ds_moe_target_new(const zck_ds_ckpt *c, int stage, zck_ds_moe_target **out) {
  *out = NULL;
  const char *dir = c->info.dir;
  if (!c->legacy_moe) return ZCK_OK;
  if (stage != 1 && stage != 2)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a deepspeed.moe (expert files) checkpoint: reshard writes its ZeRO-1/2 "
                     "layout only (target ZeRO-%d)", dir, stage);
  const zck_pk *ne = zck_pk_dict_get(zck_torch_root(zck_ds_rank0_model(c)), "num_experts");
  if (!ne || ne->kind != ZCK_PK_LIST || !ne->u.seq.len)
    return zck__fail(ZCK_ERR_FORMAT, "%s: num_experts is not a list of expert counts (DeepSpeed's old MoE format: not "
                     "written)", c->fs.model.path);
  zck_ds_moe_target *t = zck__calloc(1, sizeof *t);
  if (!t) return ZCK_ERR_NO_MEMORY;
  t->num_experts = ne;
  t->ep_size = c->moe ? c->moe->ep_size : 1;
  t->n_params = zck_ds_model(c)->n_params;
  zck_status s = map_files(c, t);
  if (s != ZCK_OK) {
    zck_ds_moe_target_free(t);
    return s;
  }
  *out = t;
  return ZCK_OK;
}

/* ---- the writer's parts */

/* ep_size E > 1: the experts' flat group is EP rank e's experts (global ids [e * local, (e + 1) * local) of each
 * layer, in the group's order), partitioned over the W / E ranks d * E + e (ds_moe_ep.c's layout, the reader's). */
static zck_status ep_geometry(zck_ds_writer *w, const zck_ds_moe_target *t) {
  const uint32_t E = t->ep_size;
  const zck_model *m = w->m;
  if (w->w % E)
    return zck__fail(ZCK_ERR_INVALID_ARG, "deepspeed.moe target: ep_size %u does not divide the world size %u (DeepSpeed "
                     "needs ep_size x expert-data-parallel size = world size)", E, w->w);
  if (w->o.param_align > 1 || w->o.round_robin)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "deepspeed.moe target with ep_size %u: parameter_alignment and "
                     "round_robin_gradients are not supported", E);
  size_t eg = (size_t)-1;
  for (size_t g = 0; g < w->n_flat; g++)
    for (size_t i = 0; i < w->flat[g].n_params; i++) {
      bool ex = t->file_of[w->flat[g].params[i]] >= 0;
      if (ex && eg == (size_t)-1) eg = g;
      if (ex != (g == eg))
        return zck__fail(ZCK_ERR_UNSUPPORTED, "deepspeed.moe target: the experts share an optimizer group with '%s' or "
                         "span two: not written", m->params[w->flat[g].params[i]].name);
    }
  const zck_group_spec *f = &w->flat[eg];
  const size_t n_local = f->n_params / E;
  if (!(w->moe_other_ep = zck__calloc(m->n_params + 1, sizeof *w->moe_other_ep)) ||
      !(w->moe_pos = zck__calloc(f->n_params + 1, sizeof *w->moe_pos)))
    return ZCK_ERR_NO_MEMORY;
  size_t *count = zck__calloc(E, sizeof *count);
  if (!count) return ZCK_ERR_NO_MEMORY;
  zck_status s = f->n_params % E ? zck__fail(ZCK_ERR_FORMAT, "deepspeed.moe target: %zu expert params do not split "
                                             "over ep_size %u", f->n_params, E) : ZCK_OK;
  for (size_t i = 0; s == ZCK_OK && i < f->n_params; i++) {
    uint32_t p = f->params[i];
    int32_t file = t->file_of[p];
    int64_t n = t->num_experts->u.seq.items[t->layer[file]]->u.i;
    if (n % E) {
      s = zck__fail(ZCK_ERR_INVALID_ARG, "deepspeed.moe target: ep_size %u does not divide the %lld experts of MoE layer "
                    "%lld", E, (long long)n, (long long)t->layer[file]);
      break;
    }
    uint32_t e = (uint32_t)(t->expert[file] / (n / E));
    if (count[e] == n_local) {
      s = zck__fail(ZCK_ERR_FORMAT, "deepspeed.moe target: EP rank %u has more than %zu expert params", e, n_local);
      break;
    }
    size_t at = e * n_local + count[e]++;
    w->moe_pos[at] = (uint32_t)i;
    w->moe_other_ep[p] = e > 0;
    /* EP rank e's i-th expert param is EP rank 0's i-th under another id: the same local module */
    if (e) {
      char *local = zck__ds_moe_renamed(m->params[p].name, -(long)e * (n / E));
      const char *first = m->params[f->params[w->moe_pos[at - e * n_local]]].name;
      if (!local) s = ZCK_ERR_NO_MEMORY;
      else if (strcmp(local, first))
        s = zck__fail(ZCK_ERR_FORMAT, "deepspeed.moe target: '%s' of EP rank %u is not '%s' of EP rank 0 (the experts "
                      "are not in module order)", m->params[p].name, e, first);
      free(local);
    }
  }
  free(count);
  ZCK_TRY(s);
  ZCK_TRY(zck__ds_moe_layout(m->n_params, w->geo.numel, w->flat, w->n_flat, w->w, w->o.param_align, eg, E, n_local,
                             w->moe_pos, &w->moe_train));
  w->train = w->moe_train;
  w->moe_ep = E;
  w->moe_group = eg;
  return ZCK_OK;
}

zck_status zck__ds_moe_geometry(zck_ds_writer *w) {
  const zck_ds_moe_target *t = w->o.moe;
  if (w->stage > 2 || w->rank_only || w->o.tp_size > 1 || w->o.nvme_offload || w->o.autoep)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "deepspeed.moe target: ZeRO-1/2, all ranks, no TP, no NVMe offload only");
  if (w->m->n_params != t->n_params)
    return zck__fail(ZCK_ERR_INVALID_ARG, "deepspeed.moe target: made for %zu params, the manifest has %zu", t->n_params,
                     w->m->n_params);
  w->moe_file = t->file_of;
  if (t->ep_size > 1) ZCK_TRY(ep_geometry(w, t));
  /* the plain LP layout has one store per owner, in owner order; the expert files address theirs by param */
  if (!(w->lp_first = zck__calloc(w->m->n_params + 1, sizeof *w->lp_first))) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < w->n_owners; i++) w->lp_first[w->owners[i]] = i;
  w->n_expert_files = t->n_files;
  return (w->expert_w = zck__calloc(t->n_files + 1, sizeof *w->expert_w)) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

static bool put(zck_pk_doc *d, zck_pk *dict, const char *key, zck_pk *v) {
  zck_pk *k = zck_pk_new_str(d, key);
  return k && v && zck_pk_dict_set(d, dict, k, v);
}

zck_status zck__ds_moe_build_expert_file(zck_ds_writer *w, size_t i) {
  const zck_ds_moe_target *t = w->o.moe;
  char name[96], label[1300];
  file_name(name, sizeof name, t->layer[i], t->expert[i]);
  char *path = NULL;
  zck_pk *root;
  zck_status s = zck__ds_expert_file_open(w, i, name, &path, &root);
  for (size_t p = 0; s == ZCK_OK && p < w->m->n_params; p++) {
    if (t->file_of[p] != (int32_t)i) continue;
    const zck_param *pp = &w->m->params[p];
    snprintf(label, sizeof label, "%s/%s: '%.1000s'", w->shown, name, pp->name);
    s = zck__ds_expert_tensor(w, i, root, pp->name, label, pp->numel, pp->ndim, pp->shape,
                              &w->stores[ZCK_DS_LP][w->lp_first[p]]);
  }
  if (s == ZCK_OK) s = zck_torch_writer_seal(w->expert_w[i], root);
  free(path);
  return s;
}

bool zck__ds_moe_model_extras(zck_ds_writer *w, zck_pk_doc *d, zck_pk *root) {
  zck_pk *ne = zck__ds_pk_copy(d, w->o.moe->num_experts);
  return ne && put(d, root, "num_experts", ne) && put(d, root, "ds_autoep_layers", zck_pk_new_none(d));
}
