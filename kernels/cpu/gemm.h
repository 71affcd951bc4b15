#pragma once
#include <cstdint>

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
template <class T>
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, T alpha, const T* A, int64_t lda,
          const T* B, int64_t ldb, T beta, T* C, int64_t ldc, bool bf16 = false);

}  // namespace tinygpt::cpu
