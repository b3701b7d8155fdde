/* io_dirs.c: folders: mkdir -p that remembers what it made (and its undo), OUT through a
 * link to a folder, rm -r of a tree we made. See io.h. */
#include "io_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

zck_status zck__mkdirs(const char *path) {
  char *made = NULL;
  zck_status s = zck__mkdirs_track(path, &made);
  free(made);
  return s;
}

zck_status zck__mkdirs_track(const char *path, char **made_top) {
  *made_top = NULL;
  if (zck__follower()) return ZCK_OK; /* rank 0's tree */
  /* the common cases first, one system call each: only the last component is missing (a
   * universal folder's 100k parameter folders), or the folder exists (a writer making
   * the folder of each of its files) */
  if (mkdir(path, 0755) == 0) {
    if (!(*made_top = zck__strdup(path))) {
      rmdir(path);
      return ZCK_ERR_NO_MEMORY;
    }
    return ZCK_OK;
  }
  struct stat st;
  if (errno == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return ZCK_OK;
  char *p = zck__strdup(path);
  if (!p) return ZCK_ERR_NO_MEMORY;
  char *last = NULL; /* the deepest folder made so far */
  zck_status s = ZCK_OK;
  for (char *c = p + 1; ; c++) {
    if (*c == '/' || *c == 0) {
      char saved = *c;
      *c = 0;
      if (c[-1] != '/') {
        if (mkdir(p, 0755) == 0) {
          free(last);
          last = zck__strdup(p);
          if (!*made_top) *made_top = zck__strdup(p);
          if (!last || !*made_top) s = ZCK_ERR_NO_MEMORY;
        } else if (errno != EEXIST) {
          s = zck__fail_errno(errno, "%s: cannot create directory", p);
        }
      }
      *c = saved;
      if (!saved || s != ZCK_OK) break;
    }
  }
  if (s != ZCK_OK && last && *made_top) zck__rmdirs_made(last, *made_top);
  if (s != ZCK_OK) {
    free(*made_top);
    *made_top = NULL;
  }
  free(last);
  free(p);
  return s;
}

void zck__rmdirs_made(const char *path, const char *made_top) {
  if (zck__follower()) return;
  size_t top = strlen(made_top);
  while (top > 1 && made_top[top - 1] == '/') top--;
  if (strncmp(path, made_top, top) || (path[top] && path[top] != '/')) return; /* not under it */
  char *p = zck__strdup(path);
  if (!p) return;
  size_t n = strlen(p);
  for (;;) {
    while (n > top && p[n - 1] == '/') p[--n] = 0;
    if (n < top || rmdir(p) != 0) break; /* not empty (or not ours to remove): stop */
    if (n == top) break;
    while (n > top && p[n - 1] != '/') p[--n] = 0;
  }
  free(p);
}

void zck__rmdirs_made_for(const char *path, const char *made_top) {
  if (!path || !made_top) return;
  char *parent = zck__parent_dir(path);
  if (parent) zck__rmdirs_made(parent, made_top);
  free(parent);
}

zck_status zck__resolve_out(const char *path, char **resolved) {
  *resolved = NULL;
  char *copy = zck__strdup(path);
  if (!copy) return ZCK_ERR_NO_MEMORY;
  size_t n = strlen(copy);
  while (n > 1 && copy[n - 1] == '/') copy[--n] = 0; /* "link/" names the link */
  struct stat lsb, sb;
  /* only links to folders: a link to a file may name another suffix than the file it
   * points at, and OUT's suffix picks the output format */
  if (lstat(copy, &lsb) != 0 || !S_ISLNK(lsb.st_mode) || (stat(copy, &sb) == 0 && !S_ISDIR(sb.st_mode))) {
    free(copy);
    *resolved = zck__strdup(path); /* as given: a trailing '/' still says "a folder" */
    return *resolved ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  }
  zck_status s = ZCK_OK;
  if (stat(copy, &sb) != 0)
    s = zck__fail(ZCK_ERR_INVALID_ARG, "%s: a symlink to a missing path; create its target or remove the link", path);
  else if (!(*resolved = realpath(copy, NULL)))
    s = zck__fail_errno(errno, "%s: cannot resolve the symlink", path);
  free(copy);
  return s;
}

zck_status zck__remove_tree(const char *path) {
  if (zck__follower()) return ZCK_OK;
  struct stat st;
  if (lstat(path, &st) != 0) return errno == ENOENT ? ZCK_OK : zck__fail_errno(errno, "%s: cannot stat", path);
  if (S_ISDIR(st.st_mode)) {
    DIR *d = opendir(path);
    if (!d) return zck__fail_errno(errno, "%s: cannot open directory", path);
    struct dirent *e;
    zck_status s = ZCK_OK;
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      char *child = zck__path_join(path, e->d_name);
      if (!child) { s = ZCK_ERR_NO_MEMORY; break; }
      zck_status cs = zck__remove_tree(child);
      free(child);
      if (cs != ZCK_OK && s == ZCK_OK) s = cs;
    }
    closedir(d);
    if (s != ZCK_OK) return s;
    if (rmdir(path) != 0) return zck__fail_errno(errno, "%s: cannot remove directory", path);
    return ZCK_OK;
  }
  if (unlink(path) != 0) return zck__fail_errno(errno, "%s: cannot remove", path);
  return ZCK_OK;
}
