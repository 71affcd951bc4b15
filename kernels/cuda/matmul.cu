// The CUDA build of matmul.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/matmul.cuh"

// For each storage type the list takes but f64 (kernels/kernel_list.h): an instantiation that does not match its
// declaration in kernels/cuda/cuda_kernels.h does not compile. linear_forward and linear_backward are explicit
// specializations in matmul.cuh, one per storage type.
namespace tinygpt::cuda {
TINYGPT_INSTANTIATE_F32_BF16(matmul_forward)
TINYGPT_INSTANTIATE_F32_BF16(matmul_backward)
}  // namespace tinygpt::cuda
