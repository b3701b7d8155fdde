// common.cuh: what every .cu file of cuda/ shares: error mapping, launch sizes, and the
// exact-rounding helpers (no contraction) the bit-exact kernels are written with.
#ifndef ZCK_CUDA_COMMON_CUH
#define ZCK_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

extern "C" {
#include "cuda_internal.h"
#include "error.h"
#include "zck_cuda.h"
}

// A CUDA failure as a zckpt status: no device / no driver -> NO_DEVICE, allocation ->
// NO_MEMORY, anything else INTERNAL; the message names what was being done.
static inline zck_status zck__cuda_status(cudaError_t e) {
  switch (e) {
  case cudaSuccess: return ZCK_OK;
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
  case cudaErrorInvalidDevice:
  case cudaErrorDevicesUnavailable:
  case cudaErrorSystemDriverMismatch:
  case cudaErrorCompatNotSupportedOnDevice:
  case cudaErrorStubLibrary: return ZCK_ERR_NO_DEVICE;
  case cudaErrorMemoryAllocation: return ZCK_ERR_NO_MEMORY;
  default: return ZCK_ERR_INTERNAL;
  }
}

#define ZCK_CU(call, ...)                                                                              \
  do {                                                                                                 \
    cudaError_t zck__e = (call);                                                                       \
    if (zck__e != cudaSuccess) {                                                                       \
      char zck__what[160];                                                                             \
      snprintf(zck__what, sizeof zck__what, __VA_ARGS__);                                              \
      return zck__fail(zck__cuda_status(zck__e), "cuda: %s: %s", zck__what, cudaGetErrorString(zck__e)); \
    }                                                                                                  \
  } while (0)

// After a kernel launch: configuration errors are reported now, execution errors by the
// next synchronizing call.
#define ZCK_CU_LAUNCHED(name) ZCK_CU(cudaGetLastError(), "%s kernel", name)

// A rank's context (zck_cuda.h): device, stream, cuBLAS handle bound to that stream.
struct zck_cuda_ctx {
  int device;
  cudaStream_t stream;
  cublasHandle_t blas;
};

#define ZCK_CU_STREAM(s) ((cudaStream_t)(s))

static inline unsigned zck__blocks(size_t n, unsigned threads) {
  size_t b = (n + threads - 1) / threads;
  if (b > 65535u * 8u) b = 65535u * 8u; /* grid-stride loops cover the rest */
  return b ? (unsigned)b : 1u;
}

// bf16 <-> fp32 with c10's bits (zck_convert): RNE, NaN -> 0x7FC0.
__device__ __forceinline__ uint16_t zck__d_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  return (f != f) ? (uint16_t)0x7FC0 : (uint16_t)((u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16);
}
__device__ __forceinline__ float zck__d_f32(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// Warp and block sums in a fixed tree: the same bits whatever the scheduling.
__device__ __forceinline__ float zck__warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float zck__warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// kernels.cu: out[bt, j] += b[j]; db[j] += sum over bt of dout[bt, j] (rows in order).
zck_status zck__bias_add(float *out, const float *b, int BT, int OC, cudaStream_t stream);
zck_status zck__colsum_add(float *db, const float *dout, int BT, int OC, cudaStream_t stream);
// comm_device.cu: the stream a cuda-local rank's collectives wait for (NULL: the device).
zck_status zck__cuda_local_set_stream(zck_comm *c, void *stream);
int zck__cuda_local_device(const zck_comm *c);

#endif
