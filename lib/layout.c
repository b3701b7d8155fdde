/* layout.c: ZeRO partition math and the piece tables of layouts (see layout.h for the
 * rules, deepspeed-checkpoint.md §3 for where they come from). */
#include "layout.h"

#include "model.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* Element counts beyond this are rejected, so sums of a few of them never overflow. */
#define ZCK__LAYOUT_MAX_NUMEL ((uint64_t)1 << 62)
/* World sizes beyond this are surely corrupt (and would make huge piece tables). */
#define ZCK__LAYOUT_MAX_WORLD ((uint32_t)1 << 20)

// ---- scalar math

uint64_t zck_zero12_aligned(uint64_t n, uint32_t w) {
  ZCK_ASSERT(w >= 1 && n < ZCK__LAYOUT_MAX_NUMEL);
  return zck__align_up(n, 2 * (uint64_t)w);
}

uint64_t zck_zero12_partition(uint64_t n, uint32_t w) { return zck_zero12_aligned(n, w) / w; }

uint64_t zck_zero12_lean(uint64_t n, uint32_t w, uint32_t r) {
  uint64_t p = zck_zero12_partition(n, w), lo = (uint64_t)r * p;
  if (n <= lo) return 0;
  return n - lo < p ? n - lo : p;
}

uint64_t zck_zero12_padding(uint64_t n, uint32_t w, uint32_t r) {
  return zck_zero12_partition(n, w) - zck_zero12_lean(n, w, r);
}

uint64_t zck_zero12_bf16_padding(uint64_t n, uint32_t w, uint32_t r) {
  return r + 1 == w ? zck_zero12_aligned(n, w) - n : 0;
}

uint64_t zck_zero3_partition(uint64_t n, uint32_t w) {
  ZCK_ASSERT(w >= 1 && n < ZCK__LAYOUT_MAX_NUMEL);
  return zck__ceil_div(n, w);
}

uint64_t zck_zero3_padding(uint64_t n, uint32_t w) { return zck_zero3_partition(n, w) * w - n; }

uint64_t zck_zero3_keep(uint64_t n, uint32_t w, uint32_t r) {
  uint64_t p = zck_zero3_partition(n, w), lo = (uint64_t)r * p;
  if (n <= lo) return 0;
  return n - lo < p ? n - lo : p;
}

void zck_round_robin_order(const uint32_t *in, size_t n, uint32_t w, uint32_t *out) {
  ZCK_ASSERT(w >= 1 && in != out);
  size_t k = 0;
  for (uint32_t j = 0; j < w && (size_t)j < n; j++)
    for (size_t i = j; i < n; i += w) out[k++] = in[i];
}

// ---- building blocks

typedef struct piece_vec {
  zck_piece *v;
  size_t n, cap;
} piece_vec;

static zck_status piece_push(piece_vec *pv, uint32_t param, uint32_t store, uint64_t param_off, uint64_t store_off,
                             uint64_t count) {
  if (!count) return ZCK_OK;
  if (!ZCK__GROW(pv->v, pv->cap, pv->n + 1)) return ZCK_ERR_NO_MEMORY;
  pv->v[pv->n++] = (zck_piece){param, store, param_off, store_off, count, 0, 0};
  return ZCK_OK;
}

/* A piece as given, strided or not (one run: contiguous, run 0). */
static zck_status piece_push_piece(piece_vec *pv, const zck_piece *p) {
  if (!p->count) return ZCK_OK;
  if (!ZCK__GROW(pv->v, pv->cap, pv->n + 1)) return ZCK_ERR_NO_MEMORY;
  zck_piece *q = &pv->v[pv->n++];
  *q = *p;
  if (q->run >= q->count) q->run = q->stride = 0;
  return ZCK_OK;
}

static zck_layout *layout_alloc(zck_layout_kind kind, size_t n_params, const uint64_t *numel, size_t n_stores,
                                size_t n_groups) {
  zck_layout *l = zck__calloc(1, sizeof *l);
  if (!l) return NULL;
  l->kind = kind;
  l->world = 1;
  l->n_params = n_params;
  l->n_stores = n_stores;
  l->n_groups = n_groups;
  l->param_numel = zck__calloc(n_params ? n_params : 1, sizeof *l->param_numel);
  l->stores = zck__calloc(n_stores ? n_stores : 1, sizeof *l->stores);
  l->groups = n_groups ? zck__calloc(n_groups, sizeof *l->groups) : NULL;
  if (!l->param_numel || !l->stores || (n_groups && !l->groups)) {
    zck_layout_free(l);
    return NULL;
  }
  if (n_params) memcpy(l->param_numel, numel, n_params * sizeof *numel);
  return l;
}

void zck_layout_free(zck_layout *l) {
  if (!l) return;
  for (size_t g = 0; g < l->n_groups; g++) {
    free(l->groups[g].params);
    free(l->groups[g].offsets);
  }
  free(l->groups);
  free(l->param_numel);
  free(l->param_first);
  free(l->pieces);
  free(l->stores);
  free(l->store_first);
  free(l->by_store);
  free(l);
}

static int cmp_piece_param(const void *a, const void *b) {
  const zck_piece *x = a, *y = b;
  if (x->param != y->param) return x->param < y->param ? -1 : 1;
  if (x->param_off != y->param_off) return x->param_off < y->param_off ? -1 : 1;
  return 0;
}

/* qsort_r, not a global, since ranks running as threads build layouts concurrently. */
static int cmp_piece_store(const void *a, const void *b, void *ctx) {
  const zck_piece *pieces = ctx;
  const zck_piece *x = &pieces[*(const uint32_t *)a], *y = &pieces[*(const uint32_t *)b];
  if (x->store != y->store) return x->store < y->store ? -1 : 1;
  if (x->store_off != y->store_off) return x->store_off < y->store_off ? -1 : 1;
  return 0;
}

// ---- overlaps of strided pieces

/* Do the elements of piece a (strided or not) meet the positions [x0, x1)? */
static bool runs_meet_range(const zck_piece *a, uint64_t x0, uint64_t x1) {
  return zck_runs_before(a->param_off, a->count, a->run, a->stride, x1) >
         zck_runs_before(a->param_off, a->count, a->run, a->stride, x0);
}

/* The whole runs of a strided piece (its short last run apart): n runs. */
static uint64_t full_runs(const zck_piece *a) { return a->count / a->run; }

/* Two strided pieces of one stride s, their whole runs only, a->param_off <= b->param_off:
 * with b's start q rows and r elements after a's, b's run j meets a's run j + q when
 * r < a->run, and a's run j + q + 1 when r + b->run > s. */
static bool full_runs_meet(const zck_piece *a, const zck_piece *b) {
  uint64_t s = a->stride, d = b->param_off - a->param_off, q = d / s, r = d % s;
  uint64_t na = full_runs(a), nb = full_runs(b);
  if (r < a->run && q < na && nb > 0) return true;
  return r + b->run > s && q + 1 < na && nb > 0;
}

/* Budget of run comparisons for pieces of different strides, whose runs are walked. */
#define ZCK__LAYOUT_OVERLAP_BUDGET ((uint64_t)1 << 27)

/* Do two pieces of one param share an element? a->param_off <= b->param_off. */
static zck_status pieces_meet(const zck_piece *a, const zck_piece *b, uint64_t *budget, bool *meet) {
  if (!a->run || !b->run) {
    const zck_piece *c = a->run ? b : a, *o = a->run ? a : b;   /* c contiguous */
    *meet = runs_meet_range(o, c->param_off, c->param_off + c->count);
    return ZCK_OK;
  }
  if (a->stride == b->stride) {
    /* whole runs against whole runs, then each short last run (a range) against the other */
    *meet = full_runs_meet(a, b);
    uint64_t ta = full_runs(a) * a->run, tb = full_runs(b) * b->run;
    if (!*meet && ta < a->count) {
      uint64_t at = zck_runs_at(a->param_off, a->run, a->stride, ta);
      *meet = runs_meet_range(b, at, at + a->count - ta);
    }
    if (!*meet && tb < b->count) {
      uint64_t at = zck_runs_at(b->param_off, b->run, b->stride, tb);
      *meet = runs_meet_range(a, at, at + b->count - tb);
    }
    return ZCK_OK;
  }
  /* different strides (blocks cut at different dimensions): the fewer runs, one by one */
  const zck_piece *w = zck_runs_n(a->count, a->run) <= zck_runs_n(b->count, b->run) ? a : b, *o = w == a ? b : a;
  *meet = false;
  for (uint64_t k = 0; k < w->count && !*meet; k += w->run) {
    if (!(*budget)--) return ZCK_ERR_LIMIT;
    uint64_t at = zck_runs_at(w->param_off, w->run, w->stride, k), n = w->count - k < w->run ? w->count - k : w->run;
    *meet = runs_meet_range(o, at, at + n);
  }
  return ZCK_OK;
}

/* Pieces sorted by (param, param_off): each compared with the later pieces that start
 * inside its span; contiguous pieces alone cost one comparison each, as a sorted list
 * needs; a dp x tp grid of strided blocks costs tp comparisons a block. */
static zck_status check_overlaps(const zck_layout *l, const char *what) {
  uint64_t budget = ZCK__LAYOUT_OVERLAP_BUDGET;
  for (size_t i = 0; i < l->n_pieces; i++) {
    const zck_piece *a = &l->pieces[i];
    uint64_t end = zck_runs_end(a->param_off, a->count, a->run, a->stride);
    for (size_t k = i + 1; k < l->n_pieces && l->pieces[k].param == a->param && l->pieces[k].param_off < end; k++) {
      bool meet;
      ZCK_FAIL_IF(!budget--, ZCK_ERR_LIMIT, "%s: parameter %u: too many pieces across one span to check", what,
                  a->param);
      zck_status s = pieces_meet(a, &l->pieces[k], &budget, &meet);
      ZCK_FAIL_IF(s != ZCK_OK, ZCK_ERR_LIMIT, "%s: parameter %u: too many strided runs to check", what, a->param);
      ZCK_FAIL_IF(meet, ZCK_ERR_FORMAT, "%s: parameter %u: element %llu is mapped twice", what, a->param,
                  (unsigned long long)l->pieces[k].param_off);
    }
  }
  return ZCK_OK;
}

static const char *kind_name(zck_layout_kind k) {
  switch (k) {
  case ZCK_LAYOUT_WHOLE: return "whole-tensor layout";
  case ZCK_LAYOUT_FLAT: return "flat-group layout";
  case ZCK_LAYOUT_ZERO12: return "ZeRO-1/2 layout";
  case ZCK_LAYOUT_ZERO3: return "ZeRO-3 layout";
  default: return "layout";
  }
}

/* Takes ownership of pv, sorts it, builds both indexes and checks every piece. */
static zck_status layout_finish(zck_layout *l, piece_vec *pv) {
  l->pieces = pv->v;
  l->n_pieces = pv->n;
  pv->v = NULL;
  pv->n = pv->cap = 0;
  const char *what = kind_name(l->kind);
  ZCK_FAIL_IF(l->n_pieces >= UINT32_MAX, ZCK_ERR_LIMIT, "%s: %zu pieces, too many", what, l->n_pieces);
  for (size_t i = 0; i < l->n_pieces; i++) {
    const zck_piece *p = &l->pieces[i];
    uint64_t pe, se;
    ZCK_FAIL_IF(p->param >= l->n_params, ZCK_ERR_FORMAT, "%s: piece %zu names parameter %u of %zu", what, i,
                p->param, l->n_params);
    ZCK_FAIL_IF(p->store >= l->n_stores, ZCK_ERR_FORMAT, "%s: piece %zu names store %u of %zu", what, i, p->store,
                l->n_stores);
    ZCK_FAIL_IF(p->run && p->stride < p->run, ZCK_ERR_FORMAT,
                "%s: parameter %u: runs of %llu elements %llu apart overlap", what, p->param,
                (unsigned long long)p->run, (unsigned long long)p->stride);
    uint64_t span = p->count, last;   /* from the first element to one past the last */
    if (p->run) {
      uint64_t runs = zck_runs_n(p->count, p->run);
      last = p->count - (runs - 1) * p->run;
      ZCK_FAIL_IF(!zck__mul_u64(runs - 1, p->stride, &span) || !zck__add_u64(span, last, &span), ZCK_ERR_FORMAT,
                  "%s: parameter %u: runs past any tensor", what, p->param);
    }
    ZCK_FAIL_IF(!zck__add_u64(p->param_off, span, &pe) || pe > l->param_numel[p->param], ZCK_ERR_FORMAT,
                "%s: parameter %u: elements [%llu, %llu) lie past its %llu elements", what, p->param,
                (unsigned long long)p->param_off, (unsigned long long)(p->param_off + span),
                (unsigned long long)l->param_numel[p->param]);
    ZCK_FAIL_IF(!zck__add_u64(p->store_off, p->count, &se) || se > l->stores[p->store].numel, ZCK_ERR_FORMAT,
                "%s: parameter %u: store %u elements [%llu, %llu) lie past its %llu elements", what, p->param,
                p->store, (unsigned long long)p->store_off, (unsigned long long)(p->store_off + p->count),
                (unsigned long long)l->stores[p->store].numel);
  }
  /* builders add pieces in param order (sorting is for the others): checked first, since a
   * 100k-param layout is sorted many times a job */
  bool in_order = true;
  for (size_t i = 1; in_order && i < l->n_pieces; i++) in_order = cmp_piece_param(&l->pieces[i - 1], &l->pieces[i]) <= 0;
  if (!in_order) qsort(l->pieces, l->n_pieces, sizeof *l->pieces, cmp_piece_param);
  l->param_first = zck__calloc(l->n_params + 1, sizeof *l->param_first);
  l->store_first = zck__calloc(l->n_stores + 1, sizeof *l->store_first);
  l->by_store = zck__malloc((l->n_pieces ? l->n_pieces : 1) * sizeof *l->by_store);
  if (!l->param_first || !l->store_first || !l->by_store) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(check_overlaps(l, what));
  for (size_t i = 0; i < l->n_pieces; i++) {
    const zck_piece *p = &l->pieces[i];
    l->param_first[p->param + 1]++;
    l->store_first[p->store + 1]++;
  }
  for (size_t i = 0; i < l->n_params; i++) l->param_first[i + 1] += l->param_first[i];
  for (size_t i = 0; i < l->n_stores; i++) l->store_first[i + 1] += l->store_first[i];
  /* by store: counted into each store's range in piece order (stable, as the sort is), which
   * is already by offset when each store is filled in param order; else sorted */
  size_t *next = zck__malloc((l->n_stores + 1) * sizeof *next);
  if (!next) return ZCK_ERR_NO_MEMORY;
  memcpy(next, l->store_first, (l->n_stores + 1) * sizeof *next);
  for (size_t i = 0; i < l->n_pieces; i++) l->by_store[next[l->pieces[i].store]++] = (uint32_t)i;
  free(next);
  in_order = true;
  for (size_t i = 1; in_order && i < l->n_pieces; i++)
    in_order = cmp_piece_store(&l->by_store[i - 1], &l->by_store[i], l->pieces) <= 0;
  if (!in_order) {
    for (size_t i = 0; i < l->n_pieces; i++) l->by_store[i] = (uint32_t)i;
    qsort_r(l->by_store, l->n_pieces, sizeof *l->by_store, cmp_piece_store, l->pieces);
  }
  return ZCK_OK;
}

/* Every builder's end: the layout finished from its pieces and handed out when the build
 * went well (s), else freed with them; returns how it went. */
static zck_status layout_hand_out(zck_layout *l, piece_vec *pv, zck_status s, zck_layout **out) {
  if (s == ZCK_OK) s = layout_finish(l, pv);
  free(pv->v);
  if (s != ZCK_OK) {
    zck_layout_free(l);
    return s;
  }
  *out = l;
  return ZCK_OK;
}

/* Checks group membership: indices in range, no param in two groups or twice in one. */
static zck_status check_groups(const char *what, size_t n_params, const zck_group_spec *groups, size_t n_groups) {
  uint8_t *seen = zck__calloc(n_params ? n_params : 1, 1);
  if (!seen) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  for (size_t g = 0; g < n_groups && s == ZCK_OK; g++)
    for (size_t i = 0; i < groups[g].n_params; i++) {
      uint32_t p = groups[g].params[i];
      if (p >= n_params) {
        s = zck__fail(ZCK_ERR_INVALID_ARG, "%s: group %zu names parameter %u of %zu", what, g, p, n_params);
        break;
      }
      if (seen[p]) {
        s = zck__fail(ZCK_ERR_INVALID_ARG, "%s: parameter %u is listed twice", what, p);
        break;
      }
      seen[p] = 1;
    }
  free(seen);
  return s;
}

static zck_status check_numels(const char *what, size_t n_params, const uint64_t *numel) {
  for (size_t i = 0; i < n_params; i++)
    ZCK_FAIL_IF(numel[i] > ZCK__LAYOUT_MAX_NUMEL, ZCK_ERR_LIMIT, "%s: parameter %zu has %llu elements, too many",
                what, i, (unsigned long long)numel[i]);
  return ZCK_OK;
}

/* Copies a group spec into a layout group (offsets filled by the caller). */
static zck_status group_copy(zck_layout_group *dst, const zck_group_spec *src) {
  size_t n = src->n_params ? src->n_params : 1;
  dst->params = zck__malloc(n * sizeof *dst->params);
  dst->offsets = zck__calloc(n, sizeof *dst->offsets);
  if (!dst->params || !dst->offsets) return ZCK_ERR_NO_MEMORY;
  if (src->n_params) memcpy(dst->params, src->params, src->n_params * sizeof *dst->params);
  dst->n_params = src->n_params;
  dst->opt_group = src->opt_group;
  return ZCK_OK;
}

zck_status zck_layout_group_dup(zck_layout_group *to, const zck_layout_group *from) {
  *to = *from;
  size_t n = from->n_params ? from->n_params : 1;
  to->params = zck__malloc(n * sizeof *to->params);
  to->offsets = zck__calloc(n, sizeof *to->offsets);
  if (!to->params || !to->offsets) return ZCK_ERR_NO_MEMORY;
  if (from->n_params) {
    memcpy(to->params, from->params, from->n_params * sizeof *to->params);
    memcpy(to->offsets, from->offsets, from->n_params * sizeof *to->offsets);
  }
  return ZCK_OK;
}

/* Lays the params of a group end to end with inter-param alignment (none after the last,
 * as stage_1_and_2.py does); fills offsets and returns N. */
static zck_status flat_offsets(const char *what, size_t g, zck_layout_group *gr, const uint64_t *numel,
                               uint32_t param_align, uint64_t *total) {
  uint64_t off = 0;
  for (size_t i = 0; i < gr->n_params; i++) {
    gr->offsets[i] = off;
    off += numel[gr->params[i]];
    if (param_align > 1 && i + 1 < gr->n_params) off = zck__align_up(off, param_align);
    ZCK_FAIL_IF(off > ZCK__LAYOUT_MAX_NUMEL, ZCK_ERR_LIMIT, "%s: group %zu has too many elements", what, g);
  }
  *total = off;
  return ZCK_OK;
}

// ---- ZeRO 1/2

zck_status zck_layout_zero12(size_t n_params, const uint64_t *numel, const zck_group_spec *groups, size_t n_groups,
                             uint32_t world, uint32_t param_align, zck_layout **out) {
  const char *what = "ZeRO-1/2 layout";
  *out = NULL;
  ZCK_FAIL_IF(world < 1 || world > ZCK__LAYOUT_MAX_WORLD, ZCK_ERR_INVALID_ARG, "%s: world size %u", what, world);
  ZCK_FAIL_IF(n_groups > UINT32_MAX / world, ZCK_ERR_LIMIT, "%s: %zu groups x %u ranks, too many", what, n_groups,
              world);
  ZCK_TRY(check_numels(what, n_params, numel));
  ZCK_TRY(check_groups(what, n_params, groups, n_groups));
  zck_layout *l = layout_alloc(ZCK_LAYOUT_ZERO12, n_params, numel, n_groups * world, n_groups);
  if (!l) return ZCK_ERR_NO_MEMORY;
  l->world = world;
  piece_vec pv = {0};
  zck_status s = ZCK_OK;
  for (size_t g = 0; g < n_groups && s == ZCK_OK; g++) {
    zck_layout_group *gr = &l->groups[g];
    ZCK_CHECK_GOTO(group_copy(gr, &groups[g]), s, done);
    ZCK_CHECK_GOTO(flat_offsets(what, g, gr, numel, param_align, &gr->numel), s, done);
    gr->aligned = zck_zero12_aligned(gr->numel, world);
    uint64_t P = gr->partition = gr->aligned / world;
    for (uint32_t r = 0; r < world; r++) {
      zck_layout_store *st = &l->stores[g * world + r];
      *st = (zck_layout_store){(int32_t)r, (int32_t)g, -1, P, zck_zero12_lean(gr->numel, world, r)};
    }
    for (size_t i = 0; i < gr->n_params && s == ZCK_OK; i++) {
      uint32_t p = gr->params[i];
      uint64_t o = gr->offsets[i], end = o + numel[p];
      while (o < end && s == ZCK_OK) {
        uint64_t r = o / P, rend = (r + 1) * P;
        uint64_t c = (end < rend ? end : rend) - o;
        s = piece_push(&pv, p, (uint32_t)(g * world + r), o - gr->offsets[i], o - r * P, c);
        o += c;
      }
    }
  }
done:
  return layout_hand_out(l, &pv, s, out);
}

// ---- ZeRO 3

zck_status zck_zero3_sub_groups(const uint64_t *numel, const zck_group_spec *groups, size_t n_groups, uint32_t world,
                                uint64_t sub_group_size, zck_group_spec **out, size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  ZCK_FAIL_IF(world < 1 || world > ZCK__LAYOUT_MAX_WORLD, ZCK_ERR_INVALID_ARG, "ZeRO-3 sub-groups: world size %u",
              world);
  /* First pass: count sub-groups and params; second: fill one block. */
  size_t n_sub = 0, n_idx = 0;
  for (int pass = 0; pass < 2; pass++) {
    zck_group_spec *specs = *out;
    uint32_t *idx = specs ? (uint32_t *)(specs + n_sub) : NULL;
    size_t k = 0, j = 0;
    for (size_t g = 0; g < n_groups; g++) {
      const zck_group_spec *gs = &groups[g];
      if (!gs->n_params) continue;
      uint64_t total = 0;
      for (size_t i = 0; i < gs->n_params; i++) {
        ZCK_FAIL_IF(numel[gs->params[i]] > ZCK__LAYOUT_MAX_NUMEL, ZCK_ERR_LIMIT,
                    "ZeRO-3 sub-groups: parameter %u has too many elements", gs->params[i]);
        total += zck_zero3_partition(numel[gs->params[i]], world);
      }
      size_t start = j;
      uint64_t run = 0;
      for (size_t i = 0; i < gs->n_params; i++) {
        if (idx) idx[j] = gs->params[i];
        j++;
        run += zck_zero3_partition(numel[gs->params[i]], world);
        bool last = i + 1 == gs->n_params;
        if (last || (sub_group_size < total && run >= sub_group_size)) {
          if (specs) specs[k] = (zck_group_spec){idx + start, j - start, (int32_t)g};
          k++;
          start = j;
          run = 0;
        }
      }
    }
    if (!pass) {
      n_sub = k;
      n_idx = j;
      *out = zck__malloc((n_sub ? n_sub : 1) * sizeof **out + (n_idx ? n_idx : 1) * sizeof(uint32_t));
      if (!*out) return ZCK_ERR_NO_MEMORY;
    }
  }
  *n_out = n_sub;
  return ZCK_OK;
}

zck_status zck_layout_zero3(size_t n_params, const uint64_t *numel, const zck_group_spec *sub_groups,
                            size_t n_sub_groups, uint32_t world, zck_layout **out) {
  const char *what = "ZeRO-3 layout";
  *out = NULL;
  ZCK_FAIL_IF(world < 1 || world > ZCK__LAYOUT_MAX_WORLD, ZCK_ERR_INVALID_ARG, "%s: world size %u", what, world);
  ZCK_FAIL_IF(n_sub_groups > UINT32_MAX / world, ZCK_ERR_LIMIT, "%s: %zu sub-groups x %u ranks, too many", what,
              n_sub_groups, world);
  ZCK_TRY(check_numels(what, n_params, numel));
  ZCK_TRY(check_groups(what, n_params, sub_groups, n_sub_groups));
  zck_layout *l = layout_alloc(ZCK_LAYOUT_ZERO3, n_params, numel, n_sub_groups * world, n_sub_groups);
  if (!l) return ZCK_ERR_NO_MEMORY;
  l->world = world;
  piece_vec pv = {0};
  zck_status s = ZCK_OK;
  for (size_t g = 0; g < n_sub_groups && s == ZCK_OK; g++) {
    zck_layout_group *gr = &l->groups[g];
    ZCK_CHECK_GOTO(group_copy(gr, &sub_groups[g]), s, done);
    uint64_t off = 0;
    for (size_t i = 0; i < gr->n_params && s == ZCK_OK; i++) {
      uint32_t p = gr->params[i];
      uint64_t part = zck_zero3_partition(numel[p], world);
      gr->offsets[i] = off;
      for (uint32_t r = 0; r < world && s == ZCK_OK; r++)
        s = piece_push(&pv, p, (uint32_t)(g * world + r), (uint64_t)r * part, off, zck_zero3_keep(numel[p], world, r));
      off += part;
      if (off > ZCK__LAYOUT_MAX_NUMEL) s = zck__fail(ZCK_ERR_LIMIT, "%s: sub-group %zu has too many elements", what, g);
    }
    gr->numel = gr->partition = off;
    gr->aligned = off * world;
    for (uint32_t r = 0; r < world; r++)
      l->stores[g * world + r] = (zck_layout_store){(int32_t)r, (int32_t)g, -1, off, off};
  }
done:
  return layout_hand_out(l, &pv, s, out);
}

// ---- whole tensors, flat groups, custom

zck_status zck_layout_whole(size_t n_params, const uint64_t *numel, const uint32_t *params, size_t n,
                            zck_layout **out) {
  const char *what = "whole-tensor layout";
  *out = NULL;
  if (!params) n = n_params;
  ZCK_FAIL_IF(n >= UINT32_MAX, ZCK_ERR_LIMIT, "%s: %zu tensors, too many", what, n);
  ZCK_TRY(check_numels(what, n_params, numel));
  if (params) {
    zck_group_spec one = {params, n, -1};
    ZCK_TRY(check_groups(what, n_params, &one, 1));
  }
  zck_layout *l = layout_alloc(ZCK_LAYOUT_WHOLE, n_params, numel, n, 0);
  if (!l) return ZCK_ERR_NO_MEMORY;
  piece_vec pv = {0};
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < n && s == ZCK_OK; i++) {
    uint32_t p = params ? params[i] : (uint32_t)i;
    l->stores[i] = (zck_layout_store){-1, -1, (int32_t)p, numel[p], numel[p]};
    s = piece_push(&pv, p, (uint32_t)i, 0, 0, numel[p]);
  }
  return layout_hand_out(l, &pv, s, out);
}

zck_status zck_layout_flat(size_t n_params, const uint64_t *numel, const zck_group_spec *groups, size_t n_groups,
                           uint64_t align, uint32_t param_align, zck_layout **out) {
  const char *what = "flat-group layout";
  *out = NULL;
  ZCK_FAIL_IF(n_groups >= UINT32_MAX, ZCK_ERR_LIMIT, "%s: %zu groups, too many", what, n_groups);
  ZCK_FAIL_IF(align > ((uint64_t)1 << 32), ZCK_ERR_INVALID_ARG, "%s: alignment %llu", what, (unsigned long long)align);
  ZCK_TRY(check_numels(what, n_params, numel));
  ZCK_TRY(check_groups(what, n_params, groups, n_groups));
  zck_layout *l = layout_alloc(ZCK_LAYOUT_FLAT, n_params, numel, n_groups, n_groups);
  if (!l) return ZCK_ERR_NO_MEMORY;
  piece_vec pv = {0};
  zck_status s = ZCK_OK;
  for (size_t g = 0; g < n_groups && s == ZCK_OK; g++) {
    zck_layout_group *gr = &l->groups[g];
    ZCK_CHECK_GOTO(group_copy(gr, &groups[g]), s, done);
    ZCK_CHECK_GOTO(flat_offsets(what, g, gr, numel, param_align, &gr->numel), s, done);
    gr->aligned = gr->partition = align > 1 ? zck__align_up(gr->numel, align) : gr->numel;
    l->stores[g] = (zck_layout_store){-1, (int32_t)g, -1, gr->aligned, gr->aligned};
    for (size_t i = 0; i < gr->n_params && s == ZCK_OK; i++)
      s = piece_push(&pv, gr->params[i], (uint32_t)g, 0, gr->offsets[i], numel[gr->params[i]]);
  }
done:
  return layout_hand_out(l, &pv, s, out);
}

zck_status zck_layout_custom(size_t n_params, const uint64_t *numel, const zck_layout_store *stores, size_t n_stores,
                             const zck_piece *pieces, size_t n_pieces, zck_layout **out) {
  *out = NULL;
  ZCK_FAIL_IF(n_stores >= UINT32_MAX, ZCK_ERR_LIMIT, "layout: %zu stores, too many", n_stores);
  ZCK_TRY(check_numels("layout", n_params, numel));
  zck_layout *l = layout_alloc(ZCK_LAYOUT_CUSTOM, n_params, numel, n_stores, 0);
  if (!l) return ZCK_ERR_NO_MEMORY;
  if (n_stores) memcpy(l->stores, stores, n_stores * sizeof *stores);
  piece_vec pv = {0};
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < n_pieces && s == ZCK_OK; i++) s = piece_push_piece(&pv, &pieces[i]);
  return layout_hand_out(l, &pv, s, out);
}

zck_status zck_layout_restrict_rank(const zck_layout *src, int32_t rank, zck_layout **out) {
  *out = NULL;
  zck_layout *l = layout_alloc(src->kind, src->n_params, src->param_numel, src->n_stores, src->n_groups);
  if (!l) return ZCK_ERR_NO_MEMORY;
  l->world = src->world;
  if (src->n_stores) memcpy(l->stores, src->stores, src->n_stores * sizeof *src->stores);
  piece_vec pv = {0};
  zck_status s = ZCK_OK;
  for (size_t g = 0; g < src->n_groups && s == ZCK_OK; g++) {
    const zck_layout_group *sg = &src->groups[g];
    zck_group_spec spec = {sg->params, sg->n_params, sg->opt_group};
    s = group_copy(&l->groups[g], &spec);
    if (s != ZCK_OK) break;
    if (sg->n_params) memcpy(l->groups[g].offsets, sg->offsets, sg->n_params * sizeof *sg->offsets);
    l->groups[g].numel = sg->numel;
    l->groups[g].aligned = sg->aligned;
    l->groups[g].partition = sg->partition;
  }
  for (size_t i = 0; i < src->n_pieces && s == ZCK_OK; i++) {
    const zck_piece *p = &src->pieces[i];
    if (src->stores[p->store].rank == rank) s = piece_push_piece(&pv, p);
  }
  return layout_hand_out(l, &pv, s, out);
}

uint64_t zck_layout_param_covered(const zck_layout *l, uint32_t p) {
  uint64_t n = 0;
  if (p >= l->n_params) return 0;
  for (size_t i = l->param_first[p]; i < l->param_first[p + 1]; i++) n += l->pieces[i].count;
  return n;
}

zck_status zck_layout_model_groups(const zck_model *m, zck_group_spec **out, size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  size_t n_groups = 0, n_idx = 0;
  for (size_t g = 0; g < m->n_groups; g++) {
    size_t k = zck_model_group_trainable(m, (uint32_t)g, NULL, 0);
    n_groups += k > 0;
    n_idx += k;
  }
  zck_group_spec *specs = zck__malloc((n_groups ? n_groups : 1) * sizeof *specs + (n_idx ? n_idx : 1) * sizeof(uint32_t));
  if (!specs) return ZCK_ERR_NO_MEMORY;
  uint32_t *idx = (uint32_t *)(specs + n_groups);
  size_t k = 0, j = 0;
  for (size_t g = 0; g < m->n_groups; g++) {
    size_t c = zck_model_group_trainable(m, (uint32_t)g, idx + j, n_idx - j), kept = 0;
    for (size_t i = 0; i < c; i++) /* drop zero-element params in place */
      if (m->params[idx[j + i]].numel) idx[j + kept++] = idx[j + i];
    c = kept;
    if (!c) continue;
    specs[k++] = (zck_group_spec){idx + j, c, (int32_t)g};
    j += c;
  }
  *out = specs;
  *n_out = k; /* at most n_groups: zero-element params may empty a group */
  return ZCK_OK;
}

zck_status zck_layout_groups_to_model(zck_model *m, const uint32_t *flat, const size_t *flat_first, size_t n_flat,
                                      const int32_t *opt_of, bool round_robin, uint32_t world) {
  uint32_t *order = round_robin ? zck__calloc(flat_first[n_flat] + 1, sizeof *order) : NULL;
  if (round_robin && !order) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  for (size_t f = 0; s == ZCK_OK && f < n_flat; f++) {
    size_t a = flat_first[f], n = flat_first[f + 1] - a;
    const uint32_t *src = flat + a;
    if (round_robin) {
      /* the flat order F = RR(G) of group order G (zck_round_robin_order): G[i] = F[k] */
      size_t k = 0;
      for (uint32_t j = 0; j < world && (size_t)j < n; j++)
        for (size_t i = j; i < n; i += world) order[i] = src[k++];
      src = order;
    }
    for (size_t j = 0; s == ZCK_OK && j < n; j++) s = zck_model_group_add_param(m, (uint32_t)opt_of[f], src[j]);
  }
  free(order);
  return s;
}
