/* h5_write_internal.h: what the HDF5 writer's two halves share: h5_write.c (chunks:
 * assembly, compression, the stores the executor writes, commit) and h5_write_objects.c
 * (the objects in the file: groups, datasets, attributes, the datasets made at the commit). */
#ifndef ZCK_H5_WRITE_INTERNAL_H
#define ZCK_H5_WRITE_INTERNAL_H

#include <pthread.h>

#include "h5_checksums.h"
#include "h5_internal.h"

#define ZCK__H5_DEFAULT_CHUNK ((uint64_t)1 << 20)
/* Pooled buffers kept for reuse, at most this many bytes of them. */
#define ZCK__H5_POOL_BYTES ((size_t)64 << 20)
/* Start writeback after every this many bytes stored. */
#define ZCK__H5_WRITE_BEHIND ((uint64_t)16 << 20)
/* Raw bytes of one-chunk datasets whose creation waits for the commit, at most (later ones
 * are created at once, as bigger datasets are). */
#define ZCK__H5_DEFER_BYTES ((uint64_t)64 << 20)
/* Half the entries of a chunk index node (HDF5's default 32: a 2 KB node for each
 * dataset, 6 KB of a universal container's 9.6 KB per tiny param). */
#define ZCK__H5_ISTORE_K 4
/* Nesting of groups the writer keeps open (deeper paths are refused). */
#define ZCK__H5_MAX_DEPTH 32

/* A compression context with its output buffer. */
typedef struct zck__h5w_zc {
  ZSTD_CCtx *cc;
  uint8_t *z;
  size_t cap;
} zck__h5w_zc;

typedef struct zck__h5w_slot {
  uint64_t id;
  uint8_t *buf;
  uint64_t filled;
} zck__h5w_slot;

/* Where a dataset's object header is: each chunk reopens the dataset by it, not by its
 * path (a lookup through a group of 100k names costs more than the chunk's write). */
#if H5_VERSION_GE(1, 12, 0)
typedef H5O_token_t zck__h5w_loc;
#else
typedef haddr_t zck__h5w_loc;
#endif

typedef struct zck__h5w_ds {
  zck_h5_writer *w;
  char *path;
  zck__h5w_loc loc;
  char *label;             /* "FILE:/path" for messages */
  zck_dtype dtype;
  size_t es;
  int ndim;
  uint64_t dims[ZCK_H5_MAX_DIMS];
  uint64_t numel;
  bool chunked;            /* the writer's chunk geometry (a compact dataset has one chunk) */
  bool compact;            /* stored in the compact layout (zck_h5_write_opts.compact_bytes):
                              raw, in its object header; the checksum table covers it */
  int k;                   /* the dimension chunks cut (earlier dims have chunk 1) */
  uint64_t ck;             /* chunk extent along k */
  uint64_t inner;          /* elements of one index of dim k (product of later dims) */
  uint64_t per_prefix;     /* chunks along dim k: ceil(D[k] / ck) */
  uint64_t chunk_elems;    /* elements of a full chunk */
  uint64_t n_chunks, written;
  /* one-chunk dataset created at the commit with its groups, which are not made before
   * either (mu guards these three): until then its chunk waits in frame (a zstd frame; a
   * 0-dim dataset's raw bytes) */
  bool deferred, created;
  uint8_t *frame;
  size_t frame_len;
  size_t order;            /* deferred: its place in creation order */
  size_t dir_len;          /* deferred, at the commit: bytes of path naming its group */
  zck__h5c_ds sums;        /* its pieces' hashes as written (h5_checksums.h) */
  pthread_mutex_t mu;
  zck__h5w_slot *slots;
  size_t n_slots, cap_slots;
} zck__h5w_ds;

struct zck_h5_writer {
  zck__outfile out;
  bool out_open;
  hid_t file;
  int level;
  uint64_t chunk_bytes;
  uint64_t compact_bytes;
  zck__h5w_ds **ds;
  size_t n_ds, cap_ds;
  pthread_mutex_t pool_mu;  /* the pools and the write-behind count */
  zck__h5w_zc *zc;          /* idle compression contexts */
  size_t n_zc, cap_zc;
  uint8_t **bufs;           /* idle assembly buffers of chunk_bytes */
  size_t n_bufs, cap_bufs;
  uint64_t unsynced;        /* bytes stored since the last writeback start */
  bool committed;
  /* the open groups along the last group path: gh[0] the root, gh[i] its component
   * gname[i] (gname[0] unused) */
  hid_t gh[ZCK__H5_MAX_DEPTH + 1];
  char *gname[ZCK__H5_MAX_DEPTH + 1];
  size_t ng;                /* entries of gh in use (0: not even the root yet) */
  hid_t ftype[ZCK_DTYPE_COUNT];   /* file types by dtype, made on first use */
  hid_t str_type, scalar;   /* the dtype attribute's type, a scalar dataspace */
  hid_t dcpl;               /* chunked datasets' creation properties, the last one's chunk shape */
  int dcpl_nd;
  hsize_t dcpl_chunk[ZCK_H5_MAX_DIMS];
  hid_t dcpl_plain;         /* creation properties of an unchunked dataset */
  hid_t dcpl_compact;       /* of a compact one */
  uint64_t deferred_bytes;
  size_t n_deferred;
  /* the piece hashes of the datasets zck_h5_writer_settle let go of, for the commit's table */
  uint64_t *settled_sums;
  size_t n_settled, cap_settled;
};

// ---- h5_write.c

/* Start writeback after every ZCK__H5_WRITE_BEHIND bytes stored (a hint). */
void zck__h5w_write_behind(zck_h5_writer *w, uint64_t bytes);
/* The dataset offset of chunk id. */
void zck__h5w_chunk_offset(const zck__h5w_ds *d, uint64_t id, hsize_t *off);

// ---- h5_write_objects.c (every one with the lock held)

/* Where the open object obj's header is. */
zck_status zck__h5w_loc_of(hid_t obj, zck__h5w_loc *loc);
/* d's dataset (made), opened by where its header is. */
hid_t zck__h5w_open(const zck__h5w_ds *d);
/* Writes a 0-dim dataset's bytes and their XXH3 attribute; fresh: no attribute to replace. */
zck_status zck__h5w_put_plain(zck__h5w_ds *d, hid_t dset, const uint8_t *buf, bool fresh);
/* Writes a compact dataset's bytes (its one chunk, raw). */
zck_status zck__h5w_put_compact(zck__h5w_ds *d, hid_t dset, const uint8_t *buf);
/* Stores chunk id, a zstd frame of n bytes. */
zck_status zck__h5w_put_chunk(zck__h5w_ds *d, hid_t dset, uint64_t id, const void *frame, size_t n);
/* UNSUPPORTED when path's groups are nested deeper than the writer keeps open. */
zck_status zck__h5w_path_check(const char *path);
/* Opens the groups along path (all but its last component unless whole), making the missing
 * ones; *level: the last one's index in w->gh. */
zck_status zck__h5w_group_at(zck_h5_writer *w, const char *path, bool whole, size_t *level);
/* The file type of dtype, made once; H5I_INVALID_HID with the error set if HDF5 cannot hold it. */
hid_t zck__h5w_ftype(zck_h5_writer *w, zck_dtype dtype);
/* Creates d's dataset in the open group g with its dtype attribute, open in *out. */
zck_status zck__h5w_make(zck_h5_writer *w, zck__h5w_ds *d, hid_t g, hid_t *out);
/* The creation of the datasets waiting for the commit: all of them, or (complete_only)
 * those whose chunk has come (zck_h5_writer_settle). */
zck_status zck__h5w_create_all_deferred(zck_h5_writer *w, bool complete_only);
/* Writes attribute key of object obj (a dataset not made yet is made first). */
zck_status zck__h5w_attr(zck_h5_writer *w, const char *obj, const char *key, hid_t type, const void *v);
/* Closes the ids the writer keeps open besides the file. */
void zck__h5w_close_kept(zck_h5_writer *w);

#endif
