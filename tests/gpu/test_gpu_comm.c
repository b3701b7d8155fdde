/* test_gpu_comm.c: the device collectives against lib/comm_local.c (host buffers), byte for
 * byte: the cuda-local backend (W = 1..5 ranks sharing device 0) reduces in rank order on
 * the device, so every result must equal the CPU backend's; NCCL (create_local with 2
 * ranks, when there are 2 devices) must too: a sum of two values is the same whichever
 * rank adds. Also a one-rank NCCL communicator through get_unique_id / init_rank, the
 * disagreement message and abort. */
#include "gpu_util.h"

#include "comm.h"

#include <pthread.h>

#define N 37
#define OUT_BYTES 65536

typedef struct job {
  zck_comm *c;
  int dev;        /* buffers in device memory */
  uint8_t *out;
  size_t used;
  char err[256];
} job;

static float val(int rank, int i) {
  return (float)((rank * 7919 + i * 104729) % 1000 - 500) * (i % 3 == 0 ? 1e-7f : 1.0f) + (float)rank * 0.1f;
}

static void emit(job *j, const void *p, size_t n) {
  if (j->used + n > OUT_BYTES) abort();
  memcpy(j->out + j->used, p, n);
  j->used += n;
}

/* A buffer the collective sees: the host one, or a device copy of it. */
static void *see(job *j, void *host, size_t bytes) {
  if (!j->dev) return host;
  void *d = NULL;
  if (zck_cuda_malloc(&d, bytes ? bytes : 4) != ZCK_OK || zck_cuda_memcpy(d, host, bytes) != ZCK_OK) abort();
  return d;
}
static void back(job *j, void *host, void *seen, size_t bytes) {
  if (!j->dev) return;
  if (zck_cuda_memcpy(host, seen, bytes) != ZCK_OK) abort();
  zck_cuda_free(seen);
}

#define CHECK(expr) do { zck_status s_ = (expr); if (s_ != ZCK_OK) { snprintf(j->err, sizeof j->err, "rank %d line %d: %s", r, __LINE__, zck_last_error()); return NULL; } } while (0)

static void *run(void *arg) {
  job *j = arg;
  zck_comm *c = j->c;
  int r = c->rank, W = c->size;
  /* NCCL ranks of one process live on devices 0..W-1; cuda-local ranks share device 0 */
  if (j->dev && zck_cuda_set_device(strcmp(c->backend, "nccl") ? 0 : r) != ZCK_OK) abort();
  float send[N], recv[N];
  for (int i = 0; i < N; i++) send[i] = val(r, i);
  for (int op = 0; op < 3; op++) {
    void *s = see(j, send, sizeof send), *q = see(j, recv, sizeof recv);
    CHECK(c->all_reduce(c, s, q, N, ZCK_F32, (zck_comm_op)op));
    back(j, recv, q, sizeof recv);
    back(j, send, s, sizeof send);
    emit(j, recv, sizeof recv);
  }
  {
    void *s = see(j, send, sizeof send);
    CHECK(c->all_reduce(c, s, s, N, ZCK_F32, ZCK_COMM_SUM));
    back(j, send, s, sizeof send);
    emit(j, send, sizeof send);
  }
  double d[N];
  int32_t i32[N];
  int64_t i64[N];
  uint16_t h[N];
  for (int i = 0; i < N; i++) {
    d[i] = (double)val(r, i) * 1e-3 + r;
    i32[i] = (int32_t)(r * 1000 - i);
    i64[i] = (int64_t)r * 10000000000ll - i;
  }
  void *x = see(j, d, sizeof d);
  CHECK(c->all_reduce(c, x, x, N, ZCK_F64, ZCK_COMM_SUM));
  back(j, d, x, sizeof d);
  emit(j, d, sizeof d);
  x = see(j, i32, sizeof i32);
  CHECK(c->all_reduce(c, x, x, N, ZCK_I32, ZCK_COMM_SUM));
  back(j, i32, x, sizeof i32);
  emit(j, i32, sizeof i32);
  x = see(j, i64, sizeof i64);
  CHECK(c->all_reduce(c, x, x, N, ZCK_I64, ZCK_COMM_MAX));
  back(j, i64, x, sizeof i64);
  emit(j, i64, sizeof i64);
  for (int dt = 0; dt < 2; dt++) {
    zck_dtype t = dt ? ZCK_F16 : ZCK_BF16;
    for (int i = 0; i < N; i++) {
      float f = val(r, i);
      zck_convert(t, &h[i], ZCK_F32, &f, 1);
    }
    x = see(j, h, sizeof h);
    CHECK(c->all_reduce(c, x, x, N, t, ZCK_COMM_SUM));
    back(j, h, x, sizeof h);
    emit(j, h, sizeof h);
  }
  float *big = calloc((size_t)W * N, sizeof(float)), part[N];
  for (int i = 0; i < W * N; i++) big[i] = val(r, i);
  void *bs = see(j, big, (size_t)W * N * 4), *ps = see(j, part, sizeof part);
  CHECK(c->reduce_scatter(c, bs, ps, N, ZCK_F32, ZCK_COMM_SUM));
  back(j, part, ps, sizeof part);
  emit(j, part, sizeof part);
  CHECK(c->reduce_scatter(c, bs, (float *)bs + (size_t)r * N, N, ZCK_F32, ZCK_COMM_MIN));
  back(j, big, bs, (size_t)W * N * 4);
  emit(j, big + (size_t)r * N, sizeof part);
  free(big);
  uint16_t mine[N], *all = calloc((size_t)W * N, sizeof(uint16_t));
  for (int i = 0; i < N; i++) mine[i] = (uint16_t)(r * 1000 + i);
  void *ms = see(j, mine, sizeof mine), *as = see(j, all, (size_t)W * N * 2);
  CHECK(c->all_gather(c, ms, as, N, ZCK_BF16));
  back(j, all, as, (size_t)W * N * 2);
  back(j, mine, ms, sizeof mine);
  emit(j, all, (size_t)W * N * 2);
  memset(all, 0, (size_t)W * N * 2);
  for (int i = 0; i < N; i++) all[(size_t)r * N + i] = (uint16_t)(r * 77 + i);
  as = see(j, all, (size_t)W * N * 2);
  CHECK(c->all_gather(c, (uint16_t *)as + (size_t)r * N, as, N, ZCK_U16));
  back(j, all, as, (size_t)W * N * 2);
  emit(j, all, (size_t)W * N * 2);
  free(all);
  int32_t b[5] = {r, r, r, r, r};
  x = see(j, b, sizeof b);
  CHECK(c->broadcast(c, x, 5, ZCK_I32, W - 1));
  back(j, b, x, sizeof b);
  emit(j, b, sizeof b);
  CHECK(c->barrier(c));
  return NULL;
}

static void run_group(zck_comm **comms, int W, int dev, job *jobs, uint8_t *outs) {
  pthread_t th[8];
  for (int r = 0; r < W; r++) {
    jobs[r] = (job){comms[r], dev, outs + (size_t)r * OUT_BYTES, 0, ""};
    pthread_create(&th[r], NULL, run, &jobs[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < W; r++)
    if (jobs[r].err[0]) ZT_FAIL("%s W %d: %s", comms[0]->backend, W, jobs[r].err);
}

static void compare_with_local(zck_comm **dev, int W) {
  zck_comm *host[8];
  job jh[8], jd[8];
  uint8_t *oh = calloc((size_t)W, OUT_BYTES), *od = calloc((size_t)W, OUT_BYTES);
  ZT_OK(zck_comm_local_create(W, host));
  run_group(host, W, 0, jh, oh);
  run_group(dev, W, 1, jd, od);
  for (int r = 0; r < W; r++) {
    ZT_EQ_U64(jh[r].used, jd[r].used);
    if (memcmp(oh + (size_t)r * OUT_BYTES, od + (size_t)r * OUT_BYTES, jh[r].used))
      ZT_FAIL("%s W %d rank %d: results differ from the CPU local backend's", dev[0]->backend, W, r);
  }
  printf("  %-10s W=%d: every collective identical to the CPU local backend\n", dev[0]->backend, W);
  zck_comm_local_destroy(host, W);
  free(oh);
  free(od);
}

static void *abort_job(void *arg) {
  zck_comm *c = arg;
  if (c->rank == 0) {
    c->abort(c);
    return NULL;
  }
  zck_status s = c->barrier(c);
  if (s != ZCK_ERR_INTERNAL || !strstr(zck_last_error(), "another rank failed")) {
    fprintf(stderr, "rank %d: abort not seen: %s\n", c->rank, zck_last_error());
    exit(1);
  }
  return NULL;
}

int main(void) {
  if (zck_cuda_device_count() == 0) zt_skip("no CUDA device");
  for (int W = 1; W <= 5; W++) {
    zck_comm *c[8];
    ZT_OK(zck_comm_cuda_local_create(W, 0, c));
    ZT_EQ_STR(c[0]->backend, "cuda-local");
    compare_with_local(c, W);
    if (W == 3) {
      pthread_t th[3];
      for (int r = 0; r < 3; r++) pthread_create(&th[r], NULL, abort_job, c[r]);
      for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    }
    zck_comm_nccl_destroy_local(c, W);
  }
  /* create_local: NCCL when there are enough devices, else cuda-local */
  int ndev = zck_cuda_device_count();
  {
    zck_comm *c[2];
    ZT_OK(zck_comm_nccl_create_local(2, c));
    const char *want = zck_cuda_has_nccl() && ndev >= 2 ? "nccl" : "cuda-local";
    ZT_EQ_STR(c[0]->backend, want);
    compare_with_local(c, 2);
    zck_comm_nccl_destroy_local(c, 2);
  }
  if (zck_cuda_has_nccl()) {
    /* one process per GPU, here with one rank */
    uint8_t id[ZCK_NCCL_ID_BYTES];
    ZT_OK(zck_comm_nccl_get_unique_id(id));
    ZT_OK(zck_cuda_set_device(0));
    zck_comm *one;
    ZT_OK(zck_comm_nccl_init_rank(1, 0, id, &one));
    ZT_EQ_STR(one->backend, "nccl");
    compare_with_local(&one, 1);
    void *st;
    ZT_OK(zck_cuda_stream_create(&st));
    ZT_OK(zck_comm_cuda_set_stream(one, st));
    ZT_OK(one->barrier(one));
    zck_comm_nccl_destroy(one);
    zck_cuda_stream_destroy(st);
    ZT_ERR(zck_comm_nccl_init_rank(2, 2, id, &one), ZCK_ERR_INVALID_ARG, "rank 2 of 2");
  } else {
    printf("  built without NCCL: the NCCL path is not tested\n");
  }
  zck_comm *c[65];
  ZT_ERR(zck_comm_cuda_local_create(65, 0, c), ZCK_ERR_INVALID_ARG, "1 to 64");
  return 0;
}
