/* dtype.c: element types, their names in torch and safetensors, and conversions.
 *
 * Float narrowing follows torch bit for bit: bf16 = round-to-nearest-even of the fp32 bits
 * (c10::BFloat16), fp16 = the FP16 library's fp16_ieee_from_fp32_value (c10::Half). A
 * double goes through float first, as c10::convert does.
 */
#include "error.h"

#include <math.h>
#include <string.h>

typedef struct {
  const char *name, *st_name, *storage;
  size_t size;
  int is_float, is_signed;
} zck__dtype_info;

static const zck__dtype_info zck__dtypes[ZCK_DTYPE_COUNT] = {
  [ZCK_DTYPE_INVALID] = {"invalid", NULL, NULL, 0, 0, 0},
  [ZCK_F64] = {"float64", "F64", "DoubleStorage", 8, 1, 1},
  [ZCK_F32] = {"float32", "F32", "FloatStorage", 4, 1, 1},
  [ZCK_F16] = {"float16", "F16", "HalfStorage", 2, 1, 1},
  [ZCK_BF16] = {"bfloat16", "BF16", "BFloat16Storage", 2, 1, 1},
  [ZCK_I64] = {"int64", "I64", "LongStorage", 8, 0, 1},
  [ZCK_I32] = {"int32", "I32", "IntStorage", 4, 0, 1},
  [ZCK_I16] = {"int16", "I16", "ShortStorage", 2, 0, 1},
  [ZCK_I8] = {"int8", "I8", "CharStorage", 1, 0, 1},
  [ZCK_U64] = {"uint64", "U64", "UInt64Storage", 8, 0, 0},
  [ZCK_U32] = {"uint32", "U32", "UInt32Storage", 4, 0, 0},
  [ZCK_U16] = {"uint16", "U16", "UInt16Storage", 2, 0, 0},
  [ZCK_U8] = {"uint8", "U8", "ByteStorage", 1, 0, 0},
  [ZCK_BOOL] = {"bool", "BOOL", "BoolStorage", 1, 0, 0},
  [ZCK_F8_E4M3] = {"float8_e4m3fn", "F8_E4M3", "Float8_e4m3fnStorage", 1, 0, 0},
  [ZCK_F8_E5M2] = {"float8_e5m2", "F8_E5M2", "Float8_e5m2Storage", 1, 0, 0},
  [ZCK_C64] = {"complex64", "C64", "ComplexFloatStorage", 8, 0, 0},
  [ZCK_C128] = {"complex128", NULL, "ComplexDoubleStorage", 16, 0, 0},
};

static int zck__valid(zck_dtype t) { return t > ZCK_DTYPE_INVALID && t < ZCK_DTYPE_COUNT; }

size_t zck_dtype_size(zck_dtype t) { return zck__valid(t) ? zck__dtypes[t].size : 0; }
const char *zck_dtype_name(zck_dtype t) { return zck__valid(t) ? zck__dtypes[t].name : "invalid"; }
const char *zck_dtype_safetensors_name(zck_dtype t) { return zck__valid(t) ? zck__dtypes[t].st_name : NULL; }
const char *zck_dtype_torch_storage(zck_dtype t) { return zck__valid(t) ? zck__dtypes[t].storage : NULL; }

zck_dtype zck_dtype_from_safetensors(const char *s) {
  for (int t = 1; t < ZCK_DTYPE_COUNT; t++)
    if (zck__dtypes[t].st_name && strcmp(zck__dtypes[t].st_name, s) == 0) return (zck_dtype)t;
  return ZCK_DTYPE_INVALID;
}

zck_dtype zck_dtype_from_torch_storage(const char *s) {
  for (int t = 1; t < ZCK_DTYPE_COUNT; t++)
    if (zck__dtypes[t].storage && strcmp(zck__dtypes[t].storage, s) == 0) return (zck_dtype)t;
  return ZCK_DTYPE_INVALID;
}

zck_dtype zck_dtype_parse(const char *s) {
  static const struct { const char *alias; zck_dtype t; } aliases[] = {
    {"fp32", ZCK_F32}, {"f32", ZCK_F32}, {"float", ZCK_F32},
    {"fp16", ZCK_F16}, {"f16", ZCK_F16}, {"half", ZCK_F16},
    {"bf16", ZCK_BF16}, {"fp64", ZCK_F64}, {"f64", ZCK_F64}, {"double", ZCK_F64},
  };
  for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
    if (strcmp(aliases[i].alias, s) == 0) return aliases[i].t;
  for (int t = 1; t < ZCK_DTYPE_COUNT; t++)
    if (strcmp(zck__dtypes[t].name, s) == 0) return (zck_dtype)t;
  return zck_dtype_from_safetensors(s);
}

/* ---- scalar conversions, bit-exact with c10 */

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline uint16_t zck__bf16_from_f32(float f) {
  if (isnan(f)) return 0x7FC0;
  uint32_t u = f32_bits(f);
  uint32_t bias = ((u >> 16) & 1) + 0x7FFFu;
  return (uint16_t)((u + bias) >> 16);
}
static inline float zck__f32_from_bf16(uint16_t h) { return f32_from_bits((uint32_t)h << 16); }

static inline uint16_t zck__f16_from_f32(float f) {
  const float scale_to_inf = 0x1.0p+112f, scale_to_zero = 0x1.0p-110f;
  volatile float base = (fabsf(f) * scale_to_inf) * scale_to_zero;
  const uint32_t w = f32_bits(f), shl1_w = w + w, sign = w & 0x80000000u;
  uint32_t bias = shl1_w & 0xFF000000u;
  if (bias < 0x71000000u) bias = 0x71000000u;
  base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = f32_bits(base);
  const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}
static inline float zck__f32_from_f16(uint16_t h) {
  const uint32_t w = (uint32_t)h << 16, sign = w & 0x80000000u, two_w = w + w;
  const uint32_t exp_offset = 0xE0u << 23;
  const float exp_scale = 0x1.0p-112f;
  const float normalized = f32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
  const uint32_t magic_mask = 126u << 23;
  const float magic_bias = 0.5f;
  const float denormalized = f32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
  const uint32_t denorm_cutoff = 1u << 27;
  const uint32_t result = sign | (two_w < denorm_cutoff ? f32_bits(denormalized) : f32_bits(normalized));
  return f32_from_bits(result);
}

uint16_t zck__bf16_round(float f) { return zck__bf16_from_f32(f); }
uint16_t zck__f16_round(float f) { return zck__f16_from_f32(f); }

/* Generic element access for the slow paths. */
static double load_float(zck_dtype t, const uint8_t *p) {
  switch (t) {
  case ZCK_F64: { double d; memcpy(&d, p, 8); return d; }
  case ZCK_F32: { float f; memcpy(&f, p, 4); return f; }
  case ZCK_F16: { uint16_t h; memcpy(&h, p, 2); return zck__f32_from_f16(h); }
  case ZCK_BF16: { uint16_t h; memcpy(&h, p, 2); return zck__f32_from_bf16(h); }
  default: return 0;
  }
}
static int64_t load_int(zck_dtype t, const uint8_t *p, uint64_t *as_unsigned) {
  int64_t v = 0;
  switch (t) {
  case ZCK_I64: memcpy(&v, p, 8); break;
  case ZCK_I32: { int32_t x; memcpy(&x, p, 4); v = x; break; }
  case ZCK_I16: { int16_t x; memcpy(&x, p, 2); v = x; break; }
  case ZCK_I8: v = (int8_t)p[0]; break;
  case ZCK_U64: memcpy(as_unsigned, p, 8); return 0;
  case ZCK_U32: { uint32_t x; memcpy(&x, p, 4); v = x; break; }
  case ZCK_U16: { uint16_t x; memcpy(&x, p, 2); v = x; break; }
  case ZCK_U8: v = p[0]; break;
  case ZCK_BOOL: v = p[0] != 0; break;
  default: break;
  }
  *as_unsigned = (uint64_t)v;
  return v;
}

static void store_float(zck_dtype t, uint8_t *p, double d, float f) {
  switch (t) {
  case ZCK_F64: memcpy(p, &d, 8); break;
  case ZCK_F32: memcpy(p, &f, 4); break;
  case ZCK_F16: { uint16_t h = zck__f16_from_f32(f); memcpy(p, &h, 2); break; }
  case ZCK_BF16: { uint16_t h = zck__bf16_from_f32(f); memcpy(p, &h, 2); break; }
  default: break;
  }
}
static void store_int(zck_dtype t, uint8_t *p, uint64_t u) {
  switch (t) {
  case ZCK_I64: case ZCK_U64: memcpy(p, &u, 8); break;
  case ZCK_I32: case ZCK_U32: { uint32_t x = (uint32_t)u; memcpy(p, &x, 4); break; }
  case ZCK_I16: case ZCK_U16: { uint16_t x = (uint16_t)u; memcpy(p, &x, 2); break; }
  case ZCK_I8: case ZCK_U8: p[0] = (uint8_t)u; break;
  case ZCK_BOOL: p[0] = u != 0; break;
  default: break;
  }
}

static int is_int(zck_dtype t) {
  return (t >= ZCK_I64 && t <= ZCK_U8) || t == ZCK_BOOL;
}

int zck_dtype_convertible(zck_dtype dst, zck_dtype src) {
  if (!zck__valid(dst) || !zck__valid(src)) return 0;
  if (dst == src) return 1;
  int dst_ok = zck__dtypes[dst].is_float || is_int(dst);
  int src_ok = zck__dtypes[src].is_float || is_int(src);
  if (!dst_ok || !src_ok) return 0;
  if (is_int(dst) && zck__dtypes[src].is_float) return 0; /* truncation: never wanted here */
  return 1;
}

zck_status zck_convert(zck_dtype dt, void *dst, zck_dtype st, const void *src, size_t n) {
  if (!zck_dtype_convertible(dt, st))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "cannot convert %s to %s", zck_dtype_name(st), zck_dtype_name(dt));
  if (dt == st) {
    memmove(dst, src, n * zck_dtype_size(st));
    return ZCK_OK;
  }
  const uint8_t *s = src;
  uint8_t *d = dst;
  /* fast paths used by consolidate and the engine */
  if (st == ZCK_F32 && dt == ZCK_BF16) {
    for (size_t i = 0; i < n; i++) {
      float f; memcpy(&f, s + 4 * i, 4);
      uint16_t h = zck__bf16_from_f32(f); memcpy(d + 2 * i, &h, 2);
    }
    return ZCK_OK;
  }
  if (st == ZCK_BF16 && dt == ZCK_F32) {
    for (size_t i = 0; i < n; i++) {
      uint16_t h; memcpy(&h, s + 2 * i, 2);
      uint32_t u = (uint32_t)h << 16; memcpy(d + 4 * i, &u, 4);
    }
    return ZCK_OK;
  }
  size_t ss = zck_dtype_size(st), ds = zck_dtype_size(dt);
  for (size_t i = 0; i < n; i++) {
    const uint8_t *sp = s + i * ss;
    uint8_t *dp = d + i * ds;
    if (zck__dtypes[dt].is_float) {
      double v; float f;
      if (zck__dtypes[st].is_float) {
        v = load_float(st, sp);
        f = (float)v;
      } else {
        uint64_t u; int64_t x = load_int(st, sp, &u);
        /* one rounding straight to the target width, as static_cast does */
        if (st == ZCK_U64) { v = (double)u; f = (float)u; } else { v = (double)x; f = (float)x; }
      }
      store_float(dt, dp, v, f);
    } else {
      uint64_t u; load_int(st, sp, &u);
      store_int(dt, dp, u);
    }
  }
  return ZCK_OK;
}
