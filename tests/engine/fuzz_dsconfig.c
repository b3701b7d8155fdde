/* fuzz_dsconfig.c: hostile ds_config.json text through the HF "auto" resolution and the
 * engine's config reader: a config or a one-line refusal, never a crash or a leak. The
 * first byte varies the training arguments (stage, bf16, accumulation) the text is
 * resolved against. */
#include <stdlib.h>
#include <string.h>

#include "dsconfig.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  ze_train_args a;
  ze_train_args_default(&a);
  a.zero_stage = data[0] & 3;
  a.bf16 = (data[0] >> 2) & 1;
  a.gradient_accumulation_steps = 1 + ((data[0] >> 3) & 3);
  char *text = malloc(size);
  if (!text) return 0;
  memcpy(text, data + 1, size - 1);
  text[size - 1] = 0;
  ze_ds_config c;
  memset(&c, 0, sizeof c);
  (void)ze_ds_config_parse(text, "fuzz.json", &a, &c);
  ze_ds_config_free(&c);
  free(text);
  return 0;
}
