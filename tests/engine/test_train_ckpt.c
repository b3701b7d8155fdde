/* test_train_ckpt.c: checkpoints of zckpt-train.
 *  - determinism: 20 steps straight vs 10 steps + save + resume + 10 steps give the same
 *    losses bit for bit, for ZeRO 1, 2 and 3 (fp32 and bf16, frozen params included);
 *  - the HF layout: checkpoint-<N>/ with latest, global_step<N>/ and DeepSpeed's file names,
 *    config.json, model.safetensors (16-bit weights), trainer_state.json;
 *  - --save-total-limit rotation and --load-best-model-at-end (weights of the best step);
 *  - resuming with another world size, stage or dtype is refused in one line. */
#include "test.h"

#include "safetensors/safetensors.h"
#include "train.h"

#include <sys/stat.h>
#include <unistd.h>

static ze_train_args base_args(const char *out) {
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = (ze_gpt2_config){256, 32, 2, 2, 32};
  a.max_steps = 20;
  a.learning_rate = 3e-3;
  a.weight_decay = 0.1;
  a.warmup_steps = 3;
  a.logging_steps = 5;
  a.eval_samples = 4;
  a.per_device_train_batch_size = 2;
  a.quiet = true;
  a.output_dir = out;
  a.save_steps = 10;
  return a;
}

static void run_ok(const ze_train_args *a, ze_train_result *r) {
  zck_status s = ze_train_run(a, r);
  if (s != ZCK_OK) ZT_FAIL("ze_train_run: %s: %s", zck_status_name(s), zck_last_error());
}

static bool exists(const char *dir, const char *rel) {
  char p[4096];
  snprintf(p, sizeof p, "%s/%s", dir, rel);
  struct stat sb;
  return stat(p, &sb) == 0;
}

static void resume_case(const char *tmp, int stage, int W, bool bf16, bool freeze, const char *ds) {
  char out[4096], ck[4200];
  snprintf(out, sizeof out, "%s/s%dw%d%s%s%s", tmp, stage, W, bf16 ? "bf16" : "", freeze ? "f" : "", ds ? "ds" : "");
  ze_train_args a = base_args(out);
  a.deepspeed = ds;
  a.zero_stage = stage;
  a.ranks = W;
  a.bf16 = bf16;
  if (freeze) a.freeze[a.n_freeze++] = "transformer.h.1.mlp";
  ze_train_result straight, resumed;
  run_ok(&a, &straight);
  ZT_EQ_INT(straight.steps, 20);
  snprintf(ck, sizeof ck, "%s/checkpoint-10", out);
  ze_train_args b = a;
  b.resume_from_checkpoint = ck;
  b.output_dir = NULL;
  run_ok(&b, &resumed);
  ZT_EQ_INT(resumed.first_step, 10);
  ZT_EQ_INT(resumed.steps, 10);
  for (int i = 0; i < 10; i++)
    if (memcmp(&resumed.losses[i], &straight.losses[10 + i], sizeof(float)) ||
        resumed.grad_norms[i] != straight.grad_norms[10 + i])
      ZT_FAIL("stage %d W=%d bf16=%d: step %d: resumed loss %.9g vs straight %.9g", stage, W, bf16, 11 + i,
              resumed.losses[i], straight.losses[10 + i]);
  ZT_ASSERT(resumed.final_eval_loss == straight.final_eval_loss);
  /* the HF Trainer layout, DeepSpeed's names */
  char name[128];
  ZT_ASSERT(exists(ck, "latest") && exists(ck, "global_step10") && exists(ck, "config.json") &&
            exists(ck, "trainer_state.json"));
  ZT_ASSERT(exists(ck, "model.safetensors") == (stage < 3));
  for (int r = 0; r < W; r++) {
    snprintf(name, sizeof name, "global_step10/%szero_pp_rank_%d_mp_rank_00_optim_states.pt", bf16 ? "bf16_" : "", r);
    if (!exists(ck, name)) ZT_FAIL("%s/%s missing", ck, name);
    snprintf(name, sizeof name, "global_step10/zero_pp_rank_%d_mp_rank_00_model_states.pt", r);
    ZT_ASSERT(exists(ck, name) == (stage == 3));
  }
  ZT_ASSERT(exists(ck, "global_step10/mp_rank_00_model_states.pt") == (stage < 3));
  ze_train_result_free(&straight);
  ze_train_result_free(&resumed);
}

int main(void) {
  char *tmp = zt_tmpdir();
  resume_case(tmp, 1, 2, false, false, NULL);
  resume_case(tmp, 2, 3, true, true, NULL);
  resume_case(tmp, 3, 2, true, false, NULL);
  resume_case(tmp, 3, 3, false, true, NULL);
  /* ZeRO-3 with several sub-groups, and a DeepSpeed optimizer section (one param group) */
  char ds[4200];
  snprintf(ds, sizeof ds, "%s/ds.json", tmp);
  const char *json = "{\"zero_optimization\": {\"stage\": 3, \"sub_group_size\": 4000},"
                     " \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\", \"weight_decay\": \"auto\"}}}";
  ZT_ASSERT(zt_write_file(ds, json, strlen(json)) == 0);
  resume_case(tmp, 3, 2, true, true, ds);

  /* ---- another world size / stage: resharded by the library on the way in; another dtype:
   * refused */
  {
    char ck[4200];
    snprintf(ck, sizeof ck, "%s/s3w2bf16/checkpoint-10", tmp);
    ze_train_args a = base_args(NULL);
    a.zero_stage = 3;
    a.ranks = 3;
    a.bf16 = true;
    a.resume_from_checkpoint = ck;
    ze_train_result r;
    ZT_OK(ze_train_run(&a, &r));
    ze_train_result_free(&r);
    a.ranks = 2;
    a.zero_stage = 2;
    ZT_OK(ze_train_run(&a, &r));
    ze_train_result_free(&r);
    a.zero_stage = 3;
    a.bf16 = false;
    ZT_ERR(ze_train_run(&a, &r), ZCK_ERR_MISMATCH, "bfloat16");
    a.bf16 = true;
    a.max_steps = 10;
    ZT_ERR(ze_train_run(&a, &r), ZCK_ERR_INVALID_ARG, "not before --max-steps");
    a.resume_from_checkpoint = "/nonexistent/checkpoint-3";
    a.max_steps = 20;
    ZT_ERR(ze_train_run(&a, &r), ZCK_ERR_NOT_FOUND, "/nonexistent/checkpoint-3");
  }

  /* ---- rotation and the best model: saves at 10, 20, 25; evaluations at 10, 20 */
  {
    char out[4096], ck20[4200];
    snprintf(out, sizeof out, "%s/best", tmp);
    ze_train_args a = base_args(out);
    a.max_steps = 25;
    a.eval_steps = 10;
    a.save_total_limit = 1;
    a.load_best_model_at_end = true;
    a.keep_params = true;
    a.ranks = 2;
    a.zero_stage = 2;
    ze_train_result r;
    run_ok(&a, &r);
    ZT_ASSERT(r.eval_losses[1] < r.eval_losses[0]);
    snprintf(ck20, sizeof ck20, "%s/checkpoint-20", out);
    ZT_EQ_STR(r.best_checkpoint, ck20);
    /* limit 1 with the best not the newest keeps two: the best and the last */
    ZT_ASSERT(!exists(out, "checkpoint-10") && exists(out, "checkpoint-20") && exists(out, "checkpoint-25"));
    /* the final weights are those of step 20 (fp32 run: model.safetensors holds them exactly) */
    char path[4300];
    snprintf(path, sizeof path, "%s/model.safetensors", ck20);
    zck_st_file *f = NULL;
    ZT_OK(zck_st_open(path, &f));
    size_t nt = ze_gpt2_n_tensors(&a.model);
    ze_param_spec *sp = calloc(nt, sizeof *sp);
    ze_gpt2_param_specs(&a.model, sp);
    ZT_EQ_INT(zck_st_count(f), nt); /* lm_head.weight is tied: not saved */
    for (size_t i = 0; i < nt; i++) {
      const zck_st_tensor *t = zck_st_find(f, sp[i].name);
      if (!t) ZT_FAIL("%s: no %s", path, sp[i].name);
      ZT_EQ_U64(t->nbytes, sp[i].numel * 4);
      float *buf = malloc(t->nbytes);
      ZT_OK(zck_st_read(f, t, buf, 0, t->nbytes));
      if (memcmp(buf, r.params + sp[i].offset, t->nbytes)) ZT_FAIL("%s differs from the best checkpoint", sp[i].name);
      free(buf);
    }
    zck_st_close(f);
    free(sp);
    ze_train_result_free(&r);
  }
  free(tmp);
  return 0;
}
