/* pk_text.c: decoding the literal arguments of the pickle VM's int and string opcodes:
 * two's complement LONG bytes, decimal INT/LONG text (bounded like CPython's
 * int_max_str_digits), Python 2 str bytes, STRING's escaped repr and UNICODE's
 * raw-unicode-escape. */
#include "pk_vm.h"

#include <stdlib.h>
#include <string.h>

#define ZCK__PK_MAX_DIGITS 4300    /* decimal ints, as CPython's int_max_str_digits */

// ---- ints

/* INT or BIGINT from n bytes of little-endian two's complement. */
zck_status zck__vm_int_le(vm *v, const uint8_t *b, size_t n, zck_pk **out) {
  if (n == 0) { VNEW(v, zck_pk_new_int(v->doc, 0), *out); return ZCK_OK; }
  uint8_t sign = (b[n - 1] & 0x80) ? 0xFF : 0;
  size_t m = n;   /* drop redundant sign-extension bytes */
  while (m > 1 && b[m - 1] == sign && ((b[m - 2] & 0x80) ? 0xFF : 0) == sign) m--;
  if (m <= 8) {
    uint64_t u = sign ? UINT64_MAX : 0;
    for (size_t i = 0; i < m; i++) u = (u & ~((uint64_t)0xFF << (8 * i))) | (uint64_t)b[i] << (8 * i);
    VNEW(v, zck_pk_new_int(v->doc, (int64_t)u), *out);
    return ZCK_OK;
  }
  VNEW(v, zck__pk_new_blob(v->doc, ZCK_PK_BIGINT, b, m), *out);
  return ZCK_OK;
}

/* Decimal text ("-123", optional trailing 'L' already stripped) to INT / BIGINT. */
zck_status zck__vm_int_dec(vm *v, const char *s, size_t n, zck_pk **out) {
  int neg = 0;
  size_t i = 0;
  if (i < n && (s[i] == '-' || s[i] == '+')) { neg = s[i] == '-'; i++; }
  if (i == n) return zck__vm_fail(v, ZCK_ERR_FORMAT, "invalid integer literal");
  if (n - i > ZCK__PK_MAX_DIGITS) return zck__vm_fail(v, ZCK_ERR_LIMIT, "integer literal of %zu digits", n - i);
  size_t cap = (n - i) / 2 + 2;   /* bytes: log256(10^d) < d/2 + 1 */
  uint8_t *mag = zck__calloc(cap + 1, 1);
  if (!mag) return zck__vm_oom(v);
  size_t used = 1;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') { free(mag); return zck__vm_fail(v, ZCK_ERR_FORMAT, "invalid integer literal"); }
    unsigned carry = (unsigned)(s[i] - '0');
    for (size_t k = 0; k < used; k++) {
      unsigned x = mag[k] * 10u + carry;
      mag[k] = (uint8_t)x;
      carry = x >> 8;
    }
    if (carry) mag[used++] = (uint8_t)carry;
  }
  mag[used++] = 0;   /* room for the sign bit */
  if (neg) {         /* two's complement negate */
    unsigned c = 1;
    for (size_t k = 0; k < used; k++) {
      unsigned x = (uint8_t)~mag[k] + c;
      mag[k] = (uint8_t)x;
      c = x >> 8;
    }
  }
  zck_status st = zck__vm_int_le(v, mag, used, out);
  free(mag);
  return st;
}

// ---- strings

/* Python 2 str (STRING / BINSTRING / SHORT_BINSTRING): STR if UTF-8, else BYTES. */
zck_status zck__vm_py2_str(vm *v, const uint8_t *s, size_t n, zck_pk **out) {
  zck_pk_kind k = zck__pk_utf8_valid(s, n) ? ZCK_PK_STR : ZCK_PK_BYTES;
  VNEW(v, zck__pk_new_blob(v->doc, k, s, n), *out);
  return ZCK_OK;
}

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* STRING's argument: a quoted Python bytes repr, decoded as codecs.escape_decode does. */
zck_status zck__vm_op_string(vm *v, zck_pk **out) {
  const char *s;
  size_t n;
  ZCK_TRY(zck__vm_read_line(v, &s, &n));
  if (n < 2 || s[0] != s[n - 1] || (s[0] != '\'' && s[0] != '"'))
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "argument must be quoted");
  s++, n -= 2;
  uint8_t *d = zck__malloc(n + 1);
  if (!d) return zck__vm_oom(v);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] != '\\' || i + 1 == n) {
      if (s[i] == '\\') { free(d); return zck__vm_fail(v, ZCK_ERR_FORMAT, "trailing \\ in string"); }
      d[o++] = (uint8_t)s[i];
      continue;
    }
    char c = s[++i];
    switch (c) {
    case '\n': break;
    case '\\': d[o++] = '\\'; break;
    case '\'': d[o++] = '\''; break;
    case '"': d[o++] = '"'; break;
    case 'a': d[o++] = 7; break;
    case 'b': d[o++] = 8; break;
    case 'f': d[o++] = 12; break;
    case 'n': d[o++] = 10; break;
    case 'r': d[o++] = 13; break;
    case 't': d[o++] = 9; break;
    case 'v': d[o++] = 11; break;
    case 'x': {
      int h1 = i + 1 < n ? hexval(s[i + 1]) : -1, h2 = i + 2 < n ? hexval(s[i + 2]) : -1;
      if (h1 < 0 || h2 < 0) { free(d); return zck__vm_fail(v, ZCK_ERR_FORMAT, "invalid \\x escape"); }
      d[o++] = (uint8_t)(h1 * 16 + h2);
      i += 2;
      break;
    }
    default:
      if (c >= '0' && c <= '7') {
        unsigned x = (unsigned)(c - '0');
        for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) x = x * 8 + (unsigned)(s[++i] - '0');
        d[o++] = (uint8_t)x;
      } else {   /* unknown escapes stay as written */
        d[o++] = '\\';
        d[o++] = (uint8_t)c;
      }
    }
  }
  zck_status st = zck__vm_py2_str(v, d, o, out);
  free(d);
  return st;
}

static size_t put_utf8(uint8_t *d, uint32_t cp) {
  if (cp < 0x80) { d[0] = (uint8_t)cp; return 1; }
  if (cp < 0x800) { d[0] = (uint8_t)(0xC0 | cp >> 6); d[1] = (uint8_t)(0x80 | (cp & 0x3F)); return 2; }
  if (cp < 0x10000) {
    d[0] = (uint8_t)(0xE0 | cp >> 12); d[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); d[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  d[0] = (uint8_t)(0xF0 | cp >> 18); d[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  d[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); d[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

/* UNICODE's argument: raw-unicode-escape (latin-1 bytes plus \uXXXX and \UXXXXXXXX). */
zck_status zck__vm_op_unicode(vm *v, zck_pk **out) {
  const char *s;
  size_t n;
  ZCK_TRY(zck__vm_read_line(v, &s, &n));
  if (n > SIZE_MAX / 4) return zck__vm_fail(v, ZCK_ERR_LIMIT, "string too long");
  uint8_t *d = zck__malloc(n * 2 + 1);   /* latin-1 doubles at most; escapes shrink */
  if (!d) return zck__vm_oom(v);
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = (uint8_t)s[i];
    if (c == '\\' && i + 1 < n && (s[i + 1] == 'u' || s[i + 1] == 'U')) {
      size_t digits = s[i + 1] == 'u' ? 4 : 8;
      uint32_t cp = 0;
      if (n - i - 2 < digits) { free(d); return zck__vm_fail(v, ZCK_ERR_FORMAT, "truncated \\u escape"); }
      for (size_t k = 0; k < digits; k++) {
        int h = hexval(s[i + 2 + k]);
        if (h < 0) { free(d); return zck__vm_fail(v, ZCK_ERR_FORMAT, "invalid \\u escape"); }
        cp = cp * 16 + (uint32_t)h;
      }
      if (cp > 0x10FFFF) { free(d); return zck__vm_fail(v, ZCK_ERR_FORMAT, "\\U escape out of range"); }
      o += put_utf8(d + o, cp);
      i += 1 + digits;
    } else {
      o += put_utf8(d + o, c);
    }
  }
  zck_pk *node = zck__pk_new_blob(v->doc, ZCK_PK_STR, d, o);
  free(d);
  if (!node) return zck__vm_alloc_fail(v);
  *out = node;
  return ZCK_OK;
}
