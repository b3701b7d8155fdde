/* zck_cuda.h: the plain C face of the device code in cuda/. It is the only header the rest
 * of zckpt includes for device work, so nothing outside cuda/ needs a CUDA header.
 *
 * Built without CUDA (ZCK_CUDA=OFF or no nvcc), every device call reports ZCK_ERR_NO_DEVICE
 * ("zck_cuda_malloc: zckpt was built without CUDA", naming the call); built with CUDA on a machine without a GPU, they report
 * ZCK_ERR_NO_DEVICE with the CUDA runtime's reason. The gather planner (zck_gather_*) and
 * GPT-2's layout (gpt2_layout.h) are plain C and work in every build.
 *
 * Conventions:
 *  - `d_` pointers are device memory; everything else is host memory.
 *  - `stream` is a cudaStream_t passed as void * (NULL: the legacy default stream). Kernel
 *    launches are asynchronous on their stream; a function that returns data to the host
 *    (a loss, a copy to pageable memory) synchronizes its stream first.
 *  - Shapes follow the CPU engine (samples/engine/gpt2.c): row-major, Hugging Face Conv1D
 *    weights [in, out], BT = B*T rows. Gradient kernels ADD into their outputs (+=) as the
 *    CPU engine does, except where noted (dlogits are written).
 *  - Determinism: no kernel uses atomics; reductions run in a fixed order, so the same
 *    inputs on the same GPU give the same bits. The order differs from the CPU's where
 *    noted, so GPU vs CPU agreement is to a tolerance there (tests/gpu states each one).
 */
#ifndef ZCK_CUDA_H
#define ZCK_CUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "comm.h"
#include "gpt2_layout.h"
#include "zck.h"

// ---- discovery

/* 1 if this build has CUDA code in it. */
int zck_cuda_built(void);
/* 1 if this build has NCCL in it. */
int zck_cuda_has_nccl(void);
/* Number of usable devices (0 when none or built without CUDA). */
int zck_cuda_device_count(void);
/* Name of device i for reports; writes "" when unavailable. */
zck_status zck_cuda_device_name(int device, char *buf, size_t n);
/* Makes `device` current for the calling thread. */
zck_status zck_cuda_set_device(int device);

// ---- memory and streams (checked wrappers; errors name the call and the size)

zck_status zck_cuda_malloc(void **d_ptr, size_t bytes);
void zck_cuda_free(void *d_ptr);                        /* NULL is fine */
/* Page-locked host memory (fast, asynchronous copies). */
zck_status zck_cuda_host_alloc(void **ptr, size_t bytes);
void zck_cuda_host_free(void *ptr);                     /* NULL is fine */
/* Copies between any two of host / device memory (unified addressing); synchronous in
 * full from any thread: issued on the legacy default stream of the device that owns the
 * memory and waited for, so a copy into device memory has landed on return. It does not
 * wait for other streams' work on that memory unless they are blocking streams (all of
 * zckpt's are): callers that read results synchronize the streams that wrote them. */
zck_status zck_cuda_memcpy(void *dst, const void *src, size_t bytes);
/* Same, queued on `stream` (asynchronous only with page-locked host memory). */
zck_status zck_cuda_memcpy_async(void *dst, const void *src, size_t bytes, void *stream);
zck_status zck_cuda_memset_async(void *d_ptr, int byte, size_t bytes, void *stream);
/* Stream-ordered allocation (cudaMallocAsync from the device's default pool): the memory
 * may be used by work queued on `stream` after this call, and is returned to the pool by
 * free_async once the work queued before that call is done, without synchronizing; a
 * later alloc on the same stream reuses it. bytes 0 gives a valid 16-byte block. */
zck_status zck_cuda_malloc_async(void **d_ptr, size_t bytes, void *stream);
void zck_cuda_free_async(void *d_ptr, void *stream);    /* NULL is fine */
/* Free and total bytes of `device` (cudaMemGetInfo: the whole device, every process). */
zck_status zck_cuda_mem_info(int device, size_t *free_bytes, size_t *total_bytes);
zck_status zck_cuda_stream_create(void **stream);
void zck_cuda_stream_destroy(void *stream);             /* NULL is fine */
zck_status zck_cuda_stream_sync(void *stream);
zck_status zck_cuda_device_sync(void);
/* zck_cuda_free, zck_cuda_host_free, zck_cuda_memcpy and zck_cuda_device_sync synchronize
 * the device (or its legacy stream, which waits for the blocking streams): with an NCCL
 * kernel in flight that can deadlock, so drain the collectives queued without waiting
 * first (zck_comm_cuda_wait(comm, NULL)), or use the stream-ordered calls. */

/* A rank's device context: its device, a stream, and a cuBLAS handle (not thread safe:
 * one context per thread). */
typedef struct zck_cuda_ctx zck_cuda_ctx;
zck_status zck_cuda_ctx_create(int device, zck_cuda_ctx **out);
void zck_cuda_ctx_free(zck_cuda_ctx *ctx);              /* NULL is fine */
void *zck_cuda_ctx_stream(const zck_cuda_ctx *ctx);
int zck_cuda_ctx_device(const zck_cuda_ctx *ctx);
/* Events (cudaEvent_t, timing off): a point on a stream that another stream waits for
 * without the host. query: 1 done, 0 not yet, -1 error. */
zck_status zck_cuda_event_create(void **ev);
void zck_cuda_event_destroy(void *ev);                 /* NULL is fine */
zck_status zck_cuda_event_record(void *ev, void *stream);
zck_status zck_cuda_stream_wait_event(void *stream, void *ev);
int zck_cuda_event_query(void *ev);

// ---- casts (bit-exact with zck_convert)

/* fp32 -> bf16, round to nearest even; NaN -> 0x7FC0 (c10::BFloat16's bits). */
zck_status zck_cuda_f32_to_bf16(const float *d_src, uint16_t *d_dst, size_t n, void *stream);
/* bf16 -> fp32 (exact). */
zck_status zck_cuda_bf16_to_f32(const uint16_t *d_src, float *d_dst, size_t n, void *stream);

// ---- fused AdamW on an fp32 master partition

/* One call does, per element, what samples/engine does for a partition in ze_zero_step:
 *   g = grad * (float)clip                 (when clip != 1)
 *   ze_adamw_step's arithmetic on (param, g, exp_avg, exp_avg_sq)   (see optim.h)
 *   grad = 0                               (when zero_grad)
 *   lp_out = lp_dtype(param)               (when lp_out: BF16 rounded RNE, or F32)
 * The scalars (bias corrections, 1 - beta, -lr/bc1, sqrt(bc2)) are computed on the host in
 * double exactly as ze_adamw_step does, and every float operation is the same IEEE
 * operation in the same order (no contraction: explicit _rn intrinsics and the same
 * fmaf), so the result equals the CPU optimizer bit for bit. */
typedef struct zck_cuda_adamw_args {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;            /* after incrementing: 1, 2, ... */
  double clip;             /* gradient multiplier; 1: none */
  int zero_grad;
  void *d_lp_out;          /* NULL: none */
  zck_dtype lp_dtype;      /* ZCK_BF16 or ZCK_F32 */
} zck_cuda_adamw_args;
zck_status zck_cuda_adamw(float *d_param, float *d_grad, float *d_exp_avg, float *d_exp_avg_sq, size_t n,
                          const zck_cuda_adamw_args *a, void *stream);

// ---- element-wise ops of the ZeRO engine on fp32 partitions (the CPU's arithmetic)

/* dst[i] = src[i] / divisor (IEEE division; DeepSpeed's averaging before the sum).
 * dst may equal src. */
zck_status zck_cuda_div_f32(float *d_dst, const float *d_src, size_t n, float divisor, void *stream);
/* acc[i] += src[i]. */
zck_status zck_cuda_add_f32(float *d_acc, const float *d_src, size_t n, void *stream);
/* *sum = the sum over i of (double)x[i]^2, in double, in a fixed order (one block of
 * strided partial sums and a fixed tree: the same bits on every run and every GPU, not
 * the CPU's sequential order). Synchronizes the stream. */
zck_status zck_cuda_sumsq_f64(const float *d_x, size_t n, double *sum, void *stream);

// ---- GPT-2 kernels (device pointers; int tokens are int32)

/* out (BT, C) = wte[inp] + wpe[t]; the backward adds dout into dwte / dwpe in bt order
 * (the CPU's order: bit-exact). */
zck_status zck_cuda_encoder_forward(float *out, const int *inp, const float *wte, const float *wpe, int BT, int T, int C,
                                    void *stream);
zck_status zck_cuda_encoder_backward(float *dwte, float *dwpe, const float *dout, const int *inp, int BT, int T, int C,
                                     void *stream);
/* LayerNorm over C with eps 1e-5 (mean, rstd per row are outputs). Row sums run as a
 * fixed tree over the row: within fp32 tolerance of the CPU. The backward's dw/db sums run
 * over rows in bt order like the CPU's. */
zck_status zck_cuda_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
                                      const float *b, int BT, int C, void *stream);
zck_status zck_cuda_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                       const float *w, const float *mean, const float *rstd, int BT, int C,
                                       void *stream);
/* GELU, tanh approximation ("gelu_new"). CUDA's tanhf is within 2 ulp of glibc's. */
zck_status zck_cuda_gelu_forward(float *out, const float *inp, size_t n, void *stream);
zck_status zck_cuda_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n, void *stream);
/* out = a + b; da += dout, db += dout. */
zck_status zck_cuda_residual_forward(float *out, const float *a, const float *b, size_t n, void *stream);
zck_status zck_cuda_residual_backward(float *da, float *db, const float *dout, size_t n, void *stream);
/* Causal self-attention, qkv (B, T, 3C) = [q | k | v], att (B, H, T, T) keeps the
 * probabilities (zeros above the diagonal), out (B, T, C). The backward needs scratch of
 * B*H*T*T floats and adds into dqkv. */
zck_status zck_cuda_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int H,
                                      void *stream);
zck_status zck_cuda_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                                       float *scratch, int B, int T, int C, int H, void *stream);
/* probs = softmax(logits) per row of V, losses[bt] = -log probs[targets[bt]] (targets may
 * be NULL). Targets must be < V (the GPT-2 entry point checks them on the host). */
zck_status zck_cuda_softmax_xent_forward(float *probs, float *losses, const float *logits, const int *targets,
                                         int BT, int V, void *stream);
/* dlogits = (probs - onehot(target)) * dloss (written, not added). */
zck_status zck_cuda_softmax_xent_backward(float *dlogits, const float *probs, const int *targets, int BT, int V,
                                          float dloss, void *stream);

// ---- matrix products through cuBLAS (fp32 accumulation, no TF32)

/* Row-major C (m, n) = alpha * op(A) (m, k) @ op(B) (k, n) + beta * C. A is stored (m, k)
 * (or (k, m) when trans_a) with row stride lda; likewise B. A and B are both F32 or both
 * BF16; C is F32. */
zck_status zck_cuda_gemm(zck_cuda_ctx *ctx, int trans_a, int trans_b, int m, int n, int k, float alpha,
                         const void *A, int lda, const void *B, int ldb, zck_dtype ab_dtype, float beta, float *C,
                         int ldc);
/* HF Conv1D: out (BT, OC) = inp (BT, IC) @ w (IC, OC) + b (b may be NULL). */
zck_status zck_cuda_conv1d_forward(zck_cuda_ctx *ctx, float *out, const float *inp, const float *w, const float *b,
                                   int BT, int IC, int OC);
/* dinp += dout @ w^T; dw += inp^T @ dout; db += column sums of dout (db may be NULL). */
zck_status zck_cuda_conv1d_backward(zck_cuda_ctx *ctx, float *dinp, float *dw, float *db, const float *dout,
                                    const float *inp, const float *w, int BT, int IC, int OC);
/* Tied lm_head: logits (BT, V) = inp (BT, C) @ wte (V, C)^T; backward adds dinp, dwte. */
zck_status zck_cuda_lm_head_forward(zck_cuda_ctx *ctx, float *logits, const float *inp, const float *wte, int BT,
                                    int C, int V);
zck_status zck_cuda_lm_head_backward(zck_cuda_ctx *ctx, float *dinp, float *dwte, const float *dlogits,
                                     const float *inp, const float *wte, int BT, int C, int V);

// ---- partition pack / unpack: many flat ranges in one launch

/* dst[dst_off + i] = src[src_off + i] / divisor for i < count, per range; with a dtype
 * change on the way (F32 <-> BF16, RNE; division in fp32 before rounding). Ranges must not
 * overlap in dst. The plan is uploaded once (layouts do not change during training). */
typedef struct zck_cuda_range {
  uint64_t src_off, dst_off, count;   /* elements */
} zck_cuda_range;
typedef struct zck_cuda_pack_plan zck_cuda_pack_plan;
zck_status zck_cuda_pack_plan_create(const zck_cuda_range *ranges, size_t n, zck_cuda_pack_plan **out);
void zck_cuda_pack_plan_free(zck_cuda_pack_plan *p);    /* NULL is fine */
/* reverse: swap the roles of src_off and dst_off (the unpack of a pack plan). */
zck_status zck_cuda_pack_run(const zck_cuda_pack_plan *p, int reverse, void *d_dst, zck_dtype dst_dtype,
                             const void *d_src, zck_dtype src_dtype, float divisor, void *stream);

// ---- GPT-2 on the device, the CPU engine's layouts (gpt2_layout.h)

typedef zck_gpt2_config zck_cuda_gpt2_config;

/* A model's device workspace for batches up to (B, T): activations, their gradients, the
 * last batch's tokens. */
typedef struct zck_cuda_gpt2 zck_cuda_gpt2;
zck_status zck_cuda_gpt2_create(zck_cuda_ctx *ctx, const zck_cuda_gpt2_config *c, int B, int T, zck_cuda_gpt2 **out);
void zck_cuda_gpt2_free(zck_cuda_gpt2 *m);               /* NULL is fine */
size_t zck_cuda_gpt2_ws_bytes(const zck_cuda_gpt2 *m);
/* Forward of host token arrays (B, T) (checked < V: ZCK_ERR_INVALID_ARG otherwise) over
 * the device parameters d_params (zck_gpt2_params_walk's floats). With targets, *loss (if
 * not NULL) is the mean cross-entropy, summed in double in bt order as the CPU does. */
zck_status zck_cuda_gpt2_forward(zck_cuda_gpt2 *m, const float *d_params, const int *inputs, const int *targets, int B,
                                 int T, float *loss);
/* Backward of scale * mean loss of the last forward (which had targets): parameter
 * gradients are ADDED into d_grads (same layout as d_params). */
zck_status zck_cuda_gpt2_backward(zck_cuda_gpt2 *m, const float *d_params, float *d_grads, float scale);
/* Module-at-a-time execution (ZeRO-3), the CPU engine's ze_gpt2_hooks on the device.
 * Modules: -1 = embeddings (wte, wpe), 0..L-1 = blocks (their 12 tensors in parameters()
 * order), L = final (ln_f.weight, ln_f.bias, then wte for the tied lm_head); see
 * zck_gpt2_module_tensors. The call order is the CPU's: forward fetches -1, 0, .., L
 * (each released after its kernels are queued); backward fetches L, .., 0 with grads, and
 * asks for -1's grads last (no weights); grads_done(m) follows module m's backward. A
 * hook fills t[i] with the device pointer of the module's i-th tensor; kernels are only
 * queued on the context's stream when a hook returns, so a release or grads_done must
 * order what it does after them (stream-ordered frees, collectives on that stream). A
 * hook's failure is returned as is. */
typedef struct zck_cuda_gpt2_hooks {
  void *ctx;
  zck_status (*fetch)(void *ctx, int module, float **t);
  void (*release)(void *ctx, int module);          /* may be NULL */
  zck_status (*grads)(void *ctx, int module, float **t);
  zck_status (*grads_done)(void *ctx, int module); /* may be NULL */
} zck_cuda_gpt2_hooks;
/* zck_cuda_gpt2_forward / _backward with the parameters (and gradients) from hooks. */
zck_status zck_cuda_gpt2_forward_hooked(zck_cuda_gpt2 *m, const zck_cuda_gpt2_hooks *h, const int *inputs,
                                        const int *targets, int B, int T, float *loss);
zck_status zck_cuda_gpt2_backward_hooked(zck_cuda_gpt2 *m, const zck_cuda_gpt2_hooks *h, float scale);
/* Device pointers to the last forward's logits (B, T, V) and losses (B, T). */
const float *zck_cuda_gpt2_logits(const zck_cuda_gpt2 *m);
const float *zck_cuda_gpt2_losses(const zck_cuda_gpt2 *m);

// ---- collectives on device memory (lib/comm.h's interface)

/* W ranks in this process, one thread per rank, buffers in device memory. When NCCL is
 * built in and there are at least W devices, rank r is an NCCL communicator on device r
 * (ncclCommInitAll; backend "nccl"). Otherwise (fewer devices: NCCL cannot put two ranks
 * of one communicator on one GPU) all ranks share the current device through the
 * "cuda-local" backend: host barriers as in comm_local.c, with reductions done by kernels
 * in rank order 0..W-1 (so its sums equal the CPU local backend's bits, float16 NaNs
 * included: cuda/comm_rules.h). W <= 64. NCCL's sums are its own (tree / ring order).
 * Every collective is synchronous for the host: it starts after the work queued on the
 * rank's stream (zck_comm_cuda_set_stream; default: the whole device is synchronized) and
 * returns when its result is in place. nccl waits poll NCCL's asynchronous error and give
 * up after ZCK_COMM_TIMEOUT_S (see zck_comm_cuda_wait). The calling thread's current
 * device is left as it was. Free the group with zck_comm_nccl_destroy_local. */
zck_status zck_comm_nccl_create_local(int nranks, zck_comm **comms);
/* The cuda-local backend explicitly, on `device`. */
zck_status zck_comm_cuda_local_create(int nranks, int device, zck_comm **comms);
void zck_comm_nccl_destroy_local(zck_comm **comms, int nranks);
/* One process per GPU: rank 0 makes the id and sends it to the others (MPI, a file...);
 * every rank calls init_rank on its current device. */
#define ZCK_NCCL_ID_BYTES 128
zck_status zck_comm_nccl_get_unique_id(uint8_t id[ZCK_NCCL_ID_BYTES]);
zck_status zck_comm_nccl_init_rank(int nranks, int rank, const uint8_t id[ZCK_NCCL_ID_BYTES], zck_comm **comm);
void zck_comm_nccl_destroy(zck_comm *comm);             /* NULL is fine */
/* One process per GPU with a host bootstrap group (zck_comm_mpi_create under mpirun: the
 * id goes by MPI broadcast): makes `device` current for the calling thread, rank 0 of
 * `bootstrap` makes the NCCL id and broadcasts it over `bootstrap`, and every rank joins an
 * NCCL group of bootstrap->size ranks with its bootstrap rank. Collective over bootstrap:
 * every rank calls it; a rank that cannot select its device or make the id makes all of
 * them fail instead of leaving the others waiting. Free *out with zck_comm_nccl_destroy. */
zck_status zck_comm_nccl_init_from(zck_comm *bootstrap, int device, zck_comm **out);
/* The stream collectives of this rank are ordered after (cuda-local and nccl backends). */
zck_status zck_comm_cuda_set_stream(zck_comm *comm, void *stream);
/* async 1 (nccl, with a stream set): collectives are queued on that stream and return
 * without waiting (overlap_comm's comm stream; what follows on the stream is ordered after
 * them, and a peer's failure shows when the stream is waited for). cuda-local keeps its
 * host rendezvous, so it stays synchronous; other backends: ZCK_ERR_INVALID_ARG. */
zck_status zck_comm_cuda_set_async(zck_comm *comm, int async);
/* Waits for the work queued on `stream` so far (on comm's device); use it instead of
 * zck_cuda_stream_sync for any stream that holds NCCL work or waits for it (an event of the
 * comm stream). nccl: an event recorded there is polled together with NCCL's asynchronous
 * error and this process's aborts, and given up after ZCK_COMM_TIMEOUT_S seconds (default
 * 300, from the start of the wait, as the MPI backend's per-collective wait); on a failure
 * the communicator is aborted and the one-line error names this rank (and the failed one
 * when it is in this process). stream NULL: only the collectives queued without waiting
 * (async) — drain them before anything that synchronizes the whole device (a device
 * synchronize, cudaFree, cudaFreeHost, a copy on the legacy default stream), which can
 * deadlock with an NCCL kernel in flight. Other backends: a plain stream synchronize. */
zck_status zck_comm_cuda_wait(zck_comm *comm, void *stream);
/* The device whose memory this rank's buffers must be in (cuda-local and nccl backends);
 * -1 for any other backend. */
int zck_comm_cuda_device(const zck_comm *comm);

// ---- on-save 16-bit gather in bounded memory

/* Sources: flat partitions (device memory for the GPU path, host memory for the host
 * path) of F32 or BF16 elements. */
typedef struct zck_gather_src {
  const void *data;
  zck_dtype dtype;          /* ZCK_F32 or ZCK_BF16 */
  uint64_t numel;
} zck_gather_src;
/* Output elements [dst_off, dst_off + count) come from src[src][src_off ...]. The output
 * is one flat array of the output dtype (e.g. a safetensors data section); extents must
 * not overlap in it; gaps are not written. */
typedef struct zck_gather_extent {
  uint32_t src;
  uint64_t src_off, dst_off, count;
} zck_gather_extent;
/* Receives output bytes [byte_off, byte_off + n) in increasing byte_off order. */
typedef zck_status (*zck_gather_write_fn)(void *ctx, uint64_t byte_off, const void *bytes, size_t n);

/* The plan: extents sorted by output offset, adjacent ones merged, cut into buckets of at
 * most bucket_elems output elements. A bucket is a list of items (what to convert into
 * which staging offset) and runs (contiguous output ranges of the staged bytes). */
typedef struct zck_gather_item {
  uint32_t src;
  uint64_t src_off, stage_off, count;
} zck_gather_item;
typedef struct zck_gather_run {
  uint64_t dst_off, stage_off, count;
} zck_gather_run;
typedef struct zck_gather_bucket {
  size_t first_item, n_items, first_run, n_runs;
  uint64_t count;           /* staged elements */
} zck_gather_bucket;
typedef struct zck_gather_plan {
  zck_dtype out_dtype;      /* ZCK_BF16 or ZCK_F32 */
  uint64_t bucket_elems;
  size_t n_srcs;
  zck_dtype *src_dtype;     /* [n_srcs] as planned */
  uint64_t *src_numel;
  zck_gather_item *items;
  size_t n_items;
  zck_gather_run *runs;
  size_t n_runs;
  zck_gather_bucket *buckets;
  size_t n_buckets;
  uint64_t total;           /* elements written */
  uint64_t dst_end;         /* one past the last output element written */
} zck_gather_plan;

/* Checks every extent (source index, bounds, overlaps: ZCK_ERR_INVALID_ARG naming the
 * extent) and builds the plan. bucket_bytes >= one output element. */
zck_status zck_gather_plan_build(const zck_gather_src *srcs, size_t n_srcs, const zck_gather_extent *extents,
                                 size_t n_extents, zck_dtype out_dtype, size_t bucket_bytes, zck_gather_plan **out);
void zck_gather_plan_free(zck_gather_plan *p);           /* NULL is fine */
/* The extents of a layout's pieces, planned by lib/plan (zck_plan_build into the output as
 * a one-store layout, param p's elements from param_dst_off[p] on; strided pieces cut into
 * runs): piece (param p, store s, param_off, store_off, count) becomes (src s, store_off,
 * param_dst_off[p] + param_off, count), merged where contiguous. Params whose
 * param_dst_off is UINT64_MAX are left out (frozen, tied aliases...). */
struct zck_layout;
zck_status zck_gather_extents_from_layout(const struct zck_layout *l, const uint64_t *param_dst_off,
                                          zck_gather_extent **out, size_t *n_out);
/* Host path: the same buckets converted with zck_convert into one host staging buffer of
 * bucket size. The reference for the GPU path, and the path without a device. */
zck_status zck_gather_run_host(const zck_gather_plan *p, const zck_gather_src *srcs, zck_gather_write_fn write,
                               void *ctx);
/* GPU path: sources in memory of the current device. Per bucket: convert on the device
 * into a device staging buffer, copy to page-locked host staging asynchronously, and call
 * `write` for the previous bucket meanwhile (two buffers and two streams, so casting,
 * copying and writing overlap). Memory: 2 x bucket bytes on each side, whatever the model
 * size. Same bytes as the host path. It synchronizes the device first (the sources may
 * have been written on any stream): drain NCCL work before (see zck_comm_cuda_wait). */
zck_status zck_cuda_gather16_to_host(const zck_gather_plan *p, const zck_gather_src *srcs, zck_gather_write_fn write,
                                     void *ctx);

#ifdef __cplusplus
}
#endif
#endif
