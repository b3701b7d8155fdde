/* test_dcp_format.c: DCP's file names, metadata class allowlist and key rules
 * (formats/dcp/dcp_format.h), shared by the reader and the writer. */
#include "dcp/dcp_format.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

static void test_file_names(void) {
  char buf[64];
  uint32_t r = 9, n = 9;
  zck_dcp_data_file_name(12, 0, buf, sizeof buf);
  ZT_EQ_STR(buf, "__12_0.distcp");
  ZT_ASSERT(zck_dcp_parse_data_file_name(buf, &r, &n));
  ZT_EQ_INT(r, 12);
  ZT_EQ_INT(n, 0);
  ZT_ASSERT(!zck_dcp_parse_data_file_name("__1_0.distcp.tmp", NULL, NULL));
  ZT_ASSERT(!zck_dcp_parse_data_file_name("__1.distcp", NULL, NULL));
  ZT_ASSERT(!zck_dcp_parse_data_file_name("__-1_0.distcp", NULL, NULL));
  ZT_ASSERT(!zck_dcp_parse_data_file_name("__99999999999_0.distcp", NULL, NULL));
  ZT_ASSERT(!zck_dcp_parse_data_file_name(".metadata", NULL, NULL));
}

static void test_classes(void) {
  ZT_EQ_INT(zck_dcp_class_of("torch.distributed.checkpoint.metadata", "Metadata"), ZCK_DCP_CLS_METADATA);
  ZT_EQ_INT(zck_dcp_class_of("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ZCK_DCP_CLS_STORAGE_INFO);
  ZT_EQ_INT(zck_dcp_class_of("torch.distributed.checkpoint.metadata", "_StorageInfo"), -1);
  for (int c = 0; c < ZCK_DCP_CLS_COUNT; c++) {
    ZT_EQ_INT(zck_dcp_class_of(zck_dcp_class_module((zck_dcp_class)c), zck_dcp_class_name((zck_dcp_class)c)), c);
    ZT_ASSERT(zck_dcp_global_allowed(zck_dcp_class_module((zck_dcp_class)c), zck_dcp_class_name((zck_dcp_class)c)));
  }
  ZT_ASSERT(zck_dcp_global_allowed("torch", "Size"));
  ZT_ASSERT(zck_dcp_global_allowed("torch", "bfloat16"));
  ZT_ASSERT(zck_dcp_global_allowed("torch.serialization", "_get_layout"));
  ZT_ASSERT(!zck_dcp_global_allowed("os", "system"));
  ZT_ASSERT(!zck_dcp_global_allowed("builtins", "eval"));
  ZT_ASSERT(!zck_dcp_global_allowed("torch", "load"));
  ZT_ASSERT(!zck_dcp_global_allowed("torch.serialization", "load"));
  ZT_EQ_INT(zck_dcp_dtype_of("bfloat16"), ZCK_BF16);
  ZT_EQ_INT(zck_dcp_dtype_of("float32"), ZCK_F32);
  ZT_EQ_INT(zck_dcp_dtype_of("nonsense"), ZCK_DTYPE_INVALID);
  ZT_EQ_STR(zck_dcp_dtype_name(ZCK_BF16), "bfloat16");
  ZT_EQ_INT(zck_dcp_dtype_of(zck_dcp_dtype_name(ZCK_F16)), ZCK_F16);
}

static void test_keys(void) {
  zck_dcp_key k = zck_dcp_key_parse("model.model.layers.0.mlp.up_proj.weight");
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_MODEL);
  ZT_EQ_STR(k.fqn, "model.layers.0.mlp.up_proj.weight");
  k = zck_dcp_key_parse("optim.state.model.layers.0.mlp.up_proj.weight.exp_avg_sq");
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_OPTIM_STATE);
  ZT_EQ_INT(k.fqn_len, strlen("model.layers.0.mlp.up_proj.weight"));
  ZT_ASSERT(!strncmp(k.fqn, "model.layers.0.mlp.up_proj.weight", k.fqn_len));
  ZT_EQ_STR(k.setting, "exp_avg_sq");
  k = zck_dcp_key_parse("optim.param_groups.12.betas");
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_PARAM_GROUP);
  ZT_EQ_INT(k.group, 12);
  ZT_EQ_STR(k.setting, "betas");
  k = zck_dcp_key_parse("optimizer.state.lm_head.weight.step");
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_OPTIM_STATE);
  ZT_EQ_INT(k.fqn_len, strlen("lm_head.weight"));
  ZT_EQ_STR(k.setting, "step");
  ZT_EQ_INT(zck_dcp_key_parse("optimizers.state.a.b").kind, ZCK_DCP_KEY_OTHER);
  ZT_EQ_INT(zck_dcp_key_parse("optim.param_groups.01.lr").kind, ZCK_DCP_KEY_OTHER);
  ZT_EQ_INT(zck_dcp_key_parse("optim.param_groups.x.lr").kind, ZCK_DCP_KEY_OTHER);
  ZT_EQ_INT(zck_dcp_key_parse("lr_scheduler.last_epoch").kind, ZCK_DCP_KEY_OTHER);
  ZT_EQ_INT(zck_dcp_key_parse("model.").kind, ZCK_DCP_KEY_OTHER);

  /* the path splits a key the name rules cannot: a setting with a dot in it */
  const char *p1[] = {"optim", "state", "a.b", "x.y"};
  k = zck_dcp_key_from_path(p1, 4);
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_OPTIM_STATE);
  ZT_EQ_STR(k.fqn, "a.b");
  ZT_EQ_STR(k.setting, "x.y");
  const char *p2[] = {"model", "lm_head.weight"};
  k = zck_dcp_key_from_path(p2, 2);
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_MODEL);
  ZT_EQ_STR(k.fqn, "lm_head.weight");
  const char *p3[] = {"optim", "param_groups", "3", "lr"};
  k = zck_dcp_key_from_path(p3, 4);
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_PARAM_GROUP);
  ZT_EQ_INT(k.group, 3);
  const char *p5[] = {"optimizer", "param_groups", "0", "params"};
  ZT_EQ_INT(zck_dcp_key_from_path(p5, 4).kind, ZCK_DCP_KEY_PARAM_GROUP);
  const char *p6[] = {"model.norm.weight"};
  k = zck_dcp_key_from_path(p6, 1);
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_MODEL);
  ZT_EQ_STR(k.fqn, "model.norm.weight");
  const char *p7[] = {"optimizer", "state.model.norm.weight.exp_avg"};
  k = zck_dcp_key_from_path(p7, 2);
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_OPTIM_STATE);
  ZT_EQ_INT(k.fqn_len, strlen("model.norm.weight"));
  ZT_EQ_STR(k.setting, "exp_avg");
  const char *p8[] = {"optimizer", "param_groups.model.norm.weight.lr"};
  k = zck_dcp_key_from_path(p8, 2);
  ZT_EQ_INT(k.kind, ZCK_DCP_KEY_PARAM_SETTING);
  ZT_EQ_INT(k.fqn_len, strlen("model.norm.weight"));
  ZT_EQ_STR(k.setting, "lr");
  const char *p4[] = {"train_state", "step"};
  ZT_EQ_INT(zck_dcp_key_from_path(p4, 2).kind, ZCK_DCP_KEY_OTHER);

  char *s = zck_dcp_key_state("model.norm.weight", "step");
  ZT_EQ_STR(s, "optim.state.model.norm.weight.step");
  free(s);
  s = zck_dcp_key_group(1, "params");
  ZT_EQ_STR(s, "optim.param_groups.1.params");
  free(s);
  s = zck_dcp_key_model("lm_head.weight");
  ZT_EQ_STR(s, "model.lm_head.weight");
  free(s);
}

int main(void) {
  test_file_names();
  test_classes();
  test_keys();
  return 0;
}
