/* ds_expect.c: what a zckpt-written tag folder promises about itself, attached to the
 * reader's stores so the executor checks it as it reads (exec.h, verify on read).
 *
 * zckpt-manifest.json (lib/manifest.h) lists every tensor's byte range in its file with
 * the XXH3-64 of those bytes, written as the checkpoint was. A store whose (file, offset,
 * length) is such a range gets that XXH3: a rank file replaced by one of another step or
 * run then fails on its first tensor read, even though its zip CRCs are self-consistent.
 * The manifest's layout must also be the folder's own (tag, stage, world size): a manifest
 * of another tag or layout says the folder is not what it was written as. A folder without
 * a manifest (DeepSpeed's own) has nothing to attach; a manifest that cannot be read is the
 * completeness check's business (zck_ds_check_complete, run by every job). The parsed
 * manifest stays with the reader (zck_ds_manifest), so a job parses it once. */
#include "ds_internal.h"
#include "manifest.h"

#include <stdlib.h>
#include <string.h>

typedef struct range_key {
  uint64_t off, nbytes, xxh3;
} range_key;

static int cmp_range(const void *a, const void *b) {
  const range_key *x = a, *y = b;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* The tensors of one manifest file, sorted by range. */
typedef struct file_ranges {
  const char *path;             /* the file's full path, as the reader's sources name it */
  range_key *r;
  size_t n;
} file_ranges;

static zck_status check_layout(const zck_ds_ckpt *c, const zck_manifest *m, const char *mpath) {
  if (m->kind != ZCK_MANIFEST_DEEPSPEED || !m->has_layout) return ZCK_OK;
  const zck_manifest_layout *l = &m->layout;
  if (l->tag && c->info.tag && strcmp(l->tag, c->info.tag))
    return zck__fail(ZCK_ERR_MISMATCH, "%s: written for tag '%s', but it is in tag folder '%s'", mpath, l->tag,
                     c->info.tag);
  if (l->stage != c->info.stage || l->world_size != c->info.world_size)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: written for ZeRO stage %d over %u ranks, but the files are stage %d over %u",
                     mpath, l->stage, l->world_size, c->info.stage, c->info.world_size);
  return ZCK_OK;
}

static void attach(zck_store *s, const file_ranges *fr, size_t n_fr) {
  if (s->kind != ZCK_STORE_SOURCE || !s->source) return;
  for (size_t i = 0; i < n_fr; i++) {
    if (strcmp(fr[i].path, s->source->name)) continue;
    range_key key = {s->base, s->numel * zck_dtype_size(s->dtype), 0};
    const range_key *hit = bsearch(&key, fr[i].r, fr[i].n, sizeof *fr[i].r, cmp_range);
    if (hit) {
      s->has_xxh3 = true;
      s->xxh3 = hit->xxh3;
    }
    return;
  }
}

zck_status zck__ds_expect_manifest(zck_ds_ckpt *c) {
  zck_manifest *m = NULL;
  zck_status st = zck_manifest_read(c->fs.dir, &m);
  if (st != ZCK_OK) { /* none, or unreadable: the completeness check says so */
    zck_clear_error();
    return st == ZCK_ERR_NO_MEMORY ? st : ZCK_OK;
  }
  char *mpath = zck__sprintf("%s/%s", c->fs.dir, ZCK_MANIFEST_NAME);
  file_ranges *fr = zck__calloc(m->n_files ? m->n_files : 1, sizeof *fr);
  size_t *fill = zck__calloc(m->n_files ? m->n_files : 1, sizeof *fill);
  st = mpath && fr && fill ? check_layout(c, m, mpath) : ZCK_ERR_NO_MEMORY;
  for (size_t t = 0; st == ZCK_OK && t < m->n_tensors; t++)
    if (m->tensors[t].hashed && m->tensors[t].file < m->n_files) fr[m->tensors[t].file].n++;
  for (size_t f = 0; st == ZCK_OK && f < m->n_files; f++) {
    fr[f].path = zck__sprintf("%s/%s", c->fs.dir, m->files[f].path);
    fr[f].r = zck__malloc((fr[f].n ? fr[f].n : 1) * sizeof *fr[f].r);
    if (!fr[f].path || !fr[f].r) st = ZCK_ERR_NO_MEMORY;
  }
  for (size_t t = 0; st == ZCK_OK && t < m->n_tensors; t++) {
    const zck_manifest_tensor *mt = &m->tensors[t];
    if (mt->hashed && mt->file < m->n_files) fr[mt->file].r[fill[mt->file]++] = (range_key){mt->offset, mt->nbytes, mt->xxh3};
  }
  if (st == ZCK_OK) {
    for (size_t f = 0; f < m->n_files; f++) qsort(fr[f].r, fr[f].n, sizeof *fr[f].r, cmp_range);
    const zck_layout *layouts[ZCK_DS_PART_COUNT] = {c->train_layout, c->train_layout, c->train_layout, c->lp_layout,
                                                    c->frozen_layout};
    for (int p = 0; p < ZCK_DS_PART_COUNT; p++) {
      if (!c->stores[p] || !layouts[p]) continue;
      for (size_t i = 0; i < layouts[p]->n_stores; i++) attach(&c->stores[p][i], fr, m->n_files);
    }
    for (size_t b = 0; c->buffer_stores && b < c->model->n_buffers; b++) attach(&c->buffer_stores[b], fr, m->n_files);
  }
  for (size_t f = 0; fr && f < m->n_files; f++) {
    free((char *)fr[f].path);
    free(fr[f].r);
  }
  free(fr);
  free(fill);
  free(mpath);
  if (st == ZCK_OK) c->manifest = m; /* kept: jobs check completeness and whole files with it */
  else zck_manifest_free(m);
  return st;
}
