/* hf_writer.c: Hugging Face sharded output: the shard
 * assignment of huggingface_hub's split_state_dict_into_shards_factory, the file names of
 * SAFETENSORS_WEIGHTS_FILE_PATTERN, the index file as huggingface_hub (json.dump indent=2)
 * or transformers / DeepSpeed zero_to_fp32 (sort_keys=True, "\n") write it, and an output
 * directory that appears in one rename (zck__outdir). With torch_dcp, the files are
 * assigned by the caller and named, headed and indexed as torch's
 * consolidate_safetensors_files does (safetensors.h). */
#include "st_internal.h"

#include <stdlib.h>
#include <string.h>

#include "stream_hash.h"

/* ---- shard assignment */

void zck_hf_assign_shards(const uint64_t *sizes, size_t n, uint64_t max_shard_size, uint32_t *shard_of, size_t *nshards) {
  /* A shard gets its number when it is appended to shard_list: an oversized tensor at once,
   * the open shard when it is closed. Members of the open shard are marked UINT32_MAX from
   * open_start on (oversized tensors in between already have their number). */
  size_t count = 0, open_start = 0, open_len = 0;
  uint64_t cur = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t sz = sizes[i];
    if (sz > max_shard_size) {
      shard_of[i] = (uint32_t)count++;
      continue;
    }
    if (sz > max_shard_size - cur) { /* cur + sz > max, without overflow (cur <= max) */
      for (size_t j = open_start; j < i; j++)
        if (shard_of[j] == UINT32_MAX) shard_of[j] = (uint32_t)count;
      count++;
      cur = 0;
      open_len = 0;
    }
    if (!open_len) open_start = i;
    shard_of[i] = UINT32_MAX;
    cur += sz;
    open_len++;
  }
  if (open_len) {
    for (size_t j = open_start; j < n; j++)
      if (shard_of[j] == UINT32_MAX) shard_of[j] = (uint32_t)count;
    count++;
  }
  *nshards = count;
}

/* ---- the writer */

typedef struct zck__hf_item {
  const char *name;
  zck_st_dtype dtype;
  int ndim;
  const uint64_t *shape;
  uint64_t nbytes;
  uint32_t shard;
  uint32_t file;            /* torch_dcp: the file number set (0: none yet) */
  size_t local;             /* index in its shard's zck_st_writer */
} zck__hf_item;

struct zck_hf_writer {
  char *out_dir;
  zck_hf_options opts;
  char *prefix;
  zck__hf_item *items;
  size_t count, cap;
  zck__strmap names;
  zck__st_pairs md;
  zck__arena arena;
  size_t nshards;
  zck_st_writer **shards;
  char **shard_names;
  zck__outdir dir;
  bool laid_out, dir_created, committed;
  bool hash;                    /* zck_hf_writer_hash_inline */
  zck__shash_budget budget;
  zck__manifest_known known;    /* owned (stream_hash.h zck__known_take) */
  size_t cap_known;
};

zck_status zck_hf_writer_new(const char *out_dir, const zck_hf_options *opts, zck_hf_writer **out) {
  *out = NULL;
  zck_hf_writer *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  zck_hf_options defaults = ZCK_HF_OPTIONS_INIT;
  w->opts = opts ? *opts : defaults;
  if (!w->opts.max_shard_size) w->opts.max_shard_size = ZCK_HF_DEFAULT_MAX_SHARD;
  if (w->opts.torch_dcp) w->opts.style = ZCK_HF_INDEX_HUB; /* torch's json.dump(indent=2), in mapping order */
  w->out_dir = zck__strdup(out_dir);
  w->prefix = zck__strdup(w->opts.prefix ? w->opts.prefix : "model");
  w->opts.prefix = NULL;
  zck_status s = (w->out_dir && w->prefix) ? zck__strmap_init(&w->names, 64) : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK && (!*w->prefix || strchr(w->prefix, '/')))
    s = zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: file name prefix '%s' must be a plain name", w->prefix);
  if (s != ZCK_OK) {
    zck_hf_writer_free(w);
    return s;
  }
  *out = w;
  return ZCK_OK;
}

void zck_hf_writer_free(zck_hf_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->nshards; i++) zck_st_writer_free(w->shards ? w->shards[i] : NULL);
  /* removes the temporary tree unless committed; after a commit it only frees the names */
  if (w->dir_created) zck__outdir_abort(&w->dir);
  if (w->shard_names)
    for (size_t i = 0; i < w->nshards; i++) free(w->shard_names[i]);
  free(w->shard_names);
  free(w->shards);
  zck__known_free(&w->known);
  free(w->items);
  zck__st_pairs_free(&w->md);
  free(w->out_dir);
  free(w->prefix);
  zck__strmap_free(&w->names);
  zck__arena_free(&w->arena);
  free(w);
}

zck_status zck_hf_writer_set_metadata(zck_hf_writer *w, const char *key, const char *value) {
  ZCK_ASSERT(!w->laid_out);
  if (w->opts.torch_dcp) return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: torch's consolidation writes no metadata (\"%s\")", key);
  if (!strcmp(key, "total_size") || !strcmp(key, "total_parameters"))
    return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: metadata key \"%s\" is computed, not set", key);
  size_t kl = strlen(key), vl = strlen(value);
  if (zck__utf8_check((const uint8_t *)key, kl) != kl || zck__utf8_check((const uint8_t *)value, vl) != vl)
    return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: metadata \"%s\" is not valid UTF-8", key);
  char *v = zck__arena_strndup(&w->arena, value, strlen(value));
  if (!v) return ZCK_ERR_NO_MEMORY;
  size_t at = zck__st_pairs_find(&w->md, key);
  if (at != SIZE_MAX) {
    w->md.values[at] = v;
    return ZCK_OK;
  }
  char *k = zck__arena_strndup(&w->arena, key, strlen(key));
  if (!k) return ZCK_ERR_NO_MEMORY;
  bool dup;
  return zck__st_pairs_add(&w->md, k, v, &dup);
}

zck_status zck_hf_writer_add(zck_hf_writer *w, const char *name, zck_st_dtype dtype, int ndim, const uint64_t *shape,
                             size_t *index) {
  ZCK_ASSERT(!w->laid_out);
  ZCK_ASSERT((unsigned)dtype < ZCK_ST_DTYPE_COUNT && ndim >= 0 && (ndim == 0 || shape));
  char q[ZCK__QNAME_MAX];
  uint64_t numel = 1, nbits;
  for (int d = 0; d < ndim; d++)
    if (!zck__mul_u64(numel, shape[d], &numel))
      return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: tensor %s: element count overflows", zck__qname(name, q));
  if (!zck__mul_u64(numel, zck_st_dtype_bits(dtype), &nbits) || nbits % 8)
    return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: tensor %s: size is not a whole number of bytes", zck__qname(name, q));
  if (!ZCK__GROW(w->items, w->cap, w->count + 1)) return ZCK_ERR_NO_MEMORY;
  char *nm = zck__arena_strndup(&w->arena, name, strlen(name));
  if (!nm) return ZCK_ERR_NO_MEMORY;
  bool dup;
  ZCK_TRY(zck__strmap_put(&w->names, nm, w->count, &dup, NULL));
  if (dup) return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: tensor %s added twice", zck__qname(name, q));
  zck__hf_item *it = &w->items[w->count];
  memset(it, 0, sizeof *it);
  it->name = nm;
  it->dtype = dtype;
  it->ndim = ndim;
  if (ndim) {
    uint64_t *sh = zck__arena_alloc(&w->arena, (size_t)ndim * sizeof *sh);
    if (!sh) return ZCK_ERR_NO_MEMORY;
    memcpy(sh, shape, (size_t)ndim * sizeof *sh);
    it->shape = sh;
  }
  it->nbytes = nbits / 8;
  if (index) *index = w->count;
  w->count++;
  return ZCK_OK;
}

size_t zck_hf_writer_shard_count(const zck_hf_writer *w) {
  ZCK_ASSERT(w->laid_out);
  return w->nshards;
}

const char *zck_hf_writer_shard_name(const zck_hf_writer *w, size_t shard) {
  ZCK_ASSERT(w->laid_out && shard < w->nshards);
  return w->shard_names[shard];
}

static zck_status zck__hf_layout_files(zck_hf_writer *w);

zck_status zck_hf_writer_set_file(zck_hf_writer *w, size_t index, uint32_t file) {
  ZCK_ASSERT(w->opts.torch_dcp && !w->laid_out && index < w->count);
  if (!file) return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: tensor %s: file numbers start at 1", w->items[index].name);
  w->items[index].file = file;
  return ZCK_OK;
}

/* torch_dcp: one shard per file number used, in the order of its first tensor (torch's
 * output_files_data, a dict filled in mapping order), named by number and the largest. */
static zck_status zck__hf_torch_files(zck_hf_writer *w, size_t *nshards) {
  if (!w->count) return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: no tensors (torch's consolidation takes max() of none)");
  uint32_t max = 0;
  for (size_t i = 0; i < w->count; i++) {
    if (!w->items[i].file) return zck__fail(ZCK_ERR_INTERNAL, "HF writer: tensor %s has no file", w->items[i].name);
    if (w->items[i].file > max) max = w->items[i].file;
  }
  uint32_t *file_of_shard = zck__malloc(w->count * sizeof *file_of_shard);
  w->shard_names = zck__calloc(w->count, sizeof *w->shard_names);
  if (!file_of_shard || !w->shard_names) { free(file_of_shard); return ZCK_ERR_NO_MEMORY; }
  size_t n = 0;
  for (size_t i = 0; i < w->count; i++) {
    size_t sh = 0;
    while (sh < n && file_of_shard[sh] != w->items[i].file) sh++; /* few files: a scan */
    if (sh == n) file_of_shard[n++] = w->items[i].file;
    w->items[i].shard = (uint32_t)sh;
  }
  zck_status s = ZCK_OK;
  for (size_t sh = 0; s == ZCK_OK && sh < n; sh++)
    if (!(w->shard_names[sh] = zck__sprintf("model-%05u-of-%05u.safetensors", file_of_shard[sh], max))) s = ZCK_ERR_NO_MEMORY;
  free(file_of_shard);
  *nshards = n;
  return s;
}

zck_status zck_hf_writer_layout(zck_hf_writer *w) {
  ZCK_ASSERT(!w->laid_out);
  if (w->opts.torch_dcp) {
    size_t n = 0;
    zck_status s = zck__hf_torch_files(w, &n);
    w->nshards = w->shard_names ? n : 0; /* the names are freed by count */
    ZCK_TRY(s);
    if (!(w->shards = zck__calloc(n, sizeof *w->shards))) return ZCK_ERR_NO_MEMORY;
    for (size_t sh = 0; sh < n; sh++) {
      ZCK_TRY(zck_st_writer_new(&w->shards[sh]));
      zck_st_writer_set_style(w->shards[sh], ZCK_ST_HEADER_TORCH_DCP);
    }
    return zck__hf_layout_files(w);
  }
  uint64_t *sizes = zck__malloc((w->count ? w->count : 1) * sizeof *sizes);
  uint32_t *shard_of = zck__malloc((w->count ? w->count : 1) * sizeof *shard_of);
  if (!sizes || !shard_of) { free(sizes); free(shard_of); return ZCK_ERR_NO_MEMORY; }
  for (size_t i = 0; i < w->count; i++) sizes[i] = w->items[i].nbytes;
  size_t nshards;
  zck_hf_assign_shards(sizes, w->count, w->opts.max_shard_size, shard_of, &nshards);
  for (size_t i = 0; i < w->count; i++) w->items[i].shard = shard_of[i];
  free(sizes);
  free(shard_of);
  if (nshards == 0) nshards = 1; /* no tensors: one empty model.safetensors */
  w->shards = zck__calloc(nshards, sizeof *w->shards);
  w->shard_names = zck__calloc(nshards, sizeof *w->shard_names);
  if (!w->shards || !w->shard_names) return ZCK_ERR_NO_MEMORY;
  w->nshards = nshards;
  for (size_t s = 0; s < nshards; s++) {
    w->shard_names[s] = nshards == 1 ? zck__sprintf("%s.safetensors", w->prefix)
                                     : zck__sprintf("%s-%05zu-of-%05zu.safetensors", w->prefix, s + 1, nshards);
    if (!w->shard_names[s]) return ZCK_ERR_NO_MEMORY;
    ZCK_TRY(zck_st_writer_new(&w->shards[s]));
    if (nshards == 1)
      for (size_t m = 0; m < w->md.count; m++) ZCK_TRY(zck_st_writer_set_metadata(w->shards[s], w->md.keys[m], w->md.values[m]));
  }
  return zck__hf_layout_files(w);
}

/* Every tensor into its shard's writer, every shard laid out and created (temporary tree). */
static zck_status zck__hf_layout_files(zck_hf_writer *w) {
  size_t nshards = w->nshards;
  for (size_t i = 0; i < w->count; i++) {
    zck__hf_item *it = &w->items[i];
    ZCK_TRY(zck_st_writer_add(w->shards[it->shard], it->name, it->dtype, it->ndim, it->shape, &it->local));
  }
  for (size_t s = 0; s < nshards; s++) ZCK_TRY(zck_st_writer_layout(w->shards[s]));
  for (size_t s = 0; w->hash && s < nshards; s++) ZCK_TRY(zck_st_writer_hash(w->shards[s], &w->budget));
  ZCK_TRY(zck__outdir_create(&w->dir, w->out_dir, w->opts.overwrite));
  w->dir_created = true;
  for (size_t s = 0; s < nshards; s++) {
    char *p = zck__outdir_file(&w->dir, w->shard_names[s]);
    if (!p) return ZCK_ERR_NO_MEMORY;
    zck_status st = zck_st_writer_open(w->shards[s], p);
    free(p);
    ZCK_TRY(st);
  }
  w->laid_out = true;
  return ZCK_OK;
}

zck_hf_slot zck_hf_writer_slot(const zck_hf_writer *w, size_t index) {
  ZCK_ASSERT(w->laid_out && index < w->count);
  const zck__hf_item *it = &w->items[index];
  const zck_st_tensor *t = zck_st_writer_tensor(w->shards[it->shard], it->local);
  zck_hf_slot slot = {it->shard, zck_st_writer_fd(w->shards[it->shard]), t->offset, t->nbytes};
  return slot;
}

zck_status zck_hf_writer_write(zck_hf_writer *w, size_t index, const void *data, uint64_t off, uint64_t n) {
  ZCK_ASSERT(w->laid_out && index < w->count);
  const zck__hf_item *it = &w->items[index];
  return zck_st_writer_write(w->shards[it->shard], it->local, data, off, n);
}

char *zck_hf_writer_extra_path(const zck_hf_writer *w, const char *name) {
  ZCK_ASSERT(w->laid_out && !w->committed);
  return zck__outdir_file(&w->dir, name);
}

/* ---- the index file */

static int zck__hf_cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int zck__hf_cmp_item_name(const void *a, const void *b) {
  return strcmp((*(const zck__hf_item *const *)a)->name, (*(const zck__hf_item *const *)b)->name);
}

/* Python json.dumps(index, indent=2[, sort_keys=True]) (ensure_ascii on). */
static zck_status zck__hf_index_json(zck_hf_writer *w, zck__buf *b) {
  bool sorted = w->opts.style == ZCK_HF_INDEX_SORTED;
  uint64_t total = 0;
  for (size_t i = 0; i < w->count; i++)
    if (!zck__add_u64(total, w->items[i].nbytes, &total))
      return zck__fail(ZCK_ERR_INVALID_ARG, "HF writer: total size overflows 64 bits");

  /* metadata entries as (key, rendered value) */
  size_t nm = w->md.count + 2;
  const char **keys = zck__calloc(nm, sizeof *keys);
  char **vals = zck__calloc(nm, sizeof *vals);
  const zck__hf_item **order = zck__calloc(w->count ? w->count : 1, sizeof *order);
  zck_status s = (keys && vals && order) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  if (s == ZCK_OK) {
    if (w->opts.with_total_parameters) {
      keys[k] = "total_parameters";
      vals[k++] = zck__sprintf("%llu", (unsigned long long)w->opts.total_parameters);
    }
    keys[k] = "total_size";
    vals[k++] = zck__sprintf("%llu", (unsigned long long)total);
    for (size_t i = 0; i < w->md.count; i++) {
      zck__buf tmp;
      zck__buf_init(&tmp);
      zck__json_str_python(&tmp, w->md.values[i]);
      zck__buf_byte(&tmp, 0);
      keys[k] = w->md.keys[i];
      vals[k++] = tmp.failed ? NULL : (char *)tmp.data;
      if (tmp.failed) zck__buf_free(&tmp);
    }
    for (size_t i = 0; i < k; i++)
      if (!vals[i]) s = ZCK_ERR_NO_MEMORY;
  }
  if (s == ZCK_OK) {
    if (sorted) { /* sort (key, value) pairs by key: sort an index permutation through the keys */
      const char **pairs = zck__calloc(k * 2, sizeof *pairs);
      if (!pairs) s = ZCK_ERR_NO_MEMORY;
      else {
        for (size_t i = 0; i < k; i++) pairs[2 * i] = keys[i], pairs[2 * i + 1] = vals[i];
        qsort(pairs, k, 2 * sizeof *pairs, zck__hf_cmp_str);
        for (size_t i = 0; i < k; i++) keys[i] = pairs[2 * i], vals[i] = (char *)pairs[2 * i + 1];
        free(pairs);
      }
    }
  }
  if (s == ZCK_OK) {
    zck__buf_str(b, "{\n  \"metadata\": {");
    for (size_t i = 0; i < k; i++) {
      zck__buf_str(b, i ? ",\n    " : "\n    ");
      zck__json_str_python(b, keys[i]);
      zck__buf_str(b, ": ");
      zck__buf_str(b, vals[i]);
    }
    zck__buf_str(b, "\n  },\n  \"weight_map\": {");
    /* huggingface_hub: shard by shard, each in insertion order; sorted: by name */
    size_t n = 0;
    for (size_t sh = 0; sh < w->nshards; sh++)
      for (size_t i = 0; i < w->count; i++)
        if (w->items[i].shard == sh) order[n++] = &w->items[i];
    if (sorted) qsort(order, n, sizeof *order, zck__hf_cmp_item_name);
    for (size_t i = 0; i < n; i++) {
      zck__buf_str(b, i ? ",\n    " : "\n    ");
      zck__json_str_python(b, order[i]->name);
      zck__buf_str(b, ": ");
      zck__json_str_python(b, w->shard_names[order[i]->shard]);
    }
    zck__buf_str(b, n ? "\n  }\n}" : "}\n}");
    if (sorted) zck__buf_byte(b, '\n');
    if (b->failed) s = zck__fail(ZCK_ERR_NO_MEMORY, "HF writer: out of memory building the index");
  }
  /* keys[] point into the writer or at literals; vals[] are ours */
  if (vals)
    for (size_t i = 0; i < k; i++) free(vals[i]);
  free(keys);
  free(vals);
  free(order);
  return s;
}

zck_status zck_hf_writer_commit(zck_hf_writer *w) {
  ZCK_ASSERT(w->laid_out && !w->committed);
  for (size_t s = 0; s < w->nshards; s++) {
    ZCK_TRY(zck_st_writer_commit(w->shards[s]));
    if (w->hash) ZCK_TRY(zck_st_writer_known(w->shards[s], w->shard_names[s], &w->known, &w->cap_known));
  }
  if (w->nshards > 1 || w->opts.torch_dcp) { /* torch writes its index whatever the count */
    zck__buf b;
    zck__buf_init(&b);
    zck_status s = zck__hf_index_json(w, &b);
    char *name = zck__sprintf("%s.safetensors.index.json", w->prefix);
    char *path = name ? zck__outdir_file(&w->dir, name) : NULL;
    if (s == ZCK_OK && !path) s = ZCK_ERR_NO_MEMORY;
    zck__outfile f = {.fd = -1};
    if (s == ZCK_OK) s = zck__outfile_create(&f, path);
    if (s == ZCK_OK) s = zck__outfile_pwrite(&f, b.data, b.len, 0);
    if (s == ZCK_OK) s = zck__outfile_commit(&f);
    if (s == ZCK_OK && w->hash) s = zck__known_bytes(&w->known, &w->cap_known, path, name, b.data, b.len);
    zck__outfile_abort(&f);
    zck__buf_free(&b);
    free(name);
    free(path);
    ZCK_TRY(s);
  }
  if (w->opts.before_commit) ZCK_TRY(w->opts.before_commit(w->opts.before_commit_ctx, w->dir.tmp_path));
  ZCK_TRY(zck__outdir_commit(&w->dir));
  w->committed = true;
  return ZCK_OK;
}

// ---- manifest hashes as written

void zck_hf_writer_hash_inline(zck_hf_writer *w) {
  ZCK_ASSERT(!w->laid_out);
  w->hash = true;
  w->budget.max = zck__shash_default_budget();
  w->known.chunk_size = ZCK_MANIFEST_DEFAULT_CHUNK;
}

zck_store zck_hf_writer_store(zck_hf_writer *w, size_t index, zck_dtype dtype, uint64_t numel, const char *name) {
  ZCK_ASSERT(w->laid_out && index < w->count);
  const zck__hf_item *it = &w->items[index];
  return zck_st_writer_store(w->shards[it->shard], it->local, dtype, numel, name);
}

zck_status zck_hf_writer_add_known(zck_hf_writer *w, zck__manifest_known *k) {
  return zck__known_merge(&w->known, &w->cap_known, k);
}

const zck__manifest_known *zck_hf_writer_known(const zck_hf_writer *w) { return w->hash ? &w->known : NULL; }
