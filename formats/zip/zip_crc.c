/* zip_crc.c: CRC-32 of zip records. Writers that fill an entry from several threads
 * compute a CRC per range and join them with zck_crc32_combine (lib/exec.c). */
#include "zip.h"

#include "exec.h"

/* One CRC for the whole tree: lib/crc32.c (ISA-L, zlib's results). */
uint32_t zck_crc32(uint32_t crc, const void *data, size_t n) { return zck_crc32_update(crc, data, n); }

/* zck_crc32_combine lives in lib/exec.c (the executor assembles CRCs too); formats depend
 * on lib, so the one definition is there. */
