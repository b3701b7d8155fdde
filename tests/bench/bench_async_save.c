/* bench_async_save.c: what a save costs the training loop of zckpt-train, in one process
 * and one run of this program, so every figure is measured under the same load:
 *  - stall per save: the time rank 0's step loop is blocked in a save (the median over the
 *    saves of a run), for a synchronous save and for --async-save (the snapshot to host
 *    memory, the ranks' agreement, and any wait for the save before), and within the
 *    latter rank 0's snapshot copy alone;
 *  - the snapshot's floor: W threads each memcpy-ing its rank's snapshot bytes between two
 *    buffers already touched (the snapshot buffers are reused after the first save), the
 *    best of several tries;
 *  - the step loop's time with async saves against the same run with no saves at all.
 * Printed as ratios (async stall / floor, sync stall / async stall, async loop / no-save
 * loop) with the absolute times beside them.
 *
 * usage: bench_async_save OUT_DIR [n_layer n_embd ranks stage steps save_steps]
 * (defaults: 2 256 2 3 36 6: a 1.65M-parameter GPT-2, ZeRO-3 bf16 on 2 rank threads). */
#include "train.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(const double *v, int64_t n) {
  if (n <= 0) return 0.0;
  double *c = malloc((size_t)n * sizeof *c);
  memcpy(c, v, (size_t)n * sizeof *c);
  qsort(c, (size_t)n, sizeof *c, cmp_d);
  double m = c[n / 2];
  free(c);
  return m;
}

// ---- the floor: W threads, each copying its rank's bytes

typedef struct copy_job {
  void *dst, *src;
  size_t n;
} copy_job;

static void *copy_main(void *arg) {
  copy_job *j = arg;
  memcpy(j->dst, j->src, j->n);
  return NULL;
}

static double copy_floor(const uint64_t *bytes, int W) {
  copy_job jobs[64];
  pthread_t th[64];
  for (int r = 0; r < W; r++) {
    jobs[r].n = (size_t)bytes[r];
    jobs[r].src = malloc(jobs[r].n + 1);
    jobs[r].dst = malloc(jobs[r].n + 1);
    memset(jobs[r].src, 1, jobs[r].n);
    memset(jobs[r].dst, 2, jobs[r].n);
  }
  double best = 1e30;
  for (int t = 0; t < 7; t++) {
    double t0 = now_s();
    for (int r = 0; r < W; r++) pthread_create(&th[r], NULL, copy_main, &jobs[r]);
    for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
    double dt = now_s() - t0;
    if (dt < best) best = dt;
  }
  for (int r = 0; r < W; r++) {
    free(jobs[r].src);
    free(jobs[r].dst);
  }
  return best;
}

// ---- the runs

static ze_train_args args_for(int L, int C, int W, int stage, int steps, int save_steps, const char *out) {
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = (ze_gpt2_config){256, 32, L, 4, C};
  a.max_steps = steps;
  a.save_steps = save_steps;
  a.per_device_train_batch_size = 2;
  a.ranks = W;
  a.zero_stage = stage;
  a.bf16 = true;
  a.eval_samples = 2;
  a.logging_steps = 0;
  a.quiet = true;
  a.output_dir = out;
  return a;
}

static void run(const ze_train_args *a, ze_train_result *r, const char *what) {
  if (ze_train_run(a, r) != ZCK_OK) {
    fprintf(stderr, "bench_async_save: %s run: %s\n", what, zck_last_error());
    exit(1);
  }
}

int main(int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: bench_async_save OUT_DIR [n_layer n_embd ranks stage steps save_steps]\n");
    return 2;
  }
  const char *dir = argv[1];
  int L = argc > 2 ? atoi(argv[2]) : 2, C = argc > 3 ? atoi(argv[3]) : 384, W = argc > 4 ? atoi(argv[4]) : 2;
  int stage = argc > 5 ? atoi(argv[5]) : 3, steps = argc > 6 ? atoi(argv[6]) : 36, every = argc > 7 ? atoi(argv[7]) : 6;
  char out_sync[4096], out_async[4096];
  snprintf(out_sync, sizeof out_sync, "%s/sync", dir);
  snprintf(out_async, sizeof out_async, "%s/async", dir);
  ze_train_args none = args_for(L, C, W, stage, steps, every, NULL);
  ze_train_args sync = args_for(L, C, W, stage, steps, every, out_sync);
  ze_train_args async = args_for(L, C, W, stage, steps, every, out_async);
  async.async_save = true;
  /* interleaved twice, the better of each kept: the machine is shared */
  double loop_none = 1e30, loop_async = 1e30, stall_sync = 1e30, stall_async = 1e30, max_async = 0, copy = 1e30;
  uint64_t snap[64] = {0};
  int64_t saves = 0;
  for (int rep = 0; rep < 2; rep++) {
    ze_train_result rn, rs, ra;
    run(&none, &rn, "no-save");
    run(&sync, &rs, "sync");
    run(&async, &ra, "async");
    if (rn.loop_seconds < loop_none) loop_none = rn.loop_seconds;
    if (ra.loop_seconds < loop_async) loop_async = ra.loop_seconds;
    double ms = median(rs.save_stalls, rs.n_saves), ma = median(ra.save_stalls, ra.n_saves);
    if (ms < stall_sync) stall_sync = ms;
    if (ma < stall_async) stall_async = ma;
    double mc = median(ra.snapshot_seconds, ra.n_saves);
    if (mc < copy) copy = mc;
    if (ra.save_stall_max > max_async) max_async = ra.save_stall_max;
    saves = ra.n_saves;
    memcpy(snap, ra.snapshot_bytes, (size_t)W * sizeof *snap);
    ze_train_result_free(&rn);
    ze_train_result_free(&rs);
    ze_train_result_free(&ra);
  }
  uint64_t total = 0;
  for (int r = 0; r < W; r++) total += snap[r];
  double floor_s = copy_floor(snap, W);
  printf("bench_async_save: GPT-2 L=%d C=%d, ZeRO-%d bf16 on %d rank threads, %d steps, a save every %d (%lld saves)\n",
         L, C, stage, W, steps, every, (long long)saves);
  printf("  snapshot: %.1f MiB over %d ranks; memcpy floor %.2f ms\n", (double)total / 1048576.0, W, 1e3 * floor_s);
  printf("  stall per save (median): sync %.2f ms, async %.2f ms (longest async %.2f ms), of which rank 0's snapshot "
         "copy %.2f ms\n",
         1e3 * stall_sync, 1e3 * stall_async, 1e3 * max_async, 1e3 * copy);
  printf("  step loop: no saves %.3f s, async saves %.3f s\n", loop_none, loop_async);
  printf("ratios: async stall / snapshot floor %.2f (snapshot copy / floor %.2f) | sync stall / async stall %.1f | "
         "async loop / no-save loop %.3f\n",
         stall_async / floor_s, copy / floor_s, stall_sync / stall_async, loop_async / loop_none);
  return 0;
}
