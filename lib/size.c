/* size.c: the one reading of a size a user writes ("5GB", "500MB", "2GiB", "5G", "1000"),
 * used by the CLI, the Python package and the library alike.
 *
 * The rule is huggingface_hub's parse_size_to_int (the parser that save_torch_state_dict,
 * transformers' save_pretrained and DeepSpeed's zero_to_fp32 use for max_shard_size):
 * surrounding blanks stripped, the unit read in any case, TB/GB/MB/KB in powers of 10, the
 * value a float ("1.5GB"), int(value * unit) truncated. So that a size written for those
 * tools means the same bytes here, every string they accept is read as they read it. Also
 * accepted, where they would raise: TiB/GiB/MiB/KiB (powers of 2, as transformers' older
 * convert_file_size_to_int), the one-letter T/G/M/K (powers of 10, as `5G` on a command
 * line is usually meant), B, and a bare integer (bytes, exactly). transformers' reading of
 * a lowercase "b" as bits ("5Gb") is not followed: huggingface_hub, which does the actual
 * split, reads it as bytes. */
#include <ctype.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "util.h"
#include "zck.h"

static const struct { const char *unit; double mul; } zck__units[] = {
  /* longest first: "GIB" must not be read as "B" after "GI" */
  {"TIB", 1099511627776.0}, {"GIB", 1073741824.0}, {"MIB", 1048576.0}, {"KIB", 1024.0},
  {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3},
  {"T", 1e12}, {"G", 1e9}, {"M", 1e6}, {"K", 1e3}, {"B", 1},
};

/* float(value) as Python reads a plain decimal: digits with an optional fraction and
 * exponent; no sign, no hex, no inf or nan. */
static bool zck__size_value(const char *b, size_t n, double *v) {
  char num[64];
  if (n == 0 || n >= sizeof num) return false;
  for (size_t i = 0; i < n; i++) {
    char c = b[i];
    bool sign_after_e = (c == '+' || c == '-') && i > 0 && (b[i - 1] == 'e' || b[i - 1] == 'E');
    if (!isdigit((unsigned char)c) && c != '.' && c != 'e' && c != 'E' && !sign_after_e) return false;
  }
  memcpy(num, b, n);
  num[n] = 0;
  char *end = NULL;
  *v = strtod(num, &end);
  return end == num + n && isfinite(*v);
}

zck_status zck_parse_size(const char *s, uint64_t *bytes) {
  if (!s || !bytes) return zck__fail(ZCK_ERR_INVALID_ARG, "zck_parse_size: NULL argument");
  const char *b = s, *e = s + strlen(s);
  while (b < e && isspace((unsigned char)*b)) b++;
  while (e > b && isspace((unsigned char)e[-1])) e--;
  size_t n = (size_t)(e - b);
  if (n && strspn(b, "0123456789") >= n) { /* an int: bytes, exactly */
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
      if (!zck__mul_u64(v, 10, &v) || !zck__add_u64(v, (uint64_t)(b[i] - '0'), &v))
        return zck__fail(ZCK_ERR_INVALID_ARG, "size '%s' is too large", s);
    *bytes = v;
    return ZCK_OK;
  }
  for (size_t u = 0; u < sizeof zck__units / sizeof zck__units[0]; u++) {
    size_t ul = strlen(zck__units[u].unit);
    if (n <= ul || strncasecmp(e - ul, zck__units[u].unit, ul)) continue;
    const char *ve = e - ul;
    while (ve > b && isspace((unsigned char)ve[-1])) ve--;
    double v;
    if (!zck__size_value(b, (size_t)(ve - b), &v)) break;
    double r = v * zck__units[u].mul; /* int(value * multiplier): one IEEE multiply, then truncation */
    if (!(r < 18446744073709551616.0)) return zck__fail(ZCK_ERR_INVALID_ARG, "size '%s' is too large", s);
    *bytes = (uint64_t)r;
    return ZCK_OK;
  }
  return zck__fail(ZCK_ERR_INVALID_ARG, "size '%s': cannot read it (e.g. 5GB, 500MB, 2GiB, or a number of bytes)", s);
}
