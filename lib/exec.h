/* exec.h: runs copy plans on real bytes, in parallel, in bounded memory.
 *
 * A plan (plan.h) speaks of store ids and element offsets. Executing it binds every store
 * id to a backing with a dtype:
 *   - memory: a host pointer (read or written);
 *   - source: a zck__source (file or memory) region at a base byte offset, read only;
 *   - fd: a file descriptor region at a base byte offset, read with pread, written with
 *     pwrite (an output file from zck__outfile, or any open file);
 *   - callback: read/write functions (device memory, a communicator, ...).
 * Each worker thread owns one staging buffer (staging_bytes, default 8 MiB): it reads a
 * run of source extents (consecutive in one source store, so reads are large and
 * sequential), converts each to the destination dtype with zck_convert (torch-exact
 * rounding) and writes it. Memory use is threads x staging_bytes, never the model size.
 *
 * Before any byte moves, every extent is checked against its stores' numel and every
 * dtype pair against zck_dtype_convertible, so a plan that does not fit its stores fails
 * whole ("NAME: needs elements [a, b) but holds N"), not half-way. During the run the
 * first I/O error wins, stops the other workers and is returned with its message.
 *
 * Target elements no extent writes (padding) are left untouched: create output files
 * with ftruncate (zeros) and zero memory targets first, as DeepSpeed readers expect zeros.
 *
 * Verify on read. A file-backed source store (SOURCE, FD) may carry what its bytes must
 * hash to, set by the describer that made it:
 *   - `record`: the zip record (torch storage) holding the store, with the CRC-32 the zip
 *     directory gives it. The executor CRCs every byte it reads as it reads it (ISA-L),
 *     one CRC per read, assembled per record with crc32_combine. Bytes of a touched record
 *     the plan does not need (padding, the rest of a storage viewed in part) are read
 *     afterwards to complete its CRC; records the plan does not touch are not read.
 *   - `xxh3`: the XXH3-64 of the store's own bytes [base, base + numel * size) (a tensor
 *     range of zckpt-manifest.json). XXH3 needs its bytes in order, so such a store is read
 *     whole, front to back, by one worker, which hands each extent its piece as it passes.
 * A mismatch fails the run with one line, "FILE: record data/3 (what): CRC-32 mismatch
 * (stored 1234abcd, read 99887766)", after which the caller commits nothing.
 * zck_exec_opts.no_verify skips both (--no-verify).
 */
#ifndef ZCK_EXEC_H
#define ZCK_EXEC_H

#include "io.h"
#include "plan.h"

typedef enum zck_store_kind {
  ZCK_STORE_UNBOUND = 0,    /* using it in a plan is an error */
  ZCK_STORE_MEMORY,
  ZCK_STORE_SOURCE,
  ZCK_STORE_FD,
  ZCK_STORE_CALLBACK
} zck_store_kind;

/* Callback stores: element offsets and counts; buffers hold count elements of the
 * store's dtype. Called from worker threads, concurrently for different ranges. */
typedef zck_status (*zck_store_read_fn)(void *ctx, void *dst, uint64_t elem_off, uint64_t count);
typedef zck_status (*zck_store_write_fn)(void *ctx, const void *src, uint64_t elem_off, uint64_t count);

/* The zip record (a torch storage) a source store's bytes lie in, and its CRC-32. Many
 * stores may view one record (stage-1/2 module tensors in one flat buffer): records are
 * matched by source and offset, so each is checked once whatever the number of views. */
typedef struct zck_record_check {
  uint64_t off, size;          /* absolute byte range in the source (file) */
  uint32_t crc32;              /* what the zip directory says */
  const char *what;            /* for messages: "record data/3 (fp32_flat_groups[0])" */
} zck_record_check;

typedef struct zck_store {
  zck_store_kind kind;
  zck_dtype dtype;
  uint64_t numel;              /* elements the backing holds (bounds for every extent) */
  const char *name;            /* for messages: the file (and tensor) it is */
  void *mem;                   /* MEMORY */
  const zck__source *source;   /* SOURCE */
  int fd;                      /* FD */
  uint64_t base;               /* SOURCE, FD: byte offset of element 0 */
  zck_store_read_fn read;      /* CALLBACK */
  zck_store_write_fn write;
  void *ctx;
  /* verify on read (SOURCE and FD stores; see above); NULL / false: nothing expected */
  const zck_record_check *record;
  bool has_xxh3;
  uint64_t xxh3;
  /* target stores, optional: the store's place in the order its writer lays its bytes out,
   * from 1 (0: none). When every extent's target has one, the work runs in that order
   * (target offset next), whatever job it belongs to, so a writer that hashes its files
   * as they are written gets them front to back (frozen params and buffers in their
   * places among the masters rather than after them). */
  uint64_t write_order;
} zck_store;

static inline zck_store zck_store_memory(void *mem, zck_dtype dtype, uint64_t numel, const char *name) {
  zck_store s = {ZCK_STORE_MEMORY, dtype, numel, name, mem, NULL, -1, 0, NULL, NULL, NULL, NULL, false, 0, 0};
  return s;
}
static inline zck_store zck_store_source(const zck__source *src, uint64_t base, zck_dtype dtype,
                                         uint64_t numel, const char *name) {
  zck_store s = {ZCK_STORE_SOURCE, dtype, numel, name ? name : src->name, NULL, src, -1, base, NULL, NULL, NULL,
                 NULL, false, 0, 0};
  return s;
}
static inline zck_store zck_store_fd(int fd, uint64_t base, zck_dtype dtype, uint64_t numel, const char *name) {
  zck_store s = {ZCK_STORE_FD, dtype, numel, name, NULL, NULL, fd, base, NULL, NULL, NULL, NULL, false, 0, 0};
  return s;
}
static inline zck_store zck_store_callback(zck_store_read_fn rd, zck_store_write_fn wr, void *ctx,
                                           zck_dtype dtype, uint64_t numel, const char *name) {
  zck_store s = {ZCK_STORE_CALLBACK, dtype, numel, name, NULL, NULL, -1, 0, rd, wr, ctx, NULL, false, 0, 0};
  return s;
}

/* One plan with its bindings. src[plan->n_src_stores], dst[plan->n_dst_stores]; only the
 * stores the plan uses need to be bound. */
typedef struct zck_exec_job {
  const zck_plan *plan;
  const zck_store *src;
  const zck_store *dst;
  /* optional output, [plan->n_dst_stores]: CRC-32 (zlib) of each used destination
   * store's whole byte range [0, numel * dtype size), counting elements no extent
   * writes as zero bytes (what ftruncate'd files and zeroed memory hold). Assembled from
   * per-extent CRCs with crc32_combine, so no byte is read twice. Requires that the
   * extents writing one store do not overlap (else ZCK_ERR_INVALID_ARG). Stores the plan
   * does not write get the CRC of numel*size zero bytes. */
  uint32_t *dst_crc32;
} zck_exec_job;

/* Called after each finished piece of work, from worker threads but never concurrently
 * (under a lock): bytes written so far and in total, over all jobs. Non-zero stops the
 * run with ZCK_ERR_CANCELED. */
typedef int (*zck_progress_fn)(void *ctx, uint64_t done_bytes, uint64_t total_bytes);

/* Called for every range written, from worker threads, concurrently: the destination
 * store, element range and the bytes as written (destination dtype). Its caller is the
 * distributed run (exec_dist.c: the ranges each rank wrote into a DeepSpeed writer's
 * storages, for their CRCs). Writers that hash their files as written do it in their
 * stores instead (stream_hash.h zck__shash_fd_store, zck__shash_wrap_store), which know
 * the file offset of each byte and see every write whoever runs the copy. */
typedef void (*zck_written_fn)(void *ctx, size_t job, uint32_t dst_store, uint64_t dst_off,
                               uint64_t count, const void *bytes, size_t n_bytes);

typedef struct zck_exec_opts {
  unsigned threads;            /* 0: zck__default_threads() */
  size_t staging_bytes;        /* per thread; 0: ZCK_EXEC_DEFAULT_STAGING; min 64 bytes */
  zck_progress_fn progress;
  void *progress_ctx;
  zck_written_fn written;
  void *written_ctx;
  bool no_verify;              /* ignore the stores' record CRCs and XXH3s (--no-verify) */
  /* Source stores with an XXH3 are checked in a pass of their own before the copy (each
   * read whole, in order, on the thread pool), and the copy then reads them like any
   * other store, in plan order, their record CRCs still checked as it reads. For targets
   * written in an order of their own (a safetensors shard's names) that hash as they are
   * written: a stream in source order would run ahead of their hash cursors without
   * bound. Costs a second read of those stores. */
  bool verify_first;
} zck_exec_opts;

#define ZCK_EXEC_DEFAULT_STAGING ((size_t)8 << 20)
#define ZCK_EXEC_OPTS_INIT {0, 0, NULL, NULL, NULL, NULL, false, false}

/* Runs every job's extents on one thread pool. opts may be NULL. */
zck_status zck_exec_run(const zck_exec_job *jobs, size_t n_jobs, const zck_exec_opts *opts);

/* One plan, one binding. dst_crc32 may be NULL. */
zck_status zck_exec_plan(const zck_plan *plan, const zck_store *src, const zck_store *dst,
                         uint32_t *dst_crc32, const zck_exec_opts *opts);

/* Hash after: reads each store back in full (in order, staged, one store per worker)
 * and computes XXH3-64 (xxh3_out) and/or CRC-32 (crc32_out) of its bytes
 * [0, numel * size). Either output may be NULL. For manifests and verification, where
 * an in-order streaming hash is needed and the copy itself ran out of order. */
zck_status zck_exec_hash_stores(const zck_store *stores, size_t n, const zck_exec_opts *opts,
                                uint64_t *xxh3_out, uint32_t *crc32_out);

/* CRC-32 of n zero bytes, and of a || b given crc(a), crc(b) and len(b): zlib's
 * crc32_combine, exposed so writers can assemble entry CRCs themselves. */
uint32_t zck_crc32_zeros(uint64_t n);
uint32_t zck_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* CRC-32 of data continuing crc, as zlib's crc32(crc, data, n) (any n), with carry-less
 * multiply folding where the CPU has it (crc32.c): writers checksum every byte. */
uint32_t zck_crc32_update(uint32_t crc, const void *data, size_t n);

#endif
