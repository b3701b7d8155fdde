/* reshard_autotp.c: an AutoTP checkpoint (or the universal folder made from one: the same
 * full tensors and affine map) resharded at its own TP size.
 *
 * The output holds every TP rank's files again (mp_rank_0t_model_states.pt,
 * [bf16_]zero_pp_rank_<dp>_mp_rank_0t_optim_states.pt; stage 3: zero_pp_rank_<dp>_mp_rank_0t_
 * model_states.pt), at the requested ZeRO stage and data-parallel size, so DeepSpeed's AutoTP
 * engine at (TP, new DP) loads them with a plain engine.load_checkpoint; DeepSpeed itself
 * refuses another DP size there ("Automatic adjustment of ZeRO's optimizer state
 * partitioning with a new world size is not currently supported") and offers only the
 * universal route. TP rank t's files are a ZeRO checkpoint of the model with t's shard shapes
 * (the affine map's shard_shape) and carry the source's universal_checkpoint_info, which
 * says how to cut the full tensors: one DeepSpeed writer per TP rank (rank 0 leads, the
 * others write into its temporary tag folder), each writer's target laid over the full
 * shapes by the same map (zck_ds_autotp_target), one transfer from the full source into
 * all of them. Another TP size is refused: DeepSpeed's AutoTP split at TP N depends on the
 * model config (kv heads, tp_grain_size), which the checkpoint does not record. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "deepspeed/ds_writer.h"
#include "manifest.h"
#include "reshard_internal.h"
#include "transfer.h"

typedef struct tp_target {
  zck_model *m;                 /* TP rank t's shard shapes */
  zck_ds_writer *w;
  zck_state_view v;             /* the writer's view laid over the full shapes */
  const zck_layout *shard[ZCK_STATE_KINDS];  /* the writer's layouts ... */
  zck_layout *full[ZCK_STATE_KINDS];         /* ... composed (each distinct one once) */
} tp_target;

/* The writer's view of TP rank t over the full shapes: each distinct part layout composed
 * once (fp32 / exp_avg / exp_avg_sq share the train layout). */
static zck_status target_view(const zck__autotp_src *src, uint32_t t, tp_target *x) {
  zck_ds_writer_state(x->w, &x->v);
  /* no hashing as it writes: the manifest reads the files back */
  x->v.write_in_order = false;
  x->v.ready = NULL;
  x->v.model = src->m;
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    const zck_layout *l = x->v.part[k].layout;
    if (!l) continue;
    const zck_layout *done = NULL;
    for (int j = 0; j < k && !done; j++)
      if (x->shard[j] == l) done = x->full[j];
    if (!done) {
      x->shard[k] = l;
      ZCK_TRY_CTX(zck_ds_autotp_target(src->uci, src->m, src->tp, t, l, &x->full[k]), "%s", src->dir);
      done = x->full[k];
    }
    x->v.part[k].layout = done;
  }
  return ZCK_OK;
}

zck_status zck__reshard_autotp(const zck__autotp_src *src, const zck_ds_write_opts *wo, const char *out,
                               const zck_reshard_opts *o) {
  const zck_model *m = src->m;
  uint32_t T = src->tp;
  if (o->to_tp_size != T)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: --to-tp-size %u from an AutoTP checkpoint of TP size %u: not supported "
                     "(DeepSpeed's split at another TP size depends on the model config; to-universal, then "
                     "load_universal at any TP size)", src->dir, o->to_tp_size, T);
  for (size_t p = 0; p < m->n_params; p++)
    if (m->params[p].frozen && m->params[p].tied_to < 0)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: frozen parameter '%s': an AutoTP reshard with frozen parameters is not "
                       "supported (reshard to TP 1, or to-universal)", src->dir, m->params[p].name);
  tp_target *x = zck__calloc(T, sizeof *x);
  zck_state_view *views = zck__calloc(T, sizeof *views);
  zck__outdir d;
  memset(&d, 0, sizeof d);
  zck_status st = x && views ? zck__outdir_create(&d, out, o->overwrite != 0) : ZCK_ERR_NO_MEMORY;
  for (uint32_t t = 0; st == ZCK_OK && t < T; t++) {
    zck_ds_write_opts wt = *wo;
    wt.mp_rank = t;
    wt.tp_size = T;
    wt.tp_info = src->uci;
    wt.save_latest = t == 0;
    st = zck_ds_autotp_shard_model(src->uci, m, t, &x[t].m);
    if (st != ZCK_OK) st = zck__error_prepend(st, "%s", src->dir);
    if (st == ZCK_OK)
      st = t == 0 ? zck_ds_writer_create(d.tmp_path, x[t].m, &wt, &x[t].w)
                  : zck__ds_writer_create_joined(x[0].w, x[t].m, &wt, &x[t].w);
    if (st == ZCK_OK) st = target_view(src, t, &x[t]);
    if (st == ZCK_OK) views[t] = x[t].v;
  }
  if (st == ZCK_OK) {
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec.threads = o->threads;
    to.exec.progress = o->progress;
    to.exec.progress_ctx = o->progress_ctx;
    to.exec.no_verify = o->no_verify != 0;
    st = zck_transfer(src->view, views, T, &to);
  }
  /* the joined ranks' files first: rank 0's commit renames the tag folder into place */
  for (uint32_t t = T; st == ZCK_OK && t-- > 0;) st = zck_ds_writer_commit(x[t].w);
  if (st == ZCK_OK && src->side_root)
    st = zck__reshard_carry_side_files(src->side_root, src->side_skip, d.tmp_path, wo->world_size);
  if (st == ZCK_OK) {
    /* written last: its presence says the checkpoint is complete, its hashes what it holds */
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.kind = "deepspeed";
    mo.threads = o->threads;
    char *tag_dir = wo->tag ? zck__path_join(d.tmp_path, wo->tag)
                            : zck__sprintf("%s/global_step%lld", d.tmp_path, (long long)wo->global_steps);
    st = tag_dir ? zck__manifest_write_dir_known(tag_dir, &mo, NULL, NULL) : ZCK_ERR_NO_MEMORY;
    free(tag_dir);
  }
  if (st == ZCK_OK) st = zck__outdir_commit(&d);
  if (st == ZCK_OK) zck__job_summary_fill(o->summary, out, m->n_params);
  for (uint32_t t = T; x && t-- > 0;) {  /* joined writers before their lead */
    zck_ds_writer_free(x[t].w);
    for (int k = 0; k < ZCK_STATE_KINDS; k++) zck_layout_free(x[t].full[k]);
    zck_model_free(x[t].m);
  }
  zck__outdir_abort(&d);
  free(x);
  free(views);
  return st;
}
