/* test_ds_write_rank.c: the rank-only DeepSpeed writer (zck__ds_writer_create_rank) writes
 * exactly rank r's files (its optimizer states, its stage-3 model states, rank 0's
 * stage-1/2 model states), each byte for byte the full writer's, for stages 1-3 and
 * W = 1..4 (plus round-robin / alignment and an fp16 variant); binds no other rank's
 * store; creates nothing when abandoned; refuses a bad rank or a missing tag folder. */
#include "deepspeed/deepspeed.h"
#include "deepspeed/ds_writer.h"
#include "exec.h"
#include "plan.h"
#include "test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

/* A small model: two groups, a tied alias, a frozen param, an empty param, a buffer. */
static zck_model *make_model(zck_dtype lp) {
  zck_model *m = zck_model_new();
  uint32_t g0, g1, idx, wte = 0;
  ZT_OK(zck_model_add_group(m, &g0));
  ZT_OK(zck_model_add_group(m, &g1));
  ZT_OK(zck_model_group_set_float(m, g0, "lr", 1e-3));
  ZT_OK(zck_model_group_set_float(m, g1, "lr", 2e-3));
  ZT_OK(zck_model_group_set_float(m, g0, "weight_decay", 0.1));
  ZT_OK(zck_model_group_set_float(m, g1, "weight_decay", 0.0));
  struct { const char *name; int nd; int64_t a, b; int group; } ps[] = {
      {"wte.weight", 2, 37, 8, 0},  {"h.0.ln.weight", 1, 8, 0, 1}, {"h.0.attn.weight", 2, 8, 24, 0},
      {"h.0.attn.bias", 1, 24, 0, 1}, {"h.0.empty", 1, 0, 0, 1},  {"h.0.mlp.weight", 2, 8, 33, 0},
      {"h.0.frozen", 2, 5, 7, -1},  {"ln_f.bias", 1, 8, 0, 1},
  };
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
    int64_t sh[2] = {ps[i].a, ps[i].b};
    ZT_OK(zck_model_add_param(m, ps[i].name, ps[i].nd, sh, lp, &idx));
    if (i == 0) wte = idx;
    if (ps[i].group >= 0) ZT_OK(zck_model_group_add_param(m, (uint32_t)ps[i].group, idx));
    else zck_model_set_frozen(m, idx, true);
  }
  int64_t sh[2] = {37, 8};
  ZT_OK(zck_model_add_param(m, "lm_head.weight", 2, sh, lp, &idx));
  ZT_OK(zck_model_set_tied(m, idx, wte));
  int64_t bs = 6;
  ZT_OK(zck_model_add_buffer(m, "h.0.attn.mask", 1, &bs, ZCK_F32, &idx));
  return m;
}

/* Fills store id of `part` with bytes that depend on (part, id, element), in two writes
 * (second half first: ranges out of order, as threads write them). */
static void fill(const zck_store *st, int part, size_t id) {
  size_t es = zck_dtype_size(st->dtype);
  uint64_t n = st->numel;
  uint8_t *b = malloc(n * es + 1);
  ZT_ASSERT(b);
  for (uint64_t i = 0; i < n * es; i++) b[i] = (uint8_t)mix(((uint64_t)part << 56) ^ ((uint64_t)id << 32) ^ i);
  uint64_t h = n / 2;
  ZT_OK(st->write(st->ctx, b + h * es, h, n - h));
  if (h) ZT_OK(st->write(st->ctx, b, 0, h));
  free(b);
}

/* Which rank's file a store of a part belongs to (the model file 0 in stage 1/2). */
static uint32_t store_rank(const zck_ds_view *v, int part, size_t id) {
  if (part == ZCK_DS_LP) return 0;
  return (uint32_t)v->layout->stores[id].rank;
}

/* Fills every bound store; in a rank-only writer checks that exactly rank r's are bound. */
static void fill_all(zck_ds_writer *w, const zck_model *m, int stage, int64_t only) {
  for (int part = 0; part < ZCK_DS_PART_COUNT; part++) {
    zck_ds_view v;
    if (zck_ds_writer_get(w, (zck_ds_part)part, &v) != ZCK_OK) { zck_clear_error(); continue; }
    for (size_t id = 0; id < v.layout->n_stores; id++) {
      bool mine = only < 0 || store_rank(&v, part, id) == (uint32_t)only;
      ZT_EQ_INT(v.stores[id].kind != ZCK_STORE_UNBOUND, mine);
      if (mine) fill(&v.stores[id], part, id);
    }
  }
  for (uint32_t r = 0; r < zck_ds_writer_model_files(w); r++) {
    zck_ds_view v = zck_ds_writer_buffers(w, r);
    bool mine = only < 0 || (stage == 3 ? r == (uint32_t)only : only == 0);
    for (size_t b = 0; b < m->n_buffers; b++) {
      ZT_EQ_INT(v.stores[b].kind != ZCK_STORE_UNBOUND, mine);
      if (mine) fill(&v.stores[b], 100 + (int)r, b);
    }
  }
}

static char **list_dir(const char *dir, size_t *n) {
  DIR *d = opendir(dir);
  ZT_ASSERT(d);
  char **v = NULL;
  *n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    v = realloc(v, (*n + 1) * sizeof *v);
    v[(*n)++] = strdup(e->d_name);
  }
  closedir(d);
  return v;
}

static void free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

static bool same_file(const char *a, const char *b) {
  unsigned char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  ZT_EQ_INT(zt_read_file(a, &x, &nx), 0);
  ZT_EQ_INT(zt_read_file(b, &y, &ny), 0);
  bool same = nx == ny && !memcmp(x, y, nx);
  free(x);
  free(y);
  return same;
}

/* The name is rank r's file: zero_pp_rank_R_... (optimizer states, stage-3 model states),
 * or mp_rank_00_model_states.pt (stage 1/2: rank 0's). */
static bool is_rank_file(const char *name, uint32_t r) {
  const char *p = strstr(name, "zero_pp_rank_");
  if (!p) return r == 0 && !strcmp(name, "mp_rank_00_model_states.pt");
  return (uint32_t)strtoul(p + strlen("zero_pp_rank_"), NULL, 10) == r;
}

static void check_config(const char *tmp, const zck_model *m, const zck_ds_write_opts *o, const char *what) {
  char full[4096], full_tag[4200];
  snprintf(full, sizeof full, "%s/%s-full", tmp, what);
  snprintf(full_tag, sizeof full_tag, "%s/global_step7", full);
  zck_ds_writer *w = NULL;
  ZT_OK(zck_ds_writer_create(full, m, o, &w));
  fill_all(w, m, o->stage, -1);
  ZT_OK(zck_ds_writer_commit(w));
  zck_ds_writer_free(w);
  size_t nfull;
  char **files = list_dir(full_tag, &nfull);
  size_t seen = 0;
  for (uint32_t r = 0; r < o->world_size; r++) {
    char root[4200], tag[4300];
    snprintf(root, sizeof root, "%s/%s-rank%u", tmp, what, r);
    snprintf(tag, sizeof tag, "%s/global_step7", root);
    ZT_EQ_INT(mkdir(root, 0755), 0);
    ZT_EQ_INT(mkdir(tag, 0755), 0);
    ZT_OK(zck__ds_writer_create_rank(root, m, o, r, &w));
    fill_all(w, m, o->stage, r);
    ZT_OK(zck_ds_writer_commit(w));
    zck_ds_writer_free(w);
    /* exactly rank r's files, no `latest`, no temporary leftovers */
    size_t nr, nroot;
    char **mine = list_dir(tag, &nr), **top = list_dir(root, &nroot);
    ZT_EQ_INT(nroot, 1);
    size_t expect = 0;
    for (size_t i = 0; i < nfull; i++) expect += is_rank_file(files[i], r);
    ZT_EQ_INT(nr, expect);
    ZT_ASSERT(nr >= 1);
    for (size_t i = 0; i < nr; i++) {
      if (!is_rank_file(mine[i], r)) ZT_FAIL("%s rank %u wrote %s", what, r, mine[i]);
      char a[4500], b[4500];
      snprintf(a, sizeof a, "%s/%s", tag, mine[i]);
      snprintf(b, sizeof b, "%s/%s", full_tag, mine[i]);
      if (!same_file(a, b)) ZT_FAIL("%s rank %u: %s differs from the full writer's", what, r, mine[i]);
    }
    seen += nr;
    free_list(mine, nr);
    free_list(top, nroot);
  }
  ZT_EQ_INT(seen, nfull); /* the ranks' files together are the whole tag folder */
  fprintf(stderr, "  %s: %zu files, each rank's byte-identical\n", what, nfull);
  free_list(files, nfull);
}

static void check_errors(const char *tmp, const zck_model *m) {
  zck_ds_write_opts o = ZCK_DS_WRITE_OPTS_INIT;
  o.stage = 2;
  o.world_size = 2;
  o.tag = "global_step7";
  zck_ds_writer *w = NULL;
  char root[4200], tag[4300];
  snprintf(root, sizeof root, "%s/errors", tmp);
  snprintf(tag, sizeof tag, "%s/global_step7", root);
  ZT_EQ_INT(mkdir(root, 0755), 0);
  ZT_ERR(zck__ds_writer_create_rank(root, m, &o, 0, &w), ZCK_ERR_NOT_FOUND, "global_step7: no such folder");
  ZT_EQ_INT(mkdir(tag, 0755), 0);
  ZT_ERR(zck__ds_writer_create_rank(root, m, &o, 2, &w), ZCK_ERR_INVALID_ARG, "rank 2: the world size is 2");
  /* abandoned: nothing stays behind */
  ZT_OK(zck__ds_writer_create_rank(root, m, &o, 1, &w));
  zck_ds_writer_free(w);
  size_t n;
  char **v = list_dir(tag, &n);
  ZT_EQ_INT(n, 0);
  free_list(v, n);
  /* a plan into another rank's store fails with an error, not a crash */
  ZT_OK(zck__ds_writer_create_rank(root, m, &o, 1, &w));
  zck_ds_view dst;
  ZT_OK(zck_ds_writer_get(w, ZCK_DS_FP32, &dst));
  uint64_t *numel = calloc(m->n_params + 1, sizeof *numel);
  zck_model_numels(m, numel);
  zck_layout *whole = NULL;
  ZT_OK(zck_layout_whole(m->n_params, numel, NULL, m->n_params, &whole));
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.allow_missing = true;
  zck_plan *p = NULL;
  ZT_OK(zck_plan_build(whole, dst.layout, &po, &p));
  float *zeros = calloc(4096, sizeof *zeros);
  zck_store *src = calloc(m->n_params + 1, sizeof *src);
  for (size_t i = 0; i < m->n_params; i++) src[i] = zck_store_memory(zeros, ZCK_F32, numel[i], "zeros");
  zck_exec_job job = {p, src, dst.stores, NULL};
  ZT_ERR(zck_exec_run(&job, 1, NULL), ZCK_ERR_INVALID_ARG, "not bound");
  zck_ds_writer_free(w);
  zck_plan_free(p);
  zck_layout_free(whole);
  free(numel);
  free(zeros);
  free(src);
}

int main(void) {
  char *tmp = zt_tmpdir();
  zck_model *m = make_model(ZCK_BF16);
  for (int stage = 1; stage <= 3; stage++)
    for (uint32_t w = 1; w <= 4; w++) {
      zck_ds_write_opts o = ZCK_DS_WRITE_OPTS_INIT;
      o.stage = stage;
      o.world_size = w;
      o.tag = "global_step7";
      o.global_steps = 7;
      o.step = 7;
      o.sub_group_size = stage == 3 ? 100 : 0; /* several sub-groups */
      char what[64];
      snprintf(what, sizeof what, "s%dw%u", stage, w);
      check_config(tmp, m, &o, what);
      if (stage <= 2 && w == 3) { /* the layout switches of stage 1/2 */
        o.round_robin = true;
        o.param_align = 2;
        snprintf(what, sizeof what, "s%dw%u-rr", stage, w);
        check_config(tmp, m, &o, what);
      }
      if (w == 2) { /* int step, no optimizer state */
        o.step_is_tensor = false;
        o.has_optimizer_state = false;
        snprintf(what, sizeof what, "s%dw%u-noopt", stage, w);
        check_config(tmp, m, &o, what);
      }
    }
  zck_model_free(m);
  m = make_model(ZCK_F16); /* no bf16_ prefix */
  for (int stage = 1; stage <= 3; stage += 2) {
    zck_ds_write_opts o = ZCK_DS_WRITE_OPTS_INIT;
    o.stage = stage;
    o.world_size = 3;
    o.tag = "global_step7";
    char what[64];
    snprintf(what, sizeof what, "fp16-s%d", stage);
    check_config(tmp, m, &o, what);
  }
  check_errors(tmp, m);
  zck_model_free(m);
  free(tmp);
  printf("ok\n");
  return 0;
}
