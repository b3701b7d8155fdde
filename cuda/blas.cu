// blas.cu: the matrix products of GPT-2 through cuBLAS, in the engine's row-major
// conventions (HF Conv1D weights [in, out], the tied lm_head [V, C]).
//
// cuBLAS is column-major; a row-major (r, c) matrix is the column-major (c, r) transpose,
// so row-major C = op(A) op(B) is computed as column-major C^T = op(B)^T op(A)^T: swap the
// operands, keep each one's transpose flag. Accumulation is fp32 (CUBLAS_COMPUTE_32F,
// pedantic about TF32: the context's math mode is CUBLAS_DEFAULT_MATH).
#include "common.cuh"

static const char *zck__blas_err(cublasStatus_t b) { return cublasGetStatusString(b); }

extern "C" zck_status zck_cuda_gemm(zck_cuda_ctx *ctx, int trans_a, int trans_b, int m, int n, int k, float alpha,
                                    const void *A, int lda, const void *B, int ldb, zck_dtype ab_dtype, float beta,
                                    float *C, int ldc) {
  ZCK_FAIL_IF(ab_dtype != ZCK_F32 && ab_dtype != ZCK_BF16, ZCK_ERR_INVALID_ARG,
              "cuda gemm: inputs of %s; supported: float32, bfloat16", zck_dtype_name(ab_dtype));
  ZCK_FAIL_IF(m < 0 || n < 0 || k < 0, ZCK_ERR_INVALID_ARG, "cuda gemm: negative size (%d, %d, %d)", m, n, k);
  if (!m || !n) return ZCK_OK;
  cudaDataType_t t = ab_dtype == ZCK_F32 ? CUDA_R_32F : CUDA_R_16BF;
  cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  cublasStatus_t b = cublasGemmEx(ctx->blas, op_b, op_a, n, m, k, &alpha, B, t, ldb, A, t, lda, &beta, C, CUDA_R_32F,
                                  ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  ZCK_FAIL_IF(b != CUBLAS_STATUS_SUCCESS, ZCK_ERR_INTERNAL, "cublas: gemm (%d x %d x %d, %s): %s", m, n, k,
              zck_dtype_name(ab_dtype), zck__blas_err(b));
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_conv1d_forward(zck_cuda_ctx *ctx, float *out, const float *inp, const float *w,
                                              const float *b, int BT, int IC, int OC) {
  /* out (BT, OC) = inp (BT, IC) @ w (IC, OC), then + b */
  ZCK_TRY(zck_cuda_gemm(ctx, 0, 0, BT, OC, IC, 1.0f, inp, IC, w, OC, ZCK_F32, 0.0f, out, OC));
  if (b) ZCK_TRY(zck__bias_add(out, b, BT, OC, ctx->stream));
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_conv1d_backward(zck_cuda_ctx *ctx, float *dinp, float *dw, float *db,
                                               const float *dout, const float *inp, const float *w, int BT, int IC,
                                               int OC) {
  /* dinp (BT, IC) += dout (BT, OC) @ w^T; dw (IC, OC) += inp^T @ dout */
  ZCK_TRY(zck_cuda_gemm(ctx, 0, 1, BT, IC, OC, 1.0f, dout, OC, w, OC, ZCK_F32, 1.0f, dinp, IC));
  ZCK_TRY(zck_cuda_gemm(ctx, 1, 0, IC, OC, BT, 1.0f, inp, IC, dout, OC, ZCK_F32, 1.0f, dw, OC));
  if (db) ZCK_TRY(zck__colsum_add(db, dout, BT, OC, ctx->stream));
  return ZCK_OK;
}

extern "C" zck_status zck_cuda_lm_head_forward(zck_cuda_ctx *ctx, float *logits, const float *inp, const float *wte,
                                               int BT, int C, int V) {
  /* logits (BT, V) = inp (BT, C) @ wte (V, C)^T */
  return zck_cuda_gemm(ctx, 0, 1, BT, V, C, 1.0f, inp, C, wte, C, ZCK_F32, 0.0f, logits, V);
}

extern "C" zck_status zck_cuda_lm_head_backward(zck_cuda_ctx *ctx, float *dinp, float *dwte, const float *dlogits,
                                                const float *inp, const float *wte, int BT, int C, int V) {
  /* dinp (BT, C) += dlogits (BT, V) @ wte (V, C); dwte (V, C) += dlogits^T @ inp */
  ZCK_TRY(zck_cuda_gemm(ctx, 0, 0, BT, C, V, 1.0f, dlogits, V, wte, C, ZCK_F32, 1.0f, dinp, C));
  ZCK_TRY(zck_cuda_gemm(ctx, 1, 0, V, C, BT, 1.0f, dlogits, V, inp, C, ZCK_F32, 1.0f, dwte, C));
  return ZCK_OK;
}
