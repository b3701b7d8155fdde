/* transfer.h: every job's copy, one set of rules from a source state view into target
 * views (state.h), planned (plan.h) and run on the one executor (exec.h).
 *
 * The rules, in the fixed order the plans run:
 *   1. FP32, EXP_AVG, EXP_AVG_SQ: part to part, for each part the target has (the source
 *      must have it too);
 *   2. LP (16-bit module weights): from the source's LP, or where it has none from its
 *      FP32 (cast RNE); then the frozen params from the source's FROZEN (their saved
 *      16-bit values). Each plan covers only its own params;
 *   3. FROZEN (stage-3 frozen fragments): from the source's FROZEN;
 *   4. buffers: the source's one copy into every buffer part of the target.
 * Parts a target does not have are not written. One thread pool runs every plan of every
 * target; the executor's staging buffers are the only memory that scales with the work.
 */
#ifndef ZCK_TRANSFER_H
#define ZCK_TRANSFER_H

#include "state.h"

typedef struct zck_transfer_opts {
  bool partial;          /* the source covers only some of the target (one rank's memory
                            into a whole checkpoint's files): target elements no source
                            maps are left alone instead of failing */
  zck_exec_opts exec;    /* threads, staging, progress, written hook */
} zck_transfer_opts;
#define ZCK_TRANSFER_OPTS_INIT {false, ZCK_EXEC_OPTS_INIT}

/* Copies src into each of dst[0..n_dst). A target part whose source part is missing fails
 * with ZCK_ERR_NOT_FOUND naming src->name and the part, before any byte moves; so do
 * layouts that disagree (plan.h). opts may be NULL. */
zck_status zck_transfer(const zck_state_view *src, const zck_state_view *dst, size_t n_dst,
                        const zck_transfer_opts *opts);

#endif
