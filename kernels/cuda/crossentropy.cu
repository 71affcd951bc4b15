// The CUDA build of crossentropy.cuh.
#include "kernels/cuda/crossentropy.cuh"
#include "kernels/cuda/cuda_kernels.h"

// For each storage type the list takes but f64 (kernels/kernel_list.h): an instantiation that does not match its
// declaration in kernels/cuda/cuda_kernels.h does not compile.
namespace tinygpt::cuda {
TINYGPT_INSTANTIATE_F32_BF16(crossentropy_forward)
TINYGPT_INSTANTIATE_F32_BF16(crossentropy_backward)
TINYGPT_INSTANTIATE_F32_BF16(crossentropy_fused)
}  // namespace tinygpt::cuda
