/* universal.h: DeepSpeed's universal checkpoint layout (ds_to_universal.py), written and read.
 *
 * On disk (deepspeed-checkpoint.md §5.2, as DeepSpeed 0.19.8 writes it):
 *   <out>/zero/optimizer_state.pt           optimizer-wide state (loss scaler, param_groups, ...)
 *   <out>/zero/<param>/fp32.pt              stage <= 2: {'cat_dim': 0, 'param': T} (T full shape)
 *   <out>/zero/<param>/exp_avg.pt           stage 3:    T, a bare 1-D tensor of numel elements
 *   <out>/zero/<param>/exp_avg_sq.pt
 *   <out>/zero/<param>/step.pt              stage <= 2, when the optimizer keeps `step`: the raw
 *                                           value (0-dim float32 tensor, or an int)
 *   <out>/zero/<name>/fp32.pt               stage <= 2: {'param': module[name].float()} for every
 *                                           other `module` entry (frozen params, tied aliases,
 *                                           buffers; DeepSpeed 0.19.8 adds these)
 *   <out>/...model_states.pt                 the source's model-states files, byte for byte
 *   <parent of out>/latest_universal        basename(out), no newline
 * <param> is the parameter name as a folder name (dots kept).
 *
 * Writer: zck_uv_writer_create() makes <out> under a temporary name. Tensor files are
 * reserved in batches (each holds a file descriptor until its batch is finished, so the
 * caller bounds how many are open at once); each exposes a callback store that copy
 * plans fill from any thread. Other files (step.pt, optimizer_state.pt, byte copies) are
 * added the same way. zck_uv_writer_commit() renames <out> into place in one step and
 * then writes latest_universal atomically.
 *
 * Reader: zck_uv_open() describes a universal checkpoint (the folder, or its parent
 * holding latest_universal) as a model manifest plus whole-tensor layouts and stores for
 * fp32 / exp_avg / exp_avg_sq, the frozen params and buffers of the carried model-states
 * files, and the pickled objects a DeepSpeed writer carries over (for reshard), validating
 * it (latest_universal, the per-param files' form, shapes and sizes). A universal folder has no per-rank
 * optimizer files: the DeepSpeed reader's rules are applied to the model-states file and
 * zero/optimizer_state.pt instead (uv_manifest.c).
 */
#ifndef ZCK_UNIVERSAL_H
#define ZCK_UNIVERSAL_H

#include "exec.h"
#include "layout.h"
#include "model.h"
#include "state.h"
#include "torch/torch.h"

#include "manifest.h"
#include <stdbool.h>

/* A parameter name usable as one folder name (no '/', '\\', NUL, not "", "." or ".."),
 * else FORMAT "parameter 'NAME' cannot be stored ...: why". */
zck_status zck_uv_check_name(const char *name);

// ---- writer

typedef struct zck_uv_writer zck_uv_writer;

typedef struct zck_uv_write_opts {
  bool overwrite;             /* replace an existing <out> */
  bool write_latest;          /* <parent>/latest_universal (DeepSpeed always writes it) */
  bool hash;                  /* make the manifest hashes of the tensor files as they are
                                 written (zck_uv_writer_known) */
  unsigned threads;           /* zck_uv_writer_tensors and finish_batch make and finish the
                                 files on this many threads (0: 1) */
} zck_uv_write_opts;
#define ZCK_UV_WRITE_OPTS_INIT {false, true, false, 0}

typedef enum zck_uv_form {
  ZCK_UV_CAT_DIM = 0,         /* {'cat_dim': 0, 'param': T} */
  ZCK_UV_PARAM,               /* {'param': T} */
  ZCK_UV_BARE,                /* T */
  ZCK_UV_VOCAB,               /* {'vocab_tensor': True, 'param': T}: AutoTP vocabulary-parallel params */
  ZCK_UV_EXPERT               /* {'param': T, 'cat_dim': 0, 'is_expert_param': True, 'ep_num_experts': shape[0]}:
                                 an AutoEP expert weight, all experts (any stage) */
} zck_uv_form;

/* out must not end with '/' (it is stripped: DeepSpeed would write an empty
 * latest_universal inside the folder). */
zck_status zck_uv_writer_create(const char *out, const zck_uv_write_opts *o, zck_uv_writer **w);
/* The folder's final path and the path a file named rel gets in the temporary tree. */
const char *zck_uv_writer_path(const zck_uv_writer *w);
char *zck_uv_writer_tmp_file(const zck_uv_writer *w, const char *rel);

/* Reserves zero/<name>/<state>.pt holding one contiguous tensor in `form`; *store writes
 * its elements (row-major, dtype) from any thread, taking each piece's CRC-32 as it writes
 * it (a plan writing it needs no dst_crc32). *handle: the file's number among the writer's. */
zck_status zck_uv_writer_tensor(zck_uv_writer *w, const char *name, const char *state, zck_uv_form form,
                                zck_dtype dtype, int ndim, const int64_t *shape, zck_store *store, size_t *handle);
/* One tensor file of zck_uv_writer_tensors: zero/<name>/<state>.pt, as zck_uv_writer_tensor's
 * arguments, and what it holds for zck_uv_writer_state: state kind `kind` (state.h) of param
 * `param` of the caller's model, whole; kind -1: bytes the caller copies itself. */
typedef struct zck_uv_tensor_spec {
  const char *name, *state;
  zck_uv_form form;
  zck_dtype dtype;
  int ndim;
  const int64_t *shape;
  int kind;
  uint32_t param;
} zck_uv_tensor_spec;
/* Reserves n tensor files at once, made on opts.threads threads (one parameter's folder and
 * its files per work item: a parameter's specs must be adjacent to be made in parallel),
 * stores[i] / handles[i] as zck_uv_writer_tensor's. On failure none of them is reserved. */
zck_status zck_uv_writer_tensors(zck_uv_writer *w, const zck_uv_tensor_spec *specs, size_t n, zck_store *stores,
                                 size_t *handles);
/* Number of tensor files reserved and not yet finished. */
size_t zck_uv_writer_pending(const zck_uv_writer *w);
/* The pending tensor files as target state views over m (the model their specs' params index):
 * per kind a whole layout over the params its files hold, bound to their stores. A param
 * with two files of one kind (a tied alias written from its source's weights) has the second
 * in a further view: *n views, valid until zck_uv_writer_finish_batch. */
zck_status zck_uv_writer_state(zck_uv_writer *w, const zck_model *m, const zck_state_view **views, size_t *n);
/* Finishes every reserved tensor file (pickle, directory, rename) on opts.threads threads
 * and frees their descriptors. Call after the plan that fills them ran. */
zck_status zck_uv_writer_finish_batch(zck_uv_writer *w);

/* zero/<name>/step.pt: a 0-dim float32 tensor (is_tensor) or a Python int (with opts.hash,
 * hashed as written). */
zck_status zck_uv_writer_step(zck_uv_writer *w, const char *name, bool is_tensor, double value);

/* A torch file at rel (e.g. "zero/optimizer_state.pt") built by the caller: the writer
 * is created here and finished with zck_torch_writer_finish by the caller. */
zck_status zck_uv_writer_torch(zck_uv_writer *w, const char *rel, zck_torch_writer **tw);
/* The same, its manifest hashes made as it is written into h (stream_hash.h; the caller's:
 * it covers, starts and feeds it); once the caller finished the file,
 * zck_uv_writer_keep_hashed adds them to zck_uv_writer_known (no-op without opts.hash). */
struct zck__shash;
zck_status zck_uv_writer_torch_hashed(zck_uv_writer *w, const char *rel, struct zck__shash *h, zck_torch_writer **tw);
zck_status zck_uv_writer_keep_hashed(zck_uv_writer *w, const char *rel, struct zck__shash *h);
/* The memory budget the writer's hash streams share (for the caller's: one bound for all). */
struct zck__shash_budget *zck_uv_writer_hash_budget(zck_uv_writer *w);

/* A raw file at rel of size bytes: *store (U8) receives its bytes, each byte written once.
 * With opts.hash it is hashed as written, its tensors' ranges being among regions (in file
 * order, back to back from 0; NULL: the whole file, one region). tensors (one allocation,
 * taken over in every case; NULL: none): the file's tensors as its manifest describes them
 * (zck__manifest_torch_tensors), so that the manifest does not parse it again. Committed
 * with the folder. */
zck_status zck_uv_writer_raw(zck_uv_writer *w, const char *rel, uint64_t size, const zck__manifest_known_range *regions,
                             size_t n_regions, zck__manifest_known_tensor *tensors, size_t n_tensors, zck_store *store);

/* Finishes every file (the pending tensor files, the raw files) in the temporary folder,
 * which is then complete but for what the caller adds (its manifest). */
zck_status zck_uv_writer_finish_files(zck_uv_writer *w);
const char *zck_uv_writer_tmp_dir(const zck_uv_writer *w);
/* With opts.hash, after zck_uv_writer_finish_files: the manifest hashes of the tensor files,
 * made as they were written (paths relative to the folder), for
 * zck__manifest_write_dir_known; files absent from it are hashed by reading them. */
const zck__manifest_known *zck_uv_writer_known(const zck_uv_writer *w);
/* Renames the folder into place, then writes latest_universal. On failure nothing of
 * the output remains. */
zck_status zck_uv_writer_commit(zck_uv_writer *w);
/* Removes an uncommitted output. NULL is fine. */
void zck_uv_writer_free(zck_uv_writer *w);

// ---- copying pickled objects with their tensors

/* A tensor of a source .pt carried into a new file: copy count elements from src to dst. */
typedef struct zck_uv_tensor_copy {
  zck_store src, dst;
  uint64_t count;
  size_t storage;             /* in the destination writer */
  uint64_t data_off;          /* where the storage's bytes lie in the destination file */
  uint32_t crc;               /* filled by the caller's executor run */
} zck_uv_tensor_copy;

typedef struct zck_uv_copies {
  zck_uv_tensor_copy *v;
  size_t n, cap;
  void **ctx;                 /* callback contexts (owned) */
  size_t n_ctx, cap_ctx;
} zck_uv_copies;

/* Deep-copies node (from the pickle of src) into tw's document. Every tensor met becomes
 * a new contiguous storage of tw (views and shared storages become separate storages;
 * the same tensor object stays one object) and a copy entry appended to *copies. Tensor
 * bytes are read from `data` (NULL: src's own source; non-contiguous tensors then need it). */
zck_status zck_uv_copy_tree(zck_torch_writer *tw, const zck_torch_file *src, const zck__source *data, const zck_pk *node,
                            zck_pk **out, zck_uv_copies *copies);
/* Runs the copies (one plan, the thread pool) and sets each storage's CRC. A job's, not the
 * format's: defined in jobs/to_universal.c. */
zck_status zck_uv_copies_run(zck_torch_writer *tw, zck_uv_copies *copies, const zck_exec_opts *eo);
void zck_uv_copies_free(zck_uv_copies *copies);

// ---- reader

typedef struct zck_uv_ckpt zck_uv_ckpt;

typedef struct zck_uv_info {
  const char *dir;            /* the universal folder */
  const char *root;           /* the folder holding a latest_universal that names dir (an HF
                                 checkpoint-N/ folder is one), or NULL */
  int stage;                  /* 1/2 (dict files) or 3 (bare tensors), from zero_stage */
  uint32_t world_size;        /* dp_world_size of the source */
  uint32_t tp_size;           /* mp_world_size: > 1 for an AutoTP source (its full tensors;
                                 the params' shapes are the affine map's logical shapes) */
  uint32_t ep_size;           /* > 0: a DeepSpeed AutoEP source (uv_autoep.c): its experts whole, DeepSpeed's names */
  zck_dtype lp_dtype;         /* the module's trainable params (as the DeepSpeed reader) */
  zck_dtype master_dtype;     /* dtype of the fp32 files */
  zck_dtype state_dtype;      /* dtype of exp_avg / exp_avg_sq; INVALID without them */
  bool has_optimizer_state;   /* exp_avg / exp_avg_sq (and step) for every trainable param */
  bool step_is_tensor;
  double step;
  int64_t global_steps, skipped_steps;
  int64_t step_ahead;         /* the model file's zckpt_step_ahead (0 if absent): step.pt is one ahead */
  int64_t global_samples;     /* -1 if absent */
  const char *ds_version;     /* NULL if absent */
  /* the source run's configuration, as the DeepSpeed reader derives it */
  size_t n_flat_groups;       /* param_shapes entries: flat groups (1/2) or sub-groups (3) */
  uint64_t sub_group_size;    /* ds_config zero_optimization.sub_group_size (default 1e9) */
  bool round_robin;           /* zero_optimization.round_robin_gradients */
  uint32_t param_align;       /* 1, or parameter_alignment's element multiple (stage 1/2) */
  double clip_grad;           /* stage 1/2 optimizer clip_grad, else ds_config gradient_clipping */
} zck_uv_info;

typedef enum zck_uv_part {
  ZCK_UV_FP32 = 0,            /* trainable params: zero/<param>/fp32.pt */
  ZCK_UV_EXP_AVG,
  ZCK_UV_EXP_AVG_SQ,
  ZCK_UV_FROZEN,              /* frozen params from the carried model-states files (lp dtype):
                                 stage 1 (and stage-2 files without fragments) the `module`
                                 tensors, whole; stage 2 frozen_param_fragments, whole; stage 3
                                 every rank file's frozen_param_fragments (zero3 layout, one
                                 sub-group per frozen param, store s*W + r) */
  ZCK_UV_PART_COUNT
} zck_uv_part;

typedef struct zck_uv_open_opts {
  zck_torch_open_opts torch;
  bool no_verify;              /* the state files' zip CRCs are not checked as they are read */
} zck_uv_open_opts;
#define ZCK_UV_OPEN_OPTS_INIT {ZCK_TORCH_OPEN_OPTS_INIT, false}

/* Opens path: the universal folder (it has zero/), or a folder holding latest_universal.
 * The manifest follows the DeepSpeed reader's rules (deepspeed.h) applied to the carried
 * model-states file: params in module order, tied aliases, frozen params, buffers, and
 * the optimizer groups of zero/optimizer_state.pt's param_groups; so a reshard from the
 * universal folder lays out exactly what a reshard from the original checkpoint does.
 * deepspeed.moe experts (uv_moe.c) and a PipelineModule's stages (uv_pipe.c) are laid out
 * as the DeepSpeed reader lays out those checkpoints.
 * Errors are one line naming the file (a latest_universal naming no folder, a state file
 * of the wrong form, shape or size; a group layout that does not add up; a param missing
 * one of its states). */
zck_status zck_uv_open(const char *path, const zck_uv_open_opts *o, zck_uv_ckpt **out);
void zck_uv_close(zck_uv_ckpt *c);
const zck_uv_info *zck_uv_info_of(const zck_uv_ckpt *c);
/* The jobs that write DeepSpeed files from a universal folder (reshard) refuse one of an AutoEP source (info.ep_size)
 * in one line naming the folder and `job`, as they refuse the AutoEP checkpoint itself, and one of a legacy
 * deepspeed.moe or a PipelineModule source (expert files, layer files: written from the DeepSpeed checkpoint only,
 * the folder carries neither); ZCK_OK for others. */
zck_status zck_uv_autoep_refuse(const zck_uv_ckpt *c, const char *job);
const zck_model *zck_uv_model(const zck_uv_ckpt *c);
/* FP32 / EXP_AVG / EXP_AVG_SQ: a whole-tensor layout over the manifest's params (one store
 * per trainable param with elements) and its stores, reading the tensors in place.
 * FROZEN: see zck_uv_part. NOT_FOUND for the optimizer states of a checkpoint without
 * them, or FROZEN without frozen params. Valid until close. */
zck_status zck_uv_get(const zck_uv_ckpt *c, zck_uv_part part, const zck_layout **layout, const zck_store **stores);
/* Buffers: a whole layout over the BUFFER index space and one store per buffer (the rank-0
 * model file's `module` tensor). NULL layout when there are none. */
void zck_uv_buffers(const zck_uv_ckpt *c, const zck_layout **layout, const zck_store **stores);
/* Pickled objects for writers that carry them over (NULL if absent): the rank-0 model
 * file's ds_config, lr_scheduler and `module` BUILD state ({'_metadata': ...}); the
 * loss_scaler of zero/optimizer_state.pt. */
const zck_pk *zck_uv_ds_config(const zck_uv_ckpt *c);
const zck_pk *zck_uv_lr_scheduler(const zck_uv_ckpt *c);
const zck_pk *zck_uv_module_attrs(const zck_uv_ckpt *c);
const zck_pk *zck_uv_loss_scaler(const zck_uv_ckpt *c);
/* tp_size > 1: the carried rank-0 model file's universal_checkpoint_info (its affine map
 * says how the AutoTP source's TP ranks cut the full tensors); else NULL. */
const zck_pk *zck_uv_autotp_info(const zck_uv_ckpt *c);
/* shared_params entries whose source was not saved (exclude_frozen_parameters; see
 * zck_ds_unsaved_tie): [2 * *n] alias, source pointers, valid until zck_uv_close. And
 * whether the stage-2/3 model file had frozen_param_shapes None (frozen params excluded). */
const char *const *zck_uv_unsaved_ties(const zck_uv_ckpt *c, size_t *n);
bool zck_uv_frozen_excluded(const zck_uv_ckpt *c);
/* zero_to_fp32's output recipe (deepspeed.h zck_ds_outputs) for the checkpoint the folder
 * was made from, built from its carried model-states file (uv_outputs.c): consolidating by
 * it through the parts above gives what consolidating that checkpoint gives. Valid until
 * zck_uv_close. */
struct zck_ds_output;
const struct zck_ds_output *zck_uv_outputs(const zck_uv_ckpt *c, size_t *n);

#endif
