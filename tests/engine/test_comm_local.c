/* test_comm_local.c: the local (threads) collective backend: results of every collective
 * and their in-place forms for W = 1..5, rank-order sums, disagreeing calls, abort; the
 * gather (tests/comm/comm_suite.c's check, which the MPI backend passes too). */
#include "test.h"

#include "comm.h"
#include "../comm/comm_suite.h"

#include <pthread.h>

#define N 37 /* odd on purpose: chunks of unequal size */

typedef struct job {
  zck_comm *c;
  int mode;          /* 0: collectives, 1: disagree, 2: abort */
  int failures;
  char msg[256];
} job;

static float val(int rank, int i) { return (float)(rank + 1) * 0.1f + (float)i * 0.01f; }

#define CHECK(cond) do { if (!(cond)) { j->failures++; snprintf(j->msg, sizeof j->msg, "rank %d line %d: %s", r, __LINE__, #cond); return NULL; } } while (0)

static void *run(void *arg) {
  job *j = arg;
  zck_comm *c = j->c;
  int r = c->rank, W = c->size;
  if (j->mode == 1) {
    float x[4] = {0};
    zck_status s = r == W - 1 ? c->all_gather(c, x, x, 1, ZCK_F32) : c->all_reduce(c, x, x, 4, ZCK_F32, ZCK_COMM_SUM);
    CHECK(s == ZCK_ERR_INVALID_ARG);
    CHECK(strstr(zck_last_error(), "ranks disagree") != NULL);
    /* the group still works afterwards */
    CHECK(c->barrier(c) == ZCK_OK);
    return NULL;
  }
  if (j->mode == 3) {
    j->failures = cs_check_gather(c, W <= 3);
    if (j->failures) snprintf(j->msg, sizeof j->msg, "rank %d: gather failed (see above)", r);
    return NULL;
  }
  if (j->mode == 2) {
    if (r == 0) {
      c->abort(c);
      return NULL;
    }
    zck_status s = c->barrier(c);
    CHECK(s == ZCK_ERR_INTERNAL);
    CHECK(strstr(zck_last_error(), "another rank failed") != NULL);
    return NULL;
  }
  /* all_reduce, out of place and in place; sums in rank order */
  float send[N], recv[N];
  for (int i = 0; i < N; i++) send[i] = val(r, i);
  CHECK(c->all_reduce(c, send, recv, N, ZCK_F32, ZCK_COMM_SUM) == ZCK_OK);
  for (int i = 0; i < N; i++) {
    float e = val(0, i);
    for (int k = 1; k < W; k++) e += val(k, i);
    CHECK(recv[i] == e);
    CHECK(send[i] == val(r, i));
  }
  CHECK(c->all_reduce(c, send, send, N, ZCK_F32, ZCK_COMM_SUM) == ZCK_OK);
  CHECK(!memcmp(send, recv, sizeof send));
  double d = r + 0.5;
  CHECK(c->all_reduce(c, &d, &d, 1, ZCK_F64, ZCK_COMM_MAX) == ZCK_OK);
  CHECK(d == W - 0.5);
  int64_t q = r;
  CHECK(c->all_reduce(c, &q, &q, 1, ZCK_I64, ZCK_COMM_SUM) == ZCK_OK);
  CHECK(q == (int64_t)W * (W - 1) / 2);
  /* reduce_scatter: W*N in, N out; in place at recv = send + r*N */
  float *big = calloc((size_t)W * N, sizeof(float)), *part = calloc(N, sizeof(float));
  for (int i = 0; i < W * N; i++) big[i] = val(r, i);
  CHECK(c->reduce_scatter(c, big, part, N, ZCK_F32, ZCK_COMM_SUM) == ZCK_OK);
  for (int i = 0; i < N; i++) {
    float e = val(0, r * N + i);
    for (int k = 1; k < W; k++) e += val(k, r * N + i);
    CHECK(part[i] == e);
  }
  CHECK(c->reduce_scatter(c, big, big + (size_t)r * N, N, ZCK_F32, ZCK_COMM_SUM) == ZCK_OK);
  CHECK(!memcmp(big + (size_t)r * N, part, sizeof(float) * N));
  /* all_gather, out of place and in place (bf16 payload: any dtype moves) */
  uint16_t mine[N], *all = calloc((size_t)W * N, sizeof(uint16_t));
  for (int i = 0; i < N; i++) mine[i] = (uint16_t)(r * 1000 + i);
  CHECK(c->all_gather(c, mine, all, N, ZCK_BF16) == ZCK_OK);
  for (int k = 0; k < W; k++)
    for (int i = 0; i < N; i++) CHECK(all[k * N + i] == (uint16_t)(k * 1000 + i));
  memset(all, 0, (size_t)W * N * sizeof(uint16_t));
  memcpy(all + (size_t)r * N, mine, sizeof mine);
  CHECK(c->all_gather(c, all + (size_t)r * N, all, N, ZCK_BF16) == ZCK_OK);
  for (int k = 0; k < W; k++)
    for (int i = 0; i < N; i++) CHECK(all[k * N + i] == (uint16_t)(k * 1000 + i));
  /* broadcast from the last rank */
  float b[3] = {(float)r, (float)r, (float)r};
  CHECK(c->broadcast(c, b, 3, ZCK_F32, W - 1) == ZCK_OK);
  CHECK(b[0] == (float)(W - 1) && b[2] == (float)(W - 1));
  /* bf16 sums: in float, rank order, rounded once */
  uint16_t h;
  float one = 1.0f;
  zck_convert(ZCK_BF16, &h, ZCK_F32, &one, 1);
  CHECK(c->all_reduce(c, &h, &h, 1, ZCK_BF16, ZCK_COMM_SUM) == ZCK_OK);
  float back;
  zck_convert(ZCK_F32, &back, ZCK_BF16, &h, 1);
  CHECK(back == (float)W);
  CHECK(c->barrier(c) == ZCK_OK);
  free(big);
  free(part);
  free(all);
  return NULL;
}

static void run_group(int W, int mode) {
  zck_comm *comms[8];
  ZT_OK(zck_comm_local_create(W, comms));
  job jobs[8];
  pthread_t th[8];
  for (int r = 0; r < W; r++) {
    jobs[r] = (job){comms[r], mode, 0, ""};
    ZT_ASSERT(comms[r]->rank == r && comms[r]->size == W);
    ZT_ASSERT(!strcmp(comms[r]->backend, "local"));
    pthread_create(&th[r], NULL, run, &jobs[r]);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < W; r++)
    if (jobs[r].failures) ZT_FAIL("W=%d mode %d: %s", W, mode, jobs[r].msg);
  zck_comm_local_destroy(comms, W);
  ZT_ASSERT(comms[0] == NULL);
}

int main(void) {
  for (int W = 1; W <= 5; W++) run_group(W, 0);
  for (int W = 2; W <= 4; W++) run_group(W, 1);
  for (int W = 2; W <= 4; W++) run_group(W, 2);
  for (int W = 1; W <= 5; W++) run_group(W, 3);
  zck_comm_local_destroy(NULL, 0);
  return 0;
}
