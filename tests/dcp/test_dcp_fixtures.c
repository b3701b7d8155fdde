/* test_dcp_fixtures.c: the DCP reader on real checkpoints torch itself wrote
 * (tests/fixtures/dcp, made by tests/fixtures/gen/make_dcp_fixtures.py): every weight and
 * Adam moment streamed through the one transfer from its chunks equals, bit for bit, what
 * torch's dcp_to_torch_save gives (expected.json holds its SHA-256s), and the model
 * manifest holds the param groups torch saved. */
#include "dcp/dcp.h"
#include "io.h"
#include "layout.h"
#include "sha256.h"
#include "test.h"
#include "transfer.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static cJSON *load_json(const char *path) {
  unsigned char *data;
  size_t n;
  if (zt_read_file(path, &data, &n)) ZT_FAIL("cannot read %s", path);
  cJSON *j = cJSON_ParseWithLength((const char *)data, n);
  free(data);
  ZT_ASSERT(j);
  return j;
}

/* Copies every part of the folder's view into whole tensors in memory. */
typedef struct whole {
  zck_layout *layout[ZCK_STATE_KINDS];
  zck_store *stores[ZCK_STATE_KINDS];
  void **mem[ZCK_STATE_KINDS];   /* [n_params]: NULL where the part does not hold p */
} whole;

static void transfer_whole(const zck_dcp *c, whole *w) {
  const zck_model *m = zck_dcp_model(c);
  zck_state_view src, dst;
  zck_dcp_state(c, &src);
  memset(&dst, 0, sizeof dst);
  dst.model = m;
  dst.name = "memory";
  uint64_t *numel = malloc(m->n_params * sizeof *numel);
  uint32_t *params = malloc(m->n_params * sizeof *params);
  zck_model_numels(m, numel);
  memset(w, 0, sizeof *w);
  int kinds[] = {ZCK_STATE_FP32, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ, ZCK_STATE_FROZEN};
  for (size_t ki = 0; ki < sizeof kinds / sizeof *kinds; ki++) {
    int k = kinds[ki];
    const zck_layout *sl = src.part[k].layout;
    if (!sl) continue;
    size_t n = 0;
    for (uint32_t p = 0; p < m->n_params; p++)
      if (zck_layout_param_covered(sl, p)) {
        ZT_EQ_U64(zck_layout_param_covered(sl, p), numel[p]);
        params[n++] = p;
      }
    ZT_OK(zck_layout_whole(m->n_params, numel, params, n, &w->layout[k]));
    w->stores[k] = calloc(n, sizeof *w->stores[k]);
    w->mem[k] = calloc(m->n_params, sizeof *w->mem[k]);
    for (size_t i = 0; i < n; i++) {
      uint32_t p = params[i];
      /* the stored dtype: no cast, so the bytes are torch's */
      zck_dtype dt = ZCK_DTYPE_INVALID;
      for (size_t q = sl->param_first[p]; q < sl->param_first[p + 1]; q++) dt = src.part[k].stores[sl->pieces[q].store].dtype;
      w->mem[k][p] = calloc(numel[p] ? numel[p] : 1, zck_dtype_size(dt));
      w->stores[k][i] = zck_store_memory(w->mem[k][p], dt, numel[p], m->params[p].name);
    }
    dst.part[k].layout = w->layout[k];
    dst.part[k].stores = w->stores[k];
  }
  ZT_OK(zck_transfer(&src, &dst, 1, NULL));
  free(numel);
  free(params);
}

static void whole_free(whole *w, size_t n_params) {
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    if (w->mem[k])
      for (size_t p = 0; p < n_params; p++) free(w->mem[k][p]);
    free(w->mem[k]);
    free(w->stores[k]);
    zck_layout_free(w->layout[k]);
  }
}

static void expect_sha(const cJSON *t, const void *data, uint64_t nbytes, const char *what) {
  char hex[65];
  zt_sha256_hex(data, nbytes, hex);
  const cJSON *want = cJSON_GetObjectItem(t, "sha256");
  ZT_ASSERT(want && cJSON_IsString(want));
  if (strcmp(hex, want->valuestring)) ZT_FAIL("%s: sha256 %s, torch's dcp_to_torch_save gives %s", what, hex, want->valuestring);
}

static void check_case(const char *name) {
  char rel[256];
  snprintf(rel, sizeof rel, "dcp/%s", name);
  char *dir = zt_fixture(rel);
  /* torchtitan's step-N: expected.json beside it */
  snprintf(rel, sizeof rel, "dcp/%.*s/expected.json", (int)strcspn(name, "/"), name);
  char *jpath = zt_fixture(rel);
  cJSON *exp = load_json(jpath);
  zck_dcp *c;
  ZT_OK(zck_dcp_open(dir, NULL, &c));
  const zck_model *m = zck_dcp_model(c);
  const zck_dcp_info *in = zck_dcp_info_of(c);
  const cJSON *case_ = cJSON_GetObjectItem(exp, "case");
  /* Accelerate and the HF Trainer: the model's folder and the optimizer's beside it, found
   * from the output_dir */
  bool accelerate = !strncmp(name, "accelerate", 10) || !strncmp(name, "hf_trainer", 10) || !strncmp(name, "fsdp1_", 6);
  ZT_EQ_INT(in->n_files, cJSON_GetObjectItem(case_, "world")->valueint * (accelerate ? 2 : 1));
  if (accelerate) ZT_ASSERT(strstr(in->dir, "/checkpoint-2/pytorch_model_fsdp_0"));
  /* st_*: safetensors storage (HuggingFaceStorageWriter): the model alone, no save id; its
   * expected.json is torch's own consolidation */
  bool st = !strncmp(name, "st_", 3);
  ZT_ASSERT(in->has_optimizer_state == !st);
  if (!st) ZT_ASSERT(in->save_id && strlen(in->save_id) == 36);

  /* the model weights: every model.<fqn> of dcp_to_torch_save, in its dtype */
  const cJSON *model = cJSON_GetObjectItem(exp, "model");
  ZT_EQ_INT(m->n_params, cJSON_GetArraySize(model));
  size_t n_outs;
  const zck_ds_output *outs = zck_dcp_outputs(c, &n_outs);
  ZT_EQ_INT(n_outs, m->n_params);
  whole w;
  transfer_whole(c, &w);
  for (size_t i = 0; i < n_outs; i++) {
    const zck_param *p = &m->params[outs[i].index];
    const cJSON *t = cJSON_GetObjectItem(model, p->name);
    if (!t) ZT_FAIL("%s: %s is not in torch's output", name, p->name);
    const char *want_dt = cJSON_GetObjectItem(t, "dtype")->valuestring;
    ZT_EQ_STR(want_dt, outs[i].dtype == ZCK_BF16 ? "torch.bfloat16" : "torch.float32");
    int k = outs[i].kind == ZCK_DS_OUT_FROZEN ? ZCK_STATE_FROZEN : ZCK_STATE_FP32;
    ZT_ASSERT(w.mem[k][outs[i].index]);
    expect_sha(t, w.mem[k][outs[i].index], p->numel * zck_dtype_size(outs[i].dtype), p->name);
  }
  /* Adam's moments, keyed by FQN */
  const cJSON *state = cJSON_GetObjectItem(exp, "optim_state");
  const cJSON *ps;
  size_t n_state = 0;
  cJSON_ArrayForEach(ps, state) {
    /* the optimizer's names are the module's (a PEFT adapter-only save's model keys drop
     * the adapter name) */
    int64_t p = -1;
    for (size_t q = 0; q < m->n_params && p < 0; q++)
      if (!strcmp(zck_dcp_param_module_name(c, (uint32_t)q), ps->string)) p = (int64_t)q;
    ZT_ASSERT(p >= 0);
    ZT_ASSERT(!m->params[p].frozen);
    const char *names[] = {"exp_avg", "exp_avg_sq"};
    int kinds[] = {ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ};
    for (int j = 0; j < 2; j++) {
      ZT_ASSERT(w.mem[kinds[j]][p]);
      expect_sha(cJSON_GetObjectItem(ps, names[j]), w.mem[kinds[j]][p],
                 m->params[p].numel * zck_dtype_size(in->state_dtype), ps->string);
    }
    n_state++;
  }
  size_t n_trainable = 0;
  for (size_t p = 0; p < m->n_params; p++) n_trainable += !m->params[p].frozen;
  ZT_EQ_INT(n_trainable, st ? m->n_params : n_state);

  /* param groups: settings and members as torch saved them. torchtitan's flattened
   * optimizer keeps per-param settings and no groups: the params of equal settings make
   * one, in model order (the run's two: weight decay 0.1 for the matrices, 0 for norms) */
  const cJSON *groups = cJSON_GetObjectItem(exp, "param_groups");
  if (!strncmp(name, "titan", 5)) {
    ZT_EQ_INT(m->n_groups, 2);
    ZT_EQ_INT(m->groups[0].n_params, 9);
    ZT_EQ_INT(m->groups[1].n_params, 3);
    ZT_ASSERT(zck_model_group_get(m, 0, "weight_decay")->f[0] == 0.1);
    ZT_ASSERT(zck_model_group_get(m, 1, "weight_decay")->f[0] == 0.0);
    ZT_EQ_STR(m->params[m->groups[1].params[0]].name, "model.layers.0.input_layernorm.weight");
    groups = NULL;
  }
  if (groups) ZT_EQ_INT(m->n_groups, cJSON_GetArraySize(groups));
  for (size_t g = 0; groups && g < m->n_groups; g++) {
    const cJSON *eg = cJSON_GetArrayItem(groups, (int)g);
    const zck_hparam *lr = zck_model_group_get(m, (uint32_t)g, "lr");
    const zck_hparam *wd = zck_model_group_get(m, (uint32_t)g, "weight_decay");
    const zck_hparam *betas = zck_model_group_get(m, (uint32_t)g, "betas");
    ZT_ASSERT(lr && lr->kind == ZCK_HP_FLOAT && lr->f[0] == cJSON_GetObjectItem(eg, "lr")->valuedouble);
    ZT_ASSERT(wd && wd->kind == ZCK_HP_FLOAT && wd->f[0] == cJSON_GetObjectItem(eg, "weight_decay")->valuedouble);
    ZT_ASSERT(betas && betas->kind == ZCK_HP_FLOATS && betas->n_floats == 2 &&
              betas->f[1] == cJSON_GetArrayItem(cJSON_GetObjectItem(eg, "betas"), 1)->valuedouble);
    const cJSON *params = cJSON_GetObjectItem(eg, "params");
    ZT_EQ_INT(m->groups[g].n_params, cJSON_GetArraySize(params));
    for (size_t i = 0; i < m->groups[g].n_params; i++)
      ZT_EQ_STR(zck_dcp_param_module_name(c, m->groups[g].params[i]), cJSON_GetArrayItem(params, (int)i)->valuestring);
  }
  whole_free(&w, m->n_params);
  zck_dcp_close(c);
  cJSON_Delete(exp);
  free(dir);
  free(jpath);
}

int main(void) {
  const char *cases[] = {"llama_tied_w2_fp32", "llama_untied_w3_fp32", "llama_tied_w3_bf16mp", "llama_untied_w2_bf16",
                         "accelerate_untied_w2_fp32", "llama_tied_w2_fp32_reloaded_w3",
                         "titan_untied_w2_fp32/step-3", "titan_untied_w2_fp32", "hf_trainer_tied_w2_fp32",
                         "hf_trainer_tied_w2_fp32/checkpoint-2", "llama_tp2_dp2_fp32",
                         "st_tp2_dp2_fp32/sharded",
                         /* FSDP1 SHARDED_STATE_DICT (make_dcp_fsdp1_fixtures.py) */
                         "fsdp1_accelerate_untied_w2_fp32", "fsdp1_accelerate_tied_w3_origparams",
                         "fsdp1_hf_trainer_tied_w2_fp32/checkpoint-2",
                         /* the HF Trainer's adapter-only save of a PEFT model (make_dcp_peft_fixtures.py) */
                         "hf_trainer_lora_w2_fp32"};
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) check_case(cases[i]);
  return 0;
}
