/* transfer.c: the part-to-part rules of every job (transfer.h), once. */
#include "transfer.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "util.h"

typedef struct zck__xfer {
  zck_exec_job *jobs;
  zck_plan **plans;
  size_t n, cap;
  const char *const *names;  /* param names, when they index the source's layouts */
} zck__xfer;

/* contiguous: the target's ready hook reads the extents, and takes them one run each */
static zck_status zck__xfer_add(zck__xfer *x, const zck_state_part *src, const zck_state_part *dst, bool allow_missing,
                                bool by_dst, bool named, bool contiguous) {
  if (x->n == x->cap) {
    size_t nc = x->cap ? 2 * x->cap : 16;
    zck_exec_job *nj = zck__realloc(x->jobs, nc * sizeof *nj);
    if (!nj) return ZCK_ERR_NO_MEMORY;
    x->jobs = nj;
    zck_plan **np = zck__realloc(x->plans, nc * sizeof *np);
    if (!np) return ZCK_ERR_NO_MEMORY;
    x->plans = np;
    x->cap = nc;
  }
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.allow_missing = allow_missing;
  po.param_names = named ? x->names : NULL;
  if (by_dst) {
    po.order = ZCK_PLAN_BY_DST;
    po.max_chunk = (uint64_t)1 << 20; /* smaller pieces: less held ahead of a hash cursor */
  }
  zck_plan *p = NULL;
  ZCK_TRY(zck_plan_build(src->layout, dst->layout, &po, &p));
  zck_plan *runs = NULL;
  zck_status s = contiguous ? zck_plan_unstride(p, true, &runs) : ZCK_OK;
  if (runs || s != ZCK_OK) zck_plan_free(p);
  if (s != ZCK_OK) return s;
  if (runs) {
    p = runs;
    zck_plan_normalize(p, po.order, po.merge);
  }
  x->plans[x->n] = p;
  x->jobs[x->n] = (zck_exec_job){p, src->stores, dst->stores, dst->crc};
  x->n++;
  return ZCK_OK;
}

static const char *zck__xfer_what(int kind) {
  switch (kind) {
  case ZCK_STATE_FP32: return "fp32 weights";
  case ZCK_STATE_EXP_AVG:
  case ZCK_STATE_EXP_AVG_SQ: return "optimizer state (exp_avg / exp_avg_sq)";
  default: return "frozen-parameter data";
  }
}

/* The plans filling one target view, appended to x in the fixed order of transfer.h. */
static zck_status zck__xfer_target(zck__xfer *x, const zck_state_view *src, const zck_state_view *dst, bool partial) {
  const zck_state_part *sp = src->part, *dp = dst->part;
  bool by_dst = dst->write_in_order;
  /* a writer's ready hook (a DeepSpeed target: what each file receives, its hash order)
   * reads every extent as one run of its target */
  bool contig = dst->ready != NULL;
  const char *who = src->name ? src->name : "the source";
  for (int k = ZCK_STATE_FP32; k <= ZCK_STATE_EXP_AVG_SQ; k++) {
    if (!dp[k].layout) continue;
    if (!sp[k].layout) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no %s to copy", who, zck__xfer_what(k));
    ZCK_TRY(zck__xfer_add(x, &sp[k], &dp[k], partial, by_dst, true, contig));
  }
  if (dp[ZCK_STATE_LP].layout) {
    /* each of the two plans covers its own params: the other's are missing on purpose */
    const zck_state_part *lp = sp[ZCK_STATE_LP].layout ? &sp[ZCK_STATE_LP] : &sp[ZCK_STATE_FP32];
    if (lp->layout) ZCK_TRY(zck__xfer_add(x, lp, &dp[ZCK_STATE_LP], true, by_dst, true, contig));
    if (sp[ZCK_STATE_FROZEN].layout)
      ZCK_TRY(zck__xfer_add(x, &sp[ZCK_STATE_FROZEN], &dp[ZCK_STATE_LP], true, by_dst, true, contig));
  }
  if (dp[ZCK_STATE_FROZEN].layout) {
    if (!sp[ZCK_STATE_FROZEN].layout) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no frozen-parameter data", who);
    ZCK_TRY(zck__xfer_add(x, &sp[ZCK_STATE_FROZEN], &dp[ZCK_STATE_FROZEN], partial, by_dst, true, contig));
  }
  /* every file holding buffers gets the one copy (same geometry, one plan each) */
  const zck_layout *bl = dst->buffers.layout;
  for (size_t i = 0; src->buffers.layout && bl && i < dst->n_buffer_copies; i++) {
    zck_state_part copy = {bl, dst->buffers.stores + i * bl->n_stores, dst->buffers.crc ? dst->buffers.crc + i * bl->n_stores : NULL};
    ZCK_TRY(zck__xfer_add(x, &src->buffers, &copy, partial, by_dst, false, contig));
  }
  return ZCK_OK;
}

zck_status zck_transfer(const zck_state_view *src, const zck_state_view *dst, size_t n_dst,
                        const zck_transfer_opts *opts) {
  zck_transfer_opts o = ZCK_TRANSFER_OPTS_INIT;
  if (opts) o = *opts;
  zck__xfer x;
  memset(&x, 0, sizeof x);
  const zck_model *m = src->model;
  const char **names = NULL;
  if (m && m->n_params) {
    /* names index every param layout of a view over this manifest */
    names = zck__calloc(m->n_params + 1, sizeof *names);
    if (!names) return ZCK_ERR_NO_MEMORY;
    for (size_t p = 0; p < m->n_params; p++) names[p] = m->params[p].name;
    x.names = names;
    for (int k = 0; k < ZCK_STATE_KINDS; k++)
      if (src->part[k].layout && src->part[k].layout->n_params != m->n_params) x.names = NULL;
  }
  zck_status s = ZCK_OK;
  size_t first = 0;
  for (size_t t = 0; s == ZCK_OK && t < n_dst; t++) {
    s = zck__xfer_target(&x, src, &dst[t], o.partial);
    if (s == ZCK_OK && dst[t].ready) s = dst[t].ready(dst[t].ready_ctx, x.plans + first, x.jobs + first, x.n - first);
    first = x.n;
  }
  if (s == ZCK_OK) s = zck_exec_run(x.jobs, x.n, &o.exec);
  for (size_t i = 0; i < x.n; i++) zck_plan_free(x.plans[i]);
  free(x.plans);
  free(x.jobs);
  free(names);
  return s;
}
