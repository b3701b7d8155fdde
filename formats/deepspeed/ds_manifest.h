/* ds_manifest.h: the model manifest of a DeepSpeed model-states file, by DeepSpeed's rules,
 * for the two readers that hold one: the DeepSpeed reader (mp_rank_00_model_states.pt of a
 * tag folder) and the universal reader (the copy a universal folder carries byte for byte,
 * with zero/optimizer_state.pt's param_groups). One builder, so a reshard from the universal
 * folder lays out every flat group, sub-group, frozen param and `module` entry exactly as a
 * reshard from the original checkpoint. Each reader reads the records its own way (pickle
 * nodes kept open or copied out) and hands them over as the plain arrays below. */
#ifndef ZCK_DS_MANIFEST_H
#define ZCK_DS_MANIFEST_H

#include "model.h"
#include "pickle/pickle.h"

typedef struct zck__ds_named_shape {
  char *name;
  int ndim;
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t numel;
} zck__ds_named_shape;

typedef struct zck__ds_shape_list {
  zck__ds_named_shape *v;
  size_t n;
} zck__ds_shape_list;

/* An ordered dict name -> shape (param_shapes[g], frozen_param_shapes), read out of its
 * pickle node: names copied, shapes checked (ds_pickle.c). what: the key, for messages. */
zck_status zck__ds_read_shape_dict(const zck_pk *d, zck__ds_shape_list *out, const char *path, const char *what);
void zck__ds_shape_list_free(zck__ds_shape_list *l);

/* A `module` entry: a tensor of the model file (or one a reader added: experts, a
 * pipeline's layers). */
typedef struct zck__ds_module_entry {
  const char *name;
  zck_dtype dtype;
  int ndim;
  const int64_t *shape;
  uint64_t numel;
} zck__ds_module_entry;

/* What the builder reads: the model file's records and the optimizer's param_groups. */
typedef struct zck__ds_records {
  const char *path;                          /* the model-states file, for messages */
  const char *optim_path;                    /* the file param_groups came from */
  int stage;                                 /* 0..3 */
  bool round_robin;                          /* stage 1/2 round_robin_gradients: flat order != group order */
  uint32_t world_size;
  const zck__ds_shape_list *param_shapes;    /* [n_flat]: one per flat group / sub-group */
  size_t n_flat;
  const zck__ds_shape_list *frozen_shapes;   /* NULL: frozen_param_shapes absent or None */
  const char *const *buffer_names;
  size_t n_buffers;
  const zck__ds_module_entry *module;
  size_t n_module;
  const char *const *shared_alias, *const *shared_src;  /* shared_params, in order */
  size_t n_shared;
  const zck_pk *param_groups;                /* a list, or NULL where none was saved */
  /* What only the DeepSpeed reader says (strict-load problems, values it does not carry);
   * NULL: nothing is said (a universal folder: its reader says nothing but errors). */
  zck_status (*warn)(void *ctx, const char *msg);
  void *warn_ctx;
} zck__ds_records;

/* What it builds, the caller's (each reader keeps the fields in its own struct and frees
 * them with it; also after an error: whatever was built by then). */
typedef struct zck__ds_manifest {
  zck_model *model;
  int64_t *param_mod;          /* [n_params]: the param's `module` entry */
  int64_t *buffer_mod;         /* [n_buffers]: the buffer's */
  uint32_t *flat_params;       /* the params of param_shapes in flat order */
  size_t *flat_first;          /* [n_flat + 1] into flat_params */
  size_t *unsaved_ties;        /* shared_params indices whose source was not saved (not a param: */
  const char **unsaved_pairs;  /* exclude_frozen_parameters); [2 * n]: alias, source (borrowed) */
  size_t n_unsaved;
} zck__ds_manifest;

zck_status zck__ds_manifest_build(const zck__ds_records *r, zck__ds_manifest *out);

#endif
