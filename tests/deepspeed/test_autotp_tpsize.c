/* test_autotp_tpsize.c: `reshard --to-tp-size T` at a TP size other than the source's, over
 * the real DeepSpeed 0.19.8 AutoTP checkpoints of tests/fixtures/autotp (TP 2, tied and untied
 * Llama heads, ZeRO 1/2/3) and their config.json (save_pretrained's).
 *   - TP 2 -> TP 1 (--to-tp-size 1) is the plain ZeRO reshard, file for file;
 *   - TP 2 -> TP 1 -> TP 2 (merge, then split by DeepSpeed's rules from config.json; the TP 1
 *     files carry no affine map, so the split is the Llama plan's) equals the reshard at the
 *     source's own TP size byte for byte, at the source's stage and dp size (whose files
 *     interop_autotp proves equal to DeepSpeed's own, object for object: so the split, the
 *     universal_checkpoint_info and its pickled sharing are DeepSpeed's) and at another;
 *   - TP 2 -> TP 4 -> TP 2 (the affine-map path both ways) with a config of 4 kv heads (the
 *     fixture's model has 2, with which TP 4 leaves ranks without attention rows: refused),
 *     bit for bit the source again; TP 4 consolidates to the live engine's fp32 masters;
 *   - refused with one line, nothing written: no config.json (the default place is the
 *     checkpoint folder; --model-config names another), a model_type zckpt does not know, a
 *     config whose split disagrees with the checkpoint's own record, a TP size that leaves a
 *     rank no rows, the Llama plan for a config saved by transformers older than 5.23. */
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

/* Every tensor of the safetensors file `out` equals the one of that name in `expected`. */
static void same_tensors(const char *cs, const char *out, const char *expected) {
  zck_hf_checkpoint *a = NULL, *b = NULL;
  ZT_OK(zck_hf_open(out, &a));
  ZT_OK(zck_hf_open(expected, &b));
  ZT_EQ_INT(zck_hf_count(a), zck_hf_count(b));
  for (size_t i = 0; i < zck_hf_count(a); i++) {
    const zck_hf_tensor *x = zck_hf_tensor_at(a, i), *y = zck_hf_find(b, x->t->name);
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
  ZT_EQ_INT(tp, 2);

  /* TP 1 is the plain reshard */
  snprintf(a, sizeof a, "%s/%s-tp1", tmp, cs);
  snprintf(b, sizeof b, "%s/%s-plain", tmp, cs);
  reshard(ckpt, a, 1, stage, dp, NULL);
  reshard(ckpt, b, 0, stage, dp, NULL);
  same_tree(cs, a, b);

  /* TP 2 -> 1 -> 2: the source's own files again (the reshard at its own TP size) */
  snprintf(b, sizeof b, "%s/%s-tp1-tp2", tmp, cs);
  snprintf(c, sizeof c, "%s/%s-tp2", tmp, cs);
  reshard(a, b, 2, stage, dp, cfg);
  reshard(ckpt, c, 2, stage, dp, NULL);
  same_tree(cs, b, c);
  /* ... and at another stage and dp size, from TP 1 or from TP 2 alike */
  int st2 = stage == 3 ? 1 : stage + 1, w2 = dp == 1 ? 2 : 1;
  snprintf(b, sizeof b, "%s/%s-tp1-tp2-s%dw%d", tmp, cs, st2, w2);
  snprintf(c, sizeof c, "%s/%s-tp2-s%dw%d", tmp, cs, st2, w2);
  reshard(a, b, 2, st2, w2, cfg);
  reshard(ckpt, c, 2, st2, w2, NULL);
  same_tree(cs, b, c);

  /* the default place of config.json: the checkpoint folder (HF's checkpoint-N/), carried along */
  snprintf(p, sizeof p, "%s/config.json", a);
  ZT_ASSERT(zt_copy_tree(cfg, p) == 0);
  snprintf(b, sizeof b, "%s/%s-tp1-tp2-default", tmp, cs);
  reshard(a, b, 2, stage, dp, NULL);
  snprintf(b, sizeof b, "%s/%s-tp1-tp2-default/global_step2", tmp, cs);
  snprintf(c, sizeof c, "%s/%s-tp2/global_step2", tmp, cs);
  same_tree(cs, b, c);
  snprintf(b, sizeof b, "%s/%s-tp1-tp2-default/config.json", tmp, cs);
  struct stat sb;
  ZT_ASSERT(stat(b, &sb) == 0);

  if (stage != 2) other_paths(cs, dir, ckpt, cfg, tmp, stage, dp);
  /* refusals */
  snprintf(b, sizeof b, "%s/%s-refused", tmp, cs);
  refused(cs, ckpt, b, 4, NULL, ZCK_ERR_NOT_FOUND, "config.json");          /* not in ckpt/ */
  refused(cs, ckpt, b, 4, cfg, ZCK_ERR_UNSUPPORTED, "leaves TP rank 2 none"); /* 2 kv heads at TP 4 */
  snprintf(c, sizeof c, "%s/%s-tp1", tmp, cs);
  refused(cs, c, b, 4, cfg, ZCK_ERR_UNSUPPORTED, "leaves TP rank 2 none");
  snprintf(p, sizeof p, "%s/%s-gpt2.json", tmp, cs);
  edited_config(cfg, p, "\"model_type\"", "\"gpt2\"");
  refused(cs, ckpt, b, 4, p, ZCK_ERR_UNSUPPORTED, "model_type 'gpt2'");
  snprintf(p, sizeof p, "%s/%s-kv1.json", tmp, cs);
  edited_config(cfg, p, "\"num_key_value_heads\"", "1");
  refused(cs, ckpt, b, 4, p, ZCK_ERR_MISMATCH, "does not describe this checkpoint");
  /* the Llama plan (no affine map in the source) is transformers'; known for 5.23 on */
  snprintf(p, sizeof p, "%s/%s-tf4.json", tmp, cs);
  edited_config(cfg, p, "\"transformers_version\"", "\"4.57.1\"");
  refused(cs, c, b, 2, p, ZCK_ERR_UNSUPPORTED, "transformers_version 4.57.1");
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
