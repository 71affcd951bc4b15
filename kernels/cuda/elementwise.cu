// The CUDA build of elementwise.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elementwise.cuh"

// Each function is defined with its declared signature: a definition that drifted from kernels/cuda/cuda_kernels.h
// would be a second overload, and taking its address here would not compile.
TINYGPT_DEFINED_AS_DECLARED(fill)
TINYGPT_DEFINED_AS_DECLARED(round_to_bf16)
TINYGPT_DEFINED_AS_DECLARED(widen_bf16)
TINYGPT_DEFINED_AS_DECLARED(axpy)
TINYGPT_DEFINED_AS_DECLARED(axpby)
TINYGPT_DEFINED_AS_DECLARED(axpby_indirect)
TINYGPT_DEFINED_AS_DECLARED(unary_forward)
TINYGPT_DEFINED_AS_DECLARED(unary_backward)
TINYGPT_DEFINED_AS_DECLARED(binary_forward)
TINYGPT_DEFINED_AS_DECLARED(binary_backward)
TINYGPT_DEFINED_AS_DECLARED(sum_forward)
TINYGPT_DEFINED_AS_DECLARED(sum_squares)
TINYGPT_DEFINED_AS_DECLARED(sum_backward)
TINYGPT_DEFINED_AS_DECLARED(softmax_forward)
TINYGPT_DEFINED_AS_DECLARED(softmax_backward)
TINYGPT_DEFINED_AS_DECLARED(log_softmax_forward)
TINYGPT_DEFINED_AS_DECLARED(log_softmax_backward)
TINYGPT_DEFINED_AS_DECLARED(dropout_forward)
TINYGPT_DEFINED_AS_DECLARED(dropout_backward)
TINYGPT_DEFINED_AS_DECLARED(permute)
TINYGPT_DEFINED_AS_DECLARED(copy_slice)
TINYGPT_DEFINED_AS_DECLARED(adamw_update)
TINYGPT_DEFINED_AS_DECLARED(adamw_update_indirect)
TINYGPT_DEFINED_AS_DECLARED(sum_rows_in_order)
TINYGPT_DEFINED_AS_DECLARED(rope_forward)
TINYGPT_DEFINED_AS_DECLARED(rope_backward)
