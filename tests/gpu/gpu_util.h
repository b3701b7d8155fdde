/* gpu_util.h: helpers of the device tests: device copies that must succeed, random data,
 * and comparisons that report the largest error (so a run on a GPU shows the margins). */
#ifndef ZCK_GPU_UTIL_H
#define ZCK_GPU_UTIL_H

#include "test.h"
#include "zck_cuda.h"

#include <math.h>

static inline void *gpu_alloc(size_t bytes) {
  void *d = NULL;
  ZT_OK(zck_cuda_malloc(&d, bytes ? bytes : 4));
  ZT_OK(zck_cuda_memset_async(d, 0, bytes ? bytes : 4, NULL));
  ZT_OK(zck_cuda_device_sync());
  return d;
}

static inline void *gpu_dup(const void *h, size_t bytes) {
  void *d = gpu_alloc(bytes);
  ZT_OK(zck_cuda_memcpy(d, h, bytes));
  return d;
}

static inline void gpu_get(void *h, const void *d, size_t bytes) {
  ZT_OK(zck_cuda_device_sync());
  ZT_OK(zck_cuda_memcpy(h, d, bytes));
}

static inline uint64_t gpu_rand(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform in [-scale, scale). */
static inline void gpu_fill(float *x, size_t n, uint64_t *s, float scale) {
  for (size_t i = 0; i < n; i++) x[i] = scale * (float)((double)(gpu_rand(s) >> 11) * 0x1p-52 - 1.0);
}

/* Every element within atol + rtol*|want| (NaN only against NaN); prints the worst. */
static inline void gpu_close(const char *what, const float *got, const float *want, size_t n, double rtol,
                             double atol) {
  double worst = 0, worst_rel = 0;
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    if (isnan(want[i]) || isnan(got[i])) {
      if (isnan(want[i]) != isnan(got[i])) ZT_FAIL("%s[%zu]: %g vs %g", what, i, (double)got[i], (double)want[i]);
      continue;
    }
    double err = fabs((double)got[i] - (double)want[i]);
    double lim = atol + rtol * fabs((double)want[i]);
    if (err > lim) ZT_FAIL("%s[%zu]: %.9g vs %.9g (error %.3g > %.3g)", what, i, (double)got[i], (double)want[i], err, lim);
    if (err > worst) {
      worst = err;
      at = i;
      worst_rel = want[i] != 0 ? err / fabs((double)want[i]) : 0;
    }
  }
  printf("  %-28s n=%-8zu max abs error %.3g (rel %.3g at %zu)\n", what, n, worst, worst_rel, at);
}

/* Relative L2 error of a whole tensor: |got - want| / max(|want|, floor). */
static inline void gpu_close_l2(const char *what, const float *got, const float *want, size_t n, double rel,
                                double floor) {
  double e = 0, w = 0;
  for (size_t i = 0; i < n; i++) {
    double d = (double)got[i] - (double)want[i];
    e += d * d;
    w += (double)want[i] * want[i];
  }
  double r = sqrt(e) / fmax(sqrt(w), floor);
  if (!(r <= rel)) ZT_FAIL("%s: relative L2 error %.3g > %.3g (|want| = %.3g)", what, r, rel, sqrt(w));
  printf("  %-28s n=%-8zu relative L2 error %.3g\n", what, n, r);
}

static inline void gpu_same(const char *what, const void *got, const void *want, size_t bytes) {
  if (memcmp(got, want, bytes)) {
    const uint8_t *g = got, *w = want;
    size_t i = 0;
    while (g[i] == w[i]) i++;
    ZT_FAIL("%s: differs from byte %zu of %zu", what, i, bytes);
  }
  printf("  %-28s %zu bytes identical\n", what, bytes);
}

#endif
