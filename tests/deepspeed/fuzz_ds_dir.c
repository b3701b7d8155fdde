/* fuzz_ds_dir.c: the DeepSpeed directory reader on hostile metadata. The first input byte
 * picks one file of a real checkpoint (model states or an optimizer shard of a ZeRO-2 or
 * ZeRO-3 fixture), the rest replaces that file's bytes; the reader must describe the
 * directory or reject it with a message, never crash, hang or leak. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "deepspeed/deepspeed.h"

#ifndef ZCK_FUZZ_FIXTURES
#define ZCK_FUZZ_FIXTURES "tests/fixtures"
#endif

static const char *const cases[2] = {"s2w2_bf16", "s3w2_bf16"};
static const char *const files[2][3] = {
  {"mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"},
  {"zero_pp_rank_0_mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"}};
static char dirs[2][512];

static void setup(void) {
  if (dirs[0][0]) return;
  const char *fx = getenv("ZCK_FIXTURES") ? getenv("ZCK_FIXTURES") : ZCK_FUZZ_FIXTURES;
  for (int c = 0; c < 2; c++) {
    snprintf(dirs[c], sizeof dirs[c], "%s/zck-fuzz-ds-%d-%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(), c);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/deepspeed/%s/ckpt' '%s'", dirs[c], fx, cases[c], dirs[c]);
    if (system(cmd) != 0) { fprintf(stderr, "fuzz_ds_dir: cannot copy fixture %s\n", cases[c]); abort(); }
  }
}

static void cleanup(void) {
  for (int c = 0; c < 2; c++) {
    if (!dirs[c][0]) continue;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dirs[c]);
    if (system(cmd)) {}
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (!dirs[0][0]) { setup(); atexit(cleanup); }
  int c = data[0] & 1, f = (data[0] >> 1) % 3;
  char path[1024], orig[1100];
  snprintf(path, sizeof path, "%s/global_step2/%s", dirs[c], files[c][f]);
  snprintf(orig, sizeof orig, "%s.orig", path);
  if (access(orig, F_OK) != 0 && rename(path, orig) != 0) abort();
  FILE *fp = fopen(path, "wb");
  if (!fp) abort();
  fwrite(data + 1, 1, size - 1, fp);
  fclose(fp);
  zck_ds_ckpt *ck = NULL;
  if (zck_ds_open(dirs[c], NULL, &ck) == ZCK_OK) {
    size_t n = 0;
    const zck_ds_output *o = zck_ds_outputs(ck, &n);
    for (size_t i = 0; i < n; i++) (void)o[i].numel;
    zck_ds_view v;
    for (int p = 0; p < ZCK_DS_PART_COUNT; p++) (void)zck_ds_get(ck, (zck_ds_part)p, &v);
    zck_ds_close(ck);
  }
  /* the original back, so the next input mutates one file at a time */
  rename(orig, path);
  return 0;
}
