/* cli_progress.c: the progress bar, the summary line and shapes as the user reads them. */
#include "cli.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

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

int zck_cli_progress_cb(void *vp, uint64_t done, uint64_t total) {
  zck_cli_progress *p = vp;
  if (p) p->total = total;
  zck_cli_progress_update(vp, done);
  return 0;
}

void zck_cli_progress_finish(zck_cli_progress *p) {
  if (p->enabled) fputs("\r\033[K", stderr);
}

double zck_cli_now(void) { return zck__now(); }

void zck_cli_summary(const char *out, const char *what, const zck_job_summary *sum, double started, bool quiet) {
  if (quiet) return;
  double secs = zck__now() - started, b = (double)sum->bytes;
  static const char *const units[] = {"KB", "MB", "GB", "TB", "PB"};
  char size[48];
  if (sum->bytes < 1000) {
    snprintf(size, sizeof size, "%llu bytes", (unsigned long long)sum->bytes);
  } else {
    int u = 0; /* Hugging Face's units: powers of 1000 */
    for (b /= 1000; b >= 999.95 && u < 4; u++) b /= 1000;
    snprintf(size, sizeof size, "%.1f %s", b, units[u]);
  }
  fprintf(stderr, "wrote %s: %llu %s%s, %s in %.1f s\n", out, (unsigned long long)sum->tensors, what,
          sum->tensors == 1 ? "" : "s", size, secs < 0 ? 0.0 : secs);
}

void zck_cli_format_shape(char *buf, size_t n, const int64_t *shape, int ndim) {
  size_t off = (size_t)snprintf(buf, n, "[");
  for (int i = 0; i < ndim && off < n; i++)
    off += (size_t)snprintf(buf + off, n - off, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (off < n) snprintf(buf + off, n - off, "]");
}

