/* uv_write.c: the universal checkpoint folder, written reserve-then-fill (universal.h).
 *
 * The folder is built under a temporary name (zck__outdir). Every per-parameter tensor
 * file is a torch writer with one reserved storage, filled through a callback store by
 * whatever plan the caller runs; a batch of them is finished together so the number of
 * open descriptors stays bounded however many parameters the model has. The store takes
 * each piece's CRC-32 once, as it writes it: the manifest hash stream is given it, and the
 * zip record's CRC is assembled from the pieces at finish (crc32_combine). In a
 * distributed job the pieces other ranks wrote reach the store through the executor's
 * written ranges (exec_dist.c, dist.h zck__dist_register_noted), as a DeepSpeed writer's
 * storages do, so every rank assembles the same CRC.
 *
 * Most tensor files of a folder share a few trees: files of the same state, form, dtype and
 * shape differ only in their data and what depends on it (torch.h zck_torch_pattern). The
 * first small file of each such key is made by the torch writer and kept as the pattern;
 * later ones are a copy of it in memory that the plan writes the data into, patched and
 * written with one write at finish: no torch, zip or hash writer per file, whose small
 * allocations were about half of the job's CPU at 100k params. */
#include "universal/universal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist.h"
#include "io.h"
#include "stream_hash.h"
#include "strmap.h"
#include "threadpool.h"

/* A key's pattern: made from the first file of the key (maker) once it is finished. */
typedef struct zck__uv_pat {
  char *key;
  zck_torch_pattern p;          /* p.bytes NULL: none yet */
  bool making;                  /* a pending file makes it */
} zck__uv_pat;

/* Files made from a pattern hold this many data bytes at most: the batch holds their
 * images in memory until it is finished. */
#define ZCK__UV_PATTERN_MAX_DATA ((uint64_t)64 << 10)

typedef struct zck__uv_tfile {
  int kind;                     /* what it holds (zck_uv_tensor_spec), for zck_uv_writer_state */
  uint32_t param;
  const zck_torch_pattern *pat; /* made from this pattern: img is the file, no torch writer */
  uint8_t *img;
  zck__uv_pat *maker;           /* its torch writer's file becomes this pattern */
  zck_torch_writer *tw;
  zck__shash *h;                /* opts.hash: the file's manifest hashes as it is written */
  char *path, *rel;             /* where the file is, and its name in the folder */
  uint64_t data_off;            /* the storage's offset in the file */
  zck_dtype dtype;              /* with h: the tensor, as describing the file finds it */
  int ndim;
  int64_t shape[ZCK_MAX_DIMS];
  bool bare;
  uint64_t numel;
  size_t storage;
  size_t es;
  zck_pk *root;                 /* NULL once sealed (at reserve) */
  pthread_mutex_t mu;           /* the ranges written, each with its CRC-32 (in order: one) */
  struct zck__uv_piece { uint64_t off, n; uint32_t crc; } *pieces;
  size_t n_pieces, cap_pieces;
  bool pieces_lost;             /* out of memory recording one: the CRC is read back */
} zck__uv_tfile;

typedef struct zck__uv_raw {
  zck__outfile f;
  bool open;
  char *rel;                    /* opts.hash: its name in the folder, and its hashes */
  zck__shash *h;
  zck__shash_fd store;
  zck__manifest_known_tensor *tensors; /* owned, or NULL: as describing the file finds them */
  size_t n_tensors;
} zck__uv_raw;

struct zck_uv_writer {
  zck_uv_write_opts o;
  zck__outdir dir;
  bool dir_open, committed;
  char *final_path;
  zck__uv_tfile **files;        /* the pending batch (stable addresses: store contexts) */
  size_t n_files, cap_files;
  size_t handle_base;           /* handle of files[0] */
  zck__uv_raw **raws;
  size_t n_raws, cap_raws;
  char *made_dir;               /* the folder made last: a param's files share one */
  zck__shash_budget budget;     /* pieces held ahead of the tensor files' hash cursors */
  zck__manifest_known known;    /* the hashed files (paths owned) */
  size_t cap_known;
  zck__uv_pat **pats;           /* the patterns by key (stable addresses: files point at them) */
  size_t n_pats, cap_pats;
  zck__strmap pat_of;           /* key -> index in pats */
  /* zck_uv_writer_state: the pending batch's views and what they point to */
  zck_state_view *views;
  size_t n_views;
  zck_layout **layouts;         /* [n_views * ZCK_STATE_KINDS] */
  zck_store *vstores;           /* [n_files]: the stores by view and kind */
  uint32_t *vparams;
  uint16_t *seen;               /* [ZCK_STATE_KINDS * n_params]: files of each kind per param (zeroed between batches) */
  uint64_t *numel;              /* [n_params] */
  size_t seen_params;
};

zck_status zck_uv_check_name(const char *name) {
  /* it becomes a folder (zero/NAME/) or an HDF5 group (/params/NAME/): one plain component */
  const char *why = !name[0] ? "it is empty" : !strcmp(name, ".") || !strcmp(name, "..") ? "it is '.' or '..'"
                    : strchr(name, '/') ? "it holds '/'" : strchr(name, '\\') ? "it holds '\\'" : NULL;
  if (why)
    return zck__fail(ZCK_ERR_FORMAT, "parameter '%s' cannot be stored in a universal checkpoint: %s (its name is a "
                     "folder or HDF5 group name there)", name, why);
  return ZCK_OK;
}

zck_status zck_uv_writer_create(const char *out, const zck_uv_write_opts *o, zck_uv_writer **wp) {
  *wp = NULL;
  zck_uv_writer *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  w->o = (zck_uv_write_opts)ZCK_UV_WRITE_OPTS_INIT;
  if (o) w->o = *o;
  w->budget.max = (uint64_t)64 << 20;
  w->known.chunk_size = ZCK_MANIFEST_DEFAULT_CHUNK;
  w->final_path = zck__strdup(out);
  if (!w->final_path) {
    free(w);
    return ZCK_ERR_NO_MEMORY;
  }
  size_t n = strlen(w->final_path);
  while (n > 1 && w->final_path[n - 1] == '/') w->final_path[--n] = 0;
  if (!n || !strcmp(w->final_path, "/") || !strcmp(w->final_path, ".") || !strcmp(w->final_path, "..")) {
    zck_status st = zck__fail(ZCK_ERR_INVALID_ARG, "%s: not usable as the output folder", out);
    zck_uv_writer_free(w);
    return st;
  }
  zck_status st = zck__outdir_create(&w->dir, w->final_path, w->o.overwrite);
  if (st == ZCK_OK) {
    w->dir_open = true;
    char *zero = zck__outdir_file(&w->dir, "zero");
    st = zero ? zck__mkdirs(zero) : ZCK_ERR_NO_MEMORY;
    free(zero);
  }
  if (st != ZCK_OK) {
    zck_uv_writer_free(w);
    return st;
  }
  *wp = w;
  return ZCK_OK;
}

const char *zck_uv_writer_path(const zck_uv_writer *w) { return w->final_path; }

char *zck_uv_writer_tmp_file(const zck_uv_writer *w, const char *rel) { return zck__outdir_file(&w->dir, rel); }

/* The temporary path of rel, with its folder created. */
static zck_status zck__uv_prepare(zck_uv_writer *w, const char *rel, char **out) {
  char *p = zck__outdir_file(&w->dir, rel);
  *out = NULL;
  if (!p) return ZCK_ERR_NO_MEMORY;
  char *slash = strrchr(p, '/');
  if (slash) {
    *slash = 0;
    zck_status st = w->made_dir && !strcmp(w->made_dir, p) ? ZCK_OK : zck__mkdirs(p);
    if (st == ZCK_OK) {
      free(w->made_dir);
      w->made_dir = strdup(p); /* NULL on out of memory: the next file makes it again */
    }
    *slash = '/';
    if (st != ZCK_OK) {
      free(p);
      return st;
    }
  }
  *out = p;
  return ZCK_OK;
}

// ---- tensor files

/* Bytes [off, off + n) of the storage were written, with this CRC-32. */
static void zck__uv_add_piece(zck__uv_tfile *f, uint64_t off, uint64_t n, uint32_t crc) {
  pthread_mutex_lock(&f->mu);
  struct zck__uv_piece *last = f->n_pieces ? &f->pieces[f->n_pieces - 1] : NULL;
  if (last && last->off + last->n == off) { /* written in order: one piece, its CRC extended */
    last->crc = zck_crc32_combine(last->crc, crc, n);
    last->n += n;
  } else {
    if (f->n_pieces == f->cap_pieces) {
      size_t nc = f->cap_pieces ? 2 * f->cap_pieces : 4;
      struct zck__uv_piece *v = realloc(f->pieces, nc * sizeof *v);
      if (v) { f->pieces = v; f->cap_pieces = nc; }
    }
    if (f->n_pieces < f->cap_pieces) f->pieces[f->n_pieces++] = (struct zck__uv_piece){off, n, crc};
    else f->pieces_lost = true;
  }
  pthread_mutex_unlock(&f->mu);
}

static zck_status zck__uv_tensor_write(void *ctx, const void *src, uint64_t off, uint64_t count) {
  zck__uv_tfile *f = ctx;
  uint64_t n = count * f->es;
  if (!n) return ZCK_OK;
  uint32_t crc = zck_crc32_update(0, src, (size_t)n);
  zck_status st = zck_torch_writer_write(f->tw, f->storage, src, (size_t)n, off * f->es);
  if (st != ZCK_OK) return st;
  zck__uv_add_piece(f, off * f->es, n, crc);
  /* the manifest hashes from these bytes while they are in the cache, with their CRC */
  zck__shash_feed(f->h, f->data_off + off * f->es, src, n, &crc);
  return ZCK_OK;
}

/* A range another rank of a distributed job wrote (lib/dist.h). */
static void zck__uv_tensor_noted(void *ctx, uint64_t elem_off, uint64_t count, uint32_t crc) {
  zck__uv_tfile *f = ctx;
  if (count) zck__uv_add_piece(f, elem_off * f->es, count * f->es, crc);
}

static int zck__uv_piece_cmp(const void *a, const void *b) {
  uint64_t x = ((const struct zck__uv_piece *)a)->off, y = ((const struct zck__uv_piece *)b)->off;
  return x < y ? -1 : x > y;
}

/* The storage's CRC-32 from its pieces' (bytes no piece wrote are the file's zeros); false
 * when a piece was not recorded or two overlap (the torch writer then reads it back). */
static bool zck__uv_pieces_crc(zck__uv_tfile *f, uint64_t nbytes, uint32_t *out) {
  if (f->pieces_lost) return false;
  if (f->n_pieces) qsort(f->pieces, f->n_pieces, sizeof *f->pieces, zck__uv_piece_cmp);   /* a zero-element tensor: none, pieces NULL */
  uint32_t crc = 0;
  uint64_t at = 0;
  for (size_t i = 0; i < f->n_pieces; i++) {
    const struct zck__uv_piece *p = &f->pieces[i];
    if (p->off < at || p->off + p->n > nbytes) return false;
    if (p->off > at) crc = zck_crc32_combine(crc, zck_crc32_zeros(p->off - at), p->off - at);
    crc = zck_crc32_combine(crc, p->crc, p->n);
    at = p->off + p->n;
  }
  if (at < nbytes) crc = zck_crc32_combine(crc, zck_crc32_zeros(nbytes - at), nbytes - at);
  *out = crc;
  return true;
}

static void zck__uv_tfile_free(zck__uv_tfile *f) {
  if (!f) return;
  pthread_mutex_destroy(&f->mu);
  free(f->img);
  free(f->pieces);
  zck_torch_writer_free(f->tw);
  zck__shash_free(f->h);
  free(f->path);
  free(f->rel);
  free(f);
}

/* The finished file's hashes as its known-file record (*have false: the stream could not
 * hash it, so the manifest writer reads it). Safe on any thread: it touches f only. */
/* The file's one tensor into its record k (hashed), which takes over f->rel as its path. */
static zck_status zck__uv_known_tensor(zck__uv_tfile *f, zck__manifest_known_file *k) {
  /* as jobs/manifest_write.c names it: "" bare, else its key "param" */
  struct kt { zck__manifest_known_tensor t; int64_t shape[ZCK_MAX_DIMS]; } *kt = zck__malloc(sizeof *kt);
  if (!kt) return ZCK_ERR_NO_MEMORY;
  uint64_t numel = 1;
  for (int d = 0; d < f->ndim; d++) numel *= (uint64_t)f->shape[d];
  memcpy(kt->shape, f->shape, sizeof kt->shape);
  kt->t = (zck__manifest_known_tensor){f->bare ? "" : "param", zck_dtype_name(f->dtype), f->ndim, kt->shape, f->data_off,
                                       numel * f->es};
  k->described = true;
  k->tensors = &kt->t;
  k->n_tensors = 1;
  k->path = f->rel;
  f->rel = NULL; /* owned by the record now */
  return ZCK_OK;
}

static zck_status zck__uv_known_record(zck__uv_tfile *f, zck__manifest_known_file *k, bool *have) {
  *have = false;
  uint64_t reread = 0;
  ZCK_TRY(zck__shash_finish_laid_out(f->h, f->path, &reread)); /* its torch writer laid it all out */
  if (!zck__shash_done(f->h)) return ZCK_OK;
  ZCK_TRY(zck__shash_known_file(f->h, NULL, k));
  zck_status st = zck__uv_known_tensor(f, k);
  if (st != ZCK_OK) {
    free((void *)k->chunks);
    free((void *)k->ranges);
    return st;
  }
  *have = true;
  return ZCK_OK;
}

/* The same for a file made from a pattern, from its image: what a stream hash of it gives
 * (one chunk: the file is smaller than a chunk), with the tensor's bytes as its one range. */
static zck_status zck__uv_known_image(zck__uv_tfile *f, uint64_t chunk_size, zck__manifest_known_file *k, bool *have) {
  *have = false;
  memset(k, 0, sizeof *k);
  const zck_torch_pattern *p = f->pat;
  if (p->len > chunk_size) return ZCK_OK; /* the manifest reads it */
  uint64_t *chunks = zck__malloc(sizeof *chunks);
  zck__manifest_known_range *r = zck__malloc(sizeof *r);
  if (!chunks || !r) {
    free(chunks);
    free(r);
    return ZCK_ERR_NO_MEMORY;
  }
  k->size = p->len;
  k->xxh3 = chunks[0] = zck_xxh3(f->img, p->len);
  *r = (zck__manifest_known_range){p->data_off, p->data_len, zck_xxh3(f->img + p->data_off, (size_t)p->data_len)};
  k->chunks = chunks;
  k->n_chunks = 1;
  k->ranges = r;
  k->n_ranges = 1;
  k->hashed = true;
  zck_status st = zck__uv_known_tensor(f, k);
  if (st != ZCK_OK) {
    free(chunks);
    free(r);
    return st;
  }
  *have = true;
  return ZCK_OK;
}

static void zck__uv_record_free(zck__manifest_known_file *k) {
  free((void *)k->path);
  free((void *)k->chunks);
  free((void *)k->ranges);
  free((void *)k->tensors);
}

/* A record into w->known (taken over, also on failure). */
static zck_status zck__uv_keep_record(zck_uv_writer *w, zck__manifest_known_file *k) {
  if (w->known.n_files == w->cap_known) {
    size_t nc = w->cap_known ? 2 * w->cap_known : 64;
    zck__manifest_known_file *v = zck__realloc(w->known.files, nc * sizeof *v);
    if (!v) { zck__uv_record_free(k); return ZCK_ERR_NO_MEMORY; }
    w->known.files = v;
    w->cap_known = nc;
  }
  w->known.files[w->known.n_files++] = *k;
  return ZCK_OK;
}

/* One tensor file reserved at rel / path (both taken over, also on failure; its folder
 * exists): its torch writer with the one storage, the tree sealed. Touches nothing of w
 * but its options and the hash budget (atomic), so files are made on many threads. */
static zck_status zck__uv_tfile_make(zck_uv_writer *w, char *rel, char *path, const zck_uv_tensor_spec *s,
                                     zck__uv_tfile **out) {
  *out = NULL;
  zck__uv_tfile *f = zck__calloc(1, sizeof *f);
  if (!f) { free(rel); free(path); return ZCK_ERR_NO_MEMORY; }
  pthread_mutex_init(&f->mu, NULL);
  f->path = path;
  f->rel = rel;
  zck_dtype dtype = s->dtype;
  uint64_t numel = 1;
  for (int i = 0; i < s->ndim; i++) numel *= (uint64_t)s->shape[i];
  uint64_t data_off = 0;
  f->numel = numel;
  f->dtype = dtype;
  zck_status st = ZCK_OK;
  if (w->o.hash && !(f->h = zck__shash_new())) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck_torch_writer_create_hashed(path, f->h, &f->tw);
  if (st == ZCK_OK) st = zck_torch_writer_add_storage(f->tw, dtype, numel, &f->storage, &data_off);
  if (st == ZCK_OK && f->h) { /* the plan writes the whole tensor */
    f->data_off = data_off;
    f->dtype = dtype;
    f->ndim = s->ndim;
    for (int i = 0; i < s->ndim && i < ZCK_MAX_DIMS; i++) f->shape[i] = s->shape[i];
    f->bare = s->form == ZCK_UV_BARE;
    zck__shash_cover(f->h, data_off, numel * zck_dtype_size(dtype));
    st = zck__shash_start(f->h, &w->budget, 0);
  }
  if (st == ZCK_OK) {
    zck_pk_doc *doc = zck_torch_writer_doc(f->tw);
    zck_pk *t = zck_torch_writer_tensor(f->tw, f->storage, s->ndim, s->shape, NULL, 0, 0);
    f->es = zck_dtype_size(dtype);
    if (!t) {
      st = ZCK_ERR_NO_MEMORY;
    } else if (s->form == ZCK_UV_BARE) {
      f->root = t;
    } else {
      /* ds_to_universal's ckpt_dict: a plain dict, cat_dim set before param */
      f->root = zck_pk_new_dict(doc, 0);
      if (!f->root) st = ZCK_ERR_NO_MEMORY;
      if (st == ZCK_OK && s->form == ZCK_UV_CAT_DIM &&
          !zck_pk_dict_set(doc, f->root, zck_pk_new_str(doc, "cat_dim"), zck_pk_new_int(doc, 0)))
        st = ZCK_ERR_NO_MEMORY;
      if (st == ZCK_OK && s->form == ZCK_UV_VOCAB &&
          !zck_pk_dict_set(doc, f->root, zck_pk_new_str(doc, "vocab_tensor"), zck_pk_new_bool(doc, 1)))
        st = ZCK_ERR_NO_MEMORY;
      if (st == ZCK_OK && !zck_pk_dict_set(doc, f->root, zck_pk_new_str(doc, "param"), t)) st = ZCK_ERR_NO_MEMORY;
      /* deepspeed/checkpoint/autoep_universal.py: param first, then these */
      if (st == ZCK_OK && s->form == ZCK_UV_EXPERT &&
          (!zck_pk_dict_set(doc, f->root, zck_pk_new_str(doc, "cat_dim"), zck_pk_new_int(doc, 0)) ||
           !zck_pk_dict_set(doc, f->root, zck_pk_new_str(doc, "is_expert_param"), zck_pk_new_bool(doc, 1)) ||
           !zck_pk_dict_set(doc, f->root, zck_pk_new_str(doc, "ep_num_experts"), zck_pk_new_int(doc, s->ndim ? s->shape[0] : 0))))
        st = ZCK_ERR_NO_MEMORY;
    }
    /* the tree is complete: pickled now, its nodes freed (a 64 KB node block per file: a
     * batch of ~1000 pending files held 70 MB of them) */
    if (st == ZCK_OK) st = zck_torch_writer_seal(f->tw, f->root);
    f->root = NULL;
  }
  if (st != ZCK_OK) {
    zck__uv_tfile_free(f);
    return st;
  }
  *out = f;
  return ZCK_OK;
}

/* A tensor file made from a pattern (rel / path taken over, also on failure): its image, the
 * data zeros until the plan writes them (as the file's bytes no plan writes are). */
static zck_status zck__uv_tfile_from_pattern(char *rel, char *path, const zck_uv_tensor_spec *s,
                                             const zck_torch_pattern *p, zck__uv_tfile **out) {
  *out = NULL;
  zck__uv_tfile *f = zck__calloc(1, sizeof *f);
  uint8_t *img = f ? zck__malloc(p->len) : NULL;
  if (!img) {
    free(f);
    free(rel);
    free(path);
    return ZCK_ERR_NO_MEMORY;
  }
  pthread_mutex_init(&f->mu, NULL);
  memcpy(img, p->bytes, p->len);
  memset(img + p->data_off, 0, (size_t)p->data_len);
  f->pat = p;
  f->img = img;
  f->path = path;
  f->rel = rel;
  f->dtype = s->dtype;
  f->es = zck_dtype_size(s->dtype);
  f->numel = p->data_len / f->es;
  f->data_off = p->data_off;
  f->ndim = s->ndim;
  for (int i = 0; i < s->ndim && i < ZCK_MAX_DIMS; i++) f->shape[i] = s->shape[i];
  f->bare = s->form == ZCK_UV_BARE;
  *out = f;
  return ZCK_OK;
}

static zck_status zck__uv_pattern_write(void *ctx, const void *src, uint64_t off, uint64_t count) {
  zck__uv_tfile *f = ctx;
  uint64_t n = count * f->es, at = off * f->es;
  if (at > f->pat->data_len || n > f->pat->data_len - at)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: elements %llu..%llu written but the tensor has %llu", f->path,
                     (unsigned long long)off, (unsigned long long)(off + count), (unsigned long long)f->numel);
  memcpy(f->img + f->data_off + at, src, (size_t)n);
  return ZCK_OK;
}

/* The pattern key of a tensor file: its state (the archive's folder), form, dtype and shape. */
static void zck__uv_pattern_key(const zck_uv_tensor_spec *s, char *key, size_t cap) {
  int n = snprintf(key, cap, "%s/%d/%d", s->state, (int)s->form, (int)s->dtype);
  for (int d = 0; d < s->ndim && n > 0 && (size_t)n < cap; d++) n += snprintf(key + n, cap - (size_t)n, "/%lld", (long long)s->shape[d]);
}

/* Which pattern each spec is made from (pat[i]), or which pattern its file makes
 * (maker[i]); both NULL: the torch writer alone. A key seen for the first time gets an
 * entry, its first file makes it; the others of the key wait for it (the next batch). */
static zck_status zck__uv_patterns_for(zck_uv_writer *w, const zck_uv_tensor_spec *specs, size_t n,
                                       const zck_torch_pattern **pat, zck__uv_pat **maker) {
  if (zck__dist_on()) return ZCK_OK; /* the ranks share the files on disk (dist.h) */
  char key[512];
  for (size_t i = 0; i < n; i++) {
    const zck_uv_tensor_spec *s = &specs[i];
    uint64_t numel = 1;
    for (int d = 0; d < s->ndim; d++) numel *= (uint64_t)s->shape[d];
    uint64_t bytes = numel * zck_dtype_size(s->dtype);
    if (!bytes || bytes > ZCK__UV_PATTERN_MAX_DATA || s->ndim > ZCK_MAX_DIMS) continue;
    zck__uv_pattern_key(s, key, sizeof key);
    size_t k;
    if (zck__strmap_get(&w->pat_of, key, &k)) {
      zck__uv_pat *pt = w->pats[k];
      if (pt->p.bytes) pat[i] = &pt->p;
      else if (!pt->making) pt->making = true, maker[i] = pt;
      continue;
    }
    zck__uv_pat *pt = zck__calloc(1, sizeof *pt);
    char *kc = pt ? zck__strdup(key) : NULL;
    if (!kc || !ZCK__GROW(w->pats, w->cap_pats, w->n_pats + 1)) {
      free(kc);
      free(pt);
      return ZCK_ERR_NO_MEMORY;
    }
    pt->key = kc;
    bool dup;
    zck_status st = zck__strmap_put(&w->pat_of, kc, w->n_pats, &dup, NULL);
    if (st != ZCK_OK) {
      free(kc);
      free(pt);
      return st;
    }
    w->pats[w->n_pats++] = pt;
    pt->making = true;
    maker[i] = pt;
  }
  return ZCK_OK;
}

/* Appends made files to the pending batch, their stores and handles out. */
static zck_status zck__uv_add_pending(zck_uv_writer *w, zck__uv_tfile **made, size_t n, zck_store *stores,
                                      size_t *handles) {
  if (w->n_files + n > w->cap_files) {
    size_t nc = w->cap_files ? w->cap_files : 64;
    while (nc < w->n_files + n) nc *= 2;
    zck__uv_tfile **v = zck__realloc(w->files, nc * sizeof *v);
    if (!v) {
      for (size_t i = 0; i < n; i++) zck__uv_tfile_free(made[i]);
      return ZCK_ERR_NO_MEMORY;
    }
    w->files = v;
    w->cap_files = nc;
  }
  zck__dist_register_noted(zck__uv_tensor_write, zck__uv_tensor_noted);
  for (size_t i = 0; i < n; i++) {
    zck__uv_tfile *f = made[i];
    w->files[w->n_files] = f;
    handles[i] = w->handle_base + w->n_files;
    w->n_files++;
    stores[i] = zck_store_callback(NULL, f->img ? zck__uv_pattern_write : zck__uv_tensor_write, f, f->dtype, f->numel,
                                   zck_uv_writer_path(w));
    stores[i].name = zck_uv_writer_path(w);
  }
  return ZCK_OK;
}

zck_status zck_uv_writer_tensor(zck_uv_writer *w, const char *name, const char *state, zck_uv_form form,
                                zck_dtype dtype, int ndim, const int64_t *shape, zck_store *store, size_t *handle) {
  zck_uv_tensor_spec s = {name, state, form, dtype, ndim, shape, -1, 0};
  ZCK_TRY(zck_uv_check_name(name));
  char *rel = zck__concat("zero/", name, "/", state, ".pt", (const char *)NULL);
  char *path = NULL;
  zck_status st = rel ? zck__uv_prepare(w, rel, &path) : ZCK_ERR_NO_MEMORY;
  if (st != ZCK_OK) { free(rel); return st; }
  zck__uv_tfile *f = NULL;
  ZCK_TRY(zck__uv_tfile_make(w, rel, path, &s, &f));
  f->kind = -1;
  return zck__uv_add_pending(w, &f, 1, store, handle);
}

/* ---- many tensor files at once, on the writer's threads
 *
 * files_floor (tests/bench) makes a universal folder's folders and files from two threads
 * in half the time one takes: the kernel's inode and directory work per file is most of
 * the job, and runs in parallel. Each work item is one parameter's folder (made first)
 * and its files, so no file waits on a folder another thread is making. */

/* A distributed job's ranks make their (placeholder) files on one thread: the ranks' file
 * registries (dist.c) were not tried with files made concurrently. */
static unsigned zck__uv_threads(const zck_uv_writer *w) {
  return zck__dist_on() || !w->o.threads ? 1 : w->o.threads;
}

typedef struct zck__uv_many {
  zck_uv_writer *w;
  const zck_uv_tensor_spec *specs;
  size_t *group;                /* specs [group[g], group[g + 1]) share a folder */
  zck__uv_tfile **made;
  const zck_torch_pattern **pat;/* zck__uv_patterns_for */
  zck__uv_pat **maker;
} zck__uv_many;

static zck_status zck__uv_many_item(void *ctx, size_t g, unsigned thread) {
  (void)thread;
  zck__uv_many *m = ctx;
  size_t a = m->group[g], b = m->group[g + 1];
  char *dir = zck__concat("zero/", m->specs[a].name, (const char *)NULL);
  char *full = dir ? zck__outdir_file(&m->w->dir, dir) : NULL;
  free(dir);
  zck_status st = full ? zck__mkdirs(full) : ZCK_ERR_NO_MEMORY;
  free(full);
  for (size_t i = a; st == ZCK_OK && i < b; i++) {
    const zck_uv_tensor_spec *s = &m->specs[i];
    char *rel = zck__concat("zero/", s->name, "/", s->state, ".pt", (const char *)NULL);
    char *path = rel ? zck__outdir_file(&m->w->dir, rel) : NULL;
    if (!path) { free(rel); return ZCK_ERR_NO_MEMORY; }
    if (m->pat[i]) {
      st = zck__uv_tfile_from_pattern(rel, path, s, m->pat[i], &m->made[i]);
    } else {
      st = zck__uv_tfile_make(m->w, rel, path, s, &m->made[i]);
      if (st == ZCK_OK) m->made[i]->maker = m->maker[i];
    }
    if (st == ZCK_OK) {
      m->made[i]->kind = s->kind;
      m->made[i]->param = s->param;
    }
  }
  return st;
}

zck_status zck_uv_writer_tensors(zck_uv_writer *w, const zck_uv_tensor_spec *specs, size_t n, zck_store *stores,
                                 size_t *handles) {
  if (!n) return ZCK_OK;
  for (size_t i = 0; i < n; i++) ZCK_TRY(zck_uv_check_name(specs[i].name));
  zck__uv_many m = {w, specs, zck__calloc(n + 1, sizeof *m.group), zck__calloc(n, sizeof *m.made),
                    zck__calloc(n, sizeof *m.pat), zck__calloc(n, sizeof *m.maker)};
  zck_status st = m.group && m.made && m.pat && m.maker ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck__uv_patterns_for(w, specs, n, m.pat, m.maker);
  size_t ng = 0;
  for (size_t i = 0; st == ZCK_OK && i < n; i++)
    if (!i || strcmp(specs[i].name, specs[i - 1].name)) m.group[ng++] = i;
  if (st == ZCK_OK) m.group[ng] = n;
  /* a name twice, apart: two items would make its folder and files at once, so such a
   * batch is made in order on this thread */
  unsigned threads = zck__uv_threads(w);
  zck__strmap seen;
  if (st == ZCK_OK && threads > 1 && ng > 1 && (st = zck__strmap_init(&seen, ng)) == ZCK_OK) {
    bool dup = false;
    for (size_t g = 0; st == ZCK_OK && !dup && g < ng; g++) st = zck__strmap_put(&seen, specs[m.group[g]].name, g, &dup, NULL);
    if (dup) threads = 1;
    zck__strmap_free(&seen);
  }
  if (st == ZCK_OK) st = zck__parallel_for(ng, threads, zck__uv_many_item, &m);
  if (st == ZCK_OK) {
    st = zck__uv_add_pending(w, m.made, n, stores, handles);
  } else {
    for (size_t i = 0; m.made && i < n; i++) zck__uv_tfile_free(m.made[i]);
  }
  /* patterns that no file of a failed batch makes: the next file of their key does */
  for (size_t i = 0; st != ZCK_OK && m.maker && i < n; i++)
    if (m.maker[i]) m.maker[i]->making = false;
  free(m.group);
  free(m.made);
  free(m.pat);
  free(m.maker);
  return st;
}

size_t zck_uv_writer_pending(const zck_uv_writer *w) { return w->n_files; }

// ---- the pending batch as target state views

static void zck__uv_views_free(zck_uv_writer *w) {
  for (size_t i = 0; w->layouts && i < w->n_views * ZCK_STATE_KINDS; i++) zck_layout_free(w->layouts[i]);
  free(w->layouts);
  free(w->views);
  free(w->vstores);
  free(w->vparams);
  w->layouts = NULL;
  w->views = NULL;
  w->vstores = NULL;
  w->vparams = NULL;
  w->n_views = 0;
}

zck_status zck_uv_writer_state(zck_uv_writer *w, const zck_model *m, const zck_state_view **views, size_t *n_views) {
  *views = NULL;
  *n_views = 0;
  zck__uv_views_free(w);
  size_t np = m->n_params, n = w->n_files;
  if (w->seen_params != np) {
    free(w->seen);
    free(w->numel);
    w->seen = zck__calloc(ZCK_STATE_KINDS * (np ? np : 1), sizeof *w->seen);
    w->numel = zck__calloc(np ? np : 1, sizeof *w->numel);
    if (!w->seen || !w->numel) {
      free(w->seen), w->seen = NULL;
      free(w->numel), w->numel = NULL;
      w->seen_params = 0;
      return ZCK_ERR_NO_MEMORY;
    }
    zck_model_numels(m, w->numel);
    w->seen_params = np;
  }
  /* each file's view: how many files of its kind and param come before it */
  uint16_t *level = zck__malloc((n ? n : 1) * sizeof *level);
  w->vstores = zck__malloc((n ? n : 1) * sizeof *w->vstores);
  w->vparams = zck__malloc((n ? n : 1) * sizeof *w->vparams);
  zck_status st = level && w->vstores && w->vparams ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t nv = 0;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck__uv_tfile *f = w->files[i];
    if (f->kind < 0) continue;
    if (f->kind >= ZCK_STATE_KINDS || f->param >= np) {
      st = zck__fail(ZCK_ERR_INVALID_ARG, "%s: tensor file %s: state kind %d of param %u (the model has %zu params)",
                     w->final_path, f->rel ? f->rel : "?", f->kind, f->param, np);
      break;
    }
    uint16_t *c = &w->seen[(size_t)f->kind * np + f->param];
    level[i] = (*c)++;
    if ((size_t)level[i] + 1 > nv) nv = (size_t)level[i] + 1;
  }
  for (size_t i = 0; i < n; i++) /* back to zeros for the next batch */
    if (w->files[i]->kind >= 0 && w->files[i]->kind < ZCK_STATE_KINDS && w->files[i]->param < np)
      w->seen[(size_t)w->files[i]->kind * np + w->files[i]->param] = 0;
  if (st == ZCK_OK && nv) {
    w->views = zck__calloc(nv, sizeof *w->views);
    w->layouts = zck__calloc(nv * ZCK_STATE_KINDS, sizeof *w->layouts);
    if (!w->views || !w->layouts) st = ZCK_ERR_NO_MEMORY;
    else w->n_views = nv;
  }
  /* per view and kind, its files' params and stores side by side in vparams / vstores */
  size_t at = 0;
  for (size_t v = 0; st == ZCK_OK && v < nv; v++) {
    zck_state_view *view = &w->views[v];
    view->model = m;
    view->name = w->final_path;
    for (int k = 0; st == ZCK_OK && k < ZCK_STATE_KINDS; k++) {
      size_t first = at;
      for (size_t i = 0; i < n; i++) {
        const zck__uv_tfile *f = w->files[i];
        if (f->kind != k || level[i] != v) continue;
        w->vparams[at] = f->param;
        w->vstores[at] = zck_store_callback(NULL, f->img ? zck__uv_pattern_write : zck__uv_tensor_write, (void *)f,
                                            f->dtype, f->numel, w->final_path);
        at++;
      }
      if (at == first) continue;
      zck_layout **l = &w->layouts[v * ZCK_STATE_KINDS + (size_t)k];
      st = zck_layout_whole(np, w->numel, w->vparams + first, at - first, l);
      if (st == ZCK_OK) view->part[k] = (zck_state_part){*l, w->vstores + first, NULL};
    }
  }
  free(level);
  if (st != ZCK_OK) {
    zck__uv_views_free(w);
    return st;
  }
  *views = w->views;
  *n_views = w->n_views;
  return ZCK_OK;
}

/* Finishing a batch: each file on the writer's threads (its CRC, directory, one write),
 * its record kept in slot i, then the records appended in order. */
typedef struct zck__uv_fin {
  zck__uv_tfile **files;
  zck__manifest_known_file *rec;
  bool *have;
  bool hash;                    /* opts.hash */
  uint64_t chunk_size;          /* the manifest's */
} zck__uv_fin;

/* A file made from its pattern: patched, written with one write. */
static zck_status zck__uv_fin_pattern(zck__uv_fin *c, size_t i, zck__uv_tfile *f) {
  zck_torch_pattern_apply(f->pat, f->img, NULL);
  zck__outfile out;
  ZCK_TRY(zck__outfile_create(&out, f->path));
  zck_status st = zck__outfile_pwrite(&out, f->img, f->pat->len, 0);
  if (st == ZCK_OK) st = zck__outfile_commit(&out);
  else zck__outfile_abort(&out);
  if (st == ZCK_OK && c->hash) st = zck__uv_known_image(f, c->chunk_size, &c->rec[i], &c->have[i]);
  return st;
}

static zck_status zck__uv_fin_item(void *ctx, size_t i, unsigned thread) {
  (void)thread;
  zck__uv_fin *c = ctx;
  zck__uv_tfile *f = c->files[i];
  if (f->img) return zck__uv_fin_pattern(c, i, f);
  uint32_t crc;
  if (zck__uv_pieces_crc(f, f->numel * f->es, &crc)) zck_torch_writer_set_crc(f->tw, f->storage, crc);
  zck_status st;
  if (f->maker) { /* the key's pattern: this thread alone writes it (one maker a key) */
    st = zck_torch_writer_finish_pattern(f->tw, f->root, &f->maker->p);
    if (st != ZCK_OK) zck_torch_pattern_free(&f->maker->p);
    f->maker->making = false;
  } else {
    st = zck_torch_writer_finish(f->tw, f->root);
  }
  if (st == ZCK_OK && f->h) st = zck__uv_known_record(f, &c->rec[i], &c->have[i]);
  return st;
}

zck_status zck_uv_writer_finish_batch(zck_uv_writer *w) {
  size_t n = w->n_files;
  zck__uv_fin c = {w->files, zck__calloc(n ? n : 1, sizeof *c.rec), zck__calloc(n ? n : 1, sizeof *c.have), w->o.hash,
                   w->known.chunk_size};
  zck_status st = c.rec && c.have ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK && n) st = zck__parallel_for(n, zck__uv_threads(w), zck__uv_fin_item, &c);
  for (size_t i = 0; i < n; i++) {
    if (c.have && c.have[i]) {
      zck_status s = st == ZCK_OK ? zck__uv_keep_record(w, &c.rec[i]) : ZCK_OK;
      if (st != ZCK_OK) zck__uv_record_free(&c.rec[i]);
      if (s != ZCK_OK) st = s;
    }
    zck__uv_tfile_free(w->files[i]);
  }
  free(c.rec);
  free(c.have);
  zck__uv_views_free(w);
  w->handle_base += n;
  w->n_files = 0;
  return st;
}

// ---- other files

zck_status zck_uv_writer_torch(zck_uv_writer *w, const char *rel, zck_torch_writer **tw) {
  return zck_uv_writer_torch_hashed(w, rel, NULL, tw);
}

zck_status zck_uv_writer_torch_hashed(zck_uv_writer *w, const char *rel, zck__shash *h, zck_torch_writer **tw) {
  *tw = NULL;
  char *path = NULL;
  ZCK_TRY(zck__uv_prepare(w, rel, &path));
  zck_status st = zck_torch_writer_create_hashed(path, h, tw);
  free(path);
  return st;
}

/* A finished file's hashes, made as it was written, into w->known (not done: left to the
 * manifest writer, which reads the file), with its tensors when the caller had them
 * (*tensors: taken over, NULL after). */
static zck_status zck__uv_keep(zck_uv_writer *w, const char *path, const char *rel, zck__shash *h,
                               zck__manifest_known_tensor **tensors, size_t n_tensors) {
  uint64_t reread = 0;
  ZCK_TRY(zck__shash_finish(h, path, &reread));
  zck__manifest_known_file f;
  ZCK_TRY(zck__shash_known_file(h, NULL, &f));
  if (!f.hashed) return ZCK_OK;
  if (tensors && *tensors) {
    f.described = true;
    f.tensors = *tensors;
    f.n_tensors = n_tensors;
    *tensors = NULL;
  }
  return zck__known_take(&w->known, &w->cap_known, &f, rel);
}

zck__shash_budget *zck_uv_writer_hash_budget(zck_uv_writer *w) { return &w->budget; }

zck_status zck_uv_writer_keep_hashed(zck_uv_writer *w, const char *rel, zck__shash *h) {
  if (!w->o.hash || !h) return ZCK_OK;
  char *path = zck__outdir_file(&w->dir, rel);
  zck_status st = path ? zck__uv_keep(w, path, rel, h, NULL, 0) : ZCK_ERR_NO_MEMORY;
  free(path);
  return st;
}

zck_status zck_uv_writer_step(zck_uv_writer *w, const char *name, bool is_tensor, double value) {
  ZCK_TRY(zck_uv_check_name(name));
  char *rel = zck__sprintf("zero/%s/step.pt", name);
  if (!rel) return ZCK_ERR_NO_MEMORY;
  zck_torch_writer *tw = NULL;
  zck__shash *h = NULL;
  zck_status st = w->o.hash && !(h = zck__shash_new()) ? ZCK_ERR_NO_MEMORY : ZCK_OK;
  if (st == ZCK_OK) st = zck_uv_writer_torch_hashed(w, rel, h, &tw);
  zck_pk *root = NULL;
  if (st == ZCK_OK && is_tensor) {
    size_t si;
    uint64_t off;
    float v = (float)value;
    st = zck_torch_writer_add_storage(tw, ZCK_F32, 1, &si, &off);
    if (st == ZCK_OK) zck__shash_known(h, off, &v, sizeof v); /* its one value, known now */
    if (st == ZCK_OK) st = zck_torch_writer_write(tw, si, &v, sizeof v, 0);
    if (st == ZCK_OK && !(root = zck_torch_writer_tensor(tw, si, 0, NULL, NULL, 0, 0))) st = ZCK_ERR_NO_MEMORY;
  } else if (st == ZCK_OK) {
    if (!(root = zck_pk_new_int(zck_torch_writer_doc(tw), (int64_t)value))) st = ZCK_ERR_NO_MEMORY;
  }
  if (st == ZCK_OK) st = zck__shash_start(h, &w->budget, 0);
  if (st == ZCK_OK) st = zck_torch_writer_finish(tw, root);
  zck_torch_writer_free(tw);
  if (st == ZCK_OK) st = zck_uv_writer_keep_hashed(w, rel, h);
  zck__shash_free(h);
  free(rel);
  return st;
}

zck_status zck_uv_writer_raw(zck_uv_writer *w, const char *rel, uint64_t size, const zck__manifest_known_range *regions,
                             size_t n_regions, zck__manifest_known_tensor *tensors, size_t n_tensors, zck_store *store) {
  char *path = NULL;
  zck_status st = zck__uv_prepare(w, rel, &path);
  zck__uv_raw *r = st == ZCK_OK ? zck__calloc(1, sizeof *r) : NULL;
  if (st == ZCK_OK && !r) st = ZCK_ERR_NO_MEMORY;
  if (r && w->o.hash) { /* kept for the manifest; without hashes it describes the file itself */
    r->tensors = tensors;
    r->n_tensors = n_tensors;
    tensors = NULL;
  }
  free(tensors);
  if (st == ZCK_OK && w->n_raws == w->cap_raws) {
    size_t nc = w->cap_raws ? 2 * w->cap_raws : 8;
    zck__uv_raw **v = zck__realloc(w->raws, nc * sizeof *v);
    if (!v) st = ZCK_ERR_NO_MEMORY;
    else { w->raws = v; w->cap_raws = nc; }
  }
  if (st == ZCK_OK) st = zck__outfile_create(&r->f, path);
  if (st == ZCK_OK) {
    r->open = true;
    st = zck__outfile_truncate(&r->f, size);
  }
  if (st == ZCK_OK && w->o.hash) { /* every byte written by the copy */
    if (!(r->h = zck__shash_new()) || !(r->rel = zck__strdup(rel))) st = ZCK_ERR_NO_MEMORY;
    for (size_t k = 0; k < n_regions; k++) zck__shash_region(r->h, regions[k].off, regions[k].len, NULL);
    if (!n_regions) zck__shash_region(r->h, 0, size, NULL);
    for (size_t k = 0; k < n_regions; k++) zck__shash_cover(r->h, regions[k].off, regions[k].len);
    if (!n_regions) zck__shash_cover(r->h, 0, size);
    if (st == ZCK_OK) st = zck__shash_start(r->h, &w->budget, 0);
  }
  free(path);
  if (st != ZCK_OK) {
    if (r && r->open) zck__outfile_abort(&r->f);
    if (r) zck__shash_free(r->h);
    if (r) free(r->rel);
    if (r) free(r->tensors);
    free(r);
    return st;
  }
  w->raws[w->n_raws++] = r;
  *store = r->h ? zck__shash_fd_store(&r->store, r->f.fd, 0, ZCK_U8, size, r->f.path, r->h)
                : zck_store_fd(r->f.fd, 0, ZCK_U8, size, r->f.path);
  return ZCK_OK;
}

// ---- commit

static zck_status zck__uv_write_latest(const zck_uv_writer *w) {
  const char *slash = strrchr(w->final_path, '/');
  const char *base = slash ? slash + 1 : w->final_path;
  char *parent = slash ? zck__strndup(w->final_path, (size_t)(slash - w->final_path)) : zck__strdup(".");
  if (parent && !parent[0]) {
    free(parent);
    parent = zck__strdup("/");
  }
  char *latest = parent ? zck__path_join(parent, "latest_universal") : NULL;
  free(parent);
  if (!latest) return ZCK_ERR_NO_MEMORY;
  zck__outfile f;
  zck_status st = zck__outfile_create(&f, latest);
  if (st == ZCK_OK) {
    st = zck__outfile_pwrite(&f, base, strlen(base), 0);
    if (st == ZCK_OK) st = zck__outfile_commit(&f);
    /* a failed commit has already undone itself (the earlier file back, or none): the
     * name may hold an earlier output, so it is not ours to unlink */
    zck__outfile_abort(&f);
  }
  free(latest);
  return st;
}

zck_status zck_uv_writer_finish_files(zck_uv_writer *w) {
  zck_status st = zck_uv_writer_finish_batch(w);
  for (size_t i = 0; i < w->n_raws && st == ZCK_OK; i++) {
    if (!w->raws[i]->open) continue;
    char *path = w->raws[i]->h ? zck__strdup(w->raws[i]->f.path) : NULL; /* commit frees it */
    if (w->raws[i]->h && !path) st = ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK) st = zck__outfile_commit(&w->raws[i]->f);
    if (st == ZCK_OK) w->raws[i]->open = false;
    if (st == ZCK_OK && w->raws[i]->h)
      st = zck__uv_keep(w, path, w->raws[i]->rel, w->raws[i]->h, &w->raws[i]->tensors, w->raws[i]->n_tensors);
    free(path);
  }
  return st;
}

const char *zck_uv_writer_tmp_dir(const zck_uv_writer *w) { return w->dir.tmp_path; }

const zck__manifest_known *zck_uv_writer_known(const zck_uv_writer *w) { return w->o.hash ? &w->known : NULL; }

zck_status zck_uv_writer_commit(zck_uv_writer *w) {
  zck_status st = zck_uv_writer_finish_files(w);
  if (st == ZCK_OK) {
    st = zck__outdir_commit(&w->dir);
    /* renamed into place, then the parent's fsync failed: take the folder back */
    if (st != ZCK_OK && !w->dir.tmp_path) zck__remove_tree(w->final_path);
  }
  if (st != ZCK_OK) return st;
  w->dir_open = false;
  if (w->o.write_latest) {
    st = zck__uv_write_latest(w);
    if (st != ZCK_OK) {
      /* the folder without latest_universal is not what was asked for: take it back */
      zck__remove_tree(w->final_path);
      return st;
    }
  }
  w->committed = true;
  return ZCK_OK;
}

void zck_uv_writer_free(zck_uv_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n_files; i++) zck__uv_tfile_free(w->files[i]);
  free(w->files);
  for (size_t i = 0; i < w->n_raws; i++) {
    if (w->raws[i]->open) zck__outfile_abort(&w->raws[i]->f);
    zck__shash_free(w->raws[i]->h);
    free(w->raws[i]->rel);
    free(w->raws[i]->tensors);
    free(w->raws[i]);
  }
  free(w->raws);
  for (size_t i = 0; i < w->known.n_files; i++) {
    free((void *)w->known.files[i].path);
    free((void *)w->known.files[i].chunks);
    free((void *)w->known.files[i].ranges);
    free((void *)w->known.files[i].tensors);
  }
  free(w->known.files);
  for (size_t i = 0; i < w->n_pats; i++) {
    zck_torch_pattern_free(&w->pats[i]->p);
    free(w->pats[i]->key);
    free(w->pats[i]);
  }
  free(w->pats);
  zck__strmap_free(&w->pat_of);
  zck__uv_views_free(w);
  free(w->seen);
  free(w->numel);
  zck__outdir_abort(&w->dir);   /* after commit it only frees the path */
  free(w->final_path);
  free(w->made_dir);
  free(w);
}
