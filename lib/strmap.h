/* strmap.h: a name -> index hash table (open addressing, XXH3 of the name), so every lookup
 * of a tensor, parameter or file by name costs O(1): checkpoints of MoE models hold 100k
 * names, and a scan per name makes every job quadratic in the tensor count. Keys are
 * borrowed: they must outlive the table. */
#ifndef ZCK_STRMAP_H
#define ZCK_STRMAP_H

#include "error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct zck__strmap_entry {
  uint64_t hash;
  const char *key;
  size_t slot;            /* index + 1, 0 = empty */
} zck__strmap_entry;      /* one cache line holds a probe's whole state */
typedef struct zck__strmap {
  size_t cap, len;
  zck__strmap_entry *e;
} zck__strmap;
/* A zeroed table is empty and valid too (put sizes it); init presizes it. */
zck_status zck__strmap_init(zck__strmap *m, size_t expected);
/* Inserts key -> index; *existing (when not NULL) receives the previous index and nothing is
 * inserted when the key is already there (returns ZCK_OK either way; *dup tells). */
zck_status zck__strmap_put(zck__strmap *m, const char *key, size_t index, bool *dup, size_t *existing);
bool zck__strmap_get(const zck__strmap *m, const char *key, size_t *index);
/* The index of key, or -1 when absent. */
static inline int64_t zck__strmap_find(const zck__strmap *m, const char *key) {
  size_t i;
  return zck__strmap_get(m, key, &i) ? (int64_t)i : -1;
}
void zck__strmap_free(zck__strmap *m);

#endif
