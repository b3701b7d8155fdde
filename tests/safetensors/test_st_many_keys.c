/* test_st_many_keys.c: metadata with 300k keys, as a hostile header or index may hold. The
 * index parser compared each key with every earlier one (a 3.4 MB index with 200k keys kept
 * `zckpt inspect` busy for minutes), and both writers scanned their entries on every set.
 * Each of them must take every key, find each one, refuse a duplicate by name, and finish
 * well inside the test's timeout (CMakeLists: 120 s; the scans took minutes, this takes about
 * a second). */
#include "test.h"
#include "safetensors/safetensors.h"
#include "util.h"

#include <stdbool.h>

enum { N_KEYS = 300000 };

/* {"metadata":{"k0000000":"v0",...[,dup]},"weight_map":{"a":"model.safetensors"}} */
static char *index_json(bool dup, size_t *len) {
  zck__buf b;
  zck__buf_init(&b);
  zck__buf_str(&b, "{\"metadata\":{\"total_size\":16");
  for (int i = 0; i < N_KEYS; i++) zck__buf_printf(&b, ",\"k%07d\":\"v%d\"", i, i);
  if (dup) zck__buf_str(&b, ",\"k0000000\":\"again\"");
  zck__buf_str(&b, "},\"weight_map\":{\"a\":\"model.safetensors\"}}");
  ZT_ASSERT(!b.failed);
  *len = b.len;
  return (char *)b.data;
}

static void test_index(void) {
  size_t n;
  char *json = index_json(false, &n);
  zck_hf_index *ix = NULL;
  ZT_OK(zck_hf_index_parse("big.index.json", json, n, ".safetensors", &ix));
  ZT_EQ_STR(zck_hf_index_metadata_get(ix, "k0000000"), "v0");
  ZT_EQ_STR(zck_hf_index_metadata_get(ix, "k0299999"), "v299999");
  ZT_ASSERT(zck_hf_index_metadata_get(ix, "k0300000") == NULL);
  ZT_EQ_INT(zck_hf_index_count(ix), 1);
  zck_hf_index_free(ix);
  free(json);

  json = index_json(true, &n);
  ix = NULL;
  ZT_ERR(zck_hf_index_parse("big.index.json", json, n, ".safetensors", &ix), ZCK_ERR_FORMAT, "duplicate key \"k0000000\"");
  ZT_ASSERT(ix == NULL);
  ZT_ASSERT(!strncmp(zck_last_error(), "big.index.json", 14));
  free(json);
}

/* The writer's set replaces a key's value in place; the header keeps first-set order. */
static void test_writer(void) {
  zck_st_writer *w = NULL;
  ZT_OK(zck_st_writer_new(&w));
  char k[32], v[32];
  for (int i = 0; i < N_KEYS; i++) {
    snprintf(k, sizeof k, "k%07d", i);
    snprintf(v, sizeof v, "v%d", i);
    ZT_OK(zck_st_writer_set_metadata(w, k, v));
  }
  ZT_OK(zck_st_writer_set_metadata(w, "k0000001", "replaced"));
  ZT_OK(zck_st_writer_layout(w));
  size_t hl;
  const uint8_t *h = zck_st_writer_header(w, &hl);
  char *json = strndup((const char *)h + 8, hl - 8); /* the header is not NUL-terminated */
  ZT_ASSERT(json);
  const char *fmt = strstr(json, "\"format\":\"pt\"");
  const char *first = strstr(json, "\"k0000001\":\"replaced\"");
  const char *last = strstr(json, "\"k0299999\":\"v299999\"");
  ZT_ASSERT(fmt && first && last && fmt < first && first < last);
  ZT_ASSERT(strstr(json, "\"k0000001\":\"v1\"") == NULL);
  free(json);

  /* and the reader takes the header back, every key */
  zck__source src;
  zck__source_memory(&src, "w.safetensors", h, hl);
  zck_st_file *f = NULL;
  ZT_OK(zck_st_open_source(&src, &f));
  ZT_EQ_INT(zck_st_metadata_count(f), N_KEYS + 1);
  ZT_EQ_STR(zck_st_metadata_get(f, "k0000001"), "replaced");
  ZT_EQ_STR(zck_st_metadata_get(f, "k0299999"), "v299999");
  zck_st_close(f);
  zck__source_close(&src);
  zck_st_writer_free(w);
}

int main(void) {
  test_index();
  test_writer();
  return 0;
}
