/* exec_run.c: what a worker does with one batch (exec_internal.h): read its source bytes,
 * convert them to each target's dtype, write them, CRC what it read for verify on read and
 * what it wrote for the targets' CRCs; the prefetch of the next batch and the write-order
 * window that keeps writers' hash cursors close. */
#include "exec_internal.h"

#include <stdlib.h>
#include <string.h>
#include "hash_xxh3.h"

/* Counts finished bytes; the caller's progress callback may cancel the run. */
static zck_status report(exec_ctx *c, uint64_t bytes) {
  if (!c->o->progress) {
    return ZCK_OK;
  }
  pthread_mutex_lock(&c->lock);
  c->done += bytes;
  /* once asked to stop, the callback is not called again (other workers may still finish) */
  if (!c->canceled) c->canceled = c->o->progress(c->o->progress_ctx, c->done, c->total) != 0;
  bool stop = c->canceled;
  pthread_mutex_unlock(&c->lock);
  return stop ? zck__fail(ZCK_ERR_CANCELED, "canceled") : ZCK_OK;
}

/* Converts and writes count elements of one extent, whose source elements are at sp, to
 * target element doff on. Updates the extent CRC. */
static zck_status emit_run(exec_ctx *c, uint8_t *cbuf, size_t job, const zck_extent *e, const void *sp, uint64_t doff,
                           uint64_t count, uint32_t *crc) {
  const zck_exec_job *j = &c->jobs[job];
  const zck_store *S = &j->src[e->src_store], *D = &j->dst[e->dst_store];
  size_t ds = zck_dtype_size(D->dtype), ss = zck_dtype_size(S->dtype);
  if (D->kind == ZCK_STORE_MEMORY) {
    uint8_t *dp = (uint8_t *)D->mem + doff * ds;
    ZCK_TRY(zck_convert(D->dtype, dp, S->dtype, sp, (size_t)count));
    if (crc) *crc = zck_crc32_update(*crc, dp, (size_t)(count * ds));
    if (c->o->written) c->o->written(c->o->written_ctx, job, e->dst_store, doff, count, dp, (size_t)(count * ds));
    return ZCK_OK;
  }
  if (D->dtype == S->dtype) {
    ZCK_TRY(zck__store_write(D, e->dst_store, sp, doff, count));
    if (crc) *crc = zck_crc32_update(*crc, sp, (size_t)(count * ds));
    if (c->o->written) c->o->written(c->o->written_ctx, job, e->dst_store, doff, count, sp, (size_t)(count * ds));
    return ZCK_OK;
  }
  uint64_t step = c->half / ds;
  const uint8_t *s8 = sp;
  for (uint64_t k = 0; k < count; k += step) {
    if (atomic_load_explicit(&c->failed, memory_order_relaxed)) return ZCK_OK;
    uint64_t n = count - k < step ? count - k : step;
    ZCK_TRY(zck_convert(D->dtype, cbuf, S->dtype, s8 + k * ss, (size_t)n));
    ZCK_TRY(zck__store_write(D, e->dst_store, cbuf, doff + k, n));
    if (crc) *crc = zck_crc32_update(*crc, cbuf, (size_t)(n * ds));
    if (c->o->written) c->o->written(c->o->written_ctx, job, e->dst_store, doff + k, n, cbuf, (size_t)(n * ds));
  }
  return ZCK_OK;
}

/* Converts and writes count elements of extent ei, whose source elements are at sp,
 * starting at element `at` of the extent: one run of the target, or of a strided extent
 * (its source side contiguous: exec.c cut the others into runs) one write per run met. */
static zck_status emit(exec_ctx *c, uint8_t *cbuf, size_t job, size_t ei, const void *sp, uint64_t at, uint64_t count,
                       uint32_t *crc) {
  const zck_exec_job *j = &c->jobs[job];
  const zck_extent *e = &j->plan->ext[ei];
  if (!zck_extent_strided(e)) return emit_run(c, cbuf, job, e, sp, e->dst_off + at, count, crc);
  size_t ss = zck_dtype_size(j->src[e->src_store].dtype);
  const uint8_t *s8 = sp;
  while (count) {
    uint64_t n = e->run - at % e->run;
    if (n > count) n = count;
    ZCK_TRY(emit_run(c, cbuf, job, e, s8, zck_extent_dst_at(e, at), n, crc));
    if (atomic_load_explicit(&c->failed, memory_order_relaxed)) return ZCK_OK;
    s8 += n * ss;
    at += n;
    count -= n;
  }
  return ZCK_OK;
}

/* Does the store's source need its reads CRC'd (a record to check)? */
static bool checks_record(const exec_ctx *c, const zck_store *S) {
  return c->verify && S->record && (S->kind == ZCK_STORE_SOURCE || S->kind == ZCK_STORE_FD);
}

static void set_piece(exec_ctx *c, size_t bi, const zck_store *S, uint64_t elem_lo, uint64_t elem_hi, uint32_t crc) {
  size_t ss = zck_dtype_size(S->dtype);
  c->pieces[bi] = (read_piece){S->base + elem_lo * ss, S->base + elem_hi * ss, crc, true};
}

/* A stream batch: the whole store [lo, hi) read in order, one chunk at a time; each
 * extent (sorted by source offset) gets its piece of every chunk it overlaps. Hashes the
 * store (XXH3) and its bytes (CRC) on the way. */
static zck_status run_stream(exec_ctx *c, size_t bi, unsigned thread) {
  const batch *b = &c->batches[bi];
  const zck_exec_job *j = &c->jobs[b->job];
  const zck_extent *ext = j->plan->ext;
  const zck_store *S = &j->src[ext[b->order[0]].src_store];
  size_t ss = zck_dtype_size(S->dtype);
  uint32_t *ext_crc = c->js[b->job].ext_crc;
  if (!c->bufs[thread] && !(c->bufs[thread] = zck__malloc(c->staging))) return ZCK_ERR_NO_MEMORY;
  uint8_t *rbuf = c->bufs[thread], *cbuf = rbuf + c->half;
  XXH3_state_t *xs = XXH3_createState();
  if (!xs) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  XXH3_64bits_reset(xs);
  uint64_t step = c->half / ss;
  uint32_t crc = 0;
  size_t first = 0;
  zck_status st = ZCK_OK;
  for (uint64_t k = b->lo; st == ZCK_OK && k < b->hi; k += step) {
    if (atomic_load_explicit(&c->failed, memory_order_relaxed)) break;
    uint64_t n = b->hi - k < step ? b->hi - k : step, end = k + n, bytes = 0;
    st = zck__store_read(S, ext[b->order[0]].src_store, rbuf, k, n);
    if (st != ZCK_OK) break;
    if (end < b->hi) zck__store_prefetch(S, end, b->hi - end < step ? b->hi - end : step);
    zck__hash_sliced(xs, &crc, rbuf, (size_t)(n * ss));
    for (size_t i = first; st == ZCK_OK && i < b->n; i++) {
      size_t ei = b->order[i];
      const zck_extent *e = &ext[ei];
      if (e->src_off >= end) break;
      uint64_t s0 = e->src_off > k ? e->src_off : k, s1 = e->src_off + e->count < end ? e->src_off + e->count : end;
      if (s1 <= s0) continue;
      st = emit(c, cbuf, b->job, ei, rbuf + (s0 - k) * ss, s0 - e->src_off, s1 - s0, ext_crc ? &ext_crc[ei] : NULL);
      bytes += (s1 - s0) * zck_dtype_size(j->dst[e->dst_store].dtype);
    }
    while (first < b->n && ext[b->order[first]].src_off + ext[b->order[first]].count <= end) first++;
    st = report(c, bytes);
  }
  uint64_t got = XXH3_64bits_digest(xs);
  XXH3_freeState(xs);
  if (st != ZCK_OK || atomic_load_explicit(&c->failed, memory_order_relaxed)) return st;
  if (got != S->xxh3) {
    char lb[64];
    return zck__fail(ZCK_ERR_DAMAGED, "%s: XXH3-64 mismatch with " "zckpt-manifest.json (stored %016llx, read %016llx)",
                     zck__store_label(S, lb, sizeof lb, "source", ext[b->order[0]].src_store), (unsigned long long)S->xxh3,
                     (unsigned long long)got);
  }
  if (checks_record(c, S)) set_piece(c, bi, S, b->lo, b->hi, crc);
  return ZCK_OK;
}

static zck_status run_batch_inner(exec_ctx *c, size_t bi, unsigned thread) {
  const batch *b = &c->batches[bi];
  if (b->order) return run_stream(c, bi, thread);
  const zck_exec_job *j = &c->jobs[b->job];
  const zck_extent *e0 = &j->plan->ext[b->first];
  const zck_store *S = &j->src[e0->src_store];
  size_t ss = zck_dtype_size(S->dtype);
  uint32_t *ext_crc = c->js[b->job].ext_crc;
  bool vr = checks_record(c, S);
  uint64_t bytes = 0;
  for (size_t i = 0; i < b->n; i++) {
    const zck_extent *e = &j->plan->ext[b->first + i];
    bytes += e->count * zck_dtype_size(j->dst[e->dst_store].dtype);
  }
  if (S->kind == ZCK_STORE_MEMORY) { /* no staging for the source side */
    for (size_t i = 0; i < b->n; i++) {
      const zck_extent *e = &j->plan->ext[b->first + i];
      uint32_t crc = 0;
      if (!c->bufs[thread] && j->dst[e->dst_store].dtype != S->dtype && j->dst[e->dst_store].kind != ZCK_STORE_MEMORY)
        if (!(c->bufs[thread] = zck__malloc(c->staging))) return ZCK_ERR_NO_MEMORY;
      ZCK_TRY(emit(c, c->bufs[thread] ? c->bufs[thread] + c->half : NULL, b->job, b->first + i,
                   (const uint8_t *)S->mem + e->src_off * ss, 0, e->count, ext_crc ? &crc : NULL));
      if (ext_crc) ext_crc[b->first + i] = crc;
    }
    ZCK_TRY(report(c, bytes));
    return ZCK_OK;
  }
  if (!c->bufs[thread] && !(c->bufs[thread] = zck__malloc(c->staging))) return ZCK_ERR_NO_MEMORY;
  uint8_t *rbuf = c->bufs[thread], *cbuf = rbuf + c->half;
  if ((b->hi - b->lo) * ss <= c->half) { /* one read for the whole batch */
    const zck_store *D = &j->dst[e0->dst_store];
    if (b->n == 1 && D->kind == ZCK_STORE_MEMORY && D->dtype == S->dtype && !ext_crc && !c->o->written &&
        !zck_extent_strided(e0)) {
      uint8_t *dp = (uint8_t *)D->mem + e0->dst_off * zck_dtype_size(D->dtype);
      ZCK_TRY(zck__store_read(S, e0->src_store, dp, e0->src_off, e0->count));
      if (vr) set_piece(c, bi, S, b->lo, b->hi, zck_crc32_update(0, dp, (size_t)(e0->count * ss)));
      ZCK_TRY(report(c, bytes));
      return ZCK_OK;
    }
    ZCK_TRY(zck__store_read(S, e0->src_store, rbuf, b->lo, b->hi - b->lo));
    if (vr) set_piece(c, bi, S, b->lo, b->hi, zck_crc32_update(0, rbuf, (size_t)((b->hi - b->lo) * ss)));
    for (size_t i = 0; i < b->n; i++) {
      const zck_extent *e = &j->plan->ext[b->first + i];
      uint32_t crc = 0;
      ZCK_TRY(emit(c, cbuf, b->job, b->first + i, rbuf + (e->src_off - b->lo) * ss, 0, e->count,
                   ext_crc ? &crc : NULL));
      if (ext_crc) ext_crc[b->first + i] = crc;
    }
    ZCK_TRY(report(c, bytes));
    return ZCK_OK;
  }
  /* one long extent, streamed */
  uint64_t step = c->half / ss;
  uint32_t crc = 0, rcrc = 0;
  size_t dsz = zck_dtype_size(j->dst[e0->dst_store].dtype);
  for (uint64_t k = 0; k < e0->count; k += step) {
    if (atomic_load_explicit(&c->failed, memory_order_relaxed)) return ZCK_OK;
    uint64_t n = e0->count - k < step ? e0->count - k : step;
    ZCK_TRY(zck__store_read(S, e0->src_store, rbuf, e0->src_off + k, n));
    if (k + n < e0->count) zck__store_prefetch(S, e0->src_off + k + n, e0->count - k - n < step ? e0->count - k - n : step);
    if (vr) rcrc = zck_crc32_update(rcrc, rbuf, (size_t)(n * ss));
    ZCK_TRY(emit(c, cbuf, b->job, b->first, rbuf, k, n, ext_crc ? &crc : NULL));
    ZCK_TRY(report(c, n * dsz));
  }
  if (ext_crc) ext_crc[b->first] = crc;
  if (vr) set_piece(c, bi, S, b->lo, b->hi, rcrc);
  return ZCK_OK;
}

/* Workers take batches in index order: batch bi is the next one a worker starts, and its
 * first read can begin now, while the running ones are checked and written. */
static void prefetch_batch(const exec_ctx *c, size_t bi) {
  if (bi >= c->n_batches) return;
  const batch *b = &c->batches[bi];
  const zck_exec_job *j = &c->jobs[b->job];
  const zck_store *S = &j->src[j->plan->ext[b->order ? b->order[0] : b->first].src_store];
  size_t ss = zck_dtype_size(S->dtype);
  uint64_t step = ss ? c->half / ss : 0;
  zck__store_prefetch(S, b->lo, b->hi - b->lo < step ? b->hi - b->lo : step);
}

/* Workers take batches in index order, so the oldest unfinished one is always running:
 * a wait here ends when it finishes (or the run fails). */
static void window_enter(exec_ctx *c, size_t item) {
  pthread_mutex_lock(&c->win_lock);
  while (c->start[item] - c->start[c->oldest] > c->window && !atomic_load(&c->failed))
    pthread_cond_wait(&c->win_cv, &c->win_lock);
  pthread_mutex_unlock(&c->win_lock);
}

static void window_leave(exec_ctx *c, size_t item) {
  pthread_mutex_lock(&c->win_lock);
  c->finished[item] = 1;
  while (c->oldest < c->n_batches && c->finished[c->oldest]) c->oldest++;
  pthread_cond_broadcast(&c->win_cv);
  pthread_mutex_unlock(&c->win_lock);
}

zck_status zck__exec_run_batch(void *ctx, size_t item, unsigned thread) {
  exec_ctx *c = ctx;
  if (c->start) window_enter(c, item);
  zck_status s = ZCK_OK;
  if (!atomic_load_explicit(&c->failed, memory_order_relaxed)) {
    prefetch_batch(c, item + 1);
    s = run_batch_inner(c, item, thread);
  }
  if (s != ZCK_OK) atomic_store(&c->failed, 1);
  if (c->start) window_leave(c, item);
  return s;
}
