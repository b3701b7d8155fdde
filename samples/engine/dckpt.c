/* dckpt.c: the stage-3 16-bit model.safetensors of a run whose ZeRO state is on devices
 * (--device cuda, ranks that are threads; ckpt.c calls it in place of ze__g16_fill).
 *
 * Every rank's fp32 master partitions (and frozen 16-bit partitions) become the sources of
 * one gather plan (zck_cuda.h): extents from the ZeRO layouts to each tensor's place in the
 * file's data section, cut into buckets. On the device the buckets are converted to 16 bits
 * there and double-buffered through page-locked memory into pwrite (2 x bucket bytes on
 * each side, whatever the model size); sources in host memory (offload_optimizer and
 * offload_param together) take the planner's host path. The bucket is the config's
 * allgather_bucket_size when it sets one, else 64 MiB. Sources on several devices (NCCL,
 * a rank per GPU) or split between host and device go through ze__g16_fill, whose copy
 * plan reads every rank's memory in bounded chunks (callback stores). Same bytes every way:
 * RNE of the masters, the bits of the live 16-bit params. */
#include "ckpt_internal.h"

#include "dzero.h"
#include "safetensors/safetensors.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define ZE_G16_DEFAULT_BUCKET ((size_t)64 << 20)

typedef struct g16_out {
  int fd;
  uint64_t data_start;         /* absolute offset of the data section */
  const char *path;
} g16_out;

static zck_status g16_write(void *ctx, uint64_t byte_off, const void *bytes, size_t n) {
  const g16_out *o = ctx;
  return zck__pwrite_all(o->fd, bytes, n, o->data_start + byte_off, o->path);
}

/* Sources: train group g of rank r at g*W + r, frozen group f of rank r after them at
 * G*W + f*W + r (the layouts' store ids, the frozen ones shifted). */
static zck_status g16_sources(const ze_ckpt_tracker *t, zck_gather_src **out, size_t *n_out) {
  const ze_zero_plan *plan = t->plan;
  uint32_t W = plan->o.world;
  size_t G = plan->train->n_groups, F = plan->frozen ? plan->frozen->n_groups : 0;
  zck_gather_src *src = zck__calloc((G + F) * W + 1, sizeof *src);
  if (!src) return ZCK_ERR_NO_MEMORY;
  for (uint32_t r = 0; r < W; r++) {
    const ze_zero_rank *zr = t->ranks[r];
    for (size_t g = 0; g < G; g++)
      src[g * W + r] = (zck_gather_src){zr->fp32[g], ZCK_F32, plan->train->groups[g].partition};
    for (size_t f = 0; f < F; f++)
      src[G * W + f * W + r] = (zck_gather_src){zr->frozen_lp[f], plan->o.lp_dtype, plan->frozen->groups[f].partition};
  }
  *out = src;
  *n_out = (G + F) * W;
  return ZCK_OK;
}

/* The extents of both layouts into the data section (elements), and its start. */
static zck_status g16_extents(const ze_ckpt_tracker *t, const ze__g16 *g, zck_gather_extent **out, size_t *n_out,
                              uint64_t *data_start) {
  const ze_zero_plan *plan = t->plan;
  size_t es = zck_dtype_size(plan->o.lp_dtype), n_params = t->model->n_params;
  uint64_t *dst_off = zck__malloc((n_params + 1) * sizeof *dst_off);
  zck_gather_extent *tr = NULL, *fr = NULL, *all = NULL;
  size_t n_tr = 0, n_fr = 0;
  if (!dst_off) return ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; p < n_params; p++) dst_off[p] = UINT64_MAX; /* tied copies are not in the file */
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < g->n && s == ZCK_OK; i++) {
    const zck_st_tensor *ti = zck_st_writer_tensor(g->w, g->slot[i]);
    if (ti->begin % es) s = zck__fail(ZCK_ERR_INTERNAL, "model.safetensors: tensor %zu is not element aligned", i);
    dst_off[g->owners[i]] = ti->begin / es;
    *data_start = ti->offset - ti->begin;
  }
  if (s == ZCK_OK) s = zck_gather_extents_from_layout(plan->train, dst_off, &tr, &n_tr);
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
  free(dst_off);
  free(tr);
  free(fr);
  return s;
}

zck_status ze__g16_gather(const ze_ckpt_tracker *t, const ze__g16 *g, int fd, const char *path) {
  const ze_zero_plan *plan = t->plan;
  uint32_t W = plan->o.world;
  const ze_dzero *d0 = t->ranks[0]->dev;
  bool one_device = true;
  for (uint32_t r = 1; r < W; r++) one_device = one_device && t->ranks[r]->dev->o.device == d0->o.device;
  bool frozen = plan->frozen && plan->frozen->n_pieces;
  if (!one_device || (frozen && d0->opt_host != d0->lp_host)) return ze__g16_fill(t, g, fd, path, NULL);
  zck_gather_src *src = NULL;
  zck_gather_extent *ext = NULL;
  zck_gather_plan *gp = NULL;
  size_t n_src = 0, n_ext = 0;
  g16_out o = {fd, 0, path};
  size_t bucket = d0->o.gather_bucket_bytes ? d0->o.gather_bucket_bytes : ZE_G16_DEFAULT_BUCKET;
  zck_status s = g16_sources(t, &src, &n_src);
  if (s == ZCK_OK) s = g16_extents(t, g, &ext, &n_ext, &o.data_start);
  if (s == ZCK_OK) s = zck_gather_plan_build(src, n_src, ext, n_ext, plan->o.lp_dtype, bucket, &gp);
  if (s == ZCK_OK)
    s = d0->opt_host ? zck_gather_run_host(gp, src, g16_write, &o) : d0->o.ops->gather16(d0->o.ctx, gp, src, g16_write, &o);
  if (s == ZCK_ERR_NO_MEMORY) s = zck__fail(s, "%s: out of memory gathering the 16-bit weights", path);
  zck_gather_plan_free(gp);
  free(src);
  free(ext);
  return s;
}
