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
 *   all_gather   every rank sends its block to every other, receiving straight into place;
 *   broadcast    the root sends the buffer to every other rank;
 *   reduce_scatter  rank r receives block r of every rank's input, chunk by chunk (bounded
 *                scratch: one chunk per peer) and reduces each chunk over ranks 0..W-1 in
 *                that order, element by element, exactly as comm_local.c does (BF16/F16
 *                summed in float, rounded once): the same bits as the local backend;
 *   all_reduce   reduce_scatter on comm_local's element chunks, then all_gather of them.
 *
 * Failure: a peer's hang-up, an I/O error, or no byte moving for timeout_s is a one-line
 * error naming the peer's rank and address; the handle then stays failed (every later
 * collective fails at once). On a timeout or a local error this rank also shuts its
 * sockets, so peers waiting on it wake up instead of waiting out their own timeouts;
 * abort() does the same. A hang-up is not passed on that way: every peer sees the dead
 * rank's hang-up itself at the latest in the next header exchange, and names the right rank.
 */
#include "comm_tcp_internal.h"

#include "util.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef enum { TC_ALL_REDUCE = 1, TC_REDUCE_SCATTER, TC_ALL_GATHER, TC_BROADCAST, TC_BARRIER } tc_kind;

#define TC_MAGIC 0x4354435au /* "ZCTC" */
#define TC_HDR 40
#define TC_MSG 1024
#define TC_SCRATCH_MAX ((size_t)32 << 20) /* all peers' chunk slots together, at most */

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

/* Moves bytes on every link until every receive is complete, and every send too when
 * `sends` (otherwise sends progress while receives are awaited and go on in the next
 * step). Fails when no byte moves for timeout_s. */
static zck_status tc_pump(tc *t, bool sends) {
  double last = zck__tcp_now();
  for (;;) {
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
    double left = last + t->timeout_s - zck__tcp_now();
    if (left <= 0) {
      int k = t->pk[0];
      for (int i = 0; i < np; i++)
        if (t->lk[t->pk[i]].rn) {
          k = t->pk[i];
          break;
        }
      char why[160];
      snprintf(why, sizeof why, "%s for %g s (is it hung, or the network down?)",
               t->lk[k].rn ? "sent nothing" : "took no data", t->timeout_s);
      return tc_fail(t, k, true, "%s", why);
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
          last = zck__tcp_now();
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

static void tc_clear_links(tc *t) { memset(t->lk, 0, sizeof *t->lk * (size_t)t->size); }

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
  t->call = (tc_call){(uint32_t)kind, ++t->seq, (uint64_t)count, (uint32_t)dt, (uint32_t)op, root};
  tc_put_call(t->hdrs[t->rank], &t->call);
  for (int k = 0; k < t->size; k++) {
    if (k == t->rank) continue;
    t->lk[k] = (tc_link){t->hdrs[t->rank], TC_HDR, t->hdrs[k], TC_HDR};
  }
  ZCK_TRY(tc_pump(t, true));
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

// ---- collectives

static zck_status tc_all_reduce(zck_comm *c, const void *send, void *recv, size_t count, zck_dtype dt, zck_comm_op op) {
  ZCK_ASSERT(tc_reducible(dt));
  ZCK_TRY(tc_enter(c, TC_ALL_REDUCE, count, dt, op, 0));
  tc *t = c->impl;
  size_t es = zck_dtype_size(dt), W = (size_t)t->size;
  size_t block = (count + W - 1) / W; /* comm_local's chunks */
  size_t lo_r = block * (size_t)t->rank < count ? block * (size_t)t->rank : count;
  ZCK_TRY(tc_reduce_blocks(t, send, count, block, (uint8_t *)recv + lo_r * es, dt, op));
  /* every send of the first phase is complete: in place, its blocks may now be overwritten */
  size_t len_r = (lo_r + block < count ? lo_r + block : count) - lo_r;
  for (int k = 0; k < t->size; k++) {
    if (k == t->rank) continue;
    size_t lo = block * (size_t)k < count ? block * (size_t)k : count;
    size_t len = (lo + block < count ? lo + block : count) - lo;
    t->lk[k] = (tc_link){(uint8_t *)recv + lo_r * es, len_r * es, (uint8_t *)recv + lo * es, len * es};
  }
  return tc_pump(t, true);
}

static zck_status tc_reduce_scatter(zck_comm *c, const void *send, void *recv, size_t recv_count, zck_dtype dt,
                                    zck_comm_op op) {
  ZCK_ASSERT(tc_reducible(dt));
  ZCK_TRY(tc_enter(c, TC_REDUCE_SCATTER, recv_count, dt, op, 0));
  tc *t = c->impl;
  return tc_reduce_blocks(t, send, recv_count * (size_t)t->size, recv_count, recv, dt, op);
}

static zck_status tc_all_gather(zck_comm *c, const void *send, void *recv, size_t send_count, zck_dtype dt) {
  ZCK_TRY(tc_enter(c, TC_ALL_GATHER, send_count, dt, ZCK_COMM_SUM, 0));
  tc *t = c->impl;
  size_t bytes = send_count * zck_dtype_size(dt);
  for (int k = 0; k < t->size; k++)
    if (k != t->rank) t->lk[k] = (tc_link){send, bytes, (uint8_t *)recv + (size_t)k * bytes, bytes};
  uint8_t *own = (uint8_t *)recv + (size_t)t->rank * bytes;
  if (bytes && own != (const uint8_t *)send) memcpy(own, send, bytes);
  return tc_pump(t, true);
}

static zck_status tc_broadcast(zck_comm *c, void *buf, size_t count, zck_dtype dt, int root) {
  ZCK_ASSERT(root >= 0 && root < c->size);
  ZCK_TRY(tc_enter(c, TC_BROADCAST, count, dt, ZCK_COMM_SUM, root));
  tc *t = c->impl;
  size_t bytes = count * zck_dtype_size(dt);
  tc_clear_links(t);
  if (t->rank == root) {
    for (int k = 0; k < t->size; k++)
      if (k != root) t->lk[k] = (tc_link){buf, bytes, NULL, 0};
  } else {
    t->lk[root] = (tc_link){NULL, 0, buf, bytes};
  }
  return tc_pump(t, true);
}

static zck_status tc_barrier(zck_comm *c) { return tc_enter(c, TC_BARRIER, 0, ZCK_U8, ZCK_COMM_SUM, 0); }

/* May be called from another thread while a collective waits: shutdown() wakes its poll;
 * the sockets are closed only by destroy. */
static void tc_abort(zck_comm *c) {
  tc *t = c->impl;
  atomic_store(&t->aborted, 1);
  tc_shutdown_all(t);
}

// ---- lifetime

void zck_comm_tcp_destroy(zck_comm *c) {
  if (!c) return;
  tc *t = c->impl;
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
  if (t->fds)
    for (size_t k = 0; k < W; k++) t->fds[k] = -1;
  if (!t->fds || !t->addrs || !t->lk || !t->pfd || !t->pk || !t->hdrs || !t->scratch || !t->acc || !t->tmp) {
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
  *out = &t->handle;
  return ZCK_OK;
}
