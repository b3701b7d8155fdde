/* comm_ranks.c: the collective engine for ranks that are threads of one process, with its
 * memory operations in an ops table (see comm_ranks.h): the local backend (comm_local.c)
 * with the host ops below, and cuda/'s cuda-local backend with device ops.
 *
 * Each collective: every rank finishes its earlier work (ops->enter), posts its arguments,
 * meets the others at a barrier whose last arriver checks that all posted the same call,
 * does its share reading the other ranks' buffers directly, waits for its own queued work
 * (ops->leave), and meets them again so that nobody reuses a buffer another rank still
 * reads. Shares never overlap: in all_reduce rank r reduces element chunk r and writes it
 * to every rank's output; in reduce_scatter and all_gather rank r writes only its own
 * output. That is what makes the in-place forms of NCCL safe here too. Reductions run in
 * rank order 0..W-1 per element: bit-reproducible whatever the thread scheduling.
 */
#include "comm_ranks.h"

#include "error.h"
#include "util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { RK_ALL_REDUCE = 1, RK_REDUCE_SCATTER, RK_ALL_GATHER, RK_BROADCAST, RK_BARRIER, RK_GATHER } rk_kind;

static const char *rk_kind_name(int k) {
  switch (k) {
  case RK_ALL_REDUCE: return "all_reduce";
  case RK_REDUCE_SCATTER: return "reduce_scatter";
  case RK_ALL_GATHER: return "all_gather";
  case RK_BROADCAST: return "broadcast";
  case RK_BARRIER: return "barrier";
  case RK_GATHER: return "gather";
  }
  return "?";
}

typedef struct rk_post {
  int kind;
  const void *send;
  void *recv;
  size_t count;
  zck_dtype dt;
  zck_comm_op op;
  int root;
} rk_post;

typedef struct rk_world {
  int size;
  const char *backend;
  zck__ranks_ops ops;
  void *ops_ctx;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned long generation;
  bool aborted;
  bool mismatch;
  char mismatch_msg[256];
  rk_post *posts;
  const void **sends;         /* [size] every rank's posted send / recv buffer of the */
  void **recvs;               /* current call (set by the validating arriver) */
  zck_comm *handles;
} rk_world;

// ---- barrier with a hook run by the last arriver (under the lock)

static zck_status rk_barrier_hook(rk_world *w, void (*hook)(rk_world *)) {
  pthread_mutex_lock(&w->mu);
  if (w->aborted) {
    pthread_mutex_unlock(&w->mu);
    return zck__fail(ZCK_ERR_INTERNAL, "%s comm: another rank failed", w->backend);
  }
  unsigned long gen = w->generation;
  if (++w->arrived == w->size) {
    if (hook) hook(w);
    w->arrived = 0;
    w->generation++;
    pthread_cond_broadcast(&w->cv);
  } else {
    while (gen == w->generation && !w->aborted) pthread_cond_wait(&w->cv, &w->mu);
  }
  bool aborted = w->aborted && gen == w->generation;
  pthread_mutex_unlock(&w->mu);
  if (aborted) return zck__fail(ZCK_ERR_INTERNAL, "%s comm: another rank failed", w->backend);
  return ZCK_OK;
}

static void rk_validate(rk_world *w) {
  const rk_post *p0 = &w->posts[0];
  w->mismatch = false;
  for (int r = 0; r < w->size; r++) {
    w->sends[r] = w->posts[r].send;
    w->recvs[r] = w->posts[r].recv;
  }
  for (int r = 1; r < w->size; r++) {
    const rk_post *p = &w->posts[r];
    if (p->kind != p0->kind || p->count != p0->count || p->dt != p0->dt || p->op != p0->op || p->root != p0->root) {
      w->mismatch = true;
      snprintf(w->mismatch_msg, sizeof w->mismatch_msg,
               "%s comm: ranks disagree: rank 0 called %s(count %zu, %s), rank %d called %s(count %zu, %s)",
               w->backend, rk_kind_name(p0->kind), p0->count, zck_dtype_name(p0->dt), r, rk_kind_name(p->kind),
               p->count, zck_dtype_name(p->dt));
      return;
    }
  }
}

static zck_status rk_enter(zck_comm *c, const rk_post *post) {
  rk_world *w = c->impl;
  zck_status s = w->ops.enter ? w->ops.enter(w->ops_ctx, c->rank) : ZCK_OK;
  if (s != ZCK_OK) {
    /* the others would wait for ever for this rank */
    c->abort(c);
    return s;
  }
  w->posts[c->rank] = *post;
  ZCK_TRY(rk_barrier_hook(w, rk_validate));
  if (w->mismatch) {
    s = zck__fail(ZCK_ERR_INVALID_ARG, "%s", w->mismatch_msg);
    rk_barrier_hook(w, NULL);
    return s;
  }
  return ZCK_OK;
}

/* `work` is the status of this rank's share; the rank meets the others either way. */
static zck_status rk_leave(zck_comm *c, zck_status work) {
  rk_world *w = c->impl;
  if (work == ZCK_OK && w->ops.leave) work = w->ops.leave(w->ops_ctx, c->rank);
  if (work != ZCK_OK) {
    /* keep this rank's message; the others see "another rank failed" */
    c->abort(c);
    return work;
  }
  return rk_barrier_hook(w, NULL);
}

static bool rk_reducible(zck_dtype dt) {
  return dt == ZCK_F32 || dt == ZCK_F64 || dt == ZCK_I32 || dt == ZCK_I64 || dt == ZCK_BF16 || dt == ZCK_F16;
}

// ---- collectives

static zck_status rk_all_reduce(zck_comm *c, const void *send, void *recv, size_t count, zck_dtype dt,
                                zck_comm_op op) {
  ZCK_ASSERT(rk_reducible(dt));
  rk_post p = {RK_ALL_REDUCE, send, recv, count, dt, op, 0};
  ZCK_TRY(rk_enter(c, &p));
  rk_world *w = c->impl;
  size_t chunk = (count + (size_t)w->size - 1) / (size_t)w->size;
  size_t lo = chunk * (size_t)c->rank, hi = lo + chunk < count ? lo + chunk : count;
  zck_status s = ZCK_OK;
  if (lo < hi) s = w->ops.reduce(w->ops_ctx, c->rank, w->sends, w->size, lo, w->recvs, w->size, lo, hi - lo, dt, op);
  return rk_leave(c, s);
}

static zck_status rk_reduce_scatter(zck_comm *c, const void *send, void *recv, size_t recv_count, zck_dtype dt,
                                    zck_comm_op op) {
  ZCK_ASSERT(rk_reducible(dt));
  rk_post p = {RK_REDUCE_SCATTER, send, recv, recv_count, dt, op, 0};
  ZCK_TRY(rk_enter(c, &p));
  rk_world *w = c->impl;
  zck_status s = ZCK_OK;
  if (recv_count) {
    void *dsts[1] = {recv};
    s = w->ops.reduce(w->ops_ctx, c->rank, w->sends, w->size, (size_t)c->rank * recv_count, dsts, 1, 0, recv_count, dt,
                      op);
  }
  return rk_leave(c, s);
}

static zck_status rk_all_gather(zck_comm *c, const void *send, void *recv, size_t send_count, zck_dtype dt) {
  rk_post p = {RK_ALL_GATHER, send, recv, send_count, dt, ZCK_COMM_SUM, 0};
  ZCK_TRY(rk_enter(c, &p));
  rk_world *w = c->impl;
  size_t bytes = send_count * zck_dtype_size(dt);
  zck_status s = ZCK_OK;
  for (int k = 0; k < w->size && s == ZCK_OK && bytes; k++) {
    uint8_t *dst = (uint8_t *)recv + (size_t)k * bytes;
    if (dst != w->posts[k].send) s = w->ops.copy(w->ops_ctx, c->rank, dst, w->posts[k].send, bytes);
  }
  return rk_leave(c, s);
}

static zck_status rk_broadcast(zck_comm *c, void *buf, size_t count, zck_dtype dt, int root) {
  ZCK_ASSERT(root >= 0 && root < c->size);
  rk_post p = {RK_BROADCAST, buf, buf, count, dt, ZCK_COMM_SUM, root};
  ZCK_TRY(rk_enter(c, &p));
  rk_world *w = c->impl;
  zck_status s = ZCK_OK;
  if (c->rank != root && count)
    s = w->ops.copy(w->ops_ctx, c->rank, buf, w->posts[root].send, count * zck_dtype_size(dt));
  return rk_leave(c, s);
}

/* The ranks post the total of counts (so a rank with other counts is named as disagreeing
 * in most cases); root copies each rank's bytes from its posted send buffer. */
static zck_status rk_gather(zck_comm *c, const void *send, void *recv, const size_t *counts, zck_dtype dt, int root) {
  ZCK_ASSERT(root >= 0 && root < c->size && counts);
  size_t total = 0;
  for (int k = 0; k < c->size; k++) total += counts[k];
  rk_post p = {RK_GATHER, send, recv, total, dt, ZCK_COMM_SUM, root};
  ZCK_TRY(rk_enter(c, &p));
  rk_world *w = c->impl;
  size_t es = zck_dtype_size(dt), at = 0;
  zck_status s = ZCK_OK;
  for (int k = 0; c->rank == root && k < w->size && s == ZCK_OK; k++) {
    uint8_t *dst = (uint8_t *)recv + at * es;
    if (counts[k] && dst != w->posts[k].send) s = w->ops.copy(w->ops_ctx, c->rank, dst, w->posts[k].send, counts[k] * es);
    at += counts[k];
  }
  return rk_leave(c, s);
}

static zck_status rk_barrier(zck_comm *c) {
  rk_post p = {RK_BARRIER, NULL, NULL, 0, ZCK_U8, ZCK_COMM_SUM, 0};
  return rk_enter(c, &p);
}

static void rk_abort(zck_comm *c) {
  rk_world *w = c->impl;
  pthread_mutex_lock(&w->mu);
  w->aborted = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

// ---- group lifetime

zck_status zck__ranks_create(int size, const zck__ranks_ops *ops, void *ops_ctx, const char *backend,
                             zck_comm **comms) {
  ZCK_ASSERT(size >= 1 && comms && ops && ops->reduce && ops->copy);
  rk_world *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  w->size = size;
  w->backend = backend;
  w->ops = *ops;
  w->ops_ctx = ops_ctx;
  w->posts = zck__calloc((size_t)size, sizeof *w->posts);
  w->sends = zck__calloc((size_t)size, sizeof *w->sends);
  w->recvs = zck__calloc((size_t)size, sizeof *w->recvs);
  w->handles = zck__calloc((size_t)size, sizeof *w->handles);
  if (!w->posts || !w->sends || !w->recvs || !w->handles) {
    free(w->posts);
    free(w->sends);
    free(w->recvs);
    free(w->handles);
    free(w);
    return ZCK_ERR_NO_MEMORY;
  }
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  for (int r = 0; r < size; r++) {
    zck_comm *c = &w->handles[r];
    c->rank = r;
    c->size = size;
    c->backend = backend;
    c->impl = w;
    c->all_reduce = rk_all_reduce;
    c->reduce_scatter = rk_reduce_scatter;
    c->all_gather = rk_all_gather;
    c->broadcast = rk_broadcast;
    c->gather = rk_gather;
    c->barrier = rk_barrier;
    c->abort = rk_abort;
    comms[r] = c;
  }
  return ZCK_OK;
}

int zck__ranks_is(const zck_comm *c) { return c && c->all_reduce == rk_all_reduce; }

void *zck__ranks_ops_ctx(zck_comm *c) { return ((rk_world *)c->impl)->ops_ctx; }

void zck__ranks_destroy(zck_comm **comms, int size) {
  if (!comms || size < 1 || !comms[0]) return;
  rk_world *w = comms[0]->impl;
  if (w->ops.destroy) w->ops.destroy(w->ops_ctx);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w->posts);
  free(w->sends);
  free(w->recvs);
  free(w->handles);
  free(w);
  for (int r = 0; r < size; r++) comms[r] = NULL;
}

// ---- host ops

static float rk_half_to_float(zck_dtype dt, uint16_t h) {
  float f;
  zck_convert(ZCK_F32, &f, dt, &h, 1);
  return f;
}

#define RK_COMBINE(acc, v, op) ((op) == ZCK_COMM_SUM ? (acc) + (v) : (op) == ZCK_COMM_MAX ? ((v) > (acc) ? (v) : (acc)) \
                                                                      : ((v) < (acc) ? (v) : (acc)))

static zck_status host_reduce(void *ctx, int rank, const void *const *srcs, int n_src, size_t src_off,
                              void *const *dsts, int n_dst, size_t dst_off, size_t n, zck_dtype dt, zck_comm_op op) {
  (void)ctx;
  (void)rank;
#define RK_LOOP(T)                                                                           \
  for (size_t i = 0; i < n; i++) {                                                           \
    T acc = ((const T *)srcs[0])[src_off + i];                                               \
    for (int k = 1; k < n_src; k++) acc = RK_COMBINE(acc, ((const T *)srcs[k])[src_off + i], op); \
    for (int j = 0; j < n_dst; j++) ((T *)dsts[j])[dst_off + i] = acc;                       \
  }
  switch (dt) {
  case ZCK_F32: RK_LOOP(float); break;
  case ZCK_F64: RK_LOOP(double); break;
  case ZCK_I32: RK_LOOP(int32_t); break;
  case ZCK_I64: RK_LOOP(int64_t); break;
  case ZCK_BF16:
  case ZCK_F16:
    for (size_t i = 0; i < n; i++) {
      float acc = rk_half_to_float(dt, ((const uint16_t *)srcs[0])[src_off + i]);
      for (int k = 1; k < n_src; k++) acc = RK_COMBINE(acc, rk_half_to_float(dt, ((const uint16_t *)srcs[k])[src_off + i]), op);
      uint16_t h;
      zck_convert(dt, &h, ZCK_F32, &acc, 1);
      for (int j = 0; j < n_dst; j++) ((uint16_t *)dsts[j])[dst_off + i] = h;
    }
    break;
  default: return zck__fail(ZCK_ERR_INVALID_ARG, "host comm: cannot reduce %s", zck_dtype_name(dt));
  }
#undef RK_LOOP
  return ZCK_OK;
}

static zck_status host_copy(void *ctx, int rank, void *dst, const void *src, size_t bytes) {
  (void)ctx;
  (void)rank;
  memmove(dst, src, bytes);
  return ZCK_OK;
}

const zck__ranks_ops zck__ranks_host_ops = {host_reduce, host_copy, NULL, NULL, NULL};
