/* zip_copy.c: an archive copied byte for byte and checked in the same pass, for a job that puts a source's archive
 * into its output as it is (a pipeline's layer files, a save root's scheduler.pt or rng_state_<r>.pth).
 *
 * zck_zip_open has checked the structure (end records, directory, local headers, no overlaps); the copy then reads
 * the file once, front to back, through one bounded buffer, writes each piece where it lies and folds it into the
 * CRC-32 of the record it belongs to. A record whose CRC disagrees with the directory's stops the copy: the caller,
 * which writes into an outfile it commits only when the copy returned OK, leaves no output. Reading the file twice
 * (a check, then a copy) would double the bytes read and leave a window in which the file could change between the
 * two. */
#include "zip_internal.h"

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

zck_status zck_zip_copy_checked(const zck_zip *z, zck__outfile *out) {
  const zck__source *src = zck_zip_source(z);
  const zck_zip_entry **rec = NULL;
  size_t n_rec = 0, k = 0;
  ZCK_TRY(zck__zip_records_by_offset(z, &rec, &n_rec));
  uint8_t *buf = zck__malloc(ZCK_ZIP_COPY_CHUNK);
  zck_status st = buf ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  uint32_t crc = 0;   /* of rec[k]'s bytes so far */
  for (uint64_t off = 0; st == ZCK_OK && off < src->size;) {
    size_t n = src->size - off < ZCK_ZIP_COPY_CHUNK ? (size_t)(src->size - off) : ZCK_ZIP_COPY_CHUNK;
    st = zck__source_read(src, buf, n, off);
    if (st == ZCK_OK) st = zck__outfile_pwrite(out, buf, n, off);
    uint64_t stop = off + n;
    /* records do not overlap (zck_zip_open): each piece of this chunk belongs to one of them at most */
    while (st == ZCK_OK && k < n_rec && rec[k]->data_offset < stop) {
      const zck_zip_entry *e = rec[k];
      uint64_t a = e->data_offset > off ? e->data_offset : off, end = e->data_offset + e->size;
      uint64_t b = end < stop ? end : stop;
      crc = zck_crc32(crc, buf + (a - off), (size_t)(b - a));
      if (end > stop) break;   /* goes on in the next chunk */
      if (crc != e->crc32) st = zck__zip_crc_fail(z, e, crc);
      crc = 0;
      k++;
    }
    off = stop;
  }
  free(buf);
  free(rec);
  return st;
}

zck_status zck_zip_copy_file_checked(const char *from, const char *to) {
  zck__source src;
  ZCK_TRY(zck__source_open(&src, from));
  zck_zip *z = NULL;
  zck__outfile f;
  memset(&f, 0, sizeof f);
  f.fd = -1;
  zck_status st = zck_zip_open(&src, &z);
  if (st == ZCK_OK) st = zck__outfile_create(&f, to);
  if (st == ZCK_OK) st = zck_zip_copy_checked(z, &f);
  if (st == ZCK_OK) st = zck__outfile_commit(&f);
  else zck__outfile_abort(&f);
  zck_zip_close(z);
  zck__source_close(&src);
  return st;
}
