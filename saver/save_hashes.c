/* save_hashes.c: a save written rank by rank (save_rank.c) makes the tag folder's manifest
 * from the hashes each rank's writer made while writing its own files: every rank in turn
 * broadcasts its files' hashes, which rank 0 collects, so the manifest reads none of the
 * folder back. A file a rank could not hash as it wrote it is simply absent: the manifest
 * writer reads that one. */
#include "saver_internal.h"

#include "error.h"
#include "stream_hash.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct hbuf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
} hbuf;

static void put(hbuf *b, const void *v, size_t n) {
  if (b->oom || !n) return;
  if (b->n + n > b->cap) {
    size_t c = b->cap ? b->cap : 256;
    while (c < b->n + n) c *= 2;
    uint8_t *q = realloc(b->p, c);
    if (!q) { b->oom = true; return; }
    b->p = q;
    b->cap = c;
  }
  memcpy(b->p + b->n, v, n);
  b->n += n;
}

static void put_u64(hbuf *b, uint64_t v) { put(b, &v, sizeof v); }

/* n_files, then per file: path (length, bytes), size, xxh3, chunks, ranges. */
static void put_known(hbuf *b, const zck__manifest_known *k) {
  size_t n = 0;
  for (size_t i = 0; k && i < k->n_files; i++) n += k->files[i].hashed;
  put_u64(b, n);
  for (size_t i = 0; k && i < k->n_files; i++) {
    const zck__manifest_known_file *f = &k->files[i];
    if (!f->hashed) continue;
    put_u64(b, strlen(f->path));
    put(b, f->path, strlen(f->path));
    put_u64(b, f->size);
    put_u64(b, f->xxh3);
    put_u64(b, f->n_chunks);
    put(b, f->chunks, f->n_chunks * sizeof *f->chunks);
    put_u64(b, f->n_ranges);
    put(b, f->ranges, f->n_ranges * sizeof *f->ranges);
  }
}

static bool get(const uint8_t **at, const uint8_t *end, void *v, size_t n) {
  if ((size_t)(end - *at) < n) return false;
  memcpy(v, *at, n);
  *at += n;
  return true;
}

/* Count items of `size` bytes, malloc'd: NULL on a short buffer or no memory. */
static void *get_array(const uint8_t **at, const uint8_t *end, uint64_t count, size_t size) {
  if (count > (uint64_t)(end - *at) / size) return NULL;
  void *v = malloc(count ? count * size : 1);
  if (v) get(at, end, v, count * size);
  return v;
}

static zck_status get_known(const uint8_t *at, const uint8_t *end, zck__manifest_known *all, size_t *cap) {
  uint64_t n = 0;
  if (!get(&at, end, &n, sizeof n)) return zck__fail(ZCK_ERR_INTERNAL, "a rank's manifest hashes are cut short");
  for (uint64_t i = 0; i < n; i++) {
    zck__manifest_known_file f;
    memset(&f, 0, sizeof f);
    uint64_t plen = 0, nc = 0, nr = 0;
    char path[4096];
    bool ok = get(&at, end, &plen, sizeof plen) && plen < sizeof path && get(&at, end, path, (size_t)plen);
    if (ok) path[plen] = 0;
    ok = ok && get(&at, end, &f.size, sizeof f.size) && get(&at, end, &f.xxh3, sizeof f.xxh3) && get(&at, end, &nc, sizeof nc) &&
         (f.chunks = get_array(&at, end, nc, sizeof *f.chunks)) && get(&at, end, &nr, sizeof nr) &&
         (f.ranges = get_array(&at, end, nr, sizeof *f.ranges));
    if (!ok) {
      free((void *)f.chunks);
      free((void *)f.ranges);
      return zck__fail(ZCK_ERR_INTERNAL, "a rank's manifest hashes are cut short");
    }
    f.n_chunks = (size_t)nc;
    f.n_ranges = (size_t)nr;
    f.hashed = true;
    ZCK_TRY(zck__known_take(all, cap, &f, path));
  }
  return ZCK_OK;
}

#define PIECE ((size_t)64 << 10)

zck_status zck__saver_gather_hashes(zck_comm *c, const zck__manifest_known *own, zck__manifest_known *all, size_t *cap) {
  /* every rank makes the same collective calls whatever happens locally (a failure is
   * carried to the end, not out of the loop): only rank 0 keeps what it receives */
  zck_status st = ZCK_OK;
  for (int r = 0; r < c->size; r++) {
    hbuf mine = {0}, got = {0};
    if (c->rank == r) put_known(&mine, own);
    uint64_t len = mine.oom ? UINT64_MAX : mine.n;
    zck_status cs = r > 0 ? c->broadcast(c, &len, 1, ZCK_U64, r) : ZCK_OK;
    if (cs != ZCK_OK) { /* the group is broken: no further collective */
      free(mine.p);
      return cs;
    }
    if (len == UINT64_MAX) {
      if (st == ZCK_OK) st = zck__fail(ZCK_ERR_NO_MEMORY, "rank %d: out of memory", r);
      free(mine.p);
      continue;
    }
    for (uint64_t at = 0; r > 0 && at < len;) { /* in pieces: no rank allocates the whole */
      uint8_t piece[PIECE];
      size_t k = len - at < PIECE ? (size_t)(len - at) : PIECE;
      if (c->rank == r) memcpy(piece, mine.p + at, k);
      if ((cs = c->broadcast(c, piece, k, ZCK_U8, r)) != ZCK_OK) {
        free(mine.p);
        free(got.p);
        return cs;
      }
      if (c->rank == 0) put(&got, piece, k);
      at += k;
    }
    if (c->rank == 0 && st == ZCK_OK) {
      const hbuf *h = r == 0 ? &mine : &got;
      st = h->oom ? zck__fail(ZCK_ERR_NO_MEMORY, "out of memory") : get_known(h->p, h->p + len, all, cap);
    }
    free(mine.p);
    free(got.p);
  }
  return st;
}

zck_status zck__saver_hashes_encode(const zck__manifest_known *own, void **out, size_t *n) {
  hbuf b = {0};
  put_known(&b, own);
  if (b.oom) {
    free(b.p);
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  }
  *out = b.p;
  *n = b.n;
  return ZCK_OK;
}

zck_status zck__saver_hashes_decode(const void *p, size_t n, zck__manifest_known *all, size_t *cap) {
  return get_known(p, (const uint8_t *)p + n, all, cap);
}
