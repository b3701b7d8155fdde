/* io_outfile.c: single output files, written under a temporary name beside the final path
 * and committed (fsync, rename, fsync of the folder) or aborted; and their placeholders on
 * the other ranks of a distributed job. See io.h. */
#include "io_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the other ranks of a distributed job (dist.h)
 *
 * Rank 0 alone creates, names, fills in and commits or removes the output. Another rank
 * only computes the same names (temporaries carry rank 0's pid) and holds a placeholder
 * descriptor for each file, onto which dist.c opens rank 0's file when a copy starts; it
 * writes nothing outside its share of a copy. */

static zck_status zck__outfile_follow(zck__outfile *f, const char *final_path) {
  f->path = zck__strdup(final_path);
  f->in_outdir = zck__in_open_dir(final_path);
  zck_status s = f->path ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK && !f->in_outdir) {
    char *real = NULL;
    s = zck__resolve_out(final_path, &real);
    if (s == ZCK_OK) {
      free(f->path);
      f->path = real;
    }
  }
  if (s == ZCK_OK) f->tmp_path = f->in_outdir ? zck__strdup(f->path) : zck__tmp_sibling(f->path);
  if (s == ZCK_OK && !f->tmp_path) s = ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK && (f->fd = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0)
    s = zck__fail_errno(errno, "%s: cannot create output", final_path);
  if (s == ZCK_OK) zck__dist_outfile_add(f->fd, f->tmp_path);
  if (s != ZCK_OK) zck__outfile_abort(f);
  return s;
}

/* f back to closed, its names freed. */
static void zck__outfile_forget(zck__outfile *f) {
  free(f->made_top);
  free(f->tmp_path);
  free(f->path);
  memset(f, 0, sizeof *f);
  f->fd = -1;
}

static void zck__outfile_unfollow(zck__outfile *f) {
  if (f->fd >= 0) {
    zck__dist_outfile_remove(f->fd);
    close(f->fd);
  }
  zck__outfile_forget(f);
}

/* ---- single output files */


zck_status zck__outfile_create(zck__outfile *f, const char *final_path) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  if (zck__follower()) return zck__outfile_follow(f, final_path);
  f->path = zck__strdup(final_path);
  f->in_outdir = zck__in_open_dir(final_path);
  /* inside a temporary tree the file is written in place: the whole tree is the
   * temporary (a rename per file costs as much as the write of a small one) */
  f->tmp_path = f->in_outdir ? zck__strdup(final_path) : zck__tmp_sibling(final_path);
  if (!f->path || !f->tmp_path) { zck__outfile_abort(f); return ZCK_ERR_NO_MEMORY; }
  if (!f->in_outdir) {
    /* a folder's link is written through (see zck__resolve_out); the parents a folder
     * OUT gets made (zck__outdir_create) a file OUT gets too */
    char *real = NULL;
    zck_status s = zck__resolve_out(final_path, &real);
    if (s == ZCK_OK && strcmp(real, f->path)) {
      free(f->path);
      free(f->tmp_path);
      f->path = real;
      real = NULL;
      f->tmp_path = zck__tmp_sibling(f->path);
      if (!f->tmp_path) s = ZCK_ERR_NO_MEMORY;
    }
    free(real);
    char *parent = s == ZCK_OK ? zck__parent_dir(f->path) : NULL;
    if (s == ZCK_OK && !parent) s = ZCK_ERR_NO_MEMORY;
    /* never inside a temporary tree (another process's, or one being removed): making
     * it again would leave it behind */
    if (s == ZCK_OK && !strstr(parent, ".zck-tmp-")) s = zck__mkdirs_track(parent, &f->made_top);
    free(parent);
    struct stat st;
    /* a folder cannot be replaced by a file (rename fails only at the very end) */
    if (s == ZCK_OK && stat(f->path, &st) == 0 && S_ISDIR(st.st_mode))
      s = zck__fail(ZCK_ERR_EXISTS, "%s: exists and is a folder; this output is one file (remove the folder or name "
                    "another OUT)", final_path);
    if (s == ZCK_OK) {
      /* absent now: the commit must not replace what appears meanwhile (another writer) */
      f->was_absent = lstat(f->path, &st) != 0 && errno == ENOENT;
      zck__clean_stale_temps(f->path); /* dead writers' temporaries (and their lost outputs back) */
    }
    if (s != ZCK_OK) {
      free(f->tmp_path);
      f->tmp_path = NULL;
      zck__outfile_abort(f);
      return s;
    }
  }
  int fe = zck__io_fault(ZCK_IO_OP_OPEN);
  f->fd = fe ? -1 : open(f->tmp_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (f->fd < 0) {
    zck_status s = zck__fail_errno(fe ? fe : errno, "%s: cannot create output", final_path);
    free(f->tmp_path);
    f->tmp_path = NULL;
    zck__outfile_abort(f);
    return s;
  }
  return ZCK_OK;
}

zck_status zck__outfile_pwrite(zck__outfile *f, const void *data, size_t n, uint64_t off) {
  if (!zck__dist_writes()) return ZCK_OK; /* rank 0 writes it */
  if (f->img) return zck__outfile_image_write(f, data, n, off);
  return zck__pwrite_all(f->fd, data, n, off, f->path);
}

zck_status zck__outfile_truncate(zck__outfile *f, uint64_t size) {
  if (!zck__dist_writes()) return ZCK_OK;
  ZCK_TRY(zck__outfile_image_flush(f));
  if (ftruncate(f->fd, (off_t)size) != 0) return zck__fail_errno(errno, "%s: cannot set size", f->path);
  return ZCK_OK;
}

/* rename(2) that never replaces: OUT was absent when the run began, so whatever is there
 * now another writer put there (two runs writing one OUT), and it is left as it is.
 * Filesystems without RENAME_NOREPLACE get link + unlink (link never replaces either). */
static zck_status zck__rename_noreplace(const char *from, const char *to) {
  int r = renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE);
  if (r != 0 && (errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
    r = link(from, to);
    if (r == 0) unlink(from);
    else if (errno == EPERM || errno == EOPNOTSUPP) r = rename(from, to); /* no hard links at all (vfat) */
  }
  if (r == 0) return ZCK_OK;
  if (errno == EEXIST)
    return zck__fail(ZCK_ERR_EXISTS, "%s: appeared while this run wrote it (another run writing the same OUT?); "
                     "left as it is, nothing written", to);
  return zck__fail_errno(errno, "%s: cannot rename into place", to);
}

zck_status zck__outfile_commit(zck__outfile *f) {
  /* A failed commit is an abort: the temporary file is removed and f freed, so callers
   * never leak or leave anything behind whatever step failed. */
  /* a distributed job: rank 0 renames only once every rank has finished with the file
   * (the others may still read it back, by its temporary name, to hash it) */
  zck_status agreed = f->in_outdir ? ZCK_OK : zck__dist_agree(ZCK__DIST_COMMIT, ZCK_OK);
  if (zck__follower()) {
    zck__outfile_unfollow(f);
    return agreed;
  }
  if (agreed != ZCK_OK) {
    zck__outfile_abort(f);
    return agreed;
  }
  zck_status s = zck__outfile_image_flush(f);
  zck__outfile_image_free(f);
  if (s == ZCK_OK && !f->in_outdir) {
    int fe = zck__io_fault(ZCK_IO_OP_FSYNC);
    if (fe || fsync(f->fd) != 0) s = zck__fail_errno(fe ? fe : errno, "%s: fsync failed", f->path);
  }
  if (s == ZCK_OK) {
    int r = close(f->fd);
    f->fd = -1;
    if (r != 0) s = zck__fail_errno(errno, "%s: close failed", f->path);
  }
  /* The destination's previous version stays reachable (a second hard link) until the
   * rename is durable: when the directory fsync fails, the rename is undone and the
   * earlier file is back, so a failed commit never leaves the new file or loses the old. */
  char *old = NULL;
  if (s == ZCK_OK && !f->in_outdir) {
    old = zck__sprintf("%s.zck-old-%ld", f->tmp_path, (long)getpid());
    if (!old) s = ZCK_ERR_NO_MEMORY;
    else if (link(f->path, old) != 0) {
      if (errno != ENOENT) s = zck__fail_errno(errno, "%s: cannot keep the previous version while replacing it", f->path);
      free(old);
      old = NULL;
    }
  }
  if (s == ZCK_OK && !f->in_outdir) {
    int fe = zck__io_fault(ZCK_IO_OP_RENAME);
    if (fe) s = zck__fail_errno(fe, "%s: cannot rename into place", f->path);
    else if (f->was_absent && !f->in_outdir) s = zck__rename_noreplace(f->tmp_path, f->path);
    else if (rename(f->tmp_path, f->path) != 0) s = zck__fail_errno(errno, "%s: cannot rename into place", f->path);
  }
  if (s != ZCK_OK) {
    if (old) unlink(old);
    free(old);
    zck__outfile_abort(f);
    return s;
  }
  free(f->tmp_path);
  f->tmp_path = NULL;
  if (!f->in_outdir) {
    char *parent = zck__parent_dir(f->path);
    s = parent ? zck__fsync_path(parent, true) : ZCK_ERR_NO_MEMORY;
    if (s != ZCK_OK) {
      /* undo: the earlier version back in place, or no file at all (nor the folders
       * made for it) */
      if (old && rename(old, f->path) == 0) {
        free(old);
        old = NULL;
      } else if (!old) {
        unlink(f->path);
        if (parent && f->made_top) zck__rmdirs_made(parent, f->made_top);
      }
    }
    free(parent);
  }
  if (old) unlink(old);
  free(old);
  free(f->path);
  f->path = NULL;
  free(f->made_top);
  f->made_top = NULL;
  return s;
}

void zck__outfile_abort(zck__outfile *f) {
  if (!f) return;
  if (zck__follower()) {
    zck__outfile_unfollow(f);
    return;
  }
  zck__outfile_image_free(f);
  if (f->fd >= 0) close(f->fd);
  if (f->tmp_path) unlink(f->tmp_path);
  zck__rmdirs_made_for(f->path, f->made_top);
  zck__outfile_forget(f);
}
