/* ds_math.c: DeepSpeed-specific numbers the generic layout math does not cover. */
#include "ds_internal.h"

/* zero_optimization.parameter_alignment (DeepSpeed >= 0.19.8, stage_1_and_2.py): params are
 * aligned to 16 bytes of the lp dtype inside the flat buffer, i.e. to 16 / gcd(16, size)
 * elements (8 for bf16/fp16, 4 for fp32). */
uint32_t zck__ds_param_align_for(zck_dtype lp) {
  uint32_t size = (uint32_t)zck_dtype_size(lp), a = 16, b = size ? size : 1;
  while (b) { uint32_t t = a % b; a = b; b = t; }
  return 16 / a;
}

/* round_robin_bit16_padding: after each param but the last, (-offset) % align zeros, where
 * offset is the running flat offset after the param. */
void zck__ds_param_paddings(const uint64_t *numels, size_t n, uint32_t align, int64_t *out) {
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    off += numels[i];
    uint64_t pad = 0;
    if (i + 1 < n && align > 1) pad = (align - off % align) % align;
    out[i] = (int64_t)pad;
    off += pad;
  }
}
