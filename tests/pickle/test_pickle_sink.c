/* test_pickle_sink.c: objects handed to a sink as the stream loads (zck_pickle_load_sink):
 * each one's nodes freed at its BUILD, the values it memoized remade on a later GET (a
 * torch.Size shared by two objects, as a one-process DCP save pickles it), a GET of its
 * state, a part that escaped it and a later change to it refused in one line. */
#include "pickle/pickle.h"
#include "test.h"


// ---- streams written op by op (protocol 2, as CPython writes them)

typedef struct stream { unsigned char b[4096]; size_t n; } stream;
static void raw(stream *s, const void *p, size_t n) {
  ZT_ASSERT(s->n + n <= sizeof s->b);
  memcpy(s->b + s->n, p, n);
  s->n += n;
}
static void op(stream *s, unsigned char c) { raw(s, &c, 1); }
static void put(stream *s, unsigned char i) { op(s, 'q'), op(s, i); }
static void get(stream *s, unsigned char i) { op(s, 'h'), op(s, i); }
static void str(stream *s, const char *t) {
  unsigned char len[4] = {(unsigned char)strlen(t), 0, 0, 0};
  op(s, 'X'), raw(s, len, 4), raw(s, t, strlen(t));
}
static void global(stream *s, const char *m, const char *n) {
  op(s, 'c'), raw(s, m, strlen(m)), op(s, '\n'), raw(s, n, strlen(n)), op(s, '\n');
}
static void int1(stream *s, unsigned char v) { op(s, 'K'), op(s, v); }
/* torch.Size((a, b)), memoized as CPython does: the tuple, the args, the Size */
static void size2(stream *s, unsigned char a, unsigned char b, unsigned char memo) {
  get(s, 1);   /* torch.Size */
  int1(s, a), int1(s, b), op(s, 0x86), put(s, memo);
  op(s, 0x85), put(s, (unsigned char)(memo + 1));
  op(s, 'R'), put(s, (unsigned char)(memo + 2));
}

// ---- the sink: objects of m.C, their state's "v" and "s" recorded

typedef struct rec { int64_t v; int64_t s0, s1; } rec;
typedef struct sink_ctx { rec r[16]; uint32_t n; int checked; } sink_ctx;

static int classify(void *ctx, const char *module, const char *name) {
  (void)ctx;
  return !strcmp(module, "m") && !strcmp(name, "C") ? 7 : -1;
}
static zck_status check(void *ctx, const zck_pk *node) {
  ((sink_ctx *)ctx)->checked++;
  if (node->kind == ZCK_PK_GLOBAL && !strcmp(node->u.global.module, "os")) return zck__fail(ZCK_ERR_FORMAT, "os refused");
  return ZCK_OK;
}
static zck_status consume(void *ctx, int cls, const zck_pk *obj, const zck_pk *below, uint32_t *handle) {
  sink_ctx *c = ctx;
  (void)below;
  ZT_ASSERT(cls == 7 && c->n < 16);
  const zck_pk *st = obj->u.obj.state, *s = zck_pk_dict_get(st, "s");
  ZT_ASSERT(st && zck_pk_as_int(zck_pk_dict_get(st, "v"), &c->r[c->n].v));
  ZT_ASSERT(s && s->kind == ZCK_PK_TUPLE && s->tag == ZCK_PK_TAG_TORCH_SIZE && s->u.seq.len == 2);
  c->r[c->n].s0 = s->u.seq.items[0]->u.i;
  c->r[c->n].s1 = s->u.seq.items[1]->u.i;
  *handle = c->n++;
  return ZCK_OK;
}

/* C() with state {"v": v, "s": Size((v, 2v))}, memo entries memo..memo+4 (the object, its
 * dict, the Size's tuple, args and Size); the keys made by the first one (memo 10) */
static void object(stream *s, unsigned char v, unsigned char memo) {
  get(s, 2);   /* m.C */
  op(s, ')'), op(s, 0x81), put(s, memo);
  op(s, '}'), put(s, (unsigned char)(memo + 1));
  op(s, '(');
  if (memo == 10) str(s, "v"), put(s, 3);
  else get(s, 3);
  int1(s, v);
  if (memo == 10) str(s, "s"), put(s, 4);
  else get(s, 4);
  size2(s, v, (unsigned char)(2 * v), (unsigned char)(memo + 2));
  op(s, 'u'), op(s, 'b');
}

static void header(stream *s) {
  op(s, 0x80), op(s, 2);
  global(s, "torch", "Size"), put(s, 1);
  global(s, "m", "C"), put(s, 2);
  op(s, '0'), op(s, '0');   /* both POPped: fetched from the memo from now on */
}

static zck_pk_doc *load(stream *s, sink_ctx *c, zck_status want, const char *needle) {
  zck_pk_sink sk = {c, classify, check, consume, NULL};
  zck_pk_doc *doc = NULL;
  zck_status st = zck_pickle_load_sink(s->b, s->n, "t.pkl", NULL, &sk, &doc);
  if (st != want) ZT_FAIL("status %d, wanted %d: %s", st, want, zck_last_error());
  if (needle && !strstr(zck_last_error(), needle)) ZT_FAIL("message lacks '%s': %s", needle, zck_last_error());
  return doc;
}

int main(void) {
  /* [C(1), C(2), C(3)], then the second object's Size fetched again (a torch.Size that
   * a one-process save shares between a chunk and its MetadataIndex) */
  stream s = {0};
  header(&s);
  op(&s, ']'), put(&s, 5);
  op(&s, '(');
  for (unsigned char i = 0; i < 3; i++) object(&s, (unsigned char)(i + 1), (unsigned char)(10 + 10 * i));
  op(&s, 'e');
  get(&s, 10 + 10 + 4);   /* C(2)'s Size */
  get(&s, 3);             /* the key "v", made in the first window */
  op(&s, 0x86), op(&s, 'a');
  op(&s, '.');
  sink_ctx c = {0};
  zck_pk_doc *doc = load(&s, &c, ZCK_OK, NULL);
  ZT_ASSERT(c.n == 3 && c.checked > 0);
  for (uint32_t i = 0; i < 3; i++) ZT_ASSERT(c.r[i].v == i + 1 && c.r[i].s0 == i + 1 && c.r[i].s1 == 2 * (i + 1));
  const zck_pk *l = zck_pk_doc_root(doc);
  ZT_ASSERT(l->kind == ZCK_PK_LIST && l->u.seq.len == 4);
  for (uint32_t i = 0; i < 3; i++) {
    const zck_pk *o = l->u.seq.items[i];
    ZT_ASSERT(o->kind == ZCK_PK_OBJECT && o->tag == ZCK_PK_TAG_CONSUMED && !o->u.obj.state && o->u.obj.sink_handle == i);
  }
  const zck_pk *t = l->u.seq.items[3];
  ZT_ASSERT(t->kind == ZCK_PK_TUPLE && t->u.seq.len == 2);
  const zck_pk *sz = t->u.seq.items[0];
  ZT_ASSERT(sz->kind == ZCK_PK_TUPLE && sz->tag == ZCK_PK_TAG_TORCH_SIZE && sz->u.seq.len == 2 &&
            sz->u.seq.items[0]->u.i == 2 && sz->u.seq.items[1]->u.i == 4);
  ZT_ASSERT(!strcmp(zck_pk_as_str(t->u.seq.items[1]), "v"));
  zck_pk_doc_free(doc);

  /* ten objects cost nine nodes more than one: their objects, not their trees */
  size_t nodes[2];
  for (int k = 0; k < 2; k++) {
    stream m = {0};
    header(&m);
    op(&m, ']'), put(&m, 5);
    op(&m, '(');
    for (unsigned char i = 0; i < (k ? 10 : 1); i++) object(&m, (unsigned char)(i + 1), (unsigned char)(10 + 10 * i));
    op(&m, 'e'), op(&m, '.');
    sink_ctx cm = {0};
    doc = load(&m, &cm, ZCK_OK, NULL);
    ZT_ASSERT(cm.n == (k ? 10u : 1u) && cm.r[cm.n - 1].s1 == 2 * cm.n);
    nodes[k] = zck_pk_doc_node_count(doc);
    zck_pk_doc_free(doc);
  }
  if (nodes[1] != nodes[0] + 9) ZT_FAIL("1 object: %zu nodes, 10 objects: %zu", nodes[0], nodes[1]);

  /* a GET of a consumed object's state: refused in one line */
  stream g = {0};
  header(&g);
  op(&g, ']'), put(&g, 5);
  op(&g, '(');
  object(&g, 1, 10);
  get(&g, 11);   /* its state dict */
  op(&g, 'e'), op(&g, '.');
  sink_ctx cg = {0};
  load(&g, &cg, ZCK_ERR_FORMAT, "part of an object already read");

  /* a global the sink refuses, made inside an object: refused before it is freed */
  stream h = {0};
  header(&h);
  get(&h, 2), op(&h, ')'), op(&h, 0x81);
  op(&h, '}'), str(&h, "x"), global(&h, "os", "system"), op(&h, 's'), op(&h, 'b'), op(&h, '.');
  sink_ctx ch = {0};
  load(&h, &ch, ZCK_ERR_FORMAT, "os refused");

  /* a node made for an object put into a list made before it: refused (the list could
   * change it after the sink read it) */
  stream e = {0};
  header(&e);
  op(&e, ']'), put(&e, 5), op(&e, '0');   /* an outer list, memoized */
  op(&e, ']'), put(&e, 6);                /* the result list */
  op(&e, '(');
  get(&e, 2), op(&e, ')'), op(&e, 0x81), put(&e, 10);
  get(&e, 5), str(&e, "kept"), op(&e, 'a'), op(&e, '0');   /* outer.append("kept") inside the window */
  op(&e, '}');
  str(&e, "v"), put(&e, 3), int1(&e, 9), op(&e, 's');
  str(&e, "s"), put(&e, 4), size2(&e, 9, 9, 12), op(&e, 's');
  op(&e, 'b');
  get(&e, 5);
  op(&e, 'e'), op(&e, '.');
  sink_ctx ce = {0};
  load(&e, &ce, ZCK_ERR_FORMAT, "reached from outside it");

  /* a consumed object given state again: refused */
  stream b = {0};
  header(&b);
  op(&b, ']'), put(&b, 5);
  op(&b, '(');
  object(&b, 1, 10);
  op(&b, '}'), op(&b, 'b');
  op(&b, 'e'), op(&b, '.');
  sink_ctx cb = {0};
  load(&b, &cb, ZCK_ERR_FORMAT, "already read is changed");
  return 0;
}
