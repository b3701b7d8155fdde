/* interop_tool.c: the C half of interop_torch.py.
 *   interop_tool write OUT.pt   writes a state dict of every dtype, views, a scalar, an empty
 *                               tensor, a Parameter and nested optimizer-like containers,
 *                               and prints a JSON manifest of what it wrote;
 *   interop_tool dump IN.pt     prints the same JSON manifest for any .pt (tensors named as
 *                               zck_torch_state_dict names them), plus the weights_only verdict. */
#include "sha256.h"
#include "test.h"
#include "torch/torch.h"

static const zck_dtype types[] = {ZCK_F64, ZCK_F32, ZCK_F16, ZCK_BF16, ZCK_I64, ZCK_I32, ZCK_I16, ZCK_I8, ZCK_U8,
                                  ZCK_BOOL, ZCK_C64, ZCK_C128, ZCK_U16, ZCK_U32, ZCK_U64, ZCK_F8_E4M3, ZCK_F8_E5M2};

static void print_tensor(zck_torch_file *f, const char *name, const zck_torch_tensor *t, int comma) {
  size_t nb = (size_t)zck_torch_tensor_nbytes(t);
  uint8_t *buf = malloc(nb + 1);
  ZT_OK(zck_torch_tensor_read(f, t, buf, 0, t->numel));
  char hex[65];
  zt_sha256_hex(buf, nb, hex);
  free(buf);
  printf("%s\n  \"%s\": {\"dtype\": \"%s\", \"shape\": [", comma ? "," : "", name, zck_dtype_name(t->dtype));
  for (int i = 0; i < t->ndim; i++) printf("%s%lld", i ? ", " : "", (long long)t->shape[i]);
  printf("], \"stride\": [");
  for (int i = 0; i < t->ndim; i++) printf("%s%lld", i ? ", " : "", (long long)t->stride[i]);
  printf("], \"storage_offset\": %llu, \"storage_key\": \"%s\", \"requires_grad\": %s, \"parameter\": %s, \"sha256\": \"%s\"}",
         (unsigned long long)t->storage_offset, zck_torch_tensor_storage(f, t)->key, t->requires_grad ? "true" : "false",
         t->is_parameter ? "true" : "false", hex);
}

static int dump(const char *path) {
  zck_torch_file *f;
  ZT_OK(zck_torch_open(path, NULL, &f));
  zck_torch_named *v;
  size_t n;
  ZT_OK(zck_torch_state_dict(f, zck_torch_root(f), &v, &n));
  printf("{\"weights_only\": ");
  if (zck_torch_check_weights_only(f) == ZCK_OK) printf("true");
  else {
    printf("\"");
    for (const char *p = zck_last_error(); *p; p++) if (*p != '"' && *p != '\\') putchar(*p);
    printf("\"");
  }
  printf(", \"tensors\": {");
  for (size_t i = 0; i < n; i++) print_tensor(f, v[i].name, v[i].tensor, i > 0);
  printf("\n}}\n");
  zck_torch_named_free(v, n);
  zck_torch_close(f);
  return 0;
}

static void fill(uint8_t *p, size_t n, zck_dtype t, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(seed * 31 + i * 7 + 1);
  if (t == ZCK_BOOL)
    for (size_t i = 0; i < n; i++) p[i] &= 1;
  if (t == ZCK_F32 || t == ZCK_F64 || t == ZCK_F16 || t == ZCK_BF16 || t == ZCK_C64 || t == ZCK_C128) {
    size_t comp = zck_dtype_size(t) / (t == ZCK_C64 || t == ZCK_C128 ? 2 : 1);
    for (size_t i = comp - 1; i < n; i += comp) p[i] &= 0x3f;   /* finite values, no NaN payloads */
  }
}

#define SET(d, dict, key, val) ZT_ASSERT(zck_pk_dict_set(d, dict, zck_pk_new_str(d, key), val))

static int write_file(const char *path, int simple) {
  zck_torch_writer *w;
  ZT_OK(zck_torch_writer_create(path, &w));
  zck_pk_doc *d = zck_torch_writer_doc(w);
  zck_pk *root = zck_pk_new_dict(d, 1);
  int64_t shape34[2] = {3, 4};
  size_t ntypes = simple ? 10 : sizeof types / sizeof *types;   /* simple: the 1.13 storage classes only */
  for (size_t i = 0; i < ntypes; i++) {
    zck_dtype t = types[i];
    size_t si, es = zck_dtype_size(t);
    uint64_t off;
    uint8_t data[12 * 16];
    ZT_OK(zck_torch_writer_add_storage(w, t, 12, &si, &off));
    fill(data, 12 * es, t, (unsigned)i);
    ZT_OK(zck_torch_writer_write(w, si, data, 12 * es, 0));
    zck_pk *tn = zck_torch_writer_tensor(w, si, 2, shape34, NULL, 0, 0);
    SET(d, root, zck_dtype_name(t), tn);
    if (t == ZCK_F32) {
      int64_t tshape[2] = {4, 3}, tstride[2] = {1, 4}, slice = 4, ex[2] = {2, 4}, exs[2] = {0, 1};
      SET(d, root, "f32_t", zck_torch_writer_tensor(w, si, 2, tshape, tstride, 0, 0));
      SET(d, root, "f32_slice", zck_torch_writer_tensor(w, si, 1, &slice, NULL, 4, 0));
      SET(d, root, "f32_scalar", zck_torch_writer_tensor(w, si, 0, NULL, NULL, 5, 0));
      SET(d, root, "f32_expanded", zck_torch_writer_tensor(w, si, 2, ex, exs, 8, 0));
      SET(d, root, "f32_same", tn);
    }
  }
  size_t s;
  uint64_t off;
  int64_t eshape[2] = {0, 5}, pshape = 4;
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_BF16, 0, &s, &off));
  SET(d, root, "empty", zck_torch_writer_tensor(w, s, 2, eshape, NULL, 0, 0));
  int32_t pdata[4] = {1, -2, 3, 4};
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_F32, 4, &s, &off));
  float pf[4];
  for (int i = 0; i < 4; i++) pf[i] = (float)pdata[i] * 0.5f;
  ZT_OK(zck_torch_writer_write(w, s, pf, sizeof pf, 0));
  SET(d, root, "param", zck_torch_writer_parameter(w, zck_torch_writer_tensor(w, s, 1, &pshape, NULL, 0, 0), 1));
  int64_t odata[6] = {1, 2, 3, -4, (int64_t)1 << 40, INT64_MIN}, oshape = 6;
  ZT_OK(zck_torch_writer_add_storage(w, ZCK_I64, 6, &s, &off));
  ZT_OK(zck_torch_writer_write(w, s, odata + 3, 24, 24));   /* out of order, with set_crc */
  ZT_OK(zck_torch_writer_write(w, s, odata, 24, 0));
  zck_torch_writer_set_crc(w, s, zck_crc32_combine(zck_crc32(0, odata, 24), zck_crc32(0, odata + 3, 24), 24));
  zck_pk *opt = zck_pk_new_dict(d, 0), *state = zck_pk_new_dict(d, 0), *st0 = zck_pk_new_dict(d, 0);
  SET(d, st0, "exp_avg", zck_torch_writer_tensor(w, s, 1, &oshape, NULL, 0, 0));
  ZT_ASSERT(zck_pk_dict_set(d, state, zck_pk_new_int(d, 0), st0));
  SET(d, opt, "state", state);
  SET(d, opt, "step", zck_pk_new_int(d, 10));
  SET(d, opt, "big", zck_pk_new_int(d, (int64_t)1 << 40));
  SET(d, opt, "flag", zck_pk_new_bool(d, 1));
  SET(d, opt, "none", zck_pk_new_none(d));
  zck_pk *names = zck_pk_new_list(d);
  ZT_ASSERT(zck_pk_append(d, names, zck_pk_new_str(d, "a")) && zck_pk_append(d, names, zck_pk_new_str(d, "b\xc3\xa9")));
  SET(d, opt, "names", names);
  if (!simple) {
    zck_pk *betas = zck_pk_new_tuple(d, 2);
    betas->u.seq.items[0] = zck_pk_new_float(d, 0.9);
    betas->u.seq.items[1] = zck_pk_new_float(d, 0.999);
    SET(d, opt, "betas", betas);
    SET(d, opt, "lr", zck_pk_new_float(d, 0.5));
  }
  SET(d, root, "opt", opt);
  ZT_OK(zck_torch_writer_finish(w, root));
  zck_torch_writer_free(w);
  return dump(path);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "dump")) return dump(argv[2]);
  if (argc == 3 && !strcmp(argv[1], "write")) return write_file(argv[2], 0);
  if (argc == 3 && !strcmp(argv[1], "write-simple")) return write_file(argv[2], 1);
  fprintf(stderr, "usage: interop_tool write|write-simple|dump FILE.pt\n");
  return 2;
}
