/* to_universal_dcp.c: `zckpt to-universal DCP OUT [--format ds|hdf5]`: a torch Distributed
 * Checkpoint as a universal checkpoint.
 *
 * A universal checkpoint is made from a DeepSpeed one: its model-states files are copied
 * into the folder, its optimizer's settings reshaped into zero/optimizer_state.pt, the
 * HDF5 container's /resume_state is what a DeepSpeed run reads back. So the DCP is first
 * the DeepSpeed checkpoint `zckpt reshard DCP` writes by default (ZeRO-3 at the ranks
 * that saved it; reshard_from_dcp.c), built in a hidden folder beside OUT, and that is
 * converted by the DeepSpeed half of the job, the container naming the DCP as its source.
 * A reshard of OUT is then the reshard of the DCP itself, byte for byte. The hidden folder
 * is removed whatever happens; on failure nothing is left at OUT. The cost is one more
 * write and read of the state, on the disk OUT is on. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dist.h"
#include "to_universal.h"

zck_status zck__to_universal_dcp(const char *src, const char *out, const zck_universal_opts *o) {
  if (o->tag) return zck__fail(ZCK_ERR_INVALID_ARG, "--tag: %s is a torch Distributed Checkpoint, which has no tags", src);
  const char *slash = strrchr(out, '/');
  char *parent = slash ? zck__strndup(out, (size_t)(slash - out)) : zck__strdup(".");
  if (!parent) return ZCK_ERR_NO_MEMORY;
  if (!*parent) {   /* OUT in the root folder */
    free(parent);
    if (!(parent = zck__strdup("/"))) return ZCK_ERR_NO_MEMORY;
  }
  struct stat sb;
  bool had_parent = stat(parent, &sb) == 0;
  /* one name for every rank of a distributed job (rank 0's pid), as the output's own */
  char *tmp = zck__sprintf("%s/.%s.zck-dcp-%ld", parent, slash ? slash + 1 : out, zck__dist_tmp_pid());
  zck_status st = tmp ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  if (st == ZCK_OK) {
    zck_reshard_opts ro = ZCK_RESHARD_OPTS_INIT;
    ro.to_stage = 3;
    ro.threads = o->threads;
    ro.no_verify = o->no_verify;
    ro.overwrite = 1;   /* a hidden folder of an earlier run that was killed */
    st = zck_reshard(src, tmp, &ro);
    st = zck__dist_agree(ZCK__DIST_STEP, st);   /* rank 0 has renamed it into place */
  }
  if (st == ZCK_OK) st = zck__to_universal_of(tmp, src, out, o);
  if (tmp) {
    st = zck__dist_agree(ZCK__DIST_STEP, st);   /* no rank reads it any more */
    zck_status keep = st;
    char *err = st != ZCK_OK ? zck__strdup(zck_last_error()) : NULL;
    if (zck__dist_rank() == 0) {   /* the others are done with it once rank 0's job has ended */
      zck__remove_tree(tmp);
      if (keep != ZCK_OK && !had_parent) rmdir(parent);   /* made for OUT, now empty */
    }
    zck_clear_error();
    if (keep != ZCK_OK) st = zck__fail(keep, "%s", err ? err : "to-universal failed");
    free(err);
  }
  free(tmp);
  free(parent);
  return st;
}
