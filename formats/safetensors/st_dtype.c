/* st_dtype.c: the safetensors dtype strings (Rust `enum Dtype`, in declaration order),
 * their bit sizes and the matching zckpt element types. */
#include "st_internal.h"

#include <string.h>

static const struct {
  const char *name;
  unsigned bits;
  zck_dtype zck;
} zck__st_dtypes[ZCK_ST_DTYPE_COUNT] = {
  [ZCK_ST_BOOL] = {"BOOL", 8, ZCK_BOOL},
  [ZCK_ST_F4] = {"F4", 4, ZCK_DTYPE_INVALID},
  [ZCK_ST_F6_E2M3] = {"F6_E2M3", 6, ZCK_DTYPE_INVALID},
  [ZCK_ST_F6_E3M2] = {"F6_E3M2", 6, ZCK_DTYPE_INVALID},
  [ZCK_ST_U8] = {"U8", 8, ZCK_U8},
  [ZCK_ST_I8] = {"I8", 8, ZCK_I8},
  [ZCK_ST_F8_E5M2] = {"F8_E5M2", 8, ZCK_F8_E5M2},
  [ZCK_ST_F8_E4M3] = {"F8_E4M3", 8, ZCK_F8_E4M3},
  [ZCK_ST_F8_E8M0] = {"F8_E8M0", 8, ZCK_DTYPE_INVALID},
  [ZCK_ST_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, ZCK_DTYPE_INVALID},
  [ZCK_ST_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, ZCK_DTYPE_INVALID},
  [ZCK_ST_I16] = {"I16", 16, ZCK_I16},
  [ZCK_ST_U16] = {"U16", 16, ZCK_U16},
  [ZCK_ST_F16] = {"F16", 16, ZCK_F16},
  [ZCK_ST_BF16] = {"BF16", 16, ZCK_BF16},
  [ZCK_ST_I32] = {"I32", 32, ZCK_I32},
  [ZCK_ST_U32] = {"U32", 32, ZCK_U32},
  [ZCK_ST_F32] = {"F32", 32, ZCK_F32},
  [ZCK_ST_C64] = {"C64", 64, ZCK_C64},
  [ZCK_ST_F64] = {"F64", 64, ZCK_F64},
  [ZCK_ST_I64] = {"I64", 64, ZCK_I64},
  [ZCK_ST_U64] = {"U64", 64, ZCK_U64},
};

static bool zck__st_valid(zck_st_dtype t) { return (unsigned)t < ZCK_ST_DTYPE_COUNT; }

const char *zck_st_dtype_name(zck_st_dtype t) { return zck__st_valid(t) ? zck__st_dtypes[t].name : "?"; }
unsigned zck_st_dtype_bits(zck_st_dtype t) { return zck__st_valid(t) ? zck__st_dtypes[t].bits : 0; }
zck_dtype zck_st_dtype_to_zck(zck_st_dtype t) { return zck__st_valid(t) ? zck__st_dtypes[t].zck : ZCK_DTYPE_INVALID; }

bool zck_st_dtype_parse(const char *s, size_t len, zck_st_dtype *out) {
  for (int t = 0; t < ZCK_ST_DTYPE_COUNT; t++) {
    const char *n = zck__st_dtypes[t].name;
    if (strlen(n) == len && memcmp(n, s, len) == 0) {
      *out = (zck_st_dtype)t;
      return true;
    }
  }
  return false;
}

bool zck_st_dtype_from_zck(zck_dtype d, zck_st_dtype *out) {
  if (d == ZCK_DTYPE_INVALID) return false;
  for (int t = 0; t < ZCK_ST_DTYPE_COUNT; t++) {
    if (zck__st_dtypes[t].zck == d) {
      *out = (zck_st_dtype)t;
      return true;
    }
  }
  return false;
}
