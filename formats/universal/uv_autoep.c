/* uv_autoep.c: a universal folder made from a DeepSpeed AutoEP (expert-parallel MoE) checkpoint, by
 * ds_to_universal.py 0.19.8 or `zckpt to-universal` (the same files).
 *
 * Its model file is the source's, saved again with universal_checkpoint_info['ds_autoep_layers'] (each MoE layer's
 * module_path, expert_key_prefix, num_experts, num_local_experts, ep_size): its `module` holds no expert weight and
 * the router twice (<mlp>.router.gate.weight and its alias <mlp>.gate.gate.weight, the same tensor), its
 * param_shapes the experts' local shapes [local experts, ...]; zero/<prefix>.w{1,2,3}/ hold all the experts.
 * Read here as the DeepSpeed reader reads the AutoEP checkpoint itself under DeepSpeed's names (ds_autoep.c):
 * the alias dropped, the three expert params placed after their router at their full shape [experts, ...]. */
#include "uv_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct zck__uv_autoep_layer {
  char *router, *alias, *w[3];   /* <mlp>.router.gate.weight, <mlp>.gate.gate.weight, <prefix>.w1 / w2 / w3 */
  int64_t experts, local;
} zck__uv_autoep_layer;

struct zck__uv_autoep {
  zck__uv_autoep_layer *v;
  size_t n;
};

void zck__uv_autoep_free(struct zck__uv_autoep *a) {
  if (!a) return;
  for (size_t i = 0; i < a->n; i++) {
    free(a->v[i].router);
    free(a->v[i].alias);
    for (int w = 0; w < 3; w++) free(a->v[i].w[w]);
  }
  free(a->v);
  free(a);
}

int64_t zck__uv_autoep_mult(const zck_uv_ckpt *c, const char *name) {
  for (size_t i = 0; c->autoep && i < c->autoep->n; i++)
    for (int w = 0; w < 3; w++)
      if (!strcmp(c->autoep->v[i].w[w], name)) return c->autoep->v[i].experts / c->autoep->v[i].local;
  return 0;
}

static zck_status layer_of(const zck_pk *e, size_t i, zck__uv_autoep_layer *l, int64_t *ep, const char *path) {
  const char *mp = zck_pk_as_str(zck_pk_dict_get(e, "module_path"));
  const char *pre = zck_pk_as_str(zck_pk_dict_get(e, "expert_key_prefix"));
  if (!mp || !pre || !zck_pk_as_int(zck_pk_dict_get(e, "num_experts"), &l->experts) ||
      !zck_pk_as_int(zck_pk_dict_get(e, "num_local_experts"), &l->local) ||
      !zck_pk_as_int(zck_pk_dict_get(e, "ep_size"), ep))
    return zck__fail(ZCK_ERR_FORMAT, "%s: universal_checkpoint_info['ds_autoep_layers'][%zu] lacks module_path, "
                     "expert_key_prefix, num_experts, num_local_experts or ep_size", path, i);
  if (l->local < 1 || *ep < 1 || l->experts != l->local * *ep)
    return zck__fail(ZCK_ERR_FORMAT, "%s: universal_checkpoint_info['ds_autoep_layers'][%zu]: %lld experts are not "
                     "%lld local x ep_size %lld", path, i, (long long)l->experts, (long long)l->local, (long long)*ep);
  l->router = zck__sprintf("%s.router.gate.weight", mp);
  l->alias = zck__sprintf("%s.gate.gate.weight", mp);
  for (int w = 0; w < 3; w++) l->w[w] = zck__sprintf("%s.w%d", pre, w + 1);
  return l->router && l->alias && l->w[0] && l->w[1] && l->w[2] ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

/* The expert's local shape in param_shapes, times its EP size on the experts dim. */
static zck_status full_shape(const zck_pk *shapes, const char *name, int64_t mult, zck__uv_tref *t, const char *path) {
  for (size_t g = 0; shapes && shapes->kind == ZCK_PK_LIST && g < shapes->u.seq.len; g++) {
    const zck_pk *s = zck_pk_dict_get(shapes->u.seq.items[g], name);
    if (!s) continue;
    if ((s->kind != ZCK_PK_TUPLE && s->kind != ZCK_PK_LIST) || !s->u.seq.len || s->u.seq.len > ZCK_MAX_DIMS) break;
    t->ndim = (int)s->u.seq.len;
    t->numel = 1;
    for (int d = 0; d < t->ndim; d++) {
      if (!zck_pk_as_int(s->u.seq.items[d], &t->shape[d]) || t->shape[d] < 0) goto bad;
      if (!d) t->shape[0] *= mult;
      t->numel *= (uint64_t)t->shape[d];
    }
    return ZCK_OK;
  }
bad:
  return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes has no [experts, ...] shape for AutoEP expert '%s'", path, name);
}

zck_status zck__uv_autoep_module(zck_uv_ckpt *c, const zck_pk *root) {
  const char *path = zck_torch_name(c->model0);
  const zck_pk *list = zck_pk_dict_get(zck_pk_dict_get(root, "universal_checkpoint_info"), "ds_autoep_layers");
  if (!list || list->kind == ZCK_PK_NONE) return ZCK_OK;
  if (list->kind != ZCK_PK_LIST || !list->u.seq.len)
    return zck__fail(ZCK_ERR_FORMAT, "%s: universal_checkpoint_info['ds_autoep_layers'] is not a list of layers", path);
  struct zck__uv_autoep *a = zck__calloc(1, sizeof *a);
  if (!a || !(a->v = zck__calloc(list->u.seq.len, sizeof *a->v))) { free(a); return ZCK_ERR_NO_MEMORY; }
  c->autoep = a;
  int64_t ep = 0;
  for (size_t i = 0; i < list->u.seq.len; i++) {
    int64_t e;
    ZCK_TRY(layer_of(list->u.seq.items[i], i, &a->v[a->n++], &e, path));
    if (ep && e != ep)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: AutoEP layers of ep_size %lld and %lld", path, (long long)ep, (long long)e);
    ep = e;
  }
  c->info.ep_size = (uint32_t)ep;
  /* `module`: the alias out, the experts in after their router */
  zck__uv_tref *m = zck__calloc(c->n_module + 3 * a->n + 1, sizeof *m);
  if (!m) return ZCK_ERR_NO_MEMORY;
  size_t n = 0, routers = 0;
  const zck_pk *shapes = zck_pk_dict_get(root, "param_shapes");
  zck_status st = ZCK_OK;
  for (size_t i = 0; i < c->n_module && st == ZCK_OK; i++) {
    const zck__uv_autoep_layer *l = NULL;
    bool alias = false;
    for (size_t k = 0; k < a->n && !l; k++)
      if (!strcmp(c->module[i].name, a->v[k].router)) l = &a->v[k];
      else if (!strcmp(c->module[i].name, a->v[k].alias)) alias = true;
    if (alias) continue;
    m[n++] = c->module[i];
    if (!l) continue;
    routers++;
    for (int w = 0; w < 3 && st == ZCK_OK; w++) {
      zck__uv_tref t = {0};   /* no bytes: the experts' weights are only in zero/ */
      t.name = l->w[w];
      t.dtype = c->module[i].dtype;
      st = full_shape(shapes, l->w[w], l->experts / l->local, &t, path);
      m[n++] = t;
    }
  }
  if (st == ZCK_OK && routers != a->n)
    st = zck__fail(ZCK_ERR_FORMAT, "%s: module holds the router of %zu of the %zu AutoEP layers", path, routers, a->n);
  if (st != ZCK_OK) { free(m); return st; }
  free(c->module);
  c->module = m;
  c->n_module = n;
  return ZCK_OK;
}

zck_status zck_uv_autoep_refuse(const zck_uv_ckpt *c, const char *job) {
  if (c && !c->autoep) {   /* the other layouts whose writers read the DeepSpeed checkpoint's own files */
    ZCK_TRY(zck__uv_moe_refuse(c, job));
    return zck__uv_pipe_refuse(c, job);
  }
  if (!c) return ZCK_OK;
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a universal folder of an AutoEP (expert-parallel) checkpoint: %s does "
                   "not write AutoEP's layout yet (consolidate, inspect and verify read it)", c->dir, job);
}
