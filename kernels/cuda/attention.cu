// The CUDA build of attention.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/attention.cuh"
