/* ds_autoep_hf.c: an AutoEP checkpoint's manifest, layouts and recipe under the HF model's own names, after
 * describe (the rules are in ds_autoep.c's opening comment): w1 and w3 become gate_up_proj, each expert's w1 rows
 * then its w3 rows, w2 becomes down_proj, the router mlp.gate.weight. */
#include "ds_autoep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- after describe: the HF model's names */

typedef struct remap {
  int64_t *to;          /* [old params]: new index, -1 none */
  uint64_t *half;       /* [old params]: w1 / w3: elements of one expert's half (I * H); 0 otherwise */
  bool *upper;          /* [old params]: w3 (the up half) */
} remap;

static zck_status copy_hparams(zck_model *to, uint32_t g, const zck_param_group *from) {
  for (size_t h = 0; h < from->n_hparams; h++) {
    const zck_hparam *hp = &from->hparams[h];
    switch (hp->kind) {
    case ZCK_HP_NONE: ZCK_TRY(zck_model_group_set_none(to, g, hp->key)); break;
    case ZCK_HP_BOOL: ZCK_TRY(zck_model_group_set_bool(to, g, hp->key, hp->i != 0)); break;
    case ZCK_HP_INT: ZCK_TRY(zck_model_group_set_int(to, g, hp->key, hp->i)); break;
    case ZCK_HP_FLOAT: ZCK_TRY(zck_model_group_set_float(to, g, hp->key, hp->f[0])); break;
    case ZCK_HP_FLOATS: ZCK_TRY(zck_model_group_set_floats(to, g, hp->key, hp->f, hp->n_floats)); break;
    case ZCK_HP_STRING: ZCK_TRY(zck_model_group_set_string(to, g, hp->key, hp->s)); break;
    }
  }
  return ZCK_OK;
}

static zck_status hf_model(const zck_ds_ckpt *c, const zck_model *m, zck_model **out, remap *rm) {
  const struct zck__ds_autoep_file *f = c->autoep->layers;
  zck_model *n = zck_model_new();
  if (!n) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  for (size_t p = 0; p < m->n_params && s == ZCK_OK; p++) {
    const zck_param *pp = &m->params[p];
    const zck__ds_autoep_layer *l;
    int w = zck__ds_autoep_weight(f, pp->name, &l);
    char name[1100];
    int64_t shape[ZCK_MAX_DIMS];
    memcpy(shape, pp->shape, sizeof shape);
    rm->to[p] = -1;
    if (w == 3) continue;   /* into gate_up_proj, with w1 */
    if (w == 1) {
      snprintf(name, sizeof name, "%s.gate_up_proj", l->prefix);
      shape[1] *= 2;
    } else if (w == 2) {
      snprintf(name, sizeof name, "%s.down_proj", l->prefix);
    } else if ((l = zck__ds_autoep_layer_of(f, pp->name, ".router.gate.weight"))) {
      snprintf(name, sizeof name, "%s.gate.weight", l->module_path);
    } else {
      snprintf(name, sizeof name, "%s", pp->name);
    }
    uint32_t idx;
    if ((s = zck_model_add_param(n, name, pp->ndim, shape, pp->dtype, &idx)) != ZCK_OK) break;
    rm->to[p] = idx;
    zck_model_set_frozen(n, idx, pp->frozen);
  }
  for (size_t p = 0; p < m->n_params && s == ZCK_OK; p++) {   /* w3 beside its w1 */
    const zck__ds_autoep_layer *l;
    if (zck__ds_autoep_weight(f, m->params[p].name, &l) != 3) continue;
    char w1[1100];
    snprintf(w1, sizeof w1, "%s.w1", l->prefix);
    int64_t q = zck_model_find_param(m, w1);
    if (q < 0 || m->params[q].numel != m->params[p].numel)
      s = zck__fail(ZCK_ERR_MISMATCH, "%s: '%s' and '%s' differ in shape: not HF's gate_up_proj halves", c->fs.dir, w1,
                    m->params[p].name);
    else {
      rm->to[p] = rm->to[q];
      rm->half[p] = rm->half[q] = m->params[p].numel / (uint64_t)l->num_experts;
      rm->upper[p] = true;
    }
  }
  for (size_t p = 0; p < m->n_params && s == ZCK_OK; p++)
    if (m->params[p].tied_to >= 0 && rm->to[p] >= 0)
      s = zck_model_set_tied(n, (uint32_t)rm->to[p], (uint32_t)rm->to[m->params[p].tied_to]);
  for (size_t b = 0; b < m->n_buffers && s == ZCK_OK; b++)
    s = zck_model_add_buffer(n, m->buffers[b].name, m->buffers[b].ndim, m->buffers[b].shape, m->buffers[b].dtype, NULL);
  for (size_t g = 0; g < m->n_groups && s == ZCK_OK; g++) {
    uint32_t ng;
    if ((s = zck_model_add_group(n, &ng)) != ZCK_OK) break;
    s = copy_hparams(n, ng, &m->groups[g]);
    for (size_t i = 0; i < m->groups[g].n_params && s == ZCK_OK; i++) {
      uint32_t p = m->groups[g].params[i];
      if (rm->to[p] >= 0 && !rm->upper[p]) s = zck_model_group_add_param(n, ng, (uint32_t)rm->to[p]);
    }
  }
  if (s != ZCK_OK) { zck_model_free(n); return s; }
  *out = n;
  return ZCK_OK;
}

/* The layout l (over the old params) over the new ones: w1 / w3 pieces cut at expert boundaries and placed in
 * their half of each expert's gate_up_proj rows. */
static zck_status remap_layout(const zck_layout *l, const zck_model *n, const remap *rm, zck_layout **out) {
  *out = NULL;
  if (!l) return ZCK_OK;
  size_t cap = l->n_pieces + 1, np = 0;
  for (size_t i = 0; i < l->n_pieces; i++)
    if (rm->half[l->pieces[i].param]) cap += l->pieces[i].count / rm->half[l->pieces[i].param] + 1;
  zck_piece *pieces = zck__calloc(cap, sizeof *pieces);
  uint64_t *numels = zck__calloc(n->n_params + 1, sizeof *numels);
  if (!pieces || !numels) { free(pieces); free(numels); return ZCK_ERR_NO_MEMORY; }
  zck_model_numels(n, numels);
  for (size_t i = 0; i < l->n_pieces; i++) {
    const zck_piece *p = &l->pieces[i];
    if (rm->to[p->param] < 0) continue;
    uint32_t to = (uint32_t)rm->to[p->param];
    uint64_t half = rm->half[p->param];
    if (!half) {
      pieces[np] = *p;
      pieces[np++].param = to;
      continue;
    }
    for (uint64_t done = 0; done < p->count;) {
      uint64_t off = p->param_off + done, e = off / half, j = off % half;
      uint64_t k = half - j < p->count - done ? half - j : p->count - done;
      pieces[np++] = (zck_piece){to, p->store, e * 2 * half + (rm->upper[p->param] ? half : 0) + j, p->store_off + done, k, 0, 0};
      done += k;
    }
  }
  zck_layout *r = NULL;
  zck_status s = zck_layout_custom(n->n_params, numels, l->stores, l->n_stores, pieces, np, &r);
  free(pieces);
  free(numels);
  if (s != ZCK_OK) return s;
  r->world = l->world;
  *out = r;
  return ZCK_OK;
}

/* The module's 16-bit expert weights are in the expert files (or, at stage 3, nowhere whole): not bound. */
static zck_status unbind_lp(zck_ds_ckpt *c) {
  zck_layout_free(c->lp_layout);
  c->lp_layout = NULL;
  free(c->lp_missing);
  c->lp_missing = zck__strdup("AutoEP: the 16-bit expert weights are not bound (the fp32 masters are cast)");
  return c->lp_missing ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

zck_status zck__ds_autoep_finish(zck_ds_ckpt *c, bool hf_names) {
  if (!hf_names) return unbind_lp(c);   /* DeepSpeed's names, as ds_autoep.c laid them out */
  const zck_model *m = c->model;
  remap rm = {zck__calloc(m->n_params + 1, sizeof *rm.to), zck__calloc(m->n_params + 1, sizeof *rm.half),
              zck__calloc(m->n_params + 1, sizeof *rm.upper)};
  zck_model *n = NULL;
  zck_layout *train = NULL, *frozen = NULL;
  zck_ds_output *outs = NULL;
  zck_status s = rm.to && rm.half && rm.upper ? hf_model(c, m, &n, &rm) : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) s = remap_layout(c->train_layout, n, &rm, &train);
  if (s == ZCK_OK) s = remap_layout(c->frozen_layout, n, &rm, &frozen);
  /* the recipe: the same entries over the new params (w3's merged into w1's gate_up_proj) */
  int64_t *out_of = s == ZCK_OK ? zck__calloc(c->n_outputs + 1, sizeof *out_of) : NULL;
  if (s == ZCK_OK && (!out_of || !(outs = zck__calloc(c->n_outputs + 1, sizeof *outs)))) s = ZCK_ERR_NO_MEMORY;
  size_t no = 0;
  for (size_t i = 0; s == ZCK_OK && i < c->n_outputs; i++) {
    zck_ds_output o = c->outputs[i];
    out_of[i] = -1;
    if (o.kind == ZCK_DS_OUT_BUFFER) {
      const zck_buffer *b = &n->buffers[o.index];
      o.name = b->name;
      o.shape = b->shape;
    } else {
      if (o.index == UINT32_MAX || rm.to[o.index] < 0 || rm.upper[o.index]) continue;
      const zck_param *pp = &n->params[rm.to[o.index]];
      o.index = (uint32_t)rm.to[o.index];
      o.name = pp->name;
      o.ndim = pp->ndim;
      o.shape = pp->shape;
      o.numel = pp->numel;
      if (o.kind == ZCK_DS_OUT_ALIAS) {
        if (o.alias_of < 0 || out_of[o.alias_of] < 0) continue;
        o.alias_of = (int32_t)out_of[o.alias_of];
      }
    }
    out_of[i] = (int64_t)no;
    outs[no++] = o;
  }
  free(out_of);
  /* flat order and module entries over the new params (w3 stands for its gate_up_proj) */
  for (size_t k = 0; s == ZCK_OK && k < c->flat_first[c->optims[0].n_flat]; k++)
    c->flat_params[k] = (uint32_t)rm.to[c->flat_params[k]];
  if (s == ZCK_OK)
    for (size_t p = 0; p < m->n_params; p++)
      if (rm.to[p] >= 0 && !rm.upper[p]) c->param_mod[rm.to[p]] = c->param_mod[p];
  if (s == ZCK_OK) {
    zck_model_free(c->model);
    c->model = n;
    zck_layout_free(c->train_layout);
    c->train_layout = train;
    zck_layout_free(c->frozen_layout);
    c->frozen_layout = frozen;
    free(c->outputs);
    c->outputs = outs;
    c->n_outputs = no;
    s = unbind_lp(c);
  } else {
    zck_model_free(n);
    zck_layout_free(train);
    zck_layout_free(frozen);
    free(outs);
  }
  free(rm.to);
  free(rm.half);
  free(rm.upper);
  return s;
}

