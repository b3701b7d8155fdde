/* reshard.c: `zckpt reshard`: a DeepSpeed checkpoint to another ZeRO stage / world size.
 *
 * SRC is an HDF5 universal container (reshard_universal.c), a universal folder or a
 * folder holding latest_universal (reshard_uvdir.c), a torch Distributed Checkpoint
 * (reshard_from_dcp.c), else a DeepSpeed checkpoint (here).
 * A folder with both `latest` and `latest_universal` (an HF checkpoint-N/ converted in
 * place) is read as the DeepSpeed checkpoint; name the universal folder to use it.
 * Requests the target cannot express are refused before anything is written
 * (reshard_check.c).
 *
 * For a DeepSpeed source the reader describes the source (layouts of fp32, exp_avg, exp_avg_sq, frozen, lp),
 * the writer reserves every file DeepSpeed would write at the target stage and W, and
 * lib/transfer runs the copy plans on one thread pool, in target order, the writer hashing
 * the bytes for the manifest as they go out (formats/deepspeed/ds_hash.c: the manifest
 * does not read the output back). The whole output root (tag folder,
 * `latest`, carried-over Hugging Face files) is built under a temporary name and renamed
 * into place, so a failure leaves nothing.
 *
 * Hugging Face checkpoint-N/ folders: every regular file of the root is carried over
 * except DeepSpeed's own (`latest`, the tag folders) and per-rank RNG states, each checked
 * as far as its format allows as it is copied (side_copy.c).
 * rng_state_<r>.pth is kept for ranks r < W'; ranks >= W' are dropped; new ranks have no
 * RNG file, for which the Trainer warns and goes on with fresh RNG state (reproducible
 * data order is kept by the sampler's seed, not by these files).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "deepspeed/ds_writer.h"
#include "hdf5/zck_h5.h"
#include "manifest.h"
#include "reshard_internal.h"
#include "side_copy.h"
#include "source.h"
#include "transfer.h"
#include "universal/universal.h"

static zck_status zck__same_model(const zck_model *a, const zck_model *b) {
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
  ZCK_TRY(zck__same_model(zck_ds_model(c), w->m));
  zck_state_view src, dst;
  zck_ds_state(c, &src);
  zck_ds_writer_state(w, &dst);
  if (dst.part[ZCK_STATE_EXP_AVG].layout && !src.part[ZCK_STATE_EXP_AVG].layout)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no optimizer state (exp_avg / exp_avg_sq) to copy; create the writer with "
                     "has_optimizer_state = false", src.name);
  zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
  if (opts) to.exec = *opts;
  return zck_transfer(&src, &dst, 1, &to);
}

/* rng_state_<r>.pth with r >= world: not carried over. */
bool zck__reshard_side_kept(const char *name, uint32_t world) {
  unsigned r;
  char tail[8];
  if (sscanf(name, "rng_state_%u.%7s", &r, tail) == 2 && !strcmp(tail, "pth")) return r < world;
  return true;
}

zck_status zck__reshard_carry_side_files(const char *root, const char *tag, const char *dst, uint32_t world) {
  DIR *d = opendir(root);
  if (!d) return ZCK_OK;
  struct dirent *e;
  zck_status st = ZCK_OK;
  while (st == ZCK_OK && (e = readdir(d))) {
    const char *n = e->d_name;
    if (n[0] == '.' || !strcmp(n, "latest") || !strcmp(n, "latest_universal") || !strcmp(n, tag)) continue;
    if (!zck__reshard_side_kept(n, world)) continue;
    char *from = zck__path_join(root, n), *to = zck__path_join(dst, n);
    struct stat sb;
    if (!from || !to) st = ZCK_ERR_NO_MEMORY;
    else if (lstat(from, &sb) == 0 && S_ISREG(sb.st_mode)) st = zck__copy_side_file(from, to);
    free(from);
    free(to);
  }
  closedir(d);
  return st;
}

/* A DeepSpeed source: its own write options, at the requested stage and world size. */
static zck_status zck__reshard_from_ds(const zck__src *s, const char *src, const char *out, const zck_reshard_opts *op) {
  const zck_reshard_opts o = *op;
  const zck_ds_ckpt *c = s->ck;
  const zck_ds_info *in = zck_ds_info_of(c);
  ZCK_TRY(zck_ds_moe_keep_ep(c, o.to_ep_size));   /* deepspeed.moe: the EP size kept (ds_moe_ep.c) */
  if (o.to_ep_size && !in->ep_size)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--to-ep-size: %s is not an AutoEP (expert-parallel) checkpoint", src);
  if (in->stage == 0 && !o.to_stage)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: a ZeRO-0 checkpoint is resharded into a ZeRO stage: pass --to-stage 1, 2 "
                     "or 3", src);
  zck_ds_write_opts wo;
  zck_ds_write_opts_from(c, &wo);
  if (o.to_stage) wo.stage = o.to_stage;
  if (o.to_world_size) wo.world_size = o.to_world_size;
  if (o.sub_group_size) wo.sub_group_size = o.sub_group_size;
  wo.save_latest = true;
  wo.overwrite = false;
  wo.threads = o.threads;
  if (zck_ds_pipe_stages(c) > 1) return zck__reshard_pipe(c, &wo, out, &o);   /* PipelineModule: its stage files */
  /* NVMe offload: DeepSpeed swaps only at ZeRO-3; the swap files are named by the source's ds_ids */
  bool nvme = o.to_offload == ZCK_RESHARD_OFFLOAD_NVME ||
              (o.to_offload == ZCK_RESHARD_OFFLOAD_KEEP && zck_ds_nvme_offloaded(c) && wo.stage == 3);
  if (nvme && wo.stage != 3)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--to-offload nvme: DeepSpeed swaps the optimizer to NVMe at ZeRO-3 only "
                     "(target stage %d)", wo.stage);
  if (nvme && o.to_tp_size > 1)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "--to-offload nvme: not with --to-tp-size");
  if (o.swap_min_bytes && !nvme)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--swap-min-bytes: only for an NVMe-offload target (ZeRO-3)");
  wo.swap_min_bytes = o.swap_min_bytes;
  if (nvme) ZCK_TRY(zck_ds_nvme_target((zck_ds_ckpt *)c, &wo));  /* c caches its ds_id numbering */
  if (in->ep_size && (nvme || o.to_tp_size > 1))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: an AutoEP checkpoint: reshard does not write it with %s", src,
                     nvme ? "NVMe offload" : "--to-tp-size (AutoEP folded with AutoTP)");
  zck_ds_moe_target *moe = NULL;     /* deepspeed.moe: its expert files again (NULL for other checkpoints) */
  ZCK_TRY(zck_ds_moe_target_new(c, wo.stage, &moe));
  if (moe && o.to_tp_size > 1) {
    zck_ds_moe_target_free(moe);
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a deepspeed.moe (expert files) checkpoint: reshard does not write it "
                     "with --to-tp-size", src);
  }
  wo.moe = moe;
  zck_ds_autoep_target *ae = NULL;   /* AutoEP: its own layout at the target's EP size */
  if (in->ep_size) ZCK_TRY(zck_ds_autoep_target_new(c, o.to_ep_size ? o.to_ep_size : in->ep_size, wo.stage,
                                                    wo.world_size, &ae));  /* moe is NULL: never both */
  wo.autoep = ae;
  zck_status st = zck__reshard_check(in->dir, zck_ds_model(c), &wo, in->has_optimizer_state, &o);
  if (st == ZCK_OK && o.to_tp_size > 1) {
    zck_state_view view;
    zck_ds_state(c, &view);
    zck__autotp_src as = {in->dir, &view, zck_ds_model(c), zck_ds_autotp_info(c), in->tp_size, in->root, in->tag, NULL, NULL, NULL};
    st = zck__reshard_autotp(&as, &wo, out, &o);
  }
  if (st != ZCK_OK || o.to_tp_size > 1) {
    zck_ds_autoep_target_free(ae);
    zck_ds_moe_target_free(moe);
    return st;
  }

  zck__outdir d;
  zck_ds_writer *w = NULL;
  st = zck__outdir_create(&d, out, o.overwrite != 0);
  /* the source's rank-0 pickle is not held while the writer builds its files and through
   * the copy (expert, tensor-parallel and NVMe sources keep theirs) */
  if (st == ZCK_OK && !moe && !ae && !nvme && in->tp_size <= 1) st = zck_ds_drop_model_pickle((zck_ds_ckpt *)c, &wo);
  if (st == ZCK_OK) st = zck_ds_writer_create(d.tmp_path, zck_ds_model(c), &wo, &w);
  /* the manifest's hashes are computed from the bytes as the copy writes them */
  if (st == ZCK_OK) zck__ds_writer_hash_inline(w, 0, 0);
  if (st == ZCK_OK) {
    zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
    eo.threads = o.threads;
    eo.progress = o.progress;
    eo.progress_ctx = o.progress_ctx;
    eo.no_verify = o.no_verify != 0;
    st = zck_ds_copy(c, w, &eo);
  }
  if (st == ZCK_OK) st = zck_ds_writer_commit(w);
  if (st == ZCK_OK) st = zck__reshard_carry_side_files(in->root, in->tag, d.tmp_path, wo.world_size);
  if (st == ZCK_OK) {
    /* written last: its presence says the checkpoint is complete, its hashes what it holds */
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.kind = "deepspeed";
    mo.threads = o.threads;
    char *tag_dir = zck__path_join(d.tmp_path, wo.tag);
    st = tag_dir ? zck__manifest_write_dir_known(tag_dir, &mo, zck__ds_writer_known(w, NULL, NULL), NULL)
                 : ZCK_ERR_NO_MEMORY;
    free(tag_dir);
  }
  if (st == ZCK_OK) st = zck__outdir_commit(&d);
  if (st == ZCK_OK) zck__job_summary_fill(o.summary, out, zck_ds_model(c)->n_params);
  zck_ds_writer_free(w);
  zck_ds_autoep_target_free(ae);
  zck_ds_moe_target_free(moe);
  zck__outdir_abort(&d);
  return st;
}

zck_status zck_reshard(const char *src, const char *out, const zck_reshard_opts *opts) {
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  ZCK_TRY(zck__opts_load(&o, sizeof o, opts, "zck_reshard"));
  if (o.to_stage < 0 || o.to_stage > 3 || (o.to_stage == 0 && opts && opts->to_stage))
    return zck__fail(ZCK_ERR_INVALID_ARG, "--to-stage must be 1, 2 or 3");
  if (o.to_world_size > 1u << 20) return zck__fail(ZCK_ERR_INVALID_ARG, "--to-world-size %u is not plausible", o.to_world_size);
  ZCK_TRY(zck_check_out_not_input(src, out, o.tag));
  zck__src_kind kind = zck__src_sniff(src);
  if (o.to_offload == ZCK_RESHARD_OFFLOAD_NVME && (o.to_format != ZCK_RESHARD_TO_DEEPSPEED || kind != ZCK__SRC_DEEPSPEED))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "--to-offload nvme: written from a DeepSpeed ZeRO-3 checkpoint into DeepSpeed "
                     "files (the swap files are named by its parameter numbering); %s is not one", src);
  if (o.to_ep_size && (kind != ZCK__SRC_DEEPSPEED || o.to_format != ZCK_RESHARD_TO_DEEPSPEED))
    return zck__fail(ZCK_ERR_INVALID_ARG, "--to-ep-size: a DeepSpeed AutoEP checkpoint into DeepSpeed files only; %s is "
                     "not resharded so", src);
  if (o.to_format == ZCK_RESHARD_TO_DCP || o.to_format == ZCK_RESHARD_TO_DCP_ACCELERATE)
    return zck__reshard_to_dcp(src, kind, out, &o);
  if (o.to_format != ZCK_RESHARD_TO_DEEPSPEED) return zck__fail(ZCK_ERR_INVALID_ARG, "to_format %d: unknown", (int)o.to_format);
  if (o.to_dtype != ZCK_DTYPE_INVALID && kind != ZCK__SRC_DCP)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--to-dtype: only for a torch Distributed Checkpoint (%s keeps its run's dtype)",
                     src);
  if (o.to_dtype != ZCK_DTYPE_INVALID && o.to_dtype != ZCK_BF16 && o.to_dtype != ZCK_F16 && o.to_dtype != ZCK_F32)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--to-dtype must be fp32, bf16 or fp16");
  if (kind == ZCK__SRC_DCP && o.tag)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a torch Distributed Checkpoint, which has no tags", src);
  if (kind == ZCK__SRC_HDF5 && o.tag)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a universal container, which has no tags", src);
  if (kind == ZCK__SRC_UNIVERSAL && o.tag)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a universal checkpoint; give its folder instead of a tag", src);
  zck__src_opts so = ZCK__SRC_OPTS_INIT;
  so.reads = ZCK__SRC_BIT(ZCK__SRC_DEEPSPEED) | ZCK__SRC_BIT(ZCK__SRC_UNIVERSAL) | ZCK__SRC_BIT(ZCK__SRC_HDF5) |
             ZCK__SRC_BIT(ZCK__SRC_DCP);
  so.tag = o.tag;
  so.threads = o.threads;
  so.force = o.force != 0;
  so.check_complete = true;   /* a universal folder's completeness is not checked (as before) */
  so.no_verify = o.no_verify != 0;
  so.autoep_ds_names = true;   /* AutoEP: written again under DeepSpeed's names (experts.w1 / w2 / w3) */
  zck__src s;
  ZCK_TRY(zck__src_open(&s, src, kind, &so));
  zck_status st;
  switch (s.kind) {
  case ZCK__SRC_HDF5:
    st = zck_h5u_moe_refuse(s.h5, "reshard");
    if (st == ZCK_OK) st = zck__reshard_from_h5(&s, out, &o);
    break;
  case ZCK__SRC_UNIVERSAL:
    st = zck_uv_autoep_refuse(s.uv, "reshard");
    if (st == ZCK_OK) st = zck__reshard_from_universal(&s, out, &o);
    break;
  case ZCK__SRC_DCP: st = zck__reshard_from_dcp(&s, out, &o); break;
  default: st = zck__reshard_from_ds(&s, src, out, &o); break;
  }
  zck__src_close(&s);
  return st;
}

