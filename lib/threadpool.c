/* threadpool.c: zck__parallel_for on pthreads, with first-error-wins and the failing
 * thread's message carried back to the caller's thread. */
#include "threadpool.h"

#include "error.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ZCK__MAX_THREADS 64u

unsigned zck__default_threads(void) {
  const char *env = getenv("ZCK_THREADS");
  if (env && *env) {
    char *end;
    long v = strtol(env, &end, 10);
    if (*end == 0 && v >= 1) return v > (long)ZCK__MAX_THREADS ? ZCK__MAX_THREADS : (unsigned)v;
  }
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  return n > (long)ZCK__MAX_THREADS ? ZCK__MAX_THREADS : (unsigned)n;
}

unsigned zck__worker_count(size_t n_items, unsigned threads) {
  if (!threads) threads = zck__default_threads();
  if (threads > ZCK__MAX_THREADS) threads = ZCK__MAX_THREADS;
  if ((size_t)threads > n_items) threads = (unsigned)(n_items ? n_items : 1);
  return threads;
}

typedef struct pool {
  size_t n_items;
  zck__item_fn fn;
  void *ctx;
  atomic_size_t next;
  atomic_int stop;
  pthread_mutex_t lock;
  zck_status status;       /* first failure */
  char message[1024];      /* its thread's zck_last_error() */
} pool;

typedef struct worker {
  pool *p;
  unsigned index;
} worker;

static void record_failure(pool *p, zck_status s) {
  pthread_mutex_lock(&p->lock);
  if (p->status == ZCK_OK) {
    p->status = s;
    snprintf(p->message, sizeof p->message, "%s", zck_last_error());
  }
  pthread_mutex_unlock(&p->lock);
  atomic_store(&p->stop, 1);
}

static void run_items(pool *p, unsigned thread) {
  while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
    size_t i = atomic_fetch_add(&p->next, 1);
    if (i >= p->n_items) break;
    zck_status s = p->fn(p->ctx, i, thread);
    if (s != ZCK_OK) {
      record_failure(p, s);
      break;
    }
  }
}

static void *worker_main(void *arg) {
  worker *w = arg;
  run_items(w->p, w->index);
  return NULL;
}

zck_status zck__parallel_for(size_t n_items, unsigned threads, zck__item_fn fn, void *ctx) {
  if (!n_items) return ZCK_OK;
  unsigned n = zck__worker_count(n_items, threads);
  if (n == 1) {
    for (size_t i = 0; i < n_items; i++) ZCK_TRY(fn(ctx, i, 0));
    return ZCK_OK;
  }
  pool p;
  memset(&p, 0, sizeof p);
  p.n_items = n_items;
  p.fn = fn;
  p.ctx = ctx;
  atomic_init(&p.next, 0);
  atomic_init(&p.stop, 0);
  pthread_mutex_init(&p.lock, NULL);
  worker w[ZCK__MAX_THREADS];
  pthread_t tid[ZCK__MAX_THREADS];
  unsigned started = 0;
  /* Workers 1..n-1 are threads; the caller is worker 0, so one thread that cannot be
   * created only costs parallelism, never correctness. */
  for (unsigned i = 1; i < n; i++) {
    w[i] = (worker){&p, i};
    if (pthread_create(&tid[i], NULL, worker_main, &w[i]) != 0) break;
    started = i;
  }
  run_items(&p, 0);
  for (unsigned i = 1; i <= started; i++) pthread_join(tid[i], NULL);
  pthread_mutex_destroy(&p.lock);
  if (p.status != ZCK_OK) return zck__fail(p.status, "%s", p.message);
  return ZCK_OK;
}
