// GPU memory and device queries. CUDA errors become tinygpt::Error naming the call that failed.
#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/device.h"
#include "kernels/kernels.h"

namespace tinygpt::cuda {
namespace {

void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess) throw Error(std::string(call) + ": " + cudaGetErrorString(status));
}

}  // namespace

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device" error
    return 0;
  }
  return n;
}

bool built_with_cuda() { return true; }

void* malloc(size_t bytes) {
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status == cudaErrorMemoryAllocation) {
    size_t free_bytes = 0, total = 0;
    cudaGetLastError();
    cudaMemGetInfo(&free_bytes, &total);
    throw Error("cudaMalloc: out of GPU memory: requested " + std::to_string(bytes) + " bytes, " +
                std::to_string(free_bytes) + " free of " + std::to_string(total));
  }
  check(status, "cudaMalloc");
  return ptr;
}

void free(void* ptr) { cudaFree(ptr); }

void memset_zero(void* ptr, size_t bytes) { check(cudaMemset(ptr, 0, bytes), "cudaMemset"); }

void copy_to_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
}

void copy_to_host(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
}

void copy_on_device(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpy (device to device)");
}

}  // namespace tinygpt::cuda
