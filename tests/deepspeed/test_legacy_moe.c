/* test_legacy_moe.c: legacy DeepSpeed-MoE (deepspeed.moe.layer.MoE) checkpoints
 * (tests/fixtures/deepspeed-moe, real DeepSpeed 0.19.8 saves) through the reader, with no Python: at ep_size 1 the
 * manifest holds every expert under its global name in the expert param group, every element placed once, the
 * 16-bit view refused by name (the expert files are not bound); at ep_size 2 the same (each rank's local expert
 * under its global name); a missing expert file (ep_size 1 and 2), ZeRO-0's expp_rank_* files refused in one line
 * naming the file and the layout. interop_legacy_moe checks the values against
 * DeepSpeed (the PipelineModule fixtures beside them: cli_pipe_damage, interop_pipeline). */
#include "ds_test_util.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0) abort();
  va_end(ap);
  return s;
}

static void intact(const char *name, int stage) {
  char *rel = fmt("deepspeed-moe/%s/ckpt", name), *path = zt_fixture(rel);
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(path, NULL, &c));
  const zck_ds_info *in = zck_ds_info_of(c);
  ZT_EQ_INT(in->stage, stage);
  ZT_EQ_INT(in->world_size, 2);
  const zck_model *m = zck_ds_model(c);
  ZT_EQ_INT(m->n_params, 9);
  for (int e = 0; e < 2; e++) {
    char n[96];
    snprintf(n, sizeof n, "moe.deepspeed_moe.experts.deepspeed_experts.%d.weight", e);
    int64_t p = zck_model_find_param(m, n);
    ZT_ASSERT(p >= 0);
    ZT_EQ_INT(m->params[p].group, 1);  /* split_params_into_different_moe_groups_for_optimizer's group */
    ZT_EQ_U64(m->params[p].numel, 64);
  }
  zck_ds_view v;
  ZT_OK(zck_ds_get(c, ZCK_DS_FP32, &v));
  for (size_t p = 0; p < m->n_params; p++) ZT_EQ_U64(zck_layout_param_covered(v.layout, (uint32_t)p), m->params[p].numel);
  ZT_ERR(zck_ds_get(c, ZCK_DS_LP, &v), ZCK_ERR_NOT_FOUND, "deepspeed.moe");
  zck_ds_close(c);
  fprintf(stderr, "  %s: ok\n", name);
  free(rel);
  free(path);
}

/* Opening dir fails with st in one line naming file and needle. */
static void refused(const char *what, const char *dir, zck_status st, const char *file, const char *needle) {
  zck_ds_ckpt *c = NULL;
  zck_status s = zck_ds_open(dir, NULL, &c);
  if (s == ZCK_OK) ZT_FAIL("%s: opened", what);
  const char *msg = zck_last_error();
  if (s != st) ZT_FAIL("%s: got %s (%s), expected %s", what, zck_status_name(s), msg, zck_status_name(st));
  if (!strstr(msg, file) || !strstr(msg, needle) || strchr(msg, '\n'))
    ZT_FAIL("%s: message \"%s\" is not one line naming %s and \"%s\"", what, msg, file, needle);
  fprintf(stderr, "  %s: %s\n", what, msg);
}

static void refused_fixture(const char *name, zck_status st, const char *file, const char *needle) {
  char *rel = fmt("deepspeed-moe/%s/ckpt", name), *path = zt_fixture(rel);
  refused(name, path, st, file, needle);
  free(rel);
  free(path);
}

int main(void) {
  char *probe = zt_fixture("deepspeed-moe/moe_ep1_s2/ckpt/latest");
  FILE *fp = fopen(probe, "r");
  free(probe);
  if (!fp) zt_skip("tests/fixtures/deepspeed-moe missing");
  fclose(fp);
  intact("moe_ep1_s2", 2);
  intact("moe_ep1_s1", 1);
  intact("moe_ep2_s2", 2);
  refused_fixture("moe_ep2_s0", ZCK_ERR_UNSUPPORTED, "expp_rank_", "stage 0");

  /* an expert file missing: named by the expert id and the param that needs it (at ep_size 2: rank 1's expert) */
  const char *cases[] = {"moe_ep1_s2", "moe_ep2_s2"};
  for (int k = 0; k < 2; k++) {
    char *tmp = zt_tmpdir(), *rel = fmt("deepspeed-moe/%s/ckpt", cases[k]), *src = zt_fixture(rel),
         *dst = fmt("%s/ckpt", tmp);
    if (zt_copy_tree(src, dst) != 0) ZT_FAIL("cp %s", src);
    char *gone = fmt("%s/global_step2/layer_0_expert_1_mp_rank_00_model_states.pt", dst);
    if (remove(gone) != 0) ZT_FAIL("rm %s", gone);
    refused(cases[k], dst, ZCK_ERR_NOT_FOUND, "expert_1", "deepspeed_experts.1.weight");
    free(gone); free(dst); free(src); free(rel); free(tmp);
  }
  return 0;
}
