/* stub.c: the device interface when zckpt is built without CUDA: every device call fails
 * with ZCK_ERR_NO_DEVICE "<the call>: zckpt was built without CUDA" (outputs cleared),
 * every free is a no-op.
 * The plain C parts of zck_cuda.h (gather planner and host path, GPT-2 table)
 * are compiled in both builds and are not here. Keep in step with zck_cuda.h: the unit
 * test tests/gpu/test_cuda_api.c calls every function, so a missing one fails to link. */
#include "zck_cuda.h"

#include "error.h"

/* the message names the call, so a report says which device call a CPU-only build met */
#define ZCK_NO_CUDA() zck__fail(ZCK_ERR_NO_DEVICE, "%s: zckpt was built without CUDA", __func__)

int zck_cuda_built(void) { return 0; }
int zck_cuda_has_nccl(void) { return 0; }
int zck_cuda_device_count(void) { return 0; }
zck_status zck_cuda_device_name(int device, char *buf, size_t n) {
  if (n) buf[0] = 0;
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_set_device(int device) { return ZCK_NO_CUDA(); }

// ---- memory and streams

zck_status zck_cuda_malloc(void **d_ptr, size_t bytes) {
  *d_ptr = NULL;
  return ZCK_NO_CUDA();
}
void zck_cuda_free(void *d_ptr) {}
zck_status zck_cuda_malloc_async(void **d_ptr, size_t bytes, void *stream) {
  *d_ptr = NULL;
  return ZCK_NO_CUDA();
}
void zck_cuda_free_async(void *d_ptr, void *stream) {}
zck_status zck_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes) {
  *free_bytes = *total_bytes = 0;
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_host_alloc(void **ptr, size_t bytes) {
  *ptr = NULL;
  return ZCK_NO_CUDA();
}
void zck_cuda_host_free(void *ptr) {}
zck_status zck_cuda_memcpy(void *dst, const void *src, size_t bytes) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_memset_async(void *d_ptr, int byte, size_t bytes, void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_stream_create(void **stream) {
  *stream = NULL;
  return ZCK_NO_CUDA();
}
void zck_cuda_stream_destroy(void *stream) {}
zck_status zck_cuda_stream_sync(void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_device_sync(void) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_event_create(void **ev) {
  *ev = NULL;
  return ZCK_NO_CUDA();
}
void zck_cuda_event_destroy(void *ev) {}
zck_status zck_cuda_event_record(void *ev, void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_stream_wait_event(void *stream, void *ev) { return ZCK_NO_CUDA(); }
int zck_cuda_event_query(void *ev) { return -1; }
zck_status zck_cuda_ctx_create(int device, zck_cuda_ctx **out) {
  *out = NULL;
  return ZCK_NO_CUDA();
}
void zck_cuda_ctx_free(zck_cuda_ctx *ctx) {}
void *zck_cuda_ctx_stream(const zck_cuda_ctx *ctx) { return NULL; }
int zck_cuda_ctx_device(const zck_cuda_ctx *ctx) { return -1; }

// ---- kernels

zck_status zck_cuda_f32_to_bf16(const float *d_src, uint16_t *d_dst, size_t n, void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_bf16_to_f32(const uint16_t *d_src, float *d_dst, size_t n, void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_adamw(float *d_param, float *d_grad, float *d_exp_avg, float *d_exp_avg_sq, size_t n,
                          const zck_cuda_adamw_args *a, void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_div_f32(float *d_dst, const float *d_src, size_t n, float divisor, void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_add_f32(float *d_acc, const float *d_src, size_t n, void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_sumsq_f64(const float *d_x, size_t n, double *sum, void *stream) {
  *sum = 0.0;
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int BT, int T, int C,
                                    void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int BT, int T, int C,
                                     void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                      const float *b, int BT, int C, void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                       const float *w, const float *mean, const float *rstd, int BT, int C,
                                       void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_gelu_forward(float *out, const float *inp, size_t n, void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_residual_forward(float *out, const float *a, const float *b, size_t n, void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_residual_backward(float *da, float *db, const float *dout, size_t n, void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H,
                                      void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                       float *scratch, int B, int T, int C, int H, void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_softmax_xent_forward(float *probs, float *losses, const float *logits, const int *targets,
                                         int BT, int V, void *stream) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_softmax_xent_backward(float *dlogits, const float *probs, const int *targets, int BT, int V,
                                          float dloss, void *stream) {
  return ZCK_NO_CUDA();
}

// ---- matrix products

zck_status zck_cuda_gemm(zck_cuda_ctx *ctx, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const void *A, int lda, const void *B, int ldb, zck_dtype ab_dtype, float beta, float *C,
                         int ldc) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_conv1d_forward(zck_cuda_ctx *ctx, float *out, const float *inp, const float *w, const float *b,
                                   int BT, int IC, int OC) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_conv1d_backward(zck_cuda_ctx *ctx, float *dinp, float *dw, float *db, const float *dout,
                                    const float *inp, const float *w, int BT, int IC, int OC) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_lm_head_forward(zck_cuda_ctx *ctx, float *logits, const float *inp, const float *wte, int BT,
                                    int C, int V) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_lm_head_backward(zck_cuda_ctx *ctx, float *dinp, float *dwte, const float *dlogits,
                                     const float *inp, const float *wte, int BT, int C, int V) {
  return ZCK_NO_CUDA();
}

// ---- pack / unpack

zck_status zck_cuda_pack_plan_create(const zck_cuda_range *ranges, size_t n, zck_cuda_pack_plan **out) {
  *out = NULL;
  return ZCK_NO_CUDA();
}
void zck_cuda_pack_plan_free(zck_cuda_pack_plan *p) {}
zck_status zck_cuda_pack_run(const zck_cuda_pack_plan *p, int reverse, void *d_dst, zck_dtype dst_dtype,
                             const void *d_src, zck_dtype src_dtype, float divisor, void *stream) {
  return ZCK_NO_CUDA();
}

// ---- GPT-2

zck_status zck_cuda_gpt2_create(zck_cuda_ctx *ctx, const zck_cuda_gpt2_config *c, int B, int T, zck_cuda_gpt2 **out) {
  *out = NULL;
  return ZCK_NO_CUDA();
}
void zck_cuda_gpt2_free(zck_cuda_gpt2 *m) {}
size_t zck_cuda_gpt2_ws_bytes(const zck_cuda_gpt2 *m) { return 0; }
zck_status zck_cuda_gpt2_forward(zck_cuda_gpt2 *m, const float *d_params, const int *inputs, const int *targets, int B,
                                 int T, float *loss) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_gpt2_backward(zck_cuda_gpt2 *m, const float *d_params, float *d_grads, float scale) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_gpt2_forward_hooked(zck_cuda_gpt2 *m, const zck_cuda_gpt2_hooks *h, const int *inputs,
                                        const int *targets, int B, int T, float *loss) {
  return ZCK_NO_CUDA();
}
zck_status zck_cuda_gpt2_backward_hooked(zck_cuda_gpt2 *m, const zck_cuda_gpt2_hooks *h, float scale) {
  return ZCK_NO_CUDA();
}
const float *zck_cuda_gpt2_logits(const zck_cuda_gpt2 *m) { return NULL; }
const float *zck_cuda_gpt2_losses(const zck_cuda_gpt2 *m) { return NULL; }

// ---- collectives

zck_status zck_comm_nccl_create_local(int nranks, zck_comm **comms) { return ZCK_NO_CUDA(); }
zck_status zck_comm_cuda_local_create(int nranks, int device, zck_comm **comms) { return ZCK_NO_CUDA(); }
void zck_comm_nccl_destroy_local(zck_comm **comms, int nranks) {}
zck_status zck_comm_nccl_get_unique_id(uint8_t id[ZCK_NCCL_ID_BYTES]) { return ZCK_NO_CUDA(); }
zck_status zck_comm_nccl_init_rank(int nranks, int rank, const uint8_t id[ZCK_NCCL_ID_BYTES], zck_comm **comm) {
  *comm = NULL;
  return ZCK_NO_CUDA();
}
void zck_comm_nccl_destroy(zck_comm *comm) {}
zck_status zck_comm_nccl_init_from(zck_comm *bootstrap, int device, zck_comm **out) {
  *out = NULL;
  return ZCK_NO_CUDA();
}
zck_status zck_comm_cuda_set_stream(zck_comm *comm, void *stream) { return ZCK_NO_CUDA(); }
zck_status zck_comm_cuda_set_async(zck_comm *comm, int async) { return ZCK_NO_CUDA(); }
zck_status zck_comm_cuda_wait(zck_comm *comm, void *stream) { return ZCK_NO_CUDA(); }
int zck_comm_cuda_device(const zck_comm *comm) { return -1; }

// ---- gather16

zck_status zck_cuda_gather16_to_host(const zck_gather_plan *p, const zck_gather_src *srcs, zck_gather_write_fn write,
                                     void *ctx) {
  return ZCK_NO_CUDA();
}
