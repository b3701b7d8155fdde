/* fuzz_st_index.c: libFuzzer target for the Hugging Face index parser
 * (model.safetensors.index.json). Parses without touching any shard. */
#include "safetensors/safetensors.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zck_hf_index *ix = NULL;
  if (zck_hf_index_parse("fuzz.index.json", (const char *)data, size, ".safetensors", &ix) == ZCK_OK) {
    size_t shards = zck_hf_index_shard_count(ix);
    for (size_t i = 0; i < zck_hf_index_count(ix); i++) {
      const char *t, *s;
      zck_hf_index_entry(ix, i, &t, &s);
      size_t sl = strlen(s);
      if (sl < 12 || strcmp(s + sl - 12, ".safetensors") || s[0] == '/' || strstr(s, "..\\") == s) abort();
    }
    for (size_t i = 0; i < shards; i++) (void)strlen(zck_hf_index_shard(ix, i));
    uint64_t total;
    (void)zck_hf_index_total_size(ix, &total);
    (void)zck_hf_index_metadata_get(ix, "format");
    zck_hf_index_free(ix);
  } else if (!zck_last_error()[0] || strchr(zck_last_error(), '\n')) {
    abort();
  }
  return 0;
}
