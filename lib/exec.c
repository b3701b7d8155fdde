/* exec.c: runs copy plans (read, convert, write) on the thread pool with one bounded
 * staging buffer per thread; checksums of what it read (verify on read) and wrote;
 * read-back hashing.
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
 * them read, the CRCs combined and compared (verify_records). */
#include "exec.h"
#include "dist.h"

#include "threadpool.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hash_xxh3.h"
#include <zlib.h>

/* Source bytes between two extents that are read and dropped rather than split the read. */
#define ZCK__GAP_BYTES 4096

// ---- CRC helpers

/* Up to this many bytes, the CRC of zeros is computed, not derived: a small tensor's
 * piece (tens of bytes, 100k of them) costs two short CRC runs instead of zlib's
 * polynomial powers (about 1000 instructions a combine). */
#define ZCK__CRC_SHORT 256
static const uint8_t zck__crc_zeros[ZCK__CRC_SHORT];

uint32_t zck_crc32_combine(uint32_t a, uint32_t b, uint64_t len_b) {
  /* CRC-32 is affine: crc(A || B) = crc_a(0^n) ^ crc_0(0^n) ^ crc(B) over n zero bytes */
  if (len_b <= ZCK__CRC_SHORT)
    return zck_crc32_update(a, zck__crc_zeros, (size_t)len_b) ^ zck_crc32_update(0, zck__crc_zeros, (size_t)len_b) ^ b;
  return (uint32_t)crc32_combine(a, b, (z_off_t)len_b);
}

uint32_t zck_crc32_zeros(uint64_t n) {
  if (n <= ZCK__CRC_SHORT) return zck_crc32_update(0, zck__crc_zeros, (size_t)n);
  static const uint8_t zero = 0;
  uint32_t res = 0, unit = (uint32_t)crc32(0, &zero, 1);
  uint64_t unit_len = 1;
  while (n) {
    if (n & 1) res = zck_crc32_combine(res, unit, unit_len);
    n >>= 1;
    if (n) {
      unit = zck_crc32_combine(unit, unit, unit_len);
      unit_len <<= 1;
    }
  }
  return res;
}

static uint32_t crc_update(uint32_t crc, const void *p, size_t n) { return zck_crc32_update(crc, p, n); }

/* XXH3 (st may be NULL) and CRC-32 (crc may be NULL) of n bytes, one 64 KiB slice at a
 * time: the second hash reads the slice from the cache, not the staging buffer (megabytes)
 * from memory again. */
#define ZCK__HASH_SLICE ((size_t)64 << 10)
static void hash_sliced(XXH3_state_t *st, uint32_t *crc, const uint8_t *p, size_t n) {
  for (size_t k = 0; k < n; k += ZCK__HASH_SLICE) {
    size_t m = n - k < ZCK__HASH_SLICE ? n - k : ZCK__HASH_SLICE;
    if (st) XXH3_64bits_update(st, p + k, m);
    if (crc) *crc = zck_crc32_update(*crc, p + k, m);
  }
}

// ---- execution context

typedef struct batch {
  uint32_t job;
  size_t first, n;       /* extents [first, first + n) of the job's plan */
  uint64_t lo, hi;       /* source element span */
  size_t *order;         /* stream batch: its n extents' indices, by source offset; else NULL */
} batch;

/* What one batch read of a store whose record is checked: absolute bytes and their CRC. */
typedef struct read_piece {
  uint64_t lo, hi;
  uint32_t crc;
  bool set;
} read_piece;

typedef struct job_state {
  uint32_t *ext_crc;     /* per extent, when the job wants CRCs */
  size_t *crc_order;     /* extents sorted by (dst_store, dst_off) */
} job_state;

typedef struct exec_ctx {
  const zck_exec_job *jobs;
  size_t n_jobs;
  job_state *js;
  batch *batches;
  size_t n_batches;
  size_t *order_arena;   /* stream batches' extent lists */
  bool verify;           /* check records and XXH3s (not opts->no_verify) */
  read_piece *pieces;    /* [n_batches] when verify */
  size_t staging, half;
  uint8_t **bufs;        /* [workers], allocated by each worker on first use */
  unsigned n_workers;
  const zck_exec_opts *o;
  atomic_int failed;
  pthread_mutex_t lock;
  uint64_t done, total;  /* bytes written, under lock */
  bool canceled;         /* the progress callback asked to stop, under lock */
  /* batches in their targets' write order (order_batches): a worker starts batch i only
   * within `window` target bytes of the oldest batch not finished, so what is written
   * ahead of a file's hash cursor stays bounded even when hashing is slower than writing */
  uint64_t *start;       /* [n_batches + 1]: target bytes before each batch; NULL: no window */
  uint64_t window;
  uint8_t *finished;     /* [n_batches], under win_lock */
  size_t oldest;         /* the first batch not finished, under win_lock */
  pthread_mutex_t win_lock;
  pthread_cond_t win_cv;
} exec_ctx;

static const char *store_label(const zck_store *s, char *buf, size_t cap, const char *side, uint32_t id) {
  if (s->name) return s->name;
  snprintf(buf, cap, "%s store %u", side, id);
  return buf;
}

/* ---- store access: read count elements at element off into dst (src dtype bytes) */
static zck_status store_read(const zck_store *s, uint32_t id, void *dst, uint64_t off, uint64_t count) {
  size_t es = zck_dtype_size(s->dtype);
  size_t nb = (size_t)(count * es);
  char lb[64];
  switch (s->kind) {
  case ZCK_STORE_MEMORY: memcpy(dst, (const uint8_t *)s->mem + off * es, nb); return ZCK_OK;
  case ZCK_STORE_SOURCE: return zck__source_read(s->source, dst, nb, s->base + off * es);
  case ZCK_STORE_FD: return zck__pread_all(s->fd, dst, nb, s->base + off * es, store_label(s, lb, sizeof lb, "source", id));
  case ZCK_STORE_CALLBACK: {
    zck_status st = s->read(s->ctx, dst, off, count);
    if (st != ZCK_OK && s->name) return zck__error_prepend(st, "%s", s->name);
    return st;
  }
  default: return zck__fail(ZCK_ERR_INTERNAL, "reading an unbound store");
  }
}

/* Asks the kernel to start reading elements [off, off + count) of a file store now, so the
 * disk fetches the next piece while this thread checks, converts and writes the one it
 * has: the checks then cost CPU beside the I/O, not after it. A hint: nothing fails. */
static void store_prefetch(const zck_store *s, uint64_t off, uint64_t count) {
#ifdef POSIX_FADV_WILLNEED
  size_t es = zck_dtype_size(s->dtype);
  int fd = -1;
  uint64_t at = s->base + off * es;
  if (s->kind == ZCK_STORE_SOURCE && s->source->fd >= 0) fd = s->source->fd, at += s->source->base;
  else if (s->kind == ZCK_STORE_FD) fd = s->fd;
  if (fd >= 0 && count) (void)posix_fadvise(fd, (off_t)at, (off_t)(count * es), POSIX_FADV_WILLNEED);
#else
  (void)s, (void)off, (void)count;
#endif
}

static zck_status store_write(const zck_store *s, uint32_t id, const void *src, uint64_t off, uint64_t count) {
  size_t es = zck_dtype_size(s->dtype);
  size_t nb = (size_t)(count * es);
  char lb[64];
  switch (s->kind) {
  case ZCK_STORE_MEMORY: memmove((uint8_t *)s->mem + off * es, src, nb); return ZCK_OK;
  case ZCK_STORE_FD: return zck__pwrite_all(s->fd, src, nb, s->base + off * es, store_label(s, lb, sizeof lb, "target", id));
  case ZCK_STORE_CALLBACK: {
    zck_status st = s->write(s->ctx, src, off, count);
    if (st != ZCK_OK && s->name) return zck__error_prepend(st, "%s", s->name);
    return st;
  }
  default: return zck__fail(ZCK_ERR_INTERNAL, "writing a store that cannot be written");
  }
}

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

/* Converts and writes count elements of one extent whose source elements are at sp,
 * starting at element `at` of the extent. Updates the extent CRC. */
static zck_status emit(exec_ctx *c, uint8_t *cbuf, size_t job, size_t ei, const void *sp, uint64_t at, uint64_t count,
                       uint32_t *crc) {
  const zck_exec_job *j = &c->jobs[job];
  const zck_extent *e = &j->plan->ext[ei];
  const zck_store *S = &j->src[e->src_store], *D = &j->dst[e->dst_store];
  size_t ds = zck_dtype_size(D->dtype), ss = zck_dtype_size(S->dtype);
  uint64_t doff = e->dst_off + at;
  if (D->kind == ZCK_STORE_MEMORY) {
    uint8_t *dp = (uint8_t *)D->mem + doff * ds;
    ZCK_TRY(zck_convert(D->dtype, dp, S->dtype, sp, (size_t)count));
    if (crc) *crc = crc_update(*crc, dp, (size_t)(count * ds));
    if (c->o->written) c->o->written(c->o->written_ctx, job, e->dst_store, doff, count, dp, (size_t)(count * ds));
    return ZCK_OK;
  }
  if (D->dtype == S->dtype) {
    ZCK_TRY(store_write(D, e->dst_store, sp, doff, count));
    if (crc) *crc = crc_update(*crc, sp, (size_t)(count * ds));
    if (c->o->written) c->o->written(c->o->written_ctx, job, e->dst_store, doff, count, sp, (size_t)(count * ds));
    return ZCK_OK;
  }
  uint64_t step = c->half / ds;
  const uint8_t *s8 = sp;
  for (uint64_t k = 0; k < count; k += step) {
    if (atomic_load_explicit(&c->failed, memory_order_relaxed)) return ZCK_OK;
    uint64_t n = count - k < step ? count - k : step;
    ZCK_TRY(zck_convert(D->dtype, cbuf, S->dtype, s8 + k * ss, (size_t)n));
    ZCK_TRY(store_write(D, e->dst_store, cbuf, doff + k, n));
    if (crc) *crc = crc_update(*crc, cbuf, (size_t)(n * ds));
    if (c->o->written) c->o->written(c->o->written_ctx, job, e->dst_store, doff + k, n, cbuf, (size_t)(n * ds));
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
    st = store_read(S, ext[b->order[0]].src_store, rbuf, k, n);
    if (st != ZCK_OK) break;
    if (end < b->hi) store_prefetch(S, end, b->hi - end < step ? b->hi - end : step);
    hash_sliced(xs, &crc, rbuf, (size_t)(n * ss));
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
                     store_label(S, lb, sizeof lb, "source", ext[b->order[0]].src_store), (unsigned long long)S->xxh3,
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
    if (b->n == 1 && D->kind == ZCK_STORE_MEMORY && D->dtype == S->dtype && !ext_crc && !c->o->written) {
      uint8_t *dp = (uint8_t *)D->mem + e0->dst_off * zck_dtype_size(D->dtype);
      ZCK_TRY(store_read(S, e0->src_store, dp, e0->src_off, e0->count));
      if (vr) set_piece(c, bi, S, b->lo, b->hi, zck_crc32_update(0, dp, (size_t)(e0->count * ss)));
      ZCK_TRY(report(c, bytes));
      return ZCK_OK;
    }
    ZCK_TRY(store_read(S, e0->src_store, rbuf, b->lo, b->hi - b->lo));
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
    ZCK_TRY(store_read(S, e0->src_store, rbuf, e0->src_off + k, n));
    if (k + n < e0->count) store_prefetch(S, e0->src_off + k + n, e0->count - k - n < step ? e0->count - k - n : step);
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
  store_prefetch(S, b->lo, b->hi - b->lo < step ? b->hi - b->lo : step);
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

static zck_status run_batch(void *ctx, size_t item, unsigned thread) {
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

// ---- validation before any byte moves

static zck_status check_store_range(const zck_store *s, uint32_t id, const char *side, uint64_t off, uint64_t count,
                                    const zck_extent *e) {
  char lb[64];
  const char *name = store_label(s, lb, sizeof lb, side, id);
  uint64_t end;
  ZCK_FAIL_IF(s->kind == ZCK_STORE_UNBOUND, ZCK_ERR_INVALID_ARG, "%s store %u is used by the plan but not bound", side,
              id);
  size_t es = zck_dtype_size(s->dtype);
  ZCK_FAIL_IF(!es, ZCK_ERR_INVALID_ARG, "%s: no valid dtype", name);
  ZCK_FAIL_IF(!zck__add_u64(off, count, &end) || end > s->numel, ZCK_ERR_FORMAT,
              "%s: needs elements [%llu, %llu) (parameter %u) but holds %llu", name, (unsigned long long)off,
              (unsigned long long)(off + count), e->param, (unsigned long long)s->numel);
  uint64_t bytes;
  ZCK_FAIL_IF(!zck__mul_u64(end, es, &bytes) || bytes > ((uint64_t)1 << 62) || s->base > ((uint64_t)1 << 62),
              ZCK_ERR_LIMIT, "%s: element %llu is beyond any file", name, (unsigned long long)end);
  if (s->kind == ZCK_STORE_SOURCE) {
    uint64_t lo = s->base + off * es, hi = s->base + bytes;
    ZCK_FAIL_IF(hi > s->source->size, ZCK_ERR_TRUNCATED, "%s: truncated: need bytes %llu..%llu but the file has %llu",
                s->source->name, (unsigned long long)lo, (unsigned long long)hi,
                (unsigned long long)s->source->size);
  }
  if (s->record && (s->kind == ZCK_STORE_SOURCE || s->kind == ZCK_STORE_FD)) {
    /* the describer's promise: the store lies inside its record (a whole-store stream may
     * read all of it) */
    uint64_t rec_end, store_end = s->base + s->numel * es;
    ZCK_FAIL_IF(!zck__add_u64(s->record->off, s->record->size, &rec_end) || s->base < s->record->off ||
                    store_end > rec_end || (s->kind == ZCK_STORE_SOURCE && rec_end > s->source->size),
                ZCK_ERR_INTERNAL, "%s: bytes %llu..%llu lie outside its %s (bytes %llu..%llu)", name,
                (unsigned long long)s->base, (unsigned long long)store_end,
                s->record->what ? s->record->what : "record", (unsigned long long)s->record->off,
                (unsigned long long)(s->record->off + s->record->size));
  }
  return ZCK_OK;
}

static zck_status check_job(const zck_exec_job *j, size_t job, uint64_t *total) {
  const zck_plan *p = j->plan;
  for (size_t i = 0; i < p->n; i++) {
    const zck_extent *e = &p->ext[i];
    ZCK_FAIL_IF(e->src_store >= p->n_src_stores || e->dst_store >= p->n_dst_stores, ZCK_ERR_INVALID_ARG,
                "copy job %zu: extent %zu names store %u -> %u beyond the plan's %zu -> %zu", job, i, e->src_store,
                e->dst_store, p->n_src_stores, p->n_dst_stores);
    const zck_store *S = &j->src[e->src_store], *D = &j->dst[e->dst_store];
    ZCK_TRY(check_store_range(S, e->src_store, "source", e->src_off, e->count, e));
    ZCK_TRY(check_store_range(D, e->dst_store, "target", e->dst_off, e->count, e));
    ZCK_FAIL_IF(S->kind == ZCK_STORE_CALLBACK && !S->read, ZCK_ERR_INVALID_ARG, "%s: cannot be read",
                S->name ? S->name : "a source store");
    ZCK_FAIL_IF(D->kind == ZCK_STORE_SOURCE || (D->kind == ZCK_STORE_CALLBACK && !D->write), ZCK_ERR_INVALID_ARG,
                "%s: cannot be written", D->name ? D->name : "a target store");
    ZCK_FAIL_IF(!zck_dtype_convertible(D->dtype, S->dtype), ZCK_ERR_UNSUPPORTED, "%s: cannot convert %s to %s for %s",
                S->name ? S->name : "source", zck_dtype_name(S->dtype), zck_dtype_name(D->dtype),
                D->name ? D->name : "the target");
    *total += e->count * zck_dtype_size(D->dtype);
  }
  return ZCK_OK;
}

static int cmp_crc_order_r(const void *a, const void *b, void *ctx) {
  const zck_extent *ext = ctx;
  const zck_extent *x = &ext[*(const size_t *)a], *y = &ext[*(const size_t *)b];
  if (x->dst_store != y->dst_store) return x->dst_store < y->dst_store ? -1 : 1;
  if (x->dst_off != y->dst_off) return x->dst_off < y->dst_off ? -1 : 1;
  return 0;
}

/* Sorts the job's extents by destination and rejects overlaps (a CRC needs each byte
 * written once). */
static zck_status prepare_crc(const zck_exec_job *j, size_t job, job_state *js) {
  const zck_plan *p = j->plan;
  js->ext_crc = zck__calloc(p->n ? p->n : 1, sizeof *js->ext_crc);
  js->crc_order = zck__malloc((p->n ? p->n : 1) * sizeof *js->crc_order);
  if (!js->ext_crc || !js->crc_order) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < p->n; i++) js->crc_order[i] = i;
  if (p->n > 1) qsort_r(js->crc_order, p->n, sizeof *js->crc_order, cmp_crc_order_r, p->ext);
  for (size_t i = 1; i < p->n; i++) {
    const zck_extent *a = &p->ext[js->crc_order[i - 1]], *b = &p->ext[js->crc_order[i]];
    if (a->dst_store == b->dst_store && a->dst_off + a->count > b->dst_off) {
      const zck_store *D = &j->dst[b->dst_store];
      return zck__fail(ZCK_ERR_INVALID_ARG, "copy job %zu: %s: element %llu is written twice, so it has no CRC", job,
                       D->name ? D->name : "a target store", (unsigned long long)b->dst_off);
    }
  }
  return ZCK_OK;
}

static void assemble_crc(const zck_exec_job *j, const job_state *js) {
  const zck_plan *p = j->plan;
  size_t k = 0;
  for (size_t st = 0; st < p->n_dst_stores; st++) {
    const zck_store *D = &j->dst[st];
    size_t es = zck_dtype_size(D->dtype);
    uint64_t pos = 0, end = D->kind == ZCK_STORE_UNBOUND ? 0 : D->numel * es;
    uint32_t crc = 0;
    for (; k < p->n && p->ext[js->crc_order[k]].dst_store == st; k++) {
      const zck_extent *e = &p->ext[js->crc_order[k]];
      uint64_t at = e->dst_off * es, len = e->count * es;
      if (at > pos) crc = zck_crc32_combine(crc, zck_crc32_zeros(at - pos), at - pos);
      crc = zck_crc32_combine(crc, js->ext_crc[js->crc_order[k]], len);
      pos = at + len;
    }
    if (end > pos) crc = zck_crc32_combine(crc, zck_crc32_zeros(end - pos), end - pos);
    j->dst_crc32[st] = crc;
  }
}

// ---- batching

static bool readable_in_batches(const zck_store *s) { return s->kind != ZCK_STORE_MEMORY; }

/* A store read whole in order by one worker: its XXH3 is checked (unless a pass of its
 * own checked it first: verify_first). */
static bool streams_whole(const exec_ctx *c, const zck_store *s) {
  return c->verify && !c->o->verify_first && s->has_xxh3 && (s->kind == ZCK_STORE_SOURCE || s->kind == ZCK_STORE_FD);
}

static int cmp_src_order_r(const void *a, const void *b, void *ctx) {
  const zck_extent *ext = ctx;
  const zck_extent *x = &ext[*(const size_t *)a], *y = &ext[*(const size_t *)b];
  if (x->src_off != y->src_off) return x->src_off < y->src_off ? -1 : 1;
  return 0;
}

static zck_status make_batches(exec_ctx *c) {
  size_t total = 0;
  for (size_t jn = 0; jn < c->n_jobs; jn++) total += c->jobs[jn].plan->n;
  c->batches = zck__malloc((total ? total : 1) * sizeof *c->batches);
  c->order_arena = zck__malloc((total ? total : 1) * sizeof *c->order_arena);
  if (!c->batches || !c->order_arena) return ZCK_ERR_NO_MEMORY;
  size_t nb = 0, used = 0;
  for (size_t jn = 0; jn < c->n_jobs; jn++) {
    const zck_exec_job *j = &c->jobs[jn];
    const zck_plan *p = j->plan;
    size_t first_stream = nb;
    size_t *stream_of = NULL;  /* src store -> its stream batch + 1 */
    for (size_t i = 0; i < p->n;) {
      const zck_extent *e = &p->ext[i];
      const zck_store *S = &j->src[e->src_store];
      size_t ss = zck_dtype_size(S->dtype);
      if (streams_whole(c, S)) {
        if (!stream_of && !(stream_of = zck__calloc(p->n_src_stores ? p->n_src_stores : 1, sizeof *stream_of)))
          return ZCK_ERR_NO_MEMORY;
        if (!stream_of[e->src_store]) {
          c->batches[nb] = (batch){(uint32_t)jn, i, 0, 0, S->numel, NULL};
          stream_of[e->src_store] = ++nb;
        }
        c->batches[stream_of[e->src_store] - 1].n++;
        i++;
        continue;
      }
      batch b = {(uint32_t)jn, i, 1, e->src_off, e->src_off + e->count, NULL};
      uint64_t limit = c->half / ss;
      if (!readable_in_batches(S)) limit = (uint64_t)c->half * 64 / ss; /* memory: group small work only */
      size_t k = i + 1;
      if (b.hi - b.lo <= limit) {
        for (; k < p->n; k++) {
          const zck_extent *f = &p->ext[k];
          if (f->src_store != e->src_store || f->src_off < b.hi || (f->src_off - b.hi) * ss > ZCK__GAP_BYTES) break;
          /* targets in a write order: a batch writes one stretch of it (another job's
           * target in between would otherwise be written after what follows it) */
          uint64_t wo = j->dst[p->ext[k - 1].dst_store].write_order, wf = j->dst[f->dst_store].write_order;
          if (wo && wf != wo && wf != wo + 1) break;
          uint64_t hi = f->src_off + f->count;
          if (hi - b.lo > limit) break;
          b.hi = hi;
          b.n++;
        }
      }
      c->batches[nb++] = b;
      i = k;
    }
    if (!stream_of) continue;
    /* the stream batches' extent lists, each sorted by source offset */
    for (size_t bi = first_stream; bi < nb; bi++)
      if (c->batches[bi].n && stream_of[p->ext[c->batches[bi].first].src_store] == bi + 1) {
        c->batches[bi].order = c->order_arena + used;
        used += c->batches[bi].n;
        c->batches[bi].n = 0;
      }
    for (size_t i = 0; i < p->n; i++) {
      size_t sb = stream_of[p->ext[i].src_store];
      if (sb) c->batches[sb - 1].order[c->batches[sb - 1].n++] = i;
    }
    for (size_t bi = first_stream; bi < nb; bi++)
      if (c->batches[bi].order && c->batches[bi].n > 1)
        qsort_r(c->batches[bi].order, c->batches[bi].n, sizeof(size_t), cmp_src_order_r, (void *)p->ext);
    free(stream_of);
  }
  c->n_batches = nb;
  return ZCK_OK;
}

/* Where a batch writes first, in its targets' write order: (write_order, element offset)
 * of its first extent (a stream batch: its earliest). false: a target without an order. */
typedef struct batch_key { uint64_t order, off; size_t index; } batch_key;

static bool batch_first_write(const exec_ctx *c, const batch *b, batch_key *k) {
  const zck_exec_job *j = &c->jobs[b->job];
  bool any = false;
  for (size_t i = 0; i < b->n; i++) {
    const zck_extent *e = &j->plan->ext[b->order ? b->order[i] : b->first + i];
    uint64_t o = j->dst[e->dst_store].write_order;
    if (!o) return false;
    if (!any || o < k->order || (o == k->order && e->dst_off < k->off)) *k = (batch_key){o, e->dst_off, 0};
    any = true;
    if (!b->order) break; /* consecutive extents of a plan in target order: the first is the earliest */
  }
  return any;
}

static int cmp_batch_key(const void *a, const void *b) {
  const batch_key *x = a, *y = b;
  if (x->order != y->order) return x->order < y->order ? -1 : 1;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* When every target says where it lies in its writer's order, the batches run in that
 * order, across jobs (workers take them in index order). */
static zck_status order_batches(exec_ctx *c) {
  if (c->n_batches < 2) return ZCK_OK;
  batch_key *k = zck__malloc(c->n_batches * sizeof *k);
  batch *sorted = k ? zck__malloc(c->n_batches * sizeof *sorted) : NULL;
  if (!k || !sorted) {
    free(k);
    return ZCK_ERR_NO_MEMORY;
  }
  bool all = true;
  for (size_t i = 0; all && i < c->n_batches; i++) {
    all = batch_first_write(c, &c->batches[i], &k[i]);
    k[i].index = i;
  }
  zck_status st = ZCK_OK;
  if (all) {
    qsort(k, c->n_batches, sizeof *k, cmp_batch_key);
    for (size_t i = 0; i < c->n_batches; i++) sorted[i] = c->batches[k[i].index];
    memcpy(c->batches, sorted, c->n_batches * sizeof *sorted);
    c->start = zck__malloc((c->n_batches + 1) * sizeof *c->start);
    c->finished = zck__calloc(c->n_batches, 1);
    if (!c->start || !c->finished) st = ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK) c->start[0] = 0;
    for (size_t i = 0; st == ZCK_OK && i < c->n_batches; i++) {
      const batch *b = &c->batches[i];
      const zck_exec_job *j = &c->jobs[b->job];
      uint64_t bytes = 0;
      for (size_t x = 0; x < b->n; x++) {
        const zck_extent *e = &j->plan->ext[b->order ? b->order[x] : b->first + x];
        bytes += e->count * zck_dtype_size(j->dst[e->dst_store].dtype);
      }
      c->start[i + 1] = c->start[i] + bytes;
    }
    c->window = 4 * (uint64_t)c->staging; /* 32 MiB by default: half a writer's hash budget */
  }
  free(k);
  free(sorted);
  return st;
}

/* verify_first: every source store with an XXH3 that an extent reads, hashed whole in a
 * pass of its own (each once, in parallel) and compared. */
static int cmp_store_ptr(const void *a, const void *b) {
  const zck_store *x = *(const zck_store *const *)a, *y = *(const zck_store *const *)b;
  return x < y ? -1 : x > y;
}

static zck_status verify_xxh3_first(exec_ctx *c) {
  size_t n = 0;
  for (size_t jn = 0; jn < c->n_jobs; jn++) n += c->jobs[jn].plan->n;
  const zck_store **v = zck__malloc((n ? n : 1) * sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t jn = 0; jn < c->n_jobs; jn++) {
    const zck_exec_job *j = &c->jobs[jn];
    for (size_t i = 0; i < j->plan->n; i++) {
      const zck_store *S = &j->src[j->plan->ext[i].src_store];
      if (S->has_xxh3 && (S->kind == ZCK_STORE_SOURCE || S->kind == ZCK_STORE_FD) && (!k || v[k - 1] != S)) v[k++] = S;
    }
  }
  if (k > 1) qsort(v, k, sizeof *v, cmp_store_ptr);
  size_t u = 0; /* distinct stores */
  for (size_t i = 0; i < k; i++)
    if (!u || v[u - 1] != v[i]) v[u++] = v[i];
  zck_store *stores = zck__malloc((u ? u : 1) * sizeof *stores);
  uint64_t *got = zck__malloc((u ? u : 1) * sizeof *got);
  zck_status st = stores && got ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < u; i++) stores[i] = *v[i];
  zck_exec_opts ho = *c->o;
  ho.staging_bytes = c->staging;
  if (st == ZCK_OK && u) st = zck_exec_hash_stores(stores, u, &ho, got, NULL);
  for (size_t i = 0; st == ZCK_OK && i < u; i++)
    if (got[i] != stores[i].xxh3)
      st = zck__fail(ZCK_ERR_DAMAGED, "%s: XXH3-64 mismatch with " "zckpt-manifest.json (stored %016llx, read %016llx)",
                     stores[i].name ? stores[i].name : "a source store", (unsigned long long)stores[i].xxh3,
                     (unsigned long long)got[i]);
  free(v);
  free(stores);
  free(got);
  return st;
}

// ---- verify on read: the records' CRCs from the pieces read

typedef struct vpiece {
  const zck_store *S;    /* the store it was read through (source, record) */
  uintptr_t file;        /* the source's identity */
  uint64_t rec_off;
  uint64_t lo, hi;
  uint32_t crc;
} vpiece;

static uintptr_t file_id(const zck_store *S) {
  return S->kind == ZCK_STORE_SOURCE ? (uintptr_t)S->source : (uintptr_t)(S->fd + 1);
}

static int cmp_vpiece(const void *a, const void *b) {
  const vpiece *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->rec_off != y->rec_off) return x->rec_off < y->rec_off ? -1 : 1;
  if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
  return x->hi > y->hi ? -1 : x->hi < y->hi;  /* the longest first */
}

typedef struct vrec_ctx {
  vpiece *p;
  size_t *group;         /* [n_groups + 1] starts into p */
  uint8_t **bufs;
  size_t staging;
} vrec_ctx;

static zck_status raw_read(const zck_store *S, void *dst, size_t n, uint64_t off) {
  if (S->kind == ZCK_STORE_SOURCE) return zck__source_read(S->source, dst, n, off);
  return zck__pread_all(S->fd, dst, n, off, S->name ? S->name : "source");
}

/* CRC of bytes [lo, hi) of the file, read in staging-sized pieces. */
static zck_status crc_of_gap(const zck_store *S, uint8_t *buf, size_t cap, uint64_t lo, uint64_t hi, uint32_t *crc) {
  *crc = 0;
  for (uint64_t k = lo; k < hi; k += cap) {
    size_t n = hi - k < cap ? (size_t)(hi - k) : cap;
    ZCK_TRY(raw_read(S, buf, n, k));
    *crc = zck_crc32_update(*crc, buf, n);
  }
  return ZCK_OK;
}

static zck_status verify_record(void *ctx, size_t g, unsigned thread) {
  vrec_ctx *v = ctx;
  const vpiece *p = v->p + v->group[g], *pe = v->p + v->group[g + 1];
  const zck_store *S = p->S;
  const zck_record_check *r = S->record;
  if (!v->bufs[thread] && !(v->bufs[thread] = zck__malloc(v->staging))) return ZCK_ERR_NO_MEMORY;
  uint64_t pos = r->off, end = r->off + r->size;
  uint32_t crc = 0, part;
  for (; p < pe; p++) {
    if (p->hi <= pos) continue;                  /* read twice (two views, two jobs) */
    if (p->lo > pos) {                           /* bytes the plan did not need */
      ZCK_TRY(crc_of_gap(S, v->bufs[thread], v->staging, pos, p->lo, &part));
      crc = zck_crc32_combine(crc, part, p->lo - pos);
      pos = p->lo;
    }
    if (p->lo == pos) {
      crc = zck_crc32_combine(crc, p->crc, p->hi - p->lo);
    } else {                                     /* overlaps what is counted: the rest again */
      ZCK_TRY(crc_of_gap(S, v->bufs[thread], v->staging, pos, p->hi, &part));
      crc = zck_crc32_combine(crc, part, p->hi - pos);
    }
    pos = p->hi;
  }
  if (pos < end) {
    ZCK_TRY(crc_of_gap(S, v->bufs[thread], v->staging, pos, end, &part));
    crc = zck_crc32_combine(crc, part, end - pos);
  }
  if (crc != r->crc32) {
    const char *file = S->kind == ZCK_STORE_SOURCE ? S->source->name : S->name;
    return zck__fail(ZCK_ERR_DAMAGED, "%s: %s: CRC-32 mismatch (stored %08x, read %08x)", file ? file : "source",
                     r->what ? r->what : "record", r->crc32, crc);
  }
  return ZCK_OK;
}

static zck_status verify_records(exec_ctx *c) {
  size_t n = 0;
  for (size_t bi = 0; bi < c->n_batches; bi++) n += c->pieces[bi].set;
  if (!n) return ZCK_OK;
  vpiece *v = zck__malloc(n * sizeof *v);
  size_t *group = zck__malloc((n + 1) * sizeof *group);
  zck_status st = v && group ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t k = 0, ng = 0;
  for (size_t bi = 0; st == ZCK_OK && bi < c->n_batches; bi++) {
    if (!c->pieces[bi].set) continue;
    const batch *b = &c->batches[bi];
    const zck_exec_job *j = &c->jobs[b->job];
    const zck_store *S = &j->src[j->plan->ext[b->order ? b->order[0] : b->first].src_store];
    v[k++] = (vpiece){S, file_id(S), S->record->off, c->pieces[bi].lo, c->pieces[bi].hi, c->pieces[bi].crc};
  }
  if (st == ZCK_OK) {
    qsort(v, n, sizeof *v, cmp_vpiece);
    for (size_t i = 0; i < n; i++)
      if (!i || v[i].file != v[i - 1].file || v[i].rec_off != v[i - 1].rec_off) group[ng++] = i;
    group[ng] = n;
    vrec_ctx vc = {v, group, c->bufs, c->staging};
    unsigned workers = zck__worker_count(ng, c->o->threads);
    if (workers > c->n_workers) workers = c->n_workers ? c->n_workers : 1;
    st = zck__parallel_for(ng, workers, verify_record, &vc);
  }
  free(v);
  free(group);
  return st;
}

// ---- entry points

/* A distributed job's copy is shared by its ranks (exec_dist.c), each running its share here. */
zck_status zck_exec_run(const zck_exec_job *jobs, size_t n_jobs, const zck_exec_opts *opts) {
  if (zck__dist_on()) return zck__exec_run_dist(jobs, n_jobs, opts);
  return zck__exec_run_here(jobs, n_jobs, opts);
}

zck_status zck__exec_run_here(const zck_exec_job *jobs, size_t n_jobs, const zck_exec_opts *opts) {
  static const zck_exec_opts defaults = ZCK_EXEC_OPTS_INIT;
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
  if (!c.js) return ZCK_ERR_NO_MEMORY;
  for (size_t jn = 0; jn < n_jobs && s == ZCK_OK; jn++) {
    s = check_job(&jobs[jn], jn, &c.total);
    if (s == ZCK_OK && jobs[jn].dst_crc32) s = prepare_crc(&jobs[jn], jn, &c.js[jn]);
  }
  if (s == ZCK_OK && c.verify && c.o->verify_first) s = verify_xxh3_first(&c);
  if (s == ZCK_OK) s = make_batches(&c);
  if (s == ZCK_OK) s = order_batches(&c);
  unsigned workers = zck__worker_count(c.n_batches, c.o->threads);
  c.n_workers = workers;
  if (s == ZCK_OK && !(c.bufs = zck__calloc(workers ? workers : 1, sizeof *c.bufs))) s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK && c.verify && !(c.pieces = zck__calloc(c.n_batches ? c.n_batches : 1, sizeof *c.pieces)))
    s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) {
    pthread_mutex_init(&c.lock, NULL);
    pthread_mutex_init(&c.win_lock, NULL);
    pthread_cond_init(&c.win_cv, NULL);
    s = zck__parallel_for(c.n_batches, workers, run_batch, &c);
    pthread_cond_destroy(&c.win_cv);
    pthread_mutex_destroy(&c.win_lock);
    pthread_mutex_destroy(&c.lock);
  }
  if (s == ZCK_OK && c.verify) s = verify_records(&c);
  if (s == ZCK_OK)
    for (size_t jn = 0; jn < n_jobs; jn++)
      if (jobs[jn].dst_crc32) assemble_crc(&jobs[jn], &c.js[jn]);
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
  return s;
}

zck_status zck_exec_plan(const zck_plan *plan, const zck_store *src, const zck_store *dst, uint32_t *dst_crc32,
                         const zck_exec_opts *opts) {
  zck_exec_job j = {plan, src, dst, dst_crc32};
  return zck_exec_run(&j, 1, opts);
}

// ---- hashing after the fact

typedef struct hash_ctx {
  const zck_store *stores;
  size_t staging;
  uint8_t **bufs;
  uint64_t *xxh3;
  uint32_t *crc;
} hash_ctx;

static zck_status hash_one(void *ctx, size_t item, unsigned thread) {
  hash_ctx *h = ctx;
  const zck_store *s = &h->stores[item];
  if (s->kind == ZCK_STORE_UNBOUND) return ZCK_OK;
  size_t es = zck_dtype_size(s->dtype);
  ZCK_FAIL_IF(!es, ZCK_ERR_INVALID_ARG, "%s: no valid dtype", s->name ? s->name : "store");
  XXH3_state_t *st = NULL;
  if (h->xxh3) {
    st = XXH3_createState();
    if (!st) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    XXH3_64bits_reset(st);
  }
  uint32_t crc = 0;
  zck_status r = ZCK_OK;
  if (s->kind == ZCK_STORE_MEMORY) {
    hash_sliced(st, h->crc ? &crc : NULL, s->mem, (size_t)(s->numel * es));
  } else {
    if (!h->bufs[thread] && !(h->bufs[thread] = zck__malloc(h->staging))) r = ZCK_ERR_NO_MEMORY;
    uint64_t step = h->staging / es;
    for (uint64_t k = 0; r == ZCK_OK && k < s->numel; k += step) {
      uint64_t n = s->numel - k < step ? s->numel - k : step;
      r = store_read(s, (uint32_t)item, h->bufs[thread], k, n);
      if (r != ZCK_OK) break;
      hash_sliced(st, h->crc ? &crc : NULL, h->bufs[thread], (size_t)(n * es));
    }
  }
  if (r == ZCK_OK) {
    if (st) h->xxh3[item] = XXH3_64bits_digest(st);
    if (h->crc) h->crc[item] = crc;
  }
  XXH3_freeState(st);
  return r;
}

zck_status zck_exec_hash_stores(const zck_store *stores, size_t n, const zck_exec_opts *opts, uint64_t *xxh3_out,
                                uint32_t *crc32_out) {
  static const zck_exec_opts defaults = ZCK_EXEC_OPTS_INIT;
  const zck_exec_opts *o = opts ? opts : &defaults;
  hash_ctx h = {stores, o->staging_bytes ? o->staging_bytes : ZCK_EXEC_DEFAULT_STAGING, NULL, xxh3_out, crc32_out};
  if (h.staging < 64) h.staging = 64;
  unsigned workers = zck__worker_count(n, o->threads);
  h.bufs = zck__calloc(workers, sizeof *h.bufs);
  if (!h.bufs) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__parallel_for(n, workers, hash_one, &h);
  for (unsigned i = 0; i < workers; i++) free(h.bufs[i]);
  free(h.bufs);
  return s;
}
