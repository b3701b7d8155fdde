/* ds_autoep.h: what the AutoEP files of formats/deepspeed share (ds_autoep.c reads the records and lays out the
 * experts, ds_autoep_hf.c names the manifest as the HF model does, ds_autoep_check.c checks and refuses). */
#ifndef ZCK_DS_AUTOEP_H
#define ZCK_DS_AUTOEP_H

#include "ds_internal.h"

/* One entry of ds_autoep_layers (runtime/engine.py _save_moe_checkpoint). */
typedef struct zck__ds_autoep_layer {
  int64_t layer_id, num_experts, num_local, ep_size, ep_rank, edp_size, edp_rank;
  char *module_path, *prefix, *format;
} zck__ds_autoep_layer;

struct zck__ds_autoep_file {
  zck__ds_autoep_layer *v;
  size_t n;
};

struct zck__ds_autoep {
  uint32_t ep_size, edp_size;                 /* E x D = the world size; rank r is edp rank r / E, EP rank r % E
                                                 (groups.py without use_data_before_expert_parallelism) */
  const struct zck__ds_autoep_file *layers;   /* rank 0's model file's */
  size_t expert_group, n_expert_groups;       /* the param_shapes groups of the experts: one at ZeRO-1/2; at ZeRO-3
                                                 the consecutive sub-groups sub_group_size splits their group into */
};

/* The layer whose module_path + rest is name, or NULL. */
const zck__ds_autoep_layer *zck__ds_autoep_layer_of(const struct zck__ds_autoep_file *f, const char *name,
                                                    const char *rest);
/* Which expert weight name is (1, 2, 3 for w1, w2, w3), or 0, and its layer. */
int zck__ds_autoep_weight(const struct zck__ds_autoep_file *f, const char *name, const zck__ds_autoep_layer **layer);

#endif
