/* test_hdf5.c: the HDF5 layer on its own.
 *  - the h5py + hdf5plugin fixture (tests/fixtures/hdf5/zstd.h5): every dataset's dtype,
 *    shape, chunks, filter and sha256 as zstd.expect.json says; every element range;
 *  - a round trip through the parallel writer (3-D, edge chunks, bf16 / f16 / bool / i64,
 *    empty and 0-dim datasets) filled by shuffled small extents on 4 threads, read back
 *    by range and by HDF5's own H5Dread (the registered filter);
 *  - malformed files, one per check of the chunk reader (zstd frames, sizes, filters, dtype);
 *  - an injected ENOSPC while writing chunks leaves no file behind;
 *  - compact datasets (zck_h5_write_opts.compact_bytes): small tensors stored in their
 *    object header read back exact (by range, and by HDF5's own H5Dread), larger ones stay
 *    zstd-chunked; one bit flipped in a compact dataset's bytes in the file (where the
 *    default file format has no checksum) is refused DAMAGED in one line naming the file
 *    and the dataset, by the checksum table;
 *  - a file filled batch by batch, each settled (zck_h5_writer_settle), reads back exact
 *    and checked, and a dataset left incomplete is still refused at the commit. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <hdf5.h>
#include <zstd.h>

#include "hdf5/zck_h5.h"
#include "io.h"
#include "sha256.h"
#include "ut_util.h"

static cJSON *load_json(const char *path) {
  unsigned char *d;
  size_t n;
  if (zt_read_file(path, &d, &n) != 0) ZT_FAIL("cannot read %s", path);
  d[n] = 0;
  cJSON *j = cJSON_Parse((char *)d);
  free(d);
  if (!j) ZT_FAIL("bad JSON %s", path);
  return j;
}

static void test_fixture(void) {
  char *path = zt_fixture("hdf5/zstd.h5"), *jp = zt_fixture("hdf5/zstd.expect.json");
  cJSON *exp = load_json(jp);
  zck_h5_file *f = NULL;
  ZT_OK(zck_h5_open(path, &f));
  char *s = NULL;
  ZT_OK(zck_h5_attr_str(f, "/", "format", &s));
  ZT_EQ_STR(s, "zckpt-fixture");
  free(s);
  int64_t v;
  ZT_OK(zck_h5_attr_i64(f, "/", "version", &v));
  ZT_EQ_INT(v, 1);
  ZT_ERR(zck_h5_attr_str(f, "/", "nope", &s), ZCK_ERR_NOT_FOUND, "nope");
  char **names;
  size_t nn;
  ZT_OK(zck_h5_list(f, "/", &names, &nn));
  ZT_EQ_INT(nn, 6);   /* bf16 f32 grp i64 raw_chunked scalar */
  for (size_t i = 0; i < nn; i++) free(names[i]);
  free(names);
  cJSON *ds;
  size_t count = 0;
  cJSON_ArrayForEach(ds, cJSON_GetObjectItem(exp, "datasets")) {
    char p[256];
    snprintf(p, sizeof p, "/%s", ds->string);
    zck_h5_dataset *d = NULL;
    ZT_OK(zck_h5_dataset_open(f, p, &d));
    const zck_h5_dataset_info *di = zck_h5_dataset_info_of(d);
    cJSON *shape = cJSON_GetObjectItem(ds, "shape"), *chunks = cJSON_GetObjectItem(ds, "chunks");
    ZT_EQ_INT(di->ndim, cJSON_GetArraySize(shape));
    for (int k = 0; k < di->ndim; k++) ZT_EQ_INT(di->shape[k], cJSON_GetArrayItem(shape, k)->valueint);
    ZT_EQ_INT(di->chunked, cJSON_IsArray(chunks));
    for (int k = 0; di->chunked && k < di->ndim; k++) ZT_EQ_INT(di->chunk[k], cJSON_GetArrayItem(chunks, k)->valueint);
    cJSON *filters = cJSON_GetObjectItem(ds, "filters");
    ZT_EQ_INT(di->zstd, cJSON_GetArraySize(filters) > 0);
    if (di->zstd) {
      cJSON *f0 = cJSON_GetArrayItem(filters, 0);
      ZT_EQ_INT(di->zstd_flags, cJSON_GetObjectItem(f0, "flags")->valueint);
      ZT_EQ_INT(di->zstd_level, cJSON_GetArrayItem(cJSON_GetObjectItem(f0, "cd_values"), 0)->valueint);
    }
    if (!strcmp(ds->string, "bf16")) ZT_EQ_INT(di->dtype, ZCK_BF16);
    if (!strcmp(ds->string, "f32")) ZT_EQ_INT(di->dtype, ZCK_F32);
    if (!strcmp(ds->string, "i64")) ZT_EQ_INT(di->dtype, ZCK_I64);
    if (!strcmp(ds->string, "grp/nested")) ZT_EQ_INT(di->dtype, ZCK_I8);
    if (!strcmp(ds->string, "scalar")) ZT_EQ_INT(di->dtype, ZCK_F64);
    size_t es = zck_dtype_size(di->dtype);
    uint8_t *all = malloc(di->numel * es + 1), *part = malloc(di->numel * es + 1);
    ZT_OK(zck_h5_dataset_read(d, all, 0, di->numel));
    char hex[65];
    zt_sha256_hex(all, di->numel * es, hex);
    ZT_EQ_STR(hex, cJSON_GetObjectItem(ds, "sha256")->valuestring);
    for (uint64_t a = 0; a < di->numel; a++)
      for (uint64_t b = a + 1; b <= di->numel; b++) {
        memset(part, 0xAB, di->numel * es);
        ZT_OK(zck_h5_dataset_read(d, part, a, b - a));
        if (memcmp(part, all + a * es, (b - a) * es)) ZT_FAIL("%s: range [%llu, %llu)", p, (unsigned long long)a, (unsigned long long)b);
      }
    ZT_ERR(zck_h5_dataset_read(d, part, di->numel, 1), ZCK_ERR_INVALID_ARG, "outside");
    free(all);
    free(part);
    zck_h5_dataset_close(d);
    count++;
  }
  ZT_EQ_INT(count, 6);
  zck_h5_dataset *d = NULL;
  ZT_ERR(zck_h5_dataset_open(f, "/missing", &d), ZCK_ERR_NOT_FOUND, "no dataset");
  ZT_ERR(zck_h5_dataset_open(f, "/grp/missing/x", &d), ZCK_ERR_NOT_FOUND, "no dataset");
  zck_h5_close(f);
  zck_h5u *u = NULL;
  ZT_ERR(zck_h5u_open(path, &u), ZCK_ERR_FORMAT, "not a zckpt universal container");
  cJSON_Delete(exp);
  free(path);
  free(jp);
}

// ---- round trip

typedef struct { const char *path; zck_dtype dt; int nd; int64_t shape[4]; } rt_ds;

static const rt_ds rt[] = {
  {"/a/b/f32_3d", ZCK_F32, 3, {5, 7, 3}}, {"/x/bf16", ZCK_BF16, 1, {13}},   {"/x/i64", ZCK_I64, 3, {4, 1, 6}},
  {"/x/bool", ZCK_BOOL, 1, {9}},          {"/x/empty", ZCK_F32, 2, {0, 4}}, {"/x/scalar", ZCK_F64, 0, {0}},
  {"/x/f16", ZCK_F16, 2, {3, 3}},         {"/x/big", ZCK_F32, 1, {1000}},   {"/x/wide", ZCK_F32, 2, {2, 25}},
};
#define N_RT (sizeof rt / sizeof rt[0])

static uint64_t numel_of(const rt_ds *d) {
  uint64_t n = 1;
  for (int i = 0; i < d->nd; i++) n *= (uint64_t)d->shape[i];
  return n;
}

static void test_round_trip(const char *tmp) {
  char path[4096];
  snprintf(path, sizeof path, "%s/rt.h5", tmp);
  zck_h5_write_opts o = ZCK_H5_WRITE_OPTS_INIT;
  o.chunk_bytes = 40;
  o.level = 5;
  zck_h5_writer *w = NULL;
  ZT_OK(zck_h5_writer_create(path, &o, &w));
  zck_store dst[N_RT], src[N_RT];
  uint8_t *data[N_RT];
  zck_extent ext[4096];
  size_t ne = 0;
  srand(7);
  for (size_t i = 0; i < N_RT; i++) {
    ZT_OK(zck_h5_writer_dataset(w, rt[i].path, rt[i].dt, rt[i].nd, rt[i].shape, &dst[i]));
    uint64_t n = numel_of(&rt[i]);
    size_t es = zck_dtype_size(rt[i].dt);
    data[i] = malloc(n * es + 1);
    for (uint64_t b = 0; b < n * es; b++) data[i][b] = (uint8_t)rand();
    if (rt[i].dt == ZCK_BOOL) for (uint64_t b = 0; b < n; b++) data[i][b] &= 1;
    src[i] = zck_store_memory(data[i], rt[i].dt, n, "mem");
    for (uint64_t a = 0; a < n;) {   /* pieces of 1..9 elements, in random order below */
      uint64_t c = 1 + (uint64_t)rand() % 9;
      if (c > n - a) c = n - a;
      ext[ne++] = (zck_extent){(uint32_t)i, (uint32_t)i, 0, a, a, c, 0, 0, 0};
      a += c;
    }
  }
  for (size_t i = ne; i > 1; i--) {
    size_t j = (size_t)rand() % i;
    zck_extent t = ext[i - 1];
    ext[i - 1] = ext[j];
    ext[j] = t;
  }
  ZT_OK(zck_h5_writer_attr_str(w, "/", "note", "héllo"));
  ZT_OK(zck_h5_writer_attr_i64(w, "/a", "n", -5));
  ZT_OK(zck_h5_writer_attr_f64(w, "/x/big", "x", 0.25));
  ZT_ERR(zck_h5_writer_attr_i64(w, "/nope", "n", 1), ZCK_ERR_NOT_FOUND, "no such object");
  zck_plan *plan = NULL;
  ZT_OK(zck_plan_from_extents(ext, ne, N_RT, N_RT, &plan));
  zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
  eo.threads = 4;
  eo.staging_bytes = 64;
  ZT_OK(zck_exec_run(&(zck_exec_job){plan, src, dst, NULL}, 1, &eo));
  zck_plan_free(plan);
  ZT_OK(zck_h5_writer_commit(w));
  zck_h5_writer_free(w);

  zck_h5_file *f = NULL;
  ZT_OK(zck_h5_open(path, &f));
  char *s = NULL;
  ZT_OK(zck_h5_attr_str(f, "/", "note", &s));
  ZT_EQ_STR(s, "héllo");
  free(s);
  int64_t iv;
  double dv;
  ZT_OK(zck_h5_attr_i64(f, "/a", "n", &iv));
  ZT_EQ_INT(iv, -5);
  ZT_OK(zck_h5_attr_f64(f, "/x/big", "x", &dv));
  ZT_ASSERT(dv == 0.25);
  ZT_ERR(zck_h5_attr_i64(f, "/", "note", &iv), ZCK_ERR_FORMAT, "not a number");
  for (size_t i = 0; i < N_RT; i++) {
    zck_h5_dataset *d = NULL;
    ZT_OK(zck_h5_dataset_open(f, rt[i].path, &d));
    const zck_h5_dataset_info *di = zck_h5_dataset_info_of(d);
    uint64_t n = numel_of(&rt[i]);
    size_t es = zck_dtype_size(rt[i].dt);
    ZT_EQ_INT(di->dtype, rt[i].dt);
    ZT_EQ_INT(di->ndim, rt[i].nd);
    ZT_EQ_U64(di->numel, n);
    ZT_EQ_INT(di->chunked, rt[i].nd > 0 && n > 0);
    if (di->chunked) {
      ZT_ASSERT(di->zstd && di->zstd_level == 5 && di->zstd_flags == H5Z_FLAG_MANDATORY);
      uint64_t ce = 1;
      for (int k = 0; k < di->ndim; k++) ce *= (uint64_t)di->chunk[k];
      ZT_ASSERT(ce * es <= 40 || ce == 1);
    }
    uint8_t *got = malloc(n * es + 1);
    for (uint64_t a = 0; a < n; a += 1 + n / 40)
      for (uint64_t b = a + 1; b <= n; b += 1 + n / 30) {
        ZT_OK(zck_h5_dataset_read(d, got, a, b - a));
        if (memcmp(got, data[i] + a * es, (b - a) * es)) ZT_FAIL("%s: [%llu, %llu)", rt[i].path, (unsigned long long)a, (unsigned long long)b);
      }
    /* HDF5's own read, through the registered filter */
    if (n) {
      zck_store st = zck_h5_dataset_store(d);
      ZT_EQ_U64(st.numel, n);
      hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), ds = H5Dopen2(file, rt[i].path, H5P_DEFAULT);
      hid_t t = H5Dget_type(ds);
      memset(got, 0, n * es);
      ZT_ASSERT(H5Dread(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0);
      ZT_ASSERT(!memcmp(got, data[i], n * es));
      H5Tclose(t);
      H5Dclose(ds);
      H5Fclose(file);
    }
    free(got);
    free(data[i]);
    zck_h5_dataset_close(d);
  }
  zck_h5_close(f);
  /* exists without overwrite; overwrite replaces */
  ZT_ERR(zck_h5_writer_create(path, NULL, &w), ZCK_ERR_EXISTS, "exists");
}

// ---- malformed files

typedef enum { M_NO_SIZE, M_TWO_FRAMES, M_SHORT, M_DEFLATE, M_DEFLATE_OPT, M_RAW_SKIPPED, M_RAW_WRONG_SIZE, M_FIXED_ATTR, M_BAD_ATTR,
               M_NO_CHECKSUM, M_BAD_CHECKSUM } mal;

static void make_bad(const char *path, mal kind) {
  float vals[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hsize_t dims[1] = {8}, chunk[1] = {8};
  hid_t sp = H5Screate_simple(1, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, 1, chunk);
  unsigned level = 3;
  unsigned one = 1;
  if (kind == M_DEFLATE) H5Pset_filter(dcpl, H5Z_FILTER_DEFLATE, H5Z_FLAG_MANDATORY, 1, &one);
  else if (kind == M_DEFLATE_OPT) H5Pset_deflate(dcpl, 1);   /* HDF5 makes deflate optional */
  else H5Pset_filter(dcpl, ZCK_H5_ZSTD_FILTER, kind == M_RAW_SKIPPED || kind == M_RAW_WRONG_SIZE ? H5Z_FLAG_OPTIONAL : 0, 1, &level);
  hid_t type = kind == M_FIXED_ATTR ? H5T_STD_U16LE : H5T_IEEE_F32LE;
  hid_t d = H5Dcreate2(f, "/d", type, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ZT_ASSERT(d >= 0);
  uint8_t buf[256];
  size_t n = 0;
  uint32_t mask = 0;
  ZSTD_CCtx *cc = ZSTD_createCCtx();
  switch (kind) {
  case M_NO_SIZE:
    ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
    n = ZSTD_compress2(cc, buf, sizeof buf, vals, sizeof vals);
    break;
  case M_TWO_FRAMES:
    n = ZSTD_compress(buf, sizeof buf, vals, 16, 3);
    n += ZSTD_compress(buf + n, sizeof buf - n, vals + 4, 16, 3);
    break;
  case M_SHORT: n = ZSTD_compress(buf, sizeof buf, vals, 16, 3); break;
  case M_NO_CHECKSUM:   /* as zckpt wrote chunks before the checksums, and h5py may */
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 0);
    n = ZSTD_compress2(cc, buf, sizeof buf, vals, sizeof vals);
    break;
  case M_BAD_CHECKSUM:  /* a frame with its checksum, one bit of the 4-byte sum flipped */
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    n = ZSTD_compress2(cc, buf, sizeof buf, vals, sizeof vals);
    buf[n - 2] ^= 0x10;
    break;
  case M_RAW_SKIPPED: memcpy(buf, vals, 32); n = 32; mask = 1; break;
  case M_RAW_WRONG_SIZE: memcpy(buf, vals, 16); n = 16; mask = 1; break;
  default: n = ZSTD_compress(buf, sizeof buf, vals, kind == M_FIXED_ATTR ? 16 : 32, 3); break;
  }
  ZSTD_freeCCtx(cc);
  hsize_t off[1] = {0};
  if (kind == M_DEFLATE || kind == M_DEFLATE_OPT) ZT_ASSERT(H5Dwrite(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, vals) >= 0);
  else ZT_ASSERT(H5Dwrite_chunk(d, H5P_DEFAULT, mask, off, n, buf) >= 0);
  if (kind == M_FIXED_ATTR || kind == M_BAD_ATTR) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, kind == M_FIXED_ATTR ? 12 : H5T_VARIABLE);
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    hid_t as = H5Screate(H5S_SCALAR), a = H5Acreate2(d, "dtype", t, as, H5P_DEFAULT, H5P_DEFAULT);
    const char *v = "bfloat16";
    char fixed[12] = "bfloat16";
    ZT_ASSERT(H5Awrite(a, t, kind == M_FIXED_ATTR ? (const void *)fixed : (const void *)&v) >= 0);
    H5Aclose(a);
    H5Sclose(as);
    H5Tclose(t);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(sp);
  H5Fclose(f);
}

static zck_status read_bad(const char *path, void *out) {
  zck_h5_file *f = NULL;
  ZT_OK(zck_h5_open(path, &f));
  zck_h5_dataset *d = NULL;
  zck_status st = zck_h5_dataset_open(f, "/d", &d);
  if (st == ZCK_OK) st = zck_h5_dataset_read(d, out, 0, 8);
  zck_h5_dataset_close(d);
  zck_h5_close(f);
  return st;
}

static void test_malformed(const char *tmp) {
  char p[4096];
  float got[8], want[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  /* initialise HDF5 the way the library does (silent errors, the zstd filter) */
  zck_h5_file *f0 = NULL;
  char *fx = zt_fixture("hdf5/zstd.h5");
  ZT_OK(zck_h5_open(fx, &f0));
  zck_h5_close(f0);
  free(fx);
  struct { mal k; zck_status st; const char *needle; } cases[] = {
    {M_NO_SIZE, ZCK_ERR_FORMAT, "does not record its content size"},
    {M_TWO_FRAMES, ZCK_ERR_FORMAT, "bytes after the first zstd frame"},
    {M_SHORT, ZCK_ERR_FORMAT, "content size 16, expected 32 bytes"},
    {M_DEFLATE, ZCK_ERR_UNSUPPORTED, "mandatory filter 1 (deflate) not supported"},
    {M_DEFLATE_OPT, ZCK_ERR_UNSUPPORTED, "filter 1 applied; only zstd (32015) is supported"},
    {M_RAW_SKIPPED, ZCK_OK, NULL},
    {M_RAW_WRONG_SIZE, ZCK_ERR_FORMAT, "16 stored bytes, expected 32"},
    {M_BAD_ATTR, ZCK_ERR_FORMAT, "does not match the stored"},
    {M_NO_CHECKSUM, ZCK_OK, NULL},
    {M_BAD_CHECKSUM, ZCK_ERR_DAMAGED, ":/d: chunk [0]: damaged: its data does not match the chunk's zstd checksum"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(p, sizeof p, "%s/bad%zu.h5", tmp, i);
    make_bad(p, cases[i].k);
    if (cases[i].st == ZCK_OK) {
      ZT_OK(read_bad(p, got));
      ZT_ASSERT(!memcmp(got, want, sizeof want));
    } else {
      ZT_ERR(read_bad(p, got), cases[i].st, cases[i].needle);
      ZT_ASSERT(strstr(zck_last_error(), p));   /* names the file */
    }
  }
  /* a fixed-length NULLPAD dtype attribute is read like a variable-length one */
  snprintf(p, sizeof p, "%s/fixed.h5", tmp);
  make_bad(p, M_FIXED_ATTR);
  zck_h5_file *f = NULL;
  ZT_OK(zck_h5_open(p, &f));
  zck_h5_dataset *d = NULL;
  ZT_OK(zck_h5_dataset_open(f, "/d", &d));
  ZT_EQ_INT(zck_h5_dataset_info_of(d)->dtype, ZCK_BF16);
  zck_h5_dataset_close(d);
  zck_h5_close(f);
  /* links: a second hard link is the same dataset; a soft link is listed, never followed,
   * nor is data kept in an external file (the reader follows only what the forked metadata
   * check walked: hard links inside the file) */
  snprintf(p, sizeof p, "%s/links.h5", tmp);
  make_bad(p, M_NO_CHECKSUM);
  {
    hid_t h = H5Fopen(p, H5F_ACC_RDWR, H5P_DEFAULT);
    ZT_ASSERT(H5Lcreate_hard(h, "/d", h, "/g_hard", H5P_DEFAULT, H5P_DEFAULT) >= 0);
    ZT_ASSERT(H5Lcreate_soft("/d", h, "/soft", H5P_DEFAULT, H5P_DEFAULT) >= 0);
    hsize_t dims[1] = {8};
    hid_t sp = H5Screate_simple(1, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
    ZT_ASSERT(H5Pset_external(dcpl, "links.raw", 0, 32) >= 0);
    hid_t e = H5Dcreate2(h, "/ext", H5T_IEEE_F32LE, sp, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    ZT_ASSERT(e >= 0);
    H5Dclose(e);
    H5Pclose(dcpl);
    H5Sclose(sp);
    H5Fclose(h);
  }
  ZT_OK(zck_h5_open(p, &f));
  char **names = NULL;
  size_t nn = 0;
  ZT_OK(zck_h5_list(f, "/", &names, &nn));
  ZT_EQ_U64(nn, 4);
  ZT_EQ_STR(names[0], "d");
  ZT_EQ_STR(names[3], "soft");
  for (size_t i = 0; i < nn; i++) free(names[i]);
  free(names);
  ZT_OK(zck_h5_dataset_open(f, "/g_hard", &d));
  memset(got, 0, sizeof got);
  ZT_OK(zck_h5_dataset_read(d, got, 0, 8));
  ZT_ASSERT(!memcmp(got, want, sizeof want));
  zck_h5_dataset_close(d);
  ZT_ASSERT(zck_h5_exists(f, "/soft"));
  ZT_ERR(zck_h5_dataset_open(f, "/soft", &d), ZCK_ERR_UNSUPPORTED, "links.h5:/soft: a soft or external link (not followed)");
  ZT_ERR(zck_h5_dataset_open(f, "/ext", &d), ZCK_ERR_UNSUPPORTED, "links.h5:/ext: data stored in external files is not supported");
  ZT_ERR(zck_h5_dataset_open(f, "/nothing", &d), ZCK_ERR_NOT_FOUND, "links.h5:/nothing: no dataset");
  zck_h5_close(f);
  /* not HDF5 at all; missing */
  snprintf(p, sizeof p, "%s/not.h5", tmp);
  zt_write_file(p, "hello, this is not hdf5", 23);
  ZT_ERR(zck_h5_open(p, &f), ZCK_ERR_FORMAT, "not an HDF5 file");
  snprintf(p, sizeof p, "%s/missing.h5", tmp);
  ZT_ERR(zck_h5_open(p, &f), ZCK_ERR_NOT_FOUND, "missing.h5");
}

// ---- faults

static void test_enospc(const char *tmp) {
  char dir[4096], path[4096];
  snprintf(dir, sizeof dir, "%s/fault", tmp);
  mkdir(dir, 0755);
  snprintf(path, sizeof path, "%s/f.h5", dir);
  for (int nth = 1; nth <= 3; nth++) {
    zck_h5_write_opts o = ZCK_H5_WRITE_OPTS_INIT;
    o.chunk_bytes = 16;
    zck_h5_writer *w = NULL;
    ZT_OK(zck_h5_writer_create(path, &o, &w));
    float v[40];
    for (int i = 0; i < 40; i++) v[i] = (float)i;
    int64_t shape[1] = {40};
    zck_store dst, src = zck_store_memory(v, ZCK_F32, 40, "mem");
    ZT_OK(zck_h5_writer_dataset(w, "/v", ZCK_F32, 1, shape, &dst));
    zck_extent e = {0, 0, 0, 0, 0, 40, 0, 0, 0};
    zck_plan *plan = NULL;
    ZT_OK(zck_plan_from_extents(&e, 1, 1, 1, &plan));
    zck__io_fault_set(ZCK_IO_OP_WRITE, (uint64_t)nth, ENOSPC);
    ZT_ERR(zck_exec_plan(plan, &src, &dst, NULL, NULL), ZCK_ERR_NO_SPACE, "f.h5:/v");
    zck__io_fault_set(ZCK_IO_OP_WRITE, 0, 0);
    ZT_ERR(zck_h5_writer_commit(w), ZCK_ERR_INTERNAL, "chunks written");
    zck_h5_writer_free(w);
    zck_plan_free(plan);
    DIR *dd = opendir(dir);
    struct dirent *de;
    while ((de = readdir(dd)))
      if (de->d_name[0] != '.' || (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")))
        ZT_FAIL("left behind: %s", de->d_name);
    closedir(dd);
  }
}

static void test_compact(const char *tmp) {
  char path[4096];
  snprintf(path, sizeof path, "%s/compact.h5", tmp);
  zck_h5_write_opts o = ZCK_H5_WRITE_OPTS_INIT;
  o.compact_bytes = 16 << 10;
  zck_h5_writer *w = NULL;
  ZT_OK(zck_h5_writer_create(path, &o, &w));
  /* small: 2 x 12 floats whose bytes occur nowhere else in the file; big: 8k floats */
  enum { NS = 24, NB = 8192 };
  float small[NS], *big = malloc(NB * sizeof *big);
  for (int i = 0; i < NS; i++) small[i] = 1000.5f + 3.25f * (float)i;
  for (int i = 0; i < NB; i++) big[i] = (float)(i % 97);
  int64_t ss[2] = {2, 12}, sb[1] = {NB};
  zck_store s, b;
  ZT_OK(zck_h5_writer_dataset(w, "/p/small", ZCK_F32, 2, ss, &s));
  ZT_OK(zck_h5_writer_dataset(w, "/p/big", ZCK_F32, 1, sb, &b));
  ZT_OK(s.write(s.ctx, small + 5, 5, NS - 5));
  ZT_OK(s.write(s.ctx, small, 0, 5));
  ZT_OK(b.write(b.ctx, big, 0, NB));
  ZT_OK(zck_h5_writer_commit(w));
  zck_h5_writer_free(w);

  hid_t file = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  const char *names[2] = {"/p/small", "/p/big"};
  const float *want[2] = {small, big};
  int n[2] = {NS, NB};
  for (int i = 0; i < 2; i++) {
    hid_t ds = H5Dopen2(file, names[i], H5P_DEFAULT), pl = H5Dget_create_plist(ds);
    ZT_EQ_INT(H5Pget_layout(pl), i == 0 ? H5D_COMPACT : H5D_CHUNKED);
    float *got = calloc((size_t)n[i], sizeof *got);
    ZT_ASSERT(H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0);
    ZT_ASSERT(!memcmp(got, want[i], (size_t)n[i] * sizeof *got));
    free(got);
    H5Pclose(pl);
    H5Dclose(ds);
  }
  H5Fclose(file);
  zck_h5_file *f = NULL;
  ZT_OK(zck_h5_open(path, &f));
  zck_h5_dataset *d = NULL;
  ZT_OK(zck_h5_dataset_open(f, "/p/small", &d));
  ZT_ASSERT(!zck_h5_dataset_info_of(d)->chunked && !zck_h5_dataset_info_of(d)->zstd);
  float got[NS];
  for (int a = 0; a < NS; a++)
    for (int e = a + 1; e <= NS; e++) {
      memset(got, 0, sizeof got);
      ZT_OK(zck_h5_dataset_read(d, got, (uint64_t)a, (uint64_t)(e - a)));
      ZT_ASSERT(!memcmp(got, small + a, (size_t)(e - a) * sizeof *got));
    }
  zck_h5_dataset_close(d);
  zck_h5_close(f);

  /* one bit of small[7] flipped where the file holds it */
  unsigned char *bytes;
  size_t len;
  ZT_ASSERT(zt_read_file(path, &bytes, &len) == 0);
  unsigned char *at = memmem(bytes, len, small, sizeof small);
  ZT_ASSERT(at && !memmem(at + 1, len - (size_t)(at + 1 - bytes), small, sizeof small));
  at[7 * sizeof(float) + 1] ^= 0x10;
  ZT_ASSERT(zt_write_file(path, bytes, len) == 0);
  free(bytes);
  ZT_OK(zck_h5_open(path, &f));
  ZT_OK(zck_h5_dataset_open(f, "/p/small", &d));
  ZT_ERR(zck_h5_dataset_read(d, got, 7, 1), ZCK_ERR_DAMAGED, "damaged");
  const char *m = zck_last_error();
  if (!strstr(m, path) || !strstr(m, "/p/small") || strchr(m, '\n')) ZT_FAIL("not one line naming the file and dataset: %s", m);
  ZT_ERR(zck_h5_dataset_read(d, got, 0, NS), ZCK_ERR_DAMAGED, "damaged");
  zck_h5_dataset_close(d);
  ZT_OK(zck_h5_dataset_open(f, "/p/big", &d));
  float *gb = malloc(NB * sizeof *gb);
  ZT_OK(zck_h5_dataset_read(d, gb, 0, NB));
  ZT_ASSERT(!memcmp(gb, big, NB * sizeof *gb));
  free(gb);
  zck_h5_dataset_close(d);
  zck_h5_close(f);
  free(big);
}

/* A file filled batch by batch (zck_h5_writer_settle after each, as to-universal does):
 * settled datasets, compact, chunked and in groups an earlier batch made, read back exact
 * and through the checksum table; a dataset not yet complete stays for the commit, which
 * refuses it. */
static void test_settle(const char *tmp) {
  char path[4096];
  snprintf(path, sizeof path, "%s/settle.h5", tmp);
  enum { NB = 100 };
  float v[3][NB];
  for (int k = 0; k < 3; k++)
    for (int i = 0; i < NB; i++) v[k][i] = (float)(k * 1000 + i) + 0.5f;
  static const char *const names[3] = {"/p/a/x", "/p/b/x", "/p/a/y"};   /* /p/a again in batch 2 */
  const int64_t small[1] = {4}, big[1] = {NB};
  for (int partial = 0; partial < 2; partial++) {
    zck_h5_write_opts o = ZCK_H5_WRITE_OPTS_INIT;
    o.compact_bytes = 16;       /* 4 floats: compact; 100: chunked */
    o.chunk_bytes = 64;
    o.overwrite = true;
    zck_h5_writer *w = NULL;
    ZT_OK(zck_h5_writer_create(path, &o, &w));
    for (int k = 0; k < 3; k++) {
      zck_store s, t;
      char sp[64];
      snprintf(sp, sizeof sp, "%s_small", names[k]);
      ZT_OK(zck_h5_writer_dataset(w, names[k], ZCK_F32, 1, big, &s));
      ZT_OK(zck_h5_writer_dataset(w, sp, ZCK_F32, 1, small, &t));
      ZT_OK(s.write(s.ctx, v[k], 0, partial && k == 2 ? NB / 2 : NB));
      ZT_OK(t.write(t.ctx, v[k], 0, 4));
      if (k != 1) ZT_OK(zck_h5_writer_settle(w));   /* batches {0, 1} and {2} */
    }
    if (partial) {
      ZT_ERR(zck_h5_writer_commit(w), ZCK_ERR_INTERNAL, "/p/a/y: 3 of 7 chunks written");
      zck_h5_writer_free(w);
      continue;
    }
    ZT_OK(zck_h5_writer_commit(w));
    zck_h5_writer_free(w);
    zck_h5_file *f = NULL;
    ZT_OK(zck_h5_open(path, &f));
    for (int k = 0; k < 3; k++)
      for (int sm = 0; sm < 2; sm++) {
        char sp[64];
        snprintf(sp, sizeof sp, "%s%s", names[k], sm ? "_small" : "");
        zck_h5_dataset *d = NULL;
        ZT_OK(zck_h5_dataset_open(f, sp, &d));
        float got[NB];
        uint64_t n = sm ? 4 : NB;
        ZT_EQ_U64(zck_h5_dataset_info_of(d)->numel, n);
        ZT_OK(zck_h5_dataset_read(d, got, 0, n));   /* each piece found in the table */
        ZT_ASSERT(!memcmp(got, v[k], n * sizeof *got));
        zck_h5_dataset_close(d);
      }
    zck_h5_close(f);
  }
}

int main(void) {
  char *tmp = zt_tmpdir();
  test_fixture();
  test_round_trip(tmp);
  test_malformed(tmp);
  test_enospc(tmp);
  test_compact(tmp);
  test_settle(tmp);
  free(tmp);
  return 0;
}
