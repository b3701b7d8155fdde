/* test_reshard_errors.c: requests `reshard` cannot honour get one line naming the file and
 * what is wrong, before anything is written: nothing at OUT, no temporary folder beside it.
 *   - a source saved before the first optimizer step, DeepSpeed or universal;
 *   - a universal folder missing a state (a param's exp_avg / exp_avg_sq, a step.pt); an
 *     HDF5 container missing a dataset (a param state, a frozen param);
 *   - group layouts the target cannot express: a param in two groups (param_shapes, the
 *     container's param_groups), param_groups not covering every flat group / sub-group,
 *     a sub-group in two groups, a group without trainable params, a group without 'lr';
 *   - --sub-group-size for a ZeRO-1/2 target or beyond 1e18; --tag with a universal source.
 * Broken copies are made from real fixtures by rewriting one pickle (the tree copied with
 * its tensors, one value changed) or one HDF5 link / attribute. And a run interrupted by an
 * I/O failure (ENOSPC, failing fsync / rename / read), from each kind of source, leaves
 * nothing at OUT. */
#include <errno.h>

#include <cjson/cJSON.h>
#include <hdf5.h>

#include "rs_util.h"
#include "../universal/h5_edit.h"
#include "deepspeed/deepspeed.h"
#include "hdf5/zck_h5.h"
#include "io.h"
#include "universal/universal.h"
#include "zck.h"

static char *tmp;
static int n_case;

// ---- refusal

static void expect_refused(const char *src, const zck_reshard_opts *opts, zck_status st, const char *needle,
                           const char *names) {
  char *out = rs_path("%s/out%d", tmp, n_case++);
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  if (opts) o = *opts;
  if (!o.to_stage) o.to_stage = 2;
  if (!o.to_world_size) o.to_world_size = 3;
  ZT_ERR(zck_reshard(src, out, &o), st, needle);
  const char *msg = zck_last_error();
  if (getenv("RS_VERBOSE")) fprintf(stderr, "  %s\n", msg);
  if (strchr(msg, '\n')) ZT_FAIL("message is not one line: %s", msg);
  if (names && !strstr(msg, names)) ZT_FAIL("message \"%s\" does not name %s", msg, names);
  rs_nothing_left(out);
  free(out);
}

// ---- editing pickles

static zck_pk *dget(zck_pk *d, const char *key) {
  for (size_t i = 0; d && d->kind == ZCK_PK_DICT && i < d->u.dict.len; i++) {
    const char *k = zck_pk_as_str(d->u.dict.keys[i]);
    if (k && !strcmp(k, key)) return d->u.dict.values[i];
  }
  return NULL;
}

static void ddel(zck_pk *d, const char *key) {
  for (size_t i = 0; i < d->u.dict.len; i++) {
    const char *k = zck_pk_as_str(d->u.dict.keys[i]);
    if (!k || strcmp(k, key)) continue;
    memmove(&d->u.dict.keys[i], &d->u.dict.keys[i + 1], (d->u.dict.len - i - 1) * sizeof(zck_pk *));
    memmove(&d->u.dict.values[i], &d->u.dict.values[i + 1], (d->u.dict.len - i - 1) * sizeof(zck_pk *));
    d->u.dict.len--;
    return;
  }
  ZT_FAIL("no key %s", key);
}

typedef void (*edit_fn)(zck_pk_doc *d, zck_pk *root);

/* path rewritten: its tree copied (tensors included), edited, saved in place. */
static void rewrite_pt(const char *path, edit_fn edit) {
  zck_torch_open_opts to = ZCK_TORCH_OPEN_OPTS_INIT;
  zck_torch_file *f = NULL;
  ZT_OK(zck_torch_open(path, &to, &f));
  char *np = rs_path("%s.new", path);
  zck_torch_writer *tw = NULL;
  ZT_OK(zck_torch_writer_create(np, &tw));
  zck_uv_copies copies = {0};
  zck_pk *root = NULL;
  ZT_OK(zck_uv_copy_tree(tw, f, NULL, zck_torch_root(f), &root, &copies));
  edit(zck_torch_writer_doc(tw), root);
  zck_exec_opts eo = ZCK_EXEC_OPTS_INIT;
  ZT_OK(zck_uv_copies_run(tw, &copies, &eo));
  ZT_OK(zck_torch_writer_finish(tw, root));
  zck_uv_copies_free(&copies);
  zck_torch_writer_free(tw);
  zck_torch_close(f);
  ZT_ASSERT(rename(np, path) == 0);
  free(np);
}

static zck_pk *groups_of(zck_pk *root) {
  zck_pk *pg = dget(root, "param_groups");
  ZT_ASSERT(pg && pg->kind == ZCK_PK_LIST);
  return pg;
}

static void drop_last_group(zck_pk_doc *d, zck_pk *root) {
  (void)d;
  groups_of(root)->u.seq.len--;
}
static void no_lr(zck_pk_doc *d, zck_pk *root) {
  (void)d;
  ddel(groups_of(root)->u.seq.items[0], "lr");
}
static void no_param_groups(zck_pk_doc *d, zck_pk *root) {
  (void)d;
  ddel(root, "param_groups");
}
/* stage 3: group 1 lists no sub-group */
static void subgroups_uncovered(zck_pk_doc *d, zck_pk *root) {
  (void)d;
  dget(groups_of(root)->u.seq.items[1], "params")->u.seq.len = 0;
}
/* stage 3: group 1 lists sub-group 0 again */
static void subgroup_twice(zck_pk_doc *d, zck_pk *root) {
  zck_pk *l = dget(groups_of(root)->u.seq.items[1], "params");
  l->u.seq.items[0] = zck_pk_new_int(d, 0);
}
/* stage 3: a third group with no sub-group (no trainable param) */
static void empty_group(zck_pk_doc *d, zck_pk *root) {
  zck_pk *g = zck_pk_new_dict(d, 0);
  ZT_ASSERT(zck_pk_dict_set(d, g, zck_pk_new_str(d, "lr"), zck_pk_new_float(d, 0.01)));
  ZT_ASSERT(zck_pk_dict_set(d, g, zck_pk_new_str(d, "params"), zck_pk_new_list(d)));
  ZT_ASSERT(zck_pk_append(d, groups_of(root), g));
}
/* model file: fc1.weight in param_shapes[1] too */
static void param_in_two_groups(zck_pk_doc *d, zck_pk *root) {
  zck_pk *ps = dget(root, "param_shapes");
  zck_pk *shape = dget(ps->u.seq.items[0], "fc1.weight");
  ZT_ASSERT(shape);
  ZT_ASSERT(zck_pk_dict_set(d, ps->u.seq.items[1], zck_pk_new_str(d, "fc1.weight"), shape));
}

// ---- sources

/* A fresh copy of the universal folder `base`/uc (with its latest_universal) at tmp/name. */
static char *fresh(const char *base, const char *name) {
  char *p = rs_path("%s/%s", tmp, name);
  rs_sh("rm -rf '%s' && mkdir -p '%s' && cp -r '%s/uc' '%s/latest_universal' '%s/'", p, p, base, base, p);
  return p;
}

static char *universal(const char *cs, const char *name) {
  char *rel = rs_path("deepspeed/%s/ckpt", cs);
  char *ds = zt_fixture(rel);
  char *parent = rs_path("%s/%s", tmp, name), *uc = rs_path("%s/uc", parent);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.inject_missing_state = 1;
  ZT_OK(zck_to_universal(ds, uc, &uo));
  free(uc);
  free(rel);
  free(ds);
  return parent;
}

static void deepspeed_sources(void) {
  /* the DeepSpeed checkpoint as the writer lays it out before the first step */
  char *src = zt_fixture("deepspeed/s2w2_bf16/ckpt");
  zck_ds_ckpt *c = NULL;
  ZT_OK(zck_ds_open(src, NULL, &c));
  zck_ds_write_opts wo;
  zck_ds_write_opts_from(c, &wo);
  wo.has_optimizer_state = false;
  wo.step = 0;
  char *root = rs_path("%s/nostate", tmp);
  zck_ds_writer *w = NULL;
  ZT_OK(zck_ds_writer_create(root, zck_ds_model(c), &wo, &w));
  ZT_OK(zck_ds_writer_commit(w));
  zck_ds_writer_free(w);
  zck_ds_close(c);
  expect_refused(root, NULL, ZCK_ERR_NOT_FOUND, "before the first optimizer step", "nostate/global_step2");
  ZT_ASSERT(strstr(zck_last_error(), "a resharded checkpoint must carry it"));
  free(root);
  /* --sub-group-size: only for a ZeRO-3 target, and one a reader takes back */
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  o.to_stage = 2;
  o.sub_group_size = 1000;
  expect_refused(src, &o, ZCK_ERR_INVALID_ARG, "--sub-group-size 1000: only a ZeRO-3 target has sub-groups", NULL);
  o.to_stage = 3;
  o.sub_group_size = 1000000000000000000ull;
  expect_refused(src, &o, ZCK_ERR_INVALID_ARG, "at most 1e18", NULL);
  /* a stage-3 source whose target stage is left as is: sub_group_size is fine */
  free(src);
}

static void universal_folders(void) {
  char *b2 = universal("s2w2_bf16", "base2"), *b3 = universal("s3w2_bf16", "base3");
  char *d;
  /* no exp_avg / exp_avg_sq anywhere */
  d = fresh(b2, "u-nostate");
  rs_sh("rm '%s'/uc/zero/*/exp_avg.pt '%s'/uc/zero/*/exp_avg_sq.pt", d, d);
  expect_refused(d, NULL, ZCK_ERR_NOT_FOUND, "no optimizer state", "u-nostate/uc");
  free(d);
  /* one param without its optimizer state */
  d = fresh(b2, "u-noexp");
  rs_sh("rm '%s/uc/zero/ln.bias/exp_avg.pt' '%s/uc/zero/ln.bias/exp_avg_sq.pt'", d, d);
  expect_refused(d, NULL, ZCK_ERR_NOT_FOUND, "zero/ln.bias/exp_avg.pt: missing, while", "u-noexp/uc");
  free(d);
  d = fresh(b3, "u3-noexp");
  rs_sh("rm '%s/uc/zero/fc2.weight/exp_avg_sq.pt'%s", d, "");
  expect_refused(d, NULL, ZCK_ERR_NOT_FOUND, "has exp_avg.pt but not exp_avg_sq.pt", "fc2.weight");
  free(d);
  /* one step.pt missing */
  d = fresh(b2, "u-nostep");
  rs_sh("rm '%s/uc/zero/fc2.bias/step.pt'%s", d, "");
  expect_refused(d, NULL, ZCK_ERR_NOT_FOUND, "fc2.bias/step.pt: missing", NULL);
  free(d);
  /* the fp32 master of a param (DS-72) */
  d = fresh(b3, "u-nofp32");
  rs_sh("rm '%s/uc/zero/scale/fp32.pt'%s", d, "");
  expect_refused(d, NULL, ZCK_ERR_NOT_FOUND, "missing for trainable param scale", "scale/fp32.pt");
  free(d);
  /* stage-3 frozen fragments of another rank */
  d = fresh(b3, "u-nofrag");
  rs_sh("rm '%s/uc/zero_pp_rank_1_mp_rank_00_model_states.pt'%s", d, "");
  expect_refused(d, NULL, ZCK_ERR_NOT_FOUND, "zero_pp_rank_1_mp_rank_00_model_states.pt: missing (the frozen_param_fragments of dp rank 1 of 2)", "u-nofrag");
  free(d);
  /* group layouts */
  d = fresh(b2, "u-groups");
  char *p = rs_path("%s/uc/zero/optimizer_state.pt", d);
  rewrite_pt(p, drop_last_group);
  expect_refused(d, NULL, ZCK_ERR_MISMATCH, "param_groups has 1 groups but param_shapes", "optimizer_state.pt");
  free(p);
  free(d);
  d = fresh(b2, "u-nopg");
  p = rs_path("%s/uc/zero/optimizer_state.pt", d);
  rewrite_pt(p, no_param_groups);
  expect_refused(d, NULL, ZCK_ERR_FORMAT, "'param_groups' missing or not a list", "optimizer_state.pt");
  free(p);
  free(d);
  d = fresh(b2, "u-nolr");
  p = rs_path("%s/uc/zero/optimizer_state.pt", d);
  rewrite_pt(p, no_lr);
  expect_refused(d, NULL, ZCK_ERR_FORMAT, "param group 0 has no plain 'lr' hyper-parameter (missing)", "u-nolr/uc");
  free(p);
  free(d);
  d = fresh(b2, "u-twice");
  p = rs_path("%s/uc/mp_rank_00_model_states.pt", d);
  rewrite_pt(p, param_in_two_groups);
  expect_refused(d, NULL, ZCK_ERR_FORMAT, "'fc1.weight' appears twice in param_shapes (groups 0 and 1)",
                 "mp_rank_00_model_states.pt");
  free(p);
  free(d);
  edit_fn s3[3] = {subgroups_uncovered, subgroup_twice, empty_group};
  const char *needles[3] = {"param_groups cover 1 sub-groups but param_shapes", "a sub-group in two groups",
                            "param group 2 has no trainable parameter"};
  zck_status sts[3] = {ZCK_ERR_MISMATCH, ZCK_ERR_FORMAT, ZCK_ERR_FORMAT};
  for (int i = 0; i < 3; i++) {
    char name[32];
    snprintf(name, sizeof name, "u3-groups%d", i);
    d = fresh(b3, name);
    p = rs_path("%s/uc/zero/optimizer_state.pt", d);
    rewrite_pt(p, s3[i]);
    expect_refused(d, NULL, sts[i], needles[i], i < 2 ? "optimizer_state.pt" : name);
    free(p);
    free(d);
  }
  /* --tag means nothing for a universal source */
  zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
  o.tag = "global_step2";
  expect_refused(b2, &o, ZCK_ERR_INVALID_ARG, "--tag", NULL);
  free(b2);
  free(b3);
}

// ---- HDF5

/* obj deleted from a container made to look as one written before the checksum table
 * (whose count of pieces refuses any deleted dataset at open, before the check under test;
 * test_h5_checksums covers that) */
static void h5_unlink(const char *path, const char *obj) {
  hid_t f = h5e_open(path);
  h5e_make_old(f);
  ZT_ASSERT(H5Ldelete(f, obj, H5P_DEFAULT) >= 0);
  H5Fclose(f);
}

/* Replaces the JSON text attribute `key` of the root group after edit(json). */
static void h5_edit_json(const char *path, const char *key, void (*edit)(cJSON *)) {
  zck_h5_file *zf = NULL;
  ZT_OK(zck_h5_open(path, &zf));
  char *text = NULL;
  ZT_OK(zck_h5_attr_str(zf, "/", key, &text));
  zck_h5_close(zf);
  cJSON *j = cJSON_Parse(text);
  ZT_ASSERT(j);
  edit(j);
  char *nt = cJSON_PrintUnformatted(j);
  hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
  ZT_ASSERT(f >= 0);
  ZT_ASSERT(H5Adelete(f, key) >= 0);
  /* an edited container is one without the attributes' digest (as containers written before
   * it): with it, the edit would be refused as damage before the check under test */
  if (H5Aexists(f, ZCK_H5_ATTRS_XXH3_ATTR) > 0) ZT_ASSERT(H5Adelete(f, ZCK_H5_ATTRS_XXH3_ATTR) >= 0);
  hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate(H5S_SCALAR);
  H5Tset_size(t, strlen(nt));
  hid_t a = H5Acreate2(f, key, t, s, H5P_DEFAULT, H5P_DEFAULT);
  ZT_ASSERT(a >= 0 && H5Awrite(a, t, nt) >= 0);
  H5Aclose(a);
  H5Sclose(s);
  H5Tclose(t);
  H5Fclose(f);
  free(nt);
  cJSON_Delete(j);
  free(text);
}

static void json_param_twice(cJSON *groups) {
  cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(groups, 1), "params");
  cJSON_AddItemToArray(p, cJSON_CreateString("fc1.weight"));
}
static void json_empty_group(cJSON *groups) {
  cJSON *g = cJSON_CreateObject();
  cJSON_AddItemToObject(g, "params", cJSON_CreateArray());
  cJSON *hp = cJSON_CreateObject();
  cJSON_AddNumberToObject(hp, "lr", 0.01);
  cJSON_AddItemToObject(g, "hyperparameters", hp);
  cJSON_AddItemToArray(groups, g);
}
static void json_no_lr(cJSON *groups) {
  cJSON_DeleteItemFromObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(groups, 0), "hyperparameters"),
                                          "lr");
}
static void json_param_ungrouped(cJSON *groups) {
  cJSON *p = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(groups, 0), "params");
  cJSON_DeleteItemFromArray(p, 0);
}

static void hdf5_containers(void) {
  char *src = zt_fixture("deepspeed/s2w2_bf16/ckpt");
  char *h5 = rs_path("%s/base.h5", tmp);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(src, h5, &uo));
  struct { const char *name, *obj; zck_status st; const char *needle; } unl[] = {
    {"h-noexp", "/params/ln.bias/exp_avg", ZCK_ERR_NOT_FOUND, "/params/ln.bias/exp_avg"},
    {"h-nofp32", "/params/fc1.weight/fp32", ZCK_ERR_NOT_FOUND, "/params/fc1.weight/fp32"},
    {"h-nofrozen", "/frozen/frozen.weight", ZCK_ERR_NOT_FOUND, "dataset /frozen/frozen.weight missing for frozen parameter"},
  };
  for (size_t i = 0; i < sizeof unl / sizeof unl[0]; i++) {
    char *p = rs_path("%s/%s.h5", tmp, unl[i].name);
    rs_sh("cp '%s' '%s'", h5, p);
    h5_unlink(p, unl[i].obj);
    zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
    o.to_stage = 3;
    char *out = rs_path("%s/out%d", tmp, n_case++);
    zck_status st = zck_reshard(p, out, &o);
    if (st == ZCK_OK) ZT_FAIL("%s: reshard without %s succeeded", p, unl[i].obj);
    if (getenv("RS_VERBOSE")) fprintf(stderr, "  %s\n", zck_last_error());
    if (!strstr(zck_last_error(), unl[i].needle) || !strstr(zck_last_error(), unl[i].name))
      ZT_FAIL("%s: message \"%s\" lacks %s", p, zck_last_error(), unl[i].needle);
    rs_nothing_left(out);
    free(out);
    free(p);
  }
  struct { const char *name; void (*edit)(cJSON *); zck_status st; const char *needle; } ed[] = {
    {"h-twice", json_param_twice, ZCK_ERR_FORMAT, "h-twice.h5: parameter fc1.weight: in parameter groups 0 and 1"},
    {"h-empty", json_empty_group, ZCK_ERR_FORMAT, "param group 2 has no trainable parameter"},
    {"h-nolr", json_no_lr, ZCK_ERR_FORMAT, "param group 0 has no plain 'lr'"},
    {"h-ungrouped", json_param_ungrouped, ZCK_ERR_FORMAT, "is in no param group"},
  };
  for (size_t i = 0; i < sizeof ed / sizeof ed[0]; i++) {
    char *p = rs_path("%s/%s.h5", tmp, ed[i].name);
    rs_sh("cp '%s' '%s'", h5, p);
    h5_edit_json(p, "param_groups", ed[i].edit);
    expect_refused(p, NULL, ed[i].st, ed[i].needle, NULL);
    free(p);
  }
  /* no exp_avg datasets at all: the container describes no optimizer state */
  free(h5);
  free(src);
}

// ---- interrupted runs

static void faults(void) {
  char *ds = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  char *uv = universal("s3w2_bf16", "fault-uv");
  char *h5 = rs_path("%s/fault.h5", tmp);
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(ds, h5, &uo));
  const char *srcs[3] = {ds, uv, h5};
  struct { zck__io_op op; int err; } kinds[] = {
    {ZCK_IO_OP_WRITE, ENOSPC}, {ZCK_IO_OP_FSYNC, EIO}, {ZCK_IO_OP_RENAME, EIO}, {ZCK_IO_OP_READ, EIO}};
  char *dir = rs_path("%s/faults", tmp);
  rs_sh("mkdir -p '%s'", dir);
  char *out = rs_path("%s/out", dir);
  for (int si = 0; si < 3; si++)
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
      int failures = 0;
      for (uint64_t nth = 1;; nth = nth < 4 ? nth + 1 : nth * 3) {
        zck_reshard_opts o = ZCK_RESHARD_OPTS_INIT;
        o.to_stage = 1;
        o.to_world_size = 3;
        zck__io_fault_set(kinds[k].op, nth, kinds[k].err);
        zck_status st = zck_reshard(srcs[si], out, &o);
        zck__io_fault_set(kinds[k].op, 0, 0);
        if (st == ZCK_OK) break;   /* fewer such operations than nth */
        if (!zck_last_error()[0] || strchr(zck_last_error(), '\n')) ZT_FAIL("fault: no one-line message");
        size_t n;
        char **v = rs_list(dir, &n);
        if (n) ZT_FAIL("source %d, fault %zu #%llu (%s): left %s behind", si, k, (unsigned long long)nth,
                       zck_last_error(), v[0]);
        rs_free_list(v, n);
        failures++;
      }
      if (!failures && kinds[k].op != ZCK_IO_OP_READ) ZT_FAIL("source %d: fault %zu never hit", si, k);
      rs_sh("rm -rf '%s'", out);
    }
  free(out);
  free(dir);
  free(h5);
  free(uv);
  free(ds);
}

int main(void) {
  char *probe = zt_fixture("deepspeed/s3w2_bf16/ckpt");
  if (!rs_exists(probe)) zt_skip("DeepSpeed fixtures missing");
  free(probe);
  tmp = zt_tmpdir();
  deepspeed_sources();
  universal_folders();
  hdf5_containers();
  faults();
  printf("%d refused requests, nothing written\n", n_case);
  free(tmp);
  return 0;
}
