/* h5_internal.h: what the HDF5 writer, reader and container code share. */
#ifndef ZCK_H5_INTERNAL_H
#define ZCK_H5_INTERNAL_H

#include <hdf5.h>
#include <zstd.h>

#include "hdf5/zck_h5.h"

/* Chunks larger than this are refused (H-04: HDF5's own limit is 4 GiB). */
#define ZCK__H5_MAX_CHUNK_BYTES ((uint64_t)1 << 30)

/* The process-wide HDF5 lock (recursive). zck__h5_lock() also initialises the library
 * once: automatic error printing off, the zstd filter registered. */
void zck__h5_lock(void);
void zck__h5_unlock(void);

/* Fails with status and "<what>: <HDF5's innermost message>", clearing HDF5's error
 * stack. Call with the lock held. An HDF5 write failing with errno ENOSPC/EDQUOT
 * becomes ZCK_ERR_NO_SPACE. */
zck_status zck__h5_fail(zck_status status, const char *fmt, ...) ZCK__PRINTF(2, 3);

/* File type for writing a zckpt dtype (caller H5Tclose()s it); H5I_INVALID_HID with the
 * error set for types HDF5 cannot hold. */
hid_t zck__h5_file_type(zck_dtype t);
/* The zckpt dtype of a stored type, before the `dtype` attribute; INVALID if none. */
zck_dtype zck__h5_dtype_of(hid_t type);

/* Sets a compression context for one chunk: the level and the frame checksum on. Returns
 * a zstd error code or 0. */
size_t zck__h5_zstd_params(ZSTD_CCtx *cc, int level);

/* zstd frame checks of one stored chunk (H-01..H-03): exactly one frame whose header
 * records `expect` bytes of content. Decompresses into out, checking the frame's checksum
 * when it has one (frames written before zckpt added them have none): DAMAGED "<what>:
 * damaged: ..." when it does not match. `what` names the file, dataset and chunk. */
zck_status zck__h5_unzstd(const void *src, size_t n, void *out, size_t expect, const char *what);

/* The digest ZCK_H5_ATTRS_XXH3_ATTR records (zck_h5.h): the sum of XXH3(".", name, value)
 * over the root group's attributes but that one. Lock held. */
zck_status zck__h5_attrs_digest(hid_t file, uint64_t *out);

/* Walks the file's metadata in a forked child first; FORMAT error if the library crashes
 * there (h5_probe.c). */
zck_status zck__h5_probe(const char *path);

#endif
