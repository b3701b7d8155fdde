// gpt2.cu: GPT-2 forward and backward on the device, step for step the CPU engine's
// ze_gpt2_forward / ze_gpt2_backward (samples/engine/gpt2.c): the same flat parameter and
// activation buffers (one description for both, gpt2_layout.h), the same kernels in the
// same order, on the context's stream. Parameters and gradients come module by module
// through hooks (ZeRO-3 gathers them just before use); the whole-model entry points are
// hooks over one flat buffer.
#include "common.cuh"

#include <limits.h>
#include <string.h>

struct zck_cuda_gpt2 {
  zck_cuda_ctx *ctx;
  zck_cuda_gpt2_config c;
  int B, T;                  /* capacity */
  int last_B, last_T;        /* the last forward */
  bool last_targets;
  size_t n;                  /* floats per activation buffer */
  float *mem, *gmem;         /* device: activations, their gradients */
  int *d_tok;                /* device: inputs (B*T) then targets (B*T) */
  float *h_losses;           /* host, page-locked: B*T */
  int *h_tok;                /* host, page-locked: the upload's staging, like d_tok */
  cudaEvent_t tok_read;      /* the last upload out of h_tok is done */
};

static zck_status zg_fetch(const zck_cuda_gpt2 *m, const zck_cuda_gpt2_hooks *h, int module, zck_gpt2_params *p) {
  float *t[ZCK_GPT2_BLOCK_TENSORS] = {NULL};
  ZCK_TRY(h->fetch(h->ctx, module, t));
  zck_gpt2_point_module(&m->c, module, t, p);
  return ZCK_OK;
}

static zck_status zg_grads(const zck_cuda_gpt2 *m, const zck_cuda_gpt2_hooks *h, int module, zck_gpt2_params *p) {
  float *t[ZCK_GPT2_BLOCK_TENSORS] = {NULL};
  ZCK_TRY(h->grads(h->ctx, module, t));
  zck_gpt2_point_module(&m->c, module, t, p);
  return ZCK_OK;
}

// Whole-model hooks: every module's tensors are offset ranges of one flat buffer, carved
// once into params and grads.
struct zg_whole {
  const zck_cuda_gpt2 *m;
  zck_gpt2_params params, grads;
};

static zck_status zg_whole_point(const zg_whole *w, zck_gpt2_params *flat, int module, float **t) {
  int idx[ZCK_GPT2_BLOCK_TENSORS];
  int k = zck_gpt2_module_tensors(&w->m->c, module, idx);
  for (int i = 0; i < k; i++) t[i] = *zck_gpt2_param_slot(&w->m->c, flat, idx[i]);
  return ZCK_OK;
}
static zck_status zg_whole_fetch(void *ctx, int module, float **t) {
  zg_whole *w = (zg_whole *)ctx;
  return zg_whole_point(w, &w->params, module, t);
}
static zck_status zg_whole_grads(void *ctx, int module, float **t) {
  zg_whole *w = (zg_whole *)ctx;
  return zg_whole_point(w, &w->grads, module, t);
}

// Hooks over whole flat buffers (d_grads may be NULL: a forward only).
static void zg_whole_init(zg_whole *w, const zck_cuda_gpt2 *m, const float *d_params, float *d_grads) {
  memset(w, 0, sizeof *w);
  w->m = m;
  zck_gpt2_params_walk(&m->c, NULL, (float *)d_params, &w->params);
  if (d_grads) zck_gpt2_params_walk(&m->c, NULL, d_grads, &w->grads);
}

extern "C" void zck_cuda_gpt2_free(zck_cuda_gpt2 *m) {
  if (!m) return;
  cudaSetDevice(m->ctx->device);
  if (m->mem) cudaFree(m->mem);
  if (m->gmem) cudaFree(m->gmem);
  if (m->d_tok) cudaFree(m->d_tok);
  if (m->h_losses) cudaFreeHost(m->h_losses);
  if (m->h_tok) cudaFreeHost(m->h_tok);
  if (m->tok_read) cudaEventDestroy(m->tok_read);
  cudaGetLastError(); /* a failed free must not be reported later as some kernel's error */
  free(m);
}

extern "C" zck_status zck_cuda_gpt2_create(zck_cuda_ctx *ctx, const zck_cuda_gpt2_config *c, int B, int T,
                                           zck_cuda_gpt2 **out) {
  *out = NULL;
  char why[128];
  ZCK_FAIL_IF(!zck_gpt2_config_valid(c, why, sizeof why), ZCK_ERR_INVALID_ARG,
              "cuda gpt2: bad configuration (L %d, H %d, C %d, V %d, T %d): %s", c->n_layer, c->n_head, c->n_embd,
              c->vocab_size, c->max_seq_len, why);
  ZCK_FAIL_IF(B < 1 || T < 1 || T > c->max_seq_len, ZCK_ERR_INVALID_ARG,
              "cuda gpt2: batch (%d, %d) with n_positions %d", B, T, c->max_seq_len);
  /* the kernels and cuBLAS take the row count B*T as an int */
  ZCK_FAIL_IF((size_t)B * (size_t)T > (size_t)INT_MAX, ZCK_ERR_INVALID_ARG,
              "cuda gpt2: batch (%d, %d) has more than 2^31 - 1 positions", B, T);
  ZCK_CU(cudaSetDevice(ctx->device), "select device %d", ctx->device);
  zck_cuda_gpt2 *m = (zck_cuda_gpt2 *)calloc(1, sizeof *m);
  if (!m) return zck__fail(ZCK_ERR_NO_MEMORY, "cuda gpt2: no memory");
  m->ctx = ctx;
  m->c = *c;
  m->B = B;
  m->T = T;
  m->n = zck_gpt2_acts_walk(c, B, T, NULL, NULL);
  size_t BT = (size_t)B * T;
  cudaError_t e = cudaMalloc(&m->mem, m->n * sizeof(float));
  if (e == cudaSuccess) e = cudaMalloc(&m->gmem, m->n * sizeof(float));
  if (e == cudaSuccess) e = cudaMalloc(&m->d_tok, 2 * BT * sizeof(int));
  if (e == cudaSuccess) e = cudaMallocHost(&m->h_losses, BT * sizeof(float));
  if (e == cudaSuccess) e = cudaMallocHost(&m->h_tok, 2 * BT * sizeof(int));
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&m->tok_read, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaMemset(m->mem, 0, m->n * sizeof(float));
  if (e != cudaSuccess) {
    zck_cuda_gpt2_free(m);
    return zck__fail(zck__cuda_status(e), "cuda gpt2: allocate a workspace of %zu bytes: %s",
                     2 * m->n * sizeof(float), cudaGetErrorString(e));
  }
  *out = m;
  return ZCK_OK;
}

extern "C" size_t zck_cuda_gpt2_ws_bytes(const zck_cuda_gpt2 *m) {
  return 2 * m->n * sizeof(float) + 2 * (size_t)m->B * m->T * sizeof(int);
}

extern "C" const float *zck_cuda_gpt2_logits(const zck_cuda_gpt2 *m) {
  zck_gpt2_acts a;
  zck_gpt2_acts_walk(&m->c, m->last_B ? m->last_B : m->B, m->last_T ? m->last_T : m->T, m->mem, &a);
  return a.logits;
}

extern "C" const float *zck_cuda_gpt2_losses(const zck_cuda_gpt2 *m) {
  zck_gpt2_acts a;
  zck_gpt2_acts_walk(&m->c, m->last_B ? m->last_B : m->B, m->last_T ? m->last_T : m->T, m->mem, &a);
  return a.losses;
}

static zck_status zg_check_tokens(const int *tok, size_t n, int V, const char *what) {
  for (size_t i = 0; i < n; i++)
    ZCK_FAIL_IF(tok[i] < 0 || tok[i] >= V, ZCK_ERR_INVALID_ARG, "cuda gpt2: %s[%zu] = %d is not a token id below %d",
                what, i, tok[i], V);
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_gpt2_forward_hooked(zck_cuda_gpt2 *m, const zck_cuda_gpt2_hooks *hk, const int *inputs,
                                                   const int *targets, int B, int T, float *loss) {
  const zck_cuda_gpt2_config *c = &m->c;
  int C = c->n_embd, V = c->vocab_size, H = c->n_head, BT = B * T;
  ZCK_FAIL_IF(B < 1 || T < 1 || B > m->B || T > m->T, ZCK_ERR_INVALID_ARG,
              "cuda gpt2: batch (%d, %d) exceeds the workspace's (%d, %d)", B, T, m->B, m->T);
  ZCK_TRY(zg_check_tokens(inputs, (size_t)BT, V, "inputs"));
  if (targets) ZCK_TRY(zg_check_tokens(targets, (size_t)BT, V, "targets"));
  zck_cuda_ctx *ctx = m->ctx;
  void *st = (void *)ctx->stream;
  ZCK_CU(cudaSetDevice(ctx->device), "select device %d", ctx->device);
  m->last_B = B;
  m->last_T = T;
  m->last_targets = false;
  int *d_in = m->d_tok, *d_tg = m->d_tok + (size_t)m->B * m->T;
  /* through page-locked staging: an asynchronous copy on the stream, no driver bounce; the
   * staging is rewritten only once the previous upload has read it (a forward that failed
   * after queueing its upload returned without waiting for it) */
  ZCK_CU(cudaEventSynchronize(m->tok_read), "wait for the previous token upload");
  memcpy(m->h_tok, inputs, (size_t)BT * sizeof(int));
  if (targets) memcpy(m->h_tok + BT, targets, (size_t)BT * sizeof(int));
  ZCK_CU(cudaMemcpyAsync(d_in, m->h_tok, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, ctx->stream),
         "upload the inputs");
  if (targets)
    ZCK_CU(cudaMemcpyAsync(d_tg, m->h_tok + BT, (size_t)BT * sizeof(int), cudaMemcpyHostToDevice, ctx->stream),
           "upload the targets");
  ZCK_CU(cudaEventRecord(m->tok_read, ctx->stream), "mark the token upload");
  zck_gpt2_params w;
  memset(&w, 0, sizeof w);
  zck_gpt2_acts a;
  zck_gpt2_acts_walk(c, B, T, m->mem, &a);
  ZCK_TRY(zg_fetch(m, hk, -1, &w));
  ZCK_TRY(zck_cuda_encoder_forward(a.encoded, d_in, w.wte, w.wpe, BT, T, C, st));
  if (hk->release) hk->release(hk->ctx, -1);
  const float *x = a.encoded;
  for (int l = 0; l < c->n_layer; l++) {
    ZCK_TRY(zg_fetch(m, hk, l, &w));
    const zck_gpt2_block_params *p = &w.h[l];
    zck_gpt2_block_acts *h = &a.h[l];
    ZCK_TRY(zck_cuda_layernorm_forward(h->ln_1, h->ln_1_mean, h->ln_1_rstd, x, p->ln_1_w, p->ln_1_b, BT, C, st));
    ZCK_TRY(zck_cuda_conv1d_forward(ctx, h->qkv, h->ln_1, p->attn_w, p->attn_b, BT, C, 3 * C));
    ZCK_TRY(zck_cuda_attention_forward(h->atty, h->att, h->qkv, B, T, C, H, st));
    ZCK_TRY(zck_cuda_conv1d_forward(ctx, h->attproj, h->atty, p->attn_proj_w, p->attn_proj_b, BT, C, C));
    ZCK_TRY(zck_cuda_residual_forward(h->res2, x, h->attproj, (size_t)BT * C, st));
    ZCK_TRY(zck_cuda_layernorm_forward(h->ln_2, h->ln_2_mean, h->ln_2_rstd, h->res2, p->ln_2_w, p->ln_2_b, BT, C, st));
    ZCK_TRY(zck_cuda_conv1d_forward(ctx, h->fch, h->ln_2, p->fc_w, p->fc_b, BT, C, 4 * C));
    ZCK_TRY(zck_cuda_gelu_forward(h->fch_gelu, h->fch, (size_t)BT * 4 * C, st));
    ZCK_TRY(zck_cuda_conv1d_forward(ctx, h->fcproj, h->fch_gelu, p->fc_proj_w, p->fc_proj_b, BT, 4 * C, C));
    ZCK_TRY(zck_cuda_residual_forward(h->res3, h->res2, h->fcproj, (size_t)BT * C, st));
    if (hk->release) hk->release(hk->ctx, l);
    x = h->res3;
  }
  ZCK_TRY(zg_fetch(m, hk, c->n_layer, &w));
  ZCK_TRY(zck_cuda_layernorm_forward(a.ln_f, a.ln_f_mean, a.ln_f_rstd, x, w.ln_f_w, w.ln_f_b, BT, C, st));
  ZCK_TRY(zck_cuda_lm_head_forward(ctx, a.logits, a.ln_f, w.wte, BT, C, V));
  if (hk->release) hk->release(hk->ctx, c->n_layer);
  if (!targets) {
    if (loss) *loss = 0.0f;
    ZCK_CU(cudaStreamSynchronize(ctx->stream), "gpt2 forward");
    return ZCK_OK;
  }
  ZCK_TRY(zck_cuda_softmax_xent_forward(a.probs, a.losses, a.logits, d_tg, BT, V, st));
  ZCK_CU(cudaMemcpyAsync(m->h_losses, a.losses, (size_t)BT * sizeof(float), cudaMemcpyDeviceToHost, ctx->stream),
         "download the losses");
  ZCK_CU(cudaStreamSynchronize(ctx->stream), "gpt2 forward");
  m->last_targets = true;
  double sum = 0.0;
  for (int bt = 0; bt < BT; bt++) sum += m->h_losses[bt];
  if (loss) *loss = (float)(sum / BT);
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_gpt2_forward(zck_cuda_gpt2 *m, const float *d_params, const int *inputs,
                                            const int *targets, int B, int T, float *loss) {
  zg_whole w;
  zg_whole_init(&w, m, d_params, NULL);
  zck_cuda_gpt2_hooks h = {&w, zg_whole_fetch, NULL, zg_whole_grads, NULL};
  return zck_cuda_gpt2_forward_hooked(m, &h, inputs, targets, B, T, loss);
}

extern "C" zck_status zck_cuda_gpt2_backward_hooked(zck_cuda_gpt2 *m, const zck_cuda_gpt2_hooks *hk, float scale) {
  ZCK_FAIL_IF(!m->last_targets, ZCK_ERR_INVALID_ARG, "cuda gpt2: backward needs a forward with targets first");
  const zck_cuda_gpt2_config *c = &m->c;
  int B = m->last_B, T = m->last_T;
  int C = c->n_embd, V = c->vocab_size, H = c->n_head, BT = B * T;
  zck_cuda_ctx *ctx = m->ctx;
  void *st = (void *)ctx->stream;
  ZCK_CU(cudaSetDevice(ctx->device), "select device %d", ctx->device);
  const int *d_in = m->d_tok, *d_tg = m->d_tok + (size_t)m->B * m->T;
  zck_gpt2_params w, g;
  memset(&w, 0, sizeof w);
  memset(&g, 0, sizeof g);
  zck_gpt2_acts a, d;
  zck_gpt2_acts_walk(c, B, T, m->mem, &a);
  zck_gpt2_acts_walk(c, B, T, m->gmem, &d);
  ZCK_CU(cudaMemsetAsync(m->gmem, 0, m->n * sizeof(float), ctx->stream), "clear the activation gradients");
  ZCK_TRY(zck_cuda_softmax_xent_backward(d.logits, a.probs, d_tg, BT, V, scale / (float)BT, st));
  ZCK_TRY(zg_fetch(m, hk, c->n_layer, &w));
  ZCK_TRY(zg_grads(m, hk, c->n_layer, &g));
  ZCK_TRY(zck_cuda_lm_head_backward(ctx, d.ln_f, g.wte, d.logits, a.ln_f, w.wte, BT, C, V));
  const float *xl = a.h[c->n_layer - 1].res3;
  float *dxl = d.h[c->n_layer - 1].res3;
  ZCK_TRY(zck_cuda_layernorm_backward(dxl, g.ln_f_w, g.ln_f_b, d.ln_f, xl, w.ln_f_w, a.ln_f_mean,
                                      a.ln_f_rstd, BT, C, st));
  if (hk->release) hk->release(hk->ctx, c->n_layer);
  if (hk->grads_done) ZCK_TRY(hk->grads_done(hk->ctx, c->n_layer));
  for (int l = c->n_layer - 1; l >= 0; l--) {
    ZCK_TRY(zg_fetch(m, hk, l, &w));
    ZCK_TRY(zg_grads(m, hk, l, &g));
    const zck_gpt2_block_params *p = &w.h[l], *gp = &g.h[l];
    zck_gpt2_block_acts *h = &a.h[l], *dh = &d.h[l];
    const float *x = l ? a.h[l - 1].res3 : a.encoded;
    float *dx = l ? d.h[l - 1].res3 : d.encoded;
    ZCK_TRY(zck_cuda_residual_backward(dh->res2, dh->fcproj, dh->res3, (size_t)BT * C, st));
    ZCK_TRY(zck_cuda_conv1d_backward(ctx, dh->fch_gelu, gp->fc_proj_w, gp->fc_proj_b, dh->fcproj,
                                     h->fch_gelu, p->fc_proj_w, BT, 4 * C, C));
    ZCK_TRY(zck_cuda_gelu_backward(dh->fch, h->fch, dh->fch_gelu, (size_t)BT * 4 * C, st));
    ZCK_TRY(zck_cuda_conv1d_backward(ctx, dh->ln_2, gp->fc_w, gp->fc_b, dh->fch, h->ln_2, p->fc_w, BT, C,
                                     4 * C));
    ZCK_TRY(zck_cuda_layernorm_backward(dh->res2, gp->ln_2_w, gp->ln_2_b, dh->ln_2, h->res2, p->ln_2_w,
                                        h->ln_2_mean, h->ln_2_rstd, BT, C, st));
    ZCK_TRY(zck_cuda_residual_backward(dx, dh->attproj, dh->res2, (size_t)BT * C, st));
    ZCK_TRY(zck_cuda_conv1d_backward(ctx, dh->atty, gp->attn_proj_w, gp->attn_proj_b, dh->attproj,
                                     h->atty, p->attn_proj_w, BT, C, C));
    /* the attention-probability gradient slot is the backward's (B, H, T, T) scratch */
    ZCK_TRY(zck_cuda_attention_backward(dh->qkv, dh->atty, h->qkv, h->att, dh->att, B, T, C, H, st));
    ZCK_TRY(zck_cuda_conv1d_backward(ctx, dh->ln_1, gp->attn_w, gp->attn_b, dh->qkv, h->ln_1, p->attn_w,
                                     BT, C, 3 * C));
    ZCK_TRY(zck_cuda_layernorm_backward(dx, gp->ln_1_w, gp->ln_1_b, dh->ln_1, x, p->ln_1_w, h->ln_1_mean,
                                        h->ln_1_rstd, BT, C, st));
    if (hk->release) hk->release(hk->ctx, l);
    if (hk->grads_done) ZCK_TRY(hk->grads_done(hk->ctx, l));
  }
  /* embeddings: no weights needed, only their gradients */
  ZCK_TRY(zg_grads(m, hk, -1, &g));
  ZCK_TRY(zck_cuda_encoder_backward(g.wte, g.wpe, d.encoded, d_in, BT, T, C, st));
  if (hk->grads_done) ZCK_TRY(hk->grads_done(hk->ctx, -1));
  ZCK_CU(cudaStreamSynchronize(ctx->stream), "gpt2 backward");
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_gpt2_backward(zck_cuda_gpt2 *m, const float *d_params, float *d_grads, float scale) {
  zg_whole w;
  zg_whole_init(&w, m, d_params, d_grads);
  zck_cuda_gpt2_hooks h = {&w, zg_whole_fetch, NULL, zg_whole_grads, NULL};
  return zck_cuda_gpt2_backward_hooked(m, &h, scale);
}
