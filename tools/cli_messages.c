/* cli_messages.c: the one-line messages of every subcommand (errors, warnings, usage
 * errors with a "did you mean" for a mistyped option). */
#include "cli.h"
#include "cli_dist.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* A message as the user reads it, in place: one line, OUT's temporary name read as OUT,
 * a path said twice said once. */
static void zck__cli_user_line(char *buf) {
  /* one line, whatever the message holds (libraries' own messages, e.g. libhdf5's, can
   * carry newlines): scripts read the first line of stderr */
  size_t n = 0;
  for (char *p = buf; *p; p++) {
    if (*p == '\n' || *p == '\r' || *p == '\t') *p = ' ';
    if (*p == ' ' && n && buf[n - 1] == ' ') continue;
    buf[n++] = *p;
  }
  while (n && buf[n - 1] == ' ') n--;
  buf[n] = 0;
  /* the user asked for OUT, not for the temporary name it is built under:
   * "dir/.out.zck-tmp-PID/x" reads "dir/out/x" */
  char mark[48];
  snprintf(mark, sizeof mark, ".zck-tmp-%ld", zck_temporary_pid()); /* rank 0's under mpirun */
  for (char *hit; (hit = strstr(buf, mark));) {
    char *start = hit;
    while (start > buf && start[-1] != '/' && start[-1] != ' ' && start[-1] != '\'') start--;
    char *end = hit + strlen(mark);
    if (*start != '.' || start + 1 >= hit || (*end && *end != '/' && *end != ':' && *end != ' ' && *end != '\'')) {
      *hit = '_'; /* not one of ours: leave it (and stop matching it) */
      continue;
    }
    size_t name_len = (size_t)(hit - start - 1);
    memmove(start, start + 1, name_len);
    memmove(start + name_len, end, strlen(end) + 1);
  }
  for (char *p = buf; *p; p++) /* restore what the loop masked */
    if (p[0] == '_' && !strncmp(p + 1, mark + 1, strlen(mark) - 1)) p[0] = '.';
  /* "P: P: what" (a path prepended twice on the way up) */
  char *colon = strstr(buf, ": ");
  if (colon && colon > buf) {
    size_t plen = (size_t)(colon - buf) + 2;
    if (!strncmp(buf + plen, buf, plen)) memmove(buf, buf + plen, strlen(buf + plen) + 1);
  }
}

int zck_cli_error(const char *fmt, ...) {
  va_list ap;
  char buf[4096];
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  zck__cli_user_line(buf);
  if (zck_cli_dist_take_error(buf)) return ZCK_EXIT_ERROR; /* the ranks agree on one line */
  fprintf(stderr, "zckpt: error: %s\n", buf);
  return ZCK_EXIT_ERROR;
}

void zck_cli_warning(void *ctx, const char *message) {
  (void)ctx;
  char buf[4096];
  snprintf(buf, sizeof buf, "%s", message);
  zck__cli_user_line(buf);
  fprintf(stderr, "zckpt: warning: %s\n", buf);
}

int zck_cli_fail(zck_status s) {
  const char *msg = zck_last_error();
  if (!msg[0]) msg = zck_status_name(s);
  return zck_cli_error("%s", msg);
}

int zck_cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  if (zck_cli_dist_quiet()) return ZCK_EXIT_USAGE; /* rank 0 says it */
  fprintf(stderr, "zckpt%s%s: ", cmd ? " " : "", cmd ? cmd : "");
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, " (see 'zckpt%s%s --help')\n", cmd ? " " : "", cmd ? cmd : "");
  return ZCK_EXIT_USAGE;
}

/* Edit distance of a and b (n, m bytes), '_' and '-' counted alike; stops above 8. */
static size_t zck__cli_distance(const char *a, size_t n, const char *b, size_t m) {
  if (n > 64 || m > 64) return 99;
  size_t row[65];
  for (size_t j = 0; j <= m; j++) row[j] = j;
  for (size_t i = 1; i <= n; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= m; j++) {
      char x = a[i - 1] == '_' ? '-' : a[i - 1], y = b[j - 1] == '_' ? '-' : b[j - 1];
      size_t best = diag + (x != y);
      if (row[j] + 1 < best) best = row[j] + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      diag = row[j];
      row[j] = best;
    }
  }
  return row[m];
}

/* The long option closest to what was typed ("--max-shard" -> "max-shard-size"), or NULL. */
static const char *zck__cli_suggest(const char *typed, const struct option *opts) {
  size_t n = strcspn(typed, "=");
  const char *best = NULL;
  size_t best_d = n / 3 + 1; /* up to a third of the name wrong */
  for (const struct option *o = opts; o && o->name; o++) {
    size_t m = strlen(o->name);
    size_t d = zck__cli_distance(typed, n, o->name, m);
    /* a prefix of a longer name, or the name with more after it */
    if (d > 2 && ((n >= 3 && n < m && !strncmp(typed, o->name, n)) || (m >= 3 && m < n && !strncmp(typed, o->name, m))))
      d = 2;
    if (d < best_d) { best_d = d; best = o->name; }
  }
  return best;
}

int zck_cli_bad_option(const char *cmd, int c, int argc, char **argv, const struct option *opts) {
  const char *arg = (optind >= 1 && optind - 1 < argc) ? argv[optind - 1] : "";
  bool is_long = arg[0] == '-' && arg[1] == '-';
  if (c == ':') {
    if (is_long) return zck_cli_usage_error(cmd, "option '%s' needs a value", arg);
    return zck_cli_usage_error(cmd, "option '-%c' needs a value", optopt);
  }
  if (!is_long && optopt > 0 && optopt < 128 && isprint(optopt)) return zck_cli_usage_error(cmd, "unknown option '-%c'", optopt);
  const char *near = is_long ? zck__cli_suggest(arg + 2, opts) : NULL;
  if (near) return zck_cli_usage_error(cmd, "unknown option '%s' (did you mean '--%s'?)", arg, near);
  return zck_cli_usage_error(cmd, "unknown option '%s'", arg);
}

