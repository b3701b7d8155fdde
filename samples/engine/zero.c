/* zero.c: ZeRO 1/2/3 partitions, collectives and the optimizer step (see zero.h).
 *
 * One copy of the logic for both places the state can live: host memory, or a device
 * (dzero.h). Where an array may be on the device, the host loop is kept as it is and the
 * device case calls the backend's operation, which does the same arithmetic. */
#include "zero.h"

#include "dzero.h"
#include "zero_internal.h"
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
  free(plan->home);
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
  plan->model_off = zck__calloc(n ? n : 1, sizeof *plan->model_off);
  if (!plan->model_off) {
    s = ZCK_ERR_NO_MEMORY;
    goto done;
  }
  memcpy(plan->model_off, model_off, n * sizeof *model_off);
  /* the partitions the DeepSpeed writer lays out for this configuration, by the same
   * function (no round-robin: dsconfig.c refuses it; no parameter_alignment, as the
   * writer's options in ckpt.c say) */
  zck_zero_opts zo = {o->stage, o->world, o->sub_group_size, false, 1};
  zck_zero_geometry geo;
  ZCK_CHECK_GOTO(zck_zero_geometry_build(m, &zo, &geo), s, done);
  plan->numel = geo.numel;
  plan->train = geo.train;
  plan->frozen = geo.frozen;
  plan->frozen_params = geo.frozen_params;
  plan->n_frozen = geo.n_frozen;
  geo.numel = NULL;
  geo.train = geo.frozen = NULL;
  geo.frozen_params = NULL;
  zck_zero_geometry_free(&geo);
  for (size_t i = 0; i < plan->n_frozen; i++) plan->frozen_numel += plan->numel[plan->frozen_params[i]];
  /* where each param's values live on a rank */
  plan->home = zck__calloc(n ? n : 1, sizeof *plan->home);
  if (!plan->home) {
    s = ZCK_ERR_NO_MEMORY;
    goto done;
  }
  for (size_t p = 0; p < n; p++)
    if (m->params[p].tied_to < 0) plan->home[p].where = m->params[p].frozen ? 2 : 1;
  if (o->stage == 3) {
    const zck_layout *ls[2] = {plan->train, plan->frozen};
    for (int k = 0; k < 2; k++)
      for (size_t g = 0; g < ls[k]->n_groups; g++)
        for (size_t i = 0; i < ls[k]->groups[g].n_params; i++) {
          ze_param_home *h = &plan->home[ls[k]->groups[g].params[i]];
          h->group = (uint32_t)g;
          h->off = ls[k]->groups[g].offsets[i];
        }
  } else {
    uint64_t off = 0;
    for (size_t i = 0; i < plan->n_frozen; i++) {
      plan->home[plan->frozen_params[i]].off = off;
      off += plan->numel[plan->frozen_params[i]];
    }
  }
done:
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

uint64_t ze_zero_reduce_bucket(const ze_zero_plan *plan) {
  return plan->o.reduce_bucket_size ? plan->o.reduce_bucket_size : 500000000ull;
}

uint64_t ze_zero_allgather_bucket(const ze_zero_plan *plan) {
  return plan->o.allgather_bucket_size ? plan->o.allgather_bucket_size : 500000000ull;
}

// ---- memory accounting

const char *ze_mem_kind_name(ze_mem_kind k) {
  static const char *const names[ZE_MEM_KINDS] = {"lp params",         "fp32 master",      "exp_avg",
                                                  "exp_avg_sq",        "grad partition",   "full grads",
                                                  "gathered params",   "module grads",     "buckets",
                                                  "persistent params"};
  return (unsigned)k < ZE_MEM_KINDS ? names[k] : "?";
}

void ze_mem_add(ze_mem *m, ze_mem_kind k, uint64_t bytes) {
  m->cur[k] += bytes;
  m->total += bytes;
  if (m->cur[k] > m->max[k]) m->max[k] = m->cur[k];
  if (m->total > m->peak) {
    m->peak = m->total;
    memcpy(m->at_peak, m->cur, sizeof m->at_peak);
  }
}

void ze_mem_sub(ze_mem *m, ze_mem_kind k, uint64_t bytes) {
  m->cur[k] -= bytes;
  m->total -= bytes;
}

void *ze_zero_alloc(ze_zero_rank *zr, ze_mem_kind k, size_t bytes) {
  void *p = NULL;
  if (!zr->dev)
    p = zck__calloc(bytes ? bytes : 1, 1);
  else if (ze_dzero_alloc(zr->dev, &p, bytes) != ZCK_OK)
    p = NULL;
  if (p) ze_mem_add(&zr->mem, k, bytes);
  return p;
}

void ze_zero_free(ze_zero_rank *zr, ze_mem_kind k, void *p, size_t bytes) {
  if (!p) return;
  if (zr->dev)
    ze_dzero_dfree(zr->dev, p);
  else
    free(p);
  ze_mem_sub(&zr->mem, k, bytes);
}

// ---- where an array lives, and the operations that work in either place

bool ze__on_host(const ze_zero_rank *zr, ze_mem_kind k) { return !zr->dev || ze_dzero_host(zr->dev, k); }

/* The communicator of the collectives on the state arrays and working buffers. */
zck_comm *ze__data_comm(const ze_zero_rank *zr) { return zr->dev ? zr->dev->o.comm : zr->comm; }

/* On the working memory (host, or the device). */
zck_status ze__wcopy(ze_zero_rank *zr, void *dst, const void *src, size_t bytes) {
  if (zr->dev) return ze_dzero_copy(zr->dev, dst, src, bytes);
  memcpy(dst, src, bytes);
  return ZCK_OK;
}

static zck_status wzero(ze_zero_rank *zr, void *p, size_t bytes) {
  if (zr->dev) return ze_dzero_zero(zr->dev, p, bytes);
  memset(p, 0, bytes);
  return ZCK_OK;
}

zck_status ze__wconvert(ze_zero_rank *zr, zck_dtype dt, void *dst, zck_dtype st, const void *src, size_t n) {
  if (zr->dev) return ze_dzero_convert(zr->dev, dt, dst, st, src, n);
  zck_convert(dt, dst, st, src, n);
  return ZCK_OK;
}

/* dst = src / W, DeepSpeed's average before the sum (average_tensor) */
static zck_status wdiv(ze_zero_rank *zr, float *dst, const float *src, uint64_t n, float Wf) {
  if (zr->dev) return ze_dzero_div(zr->dev, dst, src, n, Wf);
  for (uint64_t j = 0; j < n; j++) dst[j] = src[j] / Wf;
  return ZCK_OK;
}

/* acc (a gradient partition, host or device) += src (host when the partition is) */
static zck_status grad_add(ze_zero_rank *zr, float *acc, const float *src, uint64_t n) {
  if (!ze__on_host(zr, ZE_MEM_GRAD)) return ze_dzero_add(zr->dev, acc, src, n);
  for (uint64_t j = 0; j < n; j++) acc[j] += src[j];
  return ZCK_OK;
}

/* lp = RNE(fp32 master) for one partition, wherever the two live */
static zck_status lp_from_master(ze_zero_rank *zr, void *lp, const float *fp32, uint64_t n) {
  zck_dtype dt = zr->plan->o.lp_dtype;
  if (!zr->dev) {
    zck_convert(dt, lp, ZCK_F32, fp32, n);
    return ZCK_OK;
  }
  return ze_dzero_lp_from_master(zr->dev, lp, ze__on_host(zr, ZE_MEM_LP), dt, fp32, ze__on_host(zr, ZE_MEM_MASTER), n);
}

/* The persistent state arrays: host, device, or host under offload (page-locked or not). */
static void *state_alloc(ze_zero_rank *zr, ze_mem_kind k, size_t bytes) {
  if (!zr->dev || !ze_dzero_host(zr->dev, k)) return ze_zero_alloc(zr, k, bytes);
  void *p = ze_dzero_host_alloc(zr->dev, bytes, ze_dzero_pinned(zr->dev, k));
  if (p) ze_mem_add(&zr->dev->host, k, bytes);
  return p;
}

static void state_free(ze_zero_rank *zr, ze_mem_kind k, void *p) {
  if (!zr->dev)
    free(p);
  else if (ze_dzero_host(zr->dev, k))
    ze_dzero_host_free(zr->dev, p, ze_dzero_pinned(zr->dev, k));
  else
    ze_dzero_dfree(zr->dev, p);
}

/* Host values into a state array (src may be reused once this returns). */
static zck_status state_put(ze_zero_rank *zr, ze_mem_kind k, void *dst, const void *src, size_t bytes) {
  if (ze__on_host(zr, k)) {
    memcpy(dst, src, bytes);
    return ZCK_OK;
  }
  ZCK_TRY(ze_dzero_copy(zr->dev, dst, src, bytes));
  return ze_dzero_sync(zr->dev);
}

zck_status ze_zero_sync(ze_zero_rank *zr) { return zr->dev ? ze_dzero_sync(zr->dev) : ZCK_OK; }

zck_store ze_zero_store(const ze_zero_rank *zr, ze_mem_kind k, void *mem, zck_dtype dt, uint64_t numel,
                        const char *name) {
  if (!ze__on_host(zr, k)) return ze_dzero_store(zr->dev, mem, dt, numel, name);
  return zck_store_memory(mem, dt, numel, name);
}

zck_status ze_zero_clear(ze_zero_rank *zr, ze_mem_kind k, void *mem, size_t bytes) {
  if (ze__on_host(zr, k)) {
    if (zr->dev) ZCK_TRY(ze_dzero_sync(zr->dev));
    memset(mem, 0, bytes);
    return ZCK_OK;
  }
  ZCK_TRY(ze_dzero_zero(zr->dev, mem, bytes));
  return ze_dzero_sync(zr->dev);
}

// ---- rank lifetime

void ze_zero_rank_free(ze_zero_rank *zr) {
  if (!zr) return;
  for (size_t g = 0; g < zr->n_groups; g++) {
    if (zr->fp32) state_free(zr, ZE_MEM_MASTER, zr->fp32[g]);
    if (zr->exp_avg) state_free(zr, ZE_MEM_EXP_AVG, zr->exp_avg[g]);
    if (zr->exp_avg_sq) state_free(zr, ZE_MEM_EXP_AVG_SQ, zr->exp_avg_sq[g]);
    if (zr->grad) state_free(zr, ZE_MEM_GRAD, zr->grad[g]);
    if (zr->lp) state_free(zr, ZE_MEM_LP, zr->lp[g]);
  }
  free(zr->fp32);
  free(zr->exp_avg);
  free(zr->exp_avg_sq);
  free(zr->grad);
  free(zr->lp);
  if (zr->frozen_lp && zr->plan && zr->plan->frozen)
    for (size_t g = 0; g < zr->plan->frozen->n_groups; g++) state_free(zr, ZE_MEM_LP, zr->frozen_lp[g]);
  free(zr->frozen_lp);
  if (zr->frozen_full) state_free(zr, ZE_MEM_LP, zr->frozen_full);
  if (zr->gfull) state_free(zr, ZE_MEM_GRAD_FULL, zr->gfull);
  ze_dzero_free(zr->dev); /* the device frees above are queued on the rank's stream */
  memset(zr, 0, sizeof *zr);
}

/* Rounds init's values of layout l's pieces into the lp arrays[g] (arrays NULL: group
 * `only`'s alone, into `one`): whole_flat (stage 1/2) every rank's slice at k * part; else
 * only only_rank's pieces, at their store offset. */
static void init_lp_pieces(const ze_zero_plan *plan, const zck_layout *l, uint32_t only_rank, bool whole_flat,
                           void **arrays, size_t only, void *one, const float *init) {
  zck_dtype lp = plan->o.lp_dtype;
  size_t es = zck_dtype_size(lp);
  for (size_t i = 0; i < l->n_pieces; i++) {
    const zck_piece *pc = &l->pieces[i];
    uint32_t g = pc->store / l->world, k = pc->store % l->world;
    if (!whole_flat && k != only_rank) continue;
    if (!arrays && g != only) continue;
    uint64_t base = whole_flat ? k * l->groups[g].partition : 0;
    zck_convert(lp, (uint8_t *)(arrays ? arrays[g] : one) + (base + pc->store_off) * es, ZCK_F32,
                init + plan->model_off[pc->param] + pc->param_off, pc->count);
  }
}

/* Device state: each group's (and frozen group's) values built in host buffers, copied over. */
static zck_status init_dev_values(ze_zero_rank *zr, const float *init) {
  const ze_zero_plan *plan = zr->plan;
  const zck_layout *l = plan->train;
  zck_dtype lp = plan->o.lp_dtype;
  size_t es = zck_dtype_size(lp);
  bool z3 = plan->o.stage == 3;
  zck_status s = ZCK_OK;
  for (size_t g = 0; g < zr->n_groups && s == ZCK_OK; g++) {
    uint64_t part = l->groups[g].partition, lp_n = z3 ? part : part * l->world;
    uint8_t *h_lp = zck__calloc(lp_n ? lp_n : 1, es);
    float *h_fp = zck__calloc(part ? part : 1, sizeof(float));
    if (!h_lp || !h_fp) s = zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory building group %zu", zr->rank, g);
    if (s == ZCK_OK) {
      init_lp_pieces(plan, l, zr->rank, !z3, NULL, g, h_lp, init);
      zck_convert(ZCK_F32, h_fp, lp, h_lp + (z3 ? 0 : zr->rank * part * es), part);
      s = state_put(zr, ZE_MEM_LP, zr->lp[g], h_lp, lp_n * es);
    }
    if (s == ZCK_OK) s = state_put(zr, ZE_MEM_MASTER, zr->fp32[g], h_fp, part * sizeof(float));
    free(h_lp);
    free(h_fp);
  }
  const zck_layout *fl = plan->frozen;
  for (size_t g = 0; z3 && g < fl->n_groups && s == ZCK_OK; g++) {
    uint64_t part = fl->groups[g].partition;
    uint8_t *h = zck__calloc(part ? part : 1, es);
    if (!h) return zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory building frozen group %zu", zr->rank, g);
    init_lp_pieces(plan, fl, zr->rank, false, NULL, g, h, init);
    s = state_put(zr, ZE_MEM_LP, zr->frozen_lp[g], h, part * es);
    free(h);
  }
  return s;
}

zck_status ze_zero_rank_init(ze_zero_rank *zr, const ze_zero_plan *plan, zck_comm *comm, const float *init) {
  return ze_zero_rank_init_dev(zr, plan, comm, NULL, init);
}

zck_status ze_zero_rank_init_dev(ze_zero_rank *zr, const ze_zero_plan *plan, zck_comm *comm, struct ze_dzero *dev,
                                 const float *init) {
  memset(zr, 0, sizeof *zr);
  ZCK_ASSERT(comm->size == (int)plan->o.world);
  zr->dev = dev;
  zr->plan = plan;
  zck_status fs = ZCK_OK;
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
  if (!zr->fp32 || !zr->exp_avg || !zr->exp_avg_sq || !zr->grad || !zr->lp) goto oom;
  /* the arrays are freed with free() by ze_zero_rank_free; the counts stay with the rank */
  for (size_t g = 0; g < G; g++) {
    uint64_t part = l->groups[g].partition;
    zr->fp32[g] = state_alloc(zr, ZE_MEM_MASTER, part * sizeof(float));
    zr->exp_avg[g] = state_alloc(zr, ZE_MEM_EXP_AVG, part * sizeof(float));
    zr->exp_avg_sq[g] = state_alloc(zr, ZE_MEM_EXP_AVG_SQ, part * sizeof(float));
    zr->grad[g] = state_alloc(zr, ZE_MEM_GRAD, part * sizeof(float));
    zr->lp[g] = state_alloc(zr, ZE_MEM_LP, (z3 ? part : part * l->world) * es);
    if (!zr->fp32[g] || !zr->exp_avg[g] || !zr->exp_avg_sq[g] || !zr->grad[g] || !zr->lp[g]) goto oom;
  }
  /* lp = round(init) (padding stays zero); fp32 master = fp32(lp partition) */
  if (!dev) {
    init_lp_pieces(plan, l, zr->rank, !z3, zr->lp, 0, NULL, init);
    for (size_t g = 0; g < G; g++) {
      uint64_t part = l->groups[g].partition;
      const uint8_t *mine = (const uint8_t *)zr->lp[g] + (z3 ? 0 : zr->rank * part * es);
      zck_convert(ZCK_F32, zr->fp32[g], lp, mine, part);
    }
  }
  /* frozen params: lp-rounded, whole (stage 1/2) or partitioned (stage 3) */
  if (z3) {
    const zck_layout *fl = plan->frozen;
    zr->frozen_lp = zck__calloc(fl->n_groups ? fl->n_groups : 1, sizeof(void *));
    if (!zr->frozen_lp) goto oom;
    for (size_t g = 0; g < fl->n_groups; g++)
      if (!(zr->frozen_lp[g] = state_alloc(zr, ZE_MEM_LP, fl->groups[g].partition * es))) goto oom;
    if (!dev) init_lp_pieces(plan, fl, zr->rank, false, zr->frozen_lp, 0, NULL, init);
  } else {
    zr->frozen_full = state_alloc(zr, ZE_MEM_LP, plan->frozen_numel * es);
    uint8_t *ff = dev ? zck__calloc(plan->frozen_numel ? plan->frozen_numel : 1, es) : zr->frozen_full;
    if (!zr->frozen_full || !ff) {
      if (dev) free(ff);
      goto oom;
    }
    for (size_t i = 0; i < plan->n_frozen; i++) {
      uint32_t p = plan->frozen_params[i];
      zck_convert(lp, ff + plan->home[p].off * es, ZCK_F32, init + plan->model_off[p], plan->numel[p]);
    }
    if (dev) {
      fs = state_put(zr, ZE_MEM_LP, zr->frozen_full, ff, plan->frozen_numel * es);
      free(ff);
      if (fs != ZCK_OK) goto fail;
    }
  }
  if (plan->o.stage == 1) {
    zr->gfull = state_alloc(zr, ZE_MEM_GRAD_FULL, plan->model_numel * sizeof(float));
    if (!zr->gfull) goto oom;
  }
  if (dev && (fs = init_dev_values(zr, init)) != ZCK_OK) goto fail;
  return ze_zero_gather(zr);
oom:
  ze_zero_rank_free(zr);
  return zck__fail(ZCK_ERR_NO_MEMORY, "rank %d: out of %smemory for the ZeRO state", comm->rank, dev ? "device " : "");
fail:
  ze_zero_rank_free(zr);
  return zck__error_prepend(fs, "rank %d: setting up the ZeRO state on the device", comm->rank);
}

// ---- parameters for compute

zck_status ze_zero_gather(ze_zero_rank *zr) {
  const ze_zero_plan *plan = zr->plan;
  if (plan->o.stage == 3 || plan->o.world == 1) return ZCK_OK;
  const zck_layout *l = plan->train;
  zck_dtype lp = plan->o.lp_dtype;
  size_t es = zck_dtype_size(lp);
  uint32_t W = plan->o.world, r = zr->rank;
  uint64_t chunk = ze_zero_allgather_bucket(plan) / W;
  if (chunk < 1) chunk = 1;
  uint8_t *bucket = NULL;
  size_t bucket_bytes = 0;
  zck_status s = ZCK_OK;
  for (size_t g = 0; g < zr->n_groups && s == ZCK_OK; g++) {
    uint64_t part = l->groups[g].partition;
    uint8_t *flat = zr->lp[g];
    if (chunk >= part) { /* the whole partition at once, in place */
      s = ze__coll(zr, ZE_COLL_ALL_GATHER, flat + r * part * es, flat, part, lp);
      continue;
    }
    if (!bucket) {
      bucket_bytes = W * chunk * es;
      if (!(bucket = ze_zero_alloc(zr, ZE_MEM_BUCKETS, bucket_bytes)))
        return zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory for the all-gather bucket", r);
    }
    for (uint64_t c0 = 0; c0 < part && s == ZCK_OK; c0 += chunk) {
      uint64_t cnt = part - c0 < chunk ? part - c0 : chunk;
      s = ze__coll(zr, ZE_COLL_ALL_GATHER, flat + (r * part + c0) * es, bucket, cnt, lp);
      for (uint32_t k = 0; k < W && s == ZCK_OK; k++)
        if (k != r) s = ze__wcopy(zr, flat + (k * part + c0) * es, bucket + k * cnt * es, cnt * es);
    }
  }
  ze_zero_free(zr, ZE_MEM_BUCKETS, bucket, bucket_bytes);
  return s;
}

// ---- gradients

/* Stage 2 (zero12 layout): buckets of the params' pieces, all-reduced; each rank keeps the
 * elements of its partition. (lib/comm has no reduce-to-one; DeepSpeed's default
 * use_multi_rank_bucket_allreduce all-reduces the combined buckets the same way.) */
typedef struct rd_item {
  const float *src;            /* gradient elements */
  float *acc;                  /* where they add up on this rank (NULL: another rank's) */
  uint64_t pos, count;         /* in the bucket: stage 2 at pos; stage 3 per block at pos */
  uint64_t part, j0, numel;    /* stage 3: p-slot size, offset in it, param numel */
} rd_item;

typedef struct rd_bucket {
  rd_item *items;
  size_t n, cap;
  uint64_t used;               /* stage 2: elements; stage 3: elements per rank block */
  float *host;                 /* device state with host gradient partitions (offload):
                                  the reduced bucket comes here before it is added */
} rd_bucket;

static bool rd_push(rd_bucket *b, rd_item it) {
  if (b->n == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 64;
    rd_item *v = zck__realloc(b->items, cap * sizeof *v);
    if (!v) return false;
    b->items = v;
    b->cap = cap;
  }
  b->items[b->n++] = it;
  return true;
}

/* The reduced elements res[0..n) where the gradient partitions are: buf itself, or its
 * copy in b->host. */
static zck_status rd_result(ze_zero_rank *zr, const rd_bucket *b, const float *buf, uint64_t n, const float **res) {
  *res = buf;
  if (!b->host) return ZCK_OK;
  ZCK_TRY(ze_dzero_copy(zr->dev, b->host, buf, n * sizeof *buf));
  ZCK_TRY(ze_dzero_sync(zr->dev));
  *res = b->host;
  return ZCK_OK;
}

static zck_status rd_flush(ze_zero_rank *zr, rd_bucket *b, float *buf) {
  if (!b->n) return ZCK_OK;
  const ze_zero_plan *plan = zr->plan;
  uint32_t W = plan->o.world;
  float Wf = (float)W;
  zck_status s = ZCK_OK;
  const float *res = NULL;
  if (plan->o.stage == 2) {
    for (size_t i = 0; i < b->n && s == ZCK_OK; i++) {
      const rd_item *it = &b->items[i];
      float *d = buf + it->pos;
      /* DeepSpeed divides by the world size before the sum (average_tensor) */
      if (W == 1)
        s = ze__wcopy(zr, d, it->src, it->count * sizeof *d);
      else
        s = wdiv(zr, d, it->src, it->count, Wf);
    }
    if (s == ZCK_OK) s = ze__coll(zr, ZE_COLL_ALL_REDUCE, buf, buf, b->used, ZCK_F32);
    if (s == ZCK_OK) s = rd_result(zr, b, buf, b->used, &res);
    for (size_t i = 0; i < b->n && s == ZCK_OK; i++) {
      const rd_item *it = &b->items[i];
      if (!it->acc) continue;
      s = grad_add(zr, it->acc, res + it->pos, it->count);
    }
  } else {
    /* stage 3: block k of the bucket holds every item's rank-k slot range, padding zero */
    uint64_t S = b->used;
    s = wzero(zr, buf, W * S * sizeof *buf);
    for (size_t i = 0; i < b->n && s == ZCK_OK; i++) {
      const rd_item *it = &b->items[i];
      for (uint32_t k = 0; k < W && s == ZCK_OK; k++) {
        uint64_t e0 = k * it->part + it->j0; /* first param element of this block range */
        if (e0 >= it->numel) break;
        uint64_t cnt = it->numel - e0 < it->count ? it->numel - e0 : it->count;
        float *d = buf + k * S + it->pos;
        if (W == 1)
          s = ze__wcopy(zr, d, it->src + e0, cnt * sizeof *d);
        else
          s = wdiv(zr, d, it->src + e0, cnt, Wf);
      }
    }
    float *mine = buf + zr->rank * S;
    if (s == ZCK_OK) s = ze__coll(zr, ZE_COLL_REDUCE_SCATTER, buf, mine, S, ZCK_F32);
    if (s == ZCK_OK) s = rd_result(zr, b, mine, S, &res);
    for (size_t i = 0; i < b->n && s == ZCK_OK; i++) {
      const rd_item *it = &b->items[i];
      s = grad_add(zr, it->acc, res + it->pos, it->count);
    }
  }
  b->n = 0;
  b->used = 0;
  return s;
}

zck_status ze_zero_reduce_params(ze_zero_rank *zr, const uint32_t *params, size_t n, const float *const *grads) {
  const ze_zero_plan *plan = zr->plan;
  const zck_layout *l = plan->train;
  uint32_t W = plan->o.world;
  ZCK_ASSERT(plan->o.stage >= 2);
  bool z3 = plan->o.stage == 3;
  uint64_t cap = ze_zero_reduce_bucket(plan); /* elements of full-size gradient per collective */
  uint64_t per = z3 ? (cap / W ? cap / W : 1) : cap; /* stage 3: elements per rank block */
  /* the bucket never exceeds what the params need */
  uint64_t need = 0;
  for (size_t i = 0; i < n; i++)
    if (plan->home[params[i]].where == 1)
      need += z3 ? zck_zero3_partition(plan->numel[params[i]], W) : plan->numel[params[i]];
  if (!need) return ZCK_OK;
  if (per > need) per = need;
  size_t buf_bytes = (z3 ? W * per : per) * sizeof(float), host_bytes = per * sizeof(float);
  float *buf = ze_zero_alloc(zr, ZE_MEM_BUCKETS, buf_bytes);
  rd_bucket b = {0};
  if (!buf) return zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory for the reduce bucket", zr->rank);
  if (zr->dev && ze__on_host(zr, ZE_MEM_GRAD)) {
    b.host = ze_dzero_host_alloc(zr->dev, host_bytes, zr->dev->o.pin_optimizer);
    if (!b.host) {
      ze_zero_free(zr, ZE_MEM_BUCKETS, buf, buf_bytes);
      return zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of host memory for the reduce bucket", zr->rank);
    }
    ze_mem_add(&zr->dev->host, ZE_MEM_BUCKETS, host_bytes);
  }
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < n && s == ZCK_OK; i++) {
    uint32_t p = params[i];
    const ze_param_home *h = &plan->home[p];
    if (h->where != 1) continue;
    if (z3) {
      uint64_t part = zck_zero3_partition(plan->numel[p], W);
      for (uint64_t j0 = 0; j0 < part && s == ZCK_OK;) {
        if (b.used == per) s = rd_flush(zr, &b, buf);
        uint64_t c = part - j0 < per - b.used ? part - j0 : per - b.used;
        rd_item it = {grads[i], zr->grad[h->group] + h->off + j0, b.used, c, part, j0, plan->numel[p]};
        if (s == ZCK_OK && !rd_push(&b, it)) s = ZCK_ERR_NO_MEMORY;
        b.used += c;
        j0 += c;
      }
    } else {
      for (size_t j = l->param_first[p]; j < l->param_first[p + 1] && s == ZCK_OK; j++) {
        const zck_piece *pc = &l->pieces[j];
        uint32_t g = pc->store / W, k = pc->store % W;
        for (uint64_t t0 = 0; t0 < pc->count && s == ZCK_OK;) {
          if (b.used == per) s = rd_flush(zr, &b, buf);
          uint64_t c = pc->count - t0 < per - b.used ? pc->count - t0 : per - b.used;
          float *acc = k == zr->rank ? zr->grad[g] + pc->store_off + t0 : NULL;
          rd_item it = {grads[i] + pc->param_off + t0, acc, b.used, c, 0, 0, 0};
          if (s == ZCK_OK && !rd_push(&b, it)) s = ZCK_ERR_NO_MEMORY;
          b.used += c;
          t0 += c;
        }
      }
    }
  }
  if (s == ZCK_OK) s = rd_flush(zr, &b, buf);
  if (s == ZCK_ERR_NO_MEMORY) s = zck__fail(s, "rank %u: out of memory reducing gradients", zr->rank);
  free(b.items);
  if (b.host) {
    ze_mem_sub(&zr->dev->host, ZE_MEM_BUCKETS, host_bytes);
    ze_dzero_host_free(zr->dev, b.host, zr->dev->o.pin_optimizer);
  }
  ze_zero_free(zr, ZE_MEM_BUCKETS, buf, buf_bytes);
  return s;
}

/* dst[0..cnt) = model grads of flat range [c0, c0+cnt) of store (g, k) / scale, padding 0. */
static zck_status pack_range(ze_zero_rank *zr, size_t g, uint32_t k, uint64_t c0, uint64_t cnt, const float *model,
                             float scale, float *dst) {
  const ze_zero_plan *plan = zr->plan;
  const zck_layout *l = plan->train;
  ZCK_TRY(wzero(zr, dst, cnt * sizeof *dst));
  uint32_t st = zck_layout_store_id(l, (uint32_t)g, k);
  for (size_t i = l->store_first[st]; i < l->store_first[st + 1]; i++) {
    const zck_piece *pc = &l->pieces[l->by_store[i]];
    uint64_t lo = pc->store_off > c0 ? pc->store_off : c0;
    uint64_t hi = pc->store_off + pc->count < c0 + cnt ? pc->store_off + pc->count : c0 + cnt;
    if (lo >= hi) continue;
    const float *src = model + plan->model_off[pc->param] + pc->param_off + (lo - pc->store_off);
    float *d = dst + (lo - c0);
    if (scale == 1.0f)
      ZCK_TRY(ze__wcopy(zr, d, src, (hi - lo) * sizeof *d));
    else
      ZCK_TRY(wdiv(zr, d, src, hi - lo, scale));
  }
  return ZCK_OK;
}

zck_status ze_zero_reduce_full(ze_zero_rank *zr) {
  const ze_zero_plan *plan = zr->plan;
  const zck_layout *l = plan->train;
  uint32_t W = plan->o.world;
  ZCK_ASSERT(plan->o.stage == 1 && zr->gfull);
  uint64_t chunk = ze_zero_reduce_bucket(plan) / W, maxp = 0;
  if (chunk < 1) chunk = 1;
  for (size_t g = 0; g < zr->n_groups; g++)
    if (l->groups[g].partition > maxp) maxp = l->groups[g].partition;
  if (chunk > maxp) chunk = maxp ? maxp : 1;
  size_t buf_bytes = W * chunk * sizeof(float);
  float *buf = ze_zero_alloc(zr, ZE_MEM_BUCKETS, buf_bytes);
  if (!buf) return zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory for the reduce bucket", zr->rank);
  zck_status s = ZCK_OK;
  for (size_t g = 0; g < zr->n_groups && s == ZCK_OK; g++) {
    uint64_t part = l->groups[g].partition;
    for (uint64_t c0 = 0; c0 < part && s == ZCK_OK; c0 += chunk) {
      uint64_t cnt = part - c0 < chunk ? part - c0 : chunk;
      /* DeepSpeed divides by the world size before the sum (average_tensor) */
      for (uint32_t k = 0; k < W && s == ZCK_OK; k++) s = pack_range(zr, g, k, c0, cnt, zr->gfull, (float)W, buf + k * cnt);
      float *mine = buf + zr->rank * cnt;
      if (s == ZCK_OK) s = ze__coll(zr, ZE_COLL_REDUCE_SCATTER, buf, mine, cnt, ZCK_F32);
      /* (offload_optimizer: the copy of the reduced gradients to the host) */
      if (s == ZCK_OK) s = ze__wcopy(zr, zr->grad[g] + c0, mine, cnt * sizeof *mine);
    }
  }
  ze_zero_free(zr, ZE_MEM_BUCKETS, buf, buf_bytes);
  zck_status z = wzero(zr, zr->gfull, plan->model_numel * sizeof *zr->gfull);
  if (s == ZCK_OK) s = z;
  if (s == ZCK_OK && zr->dev) s = ze_dzero_sync(zr->dev);
  return s;
}

zck_status ze_zero_grad_norm(ze_zero_rank *zr, double *norm) {
  double ss = 0.0;
  if (!ze__on_host(zr, ZE_MEM_GRAD)) {
    for (size_t g = 0; g < zr->n_groups; g++)
      ZCK_TRY(zr->dev->o.ops->sumsq(zr->dev->o.ctx, zr->grad[g], ze_zero_part(zr->plan, g), &ss));
  } else {
    ZCK_TRY(ze_zero_sync(zr)); /* offload: the last copies of reduced gradients */
  }
  for (size_t g = 0; ze__on_host(zr, ZE_MEM_GRAD) && g < zr->n_groups; g++) {
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
  zr->step++;
  zr->lp_version++;
  /* where AdamW runs: with the masters (host: no device, or offload_optimizer) */
  bool host_opt = ze__on_host(zr, ZE_MEM_MASTER), host_lp = ze__on_host(zr, ZE_MEM_LP);
  if (zr->dev && host_opt) ZCK_TRY(ze_dzero_sync(zr->dev));
  for (size_t g = 0; g < zr->n_groups; g++) {
    uint64_t part = ze_zero_part(plan, g);
    void *dst = plan->o.stage == 3 ? zr->lp[g] : (uint8_t *)zr->lp[g] + zr->rank * part * es;
    /* clip, AdamW, gradients cleared, lp = RNE(master) where it lives with the master */
    zck_cuda_adamw_args a = {hp->lr, hp->beta1,  hp->beta2, hp->eps, ze_zero_group_weight_decay(plan, g),
                             zr->step, clip,     1,         host_opt == host_lp ? dst : NULL, lp};
    if (host_opt)
      ze_dzero_adamw_host(zr->fp32[g], zr->grad[g], zr->exp_avg[g], zr->exp_avg_sq[g], part, &a);
    else
      ZCK_TRY(zr->dev->o.ops->adamw(zr->dev->o.ctx, zr->fp32[g], zr->grad[g], zr->exp_avg[g], zr->exp_avg_sq[g], part,
                                    &a));
    if (!a.d_lp_out) ZCK_TRY(lp_from_master(zr, dst, zr->fp32[g], part));
  }
  return ze_zero_gather(zr);
}

zck_status ze_zero_refresh_lp(ze_zero_rank *zr) {
  zr->lp_version++;
  const ze_zero_plan *plan = zr->plan;
  size_t es = zck_dtype_size(plan->o.lp_dtype);
  for (size_t g = 0; g < zr->n_groups; g++) {
    uint64_t part = ze_zero_part(plan, g);
    void *dst = plan->o.stage == 3 ? zr->lp[g] : (uint8_t *)zr->lp[g] + zr->rank * part * es;
    ZCK_TRY(lp_from_master(zr, dst, zr->fp32[g], part));
  }
  return ze_zero_gather(zr);
}
