/* ds_open.c: zck_ds_open: find the files, read every file's metadata, check that the
 * files agree with each other (stage, world size, rank set, versions), then describe
 * (ds_describe.c). Also the reader's accessors and zck_ds_close. */
#include "ds_internal.h"
#include "manifest.h"
#include "threadpool.h"

#include <stdio.h>
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <string.h>

static bool same_shape_lists(const zck__ds_model_file *a, const zck__ds_model_file *b) {
  if (a->n_param_shapes != b->n_param_shapes) return false;
  for (size_t g = 0; g < a->n_param_shapes; g++) {
    const zck__ds_shape_list *x = &a->param_shapes[g], *y = &b->param_shapes[g];
    if (x->n != y->n) return false;
    for (size_t i = 0; i < x->n; i++) {
      if (strcmp(x->v[i].name, y->v[i].name) || x->v[i].ndim != y->v[i].ndim) return false;
      for (int d = 0; d < x->v[i].ndim; d++)
        if (x->v[i].shape[d] != y->v[i].shape[d]) return false;
    }
  }
  return true;
}

static bool str_eq(const char *a, const char *b) { return (!a && !b) || (a && b && !strcmp(a, b)); }

/* Reads rank 0's optimizer file first: it gives the stage and the world size the rest of
 * the file set is checked against. */
static int by_print(const void *a, const void *b, void *ctx) {
  const zck__ds_optim_file *o = ctx;
  uint64_t x = o[*(const uint32_t *)a].records_print, y = o[*(const uint32_t *)b].records_print;
  return x < y ? -1 : x > y;
}

/* A rank file copied over another rank's, where the archive name cannot tell (a file saved
 * under another name, or through a file object: "archive"). Two ranks' partitions never
 * have every record equal (the data are different slices of the model), so two files whose
 * records all carry the same CRC-32 and size are one file twice; the other rank's values
 * would be written in this rank's place. verify says the same (verify_structure.c). Two
 * files whose archives both name their own rank were saved as those ranks: not compared
 * (a ZeRO-3 save with every sub-group swapped to NVMe holds only empty partitions and the
 * same pickle on every rank). Sorting the fingerprints keeps this O(W log W): a file
 * whose archive names no rank is next to some other member of its group. */
static zck_status check_copies(const zck_ds_ckpt *c) {
  uint32_t w = (uint32_t)c->n_optims;
  if (w < 2) return ZCK_OK;
  uint32_t *order = zck__malloc(w * sizeof *order);
  if (!order) return ZCK_ERR_NO_MEMORY;
  for (uint32_t r = 0; r < w; r++) order[r] = r;
  qsort_r(order, w, sizeof *order, by_print, c->optims);
  zck_status s = ZCK_OK;
  for (uint32_t i = 1; i < w && s == ZCK_OK; i++) {
    const zck__ds_optim_file *a = &c->optims[order[i - 1]], *b = &c->optims[order[i]];
    if (a->records_print != b->records_print || a->n_records != b->n_records) continue;
    if (a->archive_ranked && b->archive_ranked) continue;
    const zck__ds_optim_file *copy = order[i - 1] > order[i] ? a : b, *orig = copy == a ? b : a;
    s = zck__fail(ZCK_ERR_MISMATCH,
                  "%s: the same bytes as %s (every record's CRC-32 and size): a copy of another rank's file?",
                  copy->file->path, orig->file->name);
  }
  free(order);
  return s;
}

static zck_status read_optims(zck_ds_ckpt *c) {
  zck__ds_fileset *fs = &c->fs;
  if (fs->optims[0].rank != 0) {
    char *name = zck__ds_optim_name_mp(fs->prefix, 0, fs->mp);
    zck_status s = zck__fail(ZCK_ERR_NOT_FOUND, "%s/%s: missing optimizer file for dp rank 0 (found %zu others, first %s)",
                             fs->dir, name ? name : "?", fs->n_optims, fs->optims[0].name);
    free(name);
    return s;
  }
  zck__ds_optim_file o0 = {.file = &fs->optims[0]};
  /* one allocation for every rank file found: rank 0's torch file (kept open as optim0)
   * points at optims[0].src, so the array must never move afterwards */
  size_t cap = fs->n_optims ? fs->n_optims : 1;
  c->optims = zck__calloc(cap, sizeof *c->optims);
  if (!c->optims) return ZCK_ERR_NO_MEMORY;
  c->optims[0] = o0;
  c->n_optims = 1;
  ZCK_TRY(zck__ds_read_optim_file(c, &c->optims[0], true));
  const zck__ds_optim_file *r0 = &c->optims[0];
  uint32_t w = r0->partition_count;
  int stage = r0->zero_stage;
  char who[600];
  snprintf(who, sizeof who, "partition_count in %s", fs->optims[0].name);
  ZCK_TRY(zck__ds_check_ranks(fs, w, stage, who));
  c->info.stage = stage;
  c->info.bf16_optimizer = r0->bf16_optimizer;
  c->info.world_size = w;
  if (w > cap) /* check_ranks has already refused a file set that does not match w */
    return zck__fail(ZCK_ERR_MISMATCH, "%s: partition_count %u but %zu optimizer files", fs->dir, w, fs->n_optims);
  r0 = &c->optims[0];
  for (uint32_t r = 1; r < w; r++) {
    memset(&c->optims[r], 0, sizeof c->optims[r]);
    c->optims[r].file = &fs->optims[r];
  }
  c->n_optims = w;
  for (uint32_t r = 1; r < w; r++) {
    zck__ds_optim_file *o = &c->optims[r];
    ZCK_TRY(zck__ds_read_optim_file(c, o, false));
    const char *p = o->file->path;
    if (o->zero_stage != stage)  /* DS-42 */
      return zck__fail(ZCK_ERR_MISMATCH, "%s: zero_stage %d but %s has %d", p, o->zero_stage, fs->optims[0].name, stage);
    if (o->bf16_optimizer != r0->bf16_optimizer)
      return zck__fail(ZCK_ERR_MISMATCH, "%s: %s BF16_Optimizer file but %s is %s", p, o->bf16_optimizer ? "a" : "not a",
                       fs->optims[0].name, r0->bf16_optimizer ? "one" : "not");
    if (o->partition_count != w)  /* DS-43 */
      return zck__fail(ZCK_ERR_MISMATCH, "%s: partition_count %u but %s has %u (mixed checkpoints?)", p,
                       o->partition_count, fs->optims[0].name, w);
    if (o->n_flat != r0->n_flat)  /* DS-50 */
      return zck__fail(ZCK_ERR_MISMATCH, "%s: %zu flat groups but %s has %zu", p, o->n_flat, fs->optims[0].name,
                       r0->n_flat);
    if (!str_eq(o->ds_version, r0->ds_version))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: ds_version '%s' but %s has '%s'", p, o->ds_version ? o->ds_version : "(none)",
                       fs->optims[0].name, r0->ds_version ? r0->ds_version : "(none)");
  }
  /* before the partitions are added up: a copy is named as one, not as the partition
   * sizes or param_slice_mappings it makes inconsistent */
  return check_copies(c);
}

/* No optimizer files: a ZeRO-0 checkpoint, whose model file holds the optimizer state. */
static zck_status read_zero0(zck_ds_ckpt *c) {
  c->zero0 = true;
  c->info.stage = 0;
  c->n_models = 1;
  if (!(c->models = zck__calloc(1, sizeof *c->models))) return ZCK_ERR_NO_MEMORY;
  c->models[0].file = &c->fs.model;
  ZCK_TRY(zck__ds_read_model_file(c, &c->models[0], true));
  ZCK_TRY(zck__ds_take_warnings(c, &c->models[0]));
  return zck__ds_zero0_read(c);
}

/* AutoTP: DeepSpeed computes shared_params on global rank 0 only, so the model files of
 * the other TP ranks save {} though their module ties the same params. */
static zck_status copy_ties(zck__ds_model_file *mf, const zck__ds_model_file *from) {
  if (mf->n_shared || !from->n_shared) return ZCK_OK;
  free(mf->shared_alias);  /* the reader's empty arrays */
  free(mf->shared_src);
  mf->shared_alias = zck__calloc(from->n_shared, sizeof(char *));
  mf->shared_src = zck__calloc(from->n_shared, sizeof(char *));
  if (!mf->shared_alias || !mf->shared_src) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < from->n_shared; i++) {
    mf->shared_alias[i] = zck__strdup(from->shared_alias[i]);
    mf->shared_src[i] = zck__strdup(from->shared_src[i]);
    mf->n_shared++;
    if (!mf->shared_alias[i] || !mf->shared_src[i]) return ZCK_ERR_NO_MEMORY;
  }
  mf->has_shared = true;
  return ZCK_OK;
}

/* Stage 3 has a model file per rank, each a whole pickle to load (at 100k params, 19 MB
 * and a third of reading the checkpoint): they are read on c->threads threads. What is
 * checked and said stays in rank order: each read's outcome is kept, then the ranks are
 * gone through one by one as when they were read one after another. */
typedef struct model_reads {
  zck_ds_ckpt *c;
  zck_status *st;                  /* per rank; ZCK_ERR_INTERNAL: not read (an earlier rank failed) */
  char **why;                      /* a failed read's message */
} model_reads;

static zck_status read_one_model(void *ctx, size_t r, unsigned thread) {
  (void)thread;
  model_reads *x = ctx;
  zck__ds_model_file *m = &x->c->models[r];
  zck_status s = zck__ds_read_model_file(x->c, m, r == 0);
  if (s == ZCK_OK && r > 0) {
    /* Only the frozen fragments of the other ranks are used: drop the rest now. */
    for (size_t i = 0; i < m->n_module; i++) free(m->module_names[i]);
    free(m->module_names);
    free(m->module_t);
    m->module_names = NULL;
    m->module_t = NULL;
    m->n_module = 0;
  }
  x->st[r] = s;
  if (s != ZCK_OK) x->why[r] = zck__strdup(zck_last_error());
  return s; /* a failure stops the ranks after it: rank order reports it first anyway */
}

static zck_status check_model(const zck_ds_ckpt *c, const zck__ds_model_file *m) {
  const zck__ds_model_file *m0 = &c->models[0];
  const char *p = m->file->path;
  /* DS-32 */
  if (!same_shape_lists(m, m0))
    return zck__fail(ZCK_ERR_MISMATCH, "%s: param_shapes differ from %s", p, m0->file->name);
  if (m->dp_world_size != m0->dp_world_size)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: dp_world_size %lld but %s has %lld", p, (long long)m->dp_world_size,
                     m0->file->name, (long long)m0->dp_world_size);
  if (!str_eq(m->ds_version, m0->ds_version))
    return zck__fail(ZCK_ERR_MISMATCH, "%s: ds_version '%s' but %s has '%s'", p, m->ds_version ? m->ds_version : "(none)",
                     m0->file->name, m0->ds_version ? m0->ds_version : "(none)");
  if (m->has_frozen_frags != m0->has_frozen_frags)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: frozen_param_fragments %s but %s %s", p,
                     m->has_frozen_frags ? "present" : "absent", m0->file->name,
                     m0->has_frozen_frags ? "has them" : "does not");
  return ZCK_OK;
}

static zck_status read_models(zck_ds_ckpt *c) {
  zck__ds_fileset *fs = &c->fs;
  uint32_t w = c->info.world_size;
  c->n_models = c->info.stage == 3 ? w : 1;
  c->models = zck__calloc(c->n_models, sizeof *c->models);
  if (!c->models) return ZCK_ERR_NO_MEMORY;
  for (size_t r = 0; r < c->n_models; r++) c->models[r].file = c->info.stage == 3 ? &fs->z3_models[r] : &fs->model;
  model_reads x = {c, zck__malloc(c->n_models * sizeof *x.st), zck__calloc(c->n_models, sizeof *x.why)};
  zck_status s = x.st && x.why ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t r = 0; s == ZCK_OK && r < c->n_models; r++) x.st[r] = ZCK_ERR_INTERNAL;
  if (s == ZCK_OK) (void)zck__parallel_for(c->n_models, c->threads, read_one_model, &x);
  for (size_t r = 0; s == ZCK_OK && r < c->n_models; r++) {
    if (x.st[r] != ZCK_OK) {
      s = x.why[r] ? zck__fail(x.st[r], "%s", x.why[r]) : ZCK_ERR_NO_MEMORY;
      break;
    }
    if (r == 0 && c->tie_from) s = copy_ties(&c->models[0], c->tie_from);
    if (s == ZCK_OK && r > 0) s = check_model(c, &c->models[r]);
    if (s == ZCK_OK) s = zck__ds_take_warnings(c, &c->models[r]);
  }
  for (size_t r = 0; x.why && r < c->n_models; r++) free(x.why[r]);
  free(x.why);
  free(x.st);
  ZCK_TRY(s);
  const zck__ds_model_file *m0 = &c->models[0];
  if (m0->dp_world_size != (int64_t)w)  /* DS-44 */
    return zck__fail(ZCK_ERR_MISMATCH, "%s: dp_world_size %lld but there are %u optimizer files (partition_count %u)",
                     m0->file->path, (long long)m0->dp_world_size, w, w);
  return ZCK_OK;
}

/* Rank identity from the counters the files carry. ZeRO ranks step together, and every
 * flat group / sub-group with them: DeepSpeed's engine counts each step in global_steps,
 * those an fp16 overflow skipped also in skipped_steps, and the optimizer's `step` counts
 * the others. So every optimizer file's step of every group equals global_steps -
 * skipped_steps of the model file(s), which agree with each other (stage 3: one per rank).
 * A rank file taken from another checkpoint of the run (or every optimizer file from
 * another step) has a consistent file set and shapes, and would silently mix steps; this
 * names it. (A run whose optimizer state was reset on resume while global_steps went on,
 * load_optimizer_states=False, breaks the equality too, and is refused with the same line.)
 * float32 `step` tensors count exactly only up to 2^24: past that, only equality between
 * the files is asked. FP16_UnfusedOptimizer (ZeRO-0 + bf16) steps once with zero gradients
 * when it is built; a reshard of its checkpoint carries that count on (the next step's bias
 * correction depends on it) and says so in the model files' `zckpt_step_ahead`. */
static zck_status check_steps(const zck_ds_ckpt *c) {
  const zck__ds_model_file *m0 = &c->models[0];
  for (size_t r = 1; r < c->n_models; r++) {
    const zck__ds_model_file *m = &c->models[r];
    if (m->global_steps != m0->global_steps || m->skipped_steps != m0->skipped_steps || m->step_ahead != m0->step_ahead)
      return zck__fail(ZCK_ERR_MISMATCH,
                       "%s: global_steps %lld, skipped_steps %lld, but %s has %lld, %lld: rank files from different steps",
                       m->file->path, (long long)m->global_steps, (long long)m->skipped_steps, m0->file->name,
                       (long long)m0->global_steps, (long long)m0->skipped_steps);
  }
  int64_t applied = m0->global_steps - m0->skipped_steps;
  const zck__ds_flat *ref = NULL;
  const zck__ds_optim_file *ref_file = NULL;
  for (size_t r = 0; r < c->n_optims; r++) {   /* ZeRO-0: its reader checked the steps */
    const zck__ds_optim_file *o = &c->optims[r];
    for (size_t g = 0; g < o->n_flat; g++) {
      const zck__ds_flat *f = &o->flat[g];
      if (!f->has_state || !f->has_step) continue;
      bool exact = f->step < 16777216.0 && applied < 16777216;
      if (exact && f->step != (double)(applied + m0->step_ahead))
        return zck__fail(ZCK_ERR_MISMATCH,
                         "%s: optimizer step %.17g (flat group %zu), but %s says global_steps %lld - skipped_steps %lld%s = "
                         "%lld: rank files from different steps",
                         o->file->path, f->step, g, m0->file->name, (long long)m0->global_steps,
                         (long long)m0->skipped_steps, m0->step_ahead ? " + zckpt_step_ahead 1" : "",
                         (long long)(applied + m0->step_ahead));
      if (ref && f->step != ref->step)
        return zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer step %.17g (flat group %zu), but %s has %.17g: rank files from "
                         "different steps", o->file->path, f->step, g, ref_file->file->name, ref->step);
      if (!ref) {
        ref = f;
        ref_file = o;
      }
    }
  }
  return ZCK_OK;
}

static zck_status open_files(zck_ds_ckpt *c, const char *path, const zck_ds_open_opts *o, uint32_t mp) {
  c->topts = o->torch;
  c->threads = o->threads;
  c->info.tp_size = 1;
  zck_status s = zck__ds_find_mp(path, o->tag, mp, &c->fs);
  if (s == ZCK_OK) s = c->fs.n_optims ? read_optims(c) : read_zero0(c);
  if (s == ZCK_OK && !c->zero0) s = read_models(c);
  return s;
}

zck_status zck__ds_open_files(const char *path, const zck_ds_open_opts *o, uint32_t mp, zck_ds_ckpt **out) {
  *out = NULL;
  zck_ds_ckpt *c = zck__calloc(1, sizeof *c);
  if (!c) return ZCK_ERR_NO_MEMORY;
  zck_status s = open_files(c, path, o, mp);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    return s;
  }
  *out = c;
  return ZCK_OK;
}

zck_status zck__ds_open_mp(const char *path, const zck_ds_open_opts *o, uint32_t mp, const zck__ds_model_file *tie_from,
                           zck_ds_ckpt **out) {
  *out = NULL;
  zck_ds_ckpt *c = zck__calloc(1, sizeof *c);
  if (!c) return ZCK_ERR_NO_MEMORY;
  c->tie_from = tie_from;
  zck_status s = open_files(c, path, o, mp);
  /* a PipelineModule's stages are merged into one ZeRO checkpoint before anything reads the records */
  if (s == ZCK_OK && c->fs.n_layers && mp == 0) s = zck__ds_pipe_prepare(c, path, o);
  if (s == ZCK_OK && !c->zero0) s = zck__ds_moe_prepare(c);  /* before AutoEP's, which refuses expert files it lacks a record of */
  if (s == ZCK_OK && !c->zero0 && !c->legacy_moe) s = zck__ds_autoep_prepare(c);
  if (s == ZCK_OK) s = check_steps(c);
  if (s == ZCK_OK) s = zck__ds_describe(c);
  if (s == ZCK_OK && c->autoep) s = zck__ds_autoep_finish(c, !o->autoep_ds_names);
  if (s == ZCK_OK && c->legacy_moe) s = zck__ds_moe_finish(c);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    return s;
  }
  *out = c;
  return ZCK_OK;
}

zck_status zck_ds_open(const char *path, const zck_ds_open_opts *opts, zck_ds_ckpt **out) {
  ZCK_ASSERT(path && out);
  *out = NULL;
  zck_ds_open_opts o = ZCK_DS_OPEN_OPTS_INIT;
  if (opts) o = *opts;
  zck_ds_ckpt *c = NULL;
  zck_status s = zck__ds_open_mp(path, &o, 0, NULL, &c);
  if (s != ZCK_OK) return s;
  if (c->fs.n_mp > 1 && !c->pipe) s = zck__ds_autotp(c, path, &o);
  if (s == ZCK_OK && o.require_optimizer_state && !c->info.has_optimizer_state)  /* DS-48 */
    s = zck__fail(ZCK_ERR_NOT_FOUND,
                  "%s: no optimizer state (exp_avg / exp_avg_sq): saved before the first optimizer step, or removed",
                  c->fs.dir);
  if (s != ZCK_OK) {
    zck_ds_close(c);
    return s;
  }
  *out = c;
  return ZCK_OK;
}

void zck_ds_close(zck_ds_ckpt *c) {
  if (!c) return;
  for (uint32_t t = 0; t < c->n_tp; t++) zck_ds_close(c->tp[t]);
  free(c->tp);
  free(c->tp_vocab);
  for (size_t i = 0; i < c->n_models; i++) zck__ds_model_file_free(&c->models[i]);
  free(c->models);
  for (size_t r = 0; r < c->n_optims; r++) zck__ds_optim_file_free(&c->optims[r]);
  free(c->optims);
  zck_torch_close(c->model0);
  zck_pk_doc_free(c->carried);
  zck_torch_close(c->optim0);
  zck__ds_zero0_free(&c->z0);
  zck_model_free(c->model);
  zck_layout_free(c->train_layout);
  zck_layout_free(c->lp_layout);
  zck_layout_free(c->frozen_layout);
  zck_layout_free(c->buffer_layout);
  for (int p = 0; p < ZCK_DS_PART_COUNT; p++) free(c->stores[p]);
  free(c->buffer_stores);
  for (size_t i = 0; i < c->n_store_names; i++) free(c->store_names[i]);
  free(c->store_names);
  for (size_t i = 0; i < c->n_records; i++) {
    free((char *)c->records[i]->what);
    free(c->records[i]);
  }
  free(c->records);
  free(c->outputs);
  zck_manifest_free(c->manifest);
  zck__ds_offload_free(c->offload);
  zck__ds_autoep_free(c->autoep);
  zck__ds_moe_free(c->moe);
  zck__ds_pipe_free(c->pipe);
  for (size_t i = 0; i < c->n_warnings; i++) free(c->warnings[i]);
  free(c->warnings);
  free(c->lp_missing);
  free(c->unsaved_ties);
  free(c->unsaved_pairs);
  free(c->param_mod);
  free(c->buffer_mod);
  free(c->flat_params);
  free(c->flat_first);
  zck__ds_fileset_free(&c->fs);
  free(c);
}

const zck_ds_info *zck_ds_info_of(const zck_ds_ckpt *c) { return &c->info; }
const zck_model *zck_ds_model(const zck_ds_ckpt *c) { return c->model; }

zck_status zck_ds_get(const zck_ds_ckpt *c, zck_ds_part part, zck_ds_view *out) {
  ZCK_ASSERT(part >= 0 && part < ZCK_DS_PART_COUNT);
  memset(out, 0, sizeof *out);
  switch (part) {
  case ZCK_DS_FP32:
    out->layout = c->train_layout;
    break;
  case ZCK_DS_EXP_AVG:
  case ZCK_DS_EXP_AVG_SQ:
    if (!c->info.has_optimizer_state)
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no optimizer state (exp_avg / exp_avg_sq) in this checkpoint", c->fs.dir);
    out->layout = c->train_layout;
    break;
  case ZCK_DS_LP:
    if (c->info.stage == 3)
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s: stage-3 model files hold no 16-bit weights (module entries are empty)",
                       c->fs.dir);
    if (!c->lp_layout)
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s: 16-bit module weights unavailable: %s", c->fs.dir,
                       c->lp_missing ? c->lp_missing : "not saved");
    out->layout = c->lp_layout;
    break;
  case ZCK_DS_FROZEN:
    if (!c->frozen_layout) return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no frozen parameters", c->fs.dir);
    out->layout = c->frozen_layout;
    break;
  default:
    return zck__fail(ZCK_ERR_INVALID_ARG, "unknown part %d", (int)part);
  }
  out->stores = c->stores[part];
  return ZCK_OK;
}

zck_ds_view zck_ds_buffers(const zck_ds_ckpt *c) {
  zck_ds_view v = {c->buffer_layout, c->buffer_stores};
  return v;
}

const zck_ds_output *zck_ds_outputs(const zck_ds_ckpt *c, size_t *n) {
  *n = c->n_outputs;
  return c->outputs;
}

zck_status zck_ds_drop_model_pickle(zck_ds_ckpt *c, zck_ds_write_opts *o) {
  if (!c->model0 || c->carried) return ZCK_OK;
  zck_pk_doc *d = zck_pk_doc_new();
  if (!d) return ZCK_ERR_NO_MEMORY;
  zck_pk *cfg = NULL, *sched = NULL, *attrs = NULL;
  bool ok = (!c->ds_config || (cfg = zck__ds_pk_copy(d, c->ds_config))) &&
            (!c->lr_scheduler || (sched = zck__ds_pk_copy(d, c->lr_scheduler))) &&
            (!o->module_attrs || (attrs = zck__ds_pk_copy(d, o->module_attrs)));
  if (!ok) {
    zck_pk_doc_free(d);
    zck_clear_error();
    return ZCK_OK;
  }
  if (o->ds_config == c->ds_config) o->ds_config = cfg;
  if (o->lr_scheduler == c->lr_scheduler) o->lr_scheduler = sched;
  o->module_attrs = attrs;
  c->ds_config = cfg;
  c->lr_scheduler = sched;
  c->carried = d;
  zck_torch_close(c->model0);
  c->model0 = NULL;
#ifdef __GLIBC__
  /* the model files were read on worker threads, whose malloc arenas keep the pages of
   * what they freed (the other ranks' pickles, and now this one) resident; the writer's
   * trees and the copy, on other threads, would not reuse them */
  malloc_trim(0);
#endif
  return ZCK_OK;
}

const zck_pk *zck_ds_ds_config(const zck_ds_ckpt *c) { return c->ds_config; }
const zck_pk *zck_ds_lr_scheduler(const zck_ds_ckpt *c) { return c->lr_scheduler; }
const zck_pk *zck_ds_loss_scaler(const zck_ds_ckpt *c) { return c->loss_scaler; }
const zck_pk *zck_ds_client_state(const zck_ds_ckpt *c) { return c->model0 ? zck_torch_root(c->model0) : NULL; }

/* AutoTP: every TP rank's model files, rank 0's first. */
size_t zck_ds_model_file_count(const zck_ds_ckpt *c) { return c->n_models * (c->n_tp + 1) + zck__ds_pipe_model_files(c); }

zck_ds_file zck_ds_model_file(const zck_ds_ckpt *c, size_t i) {
  ZCK_ASSERT(i < zck_ds_model_file_count(c));
  if (i >= c->n_models * (c->n_tp + 1)) {  /* a pipeline's later stages */
    const zck__ds_rankfile *f = zck__ds_pipe_model_file(c, i - c->n_models * (c->n_tp + 1));
    return (zck_ds_file){f->name, f->path, f->size};
  }
  const zck_ds_ckpt *sub = i < c->n_models ? c : c->tp[i / c->n_models - 1];
  const zck__ds_rankfile *f = sub->models[i % c->n_models].file;
  return (zck_ds_file){f->name, f->path, f->size};
}

/* Their sources are c->models[0].src and c->optims[0].src: arrays that never move after
 * open (see read_optims), so zck_torch_source() of these files stays valid. */
const zck_torch_file *zck_ds_rank0_model(const zck_ds_ckpt *c) { return c->model0; }
const zck_torch_file *zck_ds_rank0_optim(const zck_ds_ckpt *c) { return c->optim0; }

const struct zck_manifest *zck_ds_manifest(const zck_ds_ckpt *c) { return c->manifest; }

/* The manifest the reader parsed at open is the one checked: a job parses it once. A
 * folder without one (or with one that does not parse) goes to the plain check, which
 * looks for the partial marker or explains the parse failure. */
zck_status zck_ds_check_complete(const zck_ds_ckpt *c, int force) {
  if (force) return ZCK_OK;
  if (c->manifest) return zck__manifest_check_sizes(c->fs.dir, c->manifest);
  return zck_manifest_check_complete(c->fs.dir, force);
}

size_t zck_ds_unsaved_tie_count(const zck_ds_ckpt *c) { return c->n_unsaved_ties; }

void zck_ds_unsaved_tie(const zck_ds_ckpt *c, size_t i, const char **alias, const char **source) {
  ZCK_ASSERT(i < c->n_unsaved_ties);
  *alias = c->models[0].shared_alias[c->unsaved_ties[i]];
  *source = c->models[0].shared_src[c->unsaved_ties[i]];
}
