/* gpt2.c: the parameter table, activations, and forward/backward of GPT-2 (see gpt2.h).
 * Kernels follow llm.c's train_gpt2.c, adapted to HF layouts (Conv1D weights [in, out],
 * per-layer parameter order) and with an O(T) softmax backward. */
#include "gpt2.h"
#include "gpt2_kernels.h"

#include "rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef ZE_HAVE_BLAS
#include <cblas.h>
#include <pthread.h>
#endif

// ---- parameter table

bool ze_gpt2_config_valid(const ze_gpt2_config *c, char *why, size_t cap) { return zck_gpt2_config_valid(c, why, cap); }
size_t ze_gpt2_n_tensors(const ze_gpt2_config *c) { return zck_gpt2_n_tensors(c); }
size_t ze_gpt2_numel(const ze_gpt2_config *c) { return zck_gpt2_params_walk(c, NULL, NULL, NULL); }
void ze_gpt2_param_specs(const ze_gpt2_config *c, ze_param_spec *specs) { zck_gpt2_params_walk(c, specs, NULL, NULL); }
void ze_gpt2_carve(const ze_gpt2_config *c, float *flat, ze_gpt2_params *p) {
  memset(p, 0, sizeof *p);
  zck_gpt2_params_walk(c, NULL, flat, p);
}
int ze_gpt2_module_tensors(const ze_gpt2_config *c, int module, int *spec_index) {
  return zck_gpt2_module_tensors(c, module, spec_index);
}
float **ze_gpt2_param_slot(const ze_gpt2_config *c, ze_gpt2_params *p, int spec) {
  return zck_gpt2_param_slot(c, p, spec);
}

size_t ze_gpt2_module_numel(const ze_gpt2_config *c, int module) {
  size_t n = ze_gpt2_n_tensors(c), total = 0;
  ze_param_spec *specs = calloc(n, sizeof *specs);
  if (!specs) abort();
  ze_gpt2_param_specs(c, specs);
  int idx[12];
  int k = ze_gpt2_module_tensors(c, module, idx);
  for (int i = 0; i < k; i++) total += specs[idx[i]].numel;
  free(specs);
  return total;
}

void ze_gpt2_carve_module(const ze_gpt2_config *c, int module, float *buf, ze_gpt2_params *p) {
  size_t n = ze_gpt2_n_tensors(c);
  ze_param_spec *specs = calloc(n, sizeof *specs);
  if (!specs) abort();
  ze_gpt2_param_specs(c, specs);
  int idx[12];
  int k = ze_gpt2_module_tensors(c, module, idx);
  size_t off = 0;
  for (int i = 0; i < k; i++) {
    *ze_gpt2_param_slot(c, p, idx[i]) = buf + off;
    off += specs[idx[i]].numel;
  }
  free(specs);
}

void ze_gpt2_init(const ze_gpt2_config *c, float *flat, uint64_t seed) {
  size_t n = ze_gpt2_n_tensors(c);
  ze_param_spec *specs = calloc(n, sizeof *specs);
  if (!specs) abort();
  ze_gpt2_param_specs(c, specs);
  uint64_t state = seed ^ 0x6770743269696e69ull; /* "gpt2iini" */
  double proj_std = 0.02 / sqrt(2.0 * c->n_layer);
  for (size_t i = 0; i < n; i++) {
    const ze_param_spec *s = &specs[i];
    float *x = flat + s->offset;
    const char *tail = strrchr(s->name, '.');
    bool is_bias = !strcmp(tail, ".bias");
    bool is_ln = strstr(s->name, ".ln_") != NULL;
    if (is_ln && !is_bias) {
      for (size_t j = 0; j < s->numel; j++) x[j] = 1.0f;
    } else if (is_bias) {
      memset(x, 0, s->numel * sizeof *x);
    } else {
      double std = strstr(s->name, "c_proj.weight") ? proj_std : 0.02;
      for (size_t j = 0; j < s->numel; j++) x[j] = (float)(std * ze_normal(&state));
    }
  }
  free(specs);
}

// ---- activations (the layout of gpt2_layout.h)

typedef zck_gpt2_block_acts ze_block_acts;
typedef zck_gpt2_acts ze_acts;

struct ze_gpt2_ws {
  int B, T;
  size_t n;                    /* floats per ze_acts buffer */
  float *mem, *gmem;
  ze_acts a, g;                /* activations and their gradients */
};

ze_gpt2_ws *ze_gpt2_ws_new(const ze_gpt2_config *c, int B, int T) {
  ze_gpt2_ws *ws = calloc(1, sizeof *ws);
  if (!ws) return NULL;
  ws->B = B;
  ws->T = T;
  ws->n = zck_gpt2_acts_walk(c, B, T, NULL, NULL);
  ws->mem = calloc(ws->n, sizeof(float));
  ws->gmem = calloc(ws->n, sizeof(float));
  if (!ws->mem || !ws->gmem) {
    ze_gpt2_ws_free(ws);
    return NULL;
  }
  zck_gpt2_acts_walk(c, B, T, ws->mem, &ws->a);
  zck_gpt2_acts_walk(c, B, T, ws->gmem, &ws->g);
  return ws;
}

void ze_gpt2_ws_free(ze_gpt2_ws *ws) {
  if (!ws) return;
  free(ws->mem);
  free(ws->gmem);
  free(ws);
}

size_t ze_gpt2_ws_bytes(const ze_gpt2_ws *ws) { return 2 * ws->n * sizeof(float); }
const float *ze_gpt2_logits(const ze_gpt2_ws *ws) { return ws->a.logits; }
const float *ze_gpt2_losses(const ze_gpt2_ws *ws) { return ws->a.losses; }

// ---- kernels

/* Dot product with eight running sums in a fixed pattern: the same bits at every
 * optimisation level, and the lanes map onto SIMD registers at -O3. */
static inline float dot(const float *restrict a, const float *restrict b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; k++) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

/* y[j] += a * x[j] */
static inline void axpy(float *restrict y, float a, const float *restrict x, int n) {
  for (int j = 0; j < n; j++) y[j] += a * x[j];
}

/* The matmuls go to OpenBLAS when the build found it (ZE_HAVE_BLAS), else to the loops
 * below; ZCKPT_TRAIN_NO_BLAS=1 picks the loops at run time (the bench's "before" and the
 * tests that compare both). OpenBLAS runs on one thread: the engine already runs one rank
 * per core (a thread or a process each), and OpenBLAS's own pool on top would put W x cores
 * busy-waiting threads on the same cores, slowing every rank. */
#ifdef ZE_HAVE_BLAS
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static bool blas_on;

static void blas_init(void) {
  const char *e = getenv("ZCKPT_TRAIN_NO_BLAS");
  blas_on = !(e && *e && strcmp(e, "0"));
  if (blas_on) openblas_set_num_threads(1);
}

static bool use_blas(void) {
  pthread_once(&blas_once, blas_init);
  return blas_on;
}
#else
static bool use_blas(void) { return false; }
#endif

const char *ze_gpt2_matmul_backend(void) { return use_blas() ? "OpenBLAS" : "loops"; }

/* C (m, n) = beta * C + A (m, k) @ B (k, n), row-major with leading dimensions; ta / tb:
 * A / B are stored transposed. Only called when use_blas(). */
static void gemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b, int ldb, float beta,
                 float *c, int ldc) {
#ifdef ZE_HAVE_BLAS
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b,
              ldb, beta, c, ldc);
#else
  (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)beta, (void)c,
      (void)ldc;
  abort();
#endif
}

void ze__gpt2_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int BT, int T, int C) {
  for (int bt = 0; bt < BT; bt++) {
    const float *e = wte + (size_t)inp[bt] * C, *p = wpe + (size_t)(bt % T) * C;
    float *o = out + (size_t)bt * C;
    for (int i = 0; i < C; i++) o[i] = e[i] + p[i];
  }
}

void ze__gpt2_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int BT, int T, int C) {
  for (int bt = 0; bt < BT; bt++) {
    const float *d = dout + (size_t)bt * C;
    float *de = dwte + (size_t)inp[bt] * C, *dp = dwpe + (size_t)(bt % T) * C;
    for (int i = 0; i < C; i++) {
      de[i] += d[i];
      dp[i] += d[i];
    }
  }
}

void ze__gpt2_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                                int BT, int C) {
  for (int bt = 0; bt < BT; bt++) {
    const float *x = inp + (size_t)bt * C;
    float m = 0.0f;
    for (int i = 0; i < C; i++) m += x[i];
    m /= (float)C;
    float v = 0.0f;
    for (int i = 0; i < C; i++) {
      float d = x[i] - m;
      v += d * d;
    }
    v /= (float)C;
    float s = 1.0f / sqrtf(v + ZE_LN_EPS);
    float *o = out + (size_t)bt * C;
    for (int i = 0; i < C; i++) o[i] = (s * (x[i] - m)) * w[i] + b[i];
    mean[bt] = m;
    rstd[bt] = s;
  }
}

void ze__gpt2_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                                 const float *mean, const float *rstd, int BT, int C) {
  for (int bt = 0; bt < BT; bt++) {
    const float *d = dout + (size_t)bt * C, *x = inp + (size_t)bt * C;
    float *dx = dinp + (size_t)bt * C;
    float m = mean[bt], s = rstd[bt];
    float dnorm_mean = 0.0f, dnorm_norm_mean = 0.0f;
    for (int i = 0; i < C; i++) {
      float norm = (x[i] - m) * s;
      float dnorm = w[i] * d[i];
      dnorm_mean += dnorm;
      dnorm_norm_mean += dnorm * norm;
    }
    dnorm_mean /= (float)C;
    dnorm_norm_mean /= (float)C;
    for (int i = 0; i < C; i++) {
      float norm = (x[i] - m) * s;
      float dnorm = w[i] * d[i];
      db[i] += d[i];
      dw[i] += norm * d[i];
      dx[i] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
    }
  }
}

/* HF Conv1D: out (BT, OC) = inp (BT, IC) @ w (IC, OC) + b (OC). */
void ze__gpt2_conv1d_forward(float *out, const float *inp, const float *w, const float *b, int BT, int IC, int OC) {
  if (use_blas()) {
    for (int bt = 0; bt < BT; bt++)
      for (int j = 0; j < OC; j++) out[(size_t)bt * OC + j] = b ? b[j] : 0.0f;
    gemm(false, false, BT, OC, IC, inp, IC, w, OC, 1.0f, out, OC);
    return;
  }
  for (int bt = 0; bt < BT; bt++) {
    const float *x = inp + (size_t)bt * IC;
    float *o = out + (size_t)bt * OC;
    for (int j = 0; j < OC; j++) o[j] = b ? b[j] : 0.0f;
    for (int i = 0; i < IC; i++) axpy(o, x[i], w + (size_t)i * OC, OC);
  }
}

void ze__gpt2_conv1d_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                              int BT, int IC, int OC) {
  if (use_blas()) {
    gemm(false, true, BT, IC, OC, dout, OC, w, OC, 1.0f, dinp, IC);  /* dinp += dout @ w^T */
    gemm(true, false, IC, OC, BT, inp, IC, dout, OC, 1.0f, dw, OC);  /* dw += inp^T @ dout */
    if (db)
      for (int bt = 0; bt < BT; bt++) {
        const float *d = dout + (size_t)bt * OC;
        for (int j = 0; j < OC; j++) db[j] += d[j];
      }
    return;
  }
  for (int bt = 0; bt < BT; bt++) {
    const float *d = dout + (size_t)bt * OC, *x = inp + (size_t)bt * IC;
    float *dx = dinp + (size_t)bt * IC;
    for (int i = 0; i < IC; i++) dx[i] += dot(d, w + (size_t)i * OC, OC);
    for (int i = 0; i < IC; i++) axpy(dw + (size_t)i * OC, x[i], d, OC);
    if (db)
      for (int j = 0; j < OC; j++) db[j] += d[j];
  }
}

/* lm_head tied to wte (V, C), nn.Linear layout: logits (BT, V) = inp (BT, C) @ wte^T. */
void ze__gpt2_lm_head_forward(float *logits, const float *inp, const float *wte, int BT, int C, int V) {
  if (use_blas()) {
    gemm(false, true, BT, V, C, inp, C, wte, C, 0.0f, logits, V);
    return;
  }
  for (int bt = 0; bt < BT; bt++) {
    const float *x = inp + (size_t)bt * C;
    float *o = logits + (size_t)bt * V;
    for (int v = 0; v < V; v++) o[v] = dot(x, wte + (size_t)v * C, C);
  }
}

void ze__gpt2_lm_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp, const float *wte,
                               int BT, int C, int V) {
  if (use_blas()) {
    gemm(false, false, BT, C, V, dlogits, V, wte, C, 1.0f, dinp, C);  /* dinp += dlogits @ wte */
    gemm(true, false, V, C, BT, dlogits, V, inp, C, 1.0f, dwte, C);   /* dwte += dlogits^T @ inp */
    return;
  }
  for (int bt = 0; bt < BT; bt++) {
    const float *d = dlogits + (size_t)bt * V, *x = inp + (size_t)bt * C;
    float *dx = dinp + (size_t)bt * C;
    for (int v = 0; v < V; v++) {
      axpy(dx, d[v], wte + (size_t)v * C, C);
      axpy(dwte + (size_t)v * C, d[v], x, C);
    }
  }
}

/* Causal self-attention. qkv (B, T, 3C) = [q | k | v], head h uses dims h*hs .. (h+1)*hs.
 * att (B, H, T, T) keeps the probabilities; out (B, T, C). */
void ze__gpt2_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H) {
  int C3 = 3 * C, hs = C / H;
  float scale = 1.0f / sqrtf((float)hs);
  if (use_blas()) {
    /* per (b, h): scores = Q K^T over all T x T (the masked half is computed and dropped),
     * causal softmax row by row, out = att V */
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++) {
        const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        float *a = att + ((size_t)b * H + h) * T * T;
        gemm(false, true, T, T, hs, q, C3, k, C3, 0.0f, a, T);
        for (int t = 0; t < T; t++) {
          float *r = a + (size_t)t * T, maxv = -INFINITY, sum = 0.0f;
          for (int t2 = 0; t2 <= t; t2++) {
            r[t2] *= scale;
            if (r[t2] > maxv) maxv = r[t2];
          }
          for (int t2 = 0; t2 <= t; t2++) {
            r[t2] = expf(r[t2] - maxv);
            sum += r[t2];
          }
          float inv = 1.0f / sum;
          for (int t2 = 0; t2 < T; t2++) r[t2] = t2 <= t ? r[t2] * inv : 0.0f;
        }
        gemm(false, false, T, hs, T, a, T, v, C3, 0.0f, out + (size_t)b * T * C + h * hs, C);
      }
    return;
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++) {
        const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
        float *a = att + (((size_t)b * H + h) * T + t) * T;
        float maxv = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *k = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
          float s = dot(q, k, hs) * scale;
          a[t2] = s;
          if (s > maxv) maxv = s;
        }
        float sum = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          float e = expf(a[t2] - maxv);
          a[t2] = e;
          sum += e;
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
        float *o = out + ((size_t)b * T + t) * C + h * hs;
        for (int i = 0; i < hs; i++) o[i] = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) {
          const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
          float p = a[t2];
          for (int i = 0; i < hs; i++) o[i] += p * v[i];
        }
      }
}

/* datt_tmp: T floats of scratch. */
void ze__gpt2_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, float *datt, int B,
                                 int T, int C, int H) {
  int C3 = 3 * C, hs = C / H;
  float scale = 1.0f / sqrtf((float)hs);
  float *scr = use_blas() ? malloc((size_t)T * T * sizeof(float)) : NULL; /* none: the loops */
  if (scr) {
    /* per (b, h): dS = dO V^T, dV += att^T dO, dpre = att * (dS - rowsum(att * dS)) * scale
     * (zero above the diagonal), dQ += dpre K, dK += dpre^T Q */
    for (int b = 0; b < B; b++)
      for (int h = 0; h < H; h++) {
        const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C, *dv = dq + 2 * C;
        const float *a = att + ((size_t)b * H + h) * T * T, *d = dout + (size_t)b * T * C + h * hs;
        gemm(false, true, T, T, hs, d, C, v, C3, 0.0f, scr, T);
        gemm(true, false, T, hs, T, a, T, d, C, 1.0f, dv, C3);
        for (int t = 0; t < T; t++) {
          const float *ar = a + (size_t)t * T;
          float *sr = scr + (size_t)t * T, dot = 0.0f;
          for (int t2 = 0; t2 <= t; t2++) dot += ar[t2] * sr[t2];
          for (int t2 = 0; t2 < T; t2++) sr[t2] = t2 <= t ? ar[t2] * (sr[t2] - dot) * scale : 0.0f;
        }
        gemm(false, false, T, hs, T, scr, T, k, C3, 1.0f, dq, C3);
        gemm(true, false, T, hs, T, scr, T, q, C3, 1.0f, dk, C3);
      }
    free(scr);
    return;
  }
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < H; h++) {
        const float *a = att + (((size_t)b * H + h) * T + t) * T;
        const float *d = dout + ((size_t)b * T + t) * C + h * hs;
        const float *q = qkv + ((size_t)b * T + t) * C3 + h * hs;
        float *dq = dqkv + ((size_t)b * T + t) * C3 + h * hs;
        /* out = sum_t2 att[t2] v[t2] */
        for (int t2 = 0; t2 <= t; t2++) {
          const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
          float *dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * C + h * hs;
          float s = 0.0f;
          for (int i = 0; i < hs; i++) {
            s += v[i] * d[i];
            dv[i] += a[t2] * d[i];
          }
          datt[t2] = s;
        }
        /* softmax: dpre[t2] = att[t2] * (datt[t2] - sum_t3 att[t3] datt[t3]) */
        float dot = 0.0f;
        for (int t2 = 0; t2 <= t; t2++) dot += a[t2] * datt[t2];
        for (int t2 = 0; t2 <= t; t2++) {
          float dpre = a[t2] * (datt[t2] - dot) * scale;
          const float *k = qkv + ((size_t)b * T + t2) * C3 + C + h * hs;
          float *dk = dqkv + ((size_t)b * T + t2) * C3 + C + h * hs;
          for (int i = 0; i < hs; i++) {
            dq[i] += k[i] * dpre;
            dk[i] += q[i] * dpre;
          }
        }
      }
}

#define ZE_GELU_S 0.7978845608028654f /* sqrt(2/pi) */

void ze__gpt2_gelu_forward(float *out, const float *inp, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    out[i] = 0.5f * x * (1.0f + tanhf(ZE_GELU_S * (x + cube)));
  }
}

void ze__gpt2_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    float x = inp[i];
    float cube = 0.044715f * x * x * x;
    float arg = ZE_GELU_S * (x + cube);
    float th = tanhf(arg);
    float sech2 = 1.0f - th * th;
    float local = 0.5f * (1.0f + th) + x * 0.5f * sech2 * ZE_GELU_S * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += local * dout[i];
  }
}

void ze__gpt2_residual_forward(float *out, const float *a, const float *b, size_t n) {
  for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void ze__gpt2_residual_backward(float *da, float *db, const float *dout, size_t n) {
  for (size_t i = 0; i < n; i++) {
    da[i] += dout[i];
    db[i] += dout[i];
  }
}

/* probs = softmax(logits), losses = -log probs[target]. */
void ze__gpt2_softmax_xent_forward(float *probs, float *losses, const float *logits, const int *targets, int BT,
                                   int V) {
  for (int bt = 0; bt < BT; bt++) {
    const float *z = logits + (size_t)bt * V;
    float *p = probs + (size_t)bt * V;
    float maxv = -INFINITY;
    for (int v = 0; v < V; v++)
      if (z[v] > maxv) maxv = z[v];
    float sum = 0.0f;
    for (int v = 0; v < V; v++) {
      p[v] = expf(z[v] - maxv);
      sum += p[v];
    }
    float inv = 1.0f / sum;
    for (int v = 0; v < V; v++) p[v] *= inv;
    if (targets) losses[bt] = -logf(p[targets[bt]]);
  }
}

// ---- forward / backward, one module at a time

float ze_gpt2_forward(const ze_gpt2_config *c, const ze_gpt2_params *w, ze_gpt2_ws *ws, const int *inputs,
                      const int *targets, int B, int T) {
  ze_gpt2_whole whole;
  ze_gpt2_hooks h = ze_gpt2_whole_hooks(&whole, w, NULL);
  float loss = 0.0f;
  ze_gpt2_forward_hooked(c, &h, ws, inputs, targets, B, T, &loss);
  return loss;
}

void ze_gpt2_backward(const ze_gpt2_config *c, const ze_gpt2_params *w, const ze_gpt2_params *g, ze_gpt2_ws *ws,
                      const int *inputs, const int *targets, int B, int T, float scale) {
  ze_gpt2_whole whole;
  ze_gpt2_hooks h = ze_gpt2_whole_hooks(&whole, w, g);
  ze_gpt2_backward_hooked(c, &h, ws, inputs, targets, B, T, scale);
}

static bool whole_fetch(void *ctx, int module, ze_gpt2_params *p) {
  (void)module;
  *p = *((ze_gpt2_whole *)ctx)->w;
  return true;
}

static bool whole_grads(void *ctx, int module, ze_gpt2_params *p) {
  (void)module;
  *p = *((ze_gpt2_whole *)ctx)->g;
  return true;
}

ze_gpt2_hooks ze_gpt2_whole_hooks(ze_gpt2_whole *whole, const ze_gpt2_params *w, const ze_gpt2_params *g) {
  whole->w = w;
  whole->g = g;
  return (ze_gpt2_hooks){whole, whole_fetch, NULL, whole_grads, NULL};
}

bool ze_gpt2_forward_hooked(const ze_gpt2_config *c, const ze_gpt2_hooks *k, ze_gpt2_ws *ws, const int *inputs,
                            const int *targets, int B, int T, float *loss) {
  int C = c->n_embd, V = c->vocab_size, H = c->n_head, BT = B * T, L = c->n_layer;
  ze_acts *a = &ws->a;
  ze_gpt2_params w;
  memset(&w, 0, sizeof w);
  *loss = 0.0f;
  /* a smaller batch reuses the buffers with its own strides */
  if (B < 1 || T < 1 || B > ws->B || T > ws->T) abort();
  zck_gpt2_acts_walk(c, B, T, ws->mem, a);
  if (!k->fetch(k->ctx, -1, &w)) return false;
  ze__gpt2_encoder_forward(a->encoded, inputs, w.wte, w.wpe, BT, T, C);
  if (k->release) k->release(k->ctx, -1);
  const float *x = a->encoded;
  for (int l = 0; l < L; l++) {
    if (!k->fetch(k->ctx, l, &w)) return false;
    const ze_block_params *p = &w.h[l];
    ze_block_acts *h = &a->h[l];
    ze__gpt2_layernorm_forward(h->ln_1, h->ln_1_mean, h->ln_1_rstd, x, p->ln_1_w, p->ln_1_b, BT, C);
    ze__gpt2_conv1d_forward(h->qkv, h->ln_1, p->attn_w, p->attn_b, BT, C, 3 * C);
    ze__gpt2_attention_forward(h->atty, h->att, h->qkv, B, T, C, H);
    ze__gpt2_conv1d_forward(h->attproj, h->atty, p->attn_proj_w, p->attn_proj_b, BT, C, C);
    ze__gpt2_residual_forward(h->res2, x, h->attproj, (size_t)BT * C);
    ze__gpt2_layernorm_forward(h->ln_2, h->ln_2_mean, h->ln_2_rstd, h->res2, p->ln_2_w, p->ln_2_b, BT, C);
    ze__gpt2_conv1d_forward(h->fch, h->ln_2, p->fc_w, p->fc_b, BT, C, 4 * C);
    ze__gpt2_gelu_forward(h->fch_gelu, h->fch, (size_t)BT * 4 * C);
    ze__gpt2_conv1d_forward(h->fcproj, h->fch_gelu, p->fc_proj_w, p->fc_proj_b, BT, 4 * C, C);
    ze__gpt2_residual_forward(h->res3, h->res2, h->fcproj, (size_t)BT * C);
    if (k->release) k->release(k->ctx, l);
    x = h->res3;
  }
  if (!k->fetch(k->ctx, L, &w)) return false;
  ze__gpt2_layernorm_forward(a->ln_f, a->ln_f_mean, a->ln_f_rstd, x, w.ln_f_w, w.ln_f_b, BT, C);
  ze__gpt2_lm_head_forward(a->logits, a->ln_f, w.wte, BT, C, V);
  if (k->release) k->release(k->ctx, L);
  if (!targets) return true;
  ze__gpt2_softmax_xent_forward(a->probs, a->losses, a->logits, targets, BT, V);
  double sum = 0.0;
  for (int bt = 0; bt < BT; bt++) sum += a->losses[bt];
  *loss = (float)(sum / BT);
  return true;
}

bool ze_gpt2_backward_hooked(const ze_gpt2_config *c, const ze_gpt2_hooks *k, ze_gpt2_ws *ws, const int *inputs,
                             const int *targets, int B, int T, float scale) {
  int C = c->n_embd, V = c->vocab_size, H = c->n_head, BT = B * T, L = c->n_layer;
  ze_acts *a = &ws->a, *d = &ws->g;
  ze_gpt2_params w, g;
  memset(&w, 0, sizeof w);
  memset(&g, 0, sizeof g);
  if (B < 1 || T < 1 || B > ws->B || T > ws->T) abort();
  zck_gpt2_acts_walk(c, B, T, ws->gmem, d);
  memset(ws->gmem, 0, ws->n * sizeof(float));
  /* dlogits = (probs - onehot) * dloss, dloss = scale / BT for every position */
  float dloss = scale / (float)BT;
  for (int bt = 0; bt < BT; bt++) {
    const float *p = a->probs + (size_t)bt * V;
    float *dz = d->logits + (size_t)bt * V;
    for (int v = 0; v < V; v++) dz[v] = (p[v] - (v == targets[bt] ? 1.0f : 0.0f)) * dloss;
  }
  /* final module: lm_head (tied wte) and ln_f */
  if (!k->fetch(k->ctx, L, &w) || !k->grads(k->ctx, L, &g)) return false;
  ze__gpt2_lm_head_backward(d->ln_f, g.wte, d->logits, a->ln_f, w.wte, BT, C, V);
  const float *xl = L ? a->h[L - 1].res3 : a->encoded;
  float *dxl = L ? d->h[L - 1].res3 : d->encoded;
  ze__gpt2_layernorm_backward(dxl, g.ln_f_w, g.ln_f_b, d->ln_f, xl, w.ln_f_w, a->ln_f_mean, a->ln_f_rstd, BT, C);
  if (k->release) k->release(k->ctx, L);
  if (k->grads_done && !k->grads_done(k->ctx, L)) return false;
  float *datt = d->losses; /* (B, T) >= T floats of scratch no longer needed */
  for (int l = L - 1; l >= 0; l--) {
    if (!k->fetch(k->ctx, l, &w) || !k->grads(k->ctx, l, &g)) return false;
    const ze_block_params *p = &w.h[l];
    const ze_block_params *gp = &g.h[l];
    ze_block_acts *h = &a->h[l], *dh = &d->h[l];
    const float *x = l ? a->h[l - 1].res3 : a->encoded;
    float *dx = l ? d->h[l - 1].res3 : d->encoded;
    ze__gpt2_residual_backward(dh->res2, dh->fcproj, dh->res3, (size_t)BT * C);
    ze__gpt2_conv1d_backward(dh->fch_gelu, gp->fc_proj_w, gp->fc_proj_b, dh->fcproj, h->fch_gelu, p->fc_proj_w, BT,
                             4 * C, C);
    ze__gpt2_gelu_backward(dh->fch, h->fch, dh->fch_gelu, (size_t)BT * 4 * C);
    ze__gpt2_conv1d_backward(dh->ln_2, gp->fc_w, gp->fc_b, dh->fch, h->ln_2, p->fc_w, BT, C, 4 * C);
    ze__gpt2_layernorm_backward(dh->res2, gp->ln_2_w, gp->ln_2_b, dh->ln_2, h->res2, p->ln_2_w, h->ln_2_mean,
                                h->ln_2_rstd, BT, C);
    ze__gpt2_residual_backward(dx, dh->attproj, dh->res2, (size_t)BT * C);
    ze__gpt2_conv1d_backward(dh->atty, gp->attn_proj_w, gp->attn_proj_b, dh->attproj, h->atty, p->attn_proj_w, BT,
                             C, C);
    ze__gpt2_attention_backward(dh->qkv, dh->atty, h->qkv, h->att, datt, B, T, C, H);
    ze__gpt2_conv1d_backward(dh->ln_1, gp->attn_w, gp->attn_b, dh->qkv, h->ln_1, p->attn_w, BT, C, 3 * C);
    ze__gpt2_layernorm_backward(dx, gp->ln_1_w, gp->ln_1_b, dh->ln_1, x, p->ln_1_w, h->ln_1_mean, h->ln_1_rstd, BT, C);
    if (k->release) k->release(k->ctx, l);
    if (k->grads_done && !k->grads_done(k->ctx, l)) return false;
  }
  /* embeddings: no weights needed, only their gradients */
  if (!k->grads(k->ctx, -1, &g)) return false;
  ze__gpt2_encoder_backward(g.wte, g.wpe, d->encoded, inputs, BT, T, C);
  if (k->grads_done && !k->grads_done(k->ctx, -1)) return false;
  return true;
}

// ---- inference, module by module

bool ze_gpt2_infer_last(const ze_gpt2_config *c, const ze_fetch *f, ze_gpt2_ws *ws, const int *tokens, int n,
                        float *logits) {
  int C = c->n_embd, V = c->vocab_size, H = c->n_head;
  if (n < 1 || n > ws->T || n > c->max_seq_len) return false;
  ze_acts *a = &ws->a;
  zck_gpt2_acts_walk(c, 1, n, ws->mem, a);
  ze_gpt2_params p;
  memset(&p, 0, sizeof p);
  if (!f->fetch(f->ctx, -1, &p)) return false;
  ze__gpt2_encoder_forward(a->encoded, tokens, p.wte, p.wpe, n, n, C);
  if (f->release) f->release(f->ctx, -1);
  const float *x = a->encoded;
  for (int l = 0; l < c->n_layer; l++) {
    if (!f->fetch(f->ctx, l, &p)) return false;
    const ze_block_params *b = &p.h[l];
    ze_block_acts *h = &a->h[l];
    ze__gpt2_layernorm_forward(h->ln_1, h->ln_1_mean, h->ln_1_rstd, x, b->ln_1_w, b->ln_1_b, n, C);
    ze__gpt2_conv1d_forward(h->qkv, h->ln_1, b->attn_w, b->attn_b, n, C, 3 * C);
    ze__gpt2_attention_forward(h->atty, h->att, h->qkv, 1, n, C, H);
    ze__gpt2_conv1d_forward(h->attproj, h->atty, b->attn_proj_w, b->attn_proj_b, n, C, C);
    ze__gpt2_residual_forward(h->res2, x, h->attproj, (size_t)n * C);
    ze__gpt2_layernorm_forward(h->ln_2, h->ln_2_mean, h->ln_2_rstd, h->res2, b->ln_2_w, b->ln_2_b, n, C);
    ze__gpt2_conv1d_forward(h->fch, h->ln_2, b->fc_w, b->fc_b, n, C, 4 * C);
    ze__gpt2_gelu_forward(h->fch_gelu, h->fch, (size_t)n * 4 * C);
    ze__gpt2_conv1d_forward(h->fcproj, h->fch_gelu, b->fc_proj_w, b->fc_proj_b, n, 4 * C, C);
    ze__gpt2_residual_forward(h->res3, h->res2, h->fcproj, (size_t)n * C);
    if (f->release) f->release(f->ctx, l);
    x = h->res3;
  }
  if (!f->fetch(f->ctx, c->n_layer, &p)) return false;
  ze__gpt2_layernorm_forward(a->ln_f, a->ln_f_mean, a->ln_f_rstd, x, p.ln_f_w, p.ln_f_b, n, C);
  ze__gpt2_lm_head_forward(logits, a->ln_f + (size_t)(n - 1) * C, p.wte, 1, C, V);
  if (f->release) f->release(f->ctx, c->n_layer);
  return true;
}
