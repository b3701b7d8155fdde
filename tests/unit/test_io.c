/* test_io.c: bounds-checked sources, atomic outputs, fault injection. */
#include "test.h"
#include <signal.h>
#include <time.h>
#include "io.h"

#include <errno.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int exists(const char *p) { struct stat st; return stat(p, &st) == 0; }

static int is_link(const char *p) { struct stat st; return lstat(p, &st) == 0 && S_ISLNK(st.st_mode); }

static char *j(const char *a, const char *b) { return zck__path_join(a, b); }

/* Regressions: an OUT that is a link to a folder was replaced by the output (the library
 * renamed over the link); a failed save left the parent folders it made; a file OUT with
 * missing parents failed where a folder OUT got them made. */
static void test_out_links_and_parents(const char *dir) {
  char *base = j(dir, "lp");
  ZT_ASSERT(mkdir(base, 0755) == 0);
  char *tgt = j(base, "target"), *link = j(base, "link"), *in_tgt = j(tgt, "f.bin");
  ZT_ASSERT(mkdir(tgt, 0755) == 0);
  ZT_ASSERT(symlink("target", link) == 0);
  /* an outdir at a link to a folder: written at the target, the link stays */
  zck__outdir d;
  ZT_OK(zck__outdir_create(&d, link, false));
  char *f = zck__outdir_file(&d, "f.bin");
  ZT_ASSERT(zt_write_file(f, "1", 1) == 0);
  ZT_OK(zck__outdir_commit(&d));
  zck__outdir_abort(&d);
  free(f);
  ZT_ASSERT(is_link(link));
  ZT_ASSERT(exists(in_tgt));
  /* ... also as "link/", and with --overwrite over what is there */
  char *link_slash = zck__sprintf("%s/", link);
  ZT_OK(zck__outdir_create(&d, link_slash, true));
  f = zck__outdir_file(&d, "g.bin");
  ZT_ASSERT(zt_write_file(f, "2", 1) == 0);
  ZT_OK(zck__outdir_commit(&d));
  zck__outdir_abort(&d);
  free(f);
  ZT_ASSERT(is_link(link));
  ZT_ASSERT(!exists(in_tgt));
  /* a dangling link is refused, naming it */
  char *dangling = j(base, "dangling");
  ZT_ASSERT(symlink("nowhere", dangling) == 0);
  ZT_ERR(zck__outdir_create(&d, dangling, true), ZCK_ERR_INVALID_ARG, "dangling: a symlink to a missing path");
  ZT_ASSERT(is_link(dangling));
  zck__outfile of;
  char *link_file = j(base, "filelink.bin"), *real_file = j(base, "real.bin");
  ZT_ASSERT(zt_write_file(real_file, "x", 1) == 0 && symlink("real.bin", link_file) == 0);

  /* a failed save removes the parent folders it made, only those, only if empty */
  char *made = j(base, "m1"), *deep = j(base, "m1/m2/out"), *keep = j(base, "k1"), *keep_deep = j(base, "k1/k2/out");
  ZT_OK(zck__outdir_create(&d, deep, false));
  ZT_ASSERT(exists(made));
  zck__outdir_abort(&d);
  ZT_ASSERT(!exists(made));
  ZT_ASSERT(exists(base));
  zck__io_fault_set(ZCK_IO_OP_RENAME, 1, EIO); /* a failed commit, then the abort */
  ZT_OK(zck__outdir_create(&d, deep, false));
  ZT_ERR(zck__outdir_commit(&d), ZCK_ERR_IO, "cannot rename");
  zck__outdir_abort(&d);
  zck__io_fault_set(ZCK_IO_OP_RENAME, 0, 0);
  ZT_ASSERT(!exists(made));
  ZT_OK(zck__outdir_create(&d, keep_deep, false)); /* someone else's file lands in k1 meanwhile */
  char *other = j(keep, "other");
  ZT_ASSERT(zt_write_file(other, "o", 1) == 0);
  zck__outdir_abort(&d);
  ZT_ASSERT(exists(other));
  char *k2 = j(keep, "k2");
  ZT_ASSERT(!exists(k2));

  /* a file OUT with missing parents: made, as for a folder OUT, and undone on failure */
  char *fdeep = j(base, "m1/m2/model.safetensors");
  ZT_OK(zck__outfile_create(&of, fdeep));
  ZT_OK(zck__outfile_pwrite(&of, "abc", 3, 0));
  zck__outfile_abort(&of);
  ZT_ASSERT(!exists(made));
  zck__io_fault_set(ZCK_IO_OP_WRITE, 1, ENOSPC);
  ZT_OK(zck__outfile_create(&of, fdeep));
  ZT_ERR(zck__outfile_pwrite(&of, "abc", 3, 0), ZCK_ERR_NO_SPACE, "m1/m2/model.safetensors: write of");
  zck__outfile_abort(&of);
  zck__io_fault_set(ZCK_IO_OP_WRITE, 0, 0);
  ZT_ASSERT(!exists(made));
  zck__io_fault_set(ZCK_IO_OP_RENAME, 1, EIO);
  ZT_OK(zck__outfile_create(&of, fdeep));
  ZT_ERR(zck__outfile_commit(&of), ZCK_ERR_IO, "cannot rename");
  zck__io_fault_set(ZCK_IO_OP_RENAME, 0, 0);
  ZT_ASSERT(!exists(made));
  ZT_OK(zck__outfile_create(&of, fdeep));
  ZT_OK(zck__outfile_pwrite(&of, "abc", 3, 0));
  ZT_OK(zck__outfile_commit(&of));
  zck__outfile_abort(&of);
  ZT_ASSERT(exists(fdeep));
  /* a link to a file is still replaced (its suffix, not the target's, says the format) */
  ZT_OK(zck__outfile_create(&of, link_file));
  ZT_OK(zck__outfile_commit(&of));
  ZT_ASSERT(!is_link(link_file));
  free(base); free(tgt); free(link); free(in_tgt); free(link_slash); free(dangling); free(link_file); free(real_file);
  free(made); free(deep); free(keep); free(keep_deep); free(other); free(k2); free(fdeep);
}

int main(void) {
  char *dir = zt_tmpdir();
  char buf[16];

  /* memory source: reads inside, truncation error outside */
  zck__source ms;
  zck__source_memory(&ms, "mem.bin", "abcdef", 6);
  ZT_OK(zck__source_read(&ms, buf, 3, 3));
  ZT_EQ_MEM(buf, "def", 3);
  ZT_ERR(zck__source_read(&ms, buf, 4, 3), ZCK_ERR_TRUNCATED, "mem.bin: truncated");
  ZT_ERR(zck__source_read(&ms, buf, 1, UINT64_MAX), ZCK_ERR_TRUNCATED, "truncated");
  zck__source_close(&ms);

  /* outfile: invisible until commit */
  char *path = zck__path_join(dir, "out.bin");
  zck__outfile of;
  ZT_OK(zck__outfile_create(&of, path));
  ZT_OK(zck__outfile_pwrite(&of, "hello", 5, 0));
  ZT_ASSERT(!exists(path));
  ZT_OK(zck__outfile_commit(&of));
  ZT_ASSERT(exists(path));
  zck__source fs;
  ZT_OK(zck__source_open(&fs, path));
  ZT_EQ_U64(fs.size, 5);
  /* a window of a file source, and a window of that window: bounded by its own size, and
   * closing it leaves the parent's descriptor open */
  {
    zck__source w1, w2;
    ZT_OK(zck__source_window(&w1, &fs, 1, 3, "out.bin item"));
    ZT_OK(zck__source_window(&w2, &w1, 1, 2, NULL));
    ZT_OK(zck__source_read(&w2, buf, 2, 0));
    ZT_EQ_MEM(buf, "ll", 2);
    ZT_ERR(zck__source_read(&w1, buf, 2, 2), ZCK_ERR_TRUNCATED, "out.bin item: truncated");
    zck__source_close(&w2);
    /* a window that does not fit is refused and holds nothing to close */
    ZT_ERR(zck__source_window(&w2, &w1, 2, 2, NULL), ZCK_ERR_INVALID_ARG, "out.bin item: bytes 2..4");
    zck__source_close(&w1);
    ZT_OK(zck__source_read(&fs, buf, 5, 0));
    ZT_EQ_MEM(buf, "hello", 5);
  }
  ZT_OK(zck__source_read(&fs, buf, 5, 0));
  ZT_EQ_MEM(buf, "hello", 5);
  ZT_ERR(zck__source_read(&fs, buf, 6, 0), ZCK_ERR_TRUNCATED, "out.bin: truncated");
  zck__source_close(&fs);

  /* injected ENOSPC: the write fails with a clear message; abort leaves nothing */
  ZT_OK(zck__outfile_create(&of, path));
  zck__io_fault_set(ZCK_IO_OP_WRITE, 1, ENOSPC);
  ZT_ERR(zck__outfile_pwrite(&of, "x", 1, 0), ZCK_ERR_NO_SPACE, "No space left");
  char *tmp = strdup(of.tmp_path);
  zck__outfile_abort(&of);
  ZT_ASSERT(!exists(tmp));
  free(tmp);
  zck__io_fault_set(ZCK_IO_OP_WRITE, 0, 0);
  /* the committed file is untouched */
  ZT_OK(zck__source_open(&fs, path));
  ZT_EQ_U64(fs.size, 5);
  zck__source_close(&fs);

  /* outdir: created under a temp name, renamed whole; refuses a non-empty target */
  char *od = zck__path_join(dir, "outdir");
  zck__outdir d;
  ZT_OK(zck__outdir_create(&d, od, false));
  char *f1 = zck__outdir_file(&d, "a.txt");
  ZT_ASSERT(zt_write_file(f1, "1", 1) == 0);
  ZT_ASSERT(!exists(od));
  ZT_OK(zck__outdir_commit(&d));
  zck__outdir_abort(&d);
  free(f1);
  f1 = zck__path_join(od, "a.txt");
  ZT_ASSERT(exists(f1));
  ZT_ERR(zck__outdir_create(&d, od, false), ZCK_ERR_EXISTS, "not empty");
  /* a failed rename keeps the old directory */
  ZT_OK(zck__outdir_create(&d, od, true));
  zck__io_fault_set(ZCK_IO_OP_RENAME, 1, EIO);
  ZT_ERR(zck__outdir_commit(&d), ZCK_ERR_IO, "cannot rename");
  zck__io_fault_set(ZCK_IO_OP_RENAME, 0, 0);
  zck__outdir_abort(&d);
  ZT_ASSERT(exists(f1));
  /* a crashed writer's temporary tree (its pid is gone) is cleaned by the next save in the
   * same directory, whatever it was writing */
  pid_t child = fork();
  if (child == 0) _exit(0);
  int wst;
  waitpid(child, &wst, 0);
  char stale[4096], mine[4096];
  snprintf(stale, sizeof stale, "%s/.checkpoint-10.zck-tmp-%ld", dir, (long)child);
  snprintf(mine, sizeof mine, "%s/.fresh.zck-tmp-1", dir); /* pid 1 is alive: kept */
  ZT_ASSERT(mkdir(stale, 0755) == 0 && mkdir(mine, 0755) == 0);
  char *fresh = zck__path_join(dir, "fresh");
  ZT_OK(zck__outdir_create(&d, fresh, false));
  ZT_ASSERT(!exists(stale));
  ZT_ASSERT(exists(mine));
  zck__outdir_abort(&d);
  free(fresh);
  /* pid reuse: a running process that started after the entry last changed is not its
   * writer; one that started before may be */
  ZT_ASSERT(zck__writer_gone((long)child, time(NULL)));           /* exited */
  pid_t sleeper = fork();
  if (sleeper == 0) { sleep(30); _exit(0); }
  ZT_ASSERT(zck__writer_gone((long)sleeper, time(NULL) - 100));    /* started after: reused */
  ZT_ASSERT(!zck__writer_gone((long)sleeper, time(NULL) + 100));   /* started before: live */
  ZT_ASSERT(!zck__writer_gone(1, time(NULL)));                    /* init, since boot */
  /* a zombie (dead, not reaped: an MPI rank whose mpirun is gone) wrote its last */
  kill(sleeper, SIGKILL);
  for (int i = 0; i < 1000 && !zck__writer_gone((long)sleeper, time(NULL) + 100); i++) usleep(1000);
  ZT_ASSERT(zck__writer_gone((long)sleeper, time(NULL) + 100));
  waitpid(sleeper, &wst, 0);
  free(f1); free(od); free(path);
  test_out_links_and_parents(dir);
  free(dir);
  return 0;
}
