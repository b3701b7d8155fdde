/* layout_lp.c: the layouts of the two whole-model copies a DeepSpeed save holds besides
 * the optimizer partitions, one home for their rules (the DeepSpeed reader and writer, the
 * universal reader, the engine's geometry and the saver's model.safetensors take them from
 * here):
 *  - the 16-bit all-weights copy (stage 1/2's `module`, HF's model.safetensors): every param
 *    that holds its own data (a tied alias shares its source's), whole;
 *  - the frozen params (frozen_param_shapes): the frozen ones of those, in manifest order.
 *    Stage 3 keeps each as frozen_param_fragments, its ds_tensor of ceil(n/W) elements per
 *    rank (padding included), i.e. a ZeRO-3 sub-group of its own; stage 1/2 whole. */
#include "layout.h"

#include <stdlib.h>

#include "error.h"
#include "model.h"
#include "util.h"

size_t zck_lp_params(const zck_model *m, uint32_t *out) {
  size_t n = 0;
  for (size_t p = 0; p < m->n_params; p++)
    if (m->params[p].tied_to < 0) {
      if (out) out[n] = (uint32_t)p;
      n++;
    }
  return n;
}

size_t zck_frozen_params(const zck_model *m, uint32_t *out) {
  size_t n = 0;
  for (size_t p = 0; p < m->n_params; p++)
    if (m->params[p].frozen && m->params[p].tied_to < 0) {
      if (out) out[n] = (uint32_t)p;
      n++;
    }
  return n;
}

zck_status zck_layout_lp(const zck_model *m, const uint64_t *numel, const uint32_t *params, size_t n,
                         zck_layout **out) {
  if (params) return zck_layout_whole(m->n_params, numel, params, n, out);
  uint32_t *own = zck__calloc(m->n_params + 1, sizeof *own);
  if (!own) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck_layout_whole(m->n_params, numel, own, zck_lp_params(m, own), out);
  free(own);
  return s;
}

zck_status zck_layout_frozen(size_t n_params, const uint64_t *numel, const uint32_t *frozen, size_t n_frozen,
                             int stage, uint32_t world, zck_layout **out) {
  if (stage != 3) return zck_layout_whole(n_params, numel, frozen, n_frozen, out);
  zck_group_spec *specs = zck__calloc(n_frozen + 1, sizeof *specs);
  if (!specs) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < n_frozen; i++) specs[i] = (zck_group_spec){&frozen[i], 1, -1};
  zck_status s = zck_layout_zero3(n_params, numel, specs, n_frozen, world, out);
  free(specs);
  return s;
}

uint64_t zck_frozen_fragment_numel(uint64_t numel, int stage, uint32_t world) {
  return stage == 3 ? zck_zero3_partition(numel, world) : numel;
}

zck_status zck_frozen_fragment_check(const char *path, const char *what, uint64_t have, uint64_t numel, int stage,
                                     uint32_t world) {
  uint64_t want = zck_frozen_fragment_numel(numel, stage, world);
  if (have == want) return ZCK_OK;
  return zck__fail(ZCK_ERR_MISMATCH, "%s: %s has %llu elements; expected %llu (%s)", path, what,
                   (unsigned long long)have, (unsigned long long)want,
                   stage == 3 ? "ceil(numel / world size)" : "the parameter's numel");
}

zck_status zck_frozen_fragments_absent(const char *path, const char *param) {
  return zck__fail(ZCK_ERR_FORMAT, "%s: frozen parameter '%s' but no frozen_param_fragments", path, param);
}

zck_status zck_frozen_fragment_missing(const char *path, const char *param) {
  return zck__fail(ZCK_ERR_FORMAT, "%s: frozen parameter '%s' missing from frozen_param_fragments", path, param);
}
