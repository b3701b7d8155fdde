/* dsconfig.h: a DeepSpeed config (ds_config.json) as the HF Trainer sees it.
 *
 * "auto" values are filled from the training arguments and explicit values that disagree
 * are collected, exactly as transformers' HfTrainerDeepSpeedConfig does
 * (trainer_config_process + trainer_config_finalize, deepspeed-checkpoint.md §7.2); every
 * mismatch is reported at once in HF's message:
 *   Please correct the following DeepSpeed config values that mismatch TrainingArguments values:
 *   - ds gradient_accumulation_steps=4 vs hf gradient_accumulation_steps=2
 *   The easiest method is to set these DeepSpeed config values to 'auto'.
 * Values print as Python prints them (5e-05, [0.9, 0.999], True). Then the keys the engine
 * needs are read, and what it cannot do (DeepSpeed schedulers, NVMe offload, round-robin
 * gradients, fp16) is refused with one line naming the key.
 */
#ifndef ZE_DSCONFIG_H
#define ZE_DSCONFIG_H

#include "train.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct cJSON cJSON;

typedef struct ze_ds_config {
  cJSON *json;                  /* the resolved config (what a checkpoint records as ds_config) */
  int stage;
  bool has_optimizer;           /* an "optimizer" section: DeepSpeed builds ONE param group */
  uint64_t sub_group_size;      /* zero_optimization.sub_group_size, default 1e9 */
  bool gather_16bit_on_save;    /* zero_optimization.stage3_gather_16bit_weights_on_model_save */
  bool async_save;              /* checkpoint.writer.decoupled (DeepSpeed's decoupled checkpoint
                                   writer): saves written in the background (--async-save) */
  /* the keys users tune, DeepSpeed's defaults when absent (see zero.h, zexec.h) */
  uint64_t reduce_bucket_size;    /* 5e8 */
  uint64_t allgather_bucket_size; /* 5e8 (stage 1/2) */
  uint64_t prefetch_bucket_size;  /* stage3_prefetch_bucket_size, 5e7 */
  uint64_t max_live_parameters;   /* stage3_max_live_parameters, 1e9 */
  bool overlap_comm;              /* default: stage 3 */
  bool overlap_comm_given;        /* the config sets it */
  bool contiguous_gradients;      /* default true */
  bool offload_optimizer;         /* offload_optimizer.device == "cpu" (or cpu_offload) */
  bool offload_param;             /* offload_param.device == "cpu" (or cpu_offload_param) */
  bool offload_optimizer_pin;     /* offload_optimizer.pin_memory (DeepSpeed's default false) */
  bool offload_param_pin;         /* offload_param.pin_memory */
  uint64_t gather16_bucket_elems; /* --device cuda, stage 3: elements per bucket of the on-save
                                     16-bit gather: allgather_bucket_size when the config
                                     sets it (DeepSpeed reads it at stage 1/2 only), else 0
                                     (the engine's default) */
  char *message;                /* on ZCK_ERR_MISMATCH: the whole multi-line HF message (the
                                   thread's error line may be too short for many mismatches) */
} ze_ds_config;

/* Parses text (name is for messages) and resolves it against a; a->zero_stage, when set,
 * must agree with zero_optimization.stage. On failure only `message` may be set; free the
 * struct with ze_ds_config_free either way. */
zck_status ze_ds_config_parse(const char *text, const char *name, const ze_train_args *a, ze_ds_config *out);
/* Reads and resolves a file. */
zck_status ze_ds_config_load(const char *path, const ze_train_args *a, ze_ds_config *out);
/* The config a run without --deepspeed behaves as (recorded in checkpoints). */
zck_status ze_ds_config_default(const ze_train_args *a, int stage, ze_ds_config *out);
void ze_ds_config_free(ze_ds_config *c);

#endif
