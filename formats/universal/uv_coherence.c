/* uv_coherence.c: that a universal folder's zero/<param>/fp32.pt files belong to the save its model-states file
 * comes from.
 *
 * A folder made from a ZeRO-1/2 checkpoint (ds_to_universal.py or zckpt to-universal) carries that checkpoint's
 * mp_rank_00_model_states.pt, whose `module` holds each trainable param's 16-bit (or fp32) copy: DeepSpeed writes
 * it from the fp32 masters after every optimizer step (round to nearest even), and an fp16 overflow skips both.
 * An fp32.pt taken from the folder of another step of the same run has the right name, shape, dtype, archive
 * name and zip CRCs; its values are not the masters of that copy, and consolidate or reshard would mix two steps.
 * Where zckpt's manifest is present its XXH3 catches it too (uv_expect.c); ds_to_universal.py writes none.
 *
 * A stage-3 source's module holds empty placeholders, a PipelineModule's, AutoEP's and deepspeed.moe's are laid
 * out by their own readers, AutoTP's are slices: none is compared. exp_avg.pt / exp_avg_sq.pt have no copy
 * anywhere to compare with (a whole param folder from another step is refused by its step.pt, uv_read.c). */
#include "uv_internal.h"

#include <stdlib.h>
#include <string.h>

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

static zck_status check_param(const zck__source *model, const zck__uv_tstore *ts, const zck__uv_tref *t,
                              const char *name, const char *model_path, float *m, uint8_t *v) {
  uint64_t n = ts->numel < ZCK__UV_COHERENCE_ELEMS ? ts->numel : ZCK__UV_COHERENCE_ELEMS;
  size_t esz = zck_dtype_size(t->dtype);
  zck__source f;
  ZCK_TRY(zck__source_open(&f, ts->path));
  zck_status s = zck__source_read(&f, m, n * 4, ts->base);
  zck__source_close(&f);
  ZCK_TRY(s);
  ZCK_TRY(zck__source_read(model, v, n * esz, t->offset));
  for (uint64_t i = 0; i < n; i++)
    if (!same_copy(t->dtype, v + i * esz, m[i]))
      return zck__fail(ZCK_ERR_MISMATCH, "%s: '%s' element %llu is not the fp32 master of its copy in %s's module: "
                       "an fp32.pt of another step?", ts->path, name, (unsigned long long)i, model_path);
  return ZCK_OK;
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
