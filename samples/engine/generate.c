/* generate.c: greedy generation with ZeRO-3 parameters gathered at once or per module
 * (see generate.h). */
#include "generate.h"

#include "rng.h"
#include "util.h"

#include <stdio.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct gen_ctx {
  const ze_gpt2_config *c;
  ze_zero_rank *zr;
  bool gather_all;
  float *full;                 /* gather_all: the whole model (fp32) */
  float *module_buf;           /* per-module mode: the running module's tensors */
  ze_param_spec *specs;
  size_t cur_bytes, peak_bytes;
  zck_status status;
} gen_ctx;

static void gen_account(gen_ctx *g, long delta) {
  g->cur_bytes = (size_t)((long)g->cur_bytes + delta);
  if (g->cur_bytes > g->peak_bytes) g->peak_bytes = g->cur_bytes;
}

static bool gen_fetch(void *ctx, int module, ze_gpt2_params *p) {
  gen_ctx *g = ctx;
  if (g->gather_all) {
    ze_gpt2_carve(g->c, g->full, p);
    return true;
  }
  size_t bytes = ze_gpt2_module_numel(g->c, module) * sizeof(float);
  g->module_buf = zck__malloc(bytes);
  if (!g->module_buf) {
    g->status = ZCK_ERR_NO_MEMORY;
    return false;
  }
  gen_account(g, (long)bytes);
  int idx[12];
  uint32_t params[12];
  int k = ze_gpt2_module_tensors(g->c, module, idx);
  for (int i = 0; i < k; i++) params[i] = (uint32_t)idx[i];
  g->status = ze_zero_fetch(g->zr, params, (size_t)k, g->module_buf);
  if (g->status != ZCK_OK) return false;
  ze_gpt2_carve_module(g->c, module, g->module_buf, p);
  return true;
}

static void gen_release(void *ctx, int module) {
  gen_ctx *g = ctx;
  if (!g->module_buf) return;
  gen_account(g, -(long)(ze_gpt2_module_numel(g->c, module) * sizeof(float)));
  free(g->module_buf);
  g->module_buf = NULL;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

zck_status ze_generate(const ze_gpt2_config *c, ze_zero_rank *zr, bool gather_all, const char *prompt, int n_tokens,
                       char **text_out, double *seconds, size_t *peak_bytes) {
  *text_out = NULL;
  const ze_zero_plan *plan = zr->plan;
  gen_ctx g = {c, zr, gather_all, NULL, NULL, NULL, 0, 0, ZCK_OK};
  size_t n_specs = ze_gpt2_n_tensors(c);
  int T = c->max_seq_len;
  size_t plen = strlen(prompt);
  int *tokens = zck__calloc(plen + (size_t)n_tokens + 1, sizeof(int));
  float *logits = zck__calloc((size_t)c->vocab_size, sizeof(float));
  char *text = zck__calloc((size_t)n_tokens + 1, 1);
  ze_gpt2_ws *ws = ze_gpt2_ws_new(c, 1, T);
  g.specs = zck__calloc(n_specs, sizeof *g.specs);
  zck_status s = ZCK_OK;
  if (!tokens || !logits || !text || !ws || !g.specs) {
    s = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory for generation");
    goto done;
  }
  ze_gpt2_param_specs(c, g.specs);
  ZCK_CHECK_GOTO(zr->comm->barrier(zr->comm), s, done);
  double t0 = now_seconds();
  if (gather_all) {
    size_t bytes = plan->model_numel * sizeof(float);
    uint32_t *all = zck__calloc(n_specs, sizeof *all);
    g.full = zck__malloc(bytes);
    if (!g.full || !all) {
      free(all);
      s = ZCK_ERR_NO_MEMORY;
      goto done;
    }
    gen_account(&g, (long)bytes);
    for (size_t i = 0; i < n_specs; i++) all[i] = (uint32_t)i;
    s = ze_zero_fetch(zr, all, n_specs, g.full); /* spec order is model order */
    free(all);
    if (s != ZCK_OK) goto done;
  }
  for (size_t i = 0; i < plen; i++) tokens[i] = (unsigned char)prompt[i];
  int n = (int)plen;
  if (n == 0) tokens[n++] = '\n';
  ze_fetch f = {&g, gen_fetch, gen_release};
  for (int t = 0; t < n_tokens; t++) {
    int ctx = n < T ? n : T;
    if (!ze_gpt2_infer_last(c, &f, ws, tokens + n - ctx, ctx, logits)) {
      s = g.status != ZCK_OK ? g.status : zck__fail(ZCK_ERR_INTERNAL, "generation failed");
      goto done;
    }
    int best = 0;
    for (int v = 1; v < c->vocab_size; v++)
      if (logits[v] > logits[best]) best = v;
    tokens[n++] = best;
    text[t] = (char)best;
  }
  *seconds = now_seconds() - t0;
  *peak_bytes = g.peak_bytes;
  *text_out = text;
  text = NULL;
done:
  if (g.module_buf) free(g.module_buf);
  free(g.full);
  free(g.specs);
  ze_gpt2_ws_free(ws);
  free(tokens);
  free(logits);
  free(text);
  return s;
}

zck_status ze_eval_sums(const ze_gpt2_config *c, ze_zero_rank *zr, const ze_corpus *corpus, int n, uint64_t seed,
                        int *right, char *examples, size_t cap) {
  *right = 0;
  if (cap) examples[0] = '\0';
  bool used[100 * 100] = {false};
  uint64_t st = seed ^ 0x73756d73ull; /* "sums" */
  size_t o = 0;
  for (int i = 0, tries = 0; i < n && tries < 100 * 100 * 64; tries++) {
    unsigned a = (unsigned)(ze_splitmix64(&st) % 100), b = (unsigned)(ze_splitmix64(&st) % 100);
    if (used[a * 100 + b] || ze_corpus_has_sum(corpus, a, b)) continue;
    used[a * 100 + b] = true;
    char prompt[16], want[8];
    snprintf(prompt, sizeof prompt, "\n%u+%u=", a, b);
    ze_sum_digits(a + b, corpus->reversed_sums, want, sizeof want);
    char *text = NULL;
    double secs;
    size_t peak;
    zck_status s = ze_generate(c, zr, true, prompt, 4, &text, &secs, &peak);
    if (s != ZCK_OK) return s;
    char *nl = strchr(text, '\n');
    if (nl) *nl = '\0';
    for (char *p = text; *p; p++)
      if ((unsigned char)*p < 32 || (unsigned char)*p > 126) *p = '?';
    if (!strcmp(text, want)) ++*right;
    if (i < 8 && o < cap) {
      char *ex = examples + o;
      o += (size_t)snprintf(ex, cap - o, "%s%s%s", i ? " " : "", prompt + 1, text);
      if (corpus->reversed_sums) ze_sums_in_usual_order(ex); /* shown as people write sums */
    }
    if (o >= cap) o = cap;
    free(text);
    i++;
  }
  return ZCK_OK;
}
