/* test_comm_ranks.c: the collective engine of lib/comm_ranks.c, which is both the local
 * backend (host ops) and cuda-local (device ops), through its ops table: a group whose ops
 * wrap the host ones and count the calls gives the local backend's bytes for every
 * collective, in and out of place, every reducible dtype and op, W = 1..6, and each rank
 * calls enter once per collective and barrier and leave once per collective; disagreeing
 * calls, abort, and an enter that fails on one rank (the others are told, none waits);
 * 65 ranks (the engine has no cap; cuda-local's 64 is its own). The device ops are
 * compared with the local backend in test_gpu_comm.c. (The local backend's results
 * themselves are checked in tests/engine/test_comm_local.c.) */
#include "test.h"

#include "comm.h"
#include "cuda_internal.h"
#include "error.h"

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

// ---- ops that wrap the host ones and count (each rank touches its own slots only)

typedef struct counted {
  int enters[8], leaves[8];
  int fail_rank, fail_at;      /* enter fails on that rank's fail_at-th call (0: never) */
  int destroyed;
} counted;

static zck_status ct_reduce(void *ctx, int rank, const void *const *srcs, int n_src, size_t src_off, void *const *dsts,
                            int n_dst, size_t dst_off, size_t n, zck_dtype dt, zck_comm_op op) {
  return zck__ranks_host_ops.reduce(ctx, rank, srcs, n_src, src_off, dsts, n_dst, dst_off, n, dt, op);
}
static zck_status ct_copy(void *ctx, int rank, void *dst, const void *src, size_t bytes) {
  return zck__ranks_host_ops.copy(ctx, rank, dst, src, bytes);
}
static zck_status ct_enter(void *ctx, int rank) {
  counted *k = ctx;
  if (++k->enters[rank] == k->fail_at && rank == k->fail_rank) return zck__fail(ZCK_ERR_IO, "rank %d: its stream failed", rank);
  return ZCK_OK;
}
static zck_status ct_leave(void *ctx, int rank) {
  ((counted *)ctx)->leaves[rank]++;
  return ZCK_OK;
}
static void ct_destroy(void *ctx) { ((counted *)ctx)->destroyed++; }
static const zck__ranks_ops kCounted = {ct_reduce, ct_copy, ct_enter, ct_leave, ct_destroy};

static void *enter_fails(void *arg) {
  job *j = arg;
  zck_comm *c = j->c;
  float x[3] = {1, 2, 3};
  zck_status s = ZCK_OK;
  for (int i = 0; i < 4 && s == ZCK_OK; i++) s = c->all_reduce(c, x, x, 3, ZCK_F32, ZCK_COMM_SUM);
  const char *want = c->rank == 1 ? "its stream failed" : "another rank failed";
  if (s == ZCK_OK || !strstr(zck_last_error(), want))
    snprintf(j->err, sizeof j->err, "rank %d: %s (wanted \"%s\")", c->rank, zck_last_error(), want);
  return NULL;
}

static void *sum65(void *arg) {
  job *j = arg;
  int64_t v = j->c->rank;
  if (j->c->all_reduce(j->c, &v, &v, 1, ZCK_I64, ZCK_COMM_SUM) != ZCK_OK || v != 65 * 64 / 2)
    snprintf(j->err, sizeof j->err, "rank %d: sum %lld", j->c->rank, (long long)v);
  return NULL;
}

int main(void) {
  for (int W = 1; W <= 6; W++) {
    zck_comm *a[8], *b[8];
    job ja[8], jb[8];
    counted k = {{0}, {0}, -1, 0, 0};
    uint8_t *oa = calloc((size_t)W, OUT_BYTES), *ob = calloc((size_t)W, OUT_BYTES);
    ZT_OK(zck_comm_local_create(W, a));
    ZT_OK(zck__ranks_create(W, &kCounted, &k, "counted", b));
    ZT_EQ_STR(a[0]->backend, "local");
    ZT_EQ_STR(b[0]->backend, "counted");
    ZT_ASSERT(zck__ranks_is(b[0]) && zck__ranks_is(a[0]) && zck__ranks_ops_ctx(b[0]) == &k);
    run_group(a, W, 0, ja, oa);
    run_group(b, W, 0, jb, ob);
    for (int r = 0; r < W; r++) {
      ZT_EQ_U64(ja[r].used, jb[r].used);
      if (memcmp(oa + (size_t)r * OUT_BYTES, ob + (size_t)r * OUT_BYTES, ja[r].used))
        ZT_FAIL("W %d rank %d: the counted ops' results differ from the local backend's", W, r);
      /* 14 collectives and one barrier */
      ZT_EQ_INT(k.enters[r], 15);
      ZT_EQ_INT(k.leaves[r], 14);
    }
    if (W > 1) {
      run_group(b, W, 1, jb, NULL);
      run_group(b, W, 2, jb, NULL);
    }
    zck_comm_local_destroy(a, W);
    zck__ranks_destroy(b, W);
    ZT_EQ_INT(k.destroyed, 1);
    free(oa);
    free(ob);
  }
  /* an enter that fails on rank 1 at its third collective */
  {
    zck_comm *g[3];
    counted k = {{0}, {0}, 1, 3, 0};
    job jobs[3];
    pthread_t th[3];
    ZT_OK(zck__ranks_create(3, &kCounted, &k, "counted", g));
    for (int r = 0; r < 3; r++) {
      jobs[r] = (job){g[r], NULL, 0, 0, ""};
      pthread_create(&th[r], NULL, enter_fails, &jobs[r]);
    }
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 3; r++)
      if (jobs[r].err[0]) ZT_FAIL("failing enter: %s", jobs[r].err);
    zck__ranks_destroy(g, 3);
  }
  /* 65 rank threads of the local backend */
  {
    zck_comm *g[65];
    job jobs[65];
    pthread_t th[65];
    ZT_OK(zck_comm_local_create(65, g));
    for (int r = 0; r < 65; r++) {
      jobs[r] = (job){g[r], NULL, 0, 0, ""};
      pthread_create(&th[r], NULL, sum65, &jobs[r]);
    }
    for (int r = 0; r < 65; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 65; r++)
      if (jobs[r].err[0]) ZT_FAIL("65 ranks: %s", jobs[r].err);
    zck_comm_local_destroy(g, 65);
  }
  zck__ranks_destroy(NULL, 0);
  printf("comm ranks: ok\n");
  return 0;
}
