// CUDA kernels with the same parameters and semantics as their CPU twins (kernels/kernel_list.h, whose list declares
// them here: one f32 function, a template over the storage types the list gives but f64, or a plain function). They
// run on the default stream and return without waiting. Defined in kernels/cuda/*.cu when the CUDA backend is built;
// the kernel table in kernels/kernels.h leaves the cuda slots empty otherwise, so nothing here is referenced by a
// CPU-only build. Each template is instantiated in its .cu file (TINYGPT_INSTANTIATE).
#pragma once

#include <cstdint>

#include "../kernel_list.h"

namespace tinygpt::cuda {

/// What cublasLt does to a product in its epilogue (fused_gemm in kernels/cuda/runtime.cuh, and its stand-in in
/// tests/emulated_cuda.h): add the bias; GELU (tanh form) with the value before it written to aux; both; or, for a
/// gradient, multiply by GELU's derivative at aux.
enum class Epilogue : uint8_t { Bias, Gelu, GeluBias, DGelu };

TINYGPT_KERNELS(TINYGPT_DECLARE_CUDA)

/// out (n) = the rows of parts (rows, n) added in row order: the owner's step of the fixed-order all-reduce
/// (nccl.cu), as the MPI one adds on the host (train/comm.cpp).
void sum_rows_in_order(float* out, const float* parts, int64_t rows, int64_t n);

}  // namespace tinygpt::cuda
