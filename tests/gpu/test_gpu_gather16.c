/* test_gpu_gather16.c: the on-save gather's GPU path (cuda/gather16.cu) against the host
 * path (gather_plan.c) on the same plan: identical output bytes, in the same increasing
 * order, for random extents (fp32 and bf16 sources, bf16 and fp32 output, gaps, buckets
 * of one element up to larger than everything) and for a ZeRO-3 layout of a ~100M-element
 * model cut into 4 MiB buckets. Host sources are refused. */
#include "gpu_util.h"

#include "layout.h"

typedef struct sink {
  uint8_t *buf;
  size_t cap;
  uint64_t next_min;
  uint64_t written;         /* bytes received */
} sink;

static zck_status sink_write(void *ctx, uint64_t off, const void *bytes, size_t n) {
  sink *s = ctx;
  if (off < s->next_min || off + n > s->cap) ZT_FAIL("write [%llu, %llu) out of order or bounds", (unsigned long long)off,
                                                    (unsigned long long)(off + n));
  memcpy(s->buf + off, bytes, n);
  s->next_min = off + n;
  s->written += n;
  return ZCK_OK;
}

static void both_paths(const char *what, const zck_gather_src *hsrc, const zck_gather_src *dsrc, size_t n_src,
                       const zck_gather_extent *ext, size_t n_ext, zck_dtype out, size_t bucket, uint64_t out_n) {
  zck_gather_plan *p;
  ZT_OK(zck_gather_plan_build(hsrc, n_src, ext, n_ext, out, bucket, &p));
  size_t bytes = (size_t)out_n * zck_dtype_size(out);
  uint8_t *a = malloc(bytes ? bytes : 1), *b = malloc(bytes ? bytes : 1);
  memset(a, 0x5A, bytes);
  memset(b, 0x5A, bytes);
  sink sa = {a, bytes, 0, 0}, sb = {b, bytes, 0, 0};
  ZT_OK(zck_gather_run_host(p, hsrc, sink_write, &sa));
  ZT_OK(zck_cuda_gather16_to_host(p, dsrc, sink_write, &sb));
  /* not two empty outputs that agree: every planned byte arrived, from both paths */
  ZT_EQ_U64(sa.written, p->total * zck_dtype_size(out));
  ZT_EQ_U64(sb.written, sa.written);
  if (memcmp(a, b, bytes)) ZT_FAIL("%s (bucket %zu bytes): the GPU path's bytes differ from the host path's", what, bucket);
  zck_gather_plan_free(p);
  free(a);
  free(b);
}

int main(void) {
  if (zck_cuda_device_count() == 0) zt_skip("no CUDA device");
  uint64_t seed = 99;
  /* ---- random extents */
  for (int round = 0; round < 20; round++) {
    enum { NSRC = 3 };
    zck_gather_src hs[NSRC], ds[NSRC];
    for (int i = 0; i < NSRC; i++) {
      uint64_t n = 1 + gpu_rand(&seed) % 5000;
      zck_dtype dt = gpu_rand(&seed) & 1 ? ZCK_F32 : ZCK_BF16;
      size_t es = zck_dtype_size(dt);
      uint8_t *h = malloc(n * es);
      for (uint64_t j = 0; j < n * es; j++) h[j] = (uint8_t)gpu_rand(&seed); /* any bits: NaNs, subnormals */
      hs[i] = (zck_gather_src){h, dt, n};
      ds[i] = (zck_gather_src){gpu_dup(h, n * es), dt, n};
    }
    uint64_t out_n = 1 + gpu_rand(&seed) % 20000;
    zck_gather_extent *ext = calloc(out_n, sizeof *ext);
    size_t n_ext = 0;
    for (uint64_t pos = 0; pos < out_n;) {
      uint64_t len = 1 + gpu_rand(&seed) % 700;
      if (len > out_n - pos) len = out_n - pos;
      uint32_t s = (uint32_t)(gpu_rand(&seed) % NSRC);
      if (len > hs[s].numel) len = hs[s].numel;
      if (gpu_rand(&seed) % 6)
        ext[n_ext++] = (zck_gather_extent){s, gpu_rand(&seed) % (hs[s].numel - len + 1), pos, len};
      pos += len;
    }
    zck_dtype out = round % 4 == 3 ? ZCK_F32 : ZCK_BF16;
    size_t buckets[] = {zck_dtype_size(out), 1000, 65536, 1 << 22};
    for (size_t b = 0; b < 4; b++) both_paths("random", hs, ds, NSRC, ext, n_ext, out, buckets[b], out_n);
    free(ext);
    for (int i = 0; i < NSRC; i++) {
      free((void *)hs[i].data);
      zck_cuda_free((void *)ds[i].data);
    }
  }
  printf("  random extents: GPU path identical to the host path (20 plans x 4 bucket sizes)\n");

  /* ---- a ZeRO-3 model of ~100M elements over 4 ranks, consolidated to bf16 */
  enum { NP = 40, W = 4 };
  uint64_t numel[NP], dst[NP], total = 0;
  uint32_t ids[NP];
  for (int p = 0; p < NP; p++) {
    numel[p] = 1 + gpu_rand(&seed) % 5000000;
    ids[p] = (uint32_t)p;
    dst[p] = total;
    total += numel[p];
  }
  zck_group_spec sub = {ids, NP, 0};
  zck_layout *l;
  ZT_OK(zck_layout_zero3(NP, numel, &sub, 1, W, &l));
  zck_gather_src hs[W], ds[W];
  for (int s = 0; s < W; s++) {
    uint64_t n = l->stores[s].numel;
    float *h = malloc(n * 4);
    gpu_fill(h, n, &seed, 3.0f);
    hs[s] = (zck_gather_src){h, ZCK_F32, n};
    ds[s] = (zck_gather_src){gpu_dup(h, n * 4), ZCK_F32, n};
  }
  zck_gather_extent *ext;
  size_t n_ext;
  ZT_OK(zck_gather_extents_from_layout(l, dst, &ext, &n_ext));
  both_paths("zero-3", hs, ds, W, ext, n_ext, ZCK_BF16, (size_t)4 << 20, total);
  printf("  ZeRO-3, %llu elements over %d ranks: GPU path identical to the host path\n", (unsigned long long)total, W);
  /* host memory is not a device source */
  zck_gather_plan *p;
  ZT_OK(zck_gather_plan_build(hs, W, ext, n_ext, ZCK_BF16, 1 << 20, &p));
  sink none = {NULL, 0, 0, 0};
  ZT_ERR(zck_cuda_gather16_to_host(p, hs, sink_write, &none), ZCK_ERR_INVALID_ARG, "not in the memory of device");
  zck_gather_plan_free(p);
  free(ext);
  for (int s = 0; s < W; s++) {
    free((void *)hs[s].data);
    zck_cuda_free((void *)ds[s].data);
  }
  zck_layout_free(l);
  return 0;
}
