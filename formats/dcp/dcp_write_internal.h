/* dcp_write_internal.h: what the writer's two halves share: dcp_write.c lays out the items
 * of every .distcp file and hands back the state views; dcp_write_meta.c pickles the
 * Metadata that lists them. */
#ifndef ZCK_DCP_WRITE_INTERNAL_H
#define ZCK_DCP_WRITE_INTERNAL_H

#include "dcp_format.h"
#include "dcp_writer.h"

#include "io.h"
#include "torch/torch.h"

/* Where a key's name comes from (the key and the planner path are spelled from it). */
typedef enum zck__dcp_key_kind {
  ZCK__DCP_MODEL = 0,   /* model.<name> */
  ZCK__DCP_STATE,       /* optim.state.<name>.<sub> */
  ZCK__DCP_GROUP        /* optim.param_groups.<group>.<name> */
} zck__dcp_key_kind;

/* One item of a file: a chunk of a tensor (offsets: row0 on dim 0, zeros elsewhere) or a
 * bytes value. */
typedef struct zck__dcp_chunk {
  uint32_t file;
  uint64_t off, len;            /* the item's archive in its file */
  int64_t row0, rows;           /* tensors: dim-0 range (a 0-d tensor: 0, 1) */
} zck__dcp_chunk;

typedef struct zck__dcp_entry {
  zck__dcp_key_kind kind;
  const char *name;             /* borrowed from the manifest */
  const char *sub;              /* STATE: "step", "exp_avg", "exp_avg_sq" */
  uint32_t group;               /* GROUP */
  bool is_bytes;                /* BytesStorageMetadata */
  zck_dtype dtype;              /* tensors */
  int ndim;
  const int64_t *shape;         /* borrowed from the manifest (NULL for a 0-d tensor) */
  size_t chunk0;                /* its chunks: w->chunks[chunk0 .. chunk0 + n_chunks) */
  uint32_t n_chunks;
} zck__dcp_entry;

/* A tensor item waiting for its data's CRC-32 (what the transfer computed as it wrote). */
typedef struct zck__dcp_pending {
  uint32_t file;
  uint64_t crc_slots[2];        /* where its CRC goes (zck_torch_item_set_crc) */
  int part;                     /* whose store it is (ZCK__DCP_*), -1: an empty chunk */
  size_t store;                 /* the store's index in that part */
} zck__dcp_pending;

/* A chunked target part being built: its stores (one per non-empty chunk) and pieces. */
typedef struct zck__dcp_part {
  zck_layout_store *ls;
  zck_piece *pieces;
  zck_store *stores;
  uint32_t *crc;
  size_t n, cap;
  zck_layout *layout;
} zck__dcp_part;

enum { ZCK__DCP_FP32 = 0, ZCK__DCP_EXP_AVG, ZCK__DCP_EXP_AVG_SQ, ZCK__DCP_FROZEN, ZCK__DCP_ALIAS_FP32,
       ZCK__DCP_ALIAS_FROZEN, ZCK__DCP_BUFFERS, ZCK__DCP_PARTS };

struct zck_dcp_writer {
  const zck_model *m;
  zck_dcp_write_opts o;
  char *dir;
  zck__outfile *files;          /* [W] __<r>_0.distcp */
  uint64_t *cursor;             /* [W] where the next item starts */
  bool *open;                   /* [W] created and not yet committed */
  zck__dcp_entry *entries;
  size_t n_entries, cap_entries;
  zck__dcp_chunk *chunks;
  size_t n_chunks, cap_chunks;
  zck__dcp_pending *pending;
  size_t n_pending, cap_pending;
  zck__dcp_part part[ZCK__DCP_PARTS];
  char **names;                 /* store names, for messages */
  size_t n_names, cap_names;
  char save_id[40];             /* StorageMeta.save_id: a random UUID, as torch makes one */
};

/* The entry's key: "model.<name>", "optim.state.<name>.<sub>", "optim.param_groups.<g>.<name>"
 * (malloc'd; NULL: out of memory). */
char *zck__dcp_key(const zck_dcp_writer *w, const zck__dcp_entry *e);

/* dcp_write_meta.c: writes <dir>/.metadata listing every entry and chunk of w. */
zck_status zck__dcp_write_metadata(const zck_dcp_writer *w);

#endif
