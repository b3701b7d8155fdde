/* torch_internal.h: the reader's file object and the helpers its parts share. */
#ifndef ZCK_TORCH_INTERNAL_H
#define ZCK_TORCH_INTERNAL_H

#include "torch.h"

/* Pointer -> index map (open addressing), for node -> tensor and node -> storage. */
typedef struct zck__ptrmap {
  const void **keys;
  size_t *vals;
  size_t cap, count;
} zck__ptrmap;

bool zck__ptrmap_put(zck__ptrmap *m, const void *key, size_t val);
/* SIZE_MAX if absent. */
size_t zck__ptrmap_get(const zck__ptrmap *m, const void *key);
void zck__ptrmap_free(zck__ptrmap *m);

struct zck_torch_file {
  zck__source own_src;
  bool owns_src;
  const zck__source *src;
  const char *name;            /* src->name */
  zck_zip *zip;
  char *prefix;
  zck_pk_doc *doc;
  zck_torch_storage *storages;
  size_t nstorages, scap;
  zck_torch_tensor *tensors;   /* every resolved node, wrapped inner tensors included */
  bool *wrapped;               /* tensors[i] is the inner tensor of a Parameter wrapper */
  size_t ntensors, tcap;
  size_t *listed;              /* indices of the tensors zck_torch_tensor_at lists */
  size_t nlisted;
  zck__ptrmap tensor_of;       /* node -> index in tensors */
  zck__ptrmap storage_of;      /* PERSID node -> index in storages */
  size_t *key_slots;           /* storage key -> index + 1 (open addressing; 0 = empty) */
  size_t key_cap;
};

/* Storage class name (torch.<Name>) -> dtype; ZCK_DTYPE_INVALID if unknown, and *quantized
 * set for the quantized classes zckpt does not handle. */
zck_dtype zck__torch_storage_dtype(const char *name, bool *quantized);
/* Legacy storage class for a dtype, NULL when torch has none (uint16+, float8). */
const char *zck__torch_storage_class(zck_dtype t);
/* torch.<name> dtype global -> dtype; *known set when it is a torch dtype zckpt lacks. */
zck_dtype zck__torch_dtype_global(const char *name, bool *known);

/* torch's constant pickle nodes in one document, one node each (torch_node.c); zero it
 * and set doc before the first tensor. */
typedef struct zck__torch_nodes {
  zck_pk_doc *doc;
  zck_pk *s_storage, *s_cpu, *g_v2, *g_v3, *g_untyped;
  zck_pk *storage_class[ZCK_DTYPE_COUNT], *dtype_global[ZCK_DTYPE_COUNT];
} zck__torch_nodes;
/* The node torch.save pickles for a tensor viewing storage `key` of storage_numel
 * elements of dt (stride NULL: contiguous); NULL when out of memory. */
zck_pk *zck__torch_tensor_node(zck__torch_nodes *c, zck_dtype dt, zck_pk *key, uint64_t storage_numel, int ndim,
                               const int64_t *shape, const int64_t *stride, uint64_t storage_offset,
                               bool requires_grad);
/* torch's contiguous strides for shape (a dimension of size 0 or 1 counts as 1). */
void zck__torch_contiguous_stride(int ndim, const int64_t *shape, int64_t *stride);

/* zck_torch_state_dict over any resolver of tensor nodes (a reader's file, a writer's
 * records); fname for messages, doc bounds the walk. */
zck_status zck__torch_named_walk(const char *fname, const zck_torch_tensor *(*tensor_of)(const void *, const zck_pk *),
                                 const void *ctx, const zck_pk_doc *doc, const zck_pk *dict, zck_torch_named **out,
                                 size_t *count);

/* "a.b.0.c": where node sits under the root (for messages); "?" if not found. */
void zck__torch_path_of(const zck_torch_file *f, const zck_pk *node, char *buf, size_t n);

#endif
