/* manifest_hash_dist.c: zck__hash_files shared by the ranks of a distributed job (dist.h):
 * `mpirun -np N zckpt verify` reads each file once, on one rank. Files go, biggest first,
 * to the least loaded rank whose node holds them; each rank hashes its files, then every
 * rank sends its results to all, so each ends with the same results as one process
 * reading everything, and the report (printed by rank 0) is the same. */
#include "dist.h"
#include "manifest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "error.h"
#include "util.h"

typedef struct buf {
  uint8_t *p;
  size_t n, cap;
  bool oom;
} buf;

static void put(buf *b, const void *v, size_t n) {
  if (b->oom) return;
  if (b->n + n > b->cap) {
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->n + n) nc *= 2;
    uint8_t *p = realloc(b->p, nc);
    if (!p) { b->oom = true; return; }
    b->p = p;
    b->cap = nc;
  }
  memcpy(b->p + b->n, v, n);
  b->n += n;
}

static bool get(const uint8_t **at, const uint8_t *end, void *v, size_t n) {
  if ((size_t)(end - *at) < n) return false;
  memcpy(v, *at, n);
  *at += n;
  return true;
}

/* one file's results: index, ok, status, size, xxh3, chunks, error, its ranges' results */
static void put_file(buf *b, uint64_t index, const zck__hash_file *f) {
  uint8_t ok = f->ok;
  int32_t status = (int32_t)f->status;
  uint64_t nc = f->n_chunks, el = f->error ? strlen(f->error) : 0;
  put(b, &index, 8), put(b, &ok, 1), put(b, &status, 4), put(b, &f->size, 8), put(b, &f->xxh3, 8);
  put(b, &nc, 8);
  if (nc) put(b, f->chunks, nc * 8);
  put(b, &el, 8);
  if (el) put(b, f->error, el);
  for (size_t k = 0; k < f->n_ranges; k++) {
    uint8_t done = f->ranges[k].done;
    put(b, &f->ranges[k].xxh3, 8), put(b, &f->ranges[k].crc32, 4), put(b, &done, 1);
  }
}

static zck_status get_files(const uint8_t *at, const uint8_t *end, zck__hash_file **files, size_t n) {
  while (at < end) {
    uint64_t index, nc, el;
    uint8_t ok;
    int32_t status;
    if (!get(&at, end, &index, 8) || index >= n) return zck__fail(ZCK_ERR_INTERNAL, "hash results: bad file index");
    zck__hash_file *f = files[index];
    zck__hash_file_clear(f);
    if (!get(&at, end, &ok, 1) || !get(&at, end, &status, 4) || !get(&at, end, &f->size, 8) ||
        !get(&at, end, &f->xxh3, 8) || !get(&at, end, &nc, 8) || nc > (uint64_t)(end - at) / 8)
      return zck__fail(ZCK_ERR_INTERNAL, "hash results: truncated");
    f->ok = ok;
    f->status = (zck_status)status;
    if (nc) {
      if (!(f->chunks = zck__malloc(nc * 8))) return ZCK_ERR_NO_MEMORY;
      get(&at, end, f->chunks, nc * 8);
      f->n_chunks = nc;
    }
    if (!get(&at, end, &el, 8) || el > (uint64_t)(end - at)) return zck__fail(ZCK_ERR_INTERNAL, "hash results: truncated");
    if (el) {
      if (!(f->error = zck__malloc(el + 1))) return ZCK_ERR_NO_MEMORY;
      get(&at, end, f->error, el);
      f->error[el] = 0;
    }
    for (size_t k = 0; k < f->n_ranges; k++) {
      uint8_t done;
      if (!get(&at, end, &f->ranges[k].xxh3, 8) || !get(&at, end, &f->ranges[k].crc32, 4) || !get(&at, end, &done, 1))
        return zck__fail(ZCK_ERR_INTERNAL, "hash results: truncated");
      f->ranges[k].done = done;
    }
  }
  return ZCK_OK;
}

static const int64_t *g_sizes; /* for cmp_size: qsort has no context */

/* biggest first; equal sizes in name order (the same order on every rank) */
static int cmp_size(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  if (g_sizes[x] != g_sizes[y]) return g_sizes[x] > g_sizes[y] ? -1 : 1;
  return x < y ? -1 : x > y;
}

static int cmp_key(const void *a, const void *b) {
  const zck__hash_file *x = *(zck__hash_file *const *)a, *y = *(zck__hash_file *const *)b;
  return strcmp(zck__dist_key(x->path), zck__dist_key(y->path));
}

/* pre: a failure of this rank before (it still meets the others at every agreement) */
static zck_status hash_shared(zck__hash_file *files_in, size_t n, const zck_manifest_hash_opts *o, zck_status pre) {
  /* the files in the order of their names below the source root: the same on every rank
   * (a rank's listing order is its own, and each node-local rank lists its own view) */
  zck__hash_file **files = zck__malloc((n ? n : 1) * sizeof *files);
  if (!files) return ZCK_ERR_NO_MEMORY; /* the agreement below: mpirun ends the others */
  for (size_t i = 0; i < n; i++) files[i] = &files_in[i];
  qsort(files, n, sizeof *files, cmp_key);
  zck_comm *c = zck__dist_comm();
  int size = zck__dist_size(), me = zck__dist_rank();
  /* each rank's size of each file, -1 where its node lacks it */
  int64_t *mine = zck__malloc((n ? n : 1) * sizeof *mine), *all = zck__malloc((size_t)size * (n ? n : 1) * sizeof *all);
  int *owner = zck__malloc((n ? n : 1) * sizeof *owner);
  size_t *order = zck__malloc((n ? n : 1) * sizeof *order);
  uint64_t *load = zck__calloc((size_t)size, sizeof *load);
  zck__hash_file *sub = zck__malloc((n ? n : 1) * sizeof *sub);
  zck_status s = pre != ZCK_OK ? pre : mine && all && owner && order && load && sub ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < n; i++) {
    struct stat sb;
    mine[i] = zck__dist_holds(files[i]->path) && stat(files[i]->path, &sb) == 0 ? (int64_t)sb.st_size : -1;
  }
  s = zck__dist_agree(ZCK__DIST_COPY_START, s);
  if (s == ZCK_OK && n) s = c->all_gather(c, mine, all, n, ZCK_I64);
  /* biggest first, each to the least loaded rank that has it (a file nobody has goes to
   * rank 0, whose read then reports it) */
  for (size_t i = 0; s == ZCK_OK && i < n; i++) {
    int64_t best = -1;
    for (int r = 0; r < size; r++) best = all[(size_t)r * n + i] > best ? all[(size_t)r * n + i] : best;
    mine[i] = best; /* the size, for the order */
    order[i] = i;
  }
  g_sizes = mine;
  if (s == ZCK_OK && n) qsort(order, n, sizeof *order, cmp_size);
  size_t k = 0;
  const char *tv = getenv("ZCK_DIST_TRACE"); /* as exec_dist.c */
  bool trace = tv && *tv && strcmp(tv, "0");
  for (size_t oi = 0; s == ZCK_OK && oi < n; oi++) {
    size_t i = order[oi];
    int best = -1;
    for (int r = 0; r < size; r++)
      if (all[(size_t)r * n + i] >= 0 && (best < 0 || load[r] < load[best])) best = r;
    if (best < 0) best = 0;
    owner[i] = best;
    if (trace && best == me) fprintf(stderr, "zckpt: rank %d: reads %s (whole, %lld bytes)\n", me, files[i]->path, (long long)mine[i]);
    load[best] += mine[i] > 0 ? (uint64_t)mine[i] : 0;
  }
  for (size_t i = 0; s == ZCK_OK && i < n; i++)
    if (owner[i] == me) sub[k++] = *files[i];
  if (s == ZCK_OK) s = zck__hash_files(sub, k, o);
  for (size_t i = 0, j = 0; s == ZCK_OK && i < n; i++)
    if (owner[i] == me) *files[i] = sub[j++]; /* the results (chunks and error move with them) */
  s = zck__dist_agree(ZCK__DIST_HASHED, s);
  /* every rank's results to all */
  for (int r = 0; s == ZCK_OK && r < size; r++) {
    buf b = {NULL, 0, 0, false};
    if (r == me)
      for (size_t i = 0; i < n; i++)
        if (owner[i] == me) put_file(&b, i, files[i]);
    int64_t len = b.oom ? -1 : (int64_t)b.n;
    s = c->broadcast(c, &len, 1, ZCK_I64, r);
    if (s == ZCK_OK && len < 0) s = zck__fail(ZCK_ERR_NO_MEMORY, "rank %d: out of memory sending hash results", r);
    if (s == ZCK_OK && r != me && len > 0 && !(b.p = zck__malloc((size_t)len))) s = ZCK_ERR_NO_MEMORY;
    if (s == ZCK_OK && len > 0) s = c->broadcast(c, b.p, (size_t)len, ZCK_U8, r);
    if (s == ZCK_OK && r != me) s = get_files(b.p, b.p + len, files, n);
    free(b.p);
  }
  free(mine), free(all), free(owner), free(order), free(load), free(sub), free(files);
  return s;
}

zck_status zck__hash_files_shared(zck__hash_file *files, size_t n, const zck_manifest_hash_opts *o) {
  if (!zck__dist_on()) return zck__hash_files(files, n, o);
  return hash_shared(files, n, o, ZCK_OK);
}

/* ---- rank 0's manifest, hashed by every rank
 *
 * Only rank 0 writes a distributed job's manifest, and its hash streams saw only what it
 * wrote itself: the rest of each output file must be read. The other ranks wait in
 * zck__hash_files_follow for rank 0's list of files to read (or its word that there is
 * none), then all hash it shared, each file read by one rank. */

static bool g_led; /* rank 0 sent its list (or its "none") in this manifest */

static zck_status send_list(const zck__hash_file *files, int64_t n) {
  zck_comm *c = zck__dist_comm();
  buf b = {NULL, 0, 0, false};
  for (int64_t i = 0; i < n; i++) {
    uint64_t pl = strlen(files[i].path), nr = files[i].n_ranges;
    put(&b, &pl, 8), put(&b, files[i].path, pl), put(&b, &files[i].chunk_size, 8), put(&b, &nr, 8);
    for (size_t k = 0; k < nr; k++) {
      uint32_t want = files[i].ranges[k].want;
      put(&b, &files[i].ranges[k].off, 8), put(&b, &files[i].ranges[k].len, 8), put(&b, &want, 4);
    }
  }
  int64_t head[2] = {n, b.oom ? -1 : (int64_t)b.n};
  g_led = true;
  zck_status s = c->broadcast(c, head, 2, ZCK_I64, 0);
  if (s == ZCK_OK && head[1] < 0) s = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory sending the files to hash");
  if (s == ZCK_OK && head[1] > 0) s = c->broadcast(c, b.p, (size_t)head[1], ZCK_U8, 0);
  free(b.p);
  return s;
}

zck_status zck__hash_files_lead(zck__hash_file *files, size_t n, const zck_manifest_hash_opts *o) {
  if (!zck__dist_on()) return zck__hash_files(files, n, o);
  ZCK_TRY(send_list(files, (int64_t)n));
  return zck__hash_files_shared(files, n, o);
}

void zck__hash_files_release(void) {
  if (zck__dist_on() && zck__dist_rank() == 0 && !g_led) send_list(NULL, -1);
  g_led = false;
}

zck_status zck__hash_files_follow(const zck_manifest_hash_opts *o) {
  zck_comm *c = zck__dist_comm();
  int64_t head[2] = {0, 0};
  ZCK_TRY(c->broadcast(c, head, 2, ZCK_I64, 0));
  if (head[0] < 0) return ZCK_OK; /* rank 0 reads nothing (or failed before: the commit's agreement says) */
  if (head[1] < 0) return ZCK_ERR_NO_MEMORY;
  uint8_t *p = head[1] > 0 ? zck__malloc((size_t)head[1]) : NULL;
  zck_status s = head[1] > 0 && !p ? ZCK_ERR_NO_MEMORY : ZCK_OK;
  /* the broadcast is collective: taken even when the buffer could not be made (into a
   * scratch byte by byte would be slow; mpirun ends the job on the failure instead) */
  if (s == ZCK_OK && head[1] > 0) s = c->broadcast(c, p, (size_t)head[1], ZCK_U8, 0);
  size_t n = (size_t)head[0];
  zck__hash_file *files = s == ZCK_OK ? zck__calloc(n ? n : 1, sizeof *files) : NULL;
  if (s == ZCK_OK && !files) s = ZCK_ERR_NO_MEMORY;
  const uint8_t *at = p, *end = p + (head[1] > 0 ? head[1] : 0);
  for (size_t i = 0; s == ZCK_OK && i < n; i++) {
    uint64_t pl = 0, nr = 0;
    char *path = NULL;
    bool ok = get(&at, end, &pl, 8) && pl <= (uint64_t)(end - at) && (path = zck__malloc((size_t)pl + 1));
    if (ok) {
      memcpy(path, at, (size_t)pl);
      path[pl] = 0;
      at += pl;
      files[i].path = path;
      ok = get(&at, end, &files[i].chunk_size, 8) && get(&at, end, &nr, 8) && nr <= (uint64_t)(end - at) / 20;
    }
    if (ok && nr && !(files[i].ranges = zck__calloc((size_t)nr, sizeof *files[i].ranges))) ok = false;
    files[i].n_ranges = (size_t)nr;
    for (size_t k = 0; ok && k < nr; k++) {
      uint32_t want = 0;
      ok = get(&at, end, &files[i].ranges[k].off, 8) && get(&at, end, &files[i].ranges[k].len, 8) &&
           get(&at, end, &want, 4);
      files[i].ranges[k].want = want;
    }
    if (!ok) s = zck__fail(ZCK_ERR_INTERNAL, "rank %d: a garbled list of files to hash from rank 0", zck__dist_rank());
  }
  free(p);
  /* a failure here still meets the others at the sharing's agreements */
  s = hash_shared(s == ZCK_OK ? files : NULL, s == ZCK_OK ? n : 0, o, s);
  for (size_t i = 0; files && i < n; i++) {
    free((char *)files[i].path);
    free(files[i].ranges);
    zck__hash_file_clear(&files[i]);
  }
  free(files);
  return s;
}
