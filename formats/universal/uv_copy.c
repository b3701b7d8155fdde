/* uv_copy.c: carrying a pickled object, tensors included, from one .pt file into a new one.
 *
 * ds_to_universal saves DeepSpeed objects it loaded (the stage-3 optimizer_state.pt is rank
 * 0's whole optimizer_state_dict, tensors and all). The tree is copied node by node into
 * the new file's document; each tensor becomes a reserved storage of the new file and a
 * copy entry; the job that writes the file runs the entries (jobs/to_universal.c), this
 * format only describes them. */
#include "universal/universal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#define ZCK__UV_COPY_MAX_DEPTH 200

typedef struct zck__uv_memo {
  const zck_pk **from;
  zck_pk **to;
  size_t n, cap;
} zck__uv_memo;

static zck_pk *zck__uv_memo_find(const zck__uv_memo *m, const zck_pk *n) {
  for (size_t i = m->n; i-- > 0;)
    if (m->from[i] == n) return m->to[i];
  return NULL;
}

static bool zck__uv_memo_add(zck__uv_memo *m, const zck_pk *from, zck_pk *to) {
  if (m->n == m->cap) {
    size_t nc = m->cap ? 2 * m->cap : 64;
    const zck_pk **f = realloc(m->from, nc * sizeof *f);
    if (f) m->from = f;
    zck_pk **t = f ? realloc(m->to, nc * sizeof *t) : NULL;
    if (!t) return false;
    m->to = t;
    m->cap = nc;
  }
  m->from[m->n] = from;
  m->to[m->n++] = to;
  return true;
}

typedef struct zck__uv_cp {
  zck_torch_writer *tw;
  const zck_torch_file *src;
  const zck__source *data;
  zck_uv_copies *copies;
  zck__uv_memo memo;
} zck__uv_cp;

typedef struct zck__uv_tread {
  const zck_torch_file *f;
  const zck_torch_tensor *t;
} zck__uv_tread;

typedef struct zck__uv_twrite {
  zck_torch_writer *tw;
  size_t storage, es;
} zck__uv_twrite;

static zck_status zck__uv_tread_fn(void *ctx, void *dst, uint64_t off, uint64_t count) {
  zck__uv_tread *r = ctx;
  return zck_torch_tensor_read(r->f, r->t, dst, off, count);
}

static zck_status zck__uv_twrite_fn(void *ctx, const void *src, uint64_t off, uint64_t count) {
  zck__uv_twrite *w = ctx;
  return zck_torch_writer_write(w->tw, w->storage, src, (size_t)(count * w->es), off * w->es);
}

static void *zck__uv_own(zck_uv_copies *c, size_t size) {
  if (c->n_ctx == c->cap_ctx) {
    size_t nc = c->cap_ctx ? 2 * c->cap_ctx : 16;
    void **v = realloc(c->ctx, nc * sizeof *v);
    if (!v) return NULL;
    c->ctx = v;
    c->cap_ctx = nc;
  }
  void *p = zck__calloc(1, size);
  if (p) c->ctx[c->n_ctx++] = p;
  return p;
}

static zck_pk *zck__uv_tensor(zck__uv_cp *cp, const zck_torch_tensor *t) {
  zck_uv_copies *c = cp->copies;
  size_t si;
  uint64_t off;
  if (zck_torch_writer_add_storage(cp->tw, t->dtype, t->numel, &si, &off) != ZCK_OK) return NULL;
  zck_pk *node = zck_torch_writer_tensor(cp->tw, si, t->ndim, t->shape, NULL, 0, t->requires_grad);
  if (node && t->is_parameter) node = zck_torch_writer_parameter(cp->tw, node, t->requires_grad);
  if (!node) return NULL;
  if (!t->numel) return node;
  if (c->n == c->cap) {
    size_t nc = c->cap ? 2 * c->cap : 16;
    zck_uv_tensor_copy *v = realloc(c->v, nc * sizeof *v);
    if (!v) { zck__fail(ZCK_ERR_NO_MEMORY, "out of memory"); return NULL; }
    c->v = v;
    c->cap = nc;
  }
  zck__uv_twrite *wc = zck__uv_own(c, sizeof *wc);
  if (!wc) return NULL;
  *wc = (zck__uv_twrite){cp->tw, si, zck_dtype_size(t->dtype)};
  zck_uv_tensor_copy *e = &c->v[c->n];
  memset(e, 0, sizeof *e);
  const char *name = zck_torch_name(cp->src);
  if (zck_torch_tensor_contiguous(t)) {
    const zck__source *data = cp->data ? cp->data : zck_torch_source(cp->src);
    e->src = zck_store_source(data, zck_torch_tensor_file_offset(cp->src, t), t->dtype, t->numel, name);
    /* its zip record's CRC, checked as the copy reads it (the bytes are in src's own file) */
    zck_record_check rc;
    if (data == zck_torch_source(cp->src) && zck_torch_tensor_record(cp->src, t, &rc)) {
      char what[80];
      snprintf(what, sizeof what, "record data/%.60s", zck_torch_tensor_storage(cp->src, t)->key);
      zck_record_check *r = zck__uv_own(c, sizeof *r + strlen(what) + 1);
      if (!r) return NULL;
      memcpy(r + 1, what, strlen(what) + 1);
      rc.what = (const char *)(r + 1);
      *r = rc;
      e->src.record = r;
    }
  } else if (cp->data) {
    zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a strided tensor view in a carried object", name);
    return NULL;
  } else {
    zck__uv_tread *rc = zck__uv_own(c, sizeof *rc);
    if (!rc) return NULL;
    *rc = (zck__uv_tread){cp->src, t};
    e->src = zck_store_callback(zck__uv_tread_fn, NULL, rc, t->dtype, t->numel, name);
  }
  e->dst = zck_store_callback(NULL, zck__uv_twrite_fn, wc, t->dtype, t->numel, name);
  e->count = t->numel;
  e->storage = si;
  e->data_off = off;
  c->n++;
  return node;
}

static zck_pk *zck__uv_copy(zck__uv_cp *cp, const zck_pk *n, int depth) {
  if (!n) return NULL;
  if (depth > ZCK__UV_COPY_MAX_DEPTH) {
    zck__fail(ZCK_ERR_LIMIT, "%s: pickled object nested deeper than %d", zck_torch_name(cp->src), ZCK__UV_COPY_MAX_DEPTH);
    return NULL;
  }
  zck_pk_doc *d = zck_torch_writer_doc(cp->tw);
  zck_pk *c = zck__uv_memo_find(&cp->memo, n);
  if (c) return c;
  const zck_torch_tensor *t = zck_torch_tensor_of(cp->src, n);
  if (t) {
    c = zck__uv_tensor(cp, t);
    /* torch._tensor._rebuild_from_type_v2(func, type, args, state): keep the wrapper and
     * its Python attributes (DeepSpeed's stage-3 flat groups carry ds_id), around the
     * new tensor's own rebuild call */
    const zck_pk *a = n->kind == ZCK_PK_OBJECT ? n->u.obj.args : NULL;
    if (c && a && a->kind == ZCK_PK_TUPLE && a->u.seq.len == 4 && !t->is_parameter && c->kind == ZCK_PK_OBJECT &&
        c->u.obj.args && zck_pk_is_global(n->u.obj.callable, "torch._tensor", "_rebuild_from_type_v2")) {
      zck_pk *args = zck_pk_new_tuple(d, 4);
      zck_pk *fn = zck__uv_copy(cp, n->u.obj.callable, depth + 1);
      if (!args || !fn) return NULL;
      args->u.seq.items[0] = c->u.obj.callable;
      args->u.seq.items[2] = c->u.obj.args;
      if (!(args->u.seq.items[1] = zck__uv_copy(cp, a->u.seq.items[1], depth + 1)) ||
          !(args->u.seq.items[3] = zck__uv_copy(cp, a->u.seq.items[3], depth + 1)))
        return NULL;
      c = zck_pk_new_object(d, fn, args, 0, NULL);
    }
    if (c && !zck__uv_memo_add(&cp->memo, n, c)) c = NULL;
    return c;
  }
  switch (n->kind) {
  case ZCK_PK_NONE: return zck_pk_new_none(d);
  case ZCK_PK_BOOL: return zck_pk_new_bool(d, n->u.b);
  case ZCK_PK_INT: return zck_pk_new_int(d, n->u.i);
  case ZCK_PK_FLOAT: return zck_pk_new_float(d, n->u.f);
  case ZCK_PK_STR: case ZCK_PK_BYTES: case ZCK_PK_BIGINT:
    c = zck_pk_new_bytes(d, n->u.str.data, n->u.str.len);
    if (c) { c->kind = n->kind; c->tag = n->tag; }
    return c;
  case ZCK_PK_GLOBAL: return zck_pk_new_global(d, n->u.global.module, n->u.global.name);
  case ZCK_PK_TUPLE:
    c = zck_pk_new_tuple(d, n->u.seq.len);
    if (!c || !zck__uv_memo_add(&cp->memo, n, c)) return NULL;
    c->tag = n->tag;
    for (size_t i = 0; i < n->u.seq.len; i++)
      if (!(c->u.seq.items[i] = zck__uv_copy(cp, n->u.seq.items[i], depth + 1))) return NULL;
    return c;
  case ZCK_PK_LIST: case ZCK_PK_SET:
    c = n->kind == ZCK_PK_SET ? zck_pk_new_set(d, n->tag == ZCK_PK_TAG_FROZENSET) : zck_pk_new_list(d);
    if (!c || !zck__uv_memo_add(&cp->memo, n, c)) return NULL;
    c->tag = n->tag;
    for (size_t i = 0; i < n->u.seq.len; i++) {
      zck_pk *it = zck__uv_copy(cp, n->u.seq.items[i], depth + 1);
      if (!it || !zck_pk_append(d, c, it)) return NULL;
    }
    return c;
  case ZCK_PK_DICT:
    c = zck_pk_new_dict(d, n->u.dict.ordered);
    if (!c || !zck__uv_memo_add(&cp->memo, n, c)) return NULL;
    for (size_t i = 0; i < n->u.dict.len; i++) {
      zck_pk *k = zck__uv_copy(cp, n->u.dict.keys[i], depth + 1);
      zck_pk *v = k ? zck__uv_copy(cp, n->u.dict.values[i], depth + 1) : NULL;
      if (!v || !zck_pk_dict_set(d, c, k, v)) return NULL;
    }
    if (n->u.dict.attrs && !(c->u.dict.attrs = zck__uv_copy(cp, n->u.dict.attrs, depth + 1))) return NULL;
    return c;
  case ZCK_PK_OBJECT: {
    zck_pk *callable = zck__uv_copy(cp, n->u.obj.callable, depth + 1);
    zck_pk *args = callable ? zck__uv_copy(cp, n->u.obj.args, depth + 1) : NULL;
    if (!args) return NULL;
    c = zck_pk_new_object(d, callable, args, n->u.obj.newobj, NULL);
    if (!c || !zck__uv_memo_add(&cp->memo, n, c)) return NULL;
    if (n->u.obj.state && !(c->u.obj.state = zck__uv_copy(cp, n->u.obj.state, depth + 1))) return NULL;
    if (n->u.obj.list_items && !(c->u.obj.list_items = zck__uv_copy(cp, n->u.obj.list_items, depth + 1))) return NULL;
    if (n->u.obj.dict_items && !(c->u.obj.dict_items = zck__uv_copy(cp, n->u.obj.dict_items, depth + 1))) return NULL;
    return c;
  }
  case ZCK_PK_PERSID:
    zck__fail(ZCK_ERR_FORMAT, "%s: a persistent id outside a tensor", zck_torch_name(cp->src));
    return NULL;
  }
  return NULL;
}

zck_status zck_uv_copy_tree(zck_torch_writer *tw, const zck_torch_file *src, const zck__source *data, const zck_pk *node,
                            zck_pk **out, zck_uv_copies *copies) {
  zck__uv_cp cp = {tw, src, data, copies, {0}};
  zck_clear_error();
  *out = zck__uv_copy(&cp, node, 0);
  free(cp.memo.from);
  free(cp.memo.to);
  if (*out) return ZCK_OK;
  return zck_last_error()[0] ? ZCK_ERR_FORMAT : zck__fail(ZCK_ERR_NO_MEMORY, "out of memory copying a pickled object");
}

void zck_uv_copies_free(zck_uv_copies *c) {
  for (size_t i = 0; i < c->n_ctx; i++) free(c->ctx[i]);
  free(c->ctx);
  free(c->v);
  memset(c, 0, sizeof *c);
}
