/* ckpt_state.c: the ranks' memory as a state view (lib/state.h): what a save and the
 * 16-bit gather copy from, what a resume copies into (the saver's describe hooks, ckpt.c).
 *
 * Stores are numbered as the ZeRO layouts number them: store g*W + r is rank r's array of
 * flat group (stage 1/2) or sub-group (stage 3) g. */
#include "ckpt_internal.h"

#include "error.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* The kinds a rank keeps per flat group, with the memory account each lives in. */
static const ze_mem_kind mem_of[ZCK_STATE_KINDS] = {ZE_MEM_MASTER, ZE_MEM_EXP_AVG, ZE_MEM_EXP_AVG_SQ, ZE_MEM_LP,
                                                     ZE_MEM_LP};

static void *rank_array(const ze_zero_rank *zr, zck_state_kind k, size_t g) {
  switch (k) {
  case ZCK_STATE_FP32: return zr->fp32[g];
  case ZCK_STATE_EXP_AVG: return zr->exp_avg[g];
  case ZCK_STATE_EXP_AVG_SQ: return zr->exp_avg_sq[g];
  default: return zr->frozen_lp[g]; /* stage-3 frozen partitions */
  }
}

/* stores[g*W + r] = memory of ranks[r]'s array g of kind k; with `only`, that rank's
 * stores alone (its rank-restricted layout names no other). */
static zck_status rank_stores(const ze_zero_plan *plan, ze_zero_rank *const *ranks, ze_zero_rank *only,
                              zck_state_kind k, const char *name, zck_store **out) {
  const zck_layout *l = k == ZCK_STATE_FROZEN ? plan->frozen : plan->train;
  uint32_t W = plan->o.world;
  zck_store *st = zck__calloc(l->n_stores ? l->n_stores : 1, sizeof *st);
  if (!st) return ZCK_ERR_NO_MEMORY;
  for (size_t g = 0; g < l->n_groups; g++)
    for (uint32_t r = 0; r < W; r++) {
      ze_zero_rank *zr = only ? (r == only->rank ? only : NULL) : ranks[r];
      if (!zr) continue;
      zck_dtype dt = k == ZCK_STATE_FROZEN ? plan->o.lp_dtype : ZCK_F32;
      st[g * W + r] = ze_zero_store(zr, mem_of[k], rank_array(zr, k, g), dt, l->groups[g].partition, name);
    }
  *out = st;
  return ZCK_OK;
}

/* Stage 1/2 frozen params as one custom layout: store 0 is frozen_full (their lp copies,
 * concatenated in manifest order). */
static zck_status frozen_full_layout(const ze_zero_plan *plan, zck_layout **out) {
  zck_piece *pc = zck__calloc(plan->n_frozen ? plan->n_frozen : 1, sizeof *pc);
  if (!pc) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < plan->n_frozen; i++) {
    uint32_t p = plan->frozen_params[i];
    pc[i] = (zck_piece){p, 0, 0, plan->home[p].off, plan->numel[p], 0, 0};
  }
  zck_layout_store st = {-1, -1, -1, plan->frozen_numel, plan->frozen_numel};
  zck_status s = zck_layout_custom(plan->model->n_params, plan->numel, &st, 1, pc, plan->n_frozen, out);
  free(pc);
  return s;
}

/* Stage 1/2: stores[g*W + r] = rank r's slice of zr's whole lp flat of group g. */
static zck_status lp_flat_stores(const ze_zero_plan *plan, const ze_zero_rank *zr, zck_store **out) {
  const zck_layout *l = plan->train;
  uint32_t W = plan->o.world;
  size_t es = zck_dtype_size(plan->o.lp_dtype);
  zck_store *st = zck__calloc(l->n_stores ? l->n_stores : 1, sizeof *st);
  if (!st) return ZCK_ERR_NO_MEMORY;
  for (size_t g = 0; g < l->n_groups; g++)
    for (uint32_t r = 0; r < W; r++) {
      uint64_t part = l->groups[g].partition;
      st[g * W + r] = ze_zero_store(zr, ZE_MEM_LP, (uint8_t *)zr->lp[g] + r * part * es, plan->o.lp_dtype, part,
                                    "rank 0 lp weights");
    }
  *out = st;
  return ZCK_OK;
}

void ze__state_free(ze__state *s) {
  for (size_t i = 0; i < sizeof s->layouts / sizeof s->layouts[0]; i++) zck_layout_free(s->layouts[i]);
  for (size_t i = 0; i < sizeof s->stores / sizeof s->stores[0]; i++) free(s->stores[i]);
  memset(s, 0, sizeof *s);
}

/* A layout of the plan's, or (only) its restriction to that rank, owned by s. */
static zck_status rank_layout(ze__state *s, int slot, const zck_layout *l, const ze_zero_rank *only,
                              const zck_layout **out) {
  *out = l;
  if (!only || !l) return ZCK_OK;
  ZCK_TRY(zck_layout_restrict_rank(l, (int32_t)only->rank, &s->layouts[slot]));
  *out = s->layouts[slot];
  return ZCK_OK;
}

/* The 16-bit copies that are whole on one rank: stage 1/2's lp flat (the live 16-bit
 * weights, replicated) and frozen_full (the frozen params). */
static zck_status whole_16bit(ze__state *s, const ze_zero_plan *plan, ze_zero_rank *zr, bool lp, const char *name) {
  if (lp) {
    ZCK_TRY(lp_flat_stores(plan, zr, &s->stores[ZCK_STATE_LP]));
    s->v.part[ZCK_STATE_LP] = (zck_state_part){plan->train, s->stores[ZCK_STATE_LP], NULL};
  }
  if (!plan->n_frozen) return ZCK_OK;
  ZCK_TRY(frozen_full_layout(plan, &s->layouts[2]));
  if (!(s->stores[ZCK_STATE_FROZEN] = zck__calloc(1, sizeof(zck_store)))) return ZCK_ERR_NO_MEMORY;
  s->stores[ZCK_STATE_FROZEN][0] = ze_zero_store(zr, ZE_MEM_LP, zr->frozen_full, plan->o.lp_dtype, plan->frozen_numel, name);
  s->v.part[ZCK_STATE_FROZEN] = (zck_state_part){s->layouts[2], s->stores[ZCK_STATE_FROZEN], NULL};
  return ZCK_OK;
}

zck_status ze__state_of_ranks(const ze_zero_plan *plan, ze_zero_rank *const *ranks, ze_zero_rank *only,
                              ze_zero_rank *zr0, ze__state *s) {
  memset(s, 0, sizeof *s);
  s->v.model = plan->model;
  s->v.name = "rank memory";
  const zck_layout *train = NULL;
  zck_status st = rank_layout(s, 0, plan->train, only, &train);
  for (int k = ZCK_STATE_FP32; st == ZCK_OK && k <= ZCK_STATE_EXP_AVG_SQ; k++) {
    st = rank_stores(plan, ranks, only, (zck_state_kind)k, "rank memory", &s->stores[k]);
    s->v.part[k] = (zck_state_part){train, s->stores[k], NULL};
  }
  if (st == ZCK_OK && plan->o.stage < 3 && zr0) st = whole_16bit(s, plan, zr0, true, "rank 0 frozen weights");
  if (st == ZCK_OK && plan->o.stage == 3 && plan->frozen) {
    const zck_layout *fl = NULL;
    st = rank_layout(s, 1, plan->frozen, only, &fl);
    if (st == ZCK_OK) st = rank_stores(plan, ranks, only, ZCK_STATE_FROZEN, "rank memory", &s->stores[ZCK_STATE_FROZEN]);
    if (st == ZCK_OK) s->v.part[ZCK_STATE_FROZEN] = (zck_state_part){fl, s->stores[ZCK_STATE_FROZEN], NULL};
  }
  if (st != ZCK_OK) ze__state_free(s);
  return st;
}

zck_status ze__state_of_rank_target(ze_zero_rank *zr, ze__state *s) {
  const ze_zero_plan *plan = zr->plan;
  memset(s, 0, sizeof *s);
  s->v.model = plan->model;
  s->v.name = "rank memory";
  const zck_layout *train = NULL;
  zck_status st = rank_layout(s, 0, plan->train, zr, &train);
  for (int k = ZCK_STATE_FP32; st == ZCK_OK && k <= ZCK_STATE_EXP_AVG_SQ; k++) {
    st = rank_stores(plan, NULL, zr, (zck_state_kind)k, "rank memory", &s->stores[k]);
    s->v.part[k] = (zck_state_part){train, s->stores[k], NULL};
  }
  if (st == ZCK_OK && plan->o.stage == 3 && plan->n_frozen) {
    const zck_layout *fl = NULL;
    st = rank_layout(s, 1, plan->frozen, zr, &fl);
    if (st == ZCK_OK) st = rank_stores(plan, NULL, zr, ZCK_STATE_FROZEN, "rank memory", &s->stores[ZCK_STATE_FROZEN]);
    if (st == ZCK_OK) s->v.part[ZCK_STATE_FROZEN] = (zck_state_part){fl, s->stores[ZCK_STATE_FROZEN], NULL};
  }
  if (st == ZCK_OK && plan->o.stage < 3) st = whole_16bit(s, plan, zr, false, "rank frozen weights");
  /* padding reads as zero: nothing writes it */
  for (int k = 0; st == ZCK_OK && k < ZCK_STATE_KINDS; k++) {
    const zck_state_part *p = &s->v.part[k];
    if (!p->layout || (k == ZCK_STATE_FROZEN && plan->o.stage < 3)) continue;
    for (size_t g = 0; st == ZCK_OK && g < p->layout->n_groups; g++) {
      zck_dtype dt = k == ZCK_STATE_FROZEN ? plan->o.lp_dtype : ZCK_F32;
      st = ze_zero_clear(zr, mem_of[k], rank_array(zr, (zck_state_kind)k, g),
                         p->layout->groups[g].partition * zck_dtype_size(dt));
    }
  }
  if (st != ZCK_OK) ze__state_free(s);
  return st;
}
