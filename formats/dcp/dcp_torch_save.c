/* dcp_torch_save.c: what torch.distributed.checkpoint.format_utils.dcp_to_torch_save(dir,
 * path) writes, byte for byte, with the tensor data streamed from the items.
 *
 * torch rebuilds the whole state dict from the metadata (_EmptyStateDictLoadPlanner): for
 * every state_dict_metadata key in order, set_element(sd, planner_data[key], value) (the key
 * itself at the top level when planner_data has no path for it), where value is a new
 * contiguous tensor of the entry's dtype and size, or for a bytes entry the object
 * torch.load reads from its item; then torch.save(sd, path). Dicts keep that insertion
 * order; a path element that is an int indexes a list, grown with None. The pickle's memo
 * follows object identity, so the keys here are the very nodes of the metadata pickle (a
 * key string shared there is one object in torch's dict too) and each bytes value is the
 * tree its own item's pickle makes; storages are numbered in the order the pickler reaches
 * them. The layout is torch.save's (formats/torch/torch_save.c).
 *
 * Only the DCP folder itself is read, as torch does (Accelerate's optimizer_0 beside a
 * pytorch_model_fsdp_0 is another checkpoint). Every chunk's bytes are checked against its
 * record's zip CRC-32 as they stream (torch checks none); a bytes item must hold plain
 * Python values (what a class instance pickles to depends on its Python code). */
#include "dcp_internal.h"

#include <stdlib.h>
#include <string.h>

#define PLACEHOLDER_TAG 0x7a63
#define MAX_PATH_DEPTH 64
#define COPY_BUF ((size_t)8 << 20)

typedef struct tsave {
  zck_dcp *c;
  const char *meta_path;
  zck_torch_saver *sv;
  zck_pk_doc *d;
  size_t *entry_of_storage;     /* [storages] */
  zck__dcp_item_file *objs;     /* the bytes items, open while their trees are in the sd */
  size_t n_objs;
  zck_dcp_open_opts o;
} tsave;

static bool same_key(const zck_pk *a, const zck_pk *b) {
  if (a->kind == ZCK_PK_STR && b->kind == ZCK_PK_STR)
    return a->u.str.len == b->u.str.len && !memcmp(a->u.str.data, b->u.str.data, a->u.str.len);
  if (a->kind == ZCK_PK_INT && b->kind == ZCK_PK_INT) return a->u.i == b->u.i;
  return false;
}

static zck_pk **dict_slot(zck_pk *dict, const zck_pk *key) {
  for (size_t i = 0; i < dict->u.dict.len; i++)
    if (same_key(dict->u.dict.keys[i], key)) return &dict->u.dict.values[i];
  return NULL;
}

static bool is_placeholder(const zck_pk *n) { return n->kind == ZCK_PK_BYTES && n->tag == PLACEHOLDER_TAG; }

/* list[idx], growing the list with None as set_element's extend_list does */
static zck_pk **list_slot(tsave *t, zck_pk *list, int64_t idx) {
  while (list->u.seq.len <= (uint64_t)idx)
    if (!zck_pk_append(t->d, list, zck_pk_new_none(t->d))) return NULL;
  return &list->u.seq.items[idx];
}

static zck_status path_fail(tsave *t, const char *key, const char *why) {
  return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s: planner_data path %s (torch's dcp_to_torch_save fails on it too)",
                   t->meta_path, key, why);
}

/* set_element(root, path, value) of torch.distributed.checkpoint._traverse */
static zck_status set_element(tsave *t, zck_pk *root, const zck_pk *const *path, size_t n, zck_pk *value,
                              const char *key) {
  zck_pk *cur = root;
  for (size_t i = 0; i < n; i++)
    if ((path[i]->kind != ZCK_PK_STR && path[i]->kind != ZCK_PK_INT) || (path[i]->kind == ZCK_PK_INT && path[i]->u.i < 0))
      return path_fail(t, key, "has an element that is neither a str nor an int >= 0");
  for (size_t i = 1; i < n; i++) {
    const zck_pk *prev = path[i - 1];
    zck_pk **slot;
    if (cur->kind == ZCK_PK_DICT) {
      slot = dict_slot(cur, prev);
      if (!slot) {
        zck_pk *def = path[i]->kind == ZCK_PK_STR ? zck_pk_new_dict(t->d, 0) : zck_pk_new_list(t->d);
        if (!def || !zck_pk_dict_set(t->d, cur, (zck_pk *)prev, def)) return ZCK_ERR_NO_MEMORY;
        slot = &cur->u.dict.values[cur->u.dict.len - 1];
      }
    } else if (cur->kind == ZCK_PK_LIST && prev->kind == ZCK_PK_INT) {
      if (!(slot = list_slot(t, cur, prev->u.i))) return ZCK_ERR_NO_MEMORY;
      if ((*slot)->kind == ZCK_PK_NONE && !(*slot = path[i]->kind == ZCK_PK_STR ? zck_pk_new_dict(t->d, 0) : zck_pk_new_list(t->d)))
        return ZCK_ERR_NO_MEMORY;
    } else
      return path_fail(t, key, "runs through a value that is not a dict or list");
    cur = *slot;
    if (cur->kind != ZCK_PK_DICT && cur->kind != ZCK_PK_LIST) return path_fail(t, key, "runs through another entry's value");
  }
  const zck_pk *last = path[n - 1];
  zck_pk **slot = NULL;
  if (cur->kind == ZCK_PK_LIST && last->kind == ZCK_PK_INT) {
    if (!(slot = list_slot(t, cur, last->u.i))) return ZCK_ERR_NO_MEMORY;
  } else if (cur->kind == ZCK_PK_DICT && last->kind == ZCK_PK_STR) {
    if (!(slot = dict_slot(cur, last))) {
      if (!zck_pk_dict_set(t->d, cur, (zck_pk *)last, value)) return ZCK_ERR_NO_MEMORY;
      return ZCK_OK;
    }
  } else
    return path_fail(t, key, "ends in a key its container cannot take");
  if ((*slot)->kind != ZCK_PK_NONE) return path_fail(t, key, "lands on another entry's place");
  *slot = value;
  return ZCK_OK;
}

/* The first node under n that is not a plain Python value (a class instance, a tensor):
 * what those pickle to depends on Python code zckpt does not run. Deeper than the pickle
 * VM's own depth limit cannot occur. */
static const zck_pk *foreign_value(const zck_pk *n, int depth) {
  switch (n->kind) {
  case ZCK_PK_GLOBAL: case ZCK_PK_OBJECT: case ZCK_PK_PERSID: return n;
  case ZCK_PK_TUPLE: case ZCK_PK_LIST: case ZCK_PK_SET:
    for (size_t i = 0; i < n->u.seq.len && depth < 300; i++) {
      const zck_pk *b = foreign_value(n->u.seq.items[i], depth + 1);
      if (b) return b;
    }
    return NULL;
  case ZCK_PK_DICT:
    if (n->u.dict.ordered || n->u.dict.attrs) return n;   /* an OrderedDict: a class */
    for (size_t i = 0; i < n->u.dict.len && depth < 300; i++) {
      const zck_pk *b = foreign_value(n->u.dict.keys[i], depth + 1);
      if (!b) b = foreign_value(n->u.dict.values[i], depth + 1);
      if (b) return b;
    }
    return NULL;
  default: return NULL;
  }
}

/* A bytes item's value, as torch.load(weights_only=False) gives it. */
static zck_status object_value(tsave *t, const zck__dcp_entry *e, zck_pk **out) {
  zck__dcp_item *it = &t->c->items[e->item];
  zck__dcp_item_file *f = &t->objs[t->n_objs];
  zck_status s = zck__dcp_item_open(t->c, it, &t->o, f);
  if (s != ZCK_OK) {
    zck__dcp_item_close(f);
    return s;
  }
  t->n_objs++;
  const zck_pk *bad = foreign_value(zck_torch_root(f->tf), 0);
  if (bad)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s holds %s: only plain Python values are written as torch writes them",
                     it->win.name, e->key, bad->kind == ZCK_PK_PERSID ? "a tensor" : "a Python object");
  *out = (zck_pk *)zck_torch_root(f->tf);
  return ZCK_OK;
}

/* Replaces every placeholder under node by its entry's value, in the order the pickler
 * walks the tree (so storages are numbered as torch numbers them). */
static zck_status fill(tsave *t, zck_pk *node, int depth) {
  if (depth > MAX_PATH_DEPTH) return zck__fail(ZCK_ERR_LIMIT, "%s: planner_data paths nest too deep", t->meta_path);
  bool dict = node->kind == ZCK_PK_DICT;
  size_t n = dict ? node->u.dict.len : node->u.seq.len;
  for (size_t i = 0; i < n; i++) {
    zck_pk **slot = dict ? &node->u.dict.values[i] : &node->u.seq.items[i];
    if (is_placeholder(*slot)) {
      size_t ei;
      memcpy(&ei, (*slot)->u.str.data, sizeof ei);
      const zck__dcp_entry *e = &t->c->entries[ei];
      zck_pk *v = NULL;
      if (e->is_bytes) ZCK_TRY(object_value(t, e, &v));
      else {
        size_t si = zck_torch_saver_storage_count(t->sv);
        if (!(v = zck_torch_saver_tensor(t->sv, e->dtype, e->ndim, e->shape))) return zck__fail(ZCK_ERR_NO_MEMORY, "%s: %s", t->meta_path, e->key);
        t->entry_of_storage[si] = ei;
      }
      *slot = v;
    } else if ((*slot)->kind == ZCK_PK_DICT || (*slot)->kind == ZCK_PK_LIST)
      ZCK_TRY(fill(t, *slot, depth + 1));
  }
  return ZCK_OK;
}

/* The state dict torch rebuilds, with placeholders for the values. */
static zck_status skeleton(tsave *t, const zck_pk *meta, zck_pk **root, size_t *n_entries) {
  const zck_pk *st = meta && meta->kind == ZCK_PK_OBJECT ? meta->u.obj.state : NULL;
  const zck_pk *sdm = st && st->kind == ZCK_PK_DICT ? zck_pk_dict_get(st, "state_dict_metadata") : NULL;
  const zck_pk *pd = st && st->kind == ZCK_PK_DICT ? zck_pk_dict_get(st, "planner_data") : NULL;
  if (!sdm || sdm->kind != ZCK_PK_DICT) return zck__fail(ZCK_ERR_FORMAT, "%s: no state_dict_metadata", t->meta_path);
  if (sdm->u.dict.len > t->c->n_entries) return zck__fail(ZCK_ERR_INTERNAL, "%s: entries differ from the reader's", t->meta_path);
  zck_pk_dict_index pdi;
  ZCK_TRY(zck_pk_dict_index_init(&pdi, pd && pd->kind == ZCK_PK_DICT ? pd : NULL));
  zck_status s = (*root = zck_pk_new_dict(t->d, 0)) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < sdm->u.dict.len; i++) {
    const zck_pk *k = sdm->u.dict.keys[i];
    const char *key = zck_pk_as_str(k);
    if (!key || strcmp(key, t->c->entries[i].key)) {
      s = zck__fail(ZCK_ERR_INTERNAL, "%s: entry %zu differs from the reader's", t->meta_path, i);
      break;
    }
    zck_pk *ph = zck_pk_new_bytes(t->d, &i, sizeof i);
    if (!ph) {
      s = ZCK_ERR_NO_MEMORY;
      break;
    }
    ph->tag = PLACEHOLDER_TAG;
    const zck_pk *p = zck_pk_dict_index_get(&pdi, key);
    if (p && (p->kind == ZCK_PK_TUPLE || p->kind == ZCK_PK_LIST) && p->u.seq.len) {
      if (p->u.seq.len > MAX_PATH_DEPTH) s = path_fail(t, key, "is too deep");
      else s = set_element(t, *root, (const zck_pk *const *)p->u.seq.items, p->u.seq.len, ph, key);
    } else if (p && p->kind != ZCK_PK_NONE)
      s = path_fail(t, key, "is not a non-empty tuple or list");
    else
      s = set_element(t, *root, &k, 1, ph, key);
  }
  zck_pk_dict_index_free(&pdi);
  *n_entries = sdm->u.dict.len;
  return s;
}

/* A run of a chunk written into the storage: where, and the CRC-32 of its bytes. */
typedef struct run_crc {
  uint64_t flat, len;
  uint32_t crc;
} run_crc;

static int cmp_run(const void *a, const void *b) {
  uint64_t x = ((const run_crc *)a)->flat, y = ((const run_crc *)b)->flat;
  return x < y ? -1 : x > y;
}

/* Streams chunk ch (its item read front to back) into the storage at base, run by run,
 * checking the item's CRC-32 and noting each run's own CRC at *runs. */
static zck_status copy_chunk(tsave *t, const zck__dcp_entry *e, const zck__dcp_chunk *ch, uint64_t base, void *buf,
                             run_crc **runs) {
  size_t esz = zck_dtype_size(e->dtype);
  const zck__dcp_item *it = &t->c->items[ch->item];
  uint64_t bytes = ch->numel * esz, run_bytes = ch->run_len * esz;
  if (it->rec.off != it->data_off || it->rec.size != bytes)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s: the chunk is part of a larger record", it->win.name, e->key);
  zck__dcp_runs r;
  zck__dcp_runs_init(&r, e->ndim, e->shape, ch);
  uint32_t all = 0;
  uint64_t in_run = run_bytes;     /* bytes of the current run written */
  run_crc *cur = NULL;
  for (uint64_t done = 0; done < bytes;) {
    size_t n = bytes - done < COPY_BUF ? (size_t)(bytes - done) : COPY_BUF;
    ZCK_TRY(zck__source_read(&it->win, buf, n, it->data_off + done));
    all = zck_crc32_update(all, buf, n);
    for (size_t at = 0; at < n;) {
      if (in_run == run_bytes) {
        cur = (*runs)++;
        if (!zck__dcp_runs_next(&r, &cur->flat)) return zck__fail(ZCK_ERR_INTERNAL, "%s: %s: runs overrun", it->win.name, e->key);
        cur->len = run_bytes;
        cur->crc = 0;
        in_run = 0;
      }
      size_t m = n - at < run_bytes - in_run ? n - at : (size_t)(run_bytes - in_run);
      ZCK_TRY(zck_torch_saver_write(t->sv, (const uint8_t *)buf + at, m, base + cur->flat * esz + in_run));
      cur->crc = zck_crc32_update(cur->crc, (const uint8_t *)buf + at, m);
      in_run += m;
      at += m;
    }
    done += n;
  }
  if (all != it->rec.crc32)
    return zck__fail(ZCK_ERR_DAMAGED, "%s: %s: CRC-32 %08x, its zip directory says %08x (damaged)", it->win.name,
                     it->rec.what ? it->rec.what : e->key, all, it->rec.crc32);
  return ZCK_OK;
}

/* Streams every chunk of storage si's entry into place, each checked by its record's CRC;
 * the storage's CRC is its runs' CRCs combined in flat order (they cover it exactly once). */
static zck_status copy_storage(tsave *t, size_t si, void *buf) {
  const zck__dcp_entry *e = &t->c->entries[t->entry_of_storage[si]];
  uint64_t base = zck_torch_saver_data_offset(t->sv, si);
  uint64_t n_runs = 0;
  for (size_t j = 0; j < e->n_chunks; j++) n_runs += t->c->chunks[e->first_chunk + j].n_runs;
  run_crc *runs = zck__malloc((n_runs ? n_runs : 1) * sizeof *runs), *end = runs;
  if (!runs) return ZCK_ERR_NO_MEMORY;
  zck_status s = ZCK_OK;
  for (size_t j = 0; s == ZCK_OK && j < e->n_chunks; j++) {
    const zck__dcp_chunk *ch = &t->c->chunks[e->first_chunk + j];
    if (ch->numel) s = copy_chunk(t, e, ch, base, buf, &end);
  }
  if (s == ZCK_OK) {
    qsort(runs, (size_t)(end - runs), sizeof *runs, cmp_run);
    uint32_t all = 0;
    for (const run_crc *r = runs; r < end; r++) all = zck_crc32_combine(all, r->crc, r->len);
    zck_torch_saver_set_crc(t->sv, si, all);
  }
  free(runs);
  return s;
}

/* The metadata's objects of every chunk and item, dropped as the pickle streams (the reader
 * has read and checked them): the tree keeps the keys and planner_data paths used here. */
static int drop_classify(void *ctx, const char *module, const char *name) {
  (void)ctx;
  int cls = zck_dcp_class_of(module, name);
  return cls == ZCK_DCP_CLS_TENSOR_STORAGE || cls == ZCK_DCP_CLS_METADATA_INDEX || cls == ZCK_DCP_CLS_STORAGE_INFO ? cls : -1;
}
static zck_status drop(void *ctx, int cls, const zck_pk *obj, const zck_pk *below, uint32_t *handle) {
  (void)ctx, (void)cls, (void)obj, (void)below;
  *handle = 0;
  return ZCK_OK;
}

zck_status zck_dcp_torch_save(zck_dcp *c, const char *path) {
  if (c->safetensors)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: safetensors storage, which torch's dcp_to_torch_save does not read (it has no .metadata)",
                     c->dir);
  tsave t = {.c = c, .o = (zck_dcp_open_opts)ZCK_DCP_OPEN_OPTS_INIT};
  char *meta_path = zck__path_join(c->dir, ZCK_DCP_METADATA_FILE);
  char *data = NULL;
  size_t len = 0, n_entries = 0;
  zck_pk_doc *meta = NULL;
  void *buf = NULL;
  zck_pk *root = NULL;
  if (!meta_path) return ZCK_ERR_NO_MEMORY;
  t.meta_path = meta_path;
  /* the metadata again, as its own tree: the reader keeps only what it parsed, and the
   * keys must be its nodes (see above) */
  zck_status s = zck__read_small_file(meta_path, (size_t)t.o.max_metadata_bytes, &data, &len);
  zck_pk_sink dropper = {NULL, drop_classify, NULL, drop, NULL};
  if (s == ZCK_OK) s = zck_pickle_load_sink(data, len, meta_path, &t.o.torch.limits, &dropper, &meta);
  free(data);
  if (s == ZCK_OK) s = zck_torch_saver_create(path, &t.sv);
  if (s == ZCK_OK) {
    t.d = zck_torch_saver_doc(t.sv);
    t.entry_of_storage = zck__calloc(c->n_entries ? c->n_entries : 1, sizeof *t.entry_of_storage);
    t.objs = zck__calloc(c->n_entries ? c->n_entries : 1, sizeof *t.objs);
    buf = malloc(COPY_BUF);
    if (!t.entry_of_storage || !t.objs || !buf) s = ZCK_ERR_NO_MEMORY;
  }
  if (s == ZCK_OK) s = skeleton(&t, zck_pk_doc_root(meta), &root, &n_entries);
  if (s == ZCK_OK) s = fill(&t, root, 0);
  if (s == ZCK_OK) s = zck_pk_share_small_strings(&root);
  if (s == ZCK_OK) s = zck_torch_saver_layout(t.sv, root);
  for (size_t i = 0; s == ZCK_OK && i < zck_torch_saver_storage_count(t.sv); i++) s = copy_storage(&t, i, buf);
  if (s == ZCK_OK) s = zck_torch_saver_finish(t.sv);
  zck_torch_saver_free(t.sv);
  for (size_t i = 0; i < t.n_objs; i++) zck__dcp_item_close(&t.objs[i]);
  free(t.objs);
  free(t.entry_of_storage);
  free(buf);
  zck_pk_doc_free(meta);
  free(meta_path);
  return s;
}
