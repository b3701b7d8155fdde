/* test_gpu_adamw.c: the fused AdamW kernel against the CPU optimizer (ze_adamw_step, with
 * zero.c's clip multiply before it and its RNE cast after it). Expected bit-exact: the
 * kernel performs the same IEEE operations in the same order (see cuda/adamw.cu); any
 * difference fails. Random data with mixed magnitudes, 7 steps, weight decay on and off,
 * clipping on and off, bf16 and fp32 16-bit copies, gradient zeroing. */
#include "gpu_util.h"

#include "optim.h"

#define N 100003

int main(void) {
  if (zck_cuda_device_count() == 0) zt_skip("no CUDA device");
  uint64_t seed = 7;
  float *p = malloc(N * 4), *m = calloc(N, 4), *v = calloc(N, 4), *g = malloc(N * 4);
  float *gp = malloc(N * 4), *gm = malloc(N * 4), *gv = malloc(N * 4), *gg = malloc(N * 4);
  uint16_t *lp = malloc(N * 2), *glp = malloc(N * 2);
  float *glpf = malloc(N * 4);
  for (int variant = 0; variant < 4; variant++) {
    double wd = variant & 1 ? 0.1 : 0.0, clip = variant & 2 ? 0.37 : 1.0;
    zck_dtype lpt = variant & 2 ? ZCK_F32 : ZCK_BF16;
    gpu_fill(p, N, &seed, 1.0f);
    memset(m, 0, N * 4);
    memset(v, 0, N * 4);
    float *dp = gpu_dup(p, N * 4), *dm = gpu_alloc(N * 4), *dv = gpu_alloc(N * 4), *dg = gpu_alloc(N * 4);
    void *dlp = gpu_alloc(N * 4);
    ze_adamw_hp hp = {3e-3, 0.9, 0.95, 1e-8, wd};
    for (int step = 1; step <= 7; step++) {
      gpu_fill(g, N, &seed, 0.2f);
      for (int i = 0; i < N; i += 7) g[i] *= 1e-6f;
      for (int i = 3; i < N; i += 101) g[i] = 0.0f;
      ZT_OK(zck_cuda_memcpy(dg, g, N * 4));
      /* CPU: zero.c's ze_zero_step */
      if (clip != 1.0)
        for (int i = 0; i < N; i++) g[i] *= (float)clip;
      ze_adamw_step(p, g, m, v, N, &hp, step);
      /* device */
      zck_cuda_adamw_args a = {hp.lr, hp.beta1, hp.beta2, hp.eps, wd, step, clip, step % 2, dlp, lpt};
      ZT_OK(zck_cuda_adamw(dp, dg, dm, dv, N, &a, NULL));
      gpu_get(gp, dp, N * 4);
      gpu_get(gm, dm, N * 4);
      gpu_get(gv, dv, N * 4);
      gpu_get(gg, dg, N * 4);
      char what[64];
      snprintf(what, sizeof what, "variant %d step %d param", variant, step);
      ZT_EQ_MEM(gp, p, N * 4);
      ZT_EQ_MEM(gm, m, N * 4);
      ZT_EQ_MEM(gv, v, N * 4);
      if (step % 2) {
        for (int i = 0; i < N; i++)
          if (gg[i] != 0.0f) ZT_FAIL("%s: grad %d not zeroed", what, i);
      } else {
        ZT_EQ_MEM(gg, g, N * 4); /* clipped in place */
      }
      if (lpt == ZCK_BF16) {
        gpu_get(glp, dlp, N * 2);
        zck_convert(ZCK_BF16, lp, ZCK_F32, p, N);
        ZT_EQ_MEM(glp, lp, N * 2);
      } else {
        gpu_get(glpf, dlp, N * 4);
        ZT_EQ_MEM(glpf, p, N * 4);
      }
    }
    printf("  variant %d (wd %.1f, clip %.2f, %s copy): 7 steps bit-exact\n", variant, wd, clip, zck_dtype_name(lpt));
    zck_cuda_free(dp);
    zck_cuda_free(dm);
    zck_cuda_free(dv);
    zck_cuda_free(dg);
    zck_cuda_free(dlp);
  }
  zck_cuda_adamw_args bad = {1e-3, 0.9, 0.999, 1e-8, 0.0, 0, 1.0, 0, NULL, ZCK_BF16};
  ZT_ERR(zck_cuda_adamw(NULL, NULL, NULL, NULL, 1, &bad, NULL), ZCK_ERR_INVALID_ARG, "steps count from 1");
  free(p);
  free(m);
  free(v);
  free(g);
  free(gp);
  free(gm);
  free(gv);
  free(gg);
  free(lp);
  free(glp);
  free(glpf);
  return 0;
}
