/* io_floor.c: the I/O floor of a job over a DeepSpeed checkpoint or a torch DCP folder:
 * read the bytes it needs (every fp32 partition region of the checkpoint, in place; of a
 * DCP folder, every chunk of the model weights) once, and write as many bytes as the job
 * writes, once, into one file, with the same thread count, no conversion, one fsync at the
 * end. What no tool can beat: the writes go through the library's own pwrite loop
 * (zck__pwrite_all: 256 KiB pieces, writeback started every MiB), the fastest way to hand
 * this kernel the bytes that we know of, and each read asks the kernel for the next piece
 * first (POSIX_FADV_WILLNEED), as the jobs' executor does, so the disk works while this
 * thread writes; a job that does better than the floor means the floor needs the better
 * way too.
 *
 * usage: io_floor CHECKPOINT OUT_FILE [THREADS [WRITE_BYTES]]
 * FLOOR_PARTS=all: every optimizer state (fp32, exp_avg, exp_avg_sq), the floor of
 * to-universal and reshard; default fp32 only (consolidate). WRITE_BYTES: bytes to write
 * (default: as many as are read); where it exceeds the bytes read, the data read is
 * written again at the next multiple of the read size (a job writing a value twice, such
 * as reshard's 16-bit weights beside the fp32 master, still reads it once); where it is
 * smaller (compressed output), the tail of what is read is not written.
 * FLOOR_CHUNK: bytes per copy (default 1 MiB).
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcp/dcp.h"
#include "deepspeed/deepspeed.h"
#include "io.h"

typedef struct region { int fd; uint64_t off, len, out_off; } region;
typedef struct shared {
  region *r;
  size_t n, next;
  uint64_t read_total, write_total;
  size_t chunk;
  int out;
  pthread_mutex_t mu;
} shared;

static void *worker(void *arg) {
  shared *s = arg;
  char *buf = malloc(s->chunk);
  if (!buf) { perror("malloc"); exit(1); }
  for (;;) {
    pthread_mutex_lock(&s->mu);
    size_t i = s->next++;
    pthread_mutex_unlock(&s->mu);
    if (i >= s->n) break;
    region *r = &s->r[i];
    for (uint64_t done = 0; done < r->len;) {
      size_t n = r->len - done > s->chunk ? s->chunk : (size_t)(r->len - done);
      if (done + n < r->len) (void)posix_fadvise(r->fd, (off_t)(r->off + done + n), (off_t)s->chunk, POSIX_FADV_WILLNEED);
      if (pread(r->fd, buf, n, (off_t)(r->off + done)) != (ssize_t)n) { perror("pread"); exit(1); }
      /* the same bytes at every copy of the read set inside the write size */
      for (uint64_t at = r->out_off + done; at < s->write_total; at += s->read_total) {
        size_t m = s->write_total - at < n ? (size_t)(s->write_total - at) : n;
        if (zck__pwrite_all(s->out, buf, m, at, "io_floor") != ZCK_OK) {
          fprintf(stderr, "io_floor: %s\n", zck_last_error());
          exit(1);
        }
      }
      done += n;
    }
  }
  free(buf);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 3) { fprintf(stderr, "usage: io_floor CHECKPOINT OUT_FILE [THREADS [WRITE_BYTES]]\n"); return 2; }
  int threads = argc > 3 ? atoi(argv[3]) : 2;
  bool all = getenv("FLOOR_PARTS") && !strcmp(getenv("FLOOR_PARTS"), "all");
  shared s = {NULL, 0, 0, 0, 0, (size_t)1 << 20, -1, PTHREAD_MUTEX_INITIALIZER};
  if (getenv("FLOOR_CHUNK") && atol(getenv("FLOOR_CHUNK")) > 0) s.chunk = (size_t)atol(getenv("FLOOR_CHUNK"));
  uint64_t out_off = 0;
  zck_ds_ckpt *c = NULL;
  zck_dcp *dcp = NULL;
  if (zck_dcp_is_checkpoint(argv[1])) {
    /* a DCP folder: the chunks of the model weights (trainable and frozen), with
     * FLOOR_PARTS=all the Adam moments too, each where it lies in its .distcp file */
    if (zck_dcp_open(argv[1], NULL, &dcp) != ZCK_OK) { fprintf(stderr, "io_floor: %s\n", zck_last_error()); return 1; }
    zck_state_view v;
    zck_dcp_state(dcp, &v);
    static const int kinds[] = {ZCK_STATE_FP32, ZCK_STATE_FROZEN, ZCK_STATE_EXP_AVG, ZCK_STATE_EXP_AVG_SQ};
    for (int k = 0; k < (all ? 4 : 2); k++) {
      const zck_state_part *p = &v.part[kinds[k]];
      if (!p->layout) continue;
      s.r = realloc(s.r, (s.n + p->layout->n_stores) * sizeof(region));
      for (size_t i = 0; i < p->layout->n_stores; i++) {
        const zck_store *st = &p->stores[i];
        if (st->kind != ZCK_STORE_SOURCE || !st->numel) continue;
        uint64_t len = st->numel * zck_dtype_size(st->dtype);
        s.r[s.n++] = (region){st->source->fd, st->source->base + st->base, len, out_off};
        out_off += len;
      }
    }
  } else if (zck_ds_open(argv[1], NULL, &c) != ZCK_OK) {
    fprintf(stderr, "io_floor: %s\n", zck_last_error());
    return 1;
  }
  for (int part = 0; c && part < (all ? 3 : 1); part++) {
    zck_ds_view v;
    if (zck_ds_get(c, (zck_ds_part)(ZCK_DS_FP32 + part), &v) != ZCK_OK) { fprintf(stderr, "io_floor: %s\n", zck_last_error()); return 1; }
    s.r = realloc(s.r, (s.n + v.layout->n_stores) * sizeof(region));
    for (size_t i = 0; i < v.layout->n_stores; i++) {
      const zck_store *st = &v.stores[i];
      if (st->kind != ZCK_STORE_SOURCE || !st->numel) continue;
      uint64_t len = st->numel * zck_dtype_size(st->dtype);
      s.r[s.n++] = (region){st->source->fd, st->base, len, out_off};
      out_off += len;
    }
  }
  s.read_total = out_off;
  s.write_total = argc > 4 ? strtoull(argv[4], NULL, 10) : out_off;
  if (!s.read_total) { fprintf(stderr, "io_floor: nothing to read\n"); return 1; }
  /* no ftruncate to the final size first: filling a sparse file cost this kernel about
   * twice the system time of writing a new one, as the jobs do */
  s.out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (s.out < 0) { perror(argv[2]); return 1; }
  pthread_t th[64];
  if (threads < 1 || threads > 64) threads = 2;
  for (int i = 0; i < threads; i++) pthread_create(&th[i], NULL, worker, &s);
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  if (fsync(s.out) != 0) { perror("fsync"); return 1; }
  close(s.out);
  fprintf(stderr, "io_floor: read %llu bytes in %zu regions, wrote %llu bytes\n", (unsigned long long)s.read_total, s.n,
          (unsigned long long)s.write_total);
  zck_ds_close(c);
  zck_dcp_close(dcp);
  free(s.r);
  return 0;
}
