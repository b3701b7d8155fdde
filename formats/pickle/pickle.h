/* pickle.h: a small pickle VM (reader) and emitter (writer) for protocol-2 streams as
 * torch.save and DeepSpeed write them.
 *
 * The reader never executes anything: GLOBAL only names a (module, name) pair, and
 * REDUCE / NEWOBJ / BUILD build inert ZCK_PK_OBJECT nodes that the caller interprets
 * (torch/ knows _rebuild_tensor_v2, DeepSpeed's classes, ...). A few well-known callables
 * are folded into native nodes while loading, because every consumer wants them so:
 *   collections.OrderedDict()          -> ZCK_PK_DICT (ordered = 1; BUILD state kept in attrs)
 *   builtins.set / __builtin__.set(l)  -> ZCK_PK_SET
 *   torch.Size(tuple)                  -> ZCK_PK_TUPLE (tag = ZCK_PK_TAG_TORCH_SIZE)
 *   _codecs.encode(str, 'latin1')      -> ZCK_PK_BYTES (how protocol 2 spells bytes)
 * Persistent ids (BINPERSID) become ZCK_PK_PERSID nodes holding the pid object.
 * Limits (depth, memo entries, object count, string size) make hostile input an error.
 * Nodes live in an arena freed at once with zck_pk_doc_free.
 */
#ifndef ZCK_PICKLE_H
#define ZCK_PICKLE_H

#include "strmap.h"
#include "util.h"

typedef enum zck_pk_kind {
  ZCK_PK_NONE, ZCK_PK_BOOL, ZCK_PK_INT, ZCK_PK_BIGINT, ZCK_PK_FLOAT,
  ZCK_PK_STR, ZCK_PK_BYTES,
  ZCK_PK_TUPLE, ZCK_PK_LIST, ZCK_PK_DICT, ZCK_PK_SET,
  ZCK_PK_GLOBAL,   /* module.name, unapplied */
  ZCK_PK_OBJECT,   /* callable(*args) via REDUCE or cls.__new__(cls, *args) via NEWOBJ, + BUILD state */
  ZCK_PK_PERSID,   /* persistent id */
} zck_pk_kind;

/* Tags refine a kind: TORCH_SIZE on a TUPLE (torch.Size(...)); FROZENSET on a SET
 * (frozenset(...) / FROZENSET); BYTEARRAY on BYTES (bytearray(...) / BYTEARRAY8). */
enum { ZCK_PK_TAG_NONE = 0, ZCK_PK_TAG_TORCH_SIZE = 1, ZCK_PK_TAG_FROZENSET = 2, ZCK_PK_TAG_BYTEARRAY = 3,
       ZCK_PK_TAG_CONSUMED = 4,  /* on an OBJECT: handed to a sink (zck_pickle_load_sink) */
       ZCK_PK_TAG_SEALED = 5     /* on an OBJECT: remade from the memo after a sink's object
                                    (an enum member, a torch.layout): may not change */ };

typedef struct zck_pk zck_pk;
struct zck_pk {
  zck_pk_kind kind;
  int tag;                          /* ZCK_PK_TAG_* */
  union {
    int b;                          /* BOOL */
    int64_t i;                      /* INT (fits in int64) */
    double f;                       /* FLOAT */
    struct { char *data; size_t len; } str;   /* STR (utf-8, NUL-terminated), BYTES,
                                                 BIGINT (little-endian two's complement) */
    struct { zck_pk **items; size_t len; } seq; /* TUPLE, LIST, SET */
    struct {
      zck_pk **keys, **values;      /* in insertion order */
      size_t len;
      int ordered;                  /* from collections.OrderedDict */
      zck_pk *attrs;                /* BUILD state (e.g. {'_metadata': ...}), or NULL */
    } dict;
    struct { char *module, *name; } global;
    struct {
      zck_pk *callable;             /* a GLOBAL node */
      zck_pk *args;                 /* a TUPLE node */
      int newobj;                   /* 1 = NEWOBJ, 0 = REDUCE */
      uint32_t sink_handle;         /* tag CONSUMED: what the sink made of it */
      zck_pk *state;                /* BUILD argument or NULL */
      zck_pk *list_items;           /* APPENDS onto the object (a LIST node) or NULL */
      zck_pk *dict_items;           /* SETITEMS onto the object (a DICT node) or NULL */
    } obj;
    struct { zck_pk *pid; } persid;
  } u;
};

typedef struct zck_pk_limits {
  size_t max_depth;       /* nesting of containers; default 256 */
  size_t max_memo;        /* memo index; default 1<<20, or the PUT's byte offset if larger
                             (any densely numbered memo passes: see pk_load.c memo_limit) */
  size_t max_objects;     /* nodes; default 1<<22, or half the pickle's length if larger */
  size_t max_string;      /* bytes in one string; default 1<<28 */
} zck_pk_limits;
#define ZCK_PK_LIMITS_INIT {256, 1u << 20, 1u << 22, 1u << 28}

typedef struct zck_pk_doc zck_pk_doc;   /* the arena + root */

/* Runs the VM over data. name is used in messages ("FILE: data.pkl: byte 123: ..."), limits
 * may be NULL (defaults). Malformed streams are ZCK_ERR_FORMAT "NAME: byte OFFSET: what",
 * a limit is ZCK_ERR_LIMIT. Notes on the tree it builds:
 *  - GLOBAL modules are normalised as Python 3 does with fix_imports: __builtin__ ->
 *    builtins, copy_reg -> copyreg;
 *  - memo GETs share nodes, so the tree is a DAG and, in hostile input, may hold cycles
 *    (a list appended to itself); the longest acyclic path is checked against max_depth;
 *  - dict keys are kept as given, duplicates included (zck_pk_dict_get returns the last);
 *  - LONG1/LONG4/INT/LONG values that fit int64 are INT, others BIGINT;
 *  - STRING/BINSTRING/SHORT_BINSTRING (Python 2 str) become STR when valid UTF-8, else BYTES;
 *  - trailing bytes after STOP are ignored. */
zck_status zck_pickle_load(const void *data, size_t len, const char *name, const zck_pk_limits *limits,
                           zck_pk_doc **out);

/* A consumer of objects while the stream loads, for pickles of many small objects whose
 * trees would dwarf what is kept of them (a DCP .metadata of 100k chunks): an object of a
 * class it names, made by NEWOBJ and given its state by BUILD, is handed to consume at that
 * BUILD, and every node made since its NEWOBJ is freed there. The object stays in the tree
 * as an OBJECT node tagged ZCK_PK_TAG_CONSUMED, with no state and the handle consume gave.
 * Values memoized while it was read that the stream may fetch again (strings, ints, floats,
 * globals, tuples of ints such as a torch.Size, objects REDUCE'd from such values as an
 * enum member is) are kept in a compact form and remade on a GET (an object tagged
 * ZCK_PK_TAG_SEALED); a GET of anything else made for a consumed object is refused (torch never writes
 * one), as is an object whose parts escaped it (put into a container made before it, left
 * on the stack below it) and any later change to a consumed object. Objects of its classes
 * made while another is being read are left as they are. */
typedef struct zck_pk_sink {
  void *ctx;
  /* A class id >= 0 if the sink consumes module.name, else -1. */
  int (*classify)(void *ctx, const char *module, const char *name);
  /* Every node made for a consumed object, before it is freed: what the caller refuses
   * anywhere in the stream (a global outside its allowlist) it must refuse here. */
  zck_status (*check)(void *ctx, const zck_pk *node);
  /* The finished object; below: the node under it on the stack (the key it will be set
   * under, when it is a dict's value), or NULL. Sets *handle. */
  zck_status (*consume)(void *ctx, int cls, const zck_pk *obj, const zck_pk *below, uint32_t *handle);
  /* The stream's bytes before pos are never read again (told every MiB): the caller
   * may give their pages back. May be NULL. */
  void (*passed)(void *ctx, size_t pos);
} zck_pk_sink;
zck_status zck_pickle_load_sink(const void *data, size_t len, const char *name, const zck_pk_limits *limits,
                                const zck_pk_sink *sink, zck_pk_doc **out);
const zck_pk *zck_pk_doc_root(const zck_pk_doc *doc);
void zck_pk_doc_free(zck_pk_doc *doc);
/* Every node of the doc in creation order (for a loaded doc: the order of the stream, so
 * GLOBAL nodes appear in the order the stream names them, folded ones included). */
size_t zck_pk_doc_node_count(const zck_pk_doc *doc);
const zck_pk *zck_pk_doc_node_at(const zck_pk_doc *doc, size_t i);
/* 1 if the loaded stream used opcode byte op (for weights_only-style checks). */
int zck_pk_doc_opcode_seen(const zck_pk_doc *doc, uint8_t op);
/* Protocol from PROTO (0 if none). */
int zck_pk_doc_protocol(const zck_pk_doc *doc);

/* ---- helpers for consumers */
/* Value of a str key in a DICT (NULL if absent or not a dict). */
const zck_pk *zck_pk_dict_get(const zck_pk *dict, const char *key);
/* The same lookups through a hash table, for callers that look up many keys of one large
 * dict (zck_pk_dict_get scans it: a lookup per frozen param of a LoRA model made a job
 * quadratic). The dict must outlive the index; it is not modified. */
typedef struct zck_pk_dict_index {
  const zck_pk *dict;
  zck__strmap map;       /* key -> position of its last entry */
} zck_pk_dict_index;
zck_status zck_pk_dict_index_init(zck_pk_dict_index *x, const zck_pk *dict);   /* dict may be NULL / not a dict */
const zck_pk *zck_pk_dict_index_get(const zck_pk_dict_index *x, const char *key);
void zck_pk_dict_index_free(zck_pk_dict_index *x);
/* 1 if node is a GLOBAL (or OBJECT whose callable is) module.name ("builtins" and
 * "__builtin__" are the same module). */
int zck_pk_is_global(const zck_pk *node, const char *module, const char *name);
/* INT (or BOOL) value into *out; 0 if not an int. */
int zck_pk_as_int(const zck_pk *node, int64_t *out);
/* FLOAT or INT as double; 0 if neither. */
int zck_pk_as_double(const zck_pk *node, double *out);
/* STR value or NULL. */
const char *zck_pk_as_str(const zck_pk *node);
/* Human-readable one-line summary (for inspect): "dict(3)", "LossScaler(...)", "1.5".
 * Bounded in depth and length; cycle-safe. */
void zck_pk_summary(const zck_pk *node, char *buf, size_t n);

/* ---- building trees (for the emitter); nodes belong to the doc. None, the bools and
 * small ints are one shared node per doc (the loader's too): never modify a node's value. */
zck_pk_doc *zck_pk_doc_new(void);
void zck_pk_doc_set_root(zck_pk_doc *doc, zck_pk *root);
zck_pk *zck_pk_new_none(zck_pk_doc *d);
zck_pk *zck_pk_new_bool(zck_pk_doc *d, int b);
zck_pk *zck_pk_new_int(zck_pk_doc *d, int64_t v);
zck_pk *zck_pk_new_float(zck_pk_doc *d, double v);
zck_pk *zck_pk_new_str(zck_pk_doc *d, const char *s);
zck_pk *zck_pk_new_bytes(zck_pk_doc *d, const void *p, size_t n);
zck_pk *zck_pk_new_tuple(zck_pk_doc *d, size_t n);          /* items filled by caller */
zck_pk *zck_pk_new_list(zck_pk_doc *d);
zck_pk *zck_pk_new_dict(zck_pk_doc *d, int ordered);
zck_pk *zck_pk_new_set(zck_pk_doc *d, int frozen);           /* items via zck_pk_append */
zck_pk *zck_pk_new_global(zck_pk_doc *d, const char *module, const char *name);
zck_pk *zck_pk_new_object(zck_pk_doc *d, zck_pk *callable, zck_pk *args, int newobj, zck_pk *state);
zck_pk *zck_pk_new_persid(zck_pk_doc *d, zck_pk *pid);
/* Appends (lists, sets, tuples built incrementally) and inserts (dicts). 0 on OOM. */
int zck_pk_append(zck_pk_doc *d, zck_pk *seq, zck_pk *item);
int zck_pk_dict_set(zck_pk_doc *d, zck_pk *dict, zck_pk *key, zck_pk *value);

/* Makes every "" and every one-character str with a code point below 256 under *root one
 * node per value (pk_singletons.c): CPython holds one object for each, so its pickler memoizes
 * them across a tree that zckpt assembles from several pickles. Nodes are relinked in
 * place (the trees of every doc involved); recursion follows the tree's depth. */
zck_status zck_pk_share_small_strings(zck_pk **root);

/* Emits a protocol-2 stream CPython's unpickler (and torch.load, weights_only when the
 * globals allow) reads back as the same tree. OrderedDict, set, torch.Size, bytes are
 * spelled the way CPython's pickler spells them. Identical node pointers are memoized
 * (written once, then BINGET), so shared objects stay shared; GLOBALs are memoized by
 * name, as CPython memoizes the class object. A tree loaded from a CPython protocol-2
 * stream dumps back to the same bytes. Appends to out. Nesting deeper than 1000 (or a
 * cycle through REDUCE arguments, which CPython cannot pickle either) is ZCK_ERR_LIMIT. */
zck_status zck_pickle_dump(const zck_pk *root, zck__buf *out);

#endif
