/* comm_env.c: a launcher's environment as tcp backend options.
 *
 * Rank and world size come from the first pair present of RANK / WORLD_SIZE (torchrun,
 * zckpt-train --nproc), OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE (Open MPI's mpirun),
 * PMI_RANK / PMI_SIZE (MPICH, Intel MPI); half a pair is an error. Rank 0's address is
 * MASTER_ADDR / MASTER_PORT in every case (mpirun users pass them with -x / -genv): both
 * are required when the world has more than one rank, since a guessed host would be wrong
 * on every other node and a guessed port would collide with the next job on the host.
 * A one-rank world needs neither (it opens no socket). ZCK_COMM_TIMEOUT_S, when set, is
 * the timeout in seconds. Every malformed value is an error naming the variable and value.
 */
#include "comm.h"

#include "error.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A decimal integer in [lo, hi], nothing else around it. */
static bool ce_int(const char *s, long lo, long hi, long *out) {
  if (!s || !*s) return false;
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  if (*p < '0' || *p > '9') return false;
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

typedef struct ce_source {
  const char *rank, *size, *local_rank;
} ce_source;

static const ce_source ce_sources[] = {
    {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
};
#define CE_NSOURCES (sizeof ce_sources / sizeof ce_sources[0])

/* The launcher whose variables are set, or NULL. */
static const ce_source *ce_find(void) {
  for (size_t i = 0; i < CE_NSOURCES; i++)
    if (getenv(ce_sources[i].rank) || getenv(ce_sources[i].size)) return &ce_sources[i];
  return NULL;
}

zck_status zck_comm_env_options(zck_comm_tcp_options *o, bool *found) {
  ZCK_ASSERT(o && found);
  memset(o, 0, sizeof *o);
  o->size = 1;
  o->master_addr = "127.0.0.1";
  *found = false;
  const char *t = getenv("ZCK_COMM_TIMEOUT_S");
  if (t) {
    char *end;
    double v = strtod(t, &end);
    ZCK_FAIL_IF(!*t || *end || !isfinite(v) || v <= 0, ZCK_ERR_INVALID_ARG,
                "environment: ZCK_COMM_TIMEOUT_S=%s: not a positive number of seconds", t);
    o->timeout_s = v;
  }
  const ce_source *src = ce_find();
  if (!src) return ZCK_OK;
  *found = true;
  const char *rs = getenv(src->rank), *ws = getenv(src->size);
  ZCK_FAIL_IF(!rs, ZCK_ERR_INVALID_ARG, "environment: %s=%s is set but %s is not", src->size, ws, src->rank);
  ZCK_FAIL_IF(!ws, ZCK_ERR_INVALID_ARG, "environment: %s=%s is set but %s is not", src->rank, rs, src->size);
  long rank, size;
  ZCK_FAIL_IF(!ce_int(ws, 1, 1 << 20, &size), ZCK_ERR_INVALID_ARG,
              "environment: %s=%s: not a world size (an integer from 1)", src->size, ws);
  ZCK_FAIL_IF(!ce_int(rs, 0, 1L << 30, &rank), ZCK_ERR_INVALID_ARG, "environment: %s=%s: not a rank (an integer from 0)",
              src->rank, rs);
  ZCK_FAIL_IF(rank >= size, ZCK_ERR_INVALID_ARG, "environment: %s=%s is not below %s=%s", src->rank, rs, src->size, ws);
  const char *ls = getenv(src->local_rank);
  long local = 0;
  ZCK_FAIL_IF(ls && (!ce_int(ls, 0, 1L << 30, &local) || local >= size), ZCK_ERR_INVALID_ARG,
              "environment: %s=%s: not a local rank (an integer from 0, below %s=%s)", src->local_rank, ls, src->size,
              ws);
  o->rank = (int)rank;
  o->size = (int)size;
  const char *addr = getenv("MASTER_ADDR"), *port = getenv("MASTER_PORT");
  const char *hint = src == &ce_sources[0] ? "" : " (under mpirun pass it with -x MASTER_ADDR=... -x MASTER_PORT=...)";
  if (size > 1) {
    ZCK_FAIL_IF(!addr || !*addr, ZCK_ERR_INVALID_ARG, "environment: MASTER_ADDR (rank 0's host) is not set but %s=%s%s",
                src->size, ws, hint);
    ZCK_FAIL_IF(!port, ZCK_ERR_INVALID_ARG, "environment: MASTER_PORT (rank 0's port) is not set but %s=%s%s",
                src->size, ws, hint);
  }
  if (addr && *addr) o->master_addr = addr;
  long p = 0;
  ZCK_FAIL_IF(port && !ce_int(port, 1, 65535, &p), ZCK_ERR_INVALID_ARG, "environment: MASTER_PORT=%s: not a port (1..65535)",
              port);
  o->master_port = port ? (int)p : 0;
  return ZCK_OK;
}

int zck_comm_env_local_rank(void) {
  const ce_source *src = ce_find();
  long v;
  if (!src || !ce_int(getenv(src->local_rank), 0, 1L << 30, &v)) return -1;
  return (int)v;
}
