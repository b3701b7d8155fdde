/* to_universal_autoep.c: the model-states files of a universal folder made from a DeepSpeed AutoEP checkpoint.
 *
 * ds_to_universal.py 0.19.8 does not copy an AutoEP source's model files byte for byte: it loads each one, sets
 * two entries of its universal_checkpoint_info and saves it again, and DeepSpeed's universal loader reads them
 * there (which params are experts, how many experts each layer has):
 *   - ZeRO-1/2 (mp_rank_00_model_states.pt): expert_parameter_patterns = ['\.experts\.w[123]$'] and
 *     ds_autoep_layers = each layer's moe_layer_id, module_path, expert_key_prefix, num_experts,
 *     num_local_experts, ep_size (DeepSpeedCheckpoint's lightweight metadata), in that order;
 *   - ZeRO-3 (every zero_pp_rank_R_mp_rank_00_model_states.pt): expert_parameter_patterns =
 *     ['.*\.experts\.w[123]$'] and ds_autoep_layers = the file's own ds_autoep_layers, whole.
 * An entry already there keeps its place (a Python dict's); a missing universal_checkpoint_info is added last.
 * The expert files themselves are not carried (their weights are in zero/<prefix>.w{1,2,3}/). Each file is its
 * tree copied (tensors as copies the executor checks as it reads them), the two entries set, then written. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "to_universal.h"

/* dict[key] = v as Python does it: in place when the key is there, else appended. */
static bool set_key(zck_pk_doc *d, zck_pk *dict, const char *key, zck_pk *v) {
  if (!v) return false;
  for (size_t i = 0; i < dict->u.dict.len; i++) {
    const char *k = zck_pk_as_str(dict->u.dict.keys[i]);
    if (k && !strcmp(k, key)) {
      dict->u.dict.values[i] = v;
      return true;
    }
  }
  return zck_pk_dict_set(d, dict, zck_pk_new_str(d, key), v);
}

static zck_pk *get_key(const zck_pk *dict, const char *key) { return (zck_pk *)zck_pk_dict_get(dict, key); }

/* The two entries of universal_checkpoint_info, set in root (the copied tree). */
static zck_status set_info(zck_pk_doc *d, zck_pk *root, int stage, const char *path) {
  zck_pk *layers = get_key(root, "ds_autoep_layers");
  if (!layers || layers->kind == ZCK_PK_NONE) layers = get_key(root, "autoep_layers");   /* the older name */
  if (!layers || layers->kind != ZCK_PK_LIST)   /* ds_autoep.c read it: not reached for a file it accepted */
    return zck__fail(ZCK_ERR_FORMAT, "%s: no ds_autoep_layers list", path);
  zck_pk *uci = get_key(root, "universal_checkpoint_info");
  if (uci && uci->kind != ZCK_PK_DICT)
    return zck__fail(ZCK_ERR_FORMAT, "%s: universal_checkpoint_info is not a dict", path);
  if (!uci && (!(uci = zck_pk_new_dict(d, 0)) || !set_key(d, root, "universal_checkpoint_info", uci)))
    return ZCK_ERR_NO_MEMORY;
  zck_pk *pat = zck_pk_new_list(d);
  if (!pat || !zck_pk_append(d, pat, zck_pk_new_str(d, stage == 3 ? ".*\\.experts\\.w[123]$" : "\\.experts\\.w[123]$")) ||
      !set_key(d, uci, "expert_parameter_patterns", pat))
    return ZCK_ERR_NO_MEMORY;
  if (stage == 3) return set_key(d, uci, "ds_autoep_layers", layers) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  static const char *fields[] = {"moe_layer_id", "module_path", "expert_key_prefix", "num_experts",
                                 "num_local_experts", "ep_size"};
  zck_pk *light = zck_pk_new_list(d);
  if (!light) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < layers->u.seq.len; i++) {
    const zck_pk *e = layers->u.seq.items[i];
    zck_pk *l = zck_pk_new_dict(d, 0);
    if (!l || !zck_pk_append(d, light, l)) return ZCK_ERR_NO_MEMORY;
    for (size_t f = 0; f < sizeof fields / sizeof *fields; f++) {
      zck_pk *v = get_key(e, fields[f]);
      if (v && !zck_pk_dict_set(d, l, zck_pk_new_str(d, fields[f]), v)) return ZCK_ERR_NO_MEMORY;
    }
  }
  return set_key(d, uci, "ds_autoep_layers", light) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
}

static zck_status one_model(const zck_ds_ckpt *ck, size_t i, zck_uv_writer *w, const zck_universal_opts *o,
                            zck__uvj_progress *prog) {
  zck_ds_file f = zck_ds_model_file(ck, i);
  const zck_torch_file *held = i == 0 ? zck_ds_rank0_model(ck) : NULL;   /* rank 0's pickle: not parsed again */
  zck_torch_file *tf = NULL;
  if (!held) ZCK_TRY(zck_torch_open(f.path, NULL, &tf));
  const zck_torch_file *src = held ? held : tf;
  zck__uvj_opt os = {0};
  zck_pk *root = NULL;
  zck_exec_job job;
  zck_status st = (os.h = zck__shash_new()) ? ZCK_OK : ZCK_ERR_NO_MEMORY;
  os.budget = zck_uv_writer_hash_budget(w);
  if (st == ZCK_OK) st = zck_uv_writer_torch_hashed(w, f.name, os.h, &os.tw);
  if (st == ZCK_OK) st = zck_uv_copy_tree(os.tw, src, zck_torch_source(src), zck_torch_root(src), &root, &os.copies);
  if (st == ZCK_OK && (!root || root->kind != ZCK_PK_DICT))
    st = zck__fail(ZCK_ERR_FORMAT, "%s: the model states are not a dict", f.path);
  if (st == ZCK_OK) st = set_info(zck_torch_writer_doc(os.tw), root, zck_ds_info_of(ck)->stage, f.path);
  os.root = root;
  if (st == ZCK_OK) st = zck__uvj_opt_job(&os, &job);
  if (st == ZCK_OK) {
    zck_exec_opts eo = zck__uvj_exec_opts(o, prog);
    st = zck_exec_run(&job, 1, &eo);
    zck__uvj_progress_advance(prog, os.bytes);
  }
  if (st == ZCK_OK) st = zck__uvj_opt_finish(&os);
  if (st == ZCK_OK) st = zck_uv_writer_keep_hashed(w, f.name, os.h);
  zck__uvj_opt_free(&os);
  zck_torch_close(tf);
  return st;
}

zck_status zck__uvj_autoep_models(const zck_ds_ckpt *ck, zck_uv_writer *w, const zck_universal_opts *o,
                                  zck__uvj_progress *prog) {
  for (size_t i = 0; i < zck_ds_model_file_count(ck); i++) ZCK_TRY(one_model(ck, i, w, o, prog));
  return ZCK_OK;
}
