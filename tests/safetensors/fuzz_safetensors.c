/* fuzz_safetensors.c: libFuzzer target for the safetensors reader. Any input must open or
 * fail with a message, never crash or leak. An input that opens must survive every
 * accessor, and its tensors written again by zckpt's writer must open again (the writer
 * emits only what the reader accepts). */
#include "safetensors/safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void rewrite_and_reopen(const zck_st_file *f) {
  zck_st_writer *w;
  if (zck_st_writer_new(&w) != ZCK_OK) abort();
  zck_st_writer_clear_metadata(w);
  for (size_t i = 0; i < zck_st_metadata_count(f); i++) {
    const char *k, *v;
    zck_st_metadata_at(f, i, &k, &v);
    if (zck_st_writer_set_metadata(w, k, v) != ZCK_OK) abort();
  }
  for (size_t i = 0; i < zck_st_count(f); i++) {
    const zck_st_tensor *t = zck_st_tensor_at(f, i);
    if (zck_st_writer_add(w, t->name, t->st_dtype, t->ndim, t->shape, NULL) != ZCK_OK) {
      fprintf(stderr, "writer refused %s: %s\n", t->name, zck_last_error());
      abort();
    }
  }
  zck_status s = zck_st_writer_layout(w);
  if (s == ZCK_OK) {
    size_t hlen;
    const uint8_t *hdr = zck_st_writer_header(w, &hlen);
    uint64_t size = zck_st_writer_file_size(w);
    uint8_t *img = calloc(1, (size_t)size);
    memcpy(img, hdr, hlen);
    zck__source src;
    zck__source_memory(&src, "rewrite", img, size);
    zck_st_file *g;
    if (zck_st_open_source(&src, &g) != ZCK_OK) {
      fprintf(stderr, "rewritten file does not open: %s\n", zck_last_error());
      abort();
    }
    if (zck_st_count(g) != zck_st_count(f)) abort();
    zck_st_close(g);
    zck__source_close(&src);
    free(img);
  } else if (s != ZCK_ERR_LIMIT) { /* a header near the 100 MB cap may grow past it */
    abort();
  }
  zck_st_writer_free(w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zck__source src;
  zck__source_memory(&src, "fuzz.safetensors", data, size);
  zck_st_file *f = NULL;
  if (zck_st_open_source(&src, &f) == ZCK_OK) {
    uint8_t buf[64];
    for (size_t i = 0; i < zck_st_count(f); i++) {
      const zck_st_tensor *t = zck_st_tensor_at(f, i);
      if (zck_st_find(f, t->name) != t) abort();
      uint64_t n = t->nbytes < sizeof buf ? t->nbytes : sizeof buf;
      if (zck_st_read(f, t, buf, t->nbytes - n, n) != ZCK_OK) abort();
      if (t->offset + t->nbytes > zck_st_file_size(f)) abort();
    }
    for (size_t i = 0; i < zck_st_metadata_count(f); i++) {
      const char *k, *v;
      zck_st_metadata_at(f, i, &k, &v);
      if (zck_st_metadata_get(f, k) != v) abort();
    }
    for (size_t i = 0; i < zck_st_warning_count(f); i++) (void)strlen(zck_st_warning_at(f, i));
    rewrite_and_reopen(f);
  } else if (!zck_last_error()[0] || strchr(zck_last_error(), '\n')) {
    abort(); /* every failure has a one-line message */
  }
  zck_st_close(f);
  zck__source_close(&src);
  return 0;
}
