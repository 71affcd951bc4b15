// The CUDA build of nn.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/nn.cuh"
