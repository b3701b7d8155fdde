/* tensor_set.c: named tensor lists and their readers (torch, safetensors); their outputs
 * are set_target.c's. */
#include "tensor_set.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "zck.h"
#include "safetensors/safetensors.h"
#include "source.h"
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
  ZCK_TRY(zck__src_refuse_known(path));
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
