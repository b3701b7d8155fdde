/* to_universal_zero0.c: the parts of DeepSpeed's universal folder that a ZeRO-0 source
 * cannot give by copying.
 *
 * ds_to_universal refuses ZeRO-0 (no optimizer files), but DeepSpeed's load_universal at
 * ZeRO-1/2 needs only the zero/<param>/ files, zero/optimizer_state.pt (ds_version, clip_grad,
 * param_groups; base_optimizer.load_hp_checkpoint_state_from_checkpoint_dir) and the model
 * file's counters (global_steps, skipped_steps, dp/mp_world_size, lr_scheduler). So zckpt
 * writes what ds_to_universal writes for the equivalent ZeRO-1 checkpoint (the one
 * `zckpt reshard --to-stage 1` writes at the source's world size):
 *   - the model file: the source's, key for key, with `optimizer` None (its state is in
 *     zero/ now), and param_shapes / shared_params holding what the ZeRO-0 reader found
 *     (ds_zero0.c: which module entry each optimizer index trains, which entries are one
 *     tensor), plus zckpt_step_ahead for FP16_UnfusedOptimizer (its step is one ahead);
 *     the tied alias stays one tensor with its source;
 *   - zero/optimizer_state.pt: a ZeRO-1 rank-0 optimizer_state_dict minus the sharded
 *     states, as ds_to_universal reshapes it (paddings 0, partition_count the world size),
 *     with the torch optimizer's param_groups (params [g], a flat group per group);
 *   - step.pt: the Adam step of the source (one value: ZeRO-0 checks all are equal).
 * zckpt's universal reader then reads the folder as a stage-1 one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepspeed/deepspeed.h"
#include "to_universal.h"
#include "universal/universal.h"

static bool put(zck_pk_doc *d, zck_pk *dict, const char *key, zck_pk *v) {
  zck_pk *k = zck_pk_new_str(d, key);
  return k && v && zck_pk_dict_set(d, dict, k, v);
}

static zck_status oom(const zck_ds_ckpt *ck) {
  return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory building the universal folder's pickles", zck_ds_info_of(ck)->dir);
}

/* The torch optimizer's state_dict inside the ZeRO-0 model file (FP16_UnfusedOptimizer's
 * optimizer_state_dict, else `optimizer` itself). */
static const zck_pk *torch_osd(const zck_ds_ckpt *ck) {
  const zck_pk *opt = zck_pk_dict_get(zck_ds_client_state(ck), "optimizer");
  const zck_pk *inner = zck_pk_dict_get(opt, "optimizer_state_dict");
  return inner ? inner : opt;
}

/* The trainable params of optimizer group g, flat order. */
static size_t group_params(const zck_model *m, const uint32_t *flat, size_t n_flat, size_t g, uint32_t *out) {
  size_t n = 0;
  for (size_t i = 0; i < n_flat; i++)
    if (m->params[flat[i]].group == (int32_t)g) out[n++] = flat[i];
  return n;
}

zck_status zck__uvj_zero0_model_file(const zck_ds_ckpt *ck, const uint32_t *flat, size_t n_flat, zck_torch_writer *tw,
                                     zck_pk **out, zck_uv_copies *copies) {
  const zck_model *m = zck_ds_model(ck);
  const zck_ds_info *info = zck_ds_info_of(ck);
  const zck_torch_file *mf = zck_ds_rank0_model(ck);
  const zck_pk *src = zck_torch_root(mf);
  zck_pk_doc *d = zck_torch_writer_doc(tw);
  zck_pk *root = zck_pk_new_dict(d, src->u.dict.ordered);
  if (!root) return oom(ck);
  const zck_pk *smod = zck_pk_dict_get(src, "module");
  size_t nm = smod && smod->kind == ZCK_PK_DICT ? smod->u.dict.len : 0;
  zck_pk **copied = zck__calloc(nm + 1, sizeof *copied);
  uint32_t *gp = zck__calloc(n_flat + 1, sizeof *gp);
  if (!copied || !gp) {
    free(copied);
    free(gp);
    return oom(ck);
  }
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < src->u.dict.len; i++) {
    const char *k = zck_pk_as_str(src->u.dict.keys[i]);
    const zck_pk *v = src->u.dict.values[i];
    zck_pk *nv = NULL;
    if (k && !strcmp(k, "module") && nm) {
      /* entry by entry, so that a tied alias is its source's tensor again (one storage) */
      nv = zck_pk_new_dict(d, smod->u.dict.ordered);
      if (!nv) st = oom(ck);
      if (st == ZCK_OK && smod->u.dict.attrs) st = zck_uv_copy_tree(tw, mf, NULL, smod->u.dict.attrs, &nv->u.dict.attrs, copies);
      for (size_t e = 0; st == ZCK_OK && e < nm; e++) {
        const char *name = zck_pk_as_str(smod->u.dict.keys[e]);
        int64_t p = name ? zck_model_find_param(m, name) : -1;
        if (p >= 0 && m->params[p].tied_to >= 0)
          for (size_t s = 0; s < e && !copied[e]; s++)
            if (copied[s] && !strcmp(zck_pk_as_str(smod->u.dict.keys[s]), m->params[m->params[p].tied_to].name))
              copied[e] = copied[s];
        if (!copied[e]) st = zck_uv_copy_tree(tw, mf, NULL, smod->u.dict.values[e], &copied[e], copies);
        zck_pk *nk = st == ZCK_OK ? zck_pk_new_str(d, name ? name : "") : NULL;
        if (st == ZCK_OK && (!nk || !zck_pk_dict_set(d, nv, nk, copied[e]))) st = oom(ck);
      }
    } else if (k && !strcmp(k, "optimizer")) {
      nv = zck_pk_new_none(d);
    } else if (k && !strcmp(k, "param_shapes")) {
      /* one OrderedDict name -> torch.Size per optimizer group (= flat group at stage 1) */
      nv = zck_pk_new_list(d);
      for (size_t g = 0; nv && g < m->n_groups; g++) {
        zck_pk *od = zck_pk_new_dict(d, 1);
        size_t n = group_params(m, flat, n_flat, g, gp);
        for (size_t q = 0; od && q < n; q++) {
          const zck_param *pp = &m->params[gp[q]];
          zck_pk *sz = zck_pk_new_tuple(d, (size_t)pp->ndim);
          if (sz) sz->tag = ZCK_PK_TAG_TORCH_SIZE;
          for (int x = 0; sz && x < pp->ndim; x++)
            if (!(sz->u.seq.items[x] = zck_pk_new_int(d, pp->shape[x]))) sz = NULL;
          if (!put(d, od, pp->name, sz)) od = NULL;
        }
        if (!od || !zck_pk_append(d, nv, od)) nv = NULL;
      }
      if (!nv) st = oom(ck);
    } else if (k && !strcmp(k, "shared_params")) {
      nv = zck_pk_new_dict(d, 0);
      for (size_t p = 0; nv && p < m->n_params; p++)
        if (m->params[p].tied_to >= 0 && !put(d, nv, m->params[p].name, zck_pk_new_str(d, m->params[m->params[p].tied_to].name)))
          nv = NULL;
      if (!nv) st = oom(ck);
    } else {
      st = zck_uv_copy_tree(tw, mf, NULL, v, &nv, copies);
    }
    zck_pk *nk = NULL;
    if (st == ZCK_OK) st = zck_uv_copy_tree(tw, mf, NULL, src->u.dict.keys[i], &nk, copies);
    if (st == ZCK_OK && !zck_pk_dict_set(d, root, nk, nv)) st = oom(ck);
  }
  if (st == ZCK_OK && info->step_ahead > 0 && !put(d, root, "zckpt_step_ahead", zck_pk_new_int(d, info->step_ahead)))
    st = oom(ck);
  free(copied);
  free(gp);
  *out = root;
  return st;
}

zck_status zck__uvj_zero0_optimizer_state(const zck_ds_ckpt *ck, zck_torch_writer *tw, zck_pk **out,
                                          zck_uv_copies *copies) {
  const zck_ds_info *info = zck_ds_info_of(ck);
  const zck_model *m = zck_ds_model(ck);
  const zck_torch_file *mf = zck_ds_rank0_model(ck);
  zck_pk_doc *d = zck_torch_writer_doc(tw);
  const zck_pk *pgs = zck_pk_dict_get(torch_osd(ck), "param_groups");
  if (!pgs || pgs->kind != ZCK_PK_LIST || pgs->u.seq.len != m->n_groups)
    return zck__fail(ZCK_ERR_FORMAT, "%s: the optimizer's param_groups are not the %zu groups read", zck_torch_name(mf),
                     m->n_groups);
  zck_pk *root = zck_pk_new_dict(d, 0);
  if (!root) return oom(ck);
  *out = root;
  /* stage_1_and_2.state_dict's keys, in its order, less base_optimizer_state,
   * single_partition_of_fp32_groups and param_slice_mappings (ds_to_universal drops them) */
  const zck_pk *ls = zck_ds_loss_scaler(ck);  /* fp16: the DynamicLossScaler ds_zero0.c built */
  zck_pk *nls = NULL;
  bool dyn = false;
  if (ls) {
    ZCK_TRY(zck_uv_copy_tree(tw, mf, NULL, ls, &nls, copies));
    const zck_pk *dv = ls->kind == ZCK_PK_OBJECT ? zck_pk_dict_get(ls->u.obj.state, "dynamic") : NULL;
    dyn = dv && dv->kind == ZCK_PK_BOOL && dv->u.b;
  } else {  /* bf16 / fp32 engines: LossScaler with __dict__ {'cur_scale': 1.0, 'dynamic': False} */
    zck_pk *st = zck_pk_new_dict(d, 0), *g = zck_pk_new_global(d, "deepspeed.runtime.fp16.loss_scaler", "LossScaler");
    zck_pk *args = zck_pk_new_tuple(d, 0);
    if (st && g && args && put(d, st, "cur_scale", zck_pk_new_float(d, 1.0)) && put(d, st, "dynamic", zck_pk_new_bool(d, 0)))
      nls = zck_pk_new_object(d, g, args, 1, st);
  }
  zck_pk *zs_args = zck_pk_new_tuple(d, 1), *zs = NULL;
  if (zs_args && (zs_args->u.seq.items[0] = zck_pk_new_int(d, 1))) {
    zck_pk *g = zck_pk_new_global(d, "deepspeed.runtime.zero.config", "ZeroStageEnum");
    zs = g ? zck_pk_new_object(d, g, zs_args, 0, NULL) : NULL;
  }
  zck_pk *pads = zck_pk_new_list(d), *counts = zck_pk_new_list(d);
  for (size_t g = 0; pads && counts && g < m->n_groups; g++)
    if (!zck_pk_append(d, pads, zck_pk_new_int(d, 0)) ||
        !zck_pk_append(d, counts, zck_pk_new_int(d, (int64_t)info->world_size)))
      pads = NULL;
  bool ok = put(d, root, "loss_scaler", nls) && put(d, root, "dynamic_loss_scale", zck_pk_new_bool(d, dyn)) &&
            put(d, root, "overflow", zck_pk_new_bool(d, 0)) && put(d, root, "clip_grad", zck_pk_new_float(d, info->clip_grad)) &&
            put(d, root, "zero_stage", zs) && put(d, root, "group_paddings", pads) && put(d, root, "partition_count", counts) &&
            put(d, root, "ds_version", zck_pk_new_str(d, info->ds_version ? info->ds_version : "0.19.8"));
  if (!ok) return oom(ck);
  /* the torch optimizer's groups, each over its one flat group: params [g] */
  zck_pk *npg = NULL;
  ZCK_TRY(zck_uv_copy_tree(tw, mf, NULL, pgs, &npg, copies));
  for (size_t g = 0; g < npg->u.seq.len; g++) {
    zck_pk *gd = npg->u.seq.items[g], *ids = zck_pk_new_list(d);
    bool set = false;
    for (size_t q = 0; gd && gd->kind == ZCK_PK_DICT && q < gd->u.dict.len; q++) {
      const char *key = zck_pk_as_str(gd->u.dict.keys[q]);
      if (key && !strcmp(key, "params")) {
        gd->u.dict.values[q] = ids;
        set = true;
      }
    }
    if (!ids || !zck_pk_append(d, ids, zck_pk_new_int(d, (int64_t)g)) || (!set && !put(d, gd, "params", ids))) return oom(ck);
  }
  if (!put(d, root, "param_groups", npg)) return oom(ck);
  return ZCK_OK;
}

zck_status zck__uvj_zero0_steps(const zck_ds_ckpt *ck, zck_uv_writer *w, const uint32_t *flat, size_t n_flat) {
  const zck_ds_info *info = zck_ds_info_of(ck);
  const zck_model *m = zck_ds_model(ck);
  for (size_t i = 0; i < n_flat; i++)
    if (m->params[flat[i]].numel) ZCK_TRY(zck_uv_writer_step(w, m->params[flat[i]].name, info->step_is_tensor, info->step));
  return ZCK_OK;
}
