/* ds_files.h: finding a DeepSpeed checkpoint on disk (internal to formats/deepspeed).
 *
 * Resolves what the user pointed at (the save root with `latest`, an HF `checkpoint-N/`
 * folder, which is such a root, or a tag folder directly) to one tag folder, and sorts
 * that folder's files by their exact DeepSpeed names (deepspeed-checkpoint.md §1.2):
 *   mp_rank_{mp:02d}_model_states.pt                         stage 0-2 model states
 *   zero_pp_rank_{dp}_mp_rank_{mp:02d}_model_states.pt       stage 3 model states, per dp rank
 *   [bf16_|fp16_]zero_pp_rank_{dp}_mp_rank_{mp:02d}_optim_states.pt   optimizer shards
 * (dp printed without zero padding, mp with two digits). Nothing is parsed here; the
 * rank set is checked against partition_count later, when it is known.
 */
#ifndef ZCK_DS_FILES_H
#define ZCK_DS_FILES_H

#include "io.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum zck__ds_prefix {
  ZCK__DS_PREFIX_NONE = 0,  /* zero_pp_rank_ (fp32 / fp16 engines) */
  ZCK__DS_PREFIX_BF16,      /* bf16_zero_pp_rank_ (every bf16 engine) */
  ZCK__DS_PREFIX_FP16,      /* fp16_zero_pp_rank_ (legacy; read only) */
} zck__ds_prefix;

typedef struct zck__ds_rankfile {
  uint32_t rank;            /* dp rank from the name */
  char *name;               /* file name inside the tag folder */
  char *path;               /* dir + name */
  uint64_t size;
} zck__ds_rankfile;

typedef struct zck__ds_fileset {
  char *root;               /* folder holding `latest`; for a tag folder given directly, its parent */
  char *tag;
  char *dir;                /* the tag folder */
  bool tag_from_latest;
  zck__ds_rankfile model;   /* mp_rank_00_model_states.pt (name NULL if absent) */
  zck__ds_rankfile *z3_models;  /* zero_pp_rank_R_mp_rank_00_model_states.pt, sorted by rank */
  size_t n_z3_models;
  zck__ds_rankfile *experts;  /* layer_<L>_expert_<E>_mp_rank_XX_model_states.pt (rank = E), in folder order:
                                 AutoEP's ZeRO-1/2 expert weights (ds_autoep.c refuses them otherwise) */
  size_t n_experts;
  zck__ds_rankfile *layers;  /* layer_<XX>-model_states.pt (rank = XX), every pipeline stage's, in folder order:
                                PipelineModule's 16-bit weights (ds_pipe.c) */
  size_t n_layers;
  zck__ds_rankfile *optims; /* optimizer shards, sorted by rank */
  size_t n_optims;
  zck__ds_prefix prefix;
  bool has_offload_dir;     /* offloaded_tensors/ (NVMe optimizer swap) */
  /* AutoTP (tensor parallel): the files of each mp (TP) rank form one ZeRO checkpoint. The
   * set above is mp rank `mp`'s; n_mp is one more than the highest mp rank named by any
   * states file of the folder (1 for a plain ZeRO checkpoint). */
  uint32_t mp;
  uint32_t n_mp;
} zck__ds_fileset;

/* Resolves path (+ optional explicit tag) and scans the tag folder. Errors name the root,
 * the tag or the file set's fault (a missing, extra or misnamed rank file). */
zck_status zck__ds_find(const char *path, const char *tag, zck__ds_fileset *fs);
/* The same for the files of mp (TP) rank mp; fs->n_mp counts the mp ranks seen. */
zck_status zck__ds_find_mp(const char *path, const char *tag, uint32_t mp, zck__ds_fileset *fs);
void zck__ds_fileset_free(zck__ds_fileset *fs);

/* Checks that the optimizer (and, for stage 3, model) files are exactly ranks 0..w-1.
 * `who` names the file that gave w (for the message). DS-12, DS-13, DS-14. */
zck_status zck__ds_check_ranks(const zck__ds_fileset *fs, uint32_t w, int stage, const char *who);

/* Validates a tag read from `latest` or given by the user (DS-02, DS-03). */
zck_status zck__ds_check_tag(const char *tag, const char *where);

/* The exact names DeepSpeed gives its files (caller frees). */
char *zck__ds_optim_name(zck__ds_prefix prefix, uint32_t dp_rank);
char *zck__ds_model_name(int stage, uint32_t dp_rank);
char *zck__ds_optim_name_mp(zck__ds_prefix prefix, uint32_t dp_rank, uint32_t mp_rank);
char *zck__ds_model_name_mp(int stage, uint32_t dp_rank, uint32_t mp_rank);

#endif
