/* dcp_write.c: the layout of a torch DCP checkpoint as FSDP2 saves it (dcp_writer.h):
 * every entry's chunks reserved as torch.save items in the rank files, the small values
 * (steps, optimizer settings) written at once, and the chunk data regions handed back as
 * state views for the one transfer. Each item's archive is written whole when reserved but
 * for its data and the data's CRC-32, which the transfer computes as it writes the data;
 * commit puts each CRC in its place and writes .metadata. */
#include "dcp_write_internal.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void zck_dcp_chunk_rows(int64_t rows, uint32_t world, uint32_t r, int64_t *first, int64_t *count) {
  int64_t c = (rows + (int64_t)world - 1) / (int64_t)world, start = c * (int64_t)r;
  int64_t end = start + c < rows ? start + c : rows;
  *first = start < rows ? start : rows;
  *count = end > start ? end - start : 0;
}

/* ---- growing arrays */

static zck_status zck__dcp_add_entry(zck_dcp_writer *w, zck__dcp_entry e, zck__dcp_entry **out) {
  if (!ZCK__GROW(w->entries, w->cap_entries, w->n_entries + 1)) return ZCK_ERR_NO_MEMORY;
  e.chunk0 = w->n_chunks;
  e.n_chunks = 0;
  w->entries[w->n_entries] = e;
  *out = &w->entries[w->n_entries++];
  return ZCK_OK;
}

static zck_status zck__dcp_add_chunk(zck_dcp_writer *w, zck__dcp_entry *e, zck__dcp_chunk c) {
  if (!ZCK__GROW(w->chunks, w->cap_chunks, w->n_chunks + 1)) return ZCK_ERR_NO_MEMORY;
  w->chunks[w->n_chunks++] = c;
  e->n_chunks++;
  w->cursor[c.file] = c.off + c.len;
  return ZCK_OK;
}

/* The entry's flat key (dcp_format.h spells them). */
char *zck__dcp_key(const zck_dcp_writer *w, const zck__dcp_entry *e) {
  switch (e->kind) {
  case ZCK__DCP_MODEL: return zck_dcp_key_model(e->name);
  case ZCK__DCP_STATE: return zck_dcp_key_state(w->o.optim_root, e->name, e->sub);
  default: return zck_dcp_key_group(w->o.optim_root, e->group, e->name);
  }
}

/* ---- tensor items */

/* Reserves the item of rows [row0, row0 + rows) of e in file f; a non-empty one becomes
 * store `store` of part `part` (-1: none), laid over layout param `lparam`. */
static zck_status zck__dcp_tensor_chunk(zck_dcp_writer *w, zck__dcp_entry *e, uint32_t f, int64_t row0, int64_t rows,
                                        int part, uint32_t lparam) {
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t row_elems = 1;
  for (int i = 0; i < e->ndim; i++) {
    shape[i] = i == 0 ? rows : e->shape[i];
    if (i) row_elems *= (uint64_t)e->shape[i];
  }
  uint64_t data_off, len, base = w->cursor[f], slots[2];
  ZCK_TRY(zck_torch_item_tensor(&w->files[f], base, e->dtype, e->ndim, shape, &data_off, &len, slots));
  if (!ZCK__GROW(w->pending, w->cap_pending, w->n_pending + 1)) return ZCK_ERR_NO_MEMORY;
  zck__dcp_pending *pd = &w->pending[w->n_pending++];
  *pd = (zck__dcp_pending){f, {slots[0], slots[1]}, -1, 0};
  ZCK_TRY(zck__dcp_add_chunk(w, e, (zck__dcp_chunk){f, base, len, row0, e->ndim ? rows : 1}));
  uint64_t numel = (uint64_t)(e->ndim ? rows : 1) * row_elems;
  if (part < 0 || numel == 0) return ZCK_OK;
  zck__dcp_part *p = &w->part[part];
  size_t cap = p->cap;
  if (!ZCK__GROW(p->ls, cap, p->n + 1)) return ZCK_ERR_NO_MEMORY;
  cap = p->cap;
  if (!ZCK__GROW(p->pieces, cap, p->n + 1)) return ZCK_ERR_NO_MEMORY;
  cap = p->cap;
  if (!ZCK__GROW(p->stores, cap, p->n + 1)) return ZCK_ERR_NO_MEMORY;
  cap = p->cap;
  if (!ZCK__GROW(p->crc, cap, p->n + 1)) return ZCK_ERR_NO_MEMORY;
  p->cap = cap;
  char *key = zck__dcp_key(w, e);
  char *name = key ? zck__sprintf("%s (%s, rows %lld..%lld)", w->files[f].path, key, (long long)row0,
                                  (long long)(row0 + rows)) : NULL;
  free(key);
  if (!name || !ZCK__GROW(w->names, w->cap_names, w->n_names + 1)) {
    free(name);
    return ZCK_ERR_NO_MEMORY;
  }
  w->names[w->n_names++] = name;
  size_t s = p->n++;
  p->ls[s] = (zck_layout_store){(int32_t)f, -1, (int32_t)lparam, numel, numel};
  p->pieces[s] = (zck_piece){lparam, (uint32_t)s, (uint64_t)row0 * row_elems, 0, numel, 0, 0};
  p->stores[s] = zck_store_fd(w->files[f].fd, data_off, e->dtype, numel, name);
  p->crc[s] = zck_crc32_zeros(numel * zck_dtype_size(e->dtype));
  pd->part = part;
  pd->store = s;
  return ZCK_OK;
}

/* A tensor sharded over every rank along dim 0 (FSDP2's Shard(0)). */
static zck_status zck__dcp_sharded(zck_dcp_writer *w, zck__dcp_entry e, int part, uint32_t lparam) {
  zck__dcp_entry *pe;
  ZCK_TRY(zck__dcp_add_entry(w, e, &pe));
  int64_t prev_row0 = -1;
  for (uint32_t r = 0; r < w->o.world_size; r++) {
    int64_t row0, rows;
    zck_dcp_chunk_rows(e.shape[0], w->o.world_size, r, &row0, &rows);
    /* two empty chunks at the same offsets (1 row over 3 ranks) are one write item to
     * torch's dedup, saved once */
    if (row0 == prev_row0 && rows == 0) continue;
    prev_row0 = row0;
    ZCK_TRY(zck__dcp_tensor_chunk(w, &w->entries[w->n_entries - 1], r, row0, rows, part, lparam));
  }
  (void)pe;
  return ZCK_OK;
}

/* A 0-d float32 tensor known now (Adam's step), in rank 0's file. */
static zck_status zck__dcp_scalar(zck_dcp_writer *w, zck__dcp_entry e, float v) {
  zck__dcp_entry *pe;
  ZCK_TRY(zck__dcp_add_entry(w, e, &pe));
  uint64_t data_off, len, base = w->cursor[0], slots[2];
  ZCK_TRY(zck_torch_item_tensor(&w->files[0], base, ZCK_F32, 0, NULL, &data_off, &len, slots));
  ZCK_TRY(zck__outfile_pwrite(&w->files[0], &v, sizeof v, data_off));
  ZCK_TRY(zck_torch_item_set_crc(&w->files[0], slots, zck_crc32_update(0, &v, sizeof v)));
  return zck__dcp_add_chunk(w, pe, (zck__dcp_chunk){0, base, len, 0, 1});
}

/* ---- bytes items: optimizer settings */

static zck_pk *zck__dcp_hparam_node(zck_pk_doc *d, const zck_hparam *h) {
  switch (h->kind) {
  case ZCK_HP_NONE: return zck_pk_new_none(d);
  case ZCK_HP_BOOL: return zck_pk_new_bool(d, h->i != 0);
  case ZCK_HP_INT: return zck_pk_new_int(d, h->i);
  case ZCK_HP_FLOAT: return zck_pk_new_float(d, h->f[0]);
  case ZCK_HP_STRING: return zck_pk_new_str(d, h->s);
  case ZCK_HP_FLOATS: {
    zck_pk *t = zck_pk_new_tuple(d, (size_t)h->n_floats);
    for (int i = 0; t && i < h->n_floats; i++)
      if (!(t->u.seq.items[i] = zck_pk_new_float(d, h->f[i]))) return NULL;
    return t;
  }
  }
  return NULL;
}

/* optim.param_groups.<g>.<key> = torch.save(value) in rank 0's file; key "params": the
 * group's FQNs (NULL h). */
static zck_status zck__dcp_setting(zck_dcp_writer *w, uint32_t g, const char *key, const zck_hparam *h) {
  zck_pk_doc *d = zck_pk_doc_new();
  if (!d) return ZCK_ERR_NO_MEMORY;
  zck_pk *v = NULL;
  if (h) v = zck__dcp_hparam_node(d, h);
  else if ((v = zck_pk_new_list(d))) {
    const zck_param_group *grp = &w->m->groups[g];
    for (size_t i = 0; v && i < grp->n_params; i++) {
      const zck_param *p = &w->m->params[grp->params[i]];
      if (p->tied_to >= 0) continue; /* an optimizer holds a tied param once */
      zck_pk *s = zck_pk_new_str(d, p->name);
      if (!s || !zck_pk_append(d, v, s)) v = NULL;
    }
  }
  zck_status st = v ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  zck__dcp_entry *pe = NULL;
  uint64_t len = 0, base = w->cursor[0];
  if (st == ZCK_OK) st = zck__dcp_add_entry(w, (zck__dcp_entry){.kind = ZCK__DCP_GROUP, .name = key, .group = g, .is_bytes = true}, &pe);
  if (st == ZCK_OK) st = zck_torch_item_object(&w->files[0], base, v, &len);
  if (st == ZCK_OK) st = zck__dcp_add_chunk(w, pe, (zck__dcp_chunk){0, base, len, 0, 0});
  zck_pk_doc_free(d);
  return st;
}

/* ---- create */

static zck_status zck__dcp_layouts(zck_dcp_writer *w) {
  const zck_model *m = w->m;
  uint64_t *numel = zck__calloc(m->n_params + 1, sizeof *numel);
  if (!numel) return ZCK_ERR_NO_MEMORY;
  zck_model_numels(m, numel);
  zck_status st = ZCK_OK;
  for (int k = 0; st == ZCK_OK && k < ZCK__DCP_BUFFERS; k++) {
    zck__dcp_part *p = &w->part[k];
    if (p->n) st = zck_layout_custom(m->n_params, numel, p->ls, p->n, p->pieces, p->n, &p->layout);
  }
  free(numel);
  zck__dcp_part *b = &w->part[ZCK__DCP_BUFFERS];
  if (st == ZCK_OK && b->n) {
    uint64_t *bn = zck__calloc(m->n_buffers + 1, sizeof *bn);
    if (!bn) return ZCK_ERR_NO_MEMORY;
    for (size_t i = 0; i < m->n_buffers; i++) bn[i] = m->buffers[i].numel;
    st = zck_layout_whole(m->n_buffers, bn, NULL, m->n_buffers, &b->layout);
    free(bn);
  }
  return st;
}

/* A random UUID (version 4), as torch's save_id. */
static void zck__dcp_uuid(char out[40]) {
  uint8_t r[16] = {0};
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || read(fd, r, sizeof r) != (ssize_t)sizeof r) {
    uint64_t t = zck_xxh3(&r, sizeof r) ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)out;
    memcpy(r, &t, 8);
  }
  if (fd >= 0) close(fd);
  r[6] = (uint8_t)((r[6] & 0x0F) | 0x40);
  r[8] = (uint8_t)((r[8] & 0x3F) | 0x80);
  snprintf(out, 40, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2], r[3], r[4],
           r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12], r[13], r[14], r[15]);
}

static zck_status zck__dcp_build(zck_dcp_writer *w) {
  const zck_model *m = w->m;
  for (size_t i = 0; i < m->n_params; i++)
    if (m->params[i].ndim == 0)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: param %s is 0-d: FSDP2 shards params along dim 0", w->dir, m->params[i].name);
  for (uint32_t r = 0; r < w->o.world_size; r++) {
    char name[48];
    zck_dcp_data_file_name(r, 0, name, sizeof name);
    char *path = zck__path_join(w->dir, name);
    if (!path) return ZCK_ERR_NO_MEMORY;
    zck_status st = zck__outfile_create(&w->files[r], path);
    free(path);
    ZCK_TRY(st);
    w->open[r] = true;
  }
  /* model.<fqn>: params in manifest order (aliases laid over their owners), then buffers */
  for (size_t i = 0; !w->o.no_model && i < m->n_params; i++) {
    const zck_param *p = &m->params[i];
    uint32_t owner = zck_model_owner(m, (uint32_t)i);
    bool frozen = m->params[owner].frozen, alias = owner != i;
    int part = alias ? (frozen ? ZCK__DCP_ALIAS_FROZEN : ZCK__DCP_ALIAS_FP32) : (frozen ? ZCK__DCP_FROZEN : ZCK__DCP_FP32);
    zck__dcp_entry e = {.kind = ZCK__DCP_MODEL, .name = p->name, .dtype = ZCK_F32, .ndim = p->ndim, .shape = p->shape};
    ZCK_TRY(zck__dcp_sharded(w, e, part, owner));
  }
  for (size_t b = 0; !w->o.no_model && b < m->n_buffers; b++) {
    const zck_buffer *bf = &m->buffers[b];
    zck__dcp_entry *pe;
    zck__dcp_entry e = {.kind = ZCK__DCP_MODEL, .name = bf->name, .dtype = bf->dtype, .ndim = bf->ndim, .shape = bf->shape};
    ZCK_TRY(zck__dcp_add_entry(w, e, &pe));
    ZCK_TRY(zck__dcp_tensor_chunk(w, pe, 0, 0, bf->ndim ? bf->shape[0] : 1, ZCK__DCP_BUFFERS, (uint32_t)b));
  }
  if (!w->o.has_optimizer_state) return ZCK_OK;
  /* optim.state.<fqn>.{step, exp_avg, exp_avg_sq}: in the order torch's Adam creates them */
  for (size_t i = 0; i < m->n_params; i++) {
    const zck_param *p = &m->params[i];
    if (p->tied_to >= 0 || p->frozen || p->group < 0) continue;
    zck__dcp_entry e = {.kind = ZCK__DCP_STATE, .name = p->name, .dtype = ZCK_F32, .ndim = p->ndim, .shape = p->shape};
    e.sub = "step";
    zck__dcp_entry s = e;
    s.ndim = 0;
    s.shape = NULL;
    ZCK_TRY(zck__dcp_scalar(w, s, (float)w->o.step));
    e.sub = "exp_avg";
    ZCK_TRY(zck__dcp_sharded(w, e, ZCK__DCP_EXP_AVG, (uint32_t)i));
    e.sub = "exp_avg_sq";
    ZCK_TRY(zck__dcp_sharded(w, e, ZCK__DCP_EXP_AVG_SQ, (uint32_t)i));
  }
  /* optim.param_groups.<g>.<setting>, then .params */
  for (uint32_t g = 0; g < m->n_groups; g++) {
    const zck_param_group *grp = &m->groups[g];
    for (size_t k = 0; k < grp->n_hparams; k++)
      if (strcmp(grp->hparams[k].key, "params")) ZCK_TRY(zck__dcp_setting(w, g, grp->hparams[k].key, &grp->hparams[k]));
    ZCK_TRY(zck__dcp_setting(w, g, "params", NULL));
  }
  return ZCK_OK;
}

zck_status zck_dcp_writer_create(const char *dir, const zck_model *m, const zck_dcp_write_opts *o, zck_dcp_writer **out) {
  *out = NULL;
  zck_dcp_write_opts opts = ZCK_DCP_WRITE_OPTS_INIT;
  if (o) opts = *o;
  if (opts.world_size < 1) return zck__fail(ZCK_ERR_INVALID_ARG, "DCP writer: world size must be at least 1");
  if (!opts.optim_root) opts.optim_root = "optim";
  zck_dcp_writer *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  w->m = m;
  w->o = opts;
  w->dir = zck__strdup(dir);
  w->files = zck__calloc(opts.world_size, sizeof *w->files);
  w->cursor = zck__calloc(opts.world_size, sizeof *w->cursor);
  w->open = zck__calloc(opts.world_size, sizeof *w->open);
  zck_status st = (w->dir && w->files && w->cursor && w->open) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (uint32_t r = 0; st == ZCK_OK && r < opts.world_size; r++) w->files[r].fd = -1;
  zck__dcp_uuid(w->save_id);
  if (st == ZCK_OK) st = zck__dcp_build(w);
  if (st == ZCK_OK) st = zck__dcp_layouts(w);
  if (st != ZCK_OK) {
    zck_dcp_writer_free(w);
    return st;
  }
  *out = w;
  return ZCK_OK;
}

/* ---- views, commit */

static zck_state_part zck__dcp_view_part(const zck__dcp_part *p) {
  return p->layout ? (zck_state_part){p->layout, p->stores, p->crc} : (zck_state_part){NULL, NULL, NULL};
}

size_t zck_dcp_writer_state(zck_dcp_writer *w, zck_state_view out[2]) {
  memset(out, 0, 2 * sizeof *out);
  out[0].model = out[1].model = w->m;
  out[0].name = out[1].name = w->dir;
  out[0].part[ZCK_STATE_FP32] = zck__dcp_view_part(&w->part[ZCK__DCP_FP32]);
  out[0].part[ZCK_STATE_EXP_AVG] = zck__dcp_view_part(&w->part[ZCK__DCP_EXP_AVG]);
  out[0].part[ZCK_STATE_EXP_AVG_SQ] = zck__dcp_view_part(&w->part[ZCK__DCP_EXP_AVG_SQ]);
  out[0].part[ZCK_STATE_FROZEN] = zck__dcp_view_part(&w->part[ZCK__DCP_FROZEN]);
  out[0].buffers = zck__dcp_view_part(&w->part[ZCK__DCP_BUFFERS]);
  out[0].n_buffer_copies = w->part[ZCK__DCP_BUFFERS].layout ? 1 : 0;
  if (!w->part[ZCK__DCP_ALIAS_FP32].layout && !w->part[ZCK__DCP_ALIAS_FROZEN].layout) return 1;
  out[1].part[ZCK_STATE_FP32] = zck__dcp_view_part(&w->part[ZCK__DCP_ALIAS_FP32]);
  out[1].part[ZCK_STATE_FROZEN] = zck__dcp_view_part(&w->part[ZCK__DCP_ALIAS_FROZEN]);
  return 2;
}

zck_status zck_dcp_writer_commit(zck_dcp_writer *w) {
  for (size_t i = 0; i < w->n_pending; i++) {
    zck__dcp_pending *pd = &w->pending[i];
    if (pd->part >= 0) ZCK_TRY(zck_torch_item_set_crc(&w->files[pd->file], pd->crc_slots, w->part[pd->part].crc[pd->store]));
  }
  for (uint32_t r = 0; r < w->o.world_size; r++) {
    /* the file's length is its last item's end (an empty file when it holds none) */
    ZCK_TRY(zck__outfile_truncate(&w->files[r], w->cursor[r]));
    w->open[r] = false;
    ZCK_TRY(zck__outfile_commit(&w->files[r]));
  }
  return zck__dcp_write_metadata(w);
}

void zck_dcp_writer_free(zck_dcp_writer *w) {
  if (!w) return;
  for (uint32_t r = 0; w->files && r < w->o.world_size; r++)
    if (w->open && w->open[r]) zck__outfile_abort(&w->files[r]);
  for (int k = 0; k < ZCK__DCP_PARTS; k++) {
    zck__dcp_part *p = &w->part[k];
    free(p->ls);
    free(p->pieces);
    free(p->stores);
    free(p->crc);
    zck_layout_free(p->layout);
  }
  for (size_t i = 0; i < w->n_names; i++) free(w->names[i]);
  free(w->names);
  free(w->pending);
  free(w->entries);
  free(w->chunks);
  free(w->files);
  free(w->cursor);
  free(w->open);
  free(w->dir);
  free(w);
}
