/* torch_write.c: writing torch.save files, reserve-then-fill.
 *
 * Storages are reserved in the zip writer as they are added (data/0, data/1, ...), so their
 * file offsets are known before any tensor data exists and copy executors can pwrite them
 * from many threads. The tensor nodes share their constant parts the way torch.save's
 * pickle shares them ('storage', 'cpu', the storage class and the key of a storage are one
 * object each), so data.pkl comes out as torch itself would write it for the same tree.
 * Writes keep no checksum state (so any thread may write any range, and the executor's
 * per-extent CRCs are not computed twice): a storage's CRC is given by set_crc, or else
 * read back from the file at finish, which only small storages written directly need.
 * finish() pickles the tree, adds data.pkl, version and .data/serialization_id, writes the
 * directory and commits the file atomically (zck__outfile). A writer holding many files open
 * during a copy seals each tree once built (pickled then, the nodes freed), after naming its
 * tensors from the writer's own records of the tensor nodes it made (what a reader of the
 * file resolves), so the file's manifest entry needs no second parse. */
#include "torch_internal.h"

#include "exec.h"
#include "dist.h"
#include "zip/zip_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

typedef struct wstorage {
  zck_dtype dtype;
  uint64_t numel, nbytes;
  size_t zip_index;
  uint64_t data_offset;
  _Atomic uint64_t written;  /* bytes written so far, by any thread */
  uint32_t crc;
  bool crc_set;            /* set_crc() gave the CRC of the whole data */
  zck_pk *key;             /* the key str node, shared by every tensor of the storage */
} wstorage;

struct zck_torch_writer {
  zck__outfile out;
  zck_zip_writer *zip;
  zck_pk_doc *doc;
  wstorage *st;
  size_t n, cap;
  zck__torch_nodes nodes;  /* torch's constants in doc, one node each */
  zck_pk *g_param;
  bool finished;
  char prefix[256];        /* the archive folder: the file's stem, as torch.save names it */
  /* the tensor nodes built, as a reader resolves them (zck_torch_writer_named): records
   * whose shape / stride sit at dim_at[i] in dims (pointers set when named: dims grows) */
  zck_torch_tensor *rec;
  size_t *dim_at;
  bool *wrapped;           /* the inner tensor of a Parameter (not listed by a reader) */
  size_t nrec, caprec;
  int64_t *dims;
  size_t ndims, capdims;
  zck__ptrmap rec_of;      /* node -> record */
  /* after seal: data.pkl, and the tree is gone */
  zck__buf pkl;
  bool sealed;
};

/* PREFIX/suffix into name, which has room for it (the prefix is under 256 bytes, a
 * suffix under 40): five names a file, and snprintf's formatting was ~3% of a universal
 * folder's 100k params. */
static const char *entry_name(char name[300], const char *prefix, const char *suffix) {
  size_t a = strlen(prefix), b = strlen(suffix);
  memcpy(name, prefix, a);
  name[a] = '/';
  memcpy(name + a + 1, suffix, b + 1);
  return name;
}

/* v in decimal (printf's %zu), NUL-terminated; out has room for 21 bytes. */
static void put_decimal(char *out, uint64_t v) {
  char t[20];
  int n = 0;
  do t[n++] = (char)('0' + v % 10); while ((v /= 10));
  while (n) *out++ = t[--n];
  *out = 0;
}

/* v as printf's %020llu: 20 digits, zero-padded (every uint64 has at most 20). */
static void put_decimal20(char *out, uint64_t v) {
  for (int i = 19; i >= 0; i--, v /= 10) out[i] = (char)('0' + v % 10);
}

void zck_torch_archive_name(const char *path, char *buf, size_t cap) {
  const char *base = path;
  for (const char *p = path; *p; p++)
    if (*p == '/' || *p == '\\') base = p + 1;
  const char *dot = strrchr(base, '.');
  size_t n = dot ? (size_t)(dot - base) : strlen(base);
  if (!n || n >= cap || (n == 1 && base[0] == '.') || zck__zip_name_problem(base, n)) {
    snprintf(buf, cap, "archive");
    return;
  }
  memcpy(buf, base, n);
  buf[n] = 0;
}

zck_status zck_torch_writer_create(const char *path, zck_torch_writer **out) {
  return zck_torch_writer_create_hashed(path, NULL, out);
}

zck_status zck_torch_writer_create_hashed(const char *path, struct zck__shash *hash, zck_torch_writer **out) {
  *out = NULL;
  zck_torch_writer *w = zck__calloc(1, sizeof *w);
  if (!w) return ZCK_ERR_NO_MEMORY;
  w->out.fd = -1;
  zck_status s = zck__outfile_create(&w->out, path);
  if (s != ZCK_OK) { free(w); return s; }
  /* records are written piece by piece (headers, data, descriptors): assembled in memory,
   * a small file is one write (lib/io_image.c) */
  zck__outfile_buffer(&w->out);
  s = zck_zip_writer_create(&w->out, &w->zip);
  if (s == ZCK_OK && hash) zck_zip_writer_hash(w->zip, hash);
  if (s == ZCK_OK && !(w->doc = w->nodes.doc = zck_pk_doc_new())) s = ZCK_ERR_NO_MEMORY;
  zck_torch_archive_name(path, w->prefix, sizeof w->prefix);
  /* byteorder first: data.pkl can only be written once the tree is complete (see torch.h) */
  char name[300];
  if (s == ZCK_OK) s = zck_zip_writer_add(w->zip, entry_name(name, w->prefix, "byteorder"), "little", 6);
  if (s != ZCK_OK) {
    zck_torch_writer_free(w);
    return s;
  }
  *out = w;
  return ZCK_OK;
}

zck_pk_doc *zck_torch_writer_doc(zck_torch_writer *w) { return w->doc; }

zck_status zck_torch_writer_add_storage(zck_torch_writer *w, zck_dtype dtype, uint64_t numel, size_t *storage_index,
                                        uint64_t *data_file_offset) {
  ZCK_ASSERT(!w->finished && !w->sealed);
  size_t esz = zck_dtype_size(dtype);
  if (!esz) return zck__fail(ZCK_ERR_INVALID_ARG, "%s: storage of an invalid dtype", w->out.path);
  if (!zck__torch_storage_class(dtype)) {
    bool known;
    if (zck__torch_dtype_global(zck_dtype_name(dtype), &known) != dtype)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: torch has no dtype for %s", w->out.path, zck_dtype_name(dtype));
  }
  uint64_t nbytes;
  if (!zck__mul_u64(numel, esz, &nbytes) || nbytes > ((uint64_t)1 << 62))
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: storage of %llu x %s is too large", w->out.path, (unsigned long long)numel,
                     zck_dtype_name(dtype));
  if (!ZCK__GROW(w->st, w->cap, w->n + 1)) return ZCK_ERR_NO_MEMORY;
  wstorage *s = &w->st[w->n];
  memset(s, 0, sizeof *s);
  atomic_init(&s->written, 0);
  char name[300], key[24], rel[32] = "data/";
  put_decimal(key, w->n);
  memcpy(rel + 5, key, strlen(key) + 1);
  ZCK_TRY(zck_zip_writer_reserve(w->zip, entry_name(name, w->prefix, rel), nbytes, &s->zip_index, &s->data_offset));
  if (!(s->key = zck_pk_new_str(w->doc, key))) return ZCK_ERR_NO_MEMORY;
  s->dtype = dtype;
  s->numel = numel;
  s->nbytes = nbytes;
  *storage_index = w->n++;
  *data_file_offset = s->data_offset;
  return ZCK_OK;
}


/* Records node as a reader would resolve it: dims of the view, or (inner != SIZE_MAX) a
 * Parameter wrapping record `inner`. false: out of memory. */
static bool record(zck_torch_writer *w, const zck_pk *node, size_t storage, int ndim, const int64_t *shape,
                   const int64_t *stride, uint64_t storage_offset, uint64_t numel, int requires_grad, size_t inner) {
  if (w->nrec == w->caprec) {
    size_t cap = w->caprec ? 2 * w->caprec : 64;
    zck_torch_tensor *r = zck__realloc(w->rec, cap * sizeof *r);
    if (r) w->rec = r;
    size_t *da = r ? zck__realloc(w->dim_at, cap * sizeof *da) : NULL;
    if (da) w->dim_at = da;
    bool *wr = da ? zck__realloc(w->wrapped, cap * sizeof *wr) : NULL;
    if (!wr) return false;
    w->wrapped = wr;
    w->caprec = cap;
  }
  if (inner != SIZE_MAX) {
    storage = w->rec[inner].storage, ndim = w->rec[inner].ndim, storage_offset = w->rec[inner].storage_offset;
    numel = w->rec[inner].numel;
  }
  size_t need = w->ndims + 2 * (size_t)ndim;
  if (need > w->capdims) {
    size_t cap = w->capdims ? 2 * w->capdims : 256;
    while (cap < need) cap *= 2;
    int64_t *d = zck__realloc(w->dims, cap * sizeof *d);
    if (!d) return false;
    w->dims = d;
    w->capdims = cap;
  }
  size_t at = w->ndims;
  if (inner != SIZE_MAX) memcpy(w->dims + at, w->dims + w->dim_at[inner], 2 * (size_t)ndim * sizeof *w->dims);
  else if (ndim) {
    memcpy(w->dims + at, shape, (size_t)ndim * sizeof *shape);
    memcpy(w->dims + at + ndim, stride, (size_t)ndim * sizeof *stride);
  }
  if (!zck__ptrmap_put(&w->rec_of, node, w->nrec)) return false;
  w->ndims = need;
  zck_torch_tensor *t = &w->rec[w->nrec];
  memset(t, 0, sizeof *t);
  t->node = node;
  t->storage = storage;
  t->dtype = w->st[storage].dtype;
  t->ndim = ndim;
  t->storage_offset = storage_offset;
  t->numel = numel;
  t->requires_grad = requires_grad != 0;
  t->is_parameter = inner != SIZE_MAX;
  w->dim_at[w->nrec] = at;
  w->wrapped[w->nrec] = false;
  if (inner != SIZE_MAX) w->wrapped[inner] = true;
  w->nrec++;
  return true;
}

zck_pk *zck_torch_writer_tensor(zck_torch_writer *w, size_t storage_index, int ndim, const int64_t *shape,
                                const int64_t *stride, uint64_t storage_offset, int requires_grad) {
  ZCK_ASSERT(!w->finished && !w->sealed && storage_index < w->n && ndim >= 0);
  const wstorage *s = &w->st[storage_index];
  if (ndim > ZCK_TORCH_MAX_DIMS) {
    zck__fail(ZCK_ERR_INVALID_ARG, "%s: tensor of %d dimensions", w->out.path, ndim);
    return NULL;
  }
  int64_t cstride[ZCK_TORCH_MAX_DIMS];
  if (!stride) {   /* contiguous */
    zck__torch_contiguous_stride(ndim, shape, cstride);
    stride = cstride;
  }
  uint64_t numel = 1, span = 0, t;
  bool bad = storage_offset > INT64_MAX;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || stride[i] < 0) bad = true;
    else {
      bad |= !zck__mul_u64(numel, (uint64_t)shape[i], &numel);
      if (shape[i] > 0) bad |= !zck__mul_u64((uint64_t)shape[i] - 1, (uint64_t)stride[i], &t) || !zck__add_u64(span, t, &span);
    }
  }
  uint64_t need = storage_offset;
  if (!bad && numel > 0) bad |= !zck__add_u64(need, span, &need) || !zck__add_u64(need, 1, &need);
  if (bad || need > s->numel) {
    zck__fail(ZCK_ERR_INVALID_ARG, "%s: tensor view (offset %llu) does not fit storage %zu of %llu elements", w->out.path,
              (unsigned long long)storage_offset, storage_index, (unsigned long long)s->numel);
    return NULL;
  }
  zck_pk *node = zck__torch_tensor_node(&w->nodes, s->dtype, s->key, s->numel, ndim, shape, stride, storage_offset,
                                        requires_grad);
  if (node && !record(w, node, storage_index, ndim, shape, stride, storage_offset, numel, requires_grad, SIZE_MAX)) {
    zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory", w->out.path);
    return NULL;
  }
  return node;
}

zck_pk *zck_torch_writer_parameter(zck_torch_writer *w, zck_pk *tensor, int requires_grad) {
  ZCK_ASSERT(tensor);
  zck_pk *args = zck_pk_new_tuple(w->doc, 3);
  zck_pk *fn = w->g_param ? w->g_param : (w->g_param = zck_pk_new_global(w->doc, "torch._utils", "_rebuild_parameter"));
  if (!args || !fn) return NULL;
  args->u.seq.items[0] = tensor;
  args->u.seq.items[1] = zck_pk_new_bool(w->doc, requires_grad);
  args->u.seq.items[2] = zck_pk_new_dict(w->doc, 1);
  if (!args->u.seq.items[1] || !args->u.seq.items[2]) return NULL;
  zck_pk *p = zck_pk_new_object(w->doc, fn, args, 0, NULL);
  size_t inner = zck__ptrmap_get(&w->rec_of, tensor);
  if (p && inner != SIZE_MAX && !record(w, p, 0, 0, NULL, NULL, 0, 0, requires_grad, inner)) {
    zck__fail(ZCK_ERR_NO_MEMORY, "%s: out of memory", w->out.path);
    return NULL;
  }
  return p;
}

zck_status zck_torch_writer_write(zck_torch_writer *w, size_t storage_index, const void *data, size_t nbytes,
                                  uint64_t byte_off) {
  ZCK_ASSERT(!w->finished && storage_index < w->n);
  wstorage *s = &w->st[storage_index];
  uint64_t end;
  if (!zck__add_u64(byte_off, nbytes, &end) || end > s->nbytes)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: storage %zu: bytes %llu..%llu written but it has %llu", w->out.path, storage_index,
                     (unsigned long long)byte_off, (unsigned long long)byte_off + nbytes, (unsigned long long)s->nbytes);
  if (!nbytes) return ZCK_OK;
  ZCK_TRY(zck__outfile_pwrite(&w->out, data, nbytes, s->data_offset + byte_off));
  atomic_fetch_add_explicit(&s->written, nbytes, memory_order_relaxed);
  return ZCK_OK;
}

/* The CRC of a storage's bytes as they are in the file (a storage filled without
 * set_crc: a few bytes of step counters and scalars in practice). Plain pread: these
 * are not input reads, so they stay out of the read fault-injection count. */
static zck_status read_back_crc(zck_torch_writer *w, wstorage *s) {
  uint8_t buf[64 << 10];
  uint32_t crc = 0;
  if (!zck__dist_writes()) return ZCK_OK; /* another rank of a distributed job: rank 0 finishes the file */
  for (uint64_t at = 0; at < s->nbytes;) {
    size_t n = s->nbytes - at < sizeof buf ? (size_t)(s->nbytes - at) : sizeof buf;
    if (zck__outfile_image_read(&w->out, buf, n, s->data_offset + at)) {
      crc = zck_crc32_update(crc, buf, n);
      at += n;
      continue;
    }
    ssize_t r = pread(w->out.fd, buf, n, (off_t)(s->data_offset + at));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return zck__fail_errno(errno, "%s: reading back storage data failed", w->out.path);
    if (r == 0) return zck__fail(ZCK_ERR_INTERNAL, "%s: storage data ends early", w->out.path);
    crc = zck_crc32_update(crc, buf, (size_t)r);
    at += (uint64_t)r;
  }
  s->crc = crc;
  return ZCK_OK;
}

void zck_torch_writer_set_crc(zck_torch_writer *w, size_t storage_index, uint32_t crc) {
  ZCK_ASSERT(!w->finished && storage_index < w->n);
  w->st[storage_index].crc = crc;
  w->st[storage_index].crc_set = true;
}

static const zck_torch_tensor *rec_tensor_of(const void *ctx, const zck_pk *node) {
  const zck_torch_writer *w = ctx;
  size_t i = node ? zck__ptrmap_get(&w->rec_of, node) : SIZE_MAX;
  return i == SIZE_MAX ? NULL : &w->rec[i];
}

zck_status zck_torch_writer_named(zck_torch_writer *w, const zck_pk *root, zck_torch_named **out, size_t *count) {
  ZCK_ASSERT(!w->sealed && root);
  *out = NULL;
  *count = 0;
  for (size_t i = 0; i < w->nrec; i++) {
    w->rec[i].shape = w->dims + w->dim_at[i];
    w->rec[i].stride = w->dims + w->dim_at[i] + w->rec[i].ndim;
  }
  zck_torch_named *v = NULL;
  size_t n = 0;
  ZCK_TRY(zck__torch_named_walk(w->out.path, rec_tensor_of, w, w->doc, root, &v, &n));
  /* every listed record named: a reader would list the others by index */
  bool *named = zck__calloc(w->nrec + 1, sizeof *named);
  if (!named) {
    zck_torch_named_free(v, n);
    return ZCK_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++) named[v[i].tensor - w->rec] = true;
  size_t unnamed = 0;
  for (size_t i = 0; i < w->nrec; i++) unnamed += !w->wrapped[i] && !named[i];
  free(named);
  if (unnamed) {
    zck_torch_named_free(v, n);
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: %zu tensors reached by no state-dict name", w->out.path, unnamed);
  }
  *out = v;
  *count = n;
  return ZCK_OK;
}

uint64_t zck_torch_writer_tensor_offset(const zck_torch_writer *w, const zck_torch_tensor *t) {
  return w->st[t->storage].data_offset + t->storage_offset * zck_dtype_size(t->dtype);
}

static void free_records(zck_torch_writer *w) {
  free(w->rec);
  free(w->dim_at);
  free(w->wrapped);
  free(w->dims);
  zck__ptrmap_free(&w->rec_of);
  w->rec = NULL, w->dim_at = NULL, w->wrapped = NULL, w->dims = NULL;
  w->nrec = w->caprec = w->ndims = w->capdims = 0;
}

static zck_status dump_pkl(zck_torch_writer *w, const zck_pk *root) {
  zck__buf_init(&w->pkl);
  /* sized up front, at ~19 bytes a node (a stage-3 model file of 100k params pickles to
   * ~19 MB, which doubling would copy and fault in about twice over); seal gives back the
   * rest */
  zck__buf_reserve(&w->pkl, zck_pk_doc_node_count(w->doc) * 24);
  zck_status st = zck_pickle_dump(root, &w->pkl);
  if (st != ZCK_OK) {
    zck__buf_free(&w->pkl);
    return zck__error_prepend(st, "%s: data.pkl", w->out.path);
  }
  return ZCK_OK;
}

zck_status zck_torch_writer_seal(zck_torch_writer *w, const zck_pk *root) {
  ZCK_ASSERT(!w->finished && !w->sealed && root);
  ZCK_TRY(dump_pkl(w, root));
  uint8_t *fit = w->pkl.len ? realloc(w->pkl.data, w->pkl.len) : NULL; /* kept until finish: no slack */
  if (fit) w->pkl.data = fit, w->pkl.cap = w->pkl.len;
  zck_pk_doc_free(w->doc);
  w->doc = NULL;
  free_records(w);
  w->sealed = true;
  return ZCK_OK;
}

/* .data/serialization_id: torch writes two %020u numbers (a hash of the record names and
 * the combined CRCs); it is only logged on load, so ours hashes the pickle instead. */
static void serialization_id(uint64_t pkl_xxh3, uint32_t pkl_crc, uint32_t all_crc, char out[40]) {
  put_decimal20(out, pkl_xxh3 % 10000000000000000000ULL);
  put_decimal20(out + 20, ((uint64_t)all_crc << 32 | pkl_crc) % 10000000000000000000ULL);
}

static void put_le32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* The finished file's bytes (still in its image, before the commit writes them out) and
 * where they depend on its one storage's data: false when they are not all in the image. */
static bool keep_pattern(zck_torch_writer *w, uint64_t pkl_xxh3, uint32_t pkl_crc, zck_torch_pattern *p) {
  uint64_t data_slots[2], sid_slots[2];
  if (w->n != 1 || !zck_zip_writer_crc_slots(w->zip, w->st[0].zip_index, data_slots) ||
      !zck_zip_writer_crc_slots(w->zip, w->n + 3, sid_slots)) /* byteorder, data/0, data.pkl, version, then it */
    return false;
  uint64_t len = zck_zip_writer_size(w->zip);
  uint8_t *bytes = len <= ((uint64_t)1 << 30) ? zck__malloc((size_t)len) : NULL;
  if (!bytes || !zck__outfile_image_read(&w->out, bytes, (size_t)len, 0)) {
    free(bytes);
    return false;
  }
  *p = (zck_torch_pattern){bytes, (size_t)len, w->st[0].data_offset, w->st[0].nbytes, {data_slots[0], data_slots[1]},
                           sid_slots[0] - 4 - 40, {sid_slots[0], sid_slots[1]}, pkl_xxh3, pkl_crc};
  return true;
}

void zck_torch_pattern_apply(const zck_torch_pattern *p, uint8_t *file, uint32_t *data_crc) {
  uint32_t crc = zck_crc32_update(0, file + p->data_off, (size_t)p->data_len);
  char sid[40];
  serialization_id(p->pkl_xxh3, p->pkl_crc, crc, sid);
  memcpy(file + p->sid_off, sid, 40);
  uint32_t sid_crc = zck_crc32_update(0, sid, 40);
  for (int k = 0; k < 2; k++) {
    put_le32(file + p->data_crc_at[k], crc);
    put_le32(file + p->sid_crc_at[k], sid_crc);
  }
  if (data_crc) *data_crc = crc;
}

void zck_torch_pattern_free(zck_torch_pattern *p) {
  free(p->bytes);
  memset(p, 0, sizeof *p);
}

static zck_status finish(zck_torch_writer *w, const zck_pk *root, zck_torch_pattern *pattern);

zck_status zck_torch_writer_finish(zck_torch_writer *w, const zck_pk *root) { return finish(w, root, NULL); }

zck_status zck_torch_writer_finish_pattern(zck_torch_writer *w, const zck_pk *root, zck_torch_pattern *p) {
  memset(p, 0, sizeof *p);
  return finish(w, root, p);
}

static zck_status finish(zck_torch_writer *w, const zck_pk *root, zck_torch_pattern *pattern) {
  ZCK_ASSERT(!w->finished && (w->sealed ? !root : root != NULL));
  uint32_t all_crc = 0;
  for (size_t i = 0; i < w->n; i++) {
    wstorage *s = &w->st[i];
    if (!s->crc_set) {
      if (atomic_load(&s->written) < s->nbytes)
        return zck__fail(ZCK_ERR_INVALID_ARG, "%s: storage %zu: data not completely written and no CRC was set",
                         w->out.path, i);
      ZCK_TRY(read_back_crc(w, s));
    }
    zck_zip_writer_set_crc(w->zip, s->zip_index, s->crc);
    all_crc = zck_crc32_combine(all_crc, s->crc, s->nbytes);
  }
  if (!w->sealed) ZCK_TRY(dump_pkl(w, root));
  zck__buf pkl = w->pkl;
  zck__buf_init(&w->pkl);
  zck_status st;
  char name[300];
  st = zck_zip_writer_add(w->zip, entry_name(name, w->prefix, "data.pkl"), pkl.data, pkl.len);
  char sid[40];
  uint64_t pkl_xxh3 = zck_xxh3(pkl.data, pkl.len);
  uint32_t pkl_crc = zck_crc32_update(0, pkl.data, pkl.len);
  serialization_id(pkl_xxh3, pkl_crc, all_crc, sid);
  zck__buf_free(&pkl);
  if (st == ZCK_OK) st = zck_zip_writer_add(w->zip, entry_name(name, w->prefix, "version"), "3\n", 2);
  if (st == ZCK_OK) st = zck_zip_writer_add(w->zip, entry_name(name, w->prefix, ".data/serialization_id"), sid, 40);
  if (st == ZCK_OK) st = zck_zip_writer_finish(w->zip);
  if (st == ZCK_OK && pattern && !keep_pattern(w, pkl_xxh3, pkl_crc, pattern)) memset(pattern, 0, sizeof *pattern);
  if (st == ZCK_OK) st = zck__outfile_commit(&w->out);
  if (st == ZCK_OK) w->finished = true;
  return st;
}

void zck_torch_writer_free(zck_torch_writer *w) {
  if (!w) return;
  if (!w->finished) zck__outfile_abort(&w->out);
  zck_zip_writer_free(w->zip);
  zck_pk_doc_free(w->doc);
  free_records(w);
  zck__buf_free(&w->pkl);
  free(w->st);
  free(w);
}
