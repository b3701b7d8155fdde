/* dcp_safetensors.c: a DCP saved with safetensors storage, torch's
 * HuggingFaceStorageWriter(path, save_distributed=True): one
 * shard-<r>-model-<i>-of-<n>.safetensors per rank and output file, each tensor in it a
 * chunk, its place in the global tensor in the header's __metadata__ DCP_SHARDING_INFO
 * (a JSON string {fqn: {"saved_offsets": [...]}}), and no .metadata. As torch's
 * HuggingFaceStorageReader reads it: a tensor's global size is the largest offset + size
 * of its chunks in each dimension; the entries come in DCP_SHARDING_INFO's order, file
 * by file (the state dict's order, which torch's own consolidation keeps). Every key is a
 * model weight (safetensors holds tensors only: no optimizer settings). The chunks fill
 * the entries, chunks, items and files the .metadata reader fills (dcp_meta.c), with the
 * same geometry checks; safetensors keeps no checksum, so the items carry no record.
 * Each entry also keeps the <i> of its shards' names: the output file the save's
 * fqn_to_index_mapping gave it, which torch's consolidation of the folder follows
 * (jobs/consolidate_torch_st.c). */
#include "dcp_internal.h"

#include "safetensors/safetensors.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SHARDING_INFO_KEY "DCP_SHARDING_INFO"
#define SAVED_OFFSETS_KEY "saved_offsets"

static bool shard_name(const char *n) {
  size_t len = strlen(n);
  return !strncmp(n, "shard-", 6) && len > 12 && !strcmp(n + len - 12, ".safetensors") && strstr(n, "-model-");
}

bool zck__dcp_safetensors_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return false;
  bool any = false;
  struct dirent *e;
  while (!any && (e = readdir(d))) any = shard_name(e->d_name);
  closedir(d);
  return any;
}

/* "shard-<r>-model-<i>-of-<n>.safetensors" (torch's _gen_file_name, numbers zero-filled to
 * 5 digits or longer): false for a name of another shape, or numbers past 32 bits. */
static bool shard_numbers(const char *n, uint32_t *file, uint32_t *of) {
  const char *parts[4] = {"shard-", "-model-", "-of-", ".safetensors"};
  uint64_t v[3] = {0, 0, 0};
  const char *p = n;
  for (int k = 0; k < 4; k++) {
    size_t len = strlen(parts[k]);
    if (strncmp(p, parts[k], len)) return false;
    p += len;
    if (k == 3) {
      if (*p) return false;
      *file = (uint32_t)v[1];
      *of = (uint32_t)v[2];
      return true;
    }
    if (*p < '0' || *p > '9') return false;
    for (; *p >= '0' && *p <= '9'; p++)
      if ((v[k] = v[k] * 10 + (uint64_t)(*p - '0')) > UINT32_MAX) return false;
  }
  return false;
}

bool zck_dcp_is_safetensors(const zck_dcp *c) { return c->safetensors; }

uint32_t zck_dcp_st_file(const zck_dcp *c, size_t entry, uint32_t *of) {
  *of = c->safetensors ? c->st_files : 0;
  return c->safetensors && entry < c->n_entries ? c->entries[entry].st_file : 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The shard files of dir, sorted (torch lists the folder; its order does not matter to a
 * reader that places every chunk by its offsets, sorting makes the entry order stable). */
static zck_status list_shards(const char *dir, char ***names, size_t *n) {
  *names = NULL;
  *n = 0;
  DIR *d = opendir(dir);
  if (!d) return zck__fail_errno(errno, "%s: cannot open folder", dir);
  size_t cap = 0;
  struct dirent *e;
  zck_status s = ZCK_OK;
  while (s == ZCK_OK && (e = readdir(d))) {
    if (!shard_name(e->d_name)) continue;
    if (!ZCK__GROW(*names, cap, *n + 1) || !((*names)[*n] = zck__strdup(e->d_name))) s = ZCK_ERR_NO_MEMORY;
    else (*n)++;
  }
  closedir(d);
  if (s == ZCK_OK) qsort(*names, *n, sizeof **names, cmp_str);
  return s;
}

typedef struct shard {
  zck_st_file *st;
  cJSON *info;                     /* DCP_SHARDING_INFO parsed */
  size_t file;                     /* into c->files */
} shard;

static zck_status add_file(zck_dcp *c, const char *dir, const char *name, size_t *out) {
  if (!ZCK__GROW(c->files, c->cap_files, c->n_files + 1)) return ZCK_ERR_NO_MEMORY;
  zck__dcp_file *f = &c->files[c->n_files];
  memset(f, 0, sizeof *f);
  f->src.fd = -1;
  f->name = zck__strdup(name);
  f->path = zck__path_join(dir, name);
  if (!f->name || !f->path) {
    free(f->name);
    free(f->path);
    return ZCK_ERR_NO_MEMORY;
  }
  *out = c->n_files++;
  return ZCK_OK;
}

/* saved_offsets of key in a shard's info: exactly ndim non-negative integers. */
static zck_status saved_offsets(const char *path, const cJSON *info, const char *key, int ndim, int64_t *off) {
  const cJSON *o = cJSON_GetObjectItemCaseSensitive(info, key);
  const cJSON *a = o ? cJSON_GetObjectItemCaseSensitive(o, SAVED_OFFSETS_KEY) : NULL;
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != ndim)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s: %s has no saved_offsets of %d dimensions", path, key, SHARDING_INFO_KEY, ndim);
  int d = 0;
  for (const cJSON *v = a->child; v; v = v->next, d++) {
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 9007199254740992.0 ||
        v->valuedouble != (double)(int64_t)v->valuedouble)
      return zck__fail(ZCK_ERR_FORMAT, "%s: %s: saved_offsets holds something other than an offset", path, key);
    off[d] = (int64_t)v->valuedouble;
  }
  return ZCK_OK;
}

static zck_status open_shards(zck_dcp *c, const char *dir, char **names, size_t n, shard *sh) {
  for (size_t i = 0; i < n; i++) {
    size_t fi;
    ZCK_TRY(add_file(c, dir, names[i], &fi));
    sh[i].file = fi;
    const char *path = c->files[fi].path;
    ZCK_TRY(zck_st_open(path, &sh[i].st));
    const char *js = zck_st_metadata_get(sh[i].st, SHARDING_INFO_KEY);
    if (!js) return zck__fail(ZCK_ERR_FORMAT, "%s: no %s in its metadata: not a shard of a DCP save", path, SHARDING_INFO_KEY);
    sh[i].info = cJSON_Parse(js);
    if (!cJSON_IsObject(sh[i].info)) return zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a JSON object", path, SHARDING_INFO_KEY);
    const char *ver = zck_st_metadata_get(sh[i].st, "DCP_VERSION");
    if (ver && !c->version && !(c->version = zck__strdup(ver))) return ZCK_ERR_NO_MEMORY;
    /* every tensor has its offsets, every offsets entry its tensor */
    size_t n_info = (size_t)cJSON_GetArraySize(sh[i].info);
    if (n_info != zck_st_count(sh[i].st))
      return zck__fail(ZCK_ERR_FORMAT, "%s: %zu tensors but %zu entries in %s", path, zck_st_count(sh[i].st), n_info,
                       SHARDING_INFO_KEY);
    for (const cJSON *k = sh[i].info->child; k; k = k->next)
      if (!k->string || !zck_st_find(sh[i].st, k->string))
        return zck__fail(ZCK_ERR_FORMAT, "%s: %s names %s, which the file does not hold", path, SHARDING_INFO_KEY,
                         k->string ? k->string : "?");
  }
  return ZCK_OK;
}

/* Entries in DCP_SHARDING_INFO order, file by file, with their chunk counts and shapes. */
static zck_status make_entries(zck_dcp *c, shard *sh, size_t n, zck__strmap *index) {
  for (size_t i = 0; i < n; i++) {
    const char *path = c->files[sh[i].file].path;
    uint32_t file = 0, of = 0;
    if (!shard_numbers(c->files[sh[i].file].name, &file, &of)) file = of = 0;
    if (i == 0) c->st_files = of;
    else if (c->st_files != of) c->st_files = 0;
    for (const cJSON *k = sh[i].info->child; k; k = k->next) {
      const zck_st_tensor *t = zck_st_find(sh[i].st, k->string);
      if (t->dtype == ZCK_DTYPE_INVALID)
        return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s: dtype %s is not read", path, t->name, zck_st_dtype_name(t->st_dtype));
      if (t->ndim > ZCK_MAX_DIMS) return zck__fail(ZCK_ERR_LIMIT, "%s: %s: more than %d dimensions", path, t->name, ZCK_MAX_DIMS);
      int64_t off[ZCK_MAX_DIMS] = {0};
      ZCK_TRY(saved_offsets(path, sh[i].info, t->name, t->ndim, off));
      size_t ei;
      if (!zck__strmap_get(index, t->name, &ei)) {
        if (!ZCK__GROW(c->entries, c->cap_entries, c->n_entries + 1)) return ZCK_ERR_NO_MEMORY;
        ei = c->n_entries;
        zck__dcp_entry *e = &c->entries[ei];
        memset(e, 0, sizeof *e);
        e->item = SIZE_MAX;
        e->key = zck__strdup(t->name);
        e->fqn = zck__strdup(t->name);
        if (!e->key || !e->fqn) {
          free(e->key);
          free(e->fqn);
          return ZCK_ERR_NO_MEMORY;
        }
        c->n_entries++;
        e->st_file = file;
        e->k = (zck_dcp_key){ZCK_DCP_KEY_MODEL, e->fqn, strlen(e->fqn), NULL, 0};
        e->dtype = t->dtype;
        e->ndim = t->ndim;
        bool dup;
        size_t prev;
        ZCK_TRY(zck__strmap_put(index, e->key, ei, &dup, &prev));
      }
      zck__dcp_entry *e = &c->entries[ei];
      if (e->st_file != file) e->st_file = 0; /* in two output files: torch's writer puts a name in one */
      if (e->dtype != t->dtype || e->ndim != t->ndim)
        return zck__fail(ZCK_ERR_FORMAT, "%s: %s: a %s chunk of %d dimensions where another file has %s of %d", path, t->name,
                         zck_dtype_name(t->dtype), t->ndim, zck_dtype_name(e->dtype), e->ndim);
      for (int d = 0; d < t->ndim; d++) {
        uint64_t end = (uint64_t)off[d] + t->shape[d];
        if (t->shape[d] > ((uint64_t)1 << 62) || end > ((uint64_t)1 << 62))
          return zck__fail(ZCK_ERR_LIMIT, "%s: %s: dimension %d too large", path, t->name, d);
        if ((int64_t)end > e->shape[d]) e->shape[d] = (int64_t)end;
      }
      e->n_chunks++;
    }
  }
  for (size_t i = 0; i < c->n_entries; i++) {
    zck__dcp_entry *e = &c->entries[i];
    e->numel = 1;
    for (int d = 0; d < e->ndim; d++)
      if (!zck__mul_u64(e->numel, (uint64_t)e->shape[d], &e->numel) || e->numel >> 62)
        return zck__fail(ZCK_ERR_LIMIT, "%s: %s: shape too large", c->dir, e->key);
  }
  return ZCK_OK;
}

/* One chunk and one item per tensor of every shard. */
static zck_status make_chunks(zck_dcp *c, shard *sh, size_t n, const zck__strmap *index) {
  size_t total = 0;
  for (size_t i = 0; i < c->n_entries; i++) {
    c->entries[i].first_chunk = total;
    total += c->entries[i].n_chunks;
    c->entries[i].n_chunks = 0;   /* counted again as they fill */
  }
  c->chunks = zck__calloc(total ? total : 1, sizeof *c->chunks);
  c->items = zck__calloc(total ? total : 1, sizeof *c->items);
  if (!c->chunks || !c->items) return ZCK_ERR_NO_MEMORY;
  c->cap_chunks = c->cap_items = total;
  for (size_t i = 0; i < n; i++) {
    const char *path = c->files[sh[i].file].path;
    for (const cJSON *k = sh[i].info->child; k; k = k->next) {
      const zck_st_tensor *t = zck_st_find(sh[i].st, k->string);
      size_t ei;
      zck__strmap_get(index, t->name, &ei);
      zck__dcp_entry *e = &c->entries[ei];
      size_t ci = e->first_chunk + e->n_chunks++;
      zck__dcp_chunk *ch = &c->chunks[ci];
      ZCK_TRY(saved_offsets(path, sh[i].info, t->name, t->ndim, ch->offsets));
      for (int d = 0; d < t->ndim; d++) ch->sizes[d] = (int64_t)t->shape[d];
      ch->item = c->n_items;
      zck__dcp_item *it = &c->items[c->n_items++];
      it->entry = ei;
      it->chunk = ci;
      it->file = sh[i].file;
      it->off = t->offset;
      it->len = t->nbytes;
      if (c->files[sh[i].file].data_start == 0 || t->offset - t->begin < c->files[sh[i].file].data_start)
        c->files[sh[i].file].data_start = t->offset - t->begin;
    }
  }
  c->n_chunks = total;
  for (size_t i = 0; i < c->n_entries; i++) ZCK_TRY(zck__dcp_check_chunks(c, c->dir, i));
  return ZCK_OK;
}

zck_status zck__dcp_parse_safetensors(zck_dcp *c, const char *dir) {
  char **names;
  size_t n;
  ZCK_TRY(list_shards(dir, &names, &n));
  shard *sh = zck__calloc(n ? n : 1, sizeof *sh);
  zck__strmap index;
  zck_status s = sh ? zck__strmap_init(&index, 64) : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) {
    if (!n) s = zck__fail(ZCK_ERR_FORMAT, "%s: no shard-*.safetensors", dir);
    if (s == ZCK_OK) s = open_shards(c, dir, names, n, sh);
    if (s == ZCK_OK) s = make_entries(c, sh, n, &index);
    if (s == ZCK_OK) s = make_chunks(c, sh, n, &index);
    zck__strmap_free(&index);
  }
  for (size_t i = 0; sh && i < n; i++) {
    zck_st_close(sh[i].st);
    cJSON_Delete(sh[i].info);
  }
  free(sh);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return s;
}
