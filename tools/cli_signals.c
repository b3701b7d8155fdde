/* cli_signals.c: interruption (SIGINT, SIGTERM, SIGHUP): our temporaries removed, an
 * earlier output put back, one line, exit 128+signal. */
#include "cli.h"
#include "cli_dist.h"

#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <sys/syscall.h>

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

