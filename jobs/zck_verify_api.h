/* zck_verify_api.h: public API of checkpoint integrity (manifests and `zckpt verify`).
 *
 * To be merged into lib/zck.h (it uses only zck.h types); until then tools include it by
 * its relative path.
 *
 * Manifest: zckpt writes zckpt-manifest.json LAST into every directory it produces, so its
 * presence says the directory is complete; it lists every file (size, XXH3-64) and every
 * tensor (file, name, dtype, shape, byte range, XXH3-64). See lib/manifest.h for the
 * format and the completeness protocol.
 *
 * Verify: checks a DeepSpeed checkpoint (root with `latest`, tag folder, HF checkpoint-N/),
 * a safetensors file / index / HF folder, a torch .pt/.bin file, or any folder with a
 * manifest:
 *   - structure: DeepSpeed file set, world size and partition shapes (zck_ds_open); every
 *     .pt opened fully (zip directory, pickle, tensor geometry) and the CRC-32 of every zip
 *     record streamed; safetensors headers and index consistency;
 *   - checksums, when a manifest exists: every file's size and XXH3, chunk hashes to
 *     locate the damaged byte range, each tensor's XXH3 to name the damaged tensor.
 * Every file is read once, files in parallel, in memory bounded by threads x 4 MiB.
 */
#ifndef ZCK_VERIFY_API_H
#define ZCK_VERIFY_API_H

#include "zck.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- manifests */

typedef struct zck_manifest_opts {
  unsigned version;           /* ZCK_MANIFEST_OPTS_VERSION */
  const char *kind;           /* NULL: detect; "deepspeed", "safetensors", "universal", "torch", "other" */
  unsigned threads;           /* 0 = all cores */
  uint64_t chunk_size;        /* bytes per chunk hash; 0 = 64 MiB */
} zck_manifest_opts;
#define ZCK_MANIFEST_OPTS_VERSION 1
#define ZCK_MANIFEST_OPTS_INIT {ZCK_MANIFEST_OPTS_VERSION, NULL, 0, 0}

/* Describes and hashes every file of dir (recursively) and writes dir/zckpt-manifest.json
 * atomically; call it last, when every other file of dir is final. For a DeepSpeed tag
 * folder, the layout is recorded (the folder must open with the DeepSpeed reader). */
zck_status zck_manifest_write_dir(const char *dir, const zck_manifest_opts *opts);
/* Marks dir as being written in place (dir/.zckpt-partial), for writers that do not build
 * their output under a temporary name; zck_manifest_write_dir removes the mark. */
zck_status zck_manifest_mark_partial(const char *dir);
/* For readers of zckpt-written checkpoints: ZCK_OK when dir holds a valid manifest whose
 * files exist with the listed sizes, or no manifest and no partial mark (a checkpoint not
 * written by zckpt); else ZCK_ERR_DAMAGED "DIR: incomplete checkpoint: ..." (or the
 * manifest's parse error). force accepts anyway. Stats only, reads no data. */
zck_status zck_manifest_check_complete(const char *dir, int force);

/* ---- verify */

typedef struct zck_verify_opts {
  unsigned version;           /* ZCK_VERIFY_OPTS_VERSION */
  const char *tag;            /* DeepSpeed: NULL = the tag named by `latest` */
  int force;                  /* check a folder marked incomplete (.zckpt-partial, no manifest)
                                 without reporting it as damage */
  int skip_data;              /* structure only: read no tensor data (no CRCs, no checksums) */
  unsigned threads;           /* 0 = all cores */
  zck_progress_cb progress;   /* bytes read so far / in total */
  void *progress_ctx;
} zck_verify_opts;
#define ZCK_VERIFY_OPTS_VERSION 1
#define ZCK_VERIFY_OPTS_INIT {ZCK_VERIFY_OPTS_VERSION, NULL, 0, 0, 0, NULL, NULL}

typedef enum zck_verify_result {
  ZCK_VERIFY_CLEAN = 0,       /* every check passed (exit 0) */
  ZCK_VERIFY_DAMAGED,         /* damage found (exit 3) */
  ZCK_VERIFY_UNCHECKED,       /* no damage found, but something could not be checked (exit 1) */
} zck_verify_result;

typedef enum zck_verify_severity {
  ZCK_VERIFY_NOTE = 0,        /* what was (not) checked */
  ZCK_VERIFY_WARNING,         /* suspicious, not damage (extra files, spec "Warn" items) */
  ZCK_VERIFY_DAMAGE,
  ZCK_VERIFY_UNCHECKABLE,     /* could not be checked (I/O error, unsupported format) */
} zck_verify_severity;

typedef struct zck_verify_finding {
  zck_verify_severity severity;
  const char *check;          /* "structure", "zip-crc", "size", "file-xxh3", "chunk-xxh3",
                                 "tensor-xxh3", "tensor-range", "missing-file", "extra-file",
                                 "layout", "manifest", "incomplete", "read", "coverage" */
  const char *file;           /* the file's path, NULL when about the whole checkpoint */
  const char *tensor;         /* NULL when not about one tensor */
  int64_t offset;             /* absolute byte offset in the file, -1 when unknown */
  uint64_t length;            /* bytes concerned, 0 when unknown */
  const char *message;        /* one line, "FILE: what is wrong" */
} zck_verify_finding;

typedef struct zck_verify_report {
  const char *path;           /* as given */
  const char *kind;           /* "deepspeed", "safetensors", "torch", "universal", "directory" */
  const char *detail;         /* e.g. "tag global_step2, stage 2, world size 2, bfloat16"; "" if none */
  const char *dir;            /* the folder the files are relative to, where the manifest is
                                 (or would go): a DeepSpeed tag folder, the HF folder, the
                                 file's folder; NULL if PATH could not be resolved */
  int single_file;            /* PATH is one file (only it was checked) */
  const char *manifest;       /* the manifest checked against, NULL when there is none */
  zck_verify_result result;
  uint64_t files;             /* files checked */
  uint64_t bytes;             /* bytes read and hashed */
  uint64_t records;           /* zip records whose CRC-32 was checked */
  uint64_t tensors;           /* tensors checked against the manifest */
  size_t n_findings;
  const zck_verify_finding *findings;
} zck_verify_report;

/* Verifies path. Returns ZCK_OK (clean), ZCK_ERR_DAMAGED (damage found) or the status of
 * the first thing that could not be checked (zck_last_error() says what). *out receives
 * the report in every case but misuse and out of memory (then NULL); free it with
 * zck_verify_report_free. */
zck_status zck_verify(const char *path, const zck_verify_opts *opts, zck_verify_report **out);
void zck_verify_report_free(zck_verify_report *r);
/* Prints the report on out (a FILE *): text, one finding per line, or JSON. */
zck_status zck_verify_report_print(const zck_verify_report *r, int json, void *out);

#ifdef __cplusplus
}
#endif
#endif
