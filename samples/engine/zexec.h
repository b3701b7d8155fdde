/* zexec.h: GPT-2 forward and backward on a ZeRO rank, one module at a time, as DeepSpeed
 * runs a model under ZeRO.
 *
 * Modules (gpt2.h): -1 embeddings, 0..L-1 blocks, L final LayerNorm + tied lm_head.
 *  - Parameters: a module's fp32 weights exist only while it runs. Stage 1/2 convert them from
 *    the rank's lp flat (and free them after, keeping the final module across the turn from
 *    forward to backward); stage 3 all-gathers them just before use (forward -1, 0, .., L,
 *    then backward L, .., 0; the planned order is the trace DeepSpeed records, used from the
 *    first step on). Stage 3 prefetches the modules that come next while the elements
 *    fetched ahead stay under stage3_prefetch_bucket_size (a module is taken whole, so the
 *    last one may overshoot, as DeepSpeed's per-param check does) and the gathered elements
 *    under stage3_max_live_parameters.
 *  - Stage 3 residency is per tensor (each gathered tensor has its own buffer; one module's
 *    missing tensors come in one all-gather), so DeepSpeed's per-parameter rules apply as
 *    they are: a tensor of numel <= stage3_param_persistence_threshold (taken in model
 *    order while their total stays <= stage3_model_persistence_threshold) is persistent:
 *    gathered at its first use, never released, gathered again in place at its first use
 *    after the 16-bit params changed (DeepSpeed re-gathers them after each step); counted as
 *    ZE_MEM_PERSIST. When a module is released, a tensor that a module within
 *    stage3_max_reuse_distance elements of the trace uses again stays gathered (DeepSpeed's
 *    __params_to_release: the modules after the current one are walked, adding each
 *    module's numel, until the sum reaches the distance). Everything not persistent is
 *    released at the end of a pass.
 *  - overlap_comm (device state with a comm stream, dzero.h): a stage-3 gather (on demand
 *    or prefetch) is issued on the comm stream, the prefetch of the next modules before the
 *    current module computes, and the compute stream waits for a gather's event just before
 *    the module that needs it; stage 2/3 gradient reductions are issued on the comm stream
 *    after the module's backward (waiting for it there), and the module gradient buffers are
 *    freed on that stream behind them; the comm stream is drained at the end of each pass,
 *    before anything reads the gradient partitions. Without a device (the CPU backend) or
 *    without overlap_comm every collective runs in the rank's own thread, one after the
 *    other: a prefetch moves the gather earlier but does not overlap it with compute.
 *  - Gradients: stage 1 adds every micro-batch into the rank's full fp32 gradient buffer and
 *    reduce-scatters it at the step; stage 2/3 give each module a zeroed gradient buffer and
 *    reduce it into the owners' partitions as soon as its backward is done (wte after the
 *    embedding backward, its last use), then free it.
 * The arithmetic is the whole-model forward/backward's, so losses and checkpoints are the
 * same bits as a run that holds the whole model.
 *
 * With --device cuda the rank's working memory is the device's (zero.h: ze_zero_alloc), so
 * the same schedule gathers modules into device buffers and reduces device gradients, and
 * a driver runs the forward/backward kernels (cuda_engine.h) through the same hooks.
 */
#ifndef ZE_ZEXEC_H
#define ZE_ZEXEC_H

#include "gpt2.h"
#include "zero.h"

typedef struct ze_exec ze_exec;

typedef struct ze_exec_opts {
  uint64_t prefetch_bucket_size; /* stage 3: elements gathered ahead of use (DeepSpeed default 5e7) */
  uint64_t max_live_parameters;  /* stage 3: gathered elements beyond which nothing is prefetched (1e9) */
  uint64_t persistence_threshold;       /* stage3_param_persistence_threshold (1e5; 0 here: none) */
  uint64_t model_persistence_threshold; /* stage3_model_persistence_threshold (0 here: no limit) */
  uint64_t max_reuse_distance;          /* stage3_max_reuse_distance in elements (1e9; 0: none) */
  bool overlap_comm;             /* use the device's comm stream (when it has one) */
  bool test_skip_waits;          /* tests only: never wait for a gather's event (wrong bits expected) */
} ze_exec_opts;

/* What the executor did, for the tests and the report. */
typedef struct ze_exec_stats {
  uint64_t gathers;              /* stage-3 all-gathers of module tensors */
  uint64_t prefetches;           /* of those, issued ahead of the module's use */
  uint64_t async_gathers;        /* of those, issued on the comm stream */
  uint64_t async_reduces;        /* gradient reductions issued on the comm stream */
  uint64_t overlapped_gathers;   /* module computes that began with a later module's gather in flight */
  uint64_t overlapped_reduces;   /* module computes that began with a reduction in flight */
  uint64_t reuse_kept;           /* tensor releases skipped by stage3_max_reuse_distance */
  uint64_t persistent_numel;     /* elements of the persistent tensors */
  size_t persistent_tensors;
} ze_exec_stats;
const ze_exec_stats *ze_exec_get_stats(const ze_exec *x);


zck_status ze_exec_new(const ze_gpt2_config *cfg, ze_zero_rank *zr, const ze_exec_opts *o, ze_exec **out);
void ze_exec_free(ze_exec *x);

/* One micro-batch: forward (mean loss into *loss), backward of scale * loss, gradients
 * handled as above; `last`: the step's last micro-batch (stage 1 reduces then).
 * Collective in stage 2/3 (and stage 1 when last). */
zck_status ze_exec_train_micro(ze_exec *x, ze_gpt2_ws *ws, const int *inputs, const int *targets, int B, int T,
                               float scale, bool last, float *loss);
/* Forward only (targets may be NULL: logits only). Collective in stage 3. */
zck_status ze_exec_forward(ze_exec *x, ze_gpt2_ws *ws, const int *inputs, const int *targets, int B, int T,
                           float *loss);
/* The whole fp32 model in model order (ze_gpt2_numel floats). Collective in stage 3. */
zck_status ze_exec_full_params(ze_exec *x, float *dst);

/* Forward and backward on another engine, module by module through the executor's hooks
 * (which hand out pointers into the rank's working memory). */
typedef struct ze_exec_driver {
  void *ctx;
  /* targets may be NULL (logits only); *loss as ze_gpt2_forward_hooked */
  zck_status (*forward)(void *ctx, const ze_gpt2_hooks *h, const int *inputs, const int *targets, int B, int T,
                        float *loss);
  /* backward of scale * the mean loss of the last forward */
  zck_status (*backward)(void *ctx, const ze_gpt2_hooks *h, float scale);
} ze_exec_driver;
/* NULL: the CPU's ze_gpt2_*_hooked over ws (the default). The executor keeps the pointer. */
void ze_exec_set_driver(ze_exec *x, const ze_exec_driver *d);

#endif
