/* test_pk_dict_index.c: zck_pk_dict_index gives zck_pk_dict_get's answers through a hash
 * table: the last of duplicate keys, nothing for a key holding U+0000 or a non-str key,
 * nothing for a non-dict; and every key of a 100k-entry dict, checked against the scan on a
 * sample. */
#include "test.h"
#include "pickle/pickle.h"

static void test_rules(void) {
  zck_pk_doc *d = zck_pk_doc_new();
  ZT_ASSERT(d);
  zck_pk *dict = zck_pk_new_dict(d, 0);
  ZT_ASSERT(zck_pk_dict_set(d, dict, zck_pk_new_str(d, "a"), zck_pk_new_int(d, 1)));
  ZT_ASSERT(zck_pk_dict_set(d, dict, zck_pk_new_str(d, "b"), zck_pk_new_int(d, 2)));
  ZT_ASSERT(zck_pk_dict_set(d, dict, zck_pk_new_str(d, "a"), zck_pk_new_int(d, 3)));     /* a later SETITEM */
  ZT_ASSERT(zck_pk_dict_set(d, dict, zck_pk_new_bytes(d, "c", 1), zck_pk_new_int(d, 4))); /* bytes, not str */
  zck_pk *nul = zck_pk_new_str(d, "xx");
  nul->u.str.data[1] = 0;                                                                 /* "x\0" */
  ZT_ASSERT(zck_pk_dict_set(d, dict, nul, zck_pk_new_int(d, 5)));
  zck_pk_dict_index x;
  ZT_OK(zck_pk_dict_index_init(&x, dict));
  const char *keys[] = {"a", "b", "c", "x", "missing"};
  for (size_t i = 0; i < 5; i++)
    if (zck_pk_dict_index_get(&x, keys[i]) != zck_pk_dict_get(dict, keys[i])) ZT_FAIL("key %s: index != scan", keys[i]);
  int64_t v = 0;
  ZT_ASSERT(zck_pk_as_int(zck_pk_dict_index_get(&x, "a"), &v) && v == 3);
  ZT_ASSERT(zck_pk_dict_index_get(&x, "c") == NULL && zck_pk_dict_index_get(&x, "x") == NULL);
  zck_pk_dict_index_free(&x);

  ZT_OK(zck_pk_dict_index_init(&x, zck_pk_new_list(d)));  /* not a dict: finds nothing */
  ZT_ASSERT(zck_pk_dict_index_get(&x, "a") == NULL);
  zck_pk_dict_index_free(&x);
  ZT_OK(zck_pk_dict_index_init(&x, NULL));
  ZT_ASSERT(zck_pk_dict_index_get(&x, "a") == NULL);
  zck_pk_dict_index_free(&x);
  zck_pk_doc_free(d);
}

static void test_many(void) {
  enum { N = 100000 };
  zck_pk_doc *d = zck_pk_doc_new();
  zck_pk *dict = zck_pk_new_dict(d, 0);
  char k[32];
  for (int i = 0; i < N; i++) {
    snprintf(k, sizeof k, "layers.%d.weight", i);
    ZT_ASSERT(zck_pk_dict_set(d, dict, zck_pk_new_str(d, k), zck_pk_new_int(d, i)));
  }
  zck_pk_dict_index x;
  ZT_OK(zck_pk_dict_index_init(&x, dict));
  for (int i = 0; i < N; i++) {
    snprintf(k, sizeof k, "layers.%d.weight", i);
    const zck_pk *got = zck_pk_dict_index_get(&x, k);
    int64_t v = -1;
    if (!zck_pk_as_int(got, &v) || v != i) ZT_FAIL("%s: got %lld", k, (long long)v);
    if (i % 997 == 0 && got != zck_pk_dict_get(dict, k)) ZT_FAIL("%s: index != scan", k);
  }
  zck_pk_dict_index_free(&x);
  zck_pk_doc_free(d);
}

int main(void) {
  test_rules();
  test_many();
  return 0;
}
