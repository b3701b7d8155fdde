/* manifest.c: the manifest's data model, directory listing, completeness protocol and
 * comparison. JSON lives in manifest_json.c, hashing in manifest_hash.c. See manifest.h. */
#include "manifest.h"
#include "strmap.h"

#include "io.h"
#include "dist.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZCK__MANIFEST_MAX_DEPTH 32

const char *zck_manifest_kind_name(zck_manifest_kind k) {
  switch (k) {
  case ZCK_MANIFEST_DEEPSPEED: return "deepspeed";
  case ZCK_MANIFEST_SAFETENSORS: return "safetensors";
  case ZCK_MANIFEST_UNIVERSAL: return "universal";
  case ZCK_MANIFEST_TORCH: return "torch";
  case ZCK_MANIFEST_OTHER: break;
  }
  return "other";
}

zck_status zck_manifest_new(zck_manifest **out) {
  *out = NULL;
  zck_manifest *m = zck__calloc(1, sizeof *m);
  if (!m) return ZCK_ERR_NO_MEMORY;
  m->tool = zck__strdup("zckpt");
  m->version = zck__strdup(ZCK_VERSION_STRING);
  m->chunk_size = ZCK_MANIFEST_DEFAULT_CHUNK;
  if (!m->tool || !m->version) {
    zck_manifest_free(m);
    return ZCK_ERR_NO_MEMORY;
  }
  *out = m;
  return ZCK_OK;
}

static void layout_clear(zck_manifest_layout *l) {
  free(l->tag);
  free(l->lp_dtype);
  free(l->master_dtype);
  memset(l, 0, sizeof *l);
}

void zck_manifest_free(zck_manifest *m) {
  if (!m) return;
  for (size_t i = 0; i < m->n_files; i++) {
    free(m->files[i].path);
    free(m->files[i].chunks);
    free(m->files[i].error);
  }
  for (size_t i = 0; i < m->n_tensors; i++) {
    free(m->tensors[i].name);
    free(m->tensors[i].dtype);
    free(m->tensors[i].shape);
  }
  free(m->files);
  free(m->tensors);
  if (m->file_index) zck__strmap_free(m->file_index);
  free(m->file_index);
  layout_clear(&m->layout);
  free(m->tool);
  free(m->version);
  free(m);
}

/* Relative, '/'-separated, no empty / "." / ".." component, no backslash or control byte:
 * a manifest must never name a file outside its directory. */
static bool safe_relpath(const char *p) {
  if (!*p || *p == '/') return false;
  for (const char *c = p; *c; c++)
    if (*c == '\\' || (unsigned char)*c < 0x20) return false;
  for (const char *s = p; *s;) {
    const char *e = strchr(s, '/');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return false;
    s += n;
    if (*s == '/') s++;
    if (e && !*s) return false; /* trailing slash */
  }
  return true;
}

void zck__manifest_shown(char *dst, size_t n, const char *s) {
  size_t o = 0;
  for (; *s && o + 5 < n; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch < 0x20 || ch == 0x7f) o += (size_t)snprintf(dst + o, n - o, "\\x%02x", ch);
    else dst[o++] = (char)ch;
  }
  if (*s && n >= 4) { o = o + 3 < n ? o : n - 4; memcpy(dst + o, "...", 3); o += 3; }
  dst[o < n ? o : n - 1] = 0;
}

ptrdiff_t zck_manifest_find_file(const zck_manifest *m, const char *relpath) {
  size_t i;
  if (m->file_index) return zck__strmap_get(m->file_index, relpath, &i) ? (ptrdiff_t)i : -1;
  for (i = 0; i < m->n_files; i++)
    if (!strcmp(m->files[i].path, relpath)) return (ptrdiff_t)i;
  return -1;
}

static zck_status add_file(zck_manifest *m, const char *relpath, size_t *index, bool check_twice) {
  char shown[256];
  zck__manifest_shown(shown, sizeof shown, relpath);
  if (!safe_relpath(relpath)) return zck__fail(ZCK_ERR_INVALID_ARG, "manifest: unsafe file path \"%s\"", shown);
  if (check_twice && zck_manifest_find_file(m, relpath) >= 0)
    return zck__fail(ZCK_ERR_INVALID_ARG, "manifest: file \"%s\" listed twice", shown);
  if (!ZCK__GROW(m->files, m->cap_files, m->n_files + 1)) return ZCK_ERR_NO_MEMORY;
  if (!m->file_index && !(m->file_index = zck__calloc(1, sizeof *m->file_index))) return ZCK_ERR_NO_MEMORY;
  zck_manifest_file *f = &m->files[m->n_files];
  memset(f, 0, sizeof *f);
  if (!(f->path = zck__strdup(relpath))) return ZCK_ERR_NO_MEMORY;
  bool dup;
  size_t first;
  zck_status st = zck__strmap_put(m->file_index, f->path, m->n_files, &dup, &first); /* the key is f->path's */
  if (st != ZCK_OK) {
    free(f->path);
    f->path = NULL;
    return st;
  }
  if (index) *index = m->n_files;
  m->n_files++;
  return ZCK_OK;
}

zck_status zck_manifest_add_file(zck_manifest *m, const char *relpath, size_t *index) {
  return add_file(m, relpath, index, true);
}

zck_status zck__manifest_add_listed_file(zck_manifest *m, const char *relpath, size_t *index) {
  return add_file(m, relpath, index, false);
}

zck_status zck__manifest_add_tensor_n(zck_manifest *m, size_t file, const char *name, size_t name_n, const char *dtype,
                                      size_t dtype_n, int ndim, const int64_t *shape, uint64_t offset, uint64_t nbytes,
                                      size_t *index) {
  ZCK_ASSERT(file < m->n_files && name && dtype && ndim >= 0 && ndim <= ZCK_MANIFEST_MAX_DIMS);
  if (!ZCK__GROW(m->tensors, m->cap_tensors, m->n_tensors + 1)) return ZCK_ERR_NO_MEMORY;
  zck_manifest_tensor *t = &m->tensors[m->n_tensors];
  memset(t, 0, sizeof *t);
  t->file = file;
  t->ndim = ndim;
  t->offset = offset;
  t->nbytes = nbytes;
  t->name = zck__strndup(name, name_n);
  t->dtype = zck__strndup(dtype, dtype_n);
  t->shape = zck__malloc((ndim ? (size_t)ndim : 1) * sizeof *t->shape);
  if (!t->name || !t->dtype || !t->shape) {
    free(t->name);
    free(t->dtype);
    free(t->shape);
    return ZCK_ERR_NO_MEMORY;
  }
  if (ndim) memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
  if (index) *index = m->n_tensors;
  m->n_tensors++;
  return ZCK_OK;
}

zck_status zck_manifest_add_tensor(zck_manifest *m, size_t file, const char *name, const char *dtype, int ndim,
                                   const int64_t *shape, uint64_t offset, uint64_t nbytes, size_t *index) {
  ZCK_ASSERT(name && dtype);
  return zck__manifest_add_tensor_n(m, file, name, strlen(name), dtype, strlen(dtype), ndim, shape, offset, nbytes, index);
}

static char *dup_or_null(const char *s, bool *failed) {
  if (!s) return NULL;
  char *d = zck__strdup(s);
  if (!d) *failed = true;
  return d;
}

zck_status zck_manifest_set_layout(zck_manifest *m, const zck_manifest_layout *l) {
  layout_clear(&m->layout);
  bool failed = false;
  m->layout = *l;
  m->layout.tag = dup_or_null(l->tag, &failed);
  m->layout.lp_dtype = dup_or_null(l->lp_dtype, &failed);
  m->layout.master_dtype = dup_or_null(l->master_dtype, &failed);
  m->has_layout = !failed;
  if (failed) {
    layout_clear(&m->layout);
    return ZCK_ERR_NO_MEMORY;
  }
  return ZCK_OK;
}

zck_status zck_manifest_clone_unhashed(const zck_manifest *m, zck_manifest **out) {
  zck_manifest *c = NULL;
  ZCK_TRY(zck_manifest_new(&c));
  zck_status st = ZCK_OK;
  c->kind = m->kind;
  c->chunk_size = m->chunk_size;
  if (m->has_layout) st = zck_manifest_set_layout(c, &m->layout);
  for (size_t i = 0; st == ZCK_OK && i < m->n_files; i++) st = zck_manifest_add_file(c, m->files[i].path, NULL);
  for (size_t i = 0; st == ZCK_OK && i < m->n_tensors; i++) {
    const zck_manifest_tensor *t = &m->tensors[i];
    st = zck_manifest_add_tensor(c, t->file, t->name, t->dtype, t->ndim, t->shape, t->offset, t->nbytes, NULL);
  }
  if (st != ZCK_OK) {
    zck_manifest_free(c);
    return st;
  }
  *out = c;
  return ZCK_OK;
}

// ---- listing a directory

typedef struct path_list {
  char **v;
  size_t n, cap;
} path_list;

static bool is_own_file(const char *name) {
  if (!strcmp(name, ZCK_MANIFEST_NAME) || !strcmp(name, ZCK_MANIFEST_PARTIAL_NAME)) return true;
  return name[0] == '.' && strstr(name, ".zck-tmp-") != NULL; /* zck__outfile / outdir temporaries */
}

static zck_status list_rec(const char *root, const char *rel, int depth, path_list *pl) {
  if (depth > ZCK__MANIFEST_MAX_DEPTH)
    return zck__fail(ZCK_ERR_LIMIT, "%s/%s: directories nested more than %d deep", root, rel, ZCK__MANIFEST_MAX_DEPTH);
  char *full = *rel ? zck__path_join(root, rel) : zck__strdup(root);
  if (!full) return ZCK_ERR_NO_MEMORY;
  DIR *d = opendir(full);
  if (!d) {
    zck_status s = zck__fail_errno(errno, "%s: cannot list directory", full);
    free(full);
    return s;
  }
  zck_status st = ZCK_OK;
  struct dirent *e;
  while (st == ZCK_OK && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (!*rel && is_own_file(e->d_name)) continue;
    if (*rel && e->d_name[0] == '.' && strstr(e->d_name, ".zck-tmp-")) continue;
    char *child_rel = *rel ? zck__concat(rel, "/", e->d_name, (const char *)NULL) : zck__strdup(e->d_name);
    char *child = child_rel ? zck__path_join(root, child_rel) : NULL;
    /* the entry's type from the listing where the file system gives it (a universal
     * folder of 100k params lists 400k entries: no lstat each) */
    struct stat sb;
    sb.st_mode = e->d_type == DT_DIR ? S_IFDIR : e->d_type == DT_REG ? S_IFREG : e->d_type == DT_UNKNOWN ? 0 : S_IFLNK;
    if (!child) {
      st = ZCK_ERR_NO_MEMORY;
    } else if (!sb.st_mode && lstat(child, &sb) != 0) {
      st = zck__fail_errno(errno, "%s: cannot stat", child);
    } else if (S_ISDIR(sb.st_mode)) {
      st = list_rec(root, child_rel, depth + 1, pl);
    } else if (S_ISREG(sb.st_mode)) {
      if (pl->n == pl->cap) {
        size_t cap = pl->cap ? 2 * pl->cap : 32;
        char **v = zck__realloc(pl->v, cap * sizeof *v);
        if (!v) st = ZCK_ERR_NO_MEMORY;
        else { pl->v = v; pl->cap = cap; }
      }
      if (st == ZCK_OK) { pl->v[pl->n++] = child_rel; child_rel = NULL; }
    } /* symlinks, sockets, devices: not checkpoint data, never followed */
    free(child_rel);
    free(child);
  }
  closedir(d);
  free(full);
  return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

zck_status zck_manifest_list_files(const char *dir, char ***paths, size_t *n) {
  path_list pl = {NULL, 0, 0};
  zck_status st = list_rec(dir, "", 0, &pl);
  if (st != ZCK_OK) {
    zck_manifest_free_paths(pl.v, pl.n);
    return st;
  }
  qsort(pl.v, pl.n, sizeof *pl.v, cmp_str);
  *paths = pl.v;
  *n = pl.n;
  return ZCK_OK;
}

void zck_manifest_free_paths(char **paths, size_t n) {
  for (size_t i = 0; i < n; i++) free(paths[i]);
  free(paths);
}

// ---- completeness

zck_status zck_manifest_mark_partial(const char *dir) {
  if (!zck__dist_writes()) return ZCK_OK; /* a distributed job's rank 0 marks it */
  char *p = zck__path_join(dir, ZCK_MANIFEST_PARTIAL_NAME);
  if (!p) return ZCK_ERR_NO_MEMORY;
  zck_status st = ZCK_OK;
  FILE *f = fopen(p, "w");
  if (!f) st = zck__fail_errno(errno, "%s: cannot create", p);
  else if (fputs("zckpt is writing this directory; it is complete once zckpt-manifest.json exists\n", f) < 0 ||
           fclose(f) != 0)
    st = zck__fail_errno(errno, "%s: cannot write", p);
  if (st == ZCK_OK) st = zck__fsync_path(p, false);
  if (st == ZCK_OK) st = zck__fsync_path(dir, true);
  free(p);
  return st;
}

static bool path_exists(const char *dir, const char *name) {
  char *p = zck__path_join(dir, name);
  struct stat sb;
  bool r = p && lstat(p, &sb) == 0;
  free(p);
  return r;
}

zck_status zck_manifest_check_complete(const char *dir, int force) {
  if (force) return ZCK_OK;
  zck_manifest *m = NULL;
  zck_status st = zck_manifest_read(dir, &m);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    if (!path_exists(dir, ZCK_MANIFEST_PARTIAL_NAME)) return ZCK_OK; /* not written by zckpt */
    return zck__fail(ZCK_ERR_DAMAGED,
                     "%s: incomplete checkpoint: zckpt started writing it and never wrote " ZCK_MANIFEST_NAME
                     " (interrupted save?); use --force to read it anyway",
                     dir);
  }
  if (st != ZCK_OK) return zck__error_prepend(st, "%s: cannot tell whether the checkpoint is complete (use --force to read it anyway)", dir);
  st = zck__manifest_check_sizes(dir, m);
  zck_manifest_free(m);
  return st;
}

zck_status zck__manifest_check_sizes(const char *dir, const zck_manifest *m) {
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < m->n_files; i++) {
    char *p = zck__path_join(dir, m->files[i].path);
    struct stat sb;
    if (!p) st = ZCK_ERR_NO_MEMORY;
    else if (stat(p, &sb) != 0)
      st = zck__fail(ZCK_ERR_DAMAGED, "%s: incomplete checkpoint: missing (listed in " ZCK_MANIFEST_NAME "); use --force to read it anyway", p);
    else if ((uint64_t)sb.st_size != m->files[i].size)
      st = zck__fail(ZCK_ERR_DAMAGED, "%s: damaged checkpoint: %llu bytes, " ZCK_MANIFEST_NAME " says %llu; run 'zckpt verify' (--force to read it anyway)",
                     p, (unsigned long long)sb.st_size, (unsigned long long)m->files[i].size);
    free(p);
  }
  return st;
}

// ---- comparison

typedef struct diff_sink {
  const char *dir;
  zck_manifest_diff_fn fn;
  void *ctx;
  size_t count;
} diff_sink;

static void emit(diff_sink *s, zck_manifest_diff_kind kind, const char *file, const char *tensor, int64_t off,
                 uint64_t len, const char *fmt, ...) ZCK__PRINTF(7, 8);

static void emit(diff_sink *s, zck_manifest_diff_kind kind, const char *file, const char *tensor, int64_t off,
                 uint64_t len, const char *fmt, ...) {
  char what[768], msg[1536];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  const char *d = s->dir ? s->dir : "";
  const char *sep = (s->dir && file) ? "/" : "";
  char tname[256];
  if (tensor) zck__manifest_shown(tname, sizeof tname, tensor);
  if (tensor) snprintf(msg, sizeof msg, "%s%s%s: tensor %s: %s", d, sep, file ? file : "", tname, what);
  else if (file || s->dir) snprintf(msg, sizeof msg, "%s%s%s: %s", d, sep, file ? file : "", what);
  else snprintf(msg, sizeof msg, "%s", what);
  zck_manifest_diff df = {kind, file, tensor, off, len, msg};
  s->count++;
  if (s->fn) s->fn(s->ctx, &df);
}

static bool str_eq(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

static void compare_layout(diff_sink *s, const zck_manifest *e, const zck_manifest *a) {
  if (e->kind != a->kind)
    emit(s, ZCK_MDIFF_KIND, NULL, NULL, -1, 0, "kind %s, manifest says %s", zck_manifest_kind_name(a->kind),
         zck_manifest_kind_name(e->kind));
  if (!e->has_layout || !a->has_layout) return;
  const zck_manifest_layout *x = &e->layout, *y = &a->layout;
  if (x->stage != y->stage || x->world_size != y->world_size || x->groups != y->groups ||
      !str_eq(x->lp_dtype, y->lp_dtype) || !str_eq(x->master_dtype, y->master_dtype) || x->bf16_prefix != y->bf16_prefix)
    emit(s, ZCK_MDIFF_LAYOUT, NULL, NULL, -1, 0,
         "layout is stage %d, world size %u, %llu groups, %s/%s; manifest says stage %d, world size %u, %llu groups, %s/%s",
         y->stage, y->world_size, (unsigned long long)y->groups, y->lp_dtype ? y->lp_dtype : "?",
         y->master_dtype ? y->master_dtype : "?", x->stage, x->world_size, (unsigned long long)x->groups,
         x->lp_dtype ? x->lp_dtype : "?", x->master_dtype ? x->master_dtype : "?");
}

static void compare_file(diff_sink *s, const zck_manifest *e, const zck_manifest *a, const zck_manifest_file *x,
                         const zck_manifest_file *y, unsigned max_chunks) {
  if (!y->hashed) {
    emit(s, ZCK_MDIFF_UNREADABLE_FILE, x->path, NULL, -1, 0, "could not be read: %s", y->error ? y->error : "not hashed");
    return;
  }
  if (x->size != y->size)
    emit(s, ZCK_MDIFF_SIZE, x->path, NULL, (int64_t)(x->size < y->size ? x->size : y->size),
         x->size > y->size ? x->size - y->size : y->size - x->size, "%s: %llu bytes, manifest says %llu",
         y->size < x->size ? "truncated" : "grown", (unsigned long long)y->size, (unsigned long long)x->size);
  else if (x->xxh3 == y->xxh3)
    return;
  /* chunks locate the damage; without them (one chunk) the file hash is all we have */
  unsigned shown = 0;
  size_t bad = 0;
  uint64_t cs = e->chunk_size == a->chunk_size ? e->chunk_size : 0;
  size_t common = x->n_chunks < y->n_chunks ? x->n_chunks : y->n_chunks;
  for (size_t k = 0; cs && k < common; k++) {
    uint64_t off = (uint64_t)k * cs, len = cs, len_y = cs;
    if (off + len > x->size) len = x->size - off;
    if (off + len_y > y->size) len_y = y->size - off;
    if (len != len_y) break; /* a chunk cut short by truncation differs anyway */
    if (x->chunks[k] == y->chunks[k]) continue;
    bad++;
    if (shown < max_chunks) {
      shown++;
      emit(s, ZCK_MDIFF_CHUNK, x->path, NULL, (int64_t)off, len, "bytes %llu..%llu (chunk %zu) differ from the manifest",
           (unsigned long long)off, (unsigned long long)(off + len), k);
    }
  }
  if (bad > shown)
    emit(s, ZCK_MDIFF_CHUNK, x->path, NULL, -1, 0, "%zu more chunks of %llu bytes differ", bad - shown,
         (unsigned long long)cs);
  if (x->size == y->size)
    emit(s, ZCK_MDIFF_FILE_HASH, x->path, NULL, 0, x->size, "xxh3 %016llx, manifest says %016llx",
         (unsigned long long)y->xxh3, (unsigned long long)x->xxh3);
}

/* Tensors of `a` sorted by (file path, name) for lookups. */
typedef struct tensor_key {
  const char *file, *name;
  size_t index;
} tensor_key;

static int cmp_tensor_key(const void *p, const void *q) {
  const tensor_key *a = p, *b = q;
  int c = strcmp(a->file, b->file);
  return c ? c : strcmp(a->name, b->name);
}

static void compare_tensor(diff_sink *s, const zck_manifest *e, const zck_manifest_tensor *x, const zck_manifest *a,
                           const zck_manifest_tensor *y) {
  const char *file = e->files[x->file].path;
  bool meta = strcmp(x->dtype, y->dtype) || x->ndim != y->ndim || x->offset != y->offset || x->nbytes != y->nbytes;
  for (int d = 0; !meta && d < x->ndim; d++) meta = x->shape[d] != y->shape[d];
  if (meta) {
    emit(s, ZCK_MDIFF_TENSOR_META, file, x->name, (int64_t)y->offset, y->nbytes,
         "%s, %d dims, bytes %llu..%llu; manifest says %s, %d dims, bytes %llu..%llu", y->dtype, y->ndim,
         (unsigned long long)y->offset, (unsigned long long)(y->offset + y->nbytes), x->dtype, x->ndim,
         (unsigned long long)x->offset, (unsigned long long)(x->offset + x->nbytes));
    return;
  }
  const zck_manifest_file *yf = &a->files[y->file];
  if (!yf->hashed) return; /* the file's own diff says why */
  if (!y->hashed) {
    emit(s, ZCK_MDIFF_TENSOR_UNREADABLE, file, x->name, (int64_t)x->offset, x->nbytes,
         "bytes %llu..%llu pass the end of the file (%llu bytes): truncated", (unsigned long long)x->offset,
         (unsigned long long)(x->offset + x->nbytes), (unsigned long long)yf->size);
    return;
  }
  if (x->xxh3 != y->xxh3)
    emit(s, ZCK_MDIFF_TENSOR_HASH, file, x->name, (int64_t)x->offset, x->nbytes,
         "bytes %llu..%llu damaged: xxh3 %016llx, manifest says %016llx", (unsigned long long)x->offset,
         (unsigned long long)(x->offset + x->nbytes), (unsigned long long)y->xxh3, (unsigned long long)x->xxh3);
}

size_t zck_manifest_compare(const zck_manifest *e, const zck_manifest *a, const char *dir, unsigned max_chunks,
                            zck_manifest_diff_fn fn, void *ctx) {
  diff_sink s = {dir, fn, ctx, 0};
  if (!max_chunks) max_chunks = 16;
  compare_layout(&s, e, a);
  ptrdiff_t *file_map = zck__malloc((e->n_files ? e->n_files : 1) * sizeof *file_map);
  uint8_t *seen = zck__calloc(a->n_files ? a->n_files : 1, 1);
  tensor_key *keys = zck__malloc((a->n_tensors ? a->n_tensors : 1) * sizeof *keys);
  uint8_t *tseen = zck__calloc(a->n_tensors ? a->n_tensors : 1, 1);
  if (!file_map || !seen || !keys || !tseen) {
    emit(&s, ZCK_MDIFF_UNREADABLE_FILE, NULL, NULL, -1, 0, "out of memory while comparing manifests");
    goto out;
  }
  for (size_t i = 0; i < e->n_files; i++) {
    const zck_manifest_file *x = &e->files[i];
    bool same = i < a->n_files && !strcmp(a->files[i].path, x->path); /* clones keep the order */
    file_map[i] = same ? (ptrdiff_t)i : zck_manifest_find_file(a, x->path);
    if (file_map[i] >= 0 && a->files[file_map[i]].missing) {
      seen[file_map[i]] = 1;
      file_map[i] = -1;
    }
    if (file_map[i] < 0) {
      emit(&s, ZCK_MDIFF_MISSING_FILE, x->path, NULL, -1, x->size, "missing (listed in " ZCK_MANIFEST_NAME ")");
      continue;
    }
    seen[file_map[i]] = 1;
    compare_file(&s, e, a, x, &a->files[file_map[i]], max_chunks);
  }
  for (size_t i = 0; i < a->n_files; i++)
    if (!seen[i] && !a->files[i].missing) emit(&s, ZCK_MDIFF_EXTRA_FILE, a->files[i].path, NULL, -1, 0, "not listed in " ZCK_MANIFEST_NAME);
  for (size_t i = 0; i < a->n_tensors; i++)
    keys[i] = (tensor_key){a->files[a->tensors[i].file].path, a->tensors[i].name, i};
  qsort(keys, a->n_tensors, sizeof *keys, cmp_tensor_key);
  for (size_t i = 0; i < e->n_tensors; i++) {
    const zck_manifest_tensor *x = &e->tensors[i];
    if (file_map[x->file] < 0) continue; /* reported with its file */
    const zck_manifest_tensor *y = NULL;
    if (i < a->n_tensors && a->tensors[i].file == (size_t)file_map[x->file] && !strcmp(a->tensors[i].name, x->name)) {
      y = &a->tensors[i];
      tseen[i] = 1;
    } else {
      tensor_key k = {e->files[x->file].path, x->name, 0};
      const tensor_key *hit = bsearch(&k, keys, a->n_tensors, sizeof *keys, cmp_tensor_key);
      if (hit) { y = &a->tensors[hit->index]; tseen[hit->index] = 1; }
    }
    if (!y) {
      emit(&s, ZCK_MDIFF_MISSING_TENSOR, e->files[x->file].path, x->name, (int64_t)x->offset, x->nbytes, "missing");
      continue;
    }
    compare_tensor(&s, e, x, a, y);
  }
  for (size_t i = 0; i < a->n_tensors; i++)
    if (!tseen[i] && seen[a->tensors[i].file])
      emit(&s, ZCK_MDIFF_EXTRA_TENSOR, a->files[a->tensors[i].file].path, a->tensors[i].name, (int64_t)a->tensors[i].offset,
           a->tensors[i].nbytes, "not listed in " ZCK_MANIFEST_NAME);
out:
  free(file_map);
  free(seen);
  free(keys);
  free(tseen);
  return s.count;
}
