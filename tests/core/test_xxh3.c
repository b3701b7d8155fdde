/* test_xxh3.c: XXH3-64 through lib/hash_xxh3.h (the run-time dispatched AVX512/AVX2 code
 * where the library has it) gives the library's plain XXH3_64bits bit for bit, one-shot
 * and streamed in pieces, over lengths that cross every internal boundary (16, 128, 240
 * bytes, 64-byte stripes, 1 KiB blocks, the 256-byte internal buffer) at every alignment:
 * manifests written before and after the switch must agree. */
#include "test.h"

#include <stdbool.h>
#include <stdlib.h>
#include <xxhash.h>

/* the plain symbols, taken before hash_xxh3.h redirects the names */
static XXH64_hash_t plain_oneshot(const void *p, size_t n) { return XXH3_64bits(p, n); }
static XXH_errorcode plain_update(XXH3_state_t *s, const void *p, size_t n) { return XXH3_64bits_update(s, p, n); }

#include "hash_xxh3.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static uint64_t streamed(bool fast, const uint8_t *p, size_t n, size_t piece) {
  XXH3_state_t *s = XXH3_createState();
  ZT_ASSERT(s);
  XXH3_64bits_reset(s);
  for (size_t k = 0; k < n; k += piece) {
    size_t m = n - k < piece ? n - k : piece;
    if (fast) XXH3_64bits_update(s, p + k, m);
    else plain_update(s, p + k, m);
  }
  uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

int main(void) {
  size_t cap = (3u << 20) + 64;
  uint8_t *buf = malloc(cap);
  ZT_ASSERT(buf);
  for (size_t i = 0; i < cap; i++) buf[i] = (uint8_t)next();
  for (size_t n = 0; n <= 2100; n++)
    for (size_t a = 0; a < 64; a += (n < 300 ? 1 : 17)) ZT_EQ_U64(XXH3_64bits(buf + a, n), plain_oneshot(buf + a, n));
  static const size_t pieces[] = {1, 7, 64, 255, 256, 1000, 1024, 4097, 65536};
  for (int r = 0; r < 40; r++) {
    size_t n = (size_t)(next() % (3u << 20)), a = (size_t)(next() % 64);
    uint64_t want = plain_oneshot(buf + a, n);
    ZT_EQ_U64(XXH3_64bits(buf + a, n), want);
    size_t piece = pieces[r % (sizeof pieces / sizeof *pieces)];
    if (piece < 64 && n > 200000) n = 200000, want = plain_oneshot(buf + a, n);
    ZT_EQ_U64(streamed(true, buf + a, n, piece), want);
    ZT_EQ_U64(streamed(false, buf + a, n, piece), want);
  }
  free(buf);
  return 0;
}
