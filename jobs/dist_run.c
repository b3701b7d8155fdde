/* dist_run.c: a job run by every rank of an mpirun / srun launch, as zck.h offers it.
 *
 * The launcher's side of lib/dist.h: whether a launcher started this process, the MPI group
 * (lib/comm.h) that the job's agreements run over, and the end every rank meets. A program
 * (the zckpt command) brackets its job with zck_dist_begin / zck_dist_finish / zck_dist_end
 * and needs no internal header.
 */
#include <stdlib.h>

#include "zck.h"
#include "comm.h"
#include "dist.h"
#include "error.h"

static zck_comm *zck__dist_group; /* the MPI group of the distributed job begun here */

int zck_dist_launched(long *size, long *rank) {
  static const char *sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
  static const char *ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
  *size = 1;
  *rank = 0;
  if (!zck_comm_mpi_launched()) return 0;
  *size = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !*size; i++)
    if (getenv(sizes[i])) *size = strtol(getenv(sizes[i]), NULL, 10);
  for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++)
    if (getenv(ranks[i])) {
      *rank = strtol(getenv(ranks[i]), NULL, 10);
      break;
    }
  return 1;
}

int zck_dist_available(void) { return zck_comm_mpi_available(); }

zck_status zck_dist_begin(int *size) {
  *size = 1;
  /* a rank whose share is done waits at the next agreement for the slowest one: a long
   * copy is no hang (a dead rank ends the job through mpirun) */
  setenv("ZCK_COMM_TIMEOUT_S", "604800", 0);
  zck_comm *comm = NULL;
  ZCK_TRY(zck_comm_mpi_create(&comm));
  if (comm->size == 1) {
    zck_comm_mpi_destroy(comm);
    return ZCK_OK;
  }
  zck_status s = zck__dist_begin(comm);
  if (s != ZCK_OK) {
    zck_comm_mpi_destroy(comm);
    return s;
  }
  zck__dist_group = comm;
  *size = comm->size;
  return ZCK_OK;
}

int zck_dist_rank(void) { return zck__dist_on() ? zck__dist_rank() : -1; }

int zck_dist_solo(void) {
  if (!zck__dist_on()) return 0;
  if (zck__dist_rank() != 0) return 1;
  zck__dist_pause(true);
  return 0;
}

long zck_temporary_pid(void) { return zck__dist_tmp_pid(); }

zck_status zck_dist_view_open(const char *in, char **view) { return zck__dist_view_open(in, view); }

void zck_dist_view_close(char *view) { zck__dist_view_close(view); }

int zck_dist_finish(int rc, const char *msg, char *out, size_t out_size) {
  zck__dist_pause(false);
  return zck__dist_finish(rc, msg, out, out_size);
}

void zck_dist_end(void) {
  if (!zck__dist_group) return;
  zck__dist_group->barrier(zck__dist_group);
  zck__dist_end();
  zck_comm_mpi_destroy(zck__dist_group);
  zck__dist_group = NULL;
}
