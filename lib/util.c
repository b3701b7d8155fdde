/* util.c: allocation with error messages, growable buffers, paths. */
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include "hash_xxh3.h"

void *zck__malloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) zck__fail(ZCK_ERR_NO_MEMORY, "out of memory allocating %zu bytes", n);
  return p;
}
void zck__heap_trim(void) {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

void *zck__calloc(size_t count, size_t size) {
  void *p = calloc(count ? count : 1, size ? size : 1);
  if (!p) zck__fail(ZCK_ERR_NO_MEMORY, "out of memory allocating %zu x %zu bytes", count, size);
  return p;
}
void *zck__realloc(void *old, size_t n) {
  void *p = realloc(old, n ? n : 1);
  if (!p) zck__fail(ZCK_ERR_NO_MEMORY, "out of memory allocating %zu bytes", n);
  return p;
}
bool zck__grow_slow(void **p, size_t *cap, size_t need, size_t elem) {
  size_t n = *cap ? *cap : 16, bytes;
  while (n < need)
    if (__builtin_mul_overflow(n, (size_t)2, &n)) break;
  if (n < need || __builtin_mul_overflow(n, elem, &bytes)) {
    zck__fail(ZCK_ERR_NO_MEMORY, "out of memory: an array of %zu elements of %zu bytes", need, elem);
    return false;
  }
  void *q = zck__realloc(*p, bytes);
  if (!q) return false;
  memset((char *)q + *cap * elem, 0, (n - *cap) * elem);
  *p = q;
  *cap = n;
  return true;
}
char *zck__strdup(const char *s) { return zck__strndup(s, strlen(s)); }
char *zck__strndup(const char *s, size_t n) {
  char *p = zck__malloc(n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}
char *zck__sprintf(const char *fmt, ...) {
  va_list ap;
  char *s = NULL;
  va_start(ap, fmt);
  int r = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (r < 0) {
    zck__fail(ZCK_ERR_NO_MEMORY, "out of memory formatting a string");
    return NULL;
  }
  return s;
}
char *zck__concat(const char *first, ...) {
  /* not asprintf: a universal folder of 100k params joins ~1M paths, and vasprintf's
   * formatting was ~5% of that job's instructions */
  va_list ap;
  size_t n = 0;
  va_start(ap, first);
  for (const char *s = first; s; s = va_arg(ap, const char *)) n += strlen(s);
  va_end(ap);
  char *out = zck__malloc(n + 1), *at = out;
  if (!out) return NULL;
  va_start(ap, first);
  for (const char *s = first; s; s = va_arg(ap, const char *)) {
    size_t k = strlen(s);
    memcpy(at, s, k);
    at += k;
  }
  va_end(ap);
  *at = 0;
  return out;
}
char *zck__path_join(const char *dir, const char *name) {
  size_t n = strlen(dir);
  return zck__concat(dir, n && dir[n - 1] == '/' ? "" : "/", name, (const char *)NULL);
}

void zck__buf_init(zck__buf *b) { memset(b, 0, sizeof *b); }
void zck__buf_free(zck__buf *b) { free(b->data); memset(b, 0, sizeof *b); }
bool zck__buf_reserve(zck__buf *b, size_t extra) {
  if (b->failed) return false;
  if (b->len + extra <= b->cap) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra) cap *= 2;
  uint8_t *p = zck__realloc(b->data, cap);
  if (!p) { b->failed = true; return false; }
  b->data = p;
  b->cap = cap;
  return true;
}
void zck__buf_append(zck__buf *b, const void *p, size_t n) {
  if (!n || !zck__buf_reserve(b, n)) return;
  memcpy(b->data + b->len, p, n);
  b->len += n;
}
/* The small appends write in place when there is room (a universal folder's zip headers
 * are ~80M of them at 100k params). */
void zck__buf_byte(zck__buf *b, uint8_t c) {
  if (!b->failed && b->len + 1 <= b->cap) b->data[b->len++] = c;
  else zck__buf_append(b, &c, 1);
}
void zck__buf_u16le(zck__buf *b, uint16_t v) {
  if (!b->failed && b->len + 2 <= b->cap) { zck__put16(b->data + b->len, v); b->len += 2; return; }
  uint8_t t[2];
  zck__put16(t, v);
  zck__buf_append(b, t, 2);
}
void zck__buf_u32le(zck__buf *b, uint32_t v) {
  if (!b->failed && b->len + 4 <= b->cap) { zck__put32(b->data + b->len, v); b->len += 4; return; }
  uint8_t t[4];
  zck__put32(t, v);
  zck__buf_append(b, t, 4);
}
void zck__buf_u64le(zck__buf *b, uint64_t v) {
  if (!b->failed && b->len + 8 <= b->cap) { zck__put64(b->data + b->len, v); b->len += 8; return; }
  uint8_t t[8];
  zck__put64(t, v);
  zck__buf_append(b, t, 8);
}
void zck__buf_str(zck__buf *b, const char *s) { zck__buf_append(b, s, strlen(s)); }
void zck__buf_printf(zck__buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0 || !zck__buf_reserve(b, (size_t)n + 1)) return;
  va_start(ap, fmt);
  vsnprintf((char *)b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

uint64_t zck_xxh3(const void *data, size_t n) { return XXH3_64bits(data, n); }

zck_status zck__opts_load(void *dst, size_t dst_size, const void *src, const char *what) {
  if (!src) return ZCK_OK;
  size_t n;
  memcpy(&n, src, sizeof n);
  if (n < sizeof n || n > ((size_t)1 << 20))
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: options without their size (initialize them with the _INIT macro)", what);
  memcpy(dst, src, n < dst_size ? n : dst_size);
  memcpy(dst, &dst_size, sizeof dst_size);
  return ZCK_OK;
}
