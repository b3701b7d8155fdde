/* zexec.c: module-at-a-time GPT-2 on a ZeRO rank: gathers, prefetch, gradient buffers
 * (see zexec.h). */
#include "zexec.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

#define ZX_MODS (ZE_MAX_LAYERS + 2)       /* module m at index m + 1 */
#define ZX_SEQ (3 * ZX_MODS)

struct ze_exec {
  const ze_gpt2_config *c;
  ze_zero_rank *zr;
  ze_exec_opts o;
  int L, n_mod;
  uint32_t idx[ZX_MODS][12];   /* a module's tensors (spec = manifest index) */
  int n_idx[ZX_MODS];
  uint64_t numel[ZX_MODS];     /* elements of a module's tensors */
  float *buf[ZX_MODS];         /* fp32 params of the live modules */
  uint64_t live;               /* elements in buf */
  int seq[ZX_SEQ];             /* module uses of the running pass, in order */
  int n_seq, pos;
  size_t n_specs;
  uint64_t *spec_numel;        /* [n_specs] */
  uint64_t *spec_off;          /* [n_specs] offset in the model order */
  int *last_user;              /* [n_specs] module whose backward finishes the tensor's gradient */
  float **gbuf;                /* [n_specs] stage 2/3: gradient buffer of a tensor in backward */
  const ze_exec_driver *drv;   /* NULL: the CPU forward/backward */
  zck_status status;
};

void ze_exec_free(ze_exec *x) {
  if (!x) return;
  for (int i = 0; i < ZX_MODS; i++) ze_zero_free(x->zr, ZE_MEM_PARAMS, x->buf[i], x->numel[i] * sizeof(float));
  for (size_t t = 0; x->gbuf && t < x->n_specs; t++)
    ze_zero_free(x->zr, ZE_MEM_GRADS, x->gbuf[t], x->spec_numel[t] * sizeof(float));
  free(x->gbuf);
  free(x->spec_numel);
  free(x->spec_off);
  free(x->last_user);
  free(x);
}

zck_status ze_exec_new(const ze_gpt2_config *cfg, ze_zero_rank *zr, const ze_exec_opts *o, ze_exec **out) {
  *out = NULL;
  ze_exec *x = zck__calloc(1, sizeof *x);
  if (!x) return ZCK_ERR_NO_MEMORY;
  x->c = cfg;
  x->zr = zr;
  x->o = *o;
  x->L = cfg->n_layer;
  x->n_mod = x->L + 2;
  x->n_specs = ze_gpt2_n_tensors(cfg);
  ze_param_spec *specs = zck__calloc(x->n_specs, sizeof *specs);
  x->spec_numel = zck__calloc(x->n_specs, sizeof *x->spec_numel);
  x->spec_off = zck__calloc(x->n_specs, sizeof *x->spec_off);
  x->last_user = zck__calloc(x->n_specs, sizeof *x->last_user);
  x->gbuf = zck__calloc(x->n_specs, sizeof *x->gbuf);
  if (!specs || !x->spec_numel || !x->spec_off || !x->last_user || !x->gbuf) {
    free(specs);
    ze_exec_free(x);
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory for the module plan");
  }
  ze_gpt2_param_specs(cfg, specs);
  for (size_t t = 0; t < x->n_specs; t++) {
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
  *out = x;
  return ZCK_OK;
}

// ---- parameters

static bool ensure(ze_exec *x, int m) {
  int i = m + 1;
  if (x->buf[i]) return true;
  size_t bytes = x->numel[i] * sizeof(float);
  x->buf[i] = ze_zero_alloc(x->zr, ZE_MEM_PARAMS, bytes);
  if (!x->buf[i]) {
    x->status = zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory for module %d's parameters", x->zr->rank, m);
    return false;
  }
  x->live += x->numel[i];
  x->status = ze_zero_fetch_work(x->zr, x->idx[i], (size_t)x->n_idx[i], x->buf[i]);
  return x->status == ZCK_OK;
}

static void drop(ze_exec *x, int m) {
  int i = m + 1;
  if (!x->buf[i]) return;
  ze_zero_free(x->zr, ZE_MEM_PARAMS, x->buf[i], x->numel[i] * sizeof(float));
  x->buf[i] = NULL;
  x->live -= x->numel[i];
}

/* Stage 3: gathers the modules after position pos while the elements ahead stay under the
 * prefetch bucket and the live ones under max_live (every rank takes the same decisions). */
static bool prefetch(ze_exec *x) {
  uint64_t ahead = 0;
  int cur = x->seq[x->pos];
  for (int j = x->pos + 1; j < x->n_seq && ahead < x->o.prefetch_bucket_size; j++) {
    int m = x->seq[j];
    if (m == cur) continue;
    if (!x->buf[m + 1]) {
      if (x->live + x->numel[m + 1] > x->o.max_live_parameters) break;
      if (!ensure(x, m)) return false;
    }
    ahead += x->numel[m + 1];
  }
  return true;
}

static bool hk_fetch(void *ctx, int module, ze_gpt2_params *w) {
  ze_exec *x = ctx;
  if (x->pos >= x->n_seq || x->seq[x->pos] != module) {
    x->status = zck__fail(ZCK_ERR_INTERNAL, "module %d used out of the planned order", module);
    return false;
  }
  if (!ensure(x, module)) return false;
  if (x->zr->plan->o.stage == 3 && x->o.prefetch_bucket_size && !prefetch(x)) return false;
  ze_gpt2_carve_module(x->c, module, x->buf[module + 1], w);
  return true;
}

static void hk_release(void *ctx, int module) {
  ze_exec *x = ctx;
  x->pos++;
  /* the final module runs again at once when backward starts */
  if (x->pos < x->n_seq && x->seq[x->pos] == module) return;
  drop(x, module);
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

static bool hk_grads_done(void *ctx, int module) {
  ze_exec *x = ctx;
  if (x->zr->gfull) return true;
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
  x->status = ze_zero_reduce_params(x->zr, done, n, src);
  for (size_t k = 0; k < n; k++) {
    ze_zero_free(x->zr, ZE_MEM_GRADS, x->gbuf[done[k]], x->spec_numel[done[k]] * sizeof(float));
    x->gbuf[done[k]] = NULL;
  }
  return x->status == ZCK_OK;
}

// ---- passes

static void plan_pass(ze_exec *x, bool backward) {
  int n = 0;
  for (int m = -1; m <= x->L; m++) x->seq[n++] = m;
  if (backward)
    for (int m = x->L; m >= 0; m--) x->seq[n++] = m;
  x->n_seq = n;
  x->pos = 0;
  x->status = ZCK_OK;
}

/* After a pass (also a failed one): nothing stays gathered. */
static zck_status end_pass(ze_exec *x, bool ok) {
  for (int m = -1; m <= x->L; m++) drop(x, m);
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
  plan_pass(x, false);
  ze_gpt2_hooks h = {x, hk_fetch, hk_release, NULL, NULL};
  bool ok = run_forward(x, &h, ws, inputs, targets, B, T, loss);
  return end_pass(x, ok);
}

zck_status ze_exec_train_micro(ze_exec *x, ze_gpt2_ws *ws, const int *inputs, const int *targets, int B, int T,
                               float scale, bool last, float *loss) {
  plan_pass(x, true);
  ze_gpt2_hooks h = {x, hk_fetch, hk_release, hk_grads, hk_grads_done};
  bool ok = run_forward(x, &h, ws, inputs, targets, B, T, loss) &&
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
