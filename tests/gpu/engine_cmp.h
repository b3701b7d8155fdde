/* engine_cmp.h: helpers of the tests that run zckpt-train's --device cuda path (on a GPU,
 * or simulated in host memory) against the CPU engine: the arguments, and comparisons of
 * results, checkpoint trees and safetensors tensors that say where they differ. */
#ifndef ZCK_ENGINE_CMP_H
#define ZCK_ENGINE_CMP_H

#include "test.h"

#include "safetensors/safetensors.h"
#include "train.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static inline void ec_run(const ze_train_args *a, ze_train_result *r) {
  zck_status s = ze_train_run(a, r);
  if (s != ZCK_OK) ZT_FAIL("ze_train_run (%s, ZeRO config %s): %s: %s", a->device, a->deepspeed ? a->deepspeed : "-",
                           zck_status_name(s), zck_last_error());
}

/* A ds_config.json with the given zero_optimization section; returns its path. */
static inline const char *ec_config(const char *dir, const char *name, const char *zero_json) {
  static char paths[32][4200];
  static int next;
  char *p = paths[next++ % 32];
  snprintf(p, 4200, "%s/%s.json", dir, name);
  FILE *f = fopen(p, "w");
  ZT_ASSERT(f);
  fprintf(f,
          "{\"train_micro_batch_size_per_gpu\": \"auto\", \"gradient_accumulation_steps\": \"auto\","
          " \"train_batch_size\": \"auto\", \"gradient_clipping\": \"auto\", \"bf16\": {\"enabled\": \"auto\"},"
          " \"zero_optimization\": %s}",
          zero_json);
  fclose(f);
  return p;
}

/* A small run: 3 steps of 2 micro-batches, weight decay, a frozen MLP, a save at the end. */
static inline ze_train_args ec_args(int W, const char *out, const char *cfg) {
  ze_train_args a;
  ze_train_args_default(&a);
  a.model = (ze_gpt2_config){256, 32, 2, 2, 32};
  a.max_steps = 3;
  a.save_steps = 3;
  a.per_device_train_batch_size = 2;
  a.gradient_accumulation_steps = 2;
  a.learning_rate = 3e-3;
  a.weight_decay = 0.1;
  a.eval_samples = 4;
  a.logging_steps = 0;
  a.quiet = true;
  a.bf16 = true;
  a.ranks = W;
  a.keep_params = true;
  a.freeze[a.n_freeze++] = "transformer.h.1.mlp";
  a.output_dir = out;
  a.deepspeed = cfg;
  return a;
}

/* Losses, gradient norms, evaluation and final weights equal bit for bit. */
static inline void ec_same_results(const char *what, const ze_train_result *x, const ze_train_result *y) {
  ZT_EQ_INT(x->steps, y->steps);
  for (int64_t i = 0; i < x->steps; i++)
    if (memcmp(&x->losses[i], &y->losses[i], sizeof(float)) || memcmp(&x->grad_norms[i], &y->grad_norms[i], sizeof(double)))
      ZT_FAIL("%s: step %lld: loss %.9g / %.9g, grad_norm %.17g / %.17g", what, (long long)(x->first_step + i + 1),
              (double)x->losses[i], (double)y->losses[i], x->grad_norms[i], y->grad_norms[i]);
  if (memcmp(&x->final_eval_loss, &y->final_eval_loss, sizeof(float)))
    ZT_FAIL("%s: final eval_loss %.9g / %.9g", what, (double)x->final_eval_loss, (double)y->final_eval_loss);
  ZT_EQ_U64(x->n_params, y->n_params);
  for (size_t i = 0; i < x->n_params; i++)
    if (memcmp(&x->params[i], &y->params[i], sizeof(float)))
      ZT_FAIL("%s: final weight %zu: %.9g / %.9g", what, i, (double)x->params[i], (double)y->params[i]);
}

static inline void ec_same_file(const char *pa, const char *pb) {
  unsigned char *da = NULL, *db = NULL;
  size_t la = 0, lb = 0;
  if (zt_read_file(pa, &da, &la) || zt_read_file(pb, &db, &lb)) ZT_FAIL("cannot read %s or %s", pa, pb);
  if (la != lb) ZT_FAIL("%s: %zu bytes, %s: %zu", pa, la, pb, lb);
  for (size_t i = 0; i < la; i++)
    if (da[i] != db[i]) ZT_FAIL("%s and %s differ from byte %zu of %zu", pa, pb, i, la);
  free(da);
  free(db);
}

/* Every file under a (recursively) equals its namesake under b, and b has no others;
 * returns the number of files. */
static inline int ec_same_tree(const char *a, const char *b) {
  DIR *d = opendir(a);
  if (!d) ZT_FAIL("cannot open %s", a);
  int n = 0, in_b = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char pa[4400], pb[4400];
    snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
    snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
    struct stat sa;
    ZT_ASSERT(stat(pa, &sa) == 0);
    if (S_ISDIR(sa.st_mode))
      n += ec_same_tree(pa, pb);
    else {
      ec_same_file(pa, pb);
      n++;
    }
  }
  closedir(d);
  d = opendir(b);
  if (!d) ZT_FAIL("cannot open %s", b);
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    char pa[4400], pb[4400];
    snprintf(pa, sizeof pa, "%s/%s", a, e->d_name);
    snprintf(pb, sizeof pb, "%s/%s", b, e->d_name);
    struct stat sb;
    ZT_ASSERT(stat(pb, &sb) == 0);
    if (!S_ISDIR(sb.st_mode)) {
      in_b++;
      if (stat(pa, &sb) != 0) ZT_FAIL("%s: only in %s", e->d_name, b);
    }
  }
  closedir(d);
  (void)in_b;
  return n;
}

/* Every tensor of safetensors file a has the same dtype, shape and bytes in b. */
static inline size_t ec_same_tensors(const char *pa, const char *pb) {
  zck_st_file *fa = NULL, *fb = NULL;
  ZT_OK(zck_st_open(pa, &fa));
  ZT_OK(zck_st_open(pb, &fb));
  size_t n = zck_st_count(fa);
  for (size_t i = 0; i < n; i++) {
    const zck_st_tensor *ta = zck_st_tensor_at(fa, i), *tb = zck_st_find(fb, ta->name);
    if (!tb) ZT_FAIL("%s: tensor %s is not in %s", pa, ta->name, pb);
    uint64_t na = ta->end - ta->begin, nb = tb->end - tb->begin;
    if (na != nb || ta->dtype != tb->dtype) ZT_FAIL("%s: tensor %s differs in dtype or size", pb, ta->name);
    unsigned char *xa = malloc(na ? na : 1), *xb = malloc(nb ? nb : 1);
    ZT_OK(zck_st_read(fa, ta, xa, 0, na));
    ZT_OK(zck_st_read(fb, tb, xb, 0, nb));
    if (memcmp(xa, xb, na)) ZT_FAIL("%s vs %s: tensor %s differs", pa, pb, ta->name);
    free(xa);
    free(xb);
  }
  zck_st_close(fa);
  zck_st_close(fb);
  return n;
}

#endif
