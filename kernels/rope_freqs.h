// The rotation frequencies of rotary positions (RoPE): pair i of a head's E features turns by pos * inv_freq(i),
// inv_freq(i) = base^(-2i/E), and Llama 3's rescaling of the slow pairs (transformers' rope_type "llama3"). One
// function for the CPU and CUDA kernels.
#pragma once

#include <cmath>
#include <cstdint>

#include "host_device.h"

namespace tinygpt {

/// Llama 3's rescaling (factor 1: none). A pair whose wavelength 2 pi / inv_freq is above original_context /
/// low_freq_factor turns `factor` times slower; one below original_context / high_freq_factor is kept; between, a
/// linear blend of the two in original_context / wavelength.
struct RopeScaling {
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_context = 8192.0;  // the context the model was first trained at
  // Spelled out: the CUDA sources are C++17.
  bool operator==(const RopeScaling& o) const {
    return factor == o.factor && low_freq_factor == o.low_freq_factor && high_freq_factor == o.high_freq_factor &&
           original_context == o.original_context;
  }
  bool operator!=(const RopeScaling& o) const { return !(*this == o); }
};

struct RopeFreqs {
  double base = 10000.0;
  RopeScaling scaling{};
  RopeFreqs() = default;
  RopeFreqs(double base) : base(base) {}  // NOLINT(google-explicit-constructor): a plain base is unscaled RoPE
  RopeFreqs(double base, const RopeScaling& scaling) : base(base), scaling(scaling) {}
};

/// The angle a position turns pair i of E features by, per position.
TINYGPT_HOST_DEVICE inline double rope_inv_freq(const RopeFreqs& f, int64_t i, int64_t E) {
  const double inv_freq = pow(f.base, -2.0 * double(i) / double(E));
  const RopeScaling& s = f.scaling;
  if (s.factor == 1.0) return inv_freq;
  const double wavelen = 2.0 * 3.14159265358979323846 / inv_freq;
  if (wavelen < s.original_context / s.high_freq_factor) return inv_freq;
  if (wavelen > s.original_context / s.low_freq_factor) return inv_freq / s.factor;
  const double smooth = (s.original_context / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  return (1.0 - smooth) * inv_freq / s.factor + smooth * inv_freq;
}

}  // namespace tinygpt
