/* zero.c: ZeRO 1/2/3 partitions, collectives and the optimizer step (see zero.h). */
#include "zero.h"

#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

// ---- plan

void ze_zero_plan_free(ze_zero_plan *plan) {
  if (!plan) return;
  free(plan->numel);
  free(plan->model_off);
  free(plan->frozen_params);
  zck_layout_free(plan->train);
  zck_layout_free(plan->frozen);
  memset(plan, 0, sizeof *plan);
}

zck_status ze_zero_plan_build(ze_zero_plan *plan, const zck_model *m, const uint64_t *model_off, size_t model_numel,
                              const ze_zero_opts *o) {
  memset(plan, 0, sizeof *plan);
  ZCK_FAIL_IF(o->stage < 1 || o->stage > 3, ZCK_ERR_INVALID_ARG, "ZeRO stage %d is not 1, 2 or 3", o->stage);
  ZCK_FAIL_IF(o->world < 1, ZCK_ERR_INVALID_ARG, "world size %u", o->world);
  ZCK_FAIL_IF(o->lp_dtype != ZCK_BF16 && o->lp_dtype != ZCK_F32, ZCK_ERR_INVALID_ARG, "16-bit dtype %s not supported",
              zck_dtype_name(o->lp_dtype));
  plan->o = *o;
  plan->model = m;
  plan->model_numel = model_numel;
  size_t n = m->n_params;
  zck_status s = ZCK_OK;
  zck_group_spec *specs = NULL, *subs = NULL;
  uint32_t *idx = NULL;
  plan->numel = zck__calloc(n ? n : 1, sizeof *plan->numel);
  plan->model_off = zck__calloc(n ? n : 1, sizeof *plan->model_off);
  plan->frozen_params = zck__calloc(n ? n : 1, sizeof *plan->frozen_params);
  specs = zck__calloc(m->n_groups ? m->n_groups : 1, sizeof *specs);
  idx = zck__calloc(n ? n : 1, sizeof *idx);
  if (!plan->numel || !plan->model_off || !plan->frozen_params || !specs || !idx) {
    s = ZCK_ERR_NO_MEMORY;
    goto done;
  }
  zck_model_numels(m, plan->numel);
  memcpy(plan->model_off, model_off, n * sizeof *model_off);
  for (size_t p = 0; p < n; p++)
    if (m->params[p].frozen && m->params[p].tied_to < 0) {
      plan->frozen_params[plan->n_frozen++] = (uint32_t)p;
      plan->frozen_numel += plan->numel[p];
    }
  /* trainable params of every optimizer group, in group order */
  size_t used = 0;
  for (size_t g = 0; g < m->n_groups; g++) {
    size_t k = zck_model_group_trainable(m, (uint32_t)g, idx + used, n - used);
    specs[g] = (zck_group_spec){idx + used, k, (int32_t)g};
    used += k;
  }
  if (o->stage < 3) {
    ZCK_CHECK_GOTO(zck_layout_zero12(n, plan->numel, specs, m->n_groups, o->world, 1, &plan->train), s, done);
  } else {
    size_t n_sub = 0;
    ZCK_CHECK_GOTO(zck_zero3_sub_groups(plan->numel, specs, m->n_groups, o->world, o->sub_group_size, &subs, &n_sub), s,
                   done);
    ZCK_CHECK_GOTO(zck_layout_zero3(n, plan->numel, subs, n_sub, o->world, &plan->train), s, done);
    /* frozen params: one sub-group each, as frozen_param_fragments */
    zck_group_spec *fs = zck__calloc(plan->n_frozen ? plan->n_frozen : 1, sizeof *fs);
    if (!fs) {
      s = ZCK_ERR_NO_MEMORY;
      goto done;
    }
    for (size_t i = 0; i < plan->n_frozen; i++) fs[i] = (zck_group_spec){&plan->frozen_params[i], 1, -1};
    s = zck_layout_zero3(n, plan->numel, fs, plan->n_frozen, o->world, &plan->frozen);
    free(fs);
    if (s != ZCK_OK) goto done;
  }
  for (size_t g = 0; g < plan->train->n_groups; g++)
    if (plan->train->groups[g].aligned > plan->max_flat) plan->max_flat = plan->train->groups[g].aligned;
  if (plan->frozen)
    for (size_t g = 0; g < plan->frozen->n_groups; g++)
      if (plan->frozen->groups[g].aligned > plan->max_flat) plan->max_flat = plan->frozen->groups[g].aligned;
done:
  free(specs);
  free(subs);
  free(idx);
  if (s != ZCK_OK) ze_zero_plan_free(plan);
  return s;
}

double ze_zero_group_weight_decay(const ze_zero_plan *plan, size_t g) {
  int32_t og = plan->train->groups[g].opt_group;
  if (og < 0) return 0.0;
  const zck_hparam *h = zck_model_group_get(plan->model, (uint32_t)og, "weight_decay");
  if (!h) return 0.0;
  return h->kind == ZCK_HP_FLOAT ? h->f[0] : h->kind == ZCK_HP_INT ? (double)h->i : 0.0;
}

// ---- moving data between the model buffer and a group's flat array

/* flat[k*part + store_off ...] = model[model_off[p] + param_off ...] * scale, padding zero. */
static void pack_group(const ze_zero_plan *plan, const zck_layout *l, size_t g, const float *model, float scale,
                       float *flat) {
  uint64_t part = l->groups[g].partition;
  memset(flat, 0, l->world * part * sizeof *flat);
  for (uint32_t k = 0; k < l->world; k++) {
    uint32_t st = zck_layout_store_id(l, (uint32_t)g, k);
    for (size_t i = l->store_first[st]; i < l->store_first[st + 1]; i++) {
      const zck_piece *pc = &l->pieces[l->by_store[i]];
      const float *src = model + plan->model_off[pc->param] + pc->param_off;
      float *dst = flat + k * part + pc->store_off;
      if (scale == 1.0f)
        memcpy(dst, src, pc->count * sizeof *dst);
      else
        for (uint64_t j = 0; j < pc->count; j++) dst[j] = src[j] / scale;
    }
  }
}

/* model[...] = fp32(lp_flat[k*part + store_off ...]). */
static void unpack_group(const ze_zero_plan *plan, const zck_layout *l, size_t g, const void *lp_flat, float *model) {
  uint64_t part = l->groups[g].partition;
  size_t es = zck_dtype_size(plan->o.lp_dtype);
  for (uint32_t k = 0; k < l->world; k++) {
    uint32_t st = zck_layout_store_id(l, (uint32_t)g, k);
    for (size_t i = l->store_first[st]; i < l->store_first[st + 1]; i++) {
      const zck_piece *pc = &l->pieces[l->by_store[i]];
      const uint8_t *src = (const uint8_t *)lp_flat + (k * part + pc->store_off) * es;
      zck_convert(ZCK_F32, model + plan->model_off[pc->param] + pc->param_off, plan->o.lp_dtype, src, pc->count);
    }
  }
}

// ---- rank lifetime

static void *ze_alloc(ze_zero_rank *zr, size_t n, size_t es, bool count) {
  void *p = zck__calloc(n ? n : 1, es);
  if (p && count) zr->state_bytes += n * es;
  return p;
}

void ze_zero_rank_free(ze_zero_rank *zr) {
  if (!zr) return;
  for (size_t g = 0; g < zr->n_groups; g++) {
    if (zr->fp32) free(zr->fp32[g]);
    if (zr->exp_avg) free(zr->exp_avg[g]);
    if (zr->exp_avg_sq) free(zr->exp_avg_sq[g]);
    if (zr->grad) free(zr->grad[g]);
    if (zr->lp) free(zr->lp[g]);
  }
  free(zr->fp32);
  free(zr->exp_avg);
  free(zr->exp_avg_sq);
  free(zr->grad);
  free(zr->lp);
  if (zr->frozen_lp && zr->plan && zr->plan->frozen)
    for (size_t g = 0; g < zr->plan->frozen->n_groups; g++) free(zr->frozen_lp[g]);
  free(zr->frozen_lp);
  free(zr->frozen_full);
  free(zr->work);
  free(zr->gwork);
  free(zr->flat);
  free(zr->lp_flat);
  memset(zr, 0, sizeof *zr);
}

zck_status ze_zero_rank_init(ze_zero_rank *zr, const ze_zero_plan *plan, zck_comm *comm, const float *init) {
  memset(zr, 0, sizeof *zr);
  ZCK_ASSERT(comm->size == (int)plan->o.world);
  zr->plan = plan;
  zr->comm = comm;
  zr->rank = (uint32_t)comm->rank;
  const zck_layout *l = plan->train;
  zck_dtype lp = plan->o.lp_dtype;
  size_t es = zck_dtype_size(lp);
  size_t G = zr->n_groups = l->n_groups;
  bool z3 = plan->o.stage == 3;
  zr->fp32 = zck__calloc(G ? G : 1, sizeof(float *));
  zr->exp_avg = zck__calloc(G ? G : 1, sizeof(float *));
  zr->exp_avg_sq = zck__calloc(G ? G : 1, sizeof(float *));
  zr->grad = zck__calloc(G ? G : 1, sizeof(float *));
  zr->lp = zck__calloc(G ? G : 1, sizeof(void *));
  zr->work = ze_alloc(zr, plan->model_numel, sizeof(float), false);
  zr->gwork = ze_alloc(zr, plan->model_numel, sizeof(float), false);
  zr->flat = ze_alloc(zr, plan->max_flat, sizeof(float), false);
  zr->lp_flat = z3 ? ze_alloc(zr, plan->max_flat, es, false) : NULL;
  if (!zr->fp32 || !zr->exp_avg || !zr->exp_avg_sq || !zr->grad || !zr->lp || !zr->work || !zr->gwork || !zr->flat ||
      (z3 && !zr->lp_flat))
    goto oom;
  for (size_t g = 0; g < G; g++) {
    uint64_t part = l->groups[g].partition;
    zr->fp32[g] = ze_alloc(zr, part, sizeof(float), true);
    zr->exp_avg[g] = ze_alloc(zr, part, sizeof(float), true);
    zr->exp_avg_sq[g] = ze_alloc(zr, part, sizeof(float), true);
    zr->grad[g] = ze_alloc(zr, part, sizeof(float), true);
    zr->lp[g] = ze_alloc(zr, z3 ? part : part * l->world, es, true);
    if (!zr->fp32[g] || !zr->exp_avg[g] || !zr->exp_avg_sq[g] || !zr->grad[g] || !zr->lp[g]) goto oom;
    /* lp = round(init); fp32 master = fp32(lp partition) */
    pack_group(plan, l, g, init, 1.0f, zr->flat);
    const float *mine = zr->flat + zr->rank * part;
    if (z3) {
      zck_convert(lp, zr->lp[g], ZCK_F32, mine, part);
      zck_convert(ZCK_F32, zr->fp32[g], lp, zr->lp[g], part);
    } else {
      zck_convert(lp, zr->lp[g], ZCK_F32, zr->flat, part * l->world);
      zck_convert(ZCK_F32, zr->fp32[g], lp, (uint8_t *)zr->lp[g] + zr->rank * part * es, part);
    }
  }
  /* frozen params: lp-rounded, whole (stage 1/2) or partitioned (stage 3) */
  if (z3) {
    const zck_layout *fl = plan->frozen;
    zr->frozen_lp = zck__calloc(fl->n_groups ? fl->n_groups : 1, sizeof(void *));
    if (!zr->frozen_lp) goto oom;
    for (size_t g = 0; g < fl->n_groups; g++) {
      uint64_t part = fl->groups[g].partition;
      zr->frozen_lp[g] = ze_alloc(zr, part, es, true);
      if (!zr->frozen_lp[g]) goto oom;
      pack_group(plan, fl, g, init, 1.0f, zr->flat);
      zck_convert(lp, zr->frozen_lp[g], ZCK_F32, zr->flat + zr->rank * part, part);
    }
  } else {
    zr->frozen_full = ze_alloc(zr, plan->frozen_numel, es, true);
    if (!zr->frozen_full) goto oom;
    uint64_t off = 0;
    for (size_t i = 0; i < plan->n_frozen; i++) {
      uint32_t p = plan->frozen_params[i];
      const float *src = init + plan->model_off[p];
      void *dst = (uint8_t *)zr->frozen_full + off * es;
      zck_convert(lp, dst, ZCK_F32, src, plan->numel[p]);
      zck_convert(ZCK_F32, zr->work + plan->model_off[p], lp, dst, plan->numel[p]);
      off += plan->numel[p];
    }
  }
  if (z3) {
    /* frozen params never change: gather them once */
    const zck_layout *fl = plan->frozen;
    for (size_t g = 0; g < fl->n_groups; g++) {
      uint64_t part = fl->groups[g].partition;
      ZCK_TRY(comm->all_gather(comm, zr->frozen_lp[g], zr->lp_flat, part, lp));
      unpack_group(plan, fl, g, zr->lp_flat, zr->work);
    }
  }
  return ze_zero_gather(zr);
oom:
  ze_zero_rank_free(zr);
  return zck__fail(ZCK_ERR_NO_MEMORY, "rank %d: out of memory for the ZeRO state", comm->rank);
}

// ---- collectives of a step

zck_status ze_zero_gather(ze_zero_rank *zr) {
  const ze_zero_plan *plan = zr->plan;
  const zck_layout *l = plan->train;
  zck_dtype lp = plan->o.lp_dtype;
  size_t es = zck_dtype_size(lp);
  for (size_t g = 0; g < zr->n_groups; g++) {
    uint64_t part = l->groups[g].partition;
    if (plan->o.stage == 3) {
      ZCK_TRY(zr->comm->all_gather(zr->comm, zr->lp[g], zr->lp_flat, part, lp));
      unpack_group(plan, l, g, zr->lp_flat, zr->work);
    } else {
      uint8_t *flat = zr->lp[g];
      ZCK_TRY(zr->comm->all_gather(zr->comm, flat + zr->rank * part * es, flat, part, lp));
      unpack_group(plan, l, g, flat, zr->work);
    }
  }
  return ZCK_OK;
}

zck_status ze_zero_reduce(ze_zero_rank *zr, bool last) {
  const ze_zero_plan *plan = zr->plan;
  const zck_layout *l = plan->train;
  bool stage1 = plan->o.stage == 1;
  if (stage1 && !last) return ZCK_OK; /* stage 1 accumulates locally until the step */
  float W = (float)plan->o.world;
  for (size_t g = 0; g < zr->n_groups; g++) {
    uint64_t part = l->groups[g].partition;
    /* DeepSpeed divides by the world size before the sum (average_tensor) */
    pack_group(plan, l, g, zr->gwork, W, zr->flat);
    float *mine = zr->flat + zr->rank * part;
    ZCK_TRY(zr->comm->reduce_scatter(zr->comm, zr->flat, mine, part, ZCK_F32, ZCK_COMM_SUM));
    float *acc = zr->grad[g];
    if (stage1)
      memcpy(acc, mine, part * sizeof *acc);
    else
      for (uint64_t i = 0; i < part; i++) acc[i] += mine[i];
  }
  memset(zr->gwork, 0, plan->model_numel * sizeof *zr->gwork);
  return ZCK_OK;
}

zck_status ze_zero_grad_norm(ze_zero_rank *zr, double *norm) {
  double ss = 0.0;
  for (size_t g = 0; g < zr->n_groups; g++) {
    uint64_t part = ze_zero_part(zr->plan, g);
    const float *d = zr->grad[g];
    for (uint64_t i = 0; i < part; i++) ss += (double)d[i] * d[i];
  }
  ZCK_TRY(zr->comm->all_reduce(zr->comm, &ss, &ss, 1, ZCK_F64, ZCK_COMM_SUM));
  *norm = sqrt(ss);
  return ZCK_OK;
}

zck_status ze_zero_step(ze_zero_rank *zr, const ze_adamw_hp *hp, double clip) {
  const ze_zero_plan *plan = zr->plan;
  zck_dtype lp = plan->o.lp_dtype;
  size_t es = zck_dtype_size(lp);
  float cf = (float)clip;
  zr->step++;
  for (size_t g = 0; g < zr->n_groups; g++) {
    uint64_t part = ze_zero_part(plan, g);
    float *d = zr->grad[g];
    if (clip != 1.0)
      for (uint64_t i = 0; i < part; i++) d[i] *= cf;
    ze_adamw_hp h = *hp;
    h.weight_decay = ze_zero_group_weight_decay(plan, g);
    ze_adamw_step(zr->fp32[g], d, zr->exp_avg[g], zr->exp_avg_sq[g], part, &h, zr->step);
    memset(d, 0, part * sizeof *d);
    void *dst = plan->o.stage == 3 ? zr->lp[g] : (uint8_t *)zr->lp[g] + zr->rank * part * es;
    zck_convert(lp, dst, ZCK_F32, zr->fp32[g], part);
  }
  return ze_zero_gather(zr);
}
