/* test_optim.c: AdamW against a hand-computed reference with torch's semantics (bias
 * correction, decoupled weight decay, eps outside the sqrt), the HF linear and cosine schedules and
 * DeepSpeed's clip factor. */
#include "test.h"

#include "optim.h"

#include <math.h>

/* torch.optim.AdamW single-tensor step, written out operation by operation in float with
 * Python doubles for the scalars (the reference the engine must equal bit for bit). */
static void torch_adamw_ref(float *p, float g, float *m, float *v, double lr, double b1, double b2, double eps,
                            double wd, int step) {
  if (wd != 0) *p = *p * (float)(1 - lr * wd);                        /* param.mul_(1 - lr*wd) */
  *m = fmaf((float)(1 - b1), g - *m, *m);                             /* exp_avg.lerp_(grad, 1-b1) */
  *v = fmaf((float)(1 - b2) * g, g, *v * (float)b2);                  /* mul_(b2).addcmul_(g, g, 1-b2) */
  double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
  float denom = sqrtf(*v) / (float)pow(bc2, 0.5) + (float)eps;        /* (sqrt / bc2_sqrt).add_(eps) */
  *p = *p + ((float)(-(lr / bc1)) * *m) / denom;                      /* addcdiv_(m, denom, -lr/bc1) */
}

int main(void) {
  /* ---- bit-exact against the reference over several steps, both weight-decay settings */
  enum { N = 101 };
  for (int dec = 0; dec < 2; dec++) {
    float p[N], m[N] = {0}, v[N] = {0}, rp[N], rm[N] = {0}, rv[N] = {0};
    for (int i = 0; i < N; i++) p[i] = rp[i] = (float)sin(i * 0.37) * 0.5f;
    ze_adamw_hp hp = {3e-3, 0.9, 0.95, 1e-8, dec ? 0.1 : 0.0};
    for (int step = 1; step <= 7; step++) {
      float g[N];
      for (int i = 0; i < N; i++) g[i] = (float)cos(i * 0.11 + step) * (i % 7 == 0 ? 1e-6f : 0.2f);
      ze_adamw_step(p, g, m, v, N, &hp, step);
      for (int i = 0; i < N; i++)
        torch_adamw_ref(&rp[i], g[i], &rm[i], &rv[i], hp.lr, hp.beta1, hp.beta2, hp.eps, hp.weight_decay, step);
      ZT_EQ_MEM(p, rp, sizeof p);
      ZT_EQ_MEM(m, rm, sizeof m);
      ZT_EQ_MEM(v, rv, sizeof v);
    }
  }
  /* ---- golden values from torch 2.15 (CPU, AVX-512): torch.optim.AdamW(lr=3e-3,
   * betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1), three steps. torch's vectorised sqrt is
   * not always correctly rounded, so params may differ by an ulp; the moments are exact. */
  {
    float p[8] = {0.5f, -0.25f, 1e-3f, -2.0f, 0.75f, 0.0f, 3.0f, -1e-5f}, m[8] = {0}, v[8] = {0};
    static const float grads[3][8] = {{0.1f, -0.2f, 1e-6f, 0.5f, -0.05f, 0.0f, 2.0f, -1e-7f},
                                      {0.2f, 0.1f, -1e-6f, -0.5f, 0.05f, 1e-3f, -2.0f, 1e-7f},
                                      {-0.3f, 0.0f, 1e-5f, 0.25f, 0.5f, -1e-3f, 1.0f, 0.0f}};
    static const uint32_t tp[8] = {0x3efcdd4c, 0xbe7b3ad5, 0xbb6ef15e, 0xc00019b6,
                                   0x3f40136b, 0xbb07addc, 0x403f9c94, 0x3b215c43};
    static const uint32_t tm[8] = {0xbb7f972d, 0xbbebedfb, 0x35850280, 0x3ca7ef9d,
                                   0x3d4ea4a9, 0xb727c5a8, 0x3da7ef9d, 0x307763e5};
    static const uint32_t tv[8] = {0x3be08075, 0x3b156c0e, 0x2cb32e49, 0x3cd74bc6,
                                   0x3c50980b, 0x33d16132, 0x3ed74bc6, 0x26857c98};
    ze_adamw_hp hp = {3e-3, 0.9, 0.95, 1e-8, 0.1};
    for (int s = 0; s < 3; s++) ze_adamw_step(p, grads[s], m, v, 8, &hp, s + 1);
    for (int i = 0; i < 8; i++) {
      uint32_t bp, bm, bv;
      memcpy(&bp, &p[i], 4);
      memcpy(&bm, &m[i], 4);
      memcpy(&bv, &v[i], 4);
      ZT_EQ_U64(bm, tm[i]);
      ZT_EQ_U64(bv, tv[i]);
      long long ulps = (long long)bp - (long long)tp[i];
      if (ulps < -1 || ulps > 1) ZT_FAIL("param %d: 0x%08x vs torch 0x%08x", i, bp, tp[i]);
    }
  }
  /* ---- the first step by hand in double: m = (1-b1) g, v = (1-b2) g^2, so the update is
   * -lr * g / (|g| + eps / sqrt(1-b2)) ... = -lr * sign(g) for |g| >> eps; decay first */
  {
    float p = 1.0f, g = 0.5f, m = 0, v = 0;
    ze_adamw_hp hp = {1e-2, 0.9, 0.999, 1e-8, 0.1};
    ze_adamw_step(&p, &g, &m, &v, 1, &hp, 1);
    double expect = 1.0 * (1 - 1e-2 * 0.1) - 1e-2 * (0.05 / 0.1) / (sqrt(0.00025 / 0.001) + 1e-8);
    ZT_ASSERT(fabs(p - expect) < 1e-6);
    ZT_ASSERT(fabs(m - 0.05) < 1e-8 && fabs(v - 0.00025) < 1e-9);
    /* step 2 with g = 0: decay, moments shrink, bias corrections of step 2 */
    g = 0.0f;
    float p1 = p;
    ze_adamw_step(&p, &g, &m, &v, 1, &hp, 2);
    double m2 = 0.9 * 0.05, v2 = 0.999 * 0.00025;
    double e2 = p1 * (1 - 1e-3) - 1e-2 / (1 - 0.81) * m2 / (sqrt(v2) / sqrt(1 - 0.998001) + 1e-8);
    ZT_ASSERT(fabs(p - e2) < 1e-6);
  }
  /* zero gradient and zero state (ZeRO padding) stays exactly zero */
  {
    float p = 0, g = 0, m = 0, v = 0;
    ze_adamw_hp hp = {1e-3, 0.9, 0.999, 1e-8, 0.1};
    for (int s = 1; s < 5; s++) ze_adamw_step(&p, &g, &m, &v, 1, &hp, s);
    ZT_ASSERT(p == 0 && m == 0 && v == 0);
  }
  /* ---- transformers' linear schedule with warmup */
  ZT_ASSERT(ze_lr_linear_factor(0, 0, 10) == 1.0);
  ZT_ASSERT(ze_lr_linear_factor(5, 0, 10) == 0.5);
  ZT_ASSERT(ze_lr_linear_factor(10, 0, 10) == 0.0);
  ZT_ASSERT(ze_lr_linear_factor(0, 4, 10) == 0.0);
  ZT_ASSERT(ze_lr_linear_factor(2, 4, 10) == 0.5);
  ZT_ASSERT(ze_lr_linear_factor(4, 4, 10) == 1.0);
  ZT_ASSERT(ze_lr_linear_factor(7, 4, 10) == 0.5);
  ZT_ASSERT(ze_lr_linear_factor(12, 4, 10) == 0.0);
  /* ---- transformers' cosine schedule with warmup (the values its
   * _get_cosine_schedule_with_warmup_lr_lambda returns for warmup 4, 10 steps) */
  ZT_ASSERT(ze_lr_cosine_factor(0, 4, 10) == 0.0);
  ZT_ASSERT(ze_lr_cosine_factor(2, 4, 10) == 0.5);
  ZT_ASSERT(ze_lr_cosine_factor(4, 4, 10) == 1.0);
  ZT_ASSERT(ze_lr_cosine_factor(5, 4, 10) == 0.9330127018922194);
  ZT_ASSERT(ze_lr_cosine_factor(7, 4, 10) == 0.5);
  ZT_ASSERT(ze_lr_cosine_factor(9, 4, 10) == 0.06698729810778065);
  ZT_ASSERT(ze_lr_cosine_factor(10, 4, 10) == 0.0);
  /* ---- DeepSpeed clipping */
  ZT_ASSERT(ze_clip_factor(0.5, 1.0) == 1.0);
  ZT_ASSERT(ze_clip_factor(4.0, 0.0) == 1.0);
  ZT_ASSERT(ze_clip_factor(4.0, 1.0) == 1.0 / ((4.0 + 1e-6) / 1.0));
  return 0;
}
