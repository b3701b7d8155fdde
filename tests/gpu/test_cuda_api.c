/* test_cuda_api.c: the device interface where there is no device (label unit).
 * - GPT-2's one layout (cuda/include/gpt2_layout.h), which the CPU engine and the device code both
 *   walk: Hugging Face's parameter count (124439808 for gpt2), tensors back to back in
 *   buffer order, pointers carved where the table says, every tensor in one module in
 *   buffer order (wte again in the last, for the tied lm_head).
 * - Without a device (or without CUDA), every device call returns ZCK_ERR_NO_DEVICE with a
 *   one-line reason and clears its outputs; frees accept NULL. The test names every
 *   function of zck_cuda.h, so a stub.c that falls behind the header fails to link. */
#include "test.h"

#include "zck_cuda.h"

static void check_table(int V, int T, int L, int H, int C) {
  zck_gpt2_config c = {V, T, L, H, C};
  size_t n = zck_gpt2_n_tensors(&c);
  ZT_EQ_U64(n, 2 + 12 * (size_t)L + 2);
  zck_gpt2_spec *specs = calloc(n, sizeof *specs);
  size_t total = zck_gpt2_params_walk(&c, specs, NULL, NULL), off = 0;
  for (size_t i = 0; i < n; i++) {
    if (specs[i].offset != off) ZT_FAIL("%s: offset %zu, expected %zu", specs[i].name, specs[i].offset, off);
    off += specs[i].numel;
  }
  ZT_EQ_U64(off, total);
  size_t v = (size_t)V, t = (size_t)T, l = (size_t)L, e = (size_t)C;
  ZT_EQ_U64(total, v * e + t * e + l * (12 * e * e + 13 * e) + 2 * e);
  ZT_EQ_STR(specs[0].name, "transformer.wte.weight");
  ZT_EQ_STR(specs[n - 1].name, "transformer.ln_f.bias");
  if (total < (1u << 20)) {
    float *flat = calloc(total, sizeof *flat);
    zck_gpt2_params p;
    zck_gpt2_params_walk(&c, NULL, flat, &p);
    for (size_t i = 0; i < n; i++)
      if (*zck_gpt2_param_slot(&c, &p, (int)i) != flat + specs[i].offset) ZT_FAIL("%s: carved elsewhere", specs[i].name);
    free(flat);
  }
  size_t seen = 0;
  for (int m = -1; m <= L; m++) {
    int idx[12];
    int k = zck_gpt2_module_tensors(&c, m, idx);
    for (int i = 0; i < k; i++) {
      if (m == L && i == 2) {
        ZT_EQ_INT(idx[i], 0); /* wte for lm_head */
        continue;
      }
      ZT_EQ_INT(idx[i], (int)seen++);
    }
  }
  ZT_EQ_U64(seen, n);
  free(specs);
}

static int built;

/* A device call that must fail for lack of a device. */
#define NODEV(expr) do { zck_clear_error(); ZT_ERR((expr), ZCK_ERR_NO_DEVICE, built ? "" : "built without CUDA"); \
    ZT_ASSERT(zck_last_error()[0] != 0); } while (0)

int main(void) {
  check_table(256, 64, 2, 4, 64);
  check_table(50257, 1024, 12, 12, 768);
  zck_gpt2_config gpt2 = {50257, 1024, 12, 12, 768};
  ZT_EQ_U64(zck_gpt2_params_walk(&gpt2, NULL, NULL, NULL), 124439808); /* GPT2LMHeadModel's parameter count */
  check_table(2, 1, 1, 1, 1);
  check_table(300, 7, 3, 3, 9);

  built = zck_cuda_built();
  if (!built) ZT_EQ_INT(zck_cuda_has_nccl(), 0);
  if (zck_cuda_device_count() > 0) {
    printf("a device is present: the no-device checks do not apply (the gpu tests cover it)\n");
    return 0;
  }
  char name[64] = "x";
  NODEV(zck_cuda_device_name(0, name, sizeof name));
  ZT_EQ_STR(name, "");
  NODEV(zck_cuda_set_device(0));
  void *p = (void *)1;
  NODEV(zck_cuda_malloc(&p, 64));
  ZT_ASSERT(p == NULL);
  p = (void *)1;
  NODEV(zck_cuda_malloc_async(&p, 64, NULL));
  ZT_ASSERT(p == NULL);
  zck_cuda_free_async(NULL, NULL);
  size_t fr = 1, tot = 1;
  NODEV(zck_cuda_mem_info(0, &fr, &tot));
  ZT_ASSERT(fr == 0 && tot == 0);
  p = (void *)1;
  NODEV(zck_cuda_host_alloc(&p, 64));
  ZT_ASSERT(p == NULL);
  zck_cuda_free(NULL);
  zck_cuda_host_free(NULL);
  float hbuf[4] = {0}, hbuf2[4] = {0};
  NODEV(zck_cuda_memcpy(hbuf2, hbuf, sizeof hbuf));
  NODEV(zck_cuda_memcpy_async(hbuf2, hbuf, sizeof hbuf, NULL));
  NODEV(zck_cuda_memset_async(hbuf, 0, sizeof hbuf, NULL));
  p = (void *)1;
  NODEV(zck_cuda_stream_create(&p));
  ZT_ASSERT(p == NULL);
  zck_cuda_stream_destroy(NULL);
  NODEV(zck_cuda_device_sync());
  p = (void *)1;
  NODEV(zck_cuda_event_create(&p));
  ZT_ASSERT(p == NULL);
  zck_cuda_event_destroy(NULL);
  zck_cuda_ctx *ctx = (zck_cuda_ctx *)1;
  NODEV(zck_cuda_ctx_create(0, &ctx));
  ZT_ASSERT(ctx == NULL);
  zck_cuda_ctx_free(NULL);
  zck_comm *comms[2] = {0};
  NODEV(zck_comm_nccl_create_local(2, comms));
  NODEV(zck_comm_cuda_local_create(2, 0, comms));
  zck_comm_nccl_destroy_local(NULL, 2);
  zck_comm_nccl_destroy(NULL);
  zck_cuda_pack_plan_free(NULL);
  zck_cuda_gpt2_free(NULL);
  /* the gather's GPU path refuses before touching the (here host) sources */
  zck_gather_src src = {hbuf, ZCK_F32, 4};
  zck_gather_extent e = {0, 0, 0, 4};
  zck_gather_plan *plan;
  ZT_OK(zck_gather_plan_build(&src, 1, &e, 1, ZCK_BF16, 64, &plan));
  NODEV(zck_cuda_gather16_to_host(plan, &src, NULL, NULL));
  zck_gather_plan_free(plan);
  if (!built) {
    /* calls that need a context or device pointers: only the stub can be called with none */
    NODEV(zck_cuda_stream_sync(NULL));
    zck_cuda_range range = {0, 0, 1};
    zck_cuda_pack_plan *pp = (zck_cuda_pack_plan *)1;
    NODEV(zck_cuda_pack_plan_create(&range, 1, &pp));
    ZT_ASSERT(pp == NULL);
    NODEV(zck_cuda_pack_run(NULL, 0, NULL, ZCK_F32, NULL, ZCK_F32, 1.0f, NULL));
    NODEV(zck_cuda_f32_to_bf16(NULL, NULL, 1, NULL));
    NODEV(zck_cuda_bf16_to_f32(NULL, NULL, 1, NULL));
    zck_cuda_adamw_args aa = {1e-3, 0.9, 0.999, 1e-8, 0.0, 1, 1.0, 0, NULL, ZCK_BF16};
    NODEV(zck_cuda_adamw(NULL, NULL, NULL, NULL, 1, &aa, NULL));
    NODEV(zck_cuda_encoder_forward(NULL, NULL, NULL, NULL, 1, 1, 1, NULL));
    NODEV(zck_cuda_encoder_backward(NULL, NULL, NULL, NULL, 1, 1, 1, NULL));
    NODEV(zck_cuda_layernorm_forward(NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, NULL));
    NODEV(zck_cuda_layernorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, NULL));
    NODEV(zck_cuda_gelu_forward(NULL, NULL, 1, NULL));
    NODEV(zck_cuda_gelu_backward(NULL, NULL, NULL, 1, NULL));
    NODEV(zck_cuda_residual_forward(NULL, NULL, NULL, 1, NULL));
    NODEV(zck_cuda_residual_backward(NULL, NULL, NULL, 1, NULL));
    NODEV(zck_cuda_attention_forward(NULL, NULL, NULL, 1, 1, 1, 1, NULL));
    NODEV(zck_cuda_attention_backward(NULL, NULL, NULL, NULL, NULL, 1, 1, 1, 1, NULL));
    NODEV(zck_cuda_softmax_xent_forward(NULL, NULL, NULL, NULL, 1, 2, NULL));
    NODEV(zck_cuda_softmax_xent_backward(NULL, NULL, NULL, 1, 2, 1.0f, NULL));
    NODEV(zck_cuda_gemm(NULL, 0, 0, 1, 1, 1, 1.0f, NULL, 1, NULL, 1, ZCK_F32, 0.0f, NULL, 1));
    NODEV(zck_cuda_conv1d_forward(NULL, NULL, NULL, NULL, NULL, 1, 1, 1));
    NODEV(zck_cuda_conv1d_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1));
    NODEV(zck_cuda_lm_head_forward(NULL, NULL, NULL, NULL, 1, 1, 1));
    NODEV(zck_cuda_lm_head_backward(NULL, NULL, NULL, NULL, NULL, NULL, 1, 1, 1));
    zck_cuda_gpt2_config cc = {256, 8, 1, 1, 8};
    zck_cuda_gpt2 *m = (zck_cuda_gpt2 *)1;
    NODEV(zck_cuda_gpt2_create(NULL, &cc, 1, 8, &m));
    ZT_ASSERT(m == NULL);
    ZT_EQ_U64(zck_cuda_gpt2_ws_bytes(NULL), 0);
    NODEV(zck_cuda_gpt2_forward(NULL, NULL, NULL, NULL, 1, 1, NULL));
    NODEV(zck_cuda_gpt2_backward(NULL, NULL, NULL, 1.0f));
    zck_cuda_gpt2_hooks hk = {NULL, NULL, NULL, NULL, NULL};
    NODEV(zck_cuda_gpt2_forward_hooked(NULL, &hk, NULL, NULL, 1, 1, NULL));
    NODEV(zck_cuda_gpt2_backward_hooked(NULL, &hk, 1.0f));
    NODEV(zck_cuda_div_f32(NULL, NULL, 1, 2.0f, NULL));
    NODEV(zck_cuda_add_f32(NULL, NULL, 1, NULL));
    double sq = 1.0;
    NODEV(zck_cuda_sumsq_f64(NULL, 1, &sq, NULL));
    ZT_ASSERT(sq == 0.0);
    ZT_ASSERT(zck_cuda_gpt2_logits(NULL) == NULL && zck_cuda_gpt2_losses(NULL) == NULL);
    ZT_ASSERT(zck_cuda_ctx_stream(NULL) == NULL && zck_cuda_ctx_device(NULL) == -1);
    uint8_t id[ZCK_NCCL_ID_BYTES];
    NODEV(zck_comm_nccl_get_unique_id(id));
    zck_comm *one = (zck_comm *)1;
    NODEV(zck_comm_nccl_init_rank(1, 0, id, &one));
    ZT_ASSERT(one == NULL);
    NODEV(zck_comm_cuda_set_stream(NULL, NULL));
    NODEV(zck_comm_cuda_set_async(NULL, 1));
    NODEV(zck_comm_cuda_wait(NULL, NULL));
    ZT_EQ_INT(zck_comm_cuda_device(NULL), -1);
    one = (zck_comm *)1;
    NODEV(zck_comm_nccl_init_from(NULL, 0, &one));
    ZT_ASSERT(one == NULL);
    NODEV(zck_cuda_event_record(NULL, NULL));
    NODEV(zck_cuda_stream_wait_event(NULL, NULL));
    ZT_EQ_INT(zck_cuda_event_query(NULL), -1);
  }
  if (built) ZT_OK(zck_comm_cuda_wait(NULL, NULL)); /* nothing queued without waiting */
  printf("cuda api without a device (%s): ok\n", built ? "CUDA build" : "built without CUDA");
  return 0;
}
