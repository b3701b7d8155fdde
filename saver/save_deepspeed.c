/* save_deepspeed.c: the DeepSpeed checkpoint of a save (saver.h): the writer reserves the
 * files DeepSpeed would write (formats/deepspeed), lib/transfer copies the ranks' memory
 * (the hooks' source view) into them. Also what the model-states pickle records besides
 * tensors: the ds_config and, when DeepSpeed owns the optimizer, its LambdaLR state. */
#include "saver_internal.h"

#include "deepspeed/deepspeed.h"
#include "deepspeed/ds_writer.h"
#include "error.h"
#include "transfer.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

/* The DeepSpeed version a checkpoint records (the one zckpt matches, bit for bit). */
#define ZCK_SAVER_DS_VERSION "0.19.8"

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
static zck_pk *lambda_lr_state(zck_pk_doc *d, const zck_saver *t, size_t n_groups, int64_t step) {
  double last = t->h.lr_at(t->h.ctx, step);
  zck_pk *st = zck_pk_new_dict(d, 0), *base = zck_pk_new_list(d), *ll = zck_pk_new_list(d), *lam = zck_pk_new_list(d);
  if (!st || !base || !ll || !lam) return NULL;
  for (size_t g = 0; g < n_groups; g++) {
    if (!zck_pk_append(d, base, zck_pk_new_float(d, t->tr.learning_rate)) || !zck_pk_append(d, ll, zck_pk_new_float(d, last)) ||
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

zck_status zck__saver_set_lr(zck_saver *t, int64_t step) {
  zck_model *m = (zck_model *)t->tr.model;
  /* param groups record the lr of the next step, as the live optimizer does */
  for (size_t g = 0; g < m->n_groups; g++) ZCK_TRY(zck_model_group_set_float(m, (uint32_t)g, "lr", t->h.lr_at(t->h.ctx, step)));
  return ZCK_OK;
}

zck_status zck__saver_write_deepspeed(zck_saver *t, const zck_saver_rank *r0, const char *root, int64_t step,
                                      const zck_saver_rank *only, zck_ds_writer **keep) {
  if (keep) *keep = NULL;
  const zck_saver_train *tr = &t->tr;
  zck_model *m = (zck_model *)tr->model;
  if (!only) ZCK_TRY(zck__saver_set_lr(t, step)); /* per rank: done before the ranks start writing */
  zck_pk_doc *doc = zck_pk_doc_new();
  if (!doc) return ZCK_ERR_NO_MEMORY;
  zck_ds_write_opts o = ZCK_DS_WRITE_OPTS_INIT;
  o.stage = tr->stage;
  o.world_size = tr->world;
  o.sub_group_size = tr->sub_group_size;
  o.lp_dtype = tr->lp_dtype;
  o.global_steps = step;
  o.global_samples = step * tr->samples_per_step;
  o.has_optimizer_state = r0->optimizer_step > 0;
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(tr->ds_config, "optimizer");
  bool ds_opt = opt && !cJSON_IsNull(opt);
  /* torch AdamW (the HF optimizer, or torch_adam) keeps a tensor step; FusedAdam an int */
  const cJSON *ta = ds_opt ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(opt, "params"), "torch_adam")
                           : NULL;
  o.step_is_tensor = !ds_opt || cJSON_IsTrue(ta);
  o.step = (double)r0->optimizer_step;
  o.clip_grad = tr->max_grad_norm;
  o.ds_version = ZCK_SAVER_DS_VERSION;
  o.ds_config = json_to_pk(doc, tr->ds_config);
  o.lr_scheduler = ds_opt ? lambda_lr_state(doc, t, m->n_groups, step) : NULL;
  o.save_latest = !only; /* per rank: rank 0 writes `latest` once every rank's files are in */
  zck_ds_writer *w = NULL;
  zck__saver_view src;
  memset(&src, 0, sizeof src);
  zck_status s = ZCK_OK;
  if (!o.ds_config || (ds_opt && !o.lr_scheduler)) {
    s = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    goto out;
  }
  /* per rank: a writer of this rank's files alone, straight into root/<tag> (rank 0 made it) */
  if (only) ZCK_CHECK_GOTO(zck__ds_writer_create_rank(root, m, &o, (uint32_t)only->comm->rank, &w), s, out);
  else ZCK_CHECK_GOTO(zck_ds_writer_create(root, m, &o, &w), s, out);
  /* the manifest's hashes are made from the bytes as the transfer writes them */
  if (keep) zck__ds_writer_hash_inline(w, 0, 0);
  /* the 16-bit module weights are rank 0's (stage 1/2: its lp flat and frozen copies) */
  ZCK_CHECK_GOTO(zck__saver_source(t, only ? only->mem : NULL, !only || only->comm->rank == 0 ? r0->mem : NULL, &src),
                 s, out);
  zck_state_view dst;
  zck_ds_writer_state(w, &dst);
  zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
  to.partial = only != NULL; /* one rank's source covers only its own part of the files */
  ZCK_CHECK_GOTO(zck_transfer(&src.v, &dst, 1, &to), s, out);
  s = zck_ds_writer_commit(w);
  if (s == ZCK_OK && keep) {
    *keep = w;
    w = NULL;
  }
out:
  zck__saver_view_free(t, &src);
  zck_ds_writer_free(w);
  zck_pk_doc_free(doc);
  return s;
}
