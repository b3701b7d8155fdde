// attention.cu: causal self-attention forward and backward, simple and exact in structure:
// the probabilities are materialised (B, H, T, T) as in the CPU engine, every output
// element is a sequential sum computed by one thread, and nothing uses atomics, so runs
// are bit-reproducible. Quadratic in T like the CPU code; fine for the engine's sizes.
#include "common.cuh"
#include "launch.h"

#define ZCK_ATT_WARPS 4

// Index helpers: qkv (B, T, 3C) holds q at [0, C), k at [C, 2C), v at [2C, 3C).
struct zck__att_dims {
  int B, T, C, H, hs;
  float scale;
};

__device__ __forceinline__ size_t zck__qkv(const zck__att_dims &d, int b, int t, int part, int h, int i) {
  return zck__qkv_at(d.T, d.C, d.hs, b, t, part, h, i);
}

// scores + softmax: one warp per (b, h, t) row; lane-strided over t2 so each lane reads
// back only what it wrote.
__global__ void zck_k_att_softmax(float *att, const float *qkv, zck__att_dims d) {
  int lane = threadIdx.x & 31;
  size_t row = (size_t)blockIdx.x * ZCK_ATT_WARPS + (threadIdx.x >> 5);
  if (row >= (size_t)d.B * d.H * d.T) return;
  int b, h, t;
  zck__bht(row, d.H, d.T, &b, &h, &t);
  float *a = att + zck__att_at(d.H, d.T, b, h, t, 0);
  const float *q = qkv + zck__qkv(d, b, t, 0, h, 0);
  float mx = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float *k = qkv + zck__qkv(d, b, t2, 1, h, 0);
    float s = 0.0f;
    for (int i = 0; i < d.hs; i++) s = fmaf(q[i], k[i], s);
    s *= d.scale;
    a[t2] = s;
    mx = fmaxf(mx, s);
  }
  mx = zck__warp_max(mx);
  float sum = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    float e = expf(a[t2] - mx);
    a[t2] = e;
    sum += e;
  }
  float inv = 1.0f / zck__warp_sum(sum);
  for (int t2 = lane; t2 < d.T; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
}

// out[b, t, h*hs + i] = sum over t2 <= t of att[b, h, t, t2] * v[b, t2, h, i]
__global__ void zck_k_att_out(float *out, const float *att, const float *qkv, zck__att_dims d) {
  size_t n = (size_t)d.B * d.T * d.C;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    int b, t, c;
    zck__btc(e, d.T, d.C, &b, &t, &c);
    int h = c / d.hs, i = c % d.hs;
    const float *a = att + zck__att_at(d.H, d.T, b, h, t, 0);
    float s = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) s = fmaf(a[t2], qkv[zck__qkv(d, b, t2, 2, h, i)], s);
    out[e] = s;
  }
}

extern "C" zck_status zck_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H,
                                                 void *stream) {
  ZCK_FAIL_IF(B < 0 || T < 0 || C < 1 || H < 1 || C % H, ZCK_ERR_INVALID_ARG,
              "cuda attention: B %d, T %d, C %d, H %d (C must be a multiple of H)", B, T, C, H);
  if (!B || !T) return ZCK_OK;
  zck__att_dims d = {B, T, C, H, C / H, 1.0f / sqrtf((float)(C / H))};
  cudaStream_t st = ZCK_CU_STREAM(stream);
  unsigned row_blocks = zck__grid_rows((size_t)B * H * T, ZCK_ATT_WARPS);
  ZCK_FAIL_IF(!row_blocks, ZCK_ERR_INVALID_ARG, "cuda attention: B %d x H %d x T %d rows are too many", B, H, T);
  zck_k_att_softmax<<<row_blocks, 32 * ZCK_ATT_WARPS, 0, st>>>(att, qkv, d);
  ZCK_CU_LAUNCHED("attention scores");
  size_t n = (size_t)B * T * C;
  zck_k_att_out<<<zck__grid_stride(n, 256), 256, 0, st>>>(out, att, qkv, d);
  ZCK_CU_LAUNCHED("attention output");
  return ZCK_OK;
}

// ---- backward

// dv[b, t2, h, i] += sum over t >= t2 of att[b, h, t, t2] * dout[b, t, h, i]
__global__ void zck_k_att_dv(float *dqkv, const float *dout, const float *att, zck__att_dims d) {
  size_t n = (size_t)d.B * d.T * d.C;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    int b, t2, c;
    zck__btc(e, d.T, d.C, &b, &t2, &c);
    int h = c / d.hs, i = c % d.hs;
    const float *a = att + zck__att_at(d.H, d.T, b, h, 0, 0);
    float s = 0.0f;
    for (int t = t2; t < d.T; t++) s = fmaf(a[(size_t)t * d.T + t2], dout[((size_t)b * d.T + t) * d.C + c], s);
    size_t o = zck__qkv(d, b, t2, 2, h, i);
    dqkv[o] += s;
  }
}

// dpre[b, h, t, t2] = att * (datt - sum over t3 of att * datt) * scale, datt = v[t2] . dout[t]
__global__ void zck_k_att_dpre(float *dpre, const float *dout, const float *qkv, const float *att, zck__att_dims d) {
  int lane = threadIdx.x & 31;
  size_t row = (size_t)blockIdx.x * ZCK_ATT_WARPS + (threadIdx.x >> 5);
  if (row >= (size_t)d.B * d.H * d.T) return;
  int b, h, t;
  zck__bht(row, d.H, d.T, &b, &h, &t);
  const float *a = att + zck__att_at(d.H, d.T, b, h, t, 0);
  float *p = dpre + zck__att_at(d.H, d.T, b, h, t, 0);
  const float *g = dout + ((size_t)b * d.T + t) * d.C + (size_t)h * d.hs;
  float dot = 0.0f;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float *v = qkv + zck__qkv(d, b, t2, 2, h, 0);
    float s = 0.0f;
    for (int i = 0; i < d.hs; i++) s = fmaf(v[i], g[i], s);
    p[t2] = s;
    dot = fmaf(a[t2], s, dot);
  }
  dot = zck__warp_sum(dot);
  for (int t2 = lane; t2 < d.T; t2 += 32) p[t2] = t2 <= t ? a[t2] * (p[t2] - dot) * d.scale : 0.0f;
}

// dq[b, t, h, i] += sum over t2 <= t of dpre[t, t2] k[t2, i]; dk[b, t2, h, i] += sum over
// t >= t2 of dpre[t, t2] q[t, i]
__global__ void zck_k_att_dqk(float *dqkv, const float *qkv, const float *dpre, zck__att_dims d) {
  size_t n = (size_t)d.B * d.T * d.C;
  for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    int b, t, c;
    zck__btc(e, d.T, d.C, &b, &t, &c);
    int h = c / d.hs, i = c % d.hs;
    const float *p = dpre + zck__att_at(d.H, d.T, b, h, 0, 0);
    float sq = 0.0f, sk = 0.0f;
    for (int t2 = 0; t2 <= t; t2++) sq = fmaf(p[(size_t)t * d.T + t2], qkv[zck__qkv(d, b, t2, 1, h, i)], sq);
    for (int t3 = t; t3 < d.T; t3++) sk = fmaf(p[(size_t)t3 * d.T + t], qkv[zck__qkv(d, b, t3, 0, h, i)], sk);
    dqkv[zck__qkv(d, b, t, 0, h, i)] += sq;
    dqkv[zck__qkv(d, b, t, 1, h, i)] += sk;
  }
}

extern "C" zck_status zck_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                                  float *scratch, int B, int T, int C, int H, void *stream) {
  ZCK_FAIL_IF(B < 0 || T < 0 || C < 1 || H < 1 || C % H, ZCK_ERR_INVALID_ARG,
              "cuda attention: B %d, T %d, C %d, H %d (C must be a multiple of H)", B, T, C, H);
  if (!B || !T) return ZCK_OK;
  zck__att_dims d = {B, T, C, H, C / H, 1.0f / sqrtf((float)(C / H))};
  cudaStream_t st = ZCK_CU_STREAM(stream);
  size_t n = (size_t)B * T * C;
  unsigned row_blocks = zck__grid_rows((size_t)B * H * T, ZCK_ATT_WARPS);
  ZCK_FAIL_IF(!row_blocks, ZCK_ERR_INVALID_ARG, "cuda attention: B %d x H %d x T %d rows are too many", B, H, T);
  zck_k_att_dv<<<zck__grid_stride(n, 256), 256, 0, st>>>(dqkv, dout, att, d);
  ZCK_CU_LAUNCHED("attention backward (dv)");
  zck_k_att_dpre<<<row_blocks, 32 * ZCK_ATT_WARPS, 0, st>>>(scratch, dout, qkv, att, d);
  ZCK_CU_LAUNCHED("attention backward (softmax)");
  zck_k_att_dqk<<<zck__grid_stride(n, 256), 256, 0, st>>>(dqkv, qkv, scratch, d);
  ZCK_CU_LAUNCHED("attention backward (dq, dk)");
  return ZCK_OK;
}
