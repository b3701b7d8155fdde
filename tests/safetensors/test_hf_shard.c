/* test_hf_shard.c: Hugging Face sharding. Size strings as huggingface_hub parses them; shard
 * boundaries (exact limit, a tensor over the limit, many small tensors, zero-size tensors)
 * against hand-computed answers and against a line-by-line transcription of
 * split_state_dict_into_shards_factory; the sharded writer's files, index text (both styles,
 * non-ASCII names), reading back, and atomicity (abandon, injected failure, overwrite). */
#include "test.h"
#include "safetensors/safetensors.h"
#include "st_test_util.h"

#include <dirent.h>
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

static int dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

static void size_ok(const char *s, uint64_t want) {
  uint64_t v = 0;
  ZT_OK(zck_parse_size(s, &v));
  if (v != want) ZT_FAIL("parse_size(\"%s\") = %llu, expected %llu", s, (unsigned long long)v, (unsigned long long)want);
}

/* split_state_dict_into_shards_factory, transcribed: shard_list of lists of indices. */
static size_t reference_split(const uint64_t *sizes, size_t n, uint64_t max, uint32_t *shard_of) {
  size_t nshards = 0;
  uint64_t current_size = 0;
  size_t *current = malloc((n + 1) * sizeof *current), ncur = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t tensor_size = sizes[i];
    if (tensor_size > max) { shard_of[i] = (uint32_t)nshards++; continue; }
    if (current_size + tensor_size > max) {
      for (size_t k = 0; k < ncur; k++) shard_of[current[k]] = (uint32_t)nshards;
      nshards++;
      ncur = 0;
      current_size = 0;
    }
    current[ncur++] = i;
    current_size += tensor_size;
  }
  if (ncur > 0) {
    for (size_t k = 0; k < ncur; k++) shard_of[current[k]] = (uint32_t)nshards;
    nshards++;
  }
  free(current);
  return nshards;
}

static void expect_split(const uint64_t *sizes, size_t n, uint64_t max, const uint32_t *want, size_t want_n, int line) {
  uint32_t got[64];
  size_t ns = 99;
  zck_hf_assign_shards(sizes, n, max, got, &ns);
  if (ns != want_n) ZT_FAIL("line %d: %zu shards, expected %zu", line, ns, want_n);
  for (size_t i = 0; i < n; i++)
    if (got[i] != want[i]) ZT_FAIL("line %d: tensor %zu in shard %u, expected %u", line, i, got[i], want[i]);
}
#define SPLIT(max, nshards, ...)                                                                    \
  do {                                                                                              \
    const uint64_t sz_[] = {__VA_ARGS__};                                                           \
    expect_split(sz_, sizeof sz_ / sizeof *sz_, max, want_, nshards, __LINE__);                     \
  } while (0)

static void test_sizes(void) {
  size_ok("5GB", 5000000000ull);
  size_ok("5gb", 5000000000ull);
  size_ok("5Gb", 5000000000ull);       /* huggingface_hub upper-cases the unit */
  size_ok(" 10MB ", 10000000ull);
  size_ok("10 MB", 10000000ull);
  size_ok("1KB", 1000);
  size_ok("2TB", 2000000000000ull);
  size_ok("1.5GB", 1500000000ull);
  size_ok("1.1GB", 1100000000ull);
  size_ok("1.005KB", 1004);           /* int(1.005 * 1000) truncates 1004.9999999999999 */
  size_ok("1e3KB", 1000000);
  size_ok("4.35GB", 4350000000ull);
  size_ok("1GiB", 1073741824ull);
  size_ok("3MiB", 3145728ull);
  size_ok("2kib", 2048);
  size_ok("12345", 12345);
  size_ok(" 5 gb ", 5000000000ull);    /* blanks and case, as huggingface_hub strips and upper-cases */
  size_ok("5G", 5000000000ull);        /* the command-line short forms */
  size_ok("2TiB", 2199023255552ull);
  size_ok("1.5k", 1500);
  size_ok("7B", 7);
  uint64_t v;
  ZT_ERR(zck_parse_size("5XB", &v), ZCK_ERR_INVALID_ARG, "cannot read it");
  ZT_ERR(zck_parse_size("GB", &v), ZCK_ERR_INVALID_ARG, "cannot read it");
  ZT_ERR(zck_parse_size("-1GB", &v), ZCK_ERR_INVALID_ARG, "cannot read it");
  ZT_ERR(zck_parse_size("0x10KB", &v), ZCK_ERR_INVALID_ARG, "cannot read it");
  ZT_ERR(zck_parse_size("infGB", &v), ZCK_ERR_INVALID_ARG, "cannot read it");
  ZT_ERR(zck_parse_size("99999999999TB", &v), ZCK_ERR_INVALID_ARG, "too large");
  ZT_ERR(zck_parse_size("", &v), ZCK_ERR_INVALID_ARG, "cannot read it");
  ZT_ERR(zck_parse_size("5 GBs", &v), ZCK_ERR_INVALID_ARG, "cannot read it");
  ZT_ERR(zck_parse_size("1e400GB", &v), ZCK_ERR_INVALID_ARG, "cannot read it");
}

static void test_split(void) {
  uint32_t want_[64];
#define WANT(...) do { const uint32_t w_[] = {__VA_ARGS__}; memcpy(want_, w_, sizeof w_); } while (0)
  /* exactly the limit fits (the test is current + size > max) */
  WANT(0, 0); SPLIT(1000, 1, 500, 500);
  WANT(0, 1); SPLIT(1000, 2, 500, 501);
  WANT(0); SPLIT(1000, 1, 1000);
  WANT(0, 1); SPLIT(1000, 2, 1000, 1);
  WANT(0, 0, 0); SPLIT(1000, 1, 1000, 0, 0);     /* zero-size tensors ride along */
  /* bigger than the limit: its own shard, appended at once; the open shard keeps filling */
  WANT(1, 0, 1, 2); SPLIT(1000, 3, 400, 1200, 400, 300);
  WANT(0, 1, 2); SPLIT(1000, 3, 1001, 1001, 1001);
  WANT(2, 0, 1, 2, 3); SPLIT(1000, 4, 600, 2000, 5000, 300, 900);
  /* the hub_sharded fixture: a, b, big, c, d, e */
  WANT(1, 1, 0, 1, 2, 2); SPLIT(1000, 3, 400, 400, 1200, 100, 480, 80);
  /* huggingface_hub's docstring: [6, 6, 2, 6, 2, 2] GB at 10 GB -> [6], [6+2], [6+2+2] */
  WANT(0, 1, 1, 2, 2, 2); SPLIT(10, 3, 6, 6, 2, 6, 2, 2);
  /* huge limits do not overflow */
  WANT(0, 0); SPLIT(UINT64_MAX, 1, UINT64_MAX - 1, 1);
  WANT(0, 1); SPLIT(UINT64_MAX, 2, UINT64_MAX, 1);
  /* nothing */
  size_t ns = 7;
  zck_hf_assign_shards(NULL, 0, 1000, NULL, &ns);
  ZT_EQ_U64(ns, 0);

  /* many small tensors: 1000 x 7 bytes at 100 -> 14 per shard, 72 shards */
  uint64_t sizes[1000];
  uint32_t got[1000], ref[1000];
  for (int i = 0; i < 1000; i++) sizes[i] = 7;
  zck_hf_assign_shards(sizes, 1000, 100, got, &ns);
  ZT_EQ_U64(ns, 72);
  for (int i = 0; i < 1000; i++) ZT_EQ_INT(got[i], i / 14);

  /* random sizes against the transcription */
  uint64_t rng = 88172645463325252ull;
  for (int round = 0; round < 2000; round++) {
    size_t n = (size_t)(rng % 60);
    uint64_t max = 1 + (rng >> 20) % 500;
    for (size_t i = 0; i < n; i++) {
      rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
      sizes[i] = rng % 8 == 0 ? 0 : rng % 11 == 0 ? max + rng % 100 : (rng >> 8) % (max + 1);
    }
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    size_t nr = reference_split(sizes, n, max, ref);
    zck_hf_assign_shards(sizes, n, max, got, &ns);
    ZT_EQ_U64(ns, nr);
    for (size_t i = 0; i < n; i++) ZT_EQ_INT(got[i], ref[i]);
  }
}

/* Writes tensors t0..t(n-1) (F32, sizes[i] bytes) and returns the index text (or NULL). */
static char *write_set(const char *out, const zck_hf_options *o, const char *const *names, const uint64_t *nbytes, size_t n,
                       const char *const *md) {
  zck_hf_writer *w;
  ZT_OK(zck_hf_writer_new(out, o, &w));
  for (const char *const *m = md; m && *m; m += 2) ZT_OK(zck_hf_writer_set_metadata(w, m[0], m[1]));
  for (size_t i = 0; i < n; i++) {
    uint64_t shape[1] = {nbytes[i] / 4};
    size_t idx;
    ZT_OK(zck_hf_writer_add(w, names[i], ZCK_ST_F32, 1, shape, &idx));
    ZT_EQ_U64(idx, i);
  }
  ZT_OK(zck_hf_writer_layout(w));
  for (size_t i = 0; i < n; i++) {
    uint8_t buf[4096];
    for (uint64_t k = 0; k < nbytes[i]; k++) buf[k] = (uint8_t)(i + k);
    if (i % 2) ZT_OK(zck_hf_writer_write(w, i, buf, 0, nbytes[i]));
    else { /* the copy executor's way: the slot's fd and offset */
      zck_hf_slot s = zck_hf_writer_slot(w, i);
      ZT_EQ_U64(s.nbytes, nbytes[i]);
      ZT_ASSERT(pwrite(s.fd, buf, nbytes[i], (off_t)s.offset) == (ssize_t)nbytes[i]);
    }
  }
  char *cfg = zck_hf_writer_extra_path(w, "config.json");
  ZT_ASSERT(zt_write_file(cfg, "{}", 2) == 0);
  free(cfg);
  if (!o || !o->overwrite) ZT_ASSERT(!exists(out)); /* nothing visible before the commit */
  ZT_OK(zck_hf_writer_commit(w));
  zck_hf_writer_free(w);
  char *ip = zck__path_join(out, "model.safetensors.index.json");
  char *text = st_slurp(ip, NULL);
  free(ip);
  return text;
}

static void check_read_back(const char *out, const char *const *names, const uint64_t *nbytes, size_t n) {
  zck_hf_checkpoint *c;
  ZT_OK(zck_hf_open(out, &c));
  ZT_EQ_U64(zck_hf_count(c), n);
  ZT_EQ_INT(zck_hf_warning_count(c), 0);
  for (size_t i = 0; i < n; i++) {
    const zck_hf_tensor *t = zck_hf_find(c, names[i]);
    ZT_ASSERT(t);
    ZT_EQ_U64(t->t->nbytes, nbytes[i]);
    uint8_t buf[4096];
    ZT_OK(zck_st_read(t->file, t->t, buf, 0, nbytes[i]));
    for (uint64_t k = 0; k < nbytes[i]; k++) ZT_EQ_INT(buf[k], (uint8_t)(i + k));
    ZT_EQ_STR(zck_st_metadata_get(t->file, "format"), "pt");
  }
  zck_hf_close(c);
}

static void test_writer(void) {
  char *tmp = zt_tmpdir();
  const char *names[] = {"a.weight", "b\xc3\xa9", "big", "c \"q\"", "d\xf0\x9f\x98\x80", "e"};
  const uint64_t nbytes[] = {400, 400, 1200, 100, 480, 80};
  const char *md[] = {"producer", "t\xc3\xa9st", NULL};
  zck_hf_options o = ZCK_HF_OPTIONS_INIT;
  o.max_shard_size = 1000;

  /* huggingface_hub style */
  char *out = zck__path_join(tmp, "hub");
  char *text = write_set(out, &o, names, nbytes, 6, md);
  const char *want_hub =
      "{\n  \"metadata\": {\n    \"total_size\": 2660,\n    \"producer\": \"t\\u00e9st\"\n  },\n  \"weight_map\": {\n"
      "    \"big\": \"model-00001-of-00003.safetensors\",\n"
      "    \"a.weight\": \"model-00002-of-00003.safetensors\",\n"
      "    \"b\\u00e9\": \"model-00002-of-00003.safetensors\",\n"
      "    \"c \\\"q\\\"\": \"model-00002-of-00003.safetensors\",\n"
      "    \"d\\ud83d\\ude00\": \"model-00003-of-00003.safetensors\",\n"
      "    \"e\": \"model-00003-of-00003.safetensors\"\n  }\n}";
  ZT_EQ_STR(text, want_hub);
  free(text);
  ZT_EQ_INT(dir_entries(out), 5); /* 3 shards, index, config.json */
  check_read_back(out, names, nbytes, 6);
  {
    char *p = zck__path_join(out, "model-00001-of-00003.safetensors");
    zck_st_file *f;
    ZT_OK(zck_st_open(p, &f));
    ZT_EQ_U64(zck_st_metadata_count(f), 1); /* user metadata goes to the index when sharded */
    zck_st_close(f);
    free(p);
  }

  /* transformers / DeepSpeed style: sort_keys and a final newline */
  o.style = ZCK_HF_INDEX_SORTED;
  o.with_total_parameters = true;
  o.total_parameters = 665;
  char *out2 = zck__path_join(tmp, "sorted");
  text = write_set(out2, &o, names, nbytes, 6, md);
  const char *want_sorted =
      "{\n  \"metadata\": {\n    \"producer\": \"t\\u00e9st\",\n    \"total_parameters\": 665,\n    \"total_size\": 2660\n  },\n"
      "  \"weight_map\": {\n"
      "    \"a.weight\": \"model-00002-of-00003.safetensors\",\n"
      "    \"big\": \"model-00001-of-00003.safetensors\",\n"
      "    \"b\\u00e9\": \"model-00002-of-00003.safetensors\",\n"
      "    \"c \\\"q\\\"\": \"model-00002-of-00003.safetensors\",\n"
      "    \"d\\ud83d\\ude00\": \"model-00003-of-00003.safetensors\",\n"
      "    \"e\": \"model-00003-of-00003.safetensors\"\n  }\n}\n";
  ZT_EQ_STR(text, want_sorted);
  free(text);
  check_read_back(out2, names, nbytes, 6);

  /* one shard: model.safetensors with the user metadata, no index */
  o = (zck_hf_options)ZCK_HF_OPTIONS_INIT;
  char *out3 = zck__path_join(tmp, "single");
  text = write_set(out3, &o, names, nbytes, 6, md);
  ZT_ASSERT(text == NULL);
  ZT_EQ_INT(dir_entries(out3), 2);
  {
    char *p = zck__path_join(out3, "model.safetensors");
    zck_st_file *f;
    ZT_OK(zck_st_open(p, &f));
    const char *k;
    zck_st_metadata_at(f, 0, &k, NULL);
    ZT_EQ_STR(k, "format");
    ZT_EQ_STR(zck_st_metadata_get(f, "producer"), "t\xc3\xa9st");
    zck_st_close(f);
    free(p);
  }
  check_read_back(out3, names, nbytes, 6);

  /* an existing non-empty directory: refused, or replaced with overwrite */
  zck_hf_writer *w;
  ZT_OK(zck_hf_writer_new(out3, NULL, &w));
  ZT_ERR(zck_hf_writer_layout(w), ZCK_ERR_EXISTS, "exists and is not empty");
  zck_hf_writer_free(w);
  o.overwrite = true;
  o.max_shard_size = 500;
  text = write_set(out3, &o, names, nbytes, 6, NULL);
  ZT_ASSERT(text != NULL);
  free(text);
  {
    char *p = zck__path_join(out3, "model.safetensors");
    ZT_ASSERT(!exists(p));
    free(p);
  }
  check_read_back(out3, names, nbytes, 6);

  /* no tensors: one empty model.safetensors */
  char *out4 = zck__path_join(tmp, "none");
  ZT_OK(zck_hf_writer_new(out4, NULL, &w));
  ZT_OK(zck_hf_writer_layout(w));
  ZT_EQ_U64(zck_hf_writer_shard_count(w), 1);
  ZT_EQ_STR(zck_hf_writer_shard_name(w, 0), "model.safetensors");
  ZT_OK(zck_hf_writer_commit(w));
  zck_hf_writer_free(w);
  check_read_back(out4, NULL, NULL, 0);

  /* abandoned, or failing at the index write or the final rename: nothing is left */
  char *clean = zt_tmpdir();
  char *out5 = zck__path_join(clean, "out");
  o = (zck_hf_options)ZCK_HF_OPTIONS_INIT;
  o.max_shard_size = 1000;
  for (int mode = 0; mode < 3; mode++) {
    ZT_OK(zck_hf_writer_new(out5, &o, &w));
    uint64_t shape[1] = {300};
    ZT_OK(zck_hf_writer_add(w, "x", ZCK_ST_F32, 1, shape, NULL));
    ZT_OK(zck_hf_writer_add(w, "y", ZCK_ST_F32, 1, shape, NULL));
    ZT_OK(zck_hf_writer_layout(w));
    ZT_EQ_INT(dir_entries(clean), 1); /* the temporary directory */
    if (mode == 1) {
      /* files inside the temporary directory are written in place (no rename each): the
       * index is the first file commit creates (the shards were made by layout) */
      zck__io_fault_set(ZCK_IO_OP_OPEN, 1, EIO);
      ZT_ERR(zck_hf_writer_commit(w), ZCK_ERR_IO, "model.safetensors.index.json");
    } else if (mode == 2) {
      zck__io_fault_set(ZCK_IO_OP_RENAME, 1, EIO); /* the directory, the only rename */
      ZT_ERR(zck_hf_writer_commit(w), ZCK_ERR_IO, "cannot rename output into place");
    }
    zck__io_fault_set(ZCK_IO_OP_OPEN, 0, 0);
    zck__io_fault_set(ZCK_IO_OP_RENAME, 0, 0);
    zck_hf_writer_free(w);
    ZT_EQ_INT(dir_entries(clean), 0);
  }

  /* misuse that is input, not a bug: computed keys, duplicate names, bad prefix */
  ZT_OK(zck_hf_writer_new(out5, NULL, &w));
  ZT_ERR(zck_hf_writer_set_metadata(w, "total_size", "1"), ZCK_ERR_INVALID_ARG, "computed");
  ZT_OK(zck_hf_writer_add(w, "x", ZCK_ST_U8, 0, NULL, NULL));
  ZT_ERR(zck_hf_writer_add(w, "x", ZCK_ST_U8, 0, NULL, NULL), ZCK_ERR_INVALID_ARG, "added twice");
  zck_hf_writer_free(w);
  o.prefix = "a/b";
  ZT_ERR(zck_hf_writer_new(out5, &o, &w), ZCK_ERR_INVALID_ARG, "prefix");
  ZT_EQ_INT(dir_entries(clean), 0);
  free(out5);
  free(clean);
  free(out); free(out2); free(out3); free(out4);
  free(tmp);
}

int main(void) {
  test_sizes();
  test_split();
  test_writer();
  return 0;
}
