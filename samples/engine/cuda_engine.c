/* cuda_engine.c: the device side of zckpt-train's ranks (see cuda_engine.h). */
#include "cuda_engine.h"

#include "error.h"

#include <string.h>

zck_status ze_cuda_check(void) {
  ZCK_FAIL_IF(!zck_cuda_built(), ZCK_ERR_NO_DEVICE, "--device cuda: built without CUDA (use --device cpu)");
  ZCK_FAIL_IF(zck_cuda_device_count() == 0, ZCK_ERR_NO_DEVICE, "--device cuda: no CUDA device found (use --device cpu)");
  return ZCK_OK;
}

void ze_cuda_rank_free(ze_cuda_rank *cr) {
  if (!cr) return;
  if (cr->ctx) zck_cuda_stream_sync(zck_cuda_ctx_stream(cr->ctx)); /* queued frees of the ZeRO state */
  zck_cuda_gpt2_free(cr->model);
  if (cr->own_dcomm) zck_comm_nccl_destroy(cr->dcomm);
  zck_cuda_ctx_free(cr->ctx);
  memset(cr, 0, sizeof *cr);
}

zck_status ze_cuda_rank_init(ze_cuda_rank *cr, const ze_gpt2_config *cfg, zck_comm *dcomm, zck_comm *bootstrap,
                             int local_rank, int B, int T) {
  memset(cr, 0, sizeof *cr);
  cr->cfg = cfg;
  int rank = dcomm ? dcomm->rank : bootstrap->rank;
  zck_status s = ze_cuda_check();
  if (s == ZCK_OK && dcomm) {
    cr->dcomm = dcomm;
    cr->device = zck_comm_cuda_device(dcomm);
    if (cr->device < 0) s = zck__fail(ZCK_ERR_INVALID_ARG, "rank %d: %s is not a device communicator", rank, dcomm->backend);
  } else if (s == ZCK_OK) {
    /* one process per GPU: NCCL over the launcher's host group (collective) */
    cr->device = local_rank % zck_cuda_device_count();
    s = zck_comm_nccl_init_from(bootstrap, cr->device, &cr->dcomm);
    cr->own_dcomm = s == ZCK_OK;
  }
  zck_cuda_gpt2_config c = {cfg->vocab_size, cfg->max_seq_len, cfg->n_layer, cfg->n_head, cfg->n_embd};
  if (s == ZCK_OK) s = zck_cuda_ctx_create(cr->device, &cr->ctx);
  if (s == ZCK_OK) s = zck_cuda_gpt2_create(cr->ctx, &c, B, T, &cr->model);
  /* the collectives wait for the work queued on the rank's stream, not the whole device */
  if (s == ZCK_OK) s = zck_comm_cuda_set_stream(cr->dcomm, zck_cuda_ctx_stream(cr->ctx));
  if (s != ZCK_OK) {
    int device = cr->device;
    ze_cuda_rank_free(cr);
    return zck__error_prepend(s, "rank %d on CUDA device %d", rank, device);
  }
  return ZCK_OK;
}

// ---- the executor's hooks as the device model's

typedef struct adapter {
  const ze_gpt2_config *cfg;
  const ze_gpt2_hooks *h;
} adapter;

/* t[i] = the pointer p holds for the module's i-th tensor */
static void module_pointers(const ze_gpt2_config *cfg, int module, ze_gpt2_params *p, float **t) {
  int idx[12];
  int k = ze_gpt2_module_tensors(cfg, module, idx);
  for (int i = 0; i < k; i++) t[i] = *ze_gpt2_param_slot(cfg, p, idx[i]);
}

/* A hook that fails keeps its reason in the executor (zexec.c); the status only stops
 * the device pass. */
static zck_status ad_fetch(void *ctx, int module, float **t) {
  adapter *a = ctx;
  ze_gpt2_params p;
  memset(&p, 0, sizeof p);
  if (!a->h->fetch(a->h->ctx, module, &p)) return ZCK_ERR_INTERNAL;
  module_pointers(a->cfg, module, &p, t);
  return ZCK_OK;
}

static void ad_release(void *ctx, int module) {
  adapter *a = ctx;
  if (a->h->release) a->h->release(a->h->ctx, module);
}

static zck_status ad_grads(void *ctx, int module, float **t) {
  adapter *a = ctx;
  ze_gpt2_params p;
  memset(&p, 0, sizeof p);
  if (!a->h->grads(a->h->ctx, module, &p)) return ZCK_ERR_INTERNAL;
  module_pointers(a->cfg, module, &p, t);
  return ZCK_OK;
}

static zck_status ad_grads_done(void *ctx, int module) {
  adapter *a = ctx;
  return !a->h->grads_done || a->h->grads_done(a->h->ctx, module) ? ZCK_OK : ZCK_ERR_INTERNAL;
}

static zck_status drv_forward(void *ctx, const ze_gpt2_hooks *h, const int *inputs, const int *targets, int B, int T,
                              float *loss) {
  ze_cuda_rank *cr = ctx;
  adapter a = {cr->cfg, h};
  zck_cuda_gpt2_hooks hk = {&a, ad_fetch, ad_release, ad_grads, ad_grads_done};
  return zck_cuda_gpt2_forward_hooked(cr->model, &hk, inputs, targets, B, T, loss);
}

static zck_status drv_backward(void *ctx, const ze_gpt2_hooks *h, float scale) {
  ze_cuda_rank *cr = ctx;
  adapter a = {cr->cfg, h};
  zck_cuda_gpt2_hooks hk = {&a, ad_fetch, ad_release, ad_grads, ad_grads_done};
  return zck_cuda_gpt2_backward_hooked(cr->model, &hk, scale);
}

const ze_exec_driver *ze_cuda_driver(ze_cuda_rank *cr) {
  cr->drv = (ze_exec_driver){cr, drv_forward, drv_backward};
  return &cr->drv;
}
