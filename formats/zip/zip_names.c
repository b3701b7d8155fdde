/* zip_names.c: entry-name checks and the case-insensitive name table shared by the zip
 * reader (lookup, duplicate detection) and writer (refusing names it could not read back). */
#include "zip_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static inline unsigned char zck__zip_lower(unsigned char c) { return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + 32) : c; }

/* FNV-1a over the lower-cased bytes. */
static uint64_t zck__zip_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) h = (h ^ zck__zip_lower(*p)) * 1099511628211ull;
  return h;
}

static bool zck__zip_eq_nocase(const char *a, const char *b) {
  for (; *a && *b; a++, b++)
    if (zck__zip_lower((unsigned char)*a) != zck__zip_lower((unsigned char)*b)) return false;
  return *a == *b;
}

bool zck__zip_names_init(zck__zip_names *t, size_t expected) {
  size_t cap = 16;
  while (cap < expected * 2 + 1) {
    if (cap > SIZE_MAX / 4) { zck__fail(ZCK_ERR_NO_MEMORY, "zip name table: too many entries (%zu)", expected); return false; }
    cap *= 2;
  }
  t->slot = zck__calloc(cap, sizeof *t->slot);
  t->cap = t->slot ? cap : 0;
  t->count = 0;
  return t->slot != NULL;
}

void zck__zip_names_free(zck__zip_names *t) {
  free(t->slot);
  memset(t, 0, sizeof *t);
}

size_t zck__zip_names_find_nocase(const zck__zip_names *t, const char *name, zck__zip_name_fn fn, const void *ctx) {
  if (!t->cap) return SIZE_MAX;
  size_t mask = t->cap - 1;
  for (size_t i = (size_t)zck__zip_hash(name) & mask;; i = (i + 1) & mask) {
    uint32_t s = t->slot[i];
    if (!s) return SIZE_MAX;
    if (zck__zip_eq_nocase(fn(ctx, s - 1), name)) return s - 1;
  }
}

size_t zck__zip_names_find(const zck__zip_names *t, const char *name, zck__zip_name_fn fn, const void *ctx) {
  /* No two names in a table are equal up to case, so the case-insensitive hit is the only
   * candidate. */
  size_t i = zck__zip_names_find_nocase(t, name, fn, ctx);
  return (i != SIZE_MAX && strcmp(fn(ctx, i), name) == 0) ? i : SIZE_MAX;
}

static void zck__zip_names_put(uint32_t *slot, size_t cap, uint32_t v, const char *name) {
  size_t mask = cap - 1;
  size_t i = (size_t)zck__zip_hash(name) & mask;
  while (slot[i]) i = (i + 1) & mask;
  slot[i] = v;
}

bool zck__zip_names_insert(zck__zip_names *t, size_t index, zck__zip_name_fn fn, const void *ctx) {
  if (index >= UINT32_MAX) { zck__fail(ZCK_ERR_LIMIT, "zip: more than %u entries", UINT32_MAX - 1); return false; }
  if ((t->count + 1) * 2 > t->cap) {
    if (t->cap > SIZE_MAX / 4) { zck__fail(ZCK_ERR_NO_MEMORY, "zip name table: too many entries"); return false; }
    size_t cap = t->cap ? t->cap * 2 : 16;
    uint32_t *slot = zck__calloc(cap, sizeof *slot);
    if (!slot) return false;
    for (size_t i = 0; i < t->cap; i++)
      if (t->slot[i]) zck__zip_names_put(slot, cap, t->slot[i], fn(ctx, t->slot[i] - 1));
    free(t->slot);
    t->slot = slot;
    t->cap = cap;
  }
  zck__zip_names_put(t->slot, t->cap, (uint32_t)(index + 1), fn(ctx, index));
  t->count++;
  return true;
}

const char *zck__zip_name_problem(const char *name, size_t len) {
  if (len == 0) return "empty name";
  if (memchr(name, 0, len)) return "NUL byte in name";
  if (name[0] == '/') return "absolute path (leading '/')";
  if (memchr(name, '\\', len)) return "backslash in name";
  for (size_t i = 0; i < len;) {
    size_t j = i;
    while (j < len && name[j] != '/') j++;
    if (j - i == 2 && name[i] == '.' && name[i + 1] == '.') return "'..' path component";
    i = j + 1;
  }
  return NULL;
}

void zck__zip_name_for_message(char *dst, size_t cap, const char *name, size_t len) {
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)name[i];
    if (o + 8 >= cap) { /* leave room for "..." */
      memcpy(dst + o, "...", 4);
      return;
    }
    if (c >= 0x20 && c < 0x7f && c != '"') dst[o++] = (char)c;
    else o += (size_t)snprintf(dst + o, cap - o, "\\x%02x", c);
  }
  dst[o] = 0;
}
