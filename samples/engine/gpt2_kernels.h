/* gpt2_kernels.h (internal): the CPU engine's GPT-2 kernels (gpt2.c), for the tests that
 * check other implementations against them (tests/gpu/test_gpu_kernels.c: the CUDA
 * kernels). Shapes as in gpt2.h: row-major, BT = B*T rows, HF Conv1D weights (in, out);
 * gradient kernels ADD into their outputs. */
#ifndef ZE_GPT2_KERNELS_H
#define ZE_GPT2_KERNELS_H

#include <stddef.h>

/* out (BT, C) = wte[inp] + wpe[t]; dwte / dwpe += dout rows in bt order. */
void ze__gpt2_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int bt_n, int t_n, int c_n);
void ze__gpt2_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int bt_n, int t_n, int c_n);
/* LayerNorm over C, eps 1e-5 (mean, rstd per row are outputs). */
void ze__gpt2_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b,
                                int bt_n, int c_n);
void ze__gpt2_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                                 const float *mean, const float *rstd, int bt_n, int c_n);
/* HF Conv1D: out (BT, OC) = inp (BT, IC) @ w (IC, OC) + b (b may be NULL). */
void ze__gpt2_conv1d_forward(float *out, const float *inp, const float *w, const float *b, int bt_n, int ic, int oc);
void ze__gpt2_conv1d_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                              int bt_n, int ic, int oc);
/* Tied lm_head: logits (BT, V) = inp (BT, C) @ wte (V, C)^T. */
void ze__gpt2_lm_head_forward(float *logits, const float *inp, const float *wte, int bt_n, int c_n, int v_n);
void ze__gpt2_lm_head_backward(float *dinp, float *dwte, const float *dlogits, const float *inp, const float *wte,
                               int bt_n, int c_n, int v_n);
/* Causal self-attention: qkv (B, T, 3C), att (B, H, T, T) probabilities, out (B, T, C);
 * the backward's datt is T floats of scratch. */
void ze__gpt2_attention_forward(float *out, float *att, const float *qkv, int b_n, int t_n, int c_n, int h_n);
void ze__gpt2_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, float *datt,
                                 int b_n, int t_n, int c_n, int h_n);
/* GELU, tanh approximation. */
void ze__gpt2_gelu_forward(float *out, const float *inp, size_t n);
void ze__gpt2_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);
void ze__gpt2_residual_forward(float *out, const float *a, const float *b, size_t n);
void ze__gpt2_residual_backward(float *da, float *db, const float *dout, size_t n);
/* probs = softmax(logits) per row of V; losses[bt] = -log probs[targets[bt]] (targets may be NULL). */
void ze__gpt2_softmax_xent_forward(float *probs, float *losses, const float *logits, const int *targets, int bt_n,
                                   int v_n);

#endif
