/* h5_probe.c: the forked child that reads an untrusted HDF5 file's metadata.
 *
 * libhdf5 trusts a file's metadata: fuzzing found a corrupt global-heap reference that
 * makes reading a variable-length string attribute segfault inside the library, a size
 * field that makes it ask malloc for terabytes, and one changed byte in an attribute
 * message that makes it read out of bounds (a crash, or under AddressSanitizer a report)
 * in one process while another, with another heap, survives it. Probing in a child and
 * then asking the library the same questions again in the parent is therefore not enough:
 * the child reads every piece of metadata the reader uses (every object reached by hard
 * links, every link of every group, every attribute as text and as numbers, the root's
 * attribute digest) and sends the answers back through a pipe (h5_meta.c keeps them). The
 * parent then opens only datasets, by the address the child opened them at, and reads
 * chunks the child looked up: it never decodes an attribute, link or group itself.
 *
 * With a lazy link (the universal container's "params": a group per param, holding 300k of
 * its 400k datasets), that group's links are listed but the objects they lead to are not
 * opened (an 'unread' record each): walking 100k groups and opening their datasets is
 * nearly all of the walk's cost, and a reader that only describes the file (inspect) needs
 * none of them. The parent walks again in full before it asks anything below one of those
 * (h5_read.c).
 *
 * If the child dies (a signal, a sanitizer report, the watchdog), the file is refused with
 * one line instead of taking the process down. The watchdog counts the child's CPU time,
 * not the clock: a looping structure burns CPU, while a machine too busy to run the child
 * only delays it (an intact file was once refused under load when the watchdog counted
 * wall time). A much longer wall-clock limit stays as a backstop for storage that stops
 * answering. Errors the library reports in the child are recorded, and the parent reports
 * them when it asks for that piece. */
#include "h5_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

/* Chunk index lookups the child makes per file: the parent looks chunks up as it reads
 * them, and a file with more chunks than this (4 TiB at 1 MiB a chunk) is read unguarded
 * beyond them. */
#define ZCK__H5P_MAX_CHUNK_LOOKUPS ((uint64_t)1 << 22)
/* CPU seconds without progress (one object, or 4096 chunk lookups) before the child gives
 * up: a loop in the library's metadata walk; the parent then refuses the file */
#define ZCK__H5P_CPU_S 60
/* wall seconds without progress: the file's storage stopped answering */
#define ZCK__H5P_WALL_S 900
/* queue flags: the lazy group; an object one of its links leads to (not opened) */
enum { ZCK__H5P_LAZY = 1, ZCK__H5P_UNREAD = 2 };

typedef struct {
  hid_t file;
  int fd;              /* the pipe; -1 when walking in-process */
  zck__buf out;        /* records not yet written */
  zck__buf *keep;      /* in-process: all records */
  uint64_t sent, limit;
  bool over, io_failed;
  uint64_t *queue;     /* object addresses, in visiting order */
  uint8_t *qflags;     /* per queued object: ZCK__H5P_LAZY, ZCK__H5P_UNREAD */
  size_t nqueue, capqueue;
  const char *lazy;    /* the root's link to the group whose links' objects are not opened */
  bool cur_root, cur_lazy;   /* the group whose links are being listed is the root / lazy one */
  uint64_t *seen;      /* open-addressing set of queued addresses (0: empty slot) */
  size_t capseen;
  uint64_t chunk_lookups;
  hid_t vstr[2];       /* variable-length text memory types by character set (made once) */
} zck__h5p;

// ---- records

static void zck__h5p_flush(zck__h5p *p, bool force) {
  if (p->fd < 0 || (!force && p->out.len < ((size_t)1 << 20))) return;
  const uint8_t *d = p->out.data;
  size_t n = p->out.len;
  while (n && !p->io_failed) {
    ssize_t w = write(p->fd, d, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) p->io_failed = true;
    else d += w, n -= (size_t)w;
  }
  p->out.len = 0;
}

static void zck__h5p_str(zck__h5p *p, const char *s, size_t n) {
  zck__buf_u32le(&p->out, (uint32_t)n);
  zck__buf_append(&p->out, s, n);
  zck__buf_byte(&p->out, 0);
}

/* Ends a record: counts it against the limit and writes full buffers out. */
static void zck__h5p_end(zck__h5p *p, size_t start) {
  p->sent += p->out.len - start;
  if (p->sent > p->limit) p->over = true;
  zck__h5p_flush(p, false);
}

/* The message of the HDF5 error just reported (clears the stack). */
static void zck__h5p_err(zck__h5p *p) {
  zck__h5_fail(ZCK_ERR_FORMAT, "-");
  const char *m = zck_last_error();
  if (!strncmp(m, "-: ", 3)) m += 3;
  else if (!strcmp(m, "-")) m = "the HDF5 library reports an error";
  zck__h5p_str(p, m, strlen(m));
  zck_clear_error();
}

// ---- objects

/* Arms the child's watchdogs afresh: they fire only when one step takes that long. */
static void zck__h5p_arm(void) {
  struct itimerval cpu = {.it_value = {.tv_sec = ZCK__H5P_CPU_S}};
  setitimer(ITIMER_PROF, &cpu, NULL);   /* SIGPROF, after that much user + system time */
  alarm(ZCK__H5P_WALL_S);
}

static void zck__h5p_progress(zck__h5p *p) {
  if (p->fd >= 0) zck__h5p_arm();
}

static bool zck__h5p_queue(zck__h5p *p, uint64_t addr, uint8_t flags) {
  if (addr == 0 || addr == HADDR_UNDEF) return false;
  if (2 * (p->nqueue + 1) > p->capseen) {
    size_t nc = p->capseen ? 2 * p->capseen : 1024;
    uint64_t *s = calloc(nc, sizeof *s);
    if (!s) _exit(3);
    for (size_t i = 0; i < p->capseen; i++) {
      if (!p->seen[i]) continue;
      size_t h = (size_t)(p->seen[i] * 0x9E3779B97F4A7C15ull) & (nc - 1);
      while (s[h]) h = (h + 1) & (nc - 1);
      s[h] = p->seen[i];
    }
    free(p->seen);
    p->seen = s;
    p->capseen = nc;
  }
  size_t h = (size_t)(addr * 0x9E3779B97F4A7C15ull) & (p->capseen - 1);
  while (p->seen[h]) {
    if (p->seen[h] == addr) return false;
    h = (h + 1) & (p->capseen - 1);
  }
  p->seen[h] = addr;
  if (p->nqueue == p->capqueue) {
    size_t nc = p->capqueue ? 2 * p->capqueue : 256;
    uint64_t *q = realloc(p->queue, nc * sizeof *q);
    if (!q) _exit(3);
    p->queue = q;
    uint8_t *qf = realloc(p->qflags, nc);
    if (!qf) _exit(3);
    p->qflags = qf;
    p->capqueue = nc;
  }
  p->qflags[p->nqueue] = flags;
  p->queue[p->nqueue++] = addr;
  return true;
}

/* A memory type for variable-length text in character set cs. */
static hid_t zck__h5p_vstr_type(H5T_cset_t cs) {
  hid_t mt = H5Tcopy(H5T_C_S1);
  if (mt >= 0 && (H5Tset_size(mt, H5T_VARIABLE) < 0 || H5Tset_cset(mt, cs) < 0)) {
    H5Tclose(mt);
    mt = H5I_INVALID_HID;
  }
  return mt;
}

/* One attribute: its class and count, and what the reader can ask of it (h5_meta.c):
 * a one-value text, or a one-value number as int64, uint64 and double. Attributes of
 * other shapes are still read with their own type, so that a crash in them happens here. */
static herr_t zck__h5p_attr(hid_t loc, const char *name, const H5A_info_t *info, void *ctx) {
  (void)info;
  zck__h5p *p = ctx;
  size_t start = p->out.len;
  zck__buf_byte(&p->out, 'A');
  zck__h5p_str(p, name, strlen(name));
  hid_t a = H5Aopen(loc, name, H5P_DEFAULT);
  hid_t t = a >= 0 ? H5Aget_type(a) : H5I_INVALID_HID, s = a >= 0 ? H5Aget_space(a) : H5I_INVALID_HID;
  hssize_t np = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
  H5T_class_t cls = t >= 0 ? H5Tget_class(t) : H5T_NO_CLASS;
  size_t size = t >= 0 ? H5Tget_size(t) : 0;
  unsigned flags = a < 0 || t < 0 || s < 0 || np < 0 ? ZCK__H5M_OPEN_ERR : 0;
  char *text = NULL;
  size_t text_len = 0;
  bool own_text = false, text_h5 = false;
  int64_t i64 = 0;
  uint64_t u64 = 0;
  double f64 = 0;
  char err[512] = "";
  if (flags) {
    /* nothing more to ask */
  } else if (np == 1 && cls == H5T_STRING) {
    if (H5Tis_variable_str(t) > 0) {
      /* its own character set: HDF5 converts none to another. One memory type per
       * character set for the whole walk (most attributes are text) */
      H5T_cset_t cs = H5Tget_cset(t);
      hid_t mt = H5I_INVALID_HID;
      bool own_mt = false;
      if (cs == H5T_CSET_ASCII || cs == H5T_CSET_UTF8) {
        if (p->vstr[cs] < 0) p->vstr[cs] = zck__h5p_vstr_type(cs);
        mt = p->vstr[cs];
      }
      if (mt < 0) {
        mt = zck__h5p_vstr_type(cs);
        own_mt = true;
      }
      char *v = NULL;
      if (H5Aread(a, mt, &v) < 0) {
        flags |= ZCK__H5M_STR_ERR;
      } else {
        flags |= ZCK__H5M_STR;
        text = v ? v : "";
        text_len = strlen(text);
        text_h5 = v != NULL;
      }
      if (own_mt && mt >= 0) H5Tclose(mt);
    } else if (size >= ZCK__H5M_MAX_FIXED_TEXT) {
      flags |= ZCK__H5M_STR_BIG;
    } else {
      /* fixed length, NUL- or space-padded (H-07) */
      text = calloc(size + 1, 1);
      if (!text) _exit(3);
      own_text = true;
      hid_t mt = H5Tcopy(t);
      if (H5Aread(a, mt, text) < 0) {
        flags |= ZCK__H5M_STR_ERR;
      } else {
        flags |= ZCK__H5M_STR;
        text_len = strnlen(text, size);
        if (H5Tget_strpad(t) == H5T_STR_SPACEPAD)
          while (text_len && text[text_len - 1] == ' ') text_len--;
      }
      H5Tclose(mt);
    }
  } else if (np == 1 && (cls == H5T_INTEGER || cls == H5T_FLOAT)) {
    flags |= H5Aread(a, H5T_NATIVE_INT64, &i64) >= 0 ? ZCK__H5M_I64 : ZCK__H5M_NUM_ERR;
    flags |= H5Aread(a, H5T_NATIVE_UINT64, &u64) >= 0 ? ZCK__H5M_U64 : ZCK__H5M_NUM_ERR;
    flags |= H5Aread(a, H5T_NATIVE_DOUBLE, &f64) >= 0 ? ZCK__H5M_F64 : ZCK__H5M_NUM_ERR;
  } else if (size && (uint64_t)np * size < ((uint64_t)1 << 30)) {
    void *buf = calloc((size_t)np + 1, size);
    if (buf && H5Aread(a, t, buf) >= 0 && (H5Tdetect_class(t, H5T_VLEN) > 0 || H5Tis_variable_str(t) > 0))
      H5Dvlen_reclaim(t, s, H5P_DEFAULT, buf);
    free(buf);
  }
  if (flags & (ZCK__H5M_STR_ERR | ZCK__H5M_NUM_ERR | ZCK__H5M_OPEN_ERR)) {
    zck__h5_fail(ZCK_ERR_FORMAT, "-");
    const char *m = zck_last_error();
    snprintf(err, sizeof err, "%s", !strncmp(m, "-: ", 3) ? m + 3 : "the HDF5 library reports an error");
    zck_clear_error();
  }
  zck__buf_byte(&p->out, (uint8_t)flags);
  zck__buf_u32le(&p->out, (uint32_t)cls);
  zck__buf_u64le(&p->out, (uint64_t)np);
  zck__buf_u64le(&p->out, (uint64_t)i64);
  zck__buf_u64le(&p->out, u64);
  uint64_t fb;
  memcpy(&fb, &f64, sizeof fb);
  zck__buf_u64le(&p->out, fb);
  zck__h5p_str(p, text ? text : "", text ? text_len : 0);
  zck__h5p_str(p, err, strlen(err));
  if (text_h5) H5free_memory(text);
  if (own_text) free(text);
  if (s >= 0) H5Sclose(s);
  if (t >= 0) H5Tclose(t);
  if (a >= 0) H5Aclose(a);
  H5Eclear2(H5E_DEFAULT);
  zck__h5p_end(p, start);
  return p->over ? -1 : 0;
}

static herr_t zck__h5p_link(hid_t g, const char *name, const H5L_info_t *info, void *ctx) {
  (void)g;
  zck__h5p *p = ctx;
  size_t start = p->out.len;
  bool hard = info->type == H5L_TYPE_HARD;
  zck__buf_byte(&p->out, 'L');
  zck__h5p_str(p, name, strlen(name));
  zck__buf_byte(&p->out, hard ? 1 : 0);
  zck__buf_u64le(&p->out, hard ? (uint64_t)info->u.address : 0);
  if (hard) {
    /* the lazy group is walked; what its links lead to is not opened */
    uint8_t flags = p->cur_lazy ? ZCK__H5P_UNREAD : 0;
    if (p->cur_root && p->lazy && !strcmp(name, p->lazy)) flags = ZCK__H5P_LAZY;
    zck__h5p_queue(p, info->u.address, flags);
  }
  zck__h5p_end(p, start);
  return p->over ? -1 : 0;
}

/* A dataset's header as zck_h5_dataset_open uses it (record 'S', h5_meta.c), and every
 * chunk looked up as the chunk reads do: asked here first, on the same object. */
static void zck__h5p_dataset(zck__h5p *p, hid_t o) {
  size_t start = p->out.len;
  hid_t sp = H5Dget_space(o), pl = H5Dget_create_plist(o), ty = H5Dget_type(o);
  int nd = -1;
  hsize_t dims[32] = {0}, cd[32] = {0};
  int lay = -1, cnd = -1;
  zck__buf_byte(&p->out, 'S');
  if (sp < 0 || pl < 0 || ty < 0) {
    zck__buf_byte(&p->out, 0);
    zck__h5p_err(p);
  } else {
    zck__buf_byte(&p->out, 1);
    zck_dtype dt = zck__h5_dtype_of(ty);
    zck__buf_u32le(&p->out, (uint32_t)dt);
    zck__buf_u32le(&p->out, (uint32_t)H5Tget_class(ty));
    zck__buf_u64le(&p->out, (uint64_t)H5Tget_size(ty));
    H5S_class_t sc = H5Sget_simple_extent_type(sp);
    nd = sc == H5S_SCALAR ? 0 : H5Sget_simple_extent_ndims(sp);
    if (nd > 32 || (nd > 0 && H5Sget_simple_extent_dims(sp, dims, NULL) != nd)) nd = -1;
    zck__buf_u32le(&p->out, (uint32_t)sc);
    zck__buf_u32le(&p->out, (uint32_t)nd);
    for (int i = 0; i < nd; i++) zck__buf_u64le(&p->out, dims[i]);
    lay = (int)H5Pget_layout(pl);
    zck__buf_u32le(&p->out, (uint32_t)lay);
    H5Eclear2(H5E_DEFAULT);
    if (lay == H5D_CHUNKED && nd >= 0) cnd = H5Pget_chunk(pl, nd, cd);
    zck__buf_u32le(&p->out, (uint32_t)cnd);
    for (int i = 0; i < cnd && i < 32; i++) zck__buf_u64le(&p->out, cd[i]);
    if (lay == H5D_CHUNKED && cnd != nd) zck__h5p_err(p);
    else zck__h5p_str(p, "", 0);
    zck__buf_u32le(&p->out, (uint32_t)H5Pget_external_count(pl));
    int nf = H5Pget_nfilters(pl);
    zck__buf_u32le(&p->out, (uint32_t)nf);
    for (int i = 0; i < nf && i < ZCK__H5M_MAX_FILTERS; i++) {
      unsigned flags = 0, cdv[8] = {0}, cfg = 0;
      size_t ncd = 8;
      char fname[64] = "";
      H5Z_filter_t id = H5Pget_filter2(pl, (unsigned)i, &flags, &ncd, cdv, sizeof fname, fname, &cfg);
      fname[sizeof fname - 1] = 0;
      zck__buf_u32le(&p->out, (uint32_t)id);
      zck__buf_u32le(&p->out, flags);
      zck__buf_u32le(&p->out, ncd > 0 ? cdv[0] : (uint32_t)-1);
      zck__h5p_str(p, fname, strlen(fname));
    }
    H5D_fill_value_t fv;
    unsigned char fill[16];
    size_t fl = 0;
    if (H5Pfill_value_defined(pl, &fv) >= 0 && fv == H5D_FILL_VALUE_USER_DEFINED && H5Tget_size(ty) <= sizeof fill &&
        H5Pget_fill_value(pl, ty, fill) >= 0)
      fl = H5Tget_size(ty);
    zck__buf_byte(&p->out, (uint8_t)fl);
    zck__buf_append(&p->out, fill, fl);
  }
  H5Eclear2(H5E_DEFAULT);
  zck__h5p_end(p, start);
  if (lay == H5D_CHUNKED && nd > 0 && cnd == nd) {
    /* every chunk in row-major order, looked up by its offset as the reader does */
    hsize_t n[32], idx[32] = {0}, off[32];
    bool any = true;
    for (int i = 0; i < nd; i++) {
      if (!cd[i]) any = false;
      n[i] = cd[i] ? (dims[i] + cd[i] - 1) / cd[i] : 0;
      if (!n[i]) any = false;
    }
    while (any && p->chunk_lookups < ZCK__H5P_MAX_CHUNK_LOOKUPS) {
      for (int i = 0; i < nd; i++) off[i] = idx[i] * cd[i];
      hsize_t nbytes = 0;
      if (H5Dget_chunk_storage_size(o, off, &nbytes) < 0) break;
      if (++p->chunk_lookups % 4096 == 0) zck__h5p_progress(p);
      int i = nd - 1;
      for (; i >= 0; i--) {
        if (++idx[i] < n[i]) break;
        idx[i] = 0;
      }
      if (i < 0) break;
    }
  }
  if (ty >= 0) H5Tclose(ty);
  if (pl >= 0) H5Pclose(pl);
  if (sp >= 0) H5Sclose(sp);
}

static void zck__h5p_object(zck__h5p *p, uint64_t addr, uint8_t flags) {
  zck__h5p_progress(p);
  size_t start = p->out.len;
  if (flags & ZCK__H5P_UNREAD) {
    zck__buf_byte(&p->out, 'T');
    zck__buf_u64le(&p->out, addr);
    zck__h5p_end(p, start);
    return;
  }
  hid_t o = H5Oopen_by_addr(p->file, (haddr_t)addr);
  /* the object's type from the id opening it made (H5Oget_info2 would read its header
   * again and count its attributes) */
  int type = -1;
  switch (o >= 0 ? H5Iget_type(o) : H5I_BADID) {
  case H5I_GROUP: type = H5O_TYPE_GROUP; break;
  case H5I_DATASET: type = H5O_TYPE_DATASET; break;
  case H5I_DATATYPE: type = H5O_TYPE_NAMED_DATATYPE; break;
  default: break;
  }
  zck__buf_byte(&p->out, 'O');
  zck__buf_u64le(&p->out, addr);
  zck__buf_u32le(&p->out, (uint32_t)(type + 1));
  zck__h5p_end(p, start);
  if (type < 0) {
    start = p->out.len;
    zck__buf_byte(&p->out, 'o');
    zck__h5p_err(p);
    zck__h5p_end(p, start);
    if (o >= 0) H5Oclose(o);
    return;
  }
  hsize_t idx = 0;
  if (H5Aiterate2(o, H5_INDEX_NAME, H5_ITER_INC, &idx, zck__h5p_attr, p) < 0 && !p->over) {
    start = p->out.len;
    zck__buf_byte(&p->out, 'a');
    zck__h5p_err(p);
    zck__h5p_end(p, start);
  }
  if (type == H5O_TYPE_GROUP && !p->over) {
    idx = 0;
    p->cur_lazy = flags & ZCK__H5P_LAZY;
    p->cur_root = addr == p->queue[0];
    if (H5Literate(o, H5_INDEX_NAME, H5_ITER_INC, &idx, zck__h5p_link, p) < 0 && !p->over) {
      start = p->out.len;
      zck__buf_byte(&p->out, 'l');
      zck__h5p_err(p);
      zck__h5p_end(p, start);
    }
  } else if (type == H5O_TYPE_DATASET) {
    zck__h5p_dataset(p, o);
  }
  H5Oclose(o);
  H5Eclear2(H5E_DEFAULT);
}

/* Walks the file (the records of h5_meta.c), ending with 'E'; false if writing failed. */
static bool zck__h5p_walk(zck__h5p *p, const char *path) {
  H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
  /* the parent's own first steps, in its order */
  htri_t is = H5Fis_hdf5(path);
  p->file = is > 0 ? zck__h5_open_ro(path) : H5I_INVALID_HID;
  hsize_t fsize = 0;
  if (p->file >= 0) H5Fget_filesize(p->file, &fsize);
  /* a legitimate file's metadata is in it: its records take about as many bytes */
  p->limit = 2 * (uint64_t)fsize + ((uint64_t)16 << 20);
  if (p->file < 0) {
    zck__buf_byte(&p->out, 'F');
  } else {
    hid_t root = H5Oopen(p->file, "/", H5P_DEFAULT);
    H5O_info_t info;
    if (root >= 0 && H5Oget_info2(root, &info, H5O_INFO_BASIC) >= 0) zck__h5p_queue(p, info.addr, 0);
    if (root >= 0) H5Oclose(root);
    for (size_t i = 0; i < p->nqueue && !p->over; i++) zck__h5p_object(p, p->queue[i], p->qflags[i]);
    zck__h5p_progress(p);
    uint64_t sum = 0;
    size_t start = p->out.len;
    if (!p->over) {
      zck__buf_byte(&p->out, 'D');
      if (zck__h5_attrs_digest(p->file, &sum) == ZCK_OK) {
        zck__buf_byte(&p->out, 1);
        zck__buf_u64le(&p->out, sum);
      } else {
        zck__buf_byte(&p->out, 0);
        const char *m = zck_last_error();
        zck__h5p_str(p, m, strlen(m));
        zck_clear_error();
      }
      zck__h5p_end(p, start);
    }
    /* the child ends with _exit: closing a read-only file there (evicting every cached
     * object) is work nobody waits for */
    if (p->fd < 0) H5Fclose(p->file);
    H5Eclear2(H5E_DEFAULT);
  }
  if (p->over) zck__buf_byte(&p->out, 'X');
  zck__buf_byte(&p->out, 'E');
  free(p->queue);
  free(p->qflags);
  free(p->seen);
  for (int i = 0; i < 2; i++)
    if (p->vstr[i] >= 0) H5Tclose(p->vstr[i]);
  if (p->out.failed) return false;
  if (p->keep) {
    *p->keep = p->out;
    return true;
  }
  zck__h5p_flush(p, true);
  zck__buf_free(&p->out);
  return !p->io_failed;
}

/* AddressSanitizer, as gcc (__SANITIZE_ADDRESS__) and clang (__has_feature) say it: under
 * it the child keeps an unlimited address space (clang's fuzz builds had every file
 * refused as a crash: the shadow mapping failed under the limit). */
#if defined(__SANITIZE_ADDRESS__)
#define ZCK__H5P_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ZCK__H5P_ASAN 1
#endif
#endif
#ifndef ZCK__H5P_ASAN
#define ZCK__H5P_ASAN 0
#endif

zck_status zck__h5_probe(const char *path, const char *lazy, zck__buf *records) {
  zck__buf_init(records);
  zck__h5p p;
  memset(&p, 0, sizeof p);
  p.lazy = lazy;
  zck__buf_init(&p.out);
  p.fd = -1;
  p.vstr[0] = p.vstr[1] = H5I_INVALID_HID;
  if (getenv("ZCK_H5_NO_PROBE")) {
    /* in-process, unguarded: for debugging the walk itself */
    p.keep = records;
    zck__h5_lock();
    bool ok = zck__h5p_walk(&p, path);
    zck__h5_unlock();
    return ok ? ZCK_OK : zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  }
  int fds[2];
  if (pipe(fds) < 0) return zck__fail(ZCK_ERR_IO, "%s: cannot check the HDF5 metadata (pipe: %s)", path, strerror(errno));
  fflush(NULL);
  /* under the HDF5 lock: no other thread of ours is inside the library, whose own lock the
   * child would otherwise inherit held */
  zck__h5_lock();
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    zck__h5p_arm();
    int devnull = open("/dev/null", O_WRONLY); /* the child's reports are not the user's */
    if (devnull >= 0) dup2(devnull, 2);
#if !ZCK__H5P_ASAN
    /* terabyte mallocs fail fast (AddressSanitizer needs its huge shadow mapping, and
     * reports such mallocs itself) */
    struct rlimit as = {(rlim_t)8 << 30, (rlim_t)8 << 30};
    setrlimit(RLIMIT_AS, &as);
#endif
    p.fd = fds[1];
    _exit(zck__h5p_walk(&p, path) ? 0 : 2);
  }
  int fork_errno = errno;
  zck__h5_unlock();
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return zck__fail(ZCK_ERR_IO, "%s: cannot check the HDF5 metadata (fork: %s)", path, strerror(fork_errno));
  }
  /* read everything before waiting: the child blocks on a full pipe */
  uint8_t tmp[1 << 16];
  bool oom = false;
  for (;;) {
    ssize_t r = read(fds[0], tmp, sizeof tmp);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (!oom) {
      zck__buf_append(records, tmp, (size_t)r);
      oom = records->failed;
    }
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  zck_status st = ZCK_OK;
  /* anything but exit 0 is a crash (a signal, or a sanitizer runtime that turned one into
   * an exit status); exit 2 the pipe or out of memory */
  if (WIFSIGNALED(status) && WTERMSIG(status) == SIGPROF)   /* a looping structure */
    st = zck__fail(ZCK_ERR_FORMAT, "%s: corrupt HDF5 metadata: one step of reading it ran over %d s of CPU time (a loop)",
                   path, ZCK__H5P_CPU_S);
  else if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)   /* storage that does not answer */
    st = zck__fail(ZCK_ERR_IO, "%s: HDF5 metadata not checked: one step of reading it waited over %d s for the storage",
                   path, ZCK__H5P_WALL_S);
  else if (WIFSIGNALED(status))
    st = zck__fail(ZCK_ERR_FORMAT, "%s: corrupt HDF5 metadata: the HDF5 library crashed reading it (signal %d)", path,
                   WTERMSIG(status));
  else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    st = zck__fail(ZCK_ERR_FORMAT, "%s: corrupt HDF5 metadata: the HDF5 library crashed reading it (exit %d)", path,
                   WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  else if (oom)
    st = zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory for the HDF5 metadata", path);
  if (st != ZCK_OK) zck__buf_free(records);
  return st;
}
