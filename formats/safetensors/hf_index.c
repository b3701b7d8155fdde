/* hf_index.c: reads Hugging Face checkpoints: model.safetensors.index.json and its shards,
 * or a single model.safetensors. The index is checked as huggingface_hub's
 * _load_sharded_checkpoint does (shard names relative without '..', parsed as a Windows
 * path; the index's own extension) and against the shards themselves (every weight_map
 * entry in its shard, each tensor in one shard only). */
#include "st_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ZCK__HF_INDEX_MAX (64u << 20) /* huggingface_hub refuses indexes over 10 MiB; allow more */

struct zck_hf_index {
  char *name;
  const char **tensors, **shard_of;   /* weight_map, in file order */
  size_t count, cap;
  const char **shards;                /* distinct shard names, first-seen order */
  size_t nshards, shards_cap;
  zck__strmap tensor_map, shard_map;
  bool has_total;
  uint64_t total_size;
  zck__st_pairs md;                   /* string-valued metadata entries */
  zck__arena arena;
};

size_t zck_hf_index_count(const zck_hf_index *ix) { return ix->count; }
size_t zck_hf_index_shard_count(const zck_hf_index *ix) { return ix->nshards; }

void zck_hf_index_entry(const zck_hf_index *ix, size_t i, const char **tensor, const char **shard) {
  ZCK_ASSERT(i < ix->count);
  if (tensor) *tensor = ix->tensors[i];
  if (shard) *shard = ix->shard_of[i];
}

const char *zck_hf_index_shard(const zck_hf_index *ix, size_t i) {
  ZCK_ASSERT(i < ix->nshards);
  return ix->shards[i];
}

bool zck_hf_index_total_size(const zck_hf_index *ix, uint64_t *total) {
  if (ix->has_total && total) *total = ix->total_size;
  return ix->has_total;
}

const char *zck_hf_index_metadata_get(const zck_hf_index *ix, const char *key) {
  size_t i = zck__st_pairs_find(&ix->md, key);
  return i == SIZE_MAX ? NULL : ix->md.values[i];
}

void zck_hf_index_free(zck_hf_index *ix) {
  if (!ix) return;
  free(ix->name);
  free(ix->tensors);
  free(ix->shard_of);
  free(ix->shards);
  zck__st_pairs_free(&ix->md);
  zck__strmap_free(&ix->tensor_map);
  zck__strmap_free(&ix->shard_map);
  zck__arena_free(&ix->arena);
  free(ix);
}

/* PureWindowsPath(name): drive ("X:" or a UNC "\\server"), root (a leading separator) or a
 * ".." part are refused, on every OS. */
static const char *zck__hf_bad_shard_path(const char *s) {
  if (s[0] && s[1] == ':') return "has a drive";
  if (s[0] == '/' || s[0] == '\\') return "is absolute";
  const char *p = s;
  while (*p) {
    const char *e = p;
    while (*e && *e != '/' && *e != '\\') e++;
    if (e - p == 2 && p[0] == '.' && p[1] == '.') return "has a '..' component";
    p = *e ? e + 1 : e;
  }
  return NULL;
}

static zck_status zck__hf_copy_str(zck_hf_index *ix, zck__jp *jp, const char *what, const char **out) {
  if (strlen((const char *)jp->str.data) != jp->str.len) return zck__jp_fail_value(jp, "%s contains U+0000", what);
  *out = zck__arena_strndup(&ix->arena, (const char *)jp->str.data, jp->str.len);
  return *out ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

static zck_status zck__hf_parse_metadata(zck_hf_index *ix, zck__jp *jp) {
  ZCK_TRY(zck__jp_object_begin(jp, "\"metadata\""));
  bool first = true, done, seen_total = false;
  for (;;) {
    ZCK_TRY(zck__jp_object_next(jp, &first, &done));
    if (done) break;
    const char *key = NULL;
    ZCK_TRY(zck__hf_copy_str(ix, jp, "metadata key", &key));
    if (!strcmp(key, "total_size")) {
      if (seen_total) return zck__jp_fail_value(jp, "metadata: duplicate \"total_size\"");
      seen_total = true;
      ZCK_TRY(zck__jp_u64(jp, &ix->total_size, "metadata.total_size"));
      ix->has_total = true;
      continue;
    }
    if (zck__st_pairs_find(&ix->md, key) != SIZE_MAX) {
      char q[ZCK__QNAME_MAX];
      return zck__jp_fail_value(jp, "metadata: duplicate key \"%s\"", zck__qname(key, q));
    }
    if (zck__jp_peek(jp) != '"') { /* other keys, any values */
      ZCK_TRY(zck__jp_skip(jp));
      continue;
    }
    ZCK_TRY(zck__jp_string(jp, "metadata value"));
    const char *value = NULL;
    ZCK_TRY(zck__hf_copy_str(ix, jp, "metadata value", &value));
    bool dup;
    ZCK_TRY(zck__st_pairs_add(&ix->md, key, value, &dup));
  }
  zck__jp_leave(jp);
  return ZCK_OK;
}

static zck_status zck__hf_parse_weight_map(zck_hf_index *ix, zck__jp *jp, const char *ext) {
  ZCK_TRY(zck__jp_object_begin(jp, "\"weight_map\" must be an object of strings"));
  bool first = true, done;
  char q[ZCK__QNAME_MAX], q2[ZCK__QNAME_MAX];
  for (;;) {
    ZCK_TRY(zck__jp_object_next(jp, &first, &done));
    if (done) break;
    const char *tensor = NULL, *shard = NULL;
    ZCK_TRY(zck__hf_copy_str(ix, jp, "tensor name", &tensor));
    if (zck__jp_peek(jp) != '"')
      return zck__jp_fail_value(jp, "weight_map: tensor %s: the shard must be a string, found %s", zck__qname(tensor, q),
                                zck__jp_kind(jp));
    uint64_t at = zck__jp_offset(jp);
    ZCK_TRY(zck__jp_string(jp, "shard"));
    ZCK_TRY(zck__hf_copy_str(ix, jp, "shard name", &shard));
    bool dup;
    ZCK_TRY(zck__strmap_put(&ix->tensor_map, tensor, ix->count, &dup, NULL));
    if (dup)
      return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: listed twice in weight_map (byte %llu)", ix->name,
                       zck__qname(tensor, q), (unsigned long long)at);
    size_t si;
    if (!zck__strmap_get(&ix->shard_map, shard, &si)) {
      const char *why = zck__hf_bad_shard_path(shard);
      if (why)
        return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: shard path \"%s\" %s; shard names must be relative without '..'",
                         ix->name, zck__qname(tensor, q), zck__qname(shard, q2), why);
      size_t sl = strlen(shard), el = strlen(ext);
      if (sl < el || strcmp(shard + sl - el, ext))
        return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: shard \"%s\" does not end with \"%s\"", ix->name,
                         zck__qname(tensor, q), zck__qname(shard, q2), ext);
      if (!zck__grow2(&ix->shards, NULL, &ix->shards_cap, ix->nshards, sizeof *ix->shards)) return ZCK_ERR_NO_MEMORY;
      ZCK_TRY(zck__strmap_put(&ix->shard_map, shard, ix->nshards, &dup, NULL));
      ix->shards[ix->nshards++] = shard;
    } else {
      shard = ix->shards[si]; /* share one copy */
    }
    if (!zck__grow2(&ix->tensors, &ix->shard_of, &ix->cap, ix->count, sizeof(char *))) return ZCK_ERR_NO_MEMORY;
    ix->tensors[ix->count] = tensor;
    ix->shard_of[ix->count++] = shard;
  }
  zck__jp_leave(jp);
  return ZCK_OK;
}

zck_status zck_hf_index_parse(const char *name, const char *json, size_t len, const char *ext, zck_hf_index **out) {
  *out = NULL;
  zck_hf_index *ix = zck__calloc(1, sizeof *ix);
  if (!ix) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  zck__jp jp;
  zck__jp_init(&jp, name, "index", json, len, 0);
  ix->name = zck__strdup(name);
  if (!ix->name) { s = ZCK_ERR_NO_MEMORY; goto out; }
  ZCK_CHECK_GOTO(zck__strmap_init(&ix->tensor_map, 64), s, out);
  ZCK_CHECK_GOTO(zck__strmap_init(&ix->shard_map, 16), s, out);
  size_t bad = zck__utf8_check((const uint8_t *)json, len);
  if (bad != len) {
    s = zck__fail(ZCK_ERR_FORMAT, "%s: not valid UTF-8 (byte %zu)", name, bad);
    goto out;
  }
  ZCK_CHECK_GOTO(zck__jp_object_begin(&jp, "the index must be a JSON object"), s, out);
  bool first = true, done, seen_md = false, seen_wm = false;
  for (;;) {
    ZCK_CHECK_GOTO(zck__jp_object_next(&jp, &first, &done), s, out);
    if (done) break;
    const char *key = (const char *)jp.str.data;
    bool is_md = jp.str.len == 8 && !strcmp(key, "metadata"), is_wm = jp.str.len == 10 && !strcmp(key, "weight_map");
    if ((is_md && seen_md) || (is_wm && seen_wm)) {
      s = zck__jp_fail_value(&jp, "duplicate key \"%s\"", is_md ? "metadata" : "weight_map");
      goto out;
    }
    if (is_md) {
      seen_md = true;
      ZCK_CHECK_GOTO(zck__hf_parse_metadata(ix, &jp), s, out);
    } else if (is_wm) {
      seen_wm = true;
      ZCK_CHECK_GOTO(zck__hf_parse_weight_map(ix, &jp, ext), s, out);
    } else {
      ZCK_CHECK_GOTO(zck__jp_skip(&jp), s, out);
    }
  }
  zck__jp_leave(&jp);
  ZCK_CHECK_GOTO(zck__jp_finish(&jp), s, out);
  if (!seen_wm) s = zck__fail(ZCK_ERR_FORMAT, "%s: no \"weight_map\"", name);
out:
  zck__jp_free(&jp);
  if (s != ZCK_OK) {
    zck_hf_index_free(ix);
    return s;
  }
  *out = ix;
  return ZCK_OK;
}

/* ---- checkpoints */

struct zck_hf_checkpoint {
  zck_hf_index *index;       /* NULL for a single file */
  zck_st_file **files;
  size_t nfiles;
  zck_hf_tensor *tensors;
  size_t count;
  zck__strmap map;
  zck__strlist warnings;
};

size_t zck_hf_count(const zck_hf_checkpoint *c) { return c->count; }
size_t zck_hf_shard_count(const zck_hf_checkpoint *c) { return c->nfiles; }
const zck_hf_index *zck_hf_checkpoint_index(const zck_hf_checkpoint *c) { return c->index; }
size_t zck_hf_warning_count(const zck_hf_checkpoint *c) { return c->warnings.len; }

const zck_hf_tensor *zck_hf_tensor_at(const zck_hf_checkpoint *c, size_t i) {
  ZCK_ASSERT(i < c->count);
  return &c->tensors[i];
}

const zck_hf_tensor *zck_hf_find(const zck_hf_checkpoint *c, const char *name) {
  size_t i;
  return zck__strmap_get(&c->map, name, &i) ? &c->tensors[i] : NULL;
}

const zck_st_file *zck_hf_shard(const zck_hf_checkpoint *c, size_t i) {
  ZCK_ASSERT(i < c->nfiles);
  return c->files[i];
}

const char *zck_hf_warning_at(const zck_hf_checkpoint *c, size_t i) {
  ZCK_ASSERT(i < c->warnings.len);
  return c->warnings.items[i];
}

void zck_hf_close(zck_hf_checkpoint *c) {
  if (!c) return;
  for (size_t i = 0; i < c->nfiles; i++) zck_st_close(c->files[i]);
  free(c->files);
  free(c->tensors);
  zck__strmap_free(&c->map);
  zck__strlist_free(&c->warnings);
  zck_hf_index_free(c->index);
  free(c);
}

static void zck__hf_take_warnings(zck_hf_checkpoint *c, const zck_st_file *f) {
  for (size_t i = 0; i < zck_st_warning_count(f); i++) zck__strlist_addf(&c->warnings, "%s", zck_st_warning_at(f, i));
}

static zck_status zck__hf_open_single(zck_hf_checkpoint *c, const char *path) {
  c->files = zck__calloc(1, sizeof *c->files);
  if (!c->files) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck_st_open(path, &c->files[0]));
  c->nfiles = 1;
  const zck_st_file *f = c->files[0];
  zck__hf_take_warnings(c, f);
  c->count = zck_st_count(f);
  c->tensors = zck__calloc(c->count ? c->count : 1, sizeof *c->tensors);
  if (!c->tensors) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck__strmap_init(&c->map, c->count));
  for (size_t i = 0; i < c->count; i++) {
    c->tensors[i].t = zck_st_tensor_at(f, i);
    c->tensors[i].file = f;
    c->tensors[i].shard = 0;
    bool dup;
    ZCK_TRY(zck__strmap_put(&c->map, c->tensors[i].t->name, i, &dup, NULL));
  }
  return ZCK_OK;
}

static char *zck__hf_dirname(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return zck__strdup(".");
  if (slash == path) return zck__strdup("/");
  return zck__strndup(path, (size_t)(slash - path));
}

/* The index file, parsed; the shards' extension is the index name minus ".index.json",
 * then its suffix. */
static zck_status zck__hf_read_index(zck_hf_checkpoint *c, const char *index_path) {
  const char *base = strrchr(index_path, '/');
  base = base ? base + 1 : index_path;
  size_t bl = strlen(base);
  const char *tail = ".index.json";
  if (bl <= strlen(tail) || strcmp(base + bl - strlen(tail), tail))
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: an index file name ends with .index.json", index_path);
  char *stem = zck__strndup(base, bl - strlen(tail));
  if (!stem) return ZCK_ERR_NO_MEMORY;
  const char *dot = strrchr(stem, '.');
  char *ext = zck__strdup(dot && dot != stem ? dot : "");
  free(stem);
  if (!ext) return ZCK_ERR_NO_MEMORY;
  char *json = NULL;
  size_t len = 0;
  zck_status s = zck__read_small_file(index_path, ZCK__HF_INDEX_MAX, &json, &len);
  if (s == ZCK_OK) s = zck_hf_index_parse(index_path, json, len, ext, &c->index);
  free(json);
  free(ext);
  return s;
}

/* Every shard the index names, opened; a missing one named with a tensor it holds. */
static zck_status zck__hf_open_shards(zck_hf_checkpoint *c, const char *index_path) {
  const zck_hf_index *ix = c->index;
  char q[ZCK__QNAME_MAX], q2[ZCK__QNAME_MAX];
  char *dir = zck__hf_dirname(index_path);
  if (!dir) return ZCK_ERR_NO_MEMORY;
  c->files = zck__calloc(ix->nshards ? ix->nshards : 1, sizeof *c->files);
  if (!c->files) { free(dir); return ZCK_ERR_NO_MEMORY; }
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < ix->nshards && s == ZCK_OK; i++) {
    char *p = zck__path_join(dir, ix->shards[i]);
    if (!p) { s = ZCK_ERR_NO_MEMORY; break; }
    struct stat st;
    if (stat(p, &st) != 0 && errno == ENOENT) {
      size_t first = 0;
      while (first < ix->count && ix->shard_of[first] != ix->shards[i]) first++;
      s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: shard %s (holding tensor %s) does not exist", index_path,
                    zck__qname(p, q), zck__qname(ix->tensors[first], q2));
    } else {
      s = zck_st_open(p, &c->files[i]);
      if (s == ZCK_OK) {
        c->nfiles++;
        zck__hf_take_warnings(c, c->files[i]);
      }
    }
    free(p);
  }
  free(dir);
  return s;
}

/* Every shard's tensors: each name in one shard only; unmapped ones kept and warned:
 * transformers' from_pretrained takes every key of every shard file the weight_map names
 * (safe_open(...).keys()), and huggingface_hub's load_torch_model and transformers'
 * load_sharded_checkpoint load each such shard whole, the hub warning that "Shard files
 * contain tensors absent from the index". Dropping them would lose weights those readers
 * load. *sum: the bytes total_size should count; *unmapped: how many are not in the map. */
static zck_status zck__hf_check_shards(zck_hf_checkpoint *c, const char *index_path, uint64_t *sum,
                                       size_t *unmapped) {
  const zck_hf_index *ix = c->index;
  char q[ZCK__QNAME_MAX];
  zck__strmap where;
  ZCK_TRY(zck__strmap_init(&where, ix->count));
  zck_status s = ZCK_OK;
  *sum = 0;
  *unmapped = 0;
  for (size_t i = 0; i < c->nfiles && s == ZCK_OK; i++) {
    const zck_st_file *f = c->files[i];
    for (size_t k = 0; k < zck_st_count(f) && s == ZCK_OK; k++) {
      const zck_st_tensor *t = zck_st_tensor_at(f, k);
      bool dup;
      size_t prev;
      s = zck__strmap_put(&where, t->name, i, &dup, &prev);
      if (s != ZCK_OK) break;
      if (dup) {
        s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s is in two shards, %s and %s", index_path,
                      zck__qname(t->name, q), zck_st_path(c->files[prev]), zck_st_path(f));
        break;
      }
      size_t mi;
      if (!zck__strmap_get(&ix->tensor_map, t->name, &mi)) {
        *sum += t->nbytes; /* loaded all the same: part of what total_size should count */
        if ((*unmapped)++ < 5)
          zck__strlist_addf(&c->warnings, "%s: tensor %s is absent from the weight_map; kept, as transformers loads "
                            "every tensor of a shard", zck_st_path(f), zck__qname(t->name, q));
      } else if (ix->shard_of[mi] == ix->shards[i]) {
        *sum += t->nbytes;
      }
    }
  }
  if (*unmapped > 5)
    zck__strlist_addf(&c->warnings, "%s: %zu more tensors absent from the weight_map, kept", index_path,
                      *unmapped - 5);
  zck__strmap_free(&where);
  return s;
}

/* The checkpoint's tensors: every weight_map entry in its shard, in weight_map order; then
 * the unmapped ones, shard by shard in header order. */
static zck_status zck__hf_list_tensors(zck_hf_checkpoint *c, const char *index_path, size_t unmapped) {
  const zck_hf_index *ix = c->index;
  char q[ZCK__QNAME_MAX], q2[ZCK__QNAME_MAX];
  size_t total = ix->count + unmapped;
  c->tensors = zck__calloc(total ? total : 1, sizeof *c->tensors);
  if (!c->tensors) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck__strmap_init(&c->map, total));
  for (size_t i = 0; i < ix->count; i++) {
    size_t si = 0;
    zck__strmap_get(&ix->shard_map, ix->shard_of[i], &si);
    const zck_st_tensor *t = zck_st_find(c->files[si], ix->tensors[i]);
    if (!t)
      return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: weight_map says %s but that shard has no such tensor",
                       index_path, zck__qname(ix->tensors[i], q), zck__qname(ix->shard_of[i], q2));
    c->tensors[i].t = t;
    c->tensors[i].file = c->files[si];
    c->tensors[i].shard = si;
    bool dup;
    ZCK_TRY(zck__strmap_put(&c->map, t->name, i, &dup, NULL));
  }
  c->count = ix->count;
  for (size_t i = 0; i < c->nfiles && c->count < total; i++) {
    const zck_st_file *f = c->files[i];
    for (size_t k = 0; k < zck_st_count(f); k++) {
      const zck_st_tensor *t = zck_st_tensor_at(f, k);
      size_t mi;
      if (zck__strmap_get(&ix->tensor_map, t->name, &mi)) continue;
      c->tensors[c->count] = (zck_hf_tensor){t, f, i};
      bool dup;
      ZCK_TRY(zck__strmap_put(&c->map, t->name, c->count++, &dup, NULL));
    }
  }
  return ZCK_OK;
}

static zck_status zck__hf_open_index(zck_hf_checkpoint *c, const char *index_path) {
  uint64_t sum;
  size_t unmapped;
  ZCK_TRY(zck__hf_read_index(c, index_path));
  ZCK_TRY(zck__hf_open_shards(c, index_path));
  ZCK_TRY(zck__hf_check_shards(c, index_path, &sum, &unmapped));
  ZCK_TRY(zck__hf_list_tensors(c, index_path, unmapped));
  const zck_hf_index *ix = c->index;
  if (ix->has_total && ix->total_size != sum)
    zck__strlist_addf(&c->warnings, "%s: metadata.total_size is %llu but the tensors hold %llu bytes", index_path,
                      (unsigned long long)ix->total_size, (unsigned long long)sum);
  return ZCK_OK;
}

static bool zck__hf_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

zck_status zck_hf_open(const char *path, zck_hf_checkpoint **out) {
  *out = NULL;
  zck_hf_checkpoint *c = zck__calloc(1, sizeof *c);
  if (!c) return ZCK_ERR_NO_MEMORY;
  zck_status s;
  struct stat st;
  if (stat(path, &st) != 0) {
    s = zck__fail_errno(errno, "%s: cannot open", path);
  } else if (S_ISDIR(st.st_mode)) {
    /* transformers looks for model.safetensors first, then the index */
    char *single = zck__path_join(path, "model.safetensors");
    char *index = zck__path_join(path, "model.safetensors.index.json");
    if (!single || !index) s = ZCK_ERR_NO_MEMORY;
    else if (zck__hf_exists(single)) {
      s = zck__hf_open_single(c, single);
      if (s == ZCK_OK && zck__hf_exists(index))
        zck__strlist_addf(&c->warnings, "%s: both model.safetensors and model.safetensors.index.json exist; "
                          "model.safetensors is used, as transformers does", path);
    } else if (zck__hf_exists(index)) s = zck__hf_open_index(c, index);
    else s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no model.safetensors or model.safetensors.index.json", path);
    free(single);
    free(index);
  } else {
    size_t n = strlen(path);
    if (n > 11 && !strcmp(path + n - 11, ".index.json")) s = zck__hf_open_index(c, path);
    else s = zck__hf_open_single(c, path);
  }
  if (s != ZCK_OK) {
    zck_hf_close(c);
    return s;
  }
  *out = c;
  return ZCK_OK;
}
