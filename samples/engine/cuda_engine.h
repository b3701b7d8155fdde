/* cuda_engine.h: the device side of a zckpt-train rank with --device cuda.
 *
 * A rank's ZeRO state lives on its GPU (zero.h with dzero.h: fp32 masters, moments,
 * gradient and 16-bit partitions in device memory unless offloaded to the CPU), the
 * module executor (zexec.h) gathers and reduces in device memory, and this file provides
 * what is left: the rank's device, stream and cuBLAS handle, the activation workspace, the
 * device communicator, and the driver that runs GPT-2's forward and backward kernels
 * (cuda/gpt2.cu) through the executor's module hooks.
 *
 * Devices and communicators:
 *  - ranks that are threads (one process): the caller makes one group for all of them with
 *    zck_comm_nccl_create_local (NCCL, rank r on device r, when there are at least W
 *    devices; else the cuda-local backend, every rank on one device with its own stream);
 *  - one process per rank (mpirun, --nproc): device local_rank % device count, and an
 *    NCCL group bootstrapped over the host (MPI) group: the NCCL id goes by MPI broadcast.
 * The host group stays for what the host does (losses, agreements, checkpoint control).
 *
 * Forward/backward on the GPU differ from the CPU's by the order of their float sums
 * (cuBLAS products, tree reductions): losses agree to about 1e-4 relative, not bit for
 * bit. AdamW (fused kernel), the casts and the ZeRO reductions on cuda-local are the CPU's
 * bits given the same inputs; NCCL sums in its own order.
 */
#ifndef ZE_CUDA_ENGINE_H
#define ZE_CUDA_ENGINE_H

#include "comm.h"
#include "gpt2.h"
#include "zck_cuda.h"
#include "zexec.h"

#include <stdbool.h>

typedef struct ze_cuda_rank {
  int device;
  zck_cuda_ctx *ctx;           /* device, stream, cuBLAS handle */
  zck_cuda_gpt2 *model;        /* activations and their gradients for (B, T) */
  zck_comm *dcomm;             /* collectives on device buffers */
  bool own_dcomm;              /* made here (process per rank) */
  const ze_gpt2_config *cfg;
  ze_exec_driver drv;
} ze_cuda_rank;

/* Whether --device cuda can run here: a CUDA build and at least one device (else
 * ZCK_ERR_NO_DEVICE with the reason). */
zck_status ze_cuda_check(void);

/* Sets up a rank for batches up to (B, T). Threads: dcomm is the rank's handle of the
 * group (its device is the group's choice). Process per rank: dcomm NULL, bootstrap the
 * host group; collective over it (every rank calls). cr is zeroed first; on failure it is
 * left freeable. */
zck_status ze_cuda_rank_init(ze_cuda_rank *cr, const ze_gpt2_config *cfg, zck_comm *dcomm, zck_comm *bootstrap,
                             int local_rank, int B, int T);
void ze_cuda_rank_free(ze_cuda_rank *cr);

/* The executor's driver for this rank (forward/backward kernels through its hooks). */
const ze_exec_driver *ze_cuda_driver(ze_cuda_rank *cr);

#endif
