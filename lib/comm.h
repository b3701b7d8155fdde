/* comm.h: the collectives that ZeRO needs, behind one struct of function pointers.
 *
 * A communicator is one rank's handle on a group of `size` ranks. Backends:
 *  - local (comm_local.c): W threads of one process, buffers in host memory;
 *  - NCCL (cuda/, later): one process or thread per GPU, buffers in device memory;
 *  - MPI (later).
 * Every rank of the group must call the same collectives in the same order with the same
 * counts and dtypes (as in NCCL). The signatures mirror NCCL's so a backend is a thin shim:
 *
 *   all_reduce     recv[i] = op over ranks of send[i], i < count        (send == recv allowed)
 *   reduce_scatter recv[i] = op over ranks of send[rank*recv_count + i] (recv may be
 *                  send + rank*recv_count)
 *   all_gather     recv[k*send_count + i] = send of rank k [i]          (send may be
 *                  recv + rank*send_count)
 *   broadcast      buf = root's buf
 *
 * Determinism: the local backend reduces in rank order 0, 1, ..., W-1 for every element, so
 * the same inputs give the same bits whatever the thread scheduling. (NCCL gives the same bits
 * for the same W and topology, but a different order than the local backend.)
 *
 * Failure: when one rank fails it calls abort(); the collectives of the other ranks then
 * return ZCK_ERR_INTERNAL ("another rank failed") instead of waiting for ever.
 */
#ifndef ZCK_COMM_H
#define ZCK_COMM_H

#include "zck.h"

#include <stddef.h>

typedef enum zck_comm_op { ZCK_COMM_SUM = 0, ZCK_COMM_MAX, ZCK_COMM_MIN } zck_comm_op;

typedef struct zck_comm zck_comm;
struct zck_comm {
  int rank, size;
  const char *backend; /* "local", "nccl", ... for messages */
  void *impl;          /* backend state */

  zck_status (*all_reduce)(zck_comm *c, const void *send, void *recv, size_t count, zck_dtype dt, zck_comm_op op);
  zck_status (*reduce_scatter)(zck_comm *c, const void *send, void *recv, size_t recv_count, zck_dtype dt,
                               zck_comm_op op);
  zck_status (*all_gather)(zck_comm *c, const void *send, void *recv, size_t send_count, zck_dtype dt);
  zck_status (*broadcast)(zck_comm *c, void *buf, size_t count, zck_dtype dt, int root);
  zck_status (*barrier)(zck_comm *c);
  /* Marks the group failed and wakes every waiting rank. Safe to call more than once. */
  void (*abort)(zck_comm *c);
};

/* ---- local backend: `size` ranks that are threads of this process.
 * Fills comms[0..size-1]; rank r's handle must be used by one thread only. Reductions
 * support F32, F64, I32, I64 (and BF16/F16, summed in float in rank order, rounded once);
 * gathers and broadcasts move any dtype. */
zck_status zck_comm_local_create(int size, zck_comm **comms);
/* Frees the group created by zck_comm_local_create (all handles at once). NULL is fine. */
void zck_comm_local_destroy(zck_comm **comms, int size);

#endif
