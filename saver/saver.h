/* saver.h: the checkpoint manager of a training run, in the Hugging Face Trainer layout
 * OUTPUT_DIR/checkpoint-<step>/ holding the DeepSpeed
 * checkpoint (latest, global_step<N>/ with the model-states and per-rank optimizer files),
 * model.safetensors (16-bit weights: stage 1/2, or stage 3 with
 * stage3_gather_16bit_weights_on_model_save), config.json and trainer_state.json. Each
 * checkpoint is built under a temporary name and renamed into place whole. Rotation
 * (save_total_limit, the best checkpoint kept), the best model (load-best, its export),
 * resume (resharded first when the run's ZeRO layout differs) follow the Trainer.
 *
 * The trainer describes its ranks' memory as state views (lib/state.h) through hooks; the
 * saver moves state between them and the files with lib/transfer, and never sees the
 * trainer's own structures. Two ways to save (the same bytes):
 *  - ranks that are threads of one process: rank 0 writes every file from all ranks'
 *    memory (the others wait in the collective);
 *  - per rank (one process per rank, or forced): rank 0 creates the temporary checkpoint
 *    folder and tells the others its name; each rank writes its own files (its
 *    optimizer-states file, its stage-3 model-states file, its byte ranges of a stage-3
 *    model.safetensors); after an agreement rank 0 writes the rest (the stage-1/2 model
 *    states, `latest`, the HF files, the manifest last) and renames the folder into place.
 *    A rank that dies before leaves only a temporary folder behind, never `latest` on a
 *    half-written tag.
 *  - in the background (async_save; save_async.c): each rank snapshots what the save
 *    reads into host memory (the snapshot hook) and goes on training; a writer thread
 *    writes the same files from the snapshots as rank 0 does above, commits and rotates.
 *    Ranks that are processes (save_async_ranks.c): a writer thread per rank writes that
 *    rank's files as above, and rank 0's commits once every rank's files are in. At most
 *    one save is in flight: the next save, or zck_saver_flush at the end of training,
 *    waits for it and fails every rank when it failed.
 * Every rank reads its own partitions back; a resume that needs a reshard is resharded
 * once (rank 0) into a temporary tree beside the output that the others then read.
 * The temporary trees of dead runs are swept by the next run that makes one.
 */
#ifndef ZCK_SAVER_H
#define ZCK_SAVER_H

#include "comm.h"
#include "state.h"
#include "zck.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct cJSON cJSON;
typedef struct zck__outdir zck__outdir;

/* The TrainingArguments the checkpoints depend on. */
typedef struct zck_saver_opts {
  const char *output_dir;        /* NULL: no saves */
  int64_t save_total_limit;      /* <= 0: keep every checkpoint */
  bool greater_is_better;        /* of the evaluation metric (eval_loss: false) */
  /* recorded in trainer_state.json */
  int64_t max_steps, logging_steps, eval_steps, save_steps;
  int train_batch_size;          /* per device */
} zck_saver_opts;

/* The training a checkpoint records. */
typedef struct zck_saver_train {
  const zck_model *model;        /* the manifest; each save sets its param groups' "lr" */
  int stage;                     /* ZeRO 1, 2, 3 */
  uint32_t world;                /* data-parallel ranks */
  zck_dtype lp_dtype;            /* the 16-bit (or fp32) module weights */
  uint64_t sub_group_size;       /* stage 3 */
  const cJSON *ds_config;        /* recorded as ds_config; an "optimizer" section means
                                    DeepSpeed owns the optimizer and its LambdaLR */
  double learning_rate;          /* the scheduler's base lr */
  double max_grad_norm;
  int64_t samples_per_step;      /* global batch: global_samples = step x this */
  bool gather16;                 /* stage 3: model.safetensors too */
  bool save_only_model;          /* no DeepSpeed checkpoint, the 16-bit model alone */
  bool per_rank;                 /* each rank writes its own files (see above) */
  bool one_rank;                 /* this saver belongs to one rank (process per rank): that
                                    rank keeps the bookkeeping; else rank 0 does */
  bool read_trainer_state;       /* a resume takes trainer_state.json's log and best */
  bool async_save;               /* saves written in the background (save_async.c); per_rank
                                    only with one_rank, and no stage-3 16-bit file there */
} zck_saver_train;

/* Receives bytes [byte_off, byte_off + n) of a file's data section. */
typedef zck_status (*zck_saver_write_fn)(void *ctx, uint64_t byte_off, const void *bytes, size_t n);

/* The trainer's memory behind hooks. A rank is the trainer's handle on one rank's memory
 * (void *, passed back as is). ranks[r] below: every rank's handle (threads); a process
 * rank only ever passes its own, as `only`. */
typedef struct zck_saver_hooks {
  void *ctx;
  /* The source of a save: fp32, exp_avg, exp_avg_sq of every rank (only != NULL: of that
   * rank alone, its layouts restricted to it), stage 3's frozen partitions, and with lp_of
   * the whole 16-bit copies that rank keeps (stage 1/2: its 16-bit flat as LP, the frozen
   * params as FROZEN). *owned: what release frees once the view is used. */
  zck_status (*describe_source)(void *ctx, void *const *ranks, void *only, void *lp_of, zck_state_view *v,
                                void **owned);
  /* The target of a resume: that rank's own partitions (cleared, so padding reads zero). */
  zck_status (*describe_target)(void *ctx, void *rank, zck_state_view *v, void **owned);
  void (*release)(void *ctx, void *owned);
  /* A rank's state was read back: the trainer takes the optimizer step and refreshes what
   * it derives (its 16-bit weights, gathered). Collective where the trainer's is. */
  zck_status (*restored)(void *ctx, void *rank, int64_t optimizer_step);
  /* Optional, ranks that are threads, stage 3: writes the 16-bit file's data section from
   * device memory (the bounded gather of zck_cuda.h, which the saver does not link).
   * param_dst_off[p]: the element offset of param p in the data section (UINT64_MAX: not
   * in the file, a tied copy); write(wctx, ...) takes data-section bytes in increasing
   * order. Returns ZCK_ERR_UNSUPPORTED to let the transfer write it (host memory, several
   * devices). */
  zck_status (*gather16)(void *ctx, void *const *ranks, const uint64_t *param_dst_off, zck_saver_write_fn write,
                         void *wctx);
  double (*lr_at)(void *ctx, int64_t step);              /* the scheduler's lr at a step */
  /* config.json of the model: its text, malloc'd (NULL: out of memory); the saver writes
   * it, hashing it as written when the checkpoint folder's manifest lists it */
  char *(*config_json)(void *ctx);
  /* Optional (fault tests): a per-rank save's rank has written its own files. */
  void (*rank_written)(void *ctx, zck_comm *c, int64_t step);
  /* async_save: copies what a save reads of a rank (as describe_source reads it: its
   * partitions, rank 0's 16-bit copies) into host memory that stays unchanged until this
   * rank's next snapshot, and returns it as a rank handle the describe hooks take (the
   * device settled before). Called by each rank's own thread. */
  zck_status (*snapshot)(void *ctx, void *rank, void **snap);
  /* Optional: one line for the training log (async_save: a save that waits for the one
   * before it says so). */
  void (*note)(void *ctx, const char *line);
} zck_saver_hooks;

/* What a rank hands to the collective calls. */
typedef struct zck_saver_rank {
  void *mem;                     /* the trainer's handle on this rank's memory */
  zck_comm *comm;                /* rank = comm->rank */
  int64_t optimizer_step;        /* optimizer steps taken (0: no optimizer state yet) */
} zck_saver_rank;

typedef struct zck_saver_resume zck_saver_resume;

typedef struct zck_saver {
  zck_saver_opts o;
  zck_saver_train tr;
  zck_saver_hooks h;
  void *ranks[64];               /* registered by each rank thread */
  char *best_checkpoint;         /* the best checkpoint saved so far (NULL: none) */
  double best_metric;            /* metric of the best evaluation (NAN: none yet) */
  int64_t best_step;             /* step of that evaluation */
  cJSON *log_history;            /* trainer_state.json log_history */
  zck_saver_resume *best_state;  /* open while thread ranks reload the best checkpoint */
  struct zck__saver_job *job;    /* async_save: the save being written (rank 0's), or NULL */
  void *snaps[64];               /* async_save: each rank's snapshot, put by its own thread */
  atomic_int writer_busy;        /* async_save: 1 from a writer's start until it no longer
                                    reads the snapshots (the other ranks wait for 0) */
} zck_saver;

/* What a resume reads (open until every rank restored from it). */
struct zck_saver_resume {
  void *ds;                      /* zck_ds_ckpt */
  char *path;
  char *resharded;               /* a temporary reshard of path for this run's stage / W,
                                    removed with the state; NULL when path fits as is */
  int64_t global_step;
  int64_t optimizer_step;
};

zck_status zck_saver_init(zck_saver *s, const zck_saver_opts *o, const zck_saver_train *tr, const zck_saver_hooks *h);
void zck_saver_free(zck_saver *s);

/* log_history entries: a training log (key "loss") and an evaluation, which also becomes
 * the best metric when it is the best so far. */
void zck_saver_log(zck_saver *s, int64_t step, const char *key, double loss, double grad_norm, double lr);
void zck_saver_log_eval(zck_saver *s, int64_t step, double metric);

/* Whether step (1-based, just taken) saves: every save_steps steps and the last one
 * (--save-steps 0: only the last); never without an output folder. */
bool zck_saver_due(const zck_saver *s, int64_t step);
/* Collective: OUTPUT_DIR/checkpoint-<step>/, then rotation. The trainer's state must be
 * settled (device streams synced) before. */
zck_status zck_saver_save(zck_saver *s, const zck_saver_rank *r, int64_t step);
/* Collective, async_save: waits for the save in flight; its failure is every rank's. Call
 * it at the end of training (before load-best), and no later save is in flight after it. */
zck_status zck_saver_flush(zck_saver *s, const zck_saver_rank *r);
/* Not collective, after the ranks stopped (on any path): waits for the save in flight and
 * returns its outcome (ZCK_OK when none). zck_saver_free waits too, but loses the outcome. */
zck_status zck_saver_drain(zck_saver *s);
/* Opens a checkpoint to resume from (before the ranks start) and checks it fits this run,
 * resharding it first when the run's stage, world size or sub_group_size differ.
 * comm: NULL when the ranks are threads (one state for all); a process's comm (collective:
 * rank 0 reshards, each process opens its own state). */
zck_status zck_saver_load(zck_saver *s, const char *path, zck_saver_resume *st, zck_comm *comm);
/* Per rank: copies its partitions from st, then the hooks' restored (collective there). */
zck_status zck_saver_restore_rank(zck_saver *s, zck_saver_resume *st, const zck_saver_rank *r);
void zck_saver_resume_free(zck_saver_resume *st);
/* Collective: reloads every rank from the best checkpoint (HF _load_best_model). */
zck_status zck_saver_load_best(zck_saver *s, const zck_saver_rank *r);
/* Writes the best checkpoint's consolidated model (in the training dtype, as save_model
 * would) and config.json into the output folder, each file replaced atomically. */
zck_status zck_saver_export_best(const zck_saver *s);

// ---- the pieces (also for the saver's own files)

/* OUTPUT_DIR/checkpoint-<step> (caller frees; NULL: out of memory). keeper: this caller
 * keeps the bookkeeping, and records the checkpoint as the best when this step's
 * evaluation was. */
char *zck_saver_checkpoint_path(zck_saver *s, int64_t step, bool keeper);
/* trainer_state.json of a save at `step` (TrainerState.save_to_json's bytes). known
 * (optional, an owned list of stream_hash.h): gets its manifest hashes as relpath, made
 * from the bytes written. */
struct zck__manifest_known;
zck_status zck_saver_write_trainer_state(const zck_saver *s, const char *path, int64_t step,
                                         struct zck__manifest_known *known, size_t *cap, const char *relpath);
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
