/* fuzz_hdf5.c: hostile HDF5 files through zckpt's readers: the universal container
 * (zck_h5u_open: manifest, layouts, every dataset read through its store; zck_h5u_describe,
 * as inspect opens it) and the plain
 * dataset reader (list, open, read a range of each dataset at the root and under the
 * state groups). The input becomes a file because libhdf5 opens files. zckpt must reject
 * bad containers with a message; what libhdf5 itself does with a corrupt file's internal
 * structures is beyond our code, so the corpus holds inputs zckpt must handle. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hdf5/zck_h5.h"

static char path[512];

static void read_all(zck_h5_file *f, const char *group) {
  char **names = NULL;
  size_t n = 0;
  if (zck_h5_list(f, group, &names, &n) != ZCK_OK) return;
  for (size_t i = 0; i < n && i < 64; i++) {
    char full[1024];
    snprintf(full, sizeof full, "%s/%s", group, names[i]);
    zck_h5_dataset *d = NULL;
    if (zck_h5_dataset_open(f, full, &d) == ZCK_OK) {
      const zck_h5_dataset_info *in = zck_h5_dataset_info_of(d);
      uint64_t count = in->numel < 4096 ? in->numel : 4096;
      size_t es = zck_dtype_size(in->dtype) ? zck_dtype_size(in->dtype) : 1;
      void *buf = malloc(count * es + 1);
      if (buf) (void)zck_h5_dataset_read(d, buf, in->numel - count, count);
      free(buf);
      zck_h5_dataset_close(d);
    }
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!path[0]) snprintf(path, sizeof path, "%s/zck-fuzz-%d.h5", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
  FILE *fp = fopen(path, "wb");
  if (!fp) return 0;
  fwrite(data, 1, size, fp);
  fclose(fp);
  zck_h5u *u = NULL;
  if (zck_h5u_open(path, &u) == ZCK_OK) {
    for (int part = 0; part < ZCK_H5U_PART_COUNT; part++) {
      const zck_layout *l = NULL;
      const zck_store *st = NULL;
      if (zck_h5u_get(u, (zck_h5u_part)part, &l, &st) != ZCK_OK || !l) continue;
      for (size_t s = 0; s < l->n_stores && s < 64; s++) {
        if (st[s].kind != ZCK_STORE_CALLBACK || !st[s].read || !st[s].numel) continue;
        uint64_t count = st[s].numel < 1024 ? st[s].numel : 1024;
        void *buf = malloc(count * zck_dtype_size(st[s].dtype) + 1);
        if (buf) (void)st[s].read(st[s].ctx, buf, 0, count);
        free(buf);
      }
    }
    zck_h5u_close(u);
  }
  /* described (inspect): the lazy walk, which only types the datasets under /params */
  if (zck_h5u_describe(path, &u) == ZCK_OK) zck_h5u_close(u);
  zck_h5_file *f = NULL;
  if (zck_h5_open(path, &f) == ZCK_OK) {
    read_all(f, "/");
    read_all(f, "/fp32");
    zck_h5_close(f);
  }
  unlink(path);
  return 0;
}
