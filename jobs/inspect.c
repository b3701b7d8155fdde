/* inspect.c: `zckpt inspect`: what a file or checkpoint holds, as a table or JSON. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io.h"
#include "safetensors/safetensors.h"
#include "source.h"
#include "tensor_set.h"
#include "torch/torch.h"

/* DeepSpeed checkpoints: inspect_deepspeed.c. */
zck_status zck__inspect_deepspeed(const char *path, const zck_inspect_opts *o, FILE *out);
zck_status zck__inspect_universal(const char *path, const zck_inspect_opts *o, FILE *out);
zck_status zck__inspect_h5u(const char *path, const zck_inspect_opts *o, FILE *out);
zck_status zck__inspect_dcp(const char *path, const zck_inspect_opts *o, FILE *out);

static void zck__shape_text(char *buf, size_t n, int ndim, const int64_t *shape) {
  size_t off = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < ndim && off < n; d++) off += (size_t)snprintf(buf + off, n - off, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (off < n) snprintf(buf + off, n - off, "]");
}

static cJSON *zck__shape_json(int ndim, const int64_t *shape) {
  cJSON *a = cJSON_CreateArray();
  for (int d = 0; a && d < ndim; d++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)shape[d]));
  return a;
}

static void zck__print_table(const zck__tensor_set *s, FILE *out) {
  size_t w = 4;
  for (size_t i = 0; i < s->n; i++) if (strlen(s->v[i].name) > w) w = strlen(s->v[i].name);
  if (w > 70) w = 70;
  fprintf(out, "%-*s  %-9s %-20s %14s\n", (int)w, "NAME", "DTYPE", "SHAPE", "BYTES");
  uint64_t total = 0, params = 0;
  for (size_t i = 0; i < s->n; i++) {
    char shape[128];
    const zck__tensor_entry *e = &s->v[i];
    zck__shape_text(shape, sizeof shape, e->ndim, e->shape);
    uint64_t bytes = e->numel * zck_dtype_size(e->dtype);
    total += bytes;
    params += e->numel;
    fprintf(out, "%-*s  %-9s %-20s %14llu\n", (int)w, e->name, zck_dtype_name(e->dtype), shape, (unsigned long long)bytes);
  }
  fprintf(out, "%zu tensors, %llu elements, %llu bytes\n", s->n, (unsigned long long)params, (unsigned long long)total);
}

static cJSON *zck__tensors_json(const zck__tensor_set *s) {
  cJSON *arr = cJSON_CreateArray();
  for (size_t i = 0; arr && i < s->n; i++) {
    const zck__tensor_entry *e = &s->v[i];
    cJSON *t = cJSON_CreateObject();
    cJSON_AddStringToObject(t, "name", e->name);
    cJSON_AddStringToObject(t, "dtype", zck_dtype_name(e->dtype));
    cJSON_AddItemToObject(t, "shape", zck__shape_json(e->ndim, e->shape));
    cJSON_AddNumberToObject(t, "bytes", (double)(e->numel * zck_dtype_size(e->dtype)));
    cJSON_AddItemToArray(arr, t);
  }
  return arr;
}

static zck_status zck__emit_json(cJSON *root, FILE *out) {
  char *text = root ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (!text) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory building JSON");
  fprintf(out, "%s\n", text);
  cJSON_free(text);
  return ZCK_OK;
}

/* Whether a pickle subtree holds a tensor. The tree is a graph: memo references share
 * nodes (a 1.6 KB pickle can hold a 10-ary DAG 40 levels deep, 10^40 paths) and can make
 * cycles, so every node's answer is remembered (and a node being walked counts as holding
 * none: its own walk covers its other children): each node is walked once. */
typedef struct zck__seen {
  const zck_pk **key;
  uint8_t *state;   /* 0 free, 1 being walked, 2 holds none, 3 holds one */
  size_t cap, n;
} zck__seen;

static uint8_t *zck__seen_slot(zck__seen *m, const zck_pk *n) {
  if (2 * (m->n + 1) > m->cap) {
    size_t cap = m->cap ? 2 * m->cap : 256;
    const zck_pk **key = calloc(cap, sizeof *key);
    uint8_t *state = calloc(cap, 1);
    if (!key || !state) { free(key); free(state); return NULL; }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->state[i]) continue;
      size_t j = ((uintptr_t)m->key[i] >> 4) * 0x9E3779B97F4A7C15ull % cap;
      while (state[j]) j = (j + 1) % cap;
      key[j] = m->key[i];
      state[j] = m->state[i];
    }
    free(m->key);
    free(m->state);
    m->key = key;
    m->state = state;
    m->cap = cap;
  }
  size_t j = ((uintptr_t)n >> 4) * 0x9E3779B97F4A7C15ull % m->cap;
  while (m->state[j] && m->key[j] != n) j = (j + 1) % m->cap;
  if (!m->state[j]) m->key[j] = n, m->n++;
  return &m->state[j];
}

static bool zck__holds_tensor_in(const zck_torch_file *f, const zck_pk *n, zck__seen *m, int depth) {
  if (!n || depth > 256) return false; /* as deep as a state dict may nest (the stack stays small) */
  if (zck_torch_tensor_of(f, n)) return true;
  bool dict = n->kind == ZCK_PK_DICT, seq = n->kind == ZCK_PK_LIST || n->kind == ZCK_PK_TUPLE;
  if (!dict && !seq) return false;
  uint8_t *st = zck__seen_slot(m, n);
  if (!st) return false;
  if (*st) return *st == 3;
  *st = 1;
  bool yes = false;
  size_t len = dict ? n->u.dict.len : n->u.seq.len;
  for (size_t i = 0; i < len && !yes; i++)
    yes = zck__holds_tensor_in(f, dict ? n->u.dict.values[i] : n->u.seq.items[i], m, depth + 1);
  *zck__seen_slot(m, n) = yes ? 3 : 2; /* the table may have grown: look it up again */
  return yes;
}

static bool zck__holds_tensor(const zck_torch_file *f, const zck_pk *n, zck__seen *m) {
  return zck__holds_tensor_in(f, n, m, 0);
}

/* A pickled value as JSON: numbers, booleans, None and text as themselves; anything else
 * (containers, objects) as the one-line summary the text output prints. */
static cJSON *zck__pk_scalar_json(const zck_pk *v) {
  int64_t i;
  switch (v->kind) {
  case ZCK_PK_NONE: return cJSON_CreateNull();
  case ZCK_PK_BOOL: return cJSON_CreateBool(v->u.b != 0);
  case ZCK_PK_INT: return zck_pk_as_int(v, &i) ? cJSON_CreateNumber((double)i) : cJSON_CreateNull();
  case ZCK_PK_FLOAT: return cJSON_CreateNumber(v->u.f);
  case ZCK_PK_STR: return cJSON_CreateString(v->u.str.data);
  default: {
    char buf[256];
    zck_pk_summary(v, buf, sizeof buf);
    return cJSON_CreateString(buf);
  }
  }
}

static zck_status zck__inspect_torch(const char *path, const zck_inspect_opts *o, FILE *out) {
  zck__tensor_set s;
  zck__set_init(&s);
  zck_torch_file *f = NULL;
  zck_status st = zck_torch_open(path, NULL, &f);
  if (st != ZCK_OK) return st;
  zck_torch_named *named = NULL;
  size_t count = 0;
  const zck_pk *root = zck_torch_root(f);
  st = zck_torch_state_dict(f, root, &named, &count);
  if (st != ZCK_OK) { zck_torch_close(f); return zck__error_prepend(st, "%s", path); }
  for (size_t i = 0; st == ZCK_OK && i < count; i++) {
    const zck_torch_tensor *t = named[i].tensor;
    st = zck__set_add(&s, named[i].name, t->dtype, t->ndim, t->shape, zck_store_memory(NULL, t->dtype, t->numel, path));
  }
  zck_torch_named_free(named, count);
  int max_values = o->max_values ? o->max_values : 200;
  zck__seen seen = {0};
  if (st == ZCK_OK && o->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", path);
    cJSON_AddStringToObject(j, "format", "torch");
    cJSON_AddStringToObject(j, "prefix", zck_torch_prefix(f));
    cJSON_AddNumberToObject(j, "storages", (double)zck_torch_storage_count(f));
    cJSON_AddItemToObject(j, "tensors", zck__tensors_json(&s));
    cJSON *vals = cJSON_AddObjectToObject(j, "values");
    if (root->kind == ZCK_PK_DICT) {
      for (size_t i = 0; i < root->u.dict.len && (int)i < max_values; i++) {
        const char *k = zck_pk_as_str(root->u.dict.keys[i]);
        if (!k || zck__holds_tensor(f, root->u.dict.values[i], &seen)) continue;
        cJSON_AddItemToObject(vals, k, zck__pk_scalar_json(root->u.dict.values[i]));
      }
    }
    st = zck__emit_json(j, out);
  } else if (st == ZCK_OK) {
    fprintf(out, "%s: torch.save archive (prefix \"%s\", %zu storages)\n", path, zck_torch_prefix(f),
            zck_torch_storage_count(f));
    zck__print_table(&s, out);
    if (root->kind == ZCK_PK_DICT) {
      int shown = 0;
      for (size_t i = 0; i < root->u.dict.len; i++) {
        const zck_pk *v = root->u.dict.values[i];
        if (zck__holds_tensor(f, v, &seen)) continue;
        if (shown++ == 0) fprintf(out, "other values:\n");
        if (shown > max_values) { fprintf(out, "  ...\n"); break; }
        char kb[128], vb[256];
        zck_pk_summary(root->u.dict.keys[i], kb, sizeof kb);
        zck_pk_summary(v, vb, sizeof vb);
        fprintf(out, "  %s = %s\n", kb, vb);
      }
    } else if (s.n == 0) {
      char vb[256];
      zck_pk_summary(root, vb, sizeof vb);
      fprintf(out, "value: %s\n", vb);
    }
  }
  free(seen.key);
  free(seen.state);
  zck__set_free(&s);
  zck_torch_close(f);
  return st;
}

static zck_status zck__inspect_safetensors(const char *path, const zck_inspect_opts *o, FILE *out) {
  zck__tensor_set s;
  zck__set_init(&s);
  zck_hf_checkpoint *c = NULL;
  zck_status st = zck_hf_open(path, &c);
  if (st != ZCK_OK) return st;
  for (size_t i = 0; st == ZCK_OK && i < zck_hf_count(c); i++) {
    const zck_st_tensor *t = zck_hf_tensor_at(c, i)->t;
    int64_t shape[ZCK_SET_MAX_DIMS];
    int nd = t->ndim > ZCK_SET_MAX_DIMS ? ZCK_SET_MAX_DIMS : t->ndim;
    for (int d = 0; d < nd; d++) shape[d] = (int64_t)t->shape[d];
    zck_dtype dt = t->dtype ? t->dtype : ZCK_U8;
    st = zck__set_add(&s, t->name, dt, nd, shape, zck_store_memory(NULL, dt, t->numel, path));
    if (st == ZCK_OK && !t->dtype) s.v[s.n - 1].numel = t->nbytes; /* sub-byte dtypes: count bytes */
  }
  size_t shards = zck_hf_shard_count(c);
  if (st == ZCK_OK && o->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", path);
    cJSON_AddStringToObject(j, "format", "safetensors");
    cJSON_AddNumberToObject(j, "shards", (double)shards);
    cJSON *meta = cJSON_AddObjectToObject(j, "metadata");
    if (shards == 1) {
      const zck_st_file *f = zck_hf_shard(c, 0);
      for (size_t i = 0; i < zck_st_metadata_count(f); i++) {
        const char *k, *v;
        zck_st_metadata_at(f, i, &k, &v);
        cJSON_AddStringToObject(meta, k, v);
      }
    }
    cJSON_AddItemToObject(j, "tensors", zck__tensors_json(&s));
    cJSON *warn = cJSON_AddArrayToObject(j, "warnings");
    for (size_t i = 0; i < zck_hf_warning_count(c); i++) cJSON_AddItemToArray(warn, cJSON_CreateString(zck_hf_warning_at(c, i)));
    st = zck__emit_json(j, out);
  } else if (st == ZCK_OK) {
    fprintf(out, "%s: safetensors (%zu file%s)\n", path, shards, shards == 1 ? "" : "s");
    if (shards == 1) {
      const zck_st_file *f = zck_hf_shard(c, 0);
      for (size_t i = 0; i < zck_st_metadata_count(f); i++) {
        const char *k, *v;
        zck_st_metadata_at(f, i, &k, &v);
        fprintf(out, "metadata: %s = %s\n", k, v);
      }
    }
    zck__print_table(&s, out);
    for (size_t i = 0; i < zck_hf_warning_count(c); i++) fprintf(out, "warning: %s\n", zck_hf_warning_at(c, i));
  }
  zck__set_free(&s);
  zck_hf_close(c);
  return st;
}

static bool zck__insp_is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static bool zck__insp_is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

zck_status zck_inspect(const char *path, const zck_inspect_opts *opts, void *vout) {
  zck_inspect_opts o = ZCK_INSPECT_OPTS_INIT;
  ZCK_TRY(zck__opts_load(&o, sizeof o, opts, "zck_inspect"));
  FILE *out = vout ? vout : stdout;
  ZCK_TRY(zck__src_refuse_known(path));
  switch (zck__src_sniff(path)) {
  case ZCK__SRC_UNIVERSAL: return zck__inspect_universal(path, &o, out);
  case ZCK__SRC_HDF5: return zck__inspect_h5u(path, &o, out);
  case ZCK__SRC_TORCH: return zck__inspect_torch(path, &o, out);
  case ZCK__SRC_SAFETENSORS:
  case ZCK__SRC_HF: return zck__inspect_safetensors(path, &o, out);
  case ZCK__SRC_DEEPSPEED: return zck__inspect_deepspeed(path, &o, out);
  case ZCK__SRC_DCP: return zck__inspect_dcp(path, &o, out);
  default: break;
  }
  /* a file or folder that cannot be read is not "unrecognised": say why */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0 && errno != ENOENT) return zck__fail_errno(errno, "%s: cannot open", path);
  if (fd >= 0) close(fd);
  if (fd >= 0 && !zck__insp_is_file(path) && !zck__insp_is_dir(path))
    return zck__fail(ZCK_ERR_FORMAT, "%s: not a regular file or folder", path);
  zck__tensor_set s;
  zck__set_init(&s);
  zck_status st = zck__set_from_path(&s, path); /* sets the right "not found / not a ..." message */
  zck__set_free(&s);
  return st == ZCK_OK ? zck__fail(ZCK_ERR_FORMAT, "%s: unrecognised file", path) : st;
}
