/* consolidate_internal.h: what consolidate.c shares with the in-memory state dict
 * (consolidate_memory.c): zero_to_fp32's recipe as a tensor set and its filler. */
#ifndef ZCK_CONSOLIDATE_INTERNAL_H
#define ZCK_CONSOLIDATE_INTERNAL_H

#include "deepspeed/deepspeed.h"
#include "tensor_set.h"

/* What each set entry is, in deepspeed terms. */
typedef struct zck__cons_entry {
  zck_ds_out_kind kind;   /* BUFFER / FROZEN / TRAINABLE (aliases resolved to their source's) */
  uint32_t index;         /* buffer or param index of the data */
} zck__cons_entry;

typedef struct zck__cons_ctx {
  const zck_state_view *src;  /* the checkpoint's state (fp32, frozen, buffers) */
  zck__cons_entry *entries;   /* [set->n] */
  unsigned threads;
  zck_progress_cb progress;
  void *progress_ctx;
  bool no_verify;             /* skip the sources' checksums (verify on read) */
} zck__cons_ctx;

bool zck__cons_floating(zck_dtype t);
/* The entries zero_to_fp32 outputs by the recipe outs[n_out] (zck_ds_outputs, or a
 * universal source's) under opts (dtype, exclude_frozen), in its order; aliases have
 * alias_of set. *entries: [set->n], free() it. */
zck_status zck__cons_build_set(const zck_ds_output *outs, size_t n_out, const zck_consolidate_opts *opts,
                               zck__tensor_set *set, zck__cons_entry **entries);
/* A zck__fill_fn (ctx: zck__cons_ctx): copies every entry from the rank files to dst. */
zck_status zck__cons_fill(void *ctx, const zck__tensor_set *s, const zck_store *dst, uint32_t *crc_out,
                          const size_t *order);

/* A checkpoint to consolidate, whatever holds it (consolidate_source.c): a DeepSpeed
 * checkpoint, a universal folder in DeepSpeed's layout, or zckpt's HDF5 container, each
 * described by its own reader as a state view and zero_to_fp32's recipe for the
 * checkpoint it holds (or was made from), so every source gives the same output. */
typedef struct zck__cons_src {
  const char *dir;                 /* for messages: the folder or file read */
  zck_state_view view;
  const zck_ds_output *outs;
  size_t n_outs;
  const char *const *unsaved;      /* [2 * n_unsaved]: alias, source (zck_ds_unsaved_tie) */
  size_t n_unsaved;
  /* owned */
  zck_ds_ckpt *ck;
  struct zck_uv_ckpt *uv;
  struct zck_h5u *h5;
  zck_ds_output *own_outs;
  const char **own_unsaved;
} zck__cons_src;

/* Opens path by what it is (zck_reshard's rules), checks it is complete (a zckpt
 * manifest's files all there, unless opts->force) and describes it. */
zck_status zck__cons_src_open(zck__cons_src *s, const char *path, const zck_consolidate_opts *opts);
void zck__cons_src_close(zck__cons_src *s);
/* config.json / generation_config.json of the source's save root (an HF checkpoint-N/;
 * the container's /side_files), for an output folder: names and texts, free() each. A
 * container's that cannot be read (damaged) fails. */
zck_status zck__cons_src_side_files(const zck__cons_src *s, char ***names, char ***texts, size_t *n);
/* The same from a folder (consolidate.c): appends what root holds. */
void zck__cons_side_files(const char *root, char ***names, char ***texts, size_t *n);

#endif
