/* test_hf_peft.c: checkpoints saved by the real HF Trainer + PEFT (LoRA) + DeepSpeed
 * (tests/fixtures/hf_peft/<case>/, made by tests/fixtures/gen/make_hf_peft_fixtures.py),
 * stages 2 and 3, with and without a tied head. The Trainer saves them with
 * exclude_frozen_parameters, so only the LoRA tensors are in the files and, with a tied
 * head, shared_params names a source (transformer.wte.weight) that was never saved.
 *   - open: the unsaved alias is no parameter, listed by zck_ds_unsaved_tie;
 *   - consolidate equals DeepSpeed's zero_to_fp32 bit for bit (keys, order, dtypes,
 *     values) and records the unsaved alias in the metadata;
 *   - to-universal writes what ds_to_universal.py wrote (sha256 of every tensor file);
 *   - reshard to other stages and world sizes keeps the values (consolidated again), the
 *     alias in shared_params and frozen_param_shapes None;
 *   - verify calls the checkpoint clean. */
#include "ds_test_util.h"
#include "safetensors/safetensors.h"
#include "sha256.h"
#include "zck.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const cJSON *get(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  if (!v) ZT_FAIL("expected.json lacks '%s'", k);
  return v;
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

/* out equals zero_to_fp32's expected_fp32.safetensors: same keys in order, dtypes, bytes. */
static void same_as_zero_to_fp32(const char *cs, const char *out, const char *expected, const cJSON *order, int tied) {
  zck_hf_checkpoint *a = NULL, *b = NULL;
  ZT_OK(zck_hf_open(out, &a));
  ZT_OK(zck_hf_open(expected, &b));
  ZT_EQ_INT(zck_hf_count(a), cJSON_GetArraySize(order));
  const cJSON *it;
  cJSON_ArrayForEach(it, order) {
    const zck_hf_tensor *x = zck_hf_find(a, it->valuestring), *y = zck_hf_find(b, it->valuestring);
    if (!x || !y) ZT_FAIL("%s: %s missing", cs, it->valuestring);
    ZT_EQ_INT(x->t->dtype, y->t->dtype);
    ZT_EQ_U64(x->t->nbytes, y->t->nbytes);
    unsigned char *p = malloc(x->t->nbytes + 1), *q = malloc(y->t->nbytes + 1);
    ZT_OK(zck_st_read(x->file, x->t, p, 0, x->t->nbytes));
    ZT_OK(zck_st_read(y->file, y->t, q, 0, y->t->nbytes));
    if (memcmp(p, q, x->t->nbytes)) ZT_FAIL("%s: %s differs from zero_to_fp32's", cs, it->valuestring);
    free(p);
    free(q);
  }
  const zck_hf_tensor *first = zck_hf_find(a, cJSON_GetArrayItem(order, 0)->valuestring);
  const char *meta = zck_st_metadata_get(first->file, "tied_to_unsaved");
  if (tied != (meta != NULL)) ZT_FAIL("%s: tied_to_unsaved metadata %s", cs, meta ? meta : "missing");
  if (meta) ZT_ASSERT(strstr(meta, "\"base_model.model.lm_head.weight\":\"base_model.model.transformer.wte.weight\""));
  zck_hf_close(a);
  zck_hf_close(b);
}

/* Every zero/<param>/<state>.pt tensor of our universal folder has ds_to_universal's sha256. */
static void same_as_ds_to_universal(const char *cs, const char *udir, const cJSON *files) {
  const cJSON *it;
  size_t n = 0;
  cJSON_ArrayForEach(it, files) {
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", udir, it->string);
    zck_torch_file *tf = NULL;
    if (zck_torch_open(p, NULL, &tf) != ZCK_OK) ZT_FAIL("%s: %s: %s", cs, it->string, zck_last_error());
    const zck_pk *root = zck_torch_root(tf), *node = root;
    if (root->kind == ZCK_PK_DICT) node = zck_pk_dict_get(root, "param");
    const zck_torch_tensor *t = node ? zck_torch_tensor_of(tf, node) : NULL;
    if (!t) ZT_FAIL("%s: %s holds no tensor", cs, it->string);
    uint64_t numel = zck_torch_tensor_numel(t);
    size_t nb = (size_t)(numel * zck_dtype_size(t->dtype));
    unsigned char *buf = malloc(nb + 1);
    ZT_OK(zck_torch_tensor_read(tf, t, buf, 0, numel));
    char hex[65];
    zt_sha256_hex(buf, nb, hex);
    free(buf);
    ZT_EQ_STR(zck_dtype_name(t->dtype), get(it, "dtype")->valuestring);
    if (strcmp(hex, get(it, "sha256")->valuestring)) ZT_FAIL("%s: %s differs from ds_to_universal's", cs, it->string);
    zck_torch_close(tf);
    n++;
  }
  /* and nothing more: count our zero/<param>/<state>.pt files */
  char z[4096];
  snprintf(z, sizeof z, "%s/zero", udir);
  DIR *d = opendir(z);
  ZT_ASSERT(d);
  size_t ours = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/%s", z, e->d_name);
    DIR *s = opendir(sub);
    if (!s) continue;  /* optimizer_state.pt */
    struct dirent *f;
    while ((f = readdir(s))) ours += f->d_name[0] != '.';
    closedir(s);
  }
  closedir(d);
  ZT_EQ_U64(ours, n);
}

static void check_case(const char *root, const char *cs, const char *tmp) {
  char dir[4096], ckpt[4096], expected[4096], out[4096];
  snprintf(dir, sizeof dir, "%s/%s", root, cs);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  snprintf(expected, sizeof expected, "%s/expected_fp32.safetensors", dir);
  snprintf(out, sizeof out, "%s/expected.json", dir);
  cJSON *e = load_json(out);
  int tied = cJSON_IsTrue(get(e, "tied_head"));
  const cJSON *order = get(get(e, "zero_to_fp32"), "key_order");

  /* open: every trainable LoRA tensor, no frozen params, the alias listed apart */
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(ckpt, NULL, &c));
  const zck_model *m = zck_ds_model(c);
  ZT_EQ_INT(zck_ds_info_of(c)->stage, get(e, "stage")->valueint);
  ZT_EQ_INT(m->n_params, cJSON_GetArraySize(get(e, "trainable")));
  for (size_t p = 0; p < m->n_params; p++) ZT_ASSERT(!m->params[p].frozen && m->params[p].tied_to < 0);
  ZT_EQ_INT(zck_ds_unsaved_tie_count(c), tied);
  if (tied) {
    const char *a, *s;
    zck_ds_unsaved_tie(c, 0, &a, &s);
    ZT_EQ_STR(a, "base_model.model.lm_head.weight");
    ZT_EQ_STR(s, "base_model.model.transformer.wte.weight");
  }
  zck_ds_close(c);

  /* verify */
  zck_verify_report *r = NULL;
  ZT_OK(zck_verify(ckpt, NULL, &r));
  ZT_EQ_INT(r->result, ZCK_VERIFY_CLEAN);
  zck_verify_report_free(r);

  /* consolidate */
  snprintf(out, sizeof out, "%s/%s.safetensors", tmp, cs);
  ZT_OK(zck_consolidate(ckpt, out, NULL));
  same_as_zero_to_fp32(cs, out, expected, order, tied);

  /* to-universal (the Trainer's files have no universal_checkpoint_info) */
  const cJSON *u = get(get(e, "ds_to_universal"), "files");
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.inject_missing_state = 1;
  snprintf(out, sizeof out, "%s/%s-universal", tmp, cs);
  ZT_OK(zck_to_universal(ckpt, out, &uo));
  char udir[4200];
  snprintf(udir, sizeof udir, "%s/%s", out, get(e, "tag")->valuestring);
  struct stat st;
  if (stat(udir, &st) != 0) snprintf(udir, sizeof udir, "%s", out);
  same_as_ds_to_universal(cs, udir, u);
  /* and back from the universal folder: the same values, alias and None frozen entries */
  {
    char rs[4096], rc[4200];
    snprintf(rs, sizeof rs, "%s/%s-from-universal", tmp, cs);
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ro.to_stage = 3;
    ro.to_world_size = 2;
    ZT_OK(zck_reshard(out, rs, &ro));
    ZT_OK(zck_ds_open(rs, NULL, &c));
    ZT_EQ_INT(zck_ds_unsaved_tie_count(c), tied);
    ZT_ASSERT(!zck_ds_info_of(c)->has_frozen_shapes);
    zck_ds_close(c);
    snprintf(rc, sizeof rc, "%s.safetensors", rs);
    ZT_OK(zck_consolidate(rs, rc, NULL));
    same_as_zero_to_fp32(cs, rc, expected, order, tied);
  }

  /* reshard to every other stage and to 1 and 3 ranks, then consolidate again */
  static const int stages[] = {1, 2, 3};
  static const uint32_t worlds[] = {1, 3};
  for (size_t i = 0; i < 3; i++)
    for (size_t k = 0; k < 2; k++) {
      char rs[4096], rc[4200];
      snprintf(rs, sizeof rs, "%s/%s-s%dw%u", tmp, cs, stages[i], worlds[k]);
      zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
      ro.to_stage = stages[i];
      ro.to_world_size = worlds[k];
      ZT_OK(zck_reshard(ckpt, rs, &ro));
      ZT_OK(zck_ds_open(rs, NULL, &c));
      ZT_EQ_INT(zck_ds_unsaved_tie_count(c), tied);
      /* frozen_param_shapes / _fragments stay None as the Trainer saved them: DeepSpeed's load
       * copies every frozen param of the live model out of a dict, and the base weights are not there */
      ZT_ASSERT(!zck_ds_info_of(c)->has_frozen_shapes);
      zck_ds_close(c);
      snprintf(rc, sizeof rc, "%s.safetensors", rs);
      ZT_OK(zck_consolidate(rs, rc, NULL));
      same_as_zero_to_fp32(cs, rc, expected, order, tied);
    }
  fprintf(stderr, "  %s: ok (%s)\n", cs, tied ? "tied head, source not saved" : "untied head");
  cJSON_Delete(e);
}

int main(void) {
  char *root = zt_fixture("hf_peft");
  DIR *d = opendir(root);
  if (!d) zt_skip("no HF + PEFT fixtures");
  char *tmp = zt_tmpdir();
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s/expected.json", root, e->d_name);
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
