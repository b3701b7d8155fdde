/* dcp.h: torch Distributed Checkpoint folders (FSDP2, torchtitan, Accelerate FSDP, HF
 * Trainer with FSDP), described as a state view. The format's rules are dcp_format.h's.
 *
 * zck_dcp_open() reads the .metadata pickle (the allowlisted classes only, as torch's
 * unpickler would see them) and checks the structure of the whole file set before any
 * job reads a tensor byte:
 *   - every storage item lies inside its file, items do not overlap and fill each file
 *     from its first byte to its last (the FileSystemWriter writes them back to back);
 *   - every file the metadata names is there; no transform descriptor (compression) and
 *     no path outside the folder;
 *   - every tensor's chunks are blocks inside its global shape (FSDP's rows, or blocks
 *     that cut any dimension: FSDP2 + tensor parallel), cover it exactly once, each with
 *     exactly one item;
 *   - every item is an uncompressed torch.save zip: a tensor item holds one contiguous
 *     tensor of the chunk's dtype and shape, a bytes item one Python value.
 * It then describes, reading nothing more:
 *   - a model manifest: params = the model.<fqn> tensors in metadata order (dtype as
 *     stored); param groups and their settings from the optim.param_groups.<i>.* items;
 *     a param with optimizer state is trainable, one without it frozen;
 *   - a state view (lib/state.h): FP32 (trainable weights), EXP_AVG, EXP_AVG_SQ and
 *     FROZEN parts, each a custom layout whose stores are the chunks (a block that cuts an
 *     inner dimension is one strided piece, its rows runs a row stride apart: one extent
 *     of the copy whatever its rows), bound in place to
 *     their bytes inside the items (a window source per item) with the zip CRC-32 of each
 *     record, so the executor checks every byte it streams;
 *   - the consolidation recipe (dcp_to_torch_save's model entries, in order, in their
 *     stored dtype) in the form every job takes (zck_ds_output).
 * A folder of torch's HuggingFaceStorageWriter(save_distributed=True) (safetensors storage:
 * shard-<r>-model-<i>-of-<n>.safetensors, no .metadata) reads the same way, its chunks
 * from each header's DCP_SHARDING_INFO (dcp_safetensors.c); it has no CRCs to check.
 * Errors are one line naming the file: "DIR/__1_0.distcp: item model.x at byte 123: ...".
 */
#ifndef ZCK_DCP_H
#define ZCK_DCP_H

#include "dcp/dcp_format.h"
#include "deepspeed/deepspeed.h"
#include "model.h"
#include "state.h"
#include "torch/torch.h"

typedef struct zck_dcp zck_dcp;

typedef struct zck_dcp_open_opts {
  zck_torch_open_opts torch;       /* limits for the metadata pickle and every item */
  uint64_t max_metadata_bytes;     /* a larger .metadata is ZCK_ERR_LIMIT; default 1 GiB */
} zck_dcp_open_opts;
#define ZCK_DCP_OPEN_OPTS_INIT {ZCK_TORCH_OPEN_OPTS_INIT, (uint64_t)1 << 30}

/* The DCP folder path stands for, malloc'd into *dir (NULL when it is none):
 *   - a folder holding .metadata (dcp.save's checkpoint_id; a torchtitan step-N);
 *   - a folder holding pytorch_model_fsdp_0/.metadata (Accelerate save_state, HF Trainer
 *     FSDP checkpoint-N);
 *   - an HF output_dir or a torchtitan checkpoint folder: its checkpoint-N / step-N
 *     (largest N) that holds one of the above. */
zck_status zck_dcp_resolve(const char *path, char **dir);
/* dir itself, or its Accelerate model folder, when it holds .metadata (malloc'd); else
 * NULL. A save that stopped before writing .metadata (written last) is no checkpoint. */
char *zck_dcp_dir_of(const char *dir);
/* True if zck_dcp_resolve finds a DCP folder for path (for sniffing). */
bool zck_dcp_is_checkpoint(const char *path);

/* Opens path (anything zck_dcp_resolve takes). opts may be NULL. */
zck_status zck_dcp_open(const char *path, const zck_dcp_open_opts *opts, zck_dcp **out);
void zck_dcp_close(zck_dcp *c);

typedef struct zck_dcp_info {
  const char *dir;                 /* the DCP folder */
  const char *version;             /* Metadata.version, NULL if absent */
  const char *save_id;             /* StorageMeta.save_id, NULL if absent */
  size_t n_files;                  /* .distcp files */
  size_t n_items;                  /* storage items (chunks and bytes items) */
  size_t n_tensors;                /* tensor entries of state_dict_metadata */
  size_t n_bytes_entries;          /* bytes entries */
  uint64_t data_bytes;             /* sum of the .distcp files' sizes */
  bool has_optimizer_state;        /* exp_avg and exp_avg_sq for every trainable param */
  zck_dtype weight_dtype;          /* of the model weights; INVALID when they differ */
  zck_dtype state_dtype;           /* of exp_avg / exp_avg_sq; INVALID without them */
} zck_dcp_info;

const zck_dcp_info *zck_dcp_info_of(const zck_dcp *c);
const zck_model *zck_dcp_model(const zck_dcp *c);
/* The state view of the folder (valid until zck_dcp_close). */
void zck_dcp_state(const zck_dcp *c, zck_state_view *v);
/* The consolidation recipe: one TRAINABLE (FP32 part) or FROZEN (FROZEN part) entry per
 * model.<fqn> tensor, in metadata order, dtype = src_dtype = as stored. */
const zck_ds_output *zck_dcp_outputs(const zck_dcp *c, size_t *n);

/* One state_dict_metadata entry, for inspect. */
typedef struct zck_dcp_entry_info {
  const char *key;                 /* the flat key */
  zck_dcp_key_kind kind;
  bool is_bytes;
  zck_dtype dtype;                 /* tensors */
  int ndim;
  const int64_t *shape;
  uint64_t numel;
  size_t n_chunks;                 /* tensors: chunks; bytes: 1 */
} zck_dcp_entry_info;
size_t zck_dcp_entry_count(const zck_dcp *c);
void zck_dcp_entry_at(const zck_dcp *c, size_t i, zck_dcp_entry_info *out);

/* The folders read (the DCP folder; Accelerate's optimizer folder beside it, or NULL). */
const char *zck_dcp_optim_dir(const zck_dcp *c);

/* One zip record of a storage item, placed in its .distcp file: what a checker that reads
 * whole files (verify) CRCs as it passes. */
typedef struct zck_dcp_record {
  const char *path;                /* the .distcp file */
  const char *key;                 /* the item's entry */
  const char *name;                /* the record inside the item's zip ("archive/data/0") */
  uint64_t off, size;              /* absolute in the file */
  uint32_t crc32;
  uint16_t method;                 /* 0: stored */
} zck_dcp_record;
/* Calls fn for every record of every item that is a torch.save zip (every tensor item and
 * every optimizer bytes item; other bytes items, when not a zip, have none), reading only
 * their zip directories. fn's error stops the walk. */
zck_status zck_dcp_each_record(const zck_dcp *c, zck_status (*fn)(void *ctx, const zck_dcp_record *r), void *ctx);

/* ---- safetensors storage (dcp_safetensors.c)
 * Whether c is a folder of torch's HuggingFaceStorageWriter (shard-*.safetensors). */
bool zck_dcp_is_safetensors(const zck_dcp *c);
/* The output file the writer put entry i in, read from its shard files' names
 * shard-<r>-model-<i>-of-<n>: <i> (1 when saved without fqn_to_index_mapping), and in *of
 * the <n> every shard name shares. 0 when the names do not say (a name of another shape,
 * or the tensor in two files; *of: names that differ), or c is not safetensors storage. */
uint32_t zck_dcp_st_file(const zck_dcp *c, size_t entry, uint32_t *of);

/* ---- torch's dcp_to_torch_save (dcp_torch_save.c)
 * Writes at path the file torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dir,
 * path) writes for the DCP folder c was opened on, byte for byte: the whole state dict
 * (model, optimizer state, param groups, every other entry) nested as torch nests it. The
 * tensor data streams from the items, each chunk checked by its zip CRC-32; nothing is
 * left at path on failure. A bytes entry holding anything but plain Python values, and
 * dtypes torch.save pickles through UntypedStorage, are ZCK_ERR_UNSUPPORTED. */
zck_status zck_dcp_torch_save(zck_dcp *c, const char *path);

/* ---- a training run resumed from it (dcp_train.c) */
typedef struct zck_dcp_train {
  uint32_t world_size;             /* ranks that saved the model: the data files its chunks lie in */
  bool has_step;                   /* some param has Adam's step */
  double step;                     /* Adam's step, the same for every param */
  bool step_is_tensor;             /* a 0-d tensor (torch >= 1.12's Adam); else a Python number */
} zck_dcp_train;
/* Reads every optim.state.<fqn>.step (each checked by its record's CRC-32) and checks the
 * optimizer state is Adam's: exp_avg, exp_avg_sq and step only, one step for all params,
 * no amsgrad. One line naming the key otherwise. */
zck_status zck_dcp_train_info(zck_dcp *c, zck_dcp_train *out);
/* Tied weights: DCP writes a tied param under each name (lm_head.weight and
 * model.embed_tokens.weight), the optimizer state under the first only, so the other
 * reads as frozen. tied[p] (n_params entries) = the trainable param whose bytes a frozen
 * param p repeats (same dtype, shape and chunks, the same CRC-32s, then the same bytes),
 * else -1. */
zck_status zck_dcp_ties(const zck_dcp *c, int32_t *tied);
/* The same from the CRC-32s alone, reading no data (inspect: it says what it saw). */
zck_status zck_dcp_ties_by_crc(const zck_dcp *c, int32_t *tied);
/* The checkpoint-N folder holding the DCP in its pytorch_model_fsdp_0/ (Accelerate's
 * save_state, HF Trainer with FSDP), whose other files (trainer_state.json, scheduler.pt,
 * rng states) belong to the checkpoint; NULL for a plain DCP folder. malloc'd. */
char *zck_dcp_save_root(const zck_dcp *c);
/* An adapter-only PEFT save (the HF Trainer's FSDP checkpoint of a PEFT model): the adapter
 * name its model keys drop, else NULL; and the name param p has in the module (and in the
 * optimizer's state): its model key, with the adapter name put back in such a save. */
const char *zck_dcp_peft_adapter(const zck_dcp *c);
const char *zck_dcp_param_module_name(const zck_dcp *c, uint32_t p);
/* Chunks of param p's model entry (0: none): FSDP2 shards a param (one chunk per rank,
 * empty ones included) and writes a replicated tensor (a buffer) once. */
size_t zck_dcp_param_chunks(const zck_dcp *c, uint32_t p);

#endif
