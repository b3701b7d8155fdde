/* comm_mpi.c: the MPI collective backend: this process is one rank of MPI_COMM_WORLD, started
 * by mpirun (or srun), on one host or many.
 *
 * Same bits as the local backend: MPI's own reductions run in whatever order its algorithm
 * picks, so reductions are an all-to-all (every rank receives its share of every rank's
 * buffer) followed by the host reduction of comm_ranks.c over ranks 0..W-1 in that order,
 * element by element; gathers and broadcasts are copies and use MPI's directly. Buffers are
 * moved in segments of at most CM_SEGMENT bytes per rank, so the staging memory is bounded
 * whatever the count and MPI's int counts never overflow.
 *
 * Every collective is non-blocking (MPI_I*) and the wait polls MPI_Test: it backs off from a
 * short spin to 1 ms sleeps, so a rank that waits long (for a peer that saves) does not take
 * a core from ranks that compute, and after ZCK_COMM_TIMEOUT_S seconds (default 1800, as
 * torch.distributed) without completion it prints one line and calls MPI_Abort: a hung peer
 * ends the job instead of holding every node. A peer that dies ends the job through mpirun
 * (which stops the others with SIGTERM); zck_comm_mpi_name_dead_peers makes the first
 * rank stopped on each host print one line naming the dead rank first.
 *
 * MPI calls are serialized by a mutex (the MPI library may give less than
 * MPI_THREAD_MULTIPLE); the wait sleeps without it, so two threads may wait at once on
 * different handles.
 */
#include "comm.h"

#include "comm_ranks.h"
#include "error.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CM_SEGMENT ((size_t)32 << 20)  /* bytes per rank and step of a collective */
#define CM_DEFAULT_TIMEOUT_S 1800.0
#define ZCK__COMM_MPI_MAX_SRCS 64     /* source pointers on the stack; more are malloc'd */

typedef struct cm_peer {
  int pid;
  int same_host;      /* on this process's host: its liveness can be checked */
  char label[64];     /* "rank K (pid P)", made at create for the signal handler */
} cm_peer;

typedef struct cm_state {
  MPI_Comm comm;
  int local_rank;
  double timeout_s;
  bool we_initialized;  /* this handle called MPI_Init_thread: destroy finalizes */
  bool aborted;
  size_t segment;       /* CM_SEGMENT (smaller in tests: zck__comm_mpi_set_segment) */
  cm_peer *peers;
  MPI_Comm node;        /* the ranks of this host */
  MPI_Win notice_win;   /* two ints on the host's local rank 0, shared by the host's ranks: */
  int *notice;          /* [0] set by the first rank to name a dead peer (one line per host);
                         * [1] 1 + the first same-host rank a waiting rank saw dead (0: none) */
  unsigned char *tmp;   /* staging for the reductions (grown, about one segment) */
  size_t tmp_cap;
  int *counts, *displs; /* [2 * size] for the v-collectives */
} cm_state;

static pthread_mutex_t cm_mu = PTHREAD_MUTEX_INITIALIZER;
static int cm_handles;  /* live handles (MPI is finalized when the last one we initialized goes) */

static double cm_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static zck_status cm_mpi_fail(const zck_comm *c, const char *what, int err) {
  char s[MPI_MAX_ERROR_STRING] = "";
  int n = 0;
  MPI_Error_string(err, s, &n);
  return zck__fail(ZCK_ERR_INTERNAL, "mpi comm: rank %d: %s: %s", c->rank, what, s);
}

static bool cm_pid_gone(int pid);

/* While it waits, a rank looks at its same-host peers now and then and records the first one
 * gone: when mpirun later stops the job with SIGTERM, the handler names that rank. Seen from
 * the handler alone, a rank that mpirun killed for not stopping in time (its SIGKILL follows
 * the SIGTERM on a loaded host) looks as dead as the one that ended the job. */
static void cm_watch_peers(zck_comm *c) {
  cm_state *st = c->impl;
  if (!st->notice || __atomic_load_n(&st->notice[1], __ATOMIC_SEQ_CST) != 0) return;
  for (int k = 0; k < c->size; k++)
    if (k != c->rank && st->peers[k].same_host && cm_pid_gone(st->peers[k].pid)) {
      int none = 0;
      __atomic_compare_exchange_n(&st->notice[1], &none, k + 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      return;
    }
}

/* Waits for req, polling MPI_Test; gives up on the whole job after the timeout. */
static zck_status cm_wait(zck_comm *c, MPI_Request *req, const char *what) {
  cm_state *st = c->impl;
  double t0 = cm_now();
  long sleep_ns = 0;
  for (int polls = 0;; polls++) {
    int done = 0;
    pthread_mutex_lock(&cm_mu);
    int e = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    pthread_mutex_unlock(&cm_mu);
    if (e != MPI_SUCCESS) return cm_mpi_fail(c, what, e);
    if (done) return ZCK_OK;
    /* a few hundred polls back to back (a collective among ready peers completes in
     * microseconds), then sleeps doubling from 2 us to 1 ms */
    if (polls < 200) continue;
    sleep_ns = sleep_ns ? (sleep_ns * 2 > 1000000 ? 1000000 : sleep_ns * 2) : 2000;
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if ((polls & 63) == 0) cm_watch_peers(c);
    if (st->timeout_s > 0 && (polls & 63) == 0 && cm_now() - t0 > st->timeout_s) {
      /* one line per host: the host's notice also keeps the stopped ranks from calling
       * this one dead (cm_on_sigterm) */
      if (!st->notice || __atomic_exchange_n(st->notice, 1, __ATOMIC_SEQ_CST) == 0) {
        fprintf(stderr, "%s: error: rank %d: mpi comm: %s: the other ranks did not arrive within %.0f s "
                "(ZCK_COMM_TIMEOUT_S): aborting the job\n", program_invocation_short_name, c->rank, what, st->timeout_s);
        fflush(stderr);
      }
      MPI_Abort(st->comm, 1);
      _exit(1);
    }
  }
}

static zck_status cm_check(zck_comm *c, const char *what) {
  cm_state *st = c->impl;
  ZCK_FAIL_IF(st->aborted, ZCK_ERR_INTERNAL, "mpi comm: rank %d: %s after the group was aborted", c->rank, what);
  return ZCK_OK;
}

static zck_status cm_tmp(zck_comm *c, size_t bytes) {
  cm_state *st = c->impl;
  if (bytes <= st->tmp_cap) return ZCK_OK;
  unsigned char *p = realloc(st->tmp, bytes);
  ZCK_FAIL_IF(!p, ZCK_ERR_NO_MEMORY, "mpi comm: out of memory for %zu bytes of staging", bytes);
  st->tmp = p;
  st->tmp_cap = bytes;
  return ZCK_OK;
}

/* `bytes` contiguous bytes whose extent is `stride` (rank k's block at base + k * stride). */
static int cm_block_type(size_t bytes, size_t stride, MPI_Datatype *t) {
  MPI_Datatype raw;
  int e = MPI_Type_contiguous((int)bytes, MPI_BYTE, &raw);
  if (e == MPI_SUCCESS) {
    e = MPI_Type_create_resized(raw, 0, (MPI_Aint)stride, t);
    MPI_Type_free(&raw);
  }
  if (e == MPI_SUCCESS) e = MPI_Type_commit(t);
  return e;
}

/* Elements per step for a collective of element size es where a step stages `per`
 * elements' worth of blocks per element (W for reduce_scatter, 1 for the others). */
static size_t cm_step(const zck_comm *c, size_t es, size_t per) {
  size_t n = ((const cm_state *)c->impl)->segment / (es * per);
  return n ? n : 1;
}

void zck__comm_mpi_set_segment(zck_comm *c, size_t bytes) {
  ((cm_state *)c->impl)->segment = bytes ? bytes : CM_SEGMENT;
}

// ---- collectives

static zck_status cm_reduce_scatter(zck_comm *c, const void *send, void *recv, size_t recv_count, zck_dtype dt,
                                    zck_comm_op op) {
  ZCK_TRY(cm_check(c, "reduce_scatter"));
  cm_state *st = c->impl;
  int W = c->size;
  size_t es = zck_dtype_size(dt), block = recv_count * es, step = cm_step(c, es, (size_t)W);
  ZCK_TRY(cm_tmp(c, (recv_count < step ? recv_count : step) * es * (size_t)W));
  const void *srcs[ZCK__COMM_MPI_MAX_SRCS];
  const void **sv = W <= ZCK__COMM_MPI_MAX_SRCS ? srcs : malloc((size_t)W * sizeof *sv);
  ZCK_FAIL_IF(!sv, ZCK_ERR_NO_MEMORY, "mpi comm: out of memory");
  zck_status s = ZCK_OK;
  for (size_t o = 0; o < recv_count && s == ZCK_OK; o += step) {
    size_t n = recv_count - o < step ? recv_count - o : step, nb = n * es;
    /* rank k gets elements [k*recv_count + o, +n) of every rank: its reduce-scatter share */
    MPI_Datatype t;
    MPI_Request req;
    pthread_mutex_lock(&cm_mu);
    int e = cm_block_type(nb, block, &t);
    if (e == MPI_SUCCESS) {
      e = MPI_Ialltoall((const unsigned char *)send + o * es, 1, t, st->tmp, (int)nb, MPI_BYTE, st->comm, &req);
      MPI_Type_free(&t);
    }
    pthread_mutex_unlock(&cm_mu);
    if (e != MPI_SUCCESS) s = cm_mpi_fail(c, "reduce_scatter", e);
    if (s == ZCK_OK) s = cm_wait(c, &req, "reduce_scatter");
    if (s != ZCK_OK) break;
    for (int k = 0; k < W; k++) sv[k] = st->tmp + (size_t)k * nb;
    void *dst = (unsigned char *)recv + o * es;
    s = zck__ranks_host_ops.reduce(NULL, c->rank, sv, W, 0, &dst, 1, 0, n, dt, op);
  }
  if (sv != srcs) free(sv);
  return s;
}

static zck_status cm_all_reduce(zck_comm *c, const void *send, void *recv, size_t count, zck_dtype dt,
                                zck_comm_op op) {
  ZCK_TRY(cm_check(c, "all_reduce"));
  cm_state *st = c->impl;
  int W = c->size, r = c->rank;
  size_t es = zck_dtype_size(dt), step = cm_step(c, es, 1);
  /* W blocks of this rank's chunk, at most ceil(step / W) elements each */
  size_t most = count < step ? count : step;
  ZCK_TRY(cm_tmp(c, (most / (size_t)W + 1) * (size_t)W * es));
  int *counts = st->counts, *displs = st->displs, *rcounts = counts + W, *rdispls = displs + W;
  const void *srcs[ZCK__COMM_MPI_MAX_SRCS];
  const void **sv = W <= ZCK__COMM_MPI_MAX_SRCS ? srcs : malloc((size_t)W * sizeof *sv);
  ZCK_FAIL_IF(!sv, ZCK_ERR_NO_MEMORY, "mpi comm: out of memory");
  zck_status s = ZCK_OK;
  for (size_t o = 0; o < count && s == ZCK_OK; o += step) {
    /* this step's elements in W chunks, rank k reducing chunk k (as the local backend) */
    size_t n = count - o < step ? count - o : step, base = n / (size_t)W, extra = n % (size_t)W, at = 0;
    for (int k = 0; k < W; k++) {
      size_t ck = base + ((size_t)k < extra);
      counts[k] = (int)(ck * es);
      displs[k] = (int)(at * es);
      at += ck;
    }
    size_t mine = (size_t)counts[r];
    for (int k = 0; k < W; k++) {
      rcounts[k] = (int)mine;
      rdispls[k] = (int)(mine * (size_t)k);
    }
    unsigned char *in = (unsigned char *)send + o * es, *out = (unsigned char *)recv + o * es;
    MPI_Request req;
    pthread_mutex_lock(&cm_mu);
    int e = MPI_Ialltoallv(in, counts, displs, MPI_BYTE, st->tmp, rcounts, rdispls, MPI_BYTE, st->comm, &req);
    pthread_mutex_unlock(&cm_mu);
    if (e != MPI_SUCCESS) s = cm_mpi_fail(c, "all_reduce", e);
    if (s == ZCK_OK) s = cm_wait(c, &req, "all_reduce");
    if (s != ZCK_OK) break;
    for (int k = 0; k < W; k++) sv[k] = st->tmp + (size_t)k * mine;
    void *dst = st->tmp; /* in place over rank 0's block: each element is read before written */
    s = zck__ranks_host_ops.reduce(NULL, r, sv, W, 0, &dst, 1, 0, mine / es, dt, op);
    if (s != ZCK_OK) break;
    pthread_mutex_lock(&cm_mu);
    e = MPI_Iallgatherv(st->tmp, (int)mine, MPI_BYTE, out, counts, displs, MPI_BYTE, st->comm, &req);
    pthread_mutex_unlock(&cm_mu);
    if (e != MPI_SUCCESS) s = cm_mpi_fail(c, "all_reduce", e);
    if (s == ZCK_OK) s = cm_wait(c, &req, "all_reduce");
  }
  if (sv != srcs) free(sv);
  return s;
}

static zck_status cm_all_gather(zck_comm *c, const void *send, void *recv, size_t send_count, zck_dtype dt) {
  ZCK_TRY(cm_check(c, "all_gather"));
  cm_state *st = c->impl;
  size_t es = zck_dtype_size(dt), block = send_count * es;
  bool in_place = send == (const unsigned char *)recv + (size_t)c->rank * block;
  for (size_t o = 0; o < block; o += st->segment) {
    size_t nb = block - o < st->segment ? block - o : st->segment;
    MPI_Datatype t;
    MPI_Request req;
    pthread_mutex_lock(&cm_mu);
    int e = cm_block_type(nb, block, &t);
    if (e == MPI_SUCCESS) {
      e = MPI_Iallgather(in_place ? MPI_IN_PLACE : (const unsigned char *)send + o, (int)nb, MPI_BYTE,
                         (unsigned char *)recv + o, 1, t, st->comm, &req);
      MPI_Type_free(&t);
    }
    pthread_mutex_unlock(&cm_mu);
    if (e != MPI_SUCCESS) return cm_mpi_fail(c, "all_gather", e);
    ZCK_TRY(cm_wait(c, &req, "all_gather"));
  }
  return ZCK_OK;
}

/* Point to point: each rank's bytes go to root alone, in segments (MPI counts are ints),
 * matched in order per sender (one tag, and MPI keeps the order of messages between two
 * ranks); root takes the ranks one after the other, the link into root being the limit. */
#define CM_GATHER_TAG 0x7a63

static zck_status cm_gather(zck_comm *c, const void *send, void *recv, const size_t *counts, zck_dtype dt, int root) {
  ZCK_TRY(cm_check(c, "gather"));
  ZCK_FAIL_IF(root < 0 || root >= c->size, ZCK_ERR_INVALID_ARG, "mpi comm: gather root %d is not in 0..%d", root,
              c->size - 1);
  cm_state *st = c->impl;
  size_t es = zck_dtype_size(dt), at = 0;
  for (int k = 0; k < c->size; k++) {
    size_t bytes = counts[k] * es;
    unsigned char *dst = (unsigned char *)recv + at;
    at += bytes;
    if (k == c->rank && k == root) {
      if (bytes && dst != send) memmove(dst, send, bytes);
      continue;
    }
    if (k != c->rank && c->rank != root) continue;
    for (size_t o = 0; o < bytes; o += st->segment) {
      size_t nb = bytes - o < st->segment ? bytes - o : st->segment;
      MPI_Request req;
      pthread_mutex_lock(&cm_mu);
      int e = c->rank == root ? MPI_Irecv(dst + o, (int)nb, MPI_BYTE, k, CM_GATHER_TAG, st->comm, &req)
                              : MPI_Isend((const unsigned char *)send + o, (int)nb, MPI_BYTE, root, CM_GATHER_TAG,
                                          st->comm, &req);
      pthread_mutex_unlock(&cm_mu);
      if (e != MPI_SUCCESS) return cm_mpi_fail(c, "gather", e);
      ZCK_TRY(cm_wait(c, &req, "gather"));
    }
  }
  return ZCK_OK;
}

static zck_status cm_broadcast(zck_comm *c, void *buf, size_t count, zck_dtype dt, int root) {
  ZCK_TRY(cm_check(c, "broadcast"));
  ZCK_FAIL_IF(root < 0 || root >= c->size, ZCK_ERR_INVALID_ARG, "mpi comm: broadcast root %d is not in 0..%d", root,
              c->size - 1);
  cm_state *st = c->impl;
  size_t bytes = count * zck_dtype_size(dt);
  for (size_t o = 0; o < bytes; o += st->segment) {
    size_t nb = bytes - o < st->segment ? bytes - o : st->segment;
    MPI_Request req;
    pthread_mutex_lock(&cm_mu);
    int e = MPI_Ibcast((unsigned char *)buf + o, (int)nb, MPI_BYTE, root, st->comm, &req);
    pthread_mutex_unlock(&cm_mu);
    if (e != MPI_SUCCESS) return cm_mpi_fail(c, "broadcast", e);
    ZCK_TRY(cm_wait(c, &req, "broadcast"));
  }
  return ZCK_OK;
}

static zck_status cm_barrier(zck_comm *c) {
  ZCK_TRY(cm_check(c, "barrier"));
  cm_state *st = c->impl;
  MPI_Request req;
  pthread_mutex_lock(&cm_mu);
  int e = MPI_Ibarrier(st->comm, &req);
  pthread_mutex_unlock(&cm_mu);
  if (e != MPI_SUCCESS) return cm_mpi_fail(c, "barrier", e);
  return cm_wait(c, &req, "barrier");
}

/* The ranks are processes: their failures meet through the callers' agreements, so abort
 * only stops this handle's later collectives (MPI_Abort would end the job). */
static void cm_abort(zck_comm *c) { ((cm_state *)c->impl)->aborted = true; }

// ---- lifetime

bool zck_comm_mpi_available(void) { return true; }

static zck_status cm_timeout(double *out) {
  *out = CM_DEFAULT_TIMEOUT_S;
  const char *t = getenv("ZCK_COMM_TIMEOUT_S");
  if (!t) return ZCK_OK;
  char *end;
  double v = strtod(t, &end);
  ZCK_FAIL_IF(!*t || *end || !isfinite(v) || v <= 0, ZCK_ERR_INVALID_ARG,
              "environment: ZCK_COMM_TIMEOUT_S=%s: not a positive number of seconds", t);
  *out = v;
  return ZCK_OK;
}

/* Who is where: every rank's pid and host, for naming a dead peer. */
static int cm_exchange_peers(zck_comm *c, cm_state *st) {
  typedef struct { int pid; char host[64]; } who;
  who me = {(int)getpid(), ""};
  gethostname(me.host, sizeof me.host - 1);
  who *all = calloc((size_t)c->size, sizeof *all);
  if (!all) return MPI_ERR_NO_MEM;
  int e = MPI_Allgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, st->comm);
  for (int k = 0; e == MPI_SUCCESS && k < c->size; k++) {
    st->peers[k].pid = all[k].pid;
    st->peers[k].same_host = !strncmp(all[k].host, me.host, sizeof me.host);
    snprintf(st->peers[k].label, sizeof st->peers[k].label, "rank %d (pid %d)", k, all[k].pid);
  }
  free(all);
  return e;
}

/* The host's shared notice flag (MPI_Win_allocate_shared: plain memory, so the signal
 * handler may use it). */
static int cm_notice_create(cm_state *st) {
  int *mine = NULL;
  int e = MPI_Win_allocate_shared(st->local_rank == 0 ? (MPI_Aint)(2 * sizeof(int)) : 0, (int)sizeof(int), MPI_INFO_NULL,
                                  st->node, &mine, &st->notice_win);
  MPI_Aint size = 0;
  int disp = 0;
  if (e == MPI_SUCCESS) e = MPI_Win_shared_query(st->notice_win, 0, &size, &disp, &st->notice);
  if (e == MPI_SUCCESS && st->local_rank == 0) {
    __atomic_store_n(&st->notice[0], 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&st->notice[1], 0, __ATOMIC_SEQ_CST);
  }
  if (e == MPI_SUCCESS) e = MPI_Barrier(st->node);
  return e;
}

zck_status zck_comm_mpi_create(zck_comm **out) {
  *out = NULL;
  double timeout_s;
  ZCK_TRY(cm_timeout(&timeout_s));
  int inited = 0, finalized = 0, e;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  ZCK_FAIL_IF(finalized, ZCK_ERR_INTERNAL, "mpi comm: MPI was finalized already (one group per process run)");
  bool we_init = false;
  if (!inited) {
    int provided = 0;
    e = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
    if (e != MPI_SUCCESS) return zck__fail(ZCK_ERR_INTERNAL, "mpi comm: MPI_Init_thread failed (error %d)", e);
    we_init = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  zck_comm *c = zck__calloc(1, sizeof *c);
  cm_state *st = zck__calloc(1, sizeof *st);
  if (!c || !st) {
    free(c);
    free(st);
    return ZCK_ERR_NO_MEMORY;
  }
  c->impl = st;
  st->timeout_s = timeout_s;
  st->segment = CM_SEGMENT;
  st->we_initialized = we_init;
  st->comm = MPI_COMM_NULL;
  st->node = MPI_COMM_NULL;
  st->notice_win = MPI_WIN_NULL;
  e = MPI_Comm_dup(MPI_COMM_WORLD, &st->comm);
  if (e == MPI_SUCCESS) e = MPI_Comm_set_errhandler(st->comm, MPI_ERRORS_RETURN);
  if (e == MPI_SUCCESS) e = MPI_Comm_rank(st->comm, &c->rank);
  if (e == MPI_SUCCESS) e = MPI_Comm_size(st->comm, &c->size);
  if (e == MPI_SUCCESS) e = MPI_Comm_split_type(st->comm, MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &st->node);
  if (e == MPI_SUCCESS) e = MPI_Comm_rank(st->node, &st->local_rank);
  if (e == MPI_SUCCESS) e = cm_notice_create(st);
  if (e == MPI_SUCCESS) {
    st->peers = calloc((size_t)c->size, sizeof *st->peers);
    st->counts = calloc(2 * (size_t)c->size, sizeof *st->counts);
    st->displs = calloc(2 * (size_t)c->size, sizeof *st->displs);
    e = st->peers && st->counts && st->displs ? cm_exchange_peers(c, st) : MPI_ERR_NO_MEM;
  }
  if (e != MPI_SUCCESS) {
    zck_status s = cm_mpi_fail(c, "create", e);
    zck_comm_mpi_destroy(c);
    return s;
  }
  c->backend = "mpi";
  c->all_reduce = cm_all_reduce;
  c->reduce_scatter = cm_reduce_scatter;
  c->all_gather = cm_all_gather;
  c->broadcast = cm_broadcast;
  c->gather = cm_gather;
  c->barrier = cm_barrier;
  c->abort = cm_abort;
  cm_handles++;
  *out = c;
  return ZCK_OK;
}

int zck_comm_mpi_local_rank(const zck_comm *c) { return ((const cm_state *)c->impl)->local_rank; }

// ---- a dead peer

static zck_comm *volatile cm_watched;

/* Whether pid is gone or a zombie (async-signal-safe). */
static bool cm_pid_gone(int pid) {
  if (kill(pid, 0) != 0) return errno == ESRCH;
  char path[40] = "/proc/", buf[256];
  /* "/proc/PID/stat" by hand: snprintf is not async-signal-safe */
  char digits[16];
  int nd = 0;
  for (int v = pid; v > 0 && nd < 15; v /= 10) digits[nd++] = (char)('0' + v % 10);
  size_t at = strlen(path);
  while (nd) path[at++] = digits[--nd];
  memcpy(path + at, "/stat", 6);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return true;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return true;
  buf[n] = 0;
  char *rp = strrchr(buf, ')'); /* the state follows the command name: "PID (comm) S ..." */
  return rp && rp[1] == ' ' && (rp[2] == 'Z' || rp[2] == 'X');
}

static void cm_put(char *line, size_t *at, size_t cap, const char *s) {
  while (*s && *at + 1 < cap) line[(*at)++] = *s++;
}

/* mpirun stops the ranks of a job whose rank died with SIGTERM. The first rank of a host
 * to get here claims the host's notice and names the dead rank: the one a waiting rank saw
 * gone (cm_watch_peers), else a dead one found now (no rank of the host has died of the
 * SIGTERM yet unless mpirun's SIGKILL overtook a handler that was slow to run). */
static void cm_on_sigterm(int sig) {
  zck_comm *c = cm_watched;
  cm_state *st = c ? c->impl : NULL;
  if (st && st->notice && __atomic_exchange_n(st->notice, 1, __ATOMIC_SEQ_CST) == 0) {
    int dead = __atomic_load_n(&st->notice[1], __ATOMIC_SEQ_CST) - 1;
    for (int k = 0; k < c->size && dead < 0; k++)
      if (k != c->rank && st->peers[k].same_host && cm_pid_gone(st->peers[k].pid)) dead = k;
    if (dead >= 0) {
      char line[256], num[16];
      size_t at = 0;
      int nd = 0;
      for (int v = c->rank; nd == 0 || v > 0; v /= 10) num[nd++] = (char)('0' + v % 10);
      char rank[16];
      for (int i = 0; i < nd; i++) rank[i] = num[nd - 1 - i];
      rank[nd] = 0;
      cm_put(line, &at, sizeof line, program_invocation_short_name);
      cm_put(line, &at, sizeof line, ": error: rank ");
      cm_put(line, &at, sizeof line, rank);
      cm_put(line, &at, sizeof line, ": ");
      cm_put(line, &at, sizeof line, st->peers[dead].label);
      cm_put(line, &at, sizeof line, " died; mpirun stopped the job\n");
      ssize_t w = write(2, line, at);
      (void)w;
    }
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

void zck_comm_mpi_name_dead_peers(zck_comm *c) {
  cm_watched = c;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = cm_on_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, NULL);
}

void zck_comm_mpi_destroy(zck_comm *c) {
  if (!c) return;
  cm_state *st = c->impl;
  if (cm_watched == c) {
    signal(SIGTERM, SIG_DFL);
    cm_watched = NULL;
  }
  if (st->notice_win != MPI_WIN_NULL) MPI_Win_free(&st->notice_win);
  if (st->node != MPI_COMM_NULL) MPI_Comm_free(&st->node);
  if (st->comm != MPI_COMM_NULL) MPI_Comm_free(&st->comm);
  if (c->backend) cm_handles--;
  if (st->we_initialized && cm_handles == 0) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
  }
  free(st->peers);
  free(st->counts);
  free(st->displs);
  free(st->tmp);
  free(st);
  free(c);
}
