/* cuda_internal.h: plain C internals of cuda/ shared by its .c and .cu files and its tests.
 *
 * The cuda-local backend is lib/'s ranks engine (comm_ranks.h) with device ops
 * (comm_device.cu): host threads meet at barriers exactly as in lib/comm_local.c, and the
 * data movement runs kernels on the rank's stream.
 */
#ifndef ZCK_CUDA_INTERNAL_H
#define ZCK_CUDA_INTERNAL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "comm.h"
#include "comm_ranks.h"
#include "zck_cuda.h"

/* cuda-local: ranks per group (the device ops pass pointer arrays of this size by value). */
#define ZCK__RANKS_MAX 64

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
