/* bench_comm_tcp.c: throughput of the tcp backend's collectives (not a test; not run by
 * ctest). Forks W processes on 127.0.0.1 for each W given and times broadcast, all_gather
 * and all_reduce on buffers of 1, 4, 16 and 64 MB (all_gather: the whole gathered buffer
 * is that size): the best and the median of a few timed repetitions after a warm-up (on a
 * shared machine the best is the steadier figure).
 *
 *   bench_comm_tcp [W ...]          (default: 2 3 4)
 *
 * Prints one line per (W, collective, size): milliseconds and "algorithm bandwidth" (the
 * buffer's bytes over the time), as nccl-tests do. On one host every byte crosses the
 * loopback, so the numbers measure the CPU cost of moving the bytes: with fewer cores than
 * ranks a bandwidth-optimal schedule shows little gain; its gain is the root's (full mesh:
 * W-1 copies) or every rank's link on a real network.
 */
#include "comm_proc.h"
#include "test.h"

#include "comm.h"

#include <sys/resource.h>
#include <unistd.h>

enum { B_BCAST, B_GATHER, B_REDUCE, B_N };
static const char *const b_names[B_N] = {"broadcast", "all_gather", "all_reduce"};
static const size_t b_mb[] = {1, 4, 16, 64};
#define B_SIZES (sizeof b_mb / sizeof b_mb[0])

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Seconds for one call of collective k on `bytes` (every rank's slowest: the max over
 * ranks): *best and the median of the repetitions. */
static double cpu_now(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec + 1e-6 * (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* cpu[0]: rank 0's CPU seconds per call (user + system: on one host that is what moving
 * the bytes costs, and it hardly depends on other load), cpu[1]: the most of any rank. */
static double time_one(zck_comm *c, int k, size_t bytes, uint8_t *buf, double *best, double cpu[2]) {
  int reps = bytes <= ((size_t)4 << 20) ? 15 : 7;
  double t[16];
  size_t W = (size_t)c->size;
  double cpu_sum = 0;
  for (int i = -1; i < reps; i++) {
    ZT_OK(c->barrier(c));
    double c0 = cpu_now();
    double t0 = cp_now();
    if (k == B_BCAST) ZT_OK(c->broadcast(c, buf, bytes, ZCK_U8, 0));
    if (k == B_GATHER) {
      size_t n = bytes / W;
      ZT_OK(c->all_gather(c, buf + (size_t)c->rank * n, buf, n, ZCK_U8));
    }
    if (k == B_REDUCE) ZT_OK(c->all_reduce(c, buf, buf, bytes / 4, ZCK_F32, ZCK_COMM_SUM));
    double dt = cp_now() - t0;
    if (i >= 0) cpu_sum += cpu_now() - c0;
    ZT_OK(c->all_reduce(c, &dt, &dt, 1, ZCK_F64, ZCK_COMM_MAX));
    if (i >= 0) t[i] = dt;
  }
  qsort(t, (size_t)reps, sizeof t[0], cmp_double);
  *best = t[0];
  cpu[0] = cpu[1] = cpu_sum / reps;
  ZT_OK(c->broadcast(c, &cpu[0], 1, ZCK_F64, 0));
  ZT_OK(c->all_reduce(c, &cpu[1], &cpu[1], 1, ZCK_F64, ZCK_COMM_MAX));
  return t[reps / 2];
}

static void rank_main(int W, int r, int port) {
  zck_comm_tcp_options o = {r, W, "127.0.0.1", port, 60.0};
  zck_comm *c = NULL;
  ZT_OK(zck_comm_tcp_create(&o, &c));
  uint8_t *buf = calloc(1, b_mb[B_SIZES - 1] << 20);
  ZT_ASSERT(buf);
  for (int k = 0; k < B_N; k++)
    for (size_t s = 0; s < B_SIZES; s++) {
      size_t bytes = b_mb[s] << 20;
      double best, cpu[2], dt = time_one(c, k, bytes, buf, &best, cpu);
      if (r == 0)
        printf("W=%d %-10s %3zu MB  best %8.2f ms %6.2f GB/s  median %8.2f ms %6.2f GB/s  cpu rank0 %7.2f ms max %7.2f ms\n",
               W, b_names[k], b_mb[s], best * 1e3, (double)bytes / best / 1e9, dt * 1e3, (double)bytes / dt / 1e9,
               cpu[0] * 1e3, cpu[1] * 1e3);
      fflush(stdout);
    }
  free(buf);
  zck_comm_tcp_destroy(c);
  exit(0);
}

int main(int argc, char **argv) {
  int ws[8] = {2, 3, 4}, nw = 3;
  if (argc > 1) {
    nw = 0;
    for (int i = 1; i < argc && nw < 8; i++) {
      ws[nw] = atoi(argv[i]);
      if (ws[nw] < 1 || ws[nw] > 8) ZT_FAIL("W=%s: not in 1..8", argv[i]);
      nw++;
    }
  }
  for (int i = 0; i < nw; i++) {
    int W = ws[i], port = cp_free_port(), codes[8];
    pid_t pids[8];
    fflush(NULL);
    for (int r = 0; r < W; r++) {
      pids[r] = fork();
      ZT_ASSERT(pids[r] >= 0);
      if (pids[r] == 0) rank_main(W, r, port);
    }
    if (cp_wait(pids, W, 600.0, codes)) ZT_FAIL("W=%d: a rank failed", W);
  }
  return 0;
}
