/* manifest_write.c: describing an output directory into a manifest and writing it.
 *
 * lib/manifest knows no format; here the readers say where each tensor's bytes are: a
 * torch .pt/.bin file (every tensor of its pickle, named by its path through dicts and
 * lists, "optimizer_state_dict.state.0.exp_avg"), a safetensors file (every header entry).
 * Other files are listed with their size and hash only. A DeepSpeed tag folder (or a
 * universal folder) also gets its layout, from its reader, which validates the whole file
 * set on the way: a manifest is never written for a checkpoint zckpt cannot read back.
 * Files are described in parallel (pickles of many ranks) and hashed in parallel; a writer
 * that hashed its files as it wrote them (zck__manifest_write_dir_known) spares the read.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "deepspeed/deepspeed.h"
#include "manifest.h"
#include "stream_hash.h"
#include "strmap.h"
#include "safetensors/safetensors.h"
#include "threadpool.h"
#include "torch/torch.h"
#include "universal/universal.h"
#include "zck.h"
#include "dist.h"

typedef struct desc_file {
  const char *rel;
  char *full;
  zck__manifest_known_tensor *t; /* its tensors, one allocation (a file may list 100k) */
  size_t n;
  const zck__manifest_known_file *kf; /* its writer's hashes (and tensors), or NULL */
} desc_file;

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !memcmp(s + n - m, suffix, m);
}

static bool is_zip_file(const char *path) {
  zck__source src;
  if (zck__source_open(&src, path) != ZCK_OK) { zck_clear_error(); return false; }
  uint8_t head[4] = {0};
  bool zip = src.size >= 4 && zck__source_read(&src, head, 4, 0) == ZCK_OK && !memcmp(head, "PK\3\4", 4);
  zck__source_close(&src);
  zck_clear_error();
  return zip;
}

/* Bytes a tensor spans in its storage, from element 0 to its last element. */
static uint64_t tensor_span(const zck_torch_tensor *t) {
  size_t es = zck_dtype_size(t->dtype);
  if (!t->numel) return 0;
  uint64_t last = 0;
  for (int d = 0; d < t->ndim; d++) last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->stride[d];
  return (last + 1) * es; /* fits: the reader checked the view against its storage (G-04, G-05) */
}

/* A list of n tensors in one allocation: the entries, then their shapes (n_dims int64s
 * in all), then their names (name_bytes with their NULs). Filled by list_put in order. */
typedef struct tensor_list {
  zck__manifest_known_tensor *t;
  int64_t *shapes;
  char *names;
  size_t n;
} tensor_list;

static zck_status list_alloc(tensor_list *l, size_t n, size_t n_dims, size_t name_bytes) {
  size_t a = n * sizeof *l->t, b = n_dims * sizeof *l->shapes;
  if (n > SIZE_MAX / 2 / sizeof *l->t || n_dims > SIZE_MAX / 4 / sizeof *l->shapes || name_bytes > SIZE_MAX / 4)
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  char *p = zck__malloc(a + b + name_bytes ? a + b + name_bytes : 1);
  if (!p) return ZCK_ERR_NO_MEMORY;
  *l = (tensor_list){(zck__manifest_known_tensor *)(void *)p, (int64_t *)(void *)(p + a), p + a + b, 0};
  return ZCK_OK;
}

static void list_put(tensor_list *l, const char *name, const char *dtype, int ndim, const int64_t *shape, uint64_t off,
                     uint64_t nbytes) {
  size_t len = strlen(name) + 1;
  memcpy(l->names, name, len);
  if (ndim) memcpy(l->shapes, shape, (size_t)ndim * sizeof *shape);
  l->t[l->n++] = (zck__manifest_known_tensor){l->names, dtype, ndim, l->shapes, off, nbytes};
  l->names += len;
  l->shapes += ndim;
}

typedef struct tensor_ptr {
  const zck_torch_tensor *t;
  size_t index;
} tensor_ptr;

static int cmp_tensor_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const tensor_ptr *)a)->t, y = (uintptr_t)((const tensor_ptr *)b)->t;
  return x < y ? -1 : x > y;
}

zck_status zck__manifest_torch_tensors(const zck_torch_file *tf, zck__manifest_known_tensor **out, size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  size_t count = 0, nt = zck_torch_tensor_count(tf);
  zck_torch_named *named = NULL;
  uint8_t *listed = zck__calloc(nt ? nt : 1, 1);
  tensor_ptr *by_ptr = zck__malloc((nt ? nt : 1) * sizeof *by_ptr);
  zck_status st = listed && by_ptr ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t k = 0; st == ZCK_OK && k < nt; k++) by_ptr[k] = (tensor_ptr){zck_torch_tensor_at(tf, k), k};
  if (st == ZCK_OK) qsort(by_ptr, nt, sizeof *by_ptr, cmp_tensor_ptr);
  /* names through dicts and lists; a file whose names collide falls back to indices */
  if (st == ZCK_OK && zck_torch_state_dict(tf, zck_torch_root(tf), &named, &count) != ZCK_OK) {
    zck_clear_error();
    named = NULL;
    count = 0;
  }
  /* sized first: the named ones, then those not reachable by name (inside objects) */
  size_t n = count, n_dims = 0, name_bytes = 0;
  for (size_t i = 0; st == ZCK_OK && i < count; i++) {
    const zck_torch_tensor *t = named[i].tensor;
    tensor_ptr key = {t, 0};
    const tensor_ptr *hit = bsearch(&key, by_ptr, nt, sizeof *by_ptr, cmp_tensor_ptr);
    if (hit) listed[hit->index] = 1;
    n_dims += (size_t)t->ndim;
    name_bytes += strlen(named[i].name) + 1;
  }
  for (size_t k = 0; st == ZCK_OK && k < nt; k++)
    if (!listed[k]) {
      n++;
      n_dims += (size_t)zck_torch_tensor_at(tf, k)->ndim;
      name_bytes += 40;
    }
  tensor_list l = {0};
  if (st == ZCK_OK) st = list_alloc(&l, n, n_dims, name_bytes);
  for (size_t i = 0; st == ZCK_OK && i < count; i++) {
    const zck_torch_tensor *t = named[i].tensor;
    list_put(&l, named[i].name, zck_dtype_name(t->dtype), t->ndim, t->shape, zck_torch_tensor_file_offset(tf, t),
             tensor_span(t));
  }
  for (size_t k = 0; st == ZCK_OK && k < nt; k++) {
    if (listed[k]) continue;
    const zck_torch_tensor *t = zck_torch_tensor_at(tf, k);
    char name[40];
    snprintf(name, sizeof name, "<tensor %zu>", k);
    list_put(&l, name, zck_dtype_name(t->dtype), t->ndim, t->shape, zck_torch_tensor_file_offset(tf, t), tensor_span(t));
  }
  zck_torch_named_free(named, count);
  free(listed);
  free(by_ptr);
  if (st != ZCK_OK) return st;
  *out = l.t;
  *n_out = l.n;
  return ZCK_OK;
}

static zck_status describe_torch(desc_file *f) {
  zck_torch_file *tf = NULL;
  ZCK_TRY(zck_torch_open(f->full, NULL, &tf));
  zck_status st = zck__manifest_torch_tensors(tf, &f->t, &f->n);
  zck_torch_close(tf);
  return st;
}

static zck_status describe_safetensors(desc_file *f) {
  zck_st_file *sf = NULL;
  ZCK_TRY(zck_st_open(f->full, &sf));
  size_t n = zck_st_count(sf), n_dims = 0, name_bytes = 0;
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck_st_tensor *t = zck_st_tensor_at(sf, i);
    if (t->ndim > ZCK_MANIFEST_MAX_DIMS) {
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: tensor %s: %d dims", f->full, t->name, t->ndim);
      break;
    }
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] > (uint64_t)INT64_MAX) st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: tensor %s: dim too large", f->full, t->name);
    n_dims += (size_t)t->ndim;
    name_bytes += strlen(t->name) + 1;
  }
  tensor_list l = {0};
  if (st == ZCK_OK) st = list_alloc(&l, n, n_dims, name_bytes);
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck_st_tensor *t = zck_st_tensor_at(sf, i);
    int64_t shape[ZCK_MANIFEST_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) shape[d] = (int64_t)t->shape[d];
    const char *dtype = t->dtype != ZCK_DTYPE_INVALID ? zck_dtype_name(t->dtype) : zck_st_dtype_name(t->st_dtype);
    list_put(&l, t->name, dtype, t->ndim, shape, t->offset, t->nbytes);
  }
  zck_st_close(sf);
  if (st != ZCK_OK) return st;
  f->t = l.t;
  f->n = l.n;
  return ZCK_OK;
}

static zck_status describe_item(void *ctx, size_t item, unsigned thread) {
  desc_file *f = &((desc_file *)ctx)[item];
  if (f->kf && f->kf->described) return ZCK_OK; /* its writer said what it holds */
  if (ends_with(f->rel, ".safetensors")) return describe_safetensors(f);
  if ((ends_with(f->rel, ".pt") || ends_with(f->rel, ".bin") || ends_with(f->rel, ".pth")) && is_zip_file(f->full))
    return describe_torch(f);
  return ZCK_OK;
}

static zck_manifest_kind detect_kind(char **paths, size_t n) {
  bool st = false, pt = false, ds = false;
  for (size_t i = 0; i < n; i++) {
    const char *p = paths[i];
    if (!strcmp(p, "zero/optimizer_state.pt")) return ZCK_MANIFEST_UNIVERSAL;
    ds = ds || (!strchr(p, '/') && (ends_with(p, "optim_states.pt") || ends_with(p, "_model_states.pt")));
    st = st || ends_with(p, ".safetensors");
    pt = pt || ends_with(p, ".pt") || ends_with(p, ".bin") || ends_with(p, ".pth");
  }
  return ds ? ZCK_MANIFEST_DEEPSPEED : st ? ZCK_MANIFEST_SAFETENSORS : pt ? ZCK_MANIFEST_TORCH : ZCK_MANIFEST_OTHER;
}

static zck_status parse_kind(const char *s, zck_manifest_kind *k) {
  static const zck_manifest_kind all[] = {ZCK_MANIFEST_OTHER, ZCK_MANIFEST_DEEPSPEED, ZCK_MANIFEST_SAFETENSORS,
                                          ZCK_MANIFEST_UNIVERSAL, ZCK_MANIFEST_TORCH};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    if (!strcmp(s, zck_manifest_kind_name(all[i]))) { *k = all[i]; return ZCK_OK; }
  return zck__fail(ZCK_ERR_INVALID_ARG, "manifest kind \"%s\" is not deepspeed, safetensors, universal, torch or other", s);
}

static zck_status deepspeed_layout(const char *dir, zck_manifest *m) {
  zck_ds_ckpt *ck = NULL;
  ZCK_TRY_CTX(zck_ds_open(dir, NULL, &ck), "cannot describe the DeepSpeed layout");
  const zck_ds_info *in = zck_ds_info_of(ck);
  /* written inside a writer's temporary folder (".TAG.zck-tmp-PID"): record TAG */
  char tag[256];
  snprintf(tag, sizeof tag, "%s", in->tag ? in->tag : "");
  char *tmp = strstr(tag, ".zck-tmp-");
  if (tag[0] == '.' && tmp) {
    *tmp = 0;
    memmove(tag, tag + 1, strlen(tag));
  }
  zck_manifest_layout l = {tag[0] ? tag : NULL, in->stage, in->world_size, in->n_flat_groups,
                           (char *)zck_dtype_name(in->lp_dtype), (char *)zck_dtype_name(in->master_dtype), in->bf16_prefix};
  zck_status st = zck_manifest_set_layout(m, &l);
  zck_ds_close(ck);
  return st;
}

static zck_status universal_layout(const char *dir, zck_manifest *m) {
  zck_uv_ckpt *u = NULL;
  ZCK_TRY_CTX(zck_uv_open(dir, NULL, &u), "cannot describe the universal checkpoint");
  const zck_uv_info *in = zck_uv_info_of(u);
  zck_manifest_layout l = {NULL, in->stage, in->world_size, 0, (char *)zck_dtype_name(in->lp_dtype),
                           (char *)zck_dtype_name(in->master_dtype), false};
  zck_status st = zck_manifest_set_layout(m, &l);
  zck_uv_close(u);
  return st;
}

static int cmp_known_range(const void *a, const void *b) {
  const zck__manifest_known_range *x = a, *y = b;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->len < y->len ? -1 : x->len > y->len;
}

static int cmp_known_path(const void *a, const void *b) {
  const zck__manifest_known_file *x = *(const zck__manifest_known_file *const *)a, *y = *(const zck__manifest_known_file *const *)b;
  return strcmp(x->path, y->path);
}

/* The known files by path (hashed ones only), sorted: a folder may hold 300k files. */
static const zck__manifest_known_file **known_index(const zck__manifest_known *k, size_t *n) {
  *n = 0;
  const zck__manifest_known_file **v = zck__malloc((k->n_files ? k->n_files : 1) * sizeof *v);
  if (!v) return NULL;
  for (size_t j = 0; j < k->n_files; j++)
    if (k->files[j].hashed && k->files[j].path) v[(*n)++] = &k->files[j];
  qsort(v, *n, sizeof *v, cmp_known_path);
  return v;
}

static const zck__manifest_known_file *known_find(const zck__manifest_known_file **v, size_t n, const char *path) {
  zck__manifest_known_file key = {0};
  key.path = path;
  const zck__manifest_known_file *kp = &key;
  const zck__manifest_known_file **hit = v ? bsearch(&kp, v, n, sizeof *v, cmp_known_path) : NULL;
  return hit ? *hit : NULL;
}

/* Takes file i's hashes from its writer's (kf) when they describe what is on disk: same
 * size, same chunking, every tensor range found. true: done (no read needed). */
static bool take_known(zck_manifest *m, size_t i, const char *full, const zck__manifest_known *k,
                       const zck__manifest_known_file *kf, size_t t0, size_t t1) {
  struct stat sb;
  if (!kf || k->chunk_size != m->chunk_size || stat(full, &sb) != 0 || (uint64_t)sb.st_size != kf->size) return false;
  uint64_t want_chunks = m->chunk_size ? (kf->size + m->chunk_size - 1) / m->chunk_size : 0;
  if (kf->n_chunks != want_chunks) return false;
  zck__manifest_known_range *sorted = zck__malloc((kf->n_ranges ? kf->n_ranges : 1) * sizeof *sorted);
  if (!sorted) return false;
  if (kf->n_ranges) memcpy(sorted, kf->ranges, kf->n_ranges * sizeof *sorted);
  qsort(sorted, kf->n_ranges, sizeof *sorted, cmp_known_range);
  bool all = true;
  for (size_t t = t0; all && t < t1; t++) { /* file i's tensors */
    zck__manifest_known_range key = {m->tensors[t].offset, m->tensors[t].nbytes, 0};
    all = bsearch(&key, sorted, kf->n_ranges, sizeof *sorted, cmp_known_range) != NULL;
  }
  for (size_t t = t0; all && t < t1; t++) { /* file i's tensors */
    zck__manifest_known_range key = {m->tensors[t].offset, m->tensors[t].nbytes, 0};
    const zck__manifest_known_range *r = bsearch(&key, sorted, kf->n_ranges, sizeof *sorted, cmp_known_range);
    m->tensors[t].xxh3 = r->xxh3;
    m->tensors[t].hashed = true;
  }
  free(sorted);
  if (!all) return false;
  zck_manifest_file *mf = &m->files[i];
  if (kf->n_chunks > 1) { /* as zck_manifest_hash: one chunk is the file itself */
    if (!(mf->chunks = zck__malloc(kf->n_chunks * sizeof *mf->chunks))) {
      for (size_t t = t0; t < t1; t++) m->tensors[t].hashed = false;
      return false;
    }
    memcpy(mf->chunks, kf->chunks, kf->n_chunks * sizeof *mf->chunks);
    mf->n_chunks = kf->n_chunks;
  }
  mf->size = kf->size;
  mf->xxh3 = kf->xxh3;
  mf->hashed = true;
  return true;
}

/* Keeps, compacted to the front, the paths that are in `only` (n_only of them). */
static zck_status keep_only(char **paths, size_t *n, const char *const *only, size_t n_only) {
  zck__strmap keep;
  ZCK_TRY(zck__strmap_init(&keep, n_only));
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < n_only; i++) {
    bool dup;
    st = zck__strmap_put(&keep, only[i], i, &dup, NULL);
  }
  size_t kept = 0, at;
  for (size_t i = 0; st == ZCK_OK && i < *n; i++) {
    if (zck__strmap_get(&keep, paths[i], &at)) paths[kept++] = paths[i];
    else free(paths[i]);
  }
  if (st == ZCK_OK) *n = kept;
  zck__strmap_free(&keep);
  return st;
}

/* Builds the manifest of dir (described and hashed, not written): every file, or those of
 * them named in `only` (not NULL). */
static zck_status manifest_build(const char *dir, const zck_manifest_opts *o, const zck__manifest_known *known,
                                 const char *const *only, size_t n_only, size_t *from_known, zck_manifest **out) {
  *out = NULL;
  char **paths = NULL;
  size_t n = 0;
  ZCK_TRY(zck_manifest_list_files(dir, &paths, &n));
  if (only) {
    zck_status kst = keep_only(paths, &n, only, n_only);
    if (kst != ZCK_OK) { zck_manifest_free_paths(paths, n); return kst; }
  }
  zck_manifest *m = NULL;
  desc_file *df = zck__calloc(n ? n : 1, sizeof *df);
  zck_status st = df ? zck_manifest_new(&m) : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) {
    m->kind = detect_kind(paths, n);
    if (o->kind) st = parse_kind(o->kind, &m->kind);
    if (o->chunk_size) m->chunk_size = o->chunk_size;
  }
  size_t n_kv = 0;
  const zck__manifest_known_file **kv = NULL;
  if (st == ZCK_OK && known && !(kv = known_index(known, &n_kv))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    df[i].rel = paths[i];
    df[i].kf = known_find(kv, n_kv, paths[i]);
    if (!(df[i].full = zck__path_join(dir, paths[i]))) st = ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK) st = zck__manifest_add_listed_file(m, paths[i], NULL);
  }
  if (st == ZCK_OK) st = zck__parallel_for(n, o->threads, describe_item, df);
  size_t *tfirst = zck__malloc((n + 1) * sizeof *tfirst); /* file i's tensors are [tfirst[i], tfirst[i + 1]) */
  if (st == ZCK_OK && !tfirst) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    tfirst[i] = m->n_tensors;
    bool by_writer = df[i].kf && df[i].kf->described;
    const zck__manifest_known_tensor *ts = by_writer ? df[i].kf->tensors : df[i].t;
    size_t nts = by_writer ? df[i].kf->n_tensors : df[i].n;
    for (size_t k = 0; st == ZCK_OK && k < nts; k++)
      st = zck_manifest_add_tensor(m, i, ts[k].name, ts[k].dtype, ts[k].ndim, ts[k].shape, ts[k].offset, ts[k].nbytes,
                                   NULL);
  }
  if (st == ZCK_OK) tfirst[n] = m->n_tensors;
  if (st == ZCK_OK && m->kind == ZCK_MANIFEST_DEEPSPEED)
    st = known && known->layout ? zck_manifest_set_layout(m, known->layout) : deepspeed_layout(dir, m);
  if (st == ZCK_OK && m->kind == ZCK_MANIFEST_UNIVERSAL)
    st = known && known->layout ? zck_manifest_set_layout(m, known->layout) : universal_layout(dir, m);
  bool *skip = NULL;
  if (st == ZCK_OK && known && !(skip = zck__calloc(n ? n : 1, sizeof *skip))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && known && i < n; i++)
    if (df[i].kf && (skip[i] = take_known(m, i, df[i].full, known, df[i].kf, tfirst[i], tfirst[i + 1])) && from_known)
      (*from_known)++;
  if (st == ZCK_OK) {
    zck_manifest_hash_opts ho = ZCK_MANIFEST_HASH_OPTS_INIT;
    ho.threads = o->threads;
    st = zck__manifest_hash_some(dir, m, skip, &ho, true);
  }
  for (size_t i = 0; st == ZCK_OK && i < n; i++) /* read back: no writer hashed it as written */
    if (!skip || !skip[i]) zck__manifest_count_reread(m->files[i].size);
  free(skip);
  free(kv);
  free(tfirst);
  for (size_t i = 0; df && i < n; i++) {
    free(df[i].t);
    free(df[i].full);
  }
  free(df);
  zck_manifest_free_paths(paths, n);
  if (st != ZCK_OK) {
    zck_manifest_free(m);
    return st;
  }
  *out = m;
  return ZCK_OK;
}

static zck_status write_dir(const char *dir, const zck_manifest_opts *opts, const zck__manifest_known *known,
                            const char *const *only, size_t n_only, size_t *from_known);

zck_status zck_manifest_write_dir(const char *dir, const zck_manifest_opts *opts) {
  return write_dir(dir, opts, NULL, NULL, 0, NULL);
}

zck_status zck__manifest_write_dir_known(const char *dir, const zck_manifest_opts *opts, const zck__manifest_known *known,
                                         size_t *from_known) {
  return write_dir(dir, opts, known, NULL, 0, from_known);
}

zck_status zck__manifest_write_dir_only(const char *dir, const zck_manifest_opts *opts, const char *const *only,
                                        size_t n_only) {
  return write_dir(dir, opts, NULL, only, n_only, NULL);
}

static zck_status write_dir(const char *dir, const zck_manifest_opts *opts, const zck__manifest_known *known,
                            const char *const *only, size_t n_only, size_t *from_known) {
  zck_manifest_opts o = ZCK_MANIFEST_OPTS_INIT;
  if (opts) o = *opts;
  ZCK_ASSERT(o.version >= 1);
  if (from_known) *from_known = 0;
  /* A distributed job's rank 0 writes it; the ranks meet first (one that failed before
   * fails them all here), then the others read their share of what rank 0 must hash. */
  ZCK_TRY(zck__dist_agree(ZCK__DIST_MANIFEST, ZCK_OK));
  if (!zck__dist_writes()) {
    zck_manifest_hash_opts ho = ZCK_MANIFEST_HASH_OPTS_INIT;
    ho.threads = o.threads;
    return zck__hash_files_follow(&ho);
  }
  zck_manifest *m = NULL;
  zck_status st = manifest_build(dir, &o, known, only, n_only, from_known, &m);
  zck__hash_files_release(); /* the others wait for a list until rank 0 says */
  ZCK_TRY_CTX(st, "%s: cannot write " ZCK_MANIFEST_NAME, dir);
  st = zck_manifest_write(m, dir);
  zck_manifest_free(m);
  return st;
}
