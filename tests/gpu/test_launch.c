/* test_launch.c: the launch geometry and index math of cuda/'s kernels (cuda/launch.h),
 * which the kernels call, checked on the host (label unit, no device needed):
 *  - grids are never empty (a 0-block launch is an error), stay within CUDA's limits, and
 *    give every row its slot; row launches too large for a grid are reported (0);
 *  - the (B, H, T) and (B, T, C) decompositions invert the row-major index, and the qkv /
 *    att indices are bijections onto their tensors, also past 2^32 elements (size_t math);
 *  - argument checks of the kernel entry points that run before any device call (CUDA
 *    builds only: a build without CUDA reports "built without CUDA" first). */
#include "test.h"

#include "launch.h"
#include "zck_cuda.h"

#include <limits.h>

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void test_grid_stride(void) {
  static const uint64_t ns[] = {0, 1, 2, 31, 32, 255, 256, 257, 1000, 65535ull * 8 * 256, 65535ull * 8 * 256 + 1,
                                (1ull << 31) + 3, 1ull << 40};
  static const unsigned threads[] = {32, 128, 256, 1024};
  for (size_t i = 0; i < sizeof ns / sizeof *ns; i++)
    for (size_t j = 0; j < sizeof threads / sizeof *threads; j++) {
      size_t n = (size_t)ns[i];
      unsigned t = threads[j], b = zck__grid_stride(n, t);
      ZT_ASSERT(b >= 1 && b <= ZCK_GRID_STRIDE_MAX);
      if (n && (uint64_t)n <= (uint64_t)ZCK_GRID_STRIDE_MAX * t) {
        /* one thread per element, no idle block */
        ZT_ASSERT((uint64_t)b * t >= n);
        ZT_ASSERT((uint64_t)(b - 1) * t < n);
      } else if (n) {
        ZT_EQ_U64(b, ZCK_GRID_STRIDE_MAX); /* the grid-stride loops cover the rest */
      }
    }
}

static void test_grid_rows(void) {
  static const uint64_t rows[] = {1, 3, 4, 5, 26, 127, 128, 129, (uint64_t)INT_MAX, 4ull * ZCK_GRID_X_MAX,
                                  4ull * ZCK_GRID_X_MAX + 1, 1ull << 40};
  static const unsigned per[] = {1, 4, 128};
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
    for (size_t j = 0; j < sizeof per / sizeof *per; j++) {
      uint64_t r = rows[i];
      unsigned p = per[j], b = zck__grid_rows((size_t)r, p);
      uint64_t need = (r + p - 1) / p;
      if (need > ZCK_GRID_X_MAX) {
        ZT_EQ_U64(b, 0); /* refused, not truncated */
      } else {
        ZT_EQ_U64(b, need);
        ZT_ASSERT(b >= 1 && (uint64_t)b * p >= r && (uint64_t)(b - 1) * p < r);
      }
    }
}

static void test_pack_grid(void) {
  ZT_EQ_U64(zck__pack_grid_x(0), 1);
  ZT_EQ_U64(zck__pack_grid_x(1), 1);
  ZT_EQ_U64(zck__pack_grid_x(256), 1);
  ZT_EQ_U64(zck__pack_grid_x(257), 2);
  ZT_EQ_U64(zck__pack_grid_x(1ull << 40), ZCK_PACK_X_MAX);
  ZT_ASSERT(ZCK_PACK_RANGES_PER_LAUNCH <= 65535u); /* gridDim.y's limit */
}

/* Every (b, h, t) and (b, t, c) of a small shape, in row-major order. */
static void test_decompose_small(int B, int H, int T, int C) {
  size_t r = 0;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++, r++) {
        int b2, h2, t2;
        zck__bht(r, H, T, &b2, &h2, &t2);
        if (b2 != b || h2 != h || t2 != t) ZT_FAIL("bht(%zu): (%d, %d, %d), want (%d, %d, %d)", r, b2, h2, t2, b, h, t);
      }
  size_t e = 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int c = 0; c < C; c++, e++) {
        int b2, t2, c2;
        zck__btc(e, T, C, &b2, &t2, &c2);
        if (b2 != b || t2 != t || c2 != c) ZT_FAIL("btc(%zu): (%d, %d, %d), want (%d, %d, %d)", e, b2, t2, c2, b, t, c);
      }
  /* qkv and att indices: each element of the tensor exactly once */
  int hs = C / H;
  size_t nq = (size_t)B * T * 3 * C, na = (size_t)B * H * T * T;
  unsigned char *seen = calloc(nq > na ? nq : na, 1);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int part = 0; part < 3; part++)
        for (int h = 0; h < H; h++)
          for (int i = 0; i < hs; i++) {
            size_t k = zck__qkv_at(T, C, hs, b, t, part, h, i);
            ZT_ASSERT(k < nq && !seen[k]);
            seen[k] = 1;
          }
  for (size_t k = 0; k < nq; k++) ZT_ASSERT(seen[k]);
  memset(seen, 0, na);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < H; h++)
      for (int t = 0; t < T; t++)
        for (int t2 = 0; t2 < T; t2++) {
          size_t k = zck__att_at(H, T, b, h, t, t2);
          ZT_ASSERT(k < na && !seen[k]);
          seen[k] = 1;
        }
  for (size_t k = 0; k < na; k++) ZT_ASSERT(seen[k]);
  free(seen);
}

/* Shapes whose tensors pass 2^31 and 2^32 elements: 64-bit reference arithmetic. */
static void test_decompose_large(void) {
  static const int shapes[][4] = {{64, 25, 2048, 1600}, {512, 48, 2048, 6144}, {7, 12, 65536, 4608}};
  for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
    int B = shapes[s][0], H = shapes[s][1], T = shapes[s][2], C = shapes[s][3], hs = C / H;
    uint64_t nbtc = (uint64_t)B * T * C, nbht = (uint64_t)B * H * T;
    ZT_ASSERT(nbtc > UINT32_MAX || (uint64_t)B * H * T * T > UINT32_MAX);
    for (int k = 0; k < 20000; k++) {
      uint64_t e = k < 4 ? (k & 1 ? nbtc - 1 : (uint64_t)INT_MAX + (uint64_t)k) : next() % nbtc;
      if (e >= nbtc) e = nbtc - 1;
      int b, t, c;
      zck__btc((size_t)e, T, C, &b, &t, &c);
      ZT_ASSERT(b >= 0 && b < B && t >= 0 && t < T && c >= 0 && c < C);
      ZT_EQ_U64(((uint64_t)b * T + t) * C + c, e);
      uint64_t r = next() % nbht;
      int h, t2;
      zck__bht((size_t)r, H, T, &b, &h, &t2);
      ZT_ASSERT(b >= 0 && b < B && h >= 0 && h < H && t2 >= 0 && t2 < T);
      ZT_EQ_U64(((uint64_t)b * H + h) * T + t2, r);
      int part = (int)(next() % 3), i = (int)(next() % (uint64_t)hs);
      ZT_EQ_U64(zck__qkv_at(T, C, hs, b, t, part, h, i), ((uint64_t)b * T + t) * 3 * C + (uint64_t)part * C + (uint64_t)h * hs + i);
      ZT_ASSERT(zck__qkv_at(T, C, hs, B - 1, T - 1, 2, H - 1, hs - 1) == (uint64_t)B * T * 3 * C - 1);
      ZT_EQ_U64(zck__att_at(H, T, b, h, t, t2), (((uint64_t)b * H + h) * T + t) * T + t2);
      ZT_ASSERT(zck__att_at(H, T, B - 1, H - 1, T - 1, T - 1) == (uint64_t)B * H * T * T - 1);
    }
  }
}

/* Argument checks that come before any device call (a CUDA build, with or without a GPU). */
static void test_argument_checks(void) {
  if (!zck_cuda_built()) {
    printf("built without CUDA: the device entry points only say so (test_cuda_api)\n");
    return;
  }
  ZT_ERR(zck_cuda_encoder_forward(NULL, NULL, NULL, NULL, 4, 0, 8, NULL), ZCK_ERR_INVALID_ARG, "sequence length 0");
  ZT_ERR(zck_cuda_encoder_backward(NULL, NULL, NULL, NULL, 4, 0, 8, NULL), ZCK_ERR_INVALID_ARG, "sequence length 0");
  ZT_ERR(zck_cuda_layernorm_forward(NULL, NULL, NULL, NULL, NULL, NULL, -1, 8, NULL), ZCK_ERR_INVALID_ARG, "negative");
  ZT_ERR(zck_cuda_attention_forward(NULL, NULL, NULL, 1, 4, 50, 4, NULL), ZCK_ERR_INVALID_ARG, "multiple of H");
  ZT_ERR(zck_cuda_attention_backward(NULL, NULL, NULL, NULL, NULL, 1, 4, 0, 1, NULL), ZCK_ERR_INVALID_ARG, "C 0");
  ZT_ERR(zck_cuda_attention_forward(NULL, NULL, NULL, 65536, 65536, 64, 64, NULL), ZCK_ERR_INVALID_ARG, "too many");
  ZT_ERR(zck_cuda_softmax_xent_forward(NULL, NULL, NULL, NULL, 2, -3, NULL), ZCK_ERR_INVALID_ARG, "negative");
  ZT_ERR(zck_cuda_gemm(NULL, 0, 0, 1, 1, 1, 1, NULL, 1, NULL, 1, ZCK_F16, 0, NULL, 1), ZCK_ERR_INVALID_ARG, "float16");
  ZT_ERR(zck_cuda_gemm(NULL, 0, 0, 1, -1, 1, 1, NULL, 1, NULL, 1, ZCK_F32, 0, NULL, 1), ZCK_ERR_INVALID_ARG, "negative");
  zck_cuda_adamw_args a = {1e-3, 0.9, 0.999, 1e-8, 0.0, 0, 1.0, 0, NULL, ZCK_BF16};
  ZT_ERR(zck_cuda_adamw(NULL, NULL, NULL, NULL, 1, &a, NULL), ZCK_ERR_INVALID_ARG, "steps count from 1");
  a.step = 1;
  a.d_lp_out = &a;
  a.lp_dtype = ZCK_F16;
  ZT_ERR(zck_cuda_adamw(NULL, NULL, NULL, NULL, 1, &a, NULL), ZCK_ERR_INVALID_ARG, "float16");
  zck_cuda_gpt2_config c = {50257, 65536, 2, 4, 64};
  zck_cuda_gpt2 *m = (zck_cuda_gpt2 *)&c;
  ZT_ERR(zck_cuda_gpt2_create(NULL, &c, 65536, 65536, &m), ZCK_ERR_INVALID_ARG, "more than 2^31 - 1 positions");
  ZT_ASSERT(m == NULL);
  c.n_embd = 66;
  ZT_ERR(zck_cuda_gpt2_create(NULL, &c, 1, 8, &m), ZCK_ERR_INVALID_ARG, "bad configuration");
  /* zero-size launches are no launches: fine with no device too */
  ZT_OK(zck_cuda_gelu_forward(NULL, NULL, 0, NULL));
  ZT_OK(zck_cuda_residual_backward(NULL, NULL, NULL, 0, NULL));
  ZT_OK(zck_cuda_encoder_forward(NULL, NULL, NULL, NULL, 0, 1, 8, NULL));
  ZT_OK(zck_cuda_layernorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, 8, NULL));
  ZT_OK(zck_cuda_attention_forward(NULL, NULL, NULL, 0, 4, 8, 2, NULL));
  ZT_OK(zck_cuda_softmax_xent_backward(NULL, NULL, NULL, 0, 7, 1.0f, NULL));
  ZT_OK(zck_cuda_adamw(NULL, NULL, NULL, NULL, 0, &(zck_cuda_adamw_args){1e-3, 0.9, 0.999, 1e-8, 0, 1, 1, 0, NULL, ZCK_BF16}, NULL));
}

int main(void) {
  test_grid_stride();
  test_grid_rows();
  test_pack_grid();
  test_decompose_small(2, 4, 13, 48);
  test_decompose_small(3, 3, 33, 9);
  test_decompose_small(1, 1, 1, 1);
  test_decompose_large();
  test_argument_checks();
  printf("launch geometry and index math: ok\n");
  return 0;
}
