// gather16.cu: the on-save 16-bit gather's GPU path (the plan and the host path are in
// gather_plan.c).
//
// Two device staging buffers, two page-locked host buffers, two streams. Bucket b is
// converted into device buffer b%2 on stream b%2 and copied to host buffer b%2; while that
// runs, the host hands bucket b-1 to the writer. Bucket b+1 reuses buffer (b-1)%2 only
// after bucket b-1 was written. So casting, the PCIe copy and the file write overlap, and
// memory is 2 x bucket bytes on each side whatever the model size.
//
// A bucket is converted by ONE kernel launch over a table of pieces (at most G16_PIECE
// elements of one item each), not a launch per item: a ZeRO-3 bucket holds an item per
// parameter per rank (thousands), and a launch per item made the launches, not the PCIe
// copy, the bound (8.3 GB/s of 55 on an H200, bench_gpu.sh).
//
// The staging memory is kept for the next call (one set per process; a second caller while
// it is in use gets its own): pinning 2 x bucket bytes of host memory costs about as much
// as copying them, so a save that pinned afresh each time ran at a fraction of the copy's
// bandwidth. What stays held is bounded by the largest bucket asked for.
//
// It starts with a device synchronize (the sources may have been written on any stream):
// the caller drains its asynchronous NCCL collectives first (samples/engine/dzero.c's
// cu_gather16 waits for the rank's streams with zck_comm_cuda_wait), since a device-wide
// synchronize with an NCCL kernel in flight can deadlock. Freeing staging memory that is
// not kept (cudaFreeHost) synchronizes the device too.
#include "common.cuh"

#include <pthread.h>
#include <string.h>

#define G16_PIECE 16384u
enum { G16_COPY2, G16_COPY4, G16_F32_TO_BF16, G16_BF16_TO_F32 };

typedef struct g16_piece {
  const void *src;
  uint64_t stage_off; /* output elements */
  uint32_t count;
  uint32_t kind;
} g16_piece;

__global__ void g16_k_stage(const g16_piece *pieces, uint8_t *stage) {
  g16_piece p = pieces[blockIdx.x];
  switch (p.kind) {
  case G16_COPY2: {
    const uint16_t *s = (const uint16_t *)p.src;
    uint16_t *d = (uint16_t *)stage + p.stage_off;
    for (uint32_t i = threadIdx.x; i < p.count; i += blockDim.x) d[i] = s[i];
    break;
  }
  case G16_COPY4: {
    const uint32_t *s = (const uint32_t *)p.src;
    uint32_t *d = (uint32_t *)stage + p.stage_off;
    for (uint32_t i = threadIdx.x; i < p.count; i += blockDim.x) d[i] = s[i];
    break;
  }
  case G16_F32_TO_BF16: {
    const float *s = (const float *)p.src;
    uint16_t *d = (uint16_t *)stage + p.stage_off;
    for (uint32_t i = threadIdx.x; i < p.count; i += blockDim.x) d[i] = zck__d_bf16(s[i]);
    break;
  }
  default: {
    const uint16_t *s = (const uint16_t *)p.src;
    float *d = (float *)stage + p.stage_off;
    for (uint32_t i = threadIdx.x; i < p.count; i += blockDim.x) d[i] = zck__d_f32(s[i]);
    break;
  }
  }
}

// Staging of one gather: two of each, indexed by bucket parity.
typedef struct g16_staging {
  int device;
  size_t bytes, n_pieces; /* capacity */
  uint8_t *d_stage[2], *h_stage[2];
  g16_piece *h_pieces[2], *d_pieces[2];
  cudaStream_t st[2];
  cudaEvent_t done[2];
} g16_staging;

static void g16_staging_free(g16_staging *g) {
  for (int i = 0; i < 2; i++) {
    if (g->st[i]) {
      cudaStreamSynchronize(g->st[i]); /* nothing may still use the buffers freed below */
      cudaStreamDestroy(g->st[i]);
    }
    if (g->d_stage[i]) cudaFree(g->d_stage[i]);
    if (g->d_pieces[i]) cudaFree(g->d_pieces[i]);
    if (g->done[i]) cudaEventDestroy(g->done[i]);
    if (g->h_stage[i]) cudaFreeHost(g->h_stage[i]);
    if (g->h_pieces[i]) cudaFreeHost(g->h_pieces[i]);
  }
  memset(g, 0, sizeof *g);
  cudaGetLastError();
}

static zck_status g16_staging_alloc(g16_staging *g, int device, size_t bytes, size_t n_pieces) {
  memset(g, 0, sizeof *g);
  g->device = device;
  g->bytes = bytes;
  g->n_pieces = n_pieces;
  cudaError_t e = cudaSuccess;
  for (int i = 0; i < 2 && e == cudaSuccess; i++) {
    e = cudaStreamCreateWithFlags(&g->st[i], cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&g->d_stage[i], bytes);
    if (e == cudaSuccess) e = cudaMalloc((void **)&g->d_pieces[i], n_pieces * sizeof(g16_piece));
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_stage[i], bytes);
    if (e == cudaSuccess) e = cudaMallocHost((void **)&g->h_pieces[i], n_pieces * sizeof(g16_piece));
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&g->done[i], cudaEventDisableTiming);
  }
  if (e == cudaSuccess) return ZCK_OK;
  g16_staging_free(g);
  return zck__fail(zck__cuda_status(e), "gather16: staging buffers of %zu bytes: %s", bytes, cudaGetErrorString(e));
}

// The process's kept staging and whether a gather is using it.
static pthread_mutex_t g16_kept_lock = PTHREAD_MUTEX_INITIALIZER;
static g16_staging g16_kept;
static bool g16_kept_busy;

// Staging of at least `bytes` / `n_pieces` on `device`: the kept set when it is free (grown
// if too small), else a set of the caller's own (*kept false: free it after).
static zck_status g16_staging_take(int device, size_t bytes, size_t n_pieces, g16_staging *out, bool *kept) {
  pthread_mutex_lock(&g16_kept_lock);
  bool mine = !g16_kept_busy;
  if (mine) g16_kept_busy = true;
  pthread_mutex_unlock(&g16_kept_lock);
  *kept = mine;
  if (!mine) return g16_staging_alloc(out, device, bytes, n_pieces);
  if (g16_kept.bytes && (g16_kept.device != device || g16_kept.bytes < bytes || g16_kept.n_pieces < n_pieces)) {
    if (g16_kept.device != device) cudaSetDevice(g16_kept.device);
    g16_staging_free(&g16_kept);
    cudaSetDevice(device);
  }
  zck_status s = ZCK_OK;
  if (!g16_kept.bytes) s = g16_staging_alloc(&g16_kept, device, bytes, n_pieces);
  if (s == ZCK_OK) *out = g16_kept;
  else {
    pthread_mutex_lock(&g16_kept_lock);
    g16_kept_busy = false;
    pthread_mutex_unlock(&g16_kept_lock);
  }
  return s;
}

static void g16_staging_give(g16_staging *g, bool kept) {
  if (!kept) {
    g16_staging_free(g);
    return;
  }
  pthread_mutex_lock(&g16_kept_lock);
  g16_kept_busy = false;
  pthread_mutex_unlock(&g16_kept_lock);
}

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

static size_t g16_bucket_pieces(const zck_gather_plan *p, size_t b) {
  const zck_gather_bucket *bk = &p->buckets[b];
  size_t n = 0;
  for (size_t i = 0; i < bk->n_items; i++) n += (size_t)((p->items[bk->first_item + i].count + G16_PIECE - 1) / G16_PIECE);
  return n;
}

// Bucket b's pieces into `pc` (room for g16_bucket_pieces); returns how many.
static size_t g16_fill_pieces(const zck_gather_plan *p, size_t b, const zck_gather_src *srcs, g16_piece *pc) {
  const zck_gather_bucket *bk = &p->buckets[b];
  size_t n = 0;
  for (size_t i = 0; i < bk->n_items; i++) {
    const zck_gather_item *it = &p->items[bk->first_item + i];
    zck_dtype sd = p->src_dtype[it->src];
    size_t ssz = zck_dtype_size(sd);
    uint32_t kind = sd == p->out_dtype ? (ssz == 2 ? G16_COPY2 : G16_COPY4)
                                       : (sd == ZCK_F32 ? G16_F32_TO_BF16 : G16_BF16_TO_F32);
    for (uint64_t k = 0; k < it->count; k += G16_PIECE) {
      uint64_t c = it->count - k < G16_PIECE ? it->count - k : G16_PIECE;
      pc[n++] = (g16_piece){(const uint8_t *)srcs[it->src].data + (it->src_off + k) * ssz, it->stage_off + k,
                            (uint32_t)c, kind};
    }
  }
  return n;
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
  size_t most_pieces = 0;
  for (size_t b = 0; b < p->n_buckets; b++) {
    if (p->buckets[b].count > most) most = p->buckets[b].count;
    size_t np = g16_bucket_pieces(p, b);
    if (np > most_pieces) most_pieces = np;
  }
  g16_staging g;
  bool kept = false;
  ZCK_TRY(g16_staging_take(device, (size_t)(most * osz), most_pieces ? most_pieces : 1, &g, &kept));
  zck_status s = ZCK_OK;
  /* the sources may have been written on any stream of this device */
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) s = zck__fail(zck__cuda_status(e), "gather16: wait for the device: %s", cudaGetErrorString(e));
  for (size_t b = 0; b <= p->n_buckets && s == ZCK_OK; b++) {
    if (b < p->n_buckets) {
      /* buffer i was last used by bucket b-2, whose copy to the host was waited for */
      int i = (int)(b % 2);
      size_t np = g16_fill_pieces(p, b, srcs, g.h_pieces[i]);
      e = cudaSuccess;
      if (np) {
        e = cudaMemcpyAsync(g.d_pieces[i], g.h_pieces[i], np * sizeof(g16_piece), cudaMemcpyHostToDevice, g.st[i]);
        if (e == cudaSuccess) {
          g16_k_stage<<<(unsigned)np, 256, 0, g.st[i]>>>(g.d_pieces[i], g.d_stage[i]);
          e = cudaGetLastError();
        }
      }
      if (e == cudaSuccess)
        e = cudaMemcpyAsync(g.h_stage[i], g.d_stage[i], (size_t)(p->buckets[b].count * osz), cudaMemcpyDeviceToHost,
                            g.st[i]);
      if (e == cudaSuccess) e = cudaEventRecord(g.done[i], g.st[i]);
      if (e != cudaSuccess) {
        s = zck__fail(zck__cuda_status(e), "gather16: bucket %zu: %s", b, cudaGetErrorString(e));
        break;
      }
    }
    if (b >= 1) {
      int j = (int)((b - 1) % 2);
      e = cudaEventSynchronize(g.done[j]);
      if (e != cudaSuccess) {
        s = zck__fail(zck__cuda_status(e), "gather16: bucket %zu: %s", b - 1, cudaGetErrorString(e));
        break;
      }
      s = zck__gather_write_bucket(p, b - 1, g.h_stage[j], write, ctx);
    }
  }
  /* nothing may still write into the buffers once they are handed back */
  for (int i = 0; i < 2; i++) cudaStreamSynchronize(g.st[i]);
  cudaGetLastError(); /* what failed here is in s; nothing stale for the next launch check */
  g16_staging_give(&g, kept);
  return s;
}
