/* dckpt.c: the saver's gather16 hook (saver.h): the stage-3 16-bit model.safetensors of a
 * run whose ZeRO state is on devices (--device cuda, ranks that are threads).
 *
 * The saver gives each tensor's place in the file's data section; here the extents from
 * the ZeRO layouts to those places, with every rank's fp32 master partitions (and frozen
 * 16-bit partitions) as their sources, make one gather plan (zck_cuda.h) cut into buckets. On the
 * device the buckets are converted to 16 bits there and double-buffered through
 * page-locked memory into the saver's writes (2 x bucket bytes on each side, whatever the
 * model size); sources in host memory (offload_optimizer and offload_param together) take
 * the planner's host path. The bucket is the config's allgather_bucket_size when it sets
 * one, else 64 MiB. Host ranks, sources on several devices (NCCL, a rank per GPU) or split
 * between host and device are declined (ZCK_ERR_UNSUPPORTED): the saver's transfer reads
 * every rank's memory in bounded chunks (callback stores). Same bytes every way: RNE of
 * the masters, the bits of the live 16-bit params. */
#include "ckpt_internal.h"

#include "dzero.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define ZE_G16_DEFAULT_BUCKET ((size_t)64 << 20)

/* Sources: train group g of rank r at g*W + r, frozen group f of rank r after them at
 * G*W + f*W + r (the layouts' store ids, the frozen ones shifted, as the saver numbers
 * them). */
static zck_status g16_sources(const ze_zero_plan *plan, ze_zero_rank *const *ranks, zck_gather_src **out,
                              size_t *n_out) {
  uint32_t W = plan->o.world;
  size_t G = plan->train->n_groups, F = plan->frozen ? plan->frozen->n_groups : 0;
  zck_gather_src *src = zck__calloc((G + F) * W + 1, sizeof *src);
  if (!src) return ZCK_ERR_NO_MEMORY;
  for (uint32_t r = 0; r < W; r++) {
    const ze_zero_rank *zr = ranks[r];
    for (size_t g = 0; g < G; g++)
      src[g * W + r] = (zck_gather_src){zr->fp32[g], ZCK_F32, plan->train->groups[g].partition};
    for (size_t f = 0; f < F; f++)
      src[G * W + f * W + r] = (zck_gather_src){zr->frozen_lp[f], plan->o.lp_dtype, plan->frozen->groups[f].partition};
  }
  *out = src;
  *n_out = (G + F) * W;
  return ZCK_OK;
}

/* The extents of both layouts into the data section (elements), the frozen ones' sources
 * after the train ones'. */
static zck_status g16_extents(const ze_zero_plan *plan, const uint64_t *dst_off, zck_gather_extent **out,
                              size_t *n_out) {
  zck_gather_extent *tr = NULL, *fr = NULL, *all = NULL;
  size_t n_tr = 0, n_fr = 0;
  zck_status s = zck_gather_extents_from_layout(plan->train, dst_off, &tr, &n_tr);
  if (s == ZCK_OK && plan->frozen) s = zck_gather_extents_from_layout(plan->frozen, dst_off, &fr, &n_fr);
  if (s == ZCK_OK && !(all = zck__calloc(n_tr + n_fr + 1, sizeof *all))) s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) {
    uint32_t shift = (uint32_t)(plan->train->n_groups * plan->o.world);
    memcpy(all, tr, n_tr * sizeof *all);
    for (size_t i = 0; i < n_fr; i++) {
      all[n_tr + i] = fr[i];
      all[n_tr + i].src += shift;
    }
    *out = all;
    *n_out = n_tr + n_fr;
  }
  free(tr);
  free(fr);
  return s;
}

zck_status ze__g16_gather(void *ctx, void *const *ranks_, const uint64_t *param_dst_off, zck_saver_write_fn write,
                          void *wctx) {
  const ze_ckpt_tracker *t = ctx;
  ze_zero_rank *const *ranks = (ze_zero_rank *const *)ranks_;
  const ze_zero_plan *plan = t->plan;
  uint32_t W = plan->o.world;
  const ze_dzero *d0 = ranks[0]->dev;
  if (!d0) return ZCK_ERR_UNSUPPORTED; /* host memory */
  bool one_device = true;
  for (uint32_t r = 1; r < W; r++) one_device = one_device && ranks[r]->dev->o.device == d0->o.device;
  bool frozen = plan->frozen && plan->frozen->n_pieces;
  if (!one_device || (frozen && d0->opt_host != d0->lp_host)) return ZCK_ERR_UNSUPPORTED;
  zck_gather_src *src = NULL;
  zck_gather_extent *ext = NULL;
  zck_gather_plan *gp = NULL;
  size_t n_src = 0, n_ext = 0;
  size_t bucket = d0->o.gather_bucket_bytes ? d0->o.gather_bucket_bytes : ZE_G16_DEFAULT_BUCKET;
  zck_status s = g16_sources(plan, ranks, &src, &n_src);
  if (s == ZCK_OK) s = g16_extents(plan, param_dst_off, &ext, &n_ext);
  if (s == ZCK_OK) s = zck_gather_plan_build(src, n_src, ext, n_ext, plan->o.lp_dtype, bucket, &gp);
  if (s == ZCK_OK)
    s = d0->opt_host ? zck_gather_run_host(gp, src, write, wctx) : d0->o.ops->gather16(d0->o.ctx, gp, src, write, wctx);
  zck_gather_plan_free(gp);
  free(src);
  free(ext);
  return s;
}
