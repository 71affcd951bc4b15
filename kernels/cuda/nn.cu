// The CUDA build of nn.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/nn.cuh"

// For each storage type the kernels take (kernels/kernels.h): an explicit instantiation that does not match its
// declaration in kernels/cuda/cuda_kernels.h does not compile.
namespace tinygpt::cuda {
#define TINYGPT_INSTANTIATE(T)                                                                                        \
  template void layernorm_forward<T>(T*, compute_t<T>*, compute_t<T>*, const T*, const T*, const T*, int64_t, int64_t, \
                                     compute_t<T>);                                                                   \
  template void add_layernorm_forward<T>(T*, T*, compute_t<T>*, compute_t<T>*, const T*, const T*, const T*, const T*, \
                                         int64_t, int64_t, compute_t<T>, float, DropoutSeed);                            \
  template void layernorm_backward<T>(T*, T*, T*, const T*, const T*, const T*, const compute_t<T>*,                   \
                                      const compute_t<T>*, int64_t, int64_t, bool);                                   \
  template void embedding_forward<T>(T*, const int32_t*, const T*, int64_t, int64_t);                                 \
  template void embedding_backward<T>(T*, const T*, const int32_t*, const int32_t*, int64_t, int64_t, int64_t);       \
  template void crossentropy_forward<T>(compute_t<T>*, compute_t<T>*, const T*, const int32_t*, int64_t, int64_t,     \
                                        int32_t);                                                                     \
  template void crossentropy_backward<T>(T*, const compute_t<T>*, compute_t<T>, const T*, const compute_t<T>*,         \
                                         const int32_t*, int64_t, int64_t, int32_t, bool);                   \
  template void crossentropy_fused<T>(compute_t<T>*, compute_t<T>*, T*, const T*, const int32_t*, compute_t<T>,       \
                                      int64_t, int64_t, int32_t);
TINYGPT_INSTANTIATE(float)
TINYGPT_INSTANTIATE(bf16)
#undef TINYGPT_INSTANTIATE
}  // namespace tinygpt::cuda
