/* cli_dist.c: a command started by mpirun / srun (`mpirun -np N zckpt consolidate ...`).
 *
 * Every rank parses the same arguments and runs the same job; the library shares its copy
 * out and leaves the output to rank 0 (zck.h's zck_dist_*). Here: whether this process may
 * run as such a rank, and the end: every rank waits for all the others, and rank 0 prints
 * the one error line of the lowest rank that failed on its own; every rank exits with its
 * code.
 *
 * A build without MPI started as one of several ranks refuses (one line, from the first
 * rank): N independent copies would each write the same OUT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_dist.h"

static bool zck__cli_buffering;
static char zck__cli_buffered[2048];
static char *zck__cli_view, *zck__cli_view_of; /* a node-local source's view, and the path it stands for */

char *zck_cli_dist_unview(const char *text) {
  /* files of the view are the user's files: "VIEW/global_step2/x.pt" reads "CKPT/global_step2/x.pt" */
  size_t vl = zck__cli_view ? strlen(zck__cli_view) : 0, ul = zck__cli_view_of ? strlen(zck__cli_view_of) : 0;
  size_t hits = 0;
  for (const char *p = text; vl && (p = strstr(p, zck__cli_view)); p += vl) hits++;
  char *out = malloc(strlen(text) + hits * ul + 1), *o = out;
  if (!out) return NULL;
  for (const char *p = text; *p;) {
    if (vl && !strncmp(p, zck__cli_view, vl)) {
      memcpy(o, zck__cli_view_of, ul);
      o += ul;
      p += vl;
    } else {
      *o++ = *p++;
    }
  }
  *o = 0;
  return out;
}

bool zck_cli_dist_take_error(const char *line) {
  if (!zck__cli_buffering) return false;
  char *u = zck_cli_dist_unview(line);
  snprintf(zck__cli_buffered, sizeof zck__cli_buffered, "%s", u ? u : line);
  free(u);
  return true;
}

int zck_cli_dist_source(const char *in, const char **src) {
  *src = in;
  char *view = NULL;
  zck_status s = zck_dist_view_open(in, &view);
  if (s != ZCK_OK) return zck_cli_fail(s);
  if (view) {
    zck__cli_view = view;
    zck__cli_view_of = strdup(in);
    *src = view;
  }
  return ZCK_EXIT_OK;
}

bool zck_cli_dist_solo(void) { return zck_dist_solo(); }

void zck_cli_dist_interrupted(void) {
  if (zck__cli_view) zck_dist_view_close(zck__cli_view);
  zck__cli_view = NULL;
}

bool zck_cli_dist_quiet(void) { return zck_dist_rank() > 0; }

/* Whether this process may run the command: -1 yes, else the exit code of a refusal,
 * said once, by rank 0, which exits 1 (and so does the job: mpirun and srun return a
 * rank's non-zero code). The other ranks leave quietly with 0: a rank exiting non-zero
 * first would have mpirun kill rank 0 before it says why. Decided before the signal
 * thread starts, so a rank that mpirun ends with SIGTERM dies without a second line. */
static int zck__cli_dist_refusal(const char *name, long size, long rank) {
  if (!zck_dist_available()) {
    char n[32] = "several";
    if (size > 1) snprintf(n, sizeof n, "%ld", size);
    if (rank == 0)
      fprintf(stderr, "zckpt: error: started by an MPI launcher as one of %s ranks, but this zckpt was built without "
              "MPI: each rank would write the same output (build with MPI, or run one process)\n", n);
    return rank == 0 ? ZCK_EXIT_ERROR : ZCK_EXIT_OK;
  }
  static const char *distributed[] = {"consolidate", "reshard", "to-universal", "verify"};
  for (size_t i = 0; i < sizeof distributed / sizeof distributed[0]; i++)
    if (!strcmp(name, distributed[i])) return -1;
  if (rank == 0)
    fprintf(stderr, "zckpt: error: %s does not run on several ranks; run it as one process (without mpirun)\n", name);
  return rank == 0 ? ZCK_EXIT_ERROR : ZCK_EXIT_OK;
}

static double zck__cli_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ZCK_DIST_TRACE=1: at the end, what this rank read (the kernel's count of bytes through
 * read calls, page cache included: /proc/self/io rchar) and its time in the job, for
 * tests/bench/bench_dist_jobs.sh and a user checking the split. */
static void zck__cli_trace_rank(int rank, double t0) {
  const char *tv = getenv("ZCK_DIST_TRACE");
  if (!tv || !*tv || !strcmp(tv, "0")) return;
  unsigned long long rchar = 0;
  FILE *f = fopen("/proc/self/io", "r");
  char l[128];
  while (f && fgets(l, sizeof l, f))
    if (sscanf(l, "rchar: %llu", &rchar) == 1) break;
  if (f) fclose(f);
  fprintf(stderr, "zckpt: rank %d: read %llu bytes, %.3f s in the job\n", rank, rchar, zck__cli_now() - t0);
}

int zck_cli_dist_run(const char *name, int (*run)(int, char **), int argc, char **argv) {
  long size, rank;
  zck_dist_launched(&size, &rank);
  if (size != 1) {
    int refused = zck__cli_dist_refusal(name, size, rank);
    if (refused >= 0) return refused;
  }
  zck_cli_start_signal_thread(); /* before the jobs' threads (and MPI's), which inherit the mask */
  double t0 = zck__cli_now();
  if (size == 1) {
    int rc = run(argc, argv);
    zck__cli_trace_rank(0, t0);
    return rc;
  }
  int ranks = 1;
  zck_status s = zck_dist_begin(&ranks);
  if (s != ZCK_OK) return zck_cli_fail(s);
  if (ranks == 1) return run(argc, argv);
  zck__cli_buffering = true;
  zck__cli_buffered[0] = 0;
  int rc = run(argc, argv);
  zck__cli_buffering = false;
  char line[2048];
  rc = zck_dist_finish(rc, zck__cli_buffered[0] ? zck__cli_buffered : NULL, line, sizeof line);
  int me = zck_dist_rank();
  if (me == 0 && line[0]) fprintf(stderr, "zckpt: error: %s\n", line);
  zck__cli_trace_rank(me, t0);
  zck_dist_view_close(zck__cli_view);
  free(zck__cli_view_of);
  zck__cli_view = zck__cli_view_of = NULL;
  /* the command is over: a signal from here on ends the process with rc, silently, while
   * zck_dist_end keeps every rank until rank 0 has said it and every rank has removed its
   * view (a rank that exits first has mpirun stop the others) */
  zck_cli_signals_after(rc);
  zck_dist_end();
  return rc;
}
