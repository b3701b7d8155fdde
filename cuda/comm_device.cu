// comm_device.cu: the cuda-local collective backend: W rank threads sharing one device.
//
// NCCL cannot put two ranks of one communicator on the same GPU, yet a single GPU is where
// multi-rank runs are developed and tested. This backend keeps lib/comm_ranks.c's host
// protocol (barriers, rank-order shares) and moves the data with kernels and device copies
// on a per-rank stream. Sums run over ranks 0..W-1 per element exactly as lib/comm_local.c
// does on the host, so for the same inputs both give the same bits.
#include "common.cuh"

#include "comm_rules.h"

struct zck__dev_ranks {
  int device;
  int size;
  cudaStream_t streams[ZCK__RANKS_MAX];
  cudaStream_t user[ZCK__RANKS_MAX];
  bool user_set[ZCK__RANKS_MAX];
};

struct zck__reduce_args {
  const void *srcs[ZCK__RANKS_MAX];
  void *dsts[ZCK__RANKS_MAX];
  int n_src, n_dst;
  size_t src_off, dst_off, n;
  int op;
};

// Sums as the host's C additions give them (lib/comm_ranks.c), NaNs included: CUDA's adder
// makes every NaN 0x7FFFFFFF, the host keeps the NaN operand (and its sign), so a NaN sum
// takes its bits from comm_rules.h's rule. MAX / MIN are the host's comparisons verbatim.
__device__ __forceinline__ float zck__add(float a, float b) {
  return __uint_as_float(zck__f32_sum_fix(__float_as_uint(a), __float_as_uint(b), __float_as_uint(__fadd_rn(a, b))));
}
__device__ __forceinline__ double zck__add(double a, double b) {
  return __longlong_as_double((long long)zck__f64_sum_fix((uint64_t)__double_as_longlong(a),
                                                         (uint64_t)__double_as_longlong(b),
                                                         (uint64_t)__double_as_longlong(__dadd_rn(a, b))));
}
__device__ __forceinline__ int32_t zck__add(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
__device__ __forceinline__ long long zck__add(long long a, long long b) {
  return (long long)((unsigned long long)a + (unsigned long long)b);
}

template <typename T> __device__ __forceinline__ T zck__combine(T acc, T v, int op) {
  return op == ZCK_COMM_SUM ? zck__add(acc, v) : op == ZCK_COMM_MAX ? (v > acc ? v : acc) : (v < acc ? v : acc);
}

// Native element types: accumulate in T, rank order.
template <typename T> __global__ void zck_k_rank_reduce(zck__reduce_args a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < a.n; i += (size_t)gridDim.x * blockDim.x) {
    T acc = ((const T *)a.srcs[0])[a.src_off + i];
    for (int k = 1; k < a.n_src; k++) acc = zck__combine<T>(acc, ((const T *)a.srcs[k])[a.src_off + i], a.op);
    for (int j = 0; j < a.n_dst; j++) ((T *)a.dsts[j])[a.dst_off + i] = acc;
  }
}

// 16-bit floats: accumulate in float, round once (as lib/comm_ranks.c). float16 goes
// through comm_rules.h's conversions (zck_convert's bits, NaN 0x7E00 | sign), not
// cuda_fp16.h's (whose rounding makes a NaN 0x7FFF).
template <bool BF16> __device__ __forceinline__ float zck__half_load(const uint16_t *p, size_t i) {
  if (BF16) return zck__d_f32(p[i]);
  return __uint_as_float(zck__f32_bits_from_f16(p[i]));
}
template <bool BF16> __device__ __forceinline__ uint16_t zck__half_round(float f) {
  if (BF16) return zck__d_bf16(f);
  return zck__f16_from_f32_bits(__float_as_uint(f));
}
template <bool BF16> __global__ void zck_k_rank_reduce_half(zck__reduce_args a) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < a.n; i += (size_t)gridDim.x * blockDim.x) {
    float acc = zck__half_load<BF16>((const uint16_t *)a.srcs[0], a.src_off + i);
    for (int k = 1; k < a.n_src; k++)
      acc = zck__combine<float>(acc, zck__half_load<BF16>((const uint16_t *)a.srcs[k], a.src_off + i), a.op);
    uint16_t h = zck__half_round<BF16>(acc);
    for (int j = 0; j < a.n_dst; j++) ((uint16_t *)a.dsts[j])[a.dst_off + i] = h;
  }
}

static zck_status dev_reduce(void *ctx, int rank, const void *const *srcs, int n_src, size_t src_off,
                             void *const *dsts, int n_dst, size_t dst_off, size_t n, zck_dtype dt, zck_comm_op op) {
  zck__dev_ranks *g = (zck__dev_ranks *)ctx;
  zck__reduce_args a;
  memset(&a, 0, sizeof a);
  for (int k = 0; k < n_src; k++) a.srcs[k] = srcs[k];
  for (int j = 0; j < n_dst; j++) a.dsts[j] = dsts[j];
  a.n_src = n_src;
  a.n_dst = n_dst;
  a.src_off = src_off;
  a.dst_off = dst_off;
  a.n = n;
  a.op = (int)op;
  cudaStream_t st = g->streams[rank];
  unsigned blocks = zck__blocks(n, 256);
  switch (dt) {
  case ZCK_F32: zck_k_rank_reduce<float><<<blocks, 256, 0, st>>>(a); break;
  case ZCK_F64: zck_k_rank_reduce<double><<<blocks, 256, 0, st>>>(a); break;
  case ZCK_I32: zck_k_rank_reduce<int32_t><<<blocks, 256, 0, st>>>(a); break;
  case ZCK_I64: zck_k_rank_reduce<long long><<<blocks, 256, 0, st>>>(a); break;
  case ZCK_BF16: zck_k_rank_reduce_half<true><<<blocks, 256, 0, st>>>(a); break;
  case ZCK_F16: zck_k_rank_reduce_half<false><<<blocks, 256, 0, st>>>(a); break;
  default: return zck__fail(ZCK_ERR_INVALID_ARG, "cuda-local comm: cannot reduce %s", zck_dtype_name(dt));
  }
  ZCK_CU_LAUNCHED("cuda-local reduction");
  return ZCK_OK;
}

static zck_status dev_copy(void *ctx, int rank, void *dst, const void *src, size_t bytes) {
  zck__dev_ranks *g = (zck__dev_ranks *)ctx;
  ZCK_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g->streams[rank]), "cuda-local comm: copy %zu bytes",
         bytes);
  return ZCK_OK;
}

static zck_status dev_enter(void *ctx, int rank) {
  zck__dev_ranks *g = (zck__dev_ranks *)ctx;
  ZCK_CU(cudaSetDevice(g->device), "cuda-local comm: select device %d", g->device);
  if (g->user_set[rank])
    ZCK_CU(cudaStreamSynchronize(g->user[rank]), "cuda-local comm: rank %d: wait for its stream", rank);
  else
    ZCK_CU(cudaDeviceSynchronize(), "cuda-local comm: rank %d: wait for the device", rank);
  return ZCK_OK;
}

static zck_status dev_leave(void *ctx, int rank) {
  zck__dev_ranks *g = (zck__dev_ranks *)ctx;
  ZCK_CU(cudaStreamSynchronize(g->streams[rank]), "cuda-local comm: rank %d: collective", rank);
  return ZCK_OK;
}

static void dev_destroy(void *ctx) {
  zck__dev_ranks *g = (zck__dev_ranks *)ctx;
  if (!g) return;
  cudaSetDevice(g->device);
  for (int r = 0; r < g->size; r++)
    if (g->streams[r]) cudaStreamDestroy(g->streams[r]);
  free(g);
}

extern "C" zck_status zck_comm_cuda_local_create(int nranks, int device, zck_comm **comms) {
  ZCK_FAIL_IF(nranks < 1 || nranks > ZCK__RANKS_MAX, ZCK_ERR_INVALID_ARG, "cuda-local comm: %d ranks; 1 to %d",
              nranks, ZCK__RANKS_MAX);
  ZCK_CU(cudaSetDevice(device), "cuda-local comm: select device %d", device);
  zck__dev_ranks *g = (zck__dev_ranks *)calloc(1, sizeof *g);
  if (!g) return zck__fail(ZCK_ERR_NO_MEMORY, "cuda-local comm: no memory");
  g->device = device;
  g->size = nranks;
  for (int r = 0; r < nranks; r++) {
    cudaError_t e = cudaStreamCreate(&g->streams[r]);
    if (e != cudaSuccess) {
      dev_destroy(g);
      return zck__fail(zck__cuda_status(e), "cuda-local comm: create a stream: %s", cudaGetErrorString(e));
    }
  }
  static const zck__ranks_ops ops = {dev_reduce, dev_copy, dev_enter, dev_leave, dev_destroy};
  zck_status s = zck__ranks_create(nranks, &ops, g, "cuda-local", comms);
  if (s != ZCK_OK) dev_destroy(g);
  return s;
}

zck_status zck__cuda_local_set_stream(zck_comm *c, void *stream) {
  zck__dev_ranks *g = (zck__dev_ranks *)zck__ranks_ops_ctx(c);
  g->user[c->rank] = ZCK_CU_STREAM(stream);
  g->user_set[c->rank] = stream != NULL;
  return ZCK_OK;
}

int zck__cuda_local_device(const zck_comm *c) {
  return ((const zck__dev_ranks *)zck__ranks_ops_ctx((zck_comm *)c))->device;
}
