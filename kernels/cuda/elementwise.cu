// The CUDA build of elementwise.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elementwise.cuh"
