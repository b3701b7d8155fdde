/* zexec_internal.h: the executor's state, shared by zexec.c (passes, hooks, gradients) and
 * zexec_params.c (stage-3 residency of the gathered tensors). */
#ifndef ZE_ZEXEC_INTERNAL_H
#define ZE_ZEXEC_INTERNAL_H

#include "zexec.h"

#define ZX_MODS (ZE_MAX_LAYERS + 2)       /* module m at index m + 1 */
#define ZX_SEQ (3 * ZX_MODS)

struct ze_exec {
  const ze_gpt2_config *c;
  ze_zero_rank *zr;
  ze_exec_opts o;
  bool ov;                     /* overlap_comm on a device with a comm stream */
  int L, n_mod;
  uint32_t idx[ZX_MODS][12];   /* a module's tensors (spec = manifest index) */
  int n_idx[ZX_MODS];
  uint64_t numel[ZX_MODS];     /* elements of a module's tensors */
  uint64_t live;               /* elements gathered (persistent ones too, as DeepSpeed counts) */
  int seq[ZX_SEQ];             /* module uses of the running pass, in order (the trace) */
  int n_seq, pos;
  size_t n_specs;
  uint64_t *spec_numel;        /* [n_specs] */
  uint64_t *spec_off;          /* [n_specs] offset in the model order */
  int *last_user;              /* [n_specs] module whose backward finishes the tensor's gradient */
  float **gbuf;                /* [n_specs] stage 2/3: gradient buffer of a tensor in backward */
  /* per tensor: its fp32 values in the working memory while gathered */
  float **pbuf;                /* [n_specs] NULL: not gathered */
  bool *persist;               /* [n_specs] stage 3 persistent (never released) */
  uint64_t *pver;              /* [n_specs] zr->lp_version its values come from */
  int *pgat;                   /* [n_specs] overlap: index of the module gather whose event it
                                  waits for (-1: ready) */
  bool *keep;                  /* [n_specs] scratch of the release decision */
  void *ev[ZX_MODS];           /* overlap: event of module i's last gather */
  void *ev_fence;              /* overlap: the compute stream's point the comm stream waits for */
  void *ev_reduce;             /* overlap: the last gradient reduction's end */
  bool reduce_pending;
  const ze_exec_driver *drv;   /* NULL: the CPU forward/backward */
  ze_exec_stats stats;
  zck_status status;
};

/* zexec_params.c */
/* Marks the persistent tensors (stage 3) and makes the events (overlap). */
zck_status zx_params_init(ze_exec *x);
void zx_params_free(ze_exec *x);
/* Gathers (stage 3: issues, under overlap) module m's tensors that are not there or stale. */
bool zx_gather(ze_exec *x, int m, bool ahead);
/* Stage 3: the prefetch after position pos (see zexec.h). */
bool zx_prefetch(ze_exec *x);
/* Before module m computes: the compute stream waits for its gathers. */
bool zx_ready(ze_exec *x, int m);
/* After module m ran (pos already advanced): releases what the rules let go. */
void zx_release(ze_exec *x, int m);
/* Frees tensor t's gathered copy. */
void zx_drop(ze_exec *x, uint32_t t);
/* The comm stream waits for the work queued so far on the compute stream. */
bool zx_fence(ze_exec *x);

#endif
