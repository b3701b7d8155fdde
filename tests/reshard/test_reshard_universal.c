/* test_reshard_universal.c: `reshard` from a DeepSpeed-layout universal folder gives, file
 * for file and byte for byte (every state tensor, every pickle), what the reshard of the
 * original DeepSpeed checkpoint gives, for stages {1,2,3} x world sizes {1,2,3,4}:
 *   - with the folder `zckpt to-universal --format ds` writes, from real DeepSpeed 0.19.8
 *     checkpoints (tests/fixtures/deepspeed: groups, sub-groups, round-robin, parameter
 *     alignment, a zero-element param, fp16 loss scaling, frozen and tied params, buffers);
 *   - with folders DeepSpeed's own ds_to_universal.py wrote (tests/fixtures/universal);
 *   - with the HDF5 container (`--format hdf5`; its /resume_state carries lr_scheduler,
 *     loss scaler, ds_config, module metadata and module order), stages {1,2,3} x W {1,4},
 *     from those fixtures and from HF Trainer + PEFT (LoRA) checkpoints (tests/fixtures/hf_peft:
 *     an alias whose source was not saved, frozen_param_* None);
 *   - an HDF5 container written before /resume_state existed still reshards (lr_scheduler
 *     None, DeepSpeed's defaults); a malformed /resume_state is refused, naming it;
 *   - whether SRC is the universal folder, its parent holding latest_universal, or an HF
 *     checkpoint-N/ folder holding it (whose other files are carried over, rng states of
 *     ranks beyond the new world size dropped). */
#include <hdf5.h>

#include "rs_util.h"
#include "../universal/h5_edit.h"
#include "../universal/ut_util.h"
#include "deepspeed/deepspeed.h"
#include "hdf5/zck_h5.h"
#include "zck.h"

static const uint32_t worlds[] = {1, 2, 3, 4};

/* Reshards the DeepSpeed checkpoint `ds` and the universal source `uv` to every stage and
 * world size; the tag folders and `latest` must be identical. */
static int compare_all(const char *tmp, const char *label, const char *ds, const char *uv) {
  int n = 0;
  for (int stage = 1; stage <= 3; stage++)
    for (size_t wi = 0; wi < sizeof worlds / sizeof worlds[0]; wi++) {
      char *a = rs_path("%s/%s-ds-s%dw%u", tmp, label, stage, worlds[wi]);
      char *b = rs_path("%s/%s-uv-s%dw%u", tmp, label, stage, worlds[wi]);
      zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
      o.to_stage = stage;
      o.to_world_size = worlds[wi];
      o.sub_group_size = stage == 3 && wi == 2 ? 150 : 0; /* several sub-groups once */
      o.threads = 2;
      ZT_OK(zck_reshard(ds, a, &o));
      ZT_OK(zck_reshard(uv, b, &o));
      char *ta = rs_path("%s/global_step2", a), *tb = rs_path("%s/global_step2", b);
      char what[512];
      snprintf(what, sizeof what, "%s -> stage %d W %u", label, stage, worlds[wi]);
      rs_same_tree(ta, tb, what);
      char *la = rs_path("%s/latest", a), *lb = rs_path("%s/latest", b);
      unsigned char *x, *y;
      size_t nx, ny;
      ZT_ASSERT(zt_read_file(la, &x, &nx) == 0 && zt_read_file(lb, &y, &ny) == 0);
      ZT_ASSERT(nx == ny && !memcmp(x, y, nx));
      free(x);
      free(y);
      rs_sh("rm -rf '%s' '%s'", a, b);
      free(a);
      free(b);
      free(ta);
      free(tb);
      free(la);
      free(lb);
      n++;
    }
  return n;
}

/* Every store of every part of two DeepSpeed checkpoints holds the same bytes, in the same
 * flat layout (same params in the same flat groups, same partitions). */
static void same_states(const char *a, const char *b, const char *what) {
  zck_ds_ckpt *x, *y;
  ZT_OK(zck_ds_open(a, NULL, &x));
  ZT_OK(zck_ds_open(b, NULL, &y));
  const zck_ds_info *ix = zck_ds_info_of(x), *iy = zck_ds_info_of(y);
  ZT_EQ_INT(ix->stage, iy->stage);
  ZT_EQ_INT(ix->world_size, iy->world_size);
  ZT_EQ_U64(ix->n_flat_groups, iy->n_flat_groups);
  ZT_EQ_INT(ix->lp_dtype, iy->lp_dtype);
  ZT_ASSERT(ix->step == iy->step && ix->step_is_tensor == iy->step_is_tensor);
  ZT_EQ_INT(ix->global_steps, iy->global_steps);
  const zck_model *mx = zck_ds_model(x), *my = zck_ds_model(y);
  for (int part = 0; part < ZCK_DS_PART_COUNT; part++) {
    zck_ds_view vx, vy;
    bool hx = zck_ds_get(x, (zck_ds_part)part, &vx) == ZCK_OK, hy = zck_ds_get(y, (zck_ds_part)part, &vy) == ZCK_OK;
    zck_clear_error();
    if (hx != hy) ZT_FAIL("%s: part %d in one checkpoint only", what, part);
    if (!hx) continue;
    ZT_EQ_U64(vx.layout->n_stores, vy.layout->n_stores);
    ZT_EQ_U64(vx.layout->n_groups, vy.layout->n_groups);
    for (size_t g = 0; g < vx.layout->n_groups; g++) {
      ZT_EQ_U64(vx.layout->groups[g].n_params, vy.layout->groups[g].n_params);
      for (size_t i = 0; i < vx.layout->groups[g].n_params; i++)
        ZT_EQ_STR(mx->params[vx.layout->groups[g].params[i]].name, my->params[vy.layout->groups[g].params[i]].name);
    }
    for (size_t i = 0; i < vx.layout->n_stores; i++) {
      /* whole-tensor parts (16-bit module weights) list params in manifest order, which
       * differs between sources: match them by name */
      size_t j = i;
      if (vx.layout->kind == ZCK_LAYOUT_WHOLE) {
        const char *name = mx->params[vx.layout->stores[i].param].name;
        for (j = 0; j < vy.layout->n_stores && strcmp(my->params[vy.layout->stores[j].param].name, name); j++) {}
        if (j == vy.layout->n_stores) ZT_FAIL("%s: part %d: %s missing", what, part, name);
      }
      const zck_store *sx = &vx.stores[i], *sy = &vy.stores[j];
      if (sx->numel != sy->numel || sx->dtype != sy->dtype) ZT_FAIL("%s: part %d store %zu: size or dtype", what, part, i);
      void *bx = ut_read_store(sx, sx->numel), *by = ut_read_store(sy, sy->numel);
      if (memcmp(bx, by, sx->numel * zck_dtype_size(sx->dtype))) ZT_FAIL("%s: part %d store %zu (%s) differs", what, part, i, sx->name);
      free(bx);
      free(by);
    }
  }
  zck_ds_view bx = zck_ds_buffers(x), by = zck_ds_buffers(y);
  ZT_ASSERT((bx.layout == NULL) == (by.layout == NULL));
  for (size_t i = 0; bx.layout && i < bx.layout->n_stores; i++) {
    void *p = ut_read_store(&bx.stores[i], bx.stores[i].numel), *q = ut_read_store(&by.stores[i], by.stores[i].numel);
    if (memcmp(p, q, bx.stores[i].numel * zck_dtype_size(bx.stores[i].dtype))) ZT_FAIL("%s: buffer %zu differs", what, i);
    free(p);
    free(q);
  }
  zck_ds_close(x);
  zck_ds_close(y);
}

/* The HDF5 container: byte for byte the reshard of the DeepSpeed source (every file of the
 * tag folder, `latest`): model states with lr_scheduler, counters, ds_config, module
 * metadata; optimizer states with the loss scaler and clip_grad. */
static int compare_h5(const char *tmp, const char *label, const char *ds, bool few) {
  char *h5 = rs_path("%s/%s.h5", tmp, label);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(ds, h5, &uo));
  int n = 0;
  for (int stage = 1; stage <= 3; stage++)
    for (uint32_t w = 1; w <= 4; w += 3) {
      if (few && w != (stage == 2 ? 1u : 4u)) continue;   /* one world size per stage */
      char *a = rs_path("%s/%s-ds-s%dw%u", tmp, label, stage, w), *b = rs_path("%s/%s-h5-s%dw%u", tmp, label, stage, w);
      zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
      o.to_stage = stage;
      o.to_world_size = w;
      ZT_OK(zck_reshard(ds, a, &o));
      ZT_OK(zck_reshard(h5, b, &o));
      char what[512];
      snprintf(what, sizeof what, "%s -> universal.h5 -> stage %d W %u", label, stage, w);
      char *ta = rs_path("%s/global_step2", a), *tb = rs_path("%s/global_step2", b);
      rs_same_tree(ta, tb, what);
      char *la = rs_path("%s/latest", a), *lb = rs_path("%s/latest", b);
      unsigned char *x, *y;
      size_t nx, ny;
      ZT_ASSERT(zt_read_file(la, &x, &nx) == 0 && zt_read_file(lb, &y, &ny) == 0);
      ZT_ASSERT(nx == ny && !memcmp(x, y, nx));
      free(x);
      free(y);
      free(ta);
      free(tb);
      free(la);
      free(lb);
      rs_sh("rm -rf '%s' '%s'", a, b);
      free(a);
      free(b);
      n++;
    }
  rs_sh("rm -f '%s'", h5);
  free(h5);
  return n;
}

/* An HF checkpoint-N/ folder holding a universal folder: its files come along. */
static void hf_folder(const char *tmp) {
  char *ds = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  char *hf = rs_path("%s/checkpoint-7", tmp);
  char *uc = rs_path("%s/global_step2_universal", hf);
  rs_sh("mkdir -p '%s'", hf);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  ZT_OK(zck_to_universal(ds, uc, &uo));
  rs_sh("cd '%s' && printf '{\"global_step\": 2}' > trainer_state.json && printf x > rng_state_0.pth && "
        "printf y > rng_state_1.pth && printf z > rng_state_2.pth && printf s > scheduler.pt", hf);
  const char *srcs[2] = {hf, uc};
  for (int i = 0; i < 2; i++) {
    char *out = rs_path("%s/hf-out%d", tmp, i);
    zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
    o.to_stage = 2;
    o.to_world_size = 2;
    ZT_OK(zck_reshard(srcs[i], out, &o));
    size_t n;
    char **v = rs_list(out, &n);
    static const char *want[] = {"global_step2", "latest", "rng_state_0.pth", "rng_state_1.pth", "scheduler.pt",
                                 "trainer_state.json"};
    if (n != 6) ZT_FAIL("%s: %zu entries, expected 6", out, n);
    for (size_t k = 0; k < n; k++) ZT_EQ_STR(v[k], want[k]);
    rs_free_list(v, n);
    /* the same checkpoint as from the DeepSpeed source */
    char *ref = rs_path("%s/hf-ref%d", tmp, i);
    ZT_OK(zck_reshard(ds, ref, &o));
    char *ta = rs_path("%s/global_step2", out), *tb = rs_path("%s/global_step2", ref);
    rs_same_tree(ta, tb, "HF checkpoint-N");
    free(ta);
    free(tb);
    free(ref);
    free(out);
  }
  /* a universal folder whose parent does not name it: no side files */
  char *lone = rs_path("%s/lone", tmp);
  rs_sh("mkdir -p '%s' && cp -r '%s' '%s/uc' && printf x > '%s/notes.txt'", lone, uc, lone, lone);
  char *out = rs_path("%s/lone-out", tmp);
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  o.to_world_size = 3;
  char *lu = rs_path("%s/uc", lone);
  ZT_OK(zck_reshard(lu, out, &o));
  char *notes = rs_path("%s/notes.txt", out);
  ZT_ASSERT(!rs_exists(notes));
  free(notes);
  free(lu);
  free(out);
  free(lone);
  free(uc);
  free(hf);
  free(ds);
}

/* path with /resume_state replaced by bytes (len 0: removed, and the root attributes
 * added since, unsaved_tied_parameters and exclude_frozen_parameters, with the digest that
 * covers them: a container as older zckpt wrote it), as HDF5 writes a plain uint8 dataset
 * (no `dtype` attribute, contiguous). */
static void set_resume_state(const char *path, const void *bytes, size_t len) {
  hid_t f = h5e_open(path);
  ZT_ASSERT(H5Ldelete(f, ZCK_H5U_RESUME_STATE, H5P_DEFAULT) >= 0);
  /* a container written before /resume_state (and its checksum table, which would refuse
   * the dataset made here as not the one written) */
  h5e_make_old(f);
  if (!len) {
    static const char *const newer[] = {"unsaved_tied_parameters", "exclude_frozen_parameters"};
    for (int i = 0; i < 2; i++) ZT_ASSERT(H5Adelete(f, newer[i]) >= 0);
  }
  if (len) {
    hsize_t n = len;
    hid_t sp = H5Screate_simple(1, &n, NULL);
    hid_t d = H5Dcreate2(f, ZCK_H5U_RESUME_STATE, H5T_STD_U8LE, sp, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    ZT_ASSERT(d >= 0 && H5Dwrite(d, H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes) >= 0);
    H5Dclose(d);
    H5Sclose(sp);
  }
  H5Fclose(f);
}

/* A pickled dict {key: value} with value a str, or a list of one str when list. */
static void pickled(zck__buf *b, const char *key, const char *value, bool list) {
  zck_pk_doc *d = zck_pk_doc_new();
  zck_pk *root = zck_pk_new_dict(d, 0), *v = zck_pk_new_str(d, value);
  if (list) {
    zck_pk *l = zck_pk_new_list(d);
    ZT_ASSERT(zck_pk_append(d, l, v));
    v = l;
  }
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, key), v));
  zck__buf_init(b);
  ZT_OK(zck_pickle_dump(root, b));
  zck_pk_doc_free(d);
}

/* An older container (no /resume_state, nor the newer root attributes): read, the target without lr_scheduler, loss
 * scaler or ds_config of the source. A malformed /resume_state: refused, nothing written. */
static void old_and_bad_containers(const char *tmp) {
  char *ds = zt_fixture("deepspeed/s2w2_fp16/ckpt");
  if (!rs_exists(ds)) {
    free(ds);
    return;
  }
  char *h5 = rs_path("%s/ob.h5", tmp), *work = rs_path("%s/ob-work.h5", tmp);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(ds, h5, &uo));
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  o.to_world_size = 3;
  /* the new container: the source's scheduler and dynamic loss scaler */
  char *out = rs_path("%s/ob-new", tmp);
  ZT_OK(zck_reshard(h5, out, &o));
  zck_ds_ckpt *c;
  zck_ds_write_opts wo;
  ZT_OK(zck_ds_open(out, NULL, &c));
  zck_ds_write_opts_from(c, &wo);
  ZT_ASSERT(wo.lr_scheduler && wo.loss_scaler && zck_pk_is_global(wo.loss_scaler, "deepspeed.runtime.fp16.loss_scaler",
                                                                  "DynamicLossScaler"));
  zck_ds_close(c);
  /* the old one */
  rs_sh("cp '%s' '%s'", h5, work);
  set_resume_state(work, NULL, 0);
  char *old = rs_path("%s/ob-old", tmp);
  ZT_OK(zck_reshard(work, old, &o));
  ZT_OK(zck_ds_open(old, NULL, &c));
  zck_ds_write_opts_from(c, &wo);
  ZT_ASSERT(!wo.lr_scheduler && wo.loss_scaler && zck_pk_is_global(wo.loss_scaler, "deepspeed.runtime.fp16.loss_scaler",
                                                                   "LossScaler"));
  zck_ds_close(c);
  same_states(out, old, "old container vs new");
  /* malformed ones */
  static const char garbage[] = "\x80\x02not a pickle";
  zck__buf b[4];
  zck__buf_init(&b[0]);
  zck__buf_append(&b[0], garbage, sizeof garbage - 1);
  pickled(&b[1], "clip_grad", "x", false);
  pickled(&b[2], "module_params", "nope", true);
  zck_pk_doc *d = zck_pk_doc_new();
  zck__buf_init(&b[3]);
  ZT_OK(zck_pickle_dump(zck_pk_new_int(d, 1), &b[3]));
  zck_pk_doc_free(d);
  static const char *const needles[4] = {"ob-work.h5:/resume_state", "/resume_state: clip_grad has the wrong type",
                                         "module_params does not list", "/resume_state: not a pickled dict"};
  for (int i = 0; i < 4; i++) {
    rs_sh("cp '%s' '%s'", h5, work);
    set_resume_state(work, b[i].data, b[i].len);
    char *bad = rs_path("%s/ob-bad%d", tmp, i);
    ZT_ERR(zck_reshard(work, bad, &o), ZCK_ERR_FORMAT, needles[i]);
    rs_nothing_left(bad);
    free(bad);
    zck__buf_free(&b[i]);
  }
  rs_sh("rm -rf '%s' '%s' '%s' '%s'", h5, work, out, old);
  free(old);
  free(out);
  free(work);
  free(h5);
  free(ds);
}

int main(void) {
  static const char *cases[] = {"s1w1_fp32", "s1w3_fp32", "s1w4_bf16", "s1w3_bf16_3groups", "s1w2_fp32_paramalign",
                                "s2w2_bf16", "s2w2_fp16", "s2w2_fp32_roundrobin", "s2w2_fp32_zeronumel",
                                "s2w3_bf16_paramalign", "s2w4_fp32_3groups", "s3w1_fp32", "s3w2_bf16", "s3w2_fp16",
                                "s3w3_bf16_subgroup100", "s3w4_fp32_3groups", "s3w4_bf16"};
  char *tmp = zt_tmpdir();
  int done = 0;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *rel = rs_path("deepspeed/%s/ckpt", cases[i]);
    char *ds = zt_fixture(rel);
    free(rel);
    if (!rs_exists(ds)) {
      fprintf(stderr, "fixture %s missing\n", cases[i]);
      free(ds);
      continue;
    }
    /* zckpt's universal folder, reached through its parent (latest_universal) */
    char *parent = rs_path("%s/%s-uc", tmp, cases[i]);
    char *uc = rs_path("%s/uc", parent);
    zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
    uo.inject_missing_state = 1;
    ZT_OK(zck_to_universal(ds, uc, &uo));
    done += compare_all(tmp, cases[i], ds, i % 2 ? parent : uc);
    done += compare_h5(tmp, cases[i], ds, false);
    rs_sh("rm -rf '%s'", parent);
    free(parent);
    free(uc);
    /* DeepSpeed's own universal folder, when committed */
    char *drel = rs_path("universal/%s", cases[i]);
    char *du = zt_fixture(drel);
    free(drel);
    if (rs_exists(du)) {
      char label[256];
      snprintf(label, sizeof label, "%s-ds_to_universal", cases[i]);
      done += compare_all(tmp, label, ds, du);
    }
    free(du);
    free(ds);
  }
  if (!done) zt_skip("no DeepSpeed fixtures");
  /* HF Trainer + PEFT (LoRA), saved with exclude_frozen_parameters: the container keeps the
   * tied alias whose source was not saved, and the None frozen entries (issue 15.1) */
  static const char *peft[] = {"s2w2_lora_tied_bf16", "s3w2_lora_tied_bf16", "s2w2_lora_untied_fp32",
                               "s3w2_lora_untied_fp32"};
  for (size_t i = 0; i < sizeof peft / sizeof peft[0]; i++) {
    char *rel = rs_path("hf_peft/%s/ckpt", peft[i]);
    char *ds = zt_fixture(rel);
    free(rel);
    if (rs_exists(ds)) done += compare_h5(tmp, peft[i], ds, true);
    free(ds);
  }
  hf_folder(tmp);
  old_and_bad_containers(tmp);
  printf("%d reshards from universal checkpoints equal to the DeepSpeed source's\n", done);
  free(tmp);
  return 0;
}
