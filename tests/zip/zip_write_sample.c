/* zip_write_sample.c: writes a small archive with zckpt's zip writer for the Python
 * zipfile interop test. Usage: zip_write_sample OUT [plain|zip64|sparse]
 * Entry "t/<name>" of n bytes holds byte k = (k * 13 + n) & 0xff; "sparse" adds a 4 GiB
 * hole entry "t/hole" (all zeros) so later entries sit beyond 4 GiB. */
#include "zip/zip.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static zck_status add(zck_zip_writer *w, const char *name, size_t n) {
  unsigned char *d = malloc(n ? n : 1);
  for (size_t k = 0; k < n; k++) d[k] = (unsigned char)((k * 13 + n) & 0xff);
  zck_status s = zck_zip_writer_add(w, name, d, n);
  free(d);
  return s;
}

static zck_status run(const char *path, const char *mode) {
  zck__outfile of;
  zck_zip_writer *w = NULL;
  ZCK_TRY(zck__outfile_create(&of, path));
  zck_status s = zck_zip_writer_create(&of, &w);
  if (s == ZCK_OK) {
    zck_zip_writer_force_zip64(w, !strcmp(mode, "zip64"));
    const char *names[] = {"t/data.pkl", "t/byteorder", "t/data/0", "t/data/1", "t/data/2", "t/version"};
    const size_t sizes[] = {77, 6, 100000, 0, 64, 2};
    for (size_t i = 0; i < 6 && s == ZCK_OK; i++) {
      s = add(w, names[i], sizes[i]);
      if (s == ZCK_OK && i == 2 && !strcmp(mode, "sparse")) {
        size_t idx;
        uint64_t off;
        s = zck_zip_writer_reserve(w, "t/hole", 0x100000000ull, &idx, &off);
        /* CRC-32 of 2^32 zero bytes, by doubling. */
        static const unsigned char zero[1];
        uint32_t c = zck_crc32(0, zero, 1);
        for (uint64_t len = 1; len < 0x100000000ull; len *= 2) c = zck_crc32_combine(c, c, len);
        zck_zip_writer_set_crc(w, idx, c);
      }
    }
    if (s == ZCK_OK) s = zck_zip_writer_finish(w);
  }
  zck_zip_writer_free(w);
  if (s == ZCK_OK) return zck__outfile_commit(&of);
  zck__outfile_abort(&of);
  return s;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: zip_write_sample OUT [plain|zip64|sparse]\n");
    return 2;
  }
  zck_status s = run(argv[1], argc > 2 ? argv[2] : "plain");
  if (s != ZCK_OK) {
    fprintf(stderr, "zip_write_sample: %s\n", zck_last_error());
    return 1;
  }
  return 0;
}
