/* cli.c: error printing, size parsing and the progress bar shared by subcommands. */
#include "cli.h"

#include <ctype.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

int zck_cli_error(const char *fmt, ...) {
  va_list ap;
  fputs("zckpt: error: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  return ZCK_EXIT_ERROR;
}

int zck_cli_fail(zck_status s) {
  const char *msg = zck_last_error();
  if (!msg[0]) msg = zck_status_name(s);
  return zck_cli_error("%s", msg);
}

int zck_cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "zckpt%s%s: ", cmd ? " " : "", cmd ? cmd : "");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see 'zckpt%s%s --help')\n", cmd ? " " : "", cmd ? cmd : "");
  return ZCK_EXIT_USAGE;
}

bool zck_cli_parse_size(const char *s, uint64_t *out) {
  char *end;
  if (!s || !*s || !isdigit((unsigned char)*s)) return false;
  double v = strtod(s, &end);
  if (end == s || !isfinite(v) || v < 0) return false;
  while (*end == ' ') end++;
  static const struct { const char *unit; double mul; } units[] = {
    {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
    {"KIB", 1024.0}, {"MIB", 1048576.0}, {"GIB", 1073741824.0}, {"TIB", 1099511627776.0},
    {"K", 1e3}, {"M", 1e6}, {"G", 1e9}, {"T", 1e12},
  };
  for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
    if (strcasecmp(end, units[i].unit) == 0) {
      double b = v * units[i].mul;
      if (b >= 1.8e19) return false;
      *out = (uint64_t)b;
      return true;
    }
  }
  return false;
}

int zck_cli_opt_threads(const char *cmd, const char *arg, unsigned *out) {
  char *end;
  long n = strtol(arg, &end, 10);
  if (end == arg || *end || n < 1 || n > 256) return zck_cli_usage_error(cmd, "--threads must be 1..256, not '%s'", arg);
  *out = (unsigned)n;
  return ZCK_EXIT_OK;
}

int zck_cli_opt_float_dtype(const char *cmd, const char *arg, zck_dtype *out) {
  zck_dtype t = zck_dtype_parse(arg);
  if (t != ZCK_F32 && t != ZCK_BF16 && t != ZCK_F16)
    return zck_cli_usage_error(cmd, "--dtype must be fp32, bf16 or fp16, not '%s'", arg);
  *out = t;
  return ZCK_EXIT_OK;
}

int zck_cli_opt_shard_size(const char *cmd, const char *arg, uint64_t *out) {
  if (!zck_cli_parse_size(arg, out) || *out == 0)
    return zck_cli_usage_error(cmd, "--max-shard-size: cannot read '%s' (e.g. 5GB, 500MB, 2GiB)", arg);
  return ZCK_EXIT_OK;
}

static double zck__now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void zck_cli_progress_init(zck_cli_progress *p, const char *label, uint64_t total, bool quiet) {
  memset(p, 0, sizeof *p);
  p->enabled = !quiet && isatty(2);
  p->label = label;
  p->total = total;
}

void zck_cli_progress_update(void *vp, uint64_t done) {
  zck_cli_progress *p = vp;
  if (!p || !p->enabled) return;
  p->done = done;
  double now = zck__now();
  if (now - p->last_draw < 0.1 && done < p->total) return;
  p->last_draw = now;
  int width = 30, filled = p->total ? (int)((double)done / (double)p->total * width) : width;
  if (filled > width) filled = width;
  fprintf(stderr, "\r%s [%.*s%*s] %5.1f%% %.1f/%.1f MB", p->label, filled, "##############################",
          width - filled, "", p->total ? 100.0 * (double)done / (double)p->total : 100.0, done / 1e6, p->total / 1e6);
  fflush(stderr);
}

void zck_cli_progress_cb(void *vp, uint64_t done, uint64_t total) {
  zck_cli_progress *p = vp;
  if (p) p->total = total;
  zck_cli_progress_update(vp, done);
}

void zck_cli_progress_finish(zck_cli_progress *p) {
  if (p->enabled) fputs("\r\033[K", stderr);
}

void zck_cli_format_shape(char *buf, size_t n, const int64_t *shape, int ndim) {
  size_t off = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (off < n) snprintf(buf + off, n - off, "]");
}
