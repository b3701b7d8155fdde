/* out_inputs.c: an OUT that is a job's input, holds it or lies inside it is refused before
 * any work (see zck_check_out_not_input in zck.h).
 *
 * Paths are compared by device and inode, never as strings: "ck/./x", a hard link and a
 * symlink to an input are the input. The input of a job is
 * - a file: itself (a file converted onto itself would lose what the conversion drops);
 * - a DeepSpeed (or universal) root: the root and its `latest` files (OUT may not replace
 *   or hold them; a new folder inside the root is fine, as `to-universal ck ck/universal`),
 *   and the tag folder they name, which is closed: OUT may not lie inside it either, and
 *   every entry of it (a rank file may be a symlink kept elsewhere) is an input file;
 * - any other folder (a tag folder, an HF folder): closed, as a tag folder. */
#include "io.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct zck__node {
  dev_t dev;
  ino_t ino;
} zck__node;

static bool zck__node_of(const char *path, zck__node *n) {
  struct stat st;
  if (stat(path, &st) != 0) return false;
  n->dev = st.st_dev;
  n->ino = st.st_ino;
  return true;
}

static bool zck__node_eq(const zck__node *a, const zck__node *b) { return a->dev == b->dev && a->ino == b->ino; }

/* True when `dir` is path itself or one of the folders above it (path resolved first). */
static bool zck__node_above(const char *path, const zck__node *dir) {
  char *r = realpath(path, NULL);
  if (!r) return false;
  bool hit = false;
  for (;;) {
    zck__node n;
    if (zck__node_of(r, &n) && zck__node_eq(&n, dir)) { hit = true; break; }
    char *slash = strrchr(r, '/');
    if (!slash || (slash == r && !r[1])) break;
    if (slash == r) slash[1] = 0;
    else *slash = 0;
  }
  free(r);
  return hit;
}

/* The deepest existing path of out (out itself, or the folder its missing parents would
 * be made in): what OUT lies inside. Caller frees. */
static char *zck__existing_part(const char *out) {
  char *p = zck__strdup(out);
  while (p) {
    struct stat st;
    if (stat(p, &st) == 0) return p;
    char *slash = strrchr(p, '/');
    if (!slash) { free(p); return zck__strdup("."); }
    if (slash == p) { p[1] = 0; continue; }
    *slash = 0;
  }
  return NULL;
}

/* The tag a root's `file` (latest, latest_universal) names, or NULL. */
static char *zck__named_tag(const char *root, const char *file) {
  char *path = zck__path_join(root, file), *text = NULL;
  struct stat st;
  if (path && stat(path, &st) == 0 && S_ISREG(st.st_mode)) (void)zck__read_small_file(path, 4096, &text, NULL);
  zck_clear_error();
  free(path);
  if (!text) return NULL;
  char *b = text, *e = text + strlen(text);
  while (*b && isspace((unsigned char)*b)) b++;
  while (e > b && isspace((unsigned char)e[-1])) e--;
  *e = 0;
  char *tag = *b && !strchr(b, '/') && strcmp(b, ".") && strcmp(b, "..") ? zck__strdup(b) : NULL;
  free(text);
  return tag;
}

/* OUT (which exists when out_node is set) against one input path that OUT may not be or
 * hold; desc says what the path is ("is the input x.pt (or a link to it)"). */
static zck_status zck__check_kept(const char *out, const zck__node *out_node, bool out_dir, const char *path,
                                  const char *desc) {
  zck__node n;
  if (!out_node || !zck__node_of(path, &n)) return ZCK_OK;
  if (zck__node_eq(&n, out_node) || (out_dir && zck__node_above(path, out_node)))
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: %s; replacing it would delete the input (write the output elsewhere)", out,
                     desc);
  return ZCK_OK;
}

/* A closed input folder: OUT may not be it, hold it, lie inside it, or be (or hold) any
 * entry of it. desc as for zck__check_kept. */
static zck_status zck__check_closed(const char *out, const zck__node *out_node, bool out_dir, const char *dir,
                                    const char *desc) {
  zck__node dn;
  if (!zck__node_of(dir, &dn)) return ZCK_OK;
  ZCK_TRY(zck__check_kept(out, out_node, out_dir, dir, desc));
  char *part = zck__existing_part(out);
  bool inside = part && zck__node_above(part, &dn);
  free(part);
  if (inside)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: lies inside the input folder %s; writing there would change the input "
                     "(write the output elsewhere)", out, dir);
  if (!out_node) return ZCK_OK;
  DIR *d = opendir(dir);
  if (!d) return ZCK_OK;
  zck_status s = ZCK_OK;
  struct dirent *e;
  while (s == ZCK_OK && (e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char *p = zck__path_join(dir, e->d_name);
    char *what = p ? zck__sprintf("is the input file %s (or a link to it, or a folder holding it)", p) : NULL;
    s = what ? zck__check_kept(out, out_node, out_dir, p, what) : ZCK_ERR_NO_MEMORY;
    free(what);
    free(p);
  }
  closedir(d);
  return s;
}

zck_status zck_check_out_not_input(const char *in, const char *out, const char *tag) {
  struct stat ist, ost;
  if (!in || !out || stat(in, &ist) != 0) return ZCK_OK; /* the job says what is wrong with IN */
  bool out_exists = stat(out, &ost) == 0;
  zck__node on = {ost.st_dev, ost.st_ino};
  const zck__node *out_node = out_exists ? &on : NULL;
  bool out_dir = out_exists && S_ISDIR(ost.st_mode);
  char *desc = zck__sprintf(S_ISDIR(ist.st_mode) ? "is the input %s or a folder holding it" : "is the input %s (or a link to it)", in);
  if (!desc) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__check_kept(out, out_node, out_dir, in, desc);
  free(desc);
  if (s != ZCK_OK || !S_ISDIR(ist.st_mode)) return s;
  const char *files[2] = {"latest", "latest_universal"};
  bool root = false, found = false;
  for (int i = 0; i < 2 && s == ZCK_OK; i++) {
    char *p = zck__path_join(in, files[i]);
    struct stat st;
    if (!p) return ZCK_ERR_NO_MEMORY;
    if (stat(p, &st) == 0) {
      root = true;
      char *what = zck__sprintf("is the input file %s (or a link to it)", p);
      s = what ? zck__check_kept(out, out_node, out_dir, p, what) : ZCK_ERR_NO_MEMORY;
      free(what);
    }
    free(p);
    if (s != ZCK_OK) break;
    char *t = tag ? (i ? NULL : zck__strdup(tag)) : zck__named_tag(in, files[i]);
    char *dir = t ? zck__path_join(in, t) : NULL;
    if (s == ZCK_OK && dir && stat(dir, &st) == 0 && S_ISDIR(st.st_mode)) {
      found = true;
      char *what = zck__sprintf("is the tag folder %s of the input %s or a folder holding it", t, in);
      s = what ? zck__check_closed(out, out_node, out_dir, dir, what) : ZCK_ERR_NO_MEMORY;
      free(what);
    }
    free(dir);
    free(t);
  }
  if (s == ZCK_OK && !found && !root && !tag) {
    desc = zck__sprintf("is the input %s or a folder holding it", in);
    s = desc ? zck__check_closed(out, out_node, out_dir, in, desc) : ZCK_ERR_NO_MEMORY;
    free(desc);
  }
  return s;
}
