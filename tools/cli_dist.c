/* cli_dist.c: a command started by mpirun / srun (`mpirun -np N zckpt consolidate ...`).
 *
 * Every rank parses the same arguments and runs the same job; lib/dist.h shares its copy
 * out and leaves the output to rank 0. Here: whether this process is such a rank, the
 * group, and the end: every rank waits for all the others, and rank 0 prints the one
 * error line of the lowest rank that failed on its own; every rank exits with its code.
 *
 * A build without MPI started as one of several ranks refuses (one line, from the first
 * rank): N independent copies would each write the same OUT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_dist.h"
#include "comm.h"
#include "dist.h"

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
  if (!zck__dist_on()) return ZCK_EXIT_OK;
  char *view = NULL;
  zck_status s = zck__dist_view_open(in, &view);
  if (s != ZCK_OK) return zck_cli_fail(s);
  if (view) {
    zck__cli_view = view;
    zck__cli_view_of = strdup(in);
    *src = view;
  }
  return ZCK_EXIT_OK;
}

bool zck_cli_dist_solo(void) {
  if (!zck__dist_on()) return false;
  if (zck__dist_rank() != 0) return true;
  zck__dist_pause(true);
  return false;
}

long zck_cli_dist_tmp_pid(void) { return zck__dist_tmp_pid(); }
void zck_cli_dist_interrupted(void) {
  if (zck__cli_view) zck__dist_view_close(zck__cli_view);
  zck__cli_view = NULL;
}

bool zck_cli_dist_quiet(void) { return zck__dist_on() && zck__dist_rank() != 0; }

/* The launcher's word on this process: world size (0: unknown) and rank. */
static void zck__cli_launch(long *size, long *rank) {
  static const char *sizes[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"};
  static const char *ranks[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"};
  *size = 0;
  *rank = 0;
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && !*size; i++)
    if (getenv(sizes[i])) *size = strtol(getenv(sizes[i]), NULL, 10);
  for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++)
    if (getenv(ranks[i])) {
      *rank = strtol(getenv(ranks[i]), NULL, 10);
      break;
    }
}

/* Whether this process may run the command: -1 yes, else the exit code of a refusal,
 * said once, by rank 0, which exits 1 (and so does the job: mpirun and srun return a
 * rank's non-zero code). The other ranks leave quietly with 0: a rank exiting non-zero
 * first would have mpirun kill rank 0 before it says why. Decided before the signal
 * thread starts, so a rank that mpirun ends with SIGTERM dies without a second line. */
static int zck__cli_dist_refusal(const char *name, long size, long rank) {
  if (!zck_comm_mpi_available()) {
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
  long size = 1, rank = 0;
  if (zck_comm_mpi_launched()) zck__cli_launch(&size, &rank);
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
  /* a rank whose share is done waits at the next agreement for the slowest one: a long
   * copy is no hang (a dead rank ends the job through mpirun) */
  setenv("ZCK_COMM_TIMEOUT_S", "604800", 0);
  zck_comm *comm = NULL;
  zck_status s = zck_comm_mpi_create(&comm);
  if (s != ZCK_OK) return zck_cli_fail(s);
  if (comm->size == 1) {
    zck_comm_mpi_destroy(comm);
    return run(argc, argv);
  }
  s = zck__dist_begin(comm);
  if (s != ZCK_OK) {
    zck_comm_mpi_destroy(comm);
    return zck_cli_fail(s);
  }
  zck__cli_buffering = true;
  zck__cli_buffered[0] = 0;
  int rc = run(argc, argv);
  zck__dist_pause(false);
  zck__cli_buffering = false;
  char line[2048];
  rc = zck__dist_finish(rc, zck__cli_buffered[0] ? zck__cli_buffered : NULL, line, sizeof line);
  if (comm->rank == 0 && line[0]) fprintf(stderr, "zckpt: error: %s\n", line);
  zck__cli_trace_rank(comm->rank, t0);
  zck__dist_view_close(zck__cli_view);
  free(zck__cli_view_of);
  zck__cli_view = zck__cli_view_of = NULL;
  /* no rank exits (and so has mpirun stop the others) before rank 0 has said it and
   * every rank has removed its view */
  comm->barrier(comm);
  zck_cli_signals_after(rc);
  zck__dist_end();
  zck_comm_mpi_destroy(comm);
  return rc;
}
