/* dcp_train.c: what a training run resumed from a DCP folder needs beyond its tensors
 * (dcp.h, zck_dcp_train_info and zck_dcp_ties): the world size that saved it, Adam's step,
 * that the optimizer state is Adam's, and which model entries are tied weights that DCP
 * writes once per name. */
#include "dcp_internal.h"

#include "util.h"
#include "zip/zip.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The value of a step entry: a 0-d tensor item (float32, int64 ...) read in place with its
 * record's CRC-32 checked, or a bytes item holding a Python number. */
static zck_status read_step(zck_dcp *c, const zck__dcp_entry *e, double *v, bool *is_tensor) {
  if (e->is_bytes) {
    zck__dcp_item *it = &c->items[e->item];
    zck_dcp_open_opts o = ZCK_DCP_OPEN_OPTS_INIT;
    zck__dcp_item_file f;
    zck_status s = zck__dcp_item_open(c, it, &o, &f);
    if (s == ZCK_OK && !zck_pk_as_double(zck_torch_root(f.tf), v))
      s = zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a number", it->win.name, e->key);
    zck__dcp_item_close(&f);
    *is_tensor = false;
    return s;
  }
  const zck__dcp_chunk *ch = e->n_chunks == 1 ? &c->chunks[e->first_chunk] : NULL;
  const zck__dcp_item *it = ch && ch->item != SIZE_MAX ? &c->items[ch->item] : NULL;
  size_t sz = zck_dtype_size(e->dtype);
  if (!it || e->numel != 1 || !sz || sz > 8)
    return zck__fail(ZCK_ERR_FORMAT, "%s/.metadata: %s is not a scalar", c->dir, e->key);
  uint8_t b[8] = {0};
  ZCK_TRY(zck__source_read(&it->win, b, sz, it->data_off));
  if (it->rec.size == sz && zck_crc32(0, b, sz) != it->rec.crc32)
    return zck__fail(ZCK_ERR_DAMAGED, "%s: %s: CRC-32 mismatch", it->win.name, it->what ? it->what : e->key);
  float f32;
  int64_t i64;
  int32_t i32;
  switch (e->dtype) {
  case ZCK_F32: memcpy(&f32, b, 4); *v = f32; break;
  case ZCK_F64: memcpy(v, b, 8); break;
  case ZCK_I64: memcpy(&i64, b, 8); *v = (double)i64; break;
  case ZCK_I32: memcpy(&i32, b, 4); *v = i32; break;
  default: return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s: a %s step", it->win.name, e->key, zck_dtype_name(e->dtype));
  }
  *is_tensor = true;
  return ZCK_OK;
}

/* The ranks that saved the model: the distinct data files its model.<fqn> chunks lie in
 * (FSDP2 writes one file per rank; an empty rank's file holds none of them, so a save
 * whose every tensor is smaller than the world counts fewer). */
static uint32_t model_ranks(const zck_dcp *c) {
  bool *seen = zck__calloc(c->n_files ? c->n_files : 1, sizeof *seen);
  uint32_t n = 0;
  for (size_t i = 0; seen && i < c->n_items; i++) {
    const zck__dcp_item *it = &c->items[i];
    if (c->entries[it->entry].k.kind != ZCK_DCP_KEY_MODEL || seen[it->file]) continue;
    seen[it->file] = true;
    n++;
  }
  free(seen);
  return n ? n : 1;
}

zck_status zck_dcp_train_info(zck_dcp *c, zck_dcp_train *out) {
  memset(out, 0, sizeof *out);
  out->world_size = model_ranks(c);
  for (size_t i = 0; i < c->n_entries; i++) {
    const zck__dcp_entry *e = &c->entries[i];
    if (e->k.kind != ZCK_DCP_KEY_OPTIM_STATE) continue;
    const char *k = e->setting;
    if (strcmp(k, "exp_avg") && strcmp(k, "exp_avg_sq") && strcmp(k, "step"))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s/.metadata: %s: optimizer state other than Adam's (exp_avg, exp_avg_sq, "
                       "step)", c->dir, e->key);
    if (strcmp(k, "step")) continue;
    double v;
    bool t;
    ZCK_TRY(read_step(c, e, &v, &t));
    if (!isfinite(v) || v < 0 || v > 9007199254740992.0 || v != floor(v))
      return zck__fail(ZCK_ERR_FORMAT, "%s/.metadata: %s = %g is not a step count", c->dir, e->key, v);
    if (out->has_step && v != out->step)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s/.metadata: %s = %.17g where other params' step is %.17g (one step per "
                       "optimizer is what DeepSpeed keeps)", c->dir, e->key, v, out->step);
    out->has_step = true;
    out->step = v;
    out->step_is_tensor = t;
  }
  for (size_t g = 0; g < c->model->n_groups; g++)
    for (size_t h = 0; h < c->model->groups[g].n_hparams; h++) {
      const zck_hparam *hp = &c->model->groups[g].hparams[h];
      if (!strcmp(hp->key, "amsgrad") && hp->kind == ZCK_HP_BOOL && hp->i)
        return zck__fail(ZCK_ERR_UNSUPPORTED, "%s/.metadata: param group %zu has amsgrad=True (its max_exp_avg_sq has no "
                         "place in a DeepSpeed checkpoint)", c->dir, g);
    }
  return ZCK_OK;
}

// ---- tied weights

/* The model entry of each param. */
static zck_status model_entries(const zck_dcp *c, size_t **out) {
  size_t n = c->model->n_params;
  size_t *ent = zck__malloc((n ? n : 1) * sizeof *ent);
  if (!ent) return ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; p < n; p++) ent[p] = SIZE_MAX;
  for (size_t i = 0; i < c->n_entries; i++)
    if (c->entries[i].k.kind == ZCK_DCP_KEY_MODEL && c->param_of_entry[i] != UINT32_MAX) ent[c->param_of_entry[i]] = i;
  *out = ent;
  return ZCK_OK;
}

/* Whether two entries hold the same bytes: the same dtype, shape and chunks, each pair of
 * chunks with the same CRC-32 and then (buf not NULL) the same bytes, read 1 MiB at a time. */
static zck_status same_bytes(const zck_dcp *c, const zck__dcp_entry *a, const zck__dcp_entry *b, uint8_t *buf,
                             bool *same) {
  *same = false;
  if (a->dtype != b->dtype || a->ndim != b->ndim || a->numel != b->numel || a->n_chunks != b->n_chunks) return ZCK_OK;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return ZCK_OK;
  size_t esz = zck_dtype_size(a->dtype);
  for (size_t j = 0; j < a->n_chunks; j++) {
    const zck__dcp_chunk *x = &c->chunks[a->first_chunk + j], *y = &c->chunks[b->first_chunk + j];
    if (memcmp(x->offsets, y->offsets, sizeof x->offsets) || memcmp(x->sizes, y->sizes, sizeof x->sizes)) return ZCK_OK;
    if (!x->numel) continue;
    const zck__dcp_item *ix = &c->items[x->item], *iy = &c->items[y->item];
    if (ix->rec.crc32 != iy->rec.crc32) return ZCK_OK;
  }
  if (!buf) {
    *same = true;
    return ZCK_OK;
  }
  const size_t half = (size_t)1 << 20;
  for (size_t j = 0; j < a->n_chunks; j++) {
    const zck__dcp_chunk *x = &c->chunks[a->first_chunk + j], *y = &c->chunks[b->first_chunk + j];
    const zck__dcp_item *ix = &c->items[x->item], *iy = &c->items[y->item];
    uint64_t len = x->numel * esz;
    for (uint64_t off = 0; off < len; off += half) {
      size_t n = len - off < half ? (size_t)(len - off) : half;
      ZCK_TRY(zck__source_read(&ix->win, buf, n, ix->data_off + off));
      ZCK_TRY(zck__source_read(&iy->win, buf + half, n, iy->data_off + off));
      if (memcmp(buf, buf + half, n)) return ZCK_OK;
    }
  }
  *same = true;
  return ZCK_OK;
}

static zck_status ties(const zck_dcp *c, bool read_bytes, int32_t *tied) {
  const zck_model *m = c->model;
  for (size_t p = 0; p < m->n_params; p++) tied[p] = -1;
  size_t *ent = NULL;
  ZCK_TRY(model_entries(c, &ent));
  uint8_t *buf = NULL;
  zck_status s = ZCK_OK;
  for (size_t p = 0; s == ZCK_OK && p < m->n_params; p++) {
    if (!m->params[p].frozen || ent[p] == SIZE_MAX) continue;
    for (size_t q = 0; s == ZCK_OK && q < m->n_params; q++) {
      if (m->params[q].frozen || ent[q] == SIZE_MAX || m->params[q].numel != m->params[p].numel) continue;
      if (read_bytes && !buf && !(buf = zck__malloc((size_t)2 << 20))) s = ZCK_ERR_NO_MEMORY;
      bool same = false;
      if (s == ZCK_OK) s = same_bytes(c, &c->entries[ent[p]], &c->entries[ent[q]], buf, &same);
      if (s == ZCK_OK && same) {
        tied[p] = (int32_t)q;
        break;
      }
    }
  }
  free(buf);
  free(ent);
  return s;
}

zck_status zck_dcp_ties(const zck_dcp *c, int32_t *tied) { return ties(c, true, tied); }
zck_status zck_dcp_ties_by_crc(const zck_dcp *c, int32_t *tied) { return ties(c, false, tied); }

char *zck_dcp_save_root(const zck_dcp *c) {
  const char *base = strrchr(c->dir, '/');
  if (!base || strcmp(base + 1, ZCK_DCP_ACCELERATE_MODEL_DIR)) return NULL;
  return zck__strndup(c->dir, base == c->dir ? 1 : (size_t)(base - c->dir));
}

size_t zck_dcp_param_chunks(const zck_dcp *c, uint32_t p) {
  for (size_t i = 0; i < c->n_entries; i++)
    if (c->entries[i].k.kind == ZCK_DCP_KEY_MODEL && c->param_of_entry[i] == p) return c->entries[i].n_chunks;
  return 0;
}
