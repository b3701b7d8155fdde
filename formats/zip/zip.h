/* zip.h: the zip container of torch.save archives.
 *
 * Reader: parses the end-of-central-directory record (ZIP64 included) and the central
 * directory; every entry is then a (data offset, size) pair in the source, so tensor data
 * is read in place, never copied through the container. Only stored (method 0) entries
 * carry data zckpt reads; others are listed but reading them is ZCK_ERR_UNSUPPORTED.
 *
 * Writer: reserve-then-fill, so many threads can write entry data with pwrite at known
 * offsets. Data starts at 64-byte aligned offsets (as torch writes, so mmap'd tensors are
 * aligned). CRC32s are per entry, combinable from per-range CRCs (zck_crc32_combine).
 */
#ifndef ZCK_ZIP_H
#define ZCK_ZIP_H

#include "io.h"

typedef struct zck_zip_entry {
  char *name;
  uint64_t data_offset;   /* absolute offset of the first data byte in the source */
  uint64_t size;          /* uncompressed size (== compressed size for stored entries) */
  uint64_t comp_size;
  uint32_t crc32;
  uint16_t method;        /* 0 = stored */
} zck_zip_entry;

typedef struct zck_zip zck_zip;

/* Opens the archive in src (which must outlive the zck_zip). Validates the directory:
 * offsets/sizes inside the file, no overlapping entries, sane names, record counts. */
zck_status zck_zip_open(const zck__source *src, zck_zip **out);
void zck_zip_close(zck_zip *z);
size_t zck_zip_count(const zck_zip *z);
const zck_zip_entry *zck_zip_entry_at(const zck_zip *z, size_t i);
/* Exact-name lookup (hash table); NULL if absent. */
const zck_zip_entry *zck_zip_find(const zck_zip *z, const char *name);
const zck__source *zck_zip_source(const zck_zip *z);
/* Reads the whole of a stored entry into dst (entry->size bytes) and checks its CRC. */
zck_status zck_zip_read_entry(const zck_zip *z, const zck_zip_entry *e, void *dst);
/* Reads a range of a stored entry (no CRC check: partial). */
zck_status zck_zip_read_range(const zck_zip *z, const zck_zip_entry *e, void *dst, uint64_t n, uint64_t off);

/* ---- checked copy (zip_copy.c), for a job that puts an archive into its output as it is */
struct zck__manifest_known_file;
/* Copies the archive's bytes into out at the same offsets in one pass through a bounded buffer, checking the
 * CRC-32 of every record as its bytes go by: DAMAGED, naming the archive and the record, on the first mismatch;
 * UNSUPPORTED for a compressed record (its CRC is of other bytes). The caller commits out only on ZCK_OK.
 * known (NULL: none): on ZCK_OK, the copy's manifest hashes from the same bytes (size, XXH3 of the file and of each
 * chunk_size piece (0: the manifest's default), one range per record; chunks and ranges malloc'd, path left NULL),
 * so that the manifest of the output does not read the copy back. */
zck_status zck_zip_copy_checked(const zck_zip *z, zck__outfile *out, uint64_t chunk_size,
                                struct zck__manifest_known_file *known);
/* The file `from` opened (its structure checked as zck_zip_open does) and copied so into `to` (created, committed
 * only once every record checked; nothing at `to` otherwise). */
zck_status zck_zip_copy_file_checked(const char *from, const char *to, uint64_t chunk_size,
                                     struct zck__manifest_known_file *known);

/* ---- writer */
typedef struct zck_zip_writer zck_zip_writer;

/* Writes into an outfile the caller created and later commits. */
zck_status zck_zip_writer_create(zck__outfile *out, zck_zip_writer **w);
/* Reserves an entry of `size` bytes: returns its index and the absolute offset where the
 * caller must write its data. Data offsets are 64-byte aligned. */
zck_status zck_zip_writer_reserve(zck_zip_writer *w, const char *name, uint64_t size, size_t *index,
                                  uint64_t *data_offset);
/* An archive that starts at file offset `base` of out rather than at 0: one item among
 * others in a larger file (torch DCP's .distcp files hold one torch.save archive per item).
 * The offsets it records are relative to its own start, as torch.save writing to a stream
 * records them; the 64-byte alignment too; reserve returns absolute file offsets. */
zck_status zck_zip_writer_create_at(zck__outfile *out, uint64_t base, zck_zip_writer **w);
/* The archive's length once finished with the entries reserved so far (directory and end
 * records included): where the next item of a file may start. */
uint64_t zck_zip_writer_size(const zck_zip_writer *w);
/* Where entry `index`'s CRC-32 lies in the file once the archive is finished (absolute
 * offsets: in its data descriptor, in its central-directory record), so a caller can finish
 * an archive before its data is written and put the CRC there when it is known, keeping
 * no writer per archive meanwhile. False for an empty entry (no descriptor; CRC 0). */
bool zck_zip_writer_crc_slots(const zck_zip_writer *w, size_t index, uint64_t slots[2]);
/* Records the CRC32 of a reserved entry's data (computed by whoever wrote it). */
void zck_zip_writer_set_crc(zck_zip_writer *w, size_t index, uint32_t crc);
/* reserve + pwrite + crc in one call, for small entries (data.pkl, version, ...). */
zck_status zck_zip_writer_add(zck_zip_writer *w, const char *name, const void *data, uint64_t size);
/* Hands every byte the writer lays out to h as soon as it is known (stream_hash.h: local
 * headers and data regions at reserve, descriptors from the data's CRC, small entries'
 * data, the directory at finish), so a manifest's hashes follow the file as it is written.
 * Call before the first reserve; h must outlive the writer's finish. */
struct zck__shash;
void zck_zip_writer_hash(zck_zip_writer *w, struct zck__shash *h);
/* Testing aid: write every entry with ZIP64 extra fields and sentinel values, and the end
 * record with sentinels, as if the archive were larger than 4 GiB. Call before the first
 * reserve. */
void zck_zip_writer_force_zip64(zck_zip_writer *w, bool on);
/* Writes local headers, central directory, ZIP64 records when needed, end record. */
zck_status zck_zip_writer_finish(zck_zip_writer *w);
void zck_zip_writer_free(zck_zip_writer *w);

/* CRC32 (zlib's polynomial). combine(crc(A), crc(B), len(B)) == crc(A||B). */
uint32_t zck_crc32(uint32_t crc, const void *data, size_t n);
uint32_t zck_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

#endif
