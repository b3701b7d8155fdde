/* save_async.c: saves written in the background (saver.h: async_save), for ranks that are
 * threads of one process (ranks that are processes: save_async_ranks.c, which shares the
 * job and its joins defined here).
 *
 * A save of step N, collective, with one agreement (each one costs the ranks' skew):
 *  1. each rank waits until no writer reads the snapshots (at most one save in flight):
 *     rank 0 joins the writer of the save before it (a wait is said in the log) and keeps
 *     its outcome, the others watch writer_busy;
 *  2. rank 0 makes the job of this save: a copy of the bookkeeping as it is at step N;
 *  3. every rank snapshots what the save reads (the snapshot hook: host copies of its
 *     partitions, and rank 0's 16-bit copies) into its slot of s->snaps;
 *  4. they agree: the first failure of any rank (the previous save's on rank 0, a
 *     snapshot's) is every rank's, and the agreement orders the slots before what follows;
 *  5. rank 0 starts the writer thread, and every rank goes back to training.
 * The writer runs a synchronous save's own work (zck__saver_save_rank0) over the snapshots:
 * the same files, the same bytes, hashed as written; checkpoint-N/ is built under a
 * temporary name with its `latest` inside and renamed into place last, then rotation. A
 * crash before that rename leaves a temporary folder only (the next save sweeps it), and
 * the newest checkpoint-M/ stays the complete one a resume picks.
 *
 * Who owns what:
 *  - each rank thread: its snapshot and its slot of s->snaps while it takes it (step 3);
 *    the writer reads them until it clears writer_busy, and no rank changes them before;
 *  - rank 0's thread: the job handle (start, join) and the live bookkeeping (log history,
 *    best metric and checkpoint, the manifest), which training keeps changing;
 *  - the writer thread: the job, with its own copy of that bookkeeping as it was at step N
 *    (a clone of the manifest, whose param groups' "lr" the save sets; the log history;
 *    the best checkpoint), the output folder until it joins.
 * The writer's outcome stays in the job until a join reads it: the next save, the flush at
 * the end of training or the drain after the ranks stopped. A failure there is one line
 * naming the save, and every rank fails with it: a background write is never lost.
 */
#include "saver_internal.h"

#include "error.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double zck__saver_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void zck__saver_note(const zck_saver *s, const char *fmt, ...) {
  if (!s->h.note) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->h.note(s->h.ctx, line);
}

void zck__saver_job_free(zck__saver_job *j) {
  if (!j) return;
  zck__g16_free(&j->g16); /* uncommitted: the file goes (with its folder) */
  zck__outdir_abort(&j->od); /* after a commit: frees the names only */
  free(j->copy.best_checkpoint);
  cJSON_Delete(j->copy.log_history);
  zck_model_free(j->model);
  free(j);
}

static void *writer_main(void *arg) {
  zck__saver_job *j = arg;
  j->status = j->work ? j->work(j) : zck__saver_save_rank0(&j->copy, &j->r0, j->step);
  if (j->status != ZCK_OK) snprintf(j->msg, sizeof j->msg, "%s", zck_last_error());
  atomic_store(&j->done, true);
  atomic_store(j->busy, 0); /* the snapshots are free (release: after every read of them) */
  return NULL;
}

/* Joins the writer (if any) and forgets the job; *step: the step it saved. */
static zck_status join(zck_saver *s, int64_t *step, char *msg, size_t cap) {
  zck__saver_job *j = s->job;
  if (!j) return ZCK_OK;
  if (!j->joined) pthread_join(j->thread, NULL);
  s->job = NULL;
  zck_status st = j->status;
  *step = j->step;
  snprintf(msg, cap, "%s", j->msg);
  zck__saver_job_free(j);
  return st;
}

void zck__saver_job_end(zck_saver *s) {
  /* ranks that are processes: rank 0's writer may wait for ranks that stopped */
  if (s->job) atomic_store(&s->job->abandon, true);
  int64_t step;
  char msg[1024];
  (void)join(s, &step, msg, sizeof msg);
}

zck_status zck_saver_drain(zck_saver *s) {
  int64_t step = 0;
  char msg[1024];
  zck_status st = join(s, &step, msg, sizeof msg);
  if (st != ZCK_OK) return zck__fail(st, "background save of step %lld: %s", (long long)step, msg);
  return ZCK_OK;
}

/* Rank 0, step 1 of a save of `next` (0: the flush at the end): the save before it. */
zck_status zck__saver_wait_previous(zck_saver *s, const zck_saver_rank *r0, int64_t next) {
  (void)r0;
  zck__saver_job *j = s->job;
  if (j && !atomic_load(&j->done)) {
    double t0 = zck__saver_now_s();
    int64_t prev = j->step;
    zck_status st = zck_saver_drain(s);
    if (next)
      zck__saver_note(s, "async save: the save of step %lld waited %.3f s for the one of step %lld, still being written",
           (long long)next, zck__saver_now_s() - t0, (long long)prev);
    else
      zck__saver_note(s, "async save: the end of training waited %.3f s for the save of step %lld", zck__saver_now_s() - t0,
           (long long)prev);
    return st;
  }
  return zck_saver_drain(s);
}

/* Rank 0, step 2: the job of the save of `step`, its writer not started: a copy of the
 * bookkeeping as it is now. */
zck_status zck__saver_prepare_job(zck_saver *s, const zck_saver_rank *r0, int64_t step) {
  /* the live bookkeeping records this checkpoint as the best now, as a synchronous save
   * does, so the evaluations and saves that follow see it */
  char *final = zck_saver_checkpoint_path(s, step, true);
  if (!final) return ZCK_ERR_NO_MEMORY;
  free(final);
  zck__saver_job *j = zck__calloc(1, sizeof *j);
  if (!j) return ZCK_ERR_NO_MEMORY;
  /* field by field: the other ranks are writing their slots of s->snaps meanwhile */
  j->copy.o = s->o;
  j->copy.tr = s->tr;
  j->copy.h = s->h;
  j->copy.best_metric = s->best_metric;
  j->copy.best_step = s->best_step;
  j->copy.log_history = cJSON_Duplicate(s->log_history, 1);
  j->model = zck_model_clone(s->tr.model);
  j->copy.tr.model = j->model;
  if (s->best_checkpoint) j->copy.best_checkpoint = zck__strdup(s->best_checkpoint);
  j->r0 = *r0;
  j->step = step;
  j->busy = &s->writer_busy;
  if (!j->copy.log_history || !j->model || (s->best_checkpoint && !j->copy.best_checkpoint)) {
    zck__saver_job_free(j);
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory for a background save");
  }
  s->job = j;
  return ZCK_OK;
}

/* Rank 0, after the collective that made the job: the writer starts only now, so the
 * other ranks are not kept waiting behind a thread that competes for the CPU from its first
 * instant. A thread that cannot start: the save is written here and now, as a synchronous
 * one (its outcome kept for the next join, like the writer's). */
void zck__saver_start_job(zck_saver *s) {
  zck__saver_job *j = s->job;
  atomic_store(&s->writer_busy, 1);
  if (!pthread_create(&j->thread, NULL, writer_main, j)) return;
  writer_main(j);
  j->thread = pthread_self();
  j->joined = true;
}

/* The ranks other than 0, step 1: a writer may still read the snapshots. Rare when the
 * saves are further apart than a write takes, so a short sleep between looks is enough. */
static void wait_writer_idle(const zck_saver *s) {
  while (atomic_load(&((zck_saver *)s)->writer_busy)) {
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
  }
}

zck_status zck__saver_save_async(zck_saver *s, const zck_saver_rank *r, int64_t step) {
  if (s->tr.per_rank) return zck__saver_save_async_ranks(s, r, step);
  ZCK_FAIL_IF(!s->h.snapshot, ZCK_ERR_INVALID_ARG, "async save: the trainer has no snapshot hook");
  zck_comm *c = r->comm;
  bool lead = c->rank == 0;
  zck_status st = ZCK_OK;
  if (lead) {
    st = zck__saver_wait_previous(s, r, step);
    if (st == ZCK_OK) st = zck__saver_prepare_job(s, r, step);
  } else {
    wait_writer_idle(s);
  }
  void *snap = NULL;
  if (st == ZCK_OK) st = s->h.snapshot(s->h.ctx, r->mem, &snap);
  s->snaps[c->rank] = snap; /* each rank its own slot */
  st = zck_comm_agree(c, st);
  if (!lead) return st;
  zck__saver_job *j = s->job;
  if (st != ZCK_OK) { /* never started: nothing was written */
    s->job = NULL;
    zck__saver_job_free(j);
    return st;
  }
  memcpy(j->copy.ranks, s->snaps, sizeof j->copy.ranks);
  j->r0.mem = s->snaps[0];
  zck__saver_start_job(s);
  return ZCK_OK;
}

zck_status zck_saver_flush(zck_saver *s, const zck_saver_rank *r) {
  if (!s->tr.async_save) return ZCK_OK;
  if (s->tr.per_rank) return zck__saver_flush_ranks(s, r);
  return zck__saver_collective(s, r, zck__saver_wait_previous, 0);
}
