/* exec_batch.c: cutting the jobs' extents into batches (runs of consecutive extents
 * reading one source store front to back, or one whole-store stream), and ordering them by
 * their targets' write order when every target has one. */
#include "exec_internal.h"

#include <stdlib.h>
#include <string.h>

/* Source bytes between two extents that are read and dropped rather than split the read. */
#define ZCK__GAP_BYTES 4096

static bool readable_in_batches(const zck_store *s) { return s->kind != ZCK_STORE_MEMORY; }

/* A store read whole in order by one worker: its XXH3 is checked (unless a pass of its
 * own checked it first: verify_first). */
static bool streams_whole(const exec_ctx *c, const zck_store *s) {
  return c->verify && !c->o->verify_first && s->has_xxh3 && (s->kind == ZCK_STORE_SOURCE || s->kind == ZCK_STORE_FD);
}

static int cmp_src_order_r(const void *a, const void *b, void *ctx) {
  const zck_extent *ext = ctx;
  const zck_extent *x = &ext[*(const size_t *)a], *y = &ext[*(const size_t *)b];
  if (x->src_off != y->src_off) return x->src_off < y->src_off ? -1 : 1;
  return 0;
}

zck_status zck__exec_make_batches(exec_ctx *c) {
  size_t total = 0;
  for (size_t jn = 0; jn < c->n_jobs; jn++) total += c->jobs[jn].plan->n;
  c->batches = zck__malloc((total ? total : 1) * sizeof *c->batches);
  c->order_arena = zck__malloc((total ? total : 1) * sizeof *c->order_arena);
  if (!c->batches || !c->order_arena) return ZCK_ERR_NO_MEMORY;
  size_t nb = 0, used = 0;
  for (size_t jn = 0; jn < c->n_jobs; jn++) {
    const zck_exec_job *j = &c->jobs[jn];
    const zck_plan *p = j->plan;
    size_t first_stream = nb;
    size_t *stream_of = NULL;  /* src store -> its stream batch + 1 */
    for (size_t i = 0; i < p->n;) {
      const zck_extent *e = &p->ext[i];
      const zck_store *S = &j->src[e->src_store];
      size_t ss = zck_dtype_size(S->dtype);
      if (streams_whole(c, S)) {
        if (!stream_of && !(stream_of = zck__calloc(p->n_src_stores ? p->n_src_stores : 1, sizeof *stream_of)))
          return ZCK_ERR_NO_MEMORY;
        if (!stream_of[e->src_store]) {
          c->batches[nb] = (batch){(uint32_t)jn, i, 0, 0, S->numel, NULL};
          stream_of[e->src_store] = ++nb;
        }
        c->batches[stream_of[e->src_store] - 1].n++;
        i++;
        continue;
      }
      batch b = {(uint32_t)jn, i, 1, e->src_off, e->src_off + e->count, NULL};
      uint64_t limit = c->half / ss;
      if (!readable_in_batches(S)) limit = (uint64_t)c->half * 64 / ss; /* memory: group small work only */
      size_t k = i + 1;
      if (b.hi - b.lo <= limit) {
        for (; k < p->n; k++) {
          const zck_extent *f = &p->ext[k];
          if (f->src_store != e->src_store || f->src_off < b.hi || (f->src_off - b.hi) * ss > ZCK__GAP_BYTES) break;
          /* targets in a write order: a batch writes one stretch of it (another job's
           * target in between would otherwise be written after what follows it) */
          uint64_t wo = j->dst[p->ext[k - 1].dst_store].write_order, wf = j->dst[f->dst_store].write_order;
          if (wo && wf != wo && wf != wo + 1) break;
          uint64_t hi = f->src_off + f->count;
          if (hi - b.lo > limit) break;
          b.hi = hi;
          b.n++;
        }
      }
      c->batches[nb++] = b;
      i = k;
    }
    if (!stream_of) continue;
    /* the stream batches' extent lists, each sorted by source offset */
    for (size_t bi = first_stream; bi < nb; bi++)
      if (c->batches[bi].n && stream_of[p->ext[c->batches[bi].first].src_store] == bi + 1) {
        c->batches[bi].order = c->order_arena + used;
        used += c->batches[bi].n;
        c->batches[bi].n = 0;
      }
    for (size_t i = 0; i < p->n; i++) {
      size_t sb = stream_of[p->ext[i].src_store];
      if (sb) c->batches[sb - 1].order[c->batches[sb - 1].n++] = i;
    }
    for (size_t bi = first_stream; bi < nb; bi++)
      if (c->batches[bi].order && c->batches[bi].n > 1)
        qsort_r(c->batches[bi].order, c->batches[bi].n, sizeof(size_t), cmp_src_order_r, (void *)p->ext);
    free(stream_of);
  }
  c->n_batches = nb;
  return ZCK_OK;
}

/* Where a batch writes first, in its targets' write order: (write_order, element offset)
 * of its first extent (a stream batch: its earliest). false: a target without an order. */
typedef struct batch_key { uint64_t order, off; size_t index; } batch_key;

static bool batch_first_write(const exec_ctx *c, const batch *b, batch_key *k) {
  const zck_exec_job *j = &c->jobs[b->job];
  bool any = false;
  for (size_t i = 0; i < b->n; i++) {
    const zck_extent *e = &j->plan->ext[b->order ? b->order[i] : b->first + i];
    uint64_t o = j->dst[e->dst_store].write_order;
    if (!o) return false;
    if (!any || o < k->order || (o == k->order && e->dst_off < k->off)) *k = (batch_key){o, e->dst_off, 0};
    any = true;
    if (!b->order) break; /* consecutive extents of a plan in target order: the first is the earliest */
  }
  return any;
}

static int cmp_batch_key(const void *a, const void *b) {
  const batch_key *x = a, *y = b;
  if (x->order != y->order) return x->order < y->order ? -1 : 1;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

/* When every target says where it lies in its writer's order, the batches run in that
 * order, across jobs (workers take them in index order). */
zck_status zck__exec_order_batches(exec_ctx *c) {
  if (c->n_batches < 2) return ZCK_OK;
  batch_key *k = zck__malloc(c->n_batches * sizeof *k);
  batch *sorted = k ? zck__malloc(c->n_batches * sizeof *sorted) : NULL;
  if (!k || !sorted) {
    free(k);
    return ZCK_ERR_NO_MEMORY;
  }
  bool all = true;
  for (size_t i = 0; all && i < c->n_batches; i++) {
    all = batch_first_write(c, &c->batches[i], &k[i]);
    k[i].index = i;
  }
  zck_status st = ZCK_OK;
  if (all) {
    qsort(k, c->n_batches, sizeof *k, cmp_batch_key);
    for (size_t i = 0; i < c->n_batches; i++) sorted[i] = c->batches[k[i].index];
    memcpy(c->batches, sorted, c->n_batches * sizeof *sorted);
    c->start = zck__malloc((c->n_batches + 1) * sizeof *c->start);
    c->finished = zck__calloc(c->n_batches, 1);
    if (!c->start || !c->finished) st = ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK) c->start[0] = 0;
    for (size_t i = 0; st == ZCK_OK && i < c->n_batches; i++) {
      const batch *b = &c->batches[i];
      const zck_exec_job *j = &c->jobs[b->job];
      uint64_t bytes = 0;
      for (size_t x = 0; x < b->n; x++) {
        const zck_extent *e = &j->plan->ext[b->order ? b->order[x] : b->first + x];
        bytes += e->count * zck_dtype_size(j->dst[e->dst_store].dtype);
      }
      c->start[i + 1] = c->start[i] + bytes;
    }
    c->window = 4 * (uint64_t)c->staging; /* 32 MiB by default: half a writer's hash budget */
  }
  free(k);
  free(sorted);
  return st;
}
