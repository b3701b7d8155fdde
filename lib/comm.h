/* comm.h: the collectives that ZeRO needs, behind one struct of function pointers.
 *
 * A communicator is one rank's handle on a group of `size` ranks. Backends:
 *  - local (comm_local.c): W threads of one process, buffers in host memory;
 *  - mpi (comm_mpi.c): one process per rank under mpirun / srun, on one host or many;
 *  - NCCL (cuda/): one process or thread per GPU, buffers in device memory; a process-per-GPU
 *    NCCL group gets its unique id through an MPI group's broadcast.
 * Every rank of the group must call the same collectives in the same order with the same
 * counts and dtypes (as in NCCL). The signatures mirror NCCL's so a backend is a thin shim:
 *
 *   all_reduce     recv[i] = op over ranks of send[i], i < count        (send == recv allowed)
 *   reduce_scatter recv[i] = op over ranks of send[rank*recv_count + i] (recv may be
 *                  send + rank*recv_count)
 *   all_gather     recv[k*send_count + i] = send of rank k [i]          (send may be
 *                  recv + rank*send_count)
 *   broadcast      buf = root's buf
 *   gather         root's recv = rank 0's send (counts[0] elements), then rank 1's
 *                  (counts[1]), ...; every rank passes the same counts; recv is written on
 *                  root only (the others may pass NULL). Optional: NULL in a backend that
 *                  has none (NCCL), where a caller broadcasts instead. Unlike W broadcasts,
 *                  each rank's bytes travel once, to root alone.
 *
 * Determinism: the local backend reduces in rank order 0, 1, ..., W-1 for every element, so
 * the same inputs give the same bits whatever the thread scheduling. (NCCL gives the same bits
 * for the same W and topology, but a different order than the local backend.)
 *
 * Failure: in the local backend, when one rank fails it calls abort(); the collectives of the
 * other ranks then return ZCK_ERR_INTERNAL ("another rank failed") instead of waiting for
 * ever. Process ranks (mpi) agree on failures through collectives of their own; abort there
 * only stops the handle's later collectives.
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
  zck_status (*gather)(zck_comm *c, const void *send, void *recv, const size_t *counts, zck_dtype dt, int root);
  zck_status (*barrier)(zck_comm *c);
  /* Marks the group failed and wakes every waiting rank. Safe to call more than once. */
  void (*abort)(zck_comm *c);
};

/* ---- agreement: collective; every rank passes its own outcome of a step, and all of them
 * return ZCK_OK when every rank succeeded, else the error of the lowest failing rank (its
 * message, prefixed with "rank R: " on the others), so ranks that each did their part all
 * stop at the same point. A collective failure (a peer gone) is returned as is, except
 * that a rank's own failure keeps precedence. */
zck_status zck_comm_agree(zck_comm *c, zck_status s);
/* Whether the last failure zck_comm_agree returned on this thread was an agreed one, which
 * rank 0 holds too (so rank 0 alone need report it); cleared by zck_comm_agree_reset. */
bool zck_comm_agree_reached_all(void);
void zck_comm_agree_reset(void);

/* ---- local backend: `size` ranks that are threads of this process.
 * Fills comms[0..size-1]; rank r's handle must be used by one thread only. Reductions
 * support F32, F64, I32, I64 (and BF16/F16, summed in float in rank order, rounded once);
 * gathers and broadcasts move any dtype. */
zck_status zck_comm_local_create(int size, zck_comm **comms);
/* Frees the group created by zck_comm_local_create (all handles at once). NULL is fine. */
void zck_comm_local_destroy(zck_comm **comms, int size);

/* ---- MPI backend (comm_mpi.c): this process is one rank of MPI_COMM_WORLD, launched by
 * mpirun or srun on one host or many. Same semantics and same bits as the local backend
 * (reductions in rank order 0..W-1, element by element: an all-to-all, then the host
 * reduction), buffers in host memory. A wait polls against ZCK_COMM_TIMEOUT_S (seconds,
 * default 1800): past it the rank prints one line and calls MPI_Abort, which ends the job.
 * A peer that dies ends the job through mpirun. In a build without MPI (ZCK_MPI=OFF, or
 * AUTO and none found) zck_comm_mpi_available is false and create fails (UNSUPPORTED). */
bool zck_comm_mpi_available(void);
/* Whether this process was started by an MPI launcher (OMPI_COMM_WORLD_SIZE, PMI_SIZE or
 * PMIX_RANK is set), in a build with or without MPI. */
bool zck_comm_mpi_launched(void);
/* Initializes MPI unless the caller did (MPI_Init_thread, SERIALIZED) and returns this
 * rank's handle on a duplicate of MPI_COMM_WORLD. A malformed ZCK_COMM_TIMEOUT_S is an
 * error naming it. One group per process run: MPI cannot be initialized twice. */
zck_status zck_comm_mpi_create(zck_comm **out);
/* This rank's index among the ranks on its host (MPI_Comm_split_type SHARED): its GPU. */
int zck_comm_mpi_local_rank(const zck_comm *c);
/* From now on, when mpirun stops this rank with SIGTERM because another rank died, the
 * first rank so stopped on each host prints one line naming the dead rank on its host
 * ("PROG: error: rank R: rank K (pid P) died; mpirun stopped the job") before dying of
 * the signal. Installs a SIGTERM handler (removed by destroy). */
void zck_comm_mpi_name_dead_peers(zck_comm *c);
/* Frees the handle; MPI is finalized with the last handle if create initialized it.
 * NULL is fine. */
void zck_comm_mpi_destroy(zck_comm *c);
/* (tests) Bytes per rank and step of a collective (0: the default, 32 MiB); the same on
 * every rank. */
void zck__comm_mpi_set_segment(zck_comm *c, size_t bytes);

#endif
