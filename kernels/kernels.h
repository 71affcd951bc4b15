// Raw compute, no autograd. Every kernel is a {cpu, cuda} pair of function pointers with one signature;
// launch(kernel, device, args...) picks one. Conventions (llm.c style): outputs first, then inputs, then
// sizes; gradients carry a `d` prefix and backward kernels accumulate (+=) into them.
//
// Shape letters used in trailing comments across the project:
//   B  batch size           T  sequence length (queries)   S  sequence length (keys)
//   C  channels (n_embd)    NH number of heads             HS head size (C / NH)
//   V  vocabulary size      OC output channels             N  rows (often B*T)
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cpu/cpu_kernels.h"

namespace tinygpt {

enum class Device : uint8_t { CPU, CUDA };

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
  f(std::forward<Args>(args)...);
}

namespace kernels {

// Kernel tables. The cuda slots are filled in as the CUDA backend grows.
template <class T> inline constexpr Kernel<decltype(cpu::fill<T>)> fill{"fill", cpu::fill<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::axpy<T>)> axpy{"axpy", cpu::axpy<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::unary_forward<T>)> unary_forward{"unary_forward", cpu::unary_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::unary_backward<T>)> unary_backward{"unary_backward", cpu::unary_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::binary_forward<T>)> binary_forward{"binary_forward", cpu::binary_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::binary_backward<T>)> binary_backward{"binary_backward", cpu::binary_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::sum_forward<T>)> sum_forward{"sum_forward", cpu::sum_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::sum_backward<T>)> sum_backward{"sum_backward", cpu::sum_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::softmax_forward<T>)> softmax_forward{"softmax_forward", cpu::softmax_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::softmax_backward<T>)> softmax_backward{"softmax_backward", cpu::softmax_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::log_softmax_forward<T>)> log_softmax_forward{"log_softmax_forward", cpu::log_softmax_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::log_softmax_backward<T>)> log_softmax_backward{"log_softmax_backward", cpu::log_softmax_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::layernorm_forward<T>)> layernorm_forward{"layernorm_forward", cpu::layernorm_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::layernorm_backward<T>)> layernorm_backward{"layernorm_backward", cpu::layernorm_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::embedding_forward<T>)> embedding_forward{"embedding_forward", cpu::embedding_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::embedding_backward<T>)> embedding_backward{"embedding_backward", cpu::embedding_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::crossentropy_forward<T>)> crossentropy_forward{"crossentropy_forward", cpu::crossentropy_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::crossentropy_backward<T>)> crossentropy_backward{"crossentropy_backward", cpu::crossentropy_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::dropout_forward<T>)> dropout_forward{"dropout_forward", cpu::dropout_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::dropout_backward<T>)> dropout_backward{"dropout_backward", cpu::dropout_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::permute<T>)> permute{"permute", cpu::permute<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::copy_slice<T>)> copy_slice{"copy_slice", cpu::copy_slice<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::matmul_forward<T>)> matmul_forward{"matmul_forward", cpu::matmul_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::matmul_backward<T>)> matmul_backward{"matmul_backward", cpu::matmul_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::linear_forward<T>)> linear_forward{"linear_forward", cpu::linear_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::linear_backward<T>)> linear_backward{"linear_backward", cpu::linear_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::adamw_update<T>)> adamw_update{"adamw_update", cpu::adamw_update<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::rope_forward<T>)> rope_forward{"rope_forward", cpu::rope_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::rope_backward<T>)> rope_backward{"rope_backward", cpu::rope_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::attention_naive_forward<T>)> attention_naive_forward{"attention_naive_forward", cpu::attention_naive_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::attention_naive_backward<T>)> attention_naive_backward{"attention_naive_backward", cpu::attention_naive_backward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::attention_flash_forward<T>)> attention_flash_forward{"attention_flash_forward", cpu::attention_flash_forward<T>, nullptr};
template <class T> inline constexpr Kernel<decltype(cpu::attention_flash_backward<T>)> attention_flash_backward{"attention_flash_backward", cpu::attention_flash_backward<T>, nullptr};

}  // namespace kernels
}  // namespace tinygpt
