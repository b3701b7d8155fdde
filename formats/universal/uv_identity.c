/* uv_identity.c: each file of a universal folder says which file it is.
 *
 * torch.save names the archive folder inside a .pt after the file's stem (torch.h
 * zck_torch_archive_name), and ds_to_universal.py and zckpt's writer both save every file
 * under its own name: zero/<param>/exp_avg.pt holds "exp_avg/...", the carried
 * zero_pp_rank_1_mp_rank_00_model_states.pt holds "zero_pp_rank_1_mp_rank_00_model_states/...".
 * A file copied over another keeps the name it was saved as. Shapes alone cannot see such a
 * copy (a param's three states have one shape; ZeRO-3 rank files are padded to one size),
 * and a folder written by ds_to_universal.py has no hashes, so without this check the
 * other file's values would be read in this one's place.
 *
 * Only a name that is another file of the same folder is refused: "archive" (older torch,
 * a file-like object, older zckpt) or any other stem (a file saved under a temporary name
 * and renamed) says nothing about whose it is. */
#include "uv_internal.h"

#include <string.h>

#include "deepspeed/deepspeed.h"

/* The per-param state files of the layout. */
static const char *const zck__uv_state_names[] = {"fp32", "exp_avg", "exp_avg_sq", "step"};

static bool zck__uv_is_state_name(const char *s) {
  for (size_t i = 0; i < sizeof zck__uv_state_names / sizeof *zck__uv_state_names; i++)
    if (!strcmp(s, zck__uv_state_names[i])) return true;
  return false;
}

zck_status zck__uv_check_identity(const zck_torch_file *f, const char *path) {
  const char *arch = zck_torch_prefix(f);
  if (!arch) return ZCK_OK;
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  size_t stem_len = strlen(base);
  const char *dot = strrchr(base, '.');
  if (dot && dot != base) stem_len = (size_t)(dot - base);
  if (strlen(arch) == stem_len && !strncmp(arch, base, stem_len)) return ZCK_OK;
  /* a param's state file holding another state */
  if (zck__uv_is_state_name(arch))
    return zck__fail(ZCK_ERR_MISMATCH, "%s: a copy of %s.pt (its archive is named '%s'; %.*s.pt's would be '%.*s')",
                     path, arch, arch, (int)stem_len, base, (int)stem_len, base);
  /* a carried rank model-states file holding another rank's (dp or tensor-parallel) */
  long own = zck_ds_name_rank(base, stem_len), held = zck_ds_name_rank(arch, strlen(arch));
  long own_mp = zck_ds_name_mp(base, stem_len), held_mp = zck_ds_name_mp(arch, strlen(arch));
  if ((own >= 0 && held >= 0 && own != held) || (own_mp >= 0 && held_mp >= 0 && own_mp != held_mp))
    return zck__fail(ZCK_ERR_MISMATCH, "%s: a copy of %.200s.pt, another rank's file (its archive is named '%.200s')",
                     path, arch, arch);
  return ZCK_OK;
}

zck_status zck__uv_torch_open(const char *path, const zck_torch_open_opts *opts, zck_torch_file **out) {
  ZCK_TRY(zck_torch_open(path, opts, out));
  zck_status st = zck__uv_check_identity(*out, path);
  if (st != ZCK_OK) {
    zck_torch_close(*out);
    *out = NULL;
  }
  return st;
}
