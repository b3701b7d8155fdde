/* ds_autoep_write.c: the AutoEP parts of zck_ds_writer: a DeepSpeed AutoEP (expert-parallel MoE) checkpoint written
 * at another world size W, EP size E and ZeRO stage, as DeepSpeed 0.19.8's AutoEP engine saves it (runtime/engine.py
 * _save_moe_checkpoint, stage_1_and_2.state_dict, stage3._rigid_state_dict) and loads it with load_checkpoint (each
 * rank reads its own optimizer file, so the layout must be the target's own):
 *   - the experts' optimizer group (`ep_size_<E>`, 'moe': True) holds, on rank d * E + e, edp rank d's partition of
 *     EP rank e's local flat (its experts' w1, w2, w3 at [n / E, ...]; ds_autoep.c zck__ds_autoep_layout, the
 *     readers' geometry), partitioned over the W / E ranks of EP rank e; the other groups are ZeRO's over W;
 *   - param_shapes with the experts' local shapes, then num_experts, ds_autoep_layers (the uniform placement at E,
 *     its affine maps) and universal_checkpoint_info (its version, expert_parameter_patterns, the same
 *     ds_autoep_layers); the router twice in `module` (<mlp>.router.gate.weight, then its alias
 *     <mlp>.gate.gate.weight);
 *   - ZeRO-1/2 ('per_expert_files'): one mp_rank_00_model_states.pt, `module` without the expert weights (the
 *     alias a view of the router's storage: DeepSpeed saves two copies of the same values), rank 0's record; and
 *     layer_<L>_expert_<E>_mp_rank_00_model_states.pt: {<prefix>.w1.<E>, w2, w3} in the module dtype, cast from the
 *     fp32 masters (what DeepSpeed's 16-bit copy holds after a step). ZeRO-1 writes the same files as ZeRO-2
 *     (checked against DeepSpeed 0.19.8's own ZeRO-1 save, tests/fixtures/autoep/ep2_s1_fp32);
 *   - ZeRO-3 ('zero3_partitioned'): no expert files; each rank's model file has `module`'s [0] placeholders (no
 *     expert weights, the alias one too) and its own record (its ep_rank, expert-data-parallel rank, global expert
 *     range: load_checkpoint checks them against the live placement), each optimizer file the experts' sub-groups
 *     and ds_zero_partition_groups (every sub-group's partition count, rank, ranks, family: stage 3 refuses a file
 *     whose list differs from the live engine's);
 *   - the expert group's param group named `ep_size_<E>` (DeepSpeed finds the expert-data-parallel group by it),
 *     ds_config's expert_parallel.autoep_size E. */
#include "ds_autoep.h"
#include "ds_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zck_ds_autoep_target {
  uint32_t ep_size;
  const struct zck__ds_autoep_file *layers;   /* the source's records: module paths, prefixes, experts */
  const zck_pk *num_experts;                  /* the source's root['num_experts'] (per layer; not EP-dependent) */
  const zck_pk *uci_version;                  /* its universal_checkpoint_info['universal_checkpoint_version'] */
};

/* ---- the target */

zck_status zck_ds_autoep_target_new(const zck_ds_ckpt *c, uint32_t ep_size, int stage, uint32_t world,
                                    zck_ds_autoep_target **out) {
  *out = NULL;
  const char *dir = c->info.dir;
  if (!c->autoep) return zck__fail(ZCK_ERR_INVALID_ARG, "%s: not an AutoEP checkpoint (--to-ep-size)", dir);
  if (stage < 1 || stage > 3)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: an AutoEP checkpoint: target ZeRO-%d is not an AutoEP layout", dir, stage);
  const struct zck__ds_autoep_file *f = c->autoep->layers;
  if (!ep_size || world % ep_size)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: EP size %u does not divide the world size %u (DeepSpeed's AutoEP needs "
                     "ep_size x expert-data-parallel size = world size)", dir, ep_size, world);
  for (size_t i = 0; i < f->n; i++)
    if (f->v[i].num_experts % ep_size)
      return zck__fail(ZCK_ERR_INVALID_ARG, "%s: EP size %u does not divide the %lld experts of %s", dir, ep_size,
                       (long long)f->v[i].num_experts, f->v[i].module_path);
  const zck_pk *root = zck_torch_root(zck_ds_rank0_model(c));
  zck_ds_autoep_target *t = zck__calloc(1, sizeof *t);
  if (!t) return ZCK_ERR_NO_MEMORY;
  t->ep_size = ep_size;
  t->layers = f;
  t->num_experts = zck_pk_dict_get(root, "num_experts");
  t->uci_version = zck_pk_dict_get(zck_pk_dict_get(root, "universal_checkpoint_info"), "universal_checkpoint_version");
  *out = t;
  return ZCK_OK;
}

void zck_ds_autoep_target_free(zck_ds_autoep_target *t) { free(t); }

/* ---- geometry */

uint32_t zck__ds_autoep_ep_size(const zck_ds_writer *w) { return w->o.autoep ? w->o.autoep->ep_size : 1; }

uint64_t zck__ds_flat_numel(const zck_ds_writer *w, uint32_t p) {
  uint64_t n = w->m->params[p].numel;
  return w->ae_layer && w->ae_layer[p] >= 0 ? n / w->o.autoep->ep_size : n;
}

static bool expert_flat(const zck_ds_writer *w, size_t g) {
  return w->ae_layer && g >= w->ae_group && g < w->ae_group + w->ae_n_groups;
}

uint32_t zck__ds_flat_rank(const zck_ds_writer *w, size_t g, uint32_t r) {
  if (w->moe_ep > 1 && g == w->moe_group) return r / w->moe_ep;   /* deepspeed.moe's experts (ds_moe_write.c) */
  return expert_flat(w, g) ? r / w->o.autoep->ep_size : r;
}

uint32_t zck__ds_flat_count(const zck_ds_writer *w, size_t g) {
  if (w->moe_ep > 1 && g == w->moe_group) return w->w / w->moe_ep;
  return expert_flat(w, g) ? w->w / w->o.autoep->ep_size : w->w;
}

zck_status zck__ds_autoep_geometry(zck_ds_writer *w) {
  const zck_model *m = w->m;
  const struct zck_ds_autoep_target *t = w->o.autoep;
  const struct zck__ds_autoep_file *f = t->layers;
  if (w->rank_only || w->o.tp_size > 1 || w->o.nvme_offload)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "AutoEP target: all ranks, no TP, no NVMe offload only");
  if (!(w->ae_layer = zck__malloc((m->n_params + 1) * sizeof *w->ae_layer)) ||
      !(w->lp_first = zck__calloc(m->n_params + 1, sizeof *w->lp_first)))
    return ZCK_ERR_NO_MEMORY;
  size_t n_exp = 0, n_lp = 0;
  int64_t group = -1;
  for (size_t p = 0; p < m->n_params; p++) {
    const zck__ds_autoep_layer *l;
    w->ae_layer[p] = -1;
    if (!zck__ds_autoep_weight(f, m->params[p].name, &l)) continue;
    w->ae_layer[p] = (int32_t)(l - f->v);
    if (m->params[p].ndim != 3 || m->params[p].shape[0] != l->num_experts || m->params[p].frozen ||
        m->params[p].tied_to >= 0)
      return zck__fail(ZCK_ERR_FORMAT, "AutoEP expert '%s' is not a trainable [%lld experts, ., .] param",
                       m->params[p].name, (long long)l->num_experts);
    n_exp++;
  }
  if (n_exp != 3 * f->n)
    return zck__fail(ZCK_ERR_FORMAT, "the manifest holds %zu AutoEP expert weights; ds_autoep_layers needs %zu (open the "
                     "source with DeepSpeed's names)", n_exp, 3 * f->n);
  /* the experts' flat group: all of them, nothing else (ZeRO-3: the consecutive sub-groups of their param group;
   * lib/layout splits it by partition numel ceil(n / W) = ceil((n / E) / D), as DeepSpeed splits the local flat) */
  int64_t last = -1;
  for (size_t g = 0; g < w->n_flat; g++)
    for (size_t i = 0; i < w->flat[g].n_params; i++) {
      bool ex = w->ae_layer[w->flat[g].params[i]] >= 0;
      if (ex && group < 0) group = (int64_t)g;
      if (ex && (int64_t)g > last) {
        if (last >= 0 && (int64_t)g != last + 1)
          return zck__fail(ZCK_ERR_UNSUPPORTED, "AutoEP experts in flat groups %lld and %zu: not supported",
                           (long long)last, g);
        last = (int64_t)g;
      }
      if (ex != (group >= 0 && (int64_t)g >= group && (int64_t)g <= last))
        return zck__fail(ZCK_ERR_UNSUPPORTED, "AutoEP experts share an optimizer group with '%s': not supported",
                         m->params[w->flat[g].params[i]].name);
    }
  w->ae_group = (size_t)group;
  w->ae_n_groups = (size_t)(last - group + 1);
  ZCK_TRY(zck__ds_autoep_layout(m->n_params, w->geo.numel, w->flat, w->n_flat, w->w, w->o.param_align, w->ae_group,
                                w->ae_n_groups, t->ep_size, w->stage == 3, &w->ae_train));
  w->train = w->ae_train;
  if (w->stage == 3) return ZCK_OK;   /* no 16-bit weights saved, no expert files */
  /* LP stores: one per owner param, one per expert for the expert weights (in their expert files) */
  for (size_t i = 0; i < w->n_owners; i++) {
    uint32_t p = w->owners[i];
    w->lp_first[p] = n_lp;
    n_lp += w->ae_layer[p] >= 0 ? (size_t)f->v[w->ae_layer[p]].num_experts : 1;
  }
  zck_layout_store *st = zck__calloc(n_lp + 1, sizeof *st);
  zck_piece *pc = zck__calloc(n_lp + 1, sizeof *pc);
  zck_status s = st && pc ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < w->n_owners; i++) {
    uint32_t p = w->owners[i];
    uint64_t n = m->params[p].numel;
    size_t k = w->ae_layer[p] >= 0 ? (size_t)f->v[w->ae_layer[p]].num_experts : 1;
    for (size_t e = 0; e < k; e++) {
      size_t id = w->lp_first[p] + e;
      st[id] = (zck_layout_store){-1, -1, k == 1 ? (int32_t)p : -1, n / k, n / k};
      pc[id] = (zck_piece){.param = p, .store = (uint32_t)id, .param_off = e * (n / k), .count = n / k};
    }
  }
  if (s == ZCK_OK) s = zck_layout_custom(m->n_params, w->geo.numel, st, n_lp, pc, n_lp, &w->lp_layout);
  free(st);
  free(pc);
  for (size_t i = 0; i < f->n; i++) w->n_expert_files += (size_t)f->v[i].num_experts;
  if (s == ZCK_OK && !(w->expert_w = zck__calloc(w->n_expert_files + 1, sizeof *w->expert_w))) s = ZCK_ERR_NO_MEMORY;
  return s;
}

/* ---- the files */

static bool put(zck_pk_doc *d, zck_pk *dict, const char *key, zck_pk *v) {
  zck_pk *k = zck_pk_new_str(d, key);
  return k && v && zck_pk_dict_set(d, dict, k, v);
}

static zck_pk *ints(zck_pk_doc *d, const int64_t *v, size_t n) {
  zck_pk *l = zck_pk_new_list(d);
  for (size_t i = 0; l && i < n; i++)
    if (!zck_pk_append(d, l, zck_pk_new_int(d, v[i]))) return NULL;
  return l;
}

/* The param of layer l's weight k (1..3). */
static int64_t weight_param(const zck_ds_writer *w, size_t l, int k) {
  char pn[1100];
  snprintf(pn, sizeof pn, "%s.w%d", w->o.autoep->layers->v[l].prefix, k);
  return zck_model_find_param(w->m, pn);
}

zck_status zck__ds_expert_file_open(zck_ds_writer *w, size_t i, const char *name, char **path, zck_pk **root) {
  *root = NULL;
  if (!(*path = zck__path_join(w->fdir, name))) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck_torch_writer_create(*path, &w->expert_w[i]));
  zck_pk_doc *d = zck_torch_writer_doc(w->expert_w[i]);
  return d && (*root = zck_pk_new_dict(d, 0)) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

zck_status zck__ds_expert_tensor(zck_ds_writer *w, size_t i, zck_pk *root, const char *key, const char *label,
                                 uint64_t numel, int ndim, const int64_t *shape, zck_store *out) {
  zck_torch_writer *tw = w->expert_w[i];
  uint64_t off;
  size_t idx;
  zck_pk *t;
  ZCK_TRY(zck__ds_add_storage(tw, NULL, w->lp, numel, NULL, &idx, &off));
  if (!(t = zck_torch_writer_tensor(tw, idx, ndim, shape, NULL, 0, 0))) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck__ds_add_wstore(w, tw, NULL, idx, off, w->lp, numel, label, out));
  return put(zck_torch_writer_doc(tw), root, key, t) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

zck_status zck__ds_build_expert_file(zck_ds_writer *w, size_t i) {
  const struct zck__ds_autoep_file *f = w->o.autoep->layers;
  size_t l = 0;
  int64_t e = (int64_t)i;
  while (l < f->n && e >= f->v[l].num_experts) e -= f->v[l++].num_experts;
  char name[128], label[1300];
  snprintf(name, sizeof name, "layer_%lld_expert_%lld_mp_rank_00_model_states.pt", (long long)f->v[l].layer_id,
           (long long)e);
  char *path = NULL;
  zck_pk *root;
  zck_status s = zck__ds_expert_file_open(w, i, name, &path, &root);
  for (int k = 1; s == ZCK_OK && k <= 3; k++) {
    int64_t p = weight_param(w, l, k);
    if (p < 0) { s = zck__fail(ZCK_ERR_FORMAT, "%s: no param %s.w%d", path, f->v[l].prefix, k); break; }
    const zck_param *pp = &w->m->params[p];
    char key[1100];
    snprintf(key, sizeof key, "%s.w%d.%lld", f->v[l].prefix, k, (long long)e);
    snprintf(label, sizeof label, "%s/%s: '%.1000s'", w->shown, name, key);
    s = zck__ds_expert_tensor(w, i, root, key, label, (uint64_t)(pp->shape[1] * pp->shape[2]), 2, pp->shape + 1,
                              &w->stores[ZCK_DS_LP][w->lp_first[p] + (size_t)e]);
  }
  if (s == ZCK_OK) s = zck_torch_writer_seal(w->expert_w[i], root);
  free(path);
  return s;
}

const char *zck__ds_autoep_alias(const zck_ds_writer *w, uint32_t p, char *buf, size_t cap) {
  if (!w->ae_layer) return NULL;
  const zck__ds_autoep_layer *l = zck__ds_autoep_layer_of(w->o.autoep->layers, w->m->params[p].name,
                                                         ".router.gate.weight");
  if (!l) return NULL;
  snprintf(buf, cap, "%s.gate.gate.weight", l->module_path);
  return buf;
}

const char *zck__ds_autoep_group_name(const zck_ds_writer *w, size_t g, char *buf, size_t cap) {
  if (!w->ae_layer || w->flat[w->ae_group].opt_group != (int32_t)g) return NULL;
  snprintf(buf, cap, "ep_size_%u", w->o.autoep->ep_size);
  return buf;
}

/* expert_placement: {'version': 1, 'num_experts', 'ep_size', 'ranks': [{'rank': k, 'experts': [...]}]}
 * (make_autoep_placement_descriptor, the uniform placement) */
static zck_pk *placement(zck_pk_doc *d, int64_t n, int64_t E) {
  zck_pk *pl = zck_pk_new_dict(d, 0), *ranks = zck_pk_new_list(d);
  if (!pl || !ranks || !put(d, pl, "version", zck_pk_new_int(d, 1)) || !put(d, pl, "num_experts", zck_pk_new_int(d, n)) ||
      !put(d, pl, "ep_size", zck_pk_new_int(d, E)) || !put(d, pl, "ranks", ranks))
    return NULL;
  for (int64_t k = 0; k < E; k++) {
    zck_pk *r = zck_pk_new_dict(d, 0), *ex = zck_pk_new_list(d);
    if (!r || !ex || !put(d, r, "rank", zck_pk_new_int(d, k)) || !put(d, r, "experts", ex) || !zck_pk_append(d, ranks, r))
      return NULL;
    for (int64_t j = 0; j < n / E; j++)
      if (!zck_pk_append(d, ex, zck_pk_new_int(d, k * (n / E) + j))) return NULL;
  }
  return pl;
}

/* [offset, [row-major strides of shape]] */
static zck_pk *addr(zck_pk_doc *d, int64_t off, const int64_t *shape, int nd) {
  int64_t st[ZCK_MAX_DIMS];
  for (int i = nd - 1; i >= 0; i--) st[i] = i == nd - 1 ? 1 : st[i + 1] * shape[i + 1];
  zck_pk *a = zck_pk_new_list(d);
  if (!a || !zck_pk_append(d, a, zck_pk_new_int(d, off)) || !zck_pk_append(d, a, ints(d, st, (size_t)nd))) return NULL;
  return a;
}

/* One expert param's affine map (autoep_placement_to_affine_map + ParamAffineMap.to_dict): each EP rank one piece,
 * its contiguous experts. */
static zck_pk *affine(zck_pk_doc *d, const zck_param *pp, int64_t E) {
  int nd = pp->ndim;
  int64_t local[ZCK_MAX_DIMS], per = 1;
  memcpy(local, pp->shape, (size_t)nd * sizeof *local);
  local[0] = pp->shape[0] / E;
  for (int i = 1; i < nd; i++) per *= pp->shape[i];
  zck_pk *m = zck_pk_new_dict(d, 0), *ranks = zck_pk_new_dict(d, 0);
  if (!m || !ranks || !put(d, m, "logical_shape", ints(d, pp->shape, (size_t)nd)) || !put(d, m, "ranks", ranks)) return NULL;
  for (int64_t k = 0; k < E; k++) {
    zck_pk *r = zck_pk_new_dict(d, 0), *pieces = zck_pk_new_list(d), *pc = zck_pk_new_dict(d, 0);
    int64_t loc = k;
    if (!r || !pieces || !pc || !put(d, r, "shard_shape", ints(d, local, (size_t)nd)) || !put(d, r, "pieces", pieces) ||
        !zck_pk_dict_set(d, ranks, zck_pk_new_int(d, k), r) || !zck_pk_append(d, pieces, pc) ||
        !put(d, pc, "shape", ints(d, local, (size_t)nd)) || !put(d, pc, "source", addr(d, k * local[0] * per, pp->shape, nd)) ||
        !put(d, pc, "dest", addr(d, 0, local, nd)) || !put(d, pc, "locations", ints(d, &loc, 1)))
      return NULL;
  }
  return m;
}

/* ds_autoep_layers as rank r of the target records it (the _save_moe_checkpoint entry, key order included; ZeRO-1/2
 * save rank 0's only) */
static zck_pk *layers_pk(zck_ds_writer *w, zck_pk_doc *d, uint32_t r) {
  const struct zck__ds_autoep_file *f = w->o.autoep->layers;
  const int64_t E = w->o.autoep->ep_size, D = w->w / w->o.autoep->ep_size, ep = r % E, edp = r / E;
  const bool z3 = w->stage == 3;
  zck_pk *list = zck_pk_new_list(d);
  for (size_t i = 0; list && i < f->n; i++) {
    const zck__ds_autoep_layer *l = &f->v[i];
    int64_t n = l->num_experts;
    char group[32];
    snprintf(group, sizeof group, "ep_size_%lld", (long long)E);
    zck_pk *e = zck_pk_new_dict(d, 0), *am = zck_pk_new_dict(d, 0), *params = zck_pk_new_dict(d, 0);
    if (!e || !am || !params || !zck_pk_append(d, list, e) || !put(d, e, "moe_layer_id", zck_pk_new_int(d, l->layer_id)) ||
        !put(d, e, "module_path", zck_pk_new_str(d, l->module_path)) || !put(d, e, "num_experts", zck_pk_new_int(d, n)) ||
        !put(d, e, "num_local_experts", zck_pk_new_int(d, n / E)) || !put(d, e, "ep_size", zck_pk_new_int(d, E)) ||
        !put(d, e, "expert_placement", placement(d, n, E)) || !put(d, am, "version", zck_pk_new_int(d, 1)) ||
        !put(d, am, "params", params) || !put(d, e, "affine_maps", am))
      return NULL;
    for (int k = 1; k <= 3; k++) {
      int64_t p = weight_param(w, i, k);
      if (p < 0 || !put(d, params, w->m->params[p].name, affine(d, &w->m->params[p], E))) return NULL;
    }
    /* checkpoint_format_version: AUTOEP_ZERO3_EXPERT_STATE_FORMAT_VERSION (1) at ZeRO-3, which load_checkpoint
     * requires; None otherwise */
    if (!put(d, e, "expert_key_prefix", zck_pk_new_str(d, l->prefix)) ||
        !put(d, e, "checkpoint_format", zck_pk_new_str(d, z3 ? "zero3_partitioned" : "per_expert_files")) ||
        !put(d, e, "checkpoint_format_version", z3 ? zck_pk_new_int(d, 1) : zck_pk_new_none(d)) ||
        !put(d, e, "ep_group_name", zck_pk_new_str(d, group)) || !put(d, e, "ep_rank", zck_pk_new_int(d, ep)) ||
        !put(d, e, "expert_data_parallel_rank", zck_pk_new_int(d, edp)) ||
        !put(d, e, "expert_data_parallel_world_size", zck_pk_new_int(d, D)) ||
        !put(d, e, "global_expert_start", zck_pk_new_int(d, ep * (n / E))) ||
        !put(d, e, "global_expert_end", zck_pk_new_int(d, (ep + 1) * (n / E))))
      return NULL;
  }
  return list;
}

bool zck__ds_autoep_model_extras(zck_ds_writer *w, zck_pk_doc *d, zck_pk *root, uint32_t r) {
  const struct zck_ds_autoep_target *t = w->o.autoep;
  zck_pk *ne = t->num_experts ? zck__ds_pk_copy(d, t->num_experts) : NULL;
  if (!ne) {   /* self.num_experts: each MoE layer's */
    if (!(ne = zck_pk_new_list(d))) return false;
    for (size_t i = 0; i < t->layers->n; i++)
      if (!zck_pk_append(d, ne, zck_pk_new_int(d, t->layers->v[i].num_experts))) return false;
  }
  zck_pk *uci = zck_pk_new_dict(d, 0), *pat = zck_pk_new_list(d);
  zck_pk *ver = t->uci_version ? zck__ds_pk_copy(d, t->uci_version) : zck_pk_new_float(d, 0.4);
  return uci && pat && put(d, root, "num_experts", ne) && put(d, root, "ds_autoep_layers", layers_pk(w, d, r)) &&
         put(d, uci, "universal_checkpoint_version", ver) &&
         zck_pk_append(d, pat, zck_pk_new_str(d, ".*\\.experts\\.w[123]$")) &&
         put(d, uci, "expert_parameter_patterns", pat) && put(d, uci, "ds_autoep_layers", layers_pk(w, d, r)) &&
         put(d, root, "universal_checkpoint_info", uci);
}

/* ds_zero_partition_groups (stage3._zero3_partition_group_metadata): per sub-group its partition count, this rank's
 * index, the ranks it is partitioned over, its family and group name; the experts' sub-groups are partitioned over
 * the expert-data-parallel ranks e, e + E, ... of EP rank e */
zck_pk *zck__ds_autoep_partition_groups(const zck_ds_writer *w, zck_pk_doc *d, uint32_t r) {
  const uint32_t E = w->o.autoep->ep_size;
  zck_pk *list = zck_pk_new_list(d);
  char gname[32];
  snprintf(gname, sizeof gname, "ep_size_%u", E);
  for (size_t g = 0; list && g < w->n_flat; g++) {
    const bool ex = expert_flat(w, g);
    const uint32_t n = zck__ds_flat_count(w, g);
    const char *name = ex ? gname : "replicated";
    zck_pk *e = zck_pk_new_dict(d, 0), *ranks = zck_pk_new_list(d), *fam = zck_pk_new_list(d), *gn = zck_pk_new_list(d);
    if (!e || !ranks || !fam || !gn || !zck_pk_append(d, list, e) || !put(d, e, "sub_group", zck_pk_new_int(d, (int64_t)g)) ||
        !put(d, e, "partition_count", zck_pk_new_int(d, n)) ||
        !put(d, e, "partition_rank", zck_pk_new_int(d, zck__ds_flat_rank(w, g, r))) ||
        !put(d, e, "partition_ranks", ranks) || !put(d, e, "families", fam) || !put(d, e, "group_names", gn) ||
        !zck_pk_append(d, fam, zck_pk_new_str(d, ex ? "autoep_expert" : "replicated")) ||
        !zck_pk_append(d, gn, zck_pk_new_str(d, name)))
      return NULL;
    for (uint32_t k = 0; k < n; k++)
      if (!zck_pk_append(d, ranks, zck_pk_new_int(d, ex ? (int64_t)(k * E + r % E) : (int64_t)k))) return NULL;
  }
  return list;
}
