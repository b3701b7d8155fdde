/* hf.h: what transformers needs to load the engine's model: config.json (GPT2Config) and
 * model.safetensors (GPT2LMHeadModel state dict, lm_head.weight left out as save_pretrained
 * does for tied weights), plus a probe file for interop tests (inputs, logits, loss). */
#ifndef ZE_HF_H
#define ZE_HF_H

#include "gpt2.h"
#include "zck.h"

/* GPT2Config as save_pretrained writes it (dropouts 0, gelu_new, tied embeddings; bos/eos
 * are '\n' in the byte vocabulary). dtype: the 16-bit training dtype ("bfloat16"/"float32"). */
zck_status ze_hf_write_config(const char *path, const ze_gpt2_config *c, zck_dtype dtype);
/* The same text, malloc'd (NULL: out of memory): for a writer that hashes what it writes. */
char *ze_hf_config_json(const ze_gpt2_config *c, zck_dtype dtype);
/* Gives the fp32 values of tensor `index` (spec->numel floats into dst). */
typedef zck_status (*ze_hf_reader)(void *ctx, size_t index, const ze_param_spec *spec, float *dst);
/* The reader of a whole fp32 buffer in parameter order (ctx: const float *). */
zck_status ze_hf_read_buffer(void *ctx, size_t index, const ze_param_spec *spec, float *dst);
/* The weights, read tensor by tensor, as `dtype` tensors (RNE) in one file. */
zck_status ze_hf_write_weights(const char *path, const ze_gpt2_config *c, ze_hf_reader read, void *ctx,
                               zck_dtype dtype);
/* probe.safetensors: input_ids I64 [1, T], labels I64 [1, T], logits F32 [1, T, V];
 * metadata "loss" = the engine's mean loss, printed with %.9g. */
zck_status ze_hf_write_probe(const char *path, const ze_gpt2_config *c, const int *inputs, const int *labels, int T,
                             const float *logits, float loss);

#endif
