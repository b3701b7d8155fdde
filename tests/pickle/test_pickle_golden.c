/* test_pickle_golden.c: every golden pickle (CPython's pickle.dumps(obj, 2), see
 * golden/make_golden.py) loads with the VM and dumps back to the very same bytes. */
#include "pickle/pickle.h"
#include "test.h"

#include <dirent.h>

static int roundtrip(const char *path) {
  unsigned char *data;
  size_t n;
  ZT_ASSERT(zt_read_file(path, &data, &n) == 0);
  zck_pk_doc *doc;
  ZT_OK(zck_pickle_load(data, n, path, NULL, &doc));
  zck__buf out;
  zck__buf_init(&out);
  ZT_OK(zck_pickle_dump(zck_pk_doc_root(doc), &out));
  int ok = out.len == n && !memcmp(out.data, data, n);
  if (!ok) {
    size_t i = 0;
    while (i < n && i < out.len && out.data[i] == data[i]) i++;
    fprintf(stderr, "%s: dump differs at byte %zu (golden %zu bytes, ours %zu)\n", path, i, n, out.len);
  }
  /* and the dump loads again */
  zck_pk_doc *again;
  ZT_OK(zck_pickle_load(out.data, out.len, "dump", NULL, &again));
  zck_pk_doc_free(again);
  zck__buf_free(&out);
  zck_pk_doc_free(doc);
  free(data);
  return ok;
}

int main(void) {
  const char *src = getenv("ZCK_SOURCE_DIR");
  char *dir = NULL;
  ZT_ASSERT(asprintf(&dir, "%s/tests/pickle/golden", src ? src : ZCK_TEST_SOURCE_DIR) > 0);
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort);
  ZT_ASSERT(n > 0);
  int count = 0, bad = 0;
  for (int i = 0; i < n; i++) {
    const char *nm = names[i]->d_name;
    size_t l = strlen(nm);
    if (l > 4 && !strcmp(nm + l - 4, ".pkl")) {
      char *p = NULL;
      ZT_ASSERT(asprintf(&p, "%s/%s", dir, nm) > 0);
      bad += !roundtrip(p);
      count++;
      free(p);
    }
    free(names[i]);
  }
  free(names);
  free(dir);
  printf("%d golden pickles, %d differ\n", count, bad);
  ZT_ASSERT(count >= 10);
  return bad != 0;
}
