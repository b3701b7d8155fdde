/* save.c: a save of checkpoint-<step>/ (saver.h). Ranks that are threads: rank 0 writes
 * every file from all ranks' memory while the others wait; per rank: save_rank.c. Either
 * way rank 0 ends it (zck__saver_finish): the HF files, the manifest last, the rename of
 * the whole folder into place, then rotation. In the background: save_async.c. */
#include "saver_internal.h"

#include "deepspeed/ds_writer.h"
#include "error.h"
#include "manifest.h"
#include "stream_hash.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- the hooks' views

zck_status zck__saver_source(const zck_saver *s, void *only, void *lp_of, zck__saver_view *out) {
  memset(out, 0, sizeof *out);
  return s->h.describe_source(s->h.ctx, s->ranks, only, lp_of, &out->v, &out->owned);
}

zck_status zck__saver_target(const zck_saver *s, void *rank, zck__saver_view *out) {
  memset(out, 0, sizeof *out);
  return s->h.describe_target(s->h.ctx, rank, &out->v, &out->owned);
}

void zck__saver_view_free(const zck_saver *s, zck__saver_view *v) {
  if (v->owned) s->h.release(s->h.ctx, v->owned);
  memset(v, 0, sizeof *v);
}

bool zck__saver_keeper(const zck_saver *s, const zck_saver_rank *r) { return s->tr.one_rank || r->comm->rank == 0; }

bool zck__saver_g16_wanted(const zck_saver *s) { return s->tr.stage == 3 && (s->tr.gather16 || s->tr.save_only_model); }

// ---- the end of a save (rank 0)

/* config.json from the trainer's text; known (optional): its hashes from those bytes. */
static zck_status write_config(const zck_saver *s, const char *path, zck__manifest_known *known, size_t *cap) {
  char *text = s->h.config_json(s->h.ctx);
  if (!text) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  size_t n = strlen(text);
  zck__outfile f;
  zck_status st = zck__outfile_create(&f, path);
  if (st == ZCK_OK) st = zck__outfile_pwrite(&f, text, n, 0);
  if (st == ZCK_OK) st = zck__outfile_commit(&f);
  else zck__outfile_abort(&f);
  if (st == ZCK_OK && known) st = zck__known_bytes(known, cap, path, "config.json", text, n);
  free(text);
  return st;
}

zck_status zck__saver_finish(zck_saver *s, const zck_saver_rank *r0, zck__outdir *od, int64_t step, bool per_rank,
                             const zck__manifest_known *known, zck__manifest_known *folder) {
  const zck_saver_train *tr = &s->tr;
  zck_status st = ZCK_OK;
  /* per rank: the tag folder is complete now (every rank's files are in), so `latest` */
  if (per_rank && !tr->save_only_model) st = zck_saver_write_latest(od->tmp_path, step);
  char *cfg = zck__outdir_file(od, "config.json"), *model = zck__outdir_file(od, "model.safetensors"),
       *state = zck__outdir_file(od, "trainer_state.json");
  if (st == ZCK_OK && (!cfg || !model || !state)) st = ZCK_ERR_NO_MEMORY;
  /* save_only_model: the manifest's folder is the checkpoint folder, every file of it
   * hashed as written (model.safetensors, config.json, trainer_state.json) */
  zck__manifest_known mk = {ZCK_MANIFEST_DEFAULT_CHUNK, NULL, 0, NULL};
  size_t cap_mk = 0;
  if (st == ZCK_OK && tr->save_only_model && folder) st = zck__known_merge(&mk, &cap_mk, folder);
  zck__manifest_known *own = tr->save_only_model ? &mk : NULL;
  if (st == ZCK_OK) st = write_config(s, cfg, own, &cap_mk);
  /* 16-bit weights: stage 1/2 always; stage 3 only when gathered on save (else HF keeps
   * only the DeepSpeed checkpoint); per rank, the ranks gathered the stage-3 file already */
  if (st == ZCK_OK && (tr->stage < 3 || (!per_rank && zck__saver_g16_wanted(s))))
    st = zck__g16_write(s, r0, model, own, &cap_mk);
  if (tr->save_only_model) known = &mk;
  if (st == ZCK_OK) st = zck_saver_write_trainer_state(s, state, step, own, &cap_mk, "trainer_state.json");
  if (st == ZCK_OK) {
    /* the manifest goes last: its presence marks the DeepSpeed tag folder complete, and
     * `zckpt verify` checks every tensor against its hashes */
    char tag[64];
    snprintf(tag, sizeof tag, "global_step%lld", (long long)step);
    char *tag_dir = tr->save_only_model ? zck__strdup(od->tmp_path) : zck__outdir_file(od, tag);
    zck_manifest_opts mo = ZCK_MANIFEST_OPTS_INIT;
    mo.kind = tr->save_only_model ? "safetensors" : "deepspeed";
    st = tag_dir ? zck__manifest_write_dir_known(tag_dir, &mo, known, NULL) : ZCK_ERR_NO_MEMORY;
    free(tag_dir);
  }
  if (st == ZCK_OK) st = zck__outdir_commit(od);
  zck__known_free(&mk);
  free(cfg);
  free(model);
  free(state);
  return st;
}

// ---- ranks that are threads

zck_status zck__saver_save_rank0(zck_saver *s, const zck_saver_rank *r0, int64_t step) {
  ZCK_TRY_CTX(zck__mkdirs(s->o.output_dir), "--output-dir");
  char *final = zck_saver_checkpoint_path(s, step, true);
  if (!final) return ZCK_ERR_NO_MEMORY;
  zck__outdir od;
  memset(&od, 0, sizeof od);
  zck_ds_writer *w = NULL; /* kept for the hashes it made as it wrote */
  zck_status st = zck__outdir_create(&od, final, true);
  if (st == ZCK_OK && !s->tr.save_only_model) st = zck__saver_write_deepspeed(s, r0, od.tmp_path, step, NULL, &w);
  if (st == ZCK_OK)
    st = zck__saver_finish(s, r0, &od, step, false, w ? zck__ds_writer_known(w, NULL, NULL) : NULL, NULL);
  zck_ds_writer_free(w);
  zck__outdir_abort(&od);
  if (st == ZCK_OK) st = zck_saver_rotate(s);
  if (st != ZCK_OK) st = zck__error_prepend(st, "saving %s", final);
  free(final);
  return st;
}

/* Every rank registers its memory; rank 0 does the work; the outcome travels to every rank. */
zck_status zck__saver_collective(zck_saver *s, const zck_saver_rank *r,
                                 zck_status (*fn)(zck_saver *, const zck_saver_rank *, int64_t), int64_t arg) {
  zck_comm *c = r->comm;
  s->ranks[c->rank] = r->mem;
  ZCK_TRY(c->barrier(c));
  int32_t st = 0;
  char msg[1024] = "";
  if (c->rank == 0) {
    zck_status e = fn(s, r, arg);
    st = (int32_t)e;
    if (e != ZCK_OK) snprintf(msg, sizeof msg, "%s", zck_last_error());
  }
  ZCK_TRY(c->broadcast(c, &st, 1, ZCK_I32, 0));
  if (st == ZCK_OK) return ZCK_OK;
  ZCK_TRY(c->broadcast(c, msg, sizeof msg, ZCK_U8, 0));
  return zck__fail((zck_status)st, "%s", msg);
}

bool zck_saver_due(const zck_saver *s, int64_t step) {
  /* the help's "and at the end" holds for every N */
  return s->o.output_dir && ((s->o.save_steps > 0 && step % s->o.save_steps == 0) || step == s->o.max_steps);
}

zck_status zck_saver_save(zck_saver *s, const zck_saver_rank *r, int64_t step) {
  if (s->tr.async_save) return zck__saver_save_async(s, r, step);
  if (s->tr.per_rank) return zck__saver_save_per_rank(s, r, step);
  return zck__saver_collective(s, r, zck__saver_save_rank0, step);
}
