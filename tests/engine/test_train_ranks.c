/* test_train_ranks.c: the engine's process-per-rank path, run in one process: W threads,
 * each calling ze_train_run with its own handle of a local comm group, as W processes do
 * with the MPI backend (same collectives, same bits by the comm contract). Checks, for
 * ZeRO 1, 2, 3 and W = 2, 3:
 *  - every file of every checkpoint is byte-identical to the thread mode's (one writer on
 *    rank 0), and so are the losses; the thread mode with per-rank I/O forced too;
 *  - stage-3 model.safetensors written rank by rank (gather on save);
 *  - resume at another W / stage (rank 0 reshards once, every rank reads) gives the thread
 *    mode's resume bit for bit, and nothing temporary is left;
 *  - --load-best-model-at-end reloads every rank's own partitions (same final weights);
 *  - a setup failure on one rank reaches all of them as one error.
 * The real processes (mpirun, --nproc, a killed rank, a hung one) are
 * tests/engine/train_procs.sh. */
#include "test.h"

#include "comm.h"
#include "io.h"
#include "train.h"

#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/stat.h>

typedef struct rank_run {
  ze_train_args a;
  ze_train_result r;
  zck_status s;
  char msg[1024];
  pthread_t th;
} rank_run;

static void *rank_main(void *p) {
  rank_run *x = p;
  x->s = ze_train_run(&x->a, &x->r);
  if (x->s != ZCK_OK) snprintf(x->msg, sizeof x->msg, "%s", zck_last_error());
  return NULL;
}

/* Runs a as W "processes" (threads with one rank each); rank 0's result into r0, every
 * rank's status returned (the first failure's message in msg). */
static zck_status run_ranks(const ze_train_args *a, int W, ze_train_result *r0, char *msg, size_t cap) {
  zck_comm *comms[8];
  rank_run *x = calloc((size_t)W, sizeof *x);
  ZT_ASSERT(x && W <= 8);
  ZT_OK(zck_comm_local_create(W, comms));
  for (int r = 0; r < W; r++) {
    x[r].a = *a;
    x[r].a.ranks = 1;
    x[r].a.comm = comms[r];
    ZT_ASSERT(pthread_create(&x[r].th, NULL, rank_main, &x[r]) == 0);
  }
  for (int r = 0; r < W; r++) pthread_join(x[r].th, NULL);
  zck_comm_local_destroy(comms, W);
  zck_status s = ZCK_OK;
  for (int r = 0; r < W; r++) {
    if (x[r].s != ZCK_OK && s == ZCK_OK) {
      s = x[r].s;
      if (msg) snprintf(msg, cap, "%s", x[r].msg);
    }
    /* every rank returns the same losses */
    if (x[r].s == ZCK_OK && r > 0) {
      ZT_EQ_INT(x[r].r.steps, x[0].r.steps);
      ZT_EQ_MEM(x[r].r.losses, x[0].r.losses, (size_t)x[0].r.steps * sizeof(float));
      ZT_ASSERT(!x[r].r.generated[0] && !x[r].r.generated[1]); /* only rank 0 prints */
    }
    if (r > 0) ze_train_result_free(&x[r].r);
  }
  *r0 = x[0].r;
  free(x);
  return s;
}

static void run_ok(const ze_train_args *a, ze_train_result *r) {
  zck_status s = ze_train_run(a, r);
  if (s != ZCK_OK) ZT_FAIL("ze_train_run: %s: %s", zck_status_name(s), zck_last_error());
}

static void run_ranks_ok(const ze_train_args *a, int W, ze_train_result *r) {
  char msg[1024] = "";
  zck_status s = run_ranks(a, W, r, msg, sizeof msg);
  if (s != ZCK_OK) ZT_FAIL("ranks: %s: %s", zck_status_name(s), msg);
}

/* Every regular file under a and b: the same names, the same bytes. Returns the count. */
static int compare_trees(const char *a, const char *b) {
  DIR *d = opendir(a);
  if (!d) ZT_FAIL("%s: cannot open", a);
  int n = 0, na = 0, nb = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char pa[4096], pb[4096];
    snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
    snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
    struct stat sa, sb;
    ZT_ASSERT(lstat(pa, &sa) == 0);
    if (lstat(pb, &sb) != 0) ZT_FAIL("%s exists, %s does not", pa, pb);
    na++;
    if (S_ISDIR(sa.st_mode)) {
      ZT_ASSERT(S_ISDIR(sb.st_mode));
      n += compare_trees(pa, pb);
      continue;
    }
    unsigned char *da = NULL, *db = NULL;
    size_t la = 0, lb = 0;
    ZT_ASSERT(zt_read_file(pa, &da, &la) == 0 && zt_read_file(pb, &db, &lb) == 0);
    if (la != lb || memcmp(da, db, la)) ZT_FAIL("%s and %s differ (%zu vs %zu bytes)", pa, pb, la, lb);
    free(da);
    free(db);
    n++;
  }
  closedir(d);
  d = opendir(b);
  for (struct dirent *e; d && (e = readdir(d));)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) nb++;
  if (d) closedir(d);
  if (na != nb) ZT_FAIL("%s has %d entries, %s has %d", a, na, b, nb);
  return n;
}

static ze_train_args base_args(const char *out) {
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = (ze_gpt2_config){256, 32, 2, 2, 32};
  a.max_steps = 6;
  a.learning_rate = 3e-3;
  a.weight_decay = 0.1;
  a.warmup_steps = 2;
  a.logging_steps = 2;
  a.eval_samples = 4;
  a.per_device_train_batch_size = 2;
  a.quiet = true;
  a.output_dir = out;
  a.save_steps = 3;
  return a;
}

static void move(const char *from, const char *to) {
  if (rename(from, to) != 0) ZT_FAIL("rename %s -> %s failed", from, to);
}

static void no_temporaries(const char *dir) {
  DIR *d = opendir(dir);
  for (struct dirent *e; d && (e = readdir(d));)
    if (strstr(e->d_name, "zck-tmp") || strstr(e->d_name, "resharded") || strstr(e->d_name, ".rank-"))
      ZT_FAIL("%s/%s: left behind", dir, e->d_name);
  if (d) closedir(d);
}

/* thread mode, thread mode with per-rank I/O, and ranks-as-processes: same files, same
 * losses. Each run uses the same output folder name (trainer_state.json holds paths). */
static void same_case(const char *tmp, const char *label, ze_train_args a, int W) {
  char run[4096], t1[4200], t2[4200], t3[4200];
  snprintf(run, sizeof run, "%s/run", tmp);
  snprintf(t1, sizeof t1, "%s/%s-threads", tmp, label);
  snprintf(t2, sizeof t2, "%s/%s-threads-per-rank", tmp, label);
  snprintf(t3, sizeof t3, "%s/%s-ranks", tmp, label);
  a.output_dir = run;
  ze_train_result r1, r2, r3;
  a.ranks = W;
  run_ok(&a, &r1);
  move(run, t1);
  a.per_rank_io = true;
  run_ok(&a, &r2);
  move(run, t2);
  a.per_rank_io = false;
  run_ranks_ok(&a, W, &r3);
  no_temporaries(run);
  move(run, t3);
  ZT_EQ_INT(r1.steps, a.max_steps);
  ZT_EQ_INT(r3.steps, r1.steps);
  ZT_EQ_MEM(r2.losses, r1.losses, (size_t)r1.steps * sizeof(float));
  ZT_EQ_MEM(r3.losses, r1.losses, (size_t)r1.steps * sizeof(float));
  ZT_ASSERT(r3.final_eval_loss == r1.final_eval_loss);
  int n = compare_trees(t1, t2);
  ZT_EQ_INT(compare_trees(t1, t3), n);
  ZT_ASSERT(n >= 8);
  ze_train_result_free(&r1);
  ze_train_result_free(&r2);
  ze_train_result_free(&r3);
}

int main(void) {
  char *tmp = zt_tmpdir();
  char ds3[4200], label[64];
  snprintf(ds3, sizeof ds3, "%s/ds3.json", tmp);
  const char *json = "{\"bf16\": {\"enabled\": \"auto\"}, \"zero_optimization\": {\"stage\": 3, "
                     "\"stage3_gather_16bit_weights_on_model_save\": true, \"sub_group_size\": 3000}}";
  ZT_ASSERT(zt_write_file(ds3, json, strlen(json)) == 0);
  for (int stage = 1; stage <= 3; stage++)
    for (int W = 2; W <= 3; W++) {
      ze_train_args a = base_args(NULL);
      a.zero_stage = stage;
      a.bf16 = W == 3;
      if (stage == 2 && W == 3) a.freeze[a.n_freeze++] = "transformer.h.1.mlp";
      snprintf(label, sizeof label, "s%dw%d", stage, W);
      same_case(tmp, label, a, W);
    }
  /* stage 3 with several sub-groups, frozen params and model.safetensors gathered on save */
  {
    ze_train_args a = base_args(NULL);
    a.deepspeed = ds3;
    a.bf16 = true;
    a.freeze[a.n_freeze++] = "transformer.wpe";
    same_case(tmp, "g16w3", a, 3);
    a.save_only_model = true;
    same_case(tmp, "g16only", a, 2);
  }

  /* ---- resume at another W / stage: the thread mode's resume, bit for bit */
  {
    char ck[4200], out[4200];
    snprintf(ck, sizeof ck, "%s/s3w3-threads/checkpoint-3", tmp);
    static const int targets[][2] = {{1, 2}, {3, 2}, {2, 3}, {3, 3}}; /* the last one: no reshard */
    for (size_t i = 0; i < 4; i++) {
      ze_train_args a = base_args(NULL);
      a.bf16 = true;
      a.zero_stage = targets[i][0];
      a.resume_from_checkpoint = ck;
      snprintf(out, sizeof out, "%s/resume%zu", tmp, i);
      a.output_dir = out;
      a.save_steps = 100;
      ze_train_result r1, r3;
      a.ranks = targets[i][1];
      run_ok(&a, &r1);
      run_ranks_ok(&a, targets[i][1], &r3);
      ZT_EQ_INT(r1.first_step, 3);
      ZT_EQ_INT(r3.first_step, 3);
      ZT_EQ_INT(r3.steps, r1.steps);
      ZT_EQ_MEM(r3.losses, r1.losses, (size_t)r1.steps * sizeof(float));
      ZT_ASSERT(r3.final_eval_loss == r1.final_eval_loss);
      no_temporaries(out);
      ze_train_result_free(&r1);
      ze_train_result_free(&r3);
    }
  }

  /* ---- the best model reloaded rank by rank */
  {
    char out[4200];
    snprintf(out, sizeof out, "%s/best", tmp);
    ze_train_args a = base_args(out);
    a.max_steps = 8;
    a.eval_steps = 2;
    a.save_steps = 2;
    a.save_total_limit = 1;
    a.load_best_model_at_end = true;
    a.keep_params = true;
    a.zero_stage = 3;
    a.greater_is_better = true; /* the highest eval loss: an early checkpoint, not the last */
    ze_train_result r1, r3;
    a.ranks = 2;
    run_ok(&a, &r1);
    zck__remove_tree(out);
    run_ranks_ok(&a, 2, &r3);
    ZT_ASSERT(r1.best_checkpoint && r3.best_checkpoint);
    ZT_EQ_STR(r3.best_checkpoint, r1.best_checkpoint);
    ZT_ASSERT(strstr(r1.best_checkpoint, "/checkpoint-2"));
    ZT_EQ_U64(r3.n_params, r1.n_params);
    ZT_EQ_MEM(r3.params, r1.params, r1.n_params * sizeof(float));
    ze_train_result_free(&r1);
    ze_train_result_free(&r3);
  }

  /* ---- a failure on every rank (a bad config) is one error, not a hang */
  {
    ze_train_args a = base_args(NULL);
    a.deepspeed = "/nonexistent/ds.json";
    ze_train_result r;
    char msg[1024] = "";
    ZT_ASSERT(run_ranks(&a, 2, &r, msg, sizeof msg) != ZCK_OK);
    ZT_ASSERT(strstr(msg, "/nonexistent/ds.json"));
    ze_train_result_free(&r);
  }
  free(tmp);
  return 0;
}
