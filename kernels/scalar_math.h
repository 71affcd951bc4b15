// Scalar math that the CPU kernels and their CUDA twins share, written once for both compilers (as
// kernels/dropout_hash.h): GELU and its derivative, SwiGLU and its gradients, one AdamW update, the extent of the
// causal mask and window, the score modifiers' per-element terms. The CPU kernels call these with float and double; the
// CUDA kernels with float.
#pragma once

#include <cmath>
#include <cstdint>

#include "attention.h"
#include "geometry.h"
#include "host_device.h"

namespace tinygpt {

TINYGPT_HOST_DEVICE inline float sqrt_of(float x) { return sqrtf(x); }
TINYGPT_HOST_DEVICE inline double sqrt_of(double x) { return ::sqrt(x); }
TINYGPT_HOST_DEVICE inline float tanh_of(float x) { return tanhf(x); }
TINYGPT_HOST_DEVICE inline double tanh_of(double x) { return ::tanh(x); }

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
inline constexpr double kGeluScale = 0.7978845608028654;  // sqrt(2 / pi)
inline constexpr double kGeluCubic = 0.044715;

/// GELU of x, with `tanh` the caller's (the CPU's float loops use one that vectorizes).
template <class T, class Tanh>
TINYGPT_HOST_DEVICE inline T gelu(T x, Tanh tanh) {
  return T(0.5) * x * (T(1) + tanh(T(kGeluScale) * (x + T(kGeluCubic) * x * x * x)));
}

/// d gelu(x) / dx.
template <class T, class Tanh>
TINYGPT_HOST_DEVICE inline T gelu_grad(T x, Tanh tanh) {
  const T t = tanh(T(kGeluScale) * (x + T(kGeluCubic) * x * x * x));
  const T du = T(kGeluScale) * (T(1) + T(3) * T(kGeluCubic) * x * x);
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * du;
}

/// act(x), with `tanh` the caller's (for GELU).
template <class T, class Tanh>
TINYGPT_HOST_DEVICE inline T activation(Activation act, T x, Tanh tanh) {
  if (act == Activation::Gelu) return gelu(x, tanh);
  if (act == Activation::ReluSquared) return x > T(0) ? x * x : T(0);
  return x;
}

/// d act(x) / dx.
template <class T, class Tanh>
TINYGPT_HOST_DEVICE inline T activation_grad(Activation act, T x, Tanh tanh) {
  if (act == Activation::Gelu) return gelu_grad(x, tanh);
  if (act == Activation::ReluSquared) return x > T(0) ? T(2) * x : T(0);
  return T(1);
}

/// sigmoid(g) from e = exp(-|g|) in (0, 1]: 1 / (1 + e) for g >= 0, e / (1 + e) below. Never a denormal nor an
/// overflow on the way (the form g / (1 + exp(-g)) made GCC divide speculatively into denormals, 5x slower), and the
/// same for both compilers.
template <class T, class Exp>
TINYGPT_HOST_DEVICE inline T sigmoid_of(T g, Exp exp) {
  const T e = exp(g < T(0) ? g : -g);
  return (g >= T(0) ? T(1) : e) / (T(1) + e);
}

/// SwiGLU of a gate g and an up value u: silu(g) u, silu(g) = g sigmoid(g), with `exp` the caller's (the CPU's float
/// loops use one that vectorizes).
template <class T, class Exp>
TINYGPT_HOST_DEVICE inline T swiglu(T g, T u, Exp exp) {
  return g * sigmoid_of(g, exp) * u;
}

/// The gradients of swiglu(g, u) times d: dg = d u sigmoid(g) (1 + g (1 - sigmoid(g))), du = d silu(g).
template <class T, class Exp>
TINYGPT_HOST_DEVICE inline void swiglu_grad(T g, T u, T d, T& dg, T& du, Exp exp) {
  const T sig = sigmoid_of(g, exp);
  du = d * g * sig;
  dg = d * u * sig * (T(1) + g * (T(1) - sig));
}

/// True for a number that is neither infinite nor NaN (x - x is NaN for both), the same on both compilers.
TINYGPT_HOST_DEVICE inline bool is_finite(double x) { return x - x == 0.0; }

/// The factor that clips a gradient of L2 norm `norm` to max_norm: max_norm / (norm + 1e-6) above it, 1 at or below
/// it or when max_norm is 0 (no clipping). AdamW applies it as it reads the gradient.
TINYGPT_HOST_DEVICE inline double clip_factor(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / (norm + 1e-6) : 1.0;
}

/// clip_factor of a gradient whose squares sum to sum_squares.
TINYGPT_HOST_DEVICE inline double clip_scale(double sum_squares, double max_norm) {
  return clip_factor(sqrt_of(sum_squares), max_norm);
}

/// AdamW's bias correction 1 / (1 - beta^step), in double.
inline double adamw_correction(float beta, int64_t step) { return 1.0 / (1.0 - std::pow(double(beta), double(step))); }

/// One AdamW update of one parameter: moments, then the bias-corrected step with decoupled weight decay.
/// c1 and c2 are adamw_correction(beta1, step) and adamw_correction(beta2, step).
template <class T>
TINYGPT_HOST_DEVICE inline void adamw_element(T& param, T grad, T& m, T& v, float lr, float beta1, float beta2,
                                              float eps, float weight_decay, T c1, T c2) {
  m = T(beta1) * m + T(1.0f - beta1) * grad;
  v = T(beta2) * v + T(1.0f - beta2) * grad * grad;
  const T update = (m * c1) / (sqrt_of(v * c2) + T(eps));
  param -= T(lr) * (update + T(weight_decay) * param);
}

/// One past the last key query t sees under the causal mask, aligned bottom-right (every key when not causal).
TINYGPT_HOST_DEVICE inline int64_t causal_end(const AttentionGeom& g, int64_t t) {
  if (!g.causal) return g.S;
  const int64_t end = t + g.S - g.T + 1;
  return end < 0 ? 0 : (end > g.S ? g.S : end);
}

/// The keys query t can see by position, causal mask and window together: [key_begin(g, t), key_end(g, t)).
/// Both grow with t, so a tile of queries [t0, t1] sees at most keys [key_begin(g, t0), key_end(g, t1)).
TINYGPT_HOST_DEVICE inline int64_t key_end(const AttentionGeom& g, int64_t t) {
  int64_t end = causal_end(g, t);
  if (g.mods.window > 0 && !g.causal) {
    const int64_t w = t + g.S - g.T + g.mods.window;  // |d| < window
    end = w < end ? (w < 0 ? 0 : w) : end;
  }
  return end;
}
TINYGPT_HOST_DEVICE inline int64_t key_begin(const AttentionGeom& g, int64_t t) {
  if (g.mods.window <= 0) return 0;
  const int64_t begin = t + g.S - g.T - g.mods.window + 1;
  return begin < 0 ? 0 : (begin > g.S ? g.S : begin);
}

/// The queries that can see key s by position: [query_begin(g, s), query_end(g, s)), both growing with s.
TINYGPT_HOST_DEVICE inline int64_t query_begin(const AttentionGeom& g, int64_t s) {
  int64_t begin = 0;
  if (g.causal) begin = s - (g.S - g.T);                                            // tq >= s
  if (g.mods.window > 0 && !g.causal) begin = s - (g.S - g.T) - g.mods.window + 1;  // tq > s - window
  return begin < 0 ? 0 : (begin > g.T ? g.T : begin);
}
TINYGPT_HOST_DEVICE inline int64_t query_end(const AttentionGeom& g, int64_t s) {
  if (g.mods.window <= 0) return g.T;
  const int64_t end = s - (g.S - g.T) + g.mods.window;  // tq < s + window
  return end < 0 ? 0 : (end > g.T ? g.T : end);
}

/// Whether query t sees key s by position (causal, window) and document; padding and the additive mask aside.
TINYGPT_HOST_DEVICE inline bool mods_visible(const AttentionGeom& g, int64_t b, int64_t t, int64_t s) {
  if (s < key_begin(g, t) || s >= key_end(g, t)) return false;
  return g.mods.q_doc == nullptr || g.mods.q_doc[b * g.T + t] == g.mods.k_doc[b * g.S + s];
}

/// Whether a call has a bias of (head, distance) after the cap: what position_bias adds (the CPU tabulates it).
TINYGPT_HOST_DEVICE inline bool has_position_bias(const ScoreMods& m) { return m.alibi || m.t5_bias != nullptr; }

/// The biases added after the cap for distance d = s - (t + S - T) in head h: ALiBi and T5 (kernels/score_mods.h).
template <class T>
TINYGPT_HOST_DEVICE inline T position_bias(const AttentionGeom& g, int64_t h, int64_t d) {
  const ScoreMods& m = g.mods;
  T bias = 0;
  if (m.alibi) bias -= T(alibi_slope(h, g.NH)) * T(d < 0 ? -d : d);
  if (m.t5_bias) {
    bias += static_cast<const T*>(
        m.t5_bias)[h * m.t5_buckets + t5_bucket(d, m.t5_buckets, m.t5_max_distance, m.t5_bidirectional)];
  }
  return bias;
}

/// tanh for modified_score's scalar callers (the CPU's vectors pass their own).
struct ScalarTanh {
  template <class T>
  TINYGPT_HOST_DEVICE T operator()(T x) const {
    return tanh_of(x);
  }
};

/// The score modifiers' arithmetic on a logit, written once for every kernel: the CPU's scalars (naive kernels) and
/// vectors (ModTile, V a Vec of S) and the GPU's floats. The raw product x (Shaw's R term added) is scaled, soft-capped
/// (cap tanh(y / cap) when cap > 0, kept in `capped`, which the gradient needs) and biased (position_bias, after the
/// cap). Masks stay with the callers, who set hidden logits to -inf.
template <class V, class S, class Tanh>
TINYGPT_HOST_DEVICE inline V modified_score(V x, V bias, S scale, S cap, Tanh tanh, V& capped) {
  capped = x * scale;
  if (cap > S(0)) capped = cap * tanh(capped * (S(1) / cap));
  return capped + bias;
}

/// The raw product's gradient from the logit's, the chain back through modified_score: times the scale and the
/// soft-cap's derivative, d(cap tanh(y / cap))/dy = 1 - (capped / cap)^2.
template <class V, class S>
TINYGPT_HOST_DEVICE inline V modified_score_grad(V dlogit, V capped, S scale, S cap) {
  V ds = dlogit * scale;
  if (cap > S(0)) {
    const V r = capped * (S(1) / cap);
    ds = ds * (S(1) - r * r);
  }
  return ds;
}

/// Row of query t of head (b, h) in a (B, NH, T, ...) array: lse, D, and Shaw's (B, NH, T, 2m + 1) rows.
TINYGPT_HOST_DEVICE inline int64_t head_row(const AttentionGeom& g, int64_t b, int64_t h, int64_t t) {
  return (b * g.NH + h) * g.T + t;
}

/// The logit of (t, s) with score modifiers on, from its raw product qk: -inf where the key is hidden (out of range,
/// by position, document or padding), else modified_score of qk plus Shaw's R (rows R, (B, NH, T, 2m + 1), or null),
/// with `bias` = position_bias(g, h, s - tq), plus the additive mask (or null). The element form every kernel shares:
/// the CPU's naive kernels and the GPU's call it; the CPU tiles run modified_score on whole rows.
template <class T>
TINYGPT_HOST_DEVICE inline T modified_logit(const AttentionGeom& g, const uint8_t* kp, const T* mask, const T* R,
                                            int64_t b, int64_t h, int64_t t, int64_t s, T qk, T bias, T& capped) {
  if (!(t < g.T && s < g.S) || !mods_visible(g, b, t, s) || (kp && kp[b * g.S + s])) return T(-INFINITY);
  if (R) qk += R[head_row(g, b, h, t) * g.mods.rel_width() + rel_column(s - (t + g.S - g.T), g.mods.max_rel)];
  const T logit = modified_score(qk, bias, T(g.scale), T(g.mods.softcap), ScalarTanh{}, capped);
  if (!mask) return logit;
  return logit + mask[b * g.mask_stride[0] + h * g.mask_stride[1] + t * g.mask_stride[2] + s * g.mask_stride[3]];
}

/// dP of (t, s) from dO_t . v_s with score modifiers on: plus Shaw's G rows on the value side (G = dO A_V^T, or null).
template <class T>
TINYGPT_HOST_DEVICE inline T modified_dp(const AttentionGeom& g, const T* G, int64_t b, int64_t h, int64_t t, int64_t s,
                                         T dov) {
  if (!G) return dov;
  return dov + G[head_row(g, b, h, t) * g.mods.rel_width() + rel_column(s - (t + g.S - g.T), g.mods.max_rel)];
}

/// The factor dropout applies to a kept element: 1 / (1 - p), or 0 when p == 1 (nothing is kept).
template <class T>
TINYGPT_HOST_DEVICE inline T dropout_scale(float p) {
  return p < 1.0f ? T(1) / T(1.0f - p) : T(0);
}

}  // namespace tinygpt
