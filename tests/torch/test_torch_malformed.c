/* test_torch_malformed.c: one crafted .pt per way a torch.save file can be malformed (the
 * archive, persistent ids and storages, tensor geometry), each expecting its one-line
 * error naming the file, plus the odd but valid inputs torch accepts too. Files are built
 * with the zip writer and hand-made pickle trees, so each differs from a valid file in
 * one thing. */
#include "test.h"
#include <unistd.h>
#include "torch/torch.h"

static char *g_dir;
static int g_count;

typedef struct entry { const char *name; const void *data; size_t n; } entry;

static char *write_zip(const entry *e, size_t n) {
  char *path = NULL;
  ZT_ASSERT(asprintf(&path, "%s/m%d.pt", g_dir, g_count++) > 0);
  zck__outfile out;
  ZT_OK(zck__outfile_create(&out, path));
  zck_zip_writer *w;
  ZT_OK(zck_zip_writer_create(&out, &w));
  for (size_t i = 0; i < n; i++) ZT_OK(zck_zip_writer_add(w, e[i].name, e[i].data, e[i].n));
  ZT_OK(zck_zip_writer_finish(w));
  zck_zip_writer_free(w);
  ZT_OK(zck__outfile_commit(&out));
  return path;
}

/* ---- a tensor spec; each case changes one field from the valid default */
typedef struct spec {
  const char *fn;                      /* torch._utils.<fn> */
  const char *first;                   /* pid[0] */
  const char *cls;                     /* storage class (module torch) */
  int key_kind;                        /* 0 str, 1 int, 2 None */
  const char *key;
  int loc_int;                         /* location given as an int */
  const char *loc;
  int64_t numel;                       /* pid numel */
  int pid_len;                         /* 5; other values pad or cut */
  int64_t off;
  int ndim, stride_ndim;
  int64_t size[3], stride[3];
  int size_str;                        /* size[0] given as a str */
  int hooks;                           /* 0 empty OrderedDict, 1 None, 2 non-empty */
  int nargs;                           /* 6 for v2 */
  const char *v3_dtype;                /* for _rebuild_tensor_v3 */
  uint64_t record_bytes;               /* size of data/<key>; default numel * 4 */
  int no_record;
} spec;

static spec def(void) {
  spec s = {"_rebuild_tensor_v2", "storage", "FloatStorage", 0, "0", 0, "cpu", 6, 5, 0, 2, 2, {2, 3}, {3, 1}, 0, 0, 6,
            NULL, 24, 0};
  return s;
}

static zck_pk *tensor_node(zck_pk_doc *d, const spec *s) {
  zck_pk *pid = zck_pk_new_tuple(d, 0);
  zck_pk_append(d, pid, zck_pk_new_str(d, s->first));
  zck_pk_append(d, pid, strchr(s->cls, '.') ? zck_pk_new_global(d, "torch.storage", strchr(s->cls, '.') + 1)
                                            : zck_pk_new_global(d, "torch", s->cls));
  zck_pk_append(d, pid, s->key_kind == 0 ? zck_pk_new_str(d, s->key) : s->key_kind == 1 ? zck_pk_new_int(d, atoi(s->key))
                                                                                         : zck_pk_new_none(d));
  zck_pk_append(d, pid, s->loc_int ? zck_pk_new_int(d, 0) : zck_pk_new_str(d, s->loc));
  zck_pk_append(d, pid, zck_pk_new_int(d, s->numel));
  while ((int)pid->u.seq.len < s->pid_len) zck_pk_append(d, pid, zck_pk_new_none(d));
  if ((int)pid->u.seq.len > s->pid_len) pid->u.seq.len = (size_t)s->pid_len;
  zck_pk *args = zck_pk_new_tuple(d, 0);
  zck_pk_append(d, args, zck_pk_new_persid(d, pid));
  zck_pk_append(d, args, zck_pk_new_int(d, s->off));
  zck_pk *sz = zck_pk_new_tuple(d, 0), *st = zck_pk_new_tuple(d, 0);
  for (int i = 0; i < s->ndim; i++)
    zck_pk_append(d, sz, i == 0 && s->size_str ? zck_pk_new_str(d, "2") : zck_pk_new_int(d, s->size[i]));
  for (int i = 0; i < s->stride_ndim; i++) zck_pk_append(d, st, zck_pk_new_int(d, s->stride[i]));
  zck_pk_append(d, args, sz);
  zck_pk_append(d, args, st);
  zck_pk_append(d, args, zck_pk_new_bool(d, 0));
  zck_pk *hooks = s->hooks == 1 ? zck_pk_new_none(d) : zck_pk_new_dict(d, 1);
  if (s->hooks == 2) zck_pk_dict_set(d, hooks, zck_pk_new_int(d, 0), zck_pk_new_none(d));
  zck_pk_append(d, args, hooks);
  if (s->v3_dtype) zck_pk_append(d, args, zck_pk_new_global(d, "torch", s->v3_dtype));
  if ((int)args->u.seq.len > s->nargs) args->u.seq.len = (size_t)s->nargs;
  return zck_pk_new_object(d, zck_pk_new_global(d, "torch._utils", s->fn), args, 0, NULL);
}

/* A file holding {"t": tensors[0], "u": tensors[1], ...}; extra entries appended. */
static char *spec_file(const spec *specs, int n, const entry *extra, size_t nextra) {
  zck_pk_doc *d = zck_pk_doc_new();
  zck_pk *root = zck_pk_new_dict(d, 1);
  for (int i = 0; i < n; i++) {
    char name[8] = {(char)('t' + i), 0};
    zck_pk_dict_set(d, root, zck_pk_new_str(d, name), tensor_node(d, &specs[i]));
  }
  zck__buf pkl;
  zck__buf_init(&pkl);
  ZT_OK(zck_pickle_dump(root, &pkl));
  static uint8_t zeros[4096];
  entry e[16];
  size_t ne = 0;
  e[ne++] = (entry){"archive/data.pkl", pkl.data, pkl.len};
  char names[4][64];
  for (int i = 0; i < n && i < 4; i++) {
    if (specs[i].no_record || specs[i].key_kind == 2) continue;
    snprintf(names[i], sizeof names[i], "archive/data/%s", specs[i].key);
    int dup = 0;
    for (size_t k = 0; k < ne; k++) dup |= !strcmp(e[k].name, names[i]);
    if (!dup) e[ne++] = (entry){names[i], zeros, (size_t)specs[i].record_bytes};
  }
  e[ne++] = (entry){"archive/version", "3\n", 2};
  for (size_t i = 0; i < nextra; i++) e[ne++] = extra[i];
  char *path = write_zip(e, ne);
  zck__buf_free(&pkl);
  zck_pk_doc_free(d);
  return path;
}

static zck_status open_path(const char *path) {
  zck_torch_file *f = NULL;
  zck_status s = zck_torch_open(path, NULL, &f);
  if (s == ZCK_OK) {   /* an accepted file reads all its tensors */
    for (size_t i = 0; i < zck_torch_tensor_count(f) && s == ZCK_OK; i++) {
      const zck_torch_tensor *t = zck_torch_tensor_at(f, i);
      uint8_t *buf = malloc(zck_torch_tensor_nbytes(t) + 1);
      s = zck_torch_tensor_read(f, t, buf, 0, t->numel);
      free(buf);
    }
  }
  zck_torch_close(f);
  return s;
}

#define EXPECT_SPECS(specs, n, status, needle) do { \
    char *p_ = spec_file(specs, n, NULL, 0); ZT_ERR(open_path(p_), status, needle); free(p_); } while (0)
#define EXPECT1(s, status, needle) EXPECT_SPECS(&(s), 1, status, needle)
#define ACCEPT1(s) do { char *p_ = spec_file(&(s), 1, NULL, 0); ZT_OK(open_path(p_)); free(p_); } while (0)

static void test_archive(void) {
  /* the legacy magic */
  static const uint8_t legacy[] = {0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19, 0x2e, 0x80};
  zck__source src;
  zck__source_memory(&src, "legacy.pt", legacy, sizeof legacy);
  zck_torch_file *f;
  ZT_ERR(zck_torch_open_source(&src, NULL, &f), ZCK_ERR_UNSUPPORTED, "legacy.pt: legacy torch serialization (pre-1.6");
  zck__source_close(&src);
  zck__source_memory(&src, "text.pt", "hello world, not a zip", 22);
  ZT_ERR(zck_torch_open_source(&src, NULL, &f), ZCK_ERR_FORMAT, "text.pt: not a torch.save file: does not start with a zip local header");
  zck__source_close(&src);
  zck__source_memory(&src, "p1.pt", "PYTORCH1xxxxxxxxxxxxxxxxxxxx", 28);
  ZT_ERR(zck_torch_open_source(&src, NULL, &f), ZCK_ERR_UNSUPPORTED, "p1.pt: a PYTORCH1 (TorchScript preview) file, not a torch.save file");
  zck__source_close(&src);
  zck__source_memory(&src, "short.pt", "PK", 2);
  ZT_ERR(zck_torch_open_source(&src, NULL, &f), ZCK_ERR_FORMAT, "short.pt: not a torch.save file");
  zck__source_close(&src);

  spec s = def();
  char *good = spec_file(&s, 1, NULL, 0);
  ZT_OK(open_path(good));
  free(good);
  static const uint8_t pkl_none[] = {0x80, 0x02, 'N', '.'};
  /* first entry not in a folder */
  entry t02[] = {{"data.pkl", pkl_none, 4}, {"version", "3\n", 2}};
  char *p = write_zip(t02, 2);
  ZT_ERR(open_path(p), ZCK_ERR_FORMAT, "first archive entry \"data.pkl\" is not in a folder, not a torch.save file");
  free(p);
  /* an entry outside the prefix */
  entry t03[] = {{"archive/data.pkl", pkl_none, 4}, {"archive/version", "3\n", 2}, {"other/x", "x", 1}};
  p = write_zip(t03, 3);
  ZT_ERR(open_path(p), ZCK_ERR_FORMAT, "entry \"other/x\" is outside the archive folder \"archive/\"");
  free(p);
  /* no version record */
  entry t04[] = {{"archive/data.pkl", pkl_none, 4}};
  p = write_zip(t04, 1);
  ZT_ERR(open_path(p), ZCK_ERR_FORMAT, "record archive/version is missing");
  free(p);
  /* version not a number, or out of 1..10 */
  entry t05a[] = {{"archive/data.pkl", pkl_none, 4}, {"archive/version", "abc", 3}};
  p = write_zip(t05a, 2);
  ZT_ERR(open_path(p), ZCK_ERR_FORMAT, "archive/version is not a number");
  free(p);
  entry t05b[] = {{"archive/data.pkl", pkl_none, 4}, {"archive/version", "11\n", 3}};
  p = write_zip(t05b, 2);
  ZT_ERR(open_path(p), ZCK_ERR_FORMAT, "file format version 11 is outside the readable range 1..10");
  free(p);
  entry t05c[] = {{"archive/data.pkl", pkl_none, 4}, {"archive/.data/version", "6\n", 2}};   /* accepted */
  p = write_zip(t05c, 2);
  ZT_OK(open_path(p));
  free(p);
  /* byteorder not little / big; big unsupported */
  entry t06[] = {{"archive/data.pkl", pkl_none, 4}, {"archive/byteorder", "little\n", 7}, {"archive/version", "3\n", 2}};
  p = write_zip(t06, 3);
  ZT_ERR(open_path(p), ZCK_ERR_FORMAT, "byteorder record is not \"little\" or \"big\"");
  free(p);
  t06[1] = (entry){"archive/byteorder", "big", 3};
  p = write_zip(t06, 3);
  ZT_ERR(open_path(p), ZCK_ERR_UNSUPPORTED, "big-endian torch files are not supported");
  free(p);
  /* no data.pkl */
  entry t07[] = {{"archive/version", "3\n", 2}};
  p = write_zip(t07, 1);
  ZT_ERR(open_path(p), ZCK_ERR_FORMAT, "record archive/data.pkl is missing");
  free(p);
  /* TorchScript */
  entry t08[] = {{"archive/data.pkl", pkl_none, 4}, {"archive/constants.pkl", pkl_none, 4}, {"archive/version", "3\n", 2}};
  p = write_zip(t08, 3);
  ZT_ERR(open_path(p), ZCK_ERR_UNSUPPORTED, "TorchScript archive (has constants.pkl), not a torch.save file");
  free(p);
  /* .format_version present: accepted (we read local headers, not computed offsets) */
  entry t09[] = {{"archive/.format_version", "1", 1}};
  p = spec_file(&s, 1, t09, 1);
  ZT_OK(open_path(p));
  free(p);
  /* a malformed data.pkl reports the file, the record and the byte */
  static const uint8_t trunc[] = {0x80, 0x02, 'X', 9, 0, 0, 0, 'a'};
  entry tp[] = {{"archive/data.pkl", trunc, sizeof trunc}, {"archive/version", "3\n", 2}};
  p = write_zip(tp, 2);
  ZT_ERR(open_path(p), ZCK_ERR_FORMAT, ".pt: archive/data.pkl: byte 2: BINUNICODE: truncated");
  free(p);
}

static void test_storages(void) {
  spec s;
  s = def(); s.first = "notstorage";
  EXPECT1(s, ZCK_ERR_FORMAT, "t: persistent id is not a ('storage', ...) tuple");
  s = def(); s.pid_len = 6;
  EXPECT1(s, ZCK_ERR_FORMAT, "persistent id has 6 items, expected 5 (a TorchScript pickle?)");
  s = def(); s.pid_len = 4;
  EXPECT1(s, ZCK_ERR_FORMAT, "persistent id has 4 items, expected 5");
  s = def(); s.cls = "FooStorage";
  EXPECT1(s, ZCK_ERR_FORMAT, "unknown storage type torch.FooStorage");
  s = def(); s.cls = "QInt8Storage"; s.record_bytes = 6;
  EXPECT1(s, ZCK_ERR_UNSUPPORTED, "quantized storage QInt8Storage is not supported");
  s = def(); s.key_kind = 2;
  EXPECT1(s, ZCK_ERR_FORMAT, "storage key is a None, not a str or int");
  s = def(); s.loc_int = 1;
  EXPECT1(s, ZCK_ERR_FORMAT, "storage '0': location is not a str");
  s = def(); s.numel = -1;
  EXPECT1(s, ZCK_ERR_FORMAT, "storage '0': numel is not a non-negative int");
  s = def(); s.key_kind = 1;   /* an int key is valid */
  ACCEPT1(s);
  s = def(); s.no_record = 1;
  EXPECT1(s, ZCK_ERR_FORMAT, "storage '0': record archive/data/0 is missing");
  /* torch 1.13 reads out of bounds here */
  s = def(); s.record_bytes = 8;
  EXPECT1(s, ZCK_ERR_FORMAT, "storage '0': record has 8 bytes, but 6 x float32 needs 24");
  s = def(); s.record_bytes = 28;
  EXPECT1(s, ZCK_ERR_FORMAT, "storage '0': record has 28 bytes, but 6 x float32 needs 24");
  /* the same key as two types */
  spec two[2] = {def(), def()};
  two[1].cls = "IntStorage";
  EXPECT_SPECS(two, 2, ZCK_ERR_FORMAT, "u: storage '0' used as IntStorage x 6 after float32 x 6");
  two[1] = def();
  two[1].numel = 12;
  EXPECT_SPECS(two, 2, ZCK_ERR_FORMAT, "storage '0' used as FloatStorage x 12 after float32 x 6");
  /* cuda locations are CPU bytes */
  s = def(); s.loc = "cuda:3";
  ACCEPT1(s);
}

static void test_geometry(void) {
  spec s;
  s = def(); s.nargs = 5;
  EXPECT1(s, ZCK_ERR_FORMAT, "t: tensor rebuild call with 5 arguments, expected 6");
  s = def(); s.fn = "_rebuild_parameter"; s.nargs = 3;
  EXPECT1(s, ZCK_ERR_FORMAT, "parameter data is not a tensor");
  s = def(); s.stride_ndim = 1;
  EXPECT1(s, ZCK_ERR_FORMAT, "size has 2 dimensions but stride 1");
  s = def(); s.size_str = 1;
  EXPECT1(s, ZCK_ERR_FORMAT, "size or stride 0 is not an int");
  s = def(); s.ndim = s.stride_ndim = 1; s.size[0] = 6; s.stride[0] = -1;
  EXPECT1(s, ZCK_ERR_FORMAT, "negative size or stride in dimension 0 (6, -1)");
  s = def(); s.size[1] = -3;
  EXPECT1(s, ZCK_ERR_FORMAT, "negative size or stride in dimension 1");
  s = def(); s.off = -1;
  EXPECT1(s, ZCK_ERR_FORMAT, "negative storage offset -1");
  s = def(); s.size[0] = (int64_t)1 << 62; s.size[1] = (int64_t)1 << 62;
  EXPECT1(s, ZCK_ERR_FORMAT, "size / stride arithmetic overflows");
  s = def(); s.size[0] = 2; s.stride[0] = INT64_MAX;
  EXPECT1(s, ZCK_ERR_FORMAT, "size / stride arithmetic overflows");
  s = def(); s.numel = INT64_MAX;
  EXPECT1(s, ZCK_ERR_FORMAT, "elements overflow a byte count");
  s = def(); s.off = 1;
  EXPECT1(s, ZCK_ERR_FORMAT, "view needs 7 elements of storage '0' (offset 1), which has 24 bytes = 6 elements");
  s = def(); s.stride[0] = 4;
  EXPECT1(s, ZCK_ERR_FORMAT, "view needs");
  s = def(); s.fn = "_rebuild_tensor_v3"; s.cls = "storage.UntypedStorage"; s.numel = 24; s.nargs = 7; s.v3_dtype = "notadtype";
  EXPECT1(s, ZCK_ERR_FORMAT, "tensor dtype is not a known torch dtype");
  s.v3_dtype = "complex32";
  EXPECT1(s, ZCK_ERR_UNSUPPORTED, "dtype torch.complex32 is not supported");
  s.v3_dtype = "float32";
  ACCEPT1(s);
  s = def(); s.hooks = 1;
  EXPECT1(s, ZCK_ERR_FORMAT, "backward_hooks is not an empty OrderedDict");
  s = def(); s.hooks = 2;
  EXPECT1(s, ZCK_ERR_FORMAT, "backward_hooks is not an empty OrderedDict");
  /* a view smaller than its storage, shared storages, an offset: accepted */
  spec two[2] = {def(), def()};
  two[0].ndim = two[0].stride_ndim = 1; two[0].size[0] = 2; two[0].stride[0] = 2; two[0].off = 3;
  char *p = spec_file(two, 2, NULL, 0);
  ZT_OK(open_path(p));
  zck_torch_file *f;
  ZT_OK(zck_torch_open(p, NULL, &f));
  ZT_EQ_INT(zck_torch_storage_count(f), 1);
  ZT_EQ_INT(zck_torch_tensor_count(f), 2);
  zck_torch_close(f);
  free(p);
  /* numel 0 with an offset inside the storage */
  s = def(); s.size[0] = 0; s.off = 6;
  ACCEPT1(s);
  s = def(); s.size[0] = 0; s.off = 7;
  EXPECT1(s, ZCK_ERR_FORMAT, "view needs");
}

/* A shared 10-ary DAG 40 levels deep under a None key (no state dict name reaches it):
 * 10^40 paths in 1 KB of pickle. inspect walked every path (issue 13.7);
 * the alarm makes a regression fail instead of hanging the suite. */
static void test_shared_dag(void) {
  zck__buf b;
  zck__buf_init(&b);
  /* {'a': 1, None: node40}: node0 = [] (memo 0), nodeL = [nodeL-1] * 10 (memo L) */
  zck__buf_append(&b, "\x80\x02}(X\x01\x00\x00\x00" "aK\x01N]q\x00", 16);
  for (int level = 1; level <= 40; level++) {
    zck__buf_append(&b, "0(", 2); /* POP the previous node (it is in the memo) */
    for (int i = 0; i < 10; i++) { zck__buf_byte(&b, 'h'); zck__buf_byte(&b, (uint8_t)(level - 1)); }
    zck__buf_byte(&b, 'l');
    zck__buf_byte(&b, 'q');
    zck__buf_byte(&b, (uint8_t)level);
  }
  zck__buf_append(&b, "u.", 2);
  ZT_ASSERT(!b.failed && b.len < 1100);
  entry e[] = {{"archive/data.pkl", b.data, b.len}, {"archive/version", "3\n", 2}};
  char *p = write_zip(e, 2);
  FILE *out = fopen("/dev/null", "w");
  ZT_ASSERT(out);
  zck_inspect_opts o = ZCK_INSPECT_OPTS_INIT;
  alarm(60);
  ZT_OK(zck_inspect(p, &o, out));
  o.json = 1;
  ZT_OK(zck_inspect(p, &o, out));
  alarm(0);
  fclose(out);
  free(p);
  zck__buf_free(&b);
}

int main(void) {
  g_dir = zt_tmpdir();
  test_archive();
  test_storages();
  test_geometry();
  test_shared_dag();
  printf("%d malformed .pt files checked\n", g_count);
  free(g_dir);
  return 0;
}
