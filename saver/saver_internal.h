/* saver_internal.h: what the saver's files share (saver.h). */
#ifndef ZCK_SAVER_INTERNAL_H
#define ZCK_SAVER_INTERNAL_H

#include "saver.h"

#include "io.h"
#include "stream_hash.h"

#include <pthread.h>
#include <stdatomic.h>

typedef struct zck_st_writer zck_st_writer;
typedef struct zck_ds_ckpt zck_ds_ckpt;
typedef struct zck_ds_info zck_ds_info;
struct zck_ds_writer;
struct zck__manifest_known;

/* A view the hooks described, and what frees it. */
typedef struct zck__saver_view {
  zck_state_view v;
  void *owned;
} zck__saver_view;
zck_status zck__saver_source(const zck_saver *s, void *only, void *lp_of, zck__saver_view *out);
zck_status zck__saver_target(const zck_saver *s, void *rank, zck__saver_view *out);
void zck__saver_view_free(const zck_saver *s, zck__saver_view *v);

/* A keeper of the bookkeeping: the one rank of a process-per-rank saver, or rank 0. */
bool zck__saver_keeper(const zck_saver *s, const zck_saver_rank *r);

// ---- save_deepspeed.c
/* The param groups' "lr" for a save at `step` (mutates the shared manifest: one caller). */
zck_status zck__saver_set_lr(zck_saver *s, int64_t step);
/* The DeepSpeed checkpoint of `step` under root (root/global_step<step>/ and root/latest).
 * only == NULL: every rank's files from s->ranks[] (threads). only: that rank's parts alone
 * (its optimizer-states file, its stage-3 model-states file, rank 0's stage-1/2 model
 * states), the other files left unfilled and no `latest`; lr set beforehand. keep (may be
 * NULL): the files' manifest hashes are made as they are written, and *keep receives the
 * committed writer (zck__ds_writer_known; the caller frees it). */
zck_status zck__saver_write_deepspeed(zck_saver *s, const zck_saver_rank *r0, const char *root, int64_t step,
                                      const zck_saver_rank *only, struct zck_ds_writer **keep);

// ---- gather16.c: model.safetensors, the 16-bit weights
/* Its header and tensor offsets (the same on every rank). */
typedef struct zck__g16 {
  zck_st_writer *w;
  zck_layout *whole;  /* store i: the i-th owner param, whole (its param, its numel) */
  size_t *slot;       /* [n]: store i's tensor in w */
  size_t n;
} zck__g16;
zck_status zck__g16_init(const zck_saver *s, const char *path, zck__g16 *g);
void zck__g16_free(zck__g16 *g);
/* Stage 1/2: the file from rank r0's whole 16-bit copies. Stage 3 (threads): from every
 * rank's partitions, through the device hook when it takes it. known (may be NULL): its
 * manifest hashes are made as it is written and added there as "model.safetensors". */
zck_status zck__g16_write(const zck_saver *s, const zck_saver_rank *r0, const char *path,
                          struct zck__manifest_known *known, size_t *cap);

// ---- gather16_ranks.c
/* Per rank, stage 3, collective: every rank writes its partitions' bytes of path (which
 * rank 0 creates and commits), window by window; when rank 0 hashes it (known, rank 0, may
 * be NULL: its manifest hashes, added as "model.safetensors"), the other ranks' bytes are
 * also gathered to rank 0 in file order. Returns this rank's own failure; when only
 * another rank failed, ZCK_OK with nothing committed (the agreement that follows names
 * that rank). */
zck_status zck__g16_gather_ranks(const zck_saver *s, const zck_saver_rank *r, const char *path,
                                 struct zck__manifest_known *known, size_t *cap);
/* Per rank, no collective (a background save's writer): this rank's partitions' bytes of
 * the file g lays out, straight into fd (open for writing, created by rank 0), by one
 * partial transfer; the other ranks write the rest. */
zck_status zck__g16_write_own(const zck_saver *s, const zck_saver_rank *r, const zck__g16 *g, int fd, const char *path);
/* A rank other than 0: its own descriptor of the file rank 0 created at path; and its bytes
 * there durable before rank 0 commits (rank 0's fsync does not cover another host's writes
 * on a network file system). */
zck_status zck__g16_open_share(const char *path, int *fd);
zck_status zck__g16_sync_share(int fd, const char *path);
/* Rank 0, once every rank's bytes of g's open file are on the disk: its data section read
 * back front to back into the hashes g->w makes (zck_st_writer_hash was set before open). */
zck_status zck__g16_hash_back(const zck__g16 *g, const char *path);
/* (tests) The window in bytes (0: the default, 16 MiB). */
void zck__g16_set_window(size_t bytes);

// ---- save.c
/* Rank 0's end of a save into od: (per rank: `latest`), config.json, model.safetensors,
 * trainer_state.json, the manifest last, and the commit of od. known (may be NULL): the
 * tag folder's files hashed as they were written; the others are read to be hashed.
 * save_only_model: folder (may be NULL) holds the hashes of the checkpoint folder's files
 * written before (per rank: model.safetensors), to which those written here are added. */
zck_status zck__saver_finish(zck_saver *s, const zck_saver_rank *r0, zck__outdir *od, int64_t step, bool per_rank,
                             const struct zck__manifest_known *known, struct zck__manifest_known *folder);
/* Ranks that are threads: rank 0 writes every file of checkpoint-<step>/ from the ranks
 * registered in s->ranks, commits and rotates (a synchronous save's work, and the
 * background writer's on a copy of the bookkeeping). */
zck_status zck__saver_save_rank0(zck_saver *s, const zck_saver_rank *r0, int64_t step);
/* Whether a stage-3 save writes model.safetensors from the ranks' partitions. */
bool zck__saver_g16_wanted(const zck_saver *s);
/* Ranks that are threads: each registers its memory in s->ranks, rank 0 runs fn, and its
 * outcome (with its message) is every rank's. */
zck_status zck__saver_collective(zck_saver *s, const zck_saver_rank *r,
                                 zck_status (*fn)(zck_saver *, const zck_saver_rank *, int64_t), int64_t arg);

// ---- save_async.c
/* A background save: its writer thread, and what it writes from. */
typedef struct zck__saver_job {
  pthread_t thread;
  zck_saver copy;              /* the bookkeeping of step N, the snapshots in copy.ranks */
  zck_model *model;            /* copy.tr.model: the manifest's clone */
  zck_saver_rank r0;           /* this rank's snapshot (threads: rank 0's), its optimizer step */
  int64_t step;
  zck_status (*work)(struct zck__saver_job *j); /* the writer's work (NULL: zck__saver_save_rank0) */
  zck_status status;           /* the writer's outcome (read after the join) */
  char msg[1024];
  atomic_bool done;            /* the writer has finished (a join will not wait) */
  bool joined;                 /* written on rank 0's thread (no writer thread to join) */
  atomic_int *busy;            /* the saver's writer_busy, cleared when done */
  /* ranks that are processes (save_async_ranks.c) */
  zck__outdir od;              /* rank 0: the temporary checkpoint folder it commits */
  char dir[4096];              /* that folder, as every rank writes into it */
  atomic_bool own_done;        /* this rank's own files are written (or failed): own_status */
  zck_status own_status;
  char own_msg[1024];
  atomic_bool abandon;         /* rank 0's writer stops waiting for the others' files */
  zck__g16 g16;                /* rank 0, stage-3 16-bit save: model.safetensors, created at
                                * the save so every rank's writer can fill its bytes */
  zck__shash_budget g16_budget; /* its hashes' memory (when the manifest lists it) */
} zck__saver_job;

zck_status zck__saver_save_async(zck_saver *s, const zck_saver_rank *r, int64_t step);
/* Waits for the save in flight and forgets it, leaving the thread's error alone (free);
 * ranks that are processes: rank 0's writer gives up waiting for the others' files first. */
void zck__saver_job_end(zck_saver *s);
/* The pieces that save_async_ranks.c shares: */
double zck__saver_now_s(void);
void zck__saver_note(const zck_saver *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Joins the save in flight (the log says when the save of `next`, 0: the end of training,
 * waited for it) and returns its outcome. */
zck_status zck__saver_wait_previous(zck_saver *s, const zck_saver_rank *r0, int64_t next);
/* s->job for the save of `step`, its writer not started: a copy of the bookkeeping now. */
zck_status zck__saver_prepare_job(zck_saver *s, const zck_saver_rank *r0, int64_t step);
void zck__saver_start_job(zck_saver *s);
void zck__saver_job_free(zck__saver_job *j);

// ---- save_async_ranks.c: the same for ranks that are processes
zck_status zck__saver_save_async_ranks(zck_saver *s, const zck_saver_rank *r, int64_t step);
zck_status zck__saver_flush_ranks(zck_saver *s, const zck_saver_rank *r);

// ---- save_hashes.c
/* Every rank calls it after writing its own files: rank 0 gets every rank's manifest
 * hashes (own: a rank's writer's, or NULL) in all (an owned list, stream_hash.h). */
zck_status zck__saver_gather_hashes(zck_comm *c, const struct zck__manifest_known *own, struct zck__manifest_known *all,
                                    size_t *cap);
/* The same hashes as bytes (a file between processes): *out malloc'd; and back, added to all. */
zck_status zck__saver_hashes_encode(const struct zck__manifest_known *own, void **out, size_t *n);
zck_status zck__saver_hashes_decode(const void *p, size_t n, struct zck__manifest_known *all, size_t *cap);

// ---- save_rank.c, resume_rank.c: one process per rank
zck_status zck__saver_save_per_rank(zck_saver *s, const zck_saver_rank *r, int64_t step);
zck_status zck__saver_load_per_process(zck_saver *s, const char *path, zck_saver_resume *st, zck_comm *comm);
zck_status zck__saver_load_best_per_rank(zck_saver *s, const zck_saver_rank *r);

// ---- resume.c
zck_status zck__saver_check_fits(const zck_saver *s, const zck_ds_ckpt *c, const char *path);
bool zck__saver_needs_reshard(const zck_saver *s, const zck_ds_info *in);
zck_status zck__saver_reshard_for_run(const zck_saver *s, const char *path, const zck_ds_info *in, char **out);
/* st takes the open checkpoint c (its steps; path: the name it was asked for). */
void zck__saver_resume_take(zck_saver_resume *st, zck_ds_ckpt *c, const char *path);

#endif
