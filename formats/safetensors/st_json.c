/* st_json.c: a strict JSON pull parser for safetensors headers and HF index files.
 *
 * It accepts what serde_json accepts (RFC 8259: whitespace is space, tab, CR, LF; no
 * comments, no trailing commas, no leading zeros, no raw control characters in strings,
 * no lone surrogates in \u escapes, recursion limit 128) and keeps integers exact, which
 * cJSON (doubles) cannot: data_offsets and dims are u64 and serde rejects floats, exponents
 * and values above 2^64 - 1 where a double-based parser would round them. The input is
 * already known to be UTF-8 (checked before parsing, as the reference does).
 */
#include "st_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void zck__jp_init(zck__jp *jp, const char *file, const char *what, const void *data, size_t n, uint64_t base) {
  memset(jp, 0, sizeof *jp);
  jp->file = file;
  jp->what = what;
  jp->start = jp->p = data;
  jp->end = jp->start + n;
  jp->base = base;
  jp->elem = -1;
  zck__buf_init(&jp->str);
}

void zck__jp_free(zck__jp *jp) { zck__buf_free(&jp->str); }

static void zck__jp_ws(zck__jp *jp) {
  while (jp->p < jp->end && (*jp->p == ' ' || *jp->p == '\t' || *jp->p == '\n' || *jp->p == '\r')) jp->p++;
}

uint64_t zck__jp_offset(zck__jp *jp) { return jp->base + (uint64_t)(jp->p - jp->start); }

zck_status zck__jp_fail(zck__jp *jp, const char *fmt, ...) {
  char what[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  return zck__fail(ZCK_ERR_FORMAT, "%s: invalid %s%sJSON at byte %llu: %s", jp->file, jp->what, *jp->what ? " " : "",
                   (unsigned long long)zck__jp_offset(jp), what);
}

zck_status zck__jp_fail_value(zck__jp *jp, const char *fmt, ...) {
  char what[512], q[ZCK__QNAME_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  zck__jp_ws(jp);
  return zck__fail(ZCK_ERR_FORMAT, "%s: %s%s%s%s (%s byte %llu)", jp->file, jp->tensor ? "tensor " : "",
                   jp->tensor ? zck__qname(jp->tensor, q) : "", jp->tensor ? ": " : "", what, jp->what,
                   (unsigned long long)zck__jp_offset(jp));
}

/* "ctx: " or "ctx[elem]: " or "" for messages. */
static const char *zck__jp_ctx(zck__jp *jp, const char *ctx, char *buf, size_t n) {
  if (!ctx || !*ctx) return "";
  if (jp->elem >= 0) snprintf(buf, n, "%s[%ld]: ", ctx, jp->elem);
  else snprintf(buf, n, "%s: ", ctx);
  return buf;
}

int zck__jp_peek(zck__jp *jp) {
  zck__jp_ws(jp);
  return jp->p < jp->end ? *jp->p : -1;
}

static const char *zck__kind_of(int c) {
  switch (c) {
  case -1: return "the end of the input";
  case '{': return "an object";
  case '[': return "an array";
  case '"': return "a string";
  case 't': case 'f': return "a boolean";
  case 'n': return "null";
  default: return (c == '-' || (c >= '0' && c <= '9')) ? "a number" : "an invalid token";
  }
}

const char *zck__jp_kind(zck__jp *jp) { return zck__kind_of(zck__jp_peek(jp)); }

static zck_status zck__jp_enter(zck__jp *jp) {
  if (++jp->depth > ZCK__JSON_MAX_DEPTH) return zck__jp_fail(jp, "nesting deeper than %d levels", ZCK__JSON_MAX_DEPTH);
  jp->p++;
  return ZCK_OK;
}

void zck__jp_leave(zck__jp *jp) { jp->depth--; }

zck_status zck__jp_object_begin(zck__jp *jp, const char *ctx) {
  int c = zck__jp_peek(jp);
  char cb[160];
  if (c != '{')
    return zck__jp_fail_value(jp, "%sexpected an object, found %s", zck__jp_ctx(jp, ctx, cb, sizeof cb), zck__kind_of(c));
  return zck__jp_enter(jp);
}

zck_status zck__jp_array_begin(zck__jp *jp, const char *ctx) {
  int c = zck__jp_peek(jp);
  char cb[160];
  if (c != '[')
    return zck__jp_fail_value(jp, "%sexpected an array, found %s", zck__jp_ctx(jp, ctx, cb, sizeof cb), zck__kind_of(c));
  return zck__jp_enter(jp);
}

/* Shared by objects and arrays: handles ',' and the closing bracket. */
static zck_status zck__jp_seq_next(zck__jp *jp, char close, bool *first, bool *done) {
  int c = zck__jp_peek(jp);
  *done = false;
  if (*first) {
    *first = false;
    if (c == close) { jp->p++; *done = true; return ZCK_OK; }
    return ZCK_OK;
  }
  if (c == close) { jp->p++; *done = true; return ZCK_OK; }
  if (c != ',') return zck__jp_fail(jp, "expected ',' or '%c', found %s", close, zck__kind_of(c));
  jp->p++;
  c = zck__jp_peek(jp);
  if (c == close) return zck__jp_fail(jp, "trailing comma");
  return ZCK_OK;
}

zck_status zck__jp_object_next(zck__jp *jp, bool *first, bool *done) {
  ZCK_TRY(zck__jp_seq_next(jp, '}', first, done));
  if (*done) return ZCK_OK;
  if (zck__jp_peek(jp) != '"') return zck__jp_fail(jp, "expected a string key, found %s", zck__jp_kind(jp));
  ZCK_TRY(zck__jp_string(jp, "key"));
  if (zck__jp_peek(jp) != ':') return zck__jp_fail(jp, "expected ':' after a key, found %s", zck__jp_kind(jp));
  jp->p++;
  return ZCK_OK;
}

zck_status zck__jp_array_next(zck__jp *jp, bool *first, bool *done) {
  ZCK_TRY(zck__jp_seq_next(jp, ']', first, done));
  if (!*done && zck__jp_peek(jp) == -1) return zck__jp_fail(jp, "unexpected end inside an array");
  return ZCK_OK;
}

static int zck__hex(uint8_t c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static bool zck__jp_hex4(zck__jp *jp, const uint8_t *q, uint32_t *v) {
  if (jp->end - q < 4) return false;
  uint32_t r = 0;
  for (int i = 0; i < 4; i++) {
    int h = zck__hex(q[i]);
    if (h < 0) return false;
    r = r << 4 | (uint32_t)h;
  }
  *v = r;
  return true;
}

static void zck__utf8_put(zck__buf *b, uint32_t cp) {
  uint8_t u[4];
  size_t n;
  if (cp < 0x80) { u[0] = (uint8_t)cp; n = 1; }
  else if (cp < 0x800) { u[0] = (uint8_t)(0xC0 | cp >> 6); u[1] = (uint8_t)(0x80 | (cp & 0x3F)); n = 2; }
  else if (cp < 0x10000) {
    u[0] = (uint8_t)(0xE0 | cp >> 12); u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); u[2] = (uint8_t)(0x80 | (cp & 0x3F)); n = 3;
  } else {
    u[0] = (uint8_t)(0xF0 | cp >> 18); u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (uint8_t)(0x80 | (cp & 0x3F)); n = 4;
  }
  zck__buf_append(b, u, n);
}

zck_status zck__jp_string(zck__jp *jp, const char *ctx) {
  int c = zck__jp_peek(jp);
  char cb[160];
  if (c != '"') return zck__jp_fail_value(jp, "%sexpected a string, found %s", zck__jp_ctx(jp, ctx, cb, sizeof cb), zck__kind_of(c));
  jp->p++;
  zck__buf *b = &jp->str;
  b->len = 0;
  b->failed = false;
  for (;;) {
    const uint8_t *run = jp->p;
    while (jp->p < jp->end && *jp->p != '"' && *jp->p != '\\' && *jp->p >= 0x20) jp->p++;
    zck__buf_append(b, run, (size_t)(jp->p - run));
    if (jp->p >= jp->end) return zck__jp_fail(jp, "unterminated string");
    uint8_t ch = *jp->p;
    if (ch == '"') { jp->p++; break; }
    if (ch < 0x20) return zck__jp_fail(jp, "control character 0x%02x inside a string", ch);
    /* backslash */
    if (jp->end - jp->p < 2) return zck__jp_fail(jp, "unterminated escape");
    uint8_t e = jp->p[1];
    const char *simple = NULL;
    switch (e) {
    case '"': simple = "\""; break;
    case '\\': simple = "\\"; break;
    case '/': simple = "/"; break;
    case 'b': simple = "\b"; break;
    case 'f': simple = "\f"; break;
    case 'n': simple = "\n"; break;
    case 'r': simple = "\r"; break;
    case 't': simple = "\t"; break;
    case 'u': break;
    default: return zck__jp_fail(jp, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
    }
    if (simple) { zck__buf_byte(b, (uint8_t)simple[0]); jp->p += 2; continue; }
    uint32_t cp;
    if (!zck__jp_hex4(jp, jp->p + 2, &cp)) return zck__jp_fail(jp, "invalid \\u escape");
    if (cp >= 0xDC00 && cp <= 0xDFFF) return zck__jp_fail(jp, "lone trailing surrogate \\u%04x", cp);
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      uint32_t lo;
      if (jp->end - jp->p < 12 || jp->p[6] != '\\' || jp->p[7] != 'u' || !zck__jp_hex4(jp, jp->p + 8, &lo) ||
          lo < 0xDC00 || lo > 0xDFFF)
        return zck__jp_fail(jp, "lone leading surrogate \\u%04x", cp);
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      jp->p += 12;
    } else {
      jp->p += 6;
    }
    zck__utf8_put(b, cp);
  }
  zck__buf_byte(b, 0);
  if (b->failed) return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory parsing %s JSON", jp->file, jp->what);
  b->len--; /* the NUL is not part of the string */
  return ZCK_OK;
}

/* Scans a JSON number at jp->p per the grammar; reports its parts. */
typedef struct {
  bool neg, frac, exp, overflow;
  uint64_t value;
} zck__jnum;

static zck_status zck__jp_number(zck__jp *jp, zck__jnum *n) {
  memset(n, 0, sizeof *n);
  const uint8_t *q = jp->p;
  if (q < jp->end && *q == '-') { n->neg = true; q++; }
  if (q >= jp->end || *q < '0' || *q > '9') return zck__jp_fail(jp, "invalid number");
  if (*q == '0') {
    q++;
    if (q < jp->end && *q >= '0' && *q <= '9') return zck__jp_fail(jp, "invalid number (leading zero)");
  } else {
    while (q < jp->end && *q >= '0' && *q <= '9') {
      uint64_t d = (uint64_t)(*q - '0');
      if (n->value > (UINT64_MAX - d) / 10) n->overflow = true;
      else n->value = n->value * 10 + d;
      q++;
    }
  }
  if (q < jp->end && *q == '.') {
    n->frac = true;
    q++;
    if (q >= jp->end || *q < '0' || *q > '9') return zck__jp_fail(jp, "invalid number (no digit after '.')");
    while (q < jp->end && *q >= '0' && *q <= '9') q++;
  }
  if (q < jp->end && (*q == 'e' || *q == 'E')) {
    n->exp = true;
    q++;
    if (q < jp->end && (*q == '+' || *q == '-')) q++;
    if (q >= jp->end || *q < '0' || *q > '9') return zck__jp_fail(jp, "invalid number (no digit in exponent)");
    while (q < jp->end && *q >= '0' && *q <= '9') q++;
  }
  jp->p = q;
  return ZCK_OK;
}

zck_status zck__jp_u64(zck__jp *jp, uint64_t *v, const char *ctx) {
  char cb[160];
  int c = zck__jp_peek(jp);
  if (c != '-' && !(c >= '0' && c <= '9'))
    return zck__jp_fail_value(jp, "%sexpected a non-negative integer, found %s", zck__jp_ctx(jp, ctx, cb, sizeof cb),
                              zck__kind_of(c));
  const uint8_t *at = jp->p;
  zck__jnum n;
  ZCK_TRY(zck__jp_number(jp, &n));
  const char *why = NULL;
  if (n.neg) why = "is negative";
  else if (n.frac || n.exp) why = "is not an integer";
  else if (n.overflow) why = "exceeds 2^64-1";
  if (why) {
    int len = (int)(jp->p - at);
    jp->p = at; /* report the number's own offset */
    return zck__jp_fail_value(jp, "%s%.*s %s", zck__jp_ctx(jp, ctx, cb, sizeof cb), len > 40 ? 40 : len, (const char *)at, why);
  }
  *v = n.value;
  return ZCK_OK;
}

static zck_status zck__jp_literal(zck__jp *jp, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(jp->end - jp->p) < n || memcmp(jp->p, word, n) != 0) return zck__jp_fail(jp, "invalid literal");
  jp->p += n;
  return ZCK_OK;
}

zck_status zck__jp_skip(zck__jp *jp) {
  int c = zck__jp_peek(jp);
  bool first = true, done = false;
  switch (c) {
  case '{':
    ZCK_TRY(zck__jp_object_begin(jp, "value"));
    for (;;) {
      ZCK_TRY(zck__jp_object_next(jp, &first, &done));
      if (done) break;
      ZCK_TRY(zck__jp_skip(jp));
    }
    zck__jp_leave(jp);
    return ZCK_OK;
  case '[':
    ZCK_TRY(zck__jp_array_begin(jp, "value"));
    for (;;) {
      ZCK_TRY(zck__jp_array_next(jp, &first, &done));
      if (done) break;
      ZCK_TRY(zck__jp_skip(jp));
    }
    zck__jp_leave(jp);
    return ZCK_OK;
  case '"': return zck__jp_string(jp, "value");
  case 't': return zck__jp_literal(jp, "true");
  case 'f': return zck__jp_literal(jp, "false");
  case 'n': return zck__jp_literal(jp, "null");
  case -1: return zck__jp_fail(jp, "unexpected end, expected a value");
  default:
    if (jp->python && (c == 'N' || c == 'I' || (c == '-' && jp->end - jp->p > 1 && jp->p[1] == 'I')))
      return zck__jp_literal(jp, c == 'N' ? "NaN" : c == 'I' ? "Infinity" : "-Infinity");
    if (c == '-' || (c >= '0' && c <= '9')) {
      zck__jnum n;
      return zck__jp_number(jp, &n);
    }
    return zck__jp_fail(jp, "expected a value, found byte 0x%02x", (unsigned)c);
  }
}

zck_status zck__jp_finish(zck__jp *jp) {
  int c = zck__jp_peek(jp);
  if (c != -1) return zck__jp_fail(jp, "trailing characters after the top-level value (byte 0x%02x)", (unsigned)c);
  return ZCK_OK;
}

zck_status zck__json_check(const char *name, const void *text, size_t n) {
  size_t bad = zck__utf8_check(text, n);
  if (bad != n) return zck__fail(ZCK_ERR_DAMAGED, "%s: invalid JSON at byte %zu: not UTF-8", name, bad);
  zck__jp jp;
  zck__jp_init(&jp, name, "", text, n, 0);
  jp.python = true;
  zck_status st = zck__jp_skip(&jp);
  if (st == ZCK_OK) st = zck__jp_finish(&jp);
  zck__jp_free(&jp);
  return st == ZCK_OK ? ZCK_OK : ZCK_ERR_DAMAGED;   /* the line says what; a side file that fails is damage */
}
