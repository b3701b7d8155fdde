/* test_crc32.c: zck_crc32_update (ISA-L) and zck_crc32 (zip) give zlib's crc32 bit for
 * bit: every length 0..300 at every alignment 0..15, longer random lengths, continuation
 * from a non-zero CRC in pieces, and zck_crc32_combine joining the pieces. */
#include "exec.h"
#include "test.h"
#include "zip/zip.h"

#include <stdlib.h>
#include <zlib.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static uint32_t zlib_crc(uint32_t crc, const uint8_t *p, size_t n) { return (uint32_t)crc32(crc, p, (uInt)n); }

int main(void) {
  size_t cap = (1u << 20) + 64;
  uint8_t *buf = malloc(cap);
  ZT_ASSERT(buf);
  for (size_t i = 0; i < cap; i++) buf[i] = (uint8_t)next();

  ZT_EQ_U64(zck_crc32_update(0, buf, 0), 0);
  ZT_EQ_U64(zck_crc32_update(0x12345678u, buf, 0), 0x12345678u);
  /* "123456789": the CRC-32 check value */
  ZT_EQ_U64(zck_crc32_update(0, "123456789", 9), 0xCBF43926u);

  for (size_t align = 0; align < 16; align++)
    for (size_t n = 0; n <= 300; n++) {
      uint32_t seed = (uint32_t)next();
      ZT_EQ_U64(zck_crc32_update(0, buf + align, n), zlib_crc(0, buf + align, n));
      ZT_EQ_U64(zck_crc32_update(seed, buf + align, n), zlib_crc(seed, buf + align, n));
      ZT_EQ_U64(zck_crc32(seed, buf + align, n), zlib_crc(seed, buf + align, n));
    }
  /* combine and zeros against zlib on both sides of their short-piece path */
  static const uint8_t zeros[600];
  for (size_t n = 0; n < 600; n++) {
    uint32_t seed = (uint32_t)next(), a = zlib_crc(seed, buf, 7), b = zlib_crc(0, buf + 7, n);
    ZT_EQ_U64(zck_crc32_combine(a, b, n), zlib_crc(seed, buf, 7 + n));
    ZT_EQ_U64(zck_crc32_combine(a, b, n), (uint32_t)crc32_combine(a, b, (z_off_t)n));
    ZT_EQ_U64(zck_crc32_zeros(n), zlib_crc(0, zeros, n));
  }
  for (int t = 0; t < 200; t++) {
    size_t off = next() % 64, n = next() % (cap - 64);
    uint32_t seed = t % 2 ? (uint32_t)next() : 0;
    uint32_t want = zlib_crc(seed, buf + off, n);
    ZT_EQ_U64(zck_crc32_update(seed, buf + off, n), want);
    /* in two pieces, by continuation and by combine */
    size_t cut = n ? next() % n : 0;
    uint32_t a = zck_crc32_update(seed, buf + off, cut);
    ZT_EQ_U64(zck_crc32_update(a, buf + off + cut, n - cut), want);
    uint32_t b = zck_crc32_update(0, buf + off + cut, n - cut);
    ZT_EQ_U64(zck_crc32_combine(a, b, n - cut), want);
  }
  free(buf);
  return 0;
}
