/* exec_store.c: the executor's access to a bound store (exec.h): read, write and prefetch
 * element ranges of memory, a source region, a file descriptor or a callback. */
#include "exec_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>

const char *zck__store_label(const zck_store *s, char *buf, size_t cap, const char *side, uint32_t id) {
  if (s->name) return s->name;
  snprintf(buf, cap, "%s store %u", side, id);
  return buf;
}

/* Reads count elements at element off into dst (in the store's dtype). */
zck_status zck__store_read(const zck_store *s, uint32_t id, void *dst, uint64_t off, uint64_t count) {
  size_t es = zck_dtype_size(s->dtype);
  size_t nb = (size_t)(count * es);
  char lb[64];
  switch (s->kind) {
  case ZCK_STORE_MEMORY: memcpy(dst, (const uint8_t *)s->mem + off * es, nb); return ZCK_OK;
  case ZCK_STORE_SOURCE: return zck__source_read(s->source, dst, nb, s->base + off * es);
  case ZCK_STORE_FD: return zck__pread_all(s->fd, dst, nb, s->base + off * es, zck__store_label(s, lb, sizeof lb, "source", id));
  case ZCK_STORE_CALLBACK: {
    zck_status st = s->read(s->ctx, dst, off, count);
    if (st != ZCK_OK && s->name) return zck__error_prepend(st, "%s", s->name);
    return st;
  }
  default: return zck__fail(ZCK_ERR_INTERNAL, "reading an unbound store");
  }
}

/* Asks the kernel to start reading elements [off, off + count) of a file store now, so the
 * disk fetches the next piece while this thread checks, converts and writes the one it
 * has: the checks then cost CPU beside the I/O, not after it. A hint: nothing fails. */
void zck__store_prefetch(const zck_store *s, uint64_t off, uint64_t count) {
#ifdef POSIX_FADV_WILLNEED
  size_t es = zck_dtype_size(s->dtype);
  int fd = -1;
  uint64_t at = s->base + off * es;
  if (s->kind == ZCK_STORE_SOURCE && s->source->fd >= 0) fd = s->source->fd, at += s->source->base;
  else if (s->kind == ZCK_STORE_FD) fd = s->fd;
  if (fd >= 0 && count) (void)posix_fadvise(fd, (off_t)at, (off_t)(count * es), POSIX_FADV_WILLNEED);
#else
  (void)s, (void)off, (void)count;
#endif
}

zck_status zck__store_write(const zck_store *s, uint32_t id, const void *src, uint64_t off, uint64_t count) {
  size_t es = zck_dtype_size(s->dtype);
  size_t nb = (size_t)(count * es);
  char lb[64];
  switch (s->kind) {
  case ZCK_STORE_MEMORY: memmove((uint8_t *)s->mem + off * es, src, nb); return ZCK_OK;
  case ZCK_STORE_FD: return zck__pwrite_all(s->fd, src, nb, s->base + off * es, zck__store_label(s, lb, sizeof lb, "target", id));
  case ZCK_STORE_CALLBACK: {
    zck_status st = s->write(s->ctx, src, off, count);
    if (st != ZCK_OK && s->name) return zck__error_prepend(st, "%s", s->name);
    return st;
  }
  default: return zck__fail(ZCK_ERR_INTERNAL, "writing a store that cannot be written");
  }
}
