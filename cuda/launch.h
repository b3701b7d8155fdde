/* launch.h: the launch geometry and index math of the kernels in cuda/ (kernels.cu,
 * attention.cu, pack.cu), in plain C that compiles both as host code and as device code.
 * The kernels call these functions, and tests/gpu/test_launch.c (label unit) checks them
 * on the host, so grid sizes (never 0, within CUDA's limits, covering every row) and the
 * 64-bit index decompositions are tested on machines without a GPU.
 */
#ifndef ZCK_CUDA_LAUNCH_H
#define ZCK_CUDA_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define ZCK_HD static inline __host__ __device__
#else
#define ZCK_HD static inline
#endif

/* Blocks of a grid-stride launch over n elements: at least 1 (a grid of 0 blocks is a
 * launch error), at most ZCK_GRID_STRIDE_MAX (the loops cover the rest). */
#define ZCK_GRID_STRIDE_MAX (65535u * 8u)
ZCK_HD unsigned zck__grid_stride(size_t n, unsigned threads) {
  size_t b = n / threads + (n % threads != 0);
  if (b > ZCK_GRID_STRIDE_MAX) b = ZCK_GRID_STRIDE_MAX;
  return b ? (unsigned)b : 1u;
}

/* Blocks of a launch with one row per `per_block` slots (warps) and no stride loop: every
 * row gets a slot. 0 when that needs more than 2^31 - 1 blocks (the caller refuses). */
#define ZCK_GRID_X_MAX 2147483647u
ZCK_HD unsigned zck__grid_rows(size_t rows, unsigned per_block) {
  size_t b = rows / per_block + (rows % per_block != 0);
  return b > ZCK_GRID_X_MAX ? 0u : (unsigned)b;
}

/* Row r of a (B, H, T) row space (attention rows): b, h, t. */
ZCK_HD void zck__bht(size_t r, int H, int T, int *b, int *h, int *t) {
  *t = (int)(r % (size_t)T);
  *h = (int)((r / (size_t)T) % (size_t)H);
  *b = (int)(r / ((size_t)T * (size_t)H));
}

/* Element e of a (B, T, C) tensor: b, t, c. */
ZCK_HD void zck__btc(size_t e, int T, int C, int *b, int *t, int *c) {
  *c = (int)(e % (size_t)C);
  *t = (int)((e / (size_t)C) % (size_t)T);
  *b = (int)(e / ((size_t)C * (size_t)T));
}

/* Index in qkv (B, T, 3C) of part (0 q, 1 k, 2 v), head h, dimension i (head size hs). */
ZCK_HD size_t zck__qkv_at(int T, int C, int hs, int b, int t, int part, int h, int i) {
  return ((size_t)b * (size_t)T + (size_t)t) * 3u * (size_t)C + (size_t)part * (size_t)C + (size_t)h * (size_t)hs +
         (size_t)i;
}

/* Index in att (B, H, T, T) of [b, h, t, t2]. */
ZCK_HD size_t zck__att_at(int H, int T, int b, int h, int t, int t2) {
  return (((size_t)b * (size_t)H + (size_t)h) * (size_t)T + (size_t)t) * (size_t)T + (size_t)t2;
}

/* pack.cu: ranges per launch (grid.y's limit) and x blocks per range. */
#define ZCK_PACK_THREADS 256u
#define ZCK_PACK_RANGES_PER_LAUNCH 65535u
#define ZCK_PACK_X_MAX 1024u
ZCK_HD unsigned zck__pack_grid_x(uint64_t max_count) {
  uint64_t b = max_count / ZCK_PACK_THREADS + (max_count % ZCK_PACK_THREADS != 0);
  if (b > ZCK_PACK_X_MAX) b = ZCK_PACK_X_MAX;
  return b ? (unsigned)b : 1u;
}

#endif
