/* ds_pickle.c: DeepSpeed's objects in pickle trees: shapes (and dicts of them), tensors,
 * ZeroStageEnum, int lists, and deep copies of trees carried from a read checkpoint into a
 * written one. */
#include "ds_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

zck_status zck__ds_shape(const zck_pk *node, zck__ds_named_shape *out, const char *what) {
  /* torch.Size (a tagged tuple), a plain tuple or a list: all valid shape spellings (DS-22). */
  if (!node || (node->kind != ZCK_PK_TUPLE && node->kind != ZCK_PK_LIST))
    return zck__fail(ZCK_ERR_FORMAT, "%s: shape is not a torch.Size, tuple or list", what);
  size_t nd = node->u.seq.len;
  if (nd > ZCK_MAX_DIMS)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: shape has %zu dimensions (at most %d supported)", what, nd,
                     ZCK_MAX_DIMS);
  uint64_t numel = 1;
  for (size_t i = 0; i < nd; i++) {
    int64_t v;
    const zck_pk *it = node->u.seq.items[i];
    if (!it || it->kind != ZCK_PK_INT || !zck_pk_as_int(it, &v) || v < 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: shape dimension %zu is not a non-negative int", what, i);
    out->shape[i] = v;
    if (!zck__mul_u64(numel, (uint64_t)v, &numel) || numel > ((uint64_t)1 << 62))
      return zck__fail(ZCK_ERR_FORMAT, "%s: shape element count overflows", what);
  }
  out->ndim = (int)nd;
  out->numel = numel;
  return ZCK_OK;
}

zck_status zck__ds_tensor(const zck_torch_file *f, const zck_pk *node, zck__ds_tref *out, const char *what) {
  const zck_torch_tensor *t = node ? zck_torch_tensor_of(f, node) : NULL;
  if (!t) return zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a tensor", zck_torch_name(f), what);
  if (t->ndim > ZCK_MAX_DIMS)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s has %d dimensions (at most %d supported)", zck_torch_name(f), what,
                     t->ndim, ZCK_MAX_DIMS);
  memset(out, 0, sizeof *out);
  out->dtype = t->dtype;
  out->ndim = t->ndim;
  for (int i = 0; i < t->ndim; i++) out->shape[i] = t->shape[i];
  out->numel = zck_torch_tensor_numel(t);
  out->contiguous = zck_torch_tensor_contiguous(t) != 0;
  out->offset = zck_torch_tensor_file_offset(f, t);
  const zck_torch_storage *st = zck_torch_tensor_storage(f, t);
  if (st && st->entry && st->entry->method == 0 && strlen(st->key) < sizeof out->rec_key) {
    out->has_record = true;
    out->rec_off = st->entry->data_offset;
    out->rec_size = st->entry->size;
    out->rec_crc = st->entry->crc32;
    memcpy(out->rec_key, st->key, strlen(st->key) + 1);
  }
  return ZCK_OK;
}

int zck__ds_zero_stage(const zck_pk *node) {
  int64_t v;
  if (!node) return -1;
  if (node->kind == ZCK_PK_INT) return zck_pk_as_int(node, &v) && v >= 0 && v <= 3 ? (int)v : -1;
  if (node->kind != ZCK_PK_OBJECT || !node->u.obj.args || node->u.obj.args->kind != ZCK_PK_TUPLE) return -1;
  const zck_pk *args = node->u.obj.args;
  /* Python <= 3.10 (and 3.11 as observed in the fixtures): ZeroStageEnum(2) via REDUCE. */
  if (zck_pk_is_global(node->u.obj.callable, "deepspeed.runtime.zero.config", "ZeroStageEnum")) {
    if (args->u.seq.len == 1 && args->u.seq.items[0]->kind == ZCK_PK_INT && zck_pk_as_int(args->u.seq.items[0], &v) &&
        v >= 0 && v <= 3)
      return (int)v;
    return -1;
  }
  /* Python >= 3.12 style: getattr(ZeroStageEnum, 'gradients'). */
  if (zck_pk_is_global(node->u.obj.callable, "builtins", "getattr") && args->u.seq.len == 2 &&
      zck_pk_is_global(args->u.seq.items[0], "deepspeed.runtime.zero.config", "ZeroStageEnum") &&
      args->u.seq.items[0]->kind == ZCK_PK_GLOBAL) {
    const char *name = zck_pk_as_str(args->u.seq.items[1]);
    if (!name) return -1;
    if (!strcmp(name, "disabled")) return 0;
    if (!strcmp(name, "optimizer_states")) return 1;
    if (!strcmp(name, "gradients")) return 2;
    if (!strcmp(name, "weights") || !strcmp(name, "max_stage")) return 3;
  }
  return -1;
}

zck_status zck__ds_int_list(const zck_pk *node, int64_t **out, size_t *n, const char *what) {
  *out = NULL;
  *n = 0;
  if (!node || (node->kind != ZCK_PK_LIST && node->kind != ZCK_PK_TUPLE))
    return zck__fail(ZCK_ERR_FORMAT, "%s is not a list", what);
  size_t len = node->u.seq.len;
  int64_t *v = zck__calloc(len ? len : 1, sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < len; i++) {
    const zck_pk *it = node->u.seq.items[i];
    if (!it || it->kind != ZCK_PK_INT || !zck_pk_as_int(it, &v[i])) {
      free(v);
      return zck__fail(ZCK_ERR_FORMAT, "%s[%zu] is not an int", what, i);
    }
  }
  *out = v;
  *n = len;
  return ZCK_OK;
}

zck_pk *zck__ds_pk_get_mut(zck_pk *dict, const char *key) {
  return (zck_pk *)zck_pk_dict_get(dict, key);
}

/* ---- deep copy */

typedef struct copy_memo {
  const zck_pk **from;
  zck_pk **to;
  size_t n, cap;
} copy_memo;

static zck_pk *memo_find(const copy_memo *m, const zck_pk *from) {
  for (size_t i = 0; i < m->n; i++)   /* config trees are small; linear is fine */
    if (m->from[i] == from) return m->to[i];
  return NULL;
}

static int memo_add(copy_memo *m, const zck_pk *from, zck_pk *to) {
  if (m->n == m->cap) {
    size_t nc = m->cap ? m->cap * 2 : 64;
    const zck_pk **f = zck__realloc(m->from, nc * sizeof *f);
    if (!f) return 0;
    m->from = f;
    zck_pk **t = zck__realloc(m->to, nc * sizeof *t);
    if (!t) return 0;
    m->to = t;
    m->cap = nc;
  }
  m->from[m->n] = from;
  m->to[m->n++] = to;
  return 1;
}

#define ZCK__DS_COPY_MAX_DEPTH 200

static zck_pk *copy_node(zck_pk_doc *d, const zck_pk *n, copy_memo *m, int depth);

static zck_pk *copy_blob(zck_pk_doc *d, const zck_pk *n) {
  zck_pk *c = zck_pk_new_bytes(d, n->u.str.data, n->u.str.len);
  if (c) c->kind = n->kind;   /* STR / BYTES / BIGINT share the blob representation */
  return c;
}

static zck_pk *copy_node(zck_pk_doc *d, const zck_pk *n, copy_memo *m, int depth) {
  if (!n) return NULL;
  if (depth > ZCK__DS_COPY_MAX_DEPTH) {
    zck__fail(ZCK_ERR_LIMIT, "pickled object nested deeper than %d", ZCK__DS_COPY_MAX_DEPTH);
    return NULL;
  }
  zck_pk *c = memo_find(m, n);
  if (c) return c;
  switch (n->kind) {
  case ZCK_PK_NONE: c = zck_pk_new_none(d); break;
  case ZCK_PK_BOOL: c = zck_pk_new_bool(d, n->u.b); break;
  case ZCK_PK_INT: c = zck_pk_new_int(d, n->u.i); break;
  case ZCK_PK_FLOAT: c = zck_pk_new_float(d, n->u.f); break;
  case ZCK_PK_STR: case ZCK_PK_BYTES: case ZCK_PK_BIGINT: c = copy_blob(d, n); break;
  case ZCK_PK_GLOBAL: c = zck_pk_new_global(d, n->u.global.module, n->u.global.name); break;
  case ZCK_PK_TUPLE: {
    c = zck_pk_new_tuple(d, n->u.seq.len);
    if (!c || !memo_add(m, n, c)) return NULL;
    for (size_t i = 0; i < n->u.seq.len; i++)
      if (!(c->u.seq.items[i] = copy_node(d, n->u.seq.items[i], m, depth + 1))) return NULL;
    c->tag = n->tag;
    return c;
  }
  case ZCK_PK_LIST: case ZCK_PK_SET: {
    c = zck_pk_new_list(d);
    if (!c || !memo_add(m, n, c)) return NULL;
    c->kind = n->kind;
    c->tag = n->tag;
    for (size_t i = 0; i < n->u.seq.len; i++) {
      zck_pk *it = copy_node(d, n->u.seq.items[i], m, depth + 1);
      if (!it || !zck_pk_append(d, c, it)) return NULL;
    }
    return c;
  }
  case ZCK_PK_DICT: {
    c = zck_pk_new_dict(d, n->u.dict.ordered);
    if (!c || !memo_add(m, n, c)) return NULL;
    for (size_t i = 0; i < n->u.dict.len; i++) {
      zck_pk *k = copy_node(d, n->u.dict.keys[i], m, depth + 1);
      zck_pk *v = k ? copy_node(d, n->u.dict.values[i], m, depth + 1) : NULL;
      if (!v || !zck_pk_dict_set(d, c, k, v)) return NULL;
    }
    if (n->u.dict.attrs && !(c->u.dict.attrs = copy_node(d, n->u.dict.attrs, m, depth + 1))) return NULL;
    return c;
  }
  case ZCK_PK_OBJECT: {
    zck_pk *callable = copy_node(d, n->u.obj.callable, m, depth + 1);
    zck_pk *args = callable ? copy_node(d, n->u.obj.args, m, depth + 1) : NULL;
    if (!args) return NULL;
    c = zck_pk_new_object(d, callable, args, n->u.obj.newobj, NULL);
    if (!c || !memo_add(m, n, c)) return NULL;
    if (n->u.obj.state && !(c->u.obj.state = copy_node(d, n->u.obj.state, m, depth + 1))) return NULL;
    if (n->u.obj.list_items && !(c->u.obj.list_items = copy_node(d, n->u.obj.list_items, m, depth + 1))) return NULL;
    if (n->u.obj.dict_items && !(c->u.obj.dict_items = copy_node(d, n->u.obj.dict_items, m, depth + 1))) return NULL;
    return c;
  }
  case ZCK_PK_PERSID:
    /* A tensor: its storage belongs to the source file. The objects carried over
     * (ds_config, lr_scheduler, loss scaler) never hold one. */
    zck__fail(ZCK_ERR_UNSUPPORTED, "cannot carry a pickled object holding a tensor into a new checkpoint");
    return NULL;
  }
  if (c && !memo_add(m, n, c)) return NULL;
  return c;
}

zck_pk *zck__ds_pk_copy(zck_pk_doc *d, const zck_pk *node) {
  copy_memo m = {0};
  zck_pk *c = copy_node(d, node, &m, 0);
  free(m.from);
  free(m.to);
  return c;
}

/* An ordered dict of name -> shape (param_shapes[g], frozen_param_shapes). */
zck_status zck__ds_read_shape_dict(const zck_pk *d, zck__ds_shape_list *out, const char *path, const char *what) {
  if (!d || d->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a dict of shapes", path, what);
  out->v = zck__calloc(d->u.dict.len ? d->u.dict.len : 1, sizeof *out->v);
  if (!out->v) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < d->u.dict.len; i++) {
    const char *name = zck_pk_as_str(d->u.dict.keys[i]);
    if (!name) return zck__fail(ZCK_ERR_FORMAT, "%s: %s: key %zu is not a string", path, what, i);
    char ctx[512];
    snprintf(ctx, sizeof ctx, "%s: %s['%.200s']", path, what, name);
    zck__ds_named_shape *s = &out->v[out->n];
    ZCK_TRY(zck__ds_shape(d->u.dict.values[i], s, ctx));
    if (!(s->name = zck__strdup(name))) return ZCK_ERR_NO_MEMORY;
    out->n++;
  }
  return ZCK_OK;
}

void zck__ds_shape_list_free(zck__ds_shape_list *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i].name);
  free(l->v);
  l->v = NULL;
  l->n = 0;
}
