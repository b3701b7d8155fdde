/* uv_moe.c: a universal folder made from a legacy DeepSpeed-MoE checkpoint (deepspeed.moe.layer.MoE, ep_size 1),
 * by ds_to_universal.py 0.19.8 or `zckpt to-universal` (the same files).
 *
 * The model file is the source's, copied: its `module` lacks the experts (_get_non_moe_state_dict), its
 * param_shapes name them (<m>.deepspeed_moe.experts.deepspeed_experts.<E>.<w>). The expert files are not copied:
 * DeepSpeed's universal load skips them (engine.py loads them only when not load_universal) and takes the expert
 * weights from zero/<name>/fp32.pt, as every other trainable param's. So each expert param is read as the DeepSpeed
 * reader reads the checkpoint itself (ds_moe.c): inserted into `module` after the last entry of its MoE layer (its
 * gate), at its param_shapes shape and the module's dtype, no bytes bound. */
#include "uv_internal.h"

#include <stdlib.h>
#include <string.h>

#define ZCK__UV_MOE_EXPERTS ".deepspeed_experts."

static bool is_expert(const char *name) {
  const char *p = strstr(name, ZCK__UV_MOE_EXPERTS);
  if (!p) return false;
  char *end;
  const char *num = p + sizeof ZCK__UV_MOE_EXPERTS - 1;
  (void)strtol(num, &end, 10);
  return end != num && *end == '.';
}

/* The length of an expert's MoE-layer prefix: "<m>.deepspeed_moe." of "<m>.deepspeed_moe.experts.deepspeed_experts.<E>.." */
static size_t layer_prefix(const char *name) {
  const char *cut = strstr(name, ".experts" ZCK__UV_MOE_EXPERTS);
  return (size_t)((cut ? cut : strstr(name, ZCK__UV_MOE_EXPERTS)) - name) + 1;
}

static bool in_module(const zck_uv_ckpt *c, const char *name) {
  for (size_t i = 0; i < c->n_module; i++)
    if (!strcmp(c->module[i].name, name)) return true;
  return false;
}

/* The expert params: name and shape from param_shapes, and the module entry they follow (after the last entry
 * under their layer prefix; n_module: at the end). */
typedef struct expert {
  zck__uv_tref t;
  size_t after;
} expert;

static zck_status expert_of(const zck_uv_ckpt *c, const char *name, const zck_pk *s, expert *x, const expert *prev) {
  memset(x, 0, sizeof *x);
  x->t.name = name;   /* no bytes: the expert's weight is only in zero/ */
  x->t.dtype = c->n_module ? c->module[0].dtype : ZCK_F32;
  if (!s || (s->kind != ZCK_PK_TUPLE && s->kind != ZCK_PK_LIST) || s->u.seq.len > ZCK_MAX_DIMS)
    return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes['%s']: shape is not a torch.Size, tuple or list",
                     zck_torch_name(c->model0), name);
  x->t.ndim = (int)s->u.seq.len;
  x->t.numel = 1;
  for (int q = 0; q < x->t.ndim; q++) {
    if (!zck_pk_as_int(s->u.seq.items[q], &x->t.shape[q]) || x->t.shape[q] < 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes['%s']: shape dimension %d is not a non-negative int",
                       zck_torch_name(c->model0), name, q);
    x->t.numel *= (uint64_t)x->t.shape[q];
  }
  size_t pl = layer_prefix(name);
  if (prev && !strncmp(prev->t.name, name, pl) && layer_prefix(prev->t.name) == pl) {   /* same layer as before */
    x->after = prev->after;
    return ZCK_OK;
  }
  x->after = c->n_module;
  for (size_t i = c->n_module; i-- > 0;)
    if (!strncmp(c->module[i].name, name, pl)) {
      x->after = i;
      break;
    }
  return ZCK_OK;
}

zck_status zck__uv_moe_module(zck_uv_ckpt *c, const zck_pk *root) {
  const zck_pk *shapes = zck_pk_dict_get(root, "param_shapes");
  if (c->autoep || !shapes || shapes->kind != ZCK_PK_LIST) return ZCK_OK;
  size_t n_exp = 0;
  for (size_t g = 0; g < shapes->u.seq.len; g++) {
    const zck_pk *d = shapes->u.seq.items[g];
    for (size_t i = 0; d && d->kind == ZCK_PK_DICT && i < d->u.dict.len; i++) {
      const char *name = zck_pk_as_str(d->u.dict.keys[i]);
      n_exp += name && is_expert(name);
    }
  }
  if (!n_exp) return ZCK_OK;   /* malformed param_shapes: the manifest says what is wrong */
  expert *x = zck__calloc(n_exp, sizeof *x);
  zck__uv_tref *m = zck__calloc(c->n_module + n_exp + 1, sizeof *m);
  zck_status st = x && m ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t g = 0; st == ZCK_OK && g < shapes->u.seq.len; g++) {
    const zck_pk *d = shapes->u.seq.items[g];
    for (size_t i = 0; st == ZCK_OK && d && d->kind == ZCK_PK_DICT && i < d->u.dict.len; i++) {
      const char *name = zck_pk_as_str(d->u.dict.keys[i]);
      if (!name || !is_expert(name)) continue;
      if (in_module(c, name)) {   /* a module that holds its experts is not deepspeed.moe's */
        k = 0;
        goto done;
      }
      st = expert_of(c, name, d->u.dict.values[i], &x[k], k ? &x[k - 1] : NULL);
      k++;
    }
  }
  if (st == ZCK_OK) {
    /* an insertion sort, stable: the experts of one place keep their param_shapes order */
    for (size_t i = 1; i < k; i++)
      for (size_t j = i; j > 0 && x[j - 1].after > x[j].after; j--) {
        expert t = x[j];
        x[j] = x[j - 1];
        x[j - 1] = t;
      }
    size_t n = 0, e = 0;
    for (size_t i = 0; i <= c->n_module; i++) {
      if (i < c->n_module) m[n++] = c->module[i];
      while (e < k && (x[e].after == i || i == c->n_module)) m[n++] = x[e++].t;
    }
    free(c->module);
    c->module = m;
    c->n_module = n;
    m = NULL;
    c->legacy_moe = true;
  }
done:
  free(x);
  free(m);
  return st;
}

zck_status zck__uv_moe_refuse(const zck_uv_ckpt *c, const char *job) {
  if (!c->legacy_moe) return ZCK_OK;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a universal folder of a deepspeed.moe (expert files) checkpoint: %s does not "
                   "write its expert files from it (consolidate, inspect and verify read it; reshard the DeepSpeed "
                   "checkpoint itself)", c->dir, job);
}
