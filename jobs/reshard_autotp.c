/* reshard_autotp.c: AutoTP files (DeepSpeed's tensor-parallel layout) at TP size T from an
 * AutoTP checkpoint, a plain ZeRO checkpoint, or the universal folder of either (the same
 * full tensors).
 *
 * The output holds every TP rank's files (mp_rank_0t_model_states.pt,
 * [bf16_]zero_pp_rank_<dp>_mp_rank_0t_optim_states.pt; stage 3: zero_pp_rank_<dp>_mp_rank_0t_
 * model_states.pt), at the requested ZeRO stage and data-parallel size, so DeepSpeed's AutoTP
 * engine at (T, new DP) loads them with a plain engine.load_checkpoint; DeepSpeed itself
 * refuses another DP size there ("Automatic adjustment of ZeRO's optimizer state
 * partitioning with a new world size is not currently supported") and offers only the
 * universal route. TP rank t's files are a ZeRO checkpoint of the model with t's shard shapes
 * (the affine map's shard_shape) and carry a universal_checkpoint_info that says how to cut
 * the full tensors: the source's own at its own T; at another T the one DeepSpeed's engine
 * would save there (ds_autotp_plan.c: DeepSpeed's split rules, the model config from
 * config.json, refused when unknown). One DeepSpeed writer per TP rank (rank 0 leads, the
 * others write into its temporary tag folder), each writer's target laid over the full
 * shapes by the same map (zck_ds_autotp_target), one transfer from the full source into
 * all of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
static zck_status target_view(const zck__autotp_src *src, const zck_pk *uci, uint32_t T, uint32_t t, tp_target *x) {
  zck_ds_writer_state(x->w, &x->v); /* in file order, its hash streams ready (hash_inline) */
  x->v.model = src->m;
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    const zck_layout *l = x->v.part[k].layout;
    if (!l) continue;
    const zck_layout *done = NULL;
    for (int j = 0; j < k && !done; j++)
      if (x->shard[j] == l) done = x->full[j];
    if (!done) {
      x->shard[k] = l;
      ZCK_TRY_CTX(zck_ds_autotp_target(uci, src->m, T, t, l, &x->full[k]), "%s", src->dir);
      done = x->full[k];
    }
    x->v.part[k].layout = done;
  }
  /* frozen params with no elements on this rank only (more TP ranks than kv heads: DeepSpeed
   * saves the empty attention shards as frozen there) move nothing: a source with no frozen
   * params need not have any */
  if (x->v.part[ZCK_STATE_FROZEN].layout && !x->v.part[ZCK_STATE_FROZEN].layout->n_pieces)
    x->v.part[ZCK_STATE_FROZEN].layout = NULL;
  return ZCK_OK;
}

/* The TP ranks' writers' hashes as one list (borrowed entries; the folder's layout is
 * left to its reader, which knows the TP ranks). */
static zck_status known_of_all(const tp_target *x, uint32_t T, zck__manifest_known *all) {
  size_t n = 0;
  for (uint32_t t = 0; t < T; t++) {
    const zck__manifest_known *k = zck__ds_writer_known(x[t].w, NULL, NULL);
    n += k ? k->n_files : 0;
  }
  all->files = zck__malloc((n ? n : 1) * sizeof *all->files);
  if (!all->files) return ZCK_ERR_NO_MEMORY;
  for (uint32_t t = 0; t < T; t++) {
    const zck__manifest_known *k = zck__ds_writer_known(x[t].w, NULL, NULL);
    for (size_t i = 0; k && i < k->n_files; i++) all->files[all->n_files++] = k->files[i];
    if (k) all->chunk_size = k->chunk_size;
  }
  return ZCK_OK;
}

static bool is_file(const char *path) {
  struct stat sb;
  return path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* The model config DeepSpeed's split at another TP size reads: --model-config, else the
 * config.json carried over with the source's other files (HF Trainer's checkpoint-N/ keeps
 * it beside global_stepN/; the HDF5 container in /side_files), else the one beside the
 * source folder. *label names it in messages (the carried copy by where it came from). */
static zck_status plan_config(const zck__autotp_src *src, const zck_reshard_opts *o, const char *tmp_root, char **path,
                              char **label) {
  *path = *label = NULL;
  if (o->model_config) {
    *path = zck__strdup(o->model_config);
    *label = zck__strdup(o->model_config);
  } else if (is_file(*path = zck__path_join(tmp_root, "config.json"))) {
    *label = src->side_root ? zck__path_join(src->side_root, "config.json")
                            : zck__sprintf("%s: %s", src->dir, src->side_label ? src->side_label : "config.json");
  } else {
    free(*path);
    if (src->side_root) {
      *path = zck__path_join(src->side_root, "config.json");
    } else {  /* beside the source (an HDF5 container's folder) */
      char *dir = zck__strdup(src->dir);
      char *slash = dir ? strrchr(dir, '/') : NULL;
      if (slash) slash[slash == dir] = 0;
      *path = dir ? zck__path_join(slash ? dir : ".", "config.json") : NULL;
      free(dir);
    }
    *label = *path ? zck__strdup(*path) : NULL;
  }
  return *path && *label ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

zck_status zck__reshard_autotp(const zck__autotp_src *src, const zck_ds_write_opts *wo_in, const char *out,
                               const zck_reshard_opts *o) {
  const zck_model *m = src->m;
  uint32_t T = o->to_tp_size;
  zck_ds_write_opts wo_plan = *wo_in;
  const zck_ds_write_opts *wo = wo_in;
  const zck_pk *uci = src->uci;
  zck_ds_autotp_plan_out plan = {0};
  tp_target *x = zck__calloc(T, sizeof *x);
  zck_state_view *views = zck__calloc(T, sizeof *views);
  zck__outdir d;
  memset(&d, 0, sizeof d);
  zck_status st = x && views ? zck__outdir_create(&d, out, o->overwrite != 0) : ZCK_ERR_NO_MEMORY;
  /* the source's other files first: the model config may be one of them */
  if (st == ZCK_OK && src->side_root)
    st = zck__reshard_carry_side_files(src->side_root, src->side_skip, d.tmp_path, wo->world_size);
  if (st == ZCK_OK && src->side_write) st = src->side_write(src->side_ctx, d.tmp_path, wo->world_size);
  if (st == ZCK_OK && T != src->tp) {
    /* another TP size: DeepSpeed's split there, from the model config */
    char *cfg = NULL, *label = NULL;
    st = plan_config(src, o, d.tmp_path, &cfg, &label);
    zck_ds_autotp_plan_in pin = {m, src->tp > 1 ? src->uci : NULL, src->tp, cfg, label, wo_in->ds_config};
    if (st == ZCK_OK) st = zck_ds_autotp_plan(&pin, T, &plan);
    free(cfg);
    free(label);
    if (st != ZCK_OK) st = zck__error_prepend(st, "%s: --to-tp-size %u from TP size %u", src->dir, T, src->tp);
    uci = plan.uci;
    if (plan.ds_config) wo_plan.ds_config = plan.ds_config;
    wo = &wo_plan;
  }
  for (uint32_t t = 0; st == ZCK_OK && t < T; t++) {
    zck_ds_write_opts wt = *wo;
    wt.mp_rank = t;
    wt.tp_size = T;
    wt.tp_info = uci;
    wt.save_latest = t == 0;
    st = zck_ds_autotp_shard_model(uci, m, t, &x[t].m);
    if (st != ZCK_OK) st = zck__error_prepend(st, "%s", src->dir);
    if (st == ZCK_OK)
      st = t == 0 ? zck_ds_writer_create(d.tmp_path, x[t].m, &wt, &x[t].w)
                  : zck__ds_writer_create_joined(x[0].w, x[t].m, &wt, &x[t].w);
    /* each writer hashes its files as the transfer writes them: the manifest reads none back */
    if (st == ZCK_OK) zck__ds_writer_hash_inline(x[t].w, 0, 0);
    if (st == ZCK_OK) st = target_view(src, uci, T, t, &x[t]);
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
  if (st == ZCK_OK) {
    /* written last: its presence says the checkpoint is complete, its hashes what it holds */
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.kind = "deepspeed";
    mo.threads = o->threads;
    char *tag_dir = wo->tag ? zck__path_join(d.tmp_path, wo->tag)
                            : zck__sprintf("%s/global_step%lld", d.tmp_path, (long long)wo->global_steps);
    zck__manifest_known known = {ZCK_MANIFEST_DEFAULT_CHUNK, NULL, 0, NULL}; /* every TP rank's files */
    st = tag_dir ? known_of_all(x, T, &known) : ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK) st = zck__manifest_write_dir_known(tag_dir, &mo, &known, NULL);
    free(known.files);
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
  zck_ds_autotp_plan_free(&plan);
  return st;
}
