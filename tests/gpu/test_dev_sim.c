/* test_dev_sim.c: zckpt-train's --device cuda path with the device simulated in host memory
 * (ze_train_args.sim_device: dzero.h's sim backend), so that everything but the kernels
 * runs on machines without a GPU: the ZeRO state placed on the "device" or offloaded,
 * every copy between the two, the collectives on a separate device group, the module
 * executor's gathers and reductions into device buffers, the savers reading through
 * callback stores, the stage-3 on-save gather plan (bucketed) and the restore.
 * The sim backend does the CPU's arithmetic, so each run must equal the CPU engine's bit
 * for bit: losses, gradient norms, evaluation, final weights and every file of the saved
 * checkpoint, for ZeRO 1, 2 and 3 at W = 1 and 3, with offload_optimizer / offload_param
 * (pinned or not), per-rank checkpoint files, resume and --load-best-model-at-end. The
 * device ledger (ze_train_result.mem) holds what DeepSpeed keeps on the GPU: the same
 * persistent bytes as the CPU run without offload; with offload the optimizer states (and
 * at stage 3 the 16-bit partitions) move to mem_host. Also the staging of lp = RNE(master)
 * between host and device in chunks, on more elements than one chunk. */
#include "engine_cmp.h"

#include "dzero.h"

static char *tmp;

static const char *const kZero[4] = {
    NULL, "{\"stage\": 1, \"reduce_bucket_size\": 700, \"allgather_bucket_size\": 300}",
    "{\"stage\": 2, \"reduce_bucket_size\": 700, \"allgather_bucket_size\": 300}",
    /* allgather_bucket_size: the on-save gather's bucket, 100 elements: many buckets */
    "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
    " \"reduce_bucket_size\": 700, \"stage3_prefetch_bucket_size\": 5000, \"allgather_bucket_size\": 100}"};

/* CPU and sim runs of one configuration; returns the sim result (the CPU's in *cpu_out). */
static void pair(const char *name, int W, const char *zero_json, bool per_rank, ze_train_result *cpu,
                 ze_train_result *sim) {
  char cfg_name[64], out_c[4200], out_s[4200], ck_c[4300], ck_s[4300];
  snprintf(cfg_name, sizeof cfg_name, "%s_w%d", name, W);
  const char *cfg = ec_config(tmp, cfg_name, zero_json);
  snprintf(out_c, sizeof out_c, "%s/%s_w%d_cpu", tmp, name, W);
  snprintf(out_s, sizeof out_s, "%s/%s_w%d_sim", tmp, name, W);
  ze_train_args a = ec_args(W, out_c, cfg);
  ec_run(&a, cpu);
  a.output_dir = out_s;
  a.device = "cuda";
  a.sim_device = true;
  a.per_rank_io = per_rank;
  ec_run(&a, sim);
  ZT_ASSERT(sim->mem_on_device && !cpu->mem_on_device);
  ec_same_results(cfg_name, cpu, sim);
  snprintf(ck_c, sizeof ck_c, "%s/checkpoint-3", out_c);
  snprintf(ck_s, sizeof ck_s, "%s/checkpoint-3", out_s);
  int files = ec_same_tree(ck_c, ck_s);
  ZT_ASSERT(files >= 6);
  printf("  %-12s W=%d%s: same results and %d identical checkpoint files\n", name, W, per_rank ? " per rank" : "", files);
}

static const int kPersistent[] = {ZE_MEM_LP, ZE_MEM_MASTER, ZE_MEM_EXP_AVG, ZE_MEM_EXP_AVG_SQ, ZE_MEM_GRAD,
                                  ZE_MEM_GRAD_FULL};

static void stages(void) {
  for (int stage = 1; stage <= 3; stage++)
    for (int W = 1; W <= 3; W += 2) {
      char name[16];
      snprintf(name, sizeof name, "zero%d", stage);
      ze_train_result c, s;
      pair(name, W, kZero[stage], false, &c, &s);
      /* the device holds what the CPU run held, nothing on the host */
      for (int k = 0; k < W; k++) {
        for (size_t i = 0; i < sizeof kPersistent / sizeof kPersistent[0]; i++)
          ZT_EQ_U64(s.mem[k].max[kPersistent[i]], c.mem[k].max[kPersistent[i]]);
        ZT_EQ_U64(s.mem_host[k].peak, 0);
        ZT_EQ_U64(s.dev_workspace[k], 0); /* sim: the activations stay in the CPU workspace */
      }
      ze_train_result_free(&c);
      ze_train_result_free(&s);
    }
}

static void offload(void) {
  static const char *const cfgs[4] = {
      NULL,
      "{\"stage\": 1, \"reduce_bucket_size\": 700, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}}",
      "{\"stage\": 2, \"reduce_bucket_size\": 700, \"offload_optimizer\": {\"device\": \"cpu\"}}",
      "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
      " \"reduce_bucket_size\": 700, \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true},"
      " \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": false}}"};
  for (int stage = 1; stage <= 3; stage++) {
    char name[16];
    snprintf(name, sizeof name, "offload%d", stage);
    ze_train_result c, s;
    pair(name, 3, cfgs[stage], false, &c, &s);
    for (int k = 0; k < 3; k++) {
      /* optimizer states on the host; the 16-bit params too at stage 3 (offload_param) */
      ZT_EQ_U64(s.mem[k].max[ZE_MEM_MASTER], 0);
      ZT_EQ_U64(s.mem[k].max[ZE_MEM_GRAD], 0);
      ZT_EQ_U64(s.mem_host[k].max[ZE_MEM_MASTER], c.mem[k].max[ZE_MEM_MASTER]);
      ZT_EQ_U64(s.mem_host[k].max[ZE_MEM_EXP_AVG], c.mem[k].max[ZE_MEM_EXP_AVG]);
      ZT_EQ_U64(s.mem_host[k].max[ZE_MEM_EXP_AVG_SQ], c.mem[k].max[ZE_MEM_EXP_AVG_SQ]);
      ZT_EQ_U64(s.mem_host[k].max[ZE_MEM_GRAD], c.mem[k].max[ZE_MEM_GRAD]);
      ZT_EQ_U64(s.mem[k].max[ZE_MEM_LP], stage == 3 ? 0 : c.mem[k].max[ZE_MEM_LP]);
      ZT_EQ_U64(s.mem_host[k].max[ZE_MEM_LP], stage == 3 ? c.mem[k].max[ZE_MEM_LP] : 0);
      ZT_ASSERT(s.mem[k].peak < c.mem[k].peak);
    }
    ze_train_result_free(&c);
    ze_train_result_free(&s);
  }
  /* offload_param alone: the masters on the device, the 16-bit partitions on the host */
  ze_train_result c, s;
  pair("offparam3", 3,
       "{\"stage\": 3, \"sub_group_size\": 3000, \"stage3_gather_16bit_weights_on_model_save\": true,"
       " \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}}",
       false, &c, &s);
  ZT_EQ_U64(s.mem[0].max[ZE_MEM_LP], 0);
  ZT_EQ_U64(s.mem[0].max[ZE_MEM_MASTER], c.mem[0].max[ZE_MEM_MASTER]);
  ze_train_result_free(&c);
  ze_train_result_free(&s);
}

static void per_rank(void) {
  for (int stage = 2; stage <= 3; stage++) {
    char name[16];
    snprintf(name, sizeof name, "perrank%d", stage);
    ze_train_result c, s;
    pair(name, 3, kZero[stage], true, &c, &s);
    ze_train_result_free(&c);
    ze_train_result_free(&s);
  }
}

/* A CPU run saves at step 2 of 4; the sim run resumes from it (device state restored from
 * the files) and must match the CPU run's steps 3 and 4 and its last checkpoint. */
static void resume(void) {
  for (int stage = 1; stage <= 3; stage++) {
    char name[32], out_c[4200], out_s[4200], ck[4300], ck_c[4300], ck_s[4300];
    snprintf(name, sizeof name, "resume%d", stage);
    const char *cfg = ec_config(tmp, name, kZero[stage]);
    snprintf(out_c, sizeof out_c, "%s/%s_cpu", tmp, name);
    snprintf(out_s, sizeof out_s, "%s/%s_sim", tmp, name);
    ze_train_args a = ec_args(3, out_c, cfg);
    a.max_steps = 4;
    a.save_steps = 2;
    ze_train_result c, s;
    ec_run(&a, &c);
    snprintf(ck, sizeof ck, "%s/checkpoint-2", out_c);
    ze_train_args b = a;
    b.output_dir = out_s;
    b.resume_from_checkpoint = ck;
    b.device = "cuda";
    b.sim_device = true;
    ec_run(&b, &s);
    ZT_EQ_INT(s.first_step, 2);
    ZT_EQ_INT(s.steps, 2);
    ZT_EQ_MEM(s.losses, c.losses + 2, 2 * sizeof(float));
    ZT_EQ_MEM(s.grad_norms, c.grad_norms + 2, 2 * sizeof(double));
    ZT_EQ_MEM(s.params, c.params, c.n_params * sizeof(float));
    snprintf(ck_c, sizeof ck_c, "%s/checkpoint-4", out_c);
    snprintf(ck_s, sizeof ck_s, "%s/checkpoint-4", out_s);
    char gc[4400], gs[4400];
    snprintf(gc, sizeof gc, "%s/global_step4", ck_c);
    snprintf(gs, sizeof gs, "%s/global_step4", ck_s);
    ec_same_tree(gc, gs);
    snprintf(gc, sizeof gc, "%s/model.safetensors", ck_c);
    snprintf(gs, sizeof gs, "%s/model.safetensors", ck_s);
    if (stage < 3) ec_same_file(gc, gs);
    ze_train_result_free(&c);
    ze_train_result_free(&s);
  }
}

/* --load-best-model-at-end reloads the device state from a checkpoint mid-run. */
static void load_best(void) {
  char out_c[4200], out_s[4200];
  snprintf(out_c, sizeof out_c, "%s/best_cpu", tmp);
  snprintf(out_s, sizeof out_s, "%s/best_sim", tmp);
  ze_train_args a = ec_args(2, out_c, ec_config(tmp, "best", kZero[2]));
  a.max_steps = 4;
  a.save_steps = 2;
  a.eval_steps = 2;
  a.learning_rate = 0.05; /* a step that makes things worse, so the best is not the last */
  a.load_best_model_at_end = true;
  ze_train_result c, s;
  ec_run(&a, &c);
  a.output_dir = out_s;
  a.device = "cuda";
  a.sim_device = true;
  ec_run(&a, &s);
  ec_same_results("load best", &c, &s);
  char pc[4300], ps[4300];
  snprintf(pc, sizeof pc, "%s/model.safetensors", out_c);
  snprintf(ps, sizeof ps, "%s/model.safetensors", out_s);
  ec_same_file(pc, ps);
  ze_train_result_free(&c);
  ze_train_result_free(&s);
}

/* ze_dzero_lp_from_master for the four placements, 2.5 chunks long. */
static void staging(void) {
  size_t n = (5u << 20) / 2 + 3;
  float *m = malloc(n * sizeof *m);
  uint16_t *want = malloc(n * 2), *got = malloc(n * 2);
  ZT_ASSERT(m && want && got);
  uint64_t x = 1;
  for (size_t i = 0; i < n; i++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t u = (uint32_t)(x >> 32);
    memcpy(&m[i], &u, 4); /* every bit pattern: NaNs, infinities, subnormals */
  }
  zck_convert(ZCK_BF16, want, ZCK_F32, m, n);
  zck_comm *c[1];
  ZT_OK(zck_comm_local_create(1, c));
  ze_dzero_opts o = {&ze_dev_ops_sim, NULL, c[0], 0, true, true, true, false, 0, false, 0};
  ze_dzero *d = NULL;
  ZT_OK(ze_dzero_new(&o, 3, &d));
  for (int k = 0; k < 4; k++) {
    memset(got, 0xAB, n * 2);
    ZT_OK(ze_dzero_lp_from_master(d, got, k & 1, ZCK_BF16, m, (k & 2) != 0, n));
    ZT_EQ_MEM(got, want, n * 2);
  }
  ZT_EQ_U64(d->host.cur[ZE_MEM_BUCKETS], 0);
  ZT_ASSERT(d->host.max[ZE_MEM_BUCKETS] > 0);
  ze_dzero_free(d);
  zck_comm_local_destroy(c, 1);
  free(m);
  free(want);
  free(got);
}

int main(void) {
  tmp = zt_tmpdir();
  ZT_ASSERT(tmp);
  staging();
  stages();
  offload();
  per_rank();
  resume();
  load_best();
  return 0;
}
