/* saver.h: the checkpoint manager of a training run, in the Hugging Face Trainer layout
 * (specs/deepspeed-checkpoint.md §6.2): OUTPUT_DIR/checkpoint-<step>/ every N steps, each
 * built under a temporary name and renamed into place whole; rotation (save_total_limit,
 * the best checkpoint kept); the best model (the evaluation metric, greater or lower is
 * better); trainer_state.json (log history, best checkpoint); `latest`; the temporary
 * trees a run makes beside its output (a resume's reshard, the best model's export), which
 * a later run sweeps once their writer is dead.
 *
 * The trainer says what it logs and evaluates; the saver keeps the bookkeeping. One
 * zck_saver per process (its keeper rank calls the bookkeeping functions).
 */
#ifndef ZCK_SAVER_H
#define ZCK_SAVER_H

#include "zck.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct cJSON cJSON;

/* The TrainingArguments the checkpoints depend on. */
typedef struct zck_saver_opts {
  const char *output_dir;        /* NULL: no saves */
  int64_t save_total_limit;      /* <= 0: keep every checkpoint */
  bool greater_is_better;        /* of the evaluation metric (eval_loss: false) */
  /* recorded in trainer_state.json */
  int64_t max_steps, logging_steps, eval_steps, save_steps;
  int train_batch_size;          /* per device */
} zck_saver_opts;

typedef struct zck_saver {
  zck_saver_opts o;
  char *best_checkpoint;         /* the best checkpoint saved so far (NULL: none) */
  double best_metric;            /* metric of the best evaluation (NAN: none yet) */
  int64_t best_step;             /* step of that evaluation */
  cJSON *log_history;            /* trainer_state.json log_history */
} zck_saver;

zck_status zck_saver_init(zck_saver *s, const zck_saver_opts *o);
void zck_saver_free(zck_saver *s);

/* log_history entries: a training log (key "loss") and an evaluation, which also becomes
 * the best metric when it is the best so far. */
void zck_saver_log(zck_saver *s, int64_t step, const char *key, double loss, double grad_norm, double lr);
void zck_saver_log_eval(zck_saver *s, int64_t step, double metric);

/* OUTPUT_DIR/checkpoint-<step> (caller frees; NULL: out of memory). keeper: this caller
 * keeps the bookkeeping, and records the checkpoint as the best when this step's
 * evaluation was. */
char *zck_saver_checkpoint_path(zck_saver *s, int64_t step, bool keeper);
/* trainer_state.json of a save at `step` (TrainerState.save_to_json's bytes). */
zck_status zck_saver_write_trainer_state(const zck_saver *s, const char *path, int64_t step);
/* Takes the log history and best checkpoint of checkpoint folder ckpt's trainer_state.json
 * (absent or unreadable: nothing changes). */
void zck_saver_read_trainer_state(zck_saver *s, const char *ckpt);
/* Removes the oldest checkpoint-<N> folders of the output beyond save_total_limit, the best
 * one kept (Trainer._rotate_checkpoints). */
zck_status zck_saver_rotate(const zck_saver *s);
/* DIR/latest holding "global_step<step>", committed atomically. */
zck_status zck_saver_write_latest(const char *dir, int64_t step);

/* A temporary output beside base: base/.<what>.zck-tmp-<pid>/<sub> (its parent made), for
 * a reshard or an export made before it moves into place. Dead runs' temporary trees
 * beside it go first, so killed runs leave nothing that piles up. *out: caller frees. */
zck_status zck_saver_temp_tree(const char *base, const char *what, const char *sub, char **out);
/* Removes the tree zck_saver_temp_tree made for path. */
void zck_saver_temp_tree_remove(const char *path);

#endif
