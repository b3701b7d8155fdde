/* ds_zero0.c: ZeRO-0 checkpoints, described as the other layouts are.
 *
 * A ZeRO-0 engine saves no optimizer files: mp_rank_00_model_states.pt holds `module` (the
 * whole model in the training dtype), param_shapes / shared_params None, and `optimizer`,
 * the optimizer's own state_dict (deepspeed-checkpoint.md §2; DeepSpeed 0.19.8 engine.py
 * _common_checkpoint_state):
 *   - fp32: the torch optimizer's {state, param_groups}; the module's params are the masters;
 *   - bf16: FP16_UnfusedOptimizer's {dynamic_loss_scale, cur_scale, cur_iter,
 *     optimizer_state_dict, fp32_groups}: fp32_groups[g][i] is the fp32 master of the i-th
 *     param of group g, whole-shaped, parallel to the torch state's indices.
 * The torch state numbers params 0..n-1 group by group and names none of them. Which module
 * entry each index trains is found by shape, in module order: optimizer groups built from
 * module.parameters() / named_parameters() keep that order (DeepSpeed's default group, HF
 * Trainer's decay / no-decay groups). A checkpoint where the shapes allow two answers (a
 * frozen layer shaped like a trained one, a shape both groups want next) is refused by
 * name: guessing would label one param's values with another's name.
 * The answer becomes the file's param_shapes (one list per optimizer group) and
 * shared_params (module entries that are the same tensor), so the manifest, the outputs and
 * the writers treat ZeRO-0 like stage 1: trainable params in a whole-tensor layout whose
 * stores are the masters and the Adam moments where they lie in the model file. */
#include "ds_internal.h"
#include "strmap.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void zck__ds_zero0_free(zck__ds_zero0 *z) {
  if (z->doc) zck_pk_doc_free(z->doc);
  free(z->master);
  free(z->exp_avg);
  free(z->exp_avg_sq);
  free(z->module_of);
  free(z->group_first);
  memset(z, 0, sizeof *z);
}

static bool same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
  if (na != nb) return false;
  for (int i = 0; i < na; i++)
    if (a[i] != b[i]) return false;
  return true;
}

/* Which module entries are buffers and which are second names of an earlier entry's tensor
 * (a tied head: same storage, offset, dtype and shape; torch.save writes the tensor once
 * and module_state_dict lists both names). Both through hash tables: a module of 100k
 * entries made a scan per entry quadratic. */
typedef struct module_index {
  zck__strmap buffers, tensors;
  char **keys;           /* the tensors table's keys, owned */
  size_t n;
} module_index;

static void module_index_free(module_index *x) {
  zck__strmap_free(&x->buffers);
  zck__strmap_free(&x->tensors);
  for (size_t i = 0; x->keys && i < x->n; i++) free(x->keys[i]);
  free(x->keys);
}

/* "storage key / offset / dtype / shape": equal strings are the same tensor */
static char *tensor_key(const zck__ds_tref *t) {
  zck__buf b;
  zck__buf_init(&b);
  zck__buf_printf(&b, "%s/%llu/%d/", t->rec_key, (unsigned long long)t->offset, (int)t->dtype);
  for (int d = 0; d < t->ndim; d++) zck__buf_printf(&b, "%lld,", (long long)t->shape[d]);
  zck__buf_byte(&b, 0);
  if (b.failed) {
    zck__buf_free(&b);
    return NULL;
  }
  return (char *)b.data;
}

/* alias[i]: the first earlier entry holding entry i's tensor, or -1; buffer[i] set for buffers */
static zck_status module_index_build(const zck__ds_model_file *mf, module_index *x, int64_t *alias, bool *buffer) {
  memset(x, 0, sizeof *x);
  bool dup;
  ZCK_TRY(zck__strmap_init(&x->buffers, mf->n_buffer_names));
  for (size_t i = 0; i < mf->n_buffer_names; i++) ZCK_TRY(zck__strmap_put(&x->buffers, mf->buffer_names[i], i, &dup, NULL));
  if (!(x->keys = zck__calloc(mf->n_module + 1, sizeof *x->keys))) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < mf->n_module; i++) {
    const zck__ds_tref *t = &mf->module_t[i];
    size_t b;
    buffer[i] = zck__strmap_get(&x->buffers, mf->module_names[i], &b);
    alias[i] = -1;
    if (!t->has_record) continue;
    char *key = tensor_key(t);
    if (!key) return ZCK_ERR_NO_MEMORY;
    x->keys[x->n++] = key;
    size_t first = 0;
    ZCK_TRY(zck__strmap_put(&x->tensors, key, i, &dup, &first));
    if (dup && t->numel && !buffer[i]) alias[i] = (int64_t)first;
  }
  return ZCK_OK;
}

/* param_groups: the params numbered 0..n-1 in order, group by group (torch's state_dict
 * numbers them so); z->group_first and z->n. */
static zck_status read_group_params(zck__ds_zero0 *z, const zck_pk *pg, const char *path, const char *what) {
  z->n_groups = pg->u.seq.len;
  if (!(z->group_first = zck__calloc(z->n_groups + 1, sizeof *z->group_first))) return ZCK_ERR_NO_MEMORY;
  size_t n = 0;
  for (size_t g = 0; g < z->n_groups; g++) {
    int64_t *ids;
    size_t k;
    char w[160];
    snprintf(w, sizeof w, "%s['param_groups'][%zu]['params']", what, g);
    ZCK_TRY_CTX(zck__ds_int_list(zck_pk_dict_get(pg->u.seq.items[g], "params"), &ids, &k, w), "%s", path);
    z->group_first[g] = n;
    for (size_t i = 0; i < k; i++, n++)
      if (ids[i] != (int64_t)n) {
        free(ids);
        return zck__fail(ZCK_ERR_FORMAT, "%s: %s lists param %lld where %zu comes next", path, w, (long long)ids[i], n);
      }
    free(ids);
  }
  z->group_first[z->n_groups] = n;
  z->n = n;
  return ZCK_OK;
}

/* Param k's exp_avg and exp_avg_sq: contiguous, of one shape. */
static zck_status read_moments(zck__ds_zero0 *z, const zck_torch_file *tf, const zck_pk *sd, int64_t k,
                               const char *what) {
  const char *path = zck_torch_name(tf);
  const zck_pk *ea = zck_pk_dict_get(sd, "exp_avg"), *eas = zck_pk_dict_get(sd, "exp_avg_sq");
  if (!ea || !eas)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s['state'][%lld] has no exp_avg / exp_avg_sq (not an Adam optimizer)",
                     path, what, (long long)k);
  char w1[160], w2[160];
  snprintf(w1, sizeof w1, "%s['state'][%lld]['exp_avg']", what, (long long)k);
  snprintf(w2, sizeof w2, "%s['state'][%lld]['exp_avg_sq']", what, (long long)k);
  ZCK_TRY(zck__ds_tensor(tf, ea, &z->exp_avg[k], w1));
  ZCK_TRY(zck__ds_tensor(tf, eas, &z->exp_avg_sq[k], w2));
  if (!same_shape(z->exp_avg[k].ndim, z->exp_avg[k].shape, z->exp_avg_sq[k].ndim, z->exp_avg_sq[k].shape))
    return zck__fail(ZCK_ERR_MISMATCH, "%s: %s and exp_avg_sq differ in shape", path, w1);
  if (!z->exp_avg[k].contiguous || !z->exp_avg_sq[k].contiguous)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s['state'][%lld]: a strided view", path, what, (long long)k);
  return ZCK_OK;
}

/* Param k's Adam step: an int, a float or a one-element tensor (*is_tensor). */
static zck_status read_step(const zck_torch_file *tf, const zck_pk *sd, int64_t k, const char *what, double *v,
                            bool *is_tensor) {
  const char *path = zck_torch_name(tf);
  const zck_pk *step = zck_pk_dict_get(sd, "step");
  const zck_torch_tensor *tt = step ? zck_torch_tensor_of(tf, step) : NULL;
  int64_t iv;
  *v = 0;
  *is_tensor = false;
  if (step && step->kind == ZCK_PK_INT && zck_pk_as_int(step, &iv)) {
    *v = (double)iv;
  } else if (step && step->kind == ZCK_PK_FLOAT) {
    *v = step->u.f;
  } else if (tt) {
    uint8_t raw[16];
    if (zck_torch_tensor_numel(tt) != 1 || zck_dtype_size(tt->dtype) > sizeof raw || !zck_dtype_convertible(ZCK_F64, tt->dtype))
      return zck__fail(ZCK_ERR_FORMAT, "%s: %s['state'][%lld]['step'] is not a scalar", path, what, (long long)k);
    ZCK_TRY(zck_torch_tensor_read(tf, tt, raw, 0, 1));
    ZCK_TRY(zck_convert(ZCK_F64, v, tt->dtype, raw, 1));
    *is_tensor = true;
  } else {
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s['state'][%lld]['step'] is missing or neither a number nor a tensor", path,
                     what, (long long)k);
  }
  return ZCK_OK;
}

/* The torch state_dict: param_groups numbering 0..n-1 in order, and per index the Adam
 * state (all or none). */
static zck_status read_torch_state(zck_ds_ckpt *c, const zck_torch_file *tf, const zck_pk *osd, const char *what,
                                   bool unfused) {
  zck__ds_zero0 *z = &c->z0;
  const char *path = zck_torch_name(tf);
  const zck_pk *pg = zck_pk_dict_get(osd, "param_groups");
  const zck_pk *st = zck_pk_dict_get(osd, "state");
  if (!pg || pg->kind != ZCK_PK_LIST || !st || st->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s has no param_groups list / state dict", path, what);
  c->param_groups = pg;
  ZCK_TRY(read_group_params(z, pg, path, what));
  size_t n = z->n;
  z->master = zck__calloc(n + 1, sizeof *z->master);
  z->exp_avg = zck__calloc(n + 1, sizeof *z->exp_avg);
  z->exp_avg_sq = zck__calloc(n + 1, sizeof *z->exp_avg_sq);
  z->module_of = zck__calloc(n + 1, sizeof *z->module_of);
  if (!z->master || !z->exp_avg || !z->exp_avg_sq || !z->module_of) return ZCK_ERR_NO_MEMORY;
  if (st->u.dict.len == 0) return ZCK_OK;   /* saved before the first step */
  if (st->u.dict.len != n)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s['state'] has %zu entries for %zu params (params without Adam state "
                     "are not supported)", path, what, st->u.dict.len, n);
  bool *seen = zck__calloc(n + 1, 1);
  if (!seen) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  /* FP16_UnfusedOptimizer and FP16_Optimizer step once with zero gradients when they are
   * built (initialize_optimizer_states), so the count is one ahead of the engine's */
  int64_t applied = c->models[0].global_steps - c->models[0].skipped_steps + (unfused ? 1 : 0);
  c->info.step_ahead = unfused ? 1 : 0;
  for (size_t i = 0; s == ZCK_OK && i < n; i++) {
    int64_t k;
    if (!zck_pk_as_int(st->u.dict.keys[i], &k) || k < 0 || (uint64_t)k >= n || seen[k]) {
      s = zck__fail(ZCK_ERR_FORMAT, "%s: %s['state'] key %zu is not a new param index 0..%zu", path, what, i, n - 1);
      break;
    }
    seen[k] = true;
    const zck_pk *sd = st->u.dict.values[i];
    double v;
    bool is_tensor;
    if ((s = read_moments(z, tf, sd, k, what)) != ZCK_OK) break;
    /* the step, as the ZeRO readers check it (ds_open.c check_steps) */
    if ((s = read_step(tf, sd, k, what, &v, &is_tensor)) != ZCK_OK) break;
    if (v < 16777216.0 && applied < 16777216 && v != (double)applied) {
      s = zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer step %.17g (param %lld), but global_steps %lld - skipped_steps %lld%s "
                    "= %lld", path, v, (long long)k, (long long)c->models[0].global_steps,
                    (long long)c->models[0].skipped_steps, unfused ? " + 1 (the fp16 optimizer's step at its construction)" : "",
                    (long long)applied);
      break;
    }
    if (i && v != c->info.step) {
      s = zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer step %.17g (param %lld) but %.17g elsewhere", path, v, (long long)k,
                    c->info.step);
      break;
    }
    c->info.step = v;
    c->info.step_is_tensor = is_tensor;
  }
  free(seen);
  if (s == ZCK_OK) z->has_state = true;
  return s;
}

/* FP16_UnfusedOptimizer's fp32_groups: a list per param group of whole fp32 tensors. */
static zck_status read_fp32_groups(zck_ds_ckpt *c, const zck_torch_file *tf, const zck_pk *fg) {
  zck__ds_zero0 *z = &c->z0;
  const char *path = zck_torch_name(tf);
  if (!fg || fg->kind != ZCK_PK_LIST || fg->u.seq.len != z->n_groups)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer['fp32_groups'] is not a list of %zu groups (one per param group)",
                     path, z->n_groups);
  for (size_t g = 0; g < z->n_groups; g++) {
    const zck_pk *l = fg->u.seq.items[g];
    size_t want = z->group_first[g + 1] - z->group_first[g];
    if (!l || l->kind != ZCK_PK_LIST || l->u.seq.len != want)
      return zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer['fp32_groups'][%zu] is not a list of %zu tensors (the group's "
                       "params)", path, g, want);
    for (size_t i = 0; i < want; i++) {
      size_t k = z->group_first[g] + i;
      char w[96];
      snprintf(w, sizeof w, "optimizer['fp32_groups'][%zu][%zu]", g, i);
      ZCK_TRY(zck__ds_tensor(tf, l->u.seq.items[i], &z->master[k], w));
      if (!z->master[k].contiguous) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s is a strided view", path, w);
      if (z->master[k].dtype != z->master[0].dtype)
        return zck__fail(ZCK_ERR_MISMATCH, "%s: %s is %s but fp32_groups[0][0] is %s", path, w,
                         zck_dtype_name(z->master[k].dtype), zck_dtype_name(z->master[0].dtype));
      if (z->has_state && !same_shape(z->exp_avg[k].ndim, z->exp_avg[k].shape, z->master[k].ndim, z->master[k].shape))
        return zck__fail(ZCK_ERR_MISMATCH, "%s: %s and its exp_avg differ in shape", path, w);
    }
  }
  z->has_masters = true;
  return ZCK_OK;
}

/* The shape of optimizer param k, or NULL when the file does not say (fp32, no state). */
static const zck__ds_tref *opt_shape(const zck__ds_zero0 *z, size_t k) {
  return z->has_masters ? &z->master[k] : z->has_state ? &z->exp_avg[k] : NULL;
}

/* Assigns optimizer params to module entries: each group takes its params in module order,
 * an entry no group takes is frozen. Forward (each group its earliest fit) and backward
 * (its latest) must agree and never have two groups want the same entry; otherwise the
 * shapes do not decide, and the message names the entry. */
static zck_status match(zck_ds_ckpt *c, const bool *cand, int64_t *fwd, int64_t *bwd) {
  zck__ds_zero0 *z = &c->z0;
  const zck__ds_model_file *mf = &c->models[0];
  const char *path = mf->file->path;
  size_t *cur = zck__calloc(z->n_groups + 1, sizeof *cur);
  if (!cur) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  for (int pass = 0; pass < 2 && s == ZCK_OK; pass++) {
    int64_t *out = pass ? bwd : fwd;
    for (size_t g = 0; g < z->n_groups; g++) cur[g] = pass ? z->group_first[g + 1] : z->group_first[g];
    for (size_t step = 0; step < mf->n_module && s == ZCK_OK; step++) {
      size_t i = pass ? mf->n_module - 1 - step : step;
      out[i] = -1;
      if (!cand[i]) continue;
      const zck__ds_tref *t = &mf->module_t[i];
      int64_t want = -1;
      for (size_t g = 0; g < z->n_groups; g++) {
        bool left = pass ? cur[g] > z->group_first[g] : cur[g] < z->group_first[g + 1];
        if (!left) continue;
        size_t k = pass ? cur[g] - 1 : cur[g];
        const zck__ds_tref *o = opt_shape(z, k);
        if (!same_shape(t->ndim, t->shape, o->ndim, o->shape)) continue;
        if (want >= 0) {
          char sh[96];
          s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: ZeRO-0 optimizer state names no params, and module['%s'] (shape %s) "
                        "fits both param group %lld and %zu: cannot tell which params are trained", path,
                        mf->module_names[i], zck_shape_str(t->ndim, t->shape, sh, sizeof sh), (long long)want, g);
          break;
        }
        want = (int64_t)g;
      }
      if (s != ZCK_OK || want < 0) continue;
      out[i] = pass ? (int64_t)--cur[want] : (int64_t)cur[want]++;
    }
    for (size_t g = 0; s == ZCK_OK && g < z->n_groups; g++)
      if (cur[g] != (pass ? z->group_first[g] : z->group_first[g + 1])) {
        size_t k = pass ? cur[g] - 1 : cur[g];
        char sh[96];
        const zck__ds_tref *o = opt_shape(z, k);
        s = zck__fail(ZCK_ERR_MISMATCH, "%s: ZeRO-0 optimizer param %zu of group %zu (shape %s) matches no module "
                      "parameter in order", path, k - z->group_first[g], g, zck_shape_str(o->ndim, o->shape, sh, sizeof sh));
      }
  }
  for (size_t i = 0; s == ZCK_OK && i < mf->n_module; i++)
    if (fwd[i] != bwd[i]) {
      size_t j = i + 1;  /* the other entry the shapes allow */
      while (j < mf->n_module && !(cand[j] && (fwd[j] != bwd[j]))) j++;
      char sh[96];
      const zck__ds_tref *t = &mf->module_t[i];
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: ZeRO-0 optimizer state names no params, and module['%s'] and ['%s'] (shape "
                    "%s) both fit: cannot tell which is trained and which frozen", path, mf->module_names[i],
                    j < mf->n_module ? mf->module_names[j] : "?", zck_shape_str(t->ndim, t->shape, sh, sizeof sh));
    }
  free(cur);
  return s;
}

/* Writes the answer as the file's param_shapes and shared_params. */
static zck_status fill_shapes(zck_ds_ckpt *c, const int64_t *alias, const int64_t *opt_of) {
  zck__ds_zero0 *z = &c->z0;
  zck__ds_model_file *mf = &c->models[0];
  mf->param_shapes = zck__calloc(z->n_groups + 1, sizeof *mf->param_shapes);
  if (!mf->param_shapes) return ZCK_ERR_NO_MEMORY;
  mf->n_param_shapes = z->n_groups;
  for (size_t g = 0; g < z->n_groups; g++) {
    size_t n = z->group_first[g + 1] - z->group_first[g];
    if (!(mf->param_shapes[g].v = zck__calloc(n + 1, sizeof *mf->param_shapes[g].v))) return ZCK_ERR_NO_MEMORY;
    mf->param_shapes[g].n = n;
  }
  for (size_t i = 0; i < mf->n_module; i++) {
    if (opt_of[i] < 0) continue;
    size_t k = (size_t)opt_of[i], g = 0;
    while (z->group_first[g + 1] <= k) g++;
    zck__ds_named_shape *ns = &mf->param_shapes[g].v[k - z->group_first[g]];
    const zck__ds_tref *t = &mf->module_t[i];
    if (!(ns->name = zck__strdup(mf->module_names[i]))) return ZCK_ERR_NO_MEMORY;
    ns->ndim = t->ndim;
    memcpy(ns->shape, t->shape, sizeof ns->shape);
    ns->numel = t->numel;
    z->module_of[k] = (int64_t)i;
  }
  size_t na = 0;
  for (size_t i = 0; i < mf->n_module; i++) na += alias[i] >= 0;
  mf->shared_alias = zck__calloc(na + 1, sizeof(char *));
  mf->shared_src = zck__calloc(na + 1, sizeof(char *));
  if (!mf->shared_alias || !mf->shared_src) return ZCK_ERR_NO_MEMORY;
  mf->has_shared = true;
  for (size_t i = 0; i < mf->n_module; i++) {
    if (alias[i] < 0) continue;
    mf->shared_alias[mf->n_shared] = zck__strdup(mf->module_names[i]);
    mf->shared_src[mf->n_shared] = zck__strdup(mf->module_names[alias[i]]);
    mf->n_shared++;
    if (!mf->shared_alias[mf->n_shared - 1] || !mf->shared_src[mf->n_shared - 1]) return ZCK_ERR_NO_MEMORY;
  }
  return ZCK_OK;
}

static bool put(zck_pk_doc *d, zck_pk *dict, const char *key, zck_pk *v) {
  zck_pk *k = zck_pk_new_str(d, key);
  return k && v && zck_pk_dict_set(d, dict, k, v);
}

/* ds_config['fp16'][key] as an int or bool node of d, else `def`. */
static zck_pk *fp16_cfg(zck_ds_ckpt *c, zck_pk_doc *d, const char *key, int64_t def, bool is_bool) {
  const zck_pk *v = zck_pk_dict_get(zck_pk_dict_get(c->ds_config, "fp16"), key);
  int64_t i = def;
  if (v && !zck_pk_as_int(v, &i)) i = def;
  return is_bool ? zck_pk_new_bool(d, i != 0) : zck_pk_new_int(d, i);
}

/* fp16 FP16_UnfusedOptimizer with dynamic loss scaling saves its scaler as loose keys
 * (cur_scale, cur_iter, last_overflow_iter, scale_factor, scale_window); a ZeRO-1/2/3 file
 * holds a DynamicLossScaler object, which the engine that loads it takes whole
 * (stage_1_and_2 _load_global_state). The object is built as the engine builds it from
 * ds_config['fp16'] (min_loss_scale, hysteresis, consecutive_hysteresis; DeepSpeed 0.19.8
 * precision_config.py defaults), carrying the saved keys' values. cur_hysteresis is not
 * saved: a ZeRO-0 engine resuming its own file starts it at `hysteresis` too. */
static zck_status dynamic_loss_scaler(zck_ds_ckpt *c, const zck_pk *opt, const char *path) {
  static const char *const saved[5] = {"cur_scale", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window"};
  for (int i = 0; i < 5; i++)
    if (!zck_pk_dict_get(opt, saved[i]))
      return zck__fail(ZCK_ERR_FORMAT, "%s: optimizer['%s'] missing (FP16_UnfusedOptimizer with dynamic_loss_scale saves "
                       "it)", path, saved[i]);
  zck_pk_doc *d = c->z0.doc = zck_pk_doc_new();
  zck_pk *st = d ? zck_pk_new_dict(d, 0) : NULL;
  bool ok = st != NULL;
  ok = ok && put(d, st, "cur_scale", zck__ds_pk_copy(d, zck_pk_dict_get(opt, "cur_scale")));
  ok = ok && put(d, st, "dynamic", zck_pk_new_bool(d, 1));
  for (int i = 1; ok && i < 5; i++) ok = put(d, st, saved[i], zck__ds_pk_copy(d, zck_pk_dict_get(opt, saved[i])));
  ok = ok && put(d, st, "min_scale", fp16_cfg(c, d, "min_loss_scale", 1, false));
  ok = ok && put(d, st, "delayed_shift", fp16_cfg(c, d, "hysteresis", 2, false));
  ok = ok && put(d, st, "cur_hysteresis", fp16_cfg(c, d, "hysteresis", 2, false));
  ok = ok && put(d, st, "consecutive_hysteresis", fp16_cfg(c, d, "consecutive_hysteresis", 0, true));
  ok = ok && put(d, st, "raise_error_at_min_scale", zck_pk_new_bool(d, 1));
  ok = ok && put(d, st, "dtype", zck_pk_new_global(d, "torch", "float16"));
  zck_pk *g = ok ? zck_pk_new_global(d, "deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler") : NULL;
  zck_pk *args = g ? zck_pk_new_tuple(d, 0) : NULL;
  zck_pk *obj = args ? zck_pk_new_object(d, g, args, 1, st) : NULL;
  if (!obj) return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory building the loss scaler", path);
  c->loss_scaler = obj;
  return ZCK_OK;
}

zck_status zck__ds_zero0_read(zck_ds_ckpt *c) {
  zck__ds_model_file *mf = &c->models[0];
  const char *path = mf->file->path;
  const zck_torch_file *tf = c->model0;
  const zck_pk *root = zck_torch_root(tf);
  const zck_pk *ps = zck_pk_dict_get(root, "param_shapes");
  if (ps && ps->kind != ZCK_PK_NONE)  /* DS-05: a ZeRO-1/2 model file without its optimizer files */
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: no *_optim_states.pt files, but %s is a ZeRO-1/2 model file (it has "
                     "param_shapes): incomplete checkpoint", c->fs.dir, mf->file->name);
  const zck_pk *opt = zck_pk_dict_get(root, "optimizer");
  if (!opt || opt->kind == ZCK_PK_NONE)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: no *_optim_states.pt files and no optimizer state in %s: not a ZeRO "
                     "checkpoint (saved without an optimizer?), or incomplete", c->fs.dir, mf->file->name);
  if (opt->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: 'optimizer' is not a dict", path);
  /* fp16 / bf16: FP16_Optimizer (FusedAdam; flat fp32 groups, ds_zero0_fused.c) or
   * FP16_UnfusedOptimizer (any other optimizer; per-param fp32 groups) wraps the torch one */
  const zck_pk *flat = zck_pk_dict_get(opt, "fp32_groups_flat");
  bool wrapped = flat || zck_pk_dict_get(opt, "fp32_groups");
  const zck_pk *osd = wrapped ? zck_pk_dict_get(opt, "optimizer_state_dict") : opt;
  if (!osd || osd->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_FORMAT, "%s: optimizer['optimizer_state_dict'] missing or not a dict", path);
  ZCK_TRY(read_torch_state(c, tf, osd, wrapped ? "optimizer['optimizer_state_dict']" : "optimizer", wrapped));
  if (wrapped && !flat) ZCK_TRY(read_fp32_groups(c, tf, zck_pk_dict_get(opt, "fp32_groups")));
  const zck_pk *dyn = zck_pk_dict_get(opt, "dynamic_loss_scale");
  if (wrapped && dyn && dyn->kind == ZCK_PK_BOOL && dyn->u.b) ZCK_TRY(dynamic_loss_scaler(c, opt, path));
  c->z0.wrapped = wrapped;
  c->info.world_size = mf->dp_world_size > 0 && mf->dp_world_size <= (1 << 20) ? (uint32_t)mf->dp_world_size : 1;

  /* module entries a param could be: not a buffer, not a second name of a tensor */
  size_t n = mf->n_module;
  bool *cand = zck__calloc(n + 1, 1);
  int64_t *alias = zck__calloc(n + 1, sizeof *alias), *fwd = zck__calloc(n + 1, sizeof *fwd),
          *bwd = zck__calloc(n + 1, sizeof *bwd);
  zck_status s = cand && alias && fwd && bwd ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t n_cand = 0;
  bool *buffer = zck__calloc(n + 1, 1);
  module_index mx = {0};
  if (s == ZCK_OK) s = buffer ? module_index_build(mf, &mx, alias, buffer) : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < n; i++) {
    cand[i] = !buffer[i] && alias[i] < 0;
    n_cand += cand[i];
  }
  module_index_free(&mx);
  free(buffer);
  if (s == ZCK_OK && flat) {
    s = zck__ds_zero0_fused(c, tf, flat, cand, fwd);
  } else if (s == ZCK_OK && !c->z0.has_masters && !c->z0.has_state) {
    /* no shapes: only "every param in one group, module order" is certain */
    if (c->z0.n_groups != 1 || c->z0.n != n_cand)
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: ZeRO-0 optimizer saved before its first step holds no shapes, and its "
                    "%zu params in %zu groups are not simply the module's %zu: cannot tell which params are trained", path,
                    c->z0.n, c->z0.n_groups, n_cand);
    for (size_t i = 0, k = 0; s == ZCK_OK && i < n; i++) fwd[i] = bwd[i] = cand[i] ? (int64_t)k++ : -1;
  } else if (s == ZCK_OK) {
    s = match(c, cand, fwd, bwd);
  }
  if (s == ZCK_OK) s = fill_shapes(c, alias, fwd);
  free(cand);
  free(alias);
  free(fwd);
  free(bwd);
  ZCK_TRY(s);

  /* one optimizer "file" (the model file) whose flat groups are the param groups, so the
   * manifest and the info read ZeRO-0 as they read the other stages */
  if (!(c->optims = zck__calloc(1, sizeof *c->optims))) return ZCK_ERR_NO_MEMORY;
  c->n_optims = 1;
  c->optims[0].file = mf->file;
  c->optims[0].partition_count = c->info.world_size;
  c->optims[0].n_flat = c->z0.n_groups;
  if (!(c->optims[0].flat = zck__calloc(c->z0.n_groups + 1, sizeof *c->optims[0].flat))) return ZCK_ERR_NO_MEMORY;
  return ZCK_OK;
}

/* Trainable params in a whole-tensor layout (store k = optimizer param k, flat order): the
 * masters (fp32_groups, else the module's own tensors) and the Adam moments. */
zck_status zck__ds_zero0_build_train(zck_ds_ckpt *c, const uint64_t *numels) {
  zck__ds_zero0 *z = &c->z0;
  const zck__ds_model_file *mf = &c->models[0];
  const zck_model *m = c->model;
  const char *path = mf->file->path;
  /* dtypes: one master dtype, one state dtype */
  zck_dtype master = ZCK_DTYPE_INVALID;
  for (size_t k = 0; k < z->n; k++) {
    const zck__ds_tref *t = z->has_masters ? &z->master[k] : &mf->module_t[z->module_of[k]];
    if (!t->contiguous)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: the master of '%s' is a strided view", path, m->params[c->flat_params[k]].name);
    if (master == ZCK_DTYPE_INVALID) master = t->dtype;
    if (t->dtype != master)
      return zck__fail(ZCK_ERR_MISMATCH, "%s: the master of '%s' is %s, of '%s' %s", path, m->params[c->flat_params[k]].name,
                       zck_dtype_name(t->dtype), m->params[c->flat_params[0]].name, zck_dtype_name(master));
    if (z->has_state && (z->exp_avg[k].dtype != z->exp_avg[0].dtype || z->exp_avg_sq[k].dtype != z->exp_avg[0].dtype))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: the Adam state of '%s' is %s/%s, elsewhere %s", path,
                       m->params[c->flat_params[k]].name, zck_dtype_name(z->exp_avg[k].dtype),
                       zck_dtype_name(z->exp_avg_sq[k].dtype), zck_dtype_name(z->exp_avg[0].dtype));
  }
  c->info.master_dtype = master == ZCK_DTYPE_INVALID ? ZCK_F32 : master;
  c->info.has_optimizer_state = z->has_state && z->n > 0;
  c->info.state_dtype = c->info.has_optimizer_state ? z->exp_avg[0].dtype : ZCK_DTYPE_INVALID;
  ZCK_TRY(zck_layout_whole(m->n_params, numels, c->flat_params, z->n, &c->train_layout));
  for (int p = ZCK_DS_FP32; p <= ZCK_DS_EXP_AVG_SQ; p++)
    if (!(c->stores[p] = zck__calloc(z->n + 1, sizeof(zck_store)))) return ZCK_ERR_NO_MEMORY;
  for (size_t k = 0; k < z->n; k++) {
    const char *name = m->params[c->flat_params[k]].name;
    char what[640];
    if (z->has_masters) snprintf(what, sizeof what, "fp32_groups (master of '%.500s')", name);
    else snprintf(what, sizeof what, "module['%.500s']", name);
    const zck__ds_tref *t = z->has_masters ? &z->master[k] : &mf->module_t[z->module_of[k]];
    c->stores[ZCK_DS_FP32][k] = zck__ds_source_store(c, &mf->src, t, path, what);
    if (!c->info.has_optimizer_state) continue;
    snprintf(what, sizeof what, "optimizer state exp_avg of '%.500s'", name);
    c->stores[ZCK_DS_EXP_AVG][k] = zck__ds_source_store(c, &mf->src, &z->exp_avg[k], path, what);
    snprintf(what, sizeof what, "optimizer state exp_avg_sq of '%.500s'", name);
    c->stores[ZCK_DS_EXP_AVG_SQ][k] = zck__ds_source_store(c, &mf->src, &z->exp_avg_sq[k], path, what);
  }
  for (size_t k = 0; k < z->n; k++)
    if (!c->stores[ZCK_DS_FP32][k].name) return ZCK_ERR_NO_MEMORY;
  return ZCK_OK;
}
