/* zck_h5.h: HDF5 files of zstd-compressed chunked datasets (safetensors-and-hdf5.md §3),
 * written from many threads and read by element range; and zckpt's universal container.
 *
 * Datasets as written here:
 *   - one dataset per tensor, full shape, little-endian file types; bfloat16, bool and
 *     float8 are stored as U16LE / U8LE, float16 as an IEEE half float type; every dataset
 *     has a `dtype` text attribute with torch's spelling ("bfloat16", "float32", ...);
 *   - chunk shape (1, ..., 1, c, D[k+1], ..., D[n-1]): every chunk is one contiguous run of
 *     the row-major flattening, so an executor writing element ranges fills whole chunks;
 *   - filter 32015 (zstd), H5Z_FLAG_MANDATORY, cd_values = {level}. Each chunk is ONE zstd
 *     frame recording its content size (what hdf5plugin's decoder needs) and ending with
 *     the frame's XXH64 checksum (ZSTD_c_checksumFlag), compressed on the thread that
 *     completed it and stored with H5Dwrite_chunk (no filter pipeline). A chunk is a zstd
 *     frame even when it does not shrink, so every chunk is checksummed: a damaged chunk
 *     fails to decompress, here (one line naming file, dataset and chunk) and in
 *     hdf5plugin. Files written before the checksums (frames without one) still read;
 *   - with compact_bytes set (the universal container: 16 KiB), a tensor of one chunk and
 *     at most that many bytes is a compact dataset instead: its bytes raw in its object
 *     header (no chunk index, no filter, nothing compressed), covered by the checksum
 *     table; h5py and libhdf5 read it as any other dataset;
 *   - 0-dim and empty tensors are contiguous datasets (HDF5 cannot chunk them, so no
 *     filter): a 0-dim one carries the XXH3 of its bytes in a uint64 attribute
 *     ZCK_H5_XXH3_ATTR, checked when it is read (absent in older files: not checked);
 *   - a checksum table (h5_checksums.h): /zckpt_checksums, uint64 [n], sorted, the XXH3-64 of
 *     every piece of every dataset as written (a piece is a run of the flattening: as
 *     written, one chunk), each seeded with its dataset's path, dtype, shape and the piece's
 *     index; root attributes zckpt_checksums_xxh3 (XXH3-64 of the table's bytes) and
 *     zckpt_checksum_piece_bytes. Every range read of a file that has it reads the pieces it
 *     touches whole and looks each up: a dataset valid as HDF5 but with other contents (two
 *     swapped by name, one edited in place through the filter, one made again) is DAMAGED,
 *     one line naming the file, dataset and piece. Files without it (older, or h5py's)
 *     read as before;
 *   - text attributes are scalar variable-length UTF-8 strings, numbers scalar attributes;
 *   - the library's default (earliest) file format, so older h5py/HDF5 builds open it; its
 *     metadata carries no checksums: the data is covered by the chunks' zstd checksums and
 *     the 0-dim datasets' XXH3, the root's attributes (variable-length strings in the global
 *     heap) by their digest (ZCK_H5_ATTRS_XXH3_ATTR). Chunk index B-tree nodes hold 8
 *     entries (istore_k 4, recorded in a version 1 superblock) instead of 64: every dataset
 *     gets one node, and most of a universal container's datasets are one chunk;
 *   - a dataset of one chunk is created at the commit, its chunk written at once (it waits
 *     in memory, compressed, up to 64 MiB of them): libhdf5's cost is per object, and this
 *     creates each once and never reopens it.
 * The output file is written under a temporary name and renamed at commit.
 *
 * Reading: datasets written by anyone (h5py + hdf5plugin included). An element range of
 * the row-major flattening is cut into hyperslab boxes; only the chunks those boxes touch
 * are read (H5Dread_chunk) and decompressed here, each checked (one zstd frame of the
 * stated size, the chunk size limit, the filters, the `dtype` attribute against the stored
 * type). Unknown filters are refused, never returned raw.
 *
 * HDF5 (1.10, serial build) is not thread-safe: every HDF5 call in zckpt goes through one
 * process-wide lock; compression and decompression run outside it.
 */
#ifndef ZCK_H5_H
#define ZCK_H5_H

#include "exec.h"
#include "model.h"

#include <stdbool.h>

#define ZCK_H5_ZSTD_FILTER 32015
/* uint64 attribute of a contiguous (unfiltered) dataset: the XXH3 of its stored bytes */
#define ZCK_H5_XXH3_ATTR "zckpt_xxh3"
/* uint64 attribute of the root group: the sum over the root's other attributes of
 * XXH3("." "\0" name "\0" value) (a text's bytes, else the stored values). Text attributes
 * live in HDF5's global heap, which has no checksum, and the root's hold what the container
 * is (param names, shapes, groups, ds_config); zck_h5_check_attrs checks this digest when
 * the file has it (files not written by zckpt, or before it, do not): `zckpt verify` does.
 * Only the root: a dataset's `dtype` text is checked against its stored type (H-08), and
 * tools that add or remove datasets keep the digest valid. A tool that rewrites a root
 * attribute must rewrite the digest or delete it. */
#define ZCK_H5_ATTRS_XXH3_ATTR "zckpt_attrs_xxh3"
#define ZCK_H5_MAX_DIMS ZCK_MAX_DIMS

// ---- writer

typedef struct zck_h5_writer zck_h5_writer;

typedef struct zck_h5_write_opts {
  int level;               /* zstd level 1..22; 0: 3 (hdf5plugin's default) */
  uint64_t chunk_bytes;    /* target uncompressed chunk size; 0: 1 MiB */
  bool overwrite;          /* replace an existing file */
  /* a dataset of at most this many bytes (and one chunk) is stored in the compact layout:
   * its bytes in its object header, no chunk index, no filter (HDF5 reads it as any other;
   * the checksum table covers it). 0: none; at most ZCK_H5_COMPACT_MAX */
  uint64_t compact_bytes;
} zck_h5_write_opts;
#define ZCK_H5_WRITE_OPTS_INIT {0, 0, false, 0}
/* libhdf5 keeps a compact dataset's bytes in one 64 KiB object header message */
#define ZCK_H5_COMPACT_MAX ((uint64_t)48 << 10)

/* Creates PATH under a temporary name. EXISTS if PATH exists (unless overwrite). */
zck_status zck_h5_writer_create(const char *path, const zck_h5_write_opts *o, zck_h5_writer **out);
/* Creates dataset `path` ("/params/x/fp32"; missing groups are created) and returns a
 * callback store taking element ranges of the row-major flattening, in any order, from
 * any thread; a range must not be written twice. The store stays valid until free (or
 * until zck_h5_writer_settle, once its data is all written). */
zck_status zck_h5_writer_dataset(zck_h5_writer *w, const char *path, zck_dtype dtype, int ndim,
                                 const int64_t *shape, zck_store *store);
/* Creates a group (and its parents) if missing. */
zck_status zck_h5_writer_group(zck_h5_writer *w, const char *path);
/* Attributes of an object ("/" is the file) . */
zck_status zck_h5_writer_attr_str(zck_h5_writer *w, const char *obj, const char *key, const char *value);
zck_status zck_h5_writer_attr_i64(zck_h5_writer *w, const char *obj, const char *key, int64_t value);
zck_status zck_h5_writer_attr_f64(zck_h5_writer *w, const char *obj, const char *key, double value);
/* Makes every dataset whose data is all written (one-chunk ones wait for this or the
 * commit, h5_write_objects.c) and keeps of each only its checksums: the stores of those
 * datasets are spent. A caller filling the file batch by batch calls it after each, so the
 * writer holds a batch's datasets, not the file's (100k params: 300k datasets). */
zck_status zck_h5_writer_settle(zck_h5_writer *w);
/* Fails if some dataset was not completely written; else closes, fsyncs, renames. */
zck_status zck_h5_writer_commit(zck_h5_writer *w);
/* An uncommitted file is removed. NULL is fine. */
void zck_h5_writer_free(zck_h5_writer *w);

// ---- reader

typedef struct zck_h5_file zck_h5_file;
typedef struct zck_h5_dataset zck_h5_dataset;

typedef struct zck_h5_dataset_info {
  zck_dtype dtype;         /* after the `dtype` attribute (bfloat16 over U16, ...) */
  int ndim;
  int64_t shape[ZCK_H5_MAX_DIMS];
  uint64_t numel;
  bool chunked;
  int64_t chunk[ZCK_H5_MAX_DIMS];
  bool zstd;               /* filter 32015 in the pipeline */
  int zstd_level;          /* its cd_values[0], or -1 */
  unsigned zstd_flags;     /* H5Z_FLAG_* of that filter */
} zck_h5_dataset_info;

zck_status zck_h5_open(const char *path, zck_h5_file **out);
/* zck_h5_open, but the forked metadata walk opens nothing the links of the root's group
 * `lazy` lead to (the container's "params": 100k groups, 300k datasets, nearly all of the
 * walk's cost): asking anything at or below one of those (an attribute, a dataset, a
 * listing, whether a path exists) walks the file again in full first, once. For readers
 * that need the rest of the file only. NULL lazy: zck_h5_open. */
zck_status zck_h5_open_lazy(const char *path, const char *lazy, zck_h5_file **out);
/* DAMAGED when the file records a digest of its root attributes (ZCK_H5_ATTRS_XXH3_ATTR)
 * they do not match; OK when it records none. Reads every root attribute. */
zck_status zck_h5_check_attrs(zck_h5_file *f);
/* Whether f has a checksum table (loaded and checked at open): every range read of its
 * datasets is then checked against it (h5_checksums.h). */
bool zck_h5_has_checksums(const zck_h5_file *f);
void zck_h5_close(zck_h5_file *f);
const char *zck_h5_name(const zck_h5_file *f);
/* true if an object (group or dataset) exists at path. */
bool zck_h5_exists(zck_h5_file *f, const char *path);
/* Names of the links of a group, in name order (caller frees each and the array). */
zck_status zck_h5_list(zck_h5_file *f, const char *group, char ***names, size_t *n);

/* Opens a dataset and validates its type, `dtype` attribute (H-08), filters (H-05) and
 * chunk size (H-04). Datasets must be closed before the file. */
zck_status zck_h5_dataset_open(zck_h5_file *f, const char *path, zck_h5_dataset **out);
void zck_h5_dataset_close(zck_h5_dataset *d);
const zck_h5_dataset_info *zck_h5_dataset_info_of(const zck_h5_dataset *d);
/* Elements [first, first + count) of the row-major flattening into dst (count * dtype
 * size bytes). Reads and decompresses only the chunks holding some of them. Thread-safe. */
zck_status zck_h5_dataset_read(zck_h5_dataset *d, void *dst, uint64_t first, uint64_t count);
/* The dataset as a read store for copy plans (valid while d is open). */
zck_store zck_h5_dataset_store(zck_h5_dataset *d);

/* Attributes: NOT_FOUND when absent. Text may be variable- or fixed-length (H-07);
 * *out is malloc'd. Numbers: any integer / float scalar (or 1-element) attribute. */
zck_status zck_h5_attr_str(zck_h5_file *f, const char *obj, const char *key, char **out);
zck_status zck_h5_attr_i64(zck_h5_file *f, const char *obj, const char *key, int64_t *out);
zck_status zck_h5_attr_f64(zck_h5_file *f, const char *obj, const char *key, double *out);

// ---- the zckpt universal container (one file per checkpoint)
/*
 *   /                          attributes:
 *       zckpt_format = "zckpt-universal"   zckpt_format_version = 2 (1: before the
 *                        checksum table; a version 2 file without it is refused)
 *       stage, world_size, global_steps, skipped_steps, global_samples (int64)
 *       step (float64), step_is_tensor (int64 0/1)
 *       ds_version, lp_dtype, master_dtype, state_dtype, source, tag (text)
 *       param_names      JSON list: trainable params in the source's flat order
 *       param_shapes     JSON object name -> [dims]
 *       param_groups     JSON list of {"params": [names], "hyperparameters": {...}}
 *       tied_parameters  JSON object alias -> source
 *       frozen_parameters, buffer_names   JSON lists
 *       unsaved_tied_parameters  JSON object alias -> source: shared_params entries whose
 *                        source was not saved (exclude_frozen_parameters, HF + PEFT's tied
 *                        head); no parameter here, kept for a reshard's shared_params
 *       exclude_frozen_parameters  int64 0/1: the source was saved so (a reshard then keeps
 *                        frozen_param_shapes / _fragments None). Both optional (absent in
 *                        containers written before them: {} and 0)
 *       ds_config        JSON of the source's ds_config (inf/nan as strings)
 *       autoep_layers    JSON list: the ds_autoep_layers of a DeepSpeed AutoEP (expert-parallel MoE)
 *                        source's rank 0 (module_path, expert_key_prefix, num_experts, ep_size, ...;
 *                        its expert params are /params/<prefix>.w{1,2,3} at the full shape
 *                        [experts, ...], the router alias not kept). Absent for other sources
 *       part_dtypes      JSON object {"fp32": dtype, "exp_avg": .., "exp_avg_sq": ..}: the
 *                        dtype of every dataset of that part, for each part whose datasets
 *                        share one (optional: absent before it; a reader checks it against
 *                        the datasets it opens, and describes the params from it)
 *   /params/<name>/fp32, /params/<name>/exp_avg, /params/<name>/exp_avg_sq
 *                              full shape, master / optimizer-state dtype
 *   /frozen/<name>             frozen params, 16-bit training dtype
 *   /buffers/<name>            persistent buffers, their dtype
 *   /resume_state              uint8 [n]: a protocol-2 pickle of a dict holding what
 *                              DeepSpeed reads back beyond the tensors: the source's
 *                              ds_config, lr_scheduler, loss_scaler (None when absent),
 *                              module_metadata (the `module` BUILD state or None),
 *                              clip_grad, round_robin_gradients, parameter_alignment,
 *                              sub_group_size (0: default). Optional: containers written
 *                              before it reshard with DeepSpeed's defaults for those.
 *   /side_files/<name>         uint8 [size]: every regular file of the source's save root
 *                              besides DeepSpeed's own (`latest`, `latest_universal`, the tag
 *                              folders, dot files), byte for byte: an HF checkpoint-N/'s
 *                              rng_state_<r>.pth, trainer_state.json, scheduler.pt, ...; an
 *                              Accelerate folder's random_states_<r>.pkl. A reshard restores
 *                              them as a reshard of the source carries them over. Optional.
 *   /zckpt_checksums           the checksum table (above). Its entries are exactly the
 *                              pieces of the datasets above: one deleted (/resume_state, a
 *                              side file) or added (a side file) is refused at open.
 * The `tag` attribute (the source's tag folder) names the reshard's tag folder, as a
 * reshard of the source keeps it (Accelerate loads its checkpoints by the tag
 * "pytorch_model"); containers without it get global_step<global_steps>.
 */
#define ZCK_H5U_FORMAT "zckpt-universal"
/* 2: the file has its checksum table and root attribute digest (a container of version 2
 * without them is refused, never read as one written before them) */
#define ZCK_H5U_VERSION 2
#define ZCK_H5U_RESUME_STATE "/resume_state"
#define ZCK_H5U_RESUME_STATE_MAX ((uint64_t)64 << 20)   /* bytes a reader accepts */
#define ZCK_H5U_SIDE_FILES "/side_files"
/* tensors of at most this many bytes are stored compact (zck_h5_write_opts.compact_bytes):
 * most of a MoE model's 100k tensors (biases, norms, router rows) are a few hundred bytes,
 * for which a chunk index and a zstd frame cost more than they hold */
#define ZCK_H5U_COMPACT_BYTES ((uint64_t)16 << 10)

typedef enum zck_h5u_part {
  ZCK_H5U_FP32 = 0, ZCK_H5U_EXP_AVG, ZCK_H5U_EXP_AVG_SQ, ZCK_H5U_FROZEN, ZCK_H5U_PART_COUNT
} zck_h5u_part;

/* Dataset path of param `name` in part (caller frees). */
char *zck_h5u_path(zck_h5u_part part, const char *name);
char *zck_h5u_buffer_path(const char *name);

/* A universal container described as a manifest plus, per part, a whole-tensor layout
 * over the manifest's params (store i = the i-th param that has the dataset) and stores
 * reading the datasets by range. */
typedef struct zck_h5u zck_h5u;

typedef struct zck_h5u_info {
  int stage;
  uint32_t world_size;
  int64_t global_steps, skipped_steps, global_samples;
  double step;
  bool step_is_tensor;
  const char *ds_version;      /* NULL if absent */
  const char *ds_config_json;  /* NULL if absent */
  const char *tag;             /* the source's tag folder name; NULL if absent or empty */
  size_t n_side_files;         /* datasets under /side_files */
  bool exclude_frozen;         /* the source was saved with exclude_frozen_parameters */
  const char *const *unsaved_ties;   /* [2 * n]: alias, source of tied aliases whose source
                                        was not saved (zck_ds_unsaved_tie), in source order */
  size_t n_unsaved_ties;
  const char *autoep_layers_json;    /* a DeepSpeed AutoEP source's ds_autoep_layers; NULL for others */
} zck_h5u_info;

zck_status zck_h5u_open(const char *path, zck_h5u **out);
/* The same over a file already open in full (zck_h5_open), so that its metadata is read
 * once; takes f, closed on failure too. */
zck_status zck_h5u_open_file(zck_h5_file *f, zck_h5u **out);
/* The container described, not opened for reading (inspect): its model, info and layouts
 * from its root attributes (digest checked), the links of /params and its checksum table,
 * opening none of the 100k groups under /params nor their datasets when part_dtypes gives
 * every trainable part's dtype (else as zck_h5u_open). Every check of zck_h5u_open is made
 * but those of what lies inside a param's group (its datasets' presence, dtype, shape,
 * filters: checked by every reader that opens them): each trainable param's group must be
 * linked, the frozen params, buffers, side files, /resume_state and the checksum table are
 * opened as zck_h5u_open opens them, and the count of checksum pieces is checked (the
 * trainable ones counted from param_shapes and part_dtypes). zck_h5u_get then gives the
 * trainable parts' layouts with NULL stores. */
zck_status zck_h5u_describe(const char *path, zck_h5u **out);
void zck_h5u_close(zck_h5u *u);
const zck_h5u_info *zck_h5u_info_of(const zck_h5u *u);
/* The container's file, open while u is (its metadata was read once, at zck_h5u_open). */
zck_h5_file *zck_h5u_file(const zck_h5u *u);
const zck_model *zck_h5u_model(const zck_h5u *u);
/* NOT_FOUND when the container has no such part. */
zck_status zck_h5u_get(const zck_h5u *u, zck_h5u_part part, const zck_layout **layout, const zck_store **stores);
/* Buffers: a whole layout over the buffer index space; NULL layout when there are none. */
void zck_h5u_buffers(const zck_h5u *u, const zck_layout **layout, const zck_store **stores);

/* UNSUPPORTED, one line naming the container, when it holds an AutoEP (expert-parallel MoE) checkpoint
 * (autoep_layers) or a deepspeed.moe one (a param group with `moe: true`): `job` does not write their
 * expert layouts from it. ZCK_OK for other containers. */
zck_status zck_h5u_moe_refuse(const zck_h5u *u, const char *job);

/* Side file i < n_side_files: its name (a plain file name, checked at open: no '/', not a
 * dot file, not `latest` / `latest_universal`), and its bytes written to path (temporary
 * name, then rename), read in bounded pieces. */
const char *zck_h5u_side_file_name(const zck_h5u *u, size_t i);
zck_status zck_h5u_side_file_write(const zck_h5u *u, size_t i, const char *path);
/* Whether the container can hold a side file of this name (what the reader accepts). */
bool zck_h5u_side_name_ok(const char *name);
/* zero_to_fp32's output recipe (deepspeed.h zck_ds_outputs) for the checkpoint the
 * container was made from (h5_outputs.c): consolidating by it through the parts above
 * gives what consolidating that checkpoint gives. *out: free() it; its strings and shapes
 * borrow from u. */
struct zck_ds_output;
zck_status zck_h5u_outputs(const zck_h5u *u, struct zck_ds_output **out, size_t *n);

#endif
