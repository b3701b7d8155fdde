/* dcp_meta.c: the .metadata pickle of a DCP folder, read as torch's unpickler would see it
 * (only the classes dcp_format.h lists), into entries, chunks, items and file names, with
 * the chunk geometry checked: every chunk a block inside its tensor, the chunks covering
 * the tensor exactly once, one item per chunk. */
#include "dcp_internal.h"

#include "pickle/pickle.h"
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Which chunk of an entry starts at given offsets: an open-addressing table of chunk
 * indices, compared through the chunks themselves (a metadata of 100k chunks costs 32
 * bytes a chunk here, not a key string and a map entry). */
typedef struct chunk_slot {
  size_t chunk;                    /* SIZE_MAX: empty */
  size_t entry;
} chunk_slot;
typedef struct chunk_table {
  chunk_slot *slot;
  size_t cap, n;                   /* cap: a power of two, at least twice n */
} chunk_table;

typedef struct mctx {
  zck_dcp *c;
  const char *dir;                 /* the folder whose .metadata this is */
  const char *path;                /* the .metadata file, for messages */
  zck__strmap entry_index;         /* key -> entry */
  chunk_table chunk_index;         /* (entry, offsets) -> chunk */
  size_t chunk_base;               /* c->n_chunks before this folder */
  size_t entry_base;               /* c->n_entries before this folder */
} mctx;

#define MFAIL(st, ...) mfail(x, (st), __VA_ARGS__)
static zck_status mfail(const mctx *x, zck_status st, const char *fmt, ...) ZCK__PRINTF(3, 4);
static zck_status mfail(const mctx *x, zck_status st, const char *fmt, ...) {
  char msg[768];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return zck__fail(st, "%s: %s", x->path, msg);
}

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

// ---- the chunk table

static uint64_t chunk_hash(size_t entry, const int64_t *off, int nd) {
  uint64_t h = (uint64_t)entry * 0x9E3779B97F4A7C15ull;
  for (int d = 0; d < nd; d++) {
    h = (h ^ (uint64_t)off[d]) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 29;
  }
  return h ^ (h >> 32);
}

/* The slot of (entry, off) in t: its chunk, or the empty slot where it would go. */
static chunk_slot *table_probe(const zck_dcp *c, const chunk_table *t, size_t entry, const int64_t *off, int nd) {
  size_t mask = t->cap - 1;
  for (size_t i = (size_t)chunk_hash(entry, off, nd) & mask;; i = (i + 1) & mask) {
    chunk_slot *s = &t->slot[i];
    if (s->chunk == SIZE_MAX) return s;
    if (s->entry == entry && !memcmp(c->chunks[s->chunk].offsets, off, (size_t)nd * sizeof *off)) return s;
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
      *table_probe(c, &nt, t->slot[i].entry, ch->offsets, ZCK_MAX_DIMS) = t->slot[i];
    }
  free(t->slot);
  *t = nt;
  return true;
}

/* Adds chunk ci of entry; *dup when an earlier chunk of entry starts at the same offsets
 * (the table keeps the earlier one). */
static bool table_add(const zck_dcp *c, chunk_table *t, size_t entry, size_t ci, bool *dup) {
  if (!table_reserve(c, t, t->n + 1)) return false;
  chunk_slot *s = table_probe(c, t, entry, c->chunks[ci].offsets, ZCK_MAX_DIMS);
  *dup = s->chunk != SIZE_MAX;
  if (!*dup) {
    *s = (chunk_slot){ci, entry};
    t->n++;
  }
  return true;
}

// ---- the allowed classes, in the forms torch writes them

/* Every GLOBAL of the stream must be allowlisted, and nothing may be a persistent id
 * (torch's plain pickle.load has no persistent_load: it would raise). */
static zck_status check_globals(mctx *x, const zck_pk_doc *doc) {
  for (size_t i = 0, n = zck_pk_doc_node_count(doc); i < n; i++) {
    const zck_pk *p = zck_pk_doc_node_at(doc, i);
    if (p->kind == ZCK_PK_PERSID) return MFAIL(ZCK_ERR_FORMAT, "a persistent id, which a metadata pickle never holds");
    if (p->kind == ZCK_PK_GLOBAL && !zck_dcp_global_allowed(p->u.global.module, p->u.global.name))
      return MFAIL(ZCK_ERR_FORMAT, "global %s.%s is not a class of DCP metadata (refused)", p->u.global.module,
                   p->u.global.name);
    /* a path is built from strings, and nothing else is done to it */
    if (p->kind == ZCK_PK_OBJECT && p->u.obj.callable->kind == ZCK_PK_GLOBAL &&
        zck_dcp_is_path_class(p->u.obj.callable->u.global.module, p->u.obj.callable->u.global.name)) {
      const zck_pk *a = p->u.obj.args;
      bool ok = a && a->kind == ZCK_PK_TUPLE && !p->u.obj.state && !p->u.obj.list_items && !p->u.obj.dict_items;
      for (size_t j = 0; ok && j < a->u.seq.len; j++) ok = a->u.seq.items[j]->kind == ZCK_PK_STR;
      if (!ok) return MFAIL(ZCK_ERR_FORMAT, "a pathlib path not built from strings");
    }
  }
  return ZCK_OK;
}

/* The BUILD state of a dataclass instance of class cls, made as NEWOBJ(cls, ()): a dict,
 * or NULL for a class with no fields (BytesStorageMetadata). */
static zck_status dataclass_state(mctx *x, const zck_pk *node, zck_dcp_class cls, const char *where,
                                  const zck_pk **state) {
  *state = NULL;
  if (!node || node->kind != ZCK_PK_OBJECT ||
      !zck_pk_is_global(node->u.obj.callable, zck_dcp_class_module(cls), zck_dcp_class_name(cls)))
    return MFAIL(ZCK_ERR_FORMAT, "%s: expected a %s", where, zck_dcp_class_name(cls));
  if (!node->u.obj.newobj || !node->u.obj.args || node->u.obj.args->kind != ZCK_PK_TUPLE ||
      node->u.obj.args->u.seq.len || node->u.obj.list_items || node->u.obj.dict_items)
    return MFAIL(ZCK_ERR_FORMAT, "%s: a %s not built as torch pickles it", where, zck_dcp_class_name(cls));
  const zck_pk *s = node->u.obj.state;
  if (s && s->kind == ZCK_PK_NONE) s = NULL;
  if (s && s->kind != ZCK_PK_DICT && cls != ZCK_DCP_CLS_TENSOR_PROPERTIES)
    return MFAIL(ZCK_ERR_FORMAT, "%s: the state of a %s is not a dict", where, zck_dcp_class_name(cls));
  *state = s;
  return ZCK_OK;
}

/* A torch.Size (a tuple of ints >= 0) into v[]; n its length. */
static zck_status size_of(mctx *x, const zck_pk *node, const char *where, int64_t *v, int *n) {
  if (!node || node->kind != ZCK_PK_TUPLE || node->tag != ZCK_PK_TAG_TORCH_SIZE)
    return MFAIL(ZCK_ERR_FORMAT, "%s: expected a torch.Size", where);
  if (node->u.seq.len > ZCK_MAX_DIMS)
    return MFAIL(ZCK_ERR_LIMIT, "%s: %zu dimensions (at most %d)", where, node->u.seq.len, ZCK_MAX_DIMS);
  for (size_t i = 0; i < node->u.seq.len; i++) {
    const zck_pk *d = node->u.seq.items[i];
    if (d->kind != ZCK_PK_INT || d->u.i < 0) return MFAIL(ZCK_ERR_FORMAT, "%s: dimension %zu is not an int >= 0", where, i);
    v[i] = d->u.i;
  }
  *n = (int)node->u.seq.len;
  return ZCK_OK;
}

static const char *str_field(const zck_pk *state, const char *name) {
  return zck_pk_as_str(zck_pk_dict_get(state, name));
}

// ---- entries

static zck_status tensor_properties(mctx *x, const zck_pk *node, const char *key, zck_dtype *dtype) {
  const zck_pk *st;
  ZCK_TRY(dataclass_state(x, node, ZCK_DCP_CLS_TENSOR_PROPERTIES, key, &st));
  /* __getstate__: (dtype, layout, requires_grad, memory format, pin_memory[, strides]) */
  if (!st || st->kind != ZCK_PK_TUPLE || (st->u.seq.len != 5 && st->u.seq.len != 6))
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties state is not a 5- or 6-tuple", key);
  const zck_pk *const *f = (const zck_pk *const *)st->u.seq.items;
  if (f[0]->kind != ZCK_PK_GLOBAL || strcmp(f[0]->u.global.module, "torch"))
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties dtype is not a torch dtype", key);
  *dtype = zck_dcp_dtype_of(f[0]->u.global.name);
  if (*dtype == ZCK_DTYPE_INVALID)
    return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: dtype torch.%s is not supported", key, f[0]->u.global.name);
  const zck_pk *lay = f[1];
  if (lay->kind != ZCK_PK_OBJECT || !zck_pk_is_global(lay->u.obj.callable, ZCK_DCP_LAYOUT_MODULE, ZCK_DCP_LAYOUT_NAME) ||
      lay->u.obj.newobj || !lay->u.obj.args || lay->u.obj.args->u.seq.len != 1 ||
      !zck_pk_as_str(lay->u.obj.args->u.seq.items[0]))
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties layout is not a torch layout", key);
  const char *ls = zck_pk_as_str(lay->u.obj.args->u.seq.items[0]);
  if (strcmp(ls, ZCK_DCP_LAYOUT_STRIDED))
    return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: tensor layout %s is not supported (only torch.strided)", key, ls);
  const zck_pk *mf = f[3];
  int64_t enc;
  if (mf->kind != ZCK_PK_OBJECT || !zck_pk_is_global(mf->u.obj.callable, zck_dcp_class_module(ZCK_DCP_CLS_MEM_FORMAT),
                                                     zck_dcp_class_name(ZCK_DCP_CLS_MEM_FORMAT)) ||
      mf->u.obj.newobj || !mf->u.obj.args || mf->u.obj.args->u.seq.len != 1 ||
      !zck_pk_as_int(mf->u.obj.args->u.seq.items[0], &enc) || enc < ZCK_DCP_MEM_CONTIGUOUS || enc > ZCK_DCP_MEM_PRESERVE)
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties memory format is not a _MEM_FORMAT_ENCODING", key);
  if (f[2]->kind != ZCK_PK_BOOL || f[4]->kind != ZCK_PK_BOOL)
    return MFAIL(ZCK_ERR_FORMAT, "%s: TensorProperties requires_grad / pin_memory are not bools", key);
  return ZCK_OK;
}

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
    ZCK_TRY(dataclass_state(x, md, ZCK_DCP_CLS_BYTES_STORAGE, key, &st));
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
  const zck_pk *st;
  ZCK_TRY(dataclass_state(x, md, ZCK_DCP_CLS_TENSOR_STORAGE, key, &st));
  ZCK_TRY(tensor_properties(x, zck_pk_dict_get(st, "properties"), key, &e->dtype));
  ZCK_TRY(size_of(x, zck_pk_dict_get(st, "size"), key, e->shape, &e->ndim));
  e->numel = 1;
  for (int d = 0; d < e->ndim; d++)
    if (!zck__mul_u64(e->numel, (uint64_t)e->shape[d], &e->numel) || e->numel >> 62)
      return MFAIL(ZCK_ERR_LIMIT, "%s: shape too large", key);
  const zck_pk *chunks = zck_pk_dict_get(st, "chunks");
  if (!chunks || chunks->kind != ZCK_PK_LIST) return MFAIL(ZCK_ERR_FORMAT, "%s: chunks is not a list", key);
  e->first_chunk = c->n_chunks;
  e->n_chunks = chunks->u.seq.len;
  if (!ZCK__GROW(c->chunks, c->cap_chunks, c->n_chunks + e->n_chunks)) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < e->n_chunks; i++) {
    size_t ci = c->n_chunks;
    zck__dcp_chunk *ch = &c->chunks[ci];
    memset(ch, 0, sizeof *ch);
    ch->item = SIZE_MAX;
    c->n_chunks++;
    const zck_pk *cs;
    char where[96];
    snprintf(where, sizeof where, "%.60s chunk %zu", key, i);
    ZCK_TRY(dataclass_state(x, chunks->u.seq.items[i], ZCK_DCP_CLS_CHUNK, where, &cs));
    int no, ns;
    ZCK_TRY(size_of(x, zck_pk_dict_get(cs, "offsets"), where, ch->offsets, &no));
    ZCK_TRY(size_of(x, zck_pk_dict_get(cs, "sizes"), where, ch->sizes, &ns));
    if (no != e->ndim || ns != e->ndim)
      return MFAIL(ZCK_ERR_FORMAT, "%s: %d offsets and %d sizes for a %d-dimensional tensor", where, no, ns, e->ndim);
    if (!table_add(c, &x->chunk_index, ei, ci, &dup)) return ZCK_ERR_NO_MEMORY;
    /* empty chunks (ranks past a short dimension: 1 row over 3 ranks) may share their
     * offsets; torch's dedup then saves one item for them */
    bool empty = false;
    for (int d = 0; d < e->ndim; d++) empty |= ch->sizes[d] == 0;
    if (dup && !empty) return MFAIL(ZCK_ERR_FORMAT, "%s: two chunks start at the same offsets", where);
  }
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

static bool plain_file_name(const char *s) {
  return *s && !strchr(s, '/') && !strchr(s, '\\') && strcmp(s, ".") && strcmp(s, "..");
}

static zck_status add_item(mctx *x, const zck_pk *kn, const zck_pk *vn) {
  zck_dcp *c = x->c;
  const zck_pk *ks, *vs;
  ZCK_TRY(dataclass_state(x, kn, ZCK_DCP_CLS_METADATA_INDEX, "storage_data key", &ks));
  const char *fqn = str_field(ks, "fqn");
  if (!fqn) return MFAIL(ZCK_ERR_FORMAT, "storage_data: a MetadataIndex without fqn");
  ZCK_TRY(dataclass_state(x, vn, ZCK_DCP_CLS_STORAGE_INFO, fqn, &vs));
  const char *rel = str_field(vs, "relative_path");
  int64_t off, len;
  if (!rel || !zck_pk_as_int(zck_pk_dict_get(vs, "offset"), &off) || !zck_pk_as_int(zck_pk_dict_get(vs, "length"), &len) ||
      off < 0 || len < 0)
    return MFAIL(ZCK_ERR_FORMAT, "%s: storage info without a relative_path, offset >= 0 and length >= 0", fqn);
  if (!plain_file_name(rel)) return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: data file '%.200s' is not a file of the folder", fqn, rel);
  const zck_pk *td = zck_pk_dict_get(vs, "transform_descriptors");
  if (td && td->kind != ZCK_PK_NONE) {
    if ((td->kind != ZCK_PK_LIST && td->kind != ZCK_PK_TUPLE))
      return MFAIL(ZCK_ERR_FORMAT, "%s: transform_descriptors is not a list", fqn);
    if (td->u.seq.len) {
      const char *d = zck_pk_as_str(td->u.seq.items[0]);
      return MFAIL(ZCK_ERR_UNSUPPORTED, "%s: unknown transform descriptor '%.100s' (compressed or transformed items are not read)",
                   fqn, d ? d : "?");
    }
  }
  size_t ei;
  if (!zck__strmap_get(&x->entry_index, fqn, &ei)) return MFAIL(ZCK_ERR_FORMAT, "storage_data names %s, which no entry lists", fqn);
  zck__dcp_entry *e = &c->entries[ei];

  if (!ZCK__GROW(c->items, c->cap_items, c->n_items + 1)) return ZCK_ERR_NO_MEMORY;
  size_t ii = c->n_items;
  zck__dcp_item *it = &c->items[ii];
  memset(it, 0, sizeof *it);
  it->win.fd = -1;
  it->entry = ei;
  it->chunk = SIZE_MAX;
  it->off = (uint64_t)off;
  it->len = (uint64_t)len;
  c->n_items++;

  const zck_pk *on = zck_pk_dict_get(ks, "offset");
  if (e->is_bytes) {
    if (on && on->kind != ZCK_PK_NONE) return MFAIL(ZCK_ERR_FORMAT, "%s: a bytes item with chunk offsets", fqn);
    if (e->item != SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "%s: two items for one bytes entry", fqn);
    e->item = ii;
  } else {
    int64_t o[ZCK_MAX_DIMS] = {0};   /* past ndim: zeros, as in the chunks */
    int no;
    ZCK_TRY(size_of(x, on, fqn, o, &no));
    const chunk_slot *hit = no == e->ndim && x->chunk_index.cap ? table_probe(c, &x->chunk_index, ei, o, ZCK_MAX_DIMS) : NULL;
    if (!hit || hit->chunk == SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "%s: an item at offsets that start no chunk", fqn);
    size_t ci = hit->chunk;
    if (c->chunks[ci].item != SIZE_MAX) return MFAIL(ZCK_ERR_FORMAT, "%s: two items for one chunk", fqn);
    c->chunks[ci].item = ii;
    it->chunk = ci;
  }

  size_t fi;
  char *fpath = zck__path_join(x->dir, rel);
  if (!fpath) return ZCK_ERR_NO_MEMORY;
  bool known = zck__strmap_get(&c->file_index, fpath, &fi);
  if (known) free(fpath);
  else {
    if (!ZCK__GROW(c->files, c->cap_files, c->n_files + 1)) { free(fpath); return ZCK_ERR_NO_MEMORY; }
    fi = c->n_files;
    zck__dcp_file *f = &c->files[fi];
    memset(f, 0, sizeof *f);
    f->src.fd = -1;
    f->name = zck__strdup(rel);
    f->path = fpath;
    c->n_files++;
    if (!f->name) return ZCK_ERR_NO_MEMORY;
    bool dup;
    size_t prev;
    ZCK_TRY(zck__strmap_put(&c->file_index, f->path, fi, &dup, &prev));
  }
  it->file = fi;
  return ZCK_OK;
}

// ---- the whole

static zck_status parse_root(mctx *x, const zck_pk *root) {
  zck_dcp *c = x->c;
  const zck_pk *st;
  ZCK_TRY(dataclass_state(x, root, ZCK_DCP_CLS_METADATA, "the root", &st));
  const zck_pk *sdm = zck_pk_dict_get(st, "state_dict_metadata");
  const zck_pk *sd = zck_pk_dict_get(st, "storage_data");
  const zck_pk *pd = zck_pk_dict_get(st, "planner_data");
  if (!sdm || sdm->kind != ZCK_PK_DICT) return MFAIL(ZCK_ERR_FORMAT, "state_dict_metadata is not a dict");
  if (!sd || sd->kind != ZCK_PK_DICT)
    return MFAIL(ZCK_ERR_UNSUPPORTED, "storage_data is not a dict: not a checkpoint of the file-system storage");
  const char *v = str_field(st, "version");
  if (v && !c->version && !(c->version = zck__strdup(v))) return ZCK_ERR_NO_MEMORY;
  const zck_pk *sm = zck_pk_dict_get(st, "storage_meta");
  if (sm && sm->kind != ZCK_PK_NONE) {
    const zck_pk *ss;
    ZCK_TRY(dataclass_state(x, sm, ZCK_DCP_CLS_STORAGE_META, "storage_meta", &ss));
    const char *sid = str_field(ss, "save_id");
    if (sid && !c->save_id && !(c->save_id = zck__strdup(sid))) return ZCK_ERR_NO_MEMORY;
  }
  /* the tables at their final sizes, counted before they fill (their slack would stay
   * for the whole job) */
  size_t n_chunks = 0;
  for (size_t i = 0; i < sdm->u.dict.len; i++) {
    const zck_pk *md = sdm->u.dict.values[i], *ms = md && md->kind == ZCK_PK_OBJECT ? md->u.obj.state : NULL;
    const zck_pk *ch = ms && ms->kind == ZCK_PK_DICT ? zck_pk_dict_get(ms, "chunks") : NULL;
    if (ch && ch->kind == ZCK_PK_LIST) n_chunks += ch->u.seq.len;
  }
  if (!reserve_exact((void **)&c->entries, &c->cap_entries, c->n_entries + sdm->u.dict.len, sizeof *c->entries) ||
      !reserve_exact((void **)&c->chunks, &c->cap_chunks, c->n_chunks + n_chunks, sizeof *c->chunks) ||
      !reserve_exact((void **)&c->items, &c->cap_items, c->n_items + sd->u.dict.len, sizeof *c->items) ||
      !table_reserve(c, &x->chunk_index, n_chunks))
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
  for (size_t i = x->entry_base; i < c->n_entries; i++)
    if (!c->entries[i].is_bytes) ZCK_TRY(check_geometry(x, &c->entries[i]));
  for (size_t i = 0; i < sd->u.dict.len; i++) ZCK_TRY(add_item(x, sd->u.dict.keys[i], sd->u.dict.values[i]));
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

zck_status zck__dcp_parse_metadata(zck_dcp *c, const char *dir, const zck_dcp_open_opts *o) {
  char *path = zck__path_join(dir, ZCK_DCP_METADATA_FILE);
  if (!path) return ZCK_ERR_NO_MEMORY;
  mctx x = {.c = c, .dir = dir, .path = path, .chunk_base = c->n_chunks, .entry_base = c->n_entries};
  char *data = NULL;
  size_t len = 0;
  zck_pk_doc *doc = NULL;
  zck_status s = zck__read_small_file(path, (size_t)o->max_metadata_bytes, &data, &len);
  if (s == ZCK_OK) s = zck_pickle_load(data, len, path, &o->torch.limits, &doc);
  free(data);   /* the tree holds copies of its strings: the bytes go before the tables fill */
  data = NULL;
  if (s == ZCK_OK) s = check_globals(&x, doc);
  if (s == ZCK_OK) s = parse_root(&x, zck_pk_doc_root(doc));
  zck_pk_doc_free(doc);
  free(data);
  zck__strmap_free(&x.entry_index);
  free(x.chunk_index.slot);
  free(path);
  return s;
}
