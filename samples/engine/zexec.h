/* zexec.h: GPT-2 forward and backward on a ZeRO rank, one module at a time, as DeepSpeed
 * runs a model under ZeRO.
 *
 * Modules (gpt2.h): -1 embeddings, 0..L-1 blocks, L final LayerNorm + tied lm_head.
 *  - Parameters: a module's fp32 weights exist only while it runs. Stage 1/2 convert them from
 *    the rank's lp flat; stage 3 all-gathers them just before use (forward -1, 0, .., L, then
 *    backward L, .., 0) and frees them after, keeping the final module across the turn from
 *    forward to backward. Stage 3 prefetches the modules that come next while the elements
 *    fetched ahead stay under stage3_prefetch_bucket_size (a module is taken whole, so the
 *    last one may overshoot, as DeepSpeed's per-param check does) and the gathered elements
 *    under stage3_max_live_parameters. The CPU backend runs every collective in the rank's
 *    own thread, so a prefetch moves the gather earlier but does not overlap it with compute.
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

typedef struct ze_exec_opts {
  uint64_t prefetch_bucket_size; /* stage 3: elements gathered ahead of use (DeepSpeed default 5e7) */
  uint64_t max_live_parameters;  /* stage 3: gathered elements beyond which nothing is prefetched (1e9) */
} ze_exec_opts;

typedef struct ze_exec ze_exec;

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
