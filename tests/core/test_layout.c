/* test_layout.c: ZeRO partition math against hand-computed cases from the spec (§3) and
 * against independent re-implementations of zero_to_fp32's reconstruction (§4.3, §4.4). */
#include "layout.h"
#include "model.h"
#include "test.h"
#include "util.h"

#include <stdlib.h>

// ---- scalar math, by hand

static void test_zero12_scalars(void) {
  /* W=2, N=8: A=4, M=8, P=4 */
  ZT_EQ_U64(zck_zero12_aligned(8, 2), 8);
  ZT_EQ_U64(zck_zero12_partition(8, 2), 4);
  ZT_EQ_U64(zck_zero12_lean(8, 2, 1), 4);
  /* W=4, N=10: A=8, M=16, P=4; lean 4,4,2,0; padding 0,0,2,4; bf16 padding 6 on rank 3 */
  ZT_EQ_U64(zck_zero12_aligned(10, 4), 16);
  ZT_EQ_U64(zck_zero12_partition(10, 4), 4);
  uint64_t lean4[] = {4, 4, 2, 0}, pad4[] = {0, 0, 2, 4}, bf4[] = {0, 0, 0, 6};
  for (uint32_t r = 0; r < 4; r++) {
    ZT_EQ_U64(zck_zero12_lean(10, 4, r), lean4[r]);
    ZT_EQ_U64(zck_zero12_padding(10, 4, r), pad4[r]);
    ZT_EQ_U64(zck_zero12_bf16_padding(10, 4, r), bf4[r]);
  }
  /* W=3, N=7: A=6, M=12, P=4 (even); lean 4,3,0 */
  ZT_EQ_U64(zck_zero12_partition(7, 3), 4);
  ZT_EQ_U64(zck_zero12_lean(7, 3, 0), 4);
  ZT_EQ_U64(zck_zero12_lean(7, 3, 1), 3);
  ZT_EQ_U64(zck_zero12_lean(7, 3, 2), 0);
  ZT_EQ_U64(zck_zero12_padding(7, 3, 2), 4);
  /* W=8, N=1: M=16, P=2: every rank after 0 is all padding */
  ZT_EQ_U64(zck_zero12_partition(1, 8), 2);
  ZT_EQ_U64(zck_zero12_lean(1, 8, 0), 1);
  for (uint32_t r = 1; r < 8; r++) ZT_EQ_U64(zck_zero12_lean(1, 8, r), 0);
  ZT_EQ_U64(zck_zero12_bf16_padding(1, 8, 7), 15);
  /* W=1: alignment is still 2 */
  ZT_EQ_U64(zck_zero12_partition(5, 1), 6);
  ZT_EQ_U64(zck_zero12_padding(5, 1, 0), 1);
  /* N=0 */
  ZT_EQ_U64(zck_zero12_partition(0, 4), 0);
  ZT_EQ_U64(zck_zero12_lean(0, 4, 0), 0);
  /* 2*W alignment also for even N divisible by W but not 2W: N=6, W=4 -> M=8, P=2 */
  ZT_EQ_U64(zck_zero12_aligned(6, 4), 8);
  ZT_EQ_U64(zck_zero12_lean(6, 4, 3), 0);
  ZT_EQ_U64(zck_zero12_lean(6, 4, 2), 2);
}

static void test_zero3_scalars(void) {
  ZT_EQ_U64(zck_zero3_partition(10, 4), 3);
  ZT_EQ_U64(zck_zero3_padding(10, 4), 2);
  uint64_t keep[] = {3, 3, 3, 1};
  for (uint32_t r = 0; r < 4; r++) ZT_EQ_U64(zck_zero3_keep(10, 4, r), keep[r]);
  /* n < (W-1)p: several trailing ranks pure padding */
  ZT_EQ_U64(zck_zero3_partition(5, 8), 1);
  ZT_EQ_U64(zck_zero3_padding(5, 8), 3);
  ZT_EQ_U64(zck_zero3_keep(5, 8, 4), 1);
  ZT_EQ_U64(zck_zero3_keep(5, 8, 5), 0);
  ZT_EQ_U64(zck_zero3_partition(9, 3), 3);
  ZT_EQ_U64(zck_zero3_padding(9, 3), 0);
  ZT_EQ_U64(zck_zero3_partition(0, 3), 0);
  ZT_EQ_U64(zck_zero3_keep(0, 3, 0), 0);
  /* n=2, W=4: p=1, ranks 2,3 padding only */
  ZT_EQ_U64(zck_zero3_keep(2, 4, 1), 1);
  ZT_EQ_U64(zck_zero3_keep(2, 4, 2), 0);
}

static void expect_piece(const zck_layout *l, size_t i, uint32_t param, uint32_t store, uint64_t poff, uint64_t soff,
                         uint64_t count) {
  ZT_ASSERT(i < l->n_pieces);
  const zck_piece *p = &l->pieces[i];
  if (p->param != param || p->store != store || p->param_off != poff || p->store_off != soff || p->count != count)
    ZT_FAIL("piece %zu = {param %u store %u poff %llu soff %llu count %llu}, expected {%u %u %llu %llu %llu}", i,
            p->param, p->store, (unsigned long long)p->param_off, (unsigned long long)p->store_off,
            (unsigned long long)p->count, param, store, (unsigned long long)poff, (unsigned long long)soff,
            (unsigned long long)count);
}

static void test_zero12_layout_hand(void) {
  /* Two groups. Group 0 = params {0: 5, 1: 3} W=2 -> N=8, P=4.
   * Group 1 = params {3: 7} -> N=7, M=8, P=4. Param 2 (frozen) in no group. */
  uint64_t numel[] = {5, 3, 100, 7};
  uint32_t g0[] = {0, 1}, g1[] = {3};
  zck_group_spec gs[] = {{g0, 2, 0}, {g1, 1, 1}};
  zck_layout *l;
  ZT_OK(zck_layout_zero12(4, numel, gs, 2, 2, 1, &l));
  ZT_EQ_INT(l->kind, ZCK_LAYOUT_ZERO12);
  ZT_EQ_INT(l->n_stores, 4);
  ZT_EQ_INT(l->n_groups, 2);
  ZT_EQ_U64(l->groups[0].numel, 8);
  ZT_EQ_U64(l->groups[0].partition, 4);
  ZT_EQ_U64(l->groups[1].numel, 7);
  ZT_EQ_U64(l->groups[1].aligned, 8);
  ZT_EQ_U64(l->groups[0].offsets[1], 5);
  ZT_EQ_INT(l->groups[1].opt_group, 1);
  /* store ids g*W + r */
  ZT_EQ_INT(zck_layout_store_id(l, 1, 1), 3);
  ZT_EQ_INT(l->stores[3].rank, 1);
  ZT_EQ_INT(l->stores[3].group, 1);
  ZT_EQ_U64(l->stores[3].numel, 4);
  ZT_EQ_U64(l->stores[3].lean, 3);
  ZT_EQ_U64(l->stores[2].lean, 4);
  /* pieces by param then offset */
  ZT_EQ_INT(l->n_pieces, 5);
  expect_piece(l, 0, 0, 0, 0, 0, 4);
  expect_piece(l, 1, 0, 1, 4, 0, 1);
  expect_piece(l, 2, 1, 1, 0, 1, 3);
  expect_piece(l, 3, 3, 2, 0, 0, 4);
  expect_piece(l, 4, 3, 3, 4, 0, 3);
  ZT_EQ_U64(zck_layout_param_covered(l, 2), 0);
  ZT_EQ_U64(zck_layout_param_covered(l, 0), 5);
  /* by_store: store 1 holds param 0's tail then param 1 */
  ZT_EQ_INT(l->store_first[2] - l->store_first[1], 2);
  ZT_EQ_INT(l->pieces[l->by_store[l->store_first[1]]].param, 0);
  ZT_EQ_INT(l->pieces[l->by_store[l->store_first[1] + 1]].param, 1);

  zck_layout *r1;
  ZT_OK(zck_layout_restrict_rank(l, 1, &r1));
  ZT_EQ_INT(r1->n_pieces, 3);
  ZT_EQ_INT(r1->n_stores, 4);
  ZT_EQ_U64(zck_layout_param_covered(r1, 0), 1);
  ZT_EQ_U64(r1->groups[1].partition, 4);
  zck_layout_free(r1);
  zck_layout_free(l);

  /* W=4, N=10 in one param: rank 3 holds nothing */
  uint64_t n10[] = {10};
  uint32_t only[] = {0};
  zck_group_spec one = {only, 1, 0};
  ZT_OK(zck_layout_zero12(1, n10, &one, 1, 4, 1, &l));
  ZT_EQ_INT(l->n_pieces, 3);
  expect_piece(l, 2, 0, 2, 8, 0, 2);
  ZT_EQ_U64(l->stores[3].lean, 0);
  ZT_EQ_INT(l->store_first[4] - l->store_first[3], 0);
  zck_layout_free(l);
}

static void test_zero12_param_align(void) {
  /* parameter_alignment (DeepSpeed >= 0.19.8), bf16: param_align 8. Params 5, 3, 2:
   * offsets 0, 8, 16 (the last param gets no trailing pad): N = 18, W=2: M=20, P=10. */
  uint64_t numel[] = {5, 3, 2};
  uint32_t g[] = {0, 1, 2};
  zck_group_spec gs = {g, 3, 0};
  zck_layout *l;
  ZT_OK(zck_layout_zero12(3, numel, &gs, 1, 2, 8, &l));
  ZT_EQ_U64(l->groups[0].offsets[1], 8);
  ZT_EQ_U64(l->groups[0].offsets[2], 16);
  ZT_EQ_U64(l->groups[0].numel, 18);
  ZT_EQ_U64(l->groups[0].partition, 10);
  ZT_EQ_U64(l->stores[1].lean, 8);
  expect_piece(l, 1, 1, 0, 0, 8, 2);
  expect_piece(l, 2, 1, 1, 2, 0, 1);
  expect_piece(l, 3, 2, 1, 0, 6, 2);
  zck_layout_free(l);
}

static void test_zero3_layout_hand(void) {
  /* Sub-group [0: 10, 1: 6], W=2: p = 5, 3; L = 8. */
  uint64_t numel[] = {10, 6, 7};
  uint32_t s0[] = {0, 1}, s1[] = {2};
  zck_group_spec sg[] = {{s0, 2, 0}, {s1, 1, 0}};
  zck_layout *l;
  ZT_OK(zck_layout_zero3(3, numel, sg, 2, 2, &l));
  ZT_EQ_INT(l->kind, ZCK_LAYOUT_ZERO3);
  ZT_EQ_U64(l->stores[0].numel, 8);
  ZT_EQ_U64(l->stores[0].lean, 8);
  ZT_EQ_U64(l->groups[0].offsets[1], 5);
  ZT_EQ_U64(l->groups[0].aligned, 16);
  expect_piece(l, 0, 0, 0, 0, 0, 5);
  expect_piece(l, 1, 0, 1, 5, 0, 5);
  expect_piece(l, 2, 1, 0, 0, 5, 3);
  expect_piece(l, 3, 1, 1, 3, 5, 3);
  /* param 2: n=7, p=4: rank 0 [0,4), rank 1 [4,7) + 1 padding */
  expect_piece(l, 4, 2, 2, 0, 0, 4);
  expect_piece(l, 5, 2, 3, 4, 0, 3);
  ZT_EQ_U64(l->stores[3].numel, 4);
  zck_layout_free(l);

  /* n=5 on W=8: p=1; stores of ranks 5..7 hold only padding */
  uint64_t n5[] = {5};
  uint32_t only[] = {0};
  zck_group_spec one = {only, 1, 0};
  ZT_OK(zck_layout_zero3(1, n5, &one, 1, 8, &l));
  ZT_EQ_INT(l->n_pieces, 5);
  ZT_EQ_U64(l->stores[7].numel, 1);
  ZT_EQ_INT(l->store_first[8] - l->store_first[7], 0);
  zck_layout_free(l);
}

static void test_sub_groups(void) {
  /* numels 10, 6, 4, 8 on W=2: p = 5, 3, 2, 4, total 14 */
  uint64_t numel[] = {10, 6, 4, 8, 99};
  uint32_t g[] = {0, 1, 2, 3};
  uint32_t g2[] = {4};
  zck_group_spec gs[] = {{g, 4, 0}, {NULL, 0, 1}, {g2, 1, 2}};
  zck_group_spec *out;
  size_t n;
  struct {
    uint64_t size;
    size_t n_sub;
    size_t lens[4];
  } cases[] = {
      {14, 1, {4}},          /* size >= total: one */
      {1000000000, 1, {4}},  /* default 1e9 */
      {6, 2, {2, 2}},        /* 5 <6, 8 >= 6 close; 2, 6 >= 6 close */
      {5, 3, {1, 2, 1}},     /* 5 >= 5; 3+2 = 5; last */
      {0, 4, {1, 1, 1, 1}},  /* every param closes */
      {8, 2, {2, 2}},        /* 5, 8 >= 8 close; 2, 6 (last) */
      {9, 2, {3, 1}},        /* 5, 8, 10 >= 9 close; 4 (last) */
      {13, 1, {4}},          /* 5, 8, 10, 14: reaches 13 only at the last param */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    ZT_OK(zck_zero3_sub_groups(numel, gs, 1, 2, cases[c].size, &out, &n));
    if (n != cases[c].n_sub) ZT_FAIL("sub_group_size %llu: %zu sub-groups", (unsigned long long)cases[c].size, n);
    uint32_t next = 0;
    for (size_t s = 0; s < n; s++) {
      ZT_EQ_INT(out[s].n_params, cases[c].lens[s]);
      ZT_EQ_INT(out[s].opt_group, 0);
      for (size_t i = 0; i < out[s].n_params; i++) ZT_EQ_INT(out[s].params[i], next++);
    }
    free(out);
  }
  /* empty group skipped; group indices carried */
  ZT_OK(zck_zero3_sub_groups(numel, gs, 3, 2, 6, &out, &n));
  ZT_EQ_INT(n, 3);
  ZT_EQ_INT(out[2].opt_group, 2);
  ZT_EQ_INT(out[2].params[0], 4);
  free(out);
  ZT_ERR(zck_zero3_sub_groups(numel, gs, 1, 0, 6, &out, &n), ZCK_ERR_INVALID_ARG, "world size");
}

static void test_errors(void) {
  uint64_t numel[] = {4, 4};
  uint32_t g[] = {0, 1, 0};
  zck_group_spec gs = {g, 3, 0};
  zck_layout *l;
  ZT_ERR(zck_layout_zero12(2, numel, &gs, 1, 2, 1, &l), ZCK_ERR_INVALID_ARG, "listed twice");
  ZT_ASSERT(l == NULL);
  gs.n_params = 2;
  ZT_ERR(zck_layout_zero12(2, numel, &gs, 1, 0, 1, &l), ZCK_ERR_INVALID_ARG, "world size");
  uint32_t bad[] = {5};
  zck_group_spec bs = {bad, 1, 0};
  ZT_ERR(zck_layout_zero3(2, numel, &bs, 1, 2, &l), ZCK_ERR_INVALID_ARG, "parameter 5");
  uint64_t huge[] = {(uint64_t)1 << 63};
  uint32_t z[] = {0};
  zck_group_spec zs = {z, 1, 0};
  ZT_ERR(zck_layout_zero12(1, huge, &zs, 1, 2, 1, &l), ZCK_ERR_LIMIT, "too many");

  /* custom layouts from untrusted data */
  zck_layout_store st[] = {{-1, -1, -1, 8, 8}};
  zck_piece overlap[] = {{0, 0, 0, 0, 3, 0, 0}, {0, 0, 2, 4, 2, 0, 0}};
  ZT_ERR(zck_layout_custom(2, numel, st, 1, overlap, 2, &l), ZCK_ERR_FORMAT, "mapped twice");
  zck_piece past_param[] = {{1, 0, 3, 0, 2, 0, 0}};
  ZT_ERR(zck_layout_custom(2, numel, st, 1, past_param, 1, &l), ZCK_ERR_FORMAT, "past its 4 elements");
  zck_piece past_store[] = {{1, 0, 0, 7, 2, 0, 0}};
  ZT_ERR(zck_layout_custom(2, numel, st, 1, past_store, 1, &l), ZCK_ERR_FORMAT, "store 0");
  zck_piece bad_store[] = {{1, 3, 0, 0, 2, 0, 0}};
  ZT_ERR(zck_layout_custom(2, numel, st, 1, bad_store, 1, &l), ZCK_ERR_FORMAT, "store 3");
  zck_piece ok[] = {{1, 0, 2, 0, 2, 0, 0}, {1, 0, 0, 6, 2, 0, 0}, {0, 0, 0, 2, 4, 0, 0}};
  ZT_OK(zck_layout_custom(2, numel, st, 1, ok, 3, &l));
  ZT_EQ_U64(l->pieces[1].param_off, 0); /* sorted by param, offset */
  ZT_EQ_U64(l->pieces[1].store_off, 6);
  ZT_EQ_INT(l->by_store[0], 2); /* store_off 0 is param 1's second piece */
  ZT_EQ_INT(l->by_store[1], 0);
  zck_layout_free(l);
  ZT_ERR(zck_layout_whole(2, numel, g, 3, &l), ZCK_ERR_INVALID_ARG, "listed twice");
}

// ---- properties: random groups, W = 1..8, coverage and reconstruction

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* A random model: n params with small or odd numels (some 0), split into groups in
 * order; some params left out (frozen). */
typedef struct rmodel {
  size_t n;
  uint64_t numel[64];
  uint32_t idx[64];
  zck_group_spec groups[4];
  size_t n_groups;
} rmodel;

static void random_model(rmodel *m) {
  m->n = 1 + rnd() % 40;
  for (size_t i = 0; i < m->n; i++) {
    uint64_t k = rnd() % 10;
    m->numel[i] = k == 0 ? 0 : k < 6 ? 1 + rnd() % 9 : 1 + rnd() % 300;
  }
  size_t k = 0;
  for (size_t i = 0; i < m->n; i++)
    if (rnd() % 7) m->idx[k++] = (uint32_t)i;
  m->n_groups = 1 + rnd() % 3;
  size_t at = 0;
  for (size_t g = 0; g < m->n_groups; g++) {
    size_t len = g + 1 == m->n_groups ? k - at : (k - at) * (rnd() % 100) / 100;
    m->groups[g] = (zck_group_spec){m->idx + at, len, (int32_t)g};
    at += len;
  }
}

/* value of element e of param p */
static float val(uint32_t p, uint64_t e) { return (float)(p * 100000 + e + 1); }

/* Coverage: every element of every grouped param mapped exactly once, others not. */
static void check_coverage(const rmodel *m, const zck_layout *l) {
  for (size_t p = 0; p < m->n; p++) {
    bool grouped = false;
    for (size_t g = 0; g < m->n_groups; g++)
      for (size_t i = 0; i < m->groups[g].n_params; i++) grouped |= m->groups[g].params[i] == p;
    uint8_t *hit = calloc(m->numel[p] + 1, 1);
    for (size_t i = l->param_first[p]; i < l->param_first[p + 1]; i++)
      for (uint64_t e = 0; e < l->pieces[i].count; e++) hit[l->pieces[i].param_off + e]++;
    for (uint64_t e = 0; e < m->numel[p]; e++)
      if (hit[e] != (grouped ? 1 : 0)) ZT_FAIL("param %zu element %llu mapped %d times", p, (unsigned long long)e, hit[e]);
    free(hit);
  }
}

/* Scatters the param values into per-store float arrays (padding = NaN sentinel). */
static float **scatter(const zck_layout *l) {
  float **st = calloc(l->n_stores, sizeof *st);
  for (size_t s = 0; s < l->n_stores; s++) {
    st[s] = malloc((l->stores[s].numel + 1) * sizeof(float));
    for (uint64_t e = 0; e < l->stores[s].numel; e++) st[s][e] = -1.0f;
  }
  for (size_t i = 0; i < l->n_pieces; i++) {
    const zck_piece *p = &l->pieces[i];
    for (uint64_t e = 0; e < p->count; e++) st[p->store][p->store_off + e] = val(p->param, p->param_off + e);
  }
  return st;
}

static void free_stores(float **st, size_t n) {
  for (size_t s = 0; s < n; s++) free(st[s]);
  free(st);
}

/* zero_to_fp32 §4.3, reimplemented: concat every rank's lean partition, walk params. */
static void check_zero2_reconstruction(const rmodel *m, const zck_layout *l, uint32_t W) {
  float **st = scatter(l);
  for (size_t g = 0; g < m->n_groups; g++) {
    const zck_group_spec *gs = &m->groups[g];
    uint64_t N = 0;
    for (size_t i = 0; i < gs->n_params; i++) N += m->numel[gs->params[i]];
    ZT_EQ_U64(l->groups[g].numel, N);
    ZT_EQ_U64(l->groups[g].aligned % (2 * W), 0);
    ZT_EQ_U64(l->groups[g].aligned, zck__align_up(N, 2 * W));
    ZT_ASSERT(l->groups[g].aligned < N + 2 * W);
    ZT_EQ_U64(l->groups[g].partition % 2, 0);
    float *V = malloc((N + 1) * sizeof *V);
    uint64_t vlen = 0, lean_sum = 0;
    for (uint32_t r = 0; r < W; r++) {
      const zck_layout_store *s = &l->stores[g * W + r];
      ZT_EQ_U64(s->numel, l->groups[g].partition);
      ZT_EQ_U64(s->lean, zck_zero12_lean(N, W, r));
      ZT_EQ_U64(s->numel - s->lean, zck_zero12_padding(N, W, r));
      lean_sum += s->lean;
      for (uint64_t e = 0; e < s->lean; e++) V[vlen++] = st[g * W + r][e];
      /* padding is never mapped */
      for (uint64_t e = s->lean; e < s->numel; e++) ZT_ASSERT(st[g * W + r][e] == -1.0f);
    }
    ZT_EQ_U64(lean_sum, N);
    uint64_t off = 0;
    for (size_t i = 0; i < gs->n_params; i++) {
      uint32_t p = gs->params[i];
      for (uint64_t e = 0; e < m->numel[p]; e++)
        if (V[off + e] != val(p, e)) ZT_FAIL("W=%u group %zu param %u element %llu differs", W, g, p, (unsigned long long)e);
      off += m->numel[p];
    }
    ZT_EQ_U64(zck__align_up(off, 2 * W), zck__align_up(vlen, 2 * W));
    free(V);
  }
  free_stores(st, l->n_stores);
}

/* zero_to_fp32 §4.4: param.flat[k] = F[r][offset + (k - r p)], r = k / p, where F[r] is
 * rank r's concatenated sub-group flats and offset the running sum of p. */
static void check_zero3_reconstruction(const rmodel *m, const zck_layout *l, const zck_group_spec *sg, size_t n_sg,
                                       uint32_t W) {
  float **st = scatter(l);
  uint64_t total = 0;
  for (size_t s = 0; s < n_sg; s++) total += l->stores[s * W].numel;
  for (uint32_t r = 0; r < W; r++) {
    float *F = malloc((total + 1) * sizeof *F);
    uint64_t at = 0;
    for (size_t s = 0; s < n_sg; s++) {
      for (uint64_t e = 0; e < l->stores[s * W + r].numel; e++) F[at + e] = st[s * W + r][e];
      at += l->stores[s * W + r].numel;
    }
    uint64_t offset = 0;
    for (size_t s = 0; s < n_sg; s++) {
      uint64_t L = 0;
      for (size_t i = 0; i < sg[s].n_params; i++) {
        uint32_t p = sg[s].params[i];
        uint64_t n = m->numel[p], pp = zck__ceil_div(n, W);
        for (uint64_t k = r * pp; k < n && k < (r + 1) * pp; k++)
          if (F[offset + (k - r * pp)] != val(p, k)) ZT_FAIL("W=%u param %u element %llu differs", W, p, (unsigned long long)k);
        /* the tail of the slot is padding */
        for (uint64_t k = n > r * pp ? n - r * pp : 0; k < pp; k++) ZT_ASSERT(F[offset + k] == -1.0f);
        offset += pp;
        L += pp;
      }
      ZT_EQ_U64(l->stores[s * W + r].numel, L);
    }
    ZT_EQ_U64(offset * W, W * total);
    free(F);
  }
  free_stores(st, l->n_stores);
}

static void test_properties(void) {
  for (int iter = 0; iter < 300; iter++) {
    rmodel m;
    random_model(&m);
    uint32_t W = 1 + (uint32_t)(rnd() % 8);
    zck_layout *l;
    ZT_OK(zck_layout_zero12(m.n, m.numel, m.groups, m.n_groups, W, 1, &l));
    check_coverage(&m, l);
    check_zero2_reconstruction(&m, l, W);
    zck_layout_free(l);

    uint64_t sgs = rnd() % 4 == 0 ? 1000000000 : rnd() % 200;
    zck_group_spec *sg;
    size_t n_sg;
    ZT_OK(zck_zero3_sub_groups(m.numel, m.groups, m.n_groups, W, sgs, &sg, &n_sg));
    ZT_OK(zck_layout_zero3(m.n, m.numel, sg, n_sg, W, &l));
    check_coverage(&m, l);
    check_zero3_reconstruction(&m, l, sg, n_sg, W);
    zck_layout_free(l);
    free(sg);

    ZT_OK(zck_layout_flat(m.n, m.numel, m.groups, m.n_groups, 2 * W, 1, &l));
    check_coverage(&m, l);
    zck_layout_free(l);
  }
}

static void test_round_robin(void) {
  uint32_t in[] = {10, 11, 12, 13, 14, 15, 16}, out[7];
  zck_round_robin_order(in, 7, 3, out);
  uint32_t want[] = {10, 13, 16, 11, 14, 12, 15};
  for (int i = 0; i < 7; i++) ZT_EQ_INT(out[i], want[i]);
  zck_round_robin_order(in, 2, 4, out);
  ZT_EQ_INT(out[0], 10);
  ZT_EQ_INT(out[1], 11);
}

/* A reader's flat groups back to the model's groups: round_robin_gradients undone. */
static void test_groups_to_model(void) {
  zck_model *m = zck_model_new();
  ZT_ASSERT(m);
  int64_t shape[] = {2};
  char name[8];
  for (int p = 0; p < 7; p++) {
    snprintf(name, sizeof name, "p%d", p);
    ZT_OK(zck_model_add_param(m, name, 1, shape, ZCK_F32, NULL));
  }
  uint32_t g;
  ZT_OK(zck_model_add_group(m, &g));
  ZT_OK(zck_model_add_group(m, &g));
  uint32_t group0[] = {4, 0, 6, 2, 5}, flat[7];
  zck_round_robin_order(group0, 5, 3, flat);   /* flat group 0 as DeepSpeed saves it */
  flat[5] = 1;
  flat[6] = 3;
  size_t first[] = {0, 5, 7};
  int32_t opt_of[] = {1, 0};
  ZT_OK(zck_layout_groups_to_model(m, flat, first, 2, opt_of, true, 3));
  uint32_t got[7];
  ZT_EQ_INT(zck_model_group_trainable(m, 1, got, 7), 5);
  for (int i = 0; i < 5; i++) ZT_EQ_INT(got[i], group0[i]);
  ZT_EQ_INT(zck_model_group_trainable(m, 0, got, 7), 2);
  ZT_EQ_INT(got[0], 1);
  ZT_EQ_INT(got[1], 3);
  zck_model_free(m);
}

/* The 16-bit all-weights and the frozen layouts (layout_lp.c). */
static void test_lp_and_frozen(void) {
  zck_model *m = zck_model_new();
  ZT_ASSERT(m);
  int64_t s5[] = {5}, s3[] = {3};
  ZT_OK(zck_model_add_param(m, "a", 1, s5, ZCK_BF16, NULL));
  ZT_OK(zck_model_add_param(m, "b", 1, s3, ZCK_BF16, NULL));
  ZT_OK(zck_model_add_param(m, "c", 1, s5, ZCK_BF16, NULL));
  ZT_OK(zck_model_add_param(m, "d", 1, s3, ZCK_BF16, NULL));
  zck_model_set_frozen(m, 0, true);
  zck_model_set_frozen(m, 2, true);
  ZT_OK(zck_model_set_tied(m, 2, 0));   /* c is a's alias: neither copy holds it */
  uint32_t lp[4], fz[4];
  ZT_EQ_INT(zck_lp_params(m, lp), 3);
  ZT_EQ_INT(lp[2], 3);
  ZT_EQ_INT(zck_frozen_params(m, NULL), 1);
  ZT_EQ_INT(zck_frozen_params(m, fz), 1);
  ZT_EQ_INT(fz[0], 0);
  uint64_t numel[] = {5, 3, 5, 3};
  zck_layout *l;
  ZT_OK(zck_layout_lp(m, numel, NULL, 0, &l));
  ZT_EQ_INT(l->n_stores, 3);
  ZT_EQ_INT(l->stores[1].param, 1);
  zck_layout_free(l);
  /* stage 3: ceil(5/2) = 3 elements a rank, store i*W + r; else whole, store i */
  ZT_OK(zck_layout_frozen(4, numel, fz, 1, 3, 2, &l));
  ZT_EQ_INT(l->n_stores, 2);
  ZT_EQ_U64(l->stores[zck_layout_store_id(l, 0, 1)].numel, 3);
  zck_layout_free(l);
  ZT_OK(zck_layout_frozen(4, numel, fz, 1, 2, 2, &l));
  ZT_EQ_INT(l->n_stores, 1);
  ZT_EQ_INT(zck_layout_store_id(l, 0, 0), 0);
  ZT_EQ_U64(l->stores[0].numel, 5);
  zck_layout_free(l);
  ZT_EQ_U64(zck_frozen_fragment_numel(5, 3, 2), 3);
  ZT_EQ_U64(zck_frozen_fragment_numel(5, 2, 2), 5);
  ZT_OK(zck_frozen_fragment_check("f", "x", 3, 5, 3, 2));
  ZT_ERR(zck_frozen_fragment_check("f", "x", 5, 5, 3, 2), ZCK_ERR_MISMATCH, "expected 3 (ceil(numel / world size))");
  ZT_ERR(zck_frozen_fragment_check("f", "x", 3, 5, 2, 2), ZCK_ERR_MISMATCH, "expected 5 (the parameter's numel)");
  zck_model_free(m);
}

static void test_whole_and_flat(void) {
  uint64_t numel[] = {3, 0, 5};
  zck_layout *l;
  ZT_OK(zck_layout_whole(3, numel, NULL, 0, &l));
  ZT_EQ_INT(l->n_stores, 3);
  ZT_EQ_INT(l->n_pieces, 2);
  ZT_EQ_INT(l->stores[2].param, 2);
  ZT_EQ_U64(l->stores[2].numel, 5);
  zck_layout_free(l);
  uint32_t sel[] = {2, 0};
  ZT_OK(zck_layout_whole(3, numel, sel, 2, &l));
  ZT_EQ_INT(l->stores[0].param, 2);
  expect_piece(l, 0, 0, 1, 0, 0, 3);
  zck_layout_free(l);
  uint32_t g[] = {2, 0};
  zck_group_spec gs = {g, 2, 0};
  ZT_OK(zck_layout_flat(3, numel, &gs, 1, 4, 1, &l));
  ZT_EQ_U64(l->stores[0].numel, 8);
  expect_piece(l, 0, 0, 0, 0, 5, 3);
  zck_layout_free(l);
}

int main(void) {
  test_zero12_scalars();
  test_zero3_scalars();
  test_zero12_layout_hand();
  test_zero12_param_align();
  test_zero3_layout_hand();
  test_sub_groups();
  test_errors();
  test_round_robin();
  test_groups_to_model();
  test_lp_and_frozen();
  test_whole_and_flat();
  test_properties();
  return 0;
}
