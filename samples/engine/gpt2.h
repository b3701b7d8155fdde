/* gpt2.h: a GPT-2 decoder on the CPU in fp32, the llm.c way, with Hugging Face's names.
 *
 * Parameters live in one flat float buffer in the order of GPT2LMHeadModel.parameters()
 * (transformer.wte.weight, transformer.wpe.weight, transformer.h.0.ln_1.weight, ...,
 * transformer.ln_f.bias); ze_gpt2_carve() points the fields of ze_gpt2_params into it, so a
 * parameter is an offset range of the buffer. lm_head.weight is tied to wte and has no storage.
 * Linear layers are HF Conv1D: weight [in, out], y = x @ W + b. GELU is "gelu_new" (tanh).
 * Activation memory is a second flat buffer carved the same way (ze_gpt2_ws). Both layouts
 * are cuda/include/gpt2_layout.h's, the one description the device code uses too; the ze_ names
 * below are the engine's for them.
 *
 * Determinism: every loop has a fixed order and no threads, so the same inputs give the same
 * bits. The engine is built with -ffp-contract=off so that holds across optimisation levels.
 */
#ifndef ZE_GPT2_H
#define ZE_GPT2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpt2_layout.h"

#define ZE_MAX_LAYERS ZCK_GPT2_MAX_LAYERS
#define ZE_LN_EPS 1e-5f

typedef zck_gpt2_config ze_gpt2_config;
typedef zck_gpt2_block_params ze_block_params;
typedef zck_gpt2_params ze_gpt2_params;
typedef zck_gpt2_spec ze_param_spec;

/* Checks the configuration; writes a one-line reason into why. */
bool ze_gpt2_config_valid(const ze_gpt2_config *c, char *why, size_t cap);
/* Number of parameter tensors (lm_head excluded) and total elements. */
size_t ze_gpt2_n_tensors(const ze_gpt2_config *c);
size_t ze_gpt2_numel(const ze_gpt2_config *c);
/* Fills specs[0 .. ze_gpt2_n_tensors) (specs may be NULL). */
void ze_gpt2_param_specs(const ze_gpt2_config *c, ze_param_spec *specs);
/* Points p's fields into flat (ze_gpt2_numel floats). */
void ze_gpt2_carve(const ze_gpt2_config *c, float *flat, ze_gpt2_params *p);
/* GPT-2 initialisation of transformers (_init_weights): N(0, 0.02) for weights and
 * embeddings, N(0, 0.02/sqrt(2L)) for the c_proj weights, zero biases, LayerNorm 1/0;
 * drawn from a generator seeded with `seed`, in parameter order. */
void ze_gpt2_init(const ze_gpt2_config *c, float *flat, uint64_t seed);

/* ---- training workspace: activations and their gradients for a (B, T) batch */
typedef struct ze_gpt2_ws ze_gpt2_ws;
ze_gpt2_ws *ze_gpt2_ws_new(const ze_gpt2_config *c, int B, int T);
void ze_gpt2_ws_free(ze_gpt2_ws *ws);
/* Bytes held by the workspace. */
size_t ze_gpt2_ws_bytes(const ze_gpt2_ws *ws);
/* "OpenBLAS" or "loops": what runs the matmuls in this process (see gpt2.c). */
const char *ze_gpt2_matmul_backend(void);

/* Forward over inputs (B, T) (token ids < V). With targets (B, T), returns the mean
 * cross-entropy over the B*T positions; else returns 0 and only logits are valid.
 * B, T must not exceed those of the workspace. */
float ze_gpt2_forward(const ze_gpt2_config *c, const ze_gpt2_params *w, ze_gpt2_ws *ws, const int *inputs,
                      const int *targets, int B, int T);
/* Logits (B, T, V) of the last forward. */
const float *ze_gpt2_logits(const ze_gpt2_ws *ws);
/* Per-position losses (B, T) of the last forward. */
const float *ze_gpt2_losses(const ze_gpt2_ws *ws);
/* Backward of `scale` * mean loss of the last forward (which must have had targets):
 * gradients are ADDED into g (carved from a buffer the caller zeroes when it wants). */
void ze_gpt2_backward(const ze_gpt2_config *c, const ze_gpt2_params *w, const ze_gpt2_params *g, ze_gpt2_ws *ws,
                      const int *inputs, const int *targets, int B, int T, float scale);

/* ---- module-at-a-time execution (ZeRO-3 gathers a module's parameters just before it
 * runs and releases them after; its gradients are reduced as soon as they are complete).
 * Modules: -1 = embeddings (wte, wpe), 0..L-1 = blocks, L = final (ln_f, and wte again
 * for the tied lm_head). Forward visits -1, 0, ..., L; backward L, L-1, ..., 0 for
 * weights, and L, L-1, ..., 0, -1 for gradients (the embedding backward reads no weight).
 * The arithmetic is that of ze_gpt2_forward / ze_gpt2_backward, bit for bit. */
typedef struct ze_gpt2_hooks {
  void *ctx;
  /* fills the fields of w that `module` reads; false stops the pass (the hook keeps why) */
  bool (*fetch)(void *ctx, int module, ze_gpt2_params *w);
  /* the module's weights are no longer used (may be NULL) */
  void (*release)(void *ctx, int module);
  /* backward: fills the fields of g for the module's tensors; gradients are ADDED there */
  bool (*grads)(void *ctx, int module, ze_gpt2_params *g);
  /* backward of `module` finished: the gradients of the tensors whose last use it was
   * (wte: module -1) are final for this pass (may be NULL) */
  bool (*grads_done)(void *ctx, int module);
} ze_gpt2_hooks;

/* Returns false when a hook failed. *loss as ze_gpt2_forward returns it. */
bool ze_gpt2_forward_hooked(const ze_gpt2_config *c, const ze_gpt2_hooks *k, ze_gpt2_ws *ws, const int *inputs,
                            const int *targets, int B, int T, float *loss);
bool ze_gpt2_backward_hooked(const ze_gpt2_config *c, const ze_gpt2_hooks *k, ze_gpt2_ws *ws, const int *inputs,
                             const int *targets, int B, int T, float scale);
/* Hooks over whole-model parameter (and gradient) structs. */
typedef struct ze_gpt2_whole {
  const ze_gpt2_params *w, *g;
} ze_gpt2_whole;
ze_gpt2_hooks ze_gpt2_whole_hooks(ze_gpt2_whole *whole, const ze_gpt2_params *w, const ze_gpt2_params *g);

/* Modules for module-at-a-time execution: -1 = embeddings (wte, wpe), 0..L-1 = blocks,
 * L = final (ln_f.weight, ln_f.bias, then wte again for the tied lm_head). */
/* Elements of a module's tensors. */
size_t ze_gpt2_module_numel(const ze_gpt2_config *c, int module);
/* Spec indices of a module's tensors in buffer order (up to 12); returns the count. */
int ze_gpt2_module_tensors(const ze_gpt2_config *c, int module, int *spec_index);
/* The field of p that holds tensor `spec` (a spec index). */
float **ze_gpt2_param_slot(const ze_gpt2_config *c, ze_gpt2_params *p, int spec);
/* Points the fields `module` uses into buf, which holds its tensors in that order. */
void ze_gpt2_carve_module(const ze_gpt2_config *c, int module, float *buf, ze_gpt2_params *p);

/* ---- inference on one sequence, one module at a time (for ZeRO-3 generation).
 * The caller fetches a module's parameters before it runs and may release them after:
 * module -1 = embeddings (wte, wpe), 0..L-1 = blocks, L = final (ln_f, and wte for lm_head). */
typedef struct ze_fetch {
  void *ctx;
  /* fills the fields of p that `module` needs; returns false on failure */
  bool (*fetch)(void *ctx, int module, ze_gpt2_params *p);
  void (*release)(void *ctx, int module);
} ze_fetch;

/* Logits (V) of the last position of tokens[0..n) (n <= T of the workspace, B = 1). */
bool ze_gpt2_infer_last(const ze_gpt2_config *c, const ze_fetch *f, ze_gpt2_ws *ws, const int *tokens, int n,
                        float *logits);

#endif
