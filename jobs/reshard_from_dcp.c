/* reshard_from_dcp.c: `zckpt reshard DCP OUT`: a torch Distributed Checkpoint (FSDP2,
 * Accelerate, HF Trainer with FSDP) as the DeepSpeed checkpoint a ZeRO-S run at W ranks
 * saves, with all optimizer state, for engine.load_checkpoint.
 *
 * The DCP reader (formats/dcp) describes one param per model.<fqn> entry; a DeepSpeed
 * manifest is more: a model's tied weights are one param and an alias, its persistent
 * buffers are not params. The DeepSpeed manifest made here from the DCP's:
 *   - a param with optimizer state (or in a param group) is trainable, its group and the
 *     group's settings from optim.param_groups.<i>.*, the group's param order from its
 *     `params` list (FQNs): the order of DeepSpeed's flat buffers (torchtitan's flattened
 *     optimizer: the groups formats/dcp makes of equal per-param settings);
 *   - a param without optimizer state that repeats a trainable param's bytes is that
 *     param's tied alias (zck_dcp_ties: DCP writes tied weights under both names);
 *   - else it is a buffer if FSDP2 did not shard it (an integer tensor, or one chunk in a
 *     save of several ranks: fully_shard shards every param, frozen ones too, and DCP
 *     writes a replicated tensor once), and a frozen param otherwise (so in a save of one
 *     rank, which cannot tell them apart, a floating buffer is taken as a frozen param);
 *   - model order is the DCP's (module.state_dict() order, as get_state_dict makes it);
 *   - names are the module's (zck_dcp_param_module_name): an adapter-only PEFT save keys
 *     its weights without the adapter name, which a PEFT engine's files keep; a param
 *     group without params (the HF Trainer's no-decay group of a LoRA run) is dropped, as
 *     DeepSpeed drops it from the optimizer it builds;
 *   - the 16-bit dtype of the target run: --to-dtype, else the trainable weights' dtype
 *     (FSDP2 mixed precision keeps fp32 params: an fp32 DeepSpeed run); not fp16, whose
 *     loss scaler state a DCP does not hold. Frozen params take
 *     it too, as DeepSpeed's engine casts every param; buffers keep theirs, as it keeps
 *     them (a bf16 engine's float buffers stay float32).
 * The source view's layouts are renumbered into that manifest (the stores, the DCP's chunks
 * read in place, stay as they are) and reshard_whole.c writes the target through the one
 * transfer: fp32 masters, exp_avg and exp_avg_sq cast up exactly from a 16-bit DCP, 16-bit
 * weights cast from fp32 (RNE), frozen params and buffers into the model files.
 *
 * What the DCP does not hold is DeepSpeed's defaults: global_steps = Adam's step (the tag
 * global_step<N>), no lr scheduler state (load with load_lr_scheduler_states=False into
 * a run that has a scheduler), a static loss scale of 1, a minimal ds_config.
 * An HF Trainer / Accelerate checkpoint-N (the DCP in its pytorch_model_fsdp_0/) gives
 * more: its other files are carried over as from a DeepSpeed checkpoint-N (trainer_state
 * .json, scheduler.pt, rng_state_<r>.pth of ranks below W, ...), and its scheduler.pt,
 * the state dict of the Trainer's lr scheduler, is the lr_scheduler DeepSpeed saves for
 * an engine given that scheduler (as the Trainer gives it its own). Refused in
 * one line before anything is written: no optimizer state, state other than Adam's, steps
 * that differ between params, a param group the target cannot hold. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dcp/dcp.h"
#include "reshard_internal.h"
#include "torch/torch.h"

/* The DeepSpeed manifest and its layouts over the DCP's stores. */
typedef struct zck__dcp_ds {
  zck_model *m;
  zck_layout *layout[4];   /* fp32, exp_avg, exp_avg_sq, frozen (zck__whole_src's order) */
  zck_layout *buffers;
} zck__dcp_ds;

static void zck__dcp_ds_free(zck__dcp_ds *d) {
  zck_model_free(d->m);
  for (int k = 0; k < 4; k++) zck_layout_free(d->layout[k]);
  zck_layout_free(d->buffers);
}

typedef enum { AS_PARAM, AS_ALIAS, AS_BUFFER } zck__dcp_role;

static bool zck__is_float(zck_dtype t) { return t == ZCK_F32 || t == ZCK_F16 || t == ZCK_BF16 || t == ZCK_F64; }

/* l's pieces whose param map[] keeps, renumbered into an index space of n entries; the
 * stores and their ids stay (the DCP's chunks). *out NULL when no piece is kept. */
static zck_status zck__dcp_remap(const zck_layout *l, const uint32_t *map, size_t n, const uint64_t *numel,
                                 zck_layout **out) {
  *out = NULL;
  if (!l) return ZCK_OK;
  zck_piece *pc = zck__malloc((l->n_pieces ? l->n_pieces : 1) * sizeof *pc);
  zck_layout_store *ls = zck__malloc((l->n_stores ? l->n_stores : 1) * sizeof *ls);
  zck_status st = pc && ls ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t i = 0; st == ZCK_OK && i < l->n_pieces; i++) {
    uint32_t to = map[l->pieces[i].param];
    if (to == UINT32_MAX) continue;
    pc[k] = l->pieces[i];
    pc[k++].param = to;
  }
  for (size_t i = 0; st == ZCK_OK && i < l->n_stores; i++) {
    ls[i] = l->stores[i];
    if (ls[i].param >= 0) ls[i].param = map[ls[i].param] == UINT32_MAX ? -1 : (int32_t)map[ls[i].param];
  }
  if (st == ZCK_OK && k) st = zck_layout_custom(n, numel, ls, l->n_stores, pc, k, out);
  free(pc);
  free(ls);
  return st;
}

/* The manifest (see the top of this file); pmap / bmap: DCP param -> DeepSpeed param /
 * buffer, UINT32_MAX where it is not one. */
static zck_status zck__dcp_manifest(const zck_dcp *c, const zck_dcp_train *tr, zck_dtype lp, zck_model *m,
                                    uint32_t *pmap, uint32_t *bmap) {
  const zck_model *src = zck_dcp_model(c);
  int32_t *tied = zck__malloc((src->n_params ? src->n_params : 1) * sizeof *tied);
  if (!tied) return ZCK_ERR_NO_MEMORY;
  zck_status st = zck_dcp_ties(c, tied);
  for (size_t p = 0; st == ZCK_OK && p < src->n_params; p++) {
    const zck_param *a = &src->params[p];
    zck__dcp_role role = AS_PARAM;
    if (tied[p] >= 0) role = AS_ALIAS;
    else if (a->frozen && (!zck__is_float(a->dtype) || (tr->world_size > 1 && zck_dcp_param_chunks(c, (uint32_t)p) == 1)))
      role = AS_BUFFER;
    pmap[p] = bmap[p] = UINT32_MAX;
    if (role == AS_BUFFER) {
      st = zck_model_add_buffer(m, a->name, a->ndim, a->shape, a->dtype, &bmap[p]);
      continue;
    }
    /* the module's name: a PEFT adapter-only save's keys drop the adapter name, which the
     * DeepSpeed files of a PEFT engine keep */
    st = zck_model_add_param(m, zck_dcp_param_module_name(c, (uint32_t)p), a->ndim, a->shape, lp, &pmap[p]);
    if (st == ZCK_OK) zck_model_set_frozen(m, pmap[p], a->frozen && role == AS_PARAM);
  }
  /* aliases after every param is in: set_tied checks the source */
  for (size_t p = 0; st == ZCK_OK && p < src->n_params; p++)
    if (tied[p] >= 0) st = zck_model_set_tied(m, pmap[p], pmap[tied[p]]);
  for (size_t g = 0; st == ZCK_OK && g < src->n_groups; g++) {
    const zck_param_group *pg = &src->groups[g];
    /* an empty group (the HF Trainer's no-decay group of a LoRA run) is dropped, as
     * DeepSpeed drops it from the optimizer it builds for the same groups */
    if (!pg->n_params) continue;
    uint32_t ng;
    st = zck_model_add_group(m, &ng);
    for (size_t i = 0; st == ZCK_OK && i < pg->n_params; i++)
      if (pmap[pg->params[i]] != UINT32_MAX) st = zck_model_group_add_param(m, ng, pmap[pg->params[i]]);
    if (st == ZCK_OK) st = zck_model_group_copy_settings(m, ng, pg);
  }
  free(tied);
  return st;
}

/* d: the manifest and the view's layouts renumbered into it. */
static zck_status zck__dcp_describe_ds(const zck__src *s, const zck_dcp_train *tr, zck_dtype lp, zck__dcp_ds *d) {
  const zck_model *src = s->m;
  size_t n = src->n_params;
  uint32_t *pmap = zck__malloc((n ? n : 1) * sizeof *pmap), *bmap = zck__malloc((n ? n : 1) * sizeof *bmap);
  zck_status st = pmap && bmap && (d->m = zck_model_new()) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck__dcp_manifest(s->dcp, tr, lp, d->m, pmap, bmap);
  uint64_t *numel = NULL, *bnumel = NULL;
  if (st == ZCK_OK) {
    numel = zck__malloc((d->m->n_params + 1) * sizeof *numel);
    bnumel = zck__malloc((d->m->n_buffers + 1) * sizeof *bnumel);
    if (!numel || !bnumel) st = ZCK_ERR_NO_MEMORY;
  }
  if (st == ZCK_OK) {
    zck_model_numels(d->m, numel);
    for (size_t b = 0; b < d->m->n_buffers; b++) bnumel[b] = d->m->buffers[b].numel;
  }
  static const zck_state_kind kinds[4] = {ZCK_STATE_FP32, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ, ZCK_STATE_FROZEN};
  for (int k = 0; st == ZCK_OK && k < 3; k++)
    st = zck__dcp_remap(s->view.part[kinds[k]].layout, pmap, d->m->n_params, numel, &d->layout[k]);
  /* the frozen part keeps the frozen params only: an alias's bytes are its source's (pmap
   * is not needed after this) */
  for (size_t p = 0; st == ZCK_OK && p < n; p++)
    if (pmap[p] != UINT32_MAX && d->m->params[pmap[p]].tied_to >= 0) pmap[p] = UINT32_MAX;
  if (st == ZCK_OK) st = zck__dcp_remap(s->view.part[ZCK_STATE_FROZEN].layout, pmap, d->m->n_params, numel, &d->layout[3]);
  if (st == ZCK_OK) st = zck__dcp_remap(s->view.part[ZCK_STATE_FROZEN].layout, bmap, d->m->n_buffers, bnumel, &d->buffers);
  free(numel);
  free(bnumel);
  free(pmap);
  free(bmap);
  return st;
}

/* The 16-bit dtype of the target run: the one asked for, else the trainable weights'. */
static zck_dtype zck__dcp_lp(const zck_model *m, zck_dtype asked) {
  if (asked != ZCK_DTYPE_INVALID) return asked;
  for (size_t p = 0; p < m->n_params; p++)
    if (!m->params[p].frozen && zck__is_float(m->params[p].dtype)) return m->params[p].dtype == ZCK_F64 ? ZCK_F32 : m->params[p].dtype;
  return ZCK_F32;
}

/* root/scheduler.pt, when there is one: *tf holds it open (its root, a dict, is the
 * scheduler's state). One that cannot be read is refused: the target would lose it. */
static zck_status zck__dcp_scheduler(const char *root, zck_torch_file **tf) {
  *tf = NULL;
  char *p = zck__path_join(root, "scheduler.pt");
  if (!p) return ZCK_ERR_NO_MEMORY;
  struct stat sb;
  zck_status st = ZCK_OK;
  if (stat(p, &sb) == 0) {
    st = zck_torch_open(p, NULL, tf);
    if (st == ZCK_OK && zck_torch_root(*tf)->kind != ZCK_PK_DICT)
      st = zck__fail(ZCK_ERR_FORMAT, "%s: not an lr scheduler's state dict", p);
  }
  free(p);
  return st;
}

zck_status zck__reshard_from_dcp(const zck__src *s, const char *out, const zck_reshard_opts *o) {
  const char *src = s->dir;
  const zck_dcp_info *in = zck_dcp_info_of(s->dcp);
  if (o->to_tp_size > 1)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "--to-tp-size: %s is a torch Distributed Checkpoint; its reshard writes data "
                     "parallel ZeRO only", src);
  zck_dcp_train tr;   /* first: another optimizer's state is named as such, not as missing Adam state */
  ZCK_TRY(zck_dcp_train_info(s->dcp, &tr));
  if (!in->has_optimizer_state)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no optimizer state (exp_avg / exp_avg_sq for every trainable param): a "
                     "DeepSpeed checkpoint must carry it; save the optimizer with the model (get_state_dict(model, optim))",
                     src);
  if (!tr.has_step) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: Adam's step is missing from the optimizer state", src);
  zck_dtype lp = zck__dcp_lp(s->m, o->to_dtype);
  /* DeepSpeed's fp16 run restores its loss scaler from the checkpoint: the static scale of
   * 1 a writer without one gives would silently replace its dynamic scaling */
  if (lp == ZCK_F16)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: an fp16 DeepSpeed run needs its loss scaler's state, which a torch "
                     "Distributed Checkpoint does not hold: pass --to-dtype bf16 or fp32", src);
  zck__dcp_ds d;
  memset(&d, 0, sizeof d);
  zck_status st = zck__dcp_describe_ds(s, &tr, lp, &d);
  zck_ds_write_opts wo = ZCK_DS_WRITE_OPTS_INIT;
  wo.stage = o->to_stage ? o->to_stage : 3;   /* FSDP shards every param, as ZeRO-3 does */
  wo.world_size = o->to_world_size ? o->to_world_size : tr.world_size;
  wo.sub_group_size = o->sub_group_size;
  wo.lp_dtype = lp;
  wo.global_steps = (int64_t)tr.step;
  wo.step = tr.step;
  wo.step_is_tensor = tr.step_is_tensor;
  wo.has_optimizer_state = true;
  wo.save_latest = true;
  /* an adapter-only PEFT save holds no base weights: the target is what DeepSpeed saves with
   * exclude_frozen_parameters (the HF Trainer's save of a PEFT model), no frozen fragments */
  wo.exclude_frozen = zck_dcp_peft_adapter(s->dcp) != NULL;
  char *side_root = zck_dcp_save_root(s->dcp);
  zck_torch_file *sched = NULL;
  if (st == ZCK_OK && side_root) st = zck__dcp_scheduler(side_root, &sched);
  if (sched) wo.lr_scheduler = zck_torch_root(sched);
  if (st == ZCK_OK) st = zck__reshard_check(src, d.m, &wo, true, o);
  if (st == ZCK_OK) {
    zck__whole_src ws;
    memset(&ws, 0, sizeof ws);
    ws.path = src;
    ws.m = d.m;
    static const zck_state_kind kinds[4] = {ZCK_STATE_FP32, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ, ZCK_STATE_FROZEN};
    for (int k = 0; k < 4; k++) {
      ws.layout[k] = d.layout[k];
      ws.stores[k] = s->view.part[kinds[k]].stores;
    }
    ws.buffer_layout = d.buffers;
    ws.buffer_stores = s->view.part[ZCK_STATE_FROZEN].stores;
    ws.side_root = side_root;
    ws.side_skip = ZCK_DCP_ACCELERATE_MODEL_DIR;   /* a folder, never carried: named for the rule */
    st = zck__reshard_whole(&ws, &wo, out, o);
  }
  zck_torch_close(sched);
  free(side_root);
  if (st == ZCK_OK) zck__job_summary_fill(o->summary, out, d.m->n_params);
  zck__dcp_ds_free(&d);
  return st;
}
