/* st_internal.h: helpers shared by the safetensors reader, writer and HF index code:
 * a strict JSON pull parser (serde_json's grammar and limits), the two JSON string
 * spellings we must reproduce byte for byte, an arena for names
 * and shapes, and one-line message helpers. Not part of the format's interface. */
#ifndef ZCK_ST_INTERNAL_H
#define ZCK_ST_INTERNAL_H

#include "safetensors.h"
#include "strmap.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- arena: stable pointers for names and shapes, freed at once */
typedef struct zck__arena_block zck__arena_block;
typedef struct zck__arena {
  zck__arena_block *head;
} zck__arena;
void *zck__arena_alloc(zck__arena *a, size_t n);           /* 8-aligned; NULL + error on OOM */
char *zck__arena_strndup(zck__arena *a, const char *s, size_t n);
void zck__arena_free(zck__arena *a);

/* ---- a list of owned strings (warnings) */
typedef struct zck__strlist {
  char **items;
  size_t len, cap;
} zck__strlist;
void zck__strlist_addf(zck__strlist *l, const char *fmt, ...) ZCK__PRINTF(2, 3);
void zck__strlist_free(zck__strlist *l);

/* Grows one array, or two kept in step (pb may be NULL), to hold len + 1 elements. */
bool zck__grow2(void *pa, void *pb, size_t *cap, size_t len, size_t elem);

/* ---- string pairs: metadata entries (a header's __metadata__, an index's metadata, what a
 * writer was given) in insertion order, looked up by key through a hash table: a hostile
 * header or index may hold 100k keys, and a scan per key made its parse quadratic. The
 * strings are borrowed (the owner's arena keeps them). */
typedef struct zck__st_pairs {
  const char **keys, **values;
  size_t count, cap;
  zck__strmap map;
} zck__st_pairs;
/* Appends key -> value; when the key is there already nothing is added and *dup is set. */
zck_status zck__st_pairs_add(zck__st_pairs *p, const char *key, const char *value, bool *dup);
/* The position of key, or SIZE_MAX. */
size_t zck__st_pairs_find(const zck__st_pairs *p, const char *key);
void zck__st_pairs_clear(zck__st_pairs *p);
void zck__st_pairs_free(zck__st_pairs *p);

/* A printable, bounded rendering of a name for one-line messages: control characters and
 * backslashes escaped, long names shortened with "...". */
#define ZCK__QNAME_MAX 200
const char *zck__qname(const char *name, char buf[ZCK__QNAME_MAX]);

/* Strict UTF-8 (Rust's str::from_utf8): returns the offset of the first invalid byte, or n. */
size_t zck__utf8_check(const uint8_t *s, size_t n);

/* ---- strict JSON pull parser (the grammar serde_json accepts, recursion limit 128) */
#define ZCK__JSON_MAX_DEPTH 128
typedef struct zck__jp {
  const char *file;       /* for messages */
  const char *what;       /* "header" / "index" */
  const uint8_t *start, *p, *end;
  uint64_t base;          /* file offset of start (messages give file offsets) */
  int depth;
  const char *tensor;     /* value errors start "tensor NAME: " when set (rendered only on error) */
  long elem;              /* value errors say "CTX[elem]" when >= 0 */
  zck__buf str;           /* the last decoded string (NUL-terminated) */
  bool python;            /* also NaN, Infinity and -Infinity, as Python's json module writes them */
} zck__jp;

void zck__jp_init(zck__jp *jp, const char *file, const char *what, const void *data, size_t n, uint64_t base);
void zck__jp_free(zck__jp *jp);
/* Syntax errors: "FILE: invalid WHAT JSON at byte OFF: ..." (ZCK_ERR_FORMAT). */
zck_status zck__jp_fail(zck__jp *jp, const char *fmt, ...) ZCK__PRINTF(2, 3);
/* Well-formed JSON with the wrong content: "FILE: ... (byte OFF[, CHECK])" (ZCK_ERR_FORMAT),
 * OFF being the parser's position (the offending value). */
zck_status zck__jp_fail_value(zck__jp *jp, const char *fmt, ...) ZCK__PRINTF(2, 3);
/* File offset of the parser's position (after whitespace). */
uint64_t zck__jp_offset(zck__jp *jp);
/* Next significant byte without consuming it; -1 at the end. */
int zck__jp_peek(zck__jp *jp);
/* Object iteration: begin consumes '{' ("expected an object" naming `ctx` otherwise); next
 * yields keys (decoded into jp->str) until *done. The value is then read by the caller. */
zck_status zck__jp_object_begin(zck__jp *jp, const char *ctx);
zck_status zck__jp_object_next(zck__jp *jp, bool *first, bool *done);
/* Array iteration, same shape. */
zck_status zck__jp_array_begin(zck__jp *jp, const char *ctx);
zck_status zck__jp_array_next(zck__jp *jp, bool *first, bool *done);
void zck__jp_leave(zck__jp *jp);   /* after *done of an object/array */
/* A string value, decoded into jp->str (a string containing U+0000 is accepted; callers
 * that need C strings check jp->str.len against strlen). */
zck_status zck__jp_string(zck__jp *jp, const char *ctx);
/* Classifies the next value as a JSON number and, when it is a non-negative integer below
 * 2^64 with no fraction or exponent, stores it; otherwise fails naming ctx and why
 * (negative, not an integer, too large, not a number). */
zck_status zck__jp_u64(zck__jp *jp, uint64_t *v, const char *ctx);
/* Skips any value (validating it). */
zck_status zck__jp_skip(zck__jp *jp);
/* Only whitespace may remain. */
zck_status zck__jp_finish(zck__jp *jp);
/* Name of the JSON type of the next value ("a string", "an array", ...), for messages. */
const char *zck__jp_kind(zck__jp *jp);

/* ---- JSON string emitters */
/* serde_json: escapes '"', '\\' and bytes < 0x20 (\b \t \n \f \r, else \u00xx); UTF-8 raw. */
void zck__json_str_serde(zck__buf *b, const char *s);
/* Python json with ensure_ascii=True: also escapes 0x7f and every non-ASCII code point as
 * \uxxxx (surrogate pairs above U+FFFF). */
void zck__json_str_python(zck__buf *b, const char *s);

#endif
