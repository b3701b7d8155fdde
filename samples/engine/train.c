/* train.c: the training loop of zckpt-train: manifest, ZeRO plan, rank threads (see train.h). */
#include "train.h"

#include "ckpt.h"
#include "comm.h"
#include "data.h"
#include "dsconfig.h"
#include "generate.h"
#include "hf.h"
#include "io.h"
#include "launch.h"
#include "optim.h"
#include "util.h"
#include "zck_cuda.h"
#include "zero.h"
#include "zexec.h"
#include "cuda_engine.h"
#include "dzero.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ZE_MAX_RANKS 64

void ze_train_args_default(ze_train_args *a) {
  memset(a, 0, sizeof *a);
  a->model = (ze_gpt2_config){256, 64, 2, 4, 64};
  a->max_steps = 200;
  a->per_device_train_batch_size = 8;
  a->gradient_accumulation_steps = 1;
  a->learning_rate = 1e-3;
  a->weight_decay = 0.0;
  a->adam_beta1 = 0.9;
  a->adam_beta2 = 0.999;
  a->adam_epsilon = 1e-8;
  a->max_grad_norm = 1.0;
  a->lr_scheduler_type = "linear";
  a->seed = 42;
  a->logging_steps = 10;
  a->save_steps = 500;
  a->metric_for_best_model = "eval_loss";
  a->ranks = 1;
  a->device = "cpu";
  a->eval_samples = 32;
  a->prompt = "12+7=";
  a->gather_for_generation = ZE_GATHER_ON;
}

void ze_train_result_free(ze_train_result *r) {
  if (!r) return;
  free(r->losses);
  free(r->grad_norms);
  free(r->lrs);
  free(r->eval_losses);
  free(r->eval_steps_at);
  free(r->generated[0]);
  free(r->generated[1]);
  free(r->best_checkpoint);
  free(r->message);
  free(r->params);
  free(r->save_stalls);
  free(r->snapshot_seconds);
  free(r->snapshot_bytes);
  free(r->mem);
  free(r->mem_host);
  free(r->dev_workspace);
  free(r->dev_used_peak);
  memset(r, 0, sizeof *r);
}

// ---- the run shared by the rank threads

typedef struct ze_rank_thread {
  struct ze_run *run;
  zck_comm *comm;
  zck_comm *dcomm;             /* --device cuda with rank threads: this rank's handle of the
                                  device group; NULL otherwise */
  pthread_t thread;
  zck_status status;
  char msg[1024];
} ze_rank_thread;

typedef struct ze_run {
  const ze_train_args *a;
  ze_gpt2_config cfg;
  ze_param_spec *specs;
  size_t n_specs;
  zck_model *model;
  ze_ds_config ds;
  ze_zero_plan plan;
  ze_corpus corpus;
  float *init;                 /* initial fp32 weights, model order */
  int64_t warmup, first_step;
  ze_ckpt_state resume;        /* loaded when resuming */
  bool resuming;
  ze_train_result *res;
  ze_ckpt_tracker tracker;     /* saved checkpoints, best metric */
  bool one_rank;               /* this process runs one rank of a group (a->comm) */
  bool silent;                 /* no progress lines (--quiet, or not rank 0) */
  bool on_device;              /* --device cuda: ZeRO state and compute on the device */
} ze_run;

static void ze_log(const ze_run *run, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ze_log(const ze_run *run, const char *fmt, ...) {
  if (run->silent) return;
  va_list ap;
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double ze_train_lr(const ze_train_args *a, int64_t warmup, int64_t step) {
  if (!strcmp(a->lr_scheduler_type, "constant")) return a->learning_rate;
  if (!strcmp(a->lr_scheduler_type, "constant_with_warmup"))
    return a->learning_rate * (step < warmup ? (double)step / (double)(warmup > 1 ? warmup : 1) : 1.0);
  if (!strcmp(a->lr_scheduler_type, "cosine")) return a->learning_rate * ze_lr_cosine_factor(step, warmup, a->max_steps);
  return a->learning_rate * ze_lr_linear_factor(step, warmup, a->max_steps);
}

// ---- manifest: HF names, HF Trainer param groups

static bool frozen_by_args(const ze_train_args *a, const char *name) {
  for (int i = 0; i < a->n_freeze; i++)
    if (!strncmp(name, a->freeze[i], strlen(a->freeze[i]))) return true;
  return false;
}

/* torch.optim.AdamW param_group keys, in the order state_dict() shows them (torch 2.x),
 * plus initial_lr from the LambdaLR wrapping it. */
static zck_status add_group_hparams(zck_model *m, uint32_t g, const ze_train_args *a, double wd) {
  double betas[2] = {a->adam_beta1, a->adam_beta2};
  ZCK_TRY(zck_model_group_set_float(m, g, "weight_decay", wd));
  ZCK_TRY(zck_model_group_set_float(m, g, "lr", a->learning_rate));
  ZCK_TRY(zck_model_group_set_floats(m, g, "betas", betas, 2));
  ZCK_TRY(zck_model_group_set_float(m, g, "eps", a->adam_epsilon));
  ZCK_TRY(zck_model_group_set_bool(m, g, "amsgrad", false));
  ZCK_TRY(zck_model_group_set_bool(m, g, "maximize", false));
  ZCK_TRY(zck_model_group_set_none(m, g, "foreach"));
  ZCK_TRY(zck_model_group_set_bool(m, g, "capturable", false));
  ZCK_TRY(zck_model_group_set_bool(m, g, "differentiable", false));
  ZCK_TRY(zck_model_group_set_none(m, g, "fused"));
  ZCK_TRY(zck_model_group_set_bool(m, g, "decoupled_weight_decay", true));
  ZCK_TRY(zck_model_group_set_float(m, g, "initial_lr", a->learning_rate));
  return ZCK_OK;
}

zck_status ze_build_manifest(const ze_train_args *a, const ze_gpt2_config *cfg, bool one_group, zck_model **out) {
  *out = NULL;
  size_t n = ze_gpt2_n_tensors(cfg);
  ze_param_spec *specs = zck__calloc(n, sizeof *specs);
  zck_model *m = zck_model_new();
  if (!specs || !m) {
    free(specs);
    zck_model_free(m);
    return ZCK_ERR_NO_MEMORY;
  }
  ze_gpt2_param_specs(cfg, specs);
  zck_dtype lp = a->bf16 ? ZCK_BF16 : ZCK_F32;
  zck_status s = ZCK_OK;
  size_t n_trainable = 0;
  for (size_t i = 0; i < n && s == ZCK_OK; i++) {
    s = zck_model_add_param(m, specs[i].name, specs[i].ndim, specs[i].shape, lp, NULL);
    if (s == ZCK_OK && frozen_by_args(a, specs[i].name)) zck_model_set_frozen(m, (uint32_t)i, true);
    if (!frozen_by_args(a, specs[i].name)) n_trainable++;
  }
  /* lm_head.weight: in state_dict() (last), tied to transformer.wte.weight */
  uint32_t head = 0;
  int64_t head_shape[2] = {cfg->vocab_size, cfg->n_embd};
  if (s == ZCK_OK) s = zck_model_add_param(m, "lm_head.weight", 2, head_shape, lp, &head);
  if (s == ZCK_OK) s = zck_model_set_tied(m, head, 0);
  for (int f = 0; f < a->n_freeze && s == ZCK_OK; f++) {
    bool hit = false;
    for (size_t i = 0; i < n && !hit; i++) hit = !strncmp(specs[i].name, a->freeze[f], strlen(a->freeze[f]));
    if (!hit) s = zck__fail(ZCK_ERR_INVALID_ARG, "--freeze %s: no parameter name starts with it", a->freeze[f]);
  }
  if (s == ZCK_OK && !n_trainable) s = zck__fail(ZCK_ERR_INVALID_ARG, "--freeze: every parameter is frozen, nothing to train");
  /* HF Trainer: [decay params], [no-decay params] (trainable only; empty groups dropped as
   * DeepSpeed does). A DeepSpeed "optimizer" section: one group, decay on everything. */
  for (int pass = 0; pass < (one_group ? 1 : 2) && s == ZCK_OK; pass++) {
    uint32_t g = UINT32_MAX;
    for (size_t i = 0; i < n && s == ZCK_OK; i++) {
      if (m->params[i].frozen) continue;
      if (!one_group && specs[i].decay != (pass == 0)) continue;
      if (g == UINT32_MAX) {
        s = zck_model_add_group(m, &g);
        if (s == ZCK_OK) s = add_group_hparams(m, g, a, one_group || pass == 0 ? a->weight_decay : 0.0);
      }
      if (s == ZCK_OK) s = zck_model_group_add_param(m, g, (uint32_t)i);
    }
  }
  free(specs);
  if (s != ZCK_OK) {
    zck_model_free(m);
    return s;
  }
  *out = m;
  return ZCK_OK;
}

// ---- one rank

static zck_status rank_eval(ze_run *run, ze_zero_rank *zr, ze_exec *x, ze_gpt2_ws *ws, float *out_loss) {
  const ze_train_args *a = run->a;
  int T = run->cfg.max_seq_len, n = a->eval_samples, W = zr->comm->size;
  float *losses = zck__calloc((size_t)n, sizeof(float));
  int *win = zck__calloc((size_t)T + 1, sizeof(int));
  if (!losses || !win) {
    free(losses);
    free(win);
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory for evaluation");
  }
  /* each window's loss lands in its own slot; summing zeros is exact, so the result does
   * not depend on W. Stage 3 gathers collectively: every rank runs as many forwards (a rank
   * past the last window repeats window 0 and drops the loss). */
  bool z3 = zr->plan->o.stage == 3;
  zck_status s = ZCK_OK;
  for (int i0 = 0; i0 < n && s == ZCK_OK; i0 += W) {
    int i = i0 + zr->comm->rank;
    if (i >= n && !z3) break;
    ze_corpus_eval_window(&run->corpus, i < n ? i : 0, n, T, win);
    float loss = 0.0f;
    s = ze_exec_forward(x, ws, win, win + 1, 1, T, &loss);
    if (i < n) losses[i] = loss;
  }
  if (s == ZCK_OK) s = zr->comm->all_reduce(zr->comm, losses, losses, (size_t)n, ZCK_F32, ZCK_COMM_SUM);
  double sum = 0.0;
  for (int i = 0; i < n; i++) sum += losses[i];
  *out_loss = (float)(sum / n);
  free(losses);
  free(win);
  return s;
}

/* --dump-dir: the final weights and a logits probe, for checks against transformers. */
static zck_status ze_dump_weights(ze_run *run, const float *full, ze_gpt2_ws *ws) {
  const char *dir = run->a->dump_dir;
  int T = run->cfg.max_seq_len;
  ZCK_TRY_CTX(zck__mkdirs(dir), "--dump-dir");
  char *cfg = zck__path_join(dir, "config.json"), *model = zck__path_join(dir, "model.safetensors"),
       *probe = zck__path_join(dir, "probe.safetensors");
  int *win = zck__calloc((size_t)T + 1, sizeof(int));
  zck_status s = cfg && model && probe && win ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) s = ze_hf_write_config(cfg, &run->cfg, ZCK_F32);
  if (s == ZCK_OK) s = ze_hf_write_weights(model, &run->cfg, ze_hf_read_buffer, (void *)full, ZCK_F32);
  if (s == ZCK_OK) {
    ze_gpt2_params w;
    ze_gpt2_carve(&run->cfg, (float *)full, &w);
    ze_corpus_eval_window(&run->corpus, 0, run->a->eval_samples, T, win);
    float loss = ze_gpt2_forward(&run->cfg, &w, ws, win, win + 1, 1, T);
    s = ze_hf_write_probe(probe, &run->cfg, win, win + 1, T, ze_gpt2_logits(ws), loss);
  }
  free(cfg);
  free(model);
  free(probe);
  free(win);
  return s;
}

static void mem_parts(const ze_mem *mem, char *parts, size_t cap) {
  size_t o = 0;
  parts[0] = 0;
  for (int k = 0; k < ZE_MEM_KINDS; k++)
    if (mem->at_peak[k] && o < cap)
      o += (size_t)snprintf(parts + o, cap - o, "%s%s %.2f", o ? ", " : "", ze_mem_kind_name((ze_mem_kind)k),
                            (double)mem->at_peak[k] / 1048576.0);
}

static void log_memory(const ze_run *run, const ze_zero_rank *zr, int rank, uint64_t workspace) {
  char parts[512];
  mem_parts(&zr->mem, parts, sizeof parts);
  if (!zr->dev) {
    ze_log(run, "peak model-state memory per rank: %.2f MiB (rank %d, MiB at the peak: %s)",
           (double)zr->mem.peak / 1048576.0, rank, parts);
    return;
  }
  ze_log(run, "peak device memory per rank: %.2f MiB of model states (rank %d, MiB at the peak: %s) + %.2f MiB of "
              "activations",
         (double)zr->mem.peak / 1048576.0, rank, parts, (double)workspace / 1048576.0);
  if (zr->dev->host.peak) {
    mem_parts(&zr->dev->host, parts, sizeof parts);
    ze_log(run, "peak host memory of offloaded model states per rank: %.2f MiB (MiB at the peak: %s)",
           (double)zr->dev->host.peak / 1048576.0, parts);
  }
  if (zr->dev->used_peak)
    ze_log(run, "device memory in use (cudaMemGetInfo, the whole device %d): %.2f MiB at the highest sample",
           zr->dev->o.device, (double)zr->dev->used_peak / 1048576.0);
}

/* A zero_optimization count dsconfig.c has checked (a non-negative integer); def when
 * absent or null. (dsconfig.h has no fields for the stage-3 residency keys yet.) */
static uint64_t ds_count(const ze_run *run, const char *key, uint64_t def) {
  const cJSON *zo = cJSON_GetObjectItemCaseSensitive(run->ds.json, "zero_optimization");
  const cJSON *j = zo ? cJSON_GetObjectItemCaseSensitive(zo, key) : NULL;
  if (!j || !cJSON_IsNumber(j)) return def;
  return j->valuedouble >= 1.8e19 ? UINT64_MAX : (uint64_t)j->valuedouble;
}

/* The executor's keys, DeepSpeed's defaults where the config has none. */
static void exec_opts(const ze_run *run, ze_exec_opts *xo) {
  memset(xo, 0, sizeof *xo);
  xo->prefetch_bucket_size = run->ds.prefetch_bucket_size;
  xo->max_live_parameters = run->ds.max_live_parameters;
  xo->persistence_threshold = ds_count(run, "stage3_param_persistence_threshold", 100000);
  xo->model_persistence_threshold = ds_count(run, "stage3_model_persistence_threshold", UINT64_MAX);
  xo->max_reuse_distance = ds_count(run, "stage3_max_reuse_distance", 1000000000);
  xo->overlap_comm = run->ds.overlap_comm;
}

/* A rank's batch buffers: token windows, inputs and targets of a micro-batch, and every
 * rank's micro-batch losses. */
typedef struct rank_batch {
  int *tok, *inputs, *targets;
  float *micro;
} rank_batch;

/* One optimizer step of rank rt: its micro-batches forward and backward, the loss averaged
 * over every rank's, the gradient norm and AdamW at learning rate lr. */
static zck_status rank_step(ze_rank_thread *rt, ze_zero_rank *zr, ze_exec *x, ze_gpt2_ws *ws, rank_batch *bb,
                            int64_t step, double lr, float *loss, double *norm) {
  ze_run *run = rt->run;
  const ze_train_args *a = run->a;
  zck_comm *comm = rt->comm;
  int r = comm->rank, W = comm->size;
  int B = a->per_device_train_batch_size, GAS = a->gradient_accumulation_steps, T = run->cfg.max_seq_len;
  int64_t G = (int64_t)W * B * GAS;
  float *micro = bb->micro;
  memset(micro, 0, (size_t)GAS * W * sizeof *micro);
  for (int m = 0; m < GAS; m++) {
    /* sample k of the global batch of step `step` goes to rank (k / B) % W, micro-batch
     * k / (B W): every W sees the same samples in each optimizer step */
    for (int b = 0; b < B; b++) {
      uint64_t k = (uint64_t)(step * G + ((int64_t)m * W + r) * B + b);
      int *win = bb->tok + (size_t)b * (T + 1);
      ze_corpus_train_window(&run->corpus, k, T, win);
      memcpy(bb->inputs + (size_t)b * T, win, (size_t)T * sizeof(int));
      memcpy(bb->targets + (size_t)b * T, win + 1, (size_t)T * sizeof(int));
    }
    float scale = 1.0f / (float)GAS;
    ZCK_TRY(ze_exec_train_micro(x, ws, bb->inputs, bb->targets, B, T, scale, m == GAS - 1, &micro[m * W + r]));
  }
  ZCK_TRY(comm->all_reduce(comm, micro, micro, (size_t)GAS * W, ZCK_F32, ZCK_COMM_SUM));
  double sum = 0.0;
  for (int i = 0; i < GAS * W; i++) sum += micro[i];
  *loss = (float)(sum / (GAS * W));
  ZCK_TRY(ze_zero_grad_norm(zr, norm));
  ze_adamw_hp hp = {lr, a->adam_beta1, a->adam_beta2, a->adam_epsilon, 0.0};
  ZCK_TRY(ze_zero_step(zr, &hp, ze_clip_factor(*norm, a->max_grad_norm)));
  if (zr->dev) ze_dzero_sample(zr->dev);
  return ZCK_OK;
}

/* What a run makes of its final weights, after training: kept for the caller, dumped, text
 * generated, held-out sums (every rank takes part: stage 3 gathers). */
static zck_status rank_outputs(ze_rank_thread *rt, ze_zero_rank *zr, ze_exec *x, ze_gpt2_ws *ws) {
  ze_run *run = rt->run;
  const ze_train_args *a = run->a;
  int r = rt->comm->rank;
  bool lead = r == 0, keeper = lead || run->one_rank;
  zck_status s = ZCK_OK;
  float *full = NULL; /* the final weights (exports) */
  if (a->keep_params || a->dump_dir) {
    full = zck__malloc(run->plan.model_numel * sizeof(float));
    if (!full) return zck__fail(ZCK_ERR_NO_MEMORY, "rank %d: out of memory for the final weights", r);
    ZCK_CHECK_GOTO(ze_exec_full_params(x, full), s, done);
  }
  if (keeper && a->keep_params) {
    run->res->params = full;
    run->res->n_params = run->plan.model_numel;
    full = NULL;
  }
  if (lead && a->dump_dir) ZCK_CHECK_GOTO(ze_dump_weights(run, run->res->params ? run->res->params : full, ws), s, done);
  if (a->generate_tokens > 0) {
    int modes[2], n_modes = 0;
    if (a->gather_for_generation != ZE_GATHER_OFF) modes[n_modes++] = 0;
    if (a->gather_for_generation != ZE_GATHER_ON) modes[n_modes++] = 1;
    for (int i = 0; i < n_modes; i++) {
      int md = modes[i];
      char *text = NULL;
      double secs = 0;
      size_t peak = 0;
      ZCK_CHECK_GOTO(ze_generate(&run->cfg, zr, md == 0, a->prompt, a->generate_tokens, &text, &secs, &peak), s, done);
      if (lead) {
        run->res->generated[md] = text;
        run->res->gen_seconds[md] = secs;
        run->res->gen_peak_bytes[md] = peak;
        ze_log(run, "generate (gather_for_generation=%s): %.2f ms, peak gathered parameters %.1f KiB",
               md == 0 ? "on" : "off", 1e3 * secs, (double)peak / 1024.0);
      } else {
        free(text);
      }
    }
  }
  if (a->eval_sums > 0) {
    int right = 0;
    char ex[256];
    ZCK_CHECK_GOTO(ze_eval_sums(&run->cfg, zr, &run->corpus, a->eval_sums, (uint64_t)a->seed, &right, ex, sizeof ex),
                   s, done);
    if (lead) ze_log(run, "held-out sums: %d/%d right (prompts 'a+b=' not in the training text; %s ...)", right,
                     a->eval_sums, ex);
  }
done:
  free(full);
  return s;
}

/* The end of training: the final evaluation, the last save on the disk, the best model
 * reloaded (and exported), and the memory the training took. */
static zck_status rank_finish(ze_rank_thread *rt, ze_zero_rank *zr, ze_cuda_rank *cr, ze_exec *x, ze_gpt2_ws *ws) {
  ze_run *run = rt->run;
  const ze_train_args *a = run->a;
  int r = rt->comm->rank;
  bool lead = r == 0, keeper = lead || run->one_rank;
  float final_eval;
  ZCK_TRY(rank_eval(run, zr, x, ws, &final_eval));
  if (keeper) {
    run->res->final_eval_loss = final_eval;
    ze_log(run, "final eval_loss %.6f", final_eval);
  }
  /* --async-save: the last save is written (and its failure every rank's) before the run
   * reads checkpoints back or ends */
  ZCK_TRY(ze_ckpt_flush(&run->tracker, zr));
  if (a->load_best_model_at_end && run->tracker.sv.best_checkpoint) {
    ZCK_TRY(ze_ckpt_load_best(&run->tracker, zr));
    if (lead) {
      ze_log(run, "loaded the best model from %s", run->tracker.sv.best_checkpoint);
      ZCK_TRY(ze_ckpt_export_best(&run->tracker));
      ze_log(run, "wrote the best model to %s/model.safetensors", a->output_dir);
    }
  }
  /* the peak of training (steps, evaluations, saves, the best-model reload); what follows
   * (exports, generation) is not training */
  run->res->mem[r] = zr->mem;
  if (zr->dev) {
    if (keeper) run->res->mem_on_device = true; /* one writer (the ranks' threads share res) */
    run->res->mem_host[r] = zr->dev->host;
    run->res->dev_workspace[r] = cr->model ? zck_cuda_gpt2_ws_bytes(cr->model) : 0;
    run->res->dev_used_peak[r] = zr->dev->used_peak;
  }
  if (lead) log_memory(run, zr, r, cr->model ? zck_cuda_gpt2_ws_bytes(cr->model) : 0);
  return ZCK_OK;
}

static zck_status rank_loop(ze_rank_thread *rt, ze_zero_rank *zr, ze_cuda_rank *cr) {
  ze_run *run = rt->run;
  const ze_train_args *a = run->a;
  zck_comm *comm = rt->comm;
  int r = comm->rank, W = comm->size;
  int B = a->per_device_train_batch_size, GAS = a->gradient_accumulation_steps, T = run->cfg.max_seq_len;
  /* lead: rank 0, which prints and writes the shared files; keeper: the rank that keeps
   * the results and the tracker's bookkeeping of its process (rank 0 when the ranks are
   * threads, every rank when each is a process) */
  bool lead = r == 0, keeper = lead || run->one_rank;
  zck_status s = ZCK_OK;
  ze_exec *x = NULL;
  ze_exec_opts xo;
  exec_opts(run, &xo);
  ze_gpt2_ws *ws = ze_gpt2_ws_new(&run->cfg, B, T);
  rank_batch bb = {zck__calloc((size_t)B * (T + 1), sizeof(int)), zck__calloc((size_t)B * T, sizeof(int)),
                   zck__calloc((size_t)B * T, sizeof(int)), zck__calloc((size_t)GAS * W, sizeof(float))};
  if (!ws || !bb.tok || !bb.inputs || !bb.targets || !bb.micro) {
    s = zck__fail(ZCK_ERR_NO_MEMORY, "rank %d: out of memory for activations", r);
    goto done;
  }
  ZCK_CHECK_GOTO(ze_exec_new(&run->cfg, zr, &xo, &x), s, done);
  if (lead && run->ds.stage == 3) {
    const ze_exec_stats *st = ze_exec_get_stats(x);
    ze_log(run, "stage 3: %zu persistent tensors (%llu elements, stage3_param_persistence_threshold %llu) stay "
                "gathered; stage3_max_reuse_distance %llu",
           st->persistent_tensors, (unsigned long long)st->persistent_numel,
           (unsigned long long)xo.persistence_threshold, (unsigned long long)xo.max_reuse_distance);
  }
  /* --device cuda: the kernels run the modules; (sim: the CPU's over the simulated memory) */
  if (cr->model) ze_exec_set_driver(x, ze_cuda_driver(cr));
  double t_log = now_seconds(), loss_acc = 0.0, t_loop = t_log;
  int64_t n_acc = 0;
  for (int64_t step = run->first_step; step < a->max_steps; step++) {
    ze_test_kill_point(comm, step + 1, false);
    double lr = ze_train_lr(a, run->warmup, step);
    float loss;
    double norm;
    ZCK_CHECK_GOTO(rank_step(rt, zr, x, ws, &bb, step, lr, &loss, &norm), s, done);
    int64_t global = step + 1, i = step - run->first_step;
    if (keeper) {
      run->res->losses[i] = loss;
      run->res->grad_norms[i] = norm;
      run->res->lrs[i] = lr;
      run->res->steps = i + 1;
    }
    loss_acc += loss;
    n_acc++;
    if (keeper && a->logging_steps > 0 && (global % a->logging_steps == 0 || global == a->max_steps)) {
      double t = now_seconds();
      /* HF logs the rate after the scheduler's step (the one the next step uses), in the
       * console and in trainer_state.json alike: one value for both */
      double logged_lr = ze_train_lr(a, run->warmup, global);
      ze_log(run, "step %lld/%lld | loss %.6f | grad_norm %.4f | lr %.4e | %.1f ms/step", (long long)global,
             (long long)a->max_steps, loss_acc / (double)n_acc, norm, logged_lr, 1e3 * (t - t_log) / (double)n_acc);
      zck_saver_log(&run->tracker.sv, global, "loss", loss_acc / (double)n_acc, norm, logged_lr);
      t_log = t;
      loss_acc = 0.0;
      n_acc = 0;
    }
    bool do_eval = a->eval_steps > 0 && global % a->eval_steps == 0;
    if (do_eval) {
      float el;
      ZCK_CHECK_GOTO(rank_eval(run, zr, x, ws, &el), s, done);
      if (keeper) {
        run->res->eval_losses[run->res->n_eval] = el;
        run->res->eval_steps_at[run->res->n_eval++] = global;
        ze_log(run, "eval step %lld | eval_loss %.6f", (long long)global, el);
        zck_saver_log_eval(&run->tracker.sv, global, el);
      }
    }
    if (zck_saver_due(&run->tracker.sv, global)) {
      double t0 = now_seconds();
      ZCK_CHECK_GOTO(ze_ckpt_save(&run->tracker, zr, global), s, done);
      if (lead) {
        double dt = now_seconds() - t0;
        run->res->snapshot_seconds[run->res->n_saves] = run->tracker.snapshot_seconds;
        run->res->save_stalls[run->res->n_saves++] = dt;
        run->res->save_stall_seconds += dt;
        if (dt > run->res->save_stall_max) run->res->save_stall_max = dt;
      }
    }
  }
  if (lead) run->res->loop_seconds = now_seconds() - t_loop;
  ZCK_CHECK_GOTO(rank_finish(rt, zr, cr, x, ws), s, done);
  ZCK_CHECK_GOTO(rank_outputs(rt, zr, x, ws), s, done);
done:
  ze_exec_free(x);
  ze_gpt2_ws_free(ws);
  free(bb.tok);
  free(bb.inputs);
  free(bb.targets);
  free(bb.micro);
  return s;
}

/* The rank's ZeRO state: host memory, or (--device cuda) the device with its context. */
static zck_status rank_state_init(ze_rank_thread *rt, ze_zero_rank *zr, ze_cuda_rank *cr) {
  ze_run *run = rt->run;
  const ze_train_args *a = run->a;
  if (!run->on_device) return ze_zero_rank_init(zr, &run->plan, rt->comm, run->init);
  ze_dzero_opts o = {&ze_dev_ops_sim,
                     NULL,
                     rt->dcomm ? rt->dcomm : rt->comm,
                     0,
                     run->ds.offload_optimizer,
                     run->ds.offload_optimizer_pin,
                     run->ds.offload_param,
                     run->ds.offload_param_pin,
                     run->ds.gather16_bucket_elems * zck_dtype_size(run->plan.o.lp_dtype),
                     run->ds.overlap_comm,
                     0};
  if (!a->sim_device) {
    ZCK_TRY(ze_cuda_rank_init(cr, &run->cfg, rt->dcomm, run->one_rank ? rt->comm : NULL, a->local_rank,
                              a->per_device_train_batch_size, run->cfg.max_seq_len));
    o.ops = &ze_dev_ops_cuda;
    o.ctx = cr->ctx;
    o.comm = cr->dcomm;
    o.device = cr->device;
  }
  ze_dzero *d = NULL;
  ZCK_TRY(ze_dzero_new(&o, run->plan.o.stage, &d));
  return ze_zero_rank_init_dev(zr, &run->plan, rt->comm, d, run->init);
}

static void *rank_main(void *arg) {
  ze_rank_thread *rt = arg;
  ze_run *run = rt->run;
  ze_zero_rank zr;
  ze_cuda_rank cr;
  memset(&zr, 0, sizeof zr);
  memset(&cr, 0, sizeof cr);
  zck_status s = rank_state_init(rt, &zr, &cr);
  if (s == ZCK_OK) s = ze_ckpt_rank_start(&run->tracker, &zr);
  if (s == ZCK_OK && run->resuming) {
    s = ze_ckpt_restore_rank(&run->tracker, &run->resume, &zr);
    /* once every rank holds its state, the checkpoint (and a temporary reshard of it) is
     * let go: a run killed later leaves no reshard behind */
    if (s == ZCK_OK) s = rt->comm->barrier(rt->comm);
    if (s == ZCK_OK && (run->one_rank || zr.rank == 0)) ze_ckpt_state_free(&run->resume);
  }
  if (s == ZCK_OK) s = rank_loop(rt, &zr, &cr);
  rt->status = s;
  if (s != ZCK_OK) {
    snprintf(rt->msg, sizeof rt->msg, "%s", zck_last_error());
    rt->comm->abort(rt->comm);
    zck_comm *dc = rt->dcomm ? rt->dcomm : cr.dcomm;
    if (dc) dc->abort(dc);
  }
  ze_ckpt_rank_end(&run->tracker, &zr); /* the snapshot's page-locked staging, before the device */
  ze_zero_rank_free(&zr); /* zeroed by init, also when init failed */
  ze_cuda_rank_free(&cr); /* after the state, whose frees it waits for */
  return NULL;
}

// ---- the run

zck_status ze_train_check_args(const ze_train_args *a) {
  char why[128];
  ZCK_FAIL_IF(!ze_gpt2_config_valid(&a->model, why, sizeof why), ZCK_ERR_INVALID_ARG, "model: %s", why);
  ZCK_FAIL_IF(a->model.vocab_size < 256, ZCK_ERR_INVALID_ARG, "model: the byte-level vocabulary needs 256 entries");
  ZCK_FAIL_IF(a->ranks < 1 || a->ranks > ZE_MAX_RANKS, ZCK_ERR_INVALID_ARG, "--ranks %d: must be in [1, %d]",
              a->ranks, ZE_MAX_RANKS);
  ZCK_FAIL_IF(a->comm && a->ranks != 1, ZCK_ERR_INVALID_ARG,
              "--ranks %d: this process is rank %d of %d processes (under mpirun); --ranks (threads) "
              "cannot be combined with it",
              a->ranks, a->comm->rank, a->comm->size);
  ZCK_FAIL_IF(a->max_steps < 1, ZCK_ERR_INVALID_ARG, "--max-steps must be positive");
  ZCK_FAIL_IF(a->per_device_train_batch_size < 1 || a->gradient_accumulation_steps < 1, ZCK_ERR_INVALID_ARG,
              "batch size and gradient accumulation steps must be positive");
  ZCK_FAIL_IF(a->eval_samples < 1, ZCK_ERR_INVALID_ARG, "--eval-samples must be positive");
  ZCK_FAIL_IF(a->corpus_bytes < 0 || a->corpus_bytes > (1 << 30), ZCK_ERR_INVALID_ARG,
              "--corpus-bytes must be in [0, 1 GiB]");
  ZCK_FAIL_IF(a->eval_sums < 0 || a->eval_sums > 1000, ZCK_ERR_INVALID_ARG, "--eval-sums must be in [0, 1000]");
  ZCK_FAIL_IF(strcmp(a->lr_scheduler_type, "linear") && strcmp(a->lr_scheduler_type, "cosine") &&
                  strcmp(a->lr_scheduler_type, "constant") && strcmp(a->lr_scheduler_type, "constant_with_warmup"),
              ZCK_ERR_INVALID_ARG, "--lr-scheduler-type %s: supported: linear, cosine, constant, constant_with_warmup",
              a->lr_scheduler_type);
  ZCK_FAIL_IF(strcmp(a->metric_for_best_model, "eval_loss") && strcmp(a->metric_for_best_model, "loss"),
              ZCK_ERR_INVALID_ARG, "--metric-for-best-model %s: only eval_loss is computed", a->metric_for_best_model);
  /* HF's rule (create_accelerator_and_postprocess): without DeepSpeed state there is
   * nothing to reload */
  ZCK_FAIL_IF(a->save_only_model && a->load_best_model_at_end, ZCK_ERR_INVALID_ARG,
              "DeepSpeed can't be used with `save_only_model` along with `load_best_model_at_end`.");
  if (a->load_best_model_at_end) {
    ZCK_FAIL_IF(a->eval_steps <= 0, ZCK_ERR_INVALID_ARG, "--load-best-model-at-end needs --eval-steps");
    ZCK_FAIL_IF(!a->output_dir || a->save_steps <= 0, ZCK_ERR_INVALID_ARG,
                "--load-best-model-at-end needs --output-dir and --save-steps");
    ZCK_FAIL_IF(a->save_steps % a->eval_steps, ZCK_ERR_INVALID_ARG,
                "--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation "
                "steps, but found %lld, which is not a round multiple of %lld.",
                (long long)a->save_steps, (long long)a->eval_steps);
  }
  ZCK_FAIL_IF(strcmp(a->device, "cpu") && strcmp(a->device, "cuda"), ZCK_ERR_INVALID_ARG,
              "--device %s: must be cpu or cuda", a->device);
  return ZCK_OK;
}

static void run_free(ze_run *run) {
  ze_ckpt_tracker_free(&run->tracker);
  ze_ckpt_state_free(&run->resume);
  ze_zero_plan_free(&run->plan);
  zck_model_free(run->model);
  ze_ds_config_free(&run->ds);
  ze_corpus_free(&run->corpus);
  free(run->init);
  free(run->specs);
}

/* Everything a run needs before its ranks start: the DeepSpeed config, the manifest, the
 * ZeRO plan, the corpus, the initial weights and the checkpoint tracker. */
static zck_status run_setup(ze_run *run, const ze_train_args *a, int W) {
  run->on_device = !strcmp(a->device, "cuda");
  if (run->on_device && !a->sim_device) ZCK_TRY(ze_cuda_check());
  /* DeepSpeed config: given, or the one a plain run amounts to */
  zck_status s;
  if (a->deepspeed)
    s = ze_ds_config_load(a->deepspeed, a, &run->ds);
  else
    s = ze_ds_config_default(a, a->zero_stage ? a->zero_stage : 2, &run->ds);
  if (s != ZCK_OK) return s;
  ZCK_TRY(ze_build_manifest(a, &run->cfg, run->ds.has_optimizer, &run->model));
  run->n_specs = ze_gpt2_n_tensors(&run->cfg);
  run->specs = zck__calloc(run->n_specs, sizeof *run->specs);
  uint64_t *model_off = zck__calloc(run->model->n_params, sizeof *model_off);
  size_t model_numel = ze_gpt2_numel(&run->cfg);
  run->init = zck__calloc(model_numel, sizeof(float));
  if (!run->specs || !model_off || !run->init) {
    free(model_off);
    return ZCK_ERR_NO_MEMORY;
  }
  ze_gpt2_param_specs(&run->cfg, run->specs);
  for (size_t i = 0; i < run->n_specs; i++) model_off[i] = run->specs[i].offset;
  model_off[run->n_specs] = 0; /* lm_head.weight -> wte */
  ze_zero_opts zo = {run->ds.stage,
                     (uint32_t)W,
                     a->bf16 ? ZCK_BF16 : ZCK_F32,
                     run->ds.sub_group_size,
                     run->ds.reduce_bucket_size,
                     run->ds.allgather_bucket_size};
  s = ze_zero_plan_build(&run->plan, run->model, model_off, model_numel, &zo);
  free(model_off);
  if (s != ZCK_OK) return s;
  size_t T = (size_t)run->cfg.max_seq_len;
  if (!ze_corpus_make(&run->corpus, a->seed, (a->corpus_bytes ? (size_t)a->corpus_bytes : 32 * 1024) + 8 * T,
                      4 * 1024 + 8 * T, a->reverse_sums))
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory for the corpus");
  ze_gpt2_init(&run->cfg, run->init, a->seed);
  run->warmup = a->warmup_steps > 0 ? a->warmup_steps : (int64_t)ceil((double)a->max_steps * a->warmup_ratio);
  s = ze_ckpt_tracker_init(&run->tracker, a, &run->cfg, run->model, &run->plan, run->ds.json, run->ds.gather_16bit_on_save,
                           run->one_rank || a->per_rank_io, run->one_rank, a->async_save || run->ds.async_save);
  if (s == ZCK_ERR_UNSUPPORTED && (a->async_save || run->ds.async_save))
    s = zck__error_prepend(s, "%s", a->async_save ? "--async-save" : "checkpoint.writer.decoupled");
  return s;
}

/* The result's per-step and per-rank arrays. */
static zck_status results_alloc(const ze_run *run, ze_train_result *res, int W) {
  const ze_train_args *a = run->a;
  res->async_save = run->tracker.sv.tr.async_save;
  int64_t n_steps = a->max_steps - run->first_step;
  size_t n_evals = a->eval_steps > 0 ? (size_t)(a->max_steps / a->eval_steps) + 1 : 1;
  res->first_step = run->first_step;
  res->losses = zck__calloc((size_t)n_steps, sizeof *res->losses);
  res->grad_norms = zck__calloc((size_t)n_steps, sizeof *res->grad_norms);
  res->lrs = zck__calloc((size_t)n_steps, sizeof *res->lrs);
  res->eval_losses = zck__calloc(n_evals, sizeof *res->eval_losses);
  res->eval_steps_at = zck__calloc(n_evals, sizeof *res->eval_steps_at);
  res->mem = zck__calloc((size_t)W, sizeof *res->mem);
  res->n_mem = (size_t)W;
  res->mem_host = zck__calloc((size_t)W, sizeof *res->mem_host);
  res->dev_workspace = zck__calloc((size_t)W, sizeof *res->dev_workspace);
  res->dev_used_peak = zck__calloc((size_t)W, sizeof *res->dev_used_peak);
  res->save_stalls = zck__calloc((size_t)n_steps + 1, sizeof *res->save_stalls);
  res->snapshot_seconds = zck__calloc((size_t)n_steps + 1, sizeof *res->snapshot_seconds);
  res->snapshot_bytes = zck__calloc((size_t)W, sizeof *res->snapshot_bytes);
  if (!res->losses || !res->grad_norms || !res->lrs || !res->eval_losses || !res->eval_steps_at || !res->mem ||
      !res->mem_host || !res->dev_workspace || !res->dev_used_peak || !res->save_stalls || !res->snapshot_seconds ||
      !res->snapshot_bytes)
    return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory for the results");
  return ZCK_OK;
}

/* The run's banner, and what the config's settings change (or not) on this device. */
static void log_banner(ze_run *run, int W) {
  const ze_train_args *a = run->a;
  ze_log(run,
         "zckpt-train: GPT-2 L=%d H=%d C=%d T=%d V=%d (%zu parameters) | ZeRO-%d on %d rank%s (%s) | %s | "
         "global batch %d x %d tokens | matmuls: %s",
         run->cfg.n_layer, run->cfg.n_head, run->cfg.n_embd, run->cfg.max_seq_len, run->cfg.vocab_size,
         run->plan.model_numel, run->ds.stage, W, W > 1 ? "s" : "", run->one_rank ? "a process each" : "local threads",
         a->bf16 ? "bf16" : "fp32",
         W * a->per_device_train_batch_size * a->gradient_accumulation_steps, run->cfg.max_seq_len,
         run->on_device ? "the device's" : ze_gpt2_matmul_backend());
  bool cuda = run->on_device;
  if (run->ds.offload_param && run->ds.stage < 3)
    ze_log(run, "zero_optimization.offload_param applies to ZeRO stage 3 only: DeepSpeed ignores it at stage %d, "
                "and so does zckpt-train", run->ds.stage);
  if (!cuda && (run->ds.offload_optimizer || (run->ds.offload_param && run->ds.stage == 3)))
    ze_log(run, "offload to cpu: every rank's model states already live in host memory on --device cpu; "
                "offloading (and pin_memory) changes nothing");
  if (cuda && run->ds.offload_optimizer)
    ze_log(run, "offload_optimizer: fp32 masters, moments and gradient partitions in %shost memory, AdamW on the "
                "CPU; the 16-bit params stay on the device",
           run->ds.offload_optimizer_pin ? "page-locked " : "");
  if (cuda && run->ds.offload_param && run->ds.stage == 3)
    ze_log(run, "offload_param: the 16-bit partitions in %shost memory, copied to the device module by module",
           run->ds.offload_param_pin ? "page-locked " : "");
  if (run->ds.overlap_comm && run->ds.overlap_comm_given)
    ze_log(run, cuda ? "overlap_comm: stage-3 gathers (the prefetch of the next modules before the current one "
                       "computes) and stage 2/3 gradient reductions run on a second stream of each rank, the compute "
                       "stream waits for each one's event just before it needs the result"
                     : "overlap_comm: the collectives run in each rank's own thread, one after the other (no overlap "
                       "on --device cpu)");
  if (run->resuming)
    ze_log(run, "resuming from %s at step %lld", a->resume_from_checkpoint, (long long)run->first_step);
}

/* The ranks as threads of this process, each with its own comm (and device comm): run to
 * the end, the first real failure reported. */
static zck_status run_threads(ze_run *run, ze_train_result *res, int W) {
  const ze_train_args *a = run->a;
  zck_comm *comms[ZE_MAX_RANKS] = {0};
  ze_rank_thread threads[ZE_MAX_RANKS];
  ZCK_TRY(zck_comm_local_create(W, comms));
  /* --device cuda: a second group for the collectives on device memory */
  zck_comm *dcomms[ZE_MAX_RANKS] = {0};
  zck_status s = ZCK_OK;
  if (run->on_device) {
    s = a->sim_device ? zck_comm_local_create(W, dcomms) : zck_comm_nccl_create_local(W, dcomms);
    if (s != ZCK_OK) {
      zck_comm_local_destroy(comms, W);
      return s;
    }
  }
  int started = 0;
  for (int r = 0; r < W; r++) {
    threads[r] = (ze_rank_thread){run, comms[r], dcomms[r], 0, ZCK_OK, ""};
    if (pthread_create(&threads[r].thread, NULL, rank_main, &threads[r])) {
      s = zck__fail(ZCK_ERR_INTERNAL, "cannot start rank thread %d", r);
      comms[0]->abort(comms[0]);
      if (dcomms[0]) dcomms[0]->abort(dcomms[0]);
      break;
    }
    started++;
  }
  for (int r = 0; r < started; r++) pthread_join(threads[r].thread, NULL);
  /* a run that stopped with a save still being written (a rank failed after it started):
   * that save ends first, and its own failure is not dropped */
  zck_status wr = zck_saver_drain(&run->tracker.sv);
  char wmsg[1024] = "";
  if (wr != ZCK_OK) snprintf(wmsg, sizeof wmsg, "%s", zck_last_error());
  zck_comm_local_destroy(comms, W);
  if (run->on_device && a->sim_device)
    zck_comm_local_destroy(dcomms, W);
  else if (run->on_device)
    zck_comm_nccl_destroy_local(dcomms, W);
  if (s == ZCK_OK) {
    /* report the first real failure, not the "another rank failed" of the others */
    int pick = -1;
    for (int r = 0; r < W; r++)
      if (threads[r].status != ZCK_OK && (pick < 0 || (threads[pick].status == ZCK_ERR_INTERNAL &&
                                                       strstr(threads[pick].msg, "another rank failed"))))
        pick = r;
    if (pick >= 0 && wr != ZCK_OK)
      s = zck__fail(threads[pick].status, "%s (and the %s)", threads[pick].msg, wmsg);
    else if (pick >= 0)
      s = zck__fail(threads[pick].status, "%s", threads[pick].msg);
    else if (wr != ZCK_OK)
      s = zck__fail(wr, "%s", wmsg);
  }
  if (s == ZCK_OK && run->tracker.sv.best_checkpoint) res->best_checkpoint = zck__strdup(run->tracker.sv.best_checkpoint);
  for (int r = 0; s == ZCK_OK && r < W; r++) res->snapshot_bytes[r] = ze_ckpt_snapshot_bytes(&run->tracker, r);
  return s;
}

zck_status ze_train_run(const ze_train_args *a, ze_train_result *res) {
  memset(res, 0, sizeof *res);
  zck_comm_agree_reset();
  ZCK_TRY(ze_train_check_args(a));
  ze_run run;
  memset(&run, 0, sizeof run);
  run.a = a;
  run.res = res;
  run.cfg = a->model;
  /* one rank of a group of processes: every setup step ends in an agreement, so a failure
   * on one rank stops all of them at the same point */
  run.one_rank = a->comm != NULL;
  run.silent = a->quiet || (run.one_rank && a->comm->rank != 0);
  int W = ze_train_world(a);
  zck_status s = run_setup(&run, a, W);
  if (run.one_rank) s = zck_comm_agree(a->comm, s);
  if (s != ZCK_OK) goto done;
  if (a->resume_from_checkpoint) {
    ZCK_CHECK_GOTO(ze_ckpt_load(&run.tracker, a->resume_from_checkpoint, &run.resume, a->comm), s, done);
    if (run.resume.resharded) ze_test_kill_after_reshard(run.resume.global_step);
    run.resuming = true;
    run.first_step = run.resume.global_step;
    if (run.first_step >= a->max_steps) {
      s = zck__fail(ZCK_ERR_INVALID_ARG, "%s: the checkpoint is at step %lld, not before --max-steps %lld",
                    a->resume_from_checkpoint, (long long)run.first_step, (long long)a->max_steps);
      goto done;
    }
  }
  s = results_alloc(&run, res, W);
  if (run.one_rank) s = zck_comm_agree(a->comm, s);
  if (s != ZCK_OK) goto done;

  log_banner(&run, W);
  if (run.one_rank) {
    /* this thread is the one rank */
    ze_rank_thread rt = {&run, a->comm, NULL, 0, ZCK_OK, ""};
    rank_main(&rt);
    if (rt.status != ZCK_OK) s = zck__fail(rt.status, "%s", rt.msg);
    if (s == ZCK_OK && run.tracker.sv.best_checkpoint) res->best_checkpoint = zck__strdup(run.tracker.sv.best_checkpoint);
    goto done;
  }
  s = run_threads(&run, res, W);
done:
  if (s != ZCK_OK) {
    ze_train_result_free(res);
    if (run.ds.message) res->message = zck__strdup(run.ds.message);
  }
  run_free(&run);
  return s;
}
