/* launch.h: zckpt-train with one process per rank.
 *
 * - Under mpirun (or srun) each rank is a process whose collectives go over lib/comm's MPI
 *   backend; zck_comm_agree (comm.h) turns one rank's failure into the same error on every
 *   rank, so they all stop at the same point. A rank that dies ends the job (mpirun).
 * - `zckpt-train --nproc N` (ze_launch_nproc) is a shorthand for
 *   `mpirun -np N --oversubscribe zckpt-train ARGS` on this host: this process becomes
 *   mpirun (exec).
 */
#ifndef ZE_LAUNCH_H
#define ZE_LAUNCH_H

#include "comm.h"

#include <stdint.h>

/* Execs mpirun with argv as N rank processes, leaving out argv[skip_at .. skip_at + skip_n)
 * (the --nproc option); returns only when that fails (1, after one line). */
int ze_launch_nproc(int nproc, int argc, char **argv, int skip_at, int skip_n);

/* Test hook for the fault tests: ZCKPT_TRAIN_TEST_KILL="RANK:STEP[:save|:hang]" makes rank
 * RANK kill itself with SIGKILL at the start of optimizer step STEP (1-based global step),
 * or, with ":save", in the save of step STEP after it wrote its own files; with ":hang" it
 * stops there for ever instead (alive, never arriving). Only in process mode. */
void ze_test_kill_point(zck_comm *c, int64_t step, bool in_save);
/* ZCKPT_TRAIN_TEST_KILL="0:STEP:reshard": the process (rank 0's, or the one of all thread
 * ranks) kills itself once a resume from the checkpoint of step STEP has written the
 * reshard it needs (a temporary tree beside the output), before any rank reads it. */
void ze_test_kill_after_reshard(int64_t step);

#endif
