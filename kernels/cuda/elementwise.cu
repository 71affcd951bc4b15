// The CUDA build of elementwise.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elementwise.cuh"

// Each function is defined with its declared signature: a definition that drifted from kernels/cuda/cuda_kernels.h
// would be a second overload, and taking its address here would not compile.
TINYGPT_DEFINED_AS_DECLARED(fill)
TINYGPT_DEFINED_AS_DECLARED(round_to_bf16)
TINYGPT_DEFINED_AS_DECLARED(widen_bf16)
TINYGPT_DEFINED_AS_DECLARED(accumulate_bf16)
TINYGPT_DEFINED_AS_DECLARED(axpby)
TINYGPT_DEFINED_AS_DECLARED(adamw_update)
TINYGPT_DEFINED_AS_DECLARED(sum_rows_in_order)

// The templates, for each storage type the list takes but f64 (kernels/kernel_list.h): an instantiation that does
// not match its declaration in kernels/cuda/cuda_kernels.h does not compile.
namespace tinygpt::cuda {
TINYGPT_INSTANTIATE_F32_BF16(axpy)
TINYGPT_INSTANTIATE_F32_BF16(unary_forward)
TINYGPT_INSTANTIATE_F32_BF16(unary_backward)
TINYGPT_INSTANTIATE_F32_BF16(binary_forward)
TINYGPT_INSTANTIATE_F32_BF16(binary_backward)
TINYGPT_INSTANTIATE_F32_BF16(dropout_forward)
TINYGPT_INSTANTIATE_F32_BF16(dropout_backward)
TINYGPT_INSTANTIATE_F32_BF16(permute)
TINYGPT_INSTANTIATE_F32_BF16(copy_slice)
TINYGPT_INSTANTIATE_F32_BF16(rope_forward)
TINYGPT_INSTANTIATE_F32_BF16(rope_backward)
}  // namespace tinygpt::cuda
