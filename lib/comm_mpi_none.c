/* comm_mpi_none.c: the MPI backend's entry points in a build without MPI (ZCK_MPI=OFF, or
 * AUTO without an MPI library): nothing is launched by MPI, and creating a group says why. */
#include "comm.h"

#include "error.h"

bool zck_comm_mpi_available(void) { return false; }

zck_status zck_comm_mpi_create(zck_comm **out) {
  *out = NULL;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "mpi comm: this zckpt was built without MPI (ZCK_MPI=OFF or no MPI found)");
}

int zck_comm_mpi_local_rank(const zck_comm *c) {
  (void)c;
  return 0;
}

void zck_comm_mpi_name_dead_peers(zck_comm *c) { (void)c; }

void zck_comm_mpi_destroy(zck_comm *c) { (void)c; }

void zck__comm_mpi_set_segment(zck_comm *c, size_t bytes) {
  (void)c;
  (void)bytes;
}
