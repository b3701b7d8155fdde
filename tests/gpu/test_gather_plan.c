/* test_gather_plan.c: the on-save 16-bit gather's plan and host path, without a device:
 * random extents against a direct zck_convert of each extent, every bucket size from one
 * element up, output order, gaps left alone, ZeRO-1/2/3 layouts through
 * zck_gather_extents_from_layout, and the refusals (overlap, bounds, dtypes, writer
 * errors). The GPU path runs the same plan (tests/gpu/test_gpu_gather16.c). */
#include "test.h"

#include "layout.h"
#include "zck_cuda.h"

#include <math.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* A sink that checks the writer contract: increasing, non-overlapping offsets in bounds. */
typedef struct sink {
  uint8_t *buf;
  size_t cap;
  uint64_t next_min;
  size_t calls;
  int fail_at;              /* call index to fail at, -1: never */
} sink;

static zck_status sink_write(void *ctx, uint64_t off, const void *bytes, size_t n) {
  sink *s = ctx;
  if ((int)s->calls == s->fail_at) return ZCK_ERR_NO_SPACE;
  s->calls++;
  ZT_ASSERT(off >= s->next_min);
  ZT_ASSERT(off + n <= s->cap);
  ZT_ASSERT(n > 0);
  memcpy(s->buf + off, bytes, n);
  s->next_min = off + n;
  return ZCK_OK;
}

static void check_plan(const zck_gather_plan *p) {
  uint64_t total = 0, last_end = 0;
  for (size_t b = 0; b < p->n_buckets; b++) {
    const zck_gather_bucket *bk = &p->buckets[b];
    ZT_ASSERT(bk->count >= 1 && bk->count <= p->bucket_elems);
    uint64_t staged = 0;
    for (size_t i = 0; i < bk->n_items; i++) {
      const zck_gather_item *it = &p->items[bk->first_item + i];
      ZT_EQ_U64(it->stage_off, staged);
      staged += it->count;
    }
    ZT_EQ_U64(staged, bk->count);
    uint64_t run_staged = 0;
    for (size_t r = 0; r < bk->n_runs; r++) {
      const zck_gather_run *run = &p->runs[bk->first_run + r];
      ZT_EQ_U64(run->stage_off, run_staged);
      ZT_ASSERT(run->dst_off >= last_end);
      /* consecutive runs of one bucket are separated by a gap, else they would be one */
      if (r) ZT_ASSERT(run->dst_off > last_end);
      last_end = run->dst_off + run->count;
      run_staged += run->count;
    }
    ZT_EQ_U64(run_staged, bk->count);
    total += bk->count;
  }
  ZT_EQ_U64(total, p->total);
}

static float rand_value(void) {
  uint64_t r = next();
  switch (r % 16) {
  case 0: return NAN;
  case 1: return -INFINITY;
  case 2: return 1e-40f;  /* subnormal */
  case 3: { uint32_t u = (uint32_t)(r >> 32); float f; memcpy(&f, &u, 4); return f; } /* any bits */
  default: return (float)((double)(int64_t)(r >> 11) * 0x1p-50);
  }
}

/* ---- random extents against direct conversion */
static void random_case(int round) {
  enum { NSRC = 4 };
  zck_gather_src srcs[NSRC];
  void *data[NSRC];
  for (int i = 0; i < NSRC; i++) {
    uint64_t n = 1 + next() % 300;
    zck_dtype dt = (next() & 1) ? ZCK_F32 : ZCK_BF16;
    data[i] = malloc(n * zck_dtype_size(dt));
    for (uint64_t j = 0; j < n; j++) {
      float f = rand_value();
      zck_convert(dt, (uint8_t *)data[i] + j * zck_dtype_size(dt), ZCK_F32, &f, 1);
    }
    srcs[i] = (zck_gather_src){data[i], dt, n};
  }
  zck_dtype out_dt = round % 3 == 2 ? ZCK_F32 : ZCK_BF16;
  size_t osz = zck_dtype_size(out_dt);
  /* the output: segments, some skipped (gaps), each from a random source range */
  uint64_t out_n = 1 + next() % 2000;
  zck_gather_extent *ext = calloc(2 * out_n + 1, sizeof *ext);
  size_t n_ext = 0;
  for (uint64_t pos = 0; pos < out_n;) {
    uint64_t len = 1 + next() % 97;
    if (len > out_n - pos) len = out_n - pos;
    if (next() % 5) {
      uint32_t s = (uint32_t)(next() % NSRC);
      if (len > srcs[s].numel) len = srcs[s].numel;
      uint64_t so = next() % (srcs[s].numel - len + 1);
      if (len > 1 && next() % 4 == 0) {
        /* one range as two adjacent extents (the plan merges them) */
        uint64_t cut = 1 + next() % (len - 1);
        ext[n_ext++] = (zck_gather_extent){s, so, pos, cut};
        ext[n_ext++] = (zck_gather_extent){s, so + cut, pos + cut, len - cut};
      } else {
        ext[n_ext++] = (zck_gather_extent){s, so, pos, len};
      }
    }
    pos += len;
  }
  /* shuffle: the plan sorts */
  for (size_t i = n_ext; i > 1; i--) {
    size_t j = next() % i;
    zck_gather_extent t = ext[i - 1];
    ext[i - 1] = ext[j];
    ext[j] = t;
  }
  ext[n_ext++] = (zck_gather_extent){0, 0, 5, 0}; /* empty: ignored */
  uint8_t *ref = malloc(out_n * osz), *got = malloc(out_n * osz);
  memset(ref, 0xAB, out_n * osz);
  for (size_t i = 0; i < n_ext; i++) {
    const zck_gather_extent *e = &ext[i];
    zck_dtype sd = srcs[e->src].dtype;
    ZT_OK(zck_convert(out_dt, ref + e->dst_off * osz, sd, (const uint8_t *)data[e->src] + e->src_off * zck_dtype_size(sd),
                      e->count));
  }
  size_t buckets[] = {osz, 2 * osz, 3 * osz + 1, 64, 1000, 4096, 1 << 20};
  for (size_t bi = 0; bi < sizeof buckets / sizeof *buckets; bi++) {
    zck_gather_plan *p;
    ZT_OK(zck_gather_plan_build(srcs, NSRC, ext, n_ext, out_dt, buckets[bi], &p));
    check_plan(p);
    memset(got, 0xAB, out_n * osz);
    sink sk = {got, out_n * osz, 0, 0, -1};
    ZT_OK(zck_gather_run_host(p, srcs, sink_write, &sk));
    ZT_EQ_MEM(got, ref, out_n * osz);
    zck_gather_plan_free(p);
  }
  free(ref);
  free(got);
  free(ext);
  for (int i = 0; i < NSRC; i++) free(data[i]);
}

/* ---- ZeRO layouts: the consolidated bf16 tensors of rank partitions */
static float value_of(uint32_t param, uint64_t i) { return (float)param * 1000.0f + (float)i * 0.37f - 3.0f; }

static void layout_case(int stage, uint32_t W) {
  enum { NP = 5 };
  uint64_t numel[NP] = {5, 7, 1, 10, 33};
  uint32_t ids[NP] = {0, 1, 2, 3, 4};
  zck_layout *l;
  if (stage == 3) {
    zck_group_spec subs[2] = {{ids, 3, 0}, {ids + 3, 2, 0}};
    ZT_OK(zck_layout_zero3(NP, numel, subs, 2, W, &l));
  } else {
    zck_group_spec g[2] = {{ids, 2, 0}, {ids + 2, 3, 1}};
    ZT_OK(zck_layout_zero12(NP, numel, g, 2, W, 1, &l));
  }
  /* fill each store (an fp32 partition) from its pieces; padding NaN, which must not leak */
  float **store = calloc(l->n_stores, sizeof *store);
  zck_gather_src *srcs = calloc(l->n_stores, sizeof *srcs);
  for (size_t s = 0; s < l->n_stores; s++) {
    store[s] = malloc((l->stores[s].numel ? l->stores[s].numel : 1) * sizeof(float));
    for (uint64_t j = 0; j < l->stores[s].numel; j++) store[s][j] = NAN;
    srcs[s] = (zck_gather_src){store[s], ZCK_F32, l->stores[s].numel};
  }
  for (size_t i = 0; i < l->n_pieces; i++) {
    const zck_piece *pc = &l->pieces[i];
    for (uint64_t j = 0; j < pc->count; j++) store[pc->store][pc->store_off + j] = value_of(pc->param, pc->param_off + j);
  }
  /* output: params in order, param 2 left out (as a frozen / tied one would be) */
  uint64_t dst[NP], off = 0;
  for (int p = 0; p < NP; p++) {
    dst[p] = p == 2 ? UINT64_MAX : off;
    if (p != 2) off += numel[p];
  }
  zck_gather_extent *ext;
  size_t n_ext;
  ZT_OK(zck_gather_extents_from_layout(l, dst, &ext, &n_ext));
  zck_gather_plan *p;
  ZT_OK(zck_gather_plan_build(srcs, l->n_stores, ext, n_ext, ZCK_BF16, 6, &p));
  ZT_EQ_U64(p->total, off);
  ZT_EQ_U64(p->dst_end, off);
  uint16_t *got = calloc(off, 2);
  sink sk = {(uint8_t *)got, off * 2, 0, 0, -1};
  ZT_OK(zck_gather_run_host(p, srcs, sink_write, &sk));
  for (int q = 0; q < NP; q++) {
    if (q == 2) continue;
    for (uint64_t j = 0; j < numel[q]; j++) {
      float f = value_of((uint32_t)q, j);
      uint16_t want;
      zck_convert(ZCK_BF16, &want, ZCK_F32, &f, 1);
      if (got[dst[q] + j] != want) ZT_FAIL("stage %d W %u: param %d element %llu: %04x != %04x", stage, W, q,
                                           (unsigned long long)j, got[dst[q] + j], want);
    }
  }
  free(got);
  zck_gather_plan_free(p);
  free(ext);
  for (size_t s = 0; s < l->n_stores; s++) free(store[s]);
  free(store);
  free(srcs);
  zck_layout_free(l);
}

int main(void) {
  for (int round = 0; round < 40; round++) random_case(round);
  for (int stage = 1; stage <= 3; stage += 2)
    for (uint32_t W = 1; W <= 4; W++) layout_case(stage, W);

  /* ---- refusals */
  float a[8] = {0};
  uint16_t h[4] = {0};
  zck_gather_src srcs[2] = {{a, ZCK_F32, 8}, {h, ZCK_BF16, 4}};
  zck_gather_plan *p;
  zck_gather_extent over[2] = {{0, 0, 10, 4}, {1, 0, 12, 2}};
  ZT_ERR(zck_gather_plan_build(srcs, 2, over, 2, ZCK_BF16, 64, &p), ZCK_ERR_INVALID_ARG, "overlap in the output at element 12");
  ZT_ASSERT(p == NULL);
  zck_gather_extent oob = {1, 2, 0, 3};
  ZT_ERR(zck_gather_plan_build(srcs, 2, &oob, 1, ZCK_BF16, 64, &p), ZCK_ERR_INVALID_ARG,
         "extent 0 reads elements [2, 5) of source 1, which holds 4");
  zck_gather_extent wrap = {0, UINT64_MAX - 1, 0, 4};
  ZT_ERR(zck_gather_plan_build(srcs, 2, &wrap, 1, ZCK_BF16, 64, &p), ZCK_ERR_INVALID_ARG, "reads elements");
  zck_gather_extent far = {0, 0, UINT64_MAX - 2, 4};
  ZT_ERR(zck_gather_plan_build(srcs, 2, &far, 1, ZCK_BF16, 64, &p), ZCK_ERR_INVALID_ARG, "past the end");
  zck_gather_extent bad_src = {2, 0, 0, 1};
  ZT_ERR(zck_gather_plan_build(srcs, 2, &bad_src, 1, ZCK_BF16, 64, &p), ZCK_ERR_INVALID_ARG, "names source 2 of 2");
  ZT_ERR(zck_gather_plan_build(srcs, 2, NULL, 0, ZCK_F16, 64, &p), ZCK_ERR_INVALID_ARG, "output dtype float16");
  ZT_ERR(zck_gather_plan_build(srcs, 2, NULL, 0, ZCK_BF16, 1, &p), ZCK_ERR_INVALID_ARG, "holds no bfloat16");
  zck_gather_src i64src = {a, ZCK_I64, 4};
  ZT_ERR(zck_gather_plan_build(&i64src, 1, NULL, 0, ZCK_BF16, 64, &p), ZCK_ERR_INVALID_ARG, "source 0 is int64");
  /* nothing to write: no buckets, no calls */
  ZT_OK(zck_gather_plan_build(srcs, 2, NULL, 0, ZCK_BF16, 64, &p));
  ZT_EQ_INT(p->n_buckets, 0);
  sink none = {NULL, 0, 0, 0, -1};
  ZT_OK(zck_gather_run_host(p, srcs, sink_write, &none));
  ZT_EQ_INT(none.calls, 0);
  zck_gather_plan_free(p);
  /* the writer's error travels with the byte range */
  zck_gather_extent two[2] = {{0, 0, 0, 8}, {1, 0, 100, 4}};
  ZT_OK(zck_gather_plan_build(srcs, 2, two, 2, ZCK_BF16, 8, &p));
  uint8_t out[208];
  sink failing = {out, sizeof out, 0, 0, 2};
  ZT_ERR(zck_gather_run_host(p, srcs, sink_write, &failing), ZCK_ERR_NO_SPACE, "writing output bytes [200, 208)");
  /* sources that do not match the plan */
  zck_gather_src other[2] = {{h, ZCK_BF16, 4}, {h, ZCK_BF16, 4}};
  ZT_ERR(zck_gather_run_host(p, other, sink_write, &failing), ZCK_ERR_INVALID_ARG, "the plan was made for float32[8]");
  zck_gather_plan_free(p);
  zck_gather_plan_free(NULL);
  /* a param placed so far out that its elements' offsets wrap: refused, not wrapped to 0 */
  zck_piece piece = {0, 0, 16, 0, 4, 0, 0};
  zck_layout_store one_store = {-1, -1, -1, 4, 4};
  uint64_t one_numel = 20;
  zck_layout *one;
  ZT_OK(zck_layout_custom(1, &one_numel, &one_store, 1, &piece, 1, &one));
  uint64_t far_dst = UINT64_MAX - 8;
  zck_gather_extent *ext = (zck_gather_extent *)one;
  size_t n_ext = 7;
  ZT_ERR(zck_gather_extents_from_layout(one, &far_dst, &ext, &n_ext), ZCK_ERR_INVALID_ARG,
         "param 0 lies past the addressable output");
  ZT_ASSERT(ext == NULL && n_ext == 0);
  zck_layout_free(one);
  printf("gather plan: ok\n");
  return 0;
}
