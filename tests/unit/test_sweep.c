/* test_sweep.c: zck_sweep_temporaries through zck.h only, as a program outside the
 * library uses it: dead writers' temporaries (files, trees with links out of them) go,
 * an earlier version moved aside comes back when its name is free and goes when it is
 * not, live writers' entries and names that only look alike stay; the own mode takes
 * this process's entries and nothing else. */
#include "test.h"
#include "zck.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char dir[4096];

static char *at(const char *fmt, long a, long b) {
  static char bufs[64][4096]; /* every path of the test stays valid */
  static int next;
  char name[1024];
  snprintf(name, sizeof name, fmt, a, b);
  char *p = bufs[next++ % 64];
  snprintf(p, 4096, "%s/%s", dir, name);
  return p;
}

static int exists(const char *p) { struct stat st; return lstat(p, &st) == 0; }

static void put(const char *path, const char *text) { ZT_ASSERT(zt_write_file(path, text, strlen(text)) == 0); }

static int holds(const char *path, const char *text) {
  unsigned char *d = NULL;
  size_t n = 0;
  int ok = zt_read_file(path, &d, &n) == 0 && n == strlen(text) && !memcmp(d, text, n);
  free(d);
  return ok;
}

int main(void) {
  char *tmp = zt_tmpdir();
  snprintf(dir, sizeof dir, "%s/out", tmp);
  ZT_ASSERT(mkdir(dir, 0755) == 0);
  long self = (long)getpid();
  /* a writer that died: a child that exited and was reaped */
  pid_t child = fork();
  if (child == 0) _exit(0);
  int wst;
  ZT_ASSERT(waitpid(child, &wst, 0) == child);
  long dead = (long)child;
  /* a writer still running (blocked on a pipe until the end of the test), started before
   * its entries were made */
  int pipefd[2];
  ZT_ASSERT(pipe(pipefd) == 0);
  pid_t live = fork();
  if (live == 0) {
    char c;
    close(pipefd[1]);
    while (read(pipefd[0], &c, 1) < 0 && errno == EINTR) {}
    _exit(0);
  }
  close(pipefd[0]);

  /* dead writer: a file, and a tree holding a link to something outside it */
  char *outside = at("keep-me", 0, 0);
  put(outside, "outside");
  char *dead_file = at(".model.safetensors.zck-tmp-%ld", dead, 0);
  put(dead_file, "partial");
  char *dead_tree = at(".checkpoint-10.zck-tmp-%ld", dead, 0);
  ZT_ASSERT(mkdir(dead_tree, 0755) == 0);
  char sub[4200];
  snprintf(sub, sizeof sub, "%s/global_step10", dead_tree);
  ZT_ASSERT(mkdir(sub, 0755) == 0);
  snprintf(sub, sizeof sub, "%s/global_step10/link", dead_tree);
  ZT_ASSERT(symlink(outside, sub) == 0);
  snprintf(sub, sizeof sub, "%s/global_step10/a.pt", dead_tree);
  put(sub, "a");
  /* dead writer between its two renames: NAME missing (comes back) and NAME there (the
   * commit finished: the earlier version goes) */
  char *lost = at(".hf.zck-tmp-%ld.zck-old-%ld", dead, dead);
  ZT_ASSERT(mkdir(lost, 0755) == 0);
  snprintf(sub, sizeof sub, "%s/model.safetensors", lost);
  put(sub, "earlier");
  char *done_old = at(".merged.bin.zck-tmp-%ld.zck-old-%ld", dead, dead);
  put(done_old, "earlier");
  char *done = at("merged.bin", 0, 0);
  put(done, "new");
  /* left alone: a live writer's, this process's own, and names that only look alike */
  char *live_tmp = at(".running.zck-tmp-%ld", live, 0);
  put(live_tmp, "being written");
  char *own_tmp = at(".mine.zck-tmp-%ld", self, 0);
  put(own_tmp, "mine");
  char *own_old = at(".prev.zck-tmp-%ld.zck-old-%ld", self, self);
  put(own_old, "previous");
  const char *lookalikes[] = {"x.zck-tmp-%ld", ".zck-tmp-%ld", ".y.zck-tmp-%ldz", ".y.zck-tmp-", ".y.zck-tmp-%ld.zck-old-",
                              ".y.zck-tmp-%ld.zck-older-1", ".y.zck-tmpx%ld"};
  size_t n_look = sizeof lookalikes / sizeof lookalikes[0];
  char *looks[16];
  for (size_t i = 0; i < n_look; i++) {
    looks[i] = strdup(at(lookalikes[i], dead, 0));
    put(looks[i], "not ours");
  }

  unsigned removed = 99, restored = 99;
  ZT_OK(zck_sweep_temporaries(dir, ZCK_SWEEP_DEAD, &removed, &restored));
  ZT_EQ_INT(removed, 3);
  ZT_EQ_INT(restored, 1);
  ZT_ASSERT(!exists(dead_file));
  ZT_ASSERT(!exists(dead_tree));
  ZT_ASSERT(holds(outside, "outside")); /* the link was removed, not followed */
  ZT_ASSERT(!exists(lost));
  snprintf(sub, sizeof sub, "%s/hf/model.safetensors", dir);
  ZT_ASSERT(holds(sub, "earlier"));
  ZT_ASSERT(!exists(done_old));
  ZT_ASSERT(holds(done, "new"));
  ZT_ASSERT(holds(live_tmp, "being written"));
  ZT_ASSERT(holds(own_tmp, "mine"));
  ZT_ASSERT(holds(own_old, "previous"));
  for (size_t i = 0; i < n_look; i++) ZT_ASSERT(holds(looks[i], "not ours"));
  /* a second sweep finds nothing */
  ZT_OK(zck_sweep_temporaries(dir, ZCK_SWEEP_DEAD, &removed, &restored));
  ZT_EQ_INT(removed, 0);
  ZT_EQ_INT(restored, 0);

  /* own mode (after an interruption): this process's entries only */
  char *dead_again = at(".other.zck-tmp-%ld", dead, 0);
  put(dead_again, "dead writer");
  ZT_OK(zck_sweep_temporaries(dir, ZCK_SWEEP_OWN, &removed, &restored));
  ZT_EQ_INT(removed, 1);
  ZT_EQ_INT(restored, 1);
  ZT_ASSERT(!exists(own_tmp));
  ZT_ASSERT(!exists(own_old));
  ZT_ASSERT(holds(at("prev", 0, 0), "previous"));
  ZT_ASSERT(holds(dead_again, "dead writer"));
  ZT_ASSERT(holds(live_tmp, "being written"));

  /* the live writer ends: its entry is a dead writer's now */
  close(pipefd[1]);
  ZT_ASSERT(waitpid(live, &wst, 0) == live);
  ZT_OK(zck_sweep_temporaries(dir, ZCK_SWEEP_DEAD, NULL, NULL));
  ZT_ASSERT(!exists(live_tmp));
  ZT_ASSERT(!exists(dead_again));

  /* a folder that is not there: one line naming it */
  char missing[4200];
  snprintf(missing, sizeof missing, "%s/nope", dir);
  ZT_ERR(zck_sweep_temporaries(missing, ZCK_SWEEP_DEAD, &removed, NULL), ZCK_ERR_NOT_FOUND, "nope");
  ZT_ASSERT(strchr(zck_last_error(), '\n') == NULL);
  ZT_ASSERT(zck_sweep_temporaries(missing, ZCK_SWEEP_OWN, NULL, NULL) == ZCK_ERR_NOT_FOUND);
  for (size_t i = 0; i < n_look; i++) free(looks[i]);
  free(tmp);
  return 0;
}
