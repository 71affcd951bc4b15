// The CUDA build of matmul.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/matmul.cuh"

// Each function is defined with its declared signature: a definition that drifted from kernels/cuda/cuda_kernels.h
// would be a second overload, and taking its address here would not compile.
TINYGPT_DEFINED_AS_DECLARED(matmul_forward)
TINYGPT_DEFINED_AS_DECLARED(matmul_backward)
TINYGPT_DEFINED_AS_DECLARED(linear_forward)
TINYGPT_DEFINED_AS_DECLARED(linear_backward)
