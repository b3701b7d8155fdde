/* dsconfig.c: "auto" resolution and mismatch rules of HF's DeepSpeed integration (see
 * dsconfig.h; transformers integrations/deepspeed.py, HfTrainerDeepSpeedConfig). */
#include "dsconfig.h"

#include "pyjson.h"

#include "io.h"
#include "util.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A value on the HF side: a number (int or float), a bool, or a list of floats. */
typedef struct hf_val {
  enum { HV_INT, HV_FLOAT, HV_BOOL, HV_FLOATS } kind;
  double v[2];
  int n;
} hf_val;

static hf_val hv_int(int64_t i) { return (hf_val){HV_INT, {(double)i, 0}, 1}; }
static hf_val hv_float(double f) { return (hf_val){HV_FLOAT, {f, 0}, 1}; }
static hf_val hv_bool(bool b) { return (hf_val){HV_BOOL, {b ? 1.0 : 0.0, 0}, 1}; }
static hf_val hv_floats2(double a, double b) { return (hf_val){HV_FLOATS, {a, b}, 2}; }

static void hv_print(const hf_val *h, zck__buf *b) {
  char f[40];
  switch (h->kind) {
  case HV_INT: zck__buf_printf(b, "%lld", (long long)h->v[0]); break;
  case HV_BOOL: zck__buf_str(b, h->v[0] != 0.0 ? "True" : "False"); break;
  case HV_FLOAT: zck_py_float_repr(h->v[0], f, sizeof f); zck__buf_str(b, f); break;
  case HV_FLOATS:
    zck__buf_byte(b, '[');
    for (int i = 0; i < h->n; i++) {
      zck_py_float_repr(h->v[i], f, sizeof f);
      zck__buf_printf(b, "%s%s", i ? ", " : "", f);
    }
    zck__buf_byte(b, ']');
    break;
  }
}

/* json.load's value as Python would print it in an f-string. */
static void json_print(const cJSON *j, zck__buf *b) {
  char f[40];
  if (cJSON_IsBool(j)) zck__buf_str(b, cJSON_IsTrue(j) ? "True" : "False");
  else if (cJSON_IsNull(j)) zck__buf_str(b, "None");
  else if (cJSON_IsString(j)) zck__buf_str(b, j->valuestring);
  else if (cJSON_IsNumber(j)) {
    double v = j->valuedouble;
    /* cJSON forgets whether "4" or "4.0" was written; integral values print as ints */
    if (v == floor(v) && fabs(v) < 9e15) zck__buf_printf(b, "%lld", (long long)v);
    else {
      zck_py_float_repr(v, f, sizeof f);
      zck__buf_str(b, f);
    }
  } else if (cJSON_IsArray(j)) {
    zck__buf_byte(b, '[');
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
      if (i) zck__buf_str(b, ", ");
      if (cJSON_IsString(c)) zck__buf_printf(b, "'%s'", c->valuestring);
      else json_print(c, b);
    }
    zck__buf_byte(b, ']');
  } else {
    char *t = cJSON_PrintUnformatted(j);
    zck__buf_str(b, t ? t : "?");
    cJSON_free(t);
  }
}

/* Python's ds_val != hf_val. */
static bool json_equals_hv(const cJSON *j, const hf_val *h) {
  if (h->kind == HV_FLOATS) {
    if (!cJSON_IsArray(j) || cJSON_GetArraySize(j) != h->n) return false;
    int i = 0;
    for (const cJSON *c = j->child; c; c = c->next, i++) {
      double x;
      if (cJSON_IsNumber(c)) x = c->valuedouble;
      else if (cJSON_IsBool(c)) x = cJSON_IsTrue(c) ? 1.0 : 0.0;
      else return false;
      if (x != h->v[i]) return false;
    }
    return true;
  }
  double x;
  if (cJSON_IsNumber(j)) x = j->valuedouble;
  else if (cJSON_IsBool(j)) x = cJSON_IsTrue(j) ? 1.0 : 0.0; /* True == 1 in Python */
  else return false;
  return x == h->v[0];
}

static cJSON *hv_to_json(const hf_val *h) {
  switch (h->kind) {
  case HV_INT:
  case HV_FLOAT: return cJSON_CreateNumber(h->v[0]);
  case HV_BOOL: return cJSON_CreateBool(h->v[0] != 0.0);
  case HV_FLOATS: return cJSON_CreateDoubleArray(h->v, h->n);
  }
  return NULL;
}

// ---- fill_match

typedef struct resolver {
  cJSON *root;
  zck__buf mismatches;
  int n_mismatch;
} resolver;

/* find_config_node: the parent object of a dotted key, or NULL when a section is missing. */
static cJSON *find_node(cJSON *root, const char *key, const char **leaf) {
  cJSON *node = root;
  const char *p = key;
  for (;;) {
    const char *dot = strchr(p, '.');
    if (!dot) break;
    char part[64];
    size_t n = (size_t)(dot - p) < sizeof part - 1 ? (size_t)(dot - p) : sizeof part - 1;
    memcpy(part, p, n);
    part[n] = 0;
    node = cJSON_GetObjectItemCaseSensitive(node, part);
    if (!node || !cJSON_IsObject(node)) return NULL;
    p = dot + 1;
  }
  *leaf = p;
  return node;
}

static bool is_auto(const cJSON *j) { return cJSON_IsString(j) && !strcmp(j->valuestring, "auto"); }

static void fill(resolver *r, const char *ds_key, hf_val hv, const char *hf_key, bool must_match) {
  const char *leaf;
  cJSON *node = find_node(r->root, ds_key, &leaf);
  if (!node) return;
  cJSON *cur = cJSON_GetObjectItemCaseSensitive(node, leaf);
  if (is_auto(cur)) {
    cJSON_ReplaceItemInObjectCaseSensitive(node, leaf, hv_to_json(&hv));
    return;
  }
  if (!must_match || !cur || cJSON_IsNull(cur)) return;
  if (json_equals_hv(cur, &hv)) return;
  zck__buf_printf(&r->mismatches, "\n- ds %s=", ds_key);
  json_print(cur, &r->mismatches);
  zck__buf_printf(&r->mismatches, " vs hf %s=", hf_key);
  hv_print(&hv, &r->mismatches);
  r->n_mismatch++;
}

static bool json_true(const cJSON *root, const char *key) {
  const char *leaf;
  cJSON *node = find_node((cJSON *)root, key, &leaf);
  const cJSON *v = node ? cJSON_GetObjectItemCaseSensitive(node, leaf) : NULL;
  return v && cJSON_IsTrue(v);
}

static const cJSON *json_get(const cJSON *root, const char *key) {
  const char *leaf;
  cJSON *node = find_node((cJSON *)root, key, &leaf);
  return node ? cJSON_GetObjectItemCaseSensitive(node, leaf) : NULL;
}

static int64_t warmup_for(const ze_train_args *a) {
  if (a->warmup_steps > 0) return a->warmup_steps;
  return (int64_t)ceil((double)a->max_steps * a->warmup_ratio);
}

// ---- the keys users tune (DeepSpeedZeroConfig's fields and validators)

/* An integer field: absent or null leaves *v; min is DeepSpeed's bound (ge / gt). */
static zck_status read_count(const cJSON *root, const char *name, const char *key, uint64_t min, uint64_t *v) {
  const cJSON *j = json_get(root, key);
  if (!j || cJSON_IsNull(j)) return ZCK_OK;
  ZCK_FAIL_IF(!cJSON_IsNumber(j) || j->valuedouble != floor(j->valuedouble), ZCK_ERR_INVALID_ARG,
              "%s: %s must be an integer", name, key);
  /* pydantic's words for gt=0 (min 1) and ge=0 (min 0) */
  ZCK_FAIL_IF(j->valuedouble < (double)min, ZCK_ERR_INVALID_ARG, "%s: %s=%.17g: Input should be greater than%s 0", name,
              key, j->valuedouble, min ? "" : " or equal to");
  *v = j->valuedouble >= 1.8e19 ? UINT64_MAX : (uint64_t)j->valuedouble;
  return ZCK_OK;
}

/* A pydantic bool: true/false (or 0/1); absent or null leaves *v. */
static zck_status read_bool(const cJSON *root, const char *name, const char *key, bool *v) {
  const cJSON *j = json_get(root, key);
  if (!j || cJSON_IsNull(j)) return ZCK_OK;
  if (cJSON_IsBool(j)) *v = cJSON_IsTrue(j);
  else if (cJSON_IsNumber(j) && (j->valuedouble == 0 || j->valuedouble == 1)) *v = j->valuedouble == 1;
  else return zck__fail(ZCK_ERR_INVALID_ARG, "%s: %s must be true or false", name, key);
  return ZCK_OK;
}

/* offload_optimizer / offload_param: device none | cpu | nvme, pin_memory, ratio. */
static zck_status read_offload(const cJSON *root, const char *name, const char *key, int stage, bool *on, bool *pinned) {
  char k[96];
  const cJSON *sec = json_get(root, key);
  if (!sec || cJSON_IsNull(sec)) return ZCK_OK;
  ZCK_FAIL_IF(!cJSON_IsObject(sec), ZCK_ERR_INVALID_ARG, "%s: %s must be an object", name, key);
  snprintf(k, sizeof k, "%s.device", key);
  const cJSON *d = json_get(root, k);
  const char *dev = "none";
  if (d && !cJSON_IsNull(d)) {
    ZCK_FAIL_IF(!cJSON_IsString(d) || (strcmp(d->valuestring, "none") && strcmp(d->valuestring, "cpu") &&
                                       strcmp(d->valuestring, "nvme")),
                ZCK_ERR_INVALID_ARG, "%s: %s: Input should be 'none', 'cpu' or 'nvme'", name, k);
    dev = d->valuestring;
  }
  ZCK_FAIL_IF(!strcmp(dev, "nvme"), ZCK_ERR_UNSUPPORTED,
              "%s: %s=nvme: NVMe offloading is not supported by zckpt-train (use \"cpu\" or \"none\")", name, k);
  bool pin = false; /* DeepSpeedZeroOffload*Config.pin_memory */
  snprintf(k, sizeof k, "%s.pin_memory", key);
  ZCK_TRY(read_bool(root, name, k, &pin));
  *pinned = pin;
  snprintf(k, sizeof k, "%s.ratio", key);
  const cJSON *ratio = json_get(root, k);
  if (ratio && !cJSON_IsNull(ratio)) {
    ZCK_FAIL_IF(!cJSON_IsNumber(ratio) || ratio->valuedouble < 0 || ratio->valuedouble > 1, ZCK_ERR_INVALID_ARG,
                "%s: %s must be a number in [0, 1]", name, k);
    /* DeepSpeedZeroConfig.offload_ratio_check */
    ZCK_FAIL_IF(!strcmp(dev, "cpu") && ratio->valuedouble < 1.0 && stage != 3, ZCK_ERR_INVALID_ARG,
                "%s: Partial offloading only supported for ZeRO Stage 3.", name);
  }
  *on = !strcmp(dev, "cpu");
  return ZCK_OK;
}

static zck_status read_tuning(const cJSON *root, const char *name, ze_ds_config *out) {
  /* DeepSpeed's defaults */
  out->reduce_bucket_size = 500000000;
  out->allgather_bucket_size = 500000000;
  out->prefetch_bucket_size = 50000000;
  out->max_live_parameters = 1000000000;
  out->overlap_comm = out->stage == 3; /* overlap_comm_valid: None -> stage 3 */
  out->contiguous_gradients = true;
  ZCK_TRY(read_count(root, name, "zero_optimization.reduce_bucket_size", 1, &out->reduce_bucket_size));
  ZCK_TRY(read_count(root, name, "zero_optimization.allgather_bucket_size", 0, &out->allgather_bucket_size));
  ZCK_TRY(read_count(root, name, "zero_optimization.stage3_prefetch_bucket_size", 0, &out->prefetch_bucket_size));
  ZCK_TRY(read_count(root, name, "zero_optimization.stage3_max_live_parameters", 0, &out->max_live_parameters));
  /* stage-3 residency (zexec.h); train.c reads the values from the resolved json */
  uint64_t unused = 0;
  ZCK_TRY(read_count(root, name, "zero_optimization.stage3_param_persistence_threshold", 0, &unused));
  ZCK_TRY(read_count(root, name, "zero_optimization.stage3_model_persistence_threshold", 0, &unused));
  ZCK_TRY(read_count(root, name, "zero_optimization.stage3_max_reuse_distance", 0, &unused));
  if (out->stage < 3) {
    /* DeepSpeedZeroOptimizer's assert, then a bucket that holds something */
    ZCK_FAIL_IF(out->allgather_bucket_size % 2, ZCK_ERR_INVALID_ARG,
                "%s: allgather_bucket_size must be a multiple of nccl_start_alignment_factor, 2 ", name);
    ZCK_FAIL_IF(!out->allgather_bucket_size, ZCK_ERR_INVALID_ARG,
                "%s: zero_optimization.allgather_bucket_size must be positive", name);
  }
  ZCK_TRY(read_bool(root, name, "zero_optimization.overlap_comm", &out->overlap_comm));
  const cJSON *oc = json_get(root, "zero_optimization.overlap_comm");
  out->overlap_comm_given = oc && !cJSON_IsNull(oc);
  ZCK_TRY(read_bool(root, name, "zero_optimization.contiguous_gradients", &out->contiguous_gradients));
  ZCK_TRY(read_offload(root, name, "zero_optimization.offload_optimizer", out->stage, &out->offload_optimizer,
                       &out->offload_optimizer_pin));
  ZCK_TRY(read_offload(root, name, "zero_optimization.offload_param", out->stage, &out->offload_param,
                       &out->offload_param_pin));
  const cJSON *ag = json_get(root, "zero_optimization.allgather_bucket_size");
  if (ag && !cJSON_IsNull(ag)) out->gather16_bucket_elems = out->allgather_bucket_size;
  /* the deprecated spellings (DeepSpeedZeroConfig's new_param_fn) */
  bool legacy = false;
  ZCK_TRY(read_bool(root, name, "zero_optimization.cpu_offload", &legacy));
  out->offload_optimizer = out->offload_optimizer || legacy;
  legacy = false;
  ZCK_TRY(read_bool(root, name, "zero_optimization.cpu_offload_param", &legacy));
  out->offload_param = out->offload_param || legacy;
  return ZCK_OK;
}

// ---- resolution and the engine's own checks

static zck_status resolve(cJSON *root, const char *name, const ze_train_args *a, ze_ds_config *out) {
  resolver r = {root, {0}, 0};
  zck__buf_init(&r.mismatches);
  int64_t B = a->per_device_train_batch_size, GAS = a->gradient_accumulation_steps;
  /* trainer_config_process */
  fill(&r, "train_micro_batch_size_per_gpu", hv_int(B), "per_device_train_batch_size", true);
  fill(&r, "gradient_accumulation_steps", hv_int(GAS), "gradient_accumulation_steps", true);
  fill(&r, "train_batch_size", hv_int((int64_t)ze_train_world(a) * B * GAS), "train_batch_size (calculated)", true);
  fill(&r, "gradient_clipping", hv_float(a->max_grad_norm), "max_grad_norm", true);
  fill(&r, "optimizer.params.lr", hv_float(a->learning_rate), "learning_rate", true);
  fill(&r, "optimizer.params.betas", hv_floats2(a->adam_beta1, a->adam_beta2), "adam_beta1+adam_beta2", true);
  fill(&r, "optimizer.params.eps", hv_float(a->adam_epsilon), "adam_epsilon", true);
  fill(&r, "optimizer.params.weight_decay", hv_float(a->weight_decay), "weight_decay", true);
  fill(&r, "scheduler.params.warmup_min_lr", hv_int(0), NULL, false);
  fill(&r, "scheduler.params.warmup_max_lr", hv_float(a->learning_rate), "learning_rate", true);
  fill(&r, "fp16.enabled", hv_bool(false), "fp16|fp16_full_eval", true);
  fill(&r, "bf16.enabled", hv_bool(a->bf16), "bf16|bf16_full_eval", true);
  /* the stage: accelerate takes it from the config; --zero-stage must agree with it */
  const cJSON *zo = cJSON_GetObjectItemCaseSensitive(root, "zero_optimization");
  if (zo && cJSON_IsObject(zo)) {
    if (a->zero_stage > 0) fill(&r, "zero_optimization.stage", hv_int(a->zero_stage), "zero_stage", true);
    else fill(&r, "zero_optimization.stage", hv_int(2), NULL, false);
  }
  bool zero3 = false;
  const cJSON *st = json_get(root, "zero_optimization.stage");
  if (st && cJSON_IsNumber(st) && st->valuedouble == 3) zero3 = true;
  /* trainer_config_finalize: hidden-size keys, scheduler steps */
  int64_t h = a->model.n_embd;
  fill(&r, "zero_optimization.reduce_bucket_size", hv_int(h * h), NULL, false);
  if (zero3) {
    fill(&r, "zero_optimization.stage3_prefetch_bucket_size", hv_int((int64_t)(0.9 * (double)h * (double)h)), NULL,
         false);
    fill(&r, "zero_optimization.stage3_param_persistence_threshold", hv_int(10 * h), NULL, false);
  }
  fill(&r, "scheduler.params.total_num_steps", hv_int(a->max_steps), "num_training_steps (calculated)", true);
  int64_t wu = warmup_for(a);
  fill(&r, "scheduler.params.warmup_num_steps", hv_int(wu > 1 ? wu : 1), "warmup_steps", true);
  if (r.n_mismatch) {
    out->message = zck__sprintf("Please correct the following DeepSpeed config values that mismatch "
                                "TrainingArguments values:%.*s\nThe easiest method is to set these DeepSpeed "
                                "config values to 'auto'.",
                                (int)r.mismatches.len, (const char *)r.mismatches.data);
    zck__buf_free(&r.mismatches);
    if (!out->message) return ZCK_ERR_NO_MEMORY;
    return zck__fail(ZCK_ERR_MISMATCH, "%s", out->message);
  }
  zck__buf_free(&r.mismatches);

  /* what the engine reads */
  ZCK_FAIL_IF(!zo || !cJSON_IsObject(zo), ZCK_ERR_INVALID_ARG,
              "%s: no \"zero_optimization\" section (accelerate requires one)", name);
  st = json_get(root, "zero_optimization.stage");
  ZCK_FAIL_IF(!st || !cJSON_IsNumber(st) || st->valuedouble != floor(st->valuedouble), ZCK_ERR_INVALID_ARG,
              "%s: zero_optimization.stage must be an integer", name);
  ZCK_FAIL_IF(st->valuedouble < 1 || st->valuedouble > 3, ZCK_ERR_UNSUPPORTED,
              "%s: zero_optimization.stage=%g: zckpt-train runs ZeRO stages 1, 2 and 3", name, st->valuedouble);
  out->stage = (int)st->valuedouble;
  const cJSON *sg = json_get(root, "zero_optimization.sub_group_size");
  out->sub_group_size = 1000000000ull;
  if (sg && !cJSON_IsNull(sg)) {
    ZCK_FAIL_IF(!cJSON_IsNumber(sg) || sg->valuedouble < 1 || sg->valuedouble > 1e18, ZCK_ERR_INVALID_ARG,
                "%s: zero_optimization.sub_group_size must be a positive number", name);
    out->sub_group_size = (uint64_t)sg->valuedouble;
  }
  ZCK_FAIL_IF(json_true(root, "zero_optimization.round_robin_gradients"), ZCK_ERR_UNSUPPORTED,
              "%s: zero_optimization.round_robin_gradients is not supported by zckpt-train", name);
  ZCK_FAIL_IF(json_true(root, "zero_optimization.elastic_checkpoint"), ZCK_ERR_UNSUPPORTED,
              "%s: zero_optimization.elastic_checkpoint is not supported by zckpt-train", name);
  ZCK_TRY(read_tuning(root, name, out));
  out->gather_16bit_on_save = json_true(root, "zero_optimization.stage3_gather_16bit_weights_on_model_save") ||
                              json_true(root, "zero_optimization.stage3_gather_fp16_weights_on_model_save") ||
                              json_true(root, "zero_optimization.gather_16bit_weights_on_model_save");
  /* DeepSpeed 0.19's switch for checkpoints written off the training path (its
   * DecoupledCheckpointEngine); HF TrainingArguments has none of its own */
  const cJSON *dec = json_get(root, "checkpoint.writer.decoupled");
  ZCK_FAIL_IF(dec && !cJSON_IsNull(dec) && !cJSON_IsBool(dec), ZCK_ERR_INVALID_ARG,
              "%s: checkpoint.writer.decoupled must be true or false", name);
  out->async_save = dec && cJSON_IsTrue(dec);
  const cJSON *opt = cJSON_GetObjectItemCaseSensitive(root, "optimizer");
  if (opt && !cJSON_IsNull(opt)) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(opt, "type");
    ZCK_FAIL_IF(!type || !cJSON_IsString(type) ||
                    (strcasecmp(type->valuestring, "AdamW") && strcasecmp(type->valuestring, "Adam")),
                ZCK_ERR_UNSUPPORTED, "%s: optimizer.type must be \"AdamW\" or \"Adam\"", name);
    const cJSON *wm = json_get(root, "optimizer.params.adam_w_mode");
    ZCK_FAIL_IF(wm && cJSON_IsFalse(wm), ZCK_ERR_UNSUPPORTED,
                "%s: optimizer.params.adam_w_mode=false (L2 Adam) is not supported by zckpt-train", name);
    out->has_optimizer = true;
  }
  const cJSON *sched = cJSON_GetObjectItemCaseSensitive(root, "scheduler");
  ZCK_FAIL_IF(sched && !cJSON_IsNull(sched), ZCK_ERR_UNSUPPORTED,
              "%s: \"scheduler\": DeepSpeed schedulers are not supported by zckpt-train; remove the section to use "
              "--lr-scheduler-type",
              name);
  ZCK_FAIL_IF(json_true(root, "fp16.enabled"), ZCK_ERR_UNSUPPORTED, "%s: fp16 is not supported; use bf16", name);
  return ZCK_OK;
}

zck_status ze_ds_config_parse(const char *text, const char *name, const ze_train_args *a, ze_ds_config *out) {
  memset(out, 0, sizeof *out);
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
  if (!root) {
    size_t off = end ? (size_t)(end - text) : 0;
    return zck__fail(ZCK_ERR_FORMAT, "%s: invalid JSON at byte %zu", name, off);
  }
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return zck__fail(ZCK_ERR_FORMAT, "%s: the top level is not a JSON object", name);
  }
  zck_status s = resolve(root, name, a, out);
  if (s != ZCK_OK) {
    cJSON_Delete(root);
    char *msg = out->message;
    memset(out, 0, sizeof *out);
    out->message = msg;
    return s;
  }
  out->json = root;
  return ZCK_OK;
}

zck_status ze_ds_config_load(const char *path, const ze_train_args *a, ze_ds_config *out) {
  char *text = NULL;
  size_t len = 0;
  memset(out, 0, sizeof *out);
  ZCK_TRY(zck__read_small_file(path, 16 << 20, &text, &len));
  zck_status s = ze_ds_config_parse(text, path, a, out);
  free(text);
  return s;
}

zck_status ze_ds_config_default(const ze_train_args *a, int stage, ze_ds_config *out) {
  memset(out, 0, sizeof *out);
  char text[512];
  snprintf(text, sizeof text,
           "{\"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": \"auto\","
           " \"train_batch_size\": \"auto\", \"gradient_clipping\": \"auto\","
           " \"bf16\": {\"enabled\": \"auto\"}, \"zero_optimization\": {\"stage\": %d}}",
           stage);
  return ze_ds_config_parse(text, "<default DeepSpeed config>", a, out);
}

void ze_ds_config_free(ze_ds_config *c) {
  if (!c) return;
  cJSON_Delete(c->json);
  free(c->message);
  memset(c, 0, sizeof *c);
}
