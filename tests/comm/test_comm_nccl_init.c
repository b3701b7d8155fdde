/* test_comm_nccl_init.c: zck_comm_nccl_init_from, an NCCL group bootstrapped over a tcp
 * group (one process per GPU, as torchrun starts them).
 *  - built without CUDA: it says so, and leaves *out NULL;
 *  - with GPUs: W = min(devices, 4) processes, rank r on device r, join and all_reduce on
 *    device memory; then a rank with a device that does not exist makes every rank fail
 *    (none waits in NCCL for it). Without a GPU: skipped (77).
 * CUDA must not be initialized before fork(): the parent asks a child for the device count. */
#include "comm_proc.h"
#include "test.h"

#include "comm.h"
#include "zck_cuda.h"

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

static void rank_main(int W, int r, int port, int bad_rank) {
  zck_comm_tcp_options o = {r, W, "127.0.0.1", port, 60.0};
  zck_comm *boot = NULL, *nc = NULL;
  ZT_OK(zck_comm_tcp_create(&o, &boot));
  int device = r == bad_rank ? 999 : r;
  zck_status s = zck_comm_nccl_init_from(boot, device, &nc);
  if (bad_rank >= 0) {
    ZT_ASSERT(s != ZCK_OK && nc == NULL);
    char needle[64];
    if (r == bad_rank)
      snprintf(needle, sizeof needle, "select device 999");
    else
      snprintf(needle, sizeof needle, "rank %d could not select its device", bad_rank);
    if (!strstr(zck_last_error(), needle)) ZT_FAIL("rank %d: \"%s\" lacks \"%s\"", r, zck_last_error(), needle);
  } else {
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
    ZT_OK(boot->barrier(boot)); /* the bootstrap group still works beside NCCL */
  }
  zck_comm_nccl_destroy(nc);
  zck_comm_tcp_destroy(boot);
}

static void run(int W, int bad_rank) {
  int port = cp_free_port();
  pid_t pids[8];
  fflush(NULL);
  for (int r = 0; r < W; r++) {
    pids[r] = fork();
    ZT_ASSERT(pids[r] >= 0);
    if (pids[r] == 0) {
      rank_main(W, r, port, bad_rank);
      exit(0);
    }
  }
  int codes[8];
  if (cp_wait(pids, W, 120, codes)) ZT_FAIL("W=%d (bad rank %d): a rank failed or hung", W, bad_rank);
  fprintf(stderr, "W=%d (bad rank %d): ok\n", W, bad_rank);
}

int main(void) {
  if (!zck_cuda_built()) {
    zck_comm_tcp_options o = {0, 1, NULL, 0, 5.0};
    zck_comm *boot = NULL, *nc = (zck_comm *)&o;
    ZT_OK(zck_comm_tcp_create(&o, &boot));
    ZT_ERR(zck_comm_nccl_init_from(boot, 0, &nc), ZCK_ERR_NO_DEVICE, "built without CUDA");
    ZT_ASSERT(nc == NULL);
    zck_comm_tcp_destroy(boot);
    return 0;
  }
  int ndev = device_count();
  if (ndev == 0) zt_skip("no CUDA device");
  if (!zck_cuda_has_nccl()) zt_skip("built without NCCL");
  int W = ndev < 4 ? ndev : 4;
  run(W, -1);
  run(W < 2 ? 2 : W, W - 1 > 0 ? W - 1 : 1); /* the last rank's device does not exist */
  return 0;
}
