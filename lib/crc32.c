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

uint32_t zck_crc32_update(uint32_t crc, const void *data, size_t n) {
  return n ? crc32_gzip_refl(crc, (const unsigned char *)data, (uint64_t)n) : crc;
}
