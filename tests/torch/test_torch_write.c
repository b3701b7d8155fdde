/* test_torch_write.c: write -> read round trips of the .pt writer: every dtype, views of
 * one storage (transpose, slice, scalar), empty tensors, Parameters, nested containers,
 * out-of-order writes with set_crc; the archive's CRCs, alignment and prefix; the writer's
 * own naming of its tensors (zck_torch_writer_named) against the reader's, and a tree
 * sealed (pickled and freed) before finish; and the
 * writer's misuse errors (incomplete data, views that do not fit, abort on free). */
#include "test.h"
#include "torch/torch.h"

#include <sys/stat.h>
#include <unistd.h>

static void fill(uint8_t *p, size_t n, zck_dtype t, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed * 31 + i * 7 + 1);
  if (t == ZCK_BOOL)
    for (size_t i = 0; i < n; i++) p[i] &= 1;
}

static const zck_torch_tensor *find(zck_torch_named *v, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(v[i].name, name)) return v[i].tensor;
  ZT_FAIL("tensor %s not found", name);
}

static void check_data(zck_torch_file *f, const zck_torch_tensor *t, const uint8_t *want, size_t nbytes) {
  ZT_EQ_U64(zck_torch_tensor_nbytes(t), nbytes);
  uint8_t *got = malloc(nbytes + 1);
  ZT_OK(zck_torch_tensor_read(f, t, got, 0, t->numel));
  ZT_EQ_MEM(got, want, nbytes);
  free(got);
}

static const zck_dtype all_types[] = {ZCK_F64, ZCK_F32, ZCK_F16, ZCK_BF16, ZCK_I64, ZCK_I32, ZCK_I16, ZCK_I8, ZCK_U8,
                                      ZCK_BOOL, ZCK_C64, ZCK_C128, ZCK_U16, ZCK_U32, ZCK_U64, ZCK_F8_E4M3, ZCK_F8_E5M2};
#define NTYPES (sizeof all_types / sizeof *all_types)

static void test_roundtrip(const char *dir) {
  char *path = NULL;
  ZT_ASSERT(asprintf(&path, "%s/rt.pt", dir) > 0);
  zck_torch_writer *w;
  ZT_OK(zck_torch_writer_create(path, &w));
  zck_pk_doc *d = zck_torch_writer_doc(w);
  zck_pk *root = zck_pk_new_dict(d, 1);
  uint8_t data[NTYPES][12 * 16];
  int64_t shape34[2] = {3, 4};
  for (size_t i = 0; i < NTYPES; i++) {
    zck_dtype t = all_types[i];
    size_t si, es = zck_dtype_size(t);
    uint64_t off;
    ZT_OK(zck_torch_writer_add_storage(w, t, 12, &si, &off));
    ZT_EQ_U64(off % 64, 0);
    fill(data[i], 12 * es, t, (unsigned)i);
    ZT_OK(zck_torch_writer_write(w, si, data[i], 5 * es, 0));   /* two pieces, in order */
    ZT_OK(zck_torch_writer_write(w, si, data[i] + 5 * es, 7 * es, 5 * es));
    zck_pk *tn = zck_torch_writer_tensor(w, si, 2, shape34, NULL, 0, 0);
    ZT_ASSERT(tn);
    ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, zck_dtype_name(t)), tn));
    if (t == ZCK_F32) {   /* views of the same storage */
      int64_t tshape[2] = {4, 3}, tstride[2] = {1, 4}, slice = 4, none = 0;
      ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "f32_t"), zck_torch_writer_tensor(w, si, 2, tshape, tstride, 0, 0)));
      ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "f32_slice"), zck_torch_writer_tensor(w, si, 1, &slice, NULL, 4, 0)));
      ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "f32_scalar"), zck_torch_writer_tensor(w, si, 0, NULL, NULL, 5, 0)));
      ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "f32_same"), tn));   /* the same tensor again */
      (void)none;
    }
  }
  /* empty tensor on an empty storage; a Parameter; an out-of-order storage */
  size_t se, sp, so;
  uint64_t off;
  int64_t e_shape[2] = {0, 5}, p_shape = 4, o_shape = 8;
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_BF16, 0, &se, &off));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "empty"), zck_torch_writer_tensor(w, se, 2, e_shape, NULL, 0, 0)));
  float pdata[4] = {1, -2, 3.5f, 4};
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_F32, 4, &sp, &off));
  ZT_OK(zck_torch_writer_write(w, sp, pdata, sizeof pdata, 0));
  zck_pk *param = zck_torch_writer_parameter(w, zck_torch_writer_tensor(w, sp, 1, &p_shape, NULL, 0, 0), 1);
  ZT_ASSERT(param);
  int64_t odata[8] = {1, 2, 3, 4, -5, -6, 1LL << 40, INT64_MIN};
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_I64, 8, &so, &off));
  ZT_OK(zck_torch_writer_write(w, so, odata + 4, 32, 32));
  ZT_OK(zck_torch_writer_write(w, so, odata, 32, 0));
  zck_torch_writer_set_crc(w, so, zck_crc32_combine(zck_crc32(0, odata, 32), zck_crc32(0, odata + 4, 32), 32));
  /* nested containers as an optimizer state has them */
  zck_pk *opt = zck_pk_new_dict(d, 0), *state = zck_pk_new_dict(d, 0), *st0 = zck_pk_new_dict(d, 0), *lst = zck_pk_new_list(d);
  ZT_ASSERT(zck_pk_dict_set(d, st0, zck_pk_new_str(d, "exp_avg"), zck_torch_writer_tensor(w, so, 1, &o_shape, NULL, 0, 0)));
  ZT_ASSERT(zck_pk_dict_set(d, state, zck_pk_new_int(d, 0), st0));
  ZT_ASSERT(zck_pk_dict_set(d, opt, zck_pk_new_str(d, "state"), state));
  ZT_ASSERT(zck_pk_dict_set(d, opt, zck_pk_new_str(d, "lr"), zck_pk_new_float(d, 0.5)));
  ZT_ASSERT(zck_pk_append(d, lst, param));
  ZT_ASSERT(zck_pk_dict_set(d, opt, zck_pk_new_str(d, "params"), lst));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "opt"), opt));
  /* the writer names its tensors as a reader of the file will (kept: the records go with
   * the tree), then pickles and frees the tree before finish */
  zck_torch_named *wv;
  size_t wn;
  ZT_OK(zck_torch_writer_named(w, root, &wv, &wn));
  struct { char name[32]; zck_dtype dtype; int ndim; int64_t dims[4]; uint64_t storage_offset, file_offset; bool param; } wt[64];
  ZT_ASSERT(wn <= 64);
  for (size_t i = 0; i < wn; i++) {
    const zck_torch_tensor *t = wv[i].tensor;
    snprintf(wt[i].name, sizeof wt[i].name, "%s", wv[i].name);
    wt[i].dtype = t->dtype, wt[i].ndim = t->ndim, wt[i].storage_offset = t->storage_offset;
    wt[i].file_offset = zck_torch_writer_tensor_offset(w, t), wt[i].param = t->is_parameter;
    for (int k = 0; k < t->ndim; k++) wt[i].dims[k] = t->shape[k], wt[i].dims[2 + k] = t->stride[k];
  }
  zck_torch_named_free(wv, wn);
  ZT_OK(zck_torch_writer_seal(w, root));
  ZT_ASSERT(!zck_torch_writer_doc(w));
  ZT_OK(zck_torch_writer_finish(w, NULL));
  zck_torch_writer_free(w);

  zck_torch_file *f;
  ZT_OK(zck_torch_open(path, NULL, &f));
  ZT_EQ_STR(zck_torch_prefix(f), "rt"); /* the file stem, as torch.save names it */
  ZT_OK(zck_torch_check_weights_only(f));
  const zck_zip *z = zck_torch_zip(f);
  for (size_t i = 0; i < zck_zip_count(z); i++) {   /* every CRC is right */
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    uint8_t *buf = malloc(e->size + 1);
    ZT_OK(zck_zip_read_entry(z, e, buf));
    ZT_EQ_U64(e->data_offset % 64, 0);
    free(buf);
  }
  zck_torch_named *v;
  size_t n;
  ZT_OK(zck_torch_state_dict(f, zck_torch_root(f), &v, &n));
  ZT_EQ_INT(n, NTYPES + 4 + 1 + 2);
  ZT_EQ_INT(wn, n);
  for (size_t i = 0; i < n; i++) { /* the writer's names: the reader's, in its order, the same views */
    const zck_torch_tensor *t = v[i].tensor;
    ZT_EQ_STR(wt[i].name, v[i].name);
    ZT_EQ_INT(wt[i].dtype, t->dtype);
    ZT_EQ_INT(wt[i].ndim, t->ndim);
    ZT_EQ_U64(wt[i].storage_offset, t->storage_offset);
    ZT_EQ_U64(wt[i].file_offset, zck_torch_tensor_file_offset(f, t));
    ZT_EQ_INT(wt[i].param, t->is_parameter);
    for (int k = 0; k < t->ndim; k++) {
      ZT_EQ_INT(wt[i].dims[k], t->shape[k]);
      ZT_EQ_INT(wt[i].dims[2 + k], t->stride[k]);
    }
  }
  for (size_t i = 0; i < NTYPES; i++) {
    const zck_torch_tensor *t = find(v, n, zck_dtype_name(all_types[i]));
    ZT_EQ_INT(t->dtype, all_types[i]);
    ZT_EQ_INT(t->ndim, 2);
    ZT_EQ_INT(t->shape[0], 3);
    ZT_EQ_INT(t->stride[0], 4);
    ZT_ASSERT(zck_torch_tensor_contiguous(t));
    check_data(f, t, data[i], 12 * zck_dtype_size(all_types[i]));
  }
  size_t fi = 1;   /* ZCK_F32 */
  const zck_torch_tensor *tt = find(v, n, "f32_t");
  ZT_ASSERT(!zck_torch_tensor_contiguous(tt));
  float tr[12], *base = (float *)data[fi];
  for (int r = 0; r < 4; r++)
    for (int c = 0; c < 3; c++) tr[r * 3 + c] = base[c * 4 + r];
  check_data(f, tt, (uint8_t *)tr, sizeof tr);
  check_data(f, find(v, n, "f32_slice"), data[fi] + 16, 16);
  const zck_torch_tensor *sc = find(v, n, "f32_scalar");
  ZT_EQ_INT(sc->ndim, 0);
  ZT_EQ_U64(sc->numel, 1);
  check_data(f, sc, data[fi] + 20, 4);
  ZT_ASSERT(find(v, n, "f32_same")->storage == find(v, n, "float32")->storage);
  const zck_torch_tensor *em = find(v, n, "empty");
  ZT_EQ_U64(em->numel, 0);
  ZT_EQ_INT(em->shape[1], 5);
  const zck_torch_tensor *pt = find(v, n, "opt.params.0");
  ZT_ASSERT(pt->is_parameter && pt->requires_grad);
  check_data(f, pt, (uint8_t *)pdata, sizeof pdata);
  check_data(f, find(v, n, "opt.state.0.exp_avg"), (uint8_t *)odata, sizeof odata);
  double lr;
  ZT_ASSERT(zck_pk_as_double(zck_pk_dict_get(zck_pk_dict_get(zck_torch_root(f), "opt"), "lr"), &lr) && lr == 0.5);
  /* the Parameter is listed once (its inner tensor is not), storages once each */
  ZT_EQ_INT(zck_torch_tensor_count(f), NTYPES + 3 + 1 + 2);   /* f32_same is the float32 node */
  ZT_EQ_INT(zck_torch_storage_count(f), NTYPES + 3);
  zck_torch_named_free(v, n);
  zck_torch_close(f);
  free(path);
}

/* A tensor a reader lists by index only (inside an object's state): the writer cannot name
 * the file's tensors, and says so; the file itself is written as before. */
static void test_unnamed(const char *dir) {
  char *path = NULL;
  ZT_ASSERT(asprintf(&path, "%s/unnamed.pt", dir) > 0);
  zck_torch_writer *w;
  ZT_OK(zck_torch_writer_create(path, &w));
  zck_pk_doc *d = zck_torch_writer_doc(w);
  size_t si;
  uint64_t off;
  float x[2] = {1, 2};
  int64_t two = 2;
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_F32, 2, &si, &off));
  ZT_OK(zck_torch_writer_write(w, si, x, sizeof x, 0));
  zck_pk *state = zck_pk_new_dict(d, 0), *root = zck_pk_new_dict(d, 0);
  ZT_ASSERT(zck_pk_dict_set(d, state, zck_pk_new_str(d, "t"), zck_torch_writer_tensor(w, si, 1, &two, NULL, 0, 0)));
  zck_pk *obj = zck_pk_new_object(d, zck_pk_new_global(d, "m", "C"), zck_pk_new_tuple(d, 0), 1, state);
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "obj"), obj));
  zck_torch_named *v = NULL;
  size_t n = 0;
  ZT_ERR(zck_torch_writer_named(w, root, &v, &n), ZCK_ERR_NOT_FOUND, "1 tensors reached by no state-dict name");
  ZT_ASSERT(!v && !n);
  ZT_OK(zck_torch_writer_finish(w, root));
  zck_torch_writer_free(w);
  zck_torch_file *f;
  ZT_OK(zck_torch_open(path, NULL, &f));
  ZT_EQ_INT(zck_torch_tensor_count(f), 1);
  zck_torch_close(f);
  free(path);
}

/* Two paths to one name ("b.x" and b -> x): refused, naming the first such name in name
 * order whatever the insertion order (the check hashes first, then sorts to name it). */
static void test_duplicate_names(const char *dir) {
  char *path = NULL;
  ZT_ASSERT(asprintf(&path, "%s/dup.pt", dir) > 0);
  zck_torch_writer *w;
  ZT_OK(zck_torch_writer_create(path, &w));
  zck_pk_doc *d = zck_torch_writer_doc(w);
  size_t si;
  uint64_t off;
  int64_t one = 1;
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_F32, 4, &si, &off));
  zck_pk *root = zck_pk_new_dict(d, 0), *b = zck_pk_new_dict(d, 0), *a = zck_pk_new_dict(d, 0);
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "b.x"), zck_torch_writer_tensor(w, si, 1, &one, NULL, 0, 0)));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "a.y"), zck_torch_writer_tensor(w, si, 1, &one, NULL, 1, 0)));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "c"), zck_torch_writer_tensor(w, si, 1, &one, NULL, 2, 0)));
  ZT_ASSERT(zck_pk_dict_set(d, b, zck_pk_new_str(d, "x"), zck_torch_writer_tensor(w, si, 1, &one, NULL, 3, 0)));
  ZT_ASSERT(zck_pk_dict_set(d, a, zck_pk_new_str(d, "y"), zck_torch_writer_tensor(w, si, 1, &one, NULL, 3, 0)));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "b"), b));
  ZT_ASSERT(zck_pk_dict_set(d, root, zck_pk_new_str(d, "a"), a));
  zck_torch_named *v = NULL;
  size_t n = 0;
  ZT_ERR(zck_torch_writer_named(w, root, &v, &n), ZCK_ERR_FORMAT, "tensor name \"a.y\" occurs twice in the state dict");
  ZT_ASSERT(!v && !n);
  zck_torch_writer_free(w);
  free(path);
}

static void test_misuse(const char *dir) {
  char *path = NULL;
  ZT_ASSERT(asprintf(&path, "%s/bad.pt", dir) > 0);
  zck_torch_writer *w;
  ZT_OK(zck_torch_writer_create(path, &w));
  size_t si;
  uint64_t off;
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_F32, 6, &si, &off));
  int64_t big = 7, neg = -1;
  ZT_ASSERT(!zck_torch_writer_tensor(w, si, 1, &big, NULL, 0, 0));
  ZT_ERR(ZCK_ERR_INVALID_ARG, ZCK_ERR_INVALID_ARG, "does not fit storage 0 of 6 elements");
  ZT_ASSERT(!zck_torch_writer_tensor(w, si, 1, &neg, NULL, 0, 0));
  ZT_ASSERT(!zck_torch_writer_tensor(w, si, 1, &big, &neg, 0, 0));
  float x[8] = {0};
  ZT_ERR(zck_torch_writer_write(w, si, x, 32, 0), ZCK_ERR_INVALID_ARG, "bytes 0..32 written but it has 24");
  ZT_OK(zck_torch_writer_write(w, si, x, 8, 0));
  int64_t six = 6;
  zck_pk *t = zck_torch_writer_tensor(w, si, 1, &six, NULL, 0, 0);
  ZT_ERR(zck_torch_writer_finish(w, t), ZCK_ERR_INVALID_ARG, "storage 0: data not completely written and no CRC was set");
  zck_torch_writer_free(w);   /* nothing is left behind */
  struct stat st;
  ZT_ASSERT(stat(path, &st) != 0);
  free(path);
}

int main(void) {
  char *dir = zt_tmpdir();
  test_roundtrip(dir);
  test_unnamed(dir);
  test_duplicate_names(dir);
  test_misuse(dir);
  free(dir);
  printf("torch writer tests passed\n");
  return 0;
}
