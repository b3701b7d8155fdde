/* consolidate_source.c: what `zckpt consolidate` reads, whatever holds the checkpoint.
 *
 * A DeepSpeed checkpoint is described by the DeepSpeed reader; a universal folder in
 * DeepSpeed's layout (ds_to_universal.py's, or `zckpt to-universal`'s) by the universal
 * reader, and zckpt's HDF5 container by its own: each as the state view a reshard from it
 * reads (reshard_uvdir.c, reshard_universal.c) and zero_to_fp32's recipe for the checkpoint
 * it was made from (uv_outputs.c, h5_outputs.c). consolidate.c then writes the same
 * output from any of them, through the one transfer. Every byte read is checked as for a
 * reshard: the zip CRC-32 of each record of the folder's .pt files, and, where the folder
 * has zckpt's manifest, the XXH3 it lists for each file read; the container's chunks carry
 * their zstd checksums, its root attributes their digest. */
#include <stdlib.h>
#include <string.h>

#include "consolidate_internal.h"
#include "hdf5/zck_h5.h"
#include "reshard_internal.h"
#include "universal/universal.h"

static zck_status zck__cons_open_ds(zck__cons_src *s, const char *path, const zck_consolidate_opts *o) {
  zck_ds_open_opts dopts = ZCK_DS_OPEN_OPTS_INIT;
  dopts.tag = o->tag;
  dopts.threads = o->threads;
  ZCK_TRY(zck_ds_open(path, &dopts, &s->ck));
  /* a zckpt-written checkpoint without its manifest was never completed */
  ZCK_TRY(zck_ds_check_complete(s->ck, o->force));
  s->dir = zck_ds_info_of(s->ck)->dir;
  zck_ds_state(s->ck, &s->view);
  s->outs = zck_ds_outputs(s->ck, &s->n_outs);
  size_t n = zck_ds_unsaved_tie_count(s->ck);
  if (!(s->own_unsaved = zck__calloc(2 * n + 1, sizeof *s->own_unsaved))) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < n; i++) zck_ds_unsaved_tie(s->ck, i, &s->own_unsaved[2 * i], &s->own_unsaved[2 * i + 1]);
  s->unsaved = s->own_unsaved;
  s->n_unsaved = n;
  return ZCK_OK;
}

static zck_status zck__cons_open_uv(zck__cons_src *s, const char *path, const zck_consolidate_opts *o) {
  zck_uv_open_opts uo = ZCK_UV_OPEN_OPTS_INIT;
  uo.no_verify = o->no_verify != 0;
  ZCK_TRY(zck_uv_open(path, &uo, &s->uv));
  const zck_uv_info *in = zck_uv_info_of(s->uv);
  s->dir = in->dir;
  /* a folder zckpt wrote gets its manifest last: without it, it was never completed */
  ZCK_TRY(zck_manifest_check_complete(in->dir, o->force));
  zck__whole_src w;
  zck__whole_src_uv(s->uv, &w);
  zck__whole_state(&w, &s->view);
  s->outs = (const zck_ds_output *)zck_uv_outputs(s->uv, &s->n_outs);
  s->unsaved = zck_uv_unsaved_ties(s->uv, &s->n_unsaved);
  return ZCK_OK;
}

static zck_status zck__cons_open_h5(zck__cons_src *s, const char *path) {
  zck_status st = zck_h5u_open(path, &s->h5);
  if (st != ZCK_OK)   /* the container's own messages name the file; the manifest builder's do not */
    return strstr(zck_last_error(), path) ? st : zck__error_prepend(st, "%s", path);
  s->dir = path;
  zck__whole_src w;
  bool have[ZCK_H5U_PART_COUNT];
  zck__whole_src_h5(s->h5, path, &w, have);
  zck__whole_state(&w, &s->view);
  ZCK_TRY(zck_h5u_outputs(s->h5, (struct zck_ds_output **)&s->own_outs, &s->n_outs));
  s->outs = s->own_outs;
  const zck_h5u_info *in = zck_h5u_info_of(s->h5);
  s->unsaved = in->unsaved_ties;
  s->n_unsaved = in->n_unsaved_ties;
  return ZCK_OK;
}

zck_status zck__cons_src_open(zck__cons_src *s, const char *path, const zck_consolidate_opts *o) {
  memset(s, 0, sizeof *s);
  bool h5 = zck__is_hdf5(path), uv = !h5 && zck__is_universal(path);
  if ((h5 || uv) && o->tag)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a universal %s, which has no tags", path, h5 ? "container" : "checkpoint");
  zck_status st = h5 ? zck__cons_open_h5(s, path) : uv ? zck__cons_open_uv(s, path, o) : zck__cons_open_ds(s, path, o);
  if (st != ZCK_OK) zck__cons_src_close(s);
  return st;
}

void zck__cons_src_close(zck__cons_src *s) {
  zck_ds_close(s->ck);
  zck_uv_close(s->uv);
  zck_h5u_close(s->h5);
  free(s->own_outs);
  free(s->own_unsaved);
  memset(s, 0, sizeof *s);
}

/* A side file of the container (/side_files/NAME), as consolidate.c takes one from a
 * folder: at most 1 MiB, else left out (so is one that is not 1-d uint8). One that cannot
 * be read (damaged, or not the bytes written there: the checksum table) fails the job:
 * the output would silently lack it. */
static zck_status zck__cons_h5_side(const zck__cons_src *s, const char *name, char ***names, char ***texts, size_t *n) {
  zck_h5_file *f = zck_h5u_file(s->h5);
  char *p = zck__sprintf("%s/%s", ZCK_H5U_SIDE_FILES, name);
  zck_h5_dataset *d = NULL;
  char *text = NULL;
  zck_status st = p ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (p && zck_h5_exists(f, p) && (st = zck_h5_dataset_open(f, p, &d)) == ZCK_OK) {
    const zck_h5_dataset_info *di = zck_h5_dataset_info_of(d);
    if (di->ndim == 1 && (di->dtype == ZCK_U8 || di->dtype == ZCK_I8) && di->numel <= (1u << 20)) {
      if (!(text = zck__malloc((size_t)di->numel + 1))) st = ZCK_ERR_NO_MEMORY;
      else st = zck_h5_dataset_read(d, text, 0, di->numel);
    }
  }
  if (st == ZCK_OK && text) {
    text[zck_h5_dataset_info_of(d)->numel] = 0;
    char **nn = realloc(*names, (*n + 1) * sizeof *nn);
    char **tt = realloc(*texts, (*n + 1) * sizeof *tt);
    if (nn) *names = nn;
    if (tt) *texts = tt;
    if (nn && tt && (nn[*n] = zck__strdup(name))) {
      tt[*n] = text;
      (*n)++;
      text = NULL;
    } else {
      st = ZCK_ERR_NO_MEMORY;
    }
  }
  zck_h5_dataset_close(d);
  free(text);
  free(p);
  return st;
}

zck_status zck__cons_src_side_files(const zck__cons_src *s, char ***names, char ***texts, size_t *n) {
  if (s->ck) zck__cons_side_files(zck_ds_info_of(s->ck)->root, names, texts, n);
  else if (s->uv && zck_uv_info_of(s->uv)->root) zck__cons_side_files(zck_uv_info_of(s->uv)->root, names, texts, n);
  else if (s->h5) {
    ZCK_TRY(zck__cons_h5_side(s, "config.json", names, texts, n));
    ZCK_TRY(zck__cons_h5_side(s, "generation_config.json", names, texts, n));
  }
  return ZCK_OK;
}
