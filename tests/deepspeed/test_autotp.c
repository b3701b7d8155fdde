/* test_autotp.c: AutoTP (tensor-parallel) checkpoints saved by the real DeepSpeed 0.19.8 on
 * the CPU (tests/fixtures/autotp/<case>/, made by tests/fixtures/gen/make_autotp_fixtures.py):
 * TP 2 x DP 1 and TP 2 x DP 2, ZeRO 1, 2 and 3, fp32 and bf16, tied and untied head, frozen
 * params (column-, row-parallel, replicated, the vocab-parallel tied embedding) at ZeRO 1 and 2.
 * Frozen params: consolidate gives them where zero_to_fp32 does (ZeRO-2/3), equal to the live
 * engine's slices merged by ParamAffineMap.rebuild (expected_frozen); to-universal writes them
 * whole as float32; every reshard and read-back below carries them.
 *   - open: the full shapes (what DeepSpeed's engine holds gathered), tp_size, dp size;
 *   - consolidate equals the live engine's full fp32 masters (safe_get_full_fp32_param on
 *     every TP rank, merged by DeepSpeed's ParamAffineMap.rebuild) bit for bit; with
 *     --dtype bf16 it equals DeepSpeed's own 16-bit TP gather (_consolidated_16bit_state_dict);
 *   - to-universal: every fp32 / exp_avg / exp_avg_sq file holds the full tensor the engine
 *     had, vocabulary params carry 'vocab_tensor', a tied head is the whole matrix, both TP
 *     ranks' model files are there; the HDF5 container too (read back by a reshard); the
 *     folder read back by zckpt's universal reader (full shapes, verify clean), its reshard
 *     = the direct reshard, file for file (plain ZeRO, and AutoTP files at the same TP);
 *   - reshard to plain ZeRO (TP 1) at every stage and other world sizes keeps every value;
 *   - reshard into AutoTP files at the same TP size (another stage and dp size) reads back
 *     as the same model (fp32, 16-bit), and its reshard back equals the direct one byte for
 *     byte; another TP size without the model config is refused (test_autotp_tpsize: with it);
 *   - verify calls them clean; a TP rank's file copied over another's and a flipped bit in
 *     mp rank 1's data are refused with one line naming the file. */
#include "ds_test_util.h"
#include "safetensors/safetensors.h"
#include "universal/universal.h"
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

static unsigned char *read_st(const zck_hf_tensor *t) {
  unsigned char *p = malloc(t->t->nbytes + 1);
  ZT_OK(zck_st_read(t->file, t->t, p, 0, t->t->nbytes));
  return p;
}

/* The frozen params' full values (the live engine's slices merged by DeepSpeed's
 * ParamAffineMap.rebuild), for the cases with frozen params; else NULL. */
static const char *g_frozen;

/* Every tensor of `out` equals the one of the same name in `expected`, or in g_frozen
 * (dtype, shape, bytes); `out` has `n_expected` tensors (-1: any number). */
static void same_tensors(const char *cs, const char *out, const char *expected, int n_expected) {
  zck_hf_checkpoint *a = NULL, *b = NULL, *f = NULL;
  ZT_OK(zck_hf_open(out, &a));
  ZT_OK(zck_hf_open(expected, &b));
  if (g_frozen) ZT_OK(zck_hf_open(g_frozen, &f));
  if (n_expected >= 0) ZT_EQ_INT(zck_hf_count(a), n_expected);
  for (size_t i = 0; i < zck_hf_count(a); i++) {
    const zck_hf_tensor *x = zck_hf_tensor_at(a, i), *y = zck_hf_find(b, x->t->name);
    if (!y && f) y = zck_hf_find(f, x->t->name);
    if (!y) ZT_FAIL("%s: %s: no %s in %s", cs, out, x->t->name, expected);
    ZT_EQ_INT(x->t->dtype, y->t->dtype);
    ZT_EQ_INT(x->t->ndim, y->t->ndim);
    for (int d = 0; d < x->t->ndim; d++) ZT_EQ_INT(x->t->shape[d], y->t->shape[d]);
    unsigned char *p = read_st(x), *q = read_st(y);
    if (memcmp(p, q, x->t->nbytes)) ZT_FAIL("%s: %s differs from %s", cs, x->t->name, expected);
    free(p);
    free(q);
  }
  zck_hf_close(a);
  zck_hf_close(b);
  zck_hf_close(f);
}

/* zero/<name>/<state>.pt of a universal folder equals `key` of expected (a safetensors file). */
static void same_universal(const char *cs, const char *udir, const char *name, const char *state, const char *expected,
                           const char *key, int vocab) {
  char p[4096];
  snprintf(p, sizeof p, "%s/zero/%s/%s.pt", udir, name, state);
  zck_torch_file *tf = NULL;
  if (zck_torch_open(p, NULL, &tf) != ZCK_OK) ZT_FAIL("%s: %s: %s", cs, p, zck_last_error());
  const zck_pk *root = zck_torch_root(tf);
  ZT_ASSERT(root->kind == ZCK_PK_DICT);
  /* ds_to_universal's affine-map merge: {'param'} or {'vocab_tensor': True, 'param'}, no cat_dim */
  ZT_EQ_INT(root->u.dict.len, (vocab ? 2 : 1));
  ZT_ASSERT(!zck_pk_dict_get(root, "cat_dim"));
  if (vocab) ZT_EQ_STR(zck_pk_as_str(root->u.dict.keys[0]), "vocab_tensor");
  const zck_torch_tensor *t = zck_torch_tensor_of(tf, zck_pk_dict_get(root, "param"));
  if (!t) ZT_FAIL("%s: %s holds no 'param' tensor", cs, p);
  zck_hf_checkpoint *b = NULL;
  ZT_OK(zck_hf_open(expected, &b));
  const zck_hf_tensor *y = zck_hf_find(b, key);
  if (!y) ZT_FAIL("%s: %s lacks %s", cs, expected, key);
  /* a frozen bf16 param: module entries are written as float32 (ds_to_universal: tensor.float()) */
  int widen = y->t->dtype == ZCK_BF16 && t->dtype == ZCK_F32;
  if (!widen) ZT_EQ_INT(t->dtype, y->t->dtype);
  ZT_EQ_INT(t->ndim, y->t->ndim);
  for (int d = 0; d < t->ndim; d++) ZT_EQ_INT(t->shape[d], y->t->shape[d]);
  uint64_t numel = zck_torch_tensor_numel(t);
  unsigned char *buf = malloc(numel * 4 + 1), *q = read_st(y);
  ZT_OK(zck_torch_tensor_read(tf, t, buf, 0, numel));
  if (widen) { /* bf16 -> f32 is exact: the bf16 bits in the high half */
    unsigned char *wq = calloc(numel * 4 + 1, 1);
    for (uint64_t i = 0; i < numel; i++) memcpy(wq + 4 * i + 2, q + 2 * i, 2);
    free(q);
    q = wq;
  }
  if (memcmp(buf, q, numel * zck_dtype_size(t->dtype))) ZT_FAIL("%s: %s differs from the live engine's %s", cs, p, key);
  free(buf);
  free(q);
  zck_hf_close(b);
  zck_torch_close(tf);
}

/* Whether DeepSpeed listed name in universal_checkpoint_info['vocabulary_parameter_patterns']
 * ("^" + re.escape(name) + "$") of mp rank 0's model file. */
static int is_vocab(const char *ckpt, int stage, const char *name) {
  char p[4096], pat[1024];
  snprintf(p, sizeof p, "%s/global_step2/%smp_rank_00_model_states.pt", ckpt, stage == 3 ? "zero_pp_rank_0_" : "");
  size_t k = 0;
  pat[k++] = '^';
  for (const char *c = name; *c && k < sizeof pat - 3; c++) {
    if (*c == '.') pat[k++] = '\\';
    pat[k++] = *c;
  }
  pat[k++] = '$';
  pat[k] = 0;
  zck_torch_file *tf = NULL;
  ZT_OK(zck_torch_open(p, NULL, &tf));
  const zck_pk *l = zck_pk_dict_get(zck_pk_dict_get(zck_torch_root(tf), "universal_checkpoint_info"),
                                    "vocabulary_parameter_patterns");
  int hit = 0;
  for (size_t i = 0; l && i < l->u.seq.len; i++) hit |= zck_pk_as_str(l->u.seq.items[i]) && !strcmp(zck_pk_as_str(l->u.seq.items[i]), pat);
  zck_torch_close(tf);
  return hit;
}

/* Folders a and b hold the same files, byte for byte (recursively). */
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

static void check_universal(const char *cs, const char *ckpt, const char *dir, const char *tmp, const cJSON *e) {
  char out[4096], fp32[4200], state[4200], key[600];
  snprintf(out, sizeof out, "%s/%s-universal", tmp, cs);
  snprintf(fp32, sizeof fp32, "%s/expected_fp32.safetensors", dir);
  snprintf(state, sizeof state, "%s/expected_state.safetensors", dir);
  ZT_OK(zck_to_universal(ckpt, out, NULL));
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(ckpt, NULL, &c));
  const zck_model *m = zck_ds_model(c);
  for (size_t p = 0; p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    if (pp->tied_to >= 0) {
      char ap[4300];
      struct stat st;
      snprintf(ap, sizeof ap, "%s/zero/%s", out, pp->name);
      if (zck_ds_info_of(c)->stage == 3)  /* stage 3 writes no module files for aliases (ds_to_universal neither) */
        ZT_ASSERT(stat(ap, &st) != 0);
      else  /* the whole tied matrix (ds_to_universal: TP rank 0's 16-bit half) */
        same_universal(cs, out, pp->name, "fp32", pp->frozen ? g_frozen : fp32, m->params[pp->tied_to].name, 0);
      continue;
    }
    if (pp->frozen) {  /* the whole frozen param, merged from its slices, as float32; no optimizer state */
      char ap[4300];
      struct stat st;
      same_universal(cs, out, pp->name, "fp32", g_frozen, pp->name, 0);
      snprintf(ap, sizeof ap, "%s/zero/%s/exp_avg.pt", out, pp->name);
      ZT_ASSERT(stat(ap, &st) != 0);
      continue;
    }
    int vocab = is_vocab(ckpt, zck_ds_info_of(c)->stage, pp->name);
    same_universal(cs, out, pp->name, "fp32", fp32, pp->name, vocab);
    snprintf(key, sizeof key, "%s/exp_avg", pp->name);
    same_universal(cs, out, pp->name, "exp_avg", state, key, vocab);
    snprintf(key, sizeof key, "%s/exp_avg_sq", pp->name);
    same_universal(cs, out, pp->name, "exp_avg_sq", state, key, vocab);
  }
  /* read back by zckpt's own universal reader: the full shapes, AutoTP noted; its reshard to
   * plain ZeRO equals the direct reshard of the AutoTP checkpoint, file for file */
  zck_uv_ckpt *u = NULL;
  ZT_OK(zck_uv_open(out, NULL, &u));
  ZT_EQ_INT(zck_uv_info_of(u)->tp_size, get(e, "tp_size")->valueint);
  const zck_model *um = zck_uv_model(u);
  ZT_EQ_INT(um->n_params, m->n_params);
  for (size_t p = 0; p < m->n_params; p++) {
    ZT_EQ_INT(um->params[p].ndim, m->params[p].ndim);
    for (int d = 0; d < m->params[p].ndim; d++) ZT_EQ_INT(um->params[p].shape[d], m->params[p].shape[d]);
  }
  zck_uv_close(u);
  zck_verify_report *vr = NULL;
  ZT_OK(zck_verify(out, NULL, &vr));
  ZT_EQ_INT(vr->result, ZCK_VERIFY_CLEAN);
  zck_verify_report_free(vr);
  {
    /* a folder of its own: a reshard carries over the other files of the folder whose
     * latest_universal names the universal folder (an HF checkpoint-N/), here tmp's */
    char a[4200], b[4200], own[4200], uv[4300];
    snprintf(own, sizeof own, "%s/%s-uvroot", tmp, cs);
    snprintf(uv, sizeof uv, "%s/global_step2_universal", own);
    if (mkdir(own, 0755) != 0) ZT_FAIL("mkdir %s", own);
    ZT_OK(zck_to_universal(ckpt, uv, NULL));
    snprintf(a, sizeof a, "%s/%s-uv-reshard", tmp, cs);
    snprintf(b, sizeof b, "%s/%s-direct-reshard", tmp, cs);
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ro.to_stage = 2;
    ro.to_world_size = 3;
    ZT_OK(zck_reshard(own, a, &ro));
    ZT_OK(zck_reshard(ckpt, b, &ro));
    same_tree(cs, a, b);
    /* AutoTP files again (the source's TP size) from the universal folder = from the checkpoint */
    ro.to_tp_size = (uint32_t)get(e, "tp_size")->valueint;
    ro.to_stage = 3;
    snprintf(a, sizeof a, "%s/%s-uv-reshard-tp", tmp, cs);
    snprintf(b, sizeof b, "%s/%s-direct-reshard-tp", tmp, cs);
    ZT_OK(zck_reshard(own, a, &ro));
    ZT_OK(zck_reshard(ckpt, b, &ro));
    same_tree(cs, a, b);
  }
  zck_ds_close(c);
  for (int t = 0; t < get(e, "tp_size")->valueint; t++)  /* every TP rank's model files, as ds_to_universal copies them */
    for (int r = 0; r < (get(e, "stage")->valueint == 3 ? get(e, "dp_size")->valueint : 1); r++) {
      char p[4200], z[64] = "";
      struct stat st;
      if (get(e, "stage")->valueint == 3) snprintf(z, sizeof z, "zero_pp_rank_%d_", r);
      snprintf(p, sizeof p, "%s/%smp_rank_%02d_model_states.pt", out, z, t);
      if (stat(p, &st) != 0) ZT_FAIL("%s: no %s", cs, p);
    }
  /* the HDF5 container, read back through a reshard to plain ZeRO */
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.format = ZCK_UNIVERSAL_HDF5;
  snprintf(out, sizeof out, "%s/%s.h5", tmp, cs);
  ZT_OK(zck_to_universal(ckpt, out, &uo));
  char rs[4200], rc[4300];
  snprintf(rs, sizeof rs, "%s/%s-from-h5", tmp, cs);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_stage = 2;
  ro.to_world_size = 3;
  ZT_OK(zck_reshard(out, rs, &ro));
  snprintf(rc, sizeof rc, "%s.safetensors", rs);
  ZT_OK(zck_consolidate(rs, rc, NULL));
  same_tensors(cs, rc, fp32, -1);
}

/* A copy of the case with `from` copied over `to` (damage = 0), or a bit of mp rank 1's
 * first fp32 partition flipped (damage = 1): refused with one line naming the file. */
static void check_damage(const char *cs, const char *ckpt, const char *tmp, const char *from, const char *to, int damage,
                         const char *needle) {
  char d[4096], tag[4200], out[4300];
  snprintf(d, sizeof d, "%s/%s-damaged-%s", tmp, cs, to);
  if (zt_copy_tree(ckpt, d) != 0) ZT_FAIL("cp %s", ckpt);
  snprintf(tag, sizeof tag, "%s/global_step2", d);
  char a[4400], b[4400];
  snprintf(b, sizeof b, "%s/%s", tag, to);
  if (!damage) {
    snprintf(a, sizeof a, "%s/%s", tag, from);
    unsigned char *data;
    size_t n;
    if (zt_read_file(a, &data, &n) != 0 || zt_write_file(b, data, n) != 0) ZT_FAIL("copy %s", a);
    free(data);
  } else {
    /* flip a byte inside the fp32 partition's storage: found through the reader */
    zck_ds_ckpt *c = NULL;
    ZT_OK(zck_ds_open(d, NULL, &c));
    zck_ds_view v;
    ZT_OK(zck_ds_get(c, ZCK_DS_FP32, &v));
    const zck_store *victim = NULL;
    for (size_t i = 0; i < v.layout->n_stores && !victim; i++)
      if (v.stores[i].numel && v.stores[i].name && strstr(v.stores[i].name, to)) victim = &v.stores[i];
    if (!victim) ZT_FAIL("%s: no fp32 store in %s", cs, to);
    uint64_t off = victim->base + 4;
    zck_ds_close(c);
    unsigned char *data;
    size_t n;
    if (zt_read_file(b, &data, &n) != 0 || off >= n) ZT_FAIL("read %s", b);
    data[off] ^= 0x10;
    if (zt_write_file(b, data, n) != 0) ZT_FAIL("write %s", b);
    free(data);
  }
  snprintf(out, sizeof out, "%s.safetensors", d);
  zck_status s = zck_consolidate(d, out, NULL);
  if (s == ZCK_OK) ZT_FAIL("%s: consolidate of a damaged checkpoint (%s) succeeded", cs, to);
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", zck_last_error());
  if (!strstr(msg, to) || !strstr(msg, needle) || strchr(msg, '\n')) ZT_FAIL("%s: message \"%s\"", cs, msg);
  struct stat st;
  if (stat(out, &st) == 0) ZT_FAIL("%s: %s written from damaged input", cs, out);
  zck_verify_report *r = NULL;
  zck_verify(d, NULL, &r);
  ZT_ASSERT(r && r->result == ZCK_VERIFY_DAMAGED);
  zck_verify_report_free(r);
  fprintf(stderr, "    ok: %s\n", msg);
}

/* A TP rank's file removed: refused with one line naming that rank's file. */
static void check_missing(const char *cs, const char *ckpt, const char *tmp, const char *file, const char *needle) {
  char d[4096], p[4300], out[4300];
  snprintf(d, sizeof d, "%s/%s-missing-%s", tmp, cs, file);
  if (zt_copy_tree(ckpt, d) != 0) ZT_FAIL("cp %s", ckpt);
  snprintf(p, sizeof p, "%s/global_step2/%s", d, file);
  if (remove(p) != 0) ZT_FAIL("rm %s", p);
  snprintf(out, sizeof out, "%s.safetensors", d);
  zck_status s = zck_consolidate(d, out, NULL);
  if (s == ZCK_OK) ZT_FAIL("%s: consolidate without %s succeeded", cs, file);
  const char *msg = zck_last_error();
  if (!strstr(msg, needle) || strchr(msg, '\n')) ZT_FAIL("%s: message \"%s\" lacks \"%s\"", cs, msg, needle);
  fprintf(stderr, "    ok: %s\n", msg);
}

static void check_case(const char *root, const char *cs, const char *tmp) {
  char dir[4096], ckpt[4200], path[4300], out[4300];
  snprintf(dir, sizeof dir, "%s/%s", root, cs);
  snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
  snprintf(path, sizeof path, "%s/expected.json", dir);
  cJSON *e = load_json(path);
  int tp = get(e, "tp_size")->valueint, dp = get(e, "dp_size")->valueint, tied = cJSON_IsTrue(get(e, "tied"));
  const char *dtype = get(e, "dtype")->valuestring;
  char frozen_path[4300];
  snprintf(frozen_path, sizeof frozen_path, "%s/expected_frozen.safetensors", dir);
  struct stat fst;
  g_frozen = stat(frozen_path, &fst) == 0 ? frozen_path : NULL;
  const cJSON *frozen_names = cJSON_GetObjectItemCaseSensitive(e, "frozen");
  int n_frozen = frozen_names ? cJSON_GetArraySize(frozen_names) : 0;
  ZT_ASSERT(!g_frozen == !n_frozen);

  /* open: the full shapes DeepSpeed's engine holds gathered */
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(ckpt, NULL, &c));
  const zck_ds_info *in = zck_ds_info_of(c);
  const zck_model *m = zck_ds_model(c);
  ZT_EQ_INT(in->tp_size, tp);
  ZT_EQ_INT(in->world_size, dp);
  ZT_EQ_INT(in->stage, get(e, "stage")->valueint);
  const cJSON *shapes = get(e, "full_shapes"), *it;
  size_t owners = 0, frozen = 0;
  for (size_t p = 0; p < m->n_params; p++) owners += m->params[p].tied_to < 0;
  for (size_t p = 0; p < m->n_params; p++) frozen += m->params[p].tied_to < 0 && m->params[p].frozen;
  ZT_EQ_INT(owners, cJSON_GetArraySize(shapes));
  ZT_EQ_INT(frozen, n_frozen);
  /* consolidate's tensors at stage S: the trainable ones, and the frozen ones where ZeRO saves
   * them for zero_to_fp32 (frozen_param_fragments: stage 2 and 3) */
#define OUT_AT(S) ((int)(owners - ((S) == 1 ? frozen : 0)))
  cJSON_ArrayForEach(it, shapes) {
    int64_t p = zck_model_find_param(m, it->string);
    if (p < 0) ZT_FAIL("%s: no param %s", cs, it->string);
    ZT_EQ_INT(m->params[p].ndim, cJSON_GetArraySize(it));
    for (int d = 0; d < m->params[p].ndim; d++) ZT_EQ_INT(m->params[p].shape[d], cJSON_GetArrayItem(it, d)->valueint);
  }
  int64_t head = zck_model_find_param(m, "lm_head.weight");
  ZT_ASSERT(head >= 0);
  ZT_EQ_INT(m->params[head].tied_to >= 0, tied);
  zck_ds_close(c);

  zck_verify_report *r = NULL;
  ZT_OK(zck_verify(ckpt, NULL, &r));
  ZT_EQ_INT(r->result, ZCK_VERIFY_CLEAN);
  zck_verify_report_free(r);

  /* consolidate: the live engine's full fp32 masters; in bf16, DeepSpeed's own 16-bit gather */
  char fp32[4300], lp[4300];
  snprintf(fp32, sizeof fp32, "%s/expected_fp32.safetensors", dir);
  snprintf(lp, sizeof lp, "%s/expected_lp.safetensors", dir);
  snprintf(out, sizeof out, "%s/%s.safetensors", tmp, cs);
  ZT_OK(zck_consolidate(ckpt, out, NULL));
  same_tensors(cs, out, fp32, OUT_AT(get(e, "stage")->valueint));
  if (!strcmp(dtype, "bf16")) {
    zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
    co.dtype = ZCK_BF16;
    snprintf(out, sizeof out, "%s/%s-bf16.safetensors", tmp, cs);
    ZT_OK(zck_consolidate(ckpt, out, &co));
    same_tensors(cs, out, lp, OUT_AT(get(e, "stage")->valueint));
  }

  check_universal(cs, ckpt, dir, tmp, e);

  /* reshard to plain ZeRO (TP 1): every stage, other world sizes */
  static const int stages[] = {1, 2, 3};
  for (size_t i = 0; i < 3; i++) {
    char rs[4400], rc[4500];
    snprintf(rs, sizeof rs, "%s/%s-tp1-s%d", tmp, cs, stages[i]);
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ro.to_stage = stages[i];
    ro.to_world_size = (uint32_t)(i + 1);
    ZT_OK(zck_reshard(ckpt, rs, &ro));
    ZT_OK(zck_ds_open(rs, NULL, &c));
    ZT_EQ_INT(zck_ds_info_of(c)->tp_size, 1);
    zck_ds_close(c);
    snprintf(rc, sizeof rc, "%s.safetensors", rs);
    ZT_OK(zck_consolidate(rs, rc, NULL));
    same_tensors(cs, rc, fp32, OUT_AT(stages[i]));
  }

  /* reshard into AutoTP files at the same TP size, another stage and dp size: every TP
   * rank's files, read back as the same full model; and back again, the same bytes as a
   * direct reshard to that configuration */
  {
    int stage = get(e, "stage")->valueint, st2 = stage == 3 ? 1 : stage + 1, w2 = dp == 1 ? 2 : 1;
    char a[4400], b[4400], b2[4400], rc[4500];
    snprintf(a, sizeof a, "%s/%s-tp%d-s%dw%d", tmp, cs, tp, st2, w2);
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ro.to_tp_size = (uint32_t)tp;
    ro.to_stage = st2;
    ro.to_world_size = (uint32_t)w2;
    ZT_OK(zck_reshard(ckpt, a, &ro));
    ZT_OK(zck_ds_open(a, NULL, &c));
    ZT_EQ_INT(zck_ds_info_of(c)->tp_size, tp);
    ZT_EQ_INT(zck_ds_info_of(c)->world_size, w2);
    ZT_EQ_INT(zck_ds_info_of(c)->stage, st2);
    zck_ds_close(c);
    snprintf(rc, sizeof rc, "%s.safetensors", a);
    ZT_OK(zck_consolidate(a, rc, NULL));
    same_tensors(cs, rc, fp32, OUT_AT(st2));
    if (!strcmp(dtype, "bf16")) {  /* the 16-bit weights of every TP rank: DeepSpeed's 16-bit gather */
      zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
      co.dtype = ZCK_BF16;
      snprintf(rc, sizeof rc, "%s-bf16.safetensors", a);
      ZT_OK(zck_consolidate(a, rc, &co));
      same_tensors(cs, rc, lp, OUT_AT(st2));
    }
    r = NULL;
    ZT_OK(zck_verify(a, NULL, &r));
    ZT_EQ_INT(r->result, ZCK_VERIFY_CLEAN);
    zck_verify_report_free(r);
    snprintf(b, sizeof b, "%s/%s-tp%d-back", tmp, cs, tp);
    snprintf(b2, sizeof b2, "%s/%s-tp%d-direct", tmp, cs, tp);
    ro.to_stage = stage;
    ro.to_world_size = (uint32_t)dp;
    ZT_OK(zck_reshard(a, b, &ro));
    ZT_OK(zck_reshard(ckpt, b2, &ro));
    same_tree(cs, b, b2);
    if (n_frozen && st2 == 3) {
      /* frozen params of ZeRO-3 AutoTP files (frozen_param_fragments per TP and dp rank)
       * through a universal folder: the reader merges every carried rank file's slices */
      char u[4500], ub[4500];
      snprintf(u, sizeof u, "%s/%s-s3-uroot", tmp, cs);
      ZT_ASSERT(mkdir(u, 0755) == 0);
      snprintf(u, sizeof u, "%s/%s-s3-uroot/global_step2_universal", tmp, cs);
      ZT_OK(zck_to_universal(a, u, NULL));
      snprintf(ub, sizeof ub, "%s/%s-s3-universal-back", tmp, cs);
      ZT_OK(zck_reshard(u, ub, &ro));
      same_tree(cs, ub, b2);
    }
    /* another TP size without the model config (none in ckpt/): refused, nothing written
     * (test_autotp_tpsize: with it) */
    ro.to_tp_size = (uint32_t)tp + 1;
    snprintf(b, sizeof b, "%s/%s-tp-other", tmp, cs);
    ZT_ASSERT(zck_reshard(ckpt, b, &ro) == ZCK_ERR_NOT_FOUND);
    ZT_ASSERT(strstr(zck_last_error(), "--to-tp-size") && strstr(zck_last_error(), "config.json") &&
              !strchr(zck_last_error(), '\n'));
    struct stat sb;
    ZT_ASSERT(stat(b, &sb) != 0);
  }

  /* damage: TP rank files swapped, a flipped bit in mp rank 1's data */
  const char *pre = !strcmp(dtype, "bf16") ? "bf16_" : "";
  char o0[128], o1[128];
  snprintf(o0, sizeof o0, "%szero_pp_rank_0_mp_rank_00_optim_states.pt", pre);
  snprintf(o1, sizeof o1, "%szero_pp_rank_0_mp_rank_01_optim_states.pt", pre);
  const char *zp = get(e, "stage")->valueint == 3 ? "zero_pp_rank_0_" : "";  /* stage 3: a model file per dp rank */
  char m0[128], m1[128];
  snprintf(m0, sizeof m0, "%smp_rank_00_model_states.pt", zp);
  snprintf(m1, sizeof m1, "%smp_rank_01_model_states.pt", zp);
  check_damage(cs, ckpt, tmp, m1, m0, 0, "tensor-parallel rank 1");
  check_damage(cs, ckpt, tmp, o1, o0, 0, "tensor-parallel rank 1");
  check_damage(cs, ckpt, tmp, NULL, o1, 1, "CRC-32 mismatch");
  check_missing(cs, ckpt, tmp, m1, *zp ? m1 : "no model-states file (mp_rank_01_model_states.pt");
  check_missing(cs, ckpt, tmp, o1, o1);
  fprintf(stderr, "  %s: ok (tp %d x dp %d, %s, %s head, %d frozen)\n", cs, tp, dp, dtype, tied ? "tied" : "untied",
          n_frozen);
  cJSON_Delete(e);
#undef OUT_AT
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
