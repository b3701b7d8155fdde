/* pk_dump.c: the protocol-2 emitter. Writes a zck_pk tree byte for byte as CPython's C
 * pickler (Modules/_pickle.c) writes the equivalent Python objects at protocol 2: memo PUT
 * after every str, non-empty tuple, list, dict, global and REDUCE/NEWOBJ result; batches of
 * 1000 for APPENDS/SETITEMS (with the exact-type quirks: a plain dict of 1000*k items ends
 * with an empty MARK SETITEMS, a plain list's last batch of one still uses MARK ... APPENDS);
 * OrderedDict, set, frozenset, bytes, bytearray and torch.Size as their __reduce__ spells
 * them. That is what makes files written here load in torch and diff clean against
 * torch.save output. */
#include "pk_internal.h"

#include <stdlib.h>
#include <string.h>

#define ZCK__PK_DUMP_MAX_DEPTH 1000
#define ZCK__PK_BATCH 1000

typedef struct em_global { const char *module, *name; uint32_t idx; } em_global;

/* The memo: a node's PUT index in the slot of its id (its index in its doc), so a tree of
 * millions of nodes is looked up where it was built, not in a hash table scattered over
 * memory; a node whose slot holds a node of another doc (a tree mixing docs) goes to a
 * pointer hash table beside it. */
typedef struct em_slot { const zck_pk *n; uint32_t idx; } em_slot;

typedef struct em {
  zck__buf *out;
  em_slot *slots;        /* by node id */
  size_t nslots;
  const zck_pk **keys;   /* the other nodes: open addressing */
  uint32_t *vals;
  size_t cap, count;
  em_global *globals;
  size_t nglobals, gcap;
  uint32_t next;         /* next memo index, as len(memo) in CPython */
  int64_t latin1;        /* memo index of the shared 'latin1' str, -1 before first use */
  int depth;
} em;

static size_t ptr_hash(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

static uint32_t node_id(const zck_pk *n) { return ((const zck__pkn *)n)->id; }

static int64_t memo_find(const em *e, const zck_pk *n) {
  uint32_t id = node_id(n);
  if (id >= e->nslots || !e->slots[id].n) return -1; /* nothing of this id memoized yet */
  if (e->slots[id].n == n) return e->slots[id].idx;
  if (!e->cap) return -1;
  for (size_t i = ptr_hash(n, e->cap);; i = (i + 1) & (e->cap - 1)) {
    if (!e->keys[i]) return -1;
    if (e->keys[i] == n) return e->vals[i];
  }
}

static inline void op(em *e, uint8_t c) {
  zck__buf *b = e->out;
  if (b->len < b->cap) b->data[b->len++] = c;
  else zck__buf_byte(b, c);
}

static void write_get(em *e, uint32_t idx) {
  if (idx < 256) { op(e, ZPK_BINGET); op(e, (uint8_t)idx); }
  else { op(e, ZPK_LONG_BINGET); zck__buf_u32le(e->out, idx); }
}

/* Writes PUT for the next memo index; returns it. */
static uint32_t write_put(em *e) {
  uint32_t idx = e->next++;
  if (idx < 256) { op(e, ZPK_BINPUT); op(e, (uint8_t)idx); }
  else { op(e, ZPK_LONG_BINPUT); zck__buf_u32le(e->out, idx); }
  return idx;
}

static zck_status memoize(em *e, const zck_pk *n) {
  uint32_t id = node_id(n);
  if (id >= e->nslots) {
    /* from 64: a universal folder's 300k tensor files pickle ~20 nodes each, and zeroing
     * 1024 slots for each was a sixth of that job's instructions */
    size_t cap = e->nslots ? 2 * e->nslots : 64;
    while (cap <= id) cap *= 2;
    em_slot *ns = zck__calloc(cap, sizeof *ns); /* a big table: untouched pages stay unmapped */
    if (!ns) return ZCK_ERR_NO_MEMORY;
    if (e->nslots) memcpy(ns, e->slots, e->nslots * sizeof *ns);
    free(e->slots);
    e->slots = ns;
    e->nslots = cap;
  }
  if (!e->slots[id].n) {
    e->slots[id] = (em_slot){n, write_put(e)};
    return ZCK_OK;
  }
  if ((e->count + 1) * 2 > e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 256;
    const zck_pk **k = zck__calloc(cap, sizeof *k);
    uint32_t *v = zck__calloc(cap, sizeof *v);
    if (!k || !v) { free(k); free(v); return ZCK_ERR_NO_MEMORY; }
    for (size_t i = 0; i < e->cap; i++) {
      if (!e->keys[i]) continue;
      size_t j = ptr_hash(e->keys[i], cap);
      while (k[j]) j = (j + 1) & (cap - 1);
      k[j] = e->keys[i];
      v[j] = e->vals[i];
    }
    free(e->keys);
    free(e->vals);
    e->keys = k;
    e->vals = v;
    e->cap = cap;
  }
  size_t j = ptr_hash(n, e->cap);
  while (e->keys[j]) j = (j + 1) & (e->cap - 1);
  e->keys[j] = n;
  e->vals[j] = write_put(e);
  e->count++;
  return ZCK_OK;
}

/* *idx (optional): the memo index the global has now. */
static zck_status emit_global_at(em *e, const char *module, const char *name, uint32_t *idx) {
  zck__pk_global_py3(&module, &name);
  for (size_t i = 0; i < e->nglobals; i++)
    if (!strcmp(e->globals[i].module, module) && !strcmp(e->globals[i].name, name)) {
      write_get(e, e->globals[i].idx);
      if (idx) *idx = e->globals[i].idx;
      return ZCK_OK;
    }
  if (strchr(module, '\n') || strchr(name, '\n') || !*module || !*name)
    return zck__fail(ZCK_ERR_INVALID_ARG, "pickle: global '%s.%s' cannot be written", module, name);
  const char *m2 = module, *n2 = name;
  zck__pk_global_py2(&m2, &n2);
  op(e, ZPK_GLOBAL);
  zck__buf_str(e->out, m2);
  op(e, '\n');
  zck__buf_str(e->out, n2);
  op(e, '\n');
  if (!ZCK__GROW(e->globals, e->gcap, e->nglobals + 1)) return ZCK_ERR_NO_MEMORY;
  e->globals[e->nglobals++] = (em_global){module, name, write_put(e)};
  if (idx) *idx = e->globals[e->nglobals - 1].idx;
  return ZCK_OK;
}

static zck_status emit_global(em *e, const char *module, const char *name) {
  return emit_global_at(e, module, name, NULL);
}

/* A GLOBAL node: by name, as CPython memoizes the class object; the node then remembers
 * the memo index in its slot, so a node written many times (a writer's one
 * _rebuild_tensor_v2 node for 100k tensors) is a GET without comparing names. */
static zck_status emit_global_node(em *e, const zck_pk *n) {
  uint32_t idx;
  ZCK_TRY(emit_global_at(e, n->u.global.module, n->u.global.name, &idx));
  uint32_t id = node_id(n);
  if (id < e->nslots && !e->slots[id].n) e->slots[id] = (em_slot){n, idx};
  return ZCK_OK;
}

static zck_status emit_unicode(em *e, const char *s, size_t n) {
  if (n > UINT32_MAX) return zck__fail(ZCK_ERR_LIMIT, "pickle: str of %zu bytes too large for protocol 2", n);
  op(e, ZPK_BINUNICODE);
  zck__buf_u32le(e->out, (uint32_t)n);
  zck__buf_append(e->out, s, n);
  return ZCK_OK;
}

static void emit_long_bytes(em *e, const uint8_t *b, size_t n) {
  if (n < 256) { op(e, ZPK_LONG1); op(e, (uint8_t)n); }
  else { op(e, ZPK_LONG4); zck__buf_u32le(e->out, (uint32_t)n); }
  zck__buf_append(e->out, b, n);
}

static void emit_int(em *e, int64_t v) {
  if (v >= 0 && v < 256) { op(e, ZPK_BININT1); op(e, (uint8_t)v); return; }
  if (v >= 0 && v < 65536) { op(e, ZPK_BININT2); zck__buf_u16le(e->out, (uint16_t)v); return; }
  if (v >= INT32_MIN && v <= INT32_MAX) { op(e, ZPK_BININT); zck__buf_u32le(e->out, (uint32_t)(int32_t)v); return; }
  /* pickle.encode_long: the minimal two's complement little-endian bytes */
  uint8_t b[8];
  zck__put64(b, (uint64_t)v);
  size_t n = 8;
  while (n > 1 && ((b[n - 1] == 0 && !(b[n - 2] & 0x80)) || (b[n - 1] == 0xFF && (b[n - 2] & 0x80)))) n--;
  emit_long_bytes(e, b, n);
}

static zck_status emit(em *e, const zck_pk *n);

/* save_reduce of bytes at protocol 2, up to and including REDUCE (the caller memoizes). */
static zck_status emit_bytes_reduce(em *e, const uint8_t *p, size_t n) {
  if (!n) {
    ZCK_TRY(emit_global(e, "builtins", "bytes"));
    op(e, ZPK_EMPTY_TUPLE);
    op(e, ZPK_REDUCE);
    return ZCK_OK;
  }
  ZCK_TRY(emit_global(e, "_codecs", "encode"));
  size_t un = 0;
  for (size_t i = 0; i < n; i++) un += p[i] < 0x80 ? 1 : 2;
  if (un > UINT32_MAX) return zck__fail(ZCK_ERR_LIMIT, "pickle: bytes of %zu too large for protocol 2", n);
  op(e, ZPK_BINUNICODE);   /* the bytes decoded as latin-1, re-encoded as UTF-8 */
  zck__buf_u32le(e->out, (uint32_t)un);
  for (size_t i = 0; i < n; i++) {
    if (p[i] < 0x80) op(e, p[i]);
    else { op(e, (uint8_t)(0xC0 | p[i] >> 6)); op(e, (uint8_t)(0x80 | (p[i] & 0x3F))); }
  }
  write_put(e);
  if (e->latin1 >= 0) write_get(e, (uint32_t)e->latin1);
  else { ZCK_TRY(emit_unicode(e, "latin1", 6)); e->latin1 = write_put(e); }
  op(e, ZPK_TUPLE2);
  write_put(e);
  op(e, ZPK_REDUCE);
  return ZCK_OK;
}

/* Items of a list (exact = a Python list: save_list's batch_list_exact; else the
 * generic iterator batching of batch_list, used for REDUCE'd objects' list items). */
static zck_status emit_appends(em *e, zck_pk *const *items, size_t n, int exact) {
  if (!n) return ZCK_OK;
  if (n == 1) { ZCK_TRY(emit(e, items[0])); op(e, ZPK_APPEND); return ZCK_OK; }
  size_t i = 0;
  while (i < n) {
    if (!exact && n - i == 1) { ZCK_TRY(emit(e, items[i])); op(e, ZPK_APPEND); break; }
    op(e, ZPK_MARK);
    size_t k = n - i < ZCK__PK_BATCH ? n - i : ZCK__PK_BATCH;
    for (size_t j = 0; j < k; j++) ZCK_TRY(emit(e, items[i + j]));
    op(e, ZPK_APPENDS);
    i += k;
  }
  return ZCK_OK;
}

static zck_status emit_setitems(em *e, const zck_pk *d, int exact) {
  size_t n = d->u.dict.len;
  if (!n) return ZCK_OK;
  if (n == 1) {
    ZCK_TRY(emit(e, d->u.dict.keys[0]));
    ZCK_TRY(emit(e, d->u.dict.values[0]));
    op(e, ZPK_SETITEM);
    return ZCK_OK;
  }
  size_t i = 0, k;
  do {   /* batch_dict_exact repeats while a batch was full: 1000*k items end with an empty batch */
    if (!exact && n - i == 1) {
      ZCK_TRY(emit(e, d->u.dict.keys[i]));
      ZCK_TRY(emit(e, d->u.dict.values[i]));
      op(e, ZPK_SETITEM);
      break;
    }
    if (!exact && i == n) break;
    op(e, ZPK_MARK);
    k = n - i < ZCK__PK_BATCH ? n - i : ZCK__PK_BATCH;
    for (size_t j = 0; j < k; j++) {
      ZCK_TRY(emit(e, d->u.dict.keys[i + j]));
      ZCK_TRY(emit(e, d->u.dict.values[i + j]));
    }
    op(e, ZPK_SETITEMS);
    i += k;
  } while (k == ZCK__PK_BATCH);
  return ZCK_OK;
}

/* After REDUCE/NEWOBJ: memoize, unless the object was memoized while its arguments were
 * written (a recursive structure), in which case CPython drops its copy for the memo's. */
static zck_status finish_reduce(em *e, const zck_pk *n) {
  int64_t m = memo_find(e, n);
  if (m >= 0) { op(e, ZPK_POP); write_get(e, (uint32_t)m); return ZCK_OK; }
  return memoize(e, n);
}

static zck_status emit_tuple_items(em *e, const zck_pk *n) {
  size_t len = n->u.seq.len;
  if (len == 0) { op(e, ZPK_EMPTY_TUPLE); return ZCK_OK; }
  if (len > 3) op(e, ZPK_MARK);
  for (size_t i = 0; i < len; i++) ZCK_TRY(emit(e, n->u.seq.items[i]));
  int64_t m = memo_find(e, n);
  if (m >= 0) {   /* recursive tuple: discard what was pushed, fetch the memoized one */
    if (len > 3) op(e, ZPK_POP_MARK);
    else for (size_t i = 0; i < len; i++) op(e, ZPK_POP);
    write_get(e, (uint32_t)m);
    return ZCK_OK;
  }
  op(e, len > 3 ? ZPK_TUPLE : (uint8_t)(ZPK_TUPLE1 + len - 1));
  return memoize(e, n);
}

static zck_status emit_node(em *e, const zck_pk *n) {
  int64_t m;
  switch (n->kind) {
  case ZCK_PK_NONE: op(e, ZPK_NONE); return ZCK_OK;
  case ZCK_PK_BOOL: op(e, n->u.b ? ZPK_NEWTRUE : ZPK_NEWFALSE); return ZCK_OK;
  case ZCK_PK_INT: emit_int(e, n->u.i); return ZCK_OK;
  case ZCK_PK_BIGINT: {
    const uint8_t *b = (const uint8_t *)n->u.str.data;
    size_t len = n->u.str.len;
    while (len > 1 && ((b[len - 1] == 0 && !(b[len - 2] & 0x80)) || (b[len - 1] == 0xFF && (b[len - 2] & 0x80)))) len--;
    if (len == 1 && b[0] == 0) len = 0;
    if (len > UINT32_MAX) return zck__fail(ZCK_ERR_LIMIT, "pickle: int too large");
    emit_long_bytes(e, b, len);
    return ZCK_OK;
  }
  case ZCK_PK_FLOAT: {
    uint64_t u;
    memcpy(&u, &n->u.f, 8);
    op(e, ZPK_BINFLOAT);
    for (int i = 7; i >= 0; i--) op(e, (uint8_t)(u >> (8 * i)));
    return ZCK_OK;
  }
  default: break;
  }
  if (n->kind == ZCK_PK_TUPLE && n->u.seq.len == 0 && n->tag != ZCK_PK_TAG_TORCH_SIZE) {
    op(e, ZPK_EMPTY_TUPLE);   /* the () singleton is never memoized */
    return ZCK_OK;
  }
  if ((m = memo_find(e, n)) >= 0) { write_get(e, (uint32_t)m); return ZCK_OK; }
  switch (n->kind) {
  case ZCK_PK_STR:
    ZCK_TRY(emit_unicode(e, n->u.str.data, n->u.str.len));
    return memoize(e, n);
  case ZCK_PK_BYTES:
    if (n->tag == ZCK_PK_TAG_BYTEARRAY) {   /* bytearray(bytes) */
      ZCK_TRY(emit_global(e, "builtins", "bytearray"));
      ZCK_TRY(emit_bytes_reduce(e, (const uint8_t *)n->u.str.data, n->u.str.len));
      write_put(e);
      op(e, ZPK_TUPLE1);
      write_put(e);
      op(e, ZPK_REDUCE);
      return memoize(e, n);
    }
    ZCK_TRY(emit_bytes_reduce(e, (const uint8_t *)n->u.str.data, n->u.str.len));
    return memoize(e, n);
  case ZCK_PK_TUPLE:
    if (n->tag == ZCK_PK_TAG_TORCH_SIZE) {   /* torch.Size((d0, d1, ...)) */
      ZCK_TRY(emit_global(e, "torch", "Size"));
      if (n->u.seq.len == 0) op(e, ZPK_EMPTY_TUPLE);
      else {
        if (n->u.seq.len > 3) op(e, ZPK_MARK);
        for (size_t i = 0; i < n->u.seq.len; i++) ZCK_TRY(emit(e, n->u.seq.items[i]));
        op(e, n->u.seq.len > 3 ? ZPK_TUPLE : (uint8_t)(ZPK_TUPLE1 + n->u.seq.len - 1));
        write_put(e);
      }
      op(e, ZPK_TUPLE1);
      write_put(e);
      op(e, ZPK_REDUCE);
      return finish_reduce(e, n);
    }
    return emit_tuple_items(e, n);
  case ZCK_PK_LIST:
    op(e, ZPK_EMPTY_LIST);
    ZCK_TRY(memoize(e, n));
    return emit_appends(e, n->u.seq.items, n->u.seq.len, 1);
  case ZCK_PK_SET:   /* set(list) / frozenset(list) */
    ZCK_TRY(emit_global(e, "builtins", n->tag == ZCK_PK_TAG_FROZENSET ? "frozenset" : "set"));
    op(e, ZPK_EMPTY_LIST);
    write_put(e);
    ZCK_TRY(emit_appends(e, n->u.seq.items, n->u.seq.len, 1));
    op(e, ZPK_TUPLE1);
    write_put(e);
    op(e, ZPK_REDUCE);
    return finish_reduce(e, n);
  case ZCK_PK_DICT:
    if (n->u.dict.ordered) {
      ZCK_TRY(emit_global(e, "collections", "OrderedDict"));
      op(e, ZPK_EMPTY_TUPLE);
      op(e, ZPK_REDUCE);
      ZCK_TRY(finish_reduce(e, n));
      ZCK_TRY(emit_setitems(e, n, 0));
    } else {
      op(e, ZPK_EMPTY_DICT);
      ZCK_TRY(memoize(e, n));
      ZCK_TRY(emit_setitems(e, n, 1));
    }
    if (n->u.dict.attrs) {
      ZCK_TRY(emit(e, n->u.dict.attrs));
      op(e, ZPK_BUILD);
    }
    return ZCK_OK;
  case ZCK_PK_GLOBAL:
    return emit_global_node(e, n);
  case ZCK_PK_OBJECT: {
    const zck_pk *args = n->u.obj.args;
    if (!n->u.obj.callable || !args || args->kind != ZCK_PK_TUPLE)
      return zck__fail(ZCK_ERR_INVALID_ARG, "pickle: object node without a callable or an args tuple");
    ZCK_TRY(emit(e, n->u.obj.callable));
    ZCK_TRY(emit(e, args));
    op(e, n->u.obj.newobj ? ZPK_NEWOBJ : ZPK_REDUCE);
    ZCK_TRY(finish_reduce(e, n));
    if (n->u.obj.list_items) {
      const zck_pk *l = n->u.obj.list_items;
      ZCK_TRY(emit_appends(e, l->u.seq.items, l->u.seq.len, 0));
    }
    if (n->u.obj.dict_items) ZCK_TRY(emit_setitems(e, n->u.obj.dict_items, 0));
    if (n->u.obj.state) {
      ZCK_TRY(emit(e, n->u.obj.state));
      op(e, ZPK_BUILD);
    }
    return ZCK_OK;
  }
  case ZCK_PK_PERSID:
    ZCK_TRY(emit(e, n->u.persid.pid));
    op(e, ZPK_BINPERSID);
    return ZCK_OK;
  default:
    return zck__fail(ZCK_ERR_INVALID_ARG, "pickle: node of unknown kind %d", (int)n->kind);
  }
}

static zck_status emit(em *e, const zck_pk *n) {
  if (!n) return zck__fail(ZCK_ERR_INVALID_ARG, "pickle: NULL node in the tree");
  if (++e->depth > ZCK__PK_DUMP_MAX_DEPTH) {
    e->depth--;
    return zck__fail(ZCK_ERR_LIMIT, "pickle: objects nested deeper than %d (or a cycle through arguments)",
                     ZCK__PK_DUMP_MAX_DEPTH);
  }
  zck_status s = emit_node(e, n);
  e->depth--;
  return s;
}

zck_status zck_pickle_dump(const zck_pk *root, zck__buf *out) {
  em e = {0};
  e.out = out;
  e.latin1 = -1;
  op(&e, ZPK_PROTO);
  op(&e, 2);
  zck_status s = emit(&e, root);
  if (s == ZCK_OK) op(&e, ZPK_STOP);
  free(e.slots);
  free(e.keys);
  free(e.vals);
  free(e.globals);
  if (s == ZCK_OK && out->failed) s = zck__fail(ZCK_ERR_NO_MEMORY, "pickle: out of memory");
  return s;
}
