/* layout_zero.c: one ZeRO geometry of a manifest (layout.h), the same for the DeepSpeed
 * writer and the training engine, so what the engine keeps in memory is what the writer
 * lays out, partition for partition. */
#include "layout.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "model.h"
#include "util.h"

void zck_zero_geometry_free(zck_zero_geometry *g) {
  if (!g) return;
  zck_layout_free(g->train);
  zck_layout_free(g->frozen);
  free(g->flat);
  free(g->flat_mem_);
  free(g->frozen_params);
  free(g->numel);
  memset(g, 0, sizeof *g);
}

zck_status zck_zero_geometry_build(const zck_model *m, const zck_zero_opts *o, zck_zero_geometry *g) {
  memset(g, 0, sizeof *g);
  size_t n = m->n_params;
  g->numel = zck__calloc(n + 1, sizeof *g->numel);
  g->frozen_params = zck__calloc(n + 1, sizeof *g->frozen_params);
  zck_group_spec *specs = zck__calloc(m->n_groups + 1, sizeof *specs);
  uint32_t *idx = zck__calloc(n + 1, sizeof *idx);
  zck_status s = g->numel && g->frozen_params && specs && idx ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) zck_model_numels(m, g->numel);
  if (s == ZCK_OK) g->n_frozen = zck_frozen_params(m, g->frozen_params);
  /* trainable params of every optimizer group, in group order */
  for (size_t gi = 0, used = 0; s == ZCK_OK && gi < m->n_groups; gi++) {
    size_t k = zck_model_group_trainable(m, (uint32_t)gi, idx + used, n - used);
    specs[gi] = (zck_group_spec){idx + used, k, (int32_t)gi};
    used += k;
  }
  if (s == ZCK_OK && o->stage <= 2) {
    /* flat order = group order, or DeepSpeed's round-robin order */
    g->flat = specs;
    g->n_flat = m->n_groups;
    if (o->round_robin) {
      if (!(g->flat_mem_ = zck__calloc(n + 1, sizeof *g->flat_mem_))) s = ZCK_ERR_NO_MEMORY;
      for (size_t gi = 0, at = 0; s == ZCK_OK && gi < m->n_groups; gi++) {
        zck_round_robin_order(specs[gi].params, specs[gi].n_params, o->world, g->flat_mem_ + at);
        specs[gi].params = g->flat_mem_ + at;
        at += specs[gi].n_params;
      }
      free(idx);
    } else {
      g->flat_mem_ = idx;
    }
    idx = NULL;
    specs = NULL;
    if (s == ZCK_OK) s = zck_layout_zero12(n, g->numel, g->flat, g->n_flat, o->world, o->param_align, &g->train);
  } else if (s == ZCK_OK) {
    s = zck_zero3_sub_groups(g->numel, specs, m->n_groups, o->world, o->sub_group_size, &g->flat, &g->n_flat);
    if (s == ZCK_OK) s = zck_layout_zero3(n, g->numel, g->flat, g->n_flat, o->world, &g->train);
    if (s == ZCK_OK) s = zck_layout_frozen(n, g->numel, g->frozen_params, g->n_frozen, 3, o->world, &g->frozen);
  }
  free(specs);
  free(idx);
  if (s != ZCK_OK) zck_zero_geometry_free(g);
  return s;
}
