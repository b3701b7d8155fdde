/* gather16.c: model.safetensors of a save, the 16-bit weights HF save_model writes
 * (saver.h), written straight from the ranks' memory by one transfer: each extent goes
 * from a rank's memory to its byte range in the file, cast on the way (RNE, the bits of
 * the live 16-bit params). Memory is the executor's staging buffers; no rank ever holds
 * the whole 16-bit model.
 *  - stage 1/2: from rank 0's live 16-bit flat (and frozen params), whole on every rank;
 *  - stage 3 (stage3_gather_16bit_weights_on_model_save): from every rank's fp32
 *    partitions (and frozen 16-bit partitions). Ranks that are threads: rank 0 writes it,
 *    through the trainer's device hook when the partitions are on a device (zck_cuda.h's
 *    bounded gather); per rank, each rank writes its own bytes window by window, gathered
 *    to rank 0 to be hashed in file order when the file is in the manifest
 *    (gather16_ranks.c).
 * Every way gives the same bytes. */
#include "saver_internal.h"

#include "error.h"
#include "safetensors/safetensors.h"
#include "stream_hash.h"
#include "transfer.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The file's tensors: every owner param (save_pretrained drops tied copies), in the 16-bit
 * dtype; `whole` gives store i to the i-th of them in file order, writer slot slot[i]. */
zck_status zck__g16_init(const zck_saver *s, const char *path, zck__g16 *g) {
  memset(g, 0, sizeof *g);
  const zck_model *m = s->tr.model;
  zck_st_dtype sd;
  if (!zck_st_dtype_from_zck(s->tr.lp_dtype, &sd)) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: no safetensors dtype", path);
  uint64_t *numel = zck__calloc(m->n_params + 1, sizeof *numel);
  uint32_t *owners = zck__calloc(m->n_params + 1, sizeof *owners);
  g->slot = zck__calloc(m->n_params + 1, sizeof *g->slot);
  zck_status st = numel && owners && g->slot ? zck_st_writer_new(&g->w) : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) zck_model_numels(m, numel);
  size_t n_lp = st == ZCK_OK ? zck_lp_params(m, owners) : 0;
  for (; st == ZCK_OK && g->n < n_lp; g->n++) {
    const zck_param *pp = &m->params[owners[g->n]];
    uint64_t shape[ZCK_MAX_DIMS];
    for (int d = 0; d < pp->ndim; d++) shape[d] = (uint64_t)pp->shape[d];
    st = zck_st_writer_add(g->w, pp->name, sd, pp->ndim, shape, &g->slot[g->n]);
  }
  if (st == ZCK_OK) st = zck_st_writer_layout(g->w);
  /* stores in the order of their bytes in the file: a copy in store order writes it front
   * to back (what its hashes, made as it is written, want) */
  for (size_t i = 1; st == ZCK_OK && i < g->n; i++) /* insertion sort: nearly sorted already */
    for (size_t k = i; k > 0 && zck_st_writer_tensor(g->w, g->slot[k - 1])->offset >
                                    zck_st_writer_tensor(g->w, g->slot[k])->offset; k--) {
      size_t ts = g->slot[k]; g->slot[k] = g->slot[k - 1]; g->slot[k - 1] = ts;
      uint32_t to = owners[k]; owners[k] = owners[k - 1]; owners[k - 1] = to;
    }
  if (st == ZCK_OK) st = zck_layout_lp(m, numel, owners, g->n, &g->whole);
  free(numel);
  free(owners);
  if (st != ZCK_OK) zck__g16_free(g);
  return st;
}

void zck__g16_free(zck__g16 *g) {
  zck_st_writer_free(g->w);
  zck_layout_free(g->whole);
  free(g->slot);
  memset(g, 0, sizeof *g);
}

/* The copy of src into the open file fd: the file's tensors are the 16-bit weights, from
 * the source's LP, else cast from its fp32; frozen ones from theirs. */
static zck_status g16_fill(const zck_saver *s, const zck__g16 *g, int fd, const char *path, const zck__saver_view *src,
                           bool hashed) {
  zck_store *stores = zck__calloc(g->n + 1, sizeof *stores);
  if (!stores) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < g->n; i++)
    stores[i] = hashed ? zck_st_writer_store(g->w, g->slot[i], s->tr.lp_dtype, g->whole->stores[i].numel, path)
                       : zck_store_fd(fd, zck_st_writer_tensor(g->w, g->slot[i])->offset, s->tr.lp_dtype,
                                      g->whole->stores[i].numel, path);
  /* the stores are in file order: the copy runs in it, frozen params in their places */
  for (size_t i = 0; hashed && i < g->n; i++) stores[i].write_order = i + 1;
  zck_state_view dst;
  memset(&dst, 0, sizeof dst);
  dst.model = s->tr.model;
  dst.name = path;
  dst.part[ZCK_STATE_LP] = (zck_state_part){g->whole, stores, NULL};
  dst.write_in_order = hashed; /* front to back: the hashes follow the copy */
  zck_status st = zck_transfer(&src->v, &dst, 1, NULL);
  free(stores);
  return st;
}

// ---- the device hook

typedef struct g16_out {
  int fd;
  uint64_t data_start; /* absolute offset of the data section */
  const char *path;
  zck_st_writer *w;    /* hashing as it is written, or NULL */
} g16_out;

static zck_status g16_write(void *ctx, uint64_t byte_off, const void *bytes, size_t n) {
  const g16_out *o = ctx;
  ZCK_TRY(zck__pwrite_all(o->fd, bytes, n, o->data_start + byte_off, o->path));
  if (o->w) zck_st_writer_wrote(o->w, o->data_start + byte_off, bytes, n);
  return ZCK_OK;
}

/* The device hook's gather (each param's place in the data section, in elements);
 * ZCK_ERR_UNSUPPORTED when it declines (or there is none). */
static zck_status g16_device(const zck_saver *s, const zck__g16 *g, int fd, const char *path, bool hashed) {
  if (!s->h.gather16) return ZCK_ERR_UNSUPPORTED;
  size_t es = zck_dtype_size(s->tr.lp_dtype), n_params = s->tr.model->n_params;
  uint64_t *dst_off = zck__malloc((n_params + 1) * sizeof *dst_off);
  if (!dst_off) return ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; p < n_params; p++) dst_off[p] = UINT64_MAX; /* tied copies are not in the file */
  g16_out o = {fd, 0, path, hashed ? g->w : NULL};
  zck_status st = ZCK_OK;
  for (size_t i = 0; i < g->n && st == ZCK_OK; i++) {
    const zck_st_tensor *ti = zck_st_writer_tensor(g->w, g->slot[i]);
    if (ti->begin % es) st = zck__fail(ZCK_ERR_INTERNAL, "%s: tensor %zu is not element aligned", path, i);
    dst_off[g->whole->stores[i].param] = ti->begin / es;
    o.data_start = ti->offset - ti->begin;
  }
  if (st == ZCK_OK) st = s->h.gather16(s->h.ctx, s->ranks, dst_off, g16_write, &o);
  if (st == ZCK_ERR_NO_MEMORY) st = zck__fail(st, "%s: out of memory gathering the 16-bit weights", path);
  free(dst_off);
  return st;
}

zck_status zck__g16_write(const zck_saver *s, const zck_saver_rank *r0, const char *path, zck__manifest_known *known,
                          size_t *cap) {
  zck__g16 g;
  ZCK_TRY(zck__g16_init(s, path, &g));
  zck__saver_view src;
  memset(&src, 0, sizeof src);
  zck__shash_budget budget = {0, zck__shash_default_budget()};
  bool hashed = known != NULL;
  /* stage 1/2: rank 0's whole 16-bit copies; stage 3: every rank's partitions */
  zck_status st = s->tr.stage < 3 ? zck__saver_source(s, r0->mem, r0->mem, &src) : zck__saver_source(s, NULL, NULL, &src);
  if (st == ZCK_OK && hashed) st = zck_st_writer_hash(g.w, &budget);
  if (st == ZCK_OK) st = zck_st_writer_open(g.w, path);
  if (st == ZCK_OK && s->tr.stage == 3) {
    st = g16_device(s, &g, zck_st_writer_fd(g.w), path, hashed);
    if (st == ZCK_ERR_UNSUPPORTED) {
      zck_clear_error();
      st = g16_fill(s, &g, zck_st_writer_fd(g.w), path, &src, hashed);
    }
  } else if (st == ZCK_OK) {
    st = g16_fill(s, &g, zck_st_writer_fd(g.w), path, &src, hashed);
  }
  if (st == ZCK_OK) st = zck_st_writer_commit(g.w);
  if (st == ZCK_OK && hashed) st = zck_st_writer_known(g.w, "model.safetensors", known, cap);
  zck__saver_view_free(s, &src);
  zck__g16_free(&g);
  return st;
}
