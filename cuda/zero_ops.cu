// zero_ops.cu: the element-wise steps of the ZeRO engine (samples/engine/zero.c) on device
// partitions: averaging before a reduction, adding a reduced bucket into a gradient
// partition, and the sum of squares of the gradient norm. Each float operation is the CPU
// loop's (IEEE round-to-nearest, no contraction), so these two give the same bits as the
// host; the norm's sum runs in double in a fixed order of its own.
#include "common.cuh"

__global__ void zck_k_div_f32(float *dst, const float *src, size_t n, float divisor) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = __fdiv_rn(src[i], divisor);
}

__global__ void zck_k_add_f32(float *acc, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    acc[i] = __fadd_rn(acc[i], src[i]);
}

#define ZCK_SUMSQ_THREADS 1024

// One block: thread t sums elements t, t + 1024, ... in order (double, exact products of
// floats rounded once), then a fixed tree over the 1024 partial sums.
__global__ void zck_k_sumsq_f64(const float *x, size_t n, double *out) {
  __shared__ double part[ZCK_SUMSQ_THREADS];
  double s = 0.0;
  for (size_t i = threadIdx.x; i < n; i += ZCK_SUMSQ_THREADS) {
    double v = (double)x[i];
    s = __dadd_rn(s, __dmul_rn(v, v));
  }
  part[threadIdx.x] = s;
  __syncthreads();
  for (int half = ZCK_SUMSQ_THREADS / 2; half > 0; half >>= 1) {
    if ((int)threadIdx.x < half) part[threadIdx.x] = __dadd_rn(part[threadIdx.x], part[threadIdx.x + half]);
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = part[0];
}

extern "C" zck_status zck_cuda_div_f32(float *d_dst, const float *d_src, size_t n, float divisor, void *stream) {
  ZCK_FAIL_IF(!(divisor > 0.0f), ZCK_ERR_INVALID_ARG, "cuda div: divisor %g", (double)divisor);
  if (!n) return ZCK_OK;
  zck_k_div_f32<<<zck__blocks(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(d_dst, d_src, n, divisor);
  ZCK_CU_LAUNCHED("div");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_add_f32(float *d_acc, const float *d_src, size_t n, void *stream) {
  if (!n) return ZCK_OK;
  zck_k_add_f32<<<zck__blocks(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(d_acc, d_src, n);
  ZCK_CU_LAUNCHED("add");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_sumsq_f64(const float *d_x, size_t n, double *sum, void *stream) {
  *sum = 0.0;
  if (!n) return ZCK_OK;
  cudaStream_t st = ZCK_CU_STREAM(stream);
  double *d_out = NULL;
  ZCK_CU(cudaMallocAsync((void **)&d_out, sizeof(double), st), "sum of squares: result buffer");
  zck_k_sumsq_f64<<<1, ZCK_SUMSQ_THREADS, 0, st>>>(d_x, n, d_out);
  cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpyAsync(sum, d_out, sizeof(double), cudaMemcpyDeviceToHost, st);
  cudaFreeAsync(d_out, st);
  if (e == cudaSuccess) e = cudaStreamSynchronize(st);
  ZCK_CU(e, "sum of squares of %zu elements", n);
  return ZCK_OK;
}
