/* test_dcp_write.c: `zckpt reshard --to-format dcp` (zck_reshard) read back by zckpt's own
 * DCP reader, which checks the whole file set's structure as strictly as it checks torch's
 * (items back to back, chunks covering each tensor once, every item a torch.save zip):
 * every trainable weight, exp_avg and exp_avg_sq equals the DeepSpeed source's bit for
 * bit, frozen params equal their saved 16-bit values, a tied alias has its own entry with
 * the owner's bytes, the param groups keep their settings and members, and there is one
 * file per target rank; from a universal folder or the HDF5 container, the same state. A source with a flipped byte in a tensor record is refused in one
 * line naming the file, and nothing is left at OUT. (tests/interop/interop_dcp_write.py
 * loads the same output under torch FSDP2.) */
#include "dcp/dcp.h"
#include "deepspeed/deepspeed.h"
#include "layout.h"
#include "test.h"
#include "torch/torch.h"
#include "transfer.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Every param a view's part holds, as whole float32 tensors in memory (mem[k][p]). */
typedef struct whole {
  zck_layout *layout[ZCK_STATE_KINDS];
  zck_store *stores[ZCK_STATE_KINDS];
  float **mem[ZCK_STATE_KINDS];
} whole;

static void to_memory(const zck_state_view *src, const zck_model *m, whole *w) {
  zck_state_view dst;
  memset(&dst, 0, sizeof dst);
  dst.model = m;
  dst.name = "memory";
  memset(w, 0, sizeof *w);
  uint64_t *numel = malloc((m->n_params + 1) * sizeof *numel);
  uint32_t *params = malloc((m->n_params + 1) * sizeof *params);
  zck_model_numels(m, numel);
  int kinds[] = {ZCK_STATE_FP32, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ, ZCK_STATE_FROZEN};
  for (size_t ki = 0; ki < 4; ki++) {
    int k = kinds[ki];
    const zck_layout *sl = src->part[k].layout;
    if (!sl) continue;
    size_t n = 0;
    for (uint32_t p = 0; p < m->n_params; p++)
      if (numel[p] && zck_layout_param_covered(sl, p) == numel[p]) params[n++] = p;
    ZT_OK(zck_layout_whole(m->n_params, numel, params, n, &w->layout[k]));
    w->stores[k] = calloc(n + 1, sizeof *w->stores[k]);
    w->mem[k] = calloc(m->n_params, sizeof *w->mem[k]);
    for (size_t i = 0; i < n; i++) {
      w->mem[k][params[i]] = calloc(numel[params[i]], sizeof(float));
      w->stores[k][i] = zck_store_memory(w->mem[k][params[i]], ZCK_F32, numel[params[i]], m->params[params[i]].name);
    }
    dst.part[k] = (zck_state_part){w->layout[k], w->stores[k], NULL};
  }
  ZT_OK(zck_transfer(src, &dst, 1, NULL));
  free(numel);
  free(params);
}

static void whole_free(whole *w, size_t n_params) {
  for (int k = 0; k < ZCK_STATE_KINDS; k++) {
    for (size_t p = 0; w->mem[k] && p < n_params; p++) free(w->mem[k][p]);
    free(w->mem[k]);
    free(w->stores[k]);
    zck_layout_free(w->layout[k]);
  }
}

static void check_case(const char *fixture, uint32_t world) {
  char *src = zt_fixture(fixture);
  char *tmp = zt_tmpdir();
  char out[4096];
  snprintf(out, sizeof out, "%s/dcp", tmp);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_format = ZCK_RESHARD_TO_DCP;
  ro.to_world_size = world;
  ZT_OK(zck_reshard(src, out, &ro));

  zck_ds_ckpt *ds;
  ZT_OK(zck_ds_open(src, NULL, &ds));
  zck_dcp *dc;
  ZT_OK(zck_dcp_open(out, NULL, &dc));
  const zck_model *sm = zck_ds_model(ds), *dm = zck_dcp_model(dc);
  const zck_dcp_info *in = zck_dcp_info_of(dc);
  ZT_EQ_INT(in->n_files, world);
  ZT_ASSERT(in->has_optimizer_state);
  ZT_ASSERT(in->save_id && strlen(in->save_id) == 36);

  zck_state_view sv, dv;
  zck_ds_state(ds, &sv);
  zck_dcp_state(dc, &dv);
  whole sw, dw;
  to_memory(&sv, sm, &sw);
  to_memory(&dv, dm, &dw);
  size_t checked = 0;
  for (size_t p = 0; p < sm->n_params; p++) {
    const zck_param *sp = &sm->params[p];
    if (!sp->numel) continue;
    int64_t q = zck_model_find_param(dm, sp->name);
    if (q < 0) ZT_FAIL("%s: %s is not in the DCP output", fixture, sp->name);
    ZT_EQ_U64(dm->params[q].numel, sp->numel);
    uint32_t owner = zck_model_owner(sm, (uint32_t)p);
    size_t bytes = sp->numel * sizeof(float);
    if (sm->params[owner].frozen) {
      /* frozen: its saved 16-bit value, widened */
      ZT_ASSERT(dm->params[q].frozen && dw.mem[ZCK_STATE_FROZEN][q] && sw.mem[ZCK_STATE_FROZEN][owner]);
      ZT_EQ_MEM(dw.mem[ZCK_STATE_FROZEN][q], sw.mem[ZCK_STATE_FROZEN][owner], bytes);
    } else if (owner != p) {
      /* a tied alias: its own model entry, the owner's bytes (no optimizer state of its own) */
      ZT_ASSERT(dm->params[q].frozen && dw.mem[ZCK_STATE_FROZEN][q]);
      ZT_EQ_MEM(dw.mem[ZCK_STATE_FROZEN][q], sw.mem[ZCK_STATE_FP32][owner], bytes);
    } else {
      for (int k = ZCK_STATE_FP32; k <= ZCK_STATE_EXP_AVG_SQ; k++) {
        if (!dw.mem[k][q] || !sw.mem[k][p]) ZT_FAIL("%s: %s: state %d missing", fixture, sp->name, k);
        if (memcmp(dw.mem[k][q], sw.mem[k][p], bytes)) ZT_FAIL("%s: %s: state %d differs", fixture, sp->name, k);
      }
    }
    checked++;
  }
  ZT_ASSERT(checked > 0);
  /* param groups: the same settings; members by name, aliases left out */
  ZT_EQ_INT(dm->n_groups, sm->n_groups);
  for (uint32_t g = 0; g < sm->n_groups; g++) {
    const zck_param_group *a = &sm->groups[g];
    for (size_t h = 0; h < a->n_hparams; h++) {
      const zck_hparam *x = &a->hparams[h], *y = zck_model_group_get(dm, g, x->key);
      if (!y) ZT_FAIL("%s: group %u: %s missing", fixture, g, x->key);
      ZT_EQ_INT(y->kind, x->kind);
      if (x->kind == ZCK_HP_FLOAT || x->kind == ZCK_HP_FLOATS) ZT_EQ_MEM(y->f, x->f, sizeof x->f);
      if (x->kind == ZCK_HP_INT || x->kind == ZCK_HP_BOOL) ZT_EQ_INT(y->i, x->i);
    }
    size_t j = 0;
    for (size_t i = 0; i < a->n_params; i++) {
      const zck_param *sp = &sm->params[a->params[i]];
      if (sp->tied_to >= 0) continue;
      ZT_ASSERT(j < dm->groups[g].n_params);
      ZT_EQ_STR(dm->params[dm->groups[g].params[j++]].name, sp->name);
    }
    ZT_EQ_INT(j, dm->groups[g].n_params);
  }
  whole_free(&sw, sm->n_params);
  whole_free(&dw, dm->n_params);
  zck_dcp_close(dc);
  zck_ds_close(ds);

  /* OUT exists now: a second run is refused and leaves it as it is */
  ZT_ERR(zck_reshard(src, out, &ro), ZCK_ERR_EXISTS, "");
  free(src);
  free(tmp);
}

/* Copies the regular files of from/ into to/ (one level: a tag folder). */
static void copy_files(const char *from, const char *to) {
  ZT_ASSERT(mkdir(to, 0755) == 0);
  DIR *d = opendir(from);
  ZT_ASSERT(d);
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    char a[4096], b[4096];
    snprintf(a, sizeof a, "%s/%s", from, e->d_name);
    snprintf(b, sizeof b, "%s/%s", to, e->d_name);
    struct stat sb;
    ZT_ASSERT(stat(a, &sb) == 0);
    if (!S_ISREG(sb.st_mode)) continue;
    unsigned char *data;
    size_t n;
    ZT_ASSERT(zt_read_file(a, &data, &n) == 0);
    ZT_ASSERT(zt_write_file(b, data, n) == 0);
    free(data);
  }
  closedir(d);
}

/* A byte flipped in the middle of the largest record of rank 1's optimizer file. */
static void check_damaged(void) {
  char *tag = zt_fixture("deepspeed/s3w2_bf16/ckpt/global_step2");
  char *tmp = zt_tmpdir();
  char dir[4096], file[4096], out[4096];
  snprintf(dir, sizeof dir, "%s/global_step2", tmp);
  copy_files(tag, dir);
  snprintf(file, sizeof file, "%s/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", dir);
  zck_torch_file *tf;
  ZT_OK(zck_torch_open(file, NULL, &tf));
  const zck_torch_storage *big = NULL;
  for (size_t i = 0; i < zck_torch_storage_count(tf); i++)
    if (!big || zck_torch_storage_at(tf, i)->nbytes > big->nbytes) big = zck_torch_storage_at(tf, i);
  uint64_t at = big->data_offset + big->nbytes / 2;
  zck_torch_close(tf);
  unsigned char *data;
  size_t n;
  ZT_ASSERT(zt_read_file(file, &data, &n) == 0);
  data[at] ^= 0x10;
  ZT_ASSERT(zt_write_file(file, data, n) == 0);
  free(data);
  snprintf(out, sizeof out, "%s/dcp", tmp);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_format = ZCK_RESHARD_TO_DCP;
  ro.to_world_size = 2;
  ZT_ERR(zck_reshard(dir, out, &ro), ZCK_ERR_DAMAGED, "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt");
  ZT_ASSERT(!strchr(zck_last_error(), '\n'));
  struct stat sb;
  ZT_ASSERT(stat(out, &sb) != 0);
  DIR *d = opendir(tmp);
  struct dirent *e;
  while ((e = readdir(d)))
    if (strstr(e->d_name, "dcp")) ZT_FAIL("left at OUT's place: %s", e->d_name);
  closedir(d);
  free(tag);
  free(tmp);
}

static bool same_file(const char *a, const char *b) {
  unsigned char *x, *y;
  size_t nx, ny;
  ZT_ASSERT(zt_read_file(a, &x, &nx) == 0 && zt_read_file(b, &y, &ny) == 0);
  bool same = nx == ny && !memcmp(x, y, nx);
  free(x);
  free(y);
  return same;
}

/* Two DCP folders hold the same state: every model weight (by name), exp_avg, exp_avg_sq,
 * and the same param groups. */
static void same_state(const char *a, const char *b) {
  zck_dcp *ca, *cb;
  ZT_OK(zck_dcp_open(a, NULL, &ca));
  ZT_OK(zck_dcp_open(b, NULL, &cb));
  const zck_model *ma = zck_dcp_model(ca), *mb = zck_dcp_model(cb);
  zck_state_view va, vb;
  zck_dcp_state(ca, &va);
  zck_dcp_state(cb, &vb);
  whole wa, wb;
  to_memory(&va, ma, &wa);
  to_memory(&vb, mb, &wb);
  ZT_EQ_INT(ma->n_params, mb->n_params);
  for (size_t p = 0; p < ma->n_params; p++) {
    int64_t q = zck_model_find_param(mb, ma->params[p].name);
    ZT_ASSERT(q >= 0 && mb->params[q].frozen == ma->params[p].frozen);
    for (int k = 0; k < ZCK_STATE_KINDS; k++) {
      ZT_ASSERT(!wa.mem[k] == !wb.mem[k]);
      if (!wa.mem[k] || !ma->params[p].numel) continue;
      ZT_ASSERT(!wa.mem[k][p] == !wb.mem[k][q]);
      if (wa.mem[k][p] && memcmp(wa.mem[k][p], wb.mem[k][q], ma->params[p].numel * sizeof(float)))
        ZT_FAIL("%s: state %d of %s differs from %s's", b, k, ma->params[p].name, a);
    }
  }
  ZT_EQ_INT(ma->n_groups, mb->n_groups);
  for (uint32_t g = 0; g < ma->n_groups; g++) {
    ZT_EQ_INT(ma->groups[g].n_params, mb->groups[g].n_params);
    for (size_t i = 0; i < ma->groups[g].n_params; i++)
      ZT_EQ_STR(ma->params[ma->groups[g].params[i]].name, mb->params[mb->groups[g].params[i]].name);
    ZT_EQ_INT(ma->groups[g].n_hparams, mb->groups[g].n_hparams);
  }
  whole_free(&wa, ma->n_params);
  whole_free(&wb, mb->n_params);
  zck_dcp_close(ca);
  zck_dcp_close(cb);
}

/* From the universal folder of a checkpoint: the direct conversion's data files byte for
 * byte (only .metadata's save_id is new each time); from the HDF5 container the same
 * state (the container lists params in group order, so the entries come in that order). */
static void check_universal(const char *fixture, uint32_t world) {
  char *src = zt_fixture(fixture);
  char *tmp = zt_tmpdir();
  char direct[4096], uv[4096], h5[4096];
  snprintf(direct, sizeof direct, "%s/direct", tmp);
  snprintf(uv, sizeof uv, "%s/uv", tmp);
  snprintf(h5, sizeof h5, "%s/u.h5", tmp);
  zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
  ro.to_format = ZCK_RESHARD_TO_DCP;
  ro.to_world_size = world;
  ZT_OK(zck_reshard(src, direct, &ro));
  zck_universal_opts uo = ZCK_UNIVERSAL_OPTS_INIT;
  uo.inject_missing_state = 1; /* a fixture saved without universal_checkpoint_info */
  ZT_OK(zck_to_universal(src, uv, &uo));
  uo.format = ZCK_UNIVERSAL_HDF5;
  ZT_OK(zck_to_universal(src, h5, &uo));
  const char *from[] = {uv, h5};
  for (int i = 0; i < 2; i++) {
    char out[4096];
    snprintf(out, sizeof out, "%s/dcp%d", tmp, i);
    ZT_OK(zck_reshard(from[i], out, &ro));
    same_state(direct, out);
    for (uint32_t r = 0; i == 0 && r < world; r++) {
      char a[4200], b[4200];
      snprintf(a, sizeof a, "%s/__%u_0.distcp", direct, r);
      snprintf(b, sizeof b, "%s/__%u_0.distcp", out, r);
      if (!same_file(a, b)) ZT_FAIL("%s: %s differs from the direct conversion's", from[i], b);
    }
  }
  free(src);
  free(tmp);
}

int main(void) {
  check_damaged();
  check_universal("deepspeed/s3w2_bf16/ckpt", 3);
  check_universal("deepspeed/s2w2_fp32_roundrobin/ckpt", 2);
  check_case("deepspeed/s3w2_bf16/ckpt", 3);          /* ZeRO-3: frozen, tied, a 1-element param (empty chunks) */
  check_case("deepspeed/s2w2_fp32_roundrobin/ckpt", 2);
  check_case("deepspeed/s1w3_bf16_3groups/ckpt", 1);  /* three groups, everything in rank 0's file */
  return 0;
}
