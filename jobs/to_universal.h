/* to_universal.h: what the two halves of `zckpt to-universal` share (jobs-internal). */
#ifndef ZCK_TO_UNIVERSAL_H
#define ZCK_TO_UNIVERSAL_H

#include <cjson/cJSON.h>

#include "deepspeed/deepspeed.h"
#include "exec.h"
#include "plan.h"
#include "stream_hash.h"
#include "universal/universal.h"
#include "zck.h"

/* One progress bar over several executor runs: each run's bytes are added to what the
 * previous runs wrote. */
typedef struct zck__uvj_progress {
  zck_progress_cb cb;
  void *ctx;
  uint64_t base, total;
} zck__uvj_progress;

int zck__uvj_progress_fn(void *ctx, uint64_t done, uint64_t total);
/* Executor options for one run reporting into p. */
zck_exec_opts zck__uvj_exec_opts(const zck_universal_opts *o, zck__uvj_progress *p);
/* After a run of `bytes` bytes. */
void zck__uvj_progress_advance(zck__uvj_progress *p, uint64_t bytes);

/* A pickled value as JSON (dicts, lists, tuples, sets, numbers, text, None; non-finite
 * floats as "inf"/"-inf"/"nan"; other objects as their summary text). *budget: how many
 * more values it may make, counting each reference to a shared object again (so a
 * self-containing or deeply shared object ends instead of expanding without bound).
 * NULL on OOM or once *budget is 0. */
cJSON *zck__uvj_pk_json(const zck_pk *node, int depth, size_t *budget);
#define ZCK__UVJ_JSON_VALUES ((size_t)1 << 20)

/* The trainable params in DeepSpeed's flat order (param_shapes: flat groups / sub-groups
 * in order), as the fp32 layout lists them. *out is malloc'd. */
zck_status zck__uvj_flat_params(const zck_ds_view *fp32, uint32_t **out, size_t *n);

/* Bytes of the elements a whole-tensor copy of params would write. */
uint64_t zck__uvj_bytes(const zck_model *m, const uint32_t *params, size_t n, zck_dtype t);

/* to_universal_zero0.c: DeepSpeed's folder from a ZeRO-0 source, as ds_to_universal writes
 * it for the equivalent ZeRO-1 checkpoint: the model file's tree (its tensors as copies),
 * zero/optimizer_state.pt's tree, and step.pt of every trainable param. */
zck_status zck__uvj_zero0_model_file(const zck_ds_ckpt *ck, const uint32_t *flat, size_t n_flat, zck_torch_writer *tw,
                                     zck_pk **root, zck_uv_copies *copies);
zck_status zck__uvj_zero0_optimizer_state(const zck_ds_ckpt *ck, zck_torch_writer *tw, zck_pk **root,
                                          zck_uv_copies *copies);
zck_status zck__uvj_zero0_steps(const zck_ds_ckpt *ck, zck_uv_writer *w, const uint32_t *flat, size_t n_flat);

/* A .pt file rebuilt from a pickled tree between its tree and its finish (zero/optimizer_state.pt, a model file):
 * the copy job of its tensors runs with the first batch (zck__uvj_batch) or on its own. */
typedef struct zck__uvj_opt {
  zck_torch_writer *tw;
  zck__shash *h;                /* its manifest hashes, made as it is written */
  zck__shash_budget *budget;    /* the writer's, shared with every file */
  zck__shash_wrap *wrap;        /* [copies.n]: the target stores, feeding h */
  zck_pk *root;
  zck_uv_copies copies;
  zck_plan *plan;
  zck_store *src, *dst;
  uint32_t *crc;
  uint64_t bytes;
} zck__uvj_opt;

/* The copy job of the tensors os's tree holds (alive until os is freed); after it ran, the CRCs and the file. */
zck_status zck__uvj_opt_job(zck__uvj_opt *os, zck_exec_job *job);
zck_status zck__uvj_opt_finish(zck__uvj_opt *os);
void zck__uvj_opt_free(zck__uvj_opt *os);

/* to_universal_autoep.c: an AutoEP source's model-states files as ds_to_universal 0.19.8 saves them again (its
 * universal_checkpoint_info naming the experts), written into w, one executor run each. */
zck_status zck__uvj_autoep_models(const zck_ds_ckpt *ck, zck_uv_writer *w, const zck_universal_opts *o,
                                  zck__uvj_progress *prog);

zck_status zck__to_universal_h5(const zck_ds_ckpt *ck, const char *src, const char *out, const zck_universal_opts *o);

/* The job on the DeepSpeed checkpoint src (opts loaded and checked), the HDF5 container
 * recording `label` as its source. */
zck_status zck__to_universal_of(const char *src, const char *label, const char *out, const zck_universal_opts *o);
/* A torch Distributed Checkpoint (to_universal_dcp.c). */
zck_status zck__to_universal_dcp(const char *src, const char *out, const zck_universal_opts *o);

#endif
