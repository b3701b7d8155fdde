/* h5_edit.h: edits of an HDF5 file through libhdf5 alone, as another tool (h5py) would make
 * them: valid HDF5 with other contents. Single-threaded tests only. */
#ifndef ZCK_H5_EDIT_H
#define ZCK_H5_EDIT_H

#include <hdf5.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5/h5_checksums.h"
#include "hdf5/h5_internal.h"
#include "hdf5/zck_h5.h"
#include "test.h"

static inline hid_t h5e_open(const char *path) {
  zck__h5_lock();   /* the zstd filter registered, so H5Dread / H5Dwrite go through it */
  zck__h5_unlock();
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  if (f < 0) ZT_FAIL("cannot open %s", path);
  return f;
}

/* Makes a container look as one written before the checksum table: no table, its root
 * attributes, nor the root's attribute digest; zckpt_format_version 1. */
static inline void h5e_make_old(hid_t f) {
  if (H5Lexists(f, ZCK__H5C_TABLE, H5P_DEFAULT) > 0) ZT_ASSERT(H5Ldelete(f, ZCK__H5C_TABLE, H5P_DEFAULT) >= 0);
  static const char *const attrs[] = {ZCK__H5C_TABLE_ATTR, ZCK__H5C_PIECE_ATTR, ZCK_H5_ATTRS_XXH3_ATTR};
  for (int i = 0; i < 3; i++)
    if (H5Aexists(f, attrs[i]) > 0) ZT_ASSERT(H5Adelete(f, attrs[i]) >= 0);
  if (H5Aexists(f, "zckpt_format_version") > 0) {
    hid_t a = H5Aopen(f, "zckpt_format_version", H5P_DEFAULT);
    int64_t one = 1;
    ZT_ASSERT(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &one) >= 0);
    H5Aclose(a);
  }
}

/* Swaps two links (h5py's f.move three times). */
static inline void h5e_swap(hid_t f, const char *a, const char *b) {
  ZT_ASSERT(H5Lmove(f, a, f, "/h5e_tmp", H5P_DEFAULT, H5P_DEFAULT) >= 0);
  ZT_ASSERT(H5Lmove(f, b, f, a, H5P_DEFAULT, H5P_DEFAULT) >= 0);
  ZT_ASSERT(H5Lmove(f, "/h5e_tmp", f, b, H5P_DEFAULT, H5P_DEFAULT) >= 0);
}

/* The dataset's elements through HDF5's pipeline (the zstd filter), in its own file type;
 * *n bytes (caller frees). */
static inline void *h5e_read(hid_t d, size_t *n) {
  hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
  hssize_t np = H5Sget_simple_extent_npoints(sp);
  *n = (size_t)np * H5Tget_size(t);
  void *v = calloc(*n ? *n : 1, 1);
  ZT_ASSERT(v && H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  H5Sclose(sp);
  H5Tclose(t);
  return v;
}

/* Adds 1 to the low byte of element `at` of dataset path, in place: the chunk goes back
 * through the zstd filter, a valid frame with a valid checksum. */
static inline void h5e_poke(hid_t f, const char *path, size_t at) {
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  ZT_ASSERT(d >= 0);
  size_t n;
  uint8_t *v = h5e_read(d, &n);
  hid_t t = H5Dget_type(d);
  size_t es = H5Tget_size(t);
  ZT_ASSERT((at + 1) * es <= n);
  v[at * es] ^= 1;
  ZT_ASSERT(H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  H5Tclose(t);
  H5Dclose(d);
  free(v);
}

/* Deletes dataset path and makes it again, contiguous, with other values (each byte + 1),
 * the same type, shape and `dtype` attribute. */
static inline void h5e_remake(hid_t f, const char *path) {
  hid_t d = H5Dopen2(f, path, H5P_DEFAULT);
  ZT_ASSERT(d >= 0);
  size_t n;
  uint8_t *v = h5e_read(d, &n);
  for (size_t i = 0; i < n; i++) v[i]++;
  hid_t t = H5Dget_type(d), sp = H5Dget_space(d);
  char *dt = NULL;
  hid_t a = H5Aopen(d, "dtype", H5P_DEFAULT), at = H5Aget_type(a);
  ZT_ASSERT(a >= 0 && H5Aread(a, at, &dt) >= 0);
  H5Aclose(a);
  H5Dclose(d);
  ZT_ASSERT(H5Ldelete(f, path, H5P_DEFAULT) >= 0);
  d = H5Dcreate2(f, path, t, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ZT_ASSERT(d >= 0 && H5Dwrite(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  hid_t as = H5Screate(H5S_SCALAR);
  a = H5Acreate2(d, "dtype", at, as, H5P_DEFAULT, H5P_DEFAULT);
  ZT_ASSERT(a >= 0 && H5Awrite(a, at, &dt) >= 0);
  H5free_memory(dt);
  H5Aclose(a);
  H5Sclose(as);
  H5Tclose(at);
  H5Dclose(d);
  H5Sclose(sp);
  H5Tclose(t);
  free(v);
}

/* Sets root text attribute key to value (a variable-length UTF-8 string, as the writer
 * makes them) and rewrites the root's attribute digest to match: a tool that edits the
 * root as zck_h5.h asks. */
static inline void h5e_set_root_text(hid_t f, const char *key, const char *value) {
  if (H5Aexists(f, key) > 0) ZT_ASSERT(H5Adelete(f, key) >= 0);
  hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
  ZT_ASSERT(H5Tset_size(t, H5T_VARIABLE) >= 0 && H5Tset_cset(t, H5T_CSET_UTF8) >= 0);
  hid_t a = H5Acreate2(f, key, t, sp, H5P_DEFAULT, H5P_DEFAULT);
  ZT_ASSERT(a >= 0 && H5Awrite(a, t, &value) >= 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  uint64_t sum = 0;
  zck__h5_lock();
  ZT_ASSERT(zck__h5_attrs_digest(f, &sum) == ZCK_OK);
  zck__h5_unlock();
  a = H5Aopen(f, ZCK_H5_ATTRS_XXH3_ATTR, H5P_DEFAULT);
  ZT_ASSERT(a >= 0 && H5Awrite(a, H5T_NATIVE_UINT64, &sum) >= 0);
  H5Aclose(a);
}

#endif
