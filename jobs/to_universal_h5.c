/* to_universal_h5.c: `zckpt to-universal --format hdf5`: the checkpoint as one HDF5 file.
 *
 * Layout and attributes: formats/hdf5/zck_h5.h ("the zckpt universal container"): every
 * param's fp32 / exp_avg / exp_avg_sq, frozen params and buffers as datasets; counters,
 * step, param groups, names, shapes, tied aliases and the ds_config (JSON) as attributes;
 * and /resume_state, a pickle of what else a resumed DeepSpeed run reads (the source's
 * ds_config, lr_scheduler, loss scaler, module metadata and param order, clip_grad and
 * layout switches), so `zckpt reshard` of the container writes, byte for byte, the
 * checkpoint a reshard of the source writes (tests/reshard/test_reshard_universal.c).
 * Containers written before /resume_state are still read (lr_scheduler None). The
 * datasets are reserved batch by batch (ZCK__UVH_BATCH_PARAMS params: their fp32, exp_avg
 * and exp_avg_sq; then the frozen params; then the buffers), each batch a target state view
 * that one zck_transfer fills from the DeepSpeed reader's view, in destination order
 * (write_in_order), so each dataset is filled front to back and only a few chunks per
 * thread wait in assembly; each chunk is compressed by the thread that completes it. After
 * each batch the writer settles it (makes its datasets, keeps only their checksums), so the
 * job's memory is bounded by a batch, not by the tensor count.
 * The save root's other files (an HF checkpoint-N/'s rng_state_<r>.pth, trainer_state.json,
 * ...) go into /side_files byte for byte, so the reshard of the container carries them
 * over as the reshard of the source does (the same files: jobs/reshard.c). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "hdf5/zck_h5.h"
#include "to_universal.h"
#include "transfer.h"
#include "universal/universal.h"

/* The datasets of one batch in one part of the target view: their whole layout and stores. */
typedef struct zck__uvh_job {
  zck_layout *dst_layout;
  zck_store *dst;
} zck__uvh_job;

/* Params per batch: the datasets of a batch (three per trainable param), with their plans,
 * executor tables and the writer's state, are what the job holds at a time. */
#define ZCK__UVH_BATCH_PARAMS 4096

/* The dtype a view holds param p in: its first piece's store's. */
static zck_dtype zck__uvh_dtype(const zck_ds_view *view, uint32_t p) {
  const zck_layout *l = view->layout;
  size_t pf = l->param_first[p];
  return pf < l->param_first[p + 1] ? view->stores[l->pieces[pf].store].dtype : view->stores[0].dtype;
}

/* Datasets for params[0..n) of part (whole tensors, in the dtype view holds them in): their
 * whole layout and stores, one part of the target view. numel: every param's. */
static zck_status zck__uvh_part(zck_h5_writer *w, const zck_model *m, const uint64_t *numel, const zck_ds_view *view,
                                zck_h5u_part part, const uint32_t *params, size_t n, zck__uvh_job *j) {
  memset(j, 0, sizeof *j);
  if (!n) return ZCK_OK;
  j->dst = zck__calloc(n, sizeof *j->dst);
  zck_status st = j->dst ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck_param *p = &m->params[params[i]];
    char *path = zck_h5u_path(part, p->name);
    st = path ? zck_h5_writer_dataset(w, path, zck__uvh_dtype(view, params[i]), p->ndim, p->shape, &j->dst[i])
              : ZCK_ERR_NO_MEMORY;
    free(path);
  }
  if (st == ZCK_OK) st = zck_layout_whole(m->n_params, numel, params, n, &j->dst_layout);
  return st;
}

static void zck__uvh_job_free(zck__uvh_job *j) {
  zck_layout_free(j->dst_layout);
  free(j->dst);
  memset(j, 0, sizeof *j);
}

/* Datasets for buffers idx[0..n). numel: every buffer's. */
static zck_status zck__uvh_buffers(zck_h5_writer *w, const zck_model *m, const uint64_t *numel, const zck_ds_view *view,
                                   const uint32_t *idx, size_t n, zck__uvh_job *j) {
  memset(j, 0, sizeof *j);
  if (!n) return ZCK_OK;
  j->dst = zck__calloc(n, sizeof *j->dst);
  zck_status st = j->dst ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck_buffer *b = &m->buffers[idx[i]];
    char *path = zck_h5u_buffer_path(b->name);
    st = path ? zck_h5_writer_dataset(w, path, view->stores[idx[i]].dtype, b->ndim, b->shape, &j->dst[i])
              : ZCK_ERR_NO_MEMORY;
    free(path);
  }
  if (st == ZCK_OK) st = zck_layout_whole(m->n_buffers, numel, idx, n, &j->dst_layout);
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
static zck_status zck__uvh_part_dtypes(zck_h5_writer *w, const zck_ds_view *views, const uint32_t *flat, size_t n_flat) {
  if (!n_flat) return ZCK_OK;
  static const char *const keys[3] = {"fp32", "exp_avg", "exp_avg_sq"};
  cJSON *o = cJSON_CreateObject();
  for (int k = 0; o && k < 3; k++) {
    zck_dtype dt = zck__uvh_dtype(&views[k], flat[0]);
    for (size_t i = 1; dt != ZCK_DTYPE_INVALID && i < n_flat; i++)
      if (zck__uvh_dtype(&views[k], flat[i]) != dt) dt = ZCK_DTYPE_INVALID;
    if (dt != ZCK_DTYPE_INVALID) cJSON_AddStringToObject(o, keys[k], zck_dtype_name(dt));
  }
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

// ---- the tensors, batch by batch

typedef struct zck__uvh {
  zck_h5_writer *w;
  const zck_model *m;
  const zck_ds_view *views;       /* [3]: fp32, exp_avg, exp_avg_sq */
  const zck_ds_view *frozen, *bufs;
  const uint64_t *numel;          /* every param's */
  const uint64_t *buf_numel;      /* every buffer's */
  zck_state_view from;            /* the reader's view, every batch's source */
  const char *out;
  const zck_universal_opts *o;
  zck__uvj_progress prog;
} zck__uvh;

typedef enum { ZCK__UVH_TRAINABLE, ZCK__UVH_FROZEN, ZCK__UVH_BUFFERS } zck__uvh_what;

/* Bytes of the datasets of idx[0..n). */
static uint64_t zck__uvh_bytes(const zck__uvh *j, zck__uvh_what what, const uint32_t *idx, size_t n) {
  uint64_t b = 0;
  for (size_t i = 0; i < n; i++) {
    if (what == ZCK__UVH_BUFFERS) {
      b += j->buf_numel[idx[i]] * zck_dtype_size(j->bufs->stores[idx[i]].dtype);
    } else if (what == ZCK__UVH_FROZEN) {
      b += j->numel[idx[i]] * zck_dtype_size(zck__uvh_dtype(j->frozen, idx[i]));
    } else {
      for (int k = 0; k < 3; k++) b += j->numel[idx[i]] * zck_dtype_size(zck__uvh_dtype(&j->views[k], idx[i]));
    }
  }
  return b;
}

/* One batch: the datasets of idx[0..n) (a trainable param's three states, a frozen param,
 * a buffer) declared, filled by one zck_transfer from the reader's view in destination
 * order (each dataset filled front to back), then settled (made, and let go of but for
 * their checksums). */
static zck_status zck__uvh_batch(zck__uvh *j, zck__uvh_what what, const uint32_t *idx, size_t n) {
  static const zck_h5u_part hparts[3] = {ZCK_H5U_FP32, ZCK_H5U_EXP_AVG, ZCK_H5U_EXP_AVG_SQ};
  static const zck_state_kind kinds[3] = {ZCK_STATE_FP32, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ};
  zck__uvh_job jobs[3];
  memset(jobs, 0, sizeof jobs);
  zck_state_view dst;
  memset(&dst, 0, sizeof dst);
  dst.model = j->m;
  dst.name = j->out;
  dst.write_in_order = true;
  zck_status st = ZCK_OK;
  if (what == ZCK__UVH_TRAINABLE) {
    for (int k = 0; st == ZCK_OK && k < 3; k++) {
      st = zck__uvh_part(j->w, j->m, j->numel, &j->views[k], hparts[k], idx, n, &jobs[k]);
      dst.part[kinds[k]] = (zck_state_part){jobs[k].dst_layout, jobs[k].dst, NULL};
    }
  } else if (what == ZCK__UVH_FROZEN) {
    st = zck__uvh_part(j->w, j->m, j->numel, j->frozen, ZCK_H5U_FROZEN, idx, n, &jobs[0]);
    dst.part[ZCK_STATE_FROZEN] = (zck_state_part){jobs[0].dst_layout, jobs[0].dst, NULL};
  } else {
    st = zck__uvh_buffers(j->w, j->m, j->buf_numel, j->bufs, idx, n, &jobs[0]);
    dst.buffers = (zck_state_part){jobs[0].dst_layout, jobs[0].dst, NULL};
    dst.n_buffer_copies = 1;
  }
  if (st == ZCK_OK) {
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec = zck__uvj_exec_opts(j->o, &j->prog);
    st = zck_transfer(&j->from, &dst, 1, &to);
    zck__uvj_progress_advance(&j->prog, zck__uvh_bytes(j, what, idx, n));
  }
  if (st == ZCK_OK) st = zck_h5_writer_settle(j->w);
  for (int k = 0; k < 3; k++) zck__uvh_job_free(&jobs[k]);
  return st;
}

/* Every dataset of idx[0..n), ZCK__UVH_BATCH_PARAMS at a time. */
static zck_status zck__uvh_batches(zck__uvh *j, zck__uvh_what what, const uint32_t *idx, size_t n) {
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < n; i += ZCK__UVH_BATCH_PARAMS)
    st = zck__uvh_batch(j, what, idx + i, n - i < ZCK__UVH_BATCH_PARAMS ? n - i : ZCK__UVH_BATCH_PARAMS);
  return st;
}

zck_status zck__to_universal_h5(const zck_ds_ckpt *ck, const char *src, const char *out, const zck_universal_opts *o) {
  const zck_model *m = zck_ds_model(ck);
  zck_ds_view views[3], frozen = {0}, bufs = zck_ds_buffers(ck);
  static const zck_ds_part parts[3] = {ZCK_DS_FP32, ZCK_DS_EXP_AVG, ZCK_DS_EXP_AVG_SQ};
  for (int k = 0; k < 3; k++) ZCK_TRY(zck_ds_get(ck, parts[k], &views[k]));
  uint32_t *flat = NULL, *fz = NULL, *bidx = NULL;
  uint64_t *numel = NULL, *bnumel = NULL;
  size_t n_flat = 0, n_fz = 0, n_buf = bufs.layout ? m->n_buffers : 0;
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
  if (st == ZCK_OK) {
    numel = zck__calloc(m->n_params ? m->n_params : 1, sizeof *numel);
    bnumel = zck__calloc(n_buf ? n_buf : 1, sizeof *bnumel);
    bidx = zck__calloc(n_buf ? n_buf : 1, sizeof *bidx);
    if (!numel || !bnumel || !bidx) st = ZCK_ERR_NO_MEMORY;
  }
  if (st == ZCK_OK) {
    zck_model_numels(m, numel);
    for (size_t i = 0; i < n_buf; i++) {
      bnumel[i] = m->buffers[i].numel;
      bidx[i] = (uint32_t)i;
    }
  }
  zck_h5_write_opts wo = ZCK_H5_WRITE_OPTS_INIT;
  wo.level = o->level;
  wo.chunk_bytes = o->chunk_bytes;
  wo.overwrite = o->overwrite != 0;
  wo.compact_bytes = ZCK_H5U_COMPACT_BYTES;
  zck_h5_writer *w = NULL;
  if (st == ZCK_OK) st = zck_h5_writer_create(out, &wo, &w);
  if (st == ZCK_OK) st = zck__uvh_attrs(w, ck, src, flat, n_flat);
  if (st == ZCK_OK) st = zck__uvh_part_dtypes(w, views, flat, n_flat);
  if (st == ZCK_OK) st = zck__uvh_resume_state(w, ck);
  if (st == ZCK_OK) {
    zck__uvh j = {w, m, views, &frozen, &bufs, numel, bnumel, {0}, out, o, {o->progress, o->progress_ctx, 0, 0}};
    zck_ds_state(ck, &j.from);
    j.prog.total = zck__uvh_bytes(&j, ZCK__UVH_TRAINABLE, flat, n_flat) + zck__uvh_bytes(&j, ZCK__UVH_FROZEN, fz, n_fz) +
                   zck__uvh_bytes(&j, ZCK__UVH_BUFFERS, bidx, n_buf);
    st = zck__uvh_batches(&j, ZCK__UVH_TRAINABLE, flat, n_flat);
    if (st == ZCK_OK) st = zck__uvh_batches(&j, ZCK__UVH_FROZEN, fz, n_fz);
    if (st == ZCK_OK) st = zck__uvh_batches(&j, ZCK__UVH_BUFFERS, bidx, n_buf);
    if (st == ZCK_OK) st = zck__uvh_side_files(w, ck, out, o, &j.prog);
  }
  if (st == ZCK_OK) st = zck_h5_writer_commit(w);
  zck_h5_writer_free(w);
  free(flat);
  free(fz);
  free(bidx);
  free(numel);
  free(bnumel);
  return st;
}
