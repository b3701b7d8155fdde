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
 * The objects in the file (groups, datasets, attributes) are made in h5_write_objects.c;
 * a dataset of one chunk is made at the commit, its chunk kept until then (see there). */
#include "h5_write_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "io.h"

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

void zck__h5w_chunk_offset(const zck__h5w_ds *d, uint64_t id, hsize_t *off) {
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
void zck__h5w_write_behind(zck_h5_writer *w, uint64_t bytes) {
  pthread_mutex_lock(&w->pool_mu);
  w->unsynced += bytes;
  bool kick = w->unsynced >= ZCK__H5_WRITE_BEHIND;
  if (kick) w->unsynced = 0;
  pthread_mutex_unlock(&w->pool_mu);
  if (kick) (void)sync_file_range(w->out.fd, 0, 0, SYNC_FILE_RANGE_WRITE);
}

// ---- writing a complete chunk

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
  zck__h5c_writer_chunk(&d->sums, id, buf, d->es);
  if (!d->chunked || d->compact) { /* a 0-dim tensor, or one stored in its header: raw */
    if (zck__h5w_keep(d, buf, raw, &st)) return st;
    zck__h5_lock();
    int e = zck__io_fault(ZCK_IO_OP_WRITE);
    hid_t dset = e ? H5I_INVALID_HID : zck__h5w_open(d);
    if (e) st = zck__fail_errno(e, "%s: write", d->label);
    else if (dset < 0) st = zck__h5_fail(ZCK_ERR_IO, "%s: write", d->label);
    else st = d->compact ? zck__h5w_put_compact(d, dset, buf) : zck__h5w_put_plain(d, dset, buf, false);
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
  if (opts.compact_bytes > ZCK_H5_COMPACT_MAX)
    return zck__fail(ZCK_ERR_INVALID_ARG, "compact datasets of up to %llu bytes: more than the %llu HDF5 allows",
                     (unsigned long long)opts.compact_bytes, (unsigned long long)ZCK_H5_COMPACT_MAX);
  struct stat sb;
  if (!opts.overwrite && lstat(path, &sb) == 0)
    return zck__fail(ZCK_ERR_EXISTS, "%s: exists (use --overwrite to replace it)", path);
  zck_h5_writer *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  w->file = w->str_type = w->scalar = w->dcpl = w->dcpl_plain = w->dcpl_compact = H5I_INVALID_HID;
  for (int i = 0; i < ZCK_DTYPE_COUNT; i++) w->ftype[i] = H5I_INVALID_HID;
  w->level = opts.level ? opts.level : 3;
  w->chunk_bytes = opts.chunk_bytes ? opts.chunk_bytes : ZCK__H5_DEFAULT_CHUNK;
  if (w->chunk_bytes > ZCK__H5_MAX_CHUNK_BYTES) w->chunk_bytes = ZCK__H5_MAX_CHUNK_BYTES;
  w->compact_bytes = opts.compact_bytes;
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

// ---- datasets

static void zck__h5w_ds_free(zck__h5w_ds *d) {
  if (!d) return;
  for (size_t i = 0; i < d->n_slots; i++) free(d->slots[i].buf);   /* malloc'd either way */
  free(d->slots);
  free(d->frame);
  free(d->sums.sums);
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
    d->compact = d->n_chunks == 1 && d->numel * d->es <= w->compact_bytes;
  } else {
    d->chunk_elems = d->numel;
    d->n_chunks = d->numel ? 1 : 0;
  }
  zck_status st = ZCK_OK;
  if (strcmp(path, ZCK__H5C_TABLE))
    st = zck__h5c_writer_ds(d->label, &d->sums, path, dtype, ndim, d->dims, w->chunk_bytes, d->chunked, d->chunk_elems,
                            d->n_chunks);
  zck__h5_lock();
  size_t level = 0;
  uint64_t raw = d->numel * d->es;
  if (zck__h5w_ftype(w, dtype) < 0) st = zck__error_prepend(ZCK_ERR_UNSUPPORTED, "%s", d->label);
  bool defer = d->n_chunks == 1 && raw <= ZCK__H5_DEFER_BYTES - w->deferred_bytes;
  if (st == ZCK_OK && defer) {
    /* one chunk: made at the commit with its groups, group by group (see
     * h5_write_objects.c); nothing in the file yet */
    st = zck__h5w_path_check(path);
    if (st == ZCK_OK) {
      d->deferred = true;
      d->order = w->n_deferred++;
      w->deferred_bytes += raw;
    }
  } else if (st == ZCK_OK && (st = zck__h5w_group_at(w, path, false, &level)) == ZCK_OK) {
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

// ---- closing

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

// ---- settling a batch

/* Keeps d's piece hashes for the commit's table and frees d. */
static zck_status zck__h5w_settle_one(zck_h5_writer *w, zck__h5w_ds *d) {
  size_t n = d->sums.on ? (size_t)d->sums.g.n : 0;
  if (w->n_settled + n > w->cap_settled) {
    size_t nc = w->cap_settled ? 2 * w->cap_settled : 1024;
    while (nc < w->n_settled + n) nc *= 2;
    uint64_t *v = zck__realloc(w->settled_sums, nc * sizeof *v);
    if (!v) return ZCK_ERR_NO_MEMORY;
    w->settled_sums = v;
    w->cap_settled = nc;
  }
  if (n) memcpy(w->settled_sums + w->n_settled, d->sums.sums, n * sizeof *d->sums.sums);
  w->n_settled += n;
  zck__h5w_ds_free(d);
  return ZCK_OK;
}

static zck_status zck__h5w_settle_here(zck_h5_writer *w) {
  zck__h5_lock();
  /* made as the commit makes them, group by group: a batch's params' states together */
  zck_status st = zck__h5w_create_all_deferred(w, true);
  if (st != ZCK_OK) st = zck__error_prepend(st, "%s", w->out.path);
  size_t kept = 0;
  for (size_t i = 0; i < w->n_ds; i++) {
    zck__h5w_ds *d = w->ds[i];
    bool done = st == ZCK_OK && d->created && !d->deferred && d->written == d->n_chunks && !d->n_slots &&
                strcmp(d->path, ZCK__H5C_TABLE);
    if (done && (st = zck__h5w_settle_one(w, d)) == ZCK_OK) continue;
    w->ds[kept++] = d;   /* not done, or its checksums could not be kept: still the writer's to free */
  }
  w->n_ds = kept;
  zck__h5_unlock();
  return st;
}

typedef struct zck__h5w_settler {
  zck_h5_writer *w;
  zck_status st;
  char message[1024];   /* its thread's zck_last_error() */
} zck__h5w_settler;

static void *zck__h5w_settle_main(void *arg) {
  zck__h5w_settler *s = arg;
  s->st = zck__h5w_settle_here(s->w);
  if (s->st != ZCK_OK) snprintf(s->message, sizeof s->message, "%s", zck_last_error());
  return NULL;
}

/* libhdf5 makes and frees several small blocks per object it creates. On a thread of its
 * own, glibc serves them from that thread's arena (the same one for every settle: a
 * finished thread's arena goes to the next), which the caller's heap does not fragment: a
 * job's heap holds hundreds of MB of a reader's tables with holes between them, and in it
 * libhdf5 took ~20% more CPU (h5_floor with such a heap beside it, 100k params). Where no
 * thread can be started, it runs here. */
zck_status zck_h5_writer_settle(zck_h5_writer *w) {
  zck__h5w_settler s = {w, ZCK_OK, {0}};
  pthread_t t;
  if (pthread_create(&t, NULL, zck__h5w_settle_main, &s) != 0) return zck__h5w_settle_here(w);
  pthread_join(t, NULL);
  if (s.st != ZCK_OK) return zck__fail(s.st, "%s", s.message);
  return ZCK_OK;
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
  /* the checksum table of every piece written, before the root's attribute digest */
  if (st == ZCK_OK) {
    zck__h5c_ds **sums = zck__malloc((w->n_ds ? w->n_ds : 1) * sizeof *sums);
    if (!sums) return ZCK_ERR_NO_MEMORY;
    for (size_t i = 0; i < w->n_ds; i++) sums[i] = &w->ds[i]->sums;
    st = zck__h5c_writer_table(w, sums, w->n_ds, w->settled_sums, w->n_settled, w->chunk_bytes);
    free(sums);
  }
  if (st != ZCK_OK) return st;
  zck__h5_lock();
  st = zck__h5w_create_all_deferred(w, false);
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
  free(w->settled_sums);
  pthread_mutex_destroy(&w->pool_mu);
  free(w);
}
