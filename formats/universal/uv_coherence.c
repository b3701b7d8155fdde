/* uv_coherence.c: that a universal folder's zero/<param>/fp32.pt files belong to the save its model-states file
 * comes from.
 *
 * A folder made from a ZeRO-1/2 checkpoint (ds_to_universal.py or zckpt to-universal) carries that checkpoint's
 * mp_rank_00_model_states.pt, whose `module` holds each trainable param's 16-bit (or fp32) copy: DeepSpeed writes
 * it from the fp32 masters after every optimizer step (round to nearest even), and an fp16 overflow skips both.
 * An fp32.pt taken from the folder of another step of the same run has the right name, shape, dtype, archive
 * name and zip CRCs; its values are not the masters of that copy, and consolidate or reshard would mix two steps.
 * Where zckpt's manifest is present its XXH3 catches it too (uv_expect.c); ds_to_universal.py writes none.
 * The same check refuses ds_to_universal.py's folder of a round_robin_gradients checkpoint: it follows
 * param_slice_mappings, whose offsets ignore the reordering, so the reordered params hold each other's values.
 *
 * A stage-3 source's module holds empty placeholders, a PipelineModule's, AutoEP's and deepspeed.moe's are laid
 * out by their own readers, AutoTP's are slices: none is compared. exp_avg.pt / exp_avg_sq.pt have no copy
 * anywhere to compare with (a whole param folder from another step is refused by its step.pt, uv_read.c). */
#include "uv_internal.h"

#include <stdlib.h>
#include <string.h>

#include "exec.h"
#include "hash_xxh3.h"
#include "io.h"
#include "manifest.h"
#include "util.h"

/* Elements compared per param: the copy of every element is exact, so a prefix refuses nothing valid, and a master
 * of another step differs from the copy in nearly every element of its first block. Bounded, so a job's open
 * reads at most this much more of each param than it did. */
#define ZCK__UV_COHERENCE_ELEMS ((uint64_t)4096)

static bool same_copy(zck_dtype dt, const uint8_t *copy, float master) {
  if (dt == ZCK_F32) return !memcmp(copy, &master, 4);
  uint16_t got;
  memcpy(&got, copy, 2);
  return got == (dt == ZCK_BF16 ? zck__bf16_round(master) : zck__f16_round(master));
}

/* On a difference: a flipped byte is said as the damage it is (the record's CRC-32), not as a file of another step. */
static zck_status check_record(const zck__source *src, const char *path, const zck_record_check *rec, const char *what) {
  uint8_t buf[1 << 16];
  uint32_t crc = 0;
  for (uint64_t pos = 0; pos < rec->size;) {
    size_t n = rec->size - pos < sizeof buf ? (size_t)(rec->size - pos) : sizeof buf;
    ZCK_TRY(zck__source_read(src, buf, n, rec->off + pos));
    crc = zck_crc32_update(crc, buf, n);
    pos += n;
  }
  if (crc != rec->crc32)
    return zck__fail(ZCK_ERR_DAMAGED, "%s: %s: CRC-32 mismatch (stored %08x, read %08x)", path, what, rec->crc32, crc);
  return ZCK_OK;
}

/* The same for a file zckpt's manifest lists: its XXH3 says the file was replaced, as a job reading it would. */
static zck_status check_xxh3(const zck__source *src, const zck__uv_tstore *ts) {
  XXH3_state_t *h = XXH3_createState();
  uint8_t *buf = h ? zck__malloc(1 << 16) : NULL;
  zck_status s = buf ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  uint64_t end = ts->base + ts->numel * ts->es;
  if (s == ZCK_OK) XXH3_64bits_reset(h);
  for (uint64_t pos = ts->base; s == ZCK_OK && pos < end; pos += 1 << 16) {
    size_t n = end - pos < (1 << 16) ? (size_t)(end - pos) : (size_t)1 << 16;
    s = zck__source_read(src, buf, n, pos);
    if (s == ZCK_OK) XXH3_64bits_update(h, buf, n);
  }
  uint64_t got = s == ZCK_OK ? XXH3_64bits_digest(h) : 0;
  if (s == ZCK_OK && got != ts->xxh3)
    s = zck__fail(ZCK_ERR_DAMAGED, "%s: tensor bytes [%llu, %llu) differ from " ZCK_MANIFEST_NAME " (XXH3 stored %016llx, "
                  "read %016llx): replaced or damaged since zckpt wrote it", ts->path, (unsigned long long)ts->base,
                  (unsigned long long)end, (unsigned long long)ts->xxh3, (unsigned long long)got);
  free(buf);
  XXH3_freeState(h);
  return s;
}

static zck_status check_param(const zck__source *model, const zck__uv_tstore *ts, const zck__uv_tref *t,
                              const char *name, const char *model_path, float *m, uint8_t *v) {
  uint64_t n = ts->numel < ZCK__UV_COHERENCE_ELEMS ? ts->numel : ZCK__UV_COHERENCE_ELEMS;
  size_t esz = zck_dtype_size(t->dtype);
  zck__source f;
  ZCK_TRY(zck__source_open(&f, ts->path));
  zck_status s = zck__source_read(&f, m, n * 4, ts->base);
  if (s == ZCK_OK) s = zck__source_read(model, v, n * esz, t->offset);
  uint64_t i = 0;
  while (s == ZCK_OK && i < n && same_copy(t->dtype, v + i * esz, m[i])) i++;
  if (s == ZCK_OK && i < n && ts->has_rec) s = check_record(&f, ts->path, &ts->rec, "tensor record");
  if (s == ZCK_OK && i < n && ts->has_xxh3) s = check_xxh3(&f, ts);
  if (s == ZCK_OK && i < n && t->has_rec) s = check_record(model, model_path, &t->rec, "module tensor record");
  if (s == ZCK_OK && i < n)
    s = zck__fail(ZCK_ERR_MISMATCH, "%s: '%s' element %llu is not the fp32 master of its copy in %s's module: "
                  "an fp32.pt of another step, or another param's values?", ts->path, name, (unsigned long long)i, model_path);
  zck__source_close(&f);
  return s;
}

zck_status zck__uv_check_masters(const zck_uv_ckpt *c, const uint32_t *params) {
  if (c->no_verify || c->info.stage > 2 || c->info.tp_size > 1 || c->pipe || c->autoep || c->legacy_moe) return ZCK_OK;
  const char *model_path = zck_torch_name(c->model0);
  float *m = zck__calloc(ZCK__UV_COHERENCE_ELEMS, sizeof *m);
  uint8_t *v = zck__calloc(ZCK__UV_COHERENCE_ELEMS, 4);
  zck__source model = {0};
  zck_status s = m && v ? zck__source_open(&model, model_path) : ZCK_ERR_NO_MEMORY;
  bool opened = s == ZCK_OK;
  for (size_t i = 0; s == ZCK_OK && i < c->n_stores; i++) {
    const zck_param *p = &c->m->params[params[i]];
    const zck__uv_tstore *ts = &c->ts[0][i];
    int64_t k = c->param_mod[params[i]];
    if (p->frozen || p->tied_to >= 0 || k < 0 || ts->es != 4 || !ts->path) continue;
    const zck__uv_tref *t = &c->module[k];
    bool known = t->dtype == ZCK_BF16 || t->dtype == ZCK_F16 || t->dtype == ZCK_F32;
    if (!known || !t->contiguous || t->numel != ts->numel) continue;   /* nothing to compare against */
    s = check_param(&model, ts, t, p->name, model_path, m, v);
  }
  if (opened) zck__source_close(&model);
  free(m);
  free(v);
  return s;
}
