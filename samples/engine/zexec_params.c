/* zexec_params.c: which gathered tensors a rank holds while the modules run (zexec.h):
 * the gathers and prefetches, stage 3's persistent tensors and reuse distance, and under
 * overlap_comm the gathers on the comm stream with the compute stream's waits. */
#include "zexec_internal.h"

#include "dzero.h"
#include "util.h"

#include <stdlib.h>

static bool stage3(const ze_exec *x) { return x->zr->plan->o.stage == 3; }

zck_status zx_params_init(ze_exec *x) {
  if (stage3(x)) {
    /* DeepSpeed's mark_persistent_parameters: named_parameters order (= spec order, the
     * tied lm_head not repeated), numel <= threshold, total within the model threshold */
    uint64_t total = 0, model = x->o.model_persistence_threshold ? x->o.model_persistence_threshold : UINT64_MAX;
    for (size_t t = 0; t < x->n_specs; t++) {
      uint64_t n = x->spec_numel[t];
      if (n > x->o.persistence_threshold || total + n > model) continue;
      x->persist[t] = true;
      total += n;
      x->stats.persistent_tensors++;
    }
    x->stats.persistent_numel = total;
  }
  for (size_t t = 0; t < x->n_specs; t++) x->pgat[t] = -1;
  if (!x->ov) return ZCK_OK;
  ze_dzero *d = x->zr->dev;
  for (int i = 0; i < x->n_mod; i++) ZCK_TRY(ze_dzero_event_new(d, &x->ev[i]));
  ZCK_TRY(ze_dzero_event_new(d, &x->ev_fence));
  return ze_dzero_event_new(d, &x->ev_reduce);
}

void zx_params_free(ze_exec *x) {
  for (size_t t = 0; x->pbuf && t < x->n_specs; t++) zx_drop(x, (uint32_t)t);
  if (!x->zr->dev) return;
  for (int i = 0; i < ZX_MODS; i++) ze_dzero_event_free(x->zr->dev, x->ev[i]);
  ze_dzero_event_free(x->zr->dev, x->ev_fence);
  ze_dzero_event_free(x->zr->dev, x->ev_reduce);
}

static ze_mem_kind kind_of(const ze_exec *x, uint32_t t) { return x->persist[t] ? ZE_MEM_PERSIST : ZE_MEM_PARAMS; }

void zx_drop(ze_exec *x, uint32_t t) {
  if (!x->pbuf[t]) return;
  /* (without the waits the gather may still be writing it: freed behind it on its stream) */
  bool behind = x->ov && x->o.test_skip_waits;
  int prev = behind ? ze_dzero_select(x->zr->dev, ZE_STREAM_COMM) : ZE_STREAM_COMPUTE;
  ze_zero_free(x->zr, kind_of(x, t), x->pbuf[t], x->spec_numel[t] * sizeof(float));
  if (behind) ze_dzero_select(x->zr->dev, prev);
  x->pbuf[t] = NULL;
  x->pgat[t] = -1;
  x->live -= x->spec_numel[t];
}

/* Whether tensor t must be gathered: not there, or (persistent) from older 16-bit params. */
static bool missing(const ze_exec *x, uint32_t t) { return !x->pbuf[t] || x->pver[t] != x->zr->lp_version; }

/* Elements of module m's tensors a gather would fetch (*need), and of those not allocated
 * yet (*add: what the live count grows by). */
static void module_missing(const ze_exec *x, int m, uint64_t *need, uint64_t *add) {
  *need = *add = 0;
  for (int k = 0; k < x->n_idx[m + 1]; k++) {
    uint32_t t = x->idx[m + 1][k];
    if (missing(x, t)) *need += x->spec_numel[t];
    if (!x->pbuf[t]) *add += x->spec_numel[t];
  }
}

bool zx_fence(ze_exec *x) {
  ze_dzero *d = x->zr->dev;
  zck_status s = ze_dzero_record(d, x->ev_fence); /* on the compute stream */
  int prev = ze_dzero_select(d, ZE_STREAM_COMM);
  if (s == ZCK_OK) s = ze_dzero_wait(d, x->ev_fence);
  ze_dzero_select(d, prev);
  if (s != ZCK_OK) x->status = s;
  return s == ZCK_OK;
}

bool zx_gather(ze_exec *x, int m, bool ahead) {
  ze_zero_rank *zr = x->zr;
  int i = m + 1;
  uint32_t list[12];
  float *dst[12];
  size_t n = 0;
  for (int k = 0; k < x->n_idx[i]; k++)
    if (missing(x, x->idx[i][k])) list[n++] = x->idx[i][k];
  if (!n) return true;
  /* stage 1/2 convert from the local lp flat: no collective, nothing to overlap */
  bool ov = x->ov && stage3(x);
  int prev = ov ? ze_dzero_select(zr->dev, ZE_STREAM_COMM) : ZE_STREAM_COMPUTE;
  zck_status s = ZCK_OK;
  for (size_t k = 0; k < n && s == ZCK_OK; k++) {
    uint32_t t = list[k];
    if (!x->pbuf[t]) {
      x->pbuf[t] = ze_zero_alloc(zr, kind_of(x, t), x->spec_numel[t] * sizeof(float));
      if (!x->pbuf[t]) {
        s = zck__fail(ZCK_ERR_NO_MEMORY, "rank %u: out of memory for module %d's parameters", zr->rank, m);
        break;
      }
      x->live += x->spec_numel[t];
    }
    dst[k] = x->pbuf[t];
  }
  if (s == ZCK_OK) s = ze_zero_fetch_work_to(zr, list, n, dst);
  for (size_t k = 0; k < n && s == ZCK_OK; k++) {
    x->pver[list[k]] = zr->lp_version;
    x->pgat[list[k]] = ov ? i : -1;
  }
  if (ov && s == ZCK_OK) s = ze_dzero_record(zr->dev, x->ev[i]);
  if (ov) ze_dzero_select(zr->dev, prev);
  if (stage3(x)) {
    x->stats.gathers++;
    x->stats.prefetches += ahead;
    x->stats.async_gathers += ov;
  }
  x->status = s;
  return s == ZCK_OK;
}

/* A window of the trace after the current use, of about stage3_prefetch_bucket_size
 * elements, is kept gathered (DeepSpeed's prefetch queue, consumed as the modules run,
 * keeps about that much in flight ahead); a module is taken whole (its tensors come in one
 * gather), and counts whether it needed a gather or not. */
bool zx_prefetch(ze_exec *x) {
  uint64_t ahead = 0;
  int cur = x->seq[x->pos];
  for (int j = x->pos + 1; j < x->n_seq && ahead < x->o.prefetch_bucket_size; j++) {
    int m = x->seq[j];
    if (m == cur) continue;
    uint64_t need, add;
    module_missing(x, m, &need, &add);
    if (need) {
      if (x->live + add > x->o.max_live_parameters) break;
      if (!zx_gather(x, m, true)) return false;
    }
    ahead += x->numel[m + 1];
  }
  return true;
}

bool zx_ready(ze_exec *x, int m) {
  if (!x->ov) return true;
  ze_dzero *d = x->zr->dev;
  int i = m + 1;
  zck_status s = ZCK_OK;
  for (int k = 0; k < x->n_idx[i] && s == ZCK_OK; k++) {
    uint32_t t = x->idx[i][k];
    if (x->pgat[t] < 0) continue;
    if (!x->o.test_skip_waits) s = ze_dzero_wait(d, x->ev[x->pgat[t]]); /* compute stream */
    x->pgat[t] = -1;
  }
  /* evidence of overlap: a later module's gather, or a reduction, still in flight now */
  bool gather_busy = false;
  for (size_t t = 0; t < x->n_specs && !gather_busy && s == ZCK_OK; t++)
    gather_busy = x->pgat[t] >= 0 && ze_dzero_query(d, x->ev[x->pgat[t]]) == 0;
  x->stats.overlapped_gathers += gather_busy;
  if (x->reduce_pending && ze_dzero_query(d, x->ev_reduce) == 0) x->stats.overlapped_reduces++;
  if (s != ZCK_OK) x->status = s;
  return s == ZCK_OK;
}

void zx_release(ze_exec *x, int m) {
  int i = m + 1;
  if (!stage3(x)) {
    /* the final module runs again at once when backward starts */
    if (x->pos < x->n_seq && x->seq[x->pos] == m) return;
    for (int k = 0; k < x->n_idx[i]; k++) zx_drop(x, x->idx[i][k]);
    return;
  }
  /* DeepSpeed's __params_to_release: not persistent, and not used by a module within the
   * reuse distance (walked from the next trace position, each module's whole numel) */
  for (int k = 0; k < x->n_idx[i]; k++) x->keep[x->idx[i][k]] = x->persist[x->idx[i][k]];
  uint64_t walked = 0;
  for (int j = x->pos; j < x->n_seq && walked < x->o.max_reuse_distance; j++) {
    int u = x->seq[j] + 1;
    for (int k = 0; k < x->n_idx[u]; k++) {
      uint32_t t = x->idx[u][k];
      if (x->pbuf[t] && !x->keep[t] && !x->persist[t]) {
        /* only the released module's own tensors are candidates */
        for (int q = 0; q < x->n_idx[i]; q++)
          if (x->idx[i][q] == t) {
            x->keep[t] = true;
            x->stats.reuse_kept++;
          }
      }
      walked += x->spec_numel[t];
    }
  }
  for (int k = 0; k < x->n_idx[i]; k++) {
    uint32_t t = x->idx[i][k];
    if (!x->keep[t]) zx_drop(x, t);
    x->keep[t] = false;
  }
}
