/* test_zip_copy.c: the checked copy (zip_copy.c) of an archive whose big record spans several of its 1 MiB reads:
 * the copy is the source byte for byte, its manifest hashes (the file, each chunk, one range per record, the empty
 * record's too) are the XXH3 of those bytes; a byte changed inside the big record, away from its first read, is
 * refused as that record's CRC-32 mismatch and leaves nothing at the destination. */
#include "test.h"
#include "hash_xxh3.h"
#include "manifest.h"
#include "zip/zip.h"

#include <stdlib.h>
#include <unistd.h>

#define BIG ((size_t)(3u << 20) + 17)

static char *write_archive(const char *dir) {
  char *path = zck__path_join(dir, "src.pt");
  zck__outfile of;
  zck_zip_writer *w;
  ZT_OK(zck__outfile_create(&of, path));
  ZT_OK(zck_zip_writer_create(&of, &w));
  uint8_t *d = malloc(BIG);
  for (size_t k = 0; k < BIG; k++) d[k] = (uint8_t)(k * 131 + (k >> 9));
  ZT_OK(zck_zip_writer_add(w, "a/data.pkl", d + 5, 100));
  ZT_OK(zck_zip_writer_add(w, "a/data/0", d, BIG));
  ZT_OK(zck_zip_writer_add(w, "a/data/1", d, 0));
  ZT_OK(zck_zip_writer_add(w, "a/data/2", d + 77, 1000));
  ZT_OK(zck_zip_writer_finish(w));
  zck_zip_writer_free(w);
  ZT_OK(zck__outfile_commit(&of));
  free(d);
  return path;
}

static const zck__manifest_known_range *range_at(const zck__manifest_known_file *f, uint64_t off, uint64_t len) {
  for (size_t i = 0; i < f->n_ranges; i++)
    if (f->ranges[i].off == off && f->ranges[i].len == len) return &f->ranges[i];
  return NULL;
}

int main(void) {
  char *dir = zt_tmpdir();
  char *src = write_archive(dir), *dst = zck__path_join(dir, "dst.pt");
  unsigned char *a, *b;
  size_t na, nb;
  ZT_ASSERT(zt_read_file(src, &a, &na) == 0);
  ZT_ASSERT(na > BIG);

  const uint64_t chunk = 1u << 20;
  zck__manifest_known_file f;
  ZT_OK(zck_zip_copy_file_checked(src, dst, chunk, &f));
  ZT_ASSERT(zt_read_file(dst, &b, &nb) == 0);
  ZT_EQ_U64(nb, na);
  ZT_EQ_MEM(a, b, na);
  ZT_ASSERT(f.hashed);
  ZT_EQ_U64(f.size, na);
  ZT_EQ_U64(f.xxh3, XXH3_64bits(a, na));
  ZT_EQ_U64(f.n_chunks, (na + chunk - 1) / chunk);
  for (size_t c = 0; c < f.n_chunks; c++) {
    size_t off = c * chunk, len = na - off < chunk ? na - off : chunk;
    ZT_EQ_U64(f.chunks[c], XXH3_64bits(a + off, len));
  }
  zck__source s;
  zck_zip *z;
  ZT_OK(zck__source_open(&s, src));
  ZT_OK(zck_zip_open(&s, &z));
  ZT_EQ_U64(f.n_ranges, zck_zip_count(z));
  uint64_t big_at = 0;
  for (size_t i = 0; i < zck_zip_count(z); i++) {
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    const zck__manifest_known_range *r = range_at(&f, e->data_offset, e->size);
    ZT_ASSERT(r);
    ZT_EQ_U64(r->xxh3, XXH3_64bits(a + e->data_offset, e->size));
    if (e->size == BIG) big_at = e->data_offset;
  }
  zck_zip_close(z);
  zck__source_close(&s);
  free((void *)f.chunks);
  free((void *)f.ranges);
  free(b);
  ZT_ASSERT(big_at);

  /* one byte of the big record changed, in its third 1 MiB read: refused, nothing at dst */
  ZT_ASSERT(unlink(dst) == 0);
  a[big_at + (2u << 20) + 5] ^= 0x10;
  ZT_ASSERT(zt_write_file(src, a, na) == 0);
  ZT_ERR(zck_zip_copy_file_checked(src, dst, chunk, &f), ZCK_ERR_DAMAGED, "\"a/data/0\": CRC-32 mismatch");
  ZT_ASSERT(access(dst, F_OK) != 0);
  ZT_ERR(zck_zip_copy_file_checked(src, dst, 0, NULL), ZCK_ERR_DAMAGED, "\"a/data/0\": CRC-32 mismatch");
  ZT_ASSERT(access(dst, F_OK) != 0);
  free(a);
  free(src);
  free(dst);
  free(dir);
  return 0;
}
