/* test_zip_sparse.c: a real ZIP64 archive past 4 GiB without 4 GiB of disk: a 4 GiB + 100
 * byte entry is reserved but never written (a hole), so the entry after it starts beyond
 * 0xFFFFFFFF. Checks the writer's ZIP64 fields (sizes and offsets) and that the reader
 * finds everything. Skipped where the filesystem cannot hold a sparse file. */
#include "test.h"
#include "zip/zip.h"

#include <errno.h>
#include <sys/stat.h>

#define BIG ((uint64_t)0x100000000ull + 100)

/* CRC-32 of n zero bytes, by doubling with crc32_combine. */
static uint32_t crc_zeros(uint64_t n) {
  static const uint8_t zero[1];
  uint32_t acc = 0, pow = zck_crc32(0, zero, 1); /* CRC of 2^k zeros */
  uint64_t pow_len = 1;
  bool first = true;
  for (; n; n >>= 1) {
    if (n & 1) { acc = first ? pow : zck_crc32_combine(acc, pow, pow_len); first = false; }
    pow = zck_crc32_combine(pow, pow, pow_len);
    pow_len *= 2;
  }
  return acc;
}

int main(void) {
  char *dir = zt_tmpdir();
  char *path = zck__path_join(dir, "sparse.zip");
  uint8_t small[100], after[1000];
  for (size_t i = 0; i < sizeof small; i++) small[i] = (uint8_t)i;
  for (size_t i = 0; i < sizeof after; i++) after[i] = (uint8_t)(i * 7);
  uint8_t zeros[4096] = {0};
  ZT_EQ_INT(crc_zeros(4096), zck_crc32(0, zeros, 4096));
  ZT_EQ_INT(crc_zeros(0), 0);

  zck__outfile of;
  zck_zip_writer *w;
  ZT_OK(zck__outfile_create(&of, path));
  ZT_OK(zck_zip_writer_create(&of, &w));
  ZT_OK(zck_zip_writer_add(w, "s/small", small, sizeof small));
  size_t big_index;
  uint64_t big_off;
  ZT_OK(zck_zip_writer_reserve(w, "s/big", BIG, &big_index, &big_off));
  /* s/small ends at 64 + 100 + 16 = 180. torch's padding: 30 + name + ZIP64 extra
   * (4 + 16) + 'FB' header (4), then up to a multiple of 64. */
  ZT_EQ_U64(big_off, zck__align_up(180 + 30 + 5 + 20 + 4, 64));
  zck_zip_writer_set_crc(w, big_index, crc_zeros(BIG));
  ZT_OK(zck_zip_writer_add(w, "s/after", after, sizeof after));
  ZT_OK(zck_zip_writer_add(w, "s/empty-after", "", 0));
  zck_status s = zck_zip_writer_finish(w);
  if (s == ZCK_ERR_NO_SPACE || s == ZCK_ERR_IO) {
    zck__outfile_abort(&of);
    zt_skip("this filesystem cannot hold a 4 GiB sparse file");
  }
  ZT_OK(s);
  zck_zip_writer_free(w);
  ZT_OK(zck__outfile_commit(&of));
  struct stat st;
  ZT_ASSERT(stat(path, &st) == 0);
  ZT_ASSERT((uint64_t)st.st_size > BIG);
  if ((uint64_t)st.st_blocks * 512 > ((uint64_t)1 << 30)) fprintf(stderr, "note: the sparse file really takes %llu bytes\n", (unsigned long long)st.st_blocks * 512);

  zck__source src;
  zck_zip *z;
  ZT_OK(zck__source_open(&src, path));
  ZT_OK(zck_zip_open(&src, &z));
  ZT_EQ_U64(zck_zip_count(z), 4);
  const zck_zip_entry *e = zck_zip_find(z, "s/big");
  ZT_EQ_U64(e->size, BIG);
  ZT_EQ_U64(e->data_offset, big_off);
  ZT_EQ_INT(e->crc32, crc_zeros(BIG));
  uint8_t buf[1000];
  ZT_OK(zck_zip_read_range(z, e, buf, 100, BIG - 100));
  ZT_EQ_MEM(buf, zeros, 100);
  e = zck_zip_find(z, "s/after");
  ZT_ASSERT(e->data_offset > 0xFFFFFFFFull);
  ZT_EQ_U64(e->data_offset % 64, 0);
  ZT_OK(zck_zip_read_entry(z, e, buf));
  ZT_EQ_MEM(buf, after, sizeof after);
  e = zck_zip_find(z, "s/empty-after");
  ZT_EQ_U64(e->size, 0);
  ZT_OK(zck_zip_read_entry(z, e, buf));
  e = zck_zip_find(z, "s/small");
  ZT_OK(zck_zip_read_entry(z, e, buf));
  ZT_EQ_MEM(buf, small, sizeof small);

  /* the central directory uses sentinels and ZIP64 extras exactly where needed */
  uint8_t tail[512];
  uint64_t tail_off = src.size - sizeof tail;
  ZT_OK(zck__source_read(&src, tail, sizeof tail, tail_off));
  const uint8_t *eocd = tail + sizeof tail - 22;
  ZT_EQ_INT(zck__le32(eocd), 0x06054b50u);
  ZT_EQ_INT(zck__le16(eocd + 10), 4);
  ZT_EQ_INT(zck__le32(eocd + 16), 0xFFFFFFFFu); /* directory offset > 4 GiB */
  uint64_t cd = zck__le64(eocd - 20 - 56 + 48);
  uint8_t cdb[400];
  ZT_OK(zck__source_read(&src, cdb, sizeof cdb < src.size - cd ? sizeof cdb : (size_t)(src.size - cd), cd));
  size_t p = 46 + 7;                                   /* past s/small (no extra) */
  ZT_EQ_INT(zck__le16(cdb + 30), 0);
  ZT_EQ_INT(zck__le32(cdb + p + 20), 0xFFFFFFFFu);   /* s/big: sizes are sentinels */
  ZT_EQ_INT(zck__le32(cdb + p + 42), 180);           /* its header offset is not */
  ZT_EQ_INT(zck__le16(cdb + p + 30), 20);            /* ZIP64 extra: uncomp, comp */
  ZT_EQ_U64(zck__le64(cdb + p + 46 + 5 + 4), BIG);
  p += 46 + 5 + 20;                                    /* s/after */
  ZT_EQ_INT(zck__le32(cdb + p + 20), sizeof after);
  ZT_EQ_INT(zck__le32(cdb + p + 42), 0xFFFFFFFFu);   /* offset is a sentinel */
  ZT_EQ_INT(zck__le16(cdb + p + 30), 12);            /* ZIP64 extra: offset only */
  zck_zip_close(z);
  zck__source_close(&src);
  free(path);
  free(dir);
  return 0;
}
