/* exec_internal.h: what the executor's files share (exec.h is the interface): the state of
 * one run (its batches, the pieces read for verify on read, the workers' staging buffers,
 * the write-order window) and the steps zck__exec_run_here takes, one file each:
 *   exec_check.c    validation before any byte moves
 *   exec_dst_crc.c  the target stores' CRC-32s a job asks for
 *   exec_batch.c    extents cut into batches, ordered by the targets' write order
 *   exec_run.c      a worker's batch: read, convert, write, CRC
 *   exec_store.c    reading and writing one bound store
 *   exec_verify.c   verify on read: record CRCs, XXH3s checked first
 *   exec_hash.c     hashing stores after the fact
 * exec.c runs them in that order; exec_dist.c shares one run among the ranks of mpirun. */
#ifndef ZCK_EXEC_INTERNAL_H
#define ZCK_EXEC_INTERNAL_H

#include "exec.h"

#include <pthread.h>
#include <stdatomic.h>

#include "hash_xxh3.h"

typedef struct batch {
  uint32_t job;
  size_t first, n;       /* extents [first, first + n) of the job's plan */
  uint64_t lo, hi;       /* source element span */
  size_t *order;         /* stream batch: its n extents' indices, by source offset; else NULL */
} batch;

/* What one batch read of a store whose record is checked: absolute bytes and their CRC. */
typedef struct read_piece {
  uint64_t lo, hi;
  uint32_t crc;
  bool set;
} read_piece;

typedef struct job_state {
  uint32_t *ext_crc;     /* per extent, when the job wants CRCs */
  size_t *crc_order;     /* extents sorted by (dst_store, dst_off) */
} job_state;

typedef struct exec_ctx {
  const zck_exec_job *jobs;
  size_t n_jobs;
  job_state *js;
  batch *batches;
  size_t n_batches;
  size_t *order_arena;   /* stream batches' extent lists */
  bool verify;           /* check records and XXH3s (not opts->no_verify) */
  read_piece *pieces;    /* [n_batches] when verify */
  size_t staging, half;
  uint8_t **bufs;        /* [workers], allocated by each worker on first use */
  unsigned n_workers;
  const zck_exec_opts *o;
  atomic_int failed;
  pthread_mutex_t lock;
  uint64_t done, total;  /* bytes written, under lock */
  bool canceled;         /* the progress callback asked to stop, under lock */
  /* batches in their targets' write order (order_batches): a worker starts batch i only
   * within `window` target bytes of the oldest batch not finished, so what is written
   * ahead of a file's hash cursor stays bounded even when hashing is slower than writing */
  uint64_t *start;       /* [n_batches + 1]: target bytes before each batch; NULL: no window */
  uint64_t window;
  uint8_t *finished;     /* [n_batches], under win_lock */
  size_t oldest;         /* the first batch not finished, under win_lock */
  pthread_mutex_t win_lock;
  pthread_cond_t win_cv;
} exec_ctx;

/* ---- store access (exec_store.c) */
/* "NAME" or "<side> store <id>" in buf, for messages. */
const char *zck__store_label(const zck_store *s, char *buf, size_t cap, const char *side, uint32_t id);
/* count elements at element off, in the store's dtype */
zck_status zck__store_read(const zck_store *s, uint32_t id, void *dst, uint64_t off, uint64_t count);
zck_status zck__store_write(const zck_store *s, uint32_t id, const void *src, uint64_t off, uint64_t count);
void zck__store_prefetch(const zck_store *s, uint64_t off, uint64_t count);

/* XXH3 (st may be NULL) and CRC-32 (crc may be NULL) of n bytes (exec_hash.c). */
void zck__hash_sliced(XXH3_state_t *st, uint32_t *crc, const uint8_t *p, size_t n);

/* ---- the steps of one run, in order */
zck_status zck__exec_check_job(const zck_exec_job *j, size_t job, uint64_t *total);
zck_status zck__exec_prepare_crc(const zck_exec_job *j, size_t job, job_state *js);
zck_status zck__exec_verify_xxh3_first(exec_ctx *c);
zck_status zck__exec_make_batches(exec_ctx *c);
zck_status zck__exec_order_batches(exec_ctx *c);
/* the thread pool's work item: batch `item` on worker `thread` */
zck_status zck__exec_run_batch(void *ctx, size_t item, unsigned thread);
zck_status zck__exec_verify_records(exec_ctx *c);
void zck__exec_assemble_crc(const zck_exec_job *j, const job_state *js);

#endif
