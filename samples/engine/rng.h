/* rng.h: the engine's random numbers: splitmix64, so every stream is a pure function of
 * (seed, position) and ranks or resumed runs draw exactly the same values. */
#ifndef ZE_RNG_H
#define ZE_RNG_H

#include <math.h>
#include <stdint.h>

static inline uint64_t ze_splitmix64(uint64_t *state) {
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* A hash of two words (a stateless draw for sample k of stream s). */
static inline uint64_t ze_hash2(uint64_t a, uint64_t b) {
  uint64_t s = a * 0xD1B54A32D192ED03ull + b;
  ze_splitmix64(&s);
  return ze_splitmix64(&s);
}

/* Uniform in [0, 1) with 53 bits. */
static inline double ze_uniform(uint64_t *state) { return (double)(ze_splitmix64(state) >> 11) * 0x1.0p-53; }

/* Standard normal (Box-Muller, one value per two draws: simple and reproducible). */
static inline double ze_normal(uint64_t *state) {
  double u1 = ze_uniform(state), u2 = ze_uniform(state);
  if (u1 < 1e-300) u1 = 1e-300;
  return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

#endif
