/* test_zip_roundtrip.c: what the zip writer writes, the reader reads back: names, sizes,
 * 64-byte aligned data, CRCs, lookups; the same with forced ZIP64 records; torch.save
 * fixtures rewritten entry by entry come out byte for byte identical; CRC combining. */
#include "test.h"
#include "zip/zip.h"

#include <stdbool.h>

typedef struct { const char *name; size_t size; } spec;

static const spec SPECS[] = {
    {"archive/data.pkl", 131}, {"archive/byteorder", 6}, {"archive/data/0", 4096}, {"archive/data/1", 0},
    {"archive/data/2", 1000},  {"archive/data/3", 0},    {"archive/version", 2},   {"archive/.data/serialization_id", 40},
};
#define NSPEC (sizeof SPECS / sizeof SPECS[0])

static uint8_t *payload(size_t i, size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  for (size_t k = 0; k < n; k++) p[k] = (uint8_t)(k * 31 + i * 7 + (k >> 8));
  return p;
}

/* Writes SPECS; data/2 through reserve + two pwrites + combined CRC, the rest through add. */
static char *write_archive(const char *dir, const char *base, bool zip64) {
  char *path = zck__path_join(dir, base);
  zck__outfile of;
  zck_zip_writer *w;
  ZT_OK(zck__outfile_create(&of, path));
  ZT_OK(zck_zip_writer_create(&of, &w));
  if (zip64) zck_zip_writer_force_zip64(w, true);
  for (size_t i = 0; i < NSPEC; i++) {
    uint8_t *d = payload(i, SPECS[i].size);
    if (!strcmp(SPECS[i].name, "archive/data/2")) {
      size_t idx;
      uint64_t off;
      size_t half = SPECS[i].size / 3;
      ZT_OK(zck_zip_writer_reserve(w, SPECS[i].name, SPECS[i].size, &idx, &off));
      ZT_EQ_U64(off % 64, 0);
      ZT_OK(zck__outfile_pwrite(&of, d + half, SPECS[i].size - half, off + half));
      ZT_OK(zck__outfile_pwrite(&of, d, half, off));
      uint32_t c = zck_crc32_combine(zck_crc32(0, d, half), zck_crc32(0, d + half, SPECS[i].size - half), SPECS[i].size - half);
      zck_zip_writer_set_crc(w, idx, c);
    } else {
      ZT_OK(zck_zip_writer_add(w, SPECS[i].name, d, SPECS[i].size));
    }
    free(d);
  }
  /* names the reader would refuse are refused here too */
  ZT_ERR(zck_zip_writer_add(w, "archive/data/0", "x", 1), ZCK_ERR_INVALID_ARG, "added twice");
  ZT_ERR(zck_zip_writer_add(w, "ARCHIVE/data/0", "x", 1), ZCK_ERR_INVALID_ARG, "ignoring case");
  ZT_ERR(zck_zip_writer_add(w, "/abs", "x", 1), ZCK_ERR_INVALID_ARG, "leading '/'");
  ZT_ERR(zck_zip_writer_add(w, "a/../b", "x", 1), ZCK_ERR_INVALID_ARG, "'..'");
  ZT_ERR(zck_zip_writer_add(w, "", "x", 1), ZCK_ERR_INVALID_ARG, "empty");
  ZT_OK(zck_zip_writer_finish(w));
  zck_zip_writer_free(w);
  ZT_OK(zck__outfile_commit(&of));
  return path;
}

static void check_archive(const zck__source *src) {
  zck_zip *z;
  ZT_OK(zck_zip_open(src, &z));
  ZT_EQ_U64(zck_zip_count(z), NSPEC);
  ZT_ASSERT(zck_zip_source(z) == src);
  for (size_t i = 0; i < NSPEC; i++) {
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    ZT_EQ_STR(e->name, SPECS[i].name);
    ZT_ASSERT(zck_zip_find(z, SPECS[i].name) == e);
    ZT_EQ_U64(e->size, SPECS[i].size);
    ZT_EQ_U64(e->comp_size, SPECS[i].size);
    ZT_EQ_INT(e->method, 0);
    ZT_EQ_U64(e->data_offset % 64, 0);
    uint8_t *want = payload(i, e->size), *got = malloc(e->size + 1);
    ZT_EQ_INT(e->crc32, zck_crc32(0, want, e->size));
    ZT_OK(zck_zip_read_entry(z, e, got));
    ZT_EQ_MEM(got, want, e->size);
    if (e->size > 10) {
      ZT_OK(zck_zip_read_range(z, e, got, 5, e->size - 5));
      ZT_EQ_MEM(got, want + e->size - 5, 5);
      ZT_ERR(zck_zip_read_range(z, e, got, 6, e->size - 5), ZCK_ERR_INVALID_ARG, e->name);
    }
    free(want);
    free(got);
  }
  ZT_ASSERT(zck_zip_entry_at(z, NSPEC) == NULL);
  ZT_ASSERT(zck_zip_find(z, "archive/data/9") == NULL);
  ZT_ASSERT(zck_zip_find(z, "ARCHIVE/data.pkl") == NULL); /* exact lookup */
  ZT_ASSERT(zck_zip_find(z, "archive") == NULL);
  zck_zip_close(z);
}

static void check_file_and_memory(const char *path) {
  zck__source src;
  ZT_OK(zck__source_open(&src, path));
  check_archive(&src);
  zck__source_close(&src);
  unsigned char *data;
  size_t n;
  ZT_ASSERT(zt_read_file(path, &data, &n) == 0);
  zck__source_memory(&src, "mem.zip", data, n);
  check_archive(&src);
  zck__source_close(&src);
  free(data);
}

/* Rewrites a torch.save file entry by entry (central-directory order, which torch keeps
 * equal to file order): zckpt's container must be byte-identical to torch's. */
static void check_torch_bytes(const char *dir, const char *fixture) {
  char *in = zt_fixture(fixture);
  zck__source src;
  ZT_OK(zck__source_open(&src, in));
  zck_zip *z;
  ZT_OK(zck_zip_open(&src, &z));
  char *out = zck__path_join(dir, "rewritten.pt");
  zck__outfile of;
  zck_zip_writer *w;
  ZT_OK(zck__outfile_create(&of, out));
  ZT_OK(zck_zip_writer_create(&of, &w));
  for (size_t i = 0; i < zck_zip_count(z); i++) {
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    uint8_t *d = malloc(e->size + 1);
    ZT_OK(zck_zip_read_entry(z, e, d));
    ZT_OK(zck_zip_writer_add(w, e->name, d, e->size));
    free(d);
  }
  ZT_OK(zck_zip_writer_finish(w));
  zck_zip_writer_free(w);
  ZT_OK(zck__outfile_commit(&of));
  zck_zip_close(z);
  zck__source_close(&src);
  unsigned char *a, *b;
  size_t na, nb;
  ZT_ASSERT(zt_read_file(in, &a, &na) == 0);
  ZT_ASSERT(zt_read_file(out, &b, &nb) == 0);
  ZT_EQ_U64(nb, na);
  for (size_t i = 0; i < na; i++)
    if (a[i] != b[i]) ZT_FAIL("%s: rewritten archive differs at byte %zu (%02x, torch %02x)", fixture, i, b[i], a[i]);
  free(a);
  free(b);
  free(in);
  free(out);
}

static void check_crc_combine(void) {
  uint8_t buf[5000];
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < sizeof buf; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; buf[i] = (uint8_t)x; }
  ZT_EQ_INT(zck_crc32(0, "123456789", 9), 0xCBF43926u); /* the CRC-32 check value */
  ZT_EQ_INT(zck_crc32(0, buf, 0), 0);
  for (int t = 0; t < 200; t++) {
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    size_t n = (size_t)(x % sizeof buf), cut = n ? (size_t)((x >> 20) % (n + 1)) : 0;
    uint32_t whole = zck_crc32(0, buf, n);
    ZT_EQ_INT(zck_crc32_combine(zck_crc32(0, buf, cut), zck_crc32(0, buf + cut, n - cut), n - cut), whole);
    ZT_EQ_INT(zck_crc32(zck_crc32(0, buf, cut), buf + cut, n - cut), whole); /* streaming */
  }
  ZT_EQ_INT(zck_crc32_combine(0x12345678u, 0, 0), 0x12345678u);
}

int main(void) {
  char *dir = zt_tmpdir();
  check_crc_combine();
  char *p = write_archive(dir, "plain.zip", false);
  check_file_and_memory(p);
  free(p);
  p = write_archive(dir, "zip64.zip", true);
  check_file_and_memory(p);
  /* forced ZIP64: the end record carries sentinels, so the reader used the ZIP64 records */
  unsigned char *d;
  size_t n;
  ZT_ASSERT(zt_read_file(p, &d, &n) == 0);
  ZT_EQ_INT(zck__le32(d + n - 22), 0x06054b50u);
  ZT_EQ_INT(zck__le16(d + n - 12), 0xFFFF);
  ZT_EQ_INT(zck__le32(d + n - 6), 0xFFFFFFFFu);
  free(d);
  free(p);
  const char *fixtures[] = {"torch/dtypes.pt", "torch/scalars_empty.pt", "torch/nested.pt", "torch/views.pt", "torch/module_state_dict.pt"};
  for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) check_torch_bytes(dir, fixtures[i]);
  free(dir);
  return 0;
}
