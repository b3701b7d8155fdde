/* comm_tcp_mesh.c: the tcp backend's rendezvous: connects W processes pairwise.
 *
 * Rank 0 listens at MASTER_PORT (every interface, IPv6 dual-stack when the host has it).
 * Every other rank opens its own listening socket on an ephemeral port, connects to rank 0
 * (retrying until the deadline: rank 0 may start last) and sends a hello: its rank, the
 * world size and that port. Rank 0 sees each one's address as the connection's source
 * address, and once all W-1 have joined it sends every one of them a reply with the table
 * of addresses (or, when something is wrong, the one-line error, so every rank reports the
 * same cause). Then rank j connects to every rank 0 < i < j at i's listening port with a
 * hello of its own. The connection with rank 0 doubles as the 0..j link.
 *
 * Wire format (little endian): hello = "ZCKM" magic, version, rank, size, listen port,
 * 0 (24 bytes); reply = magic, status (0 ok, 1 error), a 256-byte NUL-padded message, then
 * when ok W entries of a 256-byte NUL-padded host and a u32 port. A connection whose first
 * bytes are not a hello (a port scanner, a stale client) is dropped and waited past; a
 * hello with another world size or a rank already taken is an error.
 */
#include "comm_tcp_internal.h"

#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TM_MAGIC 0x4d4b435au /* "ZCKM" */
#define TM_VERSION 1u
#define TM_HELLO 24
#define TM_MSG 256
#define TM_HOST 256
#define TM_ENTRY (TM_HOST + 4)
#define TM_HELLO_WAIT_S 5.0 /* a real rank sends its hello at once; a silent client is dropped */

/* tm_full results besides 0 and errno values */
#define TM_EOF (-1)
#define TM_TIMEOUT (-2)

double zck__tcp_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int tm_ms(double seconds) {
  if (seconds <= 0) return 0;
  if (seconds > 1e6) return 1000000000;
  return (int)(seconds * 1000.0) + 1;
}

static void tm_sleep(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) && errno == EINTR) {
  }
}

static const char *tm_why(int r) {
  return r == TM_EOF ? "connection closed" : r == TM_TIMEOUT ? "timed out" : strerror(r);
}

/* Sends or receives exactly n bytes on a non-blocking socket before the deadline. */
static int tm_full(int fd, void *buf, size_t n, bool out, double deadline) {
  uint8_t *p = buf;
  while (n) {
    ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k > 0) {
      p += k;
      n -= (size_t)k;
      continue;
    }
    if (k == 0) return TM_EOF;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return errno;
    double left = deadline - zck__tcp_now();
    if (left <= 0) return TM_TIMEOUT;
    struct pollfd pf = {fd, out ? POLLOUT : POLLIN, 0};
    poll(&pf, 1, tm_ms(left));
  }
  return 0;
}

static void tm_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void tm_format_addr(char *out, size_t n, const char *host, int port) {
  snprintf(out, n, strchr(host, ':') ? "[%s]:%d" : "%s:%d", host, port);
}

/* The numeric host of a socket address; an IPv4 address seen through a dual-stack socket
 * is written as plain IPv4, so that ranks without IPv6 can connect to it. */
static void tm_host_of(const struct sockaddr_storage *ss, char *host, size_t n) {
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a6 = (const struct sockaddr_in6 *)ss;
    if (IN6_IS_ADDR_V4MAPPED(&a6->sin6_addr)) {
      inet_ntop(AF_INET, &a6->sin6_addr.s6_addr[12], host, (socklen_t)n);
      return;
    }
  }
  if (getnameinfo((const struct sockaddr *)ss, ss->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                          : sizeof(struct sockaddr_in),
                  host, (socklen_t)n, NULL, 0, NI_NUMERICHOST))
    snprintf(host, n, "?");
}

/* A listening socket on every interface of `family` at `port` (0: ephemeral). errno or 0. */
static int tm_listen(int family, int port, int backlog, int *out) {
  *out = -1;
  int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return errno;
  int one = 1, zero = 0;
  if (port) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* restart past TIME_WAIT */
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len;
  if (family == AF_INET6) {
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    a->sin6_port = htons((uint16_t)port);
    len = sizeof *a;
  } else {
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    a->sin_port = htons((uint16_t)port);
    len = sizeof *a;
  }
  if (bind(fd, (struct sockaddr *)&ss, len) || listen(fd, backlog)) {
    int e = errno;
    close(fd);
    return e;
  }
  *out = fd;
  return 0;
}

static int tm_local_port(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof ss;
  if (getsockname(fd, (struct sockaddr *)&ss, &len)) return 0;
  return ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                  : ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* Connects to host:port, retrying (refused, unreachable, name not yet known) until the
 * deadline. */
static zck_status tm_connect(int rank, int target, const char *host, int port, double deadline, double timeout_s,
                             int *out) {
  char ps[16], where[ZCK__TCP_ADDR_MAX], last[160] = "no address";
  snprintf(ps, sizeof ps, "%d", port);
  tm_format_addr(where, sizeof where, host, port);
  double backoff = 0.02;
  for (;;) {
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g) snprintf(last, sizeof last, "%s", g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        snprintf(last, sizeof last, "%s", strerror(errno));
        continue;
      }
      int e = connect(fd, ai->ai_addr, ai->ai_addrlen) ? errno : 0;
      if (e == EINPROGRESS) {
        struct pollfd pf = {fd, POLLOUT, 0};
        int pr;
        while ((pr = poll(&pf, 1, tm_ms(deadline - zck__tcp_now()))) < 0 && errno == EINTR) {
        }
        socklen_t el = sizeof e;
        if (pr == 0)
          e = ETIMEDOUT;
        else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el))
          e = errno;
      }
      if (e == 0) {
        freeaddrinfo(res);
        tm_nodelay(fd);
        *out = fd;
        return ZCK_OK;
      }
      snprintf(last, sizeof last, "%s", strerror(e));
      close(fd);
    }
    if (res) freeaddrinfo(res);
    double left = deadline - zck__tcp_now();
    if (left <= 0)
      return zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank %d: cannot connect to rank %d at %s within %g s: %s%s", rank,
                       target, where, timeout_s, last,
                       target == 0 ? " (is rank 0 running, and are MASTER_ADDR/MASTER_PORT right?)" : "");
    tm_sleep(backoff < left ? backoff : left);
    backoff = backoff * 2 < 0.5 ? backoff * 2 : 0.5;
  }
}

typedef struct tm_hello {
  uint32_t magic, version, rank, size, port;
} tm_hello;

static void tm_put_hello(uint8_t *b, int rank, int size, int port) {
  memset(b, 0, TM_HELLO);
  zck__put32(b, TM_MAGIC);
  zck__put32(b + 4, TM_VERSION);
  zck__put32(b + 8, (uint32_t)rank);
  zck__put32(b + 12, (uint32_t)size);
  zck__put32(b + 16, (uint32_t)port);
}

/* Best effort: tells a joining rank why the rendezvous failed. */
static void tm_send_error(int fd, const char *msg, double deadline) {
  uint8_t b[8 + TM_MSG];
  memset(b, 0, sizeof b);
  zck__put32(b, TM_MAGIC);
  zck__put32(b + 4, 1);
  snprintf((char *)b + 8, TM_MSG, "%s", msg);
  tm_full(fd, b, sizeof b, true, deadline);
}

/* A connection accepted but whose hello has not all arrived: they are read side by side,
 * so a silent client holds up nobody. */
typedef struct tm_pending {
  int fd;
  size_t got;
  double until;
  struct sockaddr_storage ss;
  uint8_t b[TM_HELLO];
} tm_pending;
#define TM_PENDING_MAX 32

/* Checks a complete hello; on success stores the rank's socket (and host and listening
 * port when hosts != NULL). Writes the reason to msg otherwise. */
static void tm_take_hello(tm_pending *p, const zck_comm_tcp_options *o, int lo, int hi, int *fds,
                          char (*hosts)[TM_HOST], int *ports, char *msg, size_t mn) {
  char host[80]; /* numeric: INET6_ADDRSTRLEN and a scope */
  tm_host_of(&p->ss, host, sizeof host);
  tm_hello h = {zck__le32(p->b), zck__le32(p->b + 4), zck__le32(p->b + 8), zck__le32(p->b + 12),
                zck__le32(p->b + 16)};
  if (h.version != TM_VERSION)
    snprintf(msg, mn, "tcp comm: rank %d: a process at %s speaks protocol version %u, this one %u", o->rank, host,
             h.version, TM_VERSION);
  else if ((int)h.size != o->size)
    snprintf(msg, mn, "tcp comm: rank %d has world size %d but rank %u (at %s) has world size %u", o->rank, o->size,
             h.rank, host, h.size);
  else if ((int)h.rank < lo || (int)h.rank >= hi || h.port > 65535 || (hosts && h.port == 0))
    snprintf(msg, mn, "tcp comm: rank %d: unexpected hello from %s claiming rank %u", o->rank, host, h.rank);
  else if (fds[h.rank] >= 0)
    snprintf(msg, mn, "tcp comm: two processes say they are rank %u (one at %s); is RANK set right?", h.rank, host);
  if (*msg) return;
  tm_nodelay(p->fd);
  fds[h.rank] = p->fd;
  p->fd = -1;
  if (hosts) {
    snprintf(hosts[h.rank], TM_HOST, "%s", host);
    ports[h.rank] = (int)h.port;
  }
}

/* Accepts the ranks in [lo, hi) on the listening socket: fds[k], and their hosts and
 * listening ports when hosts != NULL. A connection that does not start with a hello within
 * TM_HELLO_WAIT_S is dropped. When `tell` (rank 0), a rank whose hello is refused is sent
 * the reason. */
static zck_status tm_accept_ranks(int lfd, const zck_comm_tcp_options *o, int lo, int hi, double deadline,
                                  double timeout_s, bool tell, int *fds, char (*hosts)[TM_HOST], int *ports) {
  tm_pending pend[TM_PENDING_MAX];
  struct pollfd pf[TM_PENDING_MAX + 1];
  int np = 0, need = hi - lo;
  char msg[TM_MSG] = "";
  while (need > 0 && !*msg) {
    double now = zck__tcp_now(), left = deadline - now;
    if (left <= 0) {
      char missing[96] = "";
      size_t m = 0;
      for (int k = lo; k < hi && m + 16 < sizeof missing; k++)
        if (fds[k] < 0) m += (size_t)snprintf(missing + m, sizeof missing - m, "%s%d", m ? ", " : "", k);
      snprintf(msg, sizeof msg, "tcp comm: rank %d: rank%s %s did not connect (port %d) within %g s", o->rank,
               need > 1 ? "s" : "", missing, tm_local_port(lfd), timeout_s);
      break;
    }
    for (int i = 0; i < np; i++) {
      if (pend[i].until < left + now) left = pend[i].until - now;
      pf[i + 1] = (struct pollfd){pend[i].fd, POLLIN, 0};
    }
    pf[0] = (struct pollfd){np < TM_PENDING_MAX ? lfd : -1, POLLIN, 0};
    if (poll(pf, (nfds_t)np + 1, tm_ms(left)) < 0) continue;
    now = zck__tcp_now();
    int keep = 0;
    for (int i = 0; i < np; i++) {
      tm_pending *p = &pend[i];
      if (pf[i + 1].revents && !*msg) {
        ssize_t k = recv(p->fd, p->b + p->got, TM_HELLO - p->got, 0);
        if (k > 0) p->got += (size_t)k;
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) p->until = 0; /* gone: drop */
        if (p->got == TM_HELLO) {
          if (zck__le32(p->b) == TM_MAGIC) {
            tm_take_hello(p, o, lo, hi, fds, hosts, ports, msg, sizeof msg);
            if (p->fd < 0) need--;
            else if (tell) tm_send_error(p->fd, msg, now + 1.0);
          }
          p->until = 0;
        }
      }
      if (p->fd >= 0 && p->until <= now) {
        close(p->fd);
        p->fd = -1;
      }
      if (p->fd >= 0) pend[keep++] = *p;
    }
    np = keep;
    if (pf[0].revents & POLLIN) {
      tm_pending *p = &pend[np];
      socklen_t sl = sizeof p->ss;
      p->fd = accept4(lfd, (struct sockaddr *)&p->ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (p->fd >= 0) { /* else EAGAIN, ECONNABORTED, ...: wait for the next */
        p->got = 0;
        p->until = now + TM_HELLO_WAIT_S;
        np++;
      }
    }
  }
  for (int i = 0; i < np; i++) close(pend[i].fd);
  if (*msg) return zck__fail(ZCK_ERR_INTERNAL, "%s", msg);
  return ZCK_OK;
}

static void tm_close_all(int *fds, int size) {
  for (int k = 0; k < size; k++) {
    if (fds[k] >= 0) close(fds[k]);
    fds[k] = -1;
  }
}

// ---- rank 0

static zck_status tm_rank0(const zck_comm_tcp_options *o, double deadline, double timeout_s, int *fds,
                           char (*addrs)[ZCK__TCP_ADDR_MAX]) {
  int W = o->size, lfd = -1;
  int e = tm_listen(AF_INET6, o->master_port, W + 16, &lfd);
  if (e == EAFNOSUPPORT || e == EADDRNOTAVAIL || e == EINVAL) e = tm_listen(AF_INET, o->master_port, W + 16, &lfd);
  if (e == EADDRINUSE)
    return zck__fail(ZCK_ERR_INTERNAL,
                     "tcp comm: rank 0: port %d is already in use (another job on this host?); choose another "
                     "MASTER_PORT",
                     o->master_port);
  if (e) return zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank 0: cannot listen on port %d: %s", o->master_port, strerror(e));

  char (*hosts)[TM_HOST] = zck__calloc((size_t)W, sizeof *hosts);
  int *ports = zck__calloc((size_t)W, sizeof *ports);
  uint8_t *reply = NULL;
  size_t rn = 8 + TM_MSG + (size_t)W * TM_ENTRY;
  zck_status s = hosts && ports ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) s = tm_accept_ranks(lfd, o, 1, W, deadline, timeout_s, true, fds, hosts, ports);
  if (s == ZCK_OK && !(reply = zck__calloc(1, rn))) s = ZCK_ERR_NO_MEMORY;
  close(lfd);
  if (s != ZCK_OK) {
    /* the ranks that joined hear why, instead of a bare hang-up */
    for (int k = 1; k < W; k++)
      if (fds[k] >= 0) tm_send_error(fds[k], zck_last_error(), zck__tcp_now() + 1.0);
    goto out;
  }
  snprintf(hosts[0], TM_HOST, "%s", o->master_addr ? o->master_addr : "127.0.0.1");
  ports[0] = o->master_port;
  zck__put32(reply, TM_MAGIC);
  for (int k = 0; k < W; k++) {
    uint8_t *en = reply + 8 + TM_MSG + (size_t)k * TM_ENTRY;
    memcpy(en, hosts[k], strnlen(hosts[k], TM_HOST - 1));
    zck__put32(en + TM_HOST, (uint32_t)ports[k]);
    tm_format_addr(addrs[k], ZCK__TCP_ADDR_MAX, hosts[k], ports[k]);
  }
  for (int k = 1; k < W && s == ZCK_OK; k++) {
    int r = tm_full(fds[k], reply, rn, true, deadline);
    if (r) s = zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank 0: sending the address table to rank %d (%s): %s", k, addrs[k],
                         tm_why(r));
  }
out:
  free(hosts);
  free(ports);
  free(reply);
  if (s != ZCK_OK) tm_close_all(fds, W);
  return s;
}

// ---- ranks 1 .. W-1

static zck_status tm_rank_k(const zck_comm_tcp_options *o, double deadline, double timeout_s, int *fds,
                            char (*addrs)[ZCK__TCP_ADDR_MAX]) {
  int W = o->size, me = o->rank, lfd = -1;
  tm_format_addr(addrs[0], ZCK__TCP_ADDR_MAX, o->master_addr, o->master_port);
  ZCK_TRY(tm_connect(me, 0, o->master_addr, o->master_port, deadline, timeout_s, &fds[0]));
  uint8_t *table = NULL;
  size_t tn = 8 + TM_MSG + (size_t)W * TM_ENTRY;
  zck_status s = ZCK_OK;
  /* listen in the family that reached rank 0: the others will reach us the same way */
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  int e = getsockname(fds[0], (struct sockaddr *)&ss, &sl) ? errno : tm_listen(ss.ss_family, 0, W + 16, &lfd);
  if (e) {
    s = zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank %d: cannot listen for the other ranks: %s", me, strerror(e));
    goto out;
  }
  uint8_t hello[TM_HELLO];
  tm_put_hello(hello, me, W, tm_local_port(lfd));
  int r = tm_full(fds[0], hello, sizeof hello, true, deadline);
  if (!(table = zck__malloc(tn))) {
    s = ZCK_ERR_NO_MEMORY;
    goto out;
  }
  if (!r) r = tm_full(fds[0], table, 8 + TM_MSG, false, deadline);
  if (r) {
    s = zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank %d: rendezvous with rank 0 at %s: %s%s", me, addrs[0], tm_why(r),
                  r == TM_EOF ? " (see rank 0's error)" : "");
    goto out;
  }
  if (zck__le32(table) != TM_MAGIC) {
    s = zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank %d: %s does not answer like a zckpt rank 0", me, addrs[0]);
    goto out;
  }
  if (zck__le32(table + 4) != 0) {
    table[8 + TM_MSG - 1] = 0;
    s = zck__fail(ZCK_ERR_INTERNAL, "%s (reported by rank 0 to rank %d)", (char *)table + 8, me);
    goto out;
  }
  r = tm_full(fds[0], table + 8 + TM_MSG, tn - 8 - TM_MSG, false, deadline);
  if (r) {
    s = zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank %d: reading the address table from rank 0 at %s: %s", me, addrs[0],
                  tm_why(r));
    goto out;
  }
  for (int k = 1; k < W; k++) {
    uint8_t *en = table + 8 + TM_MSG + (size_t)k * TM_ENTRY;
    en[TM_HOST - 1] = 0;
    tm_format_addr(addrs[k], ZCK__TCP_ADDR_MAX, (char *)en, (int)zck__le32(en + TM_HOST));
  }
  /* connect down (to every 0 < k < me), then accept from every rank above: the kernel's
   * backlog completes our connections before the peers call accept, so no rank waits on
   * another's order */
  for (int k = 1; k < me && s == ZCK_OK; k++) {
    uint8_t *en = table + 8 + TM_MSG + (size_t)k * TM_ENTRY;
    s = tm_connect(me, k, (char *)en, (int)zck__le32(en + TM_HOST), deadline, timeout_s, &fds[k]);
    if (s == ZCK_OK) {
      tm_put_hello(hello, me, W, 0);
      r = tm_full(fds[k], hello, sizeof hello, true, deadline);
      if (r) s = zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank %d: greeting rank %d at %s: %s", me, k, addrs[k], tm_why(r));
    }
  }
  if (s == ZCK_OK) s = tm_accept_ranks(lfd, o, me + 1, W, deadline, timeout_s, false, fds, NULL, NULL);
out:
  if (lfd >= 0) close(lfd);
  free(table);
  if (s != ZCK_OK) tm_close_all(fds, W);
  return s;
}

zck_status zck__tcp_mesh(const zck_comm_tcp_options *o, double timeout_s, int *fds, char (*addrs)[ZCK__TCP_ADDR_MAX]) {
  for (int k = 0; k < o->size; k++) fds[k] = -1;
  double deadline = zck__tcp_now() + timeout_s;
  tm_format_addr(addrs[o->rank], ZCK__TCP_ADDR_MAX, "this host", 0);
  if (o->size == 1) return ZCK_OK;
  return o->rank == 0 ? tm_rank0(o, deadline, timeout_s, fds, addrs) : tm_rank_k(o, deadline, timeout_s, fds, addrs);
}
