/* torch_read.c: opening a torch.save archive. Checks the archive level (folder, version,
 * byteorder, data.pkl), loads data.pkl with the pickle VM, then resolves every persistent
 * id into a storage record and every tensor rebuild call into a tensor record, so that
 * consumers only ever see validated geometry. Each refusal is one line naming the file and
 * where in its pickle the fault is. */
#include "torch_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- storages

static zck_status sfail(const zck_torch_file *f, const zck_pk *node, zck_status s, const char *fmt, ...)
  ZCK__PRINTF(4, 5);
static zck_status sfail(const zck_torch_file *f, const zck_pk *node, zck_status s, const char *fmt, ...) {
  char msg[400], where[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  zck__torch_path_of(f, node, where, sizeof where);
  return zck__fail(s, "%s: %s: %s", f->name, where, msg);
}

static uint64_t key_hash(const char *k) {
  uint64_t h = 1469598103934665603ULL;   /* FNV-1a */
  for (; *k; k++) h = (h ^ (uint8_t)*k) * 1099511628211ULL;
  return h;
}

/* Index of the storage with this key, or SIZE_MAX. */
static size_t key_find(const zck_torch_file *f, const char *key) {
  if (!f->key_cap) return SIZE_MAX;
  for (size_t j = key_hash(key) & (f->key_cap - 1);; j = (j + 1) & (f->key_cap - 1)) {
    if (!f->key_slots[j]) return SIZE_MAX;
    if (!strcmp(f->storages[f->key_slots[j] - 1].key, key)) return f->key_slots[j] - 1;
  }
}

static bool key_insert(zck_torch_file *f, size_t index) {
  if ((f->nstorages + 1) * 2 > f->key_cap) {
    size_t cap = f->key_cap ? f->key_cap * 2 : 64;
    size_t *slots = zck__calloc(cap, sizeof *slots);
    if (!slots) return false;
    for (size_t i = 0; i < f->key_cap; i++) {
      if (!f->key_slots[i]) continue;
      size_t j = key_hash(f->storages[f->key_slots[i] - 1].key) & (cap - 1);
      while (slots[j]) j = (j + 1) & (cap - 1);
      slots[j] = f->key_slots[i];
    }
    free(f->key_slots);
    f->key_slots = slots;
    f->key_cap = cap;
  }
  size_t j = key_hash(f->storages[index].key) & (f->key_cap - 1);
  while (f->key_slots[j]) j = (j + 1) & (f->key_cap - 1);
  f->key_slots[j] = index + 1;
  return true;
}

static zck_status resolve_storage(zck_torch_file *f, const zck_pk *persid) {
  const zck_pk *pid = persid->u.persid.pid;
  if (!pid || pid->kind != ZCK_PK_TUPLE || pid->u.seq.len < 1 || !zck_pk_as_str(pid->u.seq.items[0]) ||
      strcmp(pid->u.seq.items[0]->u.str.data, "storage"))
    return sfail(f, persid, ZCK_ERR_FORMAT, "persistent id is not a ('storage', ...) tuple");
  if (pid->u.seq.len != 5)
    return sfail(f, persid, ZCK_ERR_FORMAT, "persistent id has %zu items, expected 5%s", pid->u.seq.len,
                 pid->u.seq.len == 6 ? " (a TorchScript pickle?)" : "");
  zck_pk *const *it = pid->u.seq.items;
  if (it[1]->kind != ZCK_PK_GLOBAL) return sfail(f, persid, ZCK_ERR_FORMAT, "storage type is not a class");
  bool quantized;
  zck_dtype dt = zck__torch_storage_dtype(it[1]->u.global.name, &quantized);
  if (quantized)
    return sfail(f, persid, ZCK_ERR_UNSUPPORTED, "quantized storage %s is not supported", it[1]->u.global.name);
  if (dt == ZCK_DTYPE_INVALID)
    return sfail(f, persid, ZCK_ERR_FORMAT, "unknown storage type %s.%s", it[1]->u.global.module, it[1]->u.global.name);
  char key[32];
  if (it[2]->kind == ZCK_PK_STR) {
    if (it[2]->u.str.len == 0 || it[2]->u.str.len >= sizeof key || strchr(it[2]->u.str.data, '/'))
      return sfail(f, persid, ZCK_ERR_FORMAT, "storage key is not a short name");
    memcpy(key, it[2]->u.str.data, it[2]->u.str.len + 1);
  } else if (it[2]->kind == ZCK_PK_INT) {
    snprintf(key, sizeof key, "%lld", (long long)it[2]->u.i);
  } else {
    return sfail(f, persid, ZCK_ERR_FORMAT, "storage key is a %s, not a str or int",
                 it[2]->kind == ZCK_PK_NONE ? "None" : "non-scalar");
  }
  const char *loc = zck_pk_as_str(it[3]);
  if (!loc) return sfail(f, persid, ZCK_ERR_FORMAT, "storage '%s': location is not a str", key);
  int64_t numel;
  if (it[4]->kind != ZCK_PK_INT || !zck_pk_as_int(it[4], &numel) || numel < 0)
    return sfail(f, persid, ZCK_ERR_FORMAT, "storage '%s': numel is not a non-negative int", key);
  size_t found = key_find(f, key);
  if (found != SIZE_MAX) {
    size_t i = found;
    zck_torch_storage *s = &f->storages[i];
    if (s->dtype != dt || s->numel != (uint64_t)numel)
      return sfail(f, persid, ZCK_ERR_FORMAT, "storage '%s' used as %s x %lld after %s x %llu", key,
                   it[1]->u.global.name, (long long)numel, zck_dtype_name(s->dtype), (unsigned long long)s->numel);
    if (!zck__ptrmap_put(&f->storage_of, persid, i)) return ZCK_ERR_NO_MEMORY;
    return ZCK_OK;
  }
  char *ename = zck__sprintf("%s/data/%s", f->prefix, key);
  if (!ename) return ZCK_ERR_NO_MEMORY;
  const zck_zip_entry *e = zck_zip_find(f->zip, ename);
  free(ename);
  if (!e) return sfail(f, persid, ZCK_ERR_FORMAT, "storage '%s': record %s/data/%s is missing", key, f->prefix, key);
  uint64_t nbytes;
  if (!zck__mul_u64((uint64_t)numel, zck_dtype_size(dt), &nbytes))
    return sfail(f, persid, ZCK_ERR_FORMAT, "storage '%s': %lld elements overflow a byte count", key, (long long)numel);
  if (e->size != nbytes)
    return sfail(f, persid, ZCK_ERR_FORMAT, "storage '%s': record has %llu bytes, but %lld x %s needs %llu", key,
                 (unsigned long long)e->size, (long long)numel, zck_dtype_name(dt), (unsigned long long)nbytes);
  if (e->method != 0)
    return sfail(f, persid, ZCK_ERR_UNSUPPORTED, "storage '%s': record is compressed (method %u)", key, e->method);
  if (!ZCK__GROW(f->storages, f->scap, f->nstorages + 1)) return ZCK_ERR_NO_MEMORY;
  zck_torch_storage *s = &f->storages[f->nstorages];
  memset(s, 0, sizeof *s);
  s->key = zck__strdup(key);
  s->location = zck__strdup(loc);
  if (!s->key || !s->location) { free((char *)s->key); free((char *)s->location); return ZCK_ERR_NO_MEMORY; }
  s->dtype = dt;
  s->numel = (uint64_t)numel;
  s->nbytes = nbytes;
  s->entry = e;
  s->data_offset = e->data_offset;
  if (!zck__ptrmap_put(&f->storage_of, persid, f->nstorages) || !key_insert(f, f->nstorages)) {
    free((char *)s->key);
    free((char *)s->location);
    return ZCK_ERR_NO_MEMORY;
  }
  f->nstorages++;
  return ZCK_OK;
}

// ---- tensors

typedef enum { RB_NONE, RB_V1, RB_V2, RB_V3, RB_PARAM, RB_PARAM_STATE, RB_FROM_TYPE } rb_kind;

static rb_kind rebuild_kind(const zck_pk *g) {
  if (!g || g->kind != ZCK_PK_GLOBAL) return RB_NONE;
  if (!strcmp(g->u.global.module, "torch._utils")) {
    const char *n = g->u.global.name;
    if (!strcmp(n, "_rebuild_tensor")) return RB_V1;
    if (!strcmp(n, "_rebuild_tensor_v2")) return RB_V2;
    if (!strcmp(n, "_rebuild_tensor_v3")) return RB_V3;
    if (!strcmp(n, "_rebuild_parameter")) return RB_PARAM;
    if (!strcmp(n, "_rebuild_parameter_with_state")) return RB_PARAM_STATE;
  }
  if (!strcmp(g->u.global.module, "torch._tensor") && !strcmp(g->u.global.name, "_rebuild_from_type_v2")) return RB_FROM_TYPE;
  return RB_NONE;
}

static zck_torch_tensor *new_tensor(zck_torch_file *f, const zck_pk *node) {
  if (f->ntensors == f->tcap) {
    size_t cap = f->tcap ? f->tcap * 2 : 64;
    zck_torch_tensor *nt = zck__realloc(f->tensors, cap * sizeof *nt);
    if (!nt) return NULL;
    f->tensors = nt;
    bool *w = zck__realloc(f->wrapped, cap * sizeof *w);
    if (!w) return NULL;
    f->wrapped = w;
    f->tcap = cap;
  }
  if (!zck__ptrmap_put(&f->tensor_of, node, f->ntensors)) return NULL;
  zck_torch_tensor *t = &f->tensors[f->ntensors];
  memset(t, 0, sizeof *t);
  f->wrapped[f->ntensors] = false;
  f->ntensors++;
  t->node = node;
  return t;
}

static int is_empty_dict(const zck_pk *n) { return n && n->kind == ZCK_PK_DICT && n->u.dict.len == 0; }

static zck_status rebuild_storage_tensor(zck_torch_file *f, const zck_pk *node, rb_kind k, const zck_pk *args) {
  size_t n = args->u.seq.len;
  zck_pk *const *a = args->u.seq.items;
  size_t lo = k == RB_V1 ? 4 : k == RB_V2 ? 6 : 7;
  if (n < lo || n > lo + (k != RB_V1))
    return sfail(f, node, ZCK_ERR_FORMAT, "tensor rebuild call with %zu arguments, expected %zu", n, lo);
  size_t si = a[0]->kind == ZCK_PK_PERSID ? zck__ptrmap_get(&f->storage_of, a[0]) : SIZE_MAX;
  if (si == SIZE_MAX) return sfail(f, node, ZCK_ERR_FORMAT, "tensor argument 0 is not a storage");
  const zck_torch_storage *st = &f->storages[si];
  zck_dtype dt = st->dtype;
  if (k == RB_V3) {
    bool known;
    dt = a[6]->kind == ZCK_PK_GLOBAL && !strcmp(a[6]->u.global.module, "torch")
           ? zck__torch_dtype_global(a[6]->u.global.name, &known) : (known = false, ZCK_DTYPE_INVALID);
    if (dt == ZCK_DTYPE_INVALID) {
      if (known) return sfail(f, node, ZCK_ERR_UNSUPPORTED, "dtype torch.%s is not supported", a[6]->u.global.name);
      return sfail(f, node, ZCK_ERR_FORMAT, "tensor dtype is not a known torch dtype");
    }
  }
  if (k >= RB_V2 && !is_empty_dict(a[5]))
    return sfail(f, node, ZCK_ERR_FORMAT, "backward_hooks is not an empty OrderedDict");
  size_t meta = k == RB_V2 ? 6 : 7;
  if (k != RB_V1 && n > meta) {
    if (a[meta]->kind != ZCK_PK_DICT) return sfail(f, node, ZCK_ERR_FORMAT, "tensor metadata is not a dict");
    if (a[meta]->u.dict.len)
      return sfail(f, node, ZCK_ERR_UNSUPPORTED, "tensor metadata (conjugate / negative bits) is not supported");
  }
  int64_t off, rg = 0;
  if (a[1]->kind != ZCK_PK_INT || !zck_pk_as_int(a[1], &off))
    return sfail(f, node, ZCK_ERR_FORMAT, "storage offset is not an int");
  if (k != RB_V1 && !zck_pk_as_int(a[4], &rg)) return sfail(f, node, ZCK_ERR_FORMAT, "requires_grad is not a bool");
  const zck_pk *sz = a[2], *sd = a[3];
  if (sz->kind != ZCK_PK_TUPLE || sd->kind != ZCK_PK_TUPLE)
    return sfail(f, node, ZCK_ERR_FORMAT, "size or stride is not a tuple");
  if (sz->u.seq.len != sd->u.seq.len)
    return sfail(f, node, ZCK_ERR_FORMAT, "size has %zu dimensions but stride %zu", sz->u.seq.len, sd->u.seq.len);
  size_t ndim = sz->u.seq.len;
  if (ndim > ZCK_TORCH_MAX_DIMS) return sfail(f, node, ZCK_ERR_LIMIT, "%zu dimensions (at most %d)", ndim, ZCK_TORCH_MAX_DIMS);
  int64_t *dims = zck__malloc((2 * ndim + 1) * sizeof *dims);
  if (!dims) return ZCK_ERR_NO_MEMORY;
  uint64_t numel = 1, span = 0, esz = zck_dtype_size(dt);
  bool overflow = false;
  for (size_t i = 0; i < ndim; i++) {
    if (sz->u.seq.items[i]->kind != ZCK_PK_INT || sd->u.seq.items[i]->kind != ZCK_PK_INT) {
      free(dims);
      return sfail(f, node, ZCK_ERR_FORMAT, "size or stride %zu is not an int", i);
    }
    dims[i] = sz->u.seq.items[i]->u.i;
    dims[ndim + i] = sd->u.seq.items[i]->u.i;
    if (dims[i] < 0 || dims[ndim + i] < 0) {
      long long bad_sz = dims[i], bad_st = dims[ndim + i];
      free(dims);
      return sfail(f, node, ZCK_ERR_FORMAT, "negative size or stride in dimension %zu (%lld, %lld)", i, bad_sz, bad_st);
    }
    uint64_t term;
    overflow |= !zck__mul_u64(numel, (uint64_t)dims[i], &numel);
    if (dims[i] > 0) {
      overflow |= !zck__mul_u64((uint64_t)dims[i] - 1, (uint64_t)dims[ndim + i], &term);
      overflow |= !zck__add_u64(span, term, &span);
    }
  }
  if (off < 0) { free(dims); return sfail(f, node, ZCK_ERR_FORMAT, "negative storage offset %lld", (long long)off); }
  /* extent in bytes of the storage the view touches: (offset + 1 + span) elements, or offset when empty */
  uint64_t need = (uint64_t)off, need_bytes = 0;
  if (numel > 0) overflow |= !zck__add_u64(need, span + 1, &need) || span + 1 == 0;
  overflow |= !zck__mul_u64(need, esz, &need_bytes) || !zck__mul_u64(numel, esz, &(uint64_t){0});
  if (overflow) { free(dims); return sfail(f, node, ZCK_ERR_FORMAT, "size / stride arithmetic overflows"); }
  if (need_bytes > st->nbytes) {
    free(dims);
    return sfail(f, node, ZCK_ERR_FORMAT,
                 "view needs %llu elements of storage '%s' (offset %lld), which has %llu bytes = %llu elements",
                 (unsigned long long)need, st->key, (long long)off, (unsigned long long)st->nbytes,
                 (unsigned long long)(st->nbytes / esz));
  }
  zck_torch_tensor *t = new_tensor(f, node);
  if (!t) { free(dims); return ZCK_ERR_NO_MEMORY; }
  t->storage = si;
  t->dtype = dt;
  t->ndim = (int)ndim;
  t->shape = dims;
  t->stride = dims + ndim;
  t->storage_offset = (uint64_t)off;
  t->numel = numel;
  t->requires_grad = rg != 0;
  return ZCK_OK;
}

static zck_status resolve_call(zck_torch_file *f, const zck_pk *node, const zck_pk *callable, const zck_pk *args);

/* _rebuild_parameter(data, requires_grad, hooks[, state]): a copy of data's record. */
static zck_status rebuild_param(zck_torch_file *f, const zck_pk *node, rb_kind k, const zck_pk *args) {
  size_t want = k == RB_PARAM ? 3 : 4;
  if (args->u.seq.len != want)
    return sfail(f, node, ZCK_ERR_FORMAT, "parameter rebuild with %zu arguments, expected %zu", args->u.seq.len, want);
  size_t ti = zck__ptrmap_get(&f->tensor_of, args->u.seq.items[0]);
  if (ti == SIZE_MAX) return sfail(f, node, ZCK_ERR_FORMAT, "parameter data is not a tensor");
  int64_t rg;
  if (!zck_pk_as_int(args->u.seq.items[1], &rg)) return sfail(f, node, ZCK_ERR_FORMAT, "requires_grad is not a bool");
  if (args->u.seq.items[2]->kind != ZCK_PK_DICT)
    return sfail(f, node, ZCK_ERR_FORMAT, "backward_hooks is not an OrderedDict");
  zck_torch_tensor *t = new_tensor(f, node);
  if (!t) return ZCK_ERR_NO_MEMORY;
  zck_torch_tensor *inner = &f->tensors[ti];
  int64_t *dims = zck__malloc((2 * (size_t)inner->ndim + 1) * sizeof *dims);
  if (!dims) { f->ntensors--; return ZCK_ERR_NO_MEMORY; }
  memcpy(dims, inner->shape, (size_t)inner->ndim * sizeof *dims);
  memcpy(dims + inner->ndim, inner->stride, (size_t)inner->ndim * sizeof *dims);
  *t = *inner;
  t->node = node;
  t->shape = dims;
  t->stride = dims + inner->ndim;
  t->requires_grad = rg != 0;
  t->is_parameter = 1;
  f->wrapped[ti] = true;
  return ZCK_OK;
}

static zck_status resolve_call(zck_torch_file *f, const zck_pk *node, const zck_pk *callable, const zck_pk *args) {
  rb_kind k = rebuild_kind(callable);
  if (k == RB_NONE) return ZCK_OK;
  if (!args || args->kind != ZCK_PK_TUPLE) return sfail(f, node, ZCK_ERR_FORMAT, "tensor rebuild arguments are not a tuple");
  switch (k) {
  case RB_V1: case RB_V2: case RB_V3: return rebuild_storage_tensor(f, node, k, args);
  case RB_PARAM: case RB_PARAM_STATE: return rebuild_param(f, node, k, args);
  case RB_FROM_TYPE: {   /* _rebuild_from_type_v2(func, type, args, state): the tensor is func(*args) */
    if (args->u.seq.len != 4) return sfail(f, node, ZCK_ERR_FORMAT, "_rebuild_from_type_v2 with %zu arguments", args->u.seq.len);
    rb_kind inner = rebuild_kind(args->u.seq.items[0]);
    if (inner == RB_NONE || inner == RB_FROM_TYPE) return ZCK_OK;   /* not a tensor we know: stays an object */
    ZCK_TRY(resolve_call(f, node, args->u.seq.items[0], args->u.seq.items[2]));
    size_t ti = zck__ptrmap_get(&f->tensor_of, node);
    if (ti != SIZE_MAX && zck_pk_is_global(args->u.seq.items[1], "torch.nn.parameter", "Parameter"))
      f->tensors[ti].is_parameter = 1;
    return ZCK_OK;
  }
  default: return ZCK_OK;
  }
}

static zck_status resolve_all(zck_torch_file *f) {
  size_t n = zck_pk_doc_node_count(f->doc);
  for (size_t i = 0; i < n; i++) {   /* creation order: arguments before the calls using them */
    const zck_pk *node = zck_pk_doc_node_at(f->doc, i);
    if (node->kind == ZCK_PK_PERSID) ZCK_TRY(resolve_storage(f, node));
    else if (node->kind == ZCK_PK_OBJECT && !node->u.obj.newobj)
      ZCK_TRY(resolve_call(f, node, node->u.obj.callable, node->u.obj.args));
  }
  f->listed = zck__malloc((f->ntensors + 1) * sizeof *f->listed);
  if (!f->listed) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < f->ntensors; i++)
    if (!f->wrapped[i]) f->listed[f->nlisted++] = i;
  return ZCK_OK;
}

// ---- archive

static const uint8_t zck__legacy_magic[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};

static zck_status read_small_entry(zck_torch_file *f, const zck_zip_entry *e, char *buf, size_t cap, size_t *len) {
  if (e->size >= cap) { *len = SIZE_MAX; return ZCK_OK; }
  ZCK_TRY(zck_zip_read_entry(f->zip, e, buf));
  buf[e->size] = 0;
  *len = (size_t)e->size;
  return ZCK_OK;
}

static zck_status check_archive(zck_torch_file *f) {
  const char *nm = f->name;
  size_t n = zck_zip_count(f->zip);
  if (n == 0) return zck__fail(ZCK_ERR_FORMAT, "%s: empty zip archive, not a torch.save file", nm);
  const char *first = zck_zip_entry_at(f->zip, 0)->name;
  const char *slash = strchr(first, '/');
  if (!slash || slash == first)
    return zck__fail(ZCK_ERR_FORMAT, "%s: first archive entry \"%s\" is not in a folder, not a torch.save file", nm, first);
  f->prefix = zck__strndup(first, (size_t)(slash - first));
  if (!f->prefix) return ZCK_ERR_NO_MEMORY;
  size_t pl = strlen(f->prefix);
  for (size_t i = 0; i < n; i++) {
    const char *en = zck_zip_entry_at(f->zip, i)->name;
    if (strncmp(en, f->prefix, pl) || en[pl] != '/')
      return zck__fail(ZCK_ERR_FORMAT, "%s: entry \"%s\" is outside the archive folder \"%s/\"", nm, en, f->prefix);
    if (!strcmp(en + pl + 1, "constants.pkl"))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a TorchScript archive (has constants.pkl), not a torch.save file", nm);
  }
  char path[600], buf[64];
  size_t len;
  snprintf(path, sizeof path, "%s/.data/version", f->prefix);
  const zck_zip_entry *ve = zck_zip_find(f->zip, path);
  if (!ve) {
    snprintf(path, sizeof path, "%s/version", f->prefix);
    ve = zck_zip_find(f->zip, path);
  }
  if (!ve) return zck__fail(ZCK_ERR_FORMAT, "%s: record %s/version is missing", nm, f->prefix);
  ZCK_TRY(read_small_entry(f, ve, buf, sizeof buf, &len));
  if (len == SIZE_MAX) return zck__fail(ZCK_ERR_FORMAT, "%s: %s is %llu bytes, not a version number", nm, path, (unsigned long long)ve->size);
  /* std::stoull: leading blanks, digits, anything after */
  const char *p = buf;
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  unsigned long long ver = 0;
  int digits = 0;
  while (*p >= '0' && *p <= '9' && digits < 19) ver = ver * 10 + (unsigned)(*p++ - '0'), digits++;
  if (!digits) return zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a number", nm, path);
  if (ver < 1 || ver > 10)
    return zck__fail(ZCK_ERR_FORMAT, "%s: file format version %llu is outside the readable range 1..10", nm, ver);
  snprintf(path, sizeof path, "%s/byteorder", f->prefix);
  const zck_zip_entry *be = zck_zip_find(f->zip, path);
  if (be) {
    ZCK_TRY(read_small_entry(f, be, buf, sizeof buf, &len));
    if (len == 3 && !memcmp(buf, "big", 3))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: big-endian torch files are not supported", nm);
    if (len != 6 || memcmp(buf, "little", 6))
      return zck__fail(ZCK_ERR_FORMAT, "%s: byteorder record is not \"little\" or \"big\"", nm);
  }
  return ZCK_OK;
}

static zck_status load_pickle(zck_torch_file *f, const zck_torch_open_opts *o) {
  char path[600];
  snprintf(path, sizeof path, "%s/data.pkl", f->prefix);
  const zck_zip_entry *e = zck_zip_find(f->zip, path);
  if (!e) return zck__fail(ZCK_ERR_FORMAT, "%s: record %s is missing", f->name, path);
  if (e->size > o->max_pickle_bytes)
    return zck__fail(ZCK_ERR_LIMIT, "%s: %s is %llu bytes, over the limit of %llu", f->name, path, (unsigned long long)e->size,
                     (unsigned long long)o->max_pickle_bytes);
  /* read whole, so its CRC is checked: a flipped bit in a pickle can still parse */
  const uint8_t *mem = e->method == 0 ? zck__source_peek(f->src, e->data_offset, e->size) : NULL;
  uint8_t *copy = NULL;
  if (!mem) {
    copy = zck__malloc(e->size ? (size_t)e->size : 1);
    if (!copy) return ZCK_ERR_NO_MEMORY;
    zck_status s = zck_zip_read_entry(f->zip, e, copy);
    if (s != ZCK_OK) { free(copy); return s; }
    mem = copy;
  } else if (zck_crc32(0, mem, (size_t)e->size) != e->crc32) {
    return zck__fail(ZCK_ERR_DAMAGED, "%s: record %s: CRC-32 mismatch (stored %08x, read %08x) [Z-22]", f->name, path,
                     e->crc32, zck_crc32(0, mem, (size_t)e->size));
  }
  char *name = zck__sprintf("%s: %s", f->name, path);
  if (!name) { free(copy); return ZCK_ERR_NO_MEMORY; }
  zck_status s = zck_pickle_load(mem, (size_t)e->size, name, &o->limits, &f->doc);
  free(name);
  free(copy);
  return s;
}

/* Opens f->src (set by the caller) into f. */
static zck_status open_into(zck_torch_file *f, const zck_torch_open_opts *opts) {
  static const zck_torch_open_opts defaults = ZCK_TORCH_OPEN_OPTS_INIT;
  const zck_torch_open_opts *o = opts ? opts : &defaults;
  const zck__source *src = f->src;
  uint8_t head[16] = {0};
  size_t hn = src->size < sizeof head ? (size_t)src->size : sizeof head;
  f->name = src->name;
  ZCK_TRY(zck__source_read(src, head, hn, 0));
  if (hn >= sizeof zck__legacy_magic && !memcmp(head, zck__legacy_magic, sizeof zck__legacy_magic))
    return zck__fail(ZCK_ERR_UNSUPPORTED,
                     "%s: legacy torch serialization (pre-1.6 / non-zip, _use_new_zipfile_serialization=False) not supported; "
                     "re-save it with a current torch.save", src->name);
  if (hn >= 8 && !memcmp(head, "PYTORCH1", 8))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PYTORCH1 (TorchScript preview) file, not a torch.save file", src->name);
  if (hn < 4 || memcmp(head, "PK\x03\x04", 4))
    return zck__fail(ZCK_ERR_FORMAT, "%s: not a torch.save file: does not start with a zip local header", src->name);
  ZCK_TRY(zck_zip_open(src, &f->zip));
  ZCK_TRY(check_archive(f));
  ZCK_TRY(load_pickle(f, o));
  return resolve_all(f);
}

zck_status zck_torch_open_source(const zck__source *src, const zck_torch_open_opts *opts, zck_torch_file **out) {
  *out = NULL;
  zck_torch_file *f = zck__calloc(1, sizeof *f);
  if (!f) return ZCK_ERR_NO_MEMORY;
  f->src = src;
  zck_status s = open_into(f, opts);
  if (s != ZCK_OK) {
    zck_torch_close(f);
    return s;
  }
  *out = f;
  return ZCK_OK;
}

zck_status zck_torch_open(const char *path, const zck_torch_open_opts *opts, zck_torch_file **out) {
  *out = NULL;
  zck_torch_file *f = zck__calloc(1, sizeof *f);
  if (!f) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__source_open(&f->own_src, path);
  if (s != ZCK_OK) {
    free(f);
    return s;
  }
  f->owns_src = true;
  f->src = &f->own_src;
  s = open_into(f, opts);
  if (s != ZCK_OK) {
    zck_torch_close(f);
    return s;
  }
  *out = f;
  return ZCK_OK;
}

void zck_torch_close(zck_torch_file *f) {
  if (!f) return;
  for (size_t i = 0; i < f->ntensors; i++) free((void *)f->tensors[i].shape);
  free(f->tensors);
  free(f->wrapped);
  free(f->listed);
  for (size_t i = 0; i < f->nstorages; i++) {
    free((char *)f->storages[i].key);
    free((char *)f->storages[i].location);
  }
  free(f->storages);
  zck__ptrmap_free(&f->tensor_of);
  zck__ptrmap_free(&f->storage_of);
  free(f->key_slots);
  zck_pk_doc_free(f->doc);
  zck_zip_close(f->zip);
  free(f->prefix);
  if (f->owns_src) zck__source_close(&f->own_src);
  free(f);
}

// ---- accessors

const char *zck_torch_name(const zck_torch_file *f) { return f->name; }
const char *zck_torch_prefix(const zck_torch_file *f) { return f->prefix; }
const zck_pk *zck_torch_root(const zck_torch_file *f) { return zck_pk_doc_root(f->doc); }
const zck_pk_doc *zck_torch_doc(const zck_torch_file *f) { return f->doc; }
const zck_zip *zck_torch_zip(const zck_torch_file *f) { return f->zip; }
const zck__source *zck_torch_source(const zck_torch_file *f) { return f->src; }
size_t zck_torch_storage_count(const zck_torch_file *f) { return f->nstorages; }
const zck_torch_storage *zck_torch_storage_at(const zck_torch_file *f, size_t i) {
  return i < f->nstorages ? &f->storages[i] : NULL;
}
size_t zck_torch_tensor_count(const zck_torch_file *f) { return f->nlisted; }
const zck_torch_tensor *zck_torch_tensor_at(const zck_torch_file *f, size_t i) {
  return i < f->nlisted ? &f->tensors[f->listed[i]] : NULL;
}
const zck_torch_tensor *zck_torch_tensor_of(const zck_torch_file *f, const zck_pk *node) {
  size_t i = node ? zck__ptrmap_get(&f->tensor_of, node) : SIZE_MAX;
  return i == SIZE_MAX ? NULL : &f->tensors[i];
}
const zck_torch_storage *zck_torch_tensor_storage(const zck_torch_file *f, const zck_torch_tensor *t) {
  return &f->storages[t->storage];
}
