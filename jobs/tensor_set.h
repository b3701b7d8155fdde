/* tensor_set.h: a named list of whole tensors, each readable through a zck_store.
 *
 * It is the common currency of the state-dict jobs (convert, consolidate): a reader turns
 * a .pt file, a safetensors file/index or a DeepSpeed checkpoint into a tensor set whose
 * stores point at the bytes in place; an output (set_target.c) reserves one tensor per
 * entry and hands back where each goes; the job's transfer fills them, run by the parallel
 * executor (exec.h); the output then commits. Nothing here loops over tensor data.
 */
#ifndef ZCK_TENSOR_SET_H
#define ZCK_TENSOR_SET_H

#include "exec.h"
#include "model.h"

#define ZCK_SET_MAX_DIMS 16

typedef struct zck__tensor_entry {
  char *name;
  zck_dtype dtype;            /* dtype of the source elements */
  int ndim;
  int64_t shape[ZCK_SET_MAX_DIMS];
  uint64_t numel;
  zck_store src;              /* row-major elements of the tensor */
  zck_dtype out_dtype;        /* dtype to write (set by the job); INVALID = dtype */
  int32_t alias_of;           /* >= 0: a tied alias of entry alias_of, holding no data of its
                                 own: safetensors writers leave it out (save_pretrained does),
                                 the torch writer makes it a view of the same storage */
  int32_t tied_to;            /* >= 0: shares the data of that entry (torch files keep the tie
                                 even when alias_of is cleared to write a copy) */
} zck__tensor_entry;

/* A cleanup the set runs when freed (closing the files its stores read from). */
typedef void (*zck__set_cleanup_fn)(void *ctx);

typedef struct zck__tensor_set {
  zck__tensor_entry *v;
  size_t n, cap;
  /* metadata to carry into safetensors "__metadata__" / the index (key, value pairs) */
  char **meta_keys, **meta_values;
  size_t n_meta;
  /* the readers' warnings about the input, one line each ("FILE: what"), for the job to pass on */
  char **warnings;
  size_t n_warnings;
  zck__set_cleanup_fn *cleanups;
  void **cleanup_ctx;
  size_t n_cleanups;
} zck__tensor_set;

void zck__set_init(zck__tensor_set *s);
void zck__set_free(zck__tensor_set *s);
/* Appends an entry (name copied). */
zck_status zck__set_add(zck__tensor_set *s, const char *name, zck_dtype dtype, int ndim, const int64_t *shape,
                        zck_store src);
zck_status zck__set_add_meta(zck__tensor_set *s, const char *key, const char *value);
zck_status zck__set_on_free(zck__tensor_set *s, zck__set_cleanup_fn fn, void *ctx);
/* Total bytes of the output (out dtypes). */
uint64_t zck__set_out_bytes(const zck__tensor_set *s);
static inline zck_dtype zck__entry_out_dtype(const zck__tensor_entry *e) {
  return e->out_dtype ? e->out_dtype : e->dtype;
}

/* ---- readers */
/* Every tensor of a torch .pt/.bin file (a state dict, nested dicts flattened with '.'). */
zck_status zck__set_from_torch(zck__tensor_set *s, const char *path);
/* Every tensor of a safetensors file, index or HF checkpoint directory. */
zck_status zck__set_from_safetensors(zck__tensor_set *s, const char *path);
/* By what the path is (zck__src_sniff, source.h): torch or safetensors. */
zck_status zck__set_from_path(zck__tensor_set *s, const char *path);

/* The output kind a path names: .safetensors, .pt, .bin or .pth files, else an HF directory. */
zck_output_format zck__output_format_of(const char *out);

/* ---- outputs (set_target.c): reserve, the job's transfer, commit */

typedef struct zck__write_opts {
  unsigned threads;           /* the identity transfer's (zck__set_copy) */
  uint64_t max_shard_size;    /* HF directory output; 0 = 5GB */
  bool overwrite;
  bool torch_bin_too;         /* HF directory: also pytorch_model.bin, in the same commit */
  bool manifest;              /* a directory: zckpt-manifest.json written last (checksums) */
  bool no_verify;             /* skip the sources' CRC checks (exec.h verify on read) */
  zck_progress_fn progress;
  void *progress_ctx;
  /* ST_DIR: [s->n] file numbers (>= 1): the folder torch's consolidate_safetensors_files
   * writes (safetensors.h torch_dcp), entry i in file torch_file_of[i], in set order */
  const uint32_t *torch_file_of;
  /* a directory's side files (config.json, ...): name and text each, written at commit */
  const char *const *side_names;
  const char *const *side_texts;
  size_t n_side;
} zck__write_opts;

typedef enum {
  ZCK__SET_OUT_ST_FILE,       /* one .safetensors file */
  ZCK__SET_OUT_ST_DIR,        /* an HF directory: model.safetensors or model-0000i-of-0000N + index */
  ZCK__SET_OUT_TORCH_FILE,    /* a torch.save file: an OrderedDict name -> tensor (weights_only loads it) */
  ZCK__SET_OUT_TORCH_DIR,     /* a directory holding pytorch_model.bin */
} zck__set_out;

/* Where a reserved output takes each entry of the set: one transfer of the job. */
typedef struct zck__set_pass {
  zck_store *dst;             /* [s->n]: where entry i goes; UNBOUND: nothing (an alias) */
  uint32_t *crc;              /* [s->n] or NULL: the transfer stores each destination's CRC-32 there
                                 (exec's dst_crc32; the torch writer's records want them) */
  size_t *order;              /* NULL, or every entry index once, in the order the entries' bytes
                                 lie in the output: a writer hashing its files as they are written
                                 wants them written in that order (what arrives ahead of a file's
                                 hash cursor is held, within a budget) */
} zck__set_pass;

typedef struct zck__set_target zck__set_target;

/* Lays out out (kind) for s, with o: every file created under its temporary name, the
 * passes to fill handed back. s and o's side files must outlive the target. */
zck_status zck__set_reserve(const zck__tensor_set *s, zck__set_out kind, const char *out, const zck__write_opts *o,
                            zck__set_target **t);
size_t zck__set_target_passes(const zck__set_target *t);
const zck__set_pass *zck__set_target_pass(const zck__set_target *t, size_t i);
/* Once every pass is filled: finishes the files, writes the side files and the manifest
 * (hashes taken as written: nothing is read back), renames the output into place. */
zck_status zck__set_target_commit(zck__set_target *t);
/* Removes what an uncommitted target wrote. Accepts NULL. */
void zck__set_target_free(zck__set_target *t);

/* The identity transfer (convert): every entry of the pass from its own src store. */
zck_status zck__set_copy(const zck__tensor_set *s, const zck__set_pass *p, const zck__write_opts *o);

/* A small file written whole at path and, with known, its hashes recorded as name: every
 * side file of an output folder goes through here. */
struct zck__manifest_known;
zck_status zck__write_side_file(const char *path, const char *name, const char *text, struct zck__manifest_known *known,
                                size_t *cap);

#endif
