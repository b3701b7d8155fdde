/* verify.c: `zckpt verify`: is this checkpoint whole, and if not, where is it damaged?
 *
 * Four steps, each adding findings to one report (verify_report.c):
 *   1. what PATH is: a DeepSpeed root / tag folder, an HF or safetensors folder, an index,
 *      a single .safetensors or .pt file; the folder its files are relative to ("base");
 *   2. the manifest of base, if any (a malformed one stops here: exit 1), and the partial
 *      marker of an interrupted zckpt save;
 *   3. structure: the DeepSpeed reader (file set, world size, shapes add up), every .pt
 *      opened fully (zip directory, pickle, tensor geometry) and every .safetensors header,
 *      files in parallel, then the HF index against its shards;
 *   4. data, in one parallel pass reading each file once: the CRC-32 of every zip record
 *      (names the record and the tensors in it), and with a manifest each file's size and
 *      XXH3, chunk hashes (byte ranges) and each tensor's XXH3 (names the tensor).
 * Damage is anything the files say against themselves or their manifest; what could not
 * be read or is not supported is "unchecked"; damage wins for the exit status.
 */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "deepspeed/deepspeed.h"
#include "manifest.h"
#include "safetensors/safetensors.h"
#include "threadpool.h"
#include "torch/torch.h"
#include "universal/universal.h"
#include "verify_internal.h"

#define ULL(x) ((unsigned long long)(x))
#define VERIFY_MAX_TENSOR_FINDINGS 100   /* per file; then one summary line */

typedef enum { VF_OTHER = 0, VF_TORCH, VF_SAFETENSORS } vf_type;

typedef struct vrecord {
  char *name;
  uint64_t off, size;
  uint32_t crc;                /* as the central directory says */
  uint16_t method;
  char *tensors;               /* "a, b and 3 more" (NULL: no tensor views it) */
} vrecord;

typedef struct vfile {
  char *rel, *full;
  vf_type type;
  ptrdiff_t mf;                /* index in the expected manifest, -1 */
  zck_status open_status;      /* structure check of this file */
  char *open_error;
  char **warnings;
  size_t n_warnings;
  vrecord *recs;
  size_t n_recs;
} vfile;

typedef struct vctx {
  const char *path;
  zck_verify_opts o;
  zck__vreport *r;
  char *base;                  /* folder the files are relative to */
  char *single;                /* single-file mode: the file's name in base */
  bool is_ds;
  bool is_uv;                  /* a DeepSpeed universal checkpoint (folder or its parent) */
  bool hf_index_given;         /* path is a *.index.json */
  zck_manifest *expected;      /* NULL without a manifest */
  vfile *files;
  size_t n_files;
  zck_manifest_layout ds_layout;   /* DeepSpeed or universal, from their readers */
  bool have_ds_layout;
} vctx;

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !memcmp(s + n - m, suffix, m);
}

static bool is_dir(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static bool exists_in(const char *dir, const char *name) {
  char *p = zck__path_join(dir, name);
  struct stat sb;
  bool r = p && stat(p, &sb) == 0;
  free(p);
  return r;
}

/* Damage is what the bytes say; the rest (I/O, unsupported, limits) is "unchecked". */
static zck_verify_severity severity_of(zck_status s) {
  switch (s) {
  case ZCK_ERR_FORMAT: case ZCK_ERR_TRUNCATED: case ZCK_ERR_MISMATCH: case ZCK_ERR_NOT_FOUND: case ZCK_ERR_DAMAGED:
    return ZCK_VERIFY_DAMAGE;
  default:
    return ZCK_VERIFY_UNCHECKABLE;
  }
}

static void add_status(vctx *c, zck_status s, const char *check, const char *file, const char *msg) {
  for (size_t i = 0; i < c->r->n; i++) /* the DeepSpeed reader and the file check may say the same */
    if (!strcmp(c->r->v[i].message, msg)) return;
  zck_verify_severity sev = severity_of(s);
  if (sev == ZCK_VERIFY_UNCHECKABLE && c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = s;
  zck__vreport_add(c->r, sev, check, file, NULL, -1, 0, "%s", msg);
}

static bool ds_dir(const char *dir) {
  if (exists_in(dir, "latest")) return true;
  DIR *d = opendir(dir);
  if (!d) return false;
  bool found = false;
  struct dirent *e;
  while (!found && (e = readdir(d))) found = ends_with(e->d_name, "_model_states.pt") || ends_with(e->d_name, "optim_states.pt");
  closedir(d);
  return found;
}

// ---- step 1: what PATH is

/* A universal folder, or the parent whose latest_universal names it. */
static zck_status resolve_universal(vctx *c) {
  c->is_uv = true;
  zck__vreport_set(&c->r->kind, "universal");
  if (exists_in(c->path, "zero/optimizer_state.pt") || !exists_in(c->path, "latest_universal")) return ZCK_OK;
  char *lp = zck__path_join(c->path, "latest_universal"), *name = NULL;
  zck_status ls = lp ? zck__read_small_file(lp, 4096, &name, NULL) : ZCK_ERR_NO_MEMORY;
  free(lp);
  if (ls == ZCK_ERR_NO_MEMORY) return ls;
  if (ls == ZCK_ERR_IO) add_status(c, ls, "read", NULL, zck_last_error());
  else zck_clear_error(); /* a bad latest_universal is the universal reader's to explain */
  if (name) {
    size_t n = strlen(name);
    while (n && (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' ' || name[n - 1] == '\t')) name[--n] = 0;
    if (*name && !strchr(name, '/') && strcmp(name, "..") && strcmp(name, ".")) {
      char *d = zck__path_join(c->path, name);
      if (d && is_dir(d)) { free(c->base); c->base = d; d = NULL; }
      free(d);
    }
  }
  free(name);
  return ZCK_OK;
}

static zck_status resolve(vctx *c) {
  struct stat sb;
  if (stat(c->path, &sb) != 0) {
    zck_status s = zck__fail_errno(errno, "%s: cannot verify", c->path);
    if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = s;
    zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "read", c->path, NULL, -1, 0, "%s", zck_last_error());
    return ZCK_OK; /* run() stops: nothing to check */
  }
  if (S_ISDIR(sb.st_mode)) {
    c->base = zck__strdup(c->path);
    if (!c->base) return ZCK_ERR_NO_MEMORY;
    if (exists_in(c->path, "zero/optimizer_state.pt") ||
        (exists_in(c->path, "latest_universal") && !exists_in(c->path, "latest")))
      return resolve_universal(c);
    if (!ds_dir(c->path)) return ZCK_OK;
    c->is_ds = true;
    zck__vreport_set(&c->r->kind, "deepspeed");
    /* a root: its files are those of the tag folder `latest` (or --tag) names */
    char *tag = NULL;
    if (c->o.tag) {
      tag = zck__strdup(c->o.tag);
    } else if (exists_in(c->path, "latest")) {
      char *lp = zck__path_join(c->path, "latest");
      zck_status ls = lp ? zck__read_small_file(lp, 4096, &tag, NULL) : ZCK_ERR_NO_MEMORY;
      free(lp);
      if (ls == ZCK_ERR_NO_MEMORY) return ls;
      if (ls == ZCK_ERR_IO) add_status(c, ls, "read", NULL, zck_last_error());
      else zck_clear_error(); /* a bad `latest` is the DeepSpeed reader's to explain */
      if (tag) { /* no trailing newline in DeepSpeed's file, but strip like the reader */
        size_t n = strlen(tag);
        while (n && (tag[n - 1] == '\n' || tag[n - 1] == '\r' || tag[n - 1] == ' ' || tag[n - 1] == '\t')) tag[--n] = 0;
      }
    }
    if (tag && *tag && !strchr(tag, '/') && strcmp(tag, "..") && strcmp(tag, ".")) {
      char *td = zck__path_join(c->path, tag);
      if (td && is_dir(td)) { free(c->base); c->base = td; td = NULL; }
      free(td);
    }
    free(tag);
    return ZCK_OK;
  }
  /* a file: its folder holds the manifest, if any */
  char *copy1 = zck__strdup(c->path), *copy2 = zck__strdup(c->path);
  if (!copy1 || !copy2) { free(copy1); free(copy2); return ZCK_ERR_NO_MEMORY; }
  c->base = zck__strdup(dirname(copy1));
  if (ends_with(c->path, ".index.json")) c->hf_index_given = true;
  else c->single = zck__strdup(basename(copy2));
  free(copy1);
  free(copy2);
  if (!c->base || (!c->hf_index_given && !c->single)) return ZCK_ERR_NO_MEMORY;
  return ZCK_OK;
}

// ---- step 2: the manifest

/* Only the single file's entry and tensors, for `zckpt verify DIR/model.safetensors`. */
static zck_status filter_manifest(zck_manifest *m, const char *rel, zck_manifest **out) {
  *out = NULL;
  ptrdiff_t fi = zck_manifest_find_file(m, rel);
  if (fi < 0) return ZCK_OK;
  zck_manifest *f = NULL;
  ZCK_TRY(zck_manifest_new(&f));
  f->kind = m->kind;
  f->chunk_size = m->chunk_size;
  zck_status st = m->has_layout ? zck_manifest_set_layout(f, &m->layout) : ZCK_OK;
  if (st == ZCK_OK) st = zck_manifest_add_file(f, rel, NULL);
  if (st == ZCK_OK) {
    zck_manifest_file *d = &f->files[0], *s = &m->files[fi];
    d->size = s->size;
    d->xxh3 = s->xxh3;
    d->hashed = s->hashed;
    if (s->n_chunks) {
      d->chunks = zck__malloc(s->n_chunks * sizeof *d->chunks);
      if (!d->chunks) st = ZCK_ERR_NO_MEMORY;
      else { memcpy(d->chunks, s->chunks, s->n_chunks * sizeof *d->chunks); d->n_chunks = s->n_chunks; }
    }
  }
  for (size_t i = 0; st == ZCK_OK && i < m->n_tensors; i++) {
    const zck_manifest_tensor *t = &m->tensors[i];
    if (t->file != (size_t)fi) continue;
    size_t k;
    st = zck_manifest_add_tensor(f, 0, t->name, t->dtype, t->ndim, t->shape, t->offset, t->nbytes, &k);
    if (st == ZCK_OK) { f->tensors[k].xxh3 = t->xxh3; f->tensors[k].hashed = t->hashed; }
  }
  if (st != ZCK_OK) { zck_manifest_free(f); return st; }
  *out = f;
  return ZCK_OK;
}

static zck_status load_manifest(vctx *c) {
  zck_manifest *m = NULL;
  zck_status st = zck_manifest_read(c->base, &m);
  char *mpath = zck__path_join(c->base, ZCK_MANIFEST_NAME);
  if (!mpath) { zck_manifest_free(m); return ZCK_ERR_NO_MEMORY; }
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    st = ZCK_OK;
    if (exists_in(c->base, ZCK_MANIFEST_PARTIAL_NAME)) {
      if (c->o.force)
        zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "incomplete", c->base, NULL, -1, 0,
                         "%s: marked incomplete (" ZCK_MANIFEST_PARTIAL_NAME ", no " ZCK_MANIFEST_NAME "); checked anyway (--force)", c->base);
      else
        zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "incomplete", c->base, NULL, -1, 0,
                         "%s: incomplete checkpoint: zckpt started writing it and never wrote " ZCK_MANIFEST_NAME
                         " (interrupted save?); --force checks the files anyway", c->base);
    } else {
      zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                       "no " ZCK_MANIFEST_NAME ": structure checks only (zip CRCs, headers, shapes); no checksums of the data as written");
    }
  } else if (st != ZCK_OK) {
    if (st == ZCK_ERR_NO_MEMORY) { free(mpath); return st; }
    /* a manifest that cannot be read gives nothing to check against: exit 1, not 3 */
    c->r->first_unchecked = st;
    zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "manifest", mpath, NULL, -1, 0, "%s", zck_last_error());
    st = ZCK_OK;
  } else if (c->single) {
    zck_manifest *f = NULL;
    st = filter_manifest(m, c->single, &f);
    if (st == ZCK_OK && !f)
      zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                       "%s: not listed in %s: structure checks only", c->path, mpath);
    if (f) zck__vreport_set(&c->r->manifest, mpath);
    c->expected = f;
  } else {
    c->expected = m;
    m = NULL;
    zck__vreport_set(&c->r->manifest, mpath);
    if (exists_in(c->base, ZCK_MANIFEST_PARTIAL_NAME))
      zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "incomplete", c->base, NULL, -1, 0,
                       "%s: a stale " ZCK_MANIFEST_PARTIAL_NAME " beside the manifest (a save interrupted after the manifest was written)",
                       c->base);
  }
  zck_manifest_free(m);
  free(mpath);
  return st;
}

// ---- the file list

static vf_type type_of(const char *rel, const char *full) {
  if (ends_with(rel, ".safetensors")) return VF_SAFETENSORS;
  if (ends_with(rel, ".pt") || ends_with(rel, ".bin") || ends_with(rel, ".pth") || ends_with(rel, ".ckpt")) {
    zck__source src;
    if (zck__source_open(&src, full) != ZCK_OK) { zck_clear_error(); return VF_TORCH; } /* the open says why */
    uint8_t head[4] = {0};
    bool zip = src.size >= 4 && zck__source_read(&src, head, 4, 0) == ZCK_OK && !memcmp(head, "PK\3\4", 4);
    bool legacy = src.size >= 2 && head[0] == 0x80; /* torch explains T-01 */
    zck__source_close(&src);
    zck_clear_error();
    if (zip || legacy || ends_with(rel, ".pt") || ends_with(rel, ".pth")) return VF_TORCH;
    return VF_OTHER; /* a .bin that is not torch */
  }
  return VF_OTHER;
}

static zck_status list_files(vctx *c) {
  char **paths = NULL;
  size_t n = 0;
  if (c->single) {
    paths = zck__malloc(sizeof *paths);
    if (!paths || !(paths[0] = zck__strdup(c->single))) { free(paths); return ZCK_ERR_NO_MEMORY; }
    n = 1;
  } else {
    zck_status st = zck_manifest_list_files(c->base, &paths, &n);
    if (st != ZCK_OK) {
      add_status(c, st == ZCK_ERR_NOT_FOUND ? ZCK_ERR_IO : st, "read", c->base, zck_last_error());
      return ZCK_OK;
    }
  }
  c->files = zck__calloc(n ? n : 1, sizeof *c->files);
  if (!c->files) { zck_manifest_free_paths(paths, n); return ZCK_ERR_NO_MEMORY; }
  for (size_t i = 0; i < n; i++) {
    vfile *f = &c->files[c->n_files++];
    f->rel = paths[i];
    paths[i] = NULL;
    f->full = zck__path_join(c->base, f->rel);
    if (!f->full) { zck_manifest_free_paths(paths, n); return ZCK_ERR_NO_MEMORY; }
    f->type = type_of(f->rel, f->full);
    f->mf = c->expected ? zck_manifest_find_file(c->expected, f->rel) : -1;
  }
  zck_manifest_free_paths(paths, n);
  return ZCK_OK;
}

// ---- step 3: structure

typedef struct ptr_index {
  const void *p;
  size_t index;
} ptr_index;

static int cmp_ptr_index(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const ptr_index *)a)->p, y = (uintptr_t)((const ptr_index *)b)->p;
  return x < y ? -1 : x > y;
}

/* Names of the tensors viewing each record, for zip CRC findings. */
static zck_status name_records(zck_torch_file *tf, vfile *f, const ptr_index *entries, size_t n_entries) {
  zck_torch_named *named = NULL;
  size_t count = 0;
  if (zck_torch_state_dict(tf, zck_torch_root(tf), &named, &count) != ZCK_OK) { zck_clear_error(); return ZCK_OK; }
  size_t *shown = zck__calloc(f->n_recs ? f->n_recs : 1, sizeof *shown);
  zck__buf *names = zck__calloc(f->n_recs ? f->n_recs : 1, sizeof *names);
  zck_status st = shown && names ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < count; i++) {
    const zck_torch_storage *s = zck_torch_tensor_storage(tf, named[i].tensor);
    ptr_index key = {s ? s->entry : NULL, 0};
    const ptr_index *hit = s ? bsearch(&key, entries, n_entries, sizeof *entries, cmp_ptr_index) : NULL;
    if (!hit) continue;
    size_t r = hit->index;
    if (shown[r] < 3) zck__buf_printf(&names[r], "%s%s", shown[r] ? ", " : "", named[i].name);
    shown[r]++;
  }
  for (size_t r = 0; st == ZCK_OK && r < f->n_recs; r++) {
    if (!shown[r]) continue;
    if (shown[r] > 3) zck__buf_printf(&names[r], " and %zu more", shown[r] - 3);
    zck__buf_byte(&names[r], 0);
    if (names[r].failed) { st = ZCK_ERR_NO_MEMORY; break; }
    f->recs[r].tensors = (char *)names[r].data;
    names[r].data = NULL;
  }
  for (size_t r = 0; names && r < f->n_recs; r++) zck__buf_free(&names[r]);
  free(names);
  free(shown);
  zck_torch_named_free(named, count);
  return st;
}

/* The records of a zip directory; names of the tensors in them when tf is given. */
static zck_status collect_records(vfile *f, const zck_zip *z, zck_torch_file *tf) {
  size_t n = zck_zip_count(z);
  f->recs = zck__calloc(n ? n : 1, sizeof *f->recs);
  ptr_index *entries = zck__malloc((n ? n : 1) * sizeof *entries);
  zck_status st = f->recs && entries ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    vrecord *r = &f->recs[f->n_recs++];
    r->name = zck__strdup(e->name);
    if (!r->name) st = ZCK_ERR_NO_MEMORY;
    r->off = e->data_offset;
    r->size = e->comp_size;
    r->crc = e->crc32;
    r->method = e->method;
    entries[i] = (ptr_index){e, i};
  }
  if (st == ZCK_OK && tf) {
    qsort(entries, n, sizeof *entries, cmp_ptr_index);
    st = name_records(tf, f, entries, n);
  }
  free(entries);
  return st;
}

/* A .pt the torch reader rejects may still have a readable zip directory: its records'
 * CRCs then tell damage (a flipped pickle byte) from a file that is merely unsupported. */
static void records_without_torch(vfile *f) {
  zck__source src;
  zck_zip *z = NULL;
  if (zck__source_open(&src, f->full) != ZCK_OK) { zck_clear_error(); return; }
  if (zck_zip_open(&src, &z) == ZCK_OK && collect_records(f, z, NULL) != ZCK_OK) {
    for (size_t k = 0; k < f->n_recs; k++) free(f->recs[k].name);
    free(f->recs);
    f->recs = NULL;
    f->n_recs = 0;
  }
  zck_zip_close(z);
  zck__source_close(&src);
  zck_clear_error();
}

static zck_status open_torch(vfile *f) {
  zck_torch_file *tf = NULL;
  ZCK_TRY(zck_torch_open(f->full, NULL, &tf));
  zck_status st = collect_records(f, zck_torch_zip(tf), tf);
  zck_torch_close(tf);
  return st;
}

static zck_status open_safetensors(vfile *f) {
  zck_st_file *sf = NULL;
  ZCK_TRY(zck_st_open(f->full, &sf));
  size_t n = zck_st_warning_count(sf);
  zck_status st = ZCK_OK;
  if (n && !(f->warnings = zck__calloc(n, sizeof *f->warnings))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++)
    if ((f->warnings[f->n_warnings] = zck__strdup(zck_st_warning_at(sf, i)))) f->n_warnings++;
  zck_st_close(sf);
  return st;
}

static zck_status open_item(void *ctx, size_t item, unsigned thread) {
  vfile *f = &((vfile *)ctx)[item];
  zck_status st = ZCK_OK;
  if (f->type == VF_TORCH) st = open_torch(f);
  else if (f->type == VF_SAFETENSORS) st = open_safetensors(f);
  f->open_status = st;
  if (st != ZCK_OK) {
    f->open_error = strdup(zck_last_error());
    zck_clear_error();
    if (st == ZCK_ERR_NO_MEMORY) return st;
    if (f->type == VF_TORCH && !f->n_recs) records_without_torch(f);
  }
  return ZCK_OK; /* one bad file must not stop the others */
}

static void check_deepspeed(vctx *c) {
  zck_ds_open_opts o = ZCK_DS_OPEN_OPTS_INIT;
  o.tag = c->o.tag;
  zck_ds_ckpt *ck = NULL;
  zck_status st = zck_ds_open(c->path, &o, &ck);
  if (st == ZCK_ERR_UNSUPPORTED) {
    zck__vreport_add(c->r, ZCK_VERIFY_WARNING, "structure", NULL, NULL, -1, 0,
                     "DeepSpeed file set not checked: %s (each file is still checked)", zck_last_error());
    return;
  }
  if (st != ZCK_OK) {
    add_status(c, st, "structure", NULL, zck_last_error());
    return;
  }
  const zck_ds_info *in = zck_ds_info_of(ck);
  char detail[256];
  snprintf(detail, sizeof detail, "tag %s, ZeRO stage %d, world size %u, %zu flat group%s, %s", in->tag ? in->tag : "?",
           in->stage, in->world_size, in->n_flat_groups, in->n_flat_groups == 1 ? "" : "s", zck_dtype_name(in->lp_dtype));
  zck__vreport_set(&c->r->detail, detail);
  for (size_t i = 0; i < in->n_warnings; i++) zck__vreport_add_unique(c->r, ZCK_VERIFY_WARNING, "structure", in->warnings[i]);
  c->ds_layout = (zck_manifest_layout){NULL, in->stage, in->world_size, in->n_flat_groups,
                                       (char *)zck_dtype_name(in->lp_dtype), (char *)zck_dtype_name(in->master_dtype),
                                       in->bf16_prefix};
  c->have_ds_layout = true;
  zck_ds_close(ck);
}

static void check_universal(vctx *c) {
  zck_uv_ckpt *u = NULL;
  zck_status st = zck_uv_open(c->path, NULL, &u);
  if (st != ZCK_OK) {
    add_status(c, st == ZCK_ERR_UNSUPPORTED ? ZCK_ERR_UNSUPPORTED : st, "structure", NULL, zck_last_error());
    return;
  }
  const zck_uv_info *in = zck_uv_info_of(u);
  char detail[256];
  snprintf(detail, sizeof detail, "ZeRO stage %d source, world size %u, %s%s", in->stage, in->world_size,
           zck_dtype_name(in->lp_dtype), in->has_optimizer_state ? ", with optimizer state" : "");
  zck__vreport_set(&c->r->detail, detail);
  c->ds_layout = (zck_manifest_layout){NULL, in->stage, in->world_size, 0, (char *)zck_dtype_name(in->lp_dtype),
                                       (char *)zck_dtype_name(in->master_dtype), false};
  c->have_ds_layout = true;
  zck_uv_close(u);
}

static void check_hf_index(vctx *c) {
  const char *hf_path = NULL;
  char *owned = NULL;
  if (c->hf_index_given) hf_path = c->path;
  else if (!c->single && (exists_in(c->base, "model.safetensors.index.json") || exists_in(c->base, "model.safetensors")))
    hf_path = owned = zck__strdup(c->base);
  if (!hf_path) return;
  for (size_t i = 0; i < c->n_files; i++)
    if (c->files[i].type == VF_SAFETENSORS && c->files[i].open_status != ZCK_OK) { free(owned); return; } /* already said */
  zck_hf_checkpoint *hc = NULL;
  zck_status st = zck_hf_open(hf_path, &hc);
  if (st != ZCK_OK) {
    add_status(c, st, "structure", NULL, zck_last_error());
  } else {
    for (size_t i = 0; i < zck_hf_warning_count(hc); i++)
      zck__vreport_add_unique(c->r, ZCK_VERIFY_WARNING, "structure", zck_hf_warning_at(hc, i));
    zck_hf_close(hc);
  }
  free(owned);
}

static zck_status check_structure(vctx *c) {
  if (c->is_ds) check_deepspeed(c);
  if (c->is_uv) check_universal(c);
  ZCK_TRY(zck__parallel_for(c->n_files, c->o.threads, open_item, c->files));
  size_t n_st = 0, n_pt = 0;
  for (size_t i = 0; i < c->n_files; i++) {
    vfile *f = &c->files[i];
    n_st += f->type == VF_SAFETENSORS;
    n_pt += f->type == VF_TORCH;
    if (f->open_status != ZCK_OK) add_status(c, f->open_status, "structure", f->full, f->open_error ? f->open_error : "cannot open");
    for (size_t k = 0; k < f->n_warnings; k++) zck__vreport_add_unique(c->r, ZCK_VERIFY_WARNING, "structure", f->warnings[k]);
  }
  if (!c->is_ds && !c->is_uv) {
    check_hf_index(c);
    zck_manifest_kind k = c->expected ? c->expected->kind : ZCK_MANIFEST_OTHER;
    const char *kind = k != ZCK_MANIFEST_OTHER ? zck_manifest_kind_name(k)
                       : n_st ? "safetensors" : n_pt ? "torch" : c->single ? "file" : "directory";
    zck__vreport_set(&c->r->kind, kind);
  }
  if (!c->is_ds && !c->is_uv && !c->expected && !n_st && !n_pt && !c->hf_index_given) {
    if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = ZCK_ERR_UNSUPPORTED;
    zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "coverage", c->path, NULL, -1, 0,
                     "%s: nothing zckpt can check: no .pt/.bin, .safetensors, DeepSpeed checkpoint or " ZCK_MANIFEST_NAME,
                     c->path);
  }
  if (!c->expected && n_st)
    zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                     "safetensors files carry no checksums: their tensor bytes were not checked (a zckpt manifest would cover them)");
  return ZCK_OK;
}

// ---- step 4: data

typedef struct diff_ctx {
  vctx *c;
  size_t *tensor_findings;     /* per expected file */
  size_t suppressed;
} diff_ctx;

static void on_diff(void *vctx_, const zck_manifest_diff *d) {
  diff_ctx *dc = vctx_;
  vctx *c = dc->c;
  const char *check = "file-xxh3";
  zck_verify_severity sev = ZCK_VERIFY_DAMAGE;
  switch (d->kind) {
  case ZCK_MDIFF_KIND: case ZCK_MDIFF_LAYOUT: check = "layout"; break;
  case ZCK_MDIFF_MISSING_FILE: check = "missing-file"; break;
  case ZCK_MDIFF_EXTRA_FILE: check = "extra-file"; sev = ZCK_VERIFY_WARNING; break;
  case ZCK_MDIFF_UNREADABLE_FILE:
    check = "read";
    sev = ZCK_VERIFY_UNCHECKABLE;
    if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = ZCK_ERR_IO;
    break;
  case ZCK_MDIFF_SIZE: check = "size"; break;
  case ZCK_MDIFF_FILE_HASH: check = "file-xxh3"; break;
  case ZCK_MDIFF_CHUNK: check = "chunk-xxh3"; break;
  case ZCK_MDIFF_MISSING_TENSOR: case ZCK_MDIFF_TENSOR_META: check = "tensor-meta"; break;
  case ZCK_MDIFF_EXTRA_TENSOR: check = "tensor-meta"; sev = ZCK_VERIFY_WARNING; break;
  case ZCK_MDIFF_TENSOR_UNREADABLE: check = "tensor-range"; break;
  case ZCK_MDIFF_TENSOR_HASH: check = "tensor-xxh3"; break;
  }
  if (d->tensor && d->file) { /* a file overwritten wholesale would list every tensor */
    ptrdiff_t fi = zck_manifest_find_file(c->expected, d->file);
    if (fi >= 0 && ++dc->tensor_findings[fi] > VERIFY_MAX_TENSOR_FINDINGS) { dc->suppressed++; return; }
  }
  char *full = d->file ? zck__path_join(c->base, d->file) : NULL;
  zck__vreport_add(c->r, sev, check, full ? full : d->file, d->tensor, d->offset, d->length, "%s", d->message);
  free(full);
}

static void check_records(vctx *c, vfile *f, const zck__hash_range *ranges) {
  for (size_t k = 0; k < f->n_recs; k++) {
    const vrecord *r = &f->recs[k];
    const zck__hash_range *h = &ranges[k];
    if (r->method) continue;
    c->r->pub.records++;
    if (!h->done) {
      zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "zip-crc", f->full, r->tensors, (int64_t)r->off, r->size,
                       "%s: zip record \"%s\" (bytes %llu..%llu) passes the end of the file", f->full, r->name, ULL(r->off),
                       ULL(r->off + r->size));
    } else if (h->crc32 != r->crc) {
      zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "zip-crc", f->full, r->tensors, (int64_t)r->off, r->size,
                       "%s: zip record \"%s\"%s%s%s (bytes %llu..%llu): CRC-32 is %08x, the zip directory says %08x [Z-22]",
                       f->full, r->name, r->tensors ? " (tensor " : "", r->tensors ? r->tensors : "", r->tensors ? ")" : "",
                       ULL(r->off), ULL(r->off + r->size), h->crc32, r->crc);
    }
  }
}

static zck_status check_data(vctx *c) {
  zck_manifest *e = c->expected, *a = NULL;
  size_t n_ranges = 0, n_hash = 0;
  for (size_t i = 0; i < c->n_files; i++) {
    vfile *f = &c->files[i];
    n_ranges += f->n_recs;
  }
  if (e) n_ranges += e->n_tensors;
  zck__hash_range *ranges = zck__calloc(n_ranges ? n_ranges : 1, sizeof *ranges);
  zck__hash_file *hf = zck__calloc(c->n_files ? c->n_files : 1, sizeof *hf);
  size_t *hf_of = zck__calloc(c->n_files ? c->n_files : 1, sizeof *hf_of);
  size_t *slot = e ? zck__calloc(e->n_tensors ? e->n_tensors : 1, sizeof *slot) : NULL;
  size_t *rec_base = zck__calloc(c->n_files ? c->n_files : 1, sizeof *rec_base);
  bool *present = e ? zck__calloc(e->n_files ? e->n_files : 1, sizeof *present) : NULL; /* manifest files on disk */
  zck_status st = ranges && hf && hf_of && rec_base && (!e || (slot && present)) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && e && i < c->n_files; i++)
    if (c->files[i].mf >= 0) present[c->files[i].mf] = true;
  if (st == ZCK_OK && e) st = zck_manifest_clone_unhashed(e, &a);
  /* ranges of each file: its records' CRCs first, then its manifest tensors */
  size_t used = 0;
  for (size_t i = 0; st == ZCK_OK && i < c->n_files; i++) {
    vfile *f = &c->files[i];
    bool recs = f->n_recs > 0;
    if (!recs && f->mf < 0) continue;
    zck__hash_file *h = &hf[n_hash];
    hf_of[i] = n_hash++;
    h->path = f->full;
    h->chunk_size = f->mf >= 0 ? e->chunk_size : 0;
    h->ranges = ranges + used;
    rec_base[i] = used;
    for (size_t k = 0; recs && k < f->n_recs; k++) /* compressed records: CRC of other bytes (torch rejects them) */
      ranges[used++] = (zck__hash_range){f->recs[k].off, f->recs[k].size, f->recs[k].method ? 0u : ZCK__HASH_CRC32, 0, 0, false};
    for (size_t t = 0; f->mf >= 0 && t < e->n_tensors; t++) {
      if (e->tensors[t].file != (size_t)f->mf) continue;
      slot[t] = used;
      ranges[used++] = (zck__hash_range){e->tensors[t].offset, e->tensors[t].nbytes, ZCK__HASH_XXH3, 0, 0, false};
    }
    h->n_ranges = (size_t)(ranges + used - h->ranges);
  }
  if (st == ZCK_OK) {
    zck_manifest_hash_opts ho = ZCK_MANIFEST_HASH_OPTS_INIT;
    ho.threads = c->o.threads;
    ho.keep_going = true;
    ho.progress = c->o.progress;
    ho.progress_ctx = c->o.progress_ctx;
    st = zck__hash_files(hf, n_hash, &ho);
  }
  for (size_t i = 0; st == ZCK_OK && i < c->n_files; i++) {
    vfile *f = &c->files[i];
    bool recs = f->n_recs > 0;
    if (!recs && f->mf < 0) {
      if (a && (st = zck_manifest_add_file(a, f->rel, NULL)) != ZCK_OK) break; /* extra: reported by compare */
      continue;
    }
    zck__hash_file *h = &hf[hf_of[i]];
    c->r->pub.files++;
    if (h->ok) c->r->pub.bytes += h->size;
    if (!h->ok && f->mf < 0) {
      if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = h->status;
      zck__vreport_add(c->r, severity_of(h->status) == ZCK_VERIFY_DAMAGE ? ZCK_VERIFY_DAMAGE : ZCK_VERIFY_UNCHECKABLE,
                       "read", f->full, NULL, -1, 0, "%s", h->error ? h->error : "cannot read");
    }
    if (h->ok && recs) check_records(c, f, ranges + rec_base[i]);
    if (f->mf < 0) continue;
    zck_manifest_file *af = &a->files[f->mf];
    af->hashed = h->ok;
    af->size = h->size;
    af->xxh3 = h->xxh3;
    if (!h->ok) { af->error = h->error; h->error = NULL; }
    if (h->ok && h->n_chunks > 1) { af->chunks = h->chunks; af->n_chunks = h->n_chunks; h->chunks = NULL; }
  }
  for (size_t t = 0; st == ZCK_OK && e && t < e->n_tensors; t++) {
    if (!present[e->tensors[t].file]) continue;
    a->tensors[t].hashed = ranges[slot[t]].done;
    a->tensors[t].xxh3 = ranges[slot[t]].xxh3;
    c->r->pub.tensors += ranges[slot[t]].done;
  }
  if (st == ZCK_OK && e) {
    /* files of the manifest that are not on disk: drop them from `actual` */
    for (size_t i = 0; i < e->n_files; i++) a->files[i].missing = !present[i];
    if (c->have_ds_layout) {
      c->ds_layout.tag = e->has_layout ? e->layout.tag : NULL; /* the tag folder may be renamed */
      st = zck_manifest_set_layout(a, &c->ds_layout);
    } else {
      a->has_layout = false;
    }
  }
  if (st == ZCK_OK && e) {
    diff_ctx dc = {c, zck__calloc(e->n_files ? e->n_files : 1, sizeof(size_t)), 0};
    if (!dc.tensor_findings) st = ZCK_ERR_NO_MEMORY;
    else zck_manifest_compare(e, a, c->base, 0, on_diff, &dc);
    if (dc.suppressed)
      zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "tensor-xxh3", NULL, NULL, -1, 0,
                       "%zu more damaged tensors not listed (at most %d per file)", dc.suppressed, VERIFY_MAX_TENSOR_FINDINGS);
    free(dc.tensor_findings);
  }
  for (size_t i = 0; hf && i < n_hash; i++) zck__hash_file_clear(&hf[i]);
  free(hf);
  free(hf_of);
  free(ranges);
  free(slot);
  free(rec_base);
  free(present);
  zck_manifest_free(a);
  return st;
}

// ---- the job

static void vctx_free(vctx *c) {
  for (size_t i = 0; i < c->n_files; i++) {
    vfile *f = &c->files[i];
    free(f->rel);
    free(f->full);
    free(f->open_error);
    for (size_t k = 0; k < f->n_warnings; k++) free(f->warnings[k]);
    free(f->warnings);
    for (size_t k = 0; k < f->n_recs; k++) {
      free(f->recs[k].name);
      free(f->recs[k].tensors);
    }
    free(f->recs);
  }
  free(c->files);
  free(c->base);
  free(c->single);
  zck_manifest_free(c->expected);
}

static zck_status run(vctx *c) {
  ZCK_TRY(resolve(c));
  if (!c->base) return ZCK_OK; /* PATH does not exist (reported) */
  zck__vreport_set(&c->r->dir, c->base);
  c->r->pub.single_file = c->single != NULL;
  ZCK_TRY(load_manifest(c));
  if (c->r->first_unchecked != ZCK_OK) return ZCK_OK; /* a malformed manifest: nothing to check against */
  ZCK_TRY(list_files(c));
  ZCK_TRY(check_structure(c));
  if (c->o.skip_data) {
    zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0, "data not read (--structure-only): no CRCs, no checksums");
    for (size_t i = 0; i < c->n_files; i++) c->r->pub.files++;
    return ZCK_OK;
  }
  return check_data(c);
}

zck_status zck_verify(const char *path, const zck_verify_opts *opts, zck_verify_report **out) {
  ZCK_ASSERT(path && out);
  *out = NULL;
  vctx c;
  memset(&c, 0, sizeof c);
  c.path = path;
  zck_verify_opts dflt = ZCK_VERIFY_OPTS_INIT;
  c.o = opts ? *opts : dflt;
  ZCK_ASSERT(c.o.version >= 1);
  c.r = zck__vreport_new(path);
  if (!c.r) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  zck_status st = run(&c);
  vctx_free(&c);
  if (st == ZCK_ERR_NO_MEMORY) {
    zck_verify_report_free(&c.r->pub);
    return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory while verifying", path);
  }
  if (st != ZCK_OK) { /* a failure of verify itself, not of the checkpoint */
    if (c.r->first_unchecked == ZCK_OK) c.r->first_unchecked = st;
    zck__vreport_add(c.r, ZCK_VERIFY_UNCHECKABLE, "read", NULL, NULL, -1, 0, "%s", zck_last_error());
  }
  *out = &c.r->pub;
  return zck__vreport_finish(c.r);
}
