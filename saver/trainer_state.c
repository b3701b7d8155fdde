/* trainer_state.c: the Trainer's bookkeeping of a run (saver.h): log history, best metric
 * and best checkpoint, and trainer_state.json as TrainerState.save_to_json writes it
 * (sorted keys, indent 2, final newline), read back on resume. */
#include "saver_internal.h"

#include "error.h"
#include "io.h"
#include "pyjson.h"
#include "stream_hash.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

zck_status zck_saver_init(zck_saver *s, const zck_saver_opts *o, const zck_saver_train *tr, const zck_saver_hooks *h) {
  memset(s, 0, sizeof *s);
  /* the background writers of ranks that are processes write their own files and meet in
   * the checkpoint folder (save_async_ranks.c) */
  ZCK_FAIL_IF(tr->async_save && tr->per_rank && !tr->one_rank, ZCK_ERR_UNSUPPORTED,
              "async saves of ranks that are threads are written by one process: drop the per-rank save");
  s->o = *o;
  s->tr = *tr;
  s->h = *h;
  s->best_metric = NAN;
  s->log_history = cJSON_CreateArray();
  if (!s->log_history) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  return ZCK_OK;
}

void zck_saver_free(zck_saver *s) {
  if (!s) return;
  zck__saver_job_end(s); /* a background save still being written finishes first */
  free(s->best_checkpoint);
  cJSON_Delete(s->log_history);
  memset(s, 0, sizeof *s);
}

static double hf_round4(double x) {
  char b[64];
  snprintf(b, sizeof b, "%.4f", x);
  return strtod(b, NULL);
}

static double epoch_of(const zck_saver *s, int64_t step) { return (double)step / (double)s->o.max_steps; }

void zck_saver_log(zck_saver *t, int64_t step, const char *key, double loss, double grad_norm, double lr) {
  cJSON *e = cJSON_CreateObject();
  if (!e) return;
  cJSON_AddNumberToObject(e, "epoch", epoch_of(t, step));
  cJSON_AddNumberToObject(e, "grad_norm", grad_norm);
  cJSON_AddNumberToObject(e, "learning_rate", lr);
  cJSON_AddNumberToObject(e, key, hf_round4(loss));
  cJSON_AddNumberToObject(e, "step", (double)step);
  cJSON_AddItemToArray(t->log_history, e);
}

void zck_saver_log_eval(zck_saver *t, int64_t step, double eval_loss) {
  cJSON *e = cJSON_CreateObject();
  if (e) {
    cJSON_AddNumberToObject(e, "epoch", epoch_of(t, step));
    cJSON_AddNumberToObject(e, "eval_loss", eval_loss);
    cJSON_AddNumberToObject(e, "step", (double)step);
    cJSON_AddItemToArray(t->log_history, e);
  }
  /* eval_loss: lower is better (greater_is_better false) */
  bool better = t->o.greater_is_better ? eval_loss > t->best_metric : eval_loss < t->best_metric;
  if (isnan(t->best_metric) || better) {
    t->best_metric = eval_loss;
    t->best_step = step;
  }
}

char *zck_saver_checkpoint_path(zck_saver *t, int64_t step, bool keeper) {
  char name[64];
  snprintf(name, sizeof name, "checkpoint-%lld", (long long)step);
  char *final = zck__path_join(t->o.output_dir, name);
  /* best model: this step's evaluation was the best so far */
  if (final && keeper && !isnan(t->best_metric) && t->best_step == step) {
    free(t->best_checkpoint);
    t->best_checkpoint = zck__strdup(final);
  }
  return final;
}


static zck_status write_text(const char *path, const zck__buf *b) {
  if (b->failed) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  zck__outfile f;
  ZCK_TRY(zck__outfile_create(&f, path));
  zck_status s = zck__outfile_pwrite(&f, b->data, b->len, 0);
  if (s == ZCK_OK) return zck__outfile_commit(&f);
  zck__outfile_abort(&f);
  return s;
}

/* trainer_state.json (TrainerState.save_to_json: sorted keys, indent 2, final newline). */
zck_status zck_saver_write_trainer_state(const zck_saver *t, const char *path, int64_t step,
                                         zck__manifest_known *known, size_t *cap, const char *relpath) {
  const zck_saver_opts *a = &t->o;
  cJSON *st = cJSON_CreateObject();
  if (!st) return ZCK_ERR_NO_MEMORY;
  bool has_best = !isnan(t->best_metric);
  if (has_best) cJSON_AddNumberToObject(st, "best_global_step", (double)t->best_step);
  else cJSON_AddNullToObject(st, "best_global_step");
  if (has_best) cJSON_AddItemToObject(st, "best_metric", zck_py_float(t->best_metric));
  else cJSON_AddNullToObject(st, "best_metric");
  if (t->best_checkpoint) cJSON_AddStringToObject(st, "best_model_checkpoint", t->best_checkpoint);
  else cJSON_AddNullToObject(st, "best_model_checkpoint");
  cJSON_AddItemToObject(st, "epoch", zck_py_float(epoch_of(t, step)));
  cJSON_AddNumberToObject(st, "eval_steps", (double)(a->eval_steps > 0 ? a->eval_steps : a->logging_steps));
  cJSON_AddNumberToObject(st, "global_step", (double)step);
  cJSON_AddBoolToObject(st, "is_hyper_param_search", false);
  cJSON_AddBoolToObject(st, "is_local_process_zero", true);
  cJSON_AddBoolToObject(st, "is_world_process_zero", true);
  cJSON *hist = cJSON_Duplicate(t->log_history, 1);
  for (cJSON *e = hist ? hist->child : NULL; e; e = e->next)
    for (cJSON *v = e->child; v; v = v->next)
      if (strcmp(v->string, "step")) v->type |= ZCK_PY_FLOAT;
  cJSON_AddItemToObject(st, "log_history", hist);
  cJSON_AddNumberToObject(st, "logging_steps", (double)a->logging_steps);
  cJSON_AddNumberToObject(st, "max_steps", (double)a->max_steps);
  cJSON_AddNumberToObject(st, "num_input_tokens_seen", 0);
  cJSON_AddNumberToObject(st, "num_train_epochs", 1);
  cJSON_AddNumberToObject(st, "save_steps", (double)a->save_steps);
  cJSON_AddItemToObject(st, "stateful_callbacks", cJSON_CreateObject());
  cJSON_AddNumberToObject(st, "total_flos", 0);
  cJSON_AddNumberToObject(st, "train_batch_size", a->train_batch_size);
  cJSON_AddNullToObject(st, "trial_name");
  cJSON_AddNullToObject(st, "trial_params");
  zck__buf b;
  zck__buf_init(&b);
  zck_py_json(&b, st, 0);
  zck__buf_byte(&b, '\n');
  cJSON_Delete(st);
  zck_status s = write_text(path, &b);
  if (s == ZCK_OK && known) s = zck__known_bytes(known, cap, path, relpath, b.data, b.len);
  zck__buf_free(&b);
  return s;
}

/* trainer_state.json: log history and the best checkpoint so far (absent: fine). */
void zck_saver_read_trainer_state(zck_saver *t, const char *path) {
  char *p = zck__path_join(path, "trainer_state.json"), *text = NULL;
  size_t len;
  if (!p || zck__read_small_file(p, 64 << 20, &text, &len) != ZCK_OK) {
    free(p);
    zck_clear_error();
    return;
  }
  free(p);
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) return;
  cJSON *hist = cJSON_GetObjectItemCaseSensitive(j, "log_history");
  if (cJSON_IsArray(hist)) {
    cJSON_Delete(t->log_history);
    t->log_history = cJSON_DetachItemViaPointer(j, hist);
  }
  const cJSON *bm = cJSON_GetObjectItemCaseSensitive(j, "best_metric"),
              *bs = cJSON_GetObjectItemCaseSensitive(j, "best_global_step"),
              *bc = cJSON_GetObjectItemCaseSensitive(j, "best_model_checkpoint");
  if (cJSON_IsNumber(bm) && cJSON_IsNumber(bs)) {
    t->best_metric = bm->valuedouble;
    t->best_step = (int64_t)bs->valuedouble;
  }
  if (cJSON_IsString(bc)) {
    free(t->best_checkpoint);
    t->best_checkpoint = zck__strdup(bc->valuestring);
  }
  cJSON_Delete(j);
}

