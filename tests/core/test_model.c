/* test_model.c: the model manifest builder. */
#include "layout.h"
#include "model.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>

int main(void) {
  zck_model *m = zck_model_new();
  ZT_ASSERT(m);
  int64_t wte[] = {50, 8}, ln[] = {8}, bad[] = {3, -1}, big[] = {INT64_MAX, 4};
  uint32_t i_wte, i_ln, i_head, i_frozen;
  ZT_OK(zck_model_add_param(m, "wte.weight", 2, wte, ZCK_BF16, &i_wte));
  ZT_OK(zck_model_add_param(m, "ln.weight", 1, ln, ZCK_BF16, &i_ln));
  ZT_OK(zck_model_add_param(m, "lm_head.weight", 2, wte, ZCK_BF16, &i_head));
  ZT_OK(zck_model_add_param(m, "emb.frozen", 1, ln, ZCK_BF16, &i_frozen));
  ZT_OK(zck_model_add_param(m, "scalar", 0, NULL, ZCK_F32, NULL));
  ZT_EQ_INT(m->n_params, 5);
  ZT_EQ_U64(m->params[i_wte].numel, 400);
  ZT_EQ_U64(m->params[4].numel, 1);
  ZT_EQ_INT(m->params[i_ln].group, -1);
  ZT_EQ_INT(m->params[i_ln].tied_to, -1);
  ZT_ERR(zck_model_add_param(m, "ln.weight", 1, ln, ZCK_BF16, NULL), ZCK_ERR_FORMAT, "ln.weight: listed twice");
  ZT_ERR(zck_model_add_param(m, "neg", 2, bad, ZCK_BF16, NULL), ZCK_ERR_FORMAT, "neg: negative dimension in shape [3, -1]");
  ZT_ERR(zck_model_add_param(m, "big", 2, big, ZCK_BF16, NULL), ZCK_ERR_FORMAT, "too many elements");
  ZT_ERR(zck_model_add_param(m, "deep", 9, wte, ZCK_BF16, NULL), ZCK_ERR_FORMAT, "9 dimensions");
  ZT_EQ_INT(m->n_params, 5);

  /* many params: the name index grows */
  for (int i = 0; i < 2000; i++) {
    char name[32];
    snprintf(name, sizeof name, "h.%d.w", i);
    ZT_OK(zck_model_add_param(m, name, 1, ln, ZCK_F16, NULL));
  }
  ZT_EQ_INT(zck_model_find_param(m, "h.1234.w"), 5 + 1234);
  ZT_EQ_INT(zck_model_find_param(m, "wte.weight"), 0);
  ZT_EQ_INT(zck_model_find_param(m, "nope"), -1);

  /* ties */
  ZT_OK(zck_model_set_tied(m, i_head, i_wte));
  ZT_EQ_INT(zck_model_owner(m, i_head), i_wte);
  ZT_EQ_INT(zck_model_owner(m, i_wte), i_wte);
  ZT_ERR(zck_model_set_tied(m, i_ln, i_head), ZCK_ERR_FORMAT, "itself an alias");
  ZT_ERR(zck_model_set_tied(m, i_wte, i_ln), ZCK_ERR_FORMAT, "source of alias lm_head.weight");
  ZT_ERR(zck_model_set_tied(m, i_ln, i_ln), ZCK_ERR_FORMAT, "tied to itself");
  ZT_ERR(zck_model_set_tied(m, i_ln, 99999), ZCK_ERR_FORMAT, "does not exist");
  ZT_ERR(zck_model_set_tied(m, 5, i_wte), ZCK_ERR_FORMAT, "shape [8] differs from [50, 8]");
  zck_model_set_frozen(m, i_frozen, true);

  /* buffers */
  int64_t one[] = {1};
  ZT_OK(zck_model_add_buffer(m, "bn.num_batches_tracked", 0, NULL, ZCK_I64, NULL));
  ZT_OK(zck_model_add_buffer(m, "attn.bias", 1, one, ZCK_BOOL, NULL));
  ZT_ERR(zck_model_add_buffer(m, "attn.bias", 1, one, ZCK_BOOL, NULL), ZCK_ERR_FORMAT, "listed twice");
  ZT_EQ_INT(zck_model_find_buffer(m, "attn.bias"), 1);
  ZT_EQ_INT(zck_model_find_param(m, "attn.bias"), -1);

  /* groups: decay (wte, head alias, frozen) / no-decay (ln, scalar) */
  uint32_t g0, g1;
  ZT_OK(zck_model_add_group(m, &g0));
  ZT_OK(zck_model_add_group(m, &g1));
  ZT_OK(zck_model_group_add_param(m, g0, i_wte));
  ZT_OK(zck_model_group_add_param(m, g0, i_head));
  ZT_OK(zck_model_group_add_param(m, g0, i_frozen));
  ZT_OK(zck_model_group_add_param(m, g1, 4));
  ZT_OK(zck_model_group_add_param(m, g1, i_ln));
  ZT_ERR(zck_model_group_add_param(m, g1, i_wte), ZCK_ERR_FORMAT, "wte.weight: in parameter groups 0 and 1");
  ZT_ERR(zck_model_group_add_param(m, 7, i_wte), ZCK_ERR_FORMAT, "group 7 does not exist");
  ZT_EQ_INT(m->params[i_ln].group, 1);
  uint32_t tr[8];
  ZT_EQ_INT(zck_model_group_trainable(m, g0, tr, 8), 1);
  ZT_EQ_INT(tr[0], i_wte);
  ZT_EQ_INT(zck_model_group_trainable(m, g1, tr, 1), 2);
  ZT_EQ_INT(tr[0], 4);
  ZT_EQ_INT(zck_model_group_trainable(m, g1, NULL, 0), 2);

  /* DeepSpeed's flat groups: trainable params only, empty groups skipped */
  uint32_t g2, g3;
  ZT_OK(zck_model_add_group(m, &g2)); /* empty */
  ZT_OK(zck_model_add_group(m, &g3));
  ZT_OK(zck_model_group_add_param(m, g3, 5));
  int64_t zero[] = {0};
  uint32_t i_empty, g4;
  ZT_OK(zck_model_add_param(m, "empty", 1, zero, ZCK_BF16, &i_empty));
  ZT_OK(zck_model_group_add_param(m, g3, i_empty)); /* skipped: no elements */
  uint32_t i_empty2;
  ZT_OK(zck_model_add_param(m, "empty2", 1, zero, ZCK_BF16, &i_empty2));
  ZT_OK(zck_model_add_group(m, &g4)); /* only a zero-element param: no flat group */
  ZT_OK(zck_model_group_add_param(m, g4, i_empty2));
  zck_group_spec *specs;
  size_t n_specs;
  ZT_OK(zck_layout_model_groups(m, &specs, &n_specs));
  ZT_EQ_INT(n_specs, 3);
  ZT_EQ_INT(specs[0].n_params, 1);
  ZT_EQ_INT(specs[0].params[0], i_wte);
  ZT_EQ_INT(specs[1].opt_group, 1);
  ZT_EQ_INT(specs[1].params[1], i_ln);
  ZT_EQ_INT(specs[2].opt_group, 3);
  ZT_EQ_INT(specs[2].params[0], 5);
  ZT_EQ_INT(specs[2].n_params, 1);
  free(specs);

  double betas[] = {0.9, 0.999};
  ZT_OK(zck_model_group_set_float(m, g0, "lr", 1e-3));
  ZT_OK(zck_model_group_set_floats(m, g0, "betas", betas, 2));
  ZT_OK(zck_model_group_set_float(m, g0, "weight_decay", 0.1));
  ZT_OK(zck_model_group_set_bool(m, g0, "amsgrad", false));
  ZT_OK(zck_model_group_set_none(m, g0, "foreach"));
  ZT_OK(zck_model_group_set_int(m, g0, "step", 3));
  ZT_OK(zck_model_group_set_string(m, g0, "ns_method", "gram"));
  ZT_OK(zck_model_group_set_float(m, g0, "lr", 2e-3)); /* replaced in place */
  ZT_ERR(zck_model_group_set_floats(m, g0, "x", betas, 5), ZCK_ERR_UNSUPPORTED, "tuple of 5");
  ZT_OK(zck_model_group_set_string(m, g0, "ns_method", "x")); /* string replaced: no leak */
  ZT_EQ_INT(m->groups[g0].n_hparams, 7);
  ZT_EQ_STR(m->groups[g0].hparams[0].key, "lr");
  ZT_ASSERT(m->groups[g0].hparams[0].f[0] == 2e-3);
  const zck_hparam *h = zck_model_group_get(m, g0, "betas");
  ZT_ASSERT(h && h->kind == ZCK_HP_FLOATS && h->n_floats == 2 && h->f[1] == 0.999);
  h = zck_model_group_get(m, g0, "ns_method");
  ZT_EQ_STR(h->s, "x");
  ZT_ASSERT(zck_model_group_get(m, g1, "lr") == NULL);

  uint64_t *numels = malloc(m->n_params * sizeof *numels);
  zck_model_numels(m, numels);
  ZT_EQ_U64(numels[2], 400);
  free(numels);

  char buf[64];
  int64_t sh[] = {2, 3, 4};
  ZT_EQ_STR(zck_shape_str(3, sh, buf, sizeof buf), "[2, 3, 4]");
  ZT_EQ_STR(zck_shape_str(0, sh, buf, sizeof buf), "[]");
  ZT_EQ_STR(zck_shape_str(3, sh, buf, 5), "[2, ");
  zck_model_free(m);
  zck_model_free(NULL);
  return 0;
}
