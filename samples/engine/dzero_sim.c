/* dzero_sim.c: the sim device backend (dzero.h): the "device" is host memory and every
 * operation is the CPU engine's loop, so the whole device path runs, and gives the CPU's
 * bits, on machines without a GPU.
 *
 * overlap_comm: the rank's comm stream is a real worker thread that runs a FIFO of
 * closures (copies, conversions, collectives, stream-ordered allocations and frees) while
 * the rank's thread, the compute stream, goes on. An event is the number of closures
 * queued when it was recorded; it is done once the worker has finished that many. The
 * compute stream is the calling thread itself, so its events are done when recorded, and
 * a wait on it blocks the thread. Memory allocated on the comm stream is filled with 0xFF
 * bytes (a NaN in fp32 and bf16) until the worker reaches the allocation and zeroes it:
 * reading a gathered buffer before waiting for its event reads NaN, which the tests see as
 * changed bits. */
#include "dzero.h"

#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum { T_ZERO = 0, T_COPY, T_CONVERT, T_DIV, T_ADD, T_FREE, T_COLL } sim_kind;

typedef struct sim_task {
  sim_kind kind;
  void *dst;
  const void *src;
  size_t n;                    /* bytes (zero, copy) or elements */
  zck_dtype dt, st;
  float divisor;
  zck_comm *comm;
  ze_coll coll;
  struct sim_task *next;
} sim_task;

struct ze_sim {
  int sel;                     /* ZE_STREAM_* the operations go to */
  bool worker;                 /* the comm stream runs */
  unsigned delay_us;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  sim_task *head, *tail;
  uint64_t queued, done;       /* closures queued / finished so far */
  bool stop;
  zck_status err;              /* the comm stream's first failure, and its message */
  char msg[512];
};

zck_status ze_sim_new(ze_sim **out) {
  *out = zck__calloc(1, sizeof **out);
  return *out ? ZCK_OK : zck__fail(ZCK_ERR_NO_MEMORY, "sim device: out of memory");
}

static zck_status sim_drain(ze_sim *s);

void ze_sim_free(ze_sim *s) {
  if (!s) return;
  if (s->worker) {
    (void)sim_drain(s);
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
  }
  free(s);
}

static zck_status run_task(const sim_task *t) {
  switch (t->kind) {
  case T_ZERO: memset(t->dst, 0, t->n); break;
  case T_COPY: memmove(t->dst, t->src, t->n); break;
  case T_CONVERT: zck_convert(t->dt, t->dst, t->st, t->src, t->n); break;
  case T_DIV:
    for (size_t j = 0; j < t->n; j++) ((float *)t->dst)[j] = ((const float *)t->src)[j] / t->divisor;
    break;
  case T_ADD:
    for (size_t j = 0; j < t->n; j++) ((float *)t->dst)[j] += ((const float *)t->src)[j];
    break;
  case T_FREE: free(t->dst); break;
  case T_COLL: return ze_coll_run(t->comm, &t->coll);
  }
  return ZCK_OK;
}

static void *worker_main(void *arg) {
  ze_sim *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
    sim_task *t = s->head;
    if (!t) break;
    s->head = t->next;
    if (!s->head) s->tail = NULL;
    bool failed = s->err != ZCK_OK;
    pthread_mutex_unlock(&s->mu);
    if (s->delay_us) usleep(s->delay_us);
    /* after a failure only the frees run (nothing else would be correct any more) */
    zck_status st = failed && t->kind != T_FREE ? ZCK_OK : run_task(t);
    if (st != ZCK_OK && t->kind == T_COLL) t->comm->abort(t->comm); /* wake the peers */
    pthread_mutex_lock(&s->mu);
    if (st != ZCK_OK && s->err == ZCK_OK) {
      s->err = st;
      snprintf(s->msg, sizeof s->msg, "%s", zck_last_error());
    }
    s->done++;
    pthread_cond_broadcast(&s->cv);
    free(t);
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

static zck_status sim_start(void *ctx, unsigned delay_us) {
  ze_sim *s = ctx;
  if (!s || s->worker) return ZCK_OK;
  s->delay_us = delay_us;
  if (pthread_mutex_init(&s->mu, NULL)) return zck__fail(ZCK_ERR_INTERNAL, "sim device: cannot make a mutex");
  if (pthread_cond_init(&s->cv, NULL)) {
    pthread_mutex_destroy(&s->mu);
    return zck__fail(ZCK_ERR_INTERNAL, "sim device: cannot make a condition variable");
  }
  if (pthread_create(&s->thread, NULL, worker_main, s)) {
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    return zck__fail(ZCK_ERR_INTERNAL, "sim device: cannot start the comm stream's thread");
  }
  s->worker = true;
  return ZCK_OK;
}

static bool on_comm(const ze_sim *s) { return s && s->worker && s->sel == ZE_STREAM_COMM; }

/* The comm stream's failure, reported on the rank's thread. */
static zck_status comm_err(ze_sim *s) {
  return s->err == ZCK_OK ? ZCK_OK : zck__fail(s->err, "%s", s->msg);
}

static zck_status enqueue(ze_sim *s, sim_task t) {
  sim_task *p = malloc(sizeof *p);
  if (!p) return zck__fail(ZCK_ERR_NO_MEMORY, "sim device: out of memory queueing an operation");
  *p = t;
  p->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail) s->tail->next = p;
  else s->head = p;
  s->tail = p;
  s->queued++;
  pthread_cond_broadcast(&s->cv);
  pthread_mutex_unlock(&s->mu);
  return ZCK_OK;
}

/* Blocks until the comm stream has done `upto` closures. */
static zck_status wait_done(ze_sim *s, uint64_t upto) {
  pthread_mutex_lock(&s->mu);
  while (s->done < upto) pthread_cond_wait(&s->cv, &s->mu);
  zck_status st = comm_err(s);
  pthread_mutex_unlock(&s->mu);
  return st;
}

static zck_status sim_drain(ze_sim *s) {
  if (!s || !s->worker) return ZCK_OK;
  pthread_mutex_lock(&s->mu);
  uint64_t q = s->queued;
  pthread_mutex_unlock(&s->mu);
  return wait_done(s, q);
}

/* On the comm stream: queue t; else run it now. */
static zck_status op(void *ctx, sim_task t) {
  ze_sim *s = ctx;
  if (on_comm(s)) return enqueue(s, t);
  return run_task(&t);
}

static zck_status sim_alloc(void *ctx, void **p, size_t bytes) {
  ze_sim *s = ctx;
  if (!on_comm(s)) {
    *p = zck__calloc(bytes ? bytes : 1, 1);
    return *p ? ZCK_OK : zck__fail(ZCK_ERR_NO_MEMORY, "sim device: out of memory for %zu bytes", bytes);
  }
  /* poisoned until the comm stream reaches the allocation (see above) */
  *p = malloc(bytes ? bytes : 1);
  if (!*p) return zck__fail(ZCK_ERR_NO_MEMORY, "sim device: out of memory for %zu bytes", bytes);
  memset(*p, 0xFF, bytes);
  zck_status st = enqueue(s, (sim_task){.kind = T_ZERO, .dst = *p, .n = bytes});
  if (st != ZCK_OK) {
    free(*p);
    *p = NULL;
  }
  return st;
}
static void sim_free(void *ctx, void *p) {
  if (!p) return;
  if (!on_comm(ctx) || enqueue(ctx, (sim_task){.kind = T_FREE, .dst = p}) != ZCK_OK) {
    if (on_comm(ctx)) (void)sim_drain(ctx); /* could not queue it: free it once the stream is idle */
    free(p);
  }
}
static zck_status sim_host_alloc(void *ctx, void **p, size_t bytes) {
  (void)ctx;
  *p = zck__calloc(bytes ? bytes : 1, 1);
  return *p ? ZCK_OK : zck__fail(ZCK_ERR_NO_MEMORY, "sim device: out of memory for %zu bytes", bytes);
}
static void sim_host_free(void *ctx, void *p) {
  (void)ctx;
  free(p);
}
static zck_status sim_copy(void *ctx, void *dst, const void *src, size_t bytes) {
  return op(ctx, (sim_task){.kind = T_COPY, .dst = dst, .src = src, .n = bytes});
}
static zck_status sim_zero(void *ctx, void *p, size_t bytes) {
  return op(ctx, (sim_task){.kind = T_ZERO, .dst = p, .n = bytes});
}
static zck_status sim_convert(void *ctx, zck_dtype dst_dt, void *dst, zck_dtype src_dt, const void *src, size_t n) {
  return op(ctx, (sim_task){.kind = T_CONVERT, .dst = dst, .src = src, .n = n, .dt = dst_dt, .st = src_dt});
}
static zck_status sim_div(void *ctx, float *dst, const float *src, size_t n, float divisor) {
  return op(ctx, (sim_task){.kind = T_DIV, .dst = dst, .src = src, .n = n, .divisor = divisor});
}
static zck_status sim_add(void *ctx, float *acc, const float *src, size_t n) {
  return op(ctx, (sim_task){.kind = T_ADD, .dst = acc, .src = src, .n = n});
}
static zck_status sim_coll(void *ctx, zck_comm *c, const ze_coll *a) {
  return op(ctx, (sim_task){.kind = T_COLL, .comm = c, .coll = *a});
}
/* compute-stream operations: the rank's thread, after the comm stream's work they need
 * (the executor drains the comm stream at the end of each pass) */
static zck_status sim_sumsq(void *ctx, const float *x, size_t n, double *acc) {
  (void)ctx;
  for (size_t i = 0; i < n; i++) *acc += (double)x[i] * x[i];
  return ZCK_OK;
}
static zck_status sim_adamw(void *ctx, float *param, float *grad, float *exp_avg, float *exp_avg_sq, size_t n,
                            const zck_cuda_adamw_args *a) {
  (void)ctx;
  ze_dzero_adamw_host(param, grad, exp_avg, exp_avg_sq, n, a);
  return ZCK_OK;
}
static zck_status sim_sync(void *ctx) { return sim_drain(ctx); }

static int sim_select(void *ctx, int stream) {
  ze_sim *s = ctx;
  if (!s) return ZE_STREAM_COMPUTE;
  int prev = s->sel;
  s->sel = stream;
  return prev;
}
static zck_status sim_event_new(void *ctx, void **ev) {
  (void)ctx;
  *ev = zck__calloc(1, sizeof(uint64_t));
  return *ev ? ZCK_OK : zck__fail(ZCK_ERR_NO_MEMORY, "sim device: out of memory for an event");
}
static void sim_event_free(void *ctx, void *ev) {
  (void)ctx;
  free(ev);
}
static zck_status sim_record(void *ctx, void *ev) {
  ze_sim *s = ctx;
  uint64_t at = 0; /* the compute stream: done already */
  if (on_comm(s)) {
    pthread_mutex_lock(&s->mu);
    at = s->queued;
    pthread_mutex_unlock(&s->mu);
  }
  *(uint64_t *)ev = at;
  return ZCK_OK;
}
static zck_status sim_wait(void *ctx, void *ev) {
  ze_sim *s = ctx;
  /* the comm stream waiting for the compute stream: already done (it runs inline) */
  if (!s || !s->worker || s->sel == ZE_STREAM_COMM) return ZCK_OK;
  return wait_done(s, *(const uint64_t *)ev);
}
static int sim_query(void *ctx, void *ev) {
  ze_sim *s = ctx;
  if (!s || !s->worker) return 1;
  pthread_mutex_lock(&s->mu);
  int r = s->err != ZCK_OK ? -1 : s->done >= *(const uint64_t *)ev;
  pthread_mutex_unlock(&s->mu);
  return r;
}

static zck_status sim_read4(void *ctx, void *dst, uint64_t off, uint64_t count) {
  memcpy(dst, (const uint8_t *)ctx + off * 4, (size_t)count * 4);
  return ZCK_OK;
}
static zck_status sim_read2(void *ctx, void *dst, uint64_t off, uint64_t count) {
  memcpy(dst, (const uint8_t *)ctx + off * 2, (size_t)count * 2);
  return ZCK_OK;
}
static zck_status sim_write4(void *ctx, const void *src, uint64_t off, uint64_t count) {
  memcpy((uint8_t *)ctx + off * 4, src, (size_t)count * 4);
  return ZCK_OK;
}
static zck_status sim_write2(void *ctx, const void *src, uint64_t off, uint64_t count) {
  memcpy((uint8_t *)ctx + off * 2, src, (size_t)count * 2);
  return ZCK_OK;
}
static zck_status sim_gather16(void *ctx, const zck_gather_plan *p, const zck_gather_src *srcs, zck_gather_write_fn write,
                               void *wctx) {
  ZCK_TRY(sim_drain(ctx));
  return zck_gather_run_host(p, srcs, write, wctx);
}

const ze_dev_ops ze_dev_ops_sim = {
    .name = "sim", .alloc = sim_alloc, .free = sim_free, .host_alloc = sim_host_alloc, .host_free = sim_host_free,
    .copy = sim_copy, .zero = sim_zero, .convert = sim_convert, .div = sim_div, .add = sim_add,
    .sumsq = sim_sumsq, .adamw = sim_adamw, .sync = sim_sync, .read4 = sim_read4, .read2 = sim_read2,
    .write4 = sim_write4, .write2 = sim_write2, .gather16 = sim_gather16, .used = NULL,
    .start = sim_start, .select = sim_select, .event_new = sim_event_new, .event_free = sim_event_free,
    .record = sim_record, .wait = sim_wait, .query = sim_query, .coll = sim_coll};
