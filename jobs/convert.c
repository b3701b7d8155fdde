/* convert.c: `zckpt convert`: a state dict between torch and safetensors files. */
#include <string.h>

#include "tensor_set.h"

static bool zck__has_suffix(const char *s, const char *suffix) {
  size_t n = strlen(s), m = strlen(suffix);
  return n >= m && !strcmp(s + n - m, suffix);
}

zck_output_format zck__output_format_of(const char *out) {
  if (zck__has_suffix(out, ".safetensors")) return ZCK_OUT_SAFETENSORS;
  if (zck__has_suffix(out, ".pt") || zck__has_suffix(out, ".bin") || zck__has_suffix(out, ".pth")) return ZCK_OUT_TORCH;
  return ZCK_OUT_HF_DIR;
}

zck_status zck_convert_file(const char *in, const char *out, const zck_convert_opts *opts) {
  zck_convert_opts o = ZCK_CONVERT_OPTS_INIT;
  ZCK_TRY(zck__opts_load(&o, sizeof o, opts, "zck_convert_file"));
  if (o.dtype != ZCK_DTYPE_INVALID && o.dtype != ZCK_F32 && o.dtype != ZCK_BF16 && o.dtype != ZCK_F16 && o.dtype != ZCK_F64)
    return zck__fail(ZCK_ERR_INVALID_ARG, "--dtype must be fp32, bf16, fp16 or fp64");
  ZCK_TRY(zck_check_out_not_input(in, out, NULL));
  zck__tensor_set s;
  zck__set_init(&s);
  zck_status st = zck__set_from_path(&s, in);
  if (st == ZCK_OK && o.dtype != ZCK_DTYPE_INVALID) {
    /* Like torch's .to(dtype) on a state dict of floats: integer and bool tensors
     * (position ids, counters, masks) keep their type. */
    for (size_t i = 0; i < s.n; i++) {
      zck_dtype d = s.v[i].dtype;
      if (d == ZCK_F32 || d == ZCK_F16 || d == ZCK_BF16 || d == ZCK_F64) s.v[i].out_dtype = o.dtype;
    }
  }
  zck__write_opts wo = {.threads = o.threads, .max_shard_size = o.max_shard_size, .overwrite = o.overwrite != 0,
                        .progress = o.progress, .progress_ctx = o.progress_ctx, .no_verify = o.no_verify != 0};
  zck_output_format fmt = o.format ? o.format : zck__output_format_of(out);
  zck__set_target *t = NULL;
  if (st == ZCK_OK)
    st = zck__set_reserve(&s, fmt == ZCK_OUT_SAFETENSORS ? ZCK__SET_OUT_ST_FILE
                              : fmt == ZCK_OUT_TORCH     ? ZCK__SET_OUT_TORCH_FILE
                                                         : ZCK__SET_OUT_ST_DIR, out, &wo, &t);
  for (size_t i = 0; st == ZCK_OK && i < zck__set_target_passes(t); i++) st = zck__set_copy(&s, zck__set_target_pass(t, i), &wo);
  if (st == ZCK_OK) st = zck__set_target_commit(t);
  zck__set_target_free(t);
  /* once the output is in place: a failed job says one line, the failure */
  for (size_t i = 0; st == ZCK_OK && o.warning && i < s.n_warnings; i++) o.warning(o.warning_ctx, s.warnings[i]);
  if (st == ZCK_OK) {
    uint64_t stored = 0; /* torch.save keeps every name; safetensors stores a tied alias once */
    for (size_t i = 0; i < s.n; i++) stored += fmt == ZCK_OUT_TORCH || s.v[i].alias_of < 0;
    zck__job_summary_fill(o.summary, out, stored);
  }
  zck__set_free(&s);
  return st;
}
