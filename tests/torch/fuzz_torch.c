/* fuzz_torch.c: libFuzzer target for the .pt reader: any bytes, opened as an in-memory
 * torch.save file, must open or fail cleanly; an opened file must name its tensors, read
 * each one (whole or first elements) and answer the weights_only check. */
#include "torch/torch.h"

#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zck__source src;
  zck__source_memory(&src, "fuzz.pt", data, size);
  zck_torch_open_opts o = ZCK_TORCH_OPEN_OPTS_INIT;
  o.limits.max_depth = 64;
  o.limits.max_objects = 1 << 16;
  zck_torch_file *f = NULL;
  if (zck_torch_open_source(&src, &o, &f) == ZCK_OK) {
    zck_torch_named *v = NULL;
    size_t n = 0;
    if (zck_torch_state_dict(f, zck_torch_root(f), &v, &n) == ZCK_OK) zck_torch_named_free(v, n);
    (void)zck_torch_check_weights_only(f);
    uint8_t *buf = malloc(1 << 16);
    for (size_t i = 0; i < zck_torch_tensor_count(f); i++) {
      const zck_torch_tensor *t = zck_torch_tensor_at(f, i);
      uint64_t es = zck_dtype_size(t->dtype), cnt = t->numel;
      if (cnt * es > (1 << 16)) cnt = (1 << 16) / es;   /* expanded views can be huge */
      if (zck_torch_tensor_read(f, t, buf, 0, cnt) != ZCK_OK) abort();   /* validated geometry reads */
      if (t->numel > 1 && zck_torch_tensor_read(f, t, buf, t->numel - 1, 1) != ZCK_OK) abort();
      (void)zck_torch_tensor_contiguous(t);
      (void)zck_torch_tensor_file_offset(f, t);
    }
    free(buf);
    zck_torch_close(f);
  }
  zck__source_close(&src);
  return 0;
}
