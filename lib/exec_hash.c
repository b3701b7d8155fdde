/* exec_hash.c: hashing stores after the fact (zck_exec_hash_stores: XXH3-64 and CRC-32 of
 * each store's bytes, read back in order) and the sliced two-hash loop the copy shares. */
#include "exec_internal.h"

#include "threadpool.h"

#include <stdlib.h>
#include "hash_xxh3.h"

/* XXH3 (st may be NULL) and CRC-32 (crc may be NULL) of n bytes, one 64 KiB slice at a
 * time: the second hash reads the slice from the cache, not the staging buffer (megabytes)
 * from memory again. */
#define ZCK__HASH_SLICE ((size_t)64 << 10)
void zck__hash_sliced(XXH3_state_t *st, uint32_t *crc, const uint8_t *p, size_t n) {
  for (size_t k = 0; k < n; k += ZCK__HASH_SLICE) {
    size_t m = n - k < ZCK__HASH_SLICE ? n - k : ZCK__HASH_SLICE;
    if (st) XXH3_64bits_update(st, p + k, m);
    if (crc) *crc = zck_crc32_update(*crc, p + k, m);
  }
}

typedef struct hash_ctx {
  const zck_store *stores;
  size_t staging;
  uint8_t **bufs;
  uint64_t *xxh3;
  uint32_t *crc;
} hash_ctx;

static zck_status hash_one(void *ctx, size_t item, unsigned thread) {
  hash_ctx *h = ctx;
  const zck_store *s = &h->stores[item];
  if (s->kind == ZCK_STORE_UNBOUND) return ZCK_OK;
  size_t es = zck_dtype_size(s->dtype);
  ZCK_FAIL_IF(!es, ZCK_ERR_INVALID_ARG, "%s: no valid dtype", s->name ? s->name : "store");
  XXH3_state_t *st = NULL;
  if (h->xxh3) {
    st = XXH3_createState();
    if (!st) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    XXH3_64bits_reset(st);
  }
  uint32_t crc = 0;
  zck_status r = ZCK_OK;
  if (s->kind == ZCK_STORE_MEMORY) {
    zck__hash_sliced(st, h->crc ? &crc : NULL, s->mem, (size_t)(s->numel * es));
  } else {
    if (!h->bufs[thread] && !(h->bufs[thread] = zck__malloc(h->staging))) r = ZCK_ERR_NO_MEMORY;
    uint64_t step = h->staging / es;
    for (uint64_t k = 0; r == ZCK_OK && k < s->numel; k += step) {
      uint64_t n = s->numel - k < step ? s->numel - k : step;
      r = zck__store_read(s, (uint32_t)item, h->bufs[thread], k, n);
      if (r != ZCK_OK) break;
      zck__hash_sliced(st, h->crc ? &crc : NULL, h->bufs[thread], (size_t)(n * es));
    }
  }
  if (r == ZCK_OK) {
    if (st) h->xxh3[item] = XXH3_64bits_digest(st);
    if (h->crc) h->crc[item] = crc;
  }
  XXH3_freeState(st);
  return r;
}

zck_status zck_exec_hash_stores(const zck_store *stores, size_t n, const zck_exec_opts *opts, uint64_t *xxh3_out,
                                uint32_t *crc32_out) {
  static const zck_exec_opts defaults = ZCK_EXEC_OPTS_INIT;
  const zck_exec_opts *o = opts ? opts : &defaults;
  hash_ctx h = {stores, o->staging_bytes ? o->staging_bytes : ZCK_EXEC_DEFAULT_STAGING, NULL, xxh3_out, crc32_out};
  if (h.staging < 64) h.staging = 64;
  unsigned workers = zck__worker_count(n, o->threads);
  h.bufs = zck__calloc(workers, sizeof *h.bufs);
  if (!h.bufs) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__parallel_for(n, workers, hash_one, &h);
  for (unsigned i = 0; i < workers; i++) free(h.bufs[i]);
  free(h.bufs);
  return s;
}
