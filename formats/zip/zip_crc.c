/* zip_crc.c: CRC-32 of zip records, via zlib. Writers that fill an entry from several
 * threads compute a CRC per range and join them with zck_crc32_combine (lib/exec.c). */
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

/* zck_crc32_combine lives in lib/exec.c (the executor assembles CRCs too); formats depend
 * on lib, so the one definition is there. */
