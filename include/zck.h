/* zck.h: the public interface of libzckpt.
 *
 * zckpt moves ZeRO-sharded training state between layouts (DeepSpeed shards, safetensors,
 * universal checkpoints) as copy plans. This header is all a library user needs; the
 * per-format headers under formats/ are internal to the project.
 *
 * Conventions (as in zstd and NCCL):
 *  - every fallible call returns a zck_status; ZCK_OK is 0;
 *  - on failure, zck_last_error() returns one line describing what went wrong, with the
 *    file, tensor and byte offset where known ("FILE: what is wrong"); it is per thread;
 *  - the caller owns output buffers; every create/open has a free/close accepting NULL;
 *  - option structs start with their size, set by their _INIT macro: fields are only ever
 *    added at the end, and a caller built against an older zck.h gets defaults for the
 *    fields it does not know;
 *  - libzckpt.so exports exactly the functions declared here (ZCK_API).
 */
#ifndef ZCK_H
#define ZCK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) || defined(__clang__)
#define ZCK_API __attribute__((visibility("default")))
#else
#define ZCK_API
#endif

#define ZCK_VERSION_MAJOR 0
#define ZCK_VERSION_MINOR 1
#define ZCK_VERSION_PATCH 0
#define ZCK_VERSION_STRING "0.1.0"

/* ---- status */
typedef enum zck_status {
  ZCK_OK = 0,
  ZCK_ERR_INVALID_ARG,   /* API misuse or bad option value */
  ZCK_ERR_IO,            /* read/write/fsync/rename failed (errno in the message) */
  ZCK_ERR_NOT_FOUND,     /* a file, entry, key or tensor that must exist does not */
  ZCK_ERR_FORMAT,        /* malformed or hostile input */
  ZCK_ERR_TRUNCATED,     /* input shorter than its own header says */
  ZCK_ERR_UNSUPPORTED,   /* well-formed but not handled (e.g. compressed zip entry) */
  ZCK_ERR_LIMIT,         /* a safety limit (depth, memo, object count, size) exceeded */
  ZCK_ERR_MISMATCH,      /* inputs disagree (world size, shapes, checksums) */
  ZCK_ERR_NO_MEMORY,
  ZCK_ERR_NO_SPACE,      /* ENOSPC / EDQUOT on write */
  ZCK_ERR_EXISTS,        /* output exists and overwriting was not asked for */
  ZCK_ERR_DAMAGED,       /* checksum or structural damage found by verify */
  ZCK_ERR_NO_DEVICE,     /* built without CUDA, or no GPU present */
  ZCK_ERR_INTERNAL,
  ZCK_ERR_CANCELED       /* the progress callback asked to stop; nothing was written */
} zck_status;

/* Name of a status ("format error", ...). Never NULL. */
ZCK_API const char *zck_status_name(zck_status s);
/* The calling thread's last error message; "" if none. Valid until the next zckpt call. */
ZCK_API const char *zck_last_error(void);
/* Clears the calling thread's error message. */
ZCK_API void zck_clear_error(void);
ZCK_API const char *zck_version(void);

/* ---- element types */
typedef enum zck_dtype {
  ZCK_DTYPE_INVALID = 0,
  ZCK_F64, ZCK_F32, ZCK_F16, ZCK_BF16,
  ZCK_I64, ZCK_I32, ZCK_I16, ZCK_I8,
  ZCK_U64, ZCK_U32, ZCK_U16, ZCK_U8,
  ZCK_BOOL,
  ZCK_F8_E4M3, ZCK_F8_E5M2,
  ZCK_C64, ZCK_C128,
  ZCK_DTYPE_COUNT
} zck_dtype;

/* Bytes per element (0 for INVALID). */
ZCK_API size_t zck_dtype_size(zck_dtype t);
/* torch spelling without the prefix: "float32", "bfloat16", "int64", "bool", ... */
ZCK_API const char *zck_dtype_name(zck_dtype t);
/* Parses user spellings: fp32|float32|f32|float, bf16|bfloat16, fp16|float16|half, ... */
ZCK_API zck_dtype zck_dtype_parse(const char *s);
/* safetensors spelling ("F32", "BF16", ...) and back; NULL / INVALID when there is none. */
ZCK_API const char *zck_dtype_safetensors_name(zck_dtype t);
ZCK_API zck_dtype zck_dtype_from_safetensors(const char *s);
/* torch storage class name ("FloatStorage", "BFloat16Storage", ...) and back. */
ZCK_API const char *zck_dtype_torch_storage(zck_dtype t);
ZCK_API zck_dtype zck_dtype_from_torch_storage(const char *s);
/* 1 if zck_convert can convert between the two types. */
ZCK_API int zck_dtype_convertible(zck_dtype dst, zck_dtype src);
/* Converts n elements. Float narrowing rounds to nearest even exactly as torch's .to()
 * does (NaN stays NaN, overflow to inf). Same type is a memcpy. */
ZCK_API zck_status zck_convert(zck_dtype dst_type, void *dst, zck_dtype src_type, const void *src, size_t n);

/* A size as users write it ("5GB", "500MB", "2GiB", "5G", or bytes), read as
 * huggingface_hub's parse_size_to_int reads max_shard_size (TB/GB/MB/KB in powers of 10,
 * any case, a float value truncated), plus TiB/GiB/MiB/KiB, T/G/M/K and B. */
ZCK_API zck_status zck_parse_size(const char *s, uint64_t *bytes);

/* OUT as a job writes it: a symlink to a folder is followed (the job writes at its target
 * and the link stays), a dangling link is refused. *resolved: free() it. */
ZCK_API zck_status zck_resolve_out(const char *path, char **resolved);

/* ---- temporaries
 * A job builds its output under a temporary name beside it, ".NAME.zck-tmp-PID" (a file
 * or a folder), and renames it to NAME at its commit; a commit replacing an earlier NAME
 * first moves that aside as ".NAME.zck-tmp-PID.zck-old-PID". A writer killed outright
 * (SIGKILL, out of memory, power loss) leaves these behind; every job sweeps its OUT's
 * folder of dead writers' entries before it writes (ZCK_SWEEP_DEAD). */
typedef enum zck_sweep_mode {
  ZCK_SWEEP_DEAD = 0,         /* entries of writers no longer running; other live processes'
                                 and this process's own are left alone */
  ZCK_SWEEP_OWN = 1           /* this process's own entries, after its job was interrupted:
                                 system calls and stack buffers only, so it may run while the
                                 other threads are stopped anywhere (inside malloc included);
                                 sets no error message */
} zck_sweep_mode;

/* Sweeps the entries of folder dir (not below): removes the temporaries (never following
 * a link), and puts an earlier version that was moved aside back at NAME when NAME is
 * missing (its writer died between its two renames), else removes it. removed and
 * restored (either may be NULL) receive the number of entries. ZCK_ERR_NOT_FOUND or
 * ZCK_ERR_IO when dir cannot be opened; an entry that cannot be removed stays. */
ZCK_API zck_status zck_sweep_temporaries(const char *dir, zck_sweep_mode mode, unsigned *removed, unsigned *restored);
/* The PID in the names of the temporaries of a job this process runs: its own, or rank 0's
 * in a distributed job (zck_dist_begin). */
ZCK_API long zck_temporary_pid(void);

/* ---- checksums */
/* XXH3-64 of a byte range (the manifest's per-tensor checksum). */
ZCK_API uint64_t zck_xxh3(const void *data, size_t n);


/* ---- jobs
 * Each job is one copy plan run by the parallel executor, with its output committed
 * atomically: on any error nothing is left at the destination. Option structs start
 * with their size (set by their _INIT macro; the older verify and manifest options carry
 * a version number instead), so fields can be added at the end later. */

/* ZCK_ERR_INVALID_ARG (message naming OUT and the input) when writing OUT would replace,
 * hold or change an input of a job reading IN (a file, a DeepSpeed root, a tag, HF or
 * universal folder; tag: the --tag given, or NULL for `latest`): OUT is an input file, a
 * link to one, a folder holding one, or lies inside the tag folder. Compared by device and
 * inode. Every job checks this itself; callers may check before any other work. */
ZCK_API zck_status zck_check_out_not_input(const char *in, const char *out, const char *tag);

/* Progress: bytes written so far and in total (called from worker threads, serialized).
 * Returning non-zero cancels the job: it stops, removes what it had written (as on
 * Ctrl-C) and returns ZCK_ERR_CANCELED. */
typedef int (*zck_progress_cb)(void *ctx, uint64_t done_bytes, uint64_t total_bytes);

/* A warning about a job's input that does not stop it: one line, "FILE: what is odd"
 * (a shard tensor that the HF index leaves out, kept; an index total_size that disagrees),
 * called on the thread that runs the job once its output is in place (a job that fails
 * says only why it failed). */
typedef void (*zck_warning_cb)(void *ctx, const char *message);

typedef enum zck_output_format {
  ZCK_OUT_AUTO = 0,        /* from the output name: *.safetensors, *.pt / *.bin, else a directory */
  ZCK_OUT_SAFETENSORS,     /* one .safetensors file */
  ZCK_OUT_HF_DIR,          /* model.safetensors or model-0000i-of-0000N.safetensors + index */
  ZCK_OUT_TORCH            /* one torch.save file (a state dict) */
} zck_output_format;

/* What a job wrote, filled on success when an option struct's `summary` points here. */
typedef struct zck_job_summary {
  uint64_t tensors;           /* consolidate, convert: tensors stored at OUT (a tied alias
                                 recorded in the safetensors metadata is not one); reshard,
                                 to-universal: the model's parameters */
  uint64_t files;             /* regular files at OUT (1 when OUT is a file) */
  uint64_t bytes;             /* their sizes */
} zck_job_summary;

typedef struct zck_convert_opts {
  size_t size;                /* sizeof(zck_convert_opts), set by ZCK_CONVERT_OPTS_INIT */
  zck_dtype dtype;            /* ZCK_DTYPE_INVALID: keep each tensor's dtype */
  zck_output_format format;
  uint64_t max_shard_size;    /* HF directory output, bytes; 0 = 5GB (HF default) */
  unsigned threads;           /* 0 = all cores */
  int overwrite;              /* replace an existing output */
  zck_progress_cb progress;
  void *progress_ctx;
  int no_verify;              /* skip the zip CRC-32 checks of the tensor bytes read (never the
                                 structure checks) */
  zck_job_summary *summary;   /* filled on success when not NULL */
  zck_warning_cb warning;     /* each of the readers' warnings about IN; NULL: not told */
  void *warning_ctx;
} zck_convert_opts;
#define ZCK_CONVERT_OPTS_INIT {sizeof(zck_convert_opts), ZCK_DTYPE_INVALID, ZCK_OUT_AUTO, 0, 0, 0, NULL, NULL, 0, NULL, NULL, NULL}

/* A state dict of tensors between .pt/.bin and safetensors (file, index or directory). */
ZCK_API zck_status zck_convert_file(const char *in, const char *out, const zck_convert_opts *opts);

typedef struct zck_inspect_opts {
  size_t size;                /* sizeof(zck_inspect_opts), set by ZCK_INSPECT_OPTS_INIT */
  int json;                   /* machine-readable output */
  int max_values;             /* non-tensor values listed; 0 = 200 */
} zck_inspect_opts;
#define ZCK_INSPECT_OPTS_INIT {sizeof(zck_inspect_opts), 0, 0}

/* Describes a .pt/.bin, a safetensors file or index, an HF or DeepSpeed checkpoint
 * directory, on `out` (a FILE *). */
ZCK_API zck_status zck_inspect(const char *path, const zck_inspect_opts *opts, void *out);

typedef struct zck_consolidate_opts {
  size_t size;                /* sizeof(zck_consolidate_opts), set by ZCK_CONSOLIDATE_OPTS_INIT */
  const char *tag;            /* NULL: the tag named by `latest` */
  zck_dtype dtype;            /* INVALID: zero_to_fp32's dtypes (fp32 params, frozen params in
                                 their 16-bit dtype, floating buffers fp32); else every floating
                                 tensor is cast to it (round to nearest even) */
  uint64_t max_shard_size;    /* bytes; 0 = 5GB (HF default) */
  int exclude_frozen;         /* leave frozen parameters out */
  int keep_tied;              /* write tied aliases as tensors of their own */
  int safetensors;            /* write safetensors (default 1) */
  int torch_bin;              /* write pytorch_model.bin (tied aliases share storage) */
  int force;                  /* accept a checkpoint that fails the completeness checks */
  unsigned threads;           /* 0 = all cores */
  int overwrite;
  zck_progress_cb progress;
  void *progress_ctx;
  int no_verify;              /* skip the checksums of the bytes read (zip CRC-32s, the manifest's
                                 XXH3s); the structure and rank identity checks always run */
  zck_job_summary *summary;   /* filled on success when not NULL (not by zck_consolidate_open) */
} zck_consolidate_opts;
#define ZCK_CONSOLIDATE_OPTS_INIT {sizeof(zck_consolidate_opts), NULL, ZCK_DTYPE_INVALID, 0, 0, 0, 1, 0, 0, 0, 0, NULL, NULL, 0, NULL}

/* A DeepSpeed ZeRO-1/2/3 checkpoint (root with `latest`, tag folder, or HF checkpoint-N/)
 * to whole tensors, equal bit for bit to DeepSpeed's zero_to_fp32. ckpt may also be a
 * universal checkpoint made of one (a universal folder in DeepSpeed's layout, or the folder
 * holding latest_universal; zckpt's HDF5 container): the output is then byte for byte that
 * of the checkpoint it was made from. OUT: a directory (HF
 * layout: model.safetensors or shards + index; pytorch_model.bin with torch_bin), or one
 * *.safetensors / *.bin file. Reads only the fp32 partitions (in place), the frozen and
 * buffer tensors, never exp_avg / exp_avg_sq. */
ZCK_API zck_status zck_consolidate(const char *ckpt, const char *out, const zck_consolidate_opts *opts);

/* What torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dcp, out) writes, byte
 * for byte: the whole state dict of a torch Distributed Checkpoint (dcp: a DCP folder, or
 * what zck_consolidate takes for one: Accelerate's checkpoint folder, an HF Trainer
 * checkpoint-N or output_dir) nested as torch nests it ({"model": ..., "optim": {"state":
 * ..., "param_groups": [...]}}), as one torch.save file at out. Tensor data streams
 * through, each chunk checked by its zip CRC-32. Of opts only overwrite is read (replace
 * an existing file; the old one stays whole until the new one is complete). */
ZCK_API zck_status zck_dcp_to_torch_save(const char *dcp, const char *out, const zck_consolidate_opts *opts);

/* What torch.distributed.checkpoint._consolidate_hf_safetensors.consolidate_safetensors_files(
 * dcp, out, fqn_to_index_mapping) writes, byte for byte, for a DCP saved with safetensors
 * storage (HuggingFaceStorageWriter(save_distributed=True): shard-*.safetensors): the
 * folder out with model-0000i-of-0000N.safetensors (torch's headers: no __metadata__, no
 * padding, the mapping's order) and model.safetensors.index.json, plus zckpt's manifest.
 * fqn_to_index: a JSON file holding the mapping ({fqn: i}, as torch takes it) or an index
 * whose weight_map names each tensor's file (torchtitan's fqn_to_index_mapping); NULL: the
 * save's own, read from the shard names (everything in file 1 when saved without one).
 * What torch cannot write is refused in one line (0-d and non-floating tensors; a mapping
 * naming a tensor the checkpoint lacks or leaving one out). Of opts: threads, overwrite,
 * progress, no_verify, summary. */
ZCK_API zck_status zck_dcp_consolidate_safetensors(const char *dcp, const char *out, const char *fqn_to_index,
                                                   const zck_consolidate_opts *opts);

/* The newest complete checkpoint-N folder of a Hugging Face Trainer output_dir, picked as
 * transformers' trainer_utils.get_last_checkpoint does (names ^checkpoint-(\d+)$ that are
 * folders, largest N; ASCII digits) but passing over incomplete ones: complete means its
 * `latest` names a tag folder that exists (an FSDP save: its torch Distributed Checkpoint
 * has its .metadata, in it or in pytorch_model_fsdp_0/) and neither folder holds a zckpt
 * manifest that fails zck_manifest_check_complete. *picked: its path (free() it). *skipped (may be NULL):
 * NULL, or why the newest one was passed over (free() it). ZCK_ERR_NOT_FOUND when there is
 * no checkpoint-N folder, ZCK_ERR_DAMAGED when none is complete. */
ZCK_API zck_status zck_hf_last_checkpoint(const char *output_dir, char **picked, char **skipped);

/* ---- whole tensors in the caller's memory
 * The tensors zck_consolidate would write (same names, order, dtypes and values), read
 * straight from the rank files into buffers the caller provides: for state dicts held in
 * memory (the Python package's get_fp32_state_dict_from_zero_checkpoint fills torch
 * tensors this way). Only opts' tag, dtype, exclude_frozen, force, threads and progress
 * apply; tied aliases are listed, sharing their source's buffer. */
typedef struct zck_state_dict zck_state_dict;

typedef enum zck_tensor_role {
  ZCK_ROLE_PARAM = 0,         /* trainable parameter (from the fp32 partitions) */
  ZCK_ROLE_FROZEN,            /* frozen parameter as DeepSpeed files it (zero-element trainable
                                 parameters included: DeepSpeed files them with the frozen) */
  ZCK_ROLE_BUFFER
} zck_tensor_role;

typedef struct zck_tensor_desc {
  const char *name;
  zck_dtype dtype;            /* as the buffer is filled */
  int ndim;
  const int64_t *shape;
  uint64_t numel;
  uint64_t nbytes;            /* numel * zck_dtype_size(dtype) */
  int64_t alias_of;           /* >= 0: a tied name of that tensor (same buffer); else -1 */
  zck_tensor_role role;       /* of the data (an alias: its source's) */
} zck_tensor_desc;

/* Opens the checkpoint (any source zck_consolidate takes) and lists its tensors; reads
 * no tensor data. */
ZCK_API zck_status zck_consolidate_open(const char *ckpt, const zck_consolidate_opts *opts, zck_state_dict **out);
ZCK_API size_t zck_state_dict_count(const zck_state_dict *sd);
/* The i-th tensor (i < count), valid until zck_state_dict_free. */
ZCK_API const zck_tensor_desc *zck_state_dict_tensor(const zck_state_dict *sd, size_t i);
/* Fills buffers[i] (desc->nbytes bytes, any alignment) for every tensor that is not an
 * alias (aliases' entries are ignored and may be NULL). Can be called again. */
ZCK_API zck_status zck_state_dict_read(zck_state_dict *sd, void *const *buffers);
ZCK_API void zck_state_dict_free(zck_state_dict *sd);

typedef enum zck_reshard_format {
  ZCK_RESHARD_TO_DEEPSPEED = 0,   /* DeepSpeed ZeRO files (the default) */
  ZCK_RESHARD_TO_DCP,             /* torch Distributed Checkpoint as FSDP2 saves it */
  ZCK_RESHARD_TO_DCP_ACCELERATE   /* the same state as Accelerate / the HF Trainer save FSDP (1 or 2) with
                                     SHARDED_STATE_DICT: pytorch_model_fsdp_0/ and optimizer_0/ */
} zck_reshard_format;

typedef enum zck_reshard_offload {
  ZCK_RESHARD_OFFLOAD_KEEP = 0,   /* the source's: NVMe swap files for an NVMe-offloaded ZeRO-3 source
                                     resharded to ZeRO-3, else optimizer state in the rank files */
  ZCK_RESHARD_OFFLOAD_NONE,       /* optimizer state in the rank files (DeepSpeed without NVMe offload) */
  ZCK_RESHARD_OFFLOAD_NVME        /* ZeRO-3 target: the sub-groups DeepSpeed swaps in offloaded_tensors/ */
} zck_reshard_offload;

typedef struct zck_reshard_opts {
  size_t size;                /* sizeof(zck_reshard_opts), set by ZCK_RESHARD_OPTS_INIT */
  int to_stage;               /* 1, 2 or 3; 0 = the source's */
  uint32_t to_world_size;     /* 0 = the source's */
  uint64_t sub_group_size;    /* stage 3; 0 = DeepSpeed's default (1e9) */
  const char *tag;            /* source tag; NULL = `latest` */
  unsigned threads;           /* 0 = all cores */
  int overwrite;
  zck_progress_cb progress;
  void *progress_ctx;
  int force;                  /* accept a zckpt-written source whose manifest is missing */
  int no_verify;              /* as zck_consolidate_opts.no_verify */
  zck_job_summary *summary;   /* filled on success when not NULL */
  uint32_t to_tp_size;        /* 0/1 = plain ZeRO (TP 1); T > 1 = DeepSpeed AutoTP files at TP size T
                                 (every mp_rank_0t); a T other than an AutoTP source's own needs the
                                 model config: DeepSpeed's split depends on it */
  const char *model_config;   /* config.json for --to-tp-size; NULL = <checkpoint folder>/config.json
                                 (where Hugging Face's Trainer saves it, beside global_step<N>/) */
  zck_reshard_format to_format; /* DCP: OUT is a DCP folder (.metadata, __<r>_0.distcp) for FSDP2 at
                                 to_world_size ranks (0: the source's); to_stage must be 0 */
  zck_dtype to_dtype;         /* a DCP source: the 16-bit dtype of the DeepSpeed run (ZCK_BF16 or ZCK_F32;
                                 ZCK_F16 is refused: a DCP holds no loss scaler state); INVALID = the DCP's
                                 weight dtype. Other sources keep their run's */
  zck_reshard_offload to_offload; /* DeepSpeed targets: where the optimizer state goes (NVMe swap files
                                     as DeepSpeed 0.19.8 writes them for the target world size, or not) */
  uint64_t swap_min_bytes;    /* NVMe target: DeepSpeed swaps a sub-group whose fp32 partition has at least
                                 max(MIN_AIO_BYTES, aio.block_size) bytes; 0 = found from what the source swapped */
  uint32_t to_ep_size;        /* a DeepSpeed AutoEP source: the target's expert-parallel size (dividing the world
                                 size and every layer's experts); 0 = the source's. Written in AutoEP's own layout */
} zck_reshard_opts;
#define ZCK_RESHARD_OPTS_INIT {sizeof(zck_reshard_opts), 0, 0, 0, NULL, 0, 0, NULL, NULL, 0, 0, NULL, 0, NULL, \
                               ZCK_RESHARD_TO_DEEPSPEED, ZCK_DTYPE_INVALID, ZCK_RESHARD_OFFLOAD_KEEP, 0, 0}

/* A DeepSpeed checkpoint at another ZeRO stage and world size, with all optimizer state
 * (fp32 master, exp_avg, exp_avg_sq, step), scheduler, counters and param groups, that
 * engine.load_checkpoint of an engine configured that way loads without load_universal.
 * OUT is a new save root (OUT/latest, OUT/<tag>/); the other files of an HF checkpoint-N/
 * folder are carried over. Written whole under a temporary name, then renamed.
 * to_format DCP: OUT is instead the torch Distributed Checkpoint FSDP2 saves from
 * get_state_dict at to_world_size ranks (fp32 weights, exp_avg, exp_avg_sq, step and the
 * param groups' settings keyed by FQN, frozen params and buffers), with zckpt's manifest. */
ZCK_API zck_status zck_reshard(const char *src, const char *out, const zck_reshard_opts *opts);

/* ---- universal checkpoints */
typedef enum zck_universal_format {
  ZCK_UNIVERSAL_DS = 0,       /* DeepSpeed's universal folder, as ds_to_universal.py writes it */
  ZCK_UNIVERSAL_HDF5          /* one HDF5 file (zstd-compressed chunked datasets) */
} zck_universal_format;

typedef struct zck_universal_opts {
  size_t size;                /* sizeof(zck_universal_opts), set by ZCK_UNIVERSAL_OPTS_INIT */
  zck_universal_format format;
  const char *tag;            /* NULL: the tag named by `latest` */
  int inject_missing_state;   /* ds format, stage 1/2: accept a checkpoint without
                                 universal_checkpoint_info, as ds_to_universal's
                                 --inject_missing_state (version 0.4); else refused (DS-76) */
  int level;                  /* hdf5: zstd level 1..22; 0 = 3 */
  uint64_t chunk_bytes;       /* hdf5: uncompressed chunk size; 0 = 1 MiB */
  unsigned threads;           /* 0 = all cores */
  int overwrite;              /* replace an existing output */
  zck_progress_cb progress;
  void *progress_ctx;
  int no_verify;              /* as zck_consolidate_opts.no_verify */
  zck_job_summary *summary;   /* filled on success when not NULL */
} zck_universal_opts;
#define ZCK_UNIVERSAL_OPTS_INIT {sizeof(zck_universal_opts), ZCK_UNIVERSAL_DS, NULL, 0, 0, 0, 0, 0, NULL, NULL, 0, NULL}

/* A DeepSpeed ZeRO-1/2/3 checkpoint (save root with `latest`, tag folder or HF
 * checkpoint-N/) with its optimizer state to a universal checkpoint, in one pass over the
 * rank files (each tensor byte read once, no temporary tree):
 *  - ZCK_UNIVERSAL_DS: OUT is the universal folder DeepSpeed's ds_to_universal.py would
 *    write (zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt, zero/optimizer_state.pt, the
 *    model-states files) and <parent of OUT>/latest_universal, loadable with
 *    "checkpoint": {"load_universal": true}; the folder appears in one rename;
 *  - ZCK_UNIVERSAL_HDF5: OUT is one HDF5 file (formats/hdf5/zck_h5.h describes it),
 *    readable with h5py + hdf5plugin.
 * Nothing is left at OUT on failure. */
ZCK_API zck_status zck_to_universal(const char *src, const char *out, const zck_universal_opts *opts);

/* ---- jobs on every rank of an MPI launch (mpirun / srun)
 * Every rank calls the same job on the same arguments between zck_dist_begin and
 * zck_dist_end: each builds the same plans and copies its share of the bytes; rank 0 alone
 * creates, names and commits the output, and the ranks agree on the outcome. Without a
 * distributed job (never begun, or a world of one) a job runs as one process. */

/* 1 when an MPI launcher started this process (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK
 * is set), in a build with or without MPI; then *size is the world size it announced (0:
 * not said) and *rank this process's rank. Reads the environment only. */
ZCK_API int zck_dist_launched(long *size, long *rank);
/* 1 when this build runs jobs on several ranks (built with MPI); without it, N launched
 * copies of a job would each write the same output. */
ZCK_API int zck_dist_available(void);
/* Joins the ranks of the launch (initializes MPI; collective). *size: the world size; 1
 * means this process is alone and no distributed job began. A rank done with its share
 * waits for the slowest at the next agreement (ZCK_COMM_TIMEOUT_S defaults to a week). */
ZCK_API zck_status zck_dist_begin(int *size);
/* This process's rank in the distributed job; -1 when none runs. */
ZCK_API int zck_dist_rank(void);
/* For a job that one process must do alone (the HDF5 writer): 0 outside a distributed job;
 * in one, 1 on the ranks other than 0 (which return at once) and 0 on rank 0, which then
 * runs the job as a single process while the others wait in zck_dist_finish. */
ZCK_API int zck_dist_solo(void);
/* The path a job should read for the source `in` (collective): *view is NULL when every
 * rank sees the same files under in (or no distributed job runs), else a private folder
 * holding this rank's view of the whole checkpoint (its node's files, and stand-ins for the
 * files on other nodes' local disks); remove it with zck_dist_view_close. */
ZCK_API zck_status zck_dist_view_open(const char *in, char **view);
/* Removes a view folder and frees view (NULL is fine). */
ZCK_API void zck_dist_view_close(char *view);
/* The job ended on this rank with exit code rc and error line msg (or NULL). Waits until
 * every rank has ended; returns the exit code of the lowest rank that failed on its own (0
 * if none) and copies its line into out (out_size bytes; "" if none). */
ZCK_API int zck_dist_finish(int rc, const char *msg, char *out, size_t out_size);
/* Leaves the distributed job: waits for every rank (none exits first, which would have the
 * launcher stop the others), then finalizes MPI. Nothing outside one. */
ZCK_API void zck_dist_end(void);

/* ---- integrity: manifests and verify
 * zckpt writes zckpt-manifest.json LAST into every directory it produces (a DeepSpeed tag
 * folder, an HF output folder): its presence says the directory is complete; it lists
 * every file (size, XXH3-64) and every tensor (file, name, dtype, shape, byte range,
 * XXH3-64). Verify checks structure everywhere and checksums where a manifest exists. */
/* ---- manifests */

typedef struct zck_manifest_opts {
  unsigned version;           /* ZCK_MANIFEST_OPTS_VERSION */
  const char *kind;           /* NULL: detect; "deepspeed", "safetensors", "universal", "torch", "other" */
  unsigned threads;           /* 0 = all cores */
  uint64_t chunk_size;        /* bytes per chunk hash; 0 = 64 MiB */
} zck_manifest_opts;
#define ZCK_MANIFEST_OPTS_VERSION 1
#define ZCK_MANIFEST_OPTS_INIT {ZCK_MANIFEST_OPTS_VERSION, NULL, 0, 0}

/* Describes and hashes every file of dir (recursively) and writes dir/zckpt-manifest.json
 * atomically; call it last, when every other file of dir is final. For a DeepSpeed tag
 * folder, the layout is recorded (the folder must open with the DeepSpeed reader). */
ZCK_API zck_status zck_manifest_write_dir(const char *dir, const zck_manifest_opts *opts);
/* Marks dir as being written in place (dir/.zckpt-partial), for writers that do not build
 * their output under a temporary name; zck_manifest_write_dir removes the mark. */
ZCK_API zck_status zck_manifest_mark_partial(const char *dir);
/* For readers of zckpt-written checkpoints: ZCK_OK when dir holds a valid manifest whose
 * files exist with the listed sizes, or no manifest and no partial mark (a checkpoint not
 * written by zckpt); else ZCK_ERR_DAMAGED "DIR: incomplete checkpoint: ..." (or the
 * manifest's parse error). force accepts anyway. Stats only, reads no data. */
ZCK_API zck_status zck_manifest_check_complete(const char *dir, int force);

/* ---- verify */

typedef struct zck_verify_opts {
  unsigned version;           /* ZCK_VERIFY_OPTS_VERSION */
  const char *tag;            /* DeepSpeed: NULL = the tag named by `latest` */
  int force;                  /* check a folder marked incomplete (.zckpt-partial, no manifest)
                                 without reporting it as damage */
  int skip_data;              /* structure only: read no tensor data (no CRCs, no checksums) */
  unsigned threads;           /* 0 = all cores */
  zck_progress_cb progress;   /* bytes read so far / in total */
  void *progress_ctx;
} zck_verify_opts;
#define ZCK_VERIFY_OPTS_VERSION 1
#define ZCK_VERIFY_OPTS_INIT {ZCK_VERIFY_OPTS_VERSION, NULL, 0, 0, 0, NULL, NULL}

typedef enum zck_verify_result {
  ZCK_VERIFY_CLEAN = 0,       /* every check passed (exit 0) */
  ZCK_VERIFY_DAMAGED,         /* damage found (exit 3) */
  ZCK_VERIFY_UNCHECKED,       /* no damage found, but something could not be checked (exit 1) */
} zck_verify_result;

typedef enum zck_verify_severity {
  ZCK_VERIFY_NOTE = 0,        /* what was (not) checked */
  ZCK_VERIFY_WARNING,         /* suspicious, not damage (extra files, spec "Warn" items) */
  ZCK_VERIFY_DAMAGE,
  ZCK_VERIFY_UNCHECKABLE,     /* could not be checked (I/O error, unsupported format) */
} zck_verify_severity;

typedef struct zck_verify_finding {
  zck_verify_severity severity;
  const char *check;          /* "structure", "zip-crc", "size", "file-xxh3", "chunk-xxh3",
                                 "tensor-xxh3", "tensor-range", "missing-file", "extra-file",
                                 "layout", "manifest", "incomplete", "read", "coverage" */
  const char *file;           /* the file's path, NULL when about the whole checkpoint */
  const char *tensor;         /* NULL when not about one tensor */
  int64_t offset;             /* absolute byte offset in the file, -1 when unknown */
  uint64_t length;            /* bytes concerned, 0 when unknown */
  const char *message;        /* one line, "FILE: what is wrong" */
} zck_verify_finding;

typedef struct zck_verify_report {
  const char *path;           /* as given */
  const char *kind;           /* "deepspeed", "safetensors", "torch", "universal", "directory" */
  const char *detail;         /* e.g. "tag global_step2, stage 2, world size 2, bfloat16"; "" if none */
  const char *dir;            /* the folder the files are relative to, where the manifest is
                                 (or would go): a DeepSpeed tag folder, the HF folder, the
                                 file's folder; NULL if PATH could not be resolved */
  int single_file;            /* PATH is one file (only it was checked) */
  const char *manifest;       /* the manifest checked against, NULL when there is none */
  zck_verify_result result;
  uint64_t files;             /* files checked */
  uint64_t bytes;             /* bytes read and hashed */
  uint64_t records;           /* zip records whose CRC-32 was checked */
  uint64_t tensors;           /* tensors checked against the manifest */
  size_t n_findings;
  const zck_verify_finding *findings;
} zck_verify_report;

/* Verifies path. Returns ZCK_OK (clean), ZCK_ERR_DAMAGED (damage found) or the status of
 * the first thing that could not be checked (zck_last_error() says what). *out receives
 * the report in every case but misuse and out of memory (then NULL); free it with
 * zck_verify_report_free. */
ZCK_API zck_status zck_verify(const char *path, const zck_verify_opts *opts, zck_verify_report **out);
ZCK_API void zck_verify_report_free(zck_verify_report *r);
/* Prints the report on out (a FILE *): text, one finding per line, or JSON. */
ZCK_API zck_status zck_verify_report_print(const zck_verify_report *r, int json, void *out);
/* After a clean zck_verify of a folder without a manifest (checkpoints written by other
 * tools): writes r->dir/zckpt-manifest.json listing the files that verify checked (read and
 * found sound, and an HF index checked against its shards), nothing else: a file the folder
 * holds beside them (notes, another tool's files) is no part of what was verified, and a
 * manifest's files are required (a listed file gone makes the checkpoint incomplete).
 * ZCK_ERR_INVALID_ARG when r is not clean, is of one file, or the folder has a manifest. */
ZCK_API zck_status zck_verify_write_manifest(const zck_verify_report *r, const zck_manifest_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* ZCK_H */
