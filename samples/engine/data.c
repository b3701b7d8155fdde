/* data.c: the synthetic arithmetic corpus (see data.h). */
#include "data.h"

#include "rng.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ze_sum_digits(unsigned sum, bool reversed, char *out, size_t cap) {
  int len = snprintf(out, cap, "%u", sum);
  if (reversed)
    for (int i = 0, j = len - 1; i < j; i++, j--) {
      char t = out[i];
      out[i] = out[j];
      out[j] = t;
    }
  return len;
}

void ze_sums_in_usual_order(char *text) {
  for (char *p = strchr(text, '='); p; p = strchr(p, '=')) {
    char *d = ++p;
    while (*p >= '0' && *p <= '9') p++;
    for (char *i = d, *j = p - 1; i < j; i++, j--) {
      char t = *i;
      *i = *j;
      *j = t;
    }
  }
}

static uint8_t *corpus_text(const ze_corpus *c, uint64_t *state, size_t want, size_t *n_out) {
  bool reversed = c->reversed_sums;
  uint8_t *t = malloc(want + 16);
  if (!t) return NULL;
  size_t n = 0;
  while (n < want) {
    unsigned a = (unsigned)(ze_splitmix64(state) % 100), b = (unsigned)(ze_splitmix64(state) % 100);
    char line[16];
    int len = snprintf(line, sizeof line, "%u+%u=", a, b);
    len += ze_sum_digits(a + b, reversed, line + len, sizeof line - (size_t)len);
    line[len++] = '\n';
    if (n + (size_t)len > want) break;
    memcpy(t + n, line, (size_t)len);
    n += (size_t)len;
  }
  *n_out = n;
  return t;
}

bool ze_corpus_make(ze_corpus *c, uint64_t seed, size_t train_bytes, size_t eval_bytes, bool reversed_sums) {
  memset(c, 0, sizeof *c);
  c->seed = seed;
  c->reversed_sums = reversed_sums;
  uint64_t st = seed ^ 0x64617461636f7270ull; /* "datacorp" */
  c->train = corpus_text(c, &st, train_bytes, &c->n_train);
  c->eval = corpus_text(c, &st, eval_bytes, &c->n_eval);
  if (!c->train || !c->eval) {
    ze_corpus_free(c);
    return false;
  }
  return true;
}

void ze_corpus_free(ze_corpus *c) {
  free(c->train);
  free(c->eval);
  c->train = c->eval = NULL;
  c->n_train = c->n_eval = 0;
}

void ze_corpus_train_window(const ze_corpus *c, uint64_t k, int T, int *out) {
  size_t span = c->n_train - (size_t)T - 1;
  size_t off = (size_t)(ze_hash2(c->seed, k) % (span + 1));
  for (int i = 0; i <= T; i++) out[i] = c->train[off + (size_t)i];
}

void ze_corpus_eval_window(const ze_corpus *c, int i, int n, int T, int *out) {
  size_t span = c->n_eval - (size_t)T - 1;
  size_t off = n > 1 ? span * (size_t)i / (size_t)(n - 1) : 0;
  for (int j = 0; j <= T; j++) out[j] = c->eval[off + (size_t)j];
}

bool ze_corpus_has_sum(const ze_corpus *c, unsigned a, unsigned b) {
  char line[24];
  int len = snprintf(line, sizeof line, "\n%u+%u=", a, b);
  if (c->n_train >= (size_t)len - 1 && !memcmp(c->train, line + 1, (size_t)len - 1)) return true;
  return memmem(c->train, c->n_train, line, (size_t)len) != NULL;
}
