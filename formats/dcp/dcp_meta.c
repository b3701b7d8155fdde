/* dcp_meta.c: the .metadata pickle of a DCP folder, read as torch's unpickler would see it
 * (only the classes dcp_format.h lists), into entries, chunks, items and file names, with
 * the chunk geometry checked: every chunk a block inside its tensor, the chunks covering
 * the tensor exactly once, one item per chunk. The per-chunk objects are read as the
 * pickle streams (dcp_meta_objects.c); what is left of the tree here is one node per
 * entry and per item. */
#include "dcp_meta_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Grows *p to exactly need elements (the counts are known before the entries are read:
 * no doubling slack in the tables that outlive the parse). */
static bool reserve_exact(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return true;
  void *q = zck__realloc(*p, need * elem);
  if (!q) return false;
  memset((char *)q + *cap * elem, 0, (need - *cap) * elem);
  *p = q;
  *cap = need;
  return true;
}

/* Gives back a table's slack once it is full (it grew by doubling as the stream came). */
static void shrink_exact(void **p, size_t *cap, size_t n, size_t elem) {
  if (!n || n == *cap) return;
  void *q = realloc(*p, n * elem);
  if (!q) return;
  *p = q;
  *cap = n;
}

// ---- the chunk table

static uint64_t chunk_hash(size_t tensor, const int64_t *off, int nd) {
  uint64_t h = (uint64_t)tensor * 0x9E3779B97F4A7C15ull;
  for (int d = 0; d < nd; d++) {
    h = (h ^ (uint64_t)off[d]) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
  }
  return h ^ (h >> 32);
}

/* The slot of (tensor, off) in t: its chunk, or the empty slot where it would go. */
static chunk_slot *table_probe(const zck_dcp *c, const chunk_table *t, size_t tensor, const int64_t *off, int nd) {
  size_t mask = t->cap - 1;
  for (size_t i = (size_t)chunk_hash(tensor, off, nd) & mask;; i = (i + 1) & mask) {
    chunk_slot *s = &t->slot[i];
    if (s->chunk == SIZE_MAX) return s;
    if (s->tensor == tensor && !memcmp(c->chunks[s->chunk].offsets, off, (size_t)nd * sizeof *off)) return s;
  }
}

/* Room for n chunks in all (rehashing what is there). */
static bool table_reserve(const zck_dcp *c, chunk_table *t, size_t n) {
  if (t->cap && t->cap >= 2 * n) return true;
  size_t cap = 64;
  while (cap < 2 * n) cap *= 2;
  chunk_table nt = {zck__malloc(cap * sizeof *nt.slot), cap, t->n};
  if (!nt.slot) return false;
  for (size_t i = 0; i < cap; i++) nt.slot[i].chunk = SIZE_MAX;
  for (size_t i = 0; i < t->cap; i++)
    if (t->slot[i].chunk != SIZE_MAX) {
      const zck__dcp_chunk *ch = &c->chunks[t->slot[i].chunk];
      *table_probe(c, &nt, t->slot[i].tensor, ch->offsets, ZCK_MAX_DIMS) = t->slot[i];
    }
  free(t->slot);
  *t = nt;
  return true;
}

bool zck__dcp_table_add(const zck_dcp *c, chunk_table *t, size_t tensor, size_t ci, bool *dup) {
  if (!table_reserve(c, t, t->n + 1)) return false;
  chunk_slot *s = table_probe(c, t, tensor, c->chunks[ci].offsets, ZCK_MAX_DIMS);
  *dup = s->chunk != SIZE_MAX;
  if (!*dup) {
    *s = (chunk_slot){ci, tensor};
    t->n++;
  }
  return true;
}

// ---- entries

/* The path planner_data keeps for key, as strings into parts[] (ints in decimal in bufs). */
static size_t planner_path(const zck_pk_dict_index *pd, const char *key, const char **parts, char (*bufs)[24], size_t cap) {
  const zck_pk *p = pd ? zck_pk_dict_index_get(pd, key) : NULL;
  if (!p || (p->kind != ZCK_PK_TUPLE && p->kind != ZCK_PK_LIST) || !p->u.seq.len || p->u.seq.len > cap) return 0;
  for (size_t i = 0; i < p->u.seq.len; i++) {
    const zck_pk *c = p->u.seq.items[i];
    if (c->kind == ZCK_PK_STR) parts[i] = c->u.str.data;
    else if (c->kind == ZCK_PK_INT) {
      snprintf(bufs[i], sizeof bufs[i], "%lld", (long long)c->u.i);
      parts[i] = bufs[i];
    } else
      return 0;
  }
  return p->u.seq.len;
}

static zck_status add_entry(mctx *x, const char *key, const zck_pk *md, const zck_pk_dict_index *pd) {
  zck_dcp *c = x->c;
  if (!ZCK__GROW(c->entries, c->cap_entries, c->n_entries + 1)) return ZCK_ERR_NO_MEMORY;
  size_t ei = c->n_entries;
  zck__dcp_entry *e = &c->entries[ei];
  e->item = SIZE_MAX;
  e->key = zck__strdup(key);
  if (!e->key) return ZCK_ERR_NO_MEMORY;
  c->n_entries++;
  bool dup;
  size_t prev;
  ZCK_TRY(zck__strmap_put(&x->entry_index, e->key, ei, &dup, &prev));
  if (dup) return MFAIL(ZCK_ERR_FORMAT, "key %s is listed twice", key);

  const char *parts[8];
  char bufs[8][24];
  size_t np = planner_path(pd, key, parts, bufs, 8);
  zck_dcp_key k = np ? zck_dcp_key_from_path(parts, np) : zck_dcp_key_parse(key);
  if (k.fqn && !(e->fqn = zck__strndup(k.fqn, k.fqn_len))) return ZCK_ERR_NO_MEMORY;
  if (k.setting && !(e->setting = zck__strdup(k.setting))) return ZCK_ERR_NO_MEMORY;
  e->k = k;
  e->k.fqn = e->fqn;
  e->k.setting = e->setting;

  if (md && md->kind == ZCK_PK_OBJECT &&
      zck_pk_is_global(md->u.obj.callable, zck_dcp_class_module(ZCK_DCP_CLS_BYTES_STORAGE),
                       zck_dcp_class_name(ZCK_DCP_CLS_BYTES_STORAGE))) {
    const zck_pk *st;
    ZCK_TRY(zck__dcp_dataclass_state(x, md, ZCK_DCP_CLS_BYTES_STORAGE, key, &st));
    e->is_bytes = true;
    if (k.kind == ZCK_DCP_KEY_MODEL && np == 1) {   /* a top-level setting, not a weight */
      e->k.kind = ZCK_DCP_KEY_OTHER;
      free(e->fqn);
      e->fqn = NULL;
      e->k.fqn = NULL;
    } else if (k.kind == ZCK_DCP_KEY_MODEL)
      return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: a model entry that is bytes, not a tensor", key);
    return ZCK_OK;
  }
  /* a tensor: read (and checked) as it streamed */
  if (!zck__dcp_consumed(md, ZCK_DCP_CLS_TENSOR_STORAGE)) {
    const zck_pk *st;
    ZCK_TRY(zck__dcp_dataclass_state(x, md, ZCK_DCP_CLS_TENSOR_STORAGE, key, &st));
    return MFAIL(ZCK_ERR_FORMAT, "%s: a TensorStorageMetadata not built as torch pickles it", key);
  }
  dcp_tensor_rec *r = &x->tensors[md->u.obj.sink_handle];
  if (r->used) return MFAIL(ZCK_ERR_FORMAT, "%s: the TensorStorageMetadata of another key", key);
  r->used = true;
  e->dtype = r->dtype;
  e->ndim = r->ndim;
  memcpy(e->shape, r->shape, sizeof e->shape);
  e->numel = r->numel;
  e->first_chunk = r->first_chunk;
  e->n_chunks = r->n_chunks;
  return ZCK_OK;
}

// ---- chunk geometry

void zck__dcp_runs_init(zck__dcp_runs *r, int ndim, const int64_t *shape, const zck__dcp_chunk *ch) {
  memset(r, 0, sizeof *r);
  r->ch = ch;
  uint64_t stride = 1;
  for (int d = ndim - 1; d >= 0; d--) {
    r->stride[d] = stride;
    stride *= (uint64_t)shape[d];
  }
  r->flat = ch->flat_off;
  r->left = ch->n_runs;
}

bool zck__dcp_runs_next(zck__dcp_runs *r, uint64_t *flat) {
  if (!r->left) return false;
  *flat = r->flat;
  if (--r->left)
    for (int d = r->ch->cut_dim - 1; d >= 0; d--) {
      r->flat += r->stride[d];
      if (++r->idx[d] < r->ch->sizes[d]) break;
      r->flat -= (uint64_t)r->ch->sizes[d] * r->stride[d];
      r->idx[d] = 0;
    }
  return true;
}

static int cmp_flat(const void *a, const void *b, void *ctx) {
  const zck__dcp_chunk *ch = ctx;
  uint64_t x = ch[*(const size_t *)a].flat_off, y = ch[*(const size_t *)b].flat_off;
  return x < y ? -1 : x > y;
}

static int cmp_first_dim(const void *a, const void *b, void *ctx) {
  const zck__dcp_chunk *ch = ctx;
  const zck__dcp_chunk *x = &ch[*(const size_t *)a], *y = &ch[*(const size_t *)b];
  for (int d = 0; d < ZCK_MAX_DIMS; d++)
    if (x->offsets[d] != y->offsets[d]) return x->offsets[d] < y->offsets[d] ? -1 : 1;
  return 0;
}

/* Chunks that are one run each: sorted by flat offset they must follow each other. */
static zck_status check_ranges(mctx *x, const zck__dcp_entry *e, size_t *order, size_t n) {
  zck_dcp *c = x->c;
  qsort_r(order, n, sizeof *order, cmp_flat, c->chunks);
  uint64_t at = 0;
  for (size_t i = 0; i < n; i++) {
    const zck__dcp_chunk *ch = &c->chunks[order[i]];
    if (ch->flat_off < at)
      return MFAIL(ZCK_ERR_FORMAT, "%s: chunks overlap at element %llu", e->key, (unsigned long long)ch->flat_off);
    if (ch->flat_off > at)
      return MFAIL(ZCK_ERR_FORMAT, "%s: elements %llu..%llu are in no chunk", e->key, (unsigned long long)at,
                   (unsigned long long)ch->flat_off);
    at = ch->flat_off + ch->numel;
  }
  if (at != e->numel)
    return MFAIL(ZCK_ERR_FORMAT, "%s: elements %llu..%llu are in no chunk", e->key, (unsigned long long)at,
                 (unsigned long long)e->numel);
  return ZCK_OK;
}

/* Blocks (some cut an inner dimension): inside the shape (checked before), pairwise
 * disjoint and together as many elements as the tensor, hence covering it exactly once.
 * Sorted by their first offsets, a block is compared only with the blocks after it that
 * start inside its span of dimension 0: a dp x tp grid costs tp comparisons a block. A
 * hostile list that puts many blocks across one span meets a budget, not a hang. */
#define MAX_BLOCK_COMPARISONS ((uint64_t)1 << 27)
static zck_status check_blocks(mctx *x, const zck__dcp_entry *e, size_t *order, size_t n, uint64_t total) {
  zck_dcp *c = x->c;
  qsort_r(order, n, sizeof *order, cmp_first_dim, c->chunks);
  uint64_t work = 0;
  for (size_t i = 0; i < n; i++) {
    const zck__dcp_chunk *a = &c->chunks[order[i]];
    for (size_t k = i + 1; k < n; k++) {
      const zck__dcp_chunk *b = &c->chunks[order[k]];
      if (b->offsets[0] >= a->offsets[0] + a->sizes[0]) break;
      if (++work > MAX_BLOCK_COMPARISONS)
        return MFAIL(ZCK_ERR_LIMIT, "%s: too many chunks across one span of dimension 0 to check", e->key);
      bool meet = true;
      for (int d = 1; d < e->ndim && meet; d++)
        meet = a->offsets[d] < b->offsets[d] + b->sizes[d] && b->offsets[d] < a->offsets[d] + a->sizes[d];
      if (meet)
        return MFAIL(ZCK_ERR_FORMAT, "%s: chunks %zu and %zu overlap", e->key, order[i] - e->first_chunk,
                     order[k] - e->first_chunk);
    }
  }
  if (total != e->numel)
    return MFAIL(ZCK_ERR_FORMAT, "%s: chunks hold %llu elements for %llu: some are in no chunk", e->key,
                 (unsigned long long)total, (unsigned long long)e->numel);
  return ZCK_OK;
}

static zck_status check_geometry(mctx *x, const zck__dcp_entry *e) {
  zck_dcp *c = x->c;
  uint64_t total = 0;
  size_t *order = zck__malloc((e->n_chunks ? e->n_chunks : 1) * sizeof *order);
  if (!order) return ZCK_ERR_NO_MEMORY;
  size_t n = 0;
  bool blocks = false;
  zck_status st = ZCK_OK;
  for (size_t i = 0; i < e->n_chunks && st == ZCK_OK; i++) {
    zck__dcp_chunk *ch = &c->chunks[e->first_chunk + i];
    uint64_t numel = 1, flat = 0, stride = 1;
    for (int d = e->ndim - 1; d >= 0; d--) {
      uint64_t end;
      if (!zck__add_u64((uint64_t)ch->offsets[d], (uint64_t)ch->sizes[d], &end) || end > (uint64_t)e->shape[d]) {
        st = MFAIL(ZCK_ERR_FORMAT, "%s chunk %zu: dimension %d spans %lld..%lld, outside the tensor's %lld", e->key, i, d,
                   (long long)ch->offsets[d], (long long)end, (long long)e->shape[d]);
        break;
      }
      numel *= (uint64_t)ch->sizes[d];   /* bounded by the tensor's numel */
      flat += (uint64_t)ch->offsets[d] * stride;
      stride *= (uint64_t)e->shape[d];
    }
    if (st) break;
    /* runs: the innermost cut dimension j, with the dimensions after it whole, makes each
     * index of the dimensions before it one contiguous run */
    int j = e->ndim - 1;
    while (j > 0 && ch->sizes[j] == e->shape[j]) j--;
    uint64_t runs = 1;
    for (int d = 0; d < j; d++) runs *= (uint64_t)ch->sizes[d];
    ch->flat_off = flat;
    ch->numel = numel;
    ch->cut_dim = j < 0 ? 0 : j;
    ch->n_runs = numel ? runs : 0;
    ch->run_len = numel ? numel / runs : 0;
    blocks |= ch->n_runs > 1;
    total += numel;
    if (numel) order[n++] = e->first_chunk + i;
  }
  if (st == ZCK_OK) st = blocks ? check_blocks(x, e, order, n, total) : check_ranges(x, e, order, n);
  if (st == ZCK_OK && total != e->numel)
    st = MFAIL(ZCK_ERR_FORMAT, "%s: chunks hold %llu elements for %llu", e->key, (unsigned long long)total,
               (unsigned long long)e->numel);
  free(order);
  return st;
}

zck_status zck__dcp_check_chunks(zck_dcp *c, const char *path, size_t i) {
  mctx x = {.c = c, .dir = c->dir, .path = path};
  return check_geometry(&x, &c->entries[i]);
}

// ---- storage items

/* A storage_data pair: the MetadataIndex and _StorageInfo read as they streamed, the item
 * bound to its entry and chunk. */
static zck_status add_item(mctx *x, const zck_pk *kn, const zck_pk *vn) {
  zck_dcp *c = x->c;
  if (!zck__dcp_consumed(kn, ZCK_DCP_CLS_METADATA_INDEX)) {
    const zck_pk *ks;
    ZCK_TRY(zck__dcp_dataclass_state(x, kn, ZCK_DCP_CLS_METADATA_INDEX, "storage_data key", &ks));
    return MFAIL(ZCK_ERR_FORMAT, "storage_data key: a MetadataIndex not built as torch pickles it");
  }
  dcp_index_rec *r = &x->indexes[kn->u.obj.sink_handle];
  const char *fqn = x->fqns[r->fqn];
  if (r->used) return MFAIL(ZCK_ERR_FORMAT, "%s: one MetadataIndex is two keys of storage_data", fqn);
  r->used = true;
  if (!zck__dcp_consumed(vn, ZCK_DCP_CLS_STORAGE_INFO)) {
    const zck_pk *vs;
    ZCK_TRY(zck__dcp_dataclass_state(x, vn, ZCK_DCP_CLS_STORAGE_INFO, fqn, &vs));
    return MFAIL(ZCK_ERR_FORMAT, "%s: a _StorageInfo not built as torch pickles it", fqn);
  }
  size_t ii = x->item_base + vn->u.obj.sink_handle;
  zck__dcp_item *it = &c->items[ii];
  if (it->entry != SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "%s: one _StorageInfo for two items", fqn);
  size_t ei;
  if (!zck__strmap_get(&x->entry_index, fqn, &ei)) return MFAIL(ZCK_ERR_FORMAT, "storage_data names %s, which no entry lists", fqn);
  zck__dcp_entry *e = &c->entries[ei];
  it->entry = ei;

  if (e->is_bytes) {
    if (r->ndim != INDEX_NO_OFFSET) return MFAIL(ZCK_ERR_FORMAT, "%s: a bytes item with chunk offsets", fqn);
    if (e->item != SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "%s: two items for one bytes entry", fqn);
    e->item = ii;
    return ZCK_OK;
  }
  if (r->ndim < 0) return MFAIL(ZCK_ERR_FORMAT, "%s: expected a torch.Size", fqn);
  int64_t o[ZCK_MAX_DIMS] = {0};   /* past ndim: zeros, as in the chunks */
  memcpy(o, x->offsets + r->offsets, (size_t)r->ndim * sizeof *o);
  const chunk_slot *hit = r->ndim == e->ndim && e->n_chunks && x->chunk_index.cap
                              ? table_probe(c, &x->chunk_index, e->first_chunk, o, ZCK_MAX_DIMS)
                              : NULL;
  if (!hit || hit->chunk == SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "%s: an item at offsets that start no chunk", fqn);
  size_t ci = hit->chunk;
  if (c->chunks[ci].item != SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "%s: two items for one chunk", fqn);
  c->chunks[ci].item = ii;
  it->chunk = ci;
  return ZCK_OK;
}

// ---- the whole

static zck_status parse_root(mctx *x, const zck_pk *root) {
  zck_dcp *c = x->c;
  const zck_pk *st;
  ZCK_TRY(zck__dcp_dataclass_state(x, root, ZCK_DCP_CLS_METADATA, "the root", &st));
  const zck_pk *sdm = zck_pk_dict_get(st, "state_dict_metadata");
  const zck_pk *sd = zck_pk_dict_get(st, "storage_data");
  const zck_pk *pd = zck_pk_dict_get(st, "planner_data");
  if (!sdm || sdm->kind != ZCK_PK_DICT) return MFAIL(ZCK_ERR_FORMAT, "state_dict_metadata is not a dict");
  if (!sd || sd->kind != ZCK_PK_DICT)
    return MFAIL(ZCK_ERR_UNSUPPORTED, "storage_data is not a dict: not a checkpoint of the file-system storage");
  const char *v = zck_pk_as_str(zck_pk_dict_get(st, "version"));
  if (v && !c->version && !(c->version = zck__strdup(v))) return ZCK_ERR_NO_MEMORY;
  const zck_pk *sm = zck_pk_dict_get(st, "storage_meta");
  if (sm && sm->kind != ZCK_PK_NONE) {
    const zck_pk *ss;
    ZCK_TRY(zck__dcp_dataclass_state(x, sm, ZCK_DCP_CLS_STORAGE_META, "storage_meta", &ss));
    const char *sid = zck_pk_as_str(zck_pk_dict_get(ss, "save_id"));
    if (sid && !c->save_id && !(c->save_id = zck__strdup(sid))) return ZCK_ERR_NO_MEMORY;
  }
  if (!reserve_exact((void **)&c->entries, &c->cap_entries, c->n_entries + sdm->u.dict.len, sizeof *c->entries))
    return ZCK_ERR_NO_MEMORY;
  zck_pk_dict_index pdi;
  ZCK_TRY(zck_pk_dict_index_init(&pdi, pd && pd->kind == ZCK_PK_DICT ? pd : NULL));
  zck_status s = ZCK_OK;
  for (size_t i = 0; i < sdm->u.dict.len && s == ZCK_OK; i++) {
    const char *key = zck_pk_as_str(sdm->u.dict.keys[i]);
    if (!key) s = MFAIL(ZCK_ERR_FORMAT, "state_dict_metadata: key %zu is not a string", i);
    else s = add_entry(x, key, sdm->u.dict.values[i], pd && pd->kind == ZCK_PK_DICT ? &pdi : NULL);
  }
  zck_pk_dict_index_free(&pdi);
  ZCK_TRY(s);
  /* every object read as it streamed is where torch reads it: chunks of no entry, or items
   * of no storage_data key, would be bytes nothing accounts for */
  for (size_t i = 0; i < x->n_tensors; i++)
    if (!x->tensors[i].used) return MFAIL(ZCK_ERR_FORMAT, "a TensorStorageMetadata that is no entry of state_dict_metadata");
  for (size_t i = x->entry_base; i < c->n_entries; i++)
    if (!c->entries[i].is_bytes) ZCK_TRY(check_geometry(x, &c->entries[i]));
  for (size_t i = 0; i < sd->u.dict.len; i++) ZCK_TRY(add_item(x, sd->u.dict.keys[i], sd->u.dict.values[i]));
  for (size_t i = x->item_base; i < c->n_items; i++)
    if (c->items[i].entry == SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "a _StorageInfo that is no value of storage_data");
  for (size_t i = x->entry_base; i < c->n_entries; i++) {
    const zck__dcp_entry *e = &c->entries[i];
    if (e->is_bytes && e->item == SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "%s: no item holds it", e->key);
    for (size_t j = 0; j < e->n_chunks; j++) {
      const zck__dcp_chunk *ch = &c->chunks[e->first_chunk + j];
      if (ch->item == SIZE_MAX && ch->numel)
        return MFAIL(ZCK_ERR_FORMAT, "%s: chunk %zu is in no item (a missing chunk)", e->key, j);
    }
  }
  return ZCK_OK;
}

void zck__dcp_meta_passed(void *ctx, size_t pos) {
  mctx *x = ctx;
  /* whole pages inside the buffer only (its allocator's bookkeeping lies outside it);
   * they read as zeros if touched again, which the VM never does */
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t from = ((uintptr_t)x->input + x->input_dropped + page - 1) & ~(page - 1);
  uintptr_t to = ((uintptr_t)x->input + pos) & ~(page - 1);
  if (pos > x->input_len || to <= from) return;
  if (!madvise((void *)from, to - from, MADV_DONTNEED)) x->input_dropped = to - (uintptr_t)x->input;
}

/* The nodes the VM kept (the tree less the objects it handed over), checked as those were. */
static zck_status check_nodes(mctx *x, const zck_pk_doc *doc) {
  for (size_t i = 0, n = zck_pk_doc_node_count(doc); i < n; i++) ZCK_TRY(zck__dcp_check_node(x, zck_pk_doc_node_at(doc, i)));
  return ZCK_OK;
}

zck_status zck__dcp_parse_metadata(zck_dcp *c, const char *dir, const zck_dcp_open_opts *o) {
  char *path = zck__path_join(dir, ZCK_DCP_METADATA_FILE);
  if (!path) return ZCK_ERR_NO_MEMORY;
  mctx x = {.c = c, .dir = dir, .path = path, .entry_base = c->n_entries, .item_base = c->n_items};
  char *data = NULL;
  size_t len = 0;
  zck_pk_doc *doc = NULL;
  zck_status s = zck__read_small_file(path, (size_t)o->max_metadata_bytes, &data, &len);
  if (s == ZCK_OK) {
    x.input = data;
    x.input_len = len;
    zck_pk_sink sink = zck__dcp_meta_sink_of(&x);
    s = zck_pickle_load_sink(data, len, path, &o->torch.limits, &sink, &doc);
  }
  free(data);
  if (s == ZCK_OK) s = check_nodes(&x, doc);
  if (s == ZCK_OK) s = parse_root(&x, zck_pk_doc_root(doc));
  zck_pk_doc_free(doc);
  /* the tables grew as the stream came: their slack would stay for the whole job */
  shrink_exact((void **)&c->chunks, &c->cap_chunks, c->n_chunks, sizeof *c->chunks);
  shrink_exact((void **)&c->items, &c->cap_items, c->n_items, sizeof *c->items);
  zck__strmap_free(&x.entry_index);
  free(x.chunk_index.slot);
  free(x.tensors);
  free(x.indexes);
  free(x.offsets);
  for (size_t i = 0; i < x.n_fqns; i++) free(x.fqns[i]);
  free(x.fqns);
  zck__strmap_free(&x.fqn_index);
  free(path);
  return s;
}
