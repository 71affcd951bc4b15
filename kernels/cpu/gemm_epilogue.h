// The blocked GEMM's epilogues (internal to kernels/cpu/gemm.cpp): bias and activation on a tile of C as its last k
// block is added, and the bf16 output's (Bf16Out) rounding of a block of f32 results.
#pragma once

#include <cstdint>

#include "gemm.h"
#include "vec_math.h"

namespace tinygpt::cpu::gemm_detail {

template <class T>
bool has_epilogue(const Epilogue<T>& ep) {
  return ep.bias != nullptr || ep.act != Activation::None;
}

/// The activation part of the epilogue on mr x nr elements of C at c, act's out or act_of at offset `at` from C.
template <Activation A, class T>
void activation_epilogue(const Epilogue<T>& ep, T* c, int64_t ldc, int64_t at, int64_t mr, int64_t nr) {
  for (int64_t i = 0; i < mr; ++i) {
    T* row = c + i * ldc;
    if (ep.act_out) {
      T* out = ep.act_out + at + i * ldc;
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) out[j] = activation_of(A, row[j]);
    } else {
      const T* of = ep.act_of + at + i * ldc;
#pragma omp simd
      for (int64_t j = 0; j < nr; ++j) row[j] *= activation_grad_of(A, of[j]);
    }
  }
}

/// The epilogue on the mr x nr elements of C at c, which is C + at, in columns [j, j + nr): bias, then activation.
template <class T>
void run_epilogue(const Epilogue<T>& ep, T* c, int64_t ldc, int64_t at, int64_t j, int64_t mr, int64_t nr) {
  if (ep.bias) {
    const T* b = ep.bias + j;
    for (int64_t i = 0; i < mr; ++i) {
      T* row = c + i * ldc;
#pragma omp simd
      for (int64_t jj = 0; jj < nr; ++jj) row[jj] += b[jj];
    }
  }
  if (ep.act == Activation::Gelu) activation_epilogue<Activation::Gelu>(ep, c, ldc, at, mr, nr);
  if (ep.act == Activation::ReluSquared) activation_epilogue<Activation::ReluSquared>(ep, c, ldc, at, mr, nr);
}

/// The epilogue of a product stored in bf16 (Bf16Out) on the mr x nr f32 results at c (row stride ldc), rows
/// [row, row + mr) and columns [col, col + nr) of the output: bias, act' scaling, the sum with what the output held,
/// one rounding each; act of the f32 value, rounded.
void bf16_out_epilogue(const Epilogue<float>& ep, float* c, int64_t ldc, int64_t row, int64_t col, int64_t mr,
                       int64_t nr);

/// bf16_out_epilogue over an M x N block of the product in f32 (row stride ldc) whose first element is the output's
/// (row0, col0), rows on the OpenMP threads.
void bf16_out_rows(const Epilogue<float>& ep, float* c, int64_t ldc, int64_t M, int64_t N, int64_t row0 = 0,
                   int64_t col0 = 0);

}  // namespace tinygpt::cpu::gemm_detail
