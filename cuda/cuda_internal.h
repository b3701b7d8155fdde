/* cuda_internal.h: plain C internals of cuda/ shared by its .c and .cu files and its tests.
 *
 * The "ranks" collective engine (comm_ranks.c) is the cuda-local backend with its memory
 * operations pulled out: host threads meet at barriers exactly as in lib/comm_local.c,
 * and the data movement (rank-order reductions, copies) goes through an ops table. The
 * device ops (comm_device.cu) run kernels on the rank's stream; the host ops (here, for
 * tests) run plain loops, so the orchestration is tested on machines without a GPU.
 */
#ifndef ZCK_CUDA_INTERNAL_H
#define ZCK_CUDA_INTERNAL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "comm.h"
#include "zck_cuda.h"

#define ZCK__RANKS_MAX 64

typedef struct zck__ranks_ops {
  /* For i < n: v = op over k = 0..n_src-1 (in that order) of srcs[k][src_off + i]; then
   * dsts[j][dst_off + i] = v for every j < n_dst. Each element is read in full before it is
   * written, so dsts may alias srcs element for element. */
  zck_status (*reduce)(void *ctx, int rank, const void *const *srcs, int n_src, size_t src_off, void *const *dsts,
                       int n_dst, size_t dst_off, size_t n, zck_dtype dt, zck_comm_op op);
  zck_status (*copy)(void *ctx, int rank, void *dst, const void *src, size_t bytes);
  /* Before a rank posts: its earlier work on its buffers is complete. */
  zck_status (*enter)(void *ctx, int rank);
  /* Before a rank leaves: the work it queued in this collective is complete. */
  zck_status (*leave)(void *ctx, int rank);
  void (*destroy)(void *ctx);   /* may be NULL */
} zck__ranks_ops;

/* A group of `size` handles (one thread each), backend name `backend` (static string).
 * ops_ctx is owned by the group (destroy) once this succeeds. */
zck_status zck__ranks_create(int size, const zck__ranks_ops *ops, void *ops_ctx, const char *backend,
                             zck_comm **comms);
void zck__ranks_destroy(zck_comm **comms, int size);
/* The ops context of a ranks group (for set_stream). */
void *zck__ranks_ops_ctx(zck_comm *c);
/* 1 if c belongs to a ranks group. */
int zck__ranks_is(const zck_comm *c);

/* The ranks engine over host memory (reductions as lib/comm_local.c does them). */
zck_status zck__ranks_create_host(int size, zck_comm **comms);

// ---- gather16 pieces shared by the host and GPU paths (gather_plan.c)

/* The sources match the plan's dtypes and sizes. */
zck_status zck__gather_check_srcs(const zck_gather_plan *p, const zck_gather_src *srcs);
/* Hands bucket b's runs, staged at `stage`, to the writer in output order. */
zck_status zck__gather_write_bucket(const zck_gather_plan *p, size_t b, const uint8_t *stage,
                                    zck_gather_write_fn write, void *ctx);

#ifdef __cplusplus
}
#endif
#endif
