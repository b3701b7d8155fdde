/* pyjson.c: values printed as Python prints them (pyjson.h). */
#include "pyjson.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


void zck_py_float_repr(double v, char *buf, size_t cap) {
  if (isnan(v)) {
    snprintf(buf, cap, "nan");
    return;
  }
  if (isinf(v)) {
    snprintf(buf, cap, v < 0 ? "-inf" : "inf");
    return;
  }
  /* shortest digits that round-trip, then Python's 'r' layout */
  char e[40];
  int prec;
  for (prec = 1; prec <= 17; prec++) {
    snprintf(e, sizeof e, "%.*e", prec - 1, v);
    if (strtod(e, NULL) == v) break;
  }
  /* e = "-d.ddde+XX" */
  char digits[24];
  int nd = 0;
  const char *p = e;
  bool neg = *p == '-';
  if (neg) p++;
  for (; *p && *p != 'e'; p++)
    if (*p >= '0' && *p <= '9') digits[nd++] = *p;
  int exp10 = atoi(p + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  digits[nd] = 0;
  char out[64];
  int o = 0;
  if (neg) out[o++] = '-';
  if (exp10 < -4 || exp10 >= 16) {
    out[o++] = digits[0];
    if (nd > 1) {
      out[o++] = '.';
      for (int i = 1; i < nd; i++) out[o++] = digits[i];
    }
    o += snprintf(out + o, sizeof out - (size_t)o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
  } else if (exp10 < 0) {
    out[o++] = '0';
    out[o++] = '.';
    for (int i = 0; i < -exp10 - 1; i++) out[o++] = '0';
    for (int i = 0; i < nd; i++) out[o++] = digits[i];
    out[o] = 0;
  } else {
    for (int i = 0; i <= exp10; i++) out[o++] = i < nd ? digits[i] : '0';
    out[o++] = '.';
    if (nd > exp10 + 1)
      for (int i = exp10 + 1; i < nd; i++) out[o++] = digits[i];
    else
      out[o++] = '0';
    out[o] = 0;
  }
  snprintf(buf, cap, "%s", out);
}

static int cmp_keys(const void *a, const void *b) {
  return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

static void py_indent(zck__buf *b, int depth) {
  zck__buf_byte(b, '\n');
  for (int i = 0; i < depth; i++) zck__buf_str(b, "  ");
}

void zck_py_json(zck__buf *b, const cJSON *j, int depth) {
  char f[40];
  if (cJSON_IsNull(j)) zck__buf_str(b, "null");
  else if (cJSON_IsBool(j)) zck__buf_str(b, cJSON_IsTrue(j) ? "true" : "false");
  else if (cJSON_IsString(j)) zck__buf_printf(b, "\"%s\"", j->valuestring);
  else if (cJSON_IsNumber(j)) {
    double v = j->valuedouble;
    /* ints stay ints ("step": 10); every other number is a Python float repr */
    if (j->valueint == v && v == floor(v) && fabs(v) < 2e9 && !(j->type & ZCK_PY_FLOAT)) zck__buf_printf(b, "%d", j->valueint);
    else {
      zck_py_float_repr(v, f, sizeof f);
      zck__buf_str(b, isnan(v) ? "NaN" : f);
    }
  } else if (cJSON_IsArray(j)) {
    if (!j->child) {
      zck__buf_str(b, "[]");
      return;
    }
    zck__buf_byte(b, '[');
    for (const cJSON *c = j->child; c; c = c->next) {
      py_indent(b, depth + 1);
      zck_py_json(b, c, depth + 1);
      if (c->next) zck__buf_byte(b, ',');
    }
    py_indent(b, depth);
    zck__buf_byte(b, ']');
  } else if (cJSON_IsObject(j)) {
    int n = cJSON_GetArraySize(j);
    if (!n) {
      zck__buf_str(b, "{}");
      return;
    }
    const cJSON **items = malloc((size_t)n * sizeof *items);
    if (!items) {
      b->failed = true;
      return;
    }
    int k = 0;
    for (const cJSON *c = j->child; c; c = c->next) items[k++] = c;
    qsort(items, (size_t)n, sizeof *items, cmp_keys);
    zck__buf_byte(b, '{');
    for (int i = 0; i < n; i++) {
      py_indent(b, depth + 1);
      zck__buf_printf(b, "\"%s\": ", items[i]->string);
      zck_py_json(b, items[i], depth + 1);
      if (i + 1 < n) zck__buf_byte(b, ',');
    }
    free(items);
    py_indent(b, depth);
    zck__buf_byte(b, '}');
  }
}

cJSON *zck_py_float(double v) {
  cJSON *j = cJSON_CreateNumber(v);
  if (j) j->type |= ZCK_PY_FLOAT;
  return j;
}

