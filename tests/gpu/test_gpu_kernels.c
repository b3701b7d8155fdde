/* test_gpu_kernels.c: each GPT-2 kernel of cuda/ against the CPU engine's function on
 * small, odd shapes (B 2, T 13, C 48, H 4, V 97; attention also at T 70 > a warp, the
 * cross-entropy also at V 1000 > its block). The CPU references are
 * samples/engine/gpt2.c's kernels themselves (gpt2_kernels.h).
 *
 * Tolerances (per element |gpu - cpu| <= atol + rtol*|cpu| unless "exact"):
 *   encoder fwd/bwd, residual fwd/bwd, LayerNorm dw/db (given the CPU's mean/rstd),
 *   bias gradients, cross-entropy backward (given the CPU's probs), pack/unpack: exact;
 *   LayerNorm fwd 1e-5/1e-5, dx 1e-4/1e-5 (row sums in another order);
 *   GELU fwd 2e-6/1e-6, bwd 1e-5/1e-5 (CUDA tanhf is within 2 ulp of glibc's: near
 *   x = -4, 0.5 x (1 + tanh) takes 2 ulp of 1 times 2, about 2.4e-7, as absolute error);
 *   attention: probabilities 1e-5/1e-6, output 1e-4/1e-5, dqkv 1e-4/1e-5;
 *   softmax probabilities 1e-5/1e-7, losses 0/1e-5;
 *   matrix products (cuBLAS, fp32): relative L2 error 1e-5 of the whole result; the general
 *   GEMM per element within 3e-5 * sum|a||b| of a double reference (bf16 inputs: of the
 *   double product of the rounded inputs). */
#include "gpu_util.h"
#include "gpt2_kernels.h"

#define B 2
#define T 13
#define C 48
#define H 4
#define V 97
#define BT (B * T)

// ---- helpers

static uint64_t seed = 42;
static float *rnd(size_t n, float scale) {
  float *x = malloc(n * sizeof *x);
  gpu_fill(x, n, &seed, scale);
  return x;
}
static float *dl(const float *d, size_t n) {
  float *h = malloc(n * sizeof *h);
  gpu_get(h, d, n * sizeof *h);
  return h;
}
#define UP(h, n) ((float *)gpu_dup((h), (n) * sizeof(float)))

static void test_encoder(void) {
  int inp[BT];
  for (int i = 0; i < BT; i++) inp[i] = (int)(gpu_rand(&seed) % V);
  inp[3] = inp[7] = inp[20]; /* repeated tokens: the backward adds several rows into one */
  float *wte = rnd(V * C, 1), *wpe = rnd(T * C, 1), *out = malloc(BT * C * 4);
  int *d_inp = gpu_dup(inp, sizeof inp);
  float *d_wte = UP(wte, V * C), *d_wpe = UP(wpe, T * C), *d_out = gpu_alloc(BT * C * 4);
  ze__gpt2_encoder_forward(out, inp, wte, wpe, BT, T, C);
  ZT_OK(zck_cuda_encoder_forward(d_out, d_inp, d_wte, d_wpe, BT, T, C, NULL));
  float *g = dl(d_out, BT * C);
  gpu_same("encoder forward", g, out, BT * C * 4);
  free(g);
  float *dout = rnd(BT * C, 1);
  float *d_dout = UP(dout, BT * C);
  ze__gpt2_encoder_backward(wte, wpe, dout, inp, BT, T, C);
  ZT_OK(zck_cuda_encoder_backward(d_wte, d_wpe, d_dout, d_inp, BT, T, C, NULL));
  g = dl(d_wte, V * C);
  gpu_same("encoder backward dwte", g, wte, V * C * 4);
  free(g);
  g = dl(d_wpe, T * C);
  gpu_same("encoder backward dwpe", g, wpe, T * C * 4);
  free(g);
  free(wte), free(wpe), free(out), free(dout);
  zck_cuda_free(d_inp), zck_cuda_free(d_wte), zck_cuda_free(d_wpe), zck_cuda_free(d_out), zck_cuda_free(d_dout);
}

static void test_layernorm(void) {
  float *inp = rnd(BT * C, 2), *w = rnd(C, 1), *b = rnd(C, 1);
  for (int i = 0; i < BT * C; i++) inp[i] += 0.5f;
  float *out = malloc(BT * C * 4), *mean = malloc(BT * 4), *rstd = malloc(BT * 4);
  float *d_inp = UP(inp, BT * C), *d_w = UP(w, C), *d_b = UP(b, C);
  float *d_out = gpu_alloc(BT * C * 4), *d_mean = gpu_alloc(BT * 4), *d_rstd = gpu_alloc(BT * 4);
  ze__gpt2_layernorm_forward(out, mean, rstd, inp, w, b, BT, C);
  ZT_OK(zck_cuda_layernorm_forward(d_out, d_mean, d_rstd, d_inp, d_w, d_b, BT, C, NULL));
  float *g = dl(d_out, BT * C), *gm = dl(d_mean, BT), *gr = dl(d_rstd, BT);
  gpu_close("layernorm forward out", g, out, BT * C, 1e-5, 1e-5);
  gpu_close("layernorm forward mean", gm, mean, BT, 1e-5, 1e-6);
  gpu_close("layernorm forward rstd", gr, rstd, BT, 1e-5, 1e-6);
  free(g), free(gm), free(gr);
  /* backward from the CPU's mean/rstd, so dw/db must be exact */
  ZT_OK(zck_cuda_memcpy(d_mean, mean, BT * 4));
  ZT_OK(zck_cuda_memcpy(d_rstd, rstd, BT * 4));
  float *dout = rnd(BT * C, 1), *dinp = rnd(BT * C, 1), *dw = rnd(C, 1), *db = rnd(C, 1);
  float *d_dout = UP(dout, BT * C), *d_dinp = UP(dinp, BT * C), *d_dw = UP(dw, C), *d_db = UP(db, C);
  ze__gpt2_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, BT, C);
  ZT_OK(zck_cuda_layernorm_backward(d_dinp, d_dw, d_db, d_dout, d_inp, d_w, d_mean, d_rstd, BT, C, NULL));
  g = dl(d_dinp, BT * C);
  gpu_close("layernorm backward dx", g, dinp, BT * C, 1e-4, 1e-5);
  free(g);
  g = dl(d_dw, C);
  gpu_same("layernorm backward dw", g, dw, C * 4);
  free(g);
  g = dl(d_db, C);
  gpu_same("layernorm backward db", g, db, C * 4);
  free(g);
  free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dinp), free(dw), free(db);
  zck_cuda_free(d_inp), zck_cuda_free(d_w), zck_cuda_free(d_b), zck_cuda_free(d_out), zck_cuda_free(d_mean);
  zck_cuda_free(d_rstd), zck_cuda_free(d_dout), zck_cuda_free(d_dinp), zck_cuda_free(d_dw), zck_cuda_free(d_db);
}

static void test_gelu_residual(void) {
  size_t n = 4 * BT * C;
  float *x = rnd(n, 4), *out = malloc(n * 4), *dout = rnd(n, 1), *dinp = rnd(n, 1);
  float *d_x = UP(x, n), *d_out = gpu_alloc(n * 4), *d_dout = UP(dout, n), *d_dinp = UP(dinp, n);
  ze__gpt2_gelu_forward(out, x, n);
  ZT_OK(zck_cuda_gelu_forward(d_out, d_x, n, NULL));
  float *g = dl(d_out, n);
  gpu_close("gelu forward", g, out, n, 2e-6, 1e-6);
  free(g);
  ze__gpt2_gelu_backward(dinp, x, dout, n);
  ZT_OK(zck_cuda_gelu_backward(d_dinp, d_x, d_dout, n, NULL));
  g = dl(d_dinp, n);
  gpu_close("gelu backward", g, dinp, n, 1e-5, 1e-5);
  free(g);
  /* residual: out = a + b; da += d, db += d */
  float *a = rnd(n, 1), *b = rnd(n, 1);
  float *d_a = UP(a, n), *d_b = UP(b, n);
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
  ZT_OK(zck_cuda_residual_forward(d_out, d_a, d_b, n, NULL));
  g = dl(d_out, n);
  gpu_same("residual forward", g, out, n * 4);
  free(g);
  for (size_t i = 0; i < n; i++) a[i] += dout[i], b[i] += dout[i];
  ZT_OK(zck_cuda_residual_backward(d_a, d_b, d_dout, n, NULL));
  g = dl(d_a, n);
  gpu_same("residual backward da", g, a, n * 4);
  free(g);
  g = dl(d_b, n);
  gpu_same("residual backward db", g, b, n * 4);
  free(g);
  free(x), free(out), free(dout), free(dinp), free(a), free(b);
  zck_cuda_free(d_x), zck_cuda_free(d_out), zck_cuda_free(d_dout), zck_cuda_free(d_dinp), zck_cuda_free(d_a);
  zck_cuda_free(d_b);
}

/* Shapes with T below and above a warp (the row kernels stride their lanes over t2). */
static void test_attention(int b_n, int t_n, int c_n, int h_n) {
  int bt = b_n * t_n;
  size_t nq = (size_t)bt * 3 * c_n, na = (size_t)b_n * h_n * t_n * t_n, no = (size_t)bt * c_n;
  float *qkv = rnd(nq, 1), *att = malloc(na * 4), *out = malloc(no * 4);
  float *d_qkv = UP(qkv, nq), *d_att = gpu_alloc(na * 4), *d_out = gpu_alloc(no * 4);
  ze__gpt2_attention_forward(out, att, qkv, b_n, t_n, c_n, h_n);
  ZT_OK(zck_cuda_attention_forward(d_out, d_att, d_qkv, b_n, t_n, c_n, h_n, NULL));
  printf("  attention B %d T %d C %d H %d\n", b_n, t_n, c_n, h_n);
  float *g = dl(d_att, na);
  gpu_close("attention probabilities", g, att, na, 1e-5, 1e-6);
  free(g);
  g = dl(d_out, no);
  gpu_close("attention output", g, out, no, 1e-4, 1e-5);
  free(g);
  /* backward from the CPU's probabilities */
  ZT_OK(zck_cuda_memcpy(d_att, att, na * 4));
  float *dout = rnd(no, 1), *dqkv = rnd(nq, 1), *datt = malloc((size_t)t_n * 4);
  float *d_dout = UP(dout, no), *d_dqkv = UP(dqkv, nq), *d_scratch = gpu_alloc(na * 4);
  ze__gpt2_attention_backward(dqkv, dout, qkv, att, datt, b_n, t_n, c_n, h_n);
  ZT_OK(zck_cuda_attention_backward(d_dqkv, d_dout, d_qkv, d_att, d_scratch, b_n, t_n, c_n, h_n, NULL));
  g = dl(d_dqkv, nq);
  gpu_close("attention backward dqkv", g, dqkv, nq, 1e-4, 1e-5);
  free(g);
  ZT_ERR(zck_cuda_attention_forward(d_out, d_att, d_qkv, b_n, t_n, 50, 4, NULL), ZCK_ERR_INVALID_ARG, "multiple of H");
  free(qkv), free(att), free(out), free(dout), free(dqkv), free(datt);
  zck_cuda_free(d_qkv), zck_cuda_free(d_att), zck_cuda_free(d_out), zck_cuda_free(d_dout), zck_cuda_free(d_dqkv);
  zck_cuda_free(d_scratch);
}

/* V below and above the block of 256 threads that reduces a row. */
static void test_xent(int bt_n, int v_n) {
  printf("  softmax cross-entropy BT %d V %d\n", bt_n, v_n);
  float *logits = rnd((size_t)bt_n * v_n, 3), *probs = malloc((size_t)bt_n * v_n * 4), *losses = malloc((size_t)bt_n * 4);
  int *tg = malloc((size_t)bt_n * sizeof *tg);
  for (int i = 0; i < bt_n; i++) tg[i] = (int)(gpu_rand(&seed) % v_n);
  float *d_logits = UP(logits, (size_t)bt_n * v_n), *d_probs = gpu_alloc((size_t)bt_n * v_n * 4), *d_losses = gpu_alloc((size_t)bt_n * 4);
  int *d_tg = gpu_dup(tg, (size_t)bt_n * sizeof *tg);
  ze__gpt2_softmax_xent_forward(probs, losses, logits, tg, bt_n, v_n);
  ZT_OK(zck_cuda_softmax_xent_forward(d_probs, d_losses, d_logits, d_tg, bt_n, v_n, NULL));
  float *g = dl(d_probs, (size_t)bt_n * v_n);
  gpu_close("softmax probabilities", g, probs, (size_t)bt_n * v_n, 1e-5, 1e-7);
  free(g);
  g = dl(d_losses, (size_t)bt_n);
  gpu_close("cross-entropy losses", g, losses, bt_n, 0, 1e-5);
  free(g);
  /* backward from the CPU's probabilities: (p - onehot) * dloss, exact */
  ZT_OK(zck_cuda_memcpy(d_probs, probs, (size_t)bt_n * v_n * 4));
  float dloss = 0.75f / (float)bt_n, *dz = malloc((size_t)bt_n * v_n * 4);
  for (int bt = 0; bt < bt_n; bt++)
    for (int v = 0; v < v_n; v++) dz[(size_t)bt * v_n + v] = (probs[(size_t)bt * v_n + v] - (v == tg[bt] ? 1.0f : 0.0f)) * dloss;
  float *d_dz = gpu_alloc((size_t)bt_n * v_n * 4);
  ZT_OK(zck_cuda_softmax_xent_backward(d_dz, d_probs, d_tg, bt_n, v_n, dloss, NULL));
  g = dl(d_dz, (size_t)bt_n * v_n);
  gpu_same("cross-entropy backward", g, dz, (size_t)bt_n * v_n * 4);
  free(g);
  free(logits), free(probs), free(losses), free(dz), free(tg);
  zck_cuda_free(d_logits), zck_cuda_free(d_probs), zck_cuda_free(d_losses), zck_cuda_free(d_tg), zck_cuda_free(d_dz);
}

static void test_gemm(zck_cuda_ctx *ctx) {
  int m = 37, n = 53, k = 301;
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++)
      for (int bf = 0; bf < 2; bf++) {
        float *A = rnd((size_t)m * k, 1), *Bm = rnd((size_t)k * n, 1), *Cm = rnd((size_t)m * n, 1);
        zck_dtype dt = bf ? ZCK_BF16 : ZCK_F32;
        if (bf) { /* round the inputs to bf16 values: the reference uses what the device sees */
          uint16_t t;
          for (size_t i = 0; i < (size_t)m * k; i++) zck_convert(ZCK_BF16, &t, ZCK_F32, &A[i], 1), zck_convert(ZCK_F32, &A[i], ZCK_BF16, &t, 1);
          for (size_t i = 0; i < (size_t)k * n; i++) zck_convert(ZCK_BF16, &t, ZCK_F32, &Bm[i], 1), zck_convert(ZCK_F32, &Bm[i], ZCK_BF16, &t, 1);
        }
        int lda = ta ? m : k, ldb = tb ? k : n;
        float alpha = 0.5f, beta = 2.0f;
        float *want = malloc((size_t)m * n * 4);
        double *bound = malloc((size_t)m * n * sizeof(double));
        for (int i = 0; i < m; i++)
          for (int j = 0; j < n; j++) {
            double s = 0, sa = 0;
            for (int q = 0; q < k; q++) {
              double a = ta ? A[(size_t)q * lda + i] : A[(size_t)i * lda + q];
              double b = tb ? Bm[(size_t)j * ldb + q] : Bm[(size_t)q * ldb + j];
              s += a * b;
              sa += fabs(a * b);
            }
            want[(size_t)i * n + j] = (float)(alpha * s + beta * Cm[(size_t)i * n + j]);
            bound[(size_t)i * n + j] = 3e-5 * (fabs(alpha) * sa + fabs(beta * Cm[(size_t)i * n + j])) + 1e-7;
          }
        void *dA, *dB;
        size_t es = zck_dtype_size(dt);
        uint16_t *h16 = malloc((size_t)(m > n ? m : n) * k * 2);
        if (bf) {
          zck_convert(ZCK_BF16, h16, ZCK_F32, A, (size_t)m * k);
          dA = gpu_dup(h16, (size_t)m * k * es);
          zck_convert(ZCK_BF16, h16, ZCK_F32, Bm, (size_t)k * n);
          dB = gpu_dup(h16, (size_t)k * n * es);
        } else {
          dA = UP(A, (size_t)m * k);
          dB = UP(Bm, (size_t)k * n);
        }
        float *dC = UP(Cm, (size_t)m * n);
        ZT_OK(zck_cuda_gemm(ctx, ta, tb, m, n, k, alpha, dA, lda, dB, ldb, dt, beta, dC, n));
        float *g = dl(dC, (size_t)m * n);
        double worst = 0;
        for (size_t i = 0; i < (size_t)m * n; i++) {
          double e = fabs((double)g[i] - want[i]);
          if (e > bound[i]) ZT_FAIL("gemm ta %d tb %d %s: element %zu: %g vs %g", ta, tb, zck_dtype_name(dt), i, g[i], want[i]);
          if (e / bound[i] > worst) worst = e / bound[i];
        }
        printf("  gemm ta=%d tb=%d %-8s worst error %.3g of the bound\n", ta, tb, zck_dtype_name(dt), worst);
        free(A), free(Bm), free(Cm), free(want), free(bound), free(g), free(h16);
        zck_cuda_free(dA), zck_cuda_free(dB), zck_cuda_free(dC);
      }
  ZT_ERR(zck_cuda_gemm(ctx, 0, 0, 1, 1, 1, 1, NULL, 1, NULL, 1, ZCK_F16, 0, NULL, 1), ZCK_ERR_INVALID_ARG, "float16");
}

static void test_conv1d_lm_head(zck_cuda_ctx *ctx) {
  int IC = C, OC = 3 * C;
  float *inp = rnd(BT * IC, 1), *w = rnd(IC * OC, 0.2f), *b = rnd(OC, 0.5f), *out = malloc(BT * OC * 4);
  float *d_inp = UP(inp, BT * IC), *d_w = UP(w, IC * OC), *d_b = UP(b, OC), *d_out = gpu_alloc(BT * OC * 4);
  ze__gpt2_conv1d_forward(out, inp, w, b, BT, IC, OC);
  ZT_OK(zck_cuda_conv1d_forward(ctx, d_out, d_inp, d_w, d_b, BT, IC, OC));
  float *g = dl(d_out, BT * OC);
  gpu_close_l2("conv1d forward", g, out, BT * OC, 1e-5, 1e-6);
  free(g);
  float *dout = rnd(BT * OC, 1), *dinp = rnd(BT * IC, 1), *dw = rnd(IC * OC, 1), *db = rnd(OC, 1);
  float *d_dout = UP(dout, BT * OC), *d_dinp = UP(dinp, BT * IC), *d_dw = UP(dw, IC * OC), *d_db = UP(db, OC);
  ze__gpt2_conv1d_backward(dinp, dw, db, dout, inp, w, BT, IC, OC);
  ZT_OK(zck_cuda_conv1d_backward(ctx, d_dinp, d_dw, d_db, d_dout, d_inp, d_w, BT, IC, OC));
  g = dl(d_dinp, BT * IC);
  gpu_close_l2("conv1d backward dinp", g, dinp, BT * IC, 1e-5, 1e-6);
  free(g);
  g = dl(d_dw, IC * OC);
  gpu_close_l2("conv1d backward dw", g, dw, IC * OC, 1e-5, 1e-6);
  free(g);
  g = dl(d_db, OC);
  gpu_same("conv1d backward db", g, db, OC * 4);
  free(g);
  /* tied lm_head */
  float *wte = rnd(V * C, 0.2f), *logits = malloc(BT * V * 4);
  float *d_wte = UP(wte, V * C), *d_logits = gpu_alloc(BT * V * 4);
  ze__gpt2_lm_head_forward(logits, inp, wte, BT, C, V);
  ZT_OK(zck_cuda_lm_head_forward(ctx, d_logits, d_inp, d_wte, BT, C, V));
  g = dl(d_logits, BT * V);
  gpu_close_l2("lm_head forward", g, logits, BT * V, 1e-5, 1e-6);
  free(g);
  float *dlog = rnd(BT * V, 1), *dwte = rnd(V * C, 1), *dx = rnd(BT * C, 1);
  float *d_dlog = UP(dlog, BT * V), *d_dwte = UP(dwte, V * C), *d_dx = UP(dx, BT * C);
  ze__gpt2_lm_head_backward(dx, dwte, dlog, inp, wte, BT, C, V);
  ZT_OK(zck_cuda_lm_head_backward(ctx, d_dx, d_dwte, d_dlog, d_inp, d_wte, BT, C, V));
  g = dl(d_dx, BT * C);
  gpu_close_l2("lm_head backward dinp", g, dx, BT * C, 1e-5, 1e-6);
  free(g);
  g = dl(d_dwte, V * C);
  gpu_close_l2("lm_head backward dwte", g, dwte, V * C, 1e-5, 1e-6);
  free(g);
  free(inp), free(w), free(b), free(out), free(dout), free(dinp), free(dw), free(db), free(wte), free(logits);
  free(dlog), free(dwte), free(dx);
  zck_cuda_free(d_inp), zck_cuda_free(d_w), zck_cuda_free(d_b), zck_cuda_free(d_out), zck_cuda_free(d_dout);
  zck_cuda_free(d_dinp), zck_cuda_free(d_dw), zck_cuda_free(d_db), zck_cuda_free(d_wte), zck_cuda_free(d_logits);
  zck_cuda_free(d_dlog), zck_cuda_free(d_dwte), zck_cuda_free(d_dx);
}

/* pack: model -> flat with a divisor (zero.c's pack_group), unpack: bf16 flat -> model */
static void test_pack(void) {
  enum { NM = 1000, NF = 1203, NR = 9 };
  zck_cuda_range r[NR];
  uint64_t so = 0, d_o = 0;
  for (int i = 0; i < NR; i++) {
    uint64_t cnt = 1 + gpu_rand(&seed) % 100;
    r[i] = (zck_cuda_range){so, d_o + 7 * (uint64_t)i, cnt};
    so += cnt + 3;
    d_o += cnt;
  }
  r[4].count = 0; /* empty ranges are fine */
  float *model = rnd(NM, 10), *flat = calloc(NF, 4);
  for (int i = 0; i < NR; i++)
    for (uint64_t j = 0; j < r[i].count; j++) flat[r[i].dst_off + j] = model[r[i].src_off + j] / 3.0f;
  zck_cuda_pack_plan *pp;
  ZT_OK(zck_cuda_pack_plan_create(r, NR, &pp));
  float *d_model = UP(model, NM), *d_flat = gpu_alloc(NF * 4);
  ZT_OK(zck_cuda_pack_run(pp, 0, d_flat, ZCK_F32, d_model, ZCK_F32, 3.0f, NULL));
  float *g = dl(d_flat, NF);
  gpu_same("pack fp32 / 3", g, flat, NF * 4);
  free(g);
  /* fp32 flat -> bf16 flat -> model (reverse), as unpack_group's zck_convert */
  uint16_t *flat16 = calloc(NF, 2), *g16 = malloc(NF * 2);
  zck_convert(ZCK_BF16, flat16, ZCK_F32, flat, NF);
  uint16_t *d_flat16 = gpu_alloc(NF * 2);
  ZT_OK(zck_cuda_pack_run(pp, 0, d_flat16, ZCK_BF16, d_model, ZCK_F32, 3.0f, NULL));
  gpu_get(g16, d_flat16, NF * 2);
  gpu_same("pack fp32 / 3 -> bf16", g16, flat16, NF * 2);
  float *model2 = calloc(NM, 4);
  for (int i = 0; i < NR; i++)
    zck_convert(ZCK_F32, model2 + r[i].src_off, ZCK_BF16, flat16 + r[i].dst_off, r[i].count);
  float *d_model2 = gpu_alloc(NM * 4);
  ZT_OK(zck_cuda_pack_run(pp, 1, d_model2, ZCK_F32, d_flat16, ZCK_BF16, 1.0f, NULL));
  g = dl(d_model2, NM);
  gpu_same("unpack bf16 -> fp32", g, model2, NM * 4);
  free(g);
  ZT_ERR(zck_cuda_pack_run(pp, 0, d_flat, ZCK_F16, d_model, ZCK_F32, 1.0f, NULL), ZCK_ERR_INVALID_ARG, "float16");
  zck_cuda_pack_plan_free(pp);
  free(model), free(flat), free(flat16), free(g16), free(model2);
  zck_cuda_free(d_model), zck_cuda_free(d_flat), zck_cuda_free(d_flat16), zck_cuda_free(d_model2);
}

int main(void) {
  if (zck_cuda_device_count() == 0) zt_skip("no CUDA device");
  zck_cuda_ctx *ctx;
  ZT_OK(zck_cuda_ctx_create(0, &ctx));
  test_encoder();
  test_layernorm();
  test_gelu_residual();
  test_attention(B, T, C, H);
  test_attention(2, 70, 48, 3);
  test_xent(BT, V);
  test_xent(5, 1000);
  test_gemm(ctx);
  test_conv1d_lm_head(ctx);
  test_pack();
  zck_cuda_ctx_free(ctx);
  return 0;
}
