/* test_consolidate_fixtures.c: zckpt consolidate equals DeepSpeed's own zero_to_fp32,
 * bit for bit, on every real checkpoint in tests/fixtures/deepspeed/<case>/ (made by
 * DeepSpeed itself: see tests/fixtures/gen/make_deepspeed_fixtures.py). Each case holds
 * DeepSpeed's result in expected_fp32.safetensors and its key order and tied aliases in
 * expected.json. Also checks --keep-tied, --dtype bf16 (torch's RNE), --exclude-frozen,
 * HF sharding and pytorch_model.bin output on the same cases. */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "safetensors/safetensors.h"
#include "sha256.h"
#include "test.h"

static unsigned char *tensor_bytes(const zck_hf_checkpoint *c, const zck_hf_tensor *t) {
  unsigned char *b = malloc(t->t->nbytes ? t->t->nbytes : 1);
  ZT_OK(zck_st_read(t->file, t->t, b, 0, t->t->nbytes));
  (void)c;
  return b;
}

static cJSON *load_json(const char *path) {
  unsigned char *data;
  size_t n;
  if (zt_read_file(path, &data, &n) != 0) ZT_FAIL("cannot read %s", path);
  data[n] = 0;
  cJSON *j = cJSON_Parse((char *)data);
  free(data);
  if (!j) ZT_FAIL("bad JSON in %s", path);
  return j;
}

/* Compares our output with DeepSpeed's; dtype_cast: expected fp32 values cast to it. */
static void compare(const char *case_name, const char *ours_path, const char *expected_path, cJSON *z2f,
                    bool keep_tied, zck_dtype cast, bool exclude_frozen, cJSON *frozen_names) {
  zck_hf_checkpoint *ours = NULL, *exp = NULL;
  ZT_OK(zck_hf_open(ours_path, &ours));
  ZT_OK(zck_hf_open(expected_path, &exp));
  cJSON *tied = cJSON_GetObjectItem(z2f, "tied");
  cJSON *order = cJSON_GetObjectItem(z2f, "key_order");
  size_t expected_count = 0;
  cJSON *name;
  cJSON_ArrayForEach(name, order) {
    const char *n = name->valuestring;
    bool is_alias = tied && cJSON_GetObjectItem(tied, n);
    bool is_frozen = false;
    cJSON *f;
    cJSON_ArrayForEach(f, frozen_names) if (!strcmp(f->valuestring, n)) is_frozen = true;
    const char *src_name = is_alias ? cJSON_GetObjectItem(tied, n)->valuestring : n;
    if (exclude_frozen && is_frozen) {
      if (zck_hf_find(ours, n)) ZT_FAIL("%s: frozen %s written despite --exclude-frozen", case_name, n);
      continue;
    }
    if (is_alias && !keep_tied) {
      if (zck_hf_find(ours, n)) ZT_FAIL("%s: tied alias %s written twice", case_name, n);
      continue;
    }
    const zck_hf_tensor *a = zck_hf_find(ours, n);
    const zck_hf_tensor *b = zck_hf_find(exp, src_name);
    if (!a) ZT_FAIL("%s: %s missing from our output", case_name, n);
    if (!b) ZT_FAIL("%s: %s missing from DeepSpeed's output", case_name, src_name);
    expected_count++;
    ZT_EQ_INT(a->t->ndim, b->t->ndim);
    for (int d = 0; d < a->t->ndim; d++) ZT_EQ_U64(a->t->shape[d], b->t->shape[d]);
    zck_dtype want = b->t->dtype;
    bool floating = want == ZCK_F32 || want == ZCK_BF16 || want == ZCK_F16;
    if (cast && floating) want = cast;
    if (a->t->dtype != want)
      ZT_FAIL("%s: %s: dtype %s, expected %s", case_name, n, zck_dtype_name(a->t->dtype), zck_dtype_name(want));
    unsigned char *x = tensor_bytes(ours, a), *y = tensor_bytes(exp, b);
    if (want != b->t->dtype) {
      unsigned char *z = malloc(a->t->nbytes ? a->t->nbytes : 1);
      ZT_OK(zck_convert(want, z, b->t->dtype, y, b->t->numel));
      free(y);
      y = z;
    }
    if (memcmp(x, y, a->t->nbytes)) ZT_FAIL("%s: %s: values differ from DeepSpeed's zero_to_fp32", case_name, n);
    free(x);
    free(y);
  }
  if (zck_hf_count(ours) != expected_count)
    ZT_FAIL("%s: %zu tensors written, expected %zu", case_name, zck_hf_count(ours), expected_count);
  zck_hf_close(ours);
  zck_hf_close(exp);
}

/* Where zero_to_fp32 cannot read the checkpoint (BF16_Optimizer files, ZeRO-0), the fp32
 * masters must be those DeepSpeed's live engine held (safe_get_full_fp32_param, for ZeRO-0
 * FP16_UnfusedOptimizer's fp32_groups or the fp32 params themselves, in expected.json's
 * live_fp32_params), and the buffers must be there. ZeRO-0 output is the whole model: its
 * frozen params too, as the engine's 16-bit module holds them (lp_state_dict). */
static void compare_live(const char *case_name, const char *ours_path, cJSON *j) {
  zck_hf_checkpoint *ours = NULL;
  ZT_OK(zck_hf_open(ours_path, &ours));
  cJSON *live = cJSON_GetObjectItem(j, "live_fp32_params"), *it;
  size_t n = 0;
  cJSON_ArrayForEach(it, live) {
    const zck_hf_tensor *a = zck_hf_find(ours, it->string);
    if (!a) ZT_FAIL("%s: %s missing from our output", case_name, it->string);
    ZT_EQ_INT(a->t->dtype, ZCK_F32);
    unsigned char *x = tensor_bytes(ours, a);
    char hex[65];
    zt_sha256_hex(x, a->t->nbytes, hex);
    free(x);
    if (strcmp(hex, cJSON_GetObjectItem(it, "sha256")->valuestring))
      ZT_FAIL("%s: %s differs from the live engine's fp32 master", case_name, it->string);
    n++;
  }
  cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "buffer_names")) {
    if (!zck_hf_find(ours, it->valuestring)) ZT_FAIL("%s: buffer %s missing", case_name, it->valuestring);
    n++;
  }
  /* ZeRO-0 and NVMe offload (no zero_to_fp32 to compare with): frozen params = the engine's module */
  if (cJSON_GetObjectItem(j, "stage")->valueint == 0 || cJSON_GetObjectItem(j, "live_optim_states")) {
    cJSON *lp = cJSON_GetObjectItem(cJSON_GetObjectItem(j, "lp_state_dict"), "tensors");
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(j, "frozen")) {
      const zck_hf_tensor *a = zck_hf_find(ours, it->valuestring);
      if (!a) ZT_FAIL("%s: frozen %s missing from our output", case_name, it->valuestring);
      unsigned char *x = tensor_bytes(ours, a);
      char hex[65];
      zt_sha256_hex(x, a->t->nbytes, hex);
      free(x);
      if (strcmp(hex, cJSON_GetObjectItem(cJSON_GetObjectItem(lp, it->valuestring), "sha256")->valuestring))
        ZT_FAIL("%s: frozen %s differs from the engine's module", case_name, it->valuestring);
      n++;
    }
  }
  if (zck_hf_count(ours) != n) ZT_FAIL("%s: %zu tensors written, expected %zu", case_name, zck_hf_count(ours), n);
  zck_hf_close(ours);
}

int main(void) {
  char *root = zt_fixture("deepspeed");
  DIR *d = opendir(root);
  if (!d) zt_skip("no DeepSpeed fixtures");
  char *tmp = zt_tmpdir();
  struct dirent *e;
  int cases = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char path[4096], ckpt[4096], expected[4096], out[4096];
    snprintf(path, sizeof path, "%s/%s/expected.json", root, e->d_name);
    struct stat st;
    if (stat(path, &st) != 0) continue;
    cJSON *j = load_json(path);
    cJSON *z2f = cJSON_GetObjectItem(j, "zero_to_fp32");
    cJSON *err = cJSON_GetObjectItem(z2f, "error");
    snprintf(ckpt, sizeof ckpt, "%s/%s/ckpt", root, e->d_name);
    snprintf(expected, sizeof expected, "%s/%s/expected_fp32.safetensors", root, e->d_name);
    if (err && cJSON_IsString(err)) {
      /* zero_to_fp32 itself fails on this case (BF16_Optimizer files, ZeRO-0): compare
       * with the live engine instead */
      snprintf(out, sizeof out, "%s/%s-live", tmp, e->d_name);
      ZT_OK(zck_consolidate(ckpt, out, NULL));
      compare_live(e->d_name, out, j);
      fprintf(stderr, "%s: DeepSpeed's zero_to_fp32 fails (%.60s...); zckpt equals the live engine\n", e->d_name,
              err->valuestring);
      cJSON_Delete(j);
      cases++;
      continue;
    }
    cJSON *frozen = cJSON_GetObjectItem(j, "frozen");
    /* default: zero_to_fp32's exact result */
    snprintf(out, sizeof out, "%s/%s", tmp, e->d_name);
    zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
    o.threads = 2;
    ZT_OK(zck_consolidate(ckpt, out, &o));
    compare(e->d_name, out, expected, z2f, false, ZCK_DTYPE_INVALID, false, frozen);
    /* --keep-tied, --dtype bf16, sharded at 1 KB, with pytorch_model.bin too */
    snprintf(out, sizeof out, "%s/%s-bf16", tmp, e->d_name);
    o.keep_tied = 1;
    o.dtype = ZCK_BF16;
    o.max_shard_size = 1000;
    o.torch_bin = 1;
    ZT_OK(zck_consolidate(ckpt, out, &o));
    compare(e->d_name, out, expected, z2f, true, ZCK_BF16, false, frozen);
    snprintf(path, sizeof path, "%s/pytorch_model.bin", out);
    ZT_ASSERT(stat(path, &st) == 0);
    /* --exclude-frozen into one .safetensors file */
    snprintf(out, sizeof out, "%s/%s-nofrozen.safetensors", tmp, e->d_name);
    zck_consolidate_opts o2 = ZCK_CONSOLIDATE_OPTS_INIT;
    o2.exclude_frozen = 1;
    ZT_OK(zck_consolidate(ckpt, out, &o2));
    compare(e->d_name, out, expected, z2f, false, ZCK_DTYPE_INVALID, true, frozen);
    cJSON_Delete(j);
    cases++;
  }
  closedir(d);
  printf("%d DeepSpeed cases equal to zero_to_fp32\n", cases);
  if (cases == 0) zt_skip("no comparable DeepSpeed fixtures");
  free(root);
  free(tmp);
  return 0;
}
