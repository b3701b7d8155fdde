/* io.h: every byte zckpt reads or writes goes through here.
 *
 * - zck__source: a random-access input (a file read with pread, or a memory buffer, so
 *   tests and fuzzers never touch the disk). Reads are bounds-checked: asking past the
 *   end is a "truncated" error naming the source, the offset and the size.
 * - zck__outfile: an output written under a temporary name beside its final path, then
 *   committed (fsync, rename, fsync of the directory) or aborted (unlinked). Big writes
 *   start their writeback at once (sync_file_range), so the data reaches the disk while
 *   the rest is still being copied and the commit's fsync has little left to wait for.
 * - zck__outdir: a whole output directory built under a temporary name and renamed into
 *   place in one step, so a reader never sees half of it. Files this process creates
 *   inside an open outdir's temporary tree are durable only once the outdir is (nothing
 *   can see them before), so their commit is a rename; the outdir commit fsyncs every
 *   file and folder of the tree, many at once, before its rename.
 * - fault injection: ZCK_FAULT="op:N[:errno]" (op = read|write|fsync|rename|open) makes the
 *   Nth such call fail, so the full-disk / EIO / crash paths are tested without root.
 *
 * One file a concern: io_source.c, io_raw.c (the retried calls), io_outfile.c, io_image.c,
 * io_outdir.c, io_dirs.c, io_temp.c (temporary names, dead writers), io_fault.c.
 */
#ifndef ZCK_IO_H
#define ZCK_IO_H

#include "util.h"

#include <stdbool.h>
#include <time.h>
#include <stdint.h>

/* ---- inputs */
typedef struct zck__source {
  char *name;            /* for messages: the path, or "<memory>" */
  uint64_t size;
  int fd;                /* -1 for memory sources */
  const uint8_t *mem;    /* memory sources */
  uint64_t base;         /* a window: where byte 0 lies in fd / mem (0 otherwise) */
  bool window;           /* a window: fd is its parent's, not closed with it */
} zck__source;

zck_status zck__source_open(zck__source *src, const char *path);
void zck__source_memory(zck__source *src, const char *name, const void *data, uint64_t size);
/* A window [off, off + size) of parent as a source of its own (byte 0 = parent byte off),
 * named `name`: a file held inside another (a DCP item, a torch.save zip at an offset of
 * its .distcp file) is then opened by the readers of its format. It shares parent's
 * descriptor: parent must outlive it. INVALID_ARG (naming parent) if the range passes
 * parent's end. */
zck_status zck__source_window(zck__source *win, const zck__source *parent, uint64_t off, uint64_t size,
                              const char *name);
/* Reads exactly n bytes at off; ZCK_ERR_TRUNCATED if the range passes the end. */
zck_status zck__source_read(const zck__source *src, void *dst, size_t n, uint64_t off);
/* Pointer into a memory source, NULL for files. */
const uint8_t *zck__source_peek(const zck__source *src, uint64_t off, uint64_t n);
void zck__source_close(zck__source *src);

/* Reads a whole small file into a NUL-terminated buffer (max bytes, else LIMIT). */
zck_status zck__read_small_file(const char *path, size_t max, char **out, size_t *len);

/* ---- outputs */
typedef struct zck__outfile {
  int fd;
  char *path;      /* final path */
  char *tmp_path;  /* where it is written until commit */
  bool in_outdir;  /* inside an open zck__outdir of this process: its commit fsyncs it, and
                      the file is written in place (tmp_path == path) */
  char *made_top;  /* the highest missing parent folder this create made, or NULL */
  bool was_absent; /* nothing at path at create: the commit never replaces what came since */
  struct zck__outimg *img; /* the file assembled in memory until commit (io_image.c), or NULL */
} zck__outfile;
typedef struct zck__outimg zck__outimg;

/* Creates "<dir>/.<name>.zck-tmp-<pid>" for the final path, making its missing parent
 * folders (outside an open outdir; a failed commit or an abort removes those again, if
 * empty) and removing dead writers' temporaries beside it. A final path that is a symlink
 * to a folder is written at the link's target (the link stays); a dangling one is
 * refused. A final path absent at create is never replaced by the commit: another writer
 * that got there first wins, and this commit fails with ZCK_ERR_EXISTS. */
zck_status zck__outfile_create(zck__outfile *f, const char *final_path);
zck_status zck__outfile_pwrite(zck__outfile *f, const void *data, size_t n, uint64_t off);
zck_status zck__outfile_truncate(zck__outfile *f, uint64_t size);
/* fsync + rename over the final path + fsync of the directory (inside an open outdir:
 * the rename only, the outdir's commit syncs it). Closes the file. On failure the
 * temporary file is removed and f freed (as by zck__outfile_abort). */
zck_status zck__outfile_commit(zck__outfile *f);
/* Closes and unlinks the temporary file. Safe on a zeroed or committed outfile. */
void zck__outfile_abort(zck__outfile *f);
/* io_image.c: from now on f's writes are assembled in memory and written with one pwrite
 * at commit (or earlier, when the process's image budget or the file's limit is reached;
 * then writes go straight to the file). For outputs of many small writes that only
 * zck__outfile_pwrite touches: nothing may write or read f->fd directly meanwhile, but
 * zck__outfile_image_read. A no-op for the ranks of a distributed job. */
void zck__outfile_buffer(zck__outfile *f);
/* Copies n bytes at off out of f's image: false when f has none or they are not in it
 * (then they are on disk). */
bool zck__outfile_image_read(zck__outfile *f, void *buf, size_t n, uint64_t off);
zck_status zck__outfile_image_write(zck__outfile *f, const void *data, size_t n, uint64_t off);
zck_status zck__outfile_image_flush(zck__outfile *f);
void zck__outfile_image_free(zck__outfile *f);

/* pwrite/pread of exactly n bytes with EINTR/short-count retries (and fault injection). */
zck_status zck__pwrite_all(int fd, const void *data, size_t n, uint64_t off, const char *name);
zck_status zck__pread_all(int fd, void *data, size_t n, uint64_t off, const char *name);
zck_status zck__fsync_path(const char *path, bool is_dir);
/* True when the writer (pid) of a temporary entry whose inode changed last at `changed`
 * is gone: not running, or running but started after that (its pid was reused). */
bool zck__writer_gone(long pid, time_t changed);

/* ---- output directories */
typedef struct zck__outdir {
  char *path;      /* final directory */
  char *tmp_path;  /* "<parent>/.<name>.zck-tmp-<pid>" while being written */
  bool replace;    /* an existing final directory is replaced at commit */
  char *made_top;  /* the highest missing parent folder create made, or NULL */
  int sync_fd;     /* the temporary tree opened at create, plus 1 (0: none): commit syncfs'es
                      a big tree through it */
} zck__outdir;

/* Fails with ZCK_ERR_EXISTS if path exists and is non-empty, unless overwrite. Makes the
 * missing parent folders (an abort before commit removes them again, if empty). A path
 * that is a symlink to a folder is written at the link's target and stays a link
 * (d->path is the target); a dangling one is refused. */
zck_status zck__outdir_create(zck__outdir *d, const char *final_path, bool overwrite);
/* Path of a file inside the temporary directory (caller frees). */
char *zck__outdir_file(const zck__outdir *d, const char *name);
/* fsyncs every file and folder in it (in parallel), renames it into place, fsyncs the
 * parent. On failure the final path holds what it held before (a failed fsync of the
 * parent renames the tree back) and tmp_path is still set for zck__outdir_abort; only
 * if even that undo fails is the tree left in place, with tmp_path NULL. */
zck_status zck__outdir_commit(zck__outdir *d);
/* Removes the temporary tree. Safe after commit or on a zeroed struct. */
void zck__outdir_abort(zck__outdir *d);
/* rm -r of a tree we made (never follows symlinks). */
zck_status zck__remove_tree(const char *path);
zck_status zck__mkdirs(const char *path);
/* mkdir -p that also says the highest folder it made (*made_top, NULL when none; the
 * caller frees it): zck__rmdirs_made(path, made_top) removes path and its parents up to
 * made_top, each only if empty, undoing it after a failure. */
zck_status zck__mkdirs_track(const char *path, char **made_top);
void zck__rmdirs_made(const char *path, const char *made_top);
/* After a failed save of path (a file or folder): the parent folders its create made
 * (made_top, or NULL: none), so that it leaves no folders of its own behind. */
void zck__rmdirs_made_for(const char *path, const char *made_top);
/* OUT as a job writes it: a symlink to a folder ("model/" -> /disk/model) resolves to
 * its target (renaming the output over OUT itself would replace the link), a dangling
 * link is an error naming it, anything else is OUT as given. *resolved: caller frees. */
zck_status zck__resolve_out(const char *path, char **resolved);
/* Fills *sum (when not NULL) after a job committed OUT: tensors as given, and the regular
 * files at OUT (links not followed below OUT itself) and their bytes (out_summary.c). */
void zck__job_summary_fill(zck_job_summary *sum, const char *out, uint64_t tensors);

/* ---- fault injection */
typedef enum { ZCK_IO_OP_READ, ZCK_IO_OP_WRITE, ZCK_IO_OP_FSYNC, ZCK_IO_OP_RENAME, ZCK_IO_OP_OPEN, ZCK_IO_OP_COUNT } zck__io_op;
/* Returns 0, or the errno the injected fault wants. Thread-safe. */
int zck__io_fault(zck__io_op op);
/* Programmatic control for tests: fail the nth (1-based) op with err; n = 0 disables. */
void zck__io_fault_set(zck__io_op op, uint64_t nth, int err);

#endif
