/* test_ds_malformed.c: broken copies of real DeepSpeed checkpoints, each rejected by
 * zck_ds_open with a specific one-line error naming the file:
 * root/tag problems (DS-01..04), file-set problems (DS-10..16), world-size disagreements
 * (DS-13, DS-43, DS-44), truncated files, and shapes that do not add up to the partitions
 * (DS-50, DS-51, DS-61). Broken sets that need consistent pickles are made by writing
 * variants with zck_ds_writer and mixing their files. */
#include "ds_test_util.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *tmp;
static int counter;

static char *fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
static char *fmt(const char *f, ...) {
  va_list ap;
  va_start(ap, f);
  char *s = NULL;
  if (vasprintf(&s, f, ap) < 0) abort();
  va_end(ap);
  return s;
}

static void sh(const char *cmd) {
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}
#define SH(...) do { char *sh_ = fmt(__VA_ARGS__); sh(sh_); free(sh_); } while (0)

/* A fresh copy of fixture case `name`'s ckpt folder; returns its path. */
static char *copy_case(const char *name) {
  char *src = zt_ds_ckpt_path(name);
  char *dst = fmt("%s/c%d-%s", tmp, counter++, name);
  if (zt_copy_tree(src, dst) != 0) ZT_FAIL("cp %s", src);
  free(src);
  return dst;
}

/* Opening path must fail with status and a message containing every needle. */
static void expect_fail(const char *path, const zck_ds_open_opts *o, zck_status st, const char *n1, const char *n2) {
  zck_ds_ckpt *c = NULL;
  zck_status s = zck_ds_open(path, o, &c);
  if (s == ZCK_OK) ZT_FAIL("%s: opened, expected %s (%s)", path, zck_status_name(st), n1);
  const char *msg = zck_last_error();
  if (s != st) ZT_FAIL("%s: got %s (%s), expected %s", path, zck_status_name(s), msg, zck_status_name(st));
  if (n1 && !strstr(msg, n1)) ZT_FAIL("message \"%s\" lacks \"%s\"", msg, n1);
  if (n2 && !strstr(msg, n2)) ZT_FAIL("message \"%s\" lacks \"%s\"", msg, n2);
  if (strchr(msg, '\n')) ZT_FAIL("message is not one line: %s", msg);
  fprintf(stderr, "    ok: %s\n", msg);
}

static void expect_ok(const char *path, const zck_ds_open_opts *o) {
  zck_ds_ckpt *c = NULL;
  if (zck_ds_open(path, o, &c) != ZCK_OK) ZT_FAIL("%s: %s", path, zck_last_error());
  zck_ds_close(c);
}

static void write_latest(const char *root, const char *text) {
  char *p = fmt("%s/latest", root);
  ZT_EQ_INT(zt_write_file(p, text, strlen(text)), 0);
  free(p);
}

/* ---- root and tag (DS-01..DS-04) */
static void root_and_tag(void) {
  fprintf(stderr, "  root and tag\n");
  char *r = copy_case("s2w2_bf16");
  expect_ok(r, NULL);
  char *tagdir = fmt("%s/global_step2", r);
  expect_ok(tagdir, NULL);                       /* a tag folder directly */
  write_latest(r, "  global_step2\n");           /* whitespace is stripped */
  expect_ok(r, NULL);
  write_latest(r, " \n");
  expect_fail(r, NULL, ZCK_ERR_FORMAT, "latest", "empty");
  write_latest(r, "../elsewhere");
  expect_fail(r, NULL, ZCK_ERR_FORMAT, "latest", "not a plain folder name");
  write_latest(r, "global_step9");
  expect_fail(r, NULL, ZCK_ERR_NOT_FOUND, "global_step9", "does not exist");
  zck_ds_open_opts o = ZCK_DS_OPEN_OPTS_INIT;
  o.tag = "global_step2";                        /* an explicit tag wins over latest */
  expect_ok(r, &o);
  o.tag = "global_step7";
  expect_fail(r, &o, ZCK_ERR_NOT_FOUND, "'global_step7' does not exist", NULL);
  char *lp = fmt("%s/latest", r);
  unlink(lp);
  expect_fail(r, NULL, ZCK_ERR_NOT_FOUND, "no 'latest' file; pass a tag", "global_step2");
  char *lf = fmt("%s/latest", r);
  SH("mkdir '%s'", lf);                     /* latest that cannot be read as a file */
  expect_fail(r, NULL, ZCK_ERR_INVALID_ARG, "latest", "directory");
  char *empty = fmt("%s/empty%d", tmp, counter++);
  SH("mkdir '%s'", empty);
  expect_fail(empty, NULL, ZCK_ERR_NOT_FOUND, "not a DeepSpeed checkpoint", NULL);
  char *file = fmt("%s/mp_rank_00_model_states.pt", tagdir);
  expect_fail(file, NULL, ZCK_ERR_INVALID_ARG, "not a directory", NULL);
  expect_fail("/nonexistent/zckpt/ckpt", NULL, ZCK_ERR_NOT_FOUND, "/nonexistent/zckpt/ckpt", NULL);
  free(r); free(tagdir); free(lp); free(lf); free(empty); free(file);
}

/* ---- file set (DS-04, DS-10..DS-17) */
static void file_set(void) {
  fprintf(stderr, "  file set\n");
  char *r = copy_case("s2w2_bf16");
  char *t = fmt("%s/global_step2", r);
  char *o1 = fmt("%s/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", t);
  char *o2 = fmt("%s/bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", t);
  char *o0 = fmt("%s/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", t);
  SH("cp '%s' '%s'", o1, o2);               /* extra rank file (DS-13) */
  expect_fail(r, NULL, ZCK_ERR_MISMATCH, "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", "extra optimizer file");
  unlink(o2);
  SH("mv '%s' '%s'", o1, o2);               /* a gap: ranks 0 and 2 (DS-12) */
  expect_fail(r, NULL, ZCK_ERR_NOT_FOUND, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "missing optimizer file for dp rank 1");
  unlink(o2);                                    /* missing last rank */
  expect_fail(r, NULL, ZCK_ERR_NOT_FOUND, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "world size 2");
  free(r); free(t); free(o1); free(o2); free(o0);

  r = copy_case("s2w2_bf16");
  t = fmt("%s/global_step2", r);
  o0 = fmt("%s/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt", t);
  o1 = fmt("%s/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", t);
  SH("mv '%s' '%s/bf16_zero_pp_rank_01_mp_rank_00_optim_states.pt'", o1, t);   /* zero-padded rank: not a DeepSpeed name */
  expect_fail(r, NULL, ZCK_ERR_UNSUPPORTED, "bf16_zero_pp_rank_01_mp_rank_00_optim_states.pt", "unsupported checkpoint layout");
  SH("mv '%s/bf16_zero_pp_rank_01_mp_rank_00_optim_states.pt' '%s/bf16_zero_pp_rank_1_mp_rank_00optim_states.pt'", t, t);
  expect_ok(r, NULL);                            /* DS-17: the old name without '_' is accepted */
  SH("mv '%s/bf16_zero_pp_rank_1_mp_rank_00optim_states.pt' '%s'", t, o1);
  SH("cp '%s' '%s/zero_pp_rank_0_mp_rank_00_optim_states.pt'", o0, t);   /* DS-10 */
  expect_fail(r, NULL, ZCK_ERR_FORMAT, "two name prefixes", "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  SH("rm '%s/zero_pp_rank_0_mp_rank_00_optim_states.pt'", t);
  SH("cp '%s' '%s/layer_01_expert_0_mp_rank_00_model_states.pt'", o0, t);  /* DS-11 */
  expect_fail(r, NULL, ZCK_ERR_UNSUPPORTED, "layer_01_expert_0_mp_rank_00_model_states.pt", "MoE");
  SH("rm '%s/layer_01_expert_0_mp_rank_00_model_states.pt'", t);
  SH("cp '%s/mp_rank_00_model_states.pt' '%s/mp_rank_01_model_states.pt'", t, t);  /* tensor parallel */
  /* a stray mp rank: AutoTP folders hold one file set per mp rank, named in mp_world_size */
  expect_fail(r, NULL, ZCK_ERR_MISMATCH, "mp_rank_00_model_states.pt", "mp_world_size 1 but the folder holds files of 2 mp");
  SH("rm '%s/mp_rank_01_model_states.pt'", t);
  char *o1_orig = fmt("%s.rank1.pt", r);        /* beside the checkpoint, not in it */
  SH("cp '%s' '%s'", o1, o1_orig);
  SH(": > '%s'", o1);                        /* DS-04: zero-length (a rank still writing) */
  expect_fail(r, NULL, ZCK_ERR_TRUNCATED, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "incomplete checkpoint");
  SH("cp '%s' '%s' && truncate -s 5000 '%s'", o0, o1, o1);   /* truncated optimizer file */
  expect_fail(r, NULL, ZCK_ERR_FORMAT, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", NULL);
  /* rank 1's own file back (a copy of rank 0's is refused: its archive says rank 0) */
  SH("cp '%s' '%s' && truncate -s 5000 '%s/mp_rank_00_model_states.pt'", o1_orig, o1, t);
  expect_fail(r, NULL, ZCK_ERR_FORMAT, "mp_rank_00_model_states.pt", NULL);
  SH("rm '%s/mp_rank_00_model_states.pt'", t);   /* DS-15 */
  expect_fail(r, NULL, ZCK_ERR_NOT_FOUND, "no model-states file", NULL);
  free(r); free(t); free(o0); free(o1); free(o1_orig);

  r = copy_case("s3w2_bf16");                    /* DS-14: a stage-3 model file missing */
  t = fmt("%s/global_step2", r);
  SH("rm '%s/zero_pp_rank_1_mp_rank_00_model_states.pt'", t);
  expect_fail(r, NULL, ZCK_ERR_NOT_FOUND, "zero_pp_rank_1_mp_rank_00_model_states.pt", "missing model-states file for dp rank 1");
  SH("cp '%s/zero_pp_rank_0_mp_rank_00_model_states.pt' '%s/zero_pp_rank_3_mp_rank_00_model_states.pt'", t, t);
  expect_fail(r, NULL, ZCK_ERR_NOT_FOUND, "zero_pp_rank_1_mp_rank_00_model_states.pt", NULL);
  free(r); free(t);

  r = copy_case("s2w2_bf16");                    /* DS-47 */
  t = fmt("%s/global_step2", r);
  SH("mkdir '%s/offloaded_tensors'", t);
  expect_fail(r, NULL, ZCK_ERR_UNSUPPORTED, "offloaded_tensors", "NVMe");
  free(r); free(t);
}

/* ---- world sizes and shapes, with files mixed from consistent variants */

static char *write_variant(const zck_ds_ckpt *c, const zck_model *m, int stage, uint32_t w) {
  zck_ds_write_opts o;
  zck_ds_write_opts_from(c, &o);
  o.stage = stage;
  o.world_size = w;
  char *root = fmt("%s/v%d-s%dw%u", tmp, counter++, stage, w);
  zck_ds_writer *wr = NULL;
  ZT_OK(zck_ds_writer_create(root, m, &o, &wr));
  /* the values do not matter here, but each rank's fp32 partition gets its own (the first
   * element: the store's index + 1), so the ranks' files differ as real ones do; a file
   * set of equal files is refused as copies before anything else */
  zck_ds_view v;
  ZT_OK(zck_ds_writer_get(wr, ZCK_DS_FP32, &v));
  for (size_t i = 0; i < v.layout->n_stores; i++) {
    const zck_store *st = &v.stores[i];
    float x = (float)(i + 1);
    if (st->numel && st->write && st->dtype == ZCK_F32) ZT_OK(st->write(st->ctx, &x, 0, 1));
  }
  ZT_OK(zck_ds_writer_commit(wr));
  zck_ds_writer_free(wr);
  return root;
}

/* A copy of c's manifest with param `name` given shape {n}. */
static zck_model *reshaped(const zck_model *m, const char *name, int64_t n) {
  zck_model *r = zck_model_new();
  for (size_t p = 0; p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    int alt = !strcmp(pp->name, name);
    ZT_OK(zck_model_add_param(r, pp->name, alt ? 1 : pp->ndim, alt ? &n : pp->shape, pp->dtype, NULL));
    zck_model_set_frozen(r, (uint32_t)p, pp->frozen);
  }
  for (size_t p = 0; p < m->n_params; p++)
    if (m->params[p].tied_to >= 0) ZT_OK(zck_model_set_tied(r, (uint32_t)p, (uint32_t)m->params[p].tied_to));
  for (size_t b = 0; b < m->n_buffers; b++)
    ZT_OK(zck_model_add_buffer(r, m->buffers[b].name, m->buffers[b].ndim, m->buffers[b].shape, m->buffers[b].dtype, NULL));
  for (size_t g = 0; g < m->n_groups; g++) {
    uint32_t gi;
    ZT_OK(zck_model_add_group(r, &gi));
    for (size_t i = 0; i < m->groups[g].n_params; i++) ZT_OK(zck_model_group_add_param(r, gi, m->groups[g].params[i]));
  }
  return r;
}

static void mixed(void) {
  fprintf(stderr, "  world sizes and shapes\n");
  char *src = zt_ds_ckpt_path("s2w2_bf16");
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(src, NULL, &c));
  const zck_model *m = zck_ds_model(c);

  /* DS-43: rank 1's file from a 3-rank run */
  char *a = write_variant(c, m, 2, 2), *b = write_variant(c, m, 2, 3);
  SH("cp '%s/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt' '%s/global_step2/'", b, a);
  expect_fail(a, NULL, ZCK_ERR_MISMATCH, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "partition_count 3");
  /* DS-44: the model file of a 3-rank run */
  free(a);
  a = write_variant(c, m, 2, 2);
  SH("cp '%s/global_step2/mp_rank_00_model_states.pt' '%s/global_step2/'", b, a);
  expect_fail(a, NULL, ZCK_ERR_MISMATCH, "mp_rank_00_model_states.pt", "dp_world_size 3");
  /* DS-13 with partition_count: a 3-rank run missing its last file */
  SH("rm '%s/global_step2/bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt'", b);
  expect_fail(b, NULL, ZCK_ERR_NOT_FOUND, "bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt", "partition_count");
  /* DS-42: stage-1 and stage-2 files mixed */
  free(a);
  free(b);
  a = write_variant(c, m, 2, 2);
  b = write_variant(c, m, 1, 2);
  SH("cp '%s/global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt' '%s/global_step2/'", b, a);
  expect_fail(a, NULL, ZCK_ERR_MISMATCH, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "zero_stage 1");

  /* DS-51: param_shapes say fc1.bias has 25 elements, the partitions hold 23 */
  zck_model *big = reshaped(m, "fc1.bias", 25);
  free(a);
  free(b);
  a = write_variant(c, m, 2, 2);
  b = write_variant(c, big, 2, 2);
  SH("cp '%s/global_step2/mp_rank_00_model_states.pt' '%s/global_step2/'", b, a);
  expect_fail(a, NULL, ZCK_ERR_MISMATCH, "single_partition_of_fp32_groups[1]", "do not add up");
  /* DS-61: the same in stage 3 */
  free(a);
  free(b);
  a = write_variant(c, m, 3, 2);
  b = write_variant(c, big, 3, 2);
  SH("cp '%s/global_step2/'zero_pp_rank_*_model_states.pt '%s/global_step2/'", b, a);
  expect_fail(a, NULL, ZCK_ERR_MISMATCH, "fp32_flat_groups[1]", "ceil(n/2)");
  /* DS-32: stage-3 model files that disagree */
  zck_model_free(big);
  free(a);
  free(b);
  a = write_variant(c, m, 3, 2);
  big = reshaped(m, "fc2.bias", 12);
  b = write_variant(c, big, 3, 2);
  SH("cp '%s/global_step2/zero_pp_rank_1_mp_rank_00_model_states.pt' '%s/global_step2/'", b, a);
  expect_fail(a, NULL, ZCK_ERR_MISMATCH, "zero_pp_rank_1_mp_rank_00_model_states.pt", "param_shapes differ");
  zck_model_free(big);
  free(a);
  free(b);

  /* DS-50: a 3-group model file over 2-group optimizer files */
  char *g3 = zt_ds_ckpt_path("s2w4_fp32_3groups");
  char *g2 = copy_case("s2w4_fp32");
  SH("cp '%s/global_step2/mp_rank_00_model_states.pt' '%s/global_step2/'", g3, g2);
  expect_fail(g2, NULL, ZCK_ERR_MISMATCH, "mp_rank_00_model_states.pt", "param_shapes has 3 groups");
  free(g3);
  free(g2);

  /* DS-48 on request: a checkpoint saved without optimizer state */
  zck_ds_write_opts o;
  zck_ds_write_opts_from(c, &o);
  o.has_optimizer_state = false;
  char *root = fmt("%s/nostate%d", tmp, counter++);
  zck_ds_writer *wr = NULL;
  ZT_OK(zck_ds_writer_create(root, m, &o, &wr));
  ZT_OK(zck_ds_writer_commit(wr));
  zck_ds_writer_free(wr);
  expect_ok(root, NULL);
  zck_ds_open_opts oo = ZCK_DS_OPEN_OPTS_INIT;
  oo.require_optimizer_state = true;
  expect_fail(root, &oo, ZCK_ERR_NOT_FOUND, "no optimizer state", NULL);
  free(root);
  zck_ds_close(c);
  free(src);
}

int main(void) {
  size_t n;
  char **cases = zt_ds_cases(&n);
  int have = 0;
  for (size_t i = 0; i < n; i++)
    have += !strcmp(cases[i], "s2w2_bf16") || !strcmp(cases[i], "s3w2_bf16") || !strcmp(cases[i], "s2w4_fp32") ||
            !strcmp(cases[i], "s2w4_fp32_3groups");
  zt_ds_free_cases(cases, n);
  if (have < 4) zt_skip("DeepSpeed fixtures s2w2_bf16, s3w2_bf16, s2w4_fp32(_3groups) missing");
  tmp = zt_tmpdir();
  root_and_tag();
  file_set();
  mixed();
  free(tmp);
  return 0;
}
