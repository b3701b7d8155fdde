/* test_async_save.c: --async-save writes what a synchronous save writes, byte for byte.
 *
 * For each configuration a synchronous run saves into OUT, which is then moved aside, and
 * an async run saves into the same OUT (trainer_state.json records the path): the two
 * output trees hold the same files with the same bytes, and the runs the same losses and
 * weights. Every step saves (so most saves wait for the one before, still being written),
 * with rotation (save_total_limit 2) and evaluations (the best checkpoint kept by it):
 *  - ZeRO 1, 2, 3 at W = 1 and 3, bf16, a frozen MLP, two micro-batches (ec_args);
 *  - stage 3 with the 16-bit gather on save; --save-only-model; --load-best-model-at-end
 *    (the best model exported into OUT after the last save was flushed);
 *  - the DeepSpeed config's key (checkpoint.writer.decoupled) instead of the flag (the
 *    DeepSpeed files record the config, key included, so the HF files are compared);
 *  - --device cuda's path simulated in host memory (sim_device): the snapshot copies the
 *    device arrays through the two staging buffers in buckets of 200 bytes (many chunks)
 *    and the offloaded ones directly.
 * And the refusal of thread ranks forced to save per rank (per-rank I/O), in one line. */
#include "engine_cmp.h"

#include <unistd.h>

static char *tmp;

static const char *const kZero[4] = {
    NULL, "{\"stage\": 1, \"reduce_bucket_size\": 700}", "{\"stage\": 2, \"reduce_bucket_size\": 700}",
    "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
    " \"reduce_bucket_size\": 700}"};

typedef struct variant {
  bool save_only_model, load_best, ds_key, sim, offload;
} variant;

/* The run's DeepSpeed config; decoupled: with DeepSpeed's decoupled writer switched on. */
static const char *config_for(const char *name, int stage, const variant *v, bool decoupled) {
  char zero[512];
  /* sim: allgather_bucket_size is the on-save gather's bucket, and the snapshot's: 100
   * bf16 elements, 200 bytes */
  snprintf(zero, sizeof zero, "%.*s%s%s}", (int)strlen(kZero[stage]) - 1, kZero[stage],
           v->sim ? ", \"allgather_bucket_size\": 100" : "",
           v->offload ? ", \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}" : "");
  char file[128];
  snprintf(file, sizeof file, "%s%s", name, decoupled ? "_decoupled" : "");
  const char *cfg = ec_config(tmp, file, zero);
  if (!decoupled) return cfg;
  FILE *f = fopen(cfg, "r+");
  ZT_ASSERT(f);
  ZT_ASSERT(fseek(f, -1, SEEK_END) == 0);
  fprintf(f, ", \"checkpoint\": {\"writer\": {\"type\": \"fast\", \"decoupled\": true}}}");
  fclose(f);
  return cfg;
}

static void same_saves(int stage, int W, const variant *v) {
  char name[96], out[4200], aside[4300];
  snprintf(name, sizeof name, "z%d_w%d%s%s%s%s%s", stage, W, v->save_only_model ? "_only" : "", v->load_best ? "_best" : "",
           v->ds_key ? "_dskey" : "", v->sim ? "_sim" : "", v->offload ? "_offload" : "");
  snprintf(out, sizeof out, "%s/%s", tmp, name);
  snprintf(aside, sizeof aside, "%s/%s.sync", tmp, name);
  ze_train_args a = ec_args(W, out, config_for(name, stage, v, false));
  a.max_steps = 6;
  a.save_steps = v->load_best ? 2 : 1; /* HF: a multiple of eval_steps */
  a.save_total_limit = 2;
  a.eval_steps = 2;
  a.save_only_model = v->save_only_model;
  a.load_best_model_at_end = v->load_best;
  if (v->sim) {
    a.device = "cuda";
    a.sim_device = true;
  }
  ze_train_result sync, async;
  ec_run(&a, &sync);
  ZT_ASSERT(rename(out, aside) == 0);
  if (v->ds_key)
    a.deepspeed = config_for(name, stage, v, true);
  else
    a.async_save = true;
  ec_run(&a, &async);
  ec_same_results(name, &sync, &async);
  ZT_ASSERT(!sync.async_save && async.async_save);
  if (v->ds_key) {
    /* every DeepSpeed file records the ds_config, and with it the key: compare the rest */
    static const char *const rel[] = {"checkpoint-6/model.safetensors", "checkpoint-6/trainer_state.json",
                                      "checkpoint-6/config.json", "checkpoint-6/latest", "model.safetensors"};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
      char pa[4400], pb[4400];
      snprintf(pa, sizeof pa, "%s/%s", aside, rel[i]);
      snprintf(pb, sizeof pb, "%s/%s", out, rel[i]);
      ec_same_file(pa, pb);
    }
    printf("  %-28s model, trainer state, exported best model identical\n", name);
    ze_train_result_free(&sync);
    ze_train_result_free(&async);
    return;
  }
  int files = ec_same_tree(aside, out);
  ZT_ASSERT(files >= (v->save_only_model ? 6 : 10));
  printf("  %-28s %d identical files\n", name, files);
  ze_train_result_free(&sync);
  ze_train_result_free(&async);
}

static void refused_per_rank(void) {
  char out[4200];
  snprintf(out, sizeof out, "%s/per_rank", tmp);
  ze_train_args a = ec_args(2, out, NULL);
  a.async_save = true;
  a.per_rank_io = true;
  ze_train_result r;
  zck_status s = ze_train_run(&a, &r);
  ZT_EQ_INT(s, ZCK_ERR_UNSUPPORTED);
  ZT_ASSERT(strstr(zck_last_error(), "--async-save") && !strchr(zck_last_error(), '\n'));
  ze_train_result_free(&r);
}

int main(void) {
  tmp = zt_tmpdir();
  variant plain = {0};
  for (int stage = 1; stage <= 3; stage++)
    for (int W = 1; W <= 3; W += 2) same_saves(stage, W, &plain);
  same_saves(3, 2, &(variant){.save_only_model = true});
  same_saves(2, 2, &(variant){.load_best = true});
  same_saves(3, 3, &(variant){.load_best = true, .ds_key = true});
  for (int stage = 1; stage <= 3; stage++) same_saves(stage, 2, &(variant){.sim = true});
  same_saves(3, 2, &(variant){.sim = true, .offload = true});
  refused_per_rank();
  printf("async saves: same bytes as synchronous saves\n");
  return 0;
}
