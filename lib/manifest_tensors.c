/* manifest_tensors.c: zckpt-manifest.json's tensor table read without a JSON tree.
 *
 * A 100k-parameter ZeRO-3 checkpoint resharded to 4 ranks lists ~400k tensors (83 MB of
 * manifest). As a cJSON tree that is ~10 nodes and ~7 strings per tensor, each its own
 * allocation: the parse and the tree's delete were a third of reading such a checkpoint
 * back, and the tree several hundred MB. Here the "tensors" array is scanned straight into
 * the manifest; the rest (header, layout, files: a few dozen lines) still goes through
 * cJSON and manifest_json.c's checks, with the array replaced by [].
 *
 * Only a plain subset is taken: the seven keys of a tensor (any order, each once), strings
 * without escapes or control bytes, integers as plain digits below 2^53, standard JSON
 * whitespace. Anything else, and every error (a bad field, a range past its file, an
 * unknown file), declines: zck_manifest_parse then reads the whole text with cJSON, so the
 * accepted inputs, the result and every message are the tree reader's own.
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

typedef struct table {
  entry *v;
  size_t n, cap;
  int64_t *dims;
  size_t n_dims, cap_dims;
} table;

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

/* The top-level "tensors" array: [*start, *stop) of the text, its entries in t. */
static bool read_table(const char *json, size_t len, table *t, const char **start, const char **stop) {
  scan s = {json, json + len};
  if (!take(&s, '{')) return false;
  do {
    const char *k;
    size_t kn;
    skip_ws(&s);
    if (!plain_string(&s, &k, &kn)) return false; /* an escaped key: cJSON might read it as "tensors" */
    if (!take(&s, ':')) return false;
    if (kn != 7 || memcmp(k, "tensors", 7)) {
      if (!skip_value(&s)) return false;
      continue;
    }
    skip_ws(&s);
    *start = s.p;
    if (!take(&s, '[')) return false;
    if (!take(&s, ']')) {
      do
        if (!read_tensor(&s, t)) return false;
      while (take(&s, ','));
      if (!take(&s, ']')) return false;
    }
    *stop = s.p;
    return true;
  } while (take(&s, ','));
  return false; /* no "tensors": nothing to gain */
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
  const char *start = NULL, *stop = NULL;
  zck_status st = ZCK_ERR_FORMAT;
  char *head = NULL;
  if (read_table(json, len, &t, &start, &stop)) {
    /* everything but the array, for cJSON: the array's bytes become [] */
    size_t before = (size_t)(start - json), after = len - (size_t)(stop - json);
    head = zck__malloc(before + 2 + after + 1);
    if (head) {
      memcpy(head, json, before);
      memcpy(head + before, "[]", 2);
      memcpy(head + before + 2, stop, after);
      head[before + 2 + after] = 0;
      st = zck__manifest_parse_tree(name, head, before + 2 + after, out);
    }
  }
  if (st == ZCK_OK && !add_table(*out, &t)) {
    zck_manifest_free(*out);
    *out = NULL;
    st = ZCK_ERR_FORMAT;
  }
  free(head);
  free(t.v);
  free(t.dims);
  return st;
}
