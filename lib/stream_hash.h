/* stream_hash.h: the manifest hashes of a file computed from its bytes as they are
 * written, so that no job reads its output back to make its manifest (manifest.h).
 *
 * zckpt-manifest.json needs, per file, the XXH3-64 of the whole file, of each chunk_size
 * piece and of each tensor's bytes: sequential hashes, while a copy writes a file's bytes
 * from many threads in any order. A zck__shash follows the file front to back with a
 * cursor over segments that the writer laying the file out declares, in file order (the
 * zip writer does, zip.h zck_zip_writer_hash, so nothing else knows its layout):
 *   - bytes the writer knows (headers, small records, the directory): copied in;
 *   - regions (a record's data), filled by pieces fed from the copy's threads at any
 *     offset (zck__shash_feed, e.g. from the executor's `written` hook or a write callback)
 *     or known up front (zck__shash_known); the bytes of a region nothing is declared to
 *     write (zck__shash_cover) are zeros, as ftruncate leaves them. Each region gets its
 *     own XXH3 and CRC-32;
 *   - deferred bytes made from a region's CRC-32 (a zip data descriptor): the writer's
 *     callback makes them when the cursor reaches them, from the CRC the stream computed;
 *     the writer later checks that CRC against its own (zck__shash_check_crc).
 * A piece fed ahead of the cursor is copied into a buffer bounded by a budget shared by
 * the files; past it the file stops streaming and zck__shash_finish reads the rest back
 * (zck__shash_reread says how much). Segments may be added while streaming (a zip writer
 * adds data.pkl and its directory at finish), never while a copy writes into the file.
 * A hasher that was fed inconsistent pieces (overlapping, outside the cover) or whose
 * stream disagrees with the file ends "not done": the caller then hashes the file itself.
 */
#ifndef ZCK_STREAM_HASH_H
#define ZCK_STREAM_HASH_H

#include "exec.h"
#include "manifest.h"
#include "util.h"

#include <stdatomic.h>

typedef struct zck__shash zck__shash;

/* Bytes buffered ahead of the cursors, over every file sharing it. */
typedef struct zck__shash_budget {
  _Atomic uint64_t used;
  uint64_t max;
} zck__shash_budget;

/* The max of a writer's budget: 64 MiB. A job whose copy could run further ahead of its
 * files' cursors than that orders it otherwise (exec.h verify_first). Tests lower it to
 * reach that case with small files (0: back to 64 MiB); not thread-safe with a job running. */
uint64_t zck__shash_default_budget(void);
void zck__shash_set_default_budget(uint64_t bytes);

/* Deferred bytes: writes len bytes to out, given the CRC-32 of the region they follow.
 * Called with the hasher's lock held, from any thread. */
typedef void (*zck__shash_defer_fn)(void *ctx, size_t id, uint32_t region_crc, uint8_t *out, size_t len);

zck__shash *zck__shash_new(void);
void zck__shash_free(zck__shash *h);

/* ---- layout, in file order (each segment starts where the previous one ended) */
void zck__shash_bytes(zck__shash *h, uint64_t off, const void *bytes, uint64_t n);
/* known: the region's bytes when the writer has them now (a small record), else NULL. */
void zck__shash_region(zck__shash *h, uint64_t off, uint64_t len, const void *known);
void zck__shash_defer(zck__shash *h, uint64_t off, uint64_t len, zck__shash_defer_fn fn, void *ctx, size_t id);
/* Bytes [off, off + len) of a region will be written (fed); the rest of it stays zeros. */
void zck__shash_cover(zck__shash *h, uint64_t off, uint64_t len);
/* Bytes of a region known now (written directly, not by a copy): covered and fed. Before
 * zck__shash_start, as zck__shash_cover. */
void zck__shash_known(zck__shash *h, uint64_t off, const void *bytes, uint64_t n);
/* No hashes wanted after all: drops everything held; later calls do nothing. */
void zck__shash_stop(zck__shash *h);
/* The regions' CRC-32s are not wanted (a file with no deferred bytes, whose writer never
 * calls zck__shash_check_crc: a safetensors file): the stream does not compute them
 * (a deferred segment or a check then drops the hashes, and the caller hashes the file). */
void zck__shash_no_crc(zck__shash *h);

/* ---- streaming */
/* After the covers: the stream starts (chunk_size 0: ZCK_MANIFEST_DEFAULT_CHUNK). */
zck_status zck__shash_start(zck__shash *h, zck__shash_budget *budget, uint64_t chunk_size);
/* n bytes written at off, inside one region, with their CRC-32 (NULL: not known, the
 * hasher computes it as it hashes them). Any thread, any order. */
void zck__shash_feed(zck__shash *h, uint64_t off, const void *bytes, uint64_t n, const uint32_t *crc);
/* The same for n bytes that may span several regions (a raw copy's piece): fed region by
 * region. */
void zck__shash_feed_split(zck__shash *h, uint64_t off, const void *bytes, uint64_t n);
/* The writer's CRC-32 of the region at off: a different one than the stream's means the
 * stream did not see what was written, and the hashes are dropped. */
void zck__shash_check_crc(zck__shash *h, uint64_t off, uint32_t crc);

/* ---- results */
/* After the file is complete at path: reads back what the stream did not reach (not
 * counted as an error: *reread bytes) and finalizes. ZCK_OK also when the hashes had to
 * be dropped (zck__shash_done false); an error only when the file cannot be read. */
zck_status zck__shash_finish(zck__shash *h, const char *path, uint64_t *reread);
/* The same for a file whose writer laid out every byte of it through h and wrote it
 * without error (a torch or zip writer made with h, finished): its size is where h's
 * layout ends, so when the stream has it all the file system is not asked (one stat less
 * per file; the manifest writer still checks the size on disk). */
zck_status zck__shash_finish_laid_out(zck__shash *h, const char *path, uint64_t *reread);
bool zck__shash_done(const zck__shash *h);
uint64_t zck__shash_streamed(const zck__shash *h);
/* The file's hashes for zck__manifest_write_dir_known: path is borrowed; chunks and ranges
 * (one per region) are malloc'd (the caller frees both). Not done: out->hashed false. */
zck_status zck__shash_known_file(const zck__shash *h, const char *relpath, zck__manifest_known_file *out);

/* ---- helpers for writers */
/* A target store over fd bytes [base, ...) that writes as a ZCK_STORE_FD store does
 * (pwrite) and feeds h (may be NULL) with what it wrote at file offset base + byte offset:
 * for writers whose file the executor fills directly (a safetensors shard, a raw copy).
 * ctx lives as long as the store; it is filled here. */
typedef struct zck__shash_fd {
  int fd;
  uint64_t base;
  size_t es;
  zck__shash *h;
  const char *name;          /* borrowed: the file, in write errors */
} zck__shash_fd;
zck_store zck__shash_fd_store(zck__shash_fd *ctx, int fd, uint64_t base, zck_dtype dtype, uint64_t numel,
                              const char *name, zck__shash *h);
/* The same over a callback target store that writes its elements at file offset base + byte
 * offset (a torch writer's storage): *inner is copied into ctx. */
typedef struct zck__shash_wrap {
  zck_store inner;
  uint64_t base;
  size_t es;
  zck__shash *h;
} zck__shash_wrap;
zck_store zck__shash_wrap_store(zck__shash_wrap *ctx, const zck_store *inner, uint64_t base, zck__shash *h);

/* A manifest's list of known files whose every pointer is owned by it (path, chunks,
 * ranges, tensors: one allocation whose names are static): zck__known_take moves f in (f's pointers
 * must be malloc'd; path is copied), zck__known_free frees them all. */
zck_status zck__known_take(zck__manifest_known *k, size_t *cap, zck__manifest_known_file *f, const char *relpath);
void zck__known_free(zck__manifest_known *k);
/* A small file written whole from memory (a JSON side file, an index): its hashes from
 * those bytes, checked against the file's size at path, into k as relpath. */
zck_status zck__known_bytes(zck__manifest_known *k, size_t *cap, const char *path, const char *relpath,
                            const void *bytes, uint64_t n);
/* Moves every file of src into dst (src's file list is emptied; both owned lists). */
zck_status zck__known_merge(zck__manifest_known *dst, size_t *cap, zck__manifest_known *src);

/* Bytes the manifests written by this process had to read back from their files (the
 * files or remainders no writer hashed as written): what tests check is 0. */
void zck__manifest_count_reread(uint64_t bytes);
uint64_t zck__manifest_reread_total(void);

#endif
