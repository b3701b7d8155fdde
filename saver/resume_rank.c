/* resume_rank.c: resume and the best model's reload with one process per rank
 * (saver.h: per_rank). Rank 0 checks the checkpoint and reshards it once when this run
 * needs another layout; every process then opens its own state and reads its own
 * partitions; agreements (comm.h: zck_comm_agree) stop every rank at the same point. */
#include "saver_internal.h"

#include "deepspeed/deepspeed.h"
#include "error.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

zck_status zck__saver_load_per_process(zck_saver *t, const char *path, zck_saver_resume *st, zck_comm *comm) {
  memset(st, 0, sizeof *st);
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  oo.require_optimizer_state = true;
  char from[4096] = "";
  zck_status s = ZCK_OK;
  if (comm->rank == 0) {
    /* rank 0 checks the checkpoint and reshards it once if this run needs another layout */
    zck_ds_ckpt *c = NULL;
    s = zck_ds_open(path, &oo, &c);
    if (s == ZCK_OK) s = zck_ds_check_complete(c, 0); /* the jobs' check, over the manifest parsed at open */
    if (s == ZCK_OK && zck__saver_needs_reshard(t, zck_ds_info_of(c)))
      s = zck__saver_reshard_for_run(t, path, zck_ds_info_of(c), &st->resharded);
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
  if (s == ZCK_OK) s = zck__saver_check_fits(t, c, path);
  s = zck_comm_agree(comm, s);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    zck_saver_resume_free(st);
    return s;
  }
  zck__saver_resume_take(st, c, path);
  if (t->tr.read_trainer_state) zck_saver_read_trainer_state(t, path);
  return ZCK_OK;
}

zck_status zck__saver_load_best_per_rank(zck_saver *t, const zck_saver_rank *zr) {
  zck_saver_resume st;
  memset(&st, 0, sizeof st);
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  zck_ds_ckpt *c = NULL;
  const char *best = t->best_checkpoint;
  zck_status s = best ? zck_ds_open(best, &oo, &c) : zck__fail(ZCK_ERR_INTERNAL, "rank %d: no best checkpoint", zr->comm->rank);
  if (s == ZCK_OK) s = zck_ds_check_complete(c, 0);
  if (s == ZCK_OK) s = zck__saver_check_fits(t, c, best);
  s = zck_comm_agree(zr->comm, s);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    return s;
  }
  zck__saver_resume_take(&st, c, best);
  s = zck_saver_restore_rank(t, &st, zr);
  zck_saver_resume_free(&st);
  return s;
}
