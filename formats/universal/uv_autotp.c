/* uv_autotp.c: a universal folder made from an AutoTP (tensor-parallel) checkpoint.
 *
 * ds_to_universal.py (and zckpt to-universal) of an AutoTP checkpoint write every
 * zero/<param>/<state>.pt as the FULL tensor ({'param': T}, or {'vocab_tensor': True,
 * 'param': T} for a vocabulary-parallel param; no cat_dim: the affine map merged them) and
 * copy every mp_rank_0t model-states file verbatim. The carried rank-0 model file still
 * describes TP rank 0's slices (param_shapes, module) and holds DeepSpeed's record of the
 * slicing, universal_checkpoint_info['affine_map']: its 'logical_shape' per param is the
 * full shape the state files hold. The reader takes the params' shapes from it, so the
 * folder reads as the full model (reshard into plain ZeRO, verify, inspect), as DeepSpeed's
 * load_universal cuts each full tensor again by the same map. */
#include "uv_internal.h"

#include "deepspeed/deepspeed.h"
#include "strmap.h"

#include <stdlib.h>
#include <string.h>

static bool int_list(const zck_pk *n, int64_t *out, int max, int *len) {
  if (!n || (n->kind != ZCK_PK_LIST && n->kind != ZCK_PK_TUPLE) || n->u.seq.len > (size_t)max) return false;
  for (size_t i = 0; i < n->u.seq.len; i++)
    if (!zck_pk_as_int(n->u.seq.items[i], &out[i])) return false;
  *len = (int)n->u.seq.len;
  return true;
}

/* affine_map entry of param p: its logical (full) shape, checked against the rank-0
 * shard shape param_shapes gave p and against tp_size. */
static zck_status full_shape(const zck_param *pp, const zck_pk *entry, uint32_t T, int *nd,
                             int64_t *full, const char *path) {
  const zck_pk *ranks = entry && entry->kind == ZCK_PK_DICT ? zck_pk_dict_get(entry, "ranks") : NULL;
  if (!int_list(zck_pk_dict_get(entry, "logical_shape"), full, ZCK_MAX_DIMS, nd) || !ranks || ranks->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_FORMAT, "%s: universal_checkpoint_info['affine_map'] of '%s' has no 'logical_shape' list "
                     "or 'ranks' dict", path, pp->name);
  uint64_t numel = 1;
  for (int d = 0; d < *nd; d++) {
    if (full[d] < 0 || (full[d] && numel > (UINT64_C(1) << 60) / (uint64_t)full[d]))
      return zck__fail(ZCK_ERR_FORMAT, "%s: affine_map of '%s': bad logical_shape", path, pp->name);
    numel *= (uint64_t)full[d];
  }
  if (ranks->u.dict.len != T)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: affine_map of '%s' lists %zu TP ranks but mp_world_size is %u", path,
                     pp->name, ranks->u.dict.len, T);
  const zck_pk *r0 = NULL;
  for (size_t i = 0; i < ranks->u.dict.len && !r0; i++) {
    int64_t r;
    if (zck_pk_as_int(ranks->u.dict.keys[i], &r) && r == 0) r0 = ranks->u.dict.values[i];
  }
  int64_t shard[ZCK_MAX_DIMS];
  int snd = 0;
  if (!r0 || r0->kind != ZCK_PK_DICT || !int_list(zck_pk_dict_get(r0, "shard_shape"), shard, ZCK_MAX_DIMS, &snd))
    return zck__fail(ZCK_ERR_FORMAT, "%s: affine_map of '%s' has no TP rank 0 'shard_shape'", path, pp->name);
  bool same = snd == pp->ndim;
  for (int d = 0; same && d < snd; d++) same = shard[d] == pp->shape[d];
  if (!same) {
    char a[128], b[128];
    return zck__fail(ZCK_ERR_MISMATCH, "%s: affine_map gives '%s' TP rank 0 shard_shape %s but param_shapes says %s",
                     path, pp->name, zck_shape_str(snd, shard, a, sizeof a), zck_shape_str(pp->ndim, pp->shape, b, sizeof b));
  }
  return ZCK_OK;
}

/* vocabulary_parameter_patterns: ds_to_universal cuts such a param to original_vocab_size
 * rows; DeepSpeed's AutoTP load takes the rows from the affine map, which only fit an
 * unpadded vocabulary. */
static zck_status check_vocab(const zck_uv_ckpt *c, const zck_pk *uci, const char *path) {
  const zck_pk *vp = zck_pk_dict_get(uci, "vocabulary_parameter_patterns");
  int64_t orig = -1;
  const zck_pk *ov = zck_pk_dict_get(uci, "original_vocab_size");
  if (!vp || vp->kind == ZCK_PK_NONE || !ov || ov->kind == ZCK_PK_NONE) return ZCK_OK;
  if ((vp->kind != ZCK_PK_LIST && vp->kind != ZCK_PK_TUPLE) || !zck_pk_as_int(ov, &orig))
    return zck__fail(ZCK_ERR_FORMAT, "%s: vocabulary_parameter_patterns / original_vocab_size malformed", path);
  for (size_t i = 0; i < vp->u.seq.len; i++) {
    const char *pat = zck_pk_as_str(vp->u.seq.items[i]);
    char *lit = pat ? zck__calloc(strlen(pat) + 1, 1) : NULL;
    if (pat && !lit) return ZCK_ERR_NO_MEMORY;
    int64_t p = lit && zck_ds_pattern_name(pat, lit) ? zck_model_find_param(c->m, lit) : -2;
    free(lit);
    if (p == -2)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: vocabulary_parameter_patterns[%zu] is not one parameter's name", path, i);
    const zck_param *pp = p >= 0 ? &c->m->params[p] : NULL;
    if (pp && (pp->ndim < 1 || pp->shape[0] != orig))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: '%s' has %lld rows but original_vocab_size is %lld: a padded vocabulary "
                       "is not supported", path, pp->name, pp->ndim ? (long long)pp->shape[0] : 0LL, (long long)orig);
  }
  return ZCK_OK;
}

zck_status zck__uv_autotp(zck_uv_ckpt *c) {
  const char *path = zck_torch_name(c->model0);
  uint32_t T = c->info.tp_size;
  zck_model *m = c->m;
  const zck_pk *uci = zck_pk_dict_get(zck_torch_root(c->model0), "universal_checkpoint_info");
  const zck_pk *am = uci ? zck_pk_dict_get(uci, "affine_map") : NULL;
  const zck_pk *amp = am ? zck_pk_dict_get(am, "params") : NULL;
  int64_t ver = 0;
  if (!amp || amp->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: mp_world_size %u but no universal_checkpoint_info['affine_map'] (not "
                     "AutoTP): tensor/pipeline-parallel checkpoints are not supported", path, T);
  if (!zck_pk_as_int(zck_pk_dict_get(am, "version"), &ver) || ver != 1)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: affine_map version %lld (zckpt reads version 1)", path, (long long)ver);
  size_t n = amp->u.dict.len;
  char **lits = zck__calloc(n + 1, sizeof *lits);
  int64_t (*full)[ZCK_MAX_DIMS] = zck__calloc(m->n_params + 1, sizeof *full);
  int *nd = zck__calloc(m->n_params + 1, sizeof *nd);
  zck__strmap names = {0};
  zck_status st = lits && full && nd ? zck__strmap_init(&names, n) : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < n; i++) {
    const char *pat = zck_pk_as_str(amp->u.dict.keys[i]);
    if (!pat) { st = zck__fail(ZCK_ERR_FORMAT, "%s: affine_map key %zu is not a string", path, i); break; }
    if (!(lits[i] = zck__calloc(strlen(pat) + 1, 1))) { st = ZCK_ERR_NO_MEMORY; break; }
    if (!zck_ds_pattern_name(pat, lits[i])) {
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: affine_map pattern '%.200s' is not one parameter's name", path, pat);
      break;
    }
    bool dup = false;
    size_t prev;
    st = zck__strmap_put(&names, lits[i], i, &dup, &prev);
  }
  for (size_t p = 0; st == ZCK_OK && p < m->n_params; p++) {
    const zck_param *pp = &m->params[p];
    nd[p] = pp->ndim;
    memcpy(full[p], pp->shape, sizeof full[p]);
    if (pp->tied_to >= 0) continue;
    size_t k;
    if (!zck__strmap_get(&names, pp->name, &k))
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: parameter '%s' has no universal_checkpoint_info['affine_map'] entry: its "
                     "full shape is unknown", path, pp->name);
    else st = full_shape(pp, amp->u.dict.values[k], T, &nd[p], full[p], path);
  }
  for (size_t p = 0; st == ZCK_OK && p < m->n_params; p++) {
    uint32_t src = zck_model_owner(m, (uint32_t)p);
    st = zck_model_set_shape(m, (uint32_t)p, nd[src], full[src]);
  }
  if (st == ZCK_OK) st = check_vocab(c, uci, path);
  for (size_t i = 0; lits && i < n; i++) free(lits[i]);
  free(lits);
  free(full);
  free(nd);
  zck__strmap_free(&names);
  return st;
}

const zck_pk *zck_uv_autotp_info(const zck_uv_ckpt *c) {
  if (c->info.tp_size <= 1 || !c->model0) return NULL;
  return zck_pk_dict_get(zck_torch_root(c->model0), "universal_checkpoint_info");
}
