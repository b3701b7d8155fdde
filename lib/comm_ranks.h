/* comm_ranks.h (internal): the collective engine for ranks that are threads of one process,
 * with its memory operations in a table.
 *
 * Host threads meet at barriers (comm_ranks.c); the data movement (rank-order reductions,
 * copies) goes through the ops. lib/comm_local.c is this engine with host ops (plain
 * loops); cuda/'s cuda-local backend is it with device ops (kernels and copies on a
 * per-rank stream), so both reduce in rank order 0..W-1 and give the same bits.
 */
#ifndef ZCK_COMM_RANKS_H
#define ZCK_COMM_RANKS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "comm.h"

typedef struct zck__ranks_ops {
  /* For i < n: v = op over k = 0..n_src-1 (in that order) of srcs[k][src_off + i]; then
   * dsts[j][dst_off + i] = v for every j < n_dst. Each element is read in full before it is
   * written, so dsts may alias srcs element for element. */
  zck_status (*reduce)(void *ctx, int rank, const void *const *srcs, int n_src, size_t src_off, void *const *dsts,
                       int n_dst, size_t dst_off, size_t n, zck_dtype dt, zck_comm_op op);
  zck_status (*copy)(void *ctx, int rank, void *dst, const void *src, size_t bytes);
  /* Before a rank posts: its earlier work on its buffers is complete (may be NULL). */
  zck_status (*enter)(void *ctx, int rank);
  /* Before a rank leaves: the work it queued in this collective is complete (may be NULL). */
  zck_status (*leave)(void *ctx, int rank);
  void (*destroy)(void *ctx);   /* may be NULL */
} zck__ranks_ops;

/* The host ops: reductions as plain loops (16-bit floats summed in float, rounded once),
 * memmove for copies. */
extern const zck__ranks_ops zck__ranks_host_ops;

/* A group of `size` handles (one thread each), backend name `backend` (static string; its
 * messages say "<backend> comm: ..."). ops_ctx is owned by the group (destroy) once this
 * succeeds. */
zck_status zck__ranks_create(int size, const zck__ranks_ops *ops, void *ops_ctx, const char *backend,
                             zck_comm **comms);
void zck__ranks_destroy(zck_comm **comms, int size);   /* NULL is fine */
/* The ops context of a ranks group (for set_stream). */
void *zck__ranks_ops_ctx(zck_comm *c);
/* 1 if c belongs to a ranks group. */
int zck__ranks_is(const zck_comm *c);

#ifdef __cplusplus
}
#endif
#endif
