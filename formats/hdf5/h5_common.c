/* h5_common.c: the HDF5 lock and set-up, error messages, dtype mapping, and the zstd
 * filter (id 32015) registered with HDF5 so its own pipeline can also read and write our
 * datasets (h5py uses hdf5plugin's; both produce one frame per chunk). */
#include "h5_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "util.h"

// ---- the zstd filter

/* H5Z filter function (H5Zpublic.h): compresses or decompresses *buf in place, returning
 * the valid byte count, 0 on failure. Memory comes from HDF5's allocator. */
static size_t zck__h5_zstd_filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes,
                                  size_t *buf_size, void **buf) {
  if (flags & H5Z_FLAG_REVERSE) {
    unsigned long long n = ZSTD_getFrameContentSize(*buf, nbytes);
    if (n == ZSTD_CONTENTSIZE_UNKNOWN || n == ZSTD_CONTENTSIZE_ERROR || n > ZCK__H5_MAX_CHUNK_BYTES) return 0;
    if (ZSTD_findFrameCompressedSize(*buf, nbytes) != nbytes) return 0;
    void *out = H5allocate_memory(n ? (size_t)n : 1, 0);
    if (!out) return 0;
    size_t r = ZSTD_decompress(out, (size_t)n, *buf, nbytes);
    if (ZSTD_isError(r) || r != n) {
      H5free_memory(out);
      return 0;
    }
    H5free_memory(*buf);
    *buf = out;
    *buf_size = (size_t)n ? (size_t)n : 1;
    return (size_t)n;
  }
  int level = cd_nelmts > 0 ? (int)cd_values[0] : ZSTD_CLEVEL_DEFAULT;
  if (level < 1) level = 1;
  if (level > ZSTD_maxCLevel()) level = ZSTD_maxCLevel();
  size_t cap = ZSTD_compressBound(nbytes);
  void *out = H5allocate_memory(cap, 0);
  ZSTD_CCtx *cc = out ? ZSTD_createCCtx() : NULL;
  size_t r = cc ? zck__h5_zstd_params(cc, level) : 1;
  if (cc && !ZSTD_isError(r)) r = ZSTD_compress2(cc, out, cap, *buf, nbytes);
  ZSTD_freeCCtx(cc);
  if (!cc || ZSTD_isError(r)) {
    if (out) H5free_memory(out);
    return 0;
  }
  H5free_memory(*buf);
  *buf = out;
  *buf_size = cap;
  return r;
}

size_t zck__h5_zstd_params(ZSTD_CCtx *cc, int level) {
  size_t r = ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
  if (!ZSTD_isError(r)) r = ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 1);
  return ZSTD_isError(r) ? r : 0;
}

static const H5Z_class2_t zck__h5_zstd_class = {
  H5Z_CLASS_T_VERS, (H5Z_filter_t)ZCK_H5_ZSTD_FILTER, 1, 1, "zstd", NULL, NULL, zck__h5_zstd_filter};

zck_status zck__h5_unzstd(const void *src, size_t n, void *out, size_t expect, const char *what) {
  size_t frame = ZSTD_findFrameCompressedSize(src, n);
  if (ZSTD_isError(frame))
    return zck__fail(ZCK_ERR_FORMAT, "%s: not a zstd frame (%s)", what, ZSTD_getErrorName(frame));
  unsigned long long cs = ZSTD_getFrameContentSize(src, n);
  if (cs == ZSTD_CONTENTSIZE_UNKNOWN)
    return zck__fail(ZCK_ERR_FORMAT, "%s: zstd frame does not record its content size", what);
  if (cs == ZSTD_CONTENTSIZE_ERROR)
    return zck__fail(ZCK_ERR_FORMAT, "%s: bad zstd frame header", what);
  if (frame != n)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %zu bytes after the first zstd frame of %zu bytes", what, n - frame,
                     frame);
  if (cs != expect)
    return zck__fail(ZCK_ERR_FORMAT, "%s: zstd content size %llu, expected %zu bytes", what, cs, expect);
  size_t r = ZSTD_decompress(out, expect, src, n);
  if (ZSTD_isError(r) && ZSTD_getErrorCode(r) == ZSTD_error_checksum_wrong)
    return zck__fail(ZCK_ERR_DAMAGED, "%s: damaged: its data does not match the chunk's zstd checksum", what);
  if (ZSTD_isError(r)) return zck__fail(ZCK_ERR_FORMAT, "%s: damaged: zstd: %s", what, ZSTD_getErrorName(r));
  if (r != expect)
    return zck__fail(ZCK_ERR_FORMAT, "%s: decompressed to %zu bytes, expected %zu", what, r, expect);
  return ZCK_OK;
}

// ---- lock and set-up

static pthread_once_t zck__h5_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t zck__h5_mu;

static void zck__h5_init(void) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&zck__h5_mu, &a);
  pthread_mutexattr_destroy(&a);
  /* No clean-up at exit: it closes the ids still open, and an id whose close failed
   * (HDF5 1.10 after a failed metadata flush, see zck__h5w_discard) crashes it. Every
   * file is closed explicitly anyway. */
  H5dont_atexit();
  H5open();
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  if (H5Zfilter_avail(ZCK_H5_ZSTD_FILTER) <= 0) H5Zregister(&zck__h5_zstd_class);
  H5Eclear2(H5E_DEFAULT);
}

void zck__h5_lock(void) {
  pthread_once(&zck__h5_once, zck__h5_init);
  pthread_mutex_lock(&zck__h5_mu);
  /* A thread-safe libhdf5 (Debian's is) keeps the error stack and its automatic
   * printing per thread: turn the printing off in every thread that calls it. */
  static _Thread_local bool quiet;
  if (!quiet) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    quiet = true;
  }
}

void zck__h5_unlock(void) { pthread_mutex_unlock(&zck__h5_mu); }

// ---- errors

typedef struct {
  char inner[256];
  bool nospace;
} zck__h5_walk;

static herr_t zck__h5_walk_cb(unsigned n, const H5E_error2_t *e, void *ctx) {
  zck__h5_walk *w = ctx;
  const char *d = e->desc ? e->desc : "";
  if (strstr(d, "No space left") || strstr(d, "errno = 28") || strstr(d, "Disk quota") || strstr(d, "errno = 122"))
    w->nospace = true;
  if (n == 0) {
    /* sec2's messages carry a time stamp, buffer addresses and sizes; keep only the
     * system's words ("... error message = 'No space left on device', ...") */
    const char *m = strstr(d, "error message = '");
    const char *end = m ? strchr(m + 17, '\'') : NULL;
    if (end) snprintf(w->inner, sizeof w->inner, "%.*s", (int)(end - (m + 17)), m + 17);
    else snprintf(w->inner, sizeof w->inner, "%s", d);
  }
  return 0;
}

zck_status zck__h5_fail(zck_status status, const char *fmt, ...) {
  int saved = errno;
  char what[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  zck__h5_walk w = {"", false};
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, zck__h5_walk_cb, &w);
  H5Eclear2(H5E_DEFAULT);
  if (w.nospace || saved == ENOSPC || saved == EDQUOT) {
    if (status == ZCK_ERR_IO) status = ZCK_ERR_NO_SPACE;
  }
  if (w.inner[0]) return zck__fail(status, "%s: %s", what, w.inner);
  return zck__fail(status, "%s", what);
}

// ---- dtypes

static hid_t zck__h5_half(void) {
  /* h5py's float16: an IEEE binary16 derived from the 32-bit float type */
  hid_t t = H5Tcopy(H5T_IEEE_F32LE);
  if (t < 0) return t;
  if (H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_size(t, 2) < 0 || H5Tset_ebias(t, 15) < 0 ||
      H5Tset_precision(t, 16) < 0) {
    H5Tclose(t);
    return H5I_INVALID_HID;
  }
  return t;
}

hid_t zck__h5_open_ro(const char *path) {
  hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
  /* one slot, no bytes: rdcc_w0 is the library's default */
  if (fapl >= 0 && H5Pset_cache(fapl, 0, 1, 0, 0.75) < 0) {
    H5Pclose(fapl);
    fapl = H5I_INVALID_HID;
  }
  /* libhdf5's metadata cache, capped: it keeps every object header it read with its
   * messages decoded (about ten times the header's bytes, which are what the cap counts),
   * and its adaptive size grows to 32 MiB of headers: 1.2 GB of memory for a container of
   * 300k datasets, whose reads (one after another, each opening its header once) gain
   * nothing from them */
  H5AC_cache_config_t mdc;
  mdc.version = H5AC__CURR_CACHE_CONFIG_VERSION;
  if (fapl >= 0 && H5Pget_mdc_config(fapl, &mdc) >= 0) {
    mdc.set_initial_size = 1;
    mdc.initial_size = mdc.max_size = ZCK__H5_MDC_BYTES;
    if (mdc.min_size > ZCK__H5_MDC_BYTES) mdc.min_size = ZCK__H5_MDC_BYTES;
    mdc.incr_mode = H5C_incr__off;
    mdc.flash_incr_mode = H5C_flash_incr__off;
    mdc.decr_mode = H5C_decr__off;
    if (H5Pset_mdc_config(fapl, &mdc) < 0) H5Eclear2(H5E_DEFAULT);   /* the library's default then */
  }
  hid_t f = H5Fopen(path, H5F_ACC_RDONLY, fapl >= 0 ? fapl : H5P_DEFAULT);
  if (fapl >= 0) H5Pclose(fapl);
  return f;
}

hid_t zck__h5_file_type(zck_dtype t) {
  hid_t base;
  switch (t) {
  case ZCK_F64: base = H5T_IEEE_F64LE; break;
  case ZCK_F32: base = H5T_IEEE_F32LE; break;
  case ZCK_F16: return zck__h5_half();
  case ZCK_BF16: case ZCK_U16: base = H5T_STD_U16LE; break;
  case ZCK_I64: base = H5T_STD_I64LE; break;
  case ZCK_I32: base = H5T_STD_I32LE; break;
  case ZCK_I16: base = H5T_STD_I16LE; break;
  case ZCK_I8: base = H5T_STD_I8LE; break;
  case ZCK_U64: base = H5T_STD_U64LE; break;
  case ZCK_U32: base = H5T_STD_U32LE; break;
  case ZCK_U8: case ZCK_BOOL: case ZCK_F8_E4M3: case ZCK_F8_E5M2: base = H5T_STD_U8LE; break;
  default:
    zck__fail(ZCK_ERR_UNSUPPORTED, "HDF5 output cannot hold %s tensors", zck_dtype_name(t));
    return H5I_INVALID_HID;
  }
  return H5Tcopy(base);
}

zck_dtype zck__h5_dtype_of(hid_t type) {
  H5T_class_t cls = H5Tget_class(type);
  size_t size = H5Tget_size(type);
  if (cls == H5T_ENUM) {
    /* h5py's bool: enum of a 1-byte integer {FALSE: 0, TRUE: 1} */
    hid_t super = H5Tget_super(type);
    zck_dtype b = super >= 0 ? zck__h5_dtype_of(super) : ZCK_DTYPE_INVALID;
    if (super >= 0) H5Tclose(super);
    return (b == ZCK_I8 || b == ZCK_U8) && H5Tget_nmembers(type) == 2 ? ZCK_BOOL : ZCK_DTYPE_INVALID;
  }
  if (cls != H5T_FLOAT && cls != H5T_INTEGER) return ZCK_DTYPE_INVALID;
  if (size > 1 && H5Tget_order(type) != H5T_ORDER_LE) return ZCK_DTYPE_INVALID;
  if (cls == H5T_FLOAT) {
    size_t spos, epos, esize, mpos, msize;
    if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return ZCK_DTYPE_INVALID;
    if (size == 8 && esize == 11 && msize == 52) return ZCK_F64;
    if (size == 4 && esize == 8 && msize == 23) return ZCK_F32;
    if (size == 2 && esize == 5 && msize == 10) return ZCK_F16;
    return ZCK_DTYPE_INVALID;
  }
  bool sgn = H5Tget_sign(type) == H5T_SGN_2;
  switch (size) {
  case 1: return sgn ? ZCK_I8 : ZCK_U8;
  case 2: return sgn ? ZCK_I16 : ZCK_U16;
  case 4: return sgn ? ZCK_I32 : ZCK_U32;
  case 8: return sgn ? ZCK_I64 : ZCK_U64;
  default: return ZCK_DTYPE_INVALID;
  }
}

// ---- attribute digest

typedef struct {
  hid_t file;
  const char *obj;
  uint64_t sum;
  zck_status st;
} zck__h5_digest;

/* Adds XXH3(obj \0 key \0 value) of one attribute: a variable-length string's bytes, else
 * the stored bytes of its values. */
static herr_t zck__h5_digest_attr(hid_t o, const char *key, const H5A_info_t *info, void *ctx) {
  (void)info;
  zck__h5_digest *g = ctx;
  if (!strcmp(g->obj, ".") && !strcmp(key, ZCK_H5_ATTRS_XXH3_ATTR)) return 0;
  hid_t a = H5Aopen(o, key, H5P_DEFAULT);
  hid_t t = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID;
  hid_t sp = a >= 0 ? H5Aget_space(a) : H5I_INVALID_HID;
  hssize_t np = sp >= 0 ? H5Sget_simple_extent_npoints(sp) : -1;
  size_t es = t >= 0 ? H5Tget_size(t) : 0;
  zck__buf b;
  zck__buf_init(&b);
  zck__buf_append(&b, g->obj, strlen(g->obj) + 1);
  zck__buf_append(&b, key, strlen(key) + 1);
  if (t < 0 || np < 0 || !es) {
    g->st = zck__h5_fail(ZCK_ERR_FORMAT, "attribute %s of %s", key, g->obj);
  } else if (H5Tis_variable_str(t) > 0) {
    if (np != 1) {
      g->st = zck__fail(ZCK_ERR_FORMAT, "attribute %s of %s: %lld strings", key, g->obj, (long long)np);
    } else {
      hid_t mt = H5Tcopy(t);   /* its own character set: HDF5 converts none to another */
      char *v = NULL;
      if (mt < 0 || H5Aread(a, mt, &v) < 0) g->st = zck__h5_fail(ZCK_ERR_FORMAT, "attribute %s of %s", key, g->obj);
      else if (v) zck__buf_append(&b, v, strlen(v));
      if (v) H5free_memory(v);
      if (mt >= 0) H5Tclose(mt);
    }
  } else if (H5Tdetect_class(t, H5T_VLEN) > 0 || (uint64_t)np * es > ((uint64_t)64 << 20)) {
    g->st = zck__fail(ZCK_ERR_FORMAT, "attribute %s of %s: unsupported type or size", key, g->obj);
  } else {
    size_t n = (size_t)np * es;
    uint8_t *v = zck__malloc(n ? n : 1);
    if (!v) g->st = ZCK_ERR_NO_MEMORY;
    else if (H5Aread(a, t, v) < 0) g->st = zck__h5_fail(ZCK_ERR_FORMAT, "attribute %s of %s", key, g->obj);
    else zck__buf_append(&b, v, n);
    free(v);
  }
  if (g->st == ZCK_OK && b.failed) g->st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  if (g->st == ZCK_OK) g->sum += zck_xxh3(b.data, b.len);
  zck__buf_free(&b);
  if (sp >= 0) H5Sclose(sp);
  if (t >= 0) H5Tclose(t);
  if (a >= 0) H5Aclose(a);
  return g->st == ZCK_OK ? 0 : -1;
}

static herr_t zck__h5_digest_obj(hid_t root, const char *name, const H5O_info_t *info, void *ctx) {
  (void)info;
  zck__h5_digest *g = ctx;
  hid_t o = H5Oopen(root, name, H5P_DEFAULT);
  if (o < 0) {
    g->st = zck__h5_fail(ZCK_ERR_FORMAT, "object %s", name);
    return -1;
  }
  g->obj = name;
  hsize_t idx = 0;
  herr_t r = H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, &idx, zck__h5_digest_attr, g);
  H5Oclose(o);
  if (r < 0 && g->st == ZCK_OK)
    g->st = zck__h5_fail(ZCK_ERR_FORMAT, "cannot read the attributes of %s", strcmp(name, ".") ? name : "/");
  return r < 0 ? -1 : 0;
}

zck_status zck__h5_attrs_digest(hid_t file, uint64_t *out) {
  zck__h5_digest g = {file, ".", 0, ZCK_OK};   /* "." as H5Ovisit names the root */
  herr_t r = zck__h5_digest_obj(file, ".", NULL, &g);
  if (g.st != ZCK_OK) return g.st;
  if (r < 0) return zck__h5_fail(ZCK_ERR_FORMAT, "walking the objects");
  *out = g.sum;
  return ZCK_OK;
}
