/* dcp_open.c: finding a DCP folder, opening its data files and items, and the structure
 * checks of the whole file set (dcp.h): nothing is described before all of them pass. */
#include "dcp_internal.h"

#include "util.h"
#include "zip/zip.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ACCELERATE_MODEL_DIR ZCK_DCP_ACCELERATE_MODEL_DIR
#define ACCELERATE_OPTIM_DIR ZCK_DCP_ACCELERATE_OPTIM_DIR

// ---- which folder

static bool has_metadata(const char *dir) {
  char *p = zck__path_join(dir, ZCK_DCP_METADATA_FILE);
  struct stat st;
  bool ok = p && stat(p, &st) == 0 && S_ISREG(st.st_mode);
  free(p);
  return ok;
}

char *zck_dcp_dir_of(const char *dir) {
  if (has_metadata(dir) || zck__dcp_safetensors_dir(dir)) return zck__strdup(dir);
  char *sub = zck__path_join(dir, ACCELERATE_MODEL_DIR);
  if (sub && has_metadata(sub)) return sub;
  free(sub);
  return NULL;
}

/* checkpoint-<digits> (HF Trainer) or step-<digits> (torchtitan): N, or -1. */
static long long ckpt_number(const char *name) {
  const char *d = !strncmp(name, "checkpoint-", 11) ? name + 11 : !strncmp(name, "step-", 5) ? name + 5 : NULL;
  if (!d) return -1;
  if (!*d || strlen(d) > 15) return -1;
  long long n = 0;
  for (; *d; d++) {
    if (*d < '0' || *d > '9') return -1;
    n = n * 10 + (*d - '0');
  }
  return n;
}

zck_status zck_dcp_resolve(const char *path, char **dir) {
  *dir = zck_dcp_dir_of(path);
  if (*dir) return ZCK_OK;
  /* an HF output_dir or a torchtitan checkpoint folder: the newest checkpoint-N / step-N
   * a DCP save finished (.metadata is what it writes last; torchtitan's own resume takes
   * the largest step-N holding one) */
  DIR *d = opendir(path);
  if (!d) return zck__fail_errno(errno, "%s: cannot open folder", path);
  long long best = -1;
  char *best_dir = NULL;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long n = ckpt_number(e->d_name);
    if (n <= best) continue;
    char *ck = zck__path_join(path, e->d_name);
    char *dd = ck ? zck_dcp_dir_of(ck) : NULL;
    free(ck);
    if (!dd) continue;
    free(best_dir);
    best_dir = dd;
    best = n;
  }
  closedir(d);
  if (!best_dir)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: not a torch Distributed Checkpoint (no " ZCK_DCP_METADATA_FILE ")", path);
  *dir = best_dir;
  return ZCK_OK;
}

bool zck_dcp_is_checkpoint(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  char *dir = NULL;
  zck_status s = zck_dcp_resolve(path, &dir);
  free(dir);
  zck_clear_error();
  return s == ZCK_OK;
}

// ---- the data files and their items

static int cmp_item_off(const void *a, const void *b, void *ctx) {
  const zck__dcp_item *it = ctx;
  const zck__dcp_item *x = &it[*(const size_t *)a], *y = &it[*(const size_t *)b];
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return x->off < y->off ? -1 : x->off > y->off;
}

/* Every file there; its items inside it, not overlapping, filling it back to back. */
static zck_status check_files(zck_dcp *c) {
  for (size_t i = 0; i < c->n_files; i++) {
    zck__dcp_file *f = &c->files[i];
    struct stat st;
    if (stat(f->path, &st) != 0)
      return zck__fail_errno(errno, "%s: missing: the checkpoint's metadata lists items in it", f->path);
    ZCK_TRY(zck__source_open(&f->src, f->path));
    c->info.data_bytes += f->src.size;
  }
  size_t *order = zck__malloc((c->n_items ? c->n_items : 1) * sizeof *order);
  if (!order) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < c->n_items; i++) order[i] = i;
  qsort_r(order, c->n_items, sizeof *order, cmp_item_off, c->items);
  zck_status s = ZCK_OK;
  uint64_t at = 0;
  for (size_t k = 0; k < c->n_items && s == ZCK_OK; k++) {
    const zck__dcp_item *it = &c->items[order[k]];
    const zck__dcp_file *f = &c->files[it->file];
    const char *key = c->entries[it->entry].key;
    if (k == 0 || c->items[order[k - 1]].file != it->file) at = f->data_start;
    uint64_t end;
    if (!zck__add_u64(it->off, it->len, &end) || end > f->src.size)
      s = zck__fail(ZCK_ERR_TRUNCATED, "%s: truncated: item %s needs bytes %llu..%llu but the file has %llu", f->path, key,
                    (unsigned long long)it->off, (unsigned long long)it->off + it->len, (unsigned long long)f->src.size);
    else if (it->off < at)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: item %s at byte %llu overlaps the item before it (ending at %llu)", f->path, key,
                    (unsigned long long)it->off, (unsigned long long)at);
    else if (it->off > at)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: bytes %llu..%llu belong to no item of the metadata (a file of another save?)",
                    f->path, (unsigned long long)at, (unsigned long long)it->off);
    at = end;
    bool last = k + 1 == c->n_items || c->items[order[k + 1]].file != it->file;
    if (s == ZCK_OK && last && at != f->src.size)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: %llu bytes after its last item (a file of another save?)", f->path,
                    (unsigned long long)(f->src.size - at));
  }
  free(order);
  return s;
}

#define SMALL_ITEM ((uint64_t)64 << 10)

zck_status zck__dcp_item_open(zck_dcp *c, zck__dcp_item *it, const zck_dcp_open_opts *o, zck__dcp_item_file *f) {
  memset(f, 0, sizeof *f);
  f->mem.fd = -1;
  zck__dcp_file *df = &c->files[it->file];
  char *name = zck__sprintf("%s: item %s at byte %llu", df->path, c->entries[it->entry].key, (unsigned long long)it->off);
  if (!name) return ZCK_ERR_NO_MEMORY;
  zck_status s = it->win.name ? ZCK_OK : zck__source_window(&it->win, &df->src, it->off, it->len, name);
  if (s == ZCK_OK && it->len <= SMALL_ITEM) {
    if (!(f->buf = zck__malloc(it->len ? (size_t)it->len : 1))) s = ZCK_ERR_NO_MEMORY;
    else s = zck__source_read(&it->win, f->buf, (size_t)it->len, 0);
    if (s == ZCK_OK) zck__source_memory(&f->mem, name, f->buf, it->len);
  }
  free(name);
  if (s == ZCK_OK) s = zck_torch_open_source(f->buf && f->mem.name ? &f->mem : &it->win, &o->torch, &f->tf);
  return s;
}

void zck__dcp_item_close(zck__dcp_item_file *f) {
  zck_torch_close(f->tf);
  zck__source_close(&f->mem);
  free(f->buf);
  memset(f, 0, sizeof *f);
}

/* A tensor item: one contiguous tensor of its chunk's dtype and shape, read in place. */
static zck_status open_tensor_item(zck_dcp *c, zck__dcp_item *it, const zck_dcp_open_opts *o) {
  const zck__dcp_entry *e = &c->entries[it->entry];
  const zck__dcp_chunk *ch = &c->chunks[it->chunk];
  zck__dcp_item_file itf;
  zck_status s = zck__dcp_item_open(c, it, o, &itf);
  if (s != ZCK_OK) {
    zck__dcp_item_close(&itf);
    return s;
  }
  zck_torch_file *tf = itf.tf;
  const zck_torch_tensor *t = zck_torch_tensor_of(tf, zck_torch_root(tf));
  char shape[96], want[96];
  if (!t) s = zck__fail(ZCK_ERR_FORMAT, "%s: holds no tensor", it->win.name);
  else if (t->dtype != e->dtype)
    s = zck__fail(ZCK_ERR_FORMAT, "%s: a %s tensor where the metadata says %s", it->win.name, zck_dtype_name(t->dtype),
                  zck_dtype_name(e->dtype));
  else {
    bool same = t->ndim == e->ndim;
    for (int d = 0; same && d < e->ndim; d++) same = t->shape[d] == ch->sizes[d];
    if (!same)
      s = zck__fail(ZCK_ERR_FORMAT, "%s: shape %s where its chunk is %s", it->win.name,
                    zck_shape_str(t->ndim, t->shape, shape, sizeof shape), zck_shape_str(e->ndim, ch->sizes, want, sizeof want));
    else if (!zck_torch_tensor_contiguous(t))
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: a non-contiguous tensor", it->win.name);
    else if (!zck_torch_tensor_record(tf, t, &it->rec))
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: its data record is compressed", it->win.name);
    else {
      it->data_off = zck_torch_tensor_file_offset(tf, t);
      it->what = zck__sprintf("record %s (%s)", zck_torch_tensor_storage(tf, t)->entry->name, e->key);
      it->rec.what = it->what;
      if (!it->what) s = ZCK_ERR_NO_MEMORY;
    }
  }
  zck__dcp_item_close(&itf);
  return s;
}

/* A safetensors tensor: its bytes in place, with no record to check them by. */
static zck_status open_raw_item(zck_dcp *c, zck__dcp_item *it) {
  const zck__dcp_file *f = &c->files[it->file];
  char *name = zck__sprintf("%s: tensor %s", f->path, c->entries[it->entry].key);
  if (!name) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__source_window(&it->win, &f->src, it->off, it->len, name);
  free(name);
  it->data_off = 0;
  return s;
}

/* Accelerate's save_state keeps the optimizer in its own DCP folder beside the model's:
 * read both as one checkpoint. */
static zck_status accelerate_optimizer(zck_dcp *c, const zck_dcp_open_opts *o) {
  const char *base = strrchr(c->dir, '/');
  base = base ? base + 1 : c->dir;
  if (strcmp(base, ACCELERATE_MODEL_DIR)) return ZCK_OK;
  char *parent = zck__strndup(c->dir, (size_t)(base - c->dir));
  char *od = parent ? zck__concat(parent, ACCELERATE_OPTIM_DIR, (const char *)NULL) : NULL;
  free(parent);
  if (!od) return ZCK_ERR_NO_MEMORY;
  if (!has_metadata(od)) {
    free(od);
    return ZCK_OK;
  }
  c->optim_dir = od;
  return zck__dcp_parse_metadata(c, od, o);
}

static zck_dcp_open_opts defaults(const zck_dcp_open_opts *o) {
  zck_dcp_open_opts d = ZCK_DCP_OPEN_OPTS_INIT;
  return o ? *o : d;
}

zck_status zck_dcp_open(const char *path, const zck_dcp_open_opts *opts, zck_dcp **out) {
  *out = NULL;
  zck_dcp_open_opts o = defaults(opts);
  zck_dcp *c = zck__calloc(1, sizeof *c);
  if (!c) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck_dcp_resolve(path, &c->dir);
  if (s == ZCK_OK) c->safetensors = !has_metadata(c->dir);
  if (s == ZCK_OK) s = c->safetensors ? zck__dcp_parse_safetensors(c, c->dir) : zck__dcp_parse_metadata(c, c->dir, &o);
  if (s == ZCK_OK && !c->safetensors) s = accelerate_optimizer(c, &o);
  if (s == ZCK_OK) s = check_files(c);
  for (size_t i = 0; i < c->n_items && s == ZCK_OK; i++)
    if (c->items[i].chunk != SIZE_MAX) s = c->safetensors ? open_raw_item(c, &c->items[i]) : open_tensor_item(c, &c->items[i], &o);
  if (s == ZCK_OK) s = zck__dcp_describe(c, &o);
  if (s != ZCK_OK) {
    zck_dcp_close(c);
    return s;
  }
  c->info.dir = c->dir;
  c->info.version = c->version;
  c->info.save_id = c->save_id;
  c->info.n_files = c->n_files;
  c->info.n_items = c->n_items;
  for (size_t i = 0; i < c->n_entries; i++) {
    if (c->entries[i].is_bytes) c->info.n_bytes_entries++;
    else c->info.n_tensors++;
  }
  *out = c;
  return ZCK_OK;
}

void zck_dcp_close(zck_dcp *c) {
  if (!c) return;
  for (size_t i = 0; i < c->n_items; i++) {
    zck__source_close(&c->items[i].win);
    free(c->items[i].what);
  }
  for (size_t i = 0; i < c->n_files; i++) {
    zck__source_close(&c->files[i].src);
    free(c->files[i].name);
    free(c->files[i].path);
  }
  for (size_t i = 0; i < c->n_entries; i++) {
    free(c->entries[i].key);
    free(c->entries[i].fqn);
    free(c->entries[i].setting);
  }
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    zck_layout_free(c->layout[k]);
    free(c->stores[k]);
  }
  zck_model_free(c->model);
  free(c->param_of_entry);
  free(c->peft_adapter);
  free(c->module_name);
  free(c->outs);
  zck__strmap_free(&c->file_index);
  free(c->entries);
  free(c->chunks);
  free(c->items);
  free(c->files);
  free(c->dir);
  free(c->optim_dir);
  free(c->version);
  free(c->save_id);
  free(c);
}

const zck_dcp_info *zck_dcp_info_of(const zck_dcp *c) { return &c->info; }
const zck_model *zck_dcp_model(const zck_dcp *c) { return c->model; }

size_t zck_dcp_entry_count(const zck_dcp *c) { return c->n_entries; }
void zck_dcp_entry_at(const zck_dcp *c, size_t i, zck_dcp_entry_info *out) {
  const zck__dcp_entry *e = &c->entries[i];
  *out = (zck_dcp_entry_info){e->key, e->k.kind, e->is_bytes, e->dtype, e->ndim, e->shape, e->numel,
                              e->is_bytes ? 1 : e->n_chunks};
}

const char *zck_dcp_optim_dir(const zck_dcp *c) { return c->optim_dir; }

zck_status zck_dcp_each_record(const zck_dcp *c, zck_status (*fn)(void *ctx, const zck_dcp_record *r), void *ctx) {
  if (c->safetensors) return ZCK_OK;   /* safetensors keeps no checksum */
  for (size_t i = 0; i < c->n_items; i++) {
    const zck__dcp_item *it = &c->items[i];
    const zck__dcp_entry *e = &c->entries[it->entry];
    const zck__dcp_file *f = &c->files[it->file];
    zck__source win;
    char *name = zck__sprintf("%s: item %s at byte %llu", f->path, e->key, (unsigned long long)it->off);
    if (!name) return ZCK_ERR_NO_MEMORY;
    zck_status s = zck__source_window(&win, &f->src, it->off, it->len, name);
    free(name);
    ZCK_TRY(s);
    zck_zip *z = NULL;
    s = zck_zip_open(&win, &z);
    if (s != ZCK_OK && e->is_bytes && e->k.kind == ZCK_DCP_KEY_OTHER) {
      zck_clear_error();   /* raw bytes of another state (a data loader's): nothing to check */
      s = ZCK_OK;
    }
    for (size_t k = 0; z && s == ZCK_OK && k < zck_zip_count(z); k++) {
      const zck_zip_entry *ze = zck_zip_entry_at(z, k);
      zck_dcp_record r = {f->path, e->key, ze->name, it->off + ze->data_offset, ze->comp_size, ze->crc32, ze->method};
      s = fn(ctx, &r);
    }
    zck_zip_close(z);
    zck__source_close(&win);
    ZCK_TRY(s);
  }
  return ZCK_OK;
}
