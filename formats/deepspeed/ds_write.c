/* ds_write.c: zck_ds_writer: the geometry of the target checkpoint (ZeRO layout of the
 * trainable params, lp / frozen / buffer layouts), the files under a temporary tag folder,
 * the write-callback stores, and the commit (entry CRCs, files, tag folder rename, then
 * `latest`, each atomic). A rank-only writer (zck__ds_writer_create_rank) builds one rank's
 * files straight into an existing tag folder; a joined writer (zck__ds_writer_create_joined)
 * another AutoTP rank's files into a lead writer's temporary one. The pickled trees are
 * built in ds_write_tree.c, one file per thread; each is named for the manifest and pickled
 * as soon as it is built, and freed (a stage-3 model file of 100k params is a tree of ~1.5M
 * nodes: W' of them alive through the copy cost more than the rest of the job). */
#include "ds_writer.h"
#include "dist.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- target stores */

static zck_status ws_write(void *ctx, const void *src, uint64_t elem_off, uint64_t count) {
  zck__ds_wstore *s = ctx;
  size_t es = zck_dtype_size(s->dtype);
  uint64_t nbytes = count * es, off = elem_off * es;
  if (!count) return ZCK_OK;
  uint32_t crc = zck_crc32_update(0, src, (size_t)nbytes);
  /* the write itself from any thread; the lock guards only the list of written ranges */
  zck_status st = zck_torch_writer_write(s->tw, s->storage, src, (size_t)nbytes, off);
  pthread_mutex_lock(&s->mu);
  zck__ds_wrange *last = s->n_ranges ? &s->ranges[s->n_ranges - 1] : NULL;
  if (st == ZCK_OK && last && last->off + last->len == off) {
    /* writes in order (a transfer in target order): one range, its CRC extended */
    last->crc = zck_crc32_combine(last->crc, crc, nbytes);
    last->len += nbytes;
  } else if (st == ZCK_OK) {
    if (s->n_ranges == s->cap_ranges) {
      size_t nc = s->cap_ranges ? 2 * s->cap_ranges : 8;
      zck__ds_wrange *nr = realloc(s->ranges, nc * sizeof *nr);
      if (nr) { s->ranges = nr; s->cap_ranges = nc; }
    }
    if (s->n_ranges < s->cap_ranges) s->ranges[s->n_ranges++] = (zck__ds_wrange){off, nbytes, crc};
    else s->oom = true;
  }
  pthread_mutex_unlock(&s->mu);
  /* the manifest hashes, from these bytes while they are here (after the range is recorded) */
  if (st == ZCK_OK) zck__shash_feed(s->hf, s->base + off, src, nbytes, &crc);
  return st;
}

/* A range another rank of a distributed job wrote (lib/dist.h): its CRC joins the list. */
static void ws_noted(void *ctx, uint64_t elem_off, uint64_t count, uint32_t crc) {
  zck__ds_wstore *s = ctx;
  size_t es = zck_dtype_size(s->dtype);
  if (!count) return;
  pthread_mutex_lock(&s->mu);
  if (s->n_ranges == s->cap_ranges) {
    size_t nc = s->cap_ranges ? 2 * s->cap_ranges : 8;
    zck__ds_wrange *nr = realloc(s->ranges, nc * sizeof *nr);
    if (nr) { s->ranges = nr; s->cap_ranges = nc; }
  }
  if (s->n_ranges < s->cap_ranges) s->ranges[s->n_ranges++] = (zck__ds_wrange){elem_off * es, count * es, crc};
  else s->oom = true;
  pthread_mutex_unlock(&s->mu);
}

zck__ds_wstore *zck__ds_wstore_of(const zck_store *st) {
  return st && st->kind == ZCK_STORE_CALLBACK && st->write == ws_write ? st->ctx : NULL;
}

zck_status zck__ds_add_storage(zck_torch_writer *tw, zck__shash *hf, zck_dtype dt, uint64_t numel, const void *known,
                               size_t *idx, uint64_t *off) {
  ZCK_TRY(zck_torch_writer_add_storage(tw, dt, numel, idx, off));
  if (known) zck__shash_known(hf, *off, known, numel * zck_dtype_size(dt));
  return ZCK_OK;
}

static const char *keep_name(zck_ds_writer *w, const char *name) {
  if (w->n_names == w->cap_names) {
    size_t nc = w->cap_names ? 2 * w->cap_names : 64;
    char **nn = zck__realloc(w->names, nc * sizeof *nn);
    if (!nn) return NULL;
    w->names = nn;
    w->cap_names = nc;
  }
  char *s = zck__strdup(name);
  if (s) w->names[w->n_names++] = s;
  return s;
}

static zck_status add_wstore_locked(zck_ds_writer *w, zck_torch_writer *tw, zck__shash *hf, size_t storage, uint64_t off,
                                    zck_dtype dt, uint64_t numel, const char *name, zck_store *out) {
  if (w->n_ws == w->cap_ws) {
    size_t nc = w->cap_ws ? 2 * w->cap_ws : 64;
    zck__ds_wstore **nw = zck__realloc(w->ws, nc * sizeof *nw);
    if (!nw) return ZCK_ERR_NO_MEMORY;
    w->ws = nw;
    w->cap_ws = nc;
  }
  zck__ds_wstore *s = zck__calloc(1, sizeof *s);
  const char *nm = s ? keep_name(w, name) : NULL;
  if (!s || !nm) { free(s); return ZCK_ERR_NO_MEMORY; }
  s->tw = tw;
  s->storage = storage;
  s->dtype = dt;
  s->numel = numel;
  s->name = nm;
  s->hf = hf;
  s->base = off;
  pthread_mutex_init(&s->mu, NULL);
  w->ws[w->n_ws++] = s;
  zck__dist_register_noted(ws_write, ws_noted);
  *out = zck_store_callback(NULL, ws_write, s, dt, numel, nm);
  return ZCK_OK;
}

zck_status zck__ds_add_wstore(zck_ds_writer *w, zck_torch_writer *tw, zck__shash *hf, size_t storage, uint64_t off,
                              zck_dtype dt, uint64_t numel, const char *name, zck_store *out) {
  pthread_mutex_lock(&w->mu);
  zck_status st = add_wstore_locked(w, tw, hf, storage, off, dt, numel, name, out);
  pthread_mutex_unlock(&w->mu);
  return st;
}

static int cmp_range(const void *a, const void *b) {
  const zck__ds_wrange *x = a, *y = b;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* The CRC of the whole storage from its written ranges, zeros elsewhere. */
static zck_status ws_crc(zck__ds_wstore *s, uint32_t *out) {
  const char *name = s->name;
  if (s->oom) return zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory recording written ranges", name);
  uint64_t total = s->numel * zck_dtype_size(s->dtype), pos = 0;
  if (s->n_ranges) qsort(s->ranges, s->n_ranges, sizeof *s->ranges, cmp_range);
  uint32_t crc = 0;
  for (size_t i = 0; i < s->n_ranges; i++) {
    const zck__ds_wrange *r = &s->ranges[i];
    if (r->off < pos)
      return zck__fail(ZCK_ERR_INVALID_ARG, "%s: bytes %llu..%llu written twice (overlapping writes)", name,
                       (unsigned long long)r->off, (unsigned long long)pos);
    if (r->off > pos) crc = zck_crc32_combine(crc, zck_crc32_zeros(r->off - pos), r->off - pos);
    crc = zck_crc32_combine(crc, r->crc, r->len);
    pos = r->off + r->len;
  }
  if (total > pos) crc = zck_crc32_combine(crc, zck_crc32_zeros(total - pos), total - pos);
  *out = crc;
  return ZCK_OK;
}

/* ---- sealing a file's tree */

/* Bytes a tensor spans in its storage, from element 0 to its last element (as the
 * manifest describes a view). */
static uint64_t tensor_span(const zck_torch_tensor *t) {
  if (!t->numel) return 0;
  uint64_t last = 0;
  for (int d = 0; d < t->ndim; d++) last += (uint64_t)(t->shape[d] - 1) * (uint64_t)t->stride[d];
  return (last + 1) * zck_dtype_size(t->dtype);
}

static void wdesc_free(zck__ds_wdesc *d) {
  for (size_t i = 0; i < d->n; i++) free((void *)d->t[i].name);
  free(d->t);
  free(d->dims);
  memset(d, 0, sizeof *d);
}

zck_status zck__ds_seal_file(zck_torch_writer *tw, const zck_pk *root, zck__ds_wdesc *d) {
  memset(d, 0, sizeof *d);
  zck_torch_named *v = NULL;
  size_t n = 0, nd = 0;
  zck_status st = zck_torch_writer_named(tw, root, &v, &n);
  if (st == ZCK_ERR_NO_MEMORY) return st;
  if (st != ZCK_OK) zck_clear_error(); /* left undescribed: the manifest reads the file */
  for (size_t i = 0; st == ZCK_OK && i < n; i++) nd += (size_t)v[i].tensor->ndim;
  if (st == ZCK_OK && (!(d->t = zck__calloc(n + 1, sizeof *d->t)) || !(d->dims = zck__malloc((nd + 1) * sizeof *d->dims)))) {
    zck_torch_named_free(v, n);
    wdesc_free(d);
    return ZCK_ERR_NO_MEMORY;
  }
  for (size_t i = 0, at = 0; st == ZCK_OK && i < n; i++) {
    const zck_torch_tensor *t = v[i].tensor;
    if (t->ndim) memcpy(d->dims + at, t->shape, (size_t)t->ndim * sizeof *d->dims);
    d->t[i] = (zck__manifest_known_tensor){v[i].name, zck_dtype_name(t->dtype), t->ndim, d->dims + at,
                                           zck_torch_writer_tensor_offset(tw, t), tensor_span(t)};
    v[i].name = NULL; /* d owns it now */
    at += (size_t)t->ndim;
  }
  if (st == ZCK_OK) {
    d->n = n;
    d->described = true;
  }
  zck_torch_named_free(v, n);
  return zck_torch_writer_seal(tw, root);
}

/* ---- geometry */

static zck_status build_geometry(zck_ds_writer *w) {
  const zck_model *m = w->m;
  for (size_t g = 0; g < m->n_groups; g++)
    if (!zck_model_group_trainable(m, (uint32_t)g, NULL, 0))
      /* DeepSpeed drops empty groups and crashes on groups without trainable params */
      return zck__fail(ZCK_ERR_INVALID_ARG, "param group %zu has no trainable parameter; DeepSpeed cannot load it", g);
  /* the partitions: lib/layout's one ZeRO geometry, the engine's too */
  zck_zero_opts zo = {w->stage, w->w, w->sub_group_size, w->o.round_robin, w->o.param_align};
  ZCK_TRY(zck_zero_geometry_build(m, &zo, &w->geo));
  const uint64_t *numels = w->geo.numel;
  w->train = w->geo.train;
  w->flat = w->geo.flat;
  w->n_flat = w->geo.n_flat;
  w->frozen = w->geo.frozen_params;
  w->n_frozen = w->geo.n_frozen;
  w->frozen_layout = w->n_frozen ? w->geo.frozen : NULL;
  /* lp module weights (stage 1/2) */
  w->owners = zck__calloc(m->n_params + 1, sizeof *w->owners);
  if (!w->owners) return ZCK_ERR_NO_MEMORY;
  w->n_owners = zck_lp_params(m, w->owners);
  if (w->o.autoep) ZCK_TRY(zck__ds_autoep_geometry(w));  /* train and LP layouts of an AutoEP target */
  else if (w->stage <= 2 && w->o.pp_size <= 1) ZCK_TRY(zck_layout_lp(m, numels, w->owners, w->n_owners, &w->lp_layout));
  if (w->o.moe) ZCK_TRY(zck__ds_moe_geometry(w));  /* deepspeed.moe: the experts' 16-bit weights in their files */
  if (m->n_buffers) {
    uint64_t *bn = zck__calloc(m->n_buffers, sizeof *bn);
    if (!bn) return ZCK_ERR_NO_MEMORY;
    for (size_t b = 0; b < m->n_buffers; b++) bn[b] = m->buffers[b].numel;
    zck_status s = zck_layout_whole(m->n_buffers, bn, NULL, m->n_buffers, &w->buffer_layout);
    free(bn);
    ZCK_TRY(s);
  }
  return ZCK_OK;
}

/* ---- create / commit / free */

static zck_status check_opts(const zck_model *m, const zck_ds_write_opts *o, zck_dtype lp) {
  if (o->stage < 1 || o->stage > 3) return zck__fail(ZCK_ERR_INVALID_ARG, "ZeRO stage %d: must be 1, 2 or 3", o->stage);
  if (o->world_size < 1 || o->world_size > (1u << 20))
    return zck__fail(ZCK_ERR_INVALID_ARG, "world size %u: must be 1..%u", o->world_size, 1u << 20);
  if (lp != ZCK_BF16 && lp != ZCK_F16 && lp != ZCK_F32)
    return zck__fail(ZCK_ERR_INVALID_ARG, "training dtype %s: must be bfloat16, float16 or float32", zck_dtype_name(lp));
  if (o->tag) ZCK_TRY(zck__ds_check_tag(o->tag, "tag"));
  for (size_t p = 0; p < m->n_params; p++)
    if (m->params[p].tied_to < 0 && !m->params[p].frozen && m->params[p].group < 0 && m->params[p].numel > 0)
      return zck__fail(ZCK_ERR_INVALID_ARG, "trainable parameter '%s' is in no param group", m->params[p].name);
  return ZCK_OK;
}

/* Model file r is built: all of them, or (rank-only) rank `only`'s: its stage-3 file, or
 * for rank 0 the one stage-1/2 file. */
static bool builds_model(const zck_ds_writer *w, uint32_t r) {
  return !w->rank_only || (w->stage == 3 ? r == w->only : w->only == 0);
}
static bool builds_optim(const zck_ds_writer *w, uint32_t r) { return !w->rank_only || r == w->only; }

/* Item i < n_models: model file i, else optimizer file i - n_models (each its own tree and
 * torch writer; the stores they register are distinct slots). */
static zck_status build_file(void *ctx, size_t i, unsigned thread) {
  (void)thread;
  zck_ds_writer *w = ctx;
  if (i < w->n_models) return builds_model(w, (uint32_t)i) ? zck__ds_build_model_file(w, (uint32_t)i) : ZCK_OK;
  if (i >= (size_t)w->n_models + w->w) {  /* expert files: AutoEP's or deepspeed.moe's */
    size_t e = i - w->n_models - w->w;
    return w->o.moe ? zck__ds_moe_build_expert_file(w, e) : zck__ds_build_expert_file(w, e);
  }
  uint32_t r = (uint32_t)(i - w->n_models);
  return builds_optim(w, r) ? zck__ds_build_optim_file(w, r) : ZCK_OK;
}

/* Item i: optimizer file i, or expert file i - w (build_file's items after the model files). */
static zck_status build_other_file(void *ctx, size_t i, unsigned thread) {
  zck_ds_writer *w = ctx;
  return build_file(ctx, w->n_models + i, thread);
}

/* Model-file trees alive at once hold at most this many params in all (at least one tree):
 * at 100k params one at a time, which keeps reshard's peak RSS under 600 MB. */
#define ZCK__DS_TREE_PARAMS ((size_t)1 << 17)

static unsigned model_build_threads(const zck_model *m, unsigned threads) {
  unsigned t = zck__worker_count(SIZE_MAX, threads);
  size_t fit = m->n_params ? ZCK__DS_TREE_PARAMS / m->n_params : t;
  if (fit < 1) fit = 1;
  return fit < t ? (unsigned)fit : t;
}

static zck_status create(const char *root, const zck_model *m, const zck_ds_write_opts *o, bool rank_only,
                         uint32_t rank, const zck_ds_writer *lead, zck_ds_writer **out) {
  ZCK_ASSERT(root && m && o && out);
  *out = NULL;
  zck_dtype lp = o->lp_dtype;
  for (size_t p = 0; lp == ZCK_DTYPE_INVALID && p < m->n_params; p++)
    if (!m->params[p].frozen && m->params[p].tied_to < 0) lp = m->params[p].dtype;
  ZCK_TRY(check_opts(m, o, lp));
  zck_ds_writer *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  pthread_mutex_init(&w->mu, NULL);
  w->m = m;
  w->o = *o;
  if (o->stage == 3) {  /* stage-1/2 options: ignored by DeepSpeed's stage 3 too */
    w->o.param_align = 1;
    w->o.round_robin = false;
  }
  /* parameter_alignment is a switch; the multiple is DeepSpeed's for the lp dtype */
  w->o.param_align = w->o.param_align > 1 ? zck__ds_param_align_for(lp) : 1;
  w->lp = lp;
  w->w = o->world_size;
  w->stage = o->stage;
  w->sub_group_size = o->sub_group_size ? o->sub_group_size : ZCK__DS_DEFAULT_SUB_GROUP_SIZE;
  w->root = zck__strdup(root);
  w->tag = o->tag ? zck__strdup(o->tag) : zck__sprintf("global_step%lld", (long long)o->global_steps);
  w->ds_version = zck__strdup(o->ds_version ? o->ds_version : ZCK__DS_DEFAULT_VERSION);
  w->o.tag = w->tag;
  w->o.ds_version = w->ds_version;
  w->n_models = w->stage == 3 ? w->w : 1;
  zck_status s = ZCK_OK;
  if (!w->root || !w->tag || !w->ds_version) { s = ZCK_ERR_NO_MEMORY; goto fail; }
  w->rank_only = rank_only;
  w->only = rank;
  if (rank_only) {
    if (rank >= w->w) {
      s = zck__fail(ZCK_ERR_INVALID_ARG, "rank %u: the world size is %u", rank, w->w);
      goto fail;
    }
    w->o.save_latest = false;
  }
  uint32_t mp_size = o->tp_size > 1 ? o->tp_size : o->pp_size;
  if (mp_size > 1 && (o->mp_rank >= mp_size || (o->mp_rank > 0) != (lead != NULL))) {
    s = zck__fail(ZCK_ERR_INVALID_ARG, "mp rank %u of %u: rank 0 leads, the others join it", o->mp_rank, mp_size);
    goto fail;
  }
  /* a pipeline stage's weights are in the caller's layer files: nothing of `module` is written here */
  if (o->pp_size > 1 && (o->tp_size > 1 || o->stage != 1 || m->n_buffers || o->autoep || o->moe)) {
    s = zck__fail(ZCK_ERR_UNSUPPORTED, "a PipelineModule stage is written at ZeRO-1, without buffers, tensor or expert "
                  "parallelism");
    goto fail;
  }
  ZCK_CHECK_GOTO(build_geometry(w), s, fail);
  if (lead) {
    /* lead's temporary tag folder: each file lands there on this writer's commit */
    w->joined = true;
    w->o.save_latest = false;
    if (!(w->fdir = zck__strdup(lead->fdir))) { s = ZCK_ERR_NO_MEMORY; goto fail; }
    w->shown = lead->shown;
  } else if (rank_only) {
    /* the caller's tag folder: each file lands there on its own commit */
    struct stat sb;
    if (!(w->fdir = zck__path_join(root, w->tag))) { s = ZCK_ERR_NO_MEMORY; goto fail; }
    if (stat(w->fdir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
      s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no such folder (a rank-only writer fills an existing tag folder)", w->fdir);
      goto fail;
    }
    w->shown = w->fdir;
  } else {
    char *final = zck__path_join(root, w->tag);
    if (!final) { s = ZCK_ERR_NO_MEMORY; goto fail; }
    s = zck__outdir_create(&w->dir, final, o->overwrite);
    free(final);
    if (s != ZCK_OK) goto fail;
    if (!(w->fdir = zck__strdup(w->dir.tmp_path))) { s = ZCK_ERR_NO_MEMORY; goto fail; }
    w->shown = w->dir.path;
  }
  w->model_w = zck__calloc(w->n_models, sizeof *w->model_w);
  w->model_desc = zck__calloc(w->n_models, sizeof *w->model_desc);
  w->optim_w = zck__calloc(w->w, sizeof *w->optim_w);
  w->optim_desc = zck__calloc(w->w, sizeof *w->optim_desc);
  w->model_h = zck__calloc(w->n_models, sizeof *w->model_h);
  w->optim_h = zck__calloc(w->w, sizeof *w->optim_h);
  if (!w->model_w || !w->model_desc || !w->optim_w || !w->optim_desc || !w->model_h || !w->optim_h) {
    s = ZCK_ERR_NO_MEMORY;
    goto fail;
  }
  for (int p = 0; p < ZCK_DS_PART_COUNT; p++) {
    const zck_layout *l = p <= ZCK_DS_EXP_AVG_SQ ? w->train : p == ZCK_DS_LP ? w->lp_layout : w->frozen_layout;
    if (!l || (!o->has_optimizer_state && (p == ZCK_DS_EXP_AVG || p == ZCK_DS_EXP_AVG_SQ))) continue;
    w->n_stores[p] = l->n_stores;
    if (!(w->stores[p] = zck__calloc(l->n_stores + 1, sizeof(zck_store)))) { s = ZCK_ERR_NO_MEMORY; goto fail; }
  }
  if (m->n_buffers && !(w->buffer_stores = zck__calloc((size_t)w->n_models * m->n_buffers, sizeof(zck_store)))) {
    s = ZCK_ERR_NO_MEMORY;
    goto fail;
  }
  /* other ranks' stores stay unbound in a rank-only writer (zeroed: ZCK_STORE_UNBOUND) */
  /* each file's tree is pickled and freed once built: threads bound how many are alive.
   * A model file's tree holds every param (~1.5 KB each: its objects, the dump's memo table,
   * the pickle), so those are built on fewer threads as the model grows. */
  ZCK_CHECK_GOTO(zck__parallel_for(w->n_models, model_build_threads(m, o->threads), build_file, w), s, fail);
  ZCK_CHECK_GOTO(zck__parallel_for((size_t)w->w + w->n_expert_files, o->threads, build_other_file, w), s, fail);
  *out = w;
  return ZCK_OK;
fail:
  zck_ds_writer_free(w);
  return s;
}

zck_status zck_ds_writer_create(const char *root, const zck_model *m, const zck_ds_write_opts *o, zck_ds_writer **out) {
  return create(root, m, o, false, 0, NULL, out);
}

zck_status zck__ds_writer_create_rank(const char *root, const zck_model *m, const zck_ds_write_opts *o, uint32_t rank,
                                      zck_ds_writer **out) {
  return create(root, m, o, true, rank, NULL, out);
}

zck_status zck__ds_writer_create_joined(const zck_ds_writer *lead, const zck_model *m, const zck_ds_write_opts *o,
                                        zck_ds_writer **out) {
  ZCK_ASSERT(lead && !lead->rank_only && !lead->joined && !lead->committed);
  return create(lead->root, m, o, false, 0, lead, out);
}

zck_status zck_ds_writer_get(const zck_ds_writer *w, zck_ds_part part, zck_ds_view *out) {
  ZCK_ASSERT(part >= 0 && part < ZCK_DS_PART_COUNT);
  memset(out, 0, sizeof *out);
  if (!w->stores[part]) {
    const char *why = part == ZCK_DS_LP ? "stage-3 model files hold no 16-bit weights"
                      : part == ZCK_DS_FROZEN ? (w->stage <= 2 ? "stage 1/2 frozen params are part of the LP module weights"
                                                               : "no frozen parameters")
                                              : "the writer was created without optimizer state";
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s/%s: %s", w->root, w->tag, why);
  }
  out->layout = part <= ZCK_DS_EXP_AVG_SQ ? w->train : part == ZCK_DS_LP ? w->lp_layout : w->frozen_layout;
  out->stores = w->stores[part];
  return ZCK_OK;
}

zck_ds_view zck_ds_writer_buffers(const zck_ds_writer *w, uint32_t rank) {
  ZCK_ASSERT(rank < w->n_models);
  zck_ds_view v = {w->buffer_layout, w->buffer_stores ? w->buffer_stores + (size_t)rank * w->m->n_buffers : NULL};
  return v;
}

uint32_t zck_ds_writer_model_files(const zck_ds_writer *w) { return w->n_models; }

// ---- manifest hashes

void zck__ds_writer_hash_inline(zck_ds_writer *w, uint64_t chunk_size, uint64_t budget_bytes) {
  w->hash_want = true;
  w->hash_chunk = chunk_size ? chunk_size : ZCK_MANIFEST_DEFAULT_CHUNK;
  w->budget.max = budget_bytes ? budget_bytes : (uint64_t)64 << 20;
}

/* Starts every file's hash stream (a transfer's ready hook, once the plans said what they write). */
zck_status zck__ds_writer_hash_start(zck_ds_writer *w) {
  for (uint32_t r = 0; r < w->n_models; r++) ZCK_TRY(zck__shash_start(w->model_h[r], &w->budget, w->hash_chunk));
  for (uint32_t r = 0; r < w->w; r++) ZCK_TRY(zck__shash_start(w->optim_h[r], &w->budget, w->hash_chunk));
  w->hash_started = true;
  return ZCK_OK;
}

/* The layout the DeepSpeed reader finds in what w wrote (ds_describe.c's fill_info): the
 * lp dtype is that of the trainable, untied params (w's); masters are fp32. */
static void known_layout(zck_ds_writer *w) {
  zck_dtype lp = ZCK_DTYPE_INVALID;
  for (size_t p = 0; p < w->m->n_params && lp == ZCK_DTYPE_INVALID; p++)
    if (!w->m->params[p].frozen && w->m->params[p].tied_to < 0) lp = w->lp; /* written in w's lp dtype */
  if (lp == ZCK_DTYPE_INVALID) lp = w->lp == ZCK_BF16 ? ZCK_BF16 : ZCK_F32;
  w->known_layout = (zck_manifest_layout){w->tag, w->stage, w->w, w->n_flat, (char *)zck_dtype_name(lp),
                                          (char *)zck_dtype_name(ZCK_F32), w->lp == ZCK_BF16};
  w->known.layout = &w->known_layout;
}

static zck_status finish_hashes(zck_ds_writer *w) {
  size_t n = (size_t)w->n_models + w->w;
  known_layout(w);
  w->known.files = zck__calloc(n, sizeof *w->known.files);
  if (!w->known.files) return ZCK_ERR_NO_MEMORY;
  w->known.chunk_size = w->hash_chunk;
  for (size_t i = 0; i < n; i++) {
    zck__shash *hf = i < w->n_models ? w->model_h[i] : w->optim_h[i - w->n_models];
    if (!hf) continue;
    char *fname = i < w->n_models ? zck__ds_model_name_mp(w->stage, (uint32_t)i, w->o.mp_rank)
                                  : zck__ds_optim_name_mp(w->lp == ZCK_BF16 ? ZCK__DS_PREFIX_BF16 : ZCK__DS_PREFIX_NONE,
                                                          (uint32_t)(i - w->n_models), w->o.mp_rank);
    char *path = fname ? zck__path_join(w->fdir, fname) : NULL;
    const char *rel = fname ? keep_name(w, fname) : NULL; /* the known file's path */
    uint64_t reread = 0;
    zck_status s = path && rel ? zck__shash_finish(hf, path, &reread) : ZCK_ERR_NO_MEMORY;
    free(fname);
    free(path);
    ZCK_TRY(s);
    w->hash_reread += reread;
    w->hash_streamed += zck__shash_streamed(hf);
    zck__manifest_known_file *kf = &w->known.files[w->known.n_files];
    ZCK_TRY(zck__shash_known_file(hf, rel, kf));
    const zck__ds_wdesc *d = i < w->n_models ? &w->model_desc[i] : &w->optim_desc[i - w->n_models];
    if (d->described) { /* its tensors as the tree named them: the manifest does not parse it again */
      kf->described = true;
      kf->tensors = d->t;
      kf->n_tensors = d->n;
    }
    if (kf->hashed) w->known.n_files++;
  }
  return ZCK_OK;
}

const zck__manifest_known *zck__ds_writer_known(const zck_ds_writer *w, uint64_t *streamed, uint64_t *reread) {
  if (streamed) *streamed = w->hash_streamed;
  if (reread) *reread = w->hash_reread;
  return w->hash_started && w->committed ? &w->known : NULL;
}

zck_status zck_ds_writer_commit(zck_ds_writer *w) {
  ZCK_ASSERT(!w->committed);
  for (uint32_t r = 0; !w->hash_started && w->model_h && r < w->n_models; r++) zck__shash_stop(w->model_h[r]);
  for (uint32_t r = 0; !w->hash_started && w->optim_h && r < w->w; r++) zck__shash_stop(w->optim_h[r]);
  for (size_t i = 0; i < w->n_ws; i++) {
    uint32_t crc = 0;
    ZCK_TRY(ws_crc(w->ws[i], &crc));
    zck_torch_writer_set_crc(w->ws[i]->tw, w->ws[i]->storage, crc);
  }
  for (uint32_t r = 0; r < w->n_models; r++) {
    if (!w->model_w[r]) continue; /* rank-only: another rank's file */
    zck_status s = zck_torch_writer_finish(w->model_w[r], NULL);
    zck_torch_writer_free(w->model_w[r]);
    w->model_w[r] = NULL;
    ZCK_TRY(s);
  }
  for (uint32_t r = 0; r < w->w; r++) {
    if (!w->optim_w[r]) continue;
    zck_status s = zck_torch_writer_finish(w->optim_w[r], NULL);
    zck_torch_writer_free(w->optim_w[r]);
    w->optim_w[r] = NULL;
    ZCK_TRY(s);
  }
  for (size_t i = 0; i < w->n_expert_files; i++) {   /* expert files: hashed by the manifest writer, which reads them */
    zck_status s = zck_torch_writer_finish(w->expert_w[i], NULL);
    zck_torch_writer_free(w->expert_w[i]);
    w->expert_w[i] = NULL;
    ZCK_TRY(s);
  }
  if (w->hash_started) ZCK_TRY(finish_hashes(w));
  ZCK_TRY(zck__ds_write_swap_commit(w));
  if (!w->rank_only && !w->joined) ZCK_TRY(zck__outdir_commit(&w->dir));
  w->committed = true;
  if (!w->o.save_latest) return ZCK_OK;
  /* `latest` last: a reader that sees it finds the whole tag folder */
  char *latest = zck__path_join(w->root, "latest");
  if (!latest) return ZCK_ERR_NO_MEMORY;
  zck__outfile f;
  zck_status s = zck__outfile_create(&f, latest);
  free(latest);
  if (s != ZCK_OK) return s;
  s = zck__outfile_pwrite(&f, w->tag, strlen(w->tag), 0);
  if (s == ZCK_OK) s = zck__outfile_commit(&f);
  if (s != ZCK_OK) zck__outfile_abort(&f);
  return s;
}

void zck_ds_writer_free(zck_ds_writer *w) {
  if (!w) return;
  for (uint32_t r = 0; w->model_w && r < w->n_models; r++) zck_torch_writer_free(w->model_w[r]);
  for (uint32_t r = 0; w->optim_w && r < w->w; r++) zck_torch_writer_free(w->optim_w[r]);
  for (size_t i = 0; w->expert_w && i < w->n_expert_files; i++) zck_torch_writer_free(w->expert_w[i]);
  free(w->expert_w);
  free(w->ae_layer);
  free(w->lp_first);
  if (w->ae_train || w->moe_train) w->train = NULL;
  zck_layout_free(w->ae_train);
  zck_layout_free(w->moe_train);
  free(w->moe_other_ep);
  free(w->moe_pos);
  for (uint32_t r = 0; w->model_h && r < w->n_models; r++) zck__shash_free(w->model_h[r]);
  for (uint32_t r = 0; w->optim_h && r < w->w; r++) zck__shash_free(w->optim_h[r]);
  for (size_t i = 0; i < w->known.n_files; i++) {
    free((void *)w->known.files[i].ranges);
    free((void *)w->known.files[i].chunks);
  }
  free(w->known.files);
  free(w->model_h);
  free(w->optim_h);
  free(w->model_w);
  free(w->optim_w);
  for (uint32_t r = 0; w->model_desc && r < w->n_models; r++) wdesc_free(&w->model_desc[r]);
  for (uint32_t r = 0; w->optim_desc && r < w->w; r++) wdesc_free(&w->optim_desc[r]);
  free(w->model_desc);
  free(w->optim_desc);
  zck__ds_write_swap_free(w);
  zck__outdir_abort(&w->dir);  /* after a commit: only frees the names (the tree was renamed);
                                  rank-only: zeroed (the unfinished files went with their writers) */
  free(w->fdir);
  for (size_t i = 0; i < w->n_ws; i++) {
    pthread_mutex_destroy(&w->ws[i]->mu);
    free(w->ws[i]->ranges);
    free(w->ws[i]);
  }
  free(w->ws);
  for (size_t i = 0; i < w->n_names; i++) free(w->names[i]);
  free(w->names);
  for (int p = 0; p < ZCK_DS_PART_COUNT; p++) free(w->stores[p]);
  free(w->buffer_stores);
  zck_zero_geometry_free(&w->geo); /* train, frozen_layout, flat, frozen */
  zck_layout_free(w->lp_layout);
  zck_layout_free(w->buffer_layout);
  free(w->owners);
  free(w->root);
  free(w->tag);
  free(w->ds_version);
  pthread_mutex_destroy(&w->mu);
  free(w);
}
