/* test_comm_rules.c: the rules the device collectives share with the host (cuda/comm_rules.h),
 * checked on the host (label unit, no device needed):
 *  - float16 rounding and widening give zck_convert's bits (NaN -> 0x7E00 | sign, not
 *    CUDA's 0x7FFF), over a dense sample of all fp32 values and every fp16 value;
 *  - the NaN a sum gives: the cuda-local reduction emulated step by step as the kernel
 *    runs it (a device adder that makes every NaN 0x7FFFFFFF, then the rule's fix) gives
 *    the bits of lib/comm_ranks.c's host reduction (the local backend) for float16 with
 *    NaNs and infinities of both signs, and for float32 / float64 sums (except where NaNs
 *    of both signs meet in a sum: C leaves that choice to the compiler, see kernel_f16);
 *  - the NCCL wait loop with fake ops: done, a failed group (NCCL async error, a peer's
 *    abort), a failed query, and the ZCK_COMM_TIMEOUT_S timeout each return the right
 *    one-line error and abort the communicator exactly when they should;
 *  - ZCK_COMM_TIMEOUT_S parsing (a positive number of seconds, 300 s unset);
 *  - built without CUDA: a device call's error names the call. */
#include "test.h"

#include "comm.h"
#include "comm_rules.h"
#include "zck_cuda.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

static uint32_t fbits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bitsf(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
static uint64_t dbits(double f) {
  uint64_t u;
  memcpy(&u, &f, 8);
  return u;
}
static double bitsd(uint64_t u) {
  double f;
  memcpy(&f, &u, 8);
  return f;
}

// ---- float16 conversions

#define CHUNK 65536
static uint32_t in32[CHUNK];
static uint16_t out16[CHUNK];

static void check_chunk(size_t n) {
  zck_convert(ZCK_F16, out16, ZCK_F32, in32, n);
  for (size_t i = 0; i < n; i++)
    if (zck__f16_from_f32_bits(in32[i]) != out16[i])
      ZT_FAIL("fp32 0x%08X: rule gives fp16 0x%04X, zck_convert 0x%04X", in32[i], zck__f16_from_f32_bits(in32[i]),
              out16[i]);
}

static void test_f16_round(void) {
  /* every fp32 exponent and sign with the 16 low mantissa bits dense (where fp16
   * rounding decides) and the high ones spread; then a stride over all 2^32 */
  size_t n = 0;
  for (uint32_t se = 0; se < 512; se++)
    for (uint32_t lo = 0; lo < 0x4000; lo += 3) {
      uint32_t hi = (lo * 0x9E37u) & 0x7Fu; /* mantissa bits 16..22 */
      in32[n++] = (se << 23) | (hi << 16) | (lo << 2) | (lo & 3u);
      if (n == CHUNK) {
        check_chunk(n);
        n = 0;
      }
    }
  for (uint64_t w = 0; w < (1ull << 32); w += 4099) {
    in32[n++] = (uint32_t)w;
    if (n == CHUNK) {
      check_chunk(n);
      n = 0;
    }
  }
  /* the edges: rounding to infinity, to the smallest normal and subnormal, ties, NaNs */
  static const uint32_t edges[] = {0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FF001, 0x7F800000, 0x7F800001, 0x7FC00000,
                                   0x7FFFFFFF, 0xFFFFFFFF, 0xFFC00000, 0xFF800001, 0x38800000, 0x387FFFFF, 0x387FE000,
                                   0x387FF000, 0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000, 0x33C00000, 0x80000000,
                                   0x00000001, 0x3F800000, 0x3F801000, 0x3F803000, 0x3F802000};
  for (size_t i = 0; i < sizeof edges / sizeof *edges; i++) {
    in32[n++] = edges[i];
    in32[n++] = edges[i] ^ 0x80000000u;
  }
  check_chunk(n);
  /* the device's old rule differs exactly here */
  ZT_EQ_U64(zck__f16_from_f32_bits(0x7FFFFFFFu), 0x7E00);
  ZT_EQ_U64(zck__f16_from_f32_bits(0xFFFFFFFFu), 0xFE00);
}

static void test_f16_widen(void) {
  for (uint32_t h = 0; h < 65536; h++) {
    uint16_t h16 = (uint16_t)h;
    float f;
    zck_convert(ZCK_F32, &f, ZCK_F16, &h16, 1);
    uint32_t want = fbits(f), got = zck__f32_bits_from_f16(h16);
    if (isnan(f)) {
      /* a NaN: NaN with the same sign (the payload never reaches the output: the result
       * is rounded back to fp16, where every NaN is 0x7E00 | sign) */
      ZT_ASSERT(zck__f32_bits_nan(got));
      ZT_EQ_U64(got >> 31, want >> 31);
    } else if (got != want) {
      ZT_FAIL("fp16 0x%04X: rule gives fp32 0x%08X, zck_convert 0x%08X", h, got, want);
    }
  }
}

// ---- NaNs of a sum: the kernel emulated against the host reduction

/* What the device's adder gives: IEEE sums, every NaN 0x7FFFFFFF. */
static uint32_t dev_fadd(uint32_t a, uint32_t b) {
  volatile float x = bitsf(a), y = bitsf(b);
  float r = x + y;
  return isnan(r) ? 0x7FFFFFFFu : fbits(r);
}
static uint64_t dev_dadd(uint64_t a, uint64_t b) {
  volatile double x = bitsd(a), y = bitsd(b);
  double r = x + y;
  return isnan(r) ? 0x7FFFFFFFFFFFFFFFull : dbits(r);
}

/* comm_device.cu's zck_k_rank_reduce_half<false> for one element, SUM / MAX / MIN.
 * *open: a sum added two NaNs of opposite signs (an input's, or inf + -inf's), where C
 * leaves which one comes out to the compiler's operand order (gcc keeps the right one in
 * lib/comm_ranks.c's float16 loop, the left one in its float32 loop): no host bits to
 * match there. */
static uint16_t kernel_f16(const uint16_t *v, int n, zck_comm_op op, int *open) {
  uint32_t acc = zck__f32_bits_from_f16(v[0]);
  for (int k = 1; k < n; k++) {
    uint32_t x = zck__f32_bits_from_f16(v[k]);
    if (op == ZCK_COMM_SUM && zck__f32_bits_nan(acc) && zck__f32_bits_nan(x) && (acc ^ x) >> 31) *open = 1;
    if (op == ZCK_COMM_SUM)
      acc = zck__f32_sum_fix(acc, x, dev_fadd(acc, x));
    else if (op == ZCK_COMM_MAX)
      acc = bitsf(x) > bitsf(acc) ? x : acc;
    else
      acc = bitsf(x) < bitsf(acc) ? x : acc;
  }
  return zck__f16_from_f32_bits(acc);
}

#define W 3
#define NV 12
typedef struct red_arg {
  zck_comm *c;
  zck_dtype dt;
  zck_comm_op op;
  void *buf;
  size_t n;
  zck_status s;
} red_arg;
static void *red_main(void *p) {
  red_arg *a = p;
  a->s = a->c->all_reduce(a->c, a->buf, a->buf, a->n, a->dt, a->op);
  return NULL;
}

/* The host backend's all_reduce of per-rank buffers in[r] (n elements of dt), in place. */
static void host_reduce(zck_dtype dt, zck_comm_op op, void *in[W], size_t n) {
  zck_comm *comms[W];
  ZT_OK(zck_comm_local_create(W, comms));
  pthread_t th[W];
  red_arg args[W];
  for (int r = 0; r < W; r++) {
    args[r] = (red_arg){comms[r], dt, op, in[r], n, ZCK_OK};
    ZT_ASSERT(pthread_create(&th[r], NULL, red_main, &args[r]) == 0);
  }
  for (int r = 0; r < W; r++) {
    pthread_join(th[r], NULL);
    ZT_OK(args[r].s);
  }
  zck_comm_local_destroy(comms, W);
}

static void test_reduce_f16(void) {
  /* values of fp16 with NaNs and infinities of both signs; every ordered triple */
  static const uint16_t vals[NV] = {0x7E00, 0xFE00, 0x7C00, 0xFC00, 0x3C00, 0xBC00,
                                    0x0000, 0x8000, 0x7BFF, 0x7D01, 0xFF3F, 0x0001};
  enum { N = NV * NV * NV };
  static uint16_t buf[W][N];
  static const zck_comm_op ops[] = {ZCK_COMM_SUM, ZCK_COMM_MAX, ZCK_COMM_MIN};
  for (size_t o = 0; o < 3; o++) {
    for (int i = 0; i < N; i++) {
      buf[0][i] = vals[i % NV];
      buf[1][i] = vals[i / NV % NV];
      buf[2][i] = vals[i / (NV * NV)];
    }
    uint16_t want[N];
    int open[N], checked = 0;
    for (int i = 0; i < N; i++) {
      uint16_t v[W] = {buf[0][i], buf[1][i], buf[2][i]};
      open[i] = 0;
      want[i] = kernel_f16(v, W, ops[o], &open[i]);
      checked += !open[i];
    }
    ZT_ASSERT(checked > N / 2);
    void *in[W] = {buf[0], buf[1], buf[2]};
    host_reduce(ZCK_F16, ops[o], in, N);
    for (int i = 0; i < N; i++)
      if (buf[0][i] != want[i] && !open[i])
        ZT_FAIL("float16 op %d of 0x%04X 0x%04X 0x%04X: host 0x%04X, device rule 0x%04X", (int)ops[o], vals[i % NV],
                vals[i / NV % NV], vals[i / (NV * NV)], buf[0][i], want[i]);
  }
}

static void test_reduce_f32_f64(void) {
  /* a NaN operand, infinities of both signs (the machine's default NaN); sums of two NaNs
   * are left out (the host's choice between them is the compiler's operand order) */
  static const float fv[] = {1.0f, -2.0f, INFINITY, -INFINITY, 0.0f};
  enum { NF = 5 };
  static float f[W][NF * NF * 2];
  static double d[W][NF * NF * 2];
  int n = 0;
  for (int i = 0; i < NF; i++)
    for (int j = 0; j < NF; j++)
      for (int nan = 0; nan < 2; nan++) {
        f[0][n] = fv[i];
        f[1][n] = fv[j];
        f[2][n] = nan ? bitsf(0xFFC01234u) : 3.0f;
        for (int r = 0; r < W; r++) d[r][n] = r == 2 && nan ? bitsd(0xFFF8000000001234ull) : (double)f[r][n];
        n++;
      }
  uint32_t wf[NF * NF * 2];
  uint64_t wd[NF * NF * 2];
  int open[NF * NF * 2], checked = 0;
  for (int i = 0; i < n; i++) {
    uint32_t a = fbits(f[0][i]);
    uint64_t x = dbits(d[0][i]);
    open[i] = 0;
    for (int r = 1; r < W; r++) {
      uint32_t b = fbits(f[r][i]);
      if (zck__f32_bits_nan(a) && zck__f32_bits_nan(b)) open[i] = 1; /* inf + -inf, then a NaN */
      a = zck__f32_sum_fix(a, b, dev_fadd(a, b));
      uint64_t y = dbits(d[r][i]);
      x = zck__f64_sum_fix(x, y, dev_dadd(x, y));
    }
    wf[i] = a;
    wd[i] = x;
    checked += !open[i];
  }
  ZT_ASSERT(checked >= n - 4);
  void *inf[W] = {f[0], f[1], f[2]}, *ind[W] = {d[0], d[1], d[2]};
  host_reduce(ZCK_F32, ZCK_COMM_SUM, inf, (size_t)n);
  host_reduce(ZCK_F64, ZCK_COMM_SUM, ind, (size_t)n);
  for (int i = 0; i < n; i++) {
    if (open[i]) continue;
    if (fbits(f[0][i]) != wf[i]) ZT_FAIL("float32 sum %d: host 0x%08X, device rule 0x%08X", i, fbits(f[0][i]), wf[i]);
    if (dbits(d[0][i]) != wd[i])
      ZT_FAIL("float64 sum %d: host 0x%016llX, device rule 0x%016llX", i, (unsigned long long)dbits(d[0][i]),
              (unsigned long long)wd[i]);
  }
}

// ---- the wait loop

typedef struct fake {
  int done_after;      /* query says done at this poll (-1: never) */
  int fail_query_at;   /* query fails at this poll (-1: never) */
  int sick_at;         /* health fails at this poll (-1: never) */
  int polls, kills, idles;
  double t;            /* the clock: +1 s per idle */
} fake;

static int f_query(void *ctx, zck_status *err) {
  fake *f = ctx;
  f->polls++;
  if (f->polls == f->fail_query_at) {
    *err = zck__fail(ZCK_ERR_INTERNAL, "fake: rank 2: all_gather: an illegal memory access was encountered");
    return -1;
  }
  return f->polls == f->done_after;
}
static zck_status f_health(void *ctx) {
  fake *f = ctx;
  if (f->polls == f->sick_at)
    return zck__fail(ZCK_ERR_INTERNAL, "nccl: rank 2: all_gather: asynchronous error: remote process exited");
  return ZCK_OK;
}
static void f_kill(void *ctx) { ((fake *)ctx)->kills++; }
static double f_now(void *ctx) { return ((fake *)ctx)->t; }
static void f_idle(void *ctx, unsigned spins) {
  fake *f = ctx;
  ZT_EQ_U64(spins, (unsigned)f->idles);
  f->idles++;
  f->t += 1.0;
}
static const zck__poll_ops fake_ops = {f_query, f_health, f_kill, f_now, f_idle};

static void test_poll(void) {
  fake f = {3, -1, -1, 0, 0, 0, 100.0};
  ZT_OK(zck__poll_wait(&fake_ops, &f, 10.0, 2, "all_gather"));
  ZT_EQ_INT(f.polls, 3);
  ZT_EQ_INT(f.kills, 0); /* done: the communicator lives on */

  f = (fake){-1, -1, 4, 0, 0, 0, 0.0};
  ZT_ERR(zck__poll_wait(&fake_ops, &f, 10.0, 2, "all_gather"), ZCK_ERR_INTERNAL, "remote process exited");
  ZT_EQ_INT(f.polls, 4);
  ZT_EQ_INT(f.kills, 1);
  ZT_ASSERT(!strchr(zck_last_error(), '\n'));

  f = (fake){-1, 2, -1, 0, 0, 0, 0.0};
  ZT_ERR(zck__poll_wait(&fake_ops, &f, 10.0, 2, "all_gather"), ZCK_ERR_INTERNAL, "illegal memory access");
  ZT_EQ_INT(f.kills, 1);

  /* no progress: given up after the timeout, not before */
  f = (fake){-1, -1, -1, 0, 0, 0, 5.0};
  ZT_ERR(zck__poll_wait(&fake_ops, &f, 7.5, 3, "reduce_scatter"), ZCK_ERR_INTERNAL,
         "nccl comm: rank 3: reduce_scatter not done after 7.5 s (ZCK_COMM_TIMEOUT_S)");
  ZT_EQ_INT(f.kills, 1);
  ZT_EQ_INT(f.idles, 8); /* 8 s passed > 7.5 */
  ZT_ASSERT(strstr(zck_last_error(), "communicator aborted"));

  /* done on the poll that would have timed out: done wins */
  f = (fake){9, -1, -1, 0, 0, 0, 0.0};
  ZT_OK(zck__poll_wait(&fake_ops, &f, 7.5, 3, "reduce_scatter"));
  ZT_EQ_INT(f.kills, 0);
}

static void test_timeout_parse(void) {
  ZT_ASSERT(zck__comm_timeout_parse(NULL) == 300.0);
  ZT_ASSERT(zck__comm_timeout_parse("2.5") == 2.5);
  ZT_ASSERT(zck__comm_timeout_parse("600") == 600.0);
  static const char *bad[] = {"", "0", "-1", "abc", "5s", "nan", "inf", " "};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) ZT_ASSERT(zck__comm_timeout_parse(bad[i]) == 0.0);
}

static void test_stub_names_call(void) {
  if (zck_cuda_built()) return;
  zck_cuda_gpt2_config c = {16, 8, 1, 1, 4};
  zck_cuda_gpt2 *m = (zck_cuda_gpt2 *)1;
  ZT_ERR(zck_cuda_gpt2_create(NULL, &c, 1, 1, &m), ZCK_ERR_NO_DEVICE, "");
  ZT_EQ_STR(zck_last_error(), "zck_cuda_gpt2_create: zckpt was built without CUDA");
  ZT_ASSERT(m == NULL);
  ZT_ERR(zck_comm_cuda_wait(NULL, NULL), ZCK_ERR_NO_DEVICE, "zck_comm_cuda_wait: zckpt was built without CUDA");
}

int main(void) {
  test_f16_round();
  test_f16_widen();
  test_reduce_f16();
  test_reduce_f32_f64();
  test_poll();
  test_timeout_parse();
  test_stub_names_call();
  printf("comm rules: ok\n");
  return 0;
}
