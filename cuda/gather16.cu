// gather16.cu: the on-save 16-bit gather's GPU path (the plan and the host path are in
// gather_plan.c).
//
// Two device staging buffers, two page-locked host buffers, two streams. Bucket b is
// converted into device buffer b%2 on stream b%2 and copied to host buffer b%2; while that
// runs, the host hands bucket b-1 to the writer. Bucket b+1 reuses buffer (b-1)%2 only
// after bucket b-1 was written. So casting, the PCIe copy and the file write overlap, and
// memory is 2 x bucket bytes on each side whatever the model size.
//
// It starts with a device synchronize (the sources may have been written on any stream)
// and frees page-locked memory (cudaFreeHost synchronizes the device): the caller drains
// its asynchronous NCCL collectives first (samples/engine/dzero.c's cu_gather16 waits for
// the rank's streams with zck_comm_cuda_wait), since a device-wide synchronize with an
// NCCL kernel in flight can deadlock. The device staging is stream-ordered.
#include "common.cuh"

static zck_status g16_check_device_srcs(const zck_gather_plan *p, const zck_gather_src *srcs, int device) {
  for (size_t i = 0; i < p->n_srcs; i++) {
    if (!srcs[i].numel) continue;
    cudaPointerAttributes at;
    cudaError_t e = cudaPointerGetAttributes(&at, srcs[i].data);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return zck__fail(ZCK_ERR_INVALID_ARG, "gather16: source %zu: not device memory (%s)", i, cudaGetErrorString(e));
    }
    bool ok = (at.type == cudaMemoryTypeDevice && at.device == device) || at.type == cudaMemoryTypeManaged;
    ZCK_FAIL_IF(!ok, ZCK_ERR_INVALID_ARG, "gather16: source %zu is not in the memory of device %d", i, device);
  }
  return ZCK_OK;
}

// Queues bucket b's conversions into d_stage on stream st.
static zck_status g16_stage(const zck_gather_plan *p, size_t b, const zck_gather_src *srcs, uint8_t *d_stage,
                            cudaStream_t st) {
  size_t osz = zck_dtype_size(p->out_dtype);
  const zck_gather_bucket *bk = &p->buckets[b];
  for (size_t i = 0; i < bk->n_items; i++) {
    const zck_gather_item *it = &p->items[bk->first_item + i];
    zck_dtype sd = p->src_dtype[it->src];
    const uint8_t *src = (const uint8_t *)srcs[it->src].data + it->src_off * zck_dtype_size(sd);
    uint8_t *dst = d_stage + it->stage_off * osz;
    if (sd == p->out_dtype)
      ZCK_CU(cudaMemcpyAsync(dst, src, (size_t)it->count * osz, cudaMemcpyDeviceToDevice, st),
             "gather16: stage %llu elements", (unsigned long long)it->count);
    else if (sd == ZCK_F32)
      ZCK_TRY(zck_cuda_f32_to_bf16((const float *)src, (uint16_t *)dst, (size_t)it->count, (void *)st));
    else
      ZCK_TRY(zck_cuda_bf16_to_f32((const uint16_t *)src, (float *)dst, (size_t)it->count, (void *)st));
  }
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_gather16_to_host(const zck_gather_plan *p, const zck_gather_src *srcs,
                                                zck_gather_write_fn write, void *ctx) {
  ZCK_TRY(zck__gather_check_srcs(p, srcs));
  if (!p->n_buckets) return ZCK_OK;
  int device = 0;
  ZCK_CU(cudaGetDevice(&device), "gather16: current device");
  ZCK_TRY(g16_check_device_srcs(p, srcs, device));
  size_t osz = zck_dtype_size(p->out_dtype);
  uint64_t most = 0;
  for (size_t b = 0; b < p->n_buckets; b++)
    if (p->buckets[b].count > most) most = p->buckets[b].count;
  size_t bytes = (size_t)(most * osz);
  uint8_t *d_stage[2] = {NULL, NULL}, *h_stage[2] = {NULL, NULL};
  cudaStream_t st[2] = {NULL, NULL};
  cudaEvent_t done[2] = {NULL, NULL};
  zck_status s = ZCK_OK;
  for (int i = 0; i < 2 && s == ZCK_OK; i++) {
    cudaError_t e = cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMallocAsync((void **)&d_stage[i], bytes, st[i]);
    if (e == cudaSuccess) e = cudaMallocHost(&h_stage[i], bytes);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done[i], cudaEventDisableTiming);
    if (e != cudaSuccess)
      s = zck__fail(zck__cuda_status(e), "gather16: staging buffers of %zu bytes: %s", bytes, cudaGetErrorString(e));
  }
  /* the sources may have been written on any stream of this device */
  if (s == ZCK_OK) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess) s = zck__fail(zck__cuda_status(e), "gather16: wait for the device: %s", cudaGetErrorString(e));
  }
  for (size_t b = 0; b <= p->n_buckets && s == ZCK_OK; b++) {
    if (b < p->n_buckets) {
      int i = (int)(b % 2);
      s = g16_stage(p, b, srcs, d_stage[i], st[i]);
      if (s != ZCK_OK) break;
      cudaError_t e = cudaMemcpyAsync(h_stage[i], d_stage[i], (size_t)(p->buckets[b].count * osz),
                                      cudaMemcpyDeviceToHost, st[i]);
      if (e == cudaSuccess) e = cudaEventRecord(done[i], st[i]);
      if (e != cudaSuccess) {
        s = zck__fail(zck__cuda_status(e), "gather16: bucket %zu: %s", b, cudaGetErrorString(e));
        break;
      }
    }
    if (b >= 1) {
      int j = (int)((b - 1) % 2);
      cudaError_t e = cudaEventSynchronize(done[j]);
      if (e != cudaSuccess) {
        s = zck__fail(zck__cuda_status(e), "gather16: bucket %zu: %s", b - 1, cudaGetErrorString(e));
        break;
      }
      s = zck__gather_write_bucket(p, b - 1, h_stage[j], write, ctx);
    }
  }
  for (int i = 0; i < 2; i++) {
    if (st[i]) {
      if (d_stage[i]) cudaFreeAsync(d_stage[i], st[i]);
      cudaStreamSynchronize(st[i]); /* nothing may still write into the buffers freed below */
      cudaStreamDestroy(st[i]);
    }
    if (done[i]) cudaEventDestroy(done[i]);
    if (h_stage[i]) cudaFreeHost(h_stage[i]);
  }
  cudaGetLastError(); /* what failed here is in s; nothing stale for the next launch check */
  return s;
}
