// device.cu: device discovery and the fp32 -> bf16 cast used by the on-save gather.
#include <cuda_runtime.h>
#include <stdio.h>

#include "zck_cuda.h"

extern "C" zck_status zck__fail(zck_status s, const char *fmt, ...);

extern "C" int zck_cuda_built(void) { return 1; }

extern "C" int zck_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

extern "C" zck_status zck_cuda_device_name(int device, char *buf, size_t n) {
  cudaDeviceProp prop;
  if (n) buf[0] = 0;
  cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return zck__fail(ZCK_ERR_NO_DEVICE, "cuda device %d: %s", device, cudaGetErrorString(e));
  snprintf(buf, n, "%s", prop.name);
  return ZCK_OK;
}

// Round to nearest even on the fp32 bits, NaN -> 0x7FC0: the same bits as c10::BFloat16.
__global__ void zck_k_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    float f = src[i];
    uint32_t u = __float_as_uint(f);
    dst[i] = (f != f) ? (uint16_t)0x7FC0 : (uint16_t)((u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16);
  }
}

extern "C" zck_status zck_cuda_f32_to_bf16(const float *d_src, uint16_t *d_dst, size_t n, void *stream) {
  if (!n) return ZCK_OK;
  unsigned blocks = (unsigned)((n + 255) / 256 > 65535 ? 65535 : (n + 255) / 256);
  zck_k_f32_to_bf16<<<blocks, 256, 0, (cudaStream_t)stream>>>(d_src, d_dst, n);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return zck__fail(ZCK_ERR_NO_DEVICE, "cuda cast kernel: %s", cudaGetErrorString(e));
  return ZCK_OK;
}
