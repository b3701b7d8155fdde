/* ckpt.c: the engine's side of its checkpoints (ckpt.h): the hooks through which the
 * library's saver (saver/saver.h) reads and restores the ranks' memory, and what a save
 * records of the training: the lr schedule, the DeepSpeed config, config.json. */
#include "ckpt.h"
#include "ckpt_internal.h"

#include "error.h"
#include "hf.h"
#include "launch.h"
#include "util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double ze_train_lr(const ze_train_args *a, int64_t warmup, int64_t step);

// ---- the hooks

static zck_status describe_source(void *ctx, void *const *ranks, void *only, void *lp_of, zck_state_view *v,
                                  void **owned) {
  const ze_ckpt_tracker *t = ctx;
  ze__state *s = zck__calloc(1, sizeof *s);
  if (!s) return ZCK_ERR_NO_MEMORY;
  zck_status st = ze__state_of_ranks(t->plan, (ze_zero_rank *const *)ranks, only, lp_of, s);
  if (st != ZCK_OK) {
    free(s);
    return st;
  }
  *v = s->v;
  *owned = s;
  return ZCK_OK;
}

static zck_status describe_target(void *ctx, void *rank, zck_state_view *v, void **owned) {
  (void)ctx;
  ze__state *s = zck__calloc(1, sizeof *s);
  if (!s) return ZCK_ERR_NO_MEMORY;
  zck_status st = ze__state_of_rank_target(rank, s);
  if (st != ZCK_OK) {
    free(s);
    return st;
  }
  *v = s->v;
  *owned = s;
  return ZCK_OK;
}

static void release(void *ctx, void *owned) {
  (void)ctx;
  ze__state_free(owned);
  free(owned);
}

/* lp = RNE(fp32 master), as DeepSpeed's load_from_fp32_weights; then gather */
static zck_status restored(void *ctx, void *rank, int64_t optimizer_step) {
  (void)ctx;
  ze_zero_rank *zr = rank;
  zr->step = optimizer_step;
  return ze_zero_refresh_lp(zr);
}

static double lr_at(void *ctx, int64_t step) {
  const ze_ckpt_tracker *t = ctx;
  return ze_train_lr(t->a, t->warmup, step);
}

static char *config_json(void *ctx) {
  const ze_ckpt_tracker *t = ctx;
  return ze_hf_config_json(t->cfg, t->plan->o.lp_dtype);
}

static void rank_written(void *ctx, zck_comm *c, int64_t step) {
  (void)ctx;
  ze_test_kill_point(c, step, true);
}

/* --async-save: called by each rank's own thread, which alone writes its slot */
static zck_status snapshot(void *ctx, void *rank, void **snap) {
  ze_ckpt_tracker *t = ctx;
  ze_zero_rank *zr = rank;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  ZCK_TRY(ze__snapshot_take(&t->snaps[zr->rank], zr));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  if (zr->rank == 0) t->snapshot_seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  *snap = ze__snapshot_rank(t->snaps[zr->rank]);
  return ZCK_OK;
}

static void note(void *ctx, const char *line) {
  const ze_ckpt_tracker *t = ctx;
  if (!t->a->quiet) fprintf(stderr, "%s\n", line);
}

// ---- the tracker

zck_status ze_ckpt_tracker_init(ze_ckpt_tracker *t, const ze_train_args *a, const ze_gpt2_config *cfg,
                                const zck_model *model, const ze_zero_plan *plan, const cJSON *ds_json, bool gather16,
                                bool per_rank, bool one_rank, bool async_save) {
  memset(t, 0, sizeof *t);
  t->a = a;
  t->cfg = cfg;
  t->plan = plan;
  t->warmup = a->warmup_steps > 0 ? a->warmup_steps : (int64_t)ceil((double)a->max_steps * a->warmup_ratio);
  zck_saver_opts o = {a->output_dir, a->save_total_limit, a->greater_is_better, a->max_steps, a->logging_steps,
                      a->eval_steps, a->save_steps, a->per_device_train_batch_size};
  zck_saver_train tr = {model,
                        plan->o.stage,
                        plan->o.world,
                        plan->o.lp_dtype,
                        plan->o.sub_group_size,
                        ds_json,
                        a->learning_rate,
                        a->max_grad_norm,
                        (int64_t)plan->o.world * a->per_device_train_batch_size * a->gradient_accumulation_steps,
                        gather16,
                        a->save_only_model,
                        per_rank,
                        one_rank,
                        a->output_dir || a->load_best_model_at_end,
                        async_save};
  zck_saver_hooks h = {t, describe_source, describe_target, release, restored, ze__g16_gather, lr_at, config_json,
                       rank_written, snapshot, note};
  return zck_saver_init(&t->sv, &o, &tr, &h);
}

void ze_ckpt_tracker_free(ze_ckpt_tracker *t) {
  if (!t) return;
  zck_saver_free(&t->sv); /* joins a background save, which reads the snapshots */
  for (size_t r = 0; r < sizeof t->snaps / sizeof t->snaps[0]; r++) ze__snapshot_free(t->snaps[r]);
  memset(t, 0, sizeof *t);
}

// ---- the collective entry points

static zck_saver_rank saver_rank(ze_zero_rank *zr) { return (zck_saver_rank){zr, zr->comm, zr->step}; }

zck_status ze_ckpt_save(ze_ckpt_tracker *t, ze_zero_rank *zr, int64_t step) {
  ZCK_TRY(ze_zero_sync(zr)); /* the saver reads the state from other threads */
  zck_saver_rank r = saver_rank(zr);
  return zck_saver_save(&t->sv, &r, step);
}

zck_status ze_ckpt_flush(ze_ckpt_tracker *t, ze_zero_rank *zr) {
  zck_saver_rank r = saver_rank(zr);
  return zck_saver_flush(&t->sv, &r);
}

size_t ze_ckpt_snapshot_bytes(const ze_ckpt_tracker *t, int r) {
  return r >= 0 && (size_t)r < sizeof t->snaps / sizeof t->snaps[0] ? ze__snapshot_bytes(t->snaps[r]) : 0;
}

zck_status ze_ckpt_rank_start(ze_ckpt_tracker *t, ze_zero_rank *zr) {
  if (!t->sv.tr.async_save || !t->a->output_dir) return ZCK_OK;
  ZCK_FAIL_IF(zr->rank >= sizeof t->snaps / sizeof t->snaps[0], ZCK_ERR_INVALID_ARG, "rank %u: too many ranks", zr->rank);
  ZCK_TRY(ze__snapshot_prepare(&t->snaps[zr->rank], zr));
  if (zr->rank == 0 && !t->a->quiet)
    fprintf(stderr, "async save: a host snapshot of %.2f MiB on rank 0, taken at each save; a thread writes it while "
                    "training goes on\n",
            (double)ze__snapshot_bytes(t->snaps[0]) / 1048576.0);
  return ZCK_OK;
}

void ze_ckpt_rank_end(ze_ckpt_tracker *t, ze_zero_rank *zr) {
  if (zr->rank < sizeof t->snaps / sizeof t->snaps[0]) ze__snapshot_release(t->snaps[zr->rank]);
}

zck_status ze_ckpt_load(ze_ckpt_tracker *t, const char *path, ze_ckpt_state *st, zck_comm *comm) {
  return zck_saver_load(&t->sv, path, st, comm);
}

zck_status ze_ckpt_restore_rank(ze_ckpt_tracker *t, ze_ckpt_state *st, ze_zero_rank *zr) {
  zck_saver_rank r = saver_rank(zr);
  return zck_saver_restore_rank(&t->sv, st, &r);
}

zck_status ze_ckpt_load_best(ze_ckpt_tracker *t, ze_zero_rank *zr) {
  zck_saver_rank r = saver_rank(zr);
  return zck_saver_load_best(&t->sv, &r);
}

zck_status ze_ckpt_export_best(const ze_ckpt_tracker *t) { return zck_saver_export_best(&t->sv); }

void ze_ckpt_state_free(ze_ckpt_state *st) { zck_saver_resume_free(st); }
