/* ds_autotp_plan.c: DeepSpeed 0.19.8's AutoTP split at another TP size, as the
 * universal_checkpoint_info its engine would save there.
 *
 * An AutoTP checkpoint records how its own TP size cut every parameter (the affine map, see
 * ds_autotp.c), but not how another TP size would: that depends on the model config.
 * DeepSpeed sizes each split with get_shard_size_list(total, tp, meta, name)
 * (module_inject/tp_shard.py): a layer whose name holds no "mlp" (nor an MoE MLP name), is
 * not exactly "lm_head"/"embed_out", and whose dimension the kv-head count divides, is cut
 * by kv heads (rank r: kv // tp (+1 if r < kv % tp) heads' worth); every other one by
 * tp_grain_size grains (the remainder to the last rank). A rank may get none (more TP ranks
 * than kv heads): an empty shard, as DeepSpeed makes. A vocabulary-parallel embedding
 * tied to the head takes the head's sizes ("lm_head"). The kind of each split comes from:
 *   - the source's affine map, when the source is AutoTP: each entry must be exactly
 *     DeepSpeed's replicated_map or contiguous_split_map (module_inject/layers.py
 *     _derive_affine_map), the sizes the rule gives at the source's TP size must be the
 *     recorded ones, and the pattern lists re-derived from the kinds must be the recorded
 *     ones; anything else (fused qkv sub-params, gathered blocks, scaled pieces) is refused;
 *   - else the Llama plan DeepSpeed follows for transformers' LlamaForCausalLM
 *     (base_model_tp_plan: q/k/v/gate/up column, o/down row; lm_head column, gathered;
 *     a tied embedding + head vocabulary-parallel, by the embedding_rowwise entry
 *     transformers' init_parallel_plans adds; norms and an untied embedding replicated),
 *     only for model_type "llama" without biases, saved by transformers 5.23 or later
 *     (the version this was checked with; the plan changes between versions).
 * The result is built as collect_autotp_universal_checkpoint_info builds it (key order,
 * shared strings), so a file carrying it equals DeepSpeed's own byte for byte. */
#include "ds_internal.h"
#include "io.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum { TP_REPL, TP_SPLIT } tp_kind;

typedef struct tp_param {
  uint32_t p;            /* index into the full model */
  tp_kind kind;
  int dim;               /* TP_SPLIT: 0 (column / vocabulary) or 1 (row) */
  const char *size_name; /* the layer name DeepSpeed sizes the split by */
  zck_pk *pattern;       /* "^" + re.escape(name) + "$", one node (DeepSpeed shares the str) */
} tp_param;

typedef struct tp_cfg {
  int64_t kv_heads;      /* -1: none */
  int64_t grain;
} tp_cfg;

/* The constant keys, one node each per document (Python's interned str constants are one
 * object, pickled once and fetched from the memo after). */
typedef struct keys {
  zck_pk_doc *d;
  zck_pk *logical_shape, *ranks, *shard_shape, *pieces, *shape, *source, *dest, *locations;
} keys;

// ---- DeepSpeed's sizes (tp_shard.get_shard_size)

static bool has(const char *s, const char *sub) { return strstr(s, sub) != NULL; }

static int64_t shard_size(int64_t total, int64_t tp, const tp_cfg *c, const char *name, int64_t r) {
  static const char *moe[] = {"gate_proj", "up_proj", "down_proj", "w1", "w2", "w3"};
  bool not_moe = true;
  for (size_t i = 0; i < sizeof moe / sizeof *moe; i++) not_moe &= !has(name, moe[i]);
  if (c->kv_heads > 0 && total % c->kv_heads == 0 && !has(name, "mlp") && strcmp(name, "lm_head") &&
      strcmp(name, "embed_out") && not_moe) {
    int64_t slices = c->kv_heads / tp + (r < c->kv_heads % tp ? 1 : 0);
    return total * slices / c->kv_heads;
  }
  if (total >= c->grain) {
    int64_t grains = total / c->grain, rem = total % c->grain;
    int64_t n = (grains / tp + (r < grains % tp ? 1 : 0)) * c->grain;
    return r == tp - 1 ? n + rem : n;
  }
  return total / tp + (r < total % tp ? 1 : 0);
}

// ---- pickle trees as affine.py's to_dict writes them

static zck_pk *int_list(zck_pk_doc *d, int n, const int64_t *v) {
  zck_pk *l = zck_pk_new_list(d);
  for (int i = 0; l && i < n; i++)
    if (!zck_pk_append(d, l, zck_pk_new_int(d, v[i]))) return NULL;
  return l;
}

static void row_major(int nd, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int i = nd; i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
}

static bool put(zck_pk_doc *d, zck_pk *dict, zck_pk *k, zck_pk *v) { return k && v && zck_pk_dict_set(d, dict, k, v); }

static zck_pk *side(zck_pk_doc *d, int64_t off, int nd, const int64_t *strides) {
  zck_pk *l = zck_pk_new_list(d);
  if (!l || !zck_pk_append(d, l, zck_pk_new_int(d, off)) || !zck_pk_append(d, l, int_list(d, nd, strides))) return NULL;
  return l;
}

/* One piece: shape, source (offset, strides) in the full tensor, dest in the shard, locations. */
static zck_pk *piece(keys *K, int nd, const int64_t *shape, int64_t soff, const int64_t *sstr, const int64_t *dstr,
                     int64_t lo, int64_t hi) {
  zck_pk_doc *d = K->d;
  zck_pk *pc = zck_pk_new_dict(d, 0), *loc = zck_pk_new_list(d);
  for (int64_t r = lo; loc && r < hi; r++)
    if (!zck_pk_append(d, loc, zck_pk_new_int(d, r))) return NULL;
  if (!pc || !put(d, pc, K->shape, int_list(d, nd, shape)) || !put(d, pc, K->source, side(d, soff, nd, sstr)) ||
      !put(d, pc, K->dest, side(d, 0, nd, dstr)) || !put(d, pc, K->locations, loc))
    return NULL;
  return pc;
}

/* replicated_map(shape, T), or contiguous_split_map(shape, sizes, dim) when sizes. */
static zck_pk *affine_entry(keys *K, int nd, const int64_t *shape, uint32_t T, int dim, const int64_t *sizes) {
  zck_pk_doc *d = K->d;
  int64_t full_str[ZCK_MAX_DIMS], shard[ZCK_MAX_DIMS], str[ZCK_MAX_DIMS];
  row_major(nd, shape, full_str);
  zck_pk *e = zck_pk_new_dict(d, 0), *ranks = zck_pk_new_dict(d, 0);
  if (!e || !ranks || !put(d, e, K->logical_shape, int_list(d, nd, shape)) || !put(d, e, K->ranks, ranks)) return NULL;
  int64_t start = 0;
  for (uint32_t r = 0; r < T; r++) {
    memcpy(shard, shape, (size_t)nd * sizeof *shard);
    if (sizes) shard[dim] = sizes[r];
    row_major(nd, shard, str);
    zck_pk *re = zck_pk_new_dict(d, 0), *pcs = zck_pk_new_list(d);
    zck_pk *pc = sizes ? piece(K, nd, shard, start * full_str[dim], full_str, str, r, r + 1)
                       : piece(K, nd, shape, 0, full_str, full_str, 0, T);
    if (!re || !pcs || !zck_pk_append(d, pcs, pc) || !put(d, re, K->shard_shape, int_list(d, nd, shard)) ||
        !put(d, re, K->pieces, pcs) || !put(d, ranks, zck_pk_new_int(d, r), re))
      return NULL;
    if (sizes) start += sizes[r];
  }
  return e;
}

/* Structural equality (the loaded source entry vs the one built here). */
static bool pk_equal(const zck_pk *a, const zck_pk *b) {
  if (!a || !b) return a == b;
  int64_t x, y;
  if (zck_pk_as_int(a, &x) && zck_pk_as_int(b, &y)) return x == y && a->kind == b->kind;
  if (a->kind != b->kind) return false;
  switch (a->kind) {
  case ZCK_PK_NONE: return true;
  case ZCK_PK_BOOL: return a->u.b == b->u.b;
  case ZCK_PK_FLOAT: return a->u.f == b->u.f;
  case ZCK_PK_STR: return a->u.str.len == b->u.str.len && !memcmp(a->u.str.data, b->u.str.data, a->u.str.len);
  case ZCK_PK_LIST:
  case ZCK_PK_TUPLE:
    if (a->u.seq.len != b->u.seq.len) return false;
    for (size_t i = 0; i < a->u.seq.len; i++)
      if (!pk_equal(a->u.seq.items[i], b->u.seq.items[i])) return false;
    return true;
  case ZCK_PK_DICT:
    if (a->u.dict.len != b->u.dict.len) return false;
    for (size_t i = 0; i < a->u.dict.len; i++)
      if (!pk_equal(a->u.dict.keys[i], b->u.dict.keys[i]) || !pk_equal(a->u.dict.values[i], b->u.dict.values[i]))
        return false;
    return true;
  default: return false;
  }
}

/* "^" + re.escape(name) + "$" (Python 3.7+: these characters get a backslash). */
static zck_pk *pattern(zck_pk_doc *d, const char *name) {
  size_t n = strlen(name);
  char *s = zck__calloc(2 * n + 3, 1);
  if (!s) return NULL;
  size_t k = 0;
  s[k++] = '^';
  for (size_t i = 0; i < n; i++) {
    if (strchr("()[]{}?*+-|^$\\.&~# \t\n\r\v\f", name[i])) s[k++] = '\\';
    s[k++] = name[i];
  }
  s[k++] = '$';
  zck_pk *p = zck_pk_new_str(d, s);
  free(s);
  return p;
}

// ---- the inputs: config.json and ds_config['tensor_parallel']

static const zck_pk *tp_section(const zck_pk *ds_config) {
  const zck_pk *t = zck_pk_dict_get(ds_config, "tensor_parallel");
  return t && t->kind == ZCK_PK_DICT ? t : NULL;
}

static zck_status read_tp_config(const zck_pk *ds_config, bool rule_path, tp_cfg *c) {
  c->grain = 1;
  const zck_pk *t = tp_section(ds_config);
  if (!t) return ZCK_OK;
  static const char *custom[] = {"partition_config", "preset_model"};
  for (size_t i = 0; i < 2; i++) {
    const zck_pk *v = zck_pk_dict_get(t, custom[i]);
    if (v && v->kind != ZCK_PK_NONE)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "ds_config tensor_parallel.%s: a custom AutoTP plan: another TP size is not "
                       "supported", custom[i]);
  }
  const zck_pk *v = zck_pk_dict_get(t, "vocab_parallel_lm_head");
  if (rule_path && v && v->kind != ZCK_PK_NONE)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "ds_config tensor_parallel.vocab_parallel_lm_head is set: zckpt knows the "
                     "Llama split only with its default");
  for (const char *k = "tp"; k; k = strcmp(k, "tp") ? NULL : "tensor_parallel") {
    const zck_pk *g = zck_pk_dict_get(zck_pk_dict_get(t, k), "tp_grain_size");
    if (g && (!zck_pk_as_int(g, &c->grain) || c->grain < 1))
      return zck__fail(ZCK_ERR_FORMAT, "ds_config tensor_parallel.%s.tp_grain_size is not a positive integer", k);
  }
  return ZCK_OK;
}

/* AutoTPMeta.from_model_config: the first non-null kv-head count, in text_config if present. */
static zck_status read_model_config(const char *file, const char *path, bool rule_path, tp_cfg *c) {
  char *text = NULL;
  size_t len = 0;
  zck_status s = zck__read_small_file(file, 16u << 20, &text, &len);
  if (s != ZCK_OK) {
    zck_clear_error();
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: cannot read the model config (DeepSpeed's split at another TP size depends "
                     "on it; give --model-config FILE)", path);
  }
  cJSON *j = cJSON_ParseWithLength(text, len);
  free(text);
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    return zck__fail(ZCK_ERR_FORMAT, "%s: not a JSON object (a model config.json)", path);
  }
  const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
  const char *type = cJSON_IsString(mt) ? mt->valuestring : NULL;
  static const char *known[] = {"llama", "mistral", "qwen2"};
  bool ok = false;
  for (size_t i = 0; type && i < (rule_path ? 1 : 3); i++) ok |= !strcmp(type, known[i]);
  if (!ok) {
    s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: model_type %s%s%s: zckpt knows DeepSpeed's AutoTP split at another TP size "
                  "only for %s", path, type ? "'" : "", type ? type : "missing", type ? "'" : "",
                  rule_path ? "llama (from a checkpoint without an affine map)" : "llama, mistral and qwen2");
    cJSON_Delete(j);
    return s;
  }
  if (rule_path) {
    /* the plan is transformers' (a tied embedding goes vocabulary-parallel through the
     * embedding_rowwise entry recent versions add): checked here for 5.23 */
    const cJSON *tv = cJSON_GetObjectItemCaseSensitive(j, "transformers_version");
    int major = 0, minor = 0;
    if (!cJSON_IsString(tv) || sscanf(tv->valuestring, "%d.%d", &major, &minor) != 2 ||
        major * 1000 + minor < 5 * 1000 + 23) {
      s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: transformers_version %s: zckpt knows the Llama plan DeepSpeed follows "
                    "from a checkpoint without an affine map for transformers 5.23 and later", path,
                    cJSON_IsString(tv) ? tv->valuestring : "missing");
      cJSON_Delete(j);
      return s;
    }
    static const char *bias[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < 2; i++)
      if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, bias[i]))) {
        s = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s: a Llama with biases is not supported at another TP size", path, bias[i]);
        cJSON_Delete(j);
        return s;
      }
  }
  const cJSON *tc = cJSON_GetObjectItemCaseSensitive(j, "text_config");
  const cJSON *o = cJSON_IsObject(tc) ? tc : j;
  static const char *kv[] = {"num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv",
                             "kv_n_heads", "num_attention_heads", "n_heads", "attention_heads"};
  c->kv_heads = -1;
  for (size_t i = 0; i < sizeof kv / sizeof *kv && c->kv_heads < 0; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, kv[i]);
    if (!v || cJSON_IsNull(v)) continue;
    if (!cJSON_IsNumber(v) || v->valuedouble < 1 || v->valuedouble != (double)(int64_t)v->valuedouble) {
      s = zck__fail(ZCK_ERR_FORMAT, "%s: %s is not a positive integer", path, kv[i]);
      cJSON_Delete(j);
      return s;
    }
    c->kv_heads = (int64_t)v->valuedouble;
  }
  cJSON_Delete(j);
  return ZCK_OK;
}

// ---- the kinds

static const char *module_of(const char *name, char *buf, size_t n) {
  snprintf(buf, n, "%s", name);
  char *dot = strrchr(buf, '.');
  if (dot) *dot = 0;
  return buf;
}

static bool last_is_head(const char *module) {
  const char *dot = strrchr(module, '.');
  const char *last = dot ? dot + 1 : module;
  return !strcmp(last, "lm_head") || !strcmp(last, "embed_out");
}

/* head[p]: the alias of p named as a head (a tied head), or -1; one pass. */
static int64_t *tied_heads(const zck_model *m) {
  int64_t *head = zck__calloc(m->n_params + 1, sizeof *head);
  if (!head) return NULL;
  for (size_t p = 0; p < m->n_params; p++) head[p] = -1;
  char buf[1024];
  for (size_t q = 0; q < m->n_params; q++)
    if (m->params[q].tied_to >= 0 && head[m->params[q].tied_to] < 0 &&
        last_is_head(module_of(m->params[q].name, buf, sizeof buf)))
      head[m->params[q].tied_to] = (int64_t)q;
  return head;
}

/* Llama's plan (model_type llama, no biases): name -> kind; false if the name is not one. */
static bool llama_kind(const char *name, tp_kind *kind, int *dim, bool *meta) {
  static const char *col[] = {".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
                              ".mlp.gate_proj.weight", ".mlp.up_proj.weight"};
  static const char *row[] = {".self_attn.o_proj.weight", ".mlp.down_proj.weight"};
  static const char *norm[] = {".input_layernorm.weight", ".post_attention_layernorm.weight"};
  *meta = true;
  *kind = TP_SPLIT;
  if (!strcmp(name, "lm_head.weight")) { *dim = 0; return true; }
  if (!strcmp(name, "model.norm.weight")) { *kind = TP_REPL; *meta = false; return true; }
  if (strncmp(name, "model.layers.", 13)) return false;
  const char *s = name + 13;
  if (*s < '0' || *s > '9') return false;
  while (*s >= '0' && *s <= '9') s++;
  for (size_t i = 0; i < 5; i++) if (!strcmp(s, col[i])) { *dim = 0; return true; }
  for (size_t i = 0; i < 2; i++) if (!strcmp(s, row[i])) { *dim = 1; return true; }
  for (size_t i = 0; i < 2; i++) if (!strcmp(s, norm[i])) { *kind = TP_REPL; *meta = false; return true; }
  return false;
}

static zck_status rule_kinds(const zck_model *m, const int64_t *heads, tp_param *tp, size_t *n, char **names) {
  size_t k = 0;
  /* layers with DeepSpeed metadata first, then the untouched (replicated) params, each in
   * module order (collect_autotp_universal_checkpoint_info) */
  for (int pass = 0; pass < 2; pass++)
    for (size_t p = 0; p < m->n_params; p++) {
      const zck_param *pp = &m->params[p];
      if (pp->tied_to >= 0) continue;
      tp_kind kind;
      int dim = 0;
      bool meta;
      if (!strcmp(pp->name, "model.embed_tokens.weight")) {
        bool tied = heads[p] >= 0;
        kind = tied ? TP_SPLIT : TP_REPL;
        meta = tied;
      } else if (!llama_kind(pp->name, &kind, &dim, &meta)) {
        return zck__fail(ZCK_ERR_UNSUPPORTED, "parameter '%s' is not one of a Llama's: its AutoTP split is unknown",
                         pp->name);
      }
      if (meta != (pass == 0)) continue;
      if (kind == TP_SPLIT && pp->ndim != 2)
        return zck__fail(ZCK_ERR_FORMAT, "parameter '%s' is not 2-D", pp->name);
      tp[k] = (tp_param){(uint32_t)p, kind, dim, NULL, NULL};
      char buf[1024];
      names[k] = zck__strdup(module_of(heads[p] >= 0 ? m->params[heads[p]].name : pp->name, buf, sizeof buf));
      if (!names[k]) return ZCK_ERR_NO_MEMORY;
      tp[k].size_name = names[k];
      k++;
    }
  *n = k;
  return ZCK_OK;
}

/* map_kinds' walk over the entries (seen: the params already described). */
static zck_status map_entries(const zck_model *m, const int64_t *heads, const zck_pk *amp, uint32_t T0,
                              const tp_cfg *c, keys *K, tp_param *tp, size_t *n, char **names, bool *seen) {
  size_t k = 0;
  for (size_t i = 0; i < amp->u.dict.len; i++) {
    const char *pat = zck_pk_as_str(amp->u.dict.keys[i]);
    char *lit = pat ? zck__calloc(strlen(pat) + 1, 1) : NULL;
    if (pat && !lit) return ZCK_ERR_NO_MEMORY;
    int64_t p = lit && zck_ds_pattern_name(pat, lit) ? zck_model_find_param(m, lit) : -1;
    free(lit);
    if (p < 0 || m->params[p].tied_to >= 0 || k >= m->n_params || seen[p]) {
      return zck__fail(ZCK_ERR_UNSUPPORTED, "affine_map entry '%.200s' is not one saved parameter (or a second entry "
                       "for one)", pat ? pat : "?");
    }
    seen[p] = true;
    const zck_param *pp = &m->params[p];
    const zck_pk *ranks = zck_pk_dict_get(amp->u.dict.values[i], "ranks");
    int64_t sizes[4096], sh[ZCK_MAX_DIMS];
    int dim = -1;
    for (uint32_t r = 0; r < T0; r++) {
      const zck_pk *re = NULL;
      for (size_t j = 0; ranks && ranks->kind == ZCK_PK_DICT && j < ranks->u.dict.len; j++) {
        int64_t key;
        if (zck_pk_as_int(ranks->u.dict.keys[j], &key) && key == r) re = ranks->u.dict.values[j];
      }
      const zck_pk *ss = zck_pk_dict_get(re, "shard_shape");
      if (!ss || ss->kind != ZCK_PK_LIST || ss->u.seq.len != (size_t)pp->ndim)
        return zck__fail(ZCK_ERR_FORMAT, "affine_map of '%s': TP rank %u has no shard_shape of %d dims", pp->name, r,
                         pp->ndim);
      for (int dd = 0; dd < pp->ndim; dd++) {
        if (!zck_pk_as_int(ss->u.seq.items[dd], &sh[dd]))
          return zck__fail(ZCK_ERR_FORMAT, "affine_map of '%s': shard_shape is not a list of ints", pp->name);
        if (sh[dd] != pp->shape[dd]) dim = dim < 0 || dim == dd ? dd : 99;
      }
    }
    if (dim == 99 || dim > 1)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "affine_map of '%s' is cut along several dimensions: not supported", pp->name);
    tp_param x = {(uint32_t)p, dim < 0 ? TP_REPL : TP_SPLIT, dim < 0 ? 0 : dim, NULL, NULL};
    char buf[1024];
    int64_t head = heads[p];
    names[k] = zck__strdup(module_of(head >= 0 && dim == 0 ? m->params[head].name : pp->name, buf, sizeof buf));
    if (!names[k]) return ZCK_ERR_NO_MEMORY;
    x.size_name = names[k];
    if (x.kind == TP_SPLIT) {
      for (uint32_t r = 0; r < T0; r++) {
        const zck_pk *re = NULL;
        for (size_t j = 0; j < ranks->u.dict.len; j++) {
          int64_t key;
          if (zck_pk_as_int(ranks->u.dict.keys[j], &key) && key == r) re = ranks->u.dict.values[j];
        }
        zck_pk_as_int(zck_pk_dict_get(re, "shard_shape")->u.seq.items[dim], &sizes[r]);
      }
    }
    zck_pk *want = affine_entry(K, pp->ndim, pp->shape, T0, dim, x.kind == TP_SPLIT ? sizes : NULL);
    if (!want) return ZCK_ERR_NO_MEMORY;
    if (!pk_equal(want, amp->u.dict.values[i]))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "affine_map of '%s' is not one of DeepSpeed's replicated or contiguous "
                       "splits (fused sub-parameters, gathered blocks or scaled pieces): another TP size is not "
                       "supported", pp->name);
    for (uint32_t r = 0; x.kind == TP_SPLIT && r < T0; r++)
      if (shard_size(pp->shape[dim], T0, c, x.size_name, r) != sizes[r])
        return zck__fail(ZCK_ERR_MISMATCH, "'%s': DeepSpeed's split at TP %u by this model config (%lld kv heads, "
                         "tp_grain_size %lld) gives TP rank %u %lld of %lld, the checkpoint holds %lld: the config does "
                         "not describe this checkpoint", pp->name, T0, (long long)c->kv_heads, (long long)c->grain, r,
                         (long long)shard_size(pp->shape[dim], T0, c, x.size_name, r), (long long)pp->shape[dim],
                         (long long)sizes[r]);
    tp[k++] = x;
  }
  *n = k;
  return ZCK_OK;
}

/* The kinds from the source's affine map: each entry is rebuilt from its kind and sizes and
 * must equal the recorded one; the rule must give the recorded sizes. */
static zck_status map_kinds(const zck_model *m, const int64_t *heads, const zck_pk *amp, uint32_t T0, const tp_cfg *c,
                            keys *K, tp_param *tp, size_t *n, char **names) {
  bool *seen = zck__calloc(m->n_params + 1, sizeof *seen);
  zck_status s = seen ? map_entries(m, heads, amp, T0, c, K, tp, n, names, seen) : ZCK_ERR_NO_MEMORY;
  free(seen);
  return s;
}


// ---- the universal_checkpoint_info

static int cmp_str_node(const void *a, const void *b) {
  return strcmp(zck_pk_as_str(*(zck_pk *const *)a), zck_pk_as_str(*(zck_pk *const *)b));
}

static zck_pk *str_list(zck_pk_doc *d, zck_pk **v, size_t n) {
  /* sorted(set(...)) of distinct patterns: str order is code point order (UTF-8 byte order) */
  qsort(v, n, sizeof *v, cmp_str_node);
  zck_pk *l = zck_pk_new_list(d);
  for (size_t i = 0; l && i < n; i++)
    if (!zck_pk_append(d, l, v[i])) return NULL;
  return l;
}

static zck_pk *skey(zck_pk_doc *d, const char *s) { return zck_pk_new_str(d, s); }

static zck_status build_uci(keys *K, const zck_model *m, tp_param *tp, size_t n, uint32_t T, const tp_cfg *c,
                            const zck_pk *version, zck_pk **out) {
  zck_pk_doc *d = K->d;
  zck_pk **row = zck__calloc(n + 1, sizeof *row), **rep = zck__calloc(n + 1, sizeof *rep),
         **voc = zck__calloc(n + 1, sizeof *voc);
  zck_pk *amp = zck_pk_new_dict(d, 0);
  zck_status s = row && rep && voc && amp ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  size_t nr = 0, nrep = 0, nv = 0;
  int64_t vocab = -1;
  int64_t *sizes = zck__calloc(T + 1, sizeof *sizes);
  if (!sizes) s = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; s == ZCK_OK && i < n; i++) {
    const zck_param *pp = &m->params[tp[i].p];
    if (!(tp[i].pattern = pattern(d, pp->name))) { s = ZCK_ERR_NO_MEMORY; break; }
    if (tp[i].kind == TP_REPL) {
      rep[nrep++] = tp[i].pattern;
    } else {
      /* a rank may get none (more TP ranks than kv heads): an empty shard, which ZeRO saves as
       * a frozen zero-element param on that rank (zck_ds_autotp_shard_model) */
      int64_t total = pp->shape[tp[i].dim];
      for (uint32_t r = 0; r < T; r++) sizes[r] = shard_size(total, T, c, tp[i].size_name, r);
      if (tp[i].dim == 1) row[nr++] = tp[i].pattern;
      if (tp[i].dim == 0 && pp->ndim == 2 && (has(pp->name, "embed") || has(pp->name, "lm_head"))) {
        voc[nv++] = tp[i].pattern;
        if (vocab < 0) vocab = pp->shape[0];
      }
    }
    zck_pk *e = affine_entry(K, pp->ndim, pp->shape, T, tp[i].dim, tp[i].kind == TP_SPLIT ? sizes : NULL);
    if (!put(d, amp, tp[i].pattern, e)) s = ZCK_ERR_NO_MEMORY;
  }
  zck_pk *u = s == ZCK_OK ? zck_pk_new_dict(d, 0) : NULL, *am = s == ZCK_OK ? zck_pk_new_dict(d, 0) : NULL;
  if (s == ZCK_OK &&
      (!u || !am || !put(d, u, skey(d, "universal_checkpoint_version"), version ? zck__ds_pk_copy(d, version)
                                                                                 : zck_pk_new_float(d, 0.4)) ||
       !put(d, u, skey(d, "parameter_with_row_parallelism_patterns"), str_list(d, row, nr)) ||
       !put(d, u, skey(d, "tp_replicated_parameter_patterns"), str_list(d, rep, nrep)) ||
       !put(d, u, skey(d, "vocabulary_parameter_patterns"), str_list(d, voc, nv)) ||
       !put(d, u, skey(d, "parameter_with_sub_params"), zck_pk_new_list(d)) ||
       !put(d, u, skey(d, "autotp_unsupported_parameter_patterns"), zck_pk_new_dict(d, 0)) ||
       (vocab >= 0 && !put(d, u, skey(d, "original_vocab_size"), zck_pk_new_int(d, vocab))) ||
       !put(d, am, skey(d, "version"), zck_pk_new_int(d, 1)) || !put(d, am, skey(d, "params"), amp) ||
       !put(d, u, skey(d, "affine_map"), am)))
    s = ZCK_ERR_NO_MEMORY;
  free(row);
  free(rep);
  free(voc);
  free(sizes);
  *out = s == ZCK_OK ? u : NULL;
  return s;
}

/* The source's pattern lists must be the ones its kinds give (else the map holds a layout
 * this file does not model). */
static zck_status same_lists(const zck_pk *src, const zck_pk *mine) {
  static const char *k[] = {"parameter_with_row_parallelism_patterns", "tp_replicated_parameter_patterns",
                            "vocabulary_parameter_patterns", "parameter_with_sub_params",
                            "autotp_unsupported_parameter_patterns", "original_vocab_size"};
  for (size_t i = 0; i < sizeof k / sizeof *k; i++)
    if (!pk_equal(zck_pk_dict_get(src, k[i]), zck_pk_dict_get(mine, k[i])))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "universal_checkpoint_info['%s'] is not what the affine map's splits give: "
                       "another TP size is not supported", k[i]);
  return ZCK_OK;
}

/* ds_config with tensor_parallel.autotp_size = T (added when absent). */
static zck_pk *target_ds_config(zck_pk_doc *d, const zck_pk *cfg, uint32_t T) {
  zck_pk *c = cfg && cfg->kind == ZCK_PK_DICT ? zck__ds_pk_copy(d, cfg) : NULL;
  if (!c) return NULL;
  zck_pk *t = zck__ds_pk_get_mut(c, "tensor_parallel");
  if (!t || t->kind != ZCK_PK_DICT) {
    if (!(t = zck_pk_new_dict(d, 0)) || !put(d, c, skey(d, "tensor_parallel"), t)) return NULL;
  }
  for (size_t i = 0; i < t->u.dict.len; i++) {
    const char *k = zck_pk_as_str(t->u.dict.keys[i]);
    if (k && !strcmp(k, "autotp_size")) {
      t->u.dict.values[i] = zck_pk_new_int(d, T);
      return t->u.dict.values[i] ? c : NULL;
    }
  }
  return put(d, t, skey(d, "autotp_size"), zck_pk_new_int(d, T)) ? c : NULL;
}

zck_status zck_ds_autotp_plan(const zck_ds_autotp_plan_in *in, uint32_t T, zck_ds_autotp_plan_out *out) {
  memset(out, 0, sizeof *out);
  const zck_model *m = in->full;
  const zck_pk *amp = zck_pk_dict_get(zck_pk_dict_get(in->src_uci, "affine_map"), "params");
  bool rule_path = !in->src_uci;
  if (in->src_uci && (!amp || amp->kind != ZCK_PK_DICT))
    return zck__fail(ZCK_ERR_UNSUPPORTED, "no universal_checkpoint_info['affine_map']: the source's split is unknown");
  if (T < 2 || T > 4096 || (!rule_path && (in->src_tp < 2 || in->src_tp > 4096)))
    return zck__fail(ZCK_ERR_INVALID_ARG, "TP size %u from %u", T, in->src_tp);
  tp_cfg c = {-1, 1};
  ZCK_TRY(read_tp_config(in->ds_config, rule_path, &c));
  ZCK_TRY(read_model_config(in->config_path, in->config_label ? in->config_label : in->config_path, rule_path, &c));
  zck_pk_doc *d = zck_pk_doc_new();
  tp_param *tp = zck__calloc(m->n_params + 1, sizeof *tp);
  int64_t *heads = tied_heads(m);
  char **names = zck__calloc(m->n_params + 1, sizeof *names);
  keys K;
  memset(&K, 0, sizeof K);
  K.d = d;
  zck_status s = d && tp && names && heads ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (s == ZCK_OK) {
    K.logical_shape = skey(d, "logical_shape");
    K.ranks = skey(d, "ranks");
    K.shard_shape = skey(d, "shard_shape");
    K.pieces = skey(d, "pieces");
    K.shape = skey(d, "shape");
    K.source = skey(d, "source");
    K.dest = skey(d, "dest");
    K.locations = skey(d, "locations");
    if (!K.logical_shape || !K.ranks || !K.shard_shape || !K.pieces || !K.shape || !K.source || !K.dest || !K.locations)
      s = ZCK_ERR_NO_MEMORY;
  }
  size_t n = 0;
  if (s == ZCK_OK)
    s = rule_path ? rule_kinds(m, heads, tp, &n, names) : map_kinds(m, heads, amp, in->src_tp, &c, &K, tp, &n, names);
  size_t owners = 0;
  for (size_t p = 0; p < m->n_params; p++) owners += m->params[p].tied_to < 0;
  if (s == ZCK_OK && n != owners)
    s = zck__fail(ZCK_ERR_UNSUPPORTED, "the affine map describes %zu of %zu parameters", n, owners);
  const zck_pk *version = zck_pk_dict_get(in->src_uci, "universal_checkpoint_version");
  zck_pk *check = NULL, *uci = NULL;
  if (s == ZCK_OK && !rule_path) s = build_uci(&K, m, tp, n, in->src_tp, &c, version, &check);
  if (s == ZCK_OK && !rule_path) s = same_lists(in->src_uci, check);
  if (s == ZCK_OK) s = build_uci(&K, m, tp, n, T, &c, version, &uci);
  zck_pk *cfg = NULL;
  if (s == ZCK_OK && in->ds_config && !(cfg = target_ds_config(d, in->ds_config, T))) s = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; names && i < m->n_params; i++) free(names[i]);
  free(names);
  free(tp);
  free(heads);
  if (s != ZCK_OK) {
    zck_pk_doc_free(d);
    return s;
  }
  out->doc = d;
  out->uci = uci;
  out->ds_config = cfg;
  return ZCK_OK;
}

void zck_ds_autotp_plan_free(zck_ds_autotp_plan_out *p) {
  if (p) zck_pk_doc_free(p->doc);
}
