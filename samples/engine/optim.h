/* optim.h: AdamW with torch.optim.AdamW's arithmetic, the HF linear schedule, and DeepSpeed's
 * gradient clipping. */
#ifndef ZE_OPTIM_H
#define ZE_OPTIM_H

#include <stddef.h>
#include <stdint.h>

typedef struct ze_adamw_hp {
  double lr, beta1, beta2, eps, weight_decay;
} ze_adamw_hp;

/* One AdamW step on n elements; `step` is the step count after incrementing (1, 2, ...).
 * Same operations, in the same precision, as torch's single-tensor AdamW on CPU
 * (torch/optim/adam.py _single_tensor_adam with decoupled weight decay):
 *   param *= (float)(1 - lr*wd)                                  (skipped when wd == 0)
 *   exp_avg = fma(1-beta1, grad - exp_avg, exp_avg)              (lerp_, weight < 0.5)
 *   exp_avg_sq = fma((1-beta2)*grad, grad, exp_avg_sq*beta2)     (mul_ + addcmul_)
 *   bc1 = 1 - beta1^step, bc2 = 1 - beta2^step   (double, as Python computes them)
 *   denom = sqrt(exp_avg_sq) / (float)bc2^0.5 + (float)eps
 *   param += ((float)(-lr/bc1) * exp_avg) / denom                (addcdiv_)
 * The fused multiply-adds are those of torch's vectorised CPU kernels (AVX2/AVX-512). torch's
 * vectorised sqrt may come from MKL and is not always correctly rounded; ours is, so the two
 * can differ by one ulp in rare elements. */
void ze_adamw_step(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t n,
                   const ze_adamw_hp *hp, int64_t step);

/* transformers' get_linear_schedule_with_warmup multiplier for optimizer step `step`
 * (0-based: the lr used by the (step+1)-th update). */
double ze_lr_linear_factor(int64_t step, int64_t warmup_steps, int64_t total_steps);
/* get_cosine_schedule_with_warmup's (half a cosine from 1 to 0 after the linear warmup). */
double ze_lr_cosine_factor(int64_t step, int64_t warmup_steps, int64_t total_steps);

/* DeepSpeed's clip (stage_1_and_2 unscale_and_clip_grads): the factor grads are
 * multiplied by: 1 when max_norm <= 0 or the norm is small enough, else
 * 1 / ((norm + 1e-6) / max_norm). */
double ze_clip_factor(double total_norm, double max_norm);

#endif
