/* resume.c: reading checkpoints back (saver.h): a resume (resharded first, into a
 * temporary tree beside the output, when this run's ZeRO layout differs), the best model's
 * reload at the end of training, and its export as the output's model. Each rank reads
 * its own partitions through lib/transfer into the hooks' target view. */
#include "saver_internal.h"

#include "deepspeed/deepspeed.h"
#include "error.h"
#include "transfer.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void zck_saver_resume_free(zck_saver_resume *st) {
  if (!st) return;
  zck_ds_close(st->ds);
  if (st->resharded) zck_saver_temp_tree_remove(st->resharded);
  free(st->resharded);
  free(st->path);
  memset(st, 0, sizeof *st);
}

/* The checkpoint must be this run's model and ZeRO configuration (DeepSpeed refuses a
 * different dp world size when it loads optimizer states). */
zck_status zck__saver_check_fits(const zck_saver *t, const zck_ds_ckpt *c, const char *path) {
  const zck_ds_info *in = zck_ds_info_of(c);
  const zck_model *cm = zck_ds_model(c), *m = t->tr.model;
  const zck_saver_train *plan = &t->tr;
  ZCK_FAIL_IF(in->stage != plan->stage, ZCK_ERR_MISMATCH, "%s: a ZeRO-%d checkpoint; this run uses ZeRO-%d", path,
              in->stage, plan->stage);
  ZCK_FAIL_IF(in->world_size != plan->world, ZCK_ERR_MISMATCH,
              "%s: The checkpoint being loaded used a DP world size of %u but the current world size is %u. Automatic "
              "adjustment of ZeRO's optimizer state partitioning with a new world size is not currently supported.",
              path, in->world_size, plan->world);
  ZCK_FAIL_IF(in->lp_dtype != plan->lp_dtype, ZCK_ERR_MISMATCH, "%s: saved with %s weights; this run uses %s (--bf16)",
              path, zck_dtype_name(in->lp_dtype), zck_dtype_name(plan->lp_dtype));
  ZCK_FAIL_IF(!in->has_optimizer_state, ZCK_ERR_NOT_FOUND, "%s: no optimizer state to resume from", path);
  ZCK_FAIL_IF(cm->n_params != m->n_params || cm->n_groups != m->n_groups, ZCK_ERR_MISMATCH,
              "%s: %zu parameters in %zu groups; this model has %zu in %zu", path, cm->n_params, cm->n_groups,
              m->n_params, m->n_groups);
  for (size_t p = 0; p < m->n_params; p++) {
    const zck_param *x = &cm->params[p], *y = &m->params[p];
    ZCK_FAIL_IF(strcmp(x->name, y->name) || x->numel != y->numel || x->ndim != y->ndim ||
                    memcmp(x->shape, y->shape, sizeof(int64_t) * (size_t)y->ndim),
                ZCK_ERR_MISMATCH, "%s: parameter %zu is %s with %llu elements; this model has %s with %llu", path, p,
                x->name, (unsigned long long)x->numel, y->name, (unsigned long long)y->numel);
    ZCK_FAIL_IF(x->frozen != y->frozen, ZCK_ERR_MISMATCH, "%s: %s is %s in the checkpoint but %s here (--freeze)", path,
                y->name, x->frozen ? "frozen" : "trainable", y->frozen ? "frozen" : "trainable");
  }
  ZCK_FAIL_IF(in->stage == 3 && in->sub_group_size != plan->sub_group_size, ZCK_ERR_MISMATCH,
              "%s: sub_group_size %llu in the checkpoint, %llu here", path, (unsigned long long)in->sub_group_size,
              (unsigned long long)plan->sub_group_size);
  return ZCK_OK;
}

/* Another ZeRO stage, world size or sub_group_size than this run's: the checkpoint goes
 * through the library's reshard first (into a temporary folder beside the output), as
 * `zckpt reshard` would, and is loaded from there. */
bool zck__saver_needs_reshard(const zck_saver *t, const zck_ds_info *in) {
  const zck_saver_train *plan = &t->tr;
  return in->stage != plan->stage || in->world_size != plan->world ||
         (plan->stage == 3 && in->sub_group_size != plan->sub_group_size);
}

zck_status zck__saver_reshard_for_run(const zck_saver *t, const char *path, const zck_ds_info *in, char **out) {
  const zck_saver_train *plan = &t->tr;
  const char *base = t->o.output_dir ? t->o.output_dir : "/tmp";
  char *dir = NULL;
  ZCK_TRY(zck_saver_temp_tree(base, "resume-resharded", "checkpoint", &dir));
  fprintf(stderr, "zckpt-train: %s is ZeRO-%d on %u ranks; resharding it for ZeRO-%d on %u ranks\n", path, in->stage,
          in->world_size, plan->stage, plan->world);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_stage = plan->stage;
  ro.to_world_size = plan->world;
  ro.sub_group_size = plan->stage == 3 ? plan->sub_group_size : 0;
  zck_status s = zck_reshard(path, dir, &ro);
  if (s != ZCK_OK) {
    zck_saver_temp_tree_remove(dir);
    free(dir);
    return zck__error_prepend(s, "resharding %s for this run", path);
  }
  *out = dir;
  return ZCK_OK;
}

zck_status zck_saver_load(zck_saver *t, const char *path, zck_saver_resume *st, zck_comm *comm) {
  if (comm) return zck__saver_load_per_process(t, path, st, comm);
  memset(st, 0, sizeof *st);
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  oo.require_optimizer_state = true;
  zck_ds_ckpt *c = NULL;
  ZCK_TRY(zck_ds_open(path, &oo, &c));
  /* the jobs' check, over the manifest parsed at open; the transfer then checks every
   * record's CRC and every tensor's XXH3 as it reads (a damaged file stops it in one line) */
  zck_status s = zck_ds_check_complete(c, 0);
  if (s == ZCK_OK && zck__saver_needs_reshard(t, zck_ds_info_of(c))) {
    s = zck__saver_reshard_for_run(t, path, zck_ds_info_of(c), &st->resharded);
    zck_ds_close(c);
    c = NULL;
    if (s == ZCK_OK) s = zck_ds_open(st->resharded, &oo, &c);
  }
  if (s == ZCK_OK) s = zck__saver_check_fits(t, c, path);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    if (st->resharded) zck_saver_temp_tree_remove(st->resharded);
    free(st->resharded);
    st->resharded = NULL;
    return s;
  }
  zck__saver_resume_take(st, c, path);
  if (t->tr.read_trainer_state) zck_saver_read_trainer_state(t, path);
  return ZCK_OK;
}

void zck__saver_resume_take(zck_saver_resume *st, zck_ds_ckpt *c, const char *path) {
  const zck_ds_info *in = zck_ds_info_of(c);
  st->ds = c;
  st->path = zck__strdup(path);
  st->global_step = in->global_steps;
  st->optimizer_step = (int64_t)in->step;
}

zck_status zck_saver_restore_rank(zck_saver *t, zck_saver_resume *st, const zck_saver_rank *r) {
  zck_state_view src;
  zck_ds_state(st->ds, &src);
  zck__saver_view dst;
  zck_status s = zck__saver_target(t, r->mem, &dst);
  if (s == ZCK_OK) {
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec.threads = 1; /* the ranks already run in parallel */
    s = zck_transfer(&src, &dst.v, 1, &to);
  }
  zck__saver_view_free(t, &dst);
  if (s != ZCK_OK) {
    s = zck__error_prepend(s, "rank %d: resuming from %s", r->comm->rank, st->path);
    r->comm->abort(r->comm);
    return s;
  }
  /* the trainer takes the step and refreshes its 16-bit weights (lp = RNE(fp32 master), as
   * DeepSpeed's load_from_fp32_weights), then gathers */
  return t->h.restored(t->h.ctx, r->mem, st->optimizer_step);
}

// ---- load best (collective)

static zck_status open_best(zck_saver *t, const zck_saver_rank *zr, int64_t arg) {
  zck_saver_resume *st = zck__calloc(1, sizeof *st);
  if (!st) return ZCK_ERR_NO_MEMORY;
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  zck_ds_ckpt *c = NULL;
  zck_status s = zck_ds_open(t->best_checkpoint, &oo, &c);
  if (s == ZCK_OK) s = zck_ds_check_complete(c, 0);
  if (s == ZCK_OK) s = zck__saver_check_fits(t, c, t->best_checkpoint);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    free(st);
    return s;
  }
  zck__saver_resume_take(st, c, t->best_checkpoint);
  t->best_state = st;
  return ZCK_OK;
}

zck_status zck_saver_export_best(const zck_saver *t) {
  char *tmp = NULL;
  ZCK_TRY(zck_saver_temp_tree(t->o.output_dir, "best-model", "model", &tmp));
  zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
  co.dtype = t->tr.lp_dtype;
  zck_status s = zck_consolidate(t->best_checkpoint, tmp, &co);
  static const char *const files[] = {"model.safetensors", "config.json"};
  for (size_t i = 0; s == ZCK_OK && i < sizeof files / sizeof files[0]; i++) {
    char *from = zck__path_join(tmp, files[i]), *to = zck__path_join(t->o.output_dir, files[i]);
    if (!from || !to) s = ZCK_ERR_NO_MEMORY;
    else if (rename(from, to) != 0) s = zck__fail_errno(errno, "%s: cannot move the best model into place", to);
    free(from);
    free(to);
  }
  if (s == ZCK_OK) s = zck__fsync_path(t->o.output_dir, true);
  zck_saver_temp_tree_remove(tmp);
  free(tmp);
  return s;
}

zck_status zck_saver_load_best(zck_saver *t, const zck_saver_rank *r) {
  if (t->tr.per_rank) return zck__saver_load_best_per_rank(t, r);
  ZCK_TRY(zck__saver_collective(t, r, open_best, 0));
  zck_status s = zck_saver_restore_rank(t, t->best_state, r);
  zck_status b = r->comm->barrier(r->comm);
  if (r->comm->rank == 0) {
    zck_saver_resume_free(t->best_state);
    free(t->best_state);
    t->best_state = NULL;
  }
  return s != ZCK_OK ? s : b;
}
