/* torch_item.c: one torch.save archive written at an offset inside a larger file, as torch
 * 2.15's torch.save lays it out when it writes to a stream: torch DCP's FileSystemWriter
 * saves every item of a .distcp file that way (a tensor chunk, or a Python object such as
 * an optimizer setting), one archive after the other.
 *
 * Entries in torch's order, under the folder "archive" (torch's name for a stream):
 * data.pkl, .format_version ("1"), .storage_alignment ("64"), byteorder ("little"), data/0
 * (a tensor's bytes, 64-byte aligned from the archive's start), version ("3\n"),
 * .data/serialization_id. Everything but data/0 is known when the item is reserved, so its
 * length is known then too and the next item can start right after it; data/0's CRC is
 * given at finish, by whoever wrote its bytes. */
#include "torch_internal.h"

#include "zip/zip.h"

#include <stdlib.h>
#include <string.h>

struct zck_torch_item {
  zck_zip_writer *zip;
  size_t data_index;
  bool has_data;
};

/* .data/serialization_id: 40 decimal digits. torch derives them from the records; it only
 * logs them on load, so ours is a hash of where the item sits and of its pickle. */
static void zck__item_serial(char out[40], uint64_t base, const zck__buf *pkl) {
  uint64_t a = zck_xxh3(pkl->data, pkl->len) % 10000000000000000000ULL, b = base % 10000000000000000000ULL;
  for (int i = 19; i >= 0; i--, a /= 10, b /= 10) {
    out[i] = (char)('0' + a % 10);
    out[20 + i] = (char)('0' + b % 10);
  }
}

/* The archive around pkl, with a data/0 entry of data_bytes when has_data. */
static zck_status zck__item_build(zck__outfile *out, uint64_t base, const zck__buf *pkl, bool has_data, uint64_t data_bytes,
                                  zck_torch_item **item, uint64_t *data_off, uint64_t *len) {
  zck_torch_item *it = zck__calloc(1, sizeof *it);
  if (!it) return ZCK_ERR_NO_MEMORY;
  it->has_data = has_data;
  zck_status st = zck_zip_writer_create_at(out, base, &it->zip);
  if (st == ZCK_OK) st = zck_zip_writer_add(it->zip, "archive/data.pkl", pkl->data, pkl->len);
  if (st == ZCK_OK) st = zck_zip_writer_add(it->zip, "archive/.format_version", "1", 1);
  if (st == ZCK_OK) st = zck_zip_writer_add(it->zip, "archive/.storage_alignment", "64", 2);
  if (st == ZCK_OK) st = zck_zip_writer_add(it->zip, "archive/byteorder", "little", 6);
  uint64_t off = 0;
  if (st == ZCK_OK && has_data) st = zck_zip_writer_reserve(it->zip, "archive/data/0", data_bytes, &it->data_index, &off);
  char sid[40];
  zck__item_serial(sid, base, pkl);
  if (st == ZCK_OK) st = zck_zip_writer_add(it->zip, "archive/version", "3\n", 2);
  if (st == ZCK_OK) st = zck_zip_writer_add(it->zip, "archive/.data/serialization_id", sid, 40);
  if (st != ZCK_OK) {
    zck_torch_item_free(it);
    return st;
  }
  if (data_off) *data_off = off;
  *len = zck_zip_writer_size(it->zip);
  *item = it;
  return ZCK_OK;
}

/* _rebuild_tensor_v2(PERSID(('storage', torch.<X>Storage, '0', 'cpu', numel)), 0, shape,
 * contiguous stride, False, OrderedDict()): what torch.save pickles for a contiguous
 * tensor that owns its whole storage. */
static zck_status zck__item_tensor_pkl(zck_dtype dt, int ndim, const int64_t *shape, uint64_t numel, zck__buf *out) {
  const char *cls = zck__torch_storage_class(dt);
  if (!cls) return zck__fail(ZCK_ERR_UNSUPPORTED, "torch item: dtype %s has no storage class", zck_dtype_name(dt));
  zck_pk_doc *d = zck_pk_doc_new();
  if (!d) return ZCK_ERR_NO_MEMORY;
  zck_pk *pid = zck_pk_new_tuple(d, 5), *args = zck_pk_new_tuple(d, 6);
  zck_pk *sz = zck_pk_new_tuple(d, (size_t)ndim), *stride = zck_pk_new_tuple(d, (size_t)ndim);
  bool ok = pid && args && sz && stride;
  if (ok) {
    pid->u.seq.items[0] = zck_pk_new_str(d, "storage");
    pid->u.seq.items[1] = zck_pk_new_global(d, "torch", cls);
    pid->u.seq.items[2] = zck_pk_new_str(d, "0");
    pid->u.seq.items[3] = zck_pk_new_str(d, "cpu");
    pid->u.seq.items[4] = zck_pk_new_int(d, (int64_t)numel);
    int64_t acc = 1;
    for (int i = ndim - 1; i >= 0; i--) {
      sz->u.seq.items[i] = zck_pk_new_int(d, shape[i]);
      stride->u.seq.items[i] = zck_pk_new_int(d, acc);
      if (shape[i] > 1) acc *= shape[i];
      ok &= sz->u.seq.items[i] && stride->u.seq.items[i];
    }
    args->u.seq.items[0] = zck_pk_new_persid(d, pid);
    args->u.seq.items[1] = zck_pk_new_int(d, 0);
    args->u.seq.items[2] = sz;
    args->u.seq.items[3] = stride;
    args->u.seq.items[4] = zck_pk_new_bool(d, 0);
    args->u.seq.items[5] = zck_pk_new_dict(d, 1);
    for (size_t i = 0; i < 5; i++) ok &= pid->u.seq.items[i] != NULL;
    for (size_t i = 0; i < 6; i++) ok &= args->u.seq.items[i] != NULL;
  }
  zck_pk *root = ok ? zck_pk_new_object(d, zck_pk_new_global(d, "torch._utils", "_rebuild_tensor_v2"), args, 0, NULL) : NULL;
  zck_status st = root ? zck_pickle_dump(root, out) : ZCK_ERR_NO_MEMORY;
  zck_pk_doc_free(d);
  return st;
}

zck_status zck_torch_item_tensor(zck__outfile *out, uint64_t base, zck_dtype dt, int ndim, const int64_t *shape,
                                 zck_torch_item **item, uint64_t *data_off, uint64_t *len) {
  uint64_t numel = 1;
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0 || !zck__mul_u64(numel, (uint64_t)shape[i], &numel))
      return zck__fail(ZCK_ERR_INVALID_ARG, "%s: torch item: invalid shape", out->path);
  uint64_t bytes;
  if (!zck__mul_u64(numel, zck_dtype_size(dt), &bytes))
    return zck__fail(ZCK_ERR_LIMIT, "%s: torch item: tensor too large", out->path);
  zck__buf pkl;
  zck__buf_init(&pkl);
  zck_status st = zck__item_tensor_pkl(dt, ndim, shape, numel, &pkl);
  if (st == ZCK_OK) st = zck__item_build(out, base, &pkl, true, bytes, item, data_off, len);
  zck__buf_free(&pkl);
  return st;
}

zck_status zck_torch_item_object(zck__outfile *out, uint64_t base, const zck_pk *root, uint64_t *len) {
  zck__buf pkl;
  zck__buf_init(&pkl);
  zck_torch_item *it = NULL;
  zck_status st = zck_pickle_dump(root, &pkl);
  if (st == ZCK_OK) st = zck__item_build(out, base, &pkl, false, 0, &it, NULL, len);
  zck__buf_free(&pkl);
  if (st == ZCK_OK) st = zck_torch_item_finish(it, 0);
  zck_torch_item_free(it);
  return st;
}

zck_status zck_torch_item_finish(zck_torch_item *it, uint32_t data_crc) {
  if (it->has_data) zck_zip_writer_set_crc(it->zip, it->data_index, data_crc);
  return zck_zip_writer_finish(it->zip);
}

void zck_torch_item_free(zck_torch_item *it) {
  if (!it) return;
  zck_zip_writer_free(it->zip);
  free(it);
}
