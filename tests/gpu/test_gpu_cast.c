/* test_gpu_cast.c: the device casts against zck_convert, bit for bit: fp32 -> bf16 on 2^24
 * patterns that cover every sign/exponent/upper-mantissa value with varying low bits, plus
 * the specials (zeros, infinities, NaNs with payloads, subnormals, exact ties, the largest
 * finite values); bf16 -> fp32 on all 65536 patterns. */
#include "gpu_util.h"

#define CHUNK ((size_t)1 << 22)

static void check_f32_chunk(const uint32_t *bits, size_t n, float *d_src, uint16_t *d_dst, uint16_t *got,
                            uint16_t *want) {
  ZT_OK(zck_cuda_memcpy(d_src, bits, n * 4));
  ZT_OK(zck_cuda_f32_to_bf16(d_src, d_dst, n, NULL));
  gpu_get(got, d_dst, n * 2);
  ZT_OK(zck_convert(ZCK_BF16, want, ZCK_F32, bits, n));
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) ZT_FAIL("fp32 0x%08x: device bf16 0x%04x, zck_convert 0x%04x", bits[i], got[i], want[i]);
}

int main(void) {
  if (zck_cuda_device_count() == 0) zt_skip("no CUDA device");
  float *d_src = gpu_alloc(CHUNK * 4);
  uint16_t *d_dst = gpu_alloc(CHUNK * 2);
  uint32_t *bits = malloc(CHUNK * 4);
  uint16_t *got = malloc(CHUNK * 2), *want = malloc(CHUNK * 2);
  /* 2^24 patterns: the upper 24 bits all taken, the low 8 bits a scramble of them */
  size_t total = 0;
  for (uint64_t base = 0; base < ((uint64_t)1 << 24); base += CHUNK) {
    for (size_t i = 0; i < CHUNK; i++) {
      uint32_t hi = (uint32_t)(base + i);
      bits[i] = (hi << 8) | ((hi * 151u + (hi >> 9)) & 0xFFu);
    }
    check_f32_chunk(bits, CHUNK, d_src, d_dst, got, want);
    total += CHUNK;
  }
  static const uint32_t specials[] = {
      0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,
      0x7FBFFFFF, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA00000, 0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,
      0x00008000, 0x00018000, 0x00800000, 0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x3F800000,
      0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x7F7EFFFF, 0x477FE000, 0x3F7FFFFF, 0xBF7FFFFF};
  size_t ns = sizeof specials / sizeof *specials;
  memcpy(bits, specials, sizeof specials);
  check_f32_chunk(bits, ns, d_src, d_dst, got, want);
  total += ns;
  printf("  fp32 -> bf16: %zu patterns identical to zck_convert\n", total);
  /* bf16 -> fp32, every pattern */
  uint16_t *all = malloc(65536 * 2);
  float *wf = malloc(65536 * 4), *gf = malloc(65536 * 4);
  for (uint32_t i = 0; i < 65536; i++) all[i] = (uint16_t)i;
  uint16_t *d_all = gpu_dup(all, 65536 * 2);
  float *d_f = gpu_alloc(65536 * 4);
  ZT_OK(zck_cuda_bf16_to_f32(d_all, d_f, 65536, NULL));
  gpu_get(gf, d_f, 65536 * 4);
  ZT_OK(zck_convert(ZCK_F32, wf, ZCK_BF16, all, 65536));
  gpu_same("bf16 -> fp32 (all 65536)", gf, wf, 65536 * 4);
  /* n = 0 is a no-op; odd sizes and a non-default stream */
  ZT_OK(zck_cuda_f32_to_bf16(d_src, d_dst, 0, NULL));
  void *st;
  ZT_OK(zck_cuda_stream_create(&st));
  for (size_t i = 0; i < 1001; i++) bits[i] = (uint32_t)(i * 2654435761u);
  ZT_OK(zck_cuda_memcpy(d_src, bits, 1001 * 4));
  ZT_OK(zck_cuda_f32_to_bf16(d_src, d_dst, 1001, st));
  ZT_OK(zck_cuda_stream_sync(st));
  gpu_get(got, d_dst, 1001 * 2);
  ZT_OK(zck_convert(ZCK_BF16, want, ZCK_F32, bits, 1001));
  gpu_same("fp32 -> bf16 on a stream", got, want, 1001 * 2);
  zck_cuda_stream_destroy(st);
  zck_cuda_free(d_src);
  zck_cuda_free(d_dst);
  zck_cuda_free(d_all);
  zck_cuda_free(d_f);
  free(bits);
  free(got);
  free(want);
  free(all);
  free(wf);
  free(gf);
  return 0;
}
