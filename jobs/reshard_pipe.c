/* reshard_pipe.c: a DeepSpeed PipelineModule checkpoint at another data-parallel size, in the same pipeline layout.
 *
 * What PipelineEngine 0.19.8 saves for P stages does not depend on the dp size but for the ZeRO-1 optimizer files
 * ([bf16_]zero_pp_rank_<d>_mp_rank_<stage>_optim_states.pt, one per dp rank of each stage) and each stage's
 * mp_rank_<stage>_model_states.pt (dp_world_size). So: one DeepSpeed writer per stage, as reshard_autotp.c has one per
 * TP rank (stage 0 leads, the others write into its temporary tag folder), each over the model of its stage's params
 * (zck_ds_pipe_stage_model: the source's params it holds; a TiedLayerSpec weight's copy in a later stage is written
 * from the first stage's, which DeepSpeed keeps equal to it), its view laid back over the source's param numbering,
 * one transfer from the source into all of them. The layer_<XX>-model_states.pt files (the weights, written by dp rank
 * 0 of each stage from its module) are copied as they are, each record's CRC-32 checked in the same pass
 * (zck_zip_copy_file_checked): the 16-bit weights do not change with the dp size. PipelineEngine takes ZeRO 0 and 1
 * only (runtime/pipe/engine.py), so the target is ZeRO-1; another pipeline degree is refused (the layers move between
 * stages: not written yet). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepspeed/ds_writer.h"
#include "zip/zip.h"
#include "manifest.h"
#include "reshard_internal.h"
#include "stream_hash.h"
#include "transfer.h"

typedef struct stage_target {
  zck_model *m;                              /* the stage's params */
  uint32_t *src_of;                          /* stage param j is the source's src_of[j] */
  zck_ds_writer *w;
  zck_layout *full[ZCK_STATE_KINDS];         /* the writer's layouts over the source's params (each distinct once) */
} stage_target;

/* l with its params p numbered src_of[p] in a model of n params of these numels. */
static zck_status shift_layout(const zck_layout *l, size_t n, const uint64_t *numel, const uint32_t *src_of,
                               zck_layout **out) {
  zck_piece *pc = zck__malloc((l->n_pieces + 1) * sizeof *pc);
  if (!pc) return ZCK_ERR_NO_MEMORY;
  memcpy(pc, l->pieces, l->n_pieces * sizeof *pc);
  for (size_t i = 0; i < l->n_pieces; i++) pc[i].param = src_of[pc[i].param];
  zck_status st = zck_layout_custom(n, numel, l->stores, l->n_stores, pc, l->n_pieces, out);
  free(pc);
  return st;
}

static zck_status target_view(const zck_model *src_m, const uint64_t *numel, stage_target *x, zck_state_view *v) {
  zck_ds_writer_state(x->w, v);   /* in file order, its hash streams ready (hash_inline) */
  v->model = src_m;
  const zck_layout *shard[ZCK_STATE_KINDS] = {0};
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    const zck_layout *l = v->part[k].layout;
    if (!l) continue;
    const zck_layout *done = NULL;
    for (int j = 0; j < k && !done; j++)
      if (shard[j] == l) done = x->full[j];
    if (!done) {
      shard[k] = l;
      ZCK_TRY(shift_layout(l, src_m->n_params, numel, x->src_of, &x->full[k]));
      done = x->full[k];
    }
    v->part[k].layout = done;
  }
  return ZCK_OK;
}

/* Each layer file checked as it is copied: the transfer reads none of its records (the weights go over as they are),
 * so nothing else would; its manifest hashes come from the same bytes into *known. */
static zck_status copy_layer_files(const zck_ds_ckpt *c, const char *dir, zck__manifest_known *known) {
  size_t cap = 0;
  for (size_t i = 0; i < zck_ds_pipe_layer_files(c); i++) {
    const char *from = zck_ds_pipe_layer_file(c, i), *slash = strrchr(from, '/'), *name = slash ? slash + 1 : from;
    char *to = zck__path_join(dir, name);
    zck__manifest_known_file f;
    zck_status st = to ? zck_zip_copy_file_checked(from, to, known->chunk_size, &f) : ZCK_ERR_NO_MEMORY;
    free(to);
    if (st == ZCK_OK) st = zck__known_take(known, &cap, &f, name);
    ZCK_TRY(st);
  }
  return ZCK_OK;
}

/* Every stage's writer's hashes and the layer files' as one list (borrowed entries). */
static zck_status known_of_all(const stage_target *x, uint32_t P, const zck__manifest_known *layers,
                               zck__manifest_known *all) {
  size_t n = layers->n_files;
  for (uint32_t s = 0; s < P; s++) {
    const zck__manifest_known *k = zck__ds_writer_known(x[s].w, NULL, NULL);
    n += k ? k->n_files : 0;
  }
  all->files = zck__malloc((n ? n : 1) * sizeof *all->files);
  if (!all->files) return ZCK_ERR_NO_MEMORY;
  for (uint32_t s = 0; s < P; s++) {
    const zck__manifest_known *k = zck__ds_writer_known(x[s].w, NULL, NULL);
    for (size_t i = 0; k && i < k->n_files; i++) all->files[all->n_files++] = k->files[i];
    if (k) all->chunk_size = k->chunk_size;
  }
  for (size_t i = 0; i < layers->n_files; i++) all->files[all->n_files++] = layers->files[i];
  return ZCK_OK;
}

zck_status zck__reshard_pipe(const zck_ds_ckpt *c, const zck_ds_write_opts *wo, const char *out,
                             const zck_reshard_opts *o) {
  const zck_ds_info *in = zck_ds_info_of(c);
  const zck_model *m = zck_ds_model(c);
  uint32_t P = zck_ds_pipe_stages(c);
  if (wo->stage != 1)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule checkpoint: DeepSpeed's PipelineEngine takes ZeRO-1 at "
                     "most; reshard writes it at ZeRO-1 (not --to-stage %d)", in->dir, wo->stage);
  if (o->to_tp_size > 1 || o->to_offload == ZCK_RESHARD_OFFLOAD_NVME)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule checkpoint: reshard writes it at another data-parallel "
                     "size only (not with %s)", in->dir, o->to_tp_size > 1 ? "--to-tp-size" : "--to-offload nvme");
  if (m->n_buffers)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a PipelineModule checkpoint with buffers (%s): reshard does not write it",
                     in->dir, m->buffers[0].name);
  ZCK_TRY(zck__reshard_check(in->dir, m, wo, in->has_optimizer_state, o));
  uint64_t *numel = zck__calloc(m->n_params + 1, sizeof *numel);
  stage_target *x = zck__calloc(P, sizeof *x);
  zck_state_view *views = zck__calloc(P, sizeof *views);
  zck__outdir d;
  memset(&d, 0, sizeof d);
  zck_status st = numel && x && views ? zck__outdir_create(&d, out, o->overwrite != 0) : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) zck_model_numels(m, numel);
  for (uint32_t s = 0; st == ZCK_OK && s < P; s++) {
    zck_ds_write_opts ws = *wo;
    ws.mp_rank = s;
    ws.pp_size = P;
    ws.save_latest = s == 0;
    ws.module_attrs = NULL;   /* `module` is None */
    st = zck_ds_pipe_stage_model(c, s, &x[s].m, &x[s].src_of);
    if (st == ZCK_OK)
      st = s == 0 ? zck_ds_writer_create(d.tmp_path, x[s].m, &ws, &x[s].w)
                  : zck__ds_writer_create_joined(x[0].w, x[s].m, &ws, &x[s].w);
    /* each writer hashes its files as the transfer writes them: the manifest reads none of them back */
    if (st == ZCK_OK) zck__ds_writer_hash_inline(x[s].w, 0, 0);
    if (st == ZCK_OK) st = target_view(m, numel, &x[s], &views[s]);
  }
  if (st == ZCK_OK) {
    zck_state_view view;
    zck_ds_state(c, &view);
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec.threads = o->threads;
    to.exec.progress = o->progress;
    to.exec.progress_ctx = o->progress_ctx;
    to.exec.no_verify = o->no_verify != 0;
    st = zck_transfer(&view, views, P, &to);
  }
  zck__manifest_known layers = {ZCK_MANIFEST_DEFAULT_CHUNK, NULL, 0, NULL};
  if (st == ZCK_OK) st = copy_layer_files(c, x[0].w->fdir, &layers);
  /* the joined stages' files first: stage 0's commit renames the tag folder into place */
  for (uint32_t s = P; st == ZCK_OK && s-- > 0;) st = zck_ds_writer_commit(x[s].w);
  if (st == ZCK_OK) st = zck__reshard_carry_side_files(in->root, in->tag, d.tmp_path, wo->world_size);
  if (st == ZCK_OK) {
    /* written last: its presence says the checkpoint is complete, its hashes what it holds */
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.kind = "deepspeed";
    mo.threads = o->threads;
    char *tag_dir = zck__path_join(d.tmp_path, x[0].w->tag);
    zck__manifest_known known = {ZCK_MANIFEST_DEFAULT_CHUNK, NULL, 0, NULL};
    st = tag_dir ? known_of_all(x, P, &layers, &known) : ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK) st = zck__manifest_write_dir_known(tag_dir, &mo, &known, NULL);
    free(known.files);
    free(tag_dir);
  }
  if (st == ZCK_OK) st = zck__outdir_commit(&d);
  if (st == ZCK_OK) zck__job_summary_fill(o->summary, out, m->n_params);
  for (uint32_t s = P; x && s-- > 0;) {  /* joined writers before their lead */
    zck_ds_writer_free(x[s].w);
    for (int k = 0; k < ZCK_STATE_KINDS; k++) zck_layout_free(x[s].full[k]);
    zck_model_free(x[s].m);
    free(x[s].src_of);
  }
  zck__known_free(&layers);
  zck__outdir_abort(&d);
  free(x);
  free(views);
  free(numel);
  return st;
}
