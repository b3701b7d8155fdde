/* ckpt_snapshot.c: the host snapshot of an async save (saver.h: async_save): a copy of what
 * a save reads of a rank, taken by the rank's own thread at the save step so the rank can
 * go on training while the saver's writer thread writes the checkpoint from the copy.
 *
 * The snapshot is a ze_zero_rank of its own whose arrays are host memory (dev NULL), so the
 * describe hooks (ckpt_state.c) read it as they read a CPU rank: the same state view, other
 * stores. It holds the fp32 master, exp_avg and exp_avg_sq partitions; stage 3's frozen
 * partitions; and on rank 0 at stage 1/2 the whole 16-bit flat and the frozen copies (what
 * model.safetensors and the model states are written from). Allocated (and touched) when
 * the rank starts, and reused: the saver joins the writer that reads it before the next
 * snapshot overwrites it.
 *
 * With --device cuda, arrays in device memory come over through two page-locked staging
 * buffers of one bucket each (the on-save gather's bucket, 64 MiB by default): the copy of
 * chunk i+1 is queued on the rank's stream while the host copies chunk i out of the other
 * buffer. No device memory is allocated; offloaded (host) arrays are copied directly. The
 * staging buffers are made at the first save and kept (page-locking costs milliseconds a
 * call) until the rank lets its device go (ze__snapshot_release).
 *
 * Threads: a snapshot is written only by its rank's thread (while the saver holds no writer
 * on it) and read only by the writer thread.
 */
#include "ckpt_internal.h"

#include "dzero.h"
#include "error.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define ZE_SNAPSHOT_DEFAULT_BUCKET ((size_t)64 << 20)

struct ze__snapshot {
  ze_zero_rank zr;             /* host arrays only; plan, rank, n_groups, step of the rank */
  size_t bytes;                /* host bytes held */
  ze_dzero *dev;               /* the device the staging buffers belong to (NULL: none) */
  void *stage[2];              /* page-locked, `bucket` bytes each; the rank thread's alone */
  size_t bucket;
};

// ---- allocation (once, at the first save)

/* Touched here, so the first save does not pay for the page faults. */
static void *snap_alloc(ze__snapshot *sn, size_t bytes) {
  sn->bytes += bytes;
  void *p = zck__malloc(bytes ? bytes : 1);
  if (p) memset(p, 0, bytes);
  return p;
}

static bool alloc_arrays(ze__snapshot *sn, const ze_zero_rank *zr) {
  const ze_zero_plan *plan = zr->plan;
  size_t G = zr->n_groups, lp = zck_dtype_size(plan->o.lp_dtype);
  ze_zero_rank *s = &sn->zr;
  s->plan = plan;
  s->comm = zr->comm;
  s->rank = zr->rank;
  s->n_groups = G;
  if (!(s->fp32 = zck__calloc(G + 1, sizeof *s->fp32)) || !(s->exp_avg = zck__calloc(G + 1, sizeof *s->exp_avg)) ||
      !(s->exp_avg_sq = zck__calloc(G + 1, sizeof *s->exp_avg_sq)))
    return false;
  for (size_t g = 0; g < G; g++) {
    size_t b = ze_zero_part(plan, g) * sizeof(float);
    if (!(s->fp32[g] = snap_alloc(sn, b)) || !(s->exp_avg[g] = snap_alloc(sn, b)) ||
        !(s->exp_avg_sq[g] = snap_alloc(sn, b)))
      return false;
  }
  if (plan->o.stage < 3 && zr->rank == 0) {
    if (!(s->lp = zck__calloc(G + 1, sizeof *s->lp))) return false;
    for (size_t g = 0; g < G; g++)
      if (!(s->lp[g] = snap_alloc(sn, (size_t)plan->o.world * ze_zero_part(plan, g) * lp))) return false;
    if (plan->n_frozen && !(s->frozen_full = snap_alloc(sn, plan->frozen_numel * lp))) return false;
  }
  if (plan->o.stage == 3 && plan->frozen) {
    size_t F = plan->frozen->n_groups;
    if (!(s->frozen_lp = zck__calloc(F + 1, sizeof *s->frozen_lp))) return false;
    for (size_t f = 0; f < F; f++)
      if (!(s->frozen_lp[f] = snap_alloc(sn, plan->frozen->groups[f].partition * lp))) return false;
  }
  return true;
}

void ze__snapshot_free(ze__snapshot *sn) {
  if (!sn) return;
  ze__snapshot_release(sn);
  ze_zero_rank *s = &sn->zr;
  for (size_t g = 0; g < s->n_groups; g++) {
    if (s->fp32) free(s->fp32[g]);
    if (s->exp_avg) free(s->exp_avg[g]);
    if (s->exp_avg_sq) free(s->exp_avg_sq[g]);
    if (s->lp) free(s->lp[g]);
  }
  for (size_t f = 0; s->frozen_lp && s->plan->frozen && f < s->plan->frozen->n_groups; f++) free(s->frozen_lp[f]);
  free(s->fp32);
  free(s->exp_avg);
  free(s->exp_avg_sq);
  free(s->lp);
  free(s->frozen_lp);
  free(s->frozen_full);
  free(sn);
}

// ---- the copy

/* Device -> host through the two staging buffers (see the top). */
static zck_status copy_from_device(ze_dzero *d, void *const stage[2], size_t bucket, void *dst, const void *src,
                                   size_t bytes) {
  size_t n = (bytes + bucket - 1) / bucket;
  for (size_t i = 0; i <= n; i++) {
    if (i < n) {
      size_t k = bytes - i * bucket < bucket ? bytes - i * bucket : bucket;
      ZCK_TRY(ze_dzero_copy(d, stage[i & 1], (const uint8_t *)src + i * bucket, k));
    }
    if (i > 0) { /* chunk i-1 landed at the previous sync; its buffer is not the one queued */
      size_t j = i - 1, k = bytes - j * bucket < bucket ? bytes - j * bucket : bucket;
      memcpy((uint8_t *)dst + j * bucket, stage[j & 1], k);
    }
    if (i < n) ZCK_TRY(ze_dzero_sync(d));
  }
  return ZCK_OK;
}

typedef struct copier {
  ze_zero_rank *zr;
  ze__snapshot *sn;
} copier;

static zck_status copy_array(copier *c, ze_mem_kind k, void *dst, const void *src, size_t bytes) {
  if (!bytes) return ZCK_OK;
  ze_dzero *d = c->zr->dev;
  if (!d || ze_dzero_host(d, k)) {
    memcpy(dst, src, bytes);
    return ZCK_OK;
  }
  ze__snapshot *sn = c->sn;
  if (!sn->dev) {
    sn->bucket = d->o.gather_bucket_bytes ? d->o.gather_bucket_bytes : ZE_SNAPSHOT_DEFAULT_BUCKET;
    sn->dev = d;
    ZCK_TRY(d->o.ops->host_alloc(d->o.ctx, &sn->stage[0], sn->bucket));
    ZCK_TRY(d->o.ops->host_alloc(d->o.ctx, &sn->stage[1], sn->bucket));
  }
  return copy_from_device(d, sn->stage, sn->bucket, dst, src, bytes);
}

void ze__snapshot_release(ze__snapshot *sn) {
  if (!sn || !sn->dev) return;
  for (int i = 0; i < 2; i++)
    if (sn->stage[i]) sn->dev->o.ops->host_free(sn->dev->o.ctx, sn->stage[i]);
  sn->stage[0] = sn->stage[1] = NULL;
  sn->dev = NULL;
}

static zck_status copy_state(copier *c, ze_zero_rank *s) {
  ze_zero_rank *zr = c->zr;
  const ze_zero_plan *plan = zr->plan;
  size_t lp = zck_dtype_size(plan->o.lp_dtype);
  for (size_t g = 0; g < zr->n_groups; g++) {
    size_t b = ze_zero_part(plan, g) * sizeof(float);
    ZCK_TRY(copy_array(c, ZE_MEM_MASTER, s->fp32[g], zr->fp32[g], b));
    ZCK_TRY(copy_array(c, ZE_MEM_EXP_AVG, s->exp_avg[g], zr->exp_avg[g], b));
    ZCK_TRY(copy_array(c, ZE_MEM_EXP_AVG_SQ, s->exp_avg_sq[g], zr->exp_avg_sq[g], b));
    if (s->lp) ZCK_TRY(copy_array(c, ZE_MEM_LP, s->lp[g], zr->lp[g], (size_t)plan->o.world * ze_zero_part(plan, g) * lp));
  }
  if (s->frozen_full) ZCK_TRY(copy_array(c, ZE_MEM_LP, s->frozen_full, zr->frozen_full, plan->frozen_numel * lp));
  for (size_t f = 0; s->frozen_lp && f < plan->frozen->n_groups; f++)
    ZCK_TRY(copy_array(c, ZE_MEM_LP, s->frozen_lp[f], zr->frozen_lp[f], plan->frozen->groups[f].partition * lp));
  s->step = zr->step;
  s->lp_version = zr->lp_version;
  return ZCK_OK;
}

zck_status ze__snapshot_prepare(ze__snapshot **slot, ze_zero_rank *zr) {
  if (*slot) return ZCK_OK;
  ze__snapshot *sn = zck__calloc(1, sizeof *sn);
  if (!sn || !alloc_arrays(sn, zr)) {
    size_t want = sn ? sn->bytes : 0;
    ze__snapshot_free(sn);
    return zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory for the async save's host snapshot (%.1f MiB)",
                     zr->rank, (double)want / 1048576.0);
  }
  *slot = sn;
  return ZCK_OK;
}

zck_status ze__snapshot_take(ze__snapshot **slot, ze_zero_rank *zr) {
  ZCK_TRY(ze__snapshot_prepare(slot, zr));
  ze__snapshot *sn = *slot;
  copier c = {zr, sn};
  ZCK_TRY(zr->dev ? ze_dzero_sync(zr->dev) : ZCK_OK);
  return copy_state(&c, &sn->zr);
}

size_t ze__snapshot_bytes(const ze__snapshot *sn) { return sn ? sn->bytes : 0; }

ze_zero_rank *ze__snapshot_rank(ze__snapshot *sn) { return &sn->zr; }
