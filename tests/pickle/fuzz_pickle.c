/* fuzz_pickle.c: libFuzzer target for the pickle VM and emitter. Any input must load or
 * fail cleanly; a tree that loads must summarise, and if it dumps, the dump must load back
 * to the same tree (the emitter and the VM agree on every node kind and fold). */
#include "pickle/pickle.h"

#include <stdlib.h>
#include <string.h>

/* Structural equality; deep, cyclic or heavily shared parts count as equal (bounded walk). */
static long budget;
static int same(const zck_pk *a, const zck_pk *b, int depth) {
  if (depth > 48 || --budget < 0) return 1;
  if (!a || !b) return a == b;
  if (a->kind != b->kind || a->tag != b->tag) return 0;
  switch (a->kind) {
  case ZCK_PK_NONE: return 1;
  case ZCK_PK_BOOL: return a->u.b == b->u.b;
  case ZCK_PK_INT: return a->u.i == b->u.i;
  case ZCK_PK_FLOAT: return !memcmp(&a->u.f, &b->u.f, 8);
  case ZCK_PK_STR: case ZCK_PK_BYTES:
    return a->u.str.len == b->u.str.len && !memcmp(a->u.str.data, b->u.str.data, a->u.str.len);
  case ZCK_PK_BIGINT: return 1;   /* re-encoded minimally: compared by the VM's own tests */
  case ZCK_PK_TUPLE: case ZCK_PK_LIST: case ZCK_PK_SET:
    if (a->u.seq.len != b->u.seq.len) return 0;
    for (size_t i = 0; i < a->u.seq.len; i++)
      if (!same(a->u.seq.items[i], b->u.seq.items[i], depth + 1)) return 0;
    return 1;
  case ZCK_PK_DICT:
    if (a->u.dict.len != b->u.dict.len || a->u.dict.ordered != b->u.dict.ordered) return 0;
    for (size_t i = 0; i < a->u.dict.len; i++)
      if (!same(a->u.dict.keys[i], b->u.dict.keys[i], depth + 1) || !same(a->u.dict.values[i], b->u.dict.values[i], depth + 1))
        return 0;
    return same(a->u.dict.attrs, b->u.dict.attrs, depth + 1);
  case ZCK_PK_GLOBAL: return !strcmp(a->u.global.module, b->u.global.module) && !strcmp(a->u.global.name, b->u.global.name);
  case ZCK_PK_OBJECT:
    return a->u.obj.newobj == b->u.obj.newobj && same(a->u.obj.callable, b->u.obj.callable, depth + 1) &&
           same(a->u.obj.args, b->u.obj.args, depth + 1) && same(a->u.obj.state, b->u.obj.state, depth + 1) &&
           same(a->u.obj.list_items, b->u.obj.list_items, depth + 1) &&
           same(a->u.obj.dict_items, b->u.obj.dict_items, depth + 1);
  case ZCK_PK_PERSID: return same(a->u.persid.pid, b->u.persid.pid, depth + 1);
  }
  return 0;
}

/* A sink that takes every object NEWOBJ makes: the windows, their freeing and the memo's
 * compact values meet every input too. */
static int take_all(void *ctx, const char *module, const char *name) {
  (void)ctx, (void)module, (void)name;
  return 0;
}
static zck_status take(void *ctx, int cls, const zck_pk *obj, const zck_pk *below, uint32_t *handle) {
  char buf[128];
  (void)ctx, (void)cls;
  zck_pk_summary(obj, buf, sizeof buf);
  if (below) zck_pk_summary(below, buf, sizeof buf);
  *handle = 1;
  return ZCK_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  zck_pk_limits lim = ZCK_PK_LIMITS_INIT;
  lim.max_depth = 64;
  lim.max_objects = 1 << 16;
  lim.max_string = 1 << 16;
  zck_pk_doc *doc = NULL;
  zck_pk_sink sink = {NULL, take_all, NULL, take, NULL};
  if (zck_pickle_load_sink(data, size, "fuzz", &lim, &sink, &doc) == ZCK_OK) {
    char buf[256];
    zck_pk_summary(zck_pk_doc_root(doc), buf, sizeof buf);
    zck_pk_doc_free(doc);
    doc = NULL;
  }
  if (zck_pickle_load(data, size, "fuzz", &lim, &doc) != ZCK_OK) return 0;
  const zck_pk *root = zck_pk_doc_root(doc);
  char buf[256];
  zck_pk_summary(root, buf, sizeof buf);
  int64_t iv;
  double dv;
  (void)zck_pk_dict_get(root, "module");
  (void)zck_pk_as_int(root, &iv);
  (void)zck_pk_as_double(root, &dv);
  zck__buf out;
  zck__buf_init(&out);
  if (zck_pickle_dump(root, &out) == ZCK_OK) {
    zck_pk_limits big = ZCK_PK_LIMITS_INIT;
    big.max_depth = 100000;
    zck_pk_doc *again = NULL;
    if (zck_pickle_load(out.data, out.len, "dump", &big, &again) != ZCK_OK) abort();
    budget = 200000;
    if (!same(root, zck_pk_doc_root(again), 0)) abort();
    zck_pk_doc_free(again);
  }
  zck__buf_free(&out);
  zck_pk_doc_free(doc);
  return 0;
}
