/* crc32.c: CRC-32 (zlib's / zip's, bit-reflected 0xEDB88320) at memory speed.
 *
 * Every byte a torch or zip writer emits is checksummed, so at checkpoint sizes the CRC
 * is a real share of the CPU time: zlib's table-driven crc32 runs at about 2 GB/s, the
 * carry-less multiply folding below (x86-64 with PCLMULQDQ, chosen at run time) at
 * about 10x that. Results are zlib's bit for bit; zlib does the sub-16-byte tails and
 * every CPU without the instructions.
 *
 * The folding follows Gopal et al., "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ Instruction" (Intel, 2009), with the bit-reflected constants and Barrett
 * reduction as Chromium's zlib uses them: four 128-bit lanes are folded 64 bytes at a
 * time by x^512 mod P, then into one lane by x^128 mod P, reduced to 64 bits and then
 * Barrett-reduced to 32.
 */
#include "exec.h"

#include <zlib.h>

static uint32_t crc32_zlib(uint32_t crc, const uint8_t *p, size_t n) {
  while (n) { /* zlib's length is a uInt */
    uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
    crc = (uint32_t)crc32(crc, p, k);
    p += k;
    n -= k;
  }
  return crc;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* The running (pre-inverted) register over len bytes: len >= 64, a multiple of 16. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc32_fold(uint32_t reg, const uint8_t *p, size_t len) {
  const __m128i k1k2 = _mm_set_epi64x(0x01c6e41596LL, 0x0154442bd4LL);  /* x^(4*128+32), x^(4*128-32) */
  const __m128i k3k4 = _mm_set_epi64x(0x00ccaa009eLL, 0x01751997d0LL);  /* x^(128+32), x^(128-32) */
  const __m128i k5 = _mm_set_epi64x(0, 0x0163cd6124LL);                 /* x^64 */
  const __m128i poly = _mm_set_epi64x(0x01f7011641LL, 0x01db710641LL);  /* P and its Barrett quotient */
  const __m128i low32 = _mm_setr_epi32(~0, 0, ~0, 0);
  __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 0));
  __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 16));
  __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 32));
  __m128i x4 = _mm_loadu_si128((const __m128i *)(p + 48));
  x1 = _mm_xor_si128(x1, _mm_cvtsi32_si128((int)reg));
  p += 64;
  len -= 64;
  for (; len >= 64; p += 64, len -= 64) {
    __m128i l1 = _mm_clmulepi64_si128(x1, k1k2, 0x00), h1 = _mm_clmulepi64_si128(x1, k1k2, 0x11);
    __m128i l2 = _mm_clmulepi64_si128(x2, k1k2, 0x00), h2 = _mm_clmulepi64_si128(x2, k1k2, 0x11);
    __m128i l3 = _mm_clmulepi64_si128(x3, k1k2, 0x00), h3 = _mm_clmulepi64_si128(x3, k1k2, 0x11);
    __m128i l4 = _mm_clmulepi64_si128(x4, k1k2, 0x00), h4 = _mm_clmulepi64_si128(x4, k1k2, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(l1, h1), _mm_loadu_si128((const __m128i *)(p + 0)));
    x2 = _mm_xor_si128(_mm_xor_si128(l2, h2), _mm_loadu_si128((const __m128i *)(p + 16)));
    x3 = _mm_xor_si128(_mm_xor_si128(l3, h3), _mm_loadu_si128((const __m128i *)(p + 32)));
    x4 = _mm_xor_si128(_mm_xor_si128(l4, h4), _mm_loadu_si128((const __m128i *)(p + 48)));
  }
  /* four lanes into one, then the remaining 16-byte blocks */
  __m128i next[3] = {x2, x3, x4};
  for (int i = 0; i < 3; i++) {
    __m128i l = _mm_clmulepi64_si128(x1, k3k4, 0x00), h = _mm_clmulepi64_si128(x1, k3k4, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(l, h), next[i]);
  }
  for (; len >= 16; p += 16, len -= 16) {
    __m128i l = _mm_clmulepi64_si128(x1, k3k4, 0x00), h = _mm_clmulepi64_si128(x1, k3k4, 0x11);
    x1 = _mm_xor_si128(_mm_xor_si128(l, h), _mm_loadu_si128((const __m128i *)p));
  }
  /* 128 -> 64 bits */
  __m128i t = _mm_clmulepi64_si128(x1, k3k4, 0x10);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), t);
  t = _mm_srli_si128(x1, 4);
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, low32), k5, 0x00), t);
  /* Barrett: 64 -> 32 bits */
  t = _mm_clmulepi64_si128(_mm_and_si128(x1, low32), poly, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), poly, 0x00);
  x1 = _mm_xor_si128(x1, t);
  return (uint32_t)_mm_extract_epi32(x1, 1);
}

static int crc32_have_clmul(void) {
  static int have = -1; /* benign race: every thread computes the same answer */
  if (have < 0) {
    __builtin_cpu_init();
    have = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  }
  return have;
}
#endif

uint32_t zck_crc32_update(uint32_t crc, const void *data, size_t n) {
  const uint8_t *p = data;
#if defined(__x86_64__) && defined(__GNUC__)
  if (n >= 64 && crc32_have_clmul()) {
    size_t blocks = n & ~(size_t)15;
    crc = ~crc32_fold(~crc, p, blocks);
    p += blocks;
    n -= blocks;
  }
#endif
  return crc32_zlib(crc, p, n);
}
