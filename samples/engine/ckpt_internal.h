/* ckpt_internal.h: the engine's hooks of the saver (ckpt.c) and what they are made of. */
#ifndef ZE_CKPT_INTERNAL_H
#define ZE_CKPT_INTERNAL_H

#include "ckpt.h"
#include "state.h"

/* ckpt_state.c: the ranks' memory as a state view (lib/state.h); free with ze__state_free. */
typedef struct ze__state {
  zck_state_view v;
  zck_layout *layouts[3];              /* rank-restricted and frozen_full layouts it owns */
  zck_store *stores[ZCK_STATE_KINDS];  /* its store arrays */
} ze__state;
/* The source of a save or a 16-bit gather: fp32, exp_avg, exp_avg_sq of ranks[] (only:
 * that rank's alone, layouts restricted to it); stage 1/2, with zr0: zr0's whole 16-bit
 * flat (LP) and frozen copies (FROZEN); stage 3: the frozen partitions. */
zck_status ze__state_of_ranks(const ze_zero_plan *plan, ze_zero_rank *const *ranks, ze_zero_rank *only,
                              ze_zero_rank *zr0, ze__state *s);
/* The target of a resume: zr's own partitions (cleared, so padding reads zero) and frozen
 * params (stage 3 partitions, stage 1/2 frozen_full). */
zck_status ze__state_of_rank_target(ze_zero_rank *zr, ze__state *s);
void ze__state_free(ze__state *s);

/* ckpt_snapshot.c: an async save's host copy of a rank's state (the saver's snapshot hook):
 * taken into *slot (allocated at the first call, reused after), by the rank's thread. */
zck_status ze__snapshot_take(ze__snapshot **slot, ze_zero_rank *zr);
/* The allocation alone (done by take when not done before). */
zck_status ze__snapshot_prepare(ze__snapshot **slot, ze_zero_rank *zr);
/* The copy as a rank the describe hooks read (host memory). */
ze_zero_rank *ze__snapshot_rank(ze__snapshot *sn);
size_t ze__snapshot_bytes(const ze__snapshot *sn);
/* Frees its page-locked staging buffers (with the device's ops): before the rank's device
 * goes. The host copy stays (the writer may still read it). */
void ze__snapshot_release(ze__snapshot *sn);
void ze__snapshot_free(ze__snapshot *sn);

/* dckpt.c: the saver's gather16 hook (saver.h) for ZeRO state on devices. */
zck_status ze__g16_gather(void *ctx, void *const *ranks, const uint64_t *param_dst_off, zck_saver_write_fn write,
                          void *wctx);

#endif
