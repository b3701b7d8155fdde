/* safetensors.h: safetensors files and Hugging Face sharded checkpoints.
 *
 * File layout (as the safetensors library writes and reads it):
 *
 *   0 .. 8        N, u64 little-endian: the header length (N <= 100,000,000)
 *   8 .. 8+N      UTF-8 JSON object, padded with spaces (the reference pads to a multiple of 8):
 *                 {"__metadata__": {str: str}, "NAME": {"dtype": "F32", "shape": [..],
 *                  "data_offsets": [BEGIN, END]}, ...}
 *   8+N .. EOF    tensor bytes, little-endian C order; [BEGIN, END) relative to 8+N. The ranges,
 *                 sorted, tile the whole data section from 0 with no hole or overlap.
 *
 * Reader (zck_st_open*): validates exactly as the reference (SafeTensors::read_metadata and
 * Metadata::validate) plus duplicate keys, and never loads tensor data: an entry is a
 * (dtype, shape, absolute file offset, byte count), read in place with zck_st_read or by
 * whoever holds the source. JSON is parsed by a strict parser of our own (st_json.c), not
 * cJSON: offsets and dims are u64 and must be rejected when they are floats, exponents or
 * above 2^64, which a double-based parser cannot tell.
 *
 * Writer (zck_st_writer_*): reserve-then-fill. Add tensors (name, dtype, shape) and metadata,
 * call zck_st_writer_layout: tensors are ordered as the reference writes them (dtype
 * descending in the Rust enum order, then name), the header is the reference's compact JSON
 * ("__metadata__" first, "format": "pt" first inside it), padded with spaces to a multiple
 * of 8. Every tensor's absolute file offset is then known, so any thread can pwrite its
 * bytes; zck_st_writer_commit fsyncs and renames into place; freeing an uncommitted writer
 * leaves nothing behind.
 *
 * HF sharding (zck_hf_*): the shard assignment of huggingface_hub's
 * split_state_dict_into_shards_factory (greedy in insertion order; a tensor larger than the
 * limit gets its own shard appended at once), files "model-00001-of-0000N.safetensors" plus
 * "model.safetensors.index.json", or one "model.safetensors" when everything fits in one
 * shard. The whole output directory appears atomically (zck__outdir). The checkpoint reader
 * opens a directory, an index file or a single file, validates the index and presents the union of the tensors of every shard the index
 * names, as transformers loads them (a tensor missing from the weight_map included).
 *
 * Errors are one line: "FILE: tensor NAME: what is wrong" (names with control characters are
 * escaped in messages). Warnings (no "__metadata__", "format" not "pt", index total_size not
 * matching, ...) do not fail an open; they are kept on the object.
 */
#ifndef ZCK_SAFETENSORS_H
#define ZCK_SAFETENSORS_H

#include "io.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- dtypes
 * The Rust `enum Dtype`, in its declaration order (increasing alignment): the writer sorts
 * tensors by this value descending. */
typedef enum zck_st_dtype {
  ZCK_ST_BOOL, ZCK_ST_F4, ZCK_ST_F6_E2M3, ZCK_ST_F6_E3M2, ZCK_ST_U8, ZCK_ST_I8,
  ZCK_ST_F8_E5M2, ZCK_ST_F8_E4M3, ZCK_ST_F8_E8M0, ZCK_ST_F8_E4M3FNUZ, ZCK_ST_F8_E5M2FNUZ,
  ZCK_ST_I16, ZCK_ST_U16, ZCK_ST_F16, ZCK_ST_BF16, ZCK_ST_I32, ZCK_ST_U32, ZCK_ST_F32,
  ZCK_ST_C64, ZCK_ST_F64, ZCK_ST_I64, ZCK_ST_U64,
  ZCK_ST_DTYPE_COUNT
} zck_st_dtype;

#define ZCK_ST_MAX_HEADER 100000000ull   /* MAX_HEADER_SIZE of the reference */

/* "F32", "BF16", ... (exact spelling, case-sensitive). */
const char *zck_st_dtype_name(zck_st_dtype t);
/* Parses a dtype string; false if unknown. */
bool zck_st_dtype_parse(const char *s, size_t len, zck_st_dtype *out);
/* Bits per element: 4 (F4), 6 (F6_*), 8, 16, 32 or 64. */
unsigned zck_st_dtype_bits(zck_st_dtype t);
/* The zckpt element type, or ZCK_DTYPE_INVALID for F4, F6_*, F8_E8M0, F8_*FNUZ. */
zck_dtype zck_st_dtype_to_zck(zck_st_dtype t);
/* false when safetensors has no such type (ZCK_C128, ZCK_DTYPE_INVALID). */
bool zck_st_dtype_from_zck(zck_dtype t, zck_st_dtype *out);

/* ---- reader */
typedef struct zck_st_tensor {
  const char *name;        /* UTF-8, NUL-terminated (a name containing U+0000 is rejected) */
  zck_st_dtype st_dtype;
  zck_dtype dtype;         /* ZCK_DTYPE_INVALID when zckpt has no equivalent (see above) */
  int ndim;                /* 0 for a scalar */
  const uint64_t *shape;   /* ndim dims; NULL when ndim == 0 */
  uint64_t numel;          /* product of shape (1 for a scalar) */
  uint64_t begin, end;     /* data_offsets as in the header, relative to the data section */
  uint64_t offset;         /* absolute file offset of the first byte: data_start + begin */
  uint64_t nbytes;         /* end - begin == numel * bits / 8 */
} zck_st_tensor;

typedef struct zck_st_file zck_st_file;

/* Opens and validates a file. Reads the first 8 bytes and the header, nothing else. */
zck_status zck_st_open(const char *path, zck_st_file **out);
/* Same over a source the caller keeps alive until zck_st_close (memory sources: fuzzers). */
zck_status zck_st_open_source(const zck__source *src, zck_st_file **out);
void zck_st_close(zck_st_file *f);

/* The n bytes of text are one JSON value as Python's json module writes it (NaN, Infinity and -Infinity included),
 * in UTF-8, nested at most 128 deep (the pull parser of safetensors headers and HF indexes, with Python's three
 * literals); else ZCK_ERR_DAMAGED: "NAME: invalid JSON at byte N: what". For a side file taken along as it is. */
zck_status zck__json_check(const char *name, const void *text, size_t n);

const char *zck_st_path(const zck_st_file *f);          /* source name, for messages */
const zck__source *zck_st_source(const zck_st_file *f);
uint64_t zck_st_header_len(const zck_st_file *f);       /* N */
uint64_t zck_st_data_start(const zck_st_file *f);       /* 8 + N */
uint64_t zck_st_file_size(const zck_st_file *f);

/* Tensors in header (JSON key) order. */
size_t zck_st_count(const zck_st_file *f);
const zck_st_tensor *zck_st_tensor_at(const zck_st_file *f, size_t i);
/* Exact-name lookup (hash table); NULL if absent. */
const zck_st_tensor *zck_st_find(const zck_st_file *f, const char *name);
/* Reads n bytes at byte `off` of the tensor's data into dst (pread in place; ranges past the
 * tensor are API misuse and abort). Safe from several threads at once. */
zck_status zck_st_read(const zck_st_file *f, const zck_st_tensor *t, void *dst, uint64_t off, uint64_t n);

/* "__metadata__": whether the header had one, its entries in file order, lookup by key. */
bool zck_st_has_metadata(const zck_st_file *f);
size_t zck_st_metadata_count(const zck_st_file *f);
void zck_st_metadata_at(const zck_st_file *f, size_t i, const char **key, const char **value);
const char *zck_st_metadata_get(const zck_st_file *f, const char *key);   /* NULL if absent */

/* Non-fatal findings of the open (no "__metadata__", or "format" not in pt/tf/flax/mlx),
 * one line each, "FILE: ...". */
size_t zck_st_warning_count(const zck_st_file *f);
const char *zck_st_warning_at(const zck_st_file *f, size_t i);

/* ---- writer */
typedef struct zck_st_writer zck_st_writer;

/* A writer with metadata {"format": "pt"}. */
zck_status zck_st_writer_new(zck_st_writer **out);
/* Adds (or replaces the value of) a metadata entry; entries keep insertion order after
 * "format". Values are strings, as the format requires. */
zck_status zck_st_writer_set_metadata(zck_st_writer *w, const char *key, const char *value);
/* The header's style, before layout:
 *  - REFERENCE (the default): as the reference serializer writes it (above);
 *  - TORCH_DCP: as torch's consolidate_safetensors_files writes it (torch 2.15
 *    _consolidate_hf_safetensors.py _write_metadata): tensors in add order, data back to back
 *    in that order, the JSON of Python's json.dumps (separators ", " and ": ", non-ASCII and
 *    control characters escaped as \uXXXX) of {NAME: {"shape": [..], "dtype": "F32",
 *    "data_offsets": [BEGIN, END]}, ...}, no "__metadata__" (setting it drops every
 *    metadata entry), no padding: the data starts at 8 + N whatever N is. */
typedef enum zck_st_header_style { ZCK_ST_HEADER_REFERENCE = 0, ZCK_ST_HEADER_TORCH_DCP } zck_st_header_style;
void zck_st_writer_set_style(zck_st_writer *w, zck_st_header_style style);
/* Removes every metadata entry, "format" included; with none, the header has no
 * "__metadata__" at all (as save_file(metadata=None)). For faithful copies of existing
 * files: set the entries again in the source's order to reproduce its header exactly. */
void zck_st_writer_clear_metadata(zck_st_writer *w);
/* Adds a tensor; *index (optional) is its index for zck_st_writer_tensor, in add order.
 * Fails on a duplicate name, "__metadata__", a name that is not UTF-8, or numel*bits not a
 * multiple of 8. */
zck_status zck_st_writer_add(zck_st_writer *w, const char *name, zck_st_dtype dtype, int ndim,
                             const uint64_t *shape, size_t *index);
/* Orders the tensors and builds the header; no more adds after this. Fails if the header
 * would exceed ZCK_ST_MAX_HEADER. */
zck_status zck_st_writer_layout(zck_st_writer *w);
/* After layout: the tensor added as `index` (offset = absolute file offset). */
const zck_st_tensor *zck_st_writer_tensor(const zck_st_writer *w, size_t index);
size_t zck_st_writer_count(const zck_st_writer *w);
uint64_t zck_st_writer_file_size(const zck_st_writer *w);
/* The header bytes (8-byte length + padded JSON), after layout. */
const uint8_t *zck_st_writer_header(const zck_st_writer *w, size_t *len);
/* After layout: creates the output (temporary name beside `path`), writes the header and sets
 * the file size, so tensor data can be written in any order by any thread. */
zck_status zck_st_writer_open(zck_st_writer *w, const char *path);
int zck_st_writer_fd(const zck_st_writer *w);
/* pwrite of n bytes at byte `off` of tensor `index` (bounds are API misuse). Thread-safe. */
zck_status zck_st_writer_write(zck_st_writer *w, size_t index, const void *data, uint64_t off, uint64_t n);
/* fsync + rename into place. */
zck_status zck_st_writer_commit(zck_st_writer *w);
/* Frees; an opened but uncommitted output is removed. Accepts NULL. */
void zck_st_writer_free(zck_st_writer *w);

/* Manifest hashes as the file is written (lib/stream_hash.h), so that no manifest reads it
 * back. After layout, before open: the header is known, each tensor is a region the copy
 * fills whole (budget: memory for pieces written ahead of the hash cursor, shared; it
 * outlives the writer's commit). Then every tensor's data goes through
 * zck_st_writer_store, and after commit zck_st_writer_known adds the file's hashes to k
 * as relpath (a file the stream could not hash is left out: the manifest reads it). */
struct zck__shash_budget;
struct zck__manifest_known;
struct zck_store;
zck_status zck_st_writer_hash(zck_st_writer *w, struct zck__shash_budget *budget);
/* After open: a target store for tensor `index`'s data (count elements of dtype), named
 * `name` in messages: an FD store, or with hashing one that feeds the hashes. */
struct zck_store zck_st_writer_store(zck_st_writer *w, size_t index, zck_dtype dtype, uint64_t numel, const char *name);
zck_status zck_st_writer_known(zck_st_writer *w, const char *relpath, struct zck__manifest_known *k, size_t *cap);
/* Bytes the caller wrote into the file itself (pwrite at absolute offset off, tensor data
 * only) for the hashes; no-op without hashing. */
void zck_st_writer_wrote(zck_st_writer *w, uint64_t off, const void *bytes, uint64_t n);

/* ---- Hugging Face sharding */

#define ZCK_HF_DEFAULT_MAX_SHARD 5000000000ull   /* "5GB" */

/* The shard assignment of split_state_dict_into_shards_factory for tensors of the given
 * storage sizes, in order: shard_of[i] receives a 0-based shard index; returns the number of
 * shards in *nshards (0 for n == 0). */
void zck_hf_assign_shards(const uint64_t *sizes, size_t n, uint64_t max_shard_size, uint32_t *shard_of,
                          size_t *nshards);

typedef enum zck_hf_index_style {
  /* huggingface_hub save_torch_state_dict: json.dump(indent=2), weight_map in shard order,
   * metadata {"total_size", user...}, no final newline. */
  ZCK_HF_INDEX_HUB = 0,
  /* transformers save_pretrained and DeepSpeed zero_to_fp32: json.dumps(indent=2,
   * sort_keys=True) + "\n". */
  ZCK_HF_INDEX_SORTED = 1,
} zck_hf_index_style;

typedef struct zck_hf_options {
  uint64_t max_shard_size;        /* bytes; 0 = ZCK_HF_DEFAULT_MAX_SHARD */
  zck_hf_index_style style;
  bool overwrite;                 /* replace an existing non-empty output directory */
  const char *prefix;             /* file name stem; NULL = "model" */
  bool with_total_parameters;     /* add "total_parameters" to the index metadata (transformers) */
  uint64_t total_parameters;
  /* Called at commit with the temporary directory once every file is final (index
   * included), before the rename: the last word, e.g. a manifest. NULL: none. */
  zck_status (*before_commit)(void *ctx, const char *tmp_dir);
  void *before_commit_ctx;
  /* The folder torch's consolidate_safetensors_files(dir, out, fqn_to_index_mapping)
   * writes, instead of HF sharding: each tensor in the file zck_hf_writer_set_file gives
   * it (the mapping's index), files "model-{i:05}-of-{max:05}.safetensors" for the numbers
   * used (max: the largest), their headers in the TORCH_DCP style (tensors in add order),
   * and always model.safetensors.index.json: json.dump(indent=2) of {"metadata":
   * {"total_size"}, "weight_map"} with the files in the order of their first tensor, each
   * file's tensors in add order. max_shard_size, style, prefix and metadata do not apply. */
  bool torch_dcp;
} zck_hf_options;
#define ZCK_HF_OPTIONS_INIT {0, ZCK_HF_INDEX_HUB, false, NULL, false, 0, NULL, NULL, false}

typedef struct zck_hf_writer zck_hf_writer;

/* A writer of the directory `out_dir` (created atomically at commit). opts may be NULL. */
zck_status zck_hf_writer_new(const char *out_dir, const zck_hf_options *opts, zck_hf_writer **out);
/* User metadata: in the single file's "__metadata__" when not sharded, in the index
 * "metadata" (after total_size) when sharded. */
zck_status zck_hf_writer_set_metadata(zck_hf_writer *w, const char *key, const char *value);
/* Adds a tensor in state-dict order; its storage size (counted for sharding and total_size)
 * is numel * bits / 8. */
zck_status zck_hf_writer_add(zck_hf_writer *w, const char *name, zck_st_dtype dtype, int ndim,
                             const uint64_t *shape, size_t *index);
/* torch_dcp: tensor `index` goes to file number `file` (>= 1); every tensor needs one. */
zck_status zck_hf_writer_set_file(zck_hf_writer *w, size_t index, uint32_t file);
/* Assigns shards, lays out every file, creates the temporary directory and every file
 * (headers written, sizes set). */
zck_status zck_hf_writer_layout(zck_hf_writer *w);
size_t zck_hf_writer_shard_count(const zck_hf_writer *w);
const char *zck_hf_writer_shard_name(const zck_hf_writer *w, size_t shard);  /* "model-00001-of-00002.safetensors" */
/* After layout: where tensor `index` goes. */
typedef struct zck_hf_slot {
  size_t shard;
  int fd;                    /* the shard file, open for pwrite */
  uint64_t offset;           /* absolute offset in that file */
  uint64_t nbytes;
} zck_hf_slot;
zck_hf_slot zck_hf_writer_slot(const zck_hf_writer *w, size_t index);
zck_status zck_hf_writer_write(zck_hf_writer *w, size_t index, const void *data, uint64_t off, uint64_t n);
/* Path of another file to create inside the output directory before commit (config.json...);
 * caller frees. */
char *zck_hf_writer_extra_path(const zck_hf_writer *w, const char *name);
/* Writes the index (when sharded), fsyncs, renames the directory into place. */
zck_status zck_hf_writer_commit(zck_hf_writer *w);
/* Frees; an uncommitted output directory is removed. Accepts NULL. */
void zck_hf_writer_free(zck_hf_writer *w);

/* Manifest hashes as the directory is written, so that its manifest reads nothing back:
 * asked before layout; the tensors' data then goes through zck_hf_writer_store; at commit,
 * once the shards and the index are final and before before_commit runs,
 * zck_hf_writer_known lists their hashes (paths relative to the directory), with what
 * callers added for the files they wrote (zck_hf_writer_add_known: moved in). */
void zck_hf_writer_hash_inline(zck_hf_writer *w);
struct zck_store zck_hf_writer_store(zck_hf_writer *w, size_t index, zck_dtype dtype, uint64_t numel, const char *name);
zck_status zck_hf_writer_add_known(zck_hf_writer *w, struct zck__manifest_known *k);
const struct zck__manifest_known *zck_hf_writer_known(const zck_hf_writer *w);

/* ---- Hugging Face checkpoint reader */

/* A parsed index file, without opening any shard (fuzzable). */
typedef struct zck_hf_index zck_hf_index;
/* `name` is for messages; `ext` is the extension shard names must end with (".safetensors"). */
zck_status zck_hf_index_parse(const char *name, const char *json, size_t len, const char *ext,
                              zck_hf_index **out);
void zck_hf_index_free(zck_hf_index *ix);
size_t zck_hf_index_count(const zck_hf_index *ix);                 /* weight_map entries */
void zck_hf_index_entry(const zck_hf_index *ix, size_t i, const char **tensor, const char **shard);
size_t zck_hf_index_shard_count(const zck_hf_index *ix);           /* distinct shard names */
const char *zck_hf_index_shard(const zck_hf_index *ix, size_t i);  /* first-seen order */
bool zck_hf_index_total_size(const zck_hf_index *ix, uint64_t *total);
/* A string-valued entry of the index "metadata" (e.g. {removed alias: kept name}); NULL if
 * absent or not a string. */
const char *zck_hf_index_metadata_get(const zck_hf_index *ix, const char *key);

typedef struct zck_hf_checkpoint zck_hf_checkpoint;
typedef struct zck_hf_tensor {
  const zck_st_tensor *t;    /* in its shard */
  const zck_st_file *file;   /* the shard */
  size_t shard;
} zck_hf_tensor;

/* path: a directory holding model.safetensors.index.json or model.safetensors, an index file
 * (*.safetensors.index.json), or a single .safetensors file. Opens every shard and checks the
 * index against them. */
zck_status zck_hf_open(const char *path, zck_hf_checkpoint **out);
void zck_hf_close(zck_hf_checkpoint *c);
/* The union of the tensors: weight_map order when indexed, then any tensor a shard holds
 * that the weight_map leaves out (kept, as transformers loads it; with a warning);
 * header order for a single file. */
size_t zck_hf_count(const zck_hf_checkpoint *c);
const zck_hf_tensor *zck_hf_tensor_at(const zck_hf_checkpoint *c, size_t i);
const zck_hf_tensor *zck_hf_find(const zck_hf_checkpoint *c, const char *name);
size_t zck_hf_shard_count(const zck_hf_checkpoint *c);
const zck_st_file *zck_hf_shard(const zck_hf_checkpoint *c, size_t i);
const zck_hf_index *zck_hf_checkpoint_index(const zck_hf_checkpoint *c);  /* NULL for one file */
/* Warnings of the index and of every shard. */
size_t zck_hf_warning_count(const zck_hf_checkpoint *c);
const char *zck_hf_warning_at(const zck_hf_checkpoint *c, size_t i);

#endif
