/* test_util.c: fixtures and scratch directories for tests. */
#include "test.h"

#include <stdlib.h>
#include <unistd.h>

const char *zt_fixtures(void) {
  const char *f = getenv("ZCK_FIXTURES");
  return f ? f : ZCK_TEST_FIXTURES;
}

char *zt_fixture(const char *rel) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", zt_fixtures(), rel) < 0) abort();
  return p;
}

static char *zt__tmp;
static void zt__cleanup(void) {
  if (zt__tmp && !getenv("ZCK_KEEP_TMP")) {
    char *cmd = NULL;
    if (asprintf(&cmd, "rm -rf '%s'", zt__tmp) >= 0) { if (system(cmd)) {} free(cmd); }
  }
  free(zt__tmp);
}

char *zt_tmpdir(void) {
  const char *base = getenv("TMPDIR");
  char *t = NULL;
  if (asprintf(&t, "%s/zckpt-test-XXXXXX", base ? base : "/tmp") < 0) abort();
  if (!mkdtemp(t)) ZT_FAIL("mkdtemp failed");
  if (!zt__tmp) { zt__tmp = strdup(t); atexit(zt__cleanup); }
  return t;
}

int zt_read_file(const char *path, unsigned char **data, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return -1;
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  *data = malloc((size_t)len + 1);
  *n = fread(*data, 1, (size_t)len, f);
  fclose(f);
  return *n == (size_t)len ? 0 : -1;
}

int zt_write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) return -1;
  size_t w = fwrite(data, 1, n, f);
  fclose(f);
  return w == n ? 0 : -1;
}
