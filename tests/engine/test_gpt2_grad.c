/* test_gpt2_grad.c: the GPT-2 backward against central finite differences of the forward,
 * on a tiny model (every tensor checked, tied wte included), plus the parameter table. */
#include "test.h"

#include "gpt2.h"
#include "rng.h"

#include <math.h>

static double loss_at(const ze_gpt2_config *c, const ze_gpt2_params *w, ze_gpt2_ws *ws, const int *in, const int *tg,
                      int B, int T) {
  return ze_gpt2_forward(c, w, ws, in, tg, B, T);
}

int main(void) {
  /* ---- the table: HF names, order and shapes */
  ze_gpt2_config big = {256, 64, 2, 4, 64};
  ZT_EQ_INT(ze_gpt2_n_tensors(&big), 28);
  ze_param_spec specs[28];
  ze_gpt2_param_specs(&big, specs);
  ZT_EQ_STR(specs[0].name, "transformer.wte.weight");
  ZT_EQ_INT(specs[0].shape[0], 256);
  ZT_EQ_STR(specs[1].name, "transformer.wpe.weight");
  ZT_EQ_STR(specs[2].name, "transformer.h.0.ln_1.weight");
  ZT_EQ_STR(specs[4].name, "transformer.h.0.attn.c_attn.weight");
  ZT_EQ_INT(specs[4].shape[0], 64);  /* Conv1D [in, out] */
  ZT_EQ_INT(specs[4].shape[1], 192);
  ZT_EQ_STR(specs[12].name, "transformer.h.0.mlp.c_proj.weight");
  ZT_EQ_INT(specs[12].shape[0], 256);
  ZT_EQ_STR(specs[26].name, "transformer.ln_f.weight");
  ZT_ASSERT(specs[0].decay && specs[1].decay && !specs[2].decay && !specs[5].decay && specs[4].decay);
  size_t total = 0;
  for (int i = 0; i < 28; i++) {
    ZT_EQ_U64(specs[i].offset, total);
    total += specs[i].numel;
  }
  ZT_EQ_U64(total, ze_gpt2_numel(&big));
  ZT_EQ_U64(total, 256 * 64 + 64 * 64 + 2 * (12 * 64 * 64 + 13 * 64) + 2 * 64);
  /* modules partition the tensors (wte again for lm_head) */
  size_t msum = 0;
  for (int m = -1; m <= big.n_layer; m++) msum += ze_gpt2_module_numel(&big, m);
  ZT_EQ_U64(msum, total + 256 * 64);

  /* ---- gradient check */
  ze_gpt2_config c = {16, 6, 2, 2, 8};
  int B = 2, T = 5;
  size_t n = ze_gpt2_numel(&c), nt = ze_gpt2_n_tensors(&c);
  float *p = calloc(n, sizeof(float)), *g = calloc(n, sizeof(float));
  ze_gpt2_init(&c, p, 7);
  /* larger weights than GPT-2's 0.02 so every path carries a measurable gradient */
  uint64_t st = 99;
  for (size_t i = 0; i < n; i++) p[i] += (float)(0.3 * ze_normal(&st));
  ze_gpt2_params w, gw;
  ze_gpt2_carve(&c, p, &w);
  ze_gpt2_carve(&c, g, &gw);
  ze_gpt2_ws *ws = ze_gpt2_ws_new(&c, B, T);
  int in[10], tg[10];
  for (int i = 0; i < B * T; i++) {
    in[i] = (int)(ze_splitmix64(&st) % 16);
    tg[i] = (int)(ze_splitmix64(&st) % 16);
  }
  loss_at(&c, &w, ws, in, tg, B, T);
  ze_gpt2_backward(&c, &w, &gw, ws, in, tg, B, T, 1.0f);
  ze_param_spec *sp = calloc(nt, sizeof *sp);
  ze_gpt2_param_specs(&c, sp);
  const float eps = 1e-2f;
  for (size_t t = 0; t < nt; t++) {
    double num2 = 0, diff2 = 0, ana2 = 0;
    size_t step = sp[t].numel > 24 ? sp[t].numel / 24 : 1;
    for (size_t j = 0; j < sp[t].numel; j += step) {
      float *x = p + sp[t].offset + j, keep = *x;
      *x = keep + eps;
      double lp = loss_at(&c, &w, ws, in, tg, B, T);
      *x = keep - eps;
      double lm = loss_at(&c, &w, ws, in, tg, B, T);
      *x = keep;
      double num = (lp - lm) / (2.0 * eps), ana = g[sp[t].offset + j];
      num2 += num * num;
      ana2 += ana * ana;
      diff2 += (num - ana) * (num - ana);
    }
    double rel = sqrt(diff2) / (sqrt(num2) + 1e-6);
    if (rel > 5e-3 || sqrt(ana2) < 1e-6)
      ZT_FAIL("%s: analytic vs numerical gradient differ: relative %.3g (|num| %.3g, |ana| %.3g)", sp[t].name, rel,
              sqrt(num2), sqrt(ana2));
  }
  /* the same backward again gives the same bits; it accumulates into g */
  float *g1 = malloc(n * sizeof(float));
  memcpy(g1, g, n * sizeof(float));
  memset(g, 0, n * sizeof(float));
  loss_at(&c, &w, ws, in, tg, B, T);
  ze_gpt2_backward(&c, &w, &gw, ws, in, tg, B, T, 1.0f);
  ZT_EQ_MEM(g, g1, n * sizeof(float));
  loss_at(&c, &w, ws, in, tg, B, T);
  ze_gpt2_backward(&c, &w, &gw, ws, in, tg, B, T, 0.5f);
  for (size_t i = 0; i < n; i++) ZT_ASSERT(fabsf(g[i] - 1.5f * g1[i]) <= 1e-6f * (1.0f + fabsf(g1[i])));
  /* a smaller batch in the same workspace, and determinism */
  float l1 = ze_gpt2_forward(&c, &w, ws, in, tg, 1, 3);
  float l2 = ze_gpt2_forward(&c, &w, ws, in, tg, B, T);
  ZT_ASSERT(l1 == ze_gpt2_forward(&c, &w, ws, in, tg, 1, 3));
  ZT_ASSERT(l2 == ze_gpt2_forward(&c, &w, ws, in, tg, B, T));
  free(g1);
  free(sp);
  free(p);
  free(g);
  ze_gpt2_ws_free(ws);
  return 0;
}
