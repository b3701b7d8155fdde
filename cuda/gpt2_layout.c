/* gpt2_layout.c: the GPT-2 flat parameter table as the device code sees it, and the
 * tensors of each module for module-at-a-time execution.
 *
 * The same walk as ze_gpt2_carve in samples/engine/gpt2.c (GPT2LMHeadModel.parameters()
 * order), repeated here because cuda/ must not depend on the engine; tests/gpu checks the
 * two against each other. Plain C, in every build.
 */
#include "zck_cuda.h"

size_t zck_cuda_gpt2_offsets(const zck_cuda_gpt2_config *c, size_t *offsets) {
  size_t V = (size_t)c->vocab_size, T = (size_t)c->max_seq_len, C = (size_t)c->n_embd;
  size_t n = 0, off = 0;
#define ZG_ADD(numel_)               \
  do {                               \
    if (offsets) offsets[n] = off;   \
    n++;                             \
    off += (numel_);                 \
  } while (0)
  ZG_ADD(V * C); /* wte */
  ZG_ADD(T * C); /* wpe */
  for (int l = 0; l < c->n_layer; l++) {
    ZG_ADD(C);          /* ln_1.weight */
    ZG_ADD(C);          /* ln_1.bias */
    ZG_ADD(C * 3 * C);  /* attn.c_attn.weight */
    ZG_ADD(3 * C);      /* attn.c_attn.bias */
    ZG_ADD(C * C);      /* attn.c_proj.weight */
    ZG_ADD(C);          /* attn.c_proj.bias */
    ZG_ADD(C);          /* ln_2.weight */
    ZG_ADD(C);          /* ln_2.bias */
    ZG_ADD(C * 4 * C);  /* mlp.c_fc.weight */
    ZG_ADD(4 * C);      /* mlp.c_fc.bias */
    ZG_ADD(4 * C * C);  /* mlp.c_proj.weight */
    ZG_ADD(C);          /* mlp.c_proj.bias */
  }
  ZG_ADD(C); /* ln_f.weight */
  ZG_ADD(C); /* ln_f.bias */
  if (offsets) offsets[n] = off; /* one past the end: the total */
#undef ZG_ADD
  return n;
}

size_t zck_cuda_gpt2_numel(const zck_cuda_gpt2_config *c) {
  size_t V = (size_t)c->vocab_size, T = (size_t)c->max_seq_len, C = (size_t)c->n_embd;
  return V * C + T * C + (size_t)c->n_layer * (12 * C * C + 13 * C) + 2 * C;
}

int zck_cuda_gpt2_module_tensors(const zck_cuda_gpt2_config *c, int module, int *spec_index) {
  int n = 2 + 12 * c->n_layer + 2;
  if (module == -1) {
    spec_index[0] = 0; /* wte */
    spec_index[1] = 1; /* wpe */
    return 2;
  }
  if (module == c->n_layer) {
    spec_index[0] = n - 2; /* ln_f.weight */
    spec_index[1] = n - 1; /* ln_f.bias */
    spec_index[2] = 0;     /* wte, for the tied lm_head */
    return 3;
  }
  for (int i = 0; i < 12; i++) spec_index[i] = 2 + 12 * module + i;
  return 12;
}
