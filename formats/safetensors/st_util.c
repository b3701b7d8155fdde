/* st_util.c: arena, warning list, message quoting, UTF-8 check and the JSON
 * string spellings used by the safetensors code (see st_internal.h). */
#include "st_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- arena */

struct zck__arena_block {
  zck__arena_block *next;
  size_t used, cap;
  _Alignas(8) uint8_t data[];
};

void *zck__arena_alloc(zck__arena *a, size_t n) {
  n = (n + 7) & ~(size_t)7;
  zck__arena_block *b = a->head;
  if (!b || b->cap - b->used < n) {
    size_t cap = n > 65536 ? n : 65536;
    b = zck__malloc(sizeof *b + cap);
    if (!b) return NULL;
    b->next = a->head;
    b->used = 0;
    b->cap = cap;
    a->head = b;
  }
  void *p = b->data + b->used;
  b->used += n;
  return p;
}

char *zck__arena_strndup(zck__arena *a, const char *s, size_t n) {
  char *p = zck__arena_alloc(a, n + 1);
  if (!p) return NULL;
  memcpy(p, s, n);
  p[n] = 0;
  return p;
}

void zck__arena_free(zck__arena *a) {
  zck__arena_block *b = a->head;
  while (b) {
    zck__arena_block *next = b->next;
    free(b);
    b = next;
  }
  a->head = NULL;
}

/* ---- warnings */

void zck__strlist_addf(zck__strlist *l, const char *fmt, ...) {
  char *s = NULL;
  va_list ap;
  va_start(ap, fmt);
  int r = vasprintf(&s, fmt, ap);
  va_end(ap);
  if (r < 0) return; /* a lost warning is not worth failing the open */
  if (!ZCK__GROW(l->items, l->cap, l->len + 1)) { free(s); return; }
  l->items[l->len++] = s;
}

void zck__strlist_free(zck__strlist *l) {
  for (size_t i = 0; i < l->len; i++) free(l->items[i]);
  free(l->items);
  memset(l, 0, sizeof *l);
}

/* ---- growing arrays */

/* Grows one array, or two kept in step (b may be NULL), to hold len + 1 elements. */
bool zck__grow2(void *pa, void *pb, size_t *cap, size_t len, size_t elem) {
  if (len < *cap) return true;
  size_t ncap = *cap ? *cap * 2 : 16;
  void *a = zck__realloc(*(void **)pa, ncap * elem);
  if (!a) return false;
  *(void **)pa = a;
  if (pb) {
    void *b = zck__realloc(*(void **)pb, ncap * elem);
    if (!b) return false; /* a keeps its larger size; cap stays, so the next call retries */
    *(void **)pb = b;
  }
  *cap = ncap;
  return true;
}

/* ---- string pairs */

zck_status zck__st_pairs_add(zck__st_pairs *p, const char *key, const char *value, bool *dup) {
  ZCK_TRY(zck__strmap_put(&p->map, key, p->count, dup, NULL));
  if (*dup) return ZCK_OK;
  if (!zck__grow2(&p->keys, &p->values, &p->cap, p->count, sizeof(char *))) return ZCK_ERR_NO_MEMORY;
  p->keys[p->count] = key;
  p->values[p->count++] = value;
  return ZCK_OK;
}

size_t zck__st_pairs_find(const zck__st_pairs *p, const char *key) {
  size_t i;
  return zck__strmap_get(&p->map, key, &i) ? i : SIZE_MAX;
}

void zck__st_pairs_clear(zck__st_pairs *p) {
  zck__strmap_free(&p->map);
  p->count = 0;
}

void zck__st_pairs_free(zck__st_pairs *p) {
  free(p->keys);
  free(p->values);
  zck__strmap_free(&p->map);
  memset(p, 0, sizeof *p);
}

/* ---- messages */

const char *zck__qname(const char *name, char buf[ZCK__QNAME_MAX]) {
  size_t o = 0;
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
    if (o + 8 >= ZCK__QNAME_MAX) {
      memcpy(buf + o, "...", 3);
      o += 3;
      break;
    }
    if (*p < 0x20 || *p == 0x7f || *p == '\\') o += (size_t)snprintf(buf + o, 8, "\\x%02x", *p);
    else buf[o++] = (char)*p;
  }
  buf[o] = 0;
  return buf;
}

/* ---- UTF-8 */

size_t zck__utf8_check(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) { i++; continue; }
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c == 0xE0) { len = 3; lo = 0xA0; }
    else if (c >= 0xE1 && c <= 0xEC) len = 3;
    else if (c == 0xED) { len = 3; hi = 0x9F; }       /* no surrogates */
    else if (c >= 0xEE && c <= 0xEF) len = 3;
    else if (c == 0xF0) { len = 4; lo = 0x90; }
    else if (c >= 0xF1 && c <= 0xF3) len = 4;
    else if (c == 0xF4) { len = 4; hi = 0x8F; }       /* <= U+10FFFF */
    else return i;
    if (n - i < len) return i;
    if (s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; k++)
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    i += len;
  }
  return n;
}

/* ---- JSON string emitters */

static void zck__json_ctrl(zck__buf *b, unsigned c) {
  switch (c) {
  case '\b': zck__buf_str(b, "\\b"); break;
  case '\t': zck__buf_str(b, "\\t"); break;
  case '\n': zck__buf_str(b, "\\n"); break;
  case '\f': zck__buf_str(b, "\\f"); break;
  case '\r': zck__buf_str(b, "\\r"); break;
  default: zck__buf_printf(b, "\\u%04x", c); break;
  }
}

void zck__json_str_serde(zck__buf *b, const char *s) {
  zck__buf_byte(b, '"');
  const unsigned char *p = (const unsigned char *)s, *run = p;
  for (; *p; p++) {
    if (*p >= 0x20 && *p != '"' && *p != '\\') continue;
    zck__buf_append(b, run, (size_t)(p - run));
    if (*p == '"') zck__buf_str(b, "\\\"");
    else if (*p == '\\') zck__buf_str(b, "\\\\");
    else zck__json_ctrl(b, *p);
    run = p + 1;
  }
  zck__buf_append(b, run, (size_t)(p - run));
  zck__buf_byte(b, '"');
}

void zck__json_str_python(zck__buf *b, const char *s) {
  zck__buf_byte(b, '"');
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    unsigned c = *p;
    if (c == '"') { zck__buf_str(b, "\\\""); p++; continue; }
    if (c == '\\') { zck__buf_str(b, "\\\\"); p++; continue; }
    if (c < 0x20) { zck__json_ctrl(b, c); p++; continue; }
    if (c < 0x7f) { zck__buf_byte(b, (uint8_t)c); p++; continue; }
    /* Decode one code point of (already valid) UTF-8; a stray byte is written as U+FFFD. */
    uint32_t cp;
    size_t len = 1;
    if (c == 0x7f) cp = c;
    else if (c >= 0xC0 && c < 0xE0 && p[1]) { cp = (c & 0x1F) << 6 | (p[1] & 0x3F); len = 2; }
    else if (c >= 0xE0 && c < 0xF0 && p[1] && p[2]) {
      cp = (c & 0x0F) << 12 | (uint32_t)(p[1] & 0x3F) << 6 | (p[2] & 0x3F);
      len = 3;
    } else if (c >= 0xF0 && p[1] && p[2] && p[3]) {
      cp = (c & 0x07) << 18 | (uint32_t)(p[1] & 0x3F) << 12 | (uint32_t)(p[2] & 0x3F) << 6 | (p[3] & 0x3F);
      len = 4;
    } else cp = 0xFFFD;
    if (cp >= 0x10000) {
      cp -= 0x10000;
      zck__buf_printf(b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
      zck__buf_printf(b, "\\u%04x", cp);
    }
    p += len;
  }
  zck__buf_byte(b, '"');
}
