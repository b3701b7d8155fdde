/* dcp_write_meta.c: the .metadata file of a DCP checkpoint the writer laid out: a pickle
 * of torch.distributed.checkpoint.metadata.Metadata as torch 2.15's FileSystemWriter
 * pickles it and its FileSystemReader unpickles it (plain pickle.load):
 *   Metadata(state_dict_metadata = {key: TensorStorageMetadata(TensorProperties(dtype,
 *              strided, False, contiguous, False, strides), Size, [ChunkStorageMetadata(
 *              offsets, sizes)]) | BytesStorageMetadata()},
 *            planner_data = {key: (path in the nested state dict)},
 *            storage_data = {MetadataIndex(key, offsets, index): _StorageInfo(
 *              relative_path, offset, length)},
 *            storage_meta = StorageMeta(None, save_id, None, []), version = "1.0.0")
 * spelled by the rules in dcp_format.h (classes, dtype and layout globals, keys). An empty
 * BytesStorageMetadata has no BUILD state, as CPython pickles a dataclass without fields. */
#include "dcp_write_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


typedef struct zck__meta {
  zck_pk_doc *d;
  bool oom;
  zck_pk *g_tsm, *g_tp, *g_chunk, *g_bytes, *g_index, *g_info, *g_enc, *g_strided, *contig;
  zck_pk *s_model, *s_optim, *s_state, *s_groups;
  zck_pk *s_files[64];          /* relative_path of the first 64 files, one node each */
  /* attribute names, one node each (a literal's address is its key): CPython interns
   * them, so its pickle memoizes them, and so does ours */
  const char *attr_lit[24];
  zck_pk *attr_node[24];
  size_t n_attr;
} zck__meta;

static zck_pk *zck__ok(zck__meta *x, zck_pk *n) {
  if (!n) x->oom = true;
  return n;
}

static zck_pk *zck__str(zck__meta *x, const char *s) { return zck__ok(x, zck_pk_new_str(x->d, s)); }
static zck_pk *zck__int(zck__meta *x, int64_t v) { return zck__ok(x, zck_pk_new_int(x->d, v)); }

static zck_pk *zck__attr(zck__meta *x, const char *lit) {
  for (size_t i = 0; i < x->n_attr; i++)
    if (x->attr_lit[i] == lit) return x->attr_node[i];
  zck_pk *n = zck__str(x, lit);
  if (n && x->n_attr < sizeof x->attr_lit / sizeof *x->attr_lit) {
    x->attr_lit[x->n_attr] = lit;
    x->attr_node[x->n_attr++] = n;
  }
  return n;
}

/* dict[key] = v; key a string literal (an attribute name). */
static void zck__set(zck__meta *x, zck_pk *dict, const char *key, zck_pk *v) {
  if (!dict || !v || !zck_pk_dict_set(x->d, dict, zck__attr(x, key), v)) x->oom = true;
}

/* cls() with state as its BUILD argument (NULL: none), as protocol 2 pickles a dataclass. */
static zck_pk *zck__newobj(zck__meta *x, zck_pk *cls, zck_pk *state) {
  zck_pk *args = zck__ok(x, zck_pk_new_tuple(x->d, 0));
  return (cls && args) ? zck__ok(x, zck_pk_new_object(x->d, cls, args, 1, state)) : NULL;
}

static zck_pk *zck__class(zck__meta *x, zck_dcp_class c) {
  return zck__ok(x, zck_pk_new_global(x->d, zck_dcp_class_module(c), zck_dcp_class_name(c)));
}

static zck_pk *zck__size(zck__meta *x, int n, const int64_t *v) {
  zck_pk *t = zck__ok(x, zck_pk_new_tuple(x->d, (size_t)n));
  if (!t) return NULL;
  t->tag = ZCK_PK_TAG_TORCH_SIZE;
  for (int i = 0; i < n; i++) t->u.seq.items[i] = zck__int(x, v[i]);
  return t;
}

static zck_pk *zck__properties(zck__meta *x, const zck__dcp_entry *e) {
  zck_pk *st = zck__ok(x, zck_pk_new_tuple(x->d, 6)), *strides = zck__ok(x, zck_pk_new_tuple(x->d, (size_t)e->ndim));
  if (!st || !strides) return NULL;
  int64_t acc = 1;
  for (int i = e->ndim - 1; i >= 0; i--) {
    strides->u.seq.items[i] = zck__int(x, acc);
    if (e->shape[i] > 1) acc *= e->shape[i];
  }
  const char *dt = zck_dcp_dtype_name(e->dtype);
  st->u.seq.items[0] = dt ? zck__ok(x, zck_pk_new_global(x->d, "torch", dt)) : NULL;
  if (!dt) x->oom = true; /* dtypes come from the manifest, which has torch's */
  st->u.seq.items[1] = x->g_strided;
  st->u.seq.items[2] = zck__ok(x, zck_pk_new_bool(x->d, 0));
  st->u.seq.items[3] = x->contig;
  st->u.seq.items[4] = zck__ok(x, zck_pk_new_bool(x->d, 0));
  st->u.seq.items[5] = strides;
  return zck__newobj(x, x->g_tp, st);
}

/* The chunk's offsets and sizes: dim 0 from the chunk, the other dims whole. */
static void zck__chunk_dims(const zck__dcp_entry *e, const zck__dcp_chunk *c, int64_t *off, int64_t *sz) {
  for (int i = 0; i < e->ndim; i++) {
    off[i] = i ? 0 : c->row0;
    sz[i] = i ? e->shape[i] : c->rows;
  }
}

static zck_pk *zck__tensor_meta(zck__meta *x, const zck_dcp_writer *w, const zck__dcp_entry *e) {
  zck_pk *st = zck__ok(x, zck_pk_new_dict(x->d, 0)), *chunks = zck__ok(x, zck_pk_new_list(x->d));
  for (uint32_t k = 0; st && chunks && k < e->n_chunks; k++) {
    int64_t off[ZCK_MAX_DIMS], sz[ZCK_MAX_DIMS];
    zck__chunk_dims(e, &w->chunks[e->chunk0 + k], off, sz);
    zck_pk *cs = zck__ok(x, zck_pk_new_dict(x->d, 0));
    zck__set(x, cs, "offsets", zck__size(x, e->ndim, off));
    zck__set(x, cs, "sizes", zck__size(x, e->ndim, sz));
    zck_pk *c = zck__newobj(x, x->g_chunk, cs);
    if (!c || !zck_pk_append(x->d, chunks, c)) x->oom = true;
  }
  zck__set(x, st, "properties", zck__properties(x, e));
  zck__set(x, st, "size", zck__size(x, e->ndim, e->shape));
  zck__set(x, st, "chunks", chunks);
  return zck__newobj(x, x->g_tsm, st);
}

/* Where the key sits in the nested state dict {"model": ..., "<optim_root>": ...}. */
static zck_pk *zck__planner_path(zck__meta *x, const zck__dcp_entry *e) {
  zck_pk *t;
  switch (e->kind) {
  case ZCK__DCP_MODEL:
    if ((t = zck__ok(x, zck_pk_new_tuple(x->d, 2)))) t->u.seq.items[0] = x->s_model, t->u.seq.items[1] = zck__str(x, e->name);
    return t;
  case ZCK__DCP_STATE:
    if ((t = zck__ok(x, zck_pk_new_tuple(x->d, 4)))) {
      t->u.seq.items[0] = x->s_optim;
      t->u.seq.items[1] = x->s_state;
      t->u.seq.items[2] = zck__str(x, e->name);
      t->u.seq.items[3] = zck__str(x, e->sub);
    }
    return t;
  default:
    if ((t = zck__ok(x, zck_pk_new_tuple(x->d, 4)))) {
      t->u.seq.items[0] = x->s_optim;
      t->u.seq.items[1] = x->s_groups;
      t->u.seq.items[2] = zck__int(x, e->group);
      t->u.seq.items[3] = zck__str(x, e->name);
    }
    return t;
  }
}

static void zck__storage_entry(zck__meta *x, const zck_dcp_writer *w, zck_pk *storage, zck_pk *key, const zck__dcp_entry *e,
                               uint32_t k) {
  const zck__dcp_chunk *c = &w->chunks[e->chunk0 + k];
  zck_pk *ix = zck__ok(x, zck_pk_new_dict(x->d, 0)), *info = zck__ok(x, zck_pk_new_dict(x->d, 0));
  zck__set(x, ix, "fqn", key);
  if (e->is_bytes) {
    zck__set(x, ix, "offset", zck__ok(x, zck_pk_new_none(x->d)));
    zck__set(x, ix, "index", zck__ok(x, zck_pk_new_none(x->d)));
  } else {
    int64_t off[ZCK_MAX_DIMS], sz[ZCK_MAX_DIMS];
    zck__chunk_dims(e, c, off, sz);
    zck__set(x, ix, "offset", zck__size(x, e->ndim, off));
    zck__set(x, ix, "index", zck__int(x, k));
  }
  char path[48];
  zck_dcp_data_file_name(c->file, 0, path, sizeof path);
  zck_pk *rel = c->file < 64 ? x->s_files[c->file] : NULL;
  if (!rel && (rel = zck__str(x, path)) && c->file < 64) x->s_files[c->file] = rel;
  zck__set(x, info, "relative_path", rel);
  zck__set(x, info, "offset", zck__int(x, (int64_t)c->off));
  zck__set(x, info, "length", zck__int(x, (int64_t)c->len));
  zck_pk *kobj = zck__newobj(x, x->g_index, ix), *vobj = zck__newobj(x, x->g_info, info);
  if (!kobj || !vobj || !zck_pk_dict_set(x->d, storage, kobj, vobj)) x->oom = true;
}

static zck_pk *zck__metadata_tree(zck__meta *x, const zck_dcp_writer *w) {
  zck_pk_doc *d = x->d;
  x->g_tsm = zck__class(x, ZCK_DCP_CLS_TENSOR_STORAGE);
  x->g_tp = zck__class(x, ZCK_DCP_CLS_TENSOR_PROPERTIES);
  x->g_chunk = zck__class(x, ZCK_DCP_CLS_CHUNK);
  x->g_bytes = zck__class(x, ZCK_DCP_CLS_BYTES_STORAGE);
  x->g_index = zck__class(x, ZCK_DCP_CLS_METADATA_INDEX);
  x->g_info = zck__class(x, ZCK_DCP_CLS_STORAGE_INFO);
  x->g_enc = zck__class(x, ZCK_DCP_CLS_MEM_FORMAT);
  /* torch.serialization._get_layout("torch.strided"): how a torch.layout pickles */
  zck_pk *lay = zck_pk_new_tuple(d, 1);
  if (lay) lay->u.seq.items[0] = zck__str(x, ZCK_DCP_LAYOUT_STRIDED);
  zck_pk *get_layout = zck__ok(x, zck_pk_new_global(d, ZCK_DCP_LAYOUT_MODULE, ZCK_DCP_LAYOUT_NAME));
  x->g_strided = (lay && get_layout) ? zck__ok(x, zck_pk_new_object(d, get_layout, lay, 0, NULL)) : NULL;
  zck_pk *zero = zck_pk_new_tuple(d, 1); /* _MEM_FORMAT_ENCODING(TORCH_CONTIGUOUS_FORMAT) */
  if (zero) zero->u.seq.items[0] = zck__int(x, ZCK_DCP_MEM_CONTIGUOUS);
  x->contig = (zero && x->g_enc) ? zck__ok(x, zck_pk_new_object(d, x->g_enc, zero, 0, NULL)) : NULL;
  x->s_model = zck__str(x, "model");
  x->s_optim = zck__str(x, w->o.optim_root);
  x->s_state = zck__str(x, "state");
  x->s_groups = zck__str(x, "param_groups");
  if (x->oom) return NULL;

  zck_pk *sdm = zck__ok(x, zck_pk_new_dict(d, 0)), *planner = zck__ok(x, zck_pk_new_dict(d, 0));
  zck_pk *storage = zck__ok(x, zck_pk_new_dict(d, 0));
  for (size_t i = 0; !x->oom && i < w->n_entries; i++) {
    const zck__dcp_entry *e = &w->entries[i];
    char *k = zck__dcp_key(w, e);
    zck_pk *key = k ? zck__str(x, k) : NULL;
    free(k);
    if (!key) {
      x->oom = true;
      break;
    }
    zck_pk *meta = e->is_bytes ? zck__newobj(x, x->g_bytes, NULL) : zck__tensor_meta(x, w, e);
    if (!meta || !zck_pk_dict_set(d, sdm, key, meta)) x->oom = true;
    zck_pk *path = zck__planner_path(x, e);
    if (!path || !zck_pk_dict_set(d, planner, key, path)) x->oom = true;
    for (uint32_t c = 0; !x->oom && c < e->n_chunks; c++) zck__storage_entry(x, w, storage, key, e, c);
  }
  zck_pk *sm = zck__ok(x, zck_pk_new_dict(d, 0));
  zck__set(x, sm, "checkpoint_id", zck__ok(x, zck_pk_new_none(d)));
  zck__set(x, sm, "save_id", zck__str(x, w->save_id));
  zck__set(x, sm, "load_id", zck__ok(x, zck_pk_new_none(d)));
  zck__set(x, sm, "modules", zck__ok(x, zck_pk_new_list(d)));
  zck_pk *st = zck__ok(x, zck_pk_new_dict(d, 0));
  zck__set(x, st, "state_dict_metadata", sdm);
  zck__set(x, st, "planner_data", planner);
  zck__set(x, st, "storage_data", storage);
  zck__set(x, st, "storage_meta", zck__newobj(x, zck__class(x, ZCK_DCP_CLS_STORAGE_META), sm));
  zck__set(x, st, "version", zck__str(x, ZCK_DCP_VERSION));
  zck_pk *root = zck__newobj(x, zck__class(x, ZCK_DCP_CLS_METADATA), st);
  return x->oom ? NULL : root;
}

zck_status zck__dcp_write_metadata(const zck_dcp_writer *w) {
  zck__meta x;
  memset(&x, 0, sizeof x);
  if (!(x.d = zck_pk_doc_new())) return ZCK_ERR_NO_MEMORY;
  zck_pk *root = zck__metadata_tree(&x, w);
  zck__buf buf;
  zck__buf_init(&buf);
  zck_status st = root ? zck_pickle_dump(root, &buf) : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK && buf.failed) st = ZCK_ERR_NO_MEMORY;
  zck_pk_doc_free(x.d);
  char *path = st == ZCK_OK ? zck__path_join(w->dir, ZCK_DCP_METADATA_FILE) : NULL;
  if (st == ZCK_OK && !path) st = ZCK_ERR_NO_MEMORY;
  zck__outfile f;
  memset(&f, 0, sizeof f);
  f.fd = -1;
  bool created = false;
  if (st == ZCK_OK) created = (st = zck__outfile_create(&f, path)) == ZCK_OK;
  if (st == ZCK_OK && buf.len) st = zck__outfile_pwrite(&f, buf.data, buf.len, 0);
  if (st == ZCK_OK) st = zck__outfile_commit(&f);
  else if (created) zck__outfile_abort(&f);
  free(path);
  zck__buf_free(&buf);
  return st;
}
