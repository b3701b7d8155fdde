/* gpt2_layout.h: GPT-2's flat buffers, described once for the CPU engine
 * (samples/engine/gpt2.c) and the device code (gpt2.cu).
 *
 * Parameters lie in one float buffer in the order of GPT2LMHeadModel.parameters()
 * (transformer.wte.weight, transformer.wpe.weight, transformer.h.0.ln_1.weight, ...,
 * transformer.ln_f.bias), so a parameter is an offset range of it (a ZeRO shard too);
 * lm_head.weight is tied to wte and has no storage. Linear layers are HF Conv1D: weight
 * [in, out]. The activations of a (B, T) batch lie in a second buffer, their gradients in a
 * third of the same layout.
 *
 * A block's parameters and activations are each one table below (an X-macro); the structs
 * of pointers and the walks that carve a buffer into them are made from the tables, so the
 * two engines cannot lay a buffer out differently. Plain C, in every build (zckpt_cuda).
 */
#ifndef ZCK_GPT2_LAYOUT_H
#define ZCK_GPT2_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ZCK_GPT2_MAX_LAYERS 64
#define ZCK_GPT2_BLOCK_TENSORS 12

typedef struct zck_gpt2_config {
  int vocab_size;   /* V: byte-level, 256 */
  int max_seq_len;  /* T: n_positions */
  int n_layer;      /* L */
  int n_head;       /* H */
  int n_embd;       /* C, a multiple of H */
} zck_gpt2_config;

/* A block's parameters in buffer order: X(field, name after "transformer.h.<l>.", ndim,
 * shape[0], shape[1], decay), shapes in C (n_embd); decay: the HF Trainer's decay group
 * (not a bias, not a LayerNorm). */
#define ZCK_GPT2_BLOCK_PARAMS(X)                                  \
  X(ln_1_w, "ln_1.weight", 1, C, 0, false)                        \
  X(ln_1_b, "ln_1.bias", 1, C, 0, false)                          \
  X(attn_w, "attn.c_attn.weight", 2, C, 3 * C, true)              \
  X(attn_b, "attn.c_attn.bias", 1, 3 * C, 0, false)               \
  X(attn_proj_w, "attn.c_proj.weight", 2, C, C, true)             \
  X(attn_proj_b, "attn.c_proj.bias", 1, C, 0, false)              \
  X(ln_2_w, "ln_2.weight", 1, C, 0, false)                        \
  X(ln_2_b, "ln_2.bias", 1, C, 0, false)                          \
  X(fc_w, "mlp.c_fc.weight", 2, C, 4 * C, true)                   \
  X(fc_b, "mlp.c_fc.bias", 1, 4 * C, 0, false)                    \
  X(fc_proj_w, "mlp.c_proj.weight", 2, 4 * C, C, true)            \
  X(fc_proj_b, "mlp.c_proj.bias", 1, C, 0, false)

/* A block's activations in buffer order: X(field, floats) in B, T, BT = B*T, C, H. */
#define ZCK_GPT2_BLOCK_ACTS(X)                                    \
  X(ln_1, BT * C)                                                 \
  X(ln_1_mean, BT)                                                \
  X(ln_1_rstd, BT)                                                \
  X(qkv, BT * 3 * C)                                              \
  X(att, (size_t)B * H * T * T) /* softmax probabilities */       \
  X(atty, BT * C)                                                 \
  X(attproj, BT * C)                                              \
  X(res2, BT * C)                                                 \
  X(ln_2, BT * C)                                                 \
  X(ln_2_mean, BT)                                                \
  X(ln_2_rstd, BT)                                                \
  X(fch, BT * 4 * C)                                              \
  X(fch_gelu, BT * 4 * C)                                         \
  X(fcproj, BT * C)                                               \
  X(res3, BT * C)
/* The model's activations: encoded before the blocks, these after them (V: vocab_size);
 * a gradient buffer's logits slot holds dlogits. */
#define ZCK_GPT2_FINAL_ACTS(X)                                    \
  X(ln_f, BT * C)                                                 \
  X(ln_f_mean, BT)                                                \
  X(ln_f_rstd, BT)                                                \
  X(logits, BT * V)                                               \
  X(probs, BT * V)                                                \
  X(losses, BT)

#define ZCK_GPT2_POINTER_(field, ...) float *field;
typedef struct zck_gpt2_block_params {
  ZCK_GPT2_BLOCK_PARAMS(ZCK_GPT2_POINTER_)
} zck_gpt2_block_params;
typedef struct zck_gpt2_params {
  float *wte;                  /* (V, C), also lm_head.weight */
  float *wpe;                  /* (T, C) */
  zck_gpt2_block_params h[ZCK_GPT2_MAX_LAYERS];
  float *ln_f_w, *ln_f_b;      /* (C) */
} zck_gpt2_params;
typedef struct zck_gpt2_block_acts {
  ZCK_GPT2_BLOCK_ACTS(ZCK_GPT2_POINTER_)
} zck_gpt2_block_acts;
typedef struct zck_gpt2_acts {
  float *encoded;              /* (B, T, C) */
  zck_gpt2_block_acts h[ZCK_GPT2_MAX_LAYERS];
  ZCK_GPT2_FINAL_ACTS(ZCK_GPT2_POINTER_)
} zck_gpt2_acts;

/* One parameter of the table, in parameters() order. */
typedef struct zck_gpt2_spec {
  char name[64];               /* HF name */
  int ndim;
  int64_t shape[2];
  size_t numel;
  size_t offset;               /* element offset in the flat buffer */
  bool decay;                  /* HF Trainer's decay group (not a bias, not a LayerNorm) */
  int layer;                   /* block index, -1 for embeddings, -2 for ln_f */
} zck_gpt2_spec;

/* Checks the configuration (the walks hold at most ZCK_GPT2_MAX_LAYERS blocks); writes a
 * one-line reason into why. */
bool zck_gpt2_config_valid(const zck_gpt2_config *c, char *why, size_t cap);
/* Number of parameter tensors (lm_head excluded). */
size_t zck_gpt2_n_tensors(const zck_gpt2_config *c);
/* Walks the parameter table: returns the floats of the buffer, fills specs[0 .. n_tensors)
 * (may be NULL) and points p's fields into flat (p may be NULL). */
size_t zck_gpt2_params_walk(const zck_gpt2_config *c, zck_gpt2_spec *specs, float *flat, zck_gpt2_params *p);
/* Walks the activation table of a (B, T) batch: returns the floats of the buffer and points
 * a's fields into mem (a may be NULL). */
size_t zck_gpt2_acts_walk(const zck_gpt2_config *c, int B, int T, float *mem, zck_gpt2_acts *a);

/* Modules for module-at-a-time execution (ZeRO-3): -1 = embeddings (wte, wpe), 0..L-1 =
 * blocks, L = final (ln_f.weight, ln_f.bias, then wte again for the tied lm_head). */
/* Spec indices of a module's tensors in buffer order (up to 12); returns the count. */
int zck_gpt2_module_tensors(const zck_gpt2_config *c, int module, int *spec_index);
/* The field of p that holds tensor `spec` (a spec index). */
float **zck_gpt2_param_slot(const zck_gpt2_config *c, zck_gpt2_params *p, int spec);
/* Points the fields of p that `module` uses at t[i], its tensors in module_tensors' order. */
void zck_gpt2_point_module(const zck_gpt2_config *c, int module, float *const *t, zck_gpt2_params *p);

#ifdef __cplusplus
}
#endif
#endif
