/* io_image.c: an output file assembled in memory and written with one pwrite at commit.
 *
 * Why: a torch.save file is laid out record by record (local header, padding, data, data
 * descriptor, then the central directory), and each piece is a separate pwrite. For a
 * file of a few KB (a universal checkpoint holds three per parameter: 300k at 100k
 * params) or one of 100k tiny records, the system calls cost more than the bytes. An
 * outfile given an image (zck__outfile_buffer) copies every write into it instead, and
 * the commit writes the whole image at once; the bytes on disk are the same.
 *
 * Memory stays bounded: all images of the process together hold at most
 * ZCK__IMAGE_BUDGET bytes; a write that would take an image past it (or past the image
 * limit of one file) first writes the image out, and the file goes on with direct writes.
 * Writes may come from many threads at once (the executor's); a mutex per image orders
 * them. Not used by the ranks of a distributed job (they share the file on disk). */
#include "io.h"
#include "dist.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* All images of the process together, and one image at most (overridable to test the
 * spill path: -DZCK__IMAGE_MAX=...). */
#ifndef ZCK__IMAGE_BUDGET
#define ZCK__IMAGE_BUDGET ((uint64_t)96 << 20)
#endif
#ifndef ZCK__IMAGE_MAX
#define ZCK__IMAGE_MAX ((uint64_t)48 << 20)
#endif

static _Atomic uint64_t zck__image_bytes; /* reserved by every live image */

struct zck__outimg {
  pthread_mutex_t mu;
  _Atomic bool spilled;  /* written out: later writes go straight to the file */
  uint8_t *data;
  uint64_t len;          /* end of the furthest write: [0, len) is written or zeroed */
  uint64_t cap;          /* bytes of data, reserved in zck__image_bytes */
};

void zck__outfile_buffer(zck__outfile *f) {
  if (f->img || f->fd < 0 || zck__dist_on()) return;
  zck__outimg *m = calloc(1, sizeof *m);
  if (!m) return; /* direct writes, as without */
  pthread_mutex_init(&m->mu, NULL);
  atomic_init(&m->spilled, false);
  f->img = m;
}

static void zck__image_release(zck__outimg *m) {
  free(m->data);
  m->data = NULL;
  atomic_fetch_sub(&zck__image_bytes, m->cap);
  m->cap = 0;
}

/* Writes the image to the file and turns to direct writes. Lock held. */
static zck_status zck__image_spill(zck__outfile *f) {
  zck__outimg *m = f->img;
  zck_status s = ZCK_OK;
  if (m->len) s = zck__pwrite_all(f->fd, m->data, (size_t)m->len, 0, f->path);
  zck__image_release(m);
  atomic_store(&m->spilled, true);
  return s;
}

/* Grows the image to hold `end` bytes: false when the budget or the limit says no (or
 * memory does). Lock held. */
static bool zck__image_grow(zck__outimg *m, uint64_t end) {
  if (end <= m->cap) return true;
  if (end > ZCK__IMAGE_MAX) return false;
  uint64_t cap = m->cap ? m->cap : 4096;
  while (cap < end) cap *= 2;
  if (cap > ZCK__IMAGE_MAX) cap = ZCK__IMAGE_MAX;
  uint64_t more = cap - m->cap;
  if (atomic_fetch_add(&zck__image_bytes, more) + more > ZCK__IMAGE_BUDGET) {
    atomic_fetch_sub(&zck__image_bytes, more);
    return false;
  }
  uint8_t *d = realloc(m->data, (size_t)cap);
  if (!d) {
    atomic_fetch_sub(&zck__image_bytes, more);
    return false;
  }
  m->data = d; /* not zeroed: a write past len zeroes the gap before it (a file's holes) */
  m->cap = cap;
  return true;
}

zck_status zck__outfile_image_write(zck__outfile *f, const void *data, size_t n, uint64_t off) {
  zck__outimg *m = f->img;
  if (atomic_load_explicit(&m->spilled, memory_order_acquire)) return zck__pwrite_all(f->fd, data, n, off, f->path);
  uint64_t end;
  if (!zck__add_u64(off, n, &end)) return zck__fail(ZCK_ERR_INVALID_ARG, "%s: write past the end of files", f->path);
  pthread_mutex_lock(&m->mu);
  zck_status s = ZCK_OK;
  bool direct = atomic_load(&m->spilled);
  if (!direct && !zck__image_grow(m, end)) {
    s = zck__image_spill(f);
    direct = true;
  }
  if (!direct) {
    if (off > m->len) memset(m->data + m->len, 0, (size_t)(off - m->len));
    memcpy(m->data + off, data, n);
    if (end > m->len) m->len = end;
  }
  pthread_mutex_unlock(&m->mu);
  if (s == ZCK_OK && direct) s = zck__pwrite_all(f->fd, data, n, off, f->path);
  return s;
}

bool zck__outfile_image_read(zck__outfile *f, void *buf, size_t n, uint64_t off) {
  zck__outimg *m = f->img;
  if (!m || atomic_load(&m->spilled)) return false;
  pthread_mutex_lock(&m->mu);
  bool inside = !atomic_load(&m->spilled) && off <= m->len && n <= m->len - off;
  if (inside) memcpy(buf, m->data + off, n);
  pthread_mutex_unlock(&m->mu);
  return inside;
}

zck_status zck__outfile_image_flush(zck__outfile *f) {
  zck__outimg *m = f->img;
  if (!m || atomic_load(&m->spilled)) return ZCK_OK;
  pthread_mutex_lock(&m->mu);
  zck_status s = atomic_load(&m->spilled) ? ZCK_OK : zck__image_spill(f);
  pthread_mutex_unlock(&m->mu);
  return s;
}

void zck__outfile_image_free(zck__outfile *f) {
  zck__outimg *m = f->img;
  if (!m) return;
  zck__image_release(m);
  pthread_mutex_destroy(&m->mu);
  free(m);
  f->img = NULL;
}
