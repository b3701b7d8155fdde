/* test_ds_crafted.c: the malformed DeepSpeed checkpoints that need an edited pickle,
 * crafted by tests/fixtures/gen/make_ds_malformed.py from a real checkpoint: each gives its
 * one-line error (or, where DeepSpeed accepts it too, is accepted), and nothing is
 * written. */
#include <string.h>
#include <sys/stat.h>

#include "test.h"

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

int main(void) {
  char *root = zt_fixture("deepspeed-malformed");
  if (!exists(root)) zt_skip("no crafted DeepSpeed fixtures");
  char *tmp = zt_tmpdir();
  char ck[4096], out[4096];

  /* DS-20: no buffer_names: "is not a model state checkpoint" */
  snprintf(ck, sizeof ck, "%s/ds20_no_buffer_names", root);
  snprintf(out, sizeof out, "%s/o20", tmp);
  ZT_ERR(zck_consolidate(ck, out, NULL), ZCK_ERR_FORMAT, "mp_rank_00_model_states.pt: is not a model state checkpoint");
  ZT_ASSERT(!exists(out));

  /* DS-52: a rank's saved fp32 partition shorter than the partition math says */
  snprintf(ck, sizeof ck, "%s/ds52_short_partition", root);
  snprintf(out, sizeof out, "%s/o52", tmp);
  zck_status s = zck_consolidate(ck, out, NULL);
  ZT_ASSERT(s != ZCK_OK);
  ZT_ASSERT(strstr(zck_last_error(), "zero_pp_rank_1_mp_rank_00_optim_states.pt") != NULL);
  /* caught by the partition math, or first by the slice mappings that no longer fit */
  ZT_ASSERT(strstr(zck_last_error(), "do not add up") || strstr(zck_last_error(), "outside the rank's partition"));
  ZT_ASSERT(!exists(out));

  /* DS-29: an unparseable ds_version: consolidation does not need it (accepted), but a
   * reshard for ZeRO-1/2, whose DeepSpeed loader parses it, is refused before writing */
  snprintf(ck, sizeof ck, "%s/ds29_bad_version", root);
  snprintf(out, sizeof out, "%s/o29", tmp);
  ZT_OK(zck_consolidate(ck, out, NULL));
  snprintf(out, sizeof out, "%s/r29", tmp);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_stage = 2;
  ZT_ERR(zck_reshard(ck, out, &ro), ZCK_ERR_FORMAT, "ds_version 'banana' is not a version DeepSpeed can parse");
  ZT_ASSERT(!exists(out));
  /* DS-55: param_slice_mappings that do not cover a param (sum over ranks) or name one
   * that is not in param_shapes */
  snprintf(ck, sizeof ck, "%s/ds55_slice_sum", root);
  snprintf(out, sizeof out, "%s/o55a", tmp);
  ZT_ERR(zck_consolidate(ck, out, NULL), ZCK_ERR_FORMAT, "param_slice_mappings of 'embed.weight' cover");
  ZT_ASSERT(!exists(out));
  snprintf(ck, sizeof ck, "%s/ds55_slice_name", root);
  snprintf(out, sizeof out, "%s/o55b", tmp);
  ZT_ERR(zck_consolidate(ck, out, NULL), ZCK_ERR_FORMAT, "names 'not.a.param'");
  ZT_ASSERT(!exists(out));
  free(root);
  free(tmp);
  return 0;
}
