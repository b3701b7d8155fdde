/* test_reshard_roundtrip.c: reshard W -> W' -> W and stage a -> b -> a returns every state
 * tensor (fp32 master, exp_avg, exp_avg_sq) bit for bit, for every stage in {1,2,3} and
 * world size in {1,2,3,4,8}, starting from real DeepSpeed checkpoints; the intermediate
 * checkpoint holds the same state, and consolidates to the same bytes as its source; the
 * same from the HDF5 universal container (to-universal --format hdf5, then reshard). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "deepspeed/deepspeed.h"
#include "test.h"

typedef struct state {
  float *v[3];          /* fp32, exp_avg, exp_avg_sq, every trainable param concatenated */
  uint64_t n;
  int64_t step, global_steps;
} state;

static const zck_model *sort_model;
static int by_name(const void *a, const void *b) {
  return strcmp(sort_model->params[*(const uint32_t *)a].name, sort_model->params[*(const uint32_t *)b].name);
}

/* Gathers a part of every trainable param into one float array, params sorted by name
 * (sources may order their manifests differently). */
static void gather(const zck_ds_ckpt *c, zck_ds_part part, float **out, uint64_t *n_out) {
  const zck_model *m = zck_ds_model(c);
  zck_ds_view v;
  ZT_OK(zck_ds_get(c, part, &v));
  uint32_t *params = malloc((m->n_params + 1) * sizeof *params);
  uint64_t *numel = malloc((m->n_params + 1) * sizeof *numel);
  size_t k = 0;
  uint64_t total = 0;
  for (size_t p = 0; p < m->n_params; p++) {
    numel[p] = m->params[p].numel;
    if (zck_layout_param_covered(v.layout, (uint32_t)p) == numel[p] && numel[p] && !m->params[p].frozen && m->params[p].tied_to < 0) {
      params[k++] = (uint32_t)p;
      total += numel[p];
    }
  }
  sort_model = m;
  qsort(params, k, sizeof *params, by_name);
  float *buf = calloc(total ? total : 1, sizeof *buf);
  zck_store *dst = calloc(k ? k : 1, sizeof *dst);
  uint64_t off = 0;
  for (size_t i = 0; i < k; i++) {
    dst[i] = zck_store_memory(buf + off, ZCK_F32, numel[params[i]], "gathered");
    off += numel[params[i]];
  }
  zck_layout *whole;
  zck_plan *plan;
  ZT_OK(zck_layout_whole(m->n_params, numel, params, k, &whole));
  ZT_OK(zck_plan_build(v.layout, whole, NULL, &plan));
  ZT_OK(zck_exec_plan(plan, v.stores, dst, NULL, NULL));
  zck_plan_free(plan);
  zck_layout_free(whole);
  free(dst);
  free(params);
  free(numel);
  *out = buf;
  *n_out = total;
}

static void load_state(const char *path, state *s) {
  zck_ds_ckpt *c;
  ZT_OK(zck_ds_open(path, NULL, &c));
  const zck_ds_info *in = zck_ds_info_of(c);
  ZT_ASSERT(in->has_optimizer_state);
  gather(c, ZCK_DS_FP32, &s->v[0], &s->n);
  uint64_t n;
  gather(c, ZCK_DS_EXP_AVG, &s->v[1], &n);
  ZT_EQ_U64(n, s->n);
  gather(c, ZCK_DS_EXP_AVG_SQ, &s->v[2], &n);
  ZT_EQ_U64(n, s->n);
  s->step = (int64_t)in->step;
  s->global_steps = in->global_steps;
  zck_ds_close(c);
}

static void free_state(state *s) { for (int i = 0; i < 3; i++) free(s->v[i]); }

static void same_state(const state *a, const state *b, const char *what) {
  static const char *names[3] = {"fp32", "exp_avg", "exp_avg_sq"};
  if (a->n != b->n) ZT_FAIL("%s: %llu vs %llu elements", what, (unsigned long long)a->n, (unsigned long long)b->n);
  for (int i = 0; i < 3; i++)
    if (memcmp(a->v[i], b->v[i], a->n * sizeof(float))) ZT_FAIL("%s: %s differs", what, names[i]);
  ZT_EQ_INT(a->step, b->step);
  ZT_EQ_INT(a->global_steps, b->global_steps);
}

static void same_file(const char *a, const char *b) {
  unsigned char *x, *y;
  size_t nx, ny;
  ZT_ASSERT(zt_read_file(a, &x, &nx) == 0 && zt_read_file(b, &y, &ny) == 0);
  if (nx != ny || memcmp(x, y, nx)) ZT_FAIL("%s and %s differ", a, b);
  free(x);
  free(y);
}

int main(void) {
  static const char *sources[] = {"s2w2_fp32_roundrobin", "s3w2_bf16", "s1w3_fp32", "s3w3_bf16_subgroup100", "s2w4_fp32_3groups"};
  static const uint32_t worlds[] = {1, 2, 3, 4, 8};
  char *tmp = zt_tmpdir();
  int done = 0;
  for (size_t si = 0; si < sizeof sources / sizeof sources[0]; si++) {
    char rel[256], *src;
    snprintf(rel, sizeof rel, "deepspeed/%s/ckpt", sources[si]);
    src = zt_fixture(rel);
    struct stat st;
    if (stat(src, &st) != 0) { fprintf(stderr, "fixture %s missing\n", rel); free(src); continue; }
    zck_ds_ckpt *c;
    ZT_OK(zck_ds_open(src, NULL, &c));
    int src_stage = zck_ds_info_of(c)->stage;
    uint32_t src_world = zck_ds_info_of(c)->world_size;
    uint64_t src_sub = zck_ds_info_of(c)->sub_group_size;
    zck_ds_close(c);
    state orig;
    load_state(src, &orig);
    char ref[4096];
    snprintf(ref, sizeof ref, "%s/%s-consolidated.safetensors", tmp, sources[si]);
    ZT_OK(zck_consolidate(src, ref, NULL));
    for (int stage = 1; stage <= 3; stage++) {
      for (size_t wi = 0; wi < sizeof worlds / sizeof worlds[0]; wi++) {
        char a[4096], b[4096], ca[4096];
        snprintf(a, sizeof a, "%s/%s-s%dw%u", tmp, sources[si], stage, worlds[wi]);
        snprintf(b, sizeof b, "%s/back", a);
        zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
        o.to_stage = stage;
        o.to_world_size = worlds[wi];
        o.sub_group_size = stage == 3 ? 200 : 0; /* several sub-groups on the way */
        ZT_OK(zck_reshard(src, a, &o));
        zck_reshard_opts back = ZCK_RESHARD_OPTS_INIT;
        back.to_stage = src_stage;
        back.to_world_size = src_world;
        back.sub_group_size = src_stage == 3 ? src_sub : 0;
        ZT_OK(zck_reshard(a, b, &back));
        state mid, rt;
        load_state(a, &mid);
        load_state(b, &rt);
        char what[512];
        snprintf(what, sizeof what, "%s -> stage %d W %u", sources[si], stage, worlds[wi]);
        same_state(&orig, &mid, what);
        snprintf(what, sizeof what, "%s -> stage %d W %u -> back", sources[si], stage, worlds[wi]);
        same_state(&orig, &rt, what);
        free_state(&mid);
        free_state(&rt);
        snprintf(ca, sizeof ca, "%s/consolidated.safetensors", a);
        ZT_OK(zck_consolidate(b, ca, NULL));
        same_file(ref, ca);
        done++;
      }
    }
    /* through the HDF5 universal container: every stage and a few world sizes */
    char h5[4096];
    snprintf(h5, sizeof h5, "%s/%s-universal.h5", tmp, sources[si]);
    zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
    uo.format = ZCK_UNIVERSAL_HDF5;
    ZT_OK(zck_to_universal(src, h5, &uo));
    for (int stage = 1; stage <= 3; stage++) {
      for (uint32_t w = 1; w <= 4; w += 3) {
        char a[4096], what[512];
        snprintf(a, sizeof a, "%s/%s-h5-s%dw%u", tmp, sources[si], stage, w);
        zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
        o.to_stage = stage;
        o.to_world_size = w;
        ZT_OK(zck_reshard(h5, a, &o));
        state mid;
        load_state(a, &mid);
        snprintf(what, sizeof what, "%s -> universal.h5 -> stage %d W %u", sources[si], stage, w);
        same_state(&orig, &mid, what);
        free_state(&mid);
        done++;
      }
    }
    free_state(&orig);
    free(src);
  }
  printf("%d reshard round trips bit-exact\n", done);
  if (!done) zt_skip("no DeepSpeed fixtures");
  free(tmp);
  return 0;
}
