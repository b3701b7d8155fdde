/* consolidate_torch_st.c: zck_dcp_consolidate_safetensors, torch's
 * consolidate_safetensors_files(dir, out, fqn_to_index_mapping) as a job, for a DCP saved
 * with safetensors storage (HuggingFaceStorageWriter(save_distributed=True)).
 *
 * The recipe is consolidate's (open the source, reserve the output, zck_transfer, commit);
 * only the output's shape is torch's: which file each tensor goes in and in what order
 * (the mapping), and how the files and the index are written (the HF writer's torch_dcp
 * layout, formats/safetensors). The mapping is the caller's JSON, as torch takes it
 * ({fqn: index}) or as torchtitan makes it from a model.safetensors.index.json (weight_map:
 * fqn -> "model-<i>-of-<n>.safetensors"), in its order; without one, the mapping the save
 * used, as far as the shard names keep it: each tensor in the file <i> of its
 * shard-<r>-model-<i>-of-<n> names (all in 1 when saved without a mapping, which is what
 * the writer's own finish() passes then), files in increasing <i>, each in the order of
 * state_dict_metadata (first seen in DCP_SHARDING_INFO, shard by shard): exact for a save
 * without a mapping; with one, torch follows the mapping's order, which the shards do not
 * keep (docs/layouts.md says when the guess holds).
 *
 * What torch cannot write is refused in one line instead: a 0-d tensor (torch writes zeros
 * for it), integer or bool tensors (torch.finfo raises), a mapping naming a tensor the
 * checkpoint lacks (torch writes an entry of dtype "") or leaving one out (torch drops it;
 * the writer itself raises on such a save). */
#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

#include "consolidate_internal.h"
#include "dcp/dcp.h"
#include "io.h"
#include "strmap.h"
#include "util.h"
#include "zck.h"

/* The <i> of "<stem>-<i>-of-<n>.safetensors"; 0 when the name has another shape. */
static uint32_t file_number_of_name(const char *name) {
  size_t len = strlen(name);
  const char *ext = ".safetensors";
  if (len < 12 || strcmp(name + len - 12, ext)) return 0;
  const char *of = NULL;
  for (const char *p = strstr(name, "-of-"); p; p = strstr(p + 1, "-of-")) of = p;
  if (!of) return 0;
  for (const char *p = of + 4; p < name + len - 12; p++)
    if (*p < '0' || *p > '9') return 0;
  if (of + 4 == name + len - 12) return 0;
  const char *start = of;
  while (start > name && start[-1] >= '0' && start[-1] <= '9') start--;
  if (start == of || start == name || start[-1] != '-') return 0;
  uint64_t v = 0;
  for (const char *p = start; p < of; p++)
    if ((v = v * 10 + (uint64_t)(*p - '0')) > UINT32_MAX) return 0;
  return (uint32_t)v;
}

/* The mapping of a JSON file: rank[i] its position in the file, file[i] its index, for each
 * set entry i; every set entry named once, every name a set entry. */
static zck_status mapping_from_file(const char *path, const zck__tensor_set *s, const zck__strmap *by_name,
                                    uint32_t *file, size_t *rank) {
  char *text = NULL;
  size_t len = 0;
  ZCK_TRY(zck__read_small_file(path, (size_t)1 << 30, &text, &len));
  cJSON *root = cJSON_ParseWithLength(text, len);
  free(text);
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return zck__fail(ZCK_ERR_FORMAT, "%s: not a JSON object (torch's fqn_to_index_mapping, or an index with a weight_map)",
                     path);
  }
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
  bool index_file = wm != NULL;
  if (index_file && !cJSON_IsObject(wm)) {
    cJSON_Delete(root);
    return zck__fail(ZCK_ERR_FORMAT, "%s: weight_map is not an object", path);
  }
  const cJSON *map = index_file ? wm : root;
  for (size_t i = 0; i < s->n; i++) file[i] = 0;
  zck_status st = ZCK_OK;
  size_t pos = 0;
  for (const cJSON *k = map->child; st == ZCK_OK && k; k = k->next, pos++) {
    size_t i;
    uint32_t f = 0;
    if (index_file && cJSON_IsString(k) && k->valuestring) f = file_number_of_name(k->valuestring);
    else if (!index_file && cJSON_IsNumber(k) && k->valuedouble >= 1 && k->valuedouble <= UINT32_MAX &&
             k->valuedouble == (double)(uint32_t)k->valuedouble)
      f = (uint32_t)k->valuedouble;
    if (!f)
      st = zck__fail(ZCK_ERR_FORMAT, "%s: %s: %s", path, k->string ? k->string : "?",
                     index_file ? "its file is not named <stem>-<i>-of-<n>.safetensors with i >= 1"
                                : "its index is not a whole number >= 1");
    else if (!k->string || !zck__strmap_get(by_name, k->string, &i))
      st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: names %s, which the checkpoint does not hold (torch would write it with dtype \"\")",
                     path, k->string ? k->string : "?");
    else if (file[i])
      st = zck__fail(ZCK_ERR_FORMAT, "%s: names %s twice", path, k->string);
    else
      file[i] = f, rank[i] = pos;
  }
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++)
    if (!file[i])
      st = zck__fail(ZCK_ERR_NOT_FOUND, "%s: gives no file for %s (torch would leave it out of the output)", path, s->v[i].name);
  cJSON_Delete(root);
  return st;
}

/* The mapping the save used, from the shard names: rank = (file, state dict order). */
static zck_status mapping_from_shards(const zck_dcp *c, const zck__tensor_set *s, uint32_t *file, size_t *rank) {
  zck__strmap st_file;
  ZCK_TRY(zck__strmap_init(&st_file, 64));
  zck_status st = ZCK_OK;
  uint32_t of = 0;
  for (size_t e = 0; st == ZCK_OK && e < zck_dcp_entry_count(c); e++) {
    zck_dcp_entry_info info;
    zck_dcp_entry_at(c, e, &info);
    bool dup;
    st = zck__strmap_put(&st_file, info.key, zck_dcp_st_file(c, e, &of), &dup, NULL);
  }
  for (size_t i = 0; st == ZCK_OK && i < s->n; i++) {
    size_t f = 0;
    zck__strmap_get(&st_file, s->v[i].name, &f);
    if (!f)
      st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: its shard file names (shard-<r>-model-<i>-of-<n>.safetensors) do not say "
                     "which output file %s goes in: give the mapping (--fqn-to-index)", zck_dcp_info_of(c)->dir, s->v[i].name);
    file[i] = (uint32_t)f;
    rank[i] = i;
  }
  zck__strmap_free(&st_file);
  return st;
}

/* What torch's consolidation cannot write (see the top). */
static zck_status check_torch_writes(const zck__tensor_set *s, const char *dir) {
  for (size_t i = 0; i < s->n; i++) {
    const zck__tensor_entry *e = &s->v[i];
    if (!e->ndim)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s is 0-d: torch's consolidate_safetensors_files writes zeros for it "
                       "(consolidate without --format torch-safetensors writes it whole)", dir, e->name);
    if (!zck__cons_floating(e->dtype))
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: %s is %s: torch's consolidate_safetensors_files takes floating tensors only "
                       "(torch.finfo); consolidate without --format torch-safetensors writes it", dir, e->name,
                       zck_dtype_name(e->dtype));
  }
  return ZCK_OK;
}

typedef struct { uint32_t file; size_t rank, entry; } placed;

static int cmp_placed_rank(const void *a, const void *b) {
  const placed *x = a, *y = b;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}
static int cmp_placed_file(const void *a, const void *b) {
  const placed *x = a, *y = b;
  if (x->file != y->file) return x->file < y->file ? -1 : 1;
  return cmp_placed_rank(a, b);
}

/* Puts the set (and entries[]) in the mapping's order; file[] follows. */
static zck_status order_set(zck__tensor_set *s, zck__cons_entry *entries, uint32_t *file, const size_t *rank,
                            bool by_file) {
  placed *p = zck__malloc((s->n ? s->n : 1) * sizeof *p);
  zck__tensor_entry *v = zck__malloc((s->n ? s->n : 1) * sizeof *v);
  zck__cons_entry *ce = zck__malloc((s->n ? s->n : 1) * sizeof *ce);
  if (!p || !v || !ce) {
    free(p), free(v), free(ce);
    return ZCK_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < s->n; i++) p[i] = (placed){file[i], rank[i], i};
  qsort(p, s->n, sizeof *p, by_file ? cmp_placed_file : cmp_placed_rank);
  for (size_t i = 0; i < s->n; i++) {
    v[i] = s->v[p[i].entry];
    ce[i] = entries[p[i].entry];
    file[i] = p[i].file;
  }
  memcpy(s->v, v, s->n * sizeof *v);
  memcpy(entries, ce, s->n * sizeof *ce);
  free(p), free(v), free(ce);
  return ZCK_OK;
}

static zck_status reserve_fill_commit(const zck__src *src, zck__tensor_set *s, zck__cons_entry *entries,
                                      const uint32_t *file, const char *out, const zck_consolidate_opts *o) {
  zck__write_opts wo = {.threads = o->threads, .overwrite = o->overwrite != 0, .manifest = true, .torch_file_of = file};
  zck__cons_ctx ctx = {&src->view, entries, o->threads, o->progress, o->progress_ctx, o->no_verify != 0};
  zck__set_target *t = NULL;
  zck_status st = zck__set_reserve(s, ZCK__SET_OUT_ST_DIR, out, &wo, &t);
  for (size_t i = 0; st == ZCK_OK && i < zck__set_target_passes(t); i++)
    st = zck__cons_transfer(&ctx, s, zck__set_target_pass(t, i));
  if (st == ZCK_OK) st = zck__set_target_commit(t);
  zck__set_target_free(t);
  return st;
}

zck_status zck_dcp_consolidate_safetensors(const char *dcp, const char *out, const char *fqn_to_index,
                                           const zck_consolidate_opts *opts) {
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  ZCK_TRY(zck__opts_load(&o, sizeof o, opts, "zck_dcp_consolidate_safetensors"));
  if (!dcp || !out) return zck__fail(ZCK_ERR_INVALID_ARG, "zck_dcp_consolidate_safetensors: no input or output path");
  if (zck__output_format_of(out) != ZCK_OUT_HF_DIR)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: torch's consolidate_safetensors_files writes a folder: OUT names it", out);
  zck_consolidate_opts plain = ZCK_CONSOLIDATE_OPTS_INIT; /* torch casts nothing, keeps every tensor */
  plain.threads = o.threads;
  plain.no_verify = o.no_verify;
  zck__src src;
  ZCK_TRY(zck__cons_open(&src, dcp, &plain));
  zck_status st = zck_check_out_not_input(dcp, out, NULL);
  if (st == ZCK_OK && (src.kind != ZCK__SRC_DCP || !zck_dcp_is_safetensors(src.dcp)))
    st = zck__fail(ZCK_ERR_UNSUPPORTED, "%s: not a torch Distributed Checkpoint saved with safetensors storage (torch's "
                   "consolidate_safetensors_files reads shard-*.safetensors folders)", dcp);
  zck__tensor_set s;
  zck__set_init(&s);
  zck__cons_entry *entries = NULL;
  if (st == ZCK_OK) st = zck__cons_build_set(src.outs, src.n_outs, &plain, &s, &entries);
  for (size_t i = 0; st == ZCK_OK && i < s.n; i++) s.v[i].alias_of = s.v[i].tied_to = -1; /* every name its own tensor */
  if (st == ZCK_OK) st = check_torch_writes(&s, zck_dcp_info_of(src.dcp)->dir);
  uint32_t *file = st == ZCK_OK ? zck__calloc(s.n ? s.n : 1, sizeof *file) : NULL;
  size_t *rank = st == ZCK_OK ? zck__calloc(s.n ? s.n : 1, sizeof *rank) : NULL;
  if (st == ZCK_OK && (!file || !rank)) st = ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK && fqn_to_index) {
    zck__strmap by_name;
    st = zck__strmap_init(&by_name, 64);
    for (size_t i = 0; st == ZCK_OK && i < s.n; i++) {
      bool dup;
      st = zck__strmap_put(&by_name, s.v[i].name, i, &dup, NULL);
    }
    if (st == ZCK_OK) st = mapping_from_file(fqn_to_index, &s, &by_name, file, rank);
    zck__strmap_free(&by_name);
  } else if (st == ZCK_OK) {
    st = mapping_from_shards(src.dcp, &s, file, rank);
  }
  if (st == ZCK_OK) st = order_set(&s, entries, file, rank, !fqn_to_index);
  if (st == ZCK_OK) st = reserve_fill_commit(&src, &s, entries, file, out, &o);
  if (st == ZCK_OK && o.summary) zck__job_summary_fill(o.summary, out, s.n);
  free(file);
  free(rank);
  zck__set_free(&s);
  free(entries);
  zck__src_close(&src);
  return st;
}
