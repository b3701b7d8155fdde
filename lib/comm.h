/* comm.h: the collectives that ZeRO needs, behind one struct of function pointers.
 *
 * A communicator is one rank's handle on a group of `size` ranks. Backends:
 *  - local (comm_local.c): W threads of one process, buffers in host memory;
 *  - tcp (comm_tcp.c): one process per rank, on one host or many, over TCP sockets;
 *    rendezvous at MASTER_ADDR:MASTER_PORT as torchrun sets it (also under mpirun);
 *  - NCCL (cuda/): one process or thread per GPU, buffers in device memory; a process-per-GPU
 *    NCCL group gets its unique id through a tcp group's broadcast.
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

#include <stdbool.h>
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

/* ---- tcp backend: this process is one rank of `size`, the others are processes on this
 * host or others. Rank 0 listens at master_addr:master_port; the others connect to it and
 * learn each other's addresses from it. Same semantics and same bits as the local backend
 * (reductions in rank order 0..W-1, element by element), buffers in host memory.
 * A peer that dies or hangs up makes every later collective fail with a one-line error
 * naming the rank; nothing waits longer than timeout_s for a connection.
 * Between collectives each rank's handle runs a thread that tells peers waiting for it
 * whether it is alive and busy (using CPU or doing block I/O): a rank that works alone for
 * longer than timeout_s (a reshard, a manifest write) does not fail the others' wait; one
 * idle that long (blocked for good) does; a busy one whose beats stop (the process was
 * stopped, its host went away) is named after timeout_s / 4 (1..10 s); a dead one at once. */
typedef struct zck_comm_tcp_options {
  int rank, size;
  const char *master_addr;  /* host name or address of rank 0 */
  int master_port;          /* 1..65535 */
  double timeout_s;         /* rendezvous and per-collective wait; <= 0: 300 s */
} zck_comm_tcp_options;
zck_status zck_comm_tcp_create(const zck_comm_tcp_options *o, zck_comm **out);
/* Frees a tcp handle (closes its sockets). NULL is fine. */
void zck_comm_tcp_destroy(zck_comm *c);

/* Reads the launcher's environment into o: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
 * (torchrun, and zckpt-train --nproc); under mpirun without RANK, OMPI_COMM_WORLD_RANK /
 * OMPI_COMM_WORLD_SIZE (Open MPI) or PMI_RANK / PMI_SIZE (MPICH) give rank and size, and
 * MASTER_ADDR / MASTER_PORT still name rank 0's host. *found is false when no launcher
 * variable is set (a single-process run); a malformed or inconsistent value is an error
 * naming the variable. The strings in o point into the environment. */
zck_status zck_comm_env_options(zck_comm_tcp_options *o, bool *found);
/* (comm_env.c) With more than one rank MASTER_ADDR and MASTER_PORT are both required (no
 * guessed host or port); a one-rank world needs neither. ZCK_COMM_TIMEOUT_S, when set,
 * fills timeout_s. LOCAL_RANK (or OMPI_COMM_WORLD_LOCAL_RANK / MPI_LOCALRANKID, from the
 * same launcher as the rank) is checked to be in 0..size-1 when set. */

/* This process's rank among those on its host (the GPU to use): LOCAL_RANK, or
 * OMPI_COMM_WORLD_LOCAL_RANK / MPI_LOCALRANKID under mpirun; -1 when not set (or not a
 * valid number: zck_comm_env_options reports that). */
int zck_comm_env_local_rank(void);

#endif
