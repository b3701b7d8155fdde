/* cuda_engine.c: forward/backward of zckpt-train's rank threads on a GPU (see cuda_engine.h). */
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
  zck_cuda_gpt2_free(cr->model);
  zck_cuda_free(cr->d_params);
  zck_cuda_free(cr->d_grads);
  zck_cuda_host_free(cr->h_grads);
  zck_cuda_ctx_free(cr->ctx);
  memset(cr, 0, sizeof *cr);
}

zck_status ze_cuda_rank_init(ze_cuda_rank *cr, const ze_gpt2_config *cfg, int rank, int B, int T) {
  memset(cr, 0, sizeof *cr);
  ZCK_TRY(ze_cuda_check());
  int device = rank % zck_cuda_device_count();
  zck_cuda_gpt2_config c = {cfg->vocab_size, cfg->max_seq_len, cfg->n_layer, cfg->n_head, cfg->n_embd};
  cr->numel = zck_cuda_gpt2_numel(&c);
  size_t bytes = cr->numel * sizeof(float);
  zck_status s = zck_cuda_ctx_create(device, &cr->ctx);
  if (s == ZCK_OK) s = zck_cuda_gpt2_create(cr->ctx, &c, B, T, &cr->model);
  if (s == ZCK_OK) s = zck_cuda_malloc((void **)&cr->d_params, bytes);
  if (s == ZCK_OK) s = zck_cuda_malloc((void **)&cr->d_grads, bytes);
  if (s == ZCK_OK) s = zck_cuda_host_alloc((void **)&cr->h_grads, bytes);
  if (s != ZCK_OK) {
    ze_cuda_rank_free(cr);
    return zck__error_prepend(s, "rank %d on CUDA device %d", rank, device);
  }
  return ZCK_OK;
}

zck_status ze_cuda_micro_step(ze_cuda_rank *cr, const float *work, float *gwork, const int *inputs, const int *targets,
                              int B, int T, float scale, bool params_changed, float *loss) {
  void *st = zck_cuda_ctx_stream(cr->ctx);
  size_t bytes = cr->numel * sizeof(float);
  if (params_changed) ZCK_TRY(zck_cuda_memcpy_async(cr->d_params, work, bytes, st));
  ZCK_TRY(zck_cuda_memset_async(cr->d_grads, 0, bytes, st));
  ZCK_TRY(zck_cuda_gpt2_forward(cr->model, cr->d_params, inputs, targets, B, T, loss));
  ZCK_TRY(zck_cuda_gpt2_backward(cr->model, cr->d_params, cr->d_grads, scale));
  ZCK_TRY(zck_cuda_memcpy_async(cr->h_grads, cr->d_grads, bytes, st));
  ZCK_TRY(zck_cuda_stream_sync(st));
  /* this micro-batch's gradients join what gwork holds (stage 1 accumulates there) */
  for (size_t i = 0; i < cr->numel; i++) gwork[i] += cr->h_grads[i];
  return ZCK_OK;
}
