/* io_outdir.c: output directories, built under a temporary name and renamed into place in
 * one step after every file and folder of the tree is durable. See io.h. */
#include "io_internal.h"
#include "threadpool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool zck__dir_is_empty(const char *path) {
  DIR *d = opendir(path);
  if (!d) return false;
  struct dirent *e;
  bool empty = true;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) { empty = false; break; }
  closedir(d);
  return empty;
}

zck_status zck__outdir_create(zck__outdir *d, const char *final_path, bool overwrite) {
  memset(d, 0, sizeof *d);
  struct stat st;
  char *real = NULL; /* a link to a folder: its target */
  ZCK_TRY(zck__resolve_out(final_path, &real));
  if (zck__follower()) { /* rank 0 makes it; files inside are opened when a copy starts */
    d->path = real;
    d->tmp_path = zck__tmp_sibling(real);
    if (!d->tmp_path) { zck__outdir_abort(d); return ZCK_ERR_NO_MEMORY; }
    zck__open_dirs_add(d->tmp_path);
    return ZCK_OK;
  }
  /* first: an earlier output a dead run had moved aside comes back before OUT is judged */
  zck__clean_stale_temps(real);
  if (stat(real, &st) == 0) {
    zck_status s = ZCK_OK;
    if (!S_ISDIR(st.st_mode))
      s = zck__fail(ZCK_ERR_EXISTS, "%s: exists and is not a directory", final_path);
    else if (!zck__dir_is_empty(real) && !overwrite)
      s = zck__fail(ZCK_ERR_EXISTS, "%s: exists and is not empty (use --overwrite to replace it)", final_path);
    if (s != ZCK_OK) { free(real); return s; }
    d->replace = true;
  }
  d->path = real;
  d->tmp_path = zck__tmp_sibling(real);
  if (!d->path || !d->tmp_path) { zck__outdir_abort(d); return ZCK_ERR_NO_MEMORY; }
  char *parent = zck__parent_dir(real);
  if (!parent) { zck__outdir_abort(d); return ZCK_ERR_NO_MEMORY; }
  zck_status s = zck__mkdirs_track(parent, &d->made_top);
  free(parent);
  if (s != ZCK_OK) { zck__outdir_abort(d); return s; }
  zck__remove_tree(d->tmp_path); /* a stale one from a crashed run of the same pid */
  if (mkdir(d->tmp_path, 0755) != 0) {
    s = zck__fail_errno(errno, "%s: cannot create output directory", final_path);
    free(d->tmp_path);
    d->tmp_path = NULL;
    zck__outdir_abort(d);
    return s;
  }
  int fd = open(d->tmp_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  d->sync_fd = fd >= 0 ? fd + 1 : 0; /* none: each file is fsync'd at commit */
  zck__open_dirs_add(d->tmp_path);
  return ZCK_OK;
}

char *zck__outdir_file(const zck__outdir *d, const char *name) { return zck__path_join(d->tmp_path, name); }

/* Every regular file and folder of a tree, files first, the folders after (the order
 * they are fsync'd in). */
typedef struct zck__tree_list {
  char **path;
  bool *is_dir;
  size_t n, cap;
} zck__tree_list;

static zck_status zck__tree_add(zck__tree_list *l, char *path, bool is_dir) {
  if (l->n == l->cap) {
    size_t nc = l->cap ? 2 * l->cap : 64;
    char **p = zck__realloc(l->path, nc * sizeof *p);
    if (p) l->path = p;
    bool *d = p ? zck__realloc(l->is_dir, nc * sizeof *d) : NULL;
    if (d) l->is_dir = d;
    if (!p || !d) { free(path); return ZCK_ERR_NO_MEMORY; }
    l->cap = nc;
  }
  l->path[l->n] = path;
  l->is_dir[l->n++] = is_dir;
  return ZCK_OK;
}

static zck_status zck__tree_walk(zck__tree_list *l, const char *path) {
  DIR *dir = opendir(path);
  if (!dir) return zck__fail_errno(errno, "%s: cannot open directory", path);
  struct dirent *e;
  zck_status s = ZCK_OK;
  while (s == ZCK_OK && (e = readdir(dir))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *child = zck__path_join(path, e->d_name);
    if (!child) { s = ZCK_ERR_NO_MEMORY; break; }
    struct stat st;
    if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode)) {
      s = zck__tree_walk(l, child);
      free(child);
    } else if (S_ISREG(st.st_mode)) {
      s = zck__tree_add(l, child, false);
    } else {
      free(child);
    }
  }
  closedir(dir);
  if (s == ZCK_OK) {
    char *self = zck__strdup(path);
    s = self ? zck__tree_add(l, self, true) : ZCK_ERR_NO_MEMORY;
  }
  return s;
}

static zck_status zck__fsync_item(void *ctx, size_t i, unsigned thread) {
  (void)thread;
  const zck__tree_list *l = ctx;
  return zck__fsync_path(l->path[i], l->is_dir[i]);
}

/* fsyncs of one tree run this many at a time: they wait on the disk, not the CPU, and
 * the filesystem folds concurrent ones into one journal commit. */
#define ZCK__FSYNC_THREADS 16u
/* A tree of more entries is made durable with one syncfs(2) instead: a universal folder
 * of 100k params holds 400k files and folders, and an fsync each takes minutes. */
#define ZCK__FSYNC_EACH_MAX 4096u

/* Counts the entries of a tree, stopping past limit. */
static size_t zck__tree_count(const char *path, size_t limit) {
  DIR *dir = opendir(path);
  if (!dir) return 0;
  size_t n = 1;
  struct dirent *e;
  while (n <= limit && (e = readdir(dir))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    n++;
    if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN) {
      char *child = zck__path_join(path, e->d_name);
      struct stat st;
      if (child && (e->d_type == DT_DIR || (lstat(child, &st) == 0 && S_ISDIR(st.st_mode))))
        n += zck__tree_count(child, limit - n + 1) - 1;
      free(child);
    }
  }
  closedir(dir);
  return n;
}

static zck_status zck__fsync_tree(const zck__outdir *d) {
  const char *path = d->tmp_path;
  if (d->sync_fd > 0 && zck__tree_count(path, ZCK__FSYNC_EACH_MAX) > ZCK__FSYNC_EACH_MAX) {
    /* every file and folder of the filesystem, with any writeback error since the tree
     * was made (sync_fd was opened then: syncfs reports errors seen after its open) */
    int fe = zck__io_fault(ZCK_IO_OP_FSYNC);
    if (fe || syncfs(d->sync_fd - 1) != 0) return zck__fail_errno(fe ? fe : errno, "%s: sync failed", path);
    return ZCK_OK;
  }
  zck__tree_list l = {0};
  zck_status s = zck__tree_walk(&l, path);
  /* the files first, then every folder (the renames inside are all done by now) */
  size_t files = 0;
  for (size_t i = 0; s == ZCK_OK && i < l.n; i++) {
    if (l.is_dir[i]) continue;
    char *p = l.path[i];
    l.path[i] = l.path[files];
    l.path[files] = p;
    l.is_dir[i] = true;   /* what was at `files`: a folder, or i itself */
    l.is_dir[files++] = false;
  }
  if (s == ZCK_OK) s = zck__parallel_for(files, ZCK__FSYNC_THREADS, zck__fsync_item, &l);
  if (s == ZCK_OK) {
    zck__tree_list dirs = {l.path + files, l.is_dir + files, l.n - files, 0};
    s = zck__parallel_for(dirs.n, ZCK__FSYNC_THREADS, zck__fsync_item, &dirs);
  }
  for (size_t i = 0; i < l.n; i++) free(l.path[i]);
  free(l.path);
  free(l.is_dir);
  return s;
}

/* After the RENAME_EXCHANGE of zck__outdir_commit: tmp_path holds the earlier tree. */
static zck_status zck__outdir_exchanged(zck__outdir *d) {
  char *parent = zck__parent_dir(d->path);
  zck_status s = parent ? zck__fsync_path(parent, true) : ZCK_ERR_NO_MEMORY;
  free(parent);
  if (s != ZCK_OK && renameat2(AT_FDCWD, d->tmp_path, AT_FDCWD, d->path, RENAME_EXCHANGE) == 0)
    return s; /* not durable: swapped back; the caller's abort removes the new tree */
  zck__open_dirs_remove(d->tmp_path);
  zck__remove_tree(d->tmp_path); /* the earlier output */
  free(d->tmp_path);
  d->tmp_path = NULL;
  free(d->made_top);
  d->made_top = NULL;
  return s;
}

zck_status zck__outdir_commit(zck__outdir *d) {
  /* as zck__outfile_commit: the rename waits for every rank to be done with the tree */
  zck_status agreed = zck__dist_agree(ZCK__DIST_COMMIT, ZCK_OK);
  if (zck__follower()) {
    zck__outdir_abort(d);
    return agreed;
  }
  ZCK_TRY(agreed);
  ZCK_TRY(zck__fsync_tree(d));
  char *old = NULL;
  if (d->replace) {
    /* One atomic swap where the filesystem has it: the new tree at OUT, the old one at
     * the temporary name, never a moment without OUT. */
    int fe = zck__io_fault(ZCK_IO_OP_RENAME);
    if (!fe && renameat2(AT_FDCWD, d->tmp_path, AT_FDCWD, d->path, RENAME_EXCHANGE) == 0)
      return zck__outdir_exchanged(d);
    if (fe) return zck__fail_errno(fe, "%s: cannot rename output into place", d->path);
    /* Elsewhere move the old tree aside first (rename(2) cannot replace a non-empty
     * directory); a run killed between the two renames leaves it as ".zck-old-", which
     * the next run puts back (zck__clean_stale_temps). */
    old = zck__sprintf("%s.zck-old-%ld", d->tmp_path, (long)getpid());
    if (!old) return ZCK_ERR_NO_MEMORY;
    if (rename(d->path, old) != 0 && errno != ENOENT) {
      zck_status s = zck__fail_errno(errno, "%s: cannot move the existing directory aside", d->path);
      free(old);
      return s;
    }
  }
  int fe = zck__io_fault(ZCK_IO_OP_RENAME);
  if (fe || rename(d->tmp_path, d->path) != 0) {
    zck_status s = zck__fail_errno(fe ? fe : errno, "%s: cannot rename output into place", d->path);
    if (old) { rename(old, d->path); free(old); }
    return s;
  }
  char *parent = zck__parent_dir(d->path);
  zck_status s = parent ? zck__fsync_path(parent, true) : ZCK_ERR_NO_MEMORY;
  free(parent);
  if (s != ZCK_OK && rename(d->path, d->tmp_path) == 0) {
    /* not durable: undo, so a failed commit leaves what was there before (the caller's
     * abort removes the temporary tree) */
    if (old) rename(old, d->path);
    free(old);
    return s;
  }
  /* committed (or, with the undo failing too, in place: tmp_path NULL says so) */
  if (d->sync_fd > 0) close(d->sync_fd - 1);
  d->sync_fd = 0;
  zck__open_dirs_remove(d->tmp_path);
  free(d->tmp_path);
  d->tmp_path = NULL;
  free(d->made_top); /* the parents hold the output now */
  d->made_top = NULL;
  if (old) { zck__remove_tree(old); free(old); }
  return s;
}

void zck__outdir_abort(zck__outdir *d) {
  if (!d) return;
  bool lead = !zck__follower();   /* a follower rank only forgets: the lead removes the tree */
  if (lead && d->sync_fd > 0) close(d->sync_fd - 1);
  if (d->tmp_path) zck__open_dirs_remove(d->tmp_path);
  if (lead && d->tmp_path) zck__remove_tree(d->tmp_path);
  if (lead) zck__rmdirs_made_for(d->path, d->made_top);
  free(d->made_top);
  free(d->tmp_path);
  free(d->path);
  memset(d, 0, sizeof *d);
}
