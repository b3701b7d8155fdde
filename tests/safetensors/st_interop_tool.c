/* st_interop_tool.c: the C side of interop_safetensors.py.
 *   st_interop_tool write DIR
 *       DIR/single/model.safetensors, DIR/hub/ (huggingface_hub-style shards + index) and
 *       DIR/sorted/ (transformers-style index), all of the same tensors, plus
 *       DIR/manifest.json: {name: {"dtype", "shape", "sha256"}} of what was written.
 *   st_interop_tool copy SRC DST MAX_SHARD_SIZE [hub|sorted]
 *       reads the HF checkpoint SRC and writes it again, sharded, to DST, copying the other
 *       regular files of SRC (config.json, ...). */
#include "test.h"
#include "safetensors/safetensors.h"
#include "st_test_util.h"

#include <dirent.h>
#include <sys/stat.h>

typedef struct { const char *name; zck_st_dtype dt; int ndim; uint64_t shape[3]; } item;

static const item items[] = {
  {"model.embed.weight", ZCK_ST_F32, 2, {6, 4}},
  {"model.layers.0.w64", ZCK_ST_F64, 1, {5}},
  {"model.layers.0.w16", ZCK_ST_F16, 2, {3, 3}},
  {"model.layers.0.bf", ZCK_ST_BF16, 2, {4, 5}},
  {"model.layers.1.i64", ZCK_ST_I64, 1, {4}},
  {"model.layers.1.i32", ZCK_ST_I32, 2, {2, 2}},
  {"model.layers.1.i16", ZCK_ST_I16, 1, {3}},
  {"model.layers.1.i8", ZCK_ST_I8, 1, {7}},
  {"model.layers.1.u8", ZCK_ST_U8, 1, {9}},
  {"model.layers.1.mask", ZCK_ST_BOOL, 2, {2, 3}},
  {"model.ext.u16", ZCK_ST_U16, 1, {3}},
  {"model.ext.u32", ZCK_ST_U32, 1, {3}},
  {"model.ext.u64", ZCK_ST_U64, 1, {3}},
  {"model.ext.f8a", ZCK_ST_F8_E4M3, 1, {8}},
  {"model.ext.f8b", ZCK_ST_F8_E5M2, 1, {8}},
  {"model.ext.cplx", ZCK_ST_C64, 1, {2}},
  {"model.scalar", ZCK_ST_F32, 0, {0}},
  {"model.scalar_i", ZCK_ST_I64, 0, {0}},
  {"model.empty", ZCK_ST_F32, 2, {0, 3}},
  {"model.empty_bf", ZCK_ST_BF16, 1, {0}},
  {"lm_head.weight", ZCK_ST_F32, 2, {6, 4}},
};
#define NITEMS (sizeof items / sizeof *items)

static uint64_t nbytes_of(const item *it) {
  uint64_t n = zck_st_dtype_bits(it->dt) / 8;
  for (int d = 0; d < it->ndim; d++) n *= it->shape[d];
  return n;
}

/* Deterministic bytes that are valid for the type (bool 0/1, floats without NaN patterns
 * for readability; any bytes would do for the byte-level comparison). */
static void fill(const item *it, size_t k, uint8_t *buf, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) buf[i] = (uint8_t)(k * 13 + i * 7 + 1);
  if (it->dt == ZCK_ST_BOOL)
    for (uint64_t i = 0; i < n; i++) buf[i] &= 1;
  if (it->dt == ZCK_ST_F8_E4M3 || it->dt == ZCK_ST_F8_E5M2)
    for (uint64_t i = 0; i < n; i++) buf[i] &= 0x3f;
}

static void write_manifest(const char *dir) {
  char *p = zck__path_join(dir, "manifest.json");
  FILE *f = fopen(p, "w");
  fprintf(f, "{");
  for (size_t k = 0; k < NITEMS; k++) {
    const item *it = &items[k];
    uint64_t n = nbytes_of(it);
    uint8_t buf[512];
    fill(it, k, buf, n);
    char hex[65];
    st_sha256_hex(buf, n, hex);
    fprintf(f, "%s\n \"%s\": {\"dtype\": \"%s\", \"shape\": [", k ? "," : "", it->name, zck_st_dtype_name(it->dt));
    for (int d = 0; d < it->ndim; d++) fprintf(f, "%s%llu", d ? ", " : "", (unsigned long long)it->shape[d]);
    fprintf(f, "], \"sha256\": \"%s\"}", hex);
  }
  fprintf(f, "\n}\n");
  fclose(f);
  free(p);
}

static void write_set(const char *dir, const char *sub, uint64_t max, zck_hf_index_style style) {
  char *out = zck__path_join(dir, sub);
  zck_hf_options o = ZCK_HF_OPTIONS_INIT;
  o.max_shard_size = max;
  o.style = style;
  zck_hf_writer *w;
  ZT_OK(zck_hf_writer_new(out, &o, &w));
  ZT_OK(zck_hf_writer_set_metadata(w, "producer", "zckpt interop"));
  for (size_t k = 0; k < NITEMS; k++) ZT_OK(zck_hf_writer_add(w, items[k].name, items[k].dt, items[k].ndim, items[k].shape, NULL));
  ZT_OK(zck_hf_writer_layout(w));
  for (size_t k = 0; k < NITEMS; k++) {
    uint64_t n = nbytes_of(&items[k]);
    uint8_t buf[512];
    fill(&items[k], k, buf, n);
    ZT_OK(zck_hf_writer_write(w, k, buf, 0, n));
  }
  ZT_OK(zck_hf_writer_commit(w));
  zck_hf_writer_free(w);
  free(out);
}

static int copy(const char *src, const char *dst, const char *max, const char *style) {
  zck_hf_checkpoint *c;
  ZT_OK(zck_hf_open(src, &c));
  zck_hf_options o = ZCK_HF_OPTIONS_INIT;
  ZT_OK(zck_parse_size(max, &o.max_shard_size));
  o.style = style && !strcmp(style, "sorted") ? ZCK_HF_INDEX_SORTED : ZCK_HF_INDEX_HUB;
  zck_hf_writer *w;
  ZT_OK(zck_hf_writer_new(dst, &o, &w));
  for (size_t i = 0; i < zck_hf_count(c); i++) {
    const zck_st_tensor *t = zck_hf_tensor_at(c, i)->t;
    ZT_OK(zck_hf_writer_add(w, t->name, t->st_dtype, t->ndim, t->shape, NULL));
  }
  ZT_OK(zck_hf_writer_layout(w));
  for (size_t i = 0; i < zck_hf_count(c); i++) {
    const zck_hf_tensor *ht = zck_hf_tensor_at(c, i);
    uint8_t *buf = malloc(ht->t->nbytes + 1);
    ZT_OK(zck_st_read(ht->file, ht->t, buf, 0, ht->t->nbytes));
    ZT_OK(zck_hf_writer_write(w, i, buf, 0, ht->t->nbytes));
    free(buf);
  }
  DIR *d = opendir(src);
  struct dirent *e;
  while (d && (e = readdir(d))) {
    size_t l = strlen(e->d_name);
    if (e->d_name[0] == '.' || (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors")) ||
        (l > 11 && !strcmp(e->d_name + l - 11, ".index.json")))
      continue;
    char *from = zck__path_join(src, e->d_name), *to = zck_hf_writer_extra_path(w, e->d_name);
    size_t n;
    char *data = st_slurp(from, &n);
    if (data) ZT_ASSERT(zt_write_file(to, data, n) == 0);
    free(data); free(from); free(to);
  }
  if (d) closedir(d);
  ZT_OK(zck_hf_writer_commit(w));
  printf("%zu shards\n", zck_hf_writer_shard_count(w));
  zck_hf_writer_free(w);
  zck_hf_close(c);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "write")) {
    mkdir(argv[2], 0755);
    write_set(argv[2], "single", ZCK_HF_DEFAULT_MAX_SHARD, ZCK_HF_INDEX_HUB);
    write_set(argv[2], "hub", 100, ZCK_HF_INDEX_HUB);
    write_set(argv[2], "sorted", 100, ZCK_HF_INDEX_SORTED);
    write_manifest(argv[2]);
    return 0;
  }
  if ((argc == 5 || argc == 6) && !strcmp(argv[1], "copy")) return copy(argv[2], argv[3], argv[4], argc == 6 ? argv[5] : NULL);
  fprintf(stderr, "usage: st_interop_tool write DIR | copy SRC DST MAX_SHARD_SIZE [hub|sorted]\n");
  return 2;
}
