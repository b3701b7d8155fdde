/* zero_internal.h: what zero.c shares with the files split out of it (zfetch.c): where an
 * array lives, and the operations on the rank's working memory (host, or the device's
 * selected stream, dzero.h). Not for the rest of the engine. */
#ifndef ZE_ZERO_INTERNAL_H
#define ZE_ZERO_INTERNAL_H

#include "dzero.h"
#include "zero.h"

/* Whether arrays of kind k are in host memory (no device, or offloaded). */
bool ze__on_host(const ze_zero_rank *zr, ze_mem_kind k);
/* The communicator of the collectives on the state arrays and working buffers. */
zck_comm *ze__data_comm(const ze_zero_rank *zr);
zck_status ze__wcopy(ze_zero_rank *zr, void *dst, const void *src, size_t bytes);
zck_status ze__wconvert(ze_zero_rank *zr, zck_dtype dt, void *dst, zck_dtype st, const void *src, size_t n);

/* A collective on the data communicator: on the device's selected stream, or the host's. */
static inline zck_status ze__coll(ze_zero_rank *zr, ze_coll_kind k, const void *send, void *recv, size_t count,
                                  zck_dtype dt) {
  ze_coll a = {k, send, recv, count, dt};
  if (zr->dev) return ze_dzero_coll(zr->dev, ze__data_comm(zr), &a);
  return ze_coll_run(ze__data_comm(zr), &a);
}

#endif
