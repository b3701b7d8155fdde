/* test_gpu_train.c: zckpt-train --device cuda against the CPU engine (label gpu; exits 77
 * without a device). The bounds below were reasoned before any GPU ran this; the first run
 * (H200, tests/bench/results-gpu.txt) is well inside them: first loss equal, gradient norm
 * within 1.4e-8, weights within 1.4e-6 per element after 3 steps.
 *
 * Agreement with the CPU (fp32 weights, ZeRO 1, 2, 3 at W = 2 rank threads: NCCL with two
 * GPUs, else the cuda-local backend on one):
 *   - the forward/backward kernels sum in other orders than the CPU (cuBLAS products, tree
 *     row sums), and NCCL reduces in its own order, so nothing is bit for bit: the first
 *     loss (same weights) within 1e-5 relative, the first gradient norm within 1e-4, later
 *     losses within 1e-3;
 *   - AdamW is bit-exact given equal gradients, but an element whose gradient is near zero
 *     can move the other way, and each step moves an element by at most about lr*(1-b1)/
 *     sqrt(1-b2) < 4 lr: the final weights within 4 lr x steps per element and 1e-2
 *     relative L2 error overall.
 * Exact properties of the device path:
 *   - determinism: the same run twice gives the same bits (no atomics anywhere);
 *   - stage 3: the model.safetensors gathered on the device (bounded gather16) equals the
 *     one written rank by rank through the savers' copy plans (per_rank_io) from the same
 *     partitions, and equals `zckpt consolidate` of the DeepSpeed checkpoint cast to bf16;
 *     that checkpoint consolidates;
 *   - offload: offload_optimizer (AdamW on the CPU) gives the same bits as the fused
 *     kernel when no clipping depends on the norm's summation order (max_grad_norm 0), and
 *     offload_param the same bits as none (copies only);
 *   - memory: the device ledger of test_train_memory's model at W = 4 orders stage 3 <
 *     stage 2 < stage 1, offload lowers it, and the activations and cudaMemGetInfo's
 *     in-use bytes are reported. */
#include "engine_cmp.h"

#include "zck_cuda.h"

static char *tmp;

static void close_results(const char *what, const ze_train_result *g, const ze_train_result *c, double lr) {
  ZT_EQ_INT(g->steps, c->steps);
  ZT_ASSERT(c->steps > 0 && c->n_params > 0); /* something to compare */
  double l0 = fabs((double)g->losses[0] - c->losses[0]) / fabs((double)c->losses[0]);
  double n0 = fabs(g->grad_norms[0] - c->grad_norms[0]) / c->grad_norms[0];
  if (l0 > 1e-5 || n0 > 1e-4) ZT_FAIL("%s: step 1: loss rel error %.3g (> 1e-5?), grad_norm %.3g (> 1e-4?)", what, l0, n0);
  for (int64_t i = 1; i < g->steps; i++) {
    double e = fabs((double)g->losses[i] - c->losses[i]) / fabs((double)c->losses[i]);
    if (e > 1e-3) ZT_FAIL("%s: step %lld: loss %.9g vs %.9g", what, (long long)i + 1, (double)g->losses[i], (double)c->losses[i]);
  }
  ZT_EQ_U64(g->n_params, c->n_params);
  double lim = 4.0 * lr * (double)g->steps, worst = 0, d2 = 0, c2 = 0;
  for (size_t i = 0; i < g->n_params; i++) {
    double d = fabs((double)g->params[i] - c->params[i]);
    if (d > lim) ZT_FAIL("%s: weight %zu: %.9g vs %.9g (> %.3g)", what, i, (double)g->params[i], (double)c->params[i], lim);
    if (d > worst) worst = d;
    d2 += d * d;
    c2 += (double)c->params[i] * c->params[i];
  }
  double rel = sqrt(d2 / c2);
  if (rel > 1e-2) ZT_FAIL("%s: final weights: relative L2 error %.3g > 1e-2", what, rel);
  printf("  %-16s loss[0] rel %.2g, grad_norm[0] rel %.2g, weights max %.2g rel-L2 %.2g\n", what, l0, n0, worst, rel);
}

static const char *const kZero[4] = {
    NULL, "{\"stage\": 1, \"reduce_bucket_size\": 700, \"allgather_bucket_size\": 300}",
    "{\"stage\": 2, \"reduce_bucket_size\": 700, \"allgather_bucket_size\": 300}",
    "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
    " \"reduce_bucket_size\": 700, \"stage3_prefetch_bucket_size\": 5000, \"allgather_bucket_size\": 1000}"};

static void agreement(int stage) {
  char name[32], out_c[4200], out_g[4200];
  snprintf(name, sizeof name, "agree%d", stage);
  snprintf(out_c, sizeof out_c, "%s/%s_cpu", tmp, name);
  snprintf(out_g, sizeof out_g, "%s/%s_gpu", tmp, name);
  ze_train_args a = ec_args(2, out_c, ec_config(tmp, name, kZero[stage]));
  a.bf16 = false;
  ze_train_result c, g, g2;
  ec_run(&a, &c);
  a.output_dir = out_g;
  a.device = "cuda";
  ec_run(&a, &g);
  close_results(name, &g, &c, a.learning_rate);
  /* the same run again: the same bits */
  a.output_dir = NULL;
  ec_run(&a, &g2);
  ec_same_results("gpu determinism", &g, &g2);
  ZT_ASSERT(g.mem_on_device && g.dev_workspace[0] > 0 && g.dev_used_peak[0] > 0);
  ze_train_result_free(&c);
  ze_train_result_free(&g);
  ze_train_result_free(&g2);
}

/* test_train_memory's model and buckets at W = 4: the device holds what the CPU would. */
static uint64_t memory(int stage) {
  char name[32];
  snprintf(name, sizeof name, "mem%d", stage);
  /* stage 3 as test_train_memory runs it: nothing persistent, nothing kept for reuse (with
   * DeepSpeed's defaults every tensor of this small model persists and the whole model is
   * held at the turn, more than stage 2's 16-bit copy) */
  const char *cfg = ec_config(tmp, name, stage == 3 ? "{\"stage\": 3, \"reduce_bucket_size\": \"auto\","
                                                      " \"stage3_prefetch_bucket_size\": \"auto\","
                                                      " \"stage3_param_persistence_threshold\": 0,"
                                                      " \"stage3_max_reuse_distance\": 0}"
                                         : stage == 2 ? "{\"stage\": 2, \"reduce_bucket_size\": \"auto\", "
                                                        "\"allgather_bucket_size\": 8192}"
                                                      : "{\"stage\": 1, \"reduce_bucket_size\": \"auto\", "
                                                        "\"allgather_bucket_size\": 8192}");
  ze_train_args a = ec_args(4, NULL, cfg);
  a.model = (ze_gpt2_config){256, 32, 6, 2, 64};
  a.max_steps = 2;
  a.per_device_train_batch_size = 1;
  a.gradient_accumulation_steps = 1;
  a.n_freeze = 0;
  a.device = "cuda";
  ze_train_result r;
  ec_run(&a, &r);
  uint64_t peak = 0;
  for (int k = 0; k < 4; k++)
    if (r.mem[k].peak > peak) peak = r.mem[k].peak;
  printf("  stage %d W=4: device model-state peak %llu bytes per rank, activations %llu, in use (device) %llu\n", stage,
         (unsigned long long)peak, (unsigned long long)r.dev_workspace[0], (unsigned long long)r.dev_used_peak[0]);
  ze_train_result_free(&r);
  return peak;
}

/* Stage 3, bf16: the device-gathered file, the rank-by-rank file and the consolidation. */
static void gathered(void) {
  char out_a[4200], out_b[4200], pa[4300], pb[4300], ca[4300], cons[4300];
  snprintf(out_a, sizeof out_a, "%s/g16_gather", tmp);
  snprintf(out_b, sizeof out_b, "%s/g16_rank", tmp);
  ze_train_args a = ec_args(2, out_a, ec_config(tmp, "g16", kZero[3]));
  a.device = "cuda";
  ze_train_result x, y;
  ec_run(&a, &x);
  a.output_dir = out_b;
  a.per_rank_io = true;
  ec_run(&a, &y);
  ec_same_results("gather16 vs per rank", &x, &y);
  snprintf(pa, sizeof pa, "%s/checkpoint-3/model.safetensors", out_a);
  snprintf(pb, sizeof pb, "%s/checkpoint-3/model.safetensors", out_b);
  ec_same_file(pa, pb);
  snprintf(ca, sizeof ca, "%s/checkpoint-3", out_a);
  snprintf(cons, sizeof cons, "%s/consolidated.safetensors", tmp);
  zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
  co.dtype = ZCK_BF16;
  ZT_OK(zck_consolidate(ca, cons, &co));
  size_t n = ec_same_tensors(pa, cons);
  ZT_ASSERT(n > 10);
  printf("  gathered model.safetensors: equal to the per-rank file and to the consolidation (%zu tensors)\n", n);
  ze_train_result_free(&x);
  ze_train_result_free(&y);
}

/* Offload on and off: the same bits. */
static void offload(void) {
  static const char *const pairs[2][2] = {
      {"{\"stage\": 2}", "{\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}"},
      {"{\"stage\": 3, \"sub_group_size\": 3000}",
       "{\"stage\": 3, \"sub_group_size\": 3000, \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true},"
       " \"offload_optimizer\": {\"device\": \"cpu\"}}"}};
  for (int i = 0; i < 2; i++) {
    char name[32];
    ze_train_result r[2];
    for (int k = 0; k < 2; k++) {
      snprintf(name, sizeof name, "off%d_%d", i, k);
      ze_train_args a = ec_args(2, NULL, ec_config(tmp, name, pairs[i][k]));
      a.device = "cuda";
      a.max_grad_norm = 0.0; /* no clipping: the norm's summation order decides nothing */
      ec_run(&a, &r[k]);
    }
    ZT_EQ_INT(r[0].steps, r[1].steps);
    ZT_EQ_MEM(r[0].losses, r[1].losses, (size_t)r[0].steps * sizeof(float));
    ZT_EQ_MEM(r[0].params, r[1].params, r[0].n_params * sizeof(float));
    ZT_ASSERT(r[1].mem[0].peak < r[0].mem[0].peak && r[1].mem_host[0].peak > 0);
    printf("  offload (%s): same bits; device peak %llu -> %llu bytes\n", i ? "stage 3, param + optimizer" : "stage 2, optimizer",
           (unsigned long long)r[0].mem[0].peak, (unsigned long long)r[1].mem[0].peak);
    ze_train_result_free(&r[0]);
    ze_train_result_free(&r[1]);
  }
}

int main(void) {
  if (zck_cuda_device_count() == 0) zt_skip("no CUDA device");
  char name[128] = "";
  zck_cuda_device_name(0, name, sizeof name);
  printf("device 0: %s, %d device(s)\n", name, zck_cuda_device_count());
  tmp = zt_tmpdir();
  ZT_ASSERT(tmp);
  for (int stage = 1; stage <= 3; stage++) agreement(stage);
  uint64_t peak[4];
  for (int stage = 1; stage <= 3; stage++) peak[stage] = memory(stage);
  if (!(peak[3] < peak[2] && peak[2] < peak[1]))
    ZT_FAIL("device peaks per rank at W=4: stage 1 %llu, 2 %llu, 3 %llu", (unsigned long long)peak[1],
            (unsigned long long)peak[2], (unsigned long long)peak[3]);
  gathered();
  offload();
  return 0;
}
