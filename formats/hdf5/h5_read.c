/* h5_read.c: reading datasets by element range, decompressing only the chunks needed.
 *
 * A range [first, first + count) of the row-major flattening is cut into at most
 * 2*ndim - 1 boxes of the form (fixed prefix, a range of one dim, full later dims). For
 * a chunked dataset each box visits the chunks it overlaps; a chunk is fetched raw with
 * H5Dread_chunk (under the HDF5 lock), checked and decompressed here (H-01..H-04), and
 * the overlap copied row by row. Contiguous datasets are read with a hyperslab. */
#include "h5_checksums.h"
#include "h5_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zck_h5_file {
  char *path;
  hid_t file;
  uint64_t size;
  zck__h5_meta *meta;   /* groups, links, attributes: as the forked child read them */
  zck__h5c_table *sums; /* its checksum table (h5_checksums.h); NULL: none */
};

#define ZCK__H5_MAX_FILTERS 16

struct zck_h5_dataset {
  zck_h5_file *f;
  char *label;                     /* "FILE:/path" */
  uint64_t addr;                   /* its object header: each read opens it by this */
  zck_h5_dataset_info info;
  size_t es;
  uint64_t dims[ZCK_H5_MAX_DIMS], cdims[ZCK_H5_MAX_DIMS];
  uint64_t chunk_elems;
  int nfilters;
  unsigned filt_id[ZCK__H5_MAX_FILTERS], filt_flags[ZCK__H5_MAX_FILTERS];
  uint8_t fill[16];                /* one element of the fill value */
  bool has_xxh3;                   /* contiguous: ZCK_H5_XXH3_ATTR present (zck_h5.h) */
  uint64_t xxh3;
  bool summed;                     /* its file has a checksum table: reads check its pieces */
  uint64_t sum_seed;               /* zck__h5c_seed of its path, dtype and shape */
};

// ---- files

static zck_status zck__h5_attr_num(zck_h5_file *f, const char *obj, const char *key, char as, void *out);

/* The checksum table, when the root records one (files written before it, or not by zckpt,
 * have none). */
static zck_status zck__h5_load_table(zck_h5_file *f) {
  uint64_t sum = 0, piece = 0;
  zck_status st = zck__h5_attr_num(f, "/", ZCK__H5C_TABLE_ATTR, 'u', &sum);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    return ZCK_OK;
  }
  if (st == ZCK_OK) st = zck__h5_attr_num(f, "/", ZCK__H5C_PIECE_ATTR, 'u', &piece);
  if (st == ZCK_OK) st = zck__h5c_load(f, sum, piece, &f->sums);
  return st;
}

const zck__h5c_table *zck__h5_file_table(const zck_h5_file *f) { return f->sums; }
bool zck_h5_has_checksums(const zck_h5_file *f) { return f->sums != NULL; }

zck_status zck_h5_open_lazy(const char *path, const char *lazy, zck_h5_file **out) {
  *out = NULL;
  zck_h5_file *f = zck__calloc(1, sizeof *f);
  if (!f || !(f->path = zck__strdup(path))) {
    free(f);
    return ZCK_ERR_NO_MEMORY;
  }
  zck_status st = zck__h5_meta_load(path, lazy, &f->meta);
  if (st != ZCK_OK) {
    free(f->path);
    free(f);
    return st;
  }
  zck__h5_lock();
  htri_t is = H5Fis_hdf5(path);
  if (is <= 0) {
    st = is < 0 ? zck__h5_fail(ZCK_ERR_NOT_FOUND, "%s: cannot open", path)
                : zck__fail(ZCK_ERR_FORMAT, "%s: not an HDF5 file (no superblock signature)", path);
  } else {
    f->file = zck__h5_open_ro(path);
    hsize_t sz = 0;
    if (f->file < 0) st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: cannot open as HDF5", path);
    else if (!zck__h5_meta_opened(f->meta)) st = zck__fail(ZCK_ERR_FORMAT, "%s: cannot open as HDF5", path);
    else if (H5Fget_filesize(f->file, &sz) < 0) st = zck__h5_fail(ZCK_ERR_IO, "%s: size", path);
    f->size = sz;
  }
  zck__h5_unlock();
  if (st == ZCK_OK) st = zck__h5_load_table(f);
  if (st != ZCK_OK) {
    zck_h5_close(f);
    return st;
  }
  *out = f;
  return ZCK_OK;
}

zck_status zck_h5_open(const char *path, zck_h5_file **out) { return zck_h5_open_lazy(path, NULL, out); }

bool zck__h5_file_datasets(const zck_h5_file *f, size_t *n) { return zck__h5_meta_datasets(f->meta, n); }

/* The object at path; one at or below an unread object (a lazy walk's) after walking the
 * file again in full, once: its header and attributes are then the child's as any other's. */
static zck_status zck__h5_find(zck_h5_file *f, const char *path, const zck__h5_mobj **o, const char **why) {
  zck_status st = zck__h5_meta_find(f->meta, path, o, why);
  if (st != ZCK_OK || !(*o)->unread) return st;
  zck__h5_meta *full = NULL;
  st = zck__h5_meta_load(f->path, NULL, &full);
  if (st != ZCK_OK) {
    static _Thread_local char msg[1024];   /* the caller formats it into the next error */
    snprintf(msg, sizeof msg, "%s", zck_last_error());
    *why = msg;
    return st;
  }
  zck__h5_meta_free(f->meta);
  f->meta = full;
  return zck__h5_meta_find(f->meta, path, o, why);
}

zck_status zck__h5_link_at(zck_h5_file *f, const char *path) {
  const zck__h5_mobj *o;
  const char *why;
  zck_status st = zck__h5_meta_find(f->meta, path, &o, &why);
  if (st == ZCK_ERR_NOT_FOUND) return zck__fail(st, "%s:%s: missing", f->path, path);
  if (st != ZCK_OK) return zck__fail(st, "%s:%s: %s", f->path, path, why);
  return ZCK_OK;
}

zck_status zck_h5_check_attrs(zck_h5_file *f) {
  uint64_t want = 0, got = 0;
  zck_status st = zck__h5_attr_num(f, "/", ZCK_H5_ATTRS_XXH3_ATTR, 'u', &want);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();   /* not written by zckpt, or before the digest */
    return ZCK_OK;
  }
  if (st != ZCK_OK) return st;
  const char *why;
  if (!zck__h5_meta_digest(f->meta, &got, &why)) return zck__fail(ZCK_ERR_FORMAT, "%s: %s", f->path, why);
  if (got != want)
    return zck__fail(ZCK_ERR_DAMAGED, "%s: damaged: its root attributes do not match their digest %s", f->path,
                     ZCK_H5_ATTRS_XXH3_ATTR);
  return ZCK_OK;
}

void zck_h5_close(zck_h5_file *f) {
  if (!f) return;
  zck__h5_lock();
  if (f->file > 0) H5Fclose(f->file);
  H5Eclear2(H5E_DEFAULT);
  zck__h5_unlock();
  zck__h5_meta_free(f->meta);
  zck__h5c_table_free(f->sums);
  free(f->path);
  free(f);
}

const char *zck_h5_name(const zck_h5_file *f) { return f->path; }

bool zck_h5_exists(zck_h5_file *f, const char *path) {
  const zck__h5_mobj *o;
  const char *why;
  /* a link that cannot be followed or read exists: opening it then says what is wrong */
  return zck__h5_find(f, path, &o, &why) != ZCK_ERR_NOT_FOUND;
}

zck_status zck_h5_list(zck_h5_file *f, const char *group, char ***names, size_t *n) {
  *names = NULL;
  *n = 0;
  const zck__h5_mobj *o;
  const char *why;
  zck_status st = zck__h5_find(f, group, &o, &why);
  if (st == ZCK_OK && o->type != H5O_TYPE_GROUP) st = ZCK_ERR_NOT_FOUND;
  if (st == ZCK_ERR_NOT_FOUND) return zck__fail(st, "%s: no group %s", f->path, group);
  if (st == ZCK_OK && o->links_err) st = ZCK_ERR_FORMAT, why = o->links_err;
  if (st != ZCK_OK) return zck__fail(st, "%s: %s: listing: %s", f->path, group, why);
  char **v = zck__calloc(o->nlinks + 1, sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < o->nlinks; i++) {
    if (!(v[i] = zck__strdup(o->links[i].name))) {
      for (size_t j = 0; j < i; j++) free(v[j]);
      free(v);
      return ZCK_ERR_NO_MEMORY;
    }
  }
  *names = v;
  *n = o->nlinks;
  return ZCK_OK;
}

// ---- attributes

/* Attribute key of o (at path obj), holding one value, or fails (NOT_FOUND when absent;
 * the error is set only when say_absent: a caller asking for an optional attribute of each
 * of 300k datasets does not format a message for each). */
static zck_status zck__h5_attr_at(zck_h5_file *f, const zck__h5_mobj *o, const char *obj, const char *key,
                                  bool say_absent, const zck__h5_mattr **out) {
  *out = NULL;
  /* an error is not absence: a damaged attribute index must not read as "no attribute" */
  if (o->attrs_err) return zck__fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s: %s", f->path, obj, key, o->attrs_err);
  const zck__h5_mattr *a = zck__h5_meta_attr(o, key);
  if (!a) return say_absent ? zck__fail(ZCK_ERR_NOT_FOUND, "%s: %s: no attribute %s", f->path, obj, key) : ZCK_ERR_NOT_FOUND;
  if (a->flags & ZCK__H5M_OPEN_ERR) return zck__fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s: %s", f->path, obj, key, a->err);
  if (a->npoints != 1)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s holds %lld values, expected 1", f->path, obj, key,
                     (long long)a->npoints);
  *out = a;
  return ZCK_OK;
}

/* Attribute key of obj, holding one value, or fails (NOT_FOUND when absent). */
static zck_status zck__h5_attr_find(zck_h5_file *f, const char *obj, const char *key, const zck__h5_mattr **out) {
  *out = NULL;
  const zck__h5_mobj *o;
  const char *why;
  zck_status st = zck__h5_find(f, obj, &o, &why);
  if (st == ZCK_ERR_NOT_FOUND) return zck__fail(st, "%s: no object %s", f->path, obj);
  if (st != ZCK_OK) return zck__fail(st, "%s: %s: %s", f->path, obj, why);
  return zck__h5_attr_at(f, o, obj, key, true, out);
}

/* Attribute a (key of obj) as text. */
static zck_status zck__h5_attr_text(zck_h5_file *f, const zck__h5_mattr *a, const char *obj, const char *key, char **out) {
  *out = NULL;
  if (a->cls != H5T_STRING) return zck__fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s is not text", f->path, obj, key);
  if (a->flags & ZCK__H5M_STR_BIG)
    return zck__fail(ZCK_ERR_LIMIT, "%s: %s: attribute %s of %zu bytes or more", f->path, obj, key, ZCK__H5M_MAX_FIXED_TEXT);
  if (!(a->flags & ZCK__H5M_STR)) return zck__fail(ZCK_ERR_FORMAT, "%s: %s: reading attribute %s: %s", f->path, obj, key, a->err);
  /* fixed-length text was cut at its padding by the child (H-07) */
  *out = zck__strndup(a->text, a->text_len);
  return *out ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

zck_status zck_h5_attr_str(zck_h5_file *f, const char *obj, const char *key, char **out) {
  *out = NULL;
  const zck__h5_mattr *a;
  ZCK_TRY(zck__h5_attr_find(f, obj, key, &a));
  return zck__h5_attr_text(f, a, obj, key, out);
}

/* A one-value integer or float attribute as int64 ('i'), uint64 ('u') or double ('d'),
 * converted by libhdf5 in the child as H5Aread converts. */
static zck_status zck__h5_attr_value(zck_h5_file *f, const zck__h5_mattr *a, const char *obj, const char *key, char as,
                                     void *out) {
  if (a->cls != H5T_INTEGER && a->cls != H5T_FLOAT)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s is not a number", f->path, obj, key);
  unsigned have = as == 'i' ? ZCK__H5M_I64 : as == 'u' ? ZCK__H5M_U64 : ZCK__H5M_F64;
  if (!(a->flags & have)) return zck__fail(ZCK_ERR_FORMAT, "%s: %s: reading attribute %s: %s", f->path, obj, key, a->err);
  if (as == 'i') *(int64_t *)out = a->i64;
  else if (as == 'u') *(uint64_t *)out = a->u64;
  else *(double *)out = a->f64;
  return ZCK_OK;
}

static zck_status zck__h5_attr_num(zck_h5_file *f, const char *obj, const char *key, char as, void *out) {
  const zck__h5_mattr *a;
  ZCK_TRY(zck__h5_attr_find(f, obj, key, &a));
  return zck__h5_attr_value(f, a, obj, key, as, out);
}

zck_status zck_h5_attr_i64(zck_h5_file *f, const char *obj, const char *key, int64_t *out) {
  return zck__h5_attr_num(f, obj, key, 'i', out);
}

zck_status zck_h5_attr_f64(zck_h5_file *f, const char *obj, const char *key, double *out) {
  return zck__h5_attr_num(f, obj, key, 'd', out);
}

// ---- datasets

/* The `dtype` attribute may reinterpret the stored integers (H-08). */
static zck_status zck__h5_dtype_attr(zck_h5_dataset *d, const char *attr, zck_dtype stored) {
  struct { const char *name; zck_dtype as; zck_dtype over1, over2; } re[] = {
    {"bfloat16", ZCK_BF16, ZCK_U16, ZCK_I16},  {"float16", ZCK_F16, ZCK_U16, ZCK_F16},
    {"bool", ZCK_BOOL, ZCK_U8, ZCK_BOOL},     {"float8_e4m3fn", ZCK_F8_E4M3, ZCK_U8, ZCK_I8},
    {"float8_e5m2", ZCK_F8_E5M2, ZCK_U8, ZCK_I8}};
  for (size_t i = 0; i < sizeof re / sizeof re[0]; i++) {
    if (strcmp(attr, re[i].name)) continue;
    if (stored != re[i].over1 && stored != re[i].over2) break;
    d->info.dtype = re[i].as;
    return ZCK_OK;
  }
  if (!strcmp(attr, zck_dtype_name(stored))) return ZCK_OK;
  return zck__fail(ZCK_ERR_FORMAT, "%s: dtype attribute \"%s\" does not match the stored %s elements", d->label,
                   attr, zck_dtype_name(stored));
}

/* The element type and the dataspace: dims, shape and element count. */
static zck_status zck__h5_dataset_shape(zck_h5_dataset *d, const zck__h5_mdset *s) {
  if (s->dtype <= 0 || s->dtype >= ZCK_DTYPE_COUNT)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: element type not supported (class %d, %zu bytes)", d->label, s->cls,
                     (size_t)s->size);
  d->info.dtype = (zck_dtype)s->dtype;
  d->es = zck_dtype_size(d->info.dtype);
  int nd = s->ndims;
  if (s->space_cls == H5S_NULL || nd < 0 || nd > ZCK_H5_MAX_DIMS)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: dataspace of %d dimensions", d->label, nd);
  d->info.ndim = nd;
  d->info.numel = 1;
  for (int i = 0; i < nd; i++) {
    uint64_t dim = s->dims[i];
    d->dims[i] = dim;
    d->info.shape[i] = (int64_t)dim;
    if (dim > ((uint64_t)1 << 62) || !zck__mul_u64(d->info.numel, dim, &d->info.numel))
      return zck__fail(ZCK_ERR_FORMAT, "%s: element count overflows", d->label);
  }
  uint64_t nbytes;
  if (!zck__mul_u64(d->info.numel, d->es, &nbytes)) return zck__fail(ZCK_ERR_FORMAT, "%s: size overflows", d->label);
  return ZCK_OK;
}

/* How the bytes are stored: contiguous, compact or in chunks (of bounded size), in this
 * file. */
static zck_status zck__h5_dataset_storage(zck_h5_dataset *d, const zck__h5_mdset *s) {
  int nd = d->info.ndim;
  if (s->layout == H5D_CHUNKED) {
    if (s->chunk_nd != nd) return zck__fail(ZCK_ERR_FORMAT, "%s: chunk dimensions: %s", d->label, s->chunk_err);
    d->info.chunked = true;
    d->chunk_elems = 1;
    for (int i = 0; i < nd; i++) {
      uint64_t cd = s->chunk[i];
      d->cdims[i] = cd;
      d->info.chunk[i] = (int64_t)cd;
      if (!cd || !zck__mul_u64(d->chunk_elems, cd, &d->chunk_elems) || d->chunk_elems > ((uint64_t)1 << 40))
        return zck__fail(ZCK_ERR_FORMAT, "%s: bad chunk dimensions", d->label);
    }
    uint64_t cb = d->chunk_elems * d->es;
    if (cb >= ((uint64_t)1 << 32))
      return zck__fail(ZCK_ERR_FORMAT, "%s: chunks of %llu bytes exceed 4 GiB", d->label, (unsigned long long)cb);
    if (cb > ZCK__H5_MAX_CHUNK_BYTES)
      return zck__fail(ZCK_ERR_LIMIT, "%s: chunks of %llu bytes exceed the 1 GiB limit", d->label, (unsigned long long)cb);
  } else if (s->layout != H5D_CONTIGUOUS && s->layout != H5D_COMPACT) {
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: storage layout %d not supported", d->label, s->layout);
  }
  if (s->external != 0) /* its bytes would be read from other files, named by the file */
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: data stored in external files is not supported", d->label);
  return ZCK_OK;
}

/* The filter pipeline: zstd, or optional filters only (H-05: never hand out bytes a
 * filter we cannot undo produced). */
static zck_status zck__h5_dataset_filters(zck_h5_dataset *d, const zck__h5_mdset *s) {
  int nf = s->nfilters;
  if (nf < 0 || nf > ZCK__H5_MAX_FILTERS || nf > ZCK__H5M_MAX_FILTERS)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %d filters", d->label, nf);
  d->nfilters = nf;
  d->info.zstd_level = -1;
  for (int i = 0; i < nf; i++) {
    unsigned id = s->filters[i].id, flags = s->filters[i].flags;
    d->filt_id[i] = id;
    d->filt_flags[i] = flags;
    if (id == ZCK_H5_ZSTD_FILTER) {
      d->info.zstd = true;
      d->info.zstd_flags = flags;
      d->info.zstd_level = s->filters[i].level;
    } else if (!(flags & H5Z_FLAG_OPTIONAL)) {
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: mandatory filter %d (%s) not supported", d->label, (int)id,
                       s->filters[i].name);
    }
  }
  return ZCK_OK;
}

/* Its attributes, from the object found (not looked up by path again): the dtype it
 * stands for, and the checksum of an unchunked one. */
static zck_status zck__h5_dataset_attrs(zck_h5_dataset *d, zck_h5_file *f, const zck__h5_mobj *o, const char *path) {
  char *attr = NULL;
  const zck__h5_mattr *a;
  zck_status st = zck__h5_attr_at(f, o, path, "dtype", false, &a);
  if (st == ZCK_OK) st = zck__h5_attr_text(f, a, path, "dtype", &attr);
  if (st == ZCK_OK) st = zck__h5_dtype_attr(d, attr, d->info.dtype);
  else if (st == ZCK_ERR_NOT_FOUND) st = ZCK_OK;
  free(attr);
  if (st == ZCK_OK && !d->info.chunked && d->info.numel) {
    /* the checksum zckpt writes for an unfiltered 0-dim dataset; optional (older files,
     * h5py, compact datasets: the checksum table covers those) */
    zck_status hs = zck__h5_attr_at(f, o, path, ZCK_H5_XXH3_ATTR, false, &a);
    if (hs == ZCK_OK) hs = zck__h5_attr_value(f, a, path, ZCK_H5_XXH3_ATTR, 'u', &d->xxh3);
    if (hs == ZCK_OK) d->has_xxh3 = true;
    else if (hs != ZCK_ERR_NOT_FOUND) st = hs;
  }
  return st;
}

zck_status zck_h5_dataset_open(zck_h5_file *f, const char *path, zck_h5_dataset **out) {
  *out = NULL;
  zck_h5_dataset *d = zck__calloc(1, sizeof *d);
  if (!d) return ZCK_ERR_NO_MEMORY;
  d->f = f;
  d->label = zck__sprintf("%s:%s", f->path, path);
  if (!d->label) {
    free(d);
    return ZCK_ERR_NO_MEMORY;
  }
  const zck__h5_mobj *o;
  const char *why;
  /* everything from the header as the forked child read it (h5_probe.c): the parent opens
   * the dataset only to read it, by the address the child opened it at */
  zck_status st = zck__h5_find(f, path, &o, &why);
  if (st == ZCK_ERR_NOT_FOUND) st = zck__fail(st, "%s: no dataset", d->label);
  else if (st != ZCK_OK) st = zck__fail(st, "%s: %s", d->label, why);
  else if (o->type != H5O_TYPE_DATASET || !o->ds) st = zck__fail(ZCK_ERR_FORMAT, "%s: not a dataset", d->label);
  const zck__h5_mdset *s = st == ZCK_OK ? o->ds : NULL;
  if (st == ZCK_OK) {
    d->addr = o->addr;
    if (s->err) st = zck__fail(ZCK_ERR_FORMAT, "%s: unreadable header: %s", d->label, s->err);
  }
  if (st == ZCK_OK) st = zck__h5_dataset_shape(d, s);
  if (st == ZCK_OK) st = zck__h5_dataset_storage(d, s);
  if (st == ZCK_OK) st = zck__h5_dataset_filters(d, s);
  if (st == ZCK_OK && s->fill_len && s->fill_len == d->es && d->es <= sizeof d->fill) memcpy(d->fill, s->fill, d->es);
  if (st == ZCK_OK) st = zck__h5_dataset_attrs(d, f, o, path);
  /* bound to the path asked for, the dtype after its attribute and the shape: another
   * dataset's contents under this name miss the table */
  if (st == ZCK_OK && f->sums && strcmp(path, ZCK__H5C_TABLE)) {
    d->summed = true;
    d->sum_seed = zck__h5c_seed(path, d->info.dtype, d->info.ndim, d->dims);
  }
  if (st != ZCK_OK) {
    zck_h5_dataset_close(d);
    return st;
  }
  *out = d;
  return ZCK_OK;
}

void zck_h5_dataset_close(zck_h5_dataset *d) {
  if (!d) return;
  free(d->label);
  free(d);
}

const zck_h5_dataset_info *zck_h5_dataset_info_of(const zck_h5_dataset *d) { return &d->info; }
/* d's pieces, cut as its file's table was made; its seed */
static void zck__h5_pieces(const zck_h5_dataset *d, zck__h5c_ds *c) {
  zck__h5c_geometry(c, d->info.dtype, d->info.ndim, d->dims, d->f->sums->piece_bytes);
  c->seed = d->sum_seed;
}

uint64_t zck__h5_dataset_pieces(const zck_h5_dataset *d) {
  if (!d->summed) return 0;
  zck__h5c_ds c;
  zck__h5_pieces(d, &c);
  return c.g.n;
}

// ---- chunk fetch

/* Reads and unfilters chunk `coord` (chunk indices) into out (chunk_elems * es bytes). */
static zck_status zck__h5_load_chunk(zck_h5_dataset *d, const uint64_t *coord, uint8_t *out, uint8_t **scratch,
                                     size_t *scratch_cap) {
  int nd = d->info.ndim;
  hsize_t off[ZCK_H5_MAX_DIMS];
  char what[600];
  size_t pos = (size_t)snprintf(what, sizeof what, "%s: chunk [", d->label);
  for (int i = 0; i < nd; i++) {
    off[i] = coord[i] * d->cdims[i];
    if (pos < sizeof what) pos += (size_t)snprintf(what + pos, sizeof what - pos, i ? ", %llu" : "%llu", (unsigned long long)off[i]);
  }
  if (pos < sizeof what) snprintf(what + pos, sizeof what - pos, "]");
  size_t raw = (size_t)(d->chunk_elems * d->es);
  zck_status st = ZCK_OK;
  uint32_t mask = 0;
  hsize_t nbytes = 0;
  zck__h5_lock();
  hid_t dset = H5Oopen_by_addr(d->f->file, (haddr_t)d->addr);
  if (dset < 0) {
    st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: cannot open the dataset again", what);
    zck__h5_unlock();
    return st;
  }
  if (H5Dget_chunk_storage_size(dset, off, &nbytes) < 0) {
    /* the chunk index cannot be read (a damaged B-tree node): not "never written" */
    st = zck__h5_fail(ZCK_ERR_DAMAGED, "%s: damaged: the chunk index cannot be read", what);
    H5Oclose(dset);
    zck__h5_unlock();
    return st;
  }
  if (nbytes == 0) {
    /* never written: the fill value, as HDF5 would return */
    H5Oclose(dset);
    H5Eclear2(H5E_DEFAULT);
    zck__h5_unlock();
    for (size_t i = 0; i < d->chunk_elems; i++) memcpy(out + i * d->es, d->fill, d->es);
    return ZCK_OK;
  }
  if (nbytes >= ((uint64_t)1 << 32) || nbytes > d->f->size) {
    H5Oclose(dset);
    zck__h5_unlock();
    return zck__fail(ZCK_ERR_FORMAT, "%s: stored size %llu exceeds %s", what, (unsigned long long)nbytes,
                     nbytes > d->f->size ? "the file" : "4 GiB");
  }
  if (*scratch_cap < nbytes) {
    uint8_t *p = realloc(*scratch, (size_t)nbytes);
    if (!p) {
      H5Oclose(dset);
      zck__h5_unlock();
      return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    }
    *scratch = p;
    *scratch_cap = (size_t)nbytes;
  }
  if (H5Dread_chunk(dset, H5P_DEFAULT, off, &mask, *scratch) < 0) st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: read", what);
  H5Oclose(dset);
  zck__h5_unlock();
  if (st != ZCK_OK) return st;
  bool applied = false;
  for (int i = d->nfilters - 1; i >= 0; i--) {
    if (mask & (1u << i)) continue;   /* H-06: this filter was skipped for the chunk */
    if (d->filt_id[i] != ZCK_H5_ZSTD_FILTER || applied)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: filter %u applied; only zstd (32015) is supported", what, d->filt_id[i]);
    ZCK_TRY(zck__h5_unzstd(*scratch, (size_t)nbytes, out, raw, what));
    applied = true;
  }
  if (!applied) {
    if (nbytes != raw)
      return zck__fail(ZCK_ERR_FORMAT, "%s: %llu stored bytes, expected %zu", what, (unsigned long long)nbytes, raw);
    memcpy(out, *scratch, raw);
  }
  return ZCK_OK;
}

// ---- range reads

typedef struct zck__h5_rd {
  zck_h5_dataset *d;
  uint8_t *dst;
  uint64_t first;            /* flat index of dst[0] */
  uint64_t stride[ZCK_H5_MAX_DIMS];
  uint8_t *chunk, *scratch;
  size_t scratch_cap;
  uint64_t have[ZCK_H5_MAX_DIMS];
  bool have_valid;
} zck__h5_rd;

/* Copies box [lo, hi) (already inside chunk `cc`) from the chunk buffer to dst. */
static void zck__h5_copy_rows(zck__h5_rd *r, const uint64_t *cc, const uint64_t *lo, const uint64_t *hi) {
  zck_h5_dataset *d = r->d;
  int nd = d->info.ndim;
  uint64_t cstride[ZCK_H5_MAX_DIMS];
  cstride[nd - 1] = 1;
  for (int i = nd - 2; i >= 0; i--) cstride[i] = cstride[i + 1] * d->cdims[i + 1];
  uint64_t idx[ZCK_H5_MAX_DIMS];
  for (int i = 0; i < nd; i++) idx[i] = lo[i];
  uint64_t run = hi[nd - 1] - lo[nd - 1];
  for (;;) {
    uint64_t src = 0, dst = 0;
    for (int i = 0; i < nd; i++) {
      src += (idx[i] - cc[i] * d->cdims[i]) * cstride[i];
      dst += idx[i] * r->stride[i];
    }
    memcpy(r->dst + (dst - r->first) * d->es, r->chunk + src * d->es, (size_t)(run * d->es));
    int i = nd - 2;
    for (; i >= 0; i--) {
      if (++idx[i] < hi[i]) break;
      idx[i] = lo[i];
    }
    if (i < 0) break;
  }
}

static zck_status zck__h5_read_box_chunked(zck__h5_rd *r, const uint64_t *start, const uint64_t *count) {
  zck_h5_dataset *d = r->d;
  int nd = d->info.ndim;
  uint64_t c_lo[ZCK_H5_MAX_DIMS], c_hi[ZCK_H5_MAX_DIMS], cc[ZCK_H5_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    c_lo[i] = start[i] / d->cdims[i];
    c_hi[i] = (start[i] + count[i] - 1) / d->cdims[i];
    cc[i] = c_lo[i];
  }
  for (;;) {
    bool same = r->have_valid;
    for (int i = 0; i < nd && same; i++) same = r->have[i] == cc[i];
    if (!same) {
      r->have_valid = false;
      ZCK_TRY(zck__h5_load_chunk(d, cc, r->chunk, &r->scratch, &r->scratch_cap));
      memcpy(r->have, cc, sizeof r->have);
      r->have_valid = true;
    }
    uint64_t lo[ZCK_H5_MAX_DIMS], hi[ZCK_H5_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
      uint64_t a = cc[i] * d->cdims[i], b = a + d->cdims[i];
      lo[i] = start[i] > a ? start[i] : a;
      hi[i] = start[i] + count[i] < b ? start[i] + count[i] : b;
    }
    zck__h5_copy_rows(r, cc, lo, hi);
    int i = nd - 1;
    for (; i >= 0; i--) {
      if (++cc[i] <= c_hi[i]) break;
      cc[i] = c_lo[i];
    }
    if (i < 0) break;
  }
  return ZCK_OK;
}

/* Boxes of the form produced by the decomposition are contiguous in flat order. */
static zck_status zck__h5_read_box_plain(zck__h5_rd *r, const uint64_t *start, const uint64_t *count) {
  zck_h5_dataset *d = r->d;
  int nd = d->info.ndim;
  uint64_t flat = 0, n = 1;
  hsize_t s[ZCK_H5_MAX_DIMS], c[ZCK_H5_MAX_DIMS];
  for (int i = 0; i < nd; i++) {
    flat += start[i] * r->stride[i];
    n *= count[i];
    s[i] = start[i];
    c[i] = count[i];
  }
  zck_status st = ZCK_OK;
  zck__h5_lock();
  hid_t dset = H5Oopen_by_addr(d->f->file, (haddr_t)d->addr);
  /* a read of the whole dataset (every small one: each is read whole) needs no selection:
   * H5S_ALL saves making and closing two dataspaces, a fifth of the read's own cost */
  bool whole = n == d->info.numel;
  hid_t fs = dset < 0 || whole ? H5S_ALL : H5Dget_space(dset);
  hid_t mtype = dset < 0 ? H5I_INVALID_HID : H5Dget_type(dset); /* memory type = file type (little-endian both) */
  hsize_t mn = n;
  hid_t ms = whole ? H5S_ALL : H5Screate_simple(1, &mn, NULL);
  if (dset < 0 || fs < 0 || mtype < 0 || ms < 0 ||
      (!whole && nd && H5Sselect_hyperslab(fs, H5S_SELECT_SET, s, NULL, c, NULL) < 0) ||
      H5Dread(dset, mtype, ms, fs, H5P_DEFAULT, r->dst + (flat - r->first) * d->es) < 0)
    st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: read", d->label);
  if (fs > 0) H5Sclose(fs);
  if (ms > 0) H5Sclose(ms);
  if (mtype >= 0) H5Tclose(mtype);
  if (dset >= 0) H5Oclose(dset);
  zck__h5_unlock();
  /* the stored checksum covers the whole dataset: checked when a read covers it (zckpt
   * writes it only for 0-dim datasets, read whole). Memory and file types are both
   * little-endian here. */
  if (st == ZCK_OK && d->has_xxh3 && n == d->info.numel &&
      zck_xxh3(r->dst + (flat - r->first) * d->es, (size_t)(n * d->es)) != d->xxh3)
    st = zck__fail(ZCK_ERR_DAMAGED, "%s: damaged: its data does not match its %s attribute", d->label, ZCK_H5_XXH3_ATTR);
  return st;
}

static zck_status zck__h5_read_box(zck__h5_rd *r, const uint64_t *start, const uint64_t *count) {
  return r->d->info.chunked ? zck__h5_read_box_chunked(r, start, count) : zck__h5_read_box_plain(r, start, count);
}

/* Flat range [lo, hi) relative to the sub-array at dim k under prefix -> boxes. */
static zck_status zck__h5_decompose(zck__h5_rd *r, int k, uint64_t *prefix, uint64_t lo, uint64_t hi) {
  if (lo >= hi) return ZCK_OK;
  zck_h5_dataset *d = r->d;
  int nd = d->info.ndim;
  uint64_t sk = r->stride[k];
  uint64_t ilo = lo / sk, rlo = lo % sk, ihi = hi / sk, rhi = hi % sk;
  if (ilo == ihi) {
    prefix[k] = ilo;
    return zck__h5_decompose(r, k + 1, prefix, rlo, rhi);
  }
  if (rlo) {
    prefix[k] = ilo;
    ZCK_TRY(zck__h5_decompose(r, k + 1, prefix, rlo, sk));
    ilo++;
  }
  if (ihi > ilo) {
    uint64_t start[ZCK_H5_MAX_DIMS], count[ZCK_H5_MAX_DIMS];
    for (int i = 0; i < nd; i++) {
      start[i] = i < k ? prefix[i] : i == k ? ilo : 0;
      count[i] = i < k ? 1 : i == k ? ihi - ilo : d->dims[i];
    }
    ZCK_TRY(zck__h5_read_box(r, start, count));
  }
  if (rhi) {
    prefix[k] = ihi;
    ZCK_TRY(zck__h5_decompose(r, k + 1, prefix, 0, rhi));
  }
  return ZCK_OK;
}

static zck_status zck__h5_read_range(void *ctx, void *dst, uint64_t first, uint64_t count) {
  zck_h5_dataset *d = ctx;
  uint64_t end;
  if (!zck__add_u64(first, count, &end) || end > d->info.numel)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: elements [%llu, +%llu) outside its %llu", d->label,
                     (unsigned long long)first, (unsigned long long)count, (unsigned long long)d->info.numel);
  if (!count) return ZCK_OK;
  int nd = d->info.ndim;
  zck__h5_rd r;
  memset(&r, 0, sizeof r);
  r.d = d;
  r.dst = dst;
  r.first = first;
  if (nd == 0) {
    uint64_t z = 0;
    return zck__h5_read_box_plain(&r, &z, &z);
  }
  r.stride[nd - 1] = 1;
  for (int i = nd - 2; i >= 0; i--) r.stride[i] = r.stride[i + 1] * d->dims[i + 1];
  if (d->info.chunked && !(r.chunk = malloc((size_t)(d->chunk_elems * d->es))))
    return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory for a chunk", d->label);
  uint64_t prefix[ZCK_H5_MAX_DIMS] = {0};
  /* the whole array is the sub-array of "dim -1": index 0 of a virtual outer dim */
  uint64_t total = r.stride[0] * d->dims[0];
  zck_status st = ZCK_OK;
  if (first == 0 && end == total) {
    uint64_t start[ZCK_H5_MAX_DIMS] = {0}, cnt[ZCK_H5_MAX_DIMS];
    for (int i = 0; i < nd; i++) cnt[i] = d->dims[i];
    st = zck__h5_read_box(&r, start, cnt);
  } else {
    st = zck__h5_decompose(&r, 0, prefix, first, end);
  }
  free(r.chunk);
  free(r.scratch);
  return st;
}

zck_status zck_h5_dataset_read(zck_h5_dataset *d, void *dst, uint64_t first, uint64_t count) {
  if (!d->summed || !count) return zck__h5_read_range(d, dst, first, count);
  uint64_t end;
  if (!zck__add_u64(first, count, &end) || end > d->info.numel)
    return zck__h5_read_range(d, dst, first, count);   /* its range error */
  zck__h5c_ds c;
  zck__h5_pieces(d, &c);
  return zck__h5c_read(&c, d->f->sums, d->label, d->es, zck__h5_read_range, d, dst, first, count);
}

static zck_status zck__h5_store_read(void *ctx, void *dst, uint64_t off, uint64_t count) {
  return zck_h5_dataset_read(ctx, dst, off, count);
}

zck_store zck_h5_dataset_store(zck_h5_dataset *d) {
  return zck_store_callback(zck__h5_store_read, NULL, d, d->info.dtype, d->info.numel, d->label);
}
