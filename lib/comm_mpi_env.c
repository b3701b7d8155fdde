/* comm_mpi_env.c: whether an MPI launcher started this process, read from the variables
 * the launchers set; in every build, so that a build without MPI started by mpirun refuses
 * to run instead of running N unrelated copies of one rank. */
#include "comm.h"

#include <stdlib.h>

bool zck_comm_mpi_launched(void) {
  /* Open MPI's mpirun, MPICH / Intel MPI (PMI), PMIx launchers (srun --mpi=pmix) */
  static const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
    if (getenv(vars[i])) return true;
  return false;
}
