/* test_manifest_as_written.c: every job writes its zckpt-manifest.json from hashes its
 * writers made as they wrote (lib/stream_hash.h), reading none of its output back
 * (zck__manifest_reread_total stays where it was), and that manifest is byte for byte the
 * one made by reading the files back (zck_manifest_write_dir):
 *   - consolidate into an HF folder: sharded safetensors + index + pytorch_model.bin +
 *     config.json beside them, and into a pytorch_model.bin folder;
 *   - to-universal (DeepSpeed layout): per-param tensor files, zero/optimizer_state.pt,
 *     step.pt (stage 1/2) and the byte-for-byte copies of the model-states files;
 *   - reshard (its tag folder), and reshard --to-tp-size of AutoTP checkpoints (every TP
 *     rank's writer hashes its own files).
 * The fixtures are small: every file streams within the writers' 64 MiB budgets; the
 * consolidations are run again with a budget of 64 bytes, the case of a big checkpoint. */
#include "manifest.h"
#include "stream_hash.h"
#include "test.h"
#include "util.h"
#include "zck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *join(const char *a, const char *b) {
  size_t n = strlen(a) + strlen(b) + 2;
  char *p = malloc(n);
  if (!p) ZT_FAIL("out of memory");
  snprintf(p, n, "%s/%s", a, b);
  return p;
}

/* dir's manifest as the job wrote it, then as reading every file back makes it: equal;
 * and the job read nothing back (reread_before: the counter before the job ran). */
static void check(const char *what, const char *dir, const char *kind, uint64_t reread_before) {
  uint64_t reread = zck__manifest_reread_total() - reread_before;
  if (reread) ZT_FAIL("%s: the manifest of %s read %llu bytes of its output back", what, dir, (unsigned long long)reread);
  char *mpath = join(dir, ZCK_MANIFEST_NAME);
  unsigned char *a = NULL, *b = NULL;
  size_t na = 0, nb = 0;
  if (zt_read_file(mpath, &a, &na) != 0) ZT_FAIL("%s: no %s", what, mpath);
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.kind = kind;
  ZT_OK(zck_manifest_write_dir(dir, &mo)); /* the same, read back */
  if (zt_read_file(mpath, &b, &nb) != 0) ZT_FAIL("%s: cannot read %s", what, mpath);
  if (na != nb || memcmp(a, b, na)) ZT_FAIL("%s: %s differs from the manifest read back (%zu / %zu bytes)", what, mpath, na, nb);
  /* the files are there to be counted: the check itself read them */
  if (zck__manifest_reread_total() == reread_before) ZT_FAIL("%s: the read-back counter counts nothing", what);
  free(a);
  free(b);
  free(mpath);
}

/* Every file of a equals b's (listed by a's manifest). */
static void same_files(const char *a, const char *b) {
  zck_manifest *m = NULL;
  ZT_OK(zck_manifest_read(a, &m));
  for (size_t i = 0; i < m->n_files; i++) {
    char *pa = join(a, m->files[i].path), *pb = join(b, m->files[i].path);
    unsigned char *da = NULL, *db = NULL;
    size_t na = 0, nb = 0;
    if (zt_read_file(pa, &da, &na) != 0 || zt_read_file(pb, &db, &nb) != 0) ZT_FAIL("cannot read %s or %s", pa, pb);
    if (na != nb || memcmp(da, db, na)) ZT_FAIL("%s differs from %s", pb, pa);
    free(da);
    free(db);
    free(pa);
    free(pb);
  }
  zck_manifest_free(m);
}

/* threads 0: all cores; 1: with a tight hash budget, one thread, so that nothing but the
 * order of the copy decides what runs ahead of a file's hash cursor */
static void consolidate_hf(const char *src, const char *out, unsigned threads) {
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  o.torch_bin = 1;
  o.max_shard_size = 1024; /* several shards and an index */
  o.threads = threads;
  uint64_t before = zck__manifest_reread_total();
  ZT_OK(zck_consolidate(src, out, &o));
  check("consolidate (HF folder)", out, "safetensors", before);
  char *index = join(out, "model.safetensors.index.json"), *config = join(out, "config.json");
  unsigned char *d = NULL;
  size_t n = 0;
  if (zt_read_file(index, &d, &n) != 0) ZT_FAIL("%s: not sharded", out);
  free(d);
  if (zt_read_file(config, &d, &n) != 0) ZT_FAIL("%s: no config.json", out);
  free(d);
  free(index);
  free(config);
}

static void consolidate_bin_dir(const char *src, const char *out, unsigned threads) {
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  o.safetensors = 0;
  o.torch_bin = 1;
  o.threads = threads;
  uint64_t before = zck__manifest_reread_total();
  ZT_OK(zck_consolidate(src, out, &o));
  check("consolidate (pytorch_model.bin folder)", out, "torch", before);
}

static void to_universal(const char *src, const char *out) {
  zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
  o.inject_missing_state = 1; /* the fixtures' DeepSpeed saved no universal_checkpoint_info */
  uint64_t before = zck__manifest_reread_total();
  ZT_OK(zck_to_universal(src, out, &o));
  check("to-universal", out, "universal", before);
}

/* OUT/<the tag `latest` names> */
static char *tag_dir_of(const char *out) {
  char *latest = join(out, "latest");
  unsigned char *tag = NULL;
  size_t n = 0;
  if (zt_read_file(latest, &tag, &n) != 0) ZT_FAIL("%s: no latest", out);
  char *t = calloc(n + 1, 1);
  if (!t) ZT_FAIL("out of memory");
  memcpy(t, tag, n);
  char *dir = join(out, t);
  free(t);
  free(tag);
  free(latest);
  return dir;
}

/* A reshard of the fixture (its tag folder checked), with a config.json beside it: the
 * source of the consolidations. */
static char *reshard(const char *src, const char *out, int stage, uint32_t world) {
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  o.to_stage = stage;
  o.to_world_size = world;
  uint64_t before = zck__manifest_reread_total();
  ZT_OK(zck_reshard(src, out, &o));
  char *tag_dir = tag_dir_of(out);
  check("reshard", tag_dir, "deepspeed", before);
  static const char config[] = "{\n  \"model_type\": \"gpt2\"\n}\n";
  char *cfg = join(out, "config.json");
  if (zt_write_file(cfg, config, sizeof config - 1) != 0) ZT_FAIL("cannot write %s", cfg);
  free(cfg);
  free(tag_dir);
  return zck__strdup(out);
}

/* reshard --to-tp-size of an AutoTP checkpoint at its own TP size: the tag folder holds
 * every TP rank's files, each written by its own DeepSpeed writer. */
static void reshard_tp(const char *fixture, const char *out, int stage, uint32_t world) {
  char *src = zt_fixture(fixture);
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  o.to_tp_size = 2;
  o.to_stage = stage;
  o.to_world_size = world;
  uint64_t before = zck__manifest_reread_total();
  ZT_OK(zck_reshard(src, out, &o));
  char *tag_dir = tag_dir_of(out);
  check("reshard --to-tp-size", tag_dir, "deepspeed", before);
  free(tag_dir);
  free(src);
}

int main(void) {
  char *tmp = zt_tmpdir();
  static const struct { const char *fixture; int stage; uint32_t world; } tp_cases[] = {
      {"autotp/tp2dp2_s2_bf16_tied/ckpt", 1, 1},
      {"autotp/tp2dp2_s3_bf16_tied/ckpt", 3, 2},
      {"autotp/tp2_s1_fp32_tied/ckpt", 2, 2},
  };
  for (size_t i = 0; i < sizeof tp_cases / sizeof tp_cases[0]; i++) {
    char name[64];
    snprintf(name, sizeof name, "tp%zu", i);
    char *out = join(tmp, name);
    reshard_tp(tp_cases[i].fixture, out, tp_cases[i].stage, tp_cases[i].world);
    free(out);
  }
  static const struct { const char *fixture; int stage; uint32_t world; } cases[] = {
      {"deepspeed/s2w2_bf16/ckpt", 1, 3},
      {"deepspeed/s3w2_bf16/ckpt", 3, 1},
      {"deepspeed/s1w2_fp32_paramalign/ckpt", 2, 2},
      {"deepspeed/s2w2_fp32_zeronumel/ckpt", 2, 1}, /* zero-element tensors: empty ranges */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *fx = zt_fixture(cases[i].fixture);
    char name[64];
    snprintf(name, sizeof name, "rs%zu", i);
    char *rs_out = join(tmp, name);
    char *rs = reshard(fx, rs_out, cases[i].stage, cases[i].world);
    snprintf(name, sizeof name, "hf%zu", i);
    char *hf = join(tmp, name);
    consolidate_hf(rs, hf, 0);
    snprintf(name, sizeof name, "bin%zu", i);
    char *bin = join(tmp, name);
    consolidate_bin_dir(rs, bin, 0);
    /* outputs bigger than what the hashes may hold ahead of their cursors (a budget of
     * 64 bytes stands for 64 MiB): the rank files' XXH3s are checked in a pass of their
     * own, and the copy follows the output's order, frozen params and buffers in their
     * places among the masters, so nothing runs ahead and nothing is read back */
    zck__shash_set_default_budget(64);
    snprintf(name, sizeof name, "hft%zu", i);
    char *hft = join(tmp, name);
    consolidate_hf(rs, hft, 1);
    snprintf(name, sizeof name, "bint%zu", i);
    char *bint = join(tmp, name);
    consolidate_bin_dir(rs, bint, 1);
    zck__shash_set_default_budget(0);
    same_files(hf, hft);
    same_files(bin, bint);
    free(hft);
    free(bint);
    snprintf(name, sizeof name, "uv%zu", i);
    char *uv = join(tmp, name);
    to_universal(fx, uv);
    snprintf(name, sizeof name, "uvrs%zu", i);
    char *uv2 = join(tmp, name);
    to_universal(rs, uv2); /* a zckpt-written source: the model files copied under its manifest */
    free(fx);
    free(rs_out);
    free(rs);
    free(hf);
    free(bin);
    free(uv);
    free(uv2);
  }
  free(tmp);
  printf("ok: every manifest made as written, none read back\n");
  return 0;
}
