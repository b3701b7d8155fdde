/* test_comm_nccl_init.c: zck_comm_nccl_init_from, an NCCL group bootstrapped over an MPI
 * group (one process per GPU under mpirun: the NCCL id goes by MPI broadcast).
 *  - built without CUDA: it says so, and leaves *out NULL (bootstrap: a local group);
 *  - with GPUs, MPI and mpirun: this program starts `mpirun -np W itself --rank` with
 *    W = min(devices, 4); every rank joins on device local_rank % devices and all_reduces device memory; then a rank with a device
 *    that does not exist makes every rank fail (none waits in NCCL for it). Otherwise
 *    skipped (77).
 * CUDA must not be initialized before fork(): the parent asks a child for the device count. */
#include "test.h"

#include "comm.h"
#include "zck_cuda.h"

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

static int device_count(void) {
  fflush(NULL);
  pid_t p = fork();
  ZT_ASSERT(p >= 0);
  if (p == 0) _exit(zck_cuda_device_count() > 100 ? 100 : zck_cuda_device_count());
  int st;
  ZT_ASSERT(waitpid(p, &st, 0) == p && WIFEXITED(st));
  return WEXITSTATUS(st);
}

static void join(zck_comm *boot, int ndev, int bad_rank) {
  int r = boot->rank, W = boot->size;
  zck_comm *nc = NULL;
  int device = r == bad_rank ? 999 : zck_comm_mpi_local_rank(boot) % ndev;
  zck_status s = zck_comm_nccl_init_from(boot, device, &nc);
  if (bad_rank >= 0) {
    ZT_ASSERT(s != ZCK_OK && nc == NULL);
    char needle[64];
    if (r == bad_rank)
      snprintf(needle, sizeof needle, "select device 999");
    else
      snprintf(needle, sizeof needle, "rank %d could not select its device", bad_rank);
    if (!strstr(zck_last_error(), needle)) ZT_FAIL("rank %d: \"%s\" lacks \"%s\"", r, zck_last_error(), needle);
    return;
  }
  ZT_OK(s);
  ZT_ASSERT(nc && nc->rank == r && nc->size == W && !strcmp(nc->backend, "nccl"));
  enum { N = 1001 };
  float h[N], *d = NULL;
  for (int i = 0; i < N; i++) h[i] = (float)(r + 1) * (float)i;
  ZT_OK(zck_cuda_malloc((void **)&d, sizeof h));
  ZT_OK(zck_cuda_memcpy(d, h, sizeof h));
  ZT_OK(nc->all_reduce(nc, d, d, N, ZCK_F32, ZCK_COMM_SUM));
  ZT_OK(zck_cuda_memcpy(h, d, sizeof h));
  for (int i = 0; i < N; i++) ZT_ASSERT(h[i] == (float)(W * (W + 1) / 2) * (float)i);
  zck_cuda_free(d);
  zck_comm_nccl_destroy(nc);
  ZT_OK(boot->barrier(boot)); /* the bootstrap group still works after NCCL */
}

static int rank_main(int ndev) {
  zck_comm *boot = NULL;
  ZT_OK(zck_comm_mpi_create(&boot));
  join(boot, ndev, -1);
  join(boot, ndev, boot->size - 1); /* the last rank's device does not exist */
  if (boot->rank == 0) fprintf(stderr, "W=%d: joined, reduced, and failed together on a bad device\n", boot->size);
  zck_comm_mpi_destroy(boot);
  return 0;
}

int main(int argc, char **argv) {
  if (argc > 2 && !strcmp(argv[1], "--rank")) return rank_main(atoi(argv[2]));
  if (!zck_cuda_built()) {
    zck_comm *boot[1], *nc = (zck_comm *)boot;
    ZT_OK(zck_comm_local_create(1, boot));
    ZT_ERR(zck_comm_nccl_init_from(boot[0], 0, &nc), ZCK_ERR_NO_DEVICE, "built without CUDA");
    ZT_ASSERT(nc == NULL);
    zck_comm_local_destroy(boot, 1);
    return 0;
  }
  int ndev = device_count();
  if (ndev == 0) zt_skip("no CUDA device");
  if (!zck_cuda_has_nccl()) zt_skip("built without NCCL");
  if (!zck_comm_mpi_available()) zt_skip("built without MPI");
  int W = ndev < 4 ? ndev : 4; /* NCCL refuses two ranks on one device */
  char np[16], nd[16];
  snprintf(np, sizeof np, "%d", W);
  snprintf(nd, sizeof nd, "%d", ndev);
  setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  setenv("ZCK_COMM_TIMEOUT_S", "120", 1);
  char *args[] = {"timeout", "300", "mpirun", "--oversubscribe", "-np", np, argv[0], "--rank", nd, NULL};
  fflush(NULL);
  pid_t p = fork();
  ZT_ASSERT(p >= 0);
  if (p == 0) {
    execvp(args[0], args);
    _exit(127);
  }
  int st;
  while (waitpid(p, &st, 0) < 0) ZT_ASSERT(errno == EINTR);
  if (WIFEXITED(st) && WEXITSTATUS(st) == 127) zt_skip("mpirun (or timeout) not installed");
  if (!WIFEXITED(st) || WEXITSTATUS(st)) ZT_FAIL("mpirun -np %d: %s %d", W, WIFEXITED(st) ? "exit" : "signal",
                                                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
  return 0;
}
