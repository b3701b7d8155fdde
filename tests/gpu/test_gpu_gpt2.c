/* test_gpu_gpt2.c: the device GPT-2 (cuda/gpt2.cu) against the CPU engine's
 * ze_gpt2_forward / ze_gpt2_backward on the same flat parameters: loss within 1e-4
 * relative, logits within relative L2 1e-4, every parameter gradient tensor within
 * relative L2 1e-3 (cuBLAS products and tree reductions in another order than the CPU's,
 * compounded over the layers). Also: a smaller batch in the same workspace, bit-identical
 * reruns (no atomics), refusals of bad token ids and of a backward without targets. */
#include "gpu_util.h"

#include "gpt2.h"

static void run_case(zck_cuda_ctx *ctx, ze_gpt2_config ec, int Bmax, int Tmax, int B, int T, uint64_t seed) {
  zck_cuda_gpt2_config cc = {ec.vocab_size, ec.max_seq_len, ec.n_layer, ec.n_head, ec.n_embd};
  size_t n = ze_gpt2_numel(&ec);
  float *params = malloc(n * 4), *grads = calloc(n, 4), *ggrads = malloc(n * 4);
  ze_gpt2_init(&ec, params, seed);
  /* non-trivial LayerNorm parameters and biases, so their gradients are exercised */
  uint64_t s = seed;
  size_t nt = ze_gpt2_n_tensors(&ec);
  ze_param_spec *specs = calloc(nt, sizeof *specs);
  ze_gpt2_param_specs(&ec, specs);
  for (size_t i = 0; i < nt; i++)
    if (specs[i].ndim == 1)
      for (size_t j = 0; j < specs[i].numel; j++) params[specs[i].offset + j] += 0.1f * (float)((double)(gpu_rand(&s) >> 11) * 0x1p-53 - 0.5);
  int *inp = malloc((size_t)B * T * sizeof(int)), *tg = malloc((size_t)B * T * sizeof(int));
  for (int i = 0; i < B * T; i++) {
    inp[i] = (int)(gpu_rand(&s) % (uint64_t)ec.vocab_size);
    tg[i] = (int)(gpu_rand(&s) % (uint64_t)ec.vocab_size);
  }
  /* CPU */
  ze_gpt2_params w, g;
  ze_gpt2_carve(&ec, params, &w);
  ze_gpt2_carve(&ec, grads, &g);
  ze_gpt2_ws *ws = ze_gpt2_ws_new(&ec, Bmax, Tmax);
  float loss = ze_gpt2_forward(&ec, &w, ws, inp, tg, B, T);
  ze_gpt2_backward(&ec, &w, &g, ws, inp, tg, B, T, 0.5f);
  /* device */
  zck_cuda_gpt2 *m;
  ZT_OK(zck_cuda_gpt2_create(ctx, &cc, Bmax, Tmax, &m));
  float *d_params = gpu_dup(params, n * 4), *d_grads = gpu_alloc(n * 4);
  float gloss = 0;
  ZT_ERR(zck_cuda_gpt2_backward(m, d_params, d_grads, 1.0f), ZCK_ERR_INVALID_ARG, "needs a forward with targets");
  ZT_OK(zck_cuda_gpt2_forward(m, d_params, inp, tg, B, T, &gloss));
  ZT_OK(zck_cuda_gpt2_backward(m, d_params, d_grads, 0.5f));
  printf(" B %d T %d (workspace %d x %d), L %d H %d C %d V %d: loss cpu %.7f gpu %.7f\n", B, T, Bmax, Tmax, ec.n_layer,
         ec.n_head, ec.n_embd, ec.vocab_size, (double)loss, (double)gloss);
  ZT_ASSERT(fabs((double)gloss - loss) <= 1e-4 * fabs((double)loss));
  size_t nl = (size_t)B * T * ec.vocab_size;
  float *glog = malloc(nl * 4);
  gpu_get(glog, zck_cuda_gpt2_logits(m), nl * 4);
  gpu_close_l2("logits", glog, ze_gpt2_logits(ws), nl, 1e-4, 1e-6);
  float *glosses = malloc((size_t)B * T * 4);
  gpu_get(glosses, zck_cuda_gpt2_losses(m), (size_t)B * T * 4);
  gpu_close("per-position losses", glosses, ze_gpt2_losses(ws), (size_t)B * T, 1e-4, 1e-5);
  gpu_get(ggrads, d_grads, n * 4);
  for (size_t i = 0; i < nt; i++)
    gpu_close_l2(specs[i].name, ggrads + specs[i].offset, grads + specs[i].offset, specs[i].numel, 1e-3, 1e-7);
  /* a rerun gives the same bits (gradients are added: run into a zeroed buffer twice) */
  float *again = malloc(n * 4), *first = malloc(n * 4);
  for (int rep = 0; rep < 2; rep++) {
    ZT_OK(zck_cuda_memset_async(d_grads, 0, n * 4, NULL));
    float l2;
    ZT_OK(zck_cuda_gpt2_forward(m, d_params, inp, tg, B, T, &l2));
    ZT_ASSERT(l2 == gloss);
    ZT_OK(zck_cuda_gpt2_backward(m, d_params, d_grads, 0.5f));
    gpu_get(rep ? again : first, d_grads, n * 4);
  }
  gpu_same("rerun gradients", again, first, n * 4);
  /* refusals */
  int bad = inp[0];
  inp[0] = ec.vocab_size;
  ZT_ERR(zck_cuda_gpt2_forward(m, d_params, inp, tg, B, T, NULL), ZCK_ERR_INVALID_ARG, "inputs[0]");
  inp[0] = bad;
  tg[B * T - 1] = -1;
  ZT_ERR(zck_cuda_gpt2_forward(m, d_params, inp, tg, B, T, NULL), ZCK_ERR_INVALID_ARG, "is not a token id");
  ZT_ERR(zck_cuda_gpt2_forward(m, d_params, inp, NULL, Bmax + 1, T, NULL), ZCK_ERR_INVALID_ARG, "exceeds the workspace");
  /* logits only */
  ZT_OK(zck_cuda_gpt2_forward(m, d_params, inp, NULL, B, T, &gloss));
  ZT_ASSERT(gloss == 0.0f);
  ZT_ERR(zck_cuda_gpt2_backward(m, d_params, d_grads, 1.0f), ZCK_ERR_INVALID_ARG, "needs a forward with targets");
  zck_cuda_gpt2_free(m);
  ze_gpt2_ws_free(ws);
  zck_cuda_free(d_params);
  zck_cuda_free(d_grads);
  free(params), free(grads), free(ggrads), free(specs), free(inp), free(tg), free(glog), free(glosses), free(again);
  free(first);
}

int main(void) {
  if (zck_cuda_device_count() == 0) zt_skip("no CUDA device");
  zck_cuda_ctx *ctx;
  ZT_OK(zck_cuda_ctx_create(0, &ctx));
  ze_gpt2_config a = {256, 32, 2, 4, 64};
  run_case(ctx, a, 3, 32, 3, 32, 1);
  run_case(ctx, a, 3, 32, 2, 9, 2); /* a smaller batch in a larger workspace */
  ze_gpt2_config b = {300, 24, 3, 3, 48}; /* odd sizes */
  run_case(ctx, b, 2, 24, 2, 24, 3);
  zck_cuda_ctx_free(ctx);
  return 0;
}
