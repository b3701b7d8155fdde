/* rs_util.h: helpers of the reshard tests: compare folders file by file, copy trees, run
 * shell steps, check that a failed run left nothing behind. */
#ifndef ZCK_RS_UTIL_H
#define ZCK_RS_UTIL_H

#include <dirent.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "test.h"

static inline void rs_sh(const char *fmt, ...) {
  char cmd[16384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof cmd, fmt, ap);
  va_end(ap);
  if (system(cmd) != 0) ZT_FAIL("command failed: %s", cmd);
}

static inline char *rs_path(const char *fmt, ...) {
  char buf[8192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return strdup(buf);
}

static inline bool rs_exists(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0;
}

static int rs_cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The regular files of dir, sorted (names malloc'd). */
static inline char **rs_list(const char *dir, size_t *n) {
  DIR *d = opendir(dir);
  if (!d) ZT_FAIL("cannot list %s", dir);
  char **v = NULL;
  *n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    v = realloc(v, (*n + 1) * sizeof *v);
    v[(*n)++] = strdup(e->d_name);
  }
  closedir(d);
  if (*n) qsort(v, *n, sizeof *v, rs_cmp_name);
  return v;
}

static inline void rs_free_list(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

/* Folders a and b hold the same entries, each file byte for byte (subfolders compared too). */
static inline void rs_same_tree(const char *a, const char *b, const char *what) {
  size_t na, nb;
  char **la = rs_list(a, &na), **lb = rs_list(b, &nb);
  if (na != nb) ZT_FAIL("%s: %s has %zu entries, %s has %zu", what, a, na, b, nb);
  for (size_t i = 0; i < na; i++) {
    if (strcmp(la[i], lb[i])) ZT_FAIL("%s: %s/%s vs %s/%s", what, a, la[i], b, lb[i]);
    char *pa = rs_path("%s/%s", a, la[i]), *pb = rs_path("%s/%s", b, lb[i]);
    struct stat st;
    ZT_ASSERT(stat(pa, &st) == 0);
    if (S_ISDIR(st.st_mode)) {
      rs_same_tree(pa, pb, what);
    } else {
      unsigned char *x, *y;
      size_t nx, ny;
      ZT_ASSERT(zt_read_file(pa, &x, &nx) == 0 && zt_read_file(pb, &y, &ny) == 0);
      if (nx != ny || memcmp(x, y, nx)) ZT_FAIL("%s: %s and %s differ", what, pa, pb);
      free(x);
      free(y);
    }
    free(pa);
    free(pb);
  }
  rs_free_list(la, na);
  rs_free_list(lb, nb);
}

/* After a refused request: nothing at out, and its parent holds only `keep` entries. */
static inline void rs_nothing_left(const char *out) {
  if (rs_exists(out)) ZT_FAIL("%s exists after a failed reshard", out);
  char *parent = strdup(out);
  char *slash = strrchr(parent, '/');
  if (slash) *slash = 0;
  size_t n;
  char **v = rs_list(parent, &n);
  const char *base = strrchr(out, '/') ? strrchr(out, '/') + 1 : out;
  for (size_t i = 0; i < n; i++)
    if (strstr(v[i], base) && strcmp(v[i], base)) ZT_FAIL("%s: left behind: %s", parent, v[i]);
  rs_free_list(v, n);
  free(parent);
}

#endif
