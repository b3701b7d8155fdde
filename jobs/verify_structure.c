/* verify_structure.c: the structure checks of `zckpt verify`: every .pt opened fully (zip
 * directory, pickle, tensor geometry; its records listed with the tensors in them for the
 * CRC pass), every .safetensors header, files in parallel; then the whole checkpoint through
 * its reader (DeepSpeed file set and shapes, universal layout, HF index against shards). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp/dcp.h"
#include "deepspeed/deepspeed.h"
#include "hdf5/zck_h5.h"
#include "io.h"
#include "safetensors/safetensors.h"
#include "source.h"
#include "threadpool.h"
#include "torch/torch.h"
#include "universal/universal.h"
#include "verify_internal.h"

typedef struct ptr_index {
  const void *p;
  size_t index;
} ptr_index;

static int cmp_ptr_index(const void *a, const void *b) {
  uintptr_t x = (uintptr_t)((const ptr_index *)a)->p, y = (uintptr_t)((const ptr_index *)b)->p;
  return x < y ? -1 : x > y;
}

/* Names of the tensors viewing each record, for zip CRC findings. */
static zck_status name_records(zck_torch_file *tf, vfile *f, const ptr_index *entries, size_t n_entries) {
  zck_torch_named *named = NULL;
  size_t count = 0;
  if (zck_torch_state_dict(tf, zck_torch_root(tf), &named, &count) != ZCK_OK) { zck_clear_error(); return ZCK_OK; }
  size_t *shown = zck__calloc(f->n_recs ? f->n_recs : 1, sizeof *shown);
  zck__buf *names = zck__calloc(f->n_recs ? f->n_recs : 1, sizeof *names);
  zck_status st = shown && names ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < count; i++) {
    const zck_torch_storage *s = zck_torch_tensor_storage(tf, named[i].tensor);
    ptr_index key = {s ? s->entry : NULL, 0};
    const ptr_index *hit = s ? bsearch(&key, entries, n_entries, sizeof *entries, cmp_ptr_index) : NULL;
    if (!hit) continue;
    size_t r = hit->index;
    if (shown[r] < 3) zck__buf_printf(&names[r], "%s%s", shown[r] ? ", " : "", named[i].name);
    shown[r]++;
  }
  for (size_t r = 0; st == ZCK_OK && r < f->n_recs; r++) {
    if (!shown[r]) continue;
    if (shown[r] > 3) zck__buf_printf(&names[r], " and %zu more", shown[r] - 3);
    zck__buf_byte(&names[r], 0);
    if (names[r].failed) { st = ZCK_ERR_NO_MEMORY; break; }
    f->recs[r].tensors = (char *)names[r].data;
    names[r].data = NULL;
  }
  for (size_t r = 0; names && r < f->n_recs; r++) zck__buf_free(&names[r]);
  free(names);
  free(shown);
  zck_torch_named_free(named, count);
  return st;
}

/* The records of a zip directory; names of the tensors in them when tf is given. */
static zck_status collect_records(vfile *f, const zck_zip *z, zck_torch_file *tf) {
  size_t n = zck_zip_count(z);
  f->recs = zck__calloc(n ? n : 1, sizeof *f->recs);
  ptr_index *entries = zck__malloc((n ? n : 1) * sizeof *entries);
  zck_status st = f->recs && entries ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck_zip_entry *e = zck_zip_entry_at(z, i);
    vrecord *r = &f->recs[f->n_recs++];
    r->name = zck__strdup(e->name);
    if (!r->name) st = ZCK_ERR_NO_MEMORY;
    r->off = e->data_offset;
    r->size = e->comp_size;
    r->crc = e->crc32;
    r->method = e->method;
    entries[i] = (ptr_index){e, i};
  }
  if (st == ZCK_OK && tf) {
    qsort(entries, n, sizeof *entries, cmp_ptr_index);
    st = name_records(tf, f, entries, n);
  }
  free(entries);
  return st;
}

/* A .pt the torch reader rejects may still have a readable zip directory: its records'
 * CRCs then tell damage (a flipped pickle byte) from a file that is merely unsupported. */
static void records_without_torch(vfile *f) {
  zck__source src;
  zck_zip *z = NULL;
  if (zck__source_open(&src, f->full) != ZCK_OK) { zck_clear_error(); return; }
  if (zck_zip_open(&src, &z) == ZCK_OK && collect_records(f, z, NULL) != ZCK_OK) {
    for (size_t k = 0; k < f->n_recs; k++) free(f->recs[k].name);
    free(f->recs);
    f->recs = NULL;
    f->n_recs = 0;
  }
  zck_zip_close(z);
  zck__source_close(&src);
  zck_clear_error();
}

static zck_status open_torch(vfile *f) {
  zck_torch_file *tf = NULL;
  ZCK_TRY(zck_torch_open(f->full, NULL, &tf));
  zck_status st = collect_records(f, zck_torch_zip(tf), tf);
  zck_torch_close(tf);
  return st;
}

static zck_status open_safetensors(vfile *f) {
  zck_st_file *sf = NULL;
  ZCK_TRY(zck_st_open(f->full, &sf));
  size_t n = zck_st_warning_count(sf);
  zck_status st = ZCK_OK;
  if (n && !(f->warnings = zck__calloc(n, sizeof *f->warnings))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++)
    if ((f->warnings[f->n_warnings] = zck__strdup(zck_st_warning_at(sf, i)))) f->n_warnings++;
  zck_st_close(sf);
  return st;
}

static zck_status open_item(void *ctx, size_t item, unsigned thread) {
  vfile *f = &((vfile *)ctx)[item];
  zck_status st = ZCK_OK;
  if (f->type == VF_TORCH) st = open_torch(f);
  else if (f->type == VF_SAFETENSORS) st = open_safetensors(f);
  f->open_status = st;
  if (st != ZCK_OK) {
    f->open_error = strdup(zck_last_error());
    zck_clear_error();
    if (st == ZCK_ERR_NO_MEMORY) return st;
    if (f->type == VF_TORCH && !f->n_recs) records_without_torch(f);
  }
  return ZCK_OK; /* one bad file must not stop the others */
}

static void check_deepspeed(vctx *c) {
  zck_ds_open_opts o = ZCK_DS_OPEN_OPTS_INIT;
  o.tag = c->o.tag;
  o.threads = c->o.threads;
  zck_ds_ckpt *ck = NULL;
  /* the reader every job opens a checkpoint with: what it refuses is never "clean" here
   * (an unsupported file set, e.g. a tag without optimizer states, is "could not check") */
  zck_status st = zck_ds_open(c->path, &o, &ck);
  if (st != ZCK_OK) {
    zck__verify_add_status(c, st, "structure", NULL, zck_last_error());
    return;
  }
  const zck_ds_info *in = zck_ds_info_of(ck);
  if ((st = zck_ds_autoep_check_experts(ck)) != ZCK_OK)   /* AutoEP expert files of another save */
    zck__verify_add_status(c, st, "structure", NULL, zck_last_error());
  if ((st = zck_ds_pipe_check_layers(ck)) != ZCK_OK)   /* PipelineModule layer files of another save */
    zck__verify_add_status(c, st, "structure", NULL, zck_last_error());
  char detail[256];
  char tp[48] = "";
  if (in->tp_size > 1) snprintf(tp, sizeof tp, ", AutoTP %u tensor-parallel ranks", in->tp_size);
  if (in->ep_size > 1) snprintf(tp, sizeof tp, ", AutoEP %u expert-parallel ranks", in->ep_size);
  snprintf(detail, sizeof detail, "tag %s, ZeRO stage %d, world size %u%s, %zu flat group%s, %s", in->tag ? in->tag : "?",
           in->stage, in->world_size, tp, in->n_flat_groups, in->n_flat_groups == 1 ? "" : "s", zck_dtype_name(in->lp_dtype));
  zck__vreport_set(&c->r->detail, detail);
  for (size_t i = 0; i < in->n_warnings; i++) zck__vreport_add_unique(c->r, ZCK_VERIFY_WARNING, "structure", in->warnings[i]);
  c->ds_layout = (zck_manifest_layout){NULL, in->stage, in->world_size, in->n_flat_groups,
                                       (char *)zck_dtype_name(in->lp_dtype), (char *)zck_dtype_name(in->master_dtype),
                                       in->bf16_prefix};
  c->have_ds_layout = true;
  zck_ds_close(ck);
}

static void check_universal(vctx *c) {
  zck_uv_ckpt *u = NULL;
  zck_status st = zck_uv_open(c->path, NULL, &u);
  if (st != ZCK_OK) {
    zck__verify_add_status(c, st == ZCK_ERR_UNSUPPORTED ? ZCK_ERR_UNSUPPORTED : st, "structure", NULL, zck_last_error());
    return;
  }
  const zck_uv_info *in = zck_uv_info_of(u);
  char detail[256];
  char tp[48] = "";
  if (in->tp_size > 1) snprintf(tp, sizeof tp, ", AutoTP %u tensor-parallel ranks", in->tp_size);
  snprintf(detail, sizeof detail, "ZeRO stage %d source, world size %u%s, %s%s", in->stage, in->world_size, tp,
           zck_dtype_name(in->lp_dtype), in->has_optimizer_state ? ", with optimizer state" : "");
  zck__vreport_set(&c->r->detail, detail);
  c->ds_layout = (zck_manifest_layout){NULL, in->stage, in->world_size, 0, (char *)zck_dtype_name(in->lp_dtype),
                                       (char *)zck_dtype_name(in->master_dtype), false};
  c->have_ds_layout = true;
  zck_uv_close(u);
}

/* A torch Distributed Checkpoint through its reader (metadata, every file and item there,
 * chunk geometry); then every zip record of every item handed to the data pass, which
 * CRCs them as it reads each .distcp once. */
typedef struct dcp_recs {
  vctx *c;
  zck__strmap by_path;         /* full path -> file */
} dcp_recs;

static zck_status add_dcp_record(void *ctx, const zck_dcp_record *r) {
  dcp_recs *d = ctx;
  size_t fi;
  if (!zck__strmap_get(&d->by_path, r->path, &fi)) return ZCK_OK;   /* not listed (a manifest left it out) */
  vfile *f = &d->c->files[fi];
  if (!(f->n_recs & (f->n_recs + 1)) || !f->recs) {   /* grow at 0, 1, 3, 7, ... */
    vrecord *g = zck__realloc(f->recs, (2 * f->n_recs + 2) * sizeof *g);
    if (!g) return ZCK_ERR_NO_MEMORY;
    f->recs = g;
  }
  vrecord *v = &f->recs[f->n_recs];
  *v = (vrecord){zck__sprintf("%s (item %s)", r->name, r->key), r->off, r->size, r->crc32, r->method, zck__strdup(r->key)};
  if (!v->name || !v->tensors) {
    free(v->name);
    free(v->tensors);
    return ZCK_ERR_NO_MEMORY;
  }
  f->n_recs++;
  return ZCK_OK;
}

static zck_status check_dcp(vctx *c) {
  zck_dcp *d = NULL;
  zck_status st = zck_dcp_open(c->path, NULL, &d);
  if (st != ZCK_OK) {
    if (st == ZCK_ERR_NO_MEMORY) return st;
    zck__verify_add_status(c, st, "structure", NULL, zck_last_error());
    zck_clear_error();
    return ZCK_OK;
  }
  const zck_dcp_info *in = zck_dcp_info_of(d);
  char detail[256];
  snprintf(detail, sizeof detail, "torch Distributed Checkpoint, %zu data files, %zu items, weights %s%s", in->n_files,
           in->n_items, in->weight_dtype ? zck_dtype_name(in->weight_dtype) : "mixed",
           in->has_optimizer_state ? ", with optimizer state" : "");
  zck__vreport_set(&c->r->detail, detail);
  dcp_recs r = {c, {0}};
  for (size_t i = 0; st == ZCK_OK && i < c->n_files; i++) {
    bool dup;
    size_t prev;
    vfile *f = &c->files[i];
    const char *b = strrchr(f->full, '/');
    f->dcp_metadata = b && !strcmp(b + 1, ZCK_DCP_METADATA_FILE);
    st = zck__strmap_put(&r.by_path, f->full, i, &dup, &prev);
  }
  if (st == ZCK_OK) st = zck_dcp_each_record(d, add_dcp_record, &r);
  zck__strmap_free(&r.by_path);
  zck_dcp_close(d);
  if (st != ZCK_OK && st != ZCK_ERR_NO_MEMORY) {
    zck__verify_add_status(c, st, "structure", NULL, zck_last_error());
    zck_clear_error();
    st = ZCK_OK;
  }
  return st;
}

static void check_hf_index(vctx *c) {
  const char *hf_path = NULL;
  char *owned = NULL;
  if (c->hf_index_given) hf_path = c->path;
  else if (!c->single && (zck__verify_exists_in(c->base, "model.safetensors.index.json") || zck__verify_exists_in(c->base, "model.safetensors")))
    hf_path = owned = zck__strdup(c->base);
  if (!hf_path) return;
  for (size_t i = 0; i < c->n_files; i++)
    if (c->files[i].type == VF_SAFETENSORS && c->files[i].open_status != ZCK_OK) { free(owned); return; } /* already said */
  zck_hf_checkpoint *hc = NULL;
  zck_status st = zck_hf_open(hf_path, &hc);
  if (st != ZCK_OK) {
    zck__verify_add_status(c, st, "structure", NULL, zck_last_error());
  } else {
    for (size_t i = 0; i < zck_hf_warning_count(hc); i++)
      zck__vreport_add_unique(c->r, ZCK_VERIFY_WARNING, "structure", zck_hf_warning_at(hc, i));
    if (owned && zck_hf_checkpoint_index(hc)) /* the folder's index, checked against its shards */
      zck__vreport_checked(c->r, "model.safetensors.index.json");
    zck_hf_close(hc);
  }
  free(owned);
}

/* The rank in a DeepSpeed per-rank name ("..zero_pp_rank_R_mp_rank_.."), or -1: the
 * reader's own test (it refuses such copies too). */
static long rank_in(const char *name, size_t len) { return zck_ds_name_rank(name, len); }

static bool same_records(const vfile *a, const vfile *b) {
  if (a->n_recs != b->n_recs || !a->n_recs) return false;
  for (size_t i = 0; i < a->n_recs; i++)
    if (a->recs[i].crc != b->recs[i].crc || a->recs[i].size != b->recs[i].size) return false;
  return true;
}

/* Whether the report already holds damage in `full`: a finding about that file, or one
 * whose message names it ("FULL: what"; the DeepSpeed reader's findings carry no file).
 * Such a finding gets the file, as the copy check's own finding would have had it: one
 * finding per damaged file, with its file for --json. */
static bool damage_already_named(vctx *c, const char *full) {
  size_t n = strlen(full);
  for (size_t i = 0; i < c->r->n; i++) {
    zck_verify_finding *v = &c->r->v[i];
    if (v->severity != ZCK_VERIFY_DAMAGE) continue;
    if (v->file && !strcmp(v->file, full)) return true;
    if (!v->file && !strncmp(v->message, full, n) && v->message[n] == ':') {
      v->file = zck__strdup(full); /* NULL without memory: the finding stands without it */
      return true;
    }
  }
  return false;
}

/* A rank file replaced by another rank's: torch.save names its archive after the file, so
 * the records of a copy still say the other rank; and two ranks' partitions never have
 * every record equal. The file set and shapes can add up all the same (ZeRO-3 partitions
 * are padded to one size), so nothing else would notice, and consolidate would write the
 * other rank's values in its place. The DeepSpeed reader's identity check sees the first
 * such copy too: a file it already named is not named again (one line per damaged file). */
static void check_rank_copies(vctx *c) {
  for (size_t i = 0; i < c->n_files; i++) {
    vfile *f = &c->files[i];
    if (f->type != VF_TORCH || f->open_status != ZCK_OK || !f->n_recs || damage_already_named(c, f->full)) continue;
    const char *base = strrchr(f->rel, '/');
    base = base ? base + 1 : f->rel;
    long rank = rank_in(base, strlen(base));
    if (rank < 0) continue;
    const char *rec = f->recs[0].name, *slash = strchr(rec, '/');
    long arch = slash ? rank_in(rec, (size_t)(slash - rec)) : -1;
    if (arch >= 0 && arch != rank) {
      zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "structure", f->full, NULL, -1, 0,
                       "%s: holds rank %ld's archive ('%.*s'), not rank %ld's: a copy of another rank's file?", f->full,
                       arch, (int)(slash - rec), rec, rank);
      continue;
    }
    for (size_t j = 0; j < i; j++) {
      const vfile *g = &c->files[j];
      const char *gb = strrchr(g->rel, '/');
      gb = gb ? gb + 1 : g->rel;
      long grank = rank_in(gb, strlen(gb));
      if (g->type != VF_TORCH || g->open_status != ZCK_OK || !g->n_recs || grank < 0 || grank == rank) continue;
      /* both archives name their own rank: saved as those ranks, whatever their bytes (a
       * ZeRO-3 save with every sub-group swapped to NVMe holds the same bytes on every rank) */
      const char *grec = g->recs[0].name, *gslash = strchr(grec, '/');
      if (arch >= 0 && gslash && rank_in(grec, (size_t)(gslash - grec)) >= 0) continue;
      if (!zck__verify_ends_with(base, "optim_states.pt") || !zck__verify_ends_with(gb, "optim_states.pt")) continue;
      if (same_records(f, g)) {
        zck__vreport_add(c->r, ZCK_VERIFY_DAMAGE, "structure", f->full, NULL, -1, 0,
                         "%s: the same bytes as %s (every record's CRC-32 and size): a copy of another rank's file?",
                         f->full, g->full);
        break;
      }
    }
  }
}

/* zckpt's HDF5 universal container (to-universal --format hdf5): its metadata through the
 * reader (which walks it in a forked child first), then every dataset read back whole in
 * pieces, so a corrupt chunk shows: its zstd frame's checksum (zck_h5.h) or, in containers
 * written before those, a frame that does not decode. */
static zck_status read_stores(vctx *c, const zck_store *stores, size_t n, void *buf, size_t buf_bytes) {
  for (size_t i = 0; i < n; i++) {
    const zck_store *s = &stores[i];
    size_t esize = zck_dtype_size(s->dtype);
    if (!esize || s->kind != ZCK_STORE_CALLBACK || !s->read) continue;
    uint64_t step = buf_bytes / esize;
    for (uint64_t off = 0; off < s->numel; off += step) {
      uint64_t count = s->numel - off < step ? s->numel - off : step;
      zck_status st = s->read(s->ctx, buf, off, count);
      if (st == ZCK_ERR_NO_MEMORY) return st;
      if (st != ZCK_OK) {
        zck__verify_add_status(c, st == ZCK_ERR_IO ? ZCK_ERR_IO : ZCK_ERR_DAMAGED, "data", c->path, zck_last_error());
        zck_clear_error();
        break;
      }
      c->r->pub.bytes += count * esize;
    }
  }
  return ZCK_OK;
}

/* The container's datasets besides the tensors: /resume_state and every /side_files/<name>,
 * read whole like the tensors (their chunks carry zstd checksums too). */
static zck_status read_h5u_extras(vctx *c, const zck_h5u *u, void *buf, size_t buf_bytes) {
  zck_h5_file *f = zck_h5u_file(u);   /* the container as its open read it: not walked again */
  zck_status st = ZCK_OK;
  char **names = NULL;
  size_t n = 0;
  if (zck_h5_exists(f, ZCK_H5U_SIDE_FILES) && zck_h5_list(f, ZCK_H5U_SIDE_FILES, &names, &n) != ZCK_OK) {
    zck__verify_add_status(c, ZCK_ERR_DAMAGED, "structure", c->path, zck_last_error());
    zck_clear_error();
  }
  for (size_t i = 0; st != ZCK_ERR_NO_MEMORY && i <= n; i++) {
    char *path = i < n ? zck__sprintf("%s/%s", ZCK_H5U_SIDE_FILES, names[i]) : zck__strdup(ZCK_H5U_RESUME_STATE);
    if (!path) { st = ZCK_ERR_NO_MEMORY; break; }
    zck_h5_dataset *d = NULL;
    if (i < n || zck_h5_exists(f, path)) {
      zck_status ds = zck_h5_dataset_open(f, path, &d);
      if (ds == ZCK_OK) {
        zck_store s = zck_h5_dataset_store(d);
        st = read_stores(c, &s, 1, buf, buf_bytes);
        zck_h5_dataset_close(d);
      } else if (ds == ZCK_ERR_NO_MEMORY) {
        st = ds;
      } else {
        zck__verify_add_status(c, ds == ZCK_ERR_IO ? ZCK_ERR_IO : ZCK_ERR_DAMAGED, "data", c->path, zck_last_error());
        zck_clear_error();
      }
    }
    free(path);
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return st == ZCK_ERR_NO_MEMORY ? st : ZCK_OK;
}

static zck_status check_h5u(vctx *c) {
  c->r->pub.files = 1;
  zck__vreport_set(&c->r->kind, "hdf5");
  zck_h5_file *f = NULL;
  /* one walk of the metadata, in full: the container is built over the same file */
  zck_status st = zck_h5_open(c->path, &f);
  if (st == ZCK_OK) {
    char *fmt = NULL;
    /* the root attributes' digest first: a damaged one may be what names the format */
    zck_status ds = zck_h5_check_attrs(f);
    if (ds != ZCK_OK) {
      zck_h5_close(f);
      if (ds == ZCK_ERR_NO_MEMORY) return ds;
      zck__verify_add_status(c, ds == ZCK_ERR_IO ? ZCK_ERR_IO : ZCK_ERR_DAMAGED, "structure", c->path, zck_last_error());
      zck_clear_error();
      return ZCK_OK;
    }
    bool ours = zck_h5_attr_str(f, "/", "zckpt_format", &fmt) == ZCK_OK && !strcmp(fmt, ZCK_H5U_FORMAT);
    free(fmt);
    zck_clear_error();
    if (!ours) {
      zck_h5_close(f);
      if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = ZCK_ERR_UNSUPPORTED;
      zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "coverage", c->path, NULL, -1, 0,
                       "%s: an HDF5 file but not a zckpt universal container: zckpt checks only its own", c->path);
      return ZCK_OK;
    }
  }
  zck_h5u *u = NULL;
  if (st == ZCK_OK) st = zck_h5u_open_file(f, &u);
  if (st != ZCK_OK) {
    if (st == ZCK_ERR_NO_MEMORY) return st;
    zck__verify_add_status(c, st, "structure", c->path, zck_last_error());
    zck_clear_error();
    return ZCK_OK;
  }
  zck__vreport_set(&c->r->kind, "hdf5-universal");
  const zck_h5u_info *in = zck_h5u_info_of(u);
  char detail[256];
  snprintf(detail, sizeof detail, "ZeRO stage %d source, world size %u%s%s", in->stage, in->world_size,
           in->tag ? ", tag " : "", in->tag ? in->tag : "");
  zck__vreport_set(&c->r->detail, detail);
  if (c->o.skip_data) {
    zck_h5u_close(u);
    return ZCK_OK;
  }
  enum { BUF = 4 << 20 };
  void *buf = zck__malloc(BUF);
  if (!buf) { zck_h5u_close(u); return ZCK_ERR_NO_MEMORY; }
  st = ZCK_OK;
  for (int p = 0; st == ZCK_OK && p < ZCK_H5U_PART_COUNT; p++) {
    const zck_layout *l = NULL;
    const zck_store *stores = NULL;
    if (zck_h5u_get(u, (zck_h5u_part)p, &l, &stores) != ZCK_OK || !l) { zck_clear_error(); continue; }
    st = read_stores(c, stores, l->n_stores, buf, BUF);
  }
  if (st == ZCK_OK) {
    const zck_layout *l = NULL;
    const zck_store *stores = NULL;
    zck_h5u_buffers(u, &l, &stores);
    if (l) st = read_stores(c, stores, l->n_stores, buf, BUF);
  }
  if (st == ZCK_OK) st = read_h5u_extras(c, u, buf, BUF);
  free(buf);
  bool table = zck_h5_has_checksums(zck_h5u_file(u));
  zck_h5u_close(u);
  if (st == ZCK_OK && table)
    zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                     "HDF5 container: metadata checked and every dataset read against its checksum table (the "
                     "XXH3-64 of each piece as written, bound to its dataset's name, dtype and shape)");
  else if (st == ZCK_OK)
    zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                     "HDF5 container without a checksum table (written before zckpt added it): structure checks "
                     "only; every dataset decompressed (zstd frame checksums checked where the chunks carry them), "
                     "but a dataset swapped, replaced or edited with valid chunks cannot be seen");
  return st;
}

zck_status zck__verify_structure(vctx *c) {
  if (c->single && !c->is_ds && !c->is_uv && zck__src_sniff(c->path) == ZCK__SRC_HDF5) {
    c->is_h5u = true;
    return check_h5u(c);
  }
  if (c->is_ds) check_deepspeed(c);
  if (c->is_uv) check_universal(c);
  ZCK_TRY(zck__parallel_for(c->n_files, c->o.threads, open_item, c->files));
  size_t n_st = 0, n_pt = 0;
  for (size_t i = 0; i < c->n_files; i++) {
    vfile *f = &c->files[i];
    n_st += f->type == VF_SAFETENSORS;
    n_pt += f->type == VF_TORCH;
    if (f->open_status != ZCK_OK) zck__verify_add_status(c, f->open_status, "structure", f->full, f->open_error ? f->open_error : "cannot open");
    for (size_t k = 0; k < f->n_warnings; k++) zck__vreport_add_unique(c->r, ZCK_VERIFY_WARNING, "structure", f->warnings[k]);
  }
  if (c->is_ds) check_rank_copies(c);
  if (c->is_dcp) ZCK_TRY(check_dcp(c));
  if (!c->is_ds && !c->is_uv && !c->is_dcp) {
    check_hf_index(c);
    zck_manifest_kind k = c->expected ? c->expected->kind : ZCK_MANIFEST_OTHER;
    const char *kind = k != ZCK_MANIFEST_OTHER ? zck_manifest_kind_name(k)
                       : n_st ? "safetensors" : n_pt ? "torch" : c->single ? "file" : "directory";
    zck__vreport_set(&c->r->kind, kind);
  }
  if (!c->is_ds && !c->is_uv && !c->is_dcp && !c->expected && !n_st && !n_pt && !c->hf_index_given) {
    if (c->r->first_unchecked == ZCK_OK) c->r->first_unchecked = ZCK_ERR_UNSUPPORTED;
    zck__vreport_add(c->r, ZCK_VERIFY_UNCHECKABLE, "coverage", c->path, NULL, -1, 0,
                     "%s: nothing zckpt can check: no .pt/.bin, .safetensors, DeepSpeed checkpoint or " ZCK_MANIFEST_NAME,
                     c->path);
  }
  if (!c->expected && n_st)
    zck__vreport_add(c->r, ZCK_VERIFY_NOTE, "coverage", NULL, NULL, -1, 0,
                     "safetensors files carry no checksums: their tensor bytes were not checked (a zckpt manifest would cover them)");
  return ZCK_OK;
}
