// The CUDA build of matmul.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/matmul.cuh"

// For each storage type the kernels take (kernels/kernels.h): an explicit instantiation that does not match its
// declaration in kernels/cuda/cuda_kernels.h does not compile. linear_forward and linear_backward are explicit
// specializations in matmul.cuh, one per storage type.
namespace tinygpt::cuda {
#define TINYGPT_INSTANTIATE(T)                                                                                        \
  template void matmul_forward<T>(T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool,    \
                                  MatmulMath);                                                                        \
  template void matmul_backward<T>(T*, T*, const T*, const T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, \
                                   bool, bool, MatmulMath);
TINYGPT_INSTANTIATE(float)
TINYGPT_INSTANTIATE(bf16)
#undef TINYGPT_INSTANTIATE
}  // namespace tinygpt::cuda
