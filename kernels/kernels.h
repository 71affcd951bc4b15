// Raw compute, no autograd. Every kernel is a {cpu, cuda} pair of function pointers with one signature;
// launch(kernel, device, args...) picks one. Conventions (llm.c style): outputs first, then inputs, then
// sizes; gradients carry a `d` prefix and backward kernels accumulate (+=) into them.
//
// Shape letters used in trailing comments across the project:
//   B  batch size           T  sequence length (queries)   S  sequence length (keys)
//   C  channels (n_embd)    NH number of heads             HS head size (C / NH)
//   V  vocabulary size      OC output channels             N  rows (often B*T)
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/cuda_kernels.h"

namespace tinygpt {

enum class Device : uint8_t { CPU, CUDA };

/// True when the CUDA backend is compiled in (TINYGPT_HAS_CUDA is set by the build for every target).
inline constexpr bool kCudaBuilt = TINYGPT_HAS_CUDA;

inline const char* device_name(Device d) { return d == Device::CPU ? "cpu" : "cuda"; }

/// Thrown for every user-facing error of the library: the message names the op and the problem.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class Fn>
struct Kernel {
  const char* name;
  Fn* cpu;
  Fn* cuda;  // nullptr: not available on the GPU (yet, or for this dtype)
};

/// Runs `k` on `device`, or throws naming the kernel when it has no implementation there.
template <class Fn, class... Args>
void launch(const Kernel<Fn>& k, Device device, Args&&... args) {
  Fn* f = device == Device::CPU ? k.cpu : k.cuda;
  if (f == nullptr) {
    throw Error(std::string(k.name) + ": no " + device_name(device) + " kernel for this dtype");
  }
  if (device == Device::CUDA && cuda::profiling()) {  // TINYGPT_CUDA_PROFILE=1: time each GPU kernel alone
    cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f(std::forward<Args>(args)...);
    cuda::synchronize();
    cuda::profile_add(k.name, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    return;
  }
  f(std::forward<Args>(args)...);
}

namespace kernels {

/// The CUDA kernel `f` for a table whose signature is Want: f when the backend is built and f has that
/// signature (the CUDA kernels are f32), else nullptr. Evaluated at compile time, so a CPU-only build never
/// references the CUDA symbols.
template <class Want, class Have>
constexpr Want* gpu(Have* f) {
  if constexpr (kCudaBuilt && std::is_same_v<Want, Have>) {
    return f;
  } else {
    return nullptr;
  }
}

// Kernel tables: {name, cpu, cuda}.
template <class T> inline constexpr Kernel<decltype(cpu::fill<T>)> fill{"fill", cpu::fill<T>, gpu<decltype(cpu::fill<T>)>(cuda::fill)};
template <class T> inline constexpr Kernel<decltype(cpu::axpy<T>)> axpy{"axpy", cpu::axpy<T>, gpu<decltype(cpu::axpy<T>)>(cuda::axpy)};
template <class T> inline constexpr Kernel<decltype(cpu::unary_forward<T>)> unary_forward{"unary_forward", cpu::unary_forward<T>, gpu<decltype(cpu::unary_forward<T>)>(cuda::unary_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::unary_backward<T>)> unary_backward{"unary_backward", cpu::unary_backward<T>, gpu<decltype(cpu::unary_backward<T>)>(cuda::unary_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::binary_forward<T>)> binary_forward{"binary_forward", cpu::binary_forward<T>, gpu<decltype(cpu::binary_forward<T>)>(cuda::binary_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::binary_backward<T>)> binary_backward{"binary_backward", cpu::binary_backward<T>, gpu<decltype(cpu::binary_backward<T>)>(cuda::binary_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::sum_forward<T>)> sum_forward{"sum_forward", cpu::sum_forward<T>, gpu<decltype(cpu::sum_forward<T>)>(cuda::sum_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::sum_backward<T>)> sum_backward{"sum_backward", cpu::sum_backward<T>, gpu<decltype(cpu::sum_backward<T>)>(cuda::sum_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::softmax_forward<T>)> softmax_forward{"softmax_forward", cpu::softmax_forward<T>, gpu<decltype(cpu::softmax_forward<T>)>(cuda::softmax_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::softmax_backward<T>)> softmax_backward{"softmax_backward", cpu::softmax_backward<T>, gpu<decltype(cpu::softmax_backward<T>)>(cuda::softmax_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::log_softmax_forward<T>)> log_softmax_forward{"log_softmax_forward", cpu::log_softmax_forward<T>, gpu<decltype(cpu::log_softmax_forward<T>)>(cuda::log_softmax_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::log_softmax_backward<T>)> log_softmax_backward{"log_softmax_backward", cpu::log_softmax_backward<T>, gpu<decltype(cpu::log_softmax_backward<T>)>(cuda::log_softmax_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::layernorm_forward<T>)> layernorm_forward{"layernorm_forward", cpu::layernorm_forward<T>, gpu<decltype(cpu::layernorm_forward<T>)>(cuda::layernorm_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::layernorm_backward<T>)> layernorm_backward{"layernorm_backward", cpu::layernorm_backward<T>, gpu<decltype(cpu::layernorm_backward<T>)>(cuda::layernorm_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::embedding_forward<T>)> embedding_forward{"embedding_forward", cpu::embedding_forward<T>, gpu<decltype(cpu::embedding_forward<T>)>(cuda::embedding_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::embedding_backward<T>)> embedding_backward{"embedding_backward", cpu::embedding_backward<T>, gpu<decltype(cpu::embedding_backward<T>)>(cuda::embedding_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::crossentropy_forward<T>)> crossentropy_forward{"crossentropy_forward", cpu::crossentropy_forward<T>, gpu<decltype(cpu::crossentropy_forward<T>)>(cuda::crossentropy_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::crossentropy_backward<T>)> crossentropy_backward{"crossentropy_backward", cpu::crossentropy_backward<T>, gpu<decltype(cpu::crossentropy_backward<T>)>(cuda::crossentropy_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::dropout_forward<T>)> dropout_forward{"dropout_forward", cpu::dropout_forward<T>, gpu<decltype(cpu::dropout_forward<T>)>(cuda::dropout_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::dropout_backward<T>)> dropout_backward{"dropout_backward", cpu::dropout_backward<T>, gpu<decltype(cpu::dropout_backward<T>)>(cuda::dropout_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::permute<T>)> permute{"permute", cpu::permute<T>, gpu<decltype(cpu::permute<T>)>(cuda::permute)};
template <class T> inline constexpr Kernel<decltype(cpu::copy_slice<T>)> copy_slice{"copy_slice", cpu::copy_slice<T>, gpu<decltype(cpu::copy_slice<T>)>(cuda::copy_slice)};
template <class T> inline constexpr Kernel<decltype(cpu::matmul_forward<T>)> matmul_forward{"matmul_forward", cpu::matmul_forward<T>, gpu<decltype(cpu::matmul_forward<T>)>(cuda::matmul_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::matmul_backward<T>)> matmul_backward{"matmul_backward", cpu::matmul_backward<T>, gpu<decltype(cpu::matmul_backward<T>)>(cuda::matmul_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::linear_forward<T>)> linear_forward{"linear_forward", cpu::linear_forward<T>, gpu<decltype(cpu::linear_forward<T>)>(cuda::linear_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::linear_backward<T>)> linear_backward{"linear_backward", cpu::linear_backward<T>, gpu<decltype(cpu::linear_backward<T>)>(cuda::linear_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::adamw_update<T>)> adamw_update{"adamw_update", cpu::adamw_update<T>, gpu<decltype(cpu::adamw_update<T>)>(cuda::adamw_update)};
template <class T> inline constexpr Kernel<decltype(cpu::rope_forward<T>)> rope_forward{"rope_forward", cpu::rope_forward<T>, gpu<decltype(cpu::rope_forward<T>)>(cuda::rope_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::rope_backward<T>)> rope_backward{"rope_backward", cpu::rope_backward<T>, gpu<decltype(cpu::rope_backward<T>)>(cuda::rope_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::attention_naive_forward<T>)> attention_naive_forward{"attention_naive_forward", cpu::attention_naive_forward<T>, gpu<decltype(cpu::attention_naive_forward<T>)>(cuda::attention_naive_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::attention_naive_backward<T>)> attention_naive_backward{"attention_naive_backward", cpu::attention_naive_backward<T>, gpu<decltype(cpu::attention_naive_backward<T>)>(cuda::attention_naive_backward)};
template <class T> inline constexpr Kernel<decltype(cpu::attention_flash_forward<T>)> attention_flash_forward{"attention_flash_forward", cpu::attention_flash_forward<T>, gpu<decltype(cpu::attention_flash_forward<T>)>(cuda::attention_flash_forward)};
template <class T> inline constexpr Kernel<decltype(cpu::attention_flash_backward<T>)> attention_flash_backward{"attention_flash_backward", cpu::attention_flash_backward<T>, gpu<decltype(cpu::attention_flash_backward<T>)>(cuda::attention_flash_backward)};

}  // namespace kernels
}  // namespace tinygpt
