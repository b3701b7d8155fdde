/* test_torch_fixtures.c: reads every real-torch fixture (tests/fixtures/torch/X.pt, made by
 * tests/fixtures/gen/make_torch_fixtures.py) and checks each tensor against X.expect.json:
 * dtype, shape, stride, storage offset, storage bytes, Parameter / requires_grad flags and
 * the sha256 of its contiguous bytes (read in place, strided views gathered); also that
 * the weights_only verdict matches what torch said. Skips (77) without the fixtures. */
#include "sha256.h"
#include "test.h"
#include "torch/torch.h"

#include <cjson/cJSON.h>
#include <dirent.h>

/* One .pt described by doc ("tensors", and "weights_only": true or "rejected: ..."). */
static int check_pt(const char *dir, cJSON *doc, const char *file, cJSON *wo) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, file);
  zck_torch_file *f;
  if (cJSON_IsTrue(cJSON_GetObjectItem(doc, "legacy_format"))) {
    ZT_ERR(zck_torch_open(path, NULL, &f), ZCK_ERR_UNSUPPORTED, "legacy torch serialization");
    printf("%s: legacy format rejected: %s\n", file, zck_last_error());
    return 0;
  }
  ZT_OK(zck_torch_open(path, NULL, &f));
  zck_torch_named *named;
  size_t nn;
  ZT_OK(zck_torch_state_dict(f, zck_torch_root(f), &named, &nn));
  cJSON *tensors = cJSON_GetObjectItem(doc, "tensors");
  int expected = 0;
  for (cJSON *t = tensors->child; t; t = t->next) {
    expected++;
    const zck_torch_tensor *tt = NULL;
    for (size_t i = 0; i < nn; i++)
      if (!strcmp(named[i].name, t->string)) tt = named[i].tensor;
    if (!tt) ZT_FAIL("%s: tensor %s not found", file, t->string);
    ZT_EQ_STR(zck_dtype_name(tt->dtype), cJSON_GetObjectItem(t, "dtype")->valuestring);
    cJSON *shape = cJSON_GetObjectItem(t, "shape"), *stride = cJSON_GetObjectItem(t, "stride");
    ZT_EQ_INT(tt->ndim, cJSON_GetArraySize(shape));
    for (int d = 0; d < tt->ndim; d++) {
      ZT_EQ_INT(tt->shape[d], (int64_t)cJSON_GetArrayItem(shape, d)->valuedouble);
      ZT_EQ_INT(tt->stride[d], (int64_t)cJSON_GetArrayItem(stride, d)->valuedouble);
    }
    ZT_EQ_U64(tt->storage_offset, (uint64_t)cJSON_GetObjectItem(t, "storage_offset")->valuedouble);
    ZT_EQ_U64(tt->numel, (uint64_t)cJSON_GetObjectItem(t, "numel")->valuedouble);
    ZT_EQ_U64(zck_torch_tensor_storage(f, tt)->nbytes, (uint64_t)cJSON_GetObjectItem(t, "storage_nbytes")->valuedouble);
    ZT_EQ_INT(tt->is_parameter, cJSON_IsTrue(cJSON_GetObjectItem(t, "parameter")));
    ZT_EQ_INT(tt->requires_grad, cJSON_IsTrue(cJSON_GetObjectItem(t, "requires_grad")));
    size_t nb = (size_t)zck_torch_tensor_nbytes(tt);
    uint8_t *buf = malloc(nb + 1);
    ZT_OK(zck_torch_tensor_read(f, tt, buf, 0, tt->numel));
    char hex[65];
    zt_sha256_hex(buf, nb, hex);
    if (strcmp(hex, cJSON_GetObjectItem(t, "sha256")->valuestring))
      ZT_FAIL("%s: %s: sha256 %s, expected %s", file, t->string, hex, cJSON_GetObjectItem(t, "sha256")->valuestring);
    /* partial reads agree with the whole */
    size_t es = zck_dtype_size(tt->dtype);
    for (uint64_t a = 0; a < tt->numel; a += 3) {
      uint64_t cnt = tt->numel - a < 5 ? tt->numel - a : 5;
      uint8_t part[5 * 16];
      ZT_OK(zck_torch_tensor_read(f, tt, part, a, cnt));
      ZT_EQ_MEM(part, buf + a * es, cnt * es);
    }
    if (zck_torch_tensor_contiguous(tt) && nb) {
      uint8_t *direct = malloc(nb);
      ZT_OK(zck__source_read(zck_torch_source(f), direct, nb, zck_torch_tensor_file_offset(f, tt)));
      ZT_EQ_MEM(direct, buf, nb);
      free(direct);
    }
    free(buf);
  }
  ZT_EQ_INT(nn, expected);
  zck_status ws = zck_torch_check_weights_only(f);
  if (cJSON_IsTrue(wo)) {
    if (ws != ZCK_OK) ZT_FAIL("%s: torch accepts it with weights_only, we say: %s", file, zck_last_error());
  } else {
    if (ws == ZCK_OK) ZT_FAIL("%s: torch rejects it with weights_only (%s), we accept", file, wo->valuestring);
    printf("%s: weights_only: %s\n", file, zck_last_error());
  }
  printf("%s: %d tensors, %zu storages ok\n", file, expected, zck_torch_storage_count(f));
  zck_torch_named_free(named, nn);
  zck_torch_close(f);
  return 1;
}

static int check_file(const char *dir, const char *json_name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, json_name);
  unsigned char *js;
  size_t jn;
  ZT_ASSERT(zt_read_file(path, &js, &jn) == 0);
  cJSON *doc = cJSON_ParseWithLength((const char *)js, jn);
  ZT_ASSERT(doc);
  int n = 0;
  cJSON *file = cJSON_GetObjectItem(doc, "file"), *files = cJSON_GetObjectItem(doc, "files");
  if (cJSON_IsString(file)) n += check_pt(dir, doc, file->valuestring, cJSON_GetObjectItem(doc, "weights_only"));
  for (cJSON *e = files ? files->child : NULL; e; e = e->next) {   /* several files, one content */
    cJSON *load = cJSON_GetObjectItem(e, "load");
    cJSON *w = load ? cJSON_GetObjectItem(load, "weights_only") : NULL;
    cJSON *verdict = cJSON_CreateBool(w && cJSON_IsString(w) && !strcmp(w->valuestring, "ok"));
    if (!cJSON_IsTrue(verdict)) { cJSON_Delete(verdict); verdict = cJSON_CreateString(w && cJSON_IsString(w) ? w->valuestring : "?"); }
    n += check_pt(dir, doc, e->string, verdict);
    cJSON_Delete(verdict);
  }
  cJSON_Delete(doc);
  free(js);
  return n;
}

/* Every .pt under fixtures/deepspeed opens and reads all its tensors (DeepSpeed's own
 * classes stay inert objects). */
static int check_tree(const char *dir) {
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort), count = 0;
  for (int i = 0; i < n; i++) {
    const char *nm = names[i]->d_name;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, nm);
    size_t l = strlen(nm);
    if (nm[0] != '.' && names[i]->d_type == DT_DIR) count += check_tree(path);
    else if (l > 3 && !strcmp(nm + l - 3, ".pt")) {
      zck_torch_file *f;
      ZT_OK(zck_torch_open(path, NULL, &f));
      zck_torch_named *v;
      size_t nn;
      ZT_OK(zck_torch_state_dict(f, zck_torch_root(f), &v, &nn));
      for (size_t k = 0; k < nn; k++) {
        uint8_t *buf = malloc(zck_torch_tensor_nbytes(v[k].tensor) + 1);
        ZT_OK(zck_torch_tensor_read(f, v[k].tensor, buf, 0, v[k].tensor->numel));
        free(buf);
      }
      printf("%s: %zu tensors\n", nm, nn);
      zck_torch_named_free(v, nn);
      zck_torch_close(f);
      count++;
    }
    free(names[i]);
  }
  free(names);
  return count;
}

int main(void) {
  char *dir = zt_fixture("torch");
  DIR *d = opendir(dir);
  if (!d) zt_skip("no tests/fixtures/torch");
  closedir(d);
  struct dirent **names;
  int n = scandir(dir, &names, NULL, alphasort);
  int files = 0;
  for (int i = 0; i < n; i++) {
    const char *nm = names[i]->d_name;
    size_t l = strlen(nm);
    if (l > 12 && !strcmp(nm + l - 12, ".expect.json")) files += check_file(dir, nm);
    free(names[i]);
  }
  free(names);
  free(dir);
  char *ds = zt_fixture("deepspeed");
  files += check_tree(ds);
  free(ds);
  if (!files) zt_skip("no torch fixtures");
  return 0;
}
