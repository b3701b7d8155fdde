/* source.c: the one place a job's input path is sniffed and opened (source.h).
 *
 * A DeepSpeed checkpoint is described by the DeepSpeed reader; a universal folder in
 * DeepSpeed's layout (ds_to_universal.py's, or `zckpt to-universal`'s) by the universal
 * reader, and zckpt's HDF5 container by its own: each as the state view a reshard from it
 * reads (reshard_uvdir.c, reshard_universal.c) and zero_to_fp32's recipe for the checkpoint
 * it was made from (uv_outputs.c, h5_outputs.c), so consolidate writes the same output from
 * any of them. Every byte read is checked as for a reshard: the zip CRC-32 of each record
 * of the folder's .pt files, and, where the folder has zckpt's manifest, the XXH3 it lists
 * for each file read; the container's chunks carry their zstd checksums, its root
 * attributes their digest. */
#include "source.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dcp/dcp.h"
#include "hdf5/zck_h5.h"
#include "io.h"
#include "reshard_internal.h"
#include "side_copy.h"
#include "universal/universal.h"

// ---- sniffing

static bool zck__src_is_dir(const char *p) { struct stat sb; return stat(p, &sb) == 0 && S_ISDIR(sb.st_mode); }

/* dir/name exists: any (want 0), a folder (S_IFDIR) or a regular file (S_IFREG). */
static bool zck__src_has(const char *dir, const char *name, mode_t want) {
  char *p = zck__path_join(dir, name);
  struct stat sb;
  bool yes = p && stat(p, &sb) == 0 && (!want || (sb.st_mode & S_IFMT) == want);
  free(p);
  return yes;
}

static bool zck__src_ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

static zck__src_kind zck__src_sniff_dir(const char *path) {
  /* a folder with both `latest` and latest_universal (an HF checkpoint-N/ converted in
   * place) is the DeepSpeed checkpoint: name the universal folder to read that */
  if (zck__src_has(path, "zero", S_IFDIR) ||
      (!zck__src_has(path, "latest", S_IFREG) && zck__src_has(path, "latest_universal", S_IFREG)))
    return ZCK__SRC_UNIVERSAL;
  if (zck__src_has(path, "latest", 0) || zck__src_has(path, "latest_universal", 0) ||
      zck__src_has(path, "mp_rank_00_model_states.pt", 0) ||
      zck__src_has(path, "zero_pp_rank_0_mp_rank_00_model_states.pt", 0))
    return ZCK__SRC_DEEPSPEED;
  if (zck__src_has(path, "model.safetensors", 0) || zck__src_has(path, "model.safetensors.index.json", 0))
    return ZCK__SRC_HF;
  if (zck_dcp_is_checkpoint(path)) return ZCK__SRC_DCP;
  return ZCK__SRC_NONE;
}

/* Accelerate's per-rank FSDP model files (accelerate.utils.fsdp_utils.save_fsdp_model). */
#define ZCK__FSDP_LOCAL_RANK0 "pytorch_model_fsdp_rank0.bin"
#define ZCK__FSDP_NODCP_RANK0 "pytorch_model_fsdp_0_rank0.bin"

zck_status zck__src_refuse_known(const char *path) {
  const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
  bool dir = zck__src_is_dir(path);
  bool local = dir ? zck__src_has(path, ZCK__FSDP_LOCAL_RANK0, S_IFREG)
                   : !strncmp(base, "pytorch_model_fsdp_rank", 23) && zck__src_ends_with(base, ".bin");
  bool nodcp = dir ? zck__src_has(path, ZCK__FSDP_NODCP_RANK0, S_IFREG)
                   : !strncmp(base, "pytorch_model_fsdp_0_rank", 25) && zck__src_ends_with(base, ".bin");
  /* FSDP1's local state dict is each rank's padded shard of every wrapped unit's flat
   * parameter: where one tensor ends and the next begins is in the wrapped model, not the files */
  if (local)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: an FSDP1 LOCAL_STATE_DICT save (pytorch_model_fsdp_rank<r>.bin: each "
                     "rank's padded flat-parameter shards, without the layout that splits them into tensors): not "
                     "supported; save with state_dict_type SHARDED_STATE_DICT or FULL_STATE_DICT", path);
  if (nodcp)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: Accelerate's per-rank sharded save without DCP (use_dcp=False: "
                     "pytorch_model_fsdp_0_rank<r>.bin, ShardedTensor pickles): not supported; save with use_dcp=True "
                     "(the default)", path);
  return ZCK_OK;
}

zck__src_kind zck__src_sniff(const char *path) {
  if (zck__src_is_dir(path)) return zck__src_sniff_dir(path);
  if (zck__src_ends_with(path, ".index.json")) return ZCK__SRC_HF;
  zck__source f;
  if (zck__source_open(&f, path) != ZCK_OK) {
    zck_clear_error();
    return ZCK__SRC_NONE;
  }
  uint8_t head[9] = {0};
  size_t n = f.size < sizeof head ? (size_t)f.size : sizeof head;
  zck__src_kind kind = ZCK__SRC_NONE;
  if (n >= 4 && zck__source_read(&f, head, n, 0) == ZCK_OK) {
    if (n >= 8 && !memcmp(head, "\211HDF\r\n\032\n", 8)) kind = ZCK__SRC_HDF5;
    else if (head[0] == 'P' && head[1] == 'K') kind = ZCK__SRC_TORCH;
    /* the JSON header, which may start with spaces (ST-16: padded headers load in safetensors) */
    else if (n >= 9 && (head[8] == '{' || head[8] == ' ')) kind = ZCK__SRC_SAFETENSORS;
    else if (head[0] == 0x80) kind = ZCK__SRC_TORCH; /* legacy pickle: the torch reader explains */
  }
  zck__source_close(&f);
  zck_clear_error();
  return kind;
}

// ---- opening: one arm per describer

static zck_status zck__src_open_deepspeed(zck__src *s, const char *path, const zck__src_opts *o) {
  zck_ds_open_opts dopts = ZCK_DS_OPEN_OPTS_INIT;
  dopts.tag = o->tag;
  dopts.threads = o->threads;
  dopts.require_optimizer_state = o->require_optimizer_state;
  dopts.autoep_ds_names = o->autoep_ds_names;
  ZCK_TRY(zck_ds_open(path, &dopts, &s->ck));
  /* a zckpt-written checkpoint without its manifest was never completed */
  if (o->check_complete) ZCK_TRY(zck_ds_check_complete(s->ck, o->force));
  s->dir = zck_ds_info_of(s->ck)->dir;
  s->m = zck_ds_model(s->ck);
  zck_ds_state(s->ck, &s->view);
  s->outs = zck_ds_outputs(s->ck, &s->n_outs);
  size_t n = zck_ds_unsaved_tie_count(s->ck);
  if (!(s->own_unsaved = zck__calloc(2 * n + 1, sizeof *s->own_unsaved))) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < n; i++) zck_ds_unsaved_tie(s->ck, i, &s->own_unsaved[2 * i], &s->own_unsaved[2 * i + 1]);
  s->unsaved = s->own_unsaved;
  s->n_unsaved = n;
  return ZCK_OK;
}

static zck_status zck__src_open_universal(zck__src *s, const char *path, const zck__src_opts *o) {
  zck_uv_open_opts uo = ZCK_UV_OPEN_OPTS_INIT;
  uo.no_verify = o->no_verify;
  ZCK_TRY(zck_uv_open(path, &uo, &s->uv));
  const zck_uv_info *in = zck_uv_info_of(s->uv);
  s->dir = in->dir;
  /* a folder zckpt wrote gets its manifest last: without it, it was never completed */
  if (o->check_complete_universal) ZCK_TRY(zck_manifest_check_complete(in->dir, o->force));
  s->m = zck_uv_model(s->uv);
  zck__whole_src w;
  zck__whole_src_uv(s->uv, &w);
  zck__whole_state(&w, &s->view);
  s->outs = (const zck_ds_output *)zck_uv_outputs(s->uv, &s->n_outs);
  s->unsaved = zck_uv_unsaved_ties(s->uv, &s->n_unsaved);
  return ZCK_OK;
}

static zck_status zck__src_open_hdf5(zck__src *s, const char *path, const zck__src_opts *o) {
  zck_status st = zck_h5u_open(path, &s->h5);
  if (st != ZCK_OK)   /* the container's own messages name the file; the manifest builder's do not */
    return strstr(zck_last_error(), path) ? st : zck__error_prepend(st, "%s", path);
  s->dir = path;
  s->m = zck_h5u_model(s->h5);
  zck__whole_src w;
  bool have[ZCK_H5U_PART_COUNT];
  zck__whole_src_h5(s->h5, path, &w, have);
  zck__whole_state(&w, &s->view);
  if (o->recipe) {
    ZCK_TRY(zck_h5u_outputs(s->h5, (struct zck_ds_output **)&s->own_outs, &s->n_outs));
    s->outs = s->own_outs;
  }
  const zck_h5u_info *in = zck_h5u_info_of(s->h5);
  s->unsaved = in->unsaved_ties;
  s->n_unsaved = in->n_unsaved_ties;
  return ZCK_OK;
}

/* A torch Distributed Checkpoint: its chunks are the stores, its model.<fqn> tensors the
 * recipe (dcp_to_torch_save's entries, in their stored dtype); it records no ties. */
static zck_status zck__src_open_dcp(zck__src *s, const char *path, const zck__src_opts *o) {
  (void)o;
  ZCK_TRY(zck_dcp_open(path, NULL, &s->dcp));
  s->dir = zck_dcp_info_of(s->dcp)->dir;
  s->m = zck_dcp_model(s->dcp);
  zck_dcp_state(s->dcp, &s->view);
  s->outs = zck_dcp_outputs(s->dcp, &s->n_outs);
  return ZCK_OK;
}

zck_status zck__src_open(zck__src *s, const char *path, zck__src_kind kind, const zck__src_opts *o) {
  memset(s, 0, sizeof *s);
  if (kind == ZCK__SRC_DCP && !(o->reads & ZCK__SRC_BIT(kind)))   /* not "not a DeepSpeed checkpoint": say what it is */
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a torch Distributed Checkpoint, which this job does not read yet "
                     "(consolidate, verify and inspect do)", path);
  if (kind == ZCK__SRC_NONE) ZCK_TRY(zck__src_refuse_known(path));
  if (!(o->reads & ZCK__SRC_BIT(kind))) kind = ZCK__SRC_DEEPSPEED; /* its reader says why it is not one */
  s->kind = kind;
  zck_status st;
  switch (kind) {
  case ZCK__SRC_UNIVERSAL: st = zck__src_open_universal(s, path, o); break;
  case ZCK__SRC_HDF5: st = zck__src_open_hdf5(s, path, o); break;
  case ZCK__SRC_DCP: st = zck__src_open_dcp(s, path, o); break;
  case ZCK__SRC_DEEPSPEED:
  default: st = zck__src_open_deepspeed(s, path, o); break;
  }
  if (st != ZCK_OK) zck__src_close(s);
  return st;
}

void zck__src_close(zck__src *s) {
  zck_ds_close(s->ck);
  zck_uv_close(s->uv);
  zck_h5u_close(s->h5);
  zck_dcp_close(s->dcp);
  free(s->own_outs);
  free(s->own_unsaved);
  memset(s, 0, sizeof *s);
}

// ---- side files an output folder takes along

/* Side files of an HF checkpoint-N/ folder that make the output loadable on its own; one that is there but is not
 * JSON fails the job (the output would take damaged bytes along). */
static zck_status zck__src_folder_side_files(const char *root, char ***names, char ***texts, size_t *n) {
  static const char *candidates[] = {"config.json", "generation_config.json"};
  zck_status st = ZCK_OK;
  for (size_t i = 0; st == ZCK_OK && i < sizeof candidates / sizeof candidates[0]; i++) {
    char *p = zck__path_join(root, candidates[i]);
    char *text = NULL;
    size_t len = 0;
    if (p && zck__read_small_file(p, 1 << 20, &text, &len) == ZCK_OK && (st = zck__json_check(p, text, len)) == ZCK_OK) {
      char **nn = realloc(*names, (*n + 1) * sizeof *nn);
      char **tt = realloc(*texts, (*n + 1) * sizeof *tt);
      if (nn) *names = nn;
      if (tt) *texts = tt;
      if (nn && tt) {
        nn[*n] = strdup(candidates[i]);
        tt[*n] = text;
        (*n)++;
        text = NULL;
      }
    }
    free(text);
    free(p);
  }
  if (st == ZCK_OK) zck_clear_error();
  return st;
}

/* A side file of the container (/side_files/NAME), as one from a folder: at most 1 MiB,
 * else left out (so is one that is not 1-d uint8). One that cannot be read (damaged, or
 * not the bytes written there: the checksum table) fails the job: the output would
 * silently lack it. */
static zck_status zck__src_h5_side(const zck__src *s, const char *name, char ***names, char ***texts, size_t *n) {
  zck_h5_file *f = zck_h5u_file(s->h5);
  char *p = zck__sprintf("%s/%s", ZCK_H5U_SIDE_FILES, name);
  zck_h5_dataset *d = NULL;
  char *text = NULL;
  zck_status st = p ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (p && zck_h5_exists(f, p) && (st = zck_h5_dataset_open(f, p, &d)) == ZCK_OK) {
    const zck_h5_dataset_info *di = zck_h5_dataset_info_of(d);
    if (di->ndim == 1 && (di->dtype == ZCK_U8 || di->dtype == ZCK_I8) && di->numel <= (1u << 20)) {
      if (!(text = zck__malloc((size_t)di->numel + 1))) st = ZCK_ERR_NO_MEMORY;
      else st = zck_h5_dataset_read(d, text, 0, di->numel);
    }
  }
  if (st == ZCK_OK && text) {
    text[zck_h5_dataset_info_of(d)->numel] = 0;
    char **nn = realloc(*names, (*n + 1) * sizeof *nn);
    char **tt = realloc(*texts, (*n + 1) * sizeof *tt);
    if (nn) *names = nn;
    if (tt) *texts = tt;
    if (nn && tt && (nn[*n] = zck__strdup(name))) {
      tt[*n] = text;
      (*n)++;
      text = NULL;
    } else {
      st = ZCK_ERR_NO_MEMORY;
    }
  }
  zck_h5_dataset_close(d);
  free(text);
  free(p);
  return st;
}

zck_status zck__src_side_files(const zck__src *s, char ***names, char ***texts, size_t *n) {
  if (s->ck) return zck__src_folder_side_files(zck_ds_info_of(s->ck)->root, names, texts, n);
  else if (s->uv && zck_uv_info_of(s->uv)->root) return zck__src_folder_side_files(zck_uv_info_of(s->uv)->root, names, texts, n);
  else if (s->h5) {
    ZCK_TRY(zck__src_h5_side(s, "config.json", names, texts, n));
    ZCK_TRY(zck__src_h5_side(s, "generation_config.json", names, texts, n));
  }
  return ZCK_OK;
}
