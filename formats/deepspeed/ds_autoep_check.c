/* ds_autoep_check.c: AutoEP checks beyond the records: the expert files hold this save's weights (verify), and
 * the one refusal of the jobs that would write an AutoEP checkpoint again. */
#include "ds_autoep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* ---- verify: the expert files hold this save's weights */

/* Stage 1/2: each expert file's weights are the module's 16-bit (or fp32) copy of its fp32 master, which DeepSpeed
 * writes back after every step (torch's round to nearest even): a file of another save of the same run (same names,
 * shapes and dtype) differs. Reads every expert weight and its master once; for verify. */
zck_status zck_ds_autoep_check_experts(const zck_ds_ckpt *c) {
  if (!c->autoep || c->info.stage == 3) return ZCK_OK;
  const struct zck__ds_autoep_file *f = c->autoep->layers;
  const zck_layout *L = c->train_layout;
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < c->fs.n_experts && s == ZCK_OK; i++) {
    const zck__ds_rankfile *rf = &c->fs.experts[i];
    unsigned lid = 0, eid = 0;
    sscanf(rf->name, "layer_%u_expert_%u", &lid, &eid);
    const zck__ds_autoep_layer *l = NULL;
    for (size_t k = 0; k < f->n; k++)
      if (f->v[k].layer_id == (int64_t)lid) l = &f->v[k];
    if (!l) continue;   /* refused at open */
    zck__source src;
    if ((s = zck__source_open(&src, rf->path)) != ZCK_OK) break;
    zck_torch_file *tf = NULL;
    s = zck_torch_open_source(&src, &c->topts, &tf);
    for (int w = 0; w < 3 && s == ZCK_OK; w++) {
      char key[1100], pn[1100];
      snprintf(key, sizeof key, "%s.w%d.%u", l->prefix, w + 1, eid);
      snprintf(pn, sizeof pn, "%s.%s", l->prefix, w == 1 ? "down_proj" : "gate_up_proj");
      zck__ds_tref t;
      if ((s = zck__ds_tensor(tf, zck_pk_dict_get(zck_torch_root(tf), key), &t, key)) != ZCK_OK) break;
      int64_t p = zck_model_find_param(c->model, pn);
      uint64_t per = t.numel;
      if (p < 0 || !t.contiguous || c->info.master_dtype != ZCK_F32) continue;   /* nothing to compare against */
      /* where the train layout (the one consolidate reads) puts this expert's master elements */
      uint64_t at = w == 1 ? eid * per : eid * 2 * per + (w == 2 ? per : 0), got_n = 0;
      size_t esz = zck_dtype_size(t.dtype);
      float *m = zck__calloc(per, sizeof *m);
      uint8_t *v = zck__calloc(per, esz);
      const zck__ds_optim_file *o = NULL;
      if (!m || !v) s = ZCK_ERR_NO_MEMORY;
      for (size_t q = L->param_first[p]; s == ZCK_OK && q < L->param_first[p + 1]; q++) {
        const zck_piece *pc = &L->pieces[q];
        uint64_t lo = pc->param_off > at ? pc->param_off : at;
        uint64_t hi = pc->param_off + pc->count < at + per ? pc->param_off + pc->count : at + per;
        if (lo >= hi) continue;
        const zck_layout_store *st = &L->stores[pc->store];
        o = &c->optims[st->rank];
        const zck__ds_tref *master = &o->flat[st->group].fp32;
        s = zck__source_read(&o->src, m + (lo - at), (hi - lo) * 4, master->offset + (pc->store_off + lo - pc->param_off) * 4);
        got_n += hi - lo;
      }
      if (s == ZCK_OK && got_n != per) { free(m); free(v); continue; }
      if (s == ZCK_OK) s = zck__source_read(&src, v, per * esz, t.offset);
      for (uint64_t k = 0; s == ZCK_OK && k < per; k++) {
        bool same;
        if (t.dtype == ZCK_BF16 || t.dtype == ZCK_F16) {
          uint16_t got;
          memcpy(&got, v + 2 * k, 2);
          same = got == (t.dtype == ZCK_BF16 ? zck__bf16_round(m[k]) : zck__f16_round(m[k]));
        } else {
          same = t.dtype != ZCK_F32 || !memcmp(v + 4 * k, &m[k], 4);
        }
        if (!same)
          s = zck__fail(ZCK_ERR_DAMAGED, "%s: '%s' element %llu is not the module copy of its fp32 master (%s): "
                        "a file of another save?", rf->path, key, (unsigned long long)k, o ? o->file->name : "?");
      }
      free(m);
      free(v);
    }
    zck_torch_close(tf);
    zck__source_close(&src);
  }
  return s;
}

zck_status zck_ds_autoep_refuse(const zck_ds_ckpt *c, const char *job) {
  if (!c || !c->autoep) return ZCK_OK;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: an AutoEP (expert-parallel) checkpoint: %s does not write AutoEP's layout "
                   "yet (consolidate, inspect, verify and to-universal read it; DeepSpeed's load_universal takes "
                   "to-universal's folder to another EP size)", c->info.dir, job);
}

bool zck_ds_autoep_is_expert(const zck_ds_ckpt *c, const char *name) {
  const zck__ds_autoep_layer *l;
  return c && c->autoep && zck__ds_autoep_weight(c->autoep->layers, name, &l) != 0;
}
