/* torch_util.c: the small tables and helpers the torch reader and writer share: a
 * pointer -> index map, the storage-class and dtype-global tables of torch/storage.py, and
 * the search that names where a node sits in the tree for error messages. */
#include "torch_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- pointer map

static size_t pm_hash(const void *p, size_t cap) {
  uint64_t x = (uint64_t)(uintptr_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return (size_t)x & (cap - 1);
}

bool zck__ptrmap_put(zck__ptrmap *m, const void *key, size_t val) {
  if ((m->count + 1) * 2 > m->cap) {
    size_t cap = m->cap ? m->cap * 2 : 64;
    const void **k = zck__calloc(cap, sizeof *k);
    size_t *v = zck__calloc(cap, sizeof *v);
    if (!k || !v) { free(k); free(v); return false; }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i]) continue;
      size_t j = pm_hash(m->keys[i], cap);
      while (k[j]) j = (j + 1) & (cap - 1);
      k[j] = m->keys[i];
      v[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = k, m->vals = v, m->cap = cap;
  }
  size_t j = pm_hash(key, m->cap);
  while (m->keys[j] && m->keys[j] != key) j = (j + 1) & (m->cap - 1);
  if (!m->keys[j]) m->count++;
  m->keys[j] = key;
  m->vals[j] = val;
  return true;
}

size_t zck__ptrmap_get(const zck__ptrmap *m, const void *key) {
  if (!m->cap) return SIZE_MAX;
  for (size_t j = pm_hash(key, m->cap);; j = (j + 1) & (m->cap - 1)) {
    if (!m->keys[j]) return SIZE_MAX;
    if (m->keys[j] == key) return m->vals[j];
  }
}

void zck__ptrmap_free(zck__ptrmap *m) {
  free(m->keys);
  free(m->vals);
  memset(m, 0, sizeof *m);
}

// ---- dtype tables (torch/storage.py _dtype_to_storage_type_map, torch-pt-format.md §2.3)

static const struct { const char *name; zck_dtype t; } zck__storage_classes[] = {
  {"DoubleStorage", ZCK_F64}, {"FloatStorage", ZCK_F32}, {"HalfStorage", ZCK_F16},
  {"BFloat16Storage", ZCK_BF16}, {"LongStorage", ZCK_I64}, {"IntStorage", ZCK_I32},
  {"ShortStorage", ZCK_I16}, {"CharStorage", ZCK_I8}, {"ByteStorage", ZCK_U8}, {"BoolStorage", ZCK_BOOL},
  {"ComplexFloatStorage", ZCK_C64}, {"ComplexDoubleStorage", ZCK_C128}, {"UntypedStorage", ZCK_U8},
};

zck_dtype zck__torch_storage_dtype(const char *name, bool *quantized) {
  *quantized = false;
  for (size_t i = 0; i < sizeof zck__storage_classes / sizeof *zck__storage_classes; i++)
    if (!strcmp(name, zck__storage_classes[i].name)) return zck__storage_classes[i].t;
  static const char *const q[] = {"QInt8Storage", "QUInt8Storage", "QInt32Storage", "QUInt4x2Storage", "QUInt2x4Storage"};
  for (size_t i = 0; i < sizeof q / sizeof *q; i++)
    if (!strcmp(name, q[i])) *quantized = true;
  return ZCK_DTYPE_INVALID;
}

const char *zck__torch_storage_class(zck_dtype t) {
  for (size_t i = 0; i + 1 < sizeof zck__storage_classes / sizeof *zck__storage_classes; i++)
    if (zck__storage_classes[i].t == t) return zck__storage_classes[i].name;
  return NULL;
}

zck_dtype zck__torch_dtype_global(const char *name, bool *known) {
  static const struct { const char *name; zck_dtype t; } dt[] = {
    {"float64", ZCK_F64}, {"double", ZCK_F64}, {"float32", ZCK_F32}, {"float", ZCK_F32},
    {"float16", ZCK_F16}, {"half", ZCK_F16}, {"bfloat16", ZCK_BF16}, {"int64", ZCK_I64}, {"long", ZCK_I64},
    {"int32", ZCK_I32}, {"int", ZCK_I32}, {"int16", ZCK_I16}, {"short", ZCK_I16}, {"int8", ZCK_I8},
    {"uint8", ZCK_U8}, {"bool", ZCK_BOOL}, {"uint16", ZCK_U16}, {"uint32", ZCK_U32}, {"uint64", ZCK_U64},
    {"float8_e4m3fn", ZCK_F8_E4M3}, {"float8_e5m2", ZCK_F8_E5M2}, {"complex64", ZCK_C64}, {"cfloat", ZCK_C64},
    {"complex128", ZCK_C128}, {"cdouble", ZCK_C128},
  };
  static const char *const other[] = {
    "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "complex32", "chalf",
    "bits8", "bits16", "bits1x8", "bits2x4", "bits4x2", "qint8", "quint8", "qint32", "quint4x2", "quint2x4",
    "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "int1", "int2", "int3", "int4", "int5", "int6", "int7",
  };
  *known = false;
  for (size_t i = 0; i < sizeof dt / sizeof *dt; i++)
    if (!strcmp(name, dt[i].name)) { *known = true; return dt[i].t; }
  for (size_t i = 0; i < sizeof other / sizeof *other; i++)
    if (!strcmp(name, other[i])) *known = true;
  return ZCK_DTYPE_INVALID;
}

// ---- where a node is (for messages)

typedef struct pathfind {
  const zck_pk *target;
  zck__ptrmap seen;
  const char *parts[64];
  char idx[64][24];
  int depth;
} pathfind;

/* Objects (tensors, classes) add no path component: the message names the nearest
 * dict key or list index holding them. */
static int pf_walk(pathfind *p, const zck_pk *n) {
  if (!n) return 0;
  if (n == p->target) return 1;
  if (p->depth >= 64 || zck__ptrmap_get(&p->seen, n) != SIZE_MAX) return 0;
  if (!zck__ptrmap_put(&p->seen, n, 1)) return 0;
  int d = p->depth;
  if (n->kind == ZCK_PK_DICT) {
    p->depth++;
    for (size_t i = 0; i < n->u.dict.len; i++) {
      const zck_pk *k = n->u.dict.keys[i];
      if (k->kind == ZCK_PK_STR) p->parts[d] = k->u.str.data;
      else if (k->kind == ZCK_PK_INT) { snprintf(p->idx[d], sizeof p->idx[d], "%lld", (long long)k->u.i); p->parts[d] = p->idx[d]; }
      else p->parts[d] = "?";
      if (pf_walk(p, n->u.dict.values[i])) return 1;
    }
    p->depth--;
    return pf_walk(p, n->u.dict.attrs);
  }
  if (n->kind == ZCK_PK_LIST || n->kind == ZCK_PK_TUPLE || n->kind == ZCK_PK_SET) {
    p->depth++;
    for (size_t i = 0; i < n->u.seq.len; i++) {
      snprintf(p->idx[d], sizeof p->idx[d], "%zu", i);
      p->parts[d] = p->idx[d];
      if (pf_walk(p, n->u.seq.items[i])) return 1;
    }
    p->depth--;
    return 0;
  }
  if (n->kind == ZCK_PK_OBJECT) {
    const zck_pk *a = n->u.obj.args;
    if (a && a->kind == ZCK_PK_TUPLE) {
      if (a == p->target) return 1;
      for (size_t i = 0; i < a->u.seq.len; i++)
        if (pf_walk(p, a->u.seq.items[i])) return 1;
    }
    return pf_walk(p, n->u.obj.state) || pf_walk(p, n->u.obj.dict_items) || pf_walk(p, n->u.obj.list_items);
  }
  if (n->kind == ZCK_PK_PERSID) return pf_walk(p, n->u.persid.pid);
  return 0;
}

void zck__torch_path_of(const zck_torch_file *f, const zck_pk *node, char *buf, size_t n) {
  pathfind p;
  memset(&p, 0, sizeof p);
  p.target = node;
  size_t len = 0;
  buf[0] = 0;
  if (!pf_walk(&p, zck_pk_doc_root(f->doc))) snprintf(buf, n, "?");
  else if (p.depth == 0) snprintf(buf, n, "<root>");
  else
    for (int i = 0; i < p.depth && len + 1 < n; i++) {
      int r = snprintf(buf + len, n - len, "%s%s", i ? "." : "", p.parts[i]);
      if (r < 0) break;
      len += (size_t)r;
      if (len >= n) len = n - 1;
    }
  zck__ptrmap_free(&p.seen);
}

