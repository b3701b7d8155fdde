/* uv_outputs.c: zero_to_fp32's output recipe (deepspeed.h, zck_ds_outputs) for a universal
 * folder, so that consolidating it gives, tensor for tensor and in the same order, what
 * consolidating the checkpoint it was made from gives.
 *
 * The folder carries the source's model-states file byte for byte, and that file holds
 * everything the recipe is made of: buffer_names, frozen_param_shapes (their order) and
 * frozen_param_fragments (their dtype), param_shapes (the trainable order: c->flat) and
 * shared_params (the aliases, in their order). The rules are ds_describe.c's:
 *   1. buffers in module order, floating ones as float32;
 *   2. frozen params: stage 2/3 in frozen_param_shapes order (none without it); stage 1
 *      none; a folder made from a ZeRO-0 checkpoint (zckpt's to-universal: optimizer_state.pt
 *      says ZeRO-1, the carried ds_config stage 0) every frozen param in module order, as a
 *      ZeRO-0 consolidation gives the whole model;
 *   3. trainable params in param_shapes order, master dtype (the fp32.pt files');
 *   4. shared_params aliases whose source is in the output, a repeated key overwriting. */
#include "uv_internal.h"

#include <stdlib.h>
#include <string.h>

/* The carried ds_config says ZeRO stage 0 (a dict without zero_optimization.stage is
 * DeepSpeed's default, 0). */
static bool zck__uv_from_zero0(const zck_uv_ckpt *c) {
  const zck_pk *zs = zck_pk_dict_get(zck_torch_root(c->optim), "zero_stage");
  if (!zs || zs->kind == ZCK_PK_NONE) return false;   /* BF16_Optimizer: none, read as stage 1 */
  const zck_pk *cfg = zck_uv_ds_config(c);
  if (!cfg || cfg->kind != ZCK_PK_DICT) return false;
  const zck_pk *zo = zck_pk_dict_get(cfg, "zero_optimization");
  const zck_pk *st = zo && zo->kind == ZCK_PK_DICT ? zck_pk_dict_get(zo, "stage") : NULL;
  int64_t v = 0;
  if (st && !zck_pk_as_int(st, &v)) return false;
  return v == 0;
}

static bool zck__uv_floating(zck_dtype t) {
  return t == ZCK_F32 || t == ZCK_F64 || t == ZCK_F16 || t == ZCK_BF16 || t == ZCK_F8_E4M3 || t == ZCK_F8_E5M2;
}

zck_status zck__uv_build_outputs(zck_uv_ckpt *c) {
  const zck_model *m = c->m;
  const zck_pk *root = zck_torch_root(c->model0);
  const zck_pk *fs = zck_pk_dict_get(root, "frozen_param_shapes");
  const zck_pk *ff = zck_pk_dict_get(root, "frozen_param_fragments");
  const zck_pk *sh = zck_pk_dict_get(root, "shared_params");
  if (fs && fs->kind != ZCK_PK_DICT) fs = NULL;   /* None (stage 1, exclude_frozen_parameters) */
  if (ff && ff->kind != ZCK_PK_DICT) ff = NULL;
  if (sh && sh->kind != ZCK_PK_DICT) sh = NULL;
  size_t n_shared = sh ? sh->u.dict.len : 0;
  size_t cap = m->n_buffers + m->n_params + n_shared + 1;
  if (!(c->outputs = zck__calloc(cap, sizeof *c->outputs))) return ZCK_ERR_NO_MEMORY;
  zck_ds_output *out = c->outputs;
  size_t n = 0;
  for (size_t b = 0; b < m->n_buffers; b++) {
    const zck_buffer *bf = &m->buffers[b];
    out[n++] = (zck_ds_output){bf->name, ZCK_DS_OUT_BUFFER, (uint32_t)b, -1,
                               zck__uv_floating(bf->dtype) ? ZCK_F32 : bf->dtype, bf->dtype, bf->ndim, bf->shape, bf->numel};
  }
  if (c->info.stage == 1 && zck__uv_from_zero0(c)) {
    for (size_t p = 0; p < m->n_params; p++) {
      const zck_param *pp = &m->params[p];
      if (!pp->frozen || pp->tied_to >= 0) continue;
      out[n++] = (zck_ds_output){pp->name, ZCK_DS_OUT_FROZEN, (uint32_t)p, -1, pp->dtype, pp->dtype, pp->ndim, pp->shape,
                                 pp->numel};
    }
  } else if (c->info.stage >= 2 && fs) {
    zck_pk_dict_index ffx;   /* looked up per frozen param */
    ZCK_TRY(zck_pk_dict_index_init(&ffx, ff));
    for (size_t i = 0; i < fs->u.dict.len; i++) {
      const char *name = zck_pk_as_str(fs->u.dict.keys[i]);
      int64_t p = name ? zck_model_find_param(m, name) : -1;
      if (p < 0) {
        zck_pk_dict_index_free(&ffx);
        return zck__fail(ZCK_ERR_FORMAT, "%s: frozen_param_shapes names '%s', which is not a parameter",
                         zck_torch_name(c->model0), name ? name : "a non-string");
      }
      const zck_param *pp = &m->params[p];
      zck_dtype dt = pp->dtype;
      const zck_torch_tensor *t = ff ? zck_torch_tensor_of(c->model0, zck_pk_dict_index_get(&ffx, name)) : NULL;
      if (t) dt = t->dtype;
      out[n++] = (zck_ds_output){pp->name, ZCK_DS_OUT_FROZEN, (uint32_t)p, -1, dt, dt, pp->ndim, pp->shape, pp->numel};
    }
    zck_pk_dict_index_free(&ffx);
  }
  for (size_t k = 0; k < c->n_flat; k++) {
    const zck_param *pp = &m->params[c->flat[k]];
    out[n++] = (zck_ds_output){pp->name, ZCK_DS_OUT_TRAINABLE, c->flat[k], -1, c->info.master_dtype,
                               c->info.master_dtype, pp->ndim, pp->shape, pp->numel};
  }
  const char **names = n_shared ? zck__calloc(2 * n_shared, sizeof *names) : NULL;
  if (n_shared && !names) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < n_shared; i++) { /* a non-string was refused by the manifest builder already */
    names[i] = zck_pk_as_str(sh->u.dict.keys[i]);
    names[n_shared + i] = zck_pk_as_str(sh->u.dict.values[i]);
  }
  zck_status s = zck_ds_outputs_add_aliases(out, &n, names, names + n_shared, n_shared, m);
  free(names);
  ZCK_TRY(s);
  c->n_outputs = n;
  return ZCK_OK;
}

const zck_ds_output *zck_uv_outputs(const zck_uv_ckpt *c, size_t *n) {
  *n = c->n_outputs;
  return c->outputs;
}
