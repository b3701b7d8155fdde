/* main.c: zckpt-train, the sample training engine (see train.h).
 *
 * Two ways to run W ranks: --ranks W (threads of this process), or one process per rank
 * under mpirun / srun (collectives over the MPI backend); --nproc N is a shorthand for
 * mpirun -np N on this host (launch.h). */
#include "args.h"
#include "data.h"
#include "launch.h"
#include "train.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* torchrun's variables without MPI: the ranks would have no way to meet (zckpt-train
 * processes meet through MPI only), and W copies of one rank would share one output. */
static bool torchrun_world(long *size) {
  const char *w = getenv("WORLD_SIZE");
  char *end;
  *size = w ? strtol(w, &end, 10) : 0;
  return w && *w && !*end && *size > 1;
}

int main(int argc, char **argv) {
  ze_train_args a;
  char err[512] = "";
  int rc = ze_args_parse(argc, argv, &a, err, sizeof err);
  if (rc == ZE_ARGS_EXIT_OK) return 0;
  if (rc == ZE_ARGS_USAGE) {
    fprintf(stderr, "zckpt-train: %s (see 'zckpt-train --help')\n", err);
    return 2;
  }
  bool launched = zck_comm_mpi_launched();
  long tw;
  if (!launched && torchrun_world(&tw)) {
    fprintf(stderr,
            "zckpt-train: WORLD_SIZE=%ld is set but this process was not started by mpirun: one process per rank "
            "runs under mpirun or srun (or --nproc N on one host; see 'zckpt-train --help')\n",
            tw);
    return 2;
  }
  if (launched && a.nproc) {
    fprintf(stderr, "zckpt-train: --nproc: this process is already a rank started by mpirun; use one or the other "
            "(see 'zckpt-train --help')\n");
    return 2;
  }
  if (launched && a.ranks != 1) {
    fprintf(stderr,
            "zckpt-train: --ranks %d: this process is a rank started by mpirun; --ranks (threads) cannot be "
            "combined with it (see 'zckpt-train --help')\n",
            a.ranks);
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
    if (zck_comm_mpi_create(&comm) != ZCK_OK) {
      fprintf(stderr, "zckpt-train: error: %s\n", zck_last_error());
      return 1;
    }
    zck_comm_mpi_name_dead_peers(comm);
    a.comm = comm;
    a.local_rank = zck_comm_mpi_local_rank(comm);
  }
  ze_train_result r;
  zck_status s = ze_train_run(&a, &r);
  if (s != ZCK_OK) {
    /* an error every rank agreed on is rank 0's to print; the rest (a peer gone, ...) each
     * rank reports itself */
    const char *msg = r.message ? r.message : zck_last_error();
    if (!comm || (comm->rank == 0 && zck_comm_agree_reached_all())) fprintf(stderr, "zckpt-train: error: %s\n", msg);
    else if (!zck_comm_agree_reached_all()) fprintf(stderr, "zckpt-train: error: rank %d: %s\n", comm->rank, msg);
    ze_train_result_free(&r);
    /* a failure of this rank alone: the others may be waiting in a collective, and MPI's
     * teardown is collective too, so leave without it: mpirun sees the exit and ends the
     * job at once (rather than the others timing out) */
    if (comm && !zck_comm_agree_reached_all()) {
      fflush(NULL);
      _exit(1);
    }
    zck_comm_mpi_destroy(comm);
    return 1;
  }
  for (int m = 0; m < 2; m++)
    if (r.generated[m]) {
      if (a.gather_for_generation == ZE_GATHER_BOTH)
        printf("[gather_for_generation=%s] ", m == 0 ? "on" : "off");
      char *shown = zck__sprintf("%s%s", a.prompt, r.generated[m]);
      if (shown && a.reverse_sums) ze_sums_in_usual_order(shown); /* the model writes sums reversed */
      printf("%s\n", shown ? shown : "");
      free(shown);
    }
  if (r.generated[0] && r.generated[1] && strcmp(r.generated[0], r.generated[1])) {
    fprintf(stderr, "zckpt-train: error: the two generation modes produced different text\n");
    ze_train_result_free(&r);
    zck_comm_mpi_destroy(comm);
    return 1;
  }
  ze_train_result_free(&r);
  zck_comm_mpi_destroy(comm);
  return 0;
}
