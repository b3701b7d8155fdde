/* comm_proc.c: see comm_proc.h. */
#include "comm_proc.h"

#include "test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The socket stays bound (not listening) for the life of the process: a port only seen
 * free could meanwhile become another process's ephemeral port (a parallel test's
 * bind(0) or connect()), and rank 0 would fail with "port in use". With SO_REUSEADDR
 * here and in rank 0, rank 0 can still listen on it. The socket is left open on purpose
 * (the forked ranks share it); it closes when the process exits. */
int cp_free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ZT_ASSERT(fd >= 0);
  int one = 1;
  ZT_ASSERT(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ZT_ASSERT(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
  socklen_t len = sizeof a;
  ZT_ASSERT(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
  return ntohs(a.sin_port);
}

double cp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cp_wait(const pid_t *pids, int n, double timeout_s, int *codes) {
  int left = n, bad = 0;
  for (int i = 0; i < n; i++) codes[i] = -2;
  double deadline = cp_now() + timeout_s;
  while (left > 0) {
    for (int i = 0; i < n; i++) {
      if (codes[i] != -2) continue;
      int st;
      pid_t p = waitpid(pids[i], &st, WNOHANG);
      if (p == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (codes[i]) bad++;
        left--;
      }
    }
    if (left > 0 && cp_now() > deadline) {
      for (int i = 0; i < n; i++)
        if (codes[i] == -2) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], NULL, 0);
          codes[i] = -1;
          bad++;
        }
      break;
    }
    if (left > 0) usleep(2000);
  }
  return bad;
}
