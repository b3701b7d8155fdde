/* test_dcp_torch_save.c: zck_dcp_to_torch_save writes, for every real DCP fixture, the very
 * file torch's dcp_to_torch_save writes (tests/fixtures/dcp/torch_save.sha256, made by
 * tests/fixtures/gen/make_dcp_torch_save_sha.py with torch 2.15), without torch at hand;
 * an existing file is kept without overwrite, and a flipped bit inside a chunk is refused
 * with nothing left at the path. */
#include "sha256.h"
#include "test.h"
#include "zck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void expect_sha(const char *path, const char *want, const char *what) {
  unsigned char *data;
  size_t n;
  if (zt_read_file(path, &data, &n)) ZT_FAIL("cannot read %s", path);
  char hex[65];
  zt_sha256_hex(data, n, hex);
  free(data);
  if (strcmp(hex, want)) ZT_FAIL("%s: sha256 %s, torch's file is %s", what, hex, want);
}

static int copy_file(const char *from, const char *to) {
  unsigned char *data;
  size_t n;
  if (zt_read_file(from, &data, &n)) return -1;
  int r = zt_write_file(to, data, n);
  free(data);
  return r;
}

int main(void) {
  char *list = zt_fixture("dcp/torch_save.sha256");
  FILE *f = fopen(list, "r");
  ZT_ASSERT(f);
  char *tmp = zt_tmpdir();
  char out[4096], line[1024];
  snprintf(out, sizeof out, "%s/full.pt", tmp);
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  o.overwrite = 1;
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    char sha[65], rel[512], fixture[600];
    if (sscanf(line, "%64s %511s", sha, rel) != 2) continue;
    snprintf(fixture, sizeof fixture, "dcp/%s", rel);
    char *dir = zt_fixture(fixture);
    ZT_OK(zck_dcp_to_torch_save(dir, out, &o));
    expect_sha(out, sha, rel);
    free(dir);
    n++;
  }
  fclose(f);
  ZT_EQ_INT(n, 12);

  /* without overwrite an existing file stays */
  zck_consolidate_opts keep = ZCK_CONSOLIDATE_OPTS_INIT;
  char *dir = zt_fixture("dcp/llama_tied_w2_fp32");
  ZT_ERR(zck_dcp_to_torch_save(dir, out, &keep), ZCK_ERR_EXISTS, "exists");

  /* a bit flipped in the last byte of the first chunk's data (its record ends where its
   * data descriptor, PK\x07\x08, starts); zck_dcp_open reads no tensor byte, so the
   * refusal is the streaming copy's CRC check */
  char copy[4096], from[4096], to[4096];
  snprintf(copy, sizeof copy, "%s/flip", tmp);
  ZT_ASSERT(mkdir(copy, 0755) == 0);
  const char *files[] = {".metadata", "__0_0.distcp", "__1_0.distcp"};
  for (int i = 0; i < 3; i++) {
    snprintf(from, sizeof from, "%s/%s", dir, files[i]);
    snprintf(to, sizeof to, "%s/%s", copy, files[i]);
    ZT_ASSERT(copy_file(from, to) == 0);
  }
  unsigned char *data;
  size_t len;
  snprintf(to, sizeof to, "%s/__0_0.distcp", copy);
  ZT_ASSERT(zt_read_file(to, &data, &len) == 0);
  /* the first item is a tensor chunk: its data/0 record is followed by a descriptor */
  const unsigned char *rec = memmem(data, len, "archive/data/0", 14);
  ZT_ASSERT(rec);
  const unsigned char *desc = memmem(rec, len - (size_t)(rec - data), "PK\x07\x08", 4);
  ZT_ASSERT(desc);
  data[desc - data - 1] ^= 0x10;
  ZT_ASSERT(zt_write_file(to, data, len) == 0);
  free(data);
  char flipped[4096];
  snprintf(flipped, sizeof flipped, "%s/flipped.pt", tmp);
  ZT_ERR(zck_dcp_to_torch_save(copy, flipped, &o), ZCK_ERR_DAMAGED, "__0_0.distcp");
  struct stat sb;
  ZT_ASSERT(stat(flipped, &sb) != 0);
  free(dir);
  free(list);
  free(tmp);
  return 0;
}
