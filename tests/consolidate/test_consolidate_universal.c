/* test_consolidate_universal.c: `consolidate` of a universal checkpoint equals, byte for
 * byte, `consolidate` of the DeepSpeed checkpoint it was made from:
 *   - every fixture checkpoint (tests/fixtures/deepspeed: ZeRO-0/1/2/3, groups,
 *     sub-groups, round-robin, parameter alignment, a zero-element param, BF16_Optimizer,
 *     NVMe offload, frozen, tied params and buffers; hf_peft: LoRA saved with
 *     exclude_frozen_parameters, an alias whose source was not saved; autotp: TP x DP, frozen
 *     params, empty kv shards; new ones are picked up),
 *     from the folder `to-universal --format ds` writes and from the HDF5 container, into
 *     one safetensors file;
 *   - on a case per kind, every output consolidate writes: HF shards + index with
 *     pytorch_model.bin (--format both), a .bin file, --dtype bf16 / fp16, --keep-tied,
 *     --exclude-frozen;
 *   - from the folders DeepSpeed's own ds_to_universal.py wrote (tests/fixtures/universal),
 *     given as the folder or as its parent holding latest_universal;
 *   - the state dict in memory (zck_consolidate_open) from either, as from the checkpoint;
 *   - from an HF checkpoint-N/ holding the universal folder, and from the container made of
 *     it: config.json and generation_config.json come along as from the checkpoint;
 *   - damaged input is refused with one line naming the file, and nothing is written: a
 *     bit flipped in a state file (zip CRC), two state files of the same shape swapped (the
 *     manifest's XXH3), a buffer's bytes flipped in the carried model file, a truncated
 *     file, a missing param folder, a broken manifest, a truncated container. */
#include <stdlib.h>
#include <string.h>

#include "../reshard/rs_util.h"
#include "torch/torch.h"
#include "zck.h"


/* The cases every output format is checked on: one per stage, and the special layouts. */
static const char *all_formats[] = {"deepspeed/s0w2_bf16", "deepspeed/s1w2_bf16_bf16optimizer",
                                    "deepspeed/s1w3_bf16_3groups", "deepspeed/s2w2_fp32_zeronumel",
                                    "deepspeed/s3w2_fp32_nvme", "hf_peft/s2w2_lora_tied_bf16",
                                    "autotp/tp2dp2_s3_bf16_tied", "autotp/tp2_s2_bf16_tied_frozen"};

typedef struct variant {
  const char *name, *out;   /* out: what OUT is named (a folder, .safetensors, .bin) */
  zck_dtype dtype;
  int keep_tied, exclude_frozen, both;
  uint64_t shard;
} variant;

static const variant variants[] = {
  {"file", "m.safetensors", ZCK_DTYPE_INVALID, 0, 0, 0, 0},
  {"shards+bin", "hf", ZCK_DTYPE_INVALID, 0, 0, 1, 1000},
  {"bin", "m.bin", ZCK_DTYPE_INVALID, 0, 0, 0, 0},
  {"bf16", "m.safetensors", ZCK_BF16, 0, 0, 0, 0},
  {"fp16-dir", "hf", ZCK_F16, 0, 0, 0, 0},
  {"keep-tied", "m.safetensors", ZCK_DTYPE_INVALID, 1, 0, 0, 0},
  {"exclude-frozen", "m.safetensors", ZCK_DTYPE_INVALID, 0, 1, 0, 0},
};

static zck_status consolidate(const char *src, const char *out, const variant *v) {
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  o.dtype = v->dtype;
  o.keep_tied = v->keep_tied;
  o.exclude_frozen = v->exclude_frozen;
  o.torch_bin = v->both;
  o.max_shard_size = v->shard;
  o.threads = 2;
  return zck_consolidate(src, out, &o);
}

/* out of src and out of ref, written the same variant, hold the same bytes. */
static void same_output(const char *tmp, const char *ref, const char *src, const variant *v, const char *what) {
  /* one name in two folders: a .bin's archive is named after its file */
  char *a = rs_path("%s/a/%s", tmp, v->out), *b = rs_path("%s/b/%s", tmp, v->out);
  rs_sh("mkdir -p '%s/a' '%s/b'", tmp, tmp);
  ZT_OK(consolidate(ref, a, v));
  zck_status s = consolidate(src, b, v);
  if (s != ZCK_OK) ZT_FAIL("%s (%s): %s", what, v->name, zck_last_error());
  struct stat st;
  ZT_ASSERT(stat(a, &st) == 0);
  char label[1024];
  snprintf(label, sizeof label, "%s (%s)", what, v->name);
  if (S_ISDIR(st.st_mode)) {
    rs_same_tree(a, b, label);
  } else {
    unsigned char *x, *y;
    size_t nx, ny;
    ZT_ASSERT(zt_read_file(a, &x, &nx) == 0 && zt_read_file(b, &y, &ny) == 0);
    if (nx != ny || memcmp(x, y, nx)) ZT_FAIL("%s: %s and %s differ", label, a, b);
    free(x);
    free(y);
  }
  rs_sh("rm -rf '%s' '%s'", a, b);
  free(a);
  free(b);
}

static char *fixture(const char *fmt, const char *name) {
  char *rel = rs_path(fmt, name), *p = zt_fixture(rel);
  free(rel);
  return p;
}

static bool in_list(const char *c, const char *const *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(c, v[i])) return true;
  return false;
}

/* Every case of these fixture folders (each <case>/ckpt a checkpoint), new ones included. */
static char **all_cases(size_t *n) {
  static const char *kinds[] = {"deepspeed", "hf_peft", "autotp"};
  char **v = NULL;
  *n = 0;
  for (size_t k = 0; k < 3; k++) {
    char *dir = zt_fixture(kinds[k]);
    size_t m;
    char **l = rs_list(dir, &m);
    for (size_t i = 0; i < m; i++) {
      char *ck = rs_path("%s/%s/ckpt", dir, l[i]);
      if (rs_exists(ck)) {
        v = realloc(v, (*n + 1) * sizeof *v);
        v[(*n)++] = rs_path("%s/%s", kinds[k], l[i]);
      }
      free(ck);
    }
    rs_free_list(l, m);
    free(dir);
  }
  if (*n < 40) ZT_FAIL("only %zu fixture checkpoints found", *n);
  return v;
}

/* Every case: to-universal (folder and container), consolidated as the checkpoint is. */
static void made_by_zckpt(const char *tmp) {
  size_t n_cases;
  char **ds_cases = all_cases(&n_cases);
  for (size_t i = 0; i < n_cases; i++) {
    char *ck = fixture("%s/ckpt", ds_cases[i]);
    char *uv = rs_path("%s/uv", tmp), *h5 = rs_path("%s/u.h5", tmp);
    zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
    uo.inject_missing_state = 1;
    uo.threads = 2;
    ZT_OK(zck_to_universal(ck, uv, &uo));
    uo.format = ZCK_UNIVERSAL_HDF5;
    ZT_OK(zck_to_universal(ck, h5, &uo));
    bool all = in_list(ds_cases[i], all_formats, sizeof all_formats / sizeof all_formats[0]);
    for (size_t k = 0; k < (all ? sizeof variants / sizeof variants[0] : 1); k++) {
      char what[512];
      snprintf(what, sizeof what, "%s via its universal folder", ds_cases[i]);
      same_output(tmp, ck, uv, &variants[k], what);
      snprintf(what, sizeof what, "%s via its HDF5 container", ds_cases[i]);
      same_output(tmp, ck, h5, &variants[k], what);
    }
    rs_sh("rm -rf '%s' '%s' '%s/latest_universal'", uv, h5, tmp);
    free(ck);
    free(uv);
    free(h5);
  }
  rs_free_list(ds_cases, n_cases);
}

/* The folders ds_to_universal.py wrote, as the folder and as its parent. */
static void made_by_deepspeed(const char *tmp) {
  static const char *cases[] = {"s1w3_bf16_3groups", "s2w2_fp32_zeronumel", "s3w3_bf16_subgroup100"};
  for (size_t i = 0; i < 3; i++) {
    char *ck = fixture("deepspeed/%s/ckpt", cases[i]);
    char *root = fixture("universal/%s", cases[i]);
    char *dir = rs_path("%s/global_step2_universal", root);
    for (size_t k = 0; k < sizeof variants / sizeof variants[0]; k++) {
      char what[512];
      snprintf(what, sizeof what, "%s via ds_to_universal.py's folder", cases[i]);
      same_output(tmp, ck, dir, &variants[k], what);
    }
    same_output(tmp, ck, root, &variants[0], "ds_to_universal.py's folder given by its parent");
    free(ck);
    free(root);
    free(dir);
  }
}

/* An HF checkpoint-N/ with config files: the consolidated folder gets them from the
 * universal folder's root and from the container's side files alike. */
static void hf_folder(const char *tmp) {
  char *hf = rs_path("%s/checkpoint-7", tmp);
  char *ck = zt_fixture("deepspeed/s2w2_bf16/ckpt");
  rs_sh("mkdir -p '%s' && cp -r '%s/.' '%s' && printf '{\"model_type\": \"x\"}' > '%s/config.json' && "
        "printf '{\"max_length\": 9}' > '%s/generation_config.json'", hf, ck, hf, hf, hf);
  char *uv = rs_path("%s/global_step2_universal", hf), *h5 = rs_path("%s/c.h5", tmp);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.inject_missing_state = 1;
  ZT_OK(zck_to_universal(ck, uv, &uo));   /* its latest_universal lands in checkpoint-7 */
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(hf, h5, &uo));   /* the config files become side files */
  variant v = variants[0];
  v.out = "hf";
  same_output(tmp, hf, uv, &v, "HF checkpoint-N/'s universal folder");
  same_output(tmp, hf, h5, &v, "HF checkpoint-N/'s container");
  /* the config files did come along (the comparison above holds them) */
  char *out = rs_path("%s/hf-out", tmp);
  ZT_OK(consolidate(h5, out, &v));
  char *cfg = rs_path("%s/config.json", out), *gen = rs_path("%s/generation_config.json", out);
  ZT_ASSERT(rs_exists(cfg) && rs_exists(gen));
  rs_sh("rm -rf '%s' '%s' '%s'", hf, h5, out);
  free(cfg);
  free(gen);
  free(out);
  free(hf);
  free(ck);
  free(uv);
  free(h5);
}

/* src refused, the message naming `file` and saying `needle`; nothing at out. */
static void refused(const char *src, const char *out, const char *file, const char *needle) {
  zck_status s = consolidate(src, out, &variants[0]);
  if (s == ZCK_OK) ZT_FAIL("%s: consolidated though %s is damaged", src, file);
  const char *m = zck_last_error();
  if (!strstr(m, file) || !strstr(m, needle) || strchr(m, '\n'))
    ZT_FAIL("%s: message \"%s\" should name %s and say \"%s\" on one line", src, m, file, needle);
  rs_nothing_left(out);
}

/* Byte offset in the .pt file of the tensor at root[k1][k2] (NULL keys stop there). */
static long tensor_at(const char *pt, const char *k1, const char *k2) {
  zck_torch_file *f = NULL;
  ZT_OK(zck_torch_open(pt, NULL, &f));
  const zck_pk *n = zck_torch_root(f);
  if (k1) n = zck_pk_dict_get(n, k1);
  if (k2) n = zck_pk_dict_get(n, k2);
  const zck_torch_tensor *t = n ? zck_torch_tensor_of(f, n) : NULL;
  if (!t) ZT_FAIL("%s: no tensor at [%s][%s]", pt, k1 ? k1 : "", k2 ? k2 : "");
  long off = (long)zck_torch_tensor_file_offset(f, t);
  zck_torch_close(f);
  return off;
}

static void flip_byte(const char *path, long off) {
  rs_sh("printf '\\377' | dd of='%s' bs=1 seek=%ld conv=notrunc 2>/dev/null", path, off);
}

static void damage(const char *tmp) {
  char *ck = zt_fixture("deepspeed/s2w2_bf16/ckpt");
  char *good = rs_path("%s/good", tmp), *bad = rs_path("%s/bad", tmp), *out = rs_path("%s/o.safetensors", tmp);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.inject_missing_state = 1;
  ZT_OK(zck_to_universal(ck, good, &uo));
  char *f;
  /* a bit flipped in a state file's tensor bytes: its zip CRC */
  rs_sh("rm -rf '%s' && cp -r '%s' '%s'", bad, good, bad);
  f = rs_path("%s/zero/fc1.weight/fp32.pt", bad);
  flip_byte(f, tensor_at(f, "param", NULL) + 3);
  refused(bad, out, f, "CRC-32 mismatch");
  free(f);
  /* two state files of the same shape swapped: each CRC holds, the manifest's XXH3 not */
  rs_sh("rm -rf '%s' && cp -r '%s' '%s' && cd '%s/zero' && mv ln.weight/fp32.pt x && mv ln.bias/fp32.pt "
        "ln.weight/fp32.pt && mv x ln.bias/fp32.pt", bad, good, bad, bad);
  f = rs_path("%s/zero/ln", bad);
  refused(bad, out, f, "differ from zckpt-manifest.json");
  free(f);
  /* a buffer's bytes in the carried model file (no manifest: the zip CRC alone) */
  rs_sh("rm -rf '%s' && cp -r '%s' '%s' && rm '%s/zckpt-manifest.json'", bad, good, bad, bad);
  f = rs_path("%s/mp_rank_00_model_states.pt", bad);
  flip_byte(f, tensor_at(f, "module", "shift"));
  refused(bad, out, f, "CRC-32 mismatch");
  free(f);
  /* another state's file copied over fp32.pt, no manifest: one shape and dtype, each CRC
   * holds; its archive still says exp_avg */
  rs_sh("rm -rf '%s' && cp -r '%s' '%s' && rm '%s/zckpt-manifest.json' && cd '%s/zero/fc2.weight' && cp exp_avg.pt fp32.pt",
        bad, good, bad, bad, bad);
  f = rs_path("%s/zero/fc2.weight/fp32.pt", bad);
  refused(bad, out, f, "a copy of exp_avg.pt");
  free(f);
  /* ds_to_universal.py's own folder (no hashes) with rank 0's carried model file copied over
   * rank 1's: the frozen fragments would be rank 0's */
  char *dsuv = zt_fixture("universal/s3w3_bf16_subgroup100/global_step2_universal");
  rs_sh("rm -rf '%s' && cp -r '%s' '%s' && cd '%s' && cp zero_pp_rank_0_mp_rank_00_model_states.pt "
        "zero_pp_rank_1_mp_rank_00_model_states.pt", bad, dsuv, bad, bad);
  f = rs_path("%s/zero_pp_rank_1_mp_rank_00_model_states.pt", bad);
  refused(bad, out, f, "a copy of zero_pp_rank_0_mp_rank_00_model_states.pt");
  free(f);
  free(dsuv);
  /* a truncated state file */
  rs_sh("rm -rf '%s' && cp -r '%s' '%s' && truncate -s 900 '%s/zero/fc2.weight/exp_avg.pt'", bad, good, bad, bad);
  f = rs_path("%s/zero/fc2.weight/exp_avg.pt", bad);
  refused(bad, out, f, "");
  free(f);
  /* a param folder missing */
  rs_sh("rm -rf '%s' && cp -r '%s' '%s' && rm -r '%s/zero/fc1.bias'", bad, good, bad, bad);
  f = rs_path("%s/zero/fc1.bias/fp32.pt", bad);
  refused(bad, out, f, "missing");
  free(f);
  /* a broken manifest */
  rs_sh("rm -rf '%s' && cp -r '%s' '%s' && sed -i 's/\"files\"/\"filez\"/' '%s/zckpt-manifest.json'", bad, good, bad, bad);
  f = rs_path("%s/zckpt-manifest.json", bad);
  refused(bad, out, f, "malformed manifest");
  free(f);
  /* a truncated container */
  char *h5 = rs_path("%s/d.h5", tmp);
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(ck, h5, &uo));
  rs_sh("truncate -s 20000 '%s'", h5);
  refused(h5, out, h5, "");
  /* nothing was read from the damaged copies into the good one */
  ZT_OK(consolidate(good, out, &variants[0]));
  rs_sh("rm -rf '%s' '%s' '%s' '%s'", bad, good, out, h5);
  free(h5);
  free(ck);
  free(good);
  free(bad);
  free(out);
}

/* The state dict in memory (zck_consolidate_open) from a universal source: the same
 * tensors, names, dtypes, roles and values as from the checkpoint. */
static void **read_all(zck_state_dict *sd) {
  size_t n = zck_state_dict_count(sd);
  void **b = calloc(n + 1, sizeof *b);
  for (size_t i = 0; i < n; i++) {
    const zck_tensor_desc *d = zck_state_dict_tensor(sd, i);
    b[i] = d->alias_of >= 0 ? b[d->alias_of] : calloc(d->nbytes + 1, 1);
  }
  ZT_OK(zck_state_dict_read(sd, b));
  return b;
}

static void memory_api(const char *tmp) {
  char *ck = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  char *uv = rs_path("%s/mem-uv", tmp), *h5 = rs_path("%s/mem.h5", tmp);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  ZT_OK(zck_to_universal(ck, uv, &uo));
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(ck, h5, &uo));
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  o.dtype = ZCK_BF16;
  zck_state_dict *ref = NULL;
  ZT_OK(zck_consolidate_open(ck, &o, &ref));
  void **rb = read_all(ref);
  const char *srcs[2] = {uv, h5};
  for (int k = 0; k < 2; k++) {
    zck_state_dict *sd = NULL;
    ZT_OK(zck_consolidate_open(srcs[k], &o, &sd));
    ZT_EQ_U64(zck_state_dict_count(sd), zck_state_dict_count(ref));
    void **b = read_all(sd);
    for (size_t i = 0; i < zck_state_dict_count(ref); i++) {
      const zck_tensor_desc *x = zck_state_dict_tensor(ref, i), *y = zck_state_dict_tensor(sd, i);
      ZT_EQ_STR(x->name, y->name);
      ZT_EQ_INT(x->dtype, y->dtype);
      ZT_EQ_INT(x->role, y->role);
      ZT_EQ_INT(x->alias_of, y->alias_of);
      ZT_EQ_U64(x->nbytes, y->nbytes);
      if (memcmp(rb[i], b[i], x->nbytes)) ZT_FAIL("%s: %s differs in memory", srcs[k], x->name);
    }
    for (size_t i = 0; i < zck_state_dict_count(sd); i++)
      if (zck_state_dict_tensor(sd, i)->alias_of < 0) free(b[i]);
    free(b);
    zck_state_dict_free(sd);
  }
  for (size_t i = 0; i < zck_state_dict_count(ref); i++)
    if (zck_state_dict_tensor(ref, i)->alias_of < 0) free(rb[i]);
  free(rb);
  zck_state_dict_free(ref);
  rs_sh("rm -rf '%s' '%s' '%s/latest_universal'", uv, h5, tmp);
  free(ck);
  free(uv);
  free(h5);
}

int main(void) {
  char *tmp = zt_tmpdir();
  memory_api(tmp);
  damage(tmp);
  hf_folder(tmp);
  made_by_deepspeed(tmp);
  made_by_zckpt(tmp);
  free(tmp);
  return 0;
}
