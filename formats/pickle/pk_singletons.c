/* pk_singletons.c: CPython's shared small strings, for trees that must pickle as CPython
 * pickles the objects they stand for.
 *
 * CPython keeps one object for the empty string and one for each one-character string
 * whose code point is below 256: every such str an unpickler (or str(7)) makes is that
 * object, so a pickler that meets one twice writes it once and then a memo reference. A
 * tree assembled from several pickles (torch's dcp_to_torch_save state dict: the metadata's
 * keys, each item's value) has a node per occurrence instead; this makes them one node. */
#include "pk_internal.h"

#include <stdlib.h>
#include <string.h>

/* Index of s among the singletons ("" = 256), or -1. */
static int singleton_index(const zck_pk *s) {
  const unsigned char *p = (const unsigned char *)s->u.str.data;
  if (s->u.str.len == 0) return 256;
  if (s->u.str.len == 1 && p[0] < 0x80) return p[0];
  if (s->u.str.len == 2 && (p[0] == 0xc2 || p[0] == 0xc3) && (p[1] & 0xc0) == 0x80) return ((p[0] & 0x1f) << 6) | (p[1] & 0x3f);
  return -1;
}

typedef struct walk {
  const zck_pk **seen;   /* open addressing set of visited containers */
  size_t cap, count;
  bool oom;
  zck_pk *canon[257];
} walk;

static bool visit(walk *w, const zck_pk *n) {   /* true the first time */
  if (w->count * 2 >= w->cap) {
    size_t nc = w->cap ? w->cap * 2 : 1024;
    const zck_pk **ns = calloc(nc, sizeof *ns);
    if (!ns) {
      w->oom = true;
      return false;
    }
    for (size_t i = 0; i < w->cap; i++)
      if (w->seen[i]) {
        size_t h = ((uintptr_t)w->seen[i] >> 4) & (nc - 1);
        while (ns[h]) h = (h + 1) & (nc - 1);
        ns[h] = w->seen[i];
      }
    free(w->seen);
    w->seen = ns;
    w->cap = nc;
  }
  size_t h = ((uintptr_t)n >> 4) & (w->cap - 1);
  while (w->seen[h]) {
    if (w->seen[h] == n) return false;
    h = (h + 1) & (w->cap - 1);
  }
  w->seen[h] = n;
  w->count++;
  return true;
}

static void share(walk *w, zck_pk **slot) {
  zck_pk *n = *slot;
  if (!n) return;
  if (n->kind == ZCK_PK_STR) {
    int i = singleton_index(n);
    if (i >= 0) *slot = w->canon[i] ? w->canon[i] : (w->canon[i] = n);
    return;
  }
  if (n->kind < ZCK_PK_TUPLE || !visit(w, n)) return;
  switch (n->kind) {
  case ZCK_PK_TUPLE: case ZCK_PK_LIST: case ZCK_PK_SET:
    for (size_t i = 0; i < n->u.seq.len; i++) share(w, &n->u.seq.items[i]);
    break;
  case ZCK_PK_DICT:
    for (size_t i = 0; i < n->u.dict.len; i++) {
      share(w, &n->u.dict.keys[i]);
      share(w, &n->u.dict.values[i]);
    }
    share(w, &n->u.dict.attrs);
    break;
  case ZCK_PK_OBJECT:
    share(w, &n->u.obj.args);
    share(w, &n->u.obj.state);
    share(w, &n->u.obj.list_items);
    share(w, &n->u.obj.dict_items);
    break;
  case ZCK_PK_PERSID: share(w, &n->u.persid.pid); break;
  default: break;
  }
}

zck_status zck_pk_share_small_strings(zck_pk **root) {
  walk w;
  memset(&w, 0, sizeof w);
  share(&w, root);
  free(w.seen);
  return w.oom ? ZCK_ERR_NO_MEMORY : ZCK_OK;
}
