/* ckpt.c: placeholder until the DeepSpeed writer lands. */
#include "ckpt.h"

#include "util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

zck_status ze_ckpt_tracker_init(ze_ckpt_tracker *t, const ze_train_args *a, const ze_gpt2_config *cfg,
                                const zck_model *model, const ze_zero_plan *plan, const cJSON *ds_json, bool gather16) {
  memset(t, 0, sizeof *t);
  t->a = a; t->cfg = cfg; t->model = model; t->plan = plan; t->ds_json = ds_json; t->gather16 = gather16;
  t->best_metric = NAN;
  return ZCK_OK;
}
void ze_ckpt_tracker_free(ze_ckpt_tracker *t) { memset(t, 0, sizeof *t); }
void ze_ckpt_log(ze_ckpt_tracker *t, int64_t step, const char *key, double loss, double grad_norm, double lr) {}
void ze_ckpt_log_eval(ze_ckpt_tracker *t, int64_t step, double eval_loss) {}
zck_status ze_ckpt_save(ze_ckpt_tracker *t, ze_zero_rank *zr, int64_t step) {
  return zck__fail(ZCK_ERR_UNSUPPORTED, "saving checkpoints is not available yet");
}
zck_status ze_ckpt_load(ze_ckpt_tracker *t, const char *path, ze_ckpt_state *st) {
  memset(st, 0, sizeof *st);
  return zck__fail(ZCK_ERR_UNSUPPORTED, "resuming is not available yet");
}
zck_status ze_ckpt_restore_rank(ze_ckpt_state *st, ze_zero_rank *zr) { return ZCK_ERR_UNSUPPORTED; }
zck_status ze_ckpt_load_best(ze_ckpt_tracker *t, ze_zero_rank *zr) { return ZCK_ERR_UNSUPPORTED; }
void ze_ckpt_state_free(ze_ckpt_state *st) {}
