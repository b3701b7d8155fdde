/* dist.c: the agreement points and process state of a distributed offline job (dist.h). */
#include "dist.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "error.h"
#include "util.h"

typedef struct dist_outfile {
  int fd;          /* the placeholder the writer holds; the real file is put on it */
  char *path;
  bool opened;
} dist_outfile;

typedef struct dist_noted {
  zck_store_write_fn write_fn;
  zck__dist_noted_fn noted;
} dist_noted;

static struct {
  zck_comm *c;
  int rank, size;
  long root_pid;
  bool follower, paused;
  atomic_bool in_copy;
  zck__dist_holds_fn holds;
  void *holds_ctx;
  pthread_mutex_t mu;
  dist_outfile *files;
  size_t n_files, cap_files;
  dist_noted noted[8];
  size_t n_noted;
} g = {.mu = PTHREAD_MUTEX_INITIALIZER, .size = 1};

zck_status zck__dist_begin(zck_comm *c) {
  if (!c || c->size < 2) return zck__fail(ZCK_ERR_INVALID_ARG, "distributed job: needs a group of 2 ranks or more");
  int64_t pid = (int64_t)getpid();
  ZCK_TRY(c->broadcast(c, &pid, 1, ZCK_I64, 0));
  g.c = c;
  g.rank = c->rank;
  g.size = c->size;
  g.root_pid = (long)pid;
  g.follower = false;
  atomic_store(&g.in_copy, false);
  return ZCK_OK;
}

void zck__dist_end(void) {
  pthread_mutex_lock(&g.mu);
  for (size_t i = 0; i < g.n_files; i++) free(g.files[i].path);
  free(g.files);
  g.files = NULL;
  g.n_files = g.cap_files = 0;
  pthread_mutex_unlock(&g.mu);
  g.c = NULL;
  g.rank = 0;
  g.size = 1;
  g.holds = NULL;
  g.holds_ctx = NULL;
  g.paused = false;
}

bool zck__dist_on(void) { return g.c != NULL && !g.paused; }
void zck__dist_pause(bool paused) { g.paused = paused; }
int zck__dist_rank(void) { return g.rank; }
int zck__dist_size(void) { return g.size; }
zck_comm *zck__dist_comm(void) { return g.c; }
bool zck__dist_writes(void) { return !zck__dist_on() || g.rank == 0 || atomic_load(&g.in_copy); }
long zck__dist_tmp_pid(void) { return g.c ? g.root_pid : (long)getpid(); }
void zck__dist_set_in_copy(bool on) { atomic_store(&g.in_copy, on); }
bool zck__dist_follower(void) { return g.follower; }

/* (point, status, failed on its own) of every rank */
static zck_status exchange(int point, zck_status local, int32_t **all_out) {
  int32_t mine[3] = {point, (int32_t)local, local != ZCK_OK && !g.follower};
  int32_t *all = zck__malloc((size_t)g.size * 3 * sizeof *all);
  if (!all) return ZCK_ERR_NO_MEMORY;
  zck_status s = g.c->all_gather(g.c, mine, all, 3, ZCK_I32);
  if (s != ZCK_OK) {
    free(all);
    return s;
  }
  *all_out = all;
  return ZCK_OK;
}

zck_status zck__dist_agree(int point, zck_status local) {
  if (!g.c) return local;
  char saved[1024];
  if (local != ZCK_OK) snprintf(saved, sizeof saved, "%s", zck_last_error());
  int32_t *all = NULL;
  zck_status s = exchange(point, local, &all);
  if (s != ZCK_OK) return local != ZCK_OK ? local : s;
  int bad = -1;
  for (int r = 0; r < g.size && bad < 0; r++)
    if (all[3 * r] != point || all[3 * r + 1] != ZCK_OK) bad = r;
  bool failed = bad >= 0 && all[3 * bad + 1] != ZCK_OK;
  free(all);
  if (local != ZCK_OK) {
    zck__fail(local, "%s", saved); /* the exchange may have touched the message */
    return local;
  }
  if (bad < 0) return ZCK_OK;
  g.follower = true;
  return zck__fail(ZCK_ERR_INTERNAL, "rank %d: %s", bad, failed ? "failed" : "left the job");
}

int zck__dist_finish(int rc, const char *msg, char *out, size_t out_size) {
  if (out_size) out[0] = 0;
  if (!g.c) {
    if (msg && out_size) snprintf(out, out_size, "%s", msg);
    return rc;
  }
  int32_t *all = NULL;
  for (;;) {
    free(all);
    all = NULL;
    if (exchange(ZCK__DIST_END, rc ? ZCK_ERR_INTERNAL : ZCK_OK, &all) != ZCK_OK) return rc ? rc : 1;
    bool done = true;
    for (int r = 0; r < g.size; r++) done = done && all[3 * r] == ZCK__DIST_END;
    if (done) break;
  }
  /* every rank's exit code, to pick the one to report */
  int32_t mine = rc;
  int32_t *codes = zck__malloc((size_t)g.size * sizeof *codes);
  if (!codes || g.c->all_gather(g.c, &mine, codes, 1, ZCK_I32) != ZCK_OK) {
    free(all);
    free(codes);
    return rc ? rc : 1;
  }
  int pick = -1;
  for (int r = 0; r < g.size && pick < 0; r++)
    if (codes[r] && all[3 * r + 2]) pick = r;
  for (int r = 0; r < g.size && pick < 0; r++)
    if (codes[r]) pick = r;
  int res = pick >= 0 ? codes[pick] : 0;
  free(all);
  free(codes);
  if (pick < 0) return 0;
  char buf[2048];
  memset(buf, 0, sizeof buf);
  if (g.rank == pick && msg) snprintf(buf, sizeof buf, "%s", msg);
  if (g.c->broadcast(g.c, buf, sizeof buf, ZCK_U8, pick) != ZCK_OK) buf[0] = 0;
  buf[sizeof buf - 1] = 0;
  if (out_size) snprintf(out, out_size, "%s", buf);
  return res;
}

// ---- node-local sources

void zck__dist_set_holds(zck__dist_holds_fn pred, void *ctx) {
  g.holds = pred;
  g.holds_ctx = ctx;
}

bool zck__dist_holds(const char *name) { return !g.holds || g.holds(g.holds_ctx, name); }

// ---- rank 0's output files, on the other ranks

void zck__dist_outfile_add(int fd, const char *path) {
  pthread_mutex_lock(&g.mu);
  if (g.n_files == g.cap_files) {
    size_t nc = g.cap_files ? 2 * g.cap_files : 16;
    dist_outfile *v = realloc(g.files, nc * sizeof *v);
    if (v) {
      g.files = v;
      g.cap_files = nc;
    }
  }
  char *p = g.n_files < g.cap_files ? strdup(path) : NULL;
  /* out of memory: the file is never opened here, and a copy writing it fails on the
   * placeholder (/dev/null takes it silently, so the count check below says so) */
  if (p) g.files[g.n_files++] = (dist_outfile){fd, p, false};
  pthread_mutex_unlock(&g.mu);
}

void zck__dist_outfile_remove(int fd) {
  pthread_mutex_lock(&g.mu);
  for (size_t i = 0; i < g.n_files; i++) {
    if (g.files[i].fd != fd) continue;
    free(g.files[i].path);
    g.files[i] = g.files[--g.n_files];
    break;
  }
  pthread_mutex_unlock(&g.mu);
}

zck_status zck__dist_outfiles_open(void) {
  zck_status s = ZCK_OK;
  pthread_mutex_lock(&g.mu);
  for (size_t i = 0; i < g.n_files && s == ZCK_OK; i++) {
    dist_outfile *f = &g.files[i];
    if (f->opened) continue;
    int nfd = open(f->path, O_RDWR | O_CLOEXEC);
    if (nfd < 0) {
      s = zck__fail_errno(errno, "%s: cannot open the output rank 0 made", f->path);
      break;
    }
    if (dup3(nfd, f->fd, O_CLOEXEC) < 0) s = zck__fail_errno(errno, "%s: cannot open the output rank 0 made", f->path);
    close(nfd);
    f->opened = s == ZCK_OK;
  }
  pthread_mutex_unlock(&g.mu);
  return s;
}

zck_status zck__dist_outfiles_sync(void) {
  zck_status s = ZCK_OK;
  pthread_mutex_lock(&g.mu);
  for (size_t i = 0; i < g.n_files && s == ZCK_OK; i++)
    if (g.files[i].opened && fdatasync(g.files[i].fd) != 0)
      s = zck__fail_errno(errno, "%s: fdatasync failed", g.files[i].path);
  pthread_mutex_unlock(&g.mu);
  return s;
}

// ---- writes made elsewhere

void zck__dist_register_noted(zck_store_write_fn write_fn, zck__dist_noted_fn noted) {
  pthread_mutex_lock(&g.mu);
  bool have = false;
  for (size_t i = 0; i < g.n_noted; i++) have = have || g.noted[i].write_fn == write_fn;
  if (!have && g.n_noted < sizeof g.noted / sizeof g.noted[0]) g.noted[g.n_noted++] = (dist_noted){write_fn, noted};
  pthread_mutex_unlock(&g.mu);
}

zck__dist_noted_fn zck__dist_noted_for(zck_store_write_fn write_fn) {
  zck__dist_noted_fn r = NULL;
  pthread_mutex_lock(&g.mu);
  for (size_t i = 0; i < g.n_noted && !r; i++)
    if (g.noted[i].write_fn == write_fn) r = g.noted[i].noted;
  pthread_mutex_unlock(&g.mu);
  return r;
}
