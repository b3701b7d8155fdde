/* zexec.c: module-at-a-time GPT-2 on a ZeRO rank: the passes, the hooks, the gradient
 * buffers and their reductions (see zexec.h; the gathered parameters are zexec_params.c). */
#include "zexec_internal.h"

#include "dzero.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

void ze_exec_free(ze_exec *x) {
  if (!x) return;
  if (x->ov) (void)ze_zero_sync(x->zr); /* nothing of ours in flight any more */
  zx_params_free(x);
  for (size_t t = 0; x->gbuf && t < x->n_specs; t++)
    ze_zero_free(x->zr, ZE_MEM_GRADS, x->gbuf[t], x->spec_numel[t] * sizeof(float));
  free(x->gbuf);
  free(x->pbuf);
  free(x->persist);
  free(x->pver);
  free(x->pgat);
  free(x->keep);
  free(x->spec_numel);
  free(x->spec_off);
  free(x->last_user);
  free(x);
}

const ze_exec_stats *ze_exec_get_stats(const ze_exec *x) { return &x->stats; }

zck_status ze_exec_new(const ze_gpt2_config *cfg, ze_zero_rank *zr, const ze_exec_opts *o, ze_exec **out) {
  *out = NULL;
  ze_exec *x = zck__calloc(1, sizeof *x);
  if (!x) return ZCK_ERR_NO_MEMORY;
  x->c = cfg;
  x->zr = zr;
  x->o = *o;
  x->ov = o->overlap_comm && ze_dzero_overlap(zr->dev);
  x->L = cfg->n_layer;
  x->n_mod = x->L + 2;
  x->n_specs = ze_gpt2_n_tensors(cfg);
  size_t n = x->n_specs;
  ze_param_spec *specs = zck__calloc(n, sizeof *specs);
  x->spec_numel = zck__calloc(n, sizeof *x->spec_numel);
  x->spec_off = zck__calloc(n, sizeof *x->spec_off);
  x->last_user = zck__calloc(n, sizeof *x->last_user);
  x->gbuf = zck__calloc(n, sizeof *x->gbuf);
  x->pbuf = zck__calloc(n, sizeof *x->pbuf);
  x->persist = zck__calloc(n, sizeof *x->persist);
  x->pver = zck__calloc(n, sizeof *x->pver);
  x->pgat = zck__calloc(n, sizeof *x->pgat);
  x->keep = zck__calloc(n, sizeof *x->keep);
  if (!specs || !x->spec_numel || !x->spec_off || !x->last_user || !x->gbuf || !x->pbuf || !x->persist || !x->pver ||
      !x->pgat || !x->keep) {
    free(specs);
    ze_exec_free(x);
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory for the module plan");
  }
  ze_gpt2_param_specs(cfg, specs);
  for (size_t t = 0; t < n; t++) {
    x->spec_numel[t] = specs[t].numel;
    x->spec_off[t] = specs[t].offset;
  }
  free(specs);
  /* backward finishes gradients in the order L, L-1, ..., 0, -1: a tensor's last user
   * there is the last module listing it (wte: -1 after L) */
  for (int m = x->L; m >= -1; m--) {
    int idx[12];
    int k = ze_gpt2_module_tensors(cfg, m, idx);
    x->n_idx[m + 1] = k;
    for (int i = 0; i < k; i++) {
      x->idx[m + 1][i] = (uint32_t)idx[i];
      x->numel[m + 1] += x->spec_numel[idx[i]];
      x->last_user[idx[i]] = m;
    }
  }
  zck_status s = zx_params_init(x);
  if (s != ZCK_OK) {
    ze_exec_free(x);
    return s;
  }
  *out = x;
  return ZCK_OK;
}

// ---- parameters

static bool hk_fetch(void *ctx, int module, ze_gpt2_params *w) {
  ze_exec *x = ctx;
  if (x->pos >= x->n_seq || x->seq[x->pos] != module) {
    x->status = zck__fail(ZCK_ERR_INTERNAL, "module %d used out of the planned order", module);
    return false;
  }
  /* this module's gather, then the next ones' (issued before this module computes), then
   * the wait for this module's just before it computes */
  if (!zx_gather(x, module, false)) return false;
  if (x->zr->plan->o.stage == 3 && x->o.prefetch_bucket_size && !zx_prefetch(x)) return false;
  if (!zx_ready(x, module)) return false;
  for (int k = 0; k < x->n_idx[module + 1]; k++) {
    uint32_t t = x->idx[module + 1][k];
    *ze_gpt2_param_slot(x->c, w, (int)t) = x->pbuf[t];
  }
  return true;
}

static void hk_release(void *ctx, int module) {
  ze_exec *x = ctx;
  x->pos++;
  zx_release(x, module);
}

// ---- gradients

static bool hk_grads(void *ctx, int module, ze_gpt2_params *g) {
  ze_exec *x = ctx;
  ze_zero_rank *zr = x->zr;
  if (zr->gfull) { /* stage 1: the step's full gradients */
    ze_gpt2_carve(x->c, zr->gfull, g);
    return true;
  }
  int i = module + 1;
  for (int k = 0; k < x->n_idx[i]; k++) {
    uint32_t t = x->idx[i][k];
    if (!x->gbuf[t]) {
      x->gbuf[t] = ze_zero_alloc(zr, ZE_MEM_GRADS, x->spec_numel[t] * sizeof(float));
      if (!x->gbuf[t]) {
        x->status = zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory for module %d's gradients", zr->rank, module);
        return false;
      }
    }
    *ze_gpt2_param_slot(x->c, g, (int)t) = x->gbuf[t];
  }
  return true;
}

/* Stage 2/3: the gradients module's backward finished, reduced into the owners' partitions
 * and freed; under overlap_comm on the comm stream, after the backward queued so far. */
static bool hk_grads_done(void *ctx, int module) {
  ze_exec *x = ctx;
  ze_zero_rank *zr = x->zr;
  if (zr->gfull) return true;
  int i = module + 1;
  uint32_t done[12] = {0};
  const float *src[12] = {0};
  size_t n = 0;
  for (int k = 0; k < x->n_idx[i]; k++) {
    uint32_t t = x->idx[i][k];
    if (x->last_user[t] != module) continue;
    done[n] = t;
    src[n++] = x->gbuf[t];
  }
  if (x->ov && !zx_fence(x)) return false;
  int prev = x->ov ? ze_dzero_select(zr->dev, ZE_STREAM_COMM) : ZE_STREAM_COMPUTE;
  x->status = ze_zero_reduce_params(zr, done, n, src);
  for (size_t k = 0; k < n; k++) { /* (on the comm stream: freed behind the reduction) */
    ze_zero_free(zr, ZE_MEM_GRADS, x->gbuf[done[k]], x->spec_numel[done[k]] * sizeof(float));
    x->gbuf[done[k]] = NULL;
  }
  if (x->ov) {
    zck_status s = ze_dzero_record(zr->dev, x->ev_reduce);
    if (x->status == ZCK_OK) x->status = s;
    x->reduce_pending = true;
    x->stats.async_reduces++;
    ze_dzero_select(zr->dev, prev);
  }
  return x->status == ZCK_OK;
}

// ---- passes

static bool plan_pass(ze_exec *x, bool backward) {
  int n = 0;
  for (int m = -1; m <= x->L; m++) x->seq[n++] = m;
  if (backward)
    for (int m = x->L; m >= 0; m--) x->seq[n++] = m;
  x->n_seq = n;
  x->pos = 0;
  x->status = ZCK_OK;
  /* the comm stream's gathers read the 16-bit params the last step wrote */
  return !x->ov || zx_fence(x);
}

/* After a pass (also a failed one): the comm stream drained (the gradient partitions are
 * read next), nothing but the persistent tensors stays gathered. */
static zck_status end_pass(ze_exec *x, bool ok) {
  if (x->ov) {
    zck_status s = ze_zero_sync(x->zr);
    if (x->status == ZCK_OK) x->status = s;
    x->reduce_pending = false;
  }
  for (size_t t = 0; t < x->n_specs; t++) {
    x->pgat[t] = -1;
    if (!x->persist[t]) zx_drop(x, (uint32_t)t);
  }
  if (!ok && x->status == ZCK_OK) x->status = zck__fail(ZCK_ERR_INTERNAL, "module pass stopped");
  return x->status;
}

void ze_exec_set_driver(ze_exec *x, const ze_exec_driver *d) { x->drv = d; }

/* A driver's failure: a hook's own (kept in status), else the driver's. */
static bool drv_ok(ze_exec *x, zck_status s) {
  if (s != ZCK_OK && x->status == ZCK_OK) x->status = s;
  return s == ZCK_OK;
}

static bool run_forward(ze_exec *x, const ze_gpt2_hooks *h, ze_gpt2_ws *ws, const int *inputs, const int *targets,
                        int B, int T, float *loss) {
  if (!x->drv) return ze_gpt2_forward_hooked(x->c, h, ws, inputs, targets, B, T, loss);
  return drv_ok(x, x->drv->forward(x->drv->ctx, h, inputs, targets, B, T, loss));
}

zck_status ze_exec_forward(ze_exec *x, ze_gpt2_ws *ws, const int *inputs, const int *targets, int B, int T,
                           float *loss) {
  ze_gpt2_hooks h = {x, hk_fetch, hk_release, NULL, NULL};
  bool ok = plan_pass(x, false) && run_forward(x, &h, ws, inputs, targets, B, T, loss);
  return end_pass(x, ok);
}

zck_status ze_exec_train_micro(ze_exec *x, ze_gpt2_ws *ws, const int *inputs, const int *targets, int B, int T,
                               float scale, bool last, float *loss) {
  ze_gpt2_hooks h = {x, hk_fetch, hk_release, hk_grads, hk_grads_done};
  bool ok = plan_pass(x, true) && run_forward(x, &h, ws, inputs, targets, B, T, loss) &&
            (x->drv ? drv_ok(x, x->drv->backward(x->drv->ctx, &h, scale))
                    : ze_gpt2_backward_hooked(x->c, &h, ws, inputs, targets, B, T, scale));
  ZCK_TRY(end_pass(x, ok));
  if (x->zr->gfull && last) ZCK_TRY(ze_zero_reduce_full(x->zr));
  return ZCK_OK;
}

zck_status ze_exec_full_params(ze_exec *x, float *dst) {
  uint32_t *all = zck__calloc(x->n_specs, sizeof *all);
  if (!all) return ZCK_ERR_NO_MEMORY;
  for (size_t t = 0; t < x->n_specs; t++) all[t] = (uint32_t)t;
  zck_status s = ze_zero_fetch(x->zr, all, x->n_specs, dst); /* spec order is model order */
  free(all);
  return s;
}
