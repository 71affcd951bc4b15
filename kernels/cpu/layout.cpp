// Data movement: permutes (transpose) and slice copies (narrow, split, concat), forward and backward.
#include <algorithm>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/parallel.h"

namespace tinygpt::cpu {

template <class T>
void permute(T* out, const T* inp, const PermuteGeom& g, bool accumulate) {
  const int64_t inner = g.out[kMaxDims - 1];
  const int64_t outer = g.out[0] * g.out[1] * g.out[2] * g.out[3];
  const int64_t si = g.inp_stride[kMaxDims - 1];
#pragma omp parallel for if (outer * inner >= kParallelGrain)
  for (int64_t o = 0; o < outer; ++o) {
    int64_t off = 0;
    for (int64_t d = kMaxDims - 2, rem = o; d >= 0; --d) {
      off += (rem % g.out[d]) * g.inp_stride[d];
      rem /= g.out[d];
    }
    const T* x = inp + off;
    T* y = out + o * inner;
    if (accumulate) {
      for (int64_t i = 0; i < inner; ++i) y[i] = T(compute_t<T>(y[i]) + compute_t<T>(x[i * si]));
    } else {
      for (int64_t i = 0; i < inner; ++i) y[i] = x[i * si];
    }
  }
}

template <class T>
void copy_slice(T* dst, const T* src, int64_t outer, int64_t inner, int64_t dst_D, int64_t dst_start, int64_t src_D,
                int64_t src_start, int64_t len, bool accumulate) {
#pragma omp parallel for if (outer * len * inner >= kParallelGrain)
  for (int64_t oj = 0; oj < outer * len; ++oj) {
    const int64_t o = oj / len, j = oj % len;
    const T* x = src + (o * src_D + src_start + j) * inner;
    T* y = dst + (o * dst_D + dst_start + j) * inner;
    if (accumulate) {
      for (int64_t i = 0; i < inner; ++i) y[i] = T(compute_t<T>(y[i]) + compute_t<T>(x[i]));
    } else {
      std::copy_n(x, inner, y);
    }
  }
}

// The storage types kernels/kernel_list.h lists for each kernel.
TINYGPT_INSTANTIATE_F32_F64_BF16(permute)
TINYGPT_INSTANTIATE_F32_F64_BF16(copy_slice)

}  // namespace tinygpt::cpu
