/* ds_pipe.h: what ds_pipe.c (the stages and layer files) and ds_pipe_tied.c (TiedLayerSpec weights) share about one
 * PipelineModule checkpoint. */
#ifndef ZCK_DS_PIPE_H
#define ZCK_DS_PIPE_H

#include "ds_internal.h"

/* A TiedLayerSpec weight's copy in a later stage than the first one holding it (tied_modules.<key>.<K> in both
 * stages' param_shapes and flat groups). Its elements stay in the stage's flat group (the partition math counts
 * them) but no piece of the layout points at them: the model has the weight once, the first stage's. */
typedef struct zck__ds_pipe_replica {
  char *name;
  uint32_t stage;
  size_t group;              /* c's flat group (stage groups appended) */
  size_t pos;                /* its place among the group's params as the stage's param_shapes list them */
  uint64_t numel;
  uint64_t offset;           /* where it begins in the flat group (zck__ds_pipe_train) */
} zck__ds_pipe_replica;

struct zck__ds_pipe {
  zck_ds_ckpt **stages;      /* [n_stages - 1]: stages 1.. (files read, not described) */
  uint32_t n_stages;
  size_t *first_group;       /* [n_stages]: stage s's flat groups are c's from first_group[s] on */
  zck__source *layer_src;    /* [n_layers]: fs.layers' sources, in layer order */
  bool *layer_open;
  size_t n_layers;
  zck_pk_doc *doc;           /* the merged param_groups list */
  zck__ds_pipe_replica *replicas;
  size_t n_replicas, cap_replicas;
  struct zck__ds_pipe_tied {
    char *key;               /* a TiedLayerSpec key (its params are tied_modules.<key>.*), first stage's order first */
    int64_t layer;           /* the layer file (index into fs.layers) whose entries are its weights, or -1 */
  } *tied;
  size_t n_tied, cap_tied;
};

/* ---- ds_pipe_tied.c */
/* The keys of every tied_modules.<key>.* name of the stages' param_shapes (before the merge). */
zck_status zck__ds_pipe_tied_keys(zck_ds_ckpt *c);
/* The TiedLayerSpec key whose weights a layer file's keys name (all of them tied_modules.<key>.<K> in some stage's
 * param_shapes), -1: none; refused when two keys fit. */
zck_status zck__ds_pipe_layer_tied(const zck_ds_ckpt *c, const zck__strmap *shapes, const zck__ds_rankfile *lf,
                                   const char *const *keys, size_t n_keys, int64_t *tied);
/* Stage s's param_shapes (its flat groups from c's group first on) with the copies of weights an earlier stage holds
 * taken out and recorded, and their param_slice_mappings and alignment paddings in every rank's optimizer file. */
zck_status zck__ds_pipe_take_replicas(zck_ds_ckpt *c, zck_ds_ckpt *sub, uint32_t s, size_t first,
                                      const zck__strmap *earlier);
/* verify: every replica's fp32 master (and Adam state) equals the first stage's copy, bit for bit. */
zck_status zck__ds_pipe_check_replicas(const zck_ds_ckpt *c);
zck_status zck__ds_pipe_strip_optim(const struct zck__ds_pipe *p, zck__ds_optim_file *so, size_t first);

#endif
