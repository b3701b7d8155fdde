/* uv_expect.c: what a universal folder zckpt wrote promises about itself, attached to the
 * reader's stores so they check it as they read (uv_read.c, verify on read).
 *
 * `zckpt to-universal` writes zckpt-manifest.json last: every tensor's byte range in its
 * file (zero/<param>/<state>.pt, the carried model-states files) with the XXH3-64 of those
 * bytes. A store whose (file, offset, length) is such a range gets that XXH3, so a tensor
 * file swapped with another of the same shape, or replaced by one of another run, fails
 * on its read although its zip CRCs agree with themselves. A folder without a manifest
 * (ds_to_universal.py's) has nothing to attach; a manifest that cannot be read is the
 * completeness check's business (zck_manifest_check_complete, run by the jobs). */
#include "uv_internal.h"

#include <stdlib.h>
#include <string.h>

#include "manifest.h"
#include "strmap.h"

typedef struct uv_range {
  uint64_t off, nbytes, xxh3;
} uv_range;

static int cmp_uv_range(const void *a, const void *b) {
  const uv_range *x = a, *y = b;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

typedef struct uv_file_ranges {
  uv_range *r;
  size_t n;
} uv_file_ranges;

static void uv_attach(const zck_uv_ckpt *c, zck__uv_tstore *t, const zck__strmap *files, const uv_file_ranges *fr) {
  size_t dl = strlen(c->dir), f;
  if (!t->path || strncmp(t->path, c->dir, dl) || t->path[dl] != '/') return;
  if (!zck__strmap_get(files, t->path + dl + 1, &f)) return;
  uv_range key = {t->base, t->numel * t->es, 0};
  const uv_range *hit = fr[f].n ? bsearch(&key, fr[f].r, fr[f].n, sizeof key, cmp_uv_range) : NULL;
  if (!hit) return;
  t->has_xxh3 = true;
  t->xxh3 = hit->xxh3;
  t->hashed_to = t->base;
}

zck_status zck__uv_expect_manifest(zck_uv_ckpt *c) {
  zck_manifest *m = NULL;
  zck_status st = zck_manifest_read(c->dir, &m);
  if (st != ZCK_OK) {
    zck_clear_error();
    return st == ZCK_ERR_NO_MEMORY ? st : ZCK_OK;
  }
  zck__strmap files;
  memset(&files, 0, sizeof files);
  uv_file_ranges *fr = zck__calloc(m->n_files + 1, sizeof *fr);
  size_t *fill = zck__calloc(m->n_files + 1, sizeof *fill);
  st = fr && fill ? zck__strmap_init(&files, m->n_files) : ZCK_ERR_NO_MEMORY;
  for (size_t f = 0; st == ZCK_OK && f < m->n_files; f++) {
    bool dup = false;
    size_t prev;
    st = zck__strmap_put(&files, m->files[f].path, f, &dup, &prev);
  }
  for (size_t t = 0; st == ZCK_OK && t < m->n_tensors; t++)
    if (m->tensors[t].hashed && m->tensors[t].file < m->n_files) fr[m->tensors[t].file].n++;
  for (size_t f = 0; st == ZCK_OK && f < m->n_files; f++)
    if (fr[f].n && !(fr[f].r = zck__malloc(fr[f].n * sizeof *fr[f].r))) st = ZCK_ERR_NO_MEMORY;
  for (size_t t = 0; st == ZCK_OK && t < m->n_tensors; t++) {
    const zck_manifest_tensor *mt = &m->tensors[t];
    if (mt->hashed && mt->file < m->n_files) fr[mt->file].r[fill[mt->file]++] = (uv_range){mt->offset, mt->nbytes, mt->xxh3};
  }
  if (st == ZCK_OK) {
    for (size_t f = 0; f < m->n_files; f++)
      if (fr[f].n) qsort(fr[f].r, fr[f].n, sizeof *fr[f].r, cmp_uv_range);
    for (int s = 0; s < 3; s++)
      for (size_t k = 0; c->ts[s] && k < c->n_stores; k++) uv_attach(c, &c->ts[s][k], &files, fr);
    for (size_t i = 0; i < c->n_aux; i++) uv_attach(c, &c->aux[i], &files, fr);
  }
  for (size_t f = 0; fr && f < m->n_files; f++) free(fr[f].r);
  free(fr);
  free(fill);
  zck__strmap_free(&files);
  zck_manifest_free(m);
  return st;
}
