/* plan.h: a copy plan, the intersection of a source and a target layout.
 *
 * For every param, the source pieces and the target pieces (both sorted by param offset)
 * are swept together; each overlap becomes an extent "count elements from src store at
 * src_off to dst store at dst_off". A strided piece (a chunk that cuts an inner dimension)
 * meets a contiguous one in at most two extents (a partial first run, then strided runs
 * whose last may be partial); two strided pieces meet run by run. Extents that continue each other in both stores are
 * merged, big ones are split so threads balance, and the list is sorted by (src store,
 * src_off) so each source is read front to back. All counts and offsets are in elements;
 * the stores' dtypes are only known when the plan is executed (exec.h), so one plan
 * serves every state kind (fp32, exp_avg, exp_avg_sq) of the same geometry.
 */
#ifndef ZCK_PLAN_H
#define ZCK_PLAN_H

#include "layout.h"

typedef struct zck_extent {
  uint32_t src_store, dst_store;
  uint32_t param;          /* the param the first elements belong to (for messages) */
  uint64_t src_off, dst_off;
  uint64_t count;          /* elements in all */
  /* strided (layout.h's runs): run 0, one run of count elements in both stores; else runs
   * of `run` elements (the last may be shorter), the k-th at src_off + k * src_stride and
   * dst_off + k * dst_stride (each stride >= run; a stride equal to run: that side is
   * contiguous). A 2-D chunk copied into its tensor is one extent, not one per row. */
  uint64_t run, src_stride, dst_stride;
} zck_extent;

static inline bool zck_extent_strided(const zck_extent *e) { return e->run && e->run < e->count; }
/* Element k of the extent in its source and its target store. */
static inline uint64_t zck_extent_src_at(const zck_extent *e, uint64_t k) {
  return zck_runs_at(e->src_off, zck_extent_strided(e) ? e->run : 0, e->src_stride, k);
}
static inline uint64_t zck_extent_dst_at(const zck_extent *e, uint64_t k) {
  return zck_runs_at(e->dst_off, zck_extent_strided(e) ? e->run : 0, e->dst_stride, k);
}

typedef struct zck_plan {
  zck_extent *ext;
  size_t n;
  size_t n_src_stores, n_dst_stores;   /* the layouts' store counts */
  uint64_t total;                      /* elements copied */
} zck_plan;

typedef enum zck_plan_order {
  ZCK_PLAN_BY_SRC = 0,   /* (src_store, src_off): sequential reads (default) */
  ZCK_PLAN_BY_DST        /* (dst_store, dst_off): sequential writes */
} zck_plan_order;

typedef struct zck_plan_opts {
  uint64_t max_chunk;        /* split extents longer than this many elements; 0: no split */
  bool allow_missing;        /* target elements no source piece covers are skipped instead
                                of failing with ZCK_ERR_MISMATCH */
  bool merge;                /* merge extents contiguous in both stores (default true) */
  zck_plan_order order;
  const char *const *param_names; /* optional [n_params], for messages */
} zck_plan_opts;

/* 4 Mi elements per chunk: 16 MiB of fp32, enough per task to amortise a syscall. */
#define ZCK_PLAN_DEFAULT_CHUNK ((uint64_t)4 << 20)
#define ZCK_PLAN_OPTS_INIT {ZCK_PLAN_DEFAULT_CHUNK, false, true, ZCK_PLAN_BY_SRC, NULL}

/* Builds the plan copying, for every param, the elements dst maps from where src maps
 * them. Fails with ZCK_ERR_MISMATCH when the layouts disagree on the param count or a
 * param's numel, or (unless allow_missing) when the target needs elements the source
 * lacks ("param NAME: elements [a, b) are in no source store"). opts may be NULL. */
zck_status zck_plan_build(const zck_layout *src, const zck_layout *dst, const zck_plan_opts *opts,
                          zck_plan **out);

/* Building blocks (zck_plan_build uses them; exposed for hand-made plans). */
/* Sorts (by the order), then merges extents contiguous in both stores (strided ones are
 * left as they are). */
void zck_plan_normalize(zck_plan *p, zck_plan_order order, bool merge);
/* Splits extents longer than max_chunk elements (max_chunk 0: no-op); a strided extent
 * into strided ones of whole runs (runs longer than max_chunk: one run each, then split). */
zck_status zck_plan_split(zck_plan *p, uint64_t max_chunk);
/* The plan with strided extents cut into one contiguous extent per run: those whose source
 * side is not contiguous (src_stride != run), or every one (all). *out is NULL when there is
 * none to cut (use p). For consumers that take a contiguous target or source only. */
zck_status zck_plan_unstride(const zck_plan *p, bool all, zck_plan **out);
/* Makes a plan from an explicit extent list (copied). */
zck_status zck_plan_from_extents(const zck_extent *ext, size_t n, size_t n_src_stores,
                                 size_t n_dst_stores, zck_plan **out);

/* Part `index` of `parts` of the plan, balanced by element count, cutting only between
 * extents: for ranks that split one job by output range (each runs its own part). */
zck_status zck_plan_slice(const zck_plan *p, uint32_t index, uint32_t parts, zck_plan **out);

void zck_plan_free(zck_plan *p);

#endif
