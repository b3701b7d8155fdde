/* torch_node.c: the pickle nodes torch.save writes for one tensor, for every writer of
 * torch files (torch_write.c, torch_save.c, torch_item.c).
 *
 * torch.save pickles a tensor as
 *   _rebuild_tensor_v2(PERSID(('storage', torch.<X>Storage, key, 'cpu', numel)),
 *                      storage_offset, size, stride, requires_grad, OrderedDict())
 * or, for a dtype with no legacy storage class (uint16+, float8),
 *   _rebuild_tensor_v3(PERSID(('storage', torch.storage.UntypedStorage, key, 'cpu', nbytes)),
 *                      ..., OrderedDict(), torch.<dtype>).
 * The constant parts ('storage', 'cpu', the classes, the functions) are one Python object
 * each in torch's pickler, which memoizes them; zck__torch_nodes keeps them one node each so
 * that our pickle memoizes the same way and data.pkl equals torch's byte for byte. The key
 * string is the caller's, shared by every view of one storage. size, stride and the
 * OrderedDict are fresh per tensor, as torch makes them. */
#include "torch_internal.h"

static zck_pk *once(zck_pk **slot, zck_pk *made) { return *slot ? *slot : (*slot = made); }
static zck_pk *once_global(zck__torch_nodes *c, zck_pk **slot, const char *module, const char *name) {
  return *slot ? *slot : (*slot = zck_pk_new_global(c->doc, module, name));
}

static zck_pk *int_tuple(zck_pk_doc *d, int n, const int64_t *v) {
  zck_pk *t = zck_pk_new_tuple(d, (size_t)n);
  if (!t) return NULL;
  for (int i = 0; i < n; i++)
    if (!(t->u.seq.items[i] = zck_pk_new_int(d, v[i]))) return NULL;
  return t;
}

void zck__torch_contiguous_stride(int ndim, const int64_t *shape, int64_t *stride) {
  int64_t acc = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    stride[i] = acc;
    if (shape[i] > 0 && acc <= INT64_MAX / shape[i]) acc *= shape[i];   /* torch: max(size, 1) */
  }
}

zck_pk *zck__torch_tensor_node(zck__torch_nodes *c, zck_dtype dt, zck_pk *key, uint64_t storage_numel, int ndim,
                               const int64_t *shape, const int64_t *stride, uint64_t storage_offset,
                               bool requires_grad) {
  zck_pk_doc *d = c->doc;
  const char *cls = zck__torch_storage_class(dt);
  ZCK_ASSERT(ndim >= 0 && ndim <= ZCK_TORCH_MAX_DIMS);
  int64_t cstride[ZCK_TORCH_MAX_DIMS];
  if (!stride) {
    zck__torch_contiguous_stride(ndim, shape, cstride);
    stride = cstride;
  }
  zck_pk *pid = zck_pk_new_tuple(d, 5), *args = zck_pk_new_tuple(d, cls ? 6 : 7);
  if (!pid || !args || !key) return NULL;
  pid->u.seq.items[0] = once(&c->s_storage, zck_pk_new_str(d, "storage"));
  pid->u.seq.items[1] = cls ? once_global(c, &c->storage_class[dt], "torch", cls)
                            : once_global(c, &c->g_untyped, "torch.storage", "UntypedStorage");
  pid->u.seq.items[2] = key;
  pid->u.seq.items[3] = once(&c->s_cpu, zck_pk_new_str(d, "cpu"));
  /* a typed storage counts elements, an untyped one bytes */
  pid->u.seq.items[4] = zck_pk_new_int(d, (int64_t)(cls ? storage_numel : storage_numel * zck_dtype_size(dt)));
  args->u.seq.items[0] = zck_pk_new_persid(d, pid);
  args->u.seq.items[1] = zck_pk_new_int(d, (int64_t)storage_offset);
  args->u.seq.items[2] = int_tuple(d, ndim, shape);
  args->u.seq.items[3] = int_tuple(d, ndim, stride);
  args->u.seq.items[4] = zck_pk_new_bool(d, requires_grad);
  args->u.seq.items[5] = zck_pk_new_dict(d, 1);   /* backward_hooks: a fresh OrderedDict() */
  if (!cls) args->u.seq.items[6] = once_global(c, &c->dtype_global[dt], "torch", zck_dtype_name(dt));
  for (size_t i = 0; i < 5; i++)
    if (!pid->u.seq.items[i]) return NULL;
  for (size_t i = 0; i < args->u.seq.len; i++)
    if (!args->u.seq.items[i]) return NULL;
  zck_pk *fn = cls ? once_global(c, &c->g_v2, "torch._utils", "_rebuild_tensor_v2")
                   : once_global(c, &c->g_v3, "torch._utils", "_rebuild_tensor_v3");
  return fn ? zck_pk_new_object(d, fn, args, 0, NULL) : NULL;
}
