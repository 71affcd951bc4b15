// Scalar math that the CPU kernels and their CUDA twins share, written once for both compilers (as
// kernels/dropout_hash.h): GELU and its derivative, one AdamW update, the causal mask's extent. The CPU kernels
// call these with float and double; the CUDA kernels with float.
#pragma once

#include <cmath>
#include <cstdint>

#include "attention.h"
#include "dropout_hash.h"  // TINYGPT_HOST_DEVICE

namespace tinygpt {

TINYGPT_HOST_DEVICE inline float sqrt_of(float x) { return sqrtf(x); }
TINYGPT_HOST_DEVICE inline double sqrt_of(double x) { return sqrt(x); }

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

/// The factor dropout applies to a kept element: 1 / (1 - p), or 0 when p == 1 (nothing is kept).
template <class T>
TINYGPT_HOST_DEVICE inline T dropout_scale(float p) {
  return p < 1.0f ? T(1) / T(1.0f - p) : T(0);
}

}  // namespace tinygpt
