/* reshard_whole.c: a DeepSpeed checkpoint at any ZeRO stage and world size from a source
 * of whole tensors (the universal folder, the HDF5 container). The DeepSpeed writer
 * reserves the target; one thread pool runs a plan per part, as zck_ds_copy does for
 * DeepSpeed sources: fp32 / exp_avg / exp_avg_sq, 16-bit module weights cast from the fp32
 * masters with RNE (frozen params keep their 16-bit values), stage-3 frozen fragments and
 * every model file's buffers. The output root is built under a temporary name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "reshard_internal.h"

typedef struct zck__rj {
  zck_exec_job *v;
  zck_plan **plans;
  size_t n, cap;
} zck__rj;

static zck_status zck__rj_add(zck__rj *j, const zck_layout *sl, const zck_store *ss, const zck_layout *dl,
                              const zck_store *ds, bool allow_missing, const char *const *names) {
  if (j->n == j->cap) {
    size_t nc = j->cap ? 2 * j->cap : 16;
    zck_exec_job *nv = zck__realloc(j->v, nc * sizeof *nv);
    if (!nv) return ZCK_ERR_NO_MEMORY;
    j->v = nv;
    zck_plan **np = zck__realloc(j->plans, nc * sizeof *np);
    if (!np) return ZCK_ERR_NO_MEMORY;
    j->plans = np;
    j->cap = nc;
  }
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.allow_missing = allow_missing;
  po.param_names = names;
  ZCK_TRY(zck_plan_build(sl, dl, &po, &j->plans[j->n]));
  j->v[j->n] = (zck_exec_job){j->plans[j->n], ss, ds, NULL};
  j->n++;
  return ZCK_OK;
}

static zck_status zck__whole_jobs(const zck__whole_src *s, zck_ds_writer *w, zck__rj *j, const char *const *names) {
  zck_ds_view dst;
  for (int p = 0; p < 3; p++) {
    if (zck_ds_writer_get(w, (zck_ds_part)(ZCK_DS_FP32 + p), &dst) != ZCK_OK) continue;
    if (!s->layout[p]) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no %s to copy", s->path, p ? "optimizer state" : "fp32 weights");
    ZCK_TRY(zck__rj_add(j, s->layout[p], s->stores[p], dst.layout, dst.stores, false, names));
  }
  if (zck_ds_writer_get(w, ZCK_DS_LP, &dst) == ZCK_OK) {
    ZCK_TRY(zck__rj_add(j, s->layout[0], s->stores[0], dst.layout, dst.stores, true, names));
    if (s->layout[3]) ZCK_TRY(zck__rj_add(j, s->layout[3], s->stores[3], dst.layout, dst.stores, true, names));
  }
  if (zck_ds_writer_get(w, ZCK_DS_FROZEN, &dst) == ZCK_OK) {
    if (!s->layout[3]) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no frozen-parameter data", s->path);
    ZCK_TRY(zck__rj_add(j, s->layout[3], s->stores[3], dst.layout, dst.stores, false, names));
  }
  for (uint32_t r = 0; s->buffer_layout && r < zck_ds_writer_model_files(w); r++) {
    zck_ds_view bv = zck_ds_writer_buffers(w, r);
    if (bv.layout) ZCK_TRY(zck__rj_add(j, s->buffer_layout, s->buffer_stores, bv.layout, bv.stores, false, NULL));
  }
  zck_clear_error();
  return ZCK_OK;
}

zck_status zck__reshard_whole(const zck__whole_src *s, const zck_ds_write_opts *wo, const char *out,
                              const zck_reshard_opts *o) {
  const zck_model *m = s->m;
  for (size_t p = 0; p < m->n_params; p++)
    if (m->params[p].frozen && m->params[p].tied_to < 0 && m->params[p].numel && !s->layout[3])
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s: frozen parameter %s has no data", s->path, m->params[p].name);
  const char **names = zck__calloc(m->n_params + 1, sizeof *names);
  if (!names) return ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; p < m->n_params; p++) names[p] = m->params[p].name;
  zck__outdir d;
  memset(&d, 0, sizeof d);
  zck_ds_writer *w = NULL;
  zck__rj j = {0};
  zck_status st = zck__outdir_create(&d, out, o->overwrite != 0);
  if (st == ZCK_OK) st = zck_ds_writer_create(d.tmp_path, m, wo, &w);
  if (st == ZCK_OK) st = zck__whole_jobs(s, w, &j, names);
  if (st == ZCK_OK) {
    zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
    eo.threads = o->threads;
    eo.progress = o->progress;
    eo.progress_ctx = o->progress_ctx;
    st = zck_exec_run(j.v, j.n, &eo);
  }
  if (st == ZCK_OK) st = zck_ds_writer_commit(w);
  if (st == ZCK_OK && s->side_root) st = zck__reshard_carry_side_files(s->side_root, s->side_skip, d.tmp_path, wo->world_size);
  if (st == ZCK_OK && s->side_write) st = s->side_write(s->side_ctx, d.tmp_path, wo->world_size);
  if (st == ZCK_OK) {
    /* written last: its presence says the checkpoint is complete, its hashes what it holds */
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.kind = "deepspeed";
    mo.threads = o->threads;
    char *tag_dir = wo->tag ? zck__path_join(d.tmp_path, wo->tag)
                            : zck__sprintf("%s/global_step%lld", d.tmp_path, (long long)wo->global_steps);
    st = tag_dir ? zck_manifest_write_dir(tag_dir, &mo) : ZCK_ERR_NO_MEMORY;
    free(tag_dir);
  }
  if (st == ZCK_OK) st = zck__outdir_commit(&d);
  for (size_t i = 0; i < j.n; i++) zck_plan_free(j.plans[i]);
  free(j.plans);
  free(j.v);
  free(names);
  zck_ds_writer_free(w);
  zck__outdir_abort(&d);
  return st;
}
