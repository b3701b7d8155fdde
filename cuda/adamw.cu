// adamw.cu: fused AdamW on an fp32 master partition, bit-exact with ze_adamw_step.
//
// Every float operation is spelled as an IEEE round-to-nearest intrinsic (__fmul_rn,
// __fadd_rn, ...), which nvcc never contracts into FMAs, and the one FMA of each moment
// update is the explicit fmaf the CPU code uses. sqrt and division are correctly rounded
// (__fsqrt_rn, __fdiv_rn), as glibc's sqrtf and IEEE division are on the CPU. The scalar
// hyper-parameters are computed on the host in double with the same expressions.
#include "common.cuh"
#include "launch.h"

#include <math.h>

struct zck__adamw_scalars {
  float decay, w1, b2, w2, neg_step_size, bc2_sqrt, eps, clip;
  int do_decay, do_clip, zero_grad, lp; /* lp: 0 none, 1 bf16, 2 f32 */
};

__global__ void zck_k_adamw(float *param, float *grad, float *exp_avg, float *exp_avg_sq, void *lp_out, size_t n,
                            zck__adamw_scalars s) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float p = param[i], g = grad[i];
    if (s.do_clip) g = __fmul_rn(g, s.clip);
    if (s.do_decay) p = __fmul_rn(p, s.decay);
    float m0 = exp_avg[i], v0 = exp_avg_sq[i];
    float m = fmaf(s.w1, __fsub_rn(g, m0), m0);
    float v = fmaf(__fmul_rn(s.w2, g), g, __fmul_rn(v0, s.b2));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bc2_sqrt), s.eps);
    p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom));
    param[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if (s.zero_grad)
      grad[i] = 0.0f;
    else if (s.do_clip)
      grad[i] = g;
    if (s.lp == 1)
      ((uint16_t *)lp_out)[i] = zck__d_bf16(p);
    else if (s.lp == 2)
      ((float *)lp_out)[i] = p;
  }
}

extern "C" zck_status zck_cuda_adamw(float *d_param, float *d_grad, float *d_exp_avg, float *d_exp_avg_sq, size_t n,
                                     const zck_cuda_adamw_args *a, void *stream) {
  ZCK_FAIL_IF(a->step < 1, ZCK_ERR_INVALID_ARG, "cuda adamw: step %lld; steps count from 1", (long long)a->step);
  ZCK_FAIL_IF(a->d_lp_out && a->lp_dtype != ZCK_BF16 && a->lp_dtype != ZCK_F32, ZCK_ERR_INVALID_ARG,
              "cuda adamw: 16-bit copy as %s; supported: bfloat16, float32", zck_dtype_name(a->lp_dtype));
  if (!n) return ZCK_OK;
  /* the scalars of ze_adamw_step, computed the same way */
  double lr = a->lr;
  double bc1 = 1.0 - pow(a->beta1, (double)a->step);
  double bc2 = 1.0 - pow(a->beta2, (double)a->step);
  zck__adamw_scalars s;
  /* the product is stored before the subtraction: the host compiler may not fuse them
   * (optim.c is built with -ffp-contract=off; this file's host code is not) */
  volatile double lr_wd = lr * a->weight_decay;
  s.decay = (float)(1.0 - lr_wd);
  s.w1 = (float)(1.0 - a->beta1);
  s.b2 = (float)a->beta2;
  s.w2 = (float)(1.0 - a->beta2);
  s.neg_step_size = (float)(-(lr / bc1));
  s.bc2_sqrt = (float)pow(bc2, 0.5);
  s.eps = (float)a->eps;
  s.clip = (float)a->clip;
  s.do_decay = a->weight_decay != 0.0;
  s.do_clip = a->clip != 1.0;
  s.zero_grad = a->zero_grad != 0;
  s.lp = !a->d_lp_out ? 0 : a->lp_dtype == ZCK_BF16 ? 1 : 2;
  zck_k_adamw<<<zck__grid_stride(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(d_param, d_grad, d_exp_avg, d_exp_avg_sq,
                                                                      a->d_lp_out, n, s);
  ZCK_CU_LAUNCHED("adamw");
  return ZCK_OK;
}
