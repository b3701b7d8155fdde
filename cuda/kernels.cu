// kernels.cu: the element-wise and row-wise GPT-2 kernels (encoder, LayerNorm, GELU,
// residual, softmax cross-entropy, bias). The CPU engine's expressions are written out
// with explicit round-to-nearest intrinsics so that nvcc does not contract them into FMAs:
// where the inputs and the order of a sum are the same as the CPU's, so are the bits.
#include "common.cuh"
#include "launch.h"

#define ZE_GELU_S 0.7978845608028654f /* sqrt(2/pi), as samples/engine/gpt2.c */

// Rows handled by a block of warps, one warp per row.
#define ZCK_ROW_WARPS 4

static inline unsigned zck__row_blocks(int rows) { return zck__grid_rows((size_t)rows, ZCK_ROW_WARPS); }
// One thread per channel (column), 128 to a block.
static inline unsigned zck__col_blocks(int cols) { return zck__grid_rows((size_t)cols, 128); }

static zck_status zck__check_dims(const char *what, long long a, long long b) {
  ZCK_FAIL_IF(a < 0 || b < 0, ZCK_ERR_INVALID_ARG, "cuda %s: negative size (%lld, %lld)", what, a, b);
  return ZCK_OK;
}

// ---- encoder

__global__ void zck_k_encoder_fwd(float *out, const int *inp, const float *wte, const float *wpe, int BT, int T,
                                  int C) {
  size_t n = (size_t)BT * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t bt = i / C, c = i % C;
    out[i] = __fadd_rn(wte[(size_t)inp[bt] * C + c], wpe[(bt % T) * C + c]);
  }
}

// One thread per channel walks the rows in order: no races, the CPU's summation order.
__global__ void zck_k_encoder_bwd(float *dwte, float *dwpe, const float *dout, const int *inp, int BT, int T, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  for (int bt = 0; bt < BT; bt++) {
    float d = dout[(size_t)bt * C + c];
    size_t e = (size_t)inp[bt] * C + c, p = (size_t)(bt % T) * C + c;
    dwte[e] = __fadd_rn(dwte[e], d);
    dwpe[p] = __fadd_rn(dwpe[p], d);
  }
}

extern "C" zck_status zck_cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int BT,
                                               int T, int C, void *stream) {
  ZCK_TRY(zck__check_dims("encoder", BT, C));
  /* T is a divisor on the device, where a division by 0 is no trap but a wild index */
  ZCK_FAIL_IF(T < 1, ZCK_ERR_INVALID_ARG, "cuda encoder: sequence length %d", T);
  if (!BT || !C) return ZCK_OK;
  size_t n = (size_t)BT * C;
  zck_k_encoder_fwd<<<zck__grid_stride(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(out, inp, wte, wpe, BT, T, C);
  ZCK_CU_LAUNCHED("encoder forward");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int BT,
                                                int T, int C, void *stream) {
  ZCK_TRY(zck__check_dims("encoder", BT, C));
  ZCK_FAIL_IF(T < 1, ZCK_ERR_INVALID_ARG, "cuda encoder: sequence length %d", T);
  if (!BT || !C) return ZCK_OK;
  zck_k_encoder_bwd<<<zck__col_blocks(C), 128, 0, ZCK_CU_STREAM(stream)>>>(dwte, dwpe, dout, inp, BT, T, C);
  ZCK_CU_LAUNCHED("encoder backward");
  return ZCK_OK;
}

// ---- LayerNorm

__global__ void zck_k_layernorm_fwd(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                    const float *b, int BT, int C) {
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * ZCK_ROW_WARPS + (threadIdx.x >> 5);
  if (row >= BT) return;
  const float *x = inp + (size_t)row * C;
  float s = 0.0f;
  for (int i = lane; i < C; i += 32) s = __fadd_rn(s, x[i]);
  float m = __fdiv_rn(zck__warp_sum(s), (float)C);
  float v = 0.0f;
  for (int i = lane; i < C; i += 32) {
    float d = __fsub_rn(x[i], m);
    v = __fadd_rn(v, __fmul_rn(d, d));
  }
  v = __fdiv_rn(zck__warp_sum(v), (float)C);
  float rs = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(v, 1e-5f)));
  float *o = out + (size_t)row * C;
  for (int i = lane; i < C; i += 32) o[i] = __fadd_rn(__fmul_rn(__fmul_rn(rs, __fsub_rn(x[i], m)), w[i]), b[i]);
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

__global__ void zck_k_layernorm_bwd_dx(float *dinp, const float *dout, const float *inp, const float *w,
                                       const float *mean, const float *rstd, int BT, int C) {
  int lane = threadIdx.x & 31;
  int row = blockIdx.x * ZCK_ROW_WARPS + (threadIdx.x >> 5);
  if (row >= BT) return;
  const float *d = dout + (size_t)row * C, *x = inp + (size_t)row * C;
  float *dx = dinp + (size_t)row * C;
  float m = mean[row], s = rstd[row];
  float a = 0.0f, an = 0.0f;
  for (int i = lane; i < C; i += 32) {
    float norm = __fmul_rn(__fsub_rn(x[i], m), s);
    float dnorm = __fmul_rn(w[i], d[i]);
    a = __fadd_rn(a, dnorm);
    an = __fadd_rn(an, __fmul_rn(dnorm, norm));
  }
  float dnorm_mean = __fdiv_rn(zck__warp_sum(a), (float)C);
  float dnorm_norm_mean = __fdiv_rn(zck__warp_sum(an), (float)C);
  for (int i = lane; i < C; i += 32) {
    float norm = __fmul_rn(__fsub_rn(x[i], m), s);
    float dnorm = __fmul_rn(w[i], d[i]);
    float g = __fmul_rn(__fsub_rn(__fsub_rn(dnorm, dnorm_mean), __fmul_rn(norm, dnorm_norm_mean)), s);
    dx[i] = __fadd_rn(dx[i], g);
  }
}

// dw, db: one thread per channel over the rows in order (the CPU's order).
__global__ void zck_k_layernorm_bwd_dw(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                                       const float *rstd, int BT, int C) {
  int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float aw = dw[c], ab = db[c];
  for (int bt = 0; bt < BT; bt++) {
    float d = dout[(size_t)bt * C + c];
    float norm = __fmul_rn(__fsub_rn(inp[(size_t)bt * C + c], mean[bt]), rstd[bt]);
    ab = __fadd_rn(ab, d);
    aw = __fadd_rn(aw, __fmul_rn(norm, d));
  }
  dw[c] = aw;
  db[c] = ab;
}

extern "C" zck_status zck_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                                                 const float *w, const float *b, int BT, int C, void *stream) {
  ZCK_TRY(zck__check_dims("layernorm", BT, C));
  if (!BT || !C) return ZCK_OK;
  zck_k_layernorm_fwd<<<zck__row_blocks(BT), 32 * ZCK_ROW_WARPS, 0, ZCK_CU_STREAM(stream)>>>(out, mean, rstd, inp, w,
                                                                                             b, BT, C);
  ZCK_CU_LAUNCHED("layernorm forward");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                                                  const float *inp, const float *w, const float *mean,
                                                  const float *rstd, int BT, int C, void *stream) {
  ZCK_TRY(zck__check_dims("layernorm", BT, C));
  if (!BT || !C) return ZCK_OK;
  cudaStream_t st = ZCK_CU_STREAM(stream);
  zck_k_layernorm_bwd_dx<<<zck__row_blocks(BT), 32 * ZCK_ROW_WARPS, 0, st>>>(dinp, dout, inp, w, mean, rstd, BT, C);
  ZCK_CU_LAUNCHED("layernorm backward (dx)");
  zck_k_layernorm_bwd_dw<<<zck__col_blocks(C), 128, 0, st>>>(dw, db, dout, inp, mean, rstd, BT, C);
  ZCK_CU_LAUNCHED("layernorm backward (dw, db)");
  return ZCK_OK;
}

// ---- GELU (tanh approximation)

__global__ void zck_k_gelu_fwd(float *out, const float *inp, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float x = inp[i];
    float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
    out[i] = __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(__fmul_rn(ZE_GELU_S, __fadd_rn(x, cube)))));
  }
}

__global__ void zck_k_gelu_bwd(float *dinp, const float *inp, const float *dout, size_t n) {
  const float k3 = 3.0f * 0.044715f; /* folded in float, as the C compiler folds it */
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float x = inp[i];
    float cube = __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, x), x), x);
    float th = tanhf(__fmul_rn(ZE_GELU_S, __fadd_rn(x, cube)));
    float sech2 = __fsub_rn(1.0f, __fmul_rn(th, th));
    float left = __fmul_rn(0.5f, __fadd_rn(1.0f, th));
    float right = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(x, 0.5f), sech2), ZE_GELU_S),
                            __fadd_rn(1.0f, __fmul_rn(__fmul_rn(k3, x), x)));
    dinp[i] = __fadd_rn(dinp[i], __fmul_rn(__fadd_rn(left, right), dout[i]));
  }
}

extern "C" zck_status zck_cuda_gelu_forward(float *out, const float *inp, size_t n, void *stream) {
  if (!n) return ZCK_OK;
  zck_k_gelu_fwd<<<zck__grid_stride(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(out, inp, n);
  ZCK_CU_LAUNCHED("gelu forward");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n,
                                             void *stream) {
  if (!n) return ZCK_OK;
  zck_k_gelu_bwd<<<zck__grid_stride(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(dinp, inp, dout, n);
  ZCK_CU_LAUNCHED("gelu backward");
  return ZCK_OK;
}

// ---- residual

__global__ void zck_k_residual_fwd(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = __fadd_rn(a[i], b[i]);
}

__global__ void zck_k_residual_bwd(float *da, float *db, const float *dout, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float d = dout[i];
    da[i] = __fadd_rn(da[i], d);
    db[i] = __fadd_rn(db[i], d);
  }
}

extern "C" zck_status zck_cuda_residual_forward(float *out, const float *a, const float *b, size_t n, void *stream) {
  if (!n) return ZCK_OK;
  zck_k_residual_fwd<<<zck__grid_stride(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(out, a, b, n);
  ZCK_CU_LAUNCHED("residual forward");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_residual_backward(float *da, float *db, const float *dout, size_t n, void *stream) {
  if (!n) return ZCK_OK;
  zck_k_residual_bwd<<<zck__grid_stride(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(da, db, dout, n);
  ZCK_CU_LAUNCHED("residual backward");
  return ZCK_OK;
}

// ---- softmax cross-entropy: one block of 256 threads per row

#define ZCK_XENT_THREADS 256

// Block-wide reduction in a fixed tree (warp butterflies, then warp 0 over the warps).
template <bool MAX>
__device__ float zck__block_reduce(float v, float *shared) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = MAX ? zck__warp_max(v) : zck__warp_sum(v);
  __syncthreads(); /* shared may still be read from a previous call */
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float r = lane < nw ? shared[lane] : (MAX ? -INFINITY : 0.0f);
  return MAX ? zck__warp_max(r) : zck__warp_sum(r);
}

__global__ void zck_k_xent_fwd(float *probs, float *losses, const float *logits, const int *targets, int V) {
  __shared__ float shared[32];
  size_t row = blockIdx.x;
  const float *z = logits + row * V;
  float *p = probs + row * V;
  float mx = -INFINITY;
  for (int v = threadIdx.x; v < V; v += blockDim.x) mx = fmaxf(mx, z[v]);
  mx = zck__block_reduce<true>(mx, shared);
  float s = 0.0f;
  for (int v = threadIdx.x; v < V; v += blockDim.x) {
    float e = expf(__fsub_rn(z[v], mx));
    p[v] = e;
    s = __fadd_rn(s, e);
  }
  s = zck__block_reduce<false>(s, shared);
  float inv = __fdiv_rn(1.0f, s);
  for (int v = threadIdx.x; v < V; v += blockDim.x) p[v] = __fmul_rn(p[v], inv);
  if (targets) {
    __syncthreads(); /* p[target] may have been written by another thread */
    if (threadIdx.x == 0) losses[row] = -logf(p[targets[row]]);
  }
}

__global__ void zck_k_xent_bwd(float *dlogits, const float *probs, const int *targets, int BT, int V, float dloss) {
  size_t n = (size_t)BT * V;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    size_t bt = i / V;
    int v = (int)(i % V);
    float ind = v == targets[bt] ? 1.0f : 0.0f;
    dlogits[i] = __fmul_rn(__fsub_rn(probs[i], ind), dloss);
  }
}

extern "C" zck_status zck_cuda_softmax_xent_forward(float *probs, float *losses, const float *logits,
                                                    const int *targets, int BT, int V, void *stream) {
  ZCK_TRY(zck__check_dims("softmax cross-entropy", BT, V));
  if (!BT || !V) return ZCK_OK;
  zck_k_xent_fwd<<<(unsigned)BT, ZCK_XENT_THREADS, 0, ZCK_CU_STREAM(stream)>>>(probs, losses, logits, targets, V);
  ZCK_CU_LAUNCHED("softmax cross-entropy forward");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_softmax_xent_backward(float *dlogits, const float *probs, const int *targets, int BT,
                                                     int V, float dloss, void *stream) {
  ZCK_TRY(zck__check_dims("softmax cross-entropy", BT, V));
  if (!BT || !V) return ZCK_OK;
  size_t n = (size_t)BT * V;
  zck_k_xent_bwd<<<zck__grid_stride(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(dlogits, probs, targets, BT, V, dloss);
  ZCK_CU_LAUNCHED("softmax cross-entropy backward");
  return ZCK_OK;
}

// ---- bias helpers of the matmuls (blas.cu)

__global__ void zck_k_bias_add(float *out, const float *b, int BT, int OC) {
  size_t n = (size_t)BT * OC;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = __fadd_rn(out[i], b[i % OC]);
}

// db[j] += sum over rows of dout[bt, j], rows in order (the CPU's order).
__global__ void zck_k_colsum_add(float *db, const float *dout, int BT, int OC) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= OC) return;
  float acc = db[j];
  for (int bt = 0; bt < BT; bt++) acc = __fadd_rn(acc, dout[(size_t)bt * OC + j]);
  db[j] = acc;
}

zck_status zck__bias_add(float *out, const float *b, int BT, int OC, cudaStream_t stream) {
  size_t n = (size_t)BT * OC;
  if (!n) return ZCK_OK;
  zck_k_bias_add<<<zck__grid_stride(n, 256), 256, 0, stream>>>(out, b, BT, OC);
  ZCK_CU_LAUNCHED("bias add");
  return ZCK_OK;
}

zck_status zck__colsum_add(float *db, const float *dout, int BT, int OC, cudaStream_t stream) {
  if (!BT || !OC) return ZCK_OK;
  zck_k_colsum_add<<<zck__col_blocks(OC), 128, 0, stream>>>(db, dout, BT, OC);
  ZCK_CU_LAUNCHED("bias gradient");
  return ZCK_OK;
}
