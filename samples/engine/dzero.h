/* dzero.h: where a rank's ZeRO state lives with --device cuda, and the few memory
 * operations zero.c needs to run its partition math on it.
 *
 * zero.c keeps one copy of the ZeRO logic (partitions, buckets, collectives, the step).
 * With a ze_dzero attached to the rank (ze_zero_rank.dev), its arrays are device memory,
 * except what the DeepSpeed offload keys put in host memory:
 *   offload_optimizer (cpu): fp32 master, exp_avg, exp_avg_sq and gradient partitions in
 *     host memory (page-locked with pin_memory); AdamW runs on the CPU, as DeepSpeed's
 *     CPU Adam does; the 16-bit params stay on the device;
 *   offload_param (cpu, stage 3): the 16-bit partitions in host memory, copied to the
 *     device module by module when gathered.
 * Every transient (gathered modules, module gradients, buckets, stage 1's full gradients)
 * is device memory. Device kernels never touch host arrays: data crosses with copies.
 *
 * The operations go through a table (ze_dev_ops) so the same code runs on two backends:
 *   cuda: kernels and copies queued on the rank's stream (cuda/include/zck_cuda.h);
 *   sim:  the "device" is host memory and every operation is the CPU loop. It exists for
 *         the tests: the whole device path (placement, copies, bucketing, callback stores
 *         of the savers, the on-save gather plan) runs on machines without a GPU and must
 *         give the CPU engine's bits.
 * Operations are ordered on the rank's stream; host code reads host memory a copy wrote
 * only after ze_dzero_sync, and reuses a host buffer a copy reads only after it too.
 *
 * overlap_comm (DeepSpeed's key): each rank has a second, communication stream. The module
 * executor (zexec.h) selects it while it issues a stage-3 gather or a stage-2/3 gradient
 * reduction: every operation queued meanwhile (allocations, copies, conversions, the
 * collective itself through ze_dzero_coll, frees) goes to that stream, an event recorded
 * there marks the end, and the compute stream waits for the event just before it reads
 * the result. Ordering on the comm stream is FIFO like on any stream. Backends:
 *   cuda: a second cudaStream_t of the rank's context, cudaEvents; NCCL collectives on it
 *         are queued without the host waiting for them (the cuda-local backend of several
 *         ranks on one GPU keeps its host rendezvous, so its collectives still block the
 *         rank's thread, but not the kernels already queued on the compute stream);
 *   sim:  the comm stream is a real worker thread per rank, fed a FIFO of closures; an
 *         event is the sequence number of the last closure queued before it. Memory
 *         allocated on the comm stream is poisoned (NaN bytes) until the stream reaches
 *         the allocation, so a read that misses its wait sees NaN and changes the bits;
 *         opts.sim_delay_us delays every closure (the tests use it to make the gathers
 *         slower than the compute, so overlap and missing waits show deterministically).
 * Without overlap_comm (or with a backend without a second stream) nothing changes: one
 * stream, and every collective returns with its result in place.
 */
#ifndef ZE_DZERO_H
#define ZE_DZERO_H

#include "comm.h"
#include "exec.h"
#include "zck_cuda.h"
#include "zero.h"

#include <stdbool.h>
#include <stdint.h>

/* A collective on device buffers (lib/comm.h's semantics, sums in rank order). */
typedef enum ze_coll_kind { ZE_COLL_ALL_GATHER = 0, ZE_COLL_REDUCE_SCATTER, ZE_COLL_ALL_REDUCE } ze_coll_kind;
typedef struct ze_coll {
  ze_coll_kind kind;
  const void *send;
  void *recv;
  size_t count;                /* all_gather: send count; reduce_scatter: recv count */
  zck_dtype dt;
} ze_coll;
/* Runs a on c, on the calling thread (sums: ZCK_COMM_SUM). */
zck_status ze_coll_run(zck_comm *c, const ze_coll *a);

#define ZE_STREAM_COMPUTE 0
#define ZE_STREAM_COMM 1

typedef struct ze_dev_ops {
  const char *name; /* "cuda", "sim" */
  /* device memory, zeroed, usable by work queued after the call (bytes may be 0) */
  zck_status (*alloc)(void *ctx, void **p, size_t bytes);
  void (*free)(void *ctx, void *p); /* NULL is fine; after the work queued before it */
  /* page-locked host memory (sim: plain), zeroed; and its free */
  zck_status (*host_alloc)(void *ctx, void **p, size_t bytes);
  void (*host_free)(void *ctx, void *p);
  /* queued on the rank's stream; copy: between any two of host and device memory */
  zck_status (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
  zck_status (*zero)(void *ctx, void *p, size_t bytes);
  /* device arrays; dtypes F32 and BF16 (RNE, zck_convert's bits) */
  zck_status (*convert)(void *ctx, zck_dtype dst_dt, void *dst, zck_dtype src_dt, const void *src, size_t n);
  zck_status (*div)(void *ctx, float *dst, const float *src, size_t n, float divisor);
  zck_status (*add)(void *ctx, float *acc, const float *src, size_t n);
  /* *acc += the sum of squares of x in double (sim: the CPU's order); waits for the result */
  zck_status (*sumsq)(void *ctx, const float *x, size_t n, double *acc);
  zck_status (*adamw)(void *ctx, float *param, float *grad, float *exp_avg, float *exp_avg_sq, size_t n,
                      const zck_cuda_adamw_args *a);
  zck_status (*sync)(void *ctx);
  /* Callback-store functions for copy plans, called from any thread: synchronous copies of
   * 4-byte / 2-byte elements out of and into the device array whose base is the store's
   * ctx (they need no rank context). */
  zck_store_read_fn read4, read2;
  zck_store_write_fn write4, write2;
  /* The on-save 16-bit gather (zck_cuda.h) of sources in this device's memory. */
  zck_status (*gather16)(void *ctx, const zck_gather_plan *p, const zck_gather_src *srcs, zck_gather_write_fn write,
                         void *wctx);
  /* Bytes in use on the whole device now, for the report (0: unknown). */
  uint64_t (*used)(void *ctx);
  /* overlap_comm (NULL where the backend has no second stream). start: makes the comm
   * stream (sim: starts the worker, delaying each closure by delay_us). select: the stream
   * later operations go to (ZE_STREAM_*); returns the previous one. record: ev marks the
   * work queued so far on the selected stream; wait: the selected stream (the host, for
   * the sim's compute stream) waits for ev; query: 1 when ev is done, 0 when not, < 0 on
   * an error. coll: a collective on the selected stream (comm stream: queued, not waited).
   * sync waits for both streams. */
  zck_status (*start)(void *ctx, unsigned delay_us);
  int (*select)(void *ctx, int stream);
  zck_status (*event_new)(void *ctx, void **ev);
  void (*event_free)(void *ctx, void *ev);
  zck_status (*record)(void *ctx, void *ev);
  zck_status (*wait)(void *ctx, void *ev);
  int (*query)(void *ctx, void *ev);
  zck_status (*coll)(void *ctx, zck_comm *c, const ze_coll *a);
} ze_dev_ops;

extern const ze_dev_ops ze_dev_ops_cuda; /* opts.ctx: the rank's zck_cuda_ctx (ze_dzero_new wraps
                                            it with the comm stream: call the ops through d) */
extern const ze_dev_ops ze_dev_ops_sim;  /* ctx: a ze_sim (NULL: synchronous, no comm stream);
                                            ze_dzero_new makes one when given NULL */

/* The sim backend's per-rank context (dzero_sim.c). */
typedef struct ze_sim ze_sim;
zck_status ze_sim_new(ze_sim **out);
void ze_sim_free(ze_sim *s);                /* drains and joins the worker; NULL is fine */

typedef struct ze_dzero_opts {
  const ze_dev_ops *ops;
  void *ctx;
  zck_comm *comm;              /* collectives on the state arrays (device buffers): the nccl
                                  or cuda-local backend (sim: a host backend) */
  int device;                  /* the rank's device */
  bool offload_optimizer, pin_optimizer;
  bool offload_param, pin_param; /* stage 3 only (DeepSpeed ignores it below) */
  uint64_t gather_bucket_bytes;  /* the on-save 16-bit gather's bucket (0: 64 MiB) */
  bool overlap_comm;           /* a comm stream (when the backend has one), see above */
  unsigned sim_delay_us;       /* sim: each comm-stream closure waits this long first (tests) */
} ze_dzero_opts;

typedef struct ze_dzero {
  ze_dzero_opts o;
  bool opt_host;               /* fp32 master, exp_avg, exp_avg_sq, grad partitions: host */
  bool lp_host;                /* stage 3: 16-bit partitions (frozen ones too): host */
  ze_mem host;                 /* bytes held in host memory (offloaded state, staging) */
  uint64_t used_peak;          /* ops->used() at its highest when sampled */
  bool overlap;                /* the comm stream is running */
  void *own_ctx;               /* the sim context ze_dzero_new made (o.ctx), freed with d */
  void *own_cu;                /* cuda: o.ctx wraps the given zck_cuda_ctx with the comm
                                  stream (dzero.c), freed with d */
} ze_dzero;

/* Whether arrays of kind k live in host memory (offload). */
static inline bool ze_dzero_host(const ze_dzero *d, ze_mem_kind k) {
  if (k == ZE_MEM_LP) return d->lp_host;
  return (k == ZE_MEM_MASTER || k == ZE_MEM_EXP_AVG || k == ZE_MEM_EXP_AVG_SQ || k == ZE_MEM_GRAD) && d->opt_host;
}
/* Whether host arrays of kind k are page-locked. */
static inline bool ze_dzero_pinned(const ze_dzero *d, ze_mem_kind k) {
  return k == ZE_MEM_LP ? d->o.pin_param : d->o.pin_optimizer;
}

/* Fails when the opts cannot work (no ops, no comm). *out is owned by the rank once
 * ze_zero_rank_init_dev succeeds (ze_zero_rank_free frees it), else by the caller. */
zck_status ze_dzero_new(const ze_dzero_opts *o, int stage, ze_dzero **out);
void ze_dzero_free(ze_dzero *d);

/* Host memory for offloaded state and staging, zeroed (page-locked when pinned); NULL
 * when out of memory. */
void *ze_dzero_host_alloc(ze_dzero *d, size_t bytes, bool pinned);
void ze_dzero_host_free(ze_dzero *d, void *p, bool pinned);

/* AdamW as the CPU engine runs it on host arrays (ze_adamw_step, clip first, then the
 * gradient cleared and lp written when asked): the sim backend's, and the host path's of
 * zero.c (no device, or offload_optimizer). */
void ze_dzero_adamw_host(float *param, float *grad, float *exp_avg, float *exp_avg_sq, size_t n,
                         const zck_cuda_adamw_args *a);

/* A copy-plan store over a device array (callback) of dtype dt. */
zck_store ze_dzero_store(const ze_dzero *d, void *mem, zck_dtype dt, uint64_t numel, const char *name);

/* lp (dtype lp_dt, host or device) = RNE(fp32 master (host or device)), n elements:
 * one conversion where both sides are in the same memory, else through a bounded
 * staging buffer on the host. */
zck_status ze_dzero_lp_from_master(ze_dzero *d, void *lp, bool lp_host, zck_dtype lp_dt, const float *fp32,
                                   bool fp32_host, size_t n);

/* Samples ops->used() into used_peak. */
void ze_dzero_sample(ze_dzero *d);

// ---- the operations, on the rank's context

static inline zck_status ze_dzero_alloc(ze_dzero *d, void **p, size_t bytes) { return d->o.ops->alloc(d->o.ctx, p, bytes); }
static inline void ze_dzero_dfree(ze_dzero *d, void *p) { d->o.ops->free(d->o.ctx, p); }
static inline zck_status ze_dzero_copy(ze_dzero *d, void *dst, const void *src, size_t bytes) {
  return bytes ? d->o.ops->copy(d->o.ctx, dst, src, bytes) : ZCK_OK;
}
static inline zck_status ze_dzero_zero(ze_dzero *d, void *p, size_t bytes) {
  return bytes ? d->o.ops->zero(d->o.ctx, p, bytes) : ZCK_OK;
}
static inline zck_status ze_dzero_convert(ze_dzero *d, zck_dtype dt, void *dst, zck_dtype st, const void *src, size_t n) {
  return n ? d->o.ops->convert(d->o.ctx, dt, dst, st, src, n) : ZCK_OK;
}
static inline zck_status ze_dzero_div(ze_dzero *d, float *dst, const float *src, size_t n, float divisor) {
  return n ? d->o.ops->div(d->o.ctx, dst, src, n, divisor) : ZCK_OK;
}
static inline zck_status ze_dzero_add(ze_dzero *d, float *acc, const float *src, size_t n) {
  return n ? d->o.ops->add(d->o.ctx, acc, src, n) : ZCK_OK;
}
static inline zck_status ze_dzero_sync(ze_dzero *d) { return d->o.ops->sync(d->o.ctx); }

// ---- overlap_comm (only called when d->overlap)

static inline bool ze_dzero_overlap(const ze_dzero *d) { return d && d->overlap; }
static inline int ze_dzero_select(ze_dzero *d, int stream) { return d->o.ops->select(d->o.ctx, stream); }
static inline zck_status ze_dzero_event_new(ze_dzero *d, void **ev) { return d->o.ops->event_new(d->o.ctx, ev); }
static inline void ze_dzero_event_free(ze_dzero *d, void *ev) {
  if (ev) d->o.ops->event_free(d->o.ctx, ev);
}
static inline zck_status ze_dzero_record(ze_dzero *d, void *ev) { return d->o.ops->record(d->o.ctx, ev); }
static inline zck_status ze_dzero_wait(ze_dzero *d, void *ev) { return d->o.ops->wait(d->o.ctx, ev); }
static inline int ze_dzero_query(ze_dzero *d, void *ev) { return d->o.ops->query(d->o.ctx, ev); }
/* A collective on c, on the selected stream (without a comm stream: c's own call). */
static inline zck_status ze_dzero_coll(ze_dzero *d, zck_comm *c, const ze_coll *a) {
  return d->o.ops->coll ? d->o.ops->coll(d->o.ctx, c, a) : ze_coll_run(c, a);
}

#endif
