// Float math written so that loops over it vectorize (no libm calls): e^x, and the tanh GELU uses. Shared by the
// elementwise kernels and the GEMM's activation epilogue, so both compute the same values.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../scalar_math.h"

namespace tinygpt::cpu {

/// e^x in float without a libm call, so loops over it vectorize: e^x = 2^n e^r with n = round(x / ln 2) and
/// |r| <= ln(2) / 2, e^r by its degree-6 Taylor polynomial (truncation error below 1.3e-7 relative).
inline float exp_vec(float x) {
  x = std::clamp(x, -87.0f, 88.0f);
  const float n = std::floor(x * 1.44269504f + 0.5f);
  const float r = (x - n * 0.693145752f) - n * 1.42860677e-6f;  // ln 2 split in two for an exact product
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  return p * std::bit_cast<float>((int32_t(n) + 127) << 23);
}

/// tanh for GELU: libm's in double (gradient checks), 1 - 2 / (1 + e^2u) in float (vectorizes; absolute
/// error about 1e-7, which is what GELU's 0.5 x (1 + tanh) can see).
template <class T>
T gelu_tanh(T u) {
  if constexpr (std::is_same_v<T, float>) {
    return 1.0f - 2.0f / (1.0f + exp_vec(2.0f * u));
  } else {
    return std::tanh(u);
  }
}

/// act(x) and d act(x) / dx with the tanh above (the values the unary GELU kernels compute).
template <class T>
T activation_of(Activation act, T x) {
  return activation(act, x, [](T u) { return gelu_tanh(u); });
}
template <class T>
T activation_grad_of(Activation act, T x) {
  return activation_grad(act, x, [](T u) { return gelu_tanh(u); });
}

}  // namespace tinygpt::cpu
