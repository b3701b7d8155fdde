/* cuda_engine.h: zckpt-train's --device cuda: each rank thread runs its micro-batches'
 * forward and backward on a GPU (cuda/gpt2.cu), while the ZeRO state, collectives,
 * optimizer and checkpoints stay where the CPU engine keeps them (zero.c's host arrays).
 *
 * So a GPU run produces the same kind of checkpoints as a CPU run and differs from it
 * only by the device's arithmetic in forward/backward (cuBLAS products and reductions in
 * another order: losses agree to about 1e-4 relative, not bit for bit).
 *
 * Rank r uses device r % device count (a rank process: LOCAL_RANK % device count); several
 * ranks may share one GPU (each has its own stream and cuBLAS handle). The collectives stay
 * on the host (the local or tcp backend), since the ZeRO state they move lives there.
 */
#ifndef ZE_CUDA_ENGINE_H
#define ZE_CUDA_ENGINE_H

#include "gpt2.h"
#include "zck_cuda.h"

#include <stdbool.h>

typedef struct ze_cuda_rank {
  zck_cuda_ctx *ctx;
  zck_cuda_gpt2 *model;
  float *d_params, *d_grads;  /* device, numel floats each, ze_gpt2_carve's layout */
  float *h_grads;             /* page-locked staging for the gradient download */
  size_t numel;
} ze_cuda_rank;

/* Whether --device cuda can run here: a CUDA build and at least one device (else
 * ZCK_ERR_NO_DEVICE with the reason). */
zck_status ze_cuda_check(void);

/* Sets up a rank for batches up to (B, T) on device `rank` % device count. cr is zeroed first; on failure it is
 * left freeable. */
zck_status ze_cuda_rank_init(ze_cuda_rank *cr, const ze_gpt2_config *cfg, int rank, int B, int T);
void ze_cuda_rank_free(ze_cuda_rank *cr);

/* One micro-batch, as ze_gpt2_forward + ze_gpt2_backward(scale) on the CPU: uploads
 * `work` (fp32 parameters, model order) when params_changed, runs forward and backward on
 * the device, ADDS the parameter gradients into gwork (host), and returns the mean loss. */
zck_status ze_cuda_micro_step(ze_cuda_rank *cr, const float *work, float *gwork, const int *inputs, const int *targets,
                              int B, int T, float scale, bool params_changed, float *loss);

#endif
