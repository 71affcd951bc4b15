// Every kernel's parameter list, written once, and the list of kernels. TINYGPT_PARAMS_<name>(T) is kernel <name>'s
// parameters at storage type T; TINYGPT_KERNELS below names each kernel with the storage types its CPU side takes and
// the form of its CUDA side. From these come the CPU declarations (kernels/cpu/cpu_kernels.h), the CUDA ones
// (kernels/cuda/cuda_kernels.h), the launch table (kernels/kernels.h) and the explicit instantiations beside each
// definition (TINYGPT_INSTANTIATE and its _F32_F64, _F32_F64_BF16, _F32_BF16 forms): a definition whose parameters
// drift from its line here is another overload, and its instantiation (or, for a plain function, its table entry)
// fails to compile or to link.
//
// Conventions (llm.c style): outputs first, then inputs, then sizes; gradients carry a `d` prefix and backward kernels
// accumulate (+=) into them, except where an `overwrite` flag asks them to write (=) one. Shapes in trailing comments
// use the letters of kernels/kernels.h. compute_t<T> is the arithmetic type of storage type T (f32 for bf16).
#pragma once

#include <cstdint>

#include "attention.h"
#include "bf16.h"
#include "geometry.h"
#include "numerics.h"
#include "rope_freqs.h"

// ---- element-wise ------------------------------------------------------------------------------------------------
#define TINYGPT_PARAMS_fill(T) (T * out, T value, int64_t n)
/// out = inp rounded to bf16 (nearest, ties to even: kernels/bf16.h); widen_bf16: out = inp, exactly.
#define TINYGPT_PARAMS_round_to_bf16(T) (bf16 * out, const float* inp, int64_t n)
#define TINYGPT_PARAMS_widen_bf16(T) (float* out, const bf16* inp, int64_t n)
/// y += x: a bf16 gradient added into an f32 one (a working copy's into its master's).
#define TINYGPT_PARAMS_accumulate_bf16(T) (float* y, const bf16* x, int64_t n)
/// y += alpha * x
#define TINYGPT_PARAMS_axpy(T) (T * y, const T* x, compute_t<T> alpha, int64_t n)
/// y = beta * y + alpha * x; beta == 0 writes alpha * x without reading y (which may hold anything, NaN included).
/// A step's values may be read from memory (so that a captured CUDA graph replays with each step's): with coef,
/// alpha = coef[0] and beta = coef[1]; with stats {loss, gradient sum of squares}, alpha is taken times the gradient's
/// clipping factor clip_scale(stats[1], max_norm), and nothing is written when the stats are not finite. Either may be
/// null: alpha = T(alpha), beta = T(beta).
#define TINYGPT_PARAMS_axpby(T) \
  (T * y, const T* x, int64_t n, double alpha, double beta, const float* coef, const T* stats, double max_norm)
/// out = op(inp); alpha is the factor of UnaryOp::Scale.
#define TINYGPT_PARAMS_unary_forward(T) (T * out, const T* inp, int64_t n, UnaryOp op, compute_t<T> alpha)
/// dinp += dout * op'(inp); exp and tanh read their saved output `out` instead of recomputing it.
#define TINYGPT_PARAMS_unary_backward(T) \
  (T * dinp, const T* dout, const T* inp, const T* out, int64_t n, UnaryOp op, compute_t<T> alpha, bool overwrite)
#define TINYGPT_PARAMS_binary_forward(T) (T * out, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op)
/// da += reduce(dout * d(out)/da) over broadcast dims; same for db. Either gradient may be null.
#define TINYGPT_PARAMS_binary_backward(T) \
  (T * da, T * db, const T* dout, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op)

// ---- reductions and softmax --------------------------------------------------------------------------------------
/// out[o, i] = alpha * sum_d inp[o, d, i]     inp (outer, D, inner), out (outer, inner)
#define TINYGPT_PARAMS_sum_forward(T) (T * out, const T* inp, int64_t outer, int64_t D, int64_t inner, T alpha)
#define TINYGPT_PARAMS_sum_backward(T) (T * dinp, const T* dout, int64_t outer, int64_t D, int64_t inner, T alpha)
/// out[0] = sum of inp[i]^2 over n elements, in one pass (gradient clipping's norm), in a fixed order.
#define TINYGPT_PARAMS_sum_squares(T) (T * out, const T* inp, int64_t n)
/// A row whose entries are all -inf (every key masked out) gives zeros, not NaN.
#define TINYGPT_PARAMS_softmax_forward(T) (T * out, const T* inp, int64_t N, int64_t C)
#define TINYGPT_PARAMS_softmax_backward(T) (T * dinp, const T* dout, const T* out, int64_t N, int64_t C)
#define TINYGPT_PARAMS_log_softmax_forward(T) (T * out, const T* inp, int64_t N, int64_t C)
#define TINYGPT_PARAMS_log_softmax_backward(T) (T * dinp, const T* dout, const T* out, int64_t N, int64_t C)

// ---- layers ------------------------------------------------------------------------------------------------------
/// Normalizes each row of inp (N, C); saves mean (N) and rstd (N) for the backward pass (f32 for bf16 storage).
#define TINYGPT_PARAMS_layernorm_forward(T)                                                                    \
  (T * out, compute_t<T> * mean, compute_t<T> * rstd, const T* inp, const T* weight, const T* bias, int64_t N, \
   int64_t C, compute_t<T> eps)
/// sum = a + b and out = layernorm(sum) in one pass over the rows (a residual add and the layer norm that reads it):
/// the arguments by name (AddNormForward, kernels/geometry.h).
#define TINYGPT_PARAMS_add_layernorm_forward(T) (const AddNormForward<T>& c)
/// The GPU's dweight and dbias: per-block partial sums, added in a fixed order by a second kernel (deterministic).
#define TINYGPT_PARAMS_layernorm_backward(T)                                                                 \
  (T * dinp, T * dweight, T * dbias, const T* dout, const T* inp, const T* weight, const compute_t<T>* mean, \
   const compute_t<T>* rstd, int64_t N, int64_t C, bool overwrite_dinp)
/// RMSNorm (Llama's): out = inp * rstd * weight with rstd (N) = 1 / sqrt(mean(inp^2) + eps), saved for the backward
/// pass (f32 for bf16 storage); no mean and no bias. The add_ form and the backward as the layer norm's.
#define TINYGPT_PARAMS_rmsnorm_forward(T) \
  (T * out, compute_t<T> * rstd, const T* inp, const T* weight, int64_t N, int64_t C, compute_t<T> eps)
#define TINYGPT_PARAMS_add_rmsnorm_forward(T) (const AddNormForward<T>& c)
#define TINYGPT_PARAMS_rmsnorm_backward(T)                                                                   \
  (T * dinp, T * dweight, const T* dout, const T* inp, const T* weight, const compute_t<T>* rstd, int64_t N, \
   int64_t C, bool overwrite_dinp)
/// SwiGLU's gate: out (N, H) = silu(inp[:, :H]) * inp[:, H:] for inp (N, 2H), the gate and up projections side by
/// side (one fused product); f32 arithmetic. Backward: dinp (N, 2H) += the gradients of both halves (= with
/// overwrite).
#define TINYGPT_PARAMS_swiglu_forward(T) (T * out, const T* inp, int64_t N, int64_t H)
#define TINYGPT_PARAMS_swiglu_backward(T) (T * dinp, const T* dout, const T* inp, int64_t N, int64_t H, bool overwrite)
/// out (N, C) = weight[ids] with weight (V, C). Backward: deterministic on both devices (the CPU splits the channels
/// across threads; the GPU sums each id's rows in fixed chunks, sorted on the host when host_ids is given).
#define TINYGPT_PARAMS_embedding_forward(T) (T * out, const int32_t* ids, const T* weight, int64_t N, int64_t C)
#define TINYGPT_PARAMS_embedding_backward(T) \
  (T * dweight, const T* dout, const int32_t* ids, const int32_t* host_ids, int64_t N, int64_t V, int64_t C)
/// losses (N) = lse - logits[target]; lse (N) saved (both f32 for bf16 logits). Rows whose target is ignore_index get
/// loss 0.
#define TINYGPT_PARAMS_crossentropy_forward(T)                                                               \
  (compute_t<T> * losses, compute_t<T> * lse, const T* logits, const int32_t* targets, int64_t N, int64_t V, \
   int32_t ignore_index)
/// dlogits += dloss * (softmax(logits) - onehot(target)) for every row that is not ignored, with dloss = *dloss_in *
/// scale: the upstream gradient is read where it lies (device memory on the GPU: no host synchronisation). With
/// `fused`, dlogits holds crossentropy_fused's gradient (the one for *dloss_in == 1): it is left as it is when
/// *dloss_in is 1 (the kernel then reads nothing else) and overwritten (=) with the gradient for *dloss_in otherwise.
#define TINYGPT_PARAMS_crossentropy_backward(T)                                                          \
  (T * dlogits, const compute_t<T>* dloss, compute_t<T> scale, const T* logits, const compute_t<T>* lse, \
   const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index, bool fused)
/// The fused classifier (llm.c's): crossentropy_forward's losses and lse, and in the same pass over each row of
/// logits the gradient for an upstream gradient of 1, written (=): dlogits = scale * (softmax(logits) -
/// onehot(target)), zero rows where the target is ignored. The logits are read once for loss and gradient; training
/// runs this, and crossentropy_backward(fused) keeps its gradient when the loss's gradient is 1.
#define TINYGPT_PARAMS_crossentropy_fused(T)                                                        \
  (compute_t<T> * losses, compute_t<T> * lse, T * dlogits, const T* logits, const int32_t* targets, \
   compute_t<T> scale, int64_t N, int64_t V, int32_t ignore_index)
/// Keeps element i with probability 1-p (scaled by 1/(1-p)); the mask is a hash of (seed, i), so
/// backward recomputes it instead of storing it, and any thread split gives the same mask.
#define TINYGPT_PARAMS_dropout_forward(T) (T * out, const T* inp, int64_t n, float p, DropoutSeed seed)
#define TINYGPT_PARAMS_dropout_backward(T) (T * dinp, const T* dout, int64_t n, float p, DropoutSeed seed)

// ---- layout ------------------------------------------------------------------------------------------------------
/// out (permuted, contiguous) = inp read through g.inp_stride; accumulate adds instead of storing.
#define TINYGPT_PARAMS_permute(T) (T * out, const T* inp, const PermuteGeom& g, bool accumulate)
/// dst[o, dst_start + j, i] (=|+=) src[o, src_start + j, i] for j < len. dst (outer, dst_D, inner), src (outer,
/// src_D, inner)
#define TINYGPT_PARAMS_copy_slice(T)                                                                     \
  (T * dst, const T* src, int64_t outer, int64_t inner, int64_t dst_D, int64_t dst_start, int64_t src_D, \
   int64_t src_start, int64_t len, bool accumulate)

// ---- products ----------------------------------------------------------------------------------------------------
/// out (batch, M, N) = op(a) @ op(b), a is (batch_a, M, K) or (batch_a, K, M) when trans_a, b likewise;
/// batch = max(batch_a, batch_b) and an operand with batch 1 is shared by every batch. math: MatmulMath::BF16 rounds
/// the operands to bf16 (gemm's packing); TF32 is for the GPU's tensor cores, and the CPU computes it as F32. The GPU
/// runs cuBLAS (strided batched).
#define TINYGPT_PARAMS_matmul_forward(T) (T * out, const T* a, const T* b, const MatmulGeom& g)
#define TINYGPT_PARAMS_matmul_backward(T) (T * da, T * db, const T* dout, const T* a, const T* b, const MatmulGeom& g)
/// A linear layer, out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC) with an optional activation, and its
/// backward; the arguments are structs (LinearForward, LinearBackward in kernels/geometry.h). The GPU runs the product
/// by cuBLAS, then the bias and activation by our kernel, or in cublasLt's epilogue when the call asks for it (f32
/// products).
#define TINYGPT_PARAMS_linear_forward(T) (const LinearForward<T>& c)
#define TINYGPT_PARAMS_linear_backward(T) (const LinearBackward<T>& c)

// ---- optimizer and positions -------------------------------------------------------------------------------------
/// One AdamW step on the parameters of `runs` (decoupled weight decay, each run's own; bias-corrected moments),
/// param, grad, m and v the packed buffers the runs index. The step's scalars are read from memory (so that a captured
/// CUDA graph replays with each step's values): sched = {lr, c1, c2}, c1 and c2 adamw_correction(beta1|2, step) as
/// floats; stats = {the loss, the gradient's sum of squares}. The gradient is clipped to max_norm (0: not clipped) by
/// clip_scale of the sum as it is read; when the loss or the sum is not finite nothing is updated.
#define TINYGPT_PARAMS_adamw_update(T)                                                                               \
  (T * param, const T* grad, T* m, T* v, const AdamWRuns& runs, const float* sched, const T* stats, double max_norm, \
   float beta1, float beta2, float eps)
/// Rotary embedding of x (B, L, NH, E) at positions pos0 .. pos0+L-1 (frequencies: kernels/rope_freqs.h): the first
/// n_rot heads are rotated, the rest copied. E must be even. Backward applies the inverse rotation and accumulates.
#define TINYGPT_PARAMS_rope_forward(T) \
  (T * out, const T* inp, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0, RopeFreqs freqs)
#define TINYGPT_PARAMS_rope_backward(T) \
  (T * dinp, const T* dout, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot, int64_t pos0, RopeFreqs freqs)

// ---- attention (layout, masking and dropout: kernels/attention.h) ------------------------------------------------
// `mask` is the additive mask (may be null), `key_padding` (B, S) nonzero ignores a key (may be null).
/// The naive reference, which materializes the scores: out (B, NH, T, Ev) and lse (B, NH, T); weights (B, NH, T, S),
/// contiguous, receives the softmax probabilities before dropout when not null.
#define TINYGPT_PARAMS_attention_naive_forward(T)                                                                \
  (T * out, T * weights, T * lse, const T* q, const T* k, const T* v, const T* mask, const uint8_t* key_padding, \
   const AttentionGeom& g)
/// dq, dk, dv += gradients (any may be null; each uses the strides of its input, dout those of out).
#define TINYGPT_PARAMS_attention_naive_backward(T)                                                        \
  (T * dq, T * dk, T * dv, const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse, \
   const T* mask, const uint8_t* key_padding, const AttentionGeom& g)
/// Flash attention (tiled, online softmax, no T x S buffer): saves only out (B, NH, T, Ev) and lse (B, NH, T). The
/// GPU's runs head dims up to 128, f32 on CUDA cores or TF32/BF16 operands on tensor cores (g.math).
#define TINYGPT_PARAMS_attention_flash_forward(T)                                                   \
  (T * out, T * lse, const T* q, const T* k, const T* v, const T* mask, const uint8_t* key_padding, \
   const AttentionGeom& g)
/// FlashAttention-2 backward: recomputes P tile by tile from lse; dq, dk, dv += gradients (any may be null).
/// Deterministic: every gradient element is summed by one thread (CPU) or one block (GPU) in a fixed order, so no
/// gradient needs atomics. The GPU's: D = rowsum(dO * O) first, then one pass over key tiles for dK and dV and a
/// separate pass over query tiles for dQ (P and dS computed twice).
#define TINYGPT_PARAMS_attention_flash_backward(T)                                                        \
  (T * dq, T * dk, T * dv, const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse, \
   const T* mask, const uint8_t* key_padding, const AttentionGeom& g)
/// Flash forward on bf16 storage: out (bf16, strides g.o_stride) and lse (f32) of bf16 q, k, v, without an additive
/// mask, relative positions or T5 bias: the calls flash_bf16_takes accepts (kernels/attention.h). The CPU's is the
/// f32 flash kernel with bf16 operands (g.math = BF16), each tile widened as it is loaded, each output row rounded
/// once; the GPU's is kernels/cuda/flash_bf16.cuh.
#define TINYGPT_PARAMS_attention_flash_forward_bf16(T) \
  (bf16 * out, float* lse, const bf16* q, const bf16* k, const bf16* v, const AttentionGeom& g)
/// Its backward: dq, dk, dv (bf16, any may be null) get the gradients, stored when g.grads_unwritten, else added
/// (each sum rounded once); dout has out's strides.
#define TINYGPT_PARAMS_attention_flash_backward_bf16(T)                                                             \
  (bf16 * dq, bf16 * dk, bf16 * dv, const bf16* dout, const bf16* q, const bf16* k, const bf16* v, const bf16* out, \
   const float* lse, const AttentionGeom& g)

/// The kernels: X(name, takes, gpu). takes: the storage types of cpu::name<T> (kernels/kernels.h's bits kF32, kF64,
/// kBf16; kPlain for a function without a storage type). gpu, the CUDA side's form: PLAIN, one function with the
/// CPU's signature (no storage type); F32, one f32 function cuda::name; TEMPLATE, cuda::name<T> for each storage type
/// in takes but f64.
#define TINYGPT_KERNELS(X)                            \
  X(round_to_bf16, kPlain, PLAIN)                     \
  X(widen_bf16, kPlain, PLAIN)                        \
  X(accumulate_bf16, kPlain, PLAIN)                   \
  X(fill, kFloats, F32)                               \
  X(axpy, kFloats | kBf16, TEMPLATE)                  \
  X(axpby, kFloats, F32)                              \
  X(unary_forward, kFloats | kBf16, TEMPLATE)         \
  X(unary_backward, kFloats | kBf16, TEMPLATE)        \
  X(binary_forward, kFloats | kBf16, TEMPLATE)        \
  X(binary_backward, kFloats | kBf16, TEMPLATE)       \
  X(sum_forward, kFloats, F32)                        \
  X(sum_backward, kFloats, F32)                       \
  X(sum_squares, kFloats, F32)                        \
  X(softmax_forward, kFloats, F32)                    \
  X(softmax_backward, kFloats, F32)                   \
  X(log_softmax_forward, kFloats, F32)                \
  X(log_softmax_backward, kFloats, F32)               \
  X(layernorm_forward, kFloats | kBf16, TEMPLATE)     \
  X(add_layernorm_forward, kFloats | kBf16, TEMPLATE) \
  X(layernorm_backward, kFloats | kBf16, TEMPLATE)    \
  X(rmsnorm_forward, kFloats | kBf16, TEMPLATE)       \
  X(add_rmsnorm_forward, kFloats | kBf16, TEMPLATE)   \
  X(rmsnorm_backward, kFloats | kBf16, TEMPLATE)      \
  X(swiglu_forward, kFloats | kBf16, TEMPLATE)        \
  X(swiglu_backward, kFloats | kBf16, TEMPLATE)       \
  X(embedding_forward, kFloats | kBf16, TEMPLATE)     \
  X(embedding_backward, kFloats | kBf16, TEMPLATE)    \
  X(crossentropy_forward, kFloats | kBf16, TEMPLATE)  \
  X(crossentropy_backward, kFloats | kBf16, TEMPLATE) \
  X(crossentropy_fused, kFloats | kBf16, TEMPLATE)    \
  X(dropout_forward, kFloats | kBf16, TEMPLATE)       \
  X(dropout_backward, kFloats | kBf16, TEMPLATE)      \
  X(permute, kFloats | kBf16, TEMPLATE)               \
  X(copy_slice, kFloats | kBf16, TEMPLATE)            \
  X(matmul_forward, kFloats | kBf16, TEMPLATE)        \
  X(matmul_backward, kFloats | kBf16, TEMPLATE)       \
  X(linear_forward, kFloats | kBf16, TEMPLATE)        \
  X(linear_backward, kFloats | kBf16, TEMPLATE)       \
  X(adamw_update, kFloats, F32)                       \
  X(rope_forward, kFloats | kBf16, TEMPLATE)          \
  X(rope_backward, kFloats | kBf16, TEMPLATE)         \
  X(attention_naive_forward, kFloats, F32)            \
  X(attention_naive_backward, kFloats, F32)           \
  X(attention_flash_forward, kFloats, F32)            \
  X(attention_flash_backward, kFloats, F32)           \
  X(attention_flash_forward_bf16, kPlain, PLAIN)      \
  X(attention_flash_backward_bf16, kPlain, PLAIN)

/// Declarations in a namespace: TINYGPT_KERNELS(TINYGPT_DECLARE_CPU) in tinygpt::cpu, TINYGPT_DECLARE_CUDA in
/// tinygpt::cuda. Each side's form: the CUDA side's is the list's; every CPU kernel with a storage type is a template.
#define TINYGPT_DECLARE_PLAIN(name) void name TINYGPT_PARAMS_##name(void);
#define TINYGPT_DECLARE_F32(name) void name TINYGPT_PARAMS_##name(float);
#define TINYGPT_DECLARE_TEMPLATE(name) \
  template <class T>                   \
  void name TINYGPT_PARAMS_##name(T);
#define TINYGPT_DECLARE_CUDA(name, takes, gpu) TINYGPT_DECLARE_##gpu(name)
#define TINYGPT_DECLARE_CPU(name, takes, gpu) TINYGPT_DECLARE_CPU_##gpu(name)
#define TINYGPT_DECLARE_CPU_PLAIN TINYGPT_DECLARE_PLAIN
#define TINYGPT_DECLARE_CPU_F32 TINYGPT_DECLARE_TEMPLATE
#define TINYGPT_DECLARE_CPU_TEMPLATE TINYGPT_DECLARE_TEMPLATE

/// The explicit instantiation of kernel template `name` at storage type T, beside its definition (in its namespace).
#define TINYGPT_INSTANTIATE(name, T) template void name<T> TINYGPT_PARAMS_##name(T);
#define TINYGPT_INSTANTIATE_F32_F64(name) TINYGPT_INSTANTIATE(name, float) TINYGPT_INSTANTIATE(name, double)
#define TINYGPT_INSTANTIATE_F32_F64_BF16(name) TINYGPT_INSTANTIATE_F32_F64(name) TINYGPT_INSTANTIATE(name, bf16)
#define TINYGPT_INSTANTIATE_F32_BF16(name) TINYGPT_INSTANTIATE(name, float) TINYGPT_INSTANTIATE(name, bf16)
