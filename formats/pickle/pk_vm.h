/* pk_vm.h: the pickle VM's state and the helpers its files share (pk_load.c runs the
 * opcodes, pk_text.c decodes the literal arguments of the text and int opcodes). */
#ifndef ZCK_PK_VM_H
#define ZCK_PK_VM_H

#include "pk_internal.h"

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
  zck_pk **memo;
  size_t memo_cap, memo_count;
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
