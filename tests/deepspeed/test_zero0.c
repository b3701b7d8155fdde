/* test_zero0.c: ZeRO-0 checkpoints (tests/fixtures/deepspeed/s0w*; no optimizer files, the
 * optimizer state inside mp_rank_00_model_states.pt) beyond what every fixture gets from
 * test_ds_describe (names, groups, masters == the live engine's), test_ds_roundtrip
 * (reshard into stages 1-3) and test_consolidate_fixtures (== live_fp32.safetensors):
 *   - consolidate equals live_fp32.safetensors, the live engine's masters saved beside the
 *     checkpoint, read as a file (not only its hashes);
 *   - damage: a flipped byte in an fp32 master is caught on read (consolidate fails, one
 *     line naming the file; verify says DAMAGED), a truncated model file is refused by
 *     open with one line naming it; no output is left behind;
 *   - reshard into stage 2 carries FP16_UnfusedOptimizer's step (one ahead) with zckpt_step_ahead,
 *     also through DeepSpeed's universal folder of that reshard, and (fp16) its dynamic loss
 *     scale as the DynamicLossScaler a ZeRO-2 file holds;
 *   - to-universal --format hdf5, then reshard of the container: the direct reshard's files;
 *   - to-universal into DeepSpeed's folder layout (the equivalent ZeRO-1 checkpoint's): verify
 *     finds it clean, its reshard holds the direct reshard's state;
 *   - reshard without --to-stage is refused with one line. */
#include "ds_test_util.h"
#include "safetensors/safetensors.h"
#include "zck.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *MODEL = "mp_rank_00_model_states.pt";

static void sh(const char *cmd) {
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}

static bool exists(const char *p) {
  struct stat sb;
  return stat(p, &sb) == 0;
}

/* ours has every tensor of live_fp32.safetensors, same dtype and bytes. */
static void equals_live(const char *cs, const char *ours_path, const char *live_path) {
  zck_hf_checkpoint *a = NULL, *b = NULL;
  ZT_OK(zck_hf_open(ours_path, &a));
  ZT_OK(zck_hf_open(live_path, &b));
  ZT_ASSERT(zck_hf_count(b) > 0);
  for (size_t i = 0; i < zck_hf_count(b); i++) {
    const zck_hf_tensor *y = zck_hf_tensor_at(b, i), *x = zck_hf_find(a, y->t->name);
    if (!x) ZT_FAIL("%s: %s missing from the consolidation", cs, y->t->name);
    ZT_EQ_INT(x->t->dtype, y->t->dtype);
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

/* The file offset of store 0 of `part`: the first trainable param's master (FP32), or the
 * first module entry's 16-bit tensor (LP). */
static uint64_t part_offset(const char *ckpt, zck_ds_part part, uint64_t *nbytes) {
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(ckpt, NULL, &c));
  zck_ds_view v;
  ZT_OK(zck_ds_get(c, part, &v));
  ZT_ASSERT(v.layout->n_stores > 0);
  uint64_t off = v.stores[0].base;
  *nbytes = v.layout->stores[0].numel * zck_dtype_size(v.stores[0].dtype);
  zck_ds_close(c);
  return off;
}

/* Two DeepSpeed checkpoints hold the same state: counters, step, and every param's fp32
 * master, Adam moments and 16-bit copy, every buffer, element for element. */
static void same_state(const char *cs, const char *a_path, const char *b_path) {
  zck_ds_ckpt *a = NULL, *b = NULL;
  ZT_OK(zck_ds_open(a_path, NULL, &a));
  ZT_OK(zck_ds_open(b_path, NULL, &b));
  const zck_ds_info *ai = zck_ds_info_of(a), *bi = zck_ds_info_of(b);
  ZT_ASSERT(ai->stage == bi->stage && ai->world_size == bi->world_size && ai->global_steps == bi->global_steps &&
            ai->skipped_steps == bi->skipped_steps && ai->step == bi->step && ai->step_ahead == bi->step_ahead &&
            ai->clip_grad == bi->clip_grad);
  const zck_model *am = zck_ds_model(a), *bm = zck_ds_model(b);
  ZT_EQ_U64(am->n_params, bm->n_params);
  static const zck_ds_part parts[4] = {ZCK_DS_FP32, ZCK_DS_EXP_AVG, ZCK_DS_EXP_AVG_SQ, ZCK_DS_LP};
  for (int k = 0; k < 4; k++) {
    zck_ds_view va, vb;
    ZT_OK(zck_ds_get(a, parts[k], &va));
    ZT_OK(zck_ds_get(b, parts[k], &vb));
    for (uint32_t p = 0; p < am->n_params; p++) {
      const zck_param *pa = &am->params[p];
      int64_t q = zck_model_find_param(bm, pa->name);
      ZT_ASSERT(q >= 0 && bm->params[q].numel == pa->numel && bm->params[q].frozen == pa->frozen);
      if (k < 3 && (pa->frozen || pa->tied_to >= 0)) continue;
      if (k == 3 && pa->tied_to >= 0) continue;
      zck_dtype dt = k == 3 ? pa->dtype : ZCK_F32;
      void *x = zt_ds_read_param(&va, am, p, dt), *y = zt_ds_read_param(&vb, bm, (uint32_t)q, dt);
      ZT_ASSERT(x && y);
      if (memcmp(x, y, pa->numel * zck_dtype_size(dt))) ZT_FAIL("%s: %s part %d differs", cs, pa->name, k);
      free(x);
      free(y);
    }
  }
  zck_ds_view ba = zck_ds_buffers(a), bb = zck_ds_buffers(b);
  ZT_EQ_U64(am->n_buffers, bm->n_buffers);
  for (uint32_t i = 0; i < am->n_buffers; i++) {
    void *x = zt_ds_read_buffer(&ba, am, i, am->buffers[i].dtype), *y = zt_ds_read_buffer(&bb, bm, i, bm->buffers[i].dtype);
    ZT_ASSERT(x && y && !memcmp(x, y, am->buffers[i].numel * zck_dtype_size(am->buffers[i].dtype)));
    free(x);
    free(y);
  }
  zck_ds_close(a);
  zck_ds_close(b);
}

static void check_case(const char *cs, const char *tmp) {
  char *ckpt = zt_ds_ckpt_path(cs), *live = zt_fixture("deepspeed"), *out = NULL, *cmd = NULL, *copy = NULL;
  char *lp = NULL;
  if (asprintf(&lp, "%s/%s/live_fp32.safetensors", live, cs) < 0) abort();
  if (!exists(lp)) ZT_FAIL("%s: live_fp32.safetensors missing", cs);

  /* consolidate == the live masters, bit for bit */
  if (asprintf(&out, "%s/%s.safetensors", tmp, cs) < 0) abort();
  ZT_OK(zck_consolidate(ckpt, out, NULL));
  equals_live(cs, out, lp);
  free(out);

  /* reshard into stage 2 at W 3: FP16_UnfusedOptimizer's step (one ahead of global_steps:
   * it steps once when built) is carried and said in zckpt_step_ahead, so the strict step
   * check still reads the output */
  zck_ds_ckpt *src = NULL, *rs = NULL;
  ZT_OK(zck_ds_open(ckpt, NULL, &src));
  if (asprintf(&out, "%s/%s-s2w3", tmp, cs) < 0) abort();
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_stage = 2;
  ro.to_world_size = 3;
  ZT_OK(zck_reshard(ckpt, out, &ro));
  ZT_OK(zck_ds_open(out, NULL, &rs));
  const zck_ds_info *si = zck_ds_info_of(src), *ri = zck_ds_info_of(rs);
  bool unfused = strstr(cs, "bf16") || strstr(cs, "fp16");  /* FP16_UnfusedOptimizer */
  ZT_EQ_INT(si->step_ahead, unfused);
  ZT_EQ_INT(ri->step_ahead, unfused);
  ZT_ASSERT(ri->step == si->step && ri->step == (double)(ri->global_steps + unfused));
  ZT_EQ_INT(ri->stage, 2);
  ZT_EQ_INT(ri->world_size, 3);
  /* fp16: FP16_UnfusedOptimizer's dynamic loss scale (saved as loose keys) becomes the
   * DynamicLossScaler a ZeRO-2 file holds, at the saved scale; bf16 / fp32: a static one */
  {
    bool fp16 = strstr(cs, "fp16") != NULL;
    const zck_pk *ls = zck_ds_loss_scaler(rs), *st = ls && ls->kind == ZCK_PK_OBJECT ? ls->u.obj.state : NULL;
    ZT_ASSERT(zck_pk_is_global(ls, "deepspeed.runtime.fp16.loss_scaler", fp16 ? "DynamicLossScaler" : "LossScaler"));
    const zck_pk *dyn = zck_pk_dict_get(st, "dynamic");
    ZT_ASSERT(dyn && dyn->kind == ZCK_PK_BOOL && dyn->u.b == fp16);
    double cur = 0, want = fp16 ? 256 : 1;   /* the fixture's initial_scale_power 8, no overflow */
    ZT_ASSERT(zck_pk_as_double(zck_pk_dict_get(st, "cur_scale"), &cur) && cur == want);
    int64_t it = -1;
    ZT_ASSERT(!fp16 || (zck_pk_as_int(zck_pk_dict_get(st, "cur_iter"), &it) && it == ri->global_steps));
  }
  zck_ds_close(rs);
  zck_ds_close(src);

  /* ... and through DeepSpeed's universal folder of that reshard: the carried model file
   * says zckpt_step_ahead, and the reshard of the folder keeps it (its step.pt is one ahead) */
  {
    char *uvd = NULL, *out_u = NULL;
    if (asprintf(&uvd, "%s/%s-s2w3-uv", tmp, cs) < 0 || asprintf(&out_u, "%s/%s-s2w3-uv-s1w2", tmp, cs) < 0) abort();
    zck_universal_opts uvo = ZCK_UNIVERSAL_OPTS_INIT;
    uvo.inject_missing_state = 1;   /* ZeRO-0's model file has no universal_checkpoint_info */
    ZT_OK(zck_to_universal(out, uvd, &uvo));
    zck_reshard_opts ro2 = ZCK_RESHARD_OPTS_INIT;
    ro2.to_stage = 1;
    ro2.to_world_size = 2;
    ZT_OK(zck_reshard(uvd, out_u, &ro2));
    zck_ds_ckpt *ru = NULL;
    ZT_OK(zck_ds_open(out_u, NULL, &ru));
    const zck_ds_info *ui = zck_ds_info_of(ru);
    ZT_EQ_INT(ui->step_ahead, unfused);
    ZT_ASSERT(ui->step == (double)(ui->global_steps + unfused));
    zck_ds_close(ru);
    free(uvd);
    free(out_u);
  }

  /* DeepSpeed's universal folder of the ZeRO-0 checkpoint itself (what ds_to_universal
   * writes for the equivalent ZeRO-1 one): verify finds it clean, and its reshard holds the
   * direct reshard's state (the bytes differ only in how the carried pickles share strings) */
  {
    char *uvd = NULL, *out_u = NULL;
    if (asprintf(&uvd, "%s/%s-uv", tmp, cs) < 0 || asprintf(&out_u, "%s/%s-uv-s2w3", tmp, cs) < 0) abort();
    ZT_OK(zck_to_universal(ckpt, uvd, NULL));
    zck_verify_report *vr = NULL;
    ZT_OK(zck_verify(uvd, NULL, &vr));
    ZT_ASSERT(vr && vr->result == ZCK_VERIFY_CLEAN);
    zck_verify_report_free(vr);
    ZT_OK(zck_reshard(uvd, out_u, &ro));
    same_state(cs, out, out_u);
    free(uvd);
    free(out_u);
  }

  /* through zckpt's HDF5 container: the reshard of the container is the direct reshard, byte
   * for byte (FP16_UnfusedOptimizer's step_ahead carried in its resume state) */
  char *h5 = NULL, *out_h = NULL;
  if (asprintf(&h5, "%s/%s.h5", tmp, cs) < 0 || asprintf(&out_h, "%s/%s-h5-s2w3", tmp, cs) < 0) abort();
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(ckpt, h5, &uo));
  ZT_ERR(zck_reshard(h5, out_h, NULL), ZCK_ERR_INVALID_ARG, "pass --to-stage");
  ZT_OK(zck_reshard(h5, out_h, &ro));
  if (asprintf(&cmd, "diff -r '%s' '%s' >/dev/null", out, out_h) < 0) abort();
  sh(cmd);
  free(cmd);
  free(h5);
  free(out_h);
  free(out);

  /* refused jobs: one line, nothing written */
  if (asprintf(&out, "%s/%s-rs", tmp, cs) < 0) abort();
  ZT_ERR(zck_reshard(ckpt, out, NULL), ZCK_ERR_INVALID_ARG, "pass --to-stage");
  ZT_ASSERT(!exists(out));
  free(out);

  /* a flipped byte in a master: caught by the record check as it is read */
  if (asprintf(&copy, "%s/%s-flip", tmp, cs) < 0) abort();
  if (asprintf(&cmd, "cp -r '%s' '%s'", ckpt, copy) < 0) abort();
  sh(cmd);
  free(cmd);
  char *model = NULL;
  if (asprintf(&model, "%s/global_step2/%s", copy, MODEL) < 0) abort();
  uint64_t nb = 0, off = part_offset(copy, ZCK_DS_FP32, &nb);
  FILE *f = fopen(model, "r+b");
  ZT_ASSERT(f && fseek(f, (long)(off + nb / 2), SEEK_SET) == 0);
  int ch = fgetc(f);
  ZT_ASSERT(ch != EOF && fseek(f, (long)(off + nb / 2), SEEK_SET) == 0);
  fputc(ch ^ 0x10, f);
  fclose(f);
  if (asprintf(&out, "%s/%s-flip.safetensors", tmp, cs) < 0) abort();
  zck_status s = zck_consolidate(copy, out, NULL);
  ZT_ASSERT(s != ZCK_OK);
  ZT_ASSERT(strstr(zck_last_error(), MODEL) && !strchr(zck_last_error(), '\n'));
  ZT_ASSERT(!exists(out));
  free(out);
  zck_verify_report *r = NULL;
  ZT_EQ_INT(zck_verify(copy, NULL, &r), ZCK_ERR_DAMAGED);
  ZT_ASSERT(r && r->result == ZCK_VERIFY_DAMAGED);
  zck_verify_report_free(r);

  /* a flipped byte in a 16-bit module tensor (not a master: only the universal folder's
   * rebuilt model file reads it) is caught as it is copied; nothing is written */
  if (unfused) {
    char *lpc = NULL, *lpm = NULL, *uvd = NULL;
    if (asprintf(&lpc, "%s/%s-lpflip", tmp, cs) < 0 || asprintf(&lpm, "%s/global_step2/%s", lpc, MODEL) < 0 ||
        asprintf(&uvd, "%s/%s-lpflip-uv", tmp, cs) < 0 || asprintf(&cmd, "cp -r '%s' '%s'", ckpt, lpc) < 0)
      abort();
    sh(cmd);
    free(cmd);
    uint64_t lnb = 0, loff = part_offset(lpc, ZCK_DS_LP, &lnb);
    FILE *g = fopen(lpm, "r+b");
    ZT_ASSERT(g && fseek(g, (long)loff, SEEK_SET) == 0);
    int c0 = fgetc(g);
    ZT_ASSERT(c0 != EOF && fseek(g, (long)loff, SEEK_SET) == 0);
    fputc(c0 ^ 0x01, g);
    fclose(g);
    ZT_ASSERT(zck_to_universal(lpc, uvd, NULL) != ZCK_OK);
    ZT_ASSERT(strstr(zck_last_error(), MODEL) && !strchr(zck_last_error(), '\n'));
    ZT_ASSERT(!exists(uvd));
    free(lpc);
    free(lpm);
    free(uvd);
  }

  /* a truncated model file: open refuses it, naming it */
  if (asprintf(&cmd, "truncate -s %llu '%s'", (unsigned long long)(off + nb / 2), model) < 0) abort();
  sh(cmd);
  free(cmd);
  zck_ds_ckpt *c = NULL;
  s = zck_ds_open(copy, NULL, &c);
  ZT_ASSERT(s != ZCK_OK && !c);
  ZT_ASSERT(strstr(zck_last_error(), MODEL) && !strchr(zck_last_error(), '\n'));
  fprintf(stderr, "  %s: ok (truncated: %s)\n", cs, zck_last_error());
  free(model);
  free(copy);
  free(lp);
  free(live);
  free(ckpt);
}

int main(void) {
  size_t n;
  char **cases = zt_ds_cases(&n);
  char *tmp = zt_tmpdir();
  int done = 0;
  for (size_t i = 0; i < n; i++)
    if (!strncmp(cases[i], "s0", 2)) {
      check_case(cases[i], tmp);
      done++;
    }
  zt_ds_free_cases(cases, n);
  free(tmp);
  if (!done) zt_skip("no ZeRO-0 fixtures (tests/fixtures/deepspeed/s0w*)");
  return 0;
}
