/* inspect_deepspeed.c: `zckpt inspect` of a DeepSpeed checkpoint, a universal folder
 * (ds_to_universal.py / `zckpt to-universal`), zckpt's HDF5 universal container or a torch
 * Distributed Checkpoint (every source a model manifest describes): stage, world size, dtypes, param groups,
 * parameters (shape, group, frozen, tied), buffers, sizes, what zero_to_fp32 would
 * produce and anything the reader warned about. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp/dcp.h"
#include "deepspeed/deepspeed.h"
#include "hdf5/zck_h5.h"
#include "tensor_set.h"
#include "universal/universal.h"

zck_status zck__inspect_deepspeed(const char *path, const zck_inspect_opts *o, FILE *out);
zck_status zck__inspect_dcp(const char *path, const zck_inspect_opts *o, FILE *out);
zck_status zck__inspect_universal(const char *path, const zck_inspect_opts *o, FILE *out);
zck_status zck__inspect_h5u(const char *path, const zck_inspect_opts *o, FILE *out);

static void zck__hparam_text(const zck_hparam *h, char *buf, size_t n) {
  switch (h->kind) {
  case ZCK_HP_NONE: snprintf(buf, n, "None"); break;
  case ZCK_HP_BOOL: snprintf(buf, n, "%s", h->i ? "True" : "False"); break;
  case ZCK_HP_INT: snprintf(buf, n, "%lld", (long long)h->i); break;
  case ZCK_HP_FLOAT: snprintf(buf, n, "%.9g", h->f[0]); break;
  case ZCK_HP_FLOATS: {
    size_t off = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < h->n_floats && off < n; i++) off += (size_t)snprintf(buf + off, n - off, "%s%.9g", i ? ", " : "", h->f[i]);
    if (off < n) snprintf(buf + off, n - off, ")");
    break;
  }
  case ZCK_HP_STRING: snprintf(buf, n, "'%s'", h->s ? h->s : ""); break;
  default: snprintf(buf, n, "?"); break;
  }
}

/* A hyperparameter as JSON: numbers, booleans, null and arrays as themselves, not as text. */
static cJSON *zck__hparam_json(const zck_hparam *h) {
  switch (h->kind) {
  case ZCK_HP_NONE: return cJSON_CreateNull();
  case ZCK_HP_BOOL: return cJSON_CreateBool(h->i != 0);
  case ZCK_HP_INT: return cJSON_CreateNumber((double)h->i);
  case ZCK_HP_FLOAT: return cJSON_CreateNumber(h->f[0]);
  case ZCK_HP_FLOATS: return cJSON_CreateDoubleArray(h->f, h->n_floats);
  case ZCK_HP_STRING: return cJSON_CreateString(h->s ? h->s : "");
  default: return cJSON_CreateNull();
  }
}

/* copy_of (NULL, or one per param): a frozen param that repeats a trainable one's bytes,
 * the way DCP saves a tied weight under each of its names. */
static void zck__inspect_model_json(cJSON *j, const zck_model *m, const int32_t *copy_of) {
  cJSON *groups = cJSON_AddArrayToObject(j, "param_groups");
  for (size_t g = 0; g < m->n_groups; g++) {
    cJSON *gj = cJSON_CreateObject();
    cJSON_AddNumberToObject(gj, "params", (double)m->groups[g].n_params);
    for (size_t h = 0; h < m->groups[g].n_hparams; h++)
      cJSON_AddItemToObject(gj, m->groups[g].hparams[h].key, zck__hparam_json(&m->groups[g].hparams[h]));
    cJSON_AddItemToArray(groups, gj);
  }
  cJSON *params = cJSON_AddArrayToObject(j, "params");
  for (size_t i = 0; i < m->n_params; i++) {
    const zck_param *p = &m->params[i];
    cJSON *pj = cJSON_CreateObject();
    cJSON_AddStringToObject(pj, "name", p->name);
    cJSON *shape = cJSON_AddArrayToObject(pj, "shape");
    for (int d = 0; d < p->ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)p->shape[d]));
    cJSON_AddStringToObject(pj, "dtype", zck_dtype_name(p->dtype));
    cJSON_AddNumberToObject(pj, "group", p->group);
    cJSON_AddBoolToObject(pj, "frozen", p->frozen);
    if (p->tied_to >= 0) cJSON_AddStringToObject(pj, "tied_to", m->params[p->tied_to].name);
    if (copy_of && copy_of[i] >= 0) cJSON_AddStringToObject(pj, "copy_of", m->params[copy_of[i]].name);
    cJSON_AddItemToArray(params, pj);
  }
  cJSON *bufs = cJSON_AddArrayToObject(j, "buffers");
  for (size_t i = 0; i < m->n_buffers; i++) {
    cJSON *bj = cJSON_CreateObject();
    cJSON_AddStringToObject(bj, "name", m->buffers[i].name);
    cJSON_AddStringToObject(bj, "dtype", zck_dtype_name(m->buffers[i].dtype));
    cJSON *shape = cJSON_AddArrayToObject(bj, "shape");
    for (int d = 0; d < m->buffers[i].ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)m->buffers[i].shape[d]));
    cJSON_AddItemToArray(bufs, bj);
  }
}

static void zck__inspect_model_text(const zck_model *m, const int32_t *copy_of, FILE *out) {
  for (size_t g = 0; g < m->n_groups; g++) {
    fprintf(out, "param group %zu: %zu params", g, m->groups[g].n_params);
    for (size_t h = 0; h < m->groups[g].n_hparams; h++) {
      char buf[128];
      const zck_hparam *hp = &m->groups[g].hparams[h];
      if (!strcmp(hp->key, "params")) continue;
      zck__hparam_text(hp, buf, sizeof buf);
      fprintf(out, ", %s=%s", hp->key, buf);
    }
    fputc('\n', out);
  }
  size_t w = 4;
  for (size_t i = 0; i < m->n_params; i++) if (strlen(m->params[i].name) > w) w = strlen(m->params[i].name);
  if (w > 60) w = 60;
  fprintf(out, "%-*s  %-9s %-20s %5s  %s\n", (int)w, "NAME", "DTYPE", "SHAPE", "GROUP", "NOTES");
  for (size_t i = 0; i < m->n_params; i++) {
    const zck_param *p = &m->params[i];
    char shape[128], notes[256] = "";
    zck_shape_str(p->ndim, p->shape, shape, sizeof shape);
    if (copy_of && copy_of[i] >= 0)
      snprintf(notes, sizeof notes, "tied: a copy of %s (same CRC-32s), no optimizer state", m->params[copy_of[i]].name);
    else if (p->frozen) strcat(notes, "frozen ");
    if (p->tied_to >= 0) snprintf(notes + strlen(notes), sizeof notes - strlen(notes), "tied to %s", m->params[p->tied_to].name);
    fprintf(out, "%-*s  %-9s %-20s %5d  %s\n", (int)w, p->name, zck_dtype_name(p->dtype), shape, p->group, notes);
  }
  for (size_t i = 0; i < m->n_buffers; i++) {
    char shape[128];
    zck_shape_str(m->buffers[i].ndim, m->buffers[i].shape, shape, sizeof shape);
    fprintf(out, "%-*s  %-9s %-20s %5s  buffer\n", (int)w, m->buffers[i].name, zck_dtype_name(m->buffers[i].dtype), shape, "-");
  }
}

/* Element counts of a model: params (a tied alias counted once, by its source) and buffers. */
typedef struct model_totals {
  uint64_t trainable, frozen, buffer_bytes;
} model_totals;

static model_totals totals_of(const zck_model *m, const int32_t *copy_of) {
  model_totals t = {0, 0, 0};
  for (size_t i = 0; i < m->n_params; i++) {
    if (m->params[i].tied_to >= 0 || (copy_of && copy_of[i] >= 0)) continue;
    if (m->params[i].frozen) t.frozen += m->params[i].numel; else t.trainable += m->params[i].numel;
  }
  for (size_t i = 0; i < m->n_buffers; i++) t.buffer_bytes += m->buffers[i].numel * zck_dtype_size(m->buffers[i].dtype);
  return t;
}

/* What a DeepSpeed checkpoint and a universal folder made from one both tell of their
 * run (zck_ds_info and zck_uv_info name these fields alike), printed alike for both. */
typedef struct run_facts {
  int stage;
  uint32_t world_size, tp_size;
  zck_dtype lp_dtype, master_dtype, state_dtype;
  bool has_optimizer_state;
  const char *ds_version;
  int64_t global_steps;
  double step;
  size_t n_flat_groups;
} run_facts;
#define RUN_FACTS_OF(in)                                                                                              \
  ((run_facts){(in)->stage, (in)->world_size, (in)->tp_size, (in)->lp_dtype, (in)->master_dtype, (in)->state_dtype,   \
               (in)->has_optimizer_state, (in)->ds_version, (in)->global_steps, (in)->step, (in)->n_flat_groups})

static void run_json(cJSON *j, const run_facts *r, const model_totals *t) {
  cJSON_AddNumberToObject(j, "stage", r->stage);
  cJSON_AddNumberToObject(j, "world_size", r->world_size);
  if (r->tp_size > 1) cJSON_AddNumberToObject(j, "tp_size", r->tp_size);
  cJSON_AddStringToObject(j, "lp_dtype", zck_dtype_name(r->lp_dtype));
  cJSON_AddStringToObject(j, "master_dtype", zck_dtype_name(r->master_dtype));
  cJSON_AddBoolToObject(j, "optimizer_state", r->has_optimizer_state);
  if (r->ds_version) cJSON_AddStringToObject(j, "ds_version", r->ds_version);
  cJSON_AddNumberToObject(j, "global_steps", (double)r->global_steps);
  cJSON_AddNumberToObject(j, "step", r->step);
  cJSON_AddNumberToObject(j, "flat_groups", (double)r->n_flat_groups);
  cJSON_AddNumberToObject(j, "trainable_elements", (double)t->trainable);
  cJSON_AddNumberToObject(j, "frozen_elements", (double)t->frozen);
}

static void run_dtypes_text(FILE *out, const run_facts *r) {
  fprintf(out, "dtypes: lp %s, master %s, optimizer state %s; DeepSpeed %s; global step %lld\n",
          zck_dtype_name(r->lp_dtype), zck_dtype_name(r->master_dtype),
          r->has_optimizer_state ? zck_dtype_name(r->state_dtype) : "absent", r->ds_version ? r->ds_version : "?",
          (long long)r->global_steps);
}

zck_status zck__inspect_deepspeed(const char *path, const zck_inspect_opts *o, FILE *out) {
  zck_ds_ckpt *c = NULL;
  ZCK_TRY(zck_ds_open(path, NULL, &c));
  const zck_ds_info *in = zck_ds_info_of(c);
  const zck_model *m = zck_ds_model(c);
  size_t n_out = 0;
  const zck_ds_output *outs = zck_ds_outputs(c, &n_out);
  const model_totals tot = totals_of(m, NULL);
  uint64_t out_bytes = 0;
  for (size_t i = 0; i < n_out; i++) if (outs[i].kind != ZCK_DS_OUT_ALIAS) out_bytes += outs[i].numel * zck_dtype_size(outs[i].dtype);
  zck_status st = ZCK_OK;
  if (o->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", path);
    cJSON_AddStringToObject(j, "format", "deepspeed");
    cJSON_AddStringToObject(j, "tag", in->tag);
    run_json(j, &RUN_FACTS_OF(in), &tot);
    cJSON_AddNumberToObject(j, "consolidated_bytes", (double)out_bytes);
    if (in->bf16_optimizer) cJSON_AddStringToObject(j, "optimizer", "BF16_Optimizer");
    if (in->ep_size > 1) cJSON_AddNumberToObject(j, "ep_size", in->ep_size);
    if (zck_ds_pipe_stages(c) > 1) cJSON_AddNumberToObject(j, "pp_size", zck_ds_pipe_stages(c));
    zck__inspect_model_json(j, m, NULL);
    cJSON *unsaved = cJSON_AddObjectToObject(j, "tied_to_unsaved");
    for (size_t i = 0; i < zck_ds_unsaved_tie_count(c); i++) {
      const char *alias, *src;
      zck_ds_unsaved_tie(c, i, &alias, &src);
      cJSON_AddStringToObject(unsaved, alias, src);
    }
    cJSON *warn = cJSON_AddArrayToObject(j, "warnings");
    for (size_t i = 0; i < in->n_warnings; i++) cJSON_AddItemToArray(warn, cJSON_CreateString(in->warnings[i]));
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory building JSON");
    else { fprintf(out, "%s\n", text); cJSON_free(text); }
  } else {
    fprintf(out, "%s: DeepSpeed ZeRO-%d checkpoint%s, tag %s, world size %u\n", path, in->stage,
            in->bf16_optimizer ? " (BF16_Optimizer)" : "", in->tag, in->world_size);
    if (in->tp_size > 1)
      fprintf(out, "AutoTP: %u tensor-parallel ranks x %u data-parallel (mp_rank_00..%02u), slices merged by the "
              "affine map; shapes below are the full tensors\n", in->tp_size, in->world_size, in->tp_size - 1);
    if (zck_ds_pipe_stages(c) > 1)
      fprintf(out, "PipelineModule: %u stages x %u data-parallel (mp_rank_00..%02u), 16-bit weights in "
              "layer_<XX>-model_states.pt, named <XX>.<key> as the module names them (a TiedLayerSpec weight once, as "
              "tied_modules.<key>.<name>)\n", zck_ds_pipe_stages(c),
              in->world_size, zck_ds_pipe_stages(c) - 1);
    if (in->ep_size > 1)
      fprintf(out, "AutoEP: %u expert-parallel ranks, experts merged; names below are the HF model's (gate_up_proj from "
              "w1 and w3, down_proj from w2, mlp.gate.weight from the router)\n", in->ep_size);
    run_dtypes_text(out, &RUN_FACTS_OF(in));
    fprintf(out, "elements: %llu trainable, %llu frozen; %zu buffers (%llu bytes); consolidated output %llu bytes\n",
            (unsigned long long)tot.trainable, (unsigned long long)tot.frozen, m->n_buffers, (unsigned long long)tot.buffer_bytes,
            (unsigned long long)out_bytes);
    zck__inspect_model_text(m, NULL, out);
    if (in->stage == 1) {
      for (size_t i = 0; i < m->n_params; i++)
        if (m->params[i].frozen) { fprintf(out, "note: ZeRO-1 saves no frozen params for zero_to_fp32; %s is not in its output\n", m->params[i].name); }
    }
    for (size_t i = 0; i < zck_ds_unsaved_tie_count(c); i++) {
      const char *alias, *src;
      zck_ds_unsaved_tie(c, i, &alias, &src);
      fprintf(out, "note: %s is tied to %s, which was not saved (exclude_frozen_parameters); not a parameter here, "
              "kept as metadata\n", alias, src);
    }
    for (size_t i = 0; i < in->n_warnings; i++) fprintf(out, "warning: %s\n", in->warnings[i]);
  }
  zck_ds_close(c);
  return st;
}

zck_status zck__inspect_universal(const char *path, const zck_inspect_opts *o, FILE *out) {
  zck_uv_ckpt *c = NULL;
  ZCK_TRY(zck_uv_open(path, NULL, &c));
  const zck_uv_info *in = zck_uv_info_of(c);
  const zck_model *m = zck_uv_model(c);
  const model_totals tot = totals_of(m, NULL);
  zck_status st = ZCK_OK;
  if (o->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", path);
    cJSON_AddStringToObject(j, "format", "universal");
    cJSON_AddStringToObject(j, "dir", in->dir);
    run_json(j, &RUN_FACTS_OF(in), &tot);
    zck__inspect_model_json(j, m, NULL);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory building JSON");
    else { fprintf(out, "%s\n", text); cJSON_free(text); }
  } else {
    fprintf(out, "%s: universal checkpoint %s, from ZeRO-%d, world size %u\n", path, in->dir, in->stage, in->world_size);
    if (in->tp_size > 1)
      fprintf(out, "AutoTP source: %u tensor-parallel ranks; full tensors (shapes: the affine map's logical shapes)\n",
              in->tp_size);
    run_dtypes_text(out, &RUN_FACTS_OF(in));
    fprintf(out, "elements: %llu trainable, %llu frozen; %zu buffers (%llu bytes)\n", (unsigned long long)tot.trainable,
            (unsigned long long)tot.frozen, m->n_buffers, (unsigned long long)tot.buffer_bytes);
    zck__inspect_model_text(m, NULL, out);
  }
  zck_uv_close(c);
  return st;
}

zck_status zck__inspect_h5u(const char *path, const zck_inspect_opts *o, FILE *out) {
  zck_h5u *u = NULL;
  /* described from its root attributes, links and checksum table: no dataset header read */
  ZCK_TRY(zck_h5u_describe(path, &u));
  const zck_h5u_info *in = zck_h5u_info_of(u);
  const zck_model *m = zck_h5u_model(u);
  const model_totals tot = totals_of(m, NULL);
  const zck_layout *l = NULL;
  const zck_store *stores = NULL;
  bool has_state = zck_h5u_get(u, ZCK_H5U_EXP_AVG, &l, &stores) == ZCK_OK;
  zck_clear_error();
  zck_status st = ZCK_OK;
  if (o->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", path);
    cJSON_AddStringToObject(j, "format", "hdf5-universal");
    if (in->tag) cJSON_AddStringToObject(j, "tag", in->tag);
    cJSON_AddNumberToObject(j, "stage", in->stage);
    cJSON_AddNumberToObject(j, "world_size", in->world_size);
    cJSON_AddBoolToObject(j, "optimizer_state", has_state);
    if (in->ds_version) cJSON_AddStringToObject(j, "ds_version", in->ds_version);
    cJSON_AddNumberToObject(j, "global_steps", (double)in->global_steps);
    cJSON_AddNumberToObject(j, "step", in->step);
    cJSON_AddNumberToObject(j, "side_files", (double)in->n_side_files);
    cJSON_AddNumberToObject(j, "trainable_elements", (double)tot.trainable);
    cJSON_AddNumberToObject(j, "frozen_elements", (double)tot.frozen);
    zck__inspect_model_json(j, m, NULL);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory building JSON");
    else { fprintf(out, "%s\n", text); cJSON_free(text); }
  } else {
    fprintf(out, "%s: zckpt HDF5 universal container%s%s, from ZeRO-%d, world size %u\n", path, in->tag ? ", tag " : "",
            in->tag ? in->tag : "", in->stage, in->world_size);
    fprintf(out, "optimizer state %s; DeepSpeed %s; global step %lld; %zu side files\n", has_state ? "present" : "absent",
            in->ds_version ? in->ds_version : "?", (long long)in->global_steps, in->n_side_files);
    fprintf(out, "elements: %llu trainable, %llu frozen; %zu buffers (%llu bytes)\n", (unsigned long long)tot.trainable,
            (unsigned long long)tot.frozen, m->n_buffers, (unsigned long long)tot.buffer_bytes);
    zck__inspect_model_text(m, NULL, out);
  }
  zck_h5u_close(u);
  return st;
}

/* A torch Distributed Checkpoint: what its metadata says, checked against its files (the
 * reader's structure checks), no tensor byte read. */
zck_status zck__inspect_dcp(const char *path, const zck_inspect_opts *o, FILE *out) {
  zck_dcp *c = NULL;
  ZCK_TRY(zck_dcp_open(path, NULL, &c));
  const zck_dcp_info *in = zck_dcp_info_of(c);
  const zck_model *m = zck_dcp_model(c);
  int32_t *copy_of = zck__calloc(m->n_params + 1, sizeof *copy_of);
  zck_status st = copy_of ? zck_dcp_ties_by_crc(c, copy_of) : ZCK_ERR_NO_MEMORY;
  if (st != ZCK_OK) {
    free(copy_of);
    zck_dcp_close(c);
    return st;
  }
  const model_totals tot = totals_of(m, copy_of);
  size_t n_out = 0;
  const zck_ds_output *outs = zck_dcp_outputs(c, &n_out);
  uint64_t out_bytes = 0;
  for (size_t i = 0; i < n_out; i++) out_bytes += outs[i].numel * zck_dtype_size(outs[i].dtype);
  if (o->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", path);
    cJSON_AddStringToObject(j, "format", "dcp");
    cJSON_AddStringToObject(j, "dir", in->dir);
    if (in->version) cJSON_AddStringToObject(j, "version", in->version);
    if (in->save_id) cJSON_AddStringToObject(j, "save_id", in->save_id);
    cJSON_AddNumberToObject(j, "files", (double)in->n_files);
    cJSON_AddNumberToObject(j, "items", (double)in->n_items);
    cJSON_AddNumberToObject(j, "data_bytes", (double)in->data_bytes);
    cJSON_AddStringToObject(j, "weight_dtype", zck_dtype_name(in->weight_dtype));
    cJSON_AddBoolToObject(j, "optimizer_state", in->has_optimizer_state);
    if (in->has_optimizer_state) cJSON_AddStringToObject(j, "state_dtype", zck_dtype_name(in->state_dtype));
    cJSON_AddNumberToObject(j, "trainable_elements", (double)tot.trainable);
    cJSON_AddNumberToObject(j, "frozen_elements", (double)tot.frozen);
    cJSON_AddNumberToObject(j, "consolidated_bytes", (double)out_bytes);
    zck__inspect_model_json(j, m, copy_of);
    cJSON *entries = cJSON_AddArrayToObject(j, "entries");
    for (size_t i = 0; i < zck_dcp_entry_count(c); i++) {
      zck_dcp_entry_info e;
      zck_dcp_entry_at(c, i, &e);
      cJSON *ej = cJSON_CreateObject();
      cJSON_AddStringToObject(ej, "key", e.key);
      if (e.is_bytes) cJSON_AddStringToObject(ej, "kind", "bytes");
      else {
        cJSON_AddStringToObject(ej, "dtype", zck_dtype_name(e.dtype));
        cJSON *shape = cJSON_AddArrayToObject(ej, "shape");
        for (int d = 0; d < e.ndim; d++) cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)e.shape[d]));
        cJSON_AddNumberToObject(ej, "chunks", (double)e.n_chunks);
      }
      cJSON_AddItemToArray(entries, ej);
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    if (!text) st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory building JSON");
    else { fprintf(out, "%s\n", text); cJSON_free(text); }
  } else {
    size_t n_bytes = in->n_bytes_entries;
    fprintf(out, "%s: torch Distributed Checkpoint %s, %zu data files, %zu items (%zu tensors, %zu bytes entries), "
            "%llu bytes\n", path, in->dir, in->n_files, in->n_items, in->n_tensors, n_bytes,
            (unsigned long long)in->data_bytes);
    fprintf(out, "dtypes: weights %s, optimizer state %s; metadata version %s; save id %s\n",
            in->weight_dtype ? zck_dtype_name(in->weight_dtype) : "mixed",
            in->has_optimizer_state ? zck_dtype_name(in->state_dtype) : "absent", in->version ? in->version : "?",
            in->save_id ? in->save_id : "?");
    uint64_t copies = 0;
    for (size_t i = 0; i < m->n_params; i++)
      if (copy_of[i] >= 0) copies += m->params[i].numel;
    fprintf(out, "elements: %llu trainable, %llu frozen (no optimizer state)", (unsigned long long)tot.trainable,
            (unsigned long long)tot.frozen);
    if (copies) fprintf(out, ", %llu in tied copies", (unsigned long long)copies);
    fprintf(out, "; consolidated output %llu bytes\n", (unsigned long long)out_bytes);
    zck__inspect_model_text(m, copy_of, out);
  }
  free(copy_of);
  zck_dcp_close(c);
  return st;
}
