/* zero.h: ZeRO stages 1, 2 and 3 over a zck_comm, with DeepSpeed's partition math, and the
 * bytes each rank holds for model states.
 *
 * The geometry comes from lib/layout.h: for stage 1/2 one flat group per optimizer param group
 * (params in group order, aligned to 2W, P = M/W elements per rank); for stage 3 per-param
 * ceil(n/W) slots cut into sub-groups (L_s elements per rank). In both cases group g is a flat
 * array of W * part elements whose slice [r*part, (r+1)*part) belongs to rank r.
 *
 * What a rank holds, as DeepSpeed does:
 *   stage 1/2: the whole lp flat (DeepSpeed's bit16 groups) and lp copies of frozen params;
 *   stage 3:   only its lp partition (and its frozen-param fragments);
 *   every stage: its fp32 master, exp_avg, exp_avg_sq and reduced-gradient partitions;
 *   stage 1:   also the full fp32 gradients of the step (they accumulate locally over the
 *              micro-batches and are reduce-scattered once, at the step).
 * Forward and backward never see a whole fp32 model: ze_zero_fetch materialises the fp32
 * values of the few params a module needs (stage 1/2: converted from the local lp flat;
 * stage 3: all-gathered, collective), and ze_zero_reduce_params folds a module's finished
 * gradients into the owners' partitions (stage 2/3) right after its backward.
 *
 * Collectives move at most a bucket at a time (DeepSpeed's keys): reduce_bucket_size
 * elements per gradient reduction, allgather_bucket_size elements per stage-1/2 parameter
 * all-gather. Every reduction sums element by element in rank order (lib/comm), and the
 * division by W happens before the sum (DeepSpeed's average_tensor), so the results are the
 * same bits whatever the bucket sizes and whichever params a call covers.
 *
 * The rank state (fp32, exp_avg, exp_avg_sq, lp partitions) is exactly what a DeepSpeed
 * checkpoint of this rank holds; a checkpoint writer reads those arrays directly.
 */
#ifndef ZE_ZERO_H
#define ZE_ZERO_H

#include "comm.h"
#include "exec.h"
#include "layout.h"
#include "model.h"
#include "optim.h"

#include <stdbool.h>

typedef struct ze_zero_opts {
  int stage;                     /* 1, 2 or 3 */
  uint32_t world;                /* W */
  zck_dtype lp_dtype;            /* ZCK_BF16 or ZCK_F32 */
  uint64_t sub_group_size;       /* stage 3 (DeepSpeed default 1e9) */
  uint64_t reduce_bucket_size;   /* elements per gradient reduction (0: DeepSpeed's 5e8) */
  uint64_t allgather_bucket_size;/* stage 1/2: elements per lp all-gather (0: 5e8) */
} ze_zero_opts;

/* ---- memory accounting: bytes of model states a rank holds, by kind */
typedef enum ze_mem_kind {
  ZE_MEM_LP = 0,        /* 16-bit params: stage 1/2 whole flat + frozen copies; stage 3 partitions */
  ZE_MEM_MASTER,        /* fp32 master partition */
  ZE_MEM_EXP_AVG,
  ZE_MEM_EXP_AVG_SQ,
  ZE_MEM_GRAD,          /* reduced fp32 gradient partition */
  ZE_MEM_GRAD_FULL,     /* stage 1: the step's full fp32 gradients */
  ZE_MEM_PARAMS,        /* transient: fp32 params of the modules in use, all-gather scratch */
  ZE_MEM_GRADS,         /* transient: full gradients of the modules in backward (stage 2/3) */
  ZE_MEM_BUCKETS,       /* transient: reduce / all-gather buckets */
  ZE_MEM_PERSIST,       /* stage 3: fp32 params kept gathered for good
                           (stage3_param_persistence_threshold, zexec.h) */
  ZE_MEM_KINDS
} ze_mem_kind;

typedef struct ze_mem {
  uint64_t cur[ZE_MEM_KINDS];
  uint64_t total;                  /* sum of cur */
  uint64_t peak;                   /* max of total so far */
  uint64_t at_peak[ZE_MEM_KINDS];  /* cur when peak was reached (the first time) */
  uint64_t max[ZE_MEM_KINDS];      /* max of each kind on its own */
} ze_mem;

/* "lp", "fp32 master", ... for reports */
const char *ze_mem_kind_name(ze_mem_kind k);
/* Counts bytes of kind k in or out of m (peak, at_peak and max follow). */
void ze_mem_add(ze_mem *m, ze_mem_kind k, uint64_t bytes);
void ze_mem_sub(ze_mem *m, ze_mem_kind k, uint64_t bytes);

/* Read-only, shared by the ranks. */
typedef struct ze_param_home {
  int8_t where;                  /* 0: none (tied alias), 1: trainable, 2: frozen */
  uint32_t group;                /* stage 3: sub-group of plan->train or plan->frozen */
  uint64_t off;                  /* stage 3: p-slot offset in that sub-group's partition;
                                    stage 1/2 frozen: offset in frozen_full */
} ze_param_home;

typedef struct ze_zero_plan {
  ze_zero_opts o;
  const zck_model *model;     /* the manifest (not owned) */
  uint64_t *numel;            /* [n_params] */
  uint64_t *model_off;        /* [n_params] offset in the fp32 model order (aliases: the owner's) */
  size_t model_numel;
  zck_layout *train;          /* trainable params: stage 1/2 or stage 3 layout */
  zck_layout *frozen;         /* stage 3: frozen params, one sub-group each; else NULL */
  uint32_t *frozen_params;    /* frozen param indices in manifest order */
  size_t n_frozen;
  uint64_t frozen_numel;      /* sum of their numel */
  ze_param_home *home;        /* [n_params] */
} ze_zero_plan;

/* model_off[p] is where param p (its owner, for a tied alias) starts in the model order. */
zck_status ze_zero_plan_build(ze_zero_plan *plan, const zck_model *m, const uint64_t *model_off, size_t model_numel,
                              const ze_zero_opts *o);
void ze_zero_plan_free(ze_zero_plan *plan);

struct ze_dzero;

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
  float *gfull;               /* stage 1: (model_numel) fp32 gradients of the step, model order */
  int64_t step;               /* optimizer steps taken */
  uint64_t lp_version;        /* bumped whenever the 16-bit params change (step, refresh):
                                 what a persistent gathered copy is checked against */
  ze_mem mem;                 /* bytes held (device bytes when dev is set) */
  struct ze_dzero *dev;       /* --device cuda: the arrays above are device memory, or host
                                 memory where offloaded, and the collectives on them use the
                                 device communicator (dzero.h); NULL: all host memory */
} ze_zero_rank;

/* init: the full fp32 initial weights in model order (every rank passes the same). The lp
 * params are init rounded to lp, and the fp32 masters are taken from them (as DeepSpeed does). */
zck_status ze_zero_rank_init(ze_zero_rank *zr, const ze_zero_plan *plan, zck_comm *comm, const float *init);
/* The same state on a device (dzero.h): the values are built on the host a group at a
 * time and copied there. The rank owns dev from the call on (also when it fails). */
zck_status ze_zero_rank_init_dev(ze_zero_rank *zr, const ze_zero_plan *plan, zck_comm *comm, struct ze_dzero *dev,
                                 const float *init);
void ze_zero_rank_free(ze_zero_rank *zr);

/* Accounted allocations (zeroed) of the rank's transient buffers, in its working memory
 * (device memory when dev is set). */
void *ze_zero_alloc(ze_zero_rank *zr, ze_mem_kind k, size_t bytes);
void ze_zero_free(ze_zero_rank *zr, ze_mem_kind k, void *p, size_t bytes);

/* The fp32 values of whole params (manifest indices, no tied aliases), concatenated into
 * dst (host memory) in the order given. Stage 3: collective (every rank passes the same
 * list; one all-gather); stage 1/2: local. */
zck_status ze_zero_fetch(ze_zero_rank *zr, const uint32_t *params, size_t n, float *dst);
/* The same into the rank's working memory (what ze_zero_alloc returns). */
zck_status ze_zero_fetch_work(ze_zero_rank *zr, const uint32_t *params, size_t n, float *dst);
/* The same, param i into dsts[i] (still one all-gather at stage 3). (zfetch.c) */
zck_status ze_zero_fetch_work_to(ze_zero_rank *zr, const uint32_t *params, size_t n, float *const *dsts);
/* Stage 2/3, collective: grads[i] is the full fp32 gradient of params[i] on this rank (frozen
 * params are skipped); each element / W is summed over the ranks and ADDED into its owner's
 * gradient partition (in buckets of reduce_bucket_size elements). */
zck_status ze_zero_reduce_params(ze_zero_rank *zr, const uint32_t *params, size_t n, const float *const *grads);
/* Stage 1, collective, at the last micro-batch of a step: gfull / W summed over the ranks
 * into the gradient partitions (reduce-scatter in buckets); gfull is zeroed. */
zck_status ze_zero_reduce_full(ze_zero_rank *zr);
/* Stage 1/2: all-gathers every rank's lp partition into the local lp flat (collective, in
 * buckets of allgather_bucket_size elements); stage 3: nothing to do. */
zck_status ze_zero_gather(ze_zero_rank *zr);
/* Global L2 norm of the reduced gradients (collective; same value on every rank). */
zck_status ze_zero_grad_norm(ze_zero_rank *zr, double *norm);
/* Multiplies the gradients by clip, runs AdamW on every group (lr and betas/eps from hp,
 * weight decay of the group's manifest "weight_decay"), refreshes lp (collective). */
zck_status ze_zero_step(ze_zero_rank *zr, const ze_adamw_hp *hp, double clip);

/* lp partitions = RNE(fp32 masters), then ze_zero_gather (collective): after the masters
 * were restored. */
zck_status ze_zero_refresh_lp(ze_zero_rank *zr);
/* Waits for the work the rank queued on its device (nothing on the host). */
zck_status ze_zero_sync(ze_zero_rank *zr);
/* A copy-plan store over one of the rank's state arrays (mem, of kind k): memory, or a
 * callback store that copies to and from the device. */
zck_store ze_zero_store(const ze_zero_rank *zr, ze_mem_kind k, void *mem, zck_dtype dt, uint64_t numel,
                        const char *name);
/* Zeroes bytes of one of the rank's state arrays (of kind k). */
zck_status ze_zero_clear(ze_zero_rank *zr, ze_mem_kind k, void *mem, size_t bytes);

/* The weight decay of layout group g (from its optimizer group). */
double ze_zero_group_weight_decay(const ze_zero_plan *plan, size_t g);
/* Elements of layout group g per rank (P or L_s). */
static inline uint64_t ze_zero_part(const ze_zero_plan *plan, size_t g) { return plan->train->groups[g].partition; }
/* The bucket sizes in effect (DeepSpeed's defaults for 0). */
uint64_t ze_zero_reduce_bucket(const ze_zero_plan *plan);
uint64_t ze_zero_allgather_bucket(const ze_zero_plan *plan);

#endif
