/* test_strided.c: strided pieces and extents (layout.h's runs): a block of a 2-D tensor (a
 * tensor-parallel chunk, rows x some columns) is one piece and copies as one extent.
 * Checked: the runs arithmetic, the layout's overlap checks, the planner's extents against a
 * contiguous target (whole tensor, ranges cutting rows), split and unstride, and the
 * executor's copies (memory and file targets, dtype casts, tiny staging buffers, the
 * record CRC of every byte read, target CRCs) against a copy made element by element.
 * Edge cases: one run, a partial last run, a stride equal to the run, pieces given in
 * reversed order. */
#include "exec.h"
#include "plan.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void test_runs(void) {
  /* runs of 3, 10 apart, 8 elements: [5,8) [15,18) [25,27) */
  ZT_EQ_U64(zck_runs_n(8, 3), 3);
  ZT_EQ_U64(zck_runs_n(8, 0), 1);
  ZT_EQ_U64(zck_runs_at(5, 3, 10, 0), 5);
  ZT_EQ_U64(zck_runs_at(5, 3, 10, 4), 16);
  ZT_EQ_U64(zck_runs_at(5, 3, 10, 7), 26);
  ZT_EQ_U64(zck_runs_end(5, 8, 3, 10), 27);
  ZT_EQ_U64(zck_runs_before(5, 8, 3, 10, 5), 0);
  ZT_EQ_U64(zck_runs_before(5, 8, 3, 10, 7), 2);
  ZT_EQ_U64(zck_runs_before(5, 8, 3, 10, 12), 3);   /* in the gap */
  ZT_EQ_U64(zck_runs_before(5, 8, 3, 10, 26), 7);
  ZT_EQ_U64(zck_runs_before(5, 8, 3, 10, 100), 8);
  ZT_EQ_U64(zck_runs_before(5, 8, 0, 0, 9), 4);     /* contiguous */
}

/* One param of R x C elements whose stores are T column blocks (widths w[t]), each a
 * strided piece (store t holds rows x w[t], row-major), listed in reversed order. */
static zck_layout *column_blocks(uint64_t R, uint64_t C, const uint64_t *w, uint32_t T) {
  zck_layout_store st[8];
  zck_piece pc[8];
  uint64_t numel = R * C, col = 0;
  for (uint32_t t = 0; t < T; t++) {
    st[t] = (zck_layout_store){-1, -1, -1, R * w[t], R * w[t]};
    pc[T - 1 - t] = (zck_piece){0, t, col, 0, R * w[t], w[t], C};
    col += w[t];
  }
  zck_layout *l;
  ZT_OK(zck_layout_custom(1, &numel, st, T, pc, T, &l));
  return l;
}

static void test_layout_checks(void) {
  uint64_t numel = 40;   /* 4 rows of 10 */
  zck_layout_store st[2] = {{-1, -1, -1, 40, 40}, {-1, -1, -1, 40, 40}};
  zck_layout *l;
  /* columns [0,4) and [3,6) of every row: element 3 twice */
  zck_piece a[] = {{0, 0, 0, 0, 16, 4, 10}, {0, 1, 3, 0, 12, 3, 10}};
  ZT_ERR(zck_layout_custom(1, &numel, st, 2, a, 2, &l), ZCK_ERR_FORMAT, "mapped twice");
  /* columns [0,4) and [4,10): disjoint, 40 elements */
  zck_piece b[] = {{0, 1, 4, 0, 24, 6, 10}, {0, 0, 0, 0, 16, 4, 10}};
  ZT_OK(zck_layout_custom(1, &numel, st, 2, b, 2, &l));
  ZT_EQ_U64(zck_layout_param_covered(l, 0), 40);
  zck_layout_free(l);
  /* a wrapping run (start at column 8, runs of 4: [8,12) [18,22) ...) against column 0..2 */
  zck_piece c[] = {{0, 0, 8, 0, 12, 4, 10}, {0, 1, 20, 0, 2, 0, 0}};
  ZT_ERR(zck_layout_custom(1, &numel, st, 2, c, 2, &l), ZCK_ERR_FORMAT, "mapped twice");
  zck_piece c2[] = {{0, 0, 8, 0, 12, 4, 10}, {0, 1, 22, 0, 6, 0, 0}};
  ZT_OK(zck_layout_custom(1, &numel, st, 2, c2, 2, &l));
  zck_layout_free(l);
  /* a partial last run: 3 runs of 4 then 2 ([30,32)); a piece at [32, 34) is free, [31, 33) not */
  zck_piece d[] = {{0, 0, 0, 0, 14, 4, 10}, {0, 1, 32, 0, 2, 0, 0}};
  ZT_OK(zck_layout_custom(1, &numel, st, 2, d, 2, &l));
  zck_layout_free(l);
  zck_piece e[] = {{0, 0, 0, 0, 14, 4, 10}, {0, 1, 31, 0, 2, 0, 0}};
  ZT_ERR(zck_layout_custom(1, &numel, st, 2, e, 2, &l), ZCK_ERR_FORMAT, "mapped twice");
  /* different strides: runs of 2, 10 apart vs runs of 1, 5 apart starting at 6: 11 hit? 6, 11(no: [10,12) yes) */
  zck_piece f[] = {{0, 0, 0, 0, 8, 2, 10}, {0, 1, 6, 0, 4, 1, 5}};
  ZT_ERR(zck_layout_custom(1, &numel, st, 2, f, 2, &l), ZCK_ERR_FORMAT, "mapped twice");
  /* runs longer than their stride; runs past the tensor */
  zck_piece g[] = {{0, 0, 0, 0, 8, 4, 3}};
  ZT_ERR(zck_layout_custom(1, &numel, st, 1, g, 1, &l), ZCK_ERR_FORMAT, "overlap");
  zck_piece h[] = {{0, 0, 8, 0, 16, 4, 10}};
  ZT_ERR(zck_layout_custom(1, &numel, st, 1, h, 1, &l), ZCK_ERR_FORMAT, "past");
  /* one run: a strided piece of one run is a contiguous one */
  zck_piece k[] = {{0, 0, 0, 0, 40, 40, 40}};
  ZT_OK(zck_layout_custom(1, &numel, st, 1, k, 1, &l));
  ZT_EQ_U64(l->pieces[0].run, 0);
  zck_layout_free(l);
}

static void test_plan_shapes(void) {
  /* 6 rows x 10 columns in blocks of 4, 3, 3 (reversed in the piece list) into the whole
   * tensor: one strided extent per block */
  uint64_t w[] = {4, 3, 3}, numel = 60;
  zck_layout *src = column_blocks(6, 10, w, 3), *dst, *ranges;
  ZT_OK(zck_layout_whole(1, &numel, NULL, 0, &dst));
  zck_plan *p;
  ZT_OK(zck_plan_build(src, dst, NULL, &p));
  ZT_EQ_INT(p->n, 3);
  ZT_EQ_U64(p->total, 60);
  for (size_t i = 0; i < 3; i++) {
    const zck_extent *e = &p->ext[i];
    ZT_EQ_U64(e->src_store, i);
    ZT_EQ_U64(e->src_off, 0);
    ZT_EQ_U64(e->dst_off, i == 0 ? 0 : i == 1 ? 4 : 7);
    ZT_EQ_U64(e->count, 6 * w[i]);
    ZT_EQ_U64(e->run, w[i]);
    ZT_EQ_U64(e->src_stride, w[i]);
    ZT_EQ_U64(e->dst_stride, 10);
  }
  zck_plan_free(p);
  /* into ranges [0, 25) and [25, 60) (a ZeRO-style cut mid-row 2): block 0 holds row 2's
   * [20, 24) wholly in range 0; block 1 [24, 27) is cut: 1 element, then from 25 */
  zck_layout_store rs[2] = {{-1, -1, -1, 25, 25}, {-1, -1, -1, 35, 35}};
  zck_piece rp[2] = {{0, 0, 0, 0, 25, 0, 0}, {0, 1, 25, 0, 35, 0, 0}};
  ZT_OK(zck_layout_custom(1, &numel, rs, 2, rp, 2, &ranges));
  zck_plan_opts o = ZCK_PLAN_OPTS_INIT;
  o.order = ZCK_PLAN_BY_DST;
  ZT_OK(zck_plan_build(src, ranges, &o, &p));
  /* range 0: block 0 rows 0-2 (12, strided), block 1 rows 0-1 (6) + row 2's first element
   * (strided: last run partial), block 2 rows 0-1 (6); range 1: block 0 rows 3-5, block 1
   * row 2's rest (partial first run, contiguous) then rows 3-5, block 2 rows 2-5 */
  uint64_t sum = 0;
  size_t contiguous = 0;
  for (size_t i = 0; i < p->n; i++) {
    sum += p->ext[i].count;
    contiguous += !zck_extent_strided(&p->ext[i]);
  }
  ZT_EQ_U64(sum, 60);
  ZT_EQ_INT(p->n, 7);
  ZT_EQ_INT(contiguous, 1);
  /* split at 5 elements: whole runs of 4 -> 1 run a part, runs of 3 -> 1 run a part */
  ZT_OK(zck_plan_split(p, 5));
  sum = 0;
  for (size_t i = 0; i < p->n; i++) {
    ZT_ASSERT(p->ext[i].count <= 5);
    sum += p->ext[i].count;
  }
  ZT_EQ_U64(sum, 60);
  zck_plan *u;
  ZT_OK(zck_plan_unstride(p, true, &u));
  ZT_ASSERT(u == NULL);   /* split at 5 left one run a part */
  zck_plan_free(p);
  ZT_OK(zck_plan_build(src, dst, NULL, &p));
  ZT_OK(zck_plan_unstride(p, false, &u));
  ZT_ASSERT(u == NULL);   /* every source side contiguous */
  ZT_OK(zck_plan_unstride(p, true, &u));
  ZT_EQ_INT(u->n, 18);    /* one per row per block */
  ZT_EQ_U64(u->ext[1].src_off, 4);
  ZT_EQ_U64(u->ext[1].dst_off, 10);
  zck_plan_free(u);
  zck_plan_free(p);
  /* the reverse: the whole tensor into the blocks (strided on the source side) */
  ZT_OK(zck_plan_build(dst, src, NULL, &p));
  ZT_EQ_INT(p->n, 3);
  ZT_EQ_U64(p->ext[0].src_stride, 10);
  ZT_EQ_U64(p->ext[0].dst_stride, 4);
  zck_plan_free(p);
  /* a target the blocks do not cover */
  uint64_t big = 70;
  zck_layout *whole70, *src70;
  ZT_OK(zck_layout_whole(1, &big, NULL, 0, &whole70));
  zck_layout_store st70 = {-1, -1, -1, 24, 24};
  zck_piece pc70 = {0, 0, 0, 0, 24, 4, 10};
  ZT_OK(zck_layout_custom(1, &big, &st70, 1, &pc70, 1, &src70));
  ZT_ERR(zck_plan_build(src70, whole70, NULL, &p), ZCK_ERR_MISMATCH, "in no source store");
  zck_layout_free(whole70);
  zck_layout_free(src70);
  zck_layout_free(ranges);
  zck_layout_free(src);
  zck_layout_free(dst);
}

/* ---- execution: blocks held in one "file" (a memory source, each block a zip-like record
 * with its CRC), copied into a whole tensor in memory and in a file, fp32 -> fp32 / bf16 */

static float cell(uint64_t r, uint64_t c) { return (float)(r * 1000 + c) + 0.25f; }

typedef struct blocks {
  uint64_t R, C, T, w[8];
  uint8_t *file;               /* the blocks back to back */
  uint64_t off[8];
  zck__source src;
  zck_record_check rec[8];
  zck_store st[8];
  zck_layout *layout;
} blocks;

static void blocks_make(blocks *b, uint64_t R, uint64_t C, const uint64_t *w, uint32_t T) {
  memset(b, 0, sizeof *b);
  b->R = R, b->C = C, b->T = T;
  uint64_t size = R * C * 4 + 16 * T, at = 0, col = 0;
  b->file = calloc(1, size);
  for (uint32_t t = 0; t < T; t++) {
    b->w[t] = w[t];
    at += 7;   /* bytes between records */
    b->off[t] = at;
    float *f = (float *)malloc(R * w[t] * 4);
    for (uint64_t r = 0; r < R; r++)
      for (uint64_t c = 0; c < w[t]; c++) f[r * w[t] + c] = cell(r, col + c);
    memcpy(b->file + at, f, R * w[t] * 4);
    b->rec[t] = (zck_record_check){at, R * w[t] * 4, zck_crc32_update(0, b->file + at, R * w[t] * 4), "block"};
    free(f);
    at += R * w[t] * 4;
    col += w[t];
  }
  zck__source_memory(&b->src, "blocks.bin", b->file, size);
  for (uint32_t t = 0; t < T; t++) {
    b->st[t] = zck_store_source(&b->src, b->off[t], ZCK_F32, R * w[t], "blocks.bin");
    b->st[t].record = &b->rec[t];
  }
  b->layout = column_blocks(R, C, w, T);
}

static void blocks_free(blocks *b) {
  zck_layout_free(b->layout);
  zck__source_close(&b->src);
  free(b->file);
}

static void run_case(blocks *b, const zck_layout *dst_layout, zck_dtype dt, size_t staging, bool to_file, bool crc,
                     uint64_t max_chunk) {
  uint64_t n = b->R * b->C;
  size_t es = zck_dtype_size(dt);
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.max_chunk = max_chunk;
  zck_plan *p;
  ZT_OK(zck_plan_build(b->layout, dst_layout, &po, &p));
  uint8_t *out = calloc(n, es);
  zck_store dst[2];
  FILE *tf = NULL;
  for (size_t s = 0; s < dst_layout->n_stores; s++) {
    uint64_t base = s ? dst_layout->stores[0].numel : 0;
    if (to_file) {
      if (!tf) tf = tmpfile();
      dst[s] = zck_store_fd(fileno(tf), base * es, dt, dst_layout->stores[s].numel, "out.bin");
    } else {
      dst[s] = zck_store_memory(out + base * es, dt, dst_layout->stores[s].numel, "out");
    }
  }
  zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
  eo.staging_bytes = staging;
  eo.threads = 2;
  uint32_t dcrc[2];
  ZT_OK(zck_exec_plan(p, b->st, dst, crc ? dcrc : NULL, &eo));
  if (tf) ZT_ASSERT(pread(fileno(tf), out, n * es, 0) == (ssize_t)(n * es));
  for (uint64_t r = 0; r < b->R; r++)
    for (uint64_t c = 0; c < b->C; c++) {
      float f = cell(r, c);
      uint8_t want[4];
      ZT_OK(zck_convert(dt, want, ZCK_F32, &f, 1));
      if (memcmp(out + (r * b->C + c) * es, want, es)) ZT_FAIL("element (%llu, %llu) wrong", (unsigned long long)r, (unsigned long long)c);
    }
  if (crc) {
    uint64_t base = 0;
    for (size_t s = 0; s < dst_layout->n_stores; s++) {
      uint64_t nb = dst_layout->stores[s].numel * es;
      ZT_EQ_U64(dcrc[s], zck_crc32_update(0, out + base, nb));
      base += nb;
    }
  }
  if (tf) fclose(tf);
  free(out);
  zck_plan_free(p);
}

static void test_exec(void) {
  uint64_t w[] = {5, 3, 4}, numel = 9 * 12;
  blocks b;
  blocks_make(&b, 9, 12, w, 3);
  zck_layout *whole, *ranges;
  ZT_OK(zck_layout_whole(1, &numel, NULL, 0, &whole));
  zck_layout_store rs[2] = {{-1, -1, -1, 50, 50}, {-1, -1, -1, 58, 58}};
  zck_piece rp[2] = {{0, 0, 0, 0, 50, 0, 0}, {0, 1, 50, 0, 58, 0, 0}};   /* cut mid-row 4 */
  ZT_OK(zck_layout_custom(1, &numel, rs, 2, rp, 2, &ranges));
  size_t stagings[] = {64, 256, 1 << 20};
  for (int to_file = 0; to_file < 2; to_file++)
    for (size_t si = 0; si < 3; si++)
      for (int crc = 0; crc < 2; crc++) {
        run_case(&b, whole, ZCK_F32, stagings[si], to_file, crc, 0);
        run_case(&b, whole, ZCK_BF16, stagings[si], to_file, crc, 0);
        run_case(&b, ranges, ZCK_F32, stagings[si], to_file, crc, 0);
        run_case(&b, ranges, ZCK_BF16, stagings[si], to_file, crc, 7);
      }
  /* a flipped byte inside a block fails its record's CRC */
  b.file[b.off[1] + 9] ^= 0x10;
  zck_plan *p;
  ZT_OK(zck_plan_build(b.layout, whole, NULL, &p));
  float *out = calloc(numel, 4);
  zck_store d = zck_store_memory(out, ZCK_F32, numel, "out");
  ZT_ERR(zck_exec_plan(p, b.st, &d, NULL, NULL), ZCK_ERR_DAMAGED, "CRC-32 mismatch");
  free(out);
  zck_plan_free(p);
  zck_layout_free(ranges);
  zck_layout_free(whole);
  blocks_free(&b);

  /* a stride equal to the run (one column block: the rows are contiguous) and one run */
  uint64_t one[] = {6};
  blocks_make(&b, 4, 6, one, 1);
  numel = 24;
  ZT_OK(zck_layout_whole(1, &numel, NULL, 0, &whole));
  run_case(&b, whole, ZCK_F32, 64, true, true, 0);
  run_case(&b, whole, ZCK_BF16, 64, false, false, 0);
  zck_layout_free(whole);
  blocks_free(&b);
  blocks_make(&b, 1, 6, (uint64_t[]){2, 4}, 2);
  numel = 6;
  ZT_OK(zck_layout_whole(1, &numel, NULL, 0, &whole));
  run_case(&b, whole, ZCK_F32, 64, true, true, 0);
  zck_layout_free(whole);
  blocks_free(&b);
}

int main(void) {
  test_runs();
  test_layout_checks();
  test_plan_shapes();
  test_exec();
  return 0;
}
