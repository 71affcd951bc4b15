// Raw compute, no autograd. Every kernel is a {cpu, cuda} pair of function pointers with one signature (checked
// at compile time below); launch(kernel, device, args...) picks one. Conventions (llm.c style): outputs first, then
// inputs, then sizes; gradients carry a `d` prefix and backward kernels accumulate (+=) into them, except where an
// `overwrite` flag asks them to write (=) one (a gradient slot not yet written: autograd's Node::writes_unwritten).
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
#include "cuda/cuda_kernels.h"
#include "device.h"
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

/// The storage types a kernel takes (bits of kF32 | kF64 | kBf16; kPlain, none, for a plain function): the list of its
/// cpu::<name><T> instantiations. An op that launches kernels::<name><T> for a T its line in kernels/kernel_list.h
/// does not list fails to compile (storage_checked), and a kernel's .cpp instantiates every type its line lists (a
/// missing one fails to link).
inline constexpr unsigned kPlain = 0, kF32 = 1, kF64 = 2, kBf16 = 4;
inline constexpr unsigned kFloats = kF32 | kF64;

template <class T>
constexpr unsigned storage_bit() {
  if constexpr (std::is_same_v<T, float>)
    return kF32;
  else if constexpr (std::is_same_v<T, double>)
    return kF64;
  else if constexpr (std::is_same_v<T, bf16>)
    return kBf16;
  else
    return 0;
}

template <class T, unsigned Takes, class K>
constexpr K storage_checked(K k) {
  static_assert((Takes & storage_bit<T>()) != 0,
                "this kernel does not take this storage type: kernels/kernel_list.h lists the types each kernel takes");
  return k;
}

// The table, one entry per line of the list in kernels/kernel_list.h: kernels::name<T> for each storage type T its
// line takes (kernels::name for a plain one). cpu::name<float> and cuda::name must have one signature (checked here in
// every build: only the declarations are compared, so a CPU-only build checks them too; both are declared from the
// one parameter list, so this fails only if the list's forms are wrong). A CUDA definition that drifts from its
// declaration is another overload, which fails the compile of its .cu file (CUDA builds) and of
// tests/test_cuda_emulated.cpp (every build). The GPU slot of f64, and of any T but f32 for an F32 kernel, is empty:
// launching one there throws naming the kernel.
#define TINYGPT_KERNEL_ENTRY(name, takes, gpu) TINYGPT_KERNEL_##gpu(name, takes)

/// F32: cuda::name is one f32 function.
#define TINYGPT_KERNEL_F32(name, takes)                                                                \
  static_assert(std::is_same_v<decltype(cpu::name<float>), decltype(cuda::name)>,                      \
                "cpu::" #name " and cuda::" #name " must have one signature (kernels/kernel_list.h)"); \
  template <class T>                                                                                   \
  inline constexpr Kernel<decltype(cpu::name<T>)> name = storage_checked<T, takes>(                    \
      Kernel<decltype(cpu::name<T>)>{#name, cpu::name<T>, gpu_slot<decltype(cpu::name<T>)>(cuda::name)});

/// TEMPLATE: cuda::name<T> runs every storage type T the line lists but f64 (f32 and bf16). Its .cu file instantiates
/// each of them: a missing one fails to link.
#define TINYGPT_KERNEL_TEMPLATE(name, takes)                                                           \
  static_assert(std::is_same_v<decltype(cpu::name<float>), decltype(cuda::name<float>)>,               \
                "cpu::" #name " and cuda::" #name " must have one signature (kernels/kernel_list.h)"); \
  template <class T>                                                                                   \
  inline constexpr Kernel<decltype(cpu::name<T>)> name = storage_checked<T, takes>(                    \
      Kernel<decltype(cpu::name<T>)>{#name, cpu::name<T>, gpu_template_slot<T>(cuda::name<T>)});

/// PLAIN: one function on each side (a conversion between storage types, or bf16 attention).
#define TINYGPT_KERNEL_PLAIN(name, takes)                                      \
  static_assert(std::is_same_v<decltype(cpu::name), decltype(cuda::name)>,     \
                "cpu::" #name " and cuda::" #name " must have one signature"); \
  inline constexpr Kernel<decltype(cpu::name)> name{#name, cpu::name, gpu_slot<decltype(cpu::name)>(cuda::name)};

TINYGPT_KERNELS(TINYGPT_KERNEL_ENTRY)

#undef TINYGPT_KERNEL_PLAIN
#undef TINYGPT_KERNEL_TEMPLATE
#undef TINYGPT_KERNEL_F32
#undef TINYGPT_KERNEL_ENTRY

}  // namespace kernels
}  // namespace tinygpt
