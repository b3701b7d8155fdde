/* test_data.c: the arithmetic corpus: its lines hold right sums, written least-significant
 * digit first with reversed_sums, shown back in the usual order for people; the held-out
 * check sees exactly the lines the training text holds. */
#include "test.h"

#include "data.h"

#include <stdio.h>
#include <string.h>

/* Every full line of text is "a+b=s\n" with s the sum (reversed when asked). */
static int check_lines(const uint8_t *text, size_t n, bool reversed) {
  int lines = 0;
  const char *p = (const char *)text, *end = p + n;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    ZT_ASSERT(nl != NULL);
    unsigned a, b;
    char sum[8];
    ZT_ASSERT(sscanf(p, "%u+%u=%7[0-9]", &a, &b, sum) == 3);
    ZT_ASSERT(a < 100 && b < 100);
    char want[8];
    ze_sum_digits(a + b, reversed, want, sizeof want);
    ZT_ASSERT(!strcmp(sum, want));
    ZT_ASSERT((size_t)(nl - p) == strlen(sum) + (size_t)(strchr(p, '=') - p) + 1);
    lines++;
    p = nl + 1;
  }
  return lines;
}

int main(void) {
  char d[8];
  ZT_ASSERT(ze_sum_digits(19, false, d, sizeof d) == 2 && !strcmp(d, "19"));
  ZT_ASSERT(ze_sum_digits(19, true, d, sizeof d) == 2 && !strcmp(d, "91"));
  ZT_ASSERT(ze_sum_digits(120, true, d, sizeof d) == 3 && !strcmp(d, "021"));
  ZT_ASSERT(ze_sum_digits(7, true, d, sizeof d) == 1 && !strcmp(d, "7"));
  char shown[] = "12+7=91\n95+12=701\n5+1=6\n3+4=";
  ze_sums_in_usual_order(shown);
  ZT_ASSERT(!strcmp(shown, "12+7=19\n95+12=107\n5+1=6\n3+4="));

  for (int r = 0; r < 2; r++) {
    ze_corpus c;
    ZT_ASSERT(ze_corpus_make(&c, 42, 4096, 1024, r == 1));
    ZT_ASSERT(check_lines(c.train, c.n_train, r == 1) > 300);
    ZT_ASSERT(check_lines(c.eval, c.n_eval, r == 1) > 80);
    /* the first line and one in the middle are seen; a pair absent from the text is not */
    unsigned a, b;
    ZT_ASSERT(sscanf((const char *)c.train, "%u+%u=", &a, &b) == 2 && ze_corpus_has_sum(&c, a, b));
    const char *mid = memchr(c.train + c.n_train / 2, '\n', c.n_train / 2);
    ZT_ASSERT(sscanf(mid + 1, "%u+%u=", &a, &b) == 2 && ze_corpus_has_sum(&c, a, b));
    int unseen = 0;
    for (unsigned x = 0; x < 100; x++)
      for (unsigned y = 0; y < 100; y++) {
        char line[16];
        int len = snprintf(line, sizeof line, "\n%u+%u=", x, y);
        bool in_text = !memcmp(c.train, line + 1, (size_t)len - 1) || memmem(c.train, c.n_train, line, (size_t)len);
        ZT_ASSERT(ze_corpus_has_sum(&c, x, y) == in_text);
        unseen += !in_text;
      }
    ZT_ASSERT(unseen > 5000);
    ze_corpus_free(&c);
  }
  return 0;
}
