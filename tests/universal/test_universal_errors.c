/* test_universal_errors.c: malformed universal checkpoints (latest_universal, missing or
 * misshapen state files), one corrupted copy of a converted fixture per check, each refused
 * with a one-line error naming the file; and injected I/O faults (ENOSPC on write, failing fsync
 * and rename) during `to-universal` in both layouts leave nothing behind. */
#include <errno.h>

#include "io.h"
#include "universal/universal.h"
#include "zip/zip.h"
#include "zck.h"
#include "ut_util.h"

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}

/* A fresh copy of base (a folder holding latest_universal and uc/) to corrupt. */
static const char *fresh(const char *tmp, const char *base, const char *name) {
  static char p[4096];
  snprintf(p, sizeof p, "%s/%s", tmp, name);
  sh("rm -rf '%s' && mkdir -p '%s'", p, p);
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "cp -r '%s/uc' '%s/latest_universal' '%s/'", base, base, p);
  if (system(cmd) != 0) ZT_FAIL("copy failed");
  return p;
}

static void expect_open_fails(const char *dir, zck_status st, const char *needle, const char *names) {
  zck_uv_ckpt *c = NULL;
  ZT_ERR(zck_uv_open(dir, NULL, &c), st, needle);
  ZT_ASSERT(c == NULL);
  if (names && !strstr(zck_last_error(), names)) ZT_FAIL("message \"%s\" does not name %s", zck_last_error(), names);
}

static void convert(const char *cs, const char *parent) {
  char out[4096];
  snprintf(out, sizeof out, "%s/uc", parent);
  mkdir(parent, 0755);
  zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
  o.inject_missing_state = 1;
  ZT_OK(zck_to_universal(ut_ckpt(cs), out, &o));
}

static void test_malformed(const char *tmp) {
  char b2[4096], b3[4096], p[4096];
  snprintf(b2, sizeof b2, "%s/base2", tmp);
  snprintf(b3, sizeof b3, "%s/base3", tmp);
  convert("s2w2_bf16", b2);
  convert("s3w2_bf16", b3);
  zck_uv_ckpt *c = NULL;
  ZT_OK(zck_uv_open(b2, NULL, &c));   /* the parent (latest_universal) */
  zck_uv_close(c);
  snprintf(p, sizeof p, "%s/uc", b3);
  ZT_OK(zck_uv_open(p, NULL, &c));    /* the folder itself */
  ZT_EQ_INT(zck_uv_info_of(c)->stage, 3);
  zck_uv_close(c);

  const char *d = fresh(tmp, b2, "t70a");
  sh("rm '%s/latest_universal'%s", d, "");
  expect_open_fails(d, ZCK_ERR_NOT_FOUND, "not a universal checkpoint (no zero/ folder, no latest_universal)", NULL);
  d = fresh(tmp, b2, "t70b");
  sh(": > '%s/latest_universal'%s", d, "");
  expect_open_fails(d, ZCK_ERR_FORMAT, "empty", "latest_universal");
  d = fresh(tmp, b2, "t70c");
  sh("printf other > '%s/latest_universal'%s", d, "");
  expect_open_fails(d, ZCK_ERR_NOT_FOUND, "does not exist", "latest_universal");
  d = fresh(tmp, b2, "t70d");
  sh("printf ../base2 > '%s/latest_universal'%s", d, "");
  expect_open_fails(d, ZCK_ERR_FORMAT, "is not a folder name", NULL);
  d = fresh(tmp, b2, "t71");
  sh("rm '%s/uc/zero/optimizer_state.pt'%s", d, "");
  expect_open_fails(d, ZCK_ERR_NOT_FOUND, "missing", "optimizer_state.pt");
  d = fresh(tmp, b2, "t72");
  sh("rm '%s/uc/zero/fc1.weight/fp32.pt'%s", d, "");
  expect_open_fails(d, ZCK_ERR_NOT_FOUND, "missing for trainable param fc1.weight", "fc1.weight/fp32.pt");
  /* not the dict form; a dict without cat_dim; another param's shape */
  d = fresh(tmp, b2, "t73a");
  sh("cp '%s/uc/zero/fc1.weight/step.pt' '%s/uc/zero/fc1.weight/fp32.pt'", d, d);
  expect_open_fails(d, ZCK_ERR_FORMAT, "not a {'cat_dim', 'param'} dict", "fc1.weight/fp32.pt");
  d = fresh(tmp, b2, "t73b");
  sh("cp '%s/uc/zero/shift/fp32.pt' '%s/uc/zero/fc1.weight/fp32.pt'", d, d);
  expect_open_fails(d, ZCK_ERR_FORMAT, "not a {'cat_dim', 'param'} dict", "fc1.weight/fp32.pt");
  d = fresh(tmp, b2, "t73c");
  sh("cp '%s/uc/zero/fc1.bias/fp32.pt' '%s/uc/zero/fc1.weight/fp32.pt'", d, d);
  expect_open_fails(d, ZCK_ERR_MISMATCH, "shape [23], param_shapes says [23, 11]", "fc1.weight/fp32.pt");
  /* (stage 3 bare tensors) */
  d = fresh(tmp, b3, "t74");
  sh("cp '%s/uc/zero/fc1.bias/fp32.pt' '%s/uc/zero/fc1.weight/fp32.pt'", d, d);
  expect_open_fails(d, ZCK_ERR_MISMATCH, "23 elements, param fc1.weight has 253", "fc1.weight/fp32.pt");
  d = fresh(tmp, b2, "t75");
  sh("cp '%s/uc/zero/fc1.bias/exp_avg.pt' '%s/uc/zero/fc1.weight/exp_avg.pt'", d, d);
  expect_open_fails(d, ZCK_ERR_MISMATCH, "shape [23], param_shapes says [23, 11]", "fc1.weight/exp_avg.pt");
  d = fresh(tmp, b3, "t75b");
  sh("cp '%s/uc/zero/fc1.bias/exp_avg_sq.pt' '%s/uc/zero/fc1.weight/exp_avg_sq.pt'", d, d);
  expect_open_fails(d, ZCK_ERR_MISMATCH, "23 elements, param fc1.weight has 253", "fc1.weight/exp_avg_sq.pt");
  /* half of the optimizer state */
  d = fresh(tmp, b2, "texp");
  sh("rm '%s/uc/zero/ln.bias/exp_avg.pt'%s", d, "");
  expect_open_fails(d, ZCK_ERR_NOT_FOUND, "has exp_avg_sq.pt but not exp_avg.pt", "ln.bias");
  /* damaged files */
  d = fresh(tmp, b2, "ttrunc");
  sh("truncate -s 100 '%s/uc/zero/fc2.weight/fp32.pt'%s", d, "");
  expect_open_fails(d, ZCK_ERR_FORMAT, NULL, "fc2.weight/fp32.pt");
  d = fresh(tmp, b2, "tgarbage");
  sh("head -c 3000 /dev/urandom > '%s/uc/zero/optimizer_state.pt'%s", d, "");
  zck_status st = zck_uv_open(d, NULL, &c);
  ZT_ASSERT(st != ZCK_OK && strstr(zck_last_error(), "optimizer_state.pt"));
  d = fresh(tmp, b2, "tmodel");
  sh("rm '%s/uc/mp_rank_00_model_states.pt'%s", d, "");
  st = zck_uv_open(d, NULL, &c);
  ZT_ASSERT(st != ZCK_OK && strstr(zck_last_error(), "mp_rank_00_model_states.pt"));
  /* names that are not folder names */
  ZT_ERR(zck_uv_check_name("a/b"), ZCK_ERR_FORMAT, "parameter 'a/b' cannot be stored in a universal checkpoint: it holds '/'");
  ZT_ERR(zck_uv_check_name("../x"), ZCK_ERR_FORMAT, "parameter '../x' cannot be stored in a universal checkpoint: it holds '/'");
  ZT_ERR(zck_uv_check_name(".."), ZCK_ERR_FORMAT, "parameter '..' cannot be stored in a universal checkpoint: it is '.' or '..'");
  ZT_ERR(zck_uv_check_name("."), ZCK_ERR_FORMAT, "parameter '.' cannot be stored in a universal checkpoint: it is '.' or '..'");
  ZT_ERR(zck_uv_check_name(""), ZCK_ERR_FORMAT, "parameter '' cannot be stored in a universal checkpoint: it is empty");
  ZT_OK(zck_uv_check_name("layers.0.attn.weight"));
}

/* The parent may hold only `keep` and `keep2` (NULL: nothing). */
static void expect_only(const char *dir, const char *keep, const char *keep2) {
  DIR *dd = opendir(dir);
  ZT_ASSERT(dd);
  struct dirent *e;
  while ((e = readdir(dd))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if ((keep && !strcmp(e->d_name, keep)) || (keep2 && !strcmp(e->d_name, keep2))) continue;
    ZT_FAIL("%s: left behind: %s", dir, e->d_name);
  }
  closedir(dd);
}

static void test_faults(const char *tmp, zck_universal_format fmt) {
  char dir[4096], out[4096];
  snprintf(dir, sizeof dir, "%s/fault%d", tmp, (int)fmt);
  mkdir(dir, 0755);
  snprintf(out, sizeof out, "%s/%s", dir, fmt == ZCK_UNIVERSAL_HDF5 ? "uc.h5" : "uc");
  zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
  o.format = fmt;
  o.inject_missing_state = 1;
  o.chunk_bytes = 256;
  struct { zck__io_op op; int err; zck_status st; } kinds[] = {
    {ZCK_IO_OP_WRITE, ENOSPC, ZCK_ERR_NO_SPACE}, {ZCK_IO_OP_FSYNC, EIO, ZCK_ERR_IO}, {ZCK_IO_OP_RENAME, EIO, ZCK_ERR_IO}};
  for (size_t k = 0; k < 3; k++) {
    int failures = 0;
    for (uint64_t nth = 1;; nth = nth < 4 ? nth + 1 : nth * 3) {
      zck__io_fault_set(kinds[k].op, nth, kinds[k].err);
      zck_status st = zck_to_universal(ut_ckpt("s2w3_bf16"), out, &o);
      zck__io_fault_set(kinds[k].op, 0, 0);
      if (st == ZCK_OK) break;   /* fewer such operations than nth */
      if (st != kinds[k].st) ZT_FAIL("fault %zu #%llu: %s: %s", k, (unsigned long long)nth, zck_status_name(st), zck_last_error());
      expect_only(dir, NULL, NULL);
      failures++;
    }
    ZT_ASSERT(failures > 0);
    if (fmt == ZCK_UNIVERSAL_HDF5) expect_only(dir, "uc.h5", NULL);
    else expect_only(dir, "uc", "latest_universal");
    sh("rm -rf '%s'/* '%s'/.[!.]*", dir, dir);
  }
}

/* Rewrites every rank file of dir/global_step2 with `from` replaced by `to` (same length)
 * in its pickle: a checkpoint whose param is named `to`. */
static void rename_param(const char *dir, const char *from, const char *to) {
  static const char *files[] = {"mp_rank_00_model_states.pt", "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                                "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"};
  size_t n = strlen(from);
  ZT_ASSERT(strlen(to) == n);
  for (size_t k = 0; k < sizeof files / sizeof *files; k++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/global_step2/%s", dir, files[k]);
    zck__source src;
    zck_zip *z = NULL;
    ZT_OK(zck__source_open(&src, path));
    ZT_OK(zck_zip_open(&src, &z));
    zck__outfile out;
    zck_zip_writer *w = NULL;
    ZT_OK(zck__outfile_create(&out, path));
    ZT_OK(zck_zip_writer_create(&out, &w));
    for (size_t i = 0; i < zck_zip_count(z); i++) {
      const zck_zip_entry *e = zck_zip_entry_at(z, i);
      char *buf = malloc(e->size + 1);
      ZT_OK(zck_zip_read_entry(z, e, buf));
      if (ends_with(e->name, "data.pkl"))
        for (char *p = buf; p + n <= buf + e->size; p++)
          if (!memcmp(p, from, n)) memcpy(p, to, n);
      ZT_OK(zck_zip_writer_add(w, e->name, buf, e->size));
      free(buf);
    }
    ZT_OK(zck_zip_writer_finish(w));
    zck_zip_writer_free(w);
    ZT_OK(zck__outfile_commit(&out));
    zck_zip_close(z);
    zck__source_close(&src);
  }
}

/* A param whose name cannot be a folder or HDF5 group: the message names it, the reason
 * and the checkpoint (the HDF5 path said only "format error"), in both layouts. */
static void test_bad_names(const char *tmp) {
  char dir[4096], out[4096];
  snprintf(dir, sizeof dir, "%s/badname", tmp);
  sh("rm -rf '%s' && mkdir -p '%s'", dir, dir);
  sh("cp -r '%s/.' '%s'", ut_ckpt("s2w2_bf16"), dir);
  rename_param(dir, "ln.bias", "ln/bias");
  for (int fmt = 0; fmt < 2; fmt++) {
    snprintf(out, sizeof out, "%s/badname-out%s", tmp, fmt ? ".h5" : "");
    zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
    o.inject_missing_state = 1;
    o.format = fmt ? ZCK_UNIVERSAL_HDF5 : ZCK_UNIVERSAL_DS;
    ZT_ERR(zck_to_universal(dir, out, &o), ZCK_ERR_FORMAT,
           "badname/global_step2: parameter 'ln/bias' cannot be stored in a universal checkpoint: it holds '/'");
    struct stat sb;
    ZT_ASSERT(stat(out, &sb) != 0);
  }
}

int main(void) {
  char *tmp = zt_tmpdir();
  test_malformed(tmp);
  test_bad_names(tmp);
  test_faults(tmp, ZCK_UNIVERSAL_HDF5);
  test_faults(tmp, ZCK_UNIVERSAL_DS);
  free(tmp);
  return 0;
}
