/* manifest_hash.c: hashing files for manifests and verification, in parallel, in bounded
 * memory.
 *
 * Each file is read once, front to back, through one staging buffer per worker thread.
 * The same bytes feed the whole-file XXH3, the chunk XXH3s and every requested byte
 * range (tensors: XXH3; zip records: CRC-32): a checkpoint is read exactly once whatever
 * is asked of it. Files go to the workers biggest first, so one big file does not start
 * last. A range that fits in one buffer is hashed in one call; only ranges that cross a
 * buffer boundary hold a streaming state, so a file with a million small tensors costs no
 * more memory than one with ten.
 */
#include "manifest.h"

#include "exec.h"
#include "io.h"
#include "threadpool.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "hash_xxh3.h"

#define ZCK__HASH_DEFAULT_STAGING ((size_t)4 << 20)
#define ZCK__HASH_SLICE ((uint64_t)64 << 10)

void zck__hash_file_clear(zck__hash_file *f) {
  if (!f) return;
  free(f->chunks);
  free(f->error);
  f->chunks = NULL;
  f->error = NULL;
  f->n_chunks = 0;
  f->ok = false;
}

typedef struct hash_run {
  zck__hash_file *files;
  size_t *order;               /* files by size, biggest first */
  size_t staging;
  uint8_t **bufs;              /* one per worker */
  bool keep_going;
  zck_progress_cb progress;
  void *progress_ctx;
  pthread_mutex_t lock;
  uint64_t done_bytes, total_bytes;
  bool canceled;               /* the progress callback asked to stop, under lock */
} hash_run;

/* A range being read: started, not yet finished. */
typedef struct active_range {
  zck__hash_range *r;
  XXH3_state_t *st;            /* NULL until the range crosses a buffer boundary */
  uint32_t crc;
} active_range;

static int cmp_range_ptr(const void *a, const void *b) {
  const zck__hash_range *x = *(zck__hash_range *const *)a, *y = *(zck__hash_range *const *)b;
  if (x->off != y->off) return x->off < y->off ? -1 : 1;
  return x->len < y->len ? -1 : x->len > y->len;
}

/* Feeds [pos, pos + n) of the file (in buf) to one active range; true when it is done. */
static bool feed_range(active_range *a, const uint8_t *buf, uint64_t pos, uint64_t n, zck_status *err) {
  zck__hash_range *r = a->r;
  uint64_t end = r->off + r->len, lo = r->off > pos ? r->off : pos, hi = end < pos + n ? end : pos + n;
  bool whole_here = r->off >= pos && end <= pos + n;
  if (hi > lo) {
    const uint8_t *p = buf + (lo - pos);
    size_t k = (size_t)(hi - lo);
    if (r->want & ZCK__HASH_CRC32) a->crc = zck_crc32_update(a->crc, p, k); /* ISA-L, crc32.c */
    if (r->want & ZCK__HASH_XXH3) {
      if (whole_here) {
        r->xxh3 = XXH3_64bits(p, k);
      } else {
        if (!a->st) {
          a->st = XXH3_createState();
          if (!a->st) { *err = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory"); return true; }
          XXH3_64bits_reset(a->st);
        }
        XXH3_64bits_update(a->st, p, k);
      }
    }
  }
  if (end > pos + n) return false;
  if ((r->want & ZCK__HASH_XXH3) && !whole_here) r->xxh3 = a->st ? XXH3_64bits_digest(a->st) : XXH3_64bits(NULL, 0);
  if (r->want & ZCK__HASH_CRC32) r->crc32 = a->crc;
  r->done = true;
  return true;
}

/* The whole-file hash and the chunk hashes of one file, fed its bytes in order. */
typedef struct file_hashes {
  zck__hash_file *f;
  XXH3_state_t *whole, *chunk; /* chunk: NULL without chunks */
  uint64_t chunk_k, chunk_fill; /* the chunk being hashed, and its bytes so far */
} file_hashes;

static void file_hashes_update(file_hashes *fh, const uint8_t *p, uint64_t n) {
  uint64_t size = fh->f->chunk_size;
  for (uint64_t k = 0; k < n;) { /* chunk boundaries may fall inside p */
    uint64_t take = fh->chunk && size - fh->chunk_fill < n - k ? size - fh->chunk_fill : n - k;
    XXH3_64bits_update(fh->whole, p + k, (size_t)take);
    /* the first chunk's hash is the file's hash at the chunk's end: no third pass over
     * it (a file shorter than a chunk is hashed twice, not three times; as stream_hash.c) */
    if (fh->chunk && fh->chunk_k) XXH3_64bits_update(fh->chunk, p + k, (size_t)take);
    k += take;
    if (fh->chunk && (fh->chunk_fill += take) == size) {
      fh->f->chunks[fh->chunk_k] = fh->chunk_k ? XXH3_64bits_digest(fh->chunk) : XXH3_64bits_digest(fh->whole);
      fh->chunk_k++;
      XXH3_64bits_reset(fh->chunk);
      fh->chunk_fill = 0;
    }
  }
}

static void file_hashes_finish(file_hashes *fh) {
  zck__hash_file *f = fh->f;
  f->xxh3 = XXH3_64bits_digest(fh->whole);
  if (fh->chunk && fh->chunk_fill) { /* the last, partial chunk (the file itself when it is the first) */
    f->chunks[fh->chunk_k] = fh->chunk_k ? XXH3_64bits_digest(fh->chunk) : f->xxh3;
    fh->chunk_k++;
  }
  f->ok = true;
}

/* The requested ranges of one file by offset, and those started but not finished. */
typedef struct range_feed {
  zck__hash_range **sorted;
  size_t n, next;              /* next: the first range not started */
  active_range *act;
  size_t n_act;
} range_feed;

/* Sorts the ranges; the empty ones inside the file are done before any byte is read. */
static void range_feed_start(range_feed *rf, zck__hash_range *ranges, uint64_t file_size) {
  for (size_t i = 0; i < rf->n; i++) {
    ranges[i].done = false;
    rf->sorted[i] = &ranges[i];
  }
  qsort(rf->sorted, rf->n, sizeof *rf->sorted, cmp_range_ptr);
  for (size_t i = 0; i < rf->n; i++) {
    zck__hash_range *r = rf->sorted[i];
    if (r->len == 0 && r->off <= file_size) {
      r->xxh3 = XXH3_64bits(NULL, 0);
      r->crc32 = 0;
      r->done = true;
    }
  }
}

/* Feeds [pos, pos + n) of the file to the ranges that start before its end and are not done. */
static zck_status range_feed_update(range_feed *rf, const uint8_t *p, uint64_t pos, uint64_t n) {
  while (rf->next < rf->n && rf->sorted[rf->next]->off < pos + n) {
    zck__hash_range *r = rf->sorted[rf->next++];
    if (!r->done) rf->act[rf->n_act++] = (active_range){r, NULL, 0};
  }
  zck_status st = ZCK_OK;
  for (size_t a = 0; a < rf->n_act && st == ZCK_OK;) {
    if (feed_range(&rf->act[a], p, pos, n, &st)) {
      XXH3_freeState(rf->act[a].st);
      rf->act[a] = rf->act[--rf->n_act];
    } else {
      a++;
    }
  }
  return st;
}

/* n more bytes read: tells the progress callback, and fails once it asked to stop (it is
 * not called again then). */
static zck_status progress_add(hash_run *h, uint64_t n) {
  if (!h->progress) return ZCK_OK;
  pthread_mutex_lock(&h->lock);
  h->done_bytes += n;
  if (!h->canceled) h->canceled = h->progress(h->progress_ctx, h->done_bytes, h->total_bytes) != 0;
  bool stop = h->canceled;
  pthread_mutex_unlock(&h->lock);
  return stop ? zck__fail(ZCK_ERR_CANCELED, "canceled") : ZCK_OK;
}

static zck_status hash_one_file(hash_run *h, zck__hash_file *f, uint8_t *buf) {
  zck__source src;
  ZCK_TRY(zck__source_open(&src, f->path));
  zck_status st = ZCK_OK;
  file_hashes fh = {f, XXH3_createState(), f->chunk_size ? XXH3_createState() : NULL, 0, 0};
  range_feed rf = {zck__malloc((f->n_ranges ? f->n_ranges : 1) * sizeof *rf.sorted), f->n_ranges, 0,
                   zck__calloc(f->n_ranges ? f->n_ranges : 1, sizeof *rf.act), 0};
  f->size = src.size;
  f->n_chunks = f->chunk_size ? (size_t)zck__ceil_div(src.size, f->chunk_size) : 0;
  f->chunks = f->n_chunks ? zck__calloc(f->n_chunks, sizeof *f->chunks) : NULL;
  if (!fh.whole || !rf.sorted || !rf.act || (f->n_chunks && !f->chunks) || (f->chunk_size && !fh.chunk)) {
    st = zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
    goto done;
  }
  XXH3_64bits_reset(fh.whole);
  if (fh.chunk) XXH3_64bits_reset(fh.chunk);
  range_feed_start(&rf, f->ranges, src.size);
#ifdef POSIX_FADV_SEQUENTIAL
  if (src.fd >= 0) (void)posix_fadvise(src.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
  for (uint64_t pos = 0; st == ZCK_OK && pos < src.size;) {
    uint64_t n = src.size - pos < h->staging ? src.size - pos : h->staging;
    st = zck__source_read(&src, buf, (size_t)n, pos);
    /* every hash over one slice while it is in the cache, then the next slice (hashing
     * is memory-bound: three passes over the whole buffer read it from memory three times) */
    for (uint64_t so = 0; st == ZCK_OK && so < n; so += ZCK__HASH_SLICE) {
      uint64_t sn = n - so < ZCK__HASH_SLICE ? n - so : ZCK__HASH_SLICE;
      file_hashes_update(&fh, buf + so, sn);
      st = range_feed_update(&rf, buf + so, pos + so, sn);
    }
    pos += n;
    if (st == ZCK_OK) st = progress_add(h, n);
  }
  if (st == ZCK_OK) file_hashes_finish(&fh);
done:
  for (size_t a = 0; a < rf.n_act; a++) XXH3_freeState(rf.act[a].st); /* ranges past the end stay !done */
  XXH3_freeState(fh.whole);
  XXH3_freeState(fh.chunk);
  free(rf.sorted);
  free(rf.act);
  zck__source_close(&src);
  return st;
}

static zck_status hash_item(void *ctx, size_t item, unsigned thread) {
  hash_run *h = ctx;
  zck__hash_file *f = &h->files[h->order[item]];
  if (!h->bufs[thread] && !(h->bufs[thread] = zck__malloc(h->staging))) return ZCK_ERR_NO_MEMORY;
  zck__hash_file_clear(f);
  zck_status st = hash_one_file(h, f, h->bufs[thread]);
  f->status = st;
  if (st == ZCK_OK) return ZCK_OK;
  free(f->chunks);
  f->chunks = NULL;
  f->n_chunks = 0;
  f->ok = false;
  if (!h->keep_going || st == ZCK_ERR_CANCELED) return st; /* a cancel stops the run, not one file */
  f->error = strdup(zck_last_error()); /* NULL only without memory: the status still says it */
  zck_clear_error();
  return ZCK_OK;
}

typedef struct size_key {
  uint64_t size;
  size_t index;
} size_key;

static int cmp_size_desc(const void *a, const void *b) {
  const size_key *x = a, *y = b;
  if (x->size != y->size) return x->size > y->size ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index;
}

zck_status zck__hash_files(zck__hash_file *files, size_t n, const zck_manifest_hash_opts *opts) {
  zck_manifest_hash_opts o = ZCK_MANIFEST_HASH_OPTS_INIT;
  if (opts) o = *opts;
  hash_run h;
  memset(&h, 0, sizeof h);
  h.files = files;
  h.staging = o.staging_bytes ? o.staging_bytes : ZCK__HASH_DEFAULT_STAGING;
  if (h.staging < 64) h.staging = 64;
  h.keep_going = o.keep_going;
  h.progress = o.progress;
  h.progress_ctx = o.progress_ctx;
  size_key *keys = zck__malloc((n ? n : 1) * sizeof *keys);
  h.order = zck__malloc((n ? n : 1) * sizeof *h.order);
  unsigned workers = zck__worker_count(n, o.threads);
  h.bufs = zck__calloc(workers ? workers : 1, sizeof *h.bufs);
  if (!keys || !h.order || !h.bufs) {
    free(keys);
    free(h.order);
    free(h.bufs);
    return ZCK_ERR_NO_MEMORY;
  }
  for (size_t i = 0; i < n; i++) {
    struct stat sb;
    keys[i].size = stat(files[i].path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    keys[i].index = i;
    h.total_bytes += keys[i].size;
  }
  qsort(keys, n, sizeof *keys, cmp_size_desc);
  for (size_t i = 0; i < n; i++) h.order[i] = keys[i].index;
  free(keys);
  pthread_mutex_init(&h.lock, NULL);
  zck_status st = zck__parallel_for(n, workers, hash_item, &h);
  pthread_mutex_destroy(&h.lock);
  for (unsigned i = 0; i < workers; i++) free(h.bufs[i]);
  free(h.bufs);
  free(h.order);
  return st;
}

/* ---- manifests */

zck_status zck_manifest_hash(const char *dir, zck_manifest *m, const zck_manifest_hash_opts *o) {
  return zck__manifest_hash_some(dir, m, NULL, o, false);
}

zck_status zck__manifest_hash_some(const char *dir, zck_manifest *m, const bool *skip, const zck_manifest_hash_opts *o,
                                   bool lead) {
  size_t nf = m->n_files;
  zck__hash_file *hf = zck__calloc(nf ? nf : 1, sizeof *hf);
  zck__hash_range *ranges = zck__calloc(m->n_tensors ? m->n_tensors : 1, sizeof *ranges);
  size_t *first = zck__calloc(nf + 1, sizeof *first); /* tensors grouped by file */
  size_t *slot = zck__calloc(m->n_tensors ? m->n_tensors : 1, sizeof *slot);
  size_t *fill = zck__calloc(nf ? nf : 1, sizeof *fill);
  zck_status st = (hf && ranges && first && slot && fill) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < m->n_tensors; i++) first[m->tensors[i].file + 1]++;
  for (size_t f = 0; st == ZCK_OK && f < nf; f++) first[f + 1] += first[f];
  for (size_t i = 0; st == ZCK_OK && i < m->n_tensors; i++) {
    const zck_manifest_tensor *t = &m->tensors[i];
    size_t k = first[t->file] + fill[t->file]++;
    slot[i] = k;
    ranges[k] = (zck__hash_range){t->offset, t->nbytes, ZCK__HASH_XXH3, 0, 0, false};
  }
  /* the files to read, in a compact list (hf[k] is file which[k]) */
  size_t *which = zck__calloc(nf ? nf : 1, sizeof *which), nh = 0;
  if (!which) st = ZCK_ERR_NO_MEMORY;
  for (size_t f = 0; st == ZCK_OK && f < nf; f++) {
    if (skip && skip[f]) continue;
    which[nh] = f;
    hf[nh].path = zck__path_join(dir, m->files[f].path);
    if (!hf[nh].path) st = ZCK_ERR_NO_MEMORY;
    hf[nh].chunk_size = m->chunk_size;
    hf[nh].ranges = ranges + first[f];
    hf[nh].n_ranges = first[f + 1] - first[f];
    nh++;
  }
  if (st == ZCK_OK) st = lead ? zck__hash_files_lead(hf, nh, o) : zck__hash_files(hf, nh, o);
  for (size_t k = 0; st == ZCK_OK && k < nh; k++) {
    size_t f = which[k];
    zck_manifest_file *mf = &m->files[f];
    free(mf->chunks);
    free(mf->error);
    mf->chunks = NULL;
    mf->error = NULL;
    mf->n_chunks = 0;
    mf->hashed = hf[k].ok;
    if (!hf[k].ok) {
      mf->error = hf[k].error;
      hf[k].error = NULL;
      continue;
    }
    mf->size = hf[k].size;
    mf->xxh3 = hf[k].xxh3;
    if (hf[k].n_chunks > 1) { /* one chunk is the file itself */
      mf->chunks = hf[k].chunks;
      mf->n_chunks = hf[k].n_chunks;
      hf[k].chunks = NULL;
    }
  }
  for (size_t i = 0; st == ZCK_OK && i < m->n_tensors; i++) {
    if (skip && skip[m->tensors[i].file]) continue;
    const zck__hash_range *r = &ranges[slot[i]];
    m->tensors[i].hashed = r->done;
    m->tensors[i].xxh3 = r->xxh3;
  }
  for (size_t k = 0; hf && k < nh; k++) {
    free((char *)hf[k].path);
    zck__hash_file_clear(&hf[k]);
  }
  free(hf);
  free(which);
  free(ranges);
  free(first);
  free(slot);
  free(fill);
  return st;
}
