/* comm_suite.c: the collective cases for comparing a backend with the local one.
 *
 * Inputs are hashed from (case, rank, element), with floats spread over 2^-8..2^8 so that
 * a sum in another rank order gives other bits, and now and then a NaN, -0 or infinity
 * (MAX/MIN of NaN depend on the order too). Integers stay small: sums never overflow. */
#include "comm_suite.h"

#include "test.h"

#include <math.h>
#include <pthread.h>

static const char *cs_kind_names[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "barrier"};

static uint64_t cs_hash(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

static double cs_float(uint64_t u) {
  switch (u % 211) {
  case 0: return NAN;
  case 1: return -0.0;
  case 2: return INFINITY;
  case 3: return -INFINITY;
  }
  double m = 1.0 + (double)(u >> 11) / 9007199254740992.0; /* [1, 2) with 53 bits */
  int e = (int)((u >> 3) % 17) - 8;
  return (u & 4 ? -1.0 : 1.0) * ldexp(m, e);
}

void cs_input(const cs_case *c, int case_no, int rank, void *dst, size_t first, size_t n) {
  size_t es = zck_dtype_size(c->dt);
  uint8_t *d = dst;
  if (c->dt == ZCK_BF16 || c->dt == ZCK_F16) { /* floats, rounded in bulk */
    float tmp[1024];
    for (size_t i = 0; i < n; i += 1024) {
      size_t m = n - i < 1024 ? n - i : 1024;
      for (size_t j = 0; j < m; j++)
        tmp[j] = (float)cs_float(cs_hash(((uint64_t)case_no << 40) ^ ((uint64_t)rank << 32) ^ (first + i + j)));
      zck_convert(c->dt, d + i * es, ZCK_F32, tmp, m);
    }
    return;
  }
  for (size_t i = 0; i < n; i++, d += es) {
    uint64_t u = cs_hash(((uint64_t)case_no << 40) ^ ((uint64_t)rank << 32) ^ (first + i));
    switch (c->dt) {
    case ZCK_F64: {
      double v = cs_float(u);
      memcpy(d, &v, 8);
      break;
    }
    case ZCK_F32: {
      float v = (float)cs_float(u);
      memcpy(d, &v, 4);
      break;
    }
    case ZCK_I32: {
      int32_t v = (int32_t)(u % (1u << 21)) - (1 << 20);
      memcpy(d, &v, 4);
      break;
    }
    case ZCK_I64: {
      int64_t v = (int64_t)(u % (1ull << 41)) - (1ll << 40);
      memcpy(d, &v, 8);
      break;
    }
    default:
      for (size_t b = 0; b < es; b++) d[b] = (uint8_t)(cs_hash(u + b) >> 24);
      break;
    }
  }
}

static void cs_add(cs_case **v, size_t *n, size_t *cap, cs_case c) {
  if (*n == *cap) {
    *cap = *cap ? *cap * 2 : 64;
    *v = realloc(*v, *cap * sizeof **v);
    ZT_ASSERT(*v);
  }
  (*v)[(*n)++] = c;
}

cs_case *cs_cases(int W, bool big, size_t *n) {
  cs_case *v = NULL;
  size_t cap = 0;
  *n = 0;
  const zck_dtype red[] = {ZCK_F32, ZCK_F64, ZCK_I32, ZCK_I64, ZCK_BF16, ZCK_F16};
  const size_t counts[] = {0, 1, 37, 4099};
  for (int kind = CS_ALL_REDUCE; kind <= CS_REDUCE_SCATTER; kind++)
    for (size_t d = 0; d < sizeof red / sizeof *red; d++) {
      for (size_t k = 0; k < 4; k++)
        for (int ip = 0; ip < 2; ip++) cs_add(&v, n, &cap, (cs_case){kind, red[d], ZCK_COMM_SUM, counts[k], 0, ip});
      for (int op = ZCK_COMM_MAX; op <= ZCK_COMM_MIN; op++) {
        cs_add(&v, n, &cap, (cs_case){kind, red[d], (zck_comm_op)op, 1, 0, op == ZCK_COMM_MAX});
        cs_add(&v, n, &cap, (cs_case){kind, red[d], (zck_comm_op)op, 4099, 0, op == ZCK_COMM_MIN});
      }
    }
  const zck_dtype any[] = {ZCK_U8, ZCK_BF16, ZCK_F32, ZCK_F64, ZCK_BOOL, ZCK_C128, ZCK_I16};
  for (size_t d = 0; d < sizeof any / sizeof *any; d++)
    for (size_t k = 0; k < 4; k++)
      for (int ip = 0; ip < 2; ip++) cs_add(&v, n, &cap, (cs_case){CS_ALL_GATHER, any[d], ZCK_COMM_SUM, counts[k] / 4 * 4 + k % 2, 0, ip});
  const zck_dtype bc[] = {ZCK_U8, ZCK_F32, ZCK_I64};
  const int roots[] = {0, W - 1, W / 2};
  for (size_t d = 0; d < 3; d++)
    for (size_t k = 0; k < 3; k++)
      for (int r = 0; r < 3; r++) cs_add(&v, n, &cap, (cs_case){CS_BROADCAST, bc[d], ZCK_COMM_SUM, (size_t[]){0, 1, 4097}[k], roots[r], true});
  cs_add(&v, n, &cap, (cs_case){CS_BARRIER, ZCK_U8, ZCK_COMM_SUM, 0, 0, true});
  /* just past the size from which gathers go around a ring and broadcasts down a chain
   * (64 KiB in all, in the former tcp backend), every W: uneven all_reduce blocks, every root */
  for (int r = 0; r < 3; r++) cs_add(&v, n, &cap, (cs_case){CS_BROADCAST, ZCK_F32, ZCK_COMM_SUM, 70001, roots[r], true});
  cs_add(&v, n, &cap, (cs_case){CS_BROADCAST, ZCK_U8, ZCK_COMM_SUM, 65536, W / 2, true});
  for (int ip = 0; ip < 2; ip++) {
    cs_add(&v, n, &cap, (cs_case){CS_ALL_GATHER, ZCK_U8, ZCK_COMM_SUM, 33333, 0, ip});
    cs_add(&v, n, &cap, (cs_case){CS_ALL_REDUCE, ZCK_F32, ZCK_COMM_SUM, 70001, 0, ip});
    cs_add(&v, n, &cap, (cs_case){CS_ALL_REDUCE, ZCK_BF16, ZCK_COMM_SUM, 32771, 0, ip});
  }
  if (big) { /* larger than socket buffers, odd sizes */
    cs_add(&v, n, &cap, (cs_case){CS_ALL_REDUCE, ZCK_F32, ZCK_COMM_SUM, (2u << 20) + 1, 0, false});
    cs_add(&v, n, &cap, (cs_case){CS_ALL_REDUCE, ZCK_BF16, ZCK_COMM_SUM, 600001, 0, true});
    cs_add(&v, n, &cap, (cs_case){CS_ALL_REDUCE, ZCK_I64, ZCK_COMM_MAX, 262145, 0, true});
    cs_add(&v, n, &cap, (cs_case){CS_REDUCE_SCATTER, ZCK_F32, ZCK_COMM_SUM, 300001, 0, true});
    cs_add(&v, n, &cap, (cs_case){CS_REDUCE_SCATTER, ZCK_F16, ZCK_COMM_MIN, 200001, 0, false});
    cs_add(&v, n, &cap, (cs_case){CS_ALL_GATHER, ZCK_U8, ZCK_COMM_SUM, (3u << 20) + 1, 0, false});
    cs_add(&v, n, &cap, (cs_case){CS_ALL_GATHER, ZCK_F64, ZCK_COMM_SUM, 262147, 0, true});
    cs_add(&v, n, &cap, (cs_case){CS_BROADCAST, ZCK_F64, ZCK_COMM_SUM, 1u << 20, W - 1, true});
  }
  return v;
}

const char *cs_describe(const cs_case *c, char *buf, size_t n) {
  snprintf(buf, n, "%s(count %zu, %s, op %d, root %d%s)", cs_kind_names[c->kind], c->count, zck_dtype_name(c->dt),
           (int)c->op, c->root, c->inplace ? ", in place" : "");
  return buf;
}

/* elements of input, of output, and where they lie in the rank's buffer */
typedef struct cs_layout {
  size_t in_n, out_n, in_off, out_off, buf_n;
} cs_layout;

static cs_layout cs_lay(const cs_case *c, int W, int rank) {
  size_t n = c->count, w = (size_t)W, r = (size_t)rank;
  cs_layout l = {0, 0, 0, 0, 0};
  switch (c->kind) {
  case CS_ALL_REDUCE: l = c->inplace ? (cs_layout){n, n, 0, 0, n} : (cs_layout){n, n, 0, n, 2 * n}; break;
  case CS_REDUCE_SCATTER:
    l = c->inplace ? (cs_layout){w * n, n, 0, r * n, w * n} : (cs_layout){w * n, n, 0, w * n, w * n + n};
    break;
  case CS_ALL_GATHER: l = c->inplace ? (cs_layout){n, w * n, r * n, 0, w * n} : (cs_layout){n, w * n, 0, n, n + w * n}; break;
  case CS_BROADCAST: l = (cs_layout){n, n, 0, 0, n}; break;
  default: break;
  }
  return l;
}

size_t cs_buf_bytes(const cs_case *c, int W) { return cs_lay(c, W, 0).buf_n * zck_dtype_size(c->dt); }

size_t cs_result_bytes(const cs_case *c, int W) {
  cs_layout l = cs_lay(c, W, 0);
  return (c->kind == CS_REDUCE_SCATTER ? (size_t)W : 1) * l.out_n * zck_dtype_size(c->dt);
}

size_t cs_result_offset(const cs_case *c, int rank) {
  return c->kind == CS_REDUCE_SCATTER ? (size_t)rank * c->count * zck_dtype_size(c->dt) : 0;
}

zck_status cs_run(zck_comm *comm, const cs_case *c, int case_no, void **bufp, const void **out, size_t *out_bytes) {
  int W = comm->size, r = comm->rank;
  cs_layout l = cs_lay(c, W, r);
  size_t es = zck_dtype_size(c->dt);
  uint8_t *buf = malloc(l.buf_n * es + 1);
  ZT_ASSERT(buf);
  memset(buf, 0xA5, l.buf_n * es); /* outputs must be written, not left as they were */
  if (c->kind == CS_REDUCE_SCATTER || c->kind == CS_ALL_REDUCE)
    cs_input(c, case_no, r, buf + l.in_off * es, 0, l.in_n); /* rank r's whole input */
  else if (c->kind == CS_ALL_GATHER)
    cs_input(c, case_no, r, buf + l.in_off * es, 0, l.in_n);
  else if (c->kind == CS_BROADCAST)
    cs_input(c, case_no, r, buf, 0, l.in_n); /* every rank's own: only the root's must come out */
  *bufp = buf;
  *out = buf + l.out_off * es;
  *out_bytes = l.out_n * es;
  uint8_t *in = buf + l.in_off * es, *o = buf + l.out_off * es;
  switch (c->kind) {
  case CS_ALL_REDUCE: return comm->all_reduce(comm, in, o, c->count, c->dt, c->op);
  case CS_REDUCE_SCATTER: return comm->reduce_scatter(comm, in, o, c->count, c->dt, c->op);
  case CS_ALL_GATHER: return comm->all_gather(comm, in, o, c->count, c->dt);
  case CS_BROADCAST: return comm->broadcast(comm, buf, c->count, c->dt, c->root);
  default: return comm->barrier(comm);
  }
}

typedef struct cs_job {
  zck_comm *comm;
  const cs_case *c;
  int case_no;
  zck_status s;
  char msg[512];
  void *buf;
  const void *out;
  size_t out_bytes;
} cs_job;

static void *cs_thread(void *arg) {
  cs_job *j = arg;
  j->s = cs_run(j->comm, j->c, j->case_no, &j->buf, &j->out, &j->out_bytes);
  if (j->s != ZCK_OK) snprintf(j->msg, sizeof j->msg, "%s", zck_last_error());
  return NULL;
}

void *cs_expected(const cs_case *c, int case_no, int W) {
  zck_comm *comms[16];
  cs_job jobs[16];
  pthread_t th[16];
  ZT_ASSERT(W <= 16);
  ZT_OK(zck_comm_local_create(W, comms));
  for (int r = 0; r < W; r++) {
    jobs[r] = (cs_job){comms[r], c, case_no, ZCK_OK, "", NULL, NULL, 0};
    ZT_ASSERT(!pthread_create(&th[r], NULL, cs_thread, &jobs[r]));
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  zck_comm_local_destroy(comms, W);
  size_t n = cs_result_bytes(c, W);
  uint8_t *res = malloc(n + 1);
  ZT_ASSERT(res);
  for (int r = 0; r < W; r++) {
    if (jobs[r].s != ZCK_OK) ZT_FAIL("local backend failed on case %d: %s", case_no, jobs[r].msg);
    size_t off = cs_result_offset(c, r);
    ZT_ASSERT(off + jobs[r].out_bytes <= n);
    if (r == 0 || c->kind == CS_REDUCE_SCATTER)
      memcpy(res + off, jobs[r].out, jobs[r].out_bytes);
    else if (memcmp(res + off, jobs[r].out, jobs[r].out_bytes))
      ZT_FAIL("local backend: ranks 0 and %d disagree on case %d", r, case_no);
    free(jobs[r].buf);
  }
  return res;
}

/* ---- gather */

static uint8_t cs_gather_byte(int pattern, int rank, size_t i) {
  return (uint8_t)cs_hash(((uint64_t)pattern << 48) ^ ((uint64_t)rank << 40) ^ i);
}

int cs_check_gather(zck_comm *comm, bool big) {
  int W = comm->size, r = comm->rank, bad = 0;
  if (!comm->gather) {
    fprintf(stderr, "rank %d: the %s backend has no gather\n", r, comm->backend);
    return 1;
  }
  size_t *counts = calloc((size_t)W, sizeof *counts);
  ZT_ASSERT(counts);
  static const zck_dtype dts[] = {ZCK_U8, ZCK_F32};
  for (int pattern = 0; pattern < (big ? 4 : 3); pattern++) {
    for (int ri = 0; ri < 2; ri++) {
      int root = ri ? W - 1 : 0;
      zck_dtype dt = dts[(pattern + ri) % 2];
      size_t es = zck_dtype_size(dt), total = 0;
      for (int k = 0; k < W; k++) {
        switch (pattern) {
        case 0: counts[k] = (size_t)(k * 7 + 3) % 11; break;  /* uneven, now and then 0 */
        case 1: counts[k] = k == root ? 0 : 5; break;         /* nothing from root itself */
        case 2: counts[k] = k == root ? 9 : 0; break;         /* only root's own */
        default: counts[k] = ((size_t)3 << 20) / es + (size_t)k * 4099; break; /* several segments */
        }
        total += counts[k];
      }
      size_t mine = counts[r] * es, all = total * es;
      uint8_t *send = malloc(mine + 1), *recv = malloc(all + 1);
      ZT_ASSERT(send && recv);
      for (size_t i = 0; i < mine; i++) send[i] = cs_gather_byte(pattern, r, i);
      memset(recv, 0xA5, all + 1);
      zck_status s = comm->gather(comm, send, recv, counts, dt, root);
      if (s != ZCK_OK) {
        fprintf(stderr, "W=%d rank %d gather pattern %d root %d: %s\n", W, r, pattern, root, zck_last_error());
        bad++;
      } else if (r == root) {
        size_t at = 0;
        for (int k = 0; k < W; k++)
          for (size_t i = 0; i < counts[k] * es; i++, at++)
            if (recv[at] != cs_gather_byte(pattern, k, i)) {
              fprintf(stderr, "W=%d gather pattern %d root %d: byte %zu of rank %d's share differs\n", W, pattern,
                      root, i, k);
              bad++;
              k = W;
              break;
            }
        if (recv[all] != 0xA5) {
          fprintf(stderr, "W=%d gather pattern %d root %d: wrote past the end\n", W, pattern, root);
          bad++;
        }
      } else {
        for (size_t i = 0; i <= all; i++)
          if (recv[i] != 0xA5) {
            fprintf(stderr, "W=%d rank %d gather pattern %d root %d: recv written on a rank that is not root\n", W,
                    r, pattern, root);
            bad++;
            break;
          }
      }
      free(send);
      free(recv);
      if (s != ZCK_OK) {
        free(counts);
        return bad;
      }
    }
  }
  free(counts);
  return bad;
}
