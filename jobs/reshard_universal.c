/* reshard_universal.c: `zckpt reshard` from zckpt's HDF5 universal container
 * (`zckpt to-universal --format hdf5`) to a DeepSpeed checkpoint at any ZeRO stage and
 * world size. The container is described as whole-tensor layouts (fp32, exp_avg,
 * exp_avg_sq, frozen params, buffers) read by range; the DeepSpeed writer reserves the
 * target; one thread pool runs a plan per part, as zck_ds_copy does for DeepSpeed
 * sources: 16-bit module weights are the fp32 masters cast with RNE (frozen params keep
 * their 16-bit values), stage-3 frozen fragments and every model file's buffers too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepspeed/deepspeed.h"
#include "hdf5/zck_h5.h"
#include "plan.h"
#include "tensor_set.h"

zck_status zck__reshard_from_h5(const char *src, const char *out, const zck_reshard_opts *o);

typedef struct zck__rj {
  zck_exec_job v[64];
  zck_plan *plans[64];
  size_t n;
} zck__rj;

static zck_status zck__rj_add(zck__rj *j, const zck_layout *sl, const zck_store *ss, const zck_layout *dl,
                              const zck_store *ds, bool allow_missing) {
  if (j->n == 64) return zck__fail(ZCK_ERR_INTERNAL, "too many copy jobs");
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.allow_missing = allow_missing;
  ZCK_TRY(zck_plan_build(sl, dl, &po, &j->plans[j->n]));
  j->v[j->n] = (zck_exec_job){j->plans[j->n], ss, ds, NULL};
  j->n++;
  return ZCK_OK;
}

zck_status zck__reshard_from_h5(const char *src, const char *out, const zck_reshard_opts *o) {
  zck_h5u *u = NULL;
  ZCK_TRY(zck_h5u_open(src, &u));
  const zck_h5u_info *in = zck_h5u_info_of(u);
  const zck_model *m = zck_h5u_model(u);
  zck_ds_write_opts wo = ZCK_DS_WRITE_OPTS_INIT;
  wo.stage = o->to_stage ? o->to_stage : in->stage;
  wo.world_size = o->to_world_size ? o->to_world_size : in->world_size;
  wo.sub_group_size = o->sub_group_size;
  wo.lp_dtype = ZCK_DTYPE_INVALID; /* the manifest's, unless the container names it */
  zck_h5_file *hf = NULL;
  if (zck_h5_open(src, &hf) == ZCK_OK) {
    char *lp = NULL;
    if (zck_h5_attr_str(hf, "/", "lp_dtype", &lp) == ZCK_OK && lp) wo.lp_dtype = zck_dtype_parse(lp);
    free(lp);
    zck_h5_close(hf);
  }
  zck_clear_error();
  wo.global_steps = in->global_steps;
  wo.skipped_steps = in->skipped_steps;
  wo.global_samples = in->global_samples;
  wo.step = in->step;
  wo.step_is_tensor = in->step_is_tensor;
  wo.ds_version = in->ds_version;
  const zck_layout *fl[ZCK_H5U_PART_COUNT] = {0};
  const zck_store *fs[ZCK_H5U_PART_COUNT] = {0};
  bool have[ZCK_H5U_PART_COUNT] = {0};
  for (int p = 0; p < ZCK_H5U_PART_COUNT; p++) have[p] = zck_h5u_get(u, (zck_h5u_part)p, &fl[p], &fs[p]) == ZCK_OK;
  zck_clear_error();
  zck_status st = ZCK_OK;
  if (!have[ZCK_H5U_FP32]) st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no fp32 master weights in the container", src);
  wo.has_optimizer_state = have[ZCK_H5U_EXP_AVG] && have[ZCK_H5U_EXP_AVG_SQ];
  for (size_t p = 0; st == ZCK_OK && p < m->n_params; p++)
    if (m->params[p].frozen && m->params[p].tied_to < 0 && m->params[p].numel && !have[ZCK_H5U_FROZEN])
      st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: frozen parameter %s has no data in the container", src, m->params[p].name);
  zck__outdir d;
  memset(&d, 0, sizeof d);
  zck_ds_writer *w = NULL;
  zck__rj j;
  memset(&j, 0, sizeof j);
  if (st == ZCK_OK) st = zck__outdir_create(&d, out, o->overwrite != 0);
  if (st == ZCK_OK) st = zck_ds_writer_create(d.tmp_path, m, &wo, &w);
  zck_ds_view dst;
  for (int p = ZCK_H5U_FP32; st == ZCK_OK && p <= ZCK_H5U_EXP_AVG_SQ; p++) {
    if (!have[p] || zck_ds_writer_get(w, (zck_ds_part)(ZCK_DS_FP32 + p), &dst) != ZCK_OK) continue;
    st = zck__rj_add(&j, fl[p], fs[p], dst.layout, dst.stores, false);
  }
  zck_clear_error();
  if (st == ZCK_OK && zck_ds_writer_get(w, ZCK_DS_LP, &dst) == ZCK_OK) {
    st = zck__rj_add(&j, fl[ZCK_H5U_FP32], fs[ZCK_H5U_FP32], dst.layout, dst.stores, true);
    if (st == ZCK_OK && have[ZCK_H5U_FROZEN])
      st = zck__rj_add(&j, fl[ZCK_H5U_FROZEN], fs[ZCK_H5U_FROZEN], dst.layout, dst.stores, true);
  }
  zck_clear_error();
  if (st == ZCK_OK && have[ZCK_H5U_FROZEN] && zck_ds_writer_get(w, ZCK_DS_FROZEN, &dst) == ZCK_OK)
    st = zck__rj_add(&j, fl[ZCK_H5U_FROZEN], fs[ZCK_H5U_FROZEN], dst.layout, dst.stores, false);
  zck_clear_error();
  const zck_layout *bl = NULL;
  const zck_store *bs = NULL;
  zck_h5u_buffers(u, &bl, &bs);
  for (uint32_t r = 0; st == ZCK_OK && bl && r < zck_ds_writer_model_files(w); r++) {
    zck_ds_view bv = zck_ds_writer_buffers(w, r);
    if (bv.layout) st = zck__rj_add(&j, bl, bs, bv.layout, bv.stores, false);
  }
  if (st == ZCK_OK) {
    zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
    eo.threads = o->threads;
    eo.progress = o->progress;
    eo.progress_ctx = o->progress_ctx;
    st = zck_exec_run(j.v, j.n, &eo);
  }
  if (st == ZCK_OK) st = zck_ds_writer_commit(w);
  if (st == ZCK_OK) {
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.kind = "deepspeed";
    mo.threads = o->threads;
    char tag[64];
    snprintf(tag, sizeof tag, "global_step%lld", (long long)in->global_steps);
    char *tag_dir = zck__path_join(d.tmp_path, tag);
    st = tag_dir ? zck_manifest_write_dir(tag_dir, &mo) : ZCK_ERR_NO_MEMORY;
    free(tag_dir);
  }
  if (st == ZCK_OK) st = zck__outdir_commit(&d);
  for (size_t i = 0; i < j.n; i++) zck_plan_free(j.plans[i]);
  zck_ds_writer_free(w);
  zck__outdir_abort(&d);
  zck_h5u_close(u);
  return st;
}
