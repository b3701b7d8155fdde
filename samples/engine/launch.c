/* launch.c: --nproc (mpirun on this host) and the kill hook of the fault tests (see
 * launch.h). */
#include "launch.h"

#include "error.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- test hook

/* The spec of ZCKPT_TRAIN_TEST_KILL: rank, step and where ("" at a step's start). */
static bool kill_spec(long *rank, long long *at, char where[16]) {
  const char *v = getenv("ZCKPT_TRAIN_TEST_KILL");
  where[0] = 0;
  return v && *v && sscanf(v, "%ld:%lld:%15s", rank, at, where) >= 2;
}

void ze_test_kill_point(zck_comm *c, int64_t step, bool in_save) {
  if (!strcmp(c->backend, "local")) return; /* threads share the process: nothing to kill alone */
  long rank = -1;
  long long at = -1;
  char where[16];
  if (!kill_spec(&rank, &at, where)) return;
  bool hang = !strcmp(where, "hang");
  if (rank != c->rank || at != step || in_save != !strcmp(where, "save")) return;
  fprintf(stderr, "zckpt-train: rank %d: ZCKPT_TRAIN_TEST_KILL: %s at step %lld%s\n", c->rank,
          hang ? "hanging" : "killing myself", at, in_save ? " during the save" : "");
  if (hang)
    for (;;) pause(); /* alive, never arriving: the others' wait must give up */
  raise(SIGKILL);
}

void ze_test_kill_after_reshard(int64_t step) {
  long rank = -1;
  long long at = -1;
  char where[16];
  if (!kill_spec(&rank, &at, where) || rank != 0 || at != step || strcmp(where, "reshard")) return;
  fprintf(stderr, "zckpt-train: ZCKPT_TRAIN_TEST_KILL: killing myself after resharding step %lld\n", at);
  raise(SIGKILL);
}

// ---- --nproc: mpirun on this host

int ze_launch_nproc(int nproc, int argc, char **argv, int skip_at, int skip_n) {
  if (!zck_comm_mpi_available()) {
    fprintf(stderr, "zckpt-train: error: --nproc: this zckpt-train was built without MPI (ZCK_MPI); run --ranks %d "
            "(threads) instead\n", nproc);
    return 1;
  }
  /* the binary's own path, so that mpirun starts this very build */
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0 || n >= (ssize_t)sizeof exe - 1) {
    fprintf(stderr, "zckpt-train: error: --nproc: cannot find this program's path: %s\n", strerror(errno));
    return 1;
  }
  exe[n] = 0;
  char np[16];
  snprintf(np, sizeof np, "%d", nproc);
  /* mpirun -np N --oversubscribe EXE ARGS (ours without --nproc N / --nproc=N): one host,
   * more ranks than cores allowed */
  const char *head[] = {"mpirun", "-np", np, "--oversubscribe", exe};
  size_t nh = sizeof head / sizeof head[0];
  char **margv = calloc(nh + (size_t)argc + 1, sizeof *margv);
  if (!margv) {
    fprintf(stderr, "zckpt-train: error: out of memory\n");
    return 1;
  }
  size_t m = 0;
  for (size_t i = 0; i < nh; i++) margv[m++] = (char *)head[i];
  for (int i = 1; i < argc; i++)
    if (i < skip_at || i >= skip_at + skip_n) margv[m++] = argv[i];
  margv[m] = NULL;
  fflush(NULL);
  execvp(margv[0], margv);
  fprintf(stderr, "zckpt-train: error: --nproc: cannot run mpirun: %s (Debian: apt-get install openmpi-bin)\n",
          strerror(errno));
  free(margv);
  return 1;
}
