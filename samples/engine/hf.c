/* hf.c: config.json and safetensors files transformers loads (see hf.h). */
#include "hf.h"

#include "io.h"
#include "safetensors/safetensors.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ze_hf_config_json(const ze_gpt2_config *c, zck_dtype dtype) {
  zck__buf b;
  zck__buf_init(&b);
  zck__buf_printf(&b,
                  "{\n"
                  "  \"activation_function\": \"gelu_new\",\n"
                  "  \"architectures\": [\n    \"GPT2LMHeadModel\"\n  ],\n"
                  "  \"attn_pdrop\": 0.0,\n"
                  "  \"bos_token_id\": 10,\n"
                  "  \"dtype\": \"%s\",\n"
                  "  \"embd_pdrop\": 0.0,\n"
                  "  \"eos_token_id\": 10,\n"
                  "  \"initializer_range\": 0.02,\n"
                  "  \"layer_norm_epsilon\": 1e-05,\n"
                  "  \"model_type\": \"gpt2\",\n"
                  "  \"n_embd\": %d,\n"
                  "  \"n_head\": %d,\n"
                  "  \"n_inner\": null,\n"
                  "  \"n_layer\": %d,\n"
                  "  \"n_positions\": %d,\n"
                  "  \"reorder_and_upcast_attn\": false,\n"
                  "  \"resid_pdrop\": 0.0,\n"
                  "  \"scale_attn_by_inverse_layer_idx\": false,\n"
                  "  \"scale_attn_weights\": true,\n"
                  "  \"tie_word_embeddings\": true,\n"
                  "  \"use_cache\": true,\n"
                  "  \"vocab_size\": %d\n"
                  "}\n",
                  zck_dtype_name(dtype), c->n_embd, c->n_head, c->n_layer, c->max_seq_len, c->vocab_size);
  char *text = b.failed ? NULL : zck__strndup((const char *)b.data, b.len);
  zck__buf_free(&b);
  return text;
}

zck_status ze_hf_write_config(const char *path, const ze_gpt2_config *c, zck_dtype dtype) {
  char *text = ze_hf_config_json(c, dtype);
  if (!text) return zck__fail(ZCK_ERR_NO_MEMORY, "out of memory");
  zck__outfile f;
  zck_status s = zck__outfile_create(&f, path);
  if (s == ZCK_OK) s = zck__outfile_pwrite(&f, text, strlen(text), 0);
  if (s == ZCK_OK) s = zck__outfile_commit(&f);
  else zck__outfile_abort(&f);
  free(text);
  return s;
}

zck_status ze_hf_read_buffer(void *ctx, size_t index, const ze_param_spec *spec, float *dst) {
  (void)index;
  memcpy(dst, (const float *)ctx + spec->offset, spec->numel * sizeof *dst);
  return ZCK_OK;
}

zck_status ze_hf_write_weights(const char *path, const ze_gpt2_config *c, ze_hf_reader read, void *ctx,
                               zck_dtype dtype) {
  size_t n = ze_gpt2_n_tensors(c);
  ze_param_spec *specs = zck__calloc(n, sizeof *specs);
  zck_st_writer *w = NULL;
  void *tmp = NULL;
  zck_st_dtype sd;
  if (!specs) return ZCK_ERR_NO_MEMORY;
  ZCK_ASSERT(zck_st_dtype_from_zck(dtype, &sd));
  ze_gpt2_param_specs(c, specs);
  size_t es = zck_dtype_size(dtype), max = 0;
  zck_status s = zck_st_writer_new(&w);
  for (size_t i = 0; i < n && s == ZCK_OK; i++) {
    uint64_t shape[2] = {(uint64_t)specs[i].shape[0], (uint64_t)specs[i].shape[1]};
    s = zck_st_writer_add(w, specs[i].name, sd, specs[i].ndim, shape, NULL);
    if (specs[i].numel > max) max = specs[i].numel;
  }
  if (s == ZCK_OK) s = zck_st_writer_layout(w);
  if (s == ZCK_OK) s = zck_st_writer_open(w, path);
  tmp = zck__malloc(max * es + 1);
  float *vals = zck__malloc(max * sizeof(float) + 1);
  if ((!tmp || !vals) && s == ZCK_OK) s = ZCK_ERR_NO_MEMORY;
  for (size_t i = 0; i < n && s == ZCK_OK; i++) {
    s = read(ctx, i, &specs[i], vals);
    if (s == ZCK_OK) s = zck_convert(dtype, tmp, ZCK_F32, vals, specs[i].numel);
    if (s == ZCK_OK) s = zck_st_writer_write(w, i, tmp, 0, specs[i].numel * es);
  }
  if (s == ZCK_OK) s = zck_st_writer_commit(w);
  zck_st_writer_free(w);
  free(tmp);
  free(vals);
  free(specs);
  return s;
}

zck_status ze_hf_write_probe(const char *path, const ze_gpt2_config *c, const int *inputs, const int *labels, int T,
                             const float *logits, float loss) {
  zck_st_writer *w = NULL;
  int64_t *ids = zck__calloc(2 * (size_t)T, sizeof *ids);
  if (!ids) return ZCK_ERR_NO_MEMORY;
  for (int t = 0; t < T; t++) {
    ids[t] = inputs[t];
    ids[T + t] = labels[t];
  }
  char lbuf[32];
  snprintf(lbuf, sizeof lbuf, "%.9g", loss);
  uint64_t s1[2] = {1, (uint64_t)T}, s3[3] = {1, (uint64_t)T, (uint64_t)c->vocab_size};
  zck_status s = zck_st_writer_new(&w);
  if (s == ZCK_OK) s = zck_st_writer_set_metadata(w, "loss", lbuf);
  size_t ii = 0, il = 0, ig = 0;
  if (s == ZCK_OK) s = zck_st_writer_add(w, "input_ids", ZCK_ST_I64, 2, s1, &ii);
  if (s == ZCK_OK) s = zck_st_writer_add(w, "labels", ZCK_ST_I64, 2, s1, &il);
  if (s == ZCK_OK) s = zck_st_writer_add(w, "logits", ZCK_ST_F32, 3, s3, &ig);
  if (s == ZCK_OK) s = zck_st_writer_layout(w);
  if (s == ZCK_OK) s = zck_st_writer_open(w, path);
  if (s == ZCK_OK) s = zck_st_writer_write(w, ii, ids, 0, (uint64_t)T * 8);
  if (s == ZCK_OK) s = zck_st_writer_write(w, il, ids + T, 0, (uint64_t)T * 8);
  if (s == ZCK_OK) s = zck_st_writer_write(w, ig, logits, 0, (uint64_t)T * c->vocab_size * 4);
  if (s == ZCK_OK) s = zck_st_writer_commit(w);
  zck_st_writer_free(w);
  free(ids);
  return s;
}
