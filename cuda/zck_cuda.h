/* zck_cuda.h: the plain C face of the device code in cuda/.
 * Built without CUDA, every call reports ZCK_ERR_NO_DEVICE ("built without CUDA"). */
#ifndef ZCK_CUDA_H
#define ZCK_CUDA_H

#include "zck.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 if this build has CUDA code in it. */
int zck_cuda_built(void);
/* Number of usable devices (0 when none or built without CUDA). */
int zck_cuda_device_count(void);
/* Name of device i for reports; writes "" when unavailable. */
zck_status zck_cuda_device_name(int device, char *buf, size_t n);
/* fp32 -> bf16 on the device, round to nearest even (same bits as zck_convert). */
zck_status zck_cuda_f32_to_bf16(const float *d_src, uint16_t *d_dst, size_t n, void *stream);

#ifdef __cplusplus
}
#endif
#endif
