/* h5_floor.c: what libhdf5 alone charges for the objects of zckpt's HDF5 universal
 * container of N parameters, to compare `to-universal --format hdf5` and `inspect` of the
 * container with (bench_tensors.sh, same run).
 *
 *   write: a file with the container's file properties (istore_k 4, the library's default
 *          format bounds), a group per parameter holding fp32, exp_avg and exp_avg_sq, each
 *          a dataset of ELEMS float32 with a UTF-8 `dtype` attribute, laid out as the
 *          container lays it out (LAYOUT "container": compact up to 16 KiB, its bytes
 *          written with H5Dwrite; else one chunk written raw, H5Dwrite_chunk: no filter, no
 *          conversion); no times tracked.
 *   open:  opens each of those datasets and reads what describing it needs: its shape,
 *          type, chunk size and `dtype` attribute.
 * No compression, hashing, checks or zckpt code: only the library's own cost per object.
 *
 * LAYOUT (write) compares the layouts (README "Many tensors"): "chunk" (one chunk each),
 * "compact" (the data in the object header: no chunk index, no filter), "compact-xxh3"
 * (compact with a uint64 attribute per dataset, a checksum the default file format lacks
 * there: what compact would cost without the container's checksum table).
 *
 * Library settings (write; environment, each unset by default), to show which of them
 * moves the floor (README "Many tensors"; none did by more than a few percent at 100k):
 *   H5_FLOOR_CORE=1      the in-memory driver (H5FD_CORE, written out at close): no file I/O
 *   H5_FLOOR_V18=1       libver bounds 1.8..latest (link storage in object headers, fractal
 *                        heaps) instead of the earliest format the container keeps
 *   H5_FLOOR_SYM_K=IK,LK the symbol-table B-tree and leaf sizes (default 16,4)
 *   H5_FLOOR_MDC_MB=M    a fixed metadata cache of M MiB (default: adaptive, 1-32 MiB)
 *
 * usage: h5_floor write|open FILE N_PARAMS [ELEMS [LAYOUT]]   (ELEMS default 8, LAYOUT container)
 */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const states[] = {"fp32", "exp_avg", "exp_avg_sq"};

static void library_settings(hid_t fcpl, hid_t fapl) {
  const char *v;
  if ((v = getenv("H5_FLOOR_CORE")) && atoi(v)) H5Pset_fapl_core(fapl, (size_t)64 << 20, 1);
  if ((v = getenv("H5_FLOOR_V18")) && atoi(v)) H5Pset_libver_bounds(fapl, H5F_LIBVER_V18, H5F_LIBVER_LATEST);
  unsigned ik, lk;
  if ((v = getenv("H5_FLOOR_SYM_K")) && sscanf(v, "%u,%u", &ik, &lk) == 2) H5Pset_sym_k(fcpl, ik, lk);
  if ((v = getenv("H5_FLOOR_MDC_MB")) && atol(v) > 0) {
    H5AC_cache_config_t c = {.version = H5AC__CURR_CACHE_CONFIG_VERSION};
    H5Pget_mdc_config(fapl, &c);
    c.set_initial_size = 1;
    c.initial_size = c.min_size = c.max_size = (size_t)atol(v) << 20;
    c.incr_mode = H5C_incr__off;
    c.flash_incr_mode = H5C_flash_incr__off;
    c.decr_mode = H5C_decr__off;
    H5Pset_mdc_config(fapl, &c);
  }
}

static int write_file(const char *path, long n, hsize_t elems, const char *layout) {
  int compact = !strncmp(layout, "compact", 7), xxh3 = !strcmp(layout, "compact-xxh3");
  hid_t fcpl = H5Pcreate(H5P_FILE_CREATE), fapl = H5Pcreate(H5P_FILE_ACCESS);
  H5Pset_istore_k(fcpl, 4);
  H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG);
  library_settings(fcpl, fapl);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, fcpl, fapl);
  if (f < 0) return 1;
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_obj_track_times(dcpl, 0);
  if (compact) H5Pset_layout(dcpl, H5D_COMPACT);
  else H5Pset_chunk(dcpl, 1, &elems);
  hid_t space = H5Screate_simple(1, &elems, NULL), scalar = H5Screate(H5S_SCALAR);
  hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, H5T_VARIABLE);
  H5Tset_cset(str, H5T_CSET_UTF8);
  float *data = calloc((size_t)elems, sizeof *data);
  const char *dtype = "float32";
  hsize_t origin = 0;
  int bad = !data;
  char name[128];
  for (long i = 0; i < n && !bad; i++) {
    snprintf(name, sizeof name, "model.layers.%ld.mlp.experts.%ld.w1.weight", i / 1000, i % 1000);
    hid_t g = H5Gcreate2(f, name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    bad = g < 0;
    for (int k = 0; k < 3 && !bad; k++) {
      hid_t d = H5Dcreate2(g, states[k], H5T_IEEE_F32LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
      hid_t a = d >= 0 ? H5Acreate2(d, "dtype", str, scalar, H5P_DEFAULT, H5P_DEFAULT) : H5I_INVALID_HID;
      bad = a < 0 || H5Awrite(a, str, &dtype) < 0;
      if (a >= 0) H5Aclose(a);
      if (!bad && xxh3) {
        unsigned long long h = 0;
        a = H5Acreate2(d, "zckpt_xxh3", H5T_STD_U64LE, scalar, H5P_DEFAULT, H5P_DEFAULT);
        bad = a < 0 || H5Awrite(a, H5T_NATIVE_ULLONG, &h) < 0;
        if (a >= 0) H5Aclose(a);
      }
      if (!bad)
        bad = compact ? H5Dwrite(d, H5T_IEEE_F32LE, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0
                      : H5Dwrite_chunk(d, H5P_DEFAULT, 0, &origin, (size_t)elems * sizeof *data, data) < 0;
      if (d >= 0) H5Dclose(d);
    }
    if (g >= 0) H5Gclose(g);
  }
  free(data);
  H5Tclose(str);
  H5Sclose(space);
  H5Sclose(scalar);
  H5Pclose(dcpl);
  H5Pclose(fcpl);
  H5Pclose(fapl);
  return (H5Fclose(f) < 0) | bad;
}

static int open_file(const char *path, long n) {
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return 1;
  hid_t str = H5Tcopy(H5T_C_S1);
  H5Tset_size(str, H5T_VARIABLE);
  H5Tset_cset(str, H5T_CSET_UTF8);
  int bad = 0;
  char name[160];
  for (long i = 0; i < n && !bad; i++)
    for (int k = 0; k < 3 && !bad; k++) {
      snprintf(name, sizeof name, "model.layers.%ld.mlp.experts.%ld.w1.weight/%s", i / 1000, i % 1000, states[k]);
      hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
      if (d < 0) { bad = 1; break; }
      hid_t space = H5Dget_space(d), type = H5Dget_type(d), dcpl = H5Dget_create_plist(d);
      hsize_t dims[8], chunk[8];
      char *dtype = NULL;
      hid_t a = H5Aopen(d, "dtype", H5P_DEFAULT);
      bad = space < 0 || type < 0 || dcpl < 0 || a < 0 || H5Sget_simple_extent_dims(space, dims, NULL) < 0 ||
            H5Tget_size(type) == 0 || (H5Pget_layout(dcpl) == H5D_CHUNKED && H5Pget_chunk(dcpl, 8, chunk) < 0) ||
            H5Aread(a, str, &dtype) < 0;
      if (dtype) H5free_memory(dtype);
      if (a >= 0) H5Aclose(a);
      if (dcpl >= 0) H5Pclose(dcpl);
      if (type >= 0) H5Tclose(type);
      if (space >= 0) H5Sclose(space);
      H5Dclose(d);
    }
  H5Tclose(str);
  return (H5Fclose(f) < 0) | bad;
}

int main(int argc, char **argv) {
  if (argc < 4 || (strcmp(argv[1], "write") && strcmp(argv[1], "open"))) {
    fprintf(stderr, "usage: h5_floor write|open FILE N_PARAMS [ELEMS [container|chunk|compact|compact-xxh3]]\n");
    return 2;
  }
  long n = atol(argv[3]);
  hsize_t elems = argc > 4 ? (hsize_t)atol(argv[4]) : 8;
  const char *layout = argc > 5 ? argv[5] : "container";
  if (!strcmp(layout, "container")) layout = elems * sizeof(float) <= (16 << 10) ? "compact" : "chunk";
  if (strcmp(layout, "chunk") && strcmp(layout, "compact") && strcmp(layout, "compact-xxh3")) {
    fprintf(stderr, "h5_floor: layout %s: container, chunk, compact or compact-xxh3\n", layout);
    return 2;
  }
  int r = !strcmp(argv[1], "write") ? write_file(argv[2], n, elems, layout) : open_file(argv[2], n);
  if (r) fprintf(stderr, "h5_floor: %s %s failed\n", argv[1], argv[2]);
  return r;
}
