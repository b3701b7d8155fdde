/* ckpt.h: checkpoints of zckpt-train in the Hugging Face Trainer layout (deepspeed-checkpoint.md
 * §6.2): OUTPUT_DIR/checkpoint-<step>/ holding the DeepSpeed checkpoint (latest,
 * global_step<N>/ with the model-states and per-rank optimizer files), model.safetensors
 * (16-bit weights, stage 1/2, or stage 3 with stage3_gather_16bit_weights_on_model_save),
 * config.json (a GPT2Config transformers loads) and trainer_state.json. Rotation
 * (--save-total-limit, keeping the best), best-model tracking and --load-best-model-at-end
 * follow the Trainer. Resume reads the DeepSpeed checkpoint back into the rank partitions.
 *
 * Every rank calls the collective entry points. Two ways to write (the same bytes):
 *  - ranks that are threads (the default): rank 0 writes the files from all ranks'
 *    in-memory partitions through the DeepSpeed writer (a copy plan from the engine's ZeRO
 *    layout to the writer's);
 *  - per rank (per_rank: one process per rank, or forced): rank 0 creates the temporary
 *    checkpoint folder and tells the others its name; each rank writes its own files
 *    (its optimizer-states file, its stage-3 model-states file, its byte ranges of a
 *    stage-3 model.safetensors); after a barrier rank 0 writes the rest (the stage-1/2
 *    model states, `latest`, the HF files, the manifest last) and renames the folder into
 *    place. A rank that dies before that leaves only a temporary folder behind.
 * Every rank reads its own partitions back; a resume that needs a reshard is resharded
 * once, by rank 0, into a temporary folder the others then read.
 */
#ifndef ZE_CKPT_H
#define ZE_CKPT_H

#include "train.h"
#include "saver.h"
#include "zero.h"

#include <pthread.h>

typedef struct cJSON cJSON;

typedef struct ze_ckpt_tracker {
  const ze_train_args *a;
  const ze_gpt2_config *cfg;
  const zck_model *model;
  const ze_zero_plan *plan;
  const cJSON *ds_json;
  bool gather16;                 /* stage 3: write model.safetensors too */
  ze_zero_rank *ranks[64];       /* registered by each rank thread */
  zck_saver sv;                  /* rotation, best model, trainer_state.json */
  struct ze_ckpt_state *best_state; /* open while the ranks reload the best checkpoint */
  bool per_rank;                 /* each rank writes its own files (see above) */
  bool one_rank;                 /* this tracker belongs to one rank (process per rank): that
                                    rank keeps the bookkeeping; else rank 0 does */
} ze_ckpt_tracker;

/* What a resume reads (the checkpoint stays open until the ranks restored from it). */
typedef struct ze_ckpt_state {
  /* (opened by ze_ckpt_load) */
  void *ds;                      /* zck_ds_ckpt */
  char *path;
  char *resharded;               /* a temporary reshard of path for this run's stage / W,
                                    removed with the state; NULL when path fits as is */
  int64_t global_step;
  int64_t optimizer_step;
} ze_ckpt_state;

zck_status ze_ckpt_tracker_init(ze_ckpt_tracker *t, const ze_train_args *a, const ze_gpt2_config *cfg,
                                const zck_model *model, const ze_zero_plan *plan, const cJSON *ds_json, bool gather16);
void ze_ckpt_tracker_free(ze_ckpt_tracker *t);

/* Collective: OUTPUT_DIR/checkpoint-<step>/, then rotation. */
zck_status ze_ckpt_save(ze_ckpt_tracker *t, ze_zero_rank *zr, int64_t step);
/* Opens a checkpoint to resume from (before the ranks start); checks it fits this run.
 * comm: NULL when the ranks are threads (one state for all of them); a process's comm
 * (collective: rank 0 reshards if needed, each process opens its own state). */
zck_status ze_ckpt_load(ze_ckpt_tracker *t, const char *path, ze_ckpt_state *st, zck_comm *comm);
/* Per rank: copies this rank's partitions from st, then gathers (collective). */
zck_status ze_ckpt_restore_rank(ze_ckpt_state *st, ze_zero_rank *zr);
/* Collective: reloads every rank from the best checkpoint (HF _load_best_model). */
/* Writes the best checkpoint's consolidated model (in the training dtype, as save_model
 * would) and config.json into the output folder, each file replaced atomically. */
zck_status ze_ckpt_export_best(const ze_ckpt_tracker *t);
zck_status ze_ckpt_load_best(ze_ckpt_tracker *t, ze_zero_rank *zr);
void ze_ckpt_state_free(ze_ckpt_state *st);

#endif
