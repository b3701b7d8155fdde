/* io.c: bounds-checked inputs, atomic outputs, fault injection. See io.h. */
#include "io.h"
#include "dist.h"

#include "threadpool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

/* ---- fault injection */

static _Atomic uint64_t zck__fault_count[ZCK_IO_OP_COUNT];
static uint64_t zck__fault_nth[ZCK_IO_OP_COUNT];
static int zck__fault_errno[ZCK_IO_OP_COUNT];
static atomic_int zck__fault_parsed;

static void zck__fault_parse_env(void) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&zck__fault_parsed, &expected, 1)) return;
  const char *spec = getenv("ZCK_FAULT");
  if (!spec || !*spec) return;
  static const char *names[ZCK_IO_OP_COUNT] = {"read", "write", "fsync", "rename", "open"};
  char op[16] = {0}, err[16] = {0};
  unsigned long long nth = 0;
  int got = sscanf(spec, "%15[a-z]:%llu:%15s", op, &nth, err);
  if (got < 2) return;
  int e = EIO;
  if (got == 3) {
    if (!strcmp(err, "ENOSPC")) e = ENOSPC;
    else if (!strcmp(err, "EIO")) e = EIO;
    else if (!strcmp(err, "EDQUOT")) e = EDQUOT;
    else if (!strcmp(err, "SHORT")) e = -1; /* a short write: half the bytes then ENOSPC */
    else if (!strcmp(err, "KILL")) e = -9;  /* simulate a crash: _exit(137) */
  }
  for (int i = 0; i < ZCK_IO_OP_COUNT; i++)
    if (!strcmp(op, names[i])) { zck__fault_nth[i] = nth; zck__fault_errno[i] = e; }
}

void zck__io_fault_set(zck__io_op op, uint64_t nth, int err) {
  atomic_store(&zck__fault_parsed, 1);
  zck__fault_nth[op] = nth;
  zck__fault_errno[op] = err;
  atomic_store(&zck__fault_count[op], 0);
}

int zck__io_fault(zck__io_op op) {
  zck__fault_parse_env();
  if (!zck__fault_nth[op]) return 0;
  uint64_t n = atomic_fetch_add(&zck__fault_count[op], 1) + 1;
  if (n != zck__fault_nth[op]) return 0;
  if (zck__fault_errno[op] == -9) _exit(137);
  return zck__fault_errno[op];
}

/* ---- raw calls with retries */

zck_status zck__pread_all(int fd, void *data, size_t n, uint64_t off, const char *name) {
  uint8_t *p = data;
  while (n) {
    int fe = zck__io_fault(ZCK_IO_OP_READ);
    if (fe > 0) return zck__fail_errno(fe, "%s: read of %zu bytes at offset %llu failed", name, n, (unsigned long long)off);
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return zck__fail_errno(errno, "%s: read of %zu bytes at offset %llu failed", name, n, (unsigned long long)off);
    }
    if (r == 0)
      return zck__fail(ZCK_ERR_TRUNCATED, "%s: truncated: file ends before offset %llu", name,
                       (unsigned long long)(off + n));
    p += r; n -= (size_t)r; off += (uint64_t)r;
  }
  return ZCK_OK;
}

/* Writes at least this big start their writeback at once (see io.h). */
#define ZCK__WRITE_BEHIND_BYTES ((size_t)1 << 20)
/* One pwrite copies at most this much into the page cache: on Linux 6.x (ext4) a 4 MiB
 * write cost ~5x the system time of the same bytes in 256 KiB writes
 * (tests/bench/results-checks-1e9-cold.txt). */
#define ZCK__WRITE_PIECE ((size_t)256 << 10)

zck_status zck__pwrite_all(int fd, const void *data, size_t n, uint64_t off, const char *name) {
  const uint8_t *p = data;
  size_t total = n;
  uint64_t start = off;
  while (n) {
    int fe = zck__io_fault(ZCK_IO_OP_WRITE);
    if (fe == -1 && n > 1) { /* short write, then the disk is full */
      ssize_t r = pwrite(fd, p, n / 2, (off_t)off);
      (void)r;
      fe = ENOSPC;
    }
    if (fe > 0) return zck__fail_errno(fe, "%s: write of %zu bytes at offset %llu failed", name, n, (unsigned long long)off);
    ssize_t r = pwrite(fd, p, n < ZCK__WRITE_PIECE ? n : ZCK__WRITE_PIECE, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return zck__fail_errno(errno, "%s: write of %zu bytes at offset %llu failed", name, n, (unsigned long long)off);
    }
    p += r; n -= (size_t)r; off += (uint64_t)r;
    /* a hint: on anything but a regular file it fails, and the fsync at commit is what
     * makes the data durable either way */
    if (total >= ZCK__WRITE_BEHIND_BYTES && (off - start >= ZCK__WRITE_BEHIND_BYTES || !n)) {
      (void)sync_file_range(fd, (off_t)start, (off_t)(off - start), SYNC_FILE_RANGE_WRITE);
      start = off;
    }
  }
  return ZCK_OK;
}

zck_status zck__fsync_path(const char *path, bool is_dir) {
  int fd = open(path, (is_dir ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  if (fd < 0) return zck__fail_errno(errno, "%s: cannot open for fsync", path);
  int fe = zck__io_fault(ZCK_IO_OP_FSYNC);
  int r = fe ? -1 : fsync(fd);
  int e = fe ? fe : errno;
  close(fd);
  if (r != 0 && !(is_dir && e == EINVAL)) return zck__fail_errno(e, "%s: fsync failed", path);
  return ZCK_OK;
}

/* ---- sources */

zck_status zck__source_open(zck__source *src, const char *path) {
  memset(src, 0, sizeof *src);
  src->fd = -1;
  int fe = zck__io_fault(ZCK_IO_OP_OPEN);
  if (fe) return zck__fail_errno(fe, "%s: cannot open", path);
  /* O_NONBLOCK: opening a FIFO for reading would wait for a writer for ever; it is
   * refused below, as every other non-regular file (a device reads without end) */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return zck__fail_errno(errno, "%s: cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int e = errno;
    close(fd);
    return zck__fail_errno(e, "%s: cannot stat", path);
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: is a directory, expected a file", path);
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: not a regular file (a FIFO, socket or device), expected a file", path);
  }
  src->name = zck__strdup(path);
  if (!src->name) { close(fd); return ZCK_ERR_NO_MEMORY; }
  src->fd = fd;
  src->size = (uint64_t)st.st_size;
  return ZCK_OK;
}

void zck__source_memory(zck__source *src, const char *name, const void *data, uint64_t size) {
  memset(src, 0, sizeof *src);
  src->fd = -1;
  src->name = zck__strdup(name ? name : "<memory>");
  src->mem = data;
  src->size = size;
}

zck_status zck__source_window(zck__source *win, const zck__source *parent, uint64_t off, uint64_t size,
                              const char *name) {
  memset(win, 0, sizeof *win);
  win->fd = -1;
  uint64_t end;
  if (!zck__add_u64(off, size, &end) || end > parent->size)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: bytes %llu..%llu lie past its end (%llu bytes)", parent->name,
                     (unsigned long long)off, (unsigned long long)off + size, (unsigned long long)parent->size);
  win->name = zck__strdup(name ? name : parent->name);
  if (!win->name) return ZCK_ERR_NO_MEMORY;
  win->fd = parent->fd;
  win->mem = parent->mem;
  win->base = parent->base + off;
  win->size = size;
  win->window = true;
  return ZCK_OK;
}

zck_status zck__source_read(const zck__source *src, void *dst, size_t n, uint64_t off) {
  uint64_t end;
  if (!zck__add_u64(off, n, &end) || end > src->size)
    return zck__fail(ZCK_ERR_TRUNCATED, "%s: truncated: need bytes %llu..%llu but the file has %llu",
                     src->name, (unsigned long long)off, (unsigned long long)off + n, (unsigned long long)src->size);
  off += src->base;
  /* a node-local checkpoint's file another node holds: only its metadata is here */
  if (src->fd >= 0 && zck__dist_has_stubs()) ZCK_TRY(zck__dist_check_read(src->fd, src->name, off, n));
  if (!n) return ZCK_OK;
  if (src->mem) {
    memcpy(dst, src->mem + off, n);
    return ZCK_OK;
  }
  return zck__pread_all(src->fd, dst, n, off, src->name);
}

const uint8_t *zck__source_peek(const zck__source *src, uint64_t off, uint64_t n) {
  uint64_t end;
  if (!src->mem || !zck__add_u64(off, n, &end) || end > src->size) return NULL;
  return src->mem + src->base + off;
}

void zck__source_close(zck__source *src) {
  if (!src) return;
  if (src->fd >= 0 && !src->window) close(src->fd);
  free(src->name);
  memset(src, 0, sizeof *src);
  src->fd = -1;
}

zck_status zck__read_small_file(const char *path, size_t max, char **out, size_t *len) {
  zck__source src;
  *out = NULL;
  ZCK_TRY(zck__source_open(&src, path));
  if (src.size > max) {
    uint64_t size = src.size; /* close zeroes src */
    zck__source_close(&src);
    return zck__fail(ZCK_ERR_LIMIT, "%s: %llu bytes, more than the %zu expected", path, (unsigned long long)size, max);
  }
  char *buf = zck__malloc((size_t)src.size + 1);
  if (!buf) { zck__source_close(&src); return ZCK_ERR_NO_MEMORY; }
  zck_status s = zck__source_read(&src, buf, (size_t)src.size, 0);
  if (s == ZCK_OK) {
    buf[src.size] = 0;
    if (len) *len = (size_t)src.size;
    *out = buf;
  } else {
    free(buf);
  }
  zck__source_close(&src);
  return s;
}

/* ---- temporary names beside the final path */

static char *zck__tmp_sibling(const char *final_path) {
  char *copy1 = zck__strdup(final_path), *copy2 = zck__strdup(final_path);
  char *res = NULL;
  if (copy1 && copy2) {
    size_t n = strlen(copy1);
    while (n > 1 && copy1[n - 1] == '/') copy1[--n] = 0, copy2[n] = 0;
    const char *dir = dirname(copy1), *base = basename(copy2);
    res = zck__sprintf("%s/.%s.zck-tmp-%ld", dir, base, zck__dist_tmp_pid()); /* rank 0's in a distributed job */
  }
  free(copy1);
  free(copy2);
  return res;
}

static char *zck__parent_dir(const char *path) {
  char *copy = zck__strdup(path);
  if (!copy) return NULL;
  size_t n = strlen(copy);
  while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
  char *res = zck__strdup(dirname(copy));
  free(copy);
  return res;
}

/* ---- open output directories of this process
 *
 * The temporary trees of the outdirs between create and commit/abort. A file created
 * inside one needs no fsync of its own: the outdir's commit fsyncs the whole tree before
 * anything of it becomes visible. */

static pthread_mutex_t zck__open_dirs_mu = PTHREAD_MUTEX_INITIALIZER;
static char **zck__open_dirs;
static size_t zck__n_open_dirs, zck__cap_open_dirs;

static void zck__open_dirs_add(const char *tmp_path) {
  pthread_mutex_lock(&zck__open_dirs_mu);
  if (zck__n_open_dirs == zck__cap_open_dirs) {
    size_t nc = zck__cap_open_dirs ? 2 * zck__cap_open_dirs : 8;
    char **v = realloc(zck__open_dirs, nc * sizeof *v);
    if (v) { zck__open_dirs = v; zck__cap_open_dirs = nc; }
  }
  /* out of memory: the tree's files simply keep their own fsync */
  char *copy = zck__n_open_dirs < zck__cap_open_dirs ? strdup(tmp_path) : NULL;
  if (copy) zck__open_dirs[zck__n_open_dirs++] = copy;
  pthread_mutex_unlock(&zck__open_dirs_mu);
}

static void zck__open_dirs_remove(const char *tmp_path) {
  pthread_mutex_lock(&zck__open_dirs_mu);
  for (size_t i = 0; i < zck__n_open_dirs; i++) {
    if (strcmp(zck__open_dirs[i], tmp_path)) continue;
    free(zck__open_dirs[i]);
    zck__open_dirs[i] = zck__open_dirs[--zck__n_open_dirs];
    break;
  }
  if (!zck__n_open_dirs) { /* nothing left behind for leak checkers */
    free(zck__open_dirs);
    zck__open_dirs = NULL;
    zck__cap_open_dirs = 0;
  }
  pthread_mutex_unlock(&zck__open_dirs_mu);
}

static bool zck__in_open_dir(const char *path) {
  bool in = false;
  pthread_mutex_lock(&zck__open_dirs_mu);
  for (size_t i = 0; i < zck__n_open_dirs && !in; i++) {
    size_t n = strlen(zck__open_dirs[i]);
    in = !strncmp(path, zck__open_dirs[i], n) && path[n] == '/' && !strstr(path + n, "/../");
  }
  pthread_mutex_unlock(&zck__open_dirs_mu);
  return in;
}

/* ---- the other ranks of a distributed job (dist.h)
 *
 * Rank 0 alone creates, names, fills in and commits or removes the output. Another rank
 * only computes the same names (temporaries carry rank 0's pid) and holds a placeholder
 * descriptor for each file, onto which dist.c opens rank 0's file when a copy starts; it
 * writes nothing outside its share of a copy. */

static bool zck__follower(void) { return zck__dist_on() && zck__dist_rank() != 0; }

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

static void zck__outfile_unfollow(zck__outfile *f) {
  if (f->fd >= 0) {
    zck__dist_outfile_remove(f->fd);
    close(f->fd);
  }
  free(f->made_top);
  free(f->tmp_path);
  free(f->path);
  memset(f, 0, sizeof *f);
  f->fd = -1;
}

/* ---- single output files */

static void zck__clean_stale_temps(const char *final_path);

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
  if (f->made_top && f->path) { /* a failed save leaves no folders of its own behind */
    char *parent = zck__parent_dir(f->path);
    if (parent) zck__rmdirs_made(parent, f->made_top);
    free(parent);
  }
  free(f->made_top);
  free(f->tmp_path);
  free(f->path);
  memset(f, 0, sizeof *f);
  f->fd = -1;
}

/* ---- directories */

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

/* When process pid started, in seconds since the epoch (Linux: /proc/PID/stat field 22,
 * clock ticks after boot, plus btime from /proc/stat); -1 when unknown. */
static double zck__process_start_time(long pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
  if (!p) return -1;
  unsigned long long ticks = 0;
  int field = 2; /* the name was field 2; count the fields after it */
  char *save = NULL; /* strtok_r: jobs run in threads of their own */
  for (char *tok = strtok_r(p + 1, " ", &save); tok; tok = strtok_r(NULL, " ", &save))
    if (++field == 22) {
      ticks = strtoull(tok, NULL, 10);
      break;
    }
  if (field != 22) return -1;
  f = fopen("/proc/stat", "r");
  if (!f) return -1;
  double btime = -1;
  char line[256];
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "btime ", 6)) btime = strtod(line + 6, NULL);
  fclose(f);
  long hz = sysconf(_SC_CLK_TCK);
  return btime < 0 || hz <= 0 ? -1 : btime + (double)ticks / (double)hz;
}

/* Whether pid is a zombie (dead, not yet reaped: an MPI rank stopped after its mpirun
 * exited stays one for as long as its new parent, pid 1, does not reap it, which in a
 * container may be for ever). */
static bool zck__process_zombie(long pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  FILE *f = fopen(path, "r");
  if (!f) return false;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  const char *p = strrchr(buf, ')'); /* "PID (name) STATE ..." */
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

/* True when the writer of a temporary entry whose inode last changed at `changed` is gone:
 * its pid does not run (or is a zombie), or it runs but started after the entry was last
 * changed (the pid was reused: pids wrap within minutes on a busy machine). The inode
 * change time, not the modification time: creating, hard-linking (the kept previous
 * version of a replaced file) and renaming all set it, so it is never older than the
 * writer. */
bool zck__writer_gone(long pid, time_t changed) {
  if (kill((pid_t)pid, 0) != 0) return errno == ESRCH;
  if (zck__process_zombie(pid)) return true;
  double started = zck__process_start_time(pid);
  return started > 0 && started > (double)changed + 2.0; /* 2 s: clock-tick and time rounding */
}

/* Sweeps the folder of final_path of the temporaries of writers that died before their
 * commit (zck_sweep_temporaries, sweep.c): a save killed while writing checkpoint-10 leaves
 * a tree that no later save of checkpoint-20 would otherwise ever look at. An earlier
 * output a dead writer had moved aside comes back first, before OUT is judged. */
static void zck__clean_stale_temps(const char *final_path) {
  char *copy = zck__strdup(final_path);
  if (copy) {
    size_t n = strlen(copy);
    while (n > 1 && copy[n - 1] == '/') copy[--n] = 0;
    zck_sweep_temporaries(dirname(copy), ZCK_SWEEP_DEAD, NULL, NULL);
  }
  free(copy);
  zck_clear_error();
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
  if (zck__follower()) {
    if (d->tmp_path) zck__open_dirs_remove(d->tmp_path);
    free(d->made_top);
    free(d->tmp_path);
    free(d->path);
    memset(d, 0, sizeof *d);
    return;
  }
  if (d->sync_fd > 0) close(d->sync_fd - 1);
  if (d->tmp_path) {
    zck__open_dirs_remove(d->tmp_path);
    zck__remove_tree(d->tmp_path);
  }
  if (d->made_top && d->path) { /* a failed save leaves no folders of its own behind */
    char *parent = zck__parent_dir(d->path);
    if (parent) zck__rmdirs_made(parent, d->made_top);
    free(parent);
  }
  free(d->made_top);
  free(d->tmp_path);
  free(d->path);
  memset(d, 0, sizeof *d);
}
