/* h5_read.c: reading datasets by element range, decompressing only the chunks needed.
 *
 * A range [first, first + count) of the row-major flattening is cut into at most
 * 2*ndim - 1 boxes of the form (fixed prefix, a range of one dim, full later dims). For
 * a chunked dataset each box visits the chunks it overlaps; a chunk is fetched raw with
 * H5Dread_chunk (under the HDF5 lock), checked and decompressed here (H-01..H-04), and
 * the overlap copied row by row. Contiguous datasets are read with a hyperslab. */
#include "h5_internal.h"

#include <stdlib.h>
#include <string.h>

struct zck_h5_file {
  char *path;
  hid_t file;
  uint64_t size;
};

#define ZCK__H5_MAX_FILTERS 16

struct zck_h5_dataset {
  zck_h5_file *f;
  char *label;                     /* "FILE:/path" */
  hid_t dset, mtype;
  zck_h5_dataset_info info;
  size_t es;
  uint64_t dims[ZCK_H5_MAX_DIMS], cdims[ZCK_H5_MAX_DIMS];
  uint64_t chunk_elems;
  int nfilters;
  unsigned filt_id[ZCK__H5_MAX_FILTERS], filt_flags[ZCK__H5_MAX_FILTERS];
  uint8_t fill[16];                /* one element of the fill value */
  bool has_xxh3;                   /* contiguous: ZCK_H5_XXH3_ATTR present (zck_h5.h) */
  uint64_t xxh3;
};

// ---- files

static zck_status zck__h5_attr_num(zck_h5_file *f, const char *obj, const char *key, hid_t mt, void *out);

zck_status zck_h5_open(const char *path, zck_h5_file **out) {
  *out = NULL;
  zck_h5_file *f = zck__calloc(1, sizeof *f);
  if (!f || !(f->path = zck__strdup(path))) {
    free(f);
    return ZCK_ERR_NO_MEMORY;
  }
  zck_status st = zck__h5_probe(path);
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
    f->file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    hsize_t sz = 0;
    if (f->file < 0) st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: cannot open as HDF5", path);
    else if (H5Fget_filesize(f->file, &sz) < 0) st = zck__h5_fail(ZCK_ERR_IO, "%s: size", path);
    f->size = sz;
  }
  zck__h5_unlock();
  if (st != ZCK_OK) {
    zck_h5_close(f);
    return st;
  }
  *out = f;
  return ZCK_OK;
}

zck_status zck_h5_check_attrs(zck_h5_file *f) {
  uint64_t want = 0, got = 0;
  zck_status st = zck__h5_attr_num(f, "/", ZCK_H5_ATTRS_XXH3_ATTR, H5T_NATIVE_UINT64, &want);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();   /* not written by zckpt, or before the digest */
    return ZCK_OK;
  }
  if (st != ZCK_OK) return st;
  zck__h5_lock();
  st = zck__h5_attrs_digest(f->file, &got);
  zck__h5_unlock();
  if (st != ZCK_OK) return zck__error_prepend(st, "%s", f->path);
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
  free(f->path);
  free(f);
}

const char *zck_h5_name(const zck_h5_file *f) { return f->path; }

/* H5Lexists on each prefix: HDF5 fails, rather than answering 0, for a missing parent. */
static bool zck__h5_path_exists(hid_t file, const char *path) {
  if (!strcmp(path, "/")) return true;
  char buf[4096];
  size_t n = strlen(path);
  if (n >= sizeof buf) return false;
  memcpy(buf, path, n + 1);
  for (size_t i = 1; i <= n; i++) {
    if (buf[i] != '/' && buf[i] != 0) continue;
    char c = buf[i];
    buf[i] = 0;
    htri_t e = H5Lexists(file, buf, H5P_DEFAULT);
    buf[i] = c;
    if (e <= 0) {
      H5Eclear2(H5E_DEFAULT);
      return false;
    }
  }
  return true;
}

bool zck_h5_exists(zck_h5_file *f, const char *path) {
  zck__h5_lock();
  bool e = zck__h5_path_exists(f->file, path);
  zck__h5_unlock();
  return e;
}

typedef struct {
  char **v;
  size_t n, cap;
  bool oom;
} zck__h5_names;

static herr_t zck__h5_list_cb(hid_t g, const char *name, const H5L_info_t *info, void *ctx) {
  zck__h5_names *l = ctx;
  if (l->n == l->cap) {
    size_t nc = l->cap ? 2 * l->cap : 32;
    char **v = realloc(l->v, nc * sizeof *v);
    if (!v) { l->oom = true; return -1; }
    l->v = v;
    l->cap = nc;
  }
  if (!(l->v[l->n] = strdup(name))) { l->oom = true; return -1; }
  l->n++;
  return 0;
}

zck_status zck_h5_list(zck_h5_file *f, const char *group, char ***names, size_t *n) {
  *names = NULL;
  *n = 0;
  zck__h5_names l = {0};
  zck_status st = ZCK_OK;
  zck__h5_lock();
  hid_t g = zck__h5_path_exists(f->file, group) ? H5Gopen2(f->file, group, H5P_DEFAULT) : H5I_INVALID_HID;
  if (g < 0) {
    st = zck__h5_fail(ZCK_ERR_NOT_FOUND, "%s: no group %s", f->path, group);
  } else {
    hsize_t idx = 0;
    if (H5Literate(g, H5_INDEX_NAME, H5_ITER_INC, &idx, zck__h5_list_cb, &l) < 0)
      st = l.oom ? zck__fail(ZCK_ERR_NO_MEMORY, "out of memory") : zck__h5_fail(ZCK_ERR_FORMAT, "%s: %s: listing", f->path, group);
    H5Gclose(g);
  }
  zck__h5_unlock();
  if (st != ZCK_OK) {
    for (size_t i = 0; i < l.n; i++) free(l.v[i]);
    free(l.v);
    return st;
  }
  *names = l.v;
  *n = l.n;
  return ZCK_OK;
}

// ---- attributes

/* Opens attribute key of obj, or fails NOT_FOUND. Lock held. */
static zck_status zck__h5_attr_open(zck_h5_file *f, const char *obj, const char *key, hid_t *o, hid_t *a) {
  *o = *a = H5I_INVALID_HID;
  if (!zck__h5_path_exists(f->file, obj)) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no object %s", f->path, obj);
  *o = H5Oopen(f->file, obj, H5P_DEFAULT);
  if (*o < 0) return zck__h5_fail(ZCK_ERR_FORMAT, "%s: %s: cannot open", f->path, obj);
  htri_t ex = H5Aexists(*o, key);
  /* an error is not absence: a damaged attribute index must not read as "no attribute" */
  if (ex < 0) return zck__h5_fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s", f->path, obj, key);
  if (ex == 0) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: %s: no attribute %s", f->path, obj, key);
  *a = H5Aopen(*o, key, H5P_DEFAULT);
  if (*a < 0) return zck__h5_fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s", f->path, obj, key);
  hid_t sp = H5Aget_space(*a);
  hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
  if (sp >= 0) H5Sclose(sp);
  if (np != 1) return zck__fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s holds %lld values, expected 1", f->path, obj, key, (long long)np);
  return ZCK_OK;
}

static void zck__h5_attr_close(hid_t o, hid_t a) {
  if (a >= 0) H5Aclose(a);
  if (o >= 0) H5Oclose(o);
}

static zck_status zck__h5_attr_str_locked(zck_h5_file *f, const char *obj, const char *key, char **out) {
  *out = NULL;
  hid_t o, a;
  zck_status st = zck__h5_attr_open(f, obj, key, &o, &a);
  hid_t t = st == ZCK_OK ? H5Aget_type(a) : H5I_INVALID_HID;
  if (st == ZCK_OK && H5Tget_class(t) != H5T_STRING)
    st = zck__fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s is not text", f->path, obj, key);
  if (st == ZCK_OK && H5Tis_variable_str(t) > 0) {
    hid_t mt = H5Tcopy(H5T_C_S1);
    H5Tset_size(mt, H5T_VARIABLE);
    H5Tset_cset(mt, H5Tget_cset(t));
    char *p = NULL;
    if (H5Aread(a, mt, &p) < 0) st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: %s: reading attribute %s", f->path, obj, key);
    else *out = zck__strdup(p ? p : "");
    if (p) H5free_memory(p);
    H5Tclose(mt);
  } else if (st == ZCK_OK) {
    /* fixed length, NUL- or space-padded (H-07: accepted) */
    size_t n = H5Tget_size(t);
    char *buf = n < ((size_t)1 << 24) ? zck__calloc(n + 1, 1) : NULL;
    hid_t mt = H5Tcopy(t);
    if (!buf) st = zck__fail(ZCK_ERR_LIMIT, "%s: %s: attribute %s of %zu bytes", f->path, obj, key, n);
    else if (H5Aread(a, mt, buf) < 0) st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: %s: reading attribute %s", f->path, obj, key);
    H5Tclose(mt);
    if (st == ZCK_OK) {
      size_t len = strnlen(buf, n);
      if (H5Tget_strpad(t) == H5T_STR_SPACEPAD)
        while (len && buf[len - 1] == ' ') len--;
      buf[len] = 0;
      *out = buf;
      buf = NULL;
    }
    free(buf);
  }
  if (t >= 0) H5Tclose(t);
  zck__h5_attr_close(o, a);
  if (st == ZCK_OK && !*out) st = ZCK_ERR_NO_MEMORY;
  return st;
}

zck_status zck_h5_attr_str(zck_h5_file *f, const char *obj, const char *key, char **out) {
  zck__h5_lock();
  zck_status st = zck__h5_attr_str_locked(f, obj, key, out);
  zck__h5_unlock();
  return st;
}

static zck_status zck__h5_attr_num(zck_h5_file *f, const char *obj, const char *key, hid_t mt, void *out) {
  zck__h5_lock();
  hid_t o, a;
  zck_status st = zck__h5_attr_open(f, obj, key, &o, &a);
  if (st == ZCK_OK) {
    hid_t t = H5Aget_type(a);
    H5T_class_t c = H5Tget_class(t);
    H5Tclose(t);
    if (c != H5T_INTEGER && c != H5T_FLOAT) st = zck__fail(ZCK_ERR_FORMAT, "%s: %s: attribute %s is not a number", f->path, obj, key);
    else if (H5Aread(a, mt, out) < 0) st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: %s: reading attribute %s", f->path, obj, key);
  }
  zck__h5_attr_close(o, a);
  zck__h5_unlock();
  return st;
}

zck_status zck_h5_attr_i64(zck_h5_file *f, const char *obj, const char *key, int64_t *out) {
  return zck__h5_attr_num(f, obj, key, H5T_NATIVE_INT64, out);
}

zck_status zck_h5_attr_f64(zck_h5_file *f, const char *obj, const char *key, double *out) {
  return zck__h5_attr_num(f, obj, key, H5T_NATIVE_DOUBLE, out);
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
  return zck__fail(ZCK_ERR_FORMAT, "%s: dtype attribute \"%s\" does not match the stored %s elements (H-08)", d->label,
                   attr, zck_dtype_name(stored));
}

zck_status zck_h5_dataset_open(zck_h5_file *f, const char *path, zck_h5_dataset **out) {
  *out = NULL;
  zck_h5_dataset *d = zck__calloc(1, sizeof *d);
  if (!d) return ZCK_ERR_NO_MEMORY;
  d->f = f;
  d->dset = d->mtype = H5I_INVALID_HID;
  d->label = zck__sprintf("%s:%s", f->path, path);
  if (!d->label) {
    free(d);
    return ZCK_ERR_NO_MEMORY;
  }
  zck_status st = ZCK_OK;
  hid_t type = H5I_INVALID_HID, space = H5I_INVALID_HID, dcpl = H5I_INVALID_HID;
  char *attr = NULL;
  zck__h5_lock();
  if (!zck__h5_path_exists(f->file, path)) {
    st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no dataset", d->label);
    goto done;
  }
  d->dset = H5Dopen2(f->file, path, H5P_DEFAULT);
  if (d->dset < 0) { st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: not a dataset", d->label); goto done; }
  type = H5Dget_type(d->dset);
  space = H5Dget_space(d->dset);
  dcpl = H5Dget_create_plist(d->dset);
  if (type < 0 || space < 0 || dcpl < 0) { st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: unreadable header", d->label); goto done; }
  zck_dtype stored = zck__h5_dtype_of(type);
  if (!stored) { st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: element type not supported (class %d, %zu bytes)", d->label, (int)H5Tget_class(type), H5Tget_size(type)); goto done; }
  d->info.dtype = stored;
  d->es = zck_dtype_size(stored);
  d->mtype = H5Tcopy(type);
  H5S_class_t sc = H5Sget_simple_extent_type(space);
  int nd = sc == H5S_SCALAR ? 0 : H5Sget_simple_extent_ndims(space);
  if (sc == H5S_NULL || nd < 0 || nd > ZCK_H5_MAX_DIMS) { st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: dataspace of %d dimensions", d->label, nd); goto done; }
  hsize_t dims[ZCK_H5_MAX_DIMS] = {0};
  if (nd) H5Sget_simple_extent_dims(space, dims, NULL);
  d->info.ndim = nd;
  d->info.numel = 1;
  for (int i = 0; i < nd; i++) {
    d->dims[i] = dims[i];
    d->info.shape[i] = (int64_t)dims[i];
    if (dims[i] > ((uint64_t)1 << 62) || !zck__mul_u64(d->info.numel, dims[i], &d->info.numel)) {
      st = zck__fail(ZCK_ERR_FORMAT, "%s: element count overflows", d->label);
      goto done;
    }
  }
  uint64_t nbytes;
  if (!zck__mul_u64(d->info.numel, d->es, &nbytes)) { st = zck__fail(ZCK_ERR_FORMAT, "%s: size overflows", d->label); goto done; }
  H5D_layout_t lay = H5Pget_layout(dcpl);
  if (lay == H5D_CHUNKED) {
    hsize_t cd[ZCK_H5_MAX_DIMS] = {0};
    if (H5Pget_chunk(dcpl, nd, cd) != nd) { st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: chunk dimensions", d->label); goto done; }
    d->info.chunked = true;
    d->chunk_elems = 1;
    for (int i = 0; i < nd; i++) {
      d->cdims[i] = cd[i];
      d->info.chunk[i] = (int64_t)cd[i];
      if (!cd[i] || !zck__mul_u64(d->chunk_elems, cd[i], &d->chunk_elems) || d->chunk_elems > ((uint64_t)1 << 40)) {
        st = zck__fail(ZCK_ERR_FORMAT, "%s: bad chunk dimensions", d->label);
        goto done;
      }
    }
    uint64_t cb = d->chunk_elems * d->es;
    if (cb >= ((uint64_t)1 << 32)) { st = zck__fail(ZCK_ERR_FORMAT, "%s: chunks of %llu bytes exceed 4 GiB (H-04)", d->label, (unsigned long long)cb); goto done; }
    if (cb > ZCK__H5_MAX_CHUNK_BYTES) { st = zck__fail(ZCK_ERR_LIMIT, "%s: chunks of %llu bytes exceed the 1 GiB limit", d->label, (unsigned long long)cb); goto done; }
  } else if (lay != H5D_CONTIGUOUS && lay != H5D_COMPACT) {
    st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: storage layout %d not supported", d->label, (int)lay);
    goto done;
  }
  int nf = H5Pget_nfilters(dcpl);
  if (nf < 0 || nf > ZCK__H5_MAX_FILTERS) { st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %d filters", d->label, nf); goto done; }
  d->nfilters = nf;
  d->info.zstd_level = -1;
  for (int i = 0; i < nf; i++) {
    unsigned flags = 0, cd[8] = {0}, cfg = 0;
    size_t ncd = 8;
    char name[64] = "";
    H5Z_filter_t id = H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, sizeof name, name, &cfg);
    d->filt_id[i] = (unsigned)id;
    d->filt_flags[i] = flags;
    if (id == ZCK_H5_ZSTD_FILTER) {
      d->info.zstd = true;
      d->info.zstd_flags = flags;
      d->info.zstd_level = ncd > 0 ? (int)cd[0] : -1;
    } else if (!(flags & H5Z_FLAG_OPTIONAL)) {
      /* H-05: never hand out bytes a filter we cannot undo produced */
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: mandatory filter %d (%s) not supported (H-05)", d->label, (int)id, name);
      goto done;
    }
  }
  H5D_fill_value_t fv;
  if (H5Pfill_value_defined(dcpl, &fv) >= 0 && fv == H5D_FILL_VALUE_USER_DEFINED && d->es <= sizeof d->fill)
    H5Pget_fill_value(dcpl, type, d->fill);
  H5Eclear2(H5E_DEFAULT);
  st = zck__h5_attr_str_locked(f, path, "dtype", &attr);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    st = ZCK_OK;
  } else if (st == ZCK_OK) {
    st = zck__h5_dtype_attr(d, attr, stored);
  }
  if (st == ZCK_OK && !d->info.chunked && d->info.numel) {
    /* the checksum zckpt writes for an unfiltered dataset; optional (older files, h5py) */
    zck_status hs = zck__h5_attr_num(f, path, ZCK_H5_XXH3_ATTR, H5T_NATIVE_UINT64, &d->xxh3);
    if (hs == ZCK_OK) d->has_xxh3 = true;
    else if (hs == ZCK_ERR_NOT_FOUND) zck_clear_error();
    else st = hs;
  }
done:
  free(attr);
  if (type >= 0) H5Tclose(type);
  if (space >= 0) H5Sclose(space);
  if (dcpl >= 0) H5Pclose(dcpl);
  zck__h5_unlock();
  if (st != ZCK_OK) {
    zck_h5_dataset_close(d);
    return st;
  }
  *out = d;
  return ZCK_OK;
}

void zck_h5_dataset_close(zck_h5_dataset *d) {
  if (!d) return;
  zck__h5_lock();
  if (d->dset >= 0) H5Dclose(d->dset);
  if (d->mtype >= 0) H5Tclose(d->mtype);
  H5Eclear2(H5E_DEFAULT);
  zck__h5_unlock();
  free(d->label);
  free(d);
}

const zck_h5_dataset_info *zck_h5_dataset_info_of(const zck_h5_dataset *d) { return &d->info; }

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
  if (H5Dget_chunk_storage_size(d->dset, off, &nbytes) < 0) {
    /* the chunk index cannot be read (a damaged B-tree node): not "never written" */
    st = zck__h5_fail(ZCK_ERR_DAMAGED, "%s: damaged: the chunk index cannot be read", what);
    zck__h5_unlock();
    return st;
  }
  if (nbytes == 0) {
    /* never written: the fill value, as HDF5 would return */
    H5Eclear2(H5E_DEFAULT);
    zck__h5_unlock();
    for (size_t i = 0; i < d->chunk_elems; i++) memcpy(out + i * d->es, d->fill, d->es);
    return ZCK_OK;
  }
  if (nbytes >= ((uint64_t)1 << 32) || nbytes > d->f->size) {
    zck__h5_unlock();
    return zck__fail(ZCK_ERR_FORMAT, "%s: stored size %llu exceeds %s (H-04)", what, (unsigned long long)nbytes,
                     nbytes > d->f->size ? "the file" : "4 GiB");
  }
  if (*scratch_cap < nbytes) {
    uint8_t *p = realloc(*scratch, (size_t)nbytes);
    if (!p) {
      zck__h5_unlock();
      return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    }
    *scratch = p;
    *scratch_cap = (size_t)nbytes;
  }
  if (H5Dread_chunk(d->dset, H5P_DEFAULT, off, &mask, *scratch) < 0) st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: read", what);
  zck__h5_unlock();
  if (st != ZCK_OK) return st;
  bool applied = false;
  for (int i = d->nfilters - 1; i >= 0; i--) {
    if (mask & (1u << i)) continue;   /* H-06: this filter was skipped for the chunk */
    if (d->filt_id[i] != ZCK_H5_ZSTD_FILTER || applied)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: filter %u applied; only zstd (32015) is supported (H-05)", what, d->filt_id[i]);
    ZCK_TRY(zck__h5_unzstd(*scratch, (size_t)nbytes, out, raw, what));
    applied = true;
  }
  if (!applied) {
    if (nbytes != raw)
      return zck__fail(ZCK_ERR_FORMAT, "%s: %llu stored bytes, expected %zu (H-03)", what, (unsigned long long)nbytes, raw);
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
  hid_t fs = H5Dget_space(d->dset);
  hsize_t mn = n;
  hid_t ms = H5Screate_simple(1, &mn, NULL);
  if (fs < 0 || ms < 0 || (nd && H5Sselect_hyperslab(fs, H5S_SELECT_SET, s, NULL, c, NULL) < 0) ||
      H5Dread(d->dset, d->mtype, ms, fs, H5P_DEFAULT, r->dst + (flat - r->first) * d->es) < 0)
    st = zck__h5_fail(ZCK_ERR_FORMAT, "%s: read", d->label);
  if (fs >= 0) H5Sclose(fs);
  if (ms >= 0) H5Sclose(ms);
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

zck_status zck_h5_dataset_read(zck_h5_dataset *d, void *dst, uint64_t first, uint64_t count) {
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

static zck_status zck__h5_store_read(void *ctx, void *dst, uint64_t off, uint64_t count) {
  return zck_h5_dataset_read(ctx, dst, off, count);
}

zck_store zck_h5_dataset_store(zck_h5_dataset *d) {
  return zck_store_callback(zck__h5_store_read, NULL, d, d->info.dtype, d->info.numel, d->label);
}
