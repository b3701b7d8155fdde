/* gather16_ranks.c: model.safetensors of a stage-3 save written rank by rank (saver.h:
 * per_rank), as DeepSpeed's stage3_gather_16bit_weights_on_model_save does it: the ranks
 * gather the 16-bit weights in file order and rank 0 alone writes the file, front to
 * back, hashing each byte as it writes it (so the manifest of a --save-only-model folder
 * reads nothing back; XXH3 needs the bytes in order, which scattered per-rank writes do
 * not give).
 *
 * The data section goes window by window (G16_WINDOW bytes, whatever the model size):
 * every rank casts the elements of its own partitions that fall in the window (RNE of its
 * fp32 masters, its frozen 16-bit values) into a zeroed buffer of the window, and one
 * all_reduce of the buffers, summed as 64-bit integers, gives every rank the whole window.
 * ZeRO-3 partitions are disjoint, so each byte is non-zero on at most one rank and the
 * integer sum is exactly the bitwise OR of the ranks' bytes: no carry, no float rounding
 * (a float sum would turn -0 into +0 and touch NaN payloads). A trailing 64-bit word in
 * the same reduction counts the ranks that failed, so a failure stops every rank after the
 * same window and the collectives stay in step; the caller's agreement then names it.
 * Memory per rank: the window buffer and the executor's staging, never the model. */
#include "saver_internal.h"

#include "error.h"
#include "safetensors/safetensors.h"
#include "stream_hash.h"
#include "transfer.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

#define G16_WINDOW ((size_t)32 << 20)

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
    if (lo < hi) pieces[n++] = (zck_piece){g->whole->stores[i].param, 0, lo - b, lo - w0, hi - lo};
    if (e > w1) break; /* continues in the next window */
  }
  *next = i;
  zck_layout_store st = {-1, -1, -1, w1 - w0, w1 - w0};
  return zck_layout_custom(n_params, numel, &st, 1, pieces, n, out);
}

/* This rank's elements of window [w0, w1) into buf (zeroed). */
static zck_status window_fill(const zck_saver *s, const zck__saver_view *src, const zck_layout *l, void *buf,
                              uint64_t count, const char *path) {
  zck_store store = zck_store_memory(buf, s->tr.lp_dtype, count, path);
  zck_state_view dst;
  memset(&dst, 0, sizeof dst);
  dst.model = s->tr.model;
  dst.name = path;
  dst.part[ZCK_STATE_LP] = (zck_state_part){l, &store, NULL};
  zck_transfer_opts o = ZCK_TRANSFER_OPTS_INIT;
  o.partial = true; /* the other ranks hold the rest */
  return zck_transfer(&src->v, &dst, 1, &o);
}

/* Whether every rank got here with ok: one reduction of the count of failed ranks. *peer:
 * another rank failed while this one did not. */
static zck_status all_ok(zck_comm *c, uint64_t *failed_word, bool ok, bool *stop, bool *peer) {
  *failed_word = !ok;
  ZCK_TRY(c->all_reduce(c, failed_word, failed_word, 1, ZCK_I64, ZCK_COMM_SUM));
  *stop = *failed_word != 0;
  *peer = *stop && ok;
  return ZCK_OK;
}

zck_status zck__g16_gather_ranks(const zck_saver *s, const zck_saver_rank *r, const char *path,
                                 zck__manifest_known *known, size_t *cap) {
  zck_comm *c = r->comm;
  bool lead = c->rank == 0;
  const zck_model *m = s->tr.model;
  size_t es = zck_dtype_size(s->tr.lp_dtype);
  size_t win = g_window ? g_window : G16_WINDOW;
  win = win < 8 ? 8 : win - win % 8; /* whole 64-bit words, whole elements (es divides 8) */
  zck__g16 g;
  memset(&g, 0, sizeof g);
  zck__saver_view src;
  memset(&src, 0, sizeof src);
  zck__shash_budget budget = {0, zck__shash_default_budget()};
  uint64_t *numel = NULL, *buf = NULL, data = 0;
  zck_piece *pieces = NULL;
  size_t hlen = 0;
  zck_status st = zck__g16_init(s, path, &g);
  if (st == ZCK_OK) {
    numel = zck__calloc(m->n_params + 1, sizeof *numel);
    pieces = zck__calloc(g.n + 1, sizeof *pieces);
    buf = zck__malloc(win + 8); /* the window, then the count of failed ranks */
    if (!numel || !pieces || !buf) st = ZCK_ERR_NO_MEMORY;
  }
  if (st == ZCK_OK) {
    zck_model_numels(m, numel);
    zck_st_writer_header(g.w, &hlen);
    data = zck_st_writer_file_size(g.w) - hlen; /* the data section */
  }
  for (size_t i = 0; st == ZCK_OK && i < g.n; i++)
    if (zck_st_writer_tensor(g.w, g.slot[i])->begin % es)
      st = zck__fail(ZCK_ERR_INTERNAL, "%s: tensor %zu is not element aligned", path, i);
  if (st == ZCK_OK) st = zck__saver_source(s, r->mem, NULL, &src);
  if (st == ZCK_OK && lead && known) st = zck_st_writer_hash(g.w, &budget);
  if (st == ZCK_OK && lead) st = zck_st_writer_open(g.w, path);
  /* every rank ready (its buffer too), or none goes on */
  uint64_t one = 0;
  bool stop = false, peer_failed = false;
  zck_status coll = all_ok(c, &one, st == ZCK_OK, &stop, &peer_failed);
  uint64_t words = win / 8;
  size_t next = 0;
  /* then every rank runs every window, the collectives in step, until one of them fails */
  for (uint64_t b0 = 0; coll == ZCK_OK && !stop && b0 < data; b0 += win) {
    uint64_t nb = data - b0 < win ? data - b0 : win;
    memset(buf, 0, (size_t)(words + 1) * 8);
    if (st == ZCK_OK) {
      zck_layout *l = NULL;
      st = window_layout(&g, numel, m->n_params, es, b0 / es, (b0 + nb) / es, &next, pieces, &l);
      if (st == ZCK_OK) st = window_fill(s, &src, l, buf, nb / es, path);
      zck_layout_free(l);
    }
    buf[words] = st != ZCK_OK;
    coll = c->all_reduce(c, buf, buf, (size_t)words + 1, ZCK_I64, ZCK_COMM_SUM);
    if (coll != ZCK_OK) break;
    stop = buf[words] != 0;
    peer_failed = stop && st == ZCK_OK;
    if (!stop && lead) {
      uint64_t off = hlen + b0;
      st = zck__pwrite_all(zck_st_writer_fd(g.w), buf, (size_t)nb, off, path);
      if (st == ZCK_OK && known) zck_st_writer_wrote(g.w, off, buf, nb);
    }
  }
  if (st == ZCK_OK) st = coll;
  /* a peer's failure: nothing is committed here, and the agreement after names it */
  if (st == ZCK_OK && lead && !peer_failed) st = zck_st_writer_commit(g.w);
  if (st == ZCK_OK && lead && !peer_failed && known) st = zck_st_writer_known(g.w, "model.safetensors", known, cap);
  zck__saver_view_free(s, &src);
  zck__g16_free(&g);
  free(numel);
  free(pieces);
  free(buf);
  return st;
}
