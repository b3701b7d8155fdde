/* reshard_universal.c: `zckpt reshard` from zckpt's HDF5 universal container
 * (`zckpt to-universal --format hdf5`) to a DeepSpeed checkpoint at any ZeRO stage and
 * world size. The container is described as whole-tensor layouts (fp32, exp_avg,
 * exp_avg_sq, frozen params, buffers) read by range; reshard_whole.c writes the target,
 * laid out as the source run was configured. The container's /resume_state pickle gives
 * the writer the source's own ds_config, lr_scheduler, loss scaler, module metadata and
 * layout switches, so the target is byte for byte the reshard of the source checkpoint;
 * a container written before /resume_state existed is still read, its target getting
 * the JSON ds_config's layout switches and DeepSpeed's defaults for the rest
 * (lr_scheduler None, a static loss scale of 1, a minimal ds_config).
 * What the container cannot give (a missing dataset, a group layout the target cannot
 * express) is refused before anything is written. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5/zck_h5.h"
#include "reshard_internal.h"
#include "source.h"

/* Every name of the frozen_parameters attribute has its /frozen/<name> dataset (the
 * container reader passes over a missing one, which would drop the param silently). */
static zck_status zck__h5_frozen_complete(const char *src, zck_h5_file *hf) {
  char *text = NULL;
  zck_status st = zck_h5_attr_str(hf, "/", "frozen_parameters", &text);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    return ZCK_OK;
  }
  cJSON *j = st == ZCK_OK ? cJSON_Parse(text) : NULL;
  const cJSON *it;
  cJSON_ArrayForEach(it, j) {
    if (st != ZCK_OK || !cJSON_IsString(it)) continue;
    char *p = zck_h5u_path(ZCK_H5U_FROZEN, it->valuestring);
    if (!p) st = ZCK_ERR_NO_MEMORY;
    else if (!zck_h5_exists(hf, p))
      st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: dataset %s missing for frozen parameter %s", src, p, it->valuestring);
    free(p);
  }
  cJSON_Delete(j);
  free(text);
  return st;
}

/* The container's lp_dtype attribute, or INVALID (the manifest's). */
static zck_dtype zck__h5_lp_dtype(zck_h5_file *hf) {
  zck_dtype lp = ZCK_DTYPE_INVALID;
  char *s = NULL;
  if (zck_h5_attr_str(hf, "/", "lp_dtype", &s) == ZCK_OK && s) lp = zck_dtype_parse(s);
  free(s);
  zck_clear_error();
  return lp;
}

/* The layout options of the source run, from the container's ds_config (JSON), as the
 * DeepSpeed reader takes them from the pickled one: sub_group_size, round_robin_gradients,
 * parameter_alignment, gradient_clipping. A target laid out otherwise would not match the
 * flat buffers of an engine configured like the source. */
static void zck__h5_config(const char *json, zck_ds_write_opts *wo, uint64_t *sub_group_size) {
  cJSON *cfg = json ? cJSON_Parse(json) : NULL;
  const cJSON *zo = cJSON_GetObjectItemCaseSensitive(cfg, "zero_optimization");
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(zo, "sub_group_size");
  if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble < 1e18) *sub_group_size = (uint64_t)v->valuedouble;
  v = cJSON_GetObjectItemCaseSensitive(zo, "round_robin_gradients");
  if (cJSON_IsBool(v)) wo->round_robin = cJSON_IsTrue(v);
  v = cJSON_GetObjectItemCaseSensitive(zo, "parameter_alignment");
  if (cJSON_IsTrue(v)) wo->param_align = 2;   /* on: the writer takes DeepSpeed's multiple for the dtype */
  v = cJSON_GetObjectItemCaseSensitive(cfg, "gradient_clipping");
  if (cJSON_IsNumber(v)) wo->clip_grad = v->valuedouble;
  cJSON_Delete(cfg);
}

/* The container's /resume_state pickle (zck_h5.h) into *doc, its root a dict; *doc stays
 * NULL for a container written before it (the target then gets DeepSpeed's defaults). */
static zck_status zck__h5_resume_load(const char *src, zck_h5_file *hf, zck_pk_doc **doc) {
  *doc = NULL;
  if (!zck_h5_exists(hf, ZCK_H5U_RESUME_STATE)) return ZCK_OK;
  const char *path = ZCK_H5U_RESUME_STATE;
  zck_h5_dataset *d = NULL;
  uint8_t *buf = NULL;
  char *name = NULL;
  zck_status st = zck_h5_dataset_open(hf, path, &d);
  const zck_h5_dataset_info *di = st == ZCK_OK ? zck_h5_dataset_info_of(d) : NULL;
  if (di && (di->ndim != 1 || (di->dtype != ZCK_U8 && di->dtype != ZCK_I8)))
    st = zck__fail(ZCK_ERR_FORMAT, "%s:%s: not a 1-d uint8 dataset", src, path);
  else if (di && (!di->numel || di->numel > ZCK_H5U_RESUME_STATE_MAX))
    st = zck__fail(ZCK_ERR_LIMIT, "%s:%s: %llu bytes (a pickle of 1 to %llu bytes expected)", src, path,
                   (unsigned long long)di->numel, (unsigned long long)ZCK_H5U_RESUME_STATE_MAX);
  if (st == ZCK_OK && !(buf = zck__malloc((size_t)di->numel))) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck_h5_dataset_read(d, buf, 0, di->numel);
  if (st == ZCK_OK && !(name = zck__sprintf("%s:%s", src, path))) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck_pickle_load(buf, (size_t)di->numel, name, NULL, doc);
  if (st == ZCK_OK && zck_pk_doc_root(*doc)->kind != ZCK_PK_DICT)
    st = zck__fail(ZCK_ERR_FORMAT, "%s: not a pickled dict", name);
  if (st != ZCK_OK) {
    zck_pk_doc_free(*doc);
    *doc = NULL;
  }
  free(name);
  free(buf);
  zck_h5_dataset_close(d);
  return st;
}

/* The resume state's entries into wo, as zck_ds_write_opts_from takes them from a
 * DeepSpeed source; an absent key keeps what the attributes gave. The objects borrow from
 * doc. A scalar of the wrong type is refused (its key named). */
static zck_status zck__h5_resume_apply(const char *src, const zck_pk *root, zck_ds_write_opts *wo, uint64_t *sgs) {
  const zck_pk *v;
  v = zck_pk_dict_get(root, "ds_config");
  if (v && v->kind != ZCK_PK_NONE) wo->ds_config = v;
  v = zck_pk_dict_get(root, "lr_scheduler");
  if (v && v->kind != ZCK_PK_NONE) wo->lr_scheduler = v;
  v = zck_pk_dict_get(root, "loss_scaler");
  if (v && v->kind != ZCK_PK_NONE) wo->loss_scaler = v;
  v = zck_pk_dict_get(root, "module_metadata");
  if (v && v->kind != ZCK_PK_NONE) wo->module_attrs = v;
  const char *bad = NULL;
  int64_t i;
  if ((v = zck_pk_dict_get(root, "clip_grad")) && !zck_pk_as_double(v, &wo->clip_grad)) bad = "clip_grad";
  if ((v = zck_pk_dict_get(root, "round_robin_gradients"))) {
    if (v->kind == ZCK_PK_BOOL) wo->round_robin = v->u.b != 0;
    else bad = "round_robin_gradients";
  }
  if ((v = zck_pk_dict_get(root, "parameter_alignment"))) {
    if (zck_pk_as_int(v, &i) && i >= 0 && i <= 1 << 20) wo->param_align = (uint32_t)i;
    else bad = "parameter_alignment";
  }
  if ((v = zck_pk_dict_get(root, "sub_group_size"))) {
    if (zck_pk_as_int(v, &i) && i >= 0 && i < (int64_t)1000000000000000000) *sgs = i ? (uint64_t)i : 1000000000ull;
    else bad = "sub_group_size";
  }
  if ((v = zck_pk_dict_get(root, "step_ahead"))) {  /* ZeRO-0 bf16 sources (deepspeed.h info.step_ahead) */
    if (zck_pk_as_int(v, &i) && i >= 0 && i <= 1) wo->step_ahead = i;
    else bad = "step_ahead";
  }
  if (bad) return zck__fail(ZCK_ERR_FORMAT, "%s:%s: %s has the wrong type or range", src, ZCK_H5U_RESUME_STATE, bad);
  return ZCK_OK;
}

/* The container's params in the source's module order (resume_state's module_params):
 * a copy of the manifest with the params permuted and whole layouts over it, so the
 * target's `module` lists them as a reshard of the source does. */
typedef struct zck__h5_order {
  zck_model *m;
  zck_layout *layout[4];
} zck__h5_order;

static void zck__h5_order_free(zck__h5_order *o) {
  zck_model_free(o->m);
  for (int p = 0; p < 4; p++) zck_layout_free(o->layout[p]);
}

static zck_status zck__h5_group_copy(zck_model *dst, uint32_t g, const zck_param_group *pg, const uint32_t *map) {
  for (size_t i = 0; i < pg->n_params; i++) ZCK_TRY(zck_model_group_add_param(dst, g, map[pg->params[i]]));
  for (size_t i = 0; i < pg->n_hparams; i++) {
    const zck_hparam *h = &pg->hparams[i];
    switch (h->kind) {
    case ZCK_HP_BOOL: ZCK_TRY(zck_model_group_set_bool(dst, g, h->key, h->i != 0)); break;
    case ZCK_HP_INT: ZCK_TRY(zck_model_group_set_int(dst, g, h->key, h->i)); break;
    case ZCK_HP_FLOAT: ZCK_TRY(zck_model_group_set_float(dst, g, h->key, h->f[0])); break;
    case ZCK_HP_FLOATS: ZCK_TRY(zck_model_group_set_floats(dst, g, h->key, h->f, h->n_floats)); break;
    case ZCK_HP_STRING: ZCK_TRY(zck_model_group_set_string(dst, g, h->key, h->s)); break;
    default: ZCK_TRY(zck_model_group_set_none(dst, g, h->key)); break;
    }
  }
  return ZCK_OK;
}

static zck_status zck__h5_reorder(const char *src, const zck_pk *names, zck__whole_src *s, zck__h5_order *o) {
  const zck_model *m = s->m;
  if (names->kind != ZCK_PK_LIST || names->u.seq.len != m->n_params)
    return zck__fail(ZCK_ERR_FORMAT, "%s:%s: module_params does not list the container's %zu params", src,
                     ZCK_H5U_RESUME_STATE, m->n_params);
  uint32_t *map = zck__calloc(m->n_params + 1, sizeof *map);   /* old index -> new */
  uint64_t *numel = zck__calloc(m->n_params + 1, sizeof *numel);
  uint32_t *idx = NULL;
  zck_status st = map && numel && (o->m = zck_model_new()) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < m->n_params; i++) {
    const char *n = zck_pk_as_str(names->u.seq.items[i]);
    int64_t p = n ? zck_model_find_param(m, n) : -1;
    if (p < 0) {
      st = zck__fail(ZCK_ERR_FORMAT, "%s:%s: module_params names %s, which the container lacks", src, ZCK_H5U_RESUME_STATE,
                     n ? n : "a non-string");
      break;
    }
    const zck_param *pa = &m->params[p];
    uint32_t q;
    st = zck_model_add_param(o->m, pa->name, pa->ndim, pa->shape, pa->dtype, &q);   /* a duplicate fails here */
    if (st == ZCK_OK) zck_model_set_frozen(o->m, q, pa->frozen);
    map[p] = q;
  }
  for (size_t p = 0; st == ZCK_OK && p < m->n_params; p++)
    if (m->params[p].tied_to >= 0) st = zck_model_set_tied(o->m, map[p], map[m->params[p].tied_to]);
  for (size_t g = 0; st == ZCK_OK && g < m->n_groups; g++) {
    uint32_t ng;
    st = zck_model_add_group(o->m, &ng);
    if (st == ZCK_OK) st = zck__h5_group_copy(o->m, ng, &m->groups[g], map);
  }
  for (size_t b = 0; st == ZCK_OK && b < m->n_buffers; b++) {
    const zck_buffer *bu = &m->buffers[b];
    st = zck_model_add_buffer(o->m, bu->name, bu->ndim, bu->shape, bu->dtype, NULL);
  }
  if (st == ZCK_OK) zck_model_numels(o->m, numel);
  for (int p = 0; st == ZCK_OK && p < 4; p++) {
    const zck_layout *l = s->layout[p];
    if (!l) continue;
    if (!(idx = zck__realloc(idx, (l->n_stores + 1) * sizeof *idx))) st = ZCK_ERR_NO_MEMORY;
    for (size_t i = 0; st == ZCK_OK && i < l->n_stores; i++) idx[i] = map[l->stores[i].param];
    if (st == ZCK_OK) st = zck_layout_whole(o->m->n_params, numel, idx, l->n_stores, &o->layout[p]);
    if (st == ZCK_OK) s->layout[p] = o->layout[p];
  }
  if (st == ZCK_OK) s->m = o->m;
  free(idx);
  free(numel);
  free(map);
  return st;
}

/* The container's /side_files into the output root, kept as for a DeepSpeed source's
 * root (rng_state_<r>.pth of ranks below the target world size, every other file). */
static zck_status zck__h5_side_write(void *ctx, const char *dst, uint32_t world) {
  const zck_h5u *u = ctx;
  for (size_t i = 0; i < zck_h5u_info_of(u)->n_side_files; i++) {
    const char *n = zck_h5u_side_file_name(u, i);
    if (!zck__reshard_side_kept(n, world)) continue;
    char *p = zck__path_join(dst, n);
    zck_status st = p ? zck_h5u_side_file_write(u, i, p) : ZCK_ERR_NO_MEMORY;
    free(p);
    ZCK_TRY(st);
  }
  return ZCK_OK;
}

void zck__whole_src_h5(const zck_h5u *u, const char *src, zck__whole_src *s, bool have[4]) {
  memset(s, 0, sizeof *s);
  s->path = src;
  s->m = zck_h5u_model(u);
  for (int p = 0; p < ZCK_H5U_PART_COUNT; p++) {
    have[p] = zck_h5u_get(u, (zck_h5u_part)p, &s->layout[p], &s->stores[p]) == ZCK_OK;
    if (!have[p]) s->layout[p] = NULL;
  }
  zck_clear_error();   /* a part the container lacks is NULL */
  zck_h5u_buffers(u, &s->buffer_layout, &s->buffer_stores);
}

zck_status zck__reshard_from_h5(const zck__src *source, const char *out, const zck_reshard_opts *o) {
  const char *src = source->dir;
  zck_h5u *u = source->h5;
  const zck_h5u_info *in = zck_h5u_info_of(u);
  const zck_model *m = zck_h5u_model(u);
  zck__whole_src s;
  bool have[ZCK_H5U_PART_COUNT];
  zck__whole_src_h5(u, src, &s, have);
  s.side_write = zck__h5_side_write;   /* the source's HF / Accelerate files */
  s.side_ctx = u;
  if (!o->to_stage && in->stage == 0) {
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: the container holds a ZeRO-0 checkpoint, resharded into a ZeRO "
                     "stage: pass --to-stage 1, 2 or 3", src);
  }
  zck_ds_write_opts wo = ZCK_DS_WRITE_OPTS_INIT;
  wo.stage = o->to_stage ? o->to_stage : in->stage;
  wo.world_size = o->to_world_size ? o->to_world_size : in->world_size;
  wo.tag = in->tag;   /* the source's tag, as its reshard keeps it; NULL: global_step<N> */
  uint64_t sgs = 1000000000ull;
  zck__h5_config(in->ds_config_json, &wo, &sgs);
  wo.lp_dtype = zck__h5_lp_dtype(zck_h5u_file(u));   /* clears the error state: before anything that may fail */
  zck_pk_doc *rs = NULL;
  zck_status st = zck__h5_resume_load(src, zck_h5u_file(u), &rs);
  if (st == ZCK_OK && rs) st = zck__h5_resume_apply(src, zck_pk_doc_root(rs), &wo, &sgs);
  wo.sub_group_size = o->sub_group_size ? o->sub_group_size : sgs != 1000000000ull ? sgs : 0;
  wo.global_steps = in->global_steps;
  wo.skipped_steps = in->skipped_steps;
  wo.global_samples = in->global_samples;
  wo.step = in->step;
  wo.step_is_tensor = in->step_is_tensor;
  wo.ds_version = in->ds_version;
  wo.has_optimizer_state = have[ZCK_H5U_EXP_AVG] && have[ZCK_H5U_EXP_AVG_SQ];
  wo.unsaved_ties = in->unsaved_ties;   /* exclude_frozen_parameters (HF + PEFT), as from the source */
  wo.n_unsaved_ties = in->n_unsaved_ties;
  wo.exclude_frozen = in->exclude_frozen;
  if (st == ZCK_OK && !have[ZCK_H5U_FP32]) st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no fp32 master weights in the container", src);
  /* every trainable param has all three states (the reader opens each dataset it lists) */
  for (size_t p = 0; st == ZCK_OK && p < m->n_params; p++) {
    const zck_param *pa = &m->params[p];
    if (pa->frozen || pa->tied_to >= 0 || !pa->numel) continue;
    for (int k = 0; st == ZCK_OK && k < 3; k++)
      if (s.layout[k] && zck_layout_param_covered(s.layout[k], (uint32_t)p) != pa->numel) {
        char *ds = zck_h5u_path((zck_h5u_part)k, pa->name);
        st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: dataset %s missing", src, ds ? ds : pa->name);
        free(ds);
      }
  }
  if (st == ZCK_OK) st = zck__h5_frozen_complete(src, zck_h5u_file(u));
  /* after the checks above, which name what is missing better than a count would */
  zck__h5_order ord;
  memset(&ord, 0, sizeof ord);
  const zck_pk *order = rs ? zck_pk_dict_get(zck_pk_doc_root(rs), "module_params") : NULL;
  if (st == ZCK_OK && order && s.layout[0]) st = zck__h5_reorder(src, order, &s, &ord);
  m = s.m;
  if (st == ZCK_OK) st = zck__reshard_check(src, m, &wo, wo.has_optimizer_state, o);
  if (st == ZCK_OK && o->to_tp_size > 1) {
    /* AutoTP files: the container keeps no affine map, so the split is DeepSpeed's from the
     * model config (its /side_files/config.json: HF Trainer's, or --model-config) */
    zck_state_view view;
    zck__whole_state(&s, &view);
    zck__autotp_src as = {src, &view, m, NULL, 1, NULL, NULL, zck__h5_side_write, u, "/side_files/config.json"};
    st = zck__reshard_autotp(&as, &wo, out, o);
  } else if (st == ZCK_OK) {
    st = zck__reshard_whole(&s, &wo, out, o);
  }
  if (st == ZCK_OK) zck__job_summary_fill(o->summary, out, m->n_params);
  zck__h5_order_free(&ord);
  zck_pk_doc_free(rs);
  return st;
}
