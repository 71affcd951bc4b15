// The CUDA build of nn.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/nn.cuh"

// For each storage type the list takes but f64 (kernels/kernel_list.h): an instantiation that does not match its
// declaration in kernels/cuda/cuda_kernels.h does not compile.
namespace tinygpt::cuda {
TINYGPT_INSTANTIATE_F32_BF16(layernorm_forward)
TINYGPT_INSTANTIATE_F32_BF16(add_layernorm_forward)
TINYGPT_INSTANTIATE_F32_BF16(layernorm_backward)
TINYGPT_INSTANTIATE_F32_BF16(rmsnorm_forward)
TINYGPT_INSTANTIATE_F32_BF16(add_rmsnorm_forward)
TINYGPT_INSTANTIATE_F32_BF16(rmsnorm_backward)
TINYGPT_INSTANTIATE_F32_BF16(swiglu_forward)
TINYGPT_INSTANTIATE_F32_BF16(swiglu_backward)
TINYGPT_INSTANTIATE_F32_BF16(embedding_forward)
TINYGPT_INSTANTIATE_F32_BF16(embedding_backward)
}  // namespace tinygpt::cuda
