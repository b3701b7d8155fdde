/* test.h: assertions that never compile out and print both values (the libuv habit).
 * A test returns 0 on success, calls zt_skip() (exit 77) when it cannot run here. */
#ifndef ZCK_TEST_H
#define ZCK_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zck.h"

#define ZT_FAIL(...) do { fprintf(stderr, "%s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr); exit(1); } while (0)
#define ZT_ASSERT(c) do { if (!(c)) ZT_FAIL("assertion failed: %s", #c); } while (0)
#define ZT_EQ_INT(a, b) do { long long zt_a = (long long)(a), zt_b = (long long)(b); \
    if (zt_a != zt_b) ZT_FAIL("%s == %s: %lld != %lld", #a, #b, zt_a, zt_b); } while (0)
#define ZT_EQ_U64(a, b) do { unsigned long long zt_a = (unsigned long long)(a), zt_b = (unsigned long long)(b); \
    if (zt_a != zt_b) ZT_FAIL("%s == %s: %llu != %llu", #a, #b, zt_a, zt_b); } while (0)
#define ZT_EQ_STR(a, b) do { const char *zt_a = (a), *zt_b = (b); \
    if (!zt_a || !zt_b || strcmp(zt_a, zt_b)) ZT_FAIL("%s == %s: \"%s\" != \"%s\"", #a, #b, zt_a ? zt_a : "(null)", zt_b ? zt_b : "(null)"); } while (0)
#define ZT_EQ_MEM(a, b, n) do { if (memcmp((a), (b), (n))) ZT_FAIL("%s and %s differ in their %zu bytes", #a, #b, (size_t)(n)); } while (0)
/* A call that must succeed; prints the library's message if not. */
#define ZT_OK(expr) do { zck_status zt_s = (expr); if (zt_s != ZCK_OK) \
    ZT_FAIL("%s failed: %s: %s", #expr, zck_status_name(zt_s), zck_last_error()); } while (0)
/* A call that must fail with this status and a message containing `needle`. */
#define ZT_ERR(expr, status, needle) do { zck_status zt_s = (expr); \
    if (zt_s != (status)) ZT_FAIL("%s: expected %s, got %s (%s)", #expr, zck_status_name(status), zck_status_name(zt_s), zck_last_error()); \
    if ((needle) && !strstr(zck_last_error(), (needle))) ZT_FAIL("%s: message \"%s\" lacks \"%s\"", #expr, zck_last_error(), (const char *)(needle)); \
  } while (0)

static inline void zt_skip(const char *why) {
  fprintf(stderr, "SKIP: %s\n", why);
  exit(77);
}

/* Test helpers (tests/common/test_util.c) */
const char *zt_fixtures(void);                /* $ZCK_FIXTURES or the source tree's */
char *zt_fixture(const char *rel);            /* malloc'd path under fixtures */
char *zt_tmpdir(void);                        /* a fresh directory under $TMPDIR, removed at exit */
int zt_read_file(const char *path, unsigned char **data, size_t *n);
int zt_write_file(const char *path, const void *data, size_t n);

#endif
