/* set_target.c: the outputs of a tensor set (tensor_set.h), reserved then committed.
 *
 * A reserve lays out every file (headers, shard assignment, pickle, storages) and hands
 * back where each entry's bytes go, one pass per file group; the job runs its transfer into
 * those stores; the commit finishes the files (torch storages' CRC-32s, the pickle), writes
 * the side files, the manifest from the hashes taken as the bytes went out, and renames the
 * result into place. Nothing here copies tensor data; a free without commit leaves nothing.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io.h"
#include "layout.h"
#include "manifest.h"
#include "plan.h"
#include "safetensors/safetensors.h"
#include "stream_hash.h"
#include "tensor_set.h"
#include "torch/torch.h"

static bool zck__target_is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

// ---- one torch.save file

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

/* A torch file being written: an OrderedDict name -> tensor (loads with weights_only=True). */
typedef struct zck__torch_out {
  char *path;
  zck_torch_writer *w;
  zck_pk *root;
  zck__shash *h;              /* its manifest hashes as written, or NULL */
  zck__shash_budget budget;
  zck__torch_dst_ctx *ctx;    /* [s->n] */
  zck_store *dst;             /* [s->n] */
  uint32_t *crc;              /* [s->n] */
  size_t *order;              /* [s->n] or NULL */
} zck__torch_out;

static void zck__torch_out_free(zck__torch_out *t) {
  zck_torch_writer_free(t->w);
  zck__shash_free(t->h);
  free(t->path);
  free(t->ctx);
  free(t->dst);
  free(t->crc);
  free(t->order);
  memset(t, 0, sizeof *t);
}

/* Creates path (refused if it exists, unless overwrite) with every storage laid out;
 * hashed: its manifest hashes taken as the copy writes it, in storage order. */
static zck_status zck__torch_out_reserve(zck__torch_out *t, const zck__tensor_set *s, const char *path, bool overwrite,
                                         bool hashed, uint64_t chunk_size) {
  memset(t, 0, sizeof *t);
  if (!overwrite && zck__target_is_file(path))
    return zck__fail(ZCK_ERR_EXISTS, "%s: exists (use --overwrite to replace it)", path);
  t->budget = (zck__shash_budget){0, zck__shash_default_budget()};
  if (!(t->path = zck__strdup(path))) return ZCK_ERR_NO_MEMORY;
  if (hashed && !(t->h = zck__shash_new())) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck_torch_writer_create_hashed(path, t->h, &t->w));
  zck_pk_doc *doc = zck_torch_writer_doc(t->w);
  t->root = zck_pk_new_dict(doc, 1);
  size_t n = s->n ? s->n : 1;
  t->dst = zck__calloc(n, sizeof *t->dst);
  t->ctx = zck__calloc(n, sizeof *t->ctx);
  t->crc = zck__calloc(n, sizeof *t->crc);
  zck_status st = (t->root && t->dst && t->ctx && t->crc) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  uint64_t n_stored = 0;
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    const zck__tensor_entry *e = &s->v[i];
    zck_dtype dt = zck__entry_out_dtype(e);
    size_t si;
    uint64_t off = 0;
    if (e->tied_to >= 0) {
      si = t->ctx[e->tied_to].storage; /* the same storage: torch.load gives tied tensors */
    } else {
      st = zck_torch_writer_add_storage(t->w, dt, e->numel, &si, &off);
      if (st != ZCK_OK) break;
      zck__shash_cover(t->h, off, e->numel * zck_dtype_size(dt)); /* the copy writes it whole */
    }
    zck_pk *pt = zck_torch_writer_tensor(t->w, si, e->ndim, e->shape, NULL, 0, 0);
    zck_pk *k = zck_pk_new_str(doc, e->name);
    if (!pt || !k || !zck_pk_dict_set(doc, t->root, k, pt)) { st = pt ? ZCK_ERR_NO_MEMORY : ZCK_ERR_INTERNAL; break; }
    t->ctx[i] = (zck__torch_dst_ctx){t->w, si, zck_dtype_size(dt), t->h, off};
    if (e->tied_to < 0) t->dst[i] = zck_store_callback(NULL, zck__torch_dst_write, &t->ctx[i], dt, e->numel, path);
    if (e->tied_to < 0 && t->h) t->dst[i].write_order = ++n_stored; /* storages lie in entry order */
  }
  /* hashed as written: copied in the order of the storages in the file */
  if (st == ZCK_OK && t->h) {
    if (!(t->order = zck__malloc(n * sizeof *t->order))) return ZCK_ERR_NO_MEMORY;
    for (size_t i = 0; i < s->n; i++) t->order[i] = i;
  }
  if (st == ZCK_OK) st = zck__shash_start(t->h, &t->budget, chunk_size);
  return st;
}

/* Sets each storage's CRC-32 from the copy, writes the pickle and the zip directory;
 * hashed: the file's hashes into known as relpath. */
static zck_status zck__torch_out_commit(zck__torch_out *t, const zck__tensor_set *s, const char *relpath,
                                        zck__manifest_known *known, size_t *cap) {
  for (size_t i = 0; i < s->n; i++)
    if (s->v[i].tied_to < 0) zck_torch_writer_set_crc(t->w, t->ctx[i].storage, t->crc[i]);
  zck_status st = zck_torch_writer_finish(t->w, t->root);
  zck_torch_writer_free(t->w);
  t->w = NULL;
  uint64_t reread = 0;
  zck__manifest_known_file kf;
  if (st == ZCK_OK && t->h) st = zck__shash_finish(t->h, t->path, &reread);
  if (st == ZCK_OK && t->h) st = zck__shash_known_file(t->h, NULL, &kf);
  if (st == ZCK_OK && t->h && kf.hashed) st = zck__known_take(known, cap, &kf, relpath);
  return st;
}

// ---- safetensors

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

// ---- the target

typedef enum { ZCK__TARGET_ST_FILE, ZCK__TARGET_ST_DIR, ZCK__TARGET_TORCH_FILE, ZCK__TARGET_TORCH_DIR } zck__target_kind;

struct zck__set_target {
  zck__target_kind kind;
  const zck__tensor_set *s;
  zck__write_opts o;
  zck__set_pass pass[2];
  size_t n_pass;
  bool hash;                         /* a manifest from the hashes taken as written */
  zck__manifest_known known;         /* the files written besides the writers' own */
  size_t cap_known;
  /* safetensors */
  zck_st_writer *st;
  zck_hf_writer *hf;
  char **shard_paths;
  size_t n_shards;
  size_t *slot;
  zck_store *st_dst;
  size_t *st_order;
  /* torch: the file, and the folder a TORCH_DIR builds it in */
  zck__torch_out torch;
  bool have_torch;
  zck__outdir dir;
  bool have_dir;
};

void zck__set_target_free(zck__set_target *t) {
  if (!t) return;
  zck__torch_out_free(&t->torch);
  zck__known_free(&t->known);
  zck_st_writer_free(t->st);
  zck_hf_writer_free(t->hf);
  for (size_t i = 0; i < t->n_shards && t->shard_paths; i++) free(t->shard_paths[i]);
  free(t->shard_paths);
  free(t->slot);
  free(t->st_dst);
  free(t->st_order);
  if (t->have_dir) zck__outdir_abort(&t->dir);
  free(t);
}

size_t zck__set_target_passes(const zck__set_target *t) { return t->n_pass; }
const zck__set_pass *zck__set_target_pass(const zck__set_target *t, size_t i) { return &t->pass[i]; }

static zck_status zck__target_add_torch(zck__set_target *t, const char *path, bool overwrite) {
  t->have_torch = true;
  ZCK_TRY(zck__torch_out_reserve(&t->torch, t->s, path, overwrite, t->hash, t->known.chunk_size));
  t->pass[t->n_pass++] = (zck__set_pass){t->torch.dst, t->torch.crc, t->torch.order};
  return ZCK_OK;
}

static zck_status zck__reserve_st_file(zck__set_target *t, const char *path) {
  const zck__tensor_set *s = t->s;
  zck_status st = zck_st_writer_new(&t->st);
  for (size_t i = 0; st == ZCK_OK && i < s->n_meta; i++) st = zck_st_writer_set_metadata(t->st, s->meta_keys[i], s->meta_values[i]);
  if (st == ZCK_OK) st = zck__add_entries(s, zck__st_file_add, t->st, &t->slot);
  if (st == ZCK_OK) st = zck_st_writer_layout(t->st);
  if (st == ZCK_OK && !t->o.overwrite && zck__target_is_file(path))
    st = zck__fail(ZCK_ERR_EXISTS, "%s: exists (use --overwrite to replace it)", path);
  if (st == ZCK_OK) st = zck_st_writer_open(t->st, path);
  if (st == ZCK_OK && !(t->st_dst = zck__calloc(s->n ? s->n : 1, sizeof *t->st_dst))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    if (s->v[i].alias_of >= 0) continue;
    const zck_st_tensor *tt = zck_st_writer_tensor(t->st, t->slot[i]);
    t->st_dst[i] = zck_store_fd(zck_st_writer_fd(t->st), tt->offset, zck__entry_out_dtype(&s->v[i]), s->v[i].numel, path);
  }
  if (st == ZCK_OK) t->pass[t->n_pass++] = (zck__set_pass){t->st_dst, NULL, NULL};
  return st;
}

/* The manifest from the hashes the writers made as they wrote: nothing is read back. */
static zck_status zck__manifest_before_commit(void *ctx, const char *tmp_dir) {
  const zck__set_target *t = ctx;
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.kind = "safetensors";
  mo.threads = t->o.threads;
  return zck__manifest_write_dir_known(tmp_dir, &mo, zck_hf_writer_known(t->hf), NULL);
}

static zck_status zck__reserve_st_dir(zck__set_target *t, const char *dir) {
  const zck__tensor_set *s = t->s;
  zck_hf_options ho = ZCK_HF_OPTIONS_INIT;
  ho.max_shard_size = t->o.max_shard_size;
  ho.overwrite = t->o.overwrite;
  ho.style = ZCK_HF_INDEX_SORTED; /* as transformers' save_pretrained and zero_to_fp32 */
  ho.torch_dcp = t->o.torch_file_of != NULL;
  if (t->hash) {
    ho.before_commit = zck__manifest_before_commit;
    ho.before_commit_ctx = t;
  }
  zck_status st = zck_hf_writer_new(dir, &ho, &t->hf);
  if (st == ZCK_OK && t->hash) zck_hf_writer_hash_inline(t->hf);
  for (size_t i = 0; st == ZCK_OK && i < s->n_meta; i++) st = zck_hf_writer_set_metadata(t->hf, s->meta_keys[i], s->meta_values[i]);
  if (st == ZCK_OK) st = zck__add_entries(s, zck__st_dir_add, t->hf, &t->slot);
  for (size_t i = 0; st == ZCK_OK && ho.torch_dcp && i < s->n; i++)
    st = s->v[i].alias_of >= 0 ? zck__fail(ZCK_ERR_INTERNAL, "tensor %s: an alias in torch's layout", s->v[i].name)
                               : zck_hf_writer_set_file(t->hf, t->slot[i], t->o.torch_file_of[i]);
  if (st == ZCK_OK) st = zck_hf_writer_layout(t->hf);
  if (st == ZCK_OK && !(t->st_dst = zck__calloc(s->n ? s->n : 1, sizeof *t->st_dst))) st = ZCK_ERR_NO_MEMORY;
  /* a write error names the shard's destination (DIR/model.safetensors), not the bare
   * shard name, nor the temporary tree it is written in */
  size_t n_shards = st == ZCK_OK ? zck_hf_writer_shard_count(t->hf) : 0;
  if (n_shards && !(t->shard_paths = zck__calloc(n_shards, sizeof *t->shard_paths))) st = ZCK_ERR_NO_MEMORY;
  if (t->shard_paths) t->n_shards = n_shards;
  for (size_t i = 0; st == ZCK_OK && i < n_shards; i++)
    if (!(t->shard_paths[i] = zck__path_join(dir, zck_hf_writer_shard_name(t->hf, i)))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    if (s->v[i].alias_of >= 0) continue;
    zck_hf_slot hs = zck_hf_writer_slot(t->hf, t->slot[i]);
    t->st_dst[i] = zck_hf_writer_store(t->hf, t->slot[i], zck__entry_out_dtype(&s->v[i]), s->v[i].numel,
                                       t->shard_paths[hs.shard]);
  }
  /* hashed as written: the tensors copied in the order of their bytes in the shards */
  if (st == ZCK_OK && t->hash && !(t->st_order = zck__hf_write_order(s, t->hf, t->slot))) st = ZCK_ERR_NO_MEMORY;
  for (size_t q = 0; t->st_order && q < s->n; q++) /* the executor runs the copy in that order, across passes */
    if (t->st_dst[t->st_order[q]].kind != ZCK_STORE_UNBOUND) t->st_dst[t->st_order[q]].write_order = q + 1;
  if (st == ZCK_OK) t->pass[t->n_pass++] = (zck__set_pass){t->st_dst, NULL, t->st_order};
  if (st == ZCK_OK && t->o.torch_bin_too) { /* pytorch_model.bin joins the same atomic directory */
    char *p = zck_hf_writer_extra_path(t->hf, "pytorch_model.bin");
    st = p ? zck__target_add_torch(t, p, true) : ZCK_ERR_NO_MEMORY;
    free(p);
  }
  return st;
}

static zck_status zck__reserve_torch_dir(zck__set_target *t, const char *dir) {
  ZCK_TRY(zck__outdir_create(&t->dir, dir, t->o.overwrite));
  t->have_dir = true;
  char *bin = zck__outdir_file(&t->dir, "pytorch_model.bin");
  zck_status st = bin ? zck__target_add_torch(t, bin, t->o.overwrite) : ZCK_ERR_NO_MEMORY;
  free(bin);
  return st;
}

zck_status zck__set_reserve(const zck__tensor_set *s, zck__set_out kind, const char *out, const zck__write_opts *o,
                            zck__set_target **out_t) {
  *out_t = NULL;
  zck__set_target *t = zck__calloc(1, sizeof *t);
  if (!t) return ZCK_ERR_NO_MEMORY;
  t->s = s;
  if (o) t->o = *o;
  t->kind = (zck__target_kind)kind;
  t->known.chunk_size = ZCK_MANIFEST_DEFAULT_CHUNK;
  t->hash = t->o.manifest && (kind == ZCK__SET_OUT_ST_DIR || kind == ZCK__SET_OUT_TORCH_DIR);
  zck_status st;
  switch (kind) {
  case ZCK__SET_OUT_ST_FILE: st = zck__reserve_st_file(t, out); break;
  case ZCK__SET_OUT_ST_DIR: st = zck__reserve_st_dir(t, out); break;
  case ZCK__SET_OUT_TORCH_FILE: st = zck__target_add_torch(t, out, t->o.overwrite); break;
  case ZCK__SET_OUT_TORCH_DIR: st = zck__reserve_torch_dir(t, out); break;
  default: st = zck__fail(ZCK_ERR_INTERNAL, "unknown output kind %d", (int)kind); break;
  }
  if (st != ZCK_OK) {
    zck__set_target_free(t);
    return st;
  }
  *out_t = t;
  return ZCK_OK;
}

zck_status zck__write_side_file(const char *path, const char *name, const char *text, zck__manifest_known *known,
                                size_t *cap) {
  zck__outfile f;
  zck_status st = zck__outfile_create(&f, path);
  if (st == ZCK_OK) st = zck__outfile_pwrite(&f, text, strlen(text), 0);
  if (st == ZCK_OK) st = zck__outfile_commit(&f);
  else zck__outfile_abort(&f);
  if (st == ZCK_OK && known) st = zck__known_bytes(known, cap, path, name, text, strlen(text));
  return st;
}

/* Each side file into the folder being built (path_of: its path there), hashed when the
 * manifest wants it. */
static zck_status zck__target_side_files(zck__set_target *t, char *(*path_of)(zck__set_target *, const char *)) {
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < t->o.n_side; i++) {
    char *p = path_of(t, t->o.side_names[i]);
    st = p ? zck__write_side_file(p, t->o.side_names[i], t->o.side_texts[i], t->hash ? &t->known : NULL, &t->cap_known)
           : ZCK_ERR_NO_MEMORY;
    free(p);
  }
  return st;
}

static char *zck__hf_extra_path(zck__set_target *t, const char *name) { return zck_hf_writer_extra_path(t->hf, name); }
static char *zck__outdir_path(zck__set_target *t, const char *name) { return zck__outdir_file(&t->dir, name); }

zck_status zck__set_target_commit(zck__set_target *t) {
  zck_status st = ZCK_OK;
  if (t->have_torch) st = zck__torch_out_commit(&t->torch, t->s, "pytorch_model.bin", t->hash ? &t->known : NULL, &t->cap_known);
  switch (t->kind) {
  case ZCK__TARGET_ST_FILE:
    if (st == ZCK_OK) st = zck_st_writer_commit(t->st);
    break;
  case ZCK__TARGET_ST_DIR:
    if (st == ZCK_OK) st = zck__target_side_files(t, zck__hf_extra_path);
    if (st == ZCK_OK && t->hash) st = zck_hf_writer_add_known(t->hf, &t->known);
    if (st == ZCK_OK) st = zck_hf_writer_commit(t->hf);
    break;
  case ZCK__TARGET_TORCH_DIR:
    if (st == ZCK_OK) st = zck__target_side_files(t, zck__outdir_path);
    if (st == ZCK_OK && t->hash) {
      /* written last, as in every folder zckpt produces: it marks the folder complete */
      zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
      mo.kind = "torch";
      mo.threads = t->o.threads;
      st = zck__manifest_write_dir_known(t->dir.tmp_path, &mo, &t->known, NULL);
    }
    if (st == ZCK_OK) st = zck__outdir_commit(&t->dir);
    break;
  case ZCK__TARGET_TORCH_FILE: break;
  }
  return st;
}

// ---- the identity transfer: each entry from its own store

zck_status zck__set_copy(const zck__tensor_set *s, const zck__set_pass *p, const zck__write_opts *o) {
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
      size_t i = p->order ? p->order[q] : q;
      if (p->dst[i].kind == ZCK_STORE_UNBOUND) continue;
      owners[k] = (uint32_t)i;
      src[k] = s->v[i].src;
      dsts[k] = p->dst[i];
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
    st = zck_exec_plan(plan, src, dsts, p->crc ? crcs : NULL, &eo);
  }
  if (st == ZCK_OK && p->crc)
    for (size_t j = 0; j < k; j++) p->crc[owners[j]] = crcs[j];
  zck_plan_free(plan);
  zck_layout_free(layout);
  free(numel);
  free(owners);
  free(src);
  free(dsts);
  free(crcs);
  return st;
}
