/* pk_vm.h: the pickle VM's state and the helpers its files share (pk_load.c runs the
 * opcodes, pk_text.c decodes the literal arguments of the text and int opcodes). */
#ifndef ZCK_PK_VM_H
#define ZCK_PK_VM_H

#include "pk_internal.h"

/* An object being read for a sink (pk_sink.c): from its NEWOBJ to its BUILD. */
typedef struct pk_window {
  zck_pk *obj;                     /* NULL: none open */
  int cls;                         /* the sink's class id */
  bool escaped;                    /* something made since may be reached from before */
  bool oom;                        /* its bookkeeping ran out of memory */
  bool ready;                      /* the doc-wide nodes are made (before the first window) */
  zck__pk_mark mark;               /* the doc just after obj was made */
  size_t sp, nmarks;               /* the stack with obj on top, and the marks, then */
  size_t *puts, nputs, cap_puts;   /* memo indices set since */
  struct pk_remade { size_t id; uint64_t off; } *remade;   /* nodes remade from compact values */
  size_t nremade, cap_remade;
  uint64_t *enc;                   /* per node of the window: its compact value, once made */
  size_t cap_enc;
} pk_window;

/* A memo slot, 4 bytes (a pickle memoizes nearly every object: 20 slots a DCP chunk): 0
 * empty; MEMO_GONE, part of a consumed object; (id + 1) << 1, the node of that id in the
 * doc; (off << 1) | 1, a value kept compact at byte off of vm.compact. */
#define MEMO_GONE ((uint32_t)1)
#define MEMO_MAX ((uint32_t)1 << 31)   /* ids and compact offsets stay below it */

typedef struct vm {
  const uint8_t *p;
  size_t len, pos, op_pos;
  uint8_t op;
  const char *name;
  zck_pk_limits lim;
  zck_pk_doc *doc;
  zck_pk **stack;
  size_t sp, scap;
  size_t *marks;
  size_t nmarks, mcap;
  uint32_t *memo;
  size_t memo_cap, memo_count;
  const zck_pk_sink *sink;         /* NULL: a plain load */
  pk_window win;
  zck__buf compact;                /* memoized values of consumed objects (byte 0 unused) */
  size_t passed;                   /* where the sink was last told the stream had got to */
  zck_pk *empty_tuple;   /* every EMPTY_TUPLE of the stream: () is immutable, and NEWOBJ's
                            (cls, ()) makes one per object (80k in a DCP metadata of 20k chunks) */
} vm;

/* "NAME: byte OFFSET: OPCODE: what" with status s. */
zck_status zck__vm_fail(vm *v, zck_status s, const char *fmt, ...) ZCK__PRINTF(3, 4);
/* After a failed allocation (out of memory). */
zck_status zck__vm_oom(vm *v);
/* After a failed node allocation: the object limit, or out of memory. */
zck_status zck__vm_alloc_fail(vm *v);
#define VNEW(v, expr, out) do { if (!((out) = (expr))) return zck__vm_alloc_fail(v); } while (0)
/* The argument line of a text opcode (without its newline). */
zck_status zck__vm_read_line(vm *v, const char **s, size_t *n);

static inline zck_pk *zck__vm_memo_node(const vm *v, uint32_t m) {
  size_t id = (m >> 1) - 1;
  return &v->doc->blocks[id / ZCK__PK_BLOCK][id % ZCK__PK_BLOCK].pub;
}
/* The slot value of node n; false when its id is past what a slot holds. */
static inline bool zck__vm_memo_slot(const zck_pk *n, uint32_t *m) {
  size_t id = ((const zck__pkn *)n)->id;
  if (id + 1 >= MEMO_MAX) return false;
  *m = (uint32_t)((id + 1) << 1);
  return true;
}

/* Objects read for a sink (pk_sink.c). */
void zck__vm_window_open(vm *v, zck_pk *obj, int cls);
/* target is changed: if it was made before the open object, what it gains escapes; an
 * object a sink consumed may not change at all. */
static inline zck_status zck__vm_window_touch(vm *v, const zck_pk *target) {
  if (target->kind == ZCK_PK_OBJECT && (target->tag == ZCK_PK_TAG_CONSUMED || target->tag == ZCK_PK_TAG_SEALED))
    return zck__vm_fail(v, ZCK_ERR_FORMAT, "an object already read is changed (refused)");
  if (v->win.obj && ((const zck__pkn *)target)->id < v->win.mark.count) v->win.escaped = true;
  return ZCK_OK;
}
/* The stack was cut: below the open object, what it held may now be gone or replaced. */
static inline void zck__vm_window_sp(vm *v) {
  if (v->win.obj && v->sp < v->win.sp) v->win.escaped = true;
}
void zck__vm_window_put(vm *v, size_t idx);
/* The BUILD of the open object (popped state): consume it and free what was made for it,
 * or refuse it when something made for it escaped. */
zck_status zck__vm_window_close(vm *v, zck_pk *state);
/* The node of memo slot idx, which holds a compact value or MEMO_GONE. */
zck_status zck__vm_memo_remake(vm *v, size_t idx, zck_pk **out);
void zck__vm_window_free(vm *v);

/* Literal decoding (pk_text.c). */
zck_status zck__vm_int_le(vm *v, const uint8_t *b, size_t n, zck_pk **out);
zck_status zck__vm_int_dec(vm *v, const char *s, size_t n, zck_pk **out);
zck_status zck__vm_py2_str(vm *v, const uint8_t *s, size_t n, zck_pk **out);
zck_status zck__vm_op_string(vm *v, zck_pk **out);
zck_status zck__vm_op_unicode(vm *v, zck_pk **out);

/* Names for messages (pk_names.c). NULL for bytes that are no opcode. */
const char *zck__pk_op_name(uint8_t op);
const char *zck__pk_kind_name(const zck_pk *n);

#endif
