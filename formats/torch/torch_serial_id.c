/* torch_serial_id.c: the .data/serialization_id record torch.save writes last, computed as
 * torch 2.x computes it, so that a file zckpt writes in torch.save's layout is torch's file
 * byte for byte.
 *
 * PyTorchStreamWriter prints two %020llu numbers:
 *   1. c10::hash_combine folded over std::hash<std::string>(name) of every record written
 *      (names without the archive folder), in the iteration order of the
 *      std::unordered_set<std::string> that collected them;
 *   2. c10::hash_combine folded over the CRC-32 of every record's data descriptor, in write
 *      order (an empty record has none).
 * Both belong to the C++ runtime torch is built with (libstdc++): std::hash<std::string> is
 * its 64-bit murmur variant (_Hash_bytes, seed 0xc70f6907), and the set's iteration order
 * follows from its node list and prime rehash policy, replayed here insertion by insertion.
 * tests/interop/interop_python_dcp.py checks the result against torch's own files. */
#include "torch_internal.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_combine(uint64_t seed, uint64_t value) {
  return seed ^ (value + 0x9e3779b9ULL + (seed << 6) + (seed >> 2));
}

static uint64_t shift_mix(uint64_t v) { return v ^ (v >> 47); }

/* libstdc++'s std::hash<std::string> on a 64-bit target. */
static uint64_t std_string_hash(const char *s, size_t len) {
  const uint64_t mul = (0xc6a4a793ULL << 32) + 0x5bd1e995ULL;
  uint64_t h = 0xc70f6907ULL ^ (len * mul);
  size_t aligned = len & ~(size_t)7;
  for (size_t p = 0; p < aligned; p += 8) {
    uint64_t d = 0;
    for (int i = 7; i >= 0; i--) d = d << 8 | (uint8_t)s[p + (size_t)i];
    h ^= shift_mix(d * mul) * mul;
    h *= mul;
  }
  if (len & 7) {
    uint64_t d = 0;
    for (size_t i = len; i > aligned; i--) d = d << 8 | (uint8_t)s[i - 1];
    h ^= d;
    h *= mul;
  }
  h = shift_mix(h) * mul;
  return shift_mix(h);
}

/* The bucket counts libstdc++'s _Prime_rehash_policy picks from (its prime table from 17
 * on, as _M_next_bkt returns them), and its table for hints under 14. */
static const uint64_t k_primes[] = {
#include "torch_serial_primes.inc"
};
static const uint8_t k_fast_bkt[14] = {2, 2, 2, 3, 5, 5, 7, 7, 11, 11, 11, 11, 13, 13};

typedef struct policy {
  uint64_t next_resize;
} policy;

static uint64_t next_bkt(policy *p, uint64_t n) {
  if (n < sizeof k_fast_bkt) {
    if (n == 0) return 1;
    p->next_resize = (uint64_t)((double)k_fast_bkt[n]);
    return k_fast_bkt[n];
  }
  size_t lo = 0, hi = sizeof k_primes / sizeof *k_primes - 1;   /* the last one stops growth */
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (k_primes[mid] < n) lo = mid + 1;
    else hi = mid;
  }
  p->next_resize = lo == sizeof k_primes / sizeof *k_primes - 1 ? UINT64_MAX : k_primes[lo];
  return k_primes[lo];
}

/* 0 = no rehash, else the new bucket count (max_load_factor 1.0, growth factor 2). */
static uint64_t need_rehash(policy *p, uint64_t n_bkt, uint64_t n_elt) {
  if (n_elt + 1 <= p->next_resize) return 0;
  uint64_t min_bkts = n_elt + 1;
  if (!p->next_resize && min_bkts < 11) min_bkts = 11;
  if (min_bkts >= n_bkt) {
    uint64_t want = min_bkts + 1 > n_bkt * 2 ? min_bkts + 1 : n_bkt * 2;
    return next_bkt(p, want);
  }
  p->next_resize = n_bkt;
  return 0;
}

#define BEFORE_BEGIN SIZE_MAX   /* the list head, as a "node before" */
#define NIL (SIZE_MAX - 1)

/* The iteration order of n distinct names inserted in order into a default-constructed
 * std::unordered_set<std::string>: order[] receives their indices. */
static zck_status set_order(const uint64_t *hash, size_t n, size_t *order) {
  size_t *next = malloc((n ? n : 1) * sizeof *next);
  size_t *bucket = NULL;   /* [n_bkt]: the node before the bucket's first, or NIL */
  uint64_t n_bkt = 1;
  size_t head = NIL;
  policy pol = {0};
  bucket = malloc(sizeof *bucket);
  if (!next || !bucket) {
    free(next);
    free(bucket);
    return ZCK_ERR_NO_MEMORY;
  }
  bucket[0] = NIL;
#define NEXT_OF(b) ((b) == BEFORE_BEGIN ? head : next[b])
  for (size_t i = 0; i < n; i++) {
    uint64_t grow = need_rehash(&pol, n_bkt, i);
    if (grow) {
      size_t *nb = malloc(grow * sizeof *nb);
      if (!nb) {
        free(next);
        free(bucket);
        return ZCK_ERR_NO_MEMORY;
      }
      for (uint64_t b = 0; b < grow; b++) nb[b] = NIL;
      size_t p = head, bbegin = 0;
      head = NIL;
      while (p != NIL) {
        size_t nx = next[p];
        uint64_t b = hash[p] % grow;
        if (nb[b] == NIL) {
          next[p] = head;
          head = p;
          nb[b] = BEFORE_BEGIN;
          if (next[p] != NIL) nb[bbegin] = p;
          bbegin = (size_t)b;
        } else {
          size_t before = nb[b];
          next[p] = NEXT_OF(before);
          if (before == BEFORE_BEGIN) head = p;
          else next[before] = p;
        }
        p = nx;
      }
      free(bucket);
      bucket = nb;
      n_bkt = grow;
    }
    uint64_t b = hash[i] % n_bkt;
    if (bucket[b] != NIL) {
      size_t before = bucket[b];
      next[i] = NEXT_OF(before);
      if (before == BEFORE_BEGIN) head = i;
      else next[before] = i;
    } else {
      next[i] = head;
      head = i;
      if (next[i] != NIL) bucket[hash[next[i]] % n_bkt] = i;
      bucket[b] = BEFORE_BEGIN;
    }
  }
#undef NEXT_OF
  size_t k = 0;
  for (size_t p = head; p != NIL && k < n; p = next[p]) order[k++] = p;
  free(next);
  free(bucket);
  return k == n ? ZCK_OK : zck__fail(ZCK_ERR_INTERNAL, "serialization id: set order lost a record");
}

static void put_decimal20(char *out, uint64_t v) {
  for (int i = 19; i >= 0; i--, v /= 10) out[i] = (char)('0' + v % 10);
}

zck_status zck_torch_serialization_id(const char *const *names, const uint32_t *crcs, const uint64_t *sizes, size_t n,
                                      char out[40]) {
  uint64_t *hash = malloc((n ? n : 1) * sizeof *hash);
  size_t *order = malloc((n ? n : 1) * sizeof *order);
  zck_status st = hash && order ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) hash[i] = std_string_hash(names[i], strlen(names[i]));
  if (st == ZCK_OK) st = set_order(hash, n, order);
  if (st == ZCK_OK) {
    uint64_t names_hash = 0, crc_hash = 0;
    for (size_t i = 0; i < n; i++) names_hash = hash_combine(names_hash, hash[order[i]]);
    for (size_t i = 0; i < n; i++)
      if (sizes[i]) crc_hash = hash_combine(crc_hash, crcs[i]);
    put_decimal20(out, names_hash);
    put_decimal20(out + 20, crc_hash);
  }
  free(hash);
  free(order);
  return st;
}
