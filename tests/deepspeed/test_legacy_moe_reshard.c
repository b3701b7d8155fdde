/* test_legacy_moe_reshard.c: zck_reshard of a legacy DeepSpeed-MoE checkpoint (deepspeed.moe.layer.MoE, ep_size 1;
 * tests/fixtures/deepspeed-moe/moe_ep1_s2, a real DeepSpeed 0.19.8 save), with no Python: to W 3 at ZeRO-1 and back
 * to W 2 at ZeRO-2 (and moe_ep1_s2_bf16 to W 1 at ZeRO-1), each output read back as a deepspeed.moe checkpoint (its expert files, the experts in their own
 * group) whose fp32 masters and Adam moments equal the source's param for param; a ZeRO-3 target, --to-tp-size and
 * an expert file under another layer's number refused in one line, nothing written. interop_legacy_moe_reshard has DeepSpeed load them. */
#include "ds_test_util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const zck_ds_part parts[] = {ZCK_DS_FP32, ZCK_DS_EXP_AVG, ZCK_DS_EXP_AVG_SQ};

/* out's every param of every part equals src's, bit for bit; out has W world and `stage`. */
static void same_state(const char *src, const char *out, uint32_t world, int stage) {
  zck_ds_ckpt *a = NULL, *b = NULL;
  ZT_OK(zck_ds_open(src, NULL, &a));
  ZT_OK(zck_ds_open(out, NULL, &b));
  ZT_EQ_INT(zck_ds_info_of(b)->world_size, world);
  ZT_EQ_INT(zck_ds_info_of(b)->stage, stage);
  const zck_model *ma = zck_ds_model(a), *mb = zck_ds_model(b);
  ZT_EQ_INT(mb->n_params, ma->n_params);
  ZT_ERR(zck_ds_moe_refuse(b, "x"), ZCK_ERR_UNSUPPORTED, "deepspeed.moe");  /* read as deepspeed.moe again */
  for (size_t k = 0; k < sizeof parts / sizeof *parts; k++) {
    zck_ds_view va, vb;
    ZT_OK(zck_ds_get(a, parts[k], &va));
    ZT_OK(zck_ds_get(b, parts[k], &vb));
    for (uint32_t p = 0; p < ma->n_params; p++) {
      ZT_ASSERT(!strcmp(ma->params[p].name, mb->params[p].name));
      ZT_EQ_INT(mb->params[p].group, ma->params[p].group);
      float *x = zt_ds_read_param(&va, ma, p, ZCK_F32), *y = zt_ds_read_param(&vb, mb, p, ZCK_F32);
      ZT_ASSERT(x && y);
      if (memcmp(x, y, ma->params[p].numel * sizeof *x)) ZT_FAIL("%s: part %d of '%s' differs", out, (int)parts[k],
                                                                  ma->params[p].name);
      free(x);
      free(y);
    }
  }
  zck_ds_close(a);
  zck_ds_close(b);
}

static char *join(const char *a, const char *b) {
  char *s = malloc(strlen(a) + strlen(b) + 2);
  if (!s) abort();
  sprintf(s, "%s/%s", a, b);
  return s;
}

int main(void) {
  char *src = zt_fixture("deepspeed-moe/moe_ep1_s2/ckpt"), *probe = join(src, "latest");
  struct stat sb;
  if (stat(probe, &sb) != 0) zt_skip("tests/fixtures/deepspeed-moe missing");
  char *tmp = zt_tmpdir(), *w3 = join(tmp, "w3s1"), *w2 = join(tmp, "w2s2"), *no = join(tmp, "refused");
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  o.to_world_size = 3;
  o.to_stage = 1;
  ZT_OK(zck_reshard(src, w3, &o));
  char *ef = join(w3, "global_step2/layer_0_expert_1_mp_rank_00_model_states.pt");
  ZT_ASSERT(stat(ef, &sb) == 0);
  same_state(src, w3, 3, 1);
  o.to_world_size = 2;
  o.to_stage = 2;
  ZT_OK(zck_reshard(w3, w2, &o));
  same_state(src, w2, 2, 2);
  /* bf16: the expert files' weights are cast from the masters (verify checks them against the manifest) */
  char *bf = zt_fixture("deepspeed-moe/moe_ep1_s2_bf16/ckpt"), *w1 = join(tmp, "bf16_w1s1");
  o.to_world_size = 1;
  o.to_stage = 1;
  ZT_OK(zck_reshard(bf, w1, &o));
  same_state(bf, w1, 1, 1);
  free(bf);
  free(w1);
  o.to_world_size = 2;
  o.to_stage = 3;
  ZT_ERR(zck_reshard(src, no, &o), ZCK_ERR_UNSUPPORTED, "deepspeed.moe");
  ZT_ASSERT(stat(no, &sb) != 0);
  o.to_stage = 0;
  o.to_tp_size = 2;
  ZT_ERR(zck_reshard(src, no, &o), ZCK_ERR_UNSUPPORTED, "deepspeed.moe");
  ZT_ASSERT(stat(no, &sb) != 0);
  /* an expert file under another MoE layer's number: the reader finds expert 1's file, the writer would not write
   * that name again: refused, nothing written */
  o.to_tp_size = 0;
  o.to_stage = 1;
  char *cp = join(tmp, "renamed"), *from = join(cp, "global_step2/layer_0_expert_1_mp_rank_00_model_states.pt"),
       *to = join(cp, "global_step2/layer_1_expert_1_mp_rank_00_model_states.pt");
  if (zt_copy_tree(src, cp) != 0 || rename(from, to) != 0) ZT_FAIL("copy %s", src);
  ZT_ERR(zck_reshard(cp, no, &o), ZCK_ERR_FORMAT, "layer_0_expert_1_mp_rank_00_model_states.pt");
  ZT_ASSERT(stat(no, &sb) != 0);
  free(cp); free(from); free(to);
  free(ef); free(no); free(w2); free(w3); free(tmp); free(probe); free(src);
  return 0;
}
