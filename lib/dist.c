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
#include <sys/stat.h>
#include <unistd.h>

#include "error.h"
#include "util.h"

typedef struct dist_outfile {
  int fd;          /* the placeholder the writer holds; the real file is put on it */
  char *path;
  bool opened;
} dist_outfile;

typedef struct dist_stub {
  dev_t dev;
  ino_t ino;
  uint64_t *holes;   /* pairs */
  size_t n_holes;
} dist_stub;

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
  char *root;
  dist_stub *stubs;
  size_t n_stubs, cap_stubs;
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
  zck__dist_set_root(NULL);
  zck__dist_clear_stubs();
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
  if (!zck__dist_on()) return local; /* off, or paused (rank 0 alone) */
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

void zck__dist_set_root(const char *root) {
  free(g.root);
  g.root = root ? strdup(root) : NULL;
  size_t n = g.root ? strlen(g.root) : 0;
  while (n > 1 && g.root[n - 1] == '/') g.root[--n] = 0;
}

const char *zck__dist_key(const char *name) {
  size_t n = g.root ? strlen(g.root) : 0;
  if (!n || strncmp(name, g.root, n) || (name[n] && name[n] != '/')) return name;
  name += n;
  while (*name == '/' || (name[0] == '.' && name[1] == '/')) name += *name == '/' ? 1 : 2;
  return name;
}

static int cmp_stub(const void *a, const void *b) {
  const dist_stub *x = a, *y = b;
  if (x->dev != y->dev) return x->dev < y->dev ? -1 : 1;
  return x->ino < y->ino ? -1 : x->ino > y->ino;
}

zck_status zck__dist_add_stub(const char *path, const uint64_t *holes, size_t n_holes) {
  struct stat sb;
  if (stat(path, &sb) != 0) return zck__fail_errno(errno, "%s: cannot stat", path);
  dist_stub s = {sb.st_dev, sb.st_ino, NULL, n_holes};
  if (n_holes && !(s.holes = zck__malloc(2 * n_holes * sizeof *s.holes))) return ZCK_ERR_NO_MEMORY;
  if (n_holes) memcpy(s.holes, holes, 2 * n_holes * sizeof *s.holes);
  pthread_mutex_lock(&g.mu);
  if (g.n_stubs == g.cap_stubs) {
    size_t nc = g.cap_stubs ? 2 * g.cap_stubs : 64;
    dist_stub *v = realloc(g.stubs, nc * sizeof *v);
    if (v) { g.stubs = v; g.cap_stubs = nc; }
  }
  bool ok = g.n_stubs < g.cap_stubs;
  if (ok) {
    g.stubs[g.n_stubs++] = s;
    qsort(g.stubs, g.n_stubs, sizeof *g.stubs, cmp_stub); /* a few per node-local file, once */
  }
  pthread_mutex_unlock(&g.mu);
  if (!ok) {
    free(s.holes);
    return ZCK_ERR_NO_MEMORY;
  }
  return ZCK_OK;
}

void zck__dist_clear_stubs(void) {
  pthread_mutex_lock(&g.mu);
  for (size_t i = 0; i < g.n_stubs; i++) free(g.stubs[i].holes);
  free(g.stubs);
  g.stubs = NULL;
  g.n_stubs = g.cap_stubs = 0;
  pthread_mutex_unlock(&g.mu);
}

bool zck__dist_has_stubs(void) { return g.n_stubs > 0; }

static const dist_stub *find_stub(dev_t dev, ino_t ino) {
  dist_stub key = {dev, ino, NULL, 0};
  return g.n_stubs ? bsearch(&key, g.stubs, g.n_stubs, sizeof *g.stubs, cmp_stub) : NULL;
}

bool zck__dist_holds(const char *name) {
  struct stat sb;
  if (!g.n_stubs || stat(name, &sb) != 0) return true;
  pthread_mutex_lock(&g.mu);
  bool held = !find_stub(sb.st_dev, sb.st_ino);
  pthread_mutex_unlock(&g.mu);
  return held;
}

zck_status zck__dist_check_read(int fd, const char *name, uint64_t off, uint64_t n) {
  struct stat sb;
  if (!g.n_stubs || fd < 0 || fstat(fd, &sb) != 0) return ZCK_OK;
  zck_status s = ZCK_OK;
  pthread_mutex_lock(&g.mu);
  const dist_stub *st = find_stub(sb.st_dev, sb.st_ino);
  for (size_t i = 0; st && i < st->n_holes && s == ZCK_OK; i++) {
    uint64_t lo = st->holes[2 * i], hi = st->holes[2 * i + 1];
    if (off < hi && off + n > lo)
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: bytes %llu..%llu are on another node's disk, and this rank needs them "
                    "to describe the checkpoint (node-local files are read only where they are)", zck__dist_key(name),
                    (unsigned long long)(off > lo ? off : lo), (unsigned long long)(off + n < hi ? off + n : hi));
  }
  pthread_mutex_unlock(&g.mu);
  return s;
}

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
