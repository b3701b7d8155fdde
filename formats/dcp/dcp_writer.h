/* dcp_writer.h: writing a torch Distributed Checkpoint as FSDP2 saves one, reserve-then-fill.
 *
 * What FSDP2 (`fully_shard` over a mesh of W ranks) saves with
 *   dcp.save({"model": msd, "optim": osd}) where msd, osd = get_state_dict(model, optim):
 *   - `.metadata`: a pickle of torch.distributed.checkpoint.metadata.Metadata (dcp_write_meta.c);
 *   - `__<r>_0.distcp` for r < W: items one after the other, each its own torch.save
 *     archive (formats/torch torch_item.c), uncompressed, tensor data 64-byte aligned from
 *     the archive's start, and exactly the chunk (no FSDP padding).
 * Keys: model.<fqn> (params and persistent buffers), optim.state.<fqn>.{step, exp_avg,
 * exp_avg_sq} (step a 0-d float32 tensor), optim.param_groups.<i>.<setting> (a bytes item:
 * torch.save of the value; `params` is the group's list of FQNs). Accelerate's FSDP
 * checkpoint (FSDP1 or FSDP2, SHARDED_STATE_DICT) is two such folders: pytorch_model_fsdp_0/
 * with the model.<fqn> entries alone and optimizer_0/ with the optimizer's alone under the
 * root key "optimizer" (optim_root, no_model below); the items are the same.
 * Sharding: every param along dim 0 by torch.chunk's rule (FSDP2's Shard(0)): with
 * c = ceil(rows / W), rank r holds rows [min(rows, r c), min(rows, (r + 1) c)): trailing
 * ranks may hold an empty chunk, which is still recorded, once per offset (torch's dedup
 * keeps one of two empty chunks that start at the same row: 1 row over 3 ranks). Buffers and the replicated
 * items (steps, settings) are saved once, in rank 0's file (torch's dedup puts each on one
 * rank; which one does not matter to a loader).
 *
 * Model weights are the fp32 masters (an FSDP2 module keeps fp32 params; mixed precision
 * casts only for compute); frozen params are written as float32 too, from their saved
 * 16-bit values; tied aliases (lm_head.weight = embed_tokens.weight) get their own
 * model.<fqn> entry holding the same bytes, as get_state_dict lists both names.
 */
#ifndef ZCK_DCP_WRITER_H
#define ZCK_DCP_WRITER_H

#include "model.h"
#include "state.h"

typedef struct zck_dcp_write_opts {
  uint32_t world_size;        /* W >= 1: the FSDP2 mesh the checkpoint is saved from */
  bool has_optimizer_state;   /* write optim.state.* and optim.param_groups.* */
  double step;                /* Adam's step count, every trainable param's */
  const char *optim_root;     /* the optimizer's key: "optim" (get_state_dict's, as above) or "optimizer"
                                 (Accelerate's save_fsdp_optimizer: {"optimizer": osd} in its own folder) */
  bool no_model;              /* write the optimizer's entries only (Accelerate's optimizer_0/) */
} zck_dcp_write_opts;
#define ZCK_DCP_WRITE_OPTS_INIT {1, true, 0.0, "optim", false}

typedef struct zck_dcp_writer zck_dcp_writer;

/* Reserves every file in the folder dir (which must exist: a job's temporary output
 * folder), writing at once what is known (settings, steps). m must outlive the writer.
 * Refused in one line: a 0-d param (FSDP2 shards along dim 0). */
zck_status zck_dcp_writer_create(const char *dir, const zck_model *m, const zck_dcp_write_opts *o, zck_dcp_writer **out);

/* The reserved target as state views (lib/state.h) for one zck_transfer: view 0 holds the
 * fp32 weights, exp_avg, exp_avg_sq (when written), frozen params and buffers; view 1, when
 * the model has tied aliases, their model.<fqn> copies (laid over their owners' indices).
 * Each store is one chunk's data region; its CRC-32 is taken as the transfer writes it.
 * Returns the number of views (1 or 2) filled in out[0..2). */
size_t zck_dcp_writer_state(zck_dcp_writer *w, zck_state_view out[2]);

/* Finishes every item with the CRC its data was written with, then writes .metadata. The
 * caller commits the folder (fsync, rename). */
zck_status zck_dcp_writer_commit(zck_dcp_writer *w);
/* Frees (files stay where they are: the caller's folder removes them on abort). NULL is fine. */
void zck_dcp_writer_free(zck_dcp_writer *w);

/* FSDP2's dim-0 chunk of rank r out of W for a dim 0 of `rows`: torch.chunk's rule. */
void zck_dcp_chunk_rows(int64_t rows, uint32_t world, uint32_t r, int64_t *first, int64_t *count);

#endif
