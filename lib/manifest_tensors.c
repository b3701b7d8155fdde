/* manifest_tensors.c: zckpt-manifest.json's file and tensor tables read without a JSON tree.
 *
 * A 100k-parameter ZeRO-3 checkpoint resharded to 4 ranks lists ~400k tensors (83 MB of
 * manifest), and its universal folder ~400k files and ~400k tensors (138 MB). As a cJSON
 * tree that is ~10 nodes and ~7 strings per entry, each its own allocation: the parse and
 * the tree's delete were a third of reading such a checkpoint back, and the tree several
 * hundred MB (a universal folder's files array alone: 860 MB peak for consolidate at 100k
 * params, 445 MB without its manifest). Here the "files" and "tensors" arrays are scanned
 * straight into the manifest; the rest (header, layout: a few lines) still goes through
 * cJSON and manifest_json.c's checks, with the arrays replaced by [].
 *
 * Only a plain subset is taken: a file's path, size, xxh3 and optional chunks, a tensor's
 * seven keys (any order, each once), strings without escapes or control bytes, integers as
 * plain digits below 2^53, standard JSON whitespace. Anything else, and every error (a bad
 * field, a path listed twice, a range past its file, an unknown file), declines:
 * zck_manifest_parse then reads the whole text with cJSON, so the accepted inputs, the
 * result and every message are the tree reader's own.
 */
#include "manifest.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

typedef struct scan {
  const char *p, *end;
} scan;

static void skip_ws(scan *s) {
  while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static bool take(scan *s, char ch) {
  skip_ws(s);
  if (s->p < s->end && *s->p == ch) {
    s->p++;
    return true;
  }
  return false;
}

/* A string with no escape and no control byte: its bytes are its value. */
static bool plain_string(scan *s, const char **at, size_t *n) {
  skip_ws(s);
  if (s->p >= s->end || *s->p != '"') return false;
  const char *q = s->p + 1;
  while (q < s->end && *q != '"') {
    unsigned char ch = (unsigned char)*q;
    if (ch == '\\' || ch < 0x20) return false;
    q++;
  }
  if (q >= s->end) return false;
  *at = s->p + 1;
  *n = (size_t)(q - *at);
  s->p = q + 1;
  return true;
}

/* Digits only, no leading zero, below 2^53 (what get_uint accepts, less the spellings
 * cJSON's strtod also takes: "-0", "1e3", "007"), followed by a delimiter. */
static bool plain_uint(scan *s, uint64_t *out) {
  skip_ws(s);
  const char *q = s->p;
  uint64_t v = 0;
  int digits = 0;
  while (q < s->end && *q >= '0' && *q <= '9') {
    if (++digits > 16) return false;
    v = v * 10 + (uint64_t)(*q - '0');
    q++;
  }
  if (!digits || (digits > 1 && *s->p == '0') || v >= ((uint64_t)1 << 53)) return false;
  if (q >= s->end || !(*q == ',' || *q == '}' || *q == ']' || *q == ' ' || *q == '\n' || *q == '\r' || *q == '\t'))
    return false;
  s->p = q;
  *out = v;
  return true;
}

static bool hex16(const char *at, size_t n, uint64_t *out) {
  if (n != 16) return false;
  uint64_t v = 0;
  for (size_t i = 0; i < 16; i++) {
    char ch = at[i];
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return true;
}

/* Any JSON value, skipped (the header's values: cJSON reads them afterwards). Strings are
 * lexed exactly (escapes skipped), so a "tensors" inside a string is never taken for the key. */
static bool skip_string(scan *s) {
  if (s->p >= s->end || *s->p != '"') return false;
  for (const char *q = s->p + 1; q < s->end; q++) {
    if (*q == '\\') {
      q++;
      continue;
    }
    if (*q == '"') {
      s->p = q + 1;
      return true;
    }
  }
  return false;
}

static bool skip_value(scan *s) {
  skip_ws(s);
  if (s->p >= s->end) return false;
  if (*s->p == '"') return skip_string(s);
  if (*s->p != '{' && *s->p != '[') {
    while (s->p < s->end && !strchr(",}] \n\r\t", *s->p)) s->p++;
    return true;
  }
  size_t depth = 0;
  while (s->p < s->end) {
    char ch = *s->p;
    if (ch == '"') {
      if (!skip_string(s)) return false;
      continue;
    }
    if (ch == '{' || ch == '[') depth++;
    if (ch == '}' || ch == ']') depth--;
    s->p++;
    if (!depth) return true;
  }
  return false;
}

typedef struct entry {
  const char *file, *name, *dtype;
  size_t file_n, name_n, dtype_n;
  size_t shape_at;            /* into the shape pool */
  int ndim;
  uint64_t offset, nbytes, xxh3;
} entry;

typedef struct fentry {
  const char *path;
  size_t path_n;
  uint64_t size, xxh3;
  size_t chunks_at, n_chunks; /* into the chunk pool */
  bool has_chunks;
} fentry;

typedef struct table {
  entry *v;
  size_t n, cap;
  int64_t *dims;
  size_t n_dims, cap_dims;
  fentry *f;
  size_t n_f, cap_f;
  uint64_t *chunks;
  size_t n_chunks, cap_chunks;
} table;

enum { F_PATH, F_SIZE, F_XXH3, F_CHUNKS, F_NEEDED = (1 << 3) - 1 };

static int file_key_of(const char *k, size_t n) {
  static const char *const keys[] = {"path", "size", "xxh3", "chunks"};
  for (int i = 0; i < 4; i++)
    if (strlen(keys[i]) == n && !memcmp(keys[i], k, n)) return i;
  return -1;
}

static bool read_file(scan *s, table *t) {
  if (!take(s, '{') || !zck__grow((void **)&t->f, &t->cap_f, t->n_f + 1, sizeof *t->f)) return false;
  fentry *e = &t->f[t->n_f];
  memset(e, 0, sizeof *e);
  unsigned seen = 0;
  do {
    const char *k, *str;
    size_t kn, n;
    if (!plain_string(s, &k, &kn) || !take(s, ':')) return false;
    int key = file_key_of(k, kn);
    if (key < 0 || (seen & (1u << key))) return false;
    seen |= 1u << key;
    switch (key) {
    case F_PATH: if (!plain_string(s, &e->path, &e->path_n)) return false; break;
    case F_SIZE: if (!plain_uint(s, &e->size)) return false; break;
    case F_XXH3: if (!plain_string(s, &str, &n) || !hex16(str, n, &e->xxh3)) return false; break;
    default: /* F_CHUNKS */
      if (!take(s, '[')) return false;
      e->has_chunks = true;
      e->chunks_at = t->n_chunks;
      if (take(s, ']')) break;
      do {
        if (!plain_string(s, &str, &n) || !zck__grow((void **)&t->chunks, &t->cap_chunks, t->n_chunks + 1, sizeof *t->chunks) ||
            !hex16(str, n, &t->chunks[t->n_chunks]))
          return false;
        t->n_chunks++;
        e->n_chunks++;
      } while (take(s, ','));
      if (!take(s, ']')) return false;
    }
  } while (take(s, ','));
  if (!take(s, '}') || (seen & F_NEEDED) != F_NEEDED) return false;
  t->n_f++;
  return true;
}

enum { K_FILE, K_NAME, K_DTYPE, K_SHAPE, K_OFFSET, K_NBYTES, K_XXH3, K_ALL = (1 << 7) - 1 };

static int key_of(const char *k, size_t n) {
  static const char *const keys[] = {"file", "name", "dtype", "shape", "offset", "nbytes", "xxh3"};
  for (int i = 0; i < 7; i++)
    if (strlen(keys[i]) == n && !memcmp(keys[i], k, n)) return i;
  return -1;
}

static bool read_tensor(scan *s, table *t) {
  if (!take(s, '{') || !zck__grow((void **)&t->v, &t->cap, t->n + 1, sizeof *t->v)) return false;
  entry *e = &t->v[t->n];
  memset(e, 0, sizeof *e);
  e->shape_at = t->n_dims;
  unsigned seen = 0;
  do {
    const char *k, *str;
    size_t kn, n;
    if (!plain_string(s, &k, &kn) || !take(s, ':')) return false;
    int key = key_of(k, kn);
    if (key < 0 || (seen & (1u << key))) return false;
    seen |= 1u << key;
    switch (key) {
    case K_FILE: if (!plain_string(s, &e->file, &e->file_n)) return false; break;
    case K_NAME: if (!plain_string(s, &e->name, &e->name_n)) return false; break;
    case K_DTYPE: if (!plain_string(s, &e->dtype, &e->dtype_n) || !e->dtype_n) return false; break;
    case K_OFFSET: if (!plain_uint(s, &e->offset)) return false; break;
    case K_NBYTES: if (!plain_uint(s, &e->nbytes)) return false; break;
    case K_XXH3: if (!plain_string(s, &str, &n) || !hex16(str, n, &e->xxh3)) return false; break;
    default: /* K_SHAPE */
      if (!take(s, '[')) return false;
      e->shape_at = t->n_dims;
      if (take(s, ']')) break;
      do {
        uint64_t d;
        if (e->ndim == ZCK_MANIFEST_MAX_DIMS || !plain_uint(s, &d) ||
            !zck__grow((void **)&t->dims, &t->cap_dims, t->n_dims + 1, sizeof *t->dims))
          return false;
        t->dims[t->n_dims++] = (int64_t)d;
        e->ndim++;
      } while (take(s, ','));
      if (!take(s, ']')) return false;
    }
  } while (take(s, ','));
  if (!take(s, '}') || seen != K_ALL) return false;
  t->n++;
  return true;
}

/* The top-level "files" and "tensors" arrays (at[0..n_at) = [start, stop) of each in the text, in text order),
 * their entries in t. */
static bool read_table(const char *json, size_t len, table *t, const char *at[4], size_t *n_at) {
  scan s = {json, json + len};
  bool got_files = false, got_tensors = false;
  *n_at = 0;
  if (!take(&s, '{')) return false;
  do {
    const char *k;
    size_t kn;
    skip_ws(&s);
    if (!plain_string(&s, &k, &kn)) return false; /* an escaped key: cJSON might read it as one of ours */
    if (!take(&s, ':')) return false;
    bool files = kn == 5 && !memcmp(k, "files", 5), tensors = kn == 7 && !memcmp(k, "tensors", 7);
    if (!files && !tensors) {
      if (!skip_value(&s)) return false;
      continue;
    }
    if ((files && got_files) || (tensors && got_tensors)) return false; /* cJSON takes the first: leave it to it */
    got_files |= files;
    got_tensors |= tensors;
    skip_ws(&s);
    at[(*n_at)++] = s.p;
    if (!take(&s, '[')) return false;
    if (!take(&s, ']')) {
      do
        if (!(files ? read_file(&s, t) : read_tensor(&s, t))) return false;
      while (take(&s, ','));
      if (!take(&s, ']')) return false;
    }
    at[(*n_at)++] = s.p;
  } while (take(&s, ','));
  return take(&s, '}') && *n_at; /* neither: nothing to gain */
}

/* The files, checked and added as manifest_json.c's parse_file does (before any tensor: tensors name them). */
static bool add_files(zck_manifest *m, const table *t) {
  for (size_t i = 0; i < t->n_f; i++) {
    const fentry *e = &t->f[i];
    char *path = zck__strndup(e->path, e->path_n);
    bool ok = path && zck_manifest_add_file(m, path, NULL) == ZCK_OK;
    free(path);
    if (!ok) return false;
    zck_manifest_file *mf = &m->files[m->n_files - 1];
    mf->size = e->size;
    mf->xxh3 = e->xxh3;
    mf->hashed = true;
    if (!e->has_chunks) continue;
    if (!m->chunk_size || e->n_chunks != zck__ceil_div(e->size, m->chunk_size)) return false;
    if (!(mf->chunks = zck__malloc((e->n_chunks ? e->n_chunks : 1) * sizeof *mf->chunks))) return false;
    memcpy(mf->chunks, t->chunks + e->chunks_at, e->n_chunks * sizeof *mf->chunks);
    mf->n_chunks = e->n_chunks;
  }
  return true;
}

/* The entries, checked and added as manifest_json.c's parse_tensor does. */
static bool add_table(zck_manifest *m, const table *t) {
  const char *last = NULL;
  size_t last_n = 0;
  ptrdiff_t fi = -1;
  char *path = NULL;
  bool ok = true;
  for (size_t i = 0; ok && i < t->n; i++) {
    const entry *e = &t->v[i];
    if (!last || e->file_n != last_n || memcmp(e->file, last, last_n)) {
      free(path);
      if (!(path = zck__strndup(e->file, e->file_n))) { ok = false; break; }
      fi = zck_manifest_find_file(m, path);
      last = e->file;
      last_n = e->file_n;
    }
    uint64_t end;
    if (fi < 0 || !zck__add_u64(e->offset, e->nbytes, &end) || end > m->files[fi].size) { ok = false; break; }
    size_t idx;
    const int64_t *shape = e->ndim ? t->dims + e->shape_at : NULL;
    ok = zck__manifest_add_tensor_n(m, (size_t)fi, e->name, e->name_n, e->dtype, e->dtype_n, e->ndim, shape, e->offset,
                                    e->nbytes, &idx) == ZCK_OK;
    if (ok) {
      m->tensors[idx].xxh3 = e->xxh3;
      m->tensors[idx].hashed = true;
    }
  }
  free(path);
  return ok;
}

zck_status zck__manifest_parse_plain(const char *name, const char *json, size_t len, zck_manifest **out) {
  *out = NULL;
  table t = {0};
  const char *at[4];
  size_t n_at = 0;
  zck_status st = ZCK_ERR_FORMAT;
  char *head = NULL;
  if (read_table(json, len, &t, at, &n_at)) {
    /* everything but the arrays, for cJSON: each array's bytes become [] */
    size_t kept = len, o = 0;
    for (size_t k = 0; k < n_at; k += 2) kept -= (size_t)(at[k + 1] - at[k]);
    head = zck__malloc(kept + 2 * (n_at / 2) + 1);
    if (head) {
      const char *from = json;
      for (size_t k = 0; k < n_at; k += 2) {
        memcpy(head + o, from, (size_t)(at[k] - from));
        o += (size_t)(at[k] - from);
        memcpy(head + o, "[]", 2);
        o += 2;
        from = at[k + 1];
      }
      memcpy(head + o, from, (size_t)(json + len - from));
      o += (size_t)(json + len - from);
      head[o] = 0;
      st = zck__manifest_parse_tree(name, head, o, out);
    }
  }
  free(head);
  if (st == ZCK_OK && (!add_files(*out, &t) || !add_table(*out, &t))) {
    zck_manifest_free(*out);
    *out = NULL;
    st = ZCK_ERR_FORMAT;
  }
  free(t.v);
  free(t.dims);
  free(t.f);
  free(t.chunks);
  return st;
}
