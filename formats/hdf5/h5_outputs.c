/* h5_outputs.c: zero_to_fp32's output recipe (deepspeed.h, zck_ds_outputs) for zckpt's
 * universal container, so that consolidating it gives, tensor for tensor and in the same
 * order, what consolidating the checkpoint it was made from gives.
 *
 * The container lists what the recipe needs in the source's orders (to_universal_h5.c
 * writes them from the DeepSpeed reader's manifest): buffer_names in module order,
 * frozen_parameters in module order (frozen_param_shapes' order), param_names in flat
 * (param_shapes) order, tied_parameters in module order (shared_params'). The `stage`
 * attribute picks which frozen params zero_to_fp32 emits: every one at stage 2/3 and for a
 * ZeRO-0 source (whose consolidation is the whole model), none at stage 1. */
#include <stdlib.h>
#include <string.h>

#include "deepspeed/deepspeed.h"
#include "h5_internal.h"

static bool zck__h5o_floating(zck_dtype t) {
  return t == ZCK_F32 || t == ZCK_F64 || t == ZCK_F16 || t == ZCK_BF16 || t == ZCK_F8_E4M3 || t == ZCK_F8_E5M2;
}

zck_status zck_h5u_outputs(const zck_h5u *u, zck_ds_output **out, size_t *n_out) {
  *out = NULL;
  *n_out = 0;
  const zck_model *m = zck_h5u_model(u);
  int stage = zck_h5u_info_of(u)->stage;
  const zck_layout *fl = NULL;
  const zck_store *fs = NULL;
  if (zck_h5u_get(u, ZCK_H5U_FP32, &fl, &fs) != ZCK_OK)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no fp32 master weights in the container", zck_h5_name(zck_h5u_file(u)));
  zck_ds_output *o = zck__calloc(m->n_buffers + 2 * m->n_params + 1, sizeof *o);
  if (!o) return ZCK_ERR_NO_MEMORY;
  size_t n = 0;
  for (size_t b = 0; b < m->n_buffers; b++) {
    const zck_buffer *bf = &m->buffers[b];
    o[n++] = (zck_ds_output){bf->name, ZCK_DS_OUT_BUFFER, (uint32_t)b, -1, zck__h5o_floating(bf->dtype) ? ZCK_F32 : bf->dtype,
                             bf->dtype, bf->ndim, bf->shape, bf->numel};
  }
  for (size_t p = 0; stage != 1 && p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    if (pp->frozen && pp->tied_to < 0)
      o[n++] = (zck_ds_output){pp->name, ZCK_DS_OUT_FROZEN, (uint32_t)p, -1, pp->dtype, pp->dtype, pp->ndim, pp->shape,
                               pp->numel};
  }
  /* the fp32 layout's stores are the param_names entries, in order */
  for (size_t k = 0; k < fl->n_stores; k++) {
    const zck_param *pp = &m->params[fl->stores[k].param];
    o[n++] = (zck_ds_output){pp->name, ZCK_DS_OUT_TRAINABLE, fl->stores[k].param, -1, fs[k].dtype, fs[k].dtype, pp->ndim,
                             pp->shape, pp->numel};
  }
  size_t before = n;
  for (size_t p = 0; p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    if (pp->tied_to < 0) continue;
    int64_t src = -1;
    for (size_t j = 0; j < before && src < 0; j++)
      if (o[j].kind != ZCK_DS_OUT_BUFFER && o[j].index == (uint32_t)pp->tied_to) src = (int64_t)j;
    if (src < 0) continue;   /* its source is not in the output (a stage-1 frozen param) */
    o[n] = o[src];
    o[n].name = pp->name;
    o[n].kind = ZCK_DS_OUT_ALIAS;
    o[n].index = (uint32_t)p;
    o[n].alias_of = (int32_t)src;
    n++;
  }
  *out = o;
  *n_out = n;
  return ZCK_OK;
}
