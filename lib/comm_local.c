/* comm_local.c: the local collective backend: W ranks that are threads of one process.
 *
 * It is the ranks engine (comm_ranks.c) with host memory operations: each collective is
 * every rank posting its arguments, a barrier (whose last arriver checks that all ranks
 * posted the same call), every rank doing its share of the work reading the other ranks'
 * buffers directly, and a second barrier so that no rank reuses a buffer that another is
 * still reading. Work is split so that no two ranks touch the same element: in all_reduce
 * rank r owns element chunk r of every buffer, in reduce_scatter rank r writes only its own
 * output, in all_gather rank r writes only its own output. That is what makes the in-place
 * forms of NCCL safe here too. (The cuda-local backend of cuda/ is the same engine with
 * device operations.)
 *
 * Sums run over ranks 0..W-1 in that order, element by element: bit-reproducible.
 */
#include "comm.h"

#include "comm_ranks.h"
#include "error.h"

zck_status zck_comm_local_create(int size, zck_comm **comms) {
  ZCK_ASSERT(size >= 1 && comms);
  return zck__ranks_create(size, &zck__ranks_host_ops, NULL, "local", comms);
}

void zck_comm_local_destroy(zck_comm **comms, int size) { zck__ranks_destroy(comms, size); }
