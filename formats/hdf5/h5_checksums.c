/* h5_checksums.c: the checksum table (h5_checksums.h): pieces, their entries, the writer's
 * table and the reader's check of every piece it reads. */
#include "h5_checksums.h"

#include <stdlib.h>
#include <string.h>
#include "hash_xxh3.h"

#include "h5_write_internal.h"

// ---- pieces and entries

void zck__h5c_ds_setup(zck__h5c_ds *c, const char *path, zck_dtype dtype, int ndim, const uint64_t *dims,
                       uint64_t piece_bytes) {
  zck__h5c_geometry(c, dtype, ndim, dims, piece_bytes);
  c->seed = zck__h5c_seed(path, dtype, ndim, dims);
}

void zck__h5c_geometry(zck__h5c_ds *c, zck_dtype dtype, int ndim, const uint64_t *dims, uint64_t piece_bytes) {
  memset(c, 0, sizeof *c);
  c->on = true;
  size_t es = zck_dtype_size(dtype);
  uint64_t target = es && piece_bytes / es ? piece_bytes / es : 1;
  c->numel = 1;
  for (int i = 0; i < ndim; i++) c->numel *= dims[i];
  zck__h5c_geom *g = &c->g;
  if (ndim == 0 || c->numel == 0) {
    /* one piece: the 0-dim tensor's element, or nothing */
    g->k = 0;
    g->inner = g->ck = 1;
    g->slab = g->per_prefix = g->n = 1;
  } else {
    /* zck__h5w_chunking's cut: the first dim k whose trailing product fits the target,
     * as many of its indices as fit */
    uint64_t inner = 1;
    int k = ndim - 1;
    while (k > 0 && inner * dims[k] <= target) {
      inner *= dims[k];
      k--;
    }
    uint64_t ck = target / inner;
    if (ck < 1) ck = 1;
    if (ck > dims[k]) ck = dims[k];
    g->k = k;
    g->inner = inner;
    g->ck = ck;
    g->slab = dims[k] * inner;
    g->per_prefix = zck__ceil_div(dims[k], ck);
    g->n = c->numel / g->slab * g->per_prefix;
  }
}

uint64_t zck__h5c_seed(const char *path, zck_dtype dtype, int ndim, const uint64_t *dims) {
  /* what the dataset is and where: path, dtype, shape */
  zck__buf b;
  zck__buf_init(&b);
  if (path[0] != '/') zck__buf_append(&b, "/", 1);
  zck__buf_append(&b, path, strlen(path) + 1);
  const char *dn = zck_dtype_name(dtype);
  zck__buf_append(&b, dn, strlen(dn) + 1);
  uint64_t nd = (uint64_t)ndim;
  zck__buf_append(&b, &nd, 8);
  for (int i = 0; i < ndim; i++) zck__buf_append(&b, &dims[i], 8);
  /* out of memory here leaves a seed every read then misses: refused, never passed */
  uint64_t seed = b.failed ? 0 : XXH3_64bits(b.data, b.len);
  zck__buf_free(&b);
  return seed;
}

void zck__h5c_piece(const zck__h5c_ds *c, uint64_t i, uint64_t *first, uint64_t *count) {
  const zck__h5c_geom *g = &c->g;
  uint64_t p = i / g->per_prefix, j = i % g->per_prefix;
  uint64_t rows = g->slab / g->inner - j * g->ck;
  *first = p * g->slab + j * g->ck * g->inner;
  *count = c->numel ? (rows < g->ck ? rows : g->ck) * g->inner : 0;
}

/* The piece holding flat element e. */
static uint64_t zck__h5c_piece_of(const zck__h5c_ds *c, uint64_t e) {
  const zck__h5c_geom *g = &c->g;
  return e / g->slab * g->per_prefix + e % g->slab / (g->ck * g->inner);
}

/* Elements of the longest piece. */
static uint64_t zck__h5c_piece_max(const zck__h5c_ds *c) { return c->g.ck * c->g.inner; }

uint64_t zck__h5c_hash(const zck__h5c_ds *c, uint64_t i, const void *bytes, size_t n) {
  uint64_t key[2] = {c->seed, i};
  return XXH3_64bits_withSeed(bytes, n, XXH3_64bits(key, sizeof key));
}

// ---- writer

zck_status zck__h5c_writer_ds(const char *label, zck__h5c_ds *c, const char *path, zck_dtype dtype, int ndim,
                              const uint64_t *dims, uint64_t piece_bytes, bool chunked, uint64_t chunk_elems,
                              uint64_t n_chunks) {
  zck__h5c_ds_setup(c, path, dtype, ndim, dims, piece_bytes);
  /* the writer hashes each chunk as it completes it: that needs its chunks to be the
   * pieces (an empty dataset has no chunk and one empty piece) */
  bool same = chunked ? c->g.n == n_chunks && c->g.ck * c->g.inner == chunk_elems
                      : (c->numel == 0 && n_chunks == 0) || (c->g.n == 1 && n_chunks == 1 && chunk_elems == c->numel);
  if (!same) return zck__fail(ZCK_ERR_INTERNAL, "%s: its chunks are not its checksum pieces", label);
  if (!(c->sums = zck__calloc(c->g.n, sizeof *c->sums))) return ZCK_ERR_NO_MEMORY;
  if (!c->numel) c->sums[0] = zck__h5c_hash(c, 0, "", 0);
  return ZCK_OK;
}

void zck__h5c_writer_chunk(zck__h5c_ds *c, uint64_t id, const void *buf, size_t es) {
  if (!c->on) return;
  uint64_t first, count;
  zck__h5c_piece(c, id, &first, &count);
  c->sums[id] = zck__h5c_hash(c, id, buf, (size_t)(count * es));
}

static int zck__h5c_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

zck_status zck__h5c_writer_table(zck_h5_writer *w, zck__h5c_ds *const *ds, size_t n, const uint64_t *settled,
                                 size_t n_settled, uint64_t piece_bytes) {
  size_t total = n_settled;
  for (size_t i = 0; i < n; i++) total += ds[i]->on ? (size_t)ds[i]->g.n : 0;
  uint64_t *v = zck__malloc((total ? total : 1) * sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  if (n_settled) memcpy(v, settled, n_settled * sizeof *v);
  size_t k = n_settled;
  for (size_t i = 0; i < n; i++)
    if (ds[i]->on) for (uint64_t j = 0; j < ds[i]->g.n; j++) v[k++] = ds[i]->sums[j];
  qsort(v, total, sizeof *v, zck__h5c_cmp);
  zck_store s;
  int64_t len = (int64_t)total;
  zck_status st = zck_h5_writer_dataset(w, ZCK__H5C_TABLE, ZCK_U64, 1, &len, &s);
  if (st == ZCK_OK && total) st = s.write(s.ctx, v, 0, total);
  uint64_t h = XXH3_64bits(v, total * sizeof *v);
  free(v);
  zck__h5_lock();
  if (st == ZCK_OK) st = zck__h5w_attr(w, "/", ZCK__H5C_PIECE_ATTR, H5T_STD_U64LE, &piece_bytes);
  if (st == ZCK_OK) st = zck__h5w_attr(w, "/", ZCK__H5C_TABLE_ATTR, H5T_STD_U64LE, &h);
  zck__h5_unlock();
  return st;
}

// ---- reader

zck_status zck__h5c_load(zck_h5_file *f, uint64_t table_xxh3, uint64_t piece_bytes, zck__h5c_table **out) {
  *out = NULL;
  const char *fn = zck_h5_name(f);
  if (!piece_bytes || piece_bytes > ZCK__H5_MAX_CHUNK_BYTES)
    return zck__fail(ZCK_ERR_FORMAT, "%s: attribute %s: %llu bytes", fn, ZCK__H5C_PIECE_ATTR, (unsigned long long)piece_bytes);
  zck_h5_dataset *d = NULL;
  zck_status st = zck_h5_dataset_open(f, ZCK__H5C_TABLE, &d);
  if (st == ZCK_ERR_NOT_FOUND)
    return zck__fail(ZCK_ERR_DAMAGED, "%s: damaged: its root records a checksum table (%s) but it has no %s", fn,
                     ZCK__H5C_TABLE_ATTR, ZCK__H5C_TABLE);
  if (st != ZCK_OK) return st;
  const zck_h5_dataset_info *di = zck_h5_dataset_info_of(d);
  zck__h5c_table *t = zck__calloc(1, sizeof *t);
  if (!t) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK && (di->ndim != 1 || di->dtype != ZCK_U64))
    st = zck__fail(ZCK_ERR_FORMAT, "%s:%s: not a 1-d uint64 dataset", fn, ZCK__H5C_TABLE);
  if (st == ZCK_OK && di->numel > ((uint64_t)1 << 32))
    st = zck__fail(ZCK_ERR_LIMIT, "%s:%s: %llu entries", fn, ZCK__H5C_TABLE, (unsigned long long)di->numel);
  if (st == ZCK_OK && !(t->v = zck__malloc(di->numel ? (size_t)di->numel * 8 : 8))) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck_h5_dataset_read(d, t->v, 0, di->numel);
  if (st == ZCK_OK) {
    t->n = (size_t)di->numel;
    t->piece_bytes = piece_bytes;
    if (XXH3_64bits(t->v, t->n * 8) != table_xxh3)
      st = zck__fail(ZCK_ERR_DAMAGED, "%s:%s: damaged: the checksum table does not match its %s", fn, ZCK__H5C_TABLE,
                     ZCK__H5C_TABLE_ATTR);
    for (size_t i = 1; st == ZCK_OK && i < t->n; i++)
      if (t->v[i - 1] > t->v[i]) st = zck__fail(ZCK_ERR_FORMAT, "%s:%s: entries not sorted", fn, ZCK__H5C_TABLE);
  }
  zck_h5_dataset_close(d);
  if (st != ZCK_OK) {
    zck__h5c_table_free(t);
    return st;
  }
  *out = t;
  return ZCK_OK;
}

void zck__h5c_table_free(zck__h5c_table *t) {
  if (!t) return;
  free(t->v);
  free(t);
}

static bool zck__h5c_has(const zck__h5c_table *t, uint64_t x) {
  size_t lo = 0, hi = t->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->v[mid] < x) lo = mid + 1;
    else hi = mid;
  }
  return lo < t->n && t->v[lo] == x;
}

zck_status zck__h5c_read(const zck__h5c_ds *c, const zck__h5c_table *t, const char *label, size_t es,
                         zck__h5c_read_fn read, void *ctx, void *dst, uint64_t first, uint64_t count) {
  uint64_t end = first + count;
  uint8_t *out = dst, *scratch = NULL;
  zck_status st = ZCK_OK;
  for (uint64_t i = zck__h5c_piece_of(c, first); st == ZCK_OK && i < c->g.n; i++) {
    uint64_t pf, pn;
    zck__h5c_piece(c, i, &pf, &pn);
    if (pf >= end) break;
    bool whole = pf >= first && pf + pn <= end;
    uint8_t *at = whole ? out + (pf - first) * es : NULL;
    if (!whole && !scratch && !(scratch = malloc((size_t)(zck__h5c_piece_max(c) * es)))) {
      st = zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory for a piece", label);
      break;
    }
    if (!at) at = scratch;
    st = read(ctx, at, pf, pn);
    if (st != ZCK_OK) break;
    if (!zck__h5c_has(t, zck__h5c_hash(c, i, at, (size_t)(pn * es)))) {
      st = zck__fail(ZCK_ERR_DAMAGED, "%s: damaged: elements [%llu, +%llu) are not the data written there (not in "
                     "the file's checksum table: swapped, stale or edited)", label, (unsigned long long)pf,
                     (unsigned long long)pn);
      break;
    }
    if (!whole) {
      uint64_t lo = pf > first ? pf : first, hi = pf + pn < end ? pf + pn : end;
      memcpy(out + (lo - first) * es, scratch + (lo - pf) * es, (size_t)((hi - lo) * es));
    }
  }
  free(scratch);
  return st;
}
