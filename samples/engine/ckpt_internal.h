/* ckpt_internal.h: the pieces of ckpt.c that the per-rank checkpoint code (ckpt_rank.c)
 * shares with the thread path. */
#ifndef ZE_CKPT_INTERNAL_H
#define ZE_CKPT_INTERNAL_H

#include "ckpt.h"
#include "io.h"
#include "state.h"

typedef struct zck_st_writer zck_st_writer;
typedef struct zck_ds_ckpt zck_ds_ckpt;
typedef struct zck_ds_info zck_ds_info;

/* The param groups' "lr" for a save at `step` (mutates the shared manifest: one caller). */
zck_status ze__ckpt_set_lr(ze_ckpt_tracker *t, int64_t step);
/* The DeepSpeed checkpoint of `step` under root (root/global_step<step>/ and root/latest).
 * only == NULL: every rank's files from t->ranks[] (threads). only: that rank's parts alone
 * (its optimizer-states file, its stage-3 model-states file, rank 0's stage-1/2 model
 * states), the other files left unfilled and no `latest`; lr set beforehand. */
zck_status ze__ckpt_write_deepspeed(ze_ckpt_tracker *t, ze_zero_rank *zr0, const char *root, int64_t step,
                                    ze_zero_rank *only);

/* The stage-3 16-bit model.safetensors: its header and tensor offsets (the same on every
 * rank), and the copy of the partitions (all ranks', or `only`'s) into the open file fd. */
typedef struct ze__g16 {
  zck_st_writer *w;
  uint64_t *numel;
  uint32_t *owners;
  size_t *slot;
  size_t n;
  zck_layout *whole;
} ze__g16;
zck_status ze__g16_init(const ze_ckpt_tracker *t, const char *path, ze__g16 *g);
zck_status ze__g16_fill(const ze_ckpt_tracker *t, const ze__g16 *g, int fd, const char *path, ze_zero_rank *only);
void ze__g16_free(ze__g16 *g);
/* The same file from device partitions (every rank a thread of this process): the bounded
 * on-save gather of zck_cuda.h when the sources are in one device's memory (dckpt.c), the
 * fill above otherwise. */
zck_status ze__g16_gather(const ze_ckpt_tracker *t, const ze__g16 *g, int fd, const char *path);

/* Rank 0's end of a save into od: (per rank: `latest`), config.json, model.safetensors,
 * trainer_state.json, the manifest last, and the commit of od. */
zck_status ze__ckpt_finish(ze_ckpt_tracker *t, ze_zero_rank *zr0, zck__outdir *od, int64_t step, bool per_rank);

zck_status ze__ckpt_check_fits(const ze_ckpt_tracker *t, const zck_ds_ckpt *c, const char *path);
bool ze__ckpt_needs_reshard(const ze_ckpt_tracker *t, const zck_ds_info *in);
zck_status ze__ckpt_reshard_for_run(const ze_ckpt_tracker *t, const char *path, const zck_ds_info *in, char **out);

/* ckpt_state.c: the ranks' memory as a state view (lib/state.h); free with ze__state_free. */
typedef struct ze__state {
  zck_state_view v;
  zck_layout *layouts[3];              /* rank-restricted and frozen_full layouts it owns */
  zck_store *stores[ZCK_STATE_KINDS];  /* its store arrays */
} ze__state;
/* The source of a save or a 16-bit gather: fp32, exp_avg, exp_avg_sq of t->ranks[] (only:
 * that rank's alone, layouts restricted to it); stage 1/2, with zr0: zr0's whole 16-bit
 * flat (LP) and frozen copies (FROZEN); stage 3: the frozen partitions. */
zck_status ze__state_of_ranks(const ze_ckpt_tracker *t, ze_zero_rank *only, ze_zero_rank *zr0, ze__state *s);
/* The target of a resume: zr's own partitions (cleared, so padding reads zero) and frozen
 * params (stage 3 partitions, stage 1/2 frozen_full). */
zck_status ze__state_of_rank_target(ze_zero_rank *zr, ze__state *s);
void ze__state_free(ze__state *s);

/* ckpt_rank.c */
zck_status ze__ckpt_save_per_rank(ze_ckpt_tracker *t, ze_zero_rank *zr, int64_t step);
zck_status ze__ckpt_load_per_process(ze_ckpt_tracker *t, const char *path, ze_ckpt_state *st, zck_comm *comm);
zck_status ze__ckpt_load_best_per_rank(ze_ckpt_tracker *t, ze_zero_rank *zr);

#endif
