// The CUDA build of attention_naive.cuh.
#include "kernels/cuda/attention_naive.cuh"
#include "kernels/cuda/cuda_kernels.h"

// Each function is defined with its declared signature (kernels/cuda/cuda_kernels.h): a drifted definition would be
// a second overload, and taking its address here would not compile.
TINYGPT_DEFINED_AS_DECLARED(attention_naive_forward)
TINYGPT_DEFINED_AS_DECLARED(attention_naive_backward)
