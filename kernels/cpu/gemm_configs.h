// The f32 and f64 micro-kernels of the blocked GEMM and their packing (internal to kernels/cpu/gemm.cpp, the one
// file that includes it): a portable C++ kernel, and AVX2/FMA and AVX-512 ones for float where -march has them. Each
// Config names its tile (MR x NR), block sizes (MC, KC, NC), packing and kernel; the bf16 ones are gemm_bf16.h's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../bf16.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TINYGPT_GEMM_AVX2 1
#if defined(__AVX512F__)
#define TINYGPT_GEMM_AVX512 1
#endif
#endif

namespace tinygpt::cpu::gemm_detail {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

/// Rounds n packed operands in place (bf16 products: each operand read as bfloat16, the sums stay in T).
template <class T>
void round_packed_bf16(T* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = T(round_bf16(float(x[i])));
}

// ---------------------------------------------------------------------------------------------------------------
// Portable pieces (double everywhere; float when AVX2/FMA is not available).

// Packs rows [r0, r0 + rows) x k [k0, k0 + kc) of a matrix X into micro-panels W rows high:
// dst[p * W * kc + k * W + r] = X(r0 + p * W + r, k0 + k), zero-padded to a whole panel. X(r, k) is X[r * ld + k]
// when k_contig, else X[k * ld + r]. Packed op(A) is X = op(A) with W = MR; packed op(B) is X = op(B)^T, W = NR.
template <class T, int W>
void pack_generic(bool k_contig, const T* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc, T* dst) {
  for (int64_t p = 0; p * W < rows; ++p, dst += W * kc) {
    for (int64_t k = 0; k < kc; ++k) {
      for (int64_t r = 0; r < W; ++r) {
        const int64_t rr = r0 + p * W + r, kk = k0 + k;
        dst[k * W + r] = p * W + r < rows ? (k_contig ? X[rr * ld + kk] : X[kk * ld + rr]) : T(0);
      }
    }
  }
}

// c[MR x NR, row stride ldc] = alpha * a_panel @ b_panel + beta * c; c is not read when beta == 0.
template <class T, int MR, int NR>
void kernel_generic(int64_t kc, const T* __restrict a, const T* __restrict b, T* c, int64_t ldc, T alpha, T beta) {
  T acc[MR][NR] = {};
  for (int64_t k = 0; k < kc; ++k) {
    for (int i = 0; i < MR; ++i) {
      const T ai = a[k * MR + i];
      for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[k * NR + j];
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      c[i * ldc + j] = beta == T(0) ? alpha * acc[i][j] : alpha * acc[i][j] + beta * c[i * ldc + j];
    }
  }
}

// Per-type configuration: micro-tile MR x NR, cache blocks MC/KC/NC, the three routines.
template <class T>
struct Config;

/// The portable configuration: generic packing and micro-kernel with the given tile and block sizes.
template <class T, int MR_, int NR_, int64_t MC_, int64_t KC_, int64_t NC_>
struct GenericConfig {
  static constexpr int MR = MR_, NR = NR_;
  static constexpr int64_t MC = MC_, KC = KC_, NC = NC_;
  static constexpr int64_t KU = 8;
  using Packed = T;
  struct ThreadScope {};
  static constexpr int64_t kpad(int64_t kc) { return kc; }
  static void pack_a(bool k_contig, const T* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc, T* dst) {
    pack_generic<T, MR>(k_contig, X, ld, r0, rows, k0, kc, dst);
  }
  static void pack_b(bool k_contig, const T* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc, T* dst) {
    pack_generic<T, NR>(k_contig, X, ld, r0, rows, k0, kc, dst);
  }
  static void kernel(int64_t kc, const T* a, const T* b, T* c, int64_t ldc, T alpha, T beta) {
    kernel_generic<T, MR, NR>(kc, a, b, c, ldc, alpha, beta);
  }
};

template <>
struct Config<double> : GenericConfig<double, 4, 8, 96, 256, 2048> {};

#ifdef TINYGPT_GEMM_AVX2

// Rows of X prefetched ahead when copying panels out of it: 16 did best of those tried on dw, whose x and dy stream
// from DRAM (docs/RESULTS.md, "Measurements behind design decisions").
constexpr int64_t kPackAhead = 16;

// In-register 8x8 transpose: r[i][j] -> r[j][i].
inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// The micro-kernel's vector operations, as wide as the target's registers.
#ifdef TINYGPT_GEMM_AVX512
struct FloatVec {
  using T = __m512;
  static constexpr int kLanes = 16;
  static T zero() { return _mm512_setzero_ps(); }
  static T load(const float* p) { return _mm512_load_ps(p); }
  static T loadu(const float* p) { return _mm512_loadu_ps(p); }
  static T set1(float x) { return _mm512_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static void storeu(float* p, T v) { _mm512_storeu_ps(p, v); }
};
#else
struct FloatVec {
  using T = __m256;
  static constexpr int kLanes = 8;
  static T zero() { return _mm256_setzero_ps(); }
  static T load(const float* p) { return _mm256_load_ps(p); }
  static T loadu(const float* p) { return _mm256_loadu_ps(p); }
  static T set1(float x) { return _mm256_set1_ps(x); }
  static T fma(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static void storeu(float* p, T v) { _mm256_storeu_ps(p, v); }
};
#endif

template <>
struct Config<float> {
#ifdef TINYGPT_GEMM_AVX512
  // AVX-512: the same 6 rows, 32 columns (two zmm per row), with the blocking unchanged: faster than the AVX2 6x16
  // tile where both run (docs/RESULTS.md, "CPU matmul kernels").
  static constexpr int MR = 6, NR = 32;
#else
  static constexpr int MR = 6, NR = 16;
#endif
  // MC and KC: a sweep found a plateau around these, a smaller KC worse on dw (docs/RESULTS.md, "Measurements
  // behind design decisions"). 144 x 256 floats = 144 KB of op(A) in the 512 KB L2; a 256 x 16 B panel is 16 KB of
  // the 32 KB L1 (AVX-512: 256 x 32, 32 KB of the Xeon's 48 KB L1).
  static constexpr int64_t MC = 144, KC = 256, NC = 4096;
  static constexpr int64_t KU = 8;
  using Packed = float;
  struct ThreadScope {};
  static constexpr int64_t kpad(int64_t kc) { return kc; }
  static void pack_a(bool k_contig, const float* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                     float* dst) {
    pack<MR>(k_contig, X, ld, r0, rows, k0, kc, dst);
  }
  static void pack_b(bool k_contig, const float* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                     float* dst) {
    pack<NR>(k_contig, X, ld, r0, rows, k0, kc, dst);
  }

  // Same contract as pack_generic; W is MR = 6 (op(A)) or NR = 16 or 32 (op(B)).
  template <int W>
  static void pack(bool k_contig, const float* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                   float* dst) {
    const int64_t full = rows / W;
    if (!k_contig) {
      // Panel rows are contiguous in X (op(A) = A^T, op(B) = B): copy W floats per (k, panel), 8 k at a time per
      // panel, so loads stay within 8 rows and stores within one panel (faster than row by row across panels).
      const float* src = X + k0 * ld + r0;
      for (int64_t k8 = 0; k8 < kc; k8 += 8, src += 8 * ld) {
        const int64_t kn = std::min<int64_t>(8, kc - k8);
        if (k8 + kPackAhead < kc)
          for (int64_t k = 0; k < kn; ++k)
            for (int64_t r = 0; r < rows; r += 16)
              _mm_prefetch(reinterpret_cast<const char*>(src + (kPackAhead + k) * ld + r), _MM_HINT_T0);
        for (int64_t p = 0; p < full; ++p) {
          float* d = dst + p * W * kc + k8 * W;
          for (int64_t k = 0; k < kn; ++k) {
            if constexpr (W % 8 == 0) {
              for (int h = 0; h < W; h += 8) _mm256_store_ps(d + k * W + h, _mm256_loadu_ps(src + k * ld + p * W + h));
            } else {
              std::memcpy(d + k * W, src + k * ld + p * W, W * sizeof(float));
            }
          }
        }
      }
    } else {
      // X stored with k contiguous (op(A) = A, op(B) = B^T): 8x8 transposes, 8 k at a time. For W = 6 each
      // transposed row has 2 junk lanes; the 8-wide stores overlap and the next one overwrites them (the buffer
      // has slack at its end). W is 6 or a multiple of 8, so only the W = 6 stores overlap.
      static_assert(W < 8 || W % 8 == 0);
      for (int64_t p = 0; p < full; ++p) {
        float* d = dst + p * W * kc;
        const float* src = X + (r0 + p * W) * ld + k0;
        int64_t k = 0;
        for (; k + 8 <= kc; k += 8) {
          for (int h = 0; h < W; h += 8) {
            __m256 r[8];
            for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(src + std::min(h + i, W - 1) * ld + k);
            transpose8(r);
            for (int t = 0; t < 8; ++t) _mm256_storeu_ps(d + (k + t) * W + h, r[t]);
          }
        }
        for (; k < kc; ++k)
          for (int r = 0; r < W; ++r) d[k * W + r] = src[r * ld + k];
      }
    }
    if (full * W < rows)
      pack_generic<float, W>(k_contig, X, ld, r0 + full * W, rows - full * W, k0, kc, dst + full * W * kc);
  }

  // 6 x NR tile, two vectors per row: 12 accumulators + 2 B vectors + 1 broadcast A (15 of the 16 ymm registers
  // with AVX2); per k, 12 FMAs against 2 loads + 6 broadcasts, which keeps both FMA pipes fed.
  static void kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c, int64_t ldc,
                     float alpha, float beta) {
    using V = FloatVec;
    static_assert(NR == 2 * V::kLanes);
    // C is read (beta != 0) or written only after the k loop: start its lines on their way now.
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      for (int j = 0; j < NR; j += 16) __builtin_prefetch(c + i * ldc + j, 1, 3);
      __builtin_prefetch(c + i * ldc + NR - 1, 1, 3);
    }
    V::T acc[MR][2];
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = V::zero();
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; ++k) {
      const V::T b0 = V::load(b + k * NR), b1 = V::load(b + k * NR + V::kLanes);
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        const V::T ai = V::set1(a[k * MR + i]);
        acc[i][0] = V::fma(ai, b0, acc[i][0]);
        acc[i][1] = V::fma(ai, b1, acc[i][1]);
      }
    }
    const V::T va = V::set1(alpha);
    if (beta == 0.0f) {
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        V::storeu(c + i * ldc, V::mul(va, acc[i][0]));
        V::storeu(c + i * ldc + V::kLanes, V::mul(va, acc[i][1]));
      }
    } else {
      const V::T vb = V::set1(beta);
#pragma GCC unroll 6
      for (int i = 0; i < MR; ++i) {
        float* ci = c + i * ldc;
        V::storeu(ci, V::fma(vb, V::loadu(ci), V::mul(va, acc[i][0])));
        V::storeu(ci + V::kLanes, V::fma(vb, V::loadu(ci + V::kLanes), V::mul(va, acc[i][1])));
      }
    }
  }
};

#else

template <>
struct Config<float> : GenericConfig<float, 4, 16, 128, 256, 4096> {};

#endif

}  // namespace tinygpt::cpu::gemm_detail
