/* h5_write_objects.c: the objects of a file the HDF5 writer fills (h5_write.c): groups,
 * datasets and attributes.
 *
 * A dataset of one chunk (most of a universal container's: a MoE model's biases and norms
 * are 100k tensors of a few bytes) is not created until the commit: its chunk, compressed
 * by the thread that completed it, waits in memory (ZCK__H5_DEFER_BYTES of them at most),
 * and the commit creates those datasets group by group, each written and closed at once.
 * libhdf5's cost is per object (~0.2 ms a dataset created, reopened and written by path):
 * this creates each once, in a group already open, and never reopens it. The groups such
 * a dataset lies in are not made before the commit either (a universal container declares
 * every param's fp32, then every exp_avg, ...: making its group at the first would mean
 * looking it up and opening it again for the others). Groups are created through a stack
 * of the open groups along the last path, so a dataset or group next to the one before
 * costs no lookup from the root. Types, the scalar dataspace and
 * the last creation properties are made once and kept. */
#include "h5_write_internal.h"

#include <stdlib.h>
#include <string.h>

#include "io.h"

static zck_status zck__h5w_attr_on(zck_h5_writer *w, hid_t o, const char *obj, const char *key, hid_t type,
                                   const void *v, bool fresh);

// ---- where objects are

zck_status zck__h5w_loc_of(hid_t obj, zck__h5w_loc *loc) {
#if H5_VERSION_GE(1, 12, 0)
  H5O_info2_t info;
  if (H5Oget_info3(obj, &info, H5O_INFO_BASIC) < 0) return ZCK_ERR_IO;
  *loc = info.token;
#else
  H5O_info_t info;
  if (H5Oget_info2(obj, &info, H5O_INFO_BASIC) < 0) return ZCK_ERR_IO;
  *loc = info.addr;
#endif
  return ZCK_OK;
}

/* The dataset, opened by where its header is. Lock held. */
hid_t zck__h5w_open(const zck__h5w_ds *d) {
#if H5_VERSION_GE(1, 12, 0)
  return H5Oopen_by_token(d->w->file, d->loc);
#else
  return H5Oopen_by_addr(d->w->file, d->loc);
#endif
}

// ---- data of complete chunks

/* Writes a 0-dim dataset's bytes and their XXH3 (contiguous, no filter, so no zstd
 * checksum: ZCK_H5_XXH3_ATTR, which the reader checks). fresh: the dataset was just
 * created (no attribute to replace). Lock held. */
zck_status zck__h5w_put_plain(zck__h5w_ds *d, hid_t dset, const uint8_t *buf, bool fresh) {
  hid_t ftype = zck__h5_file_type(d->dtype);
  zck_status st = ZCK_OK;
  if (ftype < 0 || H5Dwrite(dset, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
    st = zck__h5_fail(ZCK_ERR_IO, "%s: write", d->label);
  if (ftype >= 0) H5Tclose(ftype);
  uint64_t h = zck_xxh3(buf, (size_t)(d->chunk_elems * d->es));
  if (st == ZCK_OK) st = zck__h5w_attr_on(d->w, dset, d->path, ZCK_H5_XXH3_ATTR, H5T_STD_U64LE, &h, fresh);
  return st;
}

/* The bytes of a compact dataset, raw: HDF5 keeps them in its object header, where the
 * default file format has no checksum; the checksum table covers them. Lock held. */
zck_status zck__h5w_put_compact(zck__h5w_ds *d, hid_t dset, const uint8_t *buf) {
  hid_t ftype = zck__h5w_ftype(d->w, d->dtype);
  if (ftype < 0 || H5Dwrite(dset, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
    return zck__h5_fail(ZCK_ERR_IO, "%s: write", d->label);
  return ZCK_OK;
}

zck_status zck__h5w_put_chunk(zck__h5w_ds *d, hid_t dset, uint64_t id, const void *frame, size_t n) {
  hsize_t off[ZCK_H5_MAX_DIMS];
  zck__h5w_chunk_offset(d, id, off);
  if (H5Dwrite_chunk(dset, H5P_DEFAULT, 0, off, n, frame) < 0)
    return zck__h5_fail(ZCK_ERR_IO, "%s: writing chunk %llu", d->label, (unsigned long long)id);
  return ZCK_OK;
}

// ---- groups

/* Closes the open groups at levels keep and deeper. Lock held. */
static void zck__h5w_groups_pop(zck_h5_writer *w, size_t keep) {
  while (w->ng > keep) {
    w->ng--;
    if (w->gh[w->ng] >= 0) H5Gclose(w->gh[w->ng]);
    free(w->gname[w->ng]);
    w->gname[w->ng] = NULL;
  }
}

/* The components of path: start[i], len[i] for i < *nc; of the groups above its last
 * component only unless whole. UNSUPPORTED when they are nested too deep. */
static zck_status zck__h5w_split(const char *path, bool whole, size_t *start, size_t *len, size_t *nc) {
  *nc = 0;
  for (size_t i = 0; path[i];) {
    while (path[i] == '/') i++;
    size_t n = strcspn(path + i, "/");
    if (!n) break;
    if (*nc == ZCK__H5_MAX_DEPTH + 1)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: more than %d nested groups", path, ZCK__H5_MAX_DEPTH);
    start[*nc] = i;
    len[(*nc)++] = n;
    i += n;
  }
  if (!whole && *nc) (*nc)--;
  if (*nc > ZCK__H5_MAX_DEPTH) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: more than %d nested groups", path, ZCK__H5_MAX_DEPTH);
  return ZCK_OK;
}

zck_status zck__h5w_path_check(const char *path) {
  size_t start[ZCK__H5_MAX_DEPTH + 1], len[ZCK__H5_MAX_DEPTH + 1], nc;
  return zck__h5w_split(path, false, start, len, &nc);
}

/* Opens the groups along path, making the missing ones: the whole path, or (whole false)
 * all but its last component. *level: the last one's index in w->gh. The open groups of
 * the path before are kept as far as the two agree. Lock held. */
zck_status zck__h5w_group_at(zck_h5_writer *w, const char *path, bool whole, size_t *level) {
  if (!w->ng) {
    w->gh[0] = H5Gopen2(w->file, "/", H5P_DEFAULT);
    if (w->gh[0] < 0) return zck__h5_fail(ZCK_ERR_IO, "%s: the root group", w->out.path);
    w->ng = 1;
  }
  size_t start[ZCK__H5_MAX_DEPTH + 1], len[ZCK__H5_MAX_DEPTH + 1], nc;
  ZCK_TRY(zck__h5w_split(path, whole, start, len, &nc));
  size_t lv = 1;
  while (lv < w->ng && lv <= nc && strlen(w->gname[lv]) == len[lv - 1] &&
         !memcmp(w->gname[lv], path + start[lv - 1], len[lv - 1]))
    lv++;
  zck__h5w_groups_pop(w, lv);
  for (; lv <= nc; lv++) {
    char *name = zck__strndup(path + start[lv - 1], len[lv - 1]);
    if (!name) return ZCK_ERR_NO_MEMORY;
    int upto = (int)(start[lv - 1] + len[lv - 1]);
    hid_t parent = w->gh[lv - 1];
    /* made first, looked up only when that fails: most groups are new (a container's
     * param groups), and a lookup in a group of 100k names costs as much as the making
     * (libhdf5 checks the name before it makes anything) */
    hid_t g = H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) {
      H5Eclear2(H5E_DEFAULT);
      htri_t ex = H5Lexists(parent, name, H5P_DEFAULT);
      if (ex < 0) {
        free(name);
        return zck__h5_fail(ZCK_ERR_INVALID_ARG, "%.*s: bad HDF5 path", upto, path);
      }
      if (ex) g = H5Gopen2(parent, name, H5P_DEFAULT);
    }
    if (g < 0) {
      free(name);
      return zck__h5_fail(ZCK_ERR_IO, "%.*s: cannot create group", upto, path);
    }
    w->gh[lv] = g;
    w->gname[lv] = name;
    w->ng = lv + 1;
  }
  *level = nc;
  return ZCK_OK;
}

zck_status zck_h5_writer_group(zck_h5_writer *w, const char *path) {
  zck__h5_lock();
  size_t level;
  zck_status st = zck__h5w_group_at(w, path, true, &level);
  zck__h5_unlock();
  return st;
}

// ---- datasets

/* The file type of dtype, made once (the writer closes it); H5I_INVALID_HID with the
 * error set for types HDF5 cannot hold. Lock held. */
hid_t zck__h5w_ftype(zck_h5_writer *w, zck_dtype dtype) {
  if ((int)dtype <= 0 || (int)dtype >= ZCK_DTYPE_COUNT) return zck__h5_file_type(dtype);
  if (w->ftype[dtype] < 0) w->ftype[dtype] = zck__h5_file_type(dtype);
  return w->ftype[dtype];
}

/* The creation properties of d: compact, chunked with the zstd filter, or unchunked. One chunked
 * list is kept and only its chunk shape changed when a dataset's differs from the last
 * one's (a param's states share it; small params' shapes vary, and a fresh list with its
 * filter costs several times the change). Lock held. */
static hid_t zck__h5w_dcpl(zck_h5_writer *w, const zck__h5w_ds *d) {
  if (d->compact) {
    if (w->dcpl_compact < 0 && (w->dcpl_compact = H5Pcreate(H5P_DATASET_CREATE)) >= 0 &&
        (H5Pset_obj_track_times(w->dcpl_compact, 0) < 0 || H5Pset_layout(w->dcpl_compact, H5D_COMPACT) < 0)) {
      H5Pclose(w->dcpl_compact);
      w->dcpl_compact = H5I_INVALID_HID;
    }
    return w->dcpl_compact;
  }
  if (!d->chunked) {
    if (w->dcpl_plain < 0 && (w->dcpl_plain = H5Pcreate(H5P_DATASET_CREATE)) >= 0 &&
        H5Pset_obj_track_times(w->dcpl_plain, 0) < 0) {
      H5Pclose(w->dcpl_plain);
      w->dcpl_plain = H5I_INVALID_HID;
    }
    return w->dcpl_plain;
  }
  hsize_t chunk[ZCK_H5_MAX_DIMS];
  for (int i = 0; i < d->ndim; i++) chunk[i] = i < d->k ? 1 : i == d->k ? d->ck : d->dims[i];
  if (w->dcpl >= 0 && w->dcpl_nd == d->ndim && !memcmp(w->dcpl_chunk, chunk, (size_t)d->ndim * sizeof *chunk))
    return w->dcpl;
  unsigned level = (unsigned)w->level;
  if (w->dcpl < 0 && (w->dcpl = H5Pcreate(H5P_DATASET_CREATE)) >= 0 &&
      (H5Pset_obj_track_times(w->dcpl, 0) < 0 || H5Pset_chunk(w->dcpl, d->ndim, chunk) < 0 ||
       H5Pset_filter(w->dcpl, ZCK_H5_ZSTD_FILTER, H5Z_FLAG_MANDATORY, 1, &level) < 0)) {
    H5Pclose(w->dcpl);
    w->dcpl = H5I_INVALID_HID;
  } else if (w->dcpl >= 0 && H5Pset_chunk(w->dcpl, d->ndim, chunk) < 0) {
    H5Pclose(w->dcpl);
    w->dcpl = H5I_INVALID_HID;
  }
  if (w->dcpl >= 0) {
    w->dcpl_nd = d->ndim;
    memcpy(w->dcpl_chunk, chunk, (size_t)d->ndim * sizeof *chunk);
  }
  return w->dcpl;
}

/* Creates d's dataset in the open group g with its dtype attribute, open in *out. Lock
 * held. */
zck_status zck__h5w_make(zck_h5_writer *w, zck__h5w_ds *d, hid_t g, hid_t *out) {
  *out = H5I_INVALID_HID;
  hid_t ftype = zck__h5w_ftype(w, d->dtype);
  if (ftype < 0) return zck__error_prepend(ZCK_ERR_UNSUPPORTED, "%s", d->label);
  if (w->str_type < 0) {
    w->str_type = H5Tcopy(H5T_C_S1);
    if (w->str_type >= 0 && (H5Tset_size(w->str_type, H5T_VARIABLE) < 0 || H5Tset_cset(w->str_type, H5T_CSET_UTF8) < 0)) {
      H5Tclose(w->str_type);
      w->str_type = H5I_INVALID_HID;
    }
  }
  if (w->scalar < 0) w->scalar = H5Screate(H5S_SCALAR);
  hsize_t dims[ZCK_H5_MAX_DIMS];
  for (int i = 0; i < d->ndim; i++) dims[i] = d->dims[i];
  hid_t space = d->ndim ? H5Screate_simple(d->ndim, dims, NULL) : H5Scopy(w->scalar);
  hid_t dcpl = zck__h5w_dcpl(w, d);
  if (space < 0 || dcpl < 0 || w->str_type < 0 || w->scalar < 0) {
    if (space >= 0) H5Sclose(space);
    return zck__h5_fail(ZCK_ERR_INTERNAL, "%s: dataset properties", d->label);
  }
  const char *base = strrchr(d->path, '/');
  base = base ? base + 1 : d->path;
  hid_t dset = H5Dcreate2(g, base, ftype, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  H5Sclose(space);
  if (dset < 0) return zck__h5_fail(ZCK_ERR_IO, "%s: cannot create dataset", d->label);
  const char *dn = zck_dtype_name(d->dtype);
  zck_status st = zck__h5w_attr_on(w, dset, d->path, "dtype", w->str_type, &dn, true);
  if (st != ZCK_OK) {
    H5Dclose(dset);
    return st;
  }
  *out = dset;
  return ZCK_OK;
}

/* Creates a deferred dataset in the group open as g and writes its chunk if it has come:
 * from now on it is an ordinary dataset. d->mu and the lock held. */
static zck_status zck__h5w_create_deferred(zck__h5w_ds *d, hid_t g) {
  zck_h5_writer *w = d->w;
  int e = zck__io_fault(ZCK_IO_OP_WRITE);
  if (e) return zck__fail_errno(e, "%s: write", d->label);
  hid_t dset;
  zck_status st = zck__h5w_make(w, d, g, &dset);
  if (st != ZCK_OK) return st;
  /* its chunk still to come (an attribute made it early): reopened by where it is */
  if (!d->frame && zck__h5w_loc_of(dset, &d->loc) != ZCK_OK) st = zck__h5_fail(ZCK_ERR_IO, "%s: object info", d->label);
  if (st == ZCK_OK && d->frame)
    st = d->compact   ? zck__h5w_put_compact(d, dset, d->frame)
         : d->chunked ? zck__h5w_put_chunk(d, dset, 0, d->frame, d->frame_len)
                      : zck__h5w_put_plain(d, dset, d->frame, true);
  H5Dclose(dset);
  if (st != ZCK_OK) return st;
  if (d->frame) zck__h5w_write_behind(w, d->frame_len);
  free(d->frame);
  d->frame = NULL;
  d->deferred = false;
  w->deferred_bytes -= d->numel * d->es;   /* its chunk no longer waits: room for later ones */
  d->created = true;
  return ZCK_OK;
}

/* Creates d now, with its groups (an attribute is being written to it before the
 * commit). Lock held. */
static zck_status zck__h5w_materialize(zck__h5w_ds *d) {
  size_t level;
  ZCK_TRY(zck__h5w_group_at(d->w, d->path, false, &level));
  pthread_mutex_lock(&d->mu);
  zck_status st = d->deferred ? zck__h5w_create_deferred(d, d->w->gh[level]) : ZCK_OK;
  pthread_mutex_unlock(&d->mu);
  return st;
}

/* Bytes of path naming its group ("/params/x" of "/params/x/fp32"). */
static size_t zck__h5w_dir_len(const char *path) {
  const char *s = strrchr(path, '/');
  return s ? (size_t)(s - path) : 0;
}

static int zck__h5w_deferred_cmp(const void *a, const void *b) {
  const zck__h5w_ds *x = *(zck__h5w_ds *const *)a, *y = *(zck__h5w_ds *const *)b;
  size_t nx = x->dir_len, ny = y->dir_len;
  int c = memcmp(x->path, y->path, nx < ny ? nx : ny);
  if (c) return c;
  if (nx != ny) return nx < ny ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

/* A deferred dataset the commit (or a settle) makes now. */
static bool zck__h5w_due(const zck__h5w_ds *d, bool complete_only) {
  return d->deferred && (!complete_only || (d->written == d->n_chunks && !d->n_slots));
}

/* The creation of the deferred datasets with their groups, group by group (each group
 * entered, made if missing, once: the writer's stack of open groups keeps it open), in
 * the order they were declared within a group. Lock held. */
zck_status zck__h5w_create_all_deferred(zck_h5_writer *w, bool complete_only) {
  size_t n = 0;
  for (size_t i = 0; i < w->n_ds; i++) n += zck__h5w_due(w->ds[i], complete_only);
  if (!n) return ZCK_OK;
  zck__h5w_ds **v = zck__malloc(n * sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  n = 0;
  for (size_t i = 0; i < w->n_ds; i++)
    if (zck__h5w_due(w->ds[i], complete_only)) {
      v[n] = w->ds[i];
      v[n++]->dir_len = zck__h5w_dir_len(w->ds[i]->path);   /* once, not per comparison */
    }
  qsort(v, n, sizeof *v, zck__h5w_deferred_cmp);
  zck_status st = ZCK_OK;
  size_t level;
  for (size_t i = 0; i < n && st == ZCK_OK; i++) {
    st = zck__h5w_group_at(w, v[i]->path, false, &level);
    if (st == ZCK_OK) st = zck__h5w_create_deferred(v[i], w->gh[level]);
  }
  free(v);
  return st;
}

// ---- attributes

/* Writes attribute key of the open object o (named obj in messages), replacing one of
 * that name unless fresh (o was just created). Lock held. */
static zck_status zck__h5w_attr_on(zck_h5_writer *w, hid_t o, const char *obj, const char *key, hid_t type,
                                   const void *v, bool fresh) {
  zck_status st = ZCK_OK;
  if (!fresh && H5Aexists(o, key) > 0) H5Adelete(o, key);
  if (w->scalar < 0) w->scalar = H5Screate(H5S_SCALAR);
  hid_t a = w->scalar >= 0 ? H5Acreate2(o, key, type, w->scalar, H5P_DEFAULT, H5P_DEFAULT) : H5I_INVALID_HID;
  if (a < 0 || H5Awrite(a, type, v) < 0)
    st = zck__h5_fail(ZCK_ERR_IO, "%s:%s: cannot write attribute %s", w->out.path, obj, key);
  if (a >= 0) H5Aclose(a);
  return st;
}

/* The deferred dataset at path obj, if any. */
static zck__h5w_ds *zck__h5w_deferred_at(zck_h5_writer *w, const char *obj) {
  if (!w->n_deferred) return NULL;
  for (size_t i = 0; i < w->n_ds; i++)
    if (w->ds[i]->deferred && !strcmp(w->ds[i]->path, obj)) return w->ds[i];
  return NULL;
}

/* Whether obj is a group a deferred dataset will be made in (not made yet either). */
static bool zck__h5w_deferred_group(zck_h5_writer *w, const char *obj) {
  if (!w->n_deferred) return false;
  while (*obj == '/') obj++;
  size_t n = strlen(obj);
  while (n && obj[n - 1] == '/') n--;
  for (size_t i = 0; n && i < w->n_ds; i++) {
    const char *p = w->ds[i]->path;
    while (*p == '/') p++;
    if (w->ds[i]->deferred && !strncmp(p, obj, n) && p[n] == '/') return true;
  }
  return false;
}

zck_status zck__h5w_attr(zck_h5_writer *w, const char *obj, const char *key, hid_t type, const void *v) {
  zck_status st = ZCK_OK;
  zck__h5_lock();
  hid_t o = H5Oopen(w->file, obj, H5P_DEFAULT);
  zck__h5w_ds *d = o < 0 ? zck__h5w_deferred_at(w, obj) : NULL;
  if (d) { /* a dataset not made yet: made now */
    H5Eclear2(H5E_DEFAULT);
    st = zck__h5w_materialize(d);
    if (st == ZCK_OK) o = H5Oopen(w->file, obj, H5P_DEFAULT);
  } else if (o < 0 && zck__h5w_deferred_group(w, obj)) { /* a group not made yet: made now */
    size_t level;
    H5Eclear2(H5E_DEFAULT);
    st = zck__h5w_group_at(w, obj, true, &level);
    if (st == ZCK_OK) o = H5Oopen(w->file, obj, H5P_DEFAULT);
  }
  if (st != ZCK_OK) {
    /* said */
  } else if (o < 0) {
    st = zck__h5_fail(ZCK_ERR_NOT_FOUND, "%s:%s: no such object", w->out.path, obj);
  } else {
    st = zck__h5w_attr_on(w, o, obj, key, type, v, false);
    H5Oclose(o);
  }
  zck__h5_unlock();
  return st;
}

zck_status zck_h5_writer_attr_str(zck_h5_writer *w, const char *obj, const char *key, const char *value) {
  zck__h5_lock();
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, H5T_VARIABLE);
  H5Tset_cset(t, H5T_CSET_UTF8);
  zck_status st = zck__h5w_attr(w, obj, key, t, &value);
  H5Tclose(t);
  zck__h5_unlock();
  return st;
}

zck_status zck_h5_writer_attr_i64(zck_h5_writer *w, const char *obj, const char *key, int64_t value) {
  return zck__h5w_attr(w, obj, key, H5T_STD_I64LE, &value);
}

zck_status zck_h5_writer_attr_f64(zck_h5_writer *w, const char *obj, const char *key, double value) {
  return zck__h5w_attr(w, obj, key, H5T_IEEE_F64LE, &value);
}

// ---- closing

/* Closes the ids the writer keeps open besides the file. Lock held. */
void zck__h5w_close_kept(zck_h5_writer *w) {
  zck__h5w_groups_pop(w, 0);
  for (int i = 0; i < ZCK_DTYPE_COUNT; i++) {
    if (w->ftype[i] >= 0) H5Tclose(w->ftype[i]);
    w->ftype[i] = H5I_INVALID_HID;
  }
  if (w->str_type >= 0) H5Tclose(w->str_type);
  if (w->scalar >= 0) H5Sclose(w->scalar);
  if (w->dcpl >= 0) H5Pclose(w->dcpl);
  if (w->dcpl_plain >= 0) H5Pclose(w->dcpl_plain);
  if (w->dcpl_compact >= 0) H5Pclose(w->dcpl_compact);
  w->str_type = w->scalar = w->dcpl = w->dcpl_plain = w->dcpl_compact = H5I_INVALID_HID;
}
