/* save_async_ranks.c: saves written in the background by ranks that are processes
 * (saver.h: async_save with one_rank; the ranks under mpirun / --nproc).
 *
 * The files and bytes are those of a synchronous save rank by rank (save_rank.c); what
 * changes is who waits. Every process runs a writer thread of its own, and the writers
 * never call a collective: the comm belongs to the step loop (MPI runs SERIALIZED).
 * Instead they meet in the temporary checkpoint folder:
 *  - the save of step N (collective, one agreement and one broadcast): each rank settles
 *    the save before it (below), snapshots what it writes (the snapshot hook) and copies
 *    the bookkeeping; rank 0 makes the temporary folder .checkpoint-N.zck-tmp-PID and its
 *    global_stepN/; they agree, the folder's name goes to every rank, each starts its writer
 *    and goes back to training;
 *  - each writer writes its own DeepSpeed files from its snapshot, hashing as it writes,
 *    each file committed durably (fsync, rename); then a rank other than 0 leaves its hashes
 *    in the folder as .zck-rank-R.hashes, itself committed durably, or on a failure its
 *    message as .zck-rank-R.failed;
 *  - rank 0's writer, its own files written, waits for every other rank's hashes file
 *    (or failure), reads and removes them, and only then writes `latest`, the HF files and
 *    the manifest (made from everyone's hashes) and renames the folder into place, then
 *    rotates. So `latest` and the checkpoint appear only once every rank's files are on the
 *    disk: a rank killed at any moment of the write leaves a temporary folder, never a
 *    committed one, and the newest checkpoint-M/ stays the complete one a resume picks.
 *  - settling the save before (at the next save, or the flush at the end of training):
 *    each rank waits for its own files (at most one save in flight per rank; a wait is
 *    said in the log), and the ranks agree on those outcomes; a failure anywhere makes
 *    rank 0's writer give up waiting (and remove the folder); rank 0 then joins its writer,
 *    whose commit's outcome rides on the next agreement. A failure is one line naming the
 *    save, the same on every rank: a background write is never lost silently.
 * A rank that dies ends the job (mpirun), and its peers' writers with it.
 */
#include "saver_internal.h"

#include "deepspeed/ds_writer.h"
#include "error.h"
#include "manifest.h"
#include "safetensors/safetensors.h"
#include "stream_hash.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HASHES_MAX ((size_t)1 << 30)

static void marker_path(char *out, size_t cap, const char *dir, int rank, const char *what) {
  snprintf(out, cap, "%s/.zck-rank-%d.%s", dir, rank, what);
}

static void nap(double *sec) {
  struct timespec ts = {0, (long)(*sec * 1e9)};
  nanosleep(&ts, NULL);
  if (*sec < 0.02) *sec *= 2;
}

// ---- the writer of a rank

/* A rank other than 0: its hashes, committed durably (after its files were). */
static zck_status leave_hashes(const char *dir, int rank, const zck__manifest_known *own) {
  void *buf = NULL;
  size_t n = 0;
  ZCK_TRY(zck__saver_hashes_encode(own, &buf, &n));
  char path[4200];
  marker_path(path, sizeof path, dir, rank, "hashes");
  zck__outfile f;
  zck_status st = zck__outfile_create(&f, path);
  if (st == ZCK_OK) st = zck__outfile_pwrite(&f, buf, n, 0);
  if (st == ZCK_OK) st = zck__outfile_commit(&f);
  else zck__outfile_abort(&f);
  free(buf);
  return st;
}

/* A rank other than 0 failed: its message for rank 0's writer, which waits for it. Plain
 * calls (no fault injection, no data block needed for an empty message): even a full disk
 * usually takes it; else rank 0's writer waits until the next agreement tells it. */
static void leave_failure(const char *dir, int rank, const char *msg) {
  char path[4200];
  marker_path(path, sizeof path, dir, rank, "failed");
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, msg, strlen(msg));
  (void)w;
  close(fd);
}

/* Rank 0: every other rank's hashes into all, in rank order, each file removed once read. */
static zck_status collect(zck__saver_job *j, int world, zck__manifest_known *all, size_t *cap) {
  for (int r = 1; r < world; r++) {
    char ok[4200], bad[4200];
    marker_path(ok, sizeof ok, j->dir, r, "hashes");
    marker_path(bad, sizeof bad, j->dir, r, "failed");
    double pause = 0.0005;
    for (;;) {
      struct stat sb;
      if (stat(ok, &sb) == 0) break;
      if (stat(bad, &sb) == 0) {
        char *msg = NULL;
        size_t n = 0;
        zck_status st = zck__read_small_file(bad, 4096, &msg, &n);
        st = zck__fail(ZCK_ERR_IO, "rank %d: %s", r, st == ZCK_OK ? msg : "failed");
        free(msg);
        return st;
      }
      if (atomic_load(&j->abandon)) return zck__fail(ZCK_ERR_INTERNAL, "rank %d did not finish its files", r);
      nap(&pause);
    }
    char *buf = NULL;
    size_t n = 0;
    ZCK_TRY(zck__read_small_file(ok, HASHES_MAX, &buf, &n));
    zck_status st = zck__saver_hashes_decode(buf, n, all, cap);
    free(buf);
    ZCK_TRY(st);
    ZCK_FAIL_IF(unlink(ok) != 0, ZCK_ERR_IO, "%s: cannot remove: %s", ok, strerror(errno));
  }
  return ZCK_OK;
}

/* Stage 3's model.safetensors: this rank's bytes of the file rank 0 created at the save
 * (rank 0: through its writer's descriptor; the others open it), on the disk before the
 * rank says it is done. */
static zck_status write_own_g16(zck__saver_job *j, bool lead) {
  zck_saver *t = &j->copy;
  char path[sizeof j->dir + 32];
  snprintf(path, sizeof path, "%s/model.safetensors", j->dir);
  if (lead) return zck__g16_write_own(t, &j->r0, &j->g16, zck_st_writer_fd(j->g16.w), path);
  zck__g16 g;
  ZCK_TRY(zck__g16_init(t, path, &g)); /* the same layout as rank 0's, not opened */
  int fd = -1;
  zck_status st = zck__g16_open_share(path, &fd);
  if (st == ZCK_OK) st = zck__g16_write_own(t, &j->r0, &g, fd, path);
  if (st == ZCK_OK) st = zck__g16_sync_share(fd, path);
  if (fd >= 0) close(fd);
  zck__g16_free(&g);
  return st;
}

/* Rank 0, every rank's bytes in: model.safetensors hashed (read back in file order: the
 * ranks wrote it in pieces, and XXH3 wants the bytes in order) when the manifest lists it,
 * and committed. */
static zck_status commit_g16(zck__saver_job *j, zck__manifest_known *model, size_t *cap) {
  bool listed = j->copy.tr.save_only_model;
  char path[sizeof j->dir + 32];
  snprintf(path, sizeof path, "%s/model.safetensors", j->dir);
  if (listed) ZCK_TRY(zck__g16_hash_back(&j->g16, path));
  ZCK_TRY(zck_st_writer_commit(j->g16.w));
  return listed ? zck_st_writer_known(j->g16.w, "model.safetensors", model, cap) : ZCK_OK;
}

static zck_status rank_work(zck__saver_job *j) {
  zck_saver *t = &j->copy;
  int rank = j->r0.comm->rank, world = j->r0.comm->size;
  bool only_model = t->tr.save_only_model, g16 = zck__saver_g16_wanted(t);
  zck_ds_writer *w = NULL;
  zck_status st = ZCK_OK;
  if (!only_model) {
    st = zck__saver_set_lr(t, j->step); /* the writer's own clone of the manifest */
    if (st == ZCK_OK) st = zck__saver_write_deepspeed(t, &j->r0, j->dir, j->step, &j->r0, &w);
  }
  if (st == ZCK_OK && g16) st = write_own_g16(j, rank == 0);
  const zck__manifest_known *own = w ? zck__ds_writer_known(w, NULL, NULL) : NULL;
  if (st == ZCK_OK && rank > 0) st = leave_hashes(j->dir, rank, own);
  if (st != ZCK_OK) snprintf(j->own_msg, sizeof j->own_msg, "%s", zck_last_error());
  if (st != ZCK_OK && rank > 0) leave_failure(j->dir, rank, j->own_msg);
  j->own_status = st;
  atomic_store(&j->own_done, true);
  if (st != ZCK_OK || rank > 0) {
    zck_ds_writer_free(w);
    return st;
  }
  /* rank 0: the commit, once every rank's files are in */
  zck__manifest_known all = {ZCK_MANIFEST_DEFAULT_CHUNK, NULL, 0, NULL}, model = all;
  size_t cap = 0;
  /* rank 0's own first, as the synchronous save gathers them (through the same bytes) */
  void *buf = NULL;
  size_t n = 0;
  st = zck__saver_hashes_encode(own, &buf, &n);
  if (st == ZCK_OK) st = zck__saver_hashes_decode(buf, n, &all, &cap);
  free(buf);
  zck_ds_writer_free(w);
  if (st == ZCK_OK) st = collect(j, world, &all, &cap);
  size_t cap_model = 0;
  if (st == ZCK_OK && g16) st = commit_g16(j, &model, &cap_model);
  if (st == ZCK_OK) st = zck__saver_finish(t, &j->r0, &j->od, j->step, true, only_model ? NULL : &all, &model);
  if (st == ZCK_OK) st = zck_saver_rotate(t);
  zck__known_free(&all);
  zck__known_free(&model);
  if (st != ZCK_OK) st = zck__error_prepend(st, "saving %s", j->od.path ? j->od.path : "a checkpoint");
  return st;
}

// ---- the step loop's side (collective)

/* Rank 0, stage 3's 16-bit save: model.safetensors made now (header, full size) in the
 * temporary folder, so that every rank's writer can fill its own bytes; hashed when the
 * manifest will list it. */
static zck_status create_g16(zck__saver_job *j) {
  char path[sizeof j->dir + 32];
  snprintf(path, sizeof path, "%s/model.safetensors", j->dir);
  ZCK_TRY(zck__g16_init(&j->copy, path, &j->g16));
  atomic_init(&j->g16_budget.used, 0);
  j->g16_budget.max = zck__shash_default_budget();
  if (j->copy.tr.save_only_model) ZCK_TRY(zck_st_writer_hash(j->g16.w, &j->g16_budget));
  return zck_st_writer_open(j->g16.w, path);
}

/* Each rank: its own files of the save in flight are written (waited for, said in the log
 * when it had to), agreed across ranks; rank 0 then joins its writer. Returns the agreed
 * outcome, and on rank 0 its commit's (agreed at the next agreement). */
static zck_status settle(zck_saver *s, const zck_saver_rank *r, int64_t next) {
  zck_comm *c = r->comm;
  bool lead = c->rank == 0;
  zck__saver_job *j = s->job;
  zck_status st = ZCK_OK;
  if (j) {
    if (!atomic_load(&j->own_done)) {
      double t0 = zck__saver_now_s(), pause = 0.0002;
      while (!atomic_load(&j->own_done)) nap(&pause);
      if (lead && next)
        zck__saver_note(s, "async save: the save of step %lld waited %.3f s for the one of step %lld, still being written",
                        (long long)next, zck__saver_now_s() - t0, (long long)j->step);
      else if (lead)
        zck__saver_note(s, "async save: the end of training waited %.3f s for the save of step %lld",
                        zck__saver_now_s() - t0, (long long)j->step);
    }
    if (j->own_status != ZCK_OK)
      st = zck__fail(j->own_status, "background save of step %lld: %s", (long long)j->step, j->own_msg);
  }
  st = zck_comm_agree(c, st);
  if (!j) return st;
  if (st != ZCK_OK) atomic_store(&j->abandon, true);
  char msg[1024];
  snprintf(msg, sizeof msg, "%s", zck_last_error());
  zck_status w = zck_saver_drain(s); /* joins; rank 0: the commit's outcome */
  if (st != ZCK_OK) return zck__fail(st, "%s", msg); /* the agreed failure, not the abandon */
  return lead ? w : ZCK_OK;
}

static void discard(zck_saver *s) {
  zck__saver_job_free(s->job); /* rank 0: removes the temporary folder */
  s->job = NULL;
}

zck_status zck__saver_save_async_ranks(zck_saver *s, const zck_saver_rank *r, int64_t step) {
  zck_comm *c = r->comm;
  bool lead = c->rank == 0;
  zck_status st = settle(s, r, step);
  if (st == ZCK_OK) st = zck__saver_prepare_job(s, r, step);
  zck__saver_job *j = s->job;
  void *snap = NULL;
  if (st == ZCK_OK) st = s->h.snapshot(s->h.ctx, r->mem, &snap);
  if (st == ZCK_OK && lead) {
    char *final = zck_saver_checkpoint_path(s, step, false);
    st = final ? zck__mkdirs(s->o.output_dir) : ZCK_ERR_NO_MEMORY;
    if (st == ZCK_OK) st = zck__outdir_create(&j->od, final, true);
    free(final);
    if (st == ZCK_OK && strlen(j->od.tmp_path) >= sizeof j->dir)
      st = zck__fail(ZCK_ERR_INVALID_ARG, "%s: path too long", j->od.tmp_path);
    if (st == ZCK_OK) snprintf(j->dir, sizeof j->dir, "%s", j->od.tmp_path);
    if (st == ZCK_OK && !s->tr.save_only_model) {
      char tag[4200];
      snprintf(tag, sizeof tag, "%s/global_step%lld", j->dir, (long long)step);
      if (mkdir(tag, 0755) != 0) st = zck__fail_errno(errno, "%s: cannot create", tag);
    }
    if (st == ZCK_OK && zck__saver_g16_wanted(s)) st = create_g16(j);
  }
  /* one agreement: the save before (rank 0's commit of it), the snapshots, the folder */
  st = zck_comm_agree(c, st);
  if (st == ZCK_OK) {
    char dir[sizeof j->dir];
    memcpy(dir, j->dir, sizeof dir);
    st = c->broadcast(c, dir, sizeof dir, ZCK_U8, 0);
    dir[sizeof dir - 1] = 0;
    memcpy(j->dir, dir, sizeof dir);
  }
  if (st != ZCK_OK) {
    if (s->job) discard(s);
    return st;
  }
  memset(j->copy.ranks, 0, sizeof j->copy.ranks);
  j->copy.ranks[c->rank] = snap;
  j->r0.mem = snap;
  j->work = rank_work;
  zck__saver_start_job(s);
  return ZCK_OK;
}

zck_status zck__saver_flush_ranks(zck_saver *s, const zck_saver_rank *r) {
  zck_status st = settle(s, r, 0);
  /* rank 0's commit of the last save: every rank fails with it */
  return zck_comm_agree(r->comm, st);
}
