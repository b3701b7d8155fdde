/* test_exec.c: the executor on real files: a ZeRO-2 gather of fp32 rank files into one
 * bf16 file (compared with zck_convert), CRCs and hashes of what was written, progress,
 * thread counts 1..4, tiny staging buffers, error propagation from worker threads, and
 * verify on read (record CRC-32s completed over skipped bytes, XXH3 of stores read whole,
 * or in a pass of their own first, --no-verify), and targets' write order across jobs. */
#include "exec.h"
#include "io.h"
#include "test.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>
#include <zlib.h>

static uint64_t rng_state = 0x853c49e6748fea9bull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

#define NP 7
#define W 3
#define HDR 100 /* junk before the data in each rank file */
#define OUT_HDR 64

static const uint64_t numel[NP] = {1000, 37, 5000, 1, 0, 2049, 3};
static float *truth[NP];           /* fp32 values of every param */
static char *rank_path[W];
static zck__source rank_src[W];
static zck_layout *src_layout, *dst_layout;
static zck_plan *plan;
static char *dir;

/* "<dir>/<name>", malloc'd */
static char *path_in(const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = malloc(n);
  ZT_ASSERT(p);
  snprintf(p, n, "%s/%s", dir, name);
  return p;
}

static void setup(void) {
  dir = zt_tmpdir();
  for (int p = 0; p < NP; p++) {
    truth[p] = malloc((numel[p] + 1) * sizeof(float));
    for (uint64_t e = 0; e < numel[p]; e++) {
      uint32_t bits = (uint32_t)rnd();
      if (e % 5 == 0) bits = (bits & 0xffff0000u) | 0x8000u; /* ties: round to even */
      memcpy(&truth[p][e], &bits, 4);
    }
  }
  uint32_t g[NP] = {0, 1, 2, 3, 4, 5, 6};
  zck_group_spec gs = {g, NP, 0};
  ZT_OK(zck_layout_zero12(NP, numel, &gs, 1, W, 1, &src_layout));
  ZT_OK(zck_layout_whole(NP, numel, NULL, 0, &dst_layout));
  zck_plan_opts o = ZCK_PLAN_OPTS_INIT;
  o.max_chunk = 777; /* several chunks per big tensor */
  ZT_OK(zck_plan_build(src_layout, dst_layout, &o, &plan));
  /* rank files: junk header, then the lean fp32 partition (as single_partition_of_fp32_groups) */
  for (uint32_t r = 0; r < W; r++) {
    const zck_layout_store *st = &src_layout->stores[r];
    size_t n = HDR + st->lean * 4;
    uint8_t *buf = calloc(n + 1, 1);
    memset(buf, 0xAB, HDR);
    for (size_t k = src_layout->store_first[r]; k < src_layout->store_first[r + 1]; k++) {
      const zck_piece *pc = &src_layout->pieces[src_layout->by_store[k]];
      memcpy(buf + HDR + pc->store_off * 4, truth[pc->param] + pc->param_off, pc->count * 4);
    }
    char name[32];
    snprintf(name, sizeof name, "rank%u.pt", r);
    rank_path[r] = path_in(name);
    ZT_ASSERT(zt_write_file(rank_path[r], buf, n) == 0);
    free(buf);
    ZT_OK(zck__source_open(&rank_src[r], rank_path[r]));
  }
}

static void bind_sources(zck_store *ss) {
  for (uint32_t r = 0; r < W; r++)
    ss[r] = zck_store_source(&rank_src[r], HDR, ZCK_F32, src_layout->stores[r].lean, NULL);
}

/* Output file layout: OUT_HDR bytes, then each tensor in bf16, 8-byte aligned. */
static uint64_t out_offset[NP], out_size;
static void out_layout(void) {
  uint64_t at = OUT_HDR;
  for (int p = 0; p < NP; p++) {
    out_offset[p] = at;
    at += (numel[p] * 2 + 7) / 8 * 8;
  }
  out_size = at;
}

static uint8_t *expected_output(void) {
  uint8_t *want = calloc(out_size, 1);
  for (int p = 0; p < NP; p++) ZT_OK(zck_convert(ZCK_BF16, want + out_offset[p], ZCK_F32, truth[p], numel[p]));
  return want;
}

typedef struct counters {
  pthread_mutex_t lock;
  uint64_t written_bytes, last_done, last_total;
  int progress_calls;
} counters;

static int on_progress(void *ctx, uint64_t done, uint64_t total) {
  counters *c = ctx;
  ZT_ASSERT(done >= c->last_done);
  c->last_done = done;
  c->last_total = total;
  c->progress_calls++;
  return 0;
}

static void on_written(void *ctx, size_t job, uint32_t st, uint64_t off, uint64_t count, const void *bytes, size_t n) {
  counters *c = ctx;
  ZT_ASSERT(job == 0 && st < NP && off + count <= numel[st] && n == count * 2 && bytes);
  pthread_mutex_lock(&c->lock);
  c->written_bytes += n;
  pthread_mutex_unlock(&c->lock);
}

static void test_gather_to_file(void) {
  out_layout();
  uint8_t *want = expected_output();
  size_t stagings[] = {64, 100, 4096, 0};
  for (unsigned threads = 1; threads <= 4; threads++)
    for (size_t si = 0; si < 4; si++) {
      char *out = path_in("out.bin");
      int fd = open(out, O_RDWR | O_CREAT | O_TRUNC, 0644);
      ZT_ASSERT(fd >= 0);
      ZT_ASSERT(ftruncate(fd, (off_t)out_size) == 0);
      zck_store ss[W], ds[NP];
      bind_sources(ss);
      for (int p = 0; p < NP; p++) ds[p] = zck_store_fd(fd, out_offset[p], ZCK_BF16, numel[p], out);
      counters c = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, 0};
      zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
      o.threads = threads;
      o.staging_bytes = stagings[si];
      o.progress = on_progress;
      o.progress_ctx = &c;
      o.written = on_written;
      o.written_ctx = &c;
      uint32_t crc[NP];
      ZT_OK(zck_exec_plan(plan, ss, ds, crc, &o));
      uint8_t *got;
      size_t n;
      ZT_ASSERT(zt_read_file(out, &got, &n) == 0);
      ZT_EQ_U64(n, out_size);
      if (memcmp(got, want, n)) {
        for (size_t i = 0; i < n; i++)
          if (got[i] != want[i]) ZT_FAIL("threads %u staging %zu: byte %zu differs", threads, stagings[si], i);
      }
      uint64_t total = 0;
      for (int p = 0; p < NP; p++) {
        total += numel[p] * 2;
        ZT_EQ_U64(crc[p], (uint32_t)crc32(0, got + out_offset[p], (uInt)(numel[p] * 2)));
      }
      ZT_EQ_U64(c.written_bytes, total);
      ZT_EQ_U64(c.last_done, total);
      ZT_EQ_U64(c.last_total, total);
      ZT_ASSERT(c.progress_calls > 0);

      /* hash after: read the targets back */
      uint64_t xx[NP];
      uint32_t crc2[NP];
      o.staging_bytes = stagings[si] ? stagings[si] : 0;
      ZT_OK(zck_exec_hash_stores(ds, NP, &o, xx, crc2));
      for (int p = 0; p < NP; p++) {
        ZT_EQ_U64(xx[p], zck_xxh3(got + out_offset[p], numel[p] * 2));
        ZT_EQ_U64(crc2[p], crc[p]);
      }
      free(got);
      close(fd);
      free(out);
    }
  free(want);
}

/* The whole data region as one store (tensors at element offsets, with zero gaps): the
 * CRC of the region must count the gaps as zeros. */
static void test_packed_crc(void) {
  out_layout();
  uint64_t region = (out_size - OUT_HDR) / 2;
  zck_layout_store st = {-1, -1, -1, region, region};
  zck_piece pieces[NP];
  size_t n = 0;
  for (int p = 0; p < NP; p++)
    if (numel[p]) pieces[n++] = (zck_piece){(uint32_t)p, 0, 0, (out_offset[p] - OUT_HDR) / 2, numel[p], 0, 0};
  zck_layout *packed;
  ZT_OK(zck_layout_custom(NP, numel, &st, 1, pieces, n, &packed));
  zck_plan *p;
  ZT_OK(zck_plan_build(src_layout, packed, NULL, &p));
  char *out = path_in("packed.bin");
  int fd = open(out, O_RDWR | O_CREAT | O_TRUNC, 0644);
  ZT_ASSERT(fd >= 0 && ftruncate(fd, (off_t)out_size) == 0);
  zck_store ss[W], ds = zck_store_fd(fd, OUT_HDR, ZCK_BF16, region, out);
  bind_sources(ss);
  uint32_t crc;
  zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
  o.threads = 3;
  o.staging_bytes = 256;
  ZT_OK(zck_exec_plan(p, ss, &ds, &crc, &o));
  uint8_t *got;
  size_t len;
  ZT_ASSERT(zt_read_file(out, &got, &len) == 0);
  uint8_t *want = expected_output();
  ZT_EQ_MEM(got, want, len);
  ZT_EQ_U64(crc, (uint32_t)crc32(0, got + OUT_HDR, (uInt)(region * 2)));
  free(want);
  free(got);
  close(fd);
  free(out);
  zck_plan_free(p);
  zck_layout_free(packed);

  ZT_EQ_U64(zck_crc32_zeros(0), 0);
  uint8_t z[1000] = {0};
  ZT_EQ_U64(zck_crc32_zeros(1000), (uint32_t)crc32(0, z, 1000));
  ZT_EQ_U64(zck_crc32_zeros(1), (uint32_t)crc32(0, z, 1));
}

// ---- errors

static atomic_int cb_calls;
static zck_status failing_write(void *ctx, const void *src, uint64_t off, uint64_t count) {
  (void)ctx, (void)src, (void)count;
  if (atomic_fetch_add(&cb_calls, 1) == 3) return zck__fail_errno(EIO, "gpu0: copy to element %llu", (unsigned long long)off);
  return ZCK_OK;
}

static void test_errors(void) {
  zck_store ss[W], ds[NP];
  float *mem[NP];
  for (int p = 0; p < NP; p++) {
    mem[p] = calloc(numel[p] + 1, sizeof(float));
    ds[p] = zck_store_memory(mem[p], ZCK_F32, numel[p], NULL);
  }
  zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
  o.staging_bytes = 128;

  /* a rank file shorter than its store says, read through a raw fd: pread meets EOF in
   * some worker; the whole run fails with that file's name */
  char *short_path = path_in("short.pt");
  uint8_t *full;
  size_t full_n;
  ZT_ASSERT(zt_read_file(rank_path[1], &full, &full_n) == 0);
  ZT_ASSERT(zt_write_file(short_path, full, full_n - 40) == 0);
  free(full);
  int sfd = open(short_path, O_RDONLY);
  ZT_ASSERT(sfd >= 0);
  for (unsigned threads = 1; threads <= 4; threads++) {
    bind_sources(ss);
    ss[1] = zck_store_fd(sfd, HDR, ZCK_F32, src_layout->stores[1].lean, short_path);
    o.threads = threads;
    zck_clear_error();
    ZT_ERR(zck_exec_plan(plan, ss, ds, NULL, &o), ZCK_ERR_TRUNCATED, "short.pt: truncated");
  }
  close(sfd);

  /* the same through a zck__source: caught before any byte moves */
  zck__source shortsrc;
  ZT_OK(zck__source_open(&shortsrc, short_path));
  bind_sources(ss);
  ss[1] = zck_store_source(&shortsrc, HDR, ZCK_F32, src_layout->stores[1].lean, NULL);
  ZT_ERR(zck_exec_plan(plan, ss, ds, NULL, &o), ZCK_ERR_TRUNCATED, "short.pt: truncated: need bytes");
  zck__source_close(&shortsrc);

  /* a store smaller than the plan needs */
  bind_sources(ss);
  ss[2].numel = 3;
  ss[2].name = "rank2.pt: fp32 group 0";
  ZT_ERR(zck_exec_plan(plan, ss, ds, NULL, &o), ZCK_ERR_FORMAT, "rank2.pt: fp32 group 0: needs elements [");
  /* unbound */
  bind_sources(ss);
  ss[0].kind = ZCK_STORE_UNBOUND;
  ZT_ERR(zck_exec_plan(plan, ss, ds, NULL, &o), ZCK_ERR_INVALID_ARG, "source store 0 is used by the plan but not bound");
  /* not convertible (float to int) */
  bind_sources(ss);
  zck_store bad = ds[0];
  ds[0].dtype = ZCK_I32;
  ZT_ERR(zck_exec_plan(plan, ss, ds, NULL, &o), ZCK_ERR_UNSUPPORTED, "cannot convert float32 to int32");
  ds[0] = bad;
  /* a source cannot be a target */
  zck_store srcs_as_dst[NP];
  for (int p = 0; p < NP; p++) srcs_as_dst[p] = zck_store_source(&rank_src[0], 0, ZCK_F32, numel[p], "in.pt");
  ZT_ERR(zck_exec_plan(plan, ss, srcs_as_dst, NULL, &o), ZCK_ERR_INVALID_ARG, "in.pt: cannot be written");

  /* an injected write failure in a worker thread */
  char *out = path_in("fail.bin");
  out_layout();
  int fd = open(out, O_RDWR | O_CREAT | O_TRUNC, 0644);
  ZT_ASSERT(fd >= 0);
  zck_store fds[NP];
  for (int p = 0; p < NP; p++) fds[p] = zck_store_fd(fd, out_offset[p], ZCK_BF16, numel[p], out);
  for (unsigned threads = 1; threads <= 4; threads++) {
    o.threads = threads;
    zck__io_fault_set(ZCK_IO_OP_WRITE, 5, ENOSPC);
    ZT_ERR(zck_exec_plan(plan, ss, fds, NULL, &o), ZCK_ERR_NO_SPACE, "fail.bin: write of");
    zck__io_fault_set(ZCK_IO_OP_WRITE, 0, 0);
  }
  close(fd);
  free(out);

  /* a callback store failing on a worker thread: its message reaches this thread */
  zck_store cbs[NP];
  for (int p = 0; p < NP; p++) cbs[p] = zck_store_callback(NULL, failing_write, NULL, ZCK_BF16, numel[p], "cuda:0");
  for (unsigned threads = 2; threads <= 4; threads++) {
    atomic_store(&cb_calls, 0);
    o.threads = threads;
    zck_clear_error();
    ZT_ERR(zck_exec_plan(plan, ss, cbs, NULL, &o), ZCK_ERR_IO, "cuda:0: gpu0: copy to element");
  }

  /* CRCs need each target byte written once */
  zck_extent twice[] = {{0, 0, 0, 0, 0, 10, 0, 0, 0}, {0, 0, 0, 10, 5, 10, 0, 0, 0}};
  zck_plan *tp;
  ZT_OK(zck_plan_from_extents(twice, 2, W, NP, &tp));
  uint32_t crc[NP];
  ds[0].numel = 1000;
  ZT_ERR(zck_exec_plan(tp, ss, ds, crc, &o), ZCK_ERR_INVALID_ARG, "element 5 is written twice");
  ZT_OK(zck_exec_plan(tp, ss, ds, NULL, &o)); /* fine without */
  zck_plan_free(tp);

  for (int p = 0; p < NP; p++) free(mem[p]);
  free(short_path);
}

/* Two jobs in one run (fp32 master and exp_avg, different dtypes), memory to memory. */
static void test_multi_job(void) {
  uint32_t g[NP] = {0, 1, 2, 3, 4, 5, 6};
  zck_group_spec gs = {g, NP, 0};
  zck_layout *z3;
  zck_group_spec *sg;
  size_t n_sg;
  ZT_OK(zck_zero3_sub_groups(numel, &gs, 1, 4, 1500, &sg, &n_sg));
  ZT_OK(zck_layout_zero3(NP, numel, sg, n_sg, 4, &z3));
  free(sg);
  zck_plan *p;
  ZT_OK(zck_plan_build(dst_layout, z3, NULL, &p)); /* whole tensors -> ZeRO-3 shards */
  zck_store whole_f32[NP], whole_bf16[NP];
  uint16_t *b16[NP];
  for (int i = 0; i < NP; i++) {
    b16[i] = calloc(numel[i] + 1, 2);
    ZT_OK(zck_convert(ZCK_BF16, b16[i], ZCK_F32, truth[i], numel[i]));
    whole_f32[i] = zck_store_memory(truth[i], ZCK_F32, numel[i], NULL);
    whole_bf16[i] = zck_store_memory(b16[i], ZCK_BF16, numel[i], NULL);
  }
  size_t ns = z3->n_stores;
  zck_store *fp32 = calloc(ns, sizeof *fp32), *avg = calloc(ns, sizeof *avg);
  void **mf = calloc(ns, sizeof *mf), **ma = calloc(ns, sizeof *ma);
  for (size_t s = 0; s < ns; s++) {
    mf[s] = calloc(z3->stores[s].numel + 1, 4);
    ma[s] = calloc(z3->stores[s].numel + 1, 8);
    fp32[s] = zck_store_memory(mf[s], ZCK_F32, z3->stores[s].numel, NULL);
    avg[s] = zck_store_memory(ma[s], ZCK_F64, z3->stores[s].numel, NULL);
  }
  zck_exec_job jobs[] = {{p, whole_f32, fp32, NULL}, {p, whole_bf16, avg, NULL}};
  zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
  o.threads = 3;
  ZT_OK(zck_exec_run(jobs, 2, &o));
  for (size_t i = 0; i < z3->n_pieces; i++) {
    const zck_piece *pc = &z3->pieces[i];
    ZT_EQ_MEM((float *)mf[pc->store] + pc->store_off, truth[pc->param] + pc->param_off, pc->count * 4);
    for (uint64_t e = 0; e < pc->count; e++) {
      uint32_t bits = (uint32_t)b16[pc->param][pc->param_off + e] << 16;
      float f;
      memcpy(&f, &bits, 4);
      double d = ((double *)ma[pc->store])[pc->store_off + e];
      if (!(d == (double)f || (d != d && f != f))) ZT_FAIL("exp_avg element differs");
    }
  }
  for (size_t s = 0; s < ns; s++) {
    free(mf[s]);
    free(ma[s]);
  }
  for (int i = 0; i < NP; i++) free(b16[i]);
  free(mf);
  free(ma);
  free(fp32);
  free(avg);
  zck_plan_free(p);
  zck_layout_free(z3);
}

// ---- verify on read

/* Every rank file's record: 16 junk bytes before the partition (never read by the plan)
 * and the partition; CRC-32 of what the file holds, XXH3 of the store's bytes. */
static zck_record_check rec[W];
static uint64_t store_xxh3[W];
static uint8_t *file_bytes[W];

static void make_checks(void) {
  for (uint32_t r = 0; r < W; r++) {
    size_t n;
    ZT_ASSERT(zt_read_file(rank_path[r], &file_bytes[r], &n) == 0);
    uint64_t lo = HDR - 16, len = n - lo;
    rec[r] = (zck_record_check){lo, len, (uint32_t)crc32(0, file_bytes[r] + lo, (uInt)len), "record data/7 (flat group 0)"};
    store_xxh3[r] = XXH3_64bits(file_bytes[r] + HDR, src_layout->stores[r].lean * 4);
  }
}

static void bind_checked(zck_store *ss, bool crc, bool xxh3) {
  bind_sources(ss);
  for (uint32_t r = 0; r < W; r++) {
    if (crc) ss[r].record = &rec[r];
    if (xxh3) {
      ss[r].has_xxh3 = true;
      ss[r].xxh3 = store_xxh3[r];
    }
  }
}

static void check_gathered(float **mem) {
  for (int p = 0; p < NP; p++) ZT_ASSERT(!memcmp(mem[p], truth[p], numel[p] * 4));
}

static void test_verify_on_read(void) {
  make_checks();
  zck_store ss[W], ds[NP];
  float *mem[NP];
  for (int p = 0; p < NP; p++) {
    mem[p] = calloc(numel[p] + 1, sizeof(float));
    ds[p] = zck_store_memory(mem[p], ZCK_F32, numel[p], NULL);
  }
  size_t stagings[] = {64, 100, 4096, 0};
  /* intact: the record CRCs (junk bytes read after the run to complete them) and the XXH3s
   * (stores streamed whole) agree; the copy is right whatever the staging and threads */
  for (int mode = 0; mode < 3; mode++)
    for (size_t si = 0; si < 4; si++)
      for (unsigned threads = 1; threads <= 3; threads += 2)
        for (int first = 0; first <= 1; first++) { /* the XXH3s in a pass of their own first */
          for (int p = 0; p < NP; p++) memset(mem[p], 0, numel[p] * 4);
          bind_checked(ss, mode != 1, mode != 0);
          zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
          o.staging_bytes = stagings[si];
          o.threads = threads;
          o.verify_first = first;
          ZT_OK(zck_exec_plan(plan, ss, ds, NULL, &o));
          check_gathered(mem);
        }
  /* the same records read by two jobs (a second copy of each param): counted once */
  {
    zck_exec_job jobs[2] = {{plan, ss, ds, NULL}, {plan, ss, ds, NULL}};
    bind_checked(ss, true, false);
    zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
    o.staging_bytes = 100;
    o.threads = 2;
    ZT_OK(zck_exec_run(jobs, 2, &o));
    check_gathered(mem);
  }
  /* a damaged byte the plan does not need (inside the record, before the partition) */
  uint32_t good = rec[1].crc32;
  file_bytes[1][HDR - 3] ^= 0x10;
  rec[1].crc32 = (uint32_t)crc32(0, file_bytes[1] + rec[1].off, (uInt)rec[1].size);
  file_bytes[1][HDR - 3] ^= 0x10;
  for (unsigned threads = 1; threads <= 3; threads++) {
    bind_checked(ss, true, false);
    zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
    o.staging_bytes = 100;
    o.threads = threads;
    zck_clear_error();
    ZT_ERR(zck_exec_plan(plan, ss, ds, NULL, &o), ZCK_ERR_DAMAGED, "rank1.pt: record data/7 (flat group 0): CRC-32 mismatch");
    char want[64];
    snprintf(want, sizeof want, "(stored %08x, read %08x)", rec[1].crc32, good);
    ZT_ASSERT(strstr(zck_last_error(), want));
    ZT_ASSERT(!strchr(zck_last_error(), '\n'));
    /* --no-verify: not checked */
    o.no_verify = true;
    ZT_OK(zck_exec_plan(plan, ss, ds, NULL, &o));
    check_gathered(mem);
  }
  rec[1].crc32 = good;
  /* a data byte whose CRC was rewritten too (a file of another step): its XXH3 says so */
  uint64_t xgood = store_xxh3[2];
  store_xxh3[2] ^= 1;
  for (size_t si = 0; si < 8; si++) {
    bind_checked(ss, true, true);
    zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
    o.staging_bytes = stagings[si % 4];
    o.threads = 2;
    o.verify_first = si >= 4;
    ss[2].name = "rank2.pt: fp32 flat group 0";
    for (int p = 0; p < NP; p++) memset(mem[p], 0, numel[p] * 4);
    ZT_ERR(zck_exec_plan(plan, ss, ds, NULL, &o), ZCK_ERR_DAMAGED,
           "rank2.pt: fp32 flat group 0: XXH3-64 mismatch with zckpt-manifest.json");
    ZT_ASSERT(!strchr(zck_last_error(), '\n'));
    /* checked before the copy: nothing was written */
    for (int p = 0; o.verify_first && p < NP; p++)
      for (uint64_t e = 0; e < numel[p]; e++) ZT_ASSERT(mem[p][e] == 0.0f);
  }
  store_xxh3[2] = xgood;
  /* a record that does not hold its store is the describer's bug, refused before reading */
  zck_record_check small = rec[0];
  small.size = 8;
  bind_checked(ss, true, false);
  ss[0].record = &small;
  ZT_ERR(zck_exec_plan(plan, ss, ds, NULL, NULL), ZCK_ERR_INTERNAL, "outside its record data/7");
  for (int p = 0; p < NP; p++) free(mem[p]);
  for (uint32_t r = 0; r < W; r++) free(file_bytes[r]);
}

/* Targets with a write order: the work of every job runs in it (then by target offset),
 * so the writes of two jobs whose targets alternate in the output alternate too. */
typedef struct order_log {
  pthread_mutex_t lock;
  uint64_t last_order, last_off, n;
  bool in_order;
  const zck_exec_job *jobs;
} order_log;

static void on_written_order(void *ctx, size_t job, uint32_t st, uint64_t off, uint64_t count, const void *bytes,
                             size_t n) {
  (void)count, (void)bytes, (void)n;
  order_log *l = ctx;
  uint64_t o = l->jobs[job].dst[st].write_order;
  pthread_mutex_lock(&l->lock);
  if (l->n && (o < l->last_order || (o == l->last_order && off < l->last_off))) l->in_order = false;
  l->last_order = o;
  l->last_off = off;
  l->n++;
  pthread_mutex_unlock(&l->lock);
}

static void test_write_order(void) {
  zck_store ss[W], da[NP], db[NP];
  float *ma[NP], *mb[NP];
  bind_sources(ss);
  for (int p = 0; p < NP; p++) {
    ma[p] = calloc(numel[p] + 1, sizeof(float));
    mb[p] = calloc(numel[p] + 1, sizeof(float));
    da[p] = zck_store_memory(ma[p], ZCK_F32, numel[p], NULL);
    db[p] = zck_store_memory(mb[p], ZCK_F32, numel[p], NULL);
    da[p].write_order = 2 * (uint64_t)p + 1; /* job 0's param p, then job 1's, ... */
    db[p].write_order = 2 * (uint64_t)p + 2;
  }
  zck_exec_job jobs[2] = {{plan, ss, da, NULL}, {plan, ss, db, NULL}};
  for (int ordered = 0; ordered <= 1; ordered++) {
    order_log l = {PTHREAD_MUTEX_INITIALIZER, 0, 0, 0, true, jobs};
    if (!ordered) db[0].write_order = 0; /* one target without an order: plan order */
    zck_exec_opts o = ZCK_EXEC_OPTS_INIT;
    o.threads = 1;
    o.staging_bytes = 4096;
    o.written = on_written_order;
    o.written_ctx = &l;
    ZT_OK(zck_exec_run(jobs, 2, &o));
    check_gathered(ma);
    check_gathered(mb);
    ZT_ASSERT(l.n > 2 * NP);
    ZT_ASSERT(l.in_order == (ordered == 1)); /* without an order job 0 runs whole first */
    db[0].write_order = 2;
  }
  for (int p = 0; p < NP; p++) {
    free(ma[p]);
    free(mb[p]);
  }
}

int main(void) {
  setup();
  test_write_order();
  test_gather_to_file();
  test_packed_crc();
  test_errors();
  test_multi_job();
  test_verify_on_read();
  for (int r = 0; r < W; r++) {
    zck__source_close(&rank_src[r]);
    free(rank_path[r]);
  }
  for (int p = 0; p < NP; p++) free(truth[p]);
  zck_plan_free(plan);
  zck_layout_free(src_layout);
  zck_layout_free(dst_layout);
  free(dir);
  return 0;
}
