// The real backend's runtime under the kernel headers (not a public header): error checks, device properties,
// scratch buffers from the caching allocator, cuBLAS handles and the cuBLAS products. tests/emulated_cuda.h
// provides the same names on the host.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/base.h"
#include "kernels/cuda/cuda_kernels.h"  // Epilogue, MatmulMath
#include "kernels/device.h"

namespace tinygpt::cuda {

/// Throws Error("<what>: <CUDA's message>") when status is not success.
void check(cudaError_t status, const char* what);
void check(cublasStatus_t status, const char* what);
/// After a kernel launch: throws naming the kernel when the launch failed (bad configuration, no image for
/// this GPU, or an earlier asynchronous error).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

/// The stream all of this process's GPU work is queued on: created once, blocking (ordered with the legacy default
/// stream, as that stream's own work would be), and, unlike the legacy stream, one that a CUDA graph can capture.
cudaStream_t stream();

/// The current GPU's properties, read once.
const cudaDeviceProp& properties();

cublasHandle_t cublas();
cublasLtHandle_t cublaslt();
/// A workspace for cublasLt, allocated once.
void* cublaslt_workspace(size_t* bytes);

/// Under TINYGPT_CUDA_PROFILE=1 (and not capturing a graph), the GPU time of the work queued during its scope goes to
/// the per-kernel table under `what`: an event recorded on the stream at each end, read at the next profile_add.
/// Nothing otherwise.
class ProfiledRegion {
 public:
  explicit ProfiledRegion(const char* what) {
    if (profiling() && !capturing()) begin(what);
  }
  ~ProfiledRegion() {
    if (start_) end();
  }
  ProfiledRegion(const ProfiledRegion&) = delete;
  ProfiledRegion& operator=(const ProfiledRegion&) = delete;

 private:
  void begin(const char* what);
  void end();
  const char* what_ = nullptr;
  cudaEvent_t start_ = nullptr;
};

/// Device scratch memory for the duration of one kernel call, back to the cache at scope exit.
class Scratch {
 public:
  explicit Scratch(size_t bytes) : ptr_(bytes ? cuda::malloc(bytes) : nullptr) {}
  ~Scratch() {
    if (ptr_) cuda::free(ptr_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_;
};

/// Row-major C (M, N) = alpha * op(A) @ op(B) + beta * C, `batch` times with the given element strides (0: the
/// operand is shared by every batch), through cuBLAS; TF32 tensor cores when tf32 (and the rows are aligned).
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
          int64_t stride_c, int64_t batch, bool tf32, const char* what);

/// gemm with op(A) and op(B) already rounded to bf16 (arrays of bf16 bit patterns): f32 products of the bf16 values
/// summed in f32 on tensor cores (cuBLAS's CUBLAS_COMPUTE_32F with CUDA_R_16BF operands).
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta, float* C, int64_t ldc,
               int64_t stride_c, int64_t batch, const char* what);
/// The same with C in bf16 (bf16 storage): f32 sums, alpha * sum + beta * C computed in f32 and rounded once.
void gemm_bf16(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A, int64_t lda,
               int64_t stride_a, const uint16_t* B, int64_t ldb, int64_t stride_b, float beta, bf16* C, int64_t ldc,
               int64_t stride_c, int64_t batch, const char* what);

/// Row-major D (M, N) = op(A) @ op(B) then `epilogue`, through cublasLt, overwriting D. A and B are f32 (TF32 tensor
/// cores when math is TF32 and the rows are aligned) or, when math is BF16, arrays of bf16 bit patterns; f32
/// accumulation. bias: N floats added to every row. aux: (M, N) at row stride ldaux, written by Gelu and GeluBias
/// (the value GELU was applied to), read by DGelu. Returns false, having queued nothing, when cublasLt offers no
/// algorithm for the call (the caller then does the epilogue's work itself).
bool fused_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const void* A, int64_t lda, const void* B,
                int64_t ldb, float* D, int64_t ldd, MatmulMath math, Epilogue epilogue, const float* bias, float* aux,
                int64_t ldaux, const char* what);

}  // namespace tinygpt::cuda
