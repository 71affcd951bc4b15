// bfloat16 as a storage type: the top 16 bits of an IEEE f32 (8-bit exponent, 8-bit mantissa with the implicit one).
// One definition of the rounding for every compiler and device: nearest, ties to even, as PyTorch, the tensor cores
// and AVX512-BF16 round; a NaN stays NaN (quieted), overflow goes to infinity.
//
// `bf16` converts to float implicitly and from float implicitly (rounding), as PyTorch's c10::BFloat16 does, so a
// kernel templated on its storage type reads `float(x[i])` and writes `out[i] = f(...)`. It has no arithmetic or
// compound assignment of its own: `a * b` computes in float, and a sum kept in a `bf16` (`acc += x`) does not
// compile, so accumulators are float by construction (compute_t<bf16> is float).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "host_device.h"

namespace tinygpt {

/// The bf16 bit pattern of x rounded to nearest, ties to even; NaN quieted.
TINYGPT_HOST_DEVICE inline uint16_t bf16_bits_of(float x) {
#if defined(__CUDA_ARCH__)
  const uint32_t u = __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
#endif
  // A select rather than a branch, so loops over it vectorize.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16, quiet_nan = (u >> 16) | 0x0040u;
  return uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

/// The float whose top half is `bits` (exact).
TINYGPT_HOST_DEVICE inline float float_of_bf16_bits(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

struct bf16 {
  uint16_t bits;

  bf16() = default;
  TINYGPT_HOST_DEVICE bf16(float x) : bits(bf16_bits_of(x)) {}  // NOLINT: implicit, rounds (c10::BFloat16 too)
  TINYGPT_HOST_DEVICE bf16(double x) : bf16(float(x)) {}        // NOLINT: through float, as T(double) does
  TINYGPT_HOST_DEVICE operator float() const { return float_of_bf16_bits(bits); }  // NOLINT: exact

  TINYGPT_HOST_DEVICE static bf16 from_bits(uint16_t b) {
    bf16 x;
    x.bits = b;
    return x;
  }
};
static_assert(sizeof(bf16) == 2 && std::is_trivially_copyable_v<bf16>, "bf16 is two bytes, copied as bytes");

/// x rounded to bf16 and back: the value a bf16 tensor holds for x.
TINYGPT_HOST_DEVICE inline float round_bf16(float x) { return float_of_bf16_bits(bf16_bits_of(x)); }

/// The type a kernel computes in for storage type T: f32 for bf16, T itself for float and double.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, bf16>, float, T>;

}  // namespace tinygpt
