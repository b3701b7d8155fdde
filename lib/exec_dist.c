/* exec_dist.c: one copy (zck_exec_run) shared by the ranks of a distributed job (dist.h).
 *
 * Every rank holds the same jobs. Their extents are grouped by source record (the zip
 * record a store lies in, else the store itself): a record's CRC is checked by reading
 * all of it, so one rank reads it all, once. Groups go, largest first, to the rank with
 * the fewest bytes so far among the ranks whose node holds the file; each rank then runs
 * its share on the one executor, writing with pwrite straight into the output files rank
 * 0 created, and syncs them. After every rank has reported its share written:
 *   - a destination CRC a caller asked for (dst_crc32) is the XOR of the ranks' CRCs, each
 *     computed over the store with only that rank's bytes and zeros elsewhere (CRC-32 is
 *     affine: crc(a ^ b) = crc(a) ^ crc(b) ^ crc(zeros) for equal lengths);
 *   - a callback store whose writer records each write's CRC (a DeepSpeed writer's
 *     storage) is told of the ranges the other ranks wrote.
 */
#include "dist.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "exec.h"
#include "util.h"

typedef struct xitem {
  const char *name;    /* source file below the source root (the same on every rank), NULL: memory */
  const char *path;    /* the file as this rank opened it */
  uint64_t key;        /* record offset, store base, or job/store id */
  uint32_t job;
  size_t ext;
} xitem;

static int cmp_item(const void *a, const void *b) {
  const xitem *x = a, *y = b;
  if (!x->name != !y->name) return x->name ? 1 : -1;
  int c = x->name ? strcmp(x->name, y->name) : 0;
  if (c) return c;
  if (x->key != y->key) return x->key < y->key ? -1 : 1;
  if (x->job != y->job) return x->job < y->job ? -1 : 1;
  return x->ext < y->ext ? -1 : x->ext > y->ext;
}

/* The file a store reads, NULL for memory. */
static const char *store_file(const zck_store *s) {
  if (s->kind == ZCK_STORE_SOURCE) return s->source && s->source->fd >= 0 ? s->source->name : NULL;
  if (s->kind == ZCK_STORE_FD) return s->name;
  return NULL;
}

typedef struct group {
  size_t first, n;     /* items */
  uint64_t bytes;
} group;

static const group *g_sort_groups; /* for cmp_group: qsort has no context */

/* largest first; equal sizes in group order (the same order on every rank) */
static int cmp_group(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  uint64_t bx = g_sort_groups[x].bytes, by = g_sort_groups[y].bytes;
  if (bx != by) return bx > by ? -1 : 1;
  return x < y ? -1 : x > y;
}

typedef struct noted_rec {
  uint32_t job, store;
  uint64_t off, count;
  uint32_t crc, pad;
} noted_rec;

typedef struct capture {
  const zck_exec_job *jobs;
  zck_written_fn user;
  void *user_ctx;
  pthread_mutex_t mu;
  noted_rec *v;
  size_t n, cap;
  bool oom;
} capture;

static void capture_written(void *ctx, size_t job, uint32_t dst_store, uint64_t dst_off, uint64_t count,
                            const void *bytes, size_t n_bytes) {
  capture *c = ctx;
  const zck_store *s = &c->jobs[job].dst[dst_store];
  if (s->kind == ZCK_STORE_CALLBACK && zck__dist_noted_for(s->write)) {
    uint32_t crc = zck_crc32_update(0, bytes, n_bytes);
    pthread_mutex_lock(&c->mu);
    if (c->n == c->cap) {
      size_t nc = c->cap ? 2 * c->cap : 256;
      noted_rec *v = realloc(c->v, nc * sizeof *v);
      if (v) { c->v = v; c->cap = nc; }
    }
    if (c->n < c->cap) c->v[c->n++] = (noted_rec){(uint32_t)job, dst_store, dst_off, count, crc, 0};
    else c->oom = true;
    pthread_mutex_unlock(&c->mu);
  }
  if (c->user) c->user(c->user_ctx, job, dst_store, dst_off, count, bytes, n_bytes);
}

/* Which rank runs each extent: owner[i] for the i-th extent over all jobs in order. */
static zck_status assign(const zck_exec_job *jobs, size_t n_jobs, size_t n_ext, int *owner) {
  zck_comm *c = zck__dist_comm();
  int size = zck__dist_size();
  xitem *it = zck__malloc((n_ext ? n_ext : 1) * sizeof *it);
  group *gr = zck__malloc((n_ext ? n_ext : 1) * sizeof *gr);
  size_t *order = zck__malloc((n_ext ? n_ext : 1) * sizeof *order);
  uint64_t *load = zck__calloc((size_t)size, sizeof *load);
  if (!it || !gr || !order || !load) {
    free(it), free(gr), free(order), free(load);
    return ZCK_ERR_NO_MEMORY;
  }
  size_t k = 0;
  for (size_t j = 0; j < n_jobs; j++)
    for (size_t e = 0; e < jobs[j].plan->n; e++, k++) {
      const zck_extent *x = &jobs[j].plan->ext[e];
      const zck_store *s = &jobs[j].src[x->src_store];
      const char *path = store_file(s);
      uint64_t key = path ? (s->record ? s->record->off : s->base) : ((uint64_t)j << 32 | x->src_store);
      it[k] = (xitem){path ? zck__dist_key(path) : NULL, path, key, (uint32_t)j, e};
    }
  qsort(it, n_ext, sizeof *it, cmp_item);
  size_t ng = 0;
  for (size_t i = 0; i < n_ext; i++) {
    bool same = i && !it[i].name == !it[i - 1].name && it[i].key == it[i - 1].key &&
                (!it[i].name || !strcmp(it[i].name, it[i - 1].name));
    if (!same) gr[ng++] = (group){i, 0, 0};
    const zck_extent *x = &jobs[it[i].job].plan->ext[it[i].ext];
    gr[ng - 1].n++;
    gr[ng - 1].bytes += x->count * zck_dtype_size(jobs[it[i].job].src[x->src_store].dtype);
  }
  /* which ranks' nodes hold each group's file */
  uint8_t *mine = zck__malloc(ng ? ng : 1), *holds = zck__malloc((size_t)size * (ng ? ng : 1));
  zck_status s = mine && holds ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < ng; i++) mine[i] = !it[gr[i].first].path || zck__dist_holds(it[gr[i].first].path);
  if (s == ZCK_OK && ng) s = c->all_gather(c, mine, holds, ng, ZCK_U8);
  /* largest first, each to the least loaded holder (the same answer on every rank) */
  for (size_t i = 0; i < ng; i++) order[i] = i;
  g_sort_groups = gr;
  if (ng) qsort(order, ng, sizeof *order, cmp_group);
  size_t *first_ext = zck__malloc((n_jobs + 1) * sizeof *first_ext); /* a job's first extent in owner[] */
  if (!first_ext && s == ZCK_OK) s = ZCK_ERR_NO_MEMORY;
  for (size_t j = 0; first_ext && j <= n_jobs; j++) first_ext[j] = j ? first_ext[j - 1] + jobs[j - 1].plan->n : 0;
  /* ZCK_DIST_TRACE=1: each rank lists the records it reads (tests, and a user checking the split) */
  const char *tv = getenv("ZCK_DIST_TRACE");
  bool trace = tv && *tv && strcmp(tv, "0");
  for (size_t oi = 0; s == ZCK_OK && oi < ng; oi++) {
    size_t gi = order[oi];
    int best = -1;
    for (int r = 0; r < size; r++)
      if (holds[(size_t)r * ng + gi] && (best < 0 || load[r] < load[best])) best = r;
    if (best < 0) {
      s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: on no rank's node (each rank reads only the files its node holds)",
                    it[gr[gi].first].path);
      break;
    }
    load[best] += gr[gi].bytes;
    if (trace && best == zck__dist_rank())
      fprintf(stderr, "zckpt: rank %d: reads %s (%s %llu, %llu bytes)\n", best,
              it[gr[gi].first].path ? it[gr[gi].first].path : "<memory>", it[gr[gi].first].path ? "at" : "store",
              (unsigned long long)it[gr[gi].first].key, (unsigned long long)gr[gi].bytes);
    for (size_t m = 0; m < gr[gi].n; m++) {
      const xitem *x = &it[gr[gi].first + m];
      owner[first_ext[x->job] + x->ext] = best;
    }
  }
  free(it), free(gr), free(order), free(load), free(mine), free(holds), free(first_ext);
  return s;
}

/* Tells callback stores of the ranges the other ranks wrote into them. */
static zck_status share_noted(const zck_exec_job *jobs, const capture *cap) {
  zck_comm *c = zck__dist_comm();
  int size = zck__dist_size(), me = zck__dist_rank();
  int64_t n = cap->oom ? -1 : (int64_t)cap->n;
  int64_t *counts = zck__malloc((size_t)size * sizeof *counts);
  if (!counts) return ZCK_ERR_NO_MEMORY;
  zck_status s = c->all_gather(c, &n, counts, 1, ZCK_I64);
  for (int r = 0; s == ZCK_OK && r < size; r++)
    if (counts[r] < 0) s = zck__fail(ZCK_ERR_NO_MEMORY, "rank %d: out of memory recording written ranges", r);
  for (int r = 0; s == ZCK_OK && r < size; r++) {
    size_t cnt = (size_t)counts[r];
    if (!cnt) continue;
    noted_rec *v = r == me ? cap->v : zck__malloc(cnt * sizeof *v);
    if (!v) { s = ZCK_ERR_NO_MEMORY; break; } /* the others wait in the broadcast: mpirun ends it */
    s = c->broadcast(c, v, cnt * sizeof *v, ZCK_U8, r);
    for (size_t i = 0; s == ZCK_OK && r != me && i < cnt; i++) {
      const zck_store *st = &jobs[v[i].job].dst[v[i].store];
      zck__dist_noted_for(st->write)(st->ctx, v[i].off, v[i].count, v[i].crc);
    }
    if (r != me) free(v);
  }
  free(counts);
  return s;
}

/* The whole stores' CRCs from each rank's (its bytes, zeros elsewhere). */
static zck_status combine_crcs(const zck_exec_job *jobs, size_t n_jobs, uint32_t **local) {
  zck_comm *c = zck__dist_comm();
  int size = zck__dist_size();
  size_t total = 0;
  for (size_t j = 0; j < n_jobs; j++)
    if (jobs[j].dst_crc32) total += jobs[j].plan->n_dst_stores;
  if (!total) return ZCK_OK;
  uint32_t *mine = zck__malloc(total * sizeof *mine), *all = zck__malloc((size_t)size * total * sizeof *all);
  zck_status s = mine && all ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t j = 0; s == ZCK_OK && j < n_jobs; j++)
    if (jobs[j].dst_crc32)
      for (size_t i = 0; i < jobs[j].plan->n_dst_stores; i++) mine[k++] = local[j][i];
  if (s == ZCK_OK) s = c->all_gather(c, mine, all, total, ZCK_I32);
  k = 0;
  for (size_t j = 0; s == ZCK_OK && j < n_jobs; j++) {
    if (!jobs[j].dst_crc32) continue;
    for (size_t i = 0; i < jobs[j].plan->n_dst_stores; i++, k++) {
      const zck_store *d = &jobs[j].dst[i];
      uint64_t len = d->kind == ZCK_STORE_UNBOUND ? 0 : d->numel * zck_dtype_size(d->dtype);
      uint32_t x = size % 2 == 0 ? zck_crc32_zeros(len) : 0;
      for (int r = 0; r < size; r++) x ^= all[(size_t)r * total + k];
      jobs[j].dst_crc32[i] = x;
    }
  }
  free(mine);
  free(all);
  return s;
}

zck_status zck__exec_run_dist(const zck_exec_job *jobs, size_t n_jobs, const zck_exec_opts *opts) {
  static const zck_exec_opts defaults = ZCK_EXEC_OPTS_INIT;
  const zck_exec_opts *o = opts ? opts : &defaults;
  int me = zck__dist_rank();
  size_t n_ext = 0;
  for (size_t j = 0; j < n_jobs; j++) n_ext += jobs[j].plan->n;
  int *owner = zck__malloc((n_ext ? n_ext : 1) * sizeof *owner);
  zck_exec_job *mine = zck__calloc(n_jobs ? n_jobs : 1, sizeof *mine);
  zck_plan **plans = zck__calloc(n_jobs ? n_jobs : 1, sizeof *plans);
  uint32_t **crcs = zck__calloc(n_jobs ? n_jobs : 1, sizeof *crcs);
  zck_extent *buf = zck__malloc((n_ext ? n_ext : 1) * sizeof *buf);
  capture cap = {jobs, o->written, o->written_ctx, PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, false};
  zck_status s = owner && mine && plans && crcs && buf ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  /* every rank is here and ready before the collective assignment */
  s = zck__dist_agree(ZCK__DIST_COPY_START, s);
  if (s == ZCK_OK) s = assign(jobs, n_jobs, n_ext, owner);
  bool noted = false;
  for (size_t j = 0, flat = 0; s == ZCK_OK && j < n_jobs; flat += jobs[j].plan->n, j++) {
    const zck_plan *p = jobs[j].plan;
    size_t k = 0;
    for (size_t e = 0; e < p->n; e++)
      if (owner[flat + e] == me) buf[k++] = p->ext[e];
    s = zck_plan_from_extents(buf, k, p->n_src_stores, p->n_dst_stores, &plans[j]);
    if (s == ZCK_OK && jobs[j].dst_crc32 && !(crcs[j] = zck__calloc(p->n_dst_stores ? p->n_dst_stores : 1, sizeof **crcs)))
      s = ZCK_ERR_NO_MEMORY;
    mine[j] = (zck_exec_job){plans[j], jobs[j].src, jobs[j].dst, crcs[j]};
    for (size_t i = 0; i < p->n_dst_stores && !noted; i++)
      noted = jobs[j].dst[i].kind == ZCK_STORE_CALLBACK && zck__dist_noted_for(jobs[j].dst[i].write);
  }
  if (s == ZCK_OK && me != 0) s = zck__dist_outfiles_open();
  if (s == ZCK_OK) {
    zck_exec_opts lo = *o;
    if (noted) {
      lo.written = capture_written;
      lo.written_ctx = &cap;
    }
    zck__dist_set_in_copy(true);
    s = zck__exec_run_here(mine, n_jobs, &lo);
    zck__dist_set_in_copy(false);
  }
  /* rank 0's commit syncs its tree; the others' bytes must be on disk before it */
  if (s == ZCK_OK && me != 0) s = zck__dist_outfiles_sync();
  s = zck__dist_agree(ZCK__DIST_COPY_DONE, s);
  if (s == ZCK_OK) s = combine_crcs(jobs, n_jobs, crcs);
  if (s == ZCK_OK && noted) s = share_noted(jobs, &cap);
  for (size_t j = 0; plans && j < n_jobs; j++) zck_plan_free(plans[j]);
  for (size_t j = 0; crcs && j < n_jobs; j++) free(crcs[j]);
  free(owner), free(mine), free(plans), free(crcs), free(buf), free(cap.v);
  pthread_mutex_destroy(&cap.mu);
  return s;
}
