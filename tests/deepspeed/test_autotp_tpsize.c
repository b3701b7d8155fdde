/* test_autotp_tpsize.c: `reshard --to-tp-size T` at a TP size other than the source's, over
 * the real DeepSpeed 0.19.8 AutoTP checkpoints of tests/fixtures/autotp (TP 2, tied and untied
 * Llama heads, ZeRO 1/2/3) and their config.json (save_pretrained's).
 *   - TP 2 -> TP 1 (--to-tp-size 1) is the plain ZeRO reshard, file for file;
 *   - TP 2 -> TP 1 -> TP 2 (merge, then split by DeepSpeed's rules from config.json; the TP 1
 *     files carry no affine map, so the split is the Llama plan's) equals the reshard at the
 *     source's own TP size byte for byte, at the source's stage and dp size (whose files
 *     interop_autotp proves equal to DeepSpeed's own, object for object: so the split, the
 *     universal_checkpoint_info and its pickled sharing are DeepSpeed's) and at another;
 *   - TP 2 -> TP 4 -> TP 2 (the affine-map path both ways) with a config of 4 kv heads,
 *     bit for bit the source again; TP 4 consolidates to the live engine's fp32 masters;
 *   - every fixture (TP 4 over 2 kv heads, mistral, qwen2 with tp_grain_size 8 too) at another
 *     TP size by its affine map and its own config.json (TP 2 <-> 4: the 2 kv heads leave TP
 *     ranks 2 and 3 empty attention shards, saved as frozen there), and back: the source's
 *     files again, byte for byte; from TP 1 by the Llama plan alike; consolidate = the live
 *     engine's masters (and frozen params);
 *   - refused with one line, nothing written: no config.json (the default place is the
 *     checkpoint folder; --model-config names another), a model_type zckpt does not know, a
 *     config whose split disagrees with the checkpoint's own record, the Llama plan for
 *     another model type or a config saved by transformers older than 5.23. */
#include "ds_test_util.h"
#include "safetensors/safetensors.h"
#include "zck.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void same_tree(const char *cs, const char *a, const char *b) {
  DIR *d = opendir(a);
  if (!d) ZT_FAIL("%s: cannot list %s", cs, a);
  struct dirent *de;
  int n_a = 0, n_b = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char pa[4400], pb[4400];
    struct stat st;
    snprintf(pa, sizeof pa, "%s/%s", a, de->d_name);
    snprintf(pb, sizeof pb, "%s/%s", b, de->d_name);
    n_a++;
    if (stat(pa, &st) == 0 && S_ISDIR(st.st_mode)) {
      same_tree(cs, pa, pb);
      continue;
    }
    unsigned char *x, *y;
    size_t nx, ny;
    if (zt_read_file(pa, &x, &nx) != 0) ZT_FAIL("%s: read %s", cs, pa);
    if (zt_read_file(pb, &y, &ny) != 0) ZT_FAIL("%s: %s has no counterpart %s", cs, pa, pb);
    if (nx != ny || memcmp(x, y, nx)) ZT_FAIL("%s: %s differs from %s", cs, pa, pb);
    free(x);
    free(y);
  }
  closedir(d);
  if (!(d = opendir(b))) ZT_FAIL("%s: cannot list %s", cs, b);
  while ((de = readdir(d))) n_b += de->d_name[0] != '.';
  closedir(d);
  ZT_EQ_INT(n_a, n_b);
}

/* Every tensor of the safetensors file `out` equals the one of that name in `expected`, or
 * in `frozen` (the frozen params' full values; NULL: none), and `out` has all of them. */
static void same_tensors2(const char *cs, const char *out, const char *expected, const char *frozen) {
  zck_hf_checkpoint *a = NULL, *b = NULL, *f = NULL;
  ZT_OK(zck_hf_open(out, &a));
  ZT_OK(zck_hf_open(expected, &b));
  if (frozen) ZT_OK(zck_hf_open(frozen, &f));
  ZT_EQ_INT(zck_hf_count(a), zck_hf_count(b) + (f ? zck_hf_count(f) : 0));
  for (size_t i = 0; i < zck_hf_count(a); i++) {
    const zck_hf_tensor *x = zck_hf_tensor_at(a, i), *y = zck_hf_find(b, x->t->name);
    if (!y && f) y = zck_hf_find(f, x->t->name);
    if (!y || x->t->nbytes != y->t->nbytes) ZT_FAIL("%s: %s: %s missing or another size", cs, out, x->t->name);
    unsigned char *p = malloc(x->t->nbytes + 1), *q = malloc(y->t->nbytes + 1);
    ZT_OK(zck_st_read(x->file, x->t, p, 0, x->t->nbytes));
    ZT_OK(zck_st_read(y->file, y->t, q, 0, y->t->nbytes));
    if (memcmp(p, q, x->t->nbytes)) ZT_FAIL("%s: %s differs from %s", cs, x->t->name, expected);
    free(p);
    free(q);
  }
  zck_hf_close(a);
  zck_hf_close(b);
  zck_hf_close(f);
}

static void same_tensors(const char *cs, const char *out, const char *expected) {
  same_tensors2(cs, out, expected, NULL);
}

static void reshard(const char *src, const char *out, uint32_t tp, int stage, int world, const char *config) {
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_tp_size = tp;
  ro.to_stage = stage;
  ro.to_world_size = (uint32_t)world;
  ro.model_config = config;
  if (zck_reshard(src, out, &ro) != ZCK_OK) ZT_FAIL("reshard %s -> %s (TP %u): %s", src, out, tp, zck_last_error());
}

/* Refused with status `want`, one line holding `needle`, nothing at out. */
static void refused(const char *cs, const char *src, const char *out, uint32_t tp, const char *config, zck_status want,
                    const char *needle) {
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_tp_size = tp;
  ro.model_config = config;
  zck_status s = zck_reshard(src, out, &ro);
  const char *e = zck_last_error();
  if (s != want || !strstr(e, needle) || strchr(e, '\n'))
    ZT_FAIL("%s: TP %u with %s: status %d (want %d), '%s' (want one line with '%s')", cs, tp, config ? config : "-",
            (int)s, (int)want, e, needle);
  struct stat sb;
  ZT_ASSERT(stat(out, &sb) != 0);
}

/* config.json with `key`'s value replaced by `value` (text substitution of the fixture's). */
static void edited_config(const char *from, const char *to, const char *key, const char *value) {
  unsigned char *t;
  size_t n;
  if (zt_read_file(from, &t, &n) != 0) ZT_FAIL("read %s", from);
  t[n] = 0;
  char *k = strstr((char *)t, key), out[8192];
  if (!k || n > 4000) ZT_FAIL("%s: no %s", from, key);
  char *colon = strchr(k, ':'), *end = strpbrk(colon, ",\n}");
  int m = snprintf(out, sizeof out, "%.*s: %s%s", (int)(colon - (char *)t), (char *)t, value, end);
  ZT_ASSERT(zt_write_file(to, out, (size_t)m) == 0);
  free(t);
}

/* From the HDF5 container and the universal folder, and TP 2 -> 4 -> 2 (ZeRO-2 files are
 * ZeRO-1's format: these heavier paths run for the other cases). */
static void other_paths(const char *cs, const char *dir, const char *ckpt, const char *cfg, const char *tmp, int stage,
                        int dp) {
  char p[4300], a[4400], b[4400], c[4400];
  /* the HDF5 container (no affine map: the Llama plan) of a checkpoint-N/ folder holding
   * config.json, which the container keeps in /side_files: the source's own files again */
  char h5[4400];
  snprintf(h5, sizeof h5, "%s/%s-hfroot", tmp, cs);
  ZT_ASSERT(zt_copy_tree(ckpt, h5) == 0);
  snprintf(p, sizeof p, "%s/config.json", h5);
  ZT_ASSERT(zt_copy_tree(cfg, p) == 0);
  snprintf(b, sizeof b, "%s/%s-container.h5", tmp, cs);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(h5, b, &uo));
  snprintf(h5, sizeof h5, "%s/%s-container-tp2", tmp, cs);
  reshard(b, h5, 2, stage, dp, NULL);
  snprintf(h5, sizeof h5, "%s/%s-container-tp2/global_step2", tmp, cs);
  snprintf(c, sizeof c, "%s/%s-tp2/global_step2", tmp, cs);
  same_tree(cs, h5, c);

  /* TP 2 -> 4 -> 2 by the affine maps, with a model of 4 kv heads */
  char kv4[4300], fp32[4300], st[4500];
  snprintf(kv4, sizeof kv4, "%s/%s-kv4.json", tmp, cs);
  edited_config(cfg, kv4, "\"num_key_value_heads\"", "4");
  snprintf(a, sizeof a, "%s/%s-tp4", tmp, cs);
  reshard(ckpt, a, 4, stage, dp, kv4);
  zck_ds_ckpt *ck = NULL;
  ZT_OK(zck_ds_open(a, NULL, &ck));
  ZT_EQ_INT(zck_ds_info_of(ck)->tp_size, 4);
  zck_ds_close(ck);
  snprintf(st, sizeof st, "%s.safetensors", a);
  snprintf(fp32, sizeof fp32, "%s/expected_fp32.safetensors", dir);
  ZT_OK(zck_consolidate(a, st, NULL));
  same_tensors(cs, st, fp32);
  zck_verify_report *r = NULL;
  ZT_OK(zck_verify(a, NULL, &r));
  ZT_EQ_INT(r->result, ZCK_VERIFY_CLEAN);
  zck_verify_report_free(r);
  /* from the universal folder (its carried affine map) alike */
  char u[4400];
  snprintf(u, sizeof u, "%s/%s-uroot", tmp, cs);
  ZT_ASSERT(mkdir(u, 0755) == 0);
  snprintf(u, sizeof u, "%s/%s-uroot/global_step2_universal", tmp, cs);
  ZT_OK(zck_to_universal(ckpt, u, NULL));
  snprintf(b, sizeof b, "%s/%s-universal-tp4", tmp, cs);
  reshard(u, b, 4, stage, dp, kv4);
  same_tree(cs, b, a);
  snprintf(b, sizeof b, "%s/%s-tp4-tp2", tmp, cs);
  snprintf(c, sizeof c, "%s/%s-tp2", tmp, cs);
  reshard(a, b, 2, stage, dp, kv4);
  same_tree(cs, b, c);
}

static void check_case(const char *root, const char *cs, const char *tmp) {
  char dir[4096], ckpt[4200], cfg[4200], p[4300], a[4400], b[4400], c[4400];
  snprintf(dir, sizeof dir, "%s/%s", root, cs);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  snprintf(cfg, sizeof cfg, "%s/config.json", dir);
  snprintf(p, sizeof p, "%s/expected.json", dir);
  unsigned char *text;
  size_t n;
  if (zt_read_file(p, &text, &n) != 0) ZT_FAIL("read %s", p);
  text[n] = 0;
  cJSON *e = cJSON_Parse((char *)text);
  free(text);
  int tp = cJSON_GetObjectItem(e, "tp_size")->valueint, dp = cJSON_GetObjectItem(e, "dp_size")->valueint;
  int stage = cJSON_GetObjectItem(e, "stage")->valueint;
  const cJSON *mt = cJSON_GetObjectItem(e, "model_type");
  /* the Llama plan (a source without an affine map) is for model_type llama only */
  int llama = !mt || !strcmp(mt->valuestring, "llama");
  uint32_t other = tp == 2 ? 4 : 2;  /* another TP size: with the fixtures' 2 kv heads, TP 4 leaves ranks 2, 3 none */

  /* TP 1 is the plain reshard */
  snprintf(a, sizeof a, "%s/%s-tp1", tmp, cs);
  snprintf(b, sizeof b, "%s/%s-plain", tmp, cs);
  reshard(ckpt, a, 1, stage, dp, NULL);
  reshard(ckpt, b, 0, stage, dp, NULL);
  same_tree(cs, a, b);

  /* the reshard at the source's own TP size (at its stage and dp size: DeepSpeed's files, interop_autotp) */
  snprintf(c, sizeof c, "%s/%s-tp%d", tmp, cs, tp);
  reshard(ckpt, c, (uint32_t)tp, stage, dp, NULL);
  int st2 = stage == 3 ? 1 : stage + 1, w2 = dp == 1 ? 2 : 1;
  struct stat sb;
  if (llama) {
    /* TP T -> 1 -> T: the source's own files again */
    snprintf(b, sizeof b, "%s/%s-tp1-tp%d", tmp, cs, tp);
    reshard(a, b, (uint32_t)tp, stage, dp, cfg);
    same_tree(cs, b, c);
    /* ... and at another stage and dp size, from TP 1 or from TP T alike */
    snprintf(b, sizeof b, "%s/%s-tp1-tp%d-s%dw%d", tmp, cs, tp, st2, w2);
    snprintf(p, sizeof p, "%s/%s-tp%d-s%dw%d", tmp, cs, tp, st2, w2);
    reshard(a, b, (uint32_t)tp, st2, w2, cfg);
    reshard(ckpt, p, (uint32_t)tp, st2, w2, NULL);
    same_tree(cs, b, p);

    /* the default place of config.json: the checkpoint folder (HF's checkpoint-N/), carried along */
    snprintf(p, sizeof p, "%s/config.json", a);
    ZT_ASSERT(zt_copy_tree(cfg, p) == 0);
    snprintf(b, sizeof b, "%s/%s-tp1-tp%d-default", tmp, cs, tp);
    reshard(a, b, (uint32_t)tp, stage, dp, NULL);
    snprintf(b, sizeof b, "%s/%s-tp1-tp%d-default/global_step2", tmp, cs, tp);
    snprintf(p, sizeof p, "%s/global_step2", c);
    same_tree(cs, b, p);
    snprintf(b, sizeof b, "%s/%s-tp1-tp%d-default/config.json", tmp, cs, tp);
    ZT_ASSERT(stat(b, &sb) == 0);
  } else {
    /* without an affine map (TP 1 files) the split of another model type is unknown */
    snprintf(b, sizeof b, "%s/%s-refused", tmp, cs);
    refused(cs, a, b, (uint32_t)tp, cfg, ZCK_ERR_UNSUPPORTED, "model_type");
  }

  /* another TP size by the affine map: with the fixtures' 2 kv heads TP 4 gives ranks 2 and 3
   * empty attention shards (and the grain-8 MLP of 24 rows none on rank 3), saved as frozen
   * zero-element params there, as DeepSpeed does (interop_autotp: DeepSpeed loads them);
   * back to the source's TP size it is the source again, byte for byte; its consolidate is the
   * live engine's masters */
  snprintf(b, sizeof b, "%s/%s-map-tp%u", tmp, cs, other);
  reshard(ckpt, b, other, stage, dp, cfg);
  {
    zck_ds_ckpt *ck = NULL;
    ZT_OK(zck_ds_open(b, NULL, &ck));
    ZT_EQ_INT(zck_ds_info_of(ck)->tp_size, other);
    zck_ds_close(ck);
    char st[4500], fp32[4300], fz[4300];
    snprintf(st, sizeof st, "%s.safetensors", b);
    snprintf(fp32, sizeof fp32, "%s/expected_fp32.safetensors", dir);
    snprintf(fz, sizeof fz, "%s/expected_frozen.safetensors", dir);
    ZT_OK(zck_consolidate(b, st, NULL));
    /* frozen params where zero_to_fp32 gives them (frozen_param_fragments: ZeRO-2/3) */
    same_tensors2(cs, st, fp32, stage >= 2 && stat(fz, &sb) == 0 ? fz : NULL);
    zck_verify_report *r = NULL;
    ZT_OK(zck_verify(b, NULL, &r));
    ZT_EQ_INT(r->result, ZCK_VERIFY_CLEAN);
    zck_verify_report_free(r);
  }
  snprintf(p, sizeof p, "%s/%s-map-tp%u-tp%d", tmp, cs, other, tp);
  reshard(b, p, (uint32_t)tp, stage, dp, cfg);
  same_tree(cs, p, c);
  if (llama) {  /* from TP 1 by the Llama plan: the same files (TP 1's folder now carries config.json) */
    char q[4500];
    snprintf(p, sizeof p, "%s/%s-tp1-map-tp%u", tmp, cs, other);
    reshard(a, p, other, stage, dp, cfg);
    snprintf(p, sizeof p, "%s/%s-tp1-map-tp%u/global_step2", tmp, cs, other);
    snprintf(q, sizeof q, "%s/global_step2", b);
    same_tree(cs, p, q);
  }

  if (llama && tp == 2 && stage != 2) other_paths(cs, dir, ckpt, cfg, tmp, stage, dp);
  /* refusals */
  snprintf(b, sizeof b, "%s/%s-refused", tmp, cs);
  refused(cs, ckpt, b, other, NULL, ZCK_ERR_NOT_FOUND, "config.json");          /* not in ckpt/ */
  snprintf(c, sizeof c, "%s/%s-tp1", tmp, cs);
  snprintf(p, sizeof p, "%s/%s-gpt2.json", tmp, cs);
  edited_config(cfg, p, "\"model_type\"", "\"gpt2\"");
  refused(cs, ckpt, b, other, p, ZCK_ERR_UNSUPPORTED, "model_type 'gpt2'");
  snprintf(p, sizeof p, "%s/%s-kv1.json", tmp, cs);
  edited_config(cfg, p, "\"num_key_value_heads\"", "1");
  refused(cs, ckpt, b, other, p, ZCK_ERR_MISMATCH, "does not describe this checkpoint");
  /* the Llama plan (no affine map in the source) is transformers'; known for 5.23 on */
  snprintf(p, sizeof p, "%s/%s-tf4.json", tmp, cs);
  edited_config(cfg, p, "\"transformers_version\"", "\"4.57.1\"");
  if (llama) refused(cs, c, b, 2, p, ZCK_ERR_UNSUPPORTED, "transformers_version 4.57.1");
  fprintf(stderr, "  %s: ok\n", cs);
  cJSON_Delete(e);
}

int main(void) {
  char *root = zt_fixture("autotp");
  DIR *d = opendir(root);
  if (!d) zt_skip("no AutoTP fixtures");
  char *tmp = zt_tmpdir();
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s/config.json", root, e->d_name);
    if (stat(p, &st) != 0) continue;
    check_case(root, e->d_name, tmp);
    n++;
  }
  closedir(d);
  ZT_ASSERT(n > 0);
  free(root);
  free(tmp);
  return 0;
}
