/* comm_rules.h: the rules of the device collectives that must agree with the host, in
 * plain C that compiles as host code, as device code, and in the tests, so that
 * tests/gpu/test_comm_rules.c (label unit) checks on machines without a GPU the very code
 * the device runs:
 *  - float16 bits: the cuda-local reduction of float16 rounds with zck_convert's rule
 *    (c10::Half: RNE, NaN -> 0x7E00 | sign), not CUDA's __float2half_rn (NaN -> 0x7FFF),
 *    and adds NaNs the way the host's float addition does (which NaN, hence which sign,
 *    comes out), so its bits are lib/comm_ranks.c's;
 *  - the wait on NCCL work: poll completion together with the group's health (NCCL's
 *    asynchronous error, an abort in this process) and a timeout, abort the communicator
 *    when either fails, instead of blocking in a CUDA synchronize that never returns when
 *    a peer is gone (host-only part, below).
 */
#ifndef ZCK_CUDA_COMM_RULES_H
#define ZCK_CUDA_COMM_RULES_H

#include <stdint.h>

#ifdef __CUDACC__
#define ZCK_RULE static inline __host__ __device__
#else
#define ZCK_RULE static inline
#endif

// ---- float16 and the NaNs of a float sum (all on raw bits: no host/device float modes)

/* fp32 bits -> fp16 bits as zck_convert does (fp16_ieee_from_fp32_value): round to
 * nearest even, overflow to infinity, subnormals rounded, every NaN 0x7E00 with its sign. */
ZCK_RULE uint16_t zck__f16_from_f32_bits(uint32_t w) {
  uint16_t sign = (uint16_t)((w >> 16) & 0x8000u);
  uint32_t a = w & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u);  /* NaN */
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520: rounds to infinity */
  if (a >= 0x38800000u) {                                   /* normal: >= 2^-14 */
    uint32_t r = a - 0x38000000u;                           /* exponent bias 127 -> 15 */
    r += 0xFFFu + ((r >> 13) & 1u);                         /* RNE on the 13 dropped bits */
    return (uint16_t)(sign | (r >> 13));
  }
  if (a < 0x33000000u) return sign; /* below 2^-25 (half the smallest subnormal): zero */
  /* subnormal: the value in units of 2^-24, rounded to nearest even (1024 gives the
   * smallest normal, as it should) */
  uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126u - e; /* 14..24 */
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return (uint16_t)(sign | q);
}

/* fp16 bits -> fp32 bits, exact (a NaN keeps its sign and payload, made quiet as the
 * host's conversion leaves it). */
ZCK_RULE uint32_t zck__f32_bits_from_f16(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0x1Fu) return sign | 0x7F800000u | (m << 13) | (m ? 0x400000u : 0u);
  if (e) return sign | ((e + 112u) << 23) | (m << 13);
  if (!m) return sign;
  /* subnormal: normalize */
  uint32_t k = 0;
  while (!(m & 0x400u)) {
    m <<= 1;
    k++;
  }
  return sign | ((113u - k) << 23) | ((m & 0x3FFu) << 13);
}

ZCK_RULE int zck__f32_bits_nan(uint32_t w) { return (w & 0x7FFFFFFFu) > 0x7F800000u; }

/* The NaN a host float addition a + b gives (C's +, IEEE hardware): a NaN operand comes
 * out (quieted); inf + -inf gives the machine's default NaN, which has the sign bit set on
 * x86 (the "real indefinite") and not on the others (ARM, POWER). CUDA's adder returns
 * 0x7FFFFFFF for all of these, so the device asks this instead. When both operands are
 * NaNs, C leaves which one comes out to the compiler's operand order (gcc's differs
 * between lib/comm_ranks.c's loops), so there is no host answer to match; this keeps the
 * left one. Only the sign reaches a float16 or bfloat16 result. */
#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#define ZCK__DEFAULT_NAN 0xFFC00000u
#define ZCK__DEFAULT_NAN64 0xFFF8000000000000ull
#else
#define ZCK__DEFAULT_NAN 0x7FC00000u
#define ZCK__DEFAULT_NAN64 0x7FF8000000000000ull
#endif
ZCK_RULE uint32_t zck__f32_sum_nan(uint32_t a, uint32_t b) {
  if (zck__f32_bits_nan(a)) return a | 0x400000u;
  if (zck__f32_bits_nan(b)) return b | 0x400000u;
  return ZCK__DEFAULT_NAN;
}
/* r = the bits of a + b as a device computed them: the host's bits. */
ZCK_RULE uint32_t zck__f32_sum_fix(uint32_t a, uint32_t b, uint32_t r) {
  return zck__f32_bits_nan(r) ? zck__f32_sum_nan(a, b) : r;
}

/* The same for doubles. */
ZCK_RULE int zck__f64_bits_nan(uint64_t w) { return (w & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull; }
ZCK_RULE uint64_t zck__f64_sum_fix(uint64_t a, uint64_t b, uint64_t r) {
  if (!zck__f64_bits_nan(r)) return r;
  if (zck__f64_bits_nan(a)) return a | 0x8000000000000ull;
  if (zck__f64_bits_nan(b)) return b | 0x8000000000000ull;
  return ZCK__DEFAULT_NAN64;
}

// ---- waiting for NCCL work (host code)

#include <math.h>
#include <stdlib.h>

#include "error.h"

/* The wait's timeout: ZCK_COMM_TIMEOUT_S, a positive number of seconds as lib/comm_mpi.c
 * reads it too (unset: 300 s here; the MPI wait's default is 1800 s). 0 when the value is
 * not a positive number (the caller reports it). */
#define ZCK__COMM_TIMEOUT_DEFAULT_S 300.0
static inline double zck__comm_timeout_parse(const char *v) {
  if (!v) return ZCK__COMM_TIMEOUT_DEFAULT_S;
  char *end;
  double t = strtod(v, &end);
  return (!*v || *end || !isfinite(t) || t <= 0) ? 0.0 : t;
}

/* What a wait polls. query: 1 the work is done, 0 not yet, < 0 it failed (*err set, with
 * its message). health: ZCK_OK, or the group's failure with its message (NCCL's
 * asynchronous error, another rank's abort). kill: aborts the communicator, so that none
 * of its kernels waits any more. now: seconds (monotonic); idle: pause between polls. */
typedef struct zck__poll_ops {
  int (*query)(void *ctx, zck_status *err);
  zck_status (*health)(void *ctx);
  void (*kill)(void *ctx);
  double (*now)(void *ctx);
  void (*idle)(void *ctx, unsigned spins);
} zck__poll_ops;

/* Polls until the work is done (ZCK_OK), it fails, the group fails, or timeout_s passes
 * since the wait began (rank `rank` waiting for `what`); on a failure or the timeout the
 * communicator is killed first, so no kernel of it is left waiting on the device. The
 * timeout counts from the start of this wait, like the MPI backend's per-collective wait:
 * NCCL gives no sign of a peer's progress, so a peer busy alone for longer also fails it. */
static inline zck_status zck__poll_wait(const zck__poll_ops *o, void *ctx, double timeout_s, int rank,
                                        const char *what) {
  double start = o->now(ctx);
  for (unsigned spins = 0;; spins++) {
    zck_status err = ZCK_OK;
    int q = o->query(ctx, &err);
    if (q > 0) return ZCK_OK;
    if (q < 0) {
      o->kill(ctx);
      return err != ZCK_OK ? err : zck__fail(ZCK_ERR_INTERNAL, "nccl comm: rank %d: %s failed", rank, what);
    }
    zck_status h = o->health(ctx);
    if (h != ZCK_OK) {
      o->kill(ctx);
      return h;
    }
    if (o->now(ctx) - start > timeout_s) {
      o->kill(ctx);
      return zck__fail(ZCK_ERR_INTERNAL,
                       "nccl comm: rank %d: %s not done after %g s (ZCK_COMM_TIMEOUT_S): a peer rank failed, hung "
                       "or never joined; communicator aborted",
                       rank, what, timeout_s);
    }
    o->idle(ctx, spins);
  }
}

#endif
