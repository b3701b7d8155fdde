/* reshard_whole.c: a DeepSpeed checkpoint at any ZeRO stage and world size from a source
 * of whole tensors (the universal folder, the HDF5 container). The DeepSpeed writer
 * reserves the target; lib/transfer copies the source's view into it, with the rules every
 * job shares (fp32 / exp_avg / exp_avg_sq, 16-bit weights cast from fp32 with RNE while
 * frozen params keep theirs, stage-3 frozen fragments, every model file's buffers). The
 * output root is built under a temporary name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepspeed/ds_writer.h"
#include "manifest.h"
#include "reshard_internal.h"
#include "transfer.h"

/* The whole-tensor source as a state view: its frozen part holds the frozen params' 16-bit
 * values; it has no LP part, so the 16-bit weights are cast from fp32. */
void zck__whole_state(const zck__whole_src *s, zck_state_view *v) {
  memset(v, 0, sizeof *v);
  v->model = s->m;
  v->name = s->path;
  static const zck_state_kind kinds[4] = {ZCK_STATE_FP32, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ, ZCK_STATE_FROZEN};
  for (int k = 0; k < 4; k++) v->part[kinds[k]] = (zck_state_part){s->layout[k], s->stores[k], NULL};
  if (s->buffer_layout) {
    v->buffers = (zck_state_part){s->buffer_layout, s->buffer_stores, NULL};
    v->n_buffer_copies = 1;
  }
}

zck_status zck__reshard_whole(const zck__whole_src *s, const zck_ds_write_opts *wo, const char *out,
                              const zck_reshard_opts *o) {
  const zck_model *m = s->m;
  for (size_t p = 0; p < m->n_params; p++)
    if (m->params[p].frozen && m->params[p].tied_to < 0 && m->params[p].numel && !s->layout[3])
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s: frozen parameter %s has no data", s->path, m->params[p].name);
  zck__outdir d;
  memset(&d, 0, sizeof d);
  zck_ds_writer *w = NULL;
  zck_status st = zck__outdir_create(&d, out, o->overwrite != 0);
  zck_ds_write_opts wt = *wo;
  wt.threads = o->threads;
  if (st == ZCK_OK) st = zck_ds_writer_create(d.tmp_path, m, &wt, &w);
  /* the manifest's hashes are computed from the bytes as the transfer writes them */
  if (st == ZCK_OK) zck__ds_writer_hash_inline(w, 0, 0);
  if (st == ZCK_OK) {
    zck_state_view src, dst;
    zck__whole_state(s, &src);
    zck_ds_writer_state(w, &dst);
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec.threads = o->threads;
    to.exec.progress = o->progress;
    to.exec.progress_ctx = o->progress_ctx;
    to.exec.no_verify = o->no_verify != 0;
    st = zck_transfer(&src, &dst, 1, &to);
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
    st = tag_dir ? zck__manifest_write_dir_known(tag_dir, &mo, zck__ds_writer_known(w, NULL, NULL), NULL)
                 : ZCK_ERR_NO_MEMORY;
    free(tag_dir);
  }
  if (st == ZCK_OK) st = zck__outdir_commit(&d);
  zck_ds_writer_free(w);
  zck__outdir_abort(&d);
  return st;
}
