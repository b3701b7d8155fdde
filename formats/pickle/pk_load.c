/* pk_load.c: the pickle VM. Runs protocol 0-5 opcodes over an untrusted byte string and
 * builds an inert zck_pk tree: nothing is imported or called. Every malformed stream is
 * ZCK_ERR_FORMAT "NAME: byte OFFSET: what"; every exceeded limit is ZCK_ERR_LIMIT.
 * Python's metastack (a MARK starts a fresh stack) is modelled by a mark stack of stack
 * heights: no opcode may pop below the innermost mark. */
#include "pk_vm.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZCK__PK_MAX_NAME 1024      /* GLOBAL module / name */

zck_status zck__vm_fail(vm *v, zck_status s, const char *fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const char *on = zck__pk_op_name(v->op);
  return zck__fail(s, "%s: byte %zu: %s%s%s", v->name, v->op_pos, on ? on : "", on ? ": " : "", msg);
}
/* An error already set by an allocation (NO_MEMORY / object LIMIT): add where it happened. */
zck_status zck__vm_oom(vm *v) {
  return zck__error_prepend(ZCK_ERR_NO_MEMORY, "%s: byte %zu", v->name, v->op_pos);
}

/* After a failed node allocation: the object limit, or out of memory. */
zck_status zck__vm_alloc_fail(vm *v) {
  zck_status s = v->doc->hit_limit ? ZCK_ERR_LIMIT : ZCK_ERR_NO_MEMORY;
  return zck__error_prepend(s, "%s: byte %zu", v->name, v->op_pos);
}

// ---- stack

static zck_status push(vm *v, zck_pk *n) {
  if (!ZCK__GROW(v->stack, v->scap, v->sp + 1)) return zck__vm_oom(v);
  v->stack[v->sp++] = n;
  return ZCK_OK;
}

static size_t boundary(const vm *v) { return v->nmarks ? v->marks[v->nmarks - 1] : 0; }

static zck_status underflow(vm *v) {
  if (v->nmarks) return zck__vm_fail(v, ZCK_ERR_FORMAT, "unexpected MARK found (stack underflow inside a MARK)");
  return zck__vm_fail(v, ZCK_ERR_FORMAT, "stack underflow");
}

/* *out is NULL on failure (so optimizing compilers see it set on every path). */
static zck_status pop(vm *v, zck_pk **out) {
  *out = NULL;
  if (v->sp <= boundary(v)) return underflow(v);
  *out = v->stack[--v->sp];
  zck__vm_window_sp(v);
  return ZCK_OK;
}

static zck_status top(vm *v, zck_pk **out) {
  *out = NULL;
  if (v->sp <= boundary(v)) return underflow(v);
  *out = v->stack[v->sp - 1];
  return ZCK_OK;
}

/* Items pushed since the innermost MARK: *items points into the stack (valid until the
 * next push), the MARK is removed and the stack cut back to it. */
static zck_status pop_mark(vm *v, zck_pk ***items, size_t *n) {
  if (!v->nmarks) return zck__vm_fail(v, ZCK_ERR_FORMAT, "no MARK to pop to");
  size_t m = v->marks[--v->nmarks];
  *items = v->stack ? v->stack + m : NULL;   /* an empty stack may not be allocated yet */
  *n = v->sp - m;
  v->sp = m;
  zck__vm_window_sp(v);
  return ZCK_OK;
}

// ---- reading arguments

static zck_status need(vm *v, size_t n) {
  if (v->len - v->pos < n)
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "truncated: needs %zu bytes, %zu left", n, v->len - v->pos);
  return ZCK_OK;
}

zck_status zck__vm_read_line(vm *v, const char **s, size_t *n) {
  *s = NULL; /* an empty line on failure too, so no caller reads an unset one */
  *n = 0;
  const uint8_t *start = v->p + v->pos;
  const uint8_t *nl = memchr(start, '\n', v->len - v->pos);
  if (!nl) return zck__vm_fail(v, ZCK_ERR_FORMAT, "truncated: argument line has no newline");
  *n = (size_t)(nl - start);
  if (*n > v->lim.max_string) return zck__vm_fail(v, ZCK_ERR_LIMIT, "line of %zu bytes over the limit %zu", *n, v->lim.max_string);
  *s = (const char *)start;
  v->pos += *n + 1;
  return ZCK_OK;
}

static zck_status read_len(vm *v, size_t width, uint64_t *n) {
  ZCK_TRY(need(v, width));
  const uint8_t *q = v->p + v->pos;
  *n = width == 1 ? q[0] : width == 4 ? zck__le32(q) : zck__le64(q);
  v->pos += width;
  if (*n > v->lim.max_string)
    return zck__vm_fail(v, ZCK_ERR_LIMIT, "length %llu over the string limit %zu", (unsigned long long)*n, v->lim.max_string);
  return need(v, (size_t)*n);
}

// ---- memo

/* The memo index limit: max_memo, or the op's byte offset when that is larger. Picklers
 * (CPython's, torch.save's, ours) number memo entries densely from 0 and every entry costs
 * at least one byte before its PUT, so no real pickle has an index past its offset, however
 * many tensors it holds (a 100k-tensor model file passes 1<<20 entries); a hostile sparse
 * index is refused, and the memo array stays within 4 bytes per pickle byte. */
static size_t memo_limit(const vm *v) { return v->op_pos > v->lim.max_memo ? v->op_pos : v->lim.max_memo; }

static zck_status memo_put(vm *v, uint64_t idx) {
  zck_pk *t;
  ZCK_TRY(top(v, &t));
  size_t limit = memo_limit(v);
  if (idx >= limit)
    return zck__vm_fail(v, ZCK_ERR_LIMIT, "memo index %llu over the memo limit %zu", (unsigned long long)idx, limit);
  if (idx >= v->memo_cap) {
    size_t cap = v->memo_cap ? v->memo_cap : 64;
    while (cap <= idx) cap *= 2;
    if (cap > limit) cap = limit;
    uint32_t *m = zck__realloc(v->memo, cap * sizeof *m);
    if (!m) return zck__vm_oom(v);
    memset(m + v->memo_cap, 0, (cap - v->memo_cap) * sizeof *m);
    v->memo = m;
    v->memo_cap = cap;
  }
  uint32_t slot;
  if (!zck__vm_memo_slot(t, &slot)) return zck__vm_fail(v, ZCK_ERR_LIMIT, "more than %u objects to memoize", MEMO_MAX - 2);
  if (!v->memo[idx]) v->memo_count++;
  v->memo[idx] = slot;
  if (v->win.obj) zck__vm_window_put(v, idx);
  return ZCK_OK;
}

static zck_status memo_get(vm *v, uint64_t idx) {
  if (idx >= v->memo_cap || !v->memo[idx])
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "memo value not found at index %llu", (unsigned long long)idx);
  zck_pk *n;
  if (v->memo[idx] & 1) ZCK_TRY(zck__vm_memo_remake(v, (size_t)idx, &n));
  else n = zck__vm_memo_node(v, v->memo[idx]);
  return push(v, n);
}

static zck_status parse_uint_line(vm *v, uint64_t *out) {
  const char *s;
  size_t n;
  ZCK_TRY(zck__vm_read_line(v, &s, &n));
  uint64_t x = 0;
  if (n == 0 || n > 19) return zck__vm_fail(v, ZCK_ERR_FORMAT, "invalid memo index");
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return zck__vm_fail(v, ZCK_ERR_FORMAT, "invalid memo index");
    x = x * 10 + (uint64_t)(s[i] - '0');
  }
  *out = x;
  return ZCK_OK;
}

// ---- containers

static zck_pk *copy_seq(vm *v, zck_pk_kind kind, zck_pk **items, size_t n) {
  return zck__pk_new_seq(v->doc, kind, items, n);
}

static zck_status append_items(vm *v, zck_pk *target, zck_pk **items, size_t n, int set) {
  /* an object given no items gains no empty list: the emitter writes none back, and for
   * Python nothing happened */
  if (!n && target->kind == ZCK_PK_OBJECT && !set) return ZCK_OK;
  ZCK_TRY(zck__vm_window_touch(v, target));
  if (target->kind == ZCK_PK_OBJECT && !set) {
    if (!target->u.obj.list_items) VNEW(v, zck_pk_new_list(v->doc), target->u.obj.list_items);
    target = target->u.obj.list_items;
  }
  if (set ? target->kind != ZCK_PK_SET : target->kind != ZCK_PK_LIST)
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "target is a %s, not a %s", zck__pk_kind_name(target), set ? "set" : "list");
  if (set && target->tag == ZCK_PK_TAG_FROZENSET) return zck__vm_fail(v, ZCK_ERR_FORMAT, "target is a frozenset");
  if (!zck__pk_reserve(target, target->u.seq.len + n)) return zck__vm_oom(v);
  if (n) memcpy(target->u.seq.items + target->u.seq.len, items, n * sizeof *items);
  target->u.seq.len += n;
  return ZCK_OK;
}

/* Whether a dict key could be one in Python (P-13): a list, dict or set, or a tuple holding
 * one, is unhashable (Python raises TypeError). *budget bounds the walk: tuples can share
 * items (a DAG of 10^40 paths in a few hundred bytes); more than it reads as unhashable. */
static bool key_hashable(const zck_pk *k, int depth, size_t *budget) {
  if (!*budget || depth > 64) return false;
  --*budget;
  if (k->kind == ZCK_PK_LIST || k->kind == ZCK_PK_DICT || (k->kind == ZCK_PK_SET && k->tag != ZCK_PK_TAG_FROZENSET))
    return false;
  if (k->kind == ZCK_PK_TUPLE || k->kind == ZCK_PK_SET)
    for (size_t i = 0; i < k->u.seq.len; i++)
      if (!key_hashable(k->u.seq.items[i], depth + 1, budget)) return false;
  return true;
}

static zck_status set_items(vm *v, zck_pk *target, zck_pk **kv, size_t n) {
  if (n % 2) return zck__vm_fail(v, ZCK_ERR_FORMAT, "odd number of items (%zu) for key/value pairs", n);
  if (!n && target->kind == ZCK_PK_OBJECT) return ZCK_OK;   /* no empty dict for it either */
  ZCK_TRY(zck__vm_window_touch(v, target));
  for (size_t i = 0; i < n; i += 2) {
    size_t budget = 4096;
    if (!key_hashable(kv[i], 0, &budget))
      return zck__vm_fail(v, ZCK_ERR_FORMAT, "a %s used as a dict key (unhashable in Python)", zck__pk_kind_name(kv[i]));
  }
  if (target->kind == ZCK_PK_OBJECT) {
    if (!target->u.obj.dict_items) VNEW(v, zck_pk_new_dict(v->doc, 0), target->u.obj.dict_items);
    target = target->u.obj.dict_items;
  }
  if (target->kind != ZCK_PK_DICT) return zck__vm_fail(v, ZCK_ERR_FORMAT, "target is a %s, not a dict", zck__pk_kind_name(target));
  if (!zck__pk_reserve(target, target->u.dict.len + n / 2)) return zck__vm_oom(v);
  for (size_t i = 0; i < n; i += 2) {
    target->u.dict.keys[target->u.dict.len] = kv[i];
    target->u.dict.values[target->u.dict.len++] = kv[i + 1];
  }
  return ZCK_OK;
}

// ---- REDUCE / NEWOBJ

static int is_g(const zck_pk *g, const char *module, const char *name) {
  return !strcmp(g->u.global.module, module) && !strcmp(g->u.global.name, name);
}

/* bytes from a str whose code points are all < 256 (how _codecs.encode(s, 'latin1')
 * spells bytes at protocol 2); NULL (no error) if some code point is larger. */
static zck_pk *latin1_bytes(vm *v, const zck_pk *s, int *oom) {
  const uint8_t *p = (const uint8_t *)s->u.str.data;
  size_t n = s->u.str.len, o = 0;
  uint8_t *d = zck__malloc(n + 1);
  if (!d) { *oom = 1; return NULL; }
  for (size_t i = 0; i < n;) {
    if (p[i] < 0x80) d[o++] = p[i++];
    else if ((p[i] & 0xE0) == 0xC0 && i + 1 < n && p[i] <= 0xC3) {
      d[o++] = (uint8_t)((p[i] & 0x1F) << 6 | (p[i + 1] & 0x3F));
      i += 2;
    } else { free(d); return NULL; }
  }
  zck_pk *b = zck__pk_new_blob(v->doc, ZCK_PK_BYTES, d, o);
  free(d);
  if (!b) *oom = 1;
  return b;
}

/* Folds the callables every consumer wants as native nodes (see pickle.h); *out = NULL
 * when the call is not one of them. */
static zck_status fold(vm *v, const zck_pk *g, zck_pk *args, zck_pk **out) {
  size_t n = args->u.seq.len;
  zck_pk **a = args->u.seq.items;
  *out = NULL;
  if (is_g(g, "collections", "OrderedDict") && n == 0) {
    VNEW(v, zck_pk_new_dict(v->doc, 1), *out);
  } else if ((is_g(g, "builtins", "set") || is_g(g, "builtins", "frozenset")) &&
             (n == 0 || (n == 1 && (a[0]->kind == ZCK_PK_LIST || a[0]->kind == ZCK_PK_TUPLE || a[0]->kind == ZCK_PK_SET)))) {
    VNEW(v, copy_seq(v, ZCK_PK_SET, n ? a[0]->u.seq.items : NULL, n ? a[0]->u.seq.len : 0), *out);
    if (g->u.global.name[0] == 'f') (*out)->tag = ZCK_PK_TAG_FROZENSET;
  } else if (is_g(g, "torch", "Size") && n == 1 && a[0]->kind == ZCK_PK_TUPLE) {
    VNEW(v, copy_seq(v, ZCK_PK_TUPLE, a[0]->u.seq.items, a[0]->u.seq.len), *out);
    (*out)->tag = ZCK_PK_TAG_TORCH_SIZE;
  } else if (is_g(g, "_codecs", "encode") && n == 2 && a[0]->kind == ZCK_PK_STR && a[1]->kind == ZCK_PK_STR &&
             (!strcmp(a[1]->u.str.data, "latin1") || !strcmp(a[1]->u.str.data, "latin-1"))) {
    int oom = 0;
    *out = latin1_bytes(v, a[0], &oom);
    if (oom) return zck__vm_alloc_fail(v);
  } else if (is_g(g, "builtins", "bytes") && n == 0) {
    VNEW(v, zck__pk_new_blob(v->doc, ZCK_PK_BYTES, "", 0), *out);
  } else if (is_g(g, "builtins", "bytearray") && (n == 0 || (n == 1 && a[0]->kind == ZCK_PK_BYTES))) {
    VNEW(v, zck__pk_new_blob(v->doc, ZCK_PK_BYTES, n ? a[0]->u.str.data : "", n ? a[0]->u.str.len : 0), *out);
    (*out)->tag = ZCK_PK_TAG_BYTEARRAY;
  }
  return ZCK_OK;
}

static zck_status op_reduce(vm *v, int newobj) {
  zck_pk *args, *callable, *kwargs = NULL, *node;
  if (v->op == ZPK_NEWOBJ_EX) ZCK_TRY(pop(v, &kwargs));
  ZCK_TRY(pop(v, &args));
  ZCK_TRY(pop(v, &callable));
  if (callable->kind != ZCK_PK_GLOBAL)
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "callable is a %s, not a global", zck__pk_kind_name(callable));
  if (args->kind != ZCK_PK_TUPLE) return zck__vm_fail(v, ZCK_ERR_FORMAT, "arguments are a %s, not a tuple", zck__pk_kind_name(args));
  if (kwargs && (kwargs->kind != ZCK_PK_DICT || kwargs->u.dict.len))
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "keyword arguments are not supported");
  node = NULL;
  if (!newobj) ZCK_TRY(fold(v, callable, args, &node));
  if (!node) VNEW(v, zck_pk_new_object(v->doc, callable, args, newobj, NULL), node);
  ZCK_TRY(push(v, node));
  if (newobj && v->sink && !v->win.obj) {
    int cls = v->sink->classify(v->sink->ctx, callable->u.global.module, callable->u.global.name);
    if (cls >= 0) zck__vm_window_open(v, node, cls);
  }
  return ZCK_OK;
}

static zck_status op_build(vm *v) {
  zck_pk *state, *target;
  ZCK_TRY(pop(v, &state));
  ZCK_TRY(top(v, &target));
  if (target == v->win.obj) return zck__vm_window_close(v, state);
  ZCK_TRY(zck__vm_window_touch(v, target));
  if (target->kind == ZCK_PK_OBJECT) target->u.obj.state = state;
  else if (target->kind == ZCK_PK_DICT) target->u.dict.attrs = state;
  else return zck__vm_fail(v, ZCK_ERR_FORMAT, "cannot set the state of a %s", zck__pk_kind_name(target));
  return ZCK_OK;
}

static zck_status make_global(vm *v, const char *mod, size_t mn, const char *name, size_t nn) {
  if (!mn || !nn) return zck__vm_fail(v, ZCK_ERR_FORMAT, "empty module or name");
  if (mn > ZCK__PK_MAX_NAME || nn > ZCK__PK_MAX_NAME) return zck__vm_fail(v, ZCK_ERR_FORMAT, "module or name longer than %d bytes", ZCK__PK_MAX_NAME);
  if (memchr(mod, 0, mn) || memchr(name, 0, nn) || !zck__pk_utf8_valid((const uint8_t *)mod, mn) ||
      !zck__pk_utf8_valid((const uint8_t *)name, nn))
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "module or name is not valid UTF-8 text");
  char m[ZCK__PK_MAX_NAME + 1], nm[ZCK__PK_MAX_NAME + 1];
  memcpy(m, mod, mn), m[mn] = 0;
  memcpy(nm, name, nn), nm[nn] = 0;
  zck_pk *g;
  VNEW(v, zck_pk_new_global(v->doc, m, nm), g);
  return push(v, g);
}

// ---- depth check

static int child_at(const zck_pk *n, size_t i, zck_pk **c) {
  switch (n->kind) {
  case ZCK_PK_TUPLE: case ZCK_PK_LIST: case ZCK_PK_SET:
    if (i >= n->u.seq.len) return 0;
    *c = n->u.seq.items[i];
    return 1;
  case ZCK_PK_DICT:
    if (i < 2 * n->u.dict.len) { *c = (i % 2 ? n->u.dict.values : n->u.dict.keys)[i / 2]; return 1; }
    if (i == 2 * n->u.dict.len) { *c = n->u.dict.attrs; return 1; }
    return 0;
  case ZCK_PK_OBJECT:
    switch (i) {
    case 0: *c = n->u.obj.callable; return 1;
    case 1: *c = n->u.obj.args; return 1;
    case 2: *c = n->u.obj.state; return 1;
    case 3: *c = n->u.obj.list_items; return 1;
    case 4: *c = n->u.obj.dict_items; return 1;
    default: return 0;
    }
  case ZCK_PK_PERSID:
    if (i) return 0;
    *c = n->u.persid.pid;
    return 1;
  default: return 0;
  }
}

/* Longest acyclic path from the root, iteratively (hostile nesting must not recurse).
 * mark[id]: 0 unvisited, 1 on the DFS stack, h + 2 done with height h. */
static zck_status check_depth(vm *v, zck_pk *root) {
  typedef struct { zck_pk *n; size_t next; uint32_t h; } frame;
  size_t cap = 64, sp = 0;
  frame *st = zck__malloc(cap * sizeof *st);
  uint32_t *mark = zck__calloc(v->doc->count + 1, sizeof *mark);
  if (!st || !mark) {
    free(st);
    free(mark);
    return zck__vm_oom(v);
  }
  zck_status s = ZCK_OK;
  st[sp++] = (frame){root, 0, 0};
  mark[((zck__pkn *)root)->id] = 1;
  while (sp) {
    frame *f = &st[sp - 1];
    zck_pk *c = NULL;
    if (child_at(f->n, f->next++, &c)) {
      if (!c) continue;
      uint32_t *cm = &mark[((zck__pkn *)c)->id];
      if (*cm >= 2) { if (*cm - 2 > f->h) f->h = *cm - 2; continue; }
      if (*cm == 1) continue;   /* a cycle: allowed, consumers bound their walks */
      if (sp >= v->lim.max_depth) {
        s = zck__fail(ZCK_ERR_LIMIT, "%s: objects nested deeper than the limit %zu", v->name, v->lim.max_depth);
        break;
      }
      if (sp == cap) {
        frame *ns = zck__realloc(st, cap * 2 * sizeof *st);
        if (!ns) { s = zck__vm_oom(v); break; }
        st = ns;
        cap *= 2;
      }
      *cm = 1;
      st[sp++] = (frame){c, 0, 0};
      continue;
    }
    uint32_t height = f->h + 1;
    mark[((zck__pkn *)f->n)->id] = height + 2;
    sp--;
    if (sp && height > st[sp - 1].h) st[sp - 1].h = height;
  }
  free(st);
  free(mark);
  return s;
}

// ---- the loop

#define PASSED_STEP ((size_t)1 << 20)

static zck_status run(vm *v, zck_pk **root) {
  while (v->pos < v->len) {
    if (v->sink && v->sink->passed && v->pos - v->passed >= PASSED_STEP) {
      v->passed = v->pos;
      v->sink->passed(v->sink->ctx, v->pos);
    }
    v->op_pos = v->pos;
    v->op = v->p[v->pos++];
    v->doc->ops_seen[v->op >> 3] |= (uint8_t)(1u << (v->op & 7));
    zck_pk *n = NULL, *a = NULL, *b = NULL, **items = NULL;
    size_t cnt = 0;
    uint64_t len;
    const char *s;
    switch (v->op) {
    case ZPK_PROTO:
      ZCK_TRY(need(v, 1));
      v->doc->protocol = v->p[v->pos++];
      if (v->doc->protocol > 5) return zck__vm_fail(v, ZCK_ERR_FORMAT, "unsupported pickle protocol %d", v->doc->protocol);
      break;
    case ZPK_FRAME:   /* frames only group bytes for buffered readers */
      ZCK_TRY(need(v, 8));
      v->pos += 8;
      break;
    case ZPK_STOP:
      if (v->nmarks) return zck__vm_fail(v, ZCK_ERR_FORMAT, "MARK still open at STOP");
      if (v->sp != 1) return zck__vm_fail(v, ZCK_ERR_FORMAT, "%zu objects on the stack at STOP (expected 1)", v->sp);
      *root = v->stack[0];
      return ZCK_OK;
    case ZPK_MARK:
      if (v->nmarks >= v->lim.max_depth) return zck__vm_fail(v, ZCK_ERR_LIMIT, "more than %zu nested MARKs", v->lim.max_depth);
      if (!ZCK__GROW(v->marks, v->mcap, v->nmarks + 1)) return zck__vm_oom(v);
      v->marks[v->nmarks++] = v->sp;
      break;
    case ZPK_POP:
      if (v->sp > boundary(v)) {
        v->sp--;
        zck__vm_window_sp(v);
      } else if (v->nmarks) v->nmarks--;   /* as Python: POP of an empty MARK frame drops the MARK */
      else return underflow(v);
      break;
    case ZPK_POP_MARK: ZCK_TRY(pop_mark(v, &items, &cnt)); break;
    case ZPK_DUP: ZCK_TRY(top(v, &n)); ZCK_TRY(push(v, n)); break;
    case ZPK_NONE: VNEW(v, zck_pk_new_none(v->doc), n); ZCK_TRY(push(v, n)); break;
    case ZPK_NEWTRUE: case ZPK_NEWFALSE:
      VNEW(v, zck_pk_new_bool(v->doc, v->op == ZPK_NEWTRUE), n);
      ZCK_TRY(push(v, n));
      break;
    case ZPK_BININT1: case ZPK_BININT2: case ZPK_BININT: {
      size_t w = v->op == ZPK_BININT1 ? 1 : v->op == ZPK_BININT2 ? 2 : 4;
      ZCK_TRY(need(v, w));
      const uint8_t *q = v->p + v->pos;
      int64_t x = w == 1 ? q[0] : w == 2 ? zck__le16(q) : (int64_t)(int32_t)zck__le32(q);
      v->pos += w;
      VNEW(v, zck_pk_new_int(v->doc, x), n);
      ZCK_TRY(push(v, n));
      break;
    }
    case ZPK_LONG1: case ZPK_LONG4:
      if (v->op == ZPK_LONG4) {
        ZCK_TRY(need(v, 4));
        int32_t sl = (int32_t)zck__le32(v->p + v->pos);
        if (sl < 0) return zck__vm_fail(v, ZCK_ERR_FORMAT, "negative byte count");
      }
      ZCK_TRY(read_len(v, v->op == ZPK_LONG1 ? 1 : 4, &len));
      ZCK_TRY(zck__vm_int_le(v, v->p + v->pos, (size_t)len, &n));
      v->pos += (size_t)len;
      ZCK_TRY(push(v, n));
      break;
    case ZPK_INT: case ZPK_LONG:
      ZCK_TRY(zck__vm_read_line(v, &s, &cnt));
      if (v->op == ZPK_INT && cnt == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1')) {
        VNEW(v, zck_pk_new_bool(v->doc, s[1] == '1'), n);
      } else {
        if (v->op == ZPK_LONG && cnt && s[cnt - 1] == 'L') cnt--;
        ZCK_TRY(zck__vm_int_dec(v, s, cnt, &n));
      }
      ZCK_TRY(push(v, n));
      break;
    case ZPK_BINFLOAT: {
      ZCK_TRY(need(v, 8));
      uint64_t u = 0;
      for (int i = 0; i < 8; i++) u = u << 8 | v->p[v->pos + i];
      v->pos += 8;
      double d;
      memcpy(&d, &u, 8);
      VNEW(v, zck_pk_new_float(v->doc, d), n);
      ZCK_TRY(push(v, n));
      break;
    }
    case ZPK_FLOAT: {
      ZCK_TRY(zck__vm_read_line(v, &s, &cnt));
      if (cnt == 0 || cnt > 400) return zck__vm_fail(v, ZCK_ERR_FORMAT, "invalid float literal");
      char tmp[401], *end;
      memcpy(tmp, s, cnt);
      tmp[cnt] = 0;
      double d = strtod(tmp, &end);
      if (end != tmp + cnt) return zck__vm_fail(v, ZCK_ERR_FORMAT, "invalid float literal");
      VNEW(v, zck_pk_new_float(v->doc, d), n);
      ZCK_TRY(push(v, n));
      break;
    }
    case ZPK_BINUNICODE: case ZPK_SHORT_BINUNICODE: case ZPK_BINUNICODE8:
      ZCK_TRY(read_len(v, v->op == ZPK_SHORT_BINUNICODE ? 1 : v->op == ZPK_BINUNICODE ? 4 : 8, &len));
      if (!zck__pk_utf8_valid(v->p + v->pos, (size_t)len)) return zck__vm_fail(v, ZCK_ERR_FORMAT, "string is not valid UTF-8");
      VNEW(v, zck__pk_new_blob(v->doc, ZCK_PK_STR, v->p + v->pos, (size_t)len), n);
      v->pos += (size_t)len;
      ZCK_TRY(push(v, n));
      break;
    case ZPK_BINBYTES: case ZPK_SHORT_BINBYTES: case ZPK_BINBYTES8: case ZPK_BYTEARRAY8:
      ZCK_TRY(read_len(v, v->op == ZPK_SHORT_BINBYTES ? 1 : v->op == ZPK_BINBYTES ? 4 : 8, &len));
      VNEW(v, zck__pk_new_blob(v->doc, ZCK_PK_BYTES, v->p + v->pos, (size_t)len), n);
      if (v->op == ZPK_BYTEARRAY8) n->tag = ZCK_PK_TAG_BYTEARRAY;
      v->pos += (size_t)len;
      ZCK_TRY(push(v, n));
      break;
    case ZPK_BINSTRING: case ZPK_SHORT_BINSTRING:
      if (v->op == ZPK_BINSTRING) {
        ZCK_TRY(need(v, 4));
        if ((int32_t)zck__le32(v->p + v->pos) < 0) return zck__vm_fail(v, ZCK_ERR_FORMAT, "negative byte count");
      }
      ZCK_TRY(read_len(v, v->op == ZPK_SHORT_BINSTRING ? 1 : 4, &len));
      ZCK_TRY(zck__vm_py2_str(v, v->p + v->pos, (size_t)len, &n));
      v->pos += (size_t)len;
      ZCK_TRY(push(v, n));
      break;
    case ZPK_STRING: ZCK_TRY(zck__vm_op_string(v, &n)); ZCK_TRY(push(v, n)); break;
    case ZPK_UNICODE: ZCK_TRY(zck__vm_op_unicode(v, &n)); ZCK_TRY(push(v, n)); break;
    case ZPK_EMPTY_TUPLE:
      if (!v->empty_tuple) VNEW(v, zck_pk_new_tuple(v->doc, 0), v->empty_tuple);
      ZCK_TRY(push(v, v->empty_tuple));
      break;
    case ZPK_EMPTY_LIST: VNEW(v, zck_pk_new_list(v->doc), n); ZCK_TRY(push(v, n)); break;
    case ZPK_EMPTY_DICT: VNEW(v, zck_pk_new_dict(v->doc, 0), n); ZCK_TRY(push(v, n)); break;
    case ZPK_EMPTY_SET: VNEW(v, zck__pk_alloc(v->doc, ZCK_PK_SET), n); ZCK_TRY(push(v, n)); break;
    case ZPK_TUPLE1: case ZPK_TUPLE2: case ZPK_TUPLE3:
      cnt = (size_t)(v->op - ZPK_TUPLE1 + 1);
      if (v->sp < boundary(v) + cnt) return underflow(v);
      v->sp -= cnt;
      zck__vm_window_sp(v);
      VNEW(v, copy_seq(v, ZCK_PK_TUPLE, v->stack + v->sp, cnt), n);
      ZCK_TRY(push(v, n));
      break;
    case ZPK_TUPLE: case ZPK_LIST: case ZPK_FROZENSET:
      ZCK_TRY(pop_mark(v, &items, &cnt));
      VNEW(v, copy_seq(v, v->op == ZPK_TUPLE ? ZCK_PK_TUPLE : v->op == ZPK_LIST ? ZCK_PK_LIST : ZCK_PK_SET, items, cnt), n);
      if (v->op == ZPK_FROZENSET) n->tag = ZCK_PK_TAG_FROZENSET;
      ZCK_TRY(push(v, n));
      break;
    case ZPK_DICT:
      ZCK_TRY(pop_mark(v, &items, &cnt));
      VNEW(v, zck_pk_new_dict(v->doc, 0), n);
      ZCK_TRY(set_items(v, n, items, cnt));
      ZCK_TRY(push(v, n));
      break;
    case ZPK_APPEND:
      ZCK_TRY(pop(v, &a));
      ZCK_TRY(top(v, &n));
      ZCK_TRY(append_items(v, n, &a, 1, 0));
      break;
    case ZPK_APPENDS: case ZPK_ADDITEMS:
      ZCK_TRY(pop_mark(v, &items, &cnt));
      ZCK_TRY(top(v, &n));
      ZCK_TRY(append_items(v, n, items, cnt, v->op == ZPK_ADDITEMS));
      break;
    case ZPK_SETITEM: {
      zck_pk *kv[2];
      ZCK_TRY(pop(v, &b));
      ZCK_TRY(pop(v, &a));
      ZCK_TRY(top(v, &n));
      kv[0] = a, kv[1] = b;
      ZCK_TRY(set_items(v, n, kv, 2));
      break;
    }
    case ZPK_SETITEMS:
      ZCK_TRY(pop_mark(v, &items, &cnt));
      ZCK_TRY(top(v, &n));
      ZCK_TRY(set_items(v, n, items, cnt));
      break;
    case ZPK_PUT: ZCK_TRY(parse_uint_line(v, &len)); ZCK_TRY(memo_put(v, len)); break;
    case ZPK_BINPUT: ZCK_TRY(need(v, 1)); ZCK_TRY(memo_put(v, v->p[v->pos++])); break;
    case ZPK_LONG_BINPUT: ZCK_TRY(need(v, 4)); len = zck__le32(v->p + v->pos); v->pos += 4; ZCK_TRY(memo_put(v, len)); break;
    case ZPK_MEMOIZE: ZCK_TRY(memo_put(v, v->memo_count)); break;
    case ZPK_GET: ZCK_TRY(parse_uint_line(v, &len)); ZCK_TRY(memo_get(v, len)); break;
    case ZPK_BINGET: ZCK_TRY(need(v, 1)); ZCK_TRY(memo_get(v, v->p[v->pos++])); break;
    case ZPK_LONG_BINGET: ZCK_TRY(need(v, 4)); len = zck__le32(v->p + v->pos); v->pos += 4; ZCK_TRY(memo_get(v, len)); break;
    case ZPK_GLOBAL: {
      const char *m;
      size_t mn;
      ZCK_TRY(zck__vm_read_line(v, &m, &mn));
      ZCK_TRY(zck__vm_read_line(v, &s, &cnt));
      ZCK_TRY(make_global(v, m, mn, s, cnt));
      break;
    }
    case ZPK_STACK_GLOBAL:
      ZCK_TRY(pop(v, &b));
      ZCK_TRY(pop(v, &a));
      if (a->kind != ZCK_PK_STR || b->kind != ZCK_PK_STR) return zck__vm_fail(v, ZCK_ERR_FORMAT, "module and name must be str");
      ZCK_TRY(make_global(v, a->u.str.data, a->u.str.len, b->u.str.data, b->u.str.len));
      break;
    case ZPK_REDUCE: ZCK_TRY(op_reduce(v, 0)); break;
    case ZPK_NEWOBJ: case ZPK_NEWOBJ_EX: ZCK_TRY(op_reduce(v, 1)); break;
    case ZPK_BUILD: ZCK_TRY(op_build(v)); break;
    case ZPK_PERSID:
      ZCK_TRY(zck__vm_read_line(v, &s, &cnt));
      if (!zck__pk_utf8_valid((const uint8_t *)s, cnt)) return zck__vm_fail(v, ZCK_ERR_FORMAT, "persistent id is not text");
      VNEW(v, zck__pk_new_blob(v->doc, ZCK_PK_STR, s, cnt), a);
      VNEW(v, zck_pk_new_persid(v->doc, a), n);
      ZCK_TRY(push(v, n));
      break;
    case ZPK_BINPERSID:
      ZCK_TRY(pop(v, &a));
      VNEW(v, zck_pk_new_persid(v->doc, a), n);
      ZCK_TRY(push(v, n));
      break;
    default:
      if (zck__pk_op_name(v->op)) return zck__vm_fail(v, ZCK_ERR_FORMAT, "opcode not supported");
      return zck__vm_fail(v, ZCK_ERR_FORMAT, "unknown opcode 0x%02x", v->op);
    }
  }
  v->op_pos = v->pos;
  v->op = 0;
  return zck__vm_fail(v, ZCK_ERR_FORMAT, "truncated: no STOP opcode");
}

zck_status zck_pickle_load(const void *data, size_t len, const char *name, const zck_pk_limits *limits,
                           zck_pk_doc **out) {
  return zck_pickle_load_sink(data, len, name, limits, NULL, out);
}

zck_status zck_pickle_load_sink(const void *data, size_t len, const char *name, const zck_pk_limits *limits,
                                const zck_pk_sink *sink, zck_pk_doc **out) {
  static const zck_pk_limits defaults = ZCK_PK_LIMITS_INIT;
  vm v = {0};
  v.sink = sink;
  zck__buf_init(&v.compact);
  if (sink) zck__buf_byte(&v.compact, 0);   /* offset 0 is no compact value */
  *out = NULL;
  v.p = data;
  v.len = len;
  v.name = name ? name : "<pickle>";
  v.lim = limits ? *limits : defaults;
  v.doc = zck_pk_doc_new();
  if (!v.doc) return ZCK_ERR_NO_MEMORY;
  /* max_objects, or half a node per pickle byte when that is more: real pickles hold far
   * fewer (a torch.save of 150k tensors: 0.15 per byte), and their node count grows with the
   * tensor count past any fixed cap; memory stays proportional to the input */
  v.doc->max_objects = !v.lim.max_objects ? SIZE_MAX : v.lim.max_objects > len / 2 ? v.lim.max_objects : len / 2;
  zck_pk *root = NULL;
  zck_status s = run(&v, &root);
  if (s == ZCK_OK) s = check_depth(&v, root);
  free(v.stack);
  free(v.marks);
  free(v.memo);
  zck__vm_window_free(&v);
  if (s != ZCK_OK) {
    zck_pk_doc_free(v.doc);
    return s;
  }
  v.doc->root = root;
  v.doc->max_objects = 0;
  *out = v.doc;
  return ZCK_OK;
}
