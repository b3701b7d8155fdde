/* ds_zero0_fused.c: ZeRO-0 under FP16_Optimizer, its flat fp32 groups cut back into params.
 *
 * With DeepSpeed's FusedAdam (ds-config Adam/AdamW without torch_adam, the default on a GPU)
 * a ZeRO-0 fp16 or bf16 engine wraps the optimizer in FP16_Optimizer (DeepSpeed 0.19.8
 * runtime/fp16/fused_optimizer.py). Its state_dict, saved as the model file's `optimizer`:
 *   dynamic_loss_scale, cur_scale, ... (the scaler, as FP16_UnfusedOptimizer saves it),
 *   optimizer_state_dict: FusedAdam's, one param per group (the group's flat fp32 master),
 *     state[g] = {step (int), exp_avg, exp_avg_sq} over that flat tensor,
 *   fp32_groups_flat[g]: the flat master, the group's trainable params back to back with no
 *     padding (torch._utils._flatten_dense_tensors), in the group's order,
 *   clip_grad.
 * Nothing names the params or gives their shapes. What does decide is the values: after
 * every step the engine copies each master into its 16-bit param (copy_, round to nearest
 * even, which zck_convert reproduces), and `module` holds those 16-bit params. So a group's
 * next param is the module entry whose values are the master's next values, cast.
 * Module entries are tried in module order, as the shape matcher of ds_zero0.c does, and
 * forward and backward passes must agree: two entries that fit the same place (equal values
 * where sampled) are refused by name rather than guessed. Only a sample of each entry is
 * compared (its first and last values): the entry that really sits there always matches, so
 * a unique match is the answer; the bytes themselves are CRC-checked when they are copied. */
#include "ds_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "io.h"

/* Values compared at each end of an entry. */
#define ZCK__Z0F_SAMPLE 64

typedef struct zck__z0f {
  const zck__ds_model_file *mf;
  const zck__ds_tref *flat;        /* [n_groups] fp32_groups_flat */
  uint8_t *a, *b, *m;              /* sample buffers: module bytes, cast master, raw master */
} zck__z0f;

/* Reads n elements of t starting at element `at` into dst. */
static zck_status read_elems(const zck__z0f *f, const zck__ds_tref *t, uint64_t at, uint64_t n, void *dst) {
  size_t es = zck_dtype_size(t->dtype);
  return zck__source_read(&f->mf->src, dst, (size_t)(n * es), t->offset + at * es);
}

/* 1 if module entry i's sampled values are group g's master values at element `off`, cast
 * to the entry's dtype; 0 if not (or it does not fit in what is left); -1 on a read error. */
static int fits(const zck__z0f *f, size_t i, size_t g, uint64_t off) {
  const zck__ds_tref *t = &f->mf->module_t[i], *fl = &f->flat[g];
  if (t->numel > fl->numel - off) return 0;
  size_t es = zck_dtype_size(t->dtype);
  uint64_t head = t->numel < ZCK__Z0F_SAMPLE ? t->numel : ZCK__Z0F_SAMPLE;
  uint64_t tail = t->numel - head < ZCK__Z0F_SAMPLE ? t->numel - head : ZCK__Z0F_SAMPLE;
  for (int part = 0; part < 2; part++) {
    uint64_t n = part ? tail : head, at = part ? t->numel - tail : 0;
    if (!n) continue;
    if (read_elems(f, t, at, n, f->a) != ZCK_OK || read_elems(f, fl, off + at, n, f->m) != ZCK_OK ||
        zck_convert(t->dtype, f->b, fl->dtype, f->m, (size_t)n) != ZCK_OK)
      return -1;
    if (memcmp(f->a, f->b, (size_t)(n * es))) return 0;
  }
  return 1;
}

/* One pass over the module entries, forward (each group fills from its start) or backward
 * (from its end): out[i] = the group entry i sits in, or -1; at[i] its element offset. */
static zck_status pass(zck_ds_ckpt *c, const zck__z0f *f, const bool *cand, bool backward, int64_t *grp, uint64_t *at) {
  const zck__ds_zero0 *z = &c->z0;
  const zck__ds_model_file *mf = f->mf;
  const char *path = mf->file->path;
  size_t ng = z->n_groups;
  uint64_t *cur = zck__calloc(ng + 1, sizeof *cur);   /* elements of each group taken so far */
  if (!cur) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  for (size_t step = 0; s == ZCK_OK && step < mf->n_module; step++) {
    size_t i = backward ? mf->n_module - 1 - step : step;
    grp[i] = -1;
    if (!cand[i] || !mf->module_t[i].numel) continue;
    const zck__ds_tref *t = &mf->module_t[i];
    int64_t want = -1;
    for (size_t g = 0; g < ng; g++) {
      if (cur[g] + t->numel > f->flat[g].numel) continue;
      uint64_t off = backward ? f->flat[g].numel - cur[g] - t->numel : cur[g];
      int r = fits(f, i, g, off);
      if (r < 0) {
        s = zck__fail(ZCK_ERR_IO, "%s: reading module['%s'] or optimizer['fp32_groups_flat'][%zu] failed", path,
                      mf->module_names[i], g);
        break;
      }
      if (!r) continue;
      if (want >= 0) {
        s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: FP16_Optimizer's flat groups name no params, and module['%s'] has the "
                      "values of both group %lld and %zu at their next place: cannot tell which group trains it", path,
                      mf->module_names[i], (long long)want, g);
        break;
      }
      want = (int64_t)g;
    }
    if (s != ZCK_OK || want < 0) continue;
    grp[i] = want;
    at[i] = backward ? f->flat[want].numel - cur[want] - t->numel : cur[want];
    cur[want] += t->numel;
  }
  for (size_t g = 0; s == ZCK_OK && g < ng; g++)
    if (cur[g] != f->flat[g].numel)
      s = zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer['fp32_groups_flat'][%zu] (%llu values): the module's params match "
                    "only %llu of them (%s); the flat master and the 16-bit module disagree", path, g,
                    (unsigned long long)f->flat[g].numel, (unsigned long long)cur[g],
                    backward ? "from its end" : "from its start");
  free(cur);
  return s;
}

/* t cut to `numel` elements from element `at`, shaped like `like`. */
static zck__ds_tref slice(const zck__ds_tref *t, uint64_t at, const zck__ds_tref *like) {
  zck__ds_tref s = *t;
  s.offset += at * zck_dtype_size(t->dtype);
  s.ndim = like->ndim;
  memcpy(s.shape, like->shape, sizeof s.shape);
  s.numel = like->numel;
  return s;
}

/* Rebuilds the per-param arrays of c->z0 (which read_torch_state filled with one flat param
 * per group) from the matched entries, group by group in flat order. */
static zck_status expand(zck_ds_ckpt *c, const zck__z0f *f, const int64_t *grp, const uint64_t *at, int64_t *opt_of) {
  zck__ds_zero0 *z = &c->z0;
  const zck__ds_model_file *mf = f->mf;
  size_t ng = z->n_groups, n = 0;
  for (size_t i = 0; i < mf->n_module; i++) n += grp[i] >= 0;
  zck__ds_tref *master = zck__calloc(n + 1, sizeof *master), *ea = zck__calloc(n + 1, sizeof *ea),
               *eas = zck__calloc(n + 1, sizeof *eas);
  int64_t *module_of = zck__calloc(n + 1, sizeof *module_of);
  size_t *first = zck__calloc(ng + 1, sizeof *first);
  if (!master || !ea || !eas || !module_of || !first) {
    free(master), free(ea), free(eas), free(module_of), free(first);
    return ZCK_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < mf->n_module; i++) opt_of[i] = -1;
  size_t k = 0;
  for (size_t g = 0; g < ng; g++) {
    first[g] = k;
    /* the group's entries by offset: module order within a group is flat order (the forward
     * pass fills each group in module order) */
    for (size_t i = 0; i < mf->n_module; i++) {
      if (grp[i] != (int64_t)g) continue;
      const zck__ds_tref *t = &mf->module_t[i];
      master[k] = slice(&f->flat[g], at[i], t);
      if (z->has_state) {
        ea[k] = slice(&z->exp_avg[g], at[i], t);
        eas[k] = slice(&z->exp_avg_sq[g], at[i], t);
      }
      opt_of[i] = (int64_t)k;
      module_of[k++] = (int64_t)i;
    }
  }
  first[ng] = k;
  free(z->master), free(z->exp_avg), free(z->exp_avg_sq), free(z->module_of), free(z->group_first);
  z->master = master, z->exp_avg = ea, z->exp_avg_sq = eas, z->module_of = module_of, z->group_first = first;
  z->n = n;
  z->has_masters = true;
  return ZCK_OK;
}

zck_status zck__ds_zero0_fused(zck_ds_ckpt *c, const zck_torch_file *tf, const zck_pk *flat_list, const bool *cand,
                               int64_t *opt_of) {
  zck__ds_zero0 *z = &c->z0;
  const zck__ds_model_file *mf = &c->models[0];
  const char *path = mf->file->path;
  size_t ng = z->n_groups;
  for (size_t g = 0; g < ng; g++)
    if (z->group_first[g + 1] - z->group_first[g] != 1)
      return zck__fail(ZCK_ERR_FORMAT, "%s: FP16_Optimizer's param group %zu holds %zu params, not its one flat master",
                       path, g, z->group_first[g + 1] - z->group_first[g]);
  if (!flat_list || flat_list->kind != ZCK_PK_LIST || flat_list->u.seq.len != ng)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer['fp32_groups_flat'] is not a list of %zu tensors (one per param "
                     "group)", path, ng);
  zck__ds_tref *flat = zck__calloc(ng + 1, sizeof *flat);
  if (!flat) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  for (size_t g = 0; s == ZCK_OK && g < ng; g++) {
    char w[64];
    snprintf(w, sizeof w, "optimizer['fp32_groups_flat'][%zu]", g);
    if ((s = zck__ds_tensor(tf, flat_list->u.seq.items[g], &flat[g], w)) != ZCK_OK) break;
    if (!flat[g].contiguous || flat[g].ndim != 1)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a flat contiguous tensor", path, w);
    else if (flat[g].dtype != ZCK_F32)
      s = zck__fail(ZCK_ERR_MISMATCH, "%s: %s is %s (FP16_Optimizer's masters are float32)", path, w,
                    zck_dtype_name(flat[g].dtype));
    else if (z->has_state && (z->exp_avg[g].numel != flat[g].numel || z->exp_avg[g].ndim != 1))
      s = zck__fail(ZCK_ERR_MISMATCH, "%s: %s has %llu values but its exp_avg %llu", path, w,
                    (unsigned long long)flat[g].numel, (unsigned long long)z->exp_avg[g].numel);
  }
  size_t nm = mf->n_module;
  zck__z0f f = {.mf = mf, .flat = flat};
  size_t bytes = ZCK__Z0F_SAMPLE * 8;
  int64_t *fg = zck__calloc(nm + 1, sizeof *fg), *bg = zck__calloc(nm + 1, sizeof *bg);
  uint64_t *fa = zck__calloc(nm + 1, sizeof *fa), *ba = zck__calloc(nm + 1, sizeof *ba);
  f.a = malloc(bytes), f.b = malloc(bytes), f.m = malloc(bytes);
  if (s == ZCK_OK && (!fg || !bg || !fa || !ba || !f.a || !f.b || !f.m)) s = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < nm; i++)
    if (cand[i] && !zck_dtype_convertible(mf->module_t[i].dtype, flat[0].dtype))
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: module['%s'] is %s, not a float the masters cast to", path,
                    mf->module_names[i], zck_dtype_name(mf->module_t[i].dtype));
  if (s == ZCK_OK) s = pass(c, &f, cand, false, fg, fa);
  if (s == ZCK_OK) s = pass(c, &f, cand, true, bg, ba);
  for (size_t i = 0; s == ZCK_OK && i < nm; i++)
    if (fg[i] != bg[i] || (fg[i] >= 0 && fa[i] != ba[i]))
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: FP16_Optimizer's flat groups name no params, and module['%s'] fits two "
                    "places of them (equal values elsewhere): cannot tell which param is trained where", path,
                    mf->module_names[i]);
  if (s == ZCK_OK) s = expand(c, &f, fg, fa, opt_of);
  free(fg), free(bg), free(fa), free(ba), free(f.a), free(f.b), free(f.m), free(flat);
  return s;
}
