/* dzero.c: the cuda device backend of the ZeRO state (see dzero.h: kernels and copies on
 * the rank's selected stream, its comm stream under overlap_comm), and the helpers zero.c
 * shares between the backends. (The sim backend is dzero_sim.c.) */
#include "dzero.h"

#include "optim.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static zck_status cu_wrap(ze_dzero *d);
static void cu_unwrap(ze_dzero *d);

// ---- lifetime and helpers

zck_status ze_dzero_new(const ze_dzero_opts *o, int stage, ze_dzero **out) {
  *out = NULL;
  ZCK_FAIL_IF(!o->ops || !o->comm, ZCK_ERR_INVALID_ARG, "device ZeRO state: no device backend or communicator");
  ze_dzero *d = zck__calloc(1, sizeof *d);
  if (!d) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  d->o = *o;
  d->opt_host = o->offload_optimizer;
  d->lp_host = o->offload_param && stage == 3;
  zck_status s = ZCK_OK;
  if (o->ops == &ze_dev_ops_sim && !o->ctx) { /* the sim's per-rank context */
    ze_sim *sim = NULL;
    s = ze_sim_new(&sim);
    d->o.ctx = d->own_ctx = sim;
  } else if (o->ops == &ze_dev_ops_cuda) {
    s = cu_wrap(d);
  }
  /* overlap_comm: the comm stream, where the backend has one */
  if (s == ZCK_OK && o->overlap_comm && o->ops->start) {
    s = o->ops->start(d->o.ctx, o->sim_delay_us);
    d->overlap = s == ZCK_OK;
  }
  if (s != ZCK_OK) {
    ze_dzero_free(d);
    return s;
  }
  *out = d;
  return ZCK_OK;
}

void ze_dzero_free(ze_dzero *d) {
  if (!d) return;
  ze_sim_free(d->own_ctx);
  cu_unwrap(d);
  free(d);
}

zck_status ze_coll_run(zck_comm *c, const ze_coll *a) {
  switch (a->kind) {
  case ZE_COLL_ALL_GATHER: return c->all_gather(c, a->send, a->recv, a->count, a->dt);
  case ZE_COLL_REDUCE_SCATTER: return c->reduce_scatter(c, a->send, a->recv, a->count, a->dt, ZCK_COMM_SUM);
  case ZE_COLL_ALL_REDUCE: return c->all_reduce(c, a->send, a->recv, a->count, a->dt, ZCK_COMM_SUM);
  }
  return zck__fail(ZCK_ERR_INTERNAL, "unknown collective %d", (int)a->kind);
}

void *ze_dzero_host_alloc(ze_dzero *d, size_t bytes, bool pinned) {
  void *p = NULL;
  if (!pinned) return zck__calloc(bytes ? bytes : 1, 1);
  return d->o.ops->host_alloc(d->o.ctx, &p, bytes) == ZCK_OK ? p : NULL;
}

void ze_dzero_host_free(ze_dzero *d, void *p, bool pinned) {
  if (!p) return;
  if (pinned)
    d->o.ops->host_free(d->o.ctx, p);
  else
    free(p);
}

zck_store ze_dzero_store(const ze_dzero *d, void *mem, zck_dtype dt, uint64_t numel, const char *name) {
  const ze_dev_ops *o = d->o.ops;
  bool four = zck_dtype_size(dt) == 4;
  return zck_store_callback(four ? o->read4 : o->read2, four ? o->write4 : o->write2, mem, dt, numel, name);
}

void ze_dzero_sample(ze_dzero *d) {
  uint64_t u = d->o.ops->used ? d->o.ops->used(d->o.ctx) : 0;
  if (u > d->used_peak) d->used_peak = u;
}

void ze_dzero_adamw_host(float *param, float *grad, float *exp_avg, float *exp_avg_sq, size_t n,
                         const zck_cuda_adamw_args *a) {
  float cf = (float)a->clip;
  if (a->clip != 1.0)
    for (size_t i = 0; i < n; i++) grad[i] *= cf;
  ze_adamw_hp h = {a->lr, a->beta1, a->beta2, a->eps, a->weight_decay};
  ze_adamw_step(param, grad, exp_avg, exp_avg_sq, n, &h, a->step);
  if (a->zero_grad) memset(grad, 0, n * sizeof *grad);
  if (a->d_lp_out) zck_convert(a->lp_dtype, a->d_lp_out, ZCK_F32, param, n);
}

#define ZE_STAGE_ELEMS ((size_t)1 << 20)

zck_status ze_dzero_lp_from_master(ze_dzero *d, void *lp, bool lp_host, zck_dtype lp_dt, const float *fp32,
                                   bool fp32_host, size_t n) {
  size_t es = zck_dtype_size(lp_dt);
  if (!lp_host && !fp32_host) return ze_dzero_convert(d, lp_dt, lp, ZCK_F32, fp32, n);
  ZCK_TRY(ze_dzero_sync(d)); /* the host side may have been written by a copy */
  if (lp_host && fp32_host) {
    zck_convert(lp_dt, lp, ZCK_F32, fp32, n);
    return ZCK_OK;
  }
  /* one side on the device: through a host buffer, a chunk at a time, rounded on the host */
  size_t chunk = n < ZE_STAGE_ELEMS ? n : ZE_STAGE_ELEMS;
  size_t bytes = chunk * (fp32_host ? es : sizeof(float));
  bool pin = fp32_host ? d->o.pin_optimizer : d->o.pin_param;
  uint8_t *stage = ze_dzero_host_alloc(d, bytes, pin);
  if (!stage) return zck__fail(ZCK_ERR_NO_MEMORY, "out of host memory for a %zu-byte staging buffer", bytes);
  ze_mem_add(&d->host, ZE_MEM_BUCKETS, bytes);
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < n && s == ZCK_OK; i += chunk) {
    size_t k = n - i < chunk ? n - i : chunk;
    if (fp32_host) { /* master on the host, lp on the device */
      zck_convert(lp_dt, stage, ZCK_F32, fp32 + i, k);
      s = ze_dzero_copy(d, (uint8_t *)lp + i * es, stage, k * es);
    } else { /* master on the device, lp on the host */
      s = ze_dzero_copy(d, stage, fp32 + i, k * sizeof(float));
    }
    if (s == ZCK_OK) s = ze_dzero_sync(d);
    if (s == ZCK_OK && !fp32_host) zck_convert(lp_dt, (uint8_t *)lp + i * es, ZCK_F32, stage, k);
  }
  ze_mem_sub(&d->host, ZE_MEM_BUCKETS, bytes);
  ze_dzero_host_free(d, stage, pin);
  return s;
}

// ---- cuda: ctx is a cu_rank around the rank's zck_cuda_ctx (ze_dzero_new makes it)

typedef struct cu_rank {
  zck_cuda_ctx *cu;
  zck_comm *dcomm;             /* the device communicator: waits poll its health */
  void *comm;                  /* overlap_comm: the second stream (NULL: none) */
  int sel;                     /* ZE_STREAM_*: where the operations below are queued */
} cu_rank;

static zck_cuda_ctx *cu_ctx(void *ctx) { return ((cu_rank *)ctx)->cu; }
static void *cu_stream(void *ctx) {
  cu_rank *r = ctx;
  return r->sel == ZE_STREAM_COMM && r->comm ? r->comm : zck_cuda_ctx_stream(r->cu);
}

static zck_status cu_wrap(ze_dzero *d) {
  cu_rank *r = zck__calloc(1, sizeof *r);
  if (!r) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  r->cu = d->o.ctx;
  r->dcomm = d->o.comm;
  d->o.ctx = d->own_cu = r;
  return ZCK_OK;
}

/* Waits for the rank's streams (the comm stream first: the compute stream may wait for its
 * events). Through the communicator, never a plain stream synchronize: NCCL work queued
 * on the comm stream (or waited for by the compute stream) hangs for ever when a peer is
 * gone, while zck_comm_cuda_wait polls NCCL's error and the timeout and aborts. */
static zck_status cu_wait_streams(cu_rank *r) {
  if (r->comm) ZCK_TRY(zck_comm_cuda_wait(r->dcomm, r->comm));
  return zck_comm_cuda_wait(r->dcomm, zck_cuda_ctx_stream(r->cu));
}

/* A wait in a cleanup (a free): when it fails it has aborted the communicator, and the
 * rank's next collective or wait reports that; the error the caller may be reporting
 * meanwhile is kept. */
static void cu_wait_quiet(cu_rank *r, bool streams) {
  char keep[1024];
  snprintf(keep, sizeof keep, "%s", zck_last_error());
  /* streams: both of the rank's; else only the collectives queued without waiting */
  zck_status s = streams ? cu_wait_streams(r) : zck_comm_cuda_wait(r->dcomm, NULL);
  if (s == ZCK_OK) return;
  if (keep[0])
    (void)zck__fail(s, "%s", keep);
  else
    zck_clear_error();
}

static void cu_unwrap(ze_dzero *d) {
  cu_rank *r = d->own_cu;
  if (!r) return;
  if (r->comm) {
    /* a failed wait aborted the communicator: its kernels no longer wait, and the plain
     * synchronize below only keeps the stream's work from outliving the buffers */
    cu_wait_quiet(r, true);
    (void)zck_cuda_stream_sync(r->comm);
    zck_cuda_stream_destroy(r->comm);
  }
  free(r);
}

static zck_status cu_alloc(void *ctx, void **p, size_t bytes) {
  ZCK_TRY(zck_cuda_malloc_async(p, bytes, cu_stream(ctx)));
  zck_status s = zck_cuda_memset_async(*p, 0, bytes, cu_stream(ctx));
  if (s != ZCK_OK) {
    zck_cuda_free_async(*p, cu_stream(ctx));
    *p = NULL;
  }
  return s;
}
static void cu_free(void *ctx, void *p) { zck_cuda_free_async(p, cu_stream(ctx)); }
static zck_status cu_host_alloc(void *ctx, void **p, size_t bytes) {
  (void)ctx;
  ZCK_TRY(zck_cuda_host_alloc(p, bytes ? bytes : 1));
  memset(*p, 0, bytes);
  return ZCK_OK;
}
static void cu_host_free(void *ctx, void *p) {
  /* cudaFreeHost synchronizes the device, which can deadlock with an NCCL kernel in
   * flight: the collectives queued without waiting are drained first */
  cu_wait_quiet(ctx, false);
  zck_cuda_host_free(p);
}
static zck_status cu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  return zck_cuda_memcpy_async(dst, src, bytes, cu_stream(ctx));
}
static zck_status cu_zero(void *ctx, void *p, size_t bytes) { return zck_cuda_memset_async(p, 0, bytes, cu_stream(ctx)); }
static zck_status cu_convert(void *ctx, zck_dtype dst_dt, void *dst, zck_dtype src_dt, const void *src, size_t n) {
  if (dst_dt == src_dt) return zck_cuda_memcpy_async(dst, src, n * zck_dtype_size(dst_dt), cu_stream(ctx));
  if (dst_dt == ZCK_BF16 && src_dt == ZCK_F32) return zck_cuda_f32_to_bf16(src, dst, n, cu_stream(ctx));
  if (dst_dt == ZCK_F32 && src_dt == ZCK_BF16) return zck_cuda_bf16_to_f32(src, dst, n, cu_stream(ctx));
  return zck__fail(ZCK_ERR_UNSUPPORTED, "cuda: no %s -> %s conversion", zck_dtype_name(src_dt), zck_dtype_name(dst_dt));
}
static zck_status cu_div(void *ctx, float *dst, const float *src, size_t n, float divisor) {
  return zck_cuda_div_f32(dst, src, n, divisor, cu_stream(ctx));
}
static zck_status cu_add(void *ctx, float *acc, const float *src, size_t n) {
  return zck_cuda_add_f32(acc, src, n, cu_stream(ctx));
}
static zck_status cu_sumsq(void *ctx, const float *x, size_t n, double *acc) {
  double v = 0.0;
  /* the sum synchronizes its stream: the collectives it may wait for are waited for here,
   * with the communicator's checks, so the plain synchronize only waits for the sum */
  ZCK_TRY(zck_comm_cuda_wait(((cu_rank *)ctx)->dcomm, cu_stream(ctx)));
  ZCK_TRY(zck_cuda_sumsq_f64(x, n, &v, cu_stream(ctx)));
  *acc += v;
  return ZCK_OK;
}
static zck_status cu_adamw(void *ctx, float *param, float *grad, float *exp_avg, float *exp_avg_sq, size_t n,
                           const zck_cuda_adamw_args *a) {
  return zck_cuda_adamw(param, grad, exp_avg, exp_avg_sq, n, a, cu_stream(ctx));
}
static zck_status cu_sync(void *ctx) { return cu_wait_streams(ctx); }
/* The callback stores: synchronous copies on the thread of a saver or loader, with only
 * the array for context. They do not rely on the rank's streams being blocking streams
 * (ordered with the legacy default stream that a plain cudaMemcpy uses):
 *  - before: the engine synchronizes the rank (ze_dzero_sync, which waits for both of
 *    its streams) before the stores are used: ze_ckpt_save syncs before the savers read,
 *    and a restore clears each array with ze_zero_clear, which syncs, before it loads;
 *  - after: zck_cuda_memcpy returns only once the copy has landed (it waits for the
 *    legacy stream of the array's device), so work the rank queues later sees a load.
 * Keep both if these change: a store used while kernels on the array may still run on a
 * non-blocking stream would race with them. */
static zck_status cu_read4(void *ctx, void *dst, uint64_t off, uint64_t count) {
  return zck_cuda_memcpy(dst, (const uint8_t *)ctx + off * 4, (size_t)count * 4);
}
static zck_status cu_read2(void *ctx, void *dst, uint64_t off, uint64_t count) {
  return zck_cuda_memcpy(dst, (const uint8_t *)ctx + off * 2, (size_t)count * 2);
}
static zck_status cu_write4(void *ctx, const void *src, uint64_t off, uint64_t count) {
  return zck_cuda_memcpy((uint8_t *)ctx + off * 4, src, (size_t)count * 4);
}
static zck_status cu_write2(void *ctx, const void *src, uint64_t off, uint64_t count) {
  return zck_cuda_memcpy((uint8_t *)ctx + off * 2, src, (size_t)count * 2);
}
static zck_status cu_gather16(void *ctx, const zck_gather_plan *p, const zck_gather_src *srcs, zck_gather_write_fn write,
                              void *wctx) {
  ZCK_TRY(zck_cuda_set_device(zck_cuda_ctx_device(cu_ctx(ctx))));
  /* the gather synchronizes the device (and may free page-locked memory): never with an
   * NCCL kernel of this rank in flight */
  ZCK_TRY(cu_wait_streams(ctx));
  return zck_cuda_gather16_to_host(p, srcs, write, wctx);
}
static uint64_t cu_used(void *ctx) {
  size_t fr = 0, total = 0;
  return zck_cuda_mem_info(zck_cuda_ctx_device(cu_ctx(ctx)), &fr, &total) == ZCK_OK ? (uint64_t)(total - fr) : 0;
}
static zck_status cu_start(void *ctx, unsigned delay_us) {
  (void)delay_us;
  cu_rank *r = ctx;
  if (r->comm) return ZCK_OK;
  ZCK_TRY(zck_cuda_set_device(zck_cuda_ctx_device(r->cu)));
  return zck_cuda_stream_create(&r->comm);
}
static int cu_select(void *ctx, int stream) {
  cu_rank *r = ctx;
  int prev = r->sel;
  r->sel = stream;
  return prev;
}
static zck_status cu_event_new(void *ctx, void **ev) {
  ZCK_TRY(zck_cuda_set_device(zck_cuda_ctx_device(cu_ctx(ctx))));
  return zck_cuda_event_create(ev);
}
static void cu_event_free(void *ctx, void *ev) {
  (void)ctx;
  zck_cuda_event_destroy(ev);
}
static zck_status cu_record(void *ctx, void *ev) { return zck_cuda_event_record(ev, cu_stream(ctx)); }
static zck_status cu_wait(void *ctx, void *ev) { return zck_cuda_stream_wait_event(cu_stream(ctx), ev); }
static int cu_query(void *ctx, void *ev) {
  (void)ctx;
  return zck_cuda_event_query(ev);
}
/* The collective on the selected stream. On the comm stream NCCL's is queued and not
 * waited for (what follows on that stream is ordered after it); on the compute stream it
 * runs as without overlap (cuda_engine.c set the communicator's stream to that one). */
static zck_status cu_coll(void *ctx, zck_comm *c, const ze_coll *a) {
  cu_rank *r = ctx;
  if (r->sel != ZE_STREAM_COMM || !r->comm) return ze_coll_run(c, a);
  ZCK_TRY(zck_comm_cuda_set_stream(c, r->comm));
  zck_status s = zck_comm_cuda_set_async(c, 1);
  if (s == ZCK_OK) s = ze_coll_run(c, a);
  zck_status t = zck_comm_cuda_set_async(c, 0);
  if (s == ZCK_OK) s = t;
  t = zck_comm_cuda_set_stream(c, zck_cuda_ctx_stream(r->cu));
  return s == ZCK_OK ? t : s;
}

const ze_dev_ops ze_dev_ops_cuda = {
    .name = "cuda", .alloc = cu_alloc, .free = cu_free, .host_alloc = cu_host_alloc, .host_free = cu_host_free,
    .copy = cu_copy, .zero = cu_zero, .convert = cu_convert, .div = cu_div, .add = cu_add,
    .sumsq = cu_sumsq, .adamw = cu_adamw, .sync = cu_sync, .read4 = cu_read4, .read2 = cu_read2,
    .write4 = cu_write4, .write2 = cu_write2, .gather16 = cu_gather16, .used = cu_used,
    .start = cu_start, .select = cu_select, .event_new = cu_event_new, .event_free = cu_event_free,
    .record = cu_record, .wait = cu_wait, .query = cu_query, .coll = cu_coll};
