/* error.h: how errors travel inside libzckpt.
 *
 * A failing function records one line in a thread-local buffer and returns a status:
 *     return zck__fail(ZCK_ERR_FORMAT, "%s: header length %llu exceeds file size", path, n);
 * A caller that adds context prepends it, so the user sees "FILE: TENSOR: what is wrong":
 *     ZCK_TRY_CTX(read_tensor(...), "%s", name);
 */
#ifndef ZCK_ERROR_H
#define ZCK_ERROR_H

#include "zck.h"

#if defined(__GNUC__)
#define ZCK__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ZCK__PRINTF(a, b)
#endif

/* Records a message and returns s. */
zck_status zck__fail(zck_status s, const char *fmt, ...) ZCK__PRINTF(2, 3);
/* Records "<strerror(errno_value)>" style I/O failures, mapping ENOSPC/EDQUOT to NO_SPACE. */
zck_status zck__fail_errno(int errno_value, const char *fmt, ...) ZCK__PRINTF(2, 3);
/* Prepends "<context>: " to the current message. Returns s unchanged. */
zck_status zck__error_prepend(zck_status s, const char *fmt, ...) ZCK__PRINTF(2, 3);

/* Evaluate, and on failure return the status (the message is already set). */
#define ZCK_TRY(expr) do { zck_status zck__s = (expr); if (zck__s != ZCK_OK) return zck__s; } while (0)
/* Same, prepending context to the message. */
#define ZCK_TRY_CTX(expr, ...) do { zck_status zck__s = (expr); \
    if (zck__s != ZCK_OK) return zck__error_prepend(zck__s, __VA_ARGS__); } while (0)
/* Set st and jump to the cleanup label on failure (the NCCL/libuv breadcrumb style). */
#define ZCK_CHECK_GOTO(expr, st, label) do { (st) = (expr); if ((st) != ZCK_OK) goto label; } while (0)
/* Fail with a message when cond holds. */
#define ZCK_FAIL_IF(cond, status, ...) do { if (cond) return zck__fail((status), __VA_ARGS__); } while (0)

/* API misuse (not bad input): abort with a message. Never compiled out. */
#define ZCK_ASSERT(cond) do { if (!(cond)) zck__abort(__FILE__, __LINE__, #cond); } while (0)
void zck__abort(const char *file, int line, const char *what) __attribute__((noreturn));

#endif
