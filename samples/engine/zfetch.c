/* zfetch.c: the fp32 values of whole params for compute (zero.h: ze_zero_fetch*), split
 * out of zero.c: stage 1/2 convert them from the rank's whole lp flat; stage 3 all-gathers
 * the p-slots of every param asked for in one collective (on the device's selected stream
 * under overlap_comm: zexec.c issues its prefetches on the comm stream this way). */
#include "zero_internal.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

zck_status ze_zero_fetch(ze_zero_rank *zr, const uint32_t *params, size_t n, float *dst) {
  if (!zr->dev) return ze_zero_fetch_work(zr, params, n, dst);
  /* into device memory, then to the host */
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) total += zr->plan->numel[params[i]];
  size_t bytes = total * sizeof(float);
  float *w = ze_zero_alloc(zr, ZE_MEM_PARAMS, bytes);
  if (!w) return zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of device memory gathering parameters", zr->rank);
  zck_status s = ze_zero_fetch_work(zr, params, n, w);
  if (s == ZCK_OK) s = ze_dzero_copy(zr->dev, dst, w, bytes);
  if (s == ZCK_OK) s = ze_dzero_sync(zr->dev);
  ze_zero_free(zr, ZE_MEM_PARAMS, w, bytes);
  return s;
}

zck_status ze_zero_fetch_work(ze_zero_rank *zr, const uint32_t *params, size_t n, float *dst) {
  float **dsts = zck__calloc(n ? n : 1, sizeof *dsts);
  if (!dsts) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory gathering parameters");
  float *d = dst;
  for (size_t i = 0; i < n; i++) {
    dsts[i] = d;
    d += zr->plan->numel[params[i]];
  }
  zck_status s = ze_zero_fetch_work_to(zr, params, n, dsts);
  free(dsts);
  return s;
}

zck_status ze_zero_fetch_work_to(ze_zero_rank *zr, const uint32_t *params, size_t n, float *const *dsts) {
  const ze_zero_plan *plan = zr->plan;
  const zck_layout *l = plan->train;
  zck_dtype lp = plan->o.lp_dtype;
  size_t es = zck_dtype_size(lp);
  uint32_t W = plan->o.world;
  if (plan->o.stage < 3) {
    for (size_t i = 0; i < n; i++) {
      uint32_t p = params[i];
      float *d = dsts[i];
      const ze_param_home *h = &plan->home[p];
      ZCK_ASSERT(h->where);
      if (h->where == 2) {
        ZCK_TRY(ze__wconvert(zr, ZCK_F32, d, lp, (const uint8_t *)zr->frozen_full + h->off * es, plan->numel[p]));
        continue;
      }
      for (size_t j = l->param_first[p]; j < l->param_first[p + 1]; j++) {
        const zck_piece *pc = &l->pieces[j];
        uint32_t g = pc->store / W, k = pc->store % W;
        const uint8_t *src = (const uint8_t *)zr->lp[g] + (k * l->groups[g].partition + pc->store_off) * es;
        ZCK_TRY(ze__wconvert(zr, ZCK_F32, d + pc->param_off, lp, src, pc->count));
      }
    }
    return ZCK_OK;
  }
  /* stage 3: one all-gather of this rank's p-slots of every param */
  uint64_t S = 0;
  for (size_t i = 0; i < n; i++) S += zck_zero3_partition(plan->numel[params[i]], W);
  size_t send_bytes = S * es, recv_bytes = W * S * es;
  uint8_t *send = ze_zero_alloc(zr, ZE_MEM_PARAMS, send_bytes);
  uint8_t *recv = send ? ze_zero_alloc(zr, ZE_MEM_PARAMS, recv_bytes) : NULL;
  if (!send || !recv) {
    ze_zero_free(zr, ZE_MEM_PARAMS, send, send_bytes);
    return zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory gathering parameters", zr->rank);
  }
  uint64_t pre = 0;
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < n && s == ZCK_OK; i++) {
    uint32_t p = params[i];
    const ze_param_home *h = &plan->home[p];
    ZCK_ASSERT(h->where);
    uint64_t part = zck_zero3_partition(plan->numel[p], W);
    const uint8_t *src = (const uint8_t *)(h->where == 1 ? zr->lp[h->group] : zr->frozen_lp[h->group]);
    /* offload_param: this is the copy of the partition from the host to the device */
    s = ze__wcopy(zr, send + pre * es, src + h->off * es, part * es);
    pre += part;
  }
  if (s == ZCK_OK) s = ze__coll(zr, ZE_COLL_ALL_GATHER, send, recv, S, lp);
  pre = 0;
  for (size_t i = 0; i < n && s == ZCK_OK; i++) {
    uint64_t numel = plan->numel[params[i]], part = zck_zero3_partition(numel, W);
    for (uint32_t k = 0; k < W && k * part < numel && s == ZCK_OK; k++) {
      uint64_t cnt = numel - k * part < part ? numel - k * part : part;
      s = ze__wconvert(zr, ZCK_F32, dsts[i] + k * part, lp, recv + (k * S + pre) * es, cnt);
    }
    pre += part;
  }
  ze_zero_free(zr, ZE_MEM_PARAMS, recv, recv_bytes);
  ze_zero_free(zr, ZE_MEM_PARAMS, send, send_bytes);
  return s;
}
