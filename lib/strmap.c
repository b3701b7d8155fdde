/* strmap.c: the name -> index hash table of strmap.h. */
#include "strmap.h"

#include "util.h"
#include "zck.h"

#include <stdlib.h>
#include <string.h>

static uint64_t zck__strhash(const char *s) { return zck_xxh3(s, strlen(s)); }

zck_status zck__strmap_init(zck__strmap *m, size_t expected) {
  memset(m, 0, sizeof *m);
  size_t cap = 16;
  while (cap < expected * 2) cap *= 2;
  m->e = zck__calloc(cap, sizeof *m->e);
  if (!m->e) return ZCK_ERR_NO_MEMORY;
  m->cap = cap;
  return ZCK_OK;
}

static void zck__strmap_place(zck__strmap_entry *e, size_t cap, zck__strmap_entry v) {
  size_t i = (size_t)v.hash & (cap - 1);
  while (e[i].slot) i = (i + 1) & (cap - 1);
  e[i] = v;
}

static zck_status zck__strmap_grow(zck__strmap *m) {
  size_t cap = m->cap * 2;
  zck__strmap_entry *e = zck__calloc(cap, sizeof *e);
  if (!e) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < m->cap; i++)
    if (m->e[i].slot) zck__strmap_place(e, cap, m->e[i]);
  free(m->e);
  m->e = e;
  m->cap = cap;
  return ZCK_OK;
}

zck_status zck__strmap_put(zck__strmap *m, const char *key, size_t index, bool *dup, size_t *existing) {
  if (!m->cap) ZCK_TRY(zck__strmap_init(m, 8));
  uint64_t h = zck__strhash(key);
  *dup = false;
  for (size_t i = (size_t)h & (m->cap - 1); m->e[i].slot; i = (i + 1) & (m->cap - 1)) {
    if (m->e[i].hash == h && strcmp(m->e[i].key, key) == 0) {
      *dup = true;
      if (existing) *existing = m->e[i].slot - 1;
      return ZCK_OK;
    }
  }
  if ((m->len + 1) * 2 > m->cap) ZCK_TRY(zck__strmap_grow(m));
  zck__strmap_entry v = {h, key, index + 1};
  zck__strmap_place(m->e, m->cap, v);
  m->len++;
  return ZCK_OK;
}

bool zck__strmap_get(const zck__strmap *m, const char *key, size_t *index) {
  if (!m->cap) return false;
  uint64_t h = zck__strhash(key);
  for (size_t i = (size_t)h & (m->cap - 1); m->e[i].slot; i = (i + 1) & (m->cap - 1)) {
    if (m->e[i].hash == h && strcmp(m->e[i].key, key) == 0) {
      *index = m->e[i].slot - 1;
      return true;
    }
  }
  return false;
}

void zck__strmap_free(zck__strmap *m) {
  free(m->e);
  memset(m, 0, sizeof *m);
}

