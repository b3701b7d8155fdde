/* consolidate_memory.c: zero_to_fp32's state dict into the caller's memory, from a
 * DeepSpeed checkpoint or a universal one made of it (source.c).
 *
 * The same recipe and transfer as `zckpt consolidate` (consolidate.c), with memory stores as
 * the targets instead of reserved file regions: each tensor's bytes go from the rank files
 * straight into the caller's buffer, converted on the way, with no temporary file.
 */
#include <stdlib.h>
#include <string.h>

#include "consolidate_internal.h"
#include "zck.h"

struct zck_state_dict {
  zck__src src;              /* the checkpoint, or a universal one made of it */
  zck__tensor_set set;
  zck__cons_entry *entries;
  zck_tensor_desc *desc;    /* [set.n] */
  zck_consolidate_opts opts;
};

static zck_tensor_role zck__sd_role(zck_ds_out_kind k) {
  return k == ZCK_DS_OUT_BUFFER ? ZCK_ROLE_BUFFER : k == ZCK_DS_OUT_FROZEN ? ZCK_ROLE_FROZEN : ZCK_ROLE_PARAM;
}

zck_status zck_consolidate_open(const char *path, const zck_consolidate_opts *opts, zck_state_dict **out) {
  if (!path || !out) return zck__fail(ZCK_ERR_INVALID_ARG, "zck_consolidate_open: NULL argument");
  *out = NULL;
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  ZCK_TRY(zck__opts_load(&o, sizeof o, opts, "zck_consolidate_open"));
  if (o.dtype != ZCK_DTYPE_INVALID && !zck__cons_floating(o.dtype))
    return zck__fail(ZCK_ERR_INVALID_ARG, "dtype must be fp32, bf16 or fp16");
  zck_state_dict *sd = zck__calloc(1, sizeof *sd);
  if (!sd) return ZCK_ERR_NO_MEMORY;
  zck__set_init(&sd->set);
  sd->opts = o;
  zck_status st = zck__cons_open(&sd->src, path, &o);
  if (st == ZCK_OK) st = zck__cons_build_set(sd->src.outs, sd->src.n_outs, &o, &sd->set, &sd->entries);
  if (st == ZCK_OK && !(sd->desc = zck__calloc(sd->set.n ? sd->set.n : 1, sizeof *sd->desc))) st = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; st == ZCK_OK && i < sd->set.n; i++) {
    const zck__tensor_entry *e = &sd->set.v[i];
    zck_tensor_desc *d = &sd->desc[i];
    d->name = e->name;
    d->dtype = zck__entry_out_dtype(e);
    d->ndim = e->ndim;
    d->shape = e->shape;
    d->numel = e->numel;
    d->nbytes = e->numel * zck_dtype_size(d->dtype);
    d->alias_of = e->alias_of;
    d->role = zck__sd_role(sd->entries[i].kind);
  }
  if (st != ZCK_OK) {
    zck_state_dict_free(sd);
    return st;
  }
  *out = sd;
  return ZCK_OK;
}

size_t zck_state_dict_count(const zck_state_dict *sd) { return sd ? sd->set.n : 0; }

const zck_tensor_desc *zck_state_dict_tensor(const zck_state_dict *sd, size_t i) {
  return sd && i < sd->set.n ? &sd->desc[i] : NULL;
}

zck_status zck_state_dict_read(zck_state_dict *sd, void *const *buffers) {
  if (!sd || (!buffers && sd->set.n)) return zck__fail(ZCK_ERR_INVALID_ARG, "zck_state_dict_read: NULL argument");
  zck_store *dst = zck__calloc(sd->set.n ? sd->set.n : 1, sizeof *dst);
  if (!dst) return ZCK_ERR_NO_MEMORY;
  zck_status st = ZCK_OK;
  for (size_t i = 0; i < sd->set.n; i++) {
    const zck_tensor_desc *d = &sd->desc[i];
    if (d->alias_of >= 0) continue; /* shares its source's buffer: left unbound */
    if (!buffers[i] && d->numel) {
      st = zck__fail(ZCK_ERR_INVALID_ARG, "tensor %s: no buffer given", d->name);
      break;
    }
    dst[i] = zck_store_memory(buffers[i], d->dtype, d->numel, d->name);
    if (!d->numel) dst[i].kind = ZCK_STORE_UNBOUND; /* nothing to copy */
  }
  zck__cons_ctx ctx = {&sd->src.view, sd->entries, sd->opts.threads, sd->opts.progress, sd->opts.progress_ctx,
                       sd->opts.no_verify != 0};
  zck__set_pass pass = {dst, NULL, NULL};
  if (st == ZCK_OK) st = zck__cons_transfer(&ctx, &sd->set, &pass);
  free(dst);
  return st;
}

void zck_state_dict_free(zck_state_dict *sd) {
  if (!sd) return;
  zck__set_free(&sd->set);
  free(sd->entries);
  free(sd->desc);
  zck__src_close(&sd->src);
  free(sd);
}
