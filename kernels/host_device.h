// TINYGPT_HOST_DEVICE: a function compiled for the CPU and, by nvcc, for the GPU too (scalar helpers that both
// backends share, so the two compute an element the same way).
#pragma once

#if defined(__CUDACC__)
#define TINYGPT_HOST_DEVICE __host__ __device__
#else
#define TINYGPT_HOST_DEVICE
#endif
