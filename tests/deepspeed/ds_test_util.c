/* ds_test_util.c: see ds_test_util.h. */
#include "ds_test_util.h"

#include "exec.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

char **zt_ds_cases(size_t *n) {
  char *dir = zt_fixture("deepspeed");
  DIR *d = opendir(dir);
  *n = 0;
  char **v = NULL;
  if (d) {
    struct dirent *e;
    while ((e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char *exp = NULL;
      if (asprintf(&exp, "%s/%s/expected.json", dir, e->d_name) < 0) abort();
      struct stat st;
      if (stat(exp, &st) == 0) {
        v = realloc(v, (*n + 1) * sizeof *v);
        v[(*n)++] = strdup(e->d_name);
      }
      free(exp);
    }
    closedir(d);
  }
  free(dir);
  if (*n) qsort(v, *n, sizeof *v, cmp_str);
  return v;
}

void zt_ds_free_cases(char **v, size_t n) {
  for (size_t i = 0; i < n; i++) free(v[i]);
  free(v);
}

cJSON *zt_ds_expected(const char *casename) {
  char *rel = NULL;
  if (asprintf(&rel, "deepspeed/%s/expected.json", casename) < 0) abort();
  char *path = zt_fixture(rel);
  unsigned char *data = NULL;
  size_t n = 0;
  cJSON *j = NULL;
  if (zt_read_file(path, &data, &n) == 0) {
    data[n] = 0;
    j = cJSON_Parse((const char *)data);
  }
  free(data);
  free(path);
  free(rel);
  return j;
}

char *zt_ds_ckpt_path(const char *casename) {
  char *rel = NULL;
  if (asprintf(&rel, "deepspeed/%s/ckpt", casename) < 0) abort();
  char *p = zt_fixture(rel);
  free(rel);
  return p;
}

static void *read_one(const zck_ds_view *v, size_t n_index, const uint64_t *numels, uint32_t idx, zck_dtype dt) {
  zck_layout *dst = NULL;
  zck_plan *plan = NULL;
  uint64_t n = numels[idx];
  void *buf = calloc(n ? n : 1, zck_dtype_size(dt));
  if (zck_layout_whole(n_index, numels, &idx, 1, &dst) != ZCK_OK) goto fail;
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  if (zck_plan_build(v->layout, dst, &po, &plan) != ZCK_OK) goto fail;
  zck_store st = zck_store_memory(buf, dt, n, "test buffer");
  if (zck_exec_plan(plan, v->stores, &st, NULL, NULL) != ZCK_OK) goto fail;
  zck_plan_free(plan);
  zck_layout_free(dst);
  return buf;
fail:
  zck_plan_free(plan);
  zck_layout_free(dst);
  free(buf);
  return NULL;
}

void *zt_ds_read_param(const zck_ds_view *v, const zck_model *m, uint32_t p, zck_dtype dt) {
  uint64_t *numels = calloc(m->n_params + 1, sizeof *numels);
  zck_model_numels(m, numels);
  void *r = read_one(v, m->n_params, numels, p, dt);
  free(numels);
  return r;
}

void *zt_ds_read_buffer(const zck_ds_view *v, const zck_model *m, uint32_t b, zck_dtype dt) {
  uint64_t *numels = calloc(m->n_buffers + 1, sizeof *numels);
  for (size_t i = 0; i < m->n_buffers; i++) numels[i] = m->buffers[i].numel;
  void *r = read_one(v, m->n_buffers, numels, b, dt);
  free(numels);
  return r;
}

int zt_copy_tree(const char *src, const char *dst) {
  char *cmd = NULL;
  if (asprintf(&cmd, "cp -r '%s' '%s'", src, dst) < 0) abort();
  int rc = system(cmd);
  free(cmd);
  return rc;
}
