/* test_nvme.c: ZeRO-3 checkpoints whose optimizer DeepSpeed swapped to NVMe
 * (tests/fixtures/deepspeed/s3w2_*_nvme: <tag>/offloaded_tensors/rankRR/ swap files, empty
 * partitions in the optim files), beyond what every fixture gets from test_ds_describe
 * (fp32 masters == the live engine's) and test_ds_roundtrip:
 *   - the swapped sub-groups really come from the swap files, and the Adam moments of
 *     every param equal the live engine's (safe_get_full_optimizer_state, swapped in);
 *   - consolidate equals live_fp32.safetensors (zero_to_fp32 cannot read these);
 *   - reshard into plain ZeRO-2 files (no offloaded_tensors/), whose states are the same;
 *   - to-universal, and the reshard of that folder equals the direct reshard byte for byte;
 *   - reshard to ZeRO-3 at another W keeps the NVMe layout: swap files for the target's
 *     swapped sub-groups, the same states read back, covered by the manifest (verify finds
 *     a flipped bit in one); a partition size the source's swaps do not settle is refused
 *     unless --swap-min-bytes says; --to-offload none writes plain files, nvme at ZeRO-2 is
 *     refused;
 *   - verify says OK;
 *   - damage: a truncated or a missing swap file is refused by open with one line naming
 *     it, and nothing is written. (A flipped bit inside a swap file cannot be found:
 *     DeepSpeed writes no checksum for them.) */
#include "ds_test_util.h"
#include "safetensors/safetensors.h"
#include "sha256.h"
#include "zck.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void sh(const char *cmd) {
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}

static bool exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0;
}

static const cJSON *get(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!v) ZT_FAIL("expected.json: no '%s'", k);
  return v;
}

/* Every trainable param's exp_avg / exp_avg_sq (materialised from the view) has the live
 * engine's SHA-256; returns how many stores of the fp32 part are swap files. */
static size_t check_states(const char *cs, const char *ckpt, const cJSON *live, bool want_swapped) {
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(ckpt, NULL, &c));
  const zck_model *m = zck_ds_model(c);
  static const char *key[2] = {"exp_avg", "exp_avg_sq"};
  for (int k = 0; k < 2; k++) {
    zck_ds_view v;
    ZT_OK(zck_ds_get(c, k ? ZCK_DS_EXP_AVG_SQ : ZCK_DS_EXP_AVG, &v));
    size_t n = 0;
    for (size_t p = 0; p < m->n_params; p++) {
      const zck_param *pp = &m->params[p];
      if (pp->frozen || pp->tied_to >= 0) continue;
      void *buf = zt_ds_read_param(&v, m, (uint32_t)p, ZCK_F32);
      if (!buf) ZT_FAIL("%s: %s %s: cannot materialise: %s", cs, pp->name, key[k], zck_last_error());
      char hex[65];
      zt_sha256_hex(buf, (size_t)(pp->numel * 4), hex);
      free(buf);
      if (strcmp(hex, get(get(live, pp->name), key[k])->valuestring))
        ZT_FAIL("%s: %s of %s differs from the live engine's", cs, key[k], pp->name);
      n++;
    }
    ZT_EQ_INT(n, cJSON_GetArraySize(live));
  }
  zck_ds_view fp32;
  ZT_OK(zck_ds_get(c, ZCK_DS_FP32, &fp32));
  size_t swapped = 0;
  for (size_t i = 0; i < fp32.layout->n_stores; i++)
    if (fp32.stores[i].name && strstr(fp32.stores[i].name, "/offloaded_tensors/rank")) swapped++;
  if (want_swapped && !swapped) ZT_FAIL("%s: no store reads offloaded_tensors/", cs);
  if (!want_swapped && swapped) ZT_FAIL("%s: a plain checkpoint reads offloaded_tensors/", cs);
  zck_ds_close(c);
  return swapped;
}

/* The first fp32 swap file (not exp_avg-*) of rank 0, as a path under dir. */
static char *first_swap(const char *ckpt_copy) {
  char *dir = NULL;
  if (asprintf(&dir, "%s/global_step2/offloaded_tensors/rank00", ckpt_copy) < 0) abort();
  if (!exists(dir)) {  /* a root with the tag folder under it, or the tag folder's parent */
    free(dir);
    if (asprintf(&dir, "%s/offloaded_tensors/rank00", ckpt_copy) < 0) abort();
  }
  DIR *d = opendir(dir);
  ZT_ASSERT(d);
  struct dirent *e;
  char *found = NULL;
  while (!found && (e = readdir(d)))
    if (strstr(e->d_name, ".tensor.swp") && !strchr(e->d_name, '-'))
      if (asprintf(&found, "%s/%s", dir, e->d_name) < 0) abort();
  closedir(d);
  free(dir);
  ZT_ASSERT(found);
  return found;
}

static void refused(const char *cs, const char *copy, const char *file, const char *tmp, const char *tag) {
  char *out = NULL;
  if (asprintf(&out, "%s/%s-%s.safetensors", tmp, cs, tag) < 0) abort();
  zck_status s = zck_consolidate(copy, out, NULL);
  ZT_ASSERT(s != ZCK_OK);
  if (!strstr(zck_last_error(), file) || strchr(zck_last_error(), '\n'))
    ZT_FAIL("%s: %s: message does not name %s in one line: %s", cs, tag, file, zck_last_error());
  ZT_ASSERT(!exists(out));
  fprintf(stderr, "  %s: %s: %s\n", cs, tag, zck_last_error());
  zck_verify_report *r = NULL;
  ZT_ASSERT(zck_verify(copy, NULL, &r) != ZCK_OK);
  zck_verify_report_free(r);
  free(out);
}

static void check_case(const char *cs, const char *tmp) {
  char *ckpt = zt_ds_ckpt_path(cs), *fx = zt_fixture("deepspeed"), *out = NULL, *cmd = NULL, *lp = NULL;
  cJSON *e = zt_ds_expected(cs);
  const cJSON *live = get(e, "live_optim_states");
  if (asprintf(&lp, "%s/%s/live_fp32.safetensors", fx, cs) < 0) abort();

  /* the states of the swapped sub-groups: the live engine's */
  size_t swapped = check_states(cs, ckpt, live, true);

  /* consolidate == the live masters, bit for bit */
  if (asprintf(&out, "%s/%s.safetensors", tmp, cs) < 0) abort();
  ZT_OK(zck_consolidate(ckpt, out, NULL));
  {
    zck_hf_checkpoint *a = NULL, *b = NULL;
    ZT_OK(zck_hf_open(out, &a));
    ZT_OK(zck_hf_open(lp, &b));
    ZT_ASSERT(zck_hf_count(b) > 0);
    for (size_t i = 0; i < zck_hf_count(b); i++) {
      const zck_hf_tensor *y = zck_hf_tensor_at(b, i), *x = zck_hf_find(a, y->t->name);
      if (!x) ZT_FAIL("%s: %s missing from the consolidation", cs, y->t->name);
      ZT_EQ_U64(x->t->nbytes, y->t->nbytes);
      unsigned char *p = malloc(x->t->nbytes + 1), *q = malloc(y->t->nbytes + 1);
      ZT_OK(zck_st_read(x->file, x->t, p, 0, x->t->nbytes));
      ZT_OK(zck_st_read(y->file, y->t, q, 0, y->t->nbytes));
      if (memcmp(p, q, x->t->nbytes)) ZT_FAIL("%s: %s is not the live engine's fp32 master", cs, y->t->name);
      free(p);
      free(q);
    }
    zck_hf_close(a);
    zck_hf_close(b);
  }
  free(out);

  /* verify reads every swap file too */
  zck_verify_report *r = NULL;
  ZT_OK(zck_verify(ckpt, NULL, &r));
  ZT_ASSERT(r && r->result == ZCK_VERIFY_CLEAN);
  /* and says that their bytes carry no checksum */
  bool swap_note = false;
  for (size_t i = 0; i < r->n_findings; i++)
    swap_note = swap_note || (r->findings[i].severity == ZCK_VERIFY_NOTE && strstr(r->findings[i].message, "offloaded_tensors: NVMe swap files"));
  ZT_ASSERT(swap_note);
  zck_verify_report_free(r);

  /* reshard into plain ZeRO-2 files at W 3: the same states, no offloaded_tensors/ */
  char *rs = NULL;
  if (asprintf(&rs, "%s/%s-s2w3", tmp, cs) < 0) abort();
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_stage = 2;
  ro.to_world_size = 3;
  ZT_OK(zck_reshard(ckpt, rs, &ro));
  check_states(cs, rs, live, false);

  /* reshard to ZeRO-3 at another W keeps the NVMe layout (--to-offload keep): the sub-groups
   * DeepSpeed swaps there in offloaded_tensors/rankRR/, read back to the same states */
  char *rs3 = NULL;
  if (asprintf(&rs3, "%s/%s-s3nvme", tmp, cs) < 0) abort();
  zck_reshard_opts r3 = ZCK_RESHARD_OPTS_INIT;
  r3.to_stage = 3;
  r3.to_world_size = strstr(cs, "w1_") ? 2 : 1;
  ZT_OK(zck_reshard(ckpt, rs3, &r3));
  /* s3w1_bf16 swaps from 1 KiB: at W 2 no partition is that big, yet every rank's folder is
   * there (DeepSpeed's load copies it) */
  bool swaps3 = r3.to_world_size == 1;
  size_t swapped3 = check_states(cs, rs3, live, swaps3);
  for (uint32_t k = 0; k < r3.to_world_size; k++) {
    char *rd = NULL;
    if (asprintf(&rd, "%s/global_step2/offloaded_tensors/rank%02u", rs3, k) < 0) abort();
    if (!exists(rd)) ZT_FAIL("%s: no %s", cs, rd);
    free(rd);
  }
  /* the manifest covers the swap files zckpt wrote: verify checks their bytes */
  ZT_OK(zck_verify(rs3, NULL, &r));
  ZT_ASSERT(r && r->result == ZCK_VERIFY_CLEAN);
  for (size_t i = 0; i < r->n_findings; i++)
    if (strstr(r->findings[i].message, "without checksums")) ZT_FAIL("%s: %s", cs, r->findings[i].message);
  zck_verify_report_free(r);
  if (swaps3) {
    char *flip = NULL, *swp3 = NULL;
    if (asprintf(&flip, "%s-flip", rs3) < 0 || asprintf(&cmd, "cp -r '%s' '%s'", rs3, flip) < 0) abort();
    sh(cmd);
    free(cmd);
    swp3 = first_swap(flip);
    FILE *f = fopen(swp3, "r+b");
    ZT_ASSERT(f);
    int ch = fgetc(f);
    ZT_ASSERT(ch != EOF && fseek(f, 0, SEEK_SET) == 0 && fputc(ch ^ 0x10, f) != EOF && fclose(f) == 0);
    r = NULL;
    ZT_ASSERT(zck_verify(flip, NULL, &r) != ZCK_OK || (r && r->result != ZCK_VERIFY_CLEAN));
    bool named = false;
    for (size_t i = 0; r && i < r->n_findings; i++)
      named = named || (r->findings[i].severity != ZCK_VERIFY_NOTE && strstr(r->findings[i].message, strrchr(swp3, '/') + 1));
    if (!named) ZT_FAIL("%s: verify did not name the flipped swap file %s", cs, swp3);
    zck_verify_report_free(r);
    free(swp3);
    free(flip);
  }
  if (swaps3) {
    /* at W 3 embed.weight's partition (544 bytes) lies between the largest partition the source
     * kept (508) and the smallest it swapped (816), and the run lowered MIN_AIO_BYTES: whether
     * DeepSpeed swaps it is not known, so it is refused, unless --swap-min-bytes says */
    char *rs33 = NULL;
    if (asprintf(&rs33, "%s/%s-s3w3", tmp, cs) < 0) abort();
    zck_reshard_opts r33 = r3;
    r33.to_world_size = 3;
    ZT_ASSERT(zck_reshard(ckpt, rs33, &r33) == ZCK_ERR_UNSUPPORTED && !exists(rs33));
    if (!strstr(zck_last_error(), "--swap-min-bytes")) ZT_FAIL("%s: %s", cs, zck_last_error());
    r33.swap_min_bytes = 512;
    ZT_OK(zck_reshard(ckpt, rs33, &r33));
    check_states(cs, rs33, live, true);
    free(rs33);
  }
  /* --to-offload none: everything in the rank files */
  char *rs3n = NULL;
  if (asprintf(&rs3n, "%s/%s-s3plain", tmp, cs) < 0) abort();
  r3.to_offload = ZCK_RESHARD_OFFLOAD_NONE;
  ZT_OK(zck_reshard(ckpt, rs3n, &r3));
  check_states(cs, rs3n, live, false);
  /* --to-offload nvme at ZeRO-2 is refused before anything is written */
  char *rs2n = NULL;
  if (asprintf(&rs2n, "%s/%s-s2nvme", tmp, cs) < 0) abort();
  ro.to_offload = ZCK_RESHARD_OFFLOAD_NVME;
  ZT_ASSERT(zck_reshard(ckpt, rs2n, &ro) == ZCK_ERR_INVALID_ARG && !exists(rs2n));
  ro.to_offload = ZCK_RESHARD_OFFLOAD_KEEP;
  fprintf(stderr, "  %s: reshard to 3w%u: %zu swapped sub-group stores\n", cs, r3.to_world_size, swapped3);
  free(rs3);
  free(rs3n);
  free(rs2n);

  /* to-universal; its reshard is the direct reshard, byte for byte */
  char *uv = NULL, *rs_uv = NULL;
  /* (in a folder of its own: latest_universal goes beside it, and a reshard carries that
   * folder's other files over, as for an HF checkpoint-N/) */
  if (asprintf(&uv, "%s/%s-uvroot/uv", tmp, cs) < 0 || asprintf(&rs_uv, "%s/%s-uv-s2w3", tmp, cs) < 0) abort();
  if (asprintf(&cmd, "mkdir -p '%s/%s-uvroot'", tmp, cs) < 0) abort();
  sh(cmd);
  free(cmd);
  ZT_OK(zck_to_universal(ckpt, uv, NULL));
  ZT_OK(zck_reshard(uv, rs_uv, &ro));
  if (asprintf(&cmd, "diff -r -x zckpt-manifest.json '%s' '%s' >&2", rs, rs_uv) < 0) abort();
  sh(cmd);
  free(cmd);

  /* damage on a copy: a truncated swap file, then a missing one */
  char *copy = NULL;
  if (asprintf(&copy, "%s/%s-dmg", tmp, cs) < 0 || asprintf(&cmd, "cp -r '%s' '%s'", ckpt, copy) < 0) abort();
  sh(cmd);
  free(cmd);
  char *swp = first_swap(copy);
  struct stat sb;
  ZT_ASSERT(stat(swp, &sb) == 0 && sb.st_size > 8);
  if (truncate(swp, sb.st_size - 4) != 0) ZT_FAIL("truncate %s", swp);
  refused(cs, copy, swp, tmp, "truncated");
  ZT_ASSERT(unlink(swp) == 0);
  refused(cs, copy, swp, tmp, "missing");
  fprintf(stderr, "  %s: ok (%zu swapped sub-group stores)\n", cs, swapped);

  free(swp);
  free(copy);
  free(uv);
  free(rs_uv);
  free(rs);
  cJSON_Delete(e);
  free(lp);
  free(fx);
  free(ckpt);
}

int main(void) {
  size_t n;
  char **cases = zt_ds_cases(&n);
  char *tmp = zt_tmpdir();
  int done = 0;
  for (size_t i = 0; i < n; i++)
    if (strstr(cases[i], "_nvme")) {
      check_case(cases[i], tmp);
      done++;
    }
  zt_ds_free_cases(cases, n);
  free(tmp);
  if (!done) zt_skip("no NVMe-offload fixtures (tests/fixtures/deepspeed/*_nvme)");
  return 0;
}
