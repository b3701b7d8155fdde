/* ds_hash.c: the manifest hashes of the writer's files (lib/manifest.h: XXH3-64 of each
 * whole file, of each chunk_size piece, of each storage's bytes) computed from the bytes
 * as the copy writes them, so that a reshard's manifest does not read its output back.
 *
 * XXH3 is a sequential hash, so each file is hashed front to back by a cursor. A torch
 * file is, in order: zip entries (local header, data, 16/24-byte data descriptor holding
 * the CRC), then data.pkl, a few small records and the central directory. The headers
 * are written by the zip writer only at finish, so they are predicted here from the
 * layout rules of zip_write.c (the data offsets the writer returned must match the
 * prediction, else the file is left to the manifest writer); a descriptor is predicted
 * once the cursor has passed its entry's data (its CRC from the written pieces); data
 * pieces arrive from the copy threads (ws_write), at the cursor or ahead of it: ahead,
 * they are copied into a bounded buffer shared by the writer's files, and when that is
 * full the file stops streaming. Bytes that no plan writes (zck__ds_hash_cover says which
 * are) are zeros. At commit every predicted byte is checked against the file (a few
 * dozen bytes per entry; the descriptors' CRCs also check the data fed in between), and
 * whatever the cursor did not reach (the pickle and directory at the end, or all of the
 * rest of a file that stopped streaming) is read from the file: the result is what a
 * reader of the finished file computes, or the file is left out. */
#include "ds_writer.h"

#include "zip/zip_internal.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

typedef enum { HS_BYTES, HS_DATA, HS_DESC } hs_kind;

typedef struct hs_seg {
  hs_kind kind;
  uint64_t off, len;        /* file bytes */
  uint8_t *bytes;           /* HS_BYTES: the bytes; HS_DESC: filled when predicted */
  size_t entry;             /* the entry whose header (HS_BYTES, is_data false), data or descriptor this is */
  bool is_data;             /* entry data (a storage's bytes, or byteorder's) */
} hs_seg;

typedef struct hs_range { uint64_t off, len; } hs_range;

typedef struct hs_entry {
  uint64_t data_off, size;
  bool storage;             /* a tensor storage (its bytes are a manifest range) */
  uint32_t crc;             /* of the data fed so far */
  uint64_t xxh3;            /* of the data, once passed */
  bool hashed;
  hs_range *cover;          /* bytes of the data some plan writes (relative); the rest is zeros */
  size_t n_cover, cap_cover;
  size_t cover_at;          /* the first range not wholly behind the cursor (it only moves on) */
} hs_entry;

typedef struct hs_piece {
  uint64_t off, len;        /* file bytes */
  uint32_t crc;
  uint8_t *data;
} hs_piece;

struct zck__ds_hfile {
  char *name;
  char prefix[256];         /* the archive folder torch_write.c names it with */
  bool disabled;            /* the layout could not be predicted: not hashed here */
  bool on, busy, broken;
  pthread_mutex_t mu;
  zck__ds_hbudget *budget;
  hs_seg *segs;
  size_t n_segs, cap_segs, seg;
  hs_entry *ents;
  size_t n_ents, cap_ents;
  uint64_t end;             /* the zip writer's cursor after the last entry */
  uint64_t cursor;          /* bytes hashed */
  uint64_t streamed;        /* bytes hashed from memory (the rest is read back) */
  hs_piece *pend;           /* a min-heap by off: the piece at the cursor, if any, is pend[0] */
  size_t n_pend, cap_pend;
  bool want_crc;            /* entry CRCs are needed (descriptors still to predict) */
  XXH3_state_t *fst, *cst, *rst;
  uint64_t chunk_size, chunk_fill;
  uint64_t *chunks;
  size_t n_chunks, cap_chunks;
  /* results */
  bool done;
  uint64_t size, xxh3;
};

static uint8_t zeros[1 << 16];
#define HS_SLICE ((uint64_t)64 << 10)

// ---- layout (build time; nothing is hashed yet)

static bool grow(void **v, size_t *cap, size_t n, size_t es) {
  if (n < *cap) return true;
  size_t nc = *cap ? 2 * *cap : 16;
  void *p = realloc(*v, nc * es);
  if (!p) return false;
  *v = p;
  *cap = nc;
  return true;
}

static bool add_seg(zck__ds_hfile *f, hs_seg s) {
  if (!grow((void **)&f->segs, &f->cap_segs, f->n_segs, sizeof *f->segs)) return false;
  f->segs[f->n_segs++] = s;
  return true;
}

static void le16(uint8_t **p, uint16_t v) { (*p)[0] = (uint8_t)v; (*p)[1] = (uint8_t)(v >> 8); *p += 2; }
static void le32(uint8_t **p, uint32_t v) { for (int i = 0; i < 4; i++) (*p)[i] = (uint8_t)(v >> (8 * i)); *p += 4; }
static void le64(uint8_t **p, uint64_t v) { for (int i = 0; i < 8; i++) (*p)[i] = (uint8_t)(v >> (8 * i)); *p += 8; }

static size_t z64_len(uint64_t size, uint64_t header_off) {
  bool bs = size >= ZCK_ZIP_U32_MAX, bo = header_off >= ZCK_ZIP_U32_MAX;
  return (bs || bo) ? 4u + (bs ? 16u : 0u) + (bo ? 8u : 0u) : 0u;
}

/* One zip entry as zip_write.c lays it out at the writer's cursor: its header (predicted
 * bytes), its data (known bytes, or written by the copy), its descriptor. false: no memory
 * (the file is then disabled). */
static bool add_entry(zck__ds_hfile *f, const char *name, uint64_t size, const void *known, bool storage,
                      uint64_t expect_data_off) {
  size_t nlen = strlen(name), z64 = z64_len(size, f->end);
  uint64_t start = f->end + ZCK_ZIP_LOCAL_SIZE + nlen + z64 + 4, pad = (ZCK_ZIP_ALIGN - start % ZCK_ZIP_ALIGN) % ZCK_ZIP_ALIGN;
  uint64_t data_off = start + pad, hlen = data_off - f->end;
  if (expect_data_off != UINT64_MAX && expect_data_off != data_off) return false;
  if (!grow((void **)&f->ents, &f->cap_ents, f->n_ents, sizeof *f->ents)) return false;
  uint8_t *h = malloc(hlen), *p = h;
  if (!h) return false;
  le32(&p, ZCK_ZIP_LOCAL_SIG);
  le16(&p, 0);
  le16(&p, (uint16_t)(size ? ZCK_ZIP_FLAG_UTF8 | ZCK_ZIP_FLAG_DESCRIPTOR : ZCK_ZIP_FLAG_UTF8));
  le16(&p, 0);
  le32(&p, 0);
  le32(&p, 0);
  le32(&p, 0);
  le32(&p, 0);
  le16(&p, (uint16_t)nlen);
  le16(&p, (uint16_t)(z64 + 4 + pad));
  memcpy(p, name, nlen);
  p += nlen;
  if (z64) {
    bool bs = size >= ZCK_ZIP_U32_MAX, bo = f->end >= ZCK_ZIP_U32_MAX;
    le16(&p, ZCK_ZIP64_EXTRA_ID);
    le16(&p, (uint16_t)(z64 - 4));
    if (bs) {
      le64(&p, size);
      le64(&p, 0);
    }
    if (bo) le64(&p, f->end);
  }
  le16(&p, ZCK_ZIP_PAD_EXTRA_ID);
  le16(&p, (uint16_t)pad);
  memset(p, 'Z', (size_t)pad);
  size_t e = f->n_ents;
  f->ents[e] = (hs_entry){data_off, size, storage, 0, 0, false, NULL, 0, 0, 0};
  uint8_t *kb = NULL;
  if (known && size && !(kb = malloc((size_t)size))) { free(h); return false; }
  if (kb) memcpy(kb, known, (size_t)size);
  f->n_ents++;
  bool ok = add_seg(f, (hs_seg){HS_BYTES, f->end, hlen, h, e, false});
  if (!ok) free(h);
  if (ok) ok = add_seg(f, (hs_seg){known || !size ? HS_BYTES : HS_DATA, data_off, size, kb, e, true});
  else free(kb);
  size_t dlen = size ? (z64 ? 24u : 16u) : 0u;
  if (ok && dlen) ok = add_seg(f, (hs_seg){HS_DESC, data_off + size, dlen, NULL, e, false});
  f->end = data_off + size + dlen;
  return ok;
}

zck__ds_hfile *zck__ds_hfile_new(const char *name) {
  zck__ds_hfile *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  pthread_mutex_init(&f->mu, NULL);
  if (!(f->name = zck__strdup(name))) { zck__ds_hfile_free(f); return NULL; }
  /* torch_write.c: "<stem>/byteorder" = "little" first */
  zck_torch_archive_name(name, f->prefix, sizeof f->prefix);
  char rec[300];
  snprintf(rec, sizeof rec, "%s/byteorder", f->prefix);
  if (!add_entry(f, rec, 6, "little", false, UINT64_MAX)) f->disabled = true;
  return f;
}

void zck__ds_hfile_storage(zck__ds_hfile *f, size_t index, uint64_t data_off, uint64_t nbytes, const void *known) {
  if (!f || f->disabled) return;
  char name[300];
  snprintf(name, sizeof name, "%s/data/%zu", f->prefix, index);
  /* storage i is the writer's zip entry i + 1 (after byteorder): any other order is not predicted */
  if (f->n_ents != index + 1 || !add_entry(f, name, nbytes, known, true, data_off)) f->disabled = true;
}

size_t zck__ds_hfile_entry(const zck__ds_hfile *f, size_t storage_index) { (void)f; return storage_index + 1; }

void zck__ds_hfile_free(zck__ds_hfile *f) {
  if (!f) return;
  for (size_t i = 0; i < f->n_segs; i++) free(f->segs[i].bytes);
  for (size_t i = 0; i < f->n_ents; i++) free(f->ents[i].cover);
  for (size_t i = 0; i < f->n_pend; i++) {
    if (f->budget) atomic_fetch_sub(&f->budget->used, f->pend[i].len);
    free(f->pend[i].data);
  }
  free(f->segs);
  free(f->ents);
  free(f->pend);
  free(f->chunks);
  XXH3_freeState(f->fst);
  XXH3_freeState(f->cst);
  XXH3_freeState(f->rst);
  pthread_mutex_destroy(&f->mu);
  free(f->name);
  free(f);
}

void zck__ds_hash_cover(zck__ds_hfile *f, size_t entry, uint64_t off, uint64_t len) {
  if (!f || f->disabled || !len) return;
  if (entry >= f->n_ents) { f->disabled = true; return; }
  hs_entry *e = &f->ents[entry];
  if (!grow((void **)&e->cover, &e->cap_cover, e->n_cover, sizeof *e->cover)) { f->disabled = true; return; }
  e->cover[e->n_cover++] = (hs_range){off, len};
}

static int cmp_hs_range(const void *a, const void *b) {
  const hs_range *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

// ---- the stream

/* The next n bytes of the file at the cursor: file, chunk and storage hashes, and (while
 * descriptors are predicted) the entry's CRC; crc_given: crc is that of these n bytes. */
static void take(zck__ds_hfile *f, const uint8_t *p, uint64_t n, bool crc_given, uint32_t crc) {
  uint64_t total = n;
  /* a piece inside one entry's data brings its CRC: combined once at the end */
  const hs_seg *s0 = f->seg < f->n_segs ? &f->segs[f->seg] : NULL;
  bool whole = crc_given && f->want_crc && s0 && s0->is_data && f->cursor >= s0->off && f->cursor + n <= s0->off + s0->len;
  hs_entry *e0 = whole ? &f->ents[s0->entry] : NULL;
  while (n) {
    const hs_seg *s = f->seg < f->n_segs ? &f->segs[f->seg] : NULL;
    while (s && f->cursor >= s->off + s->len) {
      if (s->is_data && !f->ents[s->entry].hashed) {
        hs_entry *e = &f->ents[s->entry];
        e->xxh3 = s->len ? XXH3_64bits_digest(f->rst) : XXH3_64bits(NULL, 0);
        e->hashed = true;
      }
      f->seg++;
      s = f->seg < f->n_segs ? &f->segs[f->seg] : NULL;
    }
    uint64_t k = s && f->cursor >= s->off ? s->off + s->len - f->cursor : s ? s->off - f->cursor : n;
    if (k > n) k = n;
    /* the three hashes over one slice while it is in the cache (hashing is memory-bound) */
    if (k > HS_SLICE) k = HS_SLICE;
    XXH3_64bits_update(f->fst, p, (size_t)k);
    for (uint64_t i = 0; i < k;) { /* chunk boundaries may fall inside */
      uint64_t t = f->chunk_size - f->chunk_fill < k - i ? f->chunk_size - f->chunk_fill : k - i;
      XXH3_64bits_update(f->cst, p + i, (size_t)t);
      i += t;
      f->chunk_fill += t;
      if (f->chunk_fill == f->chunk_size) {
        if (grow((void **)&f->chunks, &f->cap_chunks, f->n_chunks, sizeof *f->chunks)) f->chunks[f->n_chunks++] = XXH3_64bits_digest(f->cst);
        else f->disabled = true;
        XXH3_64bits_reset(f->cst);
        f->chunk_fill = 0;
      }
    }
    if (s && f->cursor >= s->off && s->is_data) {
      hs_entry *e = &f->ents[s->entry];
      if (f->cursor == s->off) XXH3_64bits_reset(f->rst);
      XXH3_64bits_update(f->rst, p, (size_t)k);
      if (f->want_crc && !whole) e->crc = zck_crc32_update(e->crc, p, (size_t)k);
    }
    f->cursor += k;
    p += k;
    n -= k;
  }
  if (e0) e0->crc = zck_crc32_combine(e0->crc, crc, total);
  /* an entry whose data just ended (or an empty one at the cursor) gets its hash now */
  while (f->seg < f->n_segs && f->cursor >= f->segs[f->seg].off + f->segs[f->seg].len) {
    const hs_seg *s = &f->segs[f->seg];
    if (s->is_data && !f->ents[s->entry].hashed) {
      f->ents[s->entry].xxh3 = s->len ? XXH3_64bits_digest(f->rst) : XXH3_64bits(NULL, 0);
      f->ents[s->entry].hashed = true;
    }
    f->seg++;
  }
}

/* The first byte of a hole (never written: zeros) at rel in entry e, and where it ends.
 * rel never goes back (it is the cursor's), so the scan resumes where it stopped: an entry
 * holding 100k params costs one pass over its ranges, not one per piece. */
static bool in_hole(hs_entry *e, uint64_t rel, uint64_t *hole_end) {
  while (e->cover_at < e->n_cover && e->cover[e->cover_at].off + e->cover[e->cover_at].len <= rel) e->cover_at++;
  if (e->cover_at < e->n_cover && e->cover[e->cover_at].off <= rel) return false;
  *hole_end = e->cover_at < e->n_cover ? e->cover[e->cover_at].off : e->size;
  return true;
}

/* The pieces ahead of the cursor, a binary min-heap by file offset (pieces arrive in any
 * order from the copy threads; the cursor takes them front to back). */
static void pend_swap(hs_piece *a, hs_piece *b) { hs_piece t = *a; *a = *b; *b = t; }

static void pend_push(zck__ds_hfile *f, hs_piece pc) {
  size_t i = f->n_pend++;
  f->pend[i] = pc;
  while (i && f->pend[(i - 1) / 2].off > f->pend[i].off) {
    pend_swap(&f->pend[(i - 1) / 2], &f->pend[i]);
    i = (i - 1) / 2;
  }
}

static hs_piece pend_pop(zck__ds_hfile *f) {
  hs_piece top = f->pend[0];
  f->pend[0] = f->pend[--f->n_pend];
  for (size_t i = 0;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < f->n_pend && f->pend[l].off < f->pend[m].off) m = l;
    if (r < f->n_pend && f->pend[r].off < f->pend[m].off) m = r;
    if (m == i) break;
    pend_swap(&f->pend[i], &f->pend[m]);
    i = m;
  }
  return top;
}

static void drop_pending(zck__ds_hfile *f) {
  for (size_t i = 0; i < f->n_pend; i++) {
    atomic_fetch_sub(&f->budget->used, f->pend[i].len);
    free(f->pend[i].data);
  }
  f->n_pend = 0;
}

/* With f->mu held and f->busy ours: feeds everything known at the cursor (headers,
 * descriptors, zeros, pieces that were ahead), unlocking while hashing; stops at data not
 * yet written, or after the last entry. */
static void advance(zck__ds_hfile *f) {
  while (!f->broken && f->seg < f->n_segs) {
    hs_seg *s = &f->segs[f->seg];
    if (f->cursor < s->off) { f->broken = true; break; } /* cannot happen: segments are contiguous */
    uint64_t at = f->cursor - s->off, left = s->len - at;
    if (s->kind == HS_BYTES || s->kind == HS_DESC) {
      if (s->kind == HS_DESC && !s->bytes) {
        hs_entry *e = &f->ents[s->entry];
        uint8_t *d = malloc((size_t)s->len), *p = d;
        if (!d) { f->broken = true; break; }
        le32(&p, ZCK_ZIP_DESCRIPTOR_SIG);
        le32(&p, e->crc);
        if (s->len == 24) {
          le64(&p, e->size);
          le64(&p, e->size);
        } else {
          le32(&p, (uint32_t)e->size);
          le32(&p, (uint32_t)e->size);
        }
        s->bytes = d;
      }
      const uint8_t *b = s->bytes ? s->bytes + at : zeros; /* NULL: an empty entry */
      pthread_mutex_unlock(&f->mu);
      take(f, b, left, false, 0);
      pthread_mutex_lock(&f->mu);
      continue;
    }
    hs_entry *e = &f->ents[s->entry];
    uint64_t hole_end;
    if (in_hole(e, at, &hole_end)) {
      uint64_t k = hole_end - at < sizeof zeros ? hole_end - at : sizeof zeros;
      pthread_mutex_unlock(&f->mu);
      take(f, zeros, k, false, 0);
      pthread_mutex_lock(&f->mu);
      continue;
    }
    if (!f->n_pend || f->pend[0].off != f->cursor) break; /* wait for the copy */
    hs_piece pc = pend_pop(f);
    if (pc.len > left) { free(pc.data); f->broken = true; break; }
    pthread_mutex_unlock(&f->mu);
    take(f, pc.data, pc.len, true, pc.crc);
    f->streamed += pc.len;
    free(pc.data);
    atomic_fetch_sub(&f->budget->used, pc.len);
    pthread_mutex_lock(&f->mu);
  }
  if (f->broken) drop_pending(f);
}

void zck__ds_hfeed(zck__ds_hfile *f, size_t entry, uint64_t rel, const void *src, uint64_t n, uint32_t crc) {
  if (!f || !f->on || !n) return;
  pthread_mutex_lock(&f->mu);
  if (f->broken || f->disabled || entry >= f->n_ents) goto out;
  uint64_t off = f->ents[entry].data_off + rel;
  /* (cursor and seg belong to the busy thread while it hashes) */
  const hs_seg *s = !f->busy && f->seg < f->n_segs ? &f->segs[f->seg] : NULL;
  bool here = s && off == f->cursor && s->kind == HS_DATA && s->entry == entry && off + n <= s->off + s->len;
  if (!here) {
    /* ahead of the cursor: kept while the shared budget allows, else this file stops
     * streaming (a piece behind the cursor is an overlapping write: the same) */
    uint64_t used = atomic_fetch_add(&f->budget->used, n) + n;
    bool behind = !f->busy && off < f->cursor;
    uint8_t *copy = used <= f->budget->max && !behind ? malloc((size_t)n) : NULL;
    if (!copy || !grow((void **)&f->pend, &f->cap_pend, f->n_pend, sizeof *f->pend)) {
      free(copy);
      atomic_fetch_sub(&f->budget->used, n);
      f->broken = true;
      drop_pending(f);
      goto out;
    }
    memcpy(copy, src, (size_t)n);
    pend_push(f, (hs_piece){off, n, crc, copy});
    goto out;
  }
  f->busy = true;
  pthread_mutex_unlock(&f->mu);
  take(f, src, n, true, crc);
  f->streamed += n;
  pthread_mutex_lock(&f->mu);
  advance(f);
  f->busy = false;
out:
  pthread_mutex_unlock(&f->mu);
}

zck_status zck__ds_hfile_start(zck__ds_hfile *f, zck__ds_hbudget *budget, uint64_t chunk_size) {
  if (!f || f->disabled) return ZCK_OK;
  f->budget = budget;
  f->chunk_size = chunk_size ? chunk_size : ZCK_MANIFEST_DEFAULT_CHUNK;
  f->fst = XXH3_createState();
  f->cst = XXH3_createState();
  f->rst = XXH3_createState();
  if (!f->fst || !f->cst || !f->rst) return ZCK_ERR_NO_MEMORY;
  XXH3_64bits_reset(f->fst);
  XXH3_64bits_reset(f->cst);
  XXH3_64bits_reset(f->rst);
  for (size_t i = 0; i < f->n_ents; i++) { /* the written ranges, sorted and merged */
    hs_entry *e = &f->ents[i];
    if (e->n_cover > 1) qsort(e->cover, e->n_cover, sizeof *e->cover, cmp_hs_range);
    size_t k = 0;
    for (size_t j = 0; j < e->n_cover; j++) {
      if (k && e->cover[k - 1].off + e->cover[k - 1].len >= e->cover[j].off) {
        uint64_t end = e->cover[j].off + e->cover[j].len;
        if (end > e->cover[k - 1].off + e->cover[k - 1].len) e->cover[k - 1].len = end - e->cover[k - 1].off;
      } else {
        e->cover[k++] = e->cover[j];
      }
    }
    e->n_cover = k;
  }
  f->want_crc = true;
  f->on = true;
  pthread_mutex_lock(&f->mu);
  f->busy = true;
  advance(f);
  f->busy = false;
  pthread_mutex_unlock(&f->mu);
  return ZCK_OK;
}

/* After the file is complete at path: checks every predicted byte, hashes what the stream
 * did not reach by reading it, and finalizes. *reread: bytes read back. A file whose
 * prediction was wrong ends disabled (ZCK_OK: the manifest writer hashes it). */
zck_status zck__ds_hfile_finish(zck__ds_hfile *f, const char *path, uint64_t *reread) {
  *reread = 0;
  if (!f || !f->on || f->disabled) return ZCK_OK;
  f->on = false;
  if (f->n_pend) { /* pieces the cursor went past (as zeros): the coverage was wrong */
    drop_pending(f);
    f->disabled = true;
    return ZCK_OK;
  }
  zck__source src;
  ZCK_TRY(zck__source_open(&src, path));
  zck_status st = ZCK_OK;
  uint8_t *buf = NULL;
  size_t bufsz = (size_t)4 << 20;
  uint8_t small[64];
  for (size_t i = 0; i < f->n_segs && !f->disabled; i++) {
    const hs_seg *s = &f->segs[i];
    if (s->kind == HS_DATA || s->off + s->len > f->cursor || !s->len) continue;
    if (s->off + s->len > src.size) { f->disabled = true; break; }
    /* headers, descriptors and the small known data, as the stream hashed them */
    for (uint64_t at = 0; at < s->len && !f->disabled;) {
      size_t k = s->len - at < sizeof small ? (size_t)(s->len - at) : sizeof small;
      st = zck__source_read(&src, small, k, s->off + at);
      if (st != ZCK_OK) goto out;
      if (memcmp(small, s->bytes + at, k)) f->disabled = true;
      at += k;
    }
  }
  if (f->disabled) goto out;
  f->want_crc = false;
  *reread = src.size > f->cursor ? src.size - f->cursor : 0;
  if (src.size < f->cursor) { f->disabled = true; goto out; }
  if (!(buf = malloc(bufsz))) { st = ZCK_ERR_NO_MEMORY; goto out; }
  while (f->cursor < src.size) {
    size_t k = src.size - f->cursor < bufsz ? (size_t)(src.size - f->cursor) : bufsz;
    st = zck__source_read(&src, buf, k, f->cursor);
    if (st != ZCK_OK) goto out;
    take(f, buf, k, false, 0);
  }
  f->xxh3 = XXH3_64bits_digest(f->fst);
  if (f->chunk_fill) {
    if (grow((void **)&f->chunks, &f->cap_chunks, f->n_chunks, sizeof *f->chunks)) f->chunks[f->n_chunks++] = XXH3_64bits_digest(f->cst);
    else f->disabled = true;
  }
  f->size = src.size;
  for (size_t i = 0; i < f->n_ents; i++)
    if (f->ents[i].storage && !f->ents[i].hashed) f->disabled = true;
  f->done = !f->disabled;
out:
  free(buf);
  zck__source_close(&src);
  return st;
}

uint64_t zck__ds_hfile_streamed(const zck__ds_hfile *f) { return f ? f->streamed : 0; }

zck_status zck__ds_hfile_known(const zck__ds_hfile *f, zck__manifest_known_file *out) {
  memset(out, 0, sizeof *out);
  if (!f || !f->done) return ZCK_OK;
  size_t n = 0;
  for (size_t i = 0; i < f->n_ents; i++) n += f->ents[i].storage;
  zck__manifest_known_range *r = calloc(n + 1, sizeof *r);
  if (!r) return ZCK_ERR_NO_MEMORY;
  n = 0;
  for (size_t i = 0; i < f->n_ents; i++)
    if (f->ents[i].storage) r[n++] = (zck__manifest_known_range){f->ents[i].data_off, f->ents[i].size, f->ents[i].xxh3};
  out->path = f->name;
  out->size = f->size;
  out->xxh3 = f->xxh3;
  out->chunks = f->chunks;
  out->n_chunks = f->n_chunks;
  out->ranges = r;
  out->n_ranges = n;
  out->hashed = true;
  return ZCK_OK;
}
