/* tensor_set.c: named tensor lists, their readers (torch, safetensors) and writers
 * (safetensors file, HF directory, torch file), each write being one copy plan. */
#include "tensor_set.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "layout.h"
#include "zck.h"
#include "plan.h"
#include "safetensors/safetensors.h"
#include "source.h"
#include "stream_hash.h"
#include "torch/torch.h"

void zck__set_init(zck__tensor_set *s) { memset(s, 0, sizeof *s); }

void zck__set_free(zck__tensor_set *s) {
  if (!s) return;
  for (size_t i = 0; i < s->n; i++) free(s->v[i].name);
  free(s->v);
  for (size_t i = 0; i < s->n_meta; i++) { free(s->meta_keys[i]); free(s->meta_values[i]); }
  free(s->meta_keys);
  free(s->meta_values);
  for (size_t i = 0; i < s->n_warnings; i++) free(s->warnings[i]);
  free(s->warnings);
  for (size_t i = s->n_cleanups; i-- > 0;) s->cleanups[i](s->cleanup_ctx[i]);
  free(s->cleanups);
  free(s->cleanup_ctx);
  memset(s, 0, sizeof *s);
}

zck_status zck__set_add(zck__tensor_set *s, const char *name, zck_dtype dtype, int ndim, const int64_t *shape,
                        zck_store src) {
  if (ndim < 0 || ndim > ZCK_SET_MAX_DIMS)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "tensor %s: %d dimensions (at most %d supported)", name, ndim, ZCK_SET_MAX_DIMS);
  if (s->n == s->cap) {
    size_t cap = s->cap ? s->cap * 2 : 64;
    zck__tensor_entry *v = zck__realloc(s->v, cap * sizeof *v);
    if (!v) return ZCK_ERR_NO_MEMORY;
    s->v = v;
    s->cap = cap;
  }
  zck__tensor_entry *e = &s->v[s->n];
  memset(e, 0, sizeof *e);
  e->name = zck__strdup(name);
  if (!e->name) return ZCK_ERR_NO_MEMORY;
  e->dtype = dtype;
  e->ndim = ndim;
  e->numel = 1;
  for (int d = 0; d < ndim; d++) {
    e->shape[d] = shape[d];
    if (shape[d] < 0 || !zck__mul_u64(e->numel, (uint64_t)shape[d], &e->numel)) {
      free(e->name);
      return zck__fail(ZCK_ERR_FORMAT, "tensor %s: invalid shape", name);
    }
  }
  e->src = src;
  e->alias_of = -1;
  e->tied_to = -1;
  s->n++;
  return ZCK_OK;
}

static zck_status zck__append_str(char ***arr, size_t n, const char *v) {
  char **p = zck__realloc(*arr, (n + 1) * sizeof *p);
  if (!p) return ZCK_ERR_NO_MEMORY;
  *arr = p;
  p[n] = zck__strdup(v);
  return p[n] ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

zck_status zck__set_add_meta(zck__tensor_set *s, const char *key, const char *value) {
  ZCK_TRY(zck__append_str(&s->meta_keys, s->n_meta, key));
  zck_status st = zck__append_str(&s->meta_values, s->n_meta, value);
  if (st != ZCK_OK) { free(s->meta_keys[s->n_meta]); return st; }
  s->n_meta++;
  return ZCK_OK;
}

zck_status zck__set_on_free(zck__tensor_set *s, zck__set_cleanup_fn fn, void *ctx) {
  zck__set_cleanup_fn *f = zck__realloc(s->cleanups, (s->n_cleanups + 1) * sizeof *f);
  if (!f) { fn(ctx); return ZCK_ERR_NO_MEMORY; }
  s->cleanups = f;
  void **c = zck__realloc(s->cleanup_ctx, (s->n_cleanups + 1) * sizeof *c);
  if (!c) { fn(ctx); return ZCK_ERR_NO_MEMORY; }
  s->cleanup_ctx = c;
  f[s->n_cleanups] = fn;
  c[s->n_cleanups] = ctx;
  s->n_cleanups++;
  return ZCK_OK;
}

uint64_t zck__set_out_bytes(const zck__tensor_set *s) {
  uint64_t total = 0;
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i].alias_of < 0) total += s->v[i].numel * zck_dtype_size(zck__entry_out_dtype(&s->v[i]));
  return total;
}

/* ---- reading what a path holds (its kind: source.h) */

static bool zck__is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static bool zck__is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

/* ---- readers */

static void zck__close_torch(void *f) { zck_torch_close(f); }
static void zck__close_hf(void *c) { zck_hf_close(c); }

typedef struct zck__torch_view_ctx {
  const zck_torch_file *file;
  const zck_torch_tensor *t;
} zck__torch_view_ctx;

static zck_status zck__torch_view_read(void *ctx, void *dst, uint64_t off, uint64_t count) {
  zck__torch_view_ctx *c = ctx;
  return zck_torch_tensor_read(c->file, c->t, dst, off, count);
}

static void zck__free_ptr(void *p) { free(p); }

zck_status zck__set_from_torch(zck__tensor_set *s, const char *path) {
  zck_torch_file *f = NULL;
  ZCK_TRY(zck_torch_open(path, NULL, &f));
  ZCK_TRY(zck__set_on_free(s, zck__close_torch, f));
  zck_torch_named *named = NULL;
  size_t count = 0;
  const zck_pk *root = zck_torch_root(f);
  /* HF .bin files are state dicts; DeepSpeed model files keep theirs under "module" */
  const zck_pk *sd = zck_pk_dict_get(root, "module");
  if (!sd || (sd->kind != ZCK_PK_DICT)) sd = zck_pk_dict_get(root, "state_dict");
  if (!sd || (sd->kind != ZCK_PK_DICT)) sd = root;
  ZCK_TRY_CTX(zck_torch_state_dict(f, sd, &named, &count), "%s", path);
  zck_status st = ZCK_OK;
  for (size_t i = 0; i < count && st == ZCK_OK; i++) {
    const zck_torch_tensor *t = named[i].tensor;
    zck_store store;
    if (zck_torch_tensor_contiguous(t)) {
      store = zck_store_source(zck_torch_source(f), zck_torch_tensor_file_offset(f, t), t->dtype, t->numel, path);
      zck_record_check rc;
      if (zck_torch_tensor_record(f, t, &rc)) { /* its zip CRC, checked as the copy reads it */
        const zck_torch_storage *sto = zck_torch_tensor_storage(f, t);
        char *what = zck__sprintf("record data/%s (%s)", sto->key, named[i].name);
        zck_record_check *r = zck__malloc(sizeof *r);
        if (!what || !r || zck__set_on_free(s, zck__free_ptr, what) != ZCK_OK) {
          free(r);
          st = ZCK_ERR_NO_MEMORY;
          break;
        }
        if (zck__set_on_free(s, zck__free_ptr, r) != ZCK_OK) { free(r); st = ZCK_ERR_NO_MEMORY; break; }
        rc.what = what;
        *r = rc;
        store.record = r;
      }
    } else {
      zck__torch_view_ctx *c = zck__malloc(sizeof *c);
      if (!c) { st = ZCK_ERR_NO_MEMORY; break; }
      c->file = f;
      c->t = t;
      st = zck__set_on_free(s, zck__free_ptr, c);
      if (st != ZCK_OK) break;
      store = zck_store_callback(zck__torch_view_read, NULL, c, t->dtype, t->numel, path);
    }
    st = zck__set_add(s, named[i].name, t->dtype, t->ndim, t->shape, store);
  }
  zck_torch_named_free(named, count);
  if (st != ZCK_OK) return zck__error_prepend(st, "%s", path);
  if (s->n == 0) return zck__fail(ZCK_ERR_FORMAT, "%s: holds no tensors", path);
  return ZCK_OK;
}

zck_status zck__set_from_safetensors(zck__tensor_set *s, const char *path) {
  zck_hf_checkpoint *c = NULL;
  ZCK_TRY(zck_hf_open(path, &c));
  ZCK_TRY(zck__set_on_free(s, zck__close_hf, c));
  for (size_t i = 0; i < zck_hf_warning_count(c); i++) {
    ZCK_TRY(zck__append_str(&s->warnings, s->n_warnings, zck_hf_warning_at(c, i)));
    s->n_warnings++;
  }
  for (size_t i = 0; i < zck_hf_count(c); i++) {
    const zck_hf_tensor *ht = zck_hf_tensor_at(c, i);
    const zck_st_tensor *t = ht->t;
    if (t->dtype == ZCK_DTYPE_INVALID)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: tensor %s: dtype %s is not supported", zck_st_path(ht->file), t->name,
                       zck_st_dtype_name(t->st_dtype));
    int64_t shape[ZCK_SET_MAX_DIMS];
    if (t->ndim > ZCK_SET_MAX_DIMS)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: tensor %s: too many dimensions", zck_st_path(ht->file), t->name);
    for (int d = 0; d < t->ndim; d++) shape[d] = (int64_t)t->shape[d];
    zck_store store = zck_store_source(zck_st_source(ht->file), t->offset, t->dtype, t->numel, zck_st_path(ht->file));
    ZCK_TRY(zck__set_add(s, t->name, t->dtype, t->ndim, shape, store));
  }
  if (zck_hf_count(c) == 1 || zck_hf_shard_count(c) == 1) {
    const zck_st_file *f = zck_hf_shard(c, 0);
    for (size_t i = 0; f && i < zck_st_metadata_count(f); i++) {
      const char *k, *v;
      zck_st_metadata_at(f, i, &k, &v);
      if (strcmp(k, "format")) ZCK_TRY(zck__set_add_meta(s, k, v));
    }
  }
  return ZCK_OK;
}

zck_status zck__set_from_path(zck__tensor_set *s, const char *path) {
  switch (zck__src_sniff(path)) {
  case ZCK__SRC_TORCH: return zck__set_from_torch(s, path);
  case ZCK__SRC_SAFETENSORS:
  case ZCK__SRC_HF: return zck__set_from_safetensors(s, path);
  case ZCK__SRC_DEEPSPEED:
  case ZCK__SRC_UNIVERSAL:
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: is a DeepSpeed checkpoint; use 'zckpt consolidate'", path);
  default: break;
  }
  if (!zck__is_file(path) && !zck__is_dir(path)) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no such file or directory", path);
  if (zck__is_file(path)) { /* the sniff could not read it: say why (permission, I/O) rather than "not a ..." */
    zck__source src;
    ZCK_TRY(zck__source_open(&src, path));
    zck__source_close(&src);
  }
  return zck__fail(ZCK_ERR_FORMAT, "%s: not a torch .pt/.bin, safetensors file or checkpoint directory", path);
}

/* ---- the copy: whole tensors to whole tensors */

static zck_status zck__copy_set(const zck__tensor_set *s, const zck_store *dst, uint32_t *crc_out,
                                const zck__write_opts *o, const size_t *order) {
  if (o && o->fill) return o->fill(o->fill_ctx, s, dst, crc_out, order);
  /* entries without a destination (aliases) have nothing to copy */
  /* one whole-tensor store per entry on both sides; aliases have nothing to copy */
  size_t n = s->n ? s->n : 1;
  uint64_t *numel = zck__malloc(n * sizeof *numel);
  uint32_t *owners = zck__malloc(n * sizeof *owners);
  zck_store *src = zck__malloc(n * sizeof *src);
  zck_store *dsts = zck__malloc(n * sizeof *dsts);
  uint32_t *crcs = zck__calloc(n, sizeof *crcs);
  zck_layout *layout = NULL;
  zck_plan *plan = NULL;
  zck_status st = (numel && owners && src && dsts && crcs) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  if (st == ZCK_OK) {
    for (size_t i = 0; i < s->n; i++) numel[i] = s->v[i].numel;
    for (size_t q = 0; q < s->n; q++) { /* stores in output order: the plan copies in that order */
      size_t i = order ? order[q] : q;
      if (dst[i].kind == ZCK_STORE_UNBOUND) continue;
      owners[k] = (uint32_t)i;
      src[k] = s->v[i].src;
      dsts[k] = dst[i];
      k++;
    }
    st = zck_layout_whole(s->n, numel, owners, k, &layout);
  }
  if (st == ZCK_OK) st = zck_plan_build(layout, layout, NULL, &plan);
  if (st == ZCK_OK) {
    zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
    eo.threads = o ? o->threads : 0;
    eo.progress = o ? o->progress : NULL;
    eo.progress_ctx = o ? o->progress_ctx : NULL;
    eo.no_verify = o && o->no_verify;
    st = zck_exec_plan(plan, src, dsts, crc_out ? crcs : NULL, &eo);
  }
  if (st == ZCK_OK && crc_out)
    for (size_t j = 0; j < k; j++) crc_out[owners[j]] = crcs[j];
  zck_plan_free(plan);
  zck_layout_free(layout);
  free(numel);
  free(owners);
  free(src);
  free(dsts);
  free(crcs);
  return st;
}

static zck_status zck__st_dtype(const zck__tensor_entry *e, zck_st_dtype *out) {
  if (zck_st_dtype_from_zck(zck__entry_out_dtype(e), out)) return ZCK_OK;
  bool named = e->src.name && *e->src.name; /* the store's name is the input file */
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s%stensor %s: dtype %s cannot be stored in safetensors", named ? e->src.name : "",
                   named ? ": " : "", e->name, zck_dtype_name(zck__entry_out_dtype(e)));
}

static void zck__shape_u64(const zck__tensor_entry *e, uint64_t *shape) {
  for (int d = 0; d < e->ndim; d++) shape[d] = (uint64_t)e->shape[d];
}

/* Adds every entry that holds data (not aliases) to a safetensors writer; slot[i] is the
 * writer's index of entry i. */
typedef zck_status (*zck__st_add_fn)(void *w, const char *name, zck_st_dtype dtype, int ndim, const uint64_t *shape,
                                     size_t *index);
static zck_status zck__st_file_add(void *w, const char *name, zck_st_dtype dtype, int ndim, const uint64_t *shape,
                                   size_t *index) {
  return zck_st_writer_add(w, name, dtype, ndim, shape, index);
}
static zck_status zck__st_dir_add(void *w, const char *name, zck_st_dtype dtype, int ndim, const uint64_t *shape,
                                  size_t *index) {
  return zck_hf_writer_add(w, name, dtype, ndim, shape, index);
}

static zck_status zck__add_entries(const zck__tensor_set *s, zck__st_add_fn add, void *w, size_t **slot_out) {
  size_t *slot = zck__calloc(s->n ? s->n : 1, sizeof *slot);
  zck_status st = slot ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    zck_st_dtype sd;
    uint64_t shape[ZCK_SET_MAX_DIMS];
    if (s->v[i].alias_of >= 0) continue;
    st = zck__st_dtype(&s->v[i], &sd);
    zck__shape_u64(&s->v[i], shape);
    if (st == ZCK_OK) st = add(w, s->v[i].name, sd, s->v[i].ndim, shape, &slot[i]);
  }
  *slot_out = slot;
  return st;
}

zck_status zck__write_safetensors_file(const zck__tensor_set *s, const char *path, const zck__write_opts *o) {
  zck_st_writer *w = NULL;
  zck_store *dst = NULL;
  zck_status st = zck_st_writer_new(&w);
  for (size_t i = 0; st == ZCK_OK && i < s->n_meta; i++) st = zck_st_writer_set_metadata(w, s->meta_keys[i], s->meta_values[i]);
  size_t *slot = NULL;
  if (st == ZCK_OK) st = zck__add_entries(s, zck__st_file_add, w, &slot);
  if (st == ZCK_OK) st = zck_st_writer_layout(w);
  if (st == ZCK_OK && !(o && o->overwrite) && zck__is_file(path))
    st = zck__fail(ZCK_ERR_EXISTS, "%s: exists (use --overwrite to replace it)", path);
  if (st == ZCK_OK) st = zck_st_writer_open(w, path);
  if (st == ZCK_OK) {
    dst = zck__calloc(s->n ? s->n : 1, sizeof *dst);
    if (!dst) st = ZCK_ERR_NO_MEMORY;
  }
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    if (s->v[i].alias_of >= 0) continue;
    const zck_st_tensor *t = zck_st_writer_tensor(w, slot[i]);
    dst[i] = zck_store_fd(zck_st_writer_fd(w), t->offset, zck__entry_out_dtype(&s->v[i]), s->v[i].numel, path);
  }
  if (st == ZCK_OK) st = zck__copy_set(s, dst, NULL, o, NULL);
  if (st == ZCK_OK) st = zck_st_writer_commit(w);
  free(slot);
  free(dst);
  zck_st_writer_free(w);
  return st;
}

typedef struct zck__hf_pos {
  size_t entry, shard;
  uint64_t offset;
} zck__hf_pos;

static int zck__hf_cmp_pos(const void *a, const void *b) {
  const zck__hf_pos *x = a, *y = b;
  if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return x->entry < y->entry ? -1 : x->entry > y->entry;
}

/* Every entry by where its bytes lie (shard, offset); aliases, which have none, last. */
static size_t *zck__hf_write_order(const zck__tensor_set *s, const zck_hf_writer *w, const size_t *slot) {
  zck__hf_pos *p = zck__malloc((s->n ? s->n : 1) * sizeof *p);
  size_t *order = zck__malloc((s->n ? s->n : 1) * sizeof *order);
  if (!p || !order) {
    free(p);
    free(order);
    return NULL;
  }
  for (size_t i = 0; i < s->n; i++) {
    zck_hf_slot hs = s->v[i].alias_of < 0 ? zck_hf_writer_slot(w, slot[i]) : (zck_hf_slot){SIZE_MAX, -1, 0, 0};
    p[i] = (zck__hf_pos){i, hs.shard, hs.offset};
  }
  qsort(p, s->n, sizeof *p, zck__hf_cmp_pos);
  for (size_t i = 0; i < s->n; i++) order[i] = p[i].entry;
  free(p);
  return order;
}

typedef struct zck__hf_manifest_ctx {
  const zck__write_opts *o;
  zck_hf_writer *w;
} zck__hf_manifest_ctx;

/* The manifest from the hashes the writers made as they wrote: nothing is read back. */
static zck_status zck__manifest_before_commit(void *ctx, const char *tmp_dir) {
  const zck__hf_manifest_ctx *c = ctx;
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.kind = "safetensors";
  mo.threads = c->o->threads;
  return zck__manifest_write_dir_known(tmp_dir, &mo, zck_hf_writer_known(c->w), NULL);
}

zck_status zck__write_safetensors_dir(const zck__tensor_set *s, const char *dir, const zck__write_opts *o,
                                      const char *const *extra_names, const char *const *extra_texts,
                                      size_t n_extra) {
  zck_hf_options ho = ZCK_HF_OPTIONS_INIT;
  ho.max_shard_size = o ? o->max_shard_size : 0;
  ho.overwrite = o ? o->overwrite : false;
  ho.style = ZCK_HF_INDEX_SORTED; /* as transformers' save_pretrained and zero_to_fp32 */
  zck__hf_manifest_ctx mctx = {o, NULL};
  if (o && o->manifest) {
    ho.before_commit = zck__manifest_before_commit;
    ho.before_commit_ctx = &mctx;
  }
  zck_hf_writer *w = NULL;
  zck_store *dst = NULL;
  zck__manifest_known extra = {ZCK_MANIFEST_DEFAULT_CHUNK, NULL, 0, NULL}; /* the files written here */
  size_t cap_extra = 0;
  bool hash = o && o->manifest;
  zck_status st = zck_hf_writer_new(dir, &ho, &w);
  mctx.w = w;
  if (st == ZCK_OK && hash) zck_hf_writer_hash_inline(w);
  for (size_t i = 0; st == ZCK_OK && i < s->n_meta; i++) st = zck_hf_writer_set_metadata(w, s->meta_keys[i], s->meta_values[i]);
  size_t *slot = NULL;
  if (st == ZCK_OK) st = zck__add_entries(s, zck__st_dir_add, w, &slot);
  if (st == ZCK_OK) st = zck_hf_writer_layout(w);
  if (st == ZCK_OK) {
    dst = zck__calloc(s->n ? s->n : 1, sizeof *dst);
    if (!dst) st = ZCK_ERR_NO_MEMORY;
  }
  /* a write error names the shard's destination (DIR/model.safetensors), not the bare
   * shard name, nor the temporary tree it is written in */
  size_t n_shards = st == ZCK_OK ? zck_hf_writer_shard_count(w) : 0;
  char **shard_paths = n_shards ? zck__calloc(n_shards, sizeof *shard_paths) : NULL;
  if (n_shards && !shard_paths) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n_shards; i++)
    if (!(shard_paths[i] = zck__path_join(dir, zck_hf_writer_shard_name(w, i)))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    if (s->v[i].alias_of >= 0) continue;
    zck_hf_slot hs = zck_hf_writer_slot(w, slot[i]);
    dst[i] = zck_hf_writer_store(w, slot[i], zck__entry_out_dtype(&s->v[i]), s->v[i].numel, shard_paths[hs.shard]);
  }
  /* hashed as written: the tensors copied in the order of their bytes in the shards */
  size_t *order = hash && st == ZCK_OK ? zck__hf_write_order(s, w, slot) : NULL;
  if (hash && st == ZCK_OK && !order) st = ZCK_ERR_NO_MEMORY;
  for (size_t q = 0; order && q < s->n; q++) /* the executor runs the copy in that order, across passes */
    if (dst[order[q]].kind != ZCK_STORE_UNBOUND) dst[order[q]].write_order = q + 1;
  if (st == ZCK_OK) st = zck__copy_set(s, dst, NULL, o, order);
  free(order);
  if (st == ZCK_OK && o && o->torch_bin_too) {
    char *p = zck_hf_writer_extra_path(w, "pytorch_model.bin");
    zck__write_opts to = *o;
    to.overwrite = true;
    st = p ? zck__write_torch_file_hashed(s, p, &to, "pytorch_model.bin", hash ? &extra : NULL, &cap_extra)
           : ZCK_ERR_NO_MEMORY;
    free(p);
  }
  for (size_t i = 0; st == ZCK_OK && i < n_extra; i++) {
    char *p = zck_hf_writer_extra_path(w, extra_names[i]);
    zck__outfile f;
    if (!p) { st = ZCK_ERR_NO_MEMORY; break; }
    st = zck__outfile_create(&f, p);
    if (st == ZCK_OK) st = zck__outfile_pwrite(&f, extra_texts[i], strlen(extra_texts[i]), 0);
    if (st == ZCK_OK) st = zck__outfile_commit(&f);
    else zck__outfile_abort(&f);
    if (st == ZCK_OK && hash)
      st = zck__known_bytes(&extra, &cap_extra, p, extra_names[i], extra_texts[i], strlen(extra_texts[i]));
    free(p);
  }
  if (st == ZCK_OK && hash) st = zck_hf_writer_add_known(w, &extra);
  zck__known_free(&extra);
  if (st == ZCK_OK) st = zck_hf_writer_commit(w);
  for (size_t i = 0; i < n_shards && shard_paths; i++) free(shard_paths[i]);
  free(shard_paths);
  free(slot);
  free(dst);
  zck_hf_writer_free(w);
  return st;
}

/* Torch storages are written through the torch writer so it can track them. */
typedef struct zck__torch_dst_ctx {
  zck_torch_writer *w;
  size_t storage;
  size_t elem_size;
  zck__shash *h;              /* the file's manifest hashes, or NULL */
  uint64_t data_off;          /* the storage's offset in the file */
} zck__torch_dst_ctx;

static zck_status zck__torch_dst_write(void *ctx, const void *src, uint64_t off, uint64_t count) {
  zck__torch_dst_ctx *c = ctx;
  ZCK_TRY(zck_torch_writer_write(c->w, c->storage, src, (size_t)(count * c->elem_size), off * c->elem_size));
  zck__shash_feed(c->h, c->data_off + off * c->elem_size, src, count * c->elem_size, NULL);
  return ZCK_OK;
}

zck_status zck__write_torch_file(const zck__tensor_set *s, const char *path, const zck__write_opts *o) {
  return zck__write_torch_file_hashed(s, path, o, NULL, NULL, NULL);
}

zck_status zck__write_torch_file_hashed(const zck__tensor_set *s, const char *path, const zck__write_opts *o,
                                        const char *relpath, zck__manifest_known *known, size_t *cap) {
  if (!(o && o->overwrite) && zck__is_file(path))
    return zck__fail(ZCK_ERR_EXISTS, "%s: exists (use --overwrite to replace it)", path);
  zck__shash *h = NULL;
  zck__shash_budget budget = {0, zck__shash_default_budget()};
  if (known && !(h = zck__shash_new())) return ZCK_ERR_NO_MEMORY;
  zck_torch_writer *w = NULL;
  zck_status cs = zck_torch_writer_create_hashed(path, h, &w);
  if (cs != ZCK_OK) {
    zck__shash_free(h);
    return cs;
  }
  zck_pk_doc *doc = zck_torch_writer_doc(w);
  zck_pk *root = zck_pk_new_dict(doc, 1);
  size_t n = s->n ? s->n : 1;
  zck_store *dst = zck__calloc(n, sizeof *dst);
  zck__torch_dst_ctx *ctx = zck__calloc(n, sizeof *ctx);
  uint32_t *crc = zck__calloc(n, sizeof *crc);
  zck_status st = (root && dst && ctx && crc) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  uint64_t n_stored = 0;
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    const zck__tensor_entry *e = &s->v[i];
    zck_dtype dt = zck__entry_out_dtype(e);
    size_t si;
    uint64_t off = 0;
    if (e->tied_to >= 0) {
      si = ctx[e->tied_to].storage; /* the same storage: torch.load gives tied tensors */
    } else {
      st = zck_torch_writer_add_storage(w, dt, e->numel, &si, &off);
      if (st != ZCK_OK) break;
      zck__shash_cover(h, off, e->numel * zck_dtype_size(dt)); /* the copy writes it whole */
    }
    zck_pk *t = zck_torch_writer_tensor(w, si, e->ndim, e->shape, NULL, 0, 0);
    zck_pk *k = zck_pk_new_str(doc, e->name);
    if (!t || !k || !zck_pk_dict_set(doc, root, k, t)) { st = t ? ZCK_ERR_NO_MEMORY : ZCK_ERR_INTERNAL; break; }
    ctx[i] = (zck__torch_dst_ctx){w, si, zck_dtype_size(dt), h, off};
    if (e->tied_to < 0) dst[i] = zck_store_callback(NULL, zck__torch_dst_write, &ctx[i], dt, e->numel, path);
    if (e->tied_to < 0 && h) dst[i].write_order = ++n_stored; /* storages lie in entry order */
  }
  /* hashed as written: copied in the order of the storages in the file */
  size_t *order = h && st == ZCK_OK ? zck__malloc(n * sizeof *order) : NULL;
  if (h && st == ZCK_OK && !order) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; order && i < s->n; i++) order[i] = i;
  if (st == ZCK_OK) st = zck__shash_start(h, &budget, known ? known->chunk_size : 0);
  if (st == ZCK_OK) st = zck__copy_set(s, dst, crc, o, order);
  free(order);
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++)
    if (s->v[i].tied_to < 0) zck_torch_writer_set_crc(w, ctx[i].storage, crc[i]);
  if (st == ZCK_OK) st = zck_torch_writer_finish(w, root);
  zck_torch_writer_free(w);
  uint64_t reread = 0;
  zck__manifest_known_file kf;
  if (st == ZCK_OK && h) st = zck__shash_finish(h, path, &reread);
  if (st == ZCK_OK && h) st = zck__shash_known_file(h, NULL, &kf);
  if (st == ZCK_OK && h && kf.hashed) st = zck__known_take(known, cap, &kf, relpath);
  zck__shash_free(h);
  free(dst);
  free(ctx);
  free(crc);
  return st;
}
