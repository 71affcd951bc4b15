// Helpers shared by the CUDA kernel files (not a public header): error checks, launch sizes, warp
// reductions, scratch buffers from the caching allocator, and the cuBLAS handles.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/device.h"
#include "kernels/kernels.h"

namespace tinygpt::cuda {

/// Throws Error("<what>: <CUDA's message>") when status is not success.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);
/// After a kernel launch: throws naming the kernel when the launch failed (bad configuration, no image for
/// this GPU, or an earlier asynchronous error).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

/// The current GPU's properties, read once.
const cudaDeviceProp& properties();

cublasHandle_t cublas();
cublasLtHandle_t cublaslt();
/// A workspace for cublasLt, allocated once.
void* cublaslt_workspace(size_t* bytes);

inline constexpr int kThreads = 256;

inline unsigned blocks_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(b < 1 ? 1 : (b > (int64_t(1) << 30) ? (int64_t(1) << 30) : b));
}

/// Grid-stride loop over [0, n).
#define TINYGPT_CUDA_LOOP(i, n) \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); i += int64_t(blockDim.x) * gridDim.x)

__device__ inline float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ inline float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

/// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ inline float block_sum(float x) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  x = warp_sum(x);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < warps ? partial[lane] : 0.0f;
  return warp_sum(x);
}

/// Device scratch memory for the duration of one kernel call, back to the cache at scope exit.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : ptr_(bytes ? cuda::malloc(bytes) : nullptr) {}
  ~Scratch() { if (ptr_) cuda::free(ptr_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T> T* as() const { return static_cast<T*>(ptr_); }

 private:
  void* ptr_;
};

}  // namespace tinygpt::cuda
