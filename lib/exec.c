/* exec.c: the executor's entry points: runs copy plans (read, convert, write) on the
 * thread pool with one bounded staging buffer per thread, checking what it reads (verify
 * on read) and CRCing what it writes. The steps live one per file (exec_internal.h).
 *
 * Work is cut into batches: runs of consecutive extents (in plan order) reading one
 * source store front to back with small gaps, spanning at most half a staging buffer, so
 * one pread serves many small tensors. An extent longer than that is a batch of its own,
 * streamed in chunks. The other half of the buffer receives dtype conversions. A store
 * with an XXH3 to check is one "stream" batch: read whole, in order, every extent reading
 * it served from the chunks as they pass (verify_first: such stores are hashed in a pass
 * of their own before the copy, which then batches them like any other).
 *
 * When every target store has a write order (exec.h), the batches run in it across jobs
 * (workers take them in index order), each batch one stretch of it, and a worker waits
 * before starting a batch more than a window of target bytes after the oldest unfinished
 * one: writers that hash as they write get their files nearly front to back.
 *
 * Every read of a store with a record to check leaves one piece (byte range, CRC-32) in
 * its batch's slot; after the run the pieces of each record are sorted, the bytes between
 * them read, the CRCs combined and compared (exec_verify.c). */
#include "exec_internal.h"
#include "dist.h"

#include "threadpool.h"

#include <stdlib.h>
#include <string.h>

/* A distributed job's copy is shared by its ranks (exec_dist.c), each running its share here. */
zck_status zck_exec_run(const zck_exec_job *jobs, size_t n_jobs, const zck_exec_opts *opts) {
  if (zck__dist_on()) return zck__exec_run_dist(jobs, n_jobs, opts);
  return zck__exec_run_here(jobs, n_jobs, opts);
}

/* The jobs as the steps take them: a strided extent whose source side is not contiguous,
 * or any strided extent of a job that wants its targets' CRCs (assembled extent by extent
 * in target order), cut into one extent per run. *cut[j] is the plan made for job j, else
 * NULL; *out is jobs itself when none was cut. */
static zck_status cut_runs(const zck_exec_job *jobs, size_t n_jobs, zck_exec_job **out, zck_plan ***cut) {
  *out = (zck_exec_job *)jobs;
  *cut = NULL;
  for (size_t jn = 0; jn < n_jobs; jn++) {
    zck_plan *q;
    ZCK_TRY(zck_plan_unstride(jobs[jn].plan, jobs[jn].dst_crc32 != NULL, &q));
    if (!q) continue;
    if (!*cut) {
      *cut = zck__calloc(n_jobs, sizeof **cut);
      *out = *cut ? zck__malloc(n_jobs * sizeof **out) : NULL;
      if (!*out) {
        zck_plan_free(q);
        free(*cut);
        *cut = NULL;
        *out = (zck_exec_job *)jobs;
        return ZCK_ERR_NO_MEMORY;
      }
      memcpy(*out, jobs, n_jobs * sizeof **out);
    }
    (*cut)[jn] = q;
    (*out)[jn].plan = q;
  }
  return ZCK_OK;
}

static void free_cut(const zck_exec_job *jobs, zck_exec_job *cut_jobs, zck_plan **cut, size_t n_jobs) {
  if (!cut) return;
  for (size_t jn = 0; jn < n_jobs; jn++) zck_plan_free(cut[jn]);
  free(cut);
  if (cut_jobs != jobs) free(cut_jobs);
}

zck_status zck__exec_run_here(const zck_exec_job *given, size_t n_jobs, const zck_exec_opts *opts) {
  static const zck_exec_opts defaults = ZCK_EXEC_OPTS_INIT;
  zck_exec_job *jobs;
  zck_plan **cut;
  ZCK_TRY(cut_runs(given, n_jobs, &jobs, &cut));
  exec_ctx c;
  memset(&c, 0, sizeof c);
  c.jobs = jobs;
  c.n_jobs = n_jobs;
  c.o = opts ? opts : &defaults;
  c.staging = c.o->staging_bytes ? c.o->staging_bytes : ZCK_EXEC_DEFAULT_STAGING;
  if (c.staging < 64) c.staging = 64;
  c.half = (c.staging / 2) & ~(size_t)15;
  c.verify = !c.o->no_verify;
  atomic_init(&c.failed, 0);
  zck_status s = ZCK_OK;
  c.js = zck__calloc(n_jobs ? n_jobs : 1, sizeof *c.js);
  if (!c.js) {
    free_cut(given, jobs, cut, n_jobs);
    return ZCK_ERR_NO_MEMORY;
  }
  for (size_t jn = 0; jn < n_jobs && s == ZCK_OK; jn++) {
    s = zck__exec_check_job(&jobs[jn], jn, &c.total);
    if (s == ZCK_OK && jobs[jn].dst_crc32) s = zck__exec_prepare_crc(&jobs[jn], jn, &c.js[jn]);
  }
  if (s == ZCK_OK && c.verify && c.o->verify_first) s = zck__exec_verify_xxh3_first(&c);
  if (s == ZCK_OK) s = zck__exec_make_batches(&c);
  if (s == ZCK_OK) s = zck__exec_order_batches(&c);
  unsigned workers = zck__worker_count(c.n_batches, c.o->threads);
  c.n_workers = workers;
  if (s == ZCK_OK && !(c.bufs = zck__calloc(workers ? workers : 1, sizeof *c.bufs))) s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK && c.verify && !(c.pieces = zck__calloc(c.n_batches ? c.n_batches : 1, sizeof *c.pieces)))
    s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) {
    pthread_mutex_init(&c.lock, NULL);
    pthread_mutex_init(&c.win_lock, NULL);
    pthread_cond_init(&c.win_cv, NULL);
    s = zck__parallel_for(c.n_batches, workers, zck__exec_run_batch, &c);
    pthread_cond_destroy(&c.win_cv);
    pthread_mutex_destroy(&c.win_lock);
    pthread_mutex_destroy(&c.lock);
  }
  if (s == ZCK_OK && c.verify) s = zck__exec_verify_records(&c);
  if (s == ZCK_OK)
    for (size_t jn = 0; jn < n_jobs; jn++)
      if (jobs[jn].dst_crc32) zck__exec_assemble_crc(&jobs[jn], &c.js[jn]);
  if (c.bufs)
    for (unsigned i = 0; i < workers; i++) free(c.bufs[i]);
  free(c.bufs);
  free(c.batches);
  free(c.order_arena);
  free(c.pieces);
  free(c.start);
  free(c.finished);
  for (size_t jn = 0; jn < n_jobs; jn++) {
    free(c.js[jn].ext_crc);
    free(c.js[jn].crc_order);
  }
  free(c.js);
  free_cut(given, jobs, cut, n_jobs);
  return s;
}

zck_status zck_exec_plan(const zck_plan *plan, const zck_store *src, const zck_store *dst, uint32_t *dst_crc32,
                         const zck_exec_opts *opts) {
  zck_exec_job j = {plan, src, dst, dst_crc32};
  return zck_exec_run(&j, 1, opts);
}
