/* source.h: what a job reads, whatever holds it (jobs-internal).
 *
 * Every job finds out what its input path is here, once (zck__src_sniff), and opens it
 * here (zck__src_open): the matching describer turns it into a state view, with the
 * model, zero_to_fp32's output recipe and the ties a save left unsaved, so a job never
 * asks which reader is behind it unless it needs what only that reader knows (reshard's
 * write options, to-universal's optimizer pickles).
 *
 * Adding a source (torch DCP, DeepSpeed AutoEP, ...):
 *   1. a value in zck__src_kind, with what the path looks like;
 *   2. its rule in zck__src_sniff (source.c), at the place its precedence puts it;
 *   3. its arm in zck__src_open (source.c): open the describer, fill kind's view, m, dir,
 *      outs and unsaved, keep its handle in zck__src (beside ck, uv, h5) and close it in
 *      zck__src_close;
 *   4. its bit in the `reads` of each job that takes it (ZCK__SRC_BIT). A job reading a
 *      kind it does not take hands the path to the DeepSpeed reader, which says why it
 *      is not a checkpoint; no job has to change otherwise.
 */
#ifndef ZCK_JOBS_SOURCE_H
#define ZCK_JOBS_SOURCE_H

#include "deepspeed/deepspeed.h"
#include "state.h"
#include "tensor_set.h"
#include "zck.h"

typedef enum zck__src_kind {
  ZCK__SRC_NONE,          /* nothing recognised, or a path that cannot be read */
  ZCK__SRC_DEEPSPEED,     /* a folder with `latest`, latest_universal (with `latest`) or
                             rank-0 model states: a save root or tag folder */
  ZCK__SRC_UNIVERSAL,     /* a folder with zero/, or with latest_universal and no `latest`:
                             a universal folder in DeepSpeed's layout, or its parent */
  ZCK__SRC_HDF5,          /* a file with the HDF5 signature: zckpt's universal container */
  ZCK__SRC_TORCH,         /* a zip (torch.save) or legacy pickle file: .pt / .bin */
  ZCK__SRC_SAFETENSORS,   /* a file whose 8-byte header length is followed by '{' or ' ' */
  ZCK__SRC_HF,            /* a *.index.json, or a folder with model.safetensors(.index.json) */
  ZCK__SRC_DCP,           /* a torch Distributed Checkpoint: a folder with .metadata, an
                             Accelerate save_state (pytorch_model_fsdp_0/), an HF output_dir
                             or torchtitan folder whose newest checkpoint-N / step-N is one */
  /* new kinds here (see the top of this file) */
  ZCK__SRC_KIND_COUNT
} zck__src_kind;

#define ZCK__SRC_BIT(k) (1u << (k))

/* What path is, by the rules above, in that order (a folder's, then a file's bytes: the
 * first 9 read once). Never fails: a path it cannot read is NONE, for the job to explain. */
zck__src_kind zck__src_sniff(const char *path);

/* Refuses in one line a path that is a save zckpt knows and does not read (ZCK_OK for any
 * other): Accelerate's FSDP1 per-rank files (LOCAL_STATE_DICT's pytorch_model_fsdp_rank<r>.bin,
 * SHARDED_STATE_DICT saved with use_dcp=False as pytorch_model_fsdp_0_rank<r>.bin), the
 * folder holding them or one of them. */
zck_status zck__src_refuse_known(const char *path);

typedef struct zck__src_opts {
  unsigned reads;            /* ZCK__SRC_BITs of the kinds the job takes; others go to the
                                DeepSpeed reader (which explains) */
  const char *tag;           /* a DeepSpeed tag folder; NULL: `latest` */
  unsigned threads;
  bool force;                /* open a zckpt checkpoint whose manifest is missing */
  bool check_complete;       /* refuse one (unless force): zck_ds_check_complete /
                                zck_manifest_check_complete of the folder read */
  bool check_complete_universal;  /* the same for a universal folder */
  bool no_verify;            /* the universal reader's checks of its manifest's hashes */
  bool require_optimizer_state;   /* DeepSpeed: exp_avg / exp_avg_sq must be there (DS-48) */
  bool recipe;               /* zero_to_fp32's recipe wanted (outs): the container builds it */
  bool autoep_ds_names;      /* DeepSpeed AutoEP: DeepSpeed's names, not the HF model's (zck_ds_open_opts) */
} zck__src_opts;
#define ZCK__SRC_OPTS_INIT {0, NULL, 0, false, false, false, false, false, false, false}

/* An opened source. */
typedef struct zck__src {
  zck__src_kind kind;                /* what was opened (DEEPSPEED for a kind the job does not take) */
  const char *dir;                   /* for messages: the folder or file read */
  const zck_model *m;
  zck_state_view view;
  const zck_ds_output *outs;         /* zero_to_fp32's recipe for the checkpoint held, or made from
                                        (opts.recipe; NULL without it for a container) */
  size_t n_outs;
  const char *const *unsaved;        /* [2 * n_unsaved]: alias, source (zck_ds_unsaved_tie) */
  size_t n_unsaved;
  /* the describer behind it, one of them set: what only it knows */
  zck_ds_ckpt *ck;
  struct zck_uv_ckpt *uv;
  struct zck_h5u *h5;
  struct zck_dcp *dcp;
  /* owned */
  zck_ds_output *own_outs;
  const char **own_unsaved;
} zck__src;

/* Opens path, sniffed as kind (zck__src_sniff), with its describer. s is zeroed first and
 * may be closed whatever the result. */
zck_status zck__src_open(zck__src *s, const char *path, zck__src_kind kind, const zck__src_opts *o);
void zck__src_close(zck__src *s);

/* config.json / generation_config.json of the source's save root (an HF checkpoint-N/;
 * the container's /side_files), for an output folder: names and texts, free() each. A
 * container's that cannot be read (damaged) fails, and so does a folder's that is not
 * JSON (zck__json_check). */
zck_status zck__src_side_files(const zck__src *s, char ***names, char ***texts, size_t *n);

#endif
