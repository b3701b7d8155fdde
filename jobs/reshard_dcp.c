/* reshard_dcp.c: `zckpt reshard SRC OUT --to-format dcp [--to-world-size W]`: a DeepSpeed
 * checkpoint as the torch Distributed Checkpoint FSDP2 would have saved at W ranks, with
 * all optimizer state (fp32 weights, exp_avg, exp_avg_sq, step, param-group settings).
 * SRC: anything reshard reads (jobs/source): a DeepSpeed checkpoint of any layout zckpt
 * reads, a universal folder, the HDF5 universal container, or a DCP itself (another folder
 * shape, world size or storage: torchtitan's step-N as Accelerate's folders; weights and
 * Adam state as float32, as FSDP2 keeps them: a bf16 source's loader casts them back
 * exactly; a model-only DCP stays model-only).
 *
 * The recipe of every job: the source described as a state view; the DCP writer reserves
 * OUT's files and hands back its views (formats/dcp/dcp_writer.h); one zck_transfer moves
 * the bytes, checking the source's CRCs as it reads and taking the target's as it writes;
 * the writer's commit finishes the items and .metadata, zckpt's manifest is written last,
 * and the folder, built under a temporary name, is renamed into place. The manifest's
 * hashes are made by reading the new files back (once, in order): the DCP writer does not
 * stream them yet as the DeepSpeed writer does (an item's directory holds its data's
 * CRC-32, which lib/stream_hash can only derive right after the data). A damaged source
 * stops the transfer with one line and nothing is left at OUT.
 *
 * --to-format dcp-accelerate writes the same items as Accelerate's save_state and the HF
 * Trainer's checkpoint-N save an FSDP model (FSDP1 or FSDP2) with SHARDED_STATE_DICT:
 * pytorch_model_fsdp_0/ ({"model": ...}) and optimizer_0/ ({"optimizer": ...}), which their
 * load_state / resume_from_checkpoint read. Nothing in a DeepSpeed source says which of the
 * two loaders the user has, so the target format names it. From a DeepSpeed save root (an
 * HF checkpoint-N/) it also carries the root's other files as the DeepSpeed reshard does
 * (trainer_state.json, scheduler.pt, rng_state_<r>.pth of ranks below W, config): the
 * Trainer's resume reads them beside the DCP folders (its global step, the lr scheduler and
 * the data position follow trainer_state.json and scheduler.pt).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp/dcp.h"
#include "dcp/dcp_writer.h"
#include "deepspeed/deepspeed.h"
#include "hdf5/zck_h5.h"
#include "manifest.h"
#include "reshard_internal.h"
#include "transfer.h"
#include "universal/universal.h"

/* Accelerate's folders for model 0 and optimizer 0 (accelerate.utils.fsdp_utils:
 * f"{FSDP_MODEL_NAME}_{index}", f"{OPTIMIZER_NAME}_{index}") */
#define ZCK__ACCELERATE_MODEL_DIR "pytorch_model_fsdp_0"
#define ZCK__ACCELERATE_OPTIM_DIR "optimizer_0"

/* Writes OUT from the source view src over m; step: Adam's step of the source. One
 * writer for get_state_dict's folder, two (model, then optimizer) for Accelerate's, with
 * side_root's other files but side_skip (a save root and its tag folder; NULL: none). */
static zck_status zck__dcp_from_view(const zck_state_view *src, const zck_model *m, bool has_optim, double step,
                                     uint32_t world, const char *side_root, const char *side_skip, const char *out,
                                     const zck_reshard_opts *o) {
  zck__outdir d;
  memset(&d, 0, sizeof d);
  zck_dcp_writer *w[2] = {NULL, NULL};
  bool accelerate = o->to_format == ZCK_RESHARD_TO_DCP_ACCELERATE;
  zck_dcp_write_opts wo[2] = {ZCK_DCP_WRITE_OPTS_INIT, ZCK_DCP_WRITE_OPTS_INIT};
  for (int i = 0; i < 2; i++) {
    wo[i].world_size = world;
    wo[i].has_optimizer_state = has_optim;
    wo[i].step = step;
  }
  if (accelerate) {
    wo[0].has_optimizer_state = false;
    wo[1].optim_root = "optimizer";
    wo[1].no_model = true;
  }
  int n_writers = accelerate ? 2 : 1;
  zck_status st = zck__outdir_create(&d, out, o->overwrite != 0);
  for (int i = 0; st == ZCK_OK && i < n_writers; i++) {
    char *dir = accelerate ? zck__outdir_file(&d, i ? ZCK__ACCELERATE_OPTIM_DIR : ZCK__ACCELERATE_MODEL_DIR)
                           : zck__strdup(d.tmp_path);
    if (!dir) st = ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK && accelerate) st = zck__mkdirs(dir);
    if (st == ZCK_OK) st = zck_dcp_writer_create(dir, m, &wo[i], &w[i]);
    free(dir);
  }
  if (st == ZCK_OK) {
    zck_state_view dst[4];
    size_t n = 0;
    for (int i = 0; i < n_writers; i++) n += zck_dcp_writer_state(w[i], dst + n);
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec.threads = o->threads;
    to.exec.progress = o->progress;
    to.exec.progress_ctx = o->progress_ctx;
    to.exec.no_verify = o->no_verify != 0;
    st = zck_transfer(src, dst, n, &to);
  }
  for (int i = 0; st == ZCK_OK && i < n_writers; i++) st = zck_dcp_writer_commit(w[i]);
  if (st == ZCK_OK && accelerate && side_root)
    st = zck__reshard_carry_side_files(side_root, side_skip, d.tmp_path, world);
  /* but DeepSpeed's recovery scripts, which read a DeepSpeed tag folder that OUT does not have */
  static const char *const ds_scripts[] = {"zero_to_fp32.py", "zero_to_torch.py"};
  for (size_t i = 0; st == ZCK_OK && accelerate && side_root && i < sizeof ds_scripts / sizeof *ds_scripts; i++) {
    char *p = zck__path_join(d.tmp_path, ds_scripts[i]);
    if (!p) st = ZCK_ERR_NO_MEMORY;
    else remove(p);  /* absent when the source had none */
    free(p);
  }
  if (st == ZCK_OK) {
    /* written last: its presence says the checkpoint is complete, its hashes what it holds */
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.threads = o->threads;
    st = zck__manifest_write_dir_known(d.tmp_path, &mo, NULL, NULL);
  }
  if (st == ZCK_OK) st = zck__outdir_commit(&d);
  if (st == ZCK_OK) zck__job_summary_fill(o->summary, out, m->n_params);
  for (int i = 0; i < n_writers; i++) zck_dcp_writer_free(w[i]);
  zck__outdir_abort(&d);
  return st;
}

/* What the source says of itself: its world size, Adam's step, whether it has Adam state,
 * its TP size. */
typedef struct zck__dcp_src_info {
  uint32_t world, tp;
  double step;
  bool has_optim;
  const char *dir;
} zck__dcp_src_info;

/* A DCP source (another folder shape, world size or storage: torchtitan's step-N as
 * Accelerate's folders, a safetensors-storage save as torch_save storage): its Adam state
 * must be Adam's with one step (zck_dcp_train_info), and an adapter-only PEFT save, whose
 * optimizer names its params otherwise than its model folder, is refused by name. */
static zck_status zck__dcp_src_dcp_info(const zck__src *s, zck__dcp_src_info *i) {
  if (zck_dcp_peft_adapter(s->dcp))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: an adapter-only PEFT save (the model keys drop the adapter name '%s', "
                     "the optimizer's keep it): --to-format dcp does not rewrite it; reshard it to DeepSpeed or "
                     "consolidate it", s->dir, zck_dcp_peft_adapter(s->dcp));
  const zck_dcp_info *in = zck_dcp_info_of(s->dcp);
  zck_dcp_train tr;
  ZCK_TRY(zck_dcp_train_info(s->dcp, &tr));
  *i = (zck__dcp_src_info){tr.world_size ? tr.world_size : 1, 1, tr.step, in->has_optimizer_state, s->dir};
  if (i->has_optim && !tr.has_step)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: Adam's step is missing from the optimizer state", s->dir);
  return ZCK_OK;
}

static zck__dcp_src_info zck__dcp_src_info_of(const zck__src *s) {
  zck__dcp_src_info i = {1, 1, 0.0, false, s->dir};
  if (s->ck) {
    const zck_ds_info *in = zck_ds_info_of(s->ck);
    i = (zck__dcp_src_info){in->world_size, in->tp_size, in->step, in->has_optimizer_state, in->dir};
  } else if (s->uv) {
    const zck_uv_info *in = zck_uv_info_of(s->uv);
    i = (zck__dcp_src_info){in->world_size, in->tp_size, in->step, in->has_optimizer_state, in->dir};
  } else if (s->h5) {
    const zck_h5u_info *in = zck_h5u_info_of(s->h5);
    bool moments = s->view.part[ZCK_STATE_EXP_AVG].layout && s->view.part[ZCK_STATE_EXP_AVG_SQ].layout;
    i = (zck__dcp_src_info){in->world_size, 1, in->step, moments, s->dir};
  }
  return i;
}

zck_status zck__reshard_to_dcp(const char *src, zck__src_kind kind, const char *out, const zck_reshard_opts *o) {
  if (o->to_stage) return zck__fail(ZCK_ERR_INVALID_ARG, "--to-stage: a DCP checkpoint has no ZeRO stage (FSDP shards every param)");
  if (o->to_tp_size > 1) return zck__fail(ZCK_ERR_INVALID_ARG, "--to-tp-size: not with a DCP target");
  if (o->sub_group_size) return zck__fail(ZCK_ERR_INVALID_ARG, "--sub-group-size: not with a DCP target");
  if (o->tag && (kind == ZCK__SRC_HDF5 || kind == ZCK__SRC_UNIVERSAL))
    return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a universal checkpoint, which has no tags", src);
  zck__src_opts so = ZCK__SRC_OPTS_INIT;
  so.reads = ZCK__SRC_BIT(ZCK__SRC_DEEPSPEED) | ZCK__SRC_BIT(ZCK__SRC_UNIVERSAL) | ZCK__SRC_BIT(ZCK__SRC_HDF5) |
             ZCK__SRC_BIT(ZCK__SRC_DCP);
  so.tag = o->tag;
  so.threads = o->threads;
  so.force = o->force != 0;
  so.check_complete = true;
  so.check_complete_universal = true;
  so.no_verify = o->no_verify != 0;
  zck__src s;
  ZCK_TRY(zck__src_open(&s, src, kind, &so));
  zck__dcp_src_info in = zck__dcp_src_info_of(&s);
  zck_status st = s.dcp ? zck__dcp_src_dcp_info(&s, &in) : ZCK_OK;
  /* a DCP may hold the model alone (its copy keeps it so); a DeepSpeed target needs Adam's */
  if (st == ZCK_OK && !in.has_optim && !s.dcp)
    st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: no optimizer state (exp_avg / exp_avg_sq) to convert", in.dir);
  if (st == ZCK_OK && in.tp > 1)
    st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: an AutoTP checkpoint: --to-format dcp writes data parallel only", in.dir);
  if (st == ZCK_OK && s.ck) st = zck_ds_autoep_refuse(s.ck, "reshard --to-format dcp");
  if (st == ZCK_OK && s.ck) st = zck_ds_moe_refuse(s.ck, "reshard --to-format dcp");
  if (st == ZCK_OK && s.ck) st = zck_ds_pipe_refuse(s.ck, "reshard --to-format dcp");
  if (st == ZCK_OK && s.uv) st = zck_uv_autoep_refuse(s.uv, "reshard --to-format dcp");
  if (st == ZCK_OK && s.h5) st = zck_h5u_moe_refuse(s.h5, "reshard --to-format dcp");
  if (st == ZCK_OK) {
    uint32_t world = o->to_world_size ? o->to_world_size : in.world;
    const zck_ds_info *ds = s.ck ? zck_ds_info_of(s.ck) : NULL;
    st = zck__dcp_from_view(&s.view, s.m, in.has_optim, in.step, world, ds ? ds->root : NULL, ds ? ds->tag : NULL,
                            out, o);
  }
  zck__src_close(&s);
  return st;
}
