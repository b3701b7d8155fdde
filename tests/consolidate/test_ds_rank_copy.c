/* test_ds_rank_copy.c: a ZeRO rank file that is a copy of another rank's is refused by
 * every reader job (consolidate, reshard, to-universal) with one line naming the file,
 * stages 1, 2 and 3 and ZeRO-3 model states; torch.save's archive folder (the file's stem
 * at save time) tells; where it cannot (an archive named otherwise), the copy's records
 * carry the other rank's CRC-32s and sizes, which tells too. An archive name that is no
 * rank pattern is still read. Also: an oversized `latest` says its real size. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"

#include "deepspeed/deepspeed.h"

static char *g_tmp;

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

/* A fresh copy of fixture `fx` named `name` under the test folder, its tag folder in tag. */
static void copy_fixture(const char *fx, const char *name, char *ck, size_t n) {
  char rel[512];
  snprintf(rel, sizeof rel, "deepspeed/%s/ckpt", fx);
  char *src = zt_fixture(rel);
  snprintf(ck, n, "%s/%s", g_tmp, name);
  sh("cp -r '%s' '%s'", src, ck);
  free(src);
}

static void expect_msg(zck_status s, const char *job, const char *needle) {
  if (s == ZCK_OK) ZT_FAIL("%s succeeded, expected an error with \"%s\"", job, needle);
  if (!strstr(zck_last_error(), needle)) ZT_FAIL("%s: message \"%s\" lacks \"%s\"", job, zck_last_error(), needle);
  if (strchr(zck_last_error(), '\n')) ZT_FAIL("%s: message is not one line: %s", job, zck_last_error());
}

/* consolidate, reshard and to-universal of ck each fail with one line holding needle, and
 * write nothing. */
static void every_job_refuses(const char *ck, const char *needle) {
  char out[4096];
  snprintf(out, sizeof out, "%s.cons", ck);
  expect_msg(zck_consolidate(ck, out, NULL), "consolidate", needle);
  ZT_ASSERT(!exists(out));
  snprintf(out, sizeof out, "%s.resh", ck);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_world_size = 1;
  expect_msg(zck_reshard(ck, out, &ro), "reshard", needle);
  ZT_ASSERT(!exists(out));
  snprintf(out, sizeof out, "%s.univ", ck);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.inject_missing_state = 1;
  expect_msg(zck_to_universal(ck, out, &uo), "to-universal", needle);
  ZT_ASSERT(!exists(out));
}

/* Copies rank 0's `file` (a name with rank_0) over rank 1's in a copy of fixture fx; every
 * job must refuse it, naming rank 1's file, and write nothing. */
static void check_copy(const char *fx, const char *file0, const char *what) {
  char ck[4096], f0[4096], f1[4096], file1[512], needle[8192];
  snprintf(file1, sizeof file1, "%s", file0);
  char *r = strstr(file1, "rank_0_");
  ZT_ASSERT(r != NULL);
  r[5] = '1';
  snprintf(ck, sizeof ck, "%s/copy_%s_%s", g_tmp, fx, what);
  char name[600];
  snprintf(name, sizeof name, "copy_%s_%s", fx, what);
  copy_fixture(fx, name, ck, sizeof ck);
  snprintf(f0, sizeof f0, "%s/global_step2/%s", ck, file0);
  snprintf(f1, sizeof f1, "%s/global_step2/%s", ck, file1);
  ZT_ASSERT(exists(f1));
  sh("cp '%s' '%s'", f0, f1);
  char stem[512];
  snprintf(stem, sizeof stem, "%.*s", (int)(strlen(file0) - 3), file0);
  snprintf(needle, sizeof needle, "%s: holds rank 0's %s (archive '%s'), expected rank 1", f1, what, stem);

  every_job_refuses(ck, needle);
}

static void replace_in_file(const char *path, const char *from, const char *to);

/* The same copy where the archive name cannot tell: rank 0's file, its archive renamed to no
 * rank pattern (a file saved under another name, or through a file object), copied over
 * rank 1's. Its records' CRC-32s and sizes are rank 0's: every job refuses it as a copy
 * (before the partition sizes it breaks are looked at). */
static void check_copy_renamed(const char *fx, const char *file0) {
  char ck[4096], f0[4096], f1[4096], file1[512], needle[8192], name[600], stem0[512], other[512];
  snprintf(file1, sizeof file1, "%s", file0);
  char *r = strstr(file1, "rank_0_");
  ZT_ASSERT(r != NULL);
  r[5] = '1';
  snprintf(name, sizeof name, "renamed_copy_%s", fx);
  copy_fixture(fx, name, ck, sizeof ck);
  snprintf(f0, sizeof f0, "%s/global_step2/%s", ck, file0);
  snprintf(f1, sizeof f1, "%s/global_step2/%s", ck, file1);
  snprintf(stem0, sizeof stem0, "%.*s/", (int)(strlen(file0) - 3), file0);
  snprintf(other, sizeof other, "%s", stem0);
  memset(other, 'x', strlen(other) - 1); /* same length, no rank in it */
  replace_in_file(f0, stem0, other);
  sh("cp '%s' '%s'", f0, f1);
  snprintf(needle, sizeof needle, "%s: the same bytes as %s (every record's CRC-32 and size)", f1, file0);
  every_job_refuses(ck, needle);
}

/* Replaces every occurrence of `from` in the file by `to` (same length). */
static void replace_in_file(const char *path, const char *from, const char *to) {
  unsigned char *d = NULL;
  size_t n = 0, m = strlen(from), hits = 0;
  ZT_ASSERT(strlen(to) == m);
  ZT_ASSERT(zt_read_file(path, &d, &n) == 0);
  for (size_t i = 0; i + m <= n; i++)
    if (!memcmp(d + i, from, m)) memcpy(d + i, to, m), hits++;
  ZT_ASSERT(hits >= 2); /* a local header and the central directory per entry */
  ZT_ASSERT(zt_write_file(path, d, n) == 0);
  free(d);
}

static int same_file(const char *a, const char *b) {
  unsigned char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  int same = zt_read_file(a, &x, &nx) == 0 && zt_read_file(b, &y, &ny) == 0 && nx == ny && !memcmp(x, y, nx);
  free(x);
  free(y);
  return same;
}

/* Every rank's optimizer file the same bytes, each archive naming its own rank: read, not
 * refused as copies. (A ZeRO-3 save with all its optimizer state swapped to NVMe holds only
 * empty partitions and the same pickle on every rank; torch's serialization_id record tells
 * DeepSpeed's files apart, but a file without one would not be.) Made here by zckpt's
 * writer with every value zero. */
static void same_bytes_named_ranks(void) {
  char *src = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(src, NULL, &c));
  zck_ds_write_opts o;
  zck_ds_write_opts_from(c, &o);
  o.stage = 3;
  o.world_size = 2;
  char root[4096], f0[4200], f1[4200], out[4200];
  snprintf(root, sizeof root, "%s/zeros", g_tmp);
  zck_ds_writer *wr = NULL;
  ZT_OK(zck_ds_writer_create(root, zck_ds_model(c), &o, &wr));
  ZT_OK(zck_ds_writer_commit(wr)); /* nothing written into it: zeros */
  zck_ds_writer_free(wr);
  zck_ds_close(c);
  free(src);
  /* the premise: the two files differ only in the rank their archive folder names */
  snprintf(f0, sizeof f0, "%s/global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", root);
  snprintf(f1, sizeof f1, "%s/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", root);
  replace_in_file(f1, "bf16_zero_pp_rank_1_mp_rank_00_optim_states/", "bf16_zero_pp_rank_0_mp_rank_00_optim_states/");
  ZT_ASSERT(same_file(f0, f1));
  replace_in_file(f1, "bf16_zero_pp_rank_0_mp_rank_00_optim_states/", "bf16_zero_pp_rank_1_mp_rank_00_optim_states/");
  snprintf(out, sizeof out, "%s/zeros.safetensors", g_tmp);
  ZT_OK(zck_consolidate(root, out, NULL));
  zck_verify_report *rep = NULL;
  zck_status vs = zck_verify(root, NULL, &rep);
  if (vs != ZCK_OK) {
    for (size_t i = 0; rep && i < rep->n_findings; i++) fprintf(stderr, "  %s\n", rep->findings[i].message);
    ZT_FAIL("verify of the zero-valued checkpoint: %s", zck_status_name(vs));
  }
  zck_verify_report_free(rep);
}

int main(void) {
  char *probe = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  if (!exists(probe)) zt_skip("fixture deepspeed/s3w2_bf16 missing");
  free(probe);
  g_tmp = zt_tmpdir();

  check_copy("s1w2_bf16", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "optimizer state");
  check_copy("s2w2_bf16", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "optimizer state");
  check_copy("s2w2_fp32_roundrobin", "zero_pp_rank_0_mp_rank_00_optim_states.pt", "optimizer state");
  check_copy("s3w2_bf16", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", "optimizer state");
  check_copy("s3w2_bf16", "zero_pp_rank_0_mp_rank_00_model_states.pt", "model states");
  check_copy_renamed("s1w2_bf16", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  check_copy_renamed("s2w4_fp32", "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  check_copy_renamed("s3w2_bf16", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  check_copy_renamed("s3w4_fp32_3groups", "zero_pp_rank_0_mp_rank_00_optim_states.pt");

  same_bytes_named_ranks();

  /* an archive named otherwise (no rank pattern: older torch's 'archive', a file saved
   * under another name) is read as before, with the same output */
  char ck[4096], f[4096], out[4096], ref[4096], a[4096], b[4096];
  copy_fixture("s3w2_bf16", "renamed", ck, sizeof ck);
  snprintf(ref, sizeof ref, "%s/ref.safetensors", g_tmp);
  ZT_OK(zck_consolidate(ck, ref, NULL));
  snprintf(f, sizeof f, "%s/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", ck);
  replace_in_file(f, "bf16_zero_pp_rank_1_mp_rank_00_optim_states/", "bf16_zero_pp_rank_X_mp_rank_00_optim_states/");
  snprintf(f, sizeof f, "%s/global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt", ck);
  replace_in_file(f, "zero_pp_rank_1_mp_rank_00_model_states/", "my_checkpoint_file_for_rank_one_states/");
  snprintf(out, sizeof out, "%s/renamed.safetensors", g_tmp);
  ZT_OK(zck_consolidate(ck, out, NULL));
  ZT_ASSERT(same_file(ref, out));

  /* zckpt's own DeepSpeed writer output (its archive names) reads back */
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_world_size = 3;
  snprintf(a, sizeof a, "%s/resharded", g_tmp);
  ZT_OK(zck_reshard(ck, a, &ro));
  snprintf(b, sizeof b, "%s/resharded.safetensors", g_tmp);
  ZT_OK(zck_consolidate(a, b, NULL));
  ZT_ASSERT(same_file(ref, b));

  /* an oversized `latest` is reported with its size (was "0 bytes": read after close) */
  copy_fixture("s3w2_bf16", "biglatest", ck, sizeof ck);
  snprintf(f, sizeof f, "%s/latest", ck);
  char big[5000];
  memset(big, 'a', sizeof big);
  ZT_ASSERT(zt_write_file(f, big, sizeof big) == 0);
  snprintf(out, sizeof out, "%s/biglatest.safetensors", g_tmp);
  char needle[8192];
  snprintf(needle, sizeof needle, "%s: 5000 bytes, more than the", f);
  expect_msg(zck_consolidate(ck, out, NULL), "consolidate", needle);
  ZT_ASSERT(!exists(out));
  free(g_tmp);
  return 0;
}
