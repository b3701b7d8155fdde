/* consolidate_torch_save.c: zck_dcp_to_torch_save, torch's dcp_to_torch_save(dir, path)
 * as a job: the DCP folder resolved as every job resolves it, the output checked against
 * the input, then formats/dcp writes torch's file (dcp_torch_save.c). */
#include <sys/stat.h>

#include "dcp/dcp.h"
#include "zck.h"

zck_status zck_dcp_to_torch_save(const char *dcp, const char *out, const zck_consolidate_opts *opts) {
  zck_consolidate_opts o = ZCK_CONSOLIDATE_OPTS_INIT;
  ZCK_TRY(zck__opts_load(&o, sizeof o, opts, "zck_dcp_to_torch_save"));
  if (!dcp || !out) return zck__fail(ZCK_ERR_INVALID_ARG, "zck_dcp_to_torch_save: no input or output path");
  if (!zck_dcp_is_checkpoint(dcp)) return zck__fail(ZCK_ERR_FORMAT, "%s: not a torch Distributed Checkpoint", dcp);
  ZCK_TRY(zck_check_out_not_input(dcp, out, NULL));
  struct stat sb;
  if (lstat(out, &sb) == 0) {
    if (S_ISDIR(sb.st_mode)) return zck__fail(ZCK_ERR_EXISTS, "%s: exists and is a folder (OUT names the file to write)", out);
    if (!o.overwrite) return zck__fail(ZCK_ERR_EXISTS, "%s: exists (overwrite to replace it)", out);
  }
  zck_dcp *c = NULL;
  ZCK_TRY(zck_dcp_open(dcp, NULL, &c));
  zck_status s = zck_dcp_torch_save(c, out);
  zck_dcp_close(c);
  return s;
}
