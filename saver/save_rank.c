/* save_rank.c: a save written rank by rank, as one process per rank needs (saver.h:
 * per_rank). The bytes are those of the thread path (save.c): the same writer lays out
 * the checkpoint, but each rank builds and fills only its own files (and the 16-bit
 * model.safetensors of stage 3, which rank 0 writes, is gathered from all of them).
 *
 * Save of step N, in three phases separated by agreements (comm.h: zck_comm_agree), so a
 * failure anywhere stops every rank at the same point and nothing is committed:
 *  1. rank 0: the temporary checkpoint folder (zck__outdir: ".checkpoint-N.zck-tmp-PID")
 *     and its global_stepN/; the folder's name goes to every rank.
 *  2. every rank: its own DeepSpeed files, built by a rank-only writer
 *     (zck__ds_writer_create_rank) straight into global_stepN/, each committed on its own
 *     (no other rank's file is created, not even empty); for a stage-3 16-bit save, its
 *     partitions' bytes of model.safetensors, window by window, with (--save-only-model)
 *     the windows gathered to rank 0, which hashes the file in order as the ranks write
 *     it, and commits it (gather16_ranks.c).
 *  3. every rank: its files' manifest hashes, made as it wrote them, to rank 0
 *     (save_hashes.c); rank 0: `latest`, the HF files, the manifest last (from those
 *     hashes, and with --save-only-model its own of model.safetensors), the rename into
 *     place, rotation.
 * A rank killed before phase 3 ends leaves only the temporary folder, which rank 0 removes
 * when it sees the failure, or the next save removes once its writer is dead.
 */
#include "saver_internal.h"

#include "deepspeed/ds_writer.h"
#include "error.h"
#include "stream_hash.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ZCK_SAVER_PATH_MAX 4096

// ---- phase 1 (rank 0)

static zck_status prepare(zck_saver *t, zck__outdir *od, const char *final, int64_t step, char *dir_out) {
  ZCK_TRY_CTX(zck__mkdirs(t->o.output_dir), "--output-dir");
  ZCK_TRY(zck__outdir_create(od, final, true));
  ZCK_FAIL_IF(strlen(od->tmp_path) >= ZCK_SAVER_PATH_MAX, ZCK_ERR_INVALID_ARG, "%s: path too long", od->tmp_path);
  snprintf(dir_out, ZCK_SAVER_PATH_MAX, "%s", od->tmp_path);
  if (!t->tr.save_only_model) {
    char tag[64];
    snprintf(tag, sizeof tag, "global_step%lld", (long long)step);
    char *tag_dir = zck__outdir_file(od, tag);
    if (!tag_dir) return ZCK_ERR_NO_MEMORY;
    zck_status s = mkdir(tag_dir, 0755) == 0 ? ZCK_OK : zck__fail_errno(errno, "%s: cannot create", tag_dir);
    free(tag_dir);
    ZCK_TRY(s);
  }
  return ZCK_OK;
}

// ---- phases 2 and 3

zck_status zck__saver_save_per_rank(zck_saver *t, const zck_saver_rank *zr, int64_t step) {
  const zck_saver_train *a = &t->tr;
  zck_comm *c = zr->comm;
  bool lead = c->rank == 0, keeper = zck__saver_keeper(t, zr);
  char *final = zck_saver_checkpoint_path(t, step, keeper);
  char dir[ZCK_SAVER_PATH_MAX] = "";
  zck__outdir od;
  memset(&od, 0, sizeof od);
  zck_ds_writer *w = NULL;
  zck_status s = final ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  /* the manifest's lr: one writer of the (per-process or shared) model */
  if (s == ZCK_OK && keeper && !a->save_only_model) s = zck__saver_set_lr(t, step);
  if (s == ZCK_OK && lead) s = prepare(t, &od, final, step, dir);
  /* after each agreement every rank knows the same outcome; a failure stops them all
   * before anything is committed (rank 0 then removes the temporary folder) */
  s = zck_comm_agree(c, s);
  if (s == ZCK_OK) s = c->broadcast(c, dir, sizeof dir, ZCK_U8, 0);
  dir[sizeof dir - 1] = 0;
  bool stopped = s != ZCK_OK;
  /* rank 0 collects every rank's hashes: the manifest reads none of the files back (the
   * folder's layout still comes from its reader, which checks the file set the ranks wrote) */
  zck__manifest_known all = {ZCK_MANIFEST_DEFAULT_CHUNK, NULL, 0, NULL}, model = all;
  size_t cap_all = 0, cap_model = 0;
  if (!stopped) {
    /* each rank hashes its own files as it writes them */
    if (!a->save_only_model) s = zck__saver_write_deepspeed(t, zr, dir, step, zr, &w);
    if (zck__saver_g16_wanted(t)) {
      /* collective whatever this rank's outcome so far (the others are in it); the
       * manifest lists model.safetensors only when the folder is the model alone */
      char path[ZCK_SAVER_PATH_MAX + 32];
      snprintf(path, sizeof path, "%s/model.safetensors", dir);
      zck_status g = zck__g16_gather_ranks(t, zr, path, lead && a->save_only_model ? &model : NULL, &cap_model);
      if (s == ZCK_OK) s = g;
    }
    if (s == ZCK_OK && t->h.rank_written) t->h.rank_written(t->h.ctx, c, step);
    s = zck_comm_agree(c, s);
    stopped = s != ZCK_OK;
  }
  if (!stopped && !a->save_only_model) {
    s = zck__saver_gather_hashes(c, w ? zck__ds_writer_known(w, NULL, NULL) : NULL, &all, &cap_all);
    s = zck_comm_agree(c, s);
    stopped = s != ZCK_OK;
  }
  if (!stopped && lead) {
    s = zck__saver_finish(t, zr, &od, step, true, a->save_only_model ? NULL : &all, &model);
    if (s == ZCK_OK) s = zck_saver_rotate(t);
  }
  zck__known_free(&all);
  zck__known_free(&model);
  zck_ds_writer_free(w);
  if (lead) zck__outdir_abort(&od); /* after a commit: frees the names only */
  if (!stopped) s = zck_comm_agree(c, s);
  if (s != ZCK_OK && final) s = zck__error_prepend(s, "saving %s", final);
  free(final);
  return s;
}

