/* io_temp.c: where outputs stand before they commit. The temporary name beside a final
 * path, the registry of this process's open temporary trees, and the temporaries of
 * writers that died before their commit (how to tell they are gone, and their sweep). */
#include "io_internal.h"

#include <errno.h>
#include <libgen.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- temporary names beside the final path */

char *zck__tmp_sibling(const char *final_path) {
  char *copy1 = zck__strdup(final_path), *copy2 = zck__strdup(final_path);
  char *res = NULL;
  if (copy1 && copy2) {
    size_t n = strlen(copy1);
    while (n > 1 && copy1[n - 1] == '/') copy1[--n] = 0, copy2[n] = 0;
    const char *dir = dirname(copy1), *base = basename(copy2);
    res = zck__sprintf("%s/.%s.zck-tmp-%ld", dir, base, zck__dist_tmp_pid()); /* rank 0's in a distributed job */
  }
  free(copy1);
  free(copy2);
  return res;
}

char *zck__parent_dir(const char *path) {
  char *copy = zck__strdup(path);
  if (!copy) return NULL;
  size_t n = strlen(copy);
  while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
  char *res = zck__strdup(dirname(copy));
  free(copy);
  return res;
}

/* ---- open output directories of this process
 *
 * The temporary trees of the outdirs between create and commit/abort. A file created
 * inside one needs no fsync of its own: the outdir's commit fsyncs the whole tree before
 * anything of it becomes visible. */

static pthread_mutex_t zck__open_dirs_mu = PTHREAD_MUTEX_INITIALIZER;
static char **zck__open_dirs;
static size_t zck__n_open_dirs, zck__cap_open_dirs;

void zck__open_dirs_add(const char *tmp_path) {
  pthread_mutex_lock(&zck__open_dirs_mu);
  if (zck__n_open_dirs == zck__cap_open_dirs) {
    size_t nc = zck__cap_open_dirs ? 2 * zck__cap_open_dirs : 8;
    char **v = realloc(zck__open_dirs, nc * sizeof *v);
    if (v) { zck__open_dirs = v; zck__cap_open_dirs = nc; }
  }
  /* out of memory: the tree's files simply keep their own fsync */
  char *copy = zck__n_open_dirs < zck__cap_open_dirs ? strdup(tmp_path) : NULL;
  if (copy) zck__open_dirs[zck__n_open_dirs++] = copy;
  pthread_mutex_unlock(&zck__open_dirs_mu);
}

void zck__open_dirs_remove(const char *tmp_path) {
  pthread_mutex_lock(&zck__open_dirs_mu);
  for (size_t i = 0; i < zck__n_open_dirs; i++) {
    if (strcmp(zck__open_dirs[i], tmp_path)) continue;
    free(zck__open_dirs[i]);
    zck__open_dirs[i] = zck__open_dirs[--zck__n_open_dirs];
    break;
  }
  if (!zck__n_open_dirs) { /* nothing left behind for leak checkers */
    free(zck__open_dirs);
    zck__open_dirs = NULL;
    zck__cap_open_dirs = 0;
  }
  pthread_mutex_unlock(&zck__open_dirs_mu);
}

bool zck__in_open_dir(const char *path) {
  bool in = false;
  pthread_mutex_lock(&zck__open_dirs_mu);
  for (size_t i = 0; i < zck__n_open_dirs && !in; i++) {
    size_t n = strlen(zck__open_dirs[i]);
    in = !strncmp(path, zck__open_dirs[i], n) && path[n] == '/' && !strstr(path + n, "/../");
  }
  pthread_mutex_unlock(&zck__open_dirs_mu);
  return in;
}

/* ---- writers that died before their commit */

/* When process pid started, in seconds since the epoch (Linux: /proc/PID/stat field 22,
 * clock ticks after boot, plus btime from /proc/stat); -1 when unknown. */
static double zck__process_start_time(long pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  if (!p) return -1;
  unsigned long long ticks = 0;
  int field = 2; /* the name was field 2; count the fields after it */
  char *save = NULL; /* strtok_r: jobs run in threads of their own */
  for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
    if (++field == 22) {
      ticks = strtoull(tok, NULL, 10);
      break;
    }
  if (field != 22) return -1;
  f = fopen("/proc/stat", "r");
  if (!f) return -1;
  double btime = -1;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "btime ", 6)) btime = strtod(line + 6, NULL);
  fclose(f);
  long hz = sysconf(_SC_CLK_TCK);
  return btime < 0 || hz <= 0 ? -1 : btime + (double)ticks / (double)hz;
}

/* Whether pid is a zombie (dead, not yet reaped: an MPI rank stopped after its mpirun
 * exited stays one for as long as its new parent, pid 1, does not reap it, which in a
 * container may be for ever). */
static bool zck__process_zombie(long pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* "PID (name) STATE ..." */
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* True when the writer of a temporary entry whose inode last changed at `changed` is gone:
 * its pid does not run (or is a zombie), or it runs but started after the entry was last
 * changed (the pid was reused: pids wrap within minutes on a busy machine). The inode
 * change time, not the modification time: creating, hard-linking (the kept previous
 * version of a replaced file) and renaming all set it, so it is never older than the
 * writer. */
bool zck__writer_gone(long pid, time_t changed) {
  if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
  if (zck__process_zombie(pid)) return true;
  double started = zck__process_start_time(pid);
  return started > 0 && started > (double)changed + 2.0; /* 2 s: clock-tick and time rounding */
}

/* Sweeps the folder of final_path of the temporaries of writers that died before their
 * commit (zck_sweep_temporaries, sweep.c): a save killed while writing checkpoint-10 leaves
 * a tree that no later save of checkpoint-20 would otherwise ever look at. An earlier
 * output a dead writer had moved aside comes back first, before OUT is judged. */
void zck__clean_stale_temps(const char *final_path) {
  char *copy = zck__strdup(final_path);
  if (copy) {
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
    zck_sweep_temporaries(dirname(copy), ZCK_SWEEP_DEAD, NULL, NULL);
  }
  free(copy);
  zck_clear_error();
}
