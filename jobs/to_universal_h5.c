/* to_universal_h5.c: `zckpt to-universal --format hdf5`: the checkpoint as one HDF5 file.
 *
 * Layout and attributes: formats/hdf5/zck_h5.h ("the zckpt universal container"): every
 * param's fp32 / exp_avg / exp_avg_sq, frozen params and buffers as datasets; counters,
 * step, param groups, names, shapes, tied aliases and the ds_config (JSON) as attributes;
 * and /resume_state, a pickle of what else a resumed DeepSpeed run reads (the source's
 * ds_config, lr_scheduler, loss scaler, module metadata and param order, clip_grad and
 * layout switches), so `zckpt reshard` of the container writes, byte for byte, the
 * checkpoint a reshard of the source writes (tests/reshard/test_reshard_universal.c).
 * Containers written before /resume_state are still read (lr_scheduler None). One
 * executor run copies every part (fp32, exp_avg, exp_avg_sq of the trainable params,
 * frozen params, buffers) from the rank files into dataset stores. The plans are ordered
 * by destination, so each dataset is filled front to back and only a few chunks per
 * thread wait in assembly; each chunk is compressed by the thread that completes it.
 * The save root's other files (an HF checkpoint-N/'s rng_state_<r>.pth, trainer_state.json,
 * ...) go into /side_files byte for byte, so the reshard of the container carries them
 * over as the reshard of the source does (the same files: jobs/reshard.c). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hdf5/zck_h5.h"
#include "plan.h"
#include "to_universal.h"
#include "universal/universal.h"

typedef struct zck__uvh_job {
  zck_layout *dst_layout;
  zck_plan *plan;
  zck_store *dst;
  zck_dtype dtype;   /* every dataset's dtype when they share one, else INVALID */
} zck__uvh_job;

/* Datasets for params[0..n) of part (whole tensors, their own dtype unless `as`), and the
 * plan filling them from view. */
static zck_status zck__uvh_part(zck_h5_writer *w, const zck_model *m, const zck_ds_view *view, zck_h5u_part part,
                                const uint32_t *params, size_t n, zck__uvh_job *j) {
  memset(j, 0, sizeof *j);
  if (!n) return ZCK_OK;
  uint64_t *numel = zck__calloc(m->n_params ? m->n_params : 1, sizeof *numel);
  j->dst = zck__calloc(n, sizeof *j->dst);
  zck_status st = numel && j->dst ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) zck_model_numels(m, numel);
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck_param *p = &m->params[params[i]];
    char *path = zck_h5u_path(part, p->name);
    /* the dtype of the store holding the param's first piece */
    const zck_layout *l = view->layout;
    size_t pf = l->param_first[params[i]];
    zck_dtype dt = pf < l->param_first[params[i] + 1] ? view->stores[l->pieces[pf].store].dtype : view->stores[0].dtype;
    st = path ? zck_h5_writer_dataset(w, path, dt, p->ndim, p->shape, &j->dst[i]) : ZCK_ERR_NO_MEMORY;
    free(path);
    j->dtype = !i || j->dtype == dt ? dt : ZCK_DTYPE_INVALID;
  }
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.order = ZCK_PLAN_BY_DST;
  if (st == ZCK_OK) st = zck_layout_whole(m->n_params, numel, params, n, &j->dst_layout);
  if (st == ZCK_OK) st = zck_plan_build(view->layout, j->dst_layout, &po, &j->plan);
  free(numel);
  return st;
}

static void zck__uvh_job_free(zck__uvh_job *j) {
  zck_plan_free(j->plan);
  zck_layout_free(j->dst_layout);
  free(j->dst);
}

static zck_status zck__uvh_buffers(zck_h5_writer *w, const zck_model *m, const zck_ds_view *view, zck__uvh_job *j) {
  memset(j, 0, sizeof *j);
  if (!view->layout || !m->n_buffers) return ZCK_OK;
  size_t n = m->n_buffers;
  j->dst = zck__calloc(n, sizeof *j->dst);
  uint64_t *numel = zck__calloc(n, sizeof *numel);
  zck_status st = j->dst && numel ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck_buffer *b = &m->buffers[i];
    numel[i] = b->numel;
    char *path = zck_h5u_buffer_path(b->name);
    st = path ? zck_h5_writer_dataset(w, path, view->stores[i].dtype, b->ndim, b->shape, &j->dst[i]) : ZCK_ERR_NO_MEMORY;
    free(path);
  }
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.order = ZCK_PLAN_BY_DST;
  if (st == ZCK_OK) st = zck_layout_whole(n, numel, NULL, n, &j->dst_layout);
  if (st == ZCK_OK) st = zck_plan_build(view->layout, j->dst_layout, &po, &j->plan);
  free(numel);
  return st;
}

static zck_status zck__uvh_attr_json(zck_h5_writer *w, const char *key, cJSON *j) {
  if (!j) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  if (!text) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  zck_status st = zck_h5_writer_attr_str(w, "/", key, text);
  cJSON_free(text);
  return st;
}

static cJSON *zck__uvh_shape_json(int ndim, const int64_t *shape) {
  cJSON *a = cJSON_CreateArray();
  for (int d = 0; a && d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
  return a;
}

static cJSON *zck__uvh_hparam_json(const zck_hparam *h) {
  switch (h->kind) {
  case ZCK_HP_BOOL: return cJSON_CreateBool(h->i != 0);
  case ZCK_HP_INT: return cJSON_CreateNumber((double)h->i);
  case ZCK_HP_FLOAT: return cJSON_CreateNumber(h->f[0]);
  case ZCK_HP_FLOATS: {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < h->n_floats; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(h->f[i]));
    return a;
  }
  case ZCK_HP_STRING: return cJSON_CreateString(h->s);
  default: return cJSON_CreateNull();
  }
}

/* part_dtypes (zck_h5.h): the dtype of every dataset of a trainable part, for the parts
 * whose datasets share one, so a reader can describe the params without their headers. */
static zck_status zck__uvh_part_dtypes(zck_h5_writer *w, const zck__uvh_job *jobs, size_t n_flat) {
  if (!n_flat) return ZCK_OK;
  static const char *const keys[3] = {"fp32", "exp_avg", "exp_avg_sq"};
  cJSON *o = cJSON_CreateObject();
  for (int k = 0; o && k < 3; k++)
    if (jobs[k].dtype != ZCK_DTYPE_INVALID) cJSON_AddStringToObject(o, keys[k], zck_dtype_name(jobs[k].dtype));
  return zck__uvh_attr_json(w, "part_dtypes", o);
}

/* autoep_layers: an AutoEP source's ds_autoep_layers (rank 0's), so that a reader knows the experts' layout
 * (and a reshard of the container, which would not write it, refuses it by name). */
static zck_status zck__uvh_autoep(zck_h5_writer *w, const zck_ds_ckpt *ck) {
  const zck_pk *root = zck_torch_root(zck_ds_rank0_model(ck));
  const zck_pk *l = zck_pk_dict_get(root, "ds_autoep_layers");
  if (!l || l->kind == ZCK_PK_NONE) l = zck_pk_dict_get(root, "autoep_layers");   /* the older name */
  size_t budget = ZCK__UVJ_JSON_VALUES;
  cJSON *j = l ? zck__uvj_pk_json(l, 0, &budget) : NULL;
  if (!j || !budget) {   /* the reader took this list at open: not reached for a file it accepted */
    cJSON_Delete(j);
    return zck__fail(ZCK_ERR_FORMAT, "%s: ds_autoep_layers cannot be kept in the container", zck_ds_model_file(ck, 0).path);
  }
  return zck__uvh_attr_json(w, "autoep_layers", j);
}

static zck_status zck__uvh_attrs(zck_h5_writer *w, const zck_ds_ckpt *ck, const char *src, const uint32_t *flat,
                                 size_t n_flat) {
  const zck_ds_info *info = zck_ds_info_of(ck);
  const zck_model *m = zck_ds_model(ck);
  ZCK_TRY(zck_h5_writer_attr_str(w, "/", "zckpt_format", ZCK_H5U_FORMAT));
  ZCK_TRY(zck_h5_writer_attr_i64(w, "/", "zckpt_format_version", ZCK_H5U_VERSION));
  ZCK_TRY(zck_h5_writer_attr_i64(w, "/", "stage", info->stage));
  ZCK_TRY(zck_h5_writer_attr_i64(w, "/", "world_size", info->world_size));
  ZCK_TRY(zck_h5_writer_attr_i64(w, "/", "global_steps", info->global_steps));
  ZCK_TRY(zck_h5_writer_attr_i64(w, "/", "skipped_steps", info->skipped_steps));
  ZCK_TRY(zck_h5_writer_attr_i64(w, "/", "global_samples", info->global_samples));
  ZCK_TRY(zck_h5_writer_attr_f64(w, "/", "step", info->step));
  ZCK_TRY(zck_h5_writer_attr_i64(w, "/", "step_is_tensor", info->step_is_tensor));
  ZCK_TRY(zck_h5_writer_attr_str(w, "/", "ds_version", info->ds_version ? info->ds_version : ""));
  ZCK_TRY(zck_h5_writer_attr_str(w, "/", "lp_dtype", zck_dtype_name(info->lp_dtype)));
  ZCK_TRY(zck_h5_writer_attr_str(w, "/", "master_dtype", zck_dtype_name(info->master_dtype)));
  ZCK_TRY(zck_h5_writer_attr_str(w, "/", "state_dtype", zck_dtype_name(info->state_dtype)));
  ZCK_TRY(zck_h5_writer_attr_str(w, "/", "source", src));
  ZCK_TRY(zck_h5_writer_attr_str(w, "/", "tag", info->tag ? info->tag : ""));
  cJSON *names = cJSON_CreateArray(), *shapes = cJSON_CreateObject();
  for (size_t i = 0; names && shapes && i < n_flat; i++) {
    const zck_param *p = &m->params[flat[i]];
    cJSON_AddItemToArray(names, cJSON_CreateString(p->name));
    cJSON_AddItemToObject(shapes, p->name, zck__uvh_shape_json(p->ndim, p->shape));
  }
  cJSON *tied = cJSON_CreateObject(), *frozen = cJSON_CreateArray(), *bufs = cJSON_CreateArray();
  for (size_t i = 0; tied && frozen && i < m->n_params; i++) {
    const zck_param *p = &m->params[i];
    if (p->tied_to >= 0) cJSON_AddItemToObject(tied, p->name, cJSON_CreateString(m->params[p->tied_to].name));
    else if (p->frozen) cJSON_AddItemToArray(frozen, cJSON_CreateString(p->name));
  }
  for (size_t i = 0; bufs && i < m->n_buffers; i++) cJSON_AddItemToArray(bufs, cJSON_CreateString(m->buffers[i].name));
  cJSON *groups = cJSON_CreateArray();
  for (size_t g = 0; groups && g < m->n_groups; g++) {
    cJSON *o = cJSON_CreateObject(), *ps = cJSON_CreateArray(), *hp = cJSON_CreateObject();
    const zck_param_group *pg = &m->groups[g];
    size_t nt = zck_model_group_trainable(m, (uint32_t)g, NULL, 0);
    uint32_t *idx = zck__malloc((nt ? nt : 1) * sizeof *idx);
    if (idx) zck_model_group_trainable(m, (uint32_t)g, idx, nt);
    for (size_t i = 0; idx && ps && i < nt; i++) cJSON_AddItemToArray(ps, cJSON_CreateString(m->params[idx[i]].name));
    free(idx);
    /* JSON numbers do not say int or float: the ints are named beside them (FusedAdam's
     * param_groups 'step': 0 must come back an int for the reshard to be the direct one) */
    cJSON *ints = NULL;
    for (size_t i = 0; hp && i < pg->n_hparams; i++) {
      cJSON_AddItemToObject(hp, pg->hparams[i].key, zck__uvh_hparam_json(&pg->hparams[i]));
      if (pg->hparams[i].kind == ZCK_HP_INT && (ints || (ints = cJSON_CreateArray())))
        cJSON_AddItemToArray(ints, cJSON_CreateString(pg->hparams[i].key));
    }
    if (o) {
      cJSON_AddItemToObject(o, "params", ps);
      cJSON_AddItemToObject(o, "hyperparameters", hp);
      if (ints) cJSON_AddItemToObject(o, "int_hyperparameters", ints);
      cJSON_AddItemToArray(groups, o);
    } else {
      cJSON_Delete(ints);
    }
  }
  zck_status st = zck__uvh_attr_json(w, "param_names", names);
  if (st == ZCK_OK) st = zck__uvh_attr_json(w, "param_shapes", shapes);
  else cJSON_Delete(shapes);
  if (st == ZCK_OK) st = zck__uvh_attr_json(w, "tied_parameters", tied);
  else cJSON_Delete(tied);
  if (st == ZCK_OK) st = zck__uvh_attr_json(w, "frozen_parameters", frozen);
  else cJSON_Delete(frozen);
  /* saved with exclude_frozen_parameters (HF + PEFT): the tied aliases whose source was not
   * saved, which a reshard keeps in shared_params, and the flag that keeps its
   * frozen_param_shapes / _fragments None */
  zck_ds_write_opts so;
  zck_ds_write_opts_from(ck, &so);
  cJSON *unsaved = cJSON_CreateObject();
  for (size_t i = 0; unsaved && i < so.n_unsaved_ties; i++)
    cJSON_AddItemToObject(unsaved, so.unsaved_ties[2 * i], cJSON_CreateString(so.unsaved_ties[2 * i + 1]));
  if (st == ZCK_OK) st = zck__uvh_attr_json(w, "unsaved_tied_parameters", unsaved);
  else cJSON_Delete(unsaved);
  if (st == ZCK_OK) st = zck_h5_writer_attr_i64(w, "/", "exclude_frozen_parameters", so.exclude_frozen);
  if (st == ZCK_OK) st = zck__uvh_attr_json(w, "buffer_names", bufs);
  else cJSON_Delete(bufs);
  if (st == ZCK_OK) st = zck__uvh_attr_json(w, "param_groups", groups);
  else cJSON_Delete(groups);
  const zck_pk *cfg = zck_ds_ds_config(ck);
  if (st == ZCK_OK && cfg) {
    size_t budget = ZCK__UVJ_JSON_VALUES;
    cJSON *j = zck__uvj_pk_json(cfg, 0, &budget);
    if (!budget) {
      cJSON_Delete(j);
      zck_ds_file f = zck_ds_model_file(ck, 0);
      st = zck__fail(ZCK_ERR_FORMAT, "%s: ds_config: over %zu values once its shared references are followed (an "
                     "object that contains itself, or one referenced again and again): not a DeepSpeed config",
                     f.path, ZCK__UVJ_JSON_VALUES);
    } else {
      st = zck__uvh_attr_json(w, "ds_config", j);
    }
  }
  if (st == ZCK_OK && info->ep_size) st = zck__uvh_autoep(w, ck);
  return st;
}

/* /resume_state: what DeepSpeed reads back beyond the tensors and the attributes above,
 * as the source's own pickled objects, so a reshard of the container writes the files a
 * reshard of the source writes (byte for byte). A protocol-2 pickle of a dict:
 *   ds_config, lr_scheduler, loss_scaler   the source's objects (None when absent)
 *   module_metadata                        the BUILD state of `module` ({'_metadata': ...}) or None
 *   clip_grad (float), round_robin_gradients (bool), parameter_alignment (int),
 *   sub_group_size (int, 0: DeepSpeed's default)   the layout switches the source read
 *   step_ahead (int)                       the optimizer step beyond global_steps - skipped_steps
 *                                          (1: ZeRO-0 bf16's FP16_UnfusedOptimizer; deepspeed.h)
 *   module_params                          every param name (frozen, aliases) in module order,
 *                                          the order the `module` state dict lists them */
static zck_status zck__uvh_resume_state(zck_h5_writer *w, const zck_ds_ckpt *ck) {
  zck_ds_write_opts src;
  zck_ds_write_opts_from(ck, &src);
  zck_pk_doc *d = zck_pk_doc_new();
  zck_pk *root = d ? zck_pk_new_dict(d, 0) : NULL;
  bool ok = root != NULL;
  /* the source's nodes are referenced, not copied: the dump only walks them */
  const zck_pk *objs[4] = {src.ds_config, src.lr_scheduler, src.loss_scaler, src.module_attrs};
  static const char *const keys[4] = {"ds_config", "lr_scheduler", "loss_scaler", "module_metadata"};
  for (int i = 0; ok && i < 4; i++)
    ok = zck_pk_dict_set(d, root, zck_pk_new_str(d, keys[i]), objs[i] ? (zck_pk *)objs[i] : zck_pk_new_none(d));
  ok = ok && zck_pk_dict_set(d, root, zck_pk_new_str(d, "clip_grad"), zck_pk_new_float(d, src.clip_grad)) &&
       zck_pk_dict_set(d, root, zck_pk_new_str(d, "round_robin_gradients"), zck_pk_new_bool(d, src.round_robin)) &&
       zck_pk_dict_set(d, root, zck_pk_new_str(d, "parameter_alignment"), zck_pk_new_int(d, src.param_align)) &&
       zck_pk_dict_set(d, root, zck_pk_new_str(d, "sub_group_size"), zck_pk_new_int(d, (int64_t)src.sub_group_size)) &&
       zck_pk_dict_set(d, root, zck_pk_new_str(d, "step_ahead"), zck_pk_new_int(d, src.step_ahead));
  const zck_model *m = zck_ds_model(ck);
  zck_pk *order = ok ? zck_pk_new_list(d) : NULL;
  ok = order && zck_pk_dict_set(d, root, zck_pk_new_str(d, "module_params"), order);
  for (size_t i = 0; ok && i < m->n_params; i++) ok = zck_pk_append(d, order, zck_pk_new_str(d, m->params[i].name));
  zck__buf b;
  zck__buf_init(&b);
  zck_status st = ok ? ZCK_OK : zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  if (st == ZCK_OK) st = zck_pickle_dump(root, &b);
  if (st == ZCK_OK && b.failed) st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  if (st != ZCK_OK) st = zck__error_prepend(st, "%s", ZCK_H5U_RESUME_STATE);
  /* the writer's messages name the file and the dataset already */
  zck_store s;
  int64_t len = (int64_t)b.len;
  if (st == ZCK_OK) st = zck_h5_writer_dataset(w, ZCK_H5U_RESUME_STATE, ZCK_U8, 1, &len, &s);
  if (st == ZCK_OK) st = s.write(s.ctx, b.data, 0, b.len);
  zck__buf_free(&b);
  zck_pk_doc_free(d);
  return st;
}

// ---- /side_files

static int zck__uvh_cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The regular files of root a reshard of the source carries over (jobs/reshard.c: all but
 * `latest`, `latest_universal`, the tag folder and dot files), sorted, less the output
 * itself (`--overwrite` of a container inside the root). *names malloc'd. */
static zck_status zck__uvh_side_names(const char *root, const char *tag, const char *out, char ***names, size_t *n) {
  *names = NULL;
  *n = 0;
  DIR *d = opendir(root);
  if (!d) return ZCK_OK;   /* as the reshard: nothing to carry */
  struct stat ob;
  bool have_out = stat(out, &ob) == 0;
  char **v = NULL;
  size_t k = 0, cap = 0;
  zck_status st = ZCK_OK;
  struct dirent *e;
  while (st == ZCK_OK && (e = readdir(d))) {
    const char *nm = e->d_name;
    if (nm[0] == '.' || !strcmp(nm, "latest") || !strcmp(nm, "latest_universal") || !strcmp(nm, tag)) continue;
    char *p = zck__path_join(root, nm);
    struct stat sb;
    if (!p) {
      st = ZCK_ERR_NO_MEMORY;
      break;
    }
    bool take = lstat(p, &sb) == 0 && S_ISREG(sb.st_mode) && !(have_out && sb.st_dev == ob.st_dev && sb.st_ino == ob.st_ino);
    free(p);
    if (!take) continue;
    if (!zck_h5u_side_name_ok(nm)) {
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a file name with control characters or over 255 bytes cannot be kept in "
                     "the container", root);
      break;
    }
    if (k == cap) {
      cap = cap ? 2 * cap : 16;
      char **nv = zck__realloc(v, cap * sizeof *nv);
      if (!nv) {
        st = ZCK_ERR_NO_MEMORY;
        break;
      }
      v = nv;
    }
    if (!(v[k] = zck__strdup(nm))) {
      st = ZCK_ERR_NO_MEMORY;
      break;
    }
    k++;
  }
  closedir(d);
  if (st != ZCK_OK) {
    for (size_t i = 0; i < k; i++) free(v[i]);
    free(v);
    return st;
  }
  if (k) qsort(v, k, sizeof *v, zck__uvh_cmp);
  *names = v;
  *n = k;
  return ZCK_OK;
}

/* One batch of side files: their sources and datasets, alive until the copy ran. */
typedef struct zck__uvh_side {
  size_t n;
  zck__source *srcs;
  bool *open;
  zck_store *s, *d;
  zck_plan *plan;
  uint64_t bytes;
} zck__uvh_side;

static void zck__uvh_side_free(zck__uvh_side *sf) {
  for (size_t i = 0; sf->open && i < sf->n; i++)
    if (sf->open[i]) zck__source_close(&sf->srcs[i]);
  zck_plan_free(sf->plan);
  free(sf->srcs);
  free(sf->open);
  free(sf->s);
  free(sf->d);
  memset(sf, 0, sizeof *sf);
}

/* Datasets /side_files/<name> for names[0..n) and the plan copying the files into them. */
static zck_status zck__uvh_side_open(zck_h5_writer *w, const char *root, char *const *names, size_t n, zck__uvh_side *sf) {
  memset(sf, 0, sizeof *sf);
  sf->n = n;
  sf->srcs = zck__calloc(n, sizeof *sf->srcs);
  sf->open = zck__calloc(n, sizeof *sf->open);
  sf->s = zck__calloc(n, sizeof *sf->s);
  sf->d = zck__calloc(n, sizeof *sf->d);
  zck_extent *ext = zck__calloc(n, sizeof *ext);
  zck_status st = sf->srcs && sf->open && sf->s && sf->d && ext ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t ne = 0;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    char *p = zck__path_join(root, names[i]), *dp = zck__sprintf("%s/%s", ZCK_H5U_SIDE_FILES, names[i]);
    st = p && dp ? zck__source_open(&sf->srcs[i], p) : ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK) {
      sf->open[i] = true;
      int64_t len = (int64_t)sf->srcs[i].size;
      sf->s[i] = zck_store_source(&sf->srcs[i], 0, ZCK_U8, sf->srcs[i].size, sf->srcs[i].name);
      st = zck_h5_writer_dataset(w, dp, ZCK_U8, 1, &len, &sf->d[i]);
      if (st == ZCK_OK && len) ext[ne++] = (zck_extent){(uint32_t)i, (uint32_t)i, 0, 0, 0, (uint64_t)len, 0, 0, 0};
      sf->bytes += (uint64_t)len;
    }
    free(p);
    free(dp);
  }
  if (st == ZCK_OK) st = zck_plan_from_extents(ext, ne, n, n, &sf->plan);
  if (st == ZCK_OK) st = zck_plan_split(sf->plan, (uint64_t)16 << 20);
  free(ext);
  return st;
}

/* Copies the side files of the source's root, at most this many open at a time. */
#define ZCK__UVH_SIDE_BATCH 64
static zck_status zck__uvh_side_files(zck_h5_writer *w, const zck_ds_ckpt *ck, const char *out, const zck_universal_opts *o,
                                      zck__uvj_progress *prog) {
  const zck_ds_info *info = zck_ds_info_of(ck);
  char **names = NULL;
  size_t n = 0;
  ZCK_TRY(zck__uvh_side_names(info->root, info->tag, out, &names, &n));
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < n; i += ZCK__UVH_SIDE_BATCH) {
    size_t k = n - i < ZCK__UVH_SIDE_BATCH ? n - i : ZCK__UVH_SIDE_BATCH;
    zck__uvh_side sf;
    st = zck__uvh_side_open(w, info->root, names + i, k, &sf);
    if (st == ZCK_OK) {
      prog->total += sf.bytes;
      zck_exec_job job = {sf.plan, sf.s, sf.d, NULL};
      zck_exec_opts eo = zck__uvj_exec_opts(o, prog);
      st = zck_exec_run(&job, 1, &eo);
      zck__uvj_progress_advance(prog, sf.bytes);
    }
    zck__uvh_side_free(&sf);
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return st;
}

zck_status zck__to_universal_h5(const zck_ds_ckpt *ck, const char *src, const char *out, const zck_universal_opts *o) {
  const zck_model *m = zck_ds_model(ck);
  zck_ds_view views[3], frozen = {0}, bufs = zck_ds_buffers(ck);
  static const zck_ds_part parts[3] = {ZCK_DS_FP32, ZCK_DS_EXP_AVG, ZCK_DS_EXP_AVG_SQ};
  for (int k = 0; k < 3; k++) ZCK_TRY(zck_ds_get(ck, parts[k], &views[k]));
  uint32_t *flat = NULL, *fz = NULL;
  size_t n_flat = 0, n_fz = 0;
  ZCK_TRY(zck__uvj_flat_params(&views[0], &flat, &n_flat));
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < n_flat; i++) st = zck_uv_check_name(m->params[flat[i]].name);
  /* frozen params, when the checkpoint keeps them (stage 1: module; 2/3: fragments) */
  bool has_frozen = false;
  if (st == ZCK_OK) {
    has_frozen = zck_ds_get(ck, ZCK_DS_FROZEN, &frozen) == ZCK_OK;
    if (!has_frozen) zck_clear_error(); /* none kept (and a bad name's message stays) */
  }
  if (st == ZCK_OK && has_frozen) {
    if (!(fz = zck__malloc((m->n_params ? m->n_params : 1) * sizeof *fz))) st = ZCK_ERR_NO_MEMORY;
    for (uint32_t p = 0; st == ZCK_OK && p < m->n_params; p++) {
      const zck_param *pa = &m->params[p];
      if (!pa->frozen || pa->tied_to >= 0 || zck_layout_param_covered(frozen.layout, p) != pa->numel) continue;
      st = zck_uv_check_name(pa->name);
      fz[n_fz++] = p;
    }
  }
  for (size_t i = 0; st == ZCK_OK && i < m->n_buffers; i++) st = zck_uv_check_name(m->buffers[i].name);
  if (st == ZCK_ERR_FORMAT) st = zck__error_prepend(st, "%s", zck_ds_info_of(ck)->dir); /* which checkpoint */
  zck_h5_write_opts wo = ZCK_H5_WRITE_OPTS_INIT;
  wo.level = o->level;
  wo.chunk_bytes = o->chunk_bytes;
  wo.overwrite = o->overwrite != 0;
  wo.compact_bytes = ZCK_H5U_COMPACT_BYTES;
  zck_h5_writer *w = NULL;
  if (st == ZCK_OK) st = zck_h5_writer_create(out, &wo, &w);
  zck__uvh_job jobs[5];
  memset(jobs, 0, sizeof jobs);
  static const zck_h5u_part hparts[3] = {ZCK_H5U_FP32, ZCK_H5U_EXP_AVG, ZCK_H5U_EXP_AVG_SQ};
  for (int k = 0; st == ZCK_OK && k < 3; k++) st = zck__uvh_part(w, m, &views[k], hparts[k], flat, n_flat, &jobs[k]);
  if (st == ZCK_OK && n_fz) st = zck__uvh_part(w, m, &frozen, ZCK_H5U_FROZEN, fz, n_fz, &jobs[3]);
  if (st == ZCK_OK) st = zck__uvh_buffers(w, m, &bufs, &jobs[4]);
  if (st == ZCK_OK) st = zck__uvh_attrs(w, ck, src, flat, n_flat);
  if (st == ZCK_OK) st = zck__uvh_part_dtypes(w, jobs, n_flat);
  if (st == ZCK_OK) st = zck__uvh_resume_state(w, ck);
  if (st == ZCK_OK) {
    zck_exec_job ej[5];
    size_t nj = 0;
    const zck_store *srcs[5] = {views[0].stores, views[1].stores, views[2].stores, frozen.stores, bufs.stores};
    for (int k = 0; k < 5; k++)
      if (jobs[k].plan) ej[nj++] = (zck_exec_job){jobs[k].plan, srcs[k], jobs[k].dst, NULL};
    zck__uvj_progress prog = {o->progress, o->progress_ctx, 0, 0};
    zck_exec_opts eo = zck__uvj_exec_opts(o, &prog);
    st = zck_exec_run(ej, nj, &eo);
    zck__uvj_progress_advance(&prog, prog.total - prog.base);   /* what the run reported */
    if (st == ZCK_OK) st = zck__uvh_side_files(w, ck, out, o, &prog);
  }
  if (st == ZCK_OK) st = zck_h5_writer_commit(w);
  zck_h5_writer_free(w);
  for (int k = 0; k < 5; k++) zck__uvh_job_free(&jobs[k]);
  free(flat);
  free(fz);
  return st;
}
