/* ds_describe.c: from the parsed files to layouts, in-place stores and the zero_to_fp32
 * recipe, checking that the shapes add up to the partitions, with errors that name the
 * file, the group, the rank and the numbers. */
#include "ds_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *zck__ds_store_name(zck_ds_ckpt *c, const char *fmt, ...) {
  if (c->n_store_names == c->cap_store_names) {
    size_t nc = c->cap_store_names ? 2 * c->cap_store_names : 64;
    char **nv = zck__realloc(c->store_names, nc * sizeof *nv);
    if (!nv) return NULL;
    c->store_names = nv;
    c->cap_store_names = nc;
  }
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  char *s = zck__strdup(buf);
  if (s) c->store_names[c->n_store_names++] = s;
  return s;
}

/* The record check of a tensor's storage: its zip CRC, verified as the executor reads it. */
static const zck_record_check *record_check(zck_ds_ckpt *c, const zck__ds_tref *t, const char *what) {
  if (!t->has_record) return NULL;
  if (c->n_records == c->cap_records) {
    size_t nc = c->cap_records ? 2 * c->cap_records : 64;
    zck_record_check **nv = zck__realloc(c->records, nc * sizeof *nv);
    if (!nv) return NULL;
    c->records = nv;
    c->cap_records = nc;
  }
  zck_record_check *r = zck__calloc(1, sizeof *r);
  char *w = zck__sprintf("record data/%s (%s)", t->rec_key, what);
  if (!r || !w) {
    free(r);
    free(w);
    return NULL;
  }
  *r = (zck_record_check){t->rec_off, t->rec_size, t->rec_crc, w};
  c->records[c->n_records++] = r;
  return r;
}

zck_store zck__ds_source_store(zck_ds_ckpt *c, const zck__source *src, const zck__ds_tref *t, const char *path,
                              const char *what) {
  const char *name = zck__ds_store_name(c, "%s: %s", path, what);
  zck_store s = zck_store_source(src, t->offset, t->dtype, t->numel, name);
  s.record = record_check(c, t, what);
  if (t->has_record && !s.record) c->records_oom = true;
  return s;
}

/* ---- ds_config */

static zck_status read_config(zck_ds_ckpt *c) {
  c->info.sub_group_size = ZCK__DS_DEFAULT_SUB_GROUP_SIZE;
  c->info.param_align = 1;
  const zck_pk *cfg = c->ds_config;
  if (!cfg || cfg->kind != ZCK_PK_DICT) return ZCK_OK;
  const zck_pk *zo = zck_pk_dict_get(cfg, "zero_optimization");
  double d;
  /* stage 1/2 files carry clip_grad; stage 3 and ZeRO-0 only the config */
  if ((c->info.stage == 3 || c->zero0) && zck_pk_as_double(zck_pk_dict_get(cfg, "gradient_clipping"), &d))
    c->info.clip_grad = d;
  if (!zo || zo->kind != ZCK_PK_DICT) return ZCK_OK;
  if (zck_pk_as_double(zck_pk_dict_get(zo, "sub_group_size"), &d) && d >= 1 && d < 1e18) c->info.sub_group_size = (uint64_t)d;
  const zck_pk *rr = zck_pk_dict_get(zo, "round_robin_gradients");
  if (rr && rr->kind == ZCK_PK_BOOL) c->info.round_robin = rr->u.b;
  return ZCK_OK;
}

/* ---- trainable params: ZeRO layout and the fp32 / exp_avg / exp_avg_sq stores */

static zck_status check_dtypes(zck_ds_ckpt *c) {
  if (c->zero0) return ZCK_OK;   /* ds_zero0.c: per-param tensors */
  const zck__ds_optim_file *o0 = &c->optims[0];
  zck_dtype master = o0->n_flat ? o0->flat[0].fp32.dtype : ZCK_F32, state = ZCK_DTYPE_INVALID;
  bool any_state = false, all_state = true;
  for (uint32_t r = 0; r < c->info.world_size; r++) {
    const zck__ds_optim_file *o = &c->optims[r];
    for (size_t g = 0; g < o->n_flat; g++) {
      const zck__ds_flat *f = &o->flat[g];
      if (f->fp32.dtype != master)  /* DS-46 */
        return zck__fail(ZCK_ERR_MISMATCH, "%s: fp32 partition of group %zu has dtype %s but %s group 0 has %s",
                         o->file->path, g, zck_dtype_name(f->fp32.dtype), o0->file->name, zck_dtype_name(master));
      any_state |= f->has_state;
      all_state &= f->has_state;
      if (f->has_state) {
        if (state == ZCK_DTYPE_INVALID) state = f->exp_avg.dtype;
        if (f->exp_avg.dtype != state || f->exp_avg_sq.dtype != state)
          return zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer state of group %zu has dtype %s/%s, elsewhere %s",
                           o->file->path, g, zck_dtype_name(f->exp_avg.dtype), zck_dtype_name(f->exp_avg_sq.dtype),
                           zck_dtype_name(state));
      }
    }
  }
  if (any_state && !all_state) {
    for (uint32_t r = 0; r < c->info.world_size; r++)
      for (size_t g = 0; g < c->optims[r].n_flat; g++)
        if (!c->optims[r].flat[g].has_state)
          return zck__fail(ZCK_ERR_MISMATCH, "%s: no optimizer state for group %zu while other ranks have it",
                           c->optims[r].file->path, g);
  }
  c->info.master_dtype = master;
  c->info.has_optimizer_state = any_state && c->optims[0].n_flat > 0;
  c->info.state_dtype = c->info.has_optimizer_state ? state : ZCK_DTYPE_INVALID;
  return ZCK_OK;
}

/* parameter_alignment: infer the element multiple from the saved paddings and check them. */
static zck_status check_param_paddings(zck_ds_ckpt *c, const uint64_t *numels) {
  const zck__ds_optim_file *o0 = &c->optims[0];
  const zck__ds_model_file *m0 = &c->models[0];
  if (c->info.stage == 3 || c->zero0) return ZCK_OK;
  const zck_pk *zo = c->ds_config ? zck_pk_dict_get(c->ds_config, "zero_optimization") : NULL;
  const zck_pk *pa = zo ? zck_pk_dict_get(zo, "parameter_alignment") : NULL;
  bool any = pa && pa->kind == ZCK_PK_BOOL && pa->u.b;
  if (o0->has_param_paddings)
    for (size_t g = 0; g < o0->n_flat; g++)
      for (size_t i = 0; i < o0->n_param_paddings[g]; i++) any |= o0->param_paddings[g][i] != 0;
  c->info.param_align = any ? zck__ds_param_align_for(c->info.lp_dtype) : 1;
  if (!o0->has_param_paddings) return ZCK_OK;
  for (size_t g = 0; g < o0->n_flat; g++) {
    size_t a = c->flat_first[g], n = c->flat_first[g + 1] - a;
    if (o0->n_param_paddings[g] != n)
      return zck__fail(ZCK_ERR_MISMATCH, "%s: param_alignment_paddings[%zu] has %zu entries but param_shapes[%zu] has %zu "
                       "params", o0->file->path, g, o0->n_param_paddings[g], g, m0->param_shapes[g].n);
    int64_t *want = zck__calloc(n + 1, sizeof *want);
    uint64_t *nums = zck__calloc(n + 1, sizeof *nums);
    if (!want || !nums) { free(want); free(nums); return ZCK_ERR_NO_MEMORY; }
    for (size_t i = 0; i < n; i++) nums[i] = numels[c->flat_params[a + i]];
    zck__ds_param_paddings(nums, n, c->info.param_align, want);
    for (size_t i = 0; i < n; i++)
      if (want[i] != o0->param_paddings[g][i]) {
        zck_status s = zck__fail(ZCK_ERR_FORMAT, "%s: param_alignment_paddings[%zu][%zu] (after '%s') is %lld; %u-element "
                                 "alignment gives %lld", o0->file->path, g, i, m0->param_shapes[g].v[i].name,
                                 (long long)o0->param_paddings[g][i], c->info.param_align, (long long)want[i]);
        free(want);
        free(nums);
        return s;
      }
    free(want);
    free(nums);
  }
  return ZCK_OK;
}

/* DS-55, across ranks: every name in param_slice_mappings is a trainable param of that
 * flat group, and each param's fragments over all ranks add up to its numel. */
static zck_status check_slice_mappings(zck_ds_ckpt *c) {
  if (c->info.stage == 3 || !c->optims[0].psm_names) return ZCK_OK;
  const zck_model *m = c->model;
  uint64_t *sum = zck__calloc(m->n_params + 1, sizeof *sum);
  int32_t *group_of = zck__calloc(m->n_params + 1, sizeof *group_of);
  if (!sum || !group_of) { free(sum); free(group_of); return ZCK_ERR_NO_MEMORY; }
  for (size_t p = 0; p < m->n_params; p++) group_of[p] = -1;
  for (size_t g = 0; g < c->optims[0].n_flat; g++)
    for (size_t k = c->flat_first[g]; k < c->flat_first[g + 1]; k++) group_of[c->flat_params[k]] = (int32_t)g;
  zck_status st = ZCK_OK;
  for (uint32_t r = 0; r < c->info.world_size && st == ZCK_OK; r++) {
    const zck__ds_optim_file *o = &c->optims[r];
    if (!o->psm_names) {
      st = zck__fail(ZCK_ERR_FORMAT, "%s: no param_slice_mappings while %s has them", o->file->path, c->optims[0].file->path);
      break;
    }
    for (size_t g = 0; g < o->n_flat && st == ZCK_OK; g++)
      for (size_t i = 0; i < o->n_psm[g] && st == ZCK_OK; i++) {
        int64_t p = zck_model_find_param(m, o->psm_names[g][i]);
        if (p < 0 || group_of[p] != (int32_t)g)
          st = zck__fail(ZCK_ERR_FORMAT, "%s: param_slice_mappings[%zu] names '%s', which is not a parameter of that group in "
                         "param_shapes", o->file->path, g, o->psm_names[g][i]);
        else
          sum[p] += (uint64_t)o->psm_numel[g][i];
      }
  }
  for (size_t p = 0; p < m->n_params && st == ZCK_OK; p++)
    if (group_of[p] >= 0 && sum[p] != m->params[p].numel)
      st = zck__fail(ZCK_ERR_FORMAT, "%s: param_slice_mappings of '%s' cover %llu elements over the %u ranks, the param has %llu",
                     c->fs.dir, m->params[p].name, (unsigned long long)sum[p], c->info.world_size,
                     (unsigned long long)m->params[p].numel);
  free(sum);
  free(group_of);
  return st;
}

static zck_status build_train(zck_ds_ckpt *c, const uint64_t *numels) {
  const zck_model *m = c->model;
  uint32_t w = c->info.world_size;
  size_t n_flat = c->optims[0].n_flat;
  zck_group_spec *specs = zck__calloc(n_flat + 1, sizeof *specs);
  if (!specs) return ZCK_ERR_NO_MEMORY;
  for (size_t g = 0; g < n_flat; g++) {
    specs[g].params = c->flat_params + c->flat_first[g];
    specs[g].n_params = c->flat_first[g + 1] - c->flat_first[g];
    specs[g].opt_group = specs[g].n_params ? m->params[specs[g].params[0]].group : -1;
  }
  zck_status s = c->autoep ? zck__ds_autoep_train(c, m->n_params, numels, specs, n_flat, w, c->info.param_align,
                                                  &c->train_layout)
                 : c->moe ? zck__ds_moe_train(c, m->n_params, numels, specs, n_flat, w, c->info.param_align,
                                              &c->train_layout)
                 : zck__ds_pipe_has_replicas(c) ? zck__ds_pipe_train(c, m->n_params, numels, specs, n_flat, w,
                                                                     c->info.param_align, &c->train_layout)
                 : c->info.stage == 3 ? zck_layout_zero3(m->n_params, numels, specs, n_flat, w, &c->train_layout)
                 : zck_layout_zero12(m->n_params, numels, specs, n_flat, w, c->info.param_align, &c->train_layout);
  free(specs);
  ZCK_TRY(s);
  const zck_layout *L = c->train_layout;
  for (int p = ZCK_DS_FP32; p <= ZCK_DS_EXP_AVG_SQ; p++)
    if (!(c->stores[p] = zck__calloc(L->n_stores + 1, sizeof(zck_store)))) return ZCK_ERR_NO_MEMORY;
  const char *fkey = c->info.stage == 3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups";
  const char *skey = c->info.stage == 3 ? "optimizer_state_dict" : "base_optimizer_state";
  for (size_t g = 0; g < n_flat; g++) {
    const zck_layout_group *lg = &L->groups[g];
    for (uint32_t r = 0; r < w; r++) {
      zck__ds_optim_file *o = &c->optims[r];
      const zck__ds_flat *f = &o->flat[g];
      uint32_t id = zck_layout_store_id(L, (uint32_t)g, r);
      const zck_layout_store *st = &L->stores[id];
      const char *path = o->file->path;
      /* BF16_Optimizer saves the whole padded partition; the real elements are its prefix */
      uint64_t saved = c->info.bf16_optimizer ? st->numel : st->lean;
      if (zck__ds_offload_swapped(c, f, saved)) {  /* the sub-group lies in offloaded_tensors/ (ds_offload.c) */
        ZCK_TRY(zck__ds_offload_bind(c, r, g, st, id));
        continue;
      }
      if (f->fp32.numel != saved) {  /* DS-51 / DS-61 */
        if (c->info.stage == 3)
          return zck__fail(ZCK_ERR_MISMATCH,
                           "%s: %s[%zu] has %llu elements but its %zu params need %llu (sum of ceil(n/%u)); "
                           "param_shapes and the partitions do not add up", path, fkey, g,
                           (unsigned long long)f->fp32.numel, lg->n_params, (unsigned long long)st->lean, w);
        return zck__fail(ZCK_ERR_MISMATCH,
                         "%s: %s[%zu] has %llu elements but rank %u of a %u-rank group of %llu elements "
                         "(partition %llu) holds %llu; param_shapes and the partitions do not add up",
                         path, fkey, g, (unsigned long long)f->fp32.numel, r, w, (unsigned long long)lg->numel,
                         (unsigned long long)lg->partition, (unsigned long long)saved);
      }
      if (c->info.bf16_optimizer) {
        /* BF16_Optimizer: the last rank records the group's whole alignment padding, others 0 */
        uint64_t pad = zck_zero12_bf16_padding(lg->numel, w, r);
        if (o->group_paddings[g] != (int64_t)pad)
          return zck__fail(ZCK_ERR_MISMATCH, "%s: group_paddings[%zu] is %lld but BF16_Optimizer's padding of rank %u of a "
                           "%u-rank group of %llu elements is %llu", path, g, (long long)o->group_paddings[g], r, w,
                           (unsigned long long)lg->numel, (unsigned long long)pad);
      } else if (c->info.stage <= 2 && o->group_paddings[g] != (int64_t)(st->numel - st->lean)) {  /* DS-53 */
        return zck__fail(ZCK_ERR_MISMATCH, "%s: group_paddings[%zu] is %lld but partition %llu - saved %llu = %llu", path,
                         g, (long long)o->group_paddings[g], (unsigned long long)st->numel,
                         (unsigned long long)st->lean, (unsigned long long)(st->numel - st->lean));
      }
      char what[128];
      snprintf(what, sizeof what, "%s[%zu]", fkey, g);
      zck__ds_tref real = f->fp32;
      real.numel = st->lean;   /* the store is what the layout reads: padding is not data */
      c->stores[ZCK_DS_FP32][id] = zck__ds_source_store(c, f->src ? f->src : &o->src, &real, f->path ? f->path : path,
                                                        what);
      if (!c->info.has_optimizer_state) continue;
      const zck__ds_tref *ts[2] = {&f->exp_avg, &f->exp_avg_sq};
      const char *tn[2] = {"exp_avg", "exp_avg_sq"};
      for (int k = 0; k < 2; k++) {
        if (ts[k]->numel != st->numel)  /* DS-54 / DS-62 */
          return zck__fail(ZCK_ERR_MISMATCH, "%s: %s['state'][%zu]['%s'] has %llu elements; the %s partition of group "
                           "%zu is %llu", path, skey, g, tn[k], (unsigned long long)ts[k]->numel,
                           c->info.stage == 3 ? "sub-group" : "padded", g, (unsigned long long)st->numel);
        snprintf(what, sizeof what, "%s['state'][%zu]['%s']", skey, g, tn[k]);
        c->stores[ZCK_DS_EXP_AVG + k][id] =
            zck__ds_source_store(c, f->src ? f->src : &o->src, ts[k], f->path ? f->path : path, what);
      }
    }
  }
  for (size_t i = 0; i < L->n_stores; i++)
    if (!c->stores[ZCK_DS_FP32][i].name) return ZCK_ERR_NO_MEMORY;
  return check_slice_mappings(c);
}

/* ---- lp weights, frozen params, buffers */

static zck_status build_lp(zck_ds_ckpt *c, const uint64_t *numels) {
  if (c->info.stage == 3) return ZCK_OK;
  const zck_model *m = c->model;
  const zck__ds_model_file *m0 = &c->models[0];
  uint32_t *owners = zck__calloc(m->n_params + 1, sizeof *owners);
  if (!owners) return ZCK_ERR_NO_MEMORY;
  size_t n = zck_lp_params(m, owners);
  for (size_t i = 0; i < n; i++)
    if (!m0->module_t[c->param_mod[owners[i]]].contiguous) {
      c->lp_missing = zck__sprintf("module['%s'] is a strided view", m->params[owners[i]].name);
      free(owners);
      return c->lp_missing ? ZCK_OK : ZCK_ERR_NO_MEMORY;
    }
  zck_status s = zck_layout_lp(m, numels, owners, n, &c->lp_layout);
  if (s == ZCK_OK && !(c->stores[ZCK_DS_LP] = zck__calloc(n + 1, sizeof(zck_store)))) s = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < n; i++) {
    char what[600];
    snprintf(what, sizeof what, "module['%.500s']", m->params[owners[i]].name);
    size_t k = (size_t)c->param_mod[owners[i]];
    c->stores[ZCK_DS_LP][i] = zck__ds_source_store(c, zck__ds_module_src(m0, k), &m0->module_t[k],
                                                   zck__ds_module_path(m0, k), what);
  }
  free(owners);
  return s;
}

static int64_t find_frag(const zck__ds_model_file *mf, const char *name) {
  size_t i;
  return zck__strmap_get(&mf->frag_map, name, &i) ? (int64_t)i : -1;
}

static zck_status build_frozen(zck_ds_ckpt *c, const uint64_t *numels) {
  const zck_model *m = c->model;
  const zck__ds_model_file *m0 = &c->models[0];
  uint32_t w = c->info.world_size;
  int stage = c->info.stage;
  size_t nf = zck_frozen_params(m, NULL);
  if (m0->has_frozen_frags && m0->n_frags != m0->frozen_shapes.n)  /* DS-26 */
    return zck__fail(ZCK_ERR_MISMATCH, "%s: frozen_param_fragments has %zu entries but frozen_param_shapes has %zu",
                     m0->file->path, m0->n_frags, m0->frozen_shapes.n);
  if (!nf) return ZCK_OK;
  uint32_t *fp = zck__calloc(nf, sizeof *fp);
  if (!fp) return ZCK_ERR_NO_MEMORY;
  zck_frozen_params(m, fp);
  zck_status s = ZCK_OK;
  bool use_frags = stage >= 2 && m0->has_frozen_frags;
  if (stage == 3 && !use_frags) {
    s = zck_frozen_fragments_absent(m0->file->path, m->params[fp[0]].name);
    goto out;
  }
  ZCK_CHECK_GOTO(zck_layout_frozen(m->n_params, numels, fp, nf, stage, w, &c->frozen_layout), s, out);
  if (!(c->stores[ZCK_DS_FROZEN] = zck__calloc(c->frozen_layout->n_stores + 1, sizeof(zck_store)))) {
    s = ZCK_ERR_NO_MEMORY;
    goto out;
  }
  for (size_t i = 0; i < nf; i++) {
    const zck_param *pp = &m->params[fp[i]];
    char what[600];
    if (!use_frags) {  /* stage 1, or a stage-2 file older than v0.9.1: the module tensor */
      const zck__ds_tref *t = &m0->module_t[c->param_mod[fp[i]]];
      if (!t->contiguous) {
        s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: module['%s'] is a strided view", m0->file->path, pp->name);
        goto out;
      }
      snprintf(what, sizeof what, "module['%.500s']", pp->name);
      size_t k = (size_t)c->param_mod[fp[i]];
      c->stores[ZCK_DS_FROZEN][i] = zck__ds_source_store(c, zck__ds_module_src(m0, k), t, zck__ds_module_path(m0, k), what);
      continue;
    }
    snprintf(what, sizeof what, "frozen_param_fragments['%.500s']", pp->name);
    for (uint32_t r = 0; r < (stage == 3 ? w : 1); r++) {
      zck__ds_model_file *mf = &c->models[r];
      int64_t k = find_frag(mf, pp->name);
      if (k < 0) {  /* DS-26 */
        s = zck_frozen_fragment_missing(mf->file->path, pp->name);
        goto out;
      }
      const zck__ds_tref *t = &mf->frag_t[k];
      ZCK_CHECK_GOTO(zck_frozen_fragment_check(mf->file->path, what, t->numel, pp->numel, stage, w), s, out);
      if (!t->contiguous) {
        s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s is a strided view", mf->file->path, what);
        goto out;
      }
      uint32_t id = zck_layout_store_id(c->frozen_layout, (uint32_t)i, r);
      c->stores[ZCK_DS_FROZEN][id] = zck__ds_source_store(c, &mf->src, t, mf->file->path, what);
    }
  }
out:
  free(fp);
  return s;
}

static zck_status build_buffers(zck_ds_ckpt *c) {
  const zck_model *m = c->model;
  const zck__ds_model_file *m0 = &c->models[0];
  if (!m->n_buffers) return ZCK_OK;
  uint64_t *numels = zck__calloc(m->n_buffers, sizeof *numels);
  if (!numels) return ZCK_ERR_NO_MEMORY;
  for (size_t b = 0; b < m->n_buffers; b++) numels[b] = m->buffers[b].numel;
  zck_status s = zck_layout_whole(m->n_buffers, numels, NULL, m->n_buffers, &c->buffer_layout);
  free(numels);
  ZCK_TRY(s);
  if (!(c->buffer_stores = zck__calloc(m->n_buffers, sizeof(zck_store)))) return ZCK_ERR_NO_MEMORY;
  for (size_t b = 0; b < m->n_buffers; b++) {
    const zck__ds_tref *t = &m0->module_t[c->buffer_mod[b]];
    if (!t->contiguous)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: buffer module['%s'] is a strided view", m0->file->path,
                       m->buffers[b].name);
    char what[600];
    snprintf(what, sizeof what, "module['%.500s']", m->buffers[b].name);
    size_t k = (size_t)c->buffer_mod[b];
    c->buffer_stores[b] = zck__ds_source_store(c, zck__ds_module_src(m0, k), t, zck__ds_module_path(m0, k), what);
  }
  return ZCK_OK;
}

/* ---- the zero_to_fp32 recipe (see deepspeed.h for each rule) */

static zck_status build_outputs(zck_ds_ckpt *c) {
  const zck_model *m = c->model;
  const zck__ds_model_file *m0 = &c->models[0];
  size_t cap = m->n_buffers + m->n_params + m0->n_shared + 1;
  if (!(c->outputs = zck__calloc(cap, sizeof *c->outputs))) return ZCK_ERR_NO_MEMORY;
  size_t n = 0;
  /* 1. buffers, module order (= manifest buffer order); floating ones as float32 */
  for (size_t b = 0; b < m->n_buffers; b++) {
    const zck_buffer *bf = &m->buffers[b];
    bool fl = bf->dtype == ZCK_F32 || bf->dtype == ZCK_F64 || bf->dtype == ZCK_F16 || bf->dtype == ZCK_BF16 ||
              bf->dtype == ZCK_F8_E4M3 || bf->dtype == ZCK_F8_E5M2;
    c->outputs[n++] = (zck_ds_output){bf->name, ZCK_DS_OUT_BUFFER, (uint32_t)b, -1, fl ? ZCK_F32 : bf->dtype, bf->dtype,
                                      bf->ndim, bf->shape, bf->numel};
  }
  /* 2. frozen params in frozen_param_shapes order, lp dtype; none for stage 1. ZeRO-0,
   * which zero_to_fp32 cannot read: module order, so the output is the whole model */
  if (c->zero0)
    for (size_t p = 0; p < m->n_params; p++) {
      const zck_param *pp = &m->params[p];
      if (!pp->frozen || pp->tied_to >= 0) continue;
      c->outputs[n++] = (zck_ds_output){pp->name, ZCK_DS_OUT_FROZEN, (uint32_t)p, -1, pp->dtype, pp->dtype, pp->ndim,
                                        pp->shape, pp->numel};
    }
  if (c->info.stage >= 2 && m0->has_frozen_shapes)
    for (size_t i = 0; i < m0->frozen_shapes.n; i++) {
      int64_t p = zck_model_find_param(m, m0->frozen_shapes.v[i].name);
      const zck_param *pp = &m->params[p];
      zck_dtype dt = pp->dtype;
      if (m0->has_frozen_frags) {
        int64_t k = find_frag(m0, pp->name);
        if (k >= 0) dt = m0->frag_t[k].dtype;
      }
      c->outputs[n++] = (zck_ds_output){pp->name, ZCK_DS_OUT_FROZEN, (uint32_t)p, -1, dt, dt, pp->ndim, pp->shape,
                                        pp->numel};
    }
  /* 3. trainable params, param_shapes order, master dtype */
  size_t nt = c->flat_first[c->optims[0].n_flat];
  for (size_t k = 0; k < nt; k++) {
    const zck_param *pp = &m->params[c->flat_params[k]];
    c->outputs[n++] = (zck_ds_output){pp->name, ZCK_DS_OUT_TRAINABLE, c->flat_params[k], -1, c->info.master_dtype,
                                      c->info.master_dtype, pp->ndim, pp->shape, pp->numel};
  }
  /* 4. aliases whose source is in the output: the same tensor */
  ZCK_TRY(zck_ds_outputs_add_aliases(c->outputs, &n, (const char *const *)m0->shared_alias,
                                     (const char *const *)m0->shared_src, m0->n_shared, m));
  c->n_outputs = n;
  return ZCK_OK;
}

/* ---- info */

static zck_status fill_info(zck_ds_ckpt *c) {
  const zck__ds_model_file *m0 = &c->models[0];
  const zck_model *m = c->model;
  zck_ds_info *in = &c->info;
  in->root = c->fs.root;
  in->tag = c->fs.tag;
  in->dir = c->fs.dir;
  in->bf16_prefix = c->fs.prefix == ZCK__DS_PREFIX_BF16;
  in->ds_version = m0->ds_version ? m0->ds_version : c->optims[0].ds_version;
  if (!in->ds_version) ZCK_TRY(zck__ds_warn(c, "%s: no ds_version", m0->file->path));  /* DS-28 */
  in->global_steps = m0->global_steps;
  if (!c->zero0) in->step_ahead = m0->step_ahead;   /* ZeRO-0: ds_zero0.c knows its optimizer */
  in->skipped_steps = m0->skipped_steps;
  in->global_samples = m0->global_samples;
  in->dp_world_size = m0->dp_world_size;
  in->n_flat_groups = c->optims[0].n_flat;
  in->has_frozen_shapes = m0->has_frozen_shapes;
  in->has_shared_params = m0->has_shared;
  if (!m0->has_shared)  /* DS-24 */
    ZCK_TRY(zck__ds_warn(c, "%s: no shared_params (file older than DeepSpeed 0.9.0): tied weights unknown", m0->file->path));
  /* lp dtype: the module's trainable params (stage-3 placeholders keep the dtype) */
  in->lp_dtype = ZCK_DTYPE_INVALID;
  for (size_t p = 0; p < m->n_params && in->lp_dtype == ZCK_DTYPE_INVALID; p++)
    if (!m->params[p].frozen && m->params[p].tied_to < 0) in->lp_dtype = m->params[p].dtype;
  if (in->lp_dtype == ZCK_DTYPE_INVALID) in->lp_dtype = in->bf16_prefix ? ZCK_BF16 : in->master_dtype;
  in->n_warnings = c->n_warnings;
  in->warnings = (const char *const *)c->warnings;
  return ZCK_OK;
}

zck_status zck__ds_describe(zck_ds_ckpt *c) {
  ZCK_TRY(read_config(c));
  ZCK_TRY(zck__ds_build_manifest(c));
  ZCK_TRY(check_dtypes(c));
  ZCK_TRY(fill_info(c));
  const zck_model *m = c->model;
  uint64_t *numels = zck__calloc(m->n_params + 1, sizeof *numels);
  if (!numels) return ZCK_ERR_NO_MEMORY;
  zck_model_numels(m, numels);
  zck_status s = check_param_paddings(c, numels);
  if (s == ZCK_OK) s = c->zero0 ? zck__ds_zero0_build_train(c, numels) : build_train(c, numels);
  if (s == ZCK_OK) s = build_lp(c, numels);
  if (s == ZCK_OK) s = build_frozen(c, numels);
  free(numels);
  if (s == ZCK_OK) s = build_buffers(c);
  if (s == ZCK_OK) s = build_outputs(c);
  if (s == ZCK_OK && c->records_oom) s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) s = zck__ds_expect_manifest(c);
  if (s == ZCK_OK) {  /* warnings may have been added since fill_info */
    c->info.n_warnings = c->n_warnings;
    c->info.warnings = (const char *const *)c->warnings;
  }
  return s;
}
