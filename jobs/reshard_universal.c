/* reshard_universal.c: `zckpt reshard` from zckpt's HDF5 universal container
 * (`zckpt to-universal --format hdf5`) to a DeepSpeed checkpoint at any ZeRO stage and
 * world size. The container is described as whole-tensor layouts (fp32, exp_avg,
 * exp_avg_sq, frozen params, buffers) read by range; reshard_whole.c writes the target,
 * laid out as the source run was configured (the container's ds_config). The container
 * holds no lr_scheduler and its ds_config only as JSON: the target gets DeepSpeed's
 * defaults for those.
 * What the container cannot give (a missing dataset, a group layout the target cannot
 * express) is refused before anything is written. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hdf5/zck_h5.h"
#include "reshard_internal.h"

/* Every name of the frozen_parameters attribute has its /frozen/<name> dataset (the
 * container reader passes over a missing one, which would drop the param silently). */
static zck_status zck__h5_frozen_complete(const char *src) {
  zck_h5_file *hf = NULL;
  ZCK_TRY(zck_h5_open(src, &hf));
  char *text = NULL;
  zck_status st = zck_h5_attr_str(hf, "/", "frozen_parameters", &text);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    zck_h5_close(hf);
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
  zck_h5_close(hf);
  return st;
}

/* The container's lp_dtype attribute, or INVALID (the manifest's). */
static zck_dtype zck__h5_lp_dtype(const char *src) {
  zck_dtype lp = ZCK_DTYPE_INVALID;
  zck_h5_file *hf = NULL;
  if (zck_h5_open(src, &hf) == ZCK_OK) {
    char *s = NULL;
    if (zck_h5_attr_str(hf, "/", "lp_dtype", &s) == ZCK_OK && s) lp = zck_dtype_parse(s);
    free(s);
    zck_h5_close(hf);
  }
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

zck_status zck__reshard_from_h5(const char *src, const char *out, const zck_reshard_opts *o) {
  if (o->tag) return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a universal container, which has no tags", src);
  zck_h5u *u = NULL;
  zck_status ost = zck_h5u_open(src, &u);
  if (ost != ZCK_OK)  /* the container's own messages name the file; the manifest builder's do not */
    return strstr(zck_last_error(), src) ? ost : zck__error_prepend(ost, "%s", src);
  const zck_h5u_info *in = zck_h5u_info_of(u);
  const zck_model *m = zck_h5u_model(u);
  zck__whole_src s;
  memset(&s, 0, sizeof s);
  s.path = src;
  s.m = m;
  bool have[ZCK_H5U_PART_COUNT];
  for (int p = 0; p < ZCK_H5U_PART_COUNT; p++) {
    have[p] = zck_h5u_get(u, (zck_h5u_part)p, &s.layout[p], &s.stores[p]) == ZCK_OK;
    if (!have[p]) s.layout[p] = NULL;
  }
  zck_clear_error();
  zck_h5u_buffers(u, &s.buffer_layout, &s.buffer_stores);
  zck_ds_write_opts wo = ZCK_DS_WRITE_OPTS_INIT;
  wo.stage = o->to_stage ? o->to_stage : in->stage;
  wo.world_size = o->to_world_size ? o->to_world_size : in->world_size;
  uint64_t sgs = 1000000000ull;
  zck__h5_config(in->ds_config_json, &wo, &sgs);
  wo.sub_group_size = o->sub_group_size ? o->sub_group_size : sgs != 1000000000ull ? sgs : 0;
  wo.lp_dtype = zck__h5_lp_dtype(src);
  wo.global_steps = in->global_steps;
  wo.skipped_steps = in->skipped_steps;
  wo.global_samples = in->global_samples;
  wo.step = in->step;
  wo.step_is_tensor = in->step_is_tensor;
  wo.ds_version = in->ds_version;
  wo.has_optimizer_state = have[ZCK_H5U_EXP_AVG] && have[ZCK_H5U_EXP_AVG_SQ];
  zck_status st = ZCK_OK;
  if (!have[ZCK_H5U_FP32]) st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no fp32 master weights in the container", src);
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
  if (st == ZCK_OK) st = zck__h5_frozen_complete(src);
  if (st == ZCK_OK) st = zck__reshard_check(src, m, &wo, wo.has_optimizer_state, o);
  if (st == ZCK_OK) st = zck__reshard_whole(&s, &wo, out, o);
  zck_h5u_close(u);
  return st;
}
