/* ds_aliases.c: the last step of the zero_to_fp32 output recipe, shared by the DeepSpeed
 * checkpoint and the universal folder: each shared_params entry (alias -> source) whose
 * source is among the outputs becomes one more output, the same tensor under the alias's
 * name. Names are looked up through hash tables: the entries come from the checkpoint,
 * and a scan of the outputs per entry made a file with 100k of them quadratic. */
#include "deepspeed.h"
#include "model.h"
#include "strmap.h"

zck_status zck_ds_outputs_add_aliases(zck_ds_output *out, size_t *n_io, const char *const *alias,
                                      const char *const *source, size_t n_shared, const zck_model *m) {
  size_t before = *n_io, n = before;
  zck__strmap sources = {0}, aliases = {0};
  zck_status s = zck__strmap_init(&sources, before);
  /* zero_to_fp32 builds a dict: the last output of a name is the one a lookup finds */
  for (size_t j = before; j-- > 0 && s == ZCK_OK;) {
    bool dup;
    s = zck__strmap_put(&sources, out[j].name, j, &dup, NULL);
  }
  for (size_t i = 0; i < n_shared && s == ZCK_OK; i++) {
    size_t src;
    if (!alias[i] || !source[i] || !zck__strmap_get(&sources, source[i], &src)) continue;
    /* an alias missing from module (warned) is still emitted, as zero_to_fp32 does */
    int64_t p = zck_model_find_param(m, alias[i]);
    /* a repeated alias key overwrites the earlier entry in the Python dict */
    bool dup;
    size_t prev = 0;
    s = zck__strmap_put(&aliases, alias[i], n, &dup, &prev);
    if (s != ZCK_OK) break;
    zck_ds_output *o = &out[dup ? prev : n++];
    *o = out[src];
    o->name = alias[i];
    o->kind = ZCK_DS_OUT_ALIAS;
    o->index = p >= 0 ? (uint32_t)p : UINT32_MAX;
    o->alias_of = (int32_t)src;
  }
  zck__strmap_free(&sources);
  zck__strmap_free(&aliases);
  *n_io = n;
  return s;
}
