// The CUDA build of attention.cuh.
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/cuda_kernels.h"

// Each function is defined with its declared signature: a definition that drifted from kernels/cuda/cuda_kernels.h
// would be a second overload, and taking its address here would not compile.
TINYGPT_DEFINED_AS_DECLARED(attention_flash_forward)
TINYGPT_DEFINED_AS_DECLARED(attention_flash_backward)
TINYGPT_DEFINED_AS_DECLARED(attention_flash_forward_bf16)
TINYGPT_DEFINED_AS_DECLARED(attention_flash_backward_bf16)
