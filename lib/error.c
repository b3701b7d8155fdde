/* error.c: thread-local error messages and status names. */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZCK__ERRMSG_MAX 1024
static __thread char zck__errmsg[ZCK__ERRMSG_MAX];

const char *zck_last_error(void) { return zck__errmsg; }
void zck_clear_error(void) { zck__errmsg[0] = 0; }
const char *zck_version(void) { return ZCK_VERSION_STRING; }

const char *zck_status_name(zck_status s) {
  switch (s) {
  case ZCK_OK: return "ok";
  case ZCK_ERR_INVALID_ARG: return "invalid argument";
  case ZCK_ERR_IO: return "I/O error";
  case ZCK_ERR_NOT_FOUND: return "not found";
  case ZCK_ERR_FORMAT: return "format error";
  case ZCK_ERR_TRUNCATED: return "truncated";
  case ZCK_ERR_UNSUPPORTED: return "unsupported";
  case ZCK_ERR_LIMIT: return "limit exceeded";
  case ZCK_ERR_MISMATCH: return "mismatch";
  case ZCK_ERR_NO_MEMORY: return "out of memory";
  case ZCK_ERR_NO_SPACE: return "no space left";
  case ZCK_ERR_EXISTS: return "already exists";
  case ZCK_ERR_DAMAGED: return "damaged";
  case ZCK_ERR_NO_DEVICE: return "no device";
  case ZCK_ERR_INTERNAL: return "internal error";
  case ZCK_ERR_CANCELED: return "canceled";
  }
  return "unknown status";
}

zck_status zck__fail(zck_status s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(zck__errmsg, sizeof zck__errmsg, fmt, ap);
  va_end(ap);
  return s;
}

zck_status zck__fail_errno(int e, const char *fmt, ...) {
  char what[ZCK__ERRMSG_MAX - 128];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof what, fmt, ap);
  va_end(ap);
  snprintf(zck__errmsg, sizeof zck__errmsg, "%.*s: %.100s", (int)(ZCK__ERRMSG_MAX - 128), what, strerror(e));
  if (e == ENOSPC || e == EDQUOT) return ZCK_ERR_NO_SPACE;
  if (e == ENOENT) return ZCK_ERR_NOT_FOUND;
  if (e == EEXIST) return ZCK_ERR_EXISTS;
  if (e == ENOMEM) return ZCK_ERR_NO_MEMORY;
  return ZCK_ERR_IO;
}

zck_status zck__error_prepend(zck_status s, const char *fmt, ...) {
  char ctx[ZCK__ERRMSG_MAX];
  char old[ZCK__ERRMSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(ctx, sizeof ctx, fmt, ap);
  va_end(ap);
  memcpy(old, zck__errmsg, sizeof old);
  /* keep as much of both as fits; truncation is acceptable for a message */
  size_t n = strlen(ctx);
  if (n > sizeof zck__errmsg - 3) n = sizeof zck__errmsg - 3;
  memcpy(zck__errmsg, ctx, n);
  memcpy(zck__errmsg + n, ": ", 2);
  size_t room = sizeof zck__errmsg - n - 3, m = strlen(old);
  if (m > room) m = room;
  memcpy(zck__errmsg + n + 2, old, m);
  zck__errmsg[n + 2 + m] = 0;
  return s;
}

void zck__abort(const char *file, int line, const char *what) {
  fprintf(stderr, "zckpt: internal error at %s:%d: %s\n", file, line, what);
  abort();
}
