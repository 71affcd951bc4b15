// The CUDA build of reduce.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/reduce.cuh"

// Each function is defined with its declared signature (kernels/cuda/cuda_kernels.h): a drifted definition would be
// a second overload, and taking its address here would not compile.
TINYGPT_DEFINED_AS_DECLARED(sum_forward)
TINYGPT_DEFINED_AS_DECLARED(sum_squares)
TINYGPT_DEFINED_AS_DECLARED(sum_backward)
TINYGPT_DEFINED_AS_DECLARED(softmax_forward)
TINYGPT_DEFINED_AS_DECLARED(softmax_backward)
TINYGPT_DEFINED_AS_DECLARED(log_softmax_forward)
TINYGPT_DEFINED_AS_DECLARED(log_softmax_backward)
