/* h5_write.c: an HDF5 file filled by copy plans from many threads (see zck_h5.h).
 *
 * Each dataset is a callback store. Writes land in per-chunk assembly buffers; the thread
 * whose write completes a chunk compresses it (one zstd frame with its content size) and
 * stores it with H5Dwrite_chunk under the HDF5 lock. Chunks are contiguous runs of the
 * flattening (chunk shape (1, .., 1, c, D[k+1], ..)), so a plan ordered by destination
 * keeps only a few chunks in assembly per thread; a write that covers a whole chunk is
 * compressed straight from the caller's buffer. Assembly buffers and compression
 * contexts with their output buffers are pooled, and the file's writeback is started as
 * chunks are stored, so compressing the rest overlaps the disk and the commit's fsync
 * has little left to wait for.
 *
 * A dataset of one chunk (most of a universal container's: a MoE model's biases and norms
 * are 100k tensors of a few bytes) is not created until the commit: its chunk, compressed
 * by the thread that completed it, waits in memory (ZCK__H5_DEFER_BYTES of them at most),
 * and the commit creates those datasets group by group, each written and closed at once.
 * libhdf5's cost is per object (~0.2 ms a dataset created, reopened and written by
 * path): this creates each once, in a group already open, and never reopens it. Groups
 * are created through a stack of the open groups along the last path, so a dataset or
 * group next to the one before costs no lookup from the root. */
#include "h5_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "io.h"

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
  bool chunked;
  int k;                   /* the dimension chunks cut (earlier dims have chunk 1) */
  uint64_t ck;             /* chunk extent along k */
  uint64_t inner;          /* elements of one index of dim k (product of later dims) */
  uint64_t per_prefix;     /* chunks along dim k: ceil(D[k] / ck) */
  uint64_t chunk_elems;    /* elements of a full chunk */
  uint64_t n_chunks, written;
  /* one-chunk dataset created at the commit (mu guards these three): until then its chunk
   * waits in frame (a zstd frame; a 0-dim dataset's raw bytes) */
  bool deferred, created;
  uint8_t *frame;
  size_t frame_len;
  zck__h5w_loc group;      /* deferred: its group's header */
  size_t order;            /* deferred: its place in creation order */
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
   * gname[i] (gname[0] unused); gloc[i] valid where gloc_ok[i] */
  hid_t gh[ZCK__H5_MAX_DEPTH + 1];
  char *gname[ZCK__H5_MAX_DEPTH + 1];
  zck__h5w_loc gloc[ZCK__H5_MAX_DEPTH + 1];
  bool gloc_ok[ZCK__H5_MAX_DEPTH + 1];
  size_t ng;                /* entries of gh in use (0: not even the root yet) */
  hid_t ftype[ZCK_DTYPE_COUNT];   /* file types by dtype, made on first use */
  hid_t str_type, scalar;   /* the dtype attribute's type, a scalar dataspace */
  hid_t dcpl;               /* the last chunked dataset's creation properties */
  int dcpl_nd;
  hsize_t dcpl_chunk[ZCK_H5_MAX_DIMS];
  hid_t dcpl_plain;         /* creation properties of an unchunked dataset */
  uint64_t deferred_bytes;
  size_t n_deferred;
};

static zck_status zck__h5w_attr_on(zck_h5_writer *w, hid_t o, const char *obj, const char *key, hid_t type,
                                   const void *v, bool fresh);

static zck_status zck__h5w_loc_of(hid_t obj, zck__h5w_loc *loc) {
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
static hid_t zck__h5w_open(const zck__h5w_ds *d) {
#if H5_VERSION_GE(1, 12, 0)
  return H5Oopen_by_token(d->w->file, d->loc);
#else
  return H5Oopen_by_addr(d->w->file, d->loc);
#endif
}

// ---- geometry

/* Chunk of flat element e: its id, the offset inside it and its real element count. */
static void zck__h5w_locate(const zck__h5w_ds *d, uint64_t e, uint64_t *id, uint64_t *within, uint64_t *valid) {
  if (!d->chunked) {
    *id = 0;
    *within = e;
    *valid = d->numel;
    return;
  }
  uint64_t slab = d->dims[d->k] * d->inner;
  uint64_t p = e / slab, r = e % slab, j = r / d->chunk_elems;
  *id = p * d->per_prefix + j;
  *within = r % d->chunk_elems;
  uint64_t rows = d->dims[d->k] - j * d->ck;
  *valid = (rows < d->ck ? rows : d->ck) * d->inner;
}

static void zck__h5w_chunk_offset(const zck__h5w_ds *d, uint64_t id, hsize_t *off) {
  uint64_t p = id / d->per_prefix, j = id % d->per_prefix;
  for (int i = d->ndim - 1; i >= 0; i--) off[i] = 0;
  for (int i = d->k - 1; i >= 0; i--) {
    off[i] = p % d->dims[i];
    p /= d->dims[i];
  }
  off[d->k] = j * d->ck;
}

// ---- pools: compression contexts and assembly buffers

/* A context whose buffer holds cap bytes; false on out of memory. */
static bool zck__h5w_zc_get(zck_h5_writer *w, size_t cap, zck__h5w_zc *out) {
  zck__h5w_zc c = {0};
  pthread_mutex_lock(&w->pool_mu);
  if (w->n_zc) c = w->zc[--w->n_zc];
  pthread_mutex_unlock(&w->pool_mu);
  if (!c.cc && !(c.cc = ZSTD_createCCtx())) return false;
  if (c.cap < cap) {
    free(c.z);
    c.cap = 0;
    if (!(c.z = malloc(cap))) {
      ZSTD_freeCCtx(c.cc);
      return false;
    }
    c.cap = cap;
  }
  *out = c;
  return true;
}

static void zck__h5w_zc_put(zck_h5_writer *w, zck__h5w_zc c) {
  if (c.cap > ZCK__H5_POOL_BYTES / 8) { /* an unusually big chunk size: keep the context only */
    free(c.z);
    c.z = NULL;
    c.cap = 0;
  }
  pthread_mutex_lock(&w->pool_mu);
  if (w->n_zc == w->cap_zc) {
    size_t nc = w->cap_zc ? 2 * w->cap_zc : 16;
    zck__h5w_zc *v = realloc(w->zc, nc * sizeof *v);
    if (v) { w->zc = v; w->cap_zc = nc; }
  }
  bool kept = w->n_zc < w->cap_zc;
  if (kept) w->zc[w->n_zc++] = c;
  pthread_mutex_unlock(&w->pool_mu);
  if (!kept) {
    ZSTD_freeCCtx(c.cc);
    free(c.z);
  }
}

/* An assembly buffer of chunk_bytes (contents undefined). */
static uint8_t *zck__h5w_buf_get(zck_h5_writer *w) {
  uint8_t *b = NULL;
  pthread_mutex_lock(&w->pool_mu);
  if (w->n_bufs) b = w->bufs[--w->n_bufs];
  pthread_mutex_unlock(&w->pool_mu);
  return b ? b : malloc((size_t)w->chunk_bytes);
}

static void zck__h5w_buf_put(zck_h5_writer *w, uint8_t *b) {
  if (!b) return;
  pthread_mutex_lock(&w->pool_mu);
  if (w->n_bufs == w->cap_bufs && (w->n_bufs + 1) * w->chunk_bytes <= ZCK__H5_POOL_BYTES) {
    size_t nc = w->cap_bufs ? 2 * w->cap_bufs : 8;
    uint8_t **v = realloc(w->bufs, nc * sizeof *v);
    if (v) { w->bufs = v; w->cap_bufs = nc; }
  }
  bool kept = w->n_bufs < w->cap_bufs && (w->n_bufs + 1) * w->chunk_bytes <= ZCK__H5_POOL_BYTES;
  if (kept) w->bufs[w->n_bufs++] = b;
  pthread_mutex_unlock(&w->pool_mu);
  if (!kept) free(b);
}

/* After `bytes` more were stored: every ZCK__H5_WRITE_BEHIND bytes, start the writeback
 * of what the file holds so far (a hint; the commit's fsync makes it durable). */
static void zck__h5w_write_behind(zck_h5_writer *w, uint64_t bytes) {
  pthread_mutex_lock(&w->pool_mu);
  w->unsynced += bytes;
  bool kick = w->unsynced >= ZCK__H5_WRITE_BEHIND;
  if (kick) w->unsynced = 0;
  pthread_mutex_unlock(&w->pool_mu);
  if (kick) (void)sync_file_range(w->out.fd, 0, 0, SYNC_FILE_RANGE_WRITE);
}

// ---- writing a complete chunk

/* Writes a 0-dim dataset's bytes and their XXH3 (contiguous, no filter, so no zstd
 * checksum: ZCK_H5_XXH3_ATTR, which the reader checks). fresh: the dataset was just
 * created (no attribute to replace). Lock held. */
static zck_status zck__h5w_put_plain(zck__h5w_ds *d, hid_t dset, const uint8_t *buf, bool fresh) {
  hid_t ftype = zck__h5_file_type(d->dtype);
  zck_status st = ZCK_OK;
  if (ftype < 0 || H5Dwrite(dset, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) < 0)
    st = zck__h5_fail(ZCK_ERR_IO, "%s: write", d->label);
  if (ftype >= 0) H5Tclose(ftype);
  uint64_t h = zck_xxh3(buf, (size_t)(d->chunk_elems * d->es));
  if (st == ZCK_OK) st = zck__h5w_attr_on(d->w, dset, d->path, ZCK_H5_XXH3_ATTR, H5T_STD_U64LE, &h, fresh);
  return st;
}

static zck_status zck__h5w_put_chunk(zck__h5w_ds *d, hid_t dset, uint64_t id, const void *frame, size_t n) {
  hsize_t off[ZCK_H5_MAX_DIMS];
  zck__h5w_chunk_offset(d, id, off);
  if (H5Dwrite_chunk(dset, H5P_DEFAULT, 0, off, n, frame) < 0)
    return zck__h5_fail(ZCK_ERR_IO, "%s: writing chunk %llu", d->label, (unsigned long long)id);
  return ZCK_OK;
}

/* A deferred dataset keeps its complete chunk for the commit: true when it took it
 * (*st says whether the copy failed). */
static bool zck__h5w_keep(zck__h5w_ds *d, const void *bytes, size_t n, zck_status *st) {
  *st = ZCK_OK;
  pthread_mutex_lock(&d->mu);
  bool keep = d->deferred;
  if (keep) {
    d->frame = malloc(n ? n : 1);
    if (d->frame) {
      memcpy(d->frame, bytes, n);
      d->frame_len = n;
    } else {
      *st = zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory keeping a chunk", d->label);
    }
  }
  pthread_mutex_unlock(&d->mu);
  return keep;
}

static zck_status zck__h5w_flush(zck__h5w_ds *d, uint64_t id, const uint8_t *buf) {
  zck_h5_writer *w = d->w;
  size_t raw = (size_t)(d->chunk_elems * d->es);
  zck_status st = ZCK_OK;
  if (!d->chunked) { /* a 0-dim tensor */
    if (zck__h5w_keep(d, buf, raw, &st)) return st;
    zck__h5_lock();
    int e = zck__io_fault(ZCK_IO_OP_WRITE);
    hid_t dset = e ? H5I_INVALID_HID : zck__h5w_open(d);
    if (e) st = zck__fail_errno(e, "%s: write", d->label);
    else if (dset < 0) st = zck__h5_fail(ZCK_ERR_IO, "%s: write", d->label);
    else st = zck__h5w_put_plain(d, dset, buf, false);
    if (dset >= 0) H5Oclose(dset);
    zck__h5_unlock();
    return st;
  }
  zck__h5w_zc zc;
  if (!zck__h5w_zc_get(w, ZSTD_compressBound(raw), &zc))
    return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory compressing a chunk", d->label);
  /* One-shot: the frame header records the content size (§3.2). Every chunk is a frame,
   * even one that does not shrink, and every frame ends with its XXH64 checksum, so a
   * damaged chunk fails to decompress (here and in hdf5plugin). */
  size_t n = zck__h5_zstd_params(zc.cc, w->level);
  if (!ZSTD_isError(n)) n = ZSTD_compress2(zc.cc, zc.z, zc.cap, buf, raw);
  if (ZSTD_isError(n)) {
    zck__h5w_zc_put(w, zc);
    return zck__fail(ZCK_ERR_INTERNAL, "%s: zstd: %s", d->label, ZSTD_getErrorName(n));
  }
  if (zck__h5w_keep(d, zc.z, n, &st)) {
    zck__h5w_zc_put(w, zc);
    return st;
  }
  zck__h5_lock();
  int e = zck__io_fault(ZCK_IO_OP_WRITE);
  /* opened per chunk: an open dataset holds tens of KB of library state, and a universal
   * file of 100k params has 300k datasets (the open costs little next to compressing) */
  hid_t dset = e ? H5I_INVALID_HID : zck__h5w_open(d);
  if (e) st = zck__fail_errno(e, "%s: writing chunk %llu", d->label, (unsigned long long)id);
  else if (dset < 0) st = zck__h5_fail(ZCK_ERR_IO, "%s: writing chunk %llu", d->label, (unsigned long long)id);
  else st = zck__h5w_put_chunk(d, dset, id, zc.z, n);
  if (dset >= 0) H5Oclose(dset);
  zck__h5_unlock();
  zck__h5w_zc_put(w, zc);
  if (st == ZCK_OK) zck__h5w_write_behind(w, n);
  return st;
}

static zck_status zck__h5w_store_write(void *ctx, const void *src, uint64_t off, uint64_t count) {
  zck__h5w_ds *d = ctx;
  const uint8_t *s = src;
  while (count) {
    uint64_t id, within, valid;
    zck__h5w_locate(d, off, &id, &within, &valid);
    uint64_t take = valid - within < count ? valid - within : count;
    pthread_mutex_lock(&d->mu);
    zck__h5w_slot *sl = NULL;
    for (size_t i = 0; i < d->n_slots; i++)
      if (d->slots[i].id == id) { sl = &d->slots[i]; break; }
    if (!sl && d->chunked && within == 0 && take == d->chunk_elems) {
      /* the whole chunk in one write: compress it from the caller's bytes */
      d->written++;
      pthread_mutex_unlock(&d->mu);
      ZCK_TRY(zck__h5w_flush(d, id, s));
      s += take * d->es;
      off += take;
      count -= take;
      continue;
    }
    if (!sl) {
      if (d->n_slots == d->cap_slots) {
        size_t nc = d->cap_slots ? 2 * d->cap_slots : 8;
        zck__h5w_slot *v = realloc(d->slots, nc * sizeof *v);
        if (!v) { pthread_mutex_unlock(&d->mu); return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory"); }
        d->slots = v;
        d->cap_slots = nc;
      }
      uint8_t *buf = d->chunked ? zck__h5w_buf_get(d->w) : calloc(d->chunk_elems ? d->chunk_elems : 1, d->es);
      if (!buf) { pthread_mutex_unlock(&d->mu); return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory"); }
      /* zeros beyond the edge of the dataset */
      if (d->chunked && valid < d->chunk_elems) memset(buf + valid * d->es, 0, (size_t)((d->chunk_elems - valid) * d->es));
      sl = &d->slots[d->n_slots++];
      *sl = (zck__h5w_slot){id, buf, 0};
    }
    uint8_t *buf = sl->buf;
    pthread_mutex_unlock(&d->mu);
    memcpy(buf + within * d->es, s, (size_t)(take * d->es));
    pthread_mutex_lock(&d->mu);
    bool done = false, over = false;
    for (size_t i = 0; i < d->n_slots; i++) {
      if (d->slots[i].id != id) continue;
      d->slots[i].filled += take;
      over = d->slots[i].filled > valid;
      done = d->slots[i].filled == valid;
      if (done) d->slots[i] = d->slots[--d->n_slots];
      break;
    }
    if (done) d->written++;
    pthread_mutex_unlock(&d->mu);
    if (over) return zck__fail(ZCK_ERR_INTERNAL, "%s: chunk %llu written twice", d->label, (unsigned long long)id);
    if (done) {
      zck_status st = zck__h5w_flush(d, id, buf);
      if (d->chunked) zck__h5w_buf_put(d->w, buf);
      else free(buf);
      if (st != ZCK_OK) return st;
    }
    s += take * d->es;
    off += take;
    count -= take;
  }
  return ZCK_OK;
}

// ---- creation

zck_status zck_h5_writer_create(const char *path, const zck_h5_write_opts *o, zck_h5_writer **out) {
  *out = NULL;
  zck_h5_write_opts opts = ZCK_H5_WRITE_OPTS_INIT;
  if (o) opts = *o;
  if (opts.level < 0 || opts.level > ZSTD_maxCLevel())
    return zck__fail(ZCK_ERR_INVALID_ARG, "zstd level %d outside 1..%d", opts.level, ZSTD_maxCLevel());
  struct stat sb;
  if (!opts.overwrite && lstat(path, &sb) == 0)
    return zck__fail(ZCK_ERR_EXISTS, "%s: exists (use --overwrite to replace it)", path);
  zck_h5_writer *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  w->file = w->str_type = w->scalar = w->dcpl = w->dcpl_plain = H5I_INVALID_HID;
  for (int i = 0; i < ZCK_DTYPE_COUNT; i++) w->ftype[i] = H5I_INVALID_HID;
  w->level = opts.level ? opts.level : 3;
  w->chunk_bytes = opts.chunk_bytes ? opts.chunk_bytes : ZCK__H5_DEFAULT_CHUNK;
  if (w->chunk_bytes > ZCK__H5_MAX_CHUNK_BYTES) w->chunk_bytes = ZCK__H5_MAX_CHUNK_BYTES;
  pthread_mutex_init(&w->pool_mu, NULL);
  zck_status st = zck__outfile_create(&w->out, path);
  if (st != ZCK_OK) {
    zck_h5_writer_free(w);
    return st;
  }
  w->out_open = true;
  zck__h5_lock();
  /* the temporary file exists (empty); HDF5 opens it by name and truncates it. Strong
   * close degree: closing the file closes whatever object is still open in it. The file
   * format stays at the library's default (earliest) bounds, as the HDF5 spec recipe asks,
   * so older h5py/HDF5 builds open it; the 1.10 format would checksum HDF5's own metadata
   * too, but the data is covered without it: every chunk is a zstd frame with its checksum,
   * 0-dim datasets carry an XXH3 attribute and the root attributes a digest.
   * The chunk index B-tree nodes hold 2 * ZCK__H5_ISTORE_K chunks instead of 64: every
   * dataset gets a whole node, and most are one chunk (a superblock of version 1 records
   * the value; HDF5 1.6 and later read it). */
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), fcpl = H5Pcreate(H5P_FILE_CREATE);
  if (fapl < 0 || fcpl < 0 || H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) < 0 ||
      H5Pset_istore_k(fcpl, ZCK__H5_ISTORE_K) < 0)
    st = zck__h5_fail(ZCK_ERR_INTERNAL, "%s: file properties", path);
  if (st == ZCK_OK && (w->file = H5Fcreate(w->out.tmp_path, H5F_ACC_TRUNC, fcpl, fapl)) < 0)
    st = zck__h5_fail(ZCK_ERR_IO, "%s: cannot create", path);
  if (fapl >= 0) H5Pclose(fapl);
  if (fcpl >= 0) H5Pclose(fcpl);
  zck__h5_unlock();
  if (st != ZCK_OK) {
    zck_h5_writer_free(w);
    return st;
  }
  *out = w;
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

/* Opens the groups along path, making the missing ones: the whole path, or (whole false)
 * all but its last component. *level: the last one's index in w->gh. The open groups of
 * the path before are kept as far as the two agree. Lock held. */
static zck_status zck__h5w_group_at(zck_h5_writer *w, const char *path, bool whole, size_t *level) {
  if (!w->ng) {
    w->gh[0] = H5Gopen2(w->file, "/", H5P_DEFAULT);
    if (w->gh[0] < 0) return zck__h5_fail(ZCK_ERR_IO, "%s: the root group", w->out.path);
    w->gloc_ok[0] = false;
    w->ng = 1;
  }
  size_t start[ZCK__H5_MAX_DEPTH + 1], len[ZCK__H5_MAX_DEPTH + 1], nc = 0;
  for (size_t i = 0; path[i];) {
    while (path[i] == '/') i++;
    size_t n = strcspn(path + i, "/");
    if (!n) break;
    if (nc == ZCK__H5_MAX_DEPTH + 1)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: more than %d nested groups", path, ZCK__H5_MAX_DEPTH);
    start[nc] = i;
    len[nc++] = n;
    i += n;
  }
  if (!whole && nc) nc--;
  if (nc > ZCK__H5_MAX_DEPTH) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: more than %d nested groups", path, ZCK__H5_MAX_DEPTH);
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
    htri_t ex = H5Lexists(parent, name, H5P_DEFAULT);
    if (ex < 0) {
      free(name);
      return zck__h5_fail(ZCK_ERR_INVALID_ARG, "%.*s: bad HDF5 path", upto, path);
    }
    hid_t g = ex ? H5Gopen2(parent, name, H5P_DEFAULT) : H5Gcreate2(parent, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) {
      free(name);
      return zck__h5_fail(ZCK_ERR_IO, "%.*s: cannot create group", upto, path);
    }
    w->gh[lv] = g;
    w->gname[lv] = name;
    w->gloc_ok[lv] = false;
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

static void zck__h5w_ds_free(zck__h5w_ds *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n_slots; i++) free(d->slots[i].buf);   /* malloc'd either way */
  free(d->slots);
  free(d->frame);
  pthread_mutex_destroy(&d->mu);
  free(d->path);
  free(d->label);
  free(d);
}

/* Picks the chunk shape (1, .., 1, ck, D[k+1], ..): the first dim k whose trailing
 * product fits the target, as many of its indices as fit. */
static void zck__h5w_chunking(zck__h5w_ds *d, uint64_t target_elems) {
  uint64_t inner = 1;   /* product of the dims after k */
  int k = d->ndim - 1;
  while (k > 0 && inner * d->dims[k] <= target_elems) {
    inner *= d->dims[k];
    k--;
  }
  d->k = k;
  d->inner = inner;
  uint64_t ck = target_elems / inner;
  if (ck < 1) ck = 1;
  if (ck > d->dims[k]) ck = d->dims[k];
  d->ck = ck;
  d->per_prefix = zck__ceil_div(d->dims[k], ck);
  d->chunk_elems = ck * inner;
  uint64_t prefixes = 1;
  for (int i = 0; i < k; i++) prefixes *= d->dims[i];
  d->n_chunks = prefixes * d->per_prefix;
}

/* The file type of dtype, made once (the writer closes it); H5I_INVALID_HID with the
 * error set for types HDF5 cannot hold. Lock held. */
static hid_t zck__h5w_ftype(zck_h5_writer *w, zck_dtype dtype) {
  if ((int)dtype <= 0 || (int)dtype >= ZCK_DTYPE_COUNT) return zck__h5_file_type(dtype);
  if (w->ftype[dtype] < 0) w->ftype[dtype] = zck__h5_file_type(dtype);
  return w->ftype[dtype];
}

/* The creation properties of d: chunked with the zstd filter (the last chunk shape's are
 * kept: a param's states share it), or unchunked. Lock held. */
static hid_t zck__h5w_dcpl(zck_h5_writer *w, const zck__h5w_ds *d) {
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
  if (w->dcpl >= 0) H5Pclose(w->dcpl);
  unsigned level = (unsigned)w->level;
  w->dcpl = H5Pcreate(H5P_DATASET_CREATE);
  if (w->dcpl >= 0 && (H5Pset_obj_track_times(w->dcpl, 0) < 0 || H5Pset_chunk(w->dcpl, d->ndim, chunk) < 0 ||
                       H5Pset_filter(w->dcpl, ZCK_H5_ZSTD_FILTER, H5Z_FLAG_MANDATORY, 1, &level) < 0)) {
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
static zck_status zck__h5w_make(zck_h5_writer *w, zck__h5w_ds *d, hid_t g, hid_t *out) {
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

/* Opens the object whose header is at loc. Lock held. */
static hid_t zck__h5w_open_at(zck_h5_writer *w, zck__h5w_loc loc) {
#if H5_VERSION_GE(1, 12, 0)
  return H5Oopen_by_token(w->file, loc);
#else
  return H5Oopen_by_addr(w->file, loc);
#endif
}

static bool zck__h5w_loc_eq(const zck__h5w_loc *a, const zck__h5w_loc *b) { return !memcmp(a, b, sizeof *a); }

/* Creates a deferred dataset in the group open as g and writes its chunk if it has come:
 * from now on it is an ordinary dataset. d->mu and the lock held. */
static zck_status zck__h5w_create_deferred(zck__h5w_ds *d, hid_t g) {
  zck_h5_writer *w = d->w;
  int e = zck__io_fault(ZCK_IO_OP_WRITE);
  if (e) return zck__fail_errno(e, "%s: write", d->label);
  hid_t dset;
  zck_status st = zck__h5w_make(w, d, g, &dset);
  if (st != ZCK_OK) return st;
  st = zck__h5w_loc_of(dset, &d->loc);
  if (st != ZCK_OK) st = zck__h5_fail(ZCK_ERR_IO, "%s: object info", d->label);
  if (st == ZCK_OK && d->frame)
    st = d->chunked ? zck__h5w_put_chunk(d, dset, 0, d->frame, d->frame_len) : zck__h5w_put_plain(d, dset, d->frame, true);
  H5Dclose(dset);
  if (st != ZCK_OK) return st;
  if (d->frame) zck__h5w_write_behind(w, d->frame_len);
  free(d->frame);
  d->frame = NULL;
  d->deferred = false;
  d->created = true;
  return ZCK_OK;
}

/* Creates d now (an attribute is being written to it before the commit). Lock held. */
static zck_status zck__h5w_materialize(zck__h5w_ds *d) {
  hid_t g = zck__h5w_open_at(d->w, d->group);
  if (g < 0) return zck__h5_fail(ZCK_ERR_IO, "%s: opening its group", d->label);
  pthread_mutex_lock(&d->mu);
  zck_status st = d->deferred ? zck__h5w_create_deferred(d, g) : ZCK_OK;
  pthread_mutex_unlock(&d->mu);
  H5Oclose(g);
  return st;
}

static int zck__h5w_deferred_cmp(const void *a, const void *b) {
  const zck__h5w_ds *x = *(zck__h5w_ds *const *)a, *y = *(zck__h5w_ds *const *)b;
  int c = memcmp(&x->group, &y->group, sizeof x->group);
  if (c) return c;
  return x->order < y->order ? -1 : x->order > y->order;
}

/* The commit's creation of the deferred datasets, group by group (each group opened once),
 * in the order they were declared within a group. Lock held. */
static zck_status zck__h5w_create_all_deferred(zck_h5_writer *w) {
  size_t n = 0;
  for (size_t i = 0; i < w->n_ds; i++) n += w->ds[i]->deferred;
  if (!n) return ZCK_OK;
  zck__h5w_ds **v = zck__malloc(n * sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  n = 0;
  for (size_t i = 0; i < w->n_ds; i++)
    if (w->ds[i]->deferred) v[n++] = w->ds[i];
  qsort(v, n, sizeof *v, zck__h5w_deferred_cmp);
  zck_status st = ZCK_OK;
  hid_t g = H5I_INVALID_HID;
  for (size_t i = 0; i < n && st == ZCK_OK; i++) {
    if (g < 0 || !zck__h5w_loc_eq(&v[i]->group, &v[i - 1]->group)) {
      if (g >= 0) H5Oclose(g);
      g = zck__h5w_open_at(w, v[i]->group);
      if (g < 0) {
        st = zck__h5_fail(ZCK_ERR_IO, "%s: opening its group", v[i]->label);
        break;
      }
    }
    st = zck__h5w_create_deferred(v[i], g);
  }
  if (g >= 0) H5Oclose(g);
  free(v);
  return st;
}

zck_status zck_h5_writer_dataset(zck_h5_writer *w, const char *path, zck_dtype dtype, int ndim,
                                 const int64_t *shape, zck_store *store) {
  if (ndim < 0 || ndim > ZCK_H5_MAX_DIMS) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %d dimensions", path, ndim);
  zck__h5w_ds *d = zck__calloc(1, sizeof *d);
  if (!d) return ZCK_ERR_NO_MEMORY;
  pthread_mutex_init(&d->mu, NULL);
  d->w = w;
  d->dtype = dtype;
  d->es = zck_dtype_size(dtype);
  d->ndim = ndim;
  d->numel = 1;
  for (int i = 0; i < ndim; i++) {
    d->dims[i] = (uint64_t)shape[i];
    d->numel *= d->dims[i];
  }
  d->path = zck__strdup(path);
  d->label = zck__sprintf("%s:%s", w->out.path, path);
  if (!d->path || !d->label) {
    zck__h5w_ds_free(d);
    return ZCK_ERR_NO_MEMORY;
  }
  d->chunked = ndim > 0 && d->numel > 0;
  if (d->chunked) {
    zck__h5w_chunking(d, w->chunk_bytes / d->es ? w->chunk_bytes / d->es : 1);
  } else {
    d->chunk_elems = d->numel;
    d->n_chunks = d->numel ? 1 : 0;
  }
  zck_status st = ZCK_OK;
  zck__h5_lock();
  size_t level = 0;
  uint64_t raw = d->numel * d->es;
  if (zck__h5w_ftype(w, dtype) < 0) st = zck__error_prepend(ZCK_ERR_UNSUPPORTED, "%s", d->label);
  if (st == ZCK_OK) st = zck__h5w_group_at(w, path, false, &level);
  if (st == ZCK_OK && d->n_chunks == 1 && raw <= ZCK__H5_DEFER_BYTES - w->deferred_bytes) {
    /* one chunk: made at the commit, in its group (see the top) */
    if (!w->gloc_ok[level] && zck__h5w_loc_of(w->gh[level], &w->gloc[level]) != ZCK_OK)
      st = zck__h5_fail(ZCK_ERR_IO, "%s: group info", d->label);
    w->gloc_ok[level] = st == ZCK_OK;
    if (st == ZCK_OK) {
      d->group = w->gloc[level];
      d->deferred = true;
      d->order = w->n_deferred++;
      w->deferred_bytes += raw;
    }
  } else if (st == ZCK_OK) {
    /* closed at once, reopened for each chunk (see zck__h5w_flush) */
    hid_t dset;
    st = zck__h5w_make(w, d, w->gh[level], &dset);
    if (st == ZCK_OK && zck__h5w_loc_of(dset, &d->loc) != ZCK_OK) st = zck__h5_fail(ZCK_ERR_IO, "%s: object info", d->label);
    if (dset >= 0) H5Dclose(dset);
    d->created = st == ZCK_OK;
  }
  zck__h5_unlock();
  if (st == ZCK_OK && w->n_ds == w->cap_ds) {
    size_t nc = w->cap_ds ? 2 * w->cap_ds : 64;
    zck__h5w_ds **v = zck__realloc(w->ds, nc * sizeof *v);
    if (!v) st = ZCK_ERR_NO_MEMORY;
    else { w->ds = v; w->cap_ds = nc; }
  }
  if (st != ZCK_OK) {
    if (d->deferred) w->deferred_bytes -= raw;
    zck__h5_lock();
    zck__h5w_ds_free(d);
    zck__h5_unlock();
    return st;
  }
  w->ds[w->n_ds++] = d;
  *store = zck_store_callback(NULL, zck__h5w_store_write, d, dtype, d->numel, d->label);
  return ZCK_OK;
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

static zck_status zck__h5w_attr(zck_h5_writer *w, const char *obj, const char *key, hid_t type, const void *v) {
  zck_status st = ZCK_OK;
  zck__h5_lock();
  hid_t o = H5Oopen(w->file, obj, H5P_DEFAULT);
  zck__h5w_ds *d = o < 0 ? zck__h5w_deferred_at(w, obj) : NULL;
  if (d) { /* a dataset not made yet: made now */
    H5Eclear2(H5E_DEFAULT);
    st = zck__h5w_materialize(d);
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
static void zck__h5w_close_kept(zck_h5_writer *w) {
  zck__h5w_groups_pop(w, 0);
  for (int i = 0; i < ZCK_DTYPE_COUNT; i++) {
    if (w->ftype[i] >= 0) H5Tclose(w->ftype[i]);
    w->ftype[i] = H5I_INVALID_HID;
  }
  if (w->str_type >= 0) H5Tclose(w->str_type);
  if (w->scalar >= 0) H5Sclose(w->scalar);
  if (w->dcpl >= 0) H5Pclose(w->dcpl);
  if (w->dcpl_plain >= 0) H5Pclose(w->dcpl_plain);
  w->str_type = w->scalar = w->dcpl = w->dcpl_plain = H5I_INVALID_HID;
}

/* Closes the datasets and the file of a writer that is being given up, never leaving an
 * HDF5 id open. Why not a plain H5Fclose: closing flushes HDF5's dirty metadata, and when
 * that write fails (a full disk) HDF5 1.10 keeps the half-destroyed file id, which its
 * atexit H5close (or any later close) then flushes and closes again, crashing. So the file's descriptor is first
 * pointed at an anonymous memory file (dup2 over the descriptor H5Fget_vfd_handle gives):
 * whatever HDF5 still writes lands there and is thrown away with it, and the close
 * succeeds. The temporary file itself is removed by zck__outfile_abort. Lock held. */
static void zck__h5w_discard(zck_h5_writer *w) {
  if (w->file >= 0) {
    int *fdp = NULL;
    if (H5Fget_vfd_handle(w->file, H5P_DEFAULT, (void **)&fdp) >= 0 && fdp && *fdp >= 0) {
      int sink = memfd_create("zck-h5-discard", MFD_CLOEXEC);
      if (sink >= 0) {
        (void)dup2(sink, *fdp);
        close(sink);
      }
    }
  }
  for (size_t i = 0; i < w->n_ds; i++) zck__h5w_ds_free(w->ds[i]);
  w->n_ds = 0;
  zck__h5w_close_kept(w);
  if (w->file >= 0) {
    /* Should it still fail (a flush that failed before the swap leaves HDF5 1.10's
     * metadata cache unable to flush again), the id is left alone: closing it a second
     * time crashes, and the library's exit clean-up is off (zck__h5_init). */
    (void)H5Fclose(w->file);
    w->file = H5I_INVALID_HID;
  }
  H5Eclear2(H5E_DEFAULT);
}

// ---- commit

/* Bytes reserved past the file's end of allocation before the final flush (HDF5 1.10
 * with the default properties allocates nothing at close; this is a margin). */
#define ZCK__H5_CLOSE_SLACK ((off_t)4 << 10)

/* Reserves (fallocate, keeping the file size) the blocks the final flush will write. A
 * file system without fallocate is let through. Lock held. */
static zck_status zck__h5w_reserve(zck_h5_writer *w) {
  hsize_t size = 0;
  if (H5Fget_filesize(w->file, &size) < 0) return zck__h5_fail(ZCK_ERR_IO, "%s: file size", w->out.path);
  int e = zck__io_fault(ZCK_IO_OP_WRITE);
  if (!e && fallocate(w->out.fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)size + ZCK__H5_CLOSE_SLACK) != 0) e = errno;
  if (!e || e == EOPNOTSUPP || e == ENOSYS) return ZCK_OK;
  return zck__fail_errno(e, "%s: writing", w->out.path);
}

zck_status zck_h5_writer_commit(zck_h5_writer *w) {
  zck_status st = ZCK_OK;
  for (size_t i = 0; i < w->n_ds && st == ZCK_OK; i++) {
    zck__h5w_ds *d = w->ds[i];
    if (d->n_slots || d->written != d->n_chunks)
      st = zck__fail(ZCK_ERR_INTERNAL, "%s: %llu of %llu chunks written", d->label, (unsigned long long)d->written,
                     (unsigned long long)d->n_chunks);
  }
  if (st != ZCK_OK) return st;
  zck__h5_lock();
  st = zck__h5w_create_all_deferred(w);
  /* the root attributes' digest (zck_h5.h), once they are all written */
  uint64_t digest = 0;
  if (st == ZCK_OK) st = zck__h5_attrs_digest(w->file, &digest);
  if (st != ZCK_OK) st = zck__error_prepend(st, "%s", w->out.path);
  if (st == ZCK_OK) st = zck__h5w_attr(w, "/", ZCK_H5_ATTRS_XXH3_ATTR, H5T_STD_U64LE, &digest);
  /* HDF5 cannot recover from a failed flush of its metadata (zck__h5w_discard), so the
   * disk blocks the flush and close will write are reserved first: every byte up to the
   * file's end of allocation, and a little more for what the close itself allocates. A
   * full disk fails here, before HDF5 writes anything. */
  if (st == ZCK_OK) st = zck__h5w_reserve(w);
  if (st == ZCK_OK && H5Fflush(w->file, H5F_SCOPE_GLOBAL) < 0) st = zck__h5_fail(ZCK_ERR_IO, "%s: writing", w->out.path);
  if (st == ZCK_OK) {
    for (size_t i = 0; i < w->n_ds; i++) zck__h5w_ds_free(w->ds[i]);
    w->n_ds = 0;
    zck__h5w_close_kept(w);
    herr_t r = H5Fclose(w->file);
    w->file = H5I_INVALID_HID;   /* never closed twice, even when this failed (see discard) */
    if (r < 0) {
      st = zck__h5_fail(ZCK_ERR_IO, "%s: closing", w->out.path);
    } else {
      /* give back the reserved blocks past the end: a shrinking truncate frees them */
      struct stat sb;
      if (fstat(w->out.fd, &sb) == 0 && ftruncate(w->out.fd, sb.st_size + 1) == 0 &&
          ftruncate(w->out.fd, sb.st_size) != 0)
        st = zck__fail_errno(errno, "%s: truncate", w->out.path);
    }
  }
  if (st != ZCK_OK) zck__h5w_discard(w);
  zck__h5_unlock();
  char *final = st == ZCK_OK ? zck__strdup(w->out.path) : NULL;
  if (st == ZCK_OK && !final) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) {
    st = zck__outfile_commit(&w->out);
    /* a failed commit has already undone itself (the earlier file back, or none): the
     * name may hold an earlier output, so it is not ours to unlink */
  }
  free(final);
  if (st == ZCK_OK) {
    w->committed = true;
    w->out_open = false;
  }
  return st;
}

void zck_h5_writer_free(zck_h5_writer *w) {
  if (!w) return;
  zck__h5_lock();
  zck__h5w_discard(w);
  zck__h5_unlock();
  if (w->out_open) zck__outfile_abort(&w->out);
  for (size_t i = 0; i < w->n_zc; i++) {
    ZSTD_freeCCtx(w->zc[i].cc);
    free(w->zc[i].z);
  }
  free(w->zc);
  for (size_t i = 0; i < w->n_bufs; i++) free(w->bufs[i]);
  free(w->bufs);
  free(w->ds);
  pthread_mutex_destroy(&w->pool_mu);
  free(w);
}
