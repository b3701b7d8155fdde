/* test_autoep.c: DeepSpeed AutoEP checkpoints (tests/fixtures/autoep, real DeepSpeed 0.19.8 saves) through the
 * reader: the manifest under the HF model's names with every element of every param placed once, and the hostile
 * variants of tests/fixtures/autoep-malformed (made by gen/make_autoep_malformed.py: valid zips whose metadata
 * lies) refused in one line naming the file. */
#include "ds_test_util.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static char *tmp;
static int counter;

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0) abort();
  va_end(ap);
  return s;
}

static void intact(const char *name, int stage, int n_params) {
  char *rel = fmt("autoep/%s/ckpt", name), *path = zt_fixture(rel);
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(path, NULL, &c));
  const zck_ds_info *in = zck_ds_info_of(c);
  ZT_EQ_INT(in->ep_size, 2);
  ZT_EQ_INT(in->stage, stage);
  const zck_model *m = zck_ds_model(c);
  ZT_EQ_INT(m->n_params, n_params);
  for (int l = 0; l < 2; l++) {
    char n[96];
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.gate_up_proj", l);
    int64_t p = zck_model_find_param(m, n);
    ZT_ASSERT(p >= 0);
    ZT_EQ_INT(m->params[p].ndim, 3);
    ZT_EQ_INT(m->params[p].shape[0], 4);   /* every expert, merged over the EP ranks */
    ZT_EQ_INT(m->params[p].shape[1], 16);  /* w1's 8 rows, then w3's */
    ZT_EQ_INT(m->params[p].shape[2], 16);
    snprintf(n, sizeof n, "model.layers.%d.mlp.experts.down_proj", l);
    ZT_ASSERT(zck_model_find_param(m, n) >= 0);
    snprintf(n, sizeof n, "model.layers.%d.mlp.gate.weight", l);
    ZT_ASSERT(zck_model_find_param(m, n) >= 0);
  }
  for (size_t p = 0; p < m->n_params; p++) {
    ZT_ASSERT(!strstr(m->params[p].name, ".experts.w") && !strstr(m->params[p].name, "router"));
    ZT_ASSERT(!strstr(m->params[p].name, "gate.gate"));
  }
  zck_ds_view v;
  ZT_OK(zck_ds_get(c, ZCK_DS_FP32, &v));
  for (size_t p = 0; p < m->n_params; p++) ZT_EQ_U64(zck_layout_param_covered(v.layout, (uint32_t)p), m->params[p].numel);
  size_t n_out = 0;
  zck_ds_outputs(c, &n_out);
  ZT_EQ_INT(n_out, n_params);
  ZT_ERR(zck_ds_get(c, ZCK_DS_LP, &v), ZCK_ERR_NOT_FOUND, stage == 3 ? "stage-3" : "AutoEP");
  ZT_OK(zck_ds_autoep_check_experts(c));
  zck_ds_close(c);
  free(rel);
  free(path);
  fprintf(stderr, "  %s: ok\n", name);
}

/* base's ckpt with autoep-malformed/<name>/<file> over its namesake: opening fails with st, naming `names` (NULL:
 * file) and needle. */
static void hostile_named(const char *name, const char *base, const char *file, zck_status st, const char *needle,
                          const char *names) {
  char *rel = fmt("autoep/%s/ckpt", base), *src = zt_fixture(rel);
  char *dst = fmt("%s/c%d-%s", tmp, counter++, name);
  if (zt_copy_tree(src, dst) != 0) ZT_FAIL("cp %s", src);
  char *bad_rel = fmt("autoep-malformed/%s/%s", name, file), *bad = zt_fixture(bad_rel);
  char *cmd = fmt("cp '%s' '%s/global_step2/%s'", bad, dst, file);
  if (system(cmd) != 0) ZT_FAIL("%s", cmd);
  zck_ds_ckpt *c = NULL;
  zck_status s = zck_ds_open(dst, NULL, &c);
  if (s == ZCK_OK) ZT_FAIL("%s: opened", name);
  const char *msg = zck_last_error();
  if (s != st) ZT_FAIL("%s: got %s (%s), expected %s", name, zck_status_name(s), msg, zck_status_name(st));
  if (!names) names = file;
  if (!strstr(msg, names) || !strstr(msg, needle) || strchr(msg, '\n'))
    ZT_FAIL("%s: message \"%s\" is not one line naming %s and \"%s\"", name, msg, names, needle);
  fprintf(stderr, "  %s: %s\n", name, msg);
  free(rel); free(src); free(dst); free(bad_rel); free(bad); free(cmd);
}

static void hostile(const char *name, const char *base, const char *file, zck_status st, const char *needle) {
  hostile_named(name, base, file, st, needle, NULL);
}

int main(void) {
  char *probe = zt_fixture("autoep/ep2_s2_fp32/ckpt/latest");
  FILE *fp = fopen(probe, "r");
  free(probe);
  if (!fp) zt_skip("tests/fixtures/autoep missing");
  fclose(fp);
  tmp = zt_tmpdir();
  intact("ep2_s1_fp32", 1, 21);
  intact("ep2_s2_fp32", 2, 21);
  intact("ep2_s2_bf16", 2, 21);
  intact("ep2_s3_fp32", 3, 21);
  intact("ep2_s3_sg600_fp32", 3, 21);   /* the experts over two ZeRO-3 sub-groups */
  intact("ep2_s3_bf16", 3, 21);
  intact("qwen3_ep2_s2_bf16", 2, 25);
  intact("ep2dp2_s2_fp32", 2, 21);  /* EP 2 x expert-data-parallel 2 */
  intact("ep2dp2_s3_fp32", 3, 21);  /* Qwen3-MoE: q_norm, k_norm per layer */
  const char *m2 = "mp_rank_00_model_states.pt", *ex = "layer_0_expert_1_mp_rank_00_model_states.pt";
  hostile("ep_size_4", "ep2_s2_fp32", m2, ZCK_ERR_FORMAT, "ep_size 4 x expert-data-parallel size 1 is not the 2 ranks");
  hostile("placement_swapped", "ep2_s2_fp32", m2, ZCK_ERR_UNSUPPORTED, "expert_placement");
  hostile("experts_5", "ep2_s2_fp32", m2, ZCK_ERR_FORMAT, "do not add up");
  hostile("format_zero3", "ep2_s2_fp32", m2, ZCK_ERR_FORMAT, "checkpoint_format 'zero3_partitioned'");
  hostile("other_prefix", "ep2_s2_fp32", m2, ZCK_ERR_UNSUPPORTED, "experts under");
  hostile("layers_not_list", "ep2_s2_fp32", m2, ZCK_ERR_FORMAT, "is not a list");
  hostile("no_ep_rank", "ep2_s2_fp32", m2, ZCK_ERR_FORMAT, "'ep_rank'");
  hostile("local_shape", "ep2_s2_fp32", m2, ZCK_ERR_FORMAT, "local experts");
  hostile("router_bias", "ep2_s2_fp32", m2, ZCK_ERR_UNSUPPORTED, "router bias");
  /* expert files without AutoEP's record: DeepSpeed-MoE's, refused by name as before (the first one found) */
  hostile_named("no_record", "ep2_s2_fp32", m2, ZCK_ERR_UNSUPPORTED, "unsupported checkpoint layout", "_expert_");
  hostile("counts_2_2", "ep2_s2_fp32", "zero_pp_rank_0_mp_rank_00_optim_states.pt", ZCK_ERR_MISMATCH,
          "partition_count[1] is 2");
  hostile("expert_extra_key", "ep2_s2_fp32", ex, ZCK_ERR_FORMAT, "not an AutoEP expert file");
  hostile("expert_shape", "ep2_s2_fp32", ex, ZCK_ERR_MISMATCH, "is not [16, 8]");
  hostile("rank1_says_rank0", "ep2_s3_fp32", "zero_pp_rank_1_mp_rank_00_model_states.pt", ZCK_ERR_MISMATCH,
          "not rank 1's");
  free(tmp);
  return 0;
}
