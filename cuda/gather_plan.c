/* gather_plan.c: the bucketing and ordering of the on-save 16-bit gather, and its host path.
 *
 * The GPU path (gather16.cu) and the host path below run the same plan, so the plan's
 * logic (sorting, merging, cutting into buckets, runs of contiguous output) is tested on
 * machines without a device, and the GPU path only has to convert and copy each bucket.
 * Output bytes reach the write callback in increasing offset order, one bucket after the
 * other, which is what a streaming file writer wants. The extents are planned, sorted and
 * merged by lib/plan, as every other copy's are; buckets are this file's own.
 */
#include "cuda_internal.h"
#include "zck_cuda.h"

#include "error.h"
#include "layout.h"
#include "plan.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

void zck_gather_plan_free(zck_gather_plan *p) {
  if (!p) return;
  free(p->src_dtype);
  free(p->src_numel);
  free(p->items);
  free(p->runs);
  free(p->buckets);
  free(p);
}

static int gather_src_dtype_ok(zck_dtype t) { return t == ZCK_F32 || t == ZCK_BF16; }

/* Grows a zck__calloc'd array to hold at least need elements. */
zck_status zck_gather_plan_build(const zck_gather_src *srcs, size_t n_srcs, const zck_gather_extent *extents,
                                 size_t n_extents, zck_dtype out_dtype, size_t bucket_bytes, zck_gather_plan **out) {
  *out = NULL;
  ZCK_FAIL_IF(out_dtype != ZCK_BF16 && out_dtype != ZCK_F32, ZCK_ERR_INVALID_ARG,
              "gather: output dtype %s; supported: bfloat16, float32", zck_dtype_name(out_dtype));
  size_t osz = zck_dtype_size(out_dtype);
  ZCK_FAIL_IF(bucket_bytes < osz, ZCK_ERR_INVALID_ARG, "gather: bucket of %zu bytes holds no %s element", bucket_bytes,
              zck_dtype_name(out_dtype));
  for (size_t i = 0; i < n_srcs; i++)
    ZCK_FAIL_IF(!gather_src_dtype_ok(srcs[i].dtype), ZCK_ERR_INVALID_ARG,
                "gather: source %zu is %s; supported: float32, bfloat16", i, zck_dtype_name(srcs[i].dtype));
  /* every extent within its source and the output index space */
  for (size_t i = 0; i < n_extents; i++) {
    const zck_gather_extent *e = &extents[i];
    ZCK_FAIL_IF(e->src >= n_srcs, ZCK_ERR_INVALID_ARG, "gather: extent %zu names source %u of %zu", i, e->src, n_srcs);
    uint64_t end;
    ZCK_FAIL_IF(__builtin_add_overflow(e->src_off, e->count, &end) || end > srcs[e->src].numel, ZCK_ERR_INVALID_ARG,
                "gather: extent %zu reads elements [%llu, %llu) of source %u, which holds %llu", i,
                (unsigned long long)e->src_off, (unsigned long long)(e->src_off + e->count), e->src,
                (unsigned long long)srcs[e->src].numel);
    ZCK_FAIL_IF(__builtin_add_overflow(e->dst_off, e->count, &end) || end > UINT64_MAX / osz, ZCK_ERR_INVALID_ARG,
                "gather: extent %zu writes past the end of the addressable output", i);
  }
  zck_gather_plan *p = zck__calloc(1, sizeof *p);
  zck_extent *ext = zck__calloc(n_extents ? n_extents : 1, sizeof *ext);
  if (!p || !ext) {
    free(p);
    free(ext);
    return ZCK_ERR_NO_MEMORY;
  }
  zck_status s = ZCK_OK;
  p->out_dtype = out_dtype;
  p->bucket_elems = bucket_bytes / osz;
  p->n_srcs = n_srcs;
  p->src_dtype = zck__calloc(n_srcs ? n_srcs : 1, sizeof *p->src_dtype);
  p->src_numel = zck__calloc(n_srcs ? n_srcs : 1, sizeof *p->src_numel);
  if (!p->src_dtype || !p->src_numel) {
    s = ZCK_ERR_NO_MEMORY;
    goto done;
  }
  for (size_t i = 0; i < n_srcs; i++) {
    p->src_dtype[i] = srcs[i].dtype;
    p->src_numel[i] = srcs[i].numel;
  }
  /* output order, adjacent ones merged: a copy plan into the one output store (plan.h's
   * sorting and merging); empty extents dropped, overlaps refused */
  zck_plan plan = {ext, 0, n_srcs, 1, 0};
  for (size_t i = 0; i < n_extents; i++)
    if (extents[i].count)
      ext[plan.n++] = (zck_extent){extents[i].src, 0, 0, extents[i].src_off, extents[i].dst_off, extents[i].count, 0, 0, 0};
  zck_plan_normalize(&plan, ZCK_PLAN_BY_DST, false);
  for (size_t i = 1; i < plan.n; i++)
    if (ext[i].dst_off < ext[i - 1].dst_off + ext[i - 1].count) {
      s = zck__fail(ZCK_ERR_INVALID_ARG, "gather: extents overlap in the output at element %llu",
                    (unsigned long long)ext[i].dst_off);
      goto done;
    }
  zck_plan_normalize(&plan, ZCK_PLAN_BY_DST, true);
  /* cut into buckets */
  size_t cap_items = 0, cap_runs = 0, cap_buckets = 0;
  zck_gather_bucket *cur = NULL;
  for (size_t i = 0; i < plan.n; i++) {
    zck_gather_extent e = {ext[i].src_store, ext[i].src_off, ext[i].dst_off, ext[i].count};
    p->total += e.count;
    p->dst_end = e.dst_off + e.count;
    while (e.count) {
      if (!cur || cur->count == p->bucket_elems) {
        if (!ZCK__GROW(p->buckets, cap_buckets, p->n_buckets + 1)) { s = ZCK_ERR_NO_MEMORY; goto done; }
        cur = &p->buckets[p->n_buckets++];
        *cur = (zck_gather_bucket){p->n_items, 0, p->n_runs, 0, 0};
      }
      uint64_t take = p->bucket_elems - cur->count;
      if (take > e.count) take = e.count;
      if (!ZCK__GROW(p->items, cap_items, p->n_items + 1)) { s = ZCK_ERR_NO_MEMORY; goto done; }
      p->items[p->n_items++] = (zck_gather_item){e.src, e.src_off, cur->count, take};
      cur->n_items++;
      zck_gather_run *run = cur->n_runs ? &p->runs[p->n_runs - 1] : NULL;
      if (run && run->dst_off + run->count == e.dst_off) {
        run->count += take;
      } else {
        if (!ZCK__GROW(p->runs, cap_runs, p->n_runs + 1)) { s = ZCK_ERR_NO_MEMORY; goto done; }
        p->runs[p->n_runs++] = (zck_gather_run){e.dst_off, cur->count, take};
        cur->n_runs++;
      }
      cur->count += take;
      e.src_off += take;
      e.dst_off += take;
      e.count -= take;
    }
  }
done:
  free(ext);
  if (s != ZCK_OK) {
    zck_gather_plan_free(p);
    return s;
  }
  *out = p;
  return ZCK_OK;
}

/* The extents are the copy plan (plan.h) from the layout into the output seen as a layout
 * of its own: one store, param p's elements from param_dst_off[p] on; what the layout does
 * not hold (another layout's params) is left out of it. */
zck_status zck_gather_extents_from_layout(const zck_layout *l, const uint64_t *param_dst_off, zck_gather_extent **out,
                                          size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  zck_piece *pc = zck__calloc(l->n_params ? l->n_params : 1, sizeof *pc);
  if (!pc) return ZCK_ERR_NO_MEMORY;
  size_t n = 0;
  uint64_t end = 0, e_p;
  for (size_t p = 0; p < l->n_params; p++) {
    if (param_dst_off[p] == UINT64_MAX || l->param_first[p] == l->param_first[p + 1]) continue;
    if (__builtin_add_overflow(param_dst_off[p], l->param_numel[p], &e_p)) {
      free(pc);
      return zck__fail(ZCK_ERR_INVALID_ARG, "gather: param %zu lies past the addressable output", p);
    }
    pc[n++] = (zck_piece){(uint32_t)p, 0, 0, param_dst_off[p], l->param_numel[p], 0, 0};
    if (e_p > end) end = e_p;
  }
  zck_layout_store st = {-1, -1, -1, end, end};
  zck_layout *dst = NULL;
  zck_plan *plan = NULL, *runs = NULL;
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.max_chunk = 0;              /* buckets cut them */
  po.allow_missing = true;
  po.order = ZCK_PLAN_BY_DST;
  zck_status s = zck_layout_custom(l->n_params, l->param_numel, &st, 1, pc, n, &dst);
  if (s == ZCK_OK) s = zck_plan_build(l, dst, &po, &plan);
  if (s == ZCK_OK) s = zck_plan_unstride(plan, true, &runs);   /* the buckets copy runs */
  const zck_plan *q = runs ? runs : plan;
  zck_gather_extent *e = s == ZCK_OK ? zck__calloc(q->n ? q->n : 1, sizeof *e) : NULL;
  if (s == ZCK_OK && !e) s = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < q->n; i++)
    e[i] = (zck_gather_extent){q->ext[i].src_store, q->ext[i].src_off, q->ext[i].dst_off, q->ext[i].count};
  if (s == ZCK_OK) {
    *out = e;
    *n_out = q->n;
  }
  zck_plan_free(runs);
  zck_plan_free(plan);
  zck_layout_free(dst);
  free(pc);
  return s;
}

/* The plan was made for sources of these dtypes and sizes. */
static zck_status check_srcs(const zck_gather_plan *p, const zck_gather_src *srcs) {
  for (size_t i = 0; i < p->n_srcs; i++)
    ZCK_FAIL_IF(srcs[i].dtype != p->src_dtype[i] || srcs[i].numel < p->src_numel[i], ZCK_ERR_INVALID_ARG,
                "gather: source %zu is %s[%llu]; the plan was made for %s[%llu]", i, zck_dtype_name(srcs[i].dtype),
                (unsigned long long)srcs[i].numel, zck_dtype_name(p->src_dtype[i]),
                (unsigned long long)p->src_numel[i]);
  return ZCK_OK;
}

zck_status zck__gather_check_srcs(const zck_gather_plan *p, const zck_gather_src *srcs) { return check_srcs(p, srcs); }

/* Hands bucket b's runs (staged at `stage`) to the writer. Shared with the GPU path. */
zck_status zck__gather_write_bucket(const zck_gather_plan *p, size_t b, const uint8_t *stage, zck_gather_write_fn write,
                                    void *ctx) {
  size_t osz = zck_dtype_size(p->out_dtype);
  const zck_gather_bucket *bk = &p->buckets[b];
  for (size_t r = 0; r < bk->n_runs; r++) {
    const zck_gather_run *run = &p->runs[bk->first_run + r];
    uint64_t off = run->dst_off * osz;
    size_t n = (size_t)(run->count * osz);
    ZCK_TRY_CTX(write(ctx, off, stage + run->stage_off * osz, n), "gather: writing output bytes [%llu, %llu)",
                (unsigned long long)off, (unsigned long long)(off + n));
  }
  return ZCK_OK;
}

zck_status zck_gather_run_host(const zck_gather_plan *p, const zck_gather_src *srcs, zck_gather_write_fn write,
                               void *ctx) {
  ZCK_TRY(check_srcs(p, srcs));
  if (!p->n_buckets) return ZCK_OK;
  size_t osz = zck_dtype_size(p->out_dtype);
  uint64_t stage_elems = p->bucket_elems < p->total ? p->bucket_elems : p->total;
  uint8_t *stage = zck__malloc((size_t)(stage_elems * osz));
  if (!stage) return zck__fail(ZCK_ERR_NO_MEMORY, "gather: no memory for a %llu-byte staging buffer",
                               (unsigned long long)(stage_elems * osz));
  zck_status s = ZCK_OK;
  for (size_t b = 0; b < p->n_buckets && s == ZCK_OK; b++) {
    const zck_gather_bucket *bk = &p->buckets[b];
    for (size_t i = 0; i < bk->n_items && s == ZCK_OK; i++) {
      const zck_gather_item *it = &p->items[bk->first_item + i];
      zck_dtype st = p->src_dtype[it->src];
      const uint8_t *src = (const uint8_t *)srcs[it->src].data + it->src_off * zck_dtype_size(st);
      s = zck_convert(p->out_dtype, stage + it->stage_off * osz, st, src, (size_t)it->count);
    }
    if (s == ZCK_OK) s = zck__gather_write_bucket(p, b, stage, write, ctx);
  }
  free(stage);
  return s;
}
