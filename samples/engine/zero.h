/* zero.h: ZeRO stages 1, 2 and 3 over a zck_comm, with DeepSpeed's partition math.
 *
 * The geometry comes from lib/layout.h: for stage 1/2 one flat group per optimizer param group
 * (params in group order, aligned to 2W, P = M/W elements per rank); for stage 3 per-param
 * ceil(n/W) slots cut into sub-groups (L_s elements per rank). In both cases group g is a flat
 * array of W * part elements whose slice [r*part, (r+1)*part) belongs to rank r, so one code
 * path serves all stages:
 *
 *   gather  (before forward): lp partition -> all_gather -> lp flat -> fp32 model buffer
 *   reduce  (after backward): model grads / W -> flat (padding 0) -> reduce_scatter -> grad
 *                             partition (stage 1: once per optimizer step, on the gradients
 *                             accumulated locally; stage 2/3: after every micro-batch)
 *   step:   clip, AdamW on this rank's fp32 partition, fp32 -> lp (RNE) partition
 *
 * Stage 1/2 keep the whole lp flat on every rank (DeepSpeed's bit16 groups); stage 3 keeps
 * only the lp partition and gathers into a scratch flat. Frozen params are held whole on
 * every rank in stage 1/2, and partitioned one param per sub-group in stage 3 (DeepSpeed's
 * frozen_param_fragments).
 *
 * The rank state (fp32, exp_avg, exp_avg_sq, lp partitions) is exactly what a DeepSpeed
 * checkpoint of this rank holds; a checkpoint writer reads those arrays directly.
 */
#ifndef ZE_ZERO_H
#define ZE_ZERO_H

#include "comm.h"
#include "layout.h"
#include "model.h"
#include "optim.h"

#include <stdbool.h>

typedef struct ze_zero_opts {
  int stage;                  /* 1, 2 or 3 */
  uint32_t world;             /* W */
  zck_dtype lp_dtype;         /* ZCK_BF16 or ZCK_F32 */
  uint64_t sub_group_size;    /* stage 3 (DeepSpeed default 1e9) */
} ze_zero_opts;

/* Read-only, shared by the ranks. */
typedef struct ze_zero_plan {
  ze_zero_opts o;
  const zck_model *model;     /* the manifest (not owned) */
  uint64_t *numel;            /* [n_params] */
  uint64_t *model_off;        /* [n_params] offset in the fp32 model buffer (aliases: the owner's) */
  size_t model_numel;
  zck_layout *train;          /* trainable params: stage 1/2 or stage 3 layout */
  zck_layout *frozen;         /* stage 3: frozen params, one sub-group each; else NULL */
  uint32_t *frozen_params;    /* frozen param indices in manifest order */
  size_t n_frozen;
  uint64_t frozen_numel;      /* sum of their numel */
  uint64_t max_flat;          /* max over groups of W * part */
} ze_zero_plan;

/* model_off[p] is where param p (its owner, for a tied alias) starts in the model buffer. */
zck_status ze_zero_plan_build(ze_zero_plan *plan, const zck_model *m, const uint64_t *model_off, size_t model_numel,
                              const ze_zero_opts *o);
void ze_zero_plan_free(ze_zero_plan *plan);

/* One rank. */
typedef struct ze_zero_rank {
  const ze_zero_plan *plan;
  zck_comm *comm;
  uint32_t rank;
  size_t n_groups;            /* plan->train->n_groups */
  float **fp32;               /* [g] master partition (part elements, padding included) */
  float **exp_avg, **exp_avg_sq;
  float **grad;               /* [g] reduced gradient partition */
  void **lp;                  /* [g] stage 1/2: the whole lp flat (W * P); stage 3: lp partition (L_s) */
  void **frozen_lp;           /* stage 3: [frozen group] lp partition */
  void *frozen_full;          /* stage 1/2: lp copies of the frozen params, concatenated */
  float *work;                /* (model_numel) fp32 params the forward reads */
  float *gwork;               /* (model_numel) fp32 grads the backward writes */
  float *flat;                /* scratch, max_flat floats */
  void *lp_flat;              /* stage 3 scratch, max_flat lp elements */
  int64_t step;               /* optimizer steps taken */
  size_t state_bytes;         /* bytes of partitioned state held (for reports) */
} ze_zero_rank;

/* init: the full fp32 initial weights in model order (every rank passes the same). The lp
 * params are init rounded to lp, and the fp32 masters are taken from them (as DeepSpeed does). */
zck_status ze_zero_rank_init(ze_zero_rank *zr, const ze_zero_plan *plan, zck_comm *comm, const float *init);
void ze_zero_rank_free(ze_zero_rank *zr);

/* Rebuilds `work` from the lp partitions (collective). */
zck_status ze_zero_gather(ze_zero_rank *zr);
/* After each micro-batch's backward into gwork (collective). `last` marks the last micro-batch
 * of the optimizer step. gwork is zeroed when its content has been consumed. */
zck_status ze_zero_reduce(ze_zero_rank *zr, bool last);
/* Global L2 norm of the reduced gradients (collective; same value on every rank). */
zck_status ze_zero_grad_norm(ze_zero_rank *zr, double *norm);
/* Multiplies the gradients by clip, runs AdamW on every group (lr and betas/eps from hp,
 * weight decay of the group's manifest "weight_decay"), refreshes lp and work (collective). */
zck_status ze_zero_step(ze_zero_rank *zr, const ze_adamw_hp *hp, double clip);

/* The weight decay of layout group g (from its optimizer group). */
double ze_zero_group_weight_decay(const ze_zero_plan *plan, size_t g);
/* Elements of layout group g per rank (P or L_s). */
static inline uint64_t ze_zero_part(const ze_zero_plan *plan, size_t g) { return plan->train->groups[g].partition; }

#endif
