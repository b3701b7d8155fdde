/* h5_internal.h: what the HDF5 writer, reader and container code share. */
#ifndef ZCK_H5_INTERNAL_H
#define ZCK_H5_INTERNAL_H

#include <hdf5.h>
#include <zstd.h>

#include "hdf5/zck_h5.h"
#include "util.h"

/* The read-only metadata cache's size (bytes of object headers and index nodes as stored). */
#define ZCK__H5_MDC_BYTES ((size_t)1 << 20)

/* Chunks larger than this are refused (H-04: HDF5's own limit is 4 GiB). */
#define ZCK__H5_MAX_CHUNK_BYTES ((uint64_t)1 << 30)

/* The process-wide HDF5 lock (recursive). zck__h5_lock() also initialises the library
 * once: automatic error printing off, the zstd filter registered. */
void zck__h5_lock(void);
void zck__h5_unlock(void);

/* Fails with status and "<what>: <HDF5's innermost message>", clearing HDF5's error
 * stack. Call with the lock held. An HDF5 write failing with errno ENOSPC/EDQUOT
 * becomes ZCK_ERR_NO_SPACE. */
zck_status zck__h5_fail(zck_status status, const char *fmt, ...) ZCK__PRINTF(2, 3);

/* Opens path read-only as the reader does (the child's walk and the parent alike): with
 * no chunk cache, since chunks are read raw (H5Dread_chunk) and every open dataset would
 * otherwise allocate and clear one, and a metadata cache of ZCK__H5_MDC_BYTES. Lock held. */
hid_t zck__h5_open_ro(const char *path);

/* File type for writing a zckpt dtype (caller H5Tclose()s it); H5I_INVALID_HID with the
 * error set for types HDF5 cannot hold. */
hid_t zck__h5_file_type(zck_dtype t);
/* The zckpt dtype of a stored type, before the `dtype` attribute; INVALID if none. */
zck_dtype zck__h5_dtype_of(hid_t type);

/* Sets a compression context for one chunk: the level and the frame checksum on. Returns
 * a zstd error code or 0. */
size_t zck__h5_zstd_params(ZSTD_CCtx *cc, int level);

/* zstd frame checks of one stored chunk (H-01..H-03): exactly one frame whose header
 * records `expect` bytes of content. Decompresses into out, checking the frame's checksum
 * when it has one (frames written before zckpt added them have none): DAMAGED "<what>:
 * damaged: ..." when it does not match. `what` names the file, dataset and chunk. */
zck_status zck__h5_unzstd(const void *src, size_t n, void *out, size_t expect, const char *what);

/* The digest ZCK_H5_ATTRS_XXH3_ATTR records (zck_h5.h): the sum of XXH3(".", name, value)
 * over the root group's attributes but that one. Lock held. */
zck_status zck__h5_attrs_digest(hid_t file, uint64_t *out);

// ---- the metadata the reader uses, read in a forked child (h5_probe.c, h5_meta.c)

/* fixed-length text attributes this long or longer are refused (ZCK_ERR_LIMIT) */
#define ZCK__H5M_MAX_FIXED_TEXT ((size_t)1 << 24)

/* What the child could answer about one attribute (zck__h5_mattr.flags). */
enum {
  ZCK__H5M_STR = 1,       /* one text value: text, text_len */
  ZCK__H5M_STR_BIG = 2,   /* one fixed-length text of ZCK__H5M_MAX_FIXED_TEXT bytes or more */
  ZCK__H5M_STR_ERR = 4,   /* reading it as text failed: err */
  ZCK__H5M_I64 = 8,       /* one number, as int64: i64 */
  ZCK__H5M_U64 = 16,      /* as uint64: u64 */
  ZCK__H5M_F64 = 32,      /* as double: f64 */
  ZCK__H5M_NUM_ERR = 64,  /* reading it as a number failed: err */
  ZCK__H5M_OPEN_ERR = 128 /* the attribute, its type or its dataspace cannot be opened: err */
};

typedef struct zck__h5_mattr {
  const char *name, *text, *err;
  size_t text_len;
  unsigned flags;
  int cls;          /* H5T_class_t */
  int64_t npoints, i64;
  uint64_t u64;
  double f64;
} zck__h5_mattr;

typedef struct zck__h5_mlink {
  const char *name;
  bool hard;        /* soft and external links are listed, never followed */
  uint64_t addr;
} zck__h5_mlink;

#define ZCK__H5M_MAX_FILTERS 16

typedef struct zck__h5_mfilter {
  unsigned id, flags;
  int level;
  const char *name;
} zck__h5_mfilter;

/* What the child read of a dataset's header: its stored type, dataspace and creation
 * properties, as zck_h5_dataset_open asks for them (the parent decodes none itself). */
typedef struct zck__h5_mdset {
  const char *err;          /* non-NULL: its type, dataspace or properties could not be read */
  int dtype;                /* zck__h5_dtype_of the stored type (0: none) */
  int cls;                  /* H5T_class_t */
  uint64_t size;            /* bytes of one stored element */
  int space_cls;            /* H5S_class_t */
  int ndims;                /* -1: unreadable; dims holds min(ndims, ZCK_H5_MAX_DIMS) */
  uint64_t dims[ZCK_H5_MAX_DIMS];
  int layout;               /* H5D_layout_t */
  int chunk_nd;             /* what H5Pget_chunk returned (chunked only) */
  uint64_t chunk[ZCK_H5_MAX_DIMS];
  const char *chunk_err;    /* "" unless H5Pget_chunk failed */
  int external;             /* H5Pget_external_count */
  int nfilters;             /* H5Pget_nfilters; the first ZCK__H5M_MAX_FILTERS are below */
  const zck__h5_mfilter *filters;   /* min(nfilters, ZCK__H5M_MAX_FILTERS) of them, kept apart
                                       (most datasets have none or one; 300k of them here) */
  uint8_t fill[16];         /* a user-defined fill value's bytes (fill_len of them) */
  size_t fill_len;
} zck__h5_mdset;

typedef struct zck__h5_mobj {
  uint64_t addr;
  int type;                          /* H5O_type_t; -1: the child could not open it (err) */
  const char *err, *attrs_err, *links_err;   /* non-NULL: that walk failed, with this message */
  zck__h5_mattr *attrs;              /* in name order */
  size_t nattrs;
  zck__h5_mlink *links;              /* a group's links, in name order */
  size_t nlinks;
  const zck__h5_mdset *ds;           /* a dataset's header as the child read it; NULL if none */
  bool unread;                       /* an object a lazy walk did not open (type unknown,
                                        nothing read): walk again in full to ask anything */
} zck__h5_mobj;

typedef struct zck__h5_meta zck__h5_meta;

/* Forks a child that opens path with libhdf5 and reads every object reached by hard links,
 * their attributes and links, and the root's attribute digest; appends its records to
 * *records. FORMAT error if the library crashes there (h5_probe.c). With ZCK_H5_NO_PROBE
 * set, walks in this process instead (debugging). lazy: NULL, or the name of a root link
 * below which datasets are only typed (unread objects), groups walked as any other. */
zck_status zck__h5_probe(const char *path, const char *lazy, zck__buf *records);

/* The child's answers for path (zck__h5_probe), kept for the life of the file. */
zck_status zck__h5_meta_load(const char *path, const char *lazy, zck__h5_meta **out);
/* OK when a hard link path leads to an object, read or not (a lazy walk's: nothing of it
 * is checked); NOT_FOUND / FORMAT / UNSUPPORTED with the error set ("FILE:path: ...")
 * otherwise. Never walks again. */
zck_status zck__h5_link_at(zck_h5_file *f, const char *path);
/* whether m holds unread datasets (a lazy walk that found some) */
bool zck__h5_meta_lazy(const zck__h5_meta *m);
/* The datasets reached from the root by hard links (each object once, however many links
 * lead to it), or false when the walk did not see every object (lazy, cut short, or an
 * object or group's links it could not read). */
bool zck__h5_meta_datasets(const zck__h5_meta *m, size_t *n);
/* The same for an open file's walk. */
bool zck__h5_file_datasets(const zck_h5_file *f, size_t *n);
void zck__h5_meta_free(zck__h5_meta *m);
/* false when the child could not open the file at all */
bool zck__h5_meta_opened(const zck__h5_meta *m);
/* The object at path ("/", "/a/b", "a/b"), following hard links from the root. NOT_FOUND
 * (no error set) when a link is missing; otherwise not OK with *why set: FORMAT when a
 * group's links or the object could not be read, UNSUPPORTED for a soft or external link.
 * An unread object (a lazy walk's) on the way is *out, OK: what lies below it is unknown. */
zck_status zck__h5_meta_find(const zck__h5_meta *m, const char *path, const zck__h5_mobj **out, const char **why);
/* The attribute of o named name; NULL if it has none (check o->attrs_err first). */
const zck__h5_mattr *zck__h5_meta_attr(const zck__h5_mobj *o, const char *name);
/* The root's attribute digest (zck__h5_attrs_digest), or false with *why. */
bool zck__h5_meta_digest(const zck__h5_meta *m, uint64_t *out, const char **why);

#endif
