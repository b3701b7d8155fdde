/* h5_checksums.h: the checksum table of a file the HDF5 writer makes (zck_h5.h, "checksum
 * table"): the XXH3-64 of every piece of every dataset as written, each bound to the
 * dataset's path, dtype, shape and the piece's place, so a dataset that is valid HDF5 with
 * other contents (two swapped by name, one edited in place and recompressed, one deleted
 * and made again) is refused when it is read, not only a damaged chunk.
 *
 * A piece is a run of the row-major flattening cut by the writer's chunk geometry for a
 * target of ZCK__H5C_PIECE_ATTR bytes (so, as written, a piece is a chunk: the reader
 * decompresses nothing more to check one); but pieces are defined by the shape alone, so
 * they hold whatever storage layout a dataset has. The writer hashes each chunk as it
 * compresses it; the reader hashes each piece a read touches (reading a partly wanted
 * piece whole) and looks it up in the table, so every range read is checked on its own.
 * The table is a set (sorted): what binds an entry to its place is its seed. */
#ifndef ZCK_H5_CHECKSUMS_H
#define ZCK_H5_CHECKSUMS_H

#include <stdbool.h>
#include <stdint.h>

#include "hdf5/zck_h5.h"

/* The table: a uint64 [n] dataset, its entries sorted ascending. */
#define ZCK__H5C_TABLE "/zckpt_checksums"
/* Root attributes (covered by the root's attribute digest): the XXH3-64 of the table's
 * bytes, and the piece target in bytes. */
#define ZCK__H5C_TABLE_ATTR "zckpt_checksums_xxh3"
#define ZCK__H5C_PIECE_ATTR "zckpt_checksum_piece_bytes"

/* How a dataset is cut into pieces: (1, .., 1, ck, D[k+1], ..) runs, as zck__h5w_chunking. */
typedef struct zck__h5c_geom {
  int k;
  uint64_t slab;         /* elements of one index of the dims before k: D[k] * inner */
  uint64_t inner;        /* product of the dims after k */
  uint64_t ck;           /* indices of dim k per piece */
  uint64_t per_prefix;   /* pieces per slab */
  uint64_t n;            /* pieces; an empty or 0-dim tensor has one */
} zck__h5c_geom;

/* A dataset's pieces and seed: the writer keeps one per dataset (with its hashes), the
 * reader makes one per read. */
typedef struct zck__h5c_ds {
  bool on;
  zck__h5c_geom g;
  uint64_t numel;
  uint64_t seed;         /* XXH3 of path, dtype, shape */
  uint64_t *sums;        /* writer: the piece hashes as written (n of them) */
} zck__h5c_ds;

typedef struct zck__h5c_table {
  uint64_t *v;           /* sorted */
  size_t n;
  uint64_t piece_bytes;
} zck__h5c_table;

/* Geometry and seed of a dataset at path (a leading '/' is implied) with elements of
 * dtype and shape dims. */
void zck__h5c_ds_setup(zck__h5c_ds *c, const char *path, zck_dtype dtype, int ndim, const uint64_t *dims,
                       uint64_t piece_bytes);
/* The geometry alone (c->seed 0), and the seed alone: a reader keeps only the seed of each
 * dataset it opens (100k-param containers have 300k) and cuts pieces as it reads. */
void zck__h5c_geometry(zck__h5c_ds *c, zck_dtype dtype, int ndim, const uint64_t *dims, uint64_t piece_bytes);
uint64_t zck__h5c_seed(const char *path, zck_dtype dtype, int ndim, const uint64_t *dims);
/* Piece i's elements [*first, *first + *count). */
void zck__h5c_piece(const zck__h5c_ds *c, uint64_t i, uint64_t *first, uint64_t *count);
/* The entry of piece i holding bytes. */
uint64_t zck__h5c_hash(const zck__h5c_ds *c, uint64_t i, const void *bytes, size_t n);

// ---- writer (h5_write.c hooks)

/* The writer's chunks of d must be its pieces; allocates its hash slots. */
zck_status zck__h5c_writer_ds(const char *label, zck__h5c_ds *c, const char *path, zck_dtype dtype, int ndim,
                              const uint64_t *dims, uint64_t piece_bytes, bool chunked, uint64_t chunk_elems,
                              uint64_t n_chunks);
/* Chunk id of d is complete in buf (its elements first): records its hash. */
void zck__h5c_writer_chunk(zck__h5c_ds *c, uint64_t id, const void *buf, size_t es);
/* At the commit, once every chunk is in: the table dataset and its root attributes, of the
 * hashes of ds[0..n) and settled[0..n_settled) (those of datasets already let go of). */
zck_status zck__h5c_writer_table(zck_h5_writer *w, zck__h5c_ds *const *ds, size_t n, const uint64_t *settled,
                                 size_t n_settled, uint64_t piece_bytes);

// ---- reader (h5_read.c hooks)

/* Loads the table of f if its root says it has one (*t stays NULL otherwise): its bytes
 * must match ZCK__H5C_TABLE_ATTR (DAMAGED) and be sorted. */
zck_status zck__h5c_load(zck_h5_file *f, uint64_t table_xxh3, uint64_t piece_bytes, zck__h5c_table **t);
void zck__h5c_table_free(zck__h5c_table *t);
/* The table f loaded at open; NULL when it has none. */
const zck__h5c_table *zck__h5_file_table(const zck_h5_file *f);
/* d's pieces (0 when its file has no table). */
uint64_t zck__h5_dataset_pieces(const zck_h5_dataset *d);

typedef zck_status (*zck__h5c_read_fn)(void *ctx, void *dst, uint64_t first, uint64_t count);
/* Elements [first, first + count) through read, every piece they touch read whole and
 * looked up in t: DAMAGED "<label>: damaged: ..." naming the piece when one is not there. */
zck_status zck__h5c_read(const zck__h5c_ds *c, const zck__h5c_table *t, const char *label, size_t es,
                         zck__h5c_read_fn read, void *ctx, void *dst, uint64_t first, uint64_t count);

#endif
