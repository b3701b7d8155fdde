/* ckpt_rank.c: checkpoints written and read rank by rank, as one process per rank needs
 * (ckpt.h: per_rank). The bytes are those of the thread path (ckpt.c): the same writer
 * lays out the checkpoint, but each rank builds and fills only its own files.
 *
 * Save of step N, in three phases separated by agreements (comm.h: zck_comm_agree), so a
 * failure anywhere stops every rank at the same point and nothing is committed:
 *  1. rank 0: the temporary checkpoint folder (zck__outdir: ".checkpoint-N.zck-tmp-PID"),
 *     its global_stepN/, and for a stage-3 16-bit save model.safetensors with its header at
 *     full size; the folder's name goes to every rank.
 *  2. every rank: its own DeepSpeed files, built by a rank-only writer
 *     (zck__ds_writer_create_rank) straight into global_stepN/, each committed on its own
 *     (no other rank's file is created, not even empty); its byte ranges of
 *     model.safetensors (pwrite, fsync).
 *  3. rank 0: `latest`, the HF files, the manifest last, the rename into place, rotation.
 * A rank killed before phase 3 ends leaves only the temporary folder, which rank 0 removes
 * when it sees the failure, or the next save removes once its writer is dead.
 */
#include "ckpt_internal.h"

#include "deepspeed/deepspeed.h"
#include "error.h"
#include "launch.h"
#include "safetensors/safetensors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZE_PATH_MAX 4096

static bool is_keeper(const ze_ckpt_tracker *t, const ze_zero_rank *zr) { return t->one_rank || zr->rank == 0; }

static bool g16_wanted(const ze_ckpt_tracker *t) {
  return t->plan->o.stage == 3 && (t->gather16 || t->a->save_only_model);
}

// ---- phase 1 (rank 0)

static zck_status g16_create(const ze_ckpt_tracker *t, const char *path) {
  ze__g16 g;
  ZCK_TRY(ze__g16_init(t, path, &g));
  size_t hlen = 0;
  const uint8_t *h = zck_st_writer_header(g.w, &hlen);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  zck_status s = fd < 0 ? zck__fail_errno(errno, "%s: cannot create", path) : ZCK_OK;
  if (s == ZCK_OK) s = zck__pwrite_all(fd, h, hlen, 0, path);
  if (s == ZCK_OK && ftruncate(fd, (off_t)zck_st_writer_file_size(g.w)) != 0)
    s = zck__fail_errno(errno, "%s: cannot set size", path);
  if (fd >= 0 && close(fd) != 0 && s == ZCK_OK) s = zck__fail_errno(errno, "%s: close failed", path);
  ze__g16_free(&g);
  return s;
}

static zck_status prepare(ze_ckpt_tracker *t, zck__outdir *od, const char *final, int64_t step, char *dir_out) {
  const ze_train_args *a = t->a;
  ZCK_TRY_CTX(zck__mkdirs(a->output_dir), "--output-dir");
  ZCK_TRY(zck__outdir_create(od, final, true));
  ZCK_FAIL_IF(strlen(od->tmp_path) >= ZE_PATH_MAX, ZCK_ERR_INVALID_ARG, "%s: path too long", od->tmp_path);
  snprintf(dir_out, ZE_PATH_MAX, "%s", od->tmp_path);
  if (!a->save_only_model) {
    char tag[64];
    snprintf(tag, sizeof tag, "global_step%lld", (long long)step);
    char *tag_dir = zck__outdir_file(od, tag);
    if (!tag_dir) return ZCK_ERR_NO_MEMORY;
    zck_status s = mkdir(tag_dir, 0755) == 0 ? ZCK_OK : zck__fail_errno(errno, "%s: cannot create", tag_dir);
    free(tag_dir);
    ZCK_TRY(s);
  }
  if (g16_wanted(t)) {
    char *model = zck__outdir_file(od, "model.safetensors");
    if (!model) return ZCK_ERR_NO_MEMORY;
    zck_status s = g16_create(t, model);
    free(model);
    ZCK_TRY(s);
  }
  return ZCK_OK;
}

// ---- phase 2 (every rank)

static zck_status g16_fill_own(const ze_ckpt_tracker *t, ze_zero_rank *zr, const char *dir) {
  char *path = zck__path_join(dir, "model.safetensors");
  if (!path) return ZCK_ERR_NO_MEMORY;
  ze__g16 g;
  zck_status s = ze__g16_init(t, path, &g);
  if (s == ZCK_OK) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) s = zck__fail_errno(errno, "%s: cannot open for writing", path);
    if (s == ZCK_OK) s = ze__g16_fill(t, &g, fd, path, zr);
    /* this rank's bytes are durable before rank 0 commits (the file may be on a network
     * file system, where rank 0's fsync does not cover another host's writes) */
    if (s == ZCK_OK && fsync(fd) != 0) s = zck__fail_errno(errno, "%s: fsync failed", path);
    if (fd >= 0) close(fd);
    ze__g16_free(&g);
  }
  free(path);
  return s;
}

// ---- the save

zck_status ze__ckpt_save_per_rank(ze_ckpt_tracker *t, ze_zero_rank *zr, int64_t step) {
  const ze_train_args *a = t->a;
  zck_comm *c = zr->comm;
  bool lead = zr->rank == 0, keeper = is_keeper(t, zr);
  char *final = zck_saver_checkpoint_path(&t->sv, step, keeper);
  char dir[ZE_PATH_MAX] = "";
  zck__outdir od;
  memset(&od, 0, sizeof od);
  zck_status s = final ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  /* the manifest's lr: one writer of the (per-process or shared) model */
  if (s == ZCK_OK && keeper && !a->save_only_model) s = ze__ckpt_set_lr(t, step);
  if (s == ZCK_OK && lead) s = prepare(t, &od, final, step, dir);
  /* after each agreement every rank knows the same outcome; a failure stops them all
   * before anything is committed (rank 0 then removes the temporary folder) */
  s = zck_comm_agree(c, s);
  if (s == ZCK_OK) s = c->broadcast(c, dir, sizeof dir, ZCK_U8, 0);
  dir[sizeof dir - 1] = 0;
  bool stopped = s != ZCK_OK;
  if (!stopped) {
    if (!a->save_only_model) s = ze__ckpt_write_deepspeed(t, zr, dir, step, zr);
    if (s == ZCK_OK && g16_wanted(t)) s = g16_fill_own(t, zr, dir);
    if (s == ZCK_OK) ze_test_kill_point(c, step, true);
    s = zck_comm_agree(c, s);
    stopped = s != ZCK_OK;
  }
  if (!stopped && lead) {
    s = ze__ckpt_finish(t, zr, &od, step, true);
    if (s == ZCK_OK) s = zck_saver_rotate(&t->sv);
  }
  if (lead) zck__outdir_abort(&od); /* after a commit: frees the names only */
  if (!stopped) s = zck_comm_agree(c, s);
  if (s != ZCK_OK && final) s = zck__error_prepend(s, "saving %s", final);
  free(final);
  return s;
}

// ---- resume and the best model

zck_status ze__ckpt_load_per_process(ze_ckpt_tracker *t, const char *path, ze_ckpt_state *st, zck_comm *comm) {
  memset(st, 0, sizeof *st);
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  oo.require_optimizer_state = true;
  char from[ZE_PATH_MAX] = "";
  zck_status s = ZCK_OK;
  if (comm->rank == 0) {
    /* rank 0 checks the checkpoint and reshards it once if this run needs another layout */
    zck_ds_ckpt *c = NULL;
    s = zck_ds_open(path, &oo, &c);
    if (s == ZCK_OK) s = zck_manifest_check_complete(zck_ds_info_of(c)->dir, 0);
    if (s == ZCK_OK && ze__ckpt_needs_reshard(t, zck_ds_info_of(c)))
      s = ze__ckpt_reshard_for_run(t, path, zck_ds_info_of(c), &st->resharded);
    zck_ds_close(c);
    const char *use = st->resharded ? st->resharded : path;
    if (s == ZCK_OK && strlen(use) >= sizeof from) s = zck__fail(ZCK_ERR_INVALID_ARG, "%s: path too long", use);
    if (s == ZCK_OK) snprintf(from, sizeof from, "%s", use);
  }
  s = zck_comm_agree(comm, s);
  if (s == ZCK_OK) s = comm->broadcast(comm, from, sizeof from, ZCK_U8, 0);
  from[sizeof from - 1] = 0;
  zck_ds_ckpt *c = NULL;
  if (s == ZCK_OK) s = zck_ds_open(from, &oo, &c);
  if (s == ZCK_OK) s = ze__ckpt_check_fits(t, c, path);
  s = zck_comm_agree(comm, s);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    ze_ckpt_state_free(st);
    return s;
  }
  const zck_ds_info *in = zck_ds_info_of(c);
  st->ds = c;
  st->path = zck__strdup(path);
  st->global_step = in->global_steps;
  st->optimizer_step = (int64_t)in->step;
  if (t->a->output_dir || t->a->load_best_model_at_end) zck_saver_read_trainer_state(&t->sv, path);
  return ZCK_OK;
}

zck_status ze__ckpt_load_best_per_rank(ze_ckpt_tracker *t, ze_zero_rank *zr) {
  ze_ckpt_state st;
  memset(&st, 0, sizeof st);
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  zck_ds_ckpt *c = NULL;
  const char *best = t->sv.best_checkpoint;
  zck_status s = best ? zck_ds_open(best, &oo, &c) : zck__fail(ZCK_ERR_INTERNAL, "rank %u: no best checkpoint", zr->rank);
  if (s == ZCK_OK) s = ze__ckpt_check_fits(t, c, best);
  s = zck_comm_agree(zr->comm, s);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    return s;
  }
  st.ds = c;
  st.path = zck__strdup(best);
  st.global_step = zck_ds_info_of(c)->global_steps;
  st.optimizer_step = (int64_t)zck_ds_info_of(c)->step;
  s = ze_ckpt_restore_rank(&st, zr);
  ze_ckpt_state_free(&st);
  return s;
}
