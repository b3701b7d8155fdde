/* ut_util.h: helpers of the universal tests: read a store whole, gather a param from a
 * ZeRO layout, list fixture cases. */
#ifndef ZCK_UT_UTIL_H
#define ZCK_UT_UTIL_H

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "exec.h"
#include "plan.h"
#include "test.h"

/* Reads elements [0, n) of any store into a fresh buffer (through the executor). */
static inline void *ut_read_store(const zck_store *s, uint64_t n) {
  size_t es = zck_dtype_size(s->dtype);
  void *buf = calloc(n ? n : 1, es);
  if (!n) return buf;
  zck_extent e = {0, 0, 0, 0, 0, n, 0, 0, 0};
  zck_plan *p = NULL;
  ZT_OK(zck_plan_from_extents(&e, 1, 1, 1, &p));
  zck_store d = zck_store_memory(buf, s->dtype, n, "mem");
  ZT_OK(zck_exec_plan(p, s, &d, NULL, NULL));
  zck_plan_free(p);
  return buf;
}

/* Param p of a partitioned layout gathered into a whole tensor (dtype of the stores). */
static inline void *ut_gather(const zck_layout *l, const zck_store *stores, uint32_t p, zck_dtype *dt) {
  uint64_t *numel = calloc(l->n_params ? l->n_params : 1, sizeof *numel);
  for (size_t i = 0; i < l->n_params; i++) numel[i] = l->param_numel[i];
  zck_layout *w = NULL;
  ZT_OK(zck_layout_whole(l->n_params, numel, &p, 1, &w));
  zck_plan *plan = NULL;
  ZT_OK(zck_plan_build(l, w, NULL, &plan));
  size_t first = l->param_first[p];
  *dt = first < l->param_first[p + 1] ? stores[l->pieces[first].store].dtype : stores[0].dtype;
  uint64_t n = numel[p];
  void *buf = calloc(n ? n : 1, zck_dtype_size(*dt));
  zck_store d = zck_store_memory(buf, *dt, n, "mem");
  ZT_OK(zck_exec_plan(plan, stores, &d, NULL, NULL));
  zck_plan_free(plan);
  zck_layout_free(w);
  free(numel);
  return buf;
}

/* tests/fixtures/deepspeed/<case>/ckpt (a static buffer). */
static inline const char *ut_ckpt(const char *cs) {
  static char p[4096];
  snprintf(p, sizeof p, "%s/deepspeed/%s/ckpt", zt_fixtures(), cs);
  return p;
}

/* Case folders of tests/fixtures/deepspeed with a ckpt/, sorted; NULL-terminated. */
static inline char **ut_cases(void) {
  char *root = zt_fixture("deepspeed");
  DIR *d = opendir(root);
  if (!d) zt_skip("no DeepSpeed fixtures");
  char **v = calloc(256, sizeof *v);
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) && n < 255) {
    if (e->d_name[0] == '.') continue;
    char p[4096];
    snprintf(p, sizeof p, "%s/%s/ckpt", root, e->d_name);
    struct stat st;
    if (stat(p, &st) == 0 && S_ISDIR(st.st_mode)) v[n++] = strdup(e->d_name);
  }
  closedir(d);
  free(root);
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      if (strcmp(v[i], v[j]) > 0) { char *t = v[i]; v[i] = v[j]; v[j] = t; }
  return v;
}

static inline void ut_free_cases(char **v) {
  for (size_t i = 0; v[i]; i++) free(v[i]);
  free(v);
}

#endif
