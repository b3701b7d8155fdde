/* exec_verify.c: verify on read (exec.h). The records' CRC-32s from the pieces the batches
 * read (the bytes between them read now), and the verify_first pass over the stores with
 * an XXH3. */
#include "exec_internal.h"

#include "threadpool.h"

#include <stdlib.h>

/* verify_first: every source store with an XXH3 that an extent reads, hashed whole in a
 * pass of its own (each once, in parallel) and compared. */
static int cmp_store_ptr(const void *a, const void *b) {
  const zck_store *x = *(const zck_store *const *)a, *y = *(const zck_store *const *)b;
  return x < y ? -1 : x > y;
}

zck_status zck__exec_verify_xxh3_first(exec_ctx *c) {
  size_t n = 0;
  for (size_t jn = 0; jn < c->n_jobs; jn++) n += c->jobs[jn].plan->n;
  const zck_store **v = zck__malloc((n ? n : 1) * sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t jn = 0; jn < c->n_jobs; jn++) {
    const zck_exec_job *j = &c->jobs[jn];
    for (size_t i = 0; i < j->plan->n; i++) {
      const zck_store *S = &j->src[j->plan->ext[i].src_store];
      if (S->has_xxh3 && (S->kind == ZCK_STORE_SOURCE || S->kind == ZCK_STORE_FD) && (!k || v[k - 1] != S)) v[k++] = S;
    }
  }
  if (k > 1) qsort(v, k, sizeof *v, cmp_store_ptr);
  size_t u = 0; /* distinct stores */
  for (size_t i = 0; i < k; i++)
    if (!u || v[u - 1] != v[i]) v[u++] = v[i];
  zck_store *stores = zck__malloc((u ? u : 1) * sizeof *stores);
  uint64_t *got = zck__malloc((u ? u : 1) * sizeof *got);
  zck_status st = stores && got ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < u; i++) stores[i] = *v[i];
  zck_exec_opts ho = *c->o;
  ho.staging_bytes = c->staging;
  if (st == ZCK_OK && u) st = zck_exec_hash_stores(stores, u, &ho, got, NULL);
  for (size_t i = 0; st == ZCK_OK && i < u; i++)
    if (got[i] != stores[i].xxh3)
      st = zck__fail(ZCK_ERR_DAMAGED, "%s: XXH3-64 mismatch with " "zckpt-manifest.json (stored %016llx, read %016llx)",
                     stores[i].name ? stores[i].name : "a source store", (unsigned long long)stores[i].xxh3,
                     (unsigned long long)got[i]);
  free(v);
  free(stores);
  free(got);
  return st;
}

typedef struct vpiece {
  const zck_store *S;    /* the store it was read through (source, record) */
  uintptr_t file;        /* the source's identity */
  uint64_t rec_off;
  uint64_t lo, hi;
  uint32_t crc;
} vpiece;

static uintptr_t file_id(const zck_store *S) {
  return S->kind == ZCK_STORE_SOURCE ? (uintptr_t)S->source : (uintptr_t)(S->fd + 1);
}

static int cmp_vpiece(const void *a, const void *b) {
  const vpiece *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  if (x->rec_off != y->rec_off) return x->rec_off < y->rec_off ? -1 : 1;
  if (x->lo != y->lo) return x->lo < y->lo ? -1 : 1;
  return x->hi > y->hi ? -1 : x->hi < y->hi;  /* the longest first */
}

typedef struct vrec_ctx {
  vpiece *p;
  size_t *group;         /* [n_groups + 1] starts into p */
  uint8_t **bufs;
  size_t staging;
} vrec_ctx;

static zck_status raw_read(const zck_store *S, void *dst, size_t n, uint64_t off) {
  if (S->kind == ZCK_STORE_SOURCE) return zck__source_read(S->source, dst, n, off);
  return zck__pread_all(S->fd, dst, n, off, S->name ? S->name : "source");
}

/* CRC of bytes [lo, hi) of the file, read in staging-sized pieces. */
static zck_status crc_of_gap(const zck_store *S, uint8_t *buf, size_t cap, uint64_t lo, uint64_t hi, uint32_t *crc) {
  *crc = 0;
  for (uint64_t k = lo; k < hi; k += cap) {
    size_t n = hi - k < cap ? (size_t)(hi - k) : cap;
    ZCK_TRY(raw_read(S, buf, n, k));
    *crc = zck_crc32_update(*crc, buf, n);
  }
  return ZCK_OK;
}

static zck_status verify_record(void *ctx, size_t g, unsigned thread) {
  vrec_ctx *v = ctx;
  const vpiece *p = v->p + v->group[g], *pe = v->p + v->group[g + 1];
  const zck_store *S = p->S;
  const zck_record_check *r = S->record;
  if (!v->bufs[thread] && !(v->bufs[thread] = zck__malloc(v->staging))) return ZCK_ERR_NO_MEMORY;
  uint64_t pos = r->off, end = r->off + r->size;
  uint32_t crc = 0, part;
  for (; p < pe; p++) {
    if (p->hi <= pos) continue;                  /* read twice (two views, two jobs) */
    if (p->lo > pos) {                           /* bytes the plan did not need */
      ZCK_TRY(crc_of_gap(S, v->bufs[thread], v->staging, pos, p->lo, &part));
      crc = zck_crc32_combine(crc, part, p->lo - pos);
      pos = p->lo;
    }
    if (p->lo == pos) {
      crc = zck_crc32_combine(crc, p->crc, p->hi - p->lo);
    } else {                                     /* overlaps what is counted: the rest again */
      ZCK_TRY(crc_of_gap(S, v->bufs[thread], v->staging, pos, p->hi, &part));
      crc = zck_crc32_combine(crc, part, p->hi - pos);
    }
    pos = p->hi;
  }
  if (pos < end) {
    ZCK_TRY(crc_of_gap(S, v->bufs[thread], v->staging, pos, end, &part));
    crc = zck_crc32_combine(crc, part, end - pos);
  }
  if (crc != r->crc32) {
    const char *file = S->kind == ZCK_STORE_SOURCE ? S->source->name : S->name;
    return zck__fail(ZCK_ERR_DAMAGED, "%s: %s: CRC-32 mismatch (stored %08x, read %08x)", file ? file : "source",
                     r->what ? r->what : "record", r->crc32, crc);
  }
  return ZCK_OK;
}

zck_status zck__exec_verify_records(exec_ctx *c) {
  size_t n = 0;
  for (size_t bi = 0; bi < c->n_batches; bi++) n += c->pieces[bi].set;
  if (!n) return ZCK_OK;
  vpiece *v = zck__malloc(n * sizeof *v);
  size_t *group = zck__malloc((n + 1) * sizeof *group);
  zck_status st = v && group ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t k = 0, ng = 0;
  for (size_t bi = 0; st == ZCK_OK && bi < c->n_batches; bi++) {
    if (!c->pieces[bi].set) continue;
    const batch *b = &c->batches[bi];
    const zck_exec_job *j = &c->jobs[b->job];
    const zck_store *S = &j->src[j->plan->ext[b->order ? b->order[0] : b->first].src_store];
    v[k++] = (vpiece){S, file_id(S), S->record->off, c->pieces[bi].lo, c->pieces[bi].hi, c->pieces[bi].crc};
  }
  if (st == ZCK_OK) {
    qsort(v, n, sizeof *v, cmp_vpiece);
    for (size_t i = 0; i < n; i++)
      if (!i || v[i].file != v[i - 1].file || v[i].rec_off != v[i - 1].rec_off) group[ng++] = i;
    group[ng] = n;
    vrec_ctx vc = {v, group, c->bufs, c->staging};
    unsigned workers = zck__worker_count(ng, c->o->threads);
    if (workers > c->n_workers) workers = c->n_workers ? c->n_workers : 1;
    st = zck__parallel_for(ng, workers, verify_record, &vc);
  }
  free(v);
  free(group);
  return st;
}
