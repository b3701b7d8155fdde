/* test_universal_fixtures.c: `zckpt to-universal` on every real DeepSpeed checkpoint in
 * tests/fixtures/deepspeed/<case>/ckpt, both layouts, read back by our readers:
 *  - fp32 of every trainable param equals DeepSpeed's zero_to_fp32 result
 *    (expected_fp32.safetensors) and the partitions gathered by the DeepSpeed reader;
 *  - exp_avg / exp_avg_sq equal the gathered partitions, in their own dtype;
 *  - the DeepSpeed folder: latest_universal, the model files, step.pt, the 0.19.8 `module`
 *    fallback files; the HDF5 file: frozen params and buffers, attributes, and element
 *    ranges read through few chunks (a small chunk size) equal the whole read. */
#include "deepspeed/deepspeed.h"
#include "hdf5/zck_h5.h"
#include "safetensors/safetensors.h"
#include "universal/universal.h"
#include "zck.h"
#include "ut_util.h"

static void expect_same(const char *what, const void *a, zck_dtype ta, const void *b, zck_dtype tb, uint64_t n) {
  if (ta != tb) ZT_FAIL("%s: dtype %s vs %s", what, zck_dtype_name(ta), zck_dtype_name(tb));
  if (memcmp(a, b, (size_t)(n * zck_dtype_size(ta)))) ZT_FAIL("%s: values differ", what);
}

/* The fp32 of `name` in zero_to_fp32's output, if the case has one. */
static void *expected_fp32(zck_hf_checkpoint *exp, const char *name, uint64_t numel) {
  if (!exp) return NULL;
  const zck_hf_tensor *t = zck_hf_find(exp, name);
  if (!t) return NULL;
  if (t->t->nbytes != numel * 4) ZT_FAIL("%s: expected tensor has %llu bytes", name, (unsigned long long)t->t->nbytes);
  void *b = malloc(numel * 4 + 1);
  ZT_OK(zck_st_read(t->file, t->t, b, 0, t->t->nbytes));
  return b;
}

static void check_ds_layout(const char *cs, const char *tmp, zck_ds_ckpt *ck, zck_hf_checkpoint *exp) {
  const zck_ds_info *info = zck_ds_info_of(ck);
  const zck_model *m = zck_ds_model(ck);
  char out[4096], p[4096];
  snprintf(out, sizeof out, "%s/%s/uc", tmp, cs);
  zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
  /* stage 1/2 files without universal_checkpoint_info need the flag; ZeRO-0 files never have one */
  if (info->stage >= 1 && info->stage <= 2) ZT_ERR(zck_to_universal(ut_ckpt(cs), out, &o), ZCK_ERR_FORMAT, "--inject-missing-state");
  o.inject_missing_state = 1;
  ZT_OK(zck_to_universal(ut_ckpt(cs), out, &o));
  ZT_ERR(zck_to_universal(ut_ckpt(cs), out, &o), ZCK_ERR_EXISTS, "exists");
  o.overwrite = 1;
  ZT_OK(zck_to_universal(ut_ckpt(cs), out, &o));
  snprintf(p, sizeof p, "%s/%s/latest_universal", tmp, cs);
  unsigned char *lu;
  size_t n;
  ZT_ASSERT(zt_read_file(p, &lu, &n) == 0);
  ZT_ASSERT(n == 2 && !memcmp(lu, "uc", 2));
  free(lu);
  /* model files copied */
  snprintf(p, sizeof p, "%s/%s", out, info->stage == 3 ? "zero_pp_rank_0_mp_rank_00_model_states.pt" : "mp_rank_00_model_states.pt");
  struct stat st;
  ZT_ASSERT(stat(p, &st) == 0 && st.st_size > 0);
  /* read back through the universal reader, opened from the parent (latest_universal) */
  snprintf(p, sizeof p, "%s/%s", tmp, cs);
  zck_uv_ckpt *uv = NULL;
  ZT_OK(zck_uv_open(p, NULL, &uv));
  const zck_uv_info *ui = zck_uv_info_of(uv);
  const zck_model *um = zck_uv_model(uv);
  /* ZeRO-0: the folder ds_to_universal writes for the equivalent ZeRO-1 checkpoint (its
   * model file names the params as param_shapes; FP16_UnfusedOptimizer's step one ahead) */
  ZT_EQ_INT(ui->stage, info->stage ? info->stage : 1);
  ZT_EQ_INT(ui->step_ahead, info->step_ahead);
  ZT_EQ_INT(ui->global_steps, info->global_steps);
  ZT_EQ_INT(ui->world_size, info->world_size);
  ZT_EQ_INT(um->n_params, m->n_params);
  for (uint32_t pi = 0; pi < m->n_params; pi++) {
    int64_t q = zck_model_find_param(um, m->params[pi].name);
    ZT_ASSERT(q >= 0 && um->params[q].group == m->params[pi].group && um->params[q].frozen == m->params[pi].frozen);
    ZT_ASSERT((um->params[q].tied_to >= 0) == (m->params[pi].tied_to >= 0));
  }
  ZT_ASSERT(ui->has_optimizer_state);
  ZT_EQ_INT(ui->step_is_tensor, info->step_is_tensor);
  ZT_ASSERT(ui->step == info->step);
  const zck_layout *ul[3];
  const zck_store *us[3];
  zck_ds_view dv[3];
  static const zck_ds_part parts[3] = {ZCK_DS_FP32, ZCK_DS_EXP_AVG, ZCK_DS_EXP_AVG_SQ};
  for (int k = 0; k < 3; k++) {
    ZT_OK(zck_uv_get(uv, (zck_uv_part)k, &ul[k], &us[k]));
    ZT_OK(zck_ds_get(ck, parts[k], &dv[k]));
  }
  size_t checked = 0;
  for (uint32_t pi = 0; pi < m->n_params; pi++) {
    const zck_param *pa = &m->params[pi];
    if (zck_layout_param_covered(dv[0].layout, pi) != pa->numel || pa->frozen || pa->tied_to >= 0) continue;
    if (info->stage <= 2 && !pa->numel) continue;   /* no fragments: only the module fallback */
    int64_t q = zck_model_find_param(um, pa->name);
    if (q < 0) ZT_FAIL("%s: %s missing from the universal checkpoint", cs, pa->name);
    for (int k = 0; k < 3; k++) {
      zck_dtype dt;
      void *ref = ut_gather(dv[k].layout, dv[k].stores, pi, &dt);
      size_t first = ul[k]->param_first[q];
      ZT_ASSERT(first < ul[k]->param_first[q + 1] || !pa->numel);
      const zck_store *s = pa->numel ? &us[k][ul[k]->pieces[first].store] : NULL;
      if (s) {
        void *got = ut_read_store(s, pa->numel);
        char what[512];
        snprintf(what, sizeof what, "%s: ds layout %s state %d", cs, pa->name, k);
        expect_same(what, got, s->dtype, ref, dt, pa->numel);
        if (k == 0) {
          void *e = expected_fp32(exp, pa->name, pa->numel);
          if (e) expect_same(what, got, s->dtype, e, ZCK_F32, pa->numel);
          free(e);
        }
        free(got);
      }
      free(ref);
    }
    checked++;
    if (info->stage <= 2) {  /* step.pt and the dict form */
      snprintf(p, sizeof p, "%s/zero/%s/step.pt", out, pa->name);
      ZT_ASSERT(stat(p, &st) == 0);
    }
  }
  ZT_ASSERT(checked > 0);
  if (info->stage <= 2) {  /* DeepSpeed 0.19.8's fallback files for the other module entries */
    const char *fb[] = {"head.weight", "frozen.weight", "shift", "counter"};
    for (size_t i = 0; i < 4; i++) {
      snprintf(p, sizeof p, "%s/zero/%s/fp32.pt", out, fb[i]);
      if (stat(p, &st) != 0) ZT_FAIL("%s: %s missing", cs, p);
      snprintf(p, sizeof p, "%s/zero/%s/exp_avg.pt", out, fb[i]);
      ZT_ASSERT(stat(p, &st) != 0);
    }
  }
  zck_uv_close(uv);
}

static void check_hdf5(const char *cs, const char *tmp, zck_ds_ckpt *ck, zck_hf_checkpoint *exp, uint64_t chunk) {
  const zck_model *m = zck_ds_model(ck);
  char out[4096];
  snprintf(out, sizeof out, "%s/%s/uc_%llu.h5", tmp, cs, (unsigned long long)chunk);
  zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
  o.format = ZCK_UNIVERSAL_HDF5;
  o.chunk_bytes = chunk;
  o.level = chunk < 4096 ? 1 : 0;
  ZT_OK(zck_to_universal(ut_ckpt(cs), out, &o));
  zck_h5u *u = NULL;
  ZT_OK(zck_h5u_open(out, &u));
  const zck_model *um = zck_h5u_model(u);
  const zck_h5u_info *hi = zck_h5u_info_of(u);
  ZT_EQ_INT(hi->stage, zck_ds_info_of(ck)->stage);
  ZT_ASSERT(hi->ds_config_json && strstr(hi->ds_config_json, "zero_optimization"));
  zck_ds_view dv[3];
  static const zck_ds_part parts[3] = {ZCK_DS_FP32, ZCK_DS_EXP_AVG, ZCK_DS_EXP_AVG_SQ};
  for (int k = 0; k < 3; k++) ZT_OK(zck_ds_get(ck, parts[k], &dv[k]));
  for (uint32_t pi = 0; pi < m->n_params; pi++) {
    const zck_param *pa = &m->params[pi];
    if (zck_layout_param_covered(dv[0].layout, pi) != pa->numel || pa->frozen || pa->tied_to >= 0) continue;
    int64_t q = zck_model_find_param(um, pa->name);
    if (q < 0) ZT_FAIL("%s: %s missing from the HDF5 file", cs, pa->name);
    if (!pa->numel) continue;
    for (int k = 0; k < 3; k++) {
      const zck_layout *l;
      const zck_store *s;
      ZT_OK(zck_h5u_get(u, (zck_h5u_part)k, &l, &s));
      const zck_store *st = &s[l->pieces[l->param_first[q]].store];
      zck_dtype dt;
      void *ref = ut_gather(dv[k].layout, dv[k].stores, pi, &dt);
      void *got = ut_read_store(st, pa->numel);
      char what[512];
      snprintf(what, sizeof what, "%s: hdf5 %s state %d", cs, pa->name, k);
      expect_same(what, got, st->dtype, ref, dt, pa->numel);
      if (k == 0) {
        void *e = expected_fp32(exp, pa->name, pa->numel);
        if (e) expect_same(what, got, st->dtype, e, ZCK_F32, pa->numel);
        free(e);
      }
      /* element ranges: every (a, b) on a coarse grid */
      size_t es = zck_dtype_size(st->dtype);
      uint8_t *part = malloc(pa->numel * es + 1);
      for (uint64_t a = 0; a < pa->numel; a += 1 + pa->numel / 7)
        for (uint64_t b = a + 1; b <= pa->numel; b += 1 + pa->numel / 5) {
          ZT_OK(st->read(st->ctx, part, a, b - a));
          if (memcmp(part, (uint8_t *)got + a * es, (size_t)((b - a) * es)))
            ZT_FAIL("%s: range [%llu, %llu) differs", what, (unsigned long long)a, (unsigned long long)b);
        }
      free(part);
      free(ref);
      free(got);
    }
  }
  /* frozen params (stage 2/3 keep them) and buffers, against the DeepSpeed reader */
  zck_ds_view fz;
  if (zck_ds_get(ck, ZCK_DS_FROZEN, &fz) == ZCK_OK) {
    const zck_layout *l;
    const zck_store *s;
    ZT_OK(zck_h5u_get(u, ZCK_H5U_FROZEN, &l, &s));
    int64_t q = zck_model_find_param(um, "frozen.weight"), pi = zck_model_find_param(m, "frozen.weight");
    ZT_ASSERT(q >= 0 && pi >= 0 && um->params[q].frozen);
    zck_dtype dt;
    void *ref = ut_gather(fz.layout, fz.stores, (uint32_t)pi, &dt);
    const zck_store *st = &s[l->pieces[l->param_first[q]].store];
    void *got = ut_read_store(st, m->params[pi].numel);
    expect_same("frozen.weight", got, st->dtype, ref, dt, m->params[pi].numel);
    free(ref);
    free(got);
  } else {
    zck_clear_error();
  }
  const zck_layout *bl;
  const zck_store *bs;
  zck_h5u_buffers(u, &bl, &bs);
  zck_ds_view db = zck_ds_buffers(ck);
  ZT_EQ_INT(um->n_buffers, m->n_buffers);
  for (size_t i = 0; i < m->n_buffers; i++) {
    void *a = ut_read_store(&bs[i], m->buffers[i].numel), *b = ut_read_store(&db.stores[i], m->buffers[i].numel);
    expect_same(m->buffers[i].name, a, bs[i].dtype, b, db.stores[i].dtype, m->buffers[i].numel);
    free(a);
    free(b);
  }
  int64_t alias = zck_model_find_param(um, "head.weight");
  ZT_ASSERT(alias >= 0 && um->params[alias].tied_to == zck_model_find_param(um, "embed.weight"));
  zck_h5u_close(u);
}

int main(void) {
  char **cases = ut_cases();
  char *tmp = zt_tmpdir();
  size_t n = 0;
  for (size_t i = 0; cases[i]; i++) {
    const char *cs = cases[i];
    zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
    oo.require_optimizer_state = true;
    zck_ds_ckpt *ck = NULL;
    zck_status os = zck_ds_open(ut_ckpt(cs), &oo, &ck);
    ZT_OK(os);
    char ep[4096];
    snprintf(ep, sizeof ep, "%s/deepspeed/%s/expected_fp32.safetensors", zt_fixtures(), cs);
    zck_hf_checkpoint *exp = NULL;
    struct stat st;
    if (stat(ep, &st) == 0) ZT_OK(zck_hf_open(ep, &exp));
    char d[4096];
    snprintf(d, sizeof d, "%s/%s", tmp, cs);
    mkdir(d, 0755);
    check_ds_layout(cs, tmp, ck, exp);
    check_hdf5(cs, tmp, ck, exp, 0);
    check_hdf5(cs, tmp, ck, exp, 40);   /* 10 fp32 elements per chunk: many chunks, edge chunks */
    zck_hf_close(exp);
    zck_ds_close(ck);
    n++;
  }
  ZT_ASSERT(n > 0);
  printf("%zu cases\n", n);
  ut_free_cases(cases);
  free(tmp);
  return 0;
}
