/* launch.c: --nproc (mpirun on this host), the error agreement of rank processes, and the
 * kill hook of the fault tests (see launch.h). */
#include "launch.h"

#include "error.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- agreement

static _Thread_local bool g_agreed;

bool ze_agree_reached_all(void) { return g_agreed; }
void ze_agree_reset(void) { g_agreed = false; }

zck_status ze_agree(zck_comm *c, zck_status s) {
  char msg[1024] = "";
  if (s != ZCK_OK) snprintf(msg, sizeof msg, "%s", zck_last_error());
  int32_t first = s != ZCK_OK ? c->rank : c->size;
  zck_status cs = c->all_reduce(c, &first, &first, 1, ZCK_I32, ZCK_COMM_MIN);
  int32_t st = (int32_t)s;
  if (cs == ZCK_OK && first < c->size) cs = c->broadcast(c, &st, 1, ZCK_I32, first);
  if (cs == ZCK_OK && first < c->size) cs = c->broadcast(c, msg, sizeof msg, ZCK_U8, first);
  if (cs == ZCK_OK && first < c->size) g_agreed = true;
  if (s != ZCK_OK) return zck__fail(s, "%s", msg); /* ours first: the collective may have overwritten it */
  if (cs != ZCK_OK) return cs;
  if (first == c->size) return ZCK_OK;
  msg[sizeof msg - 1] = 0;
  return zck__fail((zck_status)st, "rank %d: %s", first, msg);
}

// ---- test hook

void ze_test_kill_point(zck_comm *c, int64_t step, bool in_save) {
  if (!strcmp(c->backend, "local")) return; /* threads share the process: nothing to kill alone */
  const char *v = getenv("ZCKPT_TRAIN_TEST_KILL");
  if (!v || !*v) return;
  long rank = -1;
  long long at = -1;
  char where[16] = "";
  if (sscanf(v, "%ld:%lld:%15s", &rank, &at, where) < 2) return;
  bool hang = !strcmp(where, "hang");
  if (rank != c->rank || at != step || in_save != !strcmp(where, "save")) return;
  fprintf(stderr, "zckpt-train: rank %d: ZCKPT_TRAIN_TEST_KILL: %s at step %lld%s\n", c->rank,
          hang ? "hanging" : "killing myself", at, in_save ? " during the save" : "");
  if (hang)
    for (;;) pause(); /* alive, never arriving: the others' wait must give up */
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
