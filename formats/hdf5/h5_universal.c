/* h5_universal.c: reading zckpt's universal container (layout in zck_h5.h) back as a
 * model manifest plus whole-tensor layouts and range-reading stores, for reshard. */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "h5_checksums.h"
#include "h5_internal.h"

static const char *const zck__h5u_states[ZCK_H5U_PART_COUNT] = {"fp32", "exp_avg", "exp_avg_sq", NULL};

char *zck_h5u_path(zck_h5u_part part, const char *name) {
  if (part == ZCK_H5U_FROZEN) return zck__sprintf("/frozen/%s", name);
  return zck__sprintf("/params/%s/%s", name, zck__h5u_states[part]);
}

char *zck_h5u_buffer_path(const char *name) { return zck__sprintf("/buffers/%s", name); }

typedef struct zck__h5u_part {
  zck_layout *layout;
  zck_store *stores;
  zck_h5_dataset **ds;
  size_t n;
} zck__h5u_part;

struct zck_h5u {
  zck_h5_file *f;
  zck_h5u_info info;
  char *ds_version, *ds_config, *tag, *autoep;
  char **side;                     /* names under /side_files */
  char **unsaved;                  /* info.unsaved_ties */
  zck_model *m;
  zck__h5u_part parts[ZCK_H5U_PART_COUNT];
  zck__h5u_part buffers;
  /* zck_h5u_describe with a part_dtypes attribute: the trainable parts' datasets are not
   * opened (no headers read); their dtypes are part_dtypes', their pieces counted from it */
  bool described;
  zck_dtype part_dtype[3];         /* part_dtypes; INVALID where absent */
  uint64_t described_pieces;
};

static zck_status zck__h5u_json(zck_h5u *u, const char *key, int type, cJSON **out) {
  char *text = NULL;
  *out = NULL;
  zck_status st = zck_h5_attr_str(u->f, "/", key, &text);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    return ZCK_OK;
  }
  if (st != ZCK_OK) return st;
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j || !(type == cJSON_Array ? cJSON_IsArray(j) : cJSON_IsObject(j))) {
    cJSON_Delete(j);
    return zck__fail(ZCK_ERR_FORMAT, "%s: attribute %s is not a JSON %s", zck_h5_name(u->f), key,
                     type == cJSON_Array ? "list" : "object");
  }
  *out = j;
  return ZCK_OK;
}

/* A trainable part's dataset described from the root attributes alone (zck_h5u_describe):
 * its param's group must be linked under /params (the lazy walk opened none of them); its
 * dtype is part_dtypes', its shape param_shapes'. */
static zck_status zck__h5u_describe_one(zck_h5u *u, zck__h5u_part *p, zck_dtype dt, const char *path, int ndim,
                                        const int64_t *shape) {
  ZCK_TRY(zck__h5_link_at(u->f, path));
  uint64_t dims[ZCK_MAX_DIMS], numel = 1;
  for (int i = 0; i < ndim; i++) {
    dims[i] = (uint64_t)shape[i];
    if (!zck__mul_u64(numel, dims[i], &numel))
      return zck__fail(ZCK_ERR_FORMAT, "%s:%s: element count overflows", zck_h5_name(u->f), path);
  }
  const zck__h5c_table *t = zck__h5_file_table(u->f);
  if (t) {
    zck__h5c_ds c;
    zck__h5c_geometry(&c, dt, ndim, dims, t->piece_bytes);
    u->described_pieces += c.g.n;
  }
  p->ds[p->n] = NULL;
  p->stores[p->n] = zck_store_memory(NULL, dt, numel, NULL);
  p->n++;
  return ZCK_OK;
}

/* Opens dataset path for a tensor of the given shape; store i of the part. With a
 * part_dtypes attribute, a trainable part's datasets must have its dtype. */
static zck_status zck__h5u_add(zck_h5u *u, zck__h5u_part *p, const char *path, int ndim, const int64_t *shape,
                               bool check_shape) {
  int part = p >= u->parts && p < u->parts + 3 ? (int)(p - u->parts) : -1;
  if (u->described && part >= 0) return zck__h5u_describe_one(u, p, u->part_dtype[part], path, ndim, shape);
  zck_h5_dataset *d = NULL;
  ZCK_TRY(zck_h5_dataset_open(u->f, path, &d));
  const zck_h5_dataset_info *di = zck_h5_dataset_info_of(d);
  bool same = di->ndim == ndim;
  for (int i = 0; same && i < ndim; i++) same = di->shape[i] == shape[i];
  if (check_shape && !same) {
    char a[128], b[128];
    zck_status st = zck__fail(ZCK_ERR_MISMATCH, "%s:%s: shape %s, param_shapes says %s", zck_h5_name(u->f), path,
                              zck_shape_str(di->ndim, di->shape, a, sizeof a), zck_shape_str(ndim, shape, b, sizeof b));
    zck_h5_dataset_close(d);
    return st;
  }
  if (part >= 0 && u->part_dtype[part] != ZCK_DTYPE_INVALID && di->dtype != u->part_dtype[part]) {
    zck_status st = zck__fail(ZCK_ERR_MISMATCH, "%s:%s: dtype %s, part_dtypes says %s", zck_h5_name(u->f), path,
                              zck_dtype_name(di->dtype), zck_dtype_name(u->part_dtype[part]));
    zck_h5_dataset_close(d);
    return st;
  }
  p->ds[p->n] = d;
  p->stores[p->n] = zck_h5_dataset_store(d);
  p->n++;
  return ZCK_OK;
}

static zck_status zck__h5u_alloc(zck__h5u_part *p, size_t n) {
  p->ds = zck__calloc(n ? n : 1, sizeof *p->ds);
  p->stores = zck__calloc(n ? n : 1, sizeof *p->stores);
  return p->ds && p->stores ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

static zck_status zck__h5u_shape(const cJSON *a, int *nd, int64_t *shape, const char *what) {
  if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > ZCK_MAX_DIMS) return zck__fail(ZCK_ERR_FORMAT, "%s: bad shape", what);
  *nd = 0;
  const cJSON *d;
  cJSON_ArrayForEach(d, a) {
    if (!cJSON_IsNumber(d) || d->valuedouble < 0 || d->valuedouble > 9e15) return zck__fail(ZCK_ERR_FORMAT, "%s: bad shape", what);
    shape[(*nd)++] = (int64_t)d->valuedouble;
  }
  return ZCK_OK;
}

/* The source's tag: a folder name the reshard writes under the output root. */
static zck_status zck__h5u_tag(zck_h5u *u) {
  zck_status st = zck_h5_attr_str(u->f, "/", "tag", &u->tag);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    return ZCK_OK;
  }
  if (st != ZCK_OK) return st;
  const char *t = u->tag;
  if (!*t) return ZCK_OK;
  /* the DeepSpeed reader's rule for tags (DS-02 / DS-03): one plain path component */
  for (const unsigned char *c = (const unsigned char *)t; *c; c++)
    if (*c < 0x20 || *c == 0x7f)
      return zck__fail(ZCK_ERR_FORMAT, "%s: attribute tag is not a folder name (control character 0x%02x)", zck_h5_name(u->f), *c);
  if (strlen(t) > 255 || !strcmp(t, ".") || strstr(t, "..") || strchr(t, '/') || strchr(t, '\\'))
    return zck__fail(ZCK_ERR_FORMAT, "%s: attribute tag '%.80s' is not a folder name", zck_h5_name(u->f), t);
  u->info.tag = t;
  return ZCK_OK;
}

bool zck_h5u_side_name_ok(const char *n) {
  bool ok = *n && n[0] != '.' && !strchr(n, '/') && strlen(n) <= 255 && strcmp(n, "latest") && strcmp(n, "latest_universal");
  for (const unsigned char *c = (const unsigned char *)n; ok && *c; c++) ok = *c >= 0x20 && *c != 0x7f;
  return ok;
}

/* The names under /side_files, each a plain file name a reshard may create. */
static zck_status zck__h5u_side_list(zck_h5u *u) {
  if (!zck_h5_exists(u->f, ZCK_H5U_SIDE_FILES)) return ZCK_OK;
  ZCK_TRY(zck_h5_list(u->f, ZCK_H5U_SIDE_FILES, &u->side, &u->info.n_side_files));
  for (size_t i = 0; i < u->info.n_side_files; i++) {
    const char *n = u->side[i];
    if (zck_h5u_side_name_ok(n) && !(u->info.tag && !strcmp(n, u->info.tag))) continue;
    char shown[81];   /* the name on one line */
    size_t k = 0;
    for (; n[k] && k < sizeof shown - 1; k++) shown[k] = (unsigned char)n[k] < 0x20 || n[k] == 0x7f ? '?' : n[k];
    shown[k] = 0;
    return zck__fail(ZCK_ERR_FORMAT, "%s:%s: side file name '%s' is not allowed (a plain file name other than latest, "
                     "latest_universal and the tag)", zck_h5_name(u->f), ZCK_H5U_SIDE_FILES, shown);
  }
  return ZCK_OK;
}

/* exclude_frozen_parameters and unsaved_tied_parameters (zck_h5.h); absent: 0 and none. */
static zck_status zck__h5u_unsaved(zck_h5u *u) {
  int64_t v = 0;
  zck_status st = zck_h5_attr_i64(u->f, "/", "exclude_frozen_parameters", &v);
  if (st == ZCK_ERR_NOT_FOUND) {
    zck_clear_error();
    st = ZCK_OK;
  }
  if (st != ZCK_OK) return st;
  u->info.exclude_frozen = v != 0;
  cJSON *j = NULL;
  ZCK_TRY(zck__h5u_json(u, "unsaved_tied_parameters", cJSON_Object, &j));
  size_t n = j ? (size_t)cJSON_GetArraySize(j) : 0;
  if (!(u->unsaved = zck__calloc(2 * n + 1, sizeof *u->unsaved))) st = ZCK_ERR_NO_MEMORY;
  const cJSON *it;
  size_t k = 0;
  cJSON_ArrayForEach(it, j) {
    if (st != ZCK_OK) break;
    if (!cJSON_IsString(it) || !it->string) {
      st = zck__fail(ZCK_ERR_FORMAT, "%s: attribute unsaved_tied_parameters: '%s' is not an alias -> source name",
                     zck_h5_name(u->f), it->string ? it->string : "");
      break;
    }
    if (!(u->unsaved[2 * k] = zck__strdup(it->string)) || !(u->unsaved[2 * k + 1] = zck__strdup(it->valuestring))) {
      st = ZCK_ERR_NO_MEMORY;
      break;
    }
    k++;
  }
  cJSON_Delete(j);
  u->info.unsaved_ties = (const char *const *)u->unsaved;
  u->info.n_unsaved_ties = k;
  return st;
}

/* Whether group entry `group` lists hyper-parameter p among its int_hyperparameters. */
static bool is_int_hparam(const cJSON *group, const cJSON *p) {
  const cJSON *k;
  cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(group, "int_hyperparameters"))
    if (cJSON_IsString(k) && !strcmp(k->valuestring, p->string))
      return p->valuedouble == (double)(int64_t)p->valuedouble;
  return false;
}

/* part_dtypes (zck_h5.h): the dtype of every dataset of a trainable part; absent in
 * containers written before it, and for a part whose datasets differ. */
static zck_status zck__h5u_part_dtypes(zck_h5u *u) {
  static const char *const keys[3] = {"fp32", "exp_avg", "exp_avg_sq"};
  cJSON *j = NULL;
  ZCK_TRY(zck__h5u_json(u, "part_dtypes", cJSON_Object, &j));
  zck_status st = ZCK_OK;
  for (int k = 0; k < 3; k++) {
    const cJSON *e = j ? cJSON_GetObjectItemCaseSensitive(j, keys[k]) : NULL;
    if (!e) continue;
    zck_dtype dt = cJSON_IsString(e) ? zck_dtype_parse(e->valuestring) : ZCK_DTYPE_INVALID;
    if (dt == ZCK_DTYPE_INVALID) {
      st = zck__fail(ZCK_ERR_FORMAT, "%s: attribute part_dtypes: %s is not a dtype", zck_h5_name(u->f), keys[k]);
      break;
    }
    u->part_dtype[k] = dt;
  }
  cJSON_Delete(j);
  return st;
}

/* The root's attributes: format and version, the run's counters and strings, the part dtypes, the tag and the side
 * files. */
static zck_status zck__h5u_header(zck_h5u *u) {
  const char *fn = zck_h5_name(u->f);
  char *fmt = NULL;
  zck_status st = zck_h5_attr_str(u->f, "/", "zckpt_format", &fmt);
  if (st != ZCK_OK || strcmp(fmt, ZCK_H5U_FORMAT)) {
    free(fmt);
    return zck__fail(ZCK_ERR_FORMAT, "%s: not a zckpt universal container (zckpt_format attribute)", fn);
  }
  free(fmt);
  int64_t ver = 0;
  ZCK_TRY(zck_h5_attr_i64(u->f, "/", "zckpt_format_version", &ver));
  if (ver < 1 || ver > ZCK_H5U_VERSION)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: container version %lld (this build reads 1..%d)", fn, (long long)ver, ZCK_H5U_VERSION);
  if (ver >= 2 && !zck_h5_has_checksums(u->f))
    return zck__fail(ZCK_ERR_DAMAGED, "%s: damaged: a version %lld container without its checksum table (%s)", fn,
                     (long long)ver, ZCK__H5C_TABLE_ATTR);
  int64_t v;
  if (zck_h5_attr_i64(u->f, "/", "stage", &v) == ZCK_OK) u->info.stage = (int)v;
  if (zck_h5_attr_i64(u->f, "/", "world_size", &v) == ZCK_OK) u->info.world_size = (uint32_t)v;
  if (zck_h5_attr_i64(u->f, "/", "global_steps", &v) == ZCK_OK) u->info.global_steps = v;
  if (zck_h5_attr_i64(u->f, "/", "skipped_steps", &v) == ZCK_OK) u->info.skipped_steps = v;
  u->info.global_samples = -1;
  if (zck_h5_attr_i64(u->f, "/", "global_samples", &v) == ZCK_OK) u->info.global_samples = v;
  if (zck_h5_attr_i64(u->f, "/", "step_is_tensor", &v) == ZCK_OK) u->info.step_is_tensor = v != 0;
  zck_h5_attr_f64(u->f, "/", "step", &u->info.step);
  if (zck_h5_attr_str(u->f, "/", "ds_version", &u->ds_version) == ZCK_OK) u->info.ds_version = u->ds_version;
  if (zck_h5_attr_str(u->f, "/", "ds_config", &u->ds_config) == ZCK_OK) u->info.ds_config_json = u->ds_config;
  if (zck_h5_attr_str(u->f, "/", "autoep_layers", &u->autoep) == ZCK_OK) u->info.autoep_layers_json = u->autoep;
  zck_clear_error();
  ZCK_TRY(zck__h5u_part_dtypes(u));
  /* describing needs every trainable part's dtype (else the datasets are opened, which
   * walks the file again in full) */
  u->described = u->described && u->part_dtype[0] != ZCK_DTYPE_INVALID && u->part_dtype[1] != ZCK_DTYPE_INVALID &&
                 u->part_dtype[2] != ZCK_DTYPE_INVALID;
  ZCK_TRY(zck__h5u_unsaved(u));
  ZCK_TRY(zck__h5u_tag(u));
  return zck__h5u_side_list(u);
}

/* The model's JSON attributes, parsed once for the steps below. */
typedef struct h5u_lists {
  cJSON *names, *shapes, *groups, *tied, *frozen, *bufs;
} h5u_lists;

/* The trainable params in param_names' order, each with its three parts' datasets; their model indices in
 * trainable[0..*k). */
static zck_status zck__h5u_trainable(zck_h5u *u, const h5u_lists *l, uint32_t *trainable, size_t *k) {
  const char *fn = zck_h5_name(u->f);
  zck_model *m = u->m;
  zck_status st = ZCK_OK;
  const cJSON *it;
  /* param_shapes lists the names in param_names' order (the writer makes both): the next
   * entry is tried first, so 100k params cost 100k compares, not a search each */
  const cJSON *next_shape = l->shapes ? l->shapes->child : NULL;
  cJSON_ArrayForEach(it, l->names) {
    if (st != ZCK_OK) break;
    if (!cJSON_IsString(it)) { st = zck__fail(ZCK_ERR_FORMAT, "%s: param_names holds a non-string", fn); break; }
    int nd = 0;
    int64_t shape[ZCK_MAX_DIMS] = {0};
    const cJSON *sh = next_shape && next_shape->string && !strcmp(next_shape->string, it->valuestring)
                          ? next_shape : cJSON_GetObjectItemCaseSensitive(l->shapes, it->valuestring);
    next_shape = sh ? sh->next : NULL;
    st = zck__h5u_shape(sh, &nd, shape, it->valuestring);
    uint32_t pi;
    if (st == ZCK_OK) st = zck_model_add_param(m, it->valuestring, nd, shape, ZCK_DTYPE_INVALID, &pi);
    for (int s = 0; st == ZCK_OK && s < 3; s++) {
      char *p = zck_h5u_path((zck_h5u_part)s, it->valuestring);
      st = p ? zck__h5u_add(u, &u->parts[s], p, nd, shape, true) : ZCK_ERR_NO_MEMORY;
      free(p);
    }
    if (st == ZCK_OK) {
      trainable[(*k)++] = pi;
      m->params[pi].dtype = u->parts[0].stores[*k - 1].dtype;
    }
  }
  return st;
}

/* The param groups: hyper-parameters (numbers are floats unless int_hyperparameters names them) and membership. */
static zck_status zck__h5u_groups(zck_h5u *u, const cJSON *groups) {
  const char *fn = zck_h5_name(u->f);
  zck_model *m = u->m;
  zck_status st = ZCK_OK;
  const cJSON *it;
  cJSON_ArrayForEach(it, groups) {
    if (st != ZCK_OK) break;
    uint32_t g;
    st = zck_model_add_group(m, &g);
    const cJSON *p, *hp = cJSON_GetObjectItemCaseSensitive(it, "hyperparameters");
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(it, "params")) {
      int64_t pi = cJSON_IsString(p) ? zck_model_find_param(m, p->valuestring) : -1;
      if (st == ZCK_OK && pi < 0) st = zck__fail(ZCK_ERR_FORMAT, "%s: param_groups names an unknown param", fn);
      if (st == ZCK_OK) st = zck_model_group_add_param(m, g, (uint32_t)pi);
    }
    cJSON_ArrayForEach(p, hp) {
      if (st != ZCK_OK) break;
      if (cJSON_IsBool(p)) st = zck_model_group_set_bool(m, g, p->string, cJSON_IsTrue(p));
      else if (cJSON_IsNumber(p) && is_int_hparam(it, p)) st = zck_model_group_set_int(m, g, p->string, (int64_t)p->valuedouble);
      else if (cJSON_IsNumber(p)) st = zck_model_group_set_float(m, g, p->string, p->valuedouble);
      else if (cJSON_IsString(p)) st = zck_model_group_set_string(m, g, p->string, p->valuestring);
      else if (cJSON_IsNull(p)) st = zck_model_group_set_none(m, g, p->string);
      else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) <= ZCK_HP_MAX_FLOATS) {
        double f[ZCK_HP_MAX_FLOATS];
        int n = 0;
        const cJSON *q;
        cJSON_ArrayForEach(q, p) f[n++] = q->valuedouble;
        st = zck_model_group_set_floats(m, g, p->string, f, n);
      }
    }
  }
  return st;
}

/* The frozen params saved (their datasets give shape and dtype; model indices in fz[0..*kf)), then the tied aliases
 * and the buffers. */
static zck_status zck__h5u_others(zck_h5u *u, const h5u_lists *l, uint32_t *fz, size_t *kf) {
  const char *fn = zck_h5_name(u->f);
  zck_model *m = u->m;
  size_t nf = l->frozen ? (size_t)cJSON_GetArraySize(l->frozen) : 0;
  zck_status st = zck__h5u_alloc(&u->parts[ZCK_H5U_FROZEN], nf);
  const cJSON *it;
  cJSON_ArrayForEach(it, l->frozen) {
    if (st != ZCK_OK || !cJSON_IsString(it)) break;
    char *p = zck_h5u_path(ZCK_H5U_FROZEN, it->valuestring);
    if (!p) { st = ZCK_ERR_NO_MEMORY; break; }
    bool have = zck_h5_exists(u->f, p);
    if (have) st = zck__h5u_add(u, &u->parts[ZCK_H5U_FROZEN], p, 0, NULL, false);
    free(p);
    if (!have || st != ZCK_OK) continue;
    zck_h5_dataset *d = u->parts[ZCK_H5U_FROZEN].ds[*kf];
    const zck_h5_dataset_info *di = zck_h5_dataset_info_of(d);
    uint32_t pi;
    st = zck_model_add_param(m, it->valuestring, di->ndim, di->shape, di->dtype, &pi);
    if (st == ZCK_OK) zck_model_set_frozen(m, pi, true);
    fz[(*kf)++] = pi;
  }
  for (cJSON *t = l->tied ? l->tied->child : NULL; st == ZCK_OK && t; t = t->next) {
    int64_t si = cJSON_IsString(t) ? zck_model_find_param(m, t->valuestring) : -1;
    if (si < 0) { st = zck__fail(ZCK_ERR_FORMAT, "%s: tied_parameters: %s names no parameter", fn, t->string); break; }
    const zck_param *sp = &m->params[si];
    uint32_t pi;
    st = zck_model_add_param(m, t->string, sp->ndim, sp->shape, sp->dtype, &pi);
    if (st == ZCK_OK) st = zck_model_set_tied(m, pi, (uint32_t)si);
  }
  size_t nb = l->bufs ? (size_t)cJSON_GetArraySize(l->bufs) : 0;
  if (st == ZCK_OK) st = zck__h5u_alloc(&u->buffers, nb);
  cJSON_ArrayForEach(it, l->bufs) {
    if (st != ZCK_OK || !cJSON_IsString(it)) break;
    char *p = zck_h5u_buffer_path(it->valuestring);
    st = p ? zck__h5u_add(u, &u->buffers, p, 0, NULL, false) : ZCK_ERR_NO_MEMORY;
    free(p);
    if (st != ZCK_OK) break;
    const zck_h5_dataset_info *di = zck_h5_dataset_info_of(u->buffers.ds[u->buffers.n - 1]);
    st = zck_model_add_buffer(m, it->valuestring, di->ndim, di->shape, di->dtype, NULL);
  }
  return st;
}

/* Each part's layout: every dataset one whole tensor. */
static zck_status zck__h5u_layouts(zck_h5u *u, const uint32_t *trainable, size_t k, const uint32_t *fz, size_t kf) {
  zck_model *m = u->m;
  uint64_t *numel = zck__calloc(m->n_params ? m->n_params : 1, sizeof *numel);
  zck_status st = numel ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) zck_model_numels(m, numel);
  for (int s = 0; st == ZCK_OK && s < 3; s++) st = zck_layout_whole(m->n_params, numel, trainable, k, &u->parts[s].layout);
  if (st == ZCK_OK && kf) st = zck_layout_whole(m->n_params, numel, fz, kf, &u->parts[ZCK_H5U_FROZEN].layout);
  if (st == ZCK_OK && m->n_buffers) {
    uint64_t *bn = zck__calloc(m->n_buffers, sizeof *bn);
    if (!bn) st = ZCK_ERR_NO_MEMORY;
    for (size_t i = 0; bn && i < m->n_buffers; i++) bn[i] = m->buffers[i].numel;
    if (st == ZCK_OK) st = zck_layout_whole(m->n_buffers, bn, NULL, m->n_buffers, &u->buffers.layout);
    free(bn);
  }
  free(numel);
  return st;
}

/* The container read as a model: header, trainable params, groups, the others, layouts. */
static zck_status zck__h5u_build(zck_h5u *u) {
  ZCK_TRY(zck__h5u_header(u));
  const char *fn = zck_h5_name(u->f);
  h5u_lists l = {0};
  zck_status st = zck__h5u_json(u, "param_names", cJSON_Array, &l.names);
  if (st == ZCK_OK) st = zck__h5u_json(u, "param_shapes", cJSON_Object, &l.shapes);
  if (st == ZCK_OK) st = zck__h5u_json(u, "param_groups", cJSON_Array, &l.groups);
  if (st == ZCK_OK) st = zck__h5u_json(u, "tied_parameters", cJSON_Object, &l.tied);
  if (st == ZCK_OK) st = zck__h5u_json(u, "frozen_parameters", cJSON_Array, &l.frozen);
  if (st == ZCK_OK) st = zck__h5u_json(u, "buffer_names", cJSON_Array, &l.bufs);
  if (st == ZCK_OK && (!l.names || !l.shapes)) st = zck__fail(ZCK_ERR_FORMAT, "%s: param_names / param_shapes attributes missing", fn);
  if (st == ZCK_OK && !(u->m = zck_model_new())) st = ZCK_ERR_NO_MEMORY;
  size_t nt = l.names ? (size_t)cJSON_GetArraySize(l.names) : 0, nf = l.frozen ? (size_t)cJSON_GetArraySize(l.frozen) : 0;
  for (int s = 0; st == ZCK_OK && s < 3; s++) st = zck__h5u_alloc(&u->parts[s], nt);
  uint32_t *trainable = zck__calloc(nt ? nt : 1, sizeof *trainable), *fz = zck__calloc(nf ? nf : 1, sizeof *fz);
  if (st == ZCK_OK && (!trainable || !fz)) st = ZCK_ERR_NO_MEMORY;
  size_t k = 0, kf = 0;
  if (st == ZCK_OK) st = zck__h5u_trainable(u, &l, trainable, &k);
  if (st == ZCK_OK) st = zck__h5u_groups(u, l.groups);
  if (st == ZCK_OK) st = zck__h5u_others(u, &l, fz, &kf);
  if (st == ZCK_OK) st = zck__h5u_layouts(u, trainable, k, fz, kf);
  free(trainable);
  free(fz);
  cJSON_Delete(l.names);
  cJSON_Delete(l.shapes);
  cJSON_Delete(l.groups);
  cJSON_Delete(l.tied);
  cJSON_Delete(l.frozen);
  cJSON_Delete(l.bufs);
  return st;
}

/* The checksum table lists every piece of every dataset written; the container's own
 * datasets must be exactly those: one deleted (a side file, /resume_state, a frozen param)
 * or added (a side file a reshard would restore) is refused here, as one edited is when
 * it is read. */
static zck_status zck__h5u_check_count(zck_h5u *u) {
  const zck__h5c_table *t = zck__h5_file_table(u->f);
  if (!t) return ZCK_OK;
  uint64_t have = u->described_pieces;
  size_t opened = 1; /* the table */
  for (int p = 0; p < ZCK_H5U_PART_COUNT; p++)
    for (size_t i = 0; i < u->parts[p].n; i++)
      if (u->parts[p].ds[i]) {
        have += zck__h5_dataset_pieces(u->parts[p].ds[i]);
        opened++;
      }
  for (size_t i = 0; i < u->buffers.n; i++) have += zck__h5_dataset_pieces(u->buffers.ds[i]);
  opened += u->buffers.n;
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i <= u->info.n_side_files; i++) {
    char *p = i < u->info.n_side_files ? zck__sprintf("%s/%s", ZCK_H5U_SIDE_FILES, u->side[i]) : zck__strdup(ZCK_H5U_RESUME_STATE);
    zck_h5_dataset *d = NULL;
    if (!p) st = ZCK_ERR_NO_MEMORY;
    else if (i < u->info.n_side_files || zck_h5_exists(u->f, p)) st = zck_h5_dataset_open(u->f, p, &d);
    if (d) have += zck__h5_dataset_pieces(d);
    opened += d != NULL;
    zck_h5_dataset_close(d);
    free(p);
  }
  if (st == ZCK_OK && have != t->n)
    st = zck__fail(ZCK_ERR_DAMAGED, "%s: damaged: its datasets hold %llu checksum pieces, its checksum table lists %zu "
                   "(a dataset deleted or added)", zck_h5_name(u->f), (unsigned long long)have, t->n);
  /* one added where no job looks (/evil, /params/<p>/momentum) holds no piece of the
   * table: found by counting what the walk saw (a whole walk: the jobs' opens; inspect's
   * lazy one does not enter the params' groups) */
  size_t in_file;
  if (st == ZCK_OK && !u->described && zck__h5_file_datasets(u->f, &in_file) && in_file > opened)
    st = zck__fail(ZCK_ERR_DAMAGED, "%s: damaged: it holds %zu datasets, the container is %zu (a dataset added, "
                   "not in its checksum table)", zck_h5_name(u->f), in_file, opened);
  return st;
}

/* The container over f, whose metadata was read (lazily when describing); takes f. */
static zck_status zck__h5u_over(zck_h5_file *f, bool describe, zck_h5u **out) {
  *out = NULL;
  zck_h5u *u = zck__calloc(1, sizeof *u);
  if (!u) {
    zck_h5_close(f);
    return ZCK_ERR_NO_MEMORY;
  }
  u->described = describe;
  u->f = f;
  /* the root attributes (names, shapes, groups, ds_config) sit where HDF5's default file
   * format keeps no checksum: their digest is checked before anything is built from them */
  zck_status st = zck_h5_check_attrs(u->f);
  if (st == ZCK_OK) st = zck__h5u_build(u);
  if (st == ZCK_OK) st = zck__h5u_check_count(u);
  if (st != ZCK_OK) {
    zck_h5u_close(u);
    return st;
  }
  *out = u;
  return ZCK_OK;
}

static zck_status zck__h5u_open(const char *path, bool describe, zck_h5u **out) {
  *out = NULL;
  zck_h5_file *f = NULL;
  /* describing: the walk lists /params but opens none of its groups (h5_probe.c) */
  ZCK_TRY(describe ? zck_h5_open_lazy(path, "params", &f) : zck_h5_open(path, &f));
  return zck__h5u_over(f, describe, out);
}

zck_status zck_h5u_open(const char *path, zck_h5u **out) { return zck__h5u_open(path, false, out); }
zck_status zck_h5u_open_file(zck_h5_file *f, zck_h5u **out) { return zck__h5u_over(f, false, out); }
zck_status zck_h5u_describe(const char *path, zck_h5u **out) { return zck__h5u_open(path, true, out); }

static void zck__h5u_part_free(zck__h5u_part *p) {
  for (size_t i = 0; i < p->n; i++) zck_h5_dataset_close(p->ds[i]);
  free(p->ds);
  free(p->stores);
  zck_layout_free(p->layout);
}

void zck_h5u_close(zck_h5u *u) {
  if (!u) return;
  for (int s = 0; s < ZCK_H5U_PART_COUNT; s++) zck__h5u_part_free(&u->parts[s]);
  zck__h5u_part_free(&u->buffers);
  zck_model_free(u->m);
  zck_h5_close(u->f);
  free(u->ds_version);
  free(u->ds_config);
  free(u->tag);
  free(u->autoep);
  for (size_t i = 0; u->side && i < u->info.n_side_files; i++) free(u->side[i]);
  free(u->side);
  for (size_t i = 0; u->unsaved && u->unsaved[i]; i++) free(u->unsaved[i]);
  free(u->unsaved);
  free(u);
}

const zck_h5u_info *zck_h5u_info_of(const zck_h5u *u) { return &u->info; }
zck_h5_file *zck_h5u_file(const zck_h5u *u) { return u->f; }
const zck_model *zck_h5u_model(const zck_h5u *u) { return u->m; }

zck_status zck_h5u_get(const zck_h5u *u, zck_h5u_part part, const zck_layout **layout, const zck_store **stores) {
  if (part < 0 || part >= ZCK_H5U_PART_COUNT || !u->parts[part].layout)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no %s datasets", zck_h5_name(u->f), part == ZCK_H5U_FROZEN ? "frozen" : "such");
  *layout = u->parts[part].layout;
  *stores = u->described && part != ZCK_H5U_FROZEN ? NULL : u->parts[part].stores;
  return ZCK_OK;
}

void zck_h5u_buffers(const zck_h5u *u, const zck_layout **layout, const zck_store **stores) {
  *layout = u->buffers.layout;
  *stores = u->buffers.stores;
}

const char *zck_h5u_side_file_name(const zck_h5u *u, size_t i) {
  ZCK_ASSERT(i < u->info.n_side_files);
  return u->side[i];
}

zck_status zck_h5u_side_file_write(const zck_h5u *u, size_t i, const char *path) {
  ZCK_ASSERT(i < u->info.n_side_files);
  char *ds_path = zck__sprintf("%s/%s", ZCK_H5U_SIDE_FILES, u->side[i]);
  if (!ds_path) return ZCK_ERR_NO_MEMORY;
  zck_h5_dataset *d = NULL;
  zck_status st = zck_h5_dataset_open(u->f, ds_path, &d);
  const zck_h5_dataset_info *di = st == ZCK_OK ? zck_h5_dataset_info_of(d) : NULL;
  if (di && (di->ndim != 1 || (di->dtype != ZCK_U8 && di->dtype != ZCK_I8)))
    st = zck__fail(ZCK_ERR_FORMAT, "%s:%s: not a 1-d uint8 dataset", zck_h5_name(u->f), ds_path);
  enum { PIECE = 4 << 20 };
  uint8_t *buf = st == ZCK_OK ? zck__malloc(di->numel < PIECE ? (di->numel ? di->numel : 1) : PIECE) : NULL;
  if (st == ZCK_OK && !buf) st = ZCK_ERR_NO_MEMORY;
  zck__outfile f;
  bool open = false;
  if (st == ZCK_OK) open = (st = zck__outfile_create(&f, path)) == ZCK_OK;
  for (uint64_t off = 0; st == ZCK_OK && off < di->numel; off += PIECE) {
    uint64_t n = di->numel - off < PIECE ? di->numel - off : PIECE;
    st = zck_h5_dataset_read(d, buf, off, n);
    if (st == ZCK_OK) st = zck__outfile_pwrite(&f, buf, (size_t)n, off);
  }
  if (open) {
    if (st == ZCK_OK) st = zck__outfile_commit(&f);
    else zck__outfile_abort(&f);
  }
  free(buf);
  zck_h5_dataset_close(d);
  free(ds_path);
  return st;
}

/* Whether a param group carries deepspeed.moe's marker (`moe: True`, set by
 * split_params_into_different_moe_groups_for_optimizer on the experts' group). */
static bool has_moe_group(const zck_model *m) {
  for (uint32_t g = 0; g < m->n_groups; g++) {
    const zck_hparam *h = zck_model_group_get(m, g, "moe");
    if (h && h->kind == ZCK_HP_BOOL && h->i) return true;
  }
  return false;
}

zck_status zck_h5u_moe_refuse(const zck_h5u *u, const char *job) {
  if (!u) return ZCK_OK;
  if (u->info.autoep_layers_json)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a universal container of an AutoEP (expert-parallel) checkpoint: %s does "
                     "not write AutoEP's layout from it (consolidate, inspect and verify read it)", zck_h5_name(u->f), job);
  /* the expert-file writer works from the source's own expert files, which the container does not hold; a
   * plain ZeRO layout of the same params would not load into deepspeed.moe's engine */
  if (has_moe_group(u->m))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a universal container of a deepspeed.moe (expert files) checkpoint: %s "
                     "does not write its expert files from it (consolidate, inspect and verify read it)",
                     zck_h5_name(u->f), job);
  return ZCK_OK;
}
