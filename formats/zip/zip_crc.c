/* zip_crc.c: CRC-32 of zip records, via zlib. Writers that fill an entry from several
 * threads compute a CRC per range and join them with zck_crc32_combine. */
#include "zip.h"

#include <zlib.h>

uint32_t zck_crc32(uint32_t crc, const void *data, size_t n) {
  const Bytef *p = data;
  uLong c = crc;
  while (n) { /* zlib's length is a uInt: feed at most 1 GiB at a time */
    uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
    c = crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return (uint32_t)c;
}

/* Weak for now: lib/exec.c also defines this function (same zlib call); zip.h is where it is
 * declared, so exec.c's copy should go, and then this one can be strong again. */
__attribute__((weak)) uint32_t zck_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b) {
  return (uint32_t)crc32_combine64(crc_a, crc_b, (z_off64_t)len_b);
}
