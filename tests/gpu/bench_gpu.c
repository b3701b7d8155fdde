/* bench_gpu.c: GPU throughput figures for tests/bench/bench_gpu.sh (exit 77 without a GPU).
 *   d2h: cudaMemcpy device -> page-locked host bandwidth, the gather's ceiling;
 *   gather16: zck_cuda_gather16_to_host of a ZeRO-3 model (fp32 partitions of W ranks ->
 *     bf16 consolidated tensors), into a sink that only checks order (the pipeline alone)
 *     and into a memcpy to one host buffer (what a writer into a page cache costs);
 *   gpt2: forward + backward tokens/s of the device GPT-2 at a given size.
 * Usage: bench_gpu [--elems N] [--ranks W] [--bucket-mib M] [--layers L] [--embd C]
 *                  [--heads H] [--vocab V] [--seq T] [--batch B] [--iters K] */
#include "test.h"
#include "layout.h"
#include "zck_cuda.h"

#include <stdlib.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static zck_status null_write(void *ctx, uint64_t off, const void *bytes, size_t n) {
  uint64_t *next = ctx;
  if (off < *next) return ZCK_ERR_INTERNAL;
  *next = off + n;
  return ZCK_OK;
}
static zck_status copy_write(void *ctx, uint64_t off, const void *bytes, size_t n) {
  memcpy((uint8_t *)ctx + off, bytes, n);
  return ZCK_OK;
}

#define OK(expr) do { zck_status s_ = (expr); if (s_ != ZCK_OK) { fprintf(stderr, "bench_gpu: %s: %s\n", #expr, zck_last_error()); exit(1); } } while (0)

int main(int argc, char **argv) {
  uint64_t elems = 256ull << 20;
  int W = 8, iters = 5;
  size_t bucket_mib = 64;
  zck_cuda_gpt2_config g = {50257, 1024, 12, 12, 768};
  int B = 4, T = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    long long v = atoll(argv[i + 1]);
    if (!strcmp(argv[i], "--elems")) elems = (uint64_t)v;
    else if (!strcmp(argv[i], "--ranks")) W = (int)v;
    else if (!strcmp(argv[i], "--bucket-mib")) bucket_mib = (size_t)v;
    else if (!strcmp(argv[i], "--layers")) g.n_layer = (int)v;
    else if (!strcmp(argv[i], "--embd")) g.n_embd = (int)v;
    else if (!strcmp(argv[i], "--heads")) g.n_head = (int)v;
    else if (!strcmp(argv[i], "--vocab")) g.vocab_size = (int)v;
    else if (!strcmp(argv[i], "--seq")) T = (int)v;
    else if (!strcmp(argv[i], "--batch")) B = (int)v;
    else if (!strcmp(argv[i], "--iters")) iters = (int)v;
    else {
      fprintf(stderr, "bench_gpu: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (zck_cuda_device_count() == 0) zt_skip("no CUDA device");
  char name[128];
  OK(zck_cuda_device_name(0, name, sizeof name));
  printf("device=%s\n", name);

  /* ---- D2H bandwidth, same size as the gather's output */
  size_t out_bytes = (size_t)elems * 2;
  void *d_buf, *h_buf;
  OK(zck_cuda_malloc(&d_buf, out_bytes));
  OK(zck_cuda_host_alloc(&h_buf, out_bytes));
  OK(zck_cuda_memcpy(h_buf, d_buf, out_bytes));
  double best = 1e30;
  for (int i = 0; i < iters; i++) {
    double t0 = now();
    OK(zck_cuda_memcpy(h_buf, d_buf, out_bytes));
    double t = now() - t0;
    if (t < best) best = t;
  }
  double d2h = (double)out_bytes / best / 1e9;
  printf("d2h_pinned_GBps=%.2f bytes=%zu\n", d2h, out_bytes);
  zck_cuda_free(d_buf);

  /* ---- gather16 of a ZeRO-3 model: params of GPT-2-like sizes until elems */
  size_t cap = 4096, np = 0;
  uint64_t *numel = calloc(cap, sizeof *numel), *dst = calloc(cap, sizeof *dst), total = 0;
  uint32_t *ids = calloc(cap, sizeof *ids);
  static const uint64_t sizes[] = {2359296, 768, 1769472, 2304, 589824, 768, 768, 768, 2359296, 3072, 2359296, 768};
  while (total < elems && np < cap) {
    uint64_t n = sizes[np % 12];
    if (n > elems - total) n = elems - total;
    numel[np] = n;
    dst[np] = total;
    ids[np] = (uint32_t)np;
    total += n;
    np++;
  }
  zck_group_spec sub = {ids, np, 0};
  zck_layout *l;
  OK(zck_layout_zero3(np, numel, &sub, 1, (uint32_t)W, &l));
  zck_gather_src *src = calloc((size_t)W, sizeof *src);
  for (int r = 0; r < W; r++) {
    void *d;
    OK(zck_cuda_malloc(&d, l->stores[r].numel * 4));
    OK(zck_cuda_memset_async(d, 0x3f, l->stores[r].numel * 4, NULL));
    src[r] = (zck_gather_src){d, ZCK_F32, l->stores[r].numel};
  }
  OK(zck_cuda_device_sync());
  zck_gather_extent *ext;
  size_t n_ext;
  OK(zck_gather_extents_from_layout(l, dst, &ext, &n_ext));
  zck_gather_plan *p;
  OK(zck_gather_plan_build(src, (size_t)W, ext, n_ext, ZCK_BF16, bucket_mib << 20, &p));
  /* the first call pins its staging memory; later ones reuse it (cuda/gather16.cu) */
  uint64_t next0 = 0;
  double t_first = now();
  OK(zck_cuda_gather16_to_host(p, src, null_write, &next0));
  t_first = now() - t_first;
  double g_null = 1e30, g_copy = 1e30;
  for (int i = 0; i < iters; i++) {
    uint64_t next = 0;
    double t0 = now();
    OK(zck_cuda_gather16_to_host(p, src, null_write, &next));
    double t = now() - t0;
    if (t < g_null) g_null = t;
    t0 = now();
    OK(zck_cuda_gather16_to_host(p, src, copy_write, h_buf));
    t = now() - t0;
    if (t < g_copy) g_copy = t;
  }
  double ob = (double)total * 2;
  printf("gather16_GBps=%.2f (of d2h %.0f%%) first_call_GBps=%.2f with_host_copy_GBps=%.2f out_bytes=%.0f params=%zu "
         "ranks=%d bucket_mib=%zu buckets=%zu items=%zu\n", ob / g_null / 1e9, 100.0 * (ob / g_null / 1e9) / d2h,
         ob / t_first / 1e9, ob / g_copy / 1e9, ob, np, W, bucket_mib, p->n_buckets, p->n_items);
  zck_gather_plan_free(p);
  free(ext);
  for (int r = 0; r < W; r++) zck_cuda_free((void *)src[r].data);
  free(src);
  zck_layout_free(l);
  free(numel);
  free(dst);
  free(ids);
  zck_cuda_host_free(h_buf);

  /* ---- GPT-2 forward + backward tokens/s */
  if (T > g.max_seq_len) g.max_seq_len = T;
  zck_cuda_ctx *ctx;
  OK(zck_cuda_ctx_create(0, &ctx));
  zck_cuda_gpt2 *m;
  OK(zck_cuda_gpt2_create(ctx, &g, B, T, &m));
  size_t n = zck_gpt2_params_walk(&g, NULL, NULL, NULL);
  float *h_params = malloc(n * 4);
  uint64_t s = 1;
  for (size_t i = 0; i < n; i++) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    h_params[i] = 0.02f * (float)((double)(s >> 11) * 0x1p-53 - 0.5);
  }
  void *d_params, *d_grads;
  OK(zck_cuda_malloc(&d_params, n * 4));
  OK(zck_cuda_malloc(&d_grads, n * 4));
  OK(zck_cuda_memcpy(d_params, h_params, n * 4));
  int *tok = malloc((size_t)B * T * sizeof(int) * 2);
  for (int i = 0; i < 2 * B * T; i++) tok[i] = (int)((unsigned)(i * 2654435761u) % (unsigned)g.vocab_size);
  float loss = 0;
  double tb = 1e30;
  for (int i = 0; i <= iters; i++) {
    double t0 = now();
    OK(zck_cuda_memset_async(d_grads, 0, n * 4, zck_cuda_ctx_stream(ctx)));
    OK(zck_cuda_gpt2_forward(m, d_params, tok, tok + B * T, B, T, &loss));
    OK(zck_cuda_gpt2_backward(m, d_params, d_grads, 1.0f));
    double t = now() - t0;
    if (i && t < tb) tb = t; /* the first is a warm-up */
  }
  printf("gpt2_tokens_per_s=%.0f ms_per_step=%.2f B=%d T=%d L=%d C=%d H=%d V=%d params=%zu loss=%.4f ws_MiB=%.0f\n",
         (double)B * T / tb, 1e3 * tb, B, T, g.n_layer, g.n_embd, g.n_head, g.vocab_size, n, (double)loss,
         (double)zck_cuda_gpt2_ws_bytes(m) / (1 << 20));
  zck_cuda_gpt2_free(m);
  zck_cuda_ctx_free(ctx);
  zck_cuda_free(d_params);
  zck_cuda_free(d_grads);
  free(h_params);
  free(tok);
  return 0;
}
