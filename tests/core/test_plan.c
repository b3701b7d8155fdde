/* test_plan.c: layout intersection, merging, splitting, slicing; and round trips
 * (random layouts -> plan -> execute in memory -> every element where it belongs, padding
 * untouched). */
#include "exec.h"
#include "plan.h"
#include "test.h"

#include <stdlib.h>

static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

static float val(uint32_t p, uint64_t e) { return (float)(p * 100000 + e + 1); }
#define SENTINEL (-7.0)

static void expect_ext(const zck_plan *p, size_t i, uint32_t ss, uint64_t so, uint32_t ds, uint64_t dof, uint64_t n) {
  ZT_ASSERT(i < p->n);
  const zck_extent *e = &p->ext[i];
  if (e->src_store != ss || e->src_off != so || e->dst_store != ds || e->dst_off != dof || e->count != n)
    ZT_FAIL("extent %zu = {%u:%llu -> %u:%llu x %llu}, expected {%u:%llu -> %u:%llu x %llu}", i, e->src_store,
            (unsigned long long)e->src_off, e->dst_store, (unsigned long long)e->dst_off, (unsigned long long)e->count,
            ss, (unsigned long long)so, ds, (unsigned long long)dof, (unsigned long long)n);
}

static void test_hand(void) {
  /* ZeRO-2 W=2, params 5 and 3 (P=4) -> whole tensors */
  uint64_t numel[] = {5, 3};
  uint32_t g[] = {0, 1};
  zck_group_spec gs = {g, 2, 0};
  zck_layout *src, *dst, *flat1;
  ZT_OK(zck_layout_zero12(2, numel, &gs, 1, 2, 1, &src));
  ZT_OK(zck_layout_whole(2, numel, NULL, 0, &dst));
  zck_plan *p;
  ZT_OK(zck_plan_build(src, dst, NULL, &p));
  ZT_EQ_INT(p->n, 3);
  ZT_EQ_U64(p->total, 8);
  expect_ext(p, 0, 0, 0, 0, 0, 4);
  expect_ext(p, 1, 1, 0, 0, 4, 1);
  expect_ext(p, 2, 1, 1, 1, 0, 3);
  zck_plan_free(p);

  /* by destination */
  zck_plan_opts o = ZCK_PLAN_OPTS_INIT;
  o.order = ZCK_PLAN_BY_DST;
  ZT_OK(zck_plan_build(src, dst, &o, &p));
  expect_ext(p, 0, 0, 0, 0, 0, 4);
  expect_ext(p, 2, 1, 1, 1, 0, 3);
  zck_plan_free(p);

  /* to one flat group (W=1): the two pieces of param 0 cannot merge (different source
   * stores), param 0's tail and param 1 are contiguous in both: merged */
  ZT_OK(zck_layout_flat(2, numel, &gs, 1, 0, 1, &flat1));
  ZT_OK(zck_plan_build(src, flat1, NULL, &p));
  ZT_EQ_INT(p->n, 2);
  expect_ext(p, 0, 0, 0, 0, 0, 4);
  expect_ext(p, 1, 1, 0, 0, 4, 4);
  zck_plan_free(p);
  o = (zck_plan_opts)ZCK_PLAN_OPTS_INIT;
  o.merge = false;
  ZT_OK(zck_plan_build(src, flat1, &o, &p));
  ZT_EQ_INT(p->n, 3);
  zck_plan_free(p);

  /* splitting */
  o = (zck_plan_opts)ZCK_PLAN_OPTS_INIT;
  o.max_chunk = 3;
  ZT_OK(zck_plan_build(src, flat1, &o, &p));
  ZT_EQ_INT(p->n, 4);
  expect_ext(p, 0, 0, 0, 0, 0, 3);
  expect_ext(p, 1, 0, 3, 0, 3, 1);
  expect_ext(p, 2, 1, 0, 0, 4, 3);
  expect_ext(p, 3, 1, 3, 0, 7, 1);
  ZT_EQ_U64(p->total, 8);
  /* slices: every extent in exactly one part */
  for (uint32_t parts = 1; parts <= 5; parts++) {
    uint64_t sum = 0;
    size_t n = 0;
    for (uint32_t i = 0; i < parts; i++) {
      zck_plan *s;
      ZT_OK(zck_plan_slice(p, i, parts, &s));
      sum += s->total;
      n += s->n;
      zck_plan_free(s);
    }
    ZT_EQ_U64(sum, 8);
    ZT_EQ_INT(n, 4);
  }
  zck_plan *s;
  ZT_ERR(zck_plan_slice(p, 2, 2, &s), ZCK_ERR_INVALID_ARG, "part 2 of 2");
  zck_plan_free(p);

  /* a target needing elements the source lacks: restrict the source to rank 1 */
  zck_layout *r1;
  ZT_OK(zck_layout_restrict_rank(src, 1, &r1));
  const char *names[] = {"wte.weight", "ln.bias"};
  o = (zck_plan_opts)ZCK_PLAN_OPTS_INIT;
  o.param_names = names;
  ZT_ERR(zck_plan_build(r1, dst, &o, &p), ZCK_ERR_MISMATCH, "parameter wte.weight: elements [0, 4) of 5 are in no source store");
  ZT_ASSERT(p == NULL);
  o.allow_missing = true;
  ZT_OK(zck_plan_build(r1, dst, &o, &p));
  ZT_EQ_U64(p->total, 4);
  zck_plan_free(p);
  /* the reverse (load rank 1 from whole tensors) is complete */
  ZT_OK(zck_plan_build(dst, r1, NULL, &p));
  ZT_EQ_U64(p->total, 4);
  expect_ext(p, 0, 0, 4, 1, 0, 1);
  expect_ext(p, 1, 1, 0, 1, 1, 3);
  zck_plan_free(p);
  zck_layout_free(r1);

  /* numel disagreement */
  uint64_t other[] = {6, 3};
  zck_layout *w2;
  ZT_OK(zck_layout_whole(2, other, NULL, 0, &w2));
  ZT_ERR(zck_plan_build(src, w2, NULL, &p), ZCK_ERR_MISMATCH, "parameter 0: the source has 5 elements, the target 6");
  zck_layout_free(w2);
  uint64_t three[] = {5, 3, 1};
  ZT_OK(zck_layout_whole(3, three, NULL, 0, &w2));
  ZT_ERR(zck_plan_build(src, w2, NULL, &p), ZCK_ERR_MISMATCH, "2 parameters, the target 3");
  zck_layout_free(w2);

  zck_layout_free(flat1);
  zck_layout_free(src);
  zck_layout_free(dst);
}

// ---- random round trips

typedef struct rmodel {
  size_t n;
  uint64_t numel[48];
  uint32_t idx[48];
  size_t n_idx;
  zck_group_spec groups[3];
  size_t n_groups;
} rmodel;

static void random_model(rmodel *m) {
  m->n = 1 + rnd() % 30;
  for (size_t i = 0; i < m->n; i++) {
    uint64_t k = rnd() % 10;
    m->numel[i] = k == 0 ? 0 : k < 6 ? 1 + rnd() % 9 : 1 + rnd() % 500;
  }
  m->n_idx = 0;
  for (size_t i = 0; i < m->n; i++)
    if (rnd() % 6) m->idx[m->n_idx++] = (uint32_t)i;
  m->n_groups = 1 + rnd() % 3;
  size_t at = 0;
  for (size_t g = 0; g < m->n_groups; g++) {
    size_t len = g + 1 == m->n_groups ? m->n_idx - at : (m->n_idx - at) * (rnd() % 100) / 100;
    m->groups[g] = (zck_group_spec){m->idx + at, len, (int32_t)g};
    at += len;
  }
}

static zck_layout *random_layout(const rmodel *m, int kind) {
  zck_layout *l = NULL;
  uint32_t W = 1 + (uint32_t)(rnd() % 8);
  switch (kind) {
  case 0: ZT_OK(zck_layout_zero12(m->n, m->numel, m->groups, m->n_groups, W, rnd() % 3 ? 1 : 8, &l)); break;
  case 1: {
    zck_group_spec *sg;
    size_t n;
    ZT_OK(zck_zero3_sub_groups(m->numel, m->groups, m->n_groups, W, rnd() % 300, &sg, &n));
    ZT_OK(zck_layout_zero3(m->n, m->numel, sg, n, W, &l));
    free(sg);
    break;
  }
  case 2: ZT_OK(zck_layout_whole(m->n, m->numel, m->idx, m->n_idx, &l)); break;
  default: ZT_OK(zck_layout_flat(m->n, m->numel, m->groups, m->n_groups, 2 * W, 1, &l)); break;
  }
  return l;
}

static void test_round_trips(void) {
  for (int iter = 0; iter < 400; iter++) {
    rmodel m;
    random_model(&m);
    zck_layout *src = random_layout(&m, (int)(rnd() % 4)), *dst = random_layout(&m, (int)(rnd() % 4));
    if (rnd() % 4 == 0) { /* load one rank */
      zck_layout *r;
      ZT_OK(zck_layout_restrict_rank(dst, (int32_t)(rnd() % dst->world), &r));
      zck_layout_free(dst);
      dst = r;
    }
    zck_plan_opts o = ZCK_PLAN_OPTS_INIT;
    uint64_t chunks[] = {0, 1, 7, 100, ZCK_PLAN_DEFAULT_CHUNK};
    o.max_chunk = chunks[rnd() % 5];
    o.order = rnd() % 2 ? ZCK_PLAN_BY_SRC : ZCK_PLAN_BY_DST;
    o.merge = rnd() % 4 != 0;
    zck_plan *p;
    ZT_OK(zck_plan_build(src, dst, &o, &p));
    uint64_t want = 0;
    for (size_t i = 0; i < dst->n_pieces; i++) want += dst->pieces[i].count;
    ZT_EQ_U64(p->total, want);

    /* sources float32, targets float32 or float64 (exact for these values) */
    zck_dtype dt = rnd() % 2 ? ZCK_F32 : ZCK_F64;
    zck_store *ss = calloc(src->n_stores + 1, sizeof *ss), *ds = calloc(dst->n_stores + 1, sizeof *ds);
    float **sb = calloc(src->n_stores + 1, sizeof *sb);
    void **db = calloc(dst->n_stores + 1, sizeof *db);
    for (size_t s = 0; s < src->n_stores; s++) {
      sb[s] = malloc((src->stores[s].numel + 1) * sizeof(float));
      for (uint64_t e = 0; e < src->stores[s].numel; e++) sb[s][e] = (float)SENTINEL;
      ss[s] = zck_store_memory(sb[s], ZCK_F32, src->stores[s].numel, NULL);
    }
    for (size_t i = 0; i < src->n_pieces; i++) {
      const zck_piece *pc = &src->pieces[i];
      for (uint64_t e = 0; e < pc->count; e++) sb[pc->store][pc->store_off + e] = val(pc->param, pc->param_off + e);
    }
    for (size_t s = 0; s < dst->n_stores; s++) {
      uint64_t n = dst->stores[s].numel;
      db[s] = malloc((n + 1) * zck_dtype_size(dt));
      for (uint64_t e = 0; e < n; e++) {
        if (dt == ZCK_F32) ((float *)db[s])[e] = (float)SENTINEL;
        else ((double *)db[s])[e] = SENTINEL;
      }
      ds[s] = zck_store_memory(db[s], dt, n, NULL);
    }
    zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
    eo.threads = 1 + (unsigned)(rnd() % 4);
    eo.staging_bytes = rnd() % 2 ? 64 + rnd() % 256 : 0;
    ZT_OK(zck_exec_plan(p, ss, ds, NULL, &eo));
    /* mark mapped target elements, check their values, then check the rest untouched */
    for (size_t s = 0; s < dst->n_stores; s++) {
      uint8_t *mapped = calloc(dst->stores[s].numel + 1, 1);
      for (size_t k = dst->store_first[s]; k < dst->store_first[s + 1]; k++) {
        const zck_piece *pc = &dst->pieces[dst->by_store[k]];
        for (uint64_t e = 0; e < pc->count; e++) {
          double v = dt == ZCK_F32 ? ((float *)db[s])[pc->store_off + e] : ((double *)db[s])[pc->store_off + e];
          if (v != val(pc->param, pc->param_off + e))
            ZT_FAIL("iter %d: param %u element %llu: got %g", iter, pc->param, (unsigned long long)(pc->param_off + e), v);
          mapped[pc->store_off + e] = 1;
        }
      }
      for (uint64_t e = 0; e < dst->stores[s].numel; e++) {
        double v = dt == ZCK_F32 ? ((float *)db[s])[e] : ((double *)db[s])[e];
        if (!mapped[e] && v != SENTINEL) ZT_FAIL("iter %d: padding element %llu of store %zu written", iter, (unsigned long long)e, s);
      }
      free(mapped);
      free(db[s]);
    }
    for (size_t s = 0; s < src->n_stores; s++) free(sb[s]);
    free(sb);
    free(db);
    free(ss);
    free(ds);
    zck_plan_free(p);
    zck_layout_free(src);
    zck_layout_free(dst);
  }
}

int main(void) {
  test_hand();
  test_round_trips();
  return 0;
}
