/* save_clock.c: an LD_PRELOAD shim that times zckpt-train's checkpoint saves from the
 * outside, so the same measurement applies to any build (bench_save_gather.sh compares two).
 *
 * A save starts when rank 0 creates its temporary folder (mkdir of ".checkpoint-N.zck-tmp-PID")
 * and is committed when that folder is renamed to "checkpoint-N": the shim notes both
 * moments (CLOCK_MONOTONIC) and appends "checkpoint-N MS START_S CPU_MS" to the file named
 * by $SAVE_CLOCK_LOG (START_S: the start in seconds of CLOCK_MONOTONIC, which `perf record
 * -k CLOCK_MONOTONIC` also stamps its samples with; CPU_MS: rank 0's CPU time over the
 * save, all its threads). Other calls pass through unchanged.
 *
 * Build: cc -O2 -shared -fPIC -o save_clock.so save_clock.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double started = -1.0, cpu_started;

static double clock_ms(clockid_t id) {
  struct timespec ts;
  clock_gettime(id, &ts);
  return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}
static double now_ms(void) { return clock_ms(CLOCK_MONOTONIC); }

static const char *base(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

static void note_commit(const char *from, const char *to) {
  if (started < 0 || !strstr(base(from), ".zck-tmp-") || strncmp(base(to), "checkpoint-", 11)) return;
  const char *log = getenv("SAVE_CLOCK_LOG");
  if (!log) return;
  char line[512];
  int n = snprintf(line, sizeof line, "%s %.1f %.6f %.1f\n", base(to), now_ms() - started, 1e-3 * started,
                   clock_ms(CLOCK_PROCESS_CPUTIME_ID) - cpu_started);
  int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    if (write(fd, line, (size_t)n) < 0) { /* a lost line shows as a missing save */ }
    close(fd);
  }
  started = -1.0;
}

int mkdir(const char *path, mode_t mode) {
  static int (*real)(const char *, mode_t);
  if (!real) real = (int (*)(const char *, mode_t))dlsym(RTLD_NEXT, "mkdir");
  double t = now_ms(), cpu = clock_ms(CLOCK_PROCESS_CPUTIME_ID);
  int r = real(path, mode);
  if (r == 0 && !strncmp(base(path), ".checkpoint-", 12) && strstr(base(path), ".zck-tmp-")) {
    started = t;
    cpu_started = cpu;
  }
  return r;
}

int rename(const char *from, const char *to) {
  static int (*real)(const char *, const char *);
  if (!real) real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
  int r = real(from, to);
  if (r == 0) note_commit(from, to);
  return r;
}

int renameat2(int fd1, const char *from, int fd2, const char *to, unsigned flags) {
  static int (*real)(int, const char *, int, const char *, unsigned);
  if (!real) real = (int (*)(int, const char *, int, const char *, unsigned))dlsym(RTLD_NEXT, "renameat2");
  int r = real(fd1, from, fd2, to, flags);
  if (r == 0) note_commit(from, to);
  return r;
}
