/* test_st_malformed.c: one crafted input per way a safetensors header or an HF index can
 * be malformed, each rejected with its own one-line message (or accepted / warned where
 * safetensors and transformers accept it). `test_st_malformed --write-corpus DIR` writes
 * the crafted safetensors images and index texts as fuzz seeds. */
#include "test.h"
#include "safetensors/safetensors.h"
#include "st_test_util.h"

#include <sys/stat.h>
#include <unistd.h>

static const char *corpus_dir, *index_corpus_dir;
static int seed_no;

static void save_seed(const char *dir, const void *data, size_t n) {
  if (!dir) return;
  char name[32];
  snprintf(name, sizeof name, "seed-%03d", seed_no++);
  free(st_write_tmp(dir, name, data, n));
}

/* Opens a crafted image from memory; checks the status and that the message has `needle`
 * and names the file. */
static void expect_img(const uint8_t *img, size_t n, zck_status want, const char *needle, int line) {
  save_seed(corpus_dir, img, n);
  zck__source src;
  zck__source_memory(&src, "bad.safetensors", img, n);
  zck_st_file *f = NULL;
  zck_status s = zck_st_open_source(&src, &f);
  if (s != want) ZT_FAIL("line %d: expected %s, got %s (%s)", line, zck_status_name(want), zck_status_name(s), zck_last_error());
  if (s != ZCK_OK) {
    if (!strstr(zck_last_error(), needle)) ZT_FAIL("line %d: message \"%s\" lacks \"%s\"", line, zck_last_error(), needle);
    if (strncmp(zck_last_error(), "bad.safetensors: ", 17)) ZT_FAIL("line %d: message \"%s\" does not start with the file", line, zck_last_error());
    if (strchr(zck_last_error(), '\n')) ZT_FAIL("line %d: message has a newline", line);
  } else if (needle) { /* a warning is expected */
    int found = 0;
    for (size_t i = 0; i < zck_st_warning_count(f); i++) found |= strstr(zck_st_warning_at(f, i), needle) != NULL;
    if (!found) ZT_FAIL("line %d: no warning with \"%s\"", line, needle);
  }
  zck_st_close(f);
  zck__source_close(&src);
}

/* A header (padded to 8 with spaces) and data_len data bytes. */
static void expect(const char *json, uint64_t data_len, zck_status want, const char *needle, int line) {
  size_t n, pad = (8 - strlen(json) % 8) % 8;
  uint8_t *img = st_craft(json, pad, data_len, &n);
  expect_img(img, n, want, needle, line);
  free(img);
}
#define BAD(json, len, needle) expect(json, len, ZCK_ERR_FORMAT, needle, __LINE__)
#define GOOD(json, len) expect(json, len, ZCK_OK, NULL, __LINE__)
#define WARN(json, len, needle) expect(json, len, ZCK_OK, needle, __LINE__)

static void safetensors_cases(void) {
  size_t n;
  uint8_t *img;
  expect_img((const uint8_t *)"\x05\0\0\0\0", 5, ZCK_ERR_TRUNCATED, "5 bytes, too short for the 8-byte header length", __LINE__);
  expect_img((const uint8_t *)"", 0, ZCK_ERR_TRUNCATED, "0 bytes, too short for the 8-byte header length", __LINE__);
  img = st_craft_n(100000001, "{}", 6, 0, &n);
  expect_img(img, n, ZCK_ERR_FORMAT, "header length 100000001 exceeds the 100,000,000-byte limit", __LINE__);
  free(img);
  img = st_craft_n(UINT64_MAX, "{}", 6, 0, &n);
  expect_img(img, n, ZCK_ERR_FORMAT, "exceeds the 100,000,000-byte limit", __LINE__);
  free(img);
  img = st_craft_n(1000, "{}", 6, 0, &n);
  expect_img(img, n, ZCK_ERR_TRUNCATED, "header length 1000 exceeds the 8 bytes after the length field", __LINE__);
  free(img);
  BAD("{\"a\xff\":{}}", 0, "header is not valid UTF-8 (byte 11)");
  BAD("{\"\xc0\xaf\":1}", 0, "not valid UTF-8");                 /* overlong */
  BAD("{\"\xed\xa0\x80\":1}", 0, "not valid UTF-8");             /* surrogate */
  BAD("{\"\xf4\x90\x80\x80\":1}", 0, "not valid UTF-8");         /* > U+10FFFF */
  BAD("{\"a\":", 0, "tensor a: expected an object, found the end of the input (header byte 16)");
  BAD("{\"a\":{\"dtype\":\"F32\"", 0, "invalid header JSON at byte 32: expected ',' or '}', found the end of the input");
  BAD("{\"a\":{\"x\":", 0, "invalid header JSON at byte 24: unexpected end, expected a value");
  BAD("[]", 0, "the header must be a JSON object: expected an object, found an array");
  BAD("", 0, "expected an object, found the end of the input");
  BAD("{} x", 0, "trailing characters");
  /* NUL padding is not whitespace */
  expect_img((const uint8_t *)"\x08\0\0\0\0\0\0\0{}\0\0\0\0\0\0", 16, ZCK_ERR_FORMAT, "trailing characters", __LINE__);
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 4, "leading zero");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,],\"data_offsets\":[0,4]}}", 4, "trailing comma");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},}", 4, "trailing comma");
  BAD("{\"a\":{\"dtype\":\"F32\" \"shape\":[1]}}", 4, "expected ',' or '}'");
  BAD("{\"a\tb\":1}", 0, "control character 0x09 inside a string");
  BAD("{\"\\ud800\":1}", 0, "lone leading surrogate");
  BAD("{\"\\udc00x\":1}", 0, "lone trailing surrogate");
  BAD("{\"\\q\":1}", 0, "invalid escape");
  BAD("{'a':1}", 0, "expected a string key");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":NaN}}", 4, "expected a value");
  BAD("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":tru}}", 4, "invalid literal");
  {
    char deep[600];
    int k = snprintf(deep, sizeof deep, "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":");
    for (int i = 0; i < 130; i++) deep[k++] = '[';
    for (int i = 0; i < 130; i++) deep[k++] = ']';
    deep[k++] = '}'; deep[k++] = '}'; deep[k] = 0;
    BAD(deep, 4, "nesting deeper than 128 levels");
  }
  BAD("{\"__metadata__\":{\"a\":1}}", 0, "__metadata__ entry \"a\": values must be strings, found a number (header byte 29)");
  BAD("{\"__metadata__\":{\"a\":null}}", 0, "values must be strings, found null");
  BAD("{\"__metadata__\":[]}", 0, "__metadata__: must be an object of strings: expected an object, found an array");
  BAD("{\"__metadata__\":\"pt\"}", 0, "__metadata__: must be an object of strings");
  BAD("{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor w: missing \"dtype\" (header byte 13)");
  BAD("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, "tensor w: missing \"shape\"");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "tensor w: missing \"data_offsets\"");
  BAD("{\"w\":[\"F32\",[1],[0,4]]}", 4, "tensor w: expected an object, found an array");
  BAD("{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor w: duplicate field \"dtype\"");
  BAD("{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor w: unknown dtype \"f32\" (header byte 13)");
  BAD("{\"w\":{\"dtype\":\"F128\",\"shape\":[1],\"data_offsets\":[0,16]}}", 16, "unknown dtype \"F128\"");
  BAD("{\"w\":{\"dtype\":3,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "tensor w: dtype: expected a string, found a number");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "tensor w: shape[0]: -1 is negative (header byte 37)");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "shape[0]: 1.0 is not an integer");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e0],\"data_offsets\":[0,4]}}", 4, "shape[0]: 1e0 is not an integer");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[-0],\"data_offsets\":[0,0]}}", 0, "-0 is negative");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[18446744073709551616],\"data_offsets\":[0,4]}}", 4, "18446744073709551616 exceeds 2^64-1");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, "tensor w: shape: expected an array, found a number");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, "shape[0]: expected a non-negative integer, found a string");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, "tensor w: data_offsets has 1 element, expected [begin, end]");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, "data_offsets has more than 2 elements");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,-4]}}", 4, "data_offsets[1]: -4 is negative");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.0,4]}}", 4, "data_offsets[0]: 0.0 is not an integer");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":{\"0\":4}}}", 4, "data_offsets: expected an array, found an object");
  BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}", 2,
      "tensor w: duplicate tensor name (header byte 65)");
  BAD("{\"__metadata__\":{},\"__metadata__\":{}}", 0, "duplicate key \"__metadata__\"");
  BAD("{\"__metadata__\":{\"format\":\"pt\",\"format\":\"pt\"}}", 0, "__metadata__: duplicate key \"format\"");
  BAD("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor name contains U+0000");
  BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, "tensor w: data_offsets [8, 4] end before begin");
  BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}", 4, "tensor w: data_offsets end 8 is past the end of the 4-byte data section");
  BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]}}", 8, "tensor w: the first tensor in the data section begins at 4, not 0");
  BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[6,10]}}", 10,
      "tensor b: hole of 2 bytes between tensor a (ends at 4) and it (begins at 6)");
  BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}", 6,
      "tensor b: data_offsets [2, 6] overlap tensor a (ends at 4)");
  BAD("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}", 4,
      "tensor z: data_offsets [2, 2] overlap tensor a");
  BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 6, "2 trailing bytes after the last tensor (w ends at 4 of 6)");
  BAD("{}", 3, "3 bytes after the header but no tensors");
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 4,
      "tensor w: data_offsets [0, 4] hold 4 bytes but 2 F32 elements need 8");
  BAD("{\"w\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,2],\"data_offsets\":[0,0]}}", 0, "tensor w: element count overflows 64 bits");
  BAD("{\"w\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,0]}}", 0, "size in bits of 4611686018427387904 F64 elements overflows 64 bits");
  /* a dimension over int64 (torch sizes are int64) even where the element count is 0: the
   * reader refuses it and names the file; the jobs failed later without the file */
  BAD("{\"w\":{\"dtype\":\"F32\",\"shape\":[0,9223372036854775808],\"data_offsets\":[0,0]}}", 0,
      "tensor w: dimension 1 is 9223372036854775808, over 2^63 - 1");
  BAD("{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1, "tensor w: 3 F4 elements are 12 bits, not a whole number of bytes");
  BAD("{\"w\":{\"dtype\":\"F6_E2M3\",\"shape\":[],\"data_offsets\":[0,1]}}", 1, "not a whole number of bytes");
  /* accepted paddings */
  img = st_craft("{\"__metadata__\":{\"format\":\"pt\"}}", 1, 0, &n); /* N = 33, not a multiple of 8 */
  expect_img(img, n, ZCK_OK, NULL, __LINE__);
  free(img);
  img = st_craft(" \n\t\r{\"__metadata__\":{\"format\":\"pt\"}}", 59, 0, &n); /* leading whitespace, 96-byte header */
  expect_img(img, n, ZCK_OK, NULL, __LINE__);
  free(img);
  /* accepted shapes */
  GOOD("{\"__metadata__\":{\"format\":\"pt\"},\"e\":{\"dtype\":\"F32\",\"shape\":[0,3],\"data_offsets\":[0,0]},\"s\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
       "\"z\":{\"dtype\":\"F32\",\"shape\":[5,0],\"data_offsets\":[8,8]},\"f4\":{\"dtype\":\"F4\",\"shape\":[2,3],\"data_offsets\":[8,11]}}", 11);
  GOOD("{\"__metadata__\":{\"format\":\"pt\"}}", 0);
  GOOD("{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"data_offsets\":[0,2],\"extra\":{\"x\":[1,2.5e3,null]},\"shape\":[1],\"dtype\":\"BF16\"}}", 2);
  GOOD("{\"__metadata__\":{\"format\":\"pt\"},\"\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1);
  /* warnings */
  WARN("{}", 0, "no __metadata__; transformers expects {\"format\": \"pt\"}");
  WARN("{\"__metadata__\":null}", 0, "no __metadata__");
  WARN("{\"__metadata__\":{}}", 0, "__metadata__ has no \"format\"");
  WARN("{\"__metadata__\":{\"format\":\"np\"}}", 0, "format \"np\" is not one transformers loads");

  /* the error names the file for file sources too; names with control characters stay one line */
  char *dir = zt_tmpdir();
  const char *j = "{\"bad\\nname\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
  img = st_craft(j, (8 - strlen(j) % 8) % 8, 4, &n);
  char *p = st_write_tmp(dir, "x.safetensors", img, n);
  zck_st_file *f;
  ZT_ERR(zck_st_open(p, &f), ZCK_ERR_FORMAT, "x.safetensors: tensor bad\\x0aname: unknown dtype \"f32\"");
  free(img);
  free(p);
  /* a file cut short after the open: reading the tensor fails cleanly */
  j = "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}";
  img = st_craft(j, (8 - strlen(j) % 8) % 8, 4, &n);
  p = st_write_tmp(dir, "y.safetensors", img, n);
  ZT_OK(zck_st_open(p, &f));
  ZT_ASSERT(truncate(p, (off_t)n - 2) == 0);
  uint8_t got[4];
  ZT_ERR(zck_st_read(f, zck_st_find(f, "w"), got, 0, 4), ZCK_ERR_TRUNCATED, "y.safetensors: truncated");
  zck_st_close(f);
  free(img);
  free(p);
  free(dir);
}

/* ---- HF index */

static void expect_index(const char *json, zck_status want, const char *needle, int line) {
  save_seed(index_corpus_dir, json, strlen(json));
  zck_hf_index *ix = NULL;
  zck_status s = zck_hf_index_parse("model.safetensors.index.json", json, strlen(json), ".safetensors", &ix);
  if (s != want) ZT_FAIL("line %d: expected %s, got %s (%s)", line, zck_status_name(want), zck_status_name(s), zck_last_error());
  if (s != ZCK_OK && !strstr(zck_last_error(), needle))
    ZT_FAIL("line %d: message \"%s\" lacks \"%s\"", line, zck_last_error(), needle);
  if (s != ZCK_OK && strncmp(zck_last_error(), "model.safetensors.index.json: ", 30))
    ZT_FAIL("line %d: message \"%s\" does not name the file", line, zck_last_error());
  zck_hf_index_free(ix);
}
#define IXBAD(json, needle) expect_index(json, ZCK_ERR_FORMAT, needle, __LINE__)
#define IXGOOD(json) expect_index(json, ZCK_OK, NULL, __LINE__)

static void write_shard(const char *dir, const char *name, const char *const *tensors) {
  zck_st_writer *w;
  ZT_OK(zck_st_writer_new(&w));
  uint64_t shape[1] = {2};
  size_t n = 0;
  for (; tensors[n]; n++) ZT_OK(zck_st_writer_add(w, tensors[n], ZCK_ST_F32, 1, shape, NULL));
  ZT_OK(zck_st_writer_layout(w));
  char *p = zck__path_join(dir, name);
  ZT_OK(zck_st_writer_open(w, p));
  for (size_t i = 0; i < n; i++) ZT_OK(zck_st_writer_write(w, i, "01234567", 0, 8));
  ZT_OK(zck_st_writer_commit(w));
  zck_st_writer_free(w);
  free(p);
}

static void open_dir_index(const char *dir, const char *json, zck_status want, const char *needle, int line) {
  char *p = st_write_tmp(dir, "model.safetensors.index.json", json, strlen(json));
  zck_hf_checkpoint *c = NULL;
  zck_status s = zck_hf_open(dir, &c);
  if (s != want) ZT_FAIL("line %d: expected %s, got %s (%s)", line, zck_status_name(want), zck_status_name(s), zck_last_error());
  if (s != ZCK_OK && !strstr(zck_last_error(), needle)) ZT_FAIL("line %d: message \"%s\" lacks \"%s\"", line, zck_last_error(), needle);
  if (s == ZCK_OK && needle) {
    int found = 0;
    for (size_t i = 0; i < zck_hf_warning_count(c); i++) found |= strstr(zck_hf_warning_at(c, i), needle) != NULL;
    if (!found) ZT_FAIL("line %d: no warning with \"%s\"", line, needle);
  }
  zck_hf_close(c);
  free(p);
}

static void index_cases(void) {
  IXBAD("{\"weight_map\":{}", "invalid index JSON at byte 16");
  IXBAD("[]", "the index must be a JSON object: expected an object, found an array");
  IXBAD("{\"weight_map\":{\"a\xff\":\"m.safetensors\"}}", "not valid UTF-8 (byte 17)");
  IXBAD("{\"weight_map\":{},\"weight_map\":{}}", "duplicate key \"weight_map\"");
  IXBAD("{\"metadata\":[],\"weight_map\":{}}", "\"metadata\": expected an object, found an array");
  IXBAD("{\"metadata\":{\"total_size\":0}}", "no \"weight_map\"");
  IXBAD("{\"weight_map\":[]}", "\"weight_map\" must be an object of strings: expected an object, found an array");
  IXBAD("{\"weight_map\":{\"a\":1}}", "weight_map: tensor a: the shard must be a string, found a number");
  IXBAD("{\"weight_map\":{\"a\":null}}", "found null");
  IXBAD("{\"weight_map\":{\"a\":\"/abs/model.safetensors\"}}", "tensor a: shard path \"/abs/model.safetensors\" is absolute; shard names must be relative without '..'");
  IXBAD("{\"weight_map\":{\"a\":\"..\\\\x.safetensors\"}}", "has a '..' component");
  IXBAD("{\"weight_map\":{\"a\":\"sub/../../x.safetensors\"}}", "has a '..' component");
  IXBAD("{\"weight_map\":{\"a\":\"C:model.safetensors\"}}", "has a drive");
  IXBAD("{\"weight_map\":{\"a\":\"\\\\\\\\server\\\\share\\\\x.safetensors\"}}", "is absolute");
  IXBAD("{\"weight_map\":{\"a\":\"..\"}}", "has a '..' component");
  IXBAD("{\"weight_map\":{\"a\":\"pytorch_model.bin\"}}", "tensor a: shard \"pytorch_model.bin\" does not end with \".safetensors\"");
  IXBAD("{\"weight_map\":{\"a\":\"model.SAFETENSORS\"}}", "does not end with \".safetensors\"");
  /* (within the index) */
  IXBAD("{\"weight_map\":{\"a\":\"m.safetensors\",\"a\":\"n.safetensors\"}}", "tensor a: listed twice in weight_map (byte 39)");
  IXBAD("{\"metadata\":{\"total_size\":1.5},\"weight_map\":{}}", "metadata.total_size: 1.5 is not an integer");
  IXBAD("{\"metadata\":{\"total_size\":\"12\"},\"weight_map\":{}}", "metadata.total_size: expected a non-negative integer, found a string");
  IXBAD("{\"metadata\":{\"total_size\":-1},\"weight_map\":{}}", "metadata.total_size: -1 is negative");
  /* accepted */
  IXGOOD("{\"metadata\":{\"total_size\":16,\"total_parameters\":4,\"x\":{\"y\":[1.5]},\"s\":\"v\"},\"weight_map\":{\"a\":\"sub/m.safetensors\"},\"extra\":true}");
  IXGOOD("{\"weight_map\":{}}");
  {
    zck_hf_index *ix;
    const char *j = "{\"metadata\":{\"total_size\":16,\"s\":\"v\",\"n\":3},\"weight_map\":{\"b\":\"y.safetensors\",\"a\":\"x.safetensors\",\"c\":\"y.safetensors\"}}";
    ZT_OK(zck_hf_index_parse("i.json", j, strlen(j), ".safetensors", &ix));
    uint64_t total;
    ZT_ASSERT(zck_hf_index_total_size(ix, &total) && total == 16);
    ZT_EQ_STR(zck_hf_index_metadata_get(ix, "s"), "v");
    ZT_ASSERT(zck_hf_index_metadata_get(ix, "n") == NULL);
    ZT_EQ_U64(zck_hf_index_count(ix), 3);
    ZT_EQ_U64(zck_hf_index_shard_count(ix), 2);
    ZT_EQ_STR(zck_hf_index_shard(ix, 0), "y.safetensors");
    const char *t, *s;
    zck_hf_index_entry(ix, 1, &t, &s);
    ZT_EQ_STR(t, "a");
    ZT_EQ_STR(s, "x.safetensors");
    zck_hf_index_free(ix);
  }

  /* ---- against shards on disk */
  char *dir = zt_tmpdir();
  const char *s1[] = {"a", "b", NULL}, *s2[] = {"c", "extra", NULL};
  write_shard(dir, "model-00001-of-00002.safetensors", s1);
  write_shard(dir, "model-00002-of-00002.safetensors", s2);
  const char *base = "{\"metadata\":{\"total_size\":%d},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\",\"c\":\"%s\"%s}}";
  char j[1024];
  /* (the total size silent when right): "extra" is not in the map; transformers loads
   * every tensor of a shard the map names, so it is kept, after the mapped ones, and
   * counted in total_size */
  snprintf(j, sizeof j, base, 32, "model-00002-of-00002.safetensors", "");
  open_dir_index(dir, j, ZCK_OK, "tensor extra is absent from the weight_map; kept, as transformers loads every tensor "
                 "of a shard", __LINE__);
  {
    zck_hf_checkpoint *c;
    ZT_OK(zck_hf_open(dir, &c));
    ZT_EQ_U64(zck_hf_count(c), 4);
    ZT_EQ_U64(zck_hf_shard_count(c), 2);
    const zck_hf_tensor *t = zck_hf_find(c, "c");
    ZT_ASSERT(t && t->shard == 1);
    ZT_EQ_INT(zck_hf_warning_count(c), 1);
    uint8_t got[8];
    ZT_OK(zck_st_read(t->file, t->t, got, 0, 8));
    ZT_EQ_MEM(got, "01234567", 8);
    const zck_hf_tensor *x = zck_hf_find(c, "extra");
    ZT_ASSERT(x && x == zck_hf_tensor_at(c, 3) && x->shard == 1 && x->file == zck_hf_shard(c, 1));
    ZT_EQ_STR(x->t->name, "extra");
    ZT_OK(zck_st_read(x->file, x->t, got, 0, 8));
    ZT_EQ_MEM(got, "01234567", 8);
    zck_hf_close(c);
  }
  /* wrong total; also when it counts only the mapped tensors */
  snprintf(j, sizeof j, base, 99, "model-00002-of-00002.safetensors", "");
  open_dir_index(dir, j, ZCK_OK, "metadata.total_size is 99 but the tensors hold 32 bytes", __LINE__);
  snprintf(j, sizeof j, base, 24, "model-00002-of-00002.safetensors", "");
  open_dir_index(dir, j, ZCK_OK, "metadata.total_size is 24 but the tensors hold 32 bytes", __LINE__);
  snprintf(j, sizeof j, base, 24, "model-00003-of-00002.safetensors", "");
  open_dir_index(dir, j, ZCK_ERR_NOT_FOUND, "model-00003-of-00002.safetensors (holding tensor c) does not exist", __LINE__);
  snprintf(j, sizeof j, base, 24, "model-00002-of-00002.safetensors", ",\"d\":\"model-00002-of-00002.safetensors\"");
  open_dir_index(dir, j, ZCK_ERR_FORMAT, "tensor d: weight_map says model-00002-of-00002.safetensors but that shard has no such tensor", __LINE__);
  snprintf(j, sizeof j, base, 24, "model-00001-of-00002.safetensors", "");
  open_dir_index(dir, j, ZCK_ERR_FORMAT, "tensor c: weight_map says model-00001-of-00002.safetensors", __LINE__);
  /* "a" in both shards */
  const char *s3[] = {"a", "c", NULL};
  write_shard(dir, "model-00002-of-00002.safetensors", s3);
  snprintf(j, sizeof j, base, 24, "model-00002-of-00002.safetensors", "");
  open_dir_index(dir, j, ZCK_ERR_FORMAT, "tensor a is in two shards", __LINE__);
  /* a malformed shard: its own error, naming the shard */
  free(st_write_tmp(dir, "model-00002-of-00002.safetensors", "\x02\0\0\0\0\0\0\0[]", 10));
  open_dir_index(dir, j, ZCK_ERR_FORMAT, "model-00002-of-00002.safetensors: the header must be a JSON object", __LINE__);
  /* a directory with neither file */
  char *empty = zt_tmpdir();
  zck_hf_checkpoint *c;
  ZT_ERR(zck_hf_open(empty, &c), ZCK_ERR_NOT_FOUND, "no model.safetensors or model.safetensors.index.json");
  free(empty);
  free(dir);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--write-corpus")) {
    static char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/safetensors", argv[2]);
    snprintf(b, sizeof b, "%s/st_index", argv[2]);
    mkdir(argv[2], 0755); mkdir(a, 0755); mkdir(b, 0755);
    corpus_dir = a;
    index_corpus_dir = b;
  }
  safetensors_cases();
  index_cases();
  return 0;
}
