/* cli.c: error printing, size parsing and the progress bar shared by subcommands. */
#include "cli.h"
#include "zck.h"
#include "cli_dist.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/syscall.h>

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
  snprintf(mark, sizeof mark, ".zck-tmp-%ld", zck_cli_dist_tmp_pid()); /* rank 0's under mpirun */
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

int zck_cli_check_out_not_in(const char *in, const char *out, const char *tag) {
  zck_status s = zck_check_out_not_input(in, out, tag);
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}

int zck_cli_check_folder_out(const char *cmd, const char *out) {
  static const char *const file_suffixes[] = {
    "safetensors", "bin", "pt", "pth", "ckpt", "txt", "json", "h5", "hdf5", "gguf", "npz", "npy", "pkl", "pickle",
    "zip", "tar", "gz", "tgz", "zst", "xz", "onnx", "msgpack", "distcp", "log", "csv", "yaml", "yml", "md"};
  size_t n = strlen(out);
  if (n && out[n - 1] == '/') return ZCK_EXIT_OK;   /* "name.txt/": said to be a folder */
  size_t b = n;
  while (b && out[b - 1] != '/') b--;
  const char *dot = NULL;
  for (size_t i = b + 1; i < n; i++)  /* a leading dot is a hidden name, not a suffix */
    if (out[i] == '.') dot = out + i;
  if (!dot) return ZCK_EXIT_OK;
  size_t len = (size_t)(out + n - dot - 1);
  for (size_t i = 0; i < sizeof file_suffixes / sizeof *file_suffixes; i++)
    if (strlen(file_suffixes[i]) == len && !strncasecmp(dot + 1, file_suffixes[i], len))
      return zck_cli_usage_error(cmd, "OUT '%s' names a .%s file, but %s writes a folder there: give a folder name", out,
                                 file_suffixes[i], cmd);
  return ZCK_EXIT_OK;
}

int zck_cli_resolve_out(const char *out, char **resolved) {
  /* the library writes through a folder's link by itself; resolved here too so the
   * input checks and the interruption clean-up see the folder the job writes */
  zck_status s = zck_resolve_out(out, resolved);
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}

/* ---- interruption */

enum { ZCK__CLI_MAX_DIRS = 4 };
static pthread_mutex_t zck__cli_sig_lock = PTHREAD_MUTEX_INITIALIZER;
static char *zck__cli_out;
static bool zck__cli_out_existed;   /* OUT before the command: its inode, to see a commit */
static dev_t zck__cli_out_dev;
static ino_t zck__cli_out_ino;
static char *zck__cli_dirs[ZCK__CLI_MAX_DIRS];
static sigset_t zck__cli_sigs;

static char *zck__cli_parent(const char *path) {
  char *copy = strdup(path);
  if (!copy) return NULL;
  size_t n = strlen(copy);
  while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
  char *res = strdup(dirname(copy));
  free(copy);
  return res;
}

void zck_cli_add_cleanup_dir(const char *dir) {
  pthread_mutex_lock(&zck__cli_sig_lock);
  for (int i = 0; i < ZCK__CLI_MAX_DIRS; i++) {
    if (zck__cli_dirs[i] && !strcmp(zck__cli_dirs[i], dir)) break;
    if (!zck__cli_dirs[i]) { zck__cli_dirs[i] = strdup(dir); break; }
  }
  pthread_mutex_unlock(&zck__cli_sig_lock);
}

void zck_cli_set_output(const char *out) {
  char *parent = zck__cli_parent(out);
  struct stat st;
  bool existed = lstat(out, &st) == 0;
  pthread_mutex_lock(&zck__cli_sig_lock);
  free(zck__cli_out);
  zck__cli_out = strdup(out);
  zck__cli_out_existed = existed;
  zck__cli_out_dev = existed ? st.st_dev : 0;
  zck__cli_out_ino = existed ? st.st_ino : 0;
  pthread_mutex_unlock(&zck__cli_sig_lock);
  if (parent) zck_cli_add_cleanup_dir(parent);
  free(parent);
}

/* After the signal, every other thread is frozen (it could hold malloc's or stdio's lock),
 * so the code below and the sweep (zck_sweep_temporaries, ZCK_SWEEP_OWN) use system calls
 * and stack buffers only. */
struct zck__cli_dirent {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

static bool zck__cli_dot(const char *n) { return n[0] == '.' && (!n[1] || (n[1] == '.' && !n[2])); }

static volatile sig_atomic_t zck__cli_frozen;

static void zck__cli_freeze(int sig) {
  (void)sig;
  __atomic_add_fetch(&zck__cli_frozen, 1, __ATOMIC_SEQ_CST);
  for (;;) pause();
}

/* Stops every other thread of the process where it is (they would go on writing into the
 * trees being removed, or print their own errors and exit first). */
static void zck__cli_freeze_others(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = zck__cli_freeze;
  sigfillset(&sa.sa_mask);
  sigaction(SIGUSR2, &sa, NULL);
  long self = syscall(SYS_gettid), pid = (long)getpid();
  enum { MAX = 1024 };
  long sent[MAX];
  int nsent = 0;
  for (int round = 0; round < 8; round++) {
    int fd = open("/proc/self/task", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    bool fresh = false;
    char buf[4096];
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
      for (long off = 0; off < n;) {
        struct zck__cli_dirent *e = (struct zck__cli_dirent *)(buf + off);
        off += e->reclen;
        if (zck__cli_dot(e->name)) continue;
        long tid = strtol(e->name, NULL, 10);
        bool seen = tid == self;
        for (int i = 0; i < nsent && !seen; i++) seen = sent[i] == tid;
        if (seen || nsent == MAX) continue;
        if (syscall(SYS_tgkill, pid, tid, SIGUSR2) == 0) sent[nsent++] = tid, fresh = true;
      }
    }
    close(fd);
    if (!fresh) break;
  }
  /* wait (up to 2 s: a thread in uninterruptible I/O) until they all sit in the handler */
  for (int i = 0; i < 200 && __atomic_load_n(&zck__cli_frozen, __ATOMIC_SEQ_CST) < nsent; i++) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
}

static atomic_int zck__cli_after_rc = -1;

void zck_cli_signals_after(int rc) { atomic_store(&zck__cli_after_rc, rc); }

static void *zck__cli_signal_main(void *arg) {
  (void)arg;
  int sig = 0;
  if (sigwait(&zck__cli_sigs, &sig) != 0) return NULL;
  /* the command is over (mpirun ending the other ranks once one has exited): its own
   * result stands, and there is nothing to clean up */
  int after = atomic_load(&zck__cli_after_rc);
  if (after >= 0) _exit(after);
  zck_cli_dist_interrupted(); /* a node-local source's view goes */
  if (zck_cli_dist_quiet()) {
    /* a distributed job: rank 0 owns the temporaries and says it. This rank stops its
     * threads and leaves only after a grace: mpirun answers a rank that exits during its
     * SIGTERM round with an immediate SIGKILL of the whole job, which would cut rank 0's
     * cleanup short (its temporaries stayed in 4 runs of 6); its own SIGKILL, 1 s after
     * the SIGTERM, still ends this rank in time (Slurm's comes after KillWait) */
    zck__cli_freeze_others();
    struct timespec grace = {3, 0};
    nanosleep(&grace, NULL);
    _exit(128 + sig);
  }
  pthread_mutex_lock(&zck__cli_sig_lock); /* registration is done under it: no half entry */
  zck__cli_freeze_others();
  for (int i = 0; i < ZCK__CLI_MAX_DIRS; i++)
    if (zck__cli_dirs[i]) zck_sweep_temporaries(zck__cli_dirs[i], ZCK_SWEEP_OWN, NULL, NULL);
  const char *name = sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : sig == SIGHUP ? "SIGHUP" : "a signal";
  char msg[PATH_MAX + 128];
  int len;
  struct stat st;
  /* the signal came after the output was renamed into place (a new inode at OUT): it is
   * whole, and saying "nothing written" would be wrong */
  bool committed = zck__cli_out && lstat(zck__cli_out, &st) == 0 &&
                   (!zck__cli_out_existed || st.st_dev != zck__cli_out_dev || st.st_ino != zck__cli_out_ino);
  if (zck__cli_out && committed)
    len = snprintf(msg, sizeof msg, "zckpt: error: %s: interrupted by %s after the output was in place (it is complete)\n",
                   zck__cli_out, name);
  else if (zck__cli_out)
    len = snprintf(msg, sizeof msg, "zckpt: error: %s: interrupted by %s; nothing written\n", zck__cli_out, name);
  else
    len = snprintf(msg, sizeof msg, "zckpt: error: interrupted by %s\n", name);
  if (len > 0) {
    if (isatty(2)) { ssize_t c = write(2, "\r\033[K", 4); (void)c; } /* over a progress bar */
    ssize_t w = write(2, msg, (size_t)len < sizeof msg ? (size_t)len : sizeof msg - 1);
    (void)w;
  }
  _exit(128 + sig);
  return NULL;
}

/* A child forked by the library (the HDF5 metadata probe) has one thread and no waiter:
 * it gets the default dispositions back, so a Ctrl-C stops it too. */
static void zck__cli_atfork_child(void) { pthread_sigmask(SIG_UNBLOCK, &zck__cli_sigs, NULL); }

void zck_cli_start_signal_thread(void) {
  sigemptyset(&zck__cli_sigs);
  sigaddset(&zck__cli_sigs, SIGINT);
  sigaddset(&zck__cli_sigs, SIGTERM);
  sigaddset(&zck__cli_sigs, SIGHUP);
  /* a signal the caller ignored (nohup, `cmd &` without job control) stays ignored */
  for (int s = 1; s < NSIG; s++) {
    if (!sigismember(&zck__cli_sigs, s)) continue;
    struct sigaction sa;
    if (sigaction(s, NULL, &sa) == 0 && sa.sa_handler == SIG_IGN) sigdelset(&zck__cli_sigs, s);
  }
  sigset_t old;
  if (pthread_sigmask(SIG_BLOCK, &zck__cli_sigs, &old) != 0) return;
  pthread_t t;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  if (pthread_create(&t, &attr, zck__cli_signal_main, NULL) != 0) pthread_sigmask(SIG_SETMASK, &old, NULL);
  else pthread_atfork(NULL, NULL, zck__cli_atfork_child);
  pthread_attr_destroy(&attr);
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
  if (zck_parse_size(arg, out) != ZCK_OK || *out == 0)
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

int zck_cli_pick_checkpoint(const char *in, const char *verb, bool quiet, char **picked) {
  struct stat st;
  char latest[PATH_MAX];
  *picked = NULL;
  snprintf(latest, sizeof latest, "%s/latest", in);
  if (stat(in, &st) != 0 || !S_ISDIR(st.st_mode) || lstat(latest, &st) == 0) return ZCK_EXIT_OK;
  char *skipped = NULL;
  zck_status s = zck_hf_last_checkpoint(in, picked, &skipped);
  if (s == ZCK_ERR_NOT_FOUND) { zck_clear_error(); return ZCK_EXIT_OK; }
  if (s != ZCK_OK) return zck_cli_fail(s);
  if (!quiet)
    fprintf(stderr, "zckpt: %s: %s %s, the newest complete checkpoint%s%s%s\n", in, verb, *picked,
            skipped ? " (" : "", skipped ? skipped : "", skipped ? ")" : "");
  free(skipped);
  return ZCK_EXIT_OK;
}

int zck_cli_run_from_checkpoint(const zck_cli_ckpt_job *j, const char *in, const char *out) {
  int rc;
  bool quiet_line = j->quiet || zck_cli_dist_quiet();
  char *picked = NULL; /* a Trainer output_dir: its newest complete checkpoint, as consolidate */
  if (!j->tag && (rc = zck_cli_pick_checkpoint(in, j->verb, quiet_line, &picked))) return rc;
  if (picked) in = picked;
  char *out_r = NULL;
  if ((rc = zck_cli_resolve_out(out, &out_r))) { free(picked); return rc; }
  if ((rc = zck_cli_check_out_not_in(in, out_r, j->tag))) { free(out_r); free(picked); return rc; }
  zck_cli_set_output(out_r);
  zck_cli_progress bar;
  zck_cli_progress_init(&bar, j->name, 0, j->quiet);
  *j->progress = zck_cli_progress_cb;
  *j->progress_ctx = &bar;
  zck_job_summary sum;
  *j->summary = quiet_line ? NULL : &sum; /* counting OUT's files is a walk of it: only for the line */
  double started = zck_cli_now();
  const char *src = in;
  if ((rc = zck_cli_dist_source(in, &src))) { free(out_r); free(picked); return rc; } /* node-local files under mpirun */
  zck_status s = j->run(src, out_r, j->opts);
  zck_cli_progress_finish(&bar);
  free(out_r);
  free(picked);
  if (s == ZCK_OK) zck_cli_summary(out, "parameter", &sum, started, quiet_line);
  return s == ZCK_OK ? ZCK_EXIT_OK : zck_cli_fail(s);
}
