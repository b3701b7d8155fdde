/* ds_writer.h: the writer's internals, shared by ds_write.c (layout of the files),
 * ds_write_tree.c (the pickled objects) and ds_state.c (the reserved target as a state
 * view). Each file's manifest hashes are made as it is written by a lib stream hasher
 * (stream_hash.h) that the file's zip writer tells its layout, and that the target stores
 * feed with the bytes they write. */
#ifndef ZCK_DS_WRITER_H
#define ZCK_DS_WRITER_H

#include "ds_internal.h"

#include "manifest.h"
#include "stream_hash.h"

#include <pthread.h>
#include <stdatomic.h>

/* One reserved tensor region that callers fill: a storage of a torch writer. Written
 * ranges are recorded with their CRC-32 so the entry CRC is assembled at commit. */
typedef struct zck__ds_wrange {
  uint64_t off, len;        /* bytes */
  uint32_t crc;
} zck__ds_wrange;

typedef struct zck__ds_wstore {
  zck_torch_writer *tw;
  size_t storage;
  zck_dtype dtype;
  uint64_t numel;
  const char *name;         /* for messages */
  pthread_mutex_t mu;
  zck__shash *hf;           /* its file's hashes */
  uint64_t base;            /* the storage's data offset in its file */
  zck__ds_wrange *ranges;
  size_t n_ranges, cap_ranges;
  bool oom;
} zck__ds_wstore;

/* A file's tensors as its manifest entry lists them (zck__manifest_known_file.tensors),
 * named from its tree before the tree is freed; not described: the manifest reads it. */
typedef struct zck__ds_wdesc {
  bool described;
  zck__manifest_known_tensor *t;   /* names are owned (malloc'd), shapes point into dims */
  size_t n;
  int64_t *dims;
} zck__ds_wdesc;

struct zck_ds_writer {
  const zck_model *m;
  zck_ds_write_opts o;
  char *tag, *ds_version, *root;
  zck_dtype lp;
  uint32_t w;
  int stage;
  uint64_t sub_group_size;
  zck__outdir dir;                  /* full writer: the temporary tag folder */
  char *fdir;                       /* where the files are created: dir.tmp_path, or
                                       (rank-only) <root>/<tag> itself */
  const char *shown;                /* the tag folder in messages: dir.path or fdir */
  bool rank_only;                   /* builds rank `only`'s files alone */
  bool joined;                      /* another TP rank's files in a lead writer's folder */
  uint32_t only;
  bool committed;
  /* geometry (lib/layout's, owned by geo; the fields below point into it) */
  zck_zero_geometry geo;
  zck_layout *train, *lp_layout, *frozen_layout, *buffer_layout;
  zck_group_spec *flat;             /* flat groups (stage 1/2) or sub-groups (stage 3) */
  size_t n_flat;
  uint32_t *frozen;                 /* frozen owner params */
  size_t n_frozen;
  uint32_t *owners;                 /* non-alias params (stage 1/2 LP stores) */
  size_t n_owners;
  /* files: their trees are pickled and freed as soon as they are built (zck__ds_seal_file) */
  uint32_t n_models;
  zck_torch_writer **model_w, **optim_w;
  zck__ds_wdesc *model_desc, *optim_desc;
  /* target stores (files are built on several threads: mu guards ws and names) */
  pthread_mutex_t mu;
  zck__ds_wstore **ws;              /* all of them (stable addresses: callback contexts) */
  size_t n_ws, cap_ws;
  char **names;                     /* store names for messages */
  size_t n_names, cap_names;
  zck_store *stores[ZCK_DS_PART_COUNT];
  size_t n_stores[ZCK_DS_PART_COUNT];
  zck_store *buffer_stores;         /* [n_models * n_buffers] */
  /* manifest hashes while writing (zck__ds_writer_hash_inline) */
  zck__shash **model_h, **optim_h;
  bool hash_want, hash_started;
  uint64_t hash_chunk;
  zck__shash_budget budget;
  uint64_t hash_streamed, hash_reread;
  zck__manifest_known known;
  zck_manifest_layout known_layout; /* known.layout: the tag folder's layout as written, so
                                       the manifest writer need not open the folder again */
  /* AutoEP target (ds_autoep_write.c; o.autoep): the experts' flat group laid out per EP rank, their 16-bit
   * weights in layer_<L>_expert_<E> files */
  zck_layout *ae_train;             /* owns w->train when set */
  int32_t *ae_layer;                /* [n_params]: an expert param's layer (index in the source's records), else -1 */
  size_t ae_group, ae_n_groups;     /* the experts' flat groups (stage 3: consecutive sub-groups) */
  size_t *lp_first;                 /* [n_params]: the param's first LP store (an expert param has one per expert) */
  size_t n_expert_files;            /* layers x experts */
  zck_torch_writer **expert_w;
  const int32_t *moe_file;          /* legacy deepspeed.moe target (ds_moe_write.c; o.moe): [n_params] the expert file
                                       of an expert param (its 16-bit weight goes there, not to `module`), else -1 */
  /* ... with ep_size E > 1 (ds_moe_write.c): the experts' flat group moe_group laid out per EP rank (moe_train owns
   * w->train); moe_other_ep[p]: an expert of EP rank e > 0, absent from param_shapes, param_slice_mappings and the
   * paddings, which list EP rank 0's experts (their names are the local names every EP rank uses); moe_pos: the
   * layout's [E * local] positions in the group */
  uint32_t moe_ep;
  size_t moe_group;
  zck_layout *moe_train;
  bool *moe_other_ep;
  uint32_t *moe_pos;
  /* NVMe-offload target (ds_write_offload.c): the swap files (mu guards them) */
  struct zck__ds_swapfile **swap;
  size_t n_swap, cap_swap;
};

/* Asks w to compute the manifest hashes of its files while a transfer writes them
 * (chunk_size: the manifest's; budget_bytes: memory for pieces written ahead of a file's
 * hash cursor, over all files; 0: 64 MiB). The copy then plans in target order. After
 * zck_ds_writer_commit, zck__ds_writer_known() gives them for zck__manifest_write_dir_known
 * (files whose hashes could not be computed are absent: the manifest writer reads those). */
void zck__ds_writer_hash_inline(zck_ds_writer *w, uint64_t chunk_size, uint64_t budget_bytes);
/* Valid until zck_ds_writer_free; file paths are relative to the tag folder. streamed /
 * reread (optional): bytes hashed from memory / read back at commit. */
const zck__manifest_known *zck__ds_writer_known(const zck_ds_writer *w, uint64_t *streamed, uint64_t *reread);

/* ds_write.c: a torch storage of file `hf` (NULL: none); known: its bytes when already
 * written (the step scalar), else NULL. */
zck_status zck__ds_add_storage(zck_torch_writer *tw, zck__shash *hf, zck_dtype dt, uint64_t numel, const void *known,
                               size_t *idx, uint64_t *off);
/* The writer's store behind a target store (NULL if st is not one). */
zck__ds_wstore *zck__ds_wstore_of(const zck_store *st);

/* Starts the hash streams (ds_state.c, after zck__shash_cover of what the plans write). */
zck_status zck__ds_writer_hash_start(zck_ds_writer *w);

/* ds_write_tree.c: builds the model-states and optimizer-states trees of rank r,
 * reserving storages and registering target stores. */
zck_status zck__ds_build_model_file(zck_ds_writer *w, uint32_t r);
zck_status zck__ds_build_optim_file(zck_ds_writer *w, uint32_t r);
/* ds_write.c: names root's tensors into *d (see zck__ds_wdesc), then pickles root and frees
 * the tree (zck_torch_writer_seal). */
zck_status zck__ds_seal_file(zck_torch_writer *tw, const zck_pk *root, zck__ds_wdesc *d);
/* Registers a target store for storage `storage` of tw (its data at file offset off);
 * *out receives its callback store. */
zck_status zck__ds_add_wstore(zck_ds_writer *w, zck_torch_writer *tw, zck__shash *hf, size_t storage, uint64_t off,
                              zck_dtype dt, uint64_t numel, const char *name, zck_store *out);

/* ds_autoep_write.c (w->o.autoep set): the layouts (train; LP at stage 1/2) of an AutoEP target, called by build_geometry after
 * the ZeRO geometry; the local numel of param p in its flat group (an expert param's numel / E); the index of rank
 * r in flat group g's partition group (its expert-data-parallel rank in the experts' group); the expert file i
 * (layer-major); module's router alias after param p, if p is a router (else NULL, nothing written); the model
 * file's AutoEP entries (num_experts, ds_autoep_layers, universal_checkpoint_info) of rank r appended to root. */
zck_status zck__ds_autoep_geometry(zck_ds_writer *w);
uint32_t zck__ds_autoep_ep_size(const zck_ds_writer *w);
uint64_t zck__ds_flat_numel(const zck_ds_writer *w, uint32_t p);
uint32_t zck__ds_flat_rank(const zck_ds_writer *w, size_t g, uint32_t r);
uint32_t zck__ds_flat_count(const zck_ds_writer *w, size_t g);
zck_status zck__ds_build_expert_file(zck_ds_writer *w, size_t i);
/* The steps of an expert file, shared by the AutoEP and deepspeed.moe writers: its writer created at fdir/name into
 * w->expert_w[i] (*path: the caller frees it, also on failure) with an empty root dict; one 16-bit tensor of numel
 * elements under key, its storage reserved and its target store registered into *out. */
zck_status zck__ds_expert_file_open(zck_ds_writer *w, size_t i, const char *name, char **path, zck_pk **root);
zck_status zck__ds_expert_tensor(zck_ds_writer *w, size_t i, zck_pk *root, const char *key, const char *label,
                                 uint64_t numel, int ndim, const int64_t *shape, zck_store *out);
const char *zck__ds_autoep_alias(const zck_ds_writer *w, uint32_t p, char *buf, size_t cap);
bool zck__ds_autoep_model_extras(zck_ds_writer *w, zck_pk_doc *d, zck_pk *root, uint32_t r);
/* Stage 3: the optimizer file's ds_zero_partition_groups of rank r. */
zck_pk *zck__ds_autoep_partition_groups(const zck_ds_writer *w, zck_pk_doc *d, uint32_t r);
/* The name of optimizer group g in the target (AutoEP's expert group is named by its EP size), or NULL: kept. */
const char *zck__ds_autoep_group_name(const zck_ds_writer *w, size_t g, char *buf, size_t cap);

/* ds_moe_write.c (w->o.moe set): the experts' files (lp_first: each owner's LP store), called by build_geometry after
 * the plain ZeRO geometry; expert file i (layer-major); the model file's num_experts and ds_autoep_layers (None). */
zck_status zck__ds_moe_geometry(zck_ds_writer *w);
zck_status zck__ds_moe_build_expert_file(zck_ds_writer *w, size_t i);
bool zck__ds_moe_model_extras(zck_ds_writer *w, zck_pk_doc *d, zck_pk *root);

/* ds_write_offload.c: whether sub-group g of rank r goes to swap files (o.nvme_offload); creates
 * them, binding the sub-group's fp32 / exp_avg / exp_avg_sq target stores to them; commit /
 * free them with the writer. */
bool zck__ds_write_swapped(const zck_ds_writer *w, uint32_t r, size_t g);
zck_status zck__ds_write_swap_dir(zck_ds_writer *w, uint32_t r);
zck_status zck__ds_write_swap_check(const zck_ds_writer *w, uint32_t r);
zck_status zck__ds_write_swap_files(zck_ds_writer *w, uint32_t r, size_t g);
zck_status zck__ds_write_swap_commit(zck_ds_writer *w);
void zck__ds_write_swap_free(zck_ds_writer *w);

#endif
