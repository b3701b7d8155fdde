/* dist_view.c: a checkpoint whose files are spread over the nodes' local disks, read by a
 * distributed job (lib/dist.h).
 *
 * DeepSpeed's use_node_local_storage has each node save its own ranks' files (and the
 * model states and `latest`) on its local disk, at the same path on every node:
 *     mpirun -np 16 --map-by ppr:8:node zckpt consolidate /local_nvme/ckpt /shared/out
 * Every rank must still describe the whole checkpoint, but reads tensor data only from
 * the files its node holds. So the ranks compare what they see under the source path; when
 * they all see the same files (a shared file system) nothing changes. Otherwise each rank
 * builds a private view folder of the whole tree: a link to each file its node holds, and
 * for every other file a sparse stub of the same size holding only the bytes that
 * describe it (the zip directory, headers, data.pkl, small records; a safetensors header),
 * sent by a rank that holds it. The job reads the view; lib/dist.h gives each source
 * record to a rank that holds its file and fails a read of a stub's missing bytes. On one
 * host the same is simulated by giving each rank its own folder (MPMD:
 * `mpirun -np 2 zckpt consolidate node0/ckpt OUT : -np 2 zckpt consolidate node1/ckpt OUT`).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist.h"
#include "error.h"
#include "io.h"
#include "util.h"
#include "torch/torch.h"
#include "zip/zip.h"

#define VIEW_MAX_FILES 1000000
#define VIEW_MAX_DEPTH 6
/* Records bigger than this are tensor data left on their node; smaller ones (step
 * counters, scalars, the pickle) travel with the metadata: the torch reader reads such a
 * record whole (to check its CRC) whenever a describer reads one of its tensors. */
#define VIEW_SMALL_RECORD ZCK_TORCH_SMALL_RECORD
#define VIEW_SMALL_FILE ((uint64_t)1 << 20)
#define VIEW_ZIP_TAIL ((uint64_t)128 << 10)
#define VIEW_MAX_META ((uint64_t)256 << 20)

typedef struct vlist {
  char **rel;
  int64_t *size;
  size_t n, cap;
} vlist;

static void vlist_free(vlist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->rel[i]);
  free(l->rel);
  free(l->size);
  memset(l, 0, sizeof *l);
}

static zck_status vlist_add(vlist *l, const char *rel, int64_t size) {
  if (l->n == VIEW_MAX_FILES) return zck__fail(ZCK_ERR_LIMIT, "more than %d files under the checkpoint", VIEW_MAX_FILES);
  if (l->n == l->cap) {
    size_t nc = l->cap ? 2 * l->cap : 64;
    char **r = zck__realloc(l->rel, nc * sizeof *r);
    if (r) l->rel = r;
    int64_t *s = r ? zck__realloc(l->size, nc * sizeof *s) : NULL;
    if (s) l->size = s;
    if (!r || !s) return ZCK_ERR_NO_MEMORY;
    l->cap = nc;
  }
  if (!(l->rel[l->n] = zck__strdup(rel))) return ZCK_ERR_NO_MEMORY;
  l->size[l->n++] = size;
  return ZCK_OK;
}

/* The regular files under root (links followed), by path below it; our temporaries skipped. */
static zck_status walk(const char *root, const char *rel, int depth, vlist *out) {
  char *dir = rel[0] ? zck__path_join(root, rel) : zck__strdup(root);
  if (!dir) return ZCK_ERR_NO_MEMORY;
  DIR *d = opendir(dir);
  if (!d) {
    zck_status s = zck__fail_errno(errno, "%s: cannot list", dir);
    free(dir);
    return s;
  }
  zck_status s = ZCK_OK;
  for (struct dirent *e; s == ZCK_OK && (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..") || strstr(e->d_name, ".zck-tmp-")) continue;
    char *r = rel[0] ? zck__path_join(rel, e->d_name) : zck__strdup(e->d_name);
    char *full = r ? zck__path_join(root, r) : NULL;
    struct stat sb;
    if (!r || !full) s = ZCK_ERR_NO_MEMORY;
    else if (stat(full, &sb) != 0) s = ZCK_OK; /* a dangling link: nothing to read */
    else if (S_ISDIR(sb.st_mode) && depth < VIEW_MAX_DEPTH) s = walk(root, r, depth + 1, out);
    else if (S_ISREG(sb.st_mode)) s = vlist_add(out, r, (int64_t)sb.st_size);
    free(r);
    free(full);
  }
  closedir(d);
  free(dir);
  return s;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

typedef struct ventry {
  char *rel;
  int64_t size;
} ventry;

static int cmp_entry(const void *a, const void *b) { return strcmp(((const ventry *)a)->rel, ((const ventry *)b)->rel); }

static zck_status vlist_sort(vlist *l) {
  ventry *v = zck__malloc((l->n ? l->n : 1) * sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < l->n; i++) v[i] = (ventry){l->rel[i], l->size[i]};
  qsort(v, l->n, sizeof *v, cmp_entry);
  for (size_t i = 0; i < l->n; i++) l->rel[i] = v[i].rel, l->size[i] = v[i].size;
  free(v);
  return ZCK_OK;
}

/* ---- the metadata of a file, as its holder sends it: size, kept ranges, their bytes */

typedef struct blob {
  uint8_t *p;
  size_t n;
} blob;

static int cmp_range(const void *a, const void *b) {
  const uint64_t *x = a, *y = b;
  return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* The ranges of path a rank without the file needs to describe it: all of a small file;
 * of a zip, everything but its big tensor records; of a safetensors file, its header. */
static zck_status meta_ranges(const char *path, uint64_t size, uint64_t **out, size_t *n_out) {
  uint64_t *kept = NULL;
  size_t nk = 0;
  if (size <= VIEW_SMALL_FILE) {
    if (!(kept = zck__malloc(2 * sizeof *kept))) return ZCK_ERR_NO_MEMORY;
    kept[0] = 0, kept[1] = size, nk = 1;
    *out = kept, *n_out = nk;
    return ZCK_OK;
  }
  zck__source src;
  ZCK_TRY(zck__source_open(&src, path));
  zck_zip *z = NULL;
  zck_status s = ZCK_OK;
  if (zck_zip_open(&src, &z) == ZCK_OK) {
    size_t n = zck_zip_count(z), nh = 0;
    uint64_t *holes = zck__malloc((n ? n : 1) * 2 * sizeof *holes);
    kept = zck__malloc((n + 1) * 2 * sizeof *kept);
    if (!holes || !kept) s = ZCK_ERR_NO_MEMORY;
    /* the zip reader looks for its directory in the file's last 64 KiB: those stay */
    uint64_t tail = size > VIEW_ZIP_TAIL ? size - VIEW_ZIP_TAIL : 0;
    for (size_t i = 0; s == ZCK_OK && i < n; i++) {
      const zck_zip_entry *e = zck_zip_entry_at(z, i);
      const char *slash = strrchr(e->name, '/');
      bool data = slash && slash - e->name >= 5 && !strncmp(slash - 5, "/data", 5);
      uint64_t lo = e->data_offset, hi = e->data_offset + e->comp_size;
      if (hi > tail) hi = tail;
      if (data && e->comp_size > VIEW_SMALL_RECORD && e->data_offset + e->comp_size <= size && hi > lo)
        holes[2 * nh] = lo, holes[2 * nh + 1] = hi, nh++;
    }
    if (s == ZCK_OK && nh) qsort(holes, nh, 2 * sizeof *holes, cmp_range);
    uint64_t at = 0;
    for (size_t i = 0; s == ZCK_OK && i < nh; i++) {
      if (holes[2 * i] > at) kept[2 * nk] = at, kept[2 * nk + 1] = holes[2 * i], nk++;
      if (holes[2 * i + 1] > at) at = holes[2 * i + 1];
    }
    if (s == ZCK_OK && at < size) kept[2 * nk] = at, kept[2 * nk + 1] = size, nk++;
    free(holes);
    zck_zip_close(z);
  } else {
    zck_clear_error();
    uint8_t h[8];
    kept = zck__malloc(2 * sizeof *kept);
    if (!kept) s = ZCK_ERR_NO_MEMORY;
    size_t len = strlen(path);
    if (s == ZCK_OK && len > 12 && !strcmp(path + len - 12, ".safetensors") && zck__source_read(&src, h, 8, 0) == ZCK_OK) {
      uint64_t hl = 0;
      for (int i = 7; i >= 0; i--) hl = hl << 8 | h[i];
      if (hl <= size - 8) kept[0] = 0, kept[1] = 8 + hl, nk = 1;
    }
    zck_clear_error(); /* anything else: no byte of it travels (a read of it fails, naming it) */
  }
  zck__source_close(&src);
  if (s != ZCK_OK) {
    free(kept);
    return s;
  }
  *out = kept, *n_out = nk;
  return ZCK_OK;
}

static zck_status meta_blob(const char *path, uint64_t size, blob *b) {
  uint64_t *kept = NULL;
  size_t nk = 0;
  ZCK_TRY(meta_ranges(path, size, &kept, &nk));
  uint64_t bytes = 16 + 16 * (uint64_t)nk;
  for (size_t i = 0; i < nk; i++) bytes += kept[2 * i + 1] - kept[2 * i];
  zck_status s = bytes <= VIEW_MAX_META ? ZCK_OK
                 : zck__fail(ZCK_ERR_LIMIT, "%s: %llu bytes of metadata to send to the ranks without it", path,
                             (unsigned long long)bytes);
  if (s == ZCK_OK && !(b->p = zck__malloc((size_t)bytes))) s = ZCK_ERR_NO_MEMORY;
  int fd = s == ZCK_OK ? open(path, O_RDONLY | O_CLOEXEC) : -1;
  if (s == ZCK_OK && fd < 0) s = zck__fail_errno(errno, "%s: cannot open", path);
  if (s == ZCK_OK) {
    uint64_t hdr[2] = {size, nk}, at = 16 + 16 * (uint64_t)nk;
    memcpy(b->p, hdr, 16);
    memcpy(b->p + 16, kept, 16 * nk);
    for (size_t i = 0; s == ZCK_OK && i < nk; i++) {
      uint64_t len = kept[2 * i + 1] - kept[2 * i];
      s = zck__pread_all(fd, b->p + at, (size_t)len, kept[2 * i], path);
      at += len;
    }
    b->n = (size_t)bytes;
  }
  if (fd >= 0) close(fd);
  free(kept);
  if (s != ZCK_OK) {
    free(b->p);
    b->p = NULL;
  }
  return s;
}

/* Writes the stub for a file this node lacks, and registers its holes. */
static zck_status write_stub(const char *path, const uint8_t *p, size_t n) {
  uint64_t hdr[2];
  if (n < 16) return zck__fail(ZCK_ERR_INTERNAL, "%s: short metadata", path);
  memcpy(hdr, p, 16);
  uint64_t size = hdr[0], nk = hdr[1];
  if (nk > (n - 16) / 16) return zck__fail(ZCK_ERR_INTERNAL, "%s: bad metadata", path);
  uint64_t *kept = zck__malloc((nk ? nk : 1) * 16), *holes = zck__malloc((nk + 1) * 16);
  if (!kept || !holes) {
    free(kept), free(holes);
    return ZCK_ERR_NO_MEMORY;
  }
  if (nk) memcpy(kept, p + 16, 16 * nk);
  int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  zck_status s = fd < 0 ? zck__fail_errno(errno, "%s: cannot create", path) : ZCK_OK;
  if (s == ZCK_OK && ftruncate(fd, (off_t)size) != 0) s = zck__fail_errno(errno, "%s: cannot set size", path);
  uint64_t at = 16 + 16 * nk, pos = 0;
  size_t nh = 0;
  for (uint64_t i = 0; s == ZCK_OK && i < nk; i++) {
    uint64_t lo = kept[2 * i], hi = kept[2 * i + 1];
    if (hi < lo || hi > size || hi - lo > n - at) {
      s = zck__fail(ZCK_ERR_INTERNAL, "%s: bad metadata", path);
      break;
    }
    if (lo > pos) holes[2 * nh] = pos, holes[2 * nh + 1] = lo, nh++;
    s = zck__pwrite_all(fd, p + at, (size_t)(hi - lo), lo, path);
    at += hi - lo;
    pos = hi;
  }
  if (s == ZCK_OK && pos < size) holes[2 * nh] = pos, holes[2 * nh + 1] = size, nh++;
  if (fd >= 0) close(fd);
  if (s == ZCK_OK) s = zck__dist_add_stub(path, holes, nh);
  free(kept), free(holes);
  return s;
}

/* mkdir -p of the view's own folders (not the output's: zck__mkdirs is rank 0's there) */
static zck_status view_mkdirs(const char *view, const char *rel) {
  char *p = zck__path_join(view, rel);
  if (!p) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  for (char *c = p + strlen(view) + 1; s == ZCK_OK && (c = strchr(c, '/')); c++) {
    *c = 0;
    if (mkdir(p, 0700) != 0 && errno != EEXIST) s = zck__fail_errno(errno, "%s: cannot create", p);
    *c = '/';
  }
  free(p);
  return s;
}

static int rm_item(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb, (void)flag, (void)ftw;
  remove(path);
  return 0;
}

/* The view folder, "$TMPDIR/.zckpt-nodelocal.zck-tmp-PID": named as every zckpt temporary,
 * so the view of a rank that was killed (SIGKILL, the OOM killer: no handler runs) is
 * removed by the next job on that node, which sweeps the dead writers' temporaries of
 * $TMPDIR first (zck_sweep_temporaries). */
static char *view_create(zck_status *s) {
  const char *tmpdir = getenv("TMPDIR");
  if (!tmpdir || !*tmpdir) tmpdir = "/tmp";
  zck_sweep_temporaries(tmpdir, ZCK_SWEEP_DEAD, NULL, NULL); /* what cannot go stays: not this job's concern */
  char *view = zck__sprintf("%s/.zckpt-nodelocal.zck-tmp-%ld", tmpdir, (long)getpid());
  if (!view) {
    *s = ZCK_ERR_NO_MEMORY;
    return NULL;
  }
  /* a leftover under this pid is a dead process's (the sweep passes over this pid's own) */
  int made = mkdir(view, 0700);
  if (made != 0 && errno == EEXIST) {
    nftw(view, rm_item, 16, FTW_DEPTH | FTW_PHYS);
    made = mkdir(view, 0700);
  }
  if (made == 0) return view;
  *s = zck__fail_errno(errno, "%s: cannot create the view of the node-local checkpoint", view);
  free(view);
  return NULL;
}

void zck__dist_view_close(char *view) {
  zck__dist_clear_stubs();
  if (view) nftw(view, rm_item, 16, FTW_DEPTH | FTW_PHYS);
  free(view);
}

/* Every rank's file list, to all. */
static zck_status exchange_lists(const vlist *mine, vlist *all /* [size] */) {
  zck_comm *c = zck__dist_comm();
  int size = zck__dist_size(), me = zck__dist_rank();
  zck_status s = ZCK_OK;
  for (int r = 0; s == ZCK_OK && r < size; r++) {
    uint8_t *p = NULL;
    int64_t len = 0;
    if (r == me) {
      for (size_t i = 0; i < mine->n; i++) len += (int64_t)strlen(mine->rel[i]) + 1 + 8;
      if (!(p = zck__malloc((size_t)len + 1))) len = -1;
      for (size_t i = 0, at = 0; p && i < mine->n; i++) {
        size_t l = strlen(mine->rel[i]) + 1;
        memcpy(p + at, mine->rel[i], l);
        memcpy(p + at + l, &mine->size[i], 8);
        at += l + 8;
      }
    }
    s = c->broadcast(c, &len, 1, ZCK_I64, r);
    if (s == ZCK_OK && len < 0) s = zck__fail(ZCK_ERR_NO_MEMORY, "rank %d: out of memory listing the checkpoint", r);
    if (s == ZCK_OK && r != me && !(p = zck__malloc((size_t)len + 1))) s = ZCK_ERR_NO_MEMORY;
    if (s == ZCK_OK && len) s = c->broadcast(c, p, (size_t)len, ZCK_U8, r);
    for (int64_t at = 0; s == ZCK_OK && at < len;) {
      const char *rel = (const char *)p + at;
      size_t l = strnlen(rel, (size_t)(len - at)) + 1;
      int64_t sz;
      if ((int64_t)l + 8 > len - at) { s = zck__fail(ZCK_ERR_INTERNAL, "file list of rank %d: truncated", r); break; }
      memcpy(&sz, p + at + l, 8);
      s = vlist_add(&all[r], rel, sz);
      at += (int64_t)l + 8;
    }
    free(p);
  }
  return s;
}

zck_status zck__dist_view_open(const char *root, char **view_out) {
  *view_out = NULL;
  if (!zck__dist_on()) return ZCK_OK;
  zck__dist_set_root(root);
  zck_comm *c = zck__dist_comm();
  int size = zck__dist_size(), me = zck__dist_rank();
  struct stat sb;
  /* a single-file source (an HDF5 container): every rank reads it at its path */
  int32_t is_dir = stat(root, &sb) == 0 && S_ISDIR(sb.st_mode), any_dir = 0;
  int32_t *dirs = zck__malloc((size_t)size * sizeof *dirs);
  zck_status s = zck__dist_agree(ZCK__DIST_CHECKED, dirs ? ZCK_OK : ZCK_ERR_NO_MEMORY);
  if (s == ZCK_OK) s = c->all_gather(c, &is_dir, dirs, 1, ZCK_I32);
  for (int r = 0; s == ZCK_OK && r < size; r++) any_dir |= dirs[r];
  free(dirs);
  if (s != ZCK_OK || !any_dir) return s;
  vlist mine = {0}, *all = zck__calloc((size_t)size, sizeof *all);
  if (!all) return ZCK_ERR_NO_MEMORY;
  s = is_dir ? walk(root, "", 0, &mine) : ZCK_OK; /* a rank without the folder holds none of it */
  s = zck__dist_agree(ZCK__DIST_CHECKED, s);
  if (s == ZCK_OK) s = exchange_lists(&mine, all);
  /* the union, sorted; who holds each file */
  vlist u = {0};
  for (int r = 0; s == ZCK_OK && r < size; r++)
    for (size_t i = 0; s == ZCK_OK && i < all[r].n; i++) s = vlist_add(&u, all[r].rel[i], all[r].size[i]);
  char **names = s == ZCK_OK ? zck__malloc((u.n ? u.n : 1) * sizeof *names) : NULL;
  if (s == ZCK_OK && !names) s = ZCK_ERR_NO_MEMORY;
  size_t nu = 0;
  if (s == ZCK_OK) {
    memcpy(names, u.rel, u.n * sizeof *names);
    qsort(names, u.n, sizeof *names, cmp_str);
    for (size_t i = 0; i < u.n; i++)
      if (!nu || strcmp(names[i], names[nu - 1])) names[nu++] = names[i];
  }
  for (int r = 0; s == ZCK_OK && r < size; r++) s = vlist_sort(&all[r]); /* each rank's list by name, to merge */
  int *holder = s == ZCK_OK ? zck__malloc((nu ? nu : 1) * sizeof *holder) : NULL;
  int64_t *fsize = s == ZCK_OK ? zck__malloc((nu ? nu : 1) * sizeof *fsize) : NULL;
  bool *here = s == ZCK_OK ? zck__calloc(nu ? nu : 1, sizeof *here) : NULL;
  int *count = s == ZCK_OK ? zck__calloc(nu ? nu : 1, sizeof *count) : NULL;
  if (s == ZCK_OK && (!holder || !fsize || !here || !count)) s = ZCK_ERR_NO_MEMORY;
  bool spread = false;
  size_t *at = s == ZCK_OK ? zck__calloc((size_t)size, sizeof *at) : NULL;
  if (s == ZCK_OK && !at) s = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < nu; i++) {
    holder[i] = -1;
    for (int r = 0; s == ZCK_OK && r < size; r++) {
      vlist *l = &all[r];
      if (at[r] >= l->n || strcmp(l->rel[at[r]], names[i])) {
        spread = true;
        continue;
      }
      int64_t sz = l->size[at[r]++];
      count[i]++;
      if (holder[i] < 0) holder[i] = r, fsize[i] = sz;
      else if (sz != fsize[i])
        s = zck__fail(ZCK_ERR_MISMATCH, "%s: %lld bytes on rank %d's node, %lld on rank %d's: the nodes hold different "
                      "copies", names[i], (long long)fsize[i], holder[i], (long long)sz, r);
      if (r == me) here[i] = true;
    }
  }
  free(at);
  char *view = NULL;
  s = zck__dist_agree(ZCK__DIST_CHECKED, s); /* from here every rank takes the same steps */
  if (s == ZCK_OK && spread) {
    /* every rank sees the tree as a whole from here on, under its own view folder */
    view = view_create(&s);
    char *real = s == ZCK_OK ? realpath(root, NULL) : NULL;
    if (s == ZCK_OK && is_dir && !real) s = zck__fail_errno(errno, "%s: cannot resolve", root);
    for (size_t i = 0; s == ZCK_OK && i < nu; i++) {
      char *dst = zck__path_join(view, names[i]);
      s = dst ? view_mkdirs(view, names[i]) : ZCK_ERR_NO_MEMORY;
      if (s == ZCK_OK && here[i]) {
        char *src = zck__path_join(real, names[i]);
        if (!src) s = ZCK_ERR_NO_MEMORY;
        else if (symlink(src, dst) != 0) s = zck__fail_errno(errno, "%s: cannot link", dst);
        free(src);
      }
      free(dst);
    }
    /* the files some node lacks: their holder sends what describes them */
    for (size_t i = 0; i < nu; i++) {
      if (count[i] == size) continue;
      blob b = {NULL, 0};
      int64_t len = 0;
      zck_status hs = ZCK_OK;
      if (me == holder[i]) {
        char *src = zck__path_join(root, names[i]);
        hs = src ? meta_blob(src, (uint64_t)fsize[i], &b) : ZCK_ERR_NO_MEMORY;
        free(src);
        len = hs == ZCK_OK ? (int64_t)b.n : -1;
      }
      /* the holder's failure reaches every rank as the length -1, and its message later */
      zck_status gs = c->broadcast(c, &len, 1, ZCK_I64, holder[i]);
      if (gs == ZCK_OK && len < 0) {
        if (s == ZCK_OK) s = me == holder[i] ? hs : zck__fail(ZCK_ERR_INTERNAL, "rank %d: failed", holder[i]);
        break;
      }
      if (gs == ZCK_OK && me != holder[i] && !(b.p = zck__malloc((size_t)len ? (size_t)len : 1))) gs = ZCK_ERR_NO_MEMORY;
      if (gs == ZCK_OK && len) gs = c->broadcast(c, b.p, (size_t)len, ZCK_U8, holder[i]);
      if (gs != ZCK_OK) { free(b.p); if (s == ZCK_OK) s = gs; break; }
      if (s == ZCK_OK && !here[i]) {
        char *dst = zck__path_join(view, names[i]);
        s = dst ? write_stub(dst, b.p, (size_t)len) : ZCK_ERR_NO_MEMORY;
        free(dst);
      }
      free(b.p);
    }
    free(real);
  }
  s = zck__dist_agree(ZCK__DIST_CHECKED, s);
  if (s == ZCK_OK && view) zck__dist_set_root(view);
  if (s != ZCK_OK) {
    zck__dist_view_close(view);
    view = NULL;
  }
  free(names);
  vlist_free(&u);
  vlist_free(&mine);
  for (int r = 0; r < size; r++) vlist_free(&all[r]);
  free(all);
  free(holder), free(fsize), free(here), free(count);
  *view_out = view;
  return s;
}
