/* test_train_memory.c: ZeRO's memory savings are real and measured, and the keys users tune
 * cut the collectives differently without changing one bit.
 *  - per rank, the persistent model states equal DeepSpeed's partition math exactly (16-bit
 *    params whole for stage 1/2, partitioned for stage 3; fp32 master, exp_avg, exp_avg_sq and
 *    gradient partitions; stage 1's full fp32 gradients), and the transient buffers are a
 *    module or two (stage 1/2: the running module's fp32 weights; stage 2/3: its gradients
 *    plus wte's, which wait for the embedding backward; stage 3: gathered modules);
 *  - at W = 4 the peak per rank orders stage 3 < stage 2 < stage 1 < stage 1 at W = 1, and
 *    stage 3's peak at W = 4 is at least 2.5x below W = 1;
 *  - stage 3's stage3_param_persistence_threshold (and the model threshold) hold exactly the
 *    small tensors for good, as "persistent params"; stage3_max_reuse_distance keeps blocks
 *    gathered from forward to backward (DeepSpeed's 1e9 holds the whole model at the turn);
 *  - reduce_bucket_size / allgather_bucket_size of a few elements, no prefetch or a small
 *    stage3_max_live_parameters, contiguous_gradients / overlap_comm / offload to cpu,
 *    persistence and reuse distance: the same losses, final weights, model.safetensors and
 *    every tensor of every DeepSpeed file as the defaults (only the recorded ds_config
 *    differs), for ZeRO 1, 2 and 3. */
#include "test.h"

#include "layout.h"
#include "torch/torch.h"
#include "train.h"

#include <stdio.h>

static const ze_gpt2_config kModel = {256, 32, 6, 2, 64};

static char *tmp;

static const char *write_config(const char *name, const char *zero_json) {
  static char paths[16][4200];
  static int next;
  char *p = paths[next++ % 16];
  snprintf(p, 4200, "%s/%s.json", tmp, name);
  FILE *f = fopen(p, "w");
  ZT_ASSERT(f);
  fprintf(f,
          "{\"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": \"auto\","
          " \"train_batch_size\": \"auto\", \"gradient_clipping\": \"auto\", \"bf16\": {\"enabled\": \"auto\"},"
          " \"zero_optimization\": %s}",
          zero_json);
  fclose(f);
  return p;
}

static void run_ok(const ze_train_args *a, ze_train_result *r) {
  zck_status s = ze_train_run(a, r);
  if (s != ZCK_OK) ZT_FAIL("ze_train_run: %s: %s", zck_status_name(s), zck_last_error());
}

// ---- the expected bytes

typedef struct sizes {
  uint64_t n, n_decay, n_nodecay;
  uint64_t wte, wpe, block, final, max_module;
  ze_param_spec *specs;
  size_t n_specs;
} sizes;

static sizes model_sizes(void) {
  sizes z = {0};
  z.n_specs = ze_gpt2_n_tensors(&kModel);
  z.specs = calloc(z.n_specs, sizeof *z.specs);
  ze_gpt2_param_specs(&kModel, z.specs);
  for (size_t i = 0; i < z.n_specs; i++) {
    z.n += z.specs[i].numel;
    if (z.specs[i].decay) z.n_decay += z.specs[i].numel;
    else z.n_nodecay += z.specs[i].numel;
  }
  z.wte = z.specs[0].numel;
  z.wpe = z.specs[1].numel;
  z.block = ze_gpt2_module_numel(&kModel, 0);
  z.final = ze_gpt2_module_numel(&kModel, kModel.n_layer);
  z.max_module = z.block;
  if (z.final > z.max_module) z.max_module = z.final;
  if (z.wte + z.wpe > z.max_module) z.max_module = z.wte + z.wpe;
  return z;
}

/* Elements per rank of the fp32 partitions: stage 1/2 sum of P over the two HF groups;
 * stage 3 sum of ceil(n/W) over the params. */
static uint64_t partition_elems(const sizes *z, int stage, uint32_t W) {
  if (stage < 3) return zck_zero12_partition(z->n_decay, W) + zck_zero12_partition(z->n_nodecay, W);
  uint64_t s = 0;
  for (size_t i = 0; i < z->n_specs; i++) s += zck_zero3_partition(z->specs[i].numel, W);
  return s;
}

/* Elements per rank of a module's stage-3 p-slots. */
static uint64_t module_slots(const sizes *z, int module, uint32_t W) {
  int idx[12];
  int k = ze_gpt2_module_tensors(&kModel, module, idx);
  uint64_t s = 0;
  for (int i = 0; i < k; i++) s += zck_zero3_partition(z->specs[idx[i]].numel, W);
  return s;
}

static uint64_t memory_case(const sizes *z, int stage, uint32_t W) {
  char name[32];
  snprintf(name, sizeof name, "mem%d", stage);
  /* HF's "auto" buckets: reduce hidden^2, stage-3 prefetch 0.9 hidden^2 (less than a block) */
  /* stage 3: nothing persistent, nothing kept for reuse (residency_case does those) */
  const char *cfg = write_config(name, stage == 3 ? "{\"stage\": 3, \"reduce_bucket_size\": \"auto\","
                                                    " \"stage3_prefetch_bucket_size\": \"auto\","
                                                    " \"stage3_param_persistence_threshold\": 0,"
                                                    " \"stage3_max_reuse_distance\": 0}"
                                 : stage == 2 ? "{\"stage\": 2, \"reduce_bucket_size\": \"auto\", "
                                                "\"allgather_bucket_size\": 8192}"
                                              : "{\"stage\": 1, \"reduce_bucket_size\": \"auto\", "
                                                "\"allgather_bucket_size\": 8192}");
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = kModel;
  a.max_steps = 2;
  a.per_device_train_batch_size = 1;
  a.eval_samples = 3; /* not a multiple of W: stage 3 pads the evaluation rounds */
  a.logging_steps = 0;
  a.quiet = true;
  a.bf16 = true;
  a.ranks = (int)W;
  a.deepspeed = cfg;
  ze_train_result r;
  run_ok(&a, &r);
  ZT_EQ_U64(r.n_mem, W);
  uint64_t peak = 0;
  for (uint32_t k = 0; k < W; k++) {
    const ze_mem *m = &r.mem[k];
    if (m->peak > peak) peak = m->peak;
    uint64_t P = partition_elems(z, stage, W);
    /* persistent states: exact */
    ZT_EQ_U64(m->max[ZE_MEM_LP], 2 * (stage < 3 ? W * P : P));
    ZT_EQ_U64(m->max[ZE_MEM_MASTER], 4 * P);
    ZT_EQ_U64(m->max[ZE_MEM_EXP_AVG], 4 * P);
    ZT_EQ_U64(m->max[ZE_MEM_EXP_AVG_SQ], 4 * P);
    ZT_EQ_U64(m->max[ZE_MEM_GRAD], 4 * P);
    ZT_EQ_U64(m->max[ZE_MEM_GRAD_FULL], stage == 1 ? 4 * z->n : 0);
    /* transient: module-sized */
    uint64_t blk = z->block;
    if (stage < 3) {
      ZT_EQ_U64(m->max[ZE_MEM_PARAMS], 4 * z->max_module); /* one module's fp32 copy at a time */
    } else {
      /* the running module, one prefetched, and the all-gather scratch of one module */
      uint64_t scratch = 2 * (W + 1) * module_slots(z, 0, W);
      if (!(m->max[ZE_MEM_PARAMS] >= 4 * blk && m->max[ZE_MEM_PARAMS] <= 8 * blk + scratch))
        ZT_FAIL("stage 3 W=%u: gathered params peak %llu outside [%llu, %llu]", W,
                (unsigned long long)m->max[ZE_MEM_PARAMS], (unsigned long long)(4 * blk),
                (unsigned long long)(8 * blk + scratch));
    }
    /* stage 2/3: a block's gradients plus wte's, which wait for the embedding backward */
    ZT_EQ_U64(m->max[ZE_MEM_GRADS], stage == 1 ? 0 : 4 * (z->wte + blk));
    uint64_t bucket_cap = 4 * (uint64_t)(kModel.n_embd * kModel.n_embd);
    if (stage < 3 && 2 * 8192 > bucket_cap) bucket_cap = 2 * 8192;
    if (m->max[ZE_MEM_BUCKETS] > bucket_cap)
      ZT_FAIL("stage %d W=%u: buckets %llu > %llu", stage, W, (unsigned long long)m->max[ZE_MEM_BUCKETS],
              (unsigned long long)bucket_cap);
    /* the peak is the sum of what was held at that moment */
    uint64_t sum = 0;
    for (int kk = 0; kk < ZE_MEM_KINDS; kk++) sum += m->at_peak[kk];
    ZT_EQ_U64(sum, m->peak);
  }
  ze_train_result_free(&r);
  return peak;
}

// ---- stage 3's persistent tensors and reuse distance

static void residency_run(const char *name, const char *zero_json, uint32_t W, ze_train_result *r) {
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = kModel;
  a.max_steps = 2;
  a.per_device_train_batch_size = 1;
  a.eval_samples = 3;
  a.logging_steps = 0;
  a.quiet = true;
  a.bf16 = true;
  a.ranks = (int)W;
  a.deepspeed = write_config(name, zero_json);
  run_ok(&a, r);
}

/* stage3_param_persistence_threshold: exactly the tensors of numel <= threshold (model
 * order, under stage3_model_persistence_threshold) are held for good, as ZE_MEM_PERSIST;
 * stage3_max_reuse_distance: with DeepSpeed's 1e9 every block stays gathered from its
 * forward to its backward (the whole model is held at the turn), with 0 a module or two;
 * the losses are the same bits in every case. */
static void residency_case(const sizes *z, uint32_t W) {
  uint64_t h = (uint64_t)kModel.n_embd, small = 0, capped = 0;
  for (size_t i = 0; i < z->n_specs; i++) {
    if (z->specs[i].numel <= 10 * h) small += z->specs[i].numel;
    if (z->specs[i].numel <= 10 * h && capped + z->specs[i].numel <= 1000) capped += z->specs[i].numel;
    ZT_ASSERT(z->specs[i].numel <= 100000); /* DeepSpeed's default threshold takes every tensor here */
  }
  static const char *const cfgs[4] = {
      /* HF's "auto": 10 * hidden */
      "{\"stage\": 3, \"stage3_param_persistence_threshold\": \"auto\", \"stage3_max_reuse_distance\": 0,"
      " \"stage3_prefetch_bucket_size\": \"auto\"}",
      "{\"stage\": 3, \"stage3_param_persistence_threshold\": \"auto\", \"stage3_max_reuse_distance\": 0,"
      " \"stage3_prefetch_bucket_size\": \"auto\", \"stage3_model_persistence_threshold\": 1000}",
      "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0}", /* reuse distance 1e9 */
      "{\"stage\": 3}"};                                           /* DeepSpeed's defaults */
  ze_train_result r[4];
  for (int v = 0; v < 4; v++) {
    char name[32];
    snprintf(name, sizeof name, "res%d_w%u", v, W);
    residency_run(name, cfgs[v], W, &r[v]);
    if (v && (memcmp(r[v].losses, r[0].losses, 2 * sizeof(float)) || r[v].final_eval_loss != r[0].final_eval_loss))
      ZT_FAIL("residency config %d W=%u: losses differ", v, W);
  }
  uint64_t scratch = 2 * (W + 1) * module_slots(z, 0, W);
  for (uint32_t k = 0; k < W; k++) {
    ZT_EQ_U64(r[0].mem[k].max[ZE_MEM_PERSIST], 4 * small);
    ZT_ASSERT(r[0].mem[k].max[ZE_MEM_PARAMS] <= 8 * z->block + scratch);
    ZT_EQ_U64(r[1].mem[k].max[ZE_MEM_PERSIST], 4 * capped);
    ZT_EQ_U64(r[2].mem[k].max[ZE_MEM_PERSIST], 0);
    if (r[2].mem[k].max[ZE_MEM_PARAMS] < 4 * z->n)
      ZT_FAIL("reuse distance 1e9 W=%u: gathered peak %llu < the model's %llu bytes", W,
              (unsigned long long)r[2].mem[k].max[ZE_MEM_PARAMS], (unsigned long long)(4 * z->n));
    ZT_EQ_U64(r[3].mem[k].max[ZE_MEM_PERSIST], 4 * z->n);
    ZT_ASSERT(r[3].mem[k].max[ZE_MEM_PARAMS] <= scratch);
  }
  fprintf(stderr, "stage 3 W=%u: persistent %llu B (auto threshold), %llu B (model threshold 1000), %llu B (defaults);"
          " gathered peak %llu B (reuse 0) vs %llu B (reuse 1e9)\n",
          W, (unsigned long long)r[0].mem[0].max[ZE_MEM_PERSIST], (unsigned long long)r[1].mem[0].max[ZE_MEM_PERSIST],
          (unsigned long long)r[3].mem[0].max[ZE_MEM_PERSIST], (unsigned long long)r[0].mem[0].max[ZE_MEM_PARAMS],
          (unsigned long long)r[2].mem[0].max[ZE_MEM_PARAMS]);
  for (int v = 0; v < 4; v++) ze_train_result_free(&r[v]);
}

// ---- the tuning keys change nothing in the results

static int compare_pt(const char *pa, const char *pb) {
  zck_torch_file *fa = NULL, *fb = NULL;
  ZT_OK(zck_torch_open(pa, NULL, &fa));
  ZT_OK(zck_torch_open(pb, NULL, &fb));
  size_t n = zck_torch_storage_count(fa);
  ZT_EQ_U64(n, zck_torch_storage_count(fb));
  unsigned char *da = NULL, *db = NULL;
  size_t la = 0, lb = 0;
  ZT_ASSERT(zt_read_file(pa, &da, &la) == 0 && zt_read_file(pb, &db, &lb) == 0);
  for (size_t i = 0; i < n; i++) {
    const zck_torch_storage *a = zck_torch_storage_at(fa, i), *b = zck_torch_storage_at(fb, i);
    ZT_EQ_U64(a->nbytes, b->nbytes);
    ZT_ASSERT(a->data_offset + a->nbytes <= la && b->data_offset + b->nbytes <= lb);
    if (memcmp(da + a->data_offset, db + b->data_offset, a->nbytes))
      ZT_FAIL("%s: storage %s differs from %s's", pa, a->key, pb);
  }
  free(da);
  free(db);
  zck_torch_close(fa);
  zck_torch_close(fb);
  return (int)n;
}

static void compare_files(const char *pa, const char *pb) {
  unsigned char *da = NULL, *db = NULL;
  size_t la = 0, lb = 0;
  if (zt_read_file(pa, &da, &la) || zt_read_file(pb, &db, &lb)) ZT_FAIL("cannot read %s or %s", pa, pb);
  if (la != lb || memcmp(da, db, la)) ZT_FAIL("%s and %s differ", pa, pb);
  free(da);
  free(db);
}

static void tuning_case(int stage) {
  static const char *const zero_cfgs[4][5] = {
    {NULL, NULL, NULL},
    {"{\"stage\": 1}",
     "{\"stage\": 1, \"reduce_bucket_size\": 5, \"allgather_bucket_size\": 6, \"contiguous_gradients\": false,"
     " \"overlap_comm\": true, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}",
     NULL},
    {"{\"stage\": 2}",
     "{\"stage\": 2, \"reduce_bucket_size\": 5, \"allgather_bucket_size\": 6, \"contiguous_gradients\": false,"
     " \"overlap_comm\": true, \"offload_optimizer\": {\"device\": \"cpu\"}, \"offload_param\": {\"device\": \"cpu\"}}",
     NULL},
    {"{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
     " \"stage3_param_persistence_threshold\": 0}",
     "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
     " \"reduce_bucket_size\": 5, \"stage3_prefetch_bucket_size\": 0, \"overlap_comm\": false,"
     " \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}, \"offload_param\": {\"device\": \"cpu\","
     " \"pin_memory\": false}, \"stage3_param_persistence_threshold\": 0}",
     "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
     " \"reduce_bucket_size\": 100, \"stage3_prefetch_bucket_size\": 1000000000,"
     " \"stage3_max_live_parameters\": 20000}",
     /* persistent tensors kept across the steps (re-gathered after each), no reuse */
     "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
     " \"stage3_param_persistence_threshold\": 300, \"stage3_max_reuse_distance\": 0}",
     /* a reuse distance of about one block */
     "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
     " \"stage3_param_persistence_threshold\": 0, \"stage3_max_reuse_distance\": 12000}"}};
  ze_train_result ref;
  char ref_out[4200];
  uint32_t W = 3;
  for (int v = 0; v < 5 && zero_cfgs[stage][v]; v++) {
    char name[32], out[4200];
    snprintf(name, sizeof name, "tune%d_%d", stage, v);
    snprintf(out, sizeof out, "%s/%s", tmp, name);
    ze_train_args a;
    ze_train_args_default(&a);
    a.model = (ze_gpt2_config){256, 32, 2, 2, 32};
    a.max_steps = 3;
    a.save_steps = 3;
    a.per_device_train_batch_size = 1;
    a.gradient_accumulation_steps = 2;
    a.learning_rate = 3e-3;
    a.weight_decay = 0.1;
    a.eval_samples = 4;
    a.logging_steps = 0;
    a.quiet = true;
    a.bf16 = true;
    a.ranks = (int)W;
    a.keep_params = true;
    a.freeze[a.n_freeze++] = "transformer.h.1.mlp";
    a.output_dir = out;
    a.deepspeed = write_config(name, zero_cfgs[stage][v]);
    ze_train_result r;
    run_ok(&a, &r);
    if (v == 0) {
      ref = r;
      snprintf(ref_out, sizeof ref_out, "%s", out);
      continue;
    }
    if (memcmp(r.losses, ref.losses, 3 * sizeof(float)) || memcmp(r.grad_norms, ref.grad_norms, 3 * sizeof(double)))
      ZT_FAIL("stage %d, config %d: losses differ from the defaults'", stage, v);
    ZT_EQ_U64(r.n_params, ref.n_params);
    ZT_EQ_MEM(r.params, ref.params, r.n_params * sizeof(float));
    ZT_EQ_INT(r.final_eval_loss == ref.final_eval_loss, 1);
    char pa[4400], pb[4400];
    snprintf(pa, sizeof pa, "%s/checkpoint-3/model.safetensors", ref_out);
    snprintf(pb, sizeof pb, "%s/checkpoint-3/model.safetensors", out);
    compare_files(pa, pb);
    /* every tensor of every DeepSpeed file (the pickles differ by the recorded ds_config) */
    int tensors = 0;
    for (uint32_t k = 0; k < W; k++) {
      static const char *const files[] = {"zero_pp_rank_%u_mp_rank_00_model_states.pt",
                                          "bf16_zero_pp_rank_%u_mp_rank_00_optim_states.pt",
                                          "mp_rank_00_model_states.pt"};
      for (int f = stage == 3 ? 0 : 1; f < (stage == 3 ? 2 : (k == 0 ? 3 : 2)); f++) {
        char file[128];
        snprintf(file, sizeof file, files[f], k);
        snprintf(pa, sizeof pa, "%s/checkpoint-3/global_step3/%s", ref_out, file);
        snprintf(pb, sizeof pb, "%s/checkpoint-3/global_step3/%s", out, file);
        tensors += compare_pt(pa, pb);
      }
    }
    ZT_ASSERT(tensors > 0);
    /* small buckets hold little */
    for (uint32_t k = 0; k < W; k++) {
      if (v != 1) break;
      uint64_t want = stage == 1 ? 12 : stage == 2 ? 20 : 12; /* W*1 floats; 5 floats; W*1 floats */
      ZT_EQ_U64(r.mem[k].max[ZE_MEM_BUCKETS], want);
      ZT_ASSERT(r.mem[k].max[ZE_MEM_BUCKETS] < ref.mem[k].max[ZE_MEM_BUCKETS]);
      if (stage == 3) ZT_ASSERT(r.mem[k].max[ZE_MEM_PARAMS] < ref.mem[k].max[ZE_MEM_PARAMS]); /* no prefetch */
    }
    ze_train_result_free(&r);
  }
  ze_train_result_free(&ref);
}

int main(void) {
  tmp = zt_tmpdir();
  ZT_ASSERT(tmp);
  sizes z = model_sizes();
  uint64_t peak[4][5] = {{0}};
  for (int stage = 1; stage <= 3; stage++)
    for (uint32_t W = 1; W <= 4; W += 3) peak[stage][W] = memory_case(&z, stage, W);
  if (!(peak[3][4] < peak[2][4] && peak[2][4] < peak[1][4] && peak[1][4] < peak[1][1]))
    ZT_FAIL("peaks at W=4: stage 3 %llu, stage 2 %llu, stage 1 %llu; stage 1 at W=1 %llu",
            (unsigned long long)peak[3][4], (unsigned long long)peak[2][4], (unsigned long long)peak[1][4],
            (unsigned long long)peak[1][1]);
  if (!(2.5 * (double)peak[3][4] <= (double)peak[3][1]))
    ZT_FAIL("stage 3: W=1 peak %llu is not 2.5x W=4's %llu", (unsigned long long)peak[3][1],
            (unsigned long long)peak[3][4]);
  fprintf(stderr, "peak model-state bytes per rank (N = %llu): stage 1 W=1 %llu, W=4 %llu; stage 2 W=1 %llu, W=4 %llu; "
          "stage 3 W=1 %llu, W=4 %llu\n",
          (unsigned long long)z.n, (unsigned long long)peak[1][1], (unsigned long long)peak[1][4],
          (unsigned long long)peak[2][1], (unsigned long long)peak[2][4], (unsigned long long)peak[3][1],
          (unsigned long long)peak[3][4]);
  residency_case(&z, 1);
  residency_case(&z, 3);
  free(z.specs);
  for (int stage = 1; stage <= 3; stage++) tuning_case(stage);
  return 0;
}
