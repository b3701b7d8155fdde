/* ds_autoep.c: DeepSpeed AutoEP (expert-parallel MoE, deepspeed/module_inject/auto_ep*.py, 0.19.8) read as
 * the state view every job consumes.
 *
 * What AutoEP saves (runtime/engine.py _save_moe_checkpoint): every MoE block of the HF model (Mixtral,
 * Qwen3-MoE, DeepSeek presets) becomes an AutoEPMoELayer whose router is `<mlp>.router.gate.weight` (with a
 * second name `<mlp>.gate.gate.weight` for the same tensor, kept for HF's output capture) and whose experts are
 * three fused tensors `<mlp>.experts.w1 / w2 / w3` of shape [local experts, ...]: w1 the gate half of HF's
 * gate_up_proj, w3 its up half, w2 its down_proj. The experts form their own optimizer group ('ep_size_N',
 * 'moe': True), partitioned over the expert-data-parallel group; EP rank e holds experts
 * [e * local, (e + 1) * local) (the placement `ds_autoep_layers` records). ZeRO-1/2 write the module's
 * expert weights to layer_<L>_expert_<E>_mp_rank_00_model_states.pt (checkpoint_format 'per_expert_files');
 * ZeRO-3 keeps them in the ZeRO shards only ('zero3_partitioned'). param_shapes hold the local shapes.
 *
 * Read here for ep_size E x expert-data-parallel size D = W ranks in DeepSpeed's default order (rank r is EP rank
 * r % E, edp rank r / E) and the uniform placement: each expert param is taken at its full shape [experts, ...];
 * EP rank e's experts are elements [e n / E, (e + 1) n / E) of it, and the expert group's local flat (local shapes)
 * is partitioned over the D ranks of EP rank e as ZeRO-1/2 or ZeRO-3 partitions any group
 * (zck__ds_autoep_train). zck__ds_autoep_prepare rewrites the files' records to say so (full
 * shapes, expert params in `module`, the router alias dropped) before the manifest is built;
 * zck__ds_autoep_finish (ds_autoep_hf.c) then renames the manifest to the HF model's own names, so a
 * consolidated file loads with from_pretrained:
 *   <mlp>.router.gate.weight                -> <mlp>.gate.weight (the router alias is not written again: it
 *                                              is the same tensor, and HF has one name for it)
 *   <mlp>.experts.w1 [E, I, H] + w3 [E, I, H] -> <mlp>.experts.gate_up_proj [E, 2I, H] (per expert: w1's rows,
 *                                              then w3's, as HF's forward chunks gate, up)
 *   <mlp>.experts.w2 [E, H, I]              -> <mlp>.experts.down_proj
 * The 16-bit expert weights of the expert files are checked (names, shapes, dtype) but not bound: every job
 * casts the fp32 masters, which is what DeepSpeed's own 16-bit copy holds after a step. to-universal opens the
 * checkpoint with DeepSpeed's names instead (zck_ds_open_opts.autoep_ds_names: the renaming is skipped, the layout
 * above kept); reshard writes AutoEP's own layout at the target's stage (ds_autoep_write.c). */
#include "ds_autoep.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- ds_autoep_layers, as one model file records it */

void zck__ds_autoep_file_free(struct zck__ds_autoep_file *f) {
  if (!f) return;
  for (size_t i = 0; i < f->n; i++) {
    free(f->v[i].module_path);
    free(f->v[i].prefix);
    free(f->v[i].format);
  }
  free(f->v);
  free(f);
}

void zck__ds_autoep_free(struct zck__ds_autoep *a) { free(a); }

static zck_status need_int(const zck_pk *d, const char *key, int64_t *out, const char *path, size_t i) {
  if (!zck_pk_as_int(zck_pk_dict_get(d, key), out))
    return zck__fail(ZCK_ERR_FORMAT, "%s: ds_autoep_layers[%zu]['%s'] is missing or not an int", path, i, key);
  return ZCK_OK;
}

static zck_status need_str(const zck_pk *d, const char *key, char **out, const char *path, size_t i) {
  const char *s = zck_pk_as_str(zck_pk_dict_get(d, key));
  if (!s) return zck__fail(ZCK_ERR_FORMAT, "%s: ds_autoep_layers[%zu]['%s'] is missing or not a string", path, i, key);
  return (*out = zck__strdup(s)) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

/* expert_placement: {'ranks': [{'rank': k, 'experts': [...]}, ...]}; true when rank k holds experts
 * [k * local, (k + 1) * local), the only placement read here. */
static bool uniform_placement(const zck_pk *pl, const zck__ds_autoep_layer *l) {
  const zck_pk *ranks = pl ? zck_pk_dict_get(pl, "ranks") : NULL;
  if (!ranks || ranks->kind != ZCK_PK_LIST || (int64_t)ranks->u.seq.len != l->ep_size) return false;
  for (size_t k = 0; k < ranks->u.seq.len; k++) {
    const zck_pk *e = ranks->u.seq.items[k];
    int64_t rank;
    const zck_pk *ex = zck_pk_dict_get(e, "experts");
    if (!zck_pk_as_int(zck_pk_dict_get(e, "rank"), &rank) || rank != (int64_t)k || !ex || ex->kind != ZCK_PK_LIST ||
        (int64_t)ex->u.seq.len != l->num_local)
      return false;
    for (size_t j = 0; j < ex->u.seq.len; j++) {
      int64_t id;
      if (!zck_pk_as_int(ex->u.seq.items[j], &id) || id != (int64_t)k * l->num_local + (int64_t)j) return false;
    }
  }
  return true;
}

zck_status zck__ds_autoep_read(zck__ds_model_file *mf, const zck_pk *root, const char *path) {
  const char *key = "ds_autoep_layers";
  const zck_pk *list = zck_pk_dict_get(root, key);
  if (!list || list->kind == ZCK_PK_NONE) list = zck_pk_dict_get(root, key = "autoep_layers");  /* older name */
  if (!list || list->kind == ZCK_PK_NONE) return ZCK_OK;
  if (list->kind != ZCK_PK_LIST) return zck__fail(ZCK_ERR_FORMAT, "%s: '%s' is not a list", path, key);
  if (!list->u.seq.len) return ZCK_OK;
  struct zck__ds_autoep_file *f = zck__calloc(1, sizeof *f);
  if (!f || !(f->v = zck__calloc(list->u.seq.len, sizeof *f->v))) { free(f); return ZCK_ERR_NO_MEMORY; }
  mf->autoep = f;
  for (size_t i = 0; i < list->u.seq.len; i++) {
    const zck_pk *e = list->u.seq.items[i];
    zck__ds_autoep_layer *l = &f->v[f->n++];
    if (!e || e->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: %s[%zu] is not a dict", path, key, i);
    ZCK_TRY(need_int(e, "moe_layer_id", &l->layer_id, path, i));
    ZCK_TRY(need_int(e, "num_experts", &l->num_experts, path, i));
    ZCK_TRY(need_int(e, "num_local_experts", &l->num_local, path, i));
    ZCK_TRY(need_int(e, "ep_size", &l->ep_size, path, i));
    ZCK_TRY(need_int(e, "ep_rank", &l->ep_rank, path, i));
    ZCK_TRY(need_int(e, "expert_data_parallel_world_size", &l->edp_size, path, i));
    ZCK_TRY(need_int(e, "expert_data_parallel_rank", &l->edp_rank, path, i));
    ZCK_TRY(need_str(e, "module_path", &l->module_path, path, i));
    ZCK_TRY(need_str(e, "expert_key_prefix", &l->prefix, path, i));
    ZCK_TRY(need_str(e, "checkpoint_format", &l->format, path, i));
    if (l->layer_id < 0 || l->num_local < 1 || l->ep_size < 1 || l->num_experts != l->num_local * l->ep_size ||
        l->ep_rank < 0 || l->ep_rank >= l->ep_size)
      return zck__fail(ZCK_ERR_FORMAT, "%s: %s[%zu]: %lld experts, %lld local, ep_size %lld, ep_rank %lld do not add up",
                       path, key, i, (long long)l->num_experts, (long long)l->num_local, (long long)l->ep_size,
                       (long long)l->ep_rank);
    char want[1024];
    snprintf(want, sizeof want, "%s.experts", l->module_path);
    if (strcmp(l->prefix, want))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s[%zu]: experts under '%s', not '%s': not supported yet", path, key, i,
                       l->prefix, want);
    if (!uniform_placement(zck_pk_dict_get(e, "expert_placement"), l))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s[%zu]: expert_placement other than rank k holding experts "
                       "[k * %lld, (k + 1) * %lld) is not supported yet", path, key, i, (long long)l->num_local,
                       (long long)l->num_local);
  }
  return ZCK_OK;
}

/* ---- before the manifest: the records say what AutoEP's layout is */

const zck__ds_autoep_layer *zck__ds_autoep_layer_of(const struct zck__ds_autoep_file *f, const char *name,
                                                    const char *rest) {
  for (size_t i = 0; i < f->n; i++) {
    size_t n = strlen(f->v[i].module_path);
    if (!strncmp(name, f->v[i].module_path, n) && !strcmp(name + n, rest)) return &f->v[i];
  }
  return NULL;
}

int zck__ds_autoep_weight(const struct zck__ds_autoep_file *f, const char *name, const zck__ds_autoep_layer **layer) {
  static const char *rest[3] = {".experts.w1", ".experts.w2", ".experts.w3"};
  for (int w = 0; w < 3; w++)
    if ((*layer = zck__ds_autoep_layer_of(f, name, rest[w]))) return w + 1;
  return 0;
}

/* `module` of one model file: the router alias dropped, the three expert params (not saved there) inserted
 * after the router, at their full shape (stage 3: [0]-shaped placeholders, as the other params). */
static zck_status rewrite_module(zck_ds_ckpt *c, zck__ds_model_file *mf, const struct zck__ds_autoep_file *f) {
  size_t cap = mf->n_module + 3 * f->n + 1, n = 0;
  char **names = zck__calloc(cap, sizeof *names);
  zck__ds_tref *ts = zck__calloc(cap, sizeof *ts);
  if (!names || !ts) { free(names); free(ts); return ZCK_ERR_NO_MEMORY; }
  size_t routers = 0;
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < mf->n_module && s == ZCK_OK; i++) {
    const char *name = mf->module_names[i];
    const zck__ds_autoep_layer *l;
    if (zck__ds_autoep_layer_of(f, name, ".gate.gate.weight")) { free(mf->module_names[i]); continue; }  /* the alias */
    names[n] = mf->module_names[i];
    ts[n++] = mf->module_t[i];
    for (size_t k = 0; k < f->n; k++) {
      size_t pl = strlen(f->v[k].module_path);
      if (!strncmp(name, f->v[k].module_path, pl) && !strncmp(name + pl, ".router.", 8) &&
          strcmp(name + pl, ".router.gate.weight"))
        s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: module['%s']: AutoEP router tensors other than router.gate.weight "
                      "(a router bias) are not supported yet", mf->file->path, name);
    }
    if (s != ZCK_OK || !(l = zck__ds_autoep_layer_of(f, name, ".router.gate.weight"))) continue;
    routers++;
    for (int w = 0; w < 3 && s == ZCK_OK; w++) {
      char pn[1100];
      snprintf(pn, sizeof pn, "%s.w%d", l->prefix, w + 1);
      zck__ds_tref t = {0};
      t.dtype = mf->module_t[i].dtype;
      t.ndim = 1;   /* stage 3's placeholder; stage 1/2: the full shape, below */
      int64_t k = -1;
      for (size_t g = 0; g < mf->n_param_shapes && k < 0; g++)
        for (size_t j = 0; j < mf->param_shapes[g].n; j++)
          if (!strcmp(mf->param_shapes[g].v[j].name, pn)) {
            const zck__ds_named_shape *ps = &mf->param_shapes[g].v[j];
            if (c->info.stage <= 2) {
              t.ndim = ps->ndim;
              memcpy(t.shape, ps->shape, sizeof t.shape);
              t.numel = ps->numel;
            }
            k = (int64_t)j;
            break;
          }
      if (k < 0) s = zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes has no '%s' (ds_autoep_layers names it)", mf->file->path, pn);
      else if (!(names[n] = zck__strdup(pn))) s = ZCK_ERR_NO_MEMORY;
      else ts[n++] = t;
    }
  }
  /* the names now belong to `names` (dropped ones freed above) */
  free(mf->module_names);
  free(mf->module_t);
  mf->module_names = names;
  mf->module_t = ts;
  mf->n_module = n;
  if (s == ZCK_OK && routers != f->n)
    s = zck__fail(ZCK_ERR_FORMAT, "%s: module has the router.gate.weight of %zu of the %zu AutoEP layers", mf->file->path,
                  routers, f->n);
  return s;
}

/* Expert params take their full shape [experts, ...] in param_shapes; all of them in one group (ZeRO-3: the
 * consecutive sub-groups of their param group), only them. */
static zck_status full_shapes(zck__ds_model_file *mf, const struct zck__ds_autoep_file *f, size_t *expert_group,
                              size_t *n_groups) {
  size_t found = 0;
  int64_t first = -1, last = -1;
  for (size_t g = 0; g < mf->n_param_shapes; g++) {
    size_t here = 0;
    const char *dense = NULL;
    for (size_t j = 0; j < mf->param_shapes[g].n; j++) {
      zck__ds_named_shape *ps = &mf->param_shapes[g].v[j];
      const zck__ds_autoep_layer *l;
      if (!zck__ds_autoep_weight(f, ps->name, &l)) {
        if (!dense) dense = ps->name;
        continue;
      }
      if (ps->ndim != 3 || ps->shape[0] != l->num_local)
        return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes['%s'] is not [%lld local experts, ., .]", mf->file->path,
                         ps->name, (long long)l->num_local);
      ps->shape[0] = l->num_experts;
      ps->numel *= (uint64_t)l->ep_size;
      here++;
    }
    if (!here) continue;
    if (dense)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: param_shapes[%zu] mixes '%s' with the AutoEP experts: not supported",
                       mf->file->path, g, dense);
    if (first >= 0 && last + 1 != (int64_t)g)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: AutoEP experts in param_shapes groups %lld and %zu, not consecutive: "
                       "not supported", mf->file->path, (long long)last, g);
    if (first < 0) first = (int64_t)g;
    last = (int64_t)g;
    found += here;
  }
  if (found != 3 * f->n)
    return zck__fail(ZCK_ERR_FORMAT, "%s: param_shapes holds %zu AutoEP expert weights; ds_autoep_layers needs %zu",
                     mf->file->path, found, 3 * f->n);
  *expert_group = (size_t)first;
  *n_groups = (size_t)(last - first + 1);
  return ZCK_OK;
}

/* Stage 1/2: every layer_<L>_expert_<E> file is there once, and holds exactly expert E's three weights at the
 * local shape's last dims in the module dtype: a file copied over another, swapped, or of another model is
 * named. */
static zck_status check_expert_files(zck_ds_ckpt *c, const struct zck__ds_autoep_file *f, const zck__ds_model_file *mf) {
  size_t want = 0;
  for (size_t i = 0; i < f->n; i++) want += (size_t)f->v[i].num_experts;
  zck_dtype lp = ZCK_DTYPE_INVALID;   /* the module dtype, as its routers have it */
  for (size_t i = 0; i < mf->n_module && lp == ZCK_DTYPE_INVALID; i++)
    if (zck__ds_autoep_layer_of(f, mf->module_names[i], ".router.gate.weight")) lp = mf->module_t[i].dtype;
  for (size_t i = 0; i < c->fs.n_experts; i++) {
    const zck__ds_rankfile *rf = &c->fs.experts[i];
    unsigned lid = 0, eid = 0;
    sscanf(rf->name, "layer_%u_expert_%u", &lid, &eid);
    const zck__ds_autoep_layer *l = NULL;
    for (size_t k = 0; k < f->n; k++)
      if (f->v[k].layer_id == (int64_t)lid) l = &f->v[k];
    if (!l || (int64_t)eid >= l->num_experts)
      return zck__fail(ZCK_ERR_FORMAT, "%s: no AutoEP layer %u with an expert %u in ds_autoep_layers (a stale file?)",
                       rf->path, lid, eid);
    zck__source src;
    ZCK_TRY(zck__source_open(&src, rf->path));
    zck_torch_file *tf = NULL;
    zck_status s = zck_torch_open_source(&src, &c->topts, &tf);
    const zck_pk *root = s == ZCK_OK ? zck_torch_root(tf) : NULL;
    if (s == ZCK_OK && (!root || root->kind != ZCK_PK_DICT || root->u.dict.len != 3))
      s = zck__fail(ZCK_ERR_FORMAT, "%s: not an AutoEP expert file (a dict of the expert's w1, w2, w3)", rf->path);
    for (int w = 0; w < 3 && s == ZCK_OK; w++) {
      char key[1100];
      snprintf(key, sizeof key, "%s.w%d.%u", l->prefix, w + 1, eid);
      const zck_pk *t = zck_pk_dict_get(root, key);
      if (!t) {
        const char *k0 = zck_pk_as_str(root->u.dict.keys[w]);
        s = zck__fail(ZCK_ERR_FORMAT, "%s: holds '%s' where expert %u's '%s' belongs (another expert's file copied or "
                      "moved here?)", rf->path, k0 ? k0 : "?", eid, key);
        break;
      }
      zck__ds_tref tr;
      if ((s = zck__ds_tensor(tf, t, &tr, key)) != ZCK_OK) break;
      /* the local shape of the weight, less its experts dim */
      char pn[1100];
      snprintf(pn, sizeof pn, "%s.w%d", l->prefix, w + 1);
      const zck__ds_named_shape *ps = NULL;
      for (size_t g = 0; g < mf->n_param_shapes && !ps; g++)
        for (size_t j = 0; j < mf->param_shapes[g].n; j++)
          if (!strcmp(mf->param_shapes[g].v[j].name, pn)) ps = &mf->param_shapes[g].v[j];
      if (!ps || tr.ndim != 2 || tr.shape[0] != ps->shape[1] || tr.shape[1] != ps->shape[2])
        s = zck__fail(ZCK_ERR_MISMATCH, "%s: '%s' is not [%lld, %lld] as param_shapes['%s'] says", rf->path, key,
                      ps ? (long long)ps->shape[1] : -1LL, ps ? (long long)ps->shape[2] : -1LL, pn);
      else if (tr.dtype != lp)
        s = zck__fail(ZCK_ERR_MISMATCH, "%s: '%s' is %s; the module's router weights are %s", rf->path, key,
                      zck_dtype_name(tr.dtype), zck_dtype_name(lp));
    }
    zck_torch_close(tf);
    zck__source_close(&src);
    ZCK_TRY(s);
  }
  if (c->fs.n_experts != want)  /* each name is one (layer, expert): fewer means some are missing */
    for (size_t k = 0; k < f->n; k++)
      for (int64_t e = 0; e < f->v[k].num_experts; e++) {
        char name[128];
        snprintf(name, sizeof name, "layer_%lld_expert_%lld_mp_rank_00_model_states.pt", (long long)f->v[k].layer_id,
                 (long long)e);
        bool seen = false;
        for (size_t i = 0; i < c->fs.n_experts && !seen; i++) seen = !strcmp(c->fs.experts[i].name, name);
        if (!seen)
          return zck__fail(ZCK_ERR_NOT_FOUND, "%s/%s: incomplete AutoEP checkpoint: the expert file is missing", c->fs.dir,
                           name);
      }
  return ZCK_OK;
}

zck_status zck__ds_autoep_prepare(zck_ds_ckpt *c) {
  const zck__ds_model_file *m0 = &c->models[0];
  const struct zck__ds_autoep_file *f = m0->autoep;
  if (!f) {
    if (c->fs.n_experts)  /* DS-11: deepspeed.moe.layer.MoE's expert files, or AutoEP's without their record */
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: unsupported checkpoint layout (MoE expert, pipeline-layer or unknown "
                       "states file); zckpt reads plain ZeRO checkpoints only", c->fs.experts[0].path);
    for (size_t r = 0; r < c->info.world_size; r++)
      if (c->optims[r].mixed_counts)
        return zck__fail(ZCK_ERR_UNSUPPORTED,
                         "%s: partition_count differs between groups (MoE expert groups are not supported)",
                         c->optims[r].file->path);
    return ZCK_OK;
  }
  uint32_t W = c->info.world_size;
  if (c->fs.n_mp > 1)  /* AutoEP folded with AutoTP: expert shards per (TP rank, EP rank), folding metadata */
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: AutoEP with tensor parallelism (%u mp ranks) is not supported yet",
                     m0->file->path, c->fs.n_mp);
  const char *want = c->info.stage == 3 ? "zero3_partitioned" : "per_expert_files";
  for (size_t i = 0; i < f->n; i++) {
    const zck__ds_autoep_layer *l = &f->v[i];
    if (strcmp(l->format, want))
      return zck__fail(ZCK_ERR_FORMAT, "%s: ds_autoep_layers[%zu] says checkpoint_format '%s' in a stage-%d checkpoint",
                       m0->file->path, i, l->format, c->info.stage);
    if (l->ep_size * l->edp_size != (int64_t)W || l->ep_size != f->v[0].ep_size)
      return zck__fail(ZCK_ERR_FORMAT, "%s: ds_autoep_layers[%zu]: ep_size %lld x expert-data-parallel size %lld is not "
                       "the %u ranks of the save", m0->file->path, i, (long long)l->ep_size, (long long)l->edp_size, W);
  }
  const zck_pk *before = c->ds_config ? zck_pk_dict_get(c->ds_config, "use_data_before_expert_parallelism") : NULL;
  if (before && before->kind == ZCK_PK_BOOL && before->u.b)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: AutoEP with use_data_before_expert_parallelism (another rank order) is "
                     "not supported yet", m0->file->path);
  /* stage 3: every rank's model file records the same layers, each with its own ep_rank */
  for (size_t r = 0; r < c->n_models; r++) {
    const zck__ds_model_file *mf = &c->models[r];
    const struct zck__ds_autoep_file *g = mf->autoep;
    if (!g || g->n != f->n)
      return zck__fail(ZCK_ERR_MISMATCH, "%s: ds_autoep_layers lists %zu layers; %s lists %zu", mf->file->path,
                       g ? g->n : 0, m0->file->path, f->n);
    for (size_t i = 0; i < f->n; i++)
      if (g->v[i].layer_id != f->v[i].layer_id || strcmp(g->v[i].module_path, f->v[i].module_path) ||
          g->v[i].num_experts != f->v[i].num_experts || g->v[i].ep_size != f->v[i].ep_size)
        return zck__fail(ZCK_ERR_MISMATCH, "%s: ds_autoep_layers[%zu] differs from %s's", mf->file->path, i,
                         m0->file->path);
      else if (c->info.stage == 3 && (g->v[i].ep_rank != (int64_t)r % f->v[0].ep_size ||
                                      g->v[i].edp_rank != (int64_t)r / f->v[0].ep_size))
        return zck__fail(ZCK_ERR_MISMATCH, "%s: ds_autoep_layers[%zu] is ep_rank %lld / expert-data-parallel rank %lld's, "
                         "not rank %zu's (a copy of another rank's file?)", mf->file->path, i,
                         (long long)g->v[i].ep_rank, (long long)g->v[i].edp_rank, r);
  }
  if (c->info.stage == 3 && c->fs.n_experts)
    return zck__fail(ZCK_ERR_FORMAT, "%s: an expert file in a ZeRO-3 AutoEP checkpoint (its experts are in the ZeRO "
                     "shards): a stale file of another save", c->fs.experts[0].path);
  struct zck__ds_autoep *a = zck__calloc(1, sizeof *a);
  if (!a) return ZCK_ERR_NO_MEMORY;
  c->autoep = a;
  a->ep_size = (uint32_t)f->v[0].ep_size;
  a->edp_size = W / a->ep_size;
  a->layers = f;
  if (c->info.stage <= 2) ZCK_TRY(check_expert_files(c, f, m0));
  for (size_t r = 0; r < c->n_models; r++) {
    size_t g = 0, n = 0;
    ZCK_TRY(full_shapes(&c->models[r], f, &g, &n));
    if (r && (g != a->expert_group || n != a->n_expert_groups))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: AutoEP experts in param_shapes[%zu..%zu]; %s has them in [%zu..%zu]",
                       c->models[r].file->path, g, g + n - 1, m0->file->path, a->expert_group,
                       a->expert_group + a->n_expert_groups - 1);
    a->expert_group = g;
    a->n_expert_groups = n;
  }
  if (c->info.stage <= 2 && a->n_expert_groups != 1)   /* stage 1/2 flat groups are the param groups */
    return zck__fail(ZCK_ERR_FORMAT, "%s: AutoEP experts in %zu param_shapes groups of a stage-%d checkpoint",
                     m0->file->path, a->n_expert_groups, c->info.stage);
  ZCK_TRY(rewrite_module(c, &c->models[0], f));   /* the other ranks' module entries are not kept (ds_open.c) */
  /* stage 1/2: the expert group is partitioned over the expert-data-parallel group (1 rank), the others over W */
  if (c->info.stage <= 2)
    for (uint32_t r = 0; r < W; r++) {
      const zck__ds_optim_file *o = &c->optims[r];
      for (size_t g = 0; g < o->n_counts; g++) {
        bool ex = g >= a->expert_group && g < a->expert_group + a->n_expert_groups;
        int64_t need = ex ? (int64_t)a->edp_size : (int64_t)W;
        if (o->counts[g] != need)
          return zck__fail(ZCK_ERR_MISMATCH, "%s: partition_count[%zu] is %lld; the %s group of this AutoEP run is "
                           "partitioned over %lld", o->file->path, g, (long long)o->counts[g],
                           ex ? "expert" : "dense", (long long)need);
      }
    }
  c->info.ep_size = a->ep_size;
  return ZCK_OK;
}

/* ---- the train layout: ZeRO's over the W ranks for the dense groups; the expert group is EP rank e's local flat
 * (local shapes) partitioned over the D expert-data-parallel ranks as ZeRO-1/2 or ZeRO-3 does it, rank d * E + e
 * holding edp rank d's part, its elements placed at expert e * local onwards of the full params */

zck_status zck__ds_autoep_train(const zck_ds_ckpt *c, size_t n_params, const uint64_t *numels,
                                const zck_group_spec *specs, size_t n_flat, uint32_t w, uint32_t param_align,
                                zck_layout **out) {
  return zck__ds_autoep_layout(n_params, numels, specs, n_flat, w, param_align, c->autoep->expert_group,
                               c->autoep->n_expert_groups, c->autoep->ep_size, c->info.stage == 3, out);
}

zck_status zck__ds_autoep_layout(size_t n_params, const uint64_t *numels, const zck_group_spec *specs, size_t n_flat,
                                 uint32_t w, uint32_t param_align, size_t eg, size_t n_eg, uint32_t E, bool z3,
                                 zck_layout **out) {
  *out = NULL;
  const uint32_t D = w / E;
  zck_layout *base = NULL, *loc = NULL, *l = NULL;
  uint64_t *lnum = zck__calloc(n_params + 1, sizeof *lnum);
  if (!lnum) return ZCK_ERR_NO_MEMORY;
  for (size_t k = eg; k < eg + n_eg; k++)
    for (size_t i = 0; i < specs[k].n_params; i++) lnum[specs[k].params[i]] = numels[specs[k].params[i]] / E;
  zck_status s = z3 ? zck_layout_zero3(n_params, numels, specs, n_flat, w, &base)
                    : zck_layout_zero12(n_params, numels, specs, n_flat, w, param_align, &base);
  if (s == ZCK_OK)   /* the experts' groups alone, local numels, over the D expert-data-parallel ranks */
    s = z3 ? zck_layout_zero3(n_params, lnum, specs + eg, n_eg, D, &loc)
           : zck_layout_zero12(n_params, lnum, specs + eg, n_eg, D, param_align, &loc);
  zck_layout_store *stores = s == ZCK_OK ? zck__calloc(base->n_stores + 1, sizeof *stores) : NULL;
  zck_piece *pieces = s == ZCK_OK ? zck__calloc(base->n_pieces + E * loc->n_pieces + 1, sizeof *pieces) : NULL;
  if (s == ZCK_OK && (!stores || !pieces)) s = ZCK_ERR_NO_MEMORY;
  size_t np = 0;
  if (s == ZCK_OK) {
    memcpy(stores, base->stores, base->n_stores * sizeof *stores);
    for (size_t k = 0; k < n_eg; k++)
      for (uint32_t d = 0; d < D; d++)
        for (uint32_t e = 0; e < E; e++) {
          zck_layout_store st = loc->stores[k * D + d];
          st.rank = (int32_t)(d * E + e);
          st.group = (int32_t)(eg + k);
          stores[(eg + k) * w + d * E + e] = st;
        }
    for (size_t i = 0; i < base->n_pieces; i++)
      if (!lnum[base->pieces[i].param]) pieces[np++] = base->pieces[i];
    for (uint32_t e = 0; e < E; e++)
      for (size_t i = 0; i < loc->n_pieces; i++) {
        zck_piece p = loc->pieces[i];
        uint32_t k = p.store / D, d = p.store % D;   /* loc's store k * D + d: group eg + k, edp rank d */
        p.param_off += e * lnum[p.param];
        p.store = (uint32_t)((eg + k) * w + d * E + e);
        pieces[np++] = p;
      }
    s = zck_layout_custom(n_params, numels, stores, base->n_stores, pieces, np, &l);
  }
  if (s == ZCK_OK) {  /* the groups, for build_train's checks: the expert group's geometry is loc's */
    l->kind = base->kind;
    l->world = w;
    if (!(l->groups = zck__calloc(n_flat + 1, sizeof *l->groups))) s = ZCK_ERR_NO_MEMORY;
    for (size_t g = 0; s == ZCK_OK && g < n_flat; g++) {
      s = zck_layout_group_dup(&l->groups[g], g >= eg && g < eg + n_eg ? &loc->groups[g - eg] : &base->groups[g]);
      l->groups[g].opt_group = base->groups[g].opt_group;
      l->n_groups = g + 1;
    }
  }
  free(stores);
  free(pieces);
  free(lnum);
  zck_layout_free(base);
  zck_layout_free(loc);
  if (s != ZCK_OK) { zck_layout_free(l); return s; }
  *out = l;
  return ZCK_OK;
}

