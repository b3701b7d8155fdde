/* consolidate.c: `zckpt consolidate`: a DeepSpeed ZeRO checkpoint to whole tensors.
 *
 * The DeepSpeed reader describes the checkpoint (manifest, ZeRO layout of the fp32
 * partitions, frozen fragments, buffers, and zero_to_fp32's output recipe); the writer
 * reserves one output tensor per recipe entry; then lib/transfer copies the fp32
 * partitions, frozen params and buffers (kept aliases in a second pass) straight from the
 * rank files into the output files, converting dtypes on the way. Memory is the
 * executor's staging buffers, whatever the model size.
 */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "deepspeed/deepspeed.h"
#include "consolidate_internal.h"
#include "stream_hash.h"
#include "tensor_set.h"
#include "transfer.h"
#include "zck.h"

/* One target part: every entry of one kind whose data lives in the source part `src`,
 * each param once (a whole-tensor layout holds each param once): a kept alias of a param
 * taken already goes to the next pass. */
typedef struct zck__cons_job {
  zck_layout *dst_layout;
  zck_store *dst;           /* [n] by target store */
  uint32_t *crc;            /* [n] */
  size_t *entry_of_store;   /* [n] */
  size_t n;
} zck__cons_job;

static void zck__cons_job_free(zck__cons_job *j) {
  zck_layout_free(j->dst_layout);
  free(j->dst);
  free(j->crc);
  free(j->entry_of_store);
  memset(j, 0, sizeof *j);
}

/* Takes every entry of `kind` not yet done whose param is not already in this job. */
static zck_status zck__cons_job_build(zck__cons_job *j, const zck_state_part *src, const zck__tensor_set *s,
                                      const zck__cons_ctx *c, const zck_store *dst, zck_ds_out_kind kind,
                                      uint8_t *done, const size_t *order) {
  memset(j, 0, sizeof *j);
  size_t n_index = src->layout->n_params;
  uint64_t *numel = zck__calloc(n_index ? n_index : 1, sizeof *numel);
  uint8_t *taken = zck__calloc(n_index ? n_index : 1, 1);
  uint32_t *owners = zck__malloc((s->n ? s->n : 1) * sizeof *owners);
  j->dst = zck__calloc(s->n ? s->n : 1, sizeof *j->dst);
  j->crc = zck__calloc(s->n ? s->n : 1, sizeof *j->crc);
  j->entry_of_store = zck__calloc(s->n ? s->n : 1, sizeof *j->entry_of_store);
  zck_status st = (numel && taken && owners && j->dst && j->crc && j->entry_of_store) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n_index; i++) numel[i] = src->layout->param_numel[i];
  for (size_t q = 0; st == ZCK_OK && q < s->n; q++) {
    size_t i = order ? order[q] : q; /* target stores in output order */
    const zck__cons_entry *e = &c->entries[i];
    if (e->kind != kind || dst[i].kind == ZCK_STORE_UNBOUND || done[i]) continue;
    if (e->index >= n_index) {
      st = zck__fail(ZCK_ERR_INTERNAL, "tensor %s: index %u outside its part", s->v[i].name, e->index);
      break;
    }
    if (taken[e->index]) continue;
    taken[e->index] = 1;
    done[i] = 1;
    owners[j->n] = e->index;
    j->dst[j->n] = dst[i];
    j->entry_of_store[j->n] = i;
    j->n++;
  }
  if (st == ZCK_OK && j->n) st = zck_layout_whole(n_index, numel, owners, j->n, &j->dst_layout);
  free(numel);
  free(taken);
  free(owners);
  return st;
}

/* The output tensors as target views of the checkpoint's state: trainable ones take the
 * fp32 masters, frozen ones the frozen params, the rest the buffers; one view per pass
 * (a tensor kept under two names is in two passes). One transfer fills them all. */
zck_status zck__cons_transfer(const zck__cons_ctx *c, const zck__tensor_set *s, const zck__set_pass *pass) {
  const zck_store *dst = pass->dst;
  uint32_t *crc_out = pass->crc;
  const size_t *order = pass->order;
  static const zck_ds_out_kind kinds[3] = {ZCK_DS_OUT_TRAINABLE, ZCK_DS_OUT_FROZEN, ZCK_DS_OUT_BUFFER};
  zck_state_view src = *c->src;
  const zck_state_part *from[3] = {&src.part[ZCK_STATE_FP32], &src.part[ZCK_STATE_FROZEN], &src.buffers};
  bool have[3] = {false, false, false};
  for (size_t i = 0; i < s->n; i++)
    for (int k = 0; k < 3; k++)
      if (c->entries[i].kind == kinds[k]) have[k] = true;
  zck_status st = ZCK_OK;
  if (have[1] && !from[1]->layout) st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no frozen parameters", src.name);
  if (have[2] && !from[2]->layout) st = zck__fail(ZCK_ERR_INTERNAL, "buffers listed but none described");
  uint8_t *done = zck__calloc(s->n ? s->n : 1, 1);
  zck__cons_job *jobs = NULL;     /* [3 * n_pass] */
  zck_state_view *views = NULL;   /* [n_pass] */
  size_t n_pass = 0;
  if (st == ZCK_OK && !done) st = ZCK_ERR_NO_MEMORY;
  for (bool more = true; st == ZCK_OK && more;) {
    zck__cons_job *nj = zck__realloc(jobs, 3 * (n_pass + 1) * sizeof *nj);
    zck_state_view *nv = nj ? zck__realloc(views, (n_pass + 1) * sizeof *nv) : NULL;
    if (nj) jobs = nj;
    if (nv) views = nv;
    if (!nj || !nv) { st = ZCK_ERR_NO_MEMORY; break; }
    zck__cons_job *pj = &jobs[3 * n_pass];
    zck_state_view *v = &views[n_pass];
    memset(pj, 0, 3 * sizeof *pj);
    memset(v, 0, sizeof *v);
    more = false;
    for (int k = 0; st == ZCK_OK && k < 3; k++) {
      if (!have[k]) continue;
      st = zck__cons_job_build(&pj[k], from[k], s, c, dst, kinds[k], done, order);
      if (st != ZCK_OK || !pj[k].n) continue;
      more = true;
      v->write_in_order = order != NULL; /* its plans in target order: the output's hashes follow */
      zck_state_part part = {pj[k].dst_layout, pj[k].dst, crc_out ? pj[k].crc : NULL};
      if (k == 0) v->part[ZCK_STATE_FP32] = part;
      else if (k == 1) v->part[ZCK_STATE_FROZEN] = part;
      else {
        v->buffers = part;
        v->n_buffer_copies = 1;
      }
    }
    n_pass++;
    if (!more) n_pass--, zck__cons_job_free(&pj[0]), zck__cons_job_free(&pj[1]), zck__cons_job_free(&pj[2]);
  }
  if (st == ZCK_OK) {
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec.threads = c->threads;
    to.exec.progress = c->progress;
    to.exec.progress_ctx = c->progress_ctx;
    to.exec.no_verify = c->no_verify;
    /* targets hashed as written get their bytes in file order. A source store with an
     * XXH3 (a zckpt-written rank file) streamed whole in its own order (a rank's flat
     * masters, in model order) would run ahead of them (a shard's tensors are in name
     * order; the ranks' partitions stream at once) by more than the hashes may hold: its
     * XXH3s are checked in a pass of their own, and the copy follows the output */
    to.exec.verify_first = order && zck__set_out_bytes(s) > zck__shash_default_budget();
    st = zck_transfer(&src, views, n_pass, &to);
  }
  for (size_t j = 0; jobs && j < 3 * n_pass; j++) {
    if (st == ZCK_OK && crc_out)
      for (size_t k = 0; k < jobs[j].n; k++) crc_out[jobs[j].entry_of_store[k]] = jobs[j].crc[k];
    zck__cons_job_free(&jobs[j]);
  }
  free(jobs);
  free(views);
  free(done);
  return st;
}

bool zck__cons_floating(zck_dtype t) { return t == ZCK_F32 || t == ZCK_F16 || t == ZCK_BF16 || t == ZCK_F64; }

/* The tied-alias map save_pretrained would drop, as metadata {"alias": "source", ...}. */
static zck_status zck__cons_tied_meta(zck__tensor_set *s) {
  cJSON *m = NULL;
  for (size_t i = 0; i < s->n; i++) {
    if (s->v[i].alias_of < 0) continue;
    if (!m && !(m = cJSON_CreateObject())) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    cJSON_AddStringToObject(m, s->v[i].name, s->v[s->v[i].alias_of].name);
  }
  if (!m) return ZCK_OK;
  char *text = cJSON_PrintUnformatted(m);
  cJSON_Delete(m);
  if (!text) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  zck_status st = zck__set_add_meta(s, "tied_parameters", text);
  cJSON_free(text);
  return st;
}

/* Tied aliases whose source the checkpoint does not hold (saved with
 * exclude_frozen_parameters: PEFT's lm_head.weight -> transformer.wte.weight). zero_to_fp32
 * drops them; the output keeps the pair as metadata {"alias": "source", ...} so a loader
 * can re-tie them to the base model's weight. */
static zck_status zck__cons_unsaved_meta(zck__tensor_set *s, const char *const *pairs, size_t n) {
  if (!n) return ZCK_OK;
  cJSON *m = cJSON_CreateObject();
  for (size_t i = 0; m && i < n; i++)
    if (!cJSON_AddStringToObject(m, pairs[2 * i], pairs[2 * i + 1])) { cJSON_Delete(m); m = NULL; }
  char *text = m ? cJSON_PrintUnformatted(m) : NULL;
  cJSON_Delete(m);
  if (!text) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  zck_status st = zck__set_add_meta(s, "tied_to_unsaved", text);
  cJSON_free(text);
  return st;
}

zck_status zck__cons_open(zck__src *s, const char *path, const zck_consolidate_opts *o) {
  memset(s, 0, sizeof *s);
  zck__src_kind kind = zck__src_sniff(path);
  if ((kind == ZCK__SRC_HDF5 || kind == ZCK__SRC_UNIVERSAL) && o->tag)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a universal %s, which has no tags", path,
                     kind == ZCK__SRC_HDF5 ? "container" : "checkpoint");
  if (kind == ZCK__SRC_DCP && o->tag)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a torch Distributed Checkpoint, which has no tags", path);
  zck__src_opts so = ZCK__SRC_OPTS_INIT;
  so.reads = ZCK__SRC_BIT(ZCK__SRC_DEEPSPEED) | ZCK__SRC_BIT(ZCK__SRC_UNIVERSAL) | ZCK__SRC_BIT(ZCK__SRC_HDF5) |
             ZCK__SRC_BIT(ZCK__SRC_DCP);
  so.tag = o->tag;
  so.threads = o->threads;
  so.force = o->force != 0;
  so.check_complete = so.check_complete_universal = true;
  so.no_verify = o->no_verify != 0;
  so.recipe = true;
  return zck__src_open(s, path, kind, &so);
}

/* The output tensors of zero_to_fp32's recipe as a tensor set (sources unbound: the
 * filler binds them), with what each entry is in DeepSpeed terms. */
zck_status zck__cons_build_set(const zck_ds_output *outs, size_t n_out, const zck_consolidate_opts *opts,
                               zck__tensor_set *set, zck__cons_entry **entries_out) {
  const zck_consolidate_opts o = *opts;
  zck__tensor_set s;
  zck__set_init(&s);

  zck__cons_entry *entries = zck__calloc(n_out ? n_out : 1, sizeof *entries);
  int32_t *set_index = zck__malloc((n_out ? n_out : 1) * sizeof *set_index);
  zck_status st = (entries && set_index) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n_out; i++) {
    const zck_ds_output *d = &outs[i];
    set_index[i] = -1;
    const zck_ds_output *data = d;
    if (d->kind == ZCK_DS_OUT_ALIAS) {
      if (d->alias_of < 0 || (size_t)d->alias_of >= n_out || set_index[d->alias_of] < 0) continue; /* source left out */
      data = &outs[d->alias_of];
    }
    /* DeepSpeed 0.19.8 files zero-element trainable params under frozen_param_shapes, so
     * the checkpoint cannot tell them from frozen ones: --exclude-frozen keeps every
     * zero-element tensor (free, and what a strict load_state_dict of a model needs) */
    if (data->kind == ZCK_DS_OUT_FROZEN && o.exclude_frozen && data->numel > 0) continue;
    zck_store unbound = {0};
    st = zck__set_add(&s, d->name, d->src_dtype, d->ndim, d->shape, unbound);
    if (st != ZCK_OK) break;
    zck__tensor_entry *e = &s.v[s.n - 1];
    e->out_dtype = (o.dtype && zck__cons_floating(d->dtype)) ? o.dtype : d->dtype;
    if (d->kind == ZCK_DS_OUT_ALIAS) {
      e->out_dtype = s.v[set_index[d->alias_of]].out_dtype;
      /* safetensors cannot share storage: an alias is dropped (and recorded) unless kept */
      e->alias_of = set_index[d->alias_of];
      e->tied_to = set_index[d->alias_of];
    }
    entries[s.n - 1] = (zck__cons_entry){data->kind, data->index};
    set_index[i] = (int32_t)(s.n - 1);
  }
  free(set_index);
  if (st != ZCK_OK) {
    zck__set_free(&s);
    zck__set_init(&s);
    free(entries);
    entries = NULL;
  }
  *set = s;
  *entries_out = entries;
  return st;
}

zck_status zck_consolidate(const char *path, const char *out, const zck_consolidate_opts *opts) {
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  ZCK_TRY(zck__opts_load(&o, sizeof o, opts, "zck_consolidate"));
  if (o.dtype != ZCK_DTYPE_INVALID && !zck__cons_floating(o.dtype))
    return zck__fail(ZCK_ERR_INVALID_ARG, "--dtype must be fp32, bf16 or fp16");
  zck_output_format fmt = zck__output_format_of(out);
  if (fmt == ZCK_OUT_SAFETENSORS) { o.safetensors = 1; o.torch_bin = 0; }
  if (fmt == ZCK_OUT_TORCH) { o.safetensors = 0; o.torch_bin = 1; }
  if (!o.safetensors && !o.torch_bin) return zck__fail(ZCK_ERR_INVALID_ARG, "nothing to write: choose safetensors or pt");

  zck__src src;
  ZCK_TRY(zck__cons_open(&src, path, &o));
  zck_status complete = zck_check_out_not_input(path, out, o.tag);
  struct stat osb;
  if (complete == ZCK_OK && fmt != ZCK_OUT_HF_DIR && stat(out, &osb) == 0 && S_ISDIR(osb.st_mode))
    complete = zck__fail(ZCK_ERR_EXISTS, "%s: exists and is a folder (an OUT named *.%s is written as one file)", out,
                         fmt == ZCK_OUT_SAFETENSORS ? "safetensors" : "bin/.pt");
  if (complete != ZCK_OK) {
    zck__src_close(&src);
    return complete;
  }
  zck__tensor_set s;
  zck__cons_entry *entries = NULL;
  zck_status st = zck__cons_build_set(src.outs, src.n_outs, &o, &s, &entries);
  zck__cons_ctx ctx = {&src.view, entries, o.threads, o.progress, o.progress_ctx, o.no_verify != 0};
  char **side_names = NULL, **side_texts = NULL;
  size_t n_side = 0;
  if (st == ZCK_OK && fmt == ZCK_OUT_HF_DIR) st = zck__src_side_files(&src, &side_names, &side_texts, &n_side);
  if (st == ZCK_OK && o.safetensors) {
    if (o.keep_tied) {
      for (size_t i = 0; i < s.n; i++) s.v[i].alias_of = -1; /* written as copies */
    } else {
      st = zck__cons_tied_meta(&s);
    }
    if (st == ZCK_OK) st = zck__cons_unsaved_meta(&s, src.unsaved, src.n_unsaved);
  }
  /* reserve the output, fill it from the checkpoint's state, commit it */
  zck__write_opts wo = {.threads = o.threads, .max_shard_size = o.max_shard_size, .overwrite = o.overwrite != 0,
                        .manifest = true,
                        .torch_bin_too = fmt == ZCK_OUT_HF_DIR && o.safetensors && o.torch_bin,
                        .side_names = (const char *const *)side_names, .side_texts = (const char *const *)side_texts,
                        .n_side = n_side};
  zck__set_out kind = fmt == ZCK_OUT_SAFETENSORS ? ZCK__SET_OUT_ST_FILE
                      : fmt == ZCK_OUT_TORCH     ? ZCK__SET_OUT_TORCH_FILE
                      : o.safetensors            ? ZCK__SET_OUT_ST_DIR
                                                 : ZCK__SET_OUT_TORCH_DIR;
  zck__set_target *t = NULL;
  if (st == ZCK_OK) st = zck__set_reserve(&s, kind, out, &wo, &t);
  for (size_t i = 0; st == ZCK_OK && i < zck__set_target_passes(t); i++)
    st = zck__cons_transfer(&ctx, &s, zck__set_target_pass(t, i));
  if (st == ZCK_OK) st = zck__set_target_commit(t);
  zck__set_target_free(t);
  if (st == ZCK_OK && o.summary) {
    uint64_t stored = 0; /* a tied alias in the safetensors metadata is no tensor of its own */
    for (size_t i = 0; i < s.n; i++) stored += !o.safetensors || s.v[i].alias_of < 0;
    zck__job_summary_fill(o.summary, out, stored);
  }
  for (size_t i = 0; i < n_side; i++) { free(side_names[i]); free(side_texts[i]); }
  free(side_names);
  free(side_texts);
  zck__set_free(&s);
  free(entries);
  zck__src_close(&src);
  return st;
}
