// pack.cu: partition pack / unpack, many flat ranges in one launch.
//
// The ZeRO loops of the engine move a layout's pieces between the model buffer and a
// group's flat array (pack_group / unpack_group in samples/engine/zero.c): hundreds of
// ranges per group, the same ones every step. The plan uploads them once; a run launches
// one kernel whose blockIdx.y picks the range and whose x blocks stride over it.
#include "common.cuh"
#include "launch.h"

struct zck_cuda_pack_plan {
  zck_cuda_range *d_ranges;
  size_t n;
  uint64_t max_count;
};

extern "C" void zck_cuda_pack_plan_free(zck_cuda_pack_plan *p) {
  if (!p) return;
  if (p->d_ranges) cudaFree(p->d_ranges);
  cudaGetLastError(); /* a failed free must not be reported later as some kernel's error */
  free(p);
}

extern "C" zck_status zck_cuda_pack_plan_create(const zck_cuda_range *ranges, size_t n, zck_cuda_pack_plan **out) {
  *out = NULL;
  zck_cuda_pack_plan *p = (zck_cuda_pack_plan *)calloc(1, sizeof *p);
  if (!p) return zck__fail(ZCK_ERR_NO_MEMORY, "cuda pack: no memory for a plan");
  p->n = n;
  for (size_t i = 0; i < n; i++)
    if (ranges[i].count > p->max_count) p->max_count = ranges[i].count;
  if (n) {
    cudaError_t e = cudaMalloc(&p->d_ranges, n * sizeof *ranges);
    if (e == cudaSuccess) e = cudaMemcpy(p->d_ranges, ranges, n * sizeof *ranges, cudaMemcpyHostToDevice);
    if (e != cudaSuccess) {
      zck_cuda_pack_plan_free(p);
      return zck__fail(zck__cuda_status(e), "cuda: upload %zu pack ranges: %s", n, cudaGetErrorString(e));
    }
  }
  *out = p;
  return ZCK_OK;
}

template <typename S> __device__ __forceinline__ float zck__load(const S *p, uint64_t i);
template <> __device__ __forceinline__ float zck__load<float>(const float *p, uint64_t i) { return p[i]; }
template <> __device__ __forceinline__ float zck__load<uint16_t>(const uint16_t *p, uint64_t i) {
  return zck__d_f32(p[i]);
}
template <typename D> __device__ __forceinline__ void zck__store(D *p, uint64_t i, float v);
template <> __device__ __forceinline__ void zck__store<float>(float *p, uint64_t i, float v) { p[i] = v; }
template <> __device__ __forceinline__ void zck__store<uint16_t>(uint16_t *p, uint64_t i, float v) {
  p[i] = zck__d_bf16(v);
}

template <typename D, typename S>
__global__ void zck_k_pack(D *dst, const S *src, const zck_cuda_range *ranges, size_t first, int reverse,
                           float divisor) {
  zck_cuda_range r = ranges[first + blockIdx.y];
  uint64_t so = reverse ? r.dst_off : r.src_off, d_o = reverse ? r.src_off : r.dst_off;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < r.count; i += (uint64_t)gridDim.x * blockDim.x) {
    float v = zck__load<S>(src, so + i);
    if (divisor != 1.0f) v = __fdiv_rn(v, divisor);
    zck__store<D>(dst, d_o + i, v);
  }
}

// Same dtype, no scaling: raw element copies (any 2- or 4-byte payload, NaN bits kept).
template <typename E>
__global__ void zck_k_pack_raw(E *dst, const E *src, const zck_cuda_range *ranges, size_t first, int reverse) {
  zck_cuda_range r = ranges[first + blockIdx.y];
  uint64_t so = reverse ? r.dst_off : r.src_off, d_o = reverse ? r.src_off : r.dst_off;
  for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < r.count; i += (uint64_t)gridDim.x * blockDim.x)
    dst[d_o + i] = src[so + i];
}

extern "C" zck_status zck_cuda_pack_run(const zck_cuda_pack_plan *p, int reverse, void *d_dst, zck_dtype dst_dtype,
                                        const void *d_src, zck_dtype src_dtype, float divisor, void *stream) {
  bool ok_types = (dst_dtype == ZCK_F32 || dst_dtype == ZCK_BF16) && (src_dtype == ZCK_F32 || src_dtype == ZCK_BF16);
  ZCK_FAIL_IF(!ok_types, ZCK_ERR_INVALID_ARG, "cuda pack: %s -> %s; supported: float32 and bfloat16",
              zck_dtype_name(src_dtype), zck_dtype_name(dst_dtype));
  ZCK_FAIL_IF(!(divisor > 0.0f), ZCK_ERR_INVALID_ARG, "cuda pack: divisor %g", (double)divisor);
  if (!p->n || !p->max_count) return ZCK_OK;
  cudaStream_t st = ZCK_CU_STREAM(stream);
  dim3 block(ZCK_PACK_THREADS);
  for (size_t first = 0; first < p->n; first += ZCK_PACK_RANGES_PER_LAUNCH) {
    size_t k = p->n - first < ZCK_PACK_RANGES_PER_LAUNCH ? p->n - first : ZCK_PACK_RANGES_PER_LAUNCH;
    dim3 grid(zck__pack_grid_x(p->max_count), (unsigned)k);
    bool raw = dst_dtype == src_dtype && divisor == 1.0f;
    if (raw && dst_dtype == ZCK_F32)
      zck_k_pack_raw<uint32_t><<<grid, block, 0, st>>>((uint32_t *)d_dst, (const uint32_t *)d_src, p->d_ranges, first,
                                                       reverse);
    else if (raw)
      zck_k_pack_raw<uint16_t><<<grid, block, 0, st>>>((uint16_t *)d_dst, (const uint16_t *)d_src, p->d_ranges, first,
                                                       reverse);
    else if (dst_dtype == ZCK_F32 && src_dtype == ZCK_F32)
      zck_k_pack<float, float><<<grid, block, 0, st>>>((float *)d_dst, (const float *)d_src, p->d_ranges, first,
                                                       reverse, divisor);
    else if (dst_dtype == ZCK_F32)
      zck_k_pack<float, uint16_t><<<grid, block, 0, st>>>((float *)d_dst, (const uint16_t *)d_src, p->d_ranges, first,
                                                          reverse, divisor);
    else if (src_dtype == ZCK_F32)
      zck_k_pack<uint16_t, float><<<grid, block, 0, st>>>((uint16_t *)d_dst, (const float *)d_src, p->d_ranges, first,
                                                          reverse, divisor);
    else
      zck_k_pack<uint16_t, uint16_t><<<grid, block, 0, st>>>((uint16_t *)d_dst, (const uint16_t *)d_src, p->d_ranges,
                                                             first, reverse, divisor);
    ZCK_CU_LAUNCHED("pack");
  }
  return ZCK_OK;
}
