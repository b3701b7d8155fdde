/* test_reshard_frozen.c: frozen parameters, tied aliases and buffers survive every stage
 * change. Real DeepSpeed checkpoints with a frozen param (frozen.weight, requires_grad
 * False, in no group), a tied alias (head.weight -> embed.weight) and buffers (float32
 * `shift`, int64 `counter` holding 2**24+1) at stages 1, 2 and 3 are resharded to every
 * stage (and from there to every stage again), at world sizes 1 and 3. Each output must
 * hold the frozen param with the source's 16-bit values bit for bit (stage 1 in the model
 * file's `module`, stage 2 in `module` and frozen_param_fragments, stage 3 in every rank's
 * frozen_param_fragments), still frozen and out of every group; the alias still tied; the
 * buffers equal. Through both universal formats too. */
#include "rs_util.h"
#include "../universal/ut_util.h"
#include "deepspeed/deepspeed.h"
#include "zck.h"

typedef struct frozen_ref {
  void *frozen;          /* frozen.weight, lp dtype */
  zck_dtype dtype;
  uint64_t numel;
  void *buffers[2];      /* shift, counter */
  size_t nbytes[2];
} frozen_ref;

static const char *buffer_names[2] = {"shift", "counter"};

static void *read_buffer(const zck_ds_ckpt *c, const char *name, size_t *nbytes) {
  const zck_model *m = zck_ds_model(c);
  int64_t b = zck_model_find_buffer(m, name);
  if (b < 0) ZT_FAIL("buffer %s missing", name);
  zck_ds_view v = zck_ds_buffers(c);
  ZT_ASSERT(v.layout);
  zck_dtype dt;
  void *p = ut_gather(v.layout, v.stores, (uint32_t)b, &dt);
  *nbytes = m->buffers[b].numel * zck_dtype_size(dt);
  return p;
}

/* The frozen param from the FROZEN part (and, stage 1/2, the same bytes in `module`). */
static void load(const char *path, frozen_ref *r, int *stage) {
  zck_ds_ckpt *c;
  ZT_OK(zck_ds_open(path, NULL, &c));
  const zck_model *m = zck_ds_model(c);
  *stage = zck_ds_info_of(c)->stage;
  int64_t p = zck_model_find_param(m, "frozen.weight");
  if (p < 0) ZT_FAIL("%s: frozen.weight missing", path);
  ZT_ASSERT(m->params[p].frozen && m->params[p].group < 0 && m->params[p].tied_to < 0);
  for (size_t g = 0; g < m->n_groups; g++)
    for (size_t i = 0; i < m->groups[g].n_params; i++) ZT_ASSERT(m->groups[g].params[i] != (uint32_t)p);
  int64_t head = zck_model_find_param(m, "head.weight"), embed = zck_model_find_param(m, "embed.weight");
  if (*stage <= 2 || head >= 0) {   /* DeepSpeed's stage-3 files name the alias only on rank 0 */
    ZT_ASSERT(head >= 0 && embed >= 0);
    ZT_EQ_INT(m->params[head].tied_to, embed);
  }
  zck_ds_view v;
  ZT_OK(zck_ds_get(c, ZCK_DS_FROZEN, &v));
  r->frozen = ut_gather(v.layout, v.stores, (uint32_t)p, &r->dtype);
  r->numel = m->params[p].numel;
  ZT_EQ_U64(r->numel, 121);
  if (*stage <= 2) {   /* the model file's module holds it too */
    zck_dtype dt;
    ZT_OK(zck_ds_get(c, ZCK_DS_LP, &v));
    void *lp = ut_gather(v.layout, v.stores, (uint32_t)p, &dt);
    ZT_EQ_INT(dt, r->dtype);
    ZT_ASSERT(!memcmp(lp, r->frozen, r->numel * zck_dtype_size(dt)));
    free(lp);
  }
  for (int b = 0; b < 2; b++) r->buffers[b] = read_buffer(c, buffer_names[b], &r->nbytes[b]);
  zck_ds_close(c);
}

static void same(const frozen_ref *a, const frozen_ref *b, const char *what) {
  if (a->dtype != b->dtype || a->numel != b->numel || memcmp(a->frozen, b->frozen, a->numel * zck_dtype_size(a->dtype)))
    ZT_FAIL("%s: frozen.weight differs", what);
  for (int i = 0; i < 2; i++)
    if (a->nbytes[i] != b->nbytes[i] || memcmp(a->buffers[i], b->buffers[i], a->nbytes[i]))
      ZT_FAIL("%s: buffer %s differs", what, buffer_names[i]);
}

static void free_ref(frozen_ref *r) {
  free(r->frozen);
  for (int i = 0; i < 2; i++) free(r->buffers[i]);
}

static void reshard(const char *src, const char *out, int stage, uint32_t w) {
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  o.to_stage = stage;
  o.to_world_size = w;
  ZT_OK(zck_reshard(src, out, &o));
}

int main(void) {
  static const char *cases[] = {"s1w2_bf16", "s2w3_bf16", "s3w2_bf16", "s1w3_fp32", "s3w3_fp32"};
  static const uint32_t worlds[] = {1, 3};
  char *tmp = zt_tmpdir();
  int done = 0;
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    char *rel = rs_path("deepspeed/%s/ckpt", cases[ci]);
    char *src = zt_fixture(rel);
    free(rel);
    if (!rs_exists(src)) { free(src); continue; }
    frozen_ref ref;
    int s0;
    load(src, &ref, &s0);
    /* through both universal formats */
    char *uc = rs_path("%s/%s-uc/uc", tmp, cases[ci]), *h5 = rs_path("%s/%s.h5", tmp, cases[ci]);
    zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
    uo.inject_missing_state = 1;
    ZT_OK(zck_to_universal(src, uc, &uo));
    uo.format = ZCK_UNIVERSAL_HDF5;
    ZT_OK(zck_to_universal(src, h5, &uo));
    const char *sources[3] = {src, uc, h5};
    for (int a = 1; a <= 3; a++)
      for (size_t wi = 0; wi < 2; wi++) {
        char *mid = rs_path("%s/%s-s%dw%u", tmp, cases[ci], a, worlds[wi]);
        for (int k = 0; k < 3; k++) {
          char *out = k ? rs_path("%s-via%d", mid, k) : strdup(mid);
          reshard(sources[k], out, a, worlds[wi]);
          frozen_ref got;
          int s;
          load(out, &got, &s);
          ZT_EQ_INT(s, a);
          char what[512];
          snprintf(what, sizeof what, "%s (stage %d) -> %s stage %d W %u", cases[ci], s0,
                   k == 0 ? "" : k == 1 ? "universal folder ->" : "universal.h5 ->", a, worlds[wi]);
          same(&ref, &got, what);
          free_ref(&got);
          if (k) rs_sh("rm -rf '%s'", out);
          free(out);
          done++;
        }
        /* and on to every stage again */
        for (int b = 1; b <= 3; b++) {
          char *out = rs_path("%s-s%d", mid, b);
          reshard(mid, out, b, 2);
          frozen_ref got;
          int s;
          load(out, &got, &s);
          char what[512];
          snprintf(what, sizeof what, "%s (stage %d) -> stage %d W %u -> stage %d W 2", cases[ci], s0, a, worlds[wi], b);
          same(&ref, &got, what);
          free_ref(&got);
          rs_sh("rm -rf '%s'", out);
          free(out);
          done++;
        }
        rs_sh("rm -rf '%s'", mid);
        free(mid);
      }
    free_ref(&ref);
    free(uc);
    free(h5);
    free(src);
  }
  if (!done) zt_skip("no DeepSpeed fixtures with frozen params");
  printf("%d reshards keep the frozen param, the tied alias and the buffers\n", done);
  free(tmp);
  return 0;
}
