/* ckpt.c: HF-Trainer-layout checkpoints of the engine through the DeepSpeed writer and
 * reader (see ckpt.h).
 *
 * Save = describe the engine's memory as a state view (ckpt_state.c: the ZeRO plan's own
 * layouts, one memory store per rank and flat group), reserve the DeepSpeed files
 * (zck_ds_writer_create), and let lib/transfer copy one into the other; then the HF files.
 * The whole checkpoint-<step>/ is built under a temporary name and renamed into place at
 * the end. Resume = the reverse transfer, each rank into its own partitions. */
#include "zck.h"
#include "ckpt.h"
#include "ckpt_internal.h"

#include "deepspeed/deepspeed.h"
#include "dsconfig.h"
#include "hf.h"
#include "io.h"
#include "safetensors/safetensors.h"
#include "saver.h"
#include "transfer.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ZE_DS_VERSION "0.19.8"

double ze_train_lr(const ze_train_args *a, int64_t warmup, int64_t step);

// ---- tracker

zck_status ze_ckpt_tracker_init(ze_ckpt_tracker *t, const ze_train_args *a, const ze_gpt2_config *cfg,
                                const zck_model *model, const ze_zero_plan *plan, const cJSON *ds_json, bool gather16) {
  memset(t, 0, sizeof *t);
  t->a = a;
  t->cfg = cfg;
  t->model = model;
  t->plan = plan;
  t->ds_json = ds_json;
  t->gather16 = gather16;
  zck_saver_opts o = {a->output_dir, a->save_total_limit, a->greater_is_better, a->max_steps, a->logging_steps,
                      a->eval_steps, a->save_steps, a->per_device_train_batch_size};
  return zck_saver_init(&t->sv, &o);
}

void ze_ckpt_tracker_free(ze_ckpt_tracker *t) {
  if (!t) return;
  zck_saver_free(&t->sv);
  memset(t, 0, sizeof *t);
}

// ---- cJSON -> pickle (ds_config)

static zck_pk *json_to_pk(zck_pk_doc *d, const cJSON *j) {
  if (cJSON_IsNull(j)) return zck_pk_new_none(d);
  if (cJSON_IsBool(j)) return zck_pk_new_bool(d, cJSON_IsTrue(j));
  if (cJSON_IsString(j)) return zck_pk_new_str(d, j->valuestring);
  if (cJSON_IsNumber(j)) {
    double v = j->valuedouble;
    if (v == floor(v) && fabs(v) < 9e15) return zck_pk_new_int(d, (int64_t)v);
    return zck_pk_new_float(d, v);
  }
  if (cJSON_IsArray(j)) {
    zck_pk *l = zck_pk_new_list(d);
    for (const cJSON *c = j->child; c && l; c = c->next) {
      zck_pk *it = json_to_pk(d, c);
      if (!it || !zck_pk_append(d, l, it)) return NULL;
    }
    return l;
  }
  if (cJSON_IsObject(j)) {
    zck_pk *o = zck_pk_new_dict(d, 0);
    for (const cJSON *c = j->child; c && o; c = c->next) {
      zck_pk *k = zck_pk_new_str(d, c->string), *v = json_to_pk(d, c);
      if (!k || !v || !zck_pk_dict_set(d, o, k, v)) return NULL;
    }
    return o;
  }
  return NULL;
}

/* The LambdaLR state DeepSpeed keeps when it owns the HF scheduler (a DeepSpeed optimizer
 * section without a scheduler section). */
static zck_pk *lambda_lr_state(zck_pk_doc *d, const ze_ckpt_tracker *t, size_t n_groups, int64_t step) {
  const ze_train_args *a = t->a;
  int64_t warmup = a->warmup_steps > 0 ? a->warmup_steps : (int64_t)ceil((double)a->max_steps * a->warmup_ratio);
  double last = ze_train_lr(a, warmup, step);
  zck_pk *st = zck_pk_new_dict(d, 0), *base = zck_pk_new_list(d), *ll = zck_pk_new_list(d), *lam = zck_pk_new_list(d);
  if (!st || !base || !ll || !lam) return NULL;
  for (size_t g = 0; g < n_groups; g++) {
    if (!zck_pk_append(d, base, zck_pk_new_float(d, a->learning_rate)) || !zck_pk_append(d, ll, zck_pk_new_float(d, last)) ||
        !zck_pk_append(d, lam, zck_pk_new_none(d)))
      return NULL;
  }
#define SET(k, v) if (!zck_pk_dict_set(d, st, zck_pk_new_str(d, k), v)) return NULL
  SET("base_lrs", base);
  SET("last_epoch", zck_pk_new_int(d, step));
  SET("_step_count", zck_pk_new_int(d, step + 1));
  SET("_is_initial", zck_pk_new_bool(d, 0));
  SET("_get_lr_called_within_step", zck_pk_new_bool(d, 0));
  SET("_last_lr", ll);
  SET("lr_lambdas", lam);
#undef SET
  return st;
}

// ---- the copy from rank memory into the writer

zck_status ze__ckpt_set_lr(ze_ckpt_tracker *t, int64_t step) {
  const ze_train_args *a = t->a;
  zck_model *m = (zck_model *)t->model;
  /* param groups record the lr of the next step, as the live optimizer does */
  int64_t warmup = a->warmup_steps > 0 ? a->warmup_steps : (int64_t)ceil((double)a->max_steps * a->warmup_ratio);
  for (size_t g = 0; g < m->n_groups; g++) ZCK_TRY(zck_model_group_set_float(m, (uint32_t)g, "lr", ze_train_lr(a, warmup, step)));
  return ZCK_OK;
}

zck_status ze__ckpt_write_deepspeed(ze_ckpt_tracker *t, ze_zero_rank *zr0, const char *root, int64_t step,
                                    ze_zero_rank *only) {
  const ze_zero_plan *plan = t->plan;
  const ze_train_args *a = t->a;
  zck_model *m = (zck_model *)t->model;
  if (!only) ZCK_TRY(ze__ckpt_set_lr(t, step)); /* per rank: done before the ranks start writing */
  zck_pk_doc *doc = zck_pk_doc_new();
  if (!doc) return ZCK_ERR_NO_MEMORY;
  zck_ds_write_opts o = ZCK_DS_WRITE_OPTS_INIT;
  o.stage = plan->o.stage;
  o.world_size = plan->o.world;
  o.sub_group_size = plan->o.sub_group_size;
  o.lp_dtype = plan->o.lp_dtype;
  o.global_steps = step;
  o.global_samples = step * (int64_t)plan->o.world * a->per_device_train_batch_size * a->gradient_accumulation_steps;
  o.has_optimizer_state = zr0->step > 0;
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(t->ds_json, "optimizer");
  bool ds_opt = opt && !cJSON_IsNull(opt);
  /* torch AdamW (the HF optimizer, or torch_adam) keeps a tensor step; FusedAdam an int */
  const cJSON *ta = ds_opt ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(opt, "params"), "torch_adam")
                           : NULL;
  o.step_is_tensor = !ds_opt || cJSON_IsTrue(ta);
  o.step = (double)zr0->step;
  o.clip_grad = a->max_grad_norm;
  o.ds_version = ZE_DS_VERSION;
  o.ds_config = json_to_pk(doc, t->ds_json);
  o.lr_scheduler = ds_opt ? lambda_lr_state(doc, t, m->n_groups, step) : NULL;
  o.save_latest = !only; /* per rank: rank 0 writes `latest` once every rank's files are in */
  zck_ds_writer *w = NULL;
  ze__state src;
  memset(&src, 0, sizeof src);
  zck_status s = ZCK_OK;
  if (!o.ds_config || (ds_opt && !o.lr_scheduler)) {
    s = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  /* per rank: a writer of this rank's files alone, straight into root/<tag> (rank 0 made it) */
  if (only) ZCK_CHECK_GOTO(zck__ds_writer_create_rank(root, m, &o, only->rank, &w), s, out);
  else ZCK_CHECK_GOTO(zck_ds_writer_create(root, m, &o, &w), s, out);
  /* the 16-bit module weights are rank 0's (stage 1/2: its lp flat and frozen copies) */
  ZCK_CHECK_GOTO(ze__state_of_ranks(t, only, !only || only->rank == 0 ? zr0 : NULL, &src), s, out);
  zck_state_view dst;
  zck_ds_writer_state(w, &dst);
  zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
  to.partial = only != NULL; /* one rank's source covers only its own part of the files */
  ZCK_CHECK_GOTO(zck_transfer(&src.v, &dst, 1, &to), s, out);
  s = zck_ds_writer_commit(w);
out:
  ze__state_free(&src);
  zck_ds_writer_free(w);
  zck_pk_doc_free(doc);
  return s;
}

/* stage3_gather_16bit_weights_on_model_save: model.safetensors in the 16-bit dtype written
 * straight from every rank's fp32 partitions (and frozen 16-bit partitions) by one copy
 * plan: each extent goes from a rank's memory to its byte range in the file, cast on the
 * way (RNE, the bits of the live 16-bit params). Memory is the executor's staging buffers;
 * no rank ever holds the whole 16-bit model. Per rank, each rank runs the plan of its own
 * partitions into the file rank 0 created at full size. */
void ze__g16_free(ze__g16 *g) {
  zck_st_writer_free(g->w);
  zck_layout_free(g->whole);
  free(g->numel);
  free(g->owners);
  free(g->slot);
  memset(g, 0, sizeof *g);
}

zck_status ze__g16_init(const ze_ckpt_tracker *t, const char *path, ze__g16 *g) {
  memset(g, 0, sizeof *g);
  const zck_model *m = t->model;
  zck_st_dtype sd;
  if (!zck_st_dtype_from_zck(t->plan->o.lp_dtype, &sd)) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: no safetensors dtype", path);
  g->numel = zck__calloc(m->n_params + 1, sizeof *g->numel);
  g->owners = zck__calloc(m->n_params + 1, sizeof *g->owners);
  g->slot = zck__calloc(m->n_params + 1, sizeof *g->slot);
  zck_status s = (g->numel && g->owners && g->slot) ? zck_st_writer_new(&g->w) : ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; s == ZCK_OK && p < m->n_params; p++) {
    g->numel[p] = m->params[p].numel;
    if (m->params[p].tied_to >= 0) continue; /* lm_head: save_pretrained drops tied copies */
    uint64_t shape[ZCK_MAX_DIMS];
    for (int d = 0; d < m->params[p].ndim; d++) shape[d] = (uint64_t)m->params[p].shape[d];
    s = zck_st_writer_add(g->w, m->params[p].name, sd, m->params[p].ndim, shape, &g->slot[g->n]);
    g->owners[g->n++] = (uint32_t)p;
  }
  if (s == ZCK_OK) s = zck_st_writer_layout(g->w);
  if (s == ZCK_OK) s = zck_layout_whole(m->n_params, g->numel, g->owners, g->n, &g->whole);
  if (s != ZCK_OK) ze__g16_free(g);
  return s;
}

zck_status ze__g16_fill(const ze_ckpt_tracker *t, const ze__g16 *g, int fd, const char *path, ze_zero_rank *only) {
  zck_dtype lp = t->plan->o.lp_dtype;
  zck_store *stores = zck__calloc(g->n + 1, sizeof *stores);
  if (!stores) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < g->n; i++)
    stores[i] = zck_store_fd(fd, zck_st_writer_tensor(g->w, g->slot[i])->offset, lp, g->numel[g->owners[i]], path);
  /* the file's tensors are the 16-bit weights: cast from fp32, frozen ones from theirs */
  zck_state_view dst;
  memset(&dst, 0, sizeof dst);
  dst.model = t->model;
  dst.name = path;
  dst.part[ZCK_STATE_LP] = (zck_state_part){g->whole, stores, NULL};
  ze__state src;
  zck_status s = ze__state_of_ranks(t, only, NULL, &src);
  if (s == ZCK_OK) s = zck_transfer(&src.v, &dst, 1, NULL);
  ze__state_free(&src);
  free(stores);
  return s;
}

static zck_status write_gathered16(const ze_ckpt_tracker *t, const char *path) {
  ze__g16 g;
  ZCK_TRY(ze__g16_init(t, path, &g));
  zck_status s = zck_st_writer_open(g.w, path);
  /* device state: the bounded on-save gather (dckpt.c) */
  if (s == ZCK_OK && t->ranks[0]->dev) s = ze__g16_gather(t, &g, zck_st_writer_fd(g.w), path);
  else if (s == ZCK_OK) s = ze__g16_fill(t, &g, zck_st_writer_fd(g.w), path, NULL);
  if (s == ZCK_OK) s = zck_st_writer_commit(g.w);
  ze__g16_free(&g);
  return s;
}

// ---- save

/* Stage 1/2: a tensor's values from the rank's own lp flat (no collective). */
static zck_status read_lp_param(void *ctx, size_t index, const ze_param_spec *spec, float *dst) {
  (void)spec;
  uint32_t p = (uint32_t)index; /* spec index = manifest index */
  return ze_zero_fetch(ctx, &p, 1, dst);
}

zck_status ze__ckpt_finish(ze_ckpt_tracker *t, ze_zero_rank *zr0, zck__outdir *od, int64_t step, bool per_rank) {
  const ze_train_args *a = t->a;
  const ze_zero_plan *plan = t->plan;
  zck_status s = ZCK_OK;
  /* per rank: the tag folder is complete now (every rank's files are in), so `latest` */
  if (per_rank && !a->save_only_model) s = zck_saver_write_latest(od->tmp_path, step);
  char *cfg = zck__outdir_file(od, "config.json"), *model = zck__outdir_file(od, "model.safetensors"),
       *state = zck__outdir_file(od, "trainer_state.json");
  if (s == ZCK_OK && (!cfg || !model || !state)) s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) s = ze_hf_write_config(cfg, t->cfg, plan->o.lp_dtype);
  /* 16-bit weights: stage 1/2 always; stage 3 only when gathered on save (else HF keeps
   * only the DeepSpeed checkpoint); per rank, the ranks wrote the stage-3 file already */
  if (s == ZCK_OK && plan->o.stage < 3)
    s = ze_hf_write_weights(model, t->cfg, read_lp_param, zr0, plan->o.lp_dtype);
  if (s == ZCK_OK && !per_rank && plan->o.stage == 3 && (t->gather16 || a->save_only_model))
    s = write_gathered16(t, model);
  if (s == ZCK_OK) s = zck_saver_write_trainer_state(&t->sv, state, step);
  if (s == ZCK_OK) {
    /* the manifest goes last: its presence marks the DeepSpeed tag folder complete, and
     * `zckpt verify` checks every tensor against its hashes */
    char tag[64];
    snprintf(tag, sizeof tag, "global_step%lld", (long long)step);
    char *tag_dir = a->save_only_model ? zck__strdup(od->tmp_path) : zck__outdir_file(od, tag);
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.kind = a->save_only_model ? "safetensors" : "deepspeed";
    s = tag_dir ? zck_manifest_write_dir(tag_dir, &mo) : ZCK_ERR_NO_MEMORY;
    free(tag_dir);
  }
  if (s == ZCK_OK) s = zck__outdir_commit(od);
  free(cfg);
  free(model);
  free(state);
  return s;
}

static zck_status save_rank0(ze_ckpt_tracker *t, ze_zero_rank *zr0, int64_t step) {
  const ze_train_args *a = t->a;
  ZCK_TRY_CTX(zck__mkdirs(a->output_dir), "--output-dir");
  char *final = zck_saver_checkpoint_path(&t->sv, step, true);
  if (!final) return ZCK_ERR_NO_MEMORY;
  zck__outdir od;
  memset(&od, 0, sizeof od);
  zck_status s = zck__outdir_create(&od, final, true);
  if (s == ZCK_OK && !a->save_only_model) s = ze__ckpt_write_deepspeed(t, zr0, od.tmp_path, step, NULL);
  if (s == ZCK_OK) s = ze__ckpt_finish(t, zr0, &od, step, false);
  zck__outdir_abort(&od);
  if (s == ZCK_OK) s = zck_saver_rotate(&t->sv);
  if (s != ZCK_OK) s = zck__error_prepend(s, "saving %s", final);
  free(final);
  return s;
}

/* Rank 0 does the work; the outcome travels to every rank. */
static zck_status collective(ze_ckpt_tracker *t, ze_zero_rank *zr, zck_status (*fn)(ze_ckpt_tracker *, ze_zero_rank *, int64_t),
                             int64_t arg) {
  zck_comm *c = zr->comm;
  t->ranks[c->rank] = zr;
  ZCK_TRY(c->barrier(c));
  int32_t st = 0;
  char msg[1024] = "";
  if (c->rank == 0) {
    zck_status s = fn(t, zr, arg);
    st = (int32_t)s;
    if (s != ZCK_OK) snprintf(msg, sizeof msg, "%s", zck_last_error());
  }
  ZCK_TRY(c->broadcast(c, &st, 1, ZCK_I32, 0));
  if (st == ZCK_OK) return ZCK_OK;
  ZCK_TRY(c->broadcast(c, msg, sizeof msg, ZCK_U8, 0));
  return zck__fail((zck_status)st, "%s", msg);
}

zck_status ze_ckpt_save(ze_ckpt_tracker *t, ze_zero_rank *zr, int64_t step) {
  ZCK_TRY(ze_zero_sync(zr)); /* the savers read the state from other threads */
  if (t->per_rank) return ze__ckpt_save_per_rank(t, zr, step);
  return collective(t, zr, save_rank0, step);
}

// ---- load

void ze_ckpt_state_free(ze_ckpt_state *st) {
  if (!st) return;
  zck_ds_close(st->ds);
  if (st->resharded) zck_saver_temp_tree_remove(st->resharded);
  free(st->resharded);
  free(st->path);
  memset(st, 0, sizeof *st);
}

/* The checkpoint must be this run's model and ZeRO configuration (DeepSpeed refuses a
 * different dp world size when it loads optimizer states). */
zck_status ze__ckpt_check_fits(const ze_ckpt_tracker *t, const zck_ds_ckpt *c, const char *path) {
  const zck_ds_info *in = zck_ds_info_of(c);
  const zck_model *cm = zck_ds_model(c), *m = t->model;
  const ze_zero_plan *plan = t->plan;
  ZCK_FAIL_IF(in->stage != plan->o.stage, ZCK_ERR_MISMATCH, "%s: a ZeRO-%d checkpoint; this run uses ZeRO-%d", path,
              in->stage, plan->o.stage);
  ZCK_FAIL_IF(in->world_size != plan->o.world, ZCK_ERR_MISMATCH,
              "%s: The checkpoint being loaded used a DP world size of %u but the current world size is %u. Automatic "
              "adjustment of ZeRO's optimizer state partitioning with a new world size is not currently supported.",
              path, in->world_size, plan->o.world);
  ZCK_FAIL_IF(in->lp_dtype != plan->o.lp_dtype, ZCK_ERR_MISMATCH, "%s: saved with %s weights; this run uses %s (--bf16)",
              path, zck_dtype_name(in->lp_dtype), zck_dtype_name(plan->o.lp_dtype));
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
  ZCK_FAIL_IF(in->stage == 3 && in->sub_group_size != plan->o.sub_group_size, ZCK_ERR_MISMATCH,
              "%s: sub_group_size %llu in the checkpoint, %llu here", path, (unsigned long long)in->sub_group_size,
              (unsigned long long)plan->o.sub_group_size);
  return ZCK_OK;
}

/* Another ZeRO stage, world size or sub_group_size than this run's: the checkpoint goes
 * through the library's reshard first (into a temporary folder beside the output), as
 * `zckpt reshard` would, and is loaded from there. */
bool ze__ckpt_needs_reshard(const ze_ckpt_tracker *t, const zck_ds_info *in) {
  const ze_zero_plan *plan = t->plan;
  return in->stage != plan->o.stage || in->world_size != plan->o.world ||
         (plan->o.stage == 3 && in->sub_group_size != plan->o.sub_group_size);
}

zck_status ze__ckpt_reshard_for_run(const ze_ckpt_tracker *t, const char *path, const zck_ds_info *in, char **out) {
  const ze_zero_plan *plan = t->plan;
  const char *base = t->a->output_dir ? t->a->output_dir : "/tmp";
  char *dir = NULL;
  ZCK_TRY(zck_saver_temp_tree(base, "resume-resharded", "checkpoint", &dir));
  fprintf(stderr, "zckpt-train: %s is ZeRO-%d on %u ranks; resharding it for ZeRO-%d on %u ranks\n", path, in->stage,
          in->world_size, plan->o.stage, plan->o.world);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_stage = plan->o.stage;
  ro.to_world_size = plan->o.world;
  ro.sub_group_size = plan->o.stage == 3 ? plan->o.sub_group_size : 0;
  zck_status s = zck_reshard(path, dir, &ro);
  if (s != ZCK_OK) {
    zck_saver_temp_tree_remove(dir);
    free(dir);
    return zck__error_prepend(s, "resharding %s for this run", path);
  }
  *out = dir;
  return ZCK_OK;
}

zck_status ze_ckpt_load(ze_ckpt_tracker *t, const char *path, ze_ckpt_state *st, zck_comm *comm) {
  if (comm) return ze__ckpt_load_per_process(t, path, st, comm);
  memset(st, 0, sizeof *st);
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  oo.require_optimizer_state = true;
  zck_ds_ckpt *c = NULL;
  ZCK_TRY(zck_ds_open(path, &oo, &c));
  zck_status s = zck_manifest_check_complete(zck_ds_info_of(c)->dir, 0);
  if (s == ZCK_OK && ze__ckpt_needs_reshard(t, zck_ds_info_of(c))) {
    s = ze__ckpt_reshard_for_run(t, path, zck_ds_info_of(c), &st->resharded);
    zck_ds_close(c);
    c = NULL;
    if (s == ZCK_OK) s = zck_ds_open(st->resharded, &oo, &c);
  }
  if (s == ZCK_OK) s = ze__ckpt_check_fits(t, c, path);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    if (st->resharded) zck_saver_temp_tree_remove(st->resharded);
    free(st->resharded);
    st->resharded = NULL;
    return s;
  }
  const zck_ds_info *in = zck_ds_info_of(c);
  st->ds = c;
  st->path = zck__strdup(path);
  st->global_step = in->global_steps;
  st->optimizer_step = (int64_t)in->step;
  if (t->a->output_dir || t->a->load_best_model_at_end) zck_saver_read_trainer_state(&t->sv, path);
  return ZCK_OK;
}

zck_status ze_ckpt_restore_rank(ze_ckpt_state *st, ze_zero_rank *zr) {
  zck_state_view src;
  zck_ds_state(st->ds, &src);
  ze__state dst;
  zck_status s = ze__state_of_rank_target(zr, &dst);
  if (s == ZCK_OK) {
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec.threads = 1; /* the ranks already run in parallel */
    s = zck_transfer(&src, &dst.v, 1, &to);
    ze__state_free(&dst);
  }
  if (s != ZCK_OK) {
    s = zck__error_prepend(s, "rank %u: resuming from %s", zr->rank, st->path);
    zr->comm->abort(zr->comm);
    return s;
  }
  /* lp = RNE(fp32 master), as DeepSpeed's load_from_fp32_weights; then gather */
  zr->step = st->optimizer_step;
  return ze_zero_refresh_lp(zr);
}

// ---- load best (collective)

static zck_status open_best(ze_ckpt_tracker *t, ze_zero_rank *zr, int64_t arg) {
  ze_ckpt_state *st = zck__calloc(1, sizeof *st);
  if (!st) return ZCK_ERR_NO_MEMORY;
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  zck_ds_ckpt *c = NULL;
  zck_status s = zck_ds_open(t->sv.best_checkpoint, &oo, &c);
  if (s == ZCK_OK) s = ze__ckpt_check_fits(t, c, t->sv.best_checkpoint);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    free(st);
    return s;
  }
  st->ds = c;
  st->path = zck__strdup(t->sv.best_checkpoint);
  st->global_step = zck_ds_info_of(c)->global_steps;
  st->optimizer_step = (int64_t)zck_ds_info_of(c)->step;
  t->best_state = st;
  return ZCK_OK;
}

zck_status ze_ckpt_export_best(const ze_ckpt_tracker *t) {
  char *tmp = NULL;
  ZCK_TRY(zck_saver_temp_tree(t->a->output_dir, "best-model", "model", &tmp));
  zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
  co.dtype = t->plan->o.lp_dtype;
  zck_status s = zck_consolidate(t->sv.best_checkpoint, tmp, &co);
  static const char *const files[] = {"model.safetensors", "config.json"};
  for (size_t i = 0; s == ZCK_OK && i < sizeof files / sizeof files[0]; i++) {
    char *from = zck__path_join(tmp, files[i]), *to = zck__path_join(t->a->output_dir, files[i]);
    if (!from || !to) s = ZCK_ERR_NO_MEMORY;
    else if (rename(from, to) != 0) s = zck__fail_errno(errno, "%s: cannot move the best model into place", to);
    free(from);
    free(to);
  }
  if (s == ZCK_OK) s = zck__fsync_path(t->a->output_dir, true);
  zck_saver_temp_tree_remove(tmp);
  free(tmp);
  return s;
}

zck_status ze_ckpt_load_best(ze_ckpt_tracker *t, ze_zero_rank *zr) {
  if (t->per_rank) return ze__ckpt_load_best_per_rank(t, zr);
  ZCK_TRY(collective(t, zr, open_best, 0));
  zck_status s = ze_ckpt_restore_rank(t->best_state, zr);
  zck_status b = zr->comm->barrier(zr->comm);
  if (zr->comm->rank == 0) {
    ze_ckpt_state_free(t->best_state);
    free(t->best_state);
    t->best_state = NULL;
  }
  return s != ZCK_OK ? s : b;
}
