/* zck_universal_api.h: `zckpt to-universal`, public API (to be merged into lib/zck.h). */
#ifndef ZCK_UNIVERSAL_API_H
#define ZCK_UNIVERSAL_API_H

#include "zck.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum zck_universal_format {
  ZCK_UNIVERSAL_DS = 0,       /* DeepSpeed's universal folder, as ds_to_universal.py writes it */
  ZCK_UNIVERSAL_HDF5          /* one HDF5 file (zstd-compressed chunked datasets) */
} zck_universal_format;

typedef struct zck_universal_opts {
  zck_universal_format format;
  const char *tag;            /* NULL: the tag named by `latest` */
  int inject_missing_state;   /* ds format, stage 1/2: accept a checkpoint without
                                 universal_checkpoint_info, as ds_to_universal's
                                 --inject_missing_state (version 0.4); else refused (DS-76) */
  int level;                  /* hdf5: zstd level 1..22; 0 = 3 */
  uint64_t chunk_bytes;       /* hdf5: uncompressed chunk size; 0 = 1 MiB */
  unsigned threads;           /* 0 = all cores */
  int overwrite;              /* replace an existing output */
  zck_progress_cb progress;
  void *progress_ctx;
} zck_universal_opts;
#define ZCK_UNIVERSAL_OPTS_INIT {ZCK_UNIVERSAL_DS, NULL, 0, 0, 0, 0, 0, NULL, NULL}

/* A DeepSpeed ZeRO-1/2/3 checkpoint (save root with `latest`, tag folder or HF
 * checkpoint-N/) with its optimizer state to a universal checkpoint, in one pass over the
 * rank files (each tensor byte read once, no temporary tree):
 *  - ZCK_UNIVERSAL_DS: OUT is the universal folder DeepSpeed's ds_to_universal.py would
 *    write (zero/<param>/{fp32,exp_avg,exp_avg_sq,step}.pt, zero/optimizer_state.pt, the
 *    model-states files) and <parent of OUT>/latest_universal, loadable with
 *    "checkpoint": {"load_universal": true}; the folder appears in one rename;
 *  - ZCK_UNIVERSAL_HDF5: OUT is one HDF5 file (formats/hdf5/zck_h5.h describes it),
 *    readable with h5py + hdf5plugin.
 * Nothing is left at OUT on failure. */
zck_status zck_to_universal(const char *src, const char *out, const zck_universal_opts *opts);

#ifdef __cplusplus
}
#endif
#endif /* ZCK_UNIVERSAL_API_H */
