/* st_writer.c: writes safetensors files the way the reference serializer does
 * (safetensors/src/tensor.rs prepare()): tensors sorted by dtype descending in the enum
 * order, then by name (byte order); laid out back to back from offset 0; compact serde_json
 * header with "__metadata__" first; spaces up to a multiple of 8. With the same tensors and
 * at most one metadata entry the output is byte-identical to safetensors' save_file (the
 * reference keeps metadata in a HashMap, so with more entries its order is random).
 *
 * The torch style (zck_st_writer_set_style) is the header torch's consolidate_safetensors_files
 * writes instead (_consolidate_hf_safetensors.py _write_metadata): see safetensors.h.
 *
 * Reserve-then-fill: after layout + open the file has its final size and every tensor its
 * offset, so the copy executor's threads pwrite data in any order. */
#include "st_internal.h"

#include <stdlib.h>
#include <string.h>

#include "stream_hash.h"

struct zck_st_writer {
  zck_st_tensor *tensors;  /* in add order */
  size_t count, cap;
  zck__strmap map;
  zck__st_pairs md;
  zck__arena arena;
  zck__buf header;         /* 8-byte length + padded JSON */
  uint64_t file_size;
  bool laid_out, opened, committed;
  zck_st_header_style style;
  zck__outfile out;
  char *path;
  zck__shash *hash;        /* zck_st_writer_hash: the manifest hashes as written */
  zck__shash_fd *stores;   /* [count]: the hashing stores' contexts */
};

zck_status zck_st_writer_new(zck_st_writer **out) {
  *out = NULL;
  zck_st_writer *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  w->out.fd = -1;
  zck__buf_init(&w->header);
  zck_status s = zck__strmap_init(&w->map, 64);
  if (s == ZCK_OK) s = zck_st_writer_set_metadata(w, "format", "pt");
  if (s != ZCK_OK) {
    zck_st_writer_free(w);
    return s;
  }
  *out = w;
  return ZCK_OK;
}

void zck_st_writer_free(zck_st_writer *w) {
  if (!w) return;
  if (w->opened && !w->committed) zck__outfile_abort(&w->out);
  zck__shash_free(w->hash);
  free(w->stores);
  free(w->tensors);
  zck__st_pairs_free(&w->md);
  free(w->path);
  zck__strmap_free(&w->map);
  zck__arena_free(&w->arena);
  zck__buf_free(&w->header);
  free(w);
}

static zck_status zck__st_check_utf8(const char *what, const char *s) {
  size_t n = strlen(s);
  if (zck__utf8_check((const uint8_t *)s, n) != n) {
    char q[ZCK__QNAME_MAX];
    return zck__fail(ZCK_ERR_INVALID_ARG, "safetensors writer: %s \"%s\" is not valid UTF-8", what, zck__qname(s, q));
  }
  return ZCK_OK;
}

zck_status zck_st_writer_set_metadata(zck_st_writer *w, const char *key, const char *value) {
  ZCK_ASSERT(!w->laid_out);
  ZCK_TRY(zck__st_check_utf8("metadata key", key));
  ZCK_TRY(zck__st_check_utf8("metadata value", value));
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

void zck_st_writer_clear_metadata(zck_st_writer *w) {
  ZCK_ASSERT(!w->laid_out);
  zck__st_pairs_clear(&w->md);
}

void zck_st_writer_set_style(zck_st_writer *w, zck_st_header_style style) {
  ZCK_ASSERT(!w->laid_out);
  w->style = style;
  if (style == ZCK_ST_HEADER_TORCH_DCP) zck__st_pairs_clear(&w->md); /* torch writes no "__metadata__" */
}

zck_status zck_st_writer_add(zck_st_writer *w, const char *name, zck_st_dtype dtype, int ndim, const uint64_t *shape,
                             size_t *index) {
  ZCK_ASSERT(!w->laid_out);
  ZCK_ASSERT((unsigned)dtype < ZCK_ST_DTYPE_COUNT && ndim >= 0 && (ndim == 0 || shape));
  char q[ZCK__QNAME_MAX];
  if (!strcmp(name, "__metadata__"))
    return zck__fail(ZCK_ERR_INVALID_ARG, "safetensors writer: \"__metadata__\" cannot be a tensor name");
  ZCK_TRY(zck__st_check_utf8("tensor name", name));
  uint64_t numel = 1, nbits;
  for (int d = 0; d < ndim; d++)
    if (!zck__mul_u64(numel, shape[d], &numel))
      return zck__fail(ZCK_ERR_INVALID_ARG, "safetensors writer: tensor %s: element count overflows", zck__qname(name, q));
  if (!zck__mul_u64(numel, zck_st_dtype_bits(dtype), &nbits))
    return zck__fail(ZCK_ERR_INVALID_ARG, "safetensors writer: tensor %s: size overflows", zck__qname(name, q));
  if (nbits % 8)
    return zck__fail(ZCK_ERR_INVALID_ARG, "safetensors writer: tensor %s: %llu %s elements are not a whole number of bytes",
                     zck__qname(name, q), (unsigned long long)numel, zck_st_dtype_name(dtype));
  if (!ZCK__GROW(w->tensors, w->cap, w->count + 1)) return ZCK_ERR_NO_MEMORY;
  char *nm = zck__arena_strndup(&w->arena, name, strlen(name));
  if (!nm) return ZCK_ERR_NO_MEMORY;
  bool dup;
  ZCK_TRY(zck__strmap_put(&w->map, nm, w->count, &dup, NULL));
  if (dup) return zck__fail(ZCK_ERR_INVALID_ARG, "safetensors writer: tensor %s added twice", zck__qname(name, q));
  zck_st_tensor *t = &w->tensors[w->count];
  memset(t, 0, sizeof *t);
  t->name = nm;
  t->st_dtype = dtype;
  t->dtype = zck_st_dtype_to_zck(dtype);
  t->ndim = ndim;
  if (ndim) {
    uint64_t *sh = zck__arena_alloc(&w->arena, (size_t)ndim * sizeof *sh);
    if (!sh) return ZCK_ERR_NO_MEMORY;
    memcpy(sh, shape, (size_t)ndim * sizeof *sh);
    t->shape = sh;
  }
  t->numel = numel;
  t->nbytes = nbits / 8;
  if (index) *index = w->count;
  w->count++;
  return ZCK_OK;
}

/* prepare(): right.dtype().cmp(&left.dtype()).then(lname.cmp(rname)) */
static int zck__st_cmp_write_order(const void *a, const void *b) {
  const zck_st_tensor *x = *(const zck_st_tensor *const *)a, *y = *(const zck_st_tensor *const *)b;
  if (x->st_dtype != y->st_dtype) return x->st_dtype > y->st_dtype ? -1 : 1;
  return strcmp(x->name, y->name);
}

/* torch's json.dumps(metadata) of one entry: {"shape": [..], "dtype": "..", "data_offsets": [b, e]} */
static void zck__st_torch_entry(zck__buf *b, const zck_st_tensor *t) {
  zck__json_str_python(b, t->name);
  zck__buf_str(b, ": {\"shape\": [");
  for (int d = 0; d < t->ndim; d++) zck__buf_printf(b, d ? ", %llu" : "%llu", (unsigned long long)t->shape[d]);
  zck__buf_printf(b, "], \"dtype\": \"%s\", \"data_offsets\": [%llu, %llu]}", zck_st_dtype_name(t->st_dtype),
                  (unsigned long long)t->begin, (unsigned long long)t->end);
}

zck_status zck_st_writer_layout(zck_st_writer *w) {
  ZCK_ASSERT(!w->laid_out);
  bool torch = w->style == ZCK_ST_HEADER_TORCH_DCP;
  zck_st_tensor **order = zck__malloc((w->count ? w->count : 1) * sizeof *order);
  if (!order) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < w->count; i++) order[i] = &w->tensors[i];
  if (!torch) qsort(order, w->count, sizeof *order, zck__st_cmp_write_order); /* torch: the caller's order */

  zck__buf *b = &w->header;
  b->len = 0;
  zck__buf_u64le(b, 0); /* patched below */
  zck__buf_byte(b, '{');
  if (!torch && w->md.count) {
    zck__buf_str(b, "\"__metadata__\":{");
    for (size_t i = 0; i < w->md.count; i++) {
      if (i) zck__buf_byte(b, ',');
      zck__json_str_serde(b, w->md.keys[i]);
      zck__buf_byte(b, ':');
      zck__json_str_serde(b, w->md.values[i]);
    }
    zck__buf_byte(b, '}');
  }
  uint64_t off = 0;
  for (size_t i = 0; i < w->count; i++) {
    zck_st_tensor *t = order[i];
    t->begin = off;
    if (!zck__add_u64(off, t->nbytes, &off)) {
      free(order);
      return zck__fail(ZCK_ERR_INVALID_ARG, "safetensors writer: total data size overflows");
    }
    t->end = off;
    if (torch) {
      if (i) zck__buf_str(b, ", ");
      zck__st_torch_entry(b, t);
      continue;
    }
    if (i || w->md.count) zck__buf_byte(b, ',');
    zck__json_str_serde(b, t->name);
    zck__buf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", zck_st_dtype_name(t->st_dtype));
    for (int d = 0; d < t->ndim; d++) zck__buf_printf(b, d ? ",%llu" : "%llu", (unsigned long long)t->shape[d]);
    zck__buf_printf(b, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)t->begin, (unsigned long long)t->end);
  }
  free(order);
  zck__buf_byte(b, '}');
  while (!torch && (b->len - 8) % 8) zck__buf_byte(b, ' '); /* torch pads nothing */
  if (b->failed) return zck__fail(ZCK_ERR_NO_MEMORY, "safetensors writer: out of memory building the header");
  uint64_t n = b->len - 8;
  if (n > ZCK_ST_MAX_HEADER)
    return zck__fail(ZCK_ERR_LIMIT, "safetensors writer: header of %llu bytes exceeds the 100,000,000-byte limit",
                     (unsigned long long)n);
  zck__put64(b->data, n);
  for (size_t i = 0; i < w->count; i++) w->tensors[i].offset = b->len + w->tensors[i].begin;
  if (!zck__add_u64(b->len, off, &w->file_size))
    return zck__fail(ZCK_ERR_INVALID_ARG, "safetensors writer: file size overflows");
  w->laid_out = true;
  return ZCK_OK;
}

const zck_st_tensor *zck_st_writer_tensor(const zck_st_writer *w, size_t index) {
  ZCK_ASSERT(w->laid_out && index < w->count);
  return &w->tensors[index];
}

size_t zck_st_writer_count(const zck_st_writer *w) { return w->count; }

uint64_t zck_st_writer_file_size(const zck_st_writer *w) {
  ZCK_ASSERT(w->laid_out);
  return w->file_size;
}

const uint8_t *zck_st_writer_header(const zck_st_writer *w, size_t *len) {
  ZCK_ASSERT(w->laid_out);
  if (len) *len = w->header.len;
  return w->header.data;
}

zck_status zck_st_writer_open(zck_st_writer *w, const char *path) {
  ZCK_ASSERT(w->laid_out && !w->opened);
  w->path = zck__strdup(path);
  if (!w->path) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck__outfile_create(&w->out, path));
  w->opened = true;
  ZCK_TRY(zck__outfile_pwrite(&w->out, w->header.data, w->header.len, 0));
  ZCK_TRY(zck__outfile_truncate(&w->out, w->file_size));
  return ZCK_OK;
}

int zck_st_writer_fd(const zck_st_writer *w) {
  ZCK_ASSERT(w->opened);
  return w->out.fd;
}

zck_status zck_st_writer_write(zck_st_writer *w, size_t index, const void *data, uint64_t off, uint64_t n) {
  ZCK_ASSERT(w->opened && !w->committed && index < w->count);
  const zck_st_tensor *t = &w->tensors[index];
  uint64_t end;
  ZCK_ASSERT(zck__add_u64(off, n, &end) && end <= t->nbytes && n <= SIZE_MAX);
  return zck__pwrite_all(w->out.fd, data, (size_t)n, t->offset + off, w->path);
}

zck_status zck_st_writer_commit(zck_st_writer *w) {
  ZCK_ASSERT(w->opened && !w->committed);
  ZCK_TRY(zck__outfile_commit(&w->out));
  w->committed = true;
  return ZCK_OK;
}

// ---- manifest hashes as written

static int zck__st_cmp_offset(const void *a, const void *b) {
  const zck_st_tensor *x = *(const zck_st_tensor *const *)a, *y = *(const zck_st_tensor *const *)b;
  /* an empty tensor first among those at its offset: each region starts where the last ended */
  if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

zck_status zck_st_writer_hash(zck_st_writer *w, zck__shash_budget *budget) {
  ZCK_ASSERT(w->laid_out && !w->opened && !w->hash);
  const zck_st_tensor **order = zck__malloc((w->count ? w->count : 1) * sizeof *order);
  w->stores = zck__calloc(w->count ? w->count : 1, sizeof *w->stores);
  w->hash = zck__shash_new();
  if (!order || !w->stores || !w->hash) {
    free(order);
    return ZCK_ERR_NO_MEMORY;
  }
  zck__shash_no_crc(w->hash); /* no zip record here: the manifest takes XXH3s only */
  /* the file: the header, then each tensor's bytes back to back (layout's order) */
  zck__shash_bytes(w->hash, 0, w->header.data, w->header.len);
  for (size_t i = 0; i < w->count; i++) order[i] = &w->tensors[i];
  qsort(order, w->count, sizeof *order, zck__st_cmp_offset);
  for (size_t i = 0; i < w->count; i++) zck__shash_region(w->hash, order[i]->offset, order[i]->nbytes, NULL);
  for (size_t i = 0; i < w->count; i++) zck__shash_cover(w->hash, order[i]->offset, order[i]->nbytes);
  free(order);
  return zck__shash_start(w->hash, budget, 0);
}

zck_store zck_st_writer_store(zck_st_writer *w, size_t index, zck_dtype dtype, uint64_t numel, const char *name) {
  ZCK_ASSERT(w->opened && index < w->count);
  const zck_st_tensor *t = &w->tensors[index];
  if (!w->hash) return zck_store_fd(w->out.fd, t->offset, dtype, numel, name);
  return zck__shash_fd_store(&w->stores[index], w->out.fd, t->offset, dtype, numel, name, w->hash);
}

zck_status zck_st_writer_known(zck_st_writer *w, const char *relpath, zck__manifest_known *k, size_t *cap) {
  ZCK_ASSERT(w->committed);
  if (!w->hash) return ZCK_OK;
  uint64_t reread = 0;
  ZCK_TRY(zck__shash_finish(w->hash, w->path, &reread));
  zck__manifest_known_file f;
  ZCK_TRY(zck__shash_known_file(w->hash, NULL, &f));
  return f.hashed ? zck__known_take(k, cap, &f, relpath) : ZCK_OK;
}

void zck_st_writer_wrote(zck_st_writer *w, uint64_t off, const void *bytes, uint64_t n) {
  zck__shash_feed_split(w->hash, off, bytes, n);
}
