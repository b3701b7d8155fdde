/* plan.c: intersecting two layouts into copy extents; merging, splitting, ordering. */
#include "plan.h"

#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ext_vec {
  zck_extent *v;
  size_t n, cap;
} ext_vec;

static zck_status ext_push(ext_vec *ev, const zck_extent *e) {
  if (!ZCK__GROW(ev->v, ev->cap, ev->n + 1)) return ZCK_ERR_NO_MEMORY;
  ev->v[ev->n++] = *e;
  return ZCK_OK;
}

static int cmp_by_src(const void *a, const void *b) {
  const zck_extent *x = a, *y = b;
  if (x->src_store != y->src_store) return x->src_store < y->src_store ? -1 : 1;
  if (x->src_off != y->src_off) return x->src_off < y->src_off ? -1 : 1;
  if (x->dst_store != y->dst_store) return x->dst_store < y->dst_store ? -1 : 1;
  if (x->dst_off != y->dst_off) return x->dst_off < y->dst_off ? -1 : 1;
  return 0;
}

static int cmp_by_dst(const void *a, const void *b) {
  const zck_extent *x = a, *y = b;
  if (x->dst_store != y->dst_store) return x->dst_store < y->dst_store ? -1 : 1;
  if (x->dst_off != y->dst_off) return x->dst_off < y->dst_off ? -1 : 1;
  if (x->src_store != y->src_store) return x->src_store < y->src_store ? -1 : 1;
  if (x->src_off != y->src_off) return x->src_off < y->src_off ? -1 : 1;
  return 0;
}

/* The planners emit each store's extents in offset order, the stores interleaved (param
 * by param): a stable counting pass by the major store is then the whole sort, linear in
 * the extents (a 100k-param plan is ~1M of them). Checked; false (p untouched) when it is
 * not sorted after all, or the store ids are too sparse to count. */
static bool sort_by_store(zck_plan *p, bool by_dst) {
  uint32_t max = 0;
  for (size_t i = 0; i < p->n; i++) {
    uint32_t s = by_dst ? p->ext[i].dst_store : p->ext[i].src_store;
    if (s > max) max = s;
  }
  if (max > 4 * p->n + 1024) return false;
  size_t *at = zck__calloc((size_t)max + 2, sizeof *at);
  zck_extent *out = at ? zck__malloc(p->n * sizeof *out) : NULL;
  if (!out) {
    free(at);
    zck_clear_error();
    return false;
  }
  for (size_t i = 0; i < p->n; i++) at[(by_dst ? p->ext[i].dst_store : p->ext[i].src_store) + 1]++;
  for (size_t s = 1; s <= (size_t)max + 1; s++) at[s] += at[s - 1];
  for (size_t i = 0; i < p->n; i++) out[at[by_dst ? p->ext[i].dst_store : p->ext[i].src_store]++] = p->ext[i];
  free(at);
  int (*cmp)(const void *, const void *) = by_dst ? cmp_by_dst : cmp_by_src;
  bool sorted = true;
  for (size_t i = 1; sorted && i < p->n; i++) sorted = cmp(&out[i - 1], &out[i]) <= 0;
  if (sorted) memcpy(p->ext, out, p->n * sizeof *out);
  free(out);
  return sorted;
}

void zck_plan_normalize(zck_plan *p, zck_plan_order order, bool merge) {
  if (p->n > 1 && !sort_by_store(p, order == ZCK_PLAN_BY_DST))
    qsort(p->ext, p->n, sizeof *p->ext, order == ZCK_PLAN_BY_DST ? cmp_by_dst : cmp_by_src);
  if (!merge || p->n < 2) return;
  size_t k = 0;
  for (size_t i = 1; i < p->n; i++) {
    zck_extent *a = &p->ext[k];
    const zck_extent *b = &p->ext[i];
    if (a->src_store == b->src_store && a->dst_store == b->dst_store && a->src_off + a->count == b->src_off &&
        a->dst_off + a->count == b->dst_off && !zck_extent_strided(a) && !zck_extent_strided(b))
      a->count += b->count;
    else
      p->ext[++k] = *b;
  }
  p->n = k + 1;
}

/* Parts of a strided extent cut for max_chunk (out NULL: only counted): whole runs, as
 * many as max_chunk holds; runs longer than max_chunk one each, then cut as contiguous. */
static uint64_t split_strided(const zck_extent *e, uint64_t max_chunk, zck_extent *out) {
  uint64_t parts = 0, per = e->run <= max_chunk ? max_chunk / e->run : 1;
  for (uint64_t k = 0; k < e->count; k += per * e->run) {
    uint64_t n = e->count - k < per * e->run ? e->count - k : per * e->run;
    zck_extent c = *e;
    c.src_off = zck_extent_src_at(e, k);
    c.dst_off = zck_extent_dst_at(e, k);
    c.count = n;
    if (n <= c.run) c.run = c.src_stride = c.dst_stride = 0;
    if (c.run || n <= max_chunk) {
      if (out) out[parts] = c;
      parts++;
      continue;
    }
    for (uint64_t j = 0; j < n; j += max_chunk, parts++)   /* one long run */
      if (out) {
        out[parts] = c;
        out[parts].src_off += j;
        out[parts].dst_off += j;
        out[parts].count = n - j < max_chunk ? n - j : max_chunk;
      }
  }
  return parts;
}

zck_status zck_plan_split(zck_plan *p, uint64_t max_chunk) {
  if (!max_chunk) return ZCK_OK;
  size_t extra = 0;
  for (size_t i = 0; i < p->n; i++) {
    uint64_t parts = zck_extent_strided(&p->ext[i]) ? split_strided(&p->ext[i], max_chunk, NULL)
                                                    : zck__ceil_div(p->ext[i].count, max_chunk);
    if (parts > 1) {
      ZCK_FAIL_IF(parts > SIZE_MAX / 4 || extra + parts > SIZE_MAX / sizeof(zck_extent) / 2, ZCK_ERR_LIMIT,
                  "copy plan: chunk size %llu makes too many chunks", (unsigned long long)max_chunk);
      extra += (size_t)parts - 1;
    }
  }
  if (!extra) return ZCK_OK;
  zck_extent *nv = zck__malloc((p->n + extra) * sizeof *nv);
  if (!nv) return ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t i = 0; i < p->n; i++) {
    zck_extent e = p->ext[i];
    if (zck_extent_strided(&e)) {
      k += (size_t)split_strided(&e, max_chunk, nv + k);
      continue;
    }
    while (e.count > max_chunk) {
      zck_extent c = e;
      c.count = max_chunk;
      nv[k++] = c;
      e.src_off += max_chunk;
      e.dst_off += max_chunk;
      e.count -= max_chunk;
    }
    nv[k++] = e;
  }
  free(p->ext);
  p->ext = nv;
  p->n = k;
  return ZCK_OK;
}

/* Does extent e need cutting into runs (see zck_plan_unstride)? */
static bool needs_unstride(const zck_extent *e, bool all) {
  return zck_extent_strided(e) && (all || e->src_stride != e->run);
}

zck_status zck_plan_unstride(const zck_plan *p, bool all, zck_plan **out) {
  *out = NULL;
  size_t n = 0;
  bool any = false;
  for (size_t i = 0; i < p->n; i++) {
    uint64_t runs = needs_unstride(&p->ext[i], all) ? zck_runs_n(p->ext[i].count, p->ext[i].run) : 1;
    ZCK_FAIL_IF(runs > SIZE_MAX / sizeof(zck_extent) / 2 - n, ZCK_ERR_LIMIT, "copy plan: too many runs to copy one by one");
    n += (size_t)runs;
    any |= runs > 1;
  }
  if (!any) return ZCK_OK;
  zck_plan *q = zck__calloc(1, sizeof *q);
  zck_extent *v = q ? zck__malloc(n * sizeof *v) : NULL;
  if (!v) {
    free(q);
    return ZCK_ERR_NO_MEMORY;
  }
  size_t k = 0;
  for (size_t i = 0; i < p->n; i++) {
    const zck_extent *e = &p->ext[i];
    if (!needs_unstride(e, all)) {
      v[k++] = *e;
      continue;
    }
    for (uint64_t j = 0; j < e->count; j += e->run)
      v[k++] = (zck_extent){e->src_store, e->dst_store, e->param, zck_extent_src_at(e, j), zck_extent_dst_at(e, j),
                            e->count - j < e->run ? e->count - j : e->run, 0, 0, 0};
  }
  q->ext = v;
  q->n = k;
  q->n_src_stores = p->n_src_stores;
  q->n_dst_stores = p->n_dst_stores;
  q->total = p->total;
  *out = q;
  return ZCK_OK;
}

static zck_plan *plan_alloc(size_t n_src, size_t n_dst) {
  zck_plan *p = zck__calloc(1, sizeof *p);
  if (p) {
    p->n_src_stores = n_src;
    p->n_dst_stores = n_dst;
  }
  return p;
}

void zck_plan_free(zck_plan *p) {
  if (!p) return;
  free(p->ext);
  free(p);
}

zck_status zck_plan_from_extents(const zck_extent *ext, size_t n, size_t n_src_stores, size_t n_dst_stores,
                                 zck_plan **out) {
  *out = NULL;
  zck_plan *p = plan_alloc(n_src_stores, n_dst_stores);
  if (!p) return ZCK_ERR_NO_MEMORY;
  p->ext = zck__malloc((n ? n : 1) * sizeof *ext);
  if (!p->ext) {
    zck_plan_free(p);
    return ZCK_ERR_NO_MEMORY;
  }
  if (n) memcpy(p->ext, ext, n * sizeof *ext);
  p->n = n;
  for (size_t i = 0; i < n; i++) p->total += ext[i].count;
  *out = p;
  return ZCK_OK;
}

/* "parameter NAME" or "parameter 12" into buf. */
static const char *param_label(const zck_plan_opts *o, uint32_t p, char *buf, size_t cap) {
  if (o->param_names && o->param_names[p]) snprintf(buf, cap, "parameter %s", o->param_names[p]);
  else snprintf(buf, cap, "parameter %u", p);
  return buf;
}

/* The sweep for one param: every target piece against the source pieces covering it. */
static zck_status intersect_param(const zck_layout *src, const zck_layout *dst, uint32_t p, const zck_plan_opts *o,
                                  ext_vec *ev) {
  size_t si = src->param_first[p], se = src->param_first[p + 1];
  for (size_t di = dst->param_first[p]; di < dst->param_first[p + 1]; di++) {
    const zck_piece *d = &dst->pieces[di];
    uint64_t a = d->param_off, b = d->param_off + d->count;
    /* source pieces ending at or before a are of no use to this or later target pieces */
    while (si < se && src->pieces[si].param_off + src->pieces[si].count <= a) si++;
    size_t k = si;
    uint64_t pos = a;
    while (pos < b) {
      const zck_piece *s = k < se ? &src->pieces[k] : NULL;
      if (!s || s->param_off > pos) { /* a gap in the source */
        uint64_t gap_end = s && s->param_off < b ? s->param_off : b;
        if (!o->allow_missing) {
          char buf[512];
          return zck__fail(ZCK_ERR_MISMATCH, "%s: elements [%llu, %llu) of %llu are in no source store",
                           param_label(o, p, buf, sizeof buf), (unsigned long long)pos, (unsigned long long)gap_end,
                           (unsigned long long)src->param_numel[p]);
        }
        pos = gap_end;
        continue;
      }
      uint64_t s_end = s->param_off + s->count, end = s_end < b ? s_end : b;
      zck_extent e = {s->store, d->store, p, s->store_off + (pos - s->param_off), d->store_off + (pos - a), end - pos,
                      0, 0, 0};
      ZCK_TRY(ext_push(ev, &e));
      pos = end;
      if (s_end <= pos) k++;
    }
  }
  return ZCK_OK;
}

// ---- strided pieces

/* Strided piece a against the positions [x0, x1) of the param, which the other side maps
 * contiguously: from element b_at of its store b_store on. The elements of a in that range
 * are one stretch of its own (they lie in increasing order): a partial first run, then
 * whole runs, the last maybe partial; at most two extents. */
static zck_status meet_runs_range(const zck_piece *a, bool a_is_src, uint64_t x0, uint64_t x1, uint32_t b_store,
                                  uint64_t b_at, uint32_t p, ext_vec *ev, uint64_t *covered) {
  uint64_t k0 = zck_runs_before(a->param_off, a->count, a->run, a->stride, x0),
           k1 = zck_runs_before(a->param_off, a->count, a->run, a->stride, x1);
  *covered += k1 - k0;
  for (uint64_t k = k0; k < k1;) {
    uint64_t end = k % a->run ? (k / a->run + 1) * a->run : k1;   /* a partial first run alone */
    if (end > k1) end = k1;
    uint64_t n = end - k, run = n > a->run ? a->run : 0;
    uint64_t a_off = a->store_off + k, b_off = b_at + (zck_runs_at(a->param_off, a->run, a->stride, k) - x0);
    zck_extent e = a_is_src ? (zck_extent){a->store, b_store, p, a_off, b_off, n, run, run ? a->run : 0, run ? a->stride : 0}
                            : (zck_extent){b_store, a->store, p, b_off, a_off, n, run, run ? a->stride : 0, run ? a->run : 0};
    ZCK_TRY(ext_push(ev, &e));
    k = end;
  }
  return ZCK_OK;
}

/* Source piece s against target piece d of param p: the extents of their common elements,
 * counted into *covered. */
static zck_status meet_pieces(const zck_piece *s, const zck_piece *d, uint32_t p, ext_vec *ev, uint64_t *covered) {
  if (!s->run && !d->run) {
    uint64_t lo = s->param_off > d->param_off ? s->param_off : d->param_off;
    uint64_t hi = s->param_off + s->count < d->param_off + d->count ? s->param_off + s->count : d->param_off + d->count;
    if (lo >= hi) return ZCK_OK;
    *covered += hi - lo;
    zck_extent e = {s->store, d->store, p, s->store_off + (lo - s->param_off), d->store_off + (lo - d->param_off), hi - lo,
                    0, 0, 0};
    return ext_push(ev, &e);
  }
  if (!d->run) return meet_runs_range(s, true, d->param_off, d->param_off + d->count, d->store, d->store_off, p, ev, covered);
  if (!s->run) return meet_runs_range(d, false, s->param_off, s->param_off + s->count, s->store, s->store_off, p, ev, covered);
  /* both strided (blocks of two different grids): the runs of the one with fewer, each a
   * contiguous piece of its own */
  bool by_src = zck_runs_n(s->count, s->run) <= zck_runs_n(d->count, d->run);
  const zck_piece *w = by_src ? s : d;
  for (uint64_t k = 0; k < w->count; k += w->run) {
    zck_piece r = {w->param, w->store, zck_runs_at(w->param_off, w->run, w->stride, k), w->store_off + k,
                   w->count - k < w->run ? w->count - k : w->run, 0, 0};
    ZCK_TRY(meet_pieces(by_src ? &r : s, by_src ? d : &r, p, ev, covered));
  }
  return ZCK_OK;
}

static bool param_strided(const zck_layout *l, uint32_t p) {
  for (size_t i = l->param_first[p]; i < l->param_first[p + 1]; i++)
    if (l->pieces[i].run) return true;
  return false;
}

static uint64_t piece_end(const zck_piece *c) { return zck_runs_end(c->param_off, c->count, c->run, c->stride); }

/* A param with strided pieces on either side: every target piece against the source pieces
 * whose spans meet its span (spans of strided pieces interleave, so the sweep of
 * intersect_param does not apply; a running maximum of the source spans' ends finds the
 * first candidate). The source pieces are disjoint (zck_layout_custom), so a target piece
 * is covered when the elements met add up to its count. */
static zck_status intersect_param_strided(const zck_layout *src, const zck_layout *dst, uint32_t p,
                                          const zck_plan_opts *o, ext_vec *ev) {
  size_t si = src->param_first[p], n = src->param_first[p + 1] - si;
  uint64_t *reach = zck__malloc((n ? n : 1) * sizeof *reach);   /* max span end of pieces [0, i] */
  if (!reach) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < n; i++) {
    uint64_t e = piece_end(&src->pieces[si + i]);
    reach[i] = i && reach[i - 1] > e ? reach[i - 1] : e;
  }
  zck_status st = ZCK_OK;
  for (size_t di = dst->param_first[p]; st == ZCK_OK && di < dst->param_first[p + 1]; di++) {
    const zck_piece *d = &dst->pieces[di];
    uint64_t d0 = d->param_off, d1 = piece_end(d), covered = 0;
    size_t lo = 0, hi = n;
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (reach[mid] > d0) hi = mid;
      else lo = mid + 1;
    }
    for (size_t i = lo; st == ZCK_OK && i < n && src->pieces[si + i].param_off < d1; i++)
      if (piece_end(&src->pieces[si + i]) > d0) st = meet_pieces(&src->pieces[si + i], d, p, ev, &covered);
    if (st == ZCK_OK && covered != d->count && !o->allow_missing) {
      char buf[512];
      st = zck__fail(ZCK_ERR_MISMATCH, "%s: %llu of the %llu elements mapped from element %llu on are in no source store",
                     param_label(o, p, buf, sizeof buf), (unsigned long long)(d->count - covered),
                     (unsigned long long)d->count, (unsigned long long)d0);
    }
  }
  free(reach);
  return st;
}

zck_status zck_plan_build(const zck_layout *src, const zck_layout *dst, const zck_plan_opts *opts, zck_plan **out) {
  static const zck_plan_opts defaults = ZCK_PLAN_OPTS_INIT;
  const zck_plan_opts *o = opts ? opts : &defaults;
  *out = NULL;
  ZCK_FAIL_IF(src->n_params != dst->n_params, ZCK_ERR_MISMATCH,
              "copy plan: the source describes %zu parameters, the target %zu", src->n_params, dst->n_params);
  ext_vec ev = {0};
  zck_status s = ZCK_OK;
  for (size_t p = 0; p < dst->n_params && s == ZCK_OK; p++) {
    if (dst->param_first[p] == dst->param_first[p + 1]) continue;
    if (src->param_numel[p] != dst->param_numel[p]) {
      char buf[512];
      s = zck__fail(ZCK_ERR_MISMATCH, "%s: the source has %llu elements, the target %llu",
                    param_label(o, (uint32_t)p, buf, sizeof buf), (unsigned long long)src->param_numel[p],
                    (unsigned long long)dst->param_numel[p]);
      break;
    }
    if (param_strided(src, (uint32_t)p) || param_strided(dst, (uint32_t)p))
      s = intersect_param_strided(src, dst, (uint32_t)p, o, &ev);
    else
      s = intersect_param(src, dst, (uint32_t)p, o, &ev);
  }
  zck_plan *p = NULL;
  if (s == ZCK_OK && !(p = plan_alloc(src->n_stores, dst->n_stores))) s = ZCK_ERR_NO_MEMORY;
  if (s != ZCK_OK) {
    free(ev.v);
    return s;
  }
  p->ext = ev.v;
  p->n = ev.n;
  for (size_t i = 0; i < p->n; i++) p->total += p->ext[i].count;
  zck_plan_normalize(p, o->order, o->merge);
  s = zck_plan_split(p, o->max_chunk);
  if (s != ZCK_OK) {
    zck_plan_free(p);
    return s;
  }
  zck_extent *fit = p->n ? realloc(p->ext, p->n * sizeof *p->ext) : NULL; /* the doubling's slack, merged extents */
  if (fit) p->ext = fit;
  *out = p;
  return ZCK_OK;
}

/* b_k = floor(total * k / parts) without overflow. */
static uint64_t boundary(uint64_t total, uint32_t k, uint32_t parts) {
  return (uint64_t)((unsigned __int128)total * k / parts);
}

zck_status zck_plan_slice(const zck_plan *p, uint32_t index, uint32_t parts, zck_plan **out) {
  *out = NULL;
  ZCK_FAIL_IF(parts < 1 || index >= parts, ZCK_ERR_INVALID_ARG, "copy plan: part %u of %u", index, parts);
  zck_plan *all;
  ZCK_TRY(zck_plan_from_extents(p->ext, p->n, p->n_src_stores, p->n_dst_stores, &all));
  zck_plan_normalize(all, ZCK_PLAN_BY_DST, false);
  uint64_t lo = boundary(p->total, index, parts), hi = boundary(p->total, index + 1, parts), pos = 0;
  size_t k = 0;
  all->total = 0;
  for (size_t i = 0; i < all->n; i++) {
    /* an extent belongs to the part its first element falls in */
    if (pos >= lo && pos < hi) {
      all->ext[k++] = all->ext[i];
      all->total += all->ext[i].count;
    }
    pos += all->ext[i].count;
  }
  all->n = k;
  zck_plan_normalize(all, ZCK_PLAN_BY_SRC, false);
  *out = all;
  return ZCK_OK;
}
