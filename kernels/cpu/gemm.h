#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "../bf16.h"    // round_bf16
#include "../device.h"  // Bf16Kernel, bf16_kernel(): which CPU unit runs bf16 products
#include "../geometry.h"

namespace tinygpt::cpu {

// Row-major C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T (read through the leading dimension, no copy of
// the caller's data). op(A) is (M, K), op(B) is (K, N), C is (M, N). lda/ldb/ldc are row strides in elements of the
// matrices as stored (A stored (M,K) when !trans_a, (K,M) when trans_a; same for B). beta == 0 means C is overwritten
// (never read, so NaN garbage in C is ignored).
// Multithreaded with OpenMP (uses omp_get_max_threads() threads; safe to call from outside a parallel region; when
// called from inside an active parallel region, runs single-threaded). Products too small to pay for a fork, and
// calls made while other processes keep a team thread off its core, also run single-threaded. The result does not
// depend on the number of threads.
// Instantiated for float (packed, cache-blocked, AVX2/FMA micro-kernel) and double (same blocking, generic kernel).
// bf16: every element of op(A) and op(B) is rounded to bfloat16 (nearest, ties to even; a double through float) as
// it is packed, and the products of the rounded values are summed in T, as a bf16 matmul with f32 accumulation
// computes (MatmulMath::BF16).
// bf16 products in float run on the fastest kernel this CPU has (bf16_kernel()); in double on f32 units.
// The epilogue (`Epilogue`) runs on each tile of C as its last k block is added, while the tile is in cache: no
// second pass over C.
/// A product over bf16 storage stored in bf16 (Epilogue::out16), so no f32 C of the whole product is written:
/// out[i * ld + j] = C[i, j] after the bias (and act' scaling), plus what out held when `accumulate`, rounded once;
/// with the epilogue's act, act_out = act(C[i, j]) rounded (forward), or C[i, j] *= act'(act_of[i * ld + j]) first
/// (backward). alpha 1 and beta 0.
struct Bf16Out {
  bf16* out = nullptr;
  int64_t ld = 0;
  bool accumulate = false;
  bf16* act_out = nullptr;
  const bf16* act_of = nullptr;
};

template <class T>
struct Epilogue {
  const T* bias = nullptr;            // N values: C[i, j] += bias[j] after the product
  Activation act = Activation::None;  // with act_out or act_of (one of them), and beta == 0:
  T* act_out = nullptr;               //   act_out[i * ldc + j] = act(C[i, j]) (C keeps the pre-activation)
  const T* act_of = nullptr;          //   C[i, j] *= act'(act_of[i * ldc + j]) (a gradient through the activation)
  const Bf16Out* out16 = nullptr;     // gemm over bf16 only: the result stored in bf16 (act's arrays in it), C unused
};
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda, const T* B,
          int64_t ldb, T beta, T* C, int64_t ldc, bool bf16 = false, const Epilogue<T>& epilogue = {});

/// gemm<float> over operands stored in bf16 (the products of MatmulMath::BF16, with nothing to round: the operands
/// are bf16 already), C in f32, or with epilogue.out16 the result in bf16 (C may be null). The bf16 micro-kernels pack
/// the operands as they lie; on the f32 units they are widened first (exactly), so every kernel multiplies the same
/// values as gemm<float> with bf16 on their f32 twins.
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
          const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc, const Epilogue<float>& epilogue = {});

/// gemm<float> with bf16 operands on the given kernel, which must be available (tests and bench_matmul compare them).
void gemm_bf16(Bf16Kernel kernel, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
               const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace tinygpt::cpu
