/* test_overlap_sim.c: overlap_comm on the device path, with the device simulated in host
 * memory (dzero_sim.c: the comm stream is a real worker thread per rank, closures run in
 * FIFO order, each delayed here so the collectives are slower than the compute, and memory
 * allocated on that stream reads NaN until the stream reaches it).
 *  (a) bits: for ZeRO 1, 2, 3 at W = 1, 2, 3, a few optimizer steps of two micro-batches
 *      give the same losses, gradient norms and final weights with overlap_comm on the sim,
 *      off on the sim, and on the CPU engine; also with persistent tensors and a reuse
 *      distance (stage 3), and through zckpt-train with overlap_comm true (every checkpoint
 *      file the same as the CPU engine's);
 *  (b) overlap happened: stage 3 issued its gathers on the comm stream, and modules began
 *      computing while a later module's gather was still in flight; stage 2/3 issued the
 *      gradient reductions there, and backward modules computed while one was in flight;
 *  (c) the waits matter: the same run with the compute stream's waits left out
 *      (ze_exec_opts.test_skip_waits) reads poisoned buffers, and its losses differ. */
#include "engine_cmp.h"

#include "dzero.h"
#include "zexec.h"

#include <pthread.h>

/* train.c (not in a header) */
zck_status ze_build_manifest(const ze_train_args *a, const ze_gpt2_config *cfg, bool one_group, zck_model **out);

static const ze_gpt2_config kCfg = {64, 8, 3, 2, 16};
enum { STEPS = 3, GAS = 2, B = 2 };

typedef enum { M_CPU = 0, M_SIM, M_OVERLAP } mode;

typedef struct job {
  const ze_zero_plan *plan;
  const float *init;
  zck_comm *comm, *dcomm;
  mode md;
  ze_exec_opts xo;
  unsigned delay_us;
  float loss[STEPS * GAS];
  double norm[STEPS];
  float *params;               /* rank 0: the final weights */
  ze_exec_stats stats;
  zck_status s;
  char msg[512];
} job;

static void tokens(int step, int m, int r, int *in, int *tg) {
  for (int i = 0; i < B * kCfg.max_seq_len; i++) {
    in[i] = (step * 131 + m * 71 + r * 37 + i * 13) % kCfg.vocab_size;
    tg[i] = (in[i] * 7 + 3) % kCfg.vocab_size;
  }
}

static zck_status rank_run(job *j, ze_zero_rank *zr) {
  int r = j->comm->rank, T = kCfg.max_seq_len;
  if (j->md == M_CPU) {
    ZCK_TRY(ze_zero_rank_init(zr, j->plan, j->comm, j->init));
  } else {
    ze_dzero_opts o = {&ze_dev_ops_sim, NULL, j->dcomm, 0, false, false, false, false, 0, j->md == M_OVERLAP,
                       j->delay_us};
    ze_dzero *d = NULL;
    ZCK_TRY(ze_dzero_new(&o, j->plan->o.stage, &d));
    ZCK_TRY(ze_zero_rank_init_dev(zr, j->plan, j->comm, d, j->init));
  }
  ze_exec *x = NULL;
  ZCK_TRY(ze_exec_new(&kCfg, zr, &j->xo, &x));
  ze_gpt2_ws *ws = ze_gpt2_ws_new(&kCfg, B, T);
  int in[B * 8], tg[B * 8];
  zck_status s = ws ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (int step = 0; step < STEPS && s == ZCK_OK; step++) {
    for (int m = 0; m < GAS && s == ZCK_OK; m++) {
      tokens(step, m, r, in, tg);
      s = ze_exec_train_micro(x, ws, in, tg, B, T, 1.0f / GAS, m == GAS - 1, &j->loss[step * GAS + m]);
    }
    if (s == ZCK_OK) s = ze_zero_grad_norm(zr, &j->norm[step]);
    ze_adamw_hp hp = {1e-2, 0.9, 0.999, 1e-8, 0.0};
    if (s == ZCK_OK) s = ze_zero_step(zr, &hp, ze_clip_factor(j->norm[step], 1.0));
  }
  if (s == ZCK_OK) s = ze_exec_full_params(x, j->params);
  j->stats = *ze_exec_get_stats(x);
  ze_exec_free(x);
  ze_gpt2_ws_free(ws);
  return s;
}

static void *rank_main(void *arg) {
  job *j = arg;
  ze_zero_rank zr;
  memset(&zr, 0, sizeof zr);
  j->s = rank_run(j, &zr);
  if (j->s != ZCK_OK) {
    snprintf(j->msg, sizeof j->msg, "%s", zck_last_error());
    j->comm->abort(j->comm);
    j->dcomm->abort(j->dcomm);
  }
  ze_zero_rank_free(&zr);
  return NULL;
}

typedef struct result {
  float loss[3][STEPS * GAS];  /* per rank */
  double norm[STEPS];
  float *params;
  ze_exec_stats stats[3];
} result;

static void run(int stage, int W, mode md, const ze_exec_opts *xo, unsigned delay_us, result *res) {
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = kCfg;
  a.bf16 = true;
  zck_model *model = NULL;
  ZT_OK(ze_build_manifest(&a, &kCfg, false, &model));
  size_t n_specs = ze_gpt2_n_tensors(&kCfg), numel = ze_gpt2_numel(&kCfg);
  ze_param_spec *specs = calloc(n_specs, sizeof *specs);
  uint64_t *off = calloc(model->n_params, sizeof *off);
  float *init = calloc(numel, sizeof *init);
  ze_gpt2_param_specs(&kCfg, specs);
  for (size_t i = 0; i < n_specs; i++) off[i] = specs[i].offset;
  ze_gpt2_init(&kCfg, init, 42);
  ze_zero_opts zo = {stage, (uint32_t)W, ZCK_BF16, 3000, 700, 300};
  ze_zero_plan plan;
  ZT_OK(ze_zero_plan_build(&plan, model, off, numel, &zo));
  zck_comm *comms[3] = {0}, *dcomms[3] = {0};
  ZT_OK(zck_comm_local_create(W, comms));
  ZT_OK(zck_comm_local_create(W, dcomms));
  job jobs[3];
  pthread_t th[3];
  res->params = calloc(numel, sizeof(float));
  for (int r = 0; r < W; r++) {
    jobs[r] = (job){&plan, init, comms[r], dcomms[r], md, *xo, delay_us, {0}, {0}, NULL, {0}, ZCK_OK, ""};
    jobs[r].params = r == 0 ? res->params : calloc(numel, sizeof(float));
    ZT_ASSERT(pthread_create(&th[r], NULL, rank_main, &jobs[r]) == 0);
  }
  for (int r = 0; r < W; r++) pthread_join(th[r], NULL);
  for (int r = 0; r < W; r++) {
    if (jobs[r].s != ZCK_OK) ZT_FAIL("stage %d W=%d mode %d rank %d: %s", stage, W, (int)md, r, jobs[r].msg);
    memcpy(res->loss[r], jobs[r].loss, sizeof jobs[r].loss);
    res->stats[r] = jobs[r].stats;
    if (r) free(jobs[r].params);
  }
  memcpy(res->norm, jobs[0].norm, sizeof res->norm);
  zck_comm_local_destroy(comms, W);
  zck_comm_local_destroy(dcomms, W);
  ze_zero_plan_free(&plan);
  zck_model_free(model);
  free(specs);
  free(off);
  free(init);
}

static bool same(const result *a, const result *b, int W) {
  size_t numel = ze_gpt2_numel(&kCfg);
  for (int r = 0; r < W; r++)
    if (memcmp(a->loss[r], b->loss[r], sizeof a->loss[r])) return false;
  return !memcmp(a->norm, b->norm, sizeof a->norm) && !memcmp(a->params, b->params, numel * sizeof(float));
}

static void engine_level(void) {
  /* prefetch about one block ahead; nothing persistent and no reuse, or some of each */
  ze_exec_opts plain = {3000, 1000000000, 0, 0, 0, true, false};
  ze_exec_opts resid = {3000, 1000000000, 40, 0, 4000, true, false};
  for (int stage = 1; stage <= 3; stage++)
    for (int W = 1; W <= 3; W++)
      for (int v = 0; v < (stage == 3 ? 2 : 1); v++) {
        const ze_exec_opts *xo = v ? &resid : &plain;
        result cpu, sim, ov;
        run(stage, W, M_CPU, xo, 0, &cpu);
        run(stage, W, M_SIM, xo, 0, &sim);
        run(stage, W, M_OVERLAP, xo, 200, &ov);
        if (!same(&cpu, &sim, W)) ZT_FAIL("stage %d W=%d: the sim differs from the CPU engine", stage, W);
        if (!same(&cpu, &ov, W)) ZT_FAIL("stage %d W=%d%s: overlap_comm differs from the CPU engine", stage, W,
                                         v ? " (persistence, reuse)" : "");
        for (int r = 0; r < W; r++) {
          const ze_exec_stats *st = &ov.stats[r];
          ZT_EQ_U64(sim.stats[r].async_gathers + sim.stats[r].async_reduces, 0);
          if (stage == 3) {
            ZT_ASSERT(st->async_gathers == st->gathers && st->prefetches > 0);
            if (st->overlapped_gathers == 0)
              ZT_FAIL("stage 3 W=%d rank %d: no module computed while a later gather was in flight", W, r);
          }
          if (stage >= 2) {
            ZT_ASSERT(st->async_reduces > 0);
            if (st->overlapped_reduces == 0)
              ZT_FAIL("stage %d W=%d rank %d: no backward module computed while a reduction was in flight", stage,
                      W, r);
          } else {
            ZT_EQ_U64(st->async_reduces, 0);
          }
        }
        printf("  zero%d W=%d%s: CPU = sim = overlap bits; rank 0: %llu gathers (%llu prefetched) on the comm stream, "
               "%llu computes with a gather in flight, %llu reductions, %llu computes with one in flight\n",
               stage, W, v ? " persist+reuse" : "", (unsigned long long)ov.stats[0].async_gathers,
               (unsigned long long)ov.stats[0].prefetches, (unsigned long long)ov.stats[0].overlapped_gathers,
               (unsigned long long)ov.stats[0].async_reduces, (unsigned long long)ov.stats[0].overlapped_reduces);
        free(cpu.params);
        free(sim.params);
        free(ov.params);
      }
}

/* (c): without the waits the compute reads buffers the comm stream has not filled yet. */
static void missing_waits(void) {
  ze_exec_opts xo = {3000, 1000000000, 0, 0, 0, true, false};
  result ok, bad;
  run(3, 2, M_OVERLAP, &xo, 2000, &ok);
  xo.test_skip_waits = true;
  run(3, 2, M_OVERLAP, &xo, 2000, &bad);
  if (same(&ok, &bad, 2)) ZT_FAIL("leaving out the waits changed nothing: the poisoning does not work");
  printf("  zero3 W=2 without the waits: first loss %g (with them %g): the poisoned buffers were read\n",
         (double)bad.loss[0][0], (double)ok.loss[0][0]);
  free(ok.params);
  free(bad.params);
}

/* Through zckpt-train with overlap_comm true: the sim and the CPU engine (which stays
 * synchronous); the same config, so the checkpoints are the same files. */
static void trainer_level(const char *tmp) {
  for (int stage = 1; stage <= 3; stage++)
    for (int W = 1; W <= 3; W++) {
      char zero[320], name[32], out[2][4200];
      ze_train_result res[2];
      snprintf(zero, sizeof zero,
               "{\"stage\": %d, \"reduce_bucket_size\": 700, \"overlap_comm\": true, \"sub_group_size\": 3000,"
               " \"stage3_gather_16bit_weights_on_model_save\": true, \"stage3_prefetch_bucket_size\": 3000,"
               " \"stage3_param_persistence_threshold\": 40, \"stage3_max_reuse_distance\": 4000}",
               stage);
      snprintf(name, sizeof name, "ov%d_w%d", stage, W);
      const char *cfg = ec_config(tmp, name, zero);
      for (int v = 0; v < 2; v++) {
        snprintf(name, sizeof name, "ov%d_w%d_%d", stage, W, v);
        snprintf(out[v], sizeof out[v], "%s/%s", tmp, name);
        ze_train_args a = ec_args(W, out[v], cfg);
        if (v) {
          a.device = "cuda";
          a.sim_device = true;
        }
        ec_run(&a, &res[v]);
      }
      ec_same_results("sim, overlap_comm true", &res[0], &res[1]);
      char ca[4300], cb[4300];
      snprintf(ca, sizeof ca, "%s/checkpoint-3", out[0]);
      snprintf(cb, sizeof cb, "%s/checkpoint-3", out[1]);
      ZT_ASSERT(ec_same_tree(ca, cb) >= 6);
      printf("  zckpt-train zero%d W=%d, overlap_comm true: sim = CPU results and checkpoint files\n", stage, W);
      for (int v = 0; v < 2; v++) ze_train_result_free(&res[v]);
    }
}

int main(void) {
  char *tmp = zt_tmpdir();
  ZT_ASSERT(tmp);
  engine_level();
  missing_waits();
  trainer_level(tmp);
  return 0;
}
