/* manifest_json.c: zckpt-manifest.json text, written by hand and read with cJSON.
 *
 * Written by hand so the output is deterministic (same checkpoint, same bytes), one file
 * or tensor per line (diffable, greppable), with exact 64-bit integers, and streamed (into
 * the file a chunk at a time) rather than built as a tree of a million nodes. Read with cJSON and validated field
 * by field: every error names the manifest and the JSON path ("files[3].size"). The
 * tensor table of a plain manifest is read without the tree (manifest_tensors.c).
 */
#include "manifest.h"

#include "io.h"
#include "dist.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ULL(x) ((unsigned long long)(x))
#define ZCK__JSON_MAX_INT 9007199254740992.0 /* 2^53: above it doubles skip integers */

// ---- writing

/* Formatted by hand, not printf: a manifest lists every tensor (100k-param checkpoints
 * have millions of numbers). */

/* Bytes a JSON string takes as they are: not NUL, '"', '\\', control bytes or DEL. */
static const bool plain_byte[256] = {
#define R16(v) v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v
  R16(false), R16(false),                                                   /* 0x00-0x1f */
  true, true, false, true, true, true, true, true, true, true, true, true, true, true, true, true, /* '"' */
  R16(true), R16(true),
  true, true, true, true, true, true, true, true, true, true, true, true, false, true, true, true, /* '\\' */
  R16(true),
  true, true, true, true, true, true, true, true, true, true, true, true, true, true, true, false, /* DEL */
  R16(true), R16(true), R16(true), R16(true), R16(true), R16(true), R16(true), R16(true),
#undef R16
};

static void put_string(zck__buf *b, const char *s) {
  zck__buf_byte(b, '"');
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    const unsigned char *run = p;
    while (plain_byte[*p]) p++;
    if (p > run) zck__buf_append(b, run, (size_t)(p - run));
    if (!*p) break;
    if (*p == '"' || *p == '\\') {
      zck__buf_byte(b, '\\');
      zck__buf_byte(b, *p);
    } else {
      zck__buf_printf(b, "\\u%04x", *p);
    }
    p++;
  }
  zck__buf_byte(b, '"');
}

static void put_hex(zck__buf *b, uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  char t[18];
  t[0] = t[17] = '"';
  for (int i = 16; i >= 1; i--, v >>= 4) t[i] = digits[v & 15];
  zck__buf_append(b, t, sizeof t);
}

static void put_u64(zck__buf *b, uint64_t v) {
  char t[20];
  int i = 20;
  do t[--i] = (char)('0' + v % 10); while (v /= 10);
  zck__buf_append(b, t + i, (size_t)(20 - i));
}

static void put_i64(zck__buf *b, int64_t v) {
  if (v < 0) zck__buf_byte(b, '-');
  put_u64(b, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v);
}

/* Where the text goes: one buffer (to_json), or a file written a chunk at a time so a
 * manifest of 100k params (~250 MB of text) never sits in memory whole. */
typedef struct json_sink {
  zck__buf b;
  zck__outfile *file;          /* NULL: keep everything in b */
  uint64_t written;            /* bytes already flushed to file */
  zck_status st;
} json_sink;

#define JSON_FLUSH_AT (1u << 20)

static void sink_flush(json_sink *s) {
  if (!s->file || s->st != ZCK_OK || s->b.failed || !s->b.len) return;
  s->st = zck__outfile_pwrite(s->file, s->b.data, s->b.len, s->written);
  s->written += s->b.len;
  s->b.len = 0;
}

/* Called between records: a record is small, so the buffer stays near JSON_FLUSH_AT. */
static inline void sink_maybe_flush(json_sink *s) {
  if (s->file && s->b.len >= JSON_FLUSH_AT) sink_flush(s);
}

static void emit_json(const zck_manifest *m, json_sink *s) {
  zck__buf *b = &s->b;
  zck__buf_str(b, "{\n  \"format\": \"zckpt-manifest\",\n");
  zck__buf_printf(b, "  \"format_version\": %d,\n  \"tool\": ", ZCK_MANIFEST_FORMAT_VERSION);
  put_string(b, m->tool ? m->tool : "zckpt");
  zck__buf_str(b, ",\n  \"version\": ");
  put_string(b, m->version ? m->version : ZCK_VERSION_STRING);
  zck__buf_printf(b, ",\n  \"kind\": \"%s\",\n", zck_manifest_kind_name(m->kind));
  if (m->has_layout) {
    const zck_manifest_layout *l = &m->layout;
    zck__buf_str(b, "  \"layout\": {");
    if (l->tag) { zck__buf_str(b, "\"tag\": "); put_string(b, l->tag); zck__buf_str(b, ", "); }
    zck__buf_printf(b, "\"stage\": %d, \"world_size\": %u, \"groups\": %llu", l->stage, l->world_size, ULL(l->groups));
    if (l->lp_dtype) { zck__buf_str(b, ", \"lp_dtype\": "); put_string(b, l->lp_dtype); }
    if (l->master_dtype) { zck__buf_str(b, ", \"master_dtype\": "); put_string(b, l->master_dtype); }
    zck__buf_printf(b, ", \"bf16_prefix\": %s},\n", l->bf16_prefix ? "true" : "false");
  }
  zck__buf_printf(b, "  \"chunk_size\": %llu,\n  \"files\": [", ULL(m->chunk_size));
  for (size_t i = 0; i < m->n_files && s->st == ZCK_OK; i++) {
    const zck_manifest_file *f = &m->files[i];
    zck__buf_str(b, i ? ",\n    {\"path\": " : "\n    {\"path\": ");
    put_string(b, f->path);
    zck__buf_str(b, ", \"size\": ");
    put_u64(b, f->size);
    zck__buf_str(b, ", \"xxh3\": ");
    put_hex(b, f->xxh3);
    if (f->n_chunks) {
      zck__buf_str(b, ", \"chunks\": [");
      for (size_t k = 0; k < f->n_chunks; k++) {
        if (k) zck__buf_str(b, ", ");
        put_hex(b, f->chunks[k]);
      }
      zck__buf_byte(b, ']');
    }
    zck__buf_byte(b, '}');
    sink_maybe_flush(s);
  }
  zck__buf_str(b, m->n_files ? "\n  ],\n  \"tensors\": [" : "],\n  \"tensors\": [");
  /* Each file's path as JSON once (every tensor line names its file). */
  zck__buf paths;
  zck__buf_init(&paths);
  size_t *path_at = zck__malloc((m->n_files + 1) * sizeof *path_at);
  if (!path_at) b->failed = true;
  for (size_t f = 0; path_at && f < m->n_files; f++) {
    path_at[f] = paths.len;
    put_string(&paths, m->files[f].path);
  }
  if (path_at) path_at[m->n_files] = paths.len;
  if (!s->file) {
    /* all of it in memory: the buffer sized for the tensor lines up front (at 100k params
     * they are 83 MB, which doubling would copy and fault in about twice over) */
    size_t want = 0;
    for (size_t i = 0; path_at && i < m->n_tensors; i++) {
      const zck_manifest_tensor *t = &m->tensors[i];
      want += path_at[t->file + 1] - path_at[t->file] + strlen(t->name) + strlen(t->dtype) + (size_t)t->ndim * 22 + 160;
    }
    zck__buf_reserve(b, want);
  }
  for (size_t i = 0; i < m->n_tensors && !b->failed && !paths.failed && s->st == ZCK_OK; i++) {
    const zck_manifest_tensor *t = &m->tensors[i];
    zck__buf_str(b, i ? ",\n    {\"file\": " : "\n    {\"file\": ");
    zck__buf_append(b, paths.data + path_at[t->file], path_at[t->file + 1] - path_at[t->file]);
    zck__buf_str(b, ", \"name\": ");
    put_string(b, t->name);
    zck__buf_str(b, ", \"dtype\": ");
    put_string(b, t->dtype);
    zck__buf_str(b, ", \"shape\": [");
    for (int d = 0; d < t->ndim; d++) {
      if (d) zck__buf_str(b, ", ");
      put_i64(b, t->shape[d]);
    }
    zck__buf_str(b, "], \"offset\": ");
    put_u64(b, t->offset);
    zck__buf_str(b, ", \"nbytes\": ");
    put_u64(b, t->nbytes);
    zck__buf_str(b, ", \"xxh3\": ");
    put_hex(b, t->xxh3);
    zck__buf_byte(b, '}');
    sink_maybe_flush(s);
  }
  zck__buf_str(b, m->n_tensors ? "\n  ]\n}\n" : "]\n}\n");
  if (paths.failed) b->failed = true;
  zck__buf_free(&paths);
  free(path_at);
}

static zck_status check_hashed(const zck_manifest *m) {
  for (size_t i = 0; i < m->n_files; i++)
    if (!m->files[i].hashed) return zck__fail(ZCK_ERR_INVALID_ARG, "manifest: file %s was not hashed", m->files[i].path);
  return ZCK_OK;
}

zck_status zck_manifest_to_json(const zck_manifest *m, char **text, size_t *len) {
  ZCK_TRY(check_hashed(m));
  json_sink s = {.file = NULL, .st = ZCK_OK};
  zck__buf_init(&s.b);
  emit_json(m, &s);
  zck__buf_byte(&s.b, 0);
  if (s.b.failed) {
    zck__buf_free(&s.b);
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  }
  *text = (char *)s.b.data;
  if (len) *len = s.b.len - 1;
  return ZCK_OK;
}

zck_status zck_manifest_write(const zck_manifest *m, const char *dir) {
  if (!zck__dist_writes()) return ZCK_OK; /* a distributed job's rank 0 writes it */
  ZCK_TRY(check_hashed(m));
  char *path = zck__path_join(dir, ZCK_MANIFEST_NAME);
  char *marker = zck__path_join(dir, ZCK_MANIFEST_PARTIAL_NAME);
  zck__outfile f;
  zck_status st = (path && marker) ? zck__outfile_create(&f, path) : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) {
    json_sink s = {.file = &f, .st = ZCK_OK};
    zck__buf_init(&s.b);
    zck__buf_reserve(&s.b, JSON_FLUSH_AT + 4096);
    emit_json(m, &s);
    sink_flush(&s);
    st = s.st;
    if (st == ZCK_OK && s.b.failed) st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    zck__buf_free(&s.b);
    if (st == ZCK_OK) st = zck__outfile_commit(&f);
    else zck__outfile_abort(&f);
  }
  /* the manifest is the completion mark: only now does the partial marker go */
  if (st == ZCK_OK && unlink(marker) == 0) st = zck__fsync_path(dir, true);
  free(path);
  free(marker);
  return st;
}

// ---- reading

typedef struct jctx {
  const char *name;            /* the manifest, for messages */
} jctx;

#define JFAIL(c, st, ...) zck__error_prepend(zck__fail((st), __VA_ARGS__), "%s: malformed manifest", (c)->name)

/* Objects must not repeat a key: cJSON would silently use the first. */
static zck_status no_duplicate_keys(const jctx *c, const cJSON *obj, const char *where) {
  for (const cJSON *a = obj->child; a; a = a->next)
    for (const cJSON *b = a->next; b; b = b->next)
      if (a->string && b->string && !strcmp(a->string, b->string)) {
        char shown[128];
        zck__manifest_shown(shown, sizeof shown, a->string);
        return JFAIL(c, ZCK_ERR_FORMAT, "%s: key \"%s\" appears twice", where, shown);
      }
  return ZCK_OK;
}

static zck_status get_uint(const jctx *c, const cJSON *obj, const char *key, const char *where, bool required,
                           uint64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!v) {
    if (!required) return ZCK_OK;
    return JFAIL(c, ZCK_ERR_FORMAT, "%s: \"%s\" missing", where, key);
  }
  double d = v->valuedouble;
  if (!cJSON_IsNumber(v) || !(d >= 0) || d != floor(d) || d >= ZCK__JSON_MAX_INT)
    return JFAIL(c, ZCK_ERR_FORMAT, "%s.%s: not a non-negative integer below 2^53", where, key);
  *out = (uint64_t)d;
  return ZCK_OK;
}

static zck_status get_str(const jctx *c, const cJSON *obj, const char *key, const char *where, bool required,
                          const char **out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  *out = NULL;
  if (!v) {
    if (!required) return ZCK_OK;
    return JFAIL(c, ZCK_ERR_FORMAT, "%s: \"%s\" missing", where, key);
  }
  if (!cJSON_IsString(v) || !v->valuestring) return JFAIL(c, ZCK_ERR_FORMAT, "%s.%s: not a string", where, key);
  *out = v->valuestring;
  return ZCK_OK;
}

static bool parse_hex(const char *s, uint64_t *out) {
  if (!s || strlen(s) != 16) return false;
  uint64_t v = 0;
  for (int i = 0; i < 16; i++) {
    char ch = s[i];
    int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | (uint64_t)d;
  }
  *out = v;
  return true;
}

static zck_status get_hex(const jctx *c, const cJSON *obj, const char *key, const char *where, uint64_t *out) {
  const char *s;
  ZCK_TRY(get_str(c, obj, key, where, true, &s));
  if (!parse_hex(s, out)) return JFAIL(c, ZCK_ERR_FORMAT, "%s.%s: not 16 hex digits", where, key);
  return ZCK_OK;
}

static zck_status parse_layout(const jctx *c, const cJSON *l, zck_manifest *m) {
  if (!cJSON_IsObject(l)) return JFAIL(c, ZCK_ERR_FORMAT, "layout: not an object");
  ZCK_TRY(no_duplicate_keys(c, l, "layout"));
  zck_manifest_layout x;
  memset(&x, 0, sizeof x);
  uint64_t stage = 0, ws = 0;
  const char *tag, *lp, *master;
  ZCK_TRY(get_uint(c, l, "stage", "layout", true, &stage));
  ZCK_TRY(get_uint(c, l, "world_size", "layout", true, &ws));
  ZCK_TRY(get_uint(c, l, "groups", "layout", true, &x.groups));
  ZCK_TRY(get_str(c, l, "tag", "layout", false, &tag));
  ZCK_TRY(get_str(c, l, "lp_dtype", "layout", false, &lp));
  ZCK_TRY(get_str(c, l, "master_dtype", "layout", false, &master));
  if (stage > 3) return JFAIL(c, ZCK_ERR_FORMAT, "layout.stage: %llu is not 0..3", ULL(stage));
  if (ws == 0 || ws > UINT32_MAX) return JFAIL(c, ZCK_ERR_FORMAT, "layout.world_size: %llu out of range", ULL(ws));
  const cJSON *b = cJSON_GetObjectItemCaseSensitive(l, "bf16_prefix");
  if (b && !cJSON_IsBool(b)) return JFAIL(c, ZCK_ERR_FORMAT, "layout.bf16_prefix: not a boolean");
  x.stage = (int)stage;
  x.world_size = (uint32_t)ws;
  x.bf16_prefix = b && cJSON_IsTrue(b);
  x.tag = (char *)tag;
  x.lp_dtype = (char *)lp;
  x.master_dtype = (char *)master;
  return zck_manifest_set_layout(m, &x); /* copies the strings */
}

static zck_status parse_file(const jctx *c, const cJSON *f, size_t i, zck_manifest *m) {
  char where[48];
  snprintf(where, sizeof where, "files[%zu]", i);
  if (!cJSON_IsObject(f)) return JFAIL(c, ZCK_ERR_FORMAT, "%s: not an object", where);
  ZCK_TRY(no_duplicate_keys(c, f, where));
  const char *path;
  uint64_t size = 0, xxh3 = 0;
  ZCK_TRY(get_str(c, f, "path", where, true, &path));
  ZCK_TRY(get_uint(c, f, "size", where, true, &size));
  ZCK_TRY(get_hex(c, f, "xxh3", where, &xxh3));
  zck_status st = zck_manifest_add_file(m, path, NULL);
  if (st == ZCK_ERR_INVALID_ARG) {
    char why[256]; /* copied: the message is rewritten in place */
    snprintf(why, sizeof why, "%s", zck_last_error() + strlen("manifest: "));
    return JFAIL(c, ZCK_ERR_FORMAT, "%s.path: %s", where, why);
  }
  ZCK_TRY(st);
  zck_manifest_file *mf = &m->files[m->n_files - 1];
  mf->size = size;
  mf->xxh3 = xxh3;
  mf->hashed = true;
  const cJSON *ch = cJSON_GetObjectItemCaseSensitive(f, "chunks");
  if (!ch) return ZCK_OK;
  if (!cJSON_IsArray(ch)) return JFAIL(c, ZCK_ERR_FORMAT, "%s.chunks: not an array", where);
  size_t n = (size_t)cJSON_GetArraySize(ch);
  uint64_t want = m->chunk_size ? zck__ceil_div(size, m->chunk_size) : 0;
  if (!m->chunk_size || n != want)
    return JFAIL(c, ZCK_ERR_FORMAT, "%s.chunks: %zu hashes, but %llu bytes in chunks of %llu make %llu", where, n,
                 ULL(size), ULL(m->chunk_size), ULL(want));
  if (!(mf->chunks = zck__malloc((n ? n : 1) * sizeof *mf->chunks))) return ZCK_ERR_NO_MEMORY;
  mf->n_chunks = n;
  size_t k = 0;
  for (const cJSON *h = ch->child; h; h = h->next, k++)
    if (!cJSON_IsString(h) || !parse_hex(h->valuestring, &mf->chunks[k]))
      return JFAIL(c, ZCK_ERR_FORMAT, "%s.chunks[%zu]: not 16 hex digits", where, k);
  return ZCK_OK;
}

static zck_status parse_tensor(const jctx *c, const cJSON *t, size_t i, zck_manifest *m) {
  char where[48];
  snprintf(where, sizeof where, "tensors[%zu]", i);
  if (!cJSON_IsObject(t)) return JFAIL(c, ZCK_ERR_FORMAT, "%s: not an object", where);
  ZCK_TRY(no_duplicate_keys(c, t, where));
  const char *file, *name, *dtype;
  uint64_t off = 0, nbytes = 0, xxh3 = 0, end;
  ZCK_TRY(get_str(c, t, "file", where, true, &file));
  ZCK_TRY(get_str(c, t, "name", where, true, &name));
  ZCK_TRY(get_str(c, t, "dtype", where, true, &dtype));
  ZCK_TRY(get_uint(c, t, "offset", where, true, &off));
  ZCK_TRY(get_uint(c, t, "nbytes", where, true, &nbytes));
  ZCK_TRY(get_hex(c, t, "xxh3", where, &xxh3));
  if (!*dtype) return JFAIL(c, ZCK_ERR_FORMAT, "%s.dtype: empty", where);
  ptrdiff_t fi = zck_manifest_find_file(m, file);
  char shown[256];
  zck__manifest_shown(shown, sizeof shown, file);
  if (fi < 0) return JFAIL(c, ZCK_ERR_FORMAT, "%s.file: \"%s\" is not in files", where, shown);
  if (!zck__add_u64(off, nbytes, &end) || end > m->files[fi].size)
    return JFAIL(c, ZCK_ERR_FORMAT, "%s: bytes %llu..%llu pass the end of %s (%llu bytes)", where, ULL(off),
                 ULL(off) + ULL(nbytes), shown, ULL(m->files[fi].size));
  const cJSON *sh = cJSON_GetObjectItemCaseSensitive(t, "shape");
  if (!cJSON_IsArray(sh)) return JFAIL(c, ZCK_ERR_FORMAT, "%s.shape: missing or not an array", where);
  int ndim = cJSON_GetArraySize(sh);
  if (ndim > ZCK_MANIFEST_MAX_DIMS) return JFAIL(c, ZCK_ERR_FORMAT, "%s.shape: %d dims, at most %d", where, ndim, ZCK_MANIFEST_MAX_DIMS);
  int64_t shape[ZCK_MANIFEST_MAX_DIMS];
  int d = 0;
  for (const cJSON *v = sh->child; v; v = v->next, d++) {
    double x = v->valuedouble;
    if (!cJSON_IsNumber(v) || !(x >= 0) || x != floor(x) || x >= ZCK__JSON_MAX_INT)
      return JFAIL(c, ZCK_ERR_FORMAT, "%s.shape[%d]: not a non-negative integer", where, d);
    shape[d] = (int64_t)x;
  }
  size_t idx;
  ZCK_TRY(zck_manifest_add_tensor(m, (size_t)fi, name, dtype, ndim, shape, off, nbytes, &idx));
  m->tensors[idx].xxh3 = xxh3;
  m->tensors[idx].hashed = true;
  return ZCK_OK;
}

static zck_status parse_root(const jctx *c, const cJSON *root, zck_manifest *m) {
  if (!cJSON_IsObject(root)) return JFAIL(c, ZCK_ERR_FORMAT, "not a JSON object");
  ZCK_TRY(no_duplicate_keys(c, root, "manifest"));
  const char *format, *tool, *version, *kind;
  uint64_t fv = 0;
  ZCK_TRY(get_str(c, root, "format", "manifest", true, &format));
  char shown[128];
  zck__manifest_shown(shown, sizeof shown, format);
  if (strcmp(format, "zckpt-manifest")) return JFAIL(c, ZCK_ERR_FORMAT, "format is \"%s\", not \"zckpt-manifest\"", shown);
  ZCK_TRY(get_uint(c, root, "format_version", "manifest", true, &fv));
  if (fv < 1 || fv > ZCK_MANIFEST_FORMAT_VERSION)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: manifest format_version %llu: this zckpt reads version %d (written by a newer zckpt?)",
                     c->name, ULL(fv), ZCK_MANIFEST_FORMAT_VERSION);
  ZCK_TRY(get_str(c, root, "tool", "manifest", true, &tool));
  ZCK_TRY(get_str(c, root, "version", "manifest", true, &version));
  ZCK_TRY(get_str(c, root, "kind", "manifest", true, &kind));
  free(m->tool);
  free(m->version);
  m->tool = zck__strdup(tool);
  m->version = zck__strdup(version);
  if (!m->tool || !m->version) return ZCK_ERR_NO_MEMORY;
  static const zck_manifest_kind kinds[] = {ZCK_MANIFEST_OTHER, ZCK_MANIFEST_DEEPSPEED, ZCK_MANIFEST_SAFETENSORS,
                                            ZCK_MANIFEST_UNIVERSAL, ZCK_MANIFEST_TORCH};
  bool known = false;
  for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
    if (!strcmp(kind, zck_manifest_kind_name(kinds[i]))) { m->kind = kinds[i]; known = true; }
  zck__manifest_shown(shown, sizeof shown, kind);
  if (!known) return JFAIL(c, ZCK_ERR_FORMAT, "kind \"%s\" is not deepspeed, safetensors, universal, torch or other", shown);
  m->chunk_size = 0;
  ZCK_TRY(get_uint(c, root, "chunk_size", "manifest", false, &m->chunk_size));
  const cJSON *layout = cJSON_GetObjectItemCaseSensitive(root, "layout");
  if (layout) ZCK_TRY(parse_layout(c, layout, m));
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
  if (!cJSON_IsArray(files)) return JFAIL(c, ZCK_ERR_FORMAT, "\"files\" missing or not an array");
  if (tensors && !cJSON_IsArray(tensors)) return JFAIL(c, ZCK_ERR_FORMAT, "\"tensors\" not an array");
  size_t i = 0;
  for (const cJSON *f = files->child; f; f = f->next, i++) ZCK_TRY(parse_file(c, f, i, m));
  i = 0;
  for (const cJSON *t = tensors ? tensors->child : NULL; t; t = t->next, i++) ZCK_TRY(parse_tensor(c, t, i, m));
  return ZCK_OK;
}

zck_status zck_manifest_parse(const char *name, const char *json, size_t len, zck_manifest **out) {
  if (zck__manifest_parse_plain(name, json, len, out) == ZCK_OK) return ZCK_OK;
  zck_clear_error();
  return zck__manifest_parse_tree(name, json, len, out);
}

zck_status zck__manifest_parse_tree(const char *name, const char *json, size_t len, zck_manifest **out) {
  *out = NULL;
  jctx c = {name ? name : ZCK_MANIFEST_NAME};
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(json, len, &end, false);
  if (!root) {
    size_t at = end && end >= json && end <= json + len ? (size_t)(end - json) : 0;
    size_t line = 1;
    for (size_t i = 0; i < at; i++) line += json[i] == '\n';
    return zck__fail(ZCK_ERR_FORMAT, "%s: malformed manifest: not valid JSON (byte %zu, line %zu)", c.name, at, line);
  }
  zck_manifest *m = NULL;
  zck_status st = zck_manifest_new(&m);
  if (st == ZCK_OK) {
    /* trailing bytes after the object mean a damaged or concatenated file */
    const char *p = end;
    while (p && p < json + len && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) p++;
    if (p && p < json + len && *p)
      st = zck__fail(ZCK_ERR_FORMAT, "%s: malformed manifest: bytes after the JSON object (byte %zu)", c.name, (size_t)(p - json));
    else
      st = parse_root(&c, root, m);
  }
  cJSON_Delete(root);
  if (st != ZCK_OK) {
    zck_manifest_free(m);
    return st;
  }
  *out = m;
  return ZCK_OK;
}

zck_status zck_manifest_read(const char *path, zck_manifest **out) {
  *out = NULL;
  struct stat sb;
  if (stat(path, &sb) != 0) return zck__fail_errno(errno, "%s: cannot read manifest", path);
  char *file = S_ISDIR(sb.st_mode) ? zck__path_join(path, ZCK_MANIFEST_NAME) : zck__strdup(path);
  if (!file) return ZCK_ERR_NO_MEMORY;
  zck_status st = ZCK_OK;
  if (S_ISDIR(sb.st_mode) && lstat(file, &sb) != 0 && errno == ENOENT) {
    st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no " ZCK_MANIFEST_NAME, path);
  } else {
    char *text = NULL;
    size_t len = 0;
    st = zck__read_small_file(file, ZCK_MANIFEST_MAX_BYTES, &text, &len);
    if (st == ZCK_OK) st = zck_manifest_parse(file, text, len, out);
    free(text);
  }
  free(file);
  return st;
}
