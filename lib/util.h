/* util.h: small helpers used everywhere: checked arithmetic, allocation, growable buffers. */
#ifndef ZCK_UTIL_H
#define ZCK_UTIL_H

#include "error.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Overflow-checked arithmetic: return false on overflow. */
static inline bool zck__add_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_add_overflow(a, b, r); }
static inline bool zck__mul_u64(uint64_t a, uint64_t b, uint64_t *r) { return !__builtin_mul_overflow(a, b, r); }
static inline uint64_t zck__align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }
static inline uint64_t zck__ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

/* Allocation that sets an error message on failure. */
void *zck__malloc(size_t n);
void *zck__calloc(size_t count, size_t size);
void *zck__realloc(void *p, size_t n);
char *zck__strdup(const char *s);
char *zck__strndup(const char *s, size_t n);
/* Gives the pages of freed memory back to the system (glibc: every malloc arena; elsewhere
 * nothing). Called after big transient structures are freed on worker threads: their
 * arenas keep those pages resident, and allocations on other threads do not reuse them. */
void zck__heap_trim(void);
/* A growable array: makes *p (of *cap elements of elem bytes) hold at least need
 * elements, doubling from 16, the new elements zeroed. false (error set) when out of
 * memory or when the size overflows; *p and *cap are then unchanged. */
bool zck__grow_slow(void **p, size_t *cap, size_t need, size_t elem);
static inline bool zck__grow(void **p, size_t *cap, size_t need, size_t elem) {
  return need <= *cap || zck__grow_slow(p, cap, need, elem);
}
#define ZCK__GROW(arr, cap, need) zck__grow((void **)&(arr), &(cap), (need), sizeof *(arr))
/* asprintf into a fresh string; NULL (with error set) on failure. */
char *zck__sprintf(const char *fmt, ...) ZCK__PRINTF(1, 2);
/* Copies a caller's option struct (which starts with its size_t size, see zck.h) over the
 * defaults in dst: the bytes the caller's struct has, so a shorter (older) one leaves the
 * newer fields at their defaults. NULL src keeps the defaults. */
zck_status zck__opts_load(void *dst, size_t dst_size, const void *src, const char *what);
/* The strings up to a NULL, one after another, in a fresh string; NULL (with error set)
 * on failure. Pass the NULL as (const char *)NULL. */
char *zck__concat(const char *first, ...);
/* Joins a directory and a name with one '/'. */
char *zck__path_join(const char *dir, const char *name);

/* A growable byte buffer (pickle emitter, headers, JSON). */
typedef struct zck__buf {
  uint8_t *data;
  size_t len, cap;
  bool failed; /* an allocation failed; later appends are no-ops */
} zck__buf;

void zck__buf_init(zck__buf *b);
void zck__buf_free(zck__buf *b);
bool zck__buf_reserve(zck__buf *b, size_t extra);
void zck__buf_append(zck__buf *b, const void *p, size_t n);
void zck__buf_byte(zck__buf *b, uint8_t c);
void zck__buf_u16le(zck__buf *b, uint16_t v);
void zck__buf_u32le(zck__buf *b, uint32_t v);
void zck__buf_u64le(zck__buf *b, uint64_t v);
void zck__buf_str(zck__buf *b, const char *s);
void zck__buf_printf(zck__buf *b, const char *fmt, ...) ZCK__PRINTF(2, 3);

/* Little-endian loads from untrusted bytes. */
static inline uint16_t zck__le16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t zck__le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t zck__le64(const uint8_t *p) { return zck__le32(p) | (uint64_t)zck__le32(p + 4) << 32; }
static inline void zck__put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static inline void zck__put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static inline void zck__put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

/* Scalar float rounding, bit-exact with torch (see dtype.c). */
uint16_t zck__bf16_round(float f);
uint16_t zck__f16_round(float f);

#endif
