/* gpt2_layout.c: the walks over GPT-2's layout tables (gpt2_layout.h), for the CPU engine
 * and the device code alike. Plain C, in every build. */
#include "gpt2_layout.h"

#include <stdio.h>

bool zck_gpt2_config_valid(const zck_gpt2_config *c, char *why, size_t cap) {
  const char *bad = NULL;
  if (c->vocab_size < 2 || c->vocab_size > (1 << 20)) bad = "vocab size must be in [2, 2^20]";
  else if (c->max_seq_len < 1 || c->max_seq_len > 65536) bad = "sequence length must be in [1, 65536]";
  else if (c->n_layer < 1 || c->n_layer > ZCK_GPT2_MAX_LAYERS) bad = "n_layer must be in [1, 64]";
  else if (c->n_head < 1 || c->n_embd < 1 || c->n_embd > 65536) bad = "n_head and n_embd must be positive";
  else if (c->n_embd % c->n_head) bad = "n_embd must be a multiple of n_head";
  if (bad && why) snprintf(why, cap, "%s", bad);
  return !bad;
}

size_t zck_gpt2_n_tensors(const zck_gpt2_config *c) { return 2 + ZCK_GPT2_BLOCK_TENSORS * (size_t)c->n_layer + 2; }

/* Appends one tensor to the walk: its spec (when specs), its pointer (when p). */
static void add_param(zck_gpt2_spec *specs, size_t *n, size_t *off, float *flat, float **slot, int layer, bool decay,
                      int ndim, size_t d0, size_t d1, const char *prefix, const char *name) {
  size_t numel = d0 * (ndim == 2 ? d1 : 1);
  if (specs) {
    zck_gpt2_spec *s = &specs[*n];
    snprintf(s->name, sizeof s->name, "%s%s", prefix, name);
    s->ndim = ndim;
    s->shape[0] = (int64_t)d0;
    s->shape[1] = ndim == 2 ? (int64_t)d1 : 0;
    s->numel = numel;
    s->offset = *off;
    s->decay = decay;
    s->layer = layer;
  }
  if (slot) *slot = flat + *off;
  (*n)++;
  *off += numel;
}

size_t zck_gpt2_params_walk(const zck_gpt2_config *c, zck_gpt2_spec *specs, float *flat, zck_gpt2_params *p) {
  size_t V = (size_t)c->vocab_size, T = (size_t)c->max_seq_len, C = (size_t)c->n_embd;
  size_t n = 0, off = 0;
  add_param(specs, &n, &off, flat, p ? &p->wte : NULL, -1, true, 2, V, C, "", "transformer.wte.weight");
  add_param(specs, &n, &off, flat, p ? &p->wpe : NULL, -1, true, 2, T, C, "", "transformer.wpe.weight");
  for (int l = 0; l < c->n_layer; l++) {
    zck_gpt2_block_params *b = p ? &p->h[l] : NULL;
    char prefix[32];
    snprintf(prefix, sizeof prefix, "transformer.h.%d.", l);
#define ZCK_GPT2_ADD_(field, name, ndim, d0, d1, decay) \
  add_param(specs, &n, &off, flat, b ? &b->field : NULL, l, decay, ndim, d0, d1, prefix, name);
    ZCK_GPT2_BLOCK_PARAMS(ZCK_GPT2_ADD_)
#undef ZCK_GPT2_ADD_
  }
  add_param(specs, &n, &off, flat, p ? &p->ln_f_w : NULL, -2, false, 1, C, 0, "", "transformer.ln_f.weight");
  add_param(specs, &n, &off, flat, p ? &p->ln_f_b : NULL, -2, false, 1, C, 0, "", "transformer.ln_f.bias");
  return off;
}

size_t zck_gpt2_acts_walk(const zck_gpt2_config *c, int B, int T, float *mem, zck_gpt2_acts *a) {
  size_t BT = (size_t)B * T, C = (size_t)c->n_embd, V = (size_t)c->vocab_size, H = (size_t)c->n_head;
  size_t off = 0;
#define ZCK_GPT2_ACT_(slot, count) \
  if (a) (slot) = mem + off;      \
  off += (count);
#define ZCK_GPT2_BLOCK_ACT_(field, count) ZCK_GPT2_ACT_(a->h[l].field, count)
#define ZCK_GPT2_FINAL_ACT_(field, count) ZCK_GPT2_ACT_(a->field, count)
  ZCK_GPT2_ACT_(a->encoded, BT * C)
  for (int l = 0; l < c->n_layer; l++) {
    ZCK_GPT2_BLOCK_ACTS(ZCK_GPT2_BLOCK_ACT_)
  }
  ZCK_GPT2_FINAL_ACTS(ZCK_GPT2_FINAL_ACT_)
#undef ZCK_GPT2_FINAL_ACT_
#undef ZCK_GPT2_BLOCK_ACT_
#undef ZCK_GPT2_ACT_
  return off;
}

int zck_gpt2_module_tensors(const zck_gpt2_config *c, int module, int *spec_index) {
  if (module == -1) {
    spec_index[0] = 0; /* wte */
    spec_index[1] = 1; /* wpe */
    return 2;
  }
  if (module == c->n_layer) {
    int n = (int)zck_gpt2_n_tensors(c);
    spec_index[0] = n - 2; /* ln_f.weight */
    spec_index[1] = n - 1; /* ln_f.bias */
    spec_index[2] = 0;     /* wte, for the tied lm_head */
    return 3;
  }
  for (int i = 0; i < ZCK_GPT2_BLOCK_TENSORS; i++) spec_index[i] = 2 + ZCK_GPT2_BLOCK_TENSORS * module + i;
  return ZCK_GPT2_BLOCK_TENSORS;
}

float **zck_gpt2_param_slot(const zck_gpt2_config *c, zck_gpt2_params *p, int spec) {
  int n = (int)zck_gpt2_n_tensors(c);
  if (spec == 0) return &p->wte;
  if (spec == 1) return &p->wpe;
  if (spec == n - 2) return &p->ln_f_w;
  if (spec == n - 1) return &p->ln_f_b;
  zck_gpt2_block_params *b = &p->h[(spec - 2) / ZCK_GPT2_BLOCK_TENSORS];
#define ZCK_GPT2_SLOT_(field, ...) &b->field,
  float **slots[ZCK_GPT2_BLOCK_TENSORS] = {ZCK_GPT2_BLOCK_PARAMS(ZCK_GPT2_SLOT_)};
#undef ZCK_GPT2_SLOT_
  return slots[(spec - 2) % ZCK_GPT2_BLOCK_TENSORS];
}

void zck_gpt2_point_module(const zck_gpt2_config *c, int module, float *const *t, zck_gpt2_params *p) {
  int idx[ZCK_GPT2_BLOCK_TENSORS];
  int k = zck_gpt2_module_tensors(c, module, idx);
  for (int i = 0; i < k; i++) *zck_gpt2_param_slot(c, p, idx[i]) = t[i];
}
