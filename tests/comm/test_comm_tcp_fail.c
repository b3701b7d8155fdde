/* test_comm_tcp_fail.c: the tcp backend when things go wrong: a rank that dies between
 * collectives or in the middle of one, a rank that hangs (timeout), abort() (also from
 * another thread), ranks that call different collectives, and rendezvous failures (rank 0
 * late, port in use, no rank 0, world sizes that disagree, a duplicate rank, strangers
 * connecting to the port). And a rank 0 that works alone for longer than the timeout
 * while the others wait in a collective: they wait for it as long as it is busy, and
 * still fail soon when it dies or is stopped meanwhile. Every failure must be a one-line error naming the rank, and
 * come quickly: each scenario runs under a deadline. */
#include "comm_proc.h"
#include "test.h"

#include "comm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

typedef void (*scenario_fn)(int W, int rank, int port);

/* A pipe whose write end every process of a scenario holds: a rank that must stay alive
 * (and silent) until the others are done waits for its end of file, instead of sleeping a
 * time that a loaded machine may outlast. */
static int g_peers[2] = {-1, -1};

/* Returns once every other rank has exited or called release_peers(). */
static void wait_for_peers(void) {
  close(g_peers[1]);
  char b;
  while (read(g_peers[0], &b, 1) < 0 && errno == EINTR) {
  }
}

static void release_peers(void) { close(g_peers[1]); }

/* The scenario's processes; a child knows those forked before it. */
static pid_t g_pids[8];

/* Runs fn in W processes (rank r in child r); codes[r] = exit status (-1: killed after
 * limit_s). Returns how many did not exit 0. */
static int run_codes(int W, double limit_s, scenario_fn fn, int *codes) {
  int port = cp_free_port();
  pid_t *pids = g_pids;
  ZT_ASSERT(pipe(g_peers) == 0);
  fflush(NULL);
  for (int r = 0; r < W; r++) {
    pids[r] = fork();
    ZT_ASSERT(pids[r] >= 0);
    if (pids[r] == 0) {
      fn(W, r, port);
      exit(0);
    }
  }
  close(g_peers[0]);
  close(g_peers[1]);
  return cp_wait(pids, W, limit_s, codes);
}

/* Fails unless all W exit 0 within limit_s. */
static void run(const char *name, int W, double limit_s, scenario_fn fn) {
  int codes[8];
  if (run_codes(W, limit_s, fn, codes)) {
    for (int r = 0; r < W; r++)
      if (codes[r]) fprintf(stderr, "%s: rank %d exited with %d (-1: still running after %g s)\n", name, r, codes[r], limit_s);
    ZT_FAIL("%s failed", name);
  }
  fprintf(stderr, "%s: ok\n", name);
}

static zck_comm *make(int W, int r, int port, double timeout_s) {
  zck_comm_tcp_options o = {r, W, "127.0.0.1", port, timeout_s};
  zck_comm *c = NULL;
  ZT_OK(zck_comm_tcp_create(&o, &c));
  return c;
}

/* The message names `rank` with its address, as "rank 2 (127.0.0.1:" */
static void expect_names(int rank) {
  char needle[64];
  snprintf(needle, sizeof needle, "rank %d (127.0.0.1:", rank);
  if (!strstr(zck_last_error(), needle)) ZT_FAIL("message \"%s\" does not name %s...)", zck_last_error(), needle);
  if (strchr(zck_last_error(), '\n')) ZT_FAIL("message \"%s\" is more than one line", zck_last_error());
}

// ---- a rank exits between collectives: the others fail at once, naming it

static void exits_between(int W, int r, int port) {
  zck_comm *c = make(W, r, port, 20.0);
  ZT_OK(c->barrier(c));
  if (r == 2) _exit(0); /* without destroy: the kernel closes the sockets */
  size_t n = 1 << 20;
  float *x = calloc(n, sizeof *x);
  double t0 = cp_now();
  ZT_ERR(c->all_reduce(c, x, x, n, ZCK_F32, ZCK_COMM_SUM), ZCK_ERR_INTERNAL, "another rank failed");
  expect_names(2);
  ZT_ASSERT(cp_now() - t0 < 5.0);
  /* and every later collective fails at once */
  ZT_ERR(c->barrier(c), ZCK_ERR_INTERNAL, "an earlier collective failed");
  expect_names(2);
  free(x);
  zck_comm_tcp_destroy(c);
}

// ---- a rank dies in the middle of big transfers: every other fails soon; which peer
// each names depends on what it was waiting for when it noticed (rank 1, or a survivor
// that failed before it and exited), but one of them must name rank 1

static void *die_soon(void *arg) {
  usleep(30000);
  _exit(0);
  return arg;
}

static void dies_mid_transfer(int W, int r, int port) {
  zck_comm *c = make(W, r, port, 20.0);
  size_t n = 4 << 20;
  float *x = calloc(n, sizeof *x);
  pthread_t th;
  if (r == 1) ZT_ASSERT(!pthread_create(&th, NULL, die_soon, NULL));
  double t0 = cp_now();
  zck_status s = ZCK_OK;
  for (int i = 0; i < 1000 && s == ZCK_OK; i++) s = c->all_reduce(c, x, x, n, ZCK_F32, ZCK_COMM_SUM);
  ZT_ASSERT(r != 1); /* rank 1 is gone by now */
  ZT_ERR(s, ZCK_ERR_INTERNAL, "another rank failed");
  ZT_ASSERT(cp_now() - t0 < 15.0);
  free(x);
  zck_comm_tcp_destroy(c);
  if (!strstr(zck_last_error(), "rank 1 (127.0.0.1:")) {
    fprintf(stderr, "rank %d: %s\n", r, zck_last_error());
    exit(10);
  }
}

static void run_dies_mid_transfer(void) {
  int codes[8], W = 3, named = 0;
  run_codes(W, 30, dies_mid_transfer, codes);
  for (int r = 0; r < W; r++) {
    if (r != 1 && codes[r] != 0 && codes[r] != 10) ZT_FAIL("dies mid-transfer: rank %d exited with %d", r, codes[r]);
    named += r != 1 && codes[r] == 0;
  }
  if (!named) ZT_FAIL("dies mid-transfer: no rank named rank 1");
  fprintf(stderr, "dies mid-transfer: ok (%d of %d survivors named rank 1)\n", named, W - 1);
}

// ---- a rank hangs: the others time out, naming it (it stays connected and silent until
// they have exited, so nothing but their timeouts can end their barrier). Its heartbeats
// say it is alive but idle (blocked in read, no CPU): that is no reason to wait longer.

static void hangs(int W, int r, int port) {
  zck_comm *c = make(W, r, port, 1.0);
  if (r == 2) {
    wait_for_peers();
    zck_comm_tcp_destroy(c);
    return;
  }
  double t0 = cp_now();
  ZT_ERR(c->barrier(c), ZCK_ERR_INTERNAL, "sent nothing for 1 s");
  expect_names(2);
  double dt = cp_now() - t0;
  /* the upper bound only tells "about 1 s" from the 300 s default, with room for a loaded machine */
  if (dt < 0.9 || dt > 6.0) ZT_FAIL("timed out after %.2f s, not about 1 s", dt);
  zck_comm_tcp_destroy(c);
}

// ---- rank 0 works alone (a reshard, a manifest write) for longer than the timeout

/* Uses CPU for `s` seconds, as a rank at work does. */
static void busy_for(double s) {
  volatile uint64_t x = 0;
  for (double t0 = cp_now(); cp_now() - t0 < s;)
    for (int i = 0; i < 100000; i++) x += (uint64_t)i * 2654435761u;
}

/* It works 3.5 s with a 1 s timeout (ZCK_COMM_TIMEOUT_S=1, as a launcher's environment
 * gives it): the others wait in their barrier and all_reduce instead of timing out, and the
 * group goes on. */
static void busy_rank0(int W, int r, int port) {
  char v[32];
  snprintf(v, sizeof v, "%d", r);
  setenv("RANK", v, 1);
  snprintf(v, sizeof v, "%d", W);
  setenv("WORLD_SIZE", v, 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  snprintf(v, sizeof v, "%d", port);
  setenv("MASTER_PORT", v, 1);
  setenv("ZCK_COMM_TIMEOUT_S", "1", 1);
  zck_comm_tcp_options o;
  bool found = false;
  ZT_OK(zck_comm_env_options(&o, &found));
  ZT_ASSERT(found && o.timeout_s == 1.0);
  zck_comm *c = NULL;
  ZT_OK(zck_comm_tcp_create(&o, &c));
  double t0 = cp_now();
  if (r == 0) busy_for(3.5);
  ZT_OK(c->barrier(c));
  if (r != 0 && cp_now() - t0 < 3.0) ZT_FAIL("the barrier returned after %.2f s, before rank 0 was done", cp_now() - t0);
  int64_t q = r + 1;
  if (r == 0) busy_for(1.5); /* and inside a collective's call, the same */
  ZT_OK(c->all_reduce(c, &q, &q, 1, ZCK_I64, ZCK_COMM_SUM));
  ZT_EQ_INT(q, W * (W + 1) / 2);
  zck_comm_tcp_destroy(c);
}

/* It dies while the others wait for it: they fail at once, naming it. */
static void busy_rank0_dies(int W, int r, int port) {
  zck_comm *c = make(W, r, port, 1.0);
  if (r == 0) {
    busy_for(1.5);
    raise(SIGKILL);
  }
  double t0 = cp_now();
  ZT_ERR(c->barrier(c), ZCK_ERR_INTERNAL, "another rank failed");
  expect_names(0);
  double dt = cp_now() - t0;
  if (dt > 4.0) ZT_FAIL("rank 0's death was seen after %.2f s (it died after 1.5 s)", dt);
  zck_comm_tcp_destroy(c);
}

/* It is stopped (SIGSTOP: alive, its sockets open, but silent) while the others wait:
 * its heartbeats stop, and they fail after about a quarter of the 4 s timeout (1 s),
 * before the timeout itself. */
static void busy_rank0_stops(int W, int r, int port) {
  zck_comm *c = make(W, r, port, 4.0);
  if (r == 0) {
    busy_for(1.5);
    release_peers();
    raise(SIGSTOP);
    _exit(3); /* not reached: rank 1 kills it */
  }
  double t0 = cp_now();
  ZT_ERR(c->barrier(c), ZCK_ERR_INTERNAL, "stopped sending heartbeats");
  expect_names(0);
  double dt = cp_now() - t0;
  if (dt > 4.0) ZT_FAIL("the stop was seen after %.2f s (stopped after 1.5 s)", dt);
  if (r == 1) { /* once rank 2 has seen it too (else it sees rank 0 hang up, not stop) */
    wait_for_peers();
    kill(g_pids[0], SIGKILL);
  }
  zck_comm_tcp_destroy(c);
}

static void run_busy_rank0_stops(void) {
  int codes[8], W = 3;
  run_codes(W, 20, busy_rank0_stops, codes);
  if (codes[0] != 128 + SIGKILL || codes[1] || codes[2])
    ZT_FAIL("busy rank 0 stopped: exit codes %d %d %d (want 137 0 0)", codes[0], codes[1], codes[2]);
  fprintf(stderr, "busy rank 0 stopped: ok\n");
}

static void run_busy_rank0_dies(void) {
  int codes[8], W = 3;
  run_codes(W, 20, busy_rank0_dies, codes);
  if (codes[0] != 128 + SIGKILL || codes[1] || codes[2])
    ZT_FAIL("busy rank 0 dies: exit codes %d %d %d (want 137 0 0)", codes[0], codes[1], codes[2]);
  fprintf(stderr, "busy rank 0 dies: ok\n");
}

// ---- abort

static void aborts(int W, int r, int port) {
  zck_comm *c = make(W, r, port, 20.0);
  if (r == 1) {
    c->abort(c);
    c->abort(c); /* twice is fine */
    ZT_ERR(c->barrier(c), ZCK_ERR_INTERNAL, "aborted");
    /* alive until the others are done: they can wake up only because of the abort (else
     * they wait out their 20 s and the scenario's limit fails it) */
    wait_for_peers();
    zck_comm_tcp_destroy(c);
    return;
  }
  ZT_ERR(c->barrier(c), ZCK_ERR_INTERNAL, "another rank failed");
  expect_names(1);
  zck_comm_tcp_destroy(c);
}

static void *abort_later(void *arg) {
  usleep(100000);
  zck_comm *c = arg;
  c->abort(c);
  return NULL;
}

static void aborts_from_thread(int W, int r, int port) {
  zck_comm *c = make(W, r, port, 20.0);
  if (r == 0) { /* rank 1 is late: rank 0 waits in the barrier when its watchdog aborts */
    pthread_t th;
    ZT_ASSERT(!pthread_create(&th, NULL, abort_later, c));
    ZT_ERR(c->barrier(c), ZCK_ERR_INTERNAL, "aborted by this rank");
    pthread_join(th, NULL);
    release_peers();
  } else {
    /* rank 1 calls only once rank 0's barrier has failed: only the abort can end it */
    wait_for_peers();
    /* rank 0's call was on its way before it aborted: this barrier may still see it
     * complete, the next one cannot */
    zck_status s = c->barrier(c);
    if (s == ZCK_OK) s = c->barrier(c);
    ZT_ERR(s, ZCK_ERR_INTERNAL, "another rank failed");
    expect_names(0);
  }
  zck_comm_tcp_destroy(c);
}

// ---- ranks that call different collectives

static void disagree(int W, int r, int port) {
  zck_comm *c = make(W, r, port, 20.0);
  float x[12] = {0};
  ZT_ERR(c->all_reduce(c, x, x, r == 1 ? 10 : 12, ZCK_F32, ZCK_COMM_SUM), ZCK_ERR_INVALID_ARG,
         "ranks disagree: rank 0 called all_reduce(count 12, float32, sum), rank 1 called all_reduce(count 10, float32, sum)");
  zck_status s = r == 2 ? c->broadcast(c, x, 3, ZCK_F32, 0) : c->all_gather(c, x, x, 3, ZCK_F32);
  ZT_ERR(s, ZCK_ERR_INVALID_ARG, "rank 0 called all_gather(count 3, float32), rank 2 called broadcast(count 3, float32, root 0)");
  ZT_ERR(c->all_reduce(c, x, x, 4, ZCK_F32, r == 2 ? ZCK_COMM_MAX : ZCK_COMM_SUM), ZCK_ERR_INVALID_ARG,
         "rank 2 called all_reduce(count 4, float32, max)");
  /* the group still works, and sums right */
  int64_t q = r + 1;
  ZT_OK(c->all_reduce(c, &q, &q, 1, ZCK_I64, ZCK_COMM_SUM));
  ZT_EQ_INT(q, W * (W + 1) / 2);
  ZT_OK(c->barrier(c));
  zck_comm_tcp_destroy(c);
}

// ---- rendezvous

static void late_rank0(int W, int r, int port) {
  if (r == 0) usleep(400000);
  zck_comm *c = make(W, r, port, 10.0);
  int32_t v = r;
  ZT_OK(c->all_reduce(c, &v, &v, 1, ZCK_I32, ZCK_COMM_SUM));
  ZT_EQ_INT(v, W * (W - 1) / 2);
  zck_comm_tcp_destroy(c);
}

static void size_mismatch(int W, int r, int port) {
  zck_comm_tcp_options o = {r, r == 1 ? 3 : 2, "127.0.0.1", port, 5.0};
  zck_comm *c = NULL;
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INTERNAL, "rank 0 has world size 2 but rank 1 (at 127.0.0.1) has world size 3");
  ZT_ASSERT(c == NULL);
}

static void duplicate_rank(int W, int r, int port) {
  /* processes 1 and 2 both say rank 1 */
  zck_comm_tcp_options o = {r == 2 ? 1 : r, W, "127.0.0.1", port, 5.0};
  zck_comm *c = NULL;
  /* every process hears it: the second claimant, the first, rank 0 */
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INTERNAL, "two processes say they are rank 1");
  ZT_ASSERT(c == NULL);
}

/* Strangers at the port: one that sends garbage, one that says nothing. The group forms
 * anyway, without waiting for the silent one. */
static void strangers(int W, int r, int port) {
  if (r == W - 1) {
    usleep(100000); /* rank 0 listens by now */
    int fds[2];
    for (int i = 0; i < 2; i++) {
      fds[i] = socket(AF_INET, SOCK_STREAM, 0);
      struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      ZT_ASSERT(connect(fds[i], (struct sockaddr *)&a, sizeof a) == 0);
    }
    ZT_ASSERT(send(fds[0], "GET / HTTP/1.0\r\n\r\nxxxxxx", 24, MSG_NOSIGNAL) == 24);
    usleep(100000);
    double t0 = cp_now();
    zck_comm *c = make(W, 1, port, 10.0);
    ZT_ASSERT(cp_now() - t0 < 4.0); /* not held up by the silent one (dropped after 5 s) */
    ZT_OK(c->barrier(c));
    zck_comm_tcp_destroy(c);
    close(fds[0]);
    close(fds[1]);
  } else {
    zck_comm *c = make(W, 0, port, 10.0);
    ZT_OK(c->barrier(c));
    zck_comm_tcp_destroy(c);
  }
}

static void single_process_checks(void) {
  zck_comm *c = NULL;
  /* bad options */
  zck_comm_tcp_options o = {3, 3, "127.0.0.1", 29500, 1.0};
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INVALID_ARG, "rank 3 is not in 0..2");
  o = (zck_comm_tcp_options){0, 0, "127.0.0.1", 29500, 1.0};
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INVALID_ARG, "world size 0");
  o = (zck_comm_tcp_options){0, 2, "127.0.0.1", 0, 1.0};
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INVALID_ARG, "master port 0");
  o = (zck_comm_tcp_options){1, 2, NULL, 29500, 1.0};
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INVALID_ARG, "MASTER_ADDR");
  ZT_ASSERT(c == NULL);
  zck_comm_tcp_destroy(NULL);

  /* port in use: rank 0 says so at once */
  int l = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t alen = sizeof a;
  ZT_ASSERT(bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 4) == 0);
  ZT_ASSERT(getsockname(l, (struct sockaddr *)&a, &alen) == 0);
  int port = ntohs(a.sin_port);
  o = (zck_comm_tcp_options){0, 2, "127.0.0.1", port, 5.0};
  double t0 = cp_now();
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INTERNAL, "already in use");
  ZT_ASSERT(cp_now() - t0 < 1.0);
  close(l);

  /* nobody at the master port: retried until the timeout, then named */
  port = cp_free_port();
  o = (zck_comm_tcp_options){1, 2, "127.0.0.1", port, 0.5};
  t0 = cp_now();
  char needle_buf[96];
  const char *needle = needle_buf;
  snprintf(needle_buf, sizeof needle_buf, "rank 1: cannot connect to rank 0 at 127.0.0.1:%d within 0.5 s", port);
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INTERNAL, needle);
  double dt = cp_now() - t0;
  if (dt < 0.45 || dt > 2.0) ZT_FAIL("gave up after %.2f s, not about 0.5 s", dt);

  /* rank 0 waits for the others no longer than the timeout either */
  o = (zck_comm_tcp_options){0, 3, "127.0.0.1", cp_free_port(), 0.3};
  ZT_ERR(zck_comm_tcp_create(&o, &c), ZCK_ERR_INTERNAL, "ranks 1, 2 did not connect");
  fprintf(stderr, "single-process checks: ok\n");
}

int main(void) {
  single_process_checks();
  run("exits between collectives", 3, 15, exits_between);
  run_dies_mid_transfer();
  run("hangs", 3, 10, hangs);
  run("busy rank 0", 3, 20, busy_rank0);
  run_busy_rank0_dies();
  run_busy_rank0_stops();
  run("abort", 3, 10, aborts);
  run("abort from a thread", 2, 10, aborts_from_thread);
  run("disagreeing calls", 3, 10, disagree);
  run("rank 0 starts last", 3, 10, late_rank0);
  run("world sizes disagree", 2, 10, size_mismatch);
  run("duplicate rank", 3, 15, duplicate_rank);
  run("strangers at the port", 2, 10, strangers);
  return 0;
}
