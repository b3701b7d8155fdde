/* ds_pipe_check.c: verify's check that a PipelineModule's layer files hold this save's weights.
 *
 * DeepSpeed writes each layer file from the module, whose weights are the 16-bit (or fp32) copy of the fp32
 * masters it writes back after every step (round to nearest even). The records of a layer file of another save of
 * the same run (same names, shapes, dtype and archive name) are intact; its values are not those copies. A later
 * stage's copy of a TiedLayerSpec weight equals the first stage's (ds_pipe_tied.c checks it). */
#include "ds_pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

#define ZCK__PIPE_CHECK_BLOCK ((uint64_t)1 << 18)   /* elements compared at a time */

/* Elements [off, off + n) of a piece of param p: the master from its flat group, the module copy from its layer file. */
static zck_status check_block(const zck_ds_ckpt *c, const zck_piece *pc, uint64_t off, uint64_t n, size_t k, float *m,
                              uint8_t *v) {
  const zck__ds_model_file *m0 = &c->models[0];
  const zck__ds_tref *t = &m0->module_t[k];
  const zck_layout_store *st = &c->train_layout->stores[pc->store];
  const zck__ds_optim_file *o = &c->optims[st->rank];
  const zck__ds_flat *f = &o->flat[st->group];
  size_t esz = zck_dtype_size(t->dtype);
  ZCK_TRY(zck__source_read(f->src ? f->src : &o->src, m, n * 4, f->fp32.offset + (pc->store_off + off) * 4));
  ZCK_TRY(zck__source_read(zck__ds_module_src(m0, k), v, n * esz, t->offset + (pc->param_off + off) * esz));
  for (uint64_t i = 0; i < n; i++) {
    bool same;
    if (t->dtype == ZCK_BF16 || t->dtype == ZCK_F16) {
      uint16_t got;
      memcpy(&got, v + 2 * i, 2);
      same = got == (t->dtype == ZCK_BF16 ? zck__bf16_round(m[i]) : zck__f16_round(m[i]));
    } else {
      same = !memcmp(v + 4 * i, &m[i], 4);
    }
    if (!same)
      return zck__fail(ZCK_ERR_DAMAGED, "%s: '%s' element %llu is not the module copy of its fp32 master (%s): a layer "
                       "file of another save?", zck__ds_module_path(m0, k), strchr(m0->module_names[k], '.') + 1,
                       (unsigned long long)(pc->param_off + off + i), f->path ? f->path : o->file->path);
  }
  return ZCK_OK;
}

zck_status zck_ds_pipe_check_layers(const zck_ds_ckpt *c) {
  if (!c || !c->pipe || c->info.master_dtype != ZCK_F32 || !c->train_layout) return ZCK_OK;
  const zck_model *mdl = c->model;
  const zck_layout *L = c->train_layout;
  float *m = zck__calloc(ZCK__PIPE_CHECK_BLOCK, sizeof *m);
  uint8_t *v = zck__calloc(ZCK__PIPE_CHECK_BLOCK, 4);
  zck_status s = m && v ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; s == ZCK_OK && p < mdl->n_params; p++) {
    const zck_param *pp = &mdl->params[p];
    if (pp->frozen || pp->tied_to >= 0) continue;
    size_t k = (size_t)c->param_mod[p];
    const zck__ds_tref *t = &c->models[0].module_t[k];
    bool known = t->dtype == ZCK_BF16 || t->dtype == ZCK_F16 || t->dtype == ZCK_F32;
    if (!t->contiguous || !known || t->numel != pp->numel) continue;   /* nothing to compare against */
    for (size_t q = L->param_first[p]; s == ZCK_OK && q < L->param_first[p + 1]; q++) {
      const zck_piece *pc = &L->pieces[q];
      if (pc->run) continue;   /* ZeRO-1 pieces are contiguous */
      for (uint64_t off = 0; s == ZCK_OK && off < pc->count; off += ZCK__PIPE_CHECK_BLOCK) {
        uint64_t n = pc->count - off < ZCK__PIPE_CHECK_BLOCK ? pc->count - off : ZCK__PIPE_CHECK_BLOCK;
        s = check_block(c, pc, off, n, k, m, v);
      }
    }
  }
  free(m);
  free(v);
  return s == ZCK_OK ? zck__ds_pipe_check_replicas(c) : s;
}
