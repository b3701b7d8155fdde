/* st_test_util.c: see st_test_util.h. */
#include "st_test_util.h"
#include "sha256.h"

#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* SHA-256 comes from tests/common/sha256.c (one copy for every test). */
void st_sha256_hex(const void *data, size_t n, char out[65]) { zt_sha256_hex(data, n, out); }

uint8_t *st_craft_n(uint64_t n_field, const char *json, size_t pad, uint64_t data_len, size_t *len) {
  size_t jl = strlen(json);
  size_t total = 8 + jl + pad + (size_t)data_len;
  uint8_t *b = malloc(total ? total : 1);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)(n_field >> (8 * i));
  memcpy(b + 8, json, jl);
  memset(b + 8 + jl, ' ', pad);
  for (uint64_t i = 0; i < data_len; i++) b[8 + jl + pad + i] = (uint8_t)(i * 7 + 1);
  *len = total;
  return b;
}

uint8_t *st_craft(const char *json, size_t pad, uint64_t data_len, size_t *len) {
  return st_craft_n(strlen(json) + pad, json, pad, data_len, len);
}

char *st_write_tmp(const char *dir, const char *name, const void *data, size_t n) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", dir, name) < 0) abort();
  if (zt_write_file(p, data, n) != 0) ZT_FAIL("cannot write %s", p);
  return p;
}

char *st_slurp(const char *path, size_t *n) {
  unsigned char *d = NULL;
  size_t len = 0;
  if (zt_read_file(path, &d, &len) != 0) { free(d); return NULL; }
  d[len] = 0;
  if (n) *n = len;
  return (char *)d;
}
