// The CUDA build of elementwise.cuh.
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/elementwise.cuh"

// Each function is defined with its declared signature: a definition that drifted from kernels/cuda/cuda_kernels.h
// would be a second overload, and taking its address here would not compile.
TINYGPT_DEFINED_AS_DECLARED(fill)
TINYGPT_DEFINED_AS_DECLARED(round_to_bf16)
TINYGPT_DEFINED_AS_DECLARED(widen_bf16)
TINYGPT_DEFINED_AS_DECLARED(accumulate_bf16)
TINYGPT_DEFINED_AS_DECLARED(axpby)
TINYGPT_DEFINED_AS_DECLARED(axpby_indirect)
TINYGPT_DEFINED_AS_DECLARED(sum_forward)
TINYGPT_DEFINED_AS_DECLARED(sum_squares)
TINYGPT_DEFINED_AS_DECLARED(sum_backward)
TINYGPT_DEFINED_AS_DECLARED(softmax_forward)
TINYGPT_DEFINED_AS_DECLARED(softmax_backward)
TINYGPT_DEFINED_AS_DECLARED(log_softmax_forward)
TINYGPT_DEFINED_AS_DECLARED(log_softmax_backward)
TINYGPT_DEFINED_AS_DECLARED(adamw_update)
TINYGPT_DEFINED_AS_DECLARED(adamw_update_indirect)
TINYGPT_DEFINED_AS_DECLARED(sum_rows_in_order)
TINYGPT_DEFINED_AS_DECLARED(rope_forward)
TINYGPT_DEFINED_AS_DECLARED(rope_backward)

// The templates, for each storage type they take (kernels/kernels.h): an explicit instantiation that does not match its
// declaration in kernels/cuda/cuda_kernels.h does not compile.
namespace tinygpt::cuda {
#define TINYGPT_INSTANTIATE(T)                                                                                          \
  template void axpy<T>(T*, const T*, compute_t<T>, int64_t);                                                           \
  template void unary_forward<T>(T*, const T*, int64_t, UnaryOp, compute_t<T>);                                         \
  template void unary_backward<T>(T*, const T*, const T*, const T*, int64_t, UnaryOp, compute_t<T>, bool);              \
  template void binary_forward<T>(T*, const T*, const T*, const BroadcastGeom&, BinaryOp);                              \
  template void binary_backward<T>(T*, T*, const T*, const T*, const T*, const BroadcastGeom&, BinaryOp);               \
  template void dropout_forward<T>(T*, const T*, int64_t, float, DropoutSeed);                                             \
  template void dropout_backward<T>(T*, const T*, int64_t, float, DropoutSeed);                                            \
  template void permute<T>(T*, const T*, const PermuteGeom&, bool);                                                     \
  template void copy_slice<T>(T*, const T*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool);
TINYGPT_INSTANTIATE(float)
TINYGPT_INSTANTIATE(bf16)
#undef TINYGPT_INSTANTIATE
}  // namespace tinygpt::cuda
