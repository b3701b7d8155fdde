/* comm_local.c: the local collective backend: W ranks that are threads of one process.
 *
 * Each collective is: every rank posts its arguments, a barrier (whose last arriver checks
 * that all ranks posted the same call), every rank does its share of the work reading the
 * other ranks' buffers directly, and a second barrier so that no rank reuses a buffer that
 * another is still reading. Work is split so that no two ranks touch the same element:
 * in all_reduce rank r owns element chunk r of every buffer, in reduce_scatter rank r writes
 * only its own output, in all_gather rank r writes only its own output. That is what makes
 * the in-place forms of NCCL safe here too.
 *
 * Sums run over ranks 0..W-1 in that order, element by element: bit-reproducible.
 */
#include "comm.h"

#include "util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { LC_ALL_REDUCE = 1, LC_REDUCE_SCATTER, LC_ALL_GATHER, LC_BROADCAST, LC_BARRIER } lc_kind;

static const char *lc_kind_name(int k) {
  switch (k) {
  case LC_ALL_REDUCE: return "all_reduce";
  case LC_REDUCE_SCATTER: return "reduce_scatter";
  case LC_ALL_GATHER: return "all_gather";
  case LC_BROADCAST: return "broadcast";
  case LC_BARRIER: return "barrier";
  }
  return "?";
}

typedef struct lc_post {
  int kind;
  const void *send;
  void *recv;
  size_t count;
  zck_dtype dt;
  zck_comm_op op;
  int root;
} lc_post;

typedef struct lc_world {
  int size;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived;
  unsigned long generation;
  bool aborted;
  bool mismatch;          /* set by the validating arriver for the current call */
  char mismatch_msg[256];
  lc_post *posts;         /* [size] */
  zck_comm *handles;      /* [size] */
} lc_world;

// ---- barrier with a hook run by the last arriver (under the lock)

static zck_status lc_barrier_hook(lc_world *w, void (*hook)(lc_world *)) {
  pthread_mutex_lock(&w->mu);
  if (w->aborted) {
    pthread_mutex_unlock(&w->mu);
    return zck__fail(ZCK_ERR_INTERNAL, "local comm: another rank failed");
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
  if (aborted) return zck__fail(ZCK_ERR_INTERNAL, "local comm: another rank failed");
  return ZCK_OK;
}

static void lc_validate(lc_world *w) {
  const lc_post *p0 = &w->posts[0];
  w->mismatch = false;
  for (int r = 1; r < w->size; r++) {
    const lc_post *p = &w->posts[r];
    if (p->kind != p0->kind || p->count != p0->count || p->dt != p0->dt || p->op != p0->op || p->root != p0->root) {
      w->mismatch = true;
      snprintf(w->mismatch_msg, sizeof w->mismatch_msg,
               "local comm: ranks disagree: rank 0 called %s(count %zu, %s), rank %d called %s(count %zu, %s)",
               lc_kind_name(p0->kind), p0->count, zck_dtype_name(p0->dt), r, lc_kind_name(p->kind), p->count,
               zck_dtype_name(p->dt));
      return;
    }
  }
}

/* Posts this rank's call and waits for all ranks; fails consistently on every rank if the
 * calls disagree. */
static zck_status lc_enter(zck_comm *c, const lc_post *post) {
  lc_world *w = c->impl;
  w->posts[c->rank] = *post;
  ZCK_TRY(lc_barrier_hook(w, lc_validate));
  if (w->mismatch) {
    zck_status s = zck__fail(ZCK_ERR_INVALID_ARG, "%s", w->mismatch_msg);
    lc_barrier_hook(w, NULL); /* nobody may re-post before everyone read the message */
    return s;
  }
  return ZCK_OK;
}

static zck_status lc_leave(zck_comm *c) { return lc_barrier_hook(c->impl, NULL); }

// ---- element-wise reduction in rank order

static bool lc_reducible(zck_dtype dt) {
  return dt == ZCK_F32 || dt == ZCK_F64 || dt == ZCK_I32 || dt == ZCK_I64 || dt == ZCK_BF16 || dt == ZCK_F16;
}

static float lc_half_to_float(zck_dtype dt, uint16_t h) {
  float f;
  zck_convert(ZCK_F32, &f, dt, &h, 1);
  return f;
}

#define LC_COMBINE(acc, v, op) ((op) == ZCK_COMM_SUM ? (acc) + (v) : (op) == ZCK_COMM_MAX ? ((v) > (acc) ? (v) : (acc)) \
                                                                      : ((v) < (acc) ? (v) : (acc)))

/* dst[i] = op over k of srcs[k][off + i], i in [0, n). dst may alias srcs[k] + off. */
static void lc_reduce(const lc_post *posts, int size, bool use_send, size_t off, size_t n, void *dst, zck_dtype dt,
                      zck_comm_op op) {
#define LC_SRC(k) ((const void *)(use_send ? posts[k].send : posts[k].recv))
#define LC_LOOP(T)                                                                 \
  do {                                                                             \
    T *d = dst;                                                                    \
    for (size_t i = 0; i < n; i++) {                                               \
      T acc = ((const T *)LC_SRC(0))[off + i];                                     \
      for (int k = 1; k < size; k++) acc = LC_COMBINE(acc, ((const T *)LC_SRC(k))[off + i], op); \
      d[i] = acc;                                                                  \
    }                                                                              \
  } while (0)
  switch (dt) {
  case ZCK_F32: LC_LOOP(float); break;
  case ZCK_F64: LC_LOOP(double); break;
  case ZCK_I32: LC_LOOP(int32_t); break;
  case ZCK_I64: LC_LOOP(int64_t); break;
  case ZCK_BF16:
  case ZCK_F16: {
    uint16_t *d = dst;
    for (size_t i = 0; i < n; i++) {
      float acc = lc_half_to_float(dt, ((const uint16_t *)LC_SRC(0))[off + i]);
      for (int k = 1; k < size; k++) acc = LC_COMBINE(acc, lc_half_to_float(dt, ((const uint16_t *)LC_SRC(k))[off + i]), op);
      zck_convert(dt, &d[i], ZCK_F32, &acc, 1);
    }
    break;
  }
  default: break;
  }
#undef LC_LOOP
#undef LC_SRC
}

// ---- collectives

static zck_status lc_all_reduce(zck_comm *c, const void *send, void *recv, size_t count, zck_dtype dt, zck_comm_op op) {
  ZCK_ASSERT(lc_reducible(dt));
  lc_post p = {LC_ALL_REDUCE, send, recv, count, dt, op, 0};
  ZCK_TRY(lc_enter(c, &p));
  lc_world *w = c->impl;
  /* rank r reduces element chunk r and writes it into every rank's output */
  size_t chunk = (count + (size_t)w->size - 1) / (size_t)w->size;
  size_t lo = chunk * (size_t)c->rank, hi = lo + chunk < count ? lo + chunk : count;
  if (lo < hi) {
    size_t es = zck_dtype_size(dt);
    /* reduce into this rank's own output first (it may alias its input, read first per element) */
    lc_reduce(w->posts, w->size, true, lo, hi - lo, (uint8_t *)recv + lo * es, dt, op);
    for (int k = 0; k < w->size; k++)
      if (k != c->rank) memcpy((uint8_t *)w->posts[k].recv + lo * es, (uint8_t *)recv + lo * es, (hi - lo) * es);
  }
  return lc_leave(c);
}

static zck_status lc_reduce_scatter(zck_comm *c, const void *send, void *recv, size_t recv_count, zck_dtype dt,
                                    zck_comm_op op) {
  ZCK_ASSERT(lc_reducible(dt));
  lc_post p = {LC_REDUCE_SCATTER, send, recv, recv_count, dt, op, 0};
  ZCK_TRY(lc_enter(c, &p));
  lc_world *w = c->impl;
  lc_reduce(w->posts, w->size, true, (size_t)c->rank * recv_count, recv_count, recv, dt, op);
  return lc_leave(c);
}

static zck_status lc_all_gather(zck_comm *c, const void *send, void *recv, size_t send_count, zck_dtype dt) {
  lc_post p = {LC_ALL_GATHER, send, recv, send_count, dt, ZCK_COMM_SUM, 0};
  ZCK_TRY(lc_enter(c, &p));
  lc_world *w = c->impl;
  size_t bytes = send_count * zck_dtype_size(dt);
  for (int k = 0; k < w->size; k++) {
    uint8_t *dst = (uint8_t *)recv + (size_t)k * bytes;
    if (dst != w->posts[k].send && bytes) memcpy(dst, w->posts[k].send, bytes);
  }
  return lc_leave(c);
}

static zck_status lc_broadcast(zck_comm *c, void *buf, size_t count, zck_dtype dt, int root) {
  ZCK_ASSERT(root >= 0 && root < c->size);
  lc_post p = {LC_BROADCAST, buf, buf, count, dt, ZCK_COMM_SUM, root};
  ZCK_TRY(lc_enter(c, &p));
  lc_world *w = c->impl;
  if (c->rank != root && count) memcpy(buf, w->posts[root].send, count * zck_dtype_size(dt));
  return lc_leave(c);
}

static zck_status lc_barrier(zck_comm *c) {
  lc_post p = {LC_BARRIER, NULL, NULL, 0, ZCK_U8, ZCK_COMM_SUM, 0};
  return lc_enter(c, &p);
}

static void lc_abort(zck_comm *c) {
  lc_world *w = c->impl;
  pthread_mutex_lock(&w->mu);
  w->aborted = true;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

// ---- group lifetime

zck_status zck_comm_local_create(int size, zck_comm **comms) {
  ZCK_ASSERT(size >= 1 && comms);
  lc_world *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  w->size = size;
  w->posts = zck__calloc((size_t)size, sizeof *w->posts);
  w->handles = zck__calloc((size_t)size, sizeof *w->handles);
  if (!w->posts || !w->handles) {
    free(w->posts);
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
    c->backend = "local";
    c->impl = w;
    c->all_reduce = lc_all_reduce;
    c->reduce_scatter = lc_reduce_scatter;
    c->all_gather = lc_all_gather;
    c->broadcast = lc_broadcast;
    c->barrier = lc_barrier;
    c->abort = lc_abort;
    comms[r] = c;
  }
  return ZCK_OK;
}

void zck_comm_local_destroy(zck_comm **comms, int size) {
  if (!comms || size < 1 || !comms[0]) return;
  lc_world *w = comms[0]->impl;
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w->posts);
  free(w->handles);
  free(w);
  for (int r = 0; r < size; r++) comms[r] = NULL;
}
