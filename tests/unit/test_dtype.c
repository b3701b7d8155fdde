/* test_dtype.c: names, parsing, and conversions bit-exact with torch's rounding. */
#include "test.h"
#include "util.h"

#include <math.h>

static uint16_t to_bf16(float f) { uint16_t h; ZT_OK(zck_convert(ZCK_BF16, &h, ZCK_F32, &f, 1)); return h; }
static uint16_t to_f16(float f) { uint16_t h; ZT_OK(zck_convert(ZCK_F16, &h, ZCK_F32, &f, 1)); return h; }
static float from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

int main(void) {
  ZT_EQ_INT(zck_dtype_size(ZCK_BF16), 2);
  ZT_EQ_INT(zck_dtype_size(ZCK_C128), 16);
  ZT_EQ_INT(zck_dtype_parse("bf16"), ZCK_BF16);
  ZT_EQ_INT(zck_dtype_parse("float16"), ZCK_F16);
  ZT_EQ_INT(zck_dtype_parse("F64"), ZCK_F64);
  ZT_EQ_INT(zck_dtype_parse("nope"), ZCK_DTYPE_INVALID);
  ZT_EQ_STR(zck_dtype_safetensors_name(ZCK_BOOL), "BOOL");
  ZT_EQ_INT(zck_dtype_from_torch_storage("BFloat16Storage"), ZCK_BF16);

  /* bf16: ties go to even, NaN canonical */
  ZT_EQ_INT(to_bf16(1.0f), 0x3F80);
  ZT_EQ_INT(to_bf16(from_bits(0x3F808000)), 0x3F80);   /* tie, lower even */
  ZT_EQ_INT(to_bf16(from_bits(0x3F818000)), 0x3F82);   /* tie, round up to even */
  ZT_EQ_INT(to_bf16(from_bits(0x3F808001)), 0x3F81);   /* above tie */
  ZT_EQ_INT(to_bf16(NAN), 0x7FC0);
  ZT_EQ_INT(to_bf16(INFINITY), 0x7F80);
  ZT_EQ_INT(to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);   /* max float rounds to inf */
  /* fp16 */
  ZT_EQ_INT(to_f16(1.0f), 0x3C00);
  ZT_EQ_INT(to_f16(65504.0f), 0x7BFF);
  ZT_EQ_INT(to_f16(65520.0f), 0x7C00);                 /* overflow to inf */
  ZT_EQ_INT(to_f16(from_bits(0x33800000)), 0x0001);     /* 2^-24: smallest subnormal */
  ZT_EQ_INT(to_f16(from_bits(0x33000000)), 0x0000);     /* 2^-25: tie to even zero */
  ZT_EQ_INT(to_f16(from_bits(0x33C00000)), 0x0002);     /* 1.5 * 2^-24 -> 2^-23 (even) */
  ZT_EQ_INT(to_f16(-0.0f), 0x8000);
  ZT_EQ_INT(to_f16(NAN) & 0x7E00, 0x7E00);
  /* round trips through fp32 are exact for every 16-bit pattern that is not NaN */
  for (uint32_t h = 0; h < 0x10000; h++) {
    uint16_t x = (uint16_t)h, back;
    float f;
    ZT_OK(zck_convert(ZCK_F32, &f, ZCK_F16, &x, 1));
    if (isnan(f)) continue;
    ZT_OK(zck_convert(ZCK_F16, &back, ZCK_F32, &f, 1));
    ZT_EQ_INT(back, x);
    ZT_OK(zck_convert(ZCK_F32, &f, ZCK_BF16, &x, 1));
    if (isnan(f)) continue;
    ZT_OK(zck_convert(ZCK_BF16, &back, ZCK_F32, &f, 1));
    ZT_EQ_INT(back, x);
  }
  /* int64 -> float32 rounds once (2^53 + 1 would double-round through double) */
  int64_t big = (1LL << 53) + 1 + (1LL << 29);
  float fb;
  ZT_OK(zck_convert(ZCK_F32, &fb, ZCK_I64, &big, 1));
  ZT_ASSERT(fb == (float)big);
  int64_t iv = -7;
  float fv;
  ZT_OK(zck_convert(ZCK_F32, &fv, ZCK_I64, &iv, 1));
  ZT_ASSERT(fv == -7.0f);
  /* float -> int is refused */
  ZT_ERR(zck_convert(ZCK_I32, &iv, ZCK_F32, &fv, 1), ZCK_ERR_UNSUPPORTED, "cannot convert");
  return 0;
}
