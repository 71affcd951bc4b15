// GPU memory and device queries. Implemented in device.cu when the CUDA backend is built, and by
// cpu_only_stubs.cpp otherwise, so callers never need an #ifdef.
#pragma once

#include <cstddef>

namespace tinygpt::cuda {

/// Number of usable GPUs; 0 when none is present or the build has no CUDA backend.
int device_count();
/// True when this binary was built with the CUDA backend.
bool built_with_cuda();

void* malloc(size_t bytes);
void free(void* ptr);
void memset_zero(void* ptr, size_t bytes);
void copy_to_device(void* dst, const void* src, size_t bytes);
void copy_to_host(void* dst, const void* src, size_t bytes);
void copy_on_device(void* dst, const void* src, size_t bytes);

}  // namespace tinygpt::cuda
