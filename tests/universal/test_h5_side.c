/* test_h5_side.c: the HDF5 container's /side_files and tag, through the reader API.
 *  - an HF-style save root (rng_state_<r>.pth, an empty file, a file of several chunks; a
 *    folder, a symlink, dot files and `latest` left out): the container lists exactly the
 *    carried files in name order, gives each back byte for byte, and the source's tag;
 *  - corrupted copies (edited with HDF5 itself): a tag that is not a folder name, side
 *    files named `latest` / like the tag / as dot files / with a newline, a side dataset that is not 1-d
 *    uint8: each refused with one line naming the container. */
#include <hdf5.h>
#include <sys/stat.h>

#include "h5_edit.h"
#include "hdf5/zck_h5.h"
#include "io.h"
#include "test.h"
#include "zck.h"

static void sh(const char *cmd) {
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}

static char *slurp(const char *path, size_t *n) {
  char *data = NULL;
  ZT_OK(zck__read_small_file(path, (size_t)64 << 20, &data, n));
  return data;
}

/* Replaces the root's `tag` attribute with a variable-length string, as another writer
 * would: without the root attributes' digest (which would call the file damaged). */
static void set_tag(const char *path, const char *tag) {
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  ZT_ASSERT(f >= 0);
  ZT_ASSERT(H5Adelete(f, "tag") >= 0);
  if (H5Aexists(f, ZCK_H5_ATTRS_XXH3_ATTR) > 0) ZT_ASSERT(H5Adelete(f, ZCK_H5_ATTRS_XXH3_ATTR) >= 0);
  hid_t t = H5Tcopy(H5T_C_S1), sp = H5Screate(H5S_SCALAR);
  H5Tset_size(t, H5T_VARIABLE);
  hid_t a = H5Acreate2(f, "tag", t, sp, H5P_DEFAULT, H5P_DEFAULT);
  ZT_ASSERT(a >= 0 && H5Awrite(a, t, &tag) >= 0);
  H5Aclose(a);
  H5Sclose(sp);
  H5Tclose(t);
  H5Fclose(f);
}

/* Adds dataset `path` (float32 [2][2], or uint8 [3]) with its `dtype` attribute, to the
 * container made older. */
static void add_dataset(const char *file, const char *path, bool u8) {
  hid_t f = h5e_open(file);
  h5e_make_old(f);   /* no checksum table, which would refuse the dataset as one added */
  hsize_t dims[2] = {u8 ? 3 : 2, 2};
  hid_t sp = H5Screate_simple(u8 ? 1 : 2, dims, NULL);
  hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
  H5Pset_create_intermediate_group(lcpl, 1);
  hid_t d = H5Dcreate2(f, path, u8 ? H5T_STD_U8LE : H5T_IEEE_F32LE, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
  ZT_ASSERT(d >= 0);
  float v[4] = {1, 2, 3, 4};
  ZT_ASSERT(H5Dwrite(d, u8 ? H5T_NATIVE_UINT8 : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v) >= 0);
  const char *dt = u8 ? "uint8" : "float32";
  hid_t t = H5Tcopy(H5T_C_S1), as = H5Screate(H5S_SCALAR);
  H5Tset_size(t, H5T_VARIABLE);
  hid_t a = H5Acreate2(d, "dtype", t, as, H5P_DEFAULT, H5P_DEFAULT);
  ZT_ASSERT(a >= 0 && H5Awrite(a, t, &dt) >= 0);
  H5Aclose(a);
  H5Sclose(as);
  H5Tclose(t);
  H5Dclose(d);
  H5Pclose(lcpl);
  H5Sclose(sp);
  H5Fclose(f);
}

static void expect_open_fails(const char *path, const char *needle) {
  zck_h5u *u = NULL;
  ZT_ERR(zck_h5u_open(path, &u), ZCK_ERR_FORMAT, needle);
  ZT_ASSERT(u == NULL);
  if (!strstr(zck_last_error(), path)) ZT_FAIL("message \"%s\" does not name %s", zck_last_error(), path);
  if (strchr(zck_last_error(), '\n')) ZT_FAIL("message \"%s\" is not one line", zck_last_error());
}

int main(void) {
  char *tmp = zt_tmpdir(), *fx = zt_fixture("deepspeed/s2w2_bf16/ckpt");
  char cmd[8192], root[4096], h5[4096], bad[4096], got[4096];
  snprintf(root, sizeof root, "%s/checkpoint-3", tmp);
  snprintf(h5, sizeof h5, "%s/uc.h5", tmp);
  snprintf(bad, sizeof bad, "%s/bad.h5", tmp);
  snprintf(cmd, sizeof cmd,
           "cp -r '%s' '%s' && cd '%s' && printf r0 > rng_state_0.pth && printf r1x > rng_state_1.pth && : > empty.bin && "
           "head -c 2500000 /dev/urandom > big.bin && mkdir runs && printf x > runs/e && ln -s big.bin link.bin && "
           "printf x > .dot && printf x > latest_universal",
           fx, root, root);
  sh(cmd);
  zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
  o.format = ZCK_UNIVERSAL_HDF5;
  o.inject_missing_state = 1;
  ZT_OK(zck_to_universal(root, h5, &o));

  zck_h5u *u = NULL;
  ZT_OK(zck_h5u_open(h5, &u));
  const zck_h5u_info *in = zck_h5u_info_of(u);
  ZT_EQ_STR(in->tag, "global_step2");
  static const char *want[] = {"big.bin", "empty.bin", "rng_state_0.pth", "rng_state_1.pth", "zero_to_fp32.py",
                               "zero_to_torch.py"};
  ZT_EQ_INT(in->n_side_files, 6);
  for (size_t i = 0; i < in->n_side_files; i++) {
    const char *n = zck_h5u_side_file_name(u, i);
    ZT_EQ_STR(n, want[i]);
    snprintf(got, sizeof got, "%s/out-%s", tmp, n);
    ZT_OK(zck_h5u_side_file_write(u, i, got));
    char src[4096];
    snprintf(src, sizeof src, "%s/%s", root, n);
    size_t na, nb;
    char *a = slurp(src, &na), *b = slurp(got, &nb);
    ZT_EQ_U64(na, nb);
    ZT_EQ_MEM(a, b, na);
    free(a);
    free(b);
  }
  /* a target folder that does not exist is made (lib/io: as for any output file) */
  snprintf(got, sizeof got, "%s/made/x", tmp);
  ZT_OK(zck_h5u_side_file_write(u, 0, got));
  /* one that cannot be a folder (a file is there): the path is named */
  snprintf(got, sizeof got, "%s/missing", tmp);
  ZT_ASSERT(zt_write_file(got, "f", 1) == 0);
  snprintf(got, sizeof got, "%s/missing/x", tmp);
  ZT_ASSERT(zck_h5u_side_file_write(u, 0, got) != ZCK_OK);
  ZT_ASSERT(strstr(zck_last_error(), "missing/x") != NULL);
  zck_h5u_close(u);

  /* tags that are not folder names */
  static const char *tags[] = {"../evil", "a/b", ".", "x\ny"};
  for (int i = 0; i < 4; i++) {
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", h5, bad);
    sh(cmd);
    set_tag(bad, tags[i]);
    expect_open_fails(bad, "is not a folder name");
  }
  /* an empty tag: none (the reshard names global_step<N>) */
  set_tag(h5, "");
  ZT_OK(zck_h5u_open(h5, &u));
  ZT_ASSERT(zck_h5u_info_of(u)->tag == NULL);
  zck_h5u_close(u);
  set_tag(h5, "global_step2");

  /* side files a reshard must not create */
  static const char *names[] = {"/side_files/latest", "/side_files/latest_universal", "/side_files/.x",
                                "/side_files/global_step2", "/side_files/a\nb"};
  for (int i = 0; i < 5; i++) {
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", h5, bad);
    sh(cmd);
    add_dataset(bad, names[i], true);
    expect_open_fails(bad, "is not allowed");
  }
  /* a side dataset that is not 1-d uint8 */
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", h5, bad);
  sh(cmd);
  add_dataset(bad, "/side_files/aaa", false);
  ZT_OK(zck_h5u_open(bad, &u));
  ZT_EQ_STR(zck_h5u_side_file_name(u, 0), "aaa");
  snprintf(got, sizeof got, "%s/aaa", tmp);
  ZT_ERR(zck_h5u_side_file_write(u, 0, got), ZCK_ERR_FORMAT, "not a 1-d uint8 dataset");
  ZT_ASSERT(strstr(zck_last_error(), bad) != NULL);
  struct stat sb;
  ZT_ASSERT(stat(got, &sb) != 0);   /* nothing left behind */
  zck_h5u_close(u);
  free(fx);
  free(tmp);
  return 0;
}
