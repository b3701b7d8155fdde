/* torch_data.c: reading tensor elements in place, naming the tensors of a state dict, and
 * the weights_only allowlist check.
 *
 * Reads never touch more than the bytes a request covers: a contiguous range is one read;
 * a strided range is read as the byte span it covers when that span is not much larger
 * than the request (then gathered in memory), otherwise split along its outermost varying
 * dimension until the pieces are dense enough (down to single elements for huge strides). */
#include "strmap.h"
#include "torch_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZCK__TORCH_SPAN_SLACK ((uint64_t)1 << 20)   /* bytes a span may exceed 2x the request by */

uint64_t zck_torch_tensor_numel(const zck_torch_tensor *t) { return t->numel; }
uint64_t zck_torch_tensor_nbytes(const zck_torch_tensor *t) { return t->numel * zck_dtype_size(t->dtype); }

int zck_torch_tensor_contiguous(const zck_torch_tensor *t) {
  if (t->numel <= 1) return 1;
  uint64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] == 1) continue;
    if ((uint64_t)t->stride[i] != expect) return 0;
    expect *= (uint64_t)t->shape[i];
  }
  return 1;
}

uint64_t zck_torch_tensor_file_offset(const zck_torch_file *f, const zck_torch_tensor *t) {
  return f->storages[t->storage].data_offset + t->storage_offset * zck_dtype_size(t->dtype);
}

// ---- strided gather

typedef struct view {
  int nd;
  uint64_t size[ZCK_TORCH_MAX_DIMS], stride[ZCK_TORCH_MAX_DIMS];   /* merged dims, in elements */
  uint64_t esz;
  uint64_t base;   /* file offset of element (0,...,0) */
  const zck__source *src;
} view;

static void unravel(const view *v, uint64_t e, uint64_t *idx) {
  for (int d = v->nd - 1; d >= 0; d--) {
    idx[d] = e % v->size[d];
    e /= v->size[d];
  }
}

static uint64_t elem_off(const view *v, const uint64_t *idx) {
  uint64_t o = 0;
  for (int d = 0; d < v->nd; d++) o += idx[d] * v->stride[d];
  return o;
}

/* Element-offset bounds [lo, hi] of the elements a..b (inclusive); *dd = first dimension
 * where a and b differ (nd if a == b). */
static void span_of(const view *v, uint64_t a, uint64_t b, uint64_t *lo, uint64_t *hi, int *dd) {
  uint64_t ia[ZCK_TORCH_MAX_DIMS], ib[ZCK_TORCH_MAX_DIMS];
  unravel(v, a, ia);
  unravel(v, b, ib);
  int d = 0;
  while (d < v->nd && ia[d] == ib[d]) d++;
  *dd = d;
  uint64_t common = 0;
  for (int i = 0; i < d; i++) common += ia[i] * v->stride[i];
  if (d == v->nd) { *lo = *hi = common; return; }
  *lo = common + ia[d] * v->stride[d];
  *hi = common + ib[d] * v->stride[d];
  for (int i = d + 1; i < v->nd; i++) *hi += (v->size[i] - 1) * v->stride[i];
}

/* Copies elements [a, a+count) from mem, which holds the span starting at element offset lo. */
static void gather(const view *v, const uint8_t *mem, uint64_t lo, uint64_t a, uint64_t count, uint8_t *dst) {
  uint64_t idx[ZCK_TORCH_MAX_DIMS];
  unravel(v, a, idx);
  uint64_t off = elem_off(v, idx) - lo;
  int last = v->nd - 1;
  while (count) {
    /* the rest of the innermost row */
    uint64_t run = v->size[last] - idx[last];
    if (run > count) run = count;
    if (v->stride[last] == 1) {
      memcpy(dst, mem + off * v->esz, run * v->esz);
      dst += run * v->esz;
    } else {
      for (uint64_t k = 0; k < run; k++) {
        memcpy(dst, mem + (off + k * v->stride[last]) * v->esz, v->esz);
        dst += v->esz;
      }
    }
    count -= run;
    if (!count) break;
    /* odometer to the next row */
    off += run * v->stride[last];
    idx[last] += run;
    for (int d = last; d > 0 && idx[d] == v->size[d]; d--) {
      off -= idx[d] * v->stride[d];
      idx[d] = 0;
      idx[d - 1]++;
      off += v->stride[d - 1];
    }
  }
}

static zck_status read_range(const view *v, uint64_t a, uint64_t count, uint8_t *dst) {
  uint64_t lo, hi;
  int d;
  span_of(v, a, a + count - 1, &lo, &hi, &d);
  uint64_t span = (hi - lo + 1) * v->esz, want = count * v->esz;
  const uint8_t *mem = zck__source_peek(v->src, v->base + lo * v->esz, span);
  if (mem) { gather(v, mem, lo, a, count, dst); return ZCK_OK; }
  if (span <= 2 * want + ZCK__TORCH_SPAN_SLACK || d >= v->nd) {
    uint8_t *tmp = zck__malloc((size_t)span);
    if (!tmp) return ZCK_ERR_NO_MEMORY;
    zck_status s = zck__source_read(v->src, tmp, (size_t)span, v->base + lo * v->esz);
    if (s == ZCK_OK) gather(v, tmp, lo, a, count, dst);
    free(tmp);
    return s;
  }
  /* too sparse: one piece per index of dimension d */
  uint64_t blk = 1;
  for (int i = d + 1; i < v->nd; i++) blk *= v->size[i];
  uint64_t e = a, end = a + count;
  while (e < end) {
    uint64_t next = (e / blk + 1) * blk;
    if (next > end) next = end;
    ZCK_TRY(read_range(v, e, next - e, dst));
    dst += (next - e) * v->esz;
    e = next;
  }
  return ZCK_OK;
}

/* Elements [first_elem, first_elem + count) of t whose element 0 is at byte `base` of src. */
static zck_status read_from(const zck__source *src, uint64_t base, const zck_torch_tensor *t, void *dst,
                            uint64_t first_elem, uint64_t count, uint64_t esz) {
  if (zck_torch_tensor_contiguous(t)) return zck__source_read(src, dst, (size_t)(count * esz), base + first_elem * esz);
  view v;
  v.nd = 0;
  v.esz = esz;
  v.base = base;
  v.src = src;
  for (int i = 0; i < t->ndim; i++) {   /* drop size-1 dims, merge dims that are dense together */
    if (t->shape[i] == 1) continue;
    uint64_t sz = (uint64_t)t->shape[i], st = (uint64_t)t->stride[i];
    if (v.nd && v.stride[v.nd - 1] == st * sz) {
      v.size[v.nd - 1] *= sz;
      v.stride[v.nd - 1] = st;
    } else {
      v.size[v.nd] = sz;
      v.stride[v.nd] = st;
      v.nd++;
    }
  }
  return read_range(&v, first_elem, count, dst);
}

zck_status zck_torch_tensor_read(const zck_torch_file *f, const zck_torch_tensor *t, void *dst, uint64_t first_elem,
                                 uint64_t count) {
  uint64_t end;
  if (!zck__add_u64(first_elem, count, &end) || end > t->numel)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: elements %llu..%llu requested from a tensor of %llu", f->name,
                     (unsigned long long)first_elem, (unsigned long long)first_elem + count, (unsigned long long)t->numel);
  if (!count) return ZCK_OK;
  uint64_t esz = zck_dtype_size(t->dtype);
  if (count * esz > SIZE_MAX) return zck__fail(ZCK_ERR_INVALID_ARG, "%s: read too large", f->name);
  uint64_t base = zck_torch_tensor_file_offset(f, t);
  const zck_zip_entry *e = f->storages[t->storage].entry;
  if (!e || e->method != 0 || e->size > ZCK_TORCH_SMALL_RECORD) return read_from(f->src, base, t, dst, first_elem, count, esz);
  /* a small record: read whole so its CRC is checked, then served from memory */
  uint8_t *rec = zck__malloc(e->size ? (size_t)e->size : 1);
  if (!rec) return ZCK_ERR_NO_MEMORY;
  zck_status st = zck_zip_read_entry(f->zip, e, rec);
  if (st == ZCK_OK) {
    zck__source mem;
    zck__source_memory(&mem, f->name, rec, e->size);
    st = read_from(&mem, base - e->data_offset, t, dst, first_elem, count, esz);
    zck__source_close(&mem);
  }
  free(rec);
  return st;
}

bool zck_torch_tensor_record(const zck_torch_file *f, const zck_torch_tensor *t, zck_record_check *out) {
  const zck_zip_entry *e = f->storages[t->storage].entry;
  if (!e || e->method != 0) return false;
  *out = (zck_record_check){e->data_offset, e->size, e->crc32, NULL};
  return true;
}

// ---- state dict names

typedef struct sdwalk {
  const char *fname;           /* for messages */
  const zck_torch_tensor *(*tensor_of)(const void *ctx, const zck_pk *node);
  const void *ctx;
  zck_torch_named *v;
  size_t n, cap;
  char name[4096];
  const zck_pk *path[260];   /* containers on the current path, to skip cycles */
  uint64_t visits, max_visits; /* shared sub-trees are walked once per name: bound the total */
} sdwalk;

static zck_status sd_add(sdwalk *w, const zck_torch_tensor *t) {
  if (!ZCK__GROW(w->v, w->cap, w->n + 1)) return ZCK_ERR_NO_MEMORY;
  char *nm = zck__strdup(w->name);
  if (!nm) return ZCK_ERR_NO_MEMORY;
  w->v[w->n].name = nm;
  w->v[w->n].tensor = t;
  w->n++;
  return ZCK_OK;
}

static zck_status sd_walk(sdwalk *w, const zck_pk *n, size_t len, int depth) {
  if (depth > 256)
    return zck__fail(ZCK_ERR_LIMIT, "%s: state dict nested deeper than 256 at \"%.200s\"", w->fname, w->name);
  if (++w->visits > w->max_visits)
    return zck__fail(ZCK_ERR_LIMIT, "%s: state dict names more than %llu entries (heavily shared containers?)", w->fname,
                     (unsigned long long)w->max_visits);
  const zck_torch_tensor *t = w->tensor_of(w->ctx, n);
  if (t) return sd_add(w, t);
  if (n->kind == ZCK_PK_DICT || n->kind == ZCK_PK_LIST || n->kind == ZCK_PK_TUPLE) {
    for (int i = 0; i < depth; i++)
      if (w->path[i] == n) return ZCK_OK;   /* a container holding itself: its names would never end */
    w->path[depth] = n;
  }
  if (n->kind == ZCK_PK_DICT) {
    for (size_t i = 0; i < n->u.dict.len; i++) {
      const zck_pk *k = n->u.dict.keys[i];
      char part[32];
      const char *ks;
      if (k->kind == ZCK_PK_STR) ks = k->u.str.data;
      else if (k->kind == ZCK_PK_INT) { snprintf(part, sizeof part, "%lld", (long long)k->u.i); ks = part; }
      else continue;   /* keys that cannot be part of a name */
      size_t kl = strlen(ks), add = (len ? 1 : 0) + kl;
      if (len + add >= sizeof w->name)
        return zck__fail(ZCK_ERR_LIMIT, "%s: state dict name longer than %zu bytes", w->fname, sizeof w->name);
      if (len) w->name[len] = '.';
      memcpy(w->name + len + (len ? 1 : 0), ks, kl + 1);
      ZCK_TRY(sd_walk(w, n->u.dict.values[i], len + add, depth + 1));
      w->name[len] = 0;
    }
  } else if (n->kind == ZCK_PK_LIST || n->kind == ZCK_PK_TUPLE) {
    for (size_t i = 0; i < n->u.seq.len; i++) {
      char part[32];
      snprintf(part, sizeof part, "%zu", i);
      size_t kl = strlen(part), add = (len ? 1 : 0) + kl;
      if (len + add >= sizeof w->name)
        return zck__fail(ZCK_ERR_LIMIT, "%s: state dict name longer than %zu bytes", w->fname, sizeof w->name);
      if (len) w->name[len] = '.';
      memcpy(w->name + len + (len ? 1 : 0), part, kl + 1);
      ZCK_TRY(sd_walk(w, n->u.seq.items[i], len + add, depth + 1));
      w->name[len] = 0;
    }
  }
  return ZCK_OK;
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(((const zck_torch_named *)a)->name, ((const zck_torch_named *)b)->name);
}

static const zck_torch_tensor *file_tensor_of(const void *ctx, const zck_pk *node) {
  return zck_torch_tensor_of(ctx, node);
}

zck_status zck__torch_named_walk(const char *fname, const zck_torch_tensor *(*tensor_of)(const void *, const zck_pk *),
                                 const void *ctx, const zck_pk_doc *doc, const zck_pk *dict, zck_torch_named **out,
                                 size_t *count) {
  sdwalk w;
  memset(&w, 0, sizeof w);
  w.fname = fname;
  w.tensor_of = tensor_of;
  w.ctx = ctx;
  w.max_visits = 16 * (uint64_t)zck_pk_doc_node_count(doc) + ((uint64_t)1 << 20);
  *out = NULL;
  *count = 0;
  zck_status s = dict ? sd_walk(&w, dict, 0, 0) : ZCK_OK;
  /* duplicate names: a hash set says whether there is one (a model file of 100k params
   * names 100k tensors); only then a sorted copy names the first in name order */
  bool dup = false;
  if (s == ZCK_OK && w.n > 1) {
    zck__strmap seen = {0};
    s = zck__strmap_init(&seen, w.n);
    for (size_t i = 0; s == ZCK_OK && i < w.n && !dup; i++) s = zck__strmap_put(&seen, w.v[i].name, i, &dup, NULL);
    zck__strmap_free(&seen);
  }
  if (s == ZCK_OK && dup) {   /* keep insertion order */
    zck_torch_named *sorted = zck__malloc(w.n * sizeof *sorted);
    if (!sorted) s = ZCK_ERR_NO_MEMORY;
    else {
      memcpy(sorted, w.v, w.n * sizeof *sorted);
      qsort(sorted, w.n, sizeof *sorted, name_cmp);
      for (size_t i = 1; i < w.n && s == ZCK_OK; i++)
        if (!strcmp(sorted[i - 1].name, sorted[i].name))
          s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor name \"%s\" occurs twice in the state dict", fname, sorted[i].name);
      free(sorted);
    }
  }
  if (s != ZCK_OK) {
    zck_torch_named_free(w.v, w.n);
    return s;
  }
  *out = w.v;
  *count = w.n;
  return ZCK_OK;
}

zck_status zck_torch_state_dict(const zck_torch_file *f, const zck_pk *dict, zck_torch_named **out, size_t *count) {
  return zck__torch_named_walk(f->name, file_tensor_of, f, f->doc, dict, out, count);
}

void zck_torch_named_free(zck_torch_named *v, size_t count) {
  if (!v) return;
  for (size_t i = 0; i < count; i++) free(v[i].name);
  free(v);
}

// ---- weights_only (torch/_weights_only_unpickler.py, torch-pt-format.md §3)

static int allowed_global(const char *m, const char *n) {
  static const char *const pairs[][2] = {
    {"collections", "OrderedDict"}, {"collections", "Counter"}, {"torch.nn.parameter", "Parameter"},
    {"torch.serialization", "_get_layout"}, {"torch", "Size"}, {"torch", "Tensor"}, {"torch", "device"},
    {"_codecs", "encode"}, {"builtins", "bytearray"}, {"builtins", "set"}, {"builtins", "complex"},
    {"torch.storage", "UntypedStorage"}, {"torch.storage", "TypedStorage"}, {"torch", "UntypedStorage"},
    {"torch", "TypedStorage"}, {"torch._tensor", "_rebuild_from_type_v2"},
    {"torch", "per_tensor_affine"}, {"torch", "per_channel_affine"}, {"torch", "per_tensor_symmetric"},
    {"torch", "per_channel_symmetric"}, {"torch", "per_channel_affine_float_qparams"},
  };
  for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
    if (!strcmp(m, pairs[i][0]) && !strcmp(n, pairs[i][1])) return 1;
  if (!strcmp(m, "torch._utils")) {
    static const char *const rb[] = {
      "_rebuild_parameter", "_rebuild_parameter_with_state", "_rebuild_qtensor", "_rebuild_tensor",
      "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_sparse_tensor", "_rebuild_meta_tensor_no_storage",
      "_rebuild_wrapper_subclass", "_rebuild_device_tensor_from_numpy", "_rebuild_device_tensor_from_cpu_tensor",
      "_rebuild_nested_tensor",
    };
    for (size_t i = 0; i < sizeof rb / sizeof *rb; i++)
      if (!strcmp(n, rb[i])) return 1;
    return 0;
  }
  if (!strcmp(m, "torch")) {
    bool known, q;
    if (zck__torch_dtype_global(n, &known) != ZCK_DTYPE_INVALID || known) return 1;   /* dtypes */
    size_t l = strlen(n);
    if (l > 7 && !strcmp(n + l - 7, "Storage") && (zck__torch_storage_dtype(n, &q) != ZCK_DTYPE_INVALID || q)) return 1;
    if (l > 6 && !strcmp(n + l - 6, "Tensor")) {   /* torch.FloatTensor, ... */
      static const char *const tc[] = {"Double", "Float", "Half", "BFloat16", "Long", "Int", "Short", "Char",
                                       "Byte", "Bool", "ComplexFloat", "ComplexDouble"};
      for (size_t i = 0; i < sizeof tc / sizeof *tc; i++)
        if (strlen(tc[i]) == l - 6 && !strncmp(n, tc[i], l - 6)) return 1;
    }
  }
  return 0;
}

zck_status zck_torch_check_weights_only(const zck_torch_file *f) {
  static const uint8_t ok_ops[] = {
    0x80, '.', '(', 'c', 'Q', 'R', 'b', 0x81, 't', 0x85, 0x86, 0x87, ')', '}', 's', 'u', ']', 'a', 'e', 0x8f, 0x90,
    'N', 0x88, 0x89, 'K', 'M', 'J', 0x8a, 'G', 'X', 'U', 'q', 'r', 'h', 'j',
  };
  for (int op = 0; op < 256; op++) {
    if (!zck_pk_doc_opcode_seen(f->doc, (uint8_t)op)) continue;
    if (!memchr(ok_ops, op, sizeof ok_ops))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: weights_only: pickle opcode 0x%02x is not allowed", f->name, op);
  }
  size_t n = zck_pk_doc_node_count(f->doc);
  for (size_t i = 0; i < n; i++) {
    const zck_pk *g = zck_pk_doc_node_at(f->doc, i);
    if (g->kind != ZCK_PK_GLOBAL) continue;
    if (!allowed_global(g->u.global.module, g->u.global.name))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: weights_only: global %s.%s is not allowed", f->name, g->u.global.module,
                       g->u.global.name);
  }
  return ZCK_OK;
}
