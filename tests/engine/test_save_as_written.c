/* test_save_as_written.c: zckpt-train's saves write the tag folder's zckpt-manifest.json
 * from the hashes the DeepSpeed writers made as they wrote the files, whether rank 0
 * writes every file (ranks as threads) or each rank its own (rank by rank, the hashes sent
 * to rank 0): nothing of the checkpoint is read back (lib/stream_hash.h
 * zck__manifest_reread_total), and the manifest is byte for byte the one made by reading
 * every file back, for ZeRO 1, 2 and 3 (bf16, frozen params included); with
 * --save-only-model, every file of the checkpoint folder (model.safetensors, config.json,
 * trainer_state.json) is hashed as written too, either way: rank by rank at ZeRO 3 the
 * ranks gather model.safetensors in file order for rank 0 to write (saver/gather16_ranks.c),
 * in windows that cut tensors too, and its bytes are those rank 0 writes from the threads'
 * memory. */
#include "test.h"

#include "manifest.h"
#include "saver_internal.h"
#include "stream_hash.h"
#include "train.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void read_or_fail(const char *path, unsigned char **d, size_t *n) {
  if (zt_read_file(path, d, n) != 0) ZT_FAIL("cannot read %s", path);
}

static void save_case(const char *tmp, int stage, bool per_rank) {
  char out[4096], tag[4200], mpath[4300];
  snprintf(out, sizeof out, "%s/s%d%s", tmp, stage, per_rank ? "r" : "");
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = (ze_gpt2_config){256, 32, 2, 2, 32};
  a.max_steps = 2;
  a.save_steps = 2;
  a.logging_steps = 1;
  a.eval_samples = 2;
  a.per_device_train_batch_size = 2;
  a.quiet = true;
  a.output_dir = out;
  a.zero_stage = stage;
  a.ranks = 2;
  a.bf16 = true;
  a.per_rank_io = per_rank;
  a.freeze[a.n_freeze++] = "transformer.h.1.mlp";
  uint64_t before = zck__manifest_reread_total();
  ze_train_result r;
  zck_status s = ze_train_run(&a, &r);
  if (s != ZCK_OK) ZT_FAIL("ze_train_run: %s: %s", zck_status_name(s), zck_last_error());
  ze_train_result_free(&r);
  uint64_t reread = zck__manifest_reread_total() - before;
  snprintf(tag, sizeof tag, "%s/checkpoint-2/global_step2", out);
  snprintf(mpath, sizeof mpath, "%s/%s", tag, ZCK_MANIFEST_NAME);
  unsigned char *m1 = NULL, *m2 = NULL;
  size_t n1 = 0, n2 = 0;
  read_or_fail(mpath, &m1, &n1);
  zck_manifest *m = NULL;
  ZT_OK(zck_manifest_read(tag, &m));
  ZT_ASSERT(m->n_files >= 3); /* a model file and two optimizer files at least */
  zck_manifest_free(m);
  if (reread)
    ZT_FAIL("stage %d%s: the save read %llu bytes of its checkpoint back", stage, per_rank ? " (rank by rank)" : "",
            (unsigned long long)reread);
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.kind = "deepspeed";
  ZT_OK(zck_manifest_write_dir(tag, &mo)); /* the same, read back */
  read_or_fail(mpath, &m2, &n2);
  if (n1 != n2 || memcmp(m1, m2, n1)) ZT_FAIL("stage %d%s: the manifest differs from the one read back", stage, per_rank ? " (rank by rank)" : "");
  free(m1);
  free(m2);
}

static uint64_t file_size(const char *dir, const char *name) {
  char p[4200];
  snprintf(p, sizeof p, "%s/%s", dir, name);
  unsigned char *d = NULL;
  size_t n = 0;
  read_or_fail(p, &d, &n);
  free(d);
  return n;
}

static bool same_file(const char *a, const char *b) {
  unsigned char *da = NULL, *db = NULL;
  size_t na = 0, nb = 0;
  read_or_fail(a, &da, &na);
  read_or_fail(b, &db, &nb);
  bool same = na == nb && !memcmp(da, db, na);
  free(da);
  free(db);
  return same;
}

/* --save-only-model: the checkpoint folder holds model.safetensors (the 16-bit weights
 * gathered from the ranks), config.json and trainer_state.json, all hashed as written.
 * window: rank by rank, the gather's window in bytes (0: the default). */
static void model_only_case(const char *tmp, int stage, bool per_rank, bool tight, size_t window, int ranks) {
  char out[4096], ck[4200], mpath[4300], w[16] = "";
  if (ranks != 2) snprintf(w, sizeof w, "W%d", ranks);
  snprintf(out, sizeof out, "%s/m%d%s%s%s%s", tmp, stage, w, per_rank ? "r" : "", tight ? "t" : "", window ? "w" : "");
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = (ze_gpt2_config){256, 32, 2, 2, 32};
  a.max_steps = 2;
  a.save_steps = 2;
  a.eval_samples = 2;
  a.per_device_train_batch_size = 2;
  a.quiet = true;
  a.output_dir = out;
  a.zero_stage = stage;
  a.ranks = ranks;
  a.bf16 = true;
  a.per_rank_io = per_rank;
  a.save_only_model = true;
  a.freeze[a.n_freeze++] = "transformer.h.1.mlp"; /* frozen weights among the cast masters */
  /* tight: a hash budget of 64 bytes stands for a model bigger than 64 MiB; one thread, so
   * that only the order of the copy decides what runs ahead of the file's hash cursor */
  if (tight) {
    zck__shash_set_default_budget(64);
    setenv("ZCK_THREADS", "1", 1);
  }
  zck__g16_set_window(window);
  uint64_t before = zck__manifest_reread_total();
  ze_train_result r;
  zck_status s = ze_train_run(&a, &r);
  zck__g16_set_window(0);
  if (tight) {
    zck__shash_set_default_budget(0);
    unsetenv("ZCK_THREADS");
  }
  if (s != ZCK_OK) ZT_FAIL("ze_train_run: %s: %s", zck_status_name(s), zck_last_error());
  ze_train_result_free(&r);
  uint64_t reread = zck__manifest_reread_total() - before;
  snprintf(ck, sizeof ck, "%s/checkpoint-2", out);
  uint64_t small = file_size(ck, "config.json") + file_size(ck, "trainer_state.json");
  if (reread)
    ZT_FAIL("stage %d, model only%s: %llu bytes of the checkpoint read back", stage, per_rank ? " (rank by rank)" : "",
            (unsigned long long)reread);
  ZT_ASSERT(file_size(ck, "model.safetensors") > small);
  snprintf(mpath, sizeof mpath, "%s/%s", ck, ZCK_MANIFEST_NAME);
  unsigned char *m1 = NULL, *m2 = NULL;
  size_t n1 = 0, n2 = 0;
  read_or_fail(mpath, &m1, &n1);
  zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
  mo.kind = "safetensors";
  ZT_OK(zck_manifest_write_dir(ck, &mo)); /* the same, read back */
  read_or_fail(mpath, &m2, &n2);
  if (n1 != n2 || memcmp(m1, m2, n1))
    ZT_FAIL("stage %d, model only%s: the manifest differs from the one read back", stage, per_rank ? " (rank by rank)" : "");
  free(m1);
  free(m2);
  if (per_rank || tight || window) {
    /* the same weights as rank 0 writes them from every thread rank's memory */
    char mine[4300], ref[4300];
    snprintf(mine, sizeof mine, "%s/model.safetensors", ck);
    snprintf(ref, sizeof ref, "%s/m%d%s/checkpoint-2/model.safetensors", tmp, stage, w);
    if (!same_file(mine, ref))
      ZT_FAIL("stage %d, model only%s: model.safetensors differs from the threads' save", stage, per_rank ? " (rank by rank)" : "");
  }
}

/* Rank by rank at ZeRO 3, an I/O call of the gathered model.safetensors fails (windows of
 * 1000 bytes, ~70 of them, 3 ranks that each write their own ranges): the nth write
 * (the 1st: rank 0's header, before the first window; later ones: any rank's, in any
 * window) or a rank's fsync of its writes. Every rank stops after the same window (a
 * collective out of step would hang or be refused by the thread backend), the run fails
 * with one message naming the file and the error, and the save leaves nothing behind. */
static void gather_io_fails(const char *tmp, zck__io_op op, uint64_t nth, int err) {
  char out[4096];
  snprintf(out, sizeof out, "%s/mfail%d_%llu", tmp, (int)op, (unsigned long long)nth);
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = (ze_gpt2_config){256, 32, 2, 2, 32};
  a.max_steps = 2;
  a.save_steps = 2;
  a.eval_samples = 2;
  a.per_device_train_batch_size = 2;
  a.quiet = true;
  a.output_dir = out;
  a.zero_stage = 3;
  a.ranks = 3;
  a.bf16 = true;
  a.per_rank_io = true;
  a.save_only_model = true;
  zck__g16_set_window(1000);
  zck__io_fault_set(op, nth, err);
  ze_train_result r;
  zck_status s = ze_train_run(&a, &r);
  zck__io_fault_set(op, 0, 0);
  zck__g16_set_window(0);
  const char *what = op == ZCK_IO_OP_WRITE ? "write" : "fsync";
  if (s == ZCK_OK) ZT_FAIL("a failed %s #%llu of model.safetensors: the run succeeded", what, (unsigned long long)nth);
  const char *e = zck_last_error();
  if (!strstr(e, "model.safetensors") || !strstr(e, what) || !strstr(e, strerror(err)) || strchr(e, '\n'))
    ZT_FAIL("a failed %s #%llu of model.safetensors: the message is '%s'", what, (unsigned long long)nth, e);
  DIR *d = opendir(out);
  for (struct dirent *de; d && (de = readdir(d));)
    if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
      ZT_FAIL("a failed %s #%llu of model.safetensors: %s/%s was left behind", what, (unsigned long long)nth, out, de->d_name);
  if (d) closedir(d);
}

int main(void) {
  char *tmp = zt_tmpdir();
  for (int stage = 1; stage <= 3; stage++) {
    save_case(tmp, stage, false);
    save_case(tmp, stage, true);
    model_only_case(tmp, stage, false, false, 0, 2);
    model_only_case(tmp, stage, true, false, 0, 2);
    model_only_case(tmp, stage, false, true, 0, 2);
  }
  /* rank by rank at ZeRO 3: windows of 1000 bytes cut tensors (and a 64-bit word of the
   * reduction may hold elements of two ranks' partitions) */
  model_only_case(tmp, 3, true, false, 1000, 2);
  model_only_case(tmp, 3, true, true, 0, 2);
  /* four ranks: three packets gathered to rank 0 in each window (the comm's gather) */
  model_only_case(tmp, 3, false, false, 0, 4);
  model_only_case(tmp, 3, true, false, 1000, 4);
  gather_io_fails(tmp, ZCK_IO_OP_WRITE, 1, ENOSPC);
  gather_io_fails(tmp, ZCK_IO_OP_WRITE, 4, ENOSPC);
  gather_io_fails(tmp, ZCK_IO_OP_WRITE, 40, ENOSPC);
  gather_io_fails(tmp, ZCK_IO_OP_FSYNC, 1, EIO);
  free(tmp);
  printf("ok: saves hash their checkpoint as written\n");
  return 0;
}
