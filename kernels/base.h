// What every layer shares, kernels and the CUDA backend included: the devices and the one error type. Apart from the
// dispatch table (kernels/kernels.h), so the CUDA backend's headers need not include that table, which includes them.
#pragma once

#include <cstdint>
#include <stdexcept>

namespace tinygpt {

enum class Device : uint8_t { CPU, CUDA };

/// True when the CUDA backend is compiled in (TINYGPT_HAS_CUDA is set by the build for every target).
inline constexpr bool kCudaBuilt = TINYGPT_HAS_CUDA;

inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

/// Thrown for every user-facing error of the library: the message names the op and the problem.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace tinygpt
