/* deepspeed.h: DeepSpeed ZeRO checkpoint directories (stages 1-3; ZeRO-0 read), read and written.
 *
 * On disk (deepspeed-checkpoint.md §1-3):
 *   <root>/latest                      the tag, no newline
 *   <root>/<tag>/mp_rank_00_model_states.pt                    stages 1-2
 *   <root>/<tag>/zero_pp_rank_{r}_mp_rank_00_model_states.pt   stage 3, one per dp rank
 *   <root>/<tag>/[bf16_]zero_pp_rank_{r}_mp_rank_00_optim_states.pt   one per dp rank
 * Every file is a torch.save zip. The model file holds `module` (16-bit weights; stage-3
 * params are [0]-shaped placeholders), `param_shapes` (the flat order, per flat group or
 * sub-group: the only index into the fp32 data), frozen-param shapes and fragments,
 * `shared_params` (tied aliases), `buffer_names`, counters, `ds_config`, `ds_version`.
 * Each optimizer file holds this rank's fp32 master partition of every flat group
 * (`single_partition_of_fp32_groups`, stage 1/2, lean; `fp32_flat_groups`, stage 3) and the
 * torch optimizer state (exp_avg / exp_avg_sq per flat group, step, param_groups).
 *
 * Reader: zck_ds_open() DESCRIBES a checkpoint without touching tensor data: it parses
 * only the pickles (and reads the 4-byte `step` tensor), validates that the files agree
 * with each other and that the shapes add up to the partitions (one-line errors naming
 * the file, the group, rank and numbers), and exposes
 *   - a model manifest (lib/model.h): params in module.parameters() order with shapes,
 *     lp dtype, optimizer group, frozen flag and tied aliases; buffers; param groups with
 *     their hyper-parameters. Params DeepSpeed does not optimize are frozen: requires_grad
 *     False, and also numel-0 params (stage 2/3 list those in frozen_param_shapes);
 *   - "parts": a layout (lib/layout.h) over the manifest's param index space plus one
 *     store (lib/exec.h) per layout store, bound in place to the tensor's bytes inside its
 *     .pt file (absolute offset, dtype). A consumer plans (plan.h) and executes (exec.h).
 *   - the zero_to_fp32 output recipe (zck_ds_outputs) so a consolidation reproduces
 *     DeepSpeed 0.19's zero_to_fp32 bit for bit.
 * Writer: zck_ds_writer_create() lays out every file DeepSpeed would write for a stage /
 * world size, reserving each tensor's bytes; the caller fills them through the writer's
 * parts (callback stores, any thread), then zck_ds_writer_commit() finishes the files,
 * renames the tag folder into place and writes `latest` last, atomically.
 * zck_ds_state() and zck_ds_writer_state() give both as state views (lib/state.h): the
 * copy between them is lib/transfer's, not this format's.
 */
#ifndef ZCK_DEEPSPEED_H
#define ZCK_DEEPSPEED_H

#include "exec.h"
#include "layout.h"
#include "model.h"
#include "state.h"
#include "torch/torch.h"

#include <stdbool.h>

/* ---- reader */

typedef struct zck_ds_ckpt zck_ds_ckpt;

typedef struct zck_ds_open_opts {
  const char *tag;                 /* NULL: the tag named by <path>/latest */
  bool require_optimizer_state;    /* fail (DS-48) when exp_avg / exp_avg_sq are absent */
  zck_torch_open_opts torch;       /* limits for every .pt file */
  unsigned threads;                /* stage-3 model files read at once; 0: zck__default_threads() */
  bool autoep_ds_names;            /* AutoEP: keep DeepSpeed's own names (experts.w1 / w2 / w3 at their full shape,
                                      router.gate.weight) for the jobs that write DeepSpeed's files again; false:
                                      the HF model's (gate_up_proj), what consolidate writes */
} zck_ds_open_opts;
#define ZCK_DS_OPEN_OPTS_INIT {NULL, false, ZCK_TORCH_OPEN_OPTS_INIT, 0, false}

/* What a checkpoint is; fixed after open. Strings belong to the checkpoint. */
typedef struct zck_ds_info {
  const char *root;                /* folder holding `latest` (or the tag folder's parent) */
  const char *tag;
  const char *dir;                 /* <root>/<tag> */
  int stage;                       /* 1, 2 or 3 (zero_stage of the optimizer files; 1 for BF16_Optimizer);
                                      0: ZeRO-0, no optimizer files (ds_zero0.c): the model file's `optimizer`
                                      holds the state, the train layout is whole tensors */
  bool bf16_optimizer;             /* written by BF16_Optimizer (bf16 + stage 1 + fp32 grad accumulation):
                                      no zero_stage, fp32 partitions saved padded; otherwise a stage-1 layout */
  uint32_t world_size;             /* W = partition_count = number of optimizer files */
  bool bf16_prefix;                /* optimizer files are bf16_zero_pp_rank_* */
  zck_dtype lp_dtype;              /* 16-bit training dtype (module params); F32 without mixed precision */
  zck_dtype master_dtype;          /* dtype of the fp32 partitions (F32 unless bf16 master weights) */
  zck_dtype state_dtype;           /* exp_avg / exp_avg_sq dtype; INVALID without optimizer state */
  const char *ds_version;          /* NULL if absent (warned) */
  int64_t global_steps, skipped_steps;
  int64_t global_samples;          /* -1 if absent */
  int64_t dp_world_size;           /* from the model file (== world_size) */
  size_t n_flat_groups;            /* stage 1/2: optimizer groups; stage 3: sub-groups */
  uint64_t sub_group_size;         /* ds_config zero_optimization.sub_group_size (default 1e9) */
  bool round_robin;                /* ds_config zero_optimization.round_robin_gradients */
  uint32_t param_align;            /* 1, or parameter_alignment's element multiple (stage 1/2) */
  bool has_optimizer_state;        /* exp_avg and exp_avg_sq exist for every flat group */
  bool step_is_tensor;             /* torch Adam/AdamW (0-dim float32) vs FusedAdam/CPUAdam (int) */
  double step;                     /* the optimizer step of flat group 0 (0 without state) */
  int64_t step_ahead;              /* step - (global_steps - skipped_steps): 1 for FP16_UnfusedOptimizer
                                      (ZeRO-0 bf16, which steps once when built) and reshards of it
                                      (model files' zckpt_step_ahead), else 0 */
  double clip_grad;                /* stage 1/2 clip_grad, else ds_config gradient_clipping, else 0 */
  bool has_frozen_shapes;          /* frozen_param_shapes saved (stage 2/3, not excluded) */
  bool has_shared_params;          /* shared_params present (files >= v0.9.0) */
  size_t n_warnings;               /* DS-24, DS-27, DS-28, ...: continue-and-report items */
  const char *const *warnings;
  /* AutoTP (ds_autotp.c): tp_size > 1 when the folder holds one ZeRO checkpoint per
   * tensor-parallel rank (mp_rank_XX). world_size and the files above are then those of
   * each TP rank (the data-parallel group); the manifest holds the full tensors, merged by
   * the universal_checkpoint_info affine map DeepSpeed saved. */
  uint32_t tp_size;
  /* AutoEP (ds_autoep.c): ep_size > 1 for an expert-parallel MoE checkpoint (ep_size x expert-data-parallel size =
   * world_size);
   * the manifest then holds the HF model's names and full expert tensors (gate_up_proj from w1 / w3). 0: none */
  uint32_t ep_size;
} zck_ds_info;

/* Opens and validates the checkpoint at path: a save root with `latest` (an HF
 * checkpoint-N/ folder is one), or a tag folder. opts may be NULL. Errors are one line,
 * "FILE: what is wrong". */
zck_status zck_ds_open(const char *path, const zck_ds_open_opts *opts, zck_ds_ckpt **out);
void zck_ds_close(zck_ds_ckpt *c);

const zck_ds_info *zck_ds_info_of(const zck_ds_ckpt *c);

/* The dp rank a DeepSpeed per-rank name states ("[bf16_]zero_pp_rank_R_mp_rank_..."), or -1
 * when name[0..len) holds no such pattern. Used on file names and on the archive folder
 * torch.save records inside a .pt (the file's stem when it was saved): a rank file whose
 * archive names another rank is a copy of that rank's file. */
long zck_ds_name_rank(const char *name, size_t len);
/* The mp (tensor-parallel) rank a DeepSpeed name states ("..mp_rank_XX.."), or -1. */
long zck_ds_name_mp(const char *name, size_t len);
const zck_model *zck_ds_model(const zck_ds_ckpt *c);

/* Parts of a checkpoint (and of a writer's output), each a layout over the manifest's
 * param index space with stores[layout->n_stores]. */
typedef enum zck_ds_part {
  ZCK_DS_FP32 = 0,     /* trainable params, fp32 master: ZeRO layout (zero12 / zero3), stores =
                          flat group g of rank r (id g*W + r); a store's numel is what the file
                          holds (stage 1/2: lean length; stage 3: L_s) */
  ZCK_DS_EXP_AVG,      /* same layout; stores = the padded state tensors (P / L_s) */
  ZCK_DS_EXP_AVG_SQ,
  ZCK_DS_LP,           /* 16-bit module weights, whole tensors (zck_layout_whole, one store per
                          owner param): stage 1/2 only (stage-3 module entries are empty) */
  ZCK_DS_FROZEN,       /* frozen params: stage 1 `module` tensors, stage 2 frozen_param_fragments
                          (whole tensors), stage 3 frozen_param_fragments per rank (zero3 layout,
                          one sub-group per frozen param, store s*W + r); lp dtype */
  ZCK_DS_PART_COUNT
} zck_ds_part;

typedef struct zck_ds_view {
  const zck_layout *layout;
  const zck_store *stores;
} zck_ds_view;

/* The part, or ZCK_ERR_NOT_FOUND (message says why: no optimizer state, no frozen
 * params, stage 3 has no LP, ...). The view stays valid until zck_ds_close. */
zck_status zck_ds_get(const zck_ds_ckpt *c, zck_ds_part part, zck_ds_view *out);

/* Buffers: a whole layout over the BUFFER index space (model->buffers) and one store per
 * buffer, bound to the rank-0 model file's `module` tensor (module dtype). NULL layout
 * when there are no buffers. */
zck_ds_view zck_ds_buffers(const zck_ds_ckpt *c);

/* ---- the zero_to_fp32 recipe
 * get_fp32_state_dict_from_zero_checkpoint (DeepSpeed 0.19.8) builds, in this order:
 *   1. buffers: every `module` entry named in buffer_names, in module order; floating
 *      buffers become float32 (`v.float() if v.is_floating_point() else v`: integer and
 *      bool buffers keep their dtype; the spec's "every buffer" is true of older versions);
 *   2. frozen params, in frozen_param_shapes order, in the lp dtype (not cast). Stage 1
 *      never saves frozen_param_shapes, so stage-1 frozen params are NOT in the output;
 *   3. trainable params in param_shapes order (flat groups / sub-groups concatenated),
 *      master dtype (float32);
 *   4. tied aliases from shared_params, in its order, only when the source name is in the
 *      output; the alias is the same tensor object as its source.
 * Each entry names where its values come from; consolidate copies them through the parts
 * above and converts to `dtype`. */
typedef enum zck_ds_out_kind {
  ZCK_DS_OUT_BUFFER = 0,   /* index = buffer index; source: zck_ds_buffers */
  ZCK_DS_OUT_FROZEN,       /* index = param index; source: ZCK_DS_FROZEN */
  ZCK_DS_OUT_TRAINABLE,    /* index = param index; source: ZCK_DS_FP32 */
  ZCK_DS_OUT_ALIAS         /* index = param index of the alias (UINT32_MAX if module lacks it);
                              alias_of = the output entry it shares its tensor with */
} zck_ds_out_kind;

typedef struct zck_ds_output {
  const char *name;
  zck_ds_out_kind kind;
  uint32_t index;
  int32_t alias_of;        /* ALIAS: index into the outputs array of the source; else -1 */
  zck_dtype dtype;         /* the dtype zero_to_fp32 gives the tensor */
  zck_dtype src_dtype;     /* the dtype stored in the checkpoint */
  int ndim;
  const int64_t *shape;
  uint64_t numel;
} zck_ds_output;

const zck_ds_output *zck_ds_outputs(const zck_ds_ckpt *c, size_t *n);
/* The recipe's last step, for every reader that builds it: appends to out[0..*n) the
 * shared_params entries alias[i] -> source[i] (NULL entries skipped) whose source is an
 * output, as ALIAS outputs (a repeated alias replaces its earlier output). out has room for
 * n_shared more. */
zck_status zck_ds_outputs_add_aliases(zck_ds_output *out, size_t *n, const char *const *alias,
                                      const char *const *source, size_t n_shared, const zck_model *m);

/* shared_params entries whose source was not saved: checkpoints saved with
 * exclude_frozen_parameters (HF Trainer + PEFT/LoRA) keep `lm_head.weight ->
 * transformer.wte.weight` though neither weight is in the files. Such an alias is no
 * parameter of the manifest (zero_to_fp32 drops it, ds_to_universal converts the rest);
 * inspect reports it, consolidate records it in the output's metadata and a reshard keeps
 * it in shared_params. i < zck_ds_unsaved_tie_count; strings belong to the checkpoint. */
size_t zck_ds_unsaved_tie_count(const zck_ds_ckpt *c);
void zck_ds_unsaved_tie(const zck_ds_ckpt *c, size_t i, const char **alias, const char **source);

/* Pickled objects of the rank-0 files, for writers that carry them over (NULL if absent). */
const zck_pk *zck_ds_ds_config(const zck_ds_ckpt *c);     /* model file ds_config */
const zck_pk *zck_ds_lr_scheduler(const zck_ds_ckpt *c);  /* model file lr_scheduler (may be None) */
const zck_pk *zck_ds_loss_scaler(const zck_ds_ckpt *c);   /* optimizer file loss_scaler */
const zck_pk *zck_ds_client_state(const zck_ds_ckpt *c);  /* the model file's root dict */

/* The source's files, for jobs that carry some of them over unparsed or re-pickle rank 0's
 * objects (to-universal). Everything stays valid (and open) until zck_ds_close. */
typedef struct zck_ds_file {
  const char *name;                /* file name inside the tag folder */
  const char *path;                /* <dir>/<name> */
  uint64_t size;                   /* bytes, when the folder was scanned */
} zck_ds_file;

/* The model-states files: 1 (stage 1/2: mp_rank_00_model_states.pt) or W (stage 3:
 * zero_pp_rank_<r>_mp_rank_00_model_states.pt, by rank), times the TP ranks of an AutoTP
 * checkpoint (mp rank 0's first). i < zck_ds_model_file_count. */
size_t zck_ds_model_file_count(const zck_ds_ckpt *c);
/* AutoTP: whether param p is a vocabulary-parallel tensor (universal_checkpoint_info's
 * vocabulary_parameter_patterns: ds_to_universal marks its files 'vocab_tensor'). */
bool zck_ds_autotp_vocab(const zck_ds_ckpt *c, uint32_t p);
/* The literal name of a pattern DeepSpeed wrote with "^" + re.escape(name) + "$" (its
 * universal_checkpoint_info names params so), or NULL; out has room for strlen(pat) + 1. */
const char *zck_ds_pattern_name(const char *pat, char *out);
/* AutoTP as a reshard target at the source's TP size T (uci: the source's
 * universal_checkpoint_info, whose affine map says how TP rank t's shards cut the full
 * tensors of `full`): TP rank t's files are a ZeRO checkpoint of the model with t's shard
 * shapes (zck_ds_autotp_shard_model: a copy of full with each param's shard_shape);
 * zck_ds_autotp_target moves a layout over those shapes (a writer's) onto the full shapes,
 * every piece t holds included (replicated params are written on every rank), so one
 * transfer from the full source fills it. zck_ds_autotp_info: c's universal_checkpoint_info
 * (NULL if not AutoTP), which every TP rank's model file carries. */
zck_status zck_ds_autotp_shard_model(const zck_pk *uci, const zck_model *full, uint32_t t, zck_model **out);
zck_status zck_ds_autotp_target(const zck_pk *uci, const zck_model *full, uint32_t T, uint32_t t, const zck_layout *shard,
                             zck_layout **out);
const zck_pk *zck_ds_autotp_info(const zck_ds_ckpt *c);
/* The reverse, for a reader holding every TP rank's shards of some params: ls[t] lays TP
 * rank t's shards of `params` (t's shard shapes); the result lays the full params over
 * all of them, each piece read from the first rank that holds it (as
 * ParamAffineMap.rebuild keeps the first copy), rank t's stores numbered after the earlier
 * ranks' (concatenated in rank order). */
zck_status zck_ds_autotp_merge(const zck_pk *uci, const zck_model *full, uint32_t T, const uint32_t *params, size_t n,
                               const zck_layout *const *ls, zck_layout **out);
/* DeepSpeed 0.19.8's AutoTP split of `full` at TP size T (ds_autotp_plan.c): the
 * universal_checkpoint_info its engine would save there (what zck_ds_autotp_shard_model /
 * zck_ds_autotp_target take), from the source's own record (src_uci, src_tp; NULL for a
 * checkpoint without one: then the Llama plan) and the model config (config_path: a
 * config.json) and ds_config's tensor_parallel section; out->ds_config is ds_config with
 * tensor_parallel.autotp_size = T (NULL when ds_config is). Refuses, one line, what it does
 * not know exactly. */
typedef struct zck_ds_autotp_plan_in {
  const zck_model *full;
  const zck_pk *src_uci;
  uint32_t src_tp;
  const char *config_path;
  const char *config_label;   /* how messages name it (NULL: config_path) */
  const zck_pk *ds_config;
} zck_ds_autotp_plan_in;
typedef struct zck_ds_autotp_plan_out {
  zck_pk_doc *doc;             /* owns the nodes below */
  const zck_pk *uci, *ds_config;
} zck_ds_autotp_plan_out;
zck_status zck_ds_autotp_plan(const zck_ds_autotp_plan_in *in, uint32_t T, zck_ds_autotp_plan_out *out);
void zck_ds_autotp_plan_free(zck_ds_autotp_plan_out *p);
zck_ds_file zck_ds_model_file(const zck_ds_ckpt *c, size_t i);
/* AutoEP at stage 1/2 (ds_autoep.c): every expert file's weights are the module copy (round to nearest even) of
 * their fp32 masters, as DeepSpeed writes them after each step: ZCK_ERR_DAMAGED naming a file of another save.
 * Reads all expert weights; ZCK_OK for other checkpoints. */
zck_status zck_ds_autoep_check_experts(const zck_ds_ckpt *c);
/* The one rule of the jobs that write a checkpoint again but not AutoEP's layout (reshard, DCP, to-universal's HDF5):
 * they refuse an AutoEP checkpoint (one line naming the folder and `job`) until they write AutoEP's files.
 * ZCK_OK for other checkpoints. */
zck_status zck_ds_autoep_refuse(const zck_ds_ckpt *c, const char *job);
/* AutoEP opened with autoep_ds_names: whether name is an expert weight (<prefix>.w1 / w2 / w3, [experts, ...]). */
bool zck_ds_autoep_is_expert(const zck_ds_ckpt *c, const char *name);
/* The same for a legacy deepspeed.moe.layer.MoE checkpoint (ds_moe.c), for the jobs that do not write its expert
 * files (reshard into DeepSpeed files does: zck_ds_moe_target_new). */
zck_status zck_ds_moe_refuse(const zck_ds_ckpt *c, const char *job);
/* The same for deepspeed.moe with expert parallelism (ep_size > 1), for the jobs that DeepSpeed's own tools do not
 * run on it (to-universal: ds_to_universal.py fails on it). */
zck_status zck_ds_moe_ep_refuse(const zck_ds_ckpt *c, const char *job);
/* reshard of a deepspeed.moe checkpoint keeps its EP size: ZCK_OK for ep_size 0 (not asked), the source's, or another
 * kind of checkpoint; else refused in one line. */
zck_status zck_ds_moe_keep_ep(const zck_ds_ckpt *c, uint32_t ep_size);
/* Rank 0's model-states and optimizer files as torch files: their pickles, and their
 * tensors' bytes through zck_torch_source() / zck_torch_tensor_read(). */
const zck_torch_file *zck_ds_rank0_model(const zck_ds_ckpt *c);
const zck_torch_file *zck_ds_rank0_optim(const zck_ds_ckpt *c);
/* A PipelineModule checkpoint (ds_pipe.c) holds one such optimizer file per stage, stage s's flat groups numbered
 * from *first_group on: stage s's rank-0 optimizer file, NULL past the last stage (stage 0 is zck_ds_rank0_optim's,
 * the only one of other checkpoints). */
const zck_torch_file *zck_ds_stage_optim(const zck_ds_ckpt *c, uint32_t stage, size_t *first_group);
/* Pipeline stages (mp_rank_<stage> file sets of a PipelineModule checkpoint); 1 for any other checkpoint. */
uint32_t zck_ds_pipe_stages(const zck_ds_ckpt *c);
/* The jobs that cannot write a pipeline's layout (reshard into DCP) refuse a pipeline source by name. */
zck_status zck_ds_pipe_refuse(const zck_ds_ckpt *c, const char *job);
/* reshard of a pipeline at another data-parallel size (jobs/reshard_pipe.c): stage s's model as its stage files
 * describe it (its param_shapes' params with their optimizer groups: the copies of TiedLayerSpec weights an earlier
 * stage holds first, then its own params in c's model order), stage param j being c's param (*src_of)[j] (the
 * caller frees it); refused by name when a stage's params do not fit that (frozen params, aliases). */
zck_status zck_ds_pipe_stage_model(const zck_ds_ckpt *c, uint32_t s, zck_model **out, uint32_t **src_of);
/* The layer_<XX>-model_states.pt files (which a data-parallel size does not change): how many, and file i's path. */
size_t zck_ds_pipe_layer_files(const zck_ds_ckpt *c);
const char *zck_ds_pipe_layer_file(const zck_ds_ckpt *c, size_t i);
/* verify: a pipeline's layer files hold the module copies of this save's fp32 masters (ds_pipe_check.c). */
zck_status zck_ds_pipe_check_layers(const zck_ds_ckpt *c);

/* The tag folder's zckpt-manifest.json as the reader parsed it at open (lib/manifest.h;
 * its tensor XXH3s are already attached to the stores), or NULL when it has none or it
 * does not parse. Valid until zck_ds_close. */
struct zck_manifest;
const struct zck_manifest *zck_ds_manifest(const zck_ds_ckpt *c);
/* zck_manifest_check_complete of the tag folder over the manifest parsed at open (not
 * read again): ZCK_OK, or ZCK_ERR_DAMAGED naming the incomplete or resized file. */
zck_status zck_ds_check_complete(const zck_ds_ckpt *c, int force);

/* ---- writer */

typedef struct zck_ds_writer zck_ds_writer;

typedef struct zck_ds_write_opts {
  int stage;                       /* 1, 2 or 3 */
  uint32_t world_size;             /* W >= 1 */
  uint64_t sub_group_size;         /* stage 3; 0: DeepSpeed's default 1e9 */
  zck_dtype lp_dtype;              /* BF16 (bf16_ prefix), F16 or F32; INVALID: the manifest's */
  bool round_robin;                /* zero_optimization.round_robin_gradients (stage 1/2; ignored for 3) */
  uint32_t param_align;            /* zero_optimization.parameter_alignment: 0/1 off, > 1 on (the
                                      multiple is then 16 / gcd(16, lp size)); stage 1/2 only */
  const char *tag;                 /* NULL: "global_step<global_steps>" */
  bool overwrite;                  /* replace an existing <root>/<tag> */
  bool save_latest;                /* write <root>/latest (last, atomically) */
  int64_t global_steps, skipped_steps;
  int64_t global_samples;          /* -1: omit */
  bool has_optimizer_state;        /* write exp_avg / exp_avg_sq / step; false: state {} */
  bool step_is_tensor;             /* true: 0-dim float32 tensor (torch Adam); false: int */
  double step;
  double clip_grad;
  const char *ds_version;          /* NULL: "0.19.8" */
  const zck_pk *ds_config;         /* deep-copied (zero_optimization.stage / sub_group_size /
                                      bf16.enabled updated); NULL: a minimal config */
  const zck_pk *lr_scheduler;      /* deep-copied; NULL: None */
  const zck_pk *loss_scaler;       /* deep-copied; NULL: LossScaler(cur_scale=1.0, dynamic=False) */
  const zck_pk *module_attrs;      /* deep-copied BUILD state of `module` ({'_metadata': ...}); NULL: none */
  const char *const *unsaved_ties; /* [2 * n]: alias, source pairs added to shared_params as they are
                                      (tied aliases whose source was not saved: zck_ds_unsaved_tie) */
  size_t n_unsaved_ties;
  int64_t step_ahead;              /* info.step_ahead: > 0 is written as every model file's zckpt_step_ahead
                                      (DeepSpeed hands it back in client_state, harmlessly) */
  bool exclude_frozen;             /* saved with exclude_frozen_parameters: with no frozen params, stage 2/3
                                      files get frozen_param_shapes / _fragments None, not {} (DeepSpeed's
                                      load copies every frozen param of the live model from a dict) */
  /* AutoTP (tp_size > 1): this writer makes TP rank mp_rank's files (mp_rank_0t names,
   * mp_world_size and tp_degree tp_size, tp_info carried as universal_checkpoint_info;
   * shared_params on mp rank 0 only, as DeepSpeed saves them). 0/1: plain ZeRO */
  uint32_t mp_rank, tp_size;
  const zck_pk *tp_info;
  unsigned threads;                /* files whose pickles are built at once; 0: zck__default_threads() */
  /* NVMe offload (stage 3, ds_write_offload.c): the sub-groups DeepSpeed swaps at this world size
   * go to <tag>/offloaded_tensors/rank<RR>/ swap files, their optim-file tensors empty */
  bool nvme_offload;
  uint64_t swap_min_bytes;         /* a sub-group swaps when its fp32 partition has this many bytes */
  uint64_t swap_unsure_lo, swap_unsure_hi; /* partitions of more than lo and less than hi bytes: whether
                                      DeepSpeed swaps them is not known (refused); 0, 0: none */
  uint64_t swap_align_bytes;       /* swap files are padded to a multiple of it (aligned swap buffers) */
  const int64_t *swap_ds_ids;      /* [n_params]: DeepSpeed's ds_id of each param (names the files) */
  /* AutoEP (ds_autoep_write.c): the experts as DeepSpeed's AutoEP engine saves them at another EP size
   * (zck_ds_autoep_target_new; the manifest under DeepSpeed's names). NULL: plain ZeRO */
  const struct zck_ds_autoep_target *autoep;
  /* legacy deepspeed.moe (ds_moe_write.c): the experts' 16-bit weights in layer_<L>_expert_<E> files, as
   * DeepSpeed's _save_moe_checkpoint writes them, at the source's EP size (zck_ds_moe_target_new). NULL: none */
  const struct zck_ds_moe_target *moe;
  /* PipelineModule (pp_size > 1, stage 1): this writer makes pipeline stage mp_rank's files (mp_rank_<stage> names,
   * `module` None, mp_world_size and pp_degree pp_size) as PipelineEngine saves them; the layer_<XX> files, which
   * hold the weights, are the caller's. Rank 0 leads, the others join it, as for AutoTP. 0/1: no pipeline */
  uint32_t pp_size;
} zck_ds_write_opts;
#define ZCK_DS_WRITE_OPTS_INIT {0, 0, 0, ZCK_DTYPE_INVALID, false, 1, NULL, false, true, 0, 0, -1, \
                                true, true, 0.0, 0.0, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, false, 0, 0, NULL, 0, false, 0, 0, 0, 0, \
                                NULL, NULL, NULL, 0}

/* An AutoEP target for a writer (zck_ds_write_opts.autoep): c's experts (c opened with autoep_ds_names) at EP size
 * ep_size over `world` ranks at ZeRO `stage`, as DeepSpeed 0.19.8's AutoEP engine saves them: the experts' optimizer
 * group partitioned over world / ep_size expert-data-parallel ranks, each expert's 16-bit weights in its own
 * layer_<L>_expert_<E> file, ds_autoep_layers for the new placement. What DeepSpeed or this writer cannot take is
 * refused in one line naming c. Borrows from c, which must outlive it. */
typedef struct zck_ds_autoep_target zck_ds_autoep_target;
zck_status zck_ds_autoep_target_new(const zck_ds_ckpt *c, uint32_t ep_size, int stage, uint32_t world,
                                    zck_ds_autoep_target **out);
void zck_ds_autoep_target_free(zck_ds_autoep_target *t);

/* A legacy deepspeed.moe.layer.MoE target (zck_ds_write_opts.moe): c's experts written at ZeRO `stage` 1 or 2 and
 * any world size (a multiple of c's EP size) as DeepSpeed 0.19.8 saves them: the experts' param group partitioned
 * over every rank (ep_size 1) or each EP rank's over its expert-data-parallel ranks (ds_moe_write.c), each (MoE layer, expert)'s 16-bit weights in its layer_<L>_expert_<E> file, `module` without
 * them. Other stages are refused in one line naming c. *out NULL (ZCK_OK) for other checkpoints. Borrows from c,
 * which must outlive it. */
typedef struct zck_ds_moe_target zck_ds_moe_target;
zck_status zck_ds_moe_target_new(const zck_ds_ckpt *c, int stage, zck_ds_moe_target **out);
void zck_ds_moe_target_free(zck_ds_moe_target *t);

/* Fills write options that reproduce c's configuration (stage, W, dtype, tag, counters,
 * step, scheduler, ds_config, ...). The pointers borrow from c. */
void zck_ds_write_opts_from(const zck_ds_ckpt *c, zck_ds_write_opts *o);
/* Whether c's optimizer was swapped to NVMe (offloaded_tensors/ beside a ZeRO-3 checkpoint). */
bool zck_ds_nvme_offloaded(const zck_ds_ckpt *c);
/* Sets o's NVMe-offload fields to write c's state as DeepSpeed with c's NVMe config swaps it
 * (ds_offload.c): c's ds_id numbering, its aio alignment, and, unless o->swap_min_bytes is set,
 * the smallest swapped size consistent with what c swapped (DeepSpeed's max(1 MiB,
 * aio.block_size) when that is). The ids live as long as c. */
zck_status zck_ds_nvme_target(zck_ds_ckpt *c, zck_ds_write_opts *o);

/* Frees rank 0's model-states pickle (at 100k params ~100 MB of objects, mostly
 * param_shapes) before a writer is made from o (zck_ds_write_opts_from(c, o)): what o
 * borrows of it (ds_config, lr_scheduler, module attrs) is copied first into a small doc c
 * owns, and o and c point there. The stores read the file through its own source, so the
 * copy needs nothing else of it. An object that cannot be copied (it holds a tensor) keeps
 * the pickle, for the writer to refuse as before. */
zck_status zck_ds_drop_model_pickle(zck_ds_ckpt *c, zck_ds_write_opts *o);

/* Creates <root>/<tag> under a temporary name with every file reserved. m must outlive
 * the writer. Fails with ZCK_ERR_EXISTS if the tag folder exists (unless overwrite).
 * The files follow DeepSpeed 0.19.8 (key order included) with these choices: one storage
 * per tensor (DeepSpeed saves views of its flat buffers); `module` lists the params (in
 * manifest order, aliases as views of their source's storage) then the buffers; stage-3
 * placeholders share one empty storage; no zero_to_fp32.py is copied to the root. */
zck_status zck_ds_writer_create(const char *root, const zck_model *m, const zck_ds_write_opts *o,
                                zck_ds_writer **out);

/* A writer of one rank's files alone, for checkpoints where each process writes its own:
 * rank r's optimizer states, its stage-3 model states and, for r = 0, the stage-1/2 model
 * states; each byte for byte what zck_ds_writer_create writes for it. The files are
 * created straight in <root>/<tag>, which must exist (no temporary tag folder; no
 * `latest`: o->save_latest and o->overwrite are ignored); the commit finishes each (temp
 * file, fsync, rename). Parts and buffers keep the whole checkpoint's layouts; the stores
 * of other ranks' files are left unbound, so a plan that writes one fails with an error
 * (restrict the source to rank r: zck_layout_restrict_rank; zck_ds_writer_state leaves out
 * what the rank does not build). Not for zck_ds_copy. */
zck_status zck__ds_writer_create_rank(const char *root, const zck_model *m, const zck_ds_write_opts *o, uint32_t rank,
                                      zck_ds_writer **out);

/* A writer of one more TP rank's files (o->mp_rank > 0) into lead's temporary tag folder:
 * every dp rank's files, each finished on this writer's commit, which must come before
 * lead's (lead renames the folder into place and writes `latest`). lead outlives it. */
zck_status zck__ds_writer_create_joined(const zck_ds_writer *lead, const zck_model *m, const zck_ds_write_opts *o,
                                        zck_ds_writer **out);

/* Target parts (same meaning as zck_ds_get; stores are write callbacks that pwrite into
 * the reserved regions, from any thread, and record a CRC-32 per written range so the zip
 * entries' CRCs are assembled at commit without reading anything back; ranges of one store
 * must not overlap; elements nobody writes stay zero). ZCK_DS_LP: stage 1/2 module tensors of every
 * owner param (frozen ones included; stage-2 frozen_param_fragments share their storage).
 * ZCK_DS_FROZEN: stage 3 only (frozen_param_fragments per rank). Absent parts:
 * ZCK_ERR_NOT_FOUND. */
zck_status zck_ds_writer_get(const zck_ds_writer *w, zck_ds_part part, zck_ds_view *out);
/* Buffers of model file `rank` (stage 1/2: rank 0 only; stage 3: every rank holds all). */
zck_ds_view zck_ds_writer_buffers(const zck_ds_writer *w, uint32_t rank);
/* Number of model files (1, or W for stage 3). */
uint32_t zck_ds_writer_model_files(const zck_ds_writer *w);

/* Finishes every file, renames the tag folder into place, then writes `latest`. */
zck_status zck_ds_writer_commit(zck_ds_writer *w);
/* Frees; an uncommitted output is removed. NULL is fine. */
void zck_ds_writer_free(zck_ds_writer *w);

/* ---- state views (lib/state.h), valid while c / w are */

/* The checkpoint as a transfer source: fp32, exp_avg / exp_avg_sq (with optimizer state),
 * frozen params, buffers; no LP part (16-bit weights are cast from fp32). */
void zck_ds_state(const zck_ds_ckpt *c, zck_state_view *out);
/* The writer's reserved target: its parts and every model file's buffers (a rank-only
 * writer: its own files' only). With inline hashing it asks to be written in target order
 * and starts its hash streams once the plans are known. */
void zck_ds_writer_state(zck_ds_writer *w, zck_state_view *out);

/* Reshard: c into w through lib/transfer (zck_ds_state -> zck_ds_writer_state), sets the
 * CRCs. The manifest w was created with must be c's (same param indices). Defined with the
 * jobs (jobs/reshard.c), declared here for the callers that had it from this header. */
zck_status zck_ds_copy(const zck_ds_ckpt *c, zck_ds_writer *w, const zck_exec_opts *opts);

#endif
