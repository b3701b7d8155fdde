/* exec_dst_crc.c: the CRC-32 of each target store a job asks for (zck_exec_job.dst_crc32),
 * assembled from the extents' own CRCs in target order, zeros where nothing is written. */
#include "exec_internal.h"

#include <stdlib.h>

static int cmp_crc_order_r(const void *a, const void *b, void *ctx) {
  const zck_extent *ext = ctx;
  const zck_extent *x = &ext[*(const size_t *)a], *y = &ext[*(const size_t *)b];
  if (x->dst_store != y->dst_store) return x->dst_store < y->dst_store ? -1 : 1;
  if (x->dst_off != y->dst_off) return x->dst_off < y->dst_off ? -1 : 1;
  return 0;
}

/* Sorts the job's extents by destination and rejects overlaps (a CRC needs each byte
 * written once). */
zck_status zck__exec_prepare_crc(const zck_exec_job *j, size_t job, job_state *js) {
  const zck_plan *p = j->plan;
  js->ext_crc = zck__calloc(p->n ? p->n : 1, sizeof *js->ext_crc);
  js->crc_order = zck__malloc((p->n ? p->n : 1) * sizeof *js->crc_order);
  if (!js->ext_crc || !js->crc_order) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < p->n; i++) js->crc_order[i] = i;
  if (p->n > 1) qsort_r(js->crc_order, p->n, sizeof *js->crc_order, cmp_crc_order_r, p->ext);
  for (size_t i = 1; i < p->n; i++) {
    const zck_extent *a = &p->ext[js->crc_order[i - 1]], *b = &p->ext[js->crc_order[i]];
    if (a->dst_store == b->dst_store && a->dst_off + a->count > b->dst_off) {
      const zck_store *D = &j->dst[b->dst_store];
      return zck__fail(ZCK_ERR_INVALID_ARG, "copy job %zu: %s: element %llu is written twice, so it has no CRC", job,
                       D->name ? D->name : "a target store", (unsigned long long)b->dst_off);
    }
  }
  return ZCK_OK;
}

void zck__exec_assemble_crc(const zck_exec_job *j, const job_state *js) {
  const zck_plan *p = j->plan;
  size_t k = 0;
  for (size_t st = 0; st < p->n_dst_stores; st++) {
    const zck_store *D = &j->dst[st];
    size_t es = zck_dtype_size(D->dtype);
    uint64_t pos = 0, end = D->kind == ZCK_STORE_UNBOUND ? 0 : D->numel * es;
    uint32_t crc = 0;
    for (; k < p->n && p->ext[js->crc_order[k]].dst_store == st; k++) {
      const zck_extent *e = &p->ext[js->crc_order[k]];
      uint64_t at = e->dst_off * es, len = e->count * es;
      if (at > pos) crc = zck_crc32_combine(crc, zck_crc32_zeros(at - pos), at - pos);
      crc = zck_crc32_combine(crc, js->ext_crc[js->crc_order[k]], len);
      pos = at + len;
    }
    if (end > pos) crc = zck_crc32_combine(crc, zck_crc32_zeros(end - pos), end - pos);
    j->dst_crc32[st] = crc;
  }
}
