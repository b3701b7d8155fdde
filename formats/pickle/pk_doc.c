/* pk_doc.c: the node arena of a pickle doc, node constructors for the emitter's callers,
 * and the read helpers consumers use (dict lookup, int/str access, summaries). */
#include "pk_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- arena

zck_pk_doc *zck_pk_doc_new(void) { return zck__calloc(1, sizeof(zck_pk_doc)); }

void *zck__pk_arena(zck_pk_doc *d, size_t n) {
  if (n > SIZE_MAX - 64) return NULL;
  n = (n + 7) & ~(size_t)7;
  if (n > 4096) { /* a chunk of its own */
    zck__pk_chunk *c = zck__malloc(sizeof *c + n);
    if (!c) return NULL;
    c->next = d->big;
    c->used = c->cap = n;
    d->big = c;
    return c->data;
  }
  zck__pk_chunk *c = d->arena;
  if (!c || c->cap - c->used < n) {
    /* chunks double from 1 KiB to 256 KiB: a small pickle pays for little */
    size_t cap = c ? (c->cap < ((size_t)256 << 10) ? 2 * c->cap : c->cap) : 1024;
    if (cap < n) cap = 4096; /* a string of 1-4 KiB early on: the chunk must hold it */
    zck__pk_chunk *nc = zck__malloc(sizeof *nc + cap);
    if (!nc) return NULL;
    nc->next = c;
    nc->used = 0;
    nc->cap = cap;
    d->arena = c = nc;
  }
  void *p = (char *)c->data + c->used;
  c->used += n;
  return p;
}

zck_pk *zck__pk_alloc(zck_pk_doc *d, zck_pk_kind kind) {
  if (d->count >= UINT32_MAX) {
    zck__fail(ZCK_ERR_LIMIT, "more than %u objects", UINT32_MAX - 1);
    return NULL;
  }
  if (d->max_objects && d->count >= d->max_objects) {
    d->hit_limit = true;
    zck__fail(ZCK_ERR_LIMIT, "more than %zu objects", d->max_objects);
    return NULL;
  }
  if (d->count == d->nblocks * ZCK__PK_BLOCK) {
    zck__pkn **nb = zck__realloc(d->blocks, (d->nblocks + 1) * sizeof *nb);
    if (!nb) return NULL;
    d->blocks = nb;
    /* not zeroed here: a block is zeroed node by node as it is handed out, so a small
     * pickle (one per file of a universal folder, 300k of them) costs its own nodes,
     * not a whole block */
    nb[d->nblocks] = zck__malloc(ZCK__PK_BLOCK * sizeof(zck__pkn));
    if (!nb[d->nblocks]) return NULL;
    d->nblocks++;
  }
  zck__pkn *n = &d->blocks[d->count / ZCK__PK_BLOCK][d->count % ZCK__PK_BLOCK];
  memset(n, 0, sizeof *n);
  n->id = (uint32_t)d->count++;
  n->pub.kind = kind;
  return &n->pub;
}

/* What a node owns outside the arena: grown lists, dicts and sets. */
static void pk_free_owned(zck__pkn *w) {
  if (!w->cap) return;
  zck_pk *n = &w->pub;
  if (n->kind == ZCK_PK_DICT) {
    free(n->u.dict.keys);
    free(n->u.dict.values);
  } else {
    free(n->u.seq.items);
  }
}

static void free_chunks(zck__pk_chunk *c) {
  while (c) {
    zck__pk_chunk *next = c->next;
    free(c);
    c = next;
  }
}

void zck_pk_doc_free(zck_pk_doc *d) {
  if (!d) return;
  for (size_t i = 0; i < d->count; i++) pk_free_owned(&d->blocks[i / ZCK__PK_BLOCK][i % ZCK__PK_BLOCK]);
  for (size_t b = 0; b < d->nblocks; b++) free(d->blocks[b]);
  free(d->blocks);
  free_chunks(d->arena);
  free_chunks(d->big);
  free(d->shared);
  free(d);
}

zck__pk_mark zck__pk_doc_mark(const zck_pk_doc *d) {
  return (zck__pk_mark){d->count, d->arena, d->big, d->arena ? d->arena->used : 0};
}

void zck__pk_doc_rollback(zck_pk_doc *d, const zck__pk_mark *m) {
  for (size_t i = m->count; i < d->count; i++) pk_free_owned(&d->blocks[i / ZCK__PK_BLOCK][i % ZCK__PK_BLOCK]);
  d->count = m->count;   /* the blocks stay, for the nodes to come */
  while (d->arena != m->arena) {
    zck__pk_chunk *next = d->arena->next;
    free(d->arena);
    d->arena = next;
  }
  if (d->arena) d->arena->used = m->arena_used;
  while (d->big != m->big) {
    zck__pk_chunk *next = d->big->next;
    free(d->big);
    d->big = next;
  }
}

const zck_pk *zck_pk_doc_root(const zck_pk_doc *d) { return d ? d->root : NULL; }
void zck_pk_doc_set_root(zck_pk_doc *d, zck_pk *root) { d->root = root; }
size_t zck_pk_doc_node_count(const zck_pk_doc *d) { return d ? d->count : 0; }
const zck_pk *zck_pk_doc_node_at(const zck_pk_doc *d, size_t i) {
  if (!d || i >= d->count) return NULL;
  return &d->blocks[i / ZCK__PK_BLOCK][i % ZCK__PK_BLOCK].pub;
}
int zck_pk_doc_opcode_seen(const zck_pk_doc *d, uint8_t op) { return d && (d->ops_seen[op >> 3] >> (op & 7)) & 1; }
int zck_pk_doc_protocol(const zck_pk_doc *d) { return d ? d->protocol : 0; }

bool zck__pk_reserve(zck_pk *node, size_t n) {
  zck__pkn *w = (zck__pkn *)node;
  if (n <= w->cap) return true;
  bool in_arena = !w->cap && node->kind != ZCK_PK_DICT && node->u.seq.items;
  if (in_arena && n <= node->u.seq.len) return true;
  size_t cap = w->cap ? w->cap : 4;
  while (cap < n) {
    if (cap >= UINT32_MAX / 2) { zck__fail(ZCK_ERR_NO_MEMORY, "container too large"); return false; }
    cap *= 2;
  }
  if (in_arena) { /* moves out of the arena (which keeps the old copy until the doc goes) */
    zck_pk **it = zck__malloc(cap * sizeof *it);
    if (!it) return false;
    memcpy(it, node->u.seq.items, node->u.seq.len * sizeof *it);
    node->u.seq.items = it;
  } else if (node->kind == ZCK_PK_DICT) {
    zck_pk **k = zck__realloc(node->u.dict.keys, cap * sizeof *k);
    if (!k) return false;
    node->u.dict.keys = k;
    zck_pk **v = zck__realloc(node->u.dict.values, cap * sizeof *v);
    if (!v) return false;
    node->u.dict.values = v;
  } else {
    zck_pk **it = zck__realloc(node->u.seq.items, cap * sizeof *it);
    if (!it) return false;
    node->u.seq.items = it;
  }
  w->cap = (uint32_t)cap;
  return true;
}

zck_pk *zck__pk_new_seq(zck_pk_doc *d, zck_pk_kind kind, zck_pk *const *items, size_t n) {
  zck_pk *t = zck__pk_alloc(d, kind);
  if (!t) return NULL;
  if (n) {
    if (n > SIZE_MAX / sizeof *items || !(t->u.seq.items = zck__pk_arena(d, n * sizeof *items))) {
      zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
      return NULL;
    }
    if (items) memcpy(t->u.seq.items, items, n * sizeof *items);
    else memset(t->u.seq.items, 0, n * sizeof *items);
  }
  t->u.seq.len = n;
  return t;
}

zck_pk *zck__pk_new_blob(zck_pk_doc *d, zck_pk_kind kind, const void *p, size_t n) {
  zck_pk *node = zck__pk_alloc(d, kind);
  if (!node) return NULL;
  if (n == SIZE_MAX) { zck__fail(ZCK_ERR_NO_MEMORY, "string too large"); return NULL; }
  char *s = zck__pk_arena(d, n + 1);
  if (!s) { zck__fail(ZCK_ERR_NO_MEMORY, "out of memory"); return NULL; }
  if (n) memcpy(s, p, n);
  s[n] = 0;
  node->u.str.data = s;
  node->u.str.len = n;
  return node;
}

const char *zck__pk_module_py3(const char *module) {
  if (!strcmp(module, "__builtin__") || !strcmp(module, "exceptions")) return "builtins";
  if (!strcmp(module, "copy_reg")) return "copyreg";
  return module;
}

/* Lib/_compat_pickle.py's NAME_MAPPING / REVERSE_NAME_MAPPING for the names a protocol-2
 * pickle can carry: the unpickler reads Python 2 spellings, the pickler writes them. */
static const struct { const char *m2, *n2, *m3, *n3; } zck__pk_names[] = {
  {"__builtin__", "xrange", "builtins", "range"}, {"__builtin__", "unichr", "builtins", "chr"},
  {"__builtin__", "unicode", "builtins", "str"}, {"__builtin__", "long", "builtins", "int"},
  {"itertools", "izip", "builtins", "zip"}, {"itertools", "imap", "builtins", "map"},
  {"itertools", "ifilter", "builtins", "filter"},
  {"__builtin__", "basestring", "builtins", "str"}, {"__builtin__", "reduce", "functools", "reduce"},
  {"__builtin__", "intern", "sys", "intern"}, {"exceptions", "StandardError", "builtins", "Exception"},
};
static const char *const zck__pk_py2_exceptions[] = {
  "ArithmeticError", "AssertionError", "AttributeError", "BaseException", "BufferError", "BytesWarning",
  "DeprecationWarning", "EOFError", "EnvironmentError", "Exception", "FloatingPointError", "FutureWarning",
  "GeneratorExit", "IOError", "ImportError", "ImportWarning", "IndentationError", "IndexError", "KeyError",
  "KeyboardInterrupt", "LookupError", "MemoryError", "NameError", "NotImplementedError", "OSError",
  "OverflowError", "PendingDeprecationWarning", "ReferenceError", "RuntimeError", "RuntimeWarning",
  "StopIteration", "SyntaxError", "SyntaxWarning", "SystemError", "SystemExit", "TabError", "TypeError",
  "UnboundLocalError", "UnicodeDecodeError", "UnicodeEncodeError", "UnicodeError", "UnicodeTranslateError",
  "UnicodeWarning", "UserWarning", "ValueError", "Warning", "ZeroDivisionError",
};
static const char *const zck__pk_py3_oserrors[] = {
  "BrokenPipeError", "ChildProcessError", "ConnectionAbortedError", "ConnectionError", "ConnectionRefusedError",
  "ConnectionResetError", "FileExistsError", "FileNotFoundError", "InterruptedError", "IsADirectoryError",
  "NotADirectoryError", "PermissionError", "ProcessLookupError", "TimeoutError",
};

void zck__pk_global_py3(const char **module, const char **name) {
  for (size_t i = 0; i < sizeof zck__pk_names / sizeof zck__pk_names[0]; i++)
    if (!strcmp(*module, zck__pk_names[i].m2) && !strcmp(*name, zck__pk_names[i].n2)) {
      *module = zck__pk_names[i].m3;
      *name = zck__pk_names[i].n3;
      return;
    }
  *module = zck__pk_module_py3(*module);
}

void zck__pk_global_py2(const char **module, const char **name) {
  if (!strcmp(*module, "builtins")) {
    for (size_t i = 0; i < 7; i++)   /* the reversible entries of the table */
      if (!strcmp(*name, zck__pk_names[i].n3)) {
        *module = zck__pk_names[i].m2;
        *name = zck__pk_names[i].n2;
        return;
      }
    for (size_t i = 0; i < sizeof zck__pk_py2_exceptions / sizeof *zck__pk_py2_exceptions; i++)
      if (!strcmp(*name, zck__pk_py2_exceptions[i])) { *module = "exceptions"; return; }
    for (size_t i = 0; i < sizeof zck__pk_py3_oserrors / sizeof *zck__pk_py3_oserrors; i++)
      if (!strcmp(*name, zck__pk_py3_oserrors[i])) { *module = "exceptions"; *name = "OSError"; return; }
    if (!strcmp(*name, "ModuleNotFoundError")) { *module = "exceptions"; *name = "ImportError"; return; }
    *module = "__builtin__";
    return;
  }
  if (!strcmp(*module, "copyreg")) *module = "copy_reg";
}

int zck__pk_utf8_valid(const uint8_t *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c < 0x80) { i++; continue; }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (n - i < len) return 0;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return 0;
      cp = cp << 6 | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF) return 0;   /* overlong or out of range; surrogates pass */
    i += len;
  }
  return 1;
}

// ---- constructors

/* Slot: 0 None, 1 False, 2 True, 3 + (v - MIN) the int v. */
static zck_pk *shared(zck_pk_doc *d, size_t slot, zck_pk_kind kind, int64_t v) {
  if (slot >= d->nshared) {
    /* the first 64 slots, then all: a small tree (a universal folder holds 300k of them)
     * zeroes 0.5 KB, not 8 */
    size_t all = 3 + ZCK__PK_SHARED_MAX - ZCK__PK_SHARED_MIN + 1, n = slot < 64 ? 64 : all;
    zck_pk **tab = zck__realloc(d->shared, n * sizeof *tab);
    if (!tab) return NULL;
    memset(tab + d->nshared, 0, (n - d->nshared) * sizeof *tab);
    d->shared = tab;
    d->nshared = n;
  }
  zck_pk *n = d->shared[slot];
  if (n) return n;
  if (!(n = zck__pk_alloc(d, kind))) return NULL;
  if (kind == ZCK_PK_BOOL) n->u.b = (int)v;
  else if (kind == ZCK_PK_INT) n->u.i = v;
  d->shared_top = d->count;
  return d->shared[slot] = n;
}

zck_pk *zck_pk_new_none(zck_pk_doc *d) { return shared(d, 0, ZCK_PK_NONE, 0); }
zck_pk *zck_pk_new_bool(zck_pk_doc *d, int b) { return shared(d, b ? 2 : 1, ZCK_PK_BOOL, b != 0); }
zck_pk *zck_pk_new_int(zck_pk_doc *d, int64_t v) {
  if (v >= ZCK__PK_SHARED_MIN && v <= ZCK__PK_SHARED_MAX) return shared(d, (size_t)(3 + v - ZCK__PK_SHARED_MIN), ZCK_PK_INT, v);
  zck_pk *n = zck__pk_alloc(d, ZCK_PK_INT);
  if (n) n->u.i = v;
  return n;
}
bool zck__pk_make_shared(zck_pk_doc *d) {
  if (!zck_pk_new_none(d) || !zck_pk_new_bool(d, 0) || !zck_pk_new_bool(d, 1)) return false;
  for (int64_t v = ZCK__PK_SHARED_MIN; v <= ZCK__PK_SHARED_MAX; v++)
    if (!zck_pk_new_int(d, v)) return false;
  return true;
}
zck_pk *zck_pk_new_float(zck_pk_doc *d, double v) {
  zck_pk *n = zck__pk_alloc(d, ZCK_PK_FLOAT);
  if (n) n->u.f = v;
  return n;
}
zck_pk *zck_pk_new_str(zck_pk_doc *d, const char *s) { return zck__pk_new_blob(d, ZCK_PK_STR, s, strlen(s)); }
zck_pk *zck_pk_new_bytes(zck_pk_doc *d, const void *p, size_t n) { return zck__pk_new_blob(d, ZCK_PK_BYTES, p, n); }
zck_pk *zck_pk_new_tuple(zck_pk_doc *d, size_t n) { return zck__pk_new_seq(d, ZCK_PK_TUPLE, NULL, n); }
zck_pk *zck_pk_new_list(zck_pk_doc *d) { return zck__pk_alloc(d, ZCK_PK_LIST); }
zck_pk *zck_pk_new_dict(zck_pk_doc *d, int ordered) {
  zck_pk *n = zck__pk_alloc(d, ZCK_PK_DICT);
  if (n) n->u.dict.ordered = ordered != 0;
  return n;
}
zck_pk *zck_pk_new_set(zck_pk_doc *d, int frozen) {
  zck_pk *n = zck__pk_alloc(d, ZCK_PK_SET);
  if (n && frozen) n->tag = ZCK_PK_TAG_FROZENSET;
  return n;
}
zck_pk *zck_pk_new_global(zck_pk_doc *d, const char *module, const char *name) {
  zck_pk *n = zck__pk_alloc(d, ZCK_PK_GLOBAL);
  if (!n) return NULL;
  zck__pk_global_py3(&module, &name);
  size_t ml = strlen(module) + 1, nl = strlen(name) + 1;
  char *s = zck__pk_arena(d, ml + nl);
  if (!s) { zck__fail(ZCK_ERR_NO_MEMORY, "out of memory"); return NULL; }
  memcpy(s, module, ml);
  memcpy(s + ml, name, nl);
  n->u.global.module = s;
  n->u.global.name = s + ml;
  return n;
}
zck_pk *zck_pk_new_object(zck_pk_doc *d, zck_pk *callable, zck_pk *args, int newobj, zck_pk *state) {
  zck_pk *n = zck__pk_alloc(d, ZCK_PK_OBJECT);
  if (!n) return NULL;
  n->u.obj.callable = callable;
  n->u.obj.args = args;
  n->u.obj.newobj = newobj != 0;
  n->u.obj.state = state;
  return n;
}
zck_pk *zck_pk_new_persid(zck_pk_doc *d, zck_pk *pid) {
  zck_pk *n = zck__pk_alloc(d, ZCK_PK_PERSID);
  if (n) n->u.persid.pid = pid;
  return n;
}

int zck_pk_append(zck_pk_doc *d, zck_pk *seq, zck_pk *item) {
  (void)d;
  if (!seq || !item) return 0;
  ZCK_ASSERT(seq->kind == ZCK_PK_LIST || seq->kind == ZCK_PK_TUPLE || seq->kind == ZCK_PK_SET);
  if (!zck__pk_reserve(seq, seq->u.seq.len + 1)) return 0;
  seq->u.seq.items[seq->u.seq.len++] = item;
  return 1;
}

int zck_pk_dict_set(zck_pk_doc *d, zck_pk *dict, zck_pk *key, zck_pk *value) {
  (void)d;
  if (!dict || !key || !value) return 0;
  ZCK_ASSERT(dict->kind == ZCK_PK_DICT);
  if (!zck__pk_reserve(dict, dict->u.dict.len + 1)) return 0;
  dict->u.dict.keys[dict->u.dict.len] = key;
  dict->u.dict.values[dict->u.dict.len++] = value;
  return 1;
}

// ---- read helpers

const zck_pk *zck_pk_dict_get(const zck_pk *dict, const char *key) {
  if (!dict || dict->kind != ZCK_PK_DICT) return NULL;
  size_t klen = strlen(key);
  for (size_t i = dict->u.dict.len; i-- > 0;) {   /* last wins, as a later SETITEM would */
    const zck_pk *k = dict->u.dict.keys[i];
    if (k->kind == ZCK_PK_STR && k->u.str.len == klen && !memcmp(k->u.str.data, key, klen))
      return dict->u.dict.values[i];
  }
  return NULL;
}

zck_status zck_pk_dict_index_init(zck_pk_dict_index *x, const zck_pk *dict) {
  memset(x, 0, sizeof *x);
  if (!dict || dict->kind != ZCK_PK_DICT) return ZCK_OK;
  x->dict = dict;
  ZCK_TRY(zck__strmap_init(&x->map, dict->u.dict.len));
  for (size_t i = dict->u.dict.len; i-- > 0;) {   /* the first put of a key stays: the last entry */
    const zck_pk *k = dict->u.dict.keys[i];
    /* a key holding U+0000 equals no C string */
    if (k->kind != ZCK_PK_STR || strlen(k->u.str.data) != k->u.str.len) continue;
    bool dup;
    ZCK_TRY(zck__strmap_put(&x->map, k->u.str.data, i, &dup, NULL));
  }
  return ZCK_OK;
}

const zck_pk *zck_pk_dict_index_get(const zck_pk_dict_index *x, const char *key) {
  size_t i;
  return x->dict && zck__strmap_get(&x->map, key, &i) ? x->dict->u.dict.values[i] : NULL;
}

void zck_pk_dict_index_free(zck_pk_dict_index *x) {
  zck__strmap_free(&x->map);
  memset(x, 0, sizeof *x);
}

int zck_pk_is_global(const zck_pk *node, const char *module, const char *name) {
  if (node && node->kind == ZCK_PK_OBJECT) node = node->u.obj.callable;
  if (!node || node->kind != ZCK_PK_GLOBAL) return 0;
  zck__pk_global_py3(&module, &name);
  return !strcmp(node->u.global.module, module) && !strcmp(node->u.global.name, name);
}

int zck_pk_as_int(const zck_pk *node, int64_t *out) {
  if (!node) return 0;
  if (node->kind == ZCK_PK_INT) { *out = node->u.i; return 1; }
  if (node->kind == ZCK_PK_BOOL) { *out = node->u.b; return 1; }
  return 0;
}

int zck_pk_as_double(const zck_pk *node, double *out) {
  if (!node) return 0;
  if (node->kind == ZCK_PK_FLOAT) { *out = node->u.f; return 1; }
  if (node->kind == ZCK_PK_INT) { *out = (double)node->u.i; return 1; }
  return 0;
}

const char *zck_pk_as_str(const zck_pk *node) {
  return node && node->kind == ZCK_PK_STR ? node->u.str.data : NULL;
}

// ---- summary

typedef struct sumbuf { char *p; size_t n, len; } sumbuf;

static void sum_put(sumbuf *b, const char *fmt, ...) ZCK__PRINTF(2, 3);
static void sum_put(sumbuf *b, const char *fmt, ...) {
  if (b->len + 1 >= b->n) return;
  va_list ap;
  va_start(ap, fmt);
  int r = vsnprintf(b->p + b->len, b->n - b->len, fmt, ap);
  va_end(ap);
  if (r < 0) return;
  b->len += (size_t)r;
  if (b->len >= b->n) b->len = b->n - 1;
}

static void sum_node(sumbuf *b, const zck_pk *n, int depth) {
  if (!n) { sum_put(b, "?"); return; }
  if (depth > 3) { sum_put(b, "..."); return; }
  switch (n->kind) {
  case ZCK_PK_NONE: sum_put(b, "None"); return;
  case ZCK_PK_BOOL: sum_put(b, n->u.b ? "True" : "False"); return;
  case ZCK_PK_INT: sum_put(b, "%lld", (long long)n->u.i); return;
  case ZCK_PK_BIGINT: sum_put(b, "int(%zu bytes)", n->u.str.len); return;
  case ZCK_PK_FLOAT: sum_put(b, "%.17g", n->u.f); return;
  case ZCK_PK_STR:
    if (n->u.str.len <= 40) sum_put(b, "'%s'", n->u.str.data);
    else sum_put(b, "'%.37s...'", n->u.str.data);
    return;
  case ZCK_PK_BYTES: sum_put(b, "%s(%zu)", n->tag == ZCK_PK_TAG_BYTEARRAY ? "bytearray" : "bytes", n->u.str.len); return;
  case ZCK_PK_GLOBAL: sum_put(b, "%s.%s", n->u.global.module, n->u.global.name); return;
  case ZCK_PK_PERSID: sum_put(b, "persid("); sum_node(b, n->u.persid.pid, depth + 1); sum_put(b, ")"); return;
  case ZCK_PK_DICT: sum_put(b, "%s(%zu)", n->u.dict.ordered ? "OrderedDict" : "dict", n->u.dict.len); return;
  case ZCK_PK_LIST: sum_put(b, "list(%zu)", n->u.seq.len); return;
  case ZCK_PK_SET: sum_put(b, "%s(%zu)", n->tag == ZCK_PK_TAG_FROZENSET ? "frozenset" : "set", n->u.seq.len); return;
  case ZCK_PK_TUPLE:
    sum_put(b, n->tag == ZCK_PK_TAG_TORCH_SIZE ? "torch.Size([" : "(");
    if (depth >= 2) sum_put(b, "...");
    else
      for (size_t i = 0; i < n->u.seq.len && b->len + 1 < b->n; i++) {
        if (i) sum_put(b, ", ");
        if (i >= 8) { sum_put(b, "..."); break; }
        sum_node(b, n->u.seq.items[i], depth + 1);
      }
    sum_put(b, n->tag == ZCK_PK_TAG_TORCH_SIZE ? "])" : (n->u.seq.len == 1 ? ",)" : ")"));
    return;
  case ZCK_PK_OBJECT: {
    const zck_pk *c = n->u.obj.callable;
    const char *name = c && c->kind == ZCK_PK_GLOBAL ? c->u.global.name : "?";
    if (c && c->kind == ZCK_PK_GLOBAL && !strcmp(c->u.global.name, "getattr") && n->u.obj.args &&
        n->u.obj.args->kind == ZCK_PK_TUPLE && n->u.obj.args->u.seq.len == 2 && depth < 2) {
      /* enum member as Python >= 3.11 pickles it: getattr(Cls, 'NAME') */
      sum_node(b, n->u.obj.args->u.seq.items[0], depth + 1);
      const char *m = zck_pk_as_str(n->u.obj.args->u.seq.items[1]);
      sum_put(b, ".%s", m ? m : "?");
      return;
    }
    sum_put(b, "%s(", name);
    if (depth < 2 && n->u.obj.args && n->u.obj.args->kind == ZCK_PK_TUPLE && n->u.obj.args->u.seq.len <= 2) {
      for (size_t i = 0; i < n->u.obj.args->u.seq.len; i++) {
        if (i) sum_put(b, ", ");
        sum_node(b, n->u.obj.args->u.seq.items[i], depth + 1);
      }
    } else {
      sum_put(b, "...");
    }
    sum_put(b, ")");
    return;
  }
  }
  sum_put(b, "?");
}

void zck_pk_summary(const zck_pk *node, char *buf, size_t n) {
  if (!n) return;
  sumbuf b = {buf, n, 0};
  buf[0] = 0;
  sum_node(&b, node, 0);
  buf[b.len] = 0;
}
