/* save_async.c: saves written in the background (saver.h: async_save), for ranks that are
 * threads of one process.
 *
 * A save of step N, collective:
 *  1. rank 0 waits for the save before it (at most one in flight; a wait is said in the
 *     log), and its failure becomes every rank's;
 *  2. every rank snapshots what the save reads (the snapshot hook: host copies of its
 *     partitions, and rank 0's 16-bit copies) and registers the snapshot as its memory;
 *  3. rank 0 starts the writer thread, and every rank goes back to training.
 * The writer runs a synchronous save's own work (zck__saver_save_rank0) over the snapshots:
 * the same files, the same bytes, hashed as written; checkpoint-N/ is built under a
 * temporary name with its `latest` inside and renamed into place last, then rotation. A
 * crash before that rename leaves a temporary folder only (the next save sweeps it), and
 * the newest checkpoint-M/ stays the complete one a resume picks.
 *
 * Who owns what:
 *  - each rank thread: its snapshot while it takes it (step 2); the writer reads it until
 *    the next save's step 1, and nothing changes it meanwhile;
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

typedef struct zck__saver_job {
  pthread_t thread;
  zck_saver copy;              /* the bookkeeping of step N, the snapshots in copy.ranks */
  zck_model *model;            /* copy.tr.model: the manifest's clone */
  zck_saver_rank r0;           /* rank 0's snapshot, its optimizer step */
  int64_t step;
  zck_status status;           /* the writer's outcome (read after the join) */
  char msg[1024];
  atomic_bool done;            /* the writer has finished (a join will not wait) */
} zck__saver_job;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void note(const zck_saver *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(const zck_saver *s, const char *fmt, ...) {
  if (!s->h.note) return;
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  s->h.note(s->h.ctx, line);
}

static void job_free(zck__saver_job *j) {
  if (!j) return;
  free(j->copy.best_checkpoint);
  cJSON_Delete(j->copy.log_history);
  zck_model_free(j->model);
  free(j);
}

static void *writer_main(void *arg) {
  zck__saver_job *j = arg;
  j->status = zck__saver_save_rank0(&j->copy, &j->r0, j->step);
  if (j->status != ZCK_OK) snprintf(j->msg, sizeof j->msg, "%s", zck_last_error());
  atomic_store(&j->done, true);
  return NULL;
}

/* Joins the writer (if any) and forgets the job; *step: the step it saved. */
static zck_status join(zck_saver *s, int64_t *step, char *msg, size_t cap) {
  zck__saver_job *j = s->job;
  if (!j) return ZCK_OK;
  pthread_join(j->thread, NULL);
  s->job = NULL;
  zck_status st = j->status;
  *step = j->step;
  snprintf(msg, cap, "%s", j->msg);
  job_free(j);
  return st;
}

void zck__saver_job_end(zck_saver *s) {
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
static zck_status wait_previous(zck_saver *s, const zck_saver_rank *r0, int64_t next) {
  (void)r0;
  zck__saver_job *j = s->job;
  if (j && !atomic_load(&j->done)) {
    double t0 = now_s();
    int64_t prev = j->step;
    zck_status st = zck_saver_drain(s);
    if (next)
      note(s, "async save: the save of step %lld waited %.3f s for the one of step %lld, still being written",
           (long long)next, now_s() - t0, (long long)prev);
    else
      note(s, "async save: the end of training waited %.3f s for the save of step %lld", now_s() - t0,
           (long long)prev);
    return st;
  }
  return zck_saver_drain(s);
}

/* Rank 0, step 3: the writer of `step`, over the snapshots every rank registered. */
static zck_status start_writer(zck_saver *s, const zck_saver_rank *r0, int64_t step) {
  /* the live bookkeeping records this checkpoint as the best now, as a synchronous save
   * does, so the evaluations and saves that follow see it */
  char *final = zck_saver_checkpoint_path(s, step, true);
  if (!final) return ZCK_ERR_NO_MEMORY;
  free(final);
  zck__saver_job *j = zck__calloc(1, sizeof *j);
  if (!j) return ZCK_ERR_NO_MEMORY;
  j->copy = *s;
  j->copy.job = NULL;
  j->copy.best_state = NULL;
  j->copy.best_checkpoint = NULL;
  j->copy.log_history = cJSON_Duplicate(s->log_history, 1);
  j->model = zck_model_clone(s->tr.model);
  j->copy.tr.model = j->model;
  if (s->best_checkpoint) j->copy.best_checkpoint = zck__strdup(s->best_checkpoint);
  j->r0 = *r0;
  j->step = step;
  if (!j->copy.log_history || !j->model || (s->best_checkpoint && !j->copy.best_checkpoint)) {
    job_free(j);
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory for a background save");
  }
  if (pthread_create(&j->thread, NULL, writer_main, j)) {
    job_free(j);
    return zck__fail(ZCK_ERR_INTERNAL, "cannot start the background writer of step %lld", (long long)step);
  }
  s->job = j;
  return ZCK_OK;
}

zck_status zck__saver_save_async(zck_saver *s, const zck_saver_rank *r, int64_t step) {
  ZCK_FAIL_IF(!s->h.snapshot, ZCK_ERR_INVALID_ARG, "async save: the trainer has no snapshot hook");
  ZCK_TRY(zck__saver_collective(s, r, wait_previous, step));
  /* nothing reads this rank's snapshot now: the writer that did has been joined */
  void *snap = NULL;
  zck_status st = s->h.snapshot(s->h.ctx, r->mem, &snap);
  ZCK_TRY(zck_comm_agree(r->comm, st));
  zck_saver_rank rs = *r;
  rs.mem = snap;
  return zck__saver_collective(s, &rs, start_writer, step);
}

zck_status zck_saver_flush(zck_saver *s, const zck_saver_rank *r) {
  if (!s->tr.async_save) return ZCK_OK;
  return zck__saver_collective(s, r, wait_previous, 0);
}
