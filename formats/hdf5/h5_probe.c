/* h5_probe.c: a crash guard for untrusted HDF5 files.
 *
 * libhdf5 trusts a file's metadata: fuzzing found a corrupt global-heap reference that
 * makes reading a variable-length string attribute segfault inside the library, and a
 * size field that makes it ask malloc for terabytes. zckpt therefore walks a file's
 * metadata once in a forked child before opening it for real: every object, every
 * attribute read with its own type (variable-length values included), every dataset's
 * layout and chunk index. If the child dies from a signal, the file is refused with a
 * one-line message instead of taking the process down; errors the library reports in the
 * child are left for the real open to report. */
#include "h5_internal.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static herr_t zck__probe_attr(hid_t loc, const char *name, const H5A_info_t *info, void *ctx) {
  (void)info;
  (void)ctx;
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  if (a < 0) return 0;
  hid_t t = H5Aget_type(a), s = H5Aget_space(a);
  hssize_t n = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
  size_t size = t >= 0 ? H5Tget_size(t) : 0;
  if (n >= 0 && size && (uint64_t)n * size < ((uint64_t)1 << 30)) {
    void *buf = calloc((size_t)n + 1, size);
    if (buf && H5Aread(a, t, buf) >= 0 && H5Tdetect_class(t, H5T_VLEN) > 0) H5Dvlen_reclaim(t, s, H5P_DEFAULT, buf);
    else if (buf && H5Tis_variable_str(t) > 0) H5Dvlen_reclaim(t, s, H5P_DEFAULT, buf);
    free(buf);
  }
  if (s >= 0) H5Sclose(s);
  if (t >= 0) H5Tclose(t);
  H5Aclose(a);
  return 0;
}

/* Every attribute name the reader looks up by name (zck_h5_attr_*, zck_h5_dataset_open):
 * a lookup by name walks the attribute name index, which iterating by index does not (one
 * changed byte there crashed H5Aexists in the real open, after a clean probe). */
static const char *const zck__probe_attr_names[] = {
  "dtype", ZCK_H5_XXH3_ATTR, ZCK_H5_ATTRS_XXH3_ATTR, "tag", "zckpt_format", "zckpt_format_version", "stage",
  "world_size", "global_steps", "skipped_steps", "global_samples", "step_is_tensor", "step", "ds_version", "ds_config",
  "frozen_parameters", "lp_dtype", "param_groups", "param_names", "param_shapes", "buffer_names", "tied_parameters",
};

static herr_t zck__probe_attr_by_name(hid_t loc, const char *name, const H5A_info_t *info, void *ctx) {
  (void)info;
  (void)ctx;
  if (H5Aexists(loc, name) > 0) {
    hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
    if (a >= 0) H5Aclose(a);
  }
  return 0;
}

static void zck__probe_attr_lookups(hid_t o) {
  for (size_t i = 0; i < sizeof zck__probe_attr_names / sizeof *zck__probe_attr_names; i++)
    if (H5Aexists(o, zck__probe_attr_names[i]) > 0) zck__probe_attr(o, zck__probe_attr_names[i], NULL, NULL);
  H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, zck__probe_attr_by_name, NULL);
}

static herr_t zck__probe_object(hid_t root, const char *name, const H5O_info_t *info, void *ctx) {
  if (H5Lexists(root, name, H5P_DEFAULT) <= 0) return 0; /* the reader's own path check */
  hid_t o = H5Oopen(root, name, H5P_DEFAULT);
  if (o < 0) return 0;
  H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, zck__probe_attr, ctx);
  zck__probe_attr_lookups(o);
  if (info->type == H5O_TYPE_DATASET) {
    hid_t sp = H5Dget_space(o), pl = H5Dget_create_plist(o), ty = H5Dget_type(o);
    hsize_t nchunks = 0;
    if (pl >= 0) { /* what zck_h5_dataset_open asks of the creation properties */
      int nf = H5Pget_nfilters(pl);
      for (int i = 0; i < nf && i < 32; i++) {
        unsigned flags = 0, cd[8] = {0}, cfg = 0;
        size_t ncd = 8;
        char fname[64] = "";
        H5Pget_filter2(pl, (unsigned)i, &flags, &ncd, cd, sizeof fname, fname, &cfg);
      }
      H5D_fill_value_t fv;
      if (ty >= 0 && H5Pfill_value_defined(pl, &fv) >= 0 && fv == H5D_FILL_VALUE_USER_DEFINED && H5Tget_size(ty) <= 64) {
        unsigned char fill[64];
        H5Pget_fill_value(pl, ty, fill);
      }
      hsize_t cd[32];
      if (H5Pget_layout(pl) == H5D_CHUNKED) H5Pget_chunk(pl, 32, cd);
    }
    if (pl >= 0 && H5Pget_layout(pl) == H5D_CHUNKED && sp >= 0 && H5Dget_num_chunks(o, sp, &nchunks) >= 0) {
      for (hsize_t i = 0; i < nchunks && i < 100000; i++) {
        hsize_t off[32];
        unsigned mask;
        haddr_t addr;
        hsize_t size;
        if (H5Dget_chunk_info(o, sp, i, off, &mask, &addr, &size) < 0) break;
      }
    }
    if (ty >= 0) H5Tclose(ty);
    if (pl >= 0) H5Pclose(pl);
    if (sp >= 0) H5Sclose(sp);
  }
  H5Oclose(o);
  return 0;
}

zck_status zck__h5_probe(const char *path) {
  if (getenv("ZCK_H5_NO_PROBE")) return ZCK_OK;
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return ZCK_OK; /* no probe possible: the real open goes on unguarded */
  if (pid == 0) {
    alarm(60); /* a metadata loop in the library: give up, the parent then refuses */
    int devnull = open("/dev/null", O_WRONLY); /* the child's reports are not the user's */
    if (devnull >= 0) dup2(devnull, 2);
#if !defined(__SANITIZE_ADDRESS__)
    /* terabyte mallocs fail fast (AddressSanitizer needs its huge shadow mapping, and
     * reports such mallocs itself) */
    struct rlimit as = {(rlim_t)8 << 30, (rlim_t)8 << 30};
    setrlimit(RLIMIT_AS, &as);
#endif
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f >= 0) {
      H5Aiterate2(f, H5_INDEX_NAME, H5_ITER_NATIVE, NULL, zck__probe_attr, NULL);
      hid_t root = H5Oopen(f, "/", H5P_DEFAULT);
      if (root >= 0) {
        zck__probe_attr_lookups(root);
        H5Oclose(root);
      }
      H5Ovisit2(f, H5_INDEX_NAME, H5_ITER_NATIVE, zck__probe_object, NULL, H5O_INFO_BASIC);
      H5Fclose(f);
    }
    _exit(0);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  /* the child exits 0 whatever the library reports; anything else is a crash (a signal,
   * or a sanitizer runtime that turned one into an exit status) */
  if (WIFSIGNALED(status))
    return zck__fail(ZCK_ERR_FORMAT, "%s: corrupt HDF5 metadata: the HDF5 library crashed reading it (signal %d)", path,
                     WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return zck__fail(ZCK_ERR_FORMAT, "%s: corrupt HDF5 metadata: the HDF5 library crashed reading it (exit %d)", path,
                     WEXITSTATUS(status));
  return ZCK_OK;
}
