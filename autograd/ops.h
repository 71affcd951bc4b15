// Differentiable ops. Each computes its result with a forward kernel and records one backward closure
// that calls the paired backward kernel. Broadcasting follows NumPy/PyTorch rules.
#pragma once

#include <cstdint>
#include <vector>

#include "../kernels/dropout_hash.h"
#include "../kernels/geometry.h"
#include "../kernels/numerics.h"
#include "../kernels/rope_freqs.h"
#include "autograd.h"
#include "tensor.h"

namespace tinygpt {

// --- elementwise (binary ops broadcast)
/// x converted to `dtype` (Tensor::to: bf16 rounds to nearest even), differentiable: the gradient comes back
/// converted to x's dtype. The way into and out of bf16 storage inside a graph (f32 <-> bf16 on either device).
Tensor cast(const Tensor& x, DType dtype);

/// The bf16 working copy of the f32 parameter p, as a differentiable bf16 tensor whose gradient is widened into p's:
/// the copy write_bf16_copy last wrote (no rounding here), or p rounded now when it has none. A bf16 p is returned as
/// it is.
Tensor working_copy(const Tensor& p);
/// (Re)writes p's bf16 working copy from p: into the copy p has, or a new one. (FlatParameters writes the copies
/// of packed parameters in one pass of its own.)
void write_bf16_copy(const Tensor& p);

Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor scale(const Tensor& x, double alpha);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor sqrt(const Tensor& x);
/// GELU, tanh approximation (as GPT-2).
Tensor gelu(const Tensor& x);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& x) { return neg(x); }
inline Tensor operator*(const Tensor& x, double s) { return scale(x, s); }
inline Tensor operator*(double s, const Tensor& x) { return scale(x, s); }

// --- reductions
Tensor sum(const Tensor& x);
/// sum(x * x) over every element, as a 0-d tensor, in one pass without a temporary: gradient clipping's norm. Records
/// no gradient (throws for an input that requires one while gradients are recorded).
Tensor sum_squares(const Tensor& x);
Tensor sum(const Tensor& x, int dim, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, int dim, bool keepdim = false);
/// Over the last dimension. A row that is all -inf (every entry masked out) gives zeros, not NaN.
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);

// --- products
/// op(a) @ op(b) over the last two dims, op = transpose when the flag is set (read in place, no copy).
/// Leading (batch) dims must match, or one operand is 2-D and shared by every batch. On the GPU, numerics.tf32 runs
/// the product (and its backward) on TF32 tensor cores.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false,
              const Numerics& numerics = {});
/// x (..., C) @ weight (OC, C)^T + bias (OC); bias may be undefined. numerics as for matmul.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Numerics& numerics = {});
/// The transformer's MLP, linear(act(linear(x, w_fc, b_fc)), w_proj, b_proj), as one op with the same values and
/// gradients: the activation runs in the first product's epilogue, and its derivative in the epilogue of the
/// backward product that forms its gradient (no separate passes over the hidden activations). act is not None;
/// biases may be undefined.
Tensor mlp(const Tensor& x, const Tensor& w_fc, const Tensor& b_fc, const Tensor& w_proj, const Tensor& b_proj,
           Activation act, const Numerics& numerics = {});

// --- layers
/// Normalizes over the last dimension; saves mean and rstd for backward. bias may be undefined.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
/// {a + b, layer_norm(a + b, weight, bias)} in one pass (a residual add and the layer norm that reads it), the same
/// values and gradients as the two ops. With p > 0, b is added as dropout(b, p, seed) would make it (the same mask),
/// without the dropped-out tensor in memory.
std::pair<Tensor, Tensor> add_layer_norm(const Tensor& a, const Tensor& b, const Tensor& weight, const Tensor& bias,
                                         double eps = 1e-5, double p = 0.0, DropoutSeed seed = {});
/// RMSNorm over the last dimension (Llama's): x / sqrt(mean(x^2) + eps) * weight; saves rstd for backward.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps = 1e-6);
/// {a + b, rms_norm(a + b, weight)} in one pass, as add_layer_norm.
std::pair<Tensor, Tensor> add_rms_norm(const Tensor& a, const Tensor& b, const Tensor& weight, double eps = 1e-6,
                                       double p = 0.0, DropoutSeed seed = {});
/// SwiGLU's gate of x (..., 2H), the gate and up projections side by side: silu(x[..., :H]) * x[..., H:] -> (..., H).
Tensor swiglu(const Tensor& x);
/// weight (V, C) gathered at ids (any shape, i32) -> (ids..., C).
Tensor embedding(const Tensor& ids, const Tensor& weight);
/// Mean cross-entropy over rows of logits (..., V) against i32 targets (...); rows whose target is
/// ignore_index are left out of the mean (all ignored: loss 0, gradient 0).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int32_t ignore_index = -1);
/// Zeroes each element with probability p and scales the rest by 1/(1-p); the mask comes from `seed`.
Tensor dropout(const Tensor& x, double p, DropoutSeed seed);
/// As above with a seed drawn from `gen`; identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, Generator& gen, bool training = true);

/// Rotary position embedding of x (B, L, NH * E), heads packed in the last dim: the first `rotated_heads`
/// heads of each position are rotated by angles pos * inv_freq(i) (pairs (i, i + E/2); base^(-2i/E), or Llama 3's
/// rescaling of it: kernels/rope_freqs.h), positions
/// starting at `pos0`; the remaining heads pass through unchanged (so a fused QKV can rotate q and k only).
Tensor rope(const Tensor& x, int64_t head_dim, int64_t rotated_heads, int64_t pos0 = 0, RopeFreqs freqs = {});

// --- shapes (reshape/view share storage; the others copy into a new contiguous tensor)
/// One dimension may be -1 (inferred).
Tensor reshape(const Tensor& x, std::vector<int64_t> shape);
inline Tensor view(const Tensor& x, std::vector<int64_t> shape) { return reshape(x, std::move(shape)); }
Tensor permute(const Tensor& x, std::vector<int> perm);
Tensor transpose(const Tensor& x, int dim0, int dim1);
/// Elements [start, start+length) of dimension dim.
Tensor narrow(const Tensor& x, int dim, int64_t start, int64_t length);
/// Elements [start, end) of dimension dim; negative bounds count from the end.
Tensor slice(const Tensor& x, int dim, int64_t start, int64_t end);
/// Consecutive pieces of `size` along dim (the last may be shorter).
std::vector<Tensor> split(const Tensor& x, int64_t size, int dim);
Tensor concat(const std::vector<Tensor>& xs, int dim);
/// In place, outside the graph: dst[..., start : start + n, ...] = src along dim (n = src's size there, all
/// other dims equal). For buffers such as a key/value cache; dst must not require a gradient.
void write_slice(Tensor& dst, int dim, int64_t start, const Tensor& src);

}  // namespace tinygpt
