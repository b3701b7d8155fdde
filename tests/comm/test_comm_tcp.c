/* test_comm_tcp.c: the tcp backend gives the local backend's bits, for every collective,
 * dtype, op and in-place form, for W = 1..5 processes on 127.0.0.1 (sizes 0, 1, odd, and
 * several MB: larger than socket buffers).
 *
 *   test_comm_tcp             forks W processes per world size, the parent computes the local
 *                             backend's results first (W = 3 reads its options from the
 *                             torchrun environment variables)
 *   test_comm_tcp --env       one rank of a world launched by someone else (mpirun), options
 *                             from the environment; computes the local results itself
 *   test_comm_tcp --mpirun    runs `mpirun -np 3 test_comm_tcp --env` (mpirun_test.sh) with
 *                             a port that this process holds bound until mpirun is done, so
 *                             no other process can take it before rank 0 listens
 */
#include "comm_proc.h"
#include "comm_suite.h"
#include "test.h"

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

/* Runs every case on this rank's handle and compares with expected[i] (NULL: computes
 * it with the local backend here). Returns the number of failures, after printing them. */
static int run_cases(zck_comm *c, const cs_case *cases, size_t n, void **expected) {
  int W = c->size, r = c->rank, bad = 0;
  char d[160];
  for (size_t i = 0; i < n; i++) {
    if (i % 16 == 0 && c->barrier(c) != ZCK_OK) {
      fprintf(stderr, "W=%d rank %d: barrier before case %zu: %s\n", W, r, i, zck_last_error());
      return bad + 1;
    }
    void *exp = expected ? expected[i] : cs_expected(&cases[i], (int)i, W);
    void *buf;
    const void *out;
    size_t ob;
    zck_status s = cs_run(c, &cases[i], (int)i, &buf, &out, &ob);
    if (s != ZCK_OK) {
      fprintf(stderr, "W=%d rank %d case %zu %s: %s\n", W, r, i, cs_describe(&cases[i], d, sizeof d), zck_last_error());
      free(buf);
      if (!expected) free(exp);
      return bad + 1;
    }
    const uint8_t *e = (const uint8_t *)exp + cs_result_offset(&cases[i], r);
    if (memcmp(out, e, ob)) {
      size_t at = 0;
      while (((const uint8_t *)out)[at] == e[at]) at++;
      fprintf(stderr, "W=%d rank %d case %zu %s: differs from the local backend at byte %zu of %zu\n", W, r, i,
              cs_describe(&cases[i], d, sizeof d), at, ob);
      bad++;
    }
    free(buf);
    if (!expected) free(exp);
  }
  return bad;
}

static void child(int W, int r, int port, bool via_env, const cs_case *cases, size_t n, void **expected) {
  zck_comm_tcp_options o = {r, W, "127.0.0.1", port, 30.0};
  if (via_env) { /* as torchrun would start us */
    char v[32];
    snprintf(v, sizeof v, "%d", r);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", W);
    setenv("WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof v, "%d", port);
    setenv("MASTER_PORT", v, 1);
    bool found = false;
    ZT_OK(zck_comm_env_options(&o, &found));
    ZT_ASSERT(found && o.rank == r && o.size == W && o.master_port == port);
    ZT_EQ_INT(zck_comm_env_local_rank(), r);
  }
  zck_comm *c = NULL;
  ZT_OK(zck_comm_tcp_create(&o, &c));
  ZT_ASSERT(c->rank == r && c->size == W && !strcmp(c->backend, "tcp"));
  int bad = run_cases(c, cases, n, expected);
  zck_comm_tcp_destroy(c);
  exit(bad ? 1 : 0);
}

/* The inputs must be able to tell rank orders apart, or the comparisons prove little:
 * a sum over ranks W-1..0 must differ from the local backend's in some element. */
static void check_order_matters(int W, const cs_case *cases, size_t n, void **expected) {
  for (size_t i = 0; i < n; i++) {
    const cs_case *c = &cases[i];
    if (c->kind != CS_ALL_REDUCE || c->dt != ZCK_F32 || c->op != ZCK_COMM_SUM || c->count < 4000) continue;
    /* (the first such case: 4099 elements) */
    float *in = malloc(c->count * sizeof(float) * (size_t)W);
    for (int r = 0; r < W; r++) cs_input(c, (int)i, r, in + (size_t)r * c->count, 0, c->count);
    size_t differ = 0;
    for (size_t j = 0; j < c->count; j++) {
      float rev = in[(size_t)(W - 1) * c->count + j];
      for (int r = W - 2; r >= 0; r--) rev += in[(size_t)r * c->count + j];
      differ += memcmp(&rev, (const float *)expected[i] + j, sizeof rev) != 0;
    }
    free(in);
    if (differ == 0) ZT_FAIL("W=%d: the inputs of case %zu sum alike in any rank order", W, i);
    return;
  }
  ZT_FAIL("no large f32 sum case");
}

static void run_world(int W) {
  size_t n;
  cs_case *cases = cs_cases(W, W != 1 && W != 4, &n); /* MB-sized buffers for 2, 3, 5 ranks */
  void **expected = calloc(n, sizeof *expected);
  for (size_t i = 0; i < n; i++) expected[i] = cs_expected(&cases[i], (int)i, W);
  if (W >= 3) check_order_matters(W, cases, n, expected);
  int port = cp_free_port();
  pid_t pids[8];
  fflush(NULL);
  for (int r = 0; r < W; r++) {
    pids[r] = fork();
    ZT_ASSERT(pids[r] >= 0);
    if (pids[r] == 0) child(W, r, port, W == 3, cases, n, expected);
  }
  int codes[8];
  int bad = cp_wait(pids, W, 120.0, codes);
  for (size_t i = 0; i < n; i++) free(expected[i]);
  free(expected);
  free(cases);
  if (bad) {
    for (int r = 0; r < W; r++)
      if (codes[r]) fprintf(stderr, "W=%d: rank %d exited with %d (-1: killed after 120 s)\n", W, r, codes[r]);
    ZT_FAIL("W=%d: %d rank(s) failed", W, bad);
  }
  fprintf(stderr, "W=%d: %zu cases equal the local backend's bits\n", W, n);
}

/* One rank of a world started by a launcher (mpirun). */
static int run_env(void) {
  zck_comm_tcp_options o;
  bool found = false;
  ZT_OK(zck_comm_env_options(&o, &found));
  if (!found) ZT_FAIL("--env: no RANK/WORLD_SIZE, OMPI_COMM_WORLD_* or PMI_* variables");
  if (o.timeout_s <= 0) o.timeout_s = 60;
  zck_comm *c = NULL;
  ZT_OK(zck_comm_tcp_create(&o, &c));
  size_t n;
  cs_case *cases = cs_cases(o.size, true, &n);
  int bad = run_cases(c, cases, n, NULL);
  /* everyone's verdict, so that every rank (and mpirun) fails when one does */
  int32_t v = bad;
  ZT_OK(c->all_reduce(c, &v, &v, 1, ZCK_I32, ZCK_COMM_MAX));
  fprintf(stderr, "rank %d of %d (local rank %d): %zu cases, %s\n", o.rank, o.size, zck_comm_env_local_rank(), n,
          v ? "FAILED" : "equal to the local backend");
  zck_comm_tcp_destroy(c);
  free(cases);
  return v ? 1 : 0;
}

/* mpirun -np 3 SELF --env, with MASTER_PORT a port held by this process (cp_free_port)
 * until mpirun exits: a port printed by one process and used by the next could be taken
 * in between (another test's ephemeral port), and rank 0 would fail with "port in use". */
static int run_mpirun(const char *self) {
  char port[48];
  snprintf(port, sizeof port, "MASTER_PORT=%d", cp_free_port());
  char *argv[] = {"timeout", "120", "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x",
                  "MASTER_ADDR=127.0.0.1", "-x", port, "-x", "ZCK_COMM_TIMEOUT_S=60", (char *)self, "--env", NULL};
  fflush(NULL);
  pid_t pid = fork();
  ZT_ASSERT(pid >= 0);
  if (pid == 0) {
    execvp(argv[0], argv);
    fprintf(stderr, "cannot run timeout/mpirun: %s\n", strerror(errno));
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0) ZT_ASSERT(errno == EINTR);
  if (!WIFEXITED(st) || WEXITSTATUS(st)) {
    fprintf(stderr, "mpirun %s (124: still running after 120 s)\n", WIFEXITED(st) ? "failed" : "was killed");
    return 1;
  }
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 1 && !strcmp(argv[1], "--mpirun")) return run_mpirun(argv[0]);
  if (argc > 1 && !strcmp(argv[1], "--env")) return run_env();
  for (int W = 1; W <= 5; W++) run_world(W);
  return 0;
}
