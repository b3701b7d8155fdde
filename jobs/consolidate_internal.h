/* consolidate_internal.h: what consolidate.c shares with the in-memory state dict
 * (consolidate_memory.c): zero_to_fp32's recipe as a tensor set and its transfer. */
#ifndef ZCK_CONSOLIDATE_INTERNAL_H
#define ZCK_CONSOLIDATE_INTERNAL_H

#include "deepspeed/deepspeed.h"
#include "source.h"
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
/* Fills one pass of a reserved output (tensor_set.h) from the checkpoint's state: every
 * entry's bytes from its part of c->src, in one zck_transfer. */
zck_status zck__cons_transfer(const zck__cons_ctx *c, const zck__tensor_set *s, const zck__set_pass *pass);

/* Opens the checkpoint to consolidate (source.h: a DeepSpeed checkpoint, a universal
 * folder or zckpt's HDF5 container), checked complete (a zckpt manifest's files all
 * there, unless opts->force). */
zck_status zck__cons_open(zck__src *s, const char *path, const zck_consolidate_opts *opts);

#endif
