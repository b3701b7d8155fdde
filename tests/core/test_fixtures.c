/* test_fixtures.c: the layout math against checkpoints DeepSpeed itself wrote.
 *
 * tests/fixtures/deepspeed/<case>/ holds real DeepSpeed checkpoints with a JSON dump of
 * every file's pickle tree and tensor geometry (layout.json) and of the run (expected.json).
 * For every case this test rebuilds the layout from param_shapes (stage 1/2) or from the
 * param groups and sub_group_size (stage 3) and checks, rank by rank, what DeepSpeed
 * stored: group_paddings, the saved fp32 partition lengths (lean or padded), exp_avg
 * lengths, param_alignment_paddings, param_slice_mappings (start, numel per param),
 * the stage-3 sub-group split and flat lengths, and frozen_param_fragments sizes. */
#include "layout.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdlib.h>

#define MAXP 64

static cJSON *load_json(const char *path) {
  unsigned char *data;
  size_t n;
  if (zt_read_file(path, &data, &n) != 0) ZT_FAIL("cannot read %s", path);
  cJSON *j = cJSON_ParseWithLength((const char *)data, n);
  free(data);
  if (!j) ZT_FAIL("%s: bad JSON", path);
  return j;
}

/* The pickle-tree dumps: {"dict": [[k, v], ...]}, {"OrderedDict": ...}, {"list": [...]},
 * {"object": ..., "fields": {...}}. Finds the first value stored under key. */
static const cJSON *tree_find(const cJSON *t, const char *key) {
  if (cJSON_IsObject(t)) {
    const char *kinds[] = {"dict", "OrderedDict"};
    for (int k = 0; k < 2; k++) {
      const cJSON *pairs = cJSON_GetObjectItemCaseSensitive(t, kinds[k]);
      const cJSON *pair;
      cJSON_ArrayForEach(pair, pairs) {
        const cJSON *kk = cJSON_GetArrayItem(pair, 0), *vv = cJSON_GetArrayItem(pair, 1);
        if (cJSON_IsString(kk) && !strcmp(kk->valuestring, key)) return vv;
        const cJSON *r = tree_find(vv, key);
        if (r) return r;
      }
    }
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "fields");
    if (f) return tree_find(f, key);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(t, "list");
    if (l) return tree_find(l, key);
  } else if (cJSON_IsArray(t)) {
    const cJSON *x;
    cJSON_ArrayForEach(x, t) {
      const cJSON *r = tree_find(x, key);
      if (r) return r;
    }
  }
  return NULL;
}

static const cJSON *list_of(const cJSON *t) {
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(t, "list");
  ZT_ASSERT(l);
  return l;
}

static const cJSON *pairs_of(const cJSON *t) {
  const cJSON *l = cJSON_GetObjectItemCaseSensitive(t, "OrderedDict");
  if (!l) l = cJSON_GetObjectItemCaseSensitive(t, "dict");
  ZT_ASSERT(l);
  return l;
}

/* numel of a tensor of a file in layout.json, or -1 if absent */
static long long tensor_numel(const cJSON *file, const char *name) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(file, "tensors"), name);
  if (!t) return -1;
  return (long long)cJSON_GetObjectItemCaseSensitive(t, "numel")->valuedouble;
}

typedef struct names {
  char *v[MAXP];
  uint64_t numel[MAXP];
  size_t n;
} names;

static uint32_t name_index(names *ns, const char *name, uint64_t numel, bool add) {
  for (size_t i = 0; i < ns->n; i++)
    if (!strcmp(ns->v[i], name)) return (uint32_t)i;
  if (!add) ZT_FAIL("parameter %s unknown", name);
  ZT_ASSERT(ns->n < MAXP);
  ns->v[ns->n] = strdup(name);
  ns->numel[ns->n] = numel;
  return (uint32_t)ns->n++;
}

static uint64_t size_numel(const cJSON *size) {
  const cJSON *dims = cJSON_GetObjectItemCaseSensitive(size, "torch.Size"), *d;
  ZT_ASSERT(dims);
  uint64_t n = 1;
  cJSON_ArrayForEach(d, dims) n *= (uint64_t)d->valuedouble;
  return n;
}

/* param_shapes: a list of ordered dicts name -> torch.Size; fills names and groups */
static size_t read_param_shapes(const cJSON *model_tree, names *ns, uint32_t groups[][MAXP], size_t *lens) {
  const cJSON *ps = tree_find(model_tree, "param_shapes"), *g;
  ZT_ASSERT(ps);
  size_t n = 0;
  cJSON_ArrayForEach(g, list_of(ps)) {
    const cJSON *pair;
    lens[n] = 0;
    cJSON_ArrayForEach(pair, pairs_of(g)) {
      const char *nm = cJSON_GetArrayItem(pair, 0)->valuestring;
      groups[n][lens[n]++] = name_index(ns, nm, size_numel(cJSON_GetArrayItem(pair, 1)), true);
    }
    n++;
  }
  return n;
}

/* frozen_param_shapes (when the file has it) joins the name table */
static void read_frozen_shapes(const cJSON *model_tree, names *ns) {
  const cJSON *fs = tree_find(model_tree, "frozen_param_shapes"), *pair;
  if (!fs || cJSON_IsNull(fs)) return;
  cJSON_ArrayForEach(pair, pairs_of(fs)) name_index(ns, cJSON_GetArrayItem(pair, 0)->valuestring,
                                                    size_numel(cJSON_GetArrayItem(pair, 1)), true);
}

/* expected.json param groups, in group order, with the params DeepSpeed optimizes:
 * trainable and (since 0.19.8, is_optimized_parameter) at least one element; 0.19.8
 * records zero-element trainable params with the frozen ones. */
static size_t read_param_groups(const cJSON *exp, names *ns, uint32_t groups[][MAXP], size_t *lens) {
  const cJSON *trainable = cJSON_GetObjectItemCaseSensitive(exp, "trainable"), *g;
  size_t n = 0;
  cJSON_ArrayForEach(g, cJSON_GetObjectItemCaseSensitive(exp, "param_groups")) {
    const cJSON *p;
    lens[n] = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(g, "params")) {
      bool tr = false;
      const cJSON *t;
      cJSON_ArrayForEach(t, trainable) tr |= !strcmp(t->valuestring, p->valuestring);
      if (!tr) continue;
      uint32_t i = name_index(ns, p->valuestring, 0, false);
      if (ns->numel[i]) groups[n][lens[n]++] = i;
    }
    if (lens[n]) n++;
  }
  return n;
}

static const cJSON *file_of(const cJSON *layout, const char *name) {
  const cJSON *f = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(layout, "files"), name);
  if (!f) ZT_FAIL("layout.json lacks %s", name);
  return f;
}

static void check_zero12(const char *cs, const cJSON *exp, const cJSON *layout, uint32_t W, const char *prefix,
                         int elem_size) {
  names ns = {0};
  static uint32_t flat[8][MAXP], model[8][MAXP];
  size_t flat_len[8], model_len[8];
  const cJSON *mf = file_of(layout, "mp_rank_00_model_states.pt");
  size_t ng = read_param_shapes(cJSON_GetObjectItemCaseSensitive(mf, "tree"), &ns, flat, flat_len);
  read_frozen_shapes(cJSON_GetObjectItemCaseSensitive(mf, "tree"), &ns);
  size_t ngm = read_param_groups(exp, &ns, model, model_len);
  ZT_EQ_INT(ngm, ng);
  const cJSON *extra = cJSON_GetObjectItemCaseSensitive(exp, "zero_optimization_extra");
  bool palign = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(extra, "parameter_alignment"));
  bool rr = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(extra, "round_robin_gradients"));
  uint32_t pa = palign ? 16 / (elem_size == 2 ? 2 : 4) : 1;
  const char *opt = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(exp, "engine"), "engine_optimizer")->valuestring;
  bool bf16opt = !strcmp(opt, "BF16_Optimizer");

  zck_group_spec fs[8], ms[8];
  for (size_t g = 0; g < ng; g++) {
    fs[g] = (zck_group_spec){flat[g], flat_len[g], (int32_t)g};
    ms[g] = (zck_group_spec){model[g], model_len[g], (int32_t)g};
    if (rr) { /* param_shapes is in round-robin order of the group order */
      uint32_t want[MAXP];
      zck_round_robin_order(model[g], model_len[g], W, want);
      for (size_t i = 0; i < model_len[g]; i++) ZT_EQ_INT(flat[g][i], want[i]);
    } else {
      ZT_EQ_INT(flat_len[g], model_len[g]);
      for (size_t i = 0; i < model_len[g]; i++) ZT_EQ_INT(flat[g][i], model[g][i]);
    }
  }
  zck_layout *l, *lm;
  ZT_OK(zck_layout_zero12(ns.n, ns.numel, fs, ng, W, pa, &l));
  /* param_slice_mappings use offsets in group (un-reordered) order: DeepSpeed computes
   * them from bit16_groups even when the flat buffer is round-robin (spec §3.1) */
  ZT_OK(zck_layout_zero12(ns.n, ns.numel, ms, ng, W, pa, &lm));
  for (uint32_t r = 0; r < W; r++) {
    char fname[128];
    snprintf(fname, sizeof fname, "%szero_pp_rank_%u_mp_rank_00_optim_states.pt", prefix, r);
    const cJSON *of = file_of(layout, fname), *tree = cJSON_GetObjectItemCaseSensitive(of, "tree");
    const cJSON *gp = list_of(tree_find(tree, "group_paddings"));
    const cJSON *pap = tree_find(tree, "param_alignment_paddings");
    const cJSON *psm = list_of(tree_find(tree, "param_slice_mappings"));
    for (size_t g = 0; g < ng; g++) {
      const zck_layout_group *gr = &l->groups[g];
      const zck_layout_store *st = &l->stores[zck_layout_store_id(l, (uint32_t)g, r)];
      uint64_t pad = bf16opt ? zck_zero12_bf16_padding(gr->numel, W, r) : st->numel - st->lean;
      char tn[128];
      if ((uint64_t)cJSON_GetArrayItem(gp, (int)g)->valuedouble != pad)
        ZT_FAIL("%s rank %u group %zu: group_paddings %g, layout %llu", cs, r, g, cJSON_GetArrayItem(gp, (int)g)->valuedouble,
                (unsigned long long)pad);
      snprintf(tn, sizeof tn, "optimizer_state_dict.single_partition_of_fp32_groups.%zu", g);
      ZT_EQ_INT(tensor_numel(of, tn), bf16opt ? st->numel : st->lean);
      snprintf(tn, sizeof tn, "optimizer_state_dict.base_optimizer_state.state.%zu.exp_avg", g);
      ZT_EQ_INT(tensor_numel(of, tn), st->numel);
      ZT_EQ_U64(st->numel, gr->partition);
      if (pap) { /* DeepSpeed >= 0.19.8: padding after each param */
        const cJSON *pl = list_of(cJSON_GetArrayItem(list_of(pap), (int)g));
        for (size_t i = 0; i < gr->n_params; i++) {
          uint64_t after = i + 1 < gr->n_params ? gr->offsets[i + 1] - gr->offsets[i] - ns.numel[gr->params[i]] : 0;
          ZT_EQ_U64((uint64_t)cJSON_GetArrayItem(pl, (int)i)->valuedouble, after);
        }
      }
      /* mappings: the pieces of store (g, r), in flat order */
      uint32_t sid = zck_layout_store_id(lm, (uint32_t)g, r);
      const cJSON *pairs = pairs_of(cJSON_GetArrayItem(psm, (int)g));
      size_t k = lm->store_first[sid];
      const cJSON *pair;
      cJSON_ArrayForEach(pair, pairs) {
        ZT_ASSERT(k < lm->store_first[sid + 1]);
        const zck_piece *pc = &lm->pieces[lm->by_store[k++]];
        const cJSON *fa = cJSON_GetArrayItem(pair, 1);
        ZT_EQ_STR(cJSON_GetArrayItem(pair, 0)->valuestring, ns.v[pc->param]);
        ZT_EQ_U64((uint64_t)tree_find(fa, "start")->valuedouble, pc->store_off);
        ZT_EQ_U64((uint64_t)tree_find(fa, "numel")->valuedouble, pc->count);
      }
      ZT_EQ_INT(k, lm->store_first[sid + 1]);
    }
  }
  zck_layout_free(l);
  zck_layout_free(lm);
  for (size_t i = 0; i < ns.n; i++) free(ns.v[i]);
}

static void check_zero3(const char *cs, const cJSON *exp, const cJSON *layout, uint32_t W, const char *prefix) {
  names ns = {0};
  static uint32_t shapes[16][MAXP], model[8][MAXP];
  size_t shape_len[16], model_len[8];
  const cJSON *mf0 = file_of(layout, "zero_pp_rank_0_mp_rank_00_model_states.pt");
  size_t n_sg_file = read_param_shapes(cJSON_GetObjectItemCaseSensitive(mf0, "tree"), &ns, shapes, shape_len);
  read_frozen_shapes(cJSON_GetObjectItemCaseSensitive(mf0, "tree"), &ns);
  size_t ng = read_param_groups(exp, &ns, model, model_len);
  const cJSON *extra = cJSON_GetObjectItemCaseSensitive(exp, "zero_optimization_extra");
  const cJSON *sgs = cJSON_GetObjectItemCaseSensitive(extra, "sub_group_size");
  uint64_t sub_group_size = sgs ? (uint64_t)sgs->valuedouble : 1000000000;
  zck_group_spec gs[8];
  for (size_t g = 0; g < ng; g++) gs[g] = (zck_group_spec){model[g], model_len[g], (int32_t)g};
  zck_group_spec *sg;
  size_t n_sg;
  ZT_OK(zck_zero3_sub_groups(ns.numel, gs, ng, W, sub_group_size, &sg, &n_sg));
  if (n_sg != n_sg_file) ZT_FAIL("%s: %zu sub-groups, DeepSpeed made %zu", cs, n_sg, n_sg_file);
  for (size_t s = 0; s < n_sg; s++) {
    ZT_EQ_INT(sg[s].n_params, shape_len[s]);
    for (size_t i = 0; i < shape_len[s]; i++) ZT_EQ_INT(sg[s].params[i], shapes[s][i]);
  }
  zck_layout *l;
  ZT_OK(zck_layout_zero3(ns.n, ns.numel, sg, n_sg, W, &l));
  for (uint32_t r = 0; r < W; r++) {
    char fname[128], tn[160];
    snprintf(fname, sizeof fname, "%szero_pp_rank_%u_mp_rank_00_optim_states.pt", prefix, r);
    const cJSON *of = file_of(layout, fname);
    ZT_EQ_INT(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(of, "tree"), "dict") != NULL, 1);
    for (size_t s = 0; s < n_sg; s++) {
      const zck_layout_store *st = &l->stores[zck_layout_store_id(l, (uint32_t)s, r)];
      snprintf(tn, sizeof tn, "optimizer_state_dict.fp32_flat_groups.%zu", s);
      ZT_EQ_INT(tensor_numel(of, tn), st->numel);
      snprintf(tn, sizeof tn, "optimizer_state_dict.optimizer_state_dict.state.%zu.exp_avg", s);
      ZT_EQ_INT(tensor_numel(of, tn), st->numel);
    }
    /* frozen params: this rank's ceil(n/W) partition, padding included */
    snprintf(fname, sizeof fname, "zero_pp_rank_%u_mp_rank_00_model_states.pt", r);
    const cJSON *mf = file_of(layout, fname);
    const cJSON *fr;
    cJSON_ArrayForEach(fr, cJSON_GetObjectItemCaseSensitive(exp, "frozen")) {
      const cJSON *shapes_j = tree_find(cJSON_GetObjectItemCaseSensitive(mf, "tree"), "frozen_param_shapes");
      const cJSON *pair;
      uint64_t n = 0;
      cJSON_ArrayForEach(pair, pairs_of(shapes_j)) if (!strcmp(cJSON_GetArrayItem(pair, 0)->valuestring, fr->valuestring))
          n = size_numel(cJSON_GetArrayItem(pair, 1));
      snprintf(tn, sizeof tn, "frozen_param_fragments.%s", fr->valuestring);
      ZT_EQ_INT(tensor_numel(mf, tn), zck_zero3_partition(n, W));
    }
  }
  (void)cs;
  free(sg);
  zck_layout_free(l);
  for (size_t i = 0; i < ns.n; i++) free(ns.v[i]);
}

int main(void) {
  char *root = zt_fixture("deepspeed");
  DIR *d = opendir(root);
  if (!d) zt_skip("no DeepSpeed fixtures");
  struct dirent *de;
  int cases = 0;
  while ((de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/expected.json", root, de->d_name);
    FILE *f = fopen(path, "rb");
    if (!f) continue;
    fclose(f);
    cJSON *exp = load_json(path);
    snprintf(path, sizeof path, "%s/%s/layout.json", root, de->d_name);
    cJSON *layout = load_json(path);
    int stage = cJSON_GetObjectItemCaseSensitive(exp, "stage")->valueint;
    if (stage == 0 || cJSON_GetObjectItemCaseSensitive(exp, "live_optim_states")) {
      /* ZeRO-0 has no partition to rebuild: the whole model sits in mp_rank_00 (test_zero0);
       * NVMe offload: swapped sub-groups are empty in the optim files (test_nvme) */
      cJSON_Delete(exp);
      cJSON_Delete(layout);
      continue;
    }
    uint32_t W = (uint32_t)cJSON_GetObjectItemCaseSensitive(exp, "world_size")->valueint;
    const char *dtype = cJSON_GetObjectItemCaseSensitive(exp, "dtype")->valuestring;
    const char *prefix = !strcmp(dtype, "bf16") ? "bf16_" : "";
    int elem = !strcmp(dtype, "fp32") ? 4 : 2;
    if (stage == 3) check_zero3(de->d_name, exp, layout, W, prefix);
    else check_zero12(de->d_name, exp, layout, W, prefix, elem);
    printf("%s: stage %d, W=%u: layout matches DeepSpeed\n", de->d_name, stage, W);
    cases++;
    cJSON_Delete(exp);
    cJSON_Delete(layout);
  }
  closedir(d);
  free(root);
  if (!cases) zt_skip("no DeepSpeed fixture cases");
  return 0;
}
