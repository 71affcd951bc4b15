// A shared library opened on first use (dlopen by its soname, then from the toolkit's directory found at configure
// time), and TINYGPT_LAZY, which defines a function of its C API that forwards to its symbol. The CUDA backend calls
// cuBLAS, cuBLASLt and NCCL through these (kernels/cuda/lazy_cublas.cpp, lazy_nccl.cpp), so they are mapped only when
// a run uses them.
#pragma once

#include <dlfcn.h>
#include <fmt/format.h>

#include <mutex>
#include <string>

#include "../base.h"

#define TINYGPT_STR2(x) #x
#define TINYGPT_STR(x) TINYGPT_STR2(x)

namespace tinygpt::cuda {

class LazyLib {
 public:
  LazyLib(const char* soname, const char* dir, const char* name) : soname_(soname), dir_(dir), name_(name) {}

  /// The address of `symbol`, the library opened on the first call; throws naming the library and how to get it.
  void* symbol(const char* symbol) {
    std::call_once(once_, [&] {
      handle_ = ::dlopen(soname_, RTLD_NOW | RTLD_LOCAL);
      if (handle_ != nullptr) return;
      const char* why = ::dlerror();
      error_ = why != nullptr ? why : "not found";
      if (*dir_ != '\0') handle_ = ::dlopen(fmt::format("{}/{}", dir_, soname_).c_str(), RTLD_NOW | RTLD_LOCAL);
    });
    if (handle_ == nullptr) {
      throw Error(
          fmt::format("cannot load {} ({}: {}), which --device cuda needs: install the CUDA toolkit's {} or put "
                      "its directory on LD_LIBRARY_PATH, or run with --device cpu",
                      name_, soname_, error_, name_));
    }
    void* f = ::dlsym(handle_, symbol);
    if (f == nullptr)
      throw Error(
          fmt::format("{} ({}) has no {}: a different version than tinygpt was built with", name_, soname_, symbol));
    return f;
  }

 private:
  const char *soname_, *dir_, *name_;
  std::once_flag once_;
  void* handle_ = nullptr;
  std::string error_;
};

}  // namespace tinygpt::cuda

/// Defines `ret name params` with C linkage, forwarding `args` to the symbol of that name in `lib`.
#define TINYGPT_LAZY(lib, ret, name, params, args)                                    \
  extern "C" ret name params {                                                        \
    static const auto forward = reinterpret_cast<ret(*) params>((lib).symbol(#name)); \
    return forward args;                                                              \
  }
