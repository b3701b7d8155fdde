/* ds_read.c: the metadata of one model-states or optimizer-states file, read out of its
 * pickle (deepspeed-checkpoint.md §2). Tensors become (dtype, shape, file offset) records;
 * no tensor byte is read except the 0-dim `step`. Errors name the file and the key. */
#include "ds_internal.h"
#include "strmap.h"
#include "zip/zip.h"
#include "hash_xxh3.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static zck_status add_warning(char ***list, size_t *n, char *w) {
  char **nw = w ? zck__realloc(*list, (*n + 1) * sizeof *nw) : NULL;
  if (!nw) {
    free(w);
    return ZCK_ERR_NO_MEMORY;
  }
  *list = nw;
  nw[(*n)++] = w;
  return ZCK_OK;
}

zck_status zck__ds_warn(zck_ds_ckpt *c, const char *fmt, ...) {
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return add_warning(&c->warnings, &c->n_warnings, zck__strdup(buf));
}

/* A model file's warning, kept with the file until the reader takes it. */
static zck_status warn_file(zck__ds_model_file *mf, const char *fmt, ...) ZCK__PRINTF(2, 3);
static zck_status warn_file(zck__ds_model_file *mf, const char *fmt, ...) {
  char buf[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return add_warning(&mf->warnings, &mf->n_warnings, zck__strdup(buf));
}

zck_status zck__ds_take_warnings(zck_ds_ckpt *c, zck__ds_model_file *mf) {
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < mf->n_warnings; i++) {
    if (s == ZCK_OK) s = add_warning(&c->warnings, &c->n_warnings, mf->warnings[i]);
    else free(mf->warnings[i]);
  }
  free(mf->warnings);
  mf->warnings = NULL;
  mf->n_warnings = 0;
  return s;
}

/* A rank file that is a copy of another rank's: torch.save names the archive folder inside
 * after the file's stem, so a copy still names the rank it was saved as. Its shapes and
 * counts can all agree (ZeRO-3 partitions are padded to one size), and the other rank's
 * values would be written in this rank's place. An archive name that is no rank pattern
 * ("archive" from older torch or zckpt's writer, a file saved under another name) is fine. */
static zck_status check_archive_rank(const zck_torch_file *tf, const zck__ds_rankfile *rf, const char *what) {
  const char *arch = zck_torch_prefix(tf);
  if (!arch) return ZCK_OK;
  /* AutoTP: the TP rank ("mp_rank_XX") is part of the identity too */
  long own_mp = zck_ds_name_mp(rf->name, strlen(rf->name)), held_mp = zck_ds_name_mp(arch, strlen(arch));
  if (own_mp >= 0 && held_mp >= 0 && own_mp != held_mp)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: holds tensor-parallel rank %ld's %s (archive '%.200s'), expected mp rank %ld",
                     rf->path, held_mp, what, arch, own_mp);
  long own = zck_ds_name_rank(rf->name, strlen(rf->name));
  if (own < 0) return ZCK_OK;
  long held = zck_ds_name_rank(arch, strlen(arch));
  if (held < 0 || held == own) return ZCK_OK;
  return zck__fail(ZCK_ERR_MISMATCH, "%s: holds rank %ld's %s (archive '%.200s'), expected rank %ld", rf->path, held, what,
                   arch, own);
}

static bool is_float_dtype(zck_dtype t) {
  return t == ZCK_F32 || t == ZCK_F64 || t == ZCK_F16 || t == ZCK_BF16 || t == ZCK_F8_E4M3 || t == ZCK_F8_E5M2;
}

static void free_strs(char **v, size_t n) {
  if (!v) return;
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}


void zck__ds_model_file_free(zck__ds_model_file *mf) {
  if (!mf) return;
  free_strs(mf->module_names, mf->n_module);
  free(mf->module_t);
  free(mf->module_src);
  free(mf->module_path);
  free_strs(mf->buffer_names, mf->n_buffer_names);
  for (size_t i = 0; i < mf->n_param_shapes; i++) zck__ds_shape_list_free(&mf->param_shapes[i]);
  free(mf->param_shapes);
  zck__ds_shape_list_free(&mf->frozen_shapes);
  free_strs(mf->frag_names, mf->n_frags);
  free(mf->frag_t);
  zck__strmap_free(&mf->frag_map);
  free_strs(mf->shared_alias, mf->n_shared);
  free_strs(mf->shared_src, mf->n_shared);
  free(mf->ds_version);
  free_strs(mf->warnings, mf->n_warnings);
  if (mf->src_open) zck__source_close(&mf->src);
  zck__ds_autoep_file_free(mf->autoep);
  const zck__ds_rankfile *keep = mf->file;
  memset(mf, 0, sizeof *mf);
  mf->file = keep;
}

void zck__ds_optim_file_free(zck__ds_optim_file *of) {
  if (!of) return;
  free(of->flat);
  free(of->counts);
  free(of->group_paddings);
  if (of->psm_names) {
    for (size_t i = 0; i < of->n_flat; i++) {
      for (size_t k = 0; k < of->n_psm[i]; k++) free(of->psm_names[i][k]);
      free(of->psm_names[i]);
      free(of->psm_start[i]);
      free(of->psm_numel[i]);
    }
  }
  free(of->psm_names);
  free(of->psm_start);
  free(of->psm_numel);
  free(of->n_psm);
  if (of->param_paddings)
    for (size_t i = 0; i < of->n_flat; i++) free(of->param_paddings[i]);
  free(of->param_paddings);
  free(of->n_param_paddings);
  free(of->ds_version);
  if (of->src_open) zck__source_close(&of->src);
  const zck__ds_rankfile *keep = of->file;
  memset(of, 0, sizeof *of);
  of->file = keep;
}

static zck_status need_int(const zck_pk *root, const char *key, int64_t *out, const char *path) {
  const zck_pk *v = zck_pk_dict_get(root, key);
  if (!v) return zck__fail(ZCK_ERR_FORMAT, "%s: key '%s' missing (DeepSpeed's loader needs it)", path, key);
  if (v->kind != ZCK_PK_INT || !zck_pk_as_int(v, out))
    return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is not an int", path, key);
  return ZCK_OK;
}

/* A dict name -> tensor (module, frozen_param_fragments), in order. Non-tensor values
 * (a module's _extra_state objects) are skipped. */
static zck_status read_tensor_dict(zck__ds_model_file *mf, const zck_torch_file *tf, const zck_pk *d, char ***names,
                                   zck__ds_tref **trefs, size_t *n, const char *what) {
  const char *path = zck_torch_name(tf);
  if (!d || d->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is not a dict", path, what);
  size_t cap = d->u.dict.len ? d->u.dict.len : 1;
  *names = zck__calloc(cap, sizeof **names);
  *trefs = zck__calloc(cap, sizeof **trefs);
  if (!*names || !*trefs) return ZCK_ERR_NO_MEMORY;
  zck__strmap seen = {0}; /* keys are the pickle's strings, alive while tf is */
  zck_status s = zck__strmap_init(&seen, d->u.dict.len);
  for (size_t i = 0; s == ZCK_OK && i < d->u.dict.len; i++) {
    const char *name = zck_pk_as_str(d->u.dict.keys[i]);
    if (!name) { s = zck__fail(ZCK_ERR_FORMAT, "%s: %s: key %zu is not a string", path, what, i); break; }
    bool dup;
    if ((s = zck__strmap_put(&seen, name, i, &dup, NULL)) != ZCK_OK) break;
    if (dup) { s = zck__fail(ZCK_ERR_FORMAT, "%s: %s: duplicate key '%s'", path, what, name); break; }
    const zck_pk *v = d->u.dict.values[i];
    if (!zck_torch_tensor_of(tf, v)) {
      s = warn_file(mf, "%s: %s['%s'] is not a tensor; ignored", path, what, name);
      continue;
    }
    char ctx[512];
    snprintf(ctx, sizeof ctx, "%s['%.200s']", what, name);
    if ((s = zck__ds_tensor(tf, v, &(*trefs)[*n], ctx)) != ZCK_OK) break;
    if (!((*names)[*n] = zck__strdup(name))) { s = ZCK_ERR_NO_MEMORY; break; }
    (*n)++;
  }
  zck__strmap_free(&seen);
  return s;
}

static zck_status read_model_tail(zck_ds_ckpt *c, zck__ds_model_file *mf, const zck_torch_file *tf, const zck_pk *root,
                                  const char *path);

static zck_status read_model(zck_ds_ckpt *c, zck__ds_model_file *mf, const zck_torch_file *tf) {
  const char *path = mf->file->path;
  const zck_pk *root = zck_torch_root(tf);
  if (!root || root->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: not a model-states dict", path);

  ZCK_TRY(zck__ds_autoep_read(mf, root, path));  /* ds_autoep.c decides what of it is read */
  const zck_pk *bn = zck_pk_dict_get(root, "buffer_names");
  if (!bn) return zck__fail(ZCK_ERR_FORMAT, "%s: is not a model state checkpoint (no 'buffer_names')", path);
  if (bn->kind != ZCK_PK_LIST) return zck__fail(ZCK_ERR_FORMAT, "%s: 'buffer_names' is not a list", path);
  mf->buffer_names = zck__calloc(bn->u.seq.len ? bn->u.seq.len : 1, sizeof(char *));
  if (!mf->buffer_names) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < bn->u.seq.len; i++) {
    const char *s = zck_pk_as_str(bn->u.seq.items[i]);
    if (!s) return zck__fail(ZCK_ERR_FORMAT, "%s: buffer_names[%zu] is not a string", path, i);
    if (!(mf->buffer_names[i] = zck__strdup(s))) return ZCK_ERR_NO_MEMORY;
    mf->n_buffer_names++;
  }
  const zck_pk *module = zck_pk_dict_get(root, "module");
  if (!module) return zck__fail(ZCK_ERR_FORMAT, "%s: key 'module' missing (DeepSpeed's loader needs it)", path);
  /* PipelineModule: its weights are in layer_<XX>-model_states.pt, which ds_pipe.c makes the module entries */
  if (module->kind == ZCK_PK_NONE && !c->fs.n_layers)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: 'module' is None (a PipelineModule checkpoint) but the folder holds no "
                     "layer_<XX>-model_states.pt files", path);
  if (module->kind != ZCK_PK_NONE)
    ZCK_TRY(read_tensor_dict(mf, tf, module, &mf->module_names, &mf->module_t, &mf->n_module, "module"));

  ZCK_TRY(need_int(root, "dp_world_size", &mf->dp_world_size, path));
  ZCK_TRY(need_int(root, "mp_world_size", &mf->mp_world_size, path));
  ZCK_TRY(need_int(root, "global_steps", &mf->global_steps, path));
  ZCK_TRY(need_int(root, "skipped_steps", &mf->skipped_steps, path));
  mf->global_samples = -1;
  const zck_pk *gs = zck_pk_dict_get(root, "global_samples");
  if (gs && (gs->kind != ZCK_PK_INT || !zck_pk_as_int(gs, &mf->global_samples)))
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'global_samples' is not an int", path);
  const zck_pk *sa = zck_pk_dict_get(root, "zckpt_step_ahead");
  if (sa && (sa->kind != ZCK_PK_INT || !zck_pk_as_int(sa, &mf->step_ahead) || mf->step_ahead < 0 || mf->step_ahead > 1))
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'zckpt_step_ahead' is not 0 or 1", path);
  if (mf->mp_world_size != (int64_t)c->fs.n_mp)  /* AutoTP: one file set per mp rank (ds_autotp.c) */
    return zck__fail(ZCK_ERR_MISMATCH, "%s: mp_world_size %lld but the folder holds files of %u mp (tensor-parallel) "
                     "rank%s: stale files from another run?", path, (long long)mf->mp_world_size, c->fs.n_mp,
                     c->fs.n_mp == 1 ? "" : "s");
  if (mf->dp_world_size < 1) return zck__fail(ZCK_ERR_FORMAT, "%s: dp_world_size %lld < 1", path, (long long)mf->dp_world_size);

  const zck_pk *cpd = zck_pk_dict_get(root, "checkpoint_parallel_dimensions");  /* DS-30 */
  if (cpd && cpd->kind != ZCK_PK_NONE) {
    if (cpd->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: 'checkpoint_parallel_dimensions' is not a dict", path);
    const char *dims[2] = {"pp_degree", "tp_degree"};
    for (int k = 0; k < 2; k++) {
      const zck_pk *v = zck_pk_dict_get(cpd, dims[k]);
      int64_t x;
      if (!v || v->kind != ZCK_PK_INT || !zck_pk_as_int(v, &x) || x < 1)
        return zck__fail(ZCK_ERR_FORMAT, "%s: checkpoint_parallel_dimensions['%s'] is not a positive int", path, dims[k]);
      if (k == 1 && x == (int64_t)c->fs.n_mp) continue;  /* AutoTP's tp_degree: its files are here */
      if (k == 0 && x == (int64_t)c->fs.n_mp && c->fs.n_layers) continue;  /* a pipeline's stages (ds_pipe.c) */
      if (x != 1)
        return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s = %lld: pipeline/tensor-parallel checkpoints are not supported", path,
                         dims[k], (long long)x);
    }
  }

  const zck_pk *ps = zck_pk_dict_get(root, "param_shapes");  /* DS-22 */
  if (c->zero0 && (!ps || ps->kind == ZCK_PK_NONE)) return read_model_tail(c, mf, tf, root, path);  /* ds_zero0.c fills them */
  if (!ps || ps->kind == ZCK_PK_NONE)
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'param_shapes' missing or None: not a ZeRO checkpoint", path);
  if (ps->kind != ZCK_PK_LIST) return zck__fail(ZCK_ERR_FORMAT, "%s: 'param_shapes' is not a list of dicts", path);
  mf->param_shapes = zck__calloc(ps->u.seq.len ? ps->u.seq.len : 1, sizeof *mf->param_shapes);
  if (!mf->param_shapes) return ZCK_ERR_NO_MEMORY;
  for (size_t g = 0; g < ps->u.seq.len; g++) {
    char what[64];
    snprintf(what, sizeof what, "param_shapes[%zu]", g);
    mf->n_param_shapes++;
    ZCK_TRY(zck__ds_read_shape_dict(ps->u.seq.items[g], &mf->param_shapes[g], path, what));
  }

  return read_model_tail(c, mf, tf, root, path);
}

/* frozen_param_shapes / _fragments, shared_params, ds_version. */
static zck_status read_model_tail(zck_ds_ckpt *c, zck__ds_model_file *mf, const zck_torch_file *tf, const zck_pk *root,
                                  const char *path) {
  const zck_pk *fs = zck_pk_dict_get(root, "frozen_param_shapes");
  if (fs && fs->kind != ZCK_PK_NONE) {
    mf->has_frozen_shapes = true;
    ZCK_TRY(zck__ds_read_shape_dict(fs, &mf->frozen_shapes, path, "frozen_param_shapes"));
  }
  const zck_pk *ff = zck_pk_dict_get(root, "frozen_param_fragments");
  if (ff && ff->kind != ZCK_PK_NONE) {
    mf->has_frozen_frags = true;
    ZCK_TRY(read_tensor_dict(mf, tf, ff, &mf->frag_names, &mf->frag_t, &mf->n_frags, "frozen_param_fragments"));
    /* looked up per frozen param: a LoRA model's params are mostly frozen */
    ZCK_TRY(zck__strmap_init(&mf->frag_map, mf->n_frags));
    for (size_t i = 0; i < mf->n_frags; i++) {
      bool dup;
      ZCK_TRY(zck__strmap_put(&mf->frag_map, mf->frag_names[i], i, &dup, NULL));
    }
  }
  const zck_pk *sp = zck_pk_dict_get(root, "shared_params");
  if (sp && sp->kind != ZCK_PK_NONE) {
    if (sp->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: 'shared_params' is not a dict", path);
    mf->has_shared = true;
    size_t n = sp->u.dict.len;
    mf->shared_alias = zck__calloc(n ? n : 1, sizeof(char *));
    mf->shared_src = zck__calloc(n ? n : 1, sizeof(char *));
    if (!mf->shared_alias || !mf->shared_src) return ZCK_ERR_NO_MEMORY;
    for (size_t i = 0; i < n; i++) {
      const char *a = zck_pk_as_str(sp->u.dict.keys[i]), *s = zck_pk_as_str(sp->u.dict.values[i]);
      if (!a || !s) return zck__fail(ZCK_ERR_FORMAT, "%s: shared_params entry %zu is not str -> str", path, i);
      mf->shared_alias[i] = zck__strdup(a);
      mf->shared_src[i] = zck__strdup(s);
      mf->n_shared++;
      if (!mf->shared_alias[i] || !mf->shared_src[i]) return ZCK_ERR_NO_MEMORY;
    }
  }
  const zck_pk *ver = zck_pk_dict_get(root, "ds_version");
  if (ver && ver->kind != ZCK_PK_NONE) {
    const char *v = zck_pk_as_str(ver);
    if (!v) return zck__fail(ZCK_ERR_FORMAT, "%s: 'ds_version' is not a string", path);
    if (!(mf->ds_version = zck__strdup(v))) return ZCK_ERR_NO_MEMORY;
  }
  return ZCK_OK;
}

zck_status zck__ds_read_model_file(zck_ds_ckpt *c, zck__ds_model_file *mf, bool keep_torch) {
  const char *path = mf->file->path;
  ZCK_TRY(zck__source_open(&mf->src, path));
  mf->src_open = true;
  zck_torch_file *tf = NULL;
  zck_status s = zck_torch_open_source(&mf->src, &c->topts, &tf);
  if (s != ZCK_OK) return s;
  s = check_archive_rank(tf, mf->file, "model states");
  if (s == ZCK_OK) s = read_model(c, mf, tf);
  if (s == ZCK_OK && keep_torch) {
    c->model0 = tf;
    c->ds_config = zck_pk_dict_get(zck_torch_root(tf), "ds_config");
    c->lr_scheduler = zck_pk_dict_get(zck_torch_root(tf), "lr_scheduler");
  } else {
    zck_torch_close(tf);
  }
  return s;
}

/* ---- optimizer files */

static zck_status flat_tensor(const zck_torch_file *tf, const zck_pk *node, zck__ds_tref *out, const char *what) {
  const char *path = zck_torch_name(tf);
  ZCK_TRY(zck__ds_tensor(tf, node, out, what));
  /* DS-46 */
  if (out->ndim != 1)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s is %d-dimensional; a flat partition must be 1-D", path, what, out->ndim);
  if (!is_float_dtype(out->dtype))
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s has dtype %s; a flat partition must be floating point", path, what,
                     zck_dtype_name(out->dtype));
  if (!out->contiguous)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s is a strided view; flat partitions must be contiguous", path, what);
  return ZCK_OK;
}

/* The optimizer state: {state: {g: {exp_avg, exp_avg_sq, step}}, param_groups: [...]}. */
static zck_status read_state(zck_ds_ckpt *c, zck__ds_optim_file *of, const zck_torch_file *tf, const zck_pk *osd,
                             const char *what, bool rank0) {
  const char *path = of->file->path;
  if (!osd || osd->kind == ZCK_PK_NONE) {
    if (rank0) ZCK_TRY(zck__ds_warn(c, "%s: no %s: optimizer states (exp_avg, exp_avg_sq) unavailable", path, what));
    return ZCK_OK;
  }
  if (osd->kind == ZCK_PK_LIST) {
    /* elastic_checkpoint: per-group dicts with truncated states. The fp32 master is still
     * complete; resharding states from it is not supported. */
    if (rank0)
      ZCK_TRY(zck__ds_warn(c, "%s: %s is in the elastic format; optimizer states unavailable", path, what));
    return ZCK_OK;
  }
  if (osd->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a dict", path, what);
  const zck_pk *pg = zck_pk_dict_get(osd, "param_groups");
  if (!pg || pg->kind != ZCK_PK_LIST)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s['param_groups'] missing or not a list", path, what);
  if (rank0) c->param_groups = pg;
  const zck_pk *st = zck_pk_dict_get(osd, "state");
  if (!st || st->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s['state'] missing or not a dict", path, what);
  if (st->u.dict.len == 0) return ZCK_OK;  /* before the first optimizer step */
  if (st->u.dict.len != of->n_flat)  /* DS-54 / DS-62 */
    return zck__fail(ZCK_ERR_MISMATCH, "%s: %s['state'] has %zu entries but there are %zu flat groups", path, what,
                     st->u.dict.len, of->n_flat);
  for (size_t i = 0; i < st->u.dict.len; i++) {
    int64_t k;
    if (!zck_pk_as_int(st->u.dict.keys[i], &k) || k < 0 || (uint64_t)k >= of->n_flat)
      return zck__fail(ZCK_ERR_FORMAT, "%s: %s['state'] key %zu is not a flat-group index 0..%zu", path, what, i,
                       of->n_flat - 1);
    zck__ds_flat *fl = &of->flat[k];
    if (fl->has_state) return zck__fail(ZCK_ERR_FORMAT, "%s: %s['state'][%lld] appears twice", path, what, (long long)k);
    const zck_pk *sd = st->u.dict.values[i];
    char w1[128], w2[128];
    snprintf(w1, sizeof w1, "%s['state'][%lld]['exp_avg']", what, (long long)k);
    snprintf(w2, sizeof w2, "%s['state'][%lld]['exp_avg_sq']", what, (long long)k);
    const zck_pk *ea = zck_pk_dict_get(sd, "exp_avg"), *eas = zck_pk_dict_get(sd, "exp_avg_sq");
    if (!ea || !eas)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s['state'][%lld] has no exp_avg / exp_avg_sq (not an Adam optimizer)",
                       path, what, (long long)k);
    ZCK_TRY(flat_tensor(tf, ea, &fl->exp_avg, w1));
    ZCK_TRY(flat_tensor(tf, eas, &fl->exp_avg_sq, w2));
    fl->has_state = true;
    /* every rank's and group's step: they must agree (identity checks in ds_open.c) */
    const zck_pk *step = zck_pk_dict_get(sd, "step");
    double v = 0;
    bool is_tensor = false;
    if (step && step->kind == ZCK_PK_INT) {
      int64_t iv;
      zck_pk_as_int(step, &iv);
      v = (double)iv;
    } else if (step && step->kind == ZCK_PK_FLOAT) {
      v = step->u.f;
    } else if (step && zck_torch_tensor_of(tf, step)) {
      const zck_torch_tensor *t = zck_torch_tensor_of(tf, step);
      uint8_t raw[16];
      if (zck_torch_tensor_numel(t) != 1 || zck_dtype_size(t->dtype) > sizeof raw ||
          !zck_dtype_convertible(ZCK_F64, t->dtype))
        return zck__fail(ZCK_ERR_FORMAT, "%s: %s['state'][%lld]['step'] is not a scalar", path, what, (long long)k);
      ZCK_TRY(zck_torch_tensor_read(tf, t, raw, 0, 1));
      ZCK_TRY(zck_convert(ZCK_F64, &v, t->dtype, raw, 1));
      is_tensor = true;
    } else if (step) {
      return zck__fail(ZCK_ERR_FORMAT, "%s: %s['state'][%lld]['step'] is neither an int nor a tensor", path, what,
                       (long long)k);
    }
    fl->has_step = step != NULL;
    fl->step = v;
    if (rank0 && k == 0) {
      c->info.step_is_tensor = is_tensor;
      c->info.step = v;
    }
  }
  return ZCK_OK;
}

static zck_status read_slice_mappings(zck__ds_optim_file *of, const zck_pk *osd, const char *path);

static zck_status read_optim(zck_ds_ckpt *c, zck__ds_optim_file *of, const zck_torch_file *tf, bool rank0) {
  const char *path = of->file->path;
  const zck_pk *root = zck_torch_root(tf);
  if (!root || root->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: not an optimizer-states dict", path);
  const zck_pk *osd = zck_pk_dict_get(root, "optimizer_state_dict");
  if (!osd || osd->kind != ZCK_PK_DICT)  /* DS-40 */
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'optimizer_state_dict' missing or not a dict", path);
  const zck_pk *zs = zck_pk_dict_get(osd, "zero_stage");
  if (!zs) {  /* DS-41 */
    /* BF16_Optimizer (runtime/bf16_optimizer.py; bf16 + stage 1 + fp32 gradient
     * accumulation) saves no zero_stage and no loss_scaler, and its fp32 partitions
     * padded: it is read as stage 1 (ds_describe.c, build_train). */
    if (zck_pk_dict_get(osd, "loss_scaler") || !zck_pk_dict_get(osd, "single_partition_of_fp32_groups") ||
        !zck_pk_dict_get(osd, "base_optimizer_state"))
      return zck__fail(ZCK_ERR_FORMAT, "%s: is not a zero checkpoint ('zero_stage' missing)", path);
    of->bf16_optimizer = true;
    of->zero_stage = 1;
  } else {
    of->zero_stage = zck__ds_zero_stage(zs);
  }
  if (of->zero_stage < 1) {  /* DS-42 */
    char sum[128];
    zck_pk_summary(zs, sum, sizeof sum);
    return zck__fail(ZCK_ERR_FORMAT, "%s: zero_stage %s is not 1, 2 or 3", path, sum);
  }
  const zck_pk *pc = zck_pk_dict_get(osd, "partition_count");
  int64_t pcv = 0;
  if (!pc) return zck__fail(ZCK_ERR_FORMAT, "%s: 'partition_count' missing", path);
  if (of->zero_stage == 3) {
    if (pc->kind != ZCK_PK_INT || !zck_pk_as_int(pc, &pcv))  /* DS-63 */
      return zck__fail(ZCK_ERR_FORMAT, "%s: stage-3 partition_count is not an int", path);
  } else if (pc->kind == ZCK_PK_INT) {
    zck_pk_as_int(pc, &pcv);
  } else {
    int64_t *v;
    size_t n;
    ZCK_TRY_CTX(zck__ds_int_list(pc, &v, &n, "partition_count"), "%s", path);
    for (size_t i = 0; i < n; i++) {
      if (i && v[i] != v[0]) of->mixed_counts = true;  /* AutoEP's expert group; ds_autoep.c refuses others */
      if (v[i] > pcv) pcv = v[i];
    }
    of->counts = v;
    of->n_counts = n;
    if (!n) return zck__fail(ZCK_ERR_FORMAT, "%s: 'partition_count' is an empty list", path);
  }
  if (pcv < 1 || pcv > (1 << 20)) return zck__fail(ZCK_ERR_FORMAT, "%s: partition_count %lld is not a world size", path, (long long)pcv);
  of->partition_count = (uint32_t)pcv;

  const char *flat_key = of->zero_stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  const zck_pk *fl = zck_pk_dict_get(osd, flat_key);
  if (!fl || fl->kind != ZCK_PK_LIST) return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' missing or not a list", path, flat_key);
  of->n_flat = fl->u.seq.len;
  of->flat = zck__calloc(of->n_flat ? of->n_flat : 1, sizeof *of->flat);
  if (!of->flat) return ZCK_ERR_NO_MEMORY;
  for (size_t g = 0; g < of->n_flat; g++) {
    char what[96];
    snprintf(what, sizeof what, "%s[%zu]", flat_key, g);
    ZCK_TRY(flat_tensor(tf, fl->u.seq.items[g], &of->flat[g].fp32, what));
  }
  if (of->zero_stage <= 2) {
    size_t n;
    ZCK_TRY_CTX(zck__ds_int_list(zck_pk_dict_get(osd, "group_paddings"), &of->group_paddings, &n, "group_paddings"),
                "%s", path);
    if (n != of->n_flat)  /* DS-50 */
      return zck__fail(ZCK_ERR_MISMATCH, "%s: group_paddings has %zu entries but there are %zu flat groups", path, n,
                       of->n_flat);
    const zck_pk *pp = zck_pk_dict_get(osd, "param_alignment_paddings");
    if (pp && pp->kind != ZCK_PK_NONE) {
      if (pp->kind != ZCK_PK_LIST || pp->u.seq.len != of->n_flat)
        return zck__fail(ZCK_ERR_FORMAT, "%s: param_alignment_paddings is not a list of %zu lists", path, of->n_flat);
      of->has_param_paddings = true;
      of->param_paddings = zck__calloc(of->n_flat ? of->n_flat : 1, sizeof *of->param_paddings);
      of->n_param_paddings = zck__calloc(of->n_flat ? of->n_flat : 1, sizeof *of->n_param_paddings);
      if (!of->param_paddings || !of->n_param_paddings) return ZCK_ERR_NO_MEMORY;
      for (size_t g = 0; g < of->n_flat; g++) {
        char what[64];
        snprintf(what, sizeof what, "param_alignment_paddings[%zu]", g);
        ZCK_TRY_CTX(zck__ds_int_list(pp->u.seq.items[g], &of->param_paddings[g], &of->n_param_paddings[g], what), "%s",
                    path);
      }
    }
    ZCK_TRY(read_slice_mappings(of, osd, path));
    const zck_pk *ver = zck_pk_dict_get(osd, "ds_version");
    if (ver && zck_pk_as_str(ver) && !(of->ds_version = zck__strdup(zck_pk_as_str(ver)))) return ZCK_ERR_NO_MEMORY;
    ZCK_TRY(read_state(c, of, tf, zck_pk_dict_get(osd, "base_optimizer_state"), "base_optimizer_state", rank0));
    if (rank0) {
      double cg;
      if (zck_pk_as_double(zck_pk_dict_get(osd, "clip_grad"), &cg)) c->info.clip_grad = cg;
    }
  } else {
    const zck_pk *ver = zck_pk_dict_get(root, "ds_version");
    if (ver && zck_pk_as_str(ver) && !(of->ds_version = zck__strdup(zck_pk_as_str(ver)))) return ZCK_ERR_NO_MEMORY;
    ZCK_TRY(read_state(c, of, tf, zck_pk_dict_get(osd, "optimizer_state_dict"), "optimizer_state_dict", rank0));
  }
  if (rank0) c->loss_scaler = zck_pk_dict_get(osd, "loss_scaler");
  return ZCK_OK;
}

/* param_slice_mappings (stage 1/2): per flat group, name -> fragment_address(numel, start)
 * of this rank's partition. zckpt does not need them (param_shapes is authoritative, as
 * for zero_to_fp32) but DeepSpeed's universal tools do: damaged ones are refused (DS-55)
 * here (fragments inside the partition, not overlapping) and in describe (names and
 * per-param sums over ranks). Absent: fine (old files). */
static int zck__psm_cmp_start(const void *a, const void *b, void *ctx) {
  const int64_t *start = ctx;
  int64_t x = start[*(const size_t *)a], y = start[*(const size_t *)b];
  return x < y ? -1 : x > y;
}

static zck_status read_slice_mappings(zck__ds_optim_file *of, const zck_pk *osd, const char *path) {
  const zck_pk *l = zck_pk_dict_get(osd, "param_slice_mappings");
  if (!l || l->kind == ZCK_PK_NONE) return ZCK_OK;
  if (l->kind != ZCK_PK_LIST || l->u.seq.len != of->n_flat)
    return zck__fail(ZCK_ERR_FORMAT, "%s: param_slice_mappings is not a list of %zu dicts", path, of->n_flat);
  size_t n = of->n_flat ? of->n_flat : 1;
  of->psm_names = zck__calloc(n, sizeof *of->psm_names);
  of->psm_start = zck__calloc(n, sizeof *of->psm_start);
  of->psm_numel = zck__calloc(n, sizeof *of->psm_numel);
  of->n_psm = zck__calloc(n, sizeof *of->n_psm);
  if (!of->psm_names || !of->psm_start || !of->psm_numel || !of->n_psm) return ZCK_ERR_NO_MEMORY;
  for (size_t g = 0; g < of->n_flat; g++) {
    const zck_pk *d = l->u.seq.items[g];
    if (!d || d->kind != ZCK_PK_DICT)
      return zck__fail(ZCK_ERR_FORMAT, "%s: param_slice_mappings[%zu] is not a dict", path, g);
    size_t k = d->u.dict.len;
    of->psm_names[g] = zck__calloc(k + 1, sizeof(char *));
    of->psm_start[g] = zck__calloc(k + 1, sizeof(int64_t));
    of->psm_numel[g] = zck__calloc(k + 1, sizeof(int64_t));
    size_t *order = zck__calloc(k + 1, sizeof *order);
    if (!of->psm_names[g] || !of->psm_start[g] || !of->psm_numel[g] || !order) { free(order); return ZCK_ERR_NO_MEMORY; }
    uint64_t partition = of->flat[g].fp32.numel + (uint64_t)(of->group_paddings ? of->group_paddings[g] : 0);
    zck_status st = ZCK_OK;
    for (size_t i = 0; i < k && st == ZCK_OK; i++) {
      const char *name = zck_pk_as_str(d->u.dict.keys[i]);
      const zck_pk *fa = d->u.dict.values[i];
      const zck_pk *state = fa && fa->kind == ZCK_PK_OBJECT ? fa->u.obj.state : NULL;
      int64_t start = -1, numel = -1;
      if (!name || !state || !zck_pk_as_int(zck_pk_dict_get(state, "start"), &start) ||
          !zck_pk_as_int(zck_pk_dict_get(state, "numel"), &numel)) {
        st = zck__fail(ZCK_ERR_FORMAT, "%s: param_slice_mappings[%zu] entry %zu is not name -> fragment_address(numel, start)",
                       path, g, i);
        break;
      }
      if (start < 0 || numel < 0 || (uint64_t)start + (uint64_t)numel > partition)
        st = zck__fail(ZCK_ERR_FORMAT, "%s: param_slice_mappings[%zu]['%s'] = [%lld, %lld) outside the rank's partition of %llu",
                       path, g, name, (long long)start, (long long)(start + numel), (unsigned long long)partition);
      of->psm_names[g][i] = zck__strdup(name);
      if (!of->psm_names[g][i]) st = ZCK_ERR_NO_MEMORY;
      of->psm_start[g][i] = start;
      of->psm_numel[g][i] = numel;
      order[i] = i;
      of->n_psm[g] = i + 1;
    }
    if (st == ZCK_OK) {
      qsort_r(order, k, sizeof *order, zck__psm_cmp_start, of->psm_start[g]);
      for (size_t i = 1; i < k && st == ZCK_OK; i++) {
        size_t a = order[i - 1], b = order[i];
        if (of->psm_numel[g][a] && of->psm_numel[g][b] && of->psm_start[g][a] + of->psm_numel[g][a] > of->psm_start[g][b])
          st = zck__fail(ZCK_ERR_FORMAT, "%s: param_slice_mappings[%zu]: fragments of '%s' and '%s' overlap", path, g,
                         of->psm_names[g][a], of->psm_names[g][b]);
      }
    }
    free(order);
    ZCK_TRY(st);
  }
  return ZCK_OK;
}

/* The fingerprint of a rank file's bytes, from its zip directory alone: no data is read. */
static void fingerprint_records(zck__ds_optim_file *of, const zck_torch_file *tf) {
  const zck_zip *z = zck_torch_zip(tf);
  uint64_t print = 0;
  of->n_records = zck_zip_count(z);
  for (size_t i = 0; i < of->n_records; i++) {  /* chained: each pair seeded by the print so far */
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    uint64_t pair[2] = {e->crc32, e->size};
    print = XXH3_64bits_withSeed(pair, sizeof pair, print);
  }
  of->records_print = print;
  const char *arch = zck_torch_prefix(tf);
  of->archive_ranked = arch && zck_ds_name_rank(arch, strlen(arch)) >= 0;
}

zck_status zck__ds_read_optim_file(zck_ds_ckpt *c, zck__ds_optim_file *of, bool keep_torch) {
  const char *path = of->file->path;
  ZCK_TRY(zck__source_open(&of->src, path));
  of->src_open = true;
  zck_torch_file *tf = NULL;
  ZCK_TRY(zck_torch_open_source(&of->src, &c->topts, &tf));
  fingerprint_records(of, tf);
  zck_status s = check_archive_rank(tf, of->file, "optimizer state");
  if (s == ZCK_OK) s = read_optim(c, of, tf, keep_torch);
  if (s == ZCK_OK && keep_torch) c->optim0 = tf;
  else zck_torch_close(tf);
  return s;
}
