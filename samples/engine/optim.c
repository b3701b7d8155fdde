/* optim.c: AdamW, learning-rate schedule and clipping (see optim.h for the exact arithmetic). */
#include "optim.h"

#include <math.h>

/* On x86-64 a second copy for CPUs with FMA (picked at load time): without it each fmaf is a
 * libm call and the loop stays scalar. fmaf, sqrtf (-fno-math-errno, samples/CMakeLists.txt)
 * and the divisions are correctly rounded in both copies: the same bits, vectorised. GCC
 * only: clang 14 (Debian 12's) emits no resolver for a target_clones function its own file
 * does not call, so the caller in dzero.c fails to link. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("fma", "default")))
#endif
void ze_adamw_step(float *param, const float *grad, float *exp_avg, float *exp_avg_sq, size_t n,
                   const ze_adamw_hp *hp, int64_t step) {
  double lr = hp->lr;
  float decay = (float)(1.0 - lr * hp->weight_decay);
  float w1 = (float)(1.0 - hp->beta1);
  float b2 = (float)hp->beta2, w2 = (float)(1.0 - hp->beta2);
  double bc1 = 1.0 - pow(hp->beta1, (double)step);
  double bc2 = 1.0 - pow(hp->beta2, (double)step);
  float neg_step_size = (float)(-(lr / bc1));
  float bc2_sqrt = (float)pow(bc2, 0.5);
  float eps = (float)hp->eps;
  int do_decay = hp->weight_decay != 0.0;
  for (size_t i = 0; i < n; i++) {
    float p = param[i], g = grad[i];
    if (do_decay) p = p * decay;
    float m = fmaf(w1, g - exp_avg[i], exp_avg[i]);
    float v = fmaf(w2 * g, g, exp_avg_sq[i] * b2);
    float denom = sqrtf(v) / bc2_sqrt + eps;
    param[i] = p + (neg_step_size * m) / denom;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

double ze_lr_linear_factor(int64_t step, int64_t warmup_steps, int64_t total_steps) {
  if (step < warmup_steps) return (double)step / (double)(warmup_steps > 1 ? warmup_steps : 1);
  int64_t span = total_steps - warmup_steps;
  double f = (double)(total_steps - step) / (double)(span > 1 ? span : 1);
  return f > 0.0 ? f : 0.0;
}

double ze_lr_cosine_factor(int64_t step, int64_t warmup_steps, int64_t total_steps) {
  if (step < warmup_steps) return (double)step / (double)(warmup_steps > 1 ? warmup_steps : 1);
  int64_t span = total_steps - warmup_steps;
  double progress = (double)(step - warmup_steps) / (double)(span > 1 ? span : 1);
  double f = 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
  return f > 0.0 ? f : 0.0;
}

double ze_clip_factor(double total_norm, double max_norm) {
  if (max_norm <= 0.0) return 1.0;
  double clip = (total_norm + 1e-6) / max_norm;
  return clip > 1.0 ? 1.0 / clip : 1.0;
}
