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
        a->dst_off + a->count == b->dst_off)
      a->count += b->count;
    else
      p->ext[++k] = *b;
  }
  p->n = k + 1;
}

zck_status zck_plan_split(zck_plan *p, uint64_t max_chunk) {
  if (!max_chunk) return ZCK_OK;
  size_t extra = 0;
  for (size_t i = 0; i < p->n; i++) {
    uint64_t parts = zck__ceil_div(p->ext[i].count, max_chunk);
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
      zck_extent e = {s->store, d->store, p, s->store_off + (pos - s->param_off), d->store_off + (pos - a), end - pos};
      ZCK_TRY(ext_push(ev, &e));
      pos = end;
      if (s_end <= pos) k++;
    }
  }
  return ZCK_OK;
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
