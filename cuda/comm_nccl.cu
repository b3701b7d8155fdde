// comm_nccl.cu: lib/comm.h's interface over NCCL, and the choice between NCCL and the
// cuda-local backend for ranks that live in one process.
//
// Each collective is host-synchronous, like every zck_comm backend: it is queued on the
// rank's stream after the work it depends on (the stream set with zck_comm_cuda_set_stream,
// else the whole device is synchronized first) and waited for, except in async mode
// (zck_comm_cuda_set_async: overlap_comm's comm stream), where reductions and gathers are
// only queued (zck_comm_cuda_wait waits for them). Every wait records an event and polls
// it with NCCL's asynchronous error, this process's abort flags and ZCK_COMM_TIMEOUT_S
// (comm_rules.h), so a rank whose peer failed aborts its communicator and returns a
// one-line error instead of hanging in a kernel that waits for ever. Nothing here
// synchronizes the whole device while a collective of the rank may still be running
// (that can deadlock with NCCL): such work is drained first, and frees are stream-ordered.
#include "common.cuh"

#include "comm_rules.h"

#include <atomic>
#include <new>
#include <unistd.h>

#if ZCK_HAVE_NCCL
#include <nccl.h>
#include <time.h>

struct nc_group;

struct nc_rank {
  ncclComm_t comm;           /* NULL once aborted */
  bool dead;                 /* aborted: never use comm again */
  int device, rank;
  cudaStream_t own, user;
  bool user_set;
  bool async;                /* overlap_comm: queue on `user` without waiting */
  cudaEvent_t ev;            /* what a wait polls: recorded after the work waited for */
  cudaEvent_t ev_async;      /* after the last collective queued without waiting */
  cudaStream_t pending;      /* the stream of that collective while not drained, else NULL */
  bool has_pending;
  double timeout_s;          /* ZCK_COMM_TIMEOUT_S (comm_rules.h) */
  int *d_token;              /* barrier payload */
  nc_group *group;           /* ranks created together in this process, else NULL */
  std::atomic<int> self_aborted;
};

struct nc_group {
  int n;
  std::atomic<int> aborted;  /* 1 + the first rank that failed or aborted, 0: none */
  zck_comm *handles;
  nc_rank *ranks;
};

static bool nc_aborted(const nc_rank *r) {
  return r->dead || r->self_aborted.load() || (r->group && r->group->aborted.load());
}

static zck_status nc_fail(nc_rank *r, ncclResult_t res, const char *what) {
  const char *detail = r->comm ? ncclGetLastError(r->comm) : "";
  return zck__fail(ZCK_ERR_INTERNAL, "nccl: rank %d: %s: %s%s%s", r->rank, what, ncclGetErrorString(res),
                   detail && *detail ? ": " : "", detail ? detail : "");
}

/* Aborts the communicator (its kernels stop waiting) and tells the ranks of this process's
 * group, which abort theirs when they next poll. */
static void nc_kill(nc_rank *r) {
  if (r->group) {
    int none = 0;
    r->group->aborted.compare_exchange_strong(none, r->rank + 1);
  }
  if (!r->dead && r->comm) ncclCommAbort(r->comm);
  r->comm = NULL; /* freed by the abort: never aborted or destroyed twice */
  r->dead = true;
  r->has_pending = false;
}

static zck_status nc_fail_dead(const nc_rank *r, const char *what) {
  return zck__fail(ZCK_ERR_INTERNAL, "nccl comm: rank %d: %s: communicator aborted after an earlier failure (another "
                   "rank failed, or this one)", r->rank, what);
}

static cudaStream_t nc_stream(const nc_rank *r) { return r->user_set ? r->user : r->own; }

// ---- waiting: an event polled with the group's health (comm_rules.h), never a blocking
// CUDA wait on NCCL work, which would hang for ever when a peer is gone

struct nc_poll {
  nc_rank *r;
  cudaEvent_t ev;
  const char *what;
};

static int nc_poll_query(void *ctx, zck_status *err) {
  nc_poll *p = (nc_poll *)ctx;
  cudaError_t e = cudaEventQuery(p->ev);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) return 0;
  *err = zck__fail(zck__cuda_status(e), "nccl comm: rank %d: %s: %s", p->r->rank, p->what, cudaGetErrorString(e));
  return -1;
}

static zck_status nc_poll_health(void *ctx) {
  nc_poll *p = (nc_poll *)ctx;
  nc_rank *r = p->r;
  /* the messages of a rank that fails because another did say "another rank failed", as
   * every backend's do (the engine reports the first failure without it) */
  if (r->dead) return nc_fail_dead(r, p->what);
  int who = r->group ? r->group->aborted.load() : 0;
  if (who == r->rank + 1 || r->self_aborted.load())
    return zck__fail(ZCK_ERR_INTERNAL, "nccl comm: rank %d: %s: aborted by this rank (another rank failed)", r->rank,
                     p->what);
  if (who)
    return zck__fail(ZCK_ERR_INTERNAL,
                     "nccl comm: rank %d: %s: another rank failed (rank %d, see its error); communicator aborted",
                     r->rank, p->what, who - 1);
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(r->comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
    char what[160];
    snprintf(what, sizeof what, "%s: asynchronous error (a peer rank failed or went away?)", p->what);
    return nc_fail(r, async, what);
  }
  return ZCK_OK;
}

static void nc_poll_kill(void *ctx) { nc_kill(((nc_poll *)ctx)->r); }

static double nc_poll_now(void *ctx) {
  (void)ctx;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nc_poll_idle(void *ctx, unsigned spins) {
  (void)ctx;
  if (spins > 2000) usleep(spins > 200000 ? 1000 : 50);
}

static const zck__poll_ops nc_poll_ops = {nc_poll_query, nc_poll_health, nc_poll_kill, nc_poll_now, nc_poll_idle};

/* Waits for the work queued on st so far: ev is recorded there and polled. */
static zck_status nc_wait_on(nc_rank *r, cudaStream_t st, cudaEvent_t ev, const char *what) {
  if (r->dead) return nc_fail_dead(r, what);
  cudaError_t e = cudaEventRecord(ev, st);
  if (e != cudaSuccess) {
    nc_kill(r);
    return zck__fail(zck__cuda_status(e), "nccl comm: rank %d: %s: %s", r->rank, what, cudaGetErrorString(e));
  }
  nc_poll p = {r, ev, what};
  return zck__poll_wait(&nc_poll_ops, &p, r->timeout_s, r->rank, what);
}

/* Waits for the collectives queued without waiting (overlap_comm), if any. */
static zck_status nc_drain(nc_rank *r) {
  if (!r->has_pending) return ZCK_OK;
  nc_poll p = {r, r->ev_async, "an asynchronous collective"};
  zck_status s = zck__poll_wait(&nc_poll_ops, &p, r->timeout_s, r->rank, p.what);
  r->has_pending = false;
  return s;
}

static zck_status nc_begin(zck_comm *c, nc_rank *r) {
  if (nc_aborted(r)) {
    nc_poll p = {r, NULL, "collective"};
    zck_status s = nc_poll_health(&p);
    nc_kill(r);
    return s != ZCK_OK ? s : zck__fail(ZCK_ERR_INTERNAL, "nccl comm: rank %d: another rank failed", c->rank);
  }
  ZCK_CU(cudaSetDevice(r->device), "nccl comm: select device %d", r->device);
  if (!r->user_set) {
    /* the whole device, but never while a collective of ours is queued: a device-wide
     * synchronize with an NCCL kernel in flight can deadlock */
    ZCK_TRY(nc_drain(r));
    ZCK_CU(cudaDeviceSynchronize(), "nccl comm: rank %d: wait for the device", c->rank);
  }
  /* a collective queued without waiting on another stream (overlap_comm's) is not drained:
   * NCCL runs the collectives of one communicator in the order they were issued, so the
   * device keeps the order and the host keeps the overlap */
  return ZCK_OK;
}

static zck_status nc_wait(zck_comm *c, nc_rank *r, const char *what) {
  (void)c;
  return nc_wait_on(r, nc_stream(r), r->ev, what);
}

/* After a queued reduction or gather: waited for, except on an overlap_comm stream (async),
 * where the stream orders what needs the result and a failure shows when it is waited for
 * (zck_comm_cuda_wait polls it like any wait here). */
static zck_status nc_done(zck_comm *c, nc_rank *r, const char *what) {
  if (r->async && r->user_set) {
    cudaError_t e = cudaEventRecord(r->ev_async, r->user);
    if (e != cudaSuccess) {
      nc_kill(r);
      return zck__fail(zck__cuda_status(e), "nccl comm: rank %d: %s: %s", c->rank, what, cudaGetErrorString(e));
    }
    r->has_pending = true;
    r->pending = r->user;
    return ZCK_OK;
  }
  return nc_wait(c, r, what);
}

static bool nc_type(zck_dtype dt, ncclDataType_t *t) {
  switch (dt) {
  case ZCK_F32: *t = ncclFloat32; return true;
  case ZCK_F64: *t = ncclFloat64; return true;
  case ZCK_F16: *t = ncclFloat16; return true;
  case ZCK_BF16: *t = ncclBfloat16; return true;
  case ZCK_I32: *t = ncclInt32; return true;
  case ZCK_I64: *t = ncclInt64; return true;
  default: return false;
  }
}

static ncclRedOp_t nc_op(zck_comm_op op) { return op == ZCK_COMM_MAX ? ncclMax : op == ZCK_COMM_MIN ? ncclMin : ncclSum; }

#define NC_TRY(call, what)                            \
  do {                                                \
    ncclResult_t nc__r = (call);                      \
    if (nc__r != ncclSuccess) {                       \
      zck_status nc__s = nc_fail(r, nc__r, what);     \
      nc_kill(r);                                     \
      return nc__s;                                   \
    }                                                 \
  } while (0)

static zck_status nc_all_reduce(zck_comm *c, const void *send, void *recv, size_t count, zck_dtype dt,
                                zck_comm_op op) {
  nc_rank *r = (nc_rank *)c->impl;
  ncclDataType_t t;
  ZCK_ASSERT(nc_type(dt, &t));
  ZCK_TRY(nc_begin(c, r));
  NC_TRY(ncclAllReduce(send, recv, count, t, nc_op(op), r->comm, nc_stream(r)), "all_reduce");
  return nc_done(c, r, "all_reduce");
}

static zck_status nc_reduce_scatter(zck_comm *c, const void *send, void *recv, size_t recv_count, zck_dtype dt,
                                    zck_comm_op op) {
  nc_rank *r = (nc_rank *)c->impl;
  ncclDataType_t t;
  ZCK_ASSERT(nc_type(dt, &t));
  ZCK_TRY(nc_begin(c, r));
  NC_TRY(ncclReduceScatter(send, recv, recv_count, t, nc_op(op), r->comm, nc_stream(r)), "reduce_scatter");
  return nc_done(c, r, "reduce_scatter");
}

/* Gathers and broadcasts move bytes: any dtype. */
static zck_status nc_all_gather(zck_comm *c, const void *send, void *recv, size_t send_count, zck_dtype dt) {
  nc_rank *r = (nc_rank *)c->impl;
  ZCK_TRY(nc_begin(c, r));
  NC_TRY(ncclAllGather(send, recv, send_count * zck_dtype_size(dt), ncclUint8, r->comm, nc_stream(r)), "all_gather");
  return nc_done(c, r, "all_gather");
}

static zck_status nc_broadcast(zck_comm *c, void *buf, size_t count, zck_dtype dt, int root) {
  ZCK_ASSERT(root >= 0 && root < c->size);
  nc_rank *r = (nc_rank *)c->impl;
  ZCK_TRY(nc_begin(c, r));
  NC_TRY(ncclBroadcast(buf, buf, count * zck_dtype_size(dt), ncclUint8, root, r->comm, nc_stream(r)), "broadcast");
  return nc_wait(c, r, "broadcast");
}

static zck_status nc_barrier(zck_comm *c) {
  nc_rank *r = (nc_rank *)c->impl;
  ZCK_TRY(nc_begin(c, r));
  NC_TRY(ncclAllReduce(r->d_token, r->d_token, 1, ncclInt32, ncclSum, r->comm, nc_stream(r)), "barrier");
  return nc_wait(c, r, "barrier");
}

static void nc_abort(zck_comm *c) {
  nc_rank *r = (nc_rank *)c->impl;
  /* only flags: the comm is aborted by the thread that owns it, when it next waits */
  r->self_aborted.store(1);
  if (r->group) {
    int none = 0;
    r->group->aborted.compare_exchange_strong(none, r->rank + 1);
  }
}

static void nc_rank_release(nc_rank *r) {
  cudaSetDevice(r->device);
  if (r->comm) {
    /* finish (or give up on, within the timeout) what was queued without waiting: a
     * destroy would wait for it without a bound */
    char keep[1024]; /* a failed drain (which aborts) keeps the error being reported */
    snprintf(keep, sizeof keep, "%s", zck_last_error());
    if (!nc_aborted(r) && nc_drain(r) != ZCK_OK) {
      if (keep[0])
        (void)zck__fail(ZCK_ERR_INTERNAL, "%s", keep);
      else
        zck_clear_error();
    }
    if (r->dead || !r->comm || nc_aborted(r))
      nc_kill(r);
    else
      ncclCommDestroy(r->comm);
  }
  r->comm = NULL;
  /* stream-ordered: a cudaFree would synchronize the whole device (other ranks' NCCL
   * kernels included) */
  if (r->d_token) {
    cudaFreeAsync(r->d_token, r->own);
    cudaStreamSynchronize(r->own);
  }
  if (r->own) cudaStreamDestroy(r->own);
  if (r->ev) cudaEventDestroy(r->ev);
  if (r->ev_async) cudaEventDestroy(r->ev_async);
  cudaGetLastError(); /* nothing stale for the next launch check */
  r->d_token = NULL;
  r->own = NULL;
  r->ev = r->ev_async = NULL;
}

static zck_status nc_rank_setup(nc_rank *r, int device, int rank) {
  r->device = device;
  r->rank = rank;
  const char *t = getenv("ZCK_COMM_TIMEOUT_S");
  r->timeout_s = zck__comm_timeout_parse(t);
  ZCK_FAIL_IF(r->timeout_s <= 0, ZCK_ERR_INVALID_ARG,
              "environment: ZCK_COMM_TIMEOUT_S=%s: not a positive number of seconds", t);
  ZCK_CU(cudaSetDevice(device), "nccl comm: select device %d", device);
  ZCK_CU(cudaStreamCreate(&r->own), "nccl comm: create a stream on device %d", device);
  ZCK_CU(cudaEventCreateWithFlags(&r->ev, cudaEventDisableTiming), "nccl comm: create an event on device %d", device);
  ZCK_CU(cudaEventCreateWithFlags(&r->ev_async, cudaEventDisableTiming), "nccl comm: create an event on device %d",
         device);
  ZCK_CU(cudaMallocAsync((void **)&r->d_token, sizeof(int), r->own), "nccl comm: barrier buffer on device %d", device);
  ZCK_CU(cudaMemsetAsync(r->d_token, 0, sizeof(int), r->own), "nccl comm: barrier buffer on device %d", device);
  ZCK_CU(cudaStreamSynchronize(r->own), "nccl comm: barrier buffer on device %d", device);
  return ZCK_OK;
}

static void nc_handle(zck_comm *h, nc_rank *r, int rank, int size) {
  h->rank = rank;
  h->size = size;
  h->backend = "nccl";
  h->impl = r;
  h->all_reduce = nc_all_reduce;
  h->reduce_scatter = nc_reduce_scatter;
  h->all_gather = nc_all_gather;
  h->broadcast = nc_broadcast;
  h->barrier = nc_barrier;
  h->abort = nc_abort;
}

static bool nc_is(const zck_comm *c) { return c && c->all_reduce == nc_all_reduce; }

static void nc_group_free(nc_group *g) {
  if (!g) return;
  int cur = -1;
  if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
  for (int i = 0; i < g->n; i++) {
    nc_rank_release(&g->ranks[i]);
    g->ranks[i].~nc_rank();
  }
  free(g->ranks);
  free(g->handles);
  g->~nc_group();
  free(g);
  if (cur >= 0) cudaSetDevice(cur); /* the releases selected each rank's device */
  cudaGetLastError();
}

static zck_status nc_create_local(int n, zck_comm **comms) {
  void *mem = calloc(1, sizeof(nc_group));
  if (!mem) return zck__fail(ZCK_ERR_NO_MEMORY, "nccl comm: no memory");
  nc_group *g = new (mem) nc_group();
  g->n = 0;
  g->handles = (zck_comm *)calloc((size_t)n, sizeof(zck_comm));
  g->ranks = (nc_rank *)calloc((size_t)n, sizeof(nc_rank));
  ncclComm_t *cs = (ncclComm_t *)calloc((size_t)n, sizeof(ncclComm_t));
  if (!g->handles || !g->ranks || !cs) {
    free(cs);
    nc_group_free(g);
    return zck__fail(ZCK_ERR_NO_MEMORY, "nccl comm: no memory");
  }
  for (int i = 0; i < n; i++) new (&g->ranks[i]) nc_rank();
  g->n = n;
  /* the setup selects devices 0 .. n-1 in turn: the caller's current device is put back */
  int cur = 0;
  zck_status s = ZCK_OK;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess) s = zck__fail(zck__cuda_status(e), "nccl comm: current device: %s", cudaGetErrorString(e));
  for (int i = 0; i < n && s == ZCK_OK; i++) {
    g->ranks[i].group = g;
    s = nc_rank_setup(&g->ranks[i], i, i);
  }
  if (s == ZCK_OK) {
    ncclResult_t res = ncclCommInitAll(cs, n, NULL); /* devices 0 .. n-1 */
    if (res != ncclSuccess) s = zck__fail(ZCK_ERR_INTERNAL, "nccl: init %d ranks: %s", n, ncclGetErrorString(res));
  }
  if (s != ZCK_OK) {
    free(cs);
    nc_group_free(g);
    cudaSetDevice(cur);
    return s;
  }
  cudaSetDevice(cur);
  for (int i = 0; i < n; i++) {
    g->ranks[i].comm = cs[i];
    nc_handle(&g->handles[i], &g->ranks[i], i, n);
    comms[i] = &g->handles[i];
  }
  free(cs);
  return ZCK_OK;
}

extern "C" zck_status zck_comm_nccl_get_unique_id(uint8_t id[ZCK_NCCL_ID_BYTES]) {
  static_assert(sizeof(ncclUniqueId) == ZCK_NCCL_ID_BYTES, "ncclUniqueId size");
  ncclUniqueId u;
  ncclResult_t res = ncclGetUniqueId(&u);
  ZCK_FAIL_IF(res != ncclSuccess, ZCK_ERR_INTERNAL, "nccl: make a unique id: %s", ncclGetErrorString(res));
  memcpy(id, &u, sizeof u);
  return ZCK_OK;
}

extern "C" zck_status zck_comm_nccl_init_rank(int nranks, int rank, const uint8_t id[ZCK_NCCL_ID_BYTES],
                                              zck_comm **comm) {
  *comm = NULL;
  ZCK_FAIL_IF(nranks < 1 || rank < 0 || rank >= nranks, ZCK_ERR_INVALID_ARG, "nccl comm: rank %d of %d", rank, nranks);
  int device = 0;
  ZCK_CU(cudaGetDevice(&device), "nccl comm: current device");
  struct single {
    zck_comm handle;
    nc_rank rank;
  };
  void *mem = calloc(1, sizeof(single));
  if (!mem) return zck__fail(ZCK_ERR_NO_MEMORY, "nccl comm: no memory");
  single *one = new (mem) single();
  zck_status s = nc_rank_setup(&one->rank, device, rank);
  if (s == ZCK_OK) {
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t res = ncclCommInitRank(&one->rank.comm, nranks, u, rank);
    if (res != ncclSuccess)
      s = zck__fail(ZCK_ERR_INTERNAL, "nccl: init rank %d of %d on device %d: %s", rank, nranks, device,
                    ncclGetErrorString(res));
  }
  if (s != ZCK_OK) {
    nc_rank_release(&one->rank);
    one->~single();
    free(one);
    return s;
  }
  nc_handle(&one->handle, &one->rank, rank, nranks);
  *comm = &one->handle;
  return ZCK_OK;
}

/* Agrees over the bootstrap group on whether every rank got this far: a MAX of "failed"
 * flags, so that one rank's failure fails them all. Returns the first failed rank in *who. */
static zck_status nc_agree(zck_comm *b, bool failed, const char *what, int *who) {
  int32_t v = failed ? b->size - b->rank : 0; /* MAX picks the lowest failed rank */
  ZCK_TRY_CTX(b->all_reduce(b, &v, &v, 1, ZCK_I32, ZCK_COMM_MAX), "nccl comm: %s", what);
  *who = v ? b->size - v : -1;
  return ZCK_OK;
}

extern "C" zck_status zck_comm_nccl_init_from(zck_comm *bootstrap, int device, zck_comm **out) {
  *out = NULL;
  ZCK_ASSERT(bootstrap);
  int me = bootstrap->rank, who = -1;
  /* the device first, everywhere: NCCL would otherwise wait for a rank that never joins */
  cudaError_t e = cudaSetDevice(device);
  zck_status own = e == cudaSuccess ? ZCK_OK
                                    : zck__fail(zck__cuda_status(e), "nccl comm: rank %d: select device %d: %s", me,
                                                device, cudaGetErrorString(e));
  ZCK_TRY(nc_agree(bootstrap, own != ZCK_OK, "agree on the devices", &who));
  if (own != ZCK_OK) return own;
  ZCK_FAIL_IF(who >= 0, ZCK_ERR_INTERNAL, "nccl comm: rank %d could not select its device (see its error)", who);
  uint8_t id[ZCK_NCCL_ID_BYTES + 1]; /* the id, then rank 0's verdict */
  memset(id, 0, sizeof id);
  if (me == 0) {
    own = zck_comm_nccl_get_unique_id(id);
    id[ZCK_NCCL_ID_BYTES] = own == ZCK_OK;
  }
  ZCK_TRY_CTX(bootstrap->broadcast(bootstrap, id, sizeof id, ZCK_U8, 0), "nccl comm: send the NCCL id");
  if (me == 0 && own != ZCK_OK) return own;
  ZCK_FAIL_IF(!id[ZCK_NCCL_ID_BYTES], ZCK_ERR_INTERNAL, "nccl comm: rank 0 could not make the NCCL id (see its error)");
  return zck_comm_nccl_init_rank(bootstrap->size, me, id, out);
}

extern "C" void zck_comm_nccl_destroy(zck_comm *comm) {
  if (!comm) return;
  ZCK_ASSERT(nc_is(comm) && !((nc_rank *)comm->impl)->group);
  nc_rank *r = (nc_rank *)comm->impl;
  nc_rank_release(r);
  /* handle and rank are one allocation, the handle first */
  r->~nc_rank();
  free(comm);
}

#else /* no NCCL: ranks of one process always share a device through cuda-local */

extern "C" zck_status zck_comm_nccl_get_unique_id(uint8_t id[ZCK_NCCL_ID_BYTES]) {
  return zck__fail(ZCK_ERR_UNSUPPORTED, "nccl comm: built without NCCL");
}
extern "C" zck_status zck_comm_nccl_init_rank(int nranks, int rank, const uint8_t id[ZCK_NCCL_ID_BYTES],
                                              zck_comm **comm) {
  *comm = NULL;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "nccl comm: built without NCCL");
}
extern "C" void zck_comm_nccl_destroy(zck_comm *comm) {}
extern "C" zck_status zck_comm_nccl_init_from(zck_comm *bootstrap, int device, zck_comm **out) {
  *out = NULL;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "nccl comm: built without NCCL");
}

#endif

extern "C" zck_status zck_comm_nccl_create_local(int nranks, zck_comm **comms) {
  ZCK_FAIL_IF(nranks < 1 || nranks > ZCK__RANKS_MAX, ZCK_ERR_INVALID_ARG, "comm: %d ranks; 1 to %d", nranks,
              ZCK__RANKS_MAX);
  int ndev = zck_cuda_device_count();
  ZCK_FAIL_IF(ndev == 0, ZCK_ERR_NO_DEVICE, "comm: no CUDA device");
#if ZCK_HAVE_NCCL
  if (nranks <= ndev) return nc_create_local(nranks, comms);
#endif
  int device = 0;
  ZCK_CU(cudaGetDevice(&device), "comm: current device");
  return zck_comm_cuda_local_create(nranks, device, comms);
}

extern "C" void zck_comm_nccl_destroy_local(zck_comm **comms, int nranks) {
  if (!comms || nranks < 1 || !comms[0]) return;
  if (zck__ranks_is(comms[0])) {
    zck__ranks_destroy(comms, nranks);
    return;
  }
#if ZCK_HAVE_NCCL
  ZCK_ASSERT(nc_is(comms[0]) && ((nc_rank *)comms[0]->impl)->group);
  nc_group_free(((nc_rank *)comms[0]->impl)->group);
  for (int r = 0; r < nranks; r++) comms[r] = NULL;
#endif
}

extern "C" zck_status zck_comm_cuda_set_stream(zck_comm *comm, void *stream) {
  if (zck__ranks_is(comm) && !strcmp(comm->backend, "cuda-local")) return zck__cuda_local_set_stream(comm, stream);
#if ZCK_HAVE_NCCL
  if (nc_is(comm)) {
    nc_rank *r = (nc_rank *)comm->impl;
    r->user = ZCK_CU_STREAM(stream);
    r->user_set = stream != NULL;
    return ZCK_OK;
  }
#endif
  return zck__fail(ZCK_ERR_INVALID_ARG, "comm: %s is not a CUDA backend", comm->backend);
}

extern "C" zck_status zck_comm_cuda_set_async(zck_comm *comm, int async) {
  if (zck__ranks_is(comm) && !strcmp(comm->backend, "cuda-local")) return ZCK_OK; /* stays synchronous */
#if ZCK_HAVE_NCCL
  if (nc_is(comm)) {
    ((nc_rank *)comm->impl)->async = async != 0;
    return ZCK_OK;
  }
#endif
  (void)async;
  return zck__fail(ZCK_ERR_INVALID_ARG, "comm: %s is not a CUDA backend", comm->backend);
}

extern "C" zck_status zck_comm_cuda_wait(zck_comm *comm, void *stream) {
#if ZCK_HAVE_NCCL
  if (nc_is(comm)) {
    nc_rank *r = (nc_rank *)comm->impl;
    ZCK_CU(cudaSetDevice(r->device), "nccl comm: select device %d", r->device);
    if (!stream) return nc_drain(r);
    zck_status s = nc_wait_on(r, ZCK_CU_STREAM(stream), r->ev, "wait for a stream");
    /* everything queued before on that stream is done, our collectives on it too */
    if (s == ZCK_OK && r->has_pending && r->pending == ZCK_CU_STREAM(stream)) r->has_pending = false;
    return s;
  }
#endif
  (void)comm;
  if (!stream) return ZCK_OK; /* cuda-local and host backends queue nothing without waiting */
  ZCK_CU(cudaStreamSynchronize(ZCK_CU_STREAM(stream)), "wait for the stream");
  return ZCK_OK;
}

extern "C" int zck_comm_cuda_device(const zck_comm *comm) {
  if (zck__ranks_is(comm) && !strcmp(comm->backend, "cuda-local")) return zck__cuda_local_device(comm);
#if ZCK_HAVE_NCCL
  if (nc_is(comm)) return ((const nc_rank *)comm->impl)->device;
#endif
  return -1;
}
