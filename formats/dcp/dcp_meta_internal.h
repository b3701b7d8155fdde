/* dcp_meta_internal.h: what the .metadata reader's two files share: dcp_meta.c reads the
 * whole (entries, items, chunk geometry), dcp_meta_objects.c the objects the pickle VM
 * hands over as they stream (a TensorStorageMetadata with its chunks, a MetadataIndex, a
 * _StorageInfo), so that a metadata of 100k chunks never holds their trees at once. */
#ifndef ZCK_DCP_META_INTERNAL_H
#define ZCK_DCP_META_INTERNAL_H

#include "dcp_internal.h"

#include "pickle/pickle.h"
#include "util.h"

/* Which chunk of a tensor starts at given offsets: an open-addressing table of chunk
 * indices, compared through the chunks themselves (32 bytes a chunk, no key string). A
 * tensor is known by its first chunk (only tensors with chunks are looked up). */
typedef struct chunk_slot {
  size_t chunk;                    /* SIZE_MAX: empty */
  size_t tensor;                   /* the first chunk of its tensor */
} chunk_slot;
typedef struct chunk_table {
  chunk_slot *slot;
  size_t cap, n;                   /* cap: a power of two, at least twice n */
} chunk_table;

/* A TensorStorageMetadata as read: its chunks are c->chunks[first_chunk, + n_chunks). */
typedef struct dcp_tensor_rec {
  zck_dtype dtype;
  int ndim;
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t numel;
  size_t first_chunk, n_chunks;
  bool used;                       /* under a key of state_dict_metadata */
} dcp_tensor_rec;

/* A MetadataIndex as read: its fqn interned, its offsets in mctx.offsets. */
enum { INDEX_NO_OFFSET = -1, INDEX_BAD_OFFSET = -2 };
typedef struct dcp_index_rec {
  uint32_t fqn;                    /* into mctx.fqns */
  int32_t ndim;                    /* or INDEX_NO_OFFSET (None) / INDEX_BAD_OFFSET (not a torch.Size) */
  size_t offsets;                  /* into mctx.offsets */
  bool used;                       /* a key of storage_data */
} dcp_index_rec;

typedef struct mctx {
  zck_dcp *c;
  const char *dir;                 /* the folder whose .metadata this is */
  const char *path;                /* the .metadata file, for messages */
  zck__strmap entry_index;         /* key -> entry */
  chunk_table chunk_index;         /* (tensor, offsets) -> chunk */
  size_t entry_base;               /* c->n_entries before this folder */
  size_t item_base;                /* c->n_items before this folder */
  /* read as the pickle streams */
  dcp_tensor_rec *tensors;
  size_t n_tensors, cap_tensors;
  dcp_index_rec *indexes;
  size_t n_indexes, cap_indexes;
  int64_t *offsets;
  size_t n_offsets, cap_offsets;
  char **fqns;                     /* interned */
  size_t n_fqns, cap_fqns;
  zck__strmap fqn_index;           /* fqn -> fqns[] */
  char *input;                     /* the .metadata bytes */
  size_t input_len, input_dropped; /* its pages before input_dropped are given back */
} mctx;

#define MFAIL(st, ...) zck__dcp_mfail(x, (st), __VA_ARGS__)
zck_status zck__dcp_mfail(const mctx *x, zck_status st, const char *fmt, ...) ZCK__PRINTF(3, 4);

/* The BUILD state of a dataclass instance of class cls, made as NEWOBJ(cls, ()): a dict,
 * or NULL for a class with no fields (BytesStorageMetadata). */
zck_status zck__dcp_dataclass_state(mctx *x, const zck_pk *node, zck_dcp_class cls, const char *where,
                                    const zck_pk **state);
/* A torch.Size (a tuple of ints >= 0) into v[]; n its length. */
zck_status zck__dcp_size_of(mctx *x, const zck_pk *node, const char *where, int64_t *v, int *n);
/* 1 if node is an object of class cls that the sink consumed (its handle is the record). */
bool zck__dcp_consumed(const zck_pk *node, zck_dcp_class cls);

/* Adds chunk ci of the tensor whose first chunk is t; *dup when an earlier chunk of it
 * starts at the same offsets (the table keeps the earlier one). */
bool zck__dcp_table_add(const zck_dcp *c, chunk_table *t, size_t tensor, size_t ci, bool *dup);

/* The VM has read the metadata up to pos: the pages before it go back to the system. */
void zck__dcp_meta_passed(void *ctx, size_t pos);
/* The sink the pickle VM hands the metadata's objects to (dcp_meta_objects.c), for x. */
zck_pk_sink zck__dcp_meta_sink_of(mctx *x);
/* Every node of the stream goes through it: globals outside DCP's classes, persistent
 * ids and paths not made of strings are refused. */
zck_status zck__dcp_check_node(mctx *x, const zck_pk *p);

#endif
