/* tensor_set.h: a named list of whole tensors, each readable through a zck_store.
 *
 * It is the common currency of the state-dict jobs (convert, consolidate): a reader turns
 * a .pt file, a safetensors file/index or a DeepSpeed checkpoint into a tensor set whose
 * stores point at the bytes in place; a writer reserves one output tensor per entry and
 * the copy happens in one plan run by the parallel executor (exec.h). Nothing here loops
 * over tensor data.
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

/* ---- writers: one plan, executed in parallel, committed atomically */
/* Fills the reserved outputs: dst[i] is where entry i goes (UNBOUND for aliases); when
 * crc is non-NULL the filler must store each destination's CRC-32 there (exec's
 * dst_crc32). order (may be NULL): every entry index once, in the order the entries' bytes
 * lie in the output; a writer hashing its files as they are written wants them written in
 * that order (what arrives ahead of a file's hash cursor is held, within a budget). The
 * default filler copies every entry from its own src store. */
typedef zck_status (*zck__fill_fn)(void *ctx, const zck__tensor_set *s, const zck_store *dst, uint32_t *crc,
                                   const size_t *order);

typedef struct zck__write_opts {
  zck__fill_fn fill;          /* NULL: copy each entry's src */
  void *fill_ctx;
  unsigned threads;
  uint64_t max_shard_size;    /* HF directory output; 0 = 5GB */
  bool overwrite;
  bool torch_bin_too;         /* HF directory: also pytorch_model.bin, in the same commit */
  bool manifest;              /* HF directory: write zckpt-manifest.json last (checksums) */
  bool no_verify;             /* skip the sources' CRC checks (exec.h verify on read) */
  zck_progress_fn progress;
  void *progress_ctx;
} zck__write_opts;

/* One .safetensors file. */
zck_status zck__write_safetensors_file(const zck__tensor_set *s, const char *path, const zck__write_opts *o);
/* An HF directory: model.safetensors or model-0000i-of-0000N.safetensors + index. */
zck_status zck__write_safetensors_dir(const zck__tensor_set *s, const char *dir, const zck__write_opts *o,
                                      const char *const *extra_names, const char *const *extra_texts,
                                      size_t n_extra);
/* A torch.save file holding an OrderedDict name -> tensor (loads with weights_only=True). */
zck_status zck__write_torch_file(const zck__tensor_set *s, const char *path, const zck__write_opts *o);
/* The same, its manifest hashes made as it is written and added to known as relpath
 * (lib/stream_hash.h: an owned list; known NULL: none), so its manifest reads nothing back. */
struct zck__manifest_known;
zck_status zck__write_torch_file_hashed(const zck__tensor_set *s, const char *path, const zck__write_opts *o,
                                        const char *relpath, struct zck__manifest_known *known, size_t *cap);

#endif
