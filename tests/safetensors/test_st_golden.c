/* test_st_golden.c: files written by the Python safetensors package, huggingface_hub and
 * transformers (tests/fixtures/safetensors, made by tests/fixtures/gen/make_safetensors_fixtures.py)
 * read as their expect.json sidecars say (dtype, shape, offsets, sha256 of the bytes,
 * metadata, header order), and rewriting the same tensors with zckpt's writers gives the
 * same bytes: single files, the huggingface_hub sharded set and its index (json.dump
 * indent=2), the transformers sharded set and its index (sort_keys, total_parameters).
 * Skips (77) when the fixtures are missing. */
#include "test.h"
#include "safetensors/safetensors.h"
#include "st_test_util.h"

#include <cjson/cJSON.h>
#include <sys/stat.h>

static cJSON *load_json(const char *path) {
  char *text = st_slurp(path, NULL);
  if (!text) return NULL;
  cJSON *j = cJSON_Parse(text);
  free(text);
  if (!j) ZT_FAIL("%s: cannot parse", path);
  return j;
}

static void check_tensor(const zck_st_file *f, const zck_st_tensor *t, const cJSON *exp, const char *ctx) {
  const cJSON *dt = cJSON_GetObjectItemCaseSensitive(exp, "dtype");
  if (dt) ZT_EQ_STR(zck_st_dtype_name(t->st_dtype), dt->valuestring);
  const cJSON *shape = cJSON_GetObjectItemCaseSensitive(exp, "shape");
  ZT_EQ_INT(t->ndim, cJSON_GetArraySize(shape));
  for (int d = 0; d < t->ndim; d++) ZT_EQ_U64(t->shape[d], (uint64_t)cJSON_GetArrayItem(shape, d)->valuedouble);
  const cJSON *offs = cJSON_GetObjectItemCaseSensitive(exp, "data_offsets");
  if (offs) {
    ZT_EQ_U64(t->begin, (uint64_t)cJSON_GetArrayItem(offs, 0)->valuedouble);
    ZT_EQ_U64(t->end, (uint64_t)cJSON_GetArrayItem(offs, 1)->valuedouble);
  }
  uint8_t *buf = malloc(t->nbytes ? t->nbytes : 1);
  ZT_OK(zck_st_read(f, t, buf, 0, t->nbytes));
  char hex[65];
  st_sha256_hex(buf, t->nbytes, hex);
  free(buf);
  const char *want = cJSON_GetObjectItemCaseSensitive(exp, "sha256")->valuestring;
  if (strcmp(hex, want)) ZT_FAIL("%s: tensor %s: sha256 %s, expected %s", ctx, t->name, hex, want);
}

/* Copies every tensor of f into a new writer with f's metadata (file order) and returns the
 * bytes written. */
static char *rewrite_single(const zck_st_file *f, const char *dir, size_t *len) {
  zck_st_writer *w;
  ZT_OK(zck_st_writer_new(&w));
  zck_st_writer_clear_metadata(w);
  for (size_t i = 0; i < zck_st_metadata_count(f); i++) {
    const char *k, *v;
    zck_st_metadata_at(f, i, &k, &v);
    ZT_OK(zck_st_writer_set_metadata(w, k, v));
  }
  for (size_t i = 0; i < zck_st_count(f); i++) {
    const zck_st_tensor *t = zck_st_tensor_at(f, i);
    ZT_OK(zck_st_writer_add(w, t->name, t->st_dtype, t->ndim, t->shape, NULL));
  }
  ZT_OK(zck_st_writer_layout(w));
  char *out = zck__path_join(dir, "rewrite.safetensors");
  ZT_OK(zck_st_writer_open(w, out));
  for (size_t i = 0; i < zck_st_count(f); i++) {
    const zck_st_tensor *t = zck_st_tensor_at(f, i);
    uint8_t *buf = malloc(t->nbytes ? t->nbytes : 1);
    ZT_OK(zck_st_read(f, t, buf, 0, t->nbytes));
    ZT_OK(zck_st_writer_write(w, i, buf, 0, t->nbytes));
    free(buf);
  }
  ZT_OK(zck_st_writer_commit(w));
  zck_st_writer_free(w);
  char *bytes = st_slurp(out, len);
  free(out);
  return bytes;
}

static void single(const char *name, const char *tmp) {
  char rel[256];
  snprintf(rel, sizeof rel, "safetensors/%s.expect.json", name);
  char *ep = zt_fixture(rel);
  cJSON *exp = load_json(ep);
  free(ep);
  if (!exp) zt_skip("safetensors fixtures missing (run tests/fixtures/gen/make_safetensors_fixtures.py)");
  snprintf(rel, sizeof rel, "safetensors/%s.safetensors", name);
  char *path = zt_fixture(rel);
  zck_st_file *f;
  ZT_OK(zck_st_open(path, &f));
  ZT_EQ_U64(zck_st_header_len(f), (uint64_t)cJSON_GetObjectItemCaseSensitive(exp, "header_len")->valuedouble);
  ZT_EQ_U64(zck_st_file_size(f), (uint64_t)cJSON_GetObjectItemCaseSensitive(exp, "file_size")->valuedouble);
  const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(exp, "tensors");
  ZT_EQ_INT(zck_st_count(f), cJSON_GetArraySize(tensors));
  const cJSON *e;
  cJSON_ArrayForEach(e, tensors) {
    const zck_st_tensor *t = zck_st_find(f, e->string);
    if (!t) ZT_FAIL("%s: tensor %s not found", name, e->string);
    check_tensor(f, t, e, name);
  }
  /* header order */
  const cJSON *order = cJSON_GetObjectItemCaseSensitive(exp, "header_key_order");
  size_t k = 0;
  cJSON_ArrayForEach(e, order) {
    if (!strcmp(e->valuestring, "__metadata__")) continue;
    ZT_EQ_STR(zck_st_tensor_at(f, k)->name, e->valuestring);
    k++;
  }
  /* metadata */
  const cJSON *md = cJSON_GetObjectItemCaseSensitive(exp, "metadata");
  if (cJSON_IsNull(md)) {
    ZT_ASSERT(!zck_st_has_metadata(f));
    ZT_EQ_INT(zck_st_warning_count(f), 1);
    ZT_ASSERT(strstr(zck_st_warning_at(f, 0), "no __metadata__; transformers expects"));
  } else {
    ZT_ASSERT(zck_st_has_metadata(f));
    ZT_EQ_INT(zck_st_metadata_count(f), cJSON_GetArraySize(md));
    cJSON_ArrayForEach(e, md) ZT_EQ_STR(zck_st_metadata_get(f, e->string), e->valuestring);
    ZT_EQ_INT(zck_st_warning_count(f), 0);
  }
  /* byte-identical rewrite with the metadata set again in the file's order */
  size_t olen, nlen;
  char *orig = st_slurp(path, &olen), *mine = rewrite_single(f, tmp, &nlen);
  ZT_EQ_U64(nlen, olen);
  if (memcmp(orig, mine, olen)) ZT_FAIL("%s: rewrite differs from the safetensors package's bytes", name);
  free(orig);
  free(mine);
  zck_st_close(f);
  free(path);
  cJSON_Delete(exp);
}

/* Reads a sharded fixture, checks it, then writes it again with zck_hf_writer and compares
 * every file. */
static void sharded(const char *name, const char *tmp, const zck_hf_options *opts, const char *const *metadata) {
  char rel[256];
  snprintf(rel, sizeof rel, "safetensors/%s/expect.json", name);
  char *ep = zt_fixture(rel);
  cJSON *exp = load_json(ep);
  free(ep);
  if (!exp) zt_skip("sharded fixtures missing");
  snprintf(rel, sizeof rel, "safetensors/%s", name);
  char *dir = zt_fixture(rel);
  zck_hf_checkpoint *c;
  ZT_OK(zck_hf_open(dir, &c));
  for (size_t i = 0; i < zck_hf_warning_count(c); i++) ZT_FAIL("%s: unexpected warning: %s", name, zck_hf_warning_at(c, i));
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(exp, "index"), "weight_map");
  ZT_EQ_INT(zck_hf_count(c), cJSON_GetArraySize(wm));
  const cJSON *ref = cJSON_GetObjectItemCaseSensitive(exp, "reference_state_dict");
  const cJSON *e;
  size_t i = 0;
  cJSON_ArrayForEach(e, wm) { /* weight_map order */
    const zck_hf_tensor *ht = zck_hf_tensor_at(c, i++);
    ZT_EQ_STR(ht->t->name, e->string);
    const char *base = strrchr(zck_st_path(ht->file), '/') + 1;
    ZT_EQ_STR(base, e->valuestring);
    check_tensor(ht->file, ht->t, cJSON_GetObjectItemCaseSensitive(ref, e->string), name);
  }
  uint64_t total;
  ZT_ASSERT(zck_hf_index_total_size(zck_hf_checkpoint_index(c), &total));

  /* write it again: the reference state dict order, minus the aliases the index dropped */
  char *out = zck__path_join(tmp, name);
  zck_hf_writer *w;
  ZT_OK(zck_hf_writer_new(out, opts, &w));
  for (const char *const *m = metadata; m && *m; m += 2) ZT_OK(zck_hf_writer_set_metadata(w, m[0], m[1]));
  size_t n = 0;
  const zck_hf_tensor *order[256];
  cJSON_ArrayForEach(e, ref) {
    const zck_hf_tensor *ht = zck_hf_find(c, e->string);
    if (!ht) continue;
    ZT_OK(zck_hf_writer_add(w, ht->t->name, ht->t->st_dtype, ht->t->ndim, ht->t->shape, NULL));
    order[n++] = ht;
  }
  ZT_OK(zck_hf_writer_layout(w));
  ZT_EQ_INT(zck_hf_writer_shard_count(w), zck_hf_shard_count(c));
  for (size_t k = 0; k < n; k++) {
    uint8_t *buf = malloc(order[k]->t->nbytes + 1);
    ZT_OK(zck_st_read(order[k]->file, order[k]->t, buf, 0, order[k]->t->nbytes));
    ZT_OK(zck_hf_writer_write(w, k, buf, 0, order[k]->t->nbytes));
    free(buf);
  }
  ZT_OK(zck_hf_writer_commit(w));
  zck_hf_writer_free(w);
  const cJSON *files = cJSON_GetObjectItemCaseSensitive(exp, "files");
  cJSON_ArrayForEach(e, files) {
    char *a = zck__path_join(dir, e->string), *b = zck__path_join(out, e->string);
    size_t al, bl;
    char *ad = st_slurp(a, &al), *bd = st_slurp(b, &bl);
    if (!bd) ZT_FAIL("%s: %s not written", name, e->string);
    if (al != bl || memcmp(ad, bd, al)) ZT_FAIL("%s: %s differs from the reference", name, e->string);
    free(a); free(b); free(ad); free(bd);
  }
  char *a = zck__path_join(dir, "model.safetensors.index.json"), *b = zck__path_join(out, "model.safetensors.index.json");
  char *ad = st_slurp(a, NULL), *bd = st_slurp(b, NULL);
  ZT_ASSERT(ad && bd);
  if (strcmp(ad, bd)) ZT_FAIL("%s: index differs:\n--- reference\n%s\n--- zckpt\n%s", name, ad, bd);
  free(a); free(b); free(ad); free(bd);
  zck_hf_close(c);
  free(out);
  free(dir);
  cJSON_Delete(exp);
}

int main(void) {
  char *tmp = zt_tmpdir();
  const char *singles[] = {"dtypes", "extended_dtypes", "no_metadata", "empty", "empty_no_metadata", "save_model_tied"};
  for (size_t i = 0; i < sizeof singles / sizeof *singles; i++) single(singles[i], tmp);

  /* huggingface_hub.save_torch_state_dict(max_shard_size=1000, metadata={"producer": ...});
   * _clean_state_dict_for_safetensors added the dropped alias to the metadata */
  zck_hf_options hub = ZCK_HF_OPTIONS_INIT;
  hub.max_shard_size = 1000;
  const char *hub_md[] = {"producer", "zckpt-fixtures", "tied.alias", "a.weight", NULL};
  sharded("hub_sharded", tmp, &hub, hub_md);

  /* transformers save_pretrained(max_shard_size="3KB"): sort_keys, total_parameters */
  zck_hf_options tf = ZCK_HF_OPTIONS_INIT;
  ZT_OK(zck_parse_size("3KB", &tf.max_shard_size));
  tf.style = ZCK_HF_INDEX_SORTED;
  tf.with_total_parameters = true;
  tf.total_parameters = 1856;
  sharded("gpt2_sharded", tmp, &tf, NULL);
  free(tmp);
  return 0;
}
