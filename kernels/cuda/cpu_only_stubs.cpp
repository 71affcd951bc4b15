// Linked instead of the CUDA sources in a CPU-only build: every GPU request fails with a clear message.
#include "kernels/cuda/device.h"
#include "kernels/kernels.h"

namespace tinygpt::cuda {
namespace {

[[noreturn]] void unavailable() {
  throw Error("this tinygpt was built without CUDA (nvcc was not found at configure time); use --device cpu");
}

}  // namespace

int device_count() { return 0; }
bool built_with_cuda() { return false; }
void* malloc(size_t) { unavailable(); }
void free(void*) {}
void memset_zero(void*, size_t) { unavailable(); }
void copy_to_device(void*, const void*, size_t) { unavailable(); }
void copy_to_host(void*, const void*, size_t) { unavailable(); }
void copy_on_device(void*, const void*, size_t) { unavailable(); }

}  // namespace tinygpt::cuda
