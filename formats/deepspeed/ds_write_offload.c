/* ds_write_offload.c: a ZeRO-3 target whose optimizer DeepSpeed swaps to NVMe.
 *
 * DeepSpeed 0.19.8 run with `offload_optimizer: {device: nvme}` loads none of the optim
 * files' optimizer state (engine.py load_checkpoint skips _load_zero_checkpoint): it copies
 * <tag>/offloaded_tensors/rank<RR>/ into its swap folder and swaps the sub-groups in from
 * there. So the sub-groups it swaps at the target's world size are written where it reads
 * them, as ds_offload.c reads them (the layout is described there): per sub-group whose
 * fp32 partition has at least swap_min_bytes, `<first>_<last>.tensor.swp`,
 * `exp_avg-<first>_<last>.tensor.swp` and `exp_avg_sq-<first>_<last>.tensor.swp`, the
 * partition in fp32, then zero padding up to swap_align_bytes; in the optim file those
 * tensors are empty, as DeepSpeed saves them. The files are ordinary files of the tag
 * folder: the manifest hashes them like the others, so verify checks their bytes. */
#include "ds_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct zck__ds_swapfile {
  zck__outfile f;
  char *name;               /* <tag>/offloaded_tensors/rank<RR>/<file>, for messages */
};

bool zck__ds_write_swapped(const zck_ds_writer *w, uint32_t r, size_t g) {
  if (!w->o.nvme_offload || w->stage != 3) return false;
  uint64_t lean = w->train->stores[zck_layout_store_id(w->train, (uint32_t)g, r)].lean;
  return lean > 0 && lean * zck_dtype_size(ZCK_F32) >= w->o.swap_min_bytes;
}

static zck_status add_swapfile(zck_ds_writer *w, struct zck__ds_swapfile **out) {
  pthread_mutex_lock(&w->mu);
  zck_status s = ZCK_OK;
  if (w->n_swap == w->cap_swap) {
    size_t nc = w->cap_swap ? 2 * w->cap_swap : 16;
    struct zck__ds_swapfile **nv = zck__realloc(w->swap, nc * sizeof *nv);
    if (nv) { w->swap = nv; w->cap_swap = nc; }
    else s = ZCK_ERR_NO_MEMORY;
  }
  struct zck__ds_swapfile *f = s == ZCK_OK ? zck__calloc(1, sizeof *f) : NULL;
  if (s == ZCK_OK && !f) s = ZCK_ERR_NO_MEMORY;
  if (f) {
    f->f.fd = -1;
    w->swap[w->n_swap++] = f;
  }
  pthread_mutex_unlock(&w->mu);
  *out = f;
  return s;
}

/* A partition whose size the source's swaps do not settle: whether DeepSpeed swaps it depends on
 * its MIN_AIO_BYTES, which the checkpoint does not record. */
zck_status zck__ds_write_swap_check(const zck_ds_writer *w, uint32_t r) {
  for (size_t g = 0; g < w->n_flat; g++) {
    uint64_t bytes = w->train->stores[zck_layout_store_id(w->train, (uint32_t)g, r)].lean * zck_dtype_size(ZCK_F32);
    if (bytes > w->o.swap_unsure_lo && bytes < w->o.swap_unsure_hi)
      return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: NVMe offload: sub-group %zu of rank %u has a %llu-byte fp32 partition, "
                       "and the source swapped partitions from %llu bytes but kept ones of %llu (a lowered "
                       "MIN_AIO_BYTES): whether DeepSpeed swaps it is not known; give --swap-min-bytes", w->shown, g, r,
                       (unsigned long long)bytes, (unsigned long long)w->o.swap_unsure_hi,
                       (unsigned long long)w->o.swap_unsure_lo);
  }
  return ZCK_OK;
}

/* Every rank's folder, even when it swaps nothing: DeepSpeed's load copies it whole
 * (copytree) and fails on a missing one. */
zck_status zck__ds_write_swap_dir(zck_ds_writer *w, uint32_t r) {
  char rel[48];
  snprintf(rel, sizeof rel, "offloaded_tensors/rank%02u", r);
  char *path = zck__path_join(w->fdir, rel);
  if (!path) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__mkdirs(path);
  free(path);
  return s;
}

zck_status zck__ds_write_swap_files(zck_ds_writer *w, uint32_t r, size_t g) {
  const zck_group_spec *sg = &w->flat[g];
  if (!sg->n_params || !w->o.swap_ds_ids)
    return zck__fail(ZCK_ERR_INVALID_ARG, "%s: NVMe-offload sub-group %zu has no params or no ds_ids", w->shown, g);
  long long first = (long long)w->o.swap_ds_ids[sg->params[0]], last = (long long)w->o.swap_ds_ids[sg->params[sg->n_params - 1]];
  uint32_t id = zck_layout_store_id(w->train, (uint32_t)g, r);
  uint64_t numel = w->train->stores[id].lean, bytes = numel * zck_dtype_size(ZCK_F32);
  uint64_t align = w->o.swap_align_bytes ? w->o.swap_align_bytes : 1024;
  uint64_t padded = (bytes + align - 1) / align * align;
  static const char *prefix[3] = {"", "exp_avg-", "exp_avg_sq-"};
  for (int k = 0; k < 3; k++) {
    if (k && !w->o.has_optimizer_state) break;
    char rel[160];
    snprintf(rel, sizeof rel, "offloaded_tensors/rank%02u/%s%lld_%lld.tensor.swp", r, prefix[k], first, last);
    struct zck__ds_swapfile *sf;
    ZCK_TRY(add_swapfile(w, &sf));
    char *path = zck__path_join(w->fdir, rel);
    if (!path || !(sf->name = zck__sprintf("%s/%s", w->shown, rel))) { free(path); return ZCK_ERR_NO_MEMORY; }
    zck_status s = zck__outfile_create(&sf->f, path);
    free(path);
    ZCK_TRY(s);
    ZCK_TRY(zck__outfile_truncate(&sf->f, padded));  /* the padding: zeros, no data */
    w->stores[ZCK_DS_FP32 + k][id] = zck_store_fd(sf->f.fd, 0, ZCK_F32, numel, sf->name);
  }
  return ZCK_OK;
}

zck_status zck__ds_write_swap_commit(zck_ds_writer *w) {
  for (size_t i = 0; i < w->n_swap; i++) {
    if (w->swap[i]->f.fd < 0) continue;
    ZCK_TRY(zck__outfile_commit(&w->swap[i]->f));
    w->swap[i]->f.fd = -1;
  }
  return ZCK_OK;
}

void zck__ds_write_swap_free(zck_ds_writer *w) {
  for (size_t i = 0; i < w->n_swap; i++) {
    if (w->swap[i]->f.fd >= 0) zck__outfile_abort(&w->swap[i]->f);
    free(w->swap[i]->name);
    free(w->swap[i]);
  }
  free(w->swap);
}
