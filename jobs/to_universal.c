/* to_universal.c: `zckpt to-universal`: a DeepSpeed ZeRO checkpoint to a universal one.
 *
 * The DeepSpeed reader describes the source (manifest, ZeRO layouts of fp32 / exp_avg /
 * exp_avg_sq, the rank-0 pickles) as a state view. For the DeepSpeed layout (this file) the
 * universal writer reserves zero/<param>/<state>.pt files batch by batch and hands back the
 * state views they make (whole tensors); each batch is one zck_transfer from the reader's
 * view into them, then the direct copies (the 0.19.8 `module` fallback files). Then step.pt,
 * zero/optimizer_state.pt (the rank-0 optimizer state as ds_to_universal reshapes it) and
 * byte copies of the model-states files, checked as they are copied, in one executor run;
 * then zckpt-manifest.json, its tensor files' hashes
 * made as they were written; the folder appears in one rename, then latest_universal.
 * Where ds_to_universal extracts every fragment to a temporary tree and merges it back,
 * each byte here is read once, straight from the rank files into the final files.
 * The HDF5 output is in to_universal_h5.c.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "deepspeed/deepspeed.h"
#include "manifest.h"
#include "plan.h"
#include "source.h"
#include "stream_hash.h"
#include "threadpool.h"
#include "to_universal.h"
#include "transfer.h"
#include "universal/universal.h"

// ---- shared helpers

int zck__uvj_progress_fn(void *ctx, uint64_t done, uint64_t total) {
  zck__uvj_progress *p = ctx;
  uint64_t t = p->base + total > p->total ? p->base + total : p->total;
  return p->cb ? p->cb(p->ctx, p->base + done, t) : 0;
}

zck_exec_opts zck__uvj_exec_opts(const zck_universal_opts *o, zck__uvj_progress *p) {
  zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
  eo.threads = o->threads;
  eo.no_verify = o->no_verify != 0;
  if (p->cb) {
    eo.progress = zck__uvj_progress_fn;
    eo.progress_ctx = p;
  }
  return eo;
}

void zck__uvj_progress_advance(zck__uvj_progress *p, uint64_t bytes) { p->base += bytes; }

cJSON *zck__uvj_pk_json(const zck_pk *n, int depth, size_t *budget) {
  char buf[256];
  /* a pickle's memo lets one object be referenced many times, and a dict contain itself:
   * expanded into JSON that is exponential (or endless), so the values are counted */
  if (!*budget) return NULL;
  --*budget;
  if (!n || n->kind == ZCK_PK_NONE) return cJSON_CreateNull();
  if (depth > 64) return cJSON_CreateString("...");
  switch (n->kind) {
  case ZCK_PK_BOOL: return cJSON_CreateBool(n->u.b);
  case ZCK_PK_INT: return cJSON_CreateNumber((double)n->u.i);
  case ZCK_PK_FLOAT:
    if (isfinite(n->u.f)) return cJSON_CreateNumber(n->u.f);
    return cJSON_CreateString(isnan(n->u.f) ? "nan" : n->u.f > 0 ? "inf" : "-inf");
  case ZCK_PK_STR: return cJSON_CreateString(n->u.str.data);
  case ZCK_PK_TUPLE: case ZCK_PK_LIST: case ZCK_PK_SET: {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; a && i < n->u.seq.len; i++) {
      cJSON *c = zck__uvj_pk_json(n->u.seq.items[i], depth + 1, budget);
      if (!c) { cJSON_Delete(a); return NULL; }
      cJSON_AddItemToArray(a, c);
    }
    return a;
  }
  case ZCK_PK_DICT: {
    cJSON *o = cJSON_CreateObject();
    for (size_t i = 0; o && i < n->u.dict.len; i++) {
      const char *k = zck_pk_as_str(n->u.dict.keys[i]);
      if (!k) {
        zck_pk_summary(n->u.dict.keys[i], buf, sizeof buf);
        k = buf;
      }
      cJSON *c = zck__uvj_pk_json(n->u.dict.values[i], depth + 1, budget);
      if (!c) { cJSON_Delete(o); return NULL; }
      cJSON_AddItemToObject(o, k, c);
    }
    return o;
  }
  default:
    zck_pk_summary(n, buf, sizeof buf);
    return cJSON_CreateString(buf);
  }
}

zck_status zck__uvj_flat_params(const zck_ds_view *fp32, uint32_t **out, size_t *n) {
  const zck_layout *l = fp32->layout;
  size_t total = 0;
  for (size_t g = 0; g < l->n_groups; g++) total += l->groups[g].n_params;
  if (!l->n_groups && l->kind == ZCK_LAYOUT_WHOLE) total = l->n_stores;
  uint32_t *v = zck__malloc((total ? total : 1) * sizeof *v);
  if (!v) return ZCK_ERR_NO_MEMORY;
  size_t k = 0;
  for (size_t g = 0; g < l->n_groups; g++)
    for (size_t i = 0; i < l->groups[g].n_params; i++) v[k++] = l->groups[g].params[i];
  /* ZeRO-0: whole tensors, store k = flat param k */
  for (size_t s = 0; !l->n_groups && l->kind == ZCK_LAYOUT_WHOLE && s < l->n_stores; s++) v[k++] = (uint32_t)l->stores[s].param;
  *out = v;
  *n = k;
  return ZCK_OK;
}

uint64_t zck__uvj_bytes(const zck_model *m, const uint32_t *params, size_t n, zck_dtype t) {
  uint64_t b = 0;
  for (size_t i = 0; i < n; i++) b += m->params[params[i]].numel * zck_dtype_size(t);
  return b;
}

// ---- checks

/* universal_checkpoint_info (stage 1/2): required by ds_to_universal; merge
 * patterns for tensor parallelism would change the files, and zckpt has no TP. */
static zck_status zck__uvj_check_info(const zck_ds_ckpt *ck, const zck_universal_opts *o) {
  const zck_ds_info *info = zck_ds_info_of(ck);
  const zck_pk *uci = zck_pk_dict_get(zck_ds_client_state(ck), "universal_checkpoint_info");
  if (!uci || uci->kind == ZCK_PK_NONE) {
    if (o->inject_missing_state) return ZCK_OK;
    return zck__fail(ZCK_ERR_FORMAT,
                     "%s: no universal_checkpoint_info in the model states; pass --inject-missing-state "
                     "to proceed as ds_to_universal --inject_missing_state (universal_checkpoint_version 0.4)",
                     info->dir);
  }
  if (uci->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: universal_checkpoint_info is not a dict", info->dir);
  if (info->tp_size > 1) return ZCK_OK;  /* AutoTP: the reader merged the slices by its affine map */
  for (size_t i = 0; i < uci->u.dict.len; i++) {
    const char *k = zck_pk_as_str(uci->u.dict.keys[i]);
    const zck_pk *v = uci->u.dict.values[i];
    if (k && !strcmp(k, "universal_checkpoint_version")) continue;
    /* AutoEP's: the experts are laid out from ds_autoep_layers (ds_autoep.c), the patterns rewritten
     * (to_universal_autoep.c) */
    if (k && info->ep_size && (!strcmp(k, "expert_parameter_patterns") || !strcmp(k, "ds_autoep_layers"))) continue;
    bool empty = !v || v->kind == ZCK_PK_NONE || ((v->kind == ZCK_PK_LIST || v->kind == ZCK_PK_TUPLE) && !v->u.seq.len) ||
                 (v->kind == ZCK_PK_DICT && !v->u.dict.len);
    if (!empty)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: universal_checkpoint_info['%s'] (tensor/expert-parallel layout) not supported",
                       info->dir, k ? k : "?");
  }
  return ZCK_OK;
}

// ---- the per-parameter files

/* An entry's part: 0..2 the fp32 / exp_avg / exp_avg_sq views (whole params); ALIAS a
 * tied alias written from its source's fp32 (its own plan: its source has an entry too);
 * FROZEN (AutoTP) a frozen param, or an alias of one, written from the frozen view, whose
 * slices the reader merged; -1 a direct copy from `src`. */
#define ZCK__UVJ_ALIAS 3
#define ZCK__UVJ_FROZEN 4

typedef struct zck__uvj_entry {
  const char *name;
  const char *state;
  zck_uv_form form;
  zck_dtype dtype;          /* written */
  int ndim;
  int64_t shape[ZCK_MAX_DIMS];
  uint64_t numel;
  int part;                 /* ZCK_DS_FP32 / EXP_AVG / EXP_AVG_SQ, or -1: `src` */
  uint32_t param;
  zck_store *src;           /* part -1 only (rare): kept apart, in ctx, so the entries of
                               100k params x 3 states stay ~120 bytes each */
} zck__uvj_entry;

typedef struct zck__uvj {
  const zck_ds_ckpt *ck;
  const zck_model *m;
  const zck_ds_info *info;
  const zck_universal_opts *o;
  zck_uv_writer *w;
  zck_ds_view views[3];
  zck_ds_view frozen;       /* AutoTP with frozen params: their merged slices */
  zck_state_view src;       /* the reader's view, the transfer's source */
  zck__uvj_entry *e;
  size_t n, cap;
  zck__uvj_progress prog;
  void **ctx;               /* callback contexts of direct sources */
  size_t n_ctx;
} zck__uvj;

static zck__uvj_entry *zck__uvj_add(zck__uvj *j) {
  if (j->n == j->cap) {
    size_t nc = j->cap ? 2 * j->cap : 64;
    zck__uvj_entry *v = zck__realloc(j->e, nc * sizeof *v);
    if (!v) return NULL;
    j->e = v;
    j->cap = nc;
  }
  zck__uvj_entry *e = &j->e[j->n++];
  memset(e, 0, sizeof *e);
  e->part = -1;
  return e;
}

typedef struct zck__uvj_tread {
  const zck_torch_file *f;
  const zck_torch_tensor *t;
} zck__uvj_tread;

static zck_status zck__uvj_tread_fn(void *ctx, void *dst, uint64_t off, uint64_t count) {
  zck__uvj_tread *r = ctx;
  return zck_torch_tensor_read(r->f, r->t, dst, off, count);
}

/* The state kind an entry's file holds of e->param (zck_uv_tensor_spec): fp32 / exp_avg /
 * exp_avg_sq of the param; a tied alias from its source's fp32; an AutoTP frozen param from
 * the frozen view; -1 a direct copy from e->src. */
static int zck__uvj_kind(const zck__uvj_entry *e) {
  static const int kind[3] = {ZCK_STATE_FP32, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ};
  return e->part >= 0 && e->part < 3 ? kind[e->part] : e->part == ZCK__UVJ_ALIAS ? ZCK_STATE_FP32
         : e->part == ZCK__UVJ_FROZEN ? ZCK_STATE_FROZEN : -1;
}

/* One batch: the writer reserves its files and hands back the state views they make, one
 * zck_transfer fills those from the reader's view, the direct copies (the 0.19.8 `module`
 * fallback files) run after it, and the writer finishes the files. */
static zck_status zck__uvj_batch(zck__uvj *j, size_t first, size_t n) {
  zck_store *dst = zck__calloc(n ? n : 1, sizeof *dst);
  size_t *handle = zck__calloc(n ? n : 1, sizeof *handle);
  zck_uv_tensor_spec *specs = zck__calloc(n ? n : 1, sizeof *specs);
  zck_status st = dst && handle && specs ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  uint64_t bytes = 0, direct_bytes = 0;
  size_t nd = 0;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const zck__uvj_entry *e = &j->e[first + i];
    int kind = zck__uvj_kind(e);
    specs[i] = (zck_uv_tensor_spec){e->name, e->state, e->form, e->dtype, e->ndim, e->shape, kind, e->param};
    uint64_t b = e->numel * zck_dtype_size(e->dtype);
    bytes += b;
    if (kind < 0) direct_bytes += b, nd++;
  }
  /* made on the job's threads, a parameter's three files together (zck__uvj_param_entries) */
  if (st == ZCK_OK) st = zck_uv_writer_tensors(j->w, specs, n, dst, handle);
  free(specs);
  const zck_state_view *views = NULL;
  size_t nv = 0;
  if (st == ZCK_OK) st = zck_uv_writer_state(j->w, j->m, &views, &nv);
  if (st == ZCK_OK && nv) {
    zck_transfer_opts to = ZCK_TRANSFER_OPTS_INIT;
    to.exec = zck__uvj_exec_opts(j->o, &j->prog);
    st = zck_transfer(&j->src, views, nv, &to);
    zck__uvj_progress_advance(&j->prog, bytes - direct_bytes);
  }
  zck_store *dsrc = nd ? zck__calloc(nd, sizeof *dsrc) : NULL, *ddst = nd ? zck__calloc(nd, sizeof *ddst) : NULL;
  zck_extent *ext = nd ? zck__calloc(nd, sizeof *ext) : NULL;
  if (st == ZCK_OK && nd && !(dsrc && ddst && ext)) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK && nd) {
    size_t k = 0, ne = 0;
    for (size_t i = 0; i < n; i++) {
      const zck__uvj_entry *e = &j->e[first + i];
      if (zck__uvj_kind(e) >= 0) continue;
      dsrc[k] = *e->src;
      ddst[k] = dst[i];
      /* empty tensors have nothing to copy: left out of the plan */
      if (e->numel) ext[ne++] = (zck_extent){(uint32_t)k, (uint32_t)k, 0, 0, 0, e->numel, 0, 0, 0};
      k++;
    }
    zck_plan *plan = NULL;
    st = zck_plan_from_extents(ext, ne, nd, nd, &plan);
    if (st == ZCK_OK) st = zck_plan_split(plan, ZCK_PLAN_DEFAULT_CHUNK);
    zck_exec_opts eo = zck__uvj_exec_opts(j->o, &j->prog);
    if (st == ZCK_OK) st = zck_exec_run(&(zck_exec_job){plan, dsrc, ddst, NULL}, 1, &eo);
    zck__uvj_progress_advance(&j->prog, direct_bytes);
    zck_plan_free(plan);
  }
  if (st == ZCK_OK) st = zck_uv_writer_finish_batch(j->w);
  free(dsrc);
  free(ddst);
  free(ext);
  free(dst);
  free(handle);
  return st;
}

/* How many files a batch keeps open: a share of the descriptor limit. */
static size_t zck__uvj_batch_files(void) {
  struct rlimit rl;
  uint64_t soft = 1024;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) soft = rl.rlim_cur == RLIM_INFINITY ? 65536 : rl.rlim_cur;
  uint64_t b = soft > 256 ? (soft - 128) / 2 : 32;
  if (b < 16) b = 16;
  if (b > 1024) b = 1024;
  return (size_t)b;
}

/* zero/<param>/{fp32,exp_avg,exp_avg_sq}.pt for the trainable params, in flat order. */
static zck_status zck__uvj_param_entries(zck__uvj *j, const uint32_t *flat, size_t n_flat, uint8_t *written) {
  static const char *states[3] = {"fp32", "exp_avg", "exp_avg_sq"};
  for (size_t i = 0; i < n_flat; i++) {
    const zck_param *p = &j->m->params[flat[i]];
    ZCK_TRY_CTX(zck_uv_check_name(p->name), "%s", j->info->dir);
    /* stage 1/2: a param without fragments (no elements) gets no files from the merge */
    if (j->info->stage <= 2 && !p->numel) continue;
    written[flat[i]] = 1;
    for (int k = 0; k < 3; k++) {
      zck__uvj_entry *e = zck__uvj_add(j);
      if (!e) return ZCK_ERR_NO_MEMORY;
      e->name = p->name;
      e->state = states[k];
      e->part = k;
      e->param = flat[i];
      e->numel = p->numel;
      e->dtype = j->views[k].stores[0].dtype;
      if (zck_ds_autoep_is_expert(j->ck, p->name)) {
        e->form = ZCK_UV_EXPERT;   /* all experts in one tensor, at any stage (autoep_universal.py) */
        e->ndim = p->ndim;
        memcpy(e->shape, p->shape, sizeof e->shape);
      } else if (j->info->stage <= 2 || j->info->tp_size > 1) {
        /* AutoTP (any stage): ds_to_universal's affine-map merge writes the full tensor as {'param'}
         * (+ 'vocab_tensor' first) */
        e->form = j->info->tp_size <= 1 ? ZCK_UV_CAT_DIM
                  : zck_ds_autotp_vocab(j->ck, flat[i]) ? ZCK_UV_VOCAB : ZCK_UV_PARAM;
        e->ndim = p->ndim;
        memcpy(e->shape, p->shape, sizeof e->shape);
      } else {
        e->form = ZCK_UV_BARE;   /* stage 3: the flat param */
        e->ndim = 1;
        e->shape[0] = (int64_t)p->numel;
      }
    }
  }
  return ZCK_OK;
}

/* DeepSpeed 0.19.8 (stage 1/2): every `module` entry still without zero/<name>/fp32.pt
 * gets {'param': tensor.float()}: frozen params, tied aliases, buffers. */
static zck_status zck__uvj_module_entries(zck__uvj *j, uint8_t *written) {
  const zck_torch_file *mf = zck_ds_rank0_model(j->ck);
  const zck_pk *module = zck_pk_dict_get(zck_torch_root(mf), "module");
  if (!module || module->kind != ZCK_PK_DICT) return ZCK_OK;
  for (size_t i = 0; i < module->u.dict.len; i++) {
    const char *name = zck_pk_as_str(module->u.dict.keys[i]);
    const zck_torch_tensor *t = name ? zck_torch_tensor_of(mf, module->u.dict.values[i]) : NULL;
    if (!t) continue;
    int64_t pi = zck_model_find_param(j->m, name);
    if (pi >= 0 && written[pi]) continue;
    if (pi >= 0 && j->info->tp_size > 1) {
      /* AutoTP: a module tensor is this TP rank's slice. ds_to_universal writes it from rank
       * 0's 16-bit slice alone (half a tied head or of a frozen split param at tp 2); zckpt
       * writes the whole tensor, as float32: a tied alias from its source's fp32 master, as
       * zero_to_fp32 gives the alias; a frozen param (or an alias of one) from its slices,
       * merged by the affine map. DeepSpeed's load_universal reads neither (frozen params
       * keep the model's values; an alias is its source) */
      const zck_param *pa = &j->m->params[pi];
      uint32_t owner = pa->tied_to >= 0 ? (uint32_t)pa->tied_to : (uint32_t)pi;
      bool frozen = j->m->params[owner].frozen && j->frozen.layout;
      if (!frozen && (pa->tied_to < 0 || !written[pa->tied_to]))
        return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: module.%s: a parameter of an AutoTP checkpoint that is neither "
                         "trained, frozen nor tied to either", zck_torch_name(mf), name);
      zck__uvj_entry *e = zck__uvj_add(j);
      if (!e) return ZCK_ERR_NO_MEMORY;
      *e = (zck__uvj_entry){.name = name, .state = "fp32", .form = ZCK_UV_PARAM, .dtype = ZCK_F32, .ndim = pa->ndim,
                            .numel = pa->numel, .part = frozen ? ZCK__UVJ_FROZEN : ZCK__UVJ_ALIAS, .param = owner};
      memcpy(e->shape, pa->shape, sizeof e->shape);
      written[pi] = 1;
      continue;
    }
    bool dup = false;   /* a key twice in the pickle: the file is written once */
    for (size_t k = 0; k < j->n && !dup; k++) dup = j->e[k].part < 0 && !strcmp(j->e[k].name, name);
    if (dup) continue;
    ZCK_TRY_CTX(zck_uv_check_name(name), "%s", j->info->dir);
    if (t->ndim > ZCK_MAX_DIMS) return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: module.%s has %d dimensions", zck_torch_name(mf), name, t->ndim);
    if (!zck_dtype_convertible(ZCK_F32, t->dtype))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: module.%s: cannot convert %s to float32", zck_torch_name(mf), name,
                       zck_dtype_name(t->dtype));
    zck__uvj_entry *e = zck__uvj_add(j);
    if (!e) return ZCK_ERR_NO_MEMORY;
    e->name = name;
    e->state = "fp32";
    e->form = ZCK_UV_PARAM;
    e->dtype = ZCK_F32;
    e->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) e->shape[d] = t->shape[d];
    e->numel = t->numel;
    void **cv = zck__realloc(j->ctx, (j->n_ctx + 1) * sizeof *cv);
    zck_store *src = cv ? zck__malloc(sizeof *src) : NULL;
    if (cv) j->ctx = cv;
    if (!src) return ZCK_ERR_NO_MEMORY;
    j->ctx[j->n_ctx++] = src;
    e->src = src;
    if (zck_torch_tensor_contiguous(t)) {
      *src = zck_store_source(zck_torch_source(mf), zck_torch_tensor_file_offset(mf, t), t->dtype, t->numel, zck_torch_name(mf));
      zck_record_check rc; /* its zip CRC, checked as the copy reads it; one block owns the name */
      if (zck_torch_tensor_record(mf, t, &rc)) {
        char what[600];
        snprintf(what, sizeof what, "record data/%s (module['%.500s'])", zck_torch_tensor_storage(mf, t)->key, name);
        void **v = zck__realloc(j->ctx, (j->n_ctx + 1) * sizeof *v);
        zck_record_check *r = v ? zck__malloc(sizeof *r + strlen(what) + 1) : NULL;
        if (v) j->ctx = v;
        if (!r) return ZCK_ERR_NO_MEMORY;
        memcpy(r + 1, what, strlen(what) + 1);
        rc.what = (const char *)(r + 1);
        *r = rc;
        j->ctx[j->n_ctx++] = r;
        src->record = r;
      }
    } else {
      void **v = zck__realloc(j->ctx, (j->n_ctx + 1) * sizeof *v);
      zck__uvj_tread *r = v ? zck__malloc(sizeof *r) : NULL;
      if (v) j->ctx = v;
      if (!r) return ZCK_ERR_NO_MEMORY;
      *r = (zck__uvj_tread){mf, t};
      j->ctx[j->n_ctx++] = r;
      *src = zck_store_callback(zck__uvj_tread_fn, NULL, r, t->dtype, t->numel, zck_torch_name(mf));
    }
  }
  return ZCK_OK;
}

// ---- step.pt (stage 1/2)

/* base_optimizer_state['state'][g]['step'] of rank 0, per flat group (a pipeline stage's from group g0 on). */
static zck_status zck__uvj_stage_steps(zck__uvj *j, const zck_torch_file *of, size_t g0) {
  const zck_pk *osd = zck_pk_dict_get(zck_torch_root(of), "optimizer_state_dict");
  const zck_pk *bos = zck_pk_dict_get(osd, "base_optimizer_state");
  if (bos && bos->kind == ZCK_PK_LIST)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: elastic base_optimizer_state (a list) cannot be converted", zck_torch_name(of));
  const zck_pk *state = zck_pk_dict_get(bos, "state");
  const zck_layout *l = j->views[0].layout;
  for (size_t g = 0; state && state->kind == ZCK_PK_DICT && g < state->u.dict.len; g++) {
    int64_t gi;
    if (!zck_pk_as_int(state->u.dict.keys[g], &gi) || gi < 0 || (size_t)gi + g0 >= l->n_groups) continue;
    gi += (int64_t)g0;
    const zck_pk *step = zck_pk_dict_get(state->u.dict.values[g], "step");
    if (!step) continue;
    const zck_torch_tensor *t = zck_torch_tensor_of(of, step);
    double v = 0;
    bool is_tensor = t != NULL;
    if (t) {
      uint8_t b[4];
      float f;
      if (t->numel != 1 || t->dtype != ZCK_F32)
        return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: state[%lld]['step'] is a %s tensor of %llu elements", zck_torch_name(of),
                         (long long)gi, zck_dtype_name(t->dtype), (unsigned long long)t->numel);
      ZCK_TRY(zck__source_read(zck_torch_source(of), b, 4, zck_torch_tensor_file_offset(of, t)));
      uint32_t u = zck__le32(b);
      memcpy(&f, &u, 4);
      v = f;
    } else if (step->kind != ZCK_PK_INT || !zck_pk_as_double(step, &v)) {
      return zck__fail(ZCK_ERR_FORMAT, "%s: state[%lld]['step'] is neither a tensor nor an int", zck_torch_name(of), (long long)gi);
    }
    const zck_layout_group *grp = &l->groups[gi];
    for (size_t i = 0; i < grp->n_params; i++) {
      const zck_param *p = &j->m->params[grp->params[i]];
      if (p->numel) ZCK_TRY(zck_uv_writer_step(j->w, p->name, is_tensor, v));
    }
  }
  return ZCK_OK;
}

static zck_status zck__uvj_steps(zck__uvj *j) {
  size_t g0;
  const zck_torch_file *of;
  for (uint32_t stage = 0; (of = zck_ds_stage_optim(j->ck, stage, &g0)); stage++) ZCK_TRY(zck__uvj_stage_steps(j, of, g0));
  return ZCK_OK;
}

// ---- zero/optimizer_state.pt

#define ZCK__UVJ_OPT_NAME "zero/optimizer_state.pt"

void zck__uvj_opt_free(zck__uvj_opt *os) {
  zck_torch_writer_free(os->tw);
  zck__shash_free(os->h);
  free(os->wrap);
  zck_uv_copies_free(&os->copies);
  zck_plan_free(os->plan);
  free(os->src);
  free(os->dst);
  free(os->crc);
  memset(os, 0, sizeof *os);
}

/* The copy job of the tensors the tree holds (as zck_uv_copies_run would run it). */
zck_status zck__uvj_opt_job(zck__uvj_opt *os, zck_exec_job *job) {
  zck_uv_copies *c = &os->copies;
  size_t n = c->n;
  zck_extent *ext = zck__calloc(n ? n : 1, sizeof *ext);
  os->src = zck__calloc(n ? n : 1, sizeof *os->src);
  os->dst = zck__calloc(n ? n : 1, sizeof *os->dst);
  os->crc = zck__calloc(n ? n : 1, sizeof *os->crc);
  os->wrap = zck__calloc(n ? n : 1, sizeof *os->wrap);
  zck_status st = ext && os->src && os->dst && os->crc && os->wrap ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    ext[i] = (zck_extent){(uint32_t)i, (uint32_t)i, 0, 0, 0, c->v[i].count, 0, 0, 0};
    os->src[i] = c->v[i].src;
    uint64_t nbytes = c->v[i].count * zck_dtype_size(c->v[i].dst.dtype);
    /* each storage is written whole; the file's hashes follow the copy */
    zck__shash_cover(os->h, c->v[i].data_off, nbytes);
    os->dst[i] = os->h ? zck__shash_wrap_store(&os->wrap[i], &c->v[i].dst, c->v[i].data_off, os->h) : c->v[i].dst;
    os->bytes += nbytes;
  }
  if (st == ZCK_OK) st = zck__shash_start(os->h, os->budget, 0);
  if (st == ZCK_OK) st = zck_plan_from_extents(ext, n, n, n, &os->plan);
  if (st == ZCK_OK) st = zck_plan_split(os->plan, ZCK_PLAN_DEFAULT_CHUNK);
  free(ext);
  if (st == ZCK_OK) *job = (zck_exec_job){os->plan, os->src, os->dst, os->crc};
  return st;
}

/* The copies alone, one plan on the thread pool, then each storage's CRC (universal.h). */
zck_status zck_uv_copies_run(zck_torch_writer *tw, zck_uv_copies *c, const zck_exec_opts *eo) {
  if (!c->n) return ZCK_OK;
  zck_extent *ext = zck__calloc(c->n, sizeof *ext);
  zck_store *src = zck__calloc(c->n, sizeof *src), *dst = zck__calloc(c->n, sizeof *dst);
  uint32_t *crc = zck__calloc(c->n, sizeof *crc);
  zck_status st = ext && src && dst && crc ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < c->n; i++) {
    ext[i] = (zck_extent){(uint32_t)i, (uint32_t)i, 0, 0, 0, c->v[i].count, 0, 0, 0};
    src[i] = c->v[i].src;
    dst[i] = c->v[i].dst;
  }
  zck_plan *plan = NULL;
  if (st == ZCK_OK) st = zck_plan_from_extents(ext, c->n, c->n, c->n, &plan);
  if (st == ZCK_OK) st = zck_plan_split(plan, ZCK_PLAN_DEFAULT_CHUNK);
  if (st == ZCK_OK) st = zck_exec_run(&(zck_exec_job){plan, src, dst, crc}, 1, eo);
  for (size_t i = 0; st == ZCK_OK && i < c->n; i++) zck_torch_writer_set_crc(tw, c->v[i].storage, crc[i]);
  zck_plan_free(plan);
  free(ext);
  free(src);
  free(dst);
  free(crc);
  return st;
}

/* After the job ran: the CRCs, then the file. */
zck_status zck__uvj_opt_finish(zck__uvj_opt *os) {
  for (size_t i = 0; i < os->copies.n; i++) zck_torch_writer_set_crc(os->tw, os->copies.v[i].storage, os->crc[i]);
  return zck_torch_writer_finish(os->tw, os->root);
}

/* ZeRO-0: its model file rebuilt as a ZeRO-1 one (to_universal_zero0.c), not copied. */
static zck_status zck__uvj_zero0_model(zck__uvj *j, const uint32_t *flat, size_t n_flat, zck__uvj_opt *os,
                                       zck_exec_job *job) {
  ZCK_TRY(zck_uv_writer_torch(j->w, zck_ds_model_file(j->ck, 0).name, &os->tw));
  zck_status st = zck__uvj_zero0_model_file(j->ck, flat, n_flat, os->tw, &os->root, &os->copies);
  if (st == ZCK_OK) st = zck__uvj_opt_job(os, job);
  return st;
}

static zck_status zck__uvj_optimizer_state(zck__uvj *j, zck__uvj_opt *os, zck_exec_job *job) {
  if (j->info->stage == 0) {
    ZCK_TRY(zck_uv_writer_torch(j->w, "zero/optimizer_state.pt", &os->tw));
    zck_status st = zck__uvj_zero0_optimizer_state(j->ck, os->tw, &os->root, &os->copies);
    if (st == ZCK_OK) st = zck__uvj_opt_job(os, job);
    return st;
  }
  const zck_torch_file *of = zck_ds_rank0_optim(j->ck);
  const zck__source *data = zck_torch_source(of);
  const zck_pk *osd = zck_pk_dict_get(zck_torch_root(of), "optimizer_state_dict");
  if (!osd || osd->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: no optimizer_state_dict", zck_torch_name(of));
  if (!(os->h = zck__shash_new())) return ZCK_ERR_NO_MEMORY;
  os->budget = zck_uv_writer_hash_budget(j->w);
  ZCK_TRY(zck_uv_writer_torch_hashed(j->w, ZCK__UVJ_OPT_NAME, os->h, &os->tw));
  zck_torch_writer *tw = os->tw;
  zck_pk_doc *d = zck_torch_writer_doc(tw);
  zck_uv_copies copies = {0};
  zck_pk *root = NULL;
  zck_status st = ZCK_OK;
  if (j->info->stage == 3) {
    /* rank 0's whole optimizer_state_dict, tensors included, + param_groups (the same
     * list object as the inner one's) */
    st = zck_uv_copy_tree(tw, of, data, osd, &root, &copies);
    zck_pk *pg = st == ZCK_OK ? (zck_pk *)zck_pk_dict_get(zck_pk_dict_get(root, "optimizer_state_dict"), "param_groups") : NULL;
    if (st == ZCK_OK && !pg) st = zck__fail(ZCK_ERR_FORMAT, "%s: optimizer_state_dict has no param_groups", zck_torch_name(of));
    if (st == ZCK_OK && !zck_pk_dict_set(d, root, zck_pk_new_str(d, "param_groups"), pg)) st = ZCK_ERR_NO_MEMORY;
  } else {
    /* ZeROCheckpoint.get_state_for_rank(0, 0, 0) minus the sharded states; paddings
     * cleared, partition_count set to the dp size; + param_groups */
    const zck_pk *bos = zck_pk_dict_get(osd, "base_optimizer_state");
    const zck_pk *pgs = zck_pk_dict_get(bos, "param_groups");
    if (!pgs) st = zck__fail(ZCK_ERR_FORMAT, "%s: base_optimizer_state has no param_groups", zck_torch_name(of));
    if (st == ZCK_OK && !(root = zck_pk_new_dict(d, 0))) st = ZCK_ERR_NO_MEMORY;
    for (size_t i = 0; st == ZCK_OK && i < osd->u.dict.len; i++) {
      const char *k = zck_pk_as_str(osd->u.dict.keys[i]);
      const zck_pk *v = osd->u.dict.values[i];
      if (k && (!strcmp(k, "base_optimizer_state") || !strcmp(k, "param_slice_mappings") ||
                !strcmp(k, "single_partition_of_fp32_groups")))
        continue;
      zck_pk *nk = NULL, *nv = NULL;
      st = zck_uv_copy_tree(tw, of, data, osd->u.dict.keys[i], &nk, &copies);
      if (st != ZCK_OK) break;
      bool pad = k && !strcmp(k, "group_paddings"), pc = k && !strcmp(k, "partition_count");
      if ((pad || pc) && v->kind == ZCK_PK_LIST && v->u.seq.len) {
        nv = zck_pk_new_list(d);
        for (size_t q = 0; nv && q < v->u.seq.len; q++)
          if (!zck_pk_append(d, nv, zck_pk_new_int(d, pad ? 0 : (int64_t)j->info->world_size))) nv = NULL;
        if (!nv) st = ZCK_ERR_NO_MEMORY;
      } else {
        st = zck_uv_copy_tree(tw, of, data, v, &nv, &copies);
      }
      if (st == ZCK_OK && !zck_pk_dict_set(d, root, nk, nv)) st = ZCK_ERR_NO_MEMORY;
    }
    zck_pk *npg = NULL;
    if (st == ZCK_OK) st = zck_uv_copy_tree(tw, of, data, pgs, &npg, &copies);
    if (st == ZCK_OK && !zck_pk_dict_set(d, root, zck_pk_new_str(d, "param_groups"), npg)) st = ZCK_ERR_NO_MEMORY;
  }
  os->copies = copies;   /* freed with os, whatever happened */
  os->root = root;
  if (st == ZCK_OK) st = zck__uvj_opt_job(os, job);
  return st;
}

// ---- the model-states files, byte for byte (shutil.copy2 in ds_to_universal), checked

/* The sources and raw targets of the copy job, alive until it ran. Each file is copied
 * as pieces: every zip record is a store carrying its CRC-32 (the executor checks it as
 * it reads), the zip structure between records (local headers, descriptors, the central
 * directory) plain stores the zip reader validated at open. When the tag folder's
 * manifest lists the file, the whole file is one store carrying its XXH3 instead: every
 * byte copied is then checked. Nothing is written from a piece whose check fails: the
 * run stops and the folder is never committed. */
typedef struct zck__uvj_models {
  size_t n;
  zck__source *srcs;
  bool *open;
  zck_store *s, *d;             /* s: the pieces of every file; d: one raw target per file */
  size_t n_s, cap_s;
  zck_extent *ext;              /* one per piece (a piece goes to its file's target) */
  zck_record_check **recs;      /* owned, one per record piece; what follows each struct */
  size_t n_recs;
  zck_plan *plan;
  uint64_t bytes;
} zck__uvj_models;

static void zck__uvj_models_free(zck__uvj_models *mf) {
  for (size_t i = 0; mf->open && i < mf->n; i++)
    if (mf->open[i]) zck__source_close(&mf->srcs[i]);
  for (size_t i = 0; i < mf->n_recs; i++) free(mf->recs[i]);
  zck_plan_free(mf->plan);
  free(mf->recs);
  free(mf->ext);
  free(mf->srcs);
  free(mf->open);
  free(mf->s);
  free(mf->d);
  memset(mf, 0, sizeof *mf);
}

/* Bytes [off, off + len) of file i as one more piece; rc (may be NULL) its record. */
static zck_status zck__uvj_model_piece(zck__uvj_models *mf, size_t i, uint64_t off, uint64_t len,
                                       const zck_record_check *rc, const char *name) {
  if (!len) return ZCK_OK;
  if (mf->n_s == mf->cap_s) {
    size_t cap = mf->cap_s ? 2 * mf->cap_s : 64;
    zck_store *s = zck__realloc(mf->s, cap * sizeof *s);
    if (s) mf->s = s;
    zck_extent *e = s ? zck__realloc(mf->ext, cap * sizeof *e) : NULL;
    if (!e) return ZCK_ERR_NO_MEMORY;
    mf->ext = e;
    mf->cap_s = cap;
  }
  zck_record_check *r = NULL;
  if (rc) {
    char what[600];
    snprintf(what, sizeof what, "record %.500s", name);
    zck_record_check **v = zck__realloc(mf->recs, (mf->n_recs + 1) * sizeof *v);
    if (v) mf->recs = v;
    if (!v || !(r = zck__malloc(sizeof *r + strlen(what) + 1))) return ZCK_ERR_NO_MEMORY;
    *r = *rc;
    memcpy(r + 1, what, strlen(what) + 1);
    r->what = (const char *)(r + 1);
    mf->recs[mf->n_recs++] = r;
  }
  zck_store st = zck_store_source(&mf->srcs[i], off, ZCK_U8, len, mf->srcs[i].name);
  st.record = r;
  mf->ext[mf->n_s] = (zck_extent){(uint32_t)mf->n_s, (uint32_t)i, 0, 0, off, len, 0, 0, 0};
  mf->s[mf->n_s++] = st;
  return ZCK_OK;
}

static int zck__uvj_cmp_entry(const void *a, const void *b) {
  const zck_zip_entry *x = *(const zck_zip_entry *const *)a, *y = *(const zck_zip_entry *const *)b;
  return x->data_offset < y->data_offset ? -1 : x->data_offset > y->data_offset;
}

/* File i cut at its records: each stored record a piece with its CRC-32, the bytes
 * between them plain pieces. */
static zck_status zck__uvj_model_records(zck__uvj_models *mf, size_t i) {
  zck_zip *z = NULL;
  ZCK_TRY(zck_zip_open(&mf->srcs[i], &z));
  size_t n = zck_zip_count(z);
  const zck_zip_entry **by_off = zck__malloc((n ? n : 1) * sizeof *by_off);
  zck_status st = by_off ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t k = 0; st == ZCK_OK && k < n; k++) by_off[k] = zck_zip_entry_at(z, k);
  if (st == ZCK_OK) qsort(by_off, n, sizeof *by_off, zck__uvj_cmp_entry);
  uint64_t at = 0; /* the reader refused overlapping records and records past the end */
  for (size_t k = 0; st == ZCK_OK && k < n; k++) {
    const zck_zip_entry *e = by_off[k];
    if (e->method != 0 || !e->size) continue; /* a compressed record's CRC is of other bytes */
    st = zck__uvj_model_piece(mf, i, at, e->data_offset - at, NULL, NULL);
    zck_record_check rc = {e->data_offset, e->size, e->crc32, NULL};
    if (st == ZCK_OK) st = zck__uvj_model_piece(mf, i, e->data_offset, e->size, &rc, e->name);
    at = e->data_offset + e->size;
  }
  if (st == ZCK_OK) st = zck__uvj_model_piece(mf, i, at, mf->srcs[i].size - at, NULL, NULL);
  free(by_off);
  zck_zip_close(z);
  return st;
}

static int zck__uvj_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The copy's tensors as its manifest describes them, and its regions for its manifest
 * hashes (zck_uv_writer_raw), from the source's pickle (the copy equals it): the file cut
 * at the first and last byte of every tensor, so that each tensor is one region, an empty
 * one a region of length 0 (tensors overlapping others span several: the manifest reads
 * such a file back). Handed to the writer, they spare the manifest a second parse of the
 * file (19 MB of pickle per rank at 100k params) at the end of the job. */
static zck_status zck__uvj_model_regions(const zck_torch_file *tf, uint64_t size, zck__manifest_known_range **out,
                                         size_t *n_out, zck__manifest_known_tensor **tensors, size_t *n_tensors) {
  *out = NULL;
  *n_out = 0;
  ZCK_TRY(zck__manifest_torch_tensors(tf, tensors, n_tensors));
  size_t n = *n_tensors;
  const zck__manifest_known_tensor *ts = *tensors;
  uint64_t *cut = zck__malloc((2 * n + 2) * sizeof *cut), *empty = zck__malloc((n + 1) * sizeof *empty);
  zck__manifest_known_range *r = zck__malloc((3 * n + 2) * sizeof *r);
  zck_status st = cut && empty && r ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t nc = 0, ne = 0, nr = 0;
  if (st == ZCK_OK) cut[nc++] = 0, cut[nc++] = size;
  for (size_t k = 0; st == ZCK_OK && k < n; k++) {
    uint64_t off = ts[k].offset, span = ts[k].nbytes; /* element 0 to the last element */
    if (off > size || span > size - off) continue; /* the reader refuses it anyway */
    cut[nc++] = off;
    if (span) cut[nc++] = off + span;
    else empty[ne++] = off;
  }
  if (st == ZCK_OK) {
    qsort(cut, nc, sizeof *cut, zck__uvj_cmp_u64);
    qsort(empty, ne, sizeof *empty, zck__uvj_cmp_u64);
    for (size_t k = 0, e = 0; k + 1 < nc || e < ne;) {
      if (e < ne && (k + 1 >= nc || empty[e] <= cut[k])) { /* before the region starting at its offset */
        if (!nr || r[nr - 1].off != empty[e] || r[nr - 1].len) r[nr++] = (zck__manifest_known_range){empty[e], 0, 0};
        e++;
      } else {
        if (cut[k + 1] > cut[k]) r[nr++] = (zck__manifest_known_range){cut[k], cut[k + 1] - cut[k], 0};
        k++;
      }
    }
  }
  free(cut);
  free(empty);
  if (st != ZCK_OK) {
    free(r);
    free(*tensors);
    *tensors = NULL;
    *n_tensors = 0;
    return st;
  }
  *out = r;
  *n_out = nr;
  return ZCK_OK;
}

static zck_status zck__uvj_model_files(zck__uvj *j, zck__uvj_models *mf, zck_exec_job *job) {
  size_t n = zck_ds_model_file_count(j->ck);
  const zck_manifest *man = zck_ds_manifest(j->ck);
  mf->n = n;
  mf->srcs = zck__calloc(n, sizeof *mf->srcs);
  mf->open = zck__calloc(n, sizeof *mf->open);
  mf->d = zck__calloc(n, sizeof *mf->d);
  zck_status st = mf->srcs && mf->open && mf->d ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    zck_ds_file f = zck_ds_model_file(j->ck, i);
    st = zck__source_open(&mf->srcs[i], f.path);
    if (st != ZCK_OK) break;
    mf->open[i] = true;
    uint64_t size = mf->srcs[i].size;
    zck__manifest_known_range *regions = NULL;
    zck__manifest_known_tensor *tensors = NULL;
    size_t n_regions = 0, n_tensors = 0;
    /* rank 0's pickle is still held by the reader: not parsed again */
    const zck_torch_file *held = i == 0 ? zck_ds_rank0_model(j->ck) : NULL;
    zck_torch_file *tf = NULL;
    if (!held) st = zck_torch_open(f.path, NULL, &tf);
    if (st == ZCK_OK) st = zck__uvj_model_regions(held ? held : tf, size, &regions, &n_regions, &tensors, &n_tensors);
    zck_torch_close(tf);
    if (st == ZCK_OK) st = zck_uv_writer_raw(j->w, f.name, size, regions, n_regions, tensors, n_tensors, &mf->d[i]);
    else free(tensors);
    free(regions);
    mf->bytes += size;
    ptrdiff_t k = man ? zck_manifest_find_file(man, f.name) : -1;
    if (st != ZCK_OK || !size) continue;
    if (k >= 0 && man->files[k].hashed) { /* the whole file against the manifest */
      st = zck__uvj_model_piece(mf, i, 0, size, NULL, NULL);
      if (st == ZCK_OK) {
        mf->s[mf->n_s - 1].has_xxh3 = true;
        mf->s[mf->n_s - 1].xxh3 = man->files[k].xxh3;
      }
    } else {
      st = zck__uvj_model_records(mf, i);
    }
  }
  if (st == ZCK_OK) st = zck_plan_from_extents(mf->ext, mf->n_s, mf->n_s, n, &mf->plan);
  if (st == ZCK_OK) st = zck_plan_split(mf->plan, (uint64_t)16 << 20);
  if (st == ZCK_OK) *job = (zck_exec_job){mf->plan, mf->s, mf->d, NULL};
  return st;
}

// ---- the DeepSpeed universal folder

/* Reserves optimizer_state.pt and the model files (not AutoEP's: saved again after), their
 * copy jobs into extra[0] and [1]. */
static zck_status zck__uvj_extras(zck__uvj *j, const uint32_t *flat, size_t n_flat, bool autoep, zck__uvj_opt *os,
                                  zck__uvj_opt *om, zck__uvj_models *mf, zck_exec_job extra[2]) {
  zck_status st = zck__uvj_optimizer_state(j, os, &extra[0]);
  if (st == ZCK_OK && !autoep)
    st = j->info->stage == 0 ? zck__uvj_zero0_model(j, flat, n_flat, om, &extra[1]) : zck__uvj_model_files(j, mf, &extra[1]);
  mf->bytes += om->bytes;
  j->prog.total += os->bytes + mf->bytes;
  return st;
}

/* Every file of the folder, finished in *wp's temporary folder; *lp: the layout its
 * manifest records (the source's). The manifest and the commit are
 * zck__to_universal_ds_commit's, once the caller closed the reader. */
static zck_status zck__to_universal_ds(const zck_ds_ckpt *ck, const char *out, const zck_universal_opts *o,
                                       zck_uv_writer **wp, zck_manifest_layout *lp) {
  zck__uvj j;
  memset(&j, 0, sizeof j);
  j.ck = ck;
  j.m = zck_ds_model(ck);
  j.info = zck_ds_info_of(ck);
  j.o = o;
  j.prog = (zck__uvj_progress){o->progress, o->progress_ctx, 0, 0};
  if (j.info->stage >= 1 && j.info->stage <= 2) ZCK_TRY(zck__uvj_check_info(ck, o));  /* ZeRO-0 files have none */
  static const zck_ds_part parts[3] = {ZCK_DS_FP32, ZCK_DS_EXP_AVG, ZCK_DS_EXP_AVG_SQ};
  for (int k = 0; k < 3; k++) ZCK_TRY(zck_ds_get(ck, parts[k], &j.views[k]));
  bool any_frozen = false;
  for (size_t p = 0; p < j.m->n_params; p++) any_frozen |= j.m->params[p].frozen && j.m->params[p].tied_to < 0;
  if (j.info->tp_size > 1 && any_frozen) ZCK_TRY(zck_ds_get(ck, ZCK_DS_FROZEN, &j.frozen));
  uint32_t *flat = NULL;
  size_t n_flat = 0;
  ZCK_TRY(zck__uvj_flat_params(&j.views[0], &flat, &n_flat));
  uint8_t *written = zck__calloc(j.m->n_params ? j.m->n_params : 1, 1);
  zck_status st = written ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) st = zck__uvj_param_entries(&j, flat, n_flat, written);
  if (st == ZCK_OK && j.info->stage <= 2) st = zck__uvj_module_entries(&j, written);
  for (size_t i = 0; i < j.n; i++) j.prog.total += j.e[i].numel * zck_dtype_size(j.e[i].dtype);
  zck_uv_write_opts wo = ZCK_UV_WRITE_OPTS_INIT;
  wo.overwrite = o->overwrite != 0;
  wo.hash = true; /* the tensor files' manifest hashes as they are written */
  wo.threads = o->threads ? (unsigned)o->threads : zck__default_threads();
  if (st == ZCK_OK) st = zck_uv_writer_create(out, &wo, &j.w);
  /* optimizer_state.pt and the model files: reserved first (the model files' pickles are
   * parsed for their manifest regions while the job's memory is low, not on top of the
   * batches' file records) and copied after the batches, in one executor run of their own,
   * unless the descriptor limit is too tight for their files (a source and a target per
   * model file) beside a batch: then reserved after the batches too */
  zck__uvj_opt os = {0}, om = {0};   /* om: ZeRO-0's rebuilt model file */
  zck__uvj_models mf = {0};
  zck_exec_job extra[2];
  /* AutoEP: the model files are saved again with the experts named (to_universal_autoep.c), after the batches */
  const bool autoep = j.info->ep_size > 0;
  const size_t n_extra = autoep ? 1 : 2;
  size_t per = zck__uvj_batch_files(), extra_fds = 1 + 2 * zck_ds_model_file_count(ck);
  bool first = per > 16 + extra_fds;
  if (first) per -= extra_fds;
  zck_ds_state(ck, &j.src);
  if (st == ZCK_OK && first) st = zck__uvj_extras(&j, flat, n_flat, autoep, &os, &om, &mf, extra);
  for (size_t i = 0; st == ZCK_OK && i < j.n; i += per) st = zck__uvj_batch(&j, i, j.n - i < per ? j.n - i : per);
  if (st == ZCK_OK && !first) st = zck__uvj_extras(&j, flat, n_flat, autoep, &os, &om, &mf, extra);
  if (st == ZCK_OK) {
    zck_exec_opts eo = zck__uvj_exec_opts(o, &j.prog);
    st = zck_exec_run(extra, n_extra, &eo);
    zck__uvj_progress_advance(&j.prog, os.bytes + mf.bytes);
  }
  zck__uvj_models_free(&mf);
  if (st == ZCK_OK && j.info->stage == 0) st = zck__uvj_opt_finish(&om);
  zck__uvj_opt_free(&om);
  if (st == ZCK_OK && j.info->stage == 0) st = zck__uvj_zero0_steps(ck, j.w, flat, n_flat);
  else if (st == ZCK_OK && j.info->stage <= 2) st = zck__uvj_steps(&j);
  if (st == ZCK_OK) st = zck__uvj_opt_finish(&os);
  if (st == ZCK_OK) st = zck_uv_writer_keep_hashed(j.w, ZCK__UVJ_OPT_NAME, os.h);
  if (st == ZCK_OK && autoep) st = zck__uvj_autoep_models(ck, j.w, o, &j.prog);
  zck__uvj_opt_free(&os);
  if (st == ZCK_OK) st = zck_uv_writer_finish_files(j.w);
  /* the layout the universal reader finds in what was just written: the source's */
  *lp = (zck_manifest_layout){NULL, j.info->stage ? j.info->stage : 1, j.info->world_size, 0,
                              (char *)zck_dtype_name(j.info->lp_dtype), (char *)zck_dtype_name(j.info->master_dtype), false};
  for (size_t i = 0; i < j.n_ctx; i++) free(j.ctx[i]);
  free(j.ctx);
  free(j.e);
  free(flat);
  free(written);
  *wp = j.w;
  return st;
}

/* The folder's manifest, then the folder in place. */
static zck_status zck__to_universal_ds_commit(zck_uv_writer *w, const zck_manifest_layout *l, const zck_universal_opts *o) {
  /* written last, as in every folder zckpt produces (zckpt verify checks it): every
   * file's hashes were made as it was written, and its tensors described as it was laid
   * out or copied, so nothing is read back */
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.kind = "universal";
  mo.threads = o->threads;
  zck__manifest_known k = *zck_uv_writer_known(w);
  k.layout = l;
  ZCK_TRY(zck__manifest_write_dir_known(zck_uv_writer_tmp_dir(w), &mo, &k, NULL));
  return zck_uv_writer_commit(w);
}

zck_status zck_to_universal(const char *src, const char *out, const zck_universal_opts *opts) {
  zck_universal_opts o = ZCK_UNIVERSAL_OPTS_INIT;
  ZCK_TRY(zck__opts_load(&o, sizeof o, opts, "zck_to_universal"));
  if (o.format != ZCK_UNIVERSAL_DS && o.format != ZCK_UNIVERSAL_HDF5)
    return zck__fail(ZCK_ERR_INVALID_ARG, "unknown universal format %d", (int)o.format);
  if (o.level < 0 || o.level > 22) return zck__fail(ZCK_ERR_INVALID_ARG, "--level must be 1..22");
  ZCK_TRY(zck_check_out_not_input(src, out, o.tag));
  if (zck__src_sniff(src) == ZCK__SRC_DCP) return zck__to_universal_dcp(src, out, &o);
  return zck__to_universal_of(src, src, out, &o);
}

zck_status zck__to_universal_of(const char *src, const char *label, const char *out, const zck_universal_opts *opts) {
  zck_universal_opts o = *opts;
  zck__src_opts so = ZCK__SRC_OPTS_INIT;
  so.reads = ZCK__SRC_BIT(ZCK__SRC_DEEPSPEED);
  so.tag = o.tag;
  so.threads = o.threads;
  so.require_optimizer_state = true;   /* DS-48: conversion needs exp_avg / exp_avg_sq */
  so.autoep_ds_names = true;           /* AutoEP: ds_to_universal's names (experts.w1 / w2 / w3) */
  zck__src s;
  ZCK_TRY(zck__src_open(&s, src, zck__src_sniff(src), &so));
  const zck_ds_ckpt *ck = s.ck;
  zck_uv_writer *w = NULL;
  zck_manifest_layout l;
  zck_status st = zck_ds_moe_ep_refuse(ck, "to-universal");   /* ds_to_universal.py fails on it */
  if (st == ZCK_OK) st = o.format == ZCK_UNIVERSAL_HDF5 ? zck__to_universal_h5(ck, label, out, &o)
                                                 : zck__to_universal_ds(ck, out, &o, &w, &l);
  size_t n_params = zck_ds_model(ck)->n_params;
  /* closed before the DeepSpeed layout's manifest is built: the reader's pickle trees and
   * tables are not needed for it (at 100k params ~150 MB of the job's peak) */
  zck__src_close(&s);
  if (st == ZCK_OK && w) st = zck__to_universal_ds_commit(w, &l, &o);
  zck_uv_writer_free(w);
  if (st == ZCK_OK) zck__job_summary_fill(o.summary, out, n_params);
  return st;
}
