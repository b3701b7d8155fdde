/* exec_check.c: validation before any byte moves: every extent inside its stores (and
 * their files and records), every store readable or writable as used, every dtype pair
 * convertible, so a plan that does not fit fails whole, not half-way. */
#include "exec_internal.h"

#include <stdio.h>

static zck_status check_store_range(const zck_store *s, uint32_t id, const char *side, uint64_t off, uint64_t count,
                                    const zck_extent *e) {
  char lb[64];
  const char *name = zck__store_label(s, lb, sizeof lb, side, id);
  uint64_t end;
  ZCK_FAIL_IF(s->kind == ZCK_STORE_UNBOUND, ZCK_ERR_INVALID_ARG, "%s store %u is used by the plan but not bound", side,
              id);
  size_t es = zck_dtype_size(s->dtype);
  ZCK_FAIL_IF(!es, ZCK_ERR_INVALID_ARG, "%s: no valid dtype", name);
  ZCK_FAIL_IF(!zck__add_u64(off, count, &end) || end > s->numel, ZCK_ERR_FORMAT,
              "%s: needs elements [%llu, %llu) (parameter %u) but holds %llu", name, (unsigned long long)off,
              (unsigned long long)(off + count), e->param, (unsigned long long)s->numel);
  uint64_t bytes;
  ZCK_FAIL_IF(!zck__mul_u64(end, es, &bytes) || bytes > ((uint64_t)1 << 62) || s->base > ((uint64_t)1 << 62),
              ZCK_ERR_LIMIT, "%s: element %llu is beyond any file", name, (unsigned long long)end);
  if (s->kind == ZCK_STORE_SOURCE) {
    uint64_t lo = s->base + off * es, hi = s->base + bytes;
    ZCK_FAIL_IF(hi > s->source->size, ZCK_ERR_TRUNCATED, "%s: truncated: need bytes %llu..%llu but the file has %llu",
                s->source->name, (unsigned long long)lo, (unsigned long long)hi,
                (unsigned long long)s->source->size);
  }
  if (s->record && (s->kind == ZCK_STORE_SOURCE || s->kind == ZCK_STORE_FD)) {
    /* the describer's promise: the store lies inside its record (a whole-store stream may
     * read all of it) */
    uint64_t rec_end, store_end = s->base + s->numel * es;
    ZCK_FAIL_IF(!zck__add_u64(s->record->off, s->record->size, &rec_end) || s->base < s->record->off ||
                    store_end > rec_end || (s->kind == ZCK_STORE_SOURCE && rec_end > s->source->size),
                ZCK_ERR_INTERNAL, "%s: bytes %llu..%llu lie outside its %s (bytes %llu..%llu)", name,
                (unsigned long long)s->base, (unsigned long long)store_end,
                s->record->what ? s->record->what : "record", (unsigned long long)s->record->off,
                (unsigned long long)(s->record->off + s->record->size));
  }
  return ZCK_OK;
}

zck_status zck__exec_check_job(const zck_exec_job *j, size_t job, uint64_t *total) {
  const zck_plan *p = j->plan;
  for (size_t i = 0; i < p->n; i++) {
    const zck_extent *e = &p->ext[i];
    ZCK_FAIL_IF(e->src_store >= p->n_src_stores || e->dst_store >= p->n_dst_stores, ZCK_ERR_INVALID_ARG,
                "copy job %zu: extent %zu names store %u -> %u beyond the plan's %zu -> %zu", job, i, e->src_store,
                e->dst_store, p->n_src_stores, p->n_dst_stores);
    const zck_store *S = &j->src[e->src_store], *D = &j->dst[e->dst_store];
    uint64_t dst_span = e->count;   /* from the first element written to one past the last */
    if (zck_extent_strided(e)) {
      /* exec.c left only strided extents whose source side is contiguous */
      uint64_t runs = zck_runs_n(e->count, e->run);
      ZCK_FAIL_IF(e->src_stride != e->run || e->dst_stride < e->run ||
                      !zck__mul_u64(runs - 1, e->dst_stride, &dst_span) ||
                      !zck__add_u64(dst_span, e->count - (runs - 1) * e->run, &dst_span),
                  ZCK_ERR_INVALID_ARG, "copy job %zu: extent %zu: runs of %llu elements %llu apart in its target", job, i,
                  (unsigned long long)e->run, (unsigned long long)e->dst_stride);
    }
    ZCK_TRY(check_store_range(S, e->src_store, "source", e->src_off, e->count, e));
    ZCK_TRY(check_store_range(D, e->dst_store, "target", e->dst_off, dst_span, e));
    ZCK_FAIL_IF(S->kind == ZCK_STORE_CALLBACK && !S->read, ZCK_ERR_INVALID_ARG, "%s: cannot be read",
                S->name ? S->name : "a source store");
    ZCK_FAIL_IF(D->kind == ZCK_STORE_SOURCE || (D->kind == ZCK_STORE_CALLBACK && !D->write), ZCK_ERR_INVALID_ARG,
                "%s: cannot be written", D->name ? D->name : "a target store");
    ZCK_FAIL_IF(!zck_dtype_convertible(D->dtype, S->dtype), ZCK_ERR_UNSUPPORTED, "%s: cannot convert %s to %s for %s",
                S->name ? S->name : "source", zck_dtype_name(S->dtype), zck_dtype_name(D->dtype),
                D->name ? D->name : "the target");
    *total += e->count * zck_dtype_size(D->dtype);
  }
  return ZCK_OK;
}
