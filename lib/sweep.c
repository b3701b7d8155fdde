/* sweep.c: the temporaries a writer leaves when it dies before its commit
 * (zck_sweep_temporaries, zck.h).
 *
 * Every output is built as ".NAME.zck-tmp-PID" beside NAME and renamed at its commit; a
 * commit replacing an earlier NAME first moves that one aside as
 * ".NAME.zck-tmp-PID.zck-old-PID" (io_outfile.c, io_outdir.c). A writer killed in between
 * leaves either.
 *
 * The sweep of this process's own entries runs after an interruption with every other
 * thread stopped wherever it was, possibly inside malloc or stdio: so the code below uses
 * system calls and stack buffers only (the check for dead writers, which reads /proc with
 * stdio, is made only in the other mode). */
#include "error.h"
#include "io.h"
#include "zck.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ZCK__TMP_MARK ".zck-tmp-"
#define ZCK__OLD_MARK ".zck-old-"

struct zck__sweep_dirent { /* the kernel's linux_dirent64 */
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

static bool zck__sweep_dot(const char *n) { return n[0] == '.' && (!n[1] || (n[1] == '.' && !n[2])); }

/* Reads decimal digits at s into *out; returns the first byte after them (s: none). */
static const char *zck__sweep_digits(const char *s, long *out) {
  long v = 0;
  const char *p = s;
  for (; *p >= '0' && *p <= '9'; p++) {
    if (v > (LONG_MAX - 9) / 10) return s;
    v = v * 10 + (*p - '0');
  }
  *out = v;
  return p;
}

/* Parses ".NAME.zck-tmp-PID" or ".NAME.zck-tmp-PID.zck-old-PID": the writer's pid, NAME's
 * length (NAME starts at name + 1) and whether it is an earlier version moved aside.
 * False for any other name. */
static bool zck__sweep_parse(const char *name, long *pid, size_t *name_len, bool *old) {
  if (name[0] != '.') return false;
  const char *mark = strstr(name + 1, ZCK__TMP_MARK);
  if (!mark || mark == name + 1) return false;
  const char *p = mark + strlen(ZCK__TMP_MARK), *end = zck__sweep_digits(p, pid);
  if (end == p || *pid <= 0) return false;
  *old = false;
  if (*end) {
    if (strncmp(end, ZCK__OLD_MARK, strlen(ZCK__OLD_MARK))) return false;
    long mover;
    const char *q = end + strlen(ZCK__OLD_MARK), *qend = zck__sweep_digits(q, &mover);
    if (qend == q || *qend) return false;
    *old = true;
  }
  *name_len = (size_t)(mark - name - 1);
  return true;
}

/* rm -r of dfd/name, never following symlinks; what cannot be removed stays. */
static void zck__sweep_rmrf_at(int dfd, const char *name, int depth) {
  if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) return;
  if (depth > 64) return;
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  char buf[2048];
  /* entries removed while the folder is being listed can make getdents skip some: list
   * again until the folder can go */
  for (int pass = 0; pass < 8; pass++) {
    lseek(fd, 0, SEEK_SET);
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
      for (long off = 0; off < n;) {
        struct zck__sweep_dirent *e = (struct zck__sweep_dirent *)(buf + off);
        off += e->reclen;
        if (!zck__sweep_dot(e->name)) zck__sweep_rmrf_at(fd, e->name, depth + 1);
      }
    }
    if (unlinkat(dfd, name, AT_REMOVEDIR) == 0 || errno != ENOTEMPTY) break;
  }
  close(fd);
}

zck_status zck_sweep_temporaries(const char *dir, zck_sweep_mode mode, unsigned *removed, unsigned *restored) {
  bool own = mode == ZCK_SWEEP_OWN;
  if (removed) *removed = 0;
  if (restored) *restored = 0;
  if (!dir || (mode != ZCK_SWEEP_DEAD && !own)) {
    if (own) return ZCK_ERR_INVALID_ARG;
    return zck__fail(ZCK_ERR_INVALID_ARG, "zck_sweep_temporaries: %s", dir ? "unknown mode" : "NULL folder");
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    zck_status s = errno == ENOENT ? ZCK_ERR_NOT_FOUND : ZCK_ERR_IO;
    return own ? s : zck__fail_errno(errno, "%s: cannot open folder", dir);
  }
  long self = (long)getpid();
  char buf[4096];
  for (int pass = 0; pass < 4; pass++) {
    bool changed = false;
    lseek(fd, 0, SEEK_SET);
    long n;
    while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0) {
      for (long off = 0; off < n;) {
        struct zck__sweep_dirent *e = (struct zck__sweep_dirent *)(buf + off);
        off += e->reclen;
        long pid;
        size_t len;
        bool old;
        if (!zck__sweep_parse(e->name, &pid, &len, &old)) continue;
        struct stat st;
        if (own ? pid != self : pid == self) continue;
        if (fstatat(fd, e->name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!own && !zck__writer_gone(pid, st.st_ctime)) continue; /* a live writer's */
        if (old && len <= NAME_MAX) {
          /* the writer died between its two renames: the earlier version goes back when
           * NAME is missing, else the commit had finished and it is removed as the commit
           * would have */
          char final[NAME_MAX + 1];
          memcpy(final, e->name + 1, len);
          final[len] = 0;
          struct stat fs;
          if (fstatat(fd, final, &fs, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT &&
              renameat(fd, e->name, fd, final) == 0) {
            if (restored) ++*restored;
            changed = true;
            continue;
          }
        }
        zck__sweep_rmrf_at(fd, e->name, 0);
        if (fstatat(fd, e->name, &st, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT && removed) ++*removed;
        changed = true;
      }
    }
    if (!changed) break;
  }
  close(fd);
  if (!own) zck_clear_error(); /* the /proc reads of the writer checks may have set one */
  return ZCK_OK;
}
