/* test_comm_mpi.c: one rank of the MPI backend's tests, started by mpi_test.sh under mpirun.
 *
 *   test_comm_mpi suite   every collective, dtype, op and in-place form gives the local
 *                         backend's bits (computed here with W threads), with the default
 *                         segment and (W = 3) with 64 KiB segments (many steps, uneven
 *                         last ones); the gather (point to point) delivers every rank's
 *                         bytes to root alone;
 *                         rank, size, local rank and backend name are right
 *   test_comm_mpi die DIR the ranks loop on collectives; rank 1 writes its pid to DIR/pid
 *                         for the script to kill it (SIGKILL from outside)
 *   test_comm_mpi hang    rank 1 sleeps for ever; the others wait in a barrier until
 *                         ZCK_COMM_TIMEOUT_S and abort the job
 *   test_comm_mpi env     a malformed ZCK_COMM_TIMEOUT_S is refused with one line
 *   test_comm_mpi none    (without mpirun) a build without MPI says so; exit 77 with MPI
 */
#include "comm_suite.h"
#include "test.h"

#include <signal.h>
#include <unistd.h>

/* Runs every case and compares with the local backend's result; returns the failures. */
static int run_cases(zck_comm *c, const cs_case *cases, size_t n) {
  int W = c->size, r = c->rank, bad = 0;
  char d[160];
  for (size_t i = 0; i < n; i++) {
    void *exp = cs_expected(&cases[i], (int)i, W);
    void *buf;
    const void *out;
    size_t ob;
    zck_status s = cs_run(c, &cases[i], (int)i, &buf, &out, &ob);
    if (s != ZCK_OK) {
      fprintf(stderr, "W=%d rank %d case %zu %s: %s\n", W, r, i, cs_describe(&cases[i], d, sizeof d), zck_last_error());
      free(buf);
      free(exp);
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
    free(exp);
  }
  return bad;
}

static int suite(void) {
  zck_comm *c = NULL;
  ZT_OK(zck_comm_mpi_create(&c));
  ZT_ASSERT(!strcmp(c->backend, "mpi") && c->size >= 1 && c->rank >= 0 && c->rank < c->size);
  const char *wr = getenv("OMPI_COMM_WORLD_RANK"), *ws = getenv("OMPI_COMM_WORLD_SIZE");
  if (wr && ws) ZT_ASSERT(atoi(wr) == c->rank && atoi(ws) == c->size);
  ZT_EQ_INT(zck_comm_mpi_local_rank(c), c->rank); /* one host */
  size_t n;
  cs_case *cases = cs_cases(c->size, c->size <= 3, &n);
  int bad = run_cases(c, cases, n) + cs_check_gather(c, true), passes = 1;
  if (c->size == 3) { /* odd W: uneven chunks in every step */
    zck__comm_mpi_set_segment(c, 64 << 10);
    bad += run_cases(c, cases, n) + cs_check_gather(c, true);
    zck__comm_mpi_set_segment(c, 0);
    passes = 2;
  }
  /* everyone's verdict, so that every rank (and mpirun) fails when one does */
  int32_t v = bad;
  ZT_OK(c->all_reduce(c, &v, &v, 1, ZCK_I32, ZCK_COMM_MAX));
  if (c->rank == 0)
    fprintf(stderr, "W=%d: %zu cases x %d segment size(s): %s\n", c->size, n, passes,
            v ? "FAILED" : "equal to the local backend");
  /* abort stops this handle's later collectives without touching the others' */
  c->abort(c);
  ZT_ERR(c->barrier(c), ZCK_ERR_INTERNAL, "after the group was aborted");
  zck_comm_mpi_destroy(c);
  free(cases);
  return v ? 1 : 0;
}

static int die(const char *dir) {
  zck_comm *c = NULL;
  ZT_OK(zck_comm_mpi_create(&c));
  zck_comm_mpi_name_dead_peers(c);
  ZT_OK(c->barrier(c));
  if (c->rank == 1) {
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/pid", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    ZT_ASSERT(f);
    fprintf(f, "%d\n", (int)getpid());
    ZT_ASSERT(fclose(f) == 0 && rename(tmp, path) == 0);
  }
  /* collectives until mpirun ends the job (rank 1 computes between them: the others wait) */
  float x[1000] = {0};
  for (long i = 0; i < 1000000; i++) {
    if (c->rank == 1) usleep(1000);
    zck_status s = c->all_reduce(c, x, x, 1000, ZCK_F32, ZCK_COMM_SUM);
    if (s != ZCK_OK) {
      fprintf(stderr, "rank %d: %s\n", c->rank, zck_last_error());
      return 1;
    }
  }
  fprintf(stderr, "rank %d: the job was not ended\n", c->rank);
  return 1;
}

static int hang(void) {
  zck_comm *c = NULL;
  ZT_OK(zck_comm_mpi_create(&c));
  ZT_OK(c->barrier(c));
  if (c->rank == 1)
    for (;;) pause();
  zck_status s = c->barrier(c); /* never returns: the wait aborts the job */
  fprintf(stderr, "rank %d: the barrier returned (%d: %s)\n", c->rank, (int)s, zck_last_error());
  return 1;
}

static int env(void) {
  setenv("ZCK_COMM_TIMEOUT_S", "1x", 1);
  zck_comm *c = (zck_comm *)&c;
  ZT_ERR(zck_comm_mpi_create(&c), ZCK_ERR_INVALID_ARG, "ZCK_COMM_TIMEOUT_S=1x: not a positive number of seconds");
  ZT_ASSERT(c == NULL);
  setenv("ZCK_COMM_TIMEOUT_S", "-1", 1);
  ZT_ERR(zck_comm_mpi_create(&c), ZCK_ERR_INVALID_ARG, "ZCK_COMM_TIMEOUT_S=-1");
  unsetenv("ZCK_COMM_TIMEOUT_S");
  ZT_OK(zck_comm_mpi_create(&c));
  ZT_OK(c->barrier(c));
  zck_comm_mpi_destroy(c);
  /* MPI cannot start twice in one process */
  ZT_ERR(zck_comm_mpi_create(&c), ZCK_ERR_INTERNAL, "finalized already");
  return 0;
}

static int none(void) {
  if (zck_comm_mpi_available()) zt_skip("built with MPI (the suite runs under mpirun)");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  ZT_ASSERT(!zck_comm_mpi_launched());
  setenv("OMPI_COMM_WORLD_SIZE", "2", 1); /* started by mpirun, but no MPI here: refused */
  ZT_ASSERT(zck_comm_mpi_launched());
  zck_comm *c = (zck_comm *)&c;
  ZT_ERR(zck_comm_mpi_create(&c), ZCK_ERR_UNSUPPORTED, "built without MPI");
  ZT_ASSERT(c == NULL);
  return 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  if (!strcmp(mode, "none")) return none();
  if (!zck_comm_mpi_available()) zt_skip("built without MPI");
  if (!zck_comm_mpi_launched()) ZT_FAIL("%s: run me under mpirun (tests/comm/mpi_test.sh)", mode);
  if (!strcmp(mode, "suite")) return suite();
  if (!strcmp(mode, "die") && argc > 2) return die(argv[2]);
  if (!strcmp(mode, "hang")) return hang();
  if (!strcmp(mode, "env")) return env();
  ZT_FAIL("usage: test_comm_mpi suite|die DIR|hang|env|none");
}
