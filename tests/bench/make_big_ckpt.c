/* make_big_ckpt.c: writes a large synthetic DeepSpeed ZeRO checkpoint for benchmarks.
 *
 * usage: make_big_ckpt OUT_ROOT [--params N] [--world W] [--stage S] [--threads T] [--tensors K]
 *
 * --tensors K: instead, K small tensors shaped like a mixture-of-experts model (expert
 * matrices of a few dozen elements, biases, norms), to measure cost per tensor rather than
 * per byte: 100k tensors make a checkpoint of about 14 MB at ZeRO-3.
 * A GPT-2-shaped model (HF names; hidden size C, vocab 50304, L layers chosen so the
 * total is about N params), two param groups (decay / no-decay), bf16, fp32 master +
 * exp_avg + exp_avg_sq filled with deterministic pseudo-random values, written with
 * zckpt's own DeepSpeed writer (so DeepSpeed's zero_to_fp32.py reads it like its own).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepspeed/deepspeed.h"
#include "plan.h"

typedef struct gen_ctx {
  uint32_t param;
  int kind; /* 0 fp32, 1 exp_avg, 2 exp_avg_sq */
} gen_ctx;

static inline uint64_t mix(uint64_t x) {
  x ^= x >> 33; x *= 0xff51afd7ed558ccdULL; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ULL; x ^= x >> 33;
  return x;
}

static zck_status gen_read(void *vctx, void *dst, uint64_t off, uint64_t count) {
  const gen_ctx *c = vctx;
  float *f = dst;
  uint64_t seed = ((uint64_t)c->param << 42) ^ ((uint64_t)c->kind << 60);
  for (uint64_t i = 0; i < count; i++) {
    float u = (float)(mix(seed + off + i) >> 40) * (1.0f / 16777216.0f) - 0.5f; /* [-0.5, 0.5) */
    f[i] = c->kind == 2 ? u * u * 1e-4f : c->kind == 1 ? u * 1e-3f : u * 0.04f;
  }
  return ZCK_OK;
}

static int die(zck_status s) {
  fprintf(stderr, "make_big_ckpt: error: %s\n", zck_last_error());
  return (int)s;
}

#define TRY(x) do { zck_status s_ = (x); if (s_ != ZCK_OK) return die(s_); } while (0)

int main(int argc, char **argv) {
  static const char usage[] =
    "usage: make_big_ckpt OUT_ROOT [--params N] [--world W] [--stage S] [--threads T] [--tensors K]\n"
    "Writes a synthetic GPT-2-shaped DeepSpeed ZeRO checkpoint of about N parameters (default\n"
    "1e9: some 12 GB) to OUT_ROOT, over W ranks (default 8) at ZeRO stage S (default 3);\n"
    "--tensors K: K small MoE-shaped tensors instead (cost per tensor, not per byte).\n";
  if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) { fputs(usage, stdout); return 0; }
  /* an option where OUT_ROOT belongs (a typo, or options first) would write gigabytes into
   * a folder named after it */
  if (argc < 2 || argv[1][0] == '-' || argc % 2) { fputs(usage, stderr); return 2; }
  double target = 1e9;
  long tensors = 0;
  uint32_t world = 8, threads = 0;
  int stage = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--params")) target = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--world")) world = (uint32_t)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--stage")) stage = atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--threads")) threads = (uint32_t)atoi(argv[i + 1]);
    else if (!strcmp(argv[i], "--tensors")) tensors = atol(argv[i + 1]);
    else { fprintf(stderr, "make_big_ckpt: unknown option '%s'\n%s", argv[i], usage); return 2; }
  }
  zck_model *m = zck_model_new();
  uint32_t decay, no_decay, idx;
  TRY(zck_model_add_group(m, &decay));
  TRY(zck_model_add_group(m, &no_decay));
  static const double betas[2] = {0.9, 0.999};
  for (uint32_t g = 0; g < 2; g++) {
    TRY(zck_model_group_set_float(m, g, "lr", 1e-4));
    TRY(zck_model_group_set_floats(m, g, "betas", betas, 2));
    TRY(zck_model_group_set_float(m, g, "eps", 1e-8));
    TRY(zck_model_group_set_float(m, g, "weight_decay", g == 0 ? 0.1 : 0.0));
    TRY(zck_model_group_set_bool(m, g, "amsgrad", false));
  }
#define ADD(name, nd, group, ...) do { int64_t sh[] = {__VA_ARGS__}; \
    TRY(zck_model_add_param(m, name, nd, sh, ZCK_BF16, &idx)); TRY(zck_model_group_add_param(m, group, idx)); } while (0)
  char name[256];
  int64_t C = 0;
  int L = 0;
  if (tensors > 0) {
    /* MoE-shaped: per layer a norm, a router, then experts of three small matrices each;
     * the count is cut at exactly `tensors`. Shapes vary so partitions split params. */
    long n = 0;
    for (int l = 0; n < tensors; l++) {
#define T_ADD(nd, group, ...) do { if (n++ >= tensors) break; ADD(name, nd, group, __VA_ARGS__); } while (0)
      snprintf(name, sizeof name, "model.layers.%d.norm.weight", l);
      T_ADD(1, no_decay, 8);
      snprintf(name, sizeof name, "model.layers.%d.mlp.gate.weight", l);
      T_ADD(2, decay, 64, 2);
      for (int e = 0; e < 64 && n < tensors; e++) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w1.weight", l, e);
        T_ADD(2, decay, 3, 4);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.w2.weight", l, e);
        T_ADD(2, decay, 4, 3);
        snprintf(name, sizeof name, "model.layers.%d.mlp.experts.%d.b2.bias", l, e);
        T_ADD(1, no_decay, 1 + (e % 5));
      }
#undef T_ADD
    }
  } else {
    const int64_t V = 50304, T = 1024;
    C = target >= 5e8 ? 2048 : target >= 1e8 ? 1024 : 256;
    L = (int)fmax(1, round((target - (double)(V + T) * C) / (12.0 * C * C + 13.0 * C)));
    ADD("transformer.wte.weight", 2, decay, V, C);
    ADD("transformer.wpe.weight", 2, decay, T, C);
    for (int l = 0; l < L; l++) {
#define P(suffix, nd, group, ...) do { snprintf(name, sizeof name, "transformer.h.%d.%s", l, suffix); ADD(name, nd, group, __VA_ARGS__); } while (0)
      P("ln_1.weight", 1, no_decay, C); P("ln_1.bias", 1, no_decay, C);
      P("attn.c_attn.weight", 2, decay, C, 3 * C); P("attn.c_attn.bias", 1, no_decay, 3 * C);
      P("attn.c_proj.weight", 2, decay, C, C); P("attn.c_proj.bias", 1, no_decay, C);
      P("ln_2.weight", 1, no_decay, C); P("ln_2.bias", 1, no_decay, C);
      P("mlp.c_fc.weight", 2, decay, C, 4 * C); P("mlp.c_fc.bias", 1, no_decay, 4 * C);
      P("mlp.c_proj.weight", 2, decay, 4 * C, C); P("mlp.c_proj.bias", 1, no_decay, C);
    }
    ADD("transformer.ln_f.weight", 1, no_decay, C);
    ADD("transformer.ln_f.bias", 1, no_decay, C);
  }
  uint64_t total = 0;
  for (size_t p = 0; p < m->n_params; p++) total += m->params[p].numel;
  fprintf(stderr, "make_big_ckpt: %zu params, %llu elements (C=%lld, L=%d), ZeRO-%d over %u ranks\n", m->n_params,
          (unsigned long long)total, (long long)C, L, stage, world);

  zck_ds_write_opts o = ZCK_DS_WRITE_OPTS_INIT;
  o.stage = stage;
  o.world_size = world;
  o.lp_dtype = ZCK_BF16;
  o.global_steps = 10;
  o.step = 10;
  o.tag = "global_step10";
  o.overwrite = true;
  zck_ds_writer *w;
  TRY(zck_ds_writer_create(argv[1], m, &o, &w));
  /* sources: every param whole, generated on the fly */
  uint64_t *numel = calloc(m->n_params, sizeof *numel);
  zck_model_numels(m, numel);
  zck_layout *whole;
  TRY(zck_layout_whole(m->n_params, numel, NULL, m->n_params, &whole));
  gen_ctx *ctx = calloc(3 * m->n_params, sizeof *ctx);
  zck_store *src = calloc(3 * m->n_params, sizeof *src);
  zck_exec_job jobs[4];
  zck_plan *plans[4] = {0};
  size_t nj = 0;
  for (int kind = 0; kind < 3; kind++) {
    for (size_t p = 0; p < m->n_params; p++) {
      ctx[kind * m->n_params + p] = (gen_ctx){(uint32_t)p, kind};
      src[kind * m->n_params + p] = zck_store_callback(gen_read, NULL, &ctx[kind * m->n_params + p], ZCK_F32, numel[p], "generator");
    }
    zck_ds_view dst;
    TRY(zck_ds_writer_get(w, (zck_ds_part)(ZCK_DS_FP32 + kind), &dst));
    TRY(zck_plan_build(whole, dst.layout, NULL, &plans[nj]));
    jobs[nj] = (zck_exec_job){plans[nj], src + kind * m->n_params, dst.stores, NULL};
    nj++;
  }
  zck_ds_view lp;
  if (zck_ds_writer_get(w, ZCK_DS_LP, &lp) == ZCK_OK) { /* stage 1/2 16-bit module weights */
    zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
    TRY(zck_plan_build(whole, lp.layout, &po, &plans[nj]));
    jobs[nj] = (zck_exec_job){plans[nj], src, lp.stores, NULL};
    nj++;
  }
  zck_clear_error();
  zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
  eo.threads = threads;
  TRY(zck_exec_run(jobs, nj, &eo));
  TRY(zck_ds_writer_commit(w));
  for (size_t i = 0; i < nj; i++) zck_plan_free(plans[i]);
  zck_ds_writer_free(w);
  zck_layout_free(whole);
  zck_model_free(m);
  free(numel);
  free(ctx);
  free(src);
  return 0;
}
