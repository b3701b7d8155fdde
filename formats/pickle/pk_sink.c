/* pk_sink.c: objects handed to a sink while the stream loads (zck_pickle_load_sink). An
 * object of a class the sink names is read in a window, from its NEWOBJ to its BUILD; at
 * the BUILD the sink takes it and every node made in the window is freed. What the stream
 * may still fetch from the memo is kept compact: a str, bytes, int, float, global or tuple
 * of ints as a few bytes of vm.compact, remade as a node on a GET; anything else (a dict,
 * a list, the object's state) as MEMO_GONE, which a GET refuses. A window whose nodes
 * may be reached from outside it (a container made before it changed, the stack cut below
 * its object) is refused: torch's pickler never writes one, and what the sink read could
 * change after it read it. A consumed object is sealed: no later BUILD, APPEND or SETITEM. */
#include "pk_vm.h"

#include <stdlib.h>
#include <string.h>

#define MAX_COMPACT_TUPLE 64       /* a torch.Size has at most a few dozen dimensions */
#define MAX_COMPACT_ARGS 8         /* an enum member or a layout: REDUCE'd from one value */

static size_t node_id(const zck_pk *n) { return ((const zck__pkn *)n)->id; }

void zck__vm_window_open(vm *v, zck_pk *obj, int cls) {
  pk_window *w = &v->win;
  /* the doc-wide nodes first, outside every window (one made inside would be freed) */
  if (!w->ready) {
    if (!zck__pk_make_shared(v->doc)) return;
    if (!v->empty_tuple && !(v->empty_tuple = zck_pk_new_tuple(v->doc, 0))) return;
    w->ready = true;
  }
  w->obj = obj;
  w->cls = cls;
  w->escaped = false;
  w->oom = false;
  w->mark = zck__pk_doc_mark(v->doc);
  w->sp = v->sp;
  w->nmarks = v->nmarks;
  w->nputs = 0;
  w->nremade = 0;
}

void zck__vm_window_put(vm *v, size_t idx) {
  pk_window *w = &v->win;
  if (!ZCK__GROW(w->puts, w->cap_puts, w->nputs + 1)) w->oom = true;   /* the close says so */
  else w->puts[w->nputs++] = idx;
}

// ---- compact values

static void put_uvarint(zck__buf *b, uint64_t x) {
  while (x >= 0x80) {
    zck__buf_byte(b, (uint8_t)(x | 0x80));
    x >>= 7;
  }
  zck__buf_byte(b, (uint8_t)x);
}
static void put_svarint(zck__buf *b, int64_t x) { put_uvarint(b, ((uint64_t)x << 1) ^ (uint64_t)(x >> 63)); }
static uint64_t get_uvarint(const uint8_t **p) {
  uint64_t x = 0;
  for (int s = 0;; s += 7) {
    uint8_t c = *(*p)++;
    x |= (uint64_t)(c & 0x7f) << s;
    if (!(c & 0x80)) return x;
  }
}
static int64_t get_svarint(const uint8_t **p) {
  uint64_t u = get_uvarint(p);
  return (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
}

static void put_name(zck__buf *b, const char *s) {
  size_t n = strlen(s);
  put_uvarint(b, n);
  zck__buf_append(b, s, n);
}

/* An object REDUCE'd from strings and ints, as torch pickles its singletons (an Enum
 * member, torch.strided through _get_layout), every later use of which is a memo GET. */
static bool value_object(const zck_pk *n) {
  const zck_pk *a = n->u.obj.args;
  if (n->u.obj.newobj || n->u.obj.state || n->u.obj.list_items || n->u.obj.dict_items || n->tag ||
      n->u.obj.callable->kind != ZCK_PK_GLOBAL || !a || a->kind != ZCK_PK_TUPLE || a->u.seq.len > MAX_COMPACT_ARGS)
    return false;
  for (size_t i = 0; i < a->u.seq.len; i++)
    if (a->u.seq.items[i]->kind != ZCK_PK_INT && a->u.seq.items[i]->kind != ZCK_PK_STR) return false;
  return true;
}

/* The offset of n's compact value in v->compact, or 0 when n is not a value the stream
 * could fetch again and use as itself (a container, which may have been changed). */
static uint64_t encode(vm *v, const zck_pk *n) {
  zck__buf *b = &v->compact;
  uint64_t at = b->len;
  switch (n->kind) {
  case ZCK_PK_STR: case ZCK_PK_BYTES:
    if (n->tag == ZCK_PK_TAG_BYTEARRAY) return 0;
    zck__buf_byte(b, n->kind == ZCK_PK_STR ? 'S' : 'B');
    put_uvarint(b, n->u.str.len);
    zck__buf_append(b, n->u.str.data, n->u.str.len);
    break;
  case ZCK_PK_INT:
    zck__buf_byte(b, 'I');
    put_svarint(b, n->u.i);
    break;
  case ZCK_PK_FLOAT:
    zck__buf_byte(b, 'F');
    zck__buf_append(b, &n->u.f, sizeof n->u.f);
    break;
  case ZCK_PK_GLOBAL:
    zck__buf_byte(b, 'G');
    put_name(b, n->u.global.module);
    put_name(b, n->u.global.name);
    break;
  case ZCK_PK_OBJECT:
    if (!value_object(n)) return 0;
    zck__buf_byte(b, 'O');
    put_name(b, n->u.obj.callable->u.global.module);
    put_name(b, n->u.obj.callable->u.global.name);
    put_uvarint(b, n->u.obj.args->u.seq.len);
    for (size_t i = 0; i < n->u.obj.args->u.seq.len; i++) {
      const zck_pk *x = n->u.obj.args->u.seq.items[i];
      if (x->kind == ZCK_PK_INT) {
        zck__buf_byte(b, 'I');
        put_svarint(b, x->u.i);
      } else {
        zck__buf_byte(b, 'S');
        put_uvarint(b, x->u.str.len);
        zck__buf_append(b, x->u.str.data, x->u.str.len);
      }
    }
    break;
  case ZCK_PK_TUPLE:
    if (n->u.seq.len > MAX_COMPACT_TUPLE) return 0;
    for (size_t i = 0; i < n->u.seq.len; i++)
      if (n->u.seq.items[i]->kind != ZCK_PK_INT) return 0;
    zck__buf_byte(b, 'T');
    zck__buf_byte(b, (uint8_t)n->tag);
    put_uvarint(b, n->u.seq.len);
    for (size_t i = 0; i < n->u.seq.len; i++) put_svarint(b, n->u.seq.items[i]->u.i);
    break;
  default:
    return 0;
  }
  return at;
}

static zck_pk *remake_global(vm *v, const uint8_t **p) {
  char m[1025], nm[1025];   /* globals are at most 1024 bytes (pk_load.c) */
  size_t ml = (size_t)get_uvarint(p);
  memcpy(m, *p, ml), m[ml] = 0, *p += ml;
  size_t nl = (size_t)get_uvarint(p);
  memcpy(nm, *p, nl), nm[nl] = 0, *p += nl;
  return zck_pk_new_global(v->doc, m, nm);
}

static zck_status remake(vm *v, uint64_t off, zck_pk **out) {
  const uint8_t *p = v->compact.data + off;
  uint8_t k = *p++;
  switch (k) {
  case 'S': case 'B': {
    uint64_t n = get_uvarint(&p);
    VNEW(v, zck__pk_new_blob(v->doc, k == 'S' ? ZCK_PK_STR : ZCK_PK_BYTES, p, (size_t)n), *out);
    return ZCK_OK;
  }
  case 'I': VNEW(v, zck_pk_new_int(v->doc, get_svarint(&p)), *out); return ZCK_OK;
  case 'F': {
    double d;
    memcpy(&d, p, sizeof d);
    VNEW(v, zck_pk_new_float(v->doc, d), *out);
    return ZCK_OK;
  }
  case 'G': VNEW(v, remake_global(v, &p), *out); return ZCK_OK;
  case 'O': {
    zck_pk *g, *args, *o;
    VNEW(v, remake_global(v, &p), g);
    size_t n = (size_t)get_uvarint(&p);
    VNEW(v, zck__pk_new_seq(v->doc, ZCK_PK_TUPLE, NULL, n), args);
    for (size_t i = 0; i < n; i++)
      if (*p++ == 'I') VNEW(v, zck_pk_new_int(v->doc, get_svarint(&p)), args->u.seq.items[i]);
      else {
        size_t len = (size_t)get_uvarint(&p);
        VNEW(v, zck__pk_new_blob(v->doc, ZCK_PK_STR, p, len), args->u.seq.items[i]);
        p += len;
      }
    VNEW(v, zck_pk_new_object(v->doc, g, args, 0, NULL), o);
    o->tag = ZCK_PK_TAG_SEALED;
    *out = o;
    return ZCK_OK;
  }
  default: {   /* 'T' */
    int tag = *p++;
    size_t n = (size_t)get_uvarint(&p);
    zck_pk *t;
    VNEW(v, zck__pk_new_seq(v->doc, ZCK_PK_TUPLE, NULL, n), t);
    t->tag = tag;
    for (size_t i = 0; i < n; i++) VNEW(v, zck_pk_new_int(v->doc, get_svarint(&p)), t->u.seq.items[i]);
    *out = t;
    return ZCK_OK;
  }
  }
}

zck_status zck__vm_memo_remake(vm *v, size_t idx, zck_pk **out) {
  uint32_t m = v->memo[idx];
  if (m == MEMO_GONE)
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "memo entry %zu is part of an object already read (refused)", idx);
  uint64_t off = m >> 1;
  ZCK_TRY(remake(v, off, out));
  uint32_t slot;
  if (!zck__vm_memo_slot(*out, &slot)) return zck__vm_fail(v, ZCK_ERR_LIMIT, "more than %u objects to memoize", MEMO_MAX - 2);
  v->memo[idx] = slot;   /* later GETs share it, as they would the object */
  pk_window *w = &v->win;
  if (w->obj) {   /* made in a window: back to its compact value when the window goes */
    zck__vm_window_put(v, idx);
    if (!ZCK__GROW(w->remade, w->cap_remade, w->nremade + 1)) w->oom = true;
    else w->remade[w->nremade++] = (struct pk_remade){node_id(*out), off};
  }
  return ZCK_OK;
}

// ---- closing a window

/* The memo slots pointing at the window's nodes, made compact or gone; then the nodes. */
static zck_status free_window(vm *v) {
  pk_window *w = &v->win;
  size_t base = w->mark.count, n = v->doc->count - base;
  if (!ZCK__GROW(w->enc, w->cap_enc, n)) return zck__vm_oom(v);
  memset(w->enc, 0, n * sizeof *w->enc);
  for (size_t i = 0; i < w->nremade; i++)
    if (w->remade[i].id >= base) w->enc[w->remade[i].id - base] = w->remade[i].off;
  for (size_t i = 0; i < w->nputs; i++) {
    uint32_t m = v->memo[w->puts[i]];
    if (!m || (m & 1)) continue;
    const zck_pk *node = zck__vm_memo_node(v, m);
    if (node_id(node) < base) continue;
    uint64_t *e = &w->enc[node_id(node) - base];
    if (!*e) *e = encode(v, node);
    if (!*e) *e = UINT64_MAX;   /* not a value: gone */
    if (*e != UINT64_MAX && *e >= MEMO_MAX)
      return zck__vm_fail(v, ZCK_ERR_LIMIT, "more than %u bytes of values kept from consumed objects", MEMO_MAX);
    v->memo[w->puts[i]] = *e == UINT64_MAX ? MEMO_GONE : (uint32_t)(*e << 1 | 1);
  }
  if (v->compact.failed) return zck__vm_oom(v);
  zck__pk_doc_rollback(v->doc, &w->mark);
  return ZCK_OK;
}

zck_status zck__vm_window_close(vm *v, zck_pk *state) {
  pk_window *w = &v->win;
  zck_pk *obj = w->obj;
  w->obj = NULL;
  if (w->oom) return zck__vm_oom(v);
  size_t base = w->mark.count;
  /* what was made for the object must be its own: what the sink reads is then what the
   * stream ends with (nothing can change it later), and freeing it leaves nothing dangling */
  if (w->escaped || v->sp != w->sp || v->nmarks != w->nmarks || v->doc->shared_top > base ||
      (v->empty_tuple && node_id(v->empty_tuple) >= base))
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "a %s.%s whose parts are reached from outside it (refused)",
                        obj->u.obj.callable->u.global.module, obj->u.obj.callable->u.global.name);
  obj->u.obj.state = state;
  if (v->sink->check)
    for (size_t i = base; i < v->doc->count; i++) ZCK_TRY(v->sink->check(v->sink->ctx, zck_pk_doc_node_at(v->doc, i)));
  uint32_t handle = 0;
  ZCK_TRY(v->sink->consume(v->sink->ctx, w->cls, obj, w->sp >= 2 ? v->stack[w->sp - 2] : NULL, &handle));
  obj->u.obj.state = NULL;
  obj->tag = ZCK_PK_TAG_CONSUMED;
  obj->u.obj.sink_handle = handle;
  return free_window(v);
}

void zck__vm_window_free(vm *v) {
  free(v->win.puts);
  free(v->win.remade);
  free(v->win.enc);
  zck__buf_free(&v->compact);
}
