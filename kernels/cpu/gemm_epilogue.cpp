#include "kernels/cpu/gemm_epilogue.h"

#include <omp.h>

#include "kernels/cpu/bf16_rows.h"
#include "kernels/cpu/parallel.h"

namespace tinygpt::cpu::gemm_detail {

namespace {

/// The epilogue of a product stored in bf16 (Bf16Out) on the mr x nr f32 results at c (row stride ldc), rows
/// [row, row + mr) and columns [col, col + nr) of the output: bias, act' scaling, the sum with what the output held,
/// one rounding each; act of the f32 value, rounded. Each step a vectorized pass over the row.
template <Activation A>
void bf16_out_epilogue_with(const Epilogue<float>& ep, float* c, int64_t ldc, int64_t row, int64_t col, int64_t mr,
                            int64_t nr) {
  const Bf16Out& o = *ep.out16;
  for (int64_t i = 0; i < mr; ++i) {
    float* r = c + i * ldc;
    const int64_t at = (row + i) * o.ld + col;
    if (ep.bias) {
      const float* b = ep.bias + col;
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) r[j] += b[j];
    }
    if constexpr (A != Activation::None) {
      if (o.act_of) {
        const bf16* of = o.act_of + at;
#pragma omp simd
        for (int64_t j = 0; j < nr; ++j) r[j] *= activation_grad_of(A, float(of[j]));
      }
    }
    if (o.accumulate) {
      const bf16* held = o.out + at;
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) r[j] += float(held[j]);
    }
    round_range(o.out + at, r, nr);
    if constexpr (A != Activation::None) {
      if (o.act_out) {
#pragma omp simd
        for (int64_t j = 0; j < nr; ++j) r[j] = activation_of(A, r[j]);
        round_range(o.act_out + at, r, nr);
      }
    }
  }
}

}  // namespace

void bf16_out_epilogue(const Epilogue<float>& ep, float* c, int64_t ldc, int64_t row, int64_t col, int64_t mr,
                       int64_t nr) {
  switch (ep.act) {
    case Activation::Gelu:
      return bf16_out_epilogue_with<Activation::Gelu>(ep, c, ldc, row, col, mr, nr);
    case Activation::ReluSquared:
      return bf16_out_epilogue_with<Activation::ReluSquared>(ep, c, ldc, row, col, mr, nr);
    default:
      return bf16_out_epilogue_with<Activation::None>(ep, c, ldc, row, col, mr, nr);
  }
}

/// bf16_out_epilogue over a whole M x N product in f32 (row stride ldc), rows on the OpenMP threads.
void bf16_out_rows(const Epilogue<float>& ep, float* c, int64_t ldc, int64_t M, int64_t N, int64_t row0, int64_t col0) {
#pragma omp parallel for if (M * N >= kParallelGrain && !omp_in_parallel())
  for (int64_t i = 0; i < M; ++i) bf16_out_epilogue(ep, c + i * ldc, ldc, row0 + i, col0, 1, N);
}

}  // namespace tinygpt::cpu::gemm_detail
