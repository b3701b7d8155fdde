/* uv_internal.h: what the universal reader's files share (uv_read.c opens the folder and
 * its per-parameter files, uv_manifest.c builds the manifest from the model-states file). */
#ifndef ZCK_UV_INTERNAL_H
#define ZCK_UV_INTERNAL_H

#include <stdatomic.h>

#include "deepspeed/deepspeed.h"
#include "universal/universal.h"

/* A tensor read in place by reopening its file for each read (a model has thousands of
 * per-parameter files; none is kept open). */
typedef struct zck__uv_piece {
  uint64_t lo, hi;
  uint32_t crc;
} zck__uv_piece;

typedef struct zck__uv_tstore {
  char *path;
  uint64_t base;               /* absolute byte offset of element 0 */
  size_t es;
  uint64_t numel;
  /* verify on read: the tensor's zip record and the CRCs of the pieces read so far; once
   * they cover the tensor, the rest of the record is read and the whole compared */
  bool has_rec;
  zck_record_check rec;
  atomic_flag lock;
  zck__uv_piece *got;
  size_t n_got, cap_got;
  uint64_t covered;
  bool done;
  /* where the folder has zckpt's manifest: the XXH3-64 it lists for the tensor's bytes
   * (uv_expect.c). Pieces read front to back feed the hash as they come; once the tensor is
   * covered, a hash that missed some (pieces read out of order) reads the tensor again */
  bool has_xxh3;
  uint64_t xxh3;
  void *hash_state;            /* XXH3_state_t, while pieces come in order */
  uint64_t hashed_to;          /* absolute offset the hash state has reached */
  char *what;                  /* owned label for aux stores ("module['x']"), or NULL */
} zck__uv_tstore;

/* A tensor of a model-states file: where its bytes are. */
typedef struct zck__uv_tref {
  const char *name;            /* borrowed from the pickle */
  zck_dtype dtype;
  int ndim;
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t numel;
  uint64_t offset;
  bool contiguous;
  bool has_rec;                /* its zip record (zck_torch_tensor_record) */
  zck_record_check rec;
} zck__uv_tref;

struct zck_uv_ckpt {
  zck_uv_info info;
  char *dir, *root, *ds_version;
  zck_torch_file *model0;      /* rank-0 model-states file, kept open (pickled objects) */
  zck_torch_file *optim;       /* zero/optimizer_state.pt, kept open */
  const zck_pk *param_groups;  /* optimizer_state.pt param_groups */
  zck_model *m;
  zck__uv_tref *module;        /* model0's `module` tensors, in order */
  size_t n_module;
  int64_t *param_mod;          /* [n_params]: index into module, -1 if none */
  int64_t *buffer_mod;         /* [n_buffers] */
  uint32_t *flat;              /* trainable params in param_shapes (flat) order */
  size_t n_flat;
  /* parts */
  zck_layout *layout;          /* trainable params with elements, whole */
  zck_store *stores[3];
  zck__uv_tstore *ts[3];
  size_t n_stores;
  zck_layout *frozen_layout, *buffer_layout;
  zck_store *frozen_stores, *buffer_stores;
  zck__uv_tstore *aux;         /* contexts of the frozen and buffer stores */
  size_t n_aux, cap_aux;
  const char **unsaved_pairs;  /* alias, source of shared_params entries whose source was not saved */
  size_t n_unsaved;
  bool frozen_excluded;        /* stage 2/3 model file with frozen_param_shapes None */
  bool no_verify;              /* open option: stores check nothing they read */
  zck_ds_output *outputs;      /* zero_to_fp32's recipe (uv_outputs.c) */
  size_t n_outputs;
  struct zck__uv_autoep *autoep;   /* uv_autoep.c: a DeepSpeed AutoEP source's layers, NULL: none */
  bool legacy_moe;             /* uv_moe.c: a deepspeed.moe source, its experts added to module */
  struct zck__uv_pipe *pipe;   /* uv_pipe.c: a PipelineModule source's stage files, NULL: none */
  const zck_torch_open_opts *topts;   /* the open's options for the files the manifest opens; NULL after it */
};

zck_status zck__uv_tstore_read(void *ctx, void *dst, uint64_t off, uint64_t count);
void zck__uv_tstore_free(zck__uv_tstore *t);
/* uv_expect.c: the manifest's XXH3 of each tensor the stores read, where the folder has
 * zckpt-manifest.json (none, or unreadable: the completeness check's business). */
zck_status zck__uv_expect_manifest(zck_uv_ckpt *c);

/* uv_manifest.c: from model0 and param_groups (c->info.stage, world_size, round_robin set):
 * c->m, c->module, c->param_mod, c->buffer_mod, c->flat, info counters and ds_version. */
zck_status zck__uv_build_manifest(zck_uv_ckpt *c);
/* uv_autotp.c: mp_world_size (info.tp_size) > 1: the params' full shapes from the rank-0
 * model file's universal_checkpoint_info['affine_map'] (AutoTP), after the manifest. */
zck_status zck__uv_autotp(zck_uv_ckpt *c);
/* uv_autoep.c: a DeepSpeed AutoEP source (model0's universal_checkpoint_info['ds_autoep_layers']): c->module
 * rewritten as the DeepSpeed reader lays AutoEP out (router alias dropped, expert params after their router at
 * full shape), c->autoep and info.ep_size set; nothing for other folders. zck__uv_autoep_mult: an expert param's
 * EP size (its param_shapes entry is one rank's experts), 0 for other names. */
zck_status zck__uv_autoep_module(zck_uv_ckpt *c, const zck_pk *root);
int64_t zck__uv_autoep_mult(const zck_uv_ckpt *c, const char *name);
void zck__uv_autoep_free(struct zck__uv_autoep *a);
/* uv_moe.c: a legacy deepspeed.moe source (param_shapes names experts `module` lacks): c->module gains them
 * as the DeepSpeed reader lays them out (ds_moe.c), c->legacy_moe set; nothing for other folders. */
zck_status zck__uv_moe_module(zck_uv_ckpt *c, const zck_pk *root);
/* Refused by the jobs that write DeepSpeed files (through zck_uv_autoep_refuse): the writer of the expert files
 * reads the DeepSpeed checkpoint's own file set. */
zck_status zck__uv_moe_refuse(const zck_uv_ckpt *c, const char *job);
/* uv_pipe.c: model0's module is None (a PipelineModule source): the other stages' model files opened and checked,
 * *shapes and c->param_groups set to every stage's flat groups in stage order (each stage given stage 0's groups),
 * c->module to every param (no bytes), info.tp_size to 1, c->pipe set. zck__uv_pipe_refuse: for the jobs that write
 * DeepSpeed files (through zck_uv_autoep_refuse). */
zck_status zck__uv_pipe_open(zck_uv_ckpt *c, const zck_pk *root, const zck_pk **shapes);
zck_status zck__uv_pipe_refuse(const zck_uv_ckpt *c, const char *job);
void zck__uv_pipe_free(struct zck__uv_pipe *p);
/* uv_manifest.c: the frozen-parameter part and the buffers (after the manifest). */
zck_status zck__uv_build_frozen(zck_uv_ckpt *c, const zck_torch_open_opts *topts);
/* uv_identity.c: opens a .pt of the folder and refuses it when its archive name says it is
 * a copy of another file of the folder (another state of a param, another rank's model
 * file). zck__uv_check_identity is the check alone, for a file already open. */
zck_status zck__uv_torch_open(const char *path, const zck_torch_open_opts *opts, zck_torch_file **out);
zck_status zck__uv_check_identity(const zck_torch_file *f, const char *path);
zck_status zck__uv_build_buffers(zck_uv_ckpt *c);
/* uv_coherence.c: each trainable param's fp32.pt against its 16-bit copy in the model-states file (a ZeRO-1/2
 * source): an fp32.pt of another step is refused. params: the param of each store, in store order. */
zck_status zck__uv_check_masters(const zck_uv_ckpt *c, const uint32_t *params);
/* uv_outputs.c: c->outputs, after the frozen params and buffers. */
zck_status zck__uv_build_outputs(zck_uv_ckpt *c);

#endif
