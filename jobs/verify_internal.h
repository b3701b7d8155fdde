/* verify_internal.h: what the parts of `zckpt verify` share: the job's state (verify.c:
 * path, manifest, file list), the structure checks (verify_structure.c), the data pass
 * (verify_data.c) and the report under construction (verify_report.c). */
#ifndef ZCK_VERIFY_INTERNAL_H
#define ZCK_VERIFY_INTERNAL_H

#include "error.h"
#include "manifest.h"
#include "zck.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct zck__vreport zck__vreport;
struct zck__vreport {
  zck_verify_report pub;       /* first: the public view */
  zck_verify_finding *v;       /* strings owned (check names are static) */
  size_t n, cap;
  char *path, *kind, *detail, *manifest, *dir;
  zck_status first_unchecked;  /* status of the first UNCHECKABLE finding */
  char **checked;              /* the files checked, relative to dir: what --write-manifest lists */
  size_t n_checked, cap_checked;
  bool checked_lost;           /* one could not be recorded (no memory) */
};

zck__vreport *zck__vreport_new(const char *path);
/* Appends a finding; the message is formatted, file/tensor copied (may be NULL). Returns
 * false only without memory (the finding is lost; the result still counts it). */
bool zck__vreport_add(zck__vreport *r, zck_verify_severity sev, const char *check, const char *file,
                      const char *tensor, int64_t offset, uint64_t length, const char *fmt, ...) ZCK__PRINTF(8, 9);
/* Same, unless a finding with the same message exists (warnings repeated by two readers). */
bool zck__vreport_add_unique(zck__vreport *r, zck_verify_severity sev, const char *check, const char *msg);
void zck__vreport_set(char **field, const char *value);
/* Records that the file rel (relative to the report's dir) was checked. */
void zck__vreport_checked(zck__vreport *r, const char *rel);
/* Sets pub (result, findings) and returns the status zck_verify returns. */
zck_status zck__vreport_finish(zck__vreport *r);

// ---- the job

typedef enum { VF_OTHER = 0, VF_TORCH, VF_SAFETENSORS } vf_type;

typedef struct vrecord {
  char *name;
  uint64_t off, size;
  uint32_t crc;                /* as the central directory says */
  uint16_t method;
  char *tensors;               /* "a, b and 3 more" (NULL: no tensor views it) */
} vrecord;

typedef struct vfile {
  char *rel, *full;
  vf_type type;
  ptrdiff_t mf;                /* index in the expected manifest, -1 */
  zck_status open_status;      /* structure check of this file */
  char *open_error;
  char **warnings;
  size_t n_warnings;
  vrecord *recs;
  size_t n_recs;
  bool dcp_metadata;           /* a DCP .metadata its reader parsed: read whole, as a checked file */
} vfile;

typedef struct vctx {
  const char *path;
  char *picked;                /* path a Trainer output_dir: its checkpoint-N checked (path points here) */
  zck_verify_opts o;
  struct zck__vreport *r;
  char *base;                  /* folder the files are relative to */
  char *single;                /* single-file mode: the file's name in base */
  bool is_ds;
  bool is_uv;                  /* a DeepSpeed universal checkpoint (folder or its parent) */
  bool is_dcp;                 /* a torch Distributed Checkpoint (its files: base and below) */
  bool hf_index_given;         /* path is a *.index.json */
  bool is_h5u;                 /* path is zckpt's HDF5 universal container (checked whole) */
  zck_manifest *expected;      /* NULL without a manifest */
  vfile *files;
  size_t n_files;
  zck_manifest_layout ds_layout;   /* DeepSpeed or universal, from their readers */
  bool have_ds_layout;
} vctx;

bool zck__verify_ends_with(const char *s, const char *suffix);
bool zck__verify_exists_in(const char *dir, const char *name);
/* Damage is what the bytes say; the rest (I/O, unsupported, limits) is "unchecked". */
zck_verify_severity zck__verify_severity_of(zck_status s);
/* A finding from a failed status (deduplicated: two readers may say the same). */
void zck__verify_add_status(vctx *c, zck_status s, const char *check, const char *file, const char *msg);

/* verify_structure.c: readers over every file (in parallel) and the whole checkpoint. */
zck_status zck__verify_structure(vctx *c);
/* verify_data.c: one read of every file: zip CRCs, manifest checksums, comparison. */
zck_status zck__verify_data(vctx *c);

#endif
