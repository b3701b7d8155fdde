// device.cu: device discovery, memory and streams, rank contexts, and the fp32 <-> bf16
// casts used by the on-save gather and the optimizer.
#include "common.cuh"

// ---- discovery

extern "C" int zck_cuda_built(void) { return 1; }

extern "C" int zck_cuda_has_nccl(void) { return ZCK_HAVE_NCCL ? 1 : 0; }

extern "C" int zck_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* do not leave the error for the next call to find */
    return 0;
  }
  return n;
}

extern "C" zck_status zck_cuda_device_name(int device, char *buf, size_t n) {
  cudaDeviceProp prop;
  if (n) buf[0] = 0;
  ZCK_CU(cudaGetDeviceProperties(&prop, device), "device %d properties", device);
  snprintf(buf, n, "%s", prop.name);
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_set_device(int device) {
  ZCK_CU(cudaSetDevice(device), "select device %d", device);
  return ZCK_OK;
}

// ---- memory and streams

extern "C" zck_status zck_cuda_malloc(void **d_ptr, size_t bytes) {
  *d_ptr = NULL;
  if (!bytes) return ZCK_OK;
  ZCK_CU(cudaMalloc(d_ptr, bytes), "allocate %zu bytes of device memory", bytes);
  return ZCK_OK;
}

/* cudaFree synchronizes the whole device: with an NCCL kernel in flight that can deadlock,
 * so callers drain their asynchronous collectives first (zck_comm_cuda_wait(comm, NULL));
 * memory freed while collectives may run is stream-ordered (zck_cuda_free_async). */
extern "C" void zck_cuda_free(void *d_ptr) {
  if (d_ptr) cudaFree(d_ptr);
}

extern "C" zck_status zck_cuda_malloc_async(void **d_ptr, size_t bytes, void *stream) {
  *d_ptr = NULL;
  if (bytes < 16) bytes = 16; /* a valid pointer for empty arrays too */
  ZCK_CU(cudaMallocAsync(d_ptr, bytes, ZCK_CU_STREAM(stream)), "allocate %zu bytes of device memory", bytes);
  return ZCK_OK;
}

extern "C" void zck_cuda_free_async(void *d_ptr, void *stream) {
  if (d_ptr) cudaFreeAsync(d_ptr, ZCK_CU_STREAM(stream));
}

extern "C" zck_status zck_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  int cur = 0;
  ZCK_CU(cudaGetDevice(&cur), "current device");
  ZCK_CU(cudaSetDevice(device), "select device %d", device);
  cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
  cudaSetDevice(cur);
  ZCK_CU(e, "memory of device %d", device);
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_host_alloc(void **ptr, size_t bytes) {
  *ptr = NULL;
  if (!bytes) return ZCK_OK;
  ZCK_CU(cudaMallocHost(ptr, bytes), "allocate %zu bytes of page-locked host memory", bytes);
  return ZCK_OK;
}

/* cudaFreeHost synchronizes the device too: the same rule as zck_cuda_free. */
extern "C" void zck_cuda_host_free(void *ptr) {
  if (ptr) cudaFreeHost(ptr);
}

/* The device whose memory p is in, -1 for host memory (pageable or page-locked). */
static int zck__ptr_device(const void *p) {
  cudaPointerAttributes at;
  if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return at.type == cudaMemoryTypeDevice || at.type == cudaMemoryTypeManaged ? at.device : -1;
}

/* Synchronous in full, whatever thread calls it and whatever the flags of the streams that
 * use the memory: the copy is issued on the legacy default stream of the device that owns
 * the memory (not of the calling thread's current device, which may be another), and
 * that stream is waited for, so a copy into device memory has landed on return (a plain
 * cudaMemcpy from pageable memory may return before its DMA ends). Ordering before the
 * copy: on that legacy stream, work queued on the device's blocking streams (all of
 * zckpt's) comes first, but callers that read device results still synchronize the
 * streams that wrote them (the engine syncs the rank before its savers run); a device
 * with an NCCL kernel in flight must be drained first (legacy-stream syncs can deadlock). */
extern "C" zck_status zck_cuda_memcpy(void *dst, const void *src, size_t bytes) {
  if (!bytes) return ZCK_OK;
  int dev = zck__ptr_device(dst);
  if (dev < 0) dev = zck__ptr_device(src);
  int cur = -1;
  if (dev >= 0) {
    ZCK_CU(cudaGetDevice(&cur), "copy %zu bytes: current device", bytes);
    if (cur != dev) ZCK_CU(cudaSetDevice(dev), "copy %zu bytes: select device %d", bytes, dev);
  }
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault);
  if (e == cudaSuccess) e = cudaStreamSynchronize(0);
  if (cur >= 0 && cur != dev) cudaSetDevice(cur);
  ZCK_CU(e, "copy %zu bytes", bytes);
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream) {
  if (!bytes) return ZCK_OK;
  ZCK_CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ZCK_CU_STREAM(stream)), "queue a copy of %zu bytes",
         bytes);
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_memset_async(void *d_ptr, int byte, size_t bytes, void *stream) {
  if (!bytes) return ZCK_OK;
  ZCK_CU(cudaMemsetAsync(d_ptr, byte, bytes, ZCK_CU_STREAM(stream)), "queue a memset of %zu bytes", bytes);
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_stream_create(void **stream) {
  cudaStream_t s = NULL;
  *stream = NULL;
  /* A blocking stream: ordered after work on the legacy default stream, and that stream
   * after it. zck_cuda_memcpy's copies run on the legacy stream and so are ordered with
   * this stream's work; nothing else relies on it (the engine's callback stores of
   * samples/engine/dzero.c sync the rank's streams explicitly before the savers run). */
  ZCK_CU(cudaStreamCreate(&s), "create a stream");
  *stream = (void *)s;
  return ZCK_OK;
}

extern "C" void zck_cuda_stream_destroy(void *stream) {
  if (stream) cudaStreamDestroy(ZCK_CU_STREAM(stream));
}

extern "C" zck_status zck_cuda_stream_sync(void *stream) {
  ZCK_CU(cudaStreamSynchronize(ZCK_CU_STREAM(stream)), "wait for the stream");
  return ZCK_OK;
}

// ---- events (overlap_comm: the compute stream waits for the comm stream's work)

extern "C" zck_status zck_cuda_event_create(void **ev) {
  cudaEvent_t e = NULL;
  *ev = NULL;
  ZCK_CU(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "create an event");
  *ev = (void *)e;
  return ZCK_OK;
}

extern "C" void zck_cuda_event_destroy(void *ev) {
  if (ev) cudaEventDestroy((cudaEvent_t)ev);
}

extern "C" zck_status zck_cuda_event_record(void *ev, void *stream) {
  ZCK_CU(cudaEventRecord((cudaEvent_t)ev, ZCK_CU_STREAM(stream)), "record an event");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_stream_wait_event(void *stream, void *ev) {
  ZCK_CU(cudaStreamWaitEvent(ZCK_CU_STREAM(stream), (cudaEvent_t)ev, 0), "make a stream wait for an event");
  return ZCK_OK;
}

extern "C" int zck_cuda_event_query(void *ev) {
  cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) return 0;
  cudaGetLastError();
  return -1;
}

/* Device-wide: never while an NCCL kernel may be in flight (drain first, see
 * zck_comm_cuda_wait). */
extern "C" zck_status zck_cuda_device_sync(void) {
  ZCK_CU(cudaDeviceSynchronize(), "wait for the device");
  return ZCK_OK;
}

// ---- rank contexts

extern "C" void zck_cuda_ctx_free(zck_cuda_ctx *ctx) {
  if (!ctx) return;
  cudaSetDevice(ctx->device);
  if (ctx->blas) cublasDestroy(ctx->blas);
  if (ctx->stream) cudaStreamDestroy(ctx->stream);
  free(ctx);
}

extern "C" zck_status zck_cuda_ctx_create(int device, zck_cuda_ctx **out) {
  *out = NULL;
  ZCK_CU(cudaSetDevice(device), "select device %d", device);
  zck_cuda_ctx *ctx = (zck_cuda_ctx *)calloc(1, sizeof *ctx);
  if (!ctx) return zck__fail(ZCK_ERR_NO_MEMORY, "cuda: no memory for a device context");
  ctx->device = device;
  cudaError_t e = cudaStreamCreate(&ctx->stream);
  if (e != cudaSuccess) {
    zck_cuda_ctx_free(ctx);
    return zck__fail(zck__cuda_status(e), "cuda: create a stream on device %d: %s", device, cudaGetErrorString(e));
  }
  cublasStatus_t b = cublasCreate(&ctx->blas);
  if (b == CUBLAS_STATUS_SUCCESS) b = cublasSetStream(ctx->blas, ctx->stream);
  /* fp32 products stay fp32: no TF32 tensor-op rounding of the inputs */
  if (b == CUBLAS_STATUS_SUCCESS) b = cublasSetMathMode(ctx->blas, CUBLAS_DEFAULT_MATH);
  if (b != CUBLAS_STATUS_SUCCESS) {
    zck_cuda_ctx_free(ctx);
    return zck__fail(b == CUBLAS_STATUS_ALLOC_FAILED ? ZCK_ERR_NO_MEMORY : ZCK_ERR_INTERNAL,
                     "cublas: create a handle on device %d: %s", device, cublasGetStatusString(b));
  }
  *out = ctx;
  return ZCK_OK;
}

extern "C" void *zck_cuda_ctx_stream(const zck_cuda_ctx *ctx) { return (void *)ctx->stream; }
extern "C" int zck_cuda_ctx_device(const zck_cuda_ctx *ctx) { return ctx->device; }

// ---- casts

__global__ void zck_k_f32_to_bf16(const float *src, uint16_t *dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = zck__d_bf16(src[i]);
}

__global__ void zck_k_bf16_to_f32(const uint16_t *src, float *dst, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    dst[i] = zck__d_f32(src[i]);
}

extern "C" zck_status zck_cuda_f32_to_bf16(const float *d_src, uint16_t *d_dst, size_t n, void *stream) {
  if (!n) return ZCK_OK;
  zck_k_f32_to_bf16<<<zck__blocks(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(d_src, d_dst, n);
  ZCK_CU_LAUNCHED("fp32 -> bf16 cast");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_bf16_to_f32(const uint16_t *d_src, float *d_dst, size_t n, void *stream) {
  if (!n) return ZCK_OK;
  zck_k_bf16_to_f32<<<zck__blocks(n, 256), 256, 0, ZCK_CU_STREAM(stream)>>>(d_src, d_dst, n);
  ZCK_CU_LAUNCHED("bf16 -> fp32 cast");
  return ZCK_OK;
}
