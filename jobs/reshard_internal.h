/* reshard_internal.h: what the halves of `zckpt reshard` share (jobs-internal). reshard.c
 * dispatches on the source (a DeepSpeed checkpoint, a universal folder, an HDF5 universal
 * container) and runs the DeepSpeed-to-DeepSpeed copy; reshard_check.c refuses what the
 * target cannot express before anything is written; reshard_whole.c writes a DeepSpeed
 * checkpoint from whole-tensor sources (both universal formats). */
#ifndef ZCK_RESHARD_INTERNAL_H
#define ZCK_RESHARD_INTERNAL_H

#include "deepspeed/deepspeed.h"
#include "source.h"
#include "zck.h"

/* Checks, before anything is written, that a DeepSpeed writer with wo can express m from
 * `src` and that the request makes sense (one line each, naming src):
 *   - the source has optimizer state (DS-48: reshard writes exp_avg / exp_avg_sq / step);
 *   - --sub-group-size only for a ZeRO-3 target, and below 1e18 (what a reader takes back);
 *   - every param group has a trainable param and a plain 'lr'; every trainable param is
 *     in a group;
 *   - the ds_version parses for a ZeRO-1/2 target (DS-29). */
zck_status zck__reshard_check(const char *src, const zck_model *m, const zck_ds_write_opts *wo, bool has_optimizer_state,
                              const zck_reshard_opts *o);

/* Copies every regular file of root into dst except DeepSpeed's own (`latest`,
 * `latest_universal`, the tag folder `skip`) and rng_state_<r>.pth of ranks r >= world,
 * each through zck__copy_side_file (side_copy.h). */
zck_status zck__reshard_carry_side_files(const char *root, const char *skip, const char *dst, uint32_t world);
/* Whether a side file is carried over to world size `world`: all but rng_state_<r>.pth of
 * ranks r >= world. */
bool zck__reshard_side_kept(const char *name, uint32_t world);

/* A DeepSpeed PipelineModule source (zck_ds_pipe_stages(c) > 1) in the same pipeline layout at wo's data-parallel size
 * (reshard_pipe.c); what that layout cannot take is refused in one line naming c. */
zck_status zck__reshard_pipe(const zck_ds_ckpt *c, const zck_ds_write_opts *wo, const char *out,
                             const zck_reshard_opts *o);

/* A source of whole tensors over a manifest (the universal formats). */
typedef struct zck__whole_src {
  const char *path;                 /* for messages */
  const zck_model *m;
  const zck_layout *layout[4];      /* fp32, exp_avg, exp_avg_sq, frozen; NULL when absent */
  const zck_store *stores[4];
  const zck_layout *buffer_layout;  /* over the buffer index space; NULL: no buffers */
  const zck_store *buffer_stores;
  const char *side_root;            /* carry this folder's other files (HF checkpoint-N/), or NULL */
  const char *side_skip;            /* the universal folder's name inside side_root */
  /* side files kept elsewhere (the HDF5 container's /side_files), or NULL: called with the
   * output root's temporary path and the target world size after side_root's files */
  zck_status (*side_write)(void *ctx, const char *dst, uint32_t world);
  void *side_ctx;
} zck__whole_src;

/* The whole-tensor parts of a universal folder (universal.h) and of an HDF5 container
 * (zck_h5.h; path for messages, have[p]: part p present), as the reshard and consolidate
 * from them read them: sides and side files left empty. */
struct zck_uv_ckpt;
struct zck_h5u;
void zck__whole_src_uv(const struct zck_uv_ckpt *u, zck__whole_src *s);
void zck__whole_src_h5(const struct zck_h5u *u, const char *path, zck__whole_src *s, bool have[4]);

/* Writes OUT (a save root: OUT/latest, OUT/<tag>/, zckpt manifest) from s with wo: fp32 /
 * exp_avg / exp_avg_sq partition by partition, 16-bit module weights cast from fp32 (RNE)
 * with frozen params from their own part, stage-3 frozen fragments, buffers into every
 * model file; one thread pool. Built under a temporary name: a failure leaves nothing. */
zck_status zck__reshard_whole(const zck__whole_src *s, const zck_ds_write_opts *wo, const char *out,
                              const zck_reshard_opts *o);

/* An AutoTP source (an AutoTP checkpoint, or the universal folder of one) over the full
 * shapes, and what says how its TP ranks cut them. */
typedef struct zck__autotp_src {
  const char *dir;                  /* for messages */
  const zck_state_view *view;
  const zck_model *m;               /* full shapes */
  const zck_pk *uci;                /* universal_checkpoint_info (its affine map) */
  uint32_t tp;
  const char *side_root, *side_skip;  /* as zck__whole_src's; side_root NULL: none */
  zck_status (*side_write)(void *ctx, const char *dst, uint32_t world);  /* as zck__whole_src's */
  void *side_ctx;
  const char *side_label;             /* where side_write's config.json comes from, for messages */
} zck__autotp_src;

/* Every TP rank's files at TP size o->to_tp_size (> 1), at wo's stage and dp size
 * (reshard_autotp.c): at src->tp by src->uci; at another TP size (src->tp 1: a plain source,
 * uci NULL) by DeepSpeed's split from the model config (o->model_config, else the carried
 * config.json of side_root / side_write, else the one beside dir). */
zck_status zck__reshard_autotp(const zck__autotp_src *src, const zck_ds_write_opts *wo, const char *out,
                               const zck_reshard_opts *o);
/* The whole-tensor source as a state view (reshard_whole.c). */
void zck__whole_state(const zck__whole_src *s, zck_state_view *v);

/* --to-format dcp (reshard_dcp.c): SRC (sniffed as kind) as the torch DCP checkpoint FSDP2
 * saves at W ranks. */
zck_status zck__reshard_to_dcp(const char *src, zck__src_kind kind, const char *out, const zck_reshard_opts *o);

/* The reshard of an opened container (reshard_universal.c) or universal folder
 * (reshard_uvdir.c). */
zck_status zck__reshard_from_h5(const zck__src *src, const char *out, const zck_reshard_opts *o);
zck_status zck__reshard_from_universal(const zck__src *src, const char *out, const zck_reshard_opts *o);
/* A torch Distributed Checkpoint to DeepSpeed (reshard_from_dcp.c). */
zck_status zck__reshard_from_dcp(const zck__src *src, const char *out, const zck_reshard_opts *o);

#endif
