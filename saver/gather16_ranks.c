/* gather16_ranks.c: model.safetensors of a stage-3 save written rank by rank (saver.h:
 * per_rank). Every rank writes its own partitions' bytes into the file rank 0 created (as
 * the ranks' writes are spread over the processes, so is the page-cache copy), and, when
 * the file goes into the manifest (--save-only-model), the ranks also gather the 16-bit
 * weights in file order to rank 0, as DeepSpeed's stage3_gather_16bit_weights_on_model_save
 * does, which hashes each byte of the file front to back as the ranks write it (so the
 * manifest reads nothing back; XXH3 needs the bytes in order, which the scattered
 * per-rank writes do not give, and its hashes do not combine).
 *
 * The data section goes window by window (G16_WINDOW bytes, whatever the model size).
 * Every rank casts the elements of its own partitions that fall in the window (RNE of its
 * fp32 masters, its frozen 16-bit values) into its window buffer, noting the ranges its
 * copy wrote (the executor's written hook). A small all_gather gives every rank the
 * others' failures and packet lengths; to hash, each other rank packs its ranges (the
 * ranges, then their bytes) and the comm's gather brings every packet to rank 0 alone
 * (each rank's bytes cross the network once), which unpacks them into its window beside
 * its own ranges. Then each rank writes its ranges, and
 * rank 0 hashes the window, on a thread of its own while the next window is gathered into
 * the rank's other window buffer. ZeRO-3 partitions are disjoint and cover every tensor,
 * so the window is whole; bytes no rank wrote are zeros. A failure anywhere stops every
 * rank before the same collective, so they stay in step; a last agreement after the
 * writes (each rank's fsync'd) comes before rank 0 commits the file, and the caller's
 * agreement then names the failure. Memory per rank: two windows, the packets and the
 * executor's staging, never the model. */
#include "saver_internal.h"

#include "error.h"
#include "io.h"
#include "safetensors/safetensors.h"
#include "stream_hash.h"
#include "transfer.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define G16_WINDOW ((size_t)16 << 20)

static size_t g_window; /* tests: a smaller window (0: G16_WINDOW) */

void zck__g16_set_window(size_t bytes) { g_window = bytes; }

/* The target layout of one window [w0, w1) of the data section (elements): a single store,
 * the window, holding the pieces of the file's tensors that fall in it. *next: the first
 * tensor (in file order) that ends after w1, where the next window starts looking. */
static zck_status window_layout(const zck__g16 *g, const uint64_t *numel, size_t n_params, size_t es, uint64_t w0,
                                uint64_t w1, size_t *next, zck_piece *pieces, zck_layout **out) {
  size_t n = 0, i = *next;
  for (; i < g->n; i++) {
    const zck_st_tensor *t = zck_st_writer_tensor(g->w, g->slot[i]);
    uint64_t b = t->begin / es, e = b + g->whole->stores[i].numel;
    if (b >= w1) break;
    uint64_t lo = b > w0 ? b : w0, hi = e < w1 ? e : w1;
    if (lo < hi) pieces[n++] = (zck_piece){g->whole->stores[i].param, 0, lo - b, lo - w0, hi - lo, 0, 0};
    if (e > w1) break; /* continues in the next window */
  }
  *next = i;
  zck_layout_store st = {-1, -1, -1, w1 - w0, w1 - w0};
  return zck_layout_custom(n_params, numel, &st, 1, pieces, n, out);
}

/* The element ranges of the window this rank's copy wrote (the executor's written hook,
 * called from its workers at once). */
typedef struct g16_range {
  uint64_t off, n;
} g16_range;

typedef struct g16_wrote {
  pthread_mutex_t mu;
  g16_range *r;
  size_t n, cap;
  bool oom;
} g16_wrote;

static void on_written(void *ctx, size_t job, uint32_t dst_store, uint64_t off, uint64_t count, const void *bytes,
                       size_t n_bytes) {
  (void)job, (void)dst_store, (void)bytes, (void)n_bytes;
  g16_wrote *w = ctx;
  pthread_mutex_lock(&w->mu);
  if (!w->oom && !ZCK__GROW(w->r, w->cap, w->n + 1)) w->oom = true; /* window_fill says so */
  if (!w->oom) w->r[w->n++] = (g16_range){off, count};
  pthread_mutex_unlock(&w->mu);
}

static int range_cmp(const void *a, const void *b) {
  const g16_range *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* This rank's elements of the file's tensors (layout l: one store, at `store`), from its
 * memory; w (or NULL) notes the ranges it wrote. */
static zck_status copy_own(const zck_saver *s, const zck__saver_view *src, const zck_layout *l, zck_store *store,
                           const char *path, g16_wrote *w) {
  zck_state_view dst;
  memset(&dst, 0, sizeof dst);
  dst.model = s->tr.model;
  dst.name = path;
  dst.part[ZCK_STATE_LP] = (zck_state_part){l, store, NULL};
  zck_transfer_opts o = ZCK_TRANSFER_OPTS_INIT;
  o.partial = true; /* the other ranks hold the rest */
  if (w) {
    o.exec.written = on_written;
    o.exec.written_ctx = w;
  }
  return zck_transfer(&src->v, &dst, 1, &o);
}

/* This rank's elements of the window (layout l) into buf, and its ranges in w, sorted and
 * merged. */
static zck_status window_fill(const zck_saver *s, const zck__saver_view *src, const zck_layout *l, void *buf,
                              uint64_t count, const char *path, g16_wrote *w) {
  zck_store store = zck_store_memory(buf, s->tr.lp_dtype, count, path);
  w->n = 0;
  ZCK_TRY(copy_own(s, src, l, &store, path, w));
  if (w->oom) return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory gathering the 16-bit weights", path);
  if (w->n) qsort(w->r, w->n, sizeof *w->r, range_cmp); /* none: w->r may be NULL */
  size_t k = 0;
  for (size_t i = 0; i < w->n; i++) {
    if (k && w->r[k - 1].off + w->r[k - 1].n == w->r[i].off) w->r[k - 1].n += w->r[i].n;
    else w->r[k++] = w->r[i];
  }
  w->n = k;
  return ZCK_OK;
}

/* A growable buffer. */
typedef struct g16_bytes {
  uint8_t *p;
  size_t cap;
} g16_bytes;

static zck_status bytes_reserve(g16_bytes *b, size_t n, const char *path) {
  if (n <= b->cap) return ZCK_OK;
  uint8_t *q = realloc(b->p, n);
  if (!q) return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory gathering the 16-bit weights", path);
  b->p = q;
  b->cap = n;
  return ZCK_OK;
}

/* The packet of this rank's share of the window: the count of ranges, each range (byte
 * offset in the window, byte length), then their bytes in that order. *len: its length. */
static zck_status pack(const g16_wrote *w, const uint8_t *buf, size_t es, g16_bytes *pkt, uint64_t *len,
                       const char *path) {
  uint64_t data = 0;
  for (size_t i = 0; i < w->n; i++) data += w->r[i].n * es;
  uint64_t n = 8 + 16 * (uint64_t)w->n + data;
  ZCK_TRY(bytes_reserve(pkt, (size_t)n, path));
  uint64_t *h = (uint64_t *)pkt->p;
  h[0] = w->n;
  uint8_t *at = pkt->p + 8 + 16 * w->n;
  for (size_t i = 0; i < w->n; i++) {
    h[1 + 2 * i] = w->r[i].off * es;
    h[2 + 2 * i] = w->r[i].n * es;
    memcpy(at, buf + w->r[i].off * es, (size_t)(w->r[i].n * es));
    at += w->r[i].n * es;
  }
  *len = n;
  return ZCK_OK;
}

/* A byte range of the window on rank 0 that a rank wrote. */
typedef struct g16_span {
  uint64_t off, len;
} g16_span;

static int span_cmp(const void *a, const void *b) {
  const g16_span *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* The spans of a window on rank 0 (n of them; room for cap). */
typedef struct g16_spans {
  g16_span *v;
  size_t n, cap;
} g16_spans;

static zck_status span_push(g16_spans *spans, g16_span sp, const char *path) {
  if (!ZCK__GROW(spans->v, spans->cap, spans->n + 1))
    return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory gathering the 16-bit weights", path);
  spans->v[spans->n++] = sp;
  return ZCK_OK;
}

/* Rank 0: rank k's packet of len bytes into the window out of nb bytes, its ranges noted
 * in spans. The packets are this run's own, but checked all the same. */
static zck_status unpack(const uint8_t *p, uint64_t len, int k, uint8_t *out, uint64_t nb, g16_spans *spans,
                         const char *path) {
  uint64_t n = 0;
  if (len >= 8) memcpy(&n, p, 8);
  if (len < 8 || n > (len - 8) / 16)
    return zck__fail(ZCK_ERR_INTERNAL, "%s: rank %d's share of the 16-bit weights is malformed", path, k);
  const uint8_t *at = p + 8 + 16 * n, *end = p + len;
  for (uint64_t i = 0; i < n; i++) {
    uint64_t off, l;
    memcpy(&off, p + 8 + 16 * i, 8);
    memcpy(&l, p + 16 + 16 * i, 8);
    if (off > nb || l > nb - off || l > (uint64_t)(end - at))
      return zck__fail(ZCK_ERR_INTERNAL, "%s: rank %d's share of the 16-bit weights is malformed", path, k);
    memcpy(out + off, at, (size_t)l);
    ZCK_TRY(span_push(spans, (g16_span){off, l}, path));
    at += l;
  }
  return ZCK_OK;
}

/* Rank 0, the window's packets unpacked: its own ranges noted too, the ranges must not
 * overlap, and bytes no rank wrote become zeros (ZeRO-3 partitions cover every tensor, so
 * there are none, but a stale byte of the previous window must never reach the file). */
static zck_status cover(const g16_wrote *own, size_t es, uint8_t *out, uint64_t nb, g16_spans *spans, const char *path) {
  for (size_t i = 0; i < own->n; i++) ZCK_TRY(span_push(spans, (g16_span){own->r[i].off * es, own->r[i].n * es}, path));
  g16_span *sp = spans->v;
  if (spans->n) qsort(sp, spans->n, sizeof *sp, span_cmp);
  uint64_t pos = 0;
  for (size_t i = 0; i < spans->n; i++) {
    if (sp[i].off < pos) return zck__fail(ZCK_ERR_INTERNAL, "%s: the ranks' shares of the 16-bit weights overlap", path);
    if (sp[i].off > pos) memset(out + pos, 0, (size_t)(sp[i].off - pos));
    pos = sp[i].off + sp[i].len;
  }
  if (pos < nb) memset(out + pos, 0, (size_t)(nb - pos));
  return ZCK_OK;
}

/* This rank's ranges of the window (buf, at file offset base) to the file. */
static zck_status write_ranges(int fd, const uint8_t *buf, const g16_wrote *w, size_t es, uint64_t base,
                               const char *path) {
  for (size_t i = 0; i < w->n; i++)
    ZCK_TRY(zck__pwrite_all(fd, buf + w->r[i].off * es, (size_t)(w->r[i].n * es), base + w->r[i].off * es, path));
  return ZCK_OK;
}

/* A rank's part of a window: its own ranges written (and on rank 0, when it hashes the
 * file, the whole window hashed), on a thread of their own while the ranks gather the next
 * window into the rank's other window buffer; one window in flight at a time, so rank 0
 * still hashes the file front to back. */
typedef struct g16_writer {
  pthread_t th;
  bool running;
  int fd;
  zck_st_writer *hash; /* rank 0 when it hashes the file, else NULL */
  const char *path;
  size_t es;
  const uint8_t *buf;
  const g16_wrote *own;
  uint64_t off, n;
  zck_status st;
  char msg[1024]; /* its message (errors are per thread) */
} g16_writer;

static void *writer_main(void *arg) {
  g16_writer *wr = arg;
  wr->st = write_ranges(wr->fd, wr->buf, wr->own, wr->es, wr->off, wr->path);
  if (wr->st != ZCK_OK) snprintf(wr->msg, sizeof wr->msg, "%s", zck_last_error());
  else if (wr->hash) zck_st_writer_wrote(wr->hash, wr->off, wr->buf, wr->n);
  return NULL;
}

/* Waits for the window in flight; its failure becomes the caller's. */
static zck_status writer_join(g16_writer *wr) {
  if (!wr->running) return ZCK_OK;
  pthread_join(wr->th, NULL);
  wr->running = false;
  return wr->st == ZCK_OK ? ZCK_OK : zck__fail(wr->st, "%s", wr->msg);
}

/* The previous window joined, then the window of n bytes in buf at the file's offset off
 * (on this thread when no thread can be made). */
static zck_status writer_start(g16_writer *wr, const uint8_t *buf, const g16_wrote *own, uint64_t off, uint64_t n) {
  ZCK_TRY(writer_join(wr));
  wr->buf = buf;
  wr->own = own;
  wr->off = off;
  wr->n = n;
  if (pthread_create(&wr->th, NULL, writer_main, wr) == 0) {
    wr->running = true;
    return ZCK_OK;
  }
  writer_main(wr);
  return wr->st == ZCK_OK ? ZCK_OK : zck__fail(wr->st, "%s", wr->msg);
}

// ---- what every rank's writer of its own bytes starts from (both ways below)

typedef struct g16_share {
  uint64_t *numel;       /* [n_params] */
  zck_piece *pieces;     /* room for one window's pieces */
  size_t hlen;           /* the header's bytes: where the data section starts */
  uint64_t data;         /* the data section's bytes */
  zck__saver_view src;   /* this rank's memory */
} g16_share;

/* The file g lays out, seen from rank r: its data section (every tensor element aligned)
 * and r's memory as the source. */
static zck_status share_init(const zck_saver *s, const zck_saver_rank *r, const zck__g16 *g, const char *path,
                             g16_share *sh) {
  const zck_model *m = s->tr.model;
  size_t es = zck_dtype_size(s->tr.lp_dtype);
  memset(sh, 0, sizeof *sh);
  sh->numel = zck__calloc(m->n_params + 1, sizeof *sh->numel);
  sh->pieces = zck__calloc(g->n + 1, sizeof *sh->pieces);
  if (!sh->numel || !sh->pieces) return ZCK_ERR_NO_MEMORY;
  zck_model_numels(m, sh->numel);
  zck_st_writer_header(g->w, &sh->hlen);
  sh->data = zck_st_writer_file_size(g->w) - sh->hlen;
  for (size_t i = 0; i < g->n; i++)
    if (zck_st_writer_tensor(g->w, g->slot[i])->begin % es)
      return zck__fail(ZCK_ERR_INTERNAL, "%s: tensor %zu is not element aligned", path, i);
  return zck__saver_source(s, r->mem, NULL, &sh->src);
}

static void share_free(const zck_saver *s, g16_share *sh) {
  zck__saver_view_free(s, &sh->src);
  free(sh->numel);
  free(sh->pieces);
  memset(sh, 0, sizeof *sh);
}

zck_status zck__g16_open_share(const char *path, int *fd) {
  *fd = open(path, O_WRONLY | O_CLOEXEC);
  return *fd < 0 ? zck__fail_errno(errno, "%s: cannot open for writing", path) : ZCK_OK;
}

zck_status zck__g16_sync_share(int fd, const char *path) {
  int fe = zck__io_fault(ZCK_IO_OP_FSYNC);
  return fe || fsync(fd) != 0 ? zck__fail_errno(fe ? fe : errno, "%s: fsync failed", path) : ZCK_OK;
}

/* One all_reduce (MAX) of v[0..n): every rank's failure flags and sizes. */
static zck_status agree_max(zck_comm *c, uint64_t *v, size_t n) {
  return c->all_reduce(c, v, v, n, ZCK_I64, ZCK_COMM_MAX);
}

// ---- the collective: every rank, window by window

/* One rank's run. A failure anywhere stops every rank before the same collective: st is
 * this rank's own failure; coll a failed collective, stop another rank's failure (every
 * rank learns it from the agreement before the next collective). */
typedef struct g16_run {
  const zck_saver *s;
  zck_comm *c;
  const char *path;
  bool lead;                       /* rank 0: creates, hashes and commits the file */
  bool gather;                     /* rank 0 hashes the file: the other ranks' bytes go to it */
  size_t es, win;                  /* element size; window bytes */
  zck__g16 g;
  g16_share sh;
  zck__shash_budget budget;
  g16_wrote wrote[2];              /* one per window buffer (the writer thread reads one) */
  uint8_t *bufs[2];                /* one filled (and on rank 0 gathered), one written */
  g16_bytes pkt, recv;
  g16_spans spans;                 /* rank 0: the ranges each rank wrote of a window */
  uint64_t *lens;                  /* every rank's (failed, packet length) of a window */
  size_t *counts;                  /* each rank's packet length in a window (rank 0: 0) */
  size_t next;                     /* window_layout's first tensor of the next window */
  int fd;                          /* the other ranks' own descriptor of the file */
  g16_writer wr;
  zck_status coll;
  bool stop;
} g16_run;

static bool run_going(const g16_run *x) {
  return x->coll == ZCK_OK && !x->stop;
}

static void run_free(g16_run *x) {
  share_free(x->s, &x->sh);
  zck__g16_free(&x->g);
  free(x->lens);
  free(x->counts);
  free(x->bufs[0]);
  free(x->bufs[1]);
  free(x->pkt.p);
  free(x->recv.p);
  free(x->spans.v);
  for (int i = 0; i < 2; i++) {
    free(x->wrote[i].r);
    pthread_mutex_destroy(&x->wrote[i].mu);
  }
}

/* The file laid out, this rank's buffers, rank 0's file created (at full size, hashed as
 * written when known); then every rank ready, or none goes on (a rank that failed here does
 * not know the windows), and the other ranks open the file. */
static zck_status run_start(g16_run *x, const zck_saver *s, const zck_saver_rank *r, const char *path, bool known) {
  memset(x, 0, sizeof *x);
  x->s = s;
  x->c = r->comm;
  x->path = path;
  x->lead = x->c->rank == 0;
  x->es = zck_dtype_size(s->tr.lp_dtype);
  x->win = g_window ? g_window : G16_WINDOW;
  x->win = x->win < 8 ? 8 : x->win - x->win % 8; /* whole elements (es divides 8) */
  x->budget = (zck__shash_budget){0, zck__shash_default_budget()};
  x->fd = -1;
  pthread_mutex_init(&x->wrote[0].mu, NULL);
  pthread_mutex_init(&x->wrote[1].mu, NULL);
  zck_status st = zck__g16_init(s, path, &x->g);
  if (st == ZCK_OK) st = share_init(s, r, &x->g, path, &x->sh);
  if (st == ZCK_OK) {
    x->lens = zck__calloc(2 * (size_t)x->c->size, sizeof *x->lens);
    x->counts = zck__calloc((size_t)x->c->size, sizeof *x->counts);
    x->bufs[0] = zck__malloc(x->win);
    x->bufs[1] = zck__malloc(x->win);
    if (!x->lens || !x->counts || !x->bufs[0] || !x->bufs[1]) st = ZCK_ERR_NO_MEMORY;
  }
  if (st == ZCK_OK && x->lead && known) st = zck_st_writer_hash(x->g.w, &x->budget);
  if (st == ZCK_OK && x->lead) st = zck_st_writer_open(x->g.w, path);
  if (st == ZCK_OK && x->lead)
    x->wr = (g16_writer){.fd = zck_st_writer_fd(x->g.w), .hash = known ? x->g.w : NULL, .path = path, .es = x->es};
  uint64_t ready[2] = {st != ZCK_OK, x->lead && known};
  x->coll = agree_max(x->c, ready, 2);
  x->stop = ready[0] != 0;
  x->gather = ready[1] != 0;
  if (run_going(x) && !x->lead) {
    st = zck__g16_open_share(path, &x->fd);
    x->wr = (g16_writer){.fd = x->fd, .path = path, .es = x->es};
  }
  return st;
}

/* Each other rank's packet of the window (nb bytes in buf) to rank 0 alone, by the comm's
 * gather (rank 0 holding all of them at once); a backend without one broadcasts each
 * packet, of its own length, which every rank then receives. Rank 0 unpacks them beside
 * its own ranges (w). longest: the longest packet. */
static zck_status window_gather(g16_run *x, zck_status st, uint8_t *buf, const g16_wrote *w, uint64_t nb,
                                uint64_t longest) {
  zck_comm *c = x->c;
  size_t total = 0, W = (size_t)c->size;
  x->spans.n = 0;
  for (size_t q = 1; q < W; q++) {
    x->counts[q] = (size_t)x->lens[2 * q + 1];
    total += x->counts[q];
  }
  st = bytes_reserve(&x->recv, c->gather ? (x->lead ? total : 0) : (size_t)longest, x->path);
  uint64_t failed = st != ZCK_OK;
  if ((x->coll = agree_max(c, &failed, 1)) != ZCK_OK || (x->stop = failed != 0)) return st;
  if (c->gather) {
    x->coll = c->gather(c, x->lead ? NULL : x->pkt.p, x->recv.p, x->counts, ZCK_U8, 0);
    for (size_t q = 1, at = 0; q < W && x->coll == ZCK_OK && x->lead && st == ZCK_OK; at += x->counts[q], q++)
      st = unpack(x->recv.p + at, x->counts[q], (int)q, buf, nb, &x->spans, x->path);
  }
  for (size_t q = 1; !c->gather && q < W && x->coll == ZCK_OK; q++) {
    x->coll = c->broadcast(c, (size_t)c->rank == q ? x->pkt.p : x->recv.p, x->counts[q], ZCK_U8, (int)q);
    if (x->coll == ZCK_OK && x->lead && st == ZCK_OK)
      st = unpack(x->recv.p, x->counts[q], (int)q, buf, nb, &x->spans, x->path);
  }
  if (x->coll == ZCK_OK && x->lead && st == ZCK_OK) st = cover(w, x->es, buf, nb, &x->spans, x->path);
  return st;
}

/* Window k, bytes [b0, b0 + nb) of the data section: this rank's elements cast into it (and
 * packed for rank 0), every rank's failure and packet length agreed, the packets gathered,
 * then this rank's ranges written while the next window is filled. */
static zck_status run_window(g16_run *x, zck_status st, uint64_t b0, uint64_t k) {
  uint64_t nb = x->sh.data - b0 < x->win ? x->sh.data - b0 : x->win, len = 8;
  uint8_t *buf = x->bufs[k % 2];
  g16_wrote *w = &x->wrote[k % 2];
  if (st == ZCK_OK) {
    zck_layout *l = NULL;
    st = window_layout(&x->g, x->sh.numel, x->s->tr.model->n_params, x->es, b0 / x->es, (b0 + nb) / x->es, &x->next,
                       x->sh.pieces, &l);
    if (st == ZCK_OK) st = window_fill(x->s, &x->sh.src, l, buf, nb / x->es, x->path, w);
    zck_layout_free(l);
    if (st == ZCK_OK && x->gather && !x->lead) st = pack(w, buf, x->es, &x->pkt, &len, x->path);
  }
  uint64_t mine[2] = {st != ZCK_OK, len}, longest = 0;
  if ((x->coll = x->c->all_gather(x->c, mine, x->lens, 2, ZCK_I64)) != ZCK_OK) return st;
  for (size_t q = 0; q < (size_t)x->c->size; q++) {
    x->stop = x->stop || x->lens[2 * q];
    if (q && x->lens[2 * q + 1] > longest) longest = x->lens[2 * q + 1];
  }
  if (x->stop) return st;
  if (x->gather && ((st = window_gather(x, st, buf, w, nb, longest)) != ZCK_OK || !run_going(x))) return st;
  return st == ZCK_OK ? writer_start(&x->wr, buf, w, x->sh.hlen + b0, nb) : st;
}

/* After the last window: this rank's writes done and durable (the file may be on a
 * network file system, where rank 0's fsync does not cover another host's writes), a last
 * agreement, and rank 0 commits only when no rank failed (a peer's failure: nothing is
 * committed here, and the caller's agreement names it). */
static zck_status run_finish(g16_run *x, zck_status st, zck__manifest_known *known, size_t *cap) {
  zck_status ws = writer_join(&x->wr);
  if (st == ZCK_OK) st = ws;
  if (x->fd >= 0 && st == ZCK_OK && run_going(x)) st = zck__g16_sync_share(x->fd, x->path);
  if (x->fd >= 0) close(x->fd);
  if (run_going(x)) {
    uint64_t failed = st != ZCK_OK;
    x->coll = agree_max(x->c, &failed, 1);
    x->stop = failed != 0;
  }
  bool peer_failed = x->stop && st == ZCK_OK;
  if (st == ZCK_OK) st = x->coll;
  if (st == ZCK_OK && x->lead && !peer_failed) st = zck_st_writer_commit(x->g.w);
  if (st == ZCK_OK && x->lead && !peer_failed && known) st = zck_st_writer_known(x->g.w, "model.safetensors", known, cap);
  return st;
}

zck_status zck__g16_gather_ranks(const zck_saver *s, const zck_saver_rank *r, const char *path,
                                 zck__manifest_known *known, size_t *cap) {
  g16_run x;
  zck_status st = run_start(&x, s, r, path, known != NULL);
  /* every rank runs every window, the collectives in step, until one of them fails: each
   * collective is preceded by an agreement that every rank can take part in it. A failed
   * write shows in the next window's agreement, or the last one */
  for (uint64_t b0 = 0, k = 0; run_going(&x) && b0 < x.sh.data; b0 += x.win, k++) st = run_window(&x, st, b0, k);
  st = run_finish(&x, st, known, cap);
  run_free(&x);
  return st;
}

// ---- a background save's share (save_async_ranks.c): no collective

zck_status zck__g16_write_own(const zck_saver *s, const zck_saver_rank *r, const zck__g16 *g, int fd, const char *path) {
  size_t es = zck_dtype_size(s->tr.lp_dtype), next = 0;
  zck_layout *l = NULL;
  g16_share sh;
  zck_status st = share_init(s, r, g, path, &sh);
  uint64_t count = sh.data / es;
  /* the whole data section as one window, one store at the file's data offset */
  if (st == ZCK_OK) st = window_layout(g, sh.numel, s->tr.model->n_params, es, 0, count, &next, sh.pieces, &l);
  if (st == ZCK_OK) {
    zck_store store = zck_store_fd(fd, sh.hlen, s->tr.lp_dtype, count, path);
    st = copy_own(s, &sh.src, l, &store, path, NULL);
  }
  share_free(s, &sh);
  zck_layout_free(l);
  return st;
}

zck_status zck__g16_hash_back(const zck__g16 *g, const char *path) {
  size_t hlen = 0;
  zck_st_writer_header(g->w, &hlen);
  uint64_t end = zck_st_writer_file_size(g->w);
  uint8_t *buf = zck__malloc(G16_WINDOW);
  if (!buf) return ZCK_ERR_NO_MEMORY;
  int fd = zck_st_writer_fd(g->w);
  zck_status st = ZCK_OK;
  for (uint64_t at = hlen; st == ZCK_OK && at < end; at += G16_WINDOW) {
    size_t n = end - at < G16_WINDOW ? (size_t)(end - at) : G16_WINDOW;
    st = zck__pread_all(fd, buf, n, at, path);
    if (st == ZCK_OK) zck_st_writer_wrote(g->w, at, buf, n);
  }
  free(buf);
  return st;
}
