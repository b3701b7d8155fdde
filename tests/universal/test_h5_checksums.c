/* test_h5_checksums.c: the HDF5 checksum table (formats/hdf5/h5_checksums.h) refuses data
 * that is valid HDF5 but not what was written there.
 *  - the writer alone, chunks of 64 bytes: every element range reads back; after one
 *    element is changed in place (through the zstd filter: valid frames, valid checksums)
 *    a range touching its piece fails naming the file, the dataset and the piece, the
 *    others still read; a table that does not match its root attribute, or is missing,
 *    fails the open;
 *  - a universal container (deepspeed/s3w2_bf16 with a side file): two params' fp32
 *    swapped by name, a param's fp32 and exp_avg swapped, one element changed in place, a
 *    dataset made again with other values, a frozen param's, a buffer's, /resume_state's
 *    and a side file's element changed, /resume_state or a side file deleted, a side file
 *    added, a dataset added at the root, in a param's group or among the buffers (new
 *    objects, in no job's way and not in the table): consolidate and reshard fail DAMAGED in one line naming the file and dataset
 *    and write nothing, verify says DAMAGED; the intact container passes all three; an
 *    edited config.json fails a consolidate into a folder (which copies it);
 *  - a version 2 container without its table is refused; one made to look as written
 *    before the table (version 1, no table) and the committed container of zckpt c9411c4
 *    still read, verify saying it checked structure only;
 *  - described (zck_h5u_describe, no param's group opened), the container gives the model
 *    its open gives; a lazy file answers about what lies below /params as an eager one;
 *    describing still refuses a dataset deleted or added, a param's group missing; a
 *    part_dtypes attribute its datasets contradict is refused by the open and consolidate
 *    (one line naming the dataset), while describing reports what it says. */
#include <sys/stat.h>
#include <unistd.h>

#include "h5_edit.h"
#include "zck.h"

static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[8192];
  snprintf(cmd, sizeof cmd, fmt, a, b);
  if (system(cmd) != 0) ZT_FAIL("%s failed", cmd);
}

static bool exists(const char *p) {
  struct stat sb;
  return lstat(p, &sb) == 0;
}

static void one_line_naming(const char *file, const char *what) {
  const char *m = zck_last_error();
  if (!strstr(m, file) || (what && !strstr(m, what)) || strchr(m, '\n'))
    ZT_FAIL("message \"%s\" is not one line naming %s and %s", m, file, what ? what : "-");
}

// ---- the writer alone

static void test_writer(const char *tmp) {
  char path[4096];
  snprintf(path, sizeof path, "%s/w.h5", tmp);
  zck_h5_write_opts wo = ZCK_H5_WRITE_OPTS_INIT;
  wo.chunk_bytes = 64;   /* 16 floats: pieces of one row [.][.][3] * 5 */
  zck_h5_writer *w = NULL;
  ZT_OK(zck_h5_writer_create(path, &wo, &w));
  int64_t shape[3] = {4, 7, 3};
  enum { N = 4 * 7 * 3 };
  float v[N];
  for (int i = 0; i < N; i++) v[i] = (float)i * 0.5f;
  zck_store s, e, z;
  ZT_OK(zck_h5_writer_dataset(w, "/g/t", ZCK_F32, 3, shape, &s));
  /* written back to front in odd pieces */
  for (int at = N; at > 0; at -= 11) {
    int from = at > 11 ? at - 11 : 0;
    ZT_OK(s.write(s.ctx, v + from, (uint64_t)from, (uint64_t)(at - from)));
  }
  int64_t empty[2] = {0, 3};
  ZT_OK(zck_h5_writer_dataset(w, "/e", ZCK_BF16, 2, empty, &e));
  ZT_OK(zck_h5_writer_dataset(w, "/z", ZCK_I64, 0, NULL, &z));
  int64_t seven = 7;
  ZT_OK(z.write(z.ctx, &seven, 0, 1));
  ZT_OK(zck_h5_writer_commit(w));
  zck_h5_writer_free(w);

  zck_h5_file *f = NULL;
  ZT_OK(zck_h5_open(path, &f));
  ZT_ASSERT(zck_h5_has_checksums(f));
  zck_h5_dataset *d = NULL, *dz = NULL;
  ZT_OK(zck_h5_dataset_open(f, "/g/t", &d));
  ZT_OK(zck_h5_dataset_open(f, "/z", &dz));
  int64_t got7 = 0;
  ZT_OK(zck_h5_dataset_read(dz, &got7, 0, 1));
  ZT_EQ_INT(got7, 7);
  float got[N];
  for (int a = 0; a < N; a++)
    for (int b = a + 1; b <= N; b += 5) {
      memset(got, 0, sizeof got);
      ZT_OK(zck_h5_dataset_read(d, got, (uint64_t)a, (uint64_t)(b - a)));
      ZT_EQ_MEM(got, v + a, (size_t)(b - a) * sizeof *got);
    }
  zck_h5_dataset_close(d);
  zck_h5_dataset_close(dz);
  zck_h5_close(f);

  /* element 40 (row [1][6]: elements [39, +3) of the pieces [1][5..6]) changed in place */
  char bad[4096];
  snprintf(bad, sizeof bad, "%s/wbad.h5", tmp);
  sh("cp '%s' '%s'", path, bad);
  hid_t h = h5e_open(bad);
  h5e_poke(h, "/g/t", 40);
  H5Fclose(h);
  ZT_OK(zck_h5_open(bad, &f));
  ZT_OK(zck_h5_dataset_open(f, "/g/t", &d));
  ZT_OK(zck_h5_dataset_read(d, got, 0, 36));            /* pieces before it */
  ZT_OK(zck_h5_dataset_read(d, got, 42, N - 42));       /* and after: [2][0] on */
  ZT_ERR(zck_h5_dataset_read(d, got, 41, 1), ZCK_ERR_DAMAGED, "/g/t: damaged: elements [36, +6)");
  one_line_naming(bad, "/g/t");
  ZT_ERR(zck_h5_dataset_read(d, got, 0, N), ZCK_ERR_DAMAGED, "not in the file's checksum table");
  zck_h5_dataset_close(d);
  zck_h5_close(f);

  /* the table's own checks */
  sh("cp '%s' '%s'", path, bad);
  h = h5e_open(bad);
  h5e_poke(h, ZCK__H5C_TABLE, 1);
  H5Fclose(h);
  ZT_ERR(zck_h5_open(bad, &f), ZCK_ERR_DAMAGED, "the checksum table does not match its " ZCK__H5C_TABLE_ATTR);
  one_line_naming(bad, ZCK__H5C_TABLE);
  sh("cp '%s' '%s'", path, bad);
  h = h5e_open(bad);
  ZT_ASSERT(H5Ldelete(h, ZCK__H5C_TABLE, H5P_DEFAULT) >= 0);
  H5Fclose(h);
  ZT_ERR(zck_h5_open(bad, &f), ZCK_ERR_DAMAGED, "records a checksum table");
}

// ---- the container

typedef void (*edit_fn)(hid_t f);
static void swap_params(hid_t f) { h5e_swap(f, "/params/ln.weight/fp32", "/params/ln.bias/fp32"); }
static void swap_states(hid_t f) { h5e_swap(f, "/params/fc1.weight/fp32", "/params/fc1.weight/exp_avg"); }
static void poke_param(hid_t f) { h5e_poke(f, "/params/fc1.weight/fp32", 0); }
static void remake_state(hid_t f) { h5e_remake(f, "/params/fc1.weight/exp_avg_sq"); }
static void poke_frozen(hid_t f) { h5e_poke(f, "/frozen/frozen.weight", 3); }
static void poke_buffer(hid_t f) { h5e_poke(f, "/buffers/shift", 0); }
static void poke_resume(hid_t f) { h5e_poke(f, ZCK_H5U_RESUME_STATE, 5); }
static void poke_side(hid_t f) { h5e_poke(f, "/side_files/trainer_state.json", 1); }
static void del_resume(hid_t f) { ZT_ASSERT(H5Ldelete(f, ZCK_H5U_RESUME_STATE, H5P_DEFAULT) >= 0); }
static void del_side(hid_t f) { ZT_ASSERT(H5Ldelete(f, "/side_files/trainer_state.json", H5P_DEFAULT) >= 0); }
static void add_side(hid_t f) {
  ZT_ASSERT(H5Lcopy(f, "/side_files/trainer_state.json", f, "/side_files/extra.json", H5P_DEFAULT, H5P_DEFAULT) >= 0);
}

/* new datasets (H5Ocopy: another object, not another link to one) where no job looks */
static void add_root(hid_t f) { ZT_ASSERT(H5Ocopy(f, "/buffers/shift", f, "/evil", H5P_DEFAULT, H5P_DEFAULT) >= 0); }
static void add_state(hid_t f) {
  ZT_ASSERT(H5Ocopy(f, "/params/fc1.weight/exp_avg", f, "/params/fc1.weight/momentum", H5P_DEFAULT, H5P_DEFAULT) >= 0);
}
static void add_buffer(hid_t f) {
  ZT_ASSERT(H5Ocopy(f, "/buffers/shift", f, "/buffers/extra", H5P_DEFAULT, H5P_DEFAULT) >= 0);
}

static const struct {
  edit_fn edit;
  const char *names;        /* what the one line names */
  bool consolidate_reads;   /* consolidate reads what was edited */
} edits[] = {
  {swap_params, "/params/ln.", true},
  {swap_states, "/params/fc1.weight/", true},
  {poke_param, "/params/fc1.weight/fp32", true},
  {remake_state, "/params/fc1.weight/exp_avg_sq", false},
  {poke_frozen, "/frozen/frozen.weight", true},
  {poke_buffer, "/buffers/shift", true},
  {poke_resume, ZCK_H5U_RESUME_STATE, false},
  {poke_side, "/side_files/trainer_state.json", false},
  {del_resume, "a dataset deleted or added", true},
  {del_side, "a dataset deleted or added", true},
  {add_side, "a dataset deleted or added", true},
  {add_root, "a dataset added, not in its checksum table", true},
  {add_state, "a dataset added, not in its checksum table", true},
  {add_buffer, "a dataset added, not in its checksum table", true},
};

/* verify's result, with a damage finding naming path and needle. */
static zck_verify_result verify(const char *path, const char *needle) {
  zck_verify_report *r = NULL;
  (void)zck_verify(path, NULL, &r);
  ZT_ASSERT(r);
  zck_verify_result res = r->result;
  bool found = false;
  for (size_t i = 0; i < r->n_findings; i++) {
    const zck_verify_finding *x = &r->findings[i];
    if (x->severity == ZCK_VERIFY_DAMAGE && strstr(x->message, needle) && strstr(x->message, path)) found = true;
  }
  zck_verify_report_free(r);
  if (!found) ZT_FAIL("verify %s: no damage finding naming %s", path, needle);
  return res;
}

/* The coverage note verify gives a container: "checksum table" or "without a checksum table". */
static bool verify_note(const char *path, const char *needle) {
  zck_verify_report *r = NULL;
  (void)zck_verify(path, NULL, &r);
  ZT_ASSERT(r && r->result == ZCK_VERIFY_CLEAN);
  bool found = false;
  for (size_t i = 0; i < r->n_findings; i++)
    if (r->findings[i].severity == ZCK_VERIFY_NOTE && strstr(r->findings[i].message, needle)) found = true;
  zck_verify_report_free(r);
  return found;
}

static void reads(const char *h5, const char *tmp, const char *tag) {
  char out[4096];
  snprintf(out, sizeof out, "%s/%s.safetensors", tmp, tag);
  zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
  ZT_OK(zck_consolidate(h5, out, &co));
  snprintf(out, sizeof out, "%s/%s-r", tmp, tag);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_world_size = 1;
  ZT_OK(zck_reshard(h5, out, &ro));
}

static void test_container(const char *tmp) {
  char root[4096], h5[4096], bad[4096], out[4096];
  char *fx = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  snprintf(root, sizeof root, "%s/src", tmp);
  sh("cp -r '%s' '%s'", fx, root);
  free(fx);
  static const char side[] = "{\"global_step\": 2}", config[] = "{\"model_type\": \"gpt2\"}";
  snprintf(out, sizeof out, "%s/trainer_state.json", root);
  ZT_ASSERT(zt_write_file(out, side, sizeof side - 1) == 0);
  snprintf(out, sizeof out, "%s/config.json", root);
  ZT_ASSERT(zt_write_file(out, config, sizeof config - 1) == 0);
  snprintf(h5, sizeof h5, "%s/c.h5", tmp);
  snprintf(bad, sizeof bad, "%s/d.h5", tmp);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(root, h5, &uo));
  reads(h5, tmp, "intact");
  ZT_ASSERT(verify_note(h5, "read against its checksum table"));

  for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
    sh("cp '%s' '%s'", h5, bad);
    hid_t f = h5e_open(bad);
    edits[i].edit(f);
    H5Fclose(f);
    snprintf(out, sizeof out, "%s/out.safetensors", tmp);
    zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
    zck_status st = zck_consolidate(bad, out, &co);
    if (edits[i].consolidate_reads || st != ZCK_OK) {
      if (st != ZCK_ERR_DAMAGED) ZT_FAIL("edit %zu: consolidate gave %d: %s", i, (int)st, zck_last_error());
      one_line_naming(bad, edits[i].names);
      ZT_ASSERT(!exists(out));
    }
    unlink(out);   /* consolidate takes no optimizer state: what it wrote is the intact one */
    snprintf(out, sizeof out, "%s/out-r", tmp);
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ro.to_world_size = 1;
    st = zck_reshard(bad, out, &ro);
    if (st != ZCK_ERR_DAMAGED) ZT_FAIL("edit %zu: reshard gave %d: %s", i, (int)st, zck_last_error());
    one_line_naming(bad, edits[i].names);
    ZT_ASSERT(!exists(out));
    ZT_EQ_INT(verify(bad, edits[i].names), ZCK_VERIFY_DAMAGED);
  }

  /* config.json, which consolidate copies into an output folder: one edited is refused,
   * never left out */
  sh("cp '%s' '%s'", h5, bad);
  hid_t f = h5e_open(bad);
  h5e_poke(f, "/side_files/config.json", 2);
  H5Fclose(f);
  snprintf(out, sizeof out, "%s/hf", tmp);
  zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
  ZT_ERR(zck_consolidate(bad, out, &co), ZCK_ERR_DAMAGED, "/side_files/config.json: damaged");
  one_line_naming(bad, NULL);
  ZT_ASSERT(!exists(out));
  snprintf(out, sizeof out, "%s/hf-intact", tmp);
  ZT_OK(zck_consolidate(h5, out, &co));
  snprintf(out, sizeof out, "%s/hf-intact/config.json", tmp);
  ZT_ASSERT(exists(out));

  /* a version 2 container without its table (and digest): refused, never read as older */
  sh("cp '%s' '%s'", h5, bad);
  f = h5e_open(bad);
  h5e_make_old(f);
  int64_t two = 2;
  hid_t a = H5Aopen(f, "zckpt_format_version", H5P_DEFAULT);
  ZT_ASSERT(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &two) >= 0);
  H5Aclose(a);
  H5Fclose(f);
  zck_h5u *u = NULL;
  ZT_ERR(zck_h5u_open(bad, &u), ZCK_ERR_DAMAGED, "a version 2 container without its checksum table");
  one_line_naming(bad, NULL);
  ZT_EQ_INT(verify(bad, "without its checksum table"), ZCK_VERIFY_DAMAGED);

  /* made to look as written before the table: read, verify says what it could not check */
  sh("cp '%s' '%s'", h5, bad);
  f = h5e_open(bad);
  h5e_make_old(f);
  H5Fclose(f);
  reads(bad, tmp, "old");
  ZT_ASSERT(verify_note(bad, "without a checksum table"));
  char *old = zt_fixture("hdf5/zckpt-c9411c4-s2w2_bf16.h5");
  ZT_ASSERT(verify_note(old, "without a checksum table"));
  free(old);
}

// ---- describing a container (zck_h5u_describe: inspect)

static void same_model(const zck_model *a, const zck_model *b) {
  ZT_EQ_INT((int)a->n_params, (int)b->n_params);
  ZT_EQ_INT((int)a->n_buffers, (int)b->n_buffers);
  ZT_EQ_INT((int)a->n_groups, (int)b->n_groups);
  for (size_t i = 0; i < a->n_params; i++) {
    const zck_param *x = &a->params[i], *y = &b->params[i];
    ZT_EQ_STR(x->name, y->name);
    ZT_EQ_INT(x->dtype, y->dtype);
    ZT_EQ_INT(x->ndim, y->ndim);
    for (int d = 0; d < x->ndim; d++) ZT_ASSERT(x->shape[d] == y->shape[d]);
    ZT_EQ_INT(x->frozen, y->frozen);
    ZT_EQ_INT((int)x->tied_to, (int)y->tied_to);
    ZT_EQ_INT((int)x->group, (int)y->group);
  }
  for (size_t i = 0; i < a->n_buffers; i++) {
    ZT_EQ_STR(a->buffers[i].name, b->buffers[i].name);
    ZT_EQ_INT(a->buffers[i].dtype, b->buffers[i].dtype);
  }
}

static void del_param(hid_t f) { ZT_ASSERT(H5Ldelete(f, "/params/fc1.weight", H5P_DEFAULT) >= 0); }
static void del_frozen(hid_t f) { ZT_ASSERT(H5Ldelete(f, "/frozen/frozen.weight", H5P_DEFAULT) >= 0); }
static void lie_dtypes(hid_t f) {
  h5e_set_root_text(f, "part_dtypes", "{\"fp32\":\"float16\",\"exp_avg\":\"float32\",\"exp_avg_sq\":\"float32\"}");
}

/* Described from the root attributes, links and checksum table, the container gives the
 * model its open gives, and every check that reads no /params header still refuses. */
static void test_describe(const char *tmp) {
  char h5[4096], bad[4096];
  snprintf(h5, sizeof h5, "%s/c.h5", tmp);   /* test_container's (with its side files) */
  snprintf(bad, sizeof bad, "%s/d.h5", tmp);
  zck_h5u *u = NULL, *v = NULL;
  ZT_OK(zck_h5u_open(h5, &u));
  ZT_OK(zck_h5u_describe(h5, &v));
  same_model(zck_h5u_model(u), zck_h5u_model(v));
  ZT_EQ_INT((int)zck_h5u_info_of(v)->n_side_files, 2);
  const zck_layout *l = NULL;
  const zck_store *s = NULL;
  ZT_OK(zck_h5u_get(v, ZCK_H5U_EXP_AVG, &l, &s));
  ZT_ASSERT(l && !s);
  zck_h5u_close(u);
  zck_h5u_close(v);

  /* a lazy file answers about what lies below /params (its listing, a dataset's
   * attributes and bytes, a missing one) as an eager one does, walking again in full */
  zck_h5_file *lazy = NULL, *full = NULL;
  ZT_OK(zck_h5_open_lazy(h5, "params", &lazy));
  ZT_OK(zck_h5_open(h5, &full));
  char *a = NULL, *b = NULL;
  ZT_OK(zck_h5_attr_str(lazy, "/params/fc1.weight/fp32", "dtype", &a));
  ZT_OK(zck_h5_attr_str(full, "/params/fc1.weight/fp32", "dtype", &b));
  ZT_EQ_STR(a, b);
  free(a);
  free(b);
  ZT_ASSERT(zck_h5_exists(lazy, "/params/ln.bias/exp_avg_sq"));
  ZT_ASSERT(!zck_h5_exists(lazy, "/params/ln.bias/nothing"));
  char **names = NULL;
  size_t nn = 0;
  ZT_OK(zck_h5_list(lazy, "/params/ln.bias", &names, &nn));
  ZT_EQ_INT((int)nn, 3);
  ZT_EQ_STR(names[0], "exp_avg");
  for (size_t i = 0; i < nn; i++) free(names[i]);
  free(names);
  zck_h5_dataset *x = NULL, *y = NULL;
  ZT_OK(zck_h5_dataset_open(lazy, "/params/ln.bias/exp_avg_sq", &x));
  ZT_OK(zck_h5_dataset_open(full, "/params/ln.bias/exp_avg_sq", &y));
  uint64_t n = zck_h5_dataset_info_of(x)->numel;
  ZT_ASSERT(n && n == zck_h5_dataset_info_of(y)->numel);
  float *p = calloc(n, sizeof *p), *q = calloc(n, sizeof *q);
  ZT_OK(zck_h5_dataset_read(x, p, 0, n));
  ZT_OK(zck_h5_dataset_read(y, q, 0, n));
  ZT_ASSERT(!memcmp(p, q, n * sizeof *p));
  free(p);
  free(q);
  zck_h5_dataset_close(x);
  zck_h5_dataset_close(y);
  zck_h5_close(lazy);
  zck_h5_close(full);

  /* what describing still refuses, in one line naming the file */
  static const struct { edit_fn edit; zck_status st; const char *names; } bad_edits[] = {
    {del_resume, ZCK_ERR_DAMAGED, "a dataset deleted or added"},
    {del_side, ZCK_ERR_DAMAGED, "a dataset deleted or added"},
    {add_side, ZCK_ERR_DAMAGED, "a dataset deleted or added"},
    {del_param, ZCK_ERR_NOT_FOUND, "/params/fc1.weight/fp32: missing"},
    {del_frozen, ZCK_ERR_DAMAGED, "a dataset deleted or added"},
  };
  for (size_t i = 0; i < sizeof bad_edits / sizeof bad_edits[0]; i++) {
    sh("cp '%s' '%s'", h5, bad);
    hid_t f = h5e_open(bad);
    bad_edits[i].edit(f);
    H5Fclose(f);
    ZT_ERR(zck_h5u_describe(bad, &v), bad_edits[i].st, bad_edits[i].names);
    one_line_naming(bad, bad_edits[i].names);
  }

  /* part_dtypes, which describing trusts (under the root digest), is checked against every
   * dataset the container is opened with: a container whose datasets say otherwise is
   * refused there, naming the dataset */
  sh("cp '%s' '%s'", h5, bad);
  hid_t f = h5e_open(bad);
  lie_dtypes(f);
  H5Fclose(f);
  ZT_ERR(zck_h5u_open(bad, &u), ZCK_ERR_MISMATCH, "dtype float32, part_dtypes says float16");
  one_line_naming(bad, "/fp32");
  ZT_OK(zck_h5u_describe(bad, &v));
  ZT_EQ_INT(zck_h5u_model(v)->params[0].dtype, ZCK_F16);
  zck_h5u_close(v);
  char out[4096];
  snprintf(out, sizeof out, "%s/lie.safetensors", tmp);
  zck_consolidate_opts co = ZCK_CONSOLIDATE_OPTS_INIT;
  ZT_ERR(zck_consolidate(bad, out, &co), ZCK_ERR_MISMATCH, "part_dtypes says float16");
  ZT_ASSERT(!exists(out));
}

int main(void) {
  char *tmp = zt_tmpdir();
  test_writer(tmp);
  test_container(tmp);
  test_describe(tmp);
  free(tmp);
  return 0;
}
