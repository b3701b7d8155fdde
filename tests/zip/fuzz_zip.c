/* fuzz_zip.c: libFuzzer target for the zip reader: open from memory, walk and look up every
 * entry, read the small stored ones (CRC checked) and a range of each. Any input must give
 * ZCK_OK or an error with a message, never a crash, leak or out-of-bounds read. */
#include "zip/zip.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zck__source src;
  zck__source_memory(&src, "fuzz.zip", data, size);
  zck_zip *z = NULL;
  if (zck_zip_open(&src, &z) != ZCK_OK) {
    if (!zck_last_error()[0]) abort(); /* every failure explains itself */
    zck__source_close(&src);
    return 0;
  }
  uint8_t buf[4096];
  for (size_t i = 0; i < zck_zip_count(z); i++) {
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    if (zck_zip_find(z, e->name) != e) abort(); /* lookup finds every entry */
    if (e->data_offset + e->comp_size > size) abort(); /* validated ranges stay inside */
    if (e->size <= sizeof buf) (void)zck_zip_read_entry(z, e, buf);
    uint64_t n = e->size < 16 ? e->size : 16;
    (void)zck_zip_read_range(z, e, buf, n, e->size - n);
  }
  if (zck_zip_entry_at(z, zck_zip_count(z)) != NULL) abort();
  zck_zip_close(z);
  zck__source_close(&src);
  return 0;
}
