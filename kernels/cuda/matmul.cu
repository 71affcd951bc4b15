// The CUDA build of matmul.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/matmul.cuh"
