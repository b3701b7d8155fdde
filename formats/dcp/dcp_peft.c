/* dcp_peft.c: the adapter-only save of a PEFT model. The HF Trainer saves a PEFT model under
 * FSDP through Accelerate's save_fsdp_model(adapter_only=True): the model folder holds
 * get_peft_model_state_dict, the adapter weights alone under PEFT's checkpoint keys, which
 * drop the adapter name (peft's _remove_adapter_name_from_state_dict_key: the last segment
 * when the key ends in it, else the one before the last: "...lora_A.default.weight" ->
 * "...lora_A.weight"), while the optimizer folder keys its state and param groups by the
 * module's names, adapter name included. The params keep the model folder's keys (what
 * dcp_to_torch_save gives); each module name maps to its param here, and a DeepSpeed target
 * takes the module names back (zck_dcp_param_module_name), as a PEFT engine saves them. */
#include "dcp_internal.h"

#include "error.h"
#include "util.h"

#include <stdlib.h>
#include <string.h>

/* fqn without the segment at `at` (its '.' before it) into out (cap bytes), or false. */
static bool without_segment(const char *fqn, const char *at, const char *end, char *out, size_t cap) {
  size_t head = (size_t)(at - fqn), tail = strlen(end);
  if (head + tail + 1 > cap) return false;
  memcpy(out, fqn, head);
  memcpy(out + head, end, tail + 1);
  return true;
}

/* The param fqn names without adapter a ("" while unknown: any), or -1; *found: the adapter
 * name it dropped (points into fqn, len *found_len). */
static int64_t find_without_adapter(const zck_model *m, const char *fqn, const char *a, const char **found,
                                    size_t *found_len) {
  char key[4096];
  const char *last = strrchr(fqn, '.');
  if (!last || last == fqn) return -1;
  const char *prev = last - 1;
  while (prev > fqn && *prev != '.') prev--;
  /* the last segment (an nn.Parameter of the adapter), then the one before it */
  const char *segs[2][2] = {{last, last + strlen(last)}, {*prev == '.' ? prev : NULL, last}};
  for (int i = 0; i < 2; i++) {
    const char *s = segs[i][0], *e = segs[i][1];
    if (!s) continue;
    size_t len = (size_t)(e - s - 1);
    if (*a && (strlen(a) != len || strncmp(s + 1, a, len))) continue;
    if (!without_segment(fqn, s, e, key, sizeof key)) continue;
    int64_t p = zck_model_find_param(m, key);
    if (p >= 0) {
      *found = s + 1;
      *found_len = len;
      return p;
    }
  }
  return -1;
}

int64_t zck__dcp_find_weight(zck_dcp *c, const char *fqn) {
  int64_t p = zck_model_find_param(c->model, fqn);
  if (p >= 0 || !fqn) return p;
  const char *found;
  size_t len;
  p = find_without_adapter(c->model, fqn, c->peft_adapter ? c->peft_adapter : "", &found, &len);
  if (p >= 0 && !c->peft_adapter && (c->peft_adapter = zck__malloc(len + 1))) { /* else found again next time */
    memcpy(c->peft_adapter, found, len);
    c->peft_adapter[len] = 0;
  }
  return p;
}

const char *zck_dcp_peft_adapter(const zck_dcp *c) { return c->peft_adapter; }

const char *zck_dcp_param_module_name(const zck_dcp *c, uint32_t p) {
  if (c->module_name && c->module_name[p]) return c->module_name[p];
  return c->model->params[p].name;
}

zck_status zck__dcp_note_module_names(zck_dcp *c) {
  if (!c->peft_adapter) return ZCK_OK;
  c->module_name = zck__calloc(c->model->n_params + 1, sizeof *c->module_name);
  if (!c->module_name) return ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < c->n_entries; i++) {
    const zck__dcp_entry *e = &c->entries[i];
    if (e->k.kind != ZCK_DCP_KEY_OPTIM_STATE || c->param_of_entry[i] == UINT32_MAX) continue;
    const char **slot = &c->module_name[c->param_of_entry[i]];
    if (*slot && strcmp(*slot, e->fqn))
      return zck__fail(ZCK_ERR_FORMAT, "%s/.metadata: %s and %s both name %s", c->optim_dir ? c->optim_dir : c->dir, *slot,
                       e->fqn, c->model->params[c->param_of_entry[i]].name);
    *slot = e->fqn;
  }
  return ZCK_OK;
}
