/* ds_copy.c: reshard = describe the source, reserve the target, then one set of copy
 * plans run on one thread pool: fp32 master (and exp_avg / exp_avg_sq) partition to
 * partition, 16-bit module weights from the fp32 master (RNE cast, as DeepSpeed refreshes
 * its lp params from the master after every step) and from the frozen params, stage-3
 * frozen fragments, and buffers into every model file. */
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
}

typedef struct jobs {
  zck_exec_job *v;
  zck_plan **plans;
  size_t n, cap;
} jobs;

static zck_status add_job(jobs *j, const zck_layout *src, const zck_store *src_st, const zck_layout *dst,
                          const zck_store *dst_st, bool allow_missing, const char *const *names, bool by_dst) {
  if (j->n == j->cap) {
    size_t nc = j->cap ? 2 * j->cap : 16;
    zck_exec_job *nv = zck__realloc(j->v, nc * sizeof *nv);
    if (!nv) return ZCK_ERR_NO_MEMORY;
    j->v = nv;
    zck_plan **np = zck__realloc(j->plans, nc * sizeof *np);
    if (!np) return ZCK_ERR_NO_MEMORY;
    j->plans = np;
    j->cap = nc;
  }
  zck_plan_opts po = ZCK_PLAN_OPTS_INIT;
  po.allow_missing = allow_missing;
  po.param_names = names;
  if (by_dst) {
    po.order = ZCK_PLAN_BY_DST;
    po.max_chunk = (uint64_t)1 << 20; /* smaller pieces: less held ahead of a hash cursor */
  }
  zck_plan *p = NULL;
  ZCK_TRY(zck_plan_build(src, dst, &po, &p));
  j->plans[j->n] = p;
  j->v[j->n] = (zck_exec_job){p, src_st, dst_st, NULL};
  j->n++;
  return ZCK_OK;
}

/* The extents of a target-ordered plan dealt round-robin over the target files: each
 * file still receives its bytes front to back, but consecutive work items go to different
 * files, so two threads rarely write the same file at once (a piece that arrives ahead of
 * its file's hash cursor must be copied and held until the bytes before it come). */
static zck_status interleave_files(zck_plan *p, const zck_store *dst) {
  size_t n = p->n;
  if (n < 2) return ZCK_OK;
  zck__ds_hfile **file = zck__calloc(n, sizeof *file);
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

static zck_status same_model(const zck_model *a, const zck_model *b) {
  if (a == b) return ZCK_OK;
  if (a->n_params != b->n_params || a->n_buffers != b->n_buffers)
    return zck__fail(ZCK_ERR_MISMATCH, "the writer's manifest (%zu params, %zu buffers) is not the checkpoint's (%zu, %zu)",
                     b->n_params, b->n_buffers, a->n_params, a->n_buffers);
  for (size_t p = 0; p < a->n_params; p++)
    if (a->params[p].numel != b->params[p].numel || strcmp(a->params[p].name, b->params[p].name))
      return zck__fail(ZCK_ERR_MISMATCH, "param %zu: '%s' in the checkpoint, '%s' in the writer's manifest", p,
                       a->params[p].name, b->params[p].name);
  for (size_t i = 0; i < a->n_buffers; i++)
    if (a->buffers[i].numel != b->buffers[i].numel || a->buffers[i].dtype != b->buffers[i].dtype)
      return zck__fail(ZCK_ERR_MISMATCH, "buffer '%s' differs between the checkpoint and the writer's manifest",
                       a->buffers[i].name);
  return ZCK_OK;
}

zck_status zck_ds_copy(const zck_ds_ckpt *c, zck_ds_writer *w, const zck_exec_opts *opts) {
  const zck_model *m = c->model;
  ZCK_TRY(same_model(m, w->m));
  if (w->o.has_optimizer_state && !c->info.has_optimizer_state)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no optimizer state (exp_avg / exp_avg_sq) to copy; create the writer with "
                     "has_optimizer_state = false", c->fs.dir);
  const char **names = zck__calloc(m->n_params + 1, sizeof *names);
  if (!names) return ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; p < m->n_params; p++) names[p] = m->params[p].name;
  jobs j = {0};
  zck_status s = ZCK_OK;
  /* manifest hashes while writing: each target file is written front to back (reads
   * then go through the sources in several forward streams, one per source store) */
  bool by_dst = w->hash_want;
  zck_ds_view src_fp32, src_frozen = {0}, dst;
  bool has_frozen = c->frozen_layout != NULL;
  ZCK_CHECK_GOTO(zck_ds_get(c, ZCK_DS_FP32, &src_fp32), s, out);
  if (has_frozen) ZCK_CHECK_GOTO(zck_ds_get(c, ZCK_DS_FROZEN, &src_frozen), s, out);
  for (int part = ZCK_DS_FP32; part <= ZCK_DS_EXP_AVG_SQ; part++) {
    if (zck_ds_writer_get(w, (zck_ds_part)part, &dst) != ZCK_OK) continue;
    zck_ds_view src;
    ZCK_CHECK_GOTO(zck_ds_get(c, (zck_ds_part)part, &src), s, out);
    ZCK_CHECK_GOTO(add_job(&j, src.layout, src.stores, dst.layout, dst.stores, false, names, by_dst), s, out);
  }
  if (zck_ds_writer_get(w, ZCK_DS_LP, &dst) == ZCK_OK) {
    ZCK_CHECK_GOTO(add_job(&j, src_fp32.layout, src_fp32.stores, dst.layout, dst.stores, true, names, by_dst), s, out);
    if (has_frozen)
      ZCK_CHECK_GOTO(add_job(&j, src_frozen.layout, src_frozen.stores, dst.layout, dst.stores, true, names, by_dst), s, out);
  }
  if (zck_ds_writer_get(w, ZCK_DS_FROZEN, &dst) == ZCK_OK) {
    if (!has_frozen) {
      s = zck__fail(ZCK_ERR_NOT_FOUND, "%s: the checkpoint has no frozen-parameter data", c->fs.dir);
      goto out;
    }
    ZCK_CHECK_GOTO(add_job(&j, src_frozen.layout, src_frozen.stores, dst.layout, dst.stores, false, names, by_dst), s, out);
  }
  if (m->n_buffers) {
    /* every stage-3 model file holds all buffers: one plan per file (same geometry) */
    zck_ds_view sb = zck_ds_buffers(c);
    for (uint32_t r = 0; r < zck_ds_writer_model_files(w); r++)
      ZCK_CHECK_GOTO(add_job(&j, sb.layout, sb.stores, w->buffer_layout, zck_ds_writer_buffers(w, r).stores, false, NULL, by_dst),
                     s, out);
  }
  if (by_dst) {
    /* what the plans write; every other byte of a target storage stays zero */
    for (size_t i = 0; i < j.n; i++)
      for (size_t k = 0; k < j.plans[i]->n; k++) {
        const zck_extent *e = &j.plans[i]->ext[k];
        zck__ds_wstore *ws = zck__ds_wstore_of(&j.v[i].dst[e->dst_store]);
        size_t es = ws ? zck_dtype_size(ws->dtype) : 0;
        if (ws) zck__ds_hash_cover(ws->hf, ws->entry, e->dst_off * es, e->count * es);
      }
    for (size_t i = 0; i < j.n; i++) ZCK_CHECK_GOTO(interleave_files(j.plans[i], j.v[i].dst), s, out);
    ZCK_CHECK_GOTO(zck__ds_writer_hash_start(w), s, out);
  }
  s = zck_exec_run(j.v, j.n, opts);
out:
  for (size_t i = 0; i < j.n; i++) zck_plan_free(j.plans[i]);
  free(j.plans);
  free(j.v);
  free(names);
  return s;
}
