/* torch_save.c: a file laid out exactly as torch.save(obj, path) lays it out (torch 2.x),
 * for an object whose tree is known before any tensor byte is written.
 *
 * torch.save writes, under the folder named after the file's stem: data.pkl,
 * .format_version ("1"), .storage_alignment ("64"), byteorder ("little"), data/0 ..
 * data/<n-1> (each storage once, in the order the pickler first reached it, 64-byte
 * aligned), version ("3\n"), .data/serialization_id (torch_serial_id.c). data.pkl comes
 * first, so the tree is pickled before the layout exists (zck_torch_saver_layout); the
 * storages' bytes are then written anywhere, in any order, by the caller, and their CRC-32s
 * handed back before finish. torch_write.c's writer puts data.pkl after the storages
 * instead, so that a tree may grow while data is copied; this one is for the callers that
 * must equal torch's bytes (dcp_to_torch_save). */
#include "torch_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMALL_FILE ((uint64_t)8 << 20)

typedef struct saved_storage {
  zck_dtype dtype;
  uint64_t numel;
  size_t zip_index;
  uint64_t data_off;
  uint32_t crc;
} saved_storage;

struct zck_torch_saver {
  zck__outfile out;
  zck_zip_writer *zip;
  zck_pk_doc *doc;
  char prefix[256];
  saved_storage *st;
  size_t n, cap;
  zck__torch_nodes nodes;  /* torch's constants in doc, one node each */
  uint32_t pkl_crc;
  uint64_t pkl_len;
  bool laid_out, finished;
};

zck_status zck_torch_saver_create(const char *path, zck_torch_saver **out) {
  *out = NULL;
  zck_torch_saver *s = zck__calloc(1, sizeof *s);
  if (!s) return ZCK_ERR_NO_MEMORY;
  s->out.fd = -1;
  zck_status st = zck__outfile_create(&s->out, path);
  if (st != ZCK_OK) {
    free(s);
    return st;
  }
  st = zck_zip_writer_create(&s->out, &s->zip);
  if (st == ZCK_OK && !(s->doc = s->nodes.doc = zck_pk_doc_new())) st = ZCK_ERR_NO_MEMORY;
  zck_torch_archive_name(path, s->prefix, sizeof s->prefix);
  if (st != ZCK_OK) {
    zck_torch_saver_free(s);
    return st;
  }
  *out = s;
  return ZCK_OK;
}

zck_pk_doc *zck_torch_saver_doc(zck_torch_saver *s) { return s->doc; }

zck_pk *zck_torch_saver_tensor(zck_torch_saver *s, zck_dtype dt, int ndim, const int64_t *shape) {
  ZCK_ASSERT(!s->laid_out && ndim >= 0);
  const char *cls = (unsigned)dt < ZCK_DTYPE_COUNT ? zck__torch_storage_class(dt) : NULL;
  if (!cls) {
    zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a %s tensor (torch.save pickles it through UntypedStorage: not written here)",
              s->out.path, zck_dtype_name(dt));
    return NULL;
  }
  if (ndim > ZCK_TORCH_MAX_DIMS) {
    zck__fail(ZCK_ERR_INVALID_ARG, "%s: tensor of %d dimensions", s->out.path, ndim);
    return NULL;
  }
  uint64_t numel = 1;
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0 || !zck__mul_u64(numel, (uint64_t)shape[i], &numel)) {
      zck__fail(ZCK_ERR_INVALID_ARG, "%s: invalid tensor shape", s->out.path);
      return NULL;
    }
  if (!ZCK__GROW(s->st, s->cap, s->n + 1)) return NULL;
  char key[24];
  snprintf(key, sizeof key, "%zu", s->n);
  zck_pk *t = zck__torch_tensor_node(&s->nodes, dt, zck_pk_new_str(s->doc, key), numel, ndim, shape, NULL, 0, false);
  if (!t) return NULL;
  s->st[s->n++] = (saved_storage){.dtype = dt, .numel = numel};
  return t;
}

static const char *entry(char name[300], const char *prefix, const char *rec) {
  snprintf(name, 300, "%s/%s", prefix, rec);
  return name;
}

zck_status zck_torch_saver_layout(zck_torch_saver *s, const zck_pk *root) {
  ZCK_ASSERT(!s->laid_out);
  s->laid_out = true;
  zck__buf pkl;
  zck__buf_init(&pkl);
  char name[300], rec[32];
  /* a small file is assembled in memory and written at once (lib/io_image.c); a large
   * one goes straight to disk, so that its data streams through a bounded buffer */
  uint64_t total = 0;
  for (size_t i = 0; i < s->n; i++) total += s->st[i].numel * zck_dtype_size(s->st[i].dtype);
  if (total <= SMALL_FILE) zck__outfile_buffer(&s->out);
  zck_status st = zck_pickle_dump(root, &pkl);
  if (st == ZCK_OK) st = zck_zip_writer_add(s->zip, entry(name, s->prefix, "data.pkl"), pkl.data, pkl.len);
  s->pkl_crc = zck_crc32_update(0, pkl.data, pkl.len);
  s->pkl_len = pkl.len;
  zck__buf_free(&pkl);
  if (st == ZCK_OK) st = zck_zip_writer_add(s->zip, entry(name, s->prefix, ".format_version"), "1", 1);
  if (st == ZCK_OK) st = zck_zip_writer_add(s->zip, entry(name, s->prefix, ".storage_alignment"), "64", 2);
  if (st == ZCK_OK) st = zck_zip_writer_add(s->zip, entry(name, s->prefix, "byteorder"), "little", 6);
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    saved_storage *x = &s->st[i];
    uint64_t bytes;
    if (!zck__mul_u64(x->numel, zck_dtype_size(x->dtype), &bytes))
      return zck__fail(ZCK_ERR_LIMIT, "%s: storage %zu too large", s->out.path, i);
    snprintf(rec, sizeof rec, "data/%zu", i);
    st = zck_zip_writer_reserve(s->zip, entry(name, s->prefix, rec), bytes, &x->zip_index, &x->data_off);
  }
  return st;
}

size_t zck_torch_saver_storage_count(const zck_torch_saver *s) { return s->n; }

uint64_t zck_torch_saver_data_offset(const zck_torch_saver *s, size_t storage) {
  ZCK_ASSERT(s->laid_out && storage < s->n);
  return s->st[storage].data_off;
}

zck_status zck_torch_saver_write(zck_torch_saver *s, const void *data, size_t n, uint64_t file_off) {
  return zck__outfile_pwrite(&s->out, data, n, file_off);
}

void zck_torch_saver_set_crc(zck_torch_saver *s, size_t storage, uint32_t crc) {
  ZCK_ASSERT(s->laid_out && storage < s->n);
  s->st[storage].crc = crc;
  zck_zip_writer_set_crc(s->zip, s->st[storage].zip_index, crc);
}

zck_status zck_torch_saver_finish(zck_torch_saver *s) {
  ZCK_ASSERT(s->laid_out && !s->finished);
  char name[300];
  zck_status st = zck_zip_writer_add(s->zip, entry(name, s->prefix, "version"), "3\n", 2);
  /* the records in write order, for the serialization id */
  size_t n = s->n + 5;
  const char **names = zck__calloc(n, sizeof *names);
  uint32_t *crcs = zck__calloc(n, sizeof *crcs);
  uint64_t *sizes = zck__calloc(n, sizeof *sizes);
  char (*keys)[32] = zck__calloc(s->n ? s->n : 1, sizeof *keys);
  if (st == ZCK_OK && !(names && crcs && sizes && keys)) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) {
    static const char *const small[4] = {"data.pkl", ".format_version", ".storage_alignment", "byteorder"};
    static const char *const body[4] = {NULL, "1", "64", "little"};
    for (size_t i = 0; i < 4; i++) {
      names[i] = small[i];
      sizes[i] = i ? strlen(body[i]) : s->pkl_len;
      crcs[i] = i ? zck_crc32_update(0, body[i], sizes[i]) : s->pkl_crc;
    }
    for (size_t i = 0; i < s->n; i++) {
      snprintf(keys[i], sizeof keys[i], "data/%zu", i);
      names[4 + i] = keys[i];
      crcs[4 + i] = s->st[i].crc;
      sizes[4 + i] = s->st[i].numel * zck_dtype_size(s->st[i].dtype);
    }
    names[n - 1] = "version";
    sizes[n - 1] = 2;
    crcs[n - 1] = zck_crc32_update(0, "3\n", 2);
  }
  char sid[40];
  if (st == ZCK_OK) st = zck_torch_serialization_id(names, crcs, sizes, n, sid);
  free(names);
  free(crcs);
  free(sizes);
  free(keys);
  if (st == ZCK_OK) st = zck_zip_writer_add(s->zip, entry(name, s->prefix, ".data/serialization_id"), sid, 40);
  if (st == ZCK_OK) st = zck_zip_writer_finish(s->zip);
  if (st == ZCK_OK) st = zck__outfile_commit(&s->out);
  if (st == ZCK_OK) s->finished = true;
  return st;
}

void zck_torch_saver_free(zck_torch_saver *s) {
  if (!s) return;
  if (!s->finished) zck__outfile_abort(&s->out);
  zck_zip_writer_free(s->zip);
  zck_pk_doc_free(s->doc);
  free(s->st);
  free(s);
}
