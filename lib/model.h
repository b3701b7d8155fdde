/* model.h: the manifest of a model, independent of any file format.
 *
 * A manifest lists what a checkpoint holds, not the bytes:
 *  - params, in module.parameters() order (tied aliases are listed too, with tied_to
 *    naming the param that owns the data), each with its shape, 16-bit training ("lp")
 *    dtype, optimizer param group and frozen flag;
 *  - buffers (name, dtype, shape), in module traversal order;
 *  - optimizer param groups: hyper-parameters as an ordered key/value list (the order is
 *    kept so a writer can reproduce the pickle), and the param indices in group order
 *    (which is the flat order of ZeRO 1/2 without round-robin, and the order sub-groups
 *    are cut from in ZeRO 3).
 *
 * Readers fill a manifest with the builder calls below; layouts (layout.h) and plans use
 * param indices into it. Fields are public for reading; change them only through the
 * builder so the name index and group lists stay consistent.
 */
#ifndef ZCK_MODEL_H
#define ZCK_MODEL_H

#include "zck.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ZCK_MAX_DIMS 8

typedef struct zck_param {
  char *name;
  int ndim;                      /* 0 (scalar) .. ZCK_MAX_DIMS */
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t numel;                /* product of shape (1 for a scalar) */
  zck_dtype dtype;               /* lp dtype (what module.state_dict() holds) */
  int32_t group;                 /* optimizer param group index, -1 if in none */
  bool frozen;                   /* requires_grad == False */
  int32_t tied_to;               /* index of the param owning the data, or -1 */
} zck_param;

typedef struct zck_buffer {
  char *name;
  int ndim;
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t numel;
  zck_dtype dtype;
} zck_buffer;

/* One hyper-parameter value. torch param groups hold ints, floats, bools, None, tuples
 * of floats (betas) and, rarely, strings. */
typedef enum zck_hp_kind {
  ZCK_HP_NONE = 0,
  ZCK_HP_BOOL,
  ZCK_HP_INT,
  ZCK_HP_FLOAT,
  ZCK_HP_FLOATS,   /* a tuple of up to ZCK_HP_MAX_FLOATS floats, e.g. betas */
  ZCK_HP_STRING
} zck_hp_kind;

#define ZCK_HP_MAX_FLOATS 4

typedef struct zck_hparam {
  char *key;
  zck_hp_kind kind;
  int64_t i;                        /* BOOL (0/1), INT */
  double f[ZCK_HP_MAX_FLOATS];      /* FLOAT (f[0]), FLOATS */
  int n_floats;                     /* FLOATS */
  char *s;                          /* STRING */
} zck_hparam;

typedef struct zck_param_group {
  zck_hparam *hparams;
  size_t n_hparams;
  uint32_t *params;                 /* param indices, in group order */
  size_t n_params;
  size_t cap_params, cap_hparams;   /* builder bookkeeping */
} zck_param_group;

typedef struct zck_model {
  zck_param *params;
  size_t n_params;
  zck_buffer *buffers;
  size_t n_buffers;
  zck_param_group *groups;
  size_t n_groups;
  /* private: capacities and name indexes */
  size_t cap_params, cap_buffers, cap_groups;
  struct zck__name_index *param_index, *buffer_index;
} zck_model;

/* ---- building */
/* NULL (with the error set) on allocation failure. */
zck_model *zck_model_new(void);
void zck_model_free(zck_model *m);

/* Appends a param (group -1, not frozen, not tied). Fails with ZCK_ERR_FORMAT on a
 * duplicate name, a negative dimension, ndim out of range or an element count that
 * overflows 64 bits; the message names the param. out_index may be NULL. */
zck_status zck_model_add_param(zck_model *m, const char *name, int ndim, const int64_t *shape,
                               zck_dtype dtype, uint32_t *out_index);
zck_status zck_model_add_buffer(zck_model *m, const char *name, int ndim, const int64_t *shape,
                                zck_dtype dtype, uint32_t *out_index);
void zck_model_set_frozen(zck_model *m, uint32_t param, bool frozen);
/* Gives param a new shape (numel recomputed; overflow fails naming it): a describer whose
 * files hold slices (AutoTP) states the full tensor's. */
zck_status zck_model_set_shape(zck_model *m, uint32_t param, int ndim, const int64_t *shape);
/* A deep copy of src (params, ties, frozen flags, buffers, groups and their hparams), or
 * NULL (out of memory). */
zck_model *zck_model_clone(const zck_model *src);
/* alias shares the data of source (source must not itself be an alias). FORMAT error
 * when source is out of range, equals alias, or is an alias. */
zck_status zck_model_set_tied(zck_model *m, uint32_t alias, uint32_t source);

/* Appends an empty param group. */
zck_status zck_model_add_group(zck_model *m, uint32_t *out_group);
/* Appends param to group g's list and sets its group; FORMAT error if the param is
 * already in a group or an index is out of range. */
zck_status zck_model_group_add_param(zck_model *m, uint32_t g, uint32_t param);
/* Hyper-parameters: set (replace if the key exists, else append, keeping order). */
zck_status zck_model_group_set_none(zck_model *m, uint32_t g, const char *key);
zck_status zck_model_group_set_bool(zck_model *m, uint32_t g, const char *key, bool v);
zck_status zck_model_group_set_int(zck_model *m, uint32_t g, const char *key, int64_t v);
zck_status zck_model_group_set_float(zck_model *m, uint32_t g, const char *key, double v);
zck_status zck_model_group_set_floats(zck_model *m, uint32_t g, const char *key, const double *v, int n);
zck_status zck_model_group_set_string(zck_model *m, uint32_t g, const char *key, const char *v);
/* Every setting of src (another manifest's group), in its order, into group g. */
zck_status zck_model_group_copy_settings(zck_model *m, uint32_t g, const zck_param_group *src);

/* ---- queries */
/* Index of the param / buffer with this name, or -1. O(1). */
int64_t zck_model_find_param(const zck_model *m, const char *name);
int64_t zck_model_find_buffer(const zck_model *m, const char *name);
/* The hyper-parameter of group g with this key, or NULL. */
const zck_hparam *zck_model_group_get(const zck_model *m, uint32_t g, const char *key);
/* Index of the param that owns p's data (p itself unless tied). */
static inline uint32_t zck_model_owner(const zck_model *m, uint32_t p) {
  return m->params[p].tied_to >= 0 ? (uint32_t)m->params[p].tied_to : p;
}
/* The trainable params of group g in group order (not frozen, not aliases): what
 * DeepSpeed flattens. Writes up to cap indices to out and returns how many there are
 * (which may exceed cap: call with cap 0 to size the array). */
size_t zck_model_group_trainable(const zck_model *m, uint32_t g, uint32_t *out, size_t cap);
/* Copies the numel of every param into out[0..n_params). */
void zck_model_numels(const zck_model *m, uint64_t *out);

/* "[2, 3]" style shape text for messages, into buf (always NUL-terminated). */
const char *zck_shape_str(int ndim, const int64_t *shape, char *buf, size_t cap);

#endif
