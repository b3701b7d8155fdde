/* crc32.c: CRC-32 (zlib's / zip's, bit-reflected 0xEDB88320) at memory speed.
 *
 * Every byte a torch or zip writer emits is checksummed, so at checkpoint sizes the CRC
 * is a real share of the CPU time: zlib's table-driven crc32 runs at about 2 GB/s. ISA-L's
 * crc32_gzip_refl (Intel's library, Debian libisal-dev) picks a carry-less-multiply
 * folding at run time and runs several times faster; it is the gzip CRC, so its results
 * are zlib's bit for bit, continuation included (tests/zip/test_crc32.c checks that
 * against zlib over lengths, alignments and seeds).
 */
#include "exec.h"

#include <isa-l/crc.h>
#include <zlib.h>

uint32_t zck_crc32_update(uint32_t crc, const void *data, size_t n) {
  return n ? crc32_gzip_refl(crc, (const unsigned char *)data, (uint64_t)n) : crc;
}

/* Up to this many bytes, the CRC of zeros is computed, not derived: a small tensor's
 * piece (tens of bytes, 100k of them) costs two short CRC runs instead of zlib's
 * polynomial powers (about 1000 instructions a combine). */
#define ZCK__CRC_SHORT 256
static const uint8_t zck__crc_zeros[ZCK__CRC_SHORT];

uint32_t zck_crc32_combine(uint32_t a, uint32_t b, uint64_t len_b) {
  /* CRC-32 is affine: crc(A || B) = crc_a(0^n) ^ crc_0(0^n) ^ crc(B) over n zero bytes */
  if (len_b <= ZCK__CRC_SHORT)
    return zck_crc32_update(a, zck__crc_zeros, (size_t)len_b) ^ zck_crc32_update(0, zck__crc_zeros, (size_t)len_b) ^ b;
  return (uint32_t)crc32_combine(a, b, (z_off_t)len_b);
}

uint32_t zck_crc32_zeros(uint64_t n) {
  if (n <= ZCK__CRC_SHORT) return zck_crc32_update(0, zck__crc_zeros, (size_t)n);
  static const uint8_t zero = 0;
  uint32_t res = 0, unit = (uint32_t)crc32(0, &zero, 1);
  uint64_t unit_len = 1;
  while (n) {
    if (n & 1) res = zck_crc32_combine(res, unit, unit_len);
    n >>= 1;
    if (n) {
      unit = zck_crc32_combine(unit, unit, unit_len);
      unit_len <<= 1;
    }
  }
  return res;
}
