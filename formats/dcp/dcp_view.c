/* dcp_view.c: a checked DCP folder described as every job takes a source: the model
 * manifest (params, param groups and their settings), one custom layout per state kind
 * whose stores are the chunks read in place, and the consolidation recipe. */
#include "dcp_internal.h"

#include "util.h"

#include <stdlib.h>
#include <string.h>

static const char *const state_settings[ZCK_STATE_KINDS] = {
  [ZCK_STATE_EXP_AVG] = "exp_avg", [ZCK_STATE_EXP_AVG_SQ] = "exp_avg_sq",
};

/* A setting of group g of m; a "params" list names c's model weights. */
static zck_status set_setting(zck_dcp *c, zck_model *m, uint32_t g, const zck__dcp_entry *e, const zck_pk *v,
                              const char *file) {
  const char *k = e->setting;
  if (!strcmp(k, "params")) {
    if (v->kind != ZCK_PK_LIST && v->kind != ZCK_PK_TUPLE)
      return zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a list of parameter names", file, e->key);
    for (size_t i = 0; i < v->u.seq.len; i++) {
      const char *fqn = zck_pk_as_str(v->u.seq.items[i]);
      int64_t p = fqn ? zck__dcp_find_weight(c, fqn) : -1;
      if (p < 0) return zck__fail(ZCK_ERR_FORMAT, "%s: %s names %s, which is no model weight", file, e->key, fqn ? fqn : "a non-string");
      ZCK_TRY_CTX(zck_model_group_add_param(m, g, (uint32_t)p), "%s: %s", file, e->key);
    }
    return ZCK_OK;
  }
  double d;
  switch (v->kind) {
  case ZCK_PK_NONE: return zck_model_group_set_none(m, g, k);
  case ZCK_PK_BOOL: return zck_model_group_set_bool(m, g, k, v->u.b != 0);
  case ZCK_PK_INT: return zck_model_group_set_int(m, g, k, v->u.i);
  case ZCK_PK_FLOAT: return zck_model_group_set_float(m, g, k, v->u.f);
  case ZCK_PK_STR: return zck_model_group_set_string(m, g, k, v->u.str.data);
  case ZCK_PK_TUPLE:
  case ZCK_PK_LIST: {
    double f[ZCK_HP_MAX_FLOATS];
    if (v->u.seq.len > ZCK_HP_MAX_FLOATS) return ZCK_OK;   /* not a setting zckpt carries */
    for (size_t i = 0; i < v->u.seq.len; i++)
      if (!zck_pk_as_double(v->u.seq.items[i], &d)) return ZCK_OK;
      else f[i] = d;
    return zck_model_group_set_floats(m, g, k, f, (int)v->u.seq.len);
  }
  default: return ZCK_OK;   /* a tensor lr or other object: kept in the folder, not in the manifest */
  }
}

/* Param groups from the optim.param_groups.<i>.<k> bytes items. */
static zck_status read_param_groups(zck_dcp *c, const zck_dcp_open_opts *o) {
  uint32_t n_groups = 0;
  for (size_t i = 0; i < c->n_entries; i++)
    if (c->entries[i].k.kind == ZCK_DCP_KEY_PARAM_GROUP && c->entries[i].k.group + 1 > n_groups) {
      if (c->entries[i].k.group >= 1u << 16)
        return zck__fail(ZCK_ERR_LIMIT, "%s/.metadata: %s: param group index too large", c->dir, c->entries[i].key);
      n_groups = c->entries[i].k.group + 1;
    }
  for (uint32_t g = 0; g < n_groups; g++) ZCK_TRY(zck_model_add_group(c->model, NULL));
  for (size_t i = 0; i < c->n_entries; i++) {
    const zck__dcp_entry *e = &c->entries[i];
    if (e->k.kind != ZCK_DCP_KEY_PARAM_GROUP) continue;
    if (!e->is_bytes) continue;   /* a tensor setting (a tensor lr): in the folder, not the manifest */
    zck__dcp_item *it = &c->items[e->item];
    zck__dcp_item_file itf;   /* the Python value a bytes item holds: torch.save of it */
    zck_status s = zck__dcp_item_open(c, it, o, &itf);
    if (s == ZCK_OK) s = set_setting(c, c->model, e->k.group, e, zck_torch_root(itf.tf), it->win.name);
    zck__dcp_item_close(&itf);
    ZCK_TRY(s);
  }
  return ZCK_OK;
}

static bool same_hparam(const zck_hparam *a, const zck_hparam *b) {
  if (a->kind != b->kind) return false;
  switch (a->kind) {
  case ZCK_HP_BOOL:
  case ZCK_HP_INT: return a->i == b->i;
  case ZCK_HP_FLOAT: return a->f[0] == b->f[0] || (a->f[0] != a->f[0] && b->f[0] != b->f[0]);
  case ZCK_HP_FLOATS:
    if (a->n_floats != b->n_floats) return false;
    for (int i = 0; i < a->n_floats; i++)
      if (a->f[i] != b->f[i]) return false;
    return true;
  case ZCK_HP_STRING: return !strcmp(a->s, b->s);
  default: return true;
  }
}

static bool same_settings(const zck_param_group *a, const zck_param_group *b) {
  if (a->n_hparams != b->n_hparams) return false;
  for (size_t i = 0; i < a->n_hparams; i++) {
    size_t j = 0;
    while (j < b->n_hparams && strcmp(a->hparams[i].key, b->hparams[j].key)) j++;
    if (j == b->n_hparams || !same_hparam(&a->hparams[i], &b->hparams[j])) return false;
  }
  return true;
}

/* flatten_optimizer_state_dict (torchtitan) keeps each param's group settings under
 * optimizer.param_groups.<fqn>.<k> and no group structure: the params whose settings are
 * all equal form one group, groups in the order their first param has in the model,
 * params in model order (torchtitan builds one group of every param; the DeepSpeed
 * target then flattens them as that run would). Read into one scratch group per param. */
static zck_status read_param_settings(zck_dcp *c, const zck_dcp_open_opts *o) {
  zck_model *m = c->model;
  zck_model *per = zck_model_new();   /* group p: param p's settings */
  if (!per) return ZCK_ERR_NO_MEMORY;
  bool *has = zck__calloc(m->n_params ? m->n_params : 1, sizeof *has);
  zck_status s = has ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; p < m->n_params && s == ZCK_OK; p++) s = zck_model_add_group(per, NULL);
  for (size_t i = 0; i < c->n_entries && s == ZCK_OK; i++) {
    const zck__dcp_entry *e = &c->entries[i];
    if (e->k.kind != ZCK_DCP_KEY_PARAM_SETTING || !e->is_bytes) continue;
    int64_t p = zck__dcp_find_weight(c, e->fqn);
    if (p < 0) {
      s = zck__fail(ZCK_ERR_FORMAT, "%s/.metadata: %s: settings of %s, which is no model weight", c->dir, e->key, e->fqn);
      break;
    }
    zck__dcp_item *it = &c->items[e->item];
    zck__dcp_item_file itf;
    s = zck__dcp_item_open(c, it, o, &itf);
    if (s == ZCK_OK) s = set_setting(c, per, (uint32_t)p, e, zck_torch_root(itf.tf), it->win.name);
    zck__dcp_item_close(&itf);
    has[p] = true;
  }
  uint32_t *group_of = zck__malloc((m->n_params ? m->n_params : 1) * sizeof *group_of);
  if (s == ZCK_OK && !group_of) s = ZCK_ERR_NO_MEMORY;
  for (uint32_t p = 0; p < m->n_params && s == ZCK_OK; p++) {
    if (!has[p]) continue;
    uint32_t g = UINT32_MAX;
    for (uint32_t q = 0; q < p && g == UINT32_MAX; q++)
      if (has[q] && same_settings(&per->groups[p], &per->groups[q])) g = group_of[q];
    if (g == UINT32_MAX) {
      s = zck_model_add_group(m, &g);
      if (s == ZCK_OK) s = zck_model_group_copy_settings(m, g, &per->groups[p]);
    }
    group_of[p] = g;
    if (s == ZCK_OK) s = zck_model_group_add_param(m, g, p);
  }
  free(group_of);
  free(has);
  zck_model_free(per);
  return s;
}

static zck_status build_model(zck_dcp *c, const zck_dcp_open_opts *o) {
  if (!(c->model = zck_model_new())) return ZCK_ERR_NO_MEMORY;
  if (!(c->param_of_entry = zck__malloc((c->n_entries ? c->n_entries : 1) * sizeof *c->param_of_entry)))
    return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < c->n_entries; i++) {
    zck__dcp_entry *e = &c->entries[i];
    c->param_of_entry[i] = UINT32_MAX;
    if (e->k.kind != ZCK_DCP_KEY_MODEL) continue;
    ZCK_TRY_CTX(zck_model_add_param(c->model, e->fqn, e->ndim, e->shape, e->dtype, &c->param_of_entry[i]), "%s/.metadata",
                c->dir);
  }
  bool any_state = false;
  for (size_t i = 0; i < c->n_entries; i++) {
    zck__dcp_entry *e = &c->entries[i];
    if (e->k.kind != ZCK_DCP_KEY_OPTIM_STATE) continue;
    int64_t p = zck__dcp_find_weight(c, e->fqn);
    if (p < 0) return zck__fail(ZCK_ERR_FORMAT, "%s/.metadata: %s: optimizer state of %s, which is no model weight", c->dir, e->key, e->fqn);
    c->param_of_entry[i] = (uint32_t)p;
    any_state = true;
    bool moment = !strcmp(e->setting, "exp_avg") || !strcmp(e->setting, "exp_avg_sq");
    if (moment && (e->is_bytes || e->numel != c->model->params[p].numel))
      return zck__fail(ZCK_ERR_FORMAT, "%s/.metadata: %s: not a tensor of %s's %llu elements", c->dir, e->key, e->fqn,
                       (unsigned long long)c->model->params[p].numel);
  }
  ZCK_TRY(zck__dcp_note_module_names(c));
  ZCK_TRY(read_param_groups(c, o));
  if (!c->model->n_groups) ZCK_TRY(read_param_settings(c, o));
  /* trainable: in a param group or with optimizer state; a model-only save: every weight */
  bool *trainable = zck__calloc(c->model->n_params ? c->model->n_params : 1, sizeof *trainable);
  if (!trainable) return ZCK_ERR_NO_MEMORY;
  bool any_group_param = false;
  for (size_t p = 0; p < c->model->n_params; p++)
    if (c->model->params[p].group >= 0) trainable[p] = any_group_param = true;
  for (size_t i = 0; i < c->n_entries; i++)
    if (c->entries[i].k.kind == ZCK_DCP_KEY_OPTIM_STATE) trainable[c->param_of_entry[i]] = true;
  for (size_t p = 0; p < c->model->n_params; p++)
    zck_model_set_frozen(c->model, (uint32_t)p, (any_state || any_group_param) && !trainable[p]);
  free(trainable);
  return ZCK_OK;
}

/* The entries whose chunks make part `kind`'s stores. */
static bool entry_in_part(const zck_dcp *c, const zck__dcp_entry *e, size_t i, int kind) {
  if (e->is_bytes || c->param_of_entry[i] == UINT32_MAX) return false;
  bool frozen = c->model->params[c->param_of_entry[i]].frozen;
  switch (kind) {
  case ZCK_STATE_FP32: return e->k.kind == ZCK_DCP_KEY_MODEL && !frozen;
  case ZCK_STATE_FROZEN: return e->k.kind == ZCK_DCP_KEY_MODEL && frozen;
  case ZCK_STATE_EXP_AVG:
  case ZCK_STATE_EXP_AVG_SQ: return e->k.kind == ZCK_DCP_KEY_OPTIM_STATE && !strcmp(e->setting, state_settings[kind]);
  default: return false;
  }
}

/* Chunk ch of param p (store k) as pieces: its runs (back to back in the chunk) merged
 * into strided pieces while each starts one same stride after the last. A block of a 2-D
 * tensor (FSDP2 + tensor parallel: rows x some columns) is one piece whatever its rows; a
 * block cutting a deeper dimension one piece per index of the dimensions before that. */
static zck_status chunk_pieces(const zck__dcp_entry *e, const zck__dcp_chunk *ch, uint32_t p, uint32_t k, zck_piece **pc,
                               size_t *np, size_t *cap) {
  zck__dcp_runs r;
  uint64_t flat, len = ch->run_len;
  zck_piece *cur = NULL;
  zck__dcp_runs_init(&r, e->ndim, e->shape, ch);
  for (uint64_t at = 0; zck__dcp_runs_next(&r, &flat); at += len) {
    if (cur) {
      uint64_t last = zck_runs_at(cur->param_off, cur->run, cur->stride, cur->count - 1) + 1 - len;
      uint64_t step = flat - last;   /* from the start of the last run */
      bool next = flat > last && step >= len && (cur->count == len || step == cur->stride);
      if (next) {
        if (cur->count == len) cur->run = len, cur->stride = step;
        cur->count += len;
        continue;
      }
    }
    if (!ZCK__GROW(*pc, *cap, *np + 1)) return ZCK_ERR_NO_MEMORY;
    cur = &(*pc)[(*np)++];
    *cur = (zck_piece){p, k, flat, at, len, 0, 0};
  }
  return ZCK_OK;
}

static zck_status build_part(zck_dcp *c, int kind) {
  size_t n = 0, cap = 0;
  for (size_t i = 0; i < c->n_entries; i++)
    if (entry_in_part(c, &c->entries[i], i, kind)) n += c->entries[i].n_chunks;
  if (!n) return ZCK_OK;
  zck_layout_store *ls = zck__calloc(n, sizeof *ls);
  zck_piece *pc = NULL;
  zck_store *st = zck__calloc(n, sizeof *st);
  uint64_t *numel = zck__malloc((c->model->n_params ? c->model->n_params : 1) * sizeof *numel);
  zck_status s = ls && st && numel ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t k = 0, np = 0;
  for (size_t i = 0; i < c->n_entries && s == ZCK_OK; i++) {
    const zck__dcp_entry *e = &c->entries[i];
    if (!entry_in_part(c, e, i, kind)) continue;
    uint32_t p = c->param_of_entry[i];
    for (size_t j = 0; j < e->n_chunks; j++) {
      const zck__dcp_chunk *ch = &c->chunks[e->first_chunk + j];
      if (!ch->numel) continue;
      zck__dcp_item *it = &c->items[ch->item];
      ls[k] = (zck_layout_store){-1, -1, e->n_chunks == 1 ? (int32_t)p : -1, ch->numel, ch->numel};
      s = chunk_pieces(e, ch, p, (uint32_t)k, &pc, &np, &cap);
      if (s != ZCK_OK) break;
      st[k] = zck_store_source(&it->win, it->data_off, e->dtype, ch->numel, it->win.name);
      st[k].record = c->safetensors ? NULL : &it->rec;   /* safetensors keeps no CRC */
      k++;
    }
  }
  if (s == ZCK_OK) {
    zck_model_numels(c->model, numel);
    s = zck_layout_custom(c->model->n_params, numel, ls, k, pc, np, &c->layout[kind]);
  }
  free(ls);
  free(pc);
  free(numel);
  if (s == ZCK_OK) c->stores[kind] = st;
  else free(st);
  return s;
}

static zck_status build_outputs(zck_dcp *c) {
  c->outs = zck__calloc(c->model->n_params ? c->model->n_params : 1, sizeof *c->outs);
  if (!c->outs) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < c->n_entries; i++) {
    const zck__dcp_entry *e = &c->entries[i];
    if (e->k.kind != ZCK_DCP_KEY_MODEL) continue;
    uint32_t p = c->param_of_entry[i];
    const zck_param *pp = &c->model->params[p];
    c->outs[c->n_outs++] = (zck_ds_output){pp->name, pp->frozen ? ZCK_DS_OUT_FROZEN : ZCK_DS_OUT_TRAINABLE, p, -1,
                                           e->dtype, e->dtype, pp->ndim, pp->shape, pp->numel};
  }
  return ZCK_OK;
}

static void fill_info(zck_dcp *c) {
  zck_dcp_info *in = &c->info;
  in->weight_dtype = ZCK_DTYPE_INVALID;
  in->state_dtype = ZCK_DTYPE_INVALID;
  bool first = true, mixed = false;
  for (size_t p = 0; p < c->model->n_params; p++) {
    if (first) in->weight_dtype = c->model->params[p].dtype;
    else if (in->weight_dtype != c->model->params[p].dtype) mixed = true;
    first = false;
  }
  if (mixed) in->weight_dtype = ZCK_DTYPE_INVALID;
  for (size_t i = 0; i < c->n_entries; i++)
    if (entry_in_part(c, &c->entries[i], i, ZCK_STATE_EXP_AVG)) {
      in->state_dtype = c->entries[i].dtype;
      break;
    }
  /* every trainable param's moments cover it whole (build_part's layouts checked the rest) */
  bool all = c->layout[ZCK_STATE_FP32] && c->layout[ZCK_STATE_EXP_AVG] && c->layout[ZCK_STATE_EXP_AVG_SQ];
  for (size_t p = 0; all && p < c->model->n_params; p++)
    if (!c->model->params[p].frozen)
      all = zck_layout_param_covered(c->layout[ZCK_STATE_EXP_AVG], (uint32_t)p) == c->model->params[p].numel &&
            zck_layout_param_covered(c->layout[ZCK_STATE_EXP_AVG_SQ], (uint32_t)p) == c->model->params[p].numel;
  in->has_optimizer_state = all;
}

zck_status zck__dcp_describe(zck_dcp *c, const zck_dcp_open_opts *o) {
  ZCK_TRY(build_model(c, o));
  for (int k = 0; k < ZCK_STATE_KINDS; k++) ZCK_TRY(build_part(c, k));
  ZCK_TRY(build_outputs(c));
  fill_info(c);
  return ZCK_OK;
}

void zck_dcp_state(const zck_dcp *c, zck_state_view *v) {
  memset(v, 0, sizeof *v);
  v->model = c->model;
  v->name = c->dir;
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    v->part[k].layout = c->layout[k];
    v->part[k].stores = c->stores[k];
  }
}

const zck_ds_output *zck_dcp_outputs(const zck_dcp *c, size_t *n) {
  *n = c->n_outs;
  return c->outs;
}
