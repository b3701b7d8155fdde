/* test_ds_describe.c: zck_ds_open on every real DeepSpeed fixture
 * (tests/fixtures/deepspeed/<case>/ckpt, made by tests/fixtures/gen/make_deepspeed_fixtures.py)
 * gets every fact of its expected.json right: stage, world size, dtypes, tag, counters,
 * params in order, frozen / trainable, buffers, ties, param groups and hyper-parameters,
 * and the zero_to_fp32 recipe (key order, dtypes, shapes, ties). The recipe's tensors are
 * then materialised through the checkpoint's parts (plan + exec, in place) and compared
 * by SHA-256 with what DeepSpeed's own zero_to_fp32 produced. */
#include "ds_test_util.h"
#include "sha256.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static zck_dtype dtype_of(const char *s) { return zck_dtype_parse(s); }

static const cJSON *get(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!v) ZT_FAIL("expected.json lacks '%s'", k);
  return v;
}

static int in_list(const cJSON *arr, const char *name) {
  const cJSON *it;
  cJSON_ArrayForEach(it, arr) if (cJSON_IsString(it) && !strcmp(it->valuestring, name)) return 1;
  return 0;
}

static void check_shape(const char *what, int ndim, const int64_t *shape, const cJSON *jshape) {
  ZT_ASSERT(cJSON_IsArray(jshape));
  if (cJSON_GetArraySize(jshape) != ndim) ZT_FAIL("%s: ndim %d, expected %d", what, ndim, cJSON_GetArraySize(jshape));
  for (int i = 0; i < ndim; i++)
    if ((double)shape[i] != cJSON_GetArrayItem(jshape, i)->valuedouble) ZT_FAIL("%s: dim %d differs", what, i);
}

static void check_hparams(const zck_model *m, uint32_t g, const cJSON *hp) {
  const cJSON *it;
  cJSON_ArrayForEach(it, hp) {
    const zck_hparam *h = zck_model_group_get(m, g, it->string);
    if (!h) ZT_FAIL("group %u: hyper-parameter '%s' missing", g, it->string);
    if (cJSON_IsNull(it)) ZT_EQ_INT(h->kind, ZCK_HP_NONE);
    else if (cJSON_IsBool(it)) { ZT_EQ_INT(h->kind, ZCK_HP_BOOL); ZT_EQ_INT(h->i, cJSON_IsTrue(it)); }
    else if (cJSON_IsNumber(it)) {
      double v = h->kind == ZCK_HP_INT ? (double)h->i : h->f[0];
      if (h->kind != ZCK_HP_INT && h->kind != ZCK_HP_FLOAT) ZT_FAIL("group %u '%s': kind %d", g, it->string, h->kind);
      if (v != it->valuedouble) ZT_FAIL("group %u '%s': %.17g != %.17g", g, it->string, v, it->valuedouble);
    } else if (cJSON_IsArray(it)) {
      ZT_EQ_INT(h->kind, ZCK_HP_FLOATS);
      ZT_EQ_INT(h->n_floats, cJSON_GetArraySize(it));
      for (int k = 0; k < h->n_floats; k++)
        if (h->f[k] != cJSON_GetArrayItem(it, k)->valuedouble) ZT_FAIL("group %u '%s'[%d] differs", g, it->string, k);
    }
  }
}

/* Every output tensor of the recipe, materialised, has zero_to_fp32's SHA-256. */
static void check_values(const zck_ds_ckpt *c, const cJSON *tensors) {
  const zck_model *m = zck_ds_model(c);
  size_t n;
  const zck_ds_output *out = zck_ds_outputs(c, &n);
  zck_ds_view fp32, frozen = {0}, buffers = zck_ds_buffers(c);
  ZT_OK(zck_ds_get(c, ZCK_DS_FP32, &fp32));
  int has_frozen = zck_ds_get(c, ZCK_DS_FROZEN, &frozen) == ZCK_OK;
  for (size_t i = 0; i < n; i++) {
    const zck_ds_output *o = &out[i];
    const zck_ds_output *src = o->kind == ZCK_DS_OUT_ALIAS ? &out[o->alias_of] : o;
    void *buf = NULL;
    if (src->kind == ZCK_DS_OUT_BUFFER) buf = zt_ds_read_buffer(&buffers, m, src->index, o->dtype);
    else if (src->kind == ZCK_DS_OUT_FROZEN) { ZT_ASSERT(has_frozen); buf = zt_ds_read_param(&frozen, m, src->index, o->dtype); }
    else buf = zt_ds_read_param(&fp32, m, src->index, o->dtype);
    if (!buf) ZT_FAIL("%s: cannot materialise: %s", o->name, zck_last_error());
    char hex[65];
    zt_sha256_hex(buf, (size_t)(o->numel * zck_dtype_size(o->dtype)), hex);
    free(buf);
    const cJSON *t = get(tensors, o->name);
    if (strcmp(hex, get(t, "sha256")->valuestring)) ZT_FAIL("%s: sha256 %s != zero_to_fp32's %s", o->name, hex, get(t, "sha256")->valuestring);
  }
}

/* Every trainable param's fp32 master, materialised, has the live engine's SHA-256. */
static void check_live_values(const zck_ds_ckpt *c, const cJSON *live) {
  const zck_model *m = zck_ds_model(c);
  zck_ds_view fp32;
  ZT_OK(zck_ds_get(c, ZCK_DS_FP32, &fp32));
  size_t n = 0;
  for (size_t p = 0; p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    if (pp->frozen || pp->tied_to >= 0) continue;
    void *buf = zt_ds_read_param(&fp32, m, (uint32_t)p, ZCK_F32);
    if (!buf) ZT_FAIL("%s: cannot materialise: %s", pp->name, zck_last_error());
    char hex[65];
    zt_sha256_hex(buf, (size_t)(pp->numel * 4), hex);
    free(buf);
    if (strcmp(hex, get(get(live, pp->name), "sha256")->valuestring)) ZT_FAIL("%s: fp32 master differs from the live engine's", pp->name);
    n++;
  }
  ZT_EQ_INT(n, cJSON_GetArraySize(live));
}

static void check_case(const char *name) {
  cJSON *e = zt_ds_expected(name);
  if (!e) ZT_FAIL("%s: cannot parse expected.json", name);
  char *path = zt_ds_ckpt_path(name);
  const cJSON *z2f = get(e, "zero_to_fp32");
  const cJSON *err = cJSON_GetObjectItemCaseSensitive(z2f, "error");
  zck_ds_ckpt *c = NULL;
  zck_status s = zck_ds_open(path, NULL, &c);
  if (s != ZCK_OK) ZT_FAIL("%s: zck_ds_open: %s", name, zck_last_error());
  const zck_ds_info *in = zck_ds_info_of(c);
  const char *opt = get(get(e, "engine"), "engine_optimizer")->valuestring;
  ZT_EQ_INT(in->bf16_optimizer, !strcmp(opt, "BF16_Optimizer"));
  bool zero0 = get(e, "stage")->valueint == 0;
  if (zero0) {
    /* ZeRO-0: zero_to_fp32 fails ('NoneType' object is not iterable: no param_shapes); the
     * masters must be the live engine's, the manifest below must name every param right */
    ZT_ASSERT(err && cJSON_IsString(err) && strstr(err->valuestring, "'NoneType' object is not iterable"));
    ZT_EQ_INT(in->stage, 0);
    check_live_values(c, get(e, "live_fp32_params"));
  } else if (err && cJSON_IsString(err) && cJSON_GetObjectItemCaseSensitive(e, "live_optim_states")) {
    /* NVMe offload: zero_to_fp32 meets the swapped sub-groups' empty partitions ("consumed N
     * numels out of M"); the masters, read from offloaded_tensors/, are the live engine's */
    ZT_ASSERT(strstr(err->valuestring, "consumed") && in->stage == 3);
    check_live_values(c, get(e, "live_fp32_params"));
    fprintf(stderr, "  %s: NVMe offload; fp32 masters equal the live engine's (test_nvme: the rest)\n", name);
    zck_ds_close(c);
    free(path);
    cJSON_Delete(e);
    return;
  } else if (err && cJSON_IsString(err)) {
    /* zero_to_fp32 refuses BF16_Optimizer files ("is not a zero checkpoint"): the fp32
     * masters must be those the live engine held (safe_get_full_fp32_param) */
    ZT_ASSERT(in->bf16_optimizer && strstr(err->valuestring, "is not a zero checkpoint"));
    check_live_values(c, get(e, "live_fp32_params"));
    fprintf(stderr, "  %s: BF16_Optimizer read as stage %d; fp32 masters equal the live engine's\n", name, in->stage);
    zck_ds_close(c);
    free(path);
    cJSON_Delete(e);
    return;
  }
  const zck_model *m = zck_ds_model(c);
  const char *dt = get(e, "dtype")->valuestring;
  ZT_EQ_INT(in->stage, get(e, "stage")->valueint);
  ZT_EQ_INT(in->world_size, get(e, "world_size")->valueint);
  ZT_EQ_STR(in->tag, get(e, "tag")->valuestring);
  ZT_EQ_INT(in->lp_dtype, dtype_of(dt));
  ZT_EQ_INT(in->bf16_prefix, !zero0 && !strcmp(dt, "bf16"));   /* ZeRO-0 has no optimizer files */
  ZT_EQ_INT(in->master_dtype, ZCK_F32);
  const cJSON *engine = get(e, "engine");
  ZT_EQ_INT(in->global_steps, get(engine, "global_steps")->valueint);
  ZT_ASSERT(in->has_optimizer_state);
  /* torch AdamW (torch_adam: true) keeps a tensor step; DeepSpeed's FusedAdam an int */
  bool fused = strstr(get(engine, "basic_optimizer")->valuestring, "FusedAdam") != NULL;
  ZT_ASSERT(in->step_is_tensor == !fused);
  /* FP16_UnfusedOptimizer and FP16_Optimizer (ZeRO-0 bf16 / fp16) step once when built */
  bool wrapped = !strcmp(opt, "FP16_UnfusedOptimizer") || !strcmp(opt, "FP16_Optimizer");
  ZT_ASSERT(in->step == (double)get(engine, "global_steps")->valueint + (wrapped ? 1 : 0));
  ZT_ASSERT(in->ds_version && !strncmp(in->ds_version, "0.", 2));

  /* params: named_parameters order (aliases aside); DeepSpeed does not optimize zero-numel
   * params, so the manifest (like frozen_param_shapes) files them as frozen */
  const cJSON *names = get(e, "param_names"), *trainable = get(e, "trainable"), *frozen = get(e, "frozen");
  size_t k = 0;
  for (size_t p = 0; p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    if (pp->tied_to >= 0) {
      const cJSON *t = get(get(e, "model_tied"), pp->name);
      ZT_EQ_STR(m->params[pp->tied_to].name, t->valuestring);
      continue;
    }
    const cJSON *nm = cJSON_GetArrayItem(names, (int)k++);
    if (!nm) ZT_FAIL("%s: extra param %s", name, pp->name);
    ZT_EQ_STR(pp->name, nm->valuestring);
    int exp_frozen = in_list(frozen, pp->name) || (in_list(trainable, pp->name) && pp->numel == 0);
    if (pp->frozen != exp_frozen) ZT_FAIL("%s: %s frozen=%d expected %d", name, pp->name, pp->frozen, exp_frozen);
  }
  ZT_EQ_INT(k, cJSON_GetArraySize(names));
  ZT_EQ_INT(cJSON_GetArraySize(get(e, "model_tied")), (int)(m->n_params - k));
  const cJSON *bn = get(e, "buffer_names");
  ZT_EQ_INT(m->n_buffers, cJSON_GetArraySize(bn));
  for (size_t b = 0; b < m->n_buffers; b++) ZT_EQ_STR(m->buffers[b].name, cJSON_GetArrayItem(bn, (int)b)->valuestring);

  /* param groups: params in group order (zero-numel ones are not in DeepSpeed's groups) */
  const cJSON *pgs = get(e, "param_groups");
  ZT_EQ_INT(m->n_groups, cJSON_GetArraySize(pgs));
  for (size_t g = 0; g < m->n_groups; g++) {
    const cJSON *pg = cJSON_GetArrayItem(pgs, (int)g), *it;
    size_t j = 0;
    cJSON_ArrayForEach(it, get(pg, "params")) {
      int64_t p = zck_model_find_param(m, it->valuestring);
      ZT_ASSERT(p >= 0);
      if (m->params[p].numel == 0) continue;
      if (j >= m->groups[g].n_params) ZT_FAIL("%s: group %zu too short", name, g);
      ZT_EQ_STR(m->params[m->groups[g].params[j]].name, it->valuestring);
      ZT_EQ_INT(m->params[p].group, (int)g);
      j++;
    }
    ZT_EQ_INT(j, m->groups[g].n_params);
    check_hparams(m, (uint32_t)g, get(pg, "hyperparameters"));
  }

  if (zero0) {
    fprintf(stderr, "  %s: ZeRO-0 (%s): params, groups and fp32 masters equal the live engine's\n", name, opt);
    zck_ds_close(c);
    free(path);
    cJSON_Delete(e);
    return;
  }
  /* the zero_to_fp32 recipe */
  size_t n_out;
  const zck_ds_output *out = zck_ds_outputs(c, &n_out);
  const cJSON *order = get(z2f, "key_order"), *tensors = get(z2f, "tensors"), *tied = get(z2f, "tied");
  ZT_EQ_INT(n_out, cJSON_GetArraySize(order));
  for (size_t i = 0; i < n_out; i++) {
    ZT_EQ_STR(out[i].name, cJSON_GetArrayItem(order, (int)i)->valuestring);
    const cJSON *t = get(tensors, out[i].name);
    if (out[i].dtype != dtype_of(get(t, "dtype")->valuestring))
      ZT_FAIL("%s: %s: dtype %s, zero_to_fp32 gives %s", name, out[i].name, zck_dtype_name(out[i].dtype),
              get(t, "dtype")->valuestring);
    check_shape(out[i].name, out[i].ndim, out[i].shape, get(t, "shape"));
    const cJSON *ti = cJSON_GetObjectItemCaseSensitive(tied, out[i].name);
    ZT_EQ_INT(out[i].kind == ZCK_DS_OUT_ALIAS, ti != NULL);
    if (ti) ZT_EQ_STR(out[out[i].alias_of].name, ti->valuestring);
  }
  check_values(c, tensors);

  /* trainable params are fully covered by the ZeRO layout */
  zck_ds_view v;
  ZT_OK(zck_ds_get(c, ZCK_DS_FP32, &v));
  for (size_t p = 0; p < m->n_params; p++)
    if (!m->params[p].frozen && m->params[p].tied_to < 0) ZT_EQ_U64(zck_layout_param_covered(v.layout, (uint32_t)p), m->params[p].numel);
  ZT_OK(zck_ds_get(c, ZCK_DS_EXP_AVG, &v));
  if (in->stage <= 2) ZT_OK(zck_ds_get(c, ZCK_DS_LP, &v));
  fprintf(stderr, "  %s: ok (%zu params, %zu outputs, %zu warnings)\n", name, m->n_params, n_out, in->n_warnings);
  for (size_t i = 0; i < in->n_warnings; i++) fprintf(stderr, "    warning: %s\n", in->warnings[i]);
  zck_ds_close(c);
  free(path);
  cJSON_Delete(e);
}

int main(int argc, char **argv) {
  size_t n;
  char **cases = zt_ds_cases(&n);
  if (!n) zt_skip("no DeepSpeed fixtures (tests/fixtures/deepspeed/<case>/expected.json)");
  for (size_t i = 0; i < n; i++)
    if (argc < 2 || !strcmp(argv[1], cases[i])) check_case(cases[i]);
  zt_ds_free_cases(cases, n);
  return 0;
}
