/* out_summary.c: what a committed job left at OUT (zck_job_summary in zck.h): the files
 * and bytes there, counted once the output is in place, so every job and layout counts
 * alike. Stats only, reads no data. */
#include "io.h"
#include "util.h"
#include "zck.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void zck__summary_walk(int dfd, const char *name, int depth, zck_job_summary *sum) {
  struct stat st;
  if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  if (S_ISREG(st.st_mode)) {
    sum->files++;
    sum->bytes += (uint64_t)st.st_size;
    return;
  }
  if (!S_ISDIR(st.st_mode) || depth > 64) return;
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  DIR *d = fdopendir(fd);
  if (!d) { close(fd); return; }
  struct dirent *e;
  while ((e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) zck__summary_walk(fd, e->d_name, depth + 1, sum);
  closedir(d);
}

void zck__job_summary_fill(zck_job_summary *sum, const char *out, uint64_t tensors) {
  if (!sum) return;
  memset(sum, 0, sizeof *sum);
  sum->tensors = tensors;
  char *real = NULL; /* OUT may be a link to the folder written */
  if (zck__resolve_out(out, &real) != ZCK_OK) { zck_clear_error(); return; }
  zck__summary_walk(AT_FDCWD, real, 0, sum);
  free(real);
}
