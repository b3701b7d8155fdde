/* ds_moe.c: legacy DeepSpeed-MoE checkpoints (deepspeed.moe.layer.MoE), as far as DeepSpeed's own
 * ds_to_universal.py goes.
 *
 * engine.py _save_moe_checkpoint writes, beside the usual ZeRO-1/2 files, one
 * layer_<L>_expert_<E>_mp_rank_00_model_states.pt per (MoE layer, global expert) holding that expert's module
 * weights, and leaves the experts out of `module`. Their training state lives in the ZeRO shards, in a param
 * group of their own (split_params_into_different_moe_groups_for_optimizer), partitioned over the expert data
 * parallel group. With ep_size 1 that group is the whole dp world and the experts carry their global names in
 * param_shapes: the shards are a plain ZeRO checkpoint, which ds_to_universal.py converts as one, so zckpt reads
 * them as one. With ep_size > 1 each rank's expert group holds its own experts under local names
 * (deepspeed_experts.0 on every rank) and a partition_count below the world size: ds_moe_ep.c rewrites those
 * records to the global names first (ds_to_universal.py fails on it: to-universal refuses it by name).
 * ds_moe_write.c writes the layout again (reshard). */
#include "ds_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZCK__DS_MOE_EXPERTS ".deepspeed_experts."

long zck__ds_moe_expert_id(const char *name) {
  const char *p = strstr(name, ZCK__DS_MOE_EXPERTS);
  if (!p) return -1;
  char *end;
  long e = strtol(p + sizeof ZCK__DS_MOE_EXPERTS - 1, &end, 10);
  return end == p + sizeof ZCK__DS_MOE_EXPERTS - 1 || *end != '.' ? -1 : e;
}

/* The expert id in layer_<L>_expert_<E>_...: the file set's rank (ds_files.c). */
static bool has_expert_file(const zck_ds_ckpt *c, long e) {
  for (size_t i = 0; i < c->fs.n_experts; i++)
    if ((long)c->fs.experts[i].rank == e) return true;
  return false;
}

/* `module` lacks the experts (_get_non_moe_state_dict): each trainable expert param is inserted, at its
 * param_shapes shape and the module's dtype, after the last entry of its MoE layer (its gate), as AutoEP's are;
 * no bytes are bound to it. */
static zck_status add_experts_to_module(zck__ds_model_file *mf, size_t n_experts) {
  size_t cap = mf->n_module + n_experts + 1, n = 0;
  char **names = zck__calloc(cap, sizeof *names);
  zck__ds_tref *ts = zck__calloc(cap, sizeof *ts);
  bool *placed = zck__calloc(n_experts + 1, sizeof *placed);
  if (!names || !ts || !placed) { free(names); free(ts); free(placed); return ZCK_ERR_NO_MEMORY; }
  zck_status s = ZCK_OK;
  zck_dtype dt = mf->n_module ? mf->module_t[0].dtype : ZCK_F32;
  for (size_t i = 0; i <= mf->n_module && s == ZCK_OK; i++) {
    if (i < mf->n_module) {
      names[n] = mf->module_names[i];
      ts[n++] = mf->module_t[i];
    }
    /* after the last module entry under an expert's layer prefix (or at the end) */
    size_t k = 0;
    for (size_t g = 0; g < mf->n_param_shapes && s == ZCK_OK; g++)
      for (size_t j = 0; j < mf->param_shapes[g].n && s == ZCK_OK; j++) {
        const zck__ds_named_shape *ps = &mf->param_shapes[g].v[j];
        if (zck__ds_moe_expert_id(ps->name) < 0) continue;
        size_t e = k++;
        if (placed[e]) continue;
        /* the layer's prefix: "<m>.deepspeed_moe." of "<m>.deepspeed_moe.experts.deepspeed_experts.<E>..." */
        const char *cut = strstr(ps->name, ".experts" ZCK__DS_MOE_EXPERTS);
        size_t pl = (size_t)((cut ? cut : strstr(ps->name, ZCK__DS_MOE_EXPERTS)) - ps->name) + 1;
        bool here = i == mf->n_module;
        if (!here && !strncmp(mf->module_names[i], ps->name, pl)) {
          here = true;
          for (size_t q = i + 1; q < mf->n_module && here; q++) here = strncmp(mf->module_names[q], ps->name, pl) != 0;
        }
        if (!here) continue;
        zck__ds_tref t = {0};
        t.dtype = dt;
        t.ndim = ps->ndim;
        memcpy(t.shape, ps->shape, sizeof t.shape);
        t.numel = ps->numel;
        if (!(names[n] = zck__strdup(ps->name))) s = ZCK_ERR_NO_MEMORY;
        else ts[n++] = t;
        placed[e] = true;
      }
  }
  free(placed);
  free(mf->module_names);
  free(mf->module_t);
  mf->module_names = names;
  mf->module_t = ts;
  mf->n_module = n;
  return s;
}

zck_status zck__ds_moe_prepare(zck_ds_ckpt *c) {
  if (!c->fs.n_experts || c->models[0].autoep) return ZCK_OK;
  const zck__ds_model_file *m0 = &c->models[0];
  size_t n = 0;
  for (size_t g = 0; g < m0->n_param_shapes; g++)
    for (size_t i = 0; i < m0->param_shapes[g].n; i++) n += zck__ds_moe_expert_id(m0->param_shapes[g].v[i].name) >= 0;
  if (!n) return ZCK_OK;  /* not deepspeed.moe's names: AutoEP's files without their record, refused there */
  if (c->info.stage == 3)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a deepspeed.moe expert file in a stage-3 checkpoint: not supported",
                     c->fs.experts[0].path);
  bool mixed = false;
  for (size_t r = 0; r < c->info.world_size; r++) mixed |= c->optims[r].mixed_counts;
  if (mixed) {  /* ep_size > 1: the experts' records under their global names (ds_moe_ep.c) */
    ZCK_TRY(zck__ds_moe_expand_ep(c));
    n = 0;
    for (size_t g = 0; g < m0->n_param_shapes; g++)
      for (size_t i = 0; i < m0->param_shapes[g].n; i++) n += zck__ds_moe_expert_id(m0->param_shapes[g].v[i].name) >= 0;
  }
  for (size_t g = 0; g < m0->n_param_shapes; g++)
    for (size_t i = 0; i < m0->param_shapes[g].n; i++) {
      const char *name = m0->param_shapes[g].v[i].name;
      long e = zck__ds_moe_expert_id(name);
      if (e >= 0 && !has_expert_file(c, e))
        return zck__fail(ZCK_ERR_NOT_FOUND, "%s: incomplete MoE checkpoint: no layer_*_expert_%ld_mp_rank_%02u_model_states.pt "
                         "for %s", c->fs.dir, e, c->fs.mp, name);
    }
  for (size_t r = 0; r < c->n_models; r++) ZCK_TRY(add_experts_to_module(&c->models[r], n));
  c->legacy_moe = true;
  return ZCK_OK;
}

zck_status zck__ds_moe_finish(zck_ds_ckpt *c) {
  /* the experts' module weights are in the expert files, not bound: 16-bit outputs cast the fp32 masters, which is
   * what DeepSpeed's module holds after a step (and what it saves there) */
  zck_layout_free(c->lp_layout);
  c->lp_layout = NULL;
  free(c->lp_missing);
  c->lp_missing = zck__strdup("deepspeed.moe: the 16-bit expert weights are in the expert files, not bound (the fp32 "
                              "masters are cast)");
  return c->lp_missing ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

zck_status zck_ds_moe_refuse(const zck_ds_ckpt *c, const char *job) {
  if (!c || !c->legacy_moe) return ZCK_OK;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a deepspeed.moe (expert files) checkpoint: %s does not write its expert "
                   "files (reshard into DeepSpeed files does)", c->info.dir, job);
}
