/* test_comm_ranks.c: the collective engine behind the cuda-local backend (cuda/comm_ranks.c),
 * run with its host memory ops, against lib/comm_local.c byte for byte: every collective,
 * in and out of place, every reducible dtype and op, W = 1..6; then disagreeing calls and
 * abort. The device ops are compared the same way in test_gpu_comm.c. */
#include "test.h"

#include "comm.h"
#include "cuda_internal.h"

#include <math.h>
#include <pthread.h>

#define N 37
#define OUT_BYTES 65536

typedef struct job {
  zck_comm *c;
  uint8_t *out;  /* OUT_BYTES */
  size_t used;
  int mode;      /* 0: collectives, 1: disagree, 2: abort */
  char err[256];
} job;

static float val(int rank, int i) {
  /* values whose sums depend on the order: mixed magnitudes and signs */
  return (float)((rank * 7919 + i * 104729) % 1000 - 500) * (i % 3 == 0 ? 1e-7f : 1.0f) + (float)rank * 0.1f;
}

static void emit(job *j, const void *p, size_t n) {
  if (j->used + n > OUT_BYTES) abort();
  memcpy(j->out + j->used, p, n);
  j->used += n;
}

#define CHECK(expr) do { zck_status s_ = (expr); if (s_ != ZCK_OK) { snprintf(j->err, sizeof j->err, "rank %d line %d: %s", r, __LINE__, zck_last_error()); return NULL; } } while (0)

static void *run(void *arg) {
  job *j = arg;
  zck_comm *c = j->c;
  int r = c->rank, W = c->size;
  if (j->mode == 1) {
    float x[4] = {0};
    zck_status s = r == W - 1 ? c->all_gather(c, x, x, 1, ZCK_F32) : c->all_reduce(c, x, x, 4, ZCK_F32, ZCK_COMM_SUM);
    if (s != ZCK_ERR_INVALID_ARG || !strstr(zck_last_error(), "ranks disagree"))
      snprintf(j->err, sizeof j->err, "rank %d: disagreement not reported: %s", r, zck_last_error());
    else if (c->barrier(c) != ZCK_OK)
      snprintf(j->err, sizeof j->err, "rank %d: group unusable after a disagreement", r);
    return NULL;
  }
  if (j->mode == 2) {
    if (r == 0) {
      c->abort(c);
      return NULL;
    }
    zck_status s = c->barrier(c);
    if (s != ZCK_ERR_INTERNAL || !strstr(zck_last_error(), "another rank failed"))
      snprintf(j->err, sizeof j->err, "rank %d: abort not seen: %s", r, zck_last_error());
    return NULL;
  }
  float send[N], recv[N];
  for (int i = 0; i < N; i++) send[i] = val(r, i);
  for (int op = 0; op < 3; op++) {
    CHECK(c->all_reduce(c, send, recv, N, ZCK_F32, (zck_comm_op)op));
    emit(j, recv, sizeof recv);
  }
  CHECK(c->all_reduce(c, send, send, N, ZCK_F32, ZCK_COMM_SUM));
  emit(j, send, sizeof send);
  double d[N];
  int32_t i32[N];
  int64_t i64[N];
  uint16_t h[N];
  for (int i = 0; i < N; i++) {
    d[i] = (double)val(r, i) * 1e-3 + r;
    i32[i] = (int32_t)(r * 1000 - i);
    i64[i] = (int64_t)r * 10000000000ll - i;
  }
  CHECK(c->all_reduce(c, d, d, N, ZCK_F64, ZCK_COMM_SUM));
  emit(j, d, sizeof d);
  CHECK(c->all_reduce(c, i32, i32, N, ZCK_I32, ZCK_COMM_SUM));
  emit(j, i32, sizeof i32);
  CHECK(c->all_reduce(c, i64, i64, N, ZCK_I64, ZCK_COMM_MAX));
  emit(j, i64, sizeof i64);
  for (int dt = 0; dt < 2; dt++) {
    zck_dtype t = dt ? ZCK_F16 : ZCK_BF16;
    for (int i = 0; i < N; i++) {
      float f = val(r, i);
      zck_convert(t, &h[i], ZCK_F32, &f, 1);
    }
    CHECK(c->all_reduce(c, h, h, N, t, ZCK_COMM_SUM));
    emit(j, h, sizeof h);
  }
  /* reduce_scatter, out of place and in place */
  float *big = calloc((size_t)W * N, sizeof(float)), part[N];
  for (int i = 0; i < W * N; i++) big[i] = val(r, i);
  CHECK(c->reduce_scatter(c, big, part, N, ZCK_F32, ZCK_COMM_SUM));
  emit(j, part, sizeof part);
  CHECK(c->reduce_scatter(c, big, big + (size_t)r * N, N, ZCK_F32, ZCK_COMM_MIN));
  emit(j, big + (size_t)r * N, sizeof part);
  free(big);
  /* all_gather, out of place and in place */
  uint16_t mine[N], *all = calloc((size_t)W * N, sizeof(uint16_t));
  for (int i = 0; i < N; i++) mine[i] = (uint16_t)(r * 1000 + i);
  CHECK(c->all_gather(c, mine, all, N, ZCK_BF16));
  emit(j, all, (size_t)W * N * 2);
  memset(all, 0, (size_t)W * N * 2);
  for (int i = 0; i < N; i++) all[(size_t)r * N + i] = (uint16_t)(r * 77 + i);
  CHECK(c->all_gather(c, all + (size_t)r * N, all, N, ZCK_U16));
  emit(j, all, (size_t)W * N * 2);
  free(all);
  /* broadcast from the last rank */
  int32_t b[5] = {r, r, r, r, r};
  CHECK(c->broadcast(c, b, 5, ZCK_I32, W - 1));
  emit(j, b, sizeof b);
  CHECK(c->barrier(c));
  return NULL;
}

static void run_group(zck_comm **comms, int W, int mode, job *jobs, uint8_t *outs) {
  pthread_t th[8];
  for (int r = 0; r < W; r++) {
    jobs[r] = (job){comms[r], outs ? outs + (size_t)r * OUT_BYTES : NULL, 0, mode, ""};
    pthread_create(&th[r], NULL, run, &jobs[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < W; r++)
    if (jobs[r].err[0]) ZT_FAIL("W %d mode %d: %s", W, mode, jobs[r].err);
}

int main(void) {
  for (int W = 1; W <= 6; W++) {
    zck_comm *a[8], *b[8];
    job ja[8], jb[8];
    uint8_t *oa = calloc((size_t)W, OUT_BYTES), *ob = calloc((size_t)W, OUT_BYTES);
    ZT_OK(zck_comm_local_create(W, a));
    ZT_OK(zck__ranks_create_host(W, b));
    ZT_EQ_STR(b[0]->backend, "host-ranks");
    ZT_ASSERT(zck__ranks_is(b[0]) && !zck__ranks_is(a[0]));
    run_group(a, W, 0, ja, oa);
    run_group(b, W, 0, jb, ob);
    for (int r = 0; r < W; r++) {
      ZT_EQ_U64(ja[r].used, jb[r].used);
      if (memcmp(oa + (size_t)r * OUT_BYTES, ob + (size_t)r * OUT_BYTES, ja[r].used))
        ZT_FAIL("W %d rank %d: the ranks engine's results differ from comm_local's", W, r);
    }
    if (W > 1) {
      run_group(b, W, 1, jb, NULL);
      run_group(b, W, 2, jb, NULL);
    }
    zck_comm_local_destroy(a, W);
    zck__ranks_destroy(b, W);
    free(oa);
    free(ob);
  }
  zck_comm *too[65];
  ZT_ERR(zck__ranks_create_host(65, too), ZCK_ERR_INVALID_ARG, "65 ranks; at most 64");
  printf("comm ranks: ok\n");
  return 0;
}
