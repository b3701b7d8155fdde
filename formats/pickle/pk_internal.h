/* pk_internal.h: what the pickle VM, the emitter and the node arena share: the node
 * wrapper (public zck_pk + bookkeeping), the doc arena, and the opcode bytes. */
#ifndef ZCK_PK_INTERNAL_H
#define ZCK_PK_INTERNAL_H

#include "pickle.h"

/* A node as allocated: the public part first, so a zck_pk * is a zck__pkn *. 64 bytes: a
 * pickle of 100k tensors is millions of nodes. */
typedef struct zck__pkn {
  zck_pk pub;
  uint32_t cap;      /* malloc'd slots of seq.items, or of dict.keys / dict.values; 0 with
                        items: a tuple's len items in the doc's arena (made with the node) */
  uint32_t id;       /* index in its doc (creation order): side tables of a walk (the depth
                        check, the emitter's memo) are indexed by it */
} zck__pkn;

#define ZCK__PK_BLOCK 1024
/* Ints in this range, None and the bools are one node per doc: the emitter writes them by
 * value (never memoized), so sharing changes no byte, and a tensor's shape, stride, offset
 * and flags, or a loaded pickle's small ints, cost no node each. */
#define ZCK__PK_SHARED_MIN (-1)
#define ZCK__PK_SHARED_MAX 1023

/* Bump-allocated bytes of a doc (strings, small item arrays), freed with it. */
typedef struct zck__pk_chunk {
  struct zck__pk_chunk *next;
  size_t used, cap;
  uint64_t data[];
} zck__pk_chunk;

struct zck_pk_doc {
  zck__pkn **blocks;
  size_t nblocks, count;
  zck__pk_chunk *arena;    /* the chunk being filled first, then the older ones */
  zck__pk_chunk *big;      /* requests too big for a chunk, one each */
  zck_pk **shared;         /* None, False, True, ints ZCK__PK_SHARED_MIN.. (made on first use) */
  size_t nshared;          /* slots of shared: a few first, all of them once a bigger int comes */
  size_t shared_top;       /* 1 + the highest id of a shared node (a rollback must keep them) */
  size_t max_objects;      /* 0 = no limit (trees built by hand) */
  bool hit_limit;          /* the last allocation failed on max_objects */
  zck_pk *root;
  int protocol;
  uint8_t ops_seen[32];
};

/* A zeroed node of the kind, or NULL with ZCK_ERR_NO_MEMORY / ZCK_ERR_LIMIT set. */
zck_pk *zck__pk_alloc(zck_pk_doc *d, zck_pk_kind kind);
/* Where a doc's allocations stand: zck__pk_doc_rollback frees every node and arena byte
 * made after it (the nodes of an object a sink consumed, pk_sink.c). Nothing made before
 * it may point at what is freed. */
typedef struct zck__pk_mark {
  size_t count;
  zck__pk_chunk *arena, *big;
  size_t arena_used;
} zck__pk_mark;
zck__pk_mark zck__pk_doc_mark(const zck_pk_doc *d);
void zck__pk_doc_rollback(zck_pk_doc *d, const zck__pk_mark *m);
/* Makes every shared node (None, the bools, the small ints) now, so none is made later
 * inside an object a sink consumes. false on failure (error set). */
bool zck__pk_make_shared(zck_pk_doc *d);
/* n bytes (8-aligned) that live as long as the doc; NULL when out of memory. Only for what
 * is made with a node of d (its string, a tuple's items): a node's later growth could be
 * asked through another doc. */
void *zck__pk_arena(zck_pk_doc *d, size_t n);
/* A TUPLE/LIST/SET node of d holding a copy of items[0..n), in d's arena. */
zck_pk *zck__pk_new_seq(zck_pk_doc *d, zck_pk_kind kind, zck_pk *const *items, size_t n);
/* Grows seq.items (or the dict arrays) to hold at least n entries. false + error on failure. */
bool zck__pk_reserve(zck_pk *node, size_t n);
/* STR/BYTES/BIGINT node owning a copy of p[0..n) plus a NUL. */
zck_pk *zck__pk_new_blob(zck_pk_doc *d, zck_pk_kind kind, const void *p, size_t n);
/* Module spelling as Python 3 reads it (fix_imports): __builtin__ -> builtins. */
const char *zck__pk_module_py3(const char *module);
/* (module, name) as Python 3's unpickler maps Python 2 names (__builtin__ long -> builtins
 * int), and back as the protocol-2 pickler writes them. Pointers to static strings or
 * to the inputs. */
void zck__pk_global_py3(const char **module, const char **name);
void zck__pk_global_py2(const char **module, const char **name);
/* 1 if s[0..n) is UTF-8 as CPython's "surrogatepass" decoder accepts it. */
int zck__pk_utf8_valid(const uint8_t *s, size_t n);

/* ---- opcodes (cpython Lib/pickle.py) */
enum {
  ZPK_MARK = '(', ZPK_STOP = '.', ZPK_POP = '0', ZPK_POP_MARK = '1', ZPK_DUP = '2',
  ZPK_FLOAT = 'F', ZPK_INT = 'I', ZPK_BININT = 'J', ZPK_BININT1 = 'K', ZPK_LONG = 'L',
  ZPK_BININT2 = 'M', ZPK_NONE = 'N', ZPK_PERSID = 'P', ZPK_BINPERSID = 'Q', ZPK_REDUCE = 'R',
  ZPK_STRING = 'S', ZPK_BINSTRING = 'T', ZPK_SHORT_BINSTRING = 'U', ZPK_UNICODE = 'V',
  ZPK_BINUNICODE = 'X', ZPK_APPEND = 'a', ZPK_BUILD = 'b', ZPK_GLOBAL = 'c', ZPK_DICT = 'd',
  ZPK_EMPTY_DICT = '}', ZPK_APPENDS = 'e', ZPK_GET = 'g', ZPK_BINGET = 'h', ZPK_INST = 'i',
  ZPK_LONG_BINGET = 'j', ZPK_LIST = 'l', ZPK_EMPTY_LIST = ']', ZPK_OBJ = 'o', ZPK_PUT = 'p',
  ZPK_BINPUT = 'q', ZPK_LONG_BINPUT = 'r', ZPK_SETITEM = 's', ZPK_TUPLE = 't',
  ZPK_EMPTY_TUPLE = ')', ZPK_SETITEMS = 'u', ZPK_BINFLOAT = 'G',
  ZPK_PROTO = 0x80, ZPK_NEWOBJ = 0x81, ZPK_EXT1 = 0x82, ZPK_EXT2 = 0x83, ZPK_EXT4 = 0x84,
  ZPK_TUPLE1 = 0x85, ZPK_TUPLE2 = 0x86, ZPK_TUPLE3 = 0x87, ZPK_NEWTRUE = 0x88, ZPK_NEWFALSE = 0x89,
  ZPK_LONG1 = 0x8a, ZPK_LONG4 = 0x8b,
  ZPK_BINBYTES = 'B', ZPK_SHORT_BINBYTES = 'C',
  ZPK_SHORT_BINUNICODE = 0x8c, ZPK_BINUNICODE8 = 0x8d, ZPK_BINBYTES8 = 0x8e, ZPK_EMPTY_SET = 0x8f,
  ZPK_ADDITEMS = 0x90, ZPK_FROZENSET = 0x91, ZPK_NEWOBJ_EX = 0x92, ZPK_STACK_GLOBAL = 0x93,
  ZPK_MEMOIZE = 0x94, ZPK_FRAME = 0x95,
  ZPK_BYTEARRAY8 = 0x96, ZPK_NEXT_BUFFER = 0x97, ZPK_READONLY_BUFFER = 0x98,
};

#endif
