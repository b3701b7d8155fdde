/* io_source.c: bounds-checked random-access inputs (a file read with pread, a memory
 * buffer, a window of either), and small whole files. See io.h. */
#include "io.h"
#include "dist.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

zck_status zck__source_open(zck__source *src, const char *path) {
  memset(src, 0, sizeof *src);
  src->fd = -1;
  int fe = zck__io_fault(ZCK_IO_OP_OPEN);
  if (fe) return zck__fail_errno(fe, "%s: cannot open", path);
  /* O_NONBLOCK: opening a FIFO for reading would wait for a writer for ever; it is
   * refused below, as every other non-regular file (a device reads without end) */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return zck__fail_errno(errno, "%s: cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return zck__fail_errno(e, "%s: cannot stat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: is a directory, expected a file", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: not a regular file (a FIFO, socket or device), expected a file", path);
  }
  src->name = zck__strdup(path);
  if (!src->name) { close(fd); return ZCK_ERR_NO_MEMORY; }
  src->fd = fd;
  src->size = (uint64_t)st.st_size;
  return ZCK_OK;
}

void zck__source_memory(zck__source *src, const char *name, const void *data, uint64_t size) {
  memset(src, 0, sizeof *src);
  src->fd = -1;
  src->name = zck__strdup(name ? name : "<memory>");
  src->mem = data;
  src->size = size;
}

zck_status zck__source_window(zck__source *win, const zck__source *parent, uint64_t off, uint64_t size,
                              const char *name) {
  memset(win, 0, sizeof *win);
  win->fd = -1;
  uint64_t end;
  if (!zck__add_u64(off, size, &end) || end > parent->size)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: bytes %llu..%llu lie past its end (%llu bytes)", parent->name,
                     (unsigned long long)off, (unsigned long long)off + size, (unsigned long long)parent->size);
  win->name = zck__strdup(name ? name : parent->name);
  if (!win->name) return ZCK_ERR_NO_MEMORY;
  win->fd = parent->fd;
  win->mem = parent->mem;
  win->base = parent->base + off;
  win->size = size;
  win->window = true;
  return ZCK_OK;
}

zck_status zck__source_read(const zck__source *src, void *dst, size_t n, uint64_t off) {
  uint64_t end;
  if (!zck__add_u64(off, n, &end) || end > src->size)
    return zck__fail(ZCK_ERR_TRUNCATED, "%s: truncated: need bytes %llu..%llu but the file has %llu",
                     src->name, (unsigned long long)off, (unsigned long long)off + n, (unsigned long long)src->size);
  off += src->base;
  /* a node-local checkpoint's file another node holds: only its metadata is here */
  if (src->fd >= 0 && zck__dist_has_stubs()) ZCK_TRY(zck__dist_check_read(src->fd, src->name, off, n));
  if (!n) return ZCK_OK;
  if (src->mem) {
    memcpy(dst, src->mem + off, n);
    return ZCK_OK;
  }
  return zck__pread_all(src->fd, dst, n, off, src->name);
}

const uint8_t *zck__source_peek(const zck__source *src, uint64_t off, uint64_t n) {
  uint64_t end;
  if (!src->mem || !zck__add_u64(off, n, &end) || end > src->size) return NULL;
  return src->mem + src->base + off;
}

void zck__source_close(zck__source *src) {
  if (!src) return;
  if (src->fd >= 0 && !src->window) close(src->fd);
  free(src->name);
  memset(src, 0, sizeof *src);
  src->fd = -1;
}

zck_status zck__read_small_file(const char *path, size_t max, char **out, size_t *len) {
  zck__source src;
  *out = NULL;
  ZCK_TRY(zck__source_open(&src, path));
  if (src.size > max) {
    uint64_t size = src.size; /* close zeroes src */
    zck__source_close(&src);
    return zck__fail(ZCK_ERR_LIMIT, "%s: %llu bytes, more than the %zu expected", path, (unsigned long long)size, max);
  }
  char *buf = zck__malloc((size_t)src.size + 1);
  if (!buf) { zck__source_close(&src); return ZCK_ERR_NO_MEMORY; }
  zck_status s = zck__source_read(&src, buf, (size_t)src.size, 0);
  if (s == ZCK_OK) {
    buf[src.size] = 0;
    if (len) *len = (size_t)src.size;
    *out = buf;
  } else {
    free(buf);
  }
  zck__source_close(&src);
  return s;
}
