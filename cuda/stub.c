/* stub.c: the device interface when zckpt is built without CUDA. */
#include "zck_cuda.h"
#include "error.h"

int zck_cuda_built(void) { return 0; }
int zck_cuda_device_count(void) { return 0; }
zck_status zck_cuda_device_name(int device, char *buf, size_t n) {
  if (n) buf[0] = 0;
  return zck__fail(ZCK_ERR_NO_DEVICE, "built without CUDA");
}
zck_status zck_cuda_f32_to_bf16(const float *d_src, uint16_t *d_dst, size_t n, void *stream) {
  return zck__fail(ZCK_ERR_NO_DEVICE, "built without CUDA");
}
