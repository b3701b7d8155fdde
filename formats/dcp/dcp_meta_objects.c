/* dcp_meta_objects.c: the objects of a DCP .metadata that come once per chunk, read as the
 * pickle VM hands them over (zck_pickle_load_sink) and kept only as the reader's tables:
 * a TensorStorageMetadata (its properties, size and chunks, each chunk a block checked
 * against the others' offsets), a MetadataIndex (fqn interned, offsets) and a _StorageInfo
 * (an item of c->items, its data file named). The VM frees each one's tree once read. */
#include "dcp_meta_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

zck_status zck__dcp_mfail(const mctx *x, zck_status st, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return zck__fail(st, "%s: %s", x->path, msg);
}

// ---- what the stream may hold

zck_status zck__dcp_check_node(mctx *x, const zck_pk *p) {
  if (p->kind == ZCK_PK_PERSID) return MFAIL(ZCK_ERR_FORMAT, "a persistent id, which a metadata pickle never holds");
  if (p->kind == ZCK_PK_GLOBAL && !zck_dcp_global_allowed(p->u.global.module, p->u.global.name))
    return MFAIL(ZCK_ERR_FORMAT, "global %s.%s is not a class of DCP metadata (refused)", p->u.global.module,
                 p->u.global.name);
  /* a path is built from strings, and nothing else is done to it */
  if (p->kind == ZCK_PK_OBJECT && p->u.obj.callable->kind == ZCK_PK_GLOBAL &&
      zck_dcp_is_path_class(p->u.obj.callable->u.global.module, p->u.obj.callable->u.global.name)) {
    const zck_pk *a = p->u.obj.args;
    bool ok = a && a->kind == ZCK_PK_TUPLE && !p->u.obj.state && !p->u.obj.list_items && !p->u.obj.dict_items;
    for (size_t j = 0; ok && j < a->u.seq.len; j++) ok = a->u.seq.items[j]->kind == ZCK_PK_STR;
    if (!ok) return MFAIL(ZCK_ERR_FORMAT, "a pathlib path not built from strings");
  }
  return ZCK_OK;
}

// ---- the allowed classes, in the forms torch writes them

zck_status zck__dcp_dataclass_state(mctx *x, const zck_pk *node, zck_dcp_class cls, const char *where,
                                    const zck_pk **state) {
  *state = NULL;
  if (!node || node->kind != ZCK_PK_OBJECT ||
      !zck_pk_is_global(node->u.obj.callable, zck_dcp_class_module(cls), zck_dcp_class_name(cls)))
    return MFAIL(ZCK_ERR_FORMAT, "%s: expected a %s", where, zck_dcp_class_name(cls));
  if (!node->u.obj.newobj || !node->u.obj.args || node->u.obj.args->kind != ZCK_PK_TUPLE ||
      node->u.obj.args->u.seq.len || node->u.obj.list_items || node->u.obj.dict_items)
    return MFAIL(ZCK_ERR_FORMAT, "%s: a %s not built as torch pickles it", where, zck_dcp_class_name(cls));
  const zck_pk *s = node->u.obj.state;
  if (s && s->kind == ZCK_PK_NONE) s = NULL;
  if (s && s->kind != ZCK_PK_DICT && cls != ZCK_DCP_CLS_TENSOR_PROPERTIES)
    return MFAIL(ZCK_ERR_FORMAT, "%s: the state of a %s is not a dict", where, zck_dcp_class_name(cls));
  *state = s;
  return ZCK_OK;
}

bool zck__dcp_consumed(const zck_pk *node, zck_dcp_class cls) {
  return node && node->kind == ZCK_PK_OBJECT && node->tag == ZCK_PK_TAG_CONSUMED &&
         zck_pk_is_global(node->u.obj.callable, zck_dcp_class_module(cls), zck_dcp_class_name(cls));
}

zck_status zck__dcp_size_of(mctx *x, const zck_pk *node, const char *where, int64_t *v, int *n) {
  if (!node || node->kind != ZCK_PK_TUPLE || node->tag != ZCK_PK_TAG_TORCH_SIZE)
    return MFAIL(ZCK_ERR_FORMAT, "%s: expected a torch.Size", where);
  if (node->u.seq.len > ZCK_MAX_DIMS)
    return MFAIL(ZCK_ERR_LIMIT, "%s: %zu dimensions (at most %d)", where, node->u.seq.len, ZCK_MAX_DIMS);
  for (size_t i = 0; i < node->u.seq.len; i++) {
    const zck_pk *d = node->u.seq.items[i];
    if (d->kind != ZCK_PK_INT || d->u.i < 0) return MFAIL(ZCK_ERR_FORMAT, "%s: dimension %zu is not an int >= 0", where, i);
    v[i] = d->u.i;
  }
  *n = (int)node->u.seq.len;
  return ZCK_OK;
}

/* Room for need elements of *p, doubling, the new ones left untouched: the chunk and item
 * tables grow as the stream comes, and untouched pages of their slack cost no memory
 * until dcp_meta.c gives it back. */
static bool grow_untouched(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  size_t n = *cap ? *cap : 16;
  while (n < need) n *= 2;
  if (n > SIZE_MAX / elem) return false;
  void *q = zck__realloc(*p, n * elem);
  if (!q) return false;
  *p = q;
  *cap = n;
  return true;
}
#define GROW_UNTOUCHED(arr, cap, need) grow_untouched((void **)&(arr), &(cap), (need), sizeof *(arr))

static const char *str_field(const zck_pk *state, const char *name) {
  return zck_pk_as_str(zck_pk_dict_get(state, name));
}

// ---- TensorStorageMetadata

static zck_status tensor_properties(mctx *x, const zck_pk *node, const char *key, zck_dtype *dtype) {
  const zck_pk *st;
  ZCK_TRY(zck__dcp_dataclass_state(x, node, ZCK_DCP_CLS_TENSOR_PROPERTIES, key, &st));
  /* __getstate__: (dtype, layout, requires_grad, memory format, pin_memory[, strides]) */
  if (!st || st->kind != ZCK_PK_TUPLE || (st->u.seq.len != 5 && st->u.seq.len != 6))
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties state is not a 5- or 6-tuple", key);
  const zck_pk *const *f = (const zck_pk *const *)st->u.seq.items;
  if (f[0]->kind != ZCK_PK_GLOBAL || strcmp(f[0]->u.global.module, "torch"))
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties dtype is not a torch dtype", key);
  *dtype = zck_dcp_dtype_of(f[0]->u.global.name);
  if (*dtype == ZCK_DTYPE_INVALID)
    return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: dtype torch.%s is not supported", key, f[0]->u.global.name);
  const zck_pk *lay = f[1];
  if (lay->kind != ZCK_PK_OBJECT || !zck_pk_is_global(lay->u.obj.callable, ZCK_DCP_LAYOUT_MODULE, ZCK_DCP_LAYOUT_NAME) ||
      lay->u.obj.newobj || !lay->u.obj.args || lay->u.obj.args->u.seq.len != 1 ||
      !zck_pk_as_str(lay->u.obj.args->u.seq.items[0]))
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties layout is not a torch layout", key);
  const char *ls = zck_pk_as_str(lay->u.obj.args->u.seq.items[0]);
  if (strcmp(ls, ZCK_DCP_LAYOUT_STRIDED))
    return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: tensor layout %s is not supported (only torch.strided)", key, ls);
  const zck_pk *mf = f[3];
  int64_t enc;
  if (mf->kind != ZCK_PK_OBJECT || !zck_pk_is_global(mf->u.obj.callable, zck_dcp_class_module(ZCK_DCP_CLS_MEM_FORMAT),
                                                     zck_dcp_class_name(ZCK_DCP_CLS_MEM_FORMAT)) ||
      mf->u.obj.newobj || !mf->u.obj.args || mf->u.obj.args->u.seq.len != 1 ||
      !zck_pk_as_int(mf->u.obj.args->u.seq.items[0], &enc) || enc < ZCK_DCP_MEM_CONTIGUOUS || enc > ZCK_DCP_MEM_PRESERVE)
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties memory format is not a _MEM_FORMAT_ENCODING", key);
  if (f[2]->kind != ZCK_PK_BOOL || f[4]->kind != ZCK_PK_BOOL)
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties requires_grad / pin_memory are not bools", key);
  return ZCK_OK;
}

/* Its chunks go to c->chunks (each a block of the tensor's rank, two non-empty ones never
 * starting at the same offsets), the rest to a record; key names it in messages. */
static zck_status read_tensor(mctx *x, const zck_pk *md, const char *key, uint32_t *handle) {
  zck_dcp *c = x->c;
  const zck_pk *st;
  ZCK_TRY(zck__dcp_dataclass_state(x, md, ZCK_DCP_CLS_TENSOR_STORAGE, key, &st));
  if (x->n_tensors >= UINT32_MAX) return MFAIL(ZCK_ERR_LIMIT, "more than %u tensors", UINT32_MAX);
  if (!ZCK__GROW(x->tensors, x->cap_tensors, x->n_tensors + 1)) return ZCK_ERR_NO_MEMORY;
  dcp_tensor_rec *e = &x->tensors[x->n_tensors];
  memset(e, 0, sizeof *e);
  ZCK_TRY(tensor_properties(x, zck_pk_dict_get(st, "properties"), key, &e->dtype));
  ZCK_TRY(zck__dcp_size_of(x, zck_pk_dict_get(st, "size"), key, e->shape, &e->ndim));
  e->numel = 1;
  for (int d = 0; d < e->ndim; d++)
    if (!zck__mul_u64(e->numel, (uint64_t)e->shape[d], &e->numel) || e->numel >> 62)
      return MFAIL(ZCK_ERR_LIMIT, "%s: shape too large", key);
  const zck_pk *chunks = zck_pk_dict_get(st, "chunks");
  if (!chunks || chunks->kind != ZCK_PK_LIST) return MFAIL(ZCK_ERR_FORMAT, "%s: chunks is not a list", key);
  e->first_chunk = c->n_chunks;
  e->n_chunks = chunks->u.seq.len;
  if (!GROW_UNTOUCHED(c->chunks, c->cap_chunks, c->n_chunks + e->n_chunks)) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < e->n_chunks; i++) {
    size_t ci = c->n_chunks;
    zck__dcp_chunk *ch = &c->chunks[ci];
    memset(ch, 0, sizeof *ch);
    ch->item = SIZE_MAX;
    c->n_chunks++;
    const zck_pk *cs;
    char where[96];
    snprintf(where, sizeof where, "%.60s chunk %zu", key, i);
    ZCK_TRY(zck__dcp_dataclass_state(x, chunks->u.seq.items[i], ZCK_DCP_CLS_CHUNK, where, &cs));
    int no, ns;
    ZCK_TRY(zck__dcp_size_of(x, zck_pk_dict_get(cs, "offsets"), where, ch->offsets, &no));
    ZCK_TRY(zck__dcp_size_of(x, zck_pk_dict_get(cs, "sizes"), where, ch->sizes, &ns));
    if (no != e->ndim || ns != e->ndim)
      return MFAIL(ZCK_ERR_FORMAT, "%s: %d offsets and %d sizes for a %d-dimensional tensor", where, no, ns, e->ndim);
    bool dup;
    if (!zck__dcp_table_add(c, &x->chunk_index, e->first_chunk, ci, &dup)) return ZCK_ERR_NO_MEMORY;
    /* empty chunks (ranks past a short dimension: 1 row over 3 ranks) may share their
     * offsets; torch's dedup then saves one item for them */
    bool empty = false;
    for (int d = 0; d < e->ndim; d++) empty |= ch->sizes[d] == 0;
    if (dup && !empty) return MFAIL(ZCK_ERR_FORMAT, "%s: two chunks start at the same offsets", where);
  }
  *handle = (uint32_t)x->n_tensors++;
  return ZCK_OK;
}

// ---- MetadataIndex

static zck_status intern_fqn(mctx *x, const char *fqn, uint32_t *id) {
  size_t i;
  if (zck__strmap_get(&x->fqn_index, fqn, &i)) {
    *id = (uint32_t)i;
    return ZCK_OK;
  }
  if (x->n_fqns >= UINT32_MAX) return MFAIL(ZCK_ERR_LIMIT, "more than %u names", UINT32_MAX);
  if (!ZCK__GROW(x->fqns, x->cap_fqns, x->n_fqns + 1)) return ZCK_ERR_NO_MEMORY;
  char *s = zck__strdup(fqn);
  if (!s) return ZCK_ERR_NO_MEMORY;
  x->fqns[x->n_fqns] = s;
  bool dup;
  size_t prev;
  zck_status st = zck__strmap_put(&x->fqn_index, s, x->n_fqns, &dup, &prev);
  if (st) {
    free(s);
    return st;
  }
  *id = (uint32_t)x->n_fqns++;
  return ZCK_OK;
}

static zck_status read_index(mctx *x, const zck_pk *kn, uint32_t *handle) {
  const zck_pk *ks;
  ZCK_TRY(zck__dcp_dataclass_state(x, kn, ZCK_DCP_CLS_METADATA_INDEX, "storage_data key", &ks));
  const char *fqn = str_field(ks, "fqn");
  if (!fqn) return MFAIL(ZCK_ERR_FORMAT, "storage_data: a MetadataIndex without fqn");
  if (x->n_indexes >= UINT32_MAX) return MFAIL(ZCK_ERR_LIMIT, "more than %u storage items", UINT32_MAX);
  if (!GROW_UNTOUCHED(x->indexes, x->cap_indexes, x->n_indexes + 1)) return ZCK_ERR_NO_MEMORY;
  dcp_index_rec *r = &x->indexes[x->n_indexes];
  memset(r, 0, sizeof *r);
  ZCK_TRY(intern_fqn(x, fqn, &r->fqn));
  const zck_pk *on = zck_pk_dict_get(ks, "offset");
  if (!on || on->kind == ZCK_PK_NONE) r->ndim = INDEX_NO_OFFSET;
  else if (on->kind != ZCK_PK_TUPLE || on->tag != ZCK_PK_TAG_TORCH_SIZE) r->ndim = INDEX_BAD_OFFSET;
  else {
    int64_t o[ZCK_MAX_DIMS];
    int no;
    ZCK_TRY(zck__dcp_size_of(x, on, fqn, o, &no));
    if (!ZCK__GROW(x->offsets, x->cap_offsets, x->n_offsets + (size_t)no)) return ZCK_ERR_NO_MEMORY;
    r->offsets = x->n_offsets;
    r->ndim = no;
    if (no) memcpy(x->offsets + x->n_offsets, o, (size_t)no * sizeof *o); /* a 0-d tensor: none, and maybe no array yet */
    x->n_offsets += (size_t)no;
  }
  *handle = (uint32_t)x->n_indexes++;
  return ZCK_OK;
}

// ---- _StorageInfo

static bool plain_file_name(const char *s) {
  return *s && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") && strcmp(s, "..");
}

/* The index of the data file rel of the folder, registered on first sight. */
static zck_status data_file(mctx *x, const char *rel, size_t *fi) {
  zck_dcp *c = x->c;
  char *fpath = zck__path_join(x->dir, rel);
  if (!fpath) return ZCK_ERR_NO_MEMORY;
  if (zck__strmap_get(&c->file_index, fpath, fi)) {
    free(fpath);
    return ZCK_OK;
  }
  if (!ZCK__GROW(c->files, c->cap_files, c->n_files + 1)) {
    free(fpath);
    return ZCK_ERR_NO_MEMORY;
  }
  *fi = c->n_files;
  zck__dcp_file *f = &c->files[*fi];
  memset(f, 0, sizeof *f);
  f->src.fd = -1;
  f->name = zck__strdup(rel);
  f->path = fpath;
  c->n_files++;
  if (!f->name) return ZCK_ERR_NO_MEMORY;
  bool dup;
  size_t prev;
  return zck__strmap_put(&c->file_index, f->path, *fi, &dup, &prev);
}

/* An item of c->items, not yet given its entry (storage_data pairs it with its key). fqn:
 * the key it is set under, for messages. */
static zck_status read_storage_info(mctx *x, const zck_pk *vn, const char *fqn, uint32_t *handle) {
  zck_dcp *c = x->c;
  const zck_pk *vs;
  ZCK_TRY(zck__dcp_dataclass_state(x, vn, ZCK_DCP_CLS_STORAGE_INFO, fqn, &vs));
  const char *rel = str_field(vs, "relative_path");
  int64_t off, len;
  if (!rel || !zck_pk_as_int(zck_pk_dict_get(vs, "offset"), &off) || !zck_pk_as_int(zck_pk_dict_get(vs, "length"), &len) ||
      off < 0 || len < 0)
    return MFAIL(ZCK_ERR_FORMAT, "%s: storage info without a relative_path, offset >= 0 and length >= 0", fqn);
  if (!plain_file_name(rel)) return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: data file '%.200s' is not a file of the folder", fqn, rel);
  const zck_pk *td = zck_pk_dict_get(vs, "transform_descriptors");
  if (td && td->kind != ZCK_PK_NONE) {
    if ((td->kind != ZCK_PK_LIST && td->kind != ZCK_PK_TUPLE))
      return MFAIL(ZCK_ERR_FORMAT, "%s: transform_descriptors is not a list", fqn);
    if (td->u.seq.len) {
      const char *d = zck_pk_as_str(td->u.seq.items[0]);
      return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: unknown transform descriptor '%.100s' (compressed or transformed items are not read)",
                   fqn, d ? d : "?");
    }
  }
  if (c->n_items - x->item_base >= UINT32_MAX) return MFAIL(ZCK_ERR_LIMIT, "more than %u storage items", UINT32_MAX);
  size_t fi;
  ZCK_TRY(data_file(x, rel, &fi));
  if (!GROW_UNTOUCHED(c->items, c->cap_items, c->n_items + 1)) return ZCK_ERR_NO_MEMORY;
  zck__dcp_item *it = &c->items[c->n_items];
  memset(it, 0, sizeof *it);
  it->win.fd = -1;
  it->entry = SIZE_MAX;
  it->chunk = SIZE_MAX;
  it->file = fi;
  it->off = (uint64_t)off;
  it->len = (uint64_t)len;
  *handle = (uint32_t)(c->n_items++ - x->item_base);
  return ZCK_OK;
}

// ---- the sink

static int sink_classify(void *ctx, const char *module, const char *name) {
  (void)ctx;
  int cls = zck_dcp_class_of(module, name);
  return cls == ZCK_DCP_CLS_TENSOR_STORAGE || cls == ZCK_DCP_CLS_METADATA_INDEX || cls == ZCK_DCP_CLS_STORAGE_INFO ? cls : -1;
}

static zck_status sink_check(void *ctx, const zck_pk *node) { return zck__dcp_check_node(ctx, node); }

/* below: what torch pickles just before the object, the key it is stored under. */
static zck_status sink_consume(void *ctx, int cls, const zck_pk *obj, const zck_pk *below, uint32_t *handle) {
  mctx *x = ctx;
  switch (cls) {
  case ZCK_DCP_CLS_TENSOR_STORAGE:
    return read_tensor(x, obj, below && below->kind == ZCK_PK_STR ? below->u.str.data : "a state_dict_metadata entry", handle);
  case ZCK_DCP_CLS_METADATA_INDEX:
    return read_index(x, obj, handle);
  default: {
    const char *fqn = zck__dcp_consumed(below, ZCK_DCP_CLS_METADATA_INDEX) && below->u.obj.sink_handle < x->n_indexes
                          ? x->fqns[x->indexes[below->u.obj.sink_handle].fqn]
                          : "a storage_data item";
    return read_storage_info(x, obj, fqn, handle);
  }
  }
}

zck_pk_sink zck__dcp_meta_sink_of(mctx *x) { return (zck_pk_sink){x, sink_classify, sink_check, sink_consume, zck__dcp_meta_passed}; }
