/* stream_hash.c: a file's manifest hashes from its bytes as they are written
 * (stream_hash.h).
 *
 * One thread at a time hashes (the "busy" one): it owns the cursor, the XXH3 states and
 * the running CRC of the current region, and works with the lock released; everything
 * else (segments, regions, the pieces waiting ahead of the cursor) is under the lock. A
 * piece fed exactly at the cursor is hashed by the thread that wrote it, while its bytes
 * are in the cache; a piece ahead is copied and waits in a min-heap by offset. */
#include "stream_hash.h"

#include "dist.h"
#include "exec.h"
#include "io.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "hash_xxh3.h"

typedef enum { SEG_BYTES, SEG_REGION, SEG_DEFER } seg_kind;

typedef struct seg {
  seg_kind kind;
  uint64_t off, len;
  uint8_t *bytes;            /* BYTES: a copy; DEFER: made when the cursor reaches it */
  size_t region;             /* REGION: its region; DEFER: the region before it */
  zck__shash_defer_fn fn;
  void *ctx;
  size_t id;
} seg;

typedef struct span { uint64_t off, len; } span;

typedef struct region {
  uint64_t off, len;
  span *cover;               /* relative ranges something writes; the rest is zeros */
  size_t n_cover, cap_cover, cover_at;
  bool done;                 /* the cursor passed it: crc and xxh3 are set */
  uint32_t crc;
  uint64_t xxh3;
} region;

typedef struct piece {
  uint64_t off, len;
  uint32_t crc;
  bool crc_given;
  bool budgeted;             /* counted in the budget (a fed piece, not a known one) */
  uint8_t *data;
} piece;

struct zck__shash {
  pthread_mutex_t mu;
  bool on, busy;
  bool broken;               /* stopped streaming (budget): finish reads the rest back */
  bool dropped;              /* the hashes cannot be had this way: the caller hashes the file */
  bool chunk_oom;
  bool no_crc;               /* zck__shash_no_crc: the regions' CRC-32s are not computed */
  zck__shash_budget *budget;
  seg *segs;
  size_t n_segs, cap_segs, seg;
  region *regs;
  size_t n_regs, cap_regs;
  uint64_t end;              /* where the last segment ends */
  uint64_t cursor;
  uint64_t streamed, reread;
  piece *pend;               /* min-heap by off */
  size_t n_pend, cap_pend;
  /* owned by the busy thread */
  XXH3_state_t *fst, *cst, *rst;
  uint32_t rcrc;             /* CRC of the current region so far */
  uint64_t chunk_size, chunk_fill;
  uint64_t *chunks;
  size_t n_chunks, cap_chunks;
  /* results */
  bool done;
  uint64_t size, xxh3;
};

static const uint8_t zeros[1 << 16];
#define SLICE ((uint64_t)64 << 10)

/* room for element n (the array holds n) */
static bool grow(void **v, size_t *cap, size_t n, size_t es) { return zck__grow(v, cap, n + 1, es); }

zck__shash *zck__shash_new(void) {
  zck__shash *h = calloc(1, sizeof *h);
  if (!h) return NULL;
  pthread_mutex_init(&h->mu, NULL);
  h->fst = XXH3_createState();
  h->cst = XXH3_createState();
  h->rst = XXH3_createState();
  if (!h->fst || !h->cst || !h->rst) {
    zck__shash_free(h);
    return NULL;
  }
  XXH3_64bits_reset(h->fst);
  XXH3_64bits_reset(h->cst);
  XXH3_64bits_reset(h->rst);
  /* In a distributed job only rank 0 writes the manifest (dist.h); on the other ranks a
   * stream would see only their own share of the file and read the rest back at finish:
   * every output byte again on every rank. Off from the start there. */
  if (zck__dist_on() && zck__dist_rank() != 0) h->dropped = true;
  return h;
}

static void drop_pending(zck__shash *h) {
  for (size_t i = 0; i < h->n_pend; i++) {
    if (h->pend[i].budgeted && h->budget) atomic_fetch_sub(&h->budget->used, h->pend[i].len);
    free(h->pend[i].data);
  }
  h->n_pend = 0;
}

void zck__shash_free(zck__shash *h) {
  if (!h) return;
  drop_pending(h);
  for (size_t i = 0; i < h->n_segs; i++) free(h->segs[i].bytes);
  for (size_t i = 0; i < h->n_regs; i++) free(h->regs[i].cover);
  free(h->segs);
  free(h->regs);
  free(h->pend);
  free(h->chunks);
  XXH3_freeState(h->fst);
  XXH3_freeState(h->cst);
  XXH3_freeState(h->rst);
  pthread_mutex_destroy(&h->mu);
  free(h);
}

// ---- layout

/* The hashes cannot be had from the stream any more: finish reads nothing, the caller
 * hashes the file. Lock held. */
static void give_up(zck__shash *h) {
  h->dropped = true;
  drop_pending(h);
}

/* While a thread hashes, segments must not move: an append waits for it (appends are
 * rare and never happen while a copy writes into the file). Returns with the lock held. */
static void lock_idle(zck__shash *h) {
  pthread_mutex_lock(&h->mu);
  while (h->busy) {
    pthread_mutex_unlock(&h->mu);
    sched_yield();
    pthread_mutex_lock(&h->mu);
  }
}

static void advance(zck__shash *h);

static void add_seg(zck__shash *h, seg s) {
  if (h->dropped) { free(s.bytes); return; }
  if (s.off != h->end || !grow((void **)&h->segs, &h->cap_segs, h->n_segs, sizeof *h->segs)) {
    free(s.bytes);
    give_up(h);
    return;
  }
  h->segs[h->n_segs++] = s;
  h->end = s.off + s.len;
}

static void resume(zck__shash *h) { /* lock held, not busy */
  if (!h->on || h->dropped) return;
  h->busy = true;
  advance(h);
  h->busy = false;
}

void zck__shash_bytes(zck__shash *h, uint64_t off, const void *bytes, uint64_t n) {
  if (!h || !n) return;
  uint8_t *copy = malloc((size_t)n);
  if (copy) memcpy(copy, bytes, (size_t)n);
  lock_idle(h);
  if (!copy) give_up(h);
  else add_seg(h, (seg){SEG_BYTES, off, n, copy, 0, NULL, NULL, 0});
  resume(h);
  pthread_mutex_unlock(&h->mu);
}

static void cover_locked(zck__shash *h, uint64_t off, uint64_t len);
static void wait_piece(zck__shash *h, uint64_t off, const void *bytes, uint64_t n, const uint32_t *crc, bool budgeted);

void zck__shash_region(zck__shash *h, uint64_t off, uint64_t len, const void *known) {
  if (!h) return;
  lock_idle(h);
  if (!h->dropped && grow((void **)&h->regs, &h->cap_regs, h->n_regs, sizeof *h->regs)) {
    h->regs[h->n_regs] = (region){off, len, NULL, 0, 0, 0, false, 0, 0};
    add_seg(h, (seg){SEG_REGION, off, len, NULL, h->n_regs, NULL, NULL, 0});
    if (!h->dropped) h->n_regs++;
    if (!h->dropped && known && len) { /* before the cursor can enter it */
      region *r = &h->regs[h->n_regs - 1];
      if (grow((void **)&r->cover, &r->cap_cover, r->n_cover, sizeof *r->cover)) r->cover[r->n_cover++] = (span){0, len};
      else give_up(h);
      if (!h->dropped && !h->broken) wait_piece(h, off, known, len, NULL, false);
    }
  } else {
    give_up(h);
  }
  resume(h);
  pthread_mutex_unlock(&h->mu);
}

void zck__shash_stop(zck__shash *h) {
  if (!h) return;
  lock_idle(h);
  give_up(h);
  pthread_mutex_unlock(&h->mu);
}

void zck__shash_no_crc(zck__shash *h) {
  if (!h) return;
  lock_idle(h);
  h->no_crc = true;
  pthread_mutex_unlock(&h->mu);
}

void zck__shash_defer(zck__shash *h, uint64_t off, uint64_t len, zck__shash_defer_fn fn, void *ctx, size_t id) {
  if (!h || !len) return;
  lock_idle(h);
  /* no CRC, no deferred bytes: the file is hashed by its caller instead */
  if (h->no_crc || !h->n_regs || h->regs[h->n_regs - 1].off + h->regs[h->n_regs - 1].len != off) give_up(h);
  else add_seg(h, (seg){SEG_DEFER, off, len, NULL, h->n_regs - 1, fn, ctx, id});
  resume(h);
  pthread_mutex_unlock(&h->mu);
}

/* The region holding [off, off + n), or NULL. Lock held. */
static region *region_of(zck__shash *h, uint64_t off, uint64_t n) {
  size_t lo = 0, hi = h->n_regs; /* the last region starting at or before off */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (h->regs[mid].off <= off) lo = mid + 1;
    else hi = mid;
  }
  if (!lo) return NULL;
  region *r = &h->regs[lo - 1];
  if (!n) return r->off == off ? r : NULL;
  return off + n <= r->off + r->len ? r : NULL;
}

static void cover_locked(zck__shash *h, uint64_t off, uint64_t len) {
  region *r = region_of(h, off, len);
  if (!r || h->on || !grow((void **)&r->cover, &r->cap_cover, r->n_cover, sizeof *r->cover)) {
    give_up(h);
    return;
  }
  r->cover[r->n_cover++] = (span){off - r->off, len};
}

void zck__shash_cover(zck__shash *h, uint64_t off, uint64_t len) {
  if (!h || !len) return;
  pthread_mutex_lock(&h->mu);
  if (!h->dropped) cover_locked(h, off, len);
  pthread_mutex_unlock(&h->mu);
}

// ---- the stream

/* The next n bytes at the cursor, all inside the current segment: file and chunk hashes,
 * and inside a region its XXH3 and CRC (crc_given: crc is that of these n bytes). Busy. */
static void take(zck__shash *h, const uint8_t *p, uint64_t n, bool in_region, bool crc_given, uint32_t crc) {
  uint64_t total = n;
  while (n) {
    /* the hashes over one slice while it is in the cache (hashing is memory-bound) */
    uint64_t k = n < SLICE ? n : SLICE;
    /* the first chunk's hash is the file's hash at the chunk's end: no third pass over it
     * (a file shorter than a chunk, most of them, is hashed twice, not three times) */
    bool first = !h->n_chunks && !h->chunk_oom;
    if (first && k > h->chunk_size - h->chunk_fill) k = h->chunk_size - h->chunk_fill;
    XXH3_64bits_update(h->fst, p, (size_t)k);
    if (first) {
      h->chunk_fill += k;
      if (h->chunk_fill == h->chunk_size) {
        if (grow((void **)&h->chunks, &h->cap_chunks, h->n_chunks, sizeof *h->chunks)) h->chunks[h->n_chunks++] = XXH3_64bits_digest(h->fst);
        else h->chunk_oom = true;
        h->chunk_fill = 0;
      }
    }
    for (uint64_t i = 0; !first && i < k;) { /* chunk boundaries may fall inside */
      uint64_t t = h->chunk_size - h->chunk_fill < k - i ? h->chunk_size - h->chunk_fill : k - i;
      XXH3_64bits_update(h->cst, p + i, (size_t)t);
      i += t;
      h->chunk_fill += t;
      if (h->chunk_fill == h->chunk_size) {
        if (grow((void **)&h->chunks, &h->cap_chunks, h->n_chunks, sizeof *h->chunks)) h->chunks[h->n_chunks++] = XXH3_64bits_digest(h->cst);
        else h->chunk_oom = true;
        XXH3_64bits_reset(h->cst);
        h->chunk_fill = 0;
      }
    }
    if (in_region) {
      XXH3_64bits_update(h->rst, p, (size_t)k);
      if (!crc_given && !h->no_crc) h->rcrc = zck_crc32_update(h->rcrc, p, (size_t)k);
    }
    h->cursor += k;
    p += k;
    n -= k;
  }
  if (in_region && crc_given && !h->no_crc) h->rcrc = zck_crc32_combine(h->rcrc, crc, total);
}

/* The first byte of a hole at rel in r (never written: zeros), and where it ends. rel
 * never goes back, so the scan resumes where it stopped. */
static bool in_hole(region *r, uint64_t rel, uint64_t *hole_end) {
  while (r->cover_at < r->n_cover && r->cover[r->cover_at].off + r->cover[r->cover_at].len <= rel) r->cover_at++;
  if (r->cover_at < r->n_cover && r->cover[r->cover_at].off <= rel) return false;
  *hole_end = r->cover_at < r->n_cover ? r->cover[r->cover_at].off : r->len;
  return true;
}

static void pend_swap(piece *a, piece *b) { piece t = *a; *a = *b; *b = t; }

static bool pend_push(zck__shash *h, piece pc) {
  if (!grow((void **)&h->pend, &h->cap_pend, h->n_pend, sizeof *h->pend)) return false;
  size_t i = h->n_pend++;
  h->pend[i] = pc;
  while (i && h->pend[(i - 1) / 2].off > h->pend[i].off) {
    pend_swap(&h->pend[(i - 1) / 2], &h->pend[i]);
    i = (i - 1) / 2;
  }
  return true;
}

static piece pend_pop(zck__shash *h) {
  piece top = h->pend[0];
  h->pend[0] = h->pend[--h->n_pend];
  for (size_t i = 0;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n_pend && h->pend[l].off < h->pend[m].off) m = l;
    if (r < h->n_pend && h->pend[r].off < h->pend[m].off) m = r;
    if (m == i) break;
    pend_swap(&h->pend[i], &h->pend[m]);
    i = m;
  }
  return top;
}

/* The region of segment s ended at the cursor: its hashes are final. Lock held, busy. */
static void close_region(zck__shash *h, const seg *s) {
  region *r = &h->regs[s->region];
  r->xxh3 = XXH3_64bits_digest(h->rst);
  r->crc = h->rcrc;
  r->done = true;
  XXH3_64bits_reset(h->rst);
  h->rcrc = 0;
}

/* Lock held, busy: hashes everything known at the cursor (bytes, deferred bytes, zeros,
 * pieces that waited), unlocking while hashing; stops at data not yet written or at the
 * last segment. */
static void advance(zck__shash *h) {
  while (!h->dropped && h->seg < h->n_segs) {
    seg *s = &h->segs[h->seg];
    uint64_t at = h->cursor - s->off, left = s->len - at;
    if (!left) {
      if (s->kind == SEG_REGION) close_region(h, s);
      h->seg++;
      continue;
    }
    if (s->kind == SEG_DEFER && !s->bytes) {
      const region *r = &h->regs[s->region];
      if (!r->done || !(s->bytes = malloc((size_t)s->len))) { give_up(h); break; }
      s->fn(s->ctx, s->id, r->crc, s->bytes, (size_t)s->len);
    }
    if (s->kind != SEG_REGION) {
      const uint8_t *b = s->bytes + at; /* the segment's own buffer: appends do not move it */
      pthread_mutex_unlock(&h->mu);
      take(h, b, left, false, false, 0);
      pthread_mutex_lock(&h->mu);
      continue;
    }
    region *r = &h->regs[s->region];
    uint64_t hole_end;
    if (in_hole(r, at, &hole_end)) {
      uint64_t k = hole_end - at < sizeof zeros ? hole_end - at : sizeof zeros;
      pthread_mutex_unlock(&h->mu);
      take(h, zeros, k, true, false, 0);
      pthread_mutex_lock(&h->mu);
      continue;
    }
    if (!h->n_pend || h->pend[0].off != h->cursor) break; /* wait for the copy */
    piece pc = pend_pop(h);
    if (pc.len > left) { free(pc.data); give_up(h); break; }
    pthread_mutex_unlock(&h->mu);
    take(h, pc.data, pc.len, true, pc.crc_given, pc.crc);
    pthread_mutex_lock(&h->mu);
    h->streamed += pc.len;
    free(pc.data);
    if (pc.budgeted) atomic_fetch_sub(&h->budget->used, pc.len);
  }
  if (h->n_pend && h->pend[0].off < h->cursor) give_up(h); /* overlapping writes, or outside the cover */
}

/* A piece ahead of the cursor waits (a copy); past the budget the stream stops. Lock held. */
static void wait_piece(zck__shash *h, uint64_t off, const void *bytes, uint64_t n, const uint32_t *crc, bool budgeted) {
  if (!h->busy && off < h->cursor) { /* hashed as zeros already: the cover was wrong */
    give_up(h);
    return;
  }
  uint64_t used = budgeted ? atomic_fetch_add(&h->budget->used, n) + n : 0;
  uint8_t *copy = !budgeted || used <= h->budget->max ? malloc((size_t)n) : NULL;
  if (!copy || !pend_push(h, (piece){off, n, crc ? *crc : 0, crc != NULL, budgeted, copy})) {
    free(copy);
    if (budgeted) atomic_fetch_sub(&h->budget->used, n);
    h->broken = true; /* the rest is read back at finish */
    drop_pending(h);
    return;
  }
  memcpy(copy, bytes, (size_t)n);
}

void zck__shash_known(zck__shash *h, uint64_t off, const void *bytes, uint64_t n) {
  if (!h || !n) return;
  lock_idle(h);
  if (!h->dropped) {
    if (!h->on) cover_locked(h, off, n);
    if (!h->dropped && !h->broken) {
      wait_piece(h, off, bytes, n, NULL, false);
      resume(h);
    }
  }
  pthread_mutex_unlock(&h->mu);
}

static int cmp_span(const void *a, const void *b) {
  const span *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

zck_status zck__shash_start(zck__shash *h, zck__shash_budget *budget, uint64_t chunk_size) {
  if (!h) return ZCK_OK;
  pthread_mutex_lock(&h->mu);
  h->budget = budget;
  h->chunk_size = chunk_size ? chunk_size : ZCK_MANIFEST_DEFAULT_CHUNK;
  for (size_t i = 0; i < h->n_regs; i++) { /* the written ranges, sorted and merged */
    region *r = &h->regs[i];
    if (r->n_cover > 1) qsort(r->cover, r->n_cover, sizeof *r->cover, cmp_span);
    size_t k = 0;
    for (size_t j = 0; j < r->n_cover; j++) {
      if (k && r->cover[k - 1].off + r->cover[k - 1].len >= r->cover[j].off) {
        uint64_t end = r->cover[j].off + r->cover[j].len;
        if (end > r->cover[k - 1].off + r->cover[k - 1].len) r->cover[k - 1].len = end - r->cover[k - 1].off;
      } else {
        r->cover[k++] = r->cover[j];
      }
    }
    r->n_cover = k;
  }
  h->on = true;
  resume(h);
  pthread_mutex_unlock(&h->mu);
  return ZCK_OK;
}

void zck__shash_feed(zck__shash *h, uint64_t off, const void *bytes, uint64_t n, const uint32_t *crc) {
  if (!h || !n) return;
  pthread_mutex_lock(&h->mu);
  if (!h->on || h->dropped || h->broken) goto out;
  const seg *s = !h->busy && h->seg < h->n_segs ? &h->segs[h->seg] : NULL;
  bool here = s && off == h->cursor && s->kind == SEG_REGION && off + n <= s->off + s->len;
  if (!here) {
    wait_piece(h, off, bytes, n, crc, true);
    goto out;
  }
  h->busy = true;
  pthread_mutex_unlock(&h->mu);
  take(h, bytes, n, true, crc != NULL, crc ? *crc : 0);
  pthread_mutex_lock(&h->mu);
  h->streamed += n;
  advance(h);
  h->busy = false;
out:
  pthread_mutex_unlock(&h->mu);
}

void zck__shash_check_crc(zck__shash *h, uint64_t off, uint32_t crc) {
  if (!h) return;
  pthread_mutex_lock(&h->mu);
  region *r = h->dropped ? NULL : region_of(h, off, 0);
  /* a region the stream did not finish is checked by the read back (it reads the file);
   * without CRCs nothing can be checked here: the caller hashes the file */
  if (r && r->off == off && (h->no_crc || (r->done && r->crc != crc))) give_up(h);
  pthread_mutex_unlock(&h->mu);
}

// ---- results

/* Bytes of the file from the cursor on, through the segments (the file is the truth now:
 * deferred and known bytes are taken as read). Busy (no other thread left). */
static void take_read(zck__shash *h, const uint8_t *p, uint64_t n) {
  while (n && !h->dropped) {
    if (h->seg >= h->n_segs) { give_up(h); return; } /* the file is longer than its layout */
    seg *s = &h->segs[h->seg];
    uint64_t left = s->off + s->len - h->cursor;
    if (!left) {
      if (s->kind == SEG_REGION) close_region(h, s);
      h->seg++;
      continue;
    }
    uint64_t k = n < left ? n : left;
    take(h, p, k, s->kind == SEG_REGION, false, 0);
    p += k;
    n -= k;
  }
}

static zck_status finish(zck__shash *h, const char *path, bool laid_out, uint64_t *reread);

zck_status zck__shash_finish(zck__shash *h, const char *path, uint64_t *reread) {
  *reread = 0;
  if (!h) return ZCK_OK;
  zck_status fs = finish(h, path, false, reread);
  zck__manifest_count_reread(*reread);
  return fs;
}

zck_status zck__shash_finish_laid_out(zck__shash *h, const char *path, uint64_t *reread) {
  *reread = 0;
  if (!h) return ZCK_OK;
  zck_status fs = finish(h, path, true, reread);
  zck__manifest_count_reread(*reread);
  return fs;
}

/* The stream has the whole file (size bytes): the last segments and the digests. */
static zck_status finish_segments(zck__shash *h, uint64_t size) {
  while (h->seg < h->n_segs) { /* segments ending at the cursor (the last one, empty ones) */
    if (h->segs[h->seg].off + h->segs[h->seg].len > h->cursor) { h->dropped = true; return ZCK_OK; }
    if (h->segs[h->seg].kind == SEG_REGION) close_region(h, &h->segs[h->seg]);
    h->seg++;
  }
  if (h->chunk_oom) { h->dropped = true; return ZCK_OK; }
  if (h->chunk_fill) { /* the last, partial chunk (the file itself when it is the first) */
    if (!grow((void **)&h->chunks, &h->cap_chunks, h->n_chunks, sizeof *h->chunks)) return ZCK_ERR_NO_MEMORY;
    h->chunks[h->n_chunks] = h->n_chunks ? XXH3_64bits_digest(h->cst) : XXH3_64bits_digest(h->fst);
    h->n_chunks++;
  }
  h->xxh3 = XXH3_64bits_digest(h->fst);
  h->size = size;
  h->done = true;
  return ZCK_OK;
}

static zck_status finish(zck__shash *h, const char *path, bool laid_out, uint64_t *reread) {
  pthread_mutex_lock(&h->mu);
  h->on = false;
  bool ok = !h->dropped; /* pieces still waiting: the stream stalled; the rest is read */
  drop_pending(h);
  pthread_mutex_unlock(&h->mu);
  if (!ok) return ZCK_OK;
  /* the file's size only, when the stream has it all: its writer's word for it, or a stat
   * (not an open: a universal folder of 100k params finishes 300k files) */
  struct stat sb;
  if (laid_out && h->cursor == h->end) return finish_segments(h, h->cursor);
  if (stat(path, &sb) != 0) return zck__fail_errno(errno, "%s: cannot stat", path);
  if ((uint64_t)sb.st_size != h->end || h->cursor > (uint64_t)sb.st_size) h->dropped = true;
  if (h->dropped) return ZCK_OK;
  if (h->cursor == (uint64_t)sb.st_size) return finish_segments(h, h->cursor);
  zck__source src;
  ZCK_TRY(zck__source_open(&src, path));
  zck_status st = ZCK_OK;
  if (src.size != h->end || h->cursor > src.size) h->dropped = true;
  /* a distributed job: the rest was written by other ranks; the manifest writer has the
   * file read by one of them (zck__hash_files_lead) rather than all of it here */
  if (!h->dropped && h->cursor < src.size && zck__dist_on()) h->dropped = true;
  if (!h->dropped && h->cursor < src.size) {
    size_t bufsz = (size_t)4 << 20;
    uint8_t *buf = malloc(bufsz);
    if (!buf) st = ZCK_ERR_NO_MEMORY;
    *reread = src.size - h->cursor;
    h->reread = *reread;
    while (st == ZCK_OK && !h->dropped && h->cursor < src.size) {
      size_t k = src.size - h->cursor < bufsz ? (size_t)(src.size - h->cursor) : bufsz;
      st = zck__source_read(&src, buf, k, h->cursor);
      if (st == ZCK_OK) take_read(h, buf, k);
    }
    free(buf);
  }
  uint64_t size = src.size;
  zck__source_close(&src);
  if (st != ZCK_OK || h->dropped) return st;
  return finish_segments(h, size);
}

bool zck__shash_done(const zck__shash *h) { return h && h->done && !h->dropped; }
uint64_t zck__shash_streamed(const zck__shash *h) { return h ? h->streamed : 0; }

zck_status zck__shash_known_file(const zck__shash *h, const char *relpath, zck__manifest_known_file *out) {
  memset(out, 0, sizeof *out);
  if (!zck__shash_done(h)) return ZCK_OK;
  zck__manifest_known_range *r = malloc((h->n_regs ? h->n_regs : 1) * sizeof *r);
  uint64_t *chunks = malloc((h->n_chunks ? h->n_chunks : 1) * sizeof *chunks);
  if (!r || !chunks) {
    free(r);
    free(chunks);
    return ZCK_ERR_NO_MEMORY;
  }
  if (h->n_chunks) memcpy(chunks, h->chunks, h->n_chunks * sizeof *chunks);
  for (size_t i = 0; i < h->n_regs; i++) r[i] = (zck__manifest_known_range){h->regs[i].off, h->regs[i].len, h->regs[i].xxh3};
  out->path = relpath;
  out->size = h->size;
  out->xxh3 = h->xxh3;
  out->chunks = chunks;
  out->n_chunks = h->n_chunks;
  out->ranges = r;
  out->n_ranges = h->n_regs;
  out->hashed = true;
  return ZCK_OK;
}

// ---- helpers for writers

void zck__shash_feed_split(zck__shash *h, uint64_t off, const void *bytes, uint64_t n) {
  const uint8_t *p = bytes;
  while (h && n) {
    uint64_t k = n;
    pthread_mutex_lock(&h->mu);
    const region *r = h->dropped ? NULL : region_of(h, off, 1);
    if (r && off + k > r->off + r->len) k = r->off + r->len - off;
    pthread_mutex_unlock(&h->mu);
    zck__shash_feed(h, off, p, k, NULL);
    off += k;
    p += k;
    n -= k;
  }
}

static zck_status fd_store_write(void *ctx, const void *src, uint64_t off, uint64_t count) {
  zck__shash_fd *c = ctx;
  uint64_t at = c->base + off * c->es, n = count * c->es;
  ZCK_TRY(zck__pwrite_all(c->fd, src, (size_t)n, at, c->name));
  zck__shash_feed_split(c->h, at, src, n); /* while the bytes are in the cache */
  return ZCK_OK;
}

zck_store zck__shash_fd_store(zck__shash_fd *ctx, int fd, uint64_t base, zck_dtype dtype, uint64_t numel,
                              const char *name, zck__shash *h) {
  *ctx = (zck__shash_fd){fd, base, zck_dtype_size(dtype), h, name ? name : "a target file"};
  /* unnamed: a failed write says what an FD store's does ("NAME: write of ..."), once */
  return zck_store_callback(NULL, fd_store_write, ctx, dtype, numel, NULL);
}

static zck_status wrap_store_write(void *ctx, const void *src, uint64_t off, uint64_t count) {
  zck__shash_wrap *c = ctx;
  ZCK_TRY(c->inner.write(c->inner.ctx, src, off, count));
  zck__shash_feed(c->h, c->base + off * c->es, src, count * c->es, NULL);
  return ZCK_OK;
}

zck_store zck__shash_wrap_store(zck__shash_wrap *ctx, const zck_store *inner, uint64_t base, zck__shash *h) {
  ZCK_ASSERT(inner->kind == ZCK_STORE_CALLBACK && inner->write);
  *ctx = (zck__shash_wrap){*inner, base, zck_dtype_size(inner->dtype), h};
  zck_store s = *inner;
  s.write = wrap_store_write;
  s.ctx = ctx;
  return s;
}

static void known_file_free(zck__manifest_known_file *f) {
  free((void *)f->path);
  free((void *)f->chunks);
  free((void *)f->ranges);
  free((void *)f->tensors);
  memset(f, 0, sizeof *f);
}

zck_status zck__known_take(zck__manifest_known *k, size_t *cap, zck__manifest_known_file *f, const char *relpath) {
  char *path = relpath ? strdup(relpath) : NULL;
  if (!path || !grow((void **)&k->files, cap, k->n_files, sizeof *k->files)) {
    free(path);
    known_file_free(f);
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  }
  f->path = path;
  k->files[k->n_files++] = *f;
  memset(f, 0, sizeof *f);
  return ZCK_OK;
}

void zck__known_free(zck__manifest_known *k) {
  for (size_t i = 0; k->files && i < k->n_files; i++) known_file_free(&k->files[i]);
  free(k->files);
  k->files = NULL;
  k->n_files = 0;
}

zck_status zck__known_bytes(zck__manifest_known *k, size_t *cap, const char *path, const char *relpath,
                            const void *bytes, uint64_t n) {
  zck__shash *h = zck__shash_new();
  if (!h) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  zck__shash_budget budget = {0, 0};
  zck__shash_bytes(h, 0, bytes, n);
  uint64_t reread = 0;
  zck_status st = zck__shash_start(h, &budget, k->chunk_size);
  if (st == ZCK_OK) st = zck__shash_finish(h, path, &reread);
  zck__manifest_known_file f;
  if (st == ZCK_OK) st = zck__shash_known_file(h, NULL, &f);
  if (st == ZCK_OK && f.hashed) st = zck__known_take(k, cap, &f, relpath);
  zck__shash_free(h);
  return st;
}

zck_status zck__known_merge(zck__manifest_known *dst, size_t *cap, zck__manifest_known *src) {
  zck_status st = ZCK_OK;
  for (size_t i = 0; i < src->n_files; i++) {
    zck__manifest_known_file f = src->files[i];
    const char *path = f.path;
    f.path = NULL;
    if (st == ZCK_OK) st = zck__known_take(dst, cap, &f, path);
    else known_file_free(&f);
    free((void *)path);
  }
  free(src->files);
  src->files = NULL;
  src->n_files = 0;
  return st;
}

static uint64_t g_default_budget;

uint64_t zck__shash_default_budget(void) { return g_default_budget ? g_default_budget : (uint64_t)64 << 20; }
void zck__shash_set_default_budget(uint64_t bytes) { g_default_budget = bytes; }

static _Atomic uint64_t g_reread;

void zck__manifest_count_reread(uint64_t bytes) {
  if (bytes) atomic_fetch_add(&g_reread, bytes);
}

uint64_t zck__manifest_reread_total(void) { return atomic_load(&g_reread); }
