/* manifest.h: zckpt-manifest.json, the integrity record of a checkpoint directory.
 *
 * zckpt writes the manifest LAST into every directory it produces (a DeepSpeed tag folder,
 * a consolidated HF folder, a universal checkpoint), atomically. It lists
 *   - what the directory is: tool + version, kind, and for DeepSpeed the layout (tag,
 *     stage, world size, flat groups, dtypes);
 *   - every file: relative path, size, XXH3-64 of the whole file (16 hex digits, what
 *     `xxhsum -H3` prints), and XXH3-64 of each chunk_size piece when there is more than
 *     one, so damage is located to a byte range without a second copy;
 *   - every tensor: file, name, dtype, shape, the byte range it occupies in the file
 *     (offset, nbytes: for strided views, the span from element 0 to the last element)
 *     and the XXH3-64 of those bytes.
 * On disk (format_version 1; sizes and offsets are JSON integers below 2^53):
 *   {"format": "zckpt-manifest", "format_version": 1, "tool": "zckpt", "version": "0.1.0",
 *    "kind": "deepspeed",
 *    "layout": {"tag": "global_step2", "stage": 2, "world_size": 2, "groups": 1,
 *               "lp_dtype": "bfloat16", "master_dtype": "float32", "bf16_prefix": true},
 *    "chunk_size": 67108864,
 *    "files": [{"path": "mp_rank_00_model_states.pt", "size": 7113, "xxh3": "0123456789abcdef",
 *               "chunks": ["...", ...]}, ...],
 *    "tensors": [{"file": "...", "name": "module.w", "dtype": "bfloat16", "shape": [4, 8],
 *                 "offset": 1024, "nbytes": 64, "xxh3": "..."}, ...]}
 *
 * Completeness protocol. The manifest's presence says "zckpt finished this directory".
 * A writer that fills a directory in place (not through a temporary directory renamed
 * into place) first drops the marker ".zckpt-partial" (zck_manifest_mark_partial); the
 * manifest write removes it. zck_manifest_check_complete then refuses a directory that
 * carries the marker and no manifest, or whose files do not have the listed sizes, unless
 * forced. Directories without either (DeepSpeed's own checkpoints) pass: nothing to check.
 *
 * This file knows no file format: the tensors are described by jobs/manifest_write.c
 * (torch and safetensors readers), the data is hashed here, in parallel across files, one
 * sequential pass per file with a bounded staging buffer per thread.
 */
#ifndef ZCK_MANIFEST_H
#define ZCK_MANIFEST_H

#include "zck.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZCK_MANIFEST_NAME "zckpt-manifest.json"
#define ZCK_MANIFEST_PARTIAL_NAME ".zckpt-partial"
#define ZCK_MANIFEST_FORMAT_VERSION 1
#define ZCK_MANIFEST_DEFAULT_CHUNK ((uint64_t)64 << 20)
#define ZCK_MANIFEST_MAX_BYTES ((size_t)1 << 30)     /* a bigger manifest is refused */
#define ZCK_MANIFEST_MAX_DIMS 64

typedef enum zck_manifest_kind {
  ZCK_MANIFEST_OTHER = 0,      /* files only */
  ZCK_MANIFEST_DEEPSPEED,      /* a DeepSpeed tag folder */
  ZCK_MANIFEST_SAFETENSORS,    /* safetensors file(s), HF folder */
  ZCK_MANIFEST_UNIVERSAL,      /* DeepSpeed universal checkpoint folder */
  ZCK_MANIFEST_TORCH,          /* torch.save file(s) */
} zck_manifest_kind;

const char *zck_manifest_kind_name(zck_manifest_kind k);

typedef struct zck_manifest_layout {
  char *tag;                   /* NULL if unknown */
  int stage;
  uint32_t world_size;
  uint64_t groups;             /* flat groups (stage 1/2) or sub-groups (stage 3) */
  char *lp_dtype;              /* torch spelling: "bfloat16" */
  char *master_dtype;
  bool bf16_prefix;
} zck_manifest_layout;

typedef struct zck_manifest_file {
  char *path;                  /* relative to the manifest's directory, '/'-separated */
  uint64_t size;
  uint64_t xxh3;
  uint64_t *chunks;            /* XXH3-64 of [k*chunk_size, (k+1)*chunk_size) */
  size_t n_chunks;             /* 0, or ceil(size / chunk_size) (> 1) */
  bool hashed;                 /* size/xxh3/chunks are known */
  bool missing;                /* the file does not exist (a manifest of what is on disk) */
  char *error;                 /* why hashing failed (zck_manifest_hash with keep_going) */
} zck_manifest_file;

typedef struct zck_manifest_tensor {
  size_t file;                 /* index into files */
  char *name;
  char *dtype;                 /* torch spelling ("float32"), else safetensors' ("F4") */
  int ndim;
  int64_t *shape;
  uint64_t offset, nbytes;     /* absolute byte range in the file */
  uint64_t xxh3;
  bool hashed;
} zck_manifest_tensor;

typedef struct zck_manifest {
  char *tool, *version;        /* who wrote it */
  zck_manifest_kind kind;
  bool has_layout;
  zck_manifest_layout layout;
  uint64_t chunk_size;         /* 0: no chunk hashes */
  zck_manifest_file *files;
  size_t n_files, cap_files;
  zck_manifest_tensor *tensors;
  size_t n_tensors, cap_tensors;
  struct zck__strmap *file_index;  /* path -> file index, kept by the adders: a universal
                                      folder lists 100k+ files, and a scan per lookup made
                                      reading its manifest quadratic */
} zck_manifest;

/* ---- building */
/* An empty manifest: tool "zckpt", this version, chunk_size ZCK_MANIFEST_DEFAULT_CHUNK. */
zck_status zck_manifest_new(zck_manifest **out);
void zck_manifest_free(zck_manifest *m);
/* Appends a file (path copied); *index optional. Fails on a duplicate or unsafe path. */
zck_status zck_manifest_add_file(zck_manifest *m, const char *relpath, size_t *index);
/* The same for a path of zck_manifest_list_files (distinct by construction: not searched
 * for, which costs a scan per file). */
zck_status zck__manifest_add_listed_file(zck_manifest *m, const char *relpath, size_t *index);
zck_status zck_manifest_add_tensor(zck_manifest *m, size_t file, const char *name, const char *dtype, int ndim,
                                   const int64_t *shape, uint64_t offset, uint64_t nbytes, size_t *index);
/* The same with name and dtype given as (bytes, length). */
zck_status zck__manifest_add_tensor_n(zck_manifest *m, size_t file, const char *name, size_t name_n, const char *dtype,
                                      size_t dtype_n, int ndim, const int64_t *shape, uint64_t offset, uint64_t nbytes,
                                      size_t *index);
zck_status zck_manifest_set_layout(zck_manifest *m, const zck_manifest_layout *l);
/* Index of a file by relative path, or -1. */
ptrdiff_t zck_manifest_find_file(const zck_manifest *m, const char *relpath);
/* A copy of files and tensors (paths, names, geometry) with every hash cleared. */
zck_status zck_manifest_clone_unhashed(const zck_manifest *m, zck_manifest **out);

/* Every regular file under dir, recursively, as sorted relative paths; the manifest, the
 * partial marker and zckpt temporary files (".NAME.zck-tmp-PID") are left out, symlinks
 * are never followed. Free with zck_manifest_free_paths. */
zck_status zck_manifest_list_files(const char *dir, char ***paths, size_t *n);
void zck_manifest_free_paths(char **paths, size_t n);

/* ---- hashing */
typedef struct zck_manifest_hash_opts {
  unsigned threads;            /* 0: zck__default_threads() */
  size_t staging_bytes;        /* per thread; 0: 4 MiB */
  bool keep_going;             /* a file that cannot be read gets .error and stays
                                  unhashed; the call succeeds */
  zck_progress_cb progress;    /* bytes read so far / in total (serialized) */
  void *progress_ctx;
} zck_manifest_hash_opts;
#define ZCK_MANIFEST_HASH_OPTS_INIT {0, 0, false, NULL, NULL}

/* Reads every file of m under dir once and fills sizes, file/chunk hashes and tensor
 * hashes. A tensor whose range passes the end of its file stays unhashed. */
zck_status zck_manifest_hash(const char *dir, zck_manifest *m, const zck_manifest_hash_opts *o);

/* The hashing engine under zck_manifest_hash, for callers that need more ranges of a
 * file in the same pass (verify: the CRC-32 of every zip record). */
enum { ZCK__HASH_XXH3 = 1, ZCK__HASH_CRC32 = 2 };
typedef struct zck__hash_range {
  uint64_t off, len;
  unsigned want;               /* ZCK__HASH_XXH3 | ZCK__HASH_CRC32 */
  uint64_t xxh3;               /* out */
  uint32_t crc32;              /* out */
  bool done;                   /* out: the whole range was read */
} zck__hash_range;

typedef struct zck__hash_file {
  const char *path;            /* the file to read */
  uint64_t chunk_size;         /* 0: no chunk hashes */
  zck__hash_range *ranges;     /* any order, may overlap */
  size_t n_ranges;
  /* out */
  bool ok;
  uint64_t size, xxh3;
  uint64_t *chunks;            /* malloc'd, n_chunks = ceil(size / chunk_size) */
  size_t n_chunks;
  zck_status status;
  char *error;                 /* malloc'd message when !ok */
} zck__hash_file;

/* Hashes files on a thread pool, one sequential read per file, biggest files first. */
zck_status zck__hash_files(zck__hash_file *files, size_t n, const zck_manifest_hash_opts *o);
void zck__hash_file_clear(zck__hash_file *f);
/* The same, shared by the ranks of a distributed job (lib/dist.h; every rank calls it with
 * the same files): each file read by one rank, every rank gets every result. */
zck_status zck__hash_files_shared(zck__hash_file *files, size_t n, const zck_manifest_hash_opts *o);
/* A distributed job's manifest (rank 0 writes it): rank 0 hands the files it has to read
 * to the other ranks, which wait for them in zck__hash_files_follow, and all hash them
 * shared. Rank 0 ends each manifest with zck__hash_files_release, which frees the others
 * when it led no hashing. Off: zck__hash_files_lead is zck__hash_files. */
zck_status zck__hash_files_lead(zck__hash_file *files, size_t n, const zck_manifest_hash_opts *o);
zck_status zck__hash_files_follow(const zck_manifest_hash_opts *o);
void zck__hash_files_release(void);

/* Hashes a writer already computed while writing (formats/deepspeed/ds_hash.c), so the
 * manifest of its files needs no second read: per file its size, whole-file and chunk
 * XXH3 (chunks of `chunk_size`, all of them even when there is one), and the XXH3 of byte
 * ranges (its tensors' storages). zck__manifest_write_dir_known uses a file's entry when
 * the size on disk and the chunk size match and every tensor the description finds in it
 * is one of its ranges; anything else is read and hashed as zck_manifest_write_dir does, so
 * the manifest is the same bytes either way. */
typedef struct zck__manifest_known_range {
  uint64_t off, len, xxh3;
} zck__manifest_known_range;
/* A tensor as describing its file finds it (jobs/manifest_write.c: named by its path
 * through dicts, "" for a file that is one bare tensor). */
typedef struct zck__manifest_known_tensor {
  const char *name, *dtype;
  int ndim;
  const int64_t *shape;
  uint64_t offset, nbytes;
} zck__manifest_known_tensor;
typedef struct zck__manifest_known_file {
  const char *path;            /* relative to the directory */
  bool hashed;
  uint64_t size, xxh3;
  const uint64_t *chunks;
  size_t n_chunks;
  const zck__manifest_known_range *ranges;
  size_t n_ranges;
  /* optional: the file's tensors, from the writer that laid it out; with them the file is
   * not opened to be described */
  bool described;
  const zck__manifest_known_tensor *tensors;
  size_t n_tensors;
} zck__manifest_known_file;
typedef struct zck__manifest_known {
  uint64_t chunk_size;
  zck__manifest_known_file *files;
  size_t n_files;
  /* optional: the folder's layout as its writer knows it (a universal or DeepSpeed tag folder's); the
   * folder's reader is then not run to find it */
  const zck_manifest_layout *layout;
} zck__manifest_known;
/* The tensors of an open torch file as describing it for a manifest finds them (named by
 * their path through dicts and lists, the others "<tensor K>"), in one allocation:
 * free(*out). A writer that copies or lays out a torch file hands them over as its known
 * file's `tensors`, so the manifest does not parse the file again. Defined in
 * jobs/manifest_write.c. */
struct zck_torch_file;
zck_status zck__manifest_torch_tensors(const struct zck_torch_file *tf, zck__manifest_known_tensor **out, size_t *n);
/* zck_manifest_write_dir with `known` hashes (NULL: none); *from_known (optional): how
 * many files took theirs from it. Defined in jobs/manifest_write.c. */
zck_status zck__manifest_write_dir_known(const char *dir, const zck_manifest_opts *opts, const zck__manifest_known *known,
                                         size_t *from_known);
/* zck_manifest_write_dir listing only the files of dir named in `only` (paths relative to
 * dir, as zck_manifest_list_files gives them; names it does not give are ignored): what a
 * job checked, not whatever else lies in the folder. Defined in jobs/manifest_write.c. */
zck_status zck__manifest_write_dir_only(const char *dir, const zck_manifest_opts *opts, const char *const *only,
                                        size_t n_only);
/* zck_manifest_hash for the files whose skip[i] is false (skip may be NULL). */
zck_status zck__manifest_hash_some(const char *dir, zck_manifest *m, const bool *skip, const zck_manifest_hash_opts *o,
                                   bool lead);

/* ---- JSON */
/* The manifest as JSON text (one file or tensor per line), malloc'd. Every file must be
 * hashed. */
zck_status zck_manifest_to_json(const zck_manifest *m, char **text, size_t *len);
/* Writes <dir>/zckpt-manifest.json atomically (temp + fsync + rename + fsync of dir), then
 * removes <dir>/.zckpt-partial. */
zck_status zck_manifest_write(const zck_manifest *m, const char *dir);
/* Parses and validates manifest JSON; `name` is for messages. Errors are one line:
 * "NAME: files[3].size: not an integer". */
zck_status zck_manifest_parse(const char *name, const char *json, size_t len, zck_manifest **out);
/* Its two readers. _tree: the whole text as a cJSON tree, checked field by field (every
 * message is this one's). _plain (manifest_tensors.c): the tensor table scanned without a
 * tree, the rest through _tree; it declines (non-OK, message unspecified) anything but a
 * plain subset and every error, and zck_manifest_parse then runs _tree. */
zck_status zck__manifest_parse_tree(const char *name, const char *json, size_t len, zck_manifest **out);
zck_status zck__manifest_parse_plain(const char *name, const char *json, size_t len, zck_manifest **out);
/* Reads <dir>/zckpt-manifest.json (or the file itself when path is a file);
 * ZCK_ERR_NOT_FOUND when there is none. */
zck_status zck_manifest_read(const char *path, zck_manifest **out);

/* ---- comparing */
typedef enum zck_manifest_diff_kind {
  ZCK_MDIFF_KIND = 0,          /* kind differs */
  ZCK_MDIFF_LAYOUT,            /* DeepSpeed layout differs */
  ZCK_MDIFF_MISSING_FILE,
  ZCK_MDIFF_EXTRA_FILE,        /* in actual only */
  ZCK_MDIFF_UNREADABLE_FILE,   /* actual could not be hashed (its .error) */
  ZCK_MDIFF_SIZE,
  ZCK_MDIFF_FILE_HASH,
  ZCK_MDIFF_CHUNK,             /* one chunk whose hash differs: offset, length */
  ZCK_MDIFF_MISSING_TENSOR,
  ZCK_MDIFF_EXTRA_TENSOR,
  ZCK_MDIFF_TENSOR_META,       /* dtype, shape or byte range differs */
  ZCK_MDIFF_TENSOR_UNREADABLE, /* its bytes pass the end of the file */
  ZCK_MDIFF_TENSOR_HASH,
} zck_manifest_diff_kind;

typedef struct zck_manifest_diff {
  zck_manifest_diff_kind kind;
  const char *file;            /* relative path, or NULL */
  const char *tensor;          /* NULL when not about a tensor */
  int64_t offset;              /* absolute byte offset in the file, -1 if none */
  uint64_t length;             /* bytes concerned, 0 if unknown */
  const char *message;         /* one line: "DIR/FILE: tensor NAME: ..." */
} zck_manifest_diff;

typedef void (*zck_manifest_diff_fn)(void *ctx, const zck_manifest_diff *d);

/* Reports every way `actual` differs from `expected` (files matched by path, tensors by
 * file and name), at most max_chunks chunk differences per file (0: 16). dir prefixes
 * the messages (may be NULL). Returns the number of differences. */
size_t zck_manifest_compare(const zck_manifest *expected, const zck_manifest *actual, const char *dir,
                            unsigned max_chunks, zck_manifest_diff_fn fn, void *ctx);

/* An untrusted name for a message: control bytes as \xNN, cut at n - 1 bytes ("..."). */
void zck__manifest_shown(char *dst, size_t n, const char *s);

/* ---- completeness */
/* Drops <dir>/.zckpt-partial (fsynced): "zckpt is filling this directory". */
zck_status zck_manifest_mark_partial(const char *dir);
/* ZCK_OK when dir has a valid manifest whose files all exist with their listed sizes, or
 * when it has neither manifest nor partial marker (not written by zckpt). Otherwise
 * ZCK_ERR_DAMAGED ("DIR: incomplete checkpoint: ..."), or the manifest's parse error;
 * force turns every refusal into ZCK_OK. Only stats files: no data is read. */
zck_status zck_manifest_check_complete(const char *dir, int force);
/* Its second half over a manifest already parsed: every listed file exists under dir with
 * its listed size. */
zck_status zck__manifest_check_sizes(const char *dir, const zck_manifest *m);

#endif
