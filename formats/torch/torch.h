/* torch.h: torch.save / torch.load files (.pt) on top of zip.h and pickle.h.
 *
 * A .pt file (torch >= 1.6, the zip format) is a stored zip whose entries share one
 * folder prefix:  <p>/data.pkl (protocol-2 pickle of the saved object), <p>/data/<key>
 * (raw little-endian bytes of each storage), <p>/version ("3\n"), and in torch 2.1+
 * <p>/byteorder ("little") and <p>/.data/serialization_id. Tensors in the pickle are
 *   torch._utils._rebuild_tensor_v2(PERSID('storage', torch.XStorage, key, loc, numel),
 *                                   storage_offset, size, stride, requires_grad, OrderedDict())
 * (or _rebuild_tensor_v3 with an UntypedStorage + dtype global for float8 / uint16+),
 * possibly wrapped by _rebuild_parameter(_with_state) or _rebuild_from_type_v2.
 *
 * Reader: opens the zip, loads data.pkl into a zck_pk tree (nothing is executed; unknown
 * classes such as DeepSpeed's stay inert OBJECT nodes), and resolves every tensor node into
 * a zck_torch_tensor record, validated against its storage record (key, type, size,
 * dtype, shape, strides and offset within the storage). Tensor data is then read in place: one pread for a contiguous
 * range, a bounded gather for strided views; never the whole storage for part of a tensor.
 *
 * Writer: reserve-then-fill on top of the zip writer. Storages are reserved first (their
 * absolute file offsets are returned, so copy executors can pwrite from many threads);
 * tensor nodes are built into the object tree; finish() emits data.pkl, byteorder,
 * version and .data/serialization_id and commits the file atomically. Files load with
 * torch.load in 1.13 and 2.x, and with weights_only=True when the tree holds only
 * tensors, dicts, OrderedDicts, lists, tuples, str, int, bool, None (floats need 2.x).
 * Entry order: byteorder, data/0..n-1, data.pkl, version, .data/serialization_id
 * (data.pkl comes after the storages because its size is known only at finish; torch
 * takes the prefix from central-directory entry #0 and does not care about order).
 */
#ifndef ZCK_TORCH_H
#define ZCK_TORCH_H

#include "pickle/pickle.h"
#include "exec.h"
#include "zip/zip.h"

#define ZCK_TORCH_MAX_DIMS 64

/* ---- reader */
typedef struct zck_torch_file zck_torch_file;

typedef struct zck_torch_storage {
  const char *key;              /* "0", "1", ... (an int key is printed in decimal) */
  zck_dtype dtype;              /* from the storage class; ZCK_U8 for UntypedStorage */
  uint64_t numel;               /* elements of dtype (bytes for UntypedStorage) */
  uint64_t nbytes;              /* numel * element size == the record's size */
  uint64_t data_offset;         /* absolute offset of the first byte in the .pt file */
  const zck_zip_entry *entry;   /* <p>/data/<key> */
  const char *location;         /* "cpu", "cuda:0", ... (ignored: bytes are CPU bytes) */
} zck_torch_storage;

typedef struct zck_torch_tensor {
  const zck_pk *node;           /* the tree node this record describes */
  size_t storage;               /* index for zck_torch_storage_at */
  zck_dtype dtype;              /* element type of the tensor (v3: its dtype argument) */
  int ndim;                     /* 0 for a scalar */
  const int64_t *shape;         /* ndim sizes, each >= 0 */
  const int64_t *stride;        /* ndim strides in elements, each >= 0 */
  uint64_t storage_offset;      /* elements of dtype from the start of the storage */
  uint64_t numel;               /* product of shape (1 for ndim 0) */
  int requires_grad;
  int is_parameter;             /* from _rebuild_parameter(_with_state) / Parameter type */
} zck_torch_tensor;

typedef struct zck_torch_open_opts {
  zck_pk_limits limits;         /* for the pickle VM */
  uint64_t max_pickle_bytes;    /* data.pkl larger than this is ZCK_ERR_LIMIT; default 1 GiB */
} zck_torch_open_opts;
#define ZCK_TORCH_OPEN_OPTS_INIT {ZCK_PK_LIMITS_INIT, (uint64_t)1 << 30}

/* Opens a .pt file. opts may be NULL. Errors: "PATH: what is wrong" (a legacy non-zip
 * file is ZCK_ERR_UNSUPPORTED "legacy torch serialization (pre-1.6 / non-zip) not
 * supported"; a TorchScript archive is ZCK_ERR_UNSUPPORTED too). */
zck_status zck_torch_open(const char *path, const zck_torch_open_opts *opts, zck_torch_file **out);
/* Same over an already open source (a file or memory); src must outlive the file. */
zck_status zck_torch_open_source(const zck__source *src, const zck_torch_open_opts *opts,
                                 zck_torch_file **out);
void zck_torch_close(zck_torch_file *f);

const char *zck_torch_name(const zck_torch_file *f);     /* the path / source name */
const char *zck_torch_prefix(const zck_torch_file *f);   /* archive folder, e.g. "archive" */
const zck_pk *zck_torch_root(const zck_torch_file *f);   /* the unpickled object */
const zck_pk_doc *zck_torch_doc(const zck_torch_file *f);
const zck_zip *zck_torch_zip(const zck_torch_file *f);
const zck__source *zck_torch_source(const zck_torch_file *f);

size_t zck_torch_storage_count(const zck_torch_file *f);
const zck_torch_storage *zck_torch_storage_at(const zck_torch_file *f, size_t i);

/* Tensors in pickle order. A Parameter counts once (its inner tensor node is reachable
 * through zck_torch_tensor_of but is not listed here). */
size_t zck_torch_tensor_count(const zck_torch_file *f);
const zck_torch_tensor *zck_torch_tensor_at(const zck_torch_file *f, size_t i);
/* The tensor a tree node stands for, or NULL if the node is not a tensor. */
const zck_torch_tensor *zck_torch_tensor_of(const zck_torch_file *f, const zck_pk *node);

/* (name, tensor) pairs of a state dict: every tensor reachable from `dict` through dicts
 * (str or int keys) and lists/tuples, named with '.'-joined keys / indices
 * ("module.layers.0.weight"), in insertion order. Non-tensor leaves, objects other than
 * tensors, keys that are neither str nor int, and containers holding themselves are
 * skipped. A tensor reachable twice (tied weights) is listed under both names. Fails with
 * ZCK_ERR_FORMAT on a name reached twice (duplicate keys), ZCK_ERR_LIMIT past 256 levels
 * or when shared containers would multiply the names beyond 16x the pickle's objects.
 * Free with zck_torch_named_free. */
typedef struct zck_torch_named {
  char *name;
  const zck_torch_tensor *tensor;
} zck_torch_named;
zck_status zck_torch_state_dict(const zck_torch_file *f, const zck_pk *dict, zck_torch_named **out,
                                size_t *count);
void zck_torch_named_free(zck_torch_named *v, size_t count);

/* ---- tensor data in place */
const zck_torch_storage *zck_torch_tensor_storage(const zck_torch_file *f, const zck_torch_tensor *t);
uint64_t zck_torch_tensor_numel(const zck_torch_tensor *t);
uint64_t zck_torch_tensor_nbytes(const zck_torch_tensor *t);
/* 1 if the elements are dense in row-major order (size-1 dims ignored; numel <= 1 is). */
int zck_torch_tensor_contiguous(const zck_torch_tensor *t);
/* Absolute byte offset of element 0 in the .pt file (meaningful for contiguous tensors:
 * the tensor's bytes are [off, off + nbytes)). */
uint64_t zck_torch_tensor_file_offset(const zck_torch_file *f, const zck_torch_tensor *t);
/* Copies elements [first_elem, first_elem + count) of the row-major flattening of t into
 * dst (count * element size bytes). Contiguous ranges are one read; strided views gather
 * through a bounded buffer. A storage record of at most ZCK_TORCH_SMALL_RECORD bytes (a
 * `step`, a loss scale, a small view) is read whole and its zip CRC-32 checked. */
#define ZCK_TORCH_SMALL_RECORD ((uint64_t)1 << 20)
zck_status zck_torch_tensor_read(const zck_torch_file *f, const zck_torch_tensor *t, void *dst,
                                 uint64_t first_elem, uint64_t count);
/* The zip record holding t's storage, for a store that reads t in place (exec.h verify on
 * read): byte range and CRC-32; what is left NULL. False for a record zckpt cannot read
 * in place (compressed). */
bool zck_torch_tensor_record(const zck_torch_file *f, const zck_torch_tensor *t, zck_record_check *out);

/* ZCK_OK if torch.load(weights_only=True) (torch 2.6+ allowlist) would accept the file;
 * otherwise ZCK_ERR_UNSUPPORTED naming the first global (or opcode) it would reject:
 * "PATH: weights_only: global numpy.core.multiarray.scalar is not allowed". */
zck_status zck_torch_check_weights_only(const zck_torch_file *f);

/* ---- writer */
typedef struct zck_torch_writer zck_torch_writer;

/* The archive folder torch.save names inside a file saved at `path` (torch 2.x
 * PyTorchStreamWriter): the last path component up to its last '.' ("x/y/foo.pt" ->
 * "foo", "a.b.pt" -> "a.b"). zckpt's writer does the same, so a rank file copied over
 * another one still says whose it is (formats/deepspeed checks it). Where torch would
 * refuse the name (empty stem) or the stem is unusable in a zip ('.', over cap - 1
 * bytes), "archive", the folder older zckpt files carry. */
void zck_torch_archive_name(const char *path, char *buf, size_t cap);

/* Creates PATH (written under a temporary name; atomically renamed at finish). */
zck_status zck_torch_writer_create(const char *path, zck_torch_writer **out);
/* The same, its zip writer telling h every byte it lays out (zip.h zck_zip_writer_hash):
 * the file's manifest hashes are then made as it is written. */
struct zck__shash;
zck_status zck_torch_writer_create_hashed(const char *path, struct zck__shash *hash, zck_torch_writer **out);
/* The document that owns the nodes of the tree to save (zck_pk_new_* with it). */
zck_pk_doc *zck_torch_writer_doc(zck_torch_writer *w);
/* Reserves storage `data/<index>` of numel elements of dtype; returns its index and the
 * absolute offset in the output file where its numel * size bytes go. */
zck_status zck_torch_writer_add_storage(zck_torch_writer *w, zck_dtype dtype, uint64_t numel,
                                        size_t *storage_index, uint64_t *data_file_offset);
/* A tensor node viewing a storage (strides and offset in elements). _rebuild_tensor_v2
 * with a torch.XStorage for dtypes that have one, else _rebuild_tensor_v3 with
 * torch.storage.UntypedStorage (uint16/32/64, float8: torch >= 2.1/2.3 only). shape and
 * stride may be NULL when ndim is 0; stride NULL means contiguous. NULL on a geometry
 * that does not fit the storage (error set). */
zck_pk *zck_torch_writer_tensor(zck_torch_writer *w, size_t storage_index, int ndim, const int64_t *shape,
                                const int64_t *stride, uint64_t storage_offset, int requires_grad);
/* Wraps a tensor node into an nn.Parameter (_rebuild_parameter). */
zck_pk *zck_torch_writer_parameter(zck_torch_writer *w, zck_pk *tensor, int requires_grad);
/* pwrite of nbytes at byte_off inside storage data. Any thread may write any range at
 * any time before finish (no checksum is kept here). A storage whose CRC is not given
 * by set_crc gets it at finish by reading its bytes back from the file: fine for small
 * storages; big ones come from an executor that computed the CRC as it wrote. */
zck_status zck_torch_writer_write(zck_torch_writer *w, size_t storage_index, const void *data, size_t nbytes,
                                  uint64_t byte_off);
/* The CRC-32 of a storage's complete data (combine per-range CRCs with
 * zck_crc32_combine). */
void zck_torch_writer_set_crc(zck_torch_writer *w, size_t storage_index, uint32_t crc);
/* The tensors under root by state-dict name, as zck_torch_state_dict names them in the
 * finished file (its records: dtype, shape, stride, storage offset, as a reader resolves
 * them), so a caller describes the file without reading it back. ZCK_ERR_NOT_FOUND when a
 * tensor of the file is reached by no name (a reader would list it by index), or the
 * names collide. Valid until zck_torch_writer_seal / free; free the array with
 * zck_torch_named_free. */
zck_status zck_torch_writer_named(zck_torch_writer *w, const zck_pk *root, zck_torch_named **out, size_t *count);
/* Absolute byte offset in the file of element 0 of a tensor of zck_torch_writer_named. */
uint64_t zck_torch_writer_tensor_offset(const zck_torch_writer *w, const zck_torch_tensor *t);
/* Pickles root now and frees the tree (the document and every node): a writer holding many
 * files open while their data is copied keeps each one's data.pkl bytes, not its tree.
 * No tensor or node may be added after; finish then takes root NULL. */
zck_status zck_torch_writer_seal(zck_torch_writer *w, const zck_pk *root);
/* Pickles root (NULL after zck_torch_writer_seal), writes the remaining entries and the
 * directory, commits the file. */
zck_status zck_torch_writer_finish(zck_torch_writer *w, const zck_pk *root);
/* Frees the writer; an unfinished file is removed. NULL is fine. */
void zck_torch_writer_free(zck_torch_writer *w);

/* A finished file of one storage as the pattern of others with the same tree and storage
 * size, which differ from it only in the storage's bytes, the storage's CRC-32 (in its data
 * descriptor and its directory record) and .data/serialization_id (and that record's CRC):
 * a universal folder's per-parameter files, three per parameter, most of them of a few
 * shapes, are then each one copy of the pattern, the data, and apply. */
typedef struct zck_torch_pattern {
  uint8_t *bytes;             /* the whole file; NULL: no pattern */
  size_t len;
  uint64_t data_off, data_len;/* the storage's bytes */
  uint64_t data_crc_at[2];    /* where its CRC-32 is */
  uint64_t sid_off;           /* .data/serialization_id's 40 bytes */
  uint64_t sid_crc_at[2];
  uint64_t pkl_xxh3;          /* what the serialization id is made of */
  uint32_t pkl_crc;
} zck_torch_pattern;
/* zck_torch_writer_finish, the file's pattern kept in *p (p->bytes NULL when it cannot be:
 * more than one storage, an empty one, or bytes no longer in memory). */
zck_status zck_torch_writer_finish_pattern(zck_torch_writer *w, const zck_pk *root, zck_torch_pattern *p);
/* file: p->len bytes, a copy of p->bytes with other data at p->data_off; makes it the file
 * zck_torch_writer_finish would have written for that data. *data_crc (may be NULL): the
 * data's CRC-32. */
void zck_torch_pattern_apply(const zck_torch_pattern *p, uint8_t *file, uint32_t *data_crc);
void zck_torch_pattern_free(zck_torch_pattern *p);

/* ---- a file exactly as torch.save writes it (torch_save.c), for a tree complete before
 * its data: create; build the tree in the saver's doc (nodes of other docs may be part of
 * it: they must outlive layout), with one zck_torch_saver_tensor per tensor, called in the
 * order the pickle reaches them; layout (pickles the tree and reserves every storage);
 * write each storage's bytes at its data offset and set its CRC-32; finish (commits the
 * file). Only dtypes with a torch.<X>Storage class. */
typedef struct zck_torch_saver zck_torch_saver;
zck_status zck_torch_saver_create(const char *path, zck_torch_saver **out);
zck_pk_doc *zck_torch_saver_doc(zck_torch_saver *s);
/* A contiguous tensor owning a new storage (NULL with the error set). */
zck_pk *zck_torch_saver_tensor(zck_torch_saver *s, zck_dtype dtype, int ndim, const int64_t *shape);
zck_status zck_torch_saver_layout(zck_torch_saver *s, const zck_pk *root);
size_t zck_torch_saver_storage_count(const zck_torch_saver *s);
uint64_t zck_torch_saver_data_offset(const zck_torch_saver *s, size_t storage);   /* absolute */
zck_status zck_torch_saver_write(zck_torch_saver *s, const void *data, size_t n, uint64_t file_off);
void zck_torch_saver_set_crc(zck_torch_saver *s, size_t storage, uint32_t crc);
zck_status zck_torch_saver_finish(zck_torch_saver *s);
void zck_torch_saver_free(zck_torch_saver *s);   /* an unfinished file is removed; NULL is fine */

/* ---- .data/serialization_id (torch_serial_id.c)
 * The 40 digits torch.save writes there for records names[0..n) (without the archive
 * folder) written in that order, with their data's CRC-32s and sizes: the same digits as
 * torch 2.x built with libstdc++ (the official builds). */
zck_status zck_torch_serialization_id(const char *const *names, const uint32_t *crcs, const uint64_t *sizes, size_t n,
                                      char out[40]);

/* ---- one torch.save archive inside a larger file (torch_item.c): a torch DCP item */
/* Writes, at byte `base` of out, what torch.save(t) writes for a contiguous tensor t of
 * dtype and shape that owns its storage, all but its data and the data's CRC-32.
 * *data_off: the absolute offset where its bytes go (the caller writes them), *len: the
 * archive's whole length, crc_slots: where zck_torch_item_set_crc puts the CRC. */
zck_status zck_torch_item_tensor(zck__outfile *out, uint64_t base, zck_dtype dtype, int ndim, const int64_t *shape,
                                 uint64_t *data_off, uint64_t *len, uint64_t crc_slots[2]);
/* The CRC-32 of a tensor item's data, once written (nothing for an empty tensor). */
zck_status zck_torch_item_set_crc(zck__outfile *out, const uint64_t crc_slots[2], uint32_t crc);
/* Writes, at byte `base` of out, what torch.save(obj) writes for the object root stands for
 * (no tensor in it); *len: the archive's length. */
zck_status zck_torch_item_object(zck__outfile *out, uint64_t base, const zck_pk *root, uint64_t *len);

#endif
