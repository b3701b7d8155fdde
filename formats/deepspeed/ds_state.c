/* ds_state.c: a DeepSpeed checkpoint, and a writer's reserved target, as state views
 * (lib/state.h), for lib/transfer to copy between. The writer also says how it wants to be
 * written: in target order, with its hash streams ready, when it hashes as it writes. */
#include "ds_writer.h"

#include <stdlib.h>
#include <string.h>

void zck_ds_write_opts_from(const zck_ds_ckpt *c, zck_ds_write_opts *o) {
  const zck_ds_info *in = &c->info;
  zck_ds_write_opts init = ZCK_DS_WRITE_OPTS_INIT;
  *o = init;
  o->stage = in->stage;
  o->world_size = in->world_size;
  o->sub_group_size = in->sub_group_size != ZCK__DS_DEFAULT_SUB_GROUP_SIZE ? in->sub_group_size : 0;
  o->lp_dtype = in->lp_dtype;
  o->round_robin = in->round_robin;
  o->param_align = in->param_align;
  o->tag = in->tag;
  o->global_steps = in->global_steps;
  o->skipped_steps = in->skipped_steps;
  o->global_samples = in->global_samples;
  o->has_optimizer_state = in->has_optimizer_state;
  o->step_is_tensor = in->step_is_tensor;
  o->step = in->step;
  o->clip_grad = in->clip_grad;
  o->ds_version = in->ds_version;
  o->ds_config = c->ds_config;
  o->lr_scheduler = c->lr_scheduler && c->lr_scheduler->kind != ZCK_PK_NONE ? c->lr_scheduler : NULL;
  o->loss_scaler = c->loss_scaler;
  const zck_pk *module = c->model0 ? zck_pk_dict_get(zck_torch_root(c->model0), "module") : NULL;
  o->module_attrs = module && module->kind == ZCK_PK_DICT ? module->u.dict.attrs : NULL;
  o->unsaved_ties = c->unsaved_pairs;
  o->n_unsaved_ties = c->n_unsaved_ties;
  o->exclude_frozen = in->stage >= 2 && !in->has_frozen_shapes;
  o->step_ahead = in->step_ahead;
}

// ---- the source

void zck_ds_state(const zck_ds_ckpt *c, zck_state_view *out) {
  memset(out, 0, sizeof *out);
  out->model = c->model;
  out->name = c->fs.dir;
  out->part[ZCK_STATE_FP32] = (zck_state_part){c->train_layout, c->stores[ZCK_DS_FP32], NULL};
  if (c->info.has_optimizer_state) {
    out->part[ZCK_STATE_EXP_AVG] = (zck_state_part){c->train_layout, c->stores[ZCK_DS_EXP_AVG], NULL};
    out->part[ZCK_STATE_EXP_AVG_SQ] = (zck_state_part){c->train_layout, c->stores[ZCK_DS_EXP_AVG_SQ], NULL};
  }
  /* no LP: the 16-bit weights are cast from the fp32 masters, as DeepSpeed refreshes them
   * after every step and on load; only frozen params keep their saved 16-bit values */
  if (c->frozen_layout) out->part[ZCK_STATE_FROZEN] = (zck_state_part){c->frozen_layout, c->stores[ZCK_DS_FROZEN], NULL};
  if (c->model->n_buffers && c->buffer_layout) {
    out->buffers = (zck_state_part){c->buffer_layout, c->buffer_stores, NULL};
    out->n_buffer_copies = 1;
  }
}

// ---- the target

/* The extents of a target-ordered plan dealt round-robin over the target files: each
 * file still receives its bytes front to back, but consecutive work items go to different
 * files, so two threads rarely write the same file at once (a piece that arrives ahead of
 * its file's hash cursor must be copied and held until the bytes before it come). */
static zck_status interleave_files(zck_plan *p, const zck_store *dst) {
  size_t n = p->n;
  if (n < 2) return ZCK_OK;
  zck__shash **file = zck__calloc(n, sizeof *file);
  size_t *next = zck__calloc(n, sizeof *next), *head = zck__calloc(n, sizeof *head), *tail = zck__calloc(n, sizeof *tail);
  zck_extent *out = zck__malloc(n * sizeof *out);
  zck_status s = file && next && head && tail && out ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t nq = 0;
  for (size_t i = 0; s == ZCK_OK && i < n; i++) {
    zck__ds_wstore *ws = zck__ds_wstore_of(&dst[p->ext[i].dst_store]);
    file[i] = ws ? ws->hf : NULL;
    /* queues by file in order of first appearance (a linear search: a few files) */
    size_t q = 0;
    while (q < nq && file[head[q]] != file[i]) q++;
    next[i] = SIZE_MAX;
    if (q == nq) head[nq++] = i;
    else next[tail[q]] = i;
    tail[q] = i;
  }
  /* within a file the extents keep the plan's (store, offset) order: stores are laid out in
   * the file in that order too (the writer adds them in store order per file) */
  for (size_t k = 0, q = 0; s == ZCK_OK && k < n; q = (q + 1) % nq) {
    if (head[q] == SIZE_MAX) continue;
    out[k++] = p->ext[head[q]];
    head[q] = next[head[q]];
  }
  if (s == ZCK_OK) memcpy(p->ext, out, n * sizeof *out);
  free(file);
  free(next);
  free(head);
  free(tail);
  free(out);
  return s;
}

/* Once the plans are known: what they write (every other byte of a target storage stays
 * zero), each plan dealt over the files, then the hash streams start. */
static zck_status writer_ready(void *ctx, zck_plan *const *plans, const zck_exec_job *jobs, size_t n) {
  zck_ds_writer *w = ctx;
  for (size_t i = 0; i < n; i++)
    for (size_t k = 0; k < plans[i]->n; k++) {
      const zck_extent *e = &plans[i]->ext[k];
      zck__ds_wstore *ws = zck__ds_wstore_of(&jobs[i].dst[e->dst_store]);
      size_t es = ws ? zck_dtype_size(ws->dtype) : 0;
      if (ws) zck__shash_cover(ws->hf, ws->base + e->dst_off * es, e->count * es);
    }
  for (size_t i = 0; i < n; i++) ZCK_TRY(interleave_files(plans[i], jobs[i].dst));
  return zck__ds_writer_hash_start(w);
}

void zck_ds_writer_state(zck_ds_writer *w, zck_state_view *out) {
  memset(out, 0, sizeof *out);
  out->model = w->m;
  out->name = w->shown;
  static const zck_state_kind kind_of[ZCK_DS_PART_COUNT] = {ZCK_STATE_FP32, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ,
                                                            ZCK_STATE_LP, ZCK_STATE_FROZEN};
  for (int p = 0; p < ZCK_DS_PART_COUNT; p++) {
    zck_ds_view v;
    if (zck_ds_writer_get(w, (zck_ds_part)p, &v) != ZCK_OK) continue;
    /* a rank-only writer of a rank > 0 builds no stage-1/2 model file */
    if (p == ZCK_DS_LP && w->rank_only && w->only != 0) continue;
    out->part[kind_of[p]] = (zck_state_part){v.layout, v.stores, NULL};
  }
  zck_clear_error();
  if (w->m->n_buffers && w->buffer_layout) {
    /* every model file holds all buffers; a rank-only writer fills its own file's */
    zck_ds_view b = zck_ds_writer_buffers(w, w->rank_only && w->stage == 3 ? w->only : 0);
    out->buffers = (zck_state_part){b.layout, b.stores, NULL};
    out->n_buffer_copies = !w->rank_only ? w->n_models : (w->stage == 3 || w->only == 0) ? 1 : 0;
  }
  if (w->hash_want) {
    out->write_in_order = true;
    out->ready = writer_ready;
    out->ready_ctx = w;
  }
}
