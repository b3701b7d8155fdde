/* test_manifest.c: zckpt-manifest.json: the hashing engine against one-shot hashes (ranges
 * across buffer and chunk boundaries), JSON round trip (byte-identical, deterministic),
 * writing a directory's manifest and reading it back, comparison, one malformed manifest
 * per check, and the completeness protocol. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

#include "manifest.h"
#include "test.h"
#include "zck.h"

static void write_bytes(const char *path, const uint8_t *data, size_t n) {
  if (zt_write_file(path, data, n) != 0) ZT_FAIL("cannot write %s", path);
}

static char *join(const char *a, const char *b) {
  char *p = NULL;
  if (asprintf(&p, "%s/%s", a, b) < 0) abort();
  return p;
}

/* Ranges crossing buffer and chunk boundaries, overlapping, empty, past the end. */
static void test_hash_engine(const char *tmp) {
  enum { N = 10007 };
  uint8_t *data = malloc(N);
  for (size_t i = 0; i < N; i++) data[i] = (uint8_t)(i * 131 + (i >> 7));
  char *path = join(tmp, "engine.bin");
  write_bytes(path, data, N);
  zck__hash_range r[] = {
    {0, N, ZCK__HASH_XXH3 | ZCK__HASH_CRC32, 0, 0, false},
    {5, 10, ZCK__HASH_XXH3, 0, 0, false},            /* inside one buffer */
    {60, 200, ZCK__HASH_XXH3 | ZCK__HASH_CRC32, 0, 0, false}, /* across buffers */
    {100, 3000, ZCK__HASH_XXH3, 0, 0, false},        /* overlaps the previous one */
    {4096, 0, ZCK__HASH_XXH3, 0, 0, false},          /* empty */
    {N, 0, ZCK__HASH_XXH3, 0, 0, false},             /* empty at the end */
    {N - 10, 20, ZCK__HASH_XXH3, 0, 0, false},       /* passes the end */
    {N + 5, 1, ZCK__HASH_XXH3, 0, 0, false},         /* beyond the end */
    {1000, 9000, ZCK__HASH_CRC32, 0, 0, false},
  };
  size_t nr = sizeof r / sizeof r[0];
  for (int pass = 0; pass < 2; pass++) {
    zck__hash_file f;
    memset(&f, 0, sizeof f);
    f.path = path;
    f.chunk_size = 1000;
    f.ranges = r;
    f.n_ranges = nr;
    zck_manifest_hash_opts o = ZCK_MANIFEST_HASH_OPTS_INIT;
    o.staging_bytes = pass ? 64 : 0; /* tiny buffers: every range crosses several */
    o.threads = 2;
    ZT_OK(zck__hash_files(&f, 1, &o));
    ZT_ASSERT(f.ok);
    ZT_EQ_U64(f.size, N);
    ZT_EQ_U64(f.xxh3, XXH3_64bits(data, N));
    ZT_EQ_U64(f.n_chunks, 11);
    for (size_t k = 0; k < f.n_chunks; k++) {
      size_t len = k == 10 ? N - 10000 : 1000;
      ZT_EQ_U64(f.chunks[k], XXH3_64bits(data + k * 1000, len));
    }
    for (size_t i = 0; i < nr; i++) {
      bool inside = r[i].off + r[i].len <= N;
      ZT_EQ_INT(r[i].done, inside);
      if (!inside) continue;
      if (r[i].want & ZCK__HASH_XXH3) ZT_EQ_U64(r[i].xxh3, XXH3_64bits(data + r[i].off, r[i].len));
      if (r[i].want & ZCK__HASH_CRC32) ZT_EQ_U64(r[i].crc32, crc32(0, data + r[i].off, (uInt)r[i].len));
    }
    zck__hash_file_clear(&f);
  }
  /* a file that cannot be read: kept going, the error recorded */
  zck__hash_file two[2];
  memset(two, 0, sizeof two);
  char *missing = join(tmp, "no-such-file");
  two[0].path = path;
  two[1].path = missing;
  zck_manifest_hash_opts o = ZCK_MANIFEST_HASH_OPTS_INIT;
  o.keep_going = true;
  ZT_OK(zck__hash_files(two, 2, &o));
  ZT_ASSERT(two[0].ok && !two[1].ok);
  ZT_ASSERT(two[1].error && strstr(two[1].error, "no-such-file"));
  zck__hash_file_clear(&two[0]);
  zck__hash_file_clear(&two[1]);
  o.keep_going = false;
  ZT_ERR(zck__hash_files(two, 2, &o), ZCK_ERR_NOT_FOUND, "no-such-file");
  zck__hash_file_clear(&two[0]);
  zck__hash_file_clear(&two[1]);
  free(missing);
  free(path);
  free(data);
}

static size_t count_diffs(const zck_manifest *e, const zck_manifest *a) {
  return zck_manifest_compare(e, a, NULL, 0, NULL, NULL);
}

typedef struct diff_log {
  zck_manifest_diff_kind kinds[64];
  char msgs[64][512];
  size_t n;
} diff_log;

static void log_diff(void *ctx, const zck_manifest_diff *d) {
  diff_log *l = ctx;
  if (l->n < 64) {
    l->kinds[l->n] = d->kind;
    snprintf(l->msgs[l->n], sizeof l->msgs[0], "%s", d->message);
    l->n++;
  }
}

static bool has_diff(const diff_log *l, zck_manifest_diff_kind k, const char *needle) {
  for (size_t i = 0; i < l->n; i++)
    if (l->kinds[i] == k && (!needle || strstr(l->msgs[i], needle))) return true;
  return false;
}

/* A DeepSpeed fixture copied, described, written, read back, compared, damaged. */
static void test_dir_round_trip(const char *tmp) {
  char *src = zt_fixture("deepspeed/s2w2_bf16/ckpt/global_step2");
  struct stat sb;
  if (stat(src, &sb) != 0) { fprintf(stderr, "note: %s missing, round trip skipped\n", src); free(src); return; }
  char *dir = join(tmp, "rt");
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", src, dir);
  ZT_ASSERT(system(cmd) == 0);
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.chunk_size = 4096; /* several chunks per file */
  ZT_OK(zck_manifest_write_dir(dir, &mo));
  zck_manifest *m = NULL;
  ZT_OK(zck_manifest_read(dir, &m));
  ZT_EQ_INT(m->kind, ZCK_MANIFEST_DEEPSPEED);
  ZT_ASSERT(m->has_layout);
  ZT_EQ_INT(m->layout.stage, 2);
  ZT_EQ_INT(m->layout.world_size, 2);
  ZT_EQ_STR(m->layout.lp_dtype, "bfloat16");
  ZT_EQ_STR(m->layout.tag, "rt"); /* the tag is the folder's name */
  ZT_EQ_U64(m->n_files, 3);
  ZT_EQ_STR(m->files[0].path, "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt");
  ZT_EQ_U64(m->chunk_size, 4096);
  ZT_ASSERT(m->files[0].n_chunks == 3);
  ZT_ASSERT(m->n_tensors > 10);
  /* the file hash is XXH3-64 of the whole file, as xxhsum -H3 computes it */
  char *f0 = join(dir, m->files[0].path);
  unsigned char *bytes = NULL;
  size_t n = 0;
  ZT_ASSERT(zt_read_file(f0, &bytes, &n) == 0);
  ZT_EQ_U64(m->files[0].xxh3, XXH3_64bits(bytes, n));
  ZT_EQ_U64(m->files[0].size, n);
  bool found = false;
  for (size_t i = 0; i < m->n_tensors; i++) {
    const zck_manifest_tensor *t = &m->tensors[i];
    if (t->file != 0 || strcmp(t->name, "optimizer_state_dict.single_partition_of_fp32_groups.0")) continue;
    found = true;
    ZT_EQ_STR(t->dtype, "float32");
    ZT_EQ_INT(t->ndim, 1);
    ZT_EQ_U64(t->nbytes, (uint64_t)t->shape[0] * 4);
    ZT_EQ_U64(t->xxh3, XXH3_64bits(bytes + t->offset, t->nbytes));
  }
  ZT_ASSERT(found);

  /* JSON: deterministic and byte-identical through parse + print */
  char *text1 = NULL, *text2 = NULL;
  size_t len1 = 0, len2 = 0;
  ZT_OK(zck_manifest_to_json(m, &text1, &len1));
  zck_manifest *m2 = NULL;
  ZT_OK(zck_manifest_parse("x", text1, len1, &m2));
  ZT_OK(zck_manifest_to_json(m2, &text2, &len2));
  ZT_EQ_U64(len1, len2);
  ZT_EQ_MEM(text1, text2, len1);
  char *mpath = join(dir, ZCK_MANIFEST_NAME);
  unsigned char *on_disk = NULL;
  size_t on_disk_n = 0;
  ZT_ASSERT(zt_read_file(mpath, &on_disk, &on_disk_n) == 0);
  ZT_EQ_U64(on_disk_n, len1);
  ZT_EQ_MEM(on_disk, text1, len1);
  ZT_EQ_U64(count_diffs(m, m2), 0);

  /* rehash what is on disk: equal; then damage one byte of a tensor */
  zck_manifest *a = NULL;
  ZT_OK(zck_manifest_clone_unhashed(m, &a));
  ZT_OK(zck_manifest_hash(dir, a, NULL));
  ZT_EQ_U64(count_diffs(m, a), 0);
  zck_manifest_free(a);
  const zck_manifest_tensor *victim = NULL;
  for (size_t i = 0; i < m->n_tensors && !victim; i++)
    if (m->tensors[i].file == 0 && m->tensors[i].nbytes > 64 && m->tensors[i].offset > 4096) victim = &m->tensors[i];
  ZT_ASSERT(victim);
  bytes[victim->offset + 17] ^= 0x40;
  write_bytes(f0, bytes, n);
  ZT_OK(zck_manifest_clone_unhashed(m, &a));
  ZT_OK(zck_manifest_hash(dir, a, NULL));
  diff_log log;
  memset(&log, 0, sizeof log);
  size_t nd = zck_manifest_compare(m, a, dir, 0, log_diff, &log);
  ZT_ASSERT(nd >= 3);
  ZT_ASSERT(has_diff(&log, ZCK_MDIFF_TENSOR_HASH, victim->name));
  ZT_ASSERT(has_diff(&log, ZCK_MDIFF_FILE_HASH, m->files[0].path));
  char range[64];
  uint64_t chunk = (victim->offset + 17) / 4096 * 4096;
  snprintf(range, sizeof range, "bytes %llu..", (unsigned long long)chunk);
  ZT_ASSERT(has_diff(&log, ZCK_MDIFF_CHUNK, range));
  for (size_t i = 0; i < log.n; i++) ZT_ASSERT(strstr(log.msgs[i], dir));
  zck_manifest_free(a);

  /* truncation, deletion, an extra file */
  ZT_ASSERT(truncate(f0, (off_t)(n / 2)) == 0);
  char *f1 = join(dir, m->files[1].path);
  ZT_ASSERT(unlink(f1) == 0);
  char *extra = join(dir, "stray.txt");
  write_bytes(extra, (const uint8_t *)"x", 1);
  ZT_OK(zck_manifest_clone_unhashed(m, &a));
  a->files[1].missing = true;
  size_t ia;
  ZT_OK(zck_manifest_add_file(a, "stray.txt", &ia));
  zck_manifest_hash_opts ho = ZCK_MANIFEST_HASH_OPTS_INIT;
  ho.keep_going = true;
  ZT_OK(zck_manifest_hash(dir, a, &ho));
  memset(&log, 0, sizeof log);
  zck_manifest_compare(m, a, NULL, 0, log_diff, &log);
  ZT_ASSERT(has_diff(&log, ZCK_MDIFF_SIZE, "truncated"));
  ZT_ASSERT(has_diff(&log, ZCK_MDIFF_TENSOR_UNREADABLE, "pass the end"));
  ZT_ASSERT(has_diff(&log, ZCK_MDIFF_MISSING_FILE, m->files[1].path));
  ZT_ASSERT(has_diff(&log, ZCK_MDIFF_EXTRA_FILE, "stray.txt"));
  zck_manifest_free(a);

  /* completeness: sizes no longer match */
  ZT_ERR(zck_manifest_check_complete(dir, 0), ZCK_ERR_DAMAGED, m->files[0].path);
  ZT_OK(zck_manifest_check_complete(dir, 1));

  free(text1);
  free(text2);
  free(on_disk);
  free(bytes);
  free(f0);
  free(f1);
  free(extra);
  free(mpath);
  zck_manifest_free(m);
  zck_manifest_free(m2);
  free(dir);
  free(src);
}

/* One malformed manifest per rule; each a one-line FORMAT error naming the field. */
static void test_malformed(void) {
  static const char *ok_head = "{\"format\": \"zckpt-manifest\", \"format_version\": 1, \"tool\": \"zckpt\", "
                               "\"version\": \"0.1.0\", \"kind\": \"other\", \"chunk_size\": 4, ";
  static const struct { const char *tail; zck_status st; const char *needle; } cases[] = {
    {"\"files\": []}", ZCK_OK, NULL},
    {"\"files\": [}", ZCK_ERR_FORMAT, "not valid JSON"},
    {"\"files\": []} x", ZCK_ERR_FORMAT, "bytes after the JSON"},
    {"\"tensors\": []}", ZCK_ERR_FORMAT, "\"files\" missing"},
    {"\"files\": {}}", ZCK_ERR_FORMAT, "\"files\" missing or not an array"},
    {"\"files\": [{\"path\": \"a\", \"size\": -1, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "files[0].size"},
    {"\"files\": [{\"path\": \"a\", \"size\": 1.5, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "files[0].size"},
    {"\"files\": [{\"path\": \"a\", \"size\": 1e300, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "files[0].size"},
    {"\"files\": [{\"path\": \"a\", \"size\": 1, \"xxh3\": \"00000000000000\"}]}", ZCK_ERR_FORMAT, "files[0].xxh3"},
    {"\"files\": [{\"path\": \"a\", \"size\": 1, \"xxh3\": \"000000000000000g\"}]}", ZCK_ERR_FORMAT, "files[0].xxh3"},
    {"\"files\": [{\"path\": \"a\", \"size\": 1}]}", ZCK_ERR_FORMAT, "\"xxh3\" missing"},
    {"\"files\": [{\"path\": \"../a\", \"size\": 1, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "unsafe file path"},
    {"\"files\": [{\"path\": \"/etc/passwd\", \"size\": 1, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "unsafe"},
    {"\"files\": [{\"path\": \"a//b\", \"size\": 1, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "unsafe"},
    {"\"files\": [{\"path\": \"a\\\\b\", \"size\": 1, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "unsafe"},
    {"\"files\": [{\"path\": \"a\", \"size\": 1, \"xxh3\": \"0000000000000000\"}, "
     "{\"path\": \"a\", \"size\": 1, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "listed twice"},
    {"\"files\": [{\"path\": \"a\", \"path\": \"b\", \"size\": 1, \"xxh3\": \"0000000000000000\"}]}", ZCK_ERR_FORMAT, "appears twice"},
    {"\"files\": [{\"path\": \"a\", \"size\": 9, \"xxh3\": \"0000000000000000\", \"chunks\": [\"0000000000000000\"]}]}",
     ZCK_ERR_FORMAT, "files[0].chunks: 1 hashes"},
    {"\"files\": [{\"path\": \"a\", \"size\": 5, \"xxh3\": \"0000000000000000\", \"chunks\": [\"0000000000000000\", 3]}]}",
     ZCK_ERR_FORMAT, "files[0].chunks[1]"},
    {"\"files\": [{\"path\": \"a\", \"size\": 8, \"xxh3\": \"0000000000000000\"}], \"tensors\": "
     "[{\"file\": \"b\", \"name\": \"t\", \"dtype\": \"float32\", \"shape\": [1], \"offset\": 0, \"nbytes\": 4, \"xxh3\": \"0000000000000000\"}]}",
     ZCK_ERR_FORMAT, "tensors[0].file"},
    {"\"files\": [{\"path\": \"a\", \"size\": 8, \"xxh3\": \"0000000000000000\"}], \"tensors\": "
     "[{\"file\": \"a\", \"name\": \"t\", \"dtype\": \"float32\", \"shape\": [1], \"offset\": 6, \"nbytes\": 4, \"xxh3\": \"0000000000000000\"}]}",
     ZCK_ERR_FORMAT, "pass the end of a"},
    {"\"files\": [{\"path\": \"a\", \"size\": 8, \"xxh3\": \"0000000000000000\"}], \"tensors\": "
     "[{\"file\": \"a\", \"name\": \"t\", \"dtype\": \"float32\", \"shape\": [-1], \"offset\": 0, \"nbytes\": 4, \"xxh3\": \"0000000000000000\"}]}",
     ZCK_ERR_FORMAT, "tensors[0].shape[0]"},
    {"\"files\": [{\"path\": \"a\", \"size\": 8, \"xxh3\": \"0000000000000000\"}], \"tensors\": "
     "[{\"file\": \"a\", \"name\": \"t\", \"dtype\": \"\", \"shape\": [1], \"offset\": 0, \"nbytes\": 4, \"xxh3\": \"0000000000000000\"}]}",
     ZCK_ERR_FORMAT, "tensors[0].dtype"},
    {"\"files\": [{\"path\": \"a\", \"size\": 8, \"xxh3\": \"0000000000000000\"}], \"tensors\": "
     "[{\"file\": \"a\", \"name\": 3, \"dtype\": \"f\", \"shape\": [1], \"offset\": 0, \"nbytes\": 4, \"xxh3\": \"0000000000000000\"}]}",
     ZCK_ERR_FORMAT, "tensors[0].name: not a string"},
    {"\"layout\": {\"stage\": 7, \"world_size\": 1, \"groups\": 1}, \"files\": []}", ZCK_ERR_FORMAT, "layout.stage"},
    {"\"layout\": {\"stage\": 1, \"world_size\": 0, \"groups\": 1}, \"files\": []}", ZCK_ERR_FORMAT, "layout.world_size"},
    {"\"layout\": {\"stage\": 1, \"world_size\": 1, \"groups\": 1, \"bf16_prefix\": 1}, \"files\": []}", ZCK_ERR_FORMAT, "bf16_prefix"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[2048];
    snprintf(text, sizeof text, "%s%s", ok_head, cases[i].tail);
    zck_manifest *m = NULL;
    zck_status st = zck_manifest_parse("M.json", text, strlen(text), &m);
    if (st != cases[i].st) ZT_FAIL("case %zu: expected %s, got %s (%s)", i, zck_status_name(cases[i].st), zck_status_name(st), zck_last_error());
    if (cases[i].needle) {
      if (!strstr(zck_last_error(), cases[i].needle)) ZT_FAIL("case %zu: \"%s\" lacks \"%s\"", i, zck_last_error(), cases[i].needle);
      ZT_ASSERT(!strncmp(zck_last_error(), "M.json: ", 8));
      ZT_ASSERT(!strchr(zck_last_error(), '\n'));
    }
    ZT_ASSERT((st == ZCK_OK) == (m != NULL));
    zck_manifest_free(m);
  }
  static const struct { const char *text; zck_status st; const char *needle; } heads[] = {
    {"[]", ZCK_ERR_FORMAT, "not a JSON object"},
    {"", ZCK_ERR_FORMAT, "not valid JSON"},
    {"{\"format\": \"other\"}", ZCK_ERR_FORMAT, "not \"zckpt-manifest\""},
    {"{\"format\": \"zckpt-manifest\", \"format_version\": 2, \"files\": []}", ZCK_ERR_UNSUPPORTED, "newer zckpt"},
    {"{\"format\": \"zckpt-manifest\", \"format_version\": 1, \"tool\": \"t\", \"version\": \"v\", \"kind\": \"weird\", \"files\": []}",
     ZCK_ERR_FORMAT, "kind \"weird\""},
  };
  for (size_t i = 0; i < sizeof heads / sizeof heads[0]; i++) {
    zck_manifest *m = NULL;
    ZT_ERR(zck_manifest_parse("M.json", heads[i].text, strlen(heads[i].text), &m), heads[i].st, heads[i].needle);
    ZT_ASSERT(!m);
  }
}

/* The tensor table read without a tree (manifest_tensors.c) against the cJSON tree: the
 * writer's own text and plain variants are read by it, to the same manifest; what it does
 * not read (escapes, other number spellings, unknown keys) the tree still does. */
static char *json_of(const char *text, bool plain) {
  zck_manifest *m = NULL;
  if (plain) ZT_OK(zck__manifest_parse_plain("P.json", text, strlen(text), &m));
  else ZT_OK(zck__manifest_parse_tree("T.json", text, strlen(text), &m));
  char *out = NULL;
  ZT_OK(zck_manifest_to_json(m, &out, NULL));
  zck_manifest_free(m);
  return out;
}

static void test_plain_reader(void) {
  zck_manifest *m = NULL;
  ZT_OK(zck_manifest_new(&m));
  size_t fa, fb;
  ZT_OK(zck_manifest_add_file(m, "a.pt", &fa));
  ZT_OK(zck_manifest_add_file(m, "sub/b.pt", &fb));
  m->files[fa].size = 4096;
  m->files[fb].size = (uint64_t)1 << 52;
  m->files[fa].hashed = m->files[fb].hashed = true;
  m->files[fb].xxh3 = 0xfedcba9876543210ull;
  size_t fc; /* a file hashed in three chunks */
  ZT_OK(zck_manifest_add_file(m, "c.pt", &fc));
  m->files[fc].size = 3 * m->chunk_size - 1;
  m->files[fc].hashed = true;
  m->files[fc].n_chunks = 3;
  ZT_ASSERT((m->files[fc].chunks = malloc(3 * sizeof *m->files[fc].chunks)));
  for (size_t k = 0; k < 3; k++) m->files[fc].chunks[k] = 0x1111111111111111ull * (k + 1);
  int64_t s3[3] = {2, 0, 7}, s1[1] = {9007199254740991};
  ZT_OK(zck_manifest_add_tensor(m, fa, "module.w", "bfloat16", 3, s3, 64, 0, NULL));
  ZT_OK(zck_manifest_add_tensor(m, fa, "", "float32", 0, NULL, 0, 4, NULL));
  ZT_OK(zck_manifest_add_tensor(m, fb, "opt.\xc3\xa9t\xc3\xa9", "F8_E4M3", 1, s1, ((uint64_t)1 << 52) - 8, 8, NULL));
  ZT_OK(zck_manifest_add_tensor(m, fa, "module.b", "bfloat16", 1, s1, 4000, 96, NULL));
  for (size_t i = 0; i < m->n_tensors; i++) {
    m->tensors[i].hashed = true;
    m->tensors[i].xxh3 = 0x0123456789abcdefull * (i + 1);
  }
  char *text = NULL;
  ZT_OK(zck_manifest_to_json(m, &text, NULL));
  zck_manifest_free(m);
  char *a = json_of(text, true), *b = json_of(text, false);
  ZT_EQ_STR(a, text);
  ZT_EQ_STR(b, text);
  free(a);
  free(b);

  /* one tensor respelled: (from, to, whether the plain reader still reads it) */
  static const struct { const char *from, *to; bool plain; } edits[] = {
    {"{\"file\": \"a.pt\", \"name\": \"module.b\"", "{\"name\":\"module.b\" ,\r\n\t\"file\":\"a.pt\"", true},
    {"\"offset\": 4000, \"nbytes\": 96, \"xxh3\": \"", "\"xxh3\" : \"", true}, /* hex case below */
    {"\"name\": \"module.b\"", "\"name\": \"module\\u002eb\"", false},
    {"\"offset\": 4000", "\"offset\": 4e3", false},
    {"\"offset\": 4000", "\"offset\": 04000", false},
    {"\"offset\": 0,", "\"offset\": -0,", false},
    {"\"nbytes\": 96", "\"nbytes\": 96, \"note\": null", false},
    {"\"tensors\"", "\"tensor\\u0073\"", false},
    /* the files table (manifest_tensors.c reads it too) */
    {"{\"path\": \"a.pt\", \"size\": 4096", "{ \"size\":4096 ,\r\n\t\"path\":\"a.pt\"", true},
    {"\"path\": \"a.pt\"", "\"path\": \"a\\u002ept\"", false},
    {"\"size\": 4096", "\"size\": 4096, \"note\": 1", false},
    {"\"files\"", "\"file\\u0073\"", false},
    {"\"chunks\": [", "\"chunks\" : [ ", true},
  };
  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    const char *at = strstr(text, edits[i].from);
    ZT_ASSERT(at);
    char *v = NULL;
    if (i == 1) { /* the xxh3 moved before offset and nbytes, in capitals */
      const char *hex = at + strlen(edits[i].from);
      char up[17];
      for (int k = 0; k < 16; k++) up[k] = (char)toupper((unsigned char)hex[k]);
      up[16] = 0;
      ZT_ASSERT(asprintf(&v, "%.*s\"xxh3\": \"%s\", \"offset\": 4000, \"nbytes\": 96%s", (int)(at - text), text, up,
                         hex + 17) > 0);
    } else {
      ZT_ASSERT(asprintf(&v, "%.*s%s%s", (int)(at - text), text, edits[i].to, at + strlen(edits[i].from)) > 0);
    }
    zck_manifest *p = NULL;
    zck_status st = zck__manifest_parse_plain("P.json", v, strlen(v), &p);
    if ((st == ZCK_OK) != edits[i].plain) ZT_FAIL("edit %zu: plain reader %s: %s", i, zck_status_name(st), v);
    zck_manifest_free(p);
    char *t = json_of(v, false);
    if (edits[i].plain) {
      char *q = json_of(v, true);
      ZT_EQ_STR(q, t);
      free(q);
    }
    ZT_OK(zck_manifest_parse("M.json", v, strlen(v), &p)); /* either way, read */
    char *w = NULL;
    ZT_OK(zck_manifest_to_json(p, &w, NULL));
    ZT_EQ_STR(w, t);
    if (i < 3) ZT_EQ_STR(w, text); /* a respelling of the same manifest */
    free(w);
    free(t);
    zck_manifest_free(p);
    free(v);
  }
  free(text);
}

static void test_completeness(const char *tmp) {
  char *dir = join(tmp, "complete");
  ZT_ASSERT(mkdir(dir, 0755) == 0);
  char *f = join(dir, "a.bin");
  write_bytes(f, (const uint8_t *)"hello", 5);
  ZT_OK(zck_manifest_check_complete(dir, 0)); /* not written by zckpt: nothing to check */
  ZT_OK(zck_manifest_mark_partial(dir));
  ZT_ERR(zck_manifest_check_complete(dir, 0), ZCK_ERR_DAMAGED, "incomplete checkpoint");
  ZT_OK(zck_manifest_check_complete(dir, 1));
  /* the listing leaves out the marker, the manifest and temporaries */
  char *tmpf = join(dir, ".x.zck-tmp-123");
  write_bytes(tmpf, (const uint8_t *)"t", 1);
  char **paths = NULL;
  size_t n = 0;
  ZT_OK(zck_manifest_list_files(dir, &paths, &n));
  ZT_EQ_U64(n, 1);
  ZT_EQ_STR(paths[0], "a.bin");
  zck_manifest_free_paths(paths, n);
  unlink(tmpf);
  ZT_OK(zck_manifest_write_dir(dir, NULL));
  char *marker = join(dir, ZCK_MANIFEST_PARTIAL_NAME);
  ZT_ASSERT(access(marker, F_OK) != 0); /* removed by the manifest write */
  ZT_OK(zck_manifest_check_complete(dir, 0));
  zck_manifest *m = NULL;
  ZT_OK(zck_manifest_read(dir, &m));
  ZT_EQ_INT(m->kind, ZCK_MANIFEST_TORCH); /* a .bin: torch by name, though not a zip */
  ZT_EQ_U64(m->n_files, 1);
  ZT_EQ_U64(m->n_tensors, 0);
  ZT_EQ_U64(m->files[0].xxh3, XXH3_64bits("hello", 5));
  zck_manifest_free(m);
  /* a malformed manifest: a clear error, unless forced */
  char *mp = join(dir, ZCK_MANIFEST_NAME);
  write_bytes(mp, (const uint8_t *)"{\"format\": ", 11);
  ZT_ERR(zck_manifest_check_complete(dir, 0), ZCK_ERR_FORMAT, "malformed manifest");
  ZT_OK(zck_manifest_check_complete(dir, 1));
  ZT_ERR(zck_manifest_read(dir, &m), ZCK_ERR_FORMAT, ZCK_MANIFEST_NAME ": malformed manifest: not valid JSON");
  ZT_ERR(zck_manifest_read(tmp, &m), ZCK_ERR_NOT_FOUND, "no " ZCK_MANIFEST_NAME);
  free(mp);
  free(marker);
  free(tmpf);
  free(f);
  free(dir);
}

int main(void) {
  char *tmp = zt_tmpdir();
  test_hash_engine(tmp);
  test_malformed();
  test_plain_reader();
  test_completeness(tmp);
  test_dir_round_trip(tmp);
  free(tmp);
  printf("ok\n");
  return 0;
}
