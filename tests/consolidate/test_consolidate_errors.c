/* test_consolidate_errors.c: bad input and failing output give one clear error, a non-zero
 * status and nothing at the destination (no temporary files left either). */
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"
#include "test.h"

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  struct dirent *e;
  while (d && (e = readdir(d))) if (e->d_name[0] != '.' || strstr(e->d_name, "zck-tmp")) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}

/* Consolidation must fail (with `status`, or any error when it is ZCK_OK) and a message
 * containing `needle`, leaving the output directory's parent as it was. */
static void expect_fail(const char *ckpt, const char *outdir, zck_status status, const char *needle) {
  char out[4096];
  snprintf(out, sizeof out, "%s/out", outdir);
  int before = dir_entries(outdir);
  zck_status s = zck_consolidate(ckpt, out, NULL);
  if (s == ZCK_OK) ZT_FAIL("consolidate of %s succeeded, expected an error about %s", ckpt, needle);
  if (status != ZCK_OK && s != status) ZT_FAIL("expected %s, got %s: %s", zck_status_name(status), zck_status_name(s), zck_last_error());
  if (!strstr(zck_last_error(), needle)) ZT_FAIL("message \"%s\" lacks \"%s\"", zck_last_error(), needle);
  if (strchr(zck_last_error(), '\n')) ZT_FAIL("message is not one line: %s", zck_last_error());
  ZT_ASSERT(!exists(out));
  ZT_EQ_INT(dir_entries(outdir), before);
}

int main(void) {
  char *src = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  if (!exists(src)) zt_skip("fixture deepspeed/s3w2_bf16 missing");
  char *tmp = zt_tmpdir();
  char ck[4096], outdir[4096], f[4096];
  snprintf(outdir, sizeof outdir, "%s/outs", tmp);
  ZT_ASSERT(mkdir(outdir, 0755) == 0);

  /* missing rank file */
  snprintf(ck, sizeof ck, "%s/missing", tmp);
  sh("cp -r '%s' '%s'", src, ck);
  snprintf(f, sizeof f, "%s/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", ck);
  ZT_ASSERT(unlink(f) == 0);
  expect_fail(ck, outdir, ZCK_OK, "rank");

  /* truncated optimizer file */
  snprintf(ck, sizeof ck, "%s/truncated", tmp);
  sh("cp -r '%s' '%s'", src, ck);
  snprintf(f, sizeof f, "%s/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", ck);
  ZT_ASSERT(truncate(f, 3000) == 0);
  expect_fail(ck, outdir, ZCK_OK, "optim_states.pt");

  /* `latest` names a tag that does not exist */
  snprintf(ck, sizeof ck, "%s/badtag", tmp);
  sh("cp -r '%s' '%s'", src, ck);
  snprintf(f, sizeof f, "%s/latest", ck);
  ZT_ASSERT(zt_write_file(f, "global_step9", 12) == 0);
  expect_fail(ck, outdir, ZCK_OK, "global_step9");

  /* disk full while writing tensor data: nothing left behind, earlier output intact */
  char out[4096];
  snprintf(out, sizeof out, "%s/good", outdir);
  ZT_OK(zck_consolidate(src, out, NULL));
  for (int nth = 1; nth <= 3; nth++) {
    zck__io_fault_set(ZCK_IO_OP_WRITE, (uint64_t)nth, ENOSPC);
    expect_fail(src, outdir, ZCK_ERR_NO_SPACE, "No space left");
  }
  zck__io_fault_set(ZCK_IO_OP_WRITE, 0, 0);
  /* EIO on read of the checkpoint */
  zck__io_fault_set(ZCK_IO_OP_READ, 5, EIO);
  expect_fail(src, outdir, ZCK_ERR_IO, "Input/output error");
  zck__io_fault_set(ZCK_IO_OP_READ, 0, 0);
  /* fsync and rename failures at commit */
  zck__io_fault_set(ZCK_IO_OP_FSYNC, 1, EIO);
  expect_fail(src, outdir, ZCK_ERR_IO, "fsync");
  zck__io_fault_set(ZCK_IO_OP_FSYNC, 0, 0);

  /* an existing output is refused and left as it was */
  ZT_ERR(zck_consolidate(src, out, NULL), ZCK_ERR_EXISTS, "exists");
  snprintf(f, sizeof f, "%s/model.safetensors", out);
  ZT_ASSERT(exists(f));

  /* output under a path that cannot be a directory */
  snprintf(f, sizeof f, "%s/good/model.safetensors/sub", outdir);
  ZT_ASSERT(zck_consolidate(src, f, NULL) != ZCK_OK);
  ZT_ASSERT(strstr(zck_last_error(), "model.safetensors") != NULL);

  /* not a checkpoint at all */
  ZT_ASSERT(zck_consolidate(tmp, out, NULL) != ZCK_OK);
  ZT_ASSERT(strstr(zck_last_error(), tmp) != NULL);
  free(src);
  free(tmp);
  return 0;
}
