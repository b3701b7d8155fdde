/* st_reader.c: opens a safetensors file and validates its header as the reference does
 * (safetensors/src/tensor.rs read_metadata + Metadata::validate), plus duplicate keys.
 * Each refusal is one line naming the file, the tensor and the header byte. Only the
 * 8-byte length and the header are read; tensor bytes stay in the file until someone asks for a range. */
#include "st_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zck_st_file {
  zck__source own_src;
  bool owns_src;
  const zck__source *src;
  uint64_t n, data_start, data_len;
  zck_st_tensor *tensors;
  size_t count, cap;
  zck__strmap map;
  bool has_metadata;
  zck__st_pairs md;
  zck__arena arena;
  zck__strlist warnings;
};

/* ---- accessors */

const char *zck_st_path(const zck_st_file *f) { return f->src->name; }
const zck__source *zck_st_source(const zck_st_file *f) { return f->src; }
uint64_t zck_st_header_len(const zck_st_file *f) { return f->n; }
uint64_t zck_st_data_start(const zck_st_file *f) { return f->data_start; }
uint64_t zck_st_file_size(const zck_st_file *f) { return f->src->size; }
size_t zck_st_count(const zck_st_file *f) { return f->count; }
bool zck_st_has_metadata(const zck_st_file *f) { return f->has_metadata; }
size_t zck_st_metadata_count(const zck_st_file *f) { return f->md.count; }
size_t zck_st_warning_count(const zck_st_file *f) { return f->warnings.len; }

const zck_st_tensor *zck_st_tensor_at(const zck_st_file *f, size_t i) {
  ZCK_ASSERT(i < f->count);
  return &f->tensors[i];
}

const zck_st_tensor *zck_st_find(const zck_st_file *f, const char *name) {
  size_t i;
  return zck__strmap_get(&f->map, name, &i) ? &f->tensors[i] : NULL;
}

void zck_st_metadata_at(const zck_st_file *f, size_t i, const char **key, const char **value) {
  ZCK_ASSERT(i < f->md.count);
  if (key) *key = f->md.keys[i];
  if (value) *value = f->md.values[i];
}

const char *zck_st_metadata_get(const zck_st_file *f, const char *key) {
  size_t i = zck__st_pairs_find(&f->md, key);
  return i == SIZE_MAX ? NULL : f->md.values[i];
}

const char *zck_st_warning_at(const zck_st_file *f, size_t i) {
  ZCK_ASSERT(i < f->warnings.len);
  return f->warnings.items[i];
}

zck_status zck_st_read(const zck_st_file *f, const zck_st_tensor *t, void *dst, uint64_t off, uint64_t n) {
  uint64_t end;
  ZCK_ASSERT(zck__add_u64(off, n, &end) && end <= t->nbytes && n <= SIZE_MAX);
  return zck__source_read(f->src, dst, (size_t)n, t->offset + off);
}

void zck_st_close(zck_st_file *f) {
  if (!f) return;
  free(f->tensors);
  zck__st_pairs_free(&f->md);
  zck__strmap_free(&f->map);
  zck__arena_free(&f->arena);
  zck__strlist_free(&f->warnings);
  if (f->owns_src) zck__source_close(&f->own_src);
  free(f);
}

/* ---- header parsing */

/* The key just decoded into jp->str, as an arena C string; fails on an embedded U+0000,
 * which no C consumer could name. */
static zck_status zck__st_key(zck_st_file *f, zck__jp *jp, const char *what, char **out) {
  if (strlen((const char *)jp->str.data) != jp->str.len)
    return zck__jp_fail_value(jp, "%s name contains U+0000", what);
  *out = zck__arena_strndup(&f->arena, (const char *)jp->str.data, jp->str.len);
  return *out ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

static zck_status zck__st_parse_metadata(zck_st_file *f, zck__jp *jp) {
  if (zck__jp_peek(jp) == 'n') { /* serde's Option: null is no metadata */
    ZCK_TRY(zck__jp_skip(jp));
    return ZCK_OK;
  }
  ZCK_TRY(zck__jp_object_begin(jp, "__metadata__: must be an object of strings"));
  f->has_metadata = true;
  bool first = true, done;
  char q[ZCK__QNAME_MAX];
  for (;;) {
    ZCK_TRY(zck__jp_object_next(jp, &first, &done));
    if (done) break;
    char *key = NULL, *value = NULL;
    ZCK_TRY(zck__st_key(f, jp, "__metadata__ key", &key));
    if (zck__jp_peek(jp) != '"')
      return zck__jp_fail_value(jp, "__metadata__ entry \"%s\": values must be strings, found %s", zck__qname(key, q),
                                zck__jp_kind(jp));
    ZCK_TRY(zck__jp_string(jp, "__metadata__ value"));
    if (strlen((const char *)jp->str.data) != jp->str.len)
      return zck__jp_fail_value(jp, "__metadata__ entry \"%s\": value contains U+0000", zck__qname(key, q));
    value = zck__arena_strndup(&f->arena, (const char *)jp->str.data, jp->str.len);
    if (!value) return ZCK_ERR_NO_MEMORY;
    bool dup;
    ZCK_TRY(zck__st_pairs_add(&f->md, key, value, &dup));
    if (dup) {
      return zck__jp_fail_value(jp, "__metadata__: duplicate key \"%s\"", zck__qname(key, q));
    }
  }
  zck__jp_leave(jp);
  return ZCK_OK;
}

enum { ZCK__F_DTYPE = 1, ZCK__F_SHAPE = 2, ZCK__F_OFFSETS = 4 };

/* Names are rendered for messages only on failure: this runs once per tensor of headers
 * of up to 100 MB. */
#define ZCK__QN zck__qname(t->name, q)

static zck_status zck__st_parse_tensor(zck_st_file *f, zck__jp *jp, zck_st_tensor *t, zck__buf *dims) {
  char q[ZCK__QNAME_MAX];
  uint64_t entry_off = zck__jp_offset(jp);
  zck_status s = ZCK_OK;
  jp->tensor = t->name;
  ZCK_CHECK_GOTO(zck__jp_object_begin(jp, ""), s, out);
  unsigned seen = 0;
  bool first = true, done;
  uint64_t offs[2] = {0, 0};
  dims->len = 0;
  for (;;) {
    ZCK_CHECK_GOTO(zck__jp_object_next(jp, &first, &done), s, out);
    if (done) break;
    const char *field = (const char *)jp->str.data;
    size_t flen = jp->str.len;
    unsigned bit = (flen == 5 && !strcmp(field, "dtype")) ? ZCK__F_DTYPE
                 : (flen == 5 && !strcmp(field, "shape")) ? ZCK__F_SHAPE
                 : (flen == 12 && !strcmp(field, "data_offsets")) ? ZCK__F_OFFSETS : 0;
    if (!bit) { /* serde ignores unknown fields (no deny_unknown_fields) */
      ZCK_CHECK_GOTO(zck__jp_skip(jp), s, out);
      continue;
    }
    if (seen & bit) {
      s = zck__jp_fail_value(jp, "duplicate field \"%s\"", field);
      goto out;
    }
    seen |= bit;
    if (bit == ZCK__F_DTYPE) {
      ZCK_CHECK_GOTO(zck__jp_string(jp, "dtype"), s, out);
      if (!zck_st_dtype_parse((const char *)jp->str.data, jp->str.len, &t->st_dtype)) {
        char dq[ZCK__QNAME_MAX];
        s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: unknown dtype \"%s\" (header byte %llu)", f->src->name,
                      ZCK__QN, zck__qname((const char *)jp->str.data, dq), (unsigned long long)entry_off);
        goto out;
      }
    } else if (bit == ZCK__F_SHAPE) {
      ZCK_CHECK_GOTO(zck__jp_array_begin(jp, "shape"), s, out);
      bool afirst = true, adone;
      for (long i = 0;; i++) {
        ZCK_CHECK_GOTO(zck__jp_array_next(jp, &afirst, &adone), s, out);
        if (adone) break;
        uint64_t d;
        jp->elem = i;
        s = zck__jp_u64(jp, &d, "shape");
        jp->elem = -1;
        if (s != ZCK_OK) goto out;
        zck__buf_append(dims, &d, sizeof d);
        if (dims->failed) { s = zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory", f->src->name); goto out; }
      }
      zck__jp_leave(jp);
    } else {
      ZCK_CHECK_GOTO(zck__jp_array_begin(jp, "data_offsets"), s, out);
      bool afirst = true, adone;
      long k = 0;
      for (;; k++) {
        uint64_t elem_off = zck__jp_offset(jp);
        ZCK_CHECK_GOTO(zck__jp_array_next(jp, &afirst, &adone), s, out);
        if (adone) break;
        if (k >= 2) {
          s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: data_offsets has more than 2 elements (header byte %llu)",
                        f->src->name, ZCK__QN, (unsigned long long)elem_off);
          goto out;
        }
        jp->elem = k;
        s = zck__jp_u64(jp, &offs[k], "data_offsets");
        jp->elem = -1;
        if (s != ZCK_OK) goto out;
      }
      zck__jp_leave(jp);
      if (k != 2) {
        s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: data_offsets has %ld element%s, expected [begin, end] (header byte %llu)",
                      f->src->name, ZCK__QN, k, k == 1 ? "" : "s", (unsigned long long)entry_off);
        goto out;
      }
    }
  }
  zck__jp_leave(jp);
  if (seen != (ZCK__F_DTYPE | ZCK__F_SHAPE | ZCK__F_OFFSETS)) {
    const char *missing = !(seen & ZCK__F_DTYPE) ? "dtype" : !(seen & ZCK__F_SHAPE) ? "shape" : "data_offsets";
    s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: missing \"%s\" (header byte %llu)", f->src->name, ZCK__QN, missing,
                  (unsigned long long)entry_off);
    goto out;
  }
  if (dims->len / sizeof(uint64_t) > (size_t)INT32_MAX) {
    s = zck__fail(ZCK_ERR_LIMIT, "%s: tensor %s: too many dimensions", f->src->name, ZCK__QN);
    goto out;
  }
  t->dtype = zck_st_dtype_to_zck(t->st_dtype);
  t->ndim = (int)(dims->len / sizeof(uint64_t));
  if (t->ndim) {
    uint64_t *shape = zck__arena_alloc(&f->arena, dims->len);
    if (!shape) { s = ZCK_ERR_NO_MEMORY; goto out; }
    memcpy(shape, dims->data, dims->len);
    t->shape = shape;
  }
  t->begin = offs[0];
  t->end = offs[1];
out:
  jp->tensor = NULL;
  return s;
}

static zck_status zck__st_parse_header(zck_st_file *f, const uint8_t *hdr) {
  zck__jp jp;
  zck__jp_init(&jp, f->src->name, "header", hdr, (size_t)f->n, 8);
  zck__buf dims;
  zck__buf_init(&dims);
  zck_status s = ZCK_OK;
  bool first = true, done, seen_metadata = false;
  char q[ZCK__QNAME_MAX];

  ZCK_CHECK_GOTO(zck__jp_object_begin(&jp, "the header must be a JSON object"), s, out);
  ZCK_CHECK_GOTO(zck__strmap_init(&f->map, 64), s, out);
  for (;;) {
    ZCK_CHECK_GOTO(zck__jp_object_next(&jp, &first, &done), s, out);
    if (done) break;
    if (!strcmp((const char *)jp.str.data, "__metadata__") && jp.str.len == 12) {
      if (seen_metadata) {
        s = zck__jp_fail_value(&jp, "duplicate key \"__metadata__\"");
        goto out;
      }
      seen_metadata = true;
      ZCK_CHECK_GOTO(zck__st_parse_metadata(f, &jp), s, out);
      continue;
    }
    char *name = NULL;
    ZCK_CHECK_GOTO(zck__st_key(f, &jp, "tensor", &name), s, out);
    bool dup;
    ZCK_CHECK_GOTO(zck__strmap_put(&f->map, name, f->count, &dup, NULL), s, out);
    if (dup) {
      s = zck__jp_fail_value(&jp, "tensor %s: duplicate tensor name", zck__qname(name, q));
      goto out;
    }
    if (!ZCK__GROW(f->tensors, f->cap, f->count + 1)) { s = zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory", f->src->name); goto out; }
    zck_st_tensor *t = &f->tensors[f->count];
    memset(t, 0, sizeof *t);
    t->name = name;
    ZCK_CHECK_GOTO(zck__st_parse_tensor(f, &jp, t, &dims), s, out);
    f->count++;
  }
  zck__jp_leave(&jp);
  s = zck__jp_finish(&jp);
out:
  zck__buf_free(&dims);
  zck__jp_free(&jp);
  return s;
}

/* ---- geometry: sizes, then the tiling of the data section */

static int zck__st_cmp_offsets(const void *a, const void *b) {
  const zck_st_tensor *x = *(const zck_st_tensor *const *)a, *y = *(const zck_st_tensor *const *)b;
  if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
  if (x->end != y->end) return x->end < y->end ? -1 : 1;
  return 0;
}

static zck_status zck__st_validate(zck_st_file *f) {
  const char *file = f->src->name;
  char q[ZCK__QNAME_MAX], q2[ZCK__QNAME_MAX];
  for (size_t i = 0; i < f->count; i++) {
    zck_st_tensor *t = &f->tensors[i];
    if (t->end < t->begin)
      return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] end before begin", file, ZCK__QN,
                       (unsigned long long)t->begin, (unsigned long long)t->end);
    uint64_t numel = 1, nbits;
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] > (uint64_t)INT64_MAX) /* torch's sizes are int64: no reader can make it */
        return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: dimension %d is %llu, over 2^63 - 1", file, ZCK__QN, d,
                         (unsigned long long)t->shape[d]);
    for (int d = 0; d < t->ndim; d++)
      if (!zck__mul_u64(numel, t->shape[d], &numel))
        return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: element count overflows 64 bits", file, ZCK__QN);
    if (!zck__mul_u64(numel, zck_st_dtype_bits(t->st_dtype), &nbits))
      return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: size in bits of %llu %s elements overflows 64 bits",
                       file, ZCK__QN, (unsigned long long)numel, zck_st_dtype_name(t->st_dtype));
    if (nbits % 8)
      return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: %llu %s elements are %llu bits, not a whole number of bytes",
                       file, ZCK__QN, (unsigned long long)numel, zck_st_dtype_name(t->st_dtype), (unsigned long long)nbits);
    t->numel = numel;
    t->nbytes = t->end - t->begin;
    if (t->nbytes != nbits / 8)
      return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] hold %llu bytes but %llu %s elements need %llu",
                       file, ZCK__QN, (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)t->nbytes,
                       (unsigned long long)numel, zck_st_dtype_name(t->st_dtype), (unsigned long long)(nbits / 8));
    if (t->end > f->data_len)
      return zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: data_offsets end %llu is past the end of the %llu-byte data section",
                       file, ZCK__QN, (unsigned long long)t->end, (unsigned long long)f->data_len);
    t->offset = f->data_start + t->begin;
  }
  if (!f->count) {
    if (f->data_len)
      return zck__fail(ZCK_ERR_FORMAT, "%s: %llu bytes after the header but no tensors", file,
                       (unsigned long long)f->data_len);
    return ZCK_OK;
  }
  const zck_st_tensor **order = zck__malloc(f->count * sizeof *order);
  if (!order) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < f->count; i++) order[i] = &f->tensors[i];
  qsort(order, f->count, sizeof *order, zck__st_cmp_offsets);
  zck_status s = ZCK_OK;
  uint64_t pos = 0;
  for (size_t i = 0; i < f->count && s == ZCK_OK; i++) {
    const zck_st_tensor *t = order[i];
    if (t->begin == pos) { pos = t->end; continue; }
    if (i == 0)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: the first tensor in the data section begins at %llu, not 0",
                    file, zck__qname(t->name, q), (unsigned long long)t->begin);
    else if (t->begin > pos)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: hole of %llu bytes between tensor %s (ends at %llu) and it (begins at %llu)",
                    file, zck__qname(t->name, q), (unsigned long long)(t->begin - pos), zck__qname(order[i - 1]->name, q2),
                    (unsigned long long)pos, (unsigned long long)t->begin);
    else
      s = zck__fail(ZCK_ERR_FORMAT, "%s: tensor %s: data_offsets [%llu, %llu] overlap tensor %s (ends at %llu)",
                    file, zck__qname(t->name, q), (unsigned long long)t->begin, (unsigned long long)t->end,
                    zck__qname(order[i - 1]->name, q2), (unsigned long long)pos);
  }
  if (s == ZCK_OK && pos != f->data_len)
    s = zck__fail(ZCK_ERR_FORMAT, "%s: %llu trailing bytes after the last tensor (%s ends at %llu of %llu)", file,
                  (unsigned long long)(f->data_len - pos), zck__qname(order[f->count - 1]->name, q),
                  (unsigned long long)pos, (unsigned long long)f->data_len);
  free(order);
  return s;
}

static void zck__st_warn_metadata(zck_st_file *f) {
  const char *file = f->src->name;
  if (!f->has_metadata) {
    zck__strlist_addf(&f->warnings, "%s: no __metadata__; transformers expects {\"format\": \"pt\"}", file);
    return;
  }
  const char *fmt = zck_st_metadata_get(f, "format");
  char q[ZCK__QNAME_MAX];
  if (!fmt)
    zck__strlist_addf(&f->warnings, "%s: __metadata__ has no \"format\"; transformers expects \"pt\"", file);
  else if (strcmp(fmt, "pt") && strcmp(fmt, "tf") && strcmp(fmt, "flax") && strcmp(fmt, "mlx"))
    zck__strlist_addf(&f->warnings, "%s: __metadata__ format \"%s\" is not one transformers loads (pt, tf, flax, mlx)",
                      file, zck__qname(fmt, q));
}

static zck_status zck__st_load(zck_st_file *f) {
  const zck__source *src = f->src;
  if (src->size < 8)
    return zck__fail(ZCK_ERR_TRUNCATED, "%s: %llu bytes, too short for the 8-byte header length", src->name,
                     (unsigned long long)src->size);
  uint8_t len8[8];
  ZCK_TRY(zck__source_read(src, len8, 8, 0));
  f->n = zck__le64(len8);
  if (f->n > ZCK_ST_MAX_HEADER)
    return zck__fail(ZCK_ERR_FORMAT, "%s: header length %llu exceeds the 100,000,000-byte limit", src->name,
                     (unsigned long long)f->n);
  if (f->n > src->size - 8)
    return zck__fail(ZCK_ERR_TRUNCATED, "%s: header length %llu exceeds the %llu bytes after the length field",
                     src->name, (unsigned long long)f->n, (unsigned long long)(src->size - 8));
  f->data_start = 8 + f->n;
  f->data_len = src->size - f->data_start;
  uint8_t *hdr = zck__malloc(f->n ? (size_t)f->n : 1);
  if (!hdr) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__source_read(src, hdr, (size_t)f->n, 8);
  if (s == ZCK_OK) {
    size_t bad = zck__utf8_check(hdr, (size_t)f->n);
    if (bad != f->n)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: header is not valid UTF-8 (byte %llu)", src->name,
                    (unsigned long long)(8 + bad));
  }
  if (s == ZCK_OK) s = zck__st_parse_header(f, hdr);
  free(hdr);
  ZCK_TRY(s);
  ZCK_TRY(zck__st_validate(f));
  zck__st_warn_metadata(f);
  return ZCK_OK;
}

zck_status zck_st_open_source(const zck__source *src, zck_st_file **out) {
  *out = NULL;
  zck_st_file *f = zck__calloc(1, sizeof *f);
  if (!f) return ZCK_ERR_NO_MEMORY;
  f->src = src;
  zck_status s = zck__st_load(f);
  if (s != ZCK_OK) {
    zck_st_close(f);
    return s;
  }
  *out = f;
  return ZCK_OK;
}

zck_status zck_st_open(const char *path, zck_st_file **out) {
  *out = NULL;
  zck_st_file *f = zck__calloc(1, sizeof *f);
  if (!f) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__source_open(&f->own_src, path);
  if (s != ZCK_OK) { free(f); return s; }
  f->owns_src = true;
  f->src = &f->own_src;
  s = zck__st_load(f);
  if (s != ZCK_OK) {
    zck_st_close(f);
    return s;
  }
  *out = f;
  return ZCK_OK;
}
