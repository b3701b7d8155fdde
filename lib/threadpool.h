/* threadpool.h: run independent work items on a few pthreads.
 *
 * zck__parallel_for hands items 0..n-1 to `threads` workers, each taking the next item
 * from a shared counter (so items given in file order are read roughly in file order).
 * The first failing item wins: its status and its thread's error message are carried
 * back to the caller's thread, the other workers stop before their next item, and the
 * call returns that status with zck_last_error() set to the failing item's message.
 * With one thread (or one item) everything runs on the calling thread.
 */
#ifndef ZCK_THREADPOOL_H
#define ZCK_THREADPOOL_H

#include "zck.h"

#include <stdbool.h>
#include <stddef.h>

/* fn runs item `item` on worker `thread` (0 <= thread < the worker count), so it can
 * index per-thread scratch space. It must be safe to call concurrently for different
 * items. */
typedef zck_status (*zck__item_fn)(void *ctx, size_t item, unsigned thread);

/* threads 0: zck__default_threads(). Never starts more workers than items. */
zck_status zck__parallel_for(size_t n_items, unsigned threads, zck__item_fn fn, void *ctx);

/* Online CPUs, at least 1, at most 64; overridden by env ZCK_THREADS when set. */
unsigned zck__default_threads(void);

/* The number of workers zck__parallel_for(n_items, threads, ...) starts. */
unsigned zck__worker_count(size_t n_items, unsigned threads);

#endif
