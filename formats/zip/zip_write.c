/* zip_write.c: the zip writer, reserve-then-fill.
 *
 * Entries are laid out one after another as torch's miniz writer lays them out
 * (torch-pt-format.md §1.3), so that for the same records zckpt writes the same bytes as
 * torch.save: local header (version 0, flags 0x0808, or 0x0800 when empty, time 0, CRC and
 * sizes 0), a ZIP64 extra when the size or the header offset reaches 0xFFFFFFFF, the 'FB'
 * extra field padding the data to a 64-byte boundary, the data, and for non-empty entries a
 * data descriptor (16 bytes, 24 with ZIP64). The archive ends with the central directory, a
 * ZIP64 end record and locator (always, as torch does), and the end record.
 *
 * reserve() only computes offsets, so callers can pwrite entry data from many threads;
 * headers, descriptors and the directory are written at finish(), when the CRCs are known.
 *
 * A writer given a stream hasher (zck_zip_writer_hash) hands it every byte it lays out as
 * soon as the byte is known: an entry's local header and data region at reserve, its data
 * descriptor as a function of the data's CRC, the data of zck_zip_writer_add, the central
 * directory and end records at finish. The hasher thus follows the file front to back
 * without knowing anything of zip, and nothing re-derives this file's layout.
 */
#include "zip_internal.h"
#include "stream_hash.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
  char *name;
  uint16_t name_len;
  bool crc_set;
  uint8_t *held;            /* an archive at an offset: small data kept for finish's runs */
  uint32_t crc;
  uint64_t header_offset, data_offset, size;
} zck__zip_wentry;

struct zck_zip_writer {
  zck__outfile *out;
  zck__zip_wentry *e;
  size_t count, cap;
  uint64_t cursor;          /* end of the last reserved entry (its descriptor included) */
  bool force_zip64, finished;
  zck__zip_names names;
  zck__shash *hash;         /* optional: told every byte laid out (zck_zip_writer_hash) */
  uint64_t base;            /* file offset of the archive's byte 0 (zck_zip_writer_create_at);
                               every offset the archive records is relative to it */
  bool hold_small;          /* zck_zip_writer_add keeps the data for finish, which writes
                               each run of headers and small data with one pwrite: an item
                               of a DCP file is ~15 writes of a few bytes otherwise */
};

static const char *zck__zip_wentry_name(const void *ctx, size_t i) { return ((const zck_zip_writer *)ctx)->e[i].name; }

zck_status zck_zip_writer_create(zck__outfile *out, zck_zip_writer **w) {
  *w = zck__calloc(1, sizeof **w);
  if (!*w) return ZCK_ERR_NO_MEMORY;
  (*w)->out = out;
  return ZCK_OK;
}

zck_status zck_zip_writer_create_at(zck__outfile *out, uint64_t base, zck_zip_writer **w) {
  ZCK_TRY(zck_zip_writer_create(out, w));
  (*w)->base = base;
  (*w)->hold_small = true;
  return ZCK_OK;
}

void zck_zip_writer_hash(zck_zip_writer *w, zck__shash *h) {
  ZCK_ASSERT(w->count == 0 && w->base == 0);
  w->hash = h;
}

void zck_zip_writer_force_zip64(zck_zip_writer *w, bool on) {
  ZCK_ASSERT(w->count == 0);
  w->force_zip64 = on;
}

void zck_zip_writer_free(zck_zip_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->count; i++) {
    free(w->e[i].name);
    free(w->e[i].held);
  }
  free(w->e);
  zck__zip_names_free(&w->names);
  free(w);
}

/* An entry's size needs ZIP64 fields, and its header offset does (miniz's >= rule). */
static bool zck__zip_big_size(const zck_zip_writer *w, uint64_t size) { return w->force_zip64 || size >= ZCK_ZIP_U32_MAX; }
static bool zck__zip_big_offset(const zck_zip_writer *w, uint64_t off) { return w->force_zip64 || off >= ZCK_ZIP_U32_MAX; }

static size_t zck__zip_local_zip64_len(const zck_zip_writer *w, const zck__zip_wentry *e) {
  bool bs = zck__zip_big_size(w, e->size), bo = zck__zip_big_offset(w, e->header_offset);
  return (bs || bo) ? 4u + (bs ? 16u : 0u) + (bo ? 8u : 0u) : 0u;
}

static size_t zck__zip_descriptor_len(const zck_zip_writer *w, const zck__zip_wentry *e) {
  if (!e->size) return 0;
  return zck__zip_local_zip64_len(w, e) ? 24u : 16u;
}

static void zck__zip_tell_hash(zck_zip_writer *w, const zck__zip_wentry *e, size_t index, const void *known);

/* known: the entry's data when the writer itself writes it (zck_zip_writer_add), for the hasher. */
static zck_status zck__zip_reserve(zck_zip_writer *w, const char *name, uint64_t size, const void *known, size_t *index,
                                   uint64_t *data_offset) {
  ZCK_ASSERT(!w->finished);
  size_t nlen = strlen(name);
  const char *bad = zck__zip_name_problem(name, nlen);
  if (bad) return zck__fail(ZCK_ERR_INVALID_ARG, "%s: zip entry \"%s\": %s", w->out->path, name, bad);
  if (nlen > 0xFFFF - 1) return zck__fail(ZCK_ERR_INVALID_ARG, "%s: zip entry name of %zu bytes is too long", w->out->path, nlen);
  if (zck__zip_names_find_nocase(&w->names, name, zck__zip_wentry_name, w) != SIZE_MAX)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: zip entry \"%s\" added twice (names are compared ignoring case)", w->out->path, name);
  if (!ZCK__GROW(w->e, w->cap, w->count + 1)) return ZCK_ERR_NO_MEMORY;
  zck__zip_wentry *e = &w->e[w->count];
  memset(e, 0, sizeof *e);
  e->name_len = (uint16_t)nlen;
  e->size = size;
  e->header_offset = w->cursor;
  /* torch's getPadding: the 'FB' field (4 bytes + pad) follows the name and any ZIP64 extra. */
  uint64_t start = w->cursor + ZCK_ZIP_LOCAL_SIZE + nlen + zck__zip_local_zip64_len(w, e) + 4;
  uint64_t pad = (ZCK_ZIP_ALIGN - start % ZCK_ZIP_ALIGN) % ZCK_ZIP_ALIGN, end;
  e->data_offset = start + pad;
  if (!zck__add_u64(e->data_offset, size, &end) || !zck__add_u64(end, zck__zip_descriptor_len(w, e), &end) ||
      end > ((uint64_t)1 << 62))
    return zck__fail(ZCK_ERR_LIMIT, "%s: zip entry \"%s\" of %llu bytes at offset %llu: archive too large", w->out->path, name,
                     (unsigned long long)size, (unsigned long long)w->cursor);
  e->name = zck__strdup(name);
  if (!e->name) return ZCK_ERR_NO_MEMORY;
  if (!zck__zip_names_insert(&w->names, w->count, zck__zip_wentry_name, w)) {
    free(e->name);
    return ZCK_ERR_NO_MEMORY;
  }
  w->count++;
  w->cursor = end;
  *index = w->count - 1;
  *data_offset = w->base + e->data_offset;
  if (w->hash) zck__zip_tell_hash(w, e, *index, known);
  return ZCK_OK;
}

zck_status zck_zip_writer_reserve(zck_zip_writer *w, const char *name, uint64_t size, size_t *index, uint64_t *data_offset) {
  return zck__zip_reserve(w, name, size, NULL, index, data_offset);
}

void zck_zip_writer_set_crc(zck_zip_writer *w, size_t index, uint32_t crc) {
  ZCK_ASSERT(index < w->count && !w->finished);
  w->e[index].crc = crc;
  w->e[index].crc_set = true;
}

zck_status zck_zip_writer_add(zck_zip_writer *w, const char *name, const void *data, uint64_t size) {
  size_t index;
  uint64_t off;
  ZCK_TRY(zck__zip_reserve(w, name, size, data, &index, &off));
  if (size && w->hold_small) {
    if (!(w->e[index].held = zck__malloc((size_t)size))) return ZCK_ERR_NO_MEMORY;
    memcpy(w->e[index].held, data, (size_t)size);
  } else if (size) {
    ZCK_TRY(zck__outfile_pwrite(w->out, data, (size_t)size, off));
  }
  zck_zip_writer_set_crc(w, index, zck_crc32(0, data, (size_t)size));
  return ZCK_OK;
}

/* ---- finish: records are gathered into runs of contiguous bytes, one pwrite per run */

typedef struct {
  zck_zip_writer *w;
  zck__buf buf;
  uint64_t off;   /* file offset of buf.data[0] */
  zck_status st;
} zck__zip_emit;

static void zck__zip_flush(zck__zip_emit *m) {
  if (m->st == ZCK_OK && m->buf.failed) m->st = zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory writing zip records", m->w->out->path);
  if (m->st == ZCK_OK && m->buf.len) m->st = zck__outfile_pwrite(m->w->out, m->buf.data, m->buf.len, m->w->base + m->off);
  m->buf.len = 0;
}

/* Moves the write position to off (flushing if that is not where the run ends). */
static void zck__zip_seek(zck__zip_emit *m, uint64_t off) {
  if (m->off + m->buf.len != off) {
    zck__zip_flush(m);
    m->off = off;
  }
}

static void zck__zip_local_header(zck__zip_emit *m, const zck__zip_wentry *e) {
  zck_zip_writer *w = m->w;
  zck__buf *b = &m->buf;
  size_t z64 = zck__zip_local_zip64_len(w, e);
  uint64_t pad = e->data_offset - (e->header_offset + ZCK_ZIP_LOCAL_SIZE + e->name_len + z64 + 4);
  zck__buf_u32le(b, ZCK_ZIP_LOCAL_SIG);
  zck__buf_u16le(b, 0);                                                     /* version needed (stored) */
  zck__buf_u16le(b, e->size ? ZCK_ZIP_FLAG_UTF8 | ZCK_ZIP_FLAG_DESCRIPTOR : ZCK_ZIP_FLAG_UTF8);
  zck__buf_u16le(b, 0);                                                     /* method: stored */
  zck__buf_u32le(b, 0);                                                     /* DOS time, date */
  zck__buf_u32le(b, 0);                                                     /* CRC: in the descriptor */
  zck__buf_u32le(b, 0);                                                     /* sizes: in the descriptor */
  zck__buf_u32le(b, 0);
  zck__buf_u16le(b, e->name_len);
  zck__buf_u16le(b, (uint16_t)(z64 + 4 + pad));
  zck__buf_append(b, e->name, e->name_len);
  if (z64) {
    bool bs = zck__zip_big_size(w, e->size), bo = zck__zip_big_offset(w, e->header_offset);
    zck__buf_u16le(b, ZCK_ZIP64_EXTRA_ID);
    zck__buf_u16le(b, (uint16_t)(z64 - 4));
    if (bs) {
      zck__buf_u64le(b, e->size);
      zck__buf_u64le(b, 0); /* miniz writes the compressed size before knowing it */
    }
    if (bo) zck__buf_u64le(b, e->header_offset);
  }
  zck__buf_u16le(b, ZCK_ZIP_PAD_EXTRA_ID);
  zck__buf_u16le(b, (uint16_t)pad);
  static const char zz[ZCK_ZIP_ALIGN] = "ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ";
  zck__buf_append(b, zz, (size_t)pad); /* pad < ZCK_ZIP_ALIGN */
}

static void zck__zip_descriptor_crc(zck__zip_emit *m, const zck__zip_wentry *e, uint32_t crc) {
  zck__buf *b = &m->buf;
  zck__buf_u32le(b, ZCK_ZIP_DESCRIPTOR_SIG);
  zck__buf_u32le(b, crc);
  if (zck__zip_descriptor_len(m->w, e) == 24) {
    zck__buf_u64le(b, e->size);
    zck__buf_u64le(b, e->size);
  } else {
    zck__buf_u32le(b, (uint32_t)e->size);
    zck__buf_u32le(b, (uint32_t)e->size);
  }
}

static void zck__zip_descriptor(zck__zip_emit *m, const zck__zip_wentry *e) { zck__zip_descriptor_crc(m, e, e->crc); }

/* ---- the stream hasher's view: the same bytes, as soon as they are known */

/* An entry's data descriptor, given the CRC-32 the hasher computed of its data. Called
 * while no entry is being reserved (the copy runs between reserve and finish). */
static void zck__zip_hash_descriptor(void *ctx, size_t index, uint32_t crc, uint8_t *out, size_t len) {
  zck_zip_writer *w = ctx;
  zck__zip_emit m = {.w = w};
  zck__buf_init(&m.buf);
  zck__zip_descriptor_crc(&m, &w->e[index], crc);
  if (!m.buf.failed && m.buf.len == len) memcpy(out, m.buf.data, len);
  else memset(out, 0, len); /* cannot happen; the CRC check at finish then drops the hashes */
  zck__buf_free(&m.buf);
}

static void zck__zip_tell_hash(zck_zip_writer *w, const zck__zip_wentry *e, size_t index, const void *known) {
  zck__zip_emit m = {.w = w};
  zck__buf_init(&m.buf);
  zck__zip_local_header(&m, e);
  if (!m.buf.failed) zck__shash_bytes(w->hash, e->header_offset, m.buf.data, m.buf.len);
  else zck__shash_bytes(w->hash, e->header_offset + 1, "", 1); /* out of order: the hasher gives up */
  zck__buf_free(&m.buf);
  zck__shash_region(w->hash, e->data_offset, e->size, known);
  size_t dlen = zck__zip_descriptor_len(w, e);
  if (dlen) zck__shash_defer(w->hash, e->data_offset + e->size, dlen, zck__zip_hash_descriptor, w, index);
}

static void zck__zip_central_entry(zck__zip_emit *m, const zck__zip_wentry *e) {
  zck_zip_writer *w = m->w;
  zck__buf *b = &m->buf;
  bool bs = zck__zip_big_size(w, e->size), bo = zck__zip_big_offset(w, e->header_offset);
  uint16_t xlen = (bs || bo) ? (uint16_t)(4 + (bs ? 16 : 0) + (bo ? 8 : 0)) : 0;
  uint32_t size32 = bs ? ZCK_ZIP_U32_MAX : (uint32_t)e->size;
  zck__buf_u32le(b, ZCK_ZIP_CENTRAL_SIG);
  zck__buf_u16le(b, 0); /* version made by */
  zck__buf_u16le(b, 0); /* version needed */
  zck__buf_u16le(b, e->size ? ZCK_ZIP_FLAG_UTF8 | ZCK_ZIP_FLAG_DESCRIPTOR : ZCK_ZIP_FLAG_UTF8);
  zck__buf_u16le(b, 0); /* method */
  zck__buf_u32le(b, 0); /* time, date */
  zck__buf_u32le(b, e->size ? e->crc : 0);
  zck__buf_u32le(b, size32);
  zck__buf_u32le(b, size32);
  zck__buf_u16le(b, e->name_len);
  zck__buf_u16le(b, xlen);
  zck__buf_u16le(b, 0); /* comment */
  zck__buf_u16le(b, 0); /* disk */
  zck__buf_u16le(b, 0); /* internal attributes */
  zck__buf_u32le(b, 0); /* external attributes */
  zck__buf_u32le(b, bo ? ZCK_ZIP_U32_MAX : (uint32_t)e->header_offset);
  zck__buf_append(b, e->name, e->name_len);
  if (xlen) {
    zck__buf_u16le(b, ZCK_ZIP64_EXTRA_ID);
    zck__buf_u16le(b, (uint16_t)(xlen - 4));
    if (bs) {
      zck__buf_u64le(b, e->size);
      zck__buf_u64le(b, e->size);
    }
    if (bo) zck__buf_u64le(b, e->header_offset);
  }
}

static void zck__zip_end_records(zck__zip_emit *m, uint64_t cd_offset, uint64_t cd_size) {
  zck_zip_writer *w = m->w;
  zck__buf *b = &m->buf;
  uint64_t z64_offset = cd_offset + cd_size, n = w->count;
  zck__buf_u32le(b, ZCK_ZIP64_END_SIG);
  zck__buf_u64le(b, ZCK_ZIP64_END_SIZE - 12);
  zck__buf_u16le(b, 0x031E); /* made by: as miniz */
  zck__buf_u16le(b, 45);     /* needed: ZIP64 */
  zck__buf_u32le(b, 0);
  zck__buf_u32le(b, 0);
  zck__buf_u64le(b, n);
  zck__buf_u64le(b, n);
  zck__buf_u64le(b, cd_size);
  zck__buf_u64le(b, cd_offset);
  zck__buf_u32le(b, ZCK_ZIP64_LOCATOR_SIG);
  zck__buf_u32le(b, 0);
  zck__buf_u64le(b, z64_offset);
  zck__buf_u32le(b, 1);
  /* The classic record saturates at the sentinels (always, when ZIP64 is forced). */
  bool f = w->force_zip64;
  uint16_t n16 = (f || n >= ZCK_ZIP_U16_MAX) ? ZCK_ZIP_U16_MAX : (uint16_t)n;
  zck__buf_u32le(b, ZCK_ZIP_END_SIG);
  zck__buf_u16le(b, 0);
  zck__buf_u16le(b, 0);
  zck__buf_u16le(b, n16);
  zck__buf_u16le(b, n16);
  zck__buf_u32le(b, (f || cd_size >= ZCK_ZIP_U32_MAX) ? ZCK_ZIP_U32_MAX : (uint32_t)cd_size);
  zck__buf_u32le(b, (f || cd_offset >= ZCK_ZIP_U32_MAX) ? ZCK_ZIP_U32_MAX : (uint32_t)cd_offset);
  zck__buf_u16le(b, 0);
}

static uint64_t zck__zip_central_len(const zck_zip_writer *w, const zck__zip_wentry *e);

uint64_t zck_zip_writer_size(const zck_zip_writer *w) {
  uint64_t cd = 0;
  for (size_t i = 0; i < w->count; i++) cd += zck__zip_central_len(w, &w->e[i]);
  return w->cursor + cd + ZCK_ZIP64_END_SIZE + ZCK_ZIP64_LOCATOR_SIZE + ZCK_ZIP_END_SIZE;
}

static uint64_t zck__zip_central_len(const zck_zip_writer *w, const zck__zip_wentry *e) {
  bool bs = zck__zip_big_size(w, e->size), bo = zck__zip_big_offset(w, e->header_offset);
  return ZCK_ZIP_CENTRAL_SIZE + e->name_len + ((bs || bo) ? 4u + (bs ? 16u : 0u) + (bo ? 8u : 0u) : 0u);
}

bool zck_zip_writer_crc_slots(const zck_zip_writer *w, size_t index, uint64_t slots[2]) {
  ZCK_ASSERT(index < w->count);
  const zck__zip_wentry *e = &w->e[index];
  if (!e->size) return false;
  uint64_t cd = w->cursor;
  for (size_t i = 0; i < index; i++) cd += zck__zip_central_len(w, &w->e[i]);
  slots[0] = w->base + e->data_offset + e->size + 4;  /* descriptor: signature, then the CRC */
  slots[1] = w->base + cd + 16;                       /* central record: the CRC at byte 16 */
  return true;
}

zck_status zck_zip_writer_finish(zck_zip_writer *w) {
  ZCK_ASSERT(!w->finished);
  for (size_t i = 0; i < w->count; i++)
    if (w->e[i].size && !w->e[i].crc_set)
      return zck__fail(ZCK_ERR_INVALID_ARG, "%s: zip entry \"%s\": its CRC-32 was never set", w->out->path, w->e[i].name);
  zck__zip_emit m = {.w = w, .off = 0, .st = ZCK_OK};
  zck__buf_init(&m.buf);
  for (size_t i = 0; w->hash && i < w->count; i++) /* the descriptors it made must be these */
    if (w->e[i].size) zck__shash_check_crc(w->hash, w->e[i].data_offset, w->e[i].crc);
  for (size_t i = 0; i < w->count && m.st == ZCK_OK; i++) {
    const zck__zip_wentry *e = &w->e[i];
    zck__zip_seek(&m, e->header_offset);
    zck__zip_local_header(&m, e);
    if (e->held) zck__buf_append(&m.buf, e->held, (size_t)e->size); /* the header ends at data_offset */
    if (e->size) {
      zck__zip_seek(&m, e->data_offset + e->size);
      zck__zip_descriptor(&m, e);
    }
    if (m.buf.len > (1u << 20)) zck__zip_flush(&m); /* keep runs bounded; the next seek restarts one */
  }
  zck__zip_seek(&m, w->cursor);
  uint64_t cd_start = m.buf.len;
  for (size_t i = 0; i < w->count; i++) zck__zip_central_entry(&m, &w->e[i]);
  uint64_t cd_size = m.buf.len - cd_start;
  if (m.st == ZCK_OK && cd_size >= ZCK_ZIP_U32_MAX)
    m.st = zck__fail(ZCK_ERR_LIMIT, "%s: zip central directory of %llu bytes (4 GiB or more)", w->out->path, (unsigned long long)cd_size);
  if (m.st == ZCK_OK) {
    zck__zip_end_records(&m, w->cursor, cd_size);
    if (w->hash && !m.buf.failed) zck__shash_bytes(w->hash, w->cursor, m.buf.data + cd_start, m.buf.len - cd_start);
    zck__zip_flush(&m);
  }
  zck__buf_free(&m.buf);
  if (m.st == ZCK_OK) w->finished = true;
  return m.st;
}
