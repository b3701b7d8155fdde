/* ds_offload.c: ZeRO-3 checkpoints whose optimizer was swapped to NVMe, described as the
 * other layouts are: the swapped sub-groups' stores are byte ranges of the swap files.
 *
 * What DeepSpeed 0.19.8 writes (runtime/engine.py save_checkpoint, runtime/zero/stage3.py,
 * runtime/swap_tensor/optimizer_utils.py; deepspeed-checkpoint.md):
 *   - only stage 3 swaps (`offload_optimizer: {device: nvme}`), and only the sub-groups whose
 *     fp32 partition is at least MIN_AIO_BYTES (1 MiB, or aio.block_size if larger) on that
 *     rank; the others stay in memory and are saved in the optim files as usual;
 *   - a swapped sub-group's tensors in the optim file are empty: fp32_flat_groups[g] and its
 *     exp_avg / exp_avg_sq have 0 elements (the swapper released them after the step);
 *   - save_checkpoint copies the rank's swap folder to <tag>/offloaded_tensors/rank<RR>/
 *     (RR: the dp rank, two digits at least), leaving out gradient files;
 *   - per swapped sub-group three raw files, named by ds_id = "<first>_<last>", the ds_ids of
 *     the sub-group's first and last param: `<ds_id>.tensor.swp` (fp32 master),
 *     `exp_avg-<ds_id>.tensor.swp`, `exp_avg_sq-<ds_id>.tensor.swp`. A param's ds_id is its
 *     index in model.named_parameters() (zero.Init numbers params as it converts them, frozen
 *     ones included, a tied param once), plus the count of params earlier models of the same
 *     process took (Init.param_id is a class counter): that offset is found from the files;
 *   - each file holds the partition's elements in the master dtype, then padding up to a
 *     multiple of 1024 * aio.intra_op_parallelism bytes (the aligned swap buffer, written
 *     whole). The padding is no data.
 * No checksum is written: a flipped bit inside the data cannot be found; a missing file or
 * one of the wrong size is refused by name. zero_to_fp32 reads none of this (it fails on
 * the empty partitions), nor does DeepSpeed's own load of the optim files: it copies the
 * folder back into its swap folder. */
#include "ds_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct zck__ds_offload {
  zck__source **src;       /* open swap files (each its own block: stores point at them) */
  size_t n_src, cap_src;
  int64_t *ds_id;          /* [n_params]: DeepSpeed's ds_id of each param before the offset; -1 tied alias */
  int64_t id_offset;       /* per rank folder: Init.param_id of the first param (found from the names) */
  int64_t *ids_out;        /* [n_params]: ds_id + id_offset, for a writer (zck_ds_nvme_target) */
  uint64_t align_bytes;
};

void zck__ds_offload_free(struct zck__ds_offload *o) {
  if (!o) return;
  for (size_t i = 0; i < o->n_src; i++) {
    zck__source_close(o->src[i]);
    free(o->src[i]);
  }
  free(o->src);
  free(o->ds_id);
  free(o->ids_out);
  free(o);
}

static char *rank_dir(const zck_ds_ckpt *c, uint32_t r) {
  char name[40];
  snprintf(name, sizeof name, "offloaded_tensors/rank%02u", r);
  return zck__path_join(c->fs.dir, name);
}

/* named_parameters() order: module order, tied aliases left out (the same Parameter). */
static zck_status number_params(zck_ds_ckpt *c, struct zck__ds_offload *o) {
  const zck_model *m = c->model;
  if (!(o->ds_id = zck__calloc(m->n_params + 1, sizeof *o->ds_id))) return ZCK_ERR_NO_MEMORY;
  for (size_t p = 0; p < m->n_params; p++) {
    if (m->params[p].tied_to >= 0) { o->ds_id[p] = -1; continue; }
    int64_t id = 0;
    for (size_t q = 0; q < m->n_params; q++)  /* n_params is small next to the bytes; keep it obvious */
      if (m->params[q].tied_to < 0 && c->param_mod[q] < c->param_mod[p]) id++;
    o->ds_id[p] = id;
  }
  return ZCK_OK;
}

/* The offset of this process's numbering: the smallest <first> of the fp32 files in the
 * folder against the smallest first ds_id of the swapped sub-groups. */
static zck_status find_offset(zck_ds_ckpt *c, struct zck__ds_offload *o, uint32_t r, const char *dir,
                              int64_t want_min) {
  DIR *d = opendir(dir);
  if (!d) return zck__fail_errno(errno, "%s: cannot list the NVMe-offload folder of dp rank %u", dir, r);
  int64_t seen_min = -1;
  struct dirent *e;
  while ((e = readdir(d))) {
    long long a, b;
    int end = 0;
    if (sscanf(e->d_name, "%lld_%lld.tensor.swp%n", &a, &b, &end) == 2 && end && !e->d_name[end] && a >= 0 &&
        (seen_min < 0 || a < seen_min))
      seen_min = a;
  }
  closedir(d);
  (void)c;
  o->id_offset = seen_min >= want_min ? seen_min - want_min : 0;
  return ZCK_OK;
}

static zck_status open_swap(struct zck__ds_offload *o, const char *path, const zck__source **out) {
  if (o->n_src == o->cap_src) {
    size_t nc = o->cap_src ? 2 * o->cap_src : 16;
    zck__source **nv = zck__realloc(o->src, nc * sizeof *nv);
    if (!nv) return ZCK_ERR_NO_MEMORY;
    o->src = nv;
    o->cap_src = nc;
  }
  struct stat st;
  if (stat(path, &st) != 0) {
    if (errno == ENOENT)
      return zck__fail(ZCK_ERR_NOT_FOUND, "%s: missing NVMe-offloaded optimizer file (the optim file holds an empty "
                       "partition for it)", path);
    return zck__fail_errno(errno, "%s: cannot stat", path);
  }
  zck__source *src = zck__calloc(1, sizeof *src);
  if (!src) return ZCK_ERR_NO_MEMORY;
  zck_status s = zck__source_open(src, path);
  if (s != ZCK_OK) {
    free(src);
    return s;
  }
  o->src[o->n_src++] = src;
  *out = src;
  return ZCK_OK;
}

bool zck__ds_offload_swapped(const zck_ds_ckpt *c, const zck__ds_flat *f, uint64_t lean) {
  return c->fs.has_offload_dir && c->info.stage == 3 && lean > 0 && f->fp32.numel == 0 &&
         (!f->has_state || (f->exp_avg.numel == 0 && f->exp_avg_sq.numel == 0));
}

static zck_status prepare(zck_ds_ckpt *c) {
  if (c->offload) return ZCK_OK;
  if (!(c->offload = zck__calloc(1, sizeof *c->offload))) return ZCK_ERR_NO_MEMORY;
  struct zck__ds_offload *o = c->offload;
  ZCK_TRY(number_params(c, o));
  /* aligned swap buffers: AIO_ALIGNED_BYTES (1024) * aio.intra_op_parallelism */
  int64_t iop = 1;
  const zck_pk *aio = c->ds_config ? zck_pk_dict_get(c->ds_config, "aio") : NULL;
  const zck_pk *v = aio ? zck_pk_dict_get(aio, "intra_op_parallelism") : NULL;
  if (v && (!zck_pk_as_int(v, &iop) || iop < 1 || iop > 4096))
    return zck__fail(ZCK_ERR_FORMAT, "%s: ds_config aio.intra_op_parallelism is not a positive int",
                     c->models[0].file->path);
  o->align_bytes = 1024 * (uint64_t)iop;
  /* offset of the numbering: from rank 0's folder, against the smallest swapped first id */
  int64_t want_min = -1;
  const zck_layout *L = c->train_layout;
  for (size_t g = 0; g < c->optims[0].n_flat; g++) {
    uint32_t id = zck_layout_store_id(L, (uint32_t)g, 0);
    if (!zck__ds_offload_swapped(c, &c->optims[0].flat[g], L->stores[id].lean)) continue;
    int64_t first = o->ds_id[c->flat_params[c->flat_first[g]]];
    if (want_min < 0 || first < want_min) want_min = first;
  }
  if (want_min < 0) return ZCK_OK;  /* rank 0 swapped nothing: ids as numbered */
  char *dir = rank_dir(c, 0);
  if (!dir) return ZCK_ERR_NO_MEMORY;
  zck_status s = find_offset(c, o, 0, dir, want_min);
  free(dir);
  return s;
}

zck_status zck__ds_offload_bind(zck_ds_ckpt *c, uint32_t r, size_t g, const zck_layout_store *st, uint32_t id) {
  ZCK_TRY(prepare(c));
  struct zck__ds_offload *o = c->offload;
  size_t a = c->flat_first[g], b = c->flat_first[g + 1];
  if (a == b) return zck__fail(ZCK_ERR_FORMAT, "%s: sub-group %zu is swapped but has no params", c->optims[r].file->path, g);
  int64_t first = o->ds_id[c->flat_params[a]] + o->id_offset, last = o->ds_id[c->flat_params[b - 1]] + o->id_offset;
  char *dir = rank_dir(c, r);
  if (!dir) return ZCK_ERR_NO_MEMORY;
  zck_dtype dt = c->info.master_dtype;
  uint64_t esz = zck_dtype_size(dt), numel = st->lean;
  uint64_t bytes = numel * esz, aligned = (bytes + o->align_bytes - 1) / o->align_bytes * o->align_bytes;
  static const char *prefix[3] = {"", "exp_avg-", "exp_avg_sq-"};
  zck_status s = ZCK_OK;
  for (int k = 0; k < 3 && s == ZCK_OK; k++) {
    if (k && !c->info.has_optimizer_state) break;
    char name[96];
    snprintf(name, sizeof name, "%s%lld_%lld.tensor.swp", prefix[k], (long long)first, (long long)last);
    char *path = zck__path_join(dir, name);
    if (!path) { s = ZCK_ERR_NO_MEMORY; break; }
    const zck__source *src = NULL;
    s = open_swap(o, path, &src);
    if (s == ZCK_OK && src->size != aligned)
      s = zck__fail(src->size < aligned ? ZCK_ERR_TRUNCATED : ZCK_ERR_MISMATCH,
                    "%s: %llu bytes, but sub-group %zu of dp rank %u holds %llu %s elements, %llu bytes as DeepSpeed "
                    "swaps them (padded to %llu)", path, (unsigned long long)src->size, g, r, (unsigned long long)numel,
                    zck_dtype_name(dt), (unsigned long long)aligned, (unsigned long long)o->align_bytes);
    if (s == ZCK_OK) {
      const char *sname = zck__ds_store_name(c, "%s", path);
      if (!sname) s = ZCK_ERR_NO_MEMORY;
      else c->stores[ZCK_DS_FP32 + k][id] = zck_store_source(src, 0, dt, numel, sname);
    }
    free(path);
  }
  free(dir);
  return s;
}

// ---- as a target: what DeepSpeed run with this checkpoint's NVMe config swaps

bool zck_ds_nvme_offloaded(const zck_ds_ckpt *c) { return c->fs.has_offload_dir && c->info.stage == 3; }

/* DeepSpeed swaps a sub-group when its fp32 partition has min_aio_bytes = max(MIN_AIO_BYTES
 * (1 MiB), aio.block_size) (swap_tensor/optimizer_utils.py is_swappable_tensor). A run may have
 * another MIN_AIO_BYTES: the threshold is taken from what this checkpoint swapped, the default
 * where it agrees with it, else the smallest swapped partition; then sizes between the largest
 * kept and the smallest swapped one are unknown (*unsure_lo, *unsure_hi; 0, 0: none). */
static zck_status swap_threshold(const zck_ds_ckpt *c, uint64_t *out, uint64_t *unsure_lo, uint64_t *unsure_hi) {
  uint64_t block = 0, min_swapped = 0, max_kept = 0;
  const zck_pk *aio = c->ds_config ? zck_pk_dict_get(c->ds_config, "aio") : NULL;
  const zck_pk *v = aio ? zck_pk_dict_get(aio, "block_size") : NULL;
  int64_t b = 0;
  if (v && zck_pk_as_int(v, &b) && b > 0) block = (uint64_t)b;
  uint64_t dflt = block > (1u << 20) ? block : (1u << 20);
  const zck_layout *L = c->train_layout;
  uint64_t esz = zck_dtype_size(c->info.master_dtype);
  for (uint32_t r = 0; r < c->info.world_size; r++)
    for (size_t g = 0; g < c->optims[r].n_flat; g++) {
      uint64_t lean = L->stores[zck_layout_store_id(L, (uint32_t)g, r)].lean, bytes = lean * esz;
      if (!lean) continue;
      if (zck__ds_offload_swapped(c, &c->optims[r].flat[g], lean)) {
        if (!min_swapped || bytes < min_swapped) min_swapped = bytes;
      } else if (bytes > max_kept) {
        max_kept = bytes;
      }
    }
  bool dflt_fits = dflt > max_kept && (!min_swapped || dflt <= min_swapped);
  *out = dflt_fits ? dflt : min_swapped ? min_swapped : max_kept + 1;
  *unsure_lo = *unsure_hi = 0;
  if (!dflt_fits) {
    *unsure_lo = max_kept;
    *unsure_hi = min_swapped ? min_swapped : UINT64_MAX;
  }
  return ZCK_OK;
}

zck_status zck_ds_nvme_target(zck_ds_ckpt *c, zck_ds_write_opts *o) {
  if (c->info.stage != 3 || !c->optims || !c->train_layout)
    return zck__fail(ZCK_ERR_UNSUPPORTED, "%s: NVMe-offload targets are written from a ZeRO-3 checkpoint (its ds_id "
                     "numbering)", c->fs.dir);
  ZCK_TRY(prepare(c));
  struct zck__ds_offload *o2 = c->offload;
  if (!o2->ids_out) {
    const zck_model *m = c->model;
    if (!(o2->ids_out = zck__calloc(m->n_params + 1, sizeof *o2->ids_out))) return ZCK_ERR_NO_MEMORY;
    for (size_t p = 0; p < m->n_params; p++) o2->ids_out[p] = o2->ds_id[p] < 0 ? -1 : o2->ds_id[p] + o2->id_offset;
  }
  if (!o->swap_min_bytes) ZCK_TRY(swap_threshold(c, &o->swap_min_bytes, &o->swap_unsure_lo, &o->swap_unsure_hi));
  o->nvme_offload = true;
  o->swap_align_bytes = o2->align_bytes;
  o->swap_ds_ids = o2->ids_out;
  return ZCK_OK;
}
