/* comm_tcp.c: the tcp collective backend: one process per rank, a full mesh of sockets
 * (built by comm_tcp_mesh.c), buffers in host memory.
 *
 * Every collective starts with a header exchange: each rank sends every other its call
 * (kind, count, dtype, op, root, sequence number) and compares all W of them, so ranks
 * that disagree fail together with one line naming both calls, before any data moves
 * (the streams stay in step and the group stays usable, as with the local backend). A
 * barrier is the header exchange alone.
 *
 * Data moves with non-blocking sockets driven by one poll() loop that sends to and
 * receives from every peer at once, so two ranks sending big buffers to each other never
 * both block on full socket buffers:
 *   all_gather   under 64 KiB in all every rank sends its block to every other (one hop);
 *                from 64 KiB a pipelined ring: each rank sends one neighbour its block and
 *                forwards the others' as their bytes arrive (one link in, one out);
 *   broadcast    under 64 KiB the root sends to every rank; from 64 KiB a pipelined chain
 *                root, root+1, ...: the root sends one copy, not W-1, each rank forwards
 *                every byte as soon as it has it;
 *   reduce_scatter  rank r receives block r of every rank's input, chunk by chunk (bounded
 *                scratch: one chunk per peer) and reduces each chunk over ranks 0..W-1 in
 *                that order, element by element, exactly as comm_local.c does (BF16/F16
 *                summed in float, rounded once): the same bits as the local backend;
 *   all_reduce   reduce_scatter on comm_local's element chunks, then all_gather of them.
 * Gathers and broadcasts only copy, so the route does not change a bit.
 *
 * Failure: a peer's hang-up, an I/O error, or no byte moving for timeout_s is a one-line
 * error naming the peer's rank and address; the handle then stays failed (every later
 * collective fails at once). On a timeout or a local error this rank also shuts its
 * sockets, so peers waiting on it wake up instead of waiting out their own timeouts;
 * abort() does the same. A hang-up is not passed on that way: every peer sees the dead
 * rank's hang-up itself at the latest in the next header exchange, and names the right rank.
 *
 * Busy is not hung: between calls a thread of each rank sends a heartbeat frame to every
 * peer whose call header waits unread in its socket (a peer waiting for this rank), saying
 * whether this process used CPU (or did block I/O) since the last one. A waiting rank
 * counts a busy peer's beats as progress, so a rank 0 that reshards or writes a manifest
 * alone for longer than timeout_s does not fail the others; a peer that beats idle (blocked
 * for good: a deadlock, a read that never returns) still times out after timeout_s; a busy
 * peer whose beats stop (stopped, host gone) fails the wait after timeout_s / 4 within
 * [1 s, 10 s]; a dead process is seen at once (its sockets close). Beats go only between
 * calls, on an otherwise idle socket, so they never interleave with a call's bytes.
 */
#include "comm_tcp_internal.h"

#include "util.h"

#include <errno.h>
#include <linux/sockios.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef enum { TC_ALL_REDUCE = 1, TC_REDUCE_SCATTER, TC_ALL_GATHER, TC_BROADCAST, TC_BARRIER } tc_kind;
#define TC_HEARTBEAT 0x4842u /* a header-sized frame between calls: "alive" (op: 1 = busy) */

#define TC_MAGIC 0x4354435au /* "ZCTC" */
#define TC_HDR 40
#define TC_MSG 1024
#define TC_SCRATCH_MAX ((size_t)32 << 20) /* all peers' chunk slots together, at most */
/* below this many bytes in all, gathers and broadcasts go straight from the owner to every
 * rank (one hop: latency); from it on, around the ring or down the chain (bandwidth) */
#define TC_RING_MIN ((size_t)64 << 10)
#define TC_HB_CPU_S 1e-3   /* CPU seconds per heartbeat interval that make a rank "busy" */
/* a busy rank whose heartbeats stop this long is gone (stopped, host down): timeout_s / 4
 * within [1 s, 10 s], and at most timeout_s */
#define TC_HB_DEAD_MIN_S 1.0
#define TC_HB_DEAD_MAX_S 10.0

static const char *tc_kind_name(int k) {
  switch (k) {
  case TC_ALL_REDUCE: return "all_reduce";
  case TC_REDUCE_SCATTER: return "reduce_scatter";
  case TC_ALL_GATHER: return "all_gather";
  case TC_BROADCAST: return "broadcast";
  case TC_BARRIER: return "barrier";
  }
  return "?";
}

/* One peer's traffic in the current step: bytes left to send, bytes left to receive. */
typedef struct tc_link {
  const uint8_t *sp;
  size_t sn;
  uint8_t *rp;
  size_t rn;
} tc_link;

/* A byte stream over a ring buffer (base, ring bytes): `total` bytes from offset `start`,
 * wrapping once at most; `assigned` of them handed to a link so far. The relays of the
 * ring all_gather and the chain broadcast feed their links from these. */
typedef struct tc_stream {
  uint8_t *base;
  size_t ring, start, total, assigned;
} tc_stream;

typedef struct tc_call {
  uint32_t kind;
  uint64_t seq, count;
  uint32_t dt, op;
  int32_t root;
} tc_call;

typedef struct tc {
  zck_comm handle;
  int rank, size;
  double timeout_s;
  int *fds;                          /* [size], -1 for this rank */
  char (*addrs)[ZCK__TCP_ADDR_MAX];  /* [size] */
  tc_link *lk;                       /* [size] */
  struct pollfd *pfd;                /* [size] */
  int *pk;                           /* [size]: the peer of each pfd entry */
  uint8_t (*hdrs)[TC_HDR];           /* [size]: the calls received in the header exchange */
  uint64_t seq;
  tc_call call;                      /* the current call, for messages */
  atomic_int aborted;
  bool failed;
  char fail_msg[TC_MSG];
  size_t chunk;                      /* elements per reduction chunk */
  uint8_t *scratch;                  /* [size-1][chunk * 8]: one chunk per peer */
  void *acc, *tmp;                   /* [chunk] of double / float */
  /* relay (ring all_gather, chain broadcast): bytes in from s_from, out to s_to (-1: none);
   * the out stream may carry s_own bytes at once, the rest as they arrive */
  bool relay;
  int s_from, s_to;
  tc_stream sin, sout;
  size_t s_own;
  /* heartbeats: between calls a thread tells every peer that waits for this rank (its call
   * header sits unread in our socket) that this rank lives, and whether it is busy (used
   * CPU since the last beat); a waiting rank's timeout then counts only idle time */
  bool in_hdr;                       /* receiving call headers (heartbeats may come) */
  double *hb_seen;                   /* [size]: last heartbeat from each peer in this wait; 0 */
  bool *hb_busy;                     /* [size]: and whether it said busy */
  double hb_interval, hb_dead_s;
  pthread_t hb_thread;
  bool hb_started, hb_stop, hb_quiet; /* quiet: in a call, or failed */
  pthread_mutex_t hb_mu;
  pthread_cond_t hb_cv;
} tc;

// ---- failure

static void tc_shutdown_all(tc *t) {
  for (int k = 0; k < t->size; k++)
    if (t->fds[k] >= 0) shutdown(t->fds[k], SHUT_RDWR);
}

static void tc_call_str(const tc_call *c, char *b, size_t n) {
  const char *ops[] = {"sum", "max", "min"};
  switch (c->kind) {
  case TC_ALL_REDUCE:
  case TC_REDUCE_SCATTER:
    snprintf(b, n, "%s(count %llu, %s, %s)", tc_kind_name((int)c->kind), (unsigned long long)c->count,
             zck_dtype_name((zck_dtype)c->dt), c->op < 3 ? ops[c->op] : "?");
    break;
  case TC_BROADCAST:
    snprintf(b, n, "broadcast(count %llu, %s, root %d)", (unsigned long long)c->count, zck_dtype_name((zck_dtype)c->dt),
             c->root);
    break;
  case TC_ALL_GATHER:
    snprintf(b, n, "all_gather(count %llu, %s)", (unsigned long long)c->count, zck_dtype_name((zck_dtype)c->dt));
    break;
  default: snprintf(b, n, "%s()", tc_kind_name((int)c->kind)); break;
  }
}

/* Records a failure with peer k (k < 0: none) and returns it; the handle stays failed.
 * `pass_on`: shut every socket so that the peers waiting on this rank wake up. */
static zck_status tc_fail(tc *t, int k, bool pass_on, const char *fmt, const char *detail) {
  char call[160], what[400];
  tc_call_str(&t->call, call, sizeof call);
  snprintf(what, sizeof what, fmt, detail);
  if (k >= 0)
    snprintf(t->fail_msg, sizeof t->fail_msg, "tcp comm: rank %d: rank %d (%s) %s during %s, call #%llu", t->rank, k,
             t->addrs[k], what, call, (unsigned long long)t->seq);
  else
    snprintf(t->fail_msg, sizeof t->fail_msg, "tcp comm: rank %d: %s during %s, call #%llu", t->rank, what, call,
             (unsigned long long)t->seq);
  t->failed = true;
  if (pass_on) tc_shutdown_all(t);
  return zck__fail(ZCK_ERR_INTERNAL, "%s", t->fail_msg);
}

/* ", rank 1 (addr) hung up too" for every other peer whose side is closed as well, so that
 * when a peer that failed because of another exits first, the other one is named too. */
static void tc_also_gone(tc *t, int k, char *b, size_t n) {
  size_t m = 0;
  int named = 0;
  b[0] = 0;
  for (int j = 0; j < t->size && m + 1 < n; j++) {
    if (j == k || j == t->rank || t->fds[j] < 0) continue;
    struct pollfd pf = {t->fds[j], POLLRDHUP, 0};
    if (poll(&pf, 1, 0) != 1 || !(pf.revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
    if (named++ == 3) {
      m += (size_t)snprintf(b + m, n - m, ", ...");
      break;
    }
    m += (size_t)snprintf(b + m, n - m, "%s rank %d (%s)", named == 1 ? "; also hung up:" : ",", j, t->addrs[j]);
  }
}

static zck_status tc_hung_up(tc *t, int k, const char *how) {
  char also[300], why[400];
  tc_also_gone(t, k, also, sizeof also);
  snprintf(why, sizeof why, "%s (another rank failed or exited%s)", how, also);
  return tc_fail(t, k, false, "%s", why);
}

// ---- the progress loop

/* Hands the link the stream's next bytes up to `limit`: extends its current segment when
 * they follow on, else starts a new one once the current is done. */
static void tc_feed(tc_stream *s, size_t limit, uint8_t **p, size_t *n) {
  if (limit > s->total) limit = s->total;
  while (s->assigned < limit) {
    size_t pos = (s->start + s->assigned) % s->ring;
    size_t take = limit - s->assigned < s->ring - pos ? limit - s->assigned : s->ring - pos;
    if (*n && *p + *n != s->base + pos) return; /* the wrap: after this segment */
    if (!*n) *p = s->base + pos;
    *n += take;
    s->assigned += take;
  }
}

/* The relay's links: receive the whole in stream; send what is ours and what has arrived. */
static void tc_relay_feed(tc *t) {
  size_t got = 0;
  if (t->s_from >= 0) {
    tc_link *in = &t->lk[t->s_from];
    tc_feed(&t->sin, t->sin.total, &in->rp, &in->rn);
    got = t->sin.assigned - in->rn;
  }
  if (t->s_to >= 0) {
    tc_link *out = &t->lk[t->s_to];
    uint8_t *p = (uint8_t *)out->sp;
    tc_feed(&t->sout, t->s_own + got, &p, &out->sn);
    out->sp = p;
  }
}

/* A complete 40-byte frame from peer k in the header exchange: a heartbeat (then the link
 * waits for the next frame) or the call. Returns whether it was a busy peer's heartbeat
 * or the call (the wait made progress). */
static bool tc_frame(tc *t, int k, tc_link *l, double now) {
  uint8_t *b = l->rp - TC_HDR;
  if (zck__le32(b) != TC_MAGIC || zck__le32(b + 4) != TC_HEARTBEAT) return true;
  t->hb_seen[k] = now;
  t->hb_busy[k] = zck__le32(b + 28) != 0;
  l->rp = b;
  l->rn = TC_HDR;
  return t->hb_busy[k];
}

/* Moves bytes on every link until every receive is complete, and every send too when
 * `sends` (otherwise sends progress while receives are awaited and go on in the next
 * step). Fails when no byte moves for timeout_s (a peer that only says, by heartbeats, that
 * it is alive but idle counts as moving nothing; one busy counts as moving), or when a
 * busy peer stops sending heartbeats for hb_dead_s (it was stopped, or its host went away:
 * a dead process is seen at once, by its sockets closing). */
static zck_status tc_pump(tc *t, bool sends) {
  double last = zck__tcp_now();
  for (;;) {
    if (t->relay) tc_relay_feed(t);
    int np = 0;
    bool wait = false;
    for (int k = 0; k < t->size; k++) {
      if (k == t->rank) continue;
      short ev = (short)((t->lk[k].rn ? POLLIN : 0) | (t->lk[k].sn ? POLLOUT : 0));
      if (!ev) continue;
      if (t->lk[k].rn || sends) wait = true;
      t->pfd[np] = (struct pollfd){t->fds[k], ev, 0};
      t->pk[np++] = k;
    }
    if (!wait) return ZCK_OK;
    if (atomic_load(&t->aborted)) return tc_fail(t, -1, true, "%s", "aborted by this rank");
    double now = zck__tcp_now(), left = last + t->timeout_s - now;
    if (left <= 0) {
      int k = t->pk[0];
      for (int i = 0; i < np; i++)
        if (t->lk[t->pk[i]].rn) {
          k = t->pk[i];
          break;
        }
      char why[200];
      if (t->lk[k].rn && t->in_hdr && t->hb_seen[k] > 0)
        snprintf(why, sizeof why, "sent nothing for %g s (it is alive but idle, using no CPU: is it hung, or "
                                  "waiting for something else?)", t->timeout_s);
      else
        snprintf(why, sizeof why, "%s for %g s (is it hung, or the network down?)",
                 t->lk[k].rn ? "sent nothing" : "took no data", t->timeout_s);
      return tc_fail(t, k, true, "%s", why);
    }
    if (t->in_hdr)
      for (int i = 0; i < np; i++) {
        int k = t->pk[i];
        if (!t->lk[k].rn || !t->hb_busy[k]) continue;
        double hl = t->hb_seen[k] + t->hb_dead_s - now;
        if (hl <= 0) {
          char why[160];
          snprintf(why, sizeof why, "stopped sending heartbeats %g s ago (is the process stopped, or its host down?)",
                   now - t->hb_seen[k]);
          return tc_fail(t, k, true, "%s", why);
        }
        if (hl < left) left = hl;
      }
    int n = poll(t->pfd, (nfds_t)np, left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1);
    if (n < 0 && errno != EINTR) return tc_fail(t, -1, true, "poll: %s", strerror(errno));
    /* abort() shuts our sockets down: what follows would look like peers hanging up */
    if (atomic_load(&t->aborted)) return tc_fail(t, -1, true, "%s", "aborted by this rank");
    for (int i = 0; i < np && n > 0; i++) {
      short re = t->pfd[i].revents;
      if (!re) continue;
      int k = t->pk[i];
      tc_link *l = &t->lk[k];
      if (l->rn && (re & (POLLIN | POLLHUP | POLLERR))) {
        ssize_t got = recv(t->fds[k], l->rp, l->rn, MSG_DONTWAIT);
        if (got == 0) return tc_hung_up(t, k, "closed the connection");
        if (got < 0 && errno == ECONNRESET) return tc_hung_up(t, k, "reset the connection");
        if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          return tc_fail(t, k, true, "connection lost (%s)", strerror(errno));
        if (got > 0) {
          l->rp += got;
          l->rn -= (size_t)got;
          /* in the header exchange only a whole call or a busy peer's heartbeat is progress */
          if (!t->in_hdr || (l->rn == 0 && tc_frame(t, k, l, zck__tcp_now()))) last = zck__tcp_now();
        }
      }
      if (l->sn && (re & (POLLOUT | POLLHUP | POLLERR))) {
        ssize_t put = send(t->fds[k], l->sp, l->sn, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (put < 0 && (errno == EPIPE || errno == ECONNRESET)) return tc_hung_up(t, k, "reset the connection");
        if (put < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          return tc_fail(t, k, true, "connection lost (%s)", strerror(errno));
        if (put > 0) {
          l->sp += put;
          l->sn -= (size_t)put;
          last = zck__tcp_now();
        }
      }
    }
  }
}

static void tc_clear_links(tc *t) {
  memset(t->lk, 0, sizeof *t->lk * (size_t)t->size);
  t->relay = false;
}

// ---- header exchange

static void tc_put_call(uint8_t *b, const tc_call *c) {
  memset(b, 0, TC_HDR);
  zck__put32(b, TC_MAGIC);
  zck__put32(b + 4, c->kind);
  zck__put64(b + 8, c->seq);
  zck__put64(b + 16, c->count);
  zck__put32(b + 24, c->dt);
  zck__put32(b + 28, c->op);
  zck__put32(b + 32, (uint32_t)c->root);
}

static tc_call tc_get_call(const uint8_t *b) {
  tc_call c = {zck__le32(b + 4), zck__le64(b + 8), zck__le64(b + 16), zck__le32(b + 24), zck__le32(b + 28),
               (int32_t)zck__le32(b + 32)};
  return c;
}

static bool tc_same(const tc_call *a, const tc_call *b) {
  return a->kind == b->kind && a->seq == b->seq && a->count == b->count && a->dt == b->dt && a->op == b->op &&
         a->root == b->root;
}

/* Starts a collective: fails at once on a failed handle, else exchanges the calls. */
static zck_status tc_enter(zck_comm *c, tc_kind kind, size_t count, zck_dtype dt, zck_comm_op op, int root) {
  tc *t = c->impl;
  if (atomic_load(&t->aborted))
    return zck__fail(ZCK_ERR_INTERNAL, "tcp comm: rank %d: aborted by this rank (another rank failed)", t->rank);
  if (t->failed) return zck__fail(ZCK_ERR_INTERNAL, "%s (an earlier collective failed)", t->fail_msg);
  /* the heartbeat thread writes to our sockets only between calls */
  pthread_mutex_lock(&t->hb_mu);
  t->hb_quiet = true;
  pthread_mutex_unlock(&t->hb_mu);
  t->call = (tc_call){(uint32_t)kind, ++t->seq, (uint64_t)count, (uint32_t)dt, (uint32_t)op, root};
  tc_put_call(t->hdrs[t->rank], &t->call);
  tc_clear_links(t);
  for (int k = 0; k < t->size; k++) {
    t->hb_seen[k] = 0;
    t->hb_busy[k] = false;
    if (k == t->rank) continue;
    t->lk[k] = (tc_link){t->hdrs[t->rank], TC_HDR, t->hdrs[k], TC_HDR};
  }
  t->in_hdr = true;
  zck_status s = tc_pump(t, true);
  t->in_hdr = false;
  if (s != ZCK_OK) return s;
  for (int k = 0; k < t->size; k++)
    if (zck__le32(t->hdrs[k]) != TC_MAGIC) return tc_fail(t, k, true, "%s", "sent a malformed call header");
  /* every rank holds the same W calls and names the same first disagreement */
  tc_call c0 = tc_get_call(t->hdrs[0]);
  for (int k = 1; k < t->size; k++) {
    tc_call ck = tc_get_call(t->hdrs[k]);
    if (tc_same(&c0, &ck)) continue;
    char a[160], b[160];
    tc_call_str(&c0, a, sizeof a);
    tc_call_str(&ck, b, sizeof b);
    if (c0.seq != ck.seq)
      return zck__fail(ZCK_ERR_INVALID_ARG, "tcp comm: ranks disagree: rank 0 called %s as call #%llu, rank %d called %s as call #%llu", a,
                       (unsigned long long)c0.seq, k, b, (unsigned long long)ck.seq);
    return zck__fail(ZCK_ERR_INVALID_ARG, "tcp comm: ranks disagree: rank 0 called %s, rank %d called %s (call #%llu)", a,
                     k, b, (unsigned long long)c0.seq);
  }
  return ZCK_OK;
}

/* Ends a collective: a handle that is still usable lets its heartbeats go again. */
static zck_status tc_leave(tc *t, zck_status s) {
  pthread_mutex_lock(&t->hb_mu);
  t->hb_quiet = t->failed || atomic_load(&t->aborted);
  pthread_mutex_unlock(&t->hb_mu);
  return s;
}

// ---- reduction in rank order

static bool tc_reducible(zck_dtype dt) {
  return dt == ZCK_F32 || dt == ZCK_F64 || dt == ZCK_I32 || dt == ZCK_I64 || dt == ZCK_BF16 || dt == ZCK_F16;
}

/* comm_local.c's combine, to the letter (NaN and -0 behave alike) */
#define TC_COMBINE(acc, v, op) ((op) == ZCK_COMM_SUM ? (acc) + (v) : (op) == ZCK_COMM_MAX ? ((v) > (acc) ? (v) : (acc)) \
                                                                      : ((v) < (acc) ? (v) : (acc)))

/* acc[i] = acc[i] op src[i]; integer sums wrap (comm_local's overflow, without the UB) */
static void tc_combine(void *acc, const void *src, size_t n, zck_dtype dt, zck_comm_op op) {
#define TC_LOOP(T)                                                     \
  do {                                                                 \
    T *a = acc;                                                        \
    const T *s = src;                                                  \
    for (size_t i = 0; i < n; i++) a[i] = TC_COMBINE(a[i], s[i], op);  \
  } while (0)
#define TC_ILOOP(T, U)                                                                          \
  do {                                                                                          \
    T *a = acc;                                                                                 \
    const T *s = src;                                                                           \
    if (op == ZCK_COMM_SUM)                                                                     \
      for (size_t i = 0; i < n; i++) a[i] = (T)((U)a[i] + (U)s[i]);                             \
    else                                                                                        \
      for (size_t i = 0; i < n; i++) a[i] = TC_COMBINE(a[i], s[i], op);                         \
  } while (0)
  switch (dt) {
  case ZCK_F64: TC_LOOP(double); break;
  case ZCK_I32: TC_ILOOP(int32_t, uint32_t); break;
  case ZCK_I64: TC_ILOOP(int64_t, uint64_t); break;
  default: TC_LOOP(float); break; /* F32, and BF16/F16 widened to float */
  }
#undef TC_LOOP
#undef TC_ILOOP
}

/* dst[i] = op over ranks 0..W-1 of src_k[i], i < n, where this rank's own src is `own`
 * and every other rank's is its scratch slot. dst may equal own. */
static void tc_reduce_chunk(tc *t, const uint8_t *own, void *dst, size_t n, zck_dtype dt, zck_comm_op op) {
  size_t es = zck_dtype_size(dt), slot = t->chunk * 8;
  bool half = dt == ZCK_BF16 || dt == ZCK_F16;
  for (int k = 0; k < t->size; k++) {
    const uint8_t *src = k == t->rank ? own : t->scratch + (size_t)(k - (k > t->rank)) * slot;
    if (half) {
      zck_convert(ZCK_F32, k ? t->tmp : t->acc, dt, src, n);
      if (k) tc_combine(t->acc, t->tmp, n, ZCK_F32, op);
    } else if (k == 0) {
      memcpy(t->acc, src, n * es);
    } else {
      tc_combine(t->acc, src, n, dt, op);
    }
  }
  if (half)
    zck_convert(dt, dst, ZCK_F32, t->acc, n);
  else
    memcpy(dst, t->acc, n * es);
}

/* Block k of the input (elements [lo(k), lo(k)+len(k)) of `send`) goes to rank k, which
 * reduces it; this rank writes its reduced block to `dst`. `block` = the element count of
 * every block but possibly the last ones (all_reduce) or of all (reduce_scatter). */
static zck_status tc_reduce_blocks(tc *t, const uint8_t *send, size_t total, size_t block, void *dst, zck_dtype dt,
                                   zck_comm_op op) {
  size_t es = zck_dtype_size(dt);
#define TC_LO(k) ((size_t)(k) * block < total ? (size_t)(k) * block : total)
#define TC_LEN(k) (TC_LO((k) + 1) - TC_LO(k))
  tc_clear_links(t);
  for (int k = 0; k < t->size; k++)
    if (k != t->rank) t->lk[k] = (tc_link){send + TC_LO(k) * es, TC_LEN(k) * es, NULL, 0};
  size_t mine = TC_LEN(t->rank), lo = TC_LO(t->rank);
  for (size_t off = 0; off < mine; off += t->chunk) {
    size_t n = mine - off < t->chunk ? mine - off : t->chunk;
    for (int k = 0; k < t->size; k++) {
      if (k == t->rank) continue;
      t->lk[k].rp = t->scratch + (size_t)(k - (k > t->rank)) * t->chunk * 8;
      t->lk[k].rn = n * es;
    }
    ZCK_TRY(tc_pump(t, false));
    tc_reduce_chunk(t, send + (lo + off) * es, (uint8_t *)dst + off * es, n, dt, op);
  }
  return tc_pump(t, true);
#undef TC_LO
#undef TC_LEN
}

// ---- gathers and broadcasts: relays

/* buf holds `total` bytes in W blocks, block k at [lo(k), lo(k+1)), each rank's own filled
 * in: fills in the others. Small: every rank sends its block to every other (one hop).
 * Else a pipelined ring: rank r sends to r-1 its block and then, as they arrive, the blocks
 * r+1, ..., r+W-2 that it receives from r+1 (every block but r-1's), so every rank sends
 * and receives total - one block, over one link each way, and forwards each byte as soon
 * as it has it. `lo` gives the block starts (lo(W) = total). */
static zck_status tc_gather_blocks(tc *t, uint8_t *buf, size_t total, size_t (*lo)(const void *, int),
                                   const void *arg) {
  int W = t->size, r = t->rank;
  tc_clear_links(t);
  if (W == 1 || total == 0) return ZCK_OK;
  size_t my_lo = lo(arg, r), my_len = lo(arg, r + 1) - my_lo;
  if (total < TC_RING_MIN) {
    for (int k = 0; k < W; k++)
      if (k != r) t->lk[k] = (tc_link){buf + my_lo, my_len, buf + lo(arg, k), lo(arg, k + 1) - lo(arg, k)};
    return tc_pump(t, true);
  }
  int prev = (r + W - 1) % W;
  size_t prev_len = lo(arg, prev + 1) - lo(arg, prev);
  t->relay = true;
  t->s_to = prev;
  t->s_from = (r + 1) % W;
  t->sin = (tc_stream){buf, total, (my_lo + my_len) % total, total - my_len, 0};
  t->sout = (tc_stream){buf, total, my_lo, total - prev_len, 0};
  t->s_own = my_len;
  zck_status s = tc_pump(t, true);
  t->relay = false;
  return s;
}

typedef struct tc_blocks {
  size_t block, total; /* elements: every block but the last ones has `block` */
  size_t es;
} tc_blocks;

static size_t tc_block_lo(const void *arg, int k) {
  const tc_blocks *b = arg;
  size_t e = (size_t)k * b->block < b->total ? (size_t)k * b->block : b->total;
  return e * b->es;
}

// ---- collectives

static zck_status tc_all_reduce_in(zck_comm *c, const void *send, void *recv, size_t count, zck_dtype dt,
                                   zck_comm_op op) {
  ZCK_TRY(tc_enter(c, TC_ALL_REDUCE, count, dt, op, 0));
  tc *t = c->impl;
  size_t es = zck_dtype_size(dt), W = (size_t)t->size;
  tc_blocks b = {(count + W - 1) / W, count, es}; /* comm_local's chunks */
  size_t lo_r = tc_block_lo(&b, t->rank) / es;
  ZCK_TRY(tc_reduce_blocks(t, send, count, b.block, (uint8_t *)recv + lo_r * es, dt, op));
  /* every send of the first phase is complete: in place, its blocks may now be overwritten */
  return tc_gather_blocks(t, recv, count * es, tc_block_lo, &b);
}

static zck_status tc_all_reduce(zck_comm *c, const void *send, void *recv, size_t count, zck_dtype dt, zck_comm_op op) {
  ZCK_ASSERT(tc_reducible(dt));
  return tc_leave(c->impl, tc_all_reduce_in(c, send, recv, count, dt, op));
}

static zck_status tc_reduce_scatter_in(zck_comm *c, const void *send, void *recv, size_t recv_count, zck_dtype dt,
                                       zck_comm_op op) {
  ZCK_TRY(tc_enter(c, TC_REDUCE_SCATTER, recv_count, dt, op, 0));
  tc *t = c->impl;
  return tc_reduce_blocks(t, send, recv_count * (size_t)t->size, recv_count, recv, dt, op);
}

static zck_status tc_reduce_scatter(zck_comm *c, const void *send, void *recv, size_t recv_count, zck_dtype dt,
                                    zck_comm_op op) {
  ZCK_ASSERT(tc_reducible(dt));
  return tc_leave(c->impl, tc_reduce_scatter_in(c, send, recv, recv_count, dt, op));
}

static zck_status tc_all_gather_in(zck_comm *c, const void *send, void *recv, size_t send_count, zck_dtype dt) {
  ZCK_TRY(tc_enter(c, TC_ALL_GATHER, send_count, dt, ZCK_COMM_SUM, 0));
  tc *t = c->impl;
  size_t bytes = send_count * zck_dtype_size(dt);
  uint8_t *own = (uint8_t *)recv + (size_t)t->rank * bytes;
  if (bytes && own != (const uint8_t *)send) memcpy(own, send, bytes);
  tc_blocks b = {1, (size_t)t->size, bytes};
  return tc_gather_blocks(t, recv, bytes * (size_t)t->size, tc_block_lo, &b);
}

static zck_status tc_all_gather(zck_comm *c, const void *send, void *recv, size_t send_count, zck_dtype dt) {
  return tc_leave(c->impl, tc_all_gather_in(c, send, recv, send_count, dt));
}

/* Small: the root sends to every rank. Else a pipelined chain root, root+1, ..., root-1:
 * every rank receives the buffer once and forwards each byte to the next as soon as it has
 * it, so the root sends one copy instead of W-1. */
static zck_status tc_broadcast_in(zck_comm *c, void *buf, size_t count, zck_dtype dt, int root) {
  ZCK_TRY(tc_enter(c, TC_BROADCAST, count, dt, ZCK_COMM_SUM, root));
  tc *t = c->impl;
  int W = t->size, pos = (t->rank - root + W) % W;
  size_t bytes = count * zck_dtype_size(dt);
  tc_clear_links(t);
  if (bytes == 0 || W == 1) return ZCK_OK;
  if (bytes < TC_RING_MIN) {
    if (t->rank == root) {
      for (int k = 0; k < W; k++)
        if (k != root) t->lk[k] = (tc_link){buf, bytes, NULL, 0};
    } else {
      t->lk[root] = (tc_link){NULL, 0, buf, bytes};
    }
    return tc_pump(t, true);
  }
  t->relay = true;
  t->s_from = pos > 0 ? (t->rank + W - 1) % W : -1;
  t->s_to = pos < W - 1 ? (t->rank + 1) % W : -1;
  t->sin = (tc_stream){buf, bytes, 0, pos > 0 ? bytes : 0, 0};
  t->sout = (tc_stream){buf, bytes, 0, bytes, 0};
  t->s_own = pos == 0 ? bytes : 0;
  zck_status s = tc_pump(t, true);
  t->relay = false;
  return s;
}

static zck_status tc_broadcast(zck_comm *c, void *buf, size_t count, zck_dtype dt, int root) {
  ZCK_ASSERT(root >= 0 && root < c->size);
  return tc_leave(c->impl, tc_broadcast_in(c, buf, count, dt, root));
}

static zck_status tc_barrier(zck_comm *c) {
  return tc_leave(c->impl, tc_enter(c, TC_BARRIER, 0, ZCK_U8, ZCK_COMM_SUM, 0));
}

/* May be called from another thread while a collective waits: shutdown() wakes its poll;
 * the sockets are closed only by destroy. */
static void tc_abort(zck_comm *c) {
  tc *t = c->impl;
  atomic_store(&t->aborted, 1);
  tc_shutdown_all(t);
}

// ---- heartbeats

static double tc_cpu_s(clockid_t id) {
  struct timespec ts;
  if (clock_gettime(id, &ts)) return 0;
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Sends a whole frame to a peer whose call header waits in our socket. The socket is
 * nearly idle then (the peer has read everything of the calls before), so the send never
 * blocks in practice; a partial one is finished, since a torn frame would break the stream. */
static void tc_beat(int fd, const uint8_t *beat) {
  int pending = 0, queued = 0;
  if (ioctl(fd, FIONREAD, &pending) || pending <= 0) return; /* nobody waits for us here */
  if (ioctl(fd, SIOCOUTQ, &queued) || queued > 1024) return; /* still busy: beat later */
  size_t off = 0;
  for (int tries = 0; off < TC_HDR && tries < 100; tries++) {
    ssize_t put = send(fd, beat + off, TC_HDR - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (put > 0) off += (size_t)put;
    else if (put < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return; /* peer gone */
    if (off < TC_HDR) {
      struct pollfd pf = {fd, POLLOUT, 0};
      poll(&pf, 1, 10);
    }
  }
}

/* Between calls, every hb_interval: a heartbeat to each peer waiting for this rank, busy
 * (op 1) when the process, this thread aside, used TC_HB_CPU_S of CPU or did block I/O
 * since the last beat. A rank blocked for good (a deadlock, a read that never returns)
 * uses none and so still times out; a rank at work (a reshard, a manifest write) does not. */
static void *tc_hb_main(void *arg) {
  tc *t = arg;
  uint8_t beat[TC_HDR];
  tc_call hb = {TC_HEARTBEAT, 0, 0, 0, 0, 0};
  double prev_cpu = -1;
  long prev_io = -1;
  pthread_mutex_lock(&t->hb_mu);
  while (!t->hb_stop) {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    double at = (double)until.tv_sec + (double)until.tv_nsec * 1e-9 + t->hb_interval;
    until.tv_sec = (time_t)at;
    until.tv_nsec = (long)((at - (double)until.tv_sec) * 1e9);
    while (!t->hb_stop && pthread_cond_timedwait(&t->hb_cv, &t->hb_mu, &until) != ETIMEDOUT) {
    }
    if (t->hb_stop) break;
    double cpu = tc_cpu_s(CLOCK_PROCESS_CPUTIME_ID) - tc_cpu_s(CLOCK_THREAD_CPUTIME_ID);
    struct rusage ru;
    long io = getrusage(RUSAGE_SELF, &ru) ? 0 : ru.ru_inblock + ru.ru_oublock;
    bool busy = prev_cpu >= 0 && (cpu - prev_cpu >= TC_HB_CPU_S || io != prev_io);
    prev_cpu = cpu;
    prev_io = io;
    if (t->hb_quiet || atomic_load(&t->aborted)) continue;
    hb.op = busy;
    tc_put_call(beat, &hb);
    for (int k = 0; k < t->size; k++)
      if (k != t->rank && t->fds[k] >= 0) tc_beat(t->fds[k], beat);
  }
  pthread_mutex_unlock(&t->hb_mu);
  return NULL;
}

// ---- lifetime

void zck_comm_tcp_destroy(zck_comm *c) {
  if (!c) return;
  tc *t = c->impl;
  if (t->hb_started) {
    pthread_mutex_lock(&t->hb_mu);
    t->hb_stop = true;
    pthread_cond_signal(&t->hb_cv);
    pthread_mutex_unlock(&t->hb_mu);
    pthread_join(t->hb_thread, NULL);
  }
  pthread_mutex_destroy(&t->hb_mu);
  pthread_cond_destroy(&t->hb_cv);
  if (t->fds)
    for (int k = 0; k < t->size; k++)
      if (t->fds[k] >= 0) close(t->fds[k]);
  free(t->fds);
  free(t->addrs);
  free(t->lk);
  free(t->pfd);
  free(t->pk);
  free(t->hdrs);
  free(t->scratch);
  free(t->acc);
  free(t->tmp);
  free(t->hb_seen);
  free(t->hb_busy);
  free(t);
}

zck_status zck_comm_tcp_create(const zck_comm_tcp_options *o, zck_comm **out) {
  ZCK_ASSERT(o && out);
  *out = NULL;
  ZCK_FAIL_IF(o->size < 1, ZCK_ERR_INVALID_ARG, "tcp comm: world size %d; must be at least 1", o->size);
  ZCK_FAIL_IF(o->rank < 0 || o->rank >= o->size, ZCK_ERR_INVALID_ARG, "tcp comm: rank %d is not in 0..%d", o->rank,
              o->size - 1);
  if (o->size > 1) {
    ZCK_FAIL_IF(!o->master_addr || !*o->master_addr, ZCK_ERR_INVALID_ARG, "tcp comm: no master address (MASTER_ADDR)");
    ZCK_FAIL_IF(o->master_port < 1 || o->master_port > 65535, ZCK_ERR_INVALID_ARG,
                "tcp comm: master port %d is not in 1..65535", o->master_port);
  }
  tc *t = zck__calloc(1, sizeof *t);
  if (!t) return ZCK_ERR_NO_MEMORY;
  size_t W = (size_t)o->size;
  t->rank = o->rank;
  t->size = o->size;
  t->timeout_s = o->timeout_s > 0 ? o->timeout_s : 300.0;
  atomic_init(&t->aborted, 0);
  pthread_mutex_init(&t->hb_mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&t->hb_cv, &ca);
  pthread_condattr_destroy(&ca);
  t->hb_quiet = true;
  double dead = t->timeout_s / 4;
  dead = dead < TC_HB_DEAD_MIN_S ? TC_HB_DEAD_MIN_S : dead > TC_HB_DEAD_MAX_S ? TC_HB_DEAD_MAX_S : dead;
  t->hb_dead_s = dead < t->timeout_s ? dead : t->timeout_s;
  /* a waiting rank hears a live peer 8 times in that span: a beat or two late is no harm */
  t->hb_interval = t->hb_dead_s / 8;
  t->handle = (zck_comm){o->rank, o->size, "tcp", t, tc_all_reduce, tc_reduce_scatter, tc_all_gather, tc_broadcast,
                         tc_barrier, tc_abort};
  /* one chunk of up to 8-byte elements per peer, within TC_SCRATCH_MAX in all */
  size_t chunk = W > 1 ? TC_SCRATCH_MAX / ((W - 1) * 8) : 1;
  t->chunk = chunk > ((size_t)1 << 17) ? (size_t)1 << 17 : chunk < 4096 ? 4096 : chunk;
  t->fds = zck__malloc(W * sizeof *t->fds);
  t->addrs = zck__calloc(W, sizeof *t->addrs);
  t->lk = zck__calloc(W, sizeof *t->lk);
  t->pfd = zck__calloc(W, sizeof *t->pfd);
  t->pk = zck__calloc(W, sizeof *t->pk);
  t->hdrs = zck__calloc(W, sizeof *t->hdrs);
  t->scratch = zck__malloc((W - 1) * t->chunk * 8 + 1);
  t->acc = zck__malloc(t->chunk * sizeof(double));
  t->tmp = zck__malloc(t->chunk * sizeof(float));
  t->hb_seen = zck__calloc(W, sizeof *t->hb_seen);
  t->hb_busy = zck__calloc(W, sizeof *t->hb_busy);
  if (t->fds)
    for (size_t k = 0; k < W; k++) t->fds[k] = -1;
  if (!t->fds || !t->addrs || !t->lk || !t->pfd || !t->pk || !t->hdrs || !t->scratch || !t->acc || !t->tmp || !t->hb_seen || !t->hb_busy) {
    zck_comm_tcp_destroy(&t->handle);
    return ZCK_ERR_NO_MEMORY;
  }
  zck_status s = zck__tcp_mesh(o, t->timeout_s, t->fds, t->addrs);
  /* a first barrier: every link works, and no rank returns before all are connected */
  if (s == ZCK_OK) s = tc_barrier(&t->handle);
  if (s != ZCK_OK) {
    zck_comm_tcp_destroy(&t->handle);
    return s;
  }
  t->seq = 0;
  /* without the thread (no resources for one) waits are bounded by timeout_s alone */
  if (W > 1) t->hb_started = pthread_create(&t->hb_thread, NULL, tc_hb_main, t) == 0;
  *out = &t->handle;
  return ZCK_OK;
}
