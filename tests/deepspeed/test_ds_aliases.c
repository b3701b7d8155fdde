/* test_ds_aliases.c: the zero_to_fp32 recipe's tied aliases (zck_ds_outputs_add_aliases),
 * which the DeepSpeed reader and the universal folder reader share. The rules follow the
 * Python dict zero_to_fp32 builds: an alias whose source is no output is dropped, a
 * repeated alias replaces its earlier entry, a source named twice resolves to its last
 * output. Then 200k entries over 200k outputs, as a hostile shared_params can hold: each
 * entry scanned the outputs, minutes; the CMakeLists timeout (120 s) is a hang guard. */
#include "test.h"
#include "deepspeed/deepspeed.h"
#include "model.h"

static zck_ds_output plain(const char *name, uint32_t index) {
  return (zck_ds_output){name, ZCK_DS_OUT_TRAINABLE, index, -1, ZCK_F32, ZCK_F32, 0, NULL, 1};
}

static void test_rules(void) {
  zck_model *m = zck_model_new();
  ZT_ASSERT(m);
  uint32_t ix;
  ZT_OK(zck_model_add_param(m, "a", 0, NULL, ZCK_F32, &ix));
  ZT_OK(zck_model_add_param(m, "tied", 0, NULL, ZCK_F32, &ix));
  zck_ds_output out[8] = {plain("a", 0), plain("b", 1), plain("a", 2)};
  size_t n = 3;
  const char *alias[] = {"tied", "lost", "other", "tied", NULL};
  const char *source[] = {"b", "missing", "a", "a", "a"};
  ZT_OK(zck_ds_outputs_add_aliases(out, &n, alias, source, 5, m));
  ZT_EQ_INT(n, 5);
  ZT_EQ_STR(out[3].name, "tied");     /* first seen at 3, replaced by its repeat */
  ZT_EQ_INT(out[3].kind, ZCK_DS_OUT_ALIAS);
  ZT_EQ_INT(out[3].alias_of, 2);      /* "a" is output 0 and 2: the last one */
  ZT_EQ_INT(out[3].index, ix);
  ZT_EQ_STR(out[4].name, "other");
  ZT_EQ_INT(out[4].alias_of, 2);
  ZT_EQ_INT(out[4].index, UINT32_MAX); /* not a parameter of the model: still emitted */
  zck_model_free(m);
}

enum { N = 200000 };

static void test_many(void) {
  zck_model *m = zck_model_new();
  ZT_ASSERT(m);
  zck_ds_output *out = calloc(2 * N, sizeof *out);
  char (*names)[16] = calloc(2 * N, sizeof *names);
  const char **alias = calloc(N, sizeof *alias), **source = calloc(N, sizeof *source);
  ZT_ASSERT(out && names && alias && source);
  for (size_t i = 0; i < N; i++) {
    snprintf(names[i], sizeof names[i], "w%zu", i);
    snprintf(names[N + i], sizeof names[N + i], "t%zu", i);
    out[i] = plain(names[i], (uint32_t)i);
    alias[i] = names[N + i];
    source[i] = names[N - 1 - i];
  }
  size_t n = N;
  ZT_OK(zck_ds_outputs_add_aliases(out, &n, alias, source, N, m));
  ZT_EQ_INT(n, 2 * N);
  for (size_t i = 0; i < N; i++) {
    if (out[N + i].alias_of != (int32_t)(N - 1 - i) || strcmp(out[N + i].name, alias[i]))
      ZT_FAIL("alias %zu: %s -> %d", i, out[N + i].name, out[N + i].alias_of);
  }
  free(out);
  free(names);
  free(alias);
  free(source);
  zck_model_free(m);
}

int main(void) {
  test_rules();
  test_many();
  return 0;
}
