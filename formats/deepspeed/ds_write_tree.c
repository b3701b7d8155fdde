/* ds_write_tree.c: the pickled objects of the files zck_ds_writer writes, key for key as
 * DeepSpeed 0.19.8 saves them (engine._save_checkpoint, stage_1_and_2.state_dict,
 * stage3._rigid_state_dict; deepspeed-checkpoint.md §2, §2.6), with every tensor's data
 * region reserved in its torch writer and registered as a target store. */
#include "ds_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Small builders; each returns NULL on allocation failure and the callers check once per
 * insertion. */
static zck_pk *S(zck_pk_doc *d, const char *s) { return zck_pk_new_str(d, s); }

static bool put(zck_pk_doc *d, zck_pk *dict, const char *key, zck_pk *v) {
  zck_pk *k = S(d, key);
  return k && v && zck_pk_dict_set(d, dict, k, v);
}

static bool put_int_key(zck_pk_doc *d, zck_pk *dict, int64_t key, zck_pk *v) {
  zck_pk *k = zck_pk_new_int(d, key);
  return k && v && zck_pk_dict_set(d, dict, k, v);
}

/* Replaces dict[key] (str key) or appends it. */
static bool set_key(zck_pk_doc *d, zck_pk *dict, const char *key, zck_pk *v) {
  if (!v) return false;
  for (size_t i = dict->u.dict.len; i-- > 0;) {
    const char *k = zck_pk_as_str(dict->u.dict.keys[i]);
    if (k && !strcmp(k, key)) {
      dict->u.dict.values[i] = v;
      return true;
    }
  }
  return put(d, dict, key, v);
}

static zck_pk *torch_size(zck_pk_doc *d, int ndim, const int64_t *shape) {
  zck_pk *t = zck_pk_new_tuple(d, (size_t)ndim);
  if (!t) return NULL;
  t->tag = ZCK_PK_TAG_TORCH_SIZE;
  for (int i = 0; i < ndim; i++)
    if (!(t->u.seq.items[i] = zck_pk_new_int(d, shape[i]))) return NULL;
  return t;
}

static zck_pk *int_list(zck_pk_doc *d, const int64_t *v, size_t n) {
  zck_pk *l = zck_pk_new_list(d);
  for (size_t i = 0; l && i < n; i++)
    if (!zck_pk_append(d, l, zck_pk_new_int(d, v[i]))) return NULL;
  return l;
}

static zck_pk *global_obj(zck_pk_doc *d, const char *mod, const char *name, zck_pk *args, int newobj, zck_pk *state) {
  zck_pk *g = zck_pk_new_global(d, mod, name);
  return g && args ? zck_pk_new_object(d, g, args, newobj, state) : NULL;
}

/* ZeroStageEnum(n), spelled as DeepSpeed's files spell it (REDUCE with the value). */
static zck_pk *zero_stage_enum(zck_pk_doc *d, int stage) {
  zck_pk *args = zck_pk_new_tuple(d, 1);
  if (!args || !(args->u.seq.items[0] = zck_pk_new_int(d, stage))) return NULL;
  return global_obj(d, "deepspeed.runtime.zero.config", "ZeroStageEnum", args, 0, NULL);
}

static zck_pk *loss_scaler(zck_ds_writer *w, zck_pk_doc *d) {
  if (w->o.loss_scaler) return zck__ds_pk_copy(d, w->o.loss_scaler);
  /* bf16 / fp32 engines: LossScaler with __dict__ {'cur_scale': 1.0, 'dynamic': False} */
  zck_pk *st = zck_pk_new_dict(d, 0);
  if (!st || !put(d, st, "cur_scale", zck_pk_new_float(d, 1.0)) || !put(d, st, "dynamic", zck_pk_new_bool(d, 0)))
    return NULL;
  return global_obj(d, "deepspeed.runtime.fp16.loss_scaler", "LossScaler", zck_pk_new_tuple(d, 0), 1, st);
}

static bool scaler_is_dynamic(const zck_pk *ls) {
  const zck_pk *st = ls && ls->kind == ZCK_PK_OBJECT ? ls->u.obj.state : NULL;
  const zck_pk *dyn = zck_pk_dict_get(st, "dynamic");
  return dyn && dyn->kind == ZCK_PK_BOOL && dyn->u.b;
}

static zck_pk *fragment_address(zck_pk_doc *d, uint64_t numel, uint64_t start) {
  zck_pk *st = zck_pk_new_dict(d, 0);
  if (!st || !put(d, st, "numel", zck_pk_new_int(d, (int64_t)numel)) || !put(d, st, "start", zck_pk_new_int(d, (int64_t)start)))
    return NULL;
  return global_obj(d, "deepspeed.utils.tensor_fragment", "fragment_address", zck_pk_new_tuple(d, 0), 1, st);
}

/* ds_config: the given one with zero_optimization updated to the target, or a minimal one. */
static zck_pk *ds_config(zck_ds_writer *w, zck_pk_doc *d) {
  zck_pk *cfg = w->o.ds_config && w->o.ds_config->kind == ZCK_PK_DICT ? zck__ds_pk_copy(d, w->o.ds_config)
                                                                        : zck_pk_new_dict(d, 0);
  if (!cfg) return NULL;
  zck_pk *zo = zck__ds_pk_get_mut(cfg, "zero_optimization");
  if (!zo || zo->kind != ZCK_PK_DICT) {
    if (!(zo = zck_pk_new_dict(d, 0)) || !set_key(d, cfg, "zero_optimization", zo)) return NULL;
  }
  if (!set_key(d, zo, "stage", zck_pk_new_int(d, w->stage))) return NULL;
  if (w->stage == 3 && w->o.sub_group_size && !set_key(d, zo, "sub_group_size", zck_pk_new_int(d, (int64_t)w->sub_group_size)))
    return NULL;
  /* the switches that change the flat layout must describe the files written */
  if ((w->o.round_robin || zck_pk_dict_get(zo, "round_robin_gradients")) &&
      !set_key(d, zo, "round_robin_gradients", zck_pk_new_bool(d, w->o.round_robin)))
    return NULL;
  if ((w->o.param_align > 1 || zck_pk_dict_get(zo, "parameter_alignment")) &&
      !set_key(d, zo, "parameter_alignment", zck_pk_new_bool(d, w->o.param_align > 1)))
    return NULL;
  if (w->o.autoep) {  /* AutoEP: the EP size the files are laid out for */
    zck_pk *ep = zck__ds_pk_get_mut(cfg, "expert_parallel");
    if (ep && ep->kind == ZCK_PK_DICT && !set_key(d, ep, "autoep_size", zck_pk_new_int(d, zck__ds_autoep_ep_size(w)))) return NULL;
  }
  if (!w->o.ds_config) {
    zck_pk *bf = zck_pk_new_dict(d, 0);
    if (!bf || !put(d, bf, "enabled", zck_pk_new_bool(d, w->lp == ZCK_BF16)) || !put(d, cfg, "bf16", bf)) return NULL;
    if (w->lp == ZCK_F16) {
      zck_pk *fp = zck_pk_new_dict(d, 0);
      if (!fp || !put(d, fp, "enabled", zck_pk_new_bool(d, 1)) || !put(d, cfg, "fp16", fp)) return NULL;
    }
  }
  return cfg;
}

static zck_pk *hparam_value(zck_pk_doc *d, const zck_hparam *h) {
  switch (h->kind) {
  case ZCK_HP_NONE: return zck_pk_new_none(d);
  case ZCK_HP_BOOL: return zck_pk_new_bool(d, (int)h->i);
  case ZCK_HP_INT: return zck_pk_new_int(d, h->i);
  case ZCK_HP_FLOAT: return zck_pk_new_float(d, h->f[0]);
  case ZCK_HP_STRING: return S(d, h->s ? h->s : "");
  case ZCK_HP_FLOATS: {
    zck_pk *t = zck_pk_new_tuple(d, (size_t)h->n_floats);
    for (int i = 0; t && i < h->n_floats; i++)
      if (!(t->u.seq.items[i] = zck_pk_new_float(d, h->f[i]))) return NULL;
    return t;
  }
  }
  return zck_pk_new_none(d);
}

/* torch's optimizer.state_dict()['param_groups']: the hyper-parameters, then 'params'. */
static zck_pk *param_groups(zck_ds_writer *w, zck_pk_doc *d) {
  const zck_model *m = w->m;
  zck_pk *l = zck_pk_new_list(d);
  if (!l) return NULL;
  for (size_t g = 0; g < m->n_groups; g++) {
    zck_pk *gd = zck_pk_new_dict(d, 0), *ids = zck_pk_new_list(d);
    if (!gd || !ids) return NULL;
    char gname[32];
    const char *rename = zck__ds_autoep_group_name(w, g, gname, sizeof gname);  /* AutoEP: ep_size_<E> */
    for (size_t i = 0; i < m->groups[g].n_hparams; i++) {
      const zck_hparam *h = &m->groups[g].hparams[i];
      zck_pk *v = rename && !strcmp(h->key, "name") ? S(d, rename) : hparam_value(d, h);
      if (!put(d, gd, h->key, v)) return NULL;
    }
    for (size_t s = 0; s < w->n_flat; s++)
      if (w->flat[s].opt_group == (int32_t)g && !zck_pk_append(d, ids, zck_pk_new_int(d, (int64_t)s))) return NULL;
    if (!put(d, gd, "params", ids) || !zck_pk_append(d, l, gd)) return NULL;
  }
  return l;
}

static zck_status oom(const char *path) { return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory building the pickle", path); }

/* A tensor node on a fresh storage, registered as a target store when out != NULL. */
static zck_status new_tensor(zck_ds_writer *w, zck_torch_writer *tw, zck__shash *hf, zck_dtype dt, int ndim,
                             const int64_t *shape, uint64_t numel, int requires_grad, const char *name, zck_store *out,
                             size_t *storage, zck_pk **node) {
  uint64_t off;
  size_t idx;
  ZCK_TRY(zck__ds_add_storage(tw, hf, dt, numel, NULL, &idx, &off));
  if (!(*node = zck_torch_writer_tensor(tw, idx, ndim, shape, NULL, 0, requires_grad))) return ZCK_ERR_NO_MEMORY;
  if (storage) *storage = idx;
  if (out) ZCK_TRY(zck__ds_add_wstore(w, tw, hf, idx, off, dt, numel, name, out));
  return ZCK_OK;
}

zck_status zck__ds_build_model_file(zck_ds_writer *w, uint32_t r) {
  const zck_model *m = w->m;
  char *fname = zck__ds_model_name_mp(w->stage, r, w->o.mp_rank);
  char *path = fname ? zck__path_join(w->fdir, fname) : NULL;
  zck_status s = ZCK_OK;
  size_t *stor = zck__calloc(m->n_params + 1, sizeof *stor);
  if (!path || !stor) { s = ZCK_ERR_NO_MEMORY; goto out; }
  zck__shash *hf = w->model_h[r] = zck__shash_new(); /* NULL (no memory): no hashes */
  ZCK_CHECK_GOTO(zck_torch_writer_create_hashed(path, hf, &w->model_w[r]), s, out);
  zck_torch_writer *tw = w->model_w[r];
  zck_pk_doc *d = zck_torch_writer_doc(tw);
  bool pipe = w->o.pp_size > 1;   /* PipelineModule: module None, the weights in the layer files */
  zck_pk *root = zck_pk_new_dict(d, 0), *module = pipe ? zck_pk_new_none(d) : zck_pk_new_dict(d, 1);
  if (!root || !module) goto nomem;
  if (!pipe && w->o.module_attrs && !(module->u.dict.attrs = zck__ds_pk_copy(d, w->o.module_attrs))) goto nomem;
  char label[1200];
  /* module: params (lp dtype, full in stage 1/2, [0] placeholders in stage 3), then buffers */
  size_t empty_storage = (size_t)-1;
  for (size_t p = 0, lpi = 0; !pipe && p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    zck_pk *t = NULL;
    int64_t zero = 0;
    if (w->ae_layer && w->ae_layer[p] >= 0) continue;   /* AutoEP: an expert weight, in its expert files / ZeRO shards */
    if (w->moe_file && w->moe_file[p] >= 0) continue;   /* deepspeed.moe: an expert weight, in its expert file */
    if (w->stage == 3) {
      if (empty_storage == (size_t)-1) {
        uint64_t off;
        ZCK_CHECK_GOTO(zck__ds_add_storage(tw, hf, w->lp, 0, NULL, &empty_storage, &off), s, out);
      }
      if (!(t = zck_torch_writer_tensor(tw, empty_storage, 1, &zero, NULL, 0, 0))) goto nomem;
    } else if (pp->tied_to >= 0) {
      const zck_param *src = &m->params[pp->tied_to];
      if (!(t = zck_torch_writer_tensor(tw, stor[pp->tied_to], src->ndim, src->shape, NULL, 0, 0))) goto nomem;
    } else {
      snprintf(label, sizeof label, "%s/%s: module['%.900s']", w->shown, fname, pp->name);
      size_t at = w->lp_first ? w->lp_first[p] : lpi;
      ZCK_CHECK_GOTO(new_tensor(w, tw, hf, w->lp, pp->ndim, pp->shape, pp->numel, 0, label, &w->stores[ZCK_DS_LP][at],
                                &stor[p], &t), s, out);
      lpi++;
    }
    if (!put(d, module, pp->name, t)) goto nomem;
    char alias[1100];
    if (zck__ds_autoep_alias(w, (uint32_t)p, alias, sizeof alias)) {
      /* AutoEP's router alias: the same values (DeepSpeed saves a copy; here a view of the router's storage; stage 3:
       * a placeholder too) */
      zck_pk *a = w->stage == 3 ? zck_torch_writer_tensor(tw, empty_storage, 1, &zero, NULL, 0, 0)
                                : zck_torch_writer_tensor(tw, stor[p], pp->ndim, pp->shape, NULL, 0, 0);
      if (!a || !put(d, module, alias, a)) goto nomem;
    }
  }
  for (size_t b = 0; b < m->n_buffers; b++) {
    const zck_buffer *bf = &m->buffers[b];
    zck_pk *t;
    snprintf(label, sizeof label, "%s/%s: module['%.900s']", w->shown, fname, bf->name);
    ZCK_CHECK_GOTO(new_tensor(w, tw, hf, bf->dtype, bf->ndim, bf->shape, bf->numel, 0, label,
                              &w->buffer_stores[(size_t)r * m->n_buffers + b], NULL, &t), s, out);
    if (!put(d, module, bf->name, t)) goto nomem;
  }
  if (!put(d, root, "module", module)) goto nomem;
  zck_pk *bn = zck_pk_new_list(d);
  for (size_t b = 0; bn && b < m->n_buffers; b++)
    if (!zck_pk_append(d, bn, S(d, m->buffers[b].name))) goto nomem;
  if (!put(d, root, "buffer_names", bn) || !put(d, root, "optimizer", zck_pk_new_none(d))) goto nomem;
  /* param_shapes: one OrderedDict per flat group / sub-group, flat order */
  zck_pk *ps = zck_pk_new_list(d);
  if (!ps) goto nomem;
  for (size_t g = 0; g < w->n_flat; g++) {
    zck_pk *od = zck_pk_new_dict(d, 1);
    if (!od) goto nomem;
    for (size_t i = 0; i < w->flat[g].n_params; i++) {
      uint32_t p = w->flat[g].params[i];
      const zck_param *pp = &m->params[p];
      if (w->moe_other_ep && w->moe_other_ep[p]) continue;   /* deepspeed.moe: EP rank 0's experts only */
      int64_t shape[ZCK_MAX_DIMS];
      memcpy(shape, pp->shape, (size_t)pp->ndim * sizeof *shape);
      if (w->ae_layer && w->ae_layer[p] >= 0) shape[0] /= zck__ds_autoep_ep_size(w);   /* AutoEP: its local experts */
      zck_pk *sz = torch_size(d, pp->ndim, shape);
      if (sz && (w->ae_layer || w->moe_file)) sz->tag = ZCK_PK_TAG_NONE;   /* _save_moe_checkpoint saves plain tuples */
      if (!put(d, od, pp->name, sz)) goto nomem;
    }
    if (!zck_pk_append(d, ps, od)) goto nomem;
  }
  if (!put(d, root, "param_shapes", ps)) goto nomem;
  /* frozen params: stage >= 2 only (stage 1 never saves them) */
  zck_pk *fshapes = zck_pk_new_none(d), *frags = zck_pk_new_none(d);
  if (w->stage >= 2 && !(w->o.exclude_frozen && !w->n_frozen)) {
    fshapes = zck_pk_new_dict(d, 1);
    frags = zck_pk_new_dict(d, 1);
    if (!fshapes || !frags) goto nomem;
    for (size_t i = 0; i < w->n_frozen; i++) {
      const zck_param *pp = &m->params[w->frozen[i]];
      if (!put(d, fshapes, pp->name, torch_size(d, pp->ndim, pp->shape))) goto nomem;
      zck_pk *t;
      if (w->stage == 2) {  /* param.detach().cpu(): the module tensor's storage */
        if (!(t = zck_torch_writer_tensor(tw, stor[w->frozen[i]], pp->ndim, pp->shape, NULL, 0, 0))) goto nomem;
      } else {              /* this rank's ds_tensor: ceil(n/W) elements, padding included */
        int64_t pn = (int64_t)zck_frozen_fragment_numel(pp->numel, 3, w->w);
        uint32_t id = zck_layout_store_id(w->frozen_layout, (uint32_t)i, r);
        snprintf(label, sizeof label, "%s/%s: frozen_param_fragments['%.900s']", w->shown, fname, pp->name);
        ZCK_CHECK_GOTO(new_tensor(w, tw, hf, w->lp, 1, &pn, (uint64_t)pn, 0, label, &w->stores[ZCK_DS_FROZEN][id], NULL, &t),
                       s, out);
      }
      if (!put(d, frags, pp->name, t)) goto nomem;
    }
  }
  if (!put(d, root, "frozen_param_shapes", fshapes)) goto nomem;
  /* shared_params: computed on global rank 0 only; other stage-3 ranks and TP ranks save {} */
  zck_pk *shared = zck_pk_new_dict(d, 0);
  bool global0 = r == 0 && w->o.mp_rank == 0;
  for (size_t p = 0; shared && global0 && p < m->n_params; p++)
    if (m->params[p].tied_to >= 0 && !put(d, shared, m->params[p].name, S(d, m->params[m->params[p].tied_to].name)))
      goto nomem;
  for (size_t i = 0; shared && global0 && i < w->o.n_unsaved_ties; i++)
    if (!put(d, shared, w->o.unsaved_ties[2 * i], S(d, w->o.unsaved_ties[2 * i + 1]))) goto nomem;
  if (!put(d, root, "shared_params", shared) || !put(d, root, "frozen_param_fragments", frags)) goto nomem;
  zck_pk *sched = w->o.lr_scheduler ? zck__ds_pk_copy(d, w->o.lr_scheduler) : zck_pk_new_none(d);
  if (!sched) { s = zck__error_prepend(ZCK_ERR_UNSUPPORTED, "lr_scheduler"); goto out; }
  if (!put(d, root, "lr_scheduler", sched) || !put(d, root, "data_sampler", zck_pk_new_none(d)) ||
      !put(d, root, "random_ltd", zck_pk_new_none(d)) ||
      !put(d, root, "skipped_steps", zck_pk_new_int(d, w->o.skipped_steps)) ||
      !put(d, root, "global_steps", zck_pk_new_int(d, w->o.global_steps)))
    goto nomem;
  if (w->o.global_samples >= 0 && !put(d, root, "global_samples", zck_pk_new_int(d, w->o.global_samples))) goto nomem;
  if (w->o.step_ahead > 0 && !put(d, root, "zckpt_step_ahead", zck_pk_new_int(d, w->o.step_ahead))) goto nomem;
  zck_pk *cpd = zck_pk_new_dict(d, 0);
  int64_t tp = w->o.tp_size > 1 ? w->o.tp_size : 1, pp = pipe ? w->o.pp_size : 1;
  if (!cpd || !put(d, cpd, "pp_degree", zck_pk_new_int(d, pp)) || !put(d, cpd, "tp_degree", zck_pk_new_int(d, tp)))
    goto nomem;
  if (!put(d, root, "dp_world_size", zck_pk_new_int(d, w->w)) ||
      !put(d, root, "mp_world_size", zck_pk_new_int(d, tp * pp)) ||
      !put(d, root, "checkpoint_parallel_dimensions", cpd) || !put(d, root, "ds_config", ds_config(w, d)) ||
      !put(d, root, "ds_version", S(d, w->ds_version)))
    goto nomem;
  if (w->o.autoep && !zck__ds_autoep_model_extras(w, d, root, r)) goto nomem;  /* num_experts, ds_autoep_layers, uci */
  if (w->o.moe && !zck__ds_moe_model_extras(w, d, root)) goto nomem;           /* num_experts, ds_autoep_layers None */
  if (tp > 1 && w->o.tp_info) {  /* AutoTP: DeepSpeed's record of the slicing, last (as DeepSpeed orders it) */
    zck_pk *uci = zck__ds_pk_copy(d, w->o.tp_info);
    if (!uci) { s = zck__error_prepend(ZCK_ERR_UNSUPPORTED, "universal_checkpoint_info"); goto out; }
    if (!put(d, root, "universal_checkpoint_info", uci)) goto nomem;
  }
  ZCK_CHECK_GOTO(zck__ds_seal_file(tw, root, &w->model_desc[r]), s, out);
  goto out;
nomem:
  s = oom(path);
out:
  free(stor);
  free(fname);
  free(path);
  return s;
}

/* param_slice_mappings of rank r, group g (mixed_precision_linkage._init_lp_to_hp_mapping):
 * params in bit16 (group) order; their flat offsets are the real ones when
 * parameter_alignment padding exists, else running sums in group order (which, with
 * round_robin_gradients, is not the flat order: DeepSpeed's own quirk, kept). Params of
 * numel 0 get no entry. */
static zck_pk *slice_mappings(zck_ds_writer *w, zck_pk_doc *d, uint32_t r, size_t g) {
  const zck_model *m = w->m;
  const zck_layout_group *lg = &w->train->groups[g];
  zck_pk *od = zck_pk_new_dict(d, 1);
  if (!od) return NULL;
  bool padded = false;
  for (size_t i = 0; i + 1 < lg->n_params; i++)
    padded |= lg->offsets[i] + zck__ds_flat_numel(w, lg->params[i]) != lg->offsets[i + 1];
  uint64_t P = lg->partition, lo = (uint64_t)zck__ds_flat_rank(w, g, r) * P, hi = lo + P, run = 0;
  const zck_param_group *mg = &m->groups[g];
  for (size_t j = 0; j < mg->n_params; j++) {
    uint32_t p = mg->params[j];
    const zck_param *pp = &m->params[p];
    if (pp->frozen || pp->tied_to >= 0) continue;
    if (w->moe_other_ep && w->moe_other_ep[p]) continue;   /* deepspeed.moe: the local names (EP rank 0's) */
    uint64_t off = run, n = zck__ds_flat_numel(w, p);
    if (padded)
      for (size_t i = 0; i < lg->n_params; i++)
        if (lg->params[i] == p) off = lg->offsets[i];
    run += n;
    bool in = (lo <= off && off < hi) || (off < lo && lo < off + n);
    if (!in || !n) continue;
    uint64_t fs = off > lo ? off : lo, fe = off + n < hi ? off + n : hi;
    if (!put(d, od, pp->name, fragment_address(d, fe - fs, fs - lo))) return NULL;
  }
  return od;
}

/* One flat group's optimizer state: {'step', 'exp_avg', 'exp_avg_sq'} as torch Adam orders it. */
static zck_status group_state(zck_ds_writer *w, zck_torch_writer *tw, zck__shash *hf, zck_pk_doc *d, uint32_t r,
                              size_t g, const char *fname, zck_pk **out) {
  uint32_t id = zck_layout_store_id(w->train, (uint32_t)g, r);
  bool swapped = zck__ds_write_swapped(w, r, g);  /* in swap files; DeepSpeed saves it empty */
  int64_t n = swapped ? 0 : (int64_t)w->train->stores[id].numel;
  zck_store *ea_out = swapped ? NULL : &w->stores[ZCK_DS_EXP_AVG][id], *eas_out = swapped ? NULL : &w->stores[ZCK_DS_EXP_AVG_SQ][id];
  zck_pk *sd = zck_pk_new_dict(d, 0), *step, *ea, *eas;
  if (!sd) return ZCK_ERR_NO_MEMORY;
  if (w->o.step_is_tensor) {
    size_t idx;
    uint64_t off;
    float v = (float)w->o.step;
    ZCK_TRY(zck__ds_add_storage(tw, hf, ZCK_F32, 1, &v, &idx, &off));
    ZCK_TRY(zck_torch_writer_write(tw, idx, &v, sizeof v, 0));   /* whole storage, in order: CRC kept */
    if (!(step = zck_torch_writer_tensor(tw, idx, 0, NULL, NULL, 0, 0))) return ZCK_ERR_NO_MEMORY;
  } else {
    step = zck_pk_new_int(d, (int64_t)w->o.step);
  }
  char label[600];
  const char *key = w->stage == 3 ? "optimizer_state_dict" : "base_optimizer_state";
  snprintf(label, sizeof label, "%s/%s: %s['state'][%zu]['exp_avg']", w->shown, fname, key, g);
  ZCK_TRY(new_tensor(w, tw, hf, ZCK_F32, 1, &n, (uint64_t)n, 0, label, ea_out, NULL, &ea));
  snprintf(label, sizeof label, "%s/%s: %s['state'][%zu]['exp_avg_sq']", w->shown, fname, key, g);
  ZCK_TRY(new_tensor(w, tw, hf, ZCK_F32, 1, &n, (uint64_t)n, 0, label, eas_out, NULL, &eas));
  if (!put(d, sd, "step", step) || !put(d, sd, "exp_avg", ea) || !put(d, sd, "exp_avg_sq", eas)) return ZCK_ERR_NO_MEMORY;
  *out = sd;
  return ZCK_OK;
}

/* {'state': {g: ...}, 'param_groups': [...]}: the wrapped torch optimizer's state_dict(). */
static zck_status torch_optim_state(zck_ds_writer *w, zck_torch_writer *tw, zck__shash *hf, zck_pk_doc *d, uint32_t r,
                                    const char *fname, zck_pk **out) {
  zck_pk *osd = zck_pk_new_dict(d, 0), *state = zck_pk_new_dict(d, 0);
  if (!osd || !state) return ZCK_ERR_NO_MEMORY;
  for (size_t g = 0; w->o.has_optimizer_state && g < w->n_flat; g++) {
    zck_pk *sd;
    ZCK_TRY(group_state(w, tw, hf, d, r, g, fname, &sd));
    if (!put_int_key(d, state, (int64_t)g, sd)) return ZCK_ERR_NO_MEMORY;
  }
  if (!put(d, osd, "state", state) || !put(d, osd, "param_groups", param_groups(w, d))) return ZCK_ERR_NO_MEMORY;
  *out = osd;
  return ZCK_OK;
}

zck_status zck__ds_build_optim_file(zck_ds_writer *w, uint32_t r) {
  zck__ds_prefix prefix = w->lp == ZCK_BF16 ? ZCK__DS_PREFIX_BF16 : ZCK__DS_PREFIX_NONE;
  char *fname = zck__ds_optim_name_mp(prefix, r, w->o.mp_rank);
  char *path = fname ? zck__path_join(w->fdir, fname) : NULL;
  zck_status s = ZCK_OK;
  if (!path) { s = ZCK_ERR_NO_MEMORY; goto out; }
  zck__shash *hf = w->optim_h[r] = zck__shash_new();
  ZCK_CHECK_GOTO(zck_torch_writer_create_hashed(path, hf, &w->optim_w[r]), s, out);
  zck_torch_writer *tw = w->optim_w[r];
  zck_pk_doc *d = zck_torch_writer_doc(tw);
  zck_pk *root = zck_pk_new_dict(d, 0), *osd = zck_pk_new_dict(d, 0), *ls = loss_scaler(w, d);
  if (!root || !osd || !ls) goto nomem;
  zck_pk *flats = zck_pk_new_list(d), *inner = NULL;
  if (!flats) goto nomem;
  char label[600];
  const char *fkey = w->stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  if (w->o.nvme_offload && w->stage == 3) {
    ZCK_CHECK_GOTO(zck__ds_write_swap_dir(w, r), s, out);
    ZCK_CHECK_GOTO(zck__ds_write_swap_check(w, r), s, out);
  }
  for (size_t g = 0; g < w->n_flat; g++) {
    uint32_t id = zck_layout_store_id(w->train, (uint32_t)g, r);
    int64_t n = (int64_t)w->train->stores[id].lean;   /* stage 1/2: padding removed; stage 3: L_s */
    bool swapped = zck__ds_write_swapped(w, r, g);
    if (swapped) {
      ZCK_CHECK_GOTO(zck__ds_write_swap_files(w, r, g), s, out);
      n = 0;
    }
    zck_pk *t;
    snprintf(label, sizeof label, "%s/%s: %s[%zu]", w->shown, fname, fkey, g);
    ZCK_CHECK_GOTO(new_tensor(w, tw, hf, ZCK_F32, 1, &n, (uint64_t)n, w->stage <= 2, label,
                              swapped ? NULL : &w->stores[ZCK_DS_FP32][id], NULL, &t), s, out);
    if (!zck_pk_append(d, flats, t)) goto nomem;
  }
  ZCK_CHECK_GOTO(torch_optim_state(w, tw, hf, d, r, fname, &inner), s, out);
  zck_pk *dyn = zck_pk_new_bool(d, scaler_is_dynamic(ls)), *ovf = zck_pk_new_bool(d, 0);
  if (w->stage <= 2) {
    /* stage_1_and_2.py state_dict(), key order included */
    if (!put(d, osd, "loss_scaler", ls) || !put(d, osd, "dynamic_loss_scale", dyn) || !put(d, osd, "overflow", ovf) ||
        !put(d, osd, "clip_grad", zck_pk_new_float(d, w->o.clip_grad)) || !put(d, osd, "base_optimizer_state", inner) ||
        !put(d, osd, "single_partition_of_fp32_groups", flats) || !put(d, osd, "zero_stage", zero_stage_enum(d, w->stage)))
      goto nomem;
    int64_t *v = zck__calloc(w->n_flat + 1, sizeof *v);
    if (!v) goto nomem;
    for (size_t g = 0; g < w->n_flat; g++) {
      const zck_layout_store *st = &w->train->stores[zck_layout_store_id(w->train, (uint32_t)g, r)];
      v[g] = (int64_t)(st->numel - st->lean);
    }
    bool ok = put(d, osd, "group_paddings", int_list(d, v, w->n_flat));
    zck_pk *pap = zck_pk_new_list(d);
    for (size_t g = 0; ok && pap && g < w->n_flat; g++) {
      size_t n = w->flat[g].n_params;
      uint64_t *nums = zck__calloc(n + 1, sizeof *nums);
      int64_t *pads = zck__calloc(n + 1, sizeof *pads);
      if (nums && pads) {
        size_t k = 0;   /* deepspeed.moe: one EP rank's experts (the local flat) */
        for (size_t i = 0; i < n; i++) {
          uint32_t p = w->flat[g].params[i];
          if (!w->moe_other_ep || !w->moe_other_ep[p]) nums[k++] = zck__ds_flat_numel(w, p);
        }
        n = k;
        zck__ds_param_paddings(nums, n, w->o.param_align, pads);
        ok = zck_pk_append(d, pap, int_list(d, pads, n));
      } else {
        ok = false;
      }
      free(nums);
      free(pads);
    }
    for (size_t g = 0; g < w->n_flat; g++) v[g] = zck__ds_flat_count(w, g);   /* AutoEP, deepspeed.moe: experts over their edp group */
    ok = ok && put(d, osd, "param_alignment_paddings", pap) && put(d, osd, "partition_count", int_list(d, v, w->n_flat)) &&
         put(d, osd, "ds_version", S(d, w->ds_version));
    free(v);
    zck_pk *psm = zck_pk_new_list(d);
    for (size_t g = 0; ok && psm && g < w->n_flat; g++) ok = zck_pk_append(d, psm, slice_mappings(w, d, r, g));
    if (!ok || !put(d, osd, "param_slice_mappings", psm)) goto nomem;
  } else {
    /* stage3.py _rigid_state_dict() */
    if (!put(d, osd, "zero_stage", zero_stage_enum(d, 3)) || !put(d, osd, "loss_scaler", ls) ||
        !put(d, osd, "dynamic_loss_scale", dyn) || !put(d, osd, "overflow", ovf) ||
        !put(d, osd, "partition_count", zck_pk_new_int(d, w->w)) ||
        (w->o.autoep && !put(d, osd, "ds_zero_partition_groups", zck__ds_autoep_partition_groups(w, d, r))) ||
        !put(d, osd, "optimizer_state_dict", inner) ||
        !put(d, osd, "fp32_flat_groups", flats))
      goto nomem;
  }
  if (!put(d, root, "optimizer_state_dict", osd) || !put(d, root, "ds_config", ds_config(w, d)) ||
      !put(d, root, "ds_version", S(d, w->ds_version)))
    goto nomem;
  ZCK_CHECK_GOTO(zck__ds_seal_file(tw, root, &w->optim_desc[r]), s, out);
  goto out;
nomem:
  s = oom(path);
out:
  free(fname);
  free(path);
  return s;
}
