/* reshard_uvdir.c: `zckpt reshard` from a DeepSpeed universal folder (what
 * ds_to_universal.py and `zckpt to-universal --format ds` write) to a DeepSpeed checkpoint
 * at any ZeRO stage and world size.
 *
 * The universal reader describes the folder with the DeepSpeed reader's rules applied to
 * the model-states file it carries (manifest, groups, frozen params, buffers) and reads
 * each zero/<param>/<state>.pt in place; the write options come from the same places as
 * for the original checkpoint (counters and ds_config, lr_scheduler and module attributes
 * of the model file; loss_scaler, clip_grad and param groups of zero/optimizer_state.pt),
 * so the result equals, state for state, the reshard of the checkpoint the universal
 * folder was made from. The tag is global_step<N>. An HF checkpoint-N/ folder holding
 * latest_universal has its other files carried over as for DeepSpeed sources. */
#include <stdlib.h>
#include <string.h>

#include "reshard_internal.h"
#include "source.h"
#include "universal/universal.h"

void zck__whole_src_uv(const zck_uv_ckpt *u, zck__whole_src *s) {
  memset(s, 0, sizeof *s);
  s->path = zck_uv_info_of(u)->dir;
  s->m = zck_uv_model(u);
  for (int p = 0; p < ZCK_UV_PART_COUNT; p++)
    if (zck_uv_get(u, (zck_uv_part)p, &s->layout[p], &s->stores[p]) != ZCK_OK) s->layout[p] = NULL;
  zck_clear_error();   /* a part the folder lacks is NULL */
  zck_uv_buffers(u, &s->buffer_layout, &s->buffer_stores);
}

zck_status zck__reshard_from_universal(const zck__src *src, const char *out, const zck_reshard_opts *o) {
  const zck_uv_ckpt *u = src->uv;
  const zck_uv_info *in = zck_uv_info_of(u);
  zck__whole_src s;
  zck__whole_src_uv(u, &s);
  char *skip = NULL;
  if (in->root) {
    const char *slash = strrchr(in->dir, '/');
    skip = zck__strdup(slash ? slash + 1 : in->dir);
    s.side_root = in->root;
    s.side_skip = skip;
  }
  /* the write options zck_ds_write_opts_from gives the original checkpoint */
  zck_ds_write_opts wo = ZCK_DS_WRITE_OPTS_INIT;
  wo.stage = o->to_stage ? o->to_stage : in->stage;
  wo.world_size = o->to_world_size ? o->to_world_size : in->world_size;
  wo.sub_group_size = o->sub_group_size ? o->sub_group_size
                                        : in->sub_group_size != 1000000000ull ? in->sub_group_size : 0;
  wo.lp_dtype = in->lp_dtype;
  wo.round_robin = in->round_robin;
  wo.param_align = in->param_align;
  wo.global_steps = in->global_steps;
  wo.skipped_steps = in->skipped_steps;
  wo.step_ahead = in->step_ahead;
  wo.global_samples = in->global_samples;
  wo.has_optimizer_state = in->has_optimizer_state;
  wo.step_is_tensor = in->step_is_tensor;
  wo.step = in->step;
  wo.clip_grad = in->clip_grad;
  wo.ds_version = in->ds_version;
  wo.ds_config = zck_uv_ds_config(u);
  const zck_pk *sched = zck_uv_lr_scheduler(u);
  wo.lr_scheduler = sched && sched->kind != ZCK_PK_NONE ? sched : NULL;
  wo.loss_scaler = zck_uv_loss_scaler(u);
  wo.module_attrs = zck_uv_module_attrs(u);
  wo.unsaved_ties = zck_uv_unsaved_ties(u, &wo.n_unsaved_ties);
  wo.exclude_frozen = zck_uv_frozen_excluded(u);
  zck_status st = skip || !in->root ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck__reshard_check(in->dir, s.m, &wo, in->has_optimizer_state, o);
  if (st == ZCK_OK && o->to_tp_size > 1) {
    /* the universal folder of an AutoTP checkpoint: its carried model file's affine map */
    zck_state_view view;
    zck__whole_state(&s, &view);
    zck__autotp_src as = {in->dir, &view, s.m, zck_uv_autotp_info(u), in->tp_size, s.side_root, s.side_skip, NULL, NULL, NULL};
    st = zck__reshard_autotp(&as, &wo, out, o);
  } else if (st == ZCK_OK) {
    st = zck__reshard_whole(&s, &wo, out, o);
  }
  if (st == ZCK_OK) zck__job_summary_fill(o->summary, out, s.m->n_params);
  free(skip);
  return st;
}
