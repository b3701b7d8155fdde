/* args.c: one table of options, parsed strictly (a bad number or a missing value is a
 * usage error naming the option). */
#include "args.h"

#include "zck.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum { OPT_INT, OPT_I64, OPT_U64, OPT_DOUBLE, OPT_STR, OPT_BOOL, OPT_SPECIAL } opt_kind;

typedef struct opt {
  const char *name;   /* without the leading dashes, '-' separated */
  opt_kind kind;
  size_t off;         /* offset in ze_train_args */
  const char *help;
} opt;

#define OFF(f) offsetof(ze_train_args, f)

static const opt opts[] = {
  /* TrainingArguments */
  {"output-dir", OPT_STR, OFF(output_dir), "where checkpoint-<step>/ folders go (default: save nothing)"},
  {"max-steps", OPT_I64, OFF(max_steps), "optimizer steps (default 200)"},
  {"per-device-train-batch-size", OPT_INT, OFF(per_device_train_batch_size), "sequences per rank per micro-batch (8)"},
  {"gradient-accumulation-steps", OPT_INT, OFF(gradient_accumulation_steps), "micro-batches per step (1)"},
  {"learning-rate", OPT_DOUBLE, OFF(learning_rate), "peak learning rate (1e-3)"},
  {"weight-decay", OPT_DOUBLE, OFF(weight_decay), "AdamW decoupled weight decay of the decay group (0)"},
  {"adam-beta1", OPT_DOUBLE, OFF(adam_beta1), "(0.9)"},
  {"adam-beta2", OPT_DOUBLE, OFF(adam_beta2), "(0.999)"},
  {"adam-epsilon", OPT_DOUBLE, OFF(adam_epsilon), "(1e-8)"},
  {"max-grad-norm", OPT_DOUBLE, OFF(max_grad_norm), "clip gradients to this global norm; 0: off (1.0)"},
  {"warmup-steps", OPT_I64, OFF(warmup_steps), "linear warmup steps (0)"},
  {"warmup-ratio", OPT_DOUBLE, OFF(warmup_ratio), "warmup as a fraction of max-steps when warmup-steps is 0"},
  {"lr-scheduler-type", OPT_STR, OFF(lr_scheduler_type), "linear | cosine | constant | constant_with_warmup (linear)"},
  {"seed", OPT_U64, OFF(seed), "initialisation and data seed (42)"},
  {"bf16", OPT_BOOL, OFF(bf16), "bf16 mixed precision: fp32 masters, bf16 weights in forward"},
  {"logging-steps", OPT_I64, OFF(logging_steps), "a progress line every N steps (10)"},
  {"eval-steps", OPT_I64, OFF(eval_steps), "evaluate every N steps (0: only at the end)"},
  {"save-steps", OPT_I64, OFF(save_steps), "save every N steps (0: none) and at the end, with --output-dir (500)"},
  {"save-total-limit", OPT_I64, OFF(save_total_limit), "keep at most N checkpoints (the best is kept)"},
  {"load-best-model-at-end", OPT_BOOL, OFF(load_best_model_at_end), "reload the best checkpoint after training"},
  {"metric-for-best-model", OPT_STR, OFF(metric_for_best_model), "eval_loss (the only metric)"},
  {"greater-is-better", OPT_BOOL, OFF(greater_is_better), "a higher metric is better (default false for eval_loss)"},
  {"save-only-model", OPT_BOOL, OFF(save_only_model), "checkpoints hold config.json + model.safetensors only"},
  {"async-save", OPT_BOOL, OFF(async_save),
   "snapshot to host memory and train on while a thread writes each save (ds_config: checkpoint.writer.decoupled)"},
  {"resume-from-checkpoint", OPT_STR, OFF(resume_from_checkpoint), "a checkpoint-<step> folder to continue from"},
  {"deepspeed", OPT_STR, OFF(deepspeed), "a DeepSpeed config (ds_config.json); \"auto\" values are filled"},
  {"freeze", OPT_SPECIAL, 0, "freeze parameters whose name starts with PREFIX (repeatable)"},
  /* engine */
  {"ranks", OPT_INT, OFF(ranks), "data-parallel ranks W as threads of this one process (1)"},
  {"nproc", OPT_INT, OFF(nproc), "run under mpirun -np N on this host, a process per rank (W = N; see below)"},
  {"zero-stage", OPT_INT, OFF(zero_stage), "ZeRO stage 1, 2 or 3 (default: the config's, else 2)"},
  {"device", OPT_STR, OFF(device), "cpu | cuda (cpu)"},
  {"eval-samples", OPT_INT, OFF(eval_samples), "evaluation windows (32)"},
  {"generate-tokens", OPT_INT, OFF(generate_tokens), "after training, greedily generate N bytes (0)"},
  {"eval-sums", OPT_INT, OFF(eval_sums),
   "after training, greedily complete N 'a+b=' prompts whose line is not in the training text; count the right sums (0)"},
  {"corpus-bytes", OPT_I64, OFF(corpus_bytes),
   "bytes of training text (32768): more lines, fewer unseen pairs left for --eval-sums"},
  {"reverse-sums", OPT_BOOL, OFF(reverse_sums),
   "the corpus writes each sum least-significant digit first (12+9=12); output shows the usual order"},
  {"prompt", OPT_STR, OFF(prompt), "generation prompt (\"12+7=\")"},
  {"gather-for-generation", OPT_SPECIAL, 0, "on | off | both: ZeRO-3 params gathered at once or per module (on)"},
  /* model */
  {"n-layer", OPT_INT, OFF(model.n_layer), "transformer blocks (2)"},
  {"n-head", OPT_INT, OFF(model.n_head), "attention heads (4)"},
  {"n-embd", OPT_INT, OFF(model.n_embd), "hidden size (64)"},
  {"n-positions", OPT_INT, OFF(model.max_seq_len), "sequence length T (64)"},
  {"quiet", OPT_BOOL, OFF(quiet), "no progress lines"},
  {"dump-dir", OPT_STR, OFF(dump_dir), "write config.json, model.safetensors (fp32) and a logits probe there"},
};

void ze_args_usage(FILE *f) {
  fprintf(f,
          "usage: zckpt-train [options]\n"
          "\n"
          "Trains a small GPT-2 (Hugging Face names) on a synthetic arithmetic corpus with ZeRO\n"
          "stage 1, 2 or 3 over W ranks, and saves DeepSpeed checkpoints in the HF Trainer\n"
          "layout. Progress on stderr; generated text on stdout.\n"
          "\n"
          "options (HF TrainingArguments names; --name_with_underscores also works):\n");
  for (size_t i = 0; i < sizeof opts / sizeof *opts; i++) {
    const opt *o = &opts[i];
    const char *arg = o->kind == OPT_BOOL ? "" : o->kind == OPT_STR || o->kind == OPT_SPECIAL ? " S" : " N";
    if (!strcmp(o->name, "freeze")) arg = " PREFIX";
    char left[64];
    snprintf(left, sizeof left, "--%s%s", o->name, arg);
    fprintf(f, "  %-36s %s\n", left, o->help);
  }
  fprintf(f,
          "  %-36s %s\n  %-36s %s\n"
          "\n"
          "Ranks: --ranks W runs W threads in one process. Under mpirun (or srun) each process\n"
          "is one rank, its collectives over MPI, and writes its own checkpoint files (the same\n"
          "bytes as --ranks); only rank 0 prints progress and results. --nproc N is a shorthand\n"
          "for 'mpirun -np N --oversubscribe zckpt-train ...' on this host. A rank that dies ends\n"
          "the job (mpirun); one that makes no progress for ZCK_COMM_TIMEOUT_S seconds (1800)\n"
          "while the others wait makes the waiting rank print one line and abort the job. With\n"
          "--device cuda, each process uses GPU (rank among its host's ranks) %% device count.\n"
          "\n"
          "Memory: forward and backward hold a module's weights at a time (stage 1/2 convert them\n"
          "from the rank's 16-bit copy; stage 3 all-gathers them before use and frees them after);\n"
          "stage 2/3 reduce a module's gradients into their owners' partitions right after its\n"
          "backward, stage 1 keeps full fp32 gradients until the step. The end of a run logs the\n"
          "peak model-state memory per rank. DeepSpeed keys read from zero_optimization:\n"
          "reduce_bucket_size, allgather_bucket_size (elements per collective; results are the\n"
          "same bits for any size), stage3_prefetch_bucket_size, stage3_max_live_parameters\n"
          "(stage 3: modules gathered ahead of use), stage3_param_persistence_threshold and\n"
          "stage3_model_persistence_threshold (stage 3: tensors that small stay gathered for\n"
          "good), stage3_max_reuse_distance (stage 3: a tensor used again within that many\n"
          "elements of the trace is not released). overlap_comm (default on at stage 3): with\n"
          "--device cuda, stage-3 gathers (prefetched before the module ahead computes) and\n"
          "stage 2/3 gradient reductions run on a second stream per rank, waited with events;\n"
          "on CPU ranks collectives run one after the other in each rank's thread.\n"
          "contiguous_gradients is accepted (partitions are always contiguous). offload_optimizer and\n"
          "offload_param with device \"cpu\" (pin_memory as set) matter with --device cuda: the\n"
          "optimizer state (AdamW then runs on the CPU) or the 16-bit partitions stay in host\n"
          "memory; on CPU ranks the ZeRO state is in host memory already. \"nvme\" is refused.\n"
          "\n"
          "Async saves (--async-save, or the DeepSpeed config's checkpoint.writer.decoupled): at a save\n"
          "step each rank copies its ZeRO state to host memory (from the GPU through two page-locked\n"
          "buffers of one bucket) and trains on; a thread writes the same files a synchronous save\n"
          "writes, hashed as written, and renames checkpoint-N into place last, so a crash leaves the\n"
          "previous checkpoint the newest. One save at a time: the next one waits (the log says so).\n"
          "A failed background write fails the run at the next save or at the end. With --nproc each\n"
          "rank writes its own files in the background; rank 0 commits once every rank's are in.\n"
          "\n"
          "Defaults differ from TrainingArguments where a tiny model needs it (max-steps, learning-rate,\n"
          "logging-steps). Exit status: 0 ok, 1 error, 2 usage error.\n",
          "--help", "this text", "--version", "the zckpt version");
}

static int usage_err(char *err, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int usage_err(char *err, size_t cap, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  return ZE_ARGS_USAGE;
}

static bool parse_bool_word(const char *s, bool *out) {
  static const char *const yes[] = {"true", "yes", "1", "on"}, *const no[] = {"false", "no", "0", "off"};
  for (int i = 0; i < 4; i++) {
    if (!strcasecmp(s, yes[i])) return *out = true, true;
    if (!strcasecmp(s, no[i])) return *out = false, true;
  }
  return false;
}

/* --name's value val into its field of a (o: its row of opts). */
static int set_value(const opt *o, const char *name, const char *val, ze_train_args *a, char *err, size_t cap) {
  char *end = NULL;
  errno = 0;
  switch (o->kind) {
  case OPT_INT:
  case OPT_I64: {
    long long v = strtoll(val, &end, 10);
    if (!*val || *end || errno || (o->kind == OPT_INT && (v < -2147483647LL || v > 2147483647LL)))
      return usage_err(err, cap, "--%s: '%s' is not an integer", name, val);
    if (v < 0 && strcmp(name, "max-steps")) return usage_err(err, cap, "--%s: '%s' must not be negative", name, val);
    if (o->kind == OPT_INT) *(int *)((char *)a + o->off) = (int)v;
    else *(int64_t *)((char *)a + o->off) = v;
    break;
  }
  case OPT_U64: {
    if (val[0] == '-') return usage_err(err, cap, "--%s: '%s' must not be negative", name, val);
    unsigned long long v = strtoull(val, &end, 10);
    if (!*val || *end || errno) return usage_err(err, cap, "--%s: '%s' is not an integer", name, val);
    *(uint64_t *)((char *)a + o->off) = v;
    break;
  }
  case OPT_DOUBLE: {
    double v = strtod(val, &end);
    if (!*val || *end || errno || v != v) return usage_err(err, cap, "--%s: '%s' is not a number", name, val);
    if (v < 0) return usage_err(err, cap, "--%s: '%s' must not be negative", name, val);
    *(double *)((char *)a + o->off) = v;
    break;
  }
  case OPT_STR:
    if (!*val) return usage_err(err, cap, "--%s: empty value", name);
    *(const char **)((char *)a + o->off) = val;
    break;
  case OPT_SPECIAL:
    if (!strcmp(name, "freeze")) {
      if (a->n_freeze >= ZE_MAX_FREEZE) return usage_err(err, cap, "--freeze: at most %d prefixes", ZE_MAX_FREEZE);
      if (!*val) return usage_err(err, cap, "--freeze: empty prefix");
      a->freeze[a->n_freeze++] = val;
    } else {
      if (!strcmp(val, "on") || !strcasecmp(val, "true")) a->gather_for_generation = ZE_GATHER_ON;
      else if (!strcmp(val, "off") || !strcasecmp(val, "false")) a->gather_for_generation = ZE_GATHER_OFF;
      else if (!strcmp(val, "both")) a->gather_for_generation = ZE_GATHER_BOTH;
      else return usage_err(err, cap, "--gather-for-generation: '%s' is not on, off or both", val);
    }
    break;
  default: break;
  }
  return ZE_ARGS_OK;
}

/* The values given, checked together: what is wrong is a usage error. */
static int check_values(const ze_train_args *a, char *err, size_t cap) {
  if (a->max_steps <= 0) return usage_err(err, cap, "--max-steps must be positive");
  if (a->ranks < 1 || a->ranks > 64) return usage_err(err, cap, "--ranks %d: must be in [1, 64]", a->ranks);
  if (a->nproc_arg[1] && (a->nproc < 1 || a->nproc > 1024))
    return usage_err(err, cap, "--nproc %d: must be in [1, 1024]", a->nproc);
  if (a->nproc && a->ranks > 1)
    return usage_err(err, cap, "--nproc (processes) and --ranks (threads of one process) exclude each other");
  if (a->zero_stage < 0 || a->zero_stage > 3)
    return usage_err(err, cap, "--zero-stage %d: must be 1, 2 or 3", a->zero_stage);
  if (a->per_device_train_batch_size < 1) return usage_err(err, cap, "--per-device-train-batch-size must be positive");
  if (a->gradient_accumulation_steps < 1) return usage_err(err, cap, "--gradient-accumulation-steps must be positive");
  if (strcmp(a->device, "cpu") && strcmp(a->device, "cuda"))
    return usage_err(err, cap, "--device %s: must be cpu or cuda", a->device);
  if (a->adam_beta1 >= 1.0 || a->adam_beta2 >= 1.0) return usage_err(err, cap, "--adam-beta1/2 must be below 1");
  if (a->warmup_ratio > 1.0) return usage_err(err, cap, "--warmup-ratio must be in [0, 1]");
  return ZE_ARGS_OK;
}

int ze_args_parse(int argc, char **argv, ze_train_args *a, char *err, size_t cap) {
  ze_train_args_default(a);
  for (int i = 1; i < argc; i++) {
    const char *arg = argv[i];
    if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
      ze_args_usage(stdout);
      return ZE_ARGS_EXIT_OK;
    }
    if (!strcmp(arg, "--version")) {
      printf("zckpt-train %s\n", zck_version());
      return ZE_ARGS_EXIT_OK;
    }
    if (strncmp(arg, "--", 2) || !arg[2]) return usage_err(err, cap, "unexpected argument '%s'", arg);
    /* --name[=value], underscores read as dashes */
    char name[64];
    const char *eq = strchr(arg, '=');
    size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
    if (len >= sizeof name) return usage_err(err, cap, "unknown option '%s'", arg);
    memcpy(name, arg + 2, len);
    name[len] = 0;
    for (char *p = name; *p; p++)
      if (*p == '_') *p = '-';
    const opt *o = NULL;
    for (size_t k = 0; k < sizeof opts / sizeof *opts; k++)
      if (!strcmp(opts[k].name, name)) o = &opts[k];
    if (!o) return usage_err(err, cap, "unknown option '--%s'", name);
    const char *val = eq ? eq + 1 : NULL;
    if (o->kind == OPT_BOOL) {
      bool b = true;
      if (val) {
        if (!parse_bool_word(val, &b)) return usage_err(err, cap, "--%s: '%s' is not true or false", name, val);
      } else if (i + 1 < argc && parse_bool_word(argv[i + 1], &b)) {
        i++;
      }
      *(bool *)((char *)a + o->off) = b;
      continue;
    }
    int at = i;
    if (!val) {
      if (i + 1 >= argc) return usage_err(err, cap, "--%s needs a value", name);
      val = argv[++i];
    }
    if (!strcmp(name, "nproc")) {
      a->nproc_arg[0] = at;
      a->nproc_arg[1] = i - at + 1;
    }
    int rc = set_value(o, name, val, a, err, cap);
    if (rc != ZE_ARGS_OK) return rc;
  }
  return check_values(a, err, cap);
}
