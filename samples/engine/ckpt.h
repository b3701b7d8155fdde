/* ckpt.h: zckpt-train's checkpoints, in the Hugging Face Trainer layout, through the
 * library's saver (saver/saver.h: saves every N steps, rotation, the best model, `latest`,
 * the per-rank phases, the 16-bit gather, resume). The engine's part is to describe its
 * ranks' memory to the saver: the model manifest and the ZeRO plan's layouts, one memory
 * store per rank and flat group (ckpt_state.c), the device gather of the 16-bit weights
 * (dckpt.c), and what a save records of the training (lr schedule, config.json).
 *
 * Every rank calls the collective entry points (saver.h says how the ranks share a save).
 */
#ifndef ZE_CKPT_H
#define ZE_CKPT_H

#include "saver.h"
#include "train.h"
#include "zero.h"

typedef struct cJSON cJSON;
typedef struct ze__snapshot ze__snapshot;

typedef struct ze_ckpt_tracker {
  const ze_train_args *a;
  const ze_gpt2_config *cfg;
  const ze_zero_plan *plan;
  int64_t warmup;                /* the lr schedule's warmup steps */
  zck_saver sv;                  /* rotation, best model, trainer_state.json, the saves */
  ze__snapshot *snaps[64];       /* --async-save: rank r's host snapshot (ckpt_snapshot.c),
                                    written by rank r's thread, read by the saver's writer */
  double snapshot_seconds;       /* rank 0's last snapshot took this long (the bench) */
} ze_ckpt_tracker;

/* What a resume reads (open until the ranks restored from it). */
typedef zck_saver_resume ze_ckpt_state;

/* per_rank: each rank writes its own files (one process per rank, or forced); one_rank:
 * this tracker belongs to one rank (process per rank), which keeps the bookkeeping;
 * async_save: saves written in the background from host snapshots (ranks as threads). */
zck_status ze_ckpt_tracker_init(ze_ckpt_tracker *t, const ze_train_args *a, const ze_gpt2_config *cfg,
                                const zck_model *model, const ze_zero_plan *plan, const cJSON *ds_json, bool gather16,
                                bool per_rank, bool one_rank, bool async_save);
void ze_ckpt_tracker_free(ze_ckpt_tracker *t);

/* Collective: OUTPUT_DIR/checkpoint-<step>/, then rotation. */
zck_status ze_ckpt_save(ze_ckpt_tracker *t, ze_zero_rank *zr, int64_t step);
/* Collective, --async-save: waits for the save still being written (end of training). */
zck_status ze_ckpt_flush(ze_ckpt_tracker *t, ze_zero_rank *zr);
/* --async-save, by the rank's thread once its state is made: its snapshot's host memory,
 * allocated and touched before the first save. */
zck_status ze_ckpt_rank_start(ze_ckpt_tracker *t, ze_zero_rank *zr);
/* --async-save, by the rank's thread before its device state is freed: lets go of what its
 * snapshot holds of the device (the page-locked staging). */
void ze_ckpt_rank_end(ze_ckpt_tracker *t, ze_zero_rank *zr);
/* Host bytes of rank r's snapshot (0: none taken). */
size_t ze_ckpt_snapshot_bytes(const ze_ckpt_tracker *t, int r);
/* Opens a checkpoint to resume from (before the ranks start); checks it fits this run.
 * comm: NULL when the ranks are threads; a process's comm (collective). */
zck_status ze_ckpt_load(ze_ckpt_tracker *t, const char *path, ze_ckpt_state *st, zck_comm *comm);
/* Per rank: copies this rank's partitions from st, then refreshes and gathers its 16-bit
 * weights (collective). */
zck_status ze_ckpt_restore_rank(ze_ckpt_tracker *t, ze_ckpt_state *st, ze_zero_rank *zr);
/* Collective: reloads every rank from the best checkpoint (HF _load_best_model). */
zck_status ze_ckpt_load_best(ze_ckpt_tracker *t, ze_zero_rank *zr);
/* The best checkpoint's model and config.json into the output folder. */
zck_status ze_ckpt_export_best(const ze_ckpt_tracker *t);
void ze_ckpt_state_free(ze_ckpt_state *st);

#endif
