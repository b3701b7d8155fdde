/* train.h: the zckpt-train engine as a library: arguments (Hugging Face TrainingArguments
 * names), one call that trains, and the results the tests look at.
 *
 * ze_train_run() builds the model manifest (HF GPT2LMHeadModel names, decay / no-decay param
 * groups as the HF Trainer makes them), the ZeRO plan, W rank threads over the local comm
 * backend (or, given a comm, this process's one rank of a group of processes), and runs
 * the loop:
 *   for each optimizer step: per micro-batch forward, backward, reduce (module by module,
 *   zexec.h); clip; AdamW; log every logging_steps; evaluate every eval_steps; save every
 *   save_steps. Each rank counts the bytes of model states it holds (zero.h) and the
 *   result carries every rank's peak.
 * Progress goes to stderr; generated text (if asked) to stdout.
 */
#ifndef ZE_TRAIN_H
#define ZE_TRAIN_H

#include "comm.h"
#include "gpt2.h"
#include "zero.h"
#include "zck.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define ZE_MAX_FREEZE 16

typedef enum ze_gather_mode { ZE_GATHER_ON = 0, ZE_GATHER_OFF, ZE_GATHER_BOTH } ze_gather_mode;

typedef struct ze_train_args {
  /* ---- model (GPT2Config) */
  ze_gpt2_config model;
  /* ---- Hugging Face TrainingArguments */
  const char *output_dir;           /* NULL: nothing is written */
  int64_t max_steps;
  int per_device_train_batch_size;
  int gradient_accumulation_steps;
  double learning_rate, weight_decay, adam_beta1, adam_beta2, adam_epsilon, max_grad_norm;
  int64_t warmup_steps;
  double warmup_ratio;              /* used when warmup_steps == 0 (HF: ceil(ratio * max_steps)) */
  const char *lr_scheduler_type;    /* "linear", "cosine", "constant" or "constant_with_warmup" */
  uint64_t seed;
  bool bf16;
  int64_t logging_steps, eval_steps, save_steps; /* 0: never (eval_steps 0: only at the end) */
  int64_t save_total_limit;         /* 0: keep all */
  bool load_best_model_at_end;
  bool greater_is_better;        /* the best checkpoint has the highest metric (HF default for
                                    eval_loss: false) */
  bool save_only_model;          /* checkpoints hold the 16-bit model only, no DeepSpeed state */
  bool async_save;               /* saves written in the background from a host snapshot
                                    (also the DeepSpeed config's checkpoint.writer.decoupled) */
  const char *metric_for_best_model;
  const char *resume_from_checkpoint;
  const char *freeze[ZE_MAX_FREEZE]; /* parameter-name prefixes made frozen */
  int n_freeze;
  /* ---- engine */
  int ranks;                        /* W */
  int zero_stage;                   /* 0: from the DeepSpeed config, else 2 */
  const char *device;               /* "cpu" or "cuda" */
  bool sim_device;                  /* tests: --device cuda's path (ZeRO state, collectives and
                                       checkpoints through the device backend) with the device
                                       simulated in host memory (dzero.h); CPU arithmetic */
  const char *deepspeed;            /* ds_config.json path or NULL */
  int eval_samples;                 /* evaluation windows */
  int generate_tokens;              /* 0: no generation */
  int eval_sums;                    /* held-out "a+b=" prompts to complete after training; 0: none */
  int64_t corpus_bytes;             /* training text (data.h); 0: 32 KiB */
  bool reverse_sums;                /* the corpus writes each sum least-significant digit first
                                       (data.h); generated text is shown in the usual order */
  const char *prompt;
  ze_gather_mode gather_for_generation;
  bool quiet;                       /* no progress lines */
  bool keep_params;                 /* return the final weights in the result */
  const char *dump_dir;             /* write weights + a logits probe for interop tests */
  /* ---- one process per rank (launch.h) */
  int nproc;                        /* --nproc N: launch N rank processes (main.c; 0: no) */
  int nproc_arg[2];                 /* argv index and count of the --nproc option */
  zck_comm *comm;                   /* the caller runs one rank, comm->rank of comm->size, in
                                       this thread (a process per rank: the MPI backend under
                                       mpirun / --nproc); NULL: W = ranks threads */
  int local_rank;                   /* with comm: the node-local rank (GPU choice) */
  bool per_rank_io;                 /* checkpoints written / read rank by rank, as the
                                       processes do (forced on in process mode; tests use it
                                       with threads) */
} ze_train_args;

void ze_train_args_default(ze_train_args *a);

typedef struct ze_train_result {
  int64_t first_step;               /* 0, or the step resumed from */
  int64_t steps;                    /* optimizer steps run in this call */
  float *losses;                    /* [steps] mean training loss of each step */
  double *grad_norms;               /* [steps] before clipping */
  double *lrs;                      /* [steps] learning rate used */
  float *eval_losses;               /* [n_eval] */
  int64_t *eval_steps_at;           /* [n_eval] global step of each evaluation */
  size_t n_eval;
  float final_eval_loss;
  char *generated[2];               /* text after the prompt: [0] gathered, [1] layer by layer */
  double gen_seconds[2];
  size_t gen_peak_bytes[2];         /* peak bytes of gathered parameters while generating */
  float *params;                    /* keep_params: final weights (fp32 values of the 16-bit
                                       weights), model order, n_params floats */
  size_t n_params;
  ze_mem *mem;                      /* [n_mem = W] per rank: bytes of model states held
                                       during training (zero.h), peak and its breakdown
                                       (a rank process fills only its own entry); device
                                       bytes with --device cuda */
  size_t n_mem;
  bool mem_on_device;               /* --device cuda: mem counts device memory, and: */
  ze_mem *mem_host;                 /* [n_mem] host bytes of offloaded state and staging */
  uint64_t *dev_workspace;          /* [n_mem] device bytes of activations and their gradients */
  uint64_t *dev_used_peak;          /* [n_mem] device memory in use (cudaMemGetInfo: the whole
                                       device, every rank on it) at its highest sample */
  char *best_checkpoint;            /* with load_best_model_at_end */
  bool async_save;                  /* saves were written in the background (--async-save or
                                       the DeepSpeed config's checkpoint.writer.decoupled) */
  /* rank 0's clock (the bench): */
  int64_t n_saves;                  /* saves in the step loop */
  double save_stall_seconds;        /* time the step loop was blocked in them, summed: the
                                       whole save, or the snapshot (and any wait for the
                                       save before) with async_save */
  double save_stall_max;            /* the longest of them */
  double *save_stalls;              /* [n_saves] each of them, in order */
  double *snapshot_seconds;         /* [n_saves] async_save: the snapshot's copy within each */
  uint64_t *snapshot_bytes;         /* [n_mem] async_save: host bytes of each rank's snapshot */
  double loop_seconds;              /* the step loop, first step to last (its saves
                                       included; not the end-of-training flush) */
  char *message;                    /* on failure, when the error is longer than one line
                                       (the DeepSpeed config mismatch list): the whole text */
} ze_train_result;

void ze_train_result_free(ze_train_result *r);

/* W: the comm's size with a comm, else ranks. */
static inline int ze_train_world(const ze_train_args *a) { return a->comm ? a->comm->size : a->ranks; }

/* The checks of the arguments alone (usage errors: the CLI exits 2 on them). */
zck_status ze_train_check_args(const ze_train_args *a);
/* Trains. On failure the message is in zck_last_error() of the calling thread. */
zck_status ze_train_run(const ze_train_args *a, ze_train_result *r);

#endif
