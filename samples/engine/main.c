/* main.c: zckpt-train, the sample training engine (see train.h).
 *
 * Three ways to run W ranks: --ranks W (threads of this process), --nproc N (this process
 * launches N rank processes, launch.h), or as one rank process started by a launcher
 * (torchrun / mpirun / --nproc: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT in the
 * environment), whose collectives then go over the tcp backend. */
#include "args.h"
#include "launch.h"
#include "train.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
  ze_train_args a;
  char err[512] = "";
  int rc = ze_args_parse(argc, argv, &a, err, sizeof err);
  if (rc == ZE_ARGS_EXIT_OK) return 0;
  if (rc == ZE_ARGS_USAGE) {
    fprintf(stderr, "zckpt-train: %s (see 'zckpt-train --help')\n", err);
    return 2;
  }
  zck_comm_tcp_options o;
  bool launched = false;
  if (zck_comm_env_options(&o, &launched) != ZCK_OK) {
    fprintf(stderr, "zckpt-train: error: %s\n", zck_last_error());
    return 1;
  }
  if (launched && a.nproc) {
    fprintf(stderr,
            "zckpt-train: --nproc: this process is already rank %d of %d of a launcher (RANK / WORLD_SIZE are "
            "set); use one or the other (see 'zckpt-train --help')\n",
            o.rank, o.size);
    return 2;
  }
  if (launched && a.ranks != 1) {
    fprintf(stderr,
            "zckpt-train: --ranks %d: this process is rank %d of %d of a launcher; --ranks (threads) cannot be "
            "combined with it (see 'zckpt-train --help')\n",
            a.ranks, o.rank, o.size);
    return 2;
  }
  /* usage errors once, before any process starts or connects */
  if (ze_train_check_args(&a) != ZCK_OK) {
    fprintf(stderr, "zckpt-train: %s (see 'zckpt-train --help')\n", zck_last_error());
    return 2;
  }
  if (a.nproc) return ze_launch_nproc(a.nproc, argc, argv, a.nproc_arg[0], a.nproc_arg[1]);

  zck_comm *comm = NULL;
  if (launched) {
    if (zck_comm_tcp_create(&o, &comm) != ZCK_OK) {
      fprintf(stderr, "zckpt-train: error: rank %d: %s\n", o.rank, zck_last_error());
      return 1;
    }
    int lr = zck_comm_env_local_rank();
    a.comm = comm;
    a.local_rank = lr >= 0 ? lr : o.rank;
  }
  ze_train_result r;
  zck_status s = ze_train_run(&a, &r);
  if (s != ZCK_OK) {
    /* an error every rank agreed on is rank 0's to print; the rest (a peer gone, ...) each
     * rank reports itself */
    const char *msg = r.message ? r.message : zck_last_error();
    if (!comm || (comm->rank == 0 && ze_agree_reached_all())) fprintf(stderr, "zckpt-train: error: %s\n", msg);
    else if (!ze_agree_reached_all()) fprintf(stderr, "zckpt-train: error: rank %d: %s\n", comm->rank, msg);
    ze_train_result_free(&r);
    zck_comm_tcp_destroy(comm);
    return 1;
  }
  for (int m = 0; m < 2; m++)
    if (r.generated[m]) {
      if (a.gather_for_generation == ZE_GATHER_BOTH)
        printf("[gather_for_generation=%s] ", m == 0 ? "on" : "off");
      printf("%s%s\n", a.prompt, r.generated[m]);
    }
  if (r.generated[0] && r.generated[1] && strcmp(r.generated[0], r.generated[1])) {
    fprintf(stderr, "zckpt-train: error: the two generation modes produced different text\n");
    ze_train_result_free(&r);
    zck_comm_tcp_destroy(comm);
    return 1;
  }
  ze_train_result_free(&r);
  zck_comm_tcp_destroy(comm);
  return 0;
}
