// Raw compute, no autograd. Every kernel is a {cpu, cuda} pair of function pointers with one signature (checked
// at compile time below); launch(kernel, device, args...) picks one. Conventions (llm.c style): outputs first, then inputs, then
// sizes; gradients carry a `d` prefix and backward kernels accumulate (+=) into them, except where an `overwrite`
// flag asks them to write (=) one (a gradient slot not yet written: autograd's Node::writes_unwritten).
//
// The one legend of shape letters, for names and trailing comments across the project:
//   B   batch size             T   sequence length (queries)    S   sequence length (keys and values)
//   C   channels (n_embd)      OC  output channels              N   rows (often B*T)
//   V   vocabulary size        NH  query heads                  NKV key/value heads (NH / NKV queries share one)
//   E   head size of queries and keys (C / NH in a GPT)         Ev  head size of values
//   L   a sequence length passed to a CPU kernel template (T or S there: T names the element type)
//   D   the dimension reduced over (sum: inp (outer, D, inner))
#pragma once

#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "base.h"
#include "bf16.h"
#include "cpu/cpu_kernels.h"
#include "device.h"
#include "cuda/cuda_kernels.h"
#include "profile.h"

namespace tinygpt {

template <class Fn>
struct Kernel {
  const char* name;
  Fn* cpu;
  Fn* cuda;  // nullptr: no GPU kernel (f64, or a build without the CUDA backend)
};

/// Runs `k` on `device`, or throws naming the kernel when it has no implementation there.
template <class Fn, class... Args>
void launch(const Kernel<Fn>& k, Device device, Args&&... args) {
  Fn* f = device == Device::CPU ? k.cpu : k.cuda;
  if (f == nullptr) {
    throw Error(std::string(k.name) + ": no " + device_name(device) + " kernel for this dtype");
  }
  // TINYGPT_CUDA_PROFILE=1 times each GPU kernel alone (synchronized around it); TINYGPT_PROFILE=1 each CPU kernel,
  // which runs synchronously anyway.
  const bool gpu = device == Device::CUDA;
  if (gpu ? cuda::profiling() : profile::enabled()) {
    if (gpu) cuda::synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f(std::forward<Args>(args)...);
    if (gpu) cuda::synchronize();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    gpu ? cuda::profile_add(k.name, ms) : profile::add_kernel(k.name, ms);
    return;
  }
  f(std::forward<Args>(args)...);
}

namespace kernels {

/// The GPU slot of a kernel table whose signature is Want: the CUDA kernel when the backend is built and Want is
/// its (f32) signature; nullptr for f64, which has no CUDA kernels. Evaluated at compile time, so a CPU-only
/// build never references the CUDA symbols.
template <class Want, class Have>
constexpr Want* gpu_slot(Have* f) {
  if constexpr (kCudaBuilt && std::is_same_v<Want, Have>) {
    return f;
  } else {
    return nullptr;
  }
}

/// The GPU slot of a kernel whose CUDA side is a template like its CPU side: cuda::name<T> for every storage type but
/// f64 (nullptr in a CPU-only build and for f64).
template <class T, class Fn>
constexpr Fn* gpu_template_slot(Fn* f) {
  if constexpr (kCudaBuilt && !std::is_same_v<T, double>) {
    return f;
  } else {
    return nullptr;
  }
}

/// The storage types a kernel takes (bits of kF32 | kF64 | kBf16): the list of its cpu::<name><T> instantiations. An
/// op that launches kernels::<name><T> for a T its line below does not list fails to compile (storage_checked), and
/// a kernel's .cpp instantiates every type its line lists (a missing one fails to link).
inline constexpr unsigned kF32 = 1, kF64 = 2, kBf16 = 4;
inline constexpr unsigned kFloats = kF32 | kF64;

template <class T>
constexpr unsigned storage_bit() {
  if constexpr (std::is_same_v<T, float>) return kF32;
  else if constexpr (std::is_same_v<T, double>) return kF64;
  else if constexpr (std::is_same_v<T, bf16>) return kBf16;
  else return 0;
}

template <class T, unsigned Takes, class K>
constexpr K storage_checked(K k) {
  static_assert((Takes & storage_bit<T>()) != 0,
                "this kernel does not take this storage type: kernels/kernels.h lists the types each kernel takes");
  return k;
}

// One declaration per kernel pair: cpu::name<float> and cuda::name must have the same signature (checked here, in
// every build: only the declarations are compared, so a CPU-only build checks them too), and the table's
// signature is that one at element type T, for each storage type T the line lists. A CUDA definition that drifts
// from its declaration in kernels/cuda/cuda_kernels.h is another overload, which fails the compile of its .cu file
// (CUDA builds) and of tests/test_cuda_emulated.cpp (every build). These CUDA kernels are f32 (the GPU slot of any
// other T is empty: launching one there throws naming the kernel).
#define TINYGPT_KERNEL_PAIR(name, takes)                                                                       \
  static_assert(std::is_same_v<decltype(cpu::name<float>), decltype(cuda::name)>,                             \
                "cpu::" #name " and cuda::" #name " must have one signature (kernels/cpu/cpu_kernels.h and "   \
                "kernels/cuda/cuda_kernels.h)");                                                               \
  template <class T>                                                                                          \
  inline constexpr Kernel<decltype(cpu::name<T>)> name = storage_checked<T, takes>(                            \
      Kernel<decltype(cpu::name<T>)>{#name, cpu::name<T>, gpu_slot<decltype(cpu::name<T>)>(cuda::name)});

/// A pair whose CUDA side is a template too (kernels/cuda/cuda_kernels.h): cuda::name<T> runs every storage type T the
/// line lists but f64 (f32 and bf16). Its .cu file instantiates each of them: a missing one fails to link.
#define TINYGPT_KERNEL_TEMPLATE_PAIR(name, takes)                                                              \
  static_assert(std::is_same_v<decltype(cpu::name<float>), decltype(cuda::name<float>)>,                      \
                "cpu::" #name " and cuda::" #name " must have one signature (kernels/cpu/cpu_kernels.h and "   \
                "kernels/cuda/cuda_kernels.h)");                                                               \
  template <class T>                                                                                          \
  inline constexpr Kernel<decltype(cpu::name<T>)> name = storage_checked<T, takes>(                            \
      Kernel<decltype(cpu::name<T>)>{#name, cpu::name<T>, gpu_template_slot<T>(cuda::name<T>)});

/// A pair that is not a template (a conversion between storage types).
#define TINYGPT_KERNEL_PAIR_PLAIN(name)                                                                        \
  static_assert(std::is_same_v<decltype(cpu::name), decltype(cuda::name)>,                                    \
                "cpu::" #name " and cuda::" #name " must have one signature");                                 \
  inline constexpr Kernel<decltype(cpu::name)> name{#name, cpu::name, gpu_slot<decltype(cpu::name)>(cuda::name)};

TINYGPT_KERNEL_PAIR_PLAIN(round_to_bf16)
TINYGPT_KERNEL_PAIR_PLAIN(widen_bf16)
TINYGPT_KERNEL_PAIR_PLAIN(accumulate_bf16)
TINYGPT_KERNEL_PAIR(fill, kFloats)
TINYGPT_KERNEL_TEMPLATE_PAIR(axpy, kFloats | kBf16)
TINYGPT_KERNEL_PAIR(axpby, kFloats)
TINYGPT_KERNEL_PAIR(axpby_indirect, kFloats)
TINYGPT_KERNEL_TEMPLATE_PAIR(unary_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(unary_backward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(binary_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(binary_backward, kFloats | kBf16)
TINYGPT_KERNEL_PAIR(sum_forward, kFloats)
TINYGPT_KERNEL_PAIR(sum_backward, kFloats)
TINYGPT_KERNEL_PAIR(sum_squares, kFloats)
TINYGPT_KERNEL_PAIR(softmax_forward, kFloats)
TINYGPT_KERNEL_PAIR(softmax_backward, kFloats)
TINYGPT_KERNEL_PAIR(log_softmax_forward, kFloats)
TINYGPT_KERNEL_PAIR(log_softmax_backward, kFloats)
TINYGPT_KERNEL_TEMPLATE_PAIR(layernorm_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(add_layernorm_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(layernorm_backward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(embedding_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(embedding_backward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(crossentropy_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(crossentropy_backward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(crossentropy_fused, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(dropout_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(dropout_backward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(permute, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(copy_slice, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(matmul_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(matmul_backward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(linear_forward, kFloats | kBf16)
TINYGPT_KERNEL_TEMPLATE_PAIR(linear_backward, kFloats | kBf16)
TINYGPT_KERNEL_PAIR(adamw_update, kFloats)
TINYGPT_KERNEL_PAIR(adamw_update_indirect, kFloats)
TINYGPT_KERNEL_PAIR(rope_forward, kFloats)
TINYGPT_KERNEL_PAIR(rope_backward, kFloats)
TINYGPT_KERNEL_PAIR(attention_naive_forward, kFloats)
TINYGPT_KERNEL_PAIR(attention_naive_backward, kFloats)
TINYGPT_KERNEL_PAIR(attention_flash_forward, kFloats)
TINYGPT_KERNEL_PAIR(attention_flash_backward, kFloats)
TINYGPT_KERNEL_PAIR_PLAIN(attention_flash_forward_bf16)
TINYGPT_KERNEL_PAIR_PLAIN(attention_flash_backward_bf16)

#undef TINYGPT_KERNEL_PAIR_PLAIN
#undef TINYGPT_KERNEL_TEMPLATE_PAIR
#undef TINYGPT_KERNEL_PAIR

}  // namespace kernels
}  // namespace tinygpt
