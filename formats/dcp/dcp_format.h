/* dcp_format.h: the rules of torch Distributed Checkpoint that its reader and its writer
 * both follow: file names, the classes of the .metadata pickle, and how state-dict keys
 * name a model weight, an optimizer state or a param-group setting.
 *
 * A DCP folder (torch.distributed.checkpoint.save with the default FileSystemWriter):
 *   <dir>/.metadata            pickle (protocol 4 in torch 2.x) of a Metadata object
 *   <dir>/__<rank>_<n>.distcp  data files: items back to back, each item a complete
 *                              torch.save zip (a tensor chunk: one contiguous tensor whose
 *                              storage is exactly the chunk, 64-byte aligned data), or for
 *                              a bytes item the raw bytes io.BytesIO held (torch.save of a
 *                              Python object: param-group settings)
 *
 * Metadata (torch/distributed/checkpoint/metadata.py, filesystem.py), each a dataclass
 * pickled as NEWOBJ(cls, ()) + BUILD(state):
 *   Metadata              {state_dict_metadata: {key: TensorStorageMetadata | BytesStorageMetadata},
 *                          planner_data: {key: (path...)}, storage_data: {MetadataIndex: _StorageInfo},
 *                          storage_meta: StorageMeta | None, version: "1.0.0"}
 *   TensorStorageMetadata {properties: TensorProperties, size: torch.Size, chunks: [ChunkStorageMetadata]}
 *   ChunkStorageMetadata  {offsets: torch.Size, sizes: torch.Size}
 *   TensorProperties      BUILD state is a tuple (its __getstate__): (dtype, layout, requires_grad,
 *                          _MEM_FORMAT_ENCODING(i), pin_memory[, strides]); dtype is the global
 *                          torch.<dtype>, layout torch.serialization._get_layout("torch.strided")
 *   BytesStorageMetadata  no fields
 *   MetadataIndex         {fqn, offset: torch.Size | None, index: int | None}
 *   _StorageInfo          {relative_path, offset, length[, transform_descriptors]} (None fields
 *                          are left out by its __getstate__)
 *   StorageMeta           {checkpoint_id, save_id, load_id, modules}
 * torch reads the file with an unrestricted pickle.load; zckpt allows these classes and
 * the globals they need, nothing else.
 *
 * Keys: dcp.save flattens the nested state dict with '.' (flatten_state_dict) and keeps
 * the path of every key in planner_data. get_state_dict(model, optim) saved as
 * {"model": msd, "optim": osd} gives
 *   model.<fqn>                      a model weight or persistent buffer
 *   optim.state.<fqn>.<k>            Adam's exp_avg, exp_avg_sq (tensors) and step (a 0-d
 *                                    float32 tensor, or bytes for a Python number)
 *   optim.param_groups.<i>.<k>       a bytes item per setting; "params" holds the FQNs
 * Accelerate saves the optimizer as {"optimizer": osd}: "optimizer." stands for "optim.".
 * torchtitan saves the model's keys at the top level (the path is the FQN alone) and the
 * optimizer flattened (flatten_optimizer_state_dict): the path ("optimizer",
 * "state.<fqn>.<k>"); its per-param settings ("param_groups.<fqn>.<k>") are OTHER.
 * The path (planner_data) splits a key exactly; the name rules are for a key without one.
 */
#ifndef ZCK_DCP_FORMAT_H
#define ZCK_DCP_FORMAT_H

#include "zck.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZCK_DCP_METADATA_FILE ".metadata"
#define ZCK_DCP_DATA_SUFFIX ".distcp"
#define ZCK_DCP_VERSION "1.0.0"   /* Metadata.version torch 2.5+ writes (older: absent) */
/* Accelerate's save_state and HF Trainer's FSDP checkpoint-N: the model's DCP folder, and
 * the optimizer's beside it ({"optimizer": osd}) */
#define ZCK_DCP_ACCELERATE_MODEL_DIR "pytorch_model_fsdp_0"
#define ZCK_DCP_ACCELERATE_OPTIM_DIR "optimizer_0"

/* "__<rank>_<n>.distcp" into buf. */
void zck_dcp_data_file_name(uint32_t rank, uint32_t n, char *buf, size_t cap);
/* True if name is "__<rank>_<n>.distcp" (decimal, no sign); rank and n may be NULL. */
bool zck_dcp_parse_data_file_name(const char *name, uint32_t *rank, uint32_t *n);

/* ---- the metadata pickle's classes */
typedef enum zck_dcp_class {
  ZCK_DCP_CLS_METADATA = 0,
  ZCK_DCP_CLS_TENSOR_STORAGE,     /* TensorStorageMetadata */
  ZCK_DCP_CLS_BYTES_STORAGE,      /* BytesStorageMetadata */
  ZCK_DCP_CLS_CHUNK,              /* ChunkStorageMetadata */
  ZCK_DCP_CLS_TENSOR_PROPERTIES,
  ZCK_DCP_CLS_MEM_FORMAT,         /* _MEM_FORMAT_ENCODING (an Enum, REDUCE'd with its value) */
  ZCK_DCP_CLS_METADATA_INDEX,
  ZCK_DCP_CLS_STORAGE_META,
  ZCK_DCP_CLS_STORAGE_INFO,       /* filesystem._StorageInfo */
  ZCK_DCP_CLS_COUNT
} zck_dcp_class;

const char *zck_dcp_class_module(zck_dcp_class c);
const char *zck_dcp_class_name(zck_dcp_class c);
/* The class a (module, name) global is, or -1. */
int zck_dcp_class_of(const char *module, const char *name);
/* _MEM_FORMAT_ENCODING values (metadata.py). */
enum { ZCK_DCP_MEM_CONTIGUOUS = 0, ZCK_DCP_MEM_CHANNELS_LAST = 1, ZCK_DCP_MEM_PRESERVE = 2 };
/* torch.serialization._get_layout, how a torch.layout pickles; its only argument zckpt
 * reads is "torch.strided". */
#define ZCK_DCP_LAYOUT_MODULE "torch.serialization"
#define ZCK_DCP_LAYOUT_NAME "_get_layout"
#define ZCK_DCP_LAYOUT_STRIDED "torch.strided"

/* A torch dtype global's name ("float32", "bfloat16", ...) -> dtype; ZCK_DTYPE_INVALID if
 * zckpt has no such dtype. */
zck_dtype zck_dcp_dtype_of(const char *name);
/* The global name torch pickles a dtype as ("float32"), NULL if none. */
const char *zck_dcp_dtype_name(zck_dtype t);
/* Every global a DCP metadata pickle may name: the classes above, torch.Size, the torch
 * dtypes, _get_layout, and pathlib's path classes (StorageMeta.checkpoint_id is the
 * os.PathLike the writer was given: Accelerate's FileSystemWriter(ckpt_dir) records a
 * pathlib.PosixPath, REDUCE'd from its parts as strings). */
bool zck_dcp_global_allowed(const char *module, const char *name);
bool zck_dcp_is_path_class(const char *module, const char *name);

/* ---- state-dict keys */
typedef enum zck_dcp_key_kind {
  ZCK_DCP_KEY_OTHER = 0,          /* anything else (lr_scheduler, dataloader, ...): kept, unused */
  ZCK_DCP_KEY_MODEL,              /* model.<fqn> */
  ZCK_DCP_KEY_OPTIM_STATE,        /* optim.state.<fqn>.<k> */
  ZCK_DCP_KEY_PARAM_GROUP,        /* optim.param_groups.<i>.<k> */
  ZCK_DCP_KEY_PARAM_SETTING       /* flatten_optimizer_state_dict's (torchtitan's) per-param
                                     setting: optimizer.param_groups.<fqn>.<k>, one leaf */
} zck_dcp_key_kind;

/* What a key names. fqn and setting point into the strings given (not NUL-terminated at
 * fqn_len when parsed from a flat key). */
typedef struct zck_dcp_key {
  zck_dcp_key_kind kind;
  const char *fqn;                /* MODEL, OPTIM_STATE */
  size_t fqn_len;
  const char *setting;            /* OPTIM_STATE: "exp_avg", ...; PARAM_GROUP: "lr", ... */
  uint32_t group;                 /* PARAM_GROUP */
} zck_dcp_key;

/* From a planner_data path (its components, in order): ("model", fqn), ("optim", "state",
 * fqn, k), ("optim", "param_groups", i, k) where i is given in decimal; (fqn) alone and
 * ("optimizer", "state.<fqn>.<k>") and ("optimizer", "param_groups.<fqn>.<k>") as torchtitan
 * saves. Any other path is OTHER (a bytes
 * entry a path calls MODEL is the reader's to take as OTHER: a top-level setting). */
zck_dcp_key zck_dcp_key_from_path(const char *const *path, size_t n);
/* From a flat key alone: "model." prefix, "optim.state." prefix with the setting after
 * the last '.', "optim.param_groups.<i>.<k>". */
zck_dcp_key zck_dcp_key_parse(const char *key);
/* The flat keys, malloc'd (NULL when out of memory). */
char *zck_dcp_key_model(const char *fqn);
char *zck_dcp_key_state(const char *fqn, const char *setting);
char *zck_dcp_key_group(uint32_t group, const char *setting);

#endif
