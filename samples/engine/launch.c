/* launch.c: the --nproc launcher, the error agreement of rank processes, and the kill hook
 * of the fault tests (see launch.h). */
#include "launch.h"

#include "error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

// ---- agreement

static _Thread_local bool g_agreed;

bool ze_agree_reached_all(void) { return g_agreed; }
void ze_agree_reset(void) { g_agreed = false; }

zck_status ze_agree(zck_comm *c, zck_status s) {
  char msg[1024] = "";
  if (s != ZCK_OK) snprintf(msg, sizeof msg, "%s", zck_last_error());
  int32_t first = s != ZCK_OK ? c->rank : c->size;
  zck_status cs = c->all_reduce(c, &first, &first, 1, ZCK_I32, ZCK_COMM_MIN);
  int32_t st = (int32_t)s;
  if (cs == ZCK_OK && first < c->size) cs = c->broadcast(c, &st, 1, ZCK_I32, first);
  if (cs == ZCK_OK && first < c->size) cs = c->broadcast(c, msg, sizeof msg, ZCK_U8, first);
  if (cs == ZCK_OK && first < c->size) g_agreed = true;
  if (s != ZCK_OK) return zck__fail(s, "%s", msg); /* ours first: the collective may have overwritten it */
  if (cs != ZCK_OK) return cs;
  if (first == c->size) return ZCK_OK;
  msg[sizeof msg - 1] = 0;
  return zck__fail((zck_status)st, "rank %d: %s", first, msg);
}

// ---- test hook

void ze_test_kill_point(zck_comm *c, int64_t step, bool in_save) {
  if (!strcmp(c->backend, "local")) return; /* threads share the process: nothing to kill alone */
  const char *v = getenv("ZCKPT_TRAIN_TEST_KILL");
  if (!v || !*v) return;
  long rank = -1;
  long long at = -1;
  char where[16] = "";
  if (sscanf(v, "%ld:%lld:%15s", &rank, &at, where) < 2) return;
  if (rank != c->rank || at != step || in_save != !strcmp(where, "save")) return;
  fprintf(stderr, "zckpt-train: rank %d: ZCKPT_TRAIN_TEST_KILL: killing myself at step %lld%s\n", c->rank, at,
          in_save ? " during the save" : "");
  raise(SIGKILL);
}

// ---- the launcher

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

/* A free port (the kernel's choice) for rank 0 to listen on, held by *fd until the ranks
 * are done: a port merely seen free could be handed to anyone in the time rank 0 takes to
 * start (the ephemeral port of another process's bind(0) or connect()), and rank 0 would
 * fail with "port in use". A bound socket that does not listen keeps the kernel from
 * giving the port to others; with SO_REUSEADDR here and in rank 0 (comm_tcp_mesh.c),
 * rank 0 may still bind it and listen. */
static int free_port(int *fd_out) {
  *fd_out = -1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  int port = -1;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0)
    port = ntohs(sa.sin_port);
  int e = errno;
  if (port < 0) close(fd);
  else *fd_out = fd;
  errno = e;
  return port;
}

static void describe(int status, char *buf, size_t n) {
  if (WIFSIGNALED(status))
    snprintf(buf, n, "was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  else
    snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

int ze_launch_nproc(int nproc, int argc, char **argv, int skip_at, int skip_n) {
  /* the children's command line: ours without --nproc N / --nproc=N */
  char **cargv = calloc((size_t)argc + 1, sizeof *cargv);
  pid_t *pids = calloc((size_t)nproc, sizeof *pids);
  if (!cargv || !pids) {
    free(cargv);
    free(pids);
    fprintf(stderr, "zckpt-train: error: out of memory\n");
    return 1;
  }
  int cargc = 0;
  for (int i = 0; i < argc; i++)
    if (i < skip_at || i >= skip_at + skip_n) cargv[cargc++] = argv[i];
  cargv[cargc] = NULL;
  int port_fd = -1, port = free_port(&port_fd);
  if (port < 0) {
    fprintf(stderr, "zckpt-train: error: --nproc: cannot find a free TCP port on 127.0.0.1: %s\n", strerror(errno));
    free(cargv);
    free(pids);
    return 1;
  }
  struct sigaction sa, old_int, old_term;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  fflush(NULL);
  pid_t self = getpid();
  /* the binary's own path (so the ranks show as zckpt-train in ps, not "exe") */
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  if (n <= 0 || n >= (ssize_t)sizeof exe - 1 || strstr(exe, " (deleted)")) snprintf(exe, sizeof exe, "/proc/self/exe");
  int started = 0, rc = 0;
  for (int r = 0; r < nproc; r++) {
    pid_t pid = fork();
    if (pid < 0) {
      fprintf(stderr, "zckpt-train: error: --nproc: cannot start rank %d: %s\n", r, strerror(errno));
      rc = 1;
      break;
    }
    if (pid == 0) {
      /* die with the launcher, whatever kills it */
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != self) _exit(1);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      char v[32];
      snprintf(v, sizeof v, "%d", r);
      setenv("RANK", v, 1);
      setenv("LOCAL_RANK", v, 1);
      snprintf(v, sizeof v, "%d", nproc);
      setenv("WORLD_SIZE", v, 1);
      setenv("LOCAL_WORLD_SIZE", v, 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      snprintf(v, sizeof v, "%d", port);
      setenv("MASTER_PORT", v, 1);
      execv(exe, cargv);
      fprintf(stderr, "zckpt-train: error: --nproc: cannot run %s: %s\n", exe, strerror(errno));
      _exit(127);
    }
    pids[r] = pid;
    started++;
  }
  /* wait. After the first failure the others get a grace period to stop by themselves
   * (their collectives fail at once when a peer is gone, and rank 0 then removes its
   * temporary checkpoint folder), then SIGTERM, then SIGKILL. */
  int alive = started, failed = -1, forwarded = 0, phase = 0;
  bool failed_signaled = false;
  char how[128] = "";
  double t_fail = 0;
  if (rc != 0) t_fail = now_seconds() - 5.5; /* a fork failed: stop the started ones now */
  while (alive > 0) {
    int status;
    pid_t pid = waitpid(-1, &status, rc != 0 ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) {
      if (g_signal && !forwarded) {
        for (int r = 0; r < started; r++)
          if (pids[r] > 0) kill(pids[r], g_signal);
        forwarded = 1;
      }
      continue;
    }
    if (pid < 0) break;
    if (pid == 0) {
      double waited = now_seconds() - t_fail;
      int want = waited > 10.0 ? 2 : waited > 5.0 ? 1 : 0;
      for (; phase < want; phase++)
        for (int r = 0; r < started; r++)
          if (pids[r] > 0) kill(pids[r], phase == 0 ? SIGTERM : SIGKILL);
      sleep_ms(10);
      continue;
    }
    int r = 0;
    while (r < started && pids[r] != pid) r++;
    if (r == started) continue;
    pids[r] = -1;
    alive--;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    /* the cause is the rank that died first. A rank's death makes the others fail at once
     * and they may be reaped before it (the kernel hands out zombies in fork order, and a
     * loaded machine may run this loop only once both are dead), so a rank killed by a
     * signal this launcher did not send is preferred to one that exited with an error,
     * whatever the order and the time between the reapings */
    bool outside_kill = WIFSIGNALED(status) && phase == 0 && !forwarded;
    if (failed < 0 || (outside_kill && !failed_signaled)) {
      failed = r;
      failed_signaled = outside_kill;
      describe(status, how, sizeof how);
    }
    if (rc == 0) t_fail = now_seconds(); /* the others' grace period starts */
    rc = 1;
  }
  sigaction(SIGINT, &old_int, NULL);
  sigaction(SIGTERM, &old_term, NULL);
  close(port_fd);
  if (failed >= 0)
    fprintf(stderr, "zckpt-train: error: rank %d of %d %s; the other ranks were stopped\n", failed, nproc, how);
  free(cargv);
  free(pids);
  return rc;
}
