// CPU kernels (OpenMP), templated for float and double, and for bf16 storage where kernels/kernels.h lists it (f32
// arithmetic inside: compute_t<T>); explicit instantiations live beside each definition.
// Shapes in trailing comments use the letters defined in kernels/kernels.h.
#pragma once

#include <cstdint>

#include "attention_kernels.h"
#include "gemm.h"
#include "../bf16.h"
#include "../geometry.h"
#include "../numerics.h"

namespace tinygpt::cpu {

template <class T> void fill(T* out, T value, int64_t n);
/// out = inp rounded to bf16 (nearest, ties to even: kernels/bf16.h); widen_bf16: out = inp, exactly.
void round_to_bf16(bf16* out, const float* inp, int64_t n);
void widen_bf16(float* out, const bf16* inp, int64_t n);
/// y += x: a bf16 gradient added into an f32 one (a working copy's into its master's).
void accumulate_bf16(float* y, const bf16* x, int64_t n);
/// y += alpha * x
template <class T> void axpy(T* y, const T* x, compute_t<T> alpha, int64_t n);
/// y = beta * y + alpha * x; beta == 0 writes alpha * x without reading y (which may hold anything, NaN included).
template <class T> void axpby(T* y, const T* x, T alpha, T beta, int64_t n);
/// axpby for a step whose values are in memory (see adamw_update_indirect): with coef, alpha = coef[0] and beta =
/// coef[1]; without, alpha = T(alpha * clip_scale(stats[1], max_norm)) and beta = T(beta) (the gradient's clipping
/// factor folded in). Nothing is written when stats {loss, sum of squares} are not finite.
template <class T> void axpby_indirect(T* y, const T* x, int64_t n, double alpha, double beta, const float* coef, const T* stats, double max_norm);

/// out = op(inp); alpha is the factor of UnaryOp::Scale.
template <class T> void unary_forward(T* out, const T* inp, int64_t n, UnaryOp op, compute_t<T> alpha);
/// dinp += dout * op'(inp); exp and tanh read their saved output `out` instead of recomputing it.
template <class T> void unary_backward(T* dinp, const T* dout, const T* inp, const T* out, int64_t n, UnaryOp op, compute_t<T> alpha, bool overwrite);

template <class T> void binary_forward(T* out, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op);
/// da += reduce(dout * d(out)/da) over broadcast dims; same for db. Either gradient may be null.
template <class T> void binary_backward(T* da, T* db, const T* dout, const T* a, const T* b, const BroadcastGeom& g, BinaryOp op);

/// out[o, i] = alpha * sum_d inp[o, d, i]     inp (outer, D, inner), out (outer, inner)
template <class T> void sum_forward(T* out, const T* inp, int64_t outer, int64_t D, int64_t inner, T alpha);
/// out[0] = sum of inp[i]^2 over n elements, in one pass (gradient clipping's norm), in a fixed order.
template <class T> void sum_squares(T* out, const T* inp, int64_t n);
template <class T> void sum_backward(T* dinp, const T* dout, int64_t outer, int64_t D, int64_t inner, T alpha);

/// A row whose entries are all -inf (every key masked out) gives zeros, not NaN.
template <class T> void softmax_forward(T* out, const T* inp, int64_t N, int64_t C);
template <class T> void softmax_backward(T* dinp, const T* dout, const T* out, int64_t N, int64_t C);
template <class T> void log_softmax_forward(T* out, const T* inp, int64_t N, int64_t C);
template <class T> void log_softmax_backward(T* dinp, const T* dout, const T* out, int64_t N, int64_t C);

/// Normalizes each row of inp (N, C); saves mean (N) and rstd (N) for the backward pass (f32 for bf16 storage).
template <class T> void layernorm_forward(T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, compute_t<T> eps);
/// sum = a + b and out = layernorm(sum) in one pass over the rows (a residual add and the layer norm that reads it);
/// mean and rstd as layernorm_forward's.
/// With p > 0, b enters dropped out: element i of b as dropout_forward(b, p, seed) would make it (the same mask).
template <class T> void add_layernorm_forward(T* sum, T* out, compute_t<T>* mean, compute_t<T>* rstd, const T* a, const T* b, const T* weight, const T* bias, int64_t N, int64_t C, compute_t<T> eps, float p, DropoutSeed seed);
template <class T> void layernorm_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, const compute_t<T>* mean, const compute_t<T>* rstd, int64_t N, int64_t C, bool overwrite_dinp);

/// out (N, C) = weight[ids] with weight (V, C). Backward splits the channels across threads: no races.
template <class T> void embedding_forward(T* out, const int32_t* ids, const T* weight, int64_t N, int64_t C);
template <class T> void embedding_backward(T* dweight, const T* dout, const int32_t* ids, const int32_t* host_ids, int64_t N, int64_t V, int64_t C);

/// losses (N) = lse - logits[target]; lse (N) saved (both f32 for bf16 logits). Rows whose target is ignore_index get
/// loss 0.
template <class T> void crossentropy_forward(compute_t<T>* losses, compute_t<T>* lse, const T* logits, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index);
/// dlogits += dloss * (softmax(logits) - onehot(target)) for every row that is not ignored, with dloss = *dloss_in *
/// scale: the upstream gradient is read where it lies (device memory on the GPU: no host synchronisation). With
/// `fused`, dlogits holds crossentropy_fused's gradient (the one for *dloss_in == 1): it is left as it is when
/// *dloss_in is 1 (the kernel then reads nothing else) and overwritten (=) with the gradient for *dloss_in otherwise.
template <class T> void crossentropy_backward(T* dlogits, const compute_t<T>* dloss, compute_t<T> scale, const T* logits, const compute_t<T>* lse, const int32_t* targets, int64_t N, int64_t V, int32_t ignore_index, bool fused);
/// The fused classifier (llm.c's): crossentropy_forward's losses and lse, and in the same pass over each row of
/// logits the gradient for an upstream gradient of 1, written (=): dlogits = scale * (softmax(logits) -
/// onehot(target)), zero rows where the target is ignored. The logits are read once for loss and gradient; training
/// runs this, and crossentropy_backward(fused) keeps its gradient when the loss's gradient is 1.
template <class T> void crossentropy_fused(compute_t<T>* losses, compute_t<T>* lse, T* dlogits, const T* logits, const int32_t* targets, compute_t<T> scale, int64_t N, int64_t V, int32_t ignore_index);

/// Keeps element i with probability 1-p (scaled by 1/(1-p)); the mask is a hash of (seed, i), so
/// backward recomputes it instead of storing it, and any thread split gives the same mask.
template <class T> void dropout_forward(T* out, const T* inp, int64_t n, float p, DropoutSeed seed);
template <class T> void dropout_backward(T* dinp, const T* dout, int64_t n, float p, DropoutSeed seed);

/// out (permuted, contiguous) = inp read through g.inp_stride; accumulate adds instead of storing.
template <class T> void permute(T* out, const T* inp, const PermuteGeom& g, bool accumulate);
/// dst[o, dst_start + j, i] (=|+=) src[o, src_start + j, i] for j < len. dst (outer, dst_D, inner), src (outer, src_D, inner)
template <class T> void copy_slice(T* dst, const T* src, int64_t outer, int64_t inner, int64_t dst_D, int64_t dst_start, int64_t src_D, int64_t src_start, int64_t len, bool accumulate);

/// out (batch, M, N) = op(a) @ op(b), a is (batch_a, M, K) or (batch_a, K, M) when trans_a, b likewise;
/// batch = max(batch_a, batch_b) and an operand with batch 1 is shared by every batch. math: MatmulMath::BF16 rounds
/// the operands to bf16 (gemm's packing); TF32 is for the GPU's tensor cores, and the CPU computes it as F32.
template <class T> void matmul_forward(T* out, const T* a, const T* b, int64_t batch_a, int64_t batch_b, int64_t M, int64_t K, int64_t N, bool trans_a, bool trans_b, MatmulMath math);
template <class T> void matmul_backward(T* da, T* db, const T* dout, const T* a, const T* b, int64_t batch_a, int64_t batch_b, int64_t M, int64_t K, int64_t N, bool trans_a, bool trans_b, MatmulMath math);

/// out (N, OC) = inp (N, C) @ weight (OC, C)^T + bias (OC); bias may be null. With an activation, act_out (N, OC)
/// = act(out) too (out keeps the pre-activation). Backward: with an activation (and overwrite_dinp), dinp is the
/// gradient through the activation that made inp, dinp = (dout @ weight) * act'(act_of), act_of (N, C).
/// inp16 (may be null; N * C bf16 bit patterns, 4-byte aligned): where the GPU keeps inp rounded to bf16 between the
/// two calls with bf16 math (linear_forward writes it, linear_backward reads it instead of rounding inp again). The
/// CPU rounds inside its GEMM and ignores it; the results are the same with it or without.
/// GPU only, with bf16 math: an inp that is null means inp16 already holds it (an act16 of the previous layer's), and
/// act16 (may be null; N * OC bf16 bit patterns, 4-byte aligned), with an activation, takes act(out) rounded to bf16
/// in place of act_out, which is then not written: the next product's operand, without an f32 copy of it. The CPU
/// ignores act16 (and always needs inp and act_out).
template <class T> void linear_forward(T* out, const T* inp, const T* weight, const T* bias, int64_t N, int64_t C, int64_t OC, MatmulMath math, Activation act, T* act_out, uint16_t* inp16, uint16_t* act16);
template <class T> void linear_backward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight, int64_t N, int64_t C, int64_t OC, MatmulMath math, bool overwrite_dinp, Activation act, const T* act_of, const uint16_t* inp16);

/// One AdamW step on the parameters of `runs` (decoupled weight decay, each run's own; bias-corrected moments; step
/// counts from 1), with the gradient taken as grad_scale * grad (gradient clipping without a pass of its own; 1: as
/// it is). param, grad, m and v are the packed buffers the runs index.
/// adamw_update with the step's scalars read from memory the step's own work wrote (so that a captured CUDA graph
/// replays with each step's values): sched = {lr, c1, c2}, c1 and c2 adamw_correction(beta1|2, step) as floats;
/// stats = {the loss, the gradient's sum of squares}. The gradient is clipped to max_norm (0: not clipped) by
/// clip_scale of the sum; when the loss or the sum is not finite nothing is updated.
template <class T> void adamw_update_indirect(T* param, const T* grad, T* m, T* v, const AdamWRuns& runs, const float* sched, const T* stats, double max_norm, float beta1, float beta2, float eps);
template <class T> void adamw_update(T* param, const T* grad, T* m, T* v, const AdamWRuns& runs, float lr, float beta1,
                                     float beta2, float eps, int64_t step, double grad_scale);

/// Rotary embedding of x (B, L, NH, E) at positions pos0 .. pos0+L-1: the first n_rot heads are rotated, the rest
/// copied. E must be even. Backward applies the inverse rotation and accumulates.
template <class T> void rope_forward(T* out, const T* inp, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot,
                                     int64_t pos0, double base);
template <class T> void rope_backward(T* dinp, const T* dout, int64_t B, int64_t L, int64_t NH, int64_t E, int64_t n_rot,
                                      int64_t pos0, double base);

}  // namespace tinygpt::cpu
