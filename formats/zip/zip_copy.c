/* zip_copy.c: an archive copied byte for byte and checked in the same pass, for a job that puts a source's archive
 * into its output as it is (a pipeline's layer files, a save root's scheduler.pt or rng_state_<r>.pth).
 *
 * zck_zip_open has checked the structure (end records, directory, local headers, no overlaps); the copy then reads
 * the file once, front to back, through one bounded buffer, writes each piece where it lies and folds it into the
 * CRC-32 of the record it belongs to. A record whose CRC disagrees with the directory's stops the copy: the caller,
 * which writes into an outfile it commits only when the copy returned OK, leaves no output. Reading the file twice
 * (a check, then a copy) would double the bytes read and leave a window in which the file could change between the
 * two. The same bytes give, when asked, the manifest's hashes of the copy, so its manifest does not read it back.
 * Not checked: the bytes between records that zck_zip_open does not read (a local header's extra field padding, the
 * data descriptors); readers take every record's CRC and size from the directory. */
#include "zip_internal.h"

#include "hash_xxh3.h"
#include "manifest.h"

#include <stdlib.h>
#include <string.h>

#define ZCK_ZIP_COPY_CHUNK ((size_t)1 << 20)

static int zck__zip_cmp_data(const void *a, const void *b) {
  const zck_zip_entry *x = *(const zck_zip_entry *const *)a, *y = *(const zck_zip_entry *const *)b;
  return x->data_offset < y->data_offset ? -1 : x->data_offset > y->data_offset;
}

static zck_status zck__zip_crc_fail(const zck_zip *z, const zck_zip_entry *e, uint32_t crc) {
  char shown[96];
  zck__zip_name_for_message(shown, sizeof shown, e->name, strlen(e->name));
  return zck__fail(ZCK_ERR_DAMAGED, "%s: entry \"%s\": CRC-32 mismatch: the directory says %08x, the data has %08x",
                   zck_zip_source(z)->name, shown, e->crc32, crc);
}

/* The records whose bytes carry a CRC, by data offset; a compressed one is refused: its CRC is of the inflated bytes,
 * which a byte copy never sees (torch.save stores every record). */
static zck_status zck__zip_records_by_offset(const zck_zip *z, const zck_zip_entry ***out, size_t *n_out) {
  size_t n = zck_zip_count(z), k = 0;
  const zck_zip_entry **r = zck__malloc((n ? n : 1) * sizeof *r);
  if (!r) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < n; i++) {
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    if (e->method != 0) {
      char shown[96];
      zck__zip_name_for_message(shown, sizeof shown, e->name, strlen(e->name));
      free(r);
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: entry \"%s\" is compressed (method %u): its CRC-32 cannot be checked "
                       "by a byte copy", zck_zip_source(z)->name, shown, e->method);
    }
    if (!e->size && e->crc32) {   /* nothing to read: the CRC of no bytes is 0 */
      zck_status st = zck__zip_crc_fail(z, e, 0);
      free(r);
      return st;
    }
    if (e->size) r[k++] = e;
  }
  qsort(r, k, sizeof *r, zck__zip_cmp_data);
  *out = r;
  *n_out = k;
  return ZCK_OK;
}

/* ---- the manifest's hashes of the copy, from the same bytes: the whole file, each chunk_size piece, each record
 * (a torch file's tensors are its records' bytes, so the manifest finds them among the ranges) */

typedef struct zck__zip_hashes {
  zck__manifest_known_file *out;   /* NULL: none wanted */
  uint64_t chunk_size;
  XXH3_state_t *file, *chunk, *rec;
  uint64_t *chunks;
  zck__manifest_known_range *ranges;
} zck__zip_hashes;

/* n_rec: the records of data; the empty ones get their (empty) ranges here, as a tensor of no elements has one */
static zck_status zck__zip_hashes_start(zck__zip_hashes *h, const zck_zip *z, size_t n_rec) {
  if (!h->out) return ZCK_OK;
  uint64_t size = zck_zip_source(z)->size;
  n_rec = zck_zip_count(z);
  size_t n_chunks = (size_t)((size + h->chunk_size - 1) / h->chunk_size);
  h->file = XXH3_createState();
  h->chunk = XXH3_createState();
  h->rec = XXH3_createState();
  h->chunks = zck__malloc((n_chunks ? n_chunks : 1) * sizeof *h->chunks);
  h->ranges = zck__malloc((n_rec ? n_rec : 1) * sizeof *h->ranges);
  if (!h->file || !h->chunk || !h->rec || !h->chunks || !h->ranges) return ZCK_ERR_NO_MEMORY;
  XXH3_64bits_reset(h->file);
  XXH3_64bits_reset(h->chunk);
  memset(h->out, 0, sizeof *h->out);
  h->out->size = size;
  for (size_t i = 0; i < n_rec; i++) {
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    if (!e->size) h->ranges[h->out->n_ranges++] = (zck__manifest_known_range){e->data_offset, 0, XXH3_64bits(NULL, 0)};
  }
  return ZCK_OK;
}

/* Bytes [off, off + n) of the file, in order. */
static void zck__zip_hashes_file(zck__zip_hashes *h, const uint8_t *p, uint64_t off, size_t n) {
  if (!h->out) return;
  XXH3_64bits_update(h->file, p, n);
  while (n) {
    uint64_t left = h->chunk_size - off % h->chunk_size;
    size_t take = n < left ? n : (size_t)left;
    XXH3_64bits_update(h->chunk, p, take);
    p += take, off += take, n -= take;
    if (off % h->chunk_size == 0 || off == h->out->size) {
      h->chunks[h->out->n_chunks++] = XXH3_64bits_digest(h->chunk);
      XXH3_64bits_reset(h->chunk);
    }
  }
}

static void zck__zip_hashes_end(zck__zip_hashes *h, zck_status st) {
  if (h->out && st == ZCK_OK) {
    h->out->hashed = true;
    h->out->xxh3 = XXH3_64bits_digest(h->file);
    h->out->chunks = h->chunks;
    h->out->ranges = h->ranges;
    h->chunks = NULL;
    h->ranges = NULL;
  }
  free(h->chunks);
  free(h->ranges);
  XXH3_freeState(h->file);
  XXH3_freeState(h->chunk);
  XXH3_freeState(h->rec);
}

zck_status zck_zip_copy_checked(const zck_zip *z, zck__outfile *out, uint64_t chunk_size,
                                zck__manifest_known_file *known) {
  const zck__source *src = zck_zip_source(z);
  const zck_zip_entry **rec = NULL;
  size_t n_rec = 0, k = 0;
  ZCK_TRY(zck__zip_records_by_offset(z, &rec, &n_rec));
  zck__zip_hashes h = {known, chunk_size ? chunk_size : ZCK_MANIFEST_DEFAULT_CHUNK, NULL, NULL, NULL, NULL, NULL};
  uint8_t *buf = zck__malloc(ZCK_ZIP_COPY_CHUNK);
  zck_status st = buf ? zck__zip_hashes_start(&h, z, n_rec) : ZCK_ERR_NO_MEMORY;
  uint32_t crc = 0;   /* of rec[k]'s bytes so far */
  for (uint64_t off = 0; st == ZCK_OK && off < src->size;) {
    size_t n = src->size - off < ZCK_ZIP_COPY_CHUNK ? (size_t)(src->size - off) : ZCK_ZIP_COPY_CHUNK;
    st = zck__source_read(src, buf, n, off);
    if (st == ZCK_OK) st = zck__outfile_pwrite(out, buf, n, off);
    if (st == ZCK_OK) zck__zip_hashes_file(&h, buf, off, n);
    uint64_t stop = off + n;
    /* records do not overlap (zck_zip_open): each piece of this chunk belongs to one of them at most */
    while (st == ZCK_OK && k < n_rec && rec[k]->data_offset < stop) {
      const zck_zip_entry *e = rec[k];
      uint64_t a = e->data_offset > off ? e->data_offset : off, end = e->data_offset + e->size;
      uint64_t b = end < stop ? end : stop;
      if (known && a == e->data_offset) XXH3_64bits_reset(h.rec);
      crc = zck_crc32(crc, buf + (a - off), (size_t)(b - a));
      if (known) XXH3_64bits_update(h.rec, buf + (a - off), (size_t)(b - a));
      if (end > stop) break;   /* goes on in the next chunk */
      if (crc != e->crc32) st = zck__zip_crc_fail(z, e, crc);
      if (known)
        h.ranges[known->n_ranges++] = (zck__manifest_known_range){e->data_offset, e->size, XXH3_64bits_digest(h.rec)};
      crc = 0;
      k++;
    }
    off = stop;
  }
  zck__zip_hashes_end(&h, st);
  free(buf);
  free(rec);
  return st;
}

zck_status zck_zip_copy_file_checked(const char *from, const char *to, uint64_t chunk_size,
                                     zck__manifest_known_file *known) {
  zck__source src;
  ZCK_TRY(zck__source_open(&src, from));
  zck_zip *z = NULL;
  zck__outfile f;
  memset(&f, 0, sizeof f);
  f.fd = -1;
  zck_status st = zck_zip_open(&src, &z);
  if (st == ZCK_OK) st = zck__outfile_create(&f, to);
  if (st == ZCK_OK) st = zck_zip_copy_checked(z, &f, chunk_size, known);
  if (st == ZCK_OK) st = zck__outfile_commit(&f);
  else zck__outfile_abort(&f);
  zck_zip_close(z);
  zck__source_close(&src);
  return st;
}
