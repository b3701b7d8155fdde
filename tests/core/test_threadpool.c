/* test_threadpool.c: zck__parallel_for runs every item once and carries the first
 * failing thread's message back to the caller. */
#include "error.h"
#include "test.h"
#include "threadpool.h"

#include <stdatomic.h>
#include <unistd.h>

typedef struct ctx {
  atomic_int hits[1000];
  atomic_uint max_thread;
  size_t fail_at;
} ctx;

static zck_status count_item(void *p, size_t item, unsigned thread) {
  ctx *c = p;
  atomic_fetch_add(&c->hits[item], 1);
  unsigned m = atomic_load(&c->max_thread);
  while (thread > m && !atomic_compare_exchange_weak(&c->max_thread, &m, thread)) {
  }
  if (c->fail_at != (size_t)-1 && item > c->fail_at) usleep(200); /* the rest is slow: stopping must matter */
  if (item == c->fail_at) {
    return zck__fail(ZCK_ERR_IO, "item %zu: disk on fire", item);
  }
  return ZCK_OK;
}

int main(void) {
  ZT_ASSERT(zck__default_threads() >= 1);
  ZT_EQ_INT(zck__worker_count(3, 8), 3);
  ZT_EQ_INT(zck__worker_count(0, 8), 1);
  ZT_EQ_INT(zck__worker_count(100, 4), 4);
  for (unsigned threads = 1; threads <= 5; threads++) {
    static ctx c;
    memset(&c, 0, sizeof c);
    c.fail_at = (size_t)-1;
    ZT_OK(zck__parallel_for(1000, threads, count_item, &c));
    for (int i = 0; i < 1000; i++) ZT_EQ_INT(atomic_load(&c.hits[i]), 1);
    ZT_ASSERT(atomic_load(&c.max_thread) < threads);

    memset(&c, 0, sizeof c);
    c.fail_at = 137;
    zck_clear_error();
    ZT_ERR(zck__parallel_for(1000, threads, count_item, &c), ZCK_ERR_IO, "item 137: disk on fire");
    /* stopped early: not every item ran (with one thread, none after 137) */
    int ran = 0;
    for (int i = 0; i < 1000; i++) ran += atomic_load(&c.hits[i]);
    ZT_ASSERT(ran < 500);
    if (threads == 1) ZT_EQ_INT(ran, 138);
  }
  ZT_OK(zck__parallel_for(0, 4, count_item, NULL));
  return 0;
}
