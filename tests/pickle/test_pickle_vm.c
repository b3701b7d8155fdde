/* test_pickle_vm.c: the pickle VM's tree (values, folds, sharing), the same objects at
 * protocols 0-5 loading to the same tree, trees built by hand dumping to CPython's exact
 * bytes, and one malformed stream per failure mode of the pickle VM. */
#include "pickle/pickle.h"
#include "test.h"

#include <math.h>

static const char *src_dir(void) {
  const char *s = getenv("ZCK_SOURCE_DIR");
  return s ? s : ZCK_TEST_SOURCE_DIR;
}

static zck_pk_doc *load_file(const char *rel) {
  char *p = NULL;
  ZT_ASSERT(asprintf(&p, "%s/tests/pickle/golden/%s", src_dir(), rel) > 0);
  unsigned char *data;
  size_t n;
  if (zt_read_file(p, &data, &n)) ZT_FAIL("cannot read %s", p);
  zck_pk_doc *doc;
  ZT_OK(zck_pickle_load(data, n, p, NULL, &doc));
  free(data);
  free(p);
  return doc;
}

static unsigned char *golden_bytes(const char *rel, size_t *n) {
  char *p = NULL;
  ZT_ASSERT(asprintf(&p, "%s/tests/pickle/golden/%s", src_dir(), rel) > 0);
  unsigned char *data;
  if (zt_read_file(p, &data, n)) ZT_FAIL("cannot read %s", p);
  free(p);
  return data;
}

/* Structural equality (sharing ignored). */
static int eq(const zck_pk *a, const zck_pk *b, int depth) {
  if (depth > 64) return 0;
  if (!a || !b) return a == b;
  if (a->kind != b->kind || a->tag != b->tag) return 0;
  switch (a->kind) {
  case ZCK_PK_NONE: return 1;
  case ZCK_PK_BOOL: return a->u.b == b->u.b;
  case ZCK_PK_INT: return a->u.i == b->u.i;
  case ZCK_PK_FLOAT: return !memcmp(&a->u.f, &b->u.f, 8);
  case ZCK_PK_STR: case ZCK_PK_BYTES: case ZCK_PK_BIGINT:
    return a->u.str.len == b->u.str.len && !memcmp(a->u.str.data, b->u.str.data, a->u.str.len);
  case ZCK_PK_TUPLE: case ZCK_PK_LIST: case ZCK_PK_SET:
    if (a->u.seq.len != b->u.seq.len) return 0;
    for (size_t i = 0; i < a->u.seq.len; i++)
      if (!eq(a->u.seq.items[i], b->u.seq.items[i], depth + 1)) return 0;
    return 1;
  case ZCK_PK_DICT:
    if (a->u.dict.len != b->u.dict.len || a->u.dict.ordered != b->u.dict.ordered) return 0;
    for (size_t i = 0; i < a->u.dict.len; i++)
      if (!eq(a->u.dict.keys[i], b->u.dict.keys[i], depth + 1) || !eq(a->u.dict.values[i], b->u.dict.values[i], depth + 1))
        return 0;
    return eq(a->u.dict.attrs, b->u.dict.attrs, depth + 1);
  case ZCK_PK_GLOBAL: return !strcmp(a->u.global.module, b->u.global.module) && !strcmp(a->u.global.name, b->u.global.name);
  case ZCK_PK_OBJECT:
    return a->u.obj.newobj == b->u.obj.newobj && eq(a->u.obj.callable, b->u.obj.callable, depth + 1) &&
           eq(a->u.obj.args, b->u.obj.args, depth + 1) && eq(a->u.obj.state, b->u.obj.state, depth + 1) &&
           eq(a->u.obj.list_items, b->u.obj.list_items, depth + 1) && eq(a->u.obj.dict_items, b->u.obj.dict_items, depth + 1);
  case ZCK_PK_PERSID: return eq(a->u.persid.pid, b->u.persid.pid, depth + 1);
  }
  return 0;
}

// ---- values

static void test_values(void) {
  zck_pk_doc *d = load_file("basic.pkl");
  const zck_pk *r = zck_pk_doc_root(d);
  ZT_EQ_INT(r->kind, ZCK_PK_DICT);
  int64_t v;
  ZT_ASSERT(zck_pk_as_int(zck_pk_dict_get(r, "a"), &v) && v == 1);
  ZT_EQ_INT(zck_pk_dict_get(r, "b")->kind, ZCK_PK_LIST);
  ZT_EQ_INT(zck_pk_dict_get(r, "b")->u.seq.len, 3);
  ZT_EQ_INT(zck_pk_dict_get(r, "c")->kind, ZCK_PK_TUPLE);
  ZT_EQ_INT(zck_pk_dict_get(r, "d")->kind, ZCK_PK_NONE);
  ZT_EQ_INT(zck_pk_dict_get(r, "e")->u.b, 1);
  double f;
  ZT_ASSERT(zck_pk_as_double(zck_pk_dict_get(r, "g"), &f) && f == 1.5);
  ZT_EQ_STR(zck_pk_as_str(zck_pk_dict_get(r, "h")), "h\xc3\xa9llo \xe2\x98\x83 \xf0\x9f\x98\x80");
  ZT_ASSERT(zck_pk_dict_get(r, "nope") == NULL);
  char buf[64];
  zck_pk_summary(r, buf, sizeof buf);
  ZT_EQ_STR(buf, "dict(11)");
  zck_pk_doc_free(d);

  d = load_file("ints.pkl");
  r = zck_pk_doc_root(d);
  static const int64_t small[] = {0, 1, 255, 256, 65535, 65536, -1, -255, -256, INT32_MIN, INT32_MAX, (int64_t)1 << 31,
                                  (int64_t)INT32_MIN - 1, (int64_t)1 << 40, -((int64_t)1 << 40), INT64_MAX, INT64_MIN};
  for (size_t i = 0; i < sizeof small / sizeof *small; i++) {
    ZT_EQ_INT(r->u.seq.items[i]->kind, ZCK_PK_INT);
    ZT_EQ_INT(r->u.seq.items[i]->u.i, small[i]);
  }
  const zck_pk *b63 = r->u.seq.items[17];   /* 2**63: 9 bytes 00..00 80 00 */
  ZT_EQ_INT(b63->kind, ZCK_PK_BIGINT);
  ZT_EQ_INT(b63->u.str.len, 9);
  ZT_EQ_INT((uint8_t)b63->u.str.data[7], 0x80);
  ZT_EQ_INT(r->u.seq.items[22]->kind, ZCK_PK_BIGINT);   /* 2**2100: LONG4 */
  zck_pk_doc_free(d);

  d = load_file("floats.pkl");
  r = zck_pk_doc_root(d);
  ZT_ASSERT(isinf(r->u.seq.items[4]->u.f) && isnan(r->u.seq.items[6]->u.f) && signbit(r->u.seq.items[1]->u.f));
  zck_pk_doc_free(d);

  d = load_file("ordered.pkl");
  r = zck_pk_doc_root(d);
  const zck_pk *sd = zck_pk_dict_get(r, "state");
  ZT_ASSERT(sd->kind == ZCK_PK_DICT && sd->u.dict.ordered && sd->u.dict.len == 2);
  ZT_ASSERT(sd->u.dict.attrs && zck_pk_dict_get(sd->u.dict.attrs, "_metadata"));   /* P-16 */
  zck_pk_doc_free(d);

  d = load_file("shared.pkl");
  r = zck_pk_doc_root(d);
  ZT_ASSERT(r->u.seq.items[0] == r->u.seq.items[1]);   /* memo GET shares nodes */
  ZT_ASSERT(r->u.seq.items[2] == r->u.seq.items[3]);
  zck_pk_doc_free(d);

  d = load_file("sets.pkl");
  r = zck_pk_doc_root(d);
  ZT_ASSERT(r->u.seq.items[1]->kind == ZCK_PK_SET && r->u.seq.items[1]->u.seq.len == 3);
  ZT_EQ_INT(r->u.seq.items[2]->tag, ZCK_PK_TAG_FROZENSET);
  ZT_ASSERT(r->u.seq.items[4]->kind == ZCK_PK_BYTES && r->u.seq.items[4]->u.str.len == 0);
  ZT_ASSERT(r->u.seq.items[5]->kind == ZCK_PK_BYTES && r->u.seq.items[5]->u.str.len == 4 &&
            !memcmp(r->u.seq.items[5]->u.str.data, "ab\xff\x00", 4));
  ZT_EQ_INT(r->u.seq.items[6]->tag, ZCK_PK_TAG_BYTEARRAY);
  zck_pk_doc_free(d);

  d = load_file("sizes.pkl");
  r = zck_pk_doc_root(d);
  ZT_ASSERT(r->u.seq.items[0]->kind == ZCK_PK_TUPLE && r->u.seq.items[0]->tag == ZCK_PK_TAG_TORCH_SIZE);
  zck_pk_summary(r->u.seq.items[0], buf, sizeof buf);
  ZT_EQ_STR(buf, "torch.Size([2, 3])");
  zck_pk_doc_free(d);

  d = load_file("objects.pkl");
  r = zck_pk_doc_root(d);
  const zck_pk *ns = zck_pk_dict_get(r, "ns");
  ZT_ASSERT(zck_pk_is_global(ns, "argparse", "Namespace") && ns->u.obj.newobj && ns->u.obj.state);
  const zck_pk *dd = zck_pk_dict_get(r, "dd");
  ZT_ASSERT(zck_pk_is_global(dd, "collections", "defaultdict") && dd->u.obj.dict_items && dd->u.obj.dict_items->u.dict.len == 2);
  ZT_ASSERT(zck_pk_is_global(dd->u.obj.args->u.seq.items[0], "builtins", "int"));   /* __builtin__ long */
  ZT_ASSERT(zck_pk_is_global(dd->u.obj.args->u.seq.items[0], "__builtin__", "long"));
  ZT_ASSERT(zck_pk_dict_get(r, "deque")->u.obj.list_items->u.seq.len == 3);
  zck_pk_summary(zck_pk_dict_get(r, "stage"), buf, sizeof buf);
  ZT_EQ_STR(buf, "Stage(1)");
  zck_pk_doc_free(d);

  d = load_file("self_list.pkl");   /* cycles load; summary and dump stay finite */
  r = zck_pk_doc_root(d);
  ZT_ASSERT(r->u.seq.items[0] == r);
  zck_pk_summary(r, buf, sizeof buf);
  zck_pk_doc_free(d);
}

static void test_protocols(void) {
  static const char *names[] = {"basic", "ints", "floats", "ordered", "shared", "tuples", "sets", "sizes", "memo300"};
  static const int protos[] = {0, 1, 3, 4, 5};
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    char rel[128];
    snprintf(rel, sizeof rel, "%s.pkl", names[i]);
    zck_pk_doc *ref = load_file(rel);
    for (size_t p = 0; p < sizeof protos / sizeof *protos; p++) {
      snprintf(rel, sizeof rel, "proto/%s.p%d.pkl", names[i], protos[p]);
      zck_pk_doc *d = load_file(rel);
      if (!eq(zck_pk_doc_root(ref), zck_pk_doc_root(d), 0)) ZT_FAIL("%s loads to a different tree than protocol 2", rel);
      zck_pk_doc_free(d);
    }
    zck_pk_doc_free(ref);
  }
}

// ---- trees built by hand dump as CPython pickles them

static void expect_dump(zck_pk *root, const char *golden) {
  zck__buf out;
  zck__buf_init(&out);
  ZT_OK(zck_pickle_dump(root, &out));
  size_t n;
  unsigned char *want = golden_bytes(golden, &n);
  if (out.len != n || memcmp(out.data, want, n)) {
    size_t i = 0;
    while (i < n && i < out.len && out.data[i] == want[i]) i++;
    ZT_FAIL("hand-built %s differs at byte %zu (%zu vs %zu bytes)", golden, i, out.len, n);
  }
  free(want);
  zck__buf_free(&out);
}

static void test_build(void) {
  zck_pk_doc *d = zck_pk_doc_new();
  /* ordered.pkl: {"state": OD(w=1, b=[2]) + _metadata, "empty": OD(), "one": OD(k=1)} */
  zck_pk *root = zck_pk_new_dict(d, 0);
  zck_pk *sd = zck_pk_new_dict(d, 1);
  zck_pk *l = zck_pk_new_list(d);
  zck_pk *version = zck_pk_new_str(d, "version");   /* one interned str in CPython: BINGET */
  zck_pk *m1 = zck_pk_new_dict(d, 0), *m2 = zck_pk_new_dict(d, 0), *meta = zck_pk_new_dict(d, 1), *attrs = zck_pk_new_dict(d, 0);
  ZT_ASSERT(zck_pk_append(d, l, zck_pk_new_int(d, 2)));
  ZT_ASSERT(zck_pk_dict_set(d, sd, zck_pk_new_str(d, "w"), zck_pk_new_int(d, 1)));
  ZT_ASSERT(zck_pk_dict_set(d, sd, zck_pk_new_str(d, "b"), l));
  ZT_ASSERT(zck_pk_dict_set(d, m1, version, zck_pk_new_int(d, 1)));
  ZT_ASSERT(zck_pk_dict_set(d, m2, version, zck_pk_new_int(d, 1)));
  ZT_ASSERT(zck_pk_dict_set(d, meta, zck_pk_new_str(d, ""), m1));
  ZT_ASSERT(zck_pk_dict_set(d, meta, zck_pk_new_str(d, "lin"), m2));
  ZT_ASSERT(zck_pk_dict_set(d, attrs, zck_pk_new_str(d, "_metadata"), meta));
  sd->u.dict.attrs = attrs;
  zck_pk *one = zck_pk_new_dict(d, 1);
  ZT_ASSERT(zck_pk_dict_set(d, one, zck_pk_new_str(d, "k"), zck_pk_new_int(d, 1)));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "state"), sd));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "empty"), zck_pk_new_dict(d, 1)));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "one"), one));
  expect_dump(root, "ordered.pkl");

  /* sizes.pkl: [Size([2,3]), Size([]), Size([1,2,3,4]), {"shape": Size([5])}] */
  zck_pk *sizes = zck_pk_new_list(d);
  static const int dims[4][4] = {{2, 3}, {0}, {1, 2, 3, 4}, {5}};
  static const int nd[4] = {2, 0, 4, 1};
  zck_pk *sz[4];
  for (int i = 0; i < 4; i++) {
    sz[i] = zck_pk_new_tuple(d, 0);
    sz[i]->tag = ZCK_PK_TAG_TORCH_SIZE;
    for (int k = 0; k < nd[i]; k++) ZT_ASSERT(zck_pk_append(d, sz[i], zck_pk_new_int(d, dims[i][k])));
  }
  zck_pk *shape = zck_pk_new_dict(d, 0);
  ZT_ASSERT(zck_pk_dict_set(d, shape, zck_pk_new_str(d, "shape"), sz[3]));
  for (int i = 0; i < 3; i++) ZT_ASSERT(zck_pk_append(d, sizes, sz[i]));
  ZT_ASSERT(zck_pk_append(d, sizes, shape));
  expect_dump(sizes, "sizes.pkl");

  /* sets.pkl: [set(), {1,2,3}, frozenset({4}), frozenset(), b"", b"ab\xff\0", bytearray(b"xy"), b"ab\xff\0"] */
  zck_pk *sets = zck_pk_new_list(d);
  zck_pk *s3 = zck_pk_new_set(d, 0), *f1 = zck_pk_new_set(d, 1);
  for (int i = 1; i <= 3; i++) ZT_ASSERT(zck_pk_append(d, s3, zck_pk_new_int(d, i)));
  ZT_ASSERT(zck_pk_append(d, f1, zck_pk_new_int(d, 4)));
  zck_pk *abff = zck_pk_new_bytes(d, "ab\xff\x00", 4), *xy = zck_pk_new_bytes(d, "xy", 2);
  xy->tag = ZCK_PK_TAG_BYTEARRAY;
  zck_pk *items[] = {zck_pk_new_set(d, 0), s3, f1, zck_pk_new_set(d, 1), zck_pk_new_bytes(d, "", 0), abff, xy, abff};
  for (size_t i = 0; i < 8; i++) ZT_ASSERT(zck_pk_append(d, sets, items[i]));
  expect_dump(sets, "sets.pkl");

  /* ints.pkl, from values: the int opcodes and LONG1/LONG4 minimal encodings */
  zck_pk_doc *ref = load_file("ints.pkl");
  const zck_pk *rl = zck_pk_doc_root(ref);
  zck_pk *ints = zck_pk_new_list(d);
  for (size_t i = 0; i < rl->u.seq.len; i++) {
    const zck_pk *it = rl->u.seq.items[i];
    zck_pk *c;
    if (it->kind == ZCK_PK_INT) c = zck_pk_new_int(d, it->u.i);
    else {
      c = zck_pk_new_bytes(d, it->u.str.data, it->u.str.len);
      c->kind = ZCK_PK_BIGINT;
    }
    ZT_ASSERT(zck_pk_append(d, ints, c));
  }
  expect_dump(ints, "ints.pkl");
  zck_pk_doc_free(ref);

  /* a cycle through REDUCE arguments cannot be pickled: an error, not a crash */
  zck_pk *obj = zck_pk_new_object(d, zck_pk_new_global(d, "m", "f"), zck_pk_new_tuple(d, 1), 0, NULL);
  obj->u.obj.args->u.seq.items[0] = obj;
  zck__buf out;
  zck__buf_init(&out);
  ZT_ERR(zck_pickle_dump(obj, &out), ZCK_ERR_LIMIT, "nested deeper than 1000");
  zck__buf_free(&out);
  zck_pk_doc_free(d);
}

// ---- malformed streams

static zck_status load_bytes(const char *bytes, size_t n, const zck_pk_limits *lim) {
  zck_pk_doc *d = NULL;
  zck_status s = zck_pickle_load(bytes, n, "t.pkl", lim, &d);
  zck_pk_doc_free(d);
  return s;
}
#define BAD(lit, status, needle) ZT_ERR(load_bytes(lit, sizeof(lit) - 1, NULL), status, needle)
#define BADL(lit, lim, status, needle) ZT_ERR(load_bytes(lit, sizeof(lit) - 1, lim), status, needle)
#define GOOD(lit) ZT_OK(load_bytes(lit, sizeof(lit) - 1, NULL))

static void test_malformed(void) {
  /* P-01 truncated argument / data */
  BAD("\x80\x02K", ZCK_ERR_FORMAT, "t.pkl: byte 2: BININT1: truncated");
  BAD("\x80\x02X\x05\x00\x00\x00" "ab", ZCK_ERR_FORMAT, "BINUNICODE: truncated: needs 5 bytes, 2 left");
  BAD("\x80\x02\x8e\xff\xff\xff\xff\xff\xff\xff\x7f", ZCK_ERR_LIMIT, "over the string limit");
  BAD("cmod\nna", ZCK_ERR_FORMAT, "GLOBAL: truncated: argument line has no newline");
  /* P-02 no STOP */
  BAD("\x80\x02N", ZCK_ERR_FORMAT, "byte 3: truncated: no STOP opcode");
  BAD("", ZCK_ERR_FORMAT, "no STOP");
  /* P-03 trailing bytes after STOP: accepted */
  GOOD("\x80\x02N.garbage");
  /* P-04 STOP with an open MARK, or with more than one item */
  BAD("\x80\x02(N.", ZCK_ERR_FORMAT, "MARK still open at STOP");
  BAD("\x80\x02NN.", ZCK_ERR_FORMAT, "2 objects on the stack at STOP");
  BAD("\x80\x02.", ZCK_ERR_FORMAT, "0 objects on the stack at STOP");
  /* P-05 unknown opcode, PROTO > 5 */
  BAD("\x80\x02\xff.", ZCK_ERR_FORMAT, "byte 2: unknown opcode 0xff");
  BAD("\x80\x06N.", ZCK_ERR_FORMAT, "unsupported pickle protocol 6");
  BAD("\x80\x02\x97.", ZCK_ERR_FORMAT, "NEXT_BUFFER: opcode not supported");
  /* P-06 stack underflow, also across a MARK */
  BAD("\x80\x02R.", ZCK_ERR_FORMAT, "REDUCE: stack underflow");
  BAD("\x80\x02" "cm\nf\n(\x85R.", ZCK_ERR_FORMAT, "TUPLE1: unexpected MARK found");
  BAD("\x80\x02N(b", ZCK_ERR_FORMAT, "BUILD: unexpected MARK found");
  BAD("\x80\x02}N(Ns", ZCK_ERR_FORMAT, "SETITEM: unexpected MARK found");
  BAD("\x80\x02](Na", ZCK_ERR_FORMAT, "APPEND: unexpected MARK found");
  BAD("\x80\x02Q.", ZCK_ERR_FORMAT, "BINPERSID: stack underflow");
  BAD("\x80\x02)\x81.", ZCK_ERR_FORMAT, "NEWOBJ: stack underflow");
  BAD("\x80\x02\x86.", ZCK_ERR_FORMAT, "TUPLE2: stack underflow");
  BAD("\x80\x02(e", ZCK_ERR_FORMAT, "APPENDS: stack underflow");   /* no target under the items */
  BAD("\x80\x02]((e", ZCK_ERR_FORMAT, "APPENDS: unexpected MARK found");   /* target beyond the outer MARK */
  BAD("\x80\x02" "2.", ZCK_ERR_FORMAT, "DUP: stack underflow");
  /* P-07 MARK-consuming op without a MARK; SETITEMS with an odd count */
  BAD("\x80\x02Nt.", ZCK_ERR_FORMAT, "TUPLE: no MARK to pop to");
  BAD("\x80\x02}(Nu.", ZCK_ERR_FORMAT, "SETITEMS: odd number of items (1)");
  BAD("\x80\x02" "1.", ZCK_ERR_FORMAT, "POP_MARK: no MARK");
  /* P-08 memo GET of an index never PUT */
  BAD("\x80\x02h\xc8.", ZCK_ERR_FORMAT, "BINGET: memo value not found at index 200");
  BAD("\x80\x02Nq\x01h\x00.", ZCK_ERR_FORMAT, "memo value not found at index 0");
  BAD("\x80\x02g7\n.", ZCK_ERR_FORMAT, "GET: memo value not found at index 7");
  /* P-09 memo index over the limit, object count over the cap */
  zck_pk_limits lim = ZCK_PK_LIMITS_INIT;
  lim.max_memo = 16;
  BADL("\x80\x02Nr\x00\x01\x00\x00.", &lim, ZCK_ERR_LIMIT, "memo index 256 over the memo limit 16");
  {
    /* ...but a dense memo (entries 0, 1, 2, ... each after its object, as every pickler
     * writes) passes it: a 100k-tensor model file holds over 1<<20 memo entries. */
    char dense[3 + 3 * 40 + 2];
    size_t n = 0;
    memcpy(dense, "\x80\x02(", 3), n = 3;
    for (int i = 0; i < 40; i++) dense[n++] = 'N', dense[n++] = 'q', dense[n++] = (char)i;
    dense[n++] = 't', dense[n++] = '.';
    ZT_OK(load_bytes(dense, n, &lim));
    dense[3 + 3 * 39 + 2] = (char)200; /* the last index jumps past its offset: sparse, refused */
    ZT_ERR(load_bytes(dense, n, &lim), ZCK_ERR_LIMIT, "byte 121: BINPUT: memo index 200 over the memo limit 121");
  }
  lim = (zck_pk_limits)ZCK_PK_LIMITS_INIT;
  lim.max_objects = 4;
  /* (lists: None and small ints are one shared node per doc, and count once) */
  BADL("\x80\x02(]]]]]]t.", &lim, ZCK_ERR_LIMIT, "more than 5 objects"); /* the cap: 11 bytes / 2 */
  /* the cap grows to half a node per byte: 10 nodes in 50 bytes pass a cap of 4 */
  ZT_OK(load_bytes("\x80\x02(" "J\0\4\0\0J\0\4\0\0J\0\4\0\0J\0\4\0\0J\0\4\0\0J\0\4\0\0J\0\4\0\0J\0\4\0\0J\0\4\0\0" "t.", 50, &lim));
  /* P-10 REDUCE of a non-global, or with non-tuple arguments */
  BAD("\x80\x02N)R.", ZCK_ERR_FORMAT, "REDUCE: callable is a None, not a global");
  BAD("\x80\x02" "cm\nf\nNR.", ZCK_ERR_FORMAT, "REDUCE: arguments are a None, not a tuple");
  /* P-11 SETITEM(S) on a non-dict, APPEND(S) on a non-list */
  BAD("\x80\x02]NNs.", ZCK_ERR_FORMAT, "SETITEM: target is a list, not a dict");
  BAD("\x80\x02)(NNu.", ZCK_ERR_FORMAT, "SETITEMS: target is a tuple, not a dict");
  BAD("\x80\x02}Na.", ZCK_ERR_FORMAT, "APPEND: target is a dict, not a list");
  BAD("\x80\x02N(Ne.", ZCK_ERR_FORMAT, "APPENDS: target is a None, not a list");
  BAD("\x80\x02](N\x90.", ZCK_ERR_FORMAT, "ADDITEMS: target is a list, not a set");
  BAD("\x80\x02](Nb.", ZCK_ERR_FORMAT, "BUILD: unexpected MARK");
  BAD("\x80\x02]Nb.", ZCK_ERR_FORMAT, "BUILD: cannot set the state of a list");
  /* P-12 GLOBAL not UTF-8 text, or too long */
  BAD("\x80\x02" "c\xff\nx\n.", ZCK_ERR_FORMAT, "GLOBAL: module or name is not valid UTF-8 text");
  BAD("\x80\x02" "c\nx\n.", ZCK_ERR_FORMAT, "GLOBAL: empty module or name");
  BAD("\x80\x02X\x01\x00\x00\x00mN\x93.", ZCK_ERR_FORMAT, "STACK_GLOBAL: module and name must be str");
  {
    char big[3000];
    size_t n = 0;
    memcpy(big, "\x80\x02" "c", 3), n = 3;
    memset(big + n, 'a', 2000), n += 2000;
    memcpy(big + n, "\nb\n.", 4), n += 4;
    ZT_ERR(load_bytes(big, n, NULL), ZCK_ERR_FORMAT, "longer than 1024 bytes");
  }
  /* invalid UTF-8 in a str */
  BAD("\x80\x02X\x02\x00\x00\x00\xc3\x28.", ZCK_ERR_FORMAT, "BINUNICODE: string is not valid UTF-8");
  /* P-13 unhashable keys (a list, dict or set, or a tuple holding one): rejected */
  BAD("\x80\x02}]Ns.", ZCK_ERR_FORMAT, "a list used as a dict key");
  BAD("\x80\x02}}Ns.", ZCK_ERR_FORMAT, "a dict used as a dict key");
  BAD("\x80\x02}]\x85Ns.", ZCK_ERR_FORMAT, "a tuple used as a dict key");
  BAD("\x80\x02}(NN]Nu.", ZCK_ERR_FORMAT, "a list used as a dict key");  /* SETITEMS */
  GOOD("\x80\x02}K\x01\x85Ns.");                                      /* a tuple of ints */
  GOOD("\x80\x02}NNs.");                                                /* None */
  /* P-14 nesting depth, string length */
  lim = (zck_pk_limits)ZCK_PK_LIMITS_INIT;
  lim.max_depth = 8;
  BADL("\x80\x02]q\x00]q\x01" "ah\x01]q\x02" "a0h\x02]q\x03" "a0h\x03]q\x04" "a0h\x04]q\x05" "a0h\x05]q\x06" "a0h\x06]q\x07" "a0h\x07]q\x08" "a0h\x08]q\x09" "a0h\x09]q\x0a" "a0.",
       &lim, ZCK_ERR_LIMIT, "nested deeper than the limit 8");
  BADL("\x80\x02((((((((((N", &lim, ZCK_ERR_LIMIT, "more than 8 nested MARKs");
  lim = (zck_pk_limits)ZCK_PK_LIMITS_INIT;
  lim.max_string = 4;
  BADL("\x80\x02X\x05\x00\x00\x00" "abcde.", &lim, ZCK_ERR_LIMIT, "length 5 over the string limit 4");
  BADL("\x80\x02\x8a\x05\x01\x02\x03\x04\x05.", &lim, ZCK_ERR_LIMIT, "LONG1: length 5 over the string limit 4");
  BAD("\x80\x02\x8b\xff\xff\xff\xff.", ZCK_ERR_FORMAT, "LONG4: negative byte count");
  /* P-15 empty MARK SETITEMS / APPENDS batches */
  GOOD("\x80\x02}(u(u.");
  GOOD("\x80\x02](e.");
  /* P-16 BUILD on an OrderedDict after SETITEMS */
  GOOD("\x80\x02" "ccollections\nOrderedDict\n)R(X\x01\x00\x00\x00kNu}b.");
  /* text protocol oddities */
  BAD("S'abc\n.", ZCK_ERR_FORMAT, "STRING: argument must be quoted");
  BAD("I12x\n.", ZCK_ERR_FORMAT, "INT: invalid integer literal");
  BAD("Fxyz\n.", ZCK_ERR_FORMAT, "FLOAT: invalid float literal");
  BAD("V\\u12\n.", ZCK_ERR_FORMAT, "UNICODE: truncated \\u escape");
  GOOD("I01\n.");
  GOOD("L123456789012345678901234567890L\n.");
  GOOD("S'a\\x41\\n\\'b'\n.");
  /* POP on an empty MARK frame drops the MARK, as Python does */
  GOOD("\x80\x02(0N.");
}

/* Strings of 1-4 KiB (too small for a chunk of their own) as the first objects, when
 * the arena's chunk is still 1-2 KiB: each must get a chunk that holds it (the arena
 * wrote past a 1 KiB chunk; a Trainer's training_args.bin crashed verify). */
static void test_arena_strings(void) {
  static const size_t sizes[] = {1500, 3000, 2100, 4000, 1025, 4096, 2049, 3500, 8, 4090};
  const size_t count = sizeof sizes / sizeof *sizes;
  size_t total = 4 + 2; /* PROTO 2 ] ( ... e . */
  for (size_t i = 0; i < count; i++) total += 5 + sizes[i];
  unsigned char *p = malloc(total), *w = p;
  ZT_ASSERT(p);
  *w++ = 0x80, *w++ = 2, *w++ = ']', *w++ = '(';
  for (size_t i = 0; i < count; i++) {
    *w++ = 'X';
    for (int b = 0; b < 4; b++) *w++ = (unsigned char)(sizes[i] >> (8 * b));
    memset(w, 'a' + (int)i, sizes[i]);
    w += sizes[i];
  }
  *w++ = 'e', *w++ = '.';
  ZT_EQ_INT((long)(w - p), (long)total);
  zck_pk_doc *d;
  ZT_OK(zck_pickle_load(p, total, "strings.pkl", NULL, &d));
  const zck_pk *r = zck_pk_doc_root(d);
  ZT_EQ_INT(r->kind, ZCK_PK_LIST);
  ZT_EQ_INT(r->u.seq.len, count);
  for (size_t i = 0; i < count; i++) {
    const zck_pk *it = r->u.seq.items[i];
    ZT_EQ_INT(it->kind, ZCK_PK_STR);
    ZT_EQ_INT(it->u.str.len, sizes[i]);
    for (size_t k = 0; k < sizes[i]; k++)
      if (it->u.str.data[k] != 'a' + (int)i) ZT_FAIL("string %zu byte %zu overwritten", i, k);
    ZT_EQ_INT(it->u.str.data[sizes[i]], 0);
  }
  zck_pk_doc_free(d);
  free(p);
}

int main(void) {
  test_values();
  test_protocols();
  test_build();
  test_malformed();
  test_arena_strings();
  printf("pickle VM tests passed\n");
  return 0;
}
