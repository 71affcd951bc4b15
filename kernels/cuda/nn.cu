// The CUDA build of nn.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/nn.cuh"

// Each function is defined with its declared signature: a definition that drifted from kernels/cuda/cuda_kernels.h
// would be a second overload, and taking its address here would not compile.
TINYGPT_DEFINED_AS_DECLARED(layernorm_forward)
TINYGPT_DEFINED_AS_DECLARED(add_layernorm_forward)
TINYGPT_DEFINED_AS_DECLARED(layernorm_backward)
TINYGPT_DEFINED_AS_DECLARED(embedding_forward)
TINYGPT_DEFINED_AS_DECLARED(embedding_backward)
TINYGPT_DEFINED_AS_DECLARED(crossentropy_forward)
TINYGPT_DEFINED_AS_DECLARED(crossentropy_backward)
