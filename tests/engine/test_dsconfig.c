/* test_dsconfig.c: DeepSpeed config "auto" resolution and mismatch errors, against the
 * output of transformers' own HfTrainerDeepSpeedConfig (trainer_config_process +
 * trainer_config_finalize, transformers 5.x) for the same config and arguments. */
#include "test.h"

#include "dsconfig.h"
#include "pyjson.h"

#include <cjson/cJSON.h>

static const char *bad_config =
  "{\"train_micro_batch_size_per_gpu\": 4, \"gradient_accumulation_steps\": 2, \"train_batch_size\": 64,"
  " \"gradient_clipping\": 0.5,"
  " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.01, \"betas\": [0.9, 0.98], \"eps\": 1e-6,"
  " \"weight_decay\": 0.1}},"
  " \"scheduler\": {\"type\": \"WarmupDecayLR\", \"params\": {\"warmup_min_lr\": \"auto\", \"warmup_max_lr\": 0.02,"
  " \"warmup_num_steps\": 7, \"total_num_steps\": 99}},"
  " \"fp16\": {\"enabled\": true}, \"bf16\": {\"enabled\": true},"
  " \"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": \"auto\"}}";

/* python gold.py bad.json (world 2, batch 8, GAS 1, clip 1.0, lr 1e-3, wd 0, fp32, 100 steps) */
static const char *bad_expected =
  "Please correct the following DeepSpeed config values that mismatch TrainingArguments values:\n"
  "- ds train_micro_batch_size_per_gpu=4 vs hf per_device_train_batch_size=8\n"
  "- ds gradient_accumulation_steps=2 vs hf gradient_accumulation_steps=1\n"
  "- ds train_batch_size=64 vs hf train_batch_size (calculated)=16\n"
  "- ds gradient_clipping=0.5 vs hf max_grad_norm=1.0\n"
  "- ds optimizer.params.lr=0.01 vs hf learning_rate=0.001\n"
  "- ds optimizer.params.betas=[0.9, 0.98] vs hf adam_beta1+adam_beta2=[0.9, 0.999]\n"
  "- ds optimizer.params.eps=1e-06 vs hf adam_epsilon=1e-08\n"
  "- ds optimizer.params.weight_decay=0.1 vs hf weight_decay=0.0\n"
  "- ds scheduler.params.warmup_max_lr=0.02 vs hf learning_rate=0.001\n"
  "- ds fp16.enabled=True vs hf fp16|fp16_full_eval=False\n"
  "- ds bf16.enabled=True vs hf bf16|bf16_full_eval=False\n"
  "- ds scheduler.params.total_num_steps=99 vs hf num_training_steps (calculated)=100\n"
  "- ds scheduler.params.warmup_num_steps=7 vs hf warmup_steps=1\n"
  "The easiest method is to set these DeepSpeed config values to 'auto'.";

static const char *auto_config =
  "{\"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": \"auto\","
  " \"train_batch_size\": \"auto\", \"gradient_clipping\": \"auto\","
  " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"betas\": \"auto\", \"eps\": \"auto\","
  " \"weight_decay\": \"auto\"}},"
  " \"bf16\": {\"enabled\": \"auto\"},"
  " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": \"auto\", \"stage3_prefetch_bucket_size\": \"auto\","
  " \"stage3_param_persistence_threshold\": \"auto\", \"sub_group_size\": 1e9}}";

static double num(const cJSON *root, const char *a, const char *b, const char *c) {
  const cJSON *j = cJSON_GetObjectItemCaseSensitive(root, a);
  if (b) j = cJSON_GetObjectItemCaseSensitive(j, b);
  if (c) j = cJSON_GetObjectItemCaseSensitive(j, c);
  if (!cJSON_IsNumber(j)) ZT_FAIL("%s.%s.%s is not a number", a, b ? b : "", c ? c : "");
  return j->valuedouble;
}

static void unsupported(const ze_train_args *a, const char *json, zck_status st, const char *needle) {
  ze_ds_config d;
  ZT_ERR(ze_ds_config_parse(json, "ds.json", a, &d), st, needle);
  ze_ds_config_free(&d);
}

int main(void) {
  /* ---- Python's float repr */
  static const struct { double v; const char *s; } reprs[] = {
    {5e-05, "5e-05"}, {0.001, "0.001"}, {1.0, "1.0"}, {0.0, "0.0"}, {1e-08, "1e-08"}, {0.9, "0.9"},
    {0.0001, "0.0001"}, {1e16, "1e+16"}, {123456789012345.0, "123456789012345.0"}, {-2.5e-7, "-2.5e-07"},
    {0.1 + 0.2, "0.30000000000000004"}, {1e22, "1e+22"}, {1.5e300, "1.5e+300"}, {100.0, "100.0"}};
  for (size_t i = 0; i < sizeof reprs / sizeof *reprs; i++) {
    char buf[40];
    zck_py_float_repr(reprs[i].v, buf, sizeof buf);
    ZT_EQ_STR(buf, reprs[i].s);
  }

  ze_train_args a;
  ze_train_args_default(&a);
  a.model.n_embd = 64;
  a.max_steps = 100;

  /* ---- every mismatch listed, in HF's order and spelling */
  a.ranks = 2;
  a.per_device_train_batch_size = 8;
  a.gradient_accumulation_steps = 1;
  a.max_grad_norm = 1.0;
  a.learning_rate = 1e-3;
  a.weight_decay = 0.0;
  a.bf16 = false;
  ze_ds_config d;
  ZT_ERR(ze_ds_config_parse(bad_config, "bad.json", &a, &d), ZCK_ERR_MISMATCH, "Please correct");
  ZT_ASSERT(d.message);
  ZT_EQ_STR(d.message, bad_expected);
  ze_ds_config_free(&d);
  /* --zero-stage that disagrees with the config joins the list */
  a.zero_stage = 3;
  ZT_ERR(ze_ds_config_parse(bad_config, "bad.json", &a, &d), ZCK_ERR_MISMATCH, "mismatch");
  ZT_ASSERT(strstr(d.message, "- ds bf16.enabled=True vs hf bf16|bf16_full_eval=False\n"
                              "- ds zero_optimization.stage=2 vs hf zero_stage=3\n"));
  ze_ds_config_free(&d);
  a.zero_stage = 0;

  /* ---- "auto" filled (python gold.py auto.json: world 3, batch 2, GAS 4, clip 0.5, lr 5e-5,
   * wd 0.01, bf16, 100 steps, hidden 64) */
  a.ranks = 3;
  a.per_device_train_batch_size = 2;
  a.gradient_accumulation_steps = 4;
  a.max_grad_norm = 0.5;
  a.learning_rate = 5e-5;
  a.weight_decay = 0.01;
  a.bf16 = true;
  ZT_OK(ze_ds_config_parse(auto_config, "auto.json", &a, &d));
  ZT_EQ_INT(d.stage, 3);
  ZT_ASSERT(d.has_optimizer);
  ZT_EQ_U64(d.sub_group_size, 1000000000ull);
  ZT_ASSERT(num(d.json, "train_micro_batch_size_per_gpu", NULL, NULL) == 2);
  ZT_ASSERT(num(d.json, "gradient_accumulation_steps", NULL, NULL) == 4);
  ZT_ASSERT(num(d.json, "train_batch_size", NULL, NULL) == 24);
  ZT_ASSERT(num(d.json, "gradient_clipping", NULL, NULL) == 0.5);
  ZT_ASSERT(num(d.json, "optimizer", "params", "lr") == 5e-05);
  ZT_ASSERT(num(d.json, "optimizer", "params", "eps") == 1e-08);
  ZT_ASSERT(num(d.json, "optimizer", "params", "weight_decay") == 0.01);
  ZT_ASSERT(num(d.json, "zero_optimization", "reduce_bucket_size", NULL) == 4096);
  ZT_ASSERT(num(d.json, "zero_optimization", "stage3_prefetch_bucket_size", NULL) == 3686);
  ZT_ASSERT(num(d.json, "zero_optimization", "stage3_param_persistence_threshold", NULL) == 640);
  const cJSON *betas = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(
                                                            cJSON_GetObjectItemCaseSensitive(d.json, "optimizer"), "params"),
                                                        "betas");
  ZT_ASSERT(cJSON_GetArraySize(betas) == 2 && cJSON_GetArrayItem(betas, 1)->valuedouble == 0.999);
  ZT_ASSERT(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(d.json, "bf16"), "enabled")));
  ze_ds_config_free(&d);

  /* ---- no optimizer section: the HF optimizer (two groups); the stage defaults to 2 */
  ZT_OK(ze_ds_config_parse("{\"zero_optimization\": {\"stage\": \"auto\"}}", "x.json", &a, &d));
  ZT_ASSERT(!d.has_optimizer && d.stage == 2);
  ze_ds_config_free(&d);
  ZT_OK(ze_ds_config_default(&a, 1, &d));
  ZT_ASSERT(d.stage == 1 && num(d.json, "train_batch_size", NULL, NULL) == 24);
  ze_ds_config_free(&d);

  /* ---- DeepSpeed's decoupled checkpoint writer: the engine's --async-save */
  ZT_OK(ze_ds_config_parse("{\"zero_optimization\": {\"stage\": 2}, \"checkpoint\": {\"writer\": "
                           "{\"type\": \"fast\", \"decoupled\": true}}}",
                           "x.json", &a, &d));
  ZT_ASSERT(d.async_save);
  ze_ds_config_free(&d);
  ZT_OK(ze_ds_config_parse("{\"zero_optimization\": {\"stage\": 2}, \"checkpoint\": {\"writer\": {\"decoupled\": false}}}",
                           "x.json", &a, &d));
  ZT_ASSERT(!d.async_save);
  ze_ds_config_free(&d);
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 2}, \"checkpoint\": {\"writer\": {\"decoupled\": \"yes\"}}}",
              ZCK_ERR_INVALID_ARG, "checkpoint.writer.decoupled must be true or false");

  /* ---- the keys users tune: DeepSpeed's defaults, or the config's values */
  ZT_OK(ze_ds_config_parse("{\"zero_optimization\": {\"stage\": 2}}", "x.json", &a, &d));
  ZT_ASSERT(d.reduce_bucket_size == 500000000 && d.allgather_bucket_size == 500000000 && !d.overlap_comm &&
            d.contiguous_gradients && d.prefetch_bucket_size == 50000000 && d.max_live_parameters == 1000000000 &&
            !d.offload_optimizer && !d.offload_param);
  ze_ds_config_free(&d);
  ZT_OK(ze_ds_config_parse("{\"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": 12, "
                           "\"stage3_prefetch_bucket_size\": 0, \"stage3_max_live_parameters\": 5e6, "
                           "\"contiguous_gradients\": false, \"overlap_comm\": false, "
                           "\"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true, \"ratio\": 0.3}, "
                           "\"offload_param\": {\"device\": \"cpu\", \"pin_memory\": false}}}",
                           "x.json", &a, &d));
  ZT_ASSERT(d.reduce_bucket_size == 12 && d.prefetch_bucket_size == 0 && d.max_live_parameters == 5000000 &&
            !d.contiguous_gradients && !d.overlap_comm && d.offload_optimizer && d.offload_param);
  ze_ds_config_free(&d);
  /* stage 3 turns overlap_comm on by default; offload_param at stage 2 is accepted and
   * ignored, as DeepSpeed does; the deprecated cpu_offload spelling */
  ZT_OK(ze_ds_config_parse("{\"zero_optimization\": {\"stage\": 3}}", "x.json", &a, &d));
  ZT_ASSERT(d.overlap_comm);
  ze_ds_config_free(&d);
  ZT_OK(ze_ds_config_parse("{\"zero_optimization\": {\"stage\": 2, \"cpu_offload\": true, "
                           "\"offload_param\": {\"device\": \"cpu\"}, \"allgather_bucket_size\": 2e8}}",
                           "x.json", &a, &d));
  ZT_ASSERT(d.offload_optimizer && d.offload_param && d.allgather_bucket_size == 200000000);
  ze_ds_config_free(&d);
  /* "auto" resolution fills reduce_bucket_size = hidden^2 (and the stage-3 prefetch bucket) */
  ZT_OK(ze_ds_config_parse(auto_config, "x.json", &a, &d));
  ZT_ASSERT(d.reduce_bucket_size == (uint64_t)a.model.n_embd * a.model.n_embd &&
            d.prefetch_bucket_size == (uint64_t)(0.9 * a.model.n_embd * a.model.n_embd));
  ze_ds_config_free(&d);

  /* ---- what the engine refuses, one line naming the key */
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 1}, \"scheduler\": {\"type\": \"WarmupLR\"}}",
              ZCK_ERR_UNSUPPORTED, "ds.json: \"scheduler\"");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 0}}", ZCK_ERR_UNSUPPORTED, "stage=0");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 2, \"round_robin_gradients\": true}}", ZCK_ERR_UNSUPPORTED,
              "round_robin_gradients");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"offload_optimizer\": {\"device\": \"nvme\"}}}",
              ZCK_ERR_UNSUPPORTED, "ds.json: zero_optimization.offload_optimizer.device=nvme: NVMe offloading is not supported");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"/x\"}}}",
              ZCK_ERR_UNSUPPORTED, "offload_param.device=nvme");
  /* DeepSpeed's own rules and words */
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 2, \"offload_optimizer\": {\"device\": \"cpu\", \"ratio\": 0.5}}}",
              ZCK_ERR_INVALID_ARG, "ds.json: Partial offloading only supported for ZeRO Stage 3.");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"gpu\"}}}",
              ZCK_ERR_INVALID_ARG, "offload_param.device: Input should be 'none', 'cpu' or 'nvme'");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": \"yes\"}}}",
              ZCK_ERR_INVALID_ARG, "offload_param.pin_memory must be true or false");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 2, \"allgather_bucket_size\": 1001}}", ZCK_ERR_INVALID_ARG,
              "allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 2, \"reduce_bucket_size\": 0}}", ZCK_ERR_INVALID_ARG,
              "zero_optimization.reduce_bucket_size=0: Input should be greater than 0");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"stage3_prefetch_bucket_size\": -1}}", ZCK_ERR_INVALID_ARG,
              "stage3_prefetch_bucket_size=-1: Input should be greater than or equal to 0");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"stage3_max_live_parameters\": 1.5}}", ZCK_ERR_INVALID_ARG,
              "stage3_max_live_parameters must be an integer");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"stage3_param_persistence_threshold\": -5}}",
              ZCK_ERR_INVALID_ARG, "stage3_param_persistence_threshold=-5: Input should be greater than or equal to 0");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"stage3_max_reuse_distance\": \"far\"}}",
              ZCK_ERR_INVALID_ARG, "stage3_max_reuse_distance must be an integer");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 3, \"stage3_model_persistence_threshold\": 2.5}}",
              ZCK_ERR_INVALID_ARG, "stage3_model_persistence_threshold must be an integer");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 1, \"overlap_comm\": \"auto\"}}", ZCK_ERR_INVALID_ARG,
              "overlap_comm must be true or false");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 2}, \"optimizer\": {\"type\": \"Lamb\"}}", ZCK_ERR_UNSUPPORTED,
              "optimizer.type");
  unsupported(&a, "{\"bf16\": {\"enabled\": true}}", ZCK_ERR_INVALID_ARG, "no \"zero_optimization\" section");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": \"two\"}}", ZCK_ERR_INVALID_ARG, "must be an integer");
  unsupported(&a, "{\"zero_optimization\": {\"stage\": 2}", ZCK_ERR_FORMAT, "ds.json: invalid JSON at byte");
  unsupported(&a, "[1, 2]", ZCK_ERR_FORMAT, "not a JSON object");
  ZT_ERR(ze_ds_config_load("/nonexistent/ds.json", &a, &d), ZCK_ERR_NOT_FOUND, "/nonexistent/ds.json");
  ze_ds_config_free(&d);
  return 0;
}
