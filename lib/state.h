/* state.h: the state view, where every kind of a model's training state lives.
 *
 * A describer fills one: the DeepSpeed reader (rank files, records read in place), the
 * universal and HDF5 readers (per-parameter files and datasets), a writer's reserve (the
 * regions it laid out in its target files), the training engine (its ranks' memory). Each
 * part is a layout over the model's param index space (layout.h) with one bound store per
 * layout store (exec.h). A view only points: the describer owns the layouts and stores,
 * and keeps them alive while the view is used.
 *
 * transfer.h moves state from one view into another with the same rules for every job.
 */
#ifndef ZCK_STATE_H
#define ZCK_STATE_H

#include "exec.h"
#include "layout.h"
#include "model.h"

typedef enum zck_state_kind {
  ZCK_STATE_FP32 = 0,    /* trainable params' fp32 master weights */
  ZCK_STATE_EXP_AVG,     /* Adam's first moment (same layout as FP32 in every ZeRO view) */
  ZCK_STATE_EXP_AVG_SQ,  /* Adam's second moment */
  ZCK_STATE_LP,          /* 16-bit module weights. In a source: a live 16-bit copy of the
                            trainable params (the engine's); absent, they are cast from
                            FP32 (RNE), as DeepSpeed refreshes them after every step. In a
                            target: the 16-bit tensors of every owner param, frozen too */
  ZCK_STATE_FROZEN,      /* frozen params' 16-bit values (never cast: there is no master) */
  ZCK_STATE_KINDS
} zck_state_kind;

typedef struct zck_state_part {
  const zck_layout *layout;  /* NULL: the view has no such part */
  const zck_store *stores;   /* [layout->n_stores]; stores nothing maps to may be unbound */
  uint32_t *crc;             /* target only, optional, [layout->n_stores]: receives the
                                CRC-32 of each store's bytes as written (exec.h dst_crc32) */
} zck_state_part;

/* A writer hook, called once every plan of a transfer into the view is built and before a
 * byte moves: it may reorder each plan's extents (not change them) and get ready to hash
 * what they write. plans[i] is jobs[i]'s plan; jobs[i].dst are the view's stores. */
typedef zck_status (*zck_state_ready_fn)(void *ctx, zck_plan *const *plans, const zck_exec_job *jobs, size_t n);

typedef struct zck_state_view {
  const zck_model *model;         /* param names for messages; may be NULL */
  const char *name;               /* what the view is, for messages (a folder, a file, "rank memory") */
  zck_state_part part[ZCK_STATE_KINDS];
  /* buffers: a whole layout over the model's BUFFER index space. A source has one copy; a
   * target has n_buffer_copies (every stage-3 model file holds all buffers), copy i bound
   * at buffers.stores + i * layout->n_stores (and its CRCs at buffers.crc + the same). */
  zck_state_part buffers;
  size_t n_buffer_copies;
  /* target only */
  bool write_in_order;            /* plan in target order (each store written front to
                                     back, in smaller pieces): for writers that hash as they go */
  zck_state_ready_fn ready;       /* optional */
  void *ready_ctx;
} zck_state_view;

#endif
