/* rotate.c: the checkpoint folders of an output (saver.h): rotation as the Trainer's
 * _sorted_checkpoints / _rotate_checkpoints do it, `latest`, and the temporary trees a run
 * makes beside its output. */
#include "saver.h"

#include "error.h"
#include "io.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int64_t checkpoint_step(const char *name) {
  if (strncmp(name, "checkpoint-", 11) || !name[11]) return -1;
  char *end;
  long long v = strtoll(name + 11, &end, 10);
  return *end || v < 0 ? -1 : (int64_t)v;
}

typedef struct ck_entry {
  int64_t step;
  char *path;
} ck_entry;

static int cmp_entry(const void *a, const void *b) {
  int64_t x = ((const ck_entry *)a)->step, y = ((const ck_entry *)b)->step;
  return x < y ? -1 : x > y;
}

zck_status zck_saver_rotate(const zck_saver *t) {
  int64_t limit = t->o.save_total_limit;
  if (limit <= 0) return ZCK_OK;
  DIR *d = opendir(t->o.output_dir);
  if (!d) return zck__fail_errno(errno, "%s", t->o.output_dir);
  ck_entry *v = NULL;
  size_t n = 0, cap = 0;
  zck_status s = ZCK_OK;
  for (struct dirent *e; (e = readdir(d));) {
    int64_t st = checkpoint_step(e->d_name);
    if (st < 0) continue;
    char *p = zck__path_join(t->o.output_dir, e->d_name);
    struct stat sb;
    if (!p || stat(p, &sb) || !S_ISDIR(sb.st_mode)) {
      free(p);
      continue;
    }
    if (n == cap) {
      cap = cap ? 2 * cap : 16;
      ck_entry *nv = zck__realloc(v, cap * sizeof *v);
      if (!nv) {
        free(p);
        s = ZCK_ERR_NO_MEMORY;
        break;
      }
      v = nv;
    }
    v[n++] = (ck_entry){st, p};
  }
  closedir(d);
  if (s == ZCK_OK && n) {
    qsort(v, n, sizeof *v, cmp_entry);
    /* the best checkpoint moves to the second-to-last place so it survives */
    size_t best = n;
    for (size_t i = 0; i < n; i++)
      if (t->best_checkpoint && !strcmp(v[i].path, t->best_checkpoint)) best = i;
    if (best < n)
      for (size_t i = best; i + 2 < n; i++) {
        ck_entry tmp = v[i];
        v[i] = v[i + 1];
        v[i + 1] = tmp;
      }
    if (best < n && limit == 1 && strcmp(v[n - 1].path, t->best_checkpoint)) limit = 2;
    size_t del = n > (size_t)limit ? n - (size_t)limit : 0;
    for (size_t i = 0; i < del && s == ZCK_OK; i++) s = zck__remove_tree(v[i].path);
  }
  for (size_t i = 0; i < n; i++) free(v[i].path);
  free(v);
  return s;
}

zck_status zck_saver_write_latest(const char *dir, int64_t step) {
  char tag[64];
  int n = snprintf(tag, sizeof tag, "global_step%lld", (long long)step);
  char *path = zck__path_join(dir, "latest");
  if (!path) return ZCK_ERR_NO_MEMORY;
  zck__outfile f;
  zck_status s = zck__outfile_create(&f, path);
  free(path);
  if (s != ZCK_OK) return s;
  s = zck__outfile_pwrite(&f, tag, (size_t)n, 0);
  if (s == ZCK_OK) return zck__outfile_commit(&f);
  zck__outfile_abort(&f);
  return s;
}

// ---- temporary trees beside the output

/* base/.<what>.zck-tmp-<pid>/, for a temporary output (a reshard, the best model) made in
 * a subfolder of it: a save's stale-temporary sweep removes the whole tree once its writer
 * is dead, so a killed run leaves nothing that piles up. */
zck_status zck_saver_temp_tree(const char *base, const char *what, const char *sub, char **out) {
  *out = NULL;
  ZCK_TRY(zck__mkdirs(base));
  char *dir = zck__sprintf("%s/.%s.zck-tmp-%ld", base, what, (long)getpid());
  if (!dir) return ZCK_ERR_NO_MEMORY;
  /* dead runs' trees first: a run killed before its first save (in the reshard of its
   * resume, say) would otherwise leave its tree for good, one more each time */
  zck_sweep_temporaries(base, ZCK_SWEEP_DEAD, NULL, NULL);
  zck_clear_error(); /* a tree that cannot be swept is no reason not to write */
  zck__remove_tree(dir); /* a stale one of this pid */
  zck_status s = mkdir(dir, 0755) == 0 ? ZCK_OK : zck__fail_errno(errno, "%s: cannot create", dir);
  *out = s == ZCK_OK ? zck__path_join(dir, sub) : NULL;
  if (s == ZCK_OK && !*out) s = ZCK_ERR_NO_MEMORY;
  if (s != ZCK_OK) zck__remove_tree(dir);
  free(dir);
  return s;
}

/* Removes the tree tmp_tree made for path (its parent). */
void zck_saver_temp_tree_remove(const char *path) {
  char *dir = zck__strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
  if (slash) {
    *slash = 0;
    zck__remove_tree(dir);
  }
  free(dir);
}

