/* ds_internal.h: what the DeepSpeed reader and writer share inside formats/deepspeed. */
#ifndef ZCK_DS_INTERNAL_H
#define ZCK_DS_INTERNAL_H

#include "deepspeed/deepspeed.h"
#include "deepspeed/ds_files.h"
#include "deepspeed/ds_manifest.h"
#include "strmap.h"

/* DeepSpeed's defaults (runtime/zero/config.py). */
#define ZCK__DS_DEFAULT_SUB_GROUP_SIZE ((uint64_t)1000000000)
#define ZCK__DS_DEFAULT_VERSION "0.19.8"

/* A tensor found in a pickle, copied out of the torch file so the file can be closed. */
typedef struct zck__ds_tref {
  zck_dtype dtype;
  int ndim;
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t numel;
  uint64_t offset;       /* absolute byte offset of element 0 in the file */
  bool contiguous;
  /* its storage's zip record, checked on read (exec.h zck_record_check) */
  bool has_record;
  uint64_t rec_off, rec_size;
  uint32_t rec_crc;
  char rec_key[24];      /* the storage key: record <archive>/data/<key> */
} zck__ds_tref;

/* What we keep of one model-states file. */
typedef struct zck__ds_model_file {
  const zck__ds_rankfile *file;
  zck__source src;                 /* kept open: frozen fragments / buffers are read through it */
  bool src_open;
  /* module, in order */
  char **module_names;
  zck__ds_tref *module_t;
  size_t n_module;
  char **buffer_names;
  size_t n_buffer_names;
  zck__ds_shape_list *param_shapes; /* one list per flat group / sub-group */
  size_t n_param_shapes;
  bool has_frozen_shapes;
  zck__ds_shape_list frozen_shapes;
  bool has_frozen_frags;
  char **frag_names;
  zck__ds_tref *frag_t;
  size_t n_frags;
  zck__strmap frag_map;            /* frag_names -> index (first of a name) */
  bool has_shared;
  char **shared_alias, **shared_src;
  size_t n_shared;
  int64_t dp_world_size, mp_world_size, global_steps, skipped_steps, global_samples;
  int64_t step_ahead;              /* zckpt_step_ahead (0 if absent): see ds_open.c check_steps */
  char *ds_version;
  char **warnings;                 /* raised while reading it (files are read on several threads): */
  size_t n_warnings;               /* the reader takes them in file order (zck__ds_take_warnings) */
  struct zck__ds_autoep_file *autoep;  /* its ds_autoep_layers (ds_autoep.c), NULL: none */
  const zck__source **module_src;  /* PipelineModule (ds_pipe.c): [n_module] the layer file holding each entry */
  const char **module_path;        /* and its path; NULL: every entry lies in src */
} zck__ds_model_file;

/* Where module entry i of mf lies (a pipeline's layer file, or the model file itself). */
static inline const zck__source *zck__ds_module_src(const zck__ds_model_file *mf, size_t i) {
  return mf->module_src ? mf->module_src[i] : &mf->src;
}
static inline const char *zck__ds_module_path(const zck__ds_model_file *mf, size_t i) {
  return mf->module_path ? mf->module_path[i] : mf->file->path;
}

/* One flat group's tensors in an optimizer file. */
typedef struct zck__ds_flat {
  zck__ds_tref fp32;
  bool has_state;
  zck__ds_tref exp_avg, exp_avg_sq;
  bool has_step;                   /* the state's `step` (int, float or 0-dim tensor) */
  double step;
  const zck__source *src;          /* PipelineModule (ds_pipe.c): the stage's file it lies in; NULL: its optim file */
  const char *path;
} zck__ds_flat;

typedef struct zck__ds_optim_file {
  const zck__ds_rankfile *file;
  zck__source src;
  bool src_open;
  int zero_stage;
  bool bf16_optimizer;             /* BF16_Optimizer's file: read as stage 1, fp32 partitions padded */
  uint32_t partition_count;        /* max of the list (stage 1/2) or the int (stage 3) */
  int64_t *counts;                 /* stage 1/2: the list, per flat group (AutoEP's expert group differs) */
  size_t n_counts;
  bool mixed_counts;               /* the list's entries differ (ds_autoep.c decides) */
  zck__ds_flat *flat;
  size_t n_flat;
  int64_t *group_paddings;         /* stage 1/2 [n_flat] */
  bool has_param_paddings;
  int64_t **param_paddings;        /* stage 1/2: [n_flat][params of the group] */
  size_t *n_param_paddings;
  char *ds_version;
  /* XXH3 of every zip record's (CRC-32, size), in order: two ranks' files with the same
   * fingerprint hold the same bytes (ds_open.c check_copies); archive_ranked: the archive
   * folder names a rank (which check_archive_rank found to be this file's) */
  uint64_t records_print;
  size_t n_records;
  bool archive_ranked;
  /* stage 1/2 param_slice_mappings (DS-55), per flat group: name -> (start, numel) */
  char ***psm_names;
  int64_t **psm_start, **psm_numel;
  size_t *n_psm;
} zck__ds_optim_file;

/* ZeRO-0 (ds_zero0.c): the optimizer's state_dict inside the model file. Optimizer param k
 * (torch's index: group by group) is flat param k of the manifest. */
typedef struct zck__ds_zero0 {
  bool wrapped;                    /* FP16_UnfusedOptimizer or FP16_Optimizer (bf16 / fp16): fp32_groups(_flat)
                                      hold the masters, the step is one ahead, loose scaler keys */
  size_t n;                        /* params the optimizer holds */
  size_t n_groups;
  size_t *group_first;             /* [n_groups + 1] */
  bool has_masters, has_state;
  zck__ds_tref *master;            /* [n] fp32_groups tensors (has_masters) */
  zck__ds_tref *exp_avg, *exp_avg_sq;  /* [n] (has_state) */
  int64_t *module_of;              /* [n]: the `module` entry it trains */
  zck_pk_doc *doc;                 /* objects built for the writers (the fp16 loss scaler) */
} zck__ds_zero0;

struct zck_ds_ckpt {
  zck__ds_fileset fs;
  zck_torch_open_opts topts;
  unsigned threads;                /* stage-3 model files read at once (zck_ds_open_opts) */
  zck_ds_info info;
  char **warnings;
  size_t n_warnings;
  zck__ds_model_file *models;      /* 1 (stage 1/2) or W (stage 3) */
  size_t n_models;
  bool zero0;                      /* no optimizer files: ZeRO-0 (info.stage 0; optims[0] stands for the model file) */
  zck__ds_zero0 z0;
  zck__ds_optim_file *optims;      /* W (ZeRO-0: 1) */
  size_t n_optims;                 /* entries allocated in optims */
  /* rank-0 files kept open for their pickled objects */
  zck_torch_file *model0, *optim0;
  zck_pk_doc *carried;             /* model0's objects a writer carries, once model0 is dropped */
  const zck_pk *ds_config, *lr_scheduler, *loss_scaler, *param_groups;
  zck_model *model;
  int64_t *param_mod;              /* [n_params]: index of the param's `module` entry in models[0] */
  int64_t *buffer_mod;             /* [n_buffers]: same for buffers */
  uint32_t *flat_params;           /* params of param_shapes in flat order (all groups) */
  size_t *flat_first;              /* [n_flat + 1] into flat_params */
  /* parts */
  zck_layout *train_layout, *lp_layout, *frozen_layout, *buffer_layout;
  zck_store *stores[ZCK_DS_PART_COUNT];
  zck_store *buffer_stores;
  char **store_names;              /* owned names for the stores' messages */
  size_t n_store_names, cap_store_names;
  zck_record_check **records;      /* owned record checks of the stores (verify on read) */
  size_t n_records, cap_records;
  bool records_oom;
  char *lp_missing;                 /* why ZCK_DS_LP is unavailable (stage 1/2) */
  size_t *unsaved_ties;             /* indices into models[0].shared_*: aliases whose source was not saved */
  const char **unsaved_pairs;       /* [2 * n_unsaved_ties]: alias, source, ... (borrowed strings) */
  size_t n_unsaved_ties;
  zck_ds_output *outputs;
  size_t n_outputs;
  struct zck_manifest *manifest;   /* zckpt-manifest.json, parsed once (ds_expect.c); NULL: none */
  /* AutoTP (ds_autotp.c). c itself reads mp rank 0's files; tp[t - 1] reads mp rank t's,
   * each a plain ZeRO checkpoint of its own (shard shapes). After zck__ds_autotp, c's
   * model holds the full shapes and its parts point into every rank's stores. */
  struct zck_ds_ckpt **tp;
  uint32_t n_tp;                   /* entries of tp (tp_size - 1) */
  bool *tp_vocab;                  /* [n_params]: in vocabulary_parameter_patterns (or NULL) */
  const zck__ds_model_file *tie_from;  /* mp rank t > 0: rank 0's model file, whose shared_params
                                          DeepSpeed saves on global rank 0 only */
  struct zck__ds_offload *offload; /* ds_offload.c: open swap files of offloaded_tensors/ */
  struct zck__ds_autoep *autoep;   /* ds_autoep.c: an AutoEP checkpoint's layers, NULL: none */
  bool legacy_moe;                 /* ds_moe.c: deepspeed.moe.layer.MoE expert files beside plain ZeRO shards */
  struct zck__ds_moe *moe;         /* ds_moe_ep.c: its expert parallelism (ep_size > 1), NULL: none */
  struct zck__ds_pipe *pipe;       /* ds_pipe.c: a PipelineModule checkpoint's other stages and layer files */
};

/* ---- ds_pickle.c: reading DeepSpeed's objects out of pickle trees */
/* A shape: torch.Size, tuple or list of non-negative ints. */
zck_status zck__ds_shape(const zck_pk *node, zck__ds_named_shape *out, const char *what);
/* A tensor node of f, copied out. */
zck_status zck__ds_tensor(const zck_torch_file *f, const zck_pk *node, zck__ds_tref *out, const char *what);
/* zero_stage: ZeroStageEnum(n), getattr(ZeroStageEnum, 'name') or a plain int. -1 if not one. */
int zck__ds_zero_stage(const zck_pk *node);
/* A list of ints. */
zck_status zck__ds_int_list(const zck_pk *node, int64_t **out, size_t *n, const char *what);
/* Deep copy of a tree from another doc into d (cycle-safe via a small memo). NULL on OOM
 * or a cycle deeper than the limit. */
zck_pk *zck__ds_pk_copy(zck_pk_doc *d, const zck_pk *node);
/* d[key] for a STR key in a dict node being built (the last one wins, as Python's). */
zck_pk *zck__ds_pk_get_mut(zck_pk *dict, const char *key);

/* ---- ds_read.c */
/* keep_torch: rank 0's file stays open (its pickled ds_config, lr_scheduler, module attrs). */
zck_status zck__ds_read_model_file(zck_ds_ckpt *c, zck__ds_model_file *mf, bool keep_torch);
/* Moves mf's warnings to the reader's list. */
zck_status zck__ds_take_warnings(zck_ds_ckpt *c, zck__ds_model_file *mf);
zck_status zck__ds_read_optim_file(zck_ds_ckpt *c, zck__ds_optim_file *of, bool keep_torch);

void zck__ds_model_file_free(zck__ds_model_file *mf);
void zck__ds_optim_file_free(zck__ds_optim_file *of);
zck_status zck__ds_warn(zck_ds_ckpt *c, const char *fmt, ...) ZCK__PRINTF(2, 3);

/* ---- ds_open.c: one mp rank's file set, opened and described (tie_from: see the struct) */
zck_status zck__ds_open_mp(const char *path, const zck_ds_open_opts *o, uint32_t mp, const zck__ds_model_file *tie_from,
                           zck_ds_ckpt **out);

/* Stage 1 of zck__ds_open_mp: mp rank mp's files found and their pickles read, not described (ds_pipe.c merges
 * several such before the describe). */
zck_status zck__ds_open_files(const char *path, const zck_ds_open_opts *o, uint32_t mp, zck_ds_ckpt **out);

/* ---- ds_pipe.c: PipelineModule checkpoints (module None, weights in layer_<XX>-model_states.pt, one mp_rank file
 * set per stage). After stage 0's files are read: the other stages' files read and their records appended to c's
 * (param_shapes, flat groups, param groups), the layer files' tensors made c's module entries under the names
 * PipelineModule gives them ("<XX>.<key>"), so c describes as one ZeRO checkpoint of the whole model. */
zck_status zck__ds_pipe_prepare(zck_ds_ckpt *c, const char *path, const zck_ds_open_opts *o);
void zck__ds_pipe_free(struct zck__ds_pipe *p);
/* The model files of stages 1.. (after c's own), for the jobs that copy them. */
size_t zck__ds_pipe_model_files(const zck_ds_ckpt *c);
const zck__ds_rankfile *zck__ds_pipe_model_file(const zck_ds_ckpt *c, size_t i);
/* TiedLayerSpec weights (ds_pipe_tied.c): later stages' copies of a weight are left out of the model, and the training
 * layout is DeepSpeed's ZeRO-1 partition of each flat group with them counted but no piece pointing at them. */
bool zck__ds_pipe_has_replicas(const zck_ds_ckpt *c);
zck_status zck__ds_pipe_train(zck_ds_ckpt *c, size_t n_params, const uint64_t *numels, const zck_group_spec *specs,
                              size_t n_flat, uint32_t w, uint32_t param_align, zck_layout **out);

/* ---- ds_autotp.c: the other TP ranks opened and c's parts merged over them (after describe) */
zck_status zck__ds_autotp(zck_ds_ckpt *c, const char *path, const zck_ds_open_opts *o);

/* ---- ds_moe.c: legacy deepspeed.moe.layer.MoE checkpoints */
/* Expert files without ds_autoep_layers: accepted (c->legacy_moe) when the shards are ZeRO-1/2 (ep_size 1, or > 1
 * through zck__ds_moe_expand_ep), refused by name otherwise. No-op without expert files or for AutoEP. */
zck_status zck__ds_moe_prepare(zck_ds_ckpt *c);
/* After the describe: the experts' 16-bit weights are not bound (16-bit outputs cast the masters). */
zck_status zck__ds_moe_finish(zck_ds_ckpt *c);
/* The global expert id a param name carries (....deepspeed_experts.<E>....), -1: not an expert. */
long zck__ds_moe_expert_id(const char *name);

/* ---- ds_moe_ep.c: deepspeed.moe with ep_size E > 1 (the experts' flat group partitioned over W / E ranks) */
struct zck__ds_moe {
  uint32_t ep_size, edp_size;      /* E, D = W / E */
  size_t group;                    /* the experts' flat group */
  size_t n_local;                  /* params of one EP rank's flat (its local experts) */
  uint32_t *pos;                   /* [E * n_local]: where EP rank e's local param i sits in the group's params */
};
/* From zck__ds_moe_prepare when the partition counts differ: the experts' records rewritten to their global names
 * (param_shapes, every rank's param_slice_mappings), c->moe set. */
zck_status zck__ds_moe_expand_ep(zck_ds_ckpt *c);
/* build_train's layout: the other groups ZeRO's over the w ranks; group eg is EP rank e's local flat (the params
 * specs[eg].params[pos[e * n_local + i]], i < n_local) partitioned over the w / E ranks d * E + e. */
zck_status zck__ds_moe_layout(size_t n_params, const uint64_t *numels, const zck_group_spec *specs, size_t n_flat,
                              uint32_t w, uint32_t param_align, size_t eg, uint32_t E, size_t n_local,
                              const uint32_t *pos, zck_layout **out);
zck_status zck__ds_moe_train(const zck_ds_ckpt *c, size_t n_params, const uint64_t *numels, const zck_group_spec *specs,
                             size_t n_flat, uint32_t w, uint32_t param_align, zck_layout **out);
void zck__ds_moe_free(struct zck__ds_moe *m);
/* An expert param's name with its expert id moved by delta (global <-> local); NULL: no memory. */
char *zck__ds_moe_renamed(const char *name, long delta);

/* ---- ds_autoep.c: AutoEP (expert-parallel MoE) checkpoints */
/* The model file's ds_autoep_layers, parsed into mf->autoep (none: left NULL). */
zck_status zck__ds_autoep_read(zck__ds_model_file *mf, const zck_pk *root, const char *path);
/* After the files are read: refuses what is not read, rewrites the records to AutoEP's layout (full expert
 * shapes, expert params in `module`, the router alias dropped), sets c->autoep. No-op for other checkpoints
 * (which it refuses if they hold expert files or mixed partition counts). */
zck_status zck__ds_autoep_prepare(zck_ds_ckpt *c);
/* build_train's layout of an AutoEP checkpoint (zck_layout_zero12's arguments; stage 3: sub-groups). */
zck_status zck__ds_autoep_train(const zck_ds_ckpt *c, size_t n_params, const uint64_t *numels,
                                 const zck_group_spec *specs, size_t n_flat, uint32_t w, uint32_t param_align,
                                 zck_layout **out);
/* The same for any EP size E (dividing w): the dense groups ZeRO's over the w ranks, the experts' flat groups
 * eg .. eg + n_eg - 1 (stage 3: their sub-groups) EP rank e's local flat (numels / E) partitioned over the w / E
 * expert-data-parallel ranks, rank d * E + e holding edp rank d's part of it. Readers and the AutoEP writer
 * (ds_autoep_write.c) share it. */
zck_status zck__ds_autoep_layout(size_t n_params, const uint64_t *numels, const zck_group_spec *specs, size_t n_flat,
                                 uint32_t w, uint32_t param_align, size_t eg, size_t n_eg, uint32_t E, bool z3,
                                 zck_layout **out);
/* After describe: the manifest, layouts and recipe under the HF model's names. */
zck_status zck__ds_autoep_finish(zck_ds_ckpt *c, bool hf_names);
void zck__ds_autoep_file_free(struct zck__ds_autoep_file *f);
void zck__ds_autoep_free(struct zck__ds_autoep *a);

/* ---- ds_manifest.c: c->model and its indices, from models[0] and param_groups (ds_manifest.h) */
zck_status zck__ds_build_manifest(zck_ds_ckpt *c);

/* ---- ds_describe.c */
zck_status zck__ds_describe(zck_ds_ckpt *c);
const char *zck__ds_store_name(zck_ds_ckpt *c, const char *fmt, ...) ZCK__PRINTF(2, 3);

/* ---- ds_zero0.c */
/* After rank 0's model file is read: the optimizer state, which module entries it trains
 * (written into the model file's param_shapes / shared_params), world size, optims[0]. */
zck_status zck__ds_zero0_read(zck_ds_ckpt *c);
/* The train layout (whole tensors, flat order) and its fp32 / exp_avg / exp_avg_sq stores;
 * sets info.master_dtype, state_dtype, has_optimizer_state. */
zck_status zck__ds_zero0_build_train(zck_ds_ckpt *c, const uint64_t *numels);
/* ds_zero0_fused.c: FP16_Optimizer's flat groups (optimizer['fp32_groups_flat']) cut into
 * the module's params by value; replaces c->z0's one-flat-param-per-group arrays with
 * per-param ones and sets opt_of[i] (module entry -> optimizer param, -1: frozen). */
zck_status zck__ds_zero0_fused(zck_ds_ckpt *c, const zck_torch_file *tf, const zck_pk *flat_list, const bool *cand,
                               int64_t *opt_of);
void zck__ds_zero0_free(zck__ds_zero0 *z);
/* A store bound in place to t's bytes in src, with its record check (ds_describe.c). */
zck_store zck__ds_source_store(zck_ds_ckpt *c, const zck__source *src, const zck__ds_tref *t, const char *path,
                               const char *what);

/* ---- ds_offload.c: ZeRO-3 sub-groups swapped to NVMe, read from offloaded_tensors/ */
/* The optim file holds an empty partition for a sub-group of `saved` elements: it was swapped. */
bool zck__ds_offload_swapped(const zck_ds_ckpt *c, const zck__ds_flat *f, uint64_t saved);
/* Binds the fp32 / exp_avg / exp_avg_sq stores `id` (sub-group g of rank r) to its swap files. */
zck_status zck__ds_offload_bind(zck_ds_ckpt *c, uint32_t r, size_t g, const zck_layout_store *st, uint32_t id);
void zck__ds_offload_free(struct zck__ds_offload *o);

/* ---- ds_expect.c: zckpt-manifest.json's layout checked, its tensor XXH3s attached to
 * the stores (verified on read) */
zck_status zck__ds_expect_manifest(zck_ds_ckpt *c);

/* ---- ds_math.c: the flat order and fragment math shared by reader and writer */
/* Per-param padding of parameter_alignment (stage_1_and_2.py): after every param but the
 * last, (-offset) % align zeros. out[n]. */
void zck__ds_param_paddings(const uint64_t *numels, size_t n, uint32_t align, int64_t *out);
/* DeepSpeed's element multiple for parameter_alignment: 16 / gcd(16, elem size). */
uint32_t zck__ds_param_align_for(zck_dtype lp);

#endif
