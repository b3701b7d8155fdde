/* ds_autotp.c: AutoTP (tensor-parallel) checkpoints as one state view.
 *
 * DeepSpeed's AutoTP (`"tensor_parallel": {"autotp_size": T}`, ZeRO 1/2/3) saves one ZeRO
 * checkpoint per TP rank t in the same tag folder: mp_rank_0t_model_states.pt and
 * [bf16_]zero_pp_rank_<dp>_mp_rank_0t_optim_states.pt. Each holds the TP slices of the
 * model (column-parallel linears cut along dim 0, row-parallel ones along dim 1, the
 * vocab-parallel embedding / head along dim 0, norms replicated), partitioned by ZeRO over
 * the data-parallel group as usual. Each is opened here as a plain ZeRO checkpoint (ds_open.c,
 * shard shapes), and this describer states where every element of each FULL parameter lives:
 * it composes DeepSpeed's own record of the slicing, universal_checkpoint_info['affine_map']
 * (deepspeed/checkpoint/affine.py: per param the logical shape and, per TP rank, pieces
 * `shape, source (offset, strides) in the full tensor, dest (offset, strides) in the shard,
 * locations (ranks holding it), scale`), with each rank's ZeRO layout. The result is one
 * custom layout over the full shapes whose stores are every TP rank's stores, so every job
 * (consolidate, to-universal, reshard, verify) runs through the one transfer unchanged.
 *
 * A piece held by several ranks (replicated norms) is read from the first rank of its
 * locations, as ParamAffineMap.rebuild keeps the first copy (DeepSpeed's rebuild also
 * checks that the copies agree; zckpt does not compare them). Scaled pieces (pre-divided
 * replicated biases of row-parallel layers) cannot be moved by a copy: refused. ZeRO-3
 * works the same way: each TP rank's per-parameter partitions are composed alike. */
#include "ds_internal.h"
#include "strmap.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One contiguous run of a full param's flat array held in TP rank `rank`'s shard. */
typedef struct tp_run {
  uint64_t full_off, shard_off, count;
  uint32_t rank;
} tp_run;

typedef struct tp_runs {
  tp_run *v;
  size_t n, cap;
  size_t *first;             /* [n_params + 1] */
} tp_runs;

static zck_status push_run(tp_runs *R, tp_run r) {
  if (R->n && R->v[R->n - 1].rank == r.rank && R->v[R->n - 1].full_off + R->v[R->n - 1].count == r.full_off &&
      R->v[R->n - 1].shard_off + R->v[R->n - 1].count == r.shard_off) {
    R->v[R->n - 1].count += r.count;
    return ZCK_OK;
  }
  if (R->n == R->cap) {
    size_t nc = R->cap ? 2 * R->cap : 256;
    tp_run *nv = zck__realloc(R->v, nc * sizeof *nv);
    if (!nv) return ZCK_ERR_NO_MEMORY;
    R->v = nv;
    R->cap = nc;
  }
  R->v[R->n++] = r;
  return ZCK_OK;
}

const char *zck_ds_pattern_name(const char *pat, char *out) {
  size_t n = strlen(pat), k = 0;
  if (n < 2 || pat[0] != '^' || pat[n - 1] != '$' || (n >= 3 && pat[n - 2] == '\\')) return NULL;
  for (size_t i = 1; i + 1 < n; i++) {
    char ch = pat[i];
    if (ch == '\\') {
      ch = pat[++i];
      if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) return NULL; /* \d, \w ... */
    } else if (strchr(".^$*+?()[]{}|", ch)) {
      return NULL;
    }
    out[k++] = ch;
  }
  out[k] = 0;
  return out;
}

static bool int_list(const zck_pk *n, int64_t *out, int max, int *len) {
  if (!n || (n->kind != ZCK_PK_LIST && n->kind != ZCK_PK_TUPLE) || n->u.seq.len > (size_t)max) return false;
  for (size_t i = 0; i < n->u.seq.len; i++)
    if (!zck_pk_as_int(n->u.seq.items[i], &out[i])) return false;
  *len = (int)n->u.seq.len;
  return true;
}

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
  if (a && b > UINT64_MAX / a) return false;
  *out = a * b;
  return true;
}

/* [offset, strides] of a piece side; the highest element offset it touches goes to *last. */
static bool piece_side(const zck_pk *n, int nd, const int64_t *shape, int64_t *off, int64_t *strides, uint64_t *last) {
  int len = 0;
  if (!n || (n->kind != ZCK_PK_LIST && n->kind != ZCK_PK_TUPLE) || n->u.seq.len != 2) return false;
  if (!zck_pk_as_int(n->u.seq.items[0], off) || *off < 0) return false;
  if (!int_list(n->u.seq.items[1], strides, ZCK_MAX_DIMS, &len) || len != nd) return false;
  uint64_t hi = (uint64_t)*off;
  for (int d = 0; d < nd; d++) {
    uint64_t step;
    if (strides[d] < 0 || !mul_ok((uint64_t)(shape[d] - 1), (uint64_t)strides[d], &step) || hi + step < hi) return false;
    hi += step;
  }
  *last = hi;
  return true;
}

/* The runs of one param on one TP rank from the pieces it holds. Unless `all` (a target: every
 * copy is written), pieces whose first holder is another rank are checked but not used. */
static zck_status rank_runs(tp_runs *R, const zck_pk *pieces, uint32_t rank, uint32_t T, uint64_t full_numel,
                            uint64_t shard_numel, bool all, const char *where) {
  if (!pieces || pieces->kind != ZCK_PK_LIST)
    return zck__fail(ZCK_ERR_FORMAT, "%s: 'pieces' is not a list", where);
  uint64_t held = 0;
  for (size_t i = 0; i < pieces->u.seq.len; i++) {
    const zck_pk *pc = pieces->u.seq.items[i];
    int64_t shape[ZCK_MAX_DIMS], soff, sstr[ZCK_MAX_DIMS], doff, dstr[ZCK_MAX_DIMS], loc[64];
    int nd = 0, nloc = 0;
    uint64_t slast = 0, dlast = 0, numel = 1;
    if (!pc || pc->kind != ZCK_PK_DICT || !int_list(zck_pk_dict_get(pc, "shape"), shape, ZCK_MAX_DIMS, &nd))
      return zck__fail(ZCK_ERR_FORMAT, "%s: piece %zu has no 'shape' list", where, i);
    for (int d = 0; d < nd; d++)
      if (shape[d] < 0 || !mul_ok(numel, (uint64_t)shape[d], &numel))
        return zck__fail(ZCK_ERR_FORMAT, "%s: piece %zu has a bad shape", where, i);
    held += numel;
    if (!numel) continue;
    if (!piece_side(zck_pk_dict_get(pc, "source"), nd, shape, &soff, sstr, &slast) || slast >= full_numel)
      return zck__fail(ZCK_ERR_FORMAT, "%s: piece %zu: 'source' is not [offset, strides] inside the %llu-element parameter",
                       where, i, (unsigned long long)full_numel);
    if (!piece_side(zck_pk_dict_get(pc, "dest"), nd, shape, &doff, dstr, &dlast) || dlast >= shard_numel)
      return zck__fail(ZCK_ERR_FORMAT, "%s: piece %zu: 'dest' is not [offset, strides] inside the %llu-element shard",
                       where, i, (unsigned long long)shard_numel);
    if (!int_list(zck_pk_dict_get(pc, "locations"), loc, 64, &nloc) || !nloc)
      return zck__fail(ZCK_ERR_FORMAT, "%s: piece %zu: 'locations' is not a list of ranks", where, i);
    int64_t first = loc[0];
    bool mine = false;
    for (int k = 0; k < nloc; k++) {
      if (loc[k] < 0 || loc[k] >= (int64_t)T)
        return zck__fail(ZCK_ERR_FORMAT, "%s: piece %zu: location %lld is not a TP rank (tp_size %u)", where, i,
                         (long long)loc[k], T);
      if (loc[k] < first) first = loc[k];
      mine |= loc[k] == (int64_t)rank;
    }
    if (!mine) return zck__fail(ZCK_ERR_FORMAT, "%s: piece %zu is not located on the rank that lists it", where, i);
    double scale = 1.0;
    const zck_pk *sc = zck_pk_dict_get(pc, "scale");
    if (sc && (!zck_pk_as_double(sc, &scale) || scale != 1.0))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: piece %zu is stored scaled (a pre-divided replicated bias): not supported",
                       where, i);
    if (first != (int64_t)rank && !all) continue;
    /* walk the piece in row-major order, one run per innermost row (or element) */
    int64_t inner = nd ? shape[nd - 1] : 1;
    bool dense = !nd || inner == 1 || (sstr[nd - 1] == 1 && dstr[nd - 1] == 1);
    uint64_t run = dense ? (uint64_t)inner : 1, n_runs = numel / run;
    int64_t idx[ZCK_MAX_DIMS] = {0};
    for (uint64_t k = 0; k < n_runs; k++) {
      uint64_t fo = (uint64_t)soff, so = (uint64_t)doff;
      int top = dense ? nd - 1 : nd;
      for (int d = 0; d < top; d++) {
        fo += (uint64_t)(idx[d] * sstr[d]);
        so += (uint64_t)(idx[d] * dstr[d]);
      }
      ZCK_TRY(push_run(R, (tp_run){fo, so, run, rank}));
      for (int d = top - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) break;
        idx[d] = 0;
      }
    }
  }
  if (held != shard_numel)
    return zck__fail(ZCK_ERR_FORMAT, "%s: pieces hold %llu elements but the shard has %llu", where,
                     (unsigned long long)held, (unsigned long long)shard_numel);
  return ZCK_OK;
}

static int cmp_run(const void *a, const void *b) {
  const tp_run *x = a, *y = b;
  return x->full_off < y->full_off ? -1 : x->full_off > y->full_off;
}

static bool same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
  if (na != nb) return false;
  for (int d = 0; d < na; d++)
    if (a[d] != b[d]) return false;
  return true;
}

/* The map of one param: logical shape, and its runs over every rank (sorted, checked to
 * cover the parameter exactly once). */
static zck_status param_runs(zck_ds_ckpt *c, uint32_t p, const zck_pk *entry, tp_runs *R, int *nd, int64_t *full,
                             const char *mpath) {
  const zck_model *m = c->model;
  const char *name = m->params[p].name;
  uint32_t T = c->n_tp + 1;
  char where[700];
  snprintf(where, sizeof where, "%s: universal_checkpoint_info['affine_map'] of '%.400s'", mpath, name);
  if (!entry || entry->kind != ZCK_PK_DICT || !int_list(zck_pk_dict_get(entry, "logical_shape"), full, ZCK_MAX_DIMS, nd))
    return zck__fail(ZCK_ERR_FORMAT, "%s: no 'logical_shape' list", where);
  uint64_t numel = 1;
  for (int d = 0; d < *nd; d++)
    if (full[d] < 0 || !mul_ok(numel, (uint64_t)full[d], &numel) || numel > (UINT64_C(1) << 60))
      return zck__fail(ZCK_ERR_FORMAT, "%s: bad logical_shape", where);
  const zck_pk *ranks = zck_pk_dict_get(entry, "ranks");
  if (!ranks || ranks->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: no 'ranks' dict", where);
  size_t start = R->n;
  bool seen[4096] = {false};
  for (size_t i = 0; i < ranks->u.dict.len; i++) {
    int64_t r;
    const zck_pk *key = ranks->u.dict.keys[i], *v = ranks->u.dict.values[i];
    if (!zck_pk_as_int(key, &r) && !(zck_pk_as_str(key) && sscanf(zck_pk_as_str(key), "%lld", (long long *)&r) == 1))
      return zck__fail(ZCK_ERR_FORMAT, "%s: a 'ranks' key is not a rank", where);
    if (r < 0 || r >= (int64_t)T || r >= 4096 || seen[r])
      return zck__fail(ZCK_ERR_FORMAT, "%s: rank %lld is not one of tp_size %u, or listed twice", where, (long long)r, T);
    seen[r] = true;
    const zck_ds_ckpt *sub = r ? c->tp[r - 1] : c;
    const zck_param *sp = &sub->model->params[p];
    int64_t shard[ZCK_MAX_DIMS];
    int snd = 0;
    if (!v || v->kind != ZCK_PK_DICT || !int_list(zck_pk_dict_get(v, "shard_shape"), shard, ZCK_MAX_DIMS, &snd))
      return zck__fail(ZCK_ERR_FORMAT, "%s: rank %lld has no 'shard_shape'", where, (long long)r);
    if (!same_shape(snd, shard, sp->ndim, sp->shape)) {
      char a[128], b[128];
      return zck__fail(ZCK_ERR_MISMATCH, "%s: rank %lld's shard_shape %s but %s holds %s", where, (long long)r,
                       zck_shape_str(snd, shard, a, sizeof a), sub->fs.model.path ? sub->fs.model.path : sub->fs.dir,
                       zck_shape_str(sp->ndim, sp->shape, b, sizeof b));
    }
    char rw[760];
    snprintf(rw, sizeof rw, "%s, rank %lld", where, (long long)r);
    ZCK_TRY(rank_runs(R, zck_pk_dict_get(v, "pieces"), (uint32_t)r, T, numel, sp->numel, false, rw));
  }
  for (uint32_t r = 0; r < T; r++)
    if (!seen[r]) return zck__fail(ZCK_ERR_FORMAT, "%s: no entry for TP rank %u", where, r);
  qsort(R->v + start, R->n - start, sizeof *R->v, cmp_run);
  uint64_t at = 0;
  for (size_t i = start; i < R->n; i++) {
    if (R->v[i].full_off != at)
      return zck__fail(ZCK_ERR_FORMAT, "%s: the pieces %s element %llu of the full parameter", where,
                       R->v[i].full_off > at ? "leave out" : "hold twice", (unsigned long long)at);
    at += R->v[i].count;
  }
  if (at != numel)
    return zck__fail(ZCK_ERR_FORMAT, "%s: the pieces cover %llu of %llu elements", where, (unsigned long long)at,
                     (unsigned long long)numel);
  return ZCK_OK;
}

/* Every TP rank's checkpoint must be the same model sliced: same params in the same order,
 * same kinds, same dtypes, same stage, dp size and step. */
static zck_status check_sub(const zck_ds_ckpt *c, const zck_ds_ckpt *s) {
  const zck_model *a = c->model, *b = s->model;
  const char *p = s->fs.model.path ? s->fs.model.path : s->fs.dir;
  if (s->info.stage != c->info.stage || s->info.world_size != c->info.world_size ||
      s->info.bf16_optimizer != c->info.bf16_optimizer)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: ZeRO stage %d over %u dp ranks, but mp rank 0 has stage %d over %u", p,
                     s->info.stage, s->info.world_size, c->info.stage, c->info.world_size);
  if (s->info.global_steps != c->info.global_steps || s->info.skipped_steps != c->info.skipped_steps ||
      s->info.step != c->info.step)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: global_steps %lld (optimizer step %.17g) but mp rank 0 has %lld (%.17g): "
                     "rank files from different steps", p, (long long)s->info.global_steps, s->info.step,
                     (long long)c->info.global_steps, c->info.step);
  if (a->n_params != b->n_params || a->n_buffers != b->n_buffers)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: %zu params and %zu buffers but mp rank 0 has %zu and %zu", p, b->n_params,
                     b->n_buffers, a->n_params, a->n_buffers);
  for (size_t i = 0; i < a->n_params; i++) {
    const zck_param *x = &a->params[i], *y = &b->params[i];
    /* more TP ranks than kv heads: DeepSpeed gives the extra ranks empty attention shards,
     * which ZeRO keeps out of the optimizer and saves as frozen (a zero-element param) */
    bool empty_here = y->frozen && !x->frozen && y->numel == 0 && x->numel > 0 && y->group < 0;
    if (strcmp(x->name, y->name) || x->dtype != y->dtype || (x->frozen != y->frozen && !empty_here) ||
        x->tied_to != y->tied_to || (x->group != y->group && !empty_here))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: parameter %zu is '%s' (%s%s) but mp rank 0 has '%s' (%s%s)", p, i, y->name,
                       zck_dtype_name(y->dtype), y->frozen ? ", frozen" : "", x->name, zck_dtype_name(x->dtype),
                       x->frozen ? ", frozen" : "");
  }
  if (s->info.has_optimizer_state != c->info.has_optimizer_state || s->info.master_dtype != c->info.master_dtype)
    return zck__fail(ZCK_ERR_MISMATCH, "%s: optimizer state differs from mp rank 0's (present / dtype)", p);
  return ZCK_OK;
}

/* The layout of one part over the full shapes: each rank's pieces of the part, moved
 * through the runs. ls[t] is rank t's layout; rank t's stores are numbered from the sum of
 * the earlier ranks' store counts (concat_stores). */
static zck_status compose(size_t n_params, uint32_t T, const tp_runs *R, const uint64_t *full_numel,
                          const zck_layout *const *ls, zck_layout **out) {
  size_t n_stores = 0, base[T];
  for (uint32_t t = 0; t < T; t++) {
    base[t] = n_stores;
    n_stores += ls[t]->n_stores;
  }
  zck_layout_store *lst = zck__calloc(n_stores + 1, sizeof *lst);
  zck_piece *pcs = NULL;
  size_t n_pcs = 0, cap = 0;
  zck_status s = lst ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (uint32_t t = 0; s == ZCK_OK && t < T; t++)
    for (size_t i = 0; i < ls[t]->n_stores; i++) lst[base[t] + i] = ls[t]->stores[i];
  for (size_t p = 0; s == ZCK_OK && p < n_params; p++) {
    for (size_t k = R->first[p]; s == ZCK_OK && k < R->first[p + 1]; k++) {
      const tp_run *r = &R->v[k];
      const zck_layout *L = ls[r->rank];
      size_t lo = L->param_first[p], hi = L->param_first[p + 1];
      while (lo < hi) {  /* the first piece ending after shard_off (sorted by param_off, disjoint) */
        size_t mid = lo + (hi - lo) / 2;
        const zck_piece *q = &L->pieces[mid];
        if (q->param_off + q->count <= r->shard_off) lo = mid + 1;
        else hi = mid;
      }
      uint64_t end = r->shard_off + r->count;
      for (size_t j = lo; j < L->param_first[p + 1] && L->pieces[j].param_off < end; j++) {
        const zck_piece *q = &L->pieces[j];
        uint64_t a = q->param_off > r->shard_off ? q->param_off : r->shard_off;
        uint64_t b = q->param_off + q->count < end ? q->param_off + q->count : end;
        if (a >= b) continue;
        if (n_pcs == cap) {
          size_t nc = cap ? 2 * cap : 256;
          zck_piece *nv = zck__realloc(pcs, nc * sizeof *nv);
          if (!nv) { s = ZCK_ERR_NO_MEMORY; break; }
          pcs = nv;
          cap = nc;
        }
        pcs[n_pcs++] = (zck_piece){(uint32_t)p, (uint32_t)(base[r->rank] + q->store), r->full_off + (a - r->shard_off),
                                   q->store_off + (a - q->param_off), b - a, 0, 0};
      }
    }
  }
  if (s == ZCK_OK) s = zck_layout_custom(n_params, full_numel, lst, n_stores, pcs, n_pcs, out);
  free(lst);
  free(pcs);
  return s;
}

/* Every rank's stores of a part, in compose's numbering. */
static zck_store *concat_stores(const zck_ds_ckpt *c, const zck_layout *const *ls, int part) {
  uint32_t T = c->n_tp + 1;
  size_t n = 0;
  for (uint32_t t = 0; t < T; t++) n += ls[t]->n_stores;
  zck_store *st = zck__calloc(n + 1, sizeof *st);
  if (!st) return NULL;
  n = 0;
  for (uint32_t t = 0; t < T; t++) {
    const zck_ds_ckpt *sub = t ? c->tp[t - 1] : c;
    memcpy(st + n, sub->stores[part], ls[t]->n_stores * sizeof *st);
    n += ls[t]->n_stores;
  }
  return st;
}

/* Replaces c's layout *lp and the store arrays of parts [first, last] with their
 * composition over every TP rank. rank 0's old stores only point into c's records, names
 * and open files, which stay. */
/* The flat groups of the merged train layout: which params, in which order, from which
 * optimizer group (every TP rank has the same; jobs write universal files and steps in
 * that order). No ZeRO partition spans the TP ranks: numel / aligned are the full
 * params' sum, partition 0, no offsets. */
static zck_status copy_groups(const zck_layout *from, zck_layout *to, const uint64_t *full_numel) {
  if (!from->n_groups) return ZCK_OK;
  if (!(to->groups = zck__calloc(from->n_groups, sizeof *to->groups))) return ZCK_ERR_NO_MEMORY;
  to->n_groups = from->n_groups;
  for (size_t g = 0; g < from->n_groups; g++) {
    const zck_layout_group *a = &from->groups[g];
    zck_layout_group *b = &to->groups[g];
    if (!(b->params = zck__calloc(a->n_params + 1, sizeof *b->params))) return ZCK_ERR_NO_MEMORY;
    memcpy(b->params, a->params, a->n_params * sizeof *b->params);
    b->n_params = a->n_params;
    for (size_t i = 0; i < a->n_params; i++) b->numel += full_numel[a->params[i]];
    b->aligned = b->numel;
    b->opt_group = a->opt_group;
  }
  return ZCK_OK;
}

typedef enum { TP_TRAIN, TP_LP, TP_FROZEN } tp_part;

static zck_layout **layout_slot(zck_ds_ckpt *c, tp_part which) {
  return which == TP_TRAIN ? &c->train_layout : which == TP_LP ? &c->lp_layout : &c->frozen_layout;
}

static zck_status merge_part(zck_ds_ckpt *c, const tp_runs *R, const uint64_t *full_numel, tp_part which, int first,
                             int last) {
  uint32_t T = c->n_tp + 1;
  const zck_layout *ls[T];
  for (uint32_t t = 0; t < T; t++) {
    zck_ds_ckpt *sub = t ? c->tp[t - 1] : c;
    ls[t] = *layout_slot(sub, which);
    if (!ls[t])
      return zck__fail(ZCK_ERR_MISMATCH, "%s: mp rank %u lacks a part mp rank 0 has (frozen params or 16-bit weights)",
                       sub->fs.dir, t);
  }
  zck_layout *nl = NULL;
  zck_store *ns[ZCK_DS_PART_COUNT] = {NULL};
  zck_status s = compose(c->model->n_params, T, R, full_numel, ls, &nl);
  for (int p = first; s == ZCK_OK && p <= last; p++)
    if (c->stores[p] && !(ns[p] = concat_stores(c, ls, p))) s = ZCK_ERR_NO_MEMORY;
  if (s != ZCK_OK) {
    zck_layout_free(nl);
    for (int p = first; p <= last; p++) free(ns[p]);
    return s;
  }
  if (which == TP_TRAIN && (s = copy_groups(ls[0], nl, full_numel)) != ZCK_OK) {
    zck_layout_free(nl);
    for (int p = first; p <= last; p++) free(ns[p]);
    return s;
  }
  zck_layout **mine = layout_slot(c, which);
  zck_layout_free(*mine);
  *mine = nl;
  for (int p = first; p <= last; p++)
    if (ns[p]) {
      free(c->stores[p]);
      c->stores[p] = ns[p];
    }
  return ZCK_OK;
}

static zck_status build_runs(zck_ds_ckpt *c, const zck_pk *amp, const char *mpath, tp_runs *R, uint64_t *full_numel) {
  zck_model *m = c->model;
  zck__strmap names = {0};
  int64_t (*full)[ZCK_MAX_DIMS] = zck__calloc(m->n_params + 1, sizeof *full);
  int *full_nd = zck__calloc(m->n_params + 1, sizeof *full_nd);
  char **lits = zck__calloc(amp->u.dict.len + 1, sizeof *lits);
  R->first = zck__calloc(m->n_params + 1, sizeof *R->first);
  zck_status s = full && full_nd && lits && R->first ? zck__strmap_init(&names, amp->u.dict.len) : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < amp->u.dict.len; i++) {
    const char *pat = zck_pk_as_str(amp->u.dict.keys[i]);
    if (!pat) { s = zck__fail(ZCK_ERR_FORMAT, "%s: affine_map key %zu is not a string", mpath, i); break; }
    if (!(lits[i] = zck__calloc(strlen(pat) + 1, 1))) { s = ZCK_ERR_NO_MEMORY; break; }
    if (!zck_ds_pattern_name(pat, lits[i])) {
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: affine_map pattern '%.200s' is not one parameter's name", mpath, pat);
      break;
    }
    bool dup = false;
    size_t prev;
    s = zck__strmap_put(&names, lits[i], i, &dup, &prev);
  }
  for (size_t p = 0; s == ZCK_OK && p < m->n_params; p++) {
    R->first[p] = R->n;
    const zck_param *pp = &m->params[p];
    full_nd[p] = pp->ndim;
    memcpy(full[p], pp->shape, sizeof full[p]);
    if (pp->tied_to >= 0) continue;  /* an alias takes its source's shape below */
    size_t k;
    if (!zck__strmap_get(&names, pp->name, &k)) {
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: parameter '%s' has no universal_checkpoint_info['affine_map'] entry: its "
                    "tensor-parallel slicing is unknown", mpath, pp->name);
      break;
    }
    s = param_runs(c, (uint32_t)p, amp->u.dict.values[k], R, &full_nd[p], full[p], mpath);
  }
  if (s == ZCK_OK) R->first[m->n_params] = R->n;
  for (size_t p = 0; s == ZCK_OK && p < m->n_params; p++) {
    uint32_t src = zck_model_owner(m, (uint32_t)p);
    s = zck_model_set_shape(m, (uint32_t)p, full_nd[src], full[src]);
    full_numel[p] = m->params[p].numel;
  }
  free(full);
  free(full_nd);
  for (size_t i = 0; lits && i < amp->u.dict.len; i++) free(lits[i]);
  free(lits);
  zck__strmap_free(&names);
  return s;
}

bool zck_ds_autotp_vocab(const zck_ds_ckpt *c, uint32_t p) { return c->tp_vocab && p < c->model->n_params && c->tp_vocab[p]; }

/* vocabulary_parameter_patterns: ds_to_universal cuts such a param to original_vocab_size
 * rows after the merge; zckpt keeps the merged tensor, so it must have exactly those. */
static zck_status vocab_params(zck_ds_ckpt *c, const zck_pk *uci, const char *mpath) {
  const zck_pk *vp = zck_pk_dict_get(uci, "vocabulary_parameter_patterns");
  const zck_model *m = c->model;
  if (!vp || vp->kind == ZCK_PK_NONE) return ZCK_OK;
  if (vp->kind != ZCK_PK_LIST && vp->kind != ZCK_PK_TUPLE)
    return zck__fail(ZCK_ERR_FORMAT, "%s: vocabulary_parameter_patterns is not a list", mpath);
  if (!(c->tp_vocab = zck__calloc(m->n_params + 1, sizeof *c->tp_vocab))) return ZCK_ERR_NO_MEMORY;
  int64_t orig = -1;
  const zck_pk *ov = zck_pk_dict_get(uci, "original_vocab_size");
  if (ov && !zck_pk_as_int(ov, &orig)) return zck__fail(ZCK_ERR_FORMAT, "%s: original_vocab_size is not an int", mpath);
  for (size_t i = 0; i < vp->u.seq.len; i++) {
    const char *pat = zck_pk_as_str(vp->u.seq.items[i]);
    char *lit = pat ? zck__calloc(strlen(pat) + 1, 1) : NULL;
    if (pat && !lit) return ZCK_ERR_NO_MEMORY;
    int64_t p = lit && zck_ds_pattern_name(pat, lit) ? zck_model_find_param(m, lit) : -2;
    free(lit);
    if (p == -2)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: vocabulary_parameter_patterns[%zu] is not one parameter's name", mpath, i);
    if (p < 0) continue;
    c->tp_vocab[p] = true;
    const zck_param *pp = &m->params[p];
    if (orig >= 0 && (pp->ndim < 1 || pp->shape[0] != orig))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: '%s' has %lld rows but original_vocab_size is %lld: a padded vocabulary "
                       "is not supported", mpath, pp->name, pp->ndim ? (long long)pp->shape[0] : 0LL, (long long)orig);
  }
  return ZCK_OK;
}

zck_status zck__ds_autotp(zck_ds_ckpt *c, const char *path, const zck_ds_open_opts *o) {
  uint32_t T = c->fs.n_mp;
  const char *mpath = c->models[0].file->path;
  if (c->info.bf16_optimizer)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: AutoTP with BF16_Optimizer files: not supported", mpath);
  /* universal_checkpoint_info['affine_map']['params']: DeepSpeed's record of the slicing */
  const zck_pk *root = c->model0 ? zck_torch_root(c->model0) : NULL;
  const zck_pk *uci = root ? zck_pk_dict_get(root, "universal_checkpoint_info") : NULL;
  const zck_pk *am = uci ? zck_pk_dict_get(uci, "affine_map") : NULL;
  const zck_pk *amp = am ? zck_pk_dict_get(am, "params") : NULL;
  int64_t ver = 0;
  if (!amp || amp->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %u tensor-parallel ranks but no universal_checkpoint_info['affine_map'] "
                     "(saved by DeepSpeed older than 0.19, or not by AutoTP): cannot place the slices", mpath, T);
  if (!zck_pk_as_int(zck_pk_dict_get(am, "version"), &ver) || ver != 1)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: affine_map version %lld (zckpt reads version 1)", mpath, (long long)ver);
  if (T > 4096) return zck__fail(ZCK_ERR_LIMIT, "%s: %u tensor-parallel ranks", c->fs.dir, T);

  if (!(c->tp = zck__calloc(T, sizeof *c->tp))) return ZCK_ERR_NO_MEMORY;
  for (uint32_t t = 1; t < T; t++) {
    ZCK_TRY(zck__ds_open_mp(path, o, t, &c->models[0], &c->tp[t - 1]));
    c->n_tp = t;
    ZCK_TRY(check_sub(c, c->tp[t - 1]));
  }
  tp_runs R = {0};
  zck_model *m = c->model;
  uint64_t *full_numel = zck__calloc(m->n_params + 1, sizeof *full_numel);
  zck_status s = full_numel ? build_runs(c, amp, mpath, &R, full_numel) : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK)
    s = merge_part(c, &R, full_numel, TP_TRAIN, ZCK_DS_FP32, ZCK_DS_EXP_AVG_SQ);
  if (s == ZCK_OK && c->lp_layout) s = merge_part(c, &R, full_numel, TP_LP, ZCK_DS_LP, ZCK_DS_LP);
  if (s == ZCK_OK && c->frozen_layout)
    s = merge_part(c, &R, full_numel, TP_FROZEN, ZCK_DS_FROZEN, ZCK_DS_FROZEN);
  /* zero_to_fp32's outputs point at the params' shapes; their numel is a copy */
  for (size_t i = 0; s == ZCK_OK && i < c->n_outputs; i++) {
    zck_ds_output *out = &c->outputs[i];
    if (out->kind == ZCK_DS_OUT_BUFFER) continue;
    uint32_t p = out->kind == ZCK_DS_OUT_ALIAS ? c->outputs[out->alias_of].index : out->index;
    if (p >= m->n_params) continue;
    out->ndim = m->params[p].ndim;
    out->shape = m->params[p].shape;
    out->numel = m->params[p].numel;
  }
  if (s == ZCK_OK) s = vocab_params(c, uci, mpath);
  c->info.tp_size = T;
  free(full_numel);
  free(R.v);
  free(R.first);
  return s;
}

// ---- AutoTP as a target: TP rank t's files of a reshard at the source's TP size

/* The entry of TP rank t in the affine map's entry of param p (NULL if absent). */
static const zck_pk *rank_entry(const zck_pk *amp, const zck__strmap *names, const char *name, uint32_t t) {
  size_t k;
  if (!zck__strmap_get(names, name, &k)) return NULL;
  const zck_pk *ranks = zck_pk_dict_get(amp->u.dict.values[k], "ranks");
  for (size_t i = 0; ranks && ranks->kind == ZCK_PK_DICT && i < ranks->u.dict.len; i++) {
    int64_t r;
    if (zck_pk_as_int(ranks->u.dict.keys[i], &r) && r == (int64_t)t) return ranks->u.dict.values[i];
  }
  return NULL;
}

/* uci's affine_map['params'] and an index of its entries by literal param name (lits own
 * the keys). */
static zck_status amp_index(const zck_pk *uci, const zck_pk **amp, zck__strmap *names, char ***lits) {
  *amp = zck_pk_dict_get(zck_pk_dict_get(uci, "affine_map"), "params");
  *lits = NULL;
  if (!*amp || (*amp)->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "no universal_checkpoint_info['affine_map']: not an AutoTP checkpoint");
  size_t n = (*amp)->u.dict.len;
  if (!(*lits = zck__calloc(n + 1, sizeof **lits))) return ZCK_ERR_NO_MEMORY;
  ZCK_TRY(zck__strmap_init(names, n));
  for (size_t i = 0; i < n; i++) {
    const char *pat = zck_pk_as_str((*amp)->u.dict.keys[i]);
    if (!pat) return zck__fail(ZCK_ERR_FORMAT, "affine_map key %zu is not a string", i);
    if (!((*lits)[i] = zck__calloc(strlen(pat) + 1, 1))) return ZCK_ERR_NO_MEMORY;
    if (!zck_ds_pattern_name(pat, (*lits)[i]))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "affine_map pattern '%.200s' is not one parameter's name", pat);
    bool dup = false;
    size_t prev;
    ZCK_TRY(zck__strmap_put(names, (*lits)[i], i, &dup, &prev));
  }
  return ZCK_OK;
}

static void amp_index_free(const zck_pk *amp, zck__strmap *names, char **lits) {
  for (size_t i = 0; lits && amp && i < amp->u.dict.len; i++) free(lits[i]);
  free(lits);
  zck__strmap_free(names);
}

zck_status zck_ds_autotp_shard_model(const zck_pk *uci, const zck_model *full, uint32_t t, zck_model **out) {
  *out = NULL;
  const zck_pk *amp = NULL;
  zck__strmap names = {0};
  char **lits = NULL;
  zck_model *m = NULL;
  zck_status s = amp_index(uci, &amp, &names, &lits);
  if (s == ZCK_OK && !(m = zck_model_clone(full))) s = ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; s == ZCK_OK && p < m->n_params; p++) {
    if (m->params[p].tied_to >= 0) continue;
    int64_t shard[ZCK_MAX_DIMS];
    int nd = 0;
    const zck_pk *e = rank_entry(amp, &names, m->params[p].name, t);
    if (!e || !int_list(zck_pk_dict_get(e, "shard_shape"), shard, ZCK_MAX_DIMS, &nd))
      s = zck__fail(ZCK_ERR_FORMAT, "affine_map of '%s' has no TP rank %u shard_shape", m->params[p].name, t);
    else s = zck_model_set_shape(m, (uint32_t)p, nd, shard);
  }
  for (size_t p = 0; s == ZCK_OK && p < m->n_params; p++)
    if (m->params[p].tied_to >= 0) {
      const zck_param *src = &m->params[m->params[p].tied_to];
      s = zck_model_set_shape(m, (uint32_t)p, src->ndim, src->shape);
    }
  /* a trained param with no elements on rank t (more TP ranks than kv heads: an empty
   * attention shard) is what DeepSpeed's ZeRO keeps out of the optimizer and saves as
   * frozen on that rank */
  for (size_t p = 0; s == ZCK_OK && p < m->n_params; p++)
    if (m->params[p].tied_to < 0 && !m->params[p].frozen && !m->params[p].numel && full->params[p].numel)
      zck_model_set_frozen(m, (uint32_t)p, true);
  amp_index_free(amp, &names, lits);
  if (s != ZCK_OK) {
    zck_model_free(m);
    return s;
  }
  *out = m;
  return ZCK_OK;
}

zck_status zck_ds_autotp_target(const zck_pk *uci, const zck_model *full, uint32_t T, uint32_t t, const zck_layout *shard,
                             zck_layout **out) {
  *out = NULL;
  if (T <= 1 || t >= T || shard->n_params != full->n_params)
    return zck__fail(ZCK_ERR_INVALID_ARG, "TP rank %u of %u, or a layout of another model", t, T);
  const zck_pk *amp = NULL;
  zck__strmap names = {0};
  char **lits = NULL;
  tp_runs R = {0};
  uint64_t *full_numel = zck__calloc(full->n_params + 1, sizeof *full_numel);
  R.first = zck__calloc(full->n_params + 1, sizeof *R.first);
  zck_status s = full_numel && R.first ? amp_index(uci, &amp, &names, &lits) : ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; s == ZCK_OK && p < full->n_params; p++) {
    R.first[p] = R.n;
    full_numel[p] = full->params[p].numel;
    if (full->params[p].tied_to >= 0) continue;
    char where[700];
    snprintf(where, sizeof where, "universal_checkpoint_info['affine_map'] of '%.400s', rank %u", full->params[p].name, t);
    const zck_pk *e = rank_entry(amp, &names, full->params[p].name, t);
    if (!e) { s = zck__fail(ZCK_ERR_FORMAT, "%s: missing", where); break; }
    size_t start = R.n;
    s = rank_runs(&R, zck_pk_dict_get(e, "pieces"), t, T, full_numel[p], shard->param_numel[p], true, where);
    if (s == ZCK_OK) qsort(R.v + start, R.n - start, sizeof *R.v, cmp_run);
  }
  if (s == ZCK_OK) {
    R.first[full->n_params] = R.n;
    for (size_t i = 0; i < R.n; i++) R.v[i].rank = 0;  /* one target: its layout is ls[0] */
    const zck_layout *ls[1] = {shard};
    s = compose(full->n_params, 1, &R, full_numel, ls, out);
  }
  amp_index_free(amp, &names, lits);
  free(full_numel);
  free(R.v);
  free(R.first);
  return s;
}

zck_status zck_ds_autotp_merge(const zck_pk *uci, const zck_model *full, uint32_t T, const uint32_t *params, size_t n,
                               const zck_layout *const *ls, zck_layout **out) {
  *out = NULL;
  if (T < 2) return zck__fail(ZCK_ERR_INVALID_ARG, "a merge of %u TP ranks", T);
  const zck_pk *amp = NULL;
  zck__strmap names = {0};
  char **lits = NULL;
  tp_runs R = {0};
  uint64_t *full_numel = zck__calloc(full->n_params + 1, sizeof *full_numel);
  uint8_t *want = zck__calloc(full->n_params + 1, 1);
  R.first = zck__calloc(full->n_params + 1, sizeof *R.first);
  zck_status s = full_numel && want && R.first ? amp_index(uci, &amp, &names, &lits) : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < n; i++)
    if (params[i] < full->n_params) want[params[i]] = 1;
  for (size_t p = 0; s == ZCK_OK && p < full->n_params; p++) {
    R.first[p] = R.n;
    full_numel[p] = full->params[p].numel;
    if (!want[p] || full->params[p].tied_to >= 0) continue;
    size_t start = R.n;
    for (uint32_t t = 0; s == ZCK_OK && t < T; t++) {
      char where[700];
      snprintf(where, sizeof where, "universal_checkpoint_info['affine_map'] of '%.400s', rank %u", full->params[p].name,
               t);
      const zck_pk *e = rank_entry(amp, &names, full->params[p].name, t);
      if (!e) s = zck__fail(ZCK_ERR_FORMAT, "%s: missing", where);
      else s = rank_runs(&R, zck_pk_dict_get(e, "pieces"), t, T, full_numel[p], ls[t]->param_numel[p], false, where);
    }
    if (s != ZCK_OK) break;
    qsort(R.v + start, R.n - start, sizeof *R.v, cmp_run);
    uint64_t at = 0;  /* every element of the full param exactly once */
    for (size_t i = start; s == ZCK_OK && i < R.n; i++) {
      if (R.v[i].full_off != at)
        s = zck__fail(ZCK_ERR_FORMAT, "universal_checkpoint_info['affine_map'] of '%s': the pieces %s element %llu",
                      full->params[p].name, R.v[i].full_off > at ? "leave out" : "hold twice", (unsigned long long)at);
      at += R.v[i].count;
    }
    if (s == ZCK_OK && at != full_numel[p])
      s = zck__fail(ZCK_ERR_FORMAT, "universal_checkpoint_info['affine_map'] of '%s': the pieces cover %llu of %llu "
                    "elements", full->params[p].name, (unsigned long long)at, (unsigned long long)full_numel[p]);
  }
  if (s == ZCK_OK) {
    R.first[full->n_params] = R.n;
    s = compose(full->n_params, T, &R, full_numel, ls, out);
  }
  amp_index_free(amp, &names, lits);
  free(full_numel);
  free(want);
  free(R.v);
  free(R.first);
  return s;
}

const zck_pk *zck_ds_autotp_info(const zck_ds_ckpt *c) {
  if (c->info.tp_size <= 1 || !c->model0) return NULL;
  return zck_pk_dict_get(zck_torch_root(c->model0), "universal_checkpoint_info");
}
