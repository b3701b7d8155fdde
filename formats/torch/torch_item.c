/* torch_item.c: one torch.save archive written at an offset inside a larger file, as torch
 * 2.15's torch.save lays it out when it writes to a stream: torch DCP's FileSystemWriter
 * saves every item of a .distcp file that way (a tensor chunk, or a Python object such as
 * an optimizer setting), one archive after the other.
 *
 * Entries in torch's order, under the folder "archive" (torch's name for a stream):
 * data.pkl, .format_version ("1"), .storage_alignment ("64"), byteorder ("little"), data/0
 * (a tensor's bytes, 64-byte aligned from the archive's start), version ("3\n"),
 * .data/serialization_id. Everything but data/0's bytes is known when the item is reserved,
 * so the archive is written whole then (its length is where the next item starts) with a
 * CRC placeholder, and nothing is kept of it but where that CRC goes (zip.h crc slots):
 * whoever writes the data puts the CRC there, a checkpoint of a million chunks holds no
 * zip writer per chunk meanwhile. */
#include "torch_internal.h"

#include "zip/zip.h"

#include <stdlib.h>
#include <string.h>

/* .data/serialization_id: 40 decimal digits. torch derives them from the records; it only
 * logs them on load, so ours is a hash of where the item sits and of its pickle. */
static void zck__item_serial(char out[40], uint64_t base, const zck__buf *pkl) {
  uint64_t a = zck_xxh3(pkl->data, pkl->len) % 10000000000000000000ULL, b = base % 10000000000000000000ULL;
  for (int i = 19; i >= 0; i--, a /= 10, b /= 10) {
    out[i] = (char)('0' + a % 10);
    out[20 + i] = (char)('0' + b % 10);
  }
}

/* The archive around pkl, with a data/0 entry of data_bytes when has_data, finished at
 * once (data/0's CRC: a placeholder, its place in slots; UINT64_MAX when it has none). */
static zck_status zck__item_build(zck__outfile *out, uint64_t base, const zck__buf *pkl, bool has_data, uint64_t data_bytes,
                                  uint64_t *data_off, uint64_t *len, uint64_t slots[2]) {
  zck_zip_writer *zip = NULL;
  size_t data_index = 0;
  zck_status st = zck_zip_writer_create_at(out, base, &zip);
  if (st == ZCK_OK) st = zck_zip_writer_add(zip, "archive/data.pkl", pkl->data, pkl->len);
  if (st == ZCK_OK) st = zck_zip_writer_add(zip, "archive/.format_version", "1", 1);
  if (st == ZCK_OK) st = zck_zip_writer_add(zip, "archive/.storage_alignment", "64", 2);
  if (st == ZCK_OK) st = zck_zip_writer_add(zip, "archive/byteorder", "little", 6);
  uint64_t off = 0;
  if (st == ZCK_OK && has_data) st = zck_zip_writer_reserve(zip, "archive/data/0", data_bytes, &data_index, &off);
  if (st == ZCK_OK && has_data) zck_zip_writer_set_crc(zip, data_index, 0);
  char sid[40];
  zck__item_serial(sid, base, pkl);
  if (st == ZCK_OK) st = zck_zip_writer_add(zip, "archive/version", "3\n", 2);
  if (st == ZCK_OK) st = zck_zip_writer_add(zip, "archive/.data/serialization_id", sid, 40);
  if (st == ZCK_OK) st = zck_zip_writer_finish(zip);
  if (st == ZCK_OK) {
    if (data_off) *data_off = off;
    *len = zck_zip_writer_size(zip);
    if (slots && (!has_data || !zck_zip_writer_crc_slots(zip, data_index, slots))) slots[0] = slots[1] = UINT64_MAX;
  }
  zck_zip_writer_free(zip);
  return st;
}

/* A contiguous tensor that owns its whole storage, key '0', pickled as torch.save pickles it. */
static zck_status zck__item_tensor_pkl(zck_dtype dt, int ndim, const int64_t *shape, uint64_t numel, zck__buf *out) {
  if (!zck__torch_storage_class(dt))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "torch item: dtype %s has no storage class", zck_dtype_name(dt));
  if (ndim > ZCK_TORCH_MAX_DIMS) return zck__fail(ZCK_ERR_UNSUPPORTED, "torch item: a tensor of %d dimensions", ndim);
  zck__torch_nodes nodes = {.doc = zck_pk_doc_new()};
  if (!nodes.doc) return ZCK_ERR_NO_MEMORY;
  zck_pk *root = zck__torch_tensor_node(&nodes, dt, zck_pk_new_str(nodes.doc, "0"), numel, ndim, shape, NULL, 0, false);
  zck_status st = root ? zck_pickle_dump(root, out) : ZCK_ERR_NO_MEMORY;
  zck_pk_doc_free(nodes.doc);
  return st;
}

zck_status zck_torch_item_tensor(zck__outfile *out, uint64_t base, zck_dtype dt, int ndim, const int64_t *shape,
                                 uint64_t *data_off, uint64_t *len, uint64_t crc_slots[2]) {
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
  if (st == ZCK_OK) st = zck__item_build(out, base, &pkl, true, bytes, data_off, len, crc_slots);
  zck__buf_free(&pkl);
  return st;
}

zck_status zck_torch_item_object(zck__outfile *out, uint64_t base, const zck_pk *root, uint64_t *len) {
  zck__buf pkl;
  zck__buf_init(&pkl);
  zck_status st = zck_pickle_dump(root, &pkl);
  if (st == ZCK_OK) st = zck__item_build(out, base, &pkl, false, 0, NULL, len, NULL);
  zck__buf_free(&pkl);
  return st;
}

zck_status zck_torch_item_set_crc(zck__outfile *out, const uint64_t crc_slots[2], uint32_t crc) {
  if (crc_slots[0] == UINT64_MAX) return ZCK_OK;
  uint8_t le[4] = {(uint8_t)crc, (uint8_t)(crc >> 8), (uint8_t)(crc >> 16), (uint8_t)(crc >> 24)};
  ZCK_TRY(zck__outfile_pwrite(out, le, 4, crc_slots[0]));
  return zck__outfile_pwrite(out, le, 4, crc_slots[1]);
}
