/* layout.h: where every element of every parameter lives, as pure functions (no I/O).
 *
 * Each param p (an index into a zck_model) has, per kind of state (fp32 master, exp_avg,
 * exp_avg_sq, lp weights), one logical flat array of numel(p) elements. A layout maps
 * element ranges of those arrays onto *stores*: abstract flat buffers numbered
 * 0..n_stores-1 ("rank r, flat group g", "the tensor of param p", ...). A layout is pure
 * geometry and is shared by every state kind: the fp32 partition of rank r group g and
 * the exp_avg of rank r group g are the same store id bound to different backings
 * (exec.h). Padding is simply not mapped: no piece points at it.
 *
 * DeepSpeed partition math (spec deepspeed-checkpoint.md §3), reproduced here exactly:
 *
 *  ZeRO 1/2 (and BF16_Optimizer), per flat group of N elements (params in flat order,
 *  i.e. param_shapes order; round-robin already applied by the caller):
 *     M = align(N, 2W)   (nccl_start_alignment_factor 2 for every dtype)
 *     P = M / W          rank r owns flat [rP, (r+1)P)
 *     lean(r)    = max(0, min(P, N - rP))  elements single_partition_of_fp32_groups keeps
 *     padding(r) = P - lean(r)              group_paddings[g] of rank r
 *     exp_avg / exp_avg_sq (and BF16_Optimizer's fp32) keep the padded P.
 *     BF16_Optimizer's group_paddings: M - N on the last rank only, 0 elsewhere.
 *  With DeepSpeed >= 0.19.8's zero_optimization.parameter_alignment, every param but the
 *  last is followed by zeros up to a multiple of param_align elements (16/gcd(16, elem
 *  size)), and N includes that inter-param padding; param_align = 1 is the default.
 *
 *  ZeRO 3, per param of n elements: p = ceil(n/W), padding p*W - n (per param, not per
 *  group). Rank r holds param elements [r*p, min((r+1)p, n)) at the start of its p-slot;
 *  trailing ranks may hold only padding. Params of an optimizer group are cut into
 *  sub-groups (zck_zero3_sub_groups); the fp32 flat of sub-group s on every rank is the
 *  concatenation of its params' p-slots, padding included: L_s = sum p, no extra
 *  alignment. fp32_flat_groups, exp_avg and exp_avg_sq all have L_s elements.
 *
 * param_slice_mappings (stage 1/2): the pieces of store (g, r) in store order give every
 * fragment_address(start = store_off, numel = count). DeepSpeed computes them in group
 * (bit16_groups) order even when round_robin_gradients reorders the flat buffer (checked
 * against real checkpoints in tests/core/test_fixtures.c), so build the layout for the
 * mappings from the un-reordered group and the one for the data from param_shapes order.
 *
 * Store numbering of the DeepSpeed constructors: store id = group * W + rank (group = flat
 * group for stage 1/2, sub-group for stage 3). zck_layout_store_id() computes it.
 */
#ifndef ZCK_LAYOUT_H
#define ZCK_LAYOUT_H

#include "zck.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- scalar partition math (preconditions: w >= 1, n < 2^62; misuse aborts) */
uint64_t zck_zero12_aligned(uint64_t n, uint32_t w);                /* M = align(n, 2w) */
uint64_t zck_zero12_partition(uint64_t n, uint32_t w);              /* P = M / w */
uint64_t zck_zero12_lean(uint64_t n, uint32_t w, uint32_t r);       /* saved fp32 length of rank r */
uint64_t zck_zero12_padding(uint64_t n, uint32_t w, uint32_t r);    /* group_paddings of rank r */
uint64_t zck_zero12_bf16_padding(uint64_t n, uint32_t w, uint32_t r); /* BF16_Optimizer's */
uint64_t zck_zero3_partition(uint64_t n, uint32_t w);               /* p = ceil(n/w) */
uint64_t zck_zero3_padding(uint64_t n, uint32_t w);                 /* p*w - n */
uint64_t zck_zero3_keep(uint64_t n, uint32_t w, uint32_t r);        /* real elements on rank r */

/* ---- the generic representation */

/* Strided runs: `count` elements cut into runs of `run` elements (the last one shorter when
 * count is not a multiple of run), the k-th run starting `stride` elements after the
 * (k-1)-th. run 0 means one run of count elements. A block of a 2-D tensor (a tensor
 * parallel shard: rows x some columns) is one such set in the tensor's flat array, where a
 * list of contiguous runs would cost one entry per row. Element k (0 <= k < count) lies at
 * zck_runs_at(off, run, stride, k). */
static inline uint64_t zck_runs_at(uint64_t off, uint64_t run, uint64_t stride, uint64_t k) {
  return run ? off + k / run * stride + k % run : off + k;
}
/* How many runs count elements make. */
static inline uint64_t zck_runs_n(uint64_t count, uint64_t run) {
  return run ? (count + run - 1) / run : (count ? 1 : 0);
}
/* One past the last element (off when count is 0); the caller checks overflow first
 * (layouts and the executor do). */
static inline uint64_t zck_runs_end(uint64_t off, uint64_t count, uint64_t run, uint64_t stride) {
  return count ? zck_runs_at(off, run, stride, count - 1) + 1 : off;
}
/* Of the elements, how many lie before position x: they lie in increasing order (stride >=
 * run, which also keeps r * run <= d from overflowing). */
static inline uint64_t zck_runs_before(uint64_t off, uint64_t count, uint64_t run, uint64_t stride, uint64_t x) {
  if (x <= off) return 0;
  uint64_t d = x - off, k = d;
  if (run) {
    uint64_t r = d / stride, in = d % stride;
    k = r * run + (in < run ? in : run);
  }
  return k < count ? k : count;
}

/* A run of a param's flat array inside one store (counts in elements); or, with run set,
 * strided runs of the param (zck_runs_at(param_off, run, stride, k)) back to back in the
 * store (store_off + k): a chunk that cuts an inner dimension, one piece for all its rows. */
typedef struct zck_piece {
  uint32_t param;      /* param index */
  uint32_t store;      /* store id in this layout */
  uint64_t param_off;  /* element offset in the param's flat array */
  uint64_t store_off;  /* element offset in the store */
  uint64_t count;      /* elements in all */
  uint64_t run;        /* 0: contiguous in the param; else runs of `run` elements (the last
                          may be shorter)... */
  uint64_t stride;     /* ...`stride` elements apart in the param (stride >= run) */
} zck_piece;

typedef struct zck_layout_store {
  int32_t rank;        /* dp rank; -1 when not partitioned */
  int32_t group;       /* flat group (stage 1/2) or sub-group (stage 3); -1 if none */
  int32_t param;       /* whole-tensor stores: the param; else -1 */
  uint64_t numel;      /* full (padded) size: what exp_avg / exp_avg_sq hold. Stage 1/2: P;
                          stage 3: L_s; whole tensors: numel */
  uint64_t lean;       /* what a saved fp32 partition holds: stage 1/2 lean(r) (the prefix
                          of real elements); stage 3: L_s (padding kept); else numel */
} zck_layout_store;

/* A flat group (stage 1/2) or sub-group (stage 3) as DeepSpeed builds it. */
typedef struct zck_layout_group {
  uint32_t *params;    /* param indices in flat order */
  uint64_t *offsets;   /* stage 1/2: flat offset of each param in the group buffer;
                          stage 3: offset of each param's p-slot in the sub-group flat */
  size_t n_params;
  uint64_t numel;      /* stage 1/2: N (incl. inter-param alignment); stage 3: L_s */
  uint64_t aligned;    /* stage 1/2: M; stage 3: W * L_s */
  uint64_t partition;  /* stage 1/2: P; stage 3: L_s */
  int32_t opt_group;   /* the optimizer param group it came from (caller-given), or -1 */
} zck_layout_group;

typedef enum zck_layout_kind {
  ZCK_LAYOUT_CUSTOM = 0,
  ZCK_LAYOUT_WHOLE,    /* one store per param, offset 0 (consolidated tensors) */
  ZCK_LAYOUT_FLAT,     /* one store per group, params concatenated (stage 1/2 lp flat) */
  ZCK_LAYOUT_ZERO12,
  ZCK_LAYOUT_ZERO3
} zck_layout_kind;

typedef struct zck_layout {
  zck_layout_kind kind;
  uint32_t world;              /* W; 1 when not partitioned */
  size_t n_params;             /* the param index space (the model's n_params) */
  uint64_t *param_numel;       /* [n_params] */
  size_t *param_first;         /* [n_params + 1]: pieces of p are pieces[param_first[p] ..
                                  param_first[p+1]), sorted by param_off, disjoint */
  zck_piece *pieces;
  size_t n_pieces;
  zck_layout_store *stores;
  size_t n_stores;
  size_t *store_first;         /* [n_stores + 1] into by_store */
  uint32_t *by_store;          /* piece indices sorted by (store, store_off) */
  zck_layout_group *groups;    /* stage 1/2, stage 3, flat: per group; else NULL */
  size_t n_groups;
} zck_layout;

/* A list of params (indices, in order) forming a flat group / sub-group. */
typedef struct zck_group_spec {
  const uint32_t *params;
  size_t n_params;
  int32_t opt_group;           /* copied to zck_layout_group.opt_group */
} zck_group_spec;

/* Constructors. numel[n_params] gives every param's element count (params no group
 * mentions simply have no pieces). A param may appear in at most one group; errors
 * (ZCK_ERR_INVALID_ARG for bad arguments, ZCK_ERR_LIMIT when sizes overflow) carry a
 * message. *out is NULL on failure. */

/* ZeRO 1/2 and BF16_Optimizer: stores g*W + r, numel P, lean lean(r). param_align <= 1:
 * no inter-param padding (DeepSpeed's default). */
zck_status zck_layout_zero12(size_t n_params, const uint64_t *numel, const zck_group_spec *groups,
                             size_t n_groups, uint32_t world, uint32_t param_align, zck_layout **out);

/* ZeRO 3, given the sub-groups (from zck_zero3_sub_groups, or one group per param for
 * frozen_param_fragments): stores s*W + r with numel = lean = L_s. */
zck_status zck_layout_zero3(size_t n_params, const uint64_t *numel, const zck_group_spec *sub_groups,
                            size_t n_sub_groups, uint32_t world, zck_layout **out);

/* Cuts each optimizer group into ZeRO-3 sub-groups (stage3.py _create_fp16_sub_groups):
 * if sub_group_size >= sum of the group's p: one sub-group; else append params in order
 * and close the sub-group when the running sum of p reaches sub_group_size, or at the
 * group's last param. Empty groups yield no sub-group. *out is one allocation (free()
 * it) whose specs point into itself; opt_group is the index of the source group. */
zck_status zck_zero3_sub_groups(const uint64_t *numel, const zck_group_spec *groups, size_t n_groups,
                                uint32_t world, uint64_t sub_group_size, zck_group_spec **out,
                                size_t *n_out);

/* Whole tensors: store i holds param params[i] entirely (params NULL: every param, store
 * p = param p). A param listed twice is an error. */
zck_status zck_layout_whole(size_t n_params, const uint64_t *numel, const uint32_t *params, size_t n,
                            zck_layout **out);

/* Unpartitioned flat groups: store g = group g, params concatenated with param_align
 * padding, store numel = align(N, align) (align 0/1: N). The stage 1/2 lp flat buffer
 * of a W-rank run is zck_layout_flat(..., 2*W, param_align). */
zck_status zck_layout_flat(size_t n_params, const uint64_t *numel, const zck_group_spec *groups,
                           size_t n_groups, uint64_t align, uint32_t param_align, zck_layout **out);

/* Anything else: explicit stores and pieces (in any order). Pieces of one param must not
 * overlap, must lie within the param and their store (ZCK_ERR_FORMAT otherwise: layouts
 * built from untrusted files come through here); strided pieces too (runs no longer than
 * their stride), their overlaps checked pair by pair among the pieces whose spans meet,
 * under a budget (ZCK_ERR_LIMIT) so that a hostile piece list cannot make it a hang. Pieces of different params may share
 * store elements only if the caller wants that (it is not checked). */
zck_status zck_layout_custom(size_t n_params, const uint64_t *numel, const zck_layout_store *stores,
                             size_t n_stores, const zck_piece *pieces, size_t n_pieces,
                             zck_layout **out);

/* The same layout with only the pieces in stores of dp rank `rank` (store ids and
 * store/group tables unchanged): the target of "load rank r". */
zck_status zck_layout_restrict_rank(const zck_layout *l, int32_t rank, zck_layout **out);

/* *to = *from with its own copies of params and offsets (ZCK_ERR_NO_MEMORY leaves to's arrays for
 * zck_layout_free, NULL where not allocated). */
zck_status zck_layout_group_dup(zck_layout_group *to, const zck_layout_group *from);

void zck_layout_free(zck_layout *l);

/* Store id of (group, rank) in zero12 / zero3 layouts. */
static inline uint32_t zck_layout_store_id(const zck_layout *l, uint32_t group, uint32_t rank) {
  return group * l->world + rank;
}
/* Elements of param p that this layout maps (sum of its pieces' counts). */
uint64_t zck_layout_param_covered(const zck_layout *l, uint32_t p);

/* The flat groups DeepSpeed builds from a manifest: per optimizer param group, the params
 * it optimizes (not frozen, not tied aliases, at least one element: DeepSpeed >= 0.19.8's
 * is_optimized_parameter records zero-element params with the frozen ones; they hold no
 * elements, so the geometry is the same either way) in group order; groups with none are
 * skipped (opt_group keeps the model's group index). No round-robin is applied. *out is
 * one allocation (free() it), like zck_zero3_sub_groups. */
struct zck_model;
zck_status zck_layout_model_groups(const struct zck_model *m, zck_group_spec **out, size_t *n_out);

/* The inverse, as a reader rebuilds m's groups from a checkpoint's flat groups: the params
 * of flat group f (flat[flat_first[f] .. flat_first[f+1]), in flat order) join m's group
 * opt_of[f] in group order, round_robin_gradients' order (round_robin: stage 1/2 with it
 * on, over `world` ranks) undone. */
zck_status zck_layout_groups_to_model(struct zck_model *m, const uint32_t *flat, const size_t *flat_first,
                                      size_t n_flat, const int32_t *opt_of, bool round_robin, uint32_t world);

/* Round-robin order of DeepSpeed's round_robin_gradients (_round_robin_reorder): the
 * entries at positions i % w == 0 in order, then i % w == 1, ... out must not alias in. */
void zck_round_robin_order(const uint32_t *in, size_t n, uint32_t w, uint32_t *out);

/* ---- the 16-bit all-weights copy and the frozen params (layout_lp.c): one home for their
 * rules, for every reader, writer and the saver */

/* The params holding their own data (not tied aliases: they share their source's), in
 * manifest order: what a 16-bit all-weights copy holds (stage 1/2's module, HF's
 * model.safetensors). out (room for m->n_params, or NULL to count) gets them; returns how
 * many. */
size_t zck_lp_params(const struct zck_model *m, uint32_t *out);
/* The frozen ones of them (frozen_param_shapes' params), in manifest order; as above. */
size_t zck_frozen_params(const struct zck_model *m, uint32_t *out);

/* The 16-bit all-weights layout: store i holds params[i] whole (the order the caller's file
 * wants); params NULL: zck_lp_params' in manifest order. */
zck_status zck_layout_lp(const struct zck_model *m, const uint64_t *numel, const uint32_t *params, size_t n,
                         zck_layout **out);
/* The frozen params' layout at a ZeRO stage: stage 3, each its own ZeRO-3 sub-group (the
 * frozen_param_fragments of every rank: store i*W + r); stage 1/2, whole (store i). Either
 * way frozen[i] of rank r is zck_layout_store_id(l, i, r) (r = 0 below stage 3). */
zck_status zck_layout_frozen(size_t n_params, const uint64_t *numel, const uint32_t *frozen, size_t n_frozen,
                             int stage, uint32_t world, zck_layout **out);
/* Elements a frozen_param_fragments entry holds: stage 3 ceil(numel/W), else numel. */
uint64_t zck_frozen_fragment_numel(uint64_t numel, int stage, uint32_t world);
/* Checks that the fragment `what` of path holds `have` elements (zck_frozen_fragment_numel
 * of a param of `numel`); ZCK_ERR_MISMATCH saying what it should hold. */
zck_status zck_frozen_fragment_check(const char *path, const char *what, uint64_t have, uint64_t numel, int stage,
                                     uint32_t world);
/* The errors of a model file without the fragments a frozen param needs: none at all (stage
 * 3 keeps frozen params nowhere else), or none for that param. */
zck_status zck_frozen_fragments_absent(const char *path, const char *param);
zck_status zck_frozen_fragment_missing(const char *path, const char *param);

/* ---- the one ZeRO geometry of a manifest (layout_zero.c), for writers and the engine */

typedef struct zck_zero_opts {
  int stage;                 /* 1, 2 or 3 */
  uint32_t world;            /* W >= 1 */
  uint64_t sub_group_size;   /* stage 3: zero_optimization.sub_group_size (elements) */
  bool round_robin;          /* stage 1/2: round_robin_gradients flat order */
  uint32_t param_align;      /* stage 1/2: parameter_alignment's element multiple; 0/1: off */
} zck_zero_opts;

typedef struct zck_zero_geometry {
  zck_layout *train;         /* fp32 master, exp_avg, exp_avg_sq: stores g*W + r */
  zck_layout *frozen;        /* stage 3: frozen params, one sub-group each, as
                                frozen_param_fragments (no groups without any); else NULL */
  zck_group_spec *flat;      /* stage 1/2: flat groups in flat order (round-robin applied),
                                one per param group, empty ones included; stage 3: sub-groups */
  size_t n_flat;
  uint32_t *frozen_params;   /* frozen params holding their own data (not tied aliases), in
                                manifest order */
  size_t n_frozen;
  uint64_t *numel;           /* [n_params] */
  uint32_t *flat_mem_;       /* storage behind flat[].params (stage 1/2) */
} zck_zero_geometry;

/* The partitions DeepSpeed makes of m's trainable params for o: per param group its
 * trainable params (zck_model_group_trainable) in group order, then zck_layout_zero12 or
 * zck_zero3_sub_groups + zck_layout_zero3. The caller may take any pointer it wants to keep
 * (and NULL it) before zck_zero_geometry_free. */
zck_status zck_zero_geometry_build(const struct zck_model *m, const zck_zero_opts *o, zck_zero_geometry *out);
void zck_zero_geometry_free(zck_zero_geometry *g);

#endif
