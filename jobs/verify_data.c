/* verify_data.c: the data pass of `zckpt verify`: every file read once (files in parallel,
 * bounded buffers), feeding the CRC-32 of each zip record and, with a manifest, the file,
 * chunk and tensor XXH3s; then the findings: which file, which tensor, which bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "verify_internal.h"

#define ULL(x) ((unsigned long long)(x))
#define VERIFY_MAX_TENSOR_FINDINGS 100   /* per file; then one summary line */

typedef struct diff_ctx {
  vctx *c;
  size_t *tensor_findings;     /* per expected file */
  size_t suppressed;
} diff_ctx;

static void on_diff(void *vctx_, const zck_manifest_diff *d) {
  diff_ctx *dc = vctx_;
  vctx *c = dc->c;
  const char *check = "file-xxh3";
  zck_verify_severity sev = ZCK_VERIFY_DAMAGE;
  switch (d->kind) {
  case ZCK_MDIFF_KIND: case ZCK_MDIFF_LAYOUT: check = "layout"; break;
  case ZCK_MDIFF_MISSING_FILE: check = "missing-file"; break;
  case ZCK_MDIFF_EXTRA_FILE: check = "extra-file"; sev = ZCK_VERIFY_WARNING; break;
  case ZCK_MDIFF_UNREADABLE_FILE:
    check = "read";
    sev = ZCK_VERIFY_UNCHECKABLE;
    if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = ZCK_ERR_IO;
    break;
  case ZCK_MDIFF_SIZE: check = "size"; break;
  case ZCK_MDIFF_FILE_HASH: check = "file-xxh3"; break;
  case ZCK_MDIFF_CHUNK: check = "chunk-xxh3"; break;
  case ZCK_MDIFF_MISSING_TENSOR: case ZCK_MDIFF_TENSOR_META: check = "tensor-meta"; break;
  case ZCK_MDIFF_EXTRA_TENSOR: check = "tensor-meta"; sev = ZCK_VERIFY_WARNING; break;
  case ZCK_MDIFF_TENSOR_UNREADABLE: check = "tensor-range"; break;
  case ZCK_MDIFF_TENSOR_HASH: check = "tensor-xxh3"; break;
  }
  if (d->tensor && d->file) { /* a file overwritten wholesale would list every tensor */
    ptrdiff_t fi = zck_manifest_find_file(c->expected, d->file);
    if (fi >= 0 && ++dc->tensor_findings[fi] > VERIFY_MAX_TENSOR_FINDINGS) { dc->suppressed++; return; }
  }
  char *full = d->file ? zck__path_join(c->base, d->file) : NULL;
  zck__vreport_add(c->r, sev, check, full ? full : d->file, d->tensor, d->offset, d->length, "%s", d->message);
  free(full);
}

static void check_records(vctx *c, vfile *f, const zck__hash_range *ranges) {
  for (size_t k = 0; k < f->n_recs; k++) {
    const vrecord *r = &f->recs[k];
    const zck__hash_range *h = &ranges[k];
    if (r->method) continue;
    c->r->pub.records++;
    if (!h->done) {
      zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "zip-crc", f->full, r->tensors, (int64_t)r->off, r->size,
                       "%s: zip record \"%s\" (bytes %llu..%llu) passes the end of the file", f->full, r->name, ULL(r->off),
                       ULL(r->off + r->size));
    } else if (h->crc32 != r->crc) {
      zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "zip-crc", f->full, r->tensors, (int64_t)r->off, r->size,
                       "%s: zip record \"%s\"%s%s%s (bytes %llu..%llu): CRC-32 is %08x, the zip directory says %08x",
                       f->full, r->name, r->tensors ? " (tensor " : "", r->tensors ? r->tensors : "", r->tensors ? ")" : "",
                       ULL(r->off), ULL(r->off + r->size), h->crc32, r->crc);
    }
  }
}

/* A .safetensors file without a manifest carries no checksum, but its header was checked
 * and its bytes are still read once, so `verify FILE.safetensors` reports the file (and an
 * unreadable or short one) rather than "0 files". */
static bool zck__verify_read_plain(const vctx *c, const vfile *f) {
  return !c->expected && ((f->type == VF_SAFETENSORS && f->open_status == ZCK_OK) || f->dcp_metadata);
}

/* Whether the data pass reads f: its records, its manifest tensors, or a plain file. */
static bool zck__verify_reads(const vctx *c, const vfile *f) {
  return f->n_recs > 0 || f->mf >= 0 || zck__verify_read_plain(c, f);
}

/* What the data pass reads: one hash job a file it reads, with the file's records' CRCs
 * first, then its manifest tensors. */
typedef struct vplan {
  zck__hash_range *ranges;
  zck__hash_file *hf;
  size_t n_hash;
  size_t *hf_of;               /* file -> its hash job */
  size_t *rec_base;            /* file -> its first record's range */
  size_t *slot;                /* expected tensor -> its range */
  bool *present;               /* expected file -> on disk */
} vplan;

static zck_status plan_build(const vctx *c, vplan *p) {
  zck_manifest *e = c->expected;
  size_t n_ranges = e ? e->n_tensors : 0, nf = c->n_files ? c->n_files : 1;
  for (size_t i = 0; i < c->n_files; i++) n_ranges += c->files[i].n_recs;
  p->ranges = zck__calloc(n_ranges ? n_ranges : 1, sizeof *p->ranges);
  p->hf = zck__calloc(nf, sizeof *p->hf);
  p->hf_of = zck__calloc(nf, sizeof *p->hf_of);
  p->rec_base = zck__calloc(nf, sizeof *p->rec_base);
  p->slot = e ? zck__calloc(e->n_tensors ? e->n_tensors : 1, sizeof *p->slot) : NULL;
  p->present = e ? zck__calloc(e->n_files ? e->n_files : 1, sizeof *p->present) : NULL;
  if (!p->ranges || !p->hf || !p->hf_of || !p->rec_base || (e && (!p->slot || !p->present))) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; e && i < c->n_files; i++)
    if (c->files[i].mf >= 0) p->present[c->files[i].mf] = true;
  /* the manifest's tensors grouped by file, in their order (a counting sort): each file's ranges in one pass, not a
   * scan of every tensor per file (a universal folder at 100k params: 400k files x 400k tensors) */
  size_t *first = e ? zck__calloc(e->n_files + 1, sizeof *first) : NULL;
  size_t *by_file = e ? zck__malloc((e->n_tensors ? e->n_tensors : 1) * sizeof *by_file) : NULL;
  if (e && (!first || !by_file)) {
    free(first);
    free(by_file);
    return ZCK_ERR_NO_MEMORY;
  }
  for (size_t t = 0; e && t < e->n_tensors; t++) first[e->tensors[t].file + 1]++;
  for (size_t k = 0; e && k < e->n_files; k++) first[k + 1] += first[k];
  for (size_t t = 0, *next = first; e && t < e->n_tensors; t++) by_file[next[e->tensors[t].file]++] = t;
  for (size_t k = e ? e->n_files : 0; k > 0; k--) first[k] = first[k - 1]; /* the fill moved each start to its end */
  if (e) first[0] = 0;
  size_t used = 0;
  for (size_t i = 0; i < c->n_files; i++) {
    const vfile *f = &c->files[i];
    if (!zck__verify_reads(c, f)) continue;
    zck__hash_file *h = &p->hf[p->n_hash];
    p->hf_of[i] = p->n_hash++;
    h->path = f->full;
    h->chunk_size = f->mf >= 0 ? e->chunk_size : 0;
    h->ranges = p->ranges + used;
    p->rec_base[i] = used;
    for (size_t k = 0; k < f->n_recs; k++) /* compressed records: CRC of other bytes (torch rejects them) */
      p->ranges[used++] = (zck__hash_range){f->recs[k].off, f->recs[k].size, f->recs[k].method ? 0u : ZCK__HASH_CRC32,
                                            0, 0, false};
    for (size_t k = f->mf >= 0 ? first[f->mf] : 0; f->mf >= 0 && k < first[f->mf + 1]; k++) {
      size_t t = by_file[k];
      p->slot[t] = used;
      p->ranges[used++] = (zck__hash_range){e->tensors[t].offset, e->tensors[t].nbytes, ZCK__HASH_XXH3, 0, 0, false};
    }
    h->n_ranges = (size_t)(p->ranges + used - h->ranges);
  }
  free(first);
  free(by_file);
  return ZCK_OK;
}

static void plan_free(vplan *p) {
  for (size_t i = 0; p->hf && i < p->n_hash; i++) zck__hash_file_clear(&p->hf[i]);
  free(p->hf);
  free(p->hf_of);
  free(p->ranges);
  free(p->slot);
  free(p->rec_base);
  free(p->present);
}

/* Each file read: reported, its records checked, and (a manifest file) its hashes taken
 * into `a`, the manifest of what is on disk. */
static void take_files(vctx *c, vplan *p, zck_manifest *a) {
  for (size_t i = 0; i < c->n_files; i++) {
    vfile *f = &c->files[i];
    /* with a manifest, the files it does not list were reported and left out of the list
     * (verify.c); the symlinks left are checked, as the readers follow them, not reported */
    if (!zck__verify_reads(c, f)) continue;
    zck__hash_file *h = &p->hf[p->hf_of[i]];
    c->r->pub.files++;
    if (h->ok) c->r->pub.bytes += h->size;
    if (h->ok) zck__vreport_checked(c->r, f->rel);
    if (!h->ok && f->mf < 0) {
      if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = h->status;
      zck__vreport_add(c->r, zck__verify_severity_of(h->status) == ZCK_VERIFY_DAMAGE ? ZCK_VERIFY_DAMAGE : ZCK_VERIFY_UNCHECKABLE,
                       "read", f->full, NULL, -1, 0, "%s", h->error ? h->error : "cannot read");
    }
    if (h->ok && f->n_recs > 0) check_records(c, f, p->ranges + p->rec_base[i]);
    if (f->mf < 0) continue;
    zck_manifest_file *af = &a->files[f->mf];
    af->hashed = h->ok;
    af->size = h->size;
    af->xxh3 = h->xxh3;
    if (!h->ok) { af->error = h->error; h->error = NULL; }
    if (h->ok && h->n_chunks > 1) { af->chunks = h->chunks; af->n_chunks = h->n_chunks; h->chunks = NULL; }
  }
}

/* The tensor hashes, the files missing and the layout into `a`, then `a` against the
 * manifest: every difference a finding. */
static zck_status compare_with_manifest(vctx *c, const vplan *p, zck_manifest *a) {
  zck_manifest *e = c->expected;
  for (size_t t = 0; t < e->n_tensors; t++) {
    if (!p->present[e->tensors[t].file]) continue;
    a->tensors[t].hashed = p->ranges[p->slot[t]].done;
    a->tensors[t].xxh3 = p->ranges[p->slot[t]].xxh3;
    c->r->pub.tensors += p->ranges[p->slot[t]].done;
  }
  for (size_t i = 0; i < e->n_files; i++) a->files[i].missing = !p->present[i]; /* dropped from `actual` */
  if (c->have_ds_layout) {
    c->ds_layout.tag = e->has_layout ? e->layout.tag : NULL; /* the tag folder may be renamed */
    ZCK_TRY(zck_manifest_set_layout(a, &c->ds_layout));
  } else {
    a->has_layout = false;
  }
  diff_ctx dc = {c, zck__calloc(e->n_files ? e->n_files : 1, sizeof(size_t)), 0};
  if (!dc.tensor_findings) return ZCK_ERR_NO_MEMORY;
  zck_manifest_compare(e, a, c->base, 0, on_diff, &dc);
  if (dc.suppressed)
    zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "tensor-xxh3", NULL, NULL, -1, 0,
                     "%zu more damaged tensors not listed (at most %d per file)", dc.suppressed, VERIFY_MAX_TENSOR_FINDINGS);
  free(dc.tensor_findings);
  return ZCK_OK;
}

zck_status zck__verify_data(vctx *c) {
  zck_manifest *e = c->expected, *a = NULL;
  vplan p = {0};
  zck_status st = plan_build(c, &p);
  if (st == ZCK_OK && e) st = zck_manifest_clone_unhashed(e, &a);
  if (st == ZCK_OK) {
    zck_manifest_hash_opts ho = ZCK_MANIFEST_HASH_OPTS_INIT;
    ho.threads = c->o.threads;
    ho.keep_going = true;
    ho.progress = c->o.progress;
    ho.progress_ctx = c->o.progress_ctx;
    st = zck__hash_files_shared(p.hf, p.n_hash, &ho); /* under mpirun: each file read by one rank */
  }
  if (st == ZCK_OK) take_files(c, &p, a);
  if (st == ZCK_OK && e) st = compare_with_manifest(c, &p, a);
  plan_free(&p);
  zck_manifest_free(a);
  return st;
}
