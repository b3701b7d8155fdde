/* reshard_check.c: requests a reshard cannot honour, refused with one line before anything
 * is written: a source with no optimizer state, a ds_version DeepSpeed cannot parse.
 *
 * The group layouts a DeepSpeed target cannot express, found by what the writer and
 * DeepSpeed's loaders need:
 *   - a param group with no trainable parameter: DeepSpeed drops such groups when it
 *     builds its flat groups, so the saved param_groups would not line up with the
 *     optimizer's (and stage 1/2 index base_optimizer_state by flat group);
 *   - a trainable parameter in no group: it would have no place in any flat group;
 *   - a group without a plain 'lr' (absent, or a tensor / object the manifest cannot
 *     carry): torch's optimizer.load_state_dict takes the saved groups as they are and
 *     the first step reads group['lr'];
 *   - (found by the readers) a parameter in two groups, and universal param_groups that
 *     do not cover every flat group / sub-group. */
#include "reshard_internal.h"

#include <string.h>

/* What packaging.version accepts at its start: N(.N)*, as DeepSpeed's stage 1/2 loaders
 * parse ds_version. */
static bool zck__version_parseable(const char *v) {
  if (!v || !(*v >= '0' && *v <= '9')) return false;
  for (const char *p = v; *p; p++) {
    if (*p >= '0' && *p <= '9') continue;
    if (*p == '.' && p[1] >= '0' && p[1] <= '9') continue;
    return *p == '+' || *p == 'r' || *p == 'a' || *p == 'b' || *p == 'd' || *p == 'p'; /* local / pre / dev / post */
  }
  return true;
}

zck_status zck__reshard_check(const char *src, const zck_model *m, const zck_ds_write_opts *wo, bool has_optimizer_state,
                              const zck_reshard_opts *o) {
  if (!has_optimizer_state)
    return zck__fail(ZCK_ERR_NOT_FOUND, "%s: no optimizer state (exp_avg / exp_avg_sq): saved before the first optimizer "
                     "step, or removed; a resharded checkpoint must carry it", src);
  if (o->sub_group_size && wo->stage != 3)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--sub-group-size %llu: only a ZeRO-3 target has sub-groups (the target is "
                     "ZeRO-%d)", (unsigned long long)o->sub_group_size, wo->stage);
  if (o->sub_group_size >= 1000000000000000000ull)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--sub-group-size %llu: at most 1e18 elements (a larger value in ds_config "
                     "is not taken back by readers)", (unsigned long long)o->sub_group_size);
  for (size_t g = 0; g < m->n_groups; g++) {
    if (!zck_model_group_trainable(m, (uint32_t)g, NULL, 0))
      return zck__fail(ZCK_ERR_FORMAT, "%s: param group %zu has no trainable parameter: DeepSpeed drops empty groups, so "
                       "the saved param_groups would not match its optimizer", src, g);
    const zck_hparam *lr = zck_model_group_get(m, (uint32_t)g, "lr");
    if (!lr || (lr->kind != ZCK_HP_FLOAT && lr->kind != ZCK_HP_INT))
      return zck__fail(ZCK_ERR_FORMAT, "%s: param group %zu has no plain 'lr' hyper-parameter (%s): the optimizer "
                       "restored from it could not step", src, g, lr ? "not a number" : "missing");
  }
  for (size_t p = 0; p < m->n_params; p++) {
    const zck_param *pa = &m->params[p];
    if (pa->tied_to < 0 && !pa->frozen && pa->group < 0 && pa->numel > 0)
      return zck__fail(ZCK_ERR_FORMAT, "%s: trainable parameter '%s' is in no param group", src, pa->name);
  }
  if (wo->stage <= 2 && wo->ds_version && !zck__version_parseable(wo->ds_version))
    return zck__fail(ZCK_ERR_FORMAT, "%s: ds_version '%s' is not a version DeepSpeed can parse; its ZeRO-%d loader "
                     "would fail on the resharded checkpoint", src, wo->ds_version, wo->stage);
  return ZCK_OK;
}
