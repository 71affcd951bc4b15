#pragma once
// bf16 micro-kernels and their packing for the blocked GEMM in gemm.cpp (internal to it). Compiled whatever -march
// says, through target attributes, and run only where the CPU reports the instructions (bf16_kernels_available).
//
// Both kernels read op(B) packed in the VNNI layout: a panel of NR = 32 columns holds, for each pair of k (kp), the
// 32 columns' pairs (k = 2 kp, 2 kp + 1) side by side as 32-bit words: word kp * NR + j. op(A) is packed as pairs
// too: for AVX512-BF16 word kp * MR + i (a pair is broadcast to every lane), for AMX in rows of 32 k per tile
// depth: word (kp / 16) * MR * 16 + i * 16 + kp % 16. The operands are rounded to bf16 as they are packed, exactly as
// round_bf16 does (nearest, ties to even; NaN stays NaN): the same operands as the f32 units' bf16 path.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../bf16.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TINYGPT_GEMM_BF16 1
#include <immintrin.h>

namespace tinygpt::cpu::bf16_isa {

#define TINYGPT_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,avx2")))
#define TINYGPT_TARGET_AMX \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,avx2,amx-tile,amx-bf16")))

constexpr int64_t round_up(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

/// Lanes [0, n) of a 16-lane mask (n clamped to [0, 16]).
inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Shifts of 32-bit lanes by 16 (the maskz forms: GCC 12's unmasked ones warn of an uninitialized operand).
TINYGPT_TARGET_AVX512 inline __m512i shr16(__m512i v) { return _mm512_maskz_srli_epi32(__mmask16(0xffff), v, 16); }
TINYGPT_TARGET_AVX512 inline __m512i shl16(__m512i v) { return _mm512_maskz_slli_epi32(__mmask16(0xffff), v, 16); }

/// 16 floats rounded to bf16 (nearest, ties to even; a NaN quieted), the bits in the low half of each 32-bit lane.
TINYGPT_TARGET_AVX512 inline __m512i bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i hi = shr16(u);
  const __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded = shr16(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))));
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  return _mm512_mask_mov_epi32(rounded, nan, _mm512_or_si512(hi, _mm512_set1_epi32(0x40)));
}

/// Decoding's products (gemm_few_rows, op(B) = B^T): rows j0 .. j0 + R of B (bf16 bits, row stride ldb) dotted with
/// `a` (bf16 bits, zero-padded to a multiple of 32), 32 products per `vdpbf16ps` (a matrix-vector product is bound
/// by reading B; widening B to f32 first costs more than the reading). Each element's arithmetic is the same
/// whatever rows are computed beside it or on which thread. C[j0 + r] = alpha * dot + beta * C[j0 + r].
template <int R>
TINYGPT_TARGET_AVX512 inline void dot_rows_dpbf16(const uint16_t* a, const uint16_t* B, int64_t ldb, int64_t j0,
                                                  int64_t K, float alpha, float beta, float* c) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const uint16_t* b = B + j0 * ldb;
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    const __m512bh av = (__m512bh)_mm512_loadu_si512(a + k);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_dpbf16_ps(acc[r], av, (__m512bh)_mm512_loadu_si512(b + r * ldb + k));
  }
  if (k < K) {  // the tail: B's words past K read as zeros (a is zero there already)
    const __mmask32 m = __mmask32((1u << (K - k)) - 1);
    const __m512bh av = (__m512bh)_mm512_loadu_si512(a + k);
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_dpbf16_ps(acc[r], av, (__m512bh)_mm512_maskz_loadu_epi16(m, b + r * ldb + k));
  }
  for (int r = 0; r < R; ++r) {
    // Lane l += lane l + w for w = 8, 4, 2, 1 (the maskz forms: GCC 12's _mm512_reduce_add_ps warns).
    __m512 v = acc[r];
    v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(__mmask16(0xffff), v, v, 0x4e));
    v = _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(__mmask16(0xffff), v, v, 0xb1));
    v = _mm512_add_ps(v, _mm512_maskz_permute_ps(__mmask16(0xffff), v, 0x4e));
    v = _mm512_add_ps(v, _mm512_maskz_permute_ps(__mmask16(0xffff), v, 0xb1));
    const float dot = _mm512_cvtss_f32(v);
    float& out = c[j0 + r];
    out = alpha * dot + (beta == 0.0f ? 0.0f : beta * out);
  }
}

/// n floats rounded to bf16 bits as round_bf16 rounds them (bf16_bits), into out; out is zero-padded to a multiple
/// of 32 words.
TINYGPT_TARGET_AVX512 inline void round_row_bf16(const float* x, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i < n; i += 16) {
    const __mmask16 m = lanes16(n - i);
    const __m512i w = bf16_bits(_mm512_maskz_loadu_ps(m, x + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm512_maskz_cvtepi32_epi16(m, w));
  }
  for (; i < round_up(n, 32); i += 16) _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_setzero_si256());
}

/// v[i] lane j <- v[j] lane i: a 16 x 16 transpose of 32-bit words (pairs of bf16), in registers. (The maskz
/// forms throughout, all lanes on: GCC 12's unmasked ones warn of an uninitialized operand.)
TINYGPT_TARGET_AVX512 inline void transpose16x16(__m512i v[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane L: [a0 b0 a1 b1], [a2 b2 a3 b3]
    t[i] = _mm512_maskz_unpacklo_epi32(__mmask16(0xffff), v[i], v[i + 1]);
    t[i + 1] = _mm512_maskz_unpackhi_epi32(__mmask16(0xffff), v[i], v[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // u[g + j] lane L: rows g..g+3 of column 4 L + j
    v[g] = _mm512_maskz_unpacklo_epi64(__mmask8(0xff), t[g], t[g + 2]);
    v[g + 1] = _mm512_maskz_unpackhi_epi64(__mmask8(0xff), t[g], t[g + 2]);
    v[g + 2] = _mm512_maskz_unpacklo_epi64(__mmask8(0xff), t[g + 1], t[g + 3]);
    v[g + 3] = _mm512_maskz_unpackhi_epi64(__mmask8(0xff), t[g + 1], t[g + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // a 4 x 4 transpose of 128-bit lanes: column 4 L + j gathers lane L of each u
    const __m512i x0 = _mm512_maskz_shuffle_i32x4(__mmask16(0xffff), v[j], v[4 + j], 0x44),
                  x1 = _mm512_maskz_shuffle_i32x4(__mmask16(0xffff), v[j], v[4 + j], 0xee);
    const __m512i x2 = _mm512_maskz_shuffle_i32x4(__mmask16(0xffff), v[8 + j], v[12 + j], 0x44),
                  x3 = _mm512_maskz_shuffle_i32x4(__mmask16(0xffff), v[8 + j], v[12 + j], 0xee);
    t[j] = _mm512_maskz_shuffle_i32x4(__mmask16(0xffff), x0, x2, 0x88);
    t[4 + j] = _mm512_maskz_shuffle_i32x4(__mmask16(0xffff), x0, x2, 0xdd);
    t[8 + j] = _mm512_maskz_shuffle_i32x4(__mmask16(0xffff), x1, x3, 0x88);
    t[12 + j] = _mm512_maskz_shuffle_i32x4(__mmask16(0xffff), x1, x3, 0xdd);
  }
  for (int i = 0; i < 16; ++i) v[i] = t[i];
}

/// The pair words (k, k + 1) of 16 consecutive r from rows k and k + 1 of X (r contiguous), lanes past `m` and k
/// past kc zero: lane i is r = i.
TINYGPT_TARGET_AVX512 inline __m512i pairs_across(const float* src, int64_t ld, int64_t k, int64_t kc, __mmask16 m) {
  const __m512 x0 = k < kc ? _mm512_maskz_loadu_ps(m, src + k * ld) : _mm512_setzero_ps();
  const __m512 x1 = k + 1 < kc ? _mm512_maskz_loadu_ps(m, src + (k + 1) * ld) : _mm512_setzero_ps();
  return _mm512_or_si512(bf16_bits(x0), shl16(bf16_bits(x1)));
}

/// pairs_across from bf16 storage: the values are bf16 already, so each 16-bit element is widened to its lane.
TINYGPT_TARGET_AVX512 inline __m512i pairs_across(const tinygpt::bf16* src, int64_t ld, int64_t k, int64_t kc,
                                                  __mmask16 m) {
  const __m512i x0 = k < kc ? _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff), _mm256_maskz_loadu_epi16(m, src + k * ld))
                            : _mm512_setzero_si512();
  const __m512i x1 =
      k + 1 < kc ? _mm512_maskz_cvtepu16_epi32(__mmask16(0xffff), _mm256_maskz_loadu_epi16(m, src + (k + 1) * ld))
                 : _mm512_setzero_si512();
  return _mm512_or_si512(x0, shl16(x1));
}

/// The 16 pair words of k in [k, k + 32) of one row of X with k contiguous (k past kc zero): lane i is pair i.
TINYGPT_TARGET_AVX512 inline __m512i pairs_along(const float* src, int64_t k, int64_t kc) {
  // 16-bit element e of (a, b) is 2 e: the low halves of a's 16 lanes, then of b's.
  const __m512i low_halves = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28,
                                              26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512 x0 = _mm512_maskz_loadu_ps(lanes16(kc - k), src + k);
  const __m512 x1 = _mm512_maskz_loadu_ps(lanes16(kc - k - 16), src + k + 16);
  return _mm512_permutex2var_epi16(bf16_bits(x0), low_halves, bf16_bits(x1));
}

/// pairs_along from bf16 storage: 32 consecutive bf16 values are the 16 pair words as they lie.
TINYGPT_TARGET_AVX512 inline __m512i pairs_along(const tinygpt::bf16* src, int64_t k, int64_t kc) {
  const int64_t n = kc - k;
  const __mmask32 m = n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1);
  return _mm512_maskz_loadu_epi16(m, src + k);
}

/// Packs rows [r0, r0 + rows) x k [k0, k0 + kc) of X (X(r, k) = X[r * ld + k] when k_contig, else X[k * ld + r])
/// into panels W rows wide of bf16 pairs, kcp (even) deep, zero-padded: panel p at dst + p * W * kcp, the pair kp of
/// row r at 32-bit word L::at(kp, r) of it. L::kRowStep and L::kPairStep are the word distances between rows and
/// between pairs (within 16 aligned pairs). Where the source's contiguous axis is not the layout's, 16 x 16 blocks of
/// pair words are transposed in registers (a scatter store per vector was a third of the packing's time).
/// S is the storage read: f32 (rounded as packed) or bf16 (as it is).
template <int W, class L, class S>
TINYGPT_TARGET_AVX512 void pack_bf16_pairs(bool k_contig, const S* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0,
                                           int64_t kc, int64_t kcp, uint16_t* dst) {
  const int64_t pairs = kcp / 2;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t p = 0; p * W < rows; ++p) {
    auto* const d = reinterpret_cast<int32_t*>(dst + p * W * kcp);
    const int64_t valid = std::min<int64_t>(W, rows - p * W);
    if (!k_contig) {
      // Rows are contiguous in X: per pair, 16 rows from X's rows k and k + 1.
      const S* src = X + k0 * ld + r0 + p * W;
      for (int h = 0; h < W; h += 16) {
        const __mmask16 m = lanes16(valid - h);
        if constexpr (L::kRowStep == 1) {
          for (int64_t kp = 0; kp < pairs; ++kp)
            _mm512_mask_storeu_epi32(d + L::at(kp, h), lanes16(W - h), pairs_across(src + h, ld, 2 * kp, kc, m));
        } else {
          static_assert(W % 16 == 0 && L::kPairStep == 1, "rows of pairs are written 16 rows at a time");
          for (int64_t kp0 = 0; kp0 < pairs; kp0 += 16) {
            __m512i v[16];
            for (int i = 0; i < 16; ++i) v[i] = pairs_across(src + h, ld, 2 * (kp0 + i), kc, m);
            transpose16x16(v);  // v[r]: row h + r's pairs kp0 .. kp0 + 15
            const __mmask16 out = lanes16(pairs - kp0);
            for (int r = 0; r < 16; ++r) _mm512_mask_storeu_epi32(d + L::at(kp0, h + r), out, v[r]);
          }
        }
      }
    } else if constexpr (L::kPairStep == 1) {
      // k is contiguous in X and in the layout: per row, 16 pairs (32 k) at a time.
      for (int64_t r = 0; r < W; ++r) {
        const S* src = X + (r0 + p * W + r) * ld + k0;
        for (int64_t kp = 0; kp < pairs; kp += 16) {
          const __m512i w = r < valid ? pairs_along(src, 2 * kp, kc) : _mm512_setzero_si512();
          _mm512_mask_storeu_epi32(d + L::at(kp, r), lanes16(pairs - kp), w);
        }
      }
    } else if constexpr (W % 16 == 0) {
      // k is contiguous in X, rows in the layout: 16 rows' 16 pairs at a time, transposed.
      for (int h = 0; h < W; h += 16) {
        for (int64_t kp0 = 0; kp0 < pairs; kp0 += 16) {
          __m512i v[16];
          for (int i = 0; i < 16; ++i) {
            v[i] =
                h + i < valid ? pairs_along(X + (r0 + p * W + h + i) * ld + k0, 2 * kp0, kc) : _mm512_setzero_si512();
          }
          transpose16x16(v);  // v[j]: pair kp0 + j of rows h .. h + 15
          for (int j = 0; j < 16 && kp0 + j < pairs; ++j) _mm512_storeu_si512(d + L::at(kp0 + j, h), v[j]);
        }
      }
    } else {
      // Panels narrower than 16 rows: per row, 16 pairs scattered to their places.
      for (int64_t r = 0; r < W; ++r) {
        const S* src = X + (r0 + p * W + r) * ld + k0;
        for (int64_t kp = 0; kp < pairs; kp += 16) {
          const __m512i w = r < valid ? pairs_along(src, 2 * kp, kc) : _mm512_setzero_si512();
          _mm512_mask_i32scatter_epi32(d + L::at(kp, r), lanes16(pairs - kp),
                                       _mm512_mullo_epi32(lane, _mm512_set1_epi32(L::kPairStep)), w, 4);
        }
      }
    }
  }
}

/// Pair kp of row r at word kp * W + r: the VNNI layout (op(B) for both kernels, op(A) for AVX512-BF16).
template <int W>
struct PairsByK {
  static constexpr int64_t kRowStep = 1, kPairStep = W;
  static constexpr int64_t at(int64_t kp, int64_t r) { return kp * W + r; }
};
/// Rows of 16 pairs per 32-k tile depth (op(A) for AMX: an A tile is 16 rows of 64 bytes).
template <int W>
struct PairsByRow {
  static constexpr int64_t kRowStep = 16, kPairStep = 1;
  static constexpr int64_t at(int64_t kp, int64_t r) { return (kp / 16) * W * 16 + r * 16 + kp % 16; }
};

/// c[MR x 32] = alpha * acc + beta * c (c not read when beta == 0), from f32 rows of `acc_ld` floats.
template <int MR>
TINYGPT_TARGET_AVX512 inline void store_tile(const float* acc, int64_t acc_ld, float* c, int64_t ldc, float alpha,
                                             float beta) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int i = 0; i < MR; ++i) {
    for (int h = 0; h < 32; h += 16) {
      const __m512 v = _mm512_mul_ps(va, _mm512_loadu_ps(acc + i * acc_ld + h));
      float* ci = c + i * ldc + h;
      _mm512_storeu_ps(ci, beta == 0.0f ? v : _mm512_fmadd_ps(vb, _mm512_loadu_ps(ci), v));
    }
  }
}

/// The packing of the bf16 kernels: MR x NR tiles, op(A) in layout ALayout, op(B) in the VNNI layout, each k block
/// zero-padded to a multiple of KPad.
template <int MR_, int NR_, template <int> class ALayout, int64_t KPad>
struct Bf16Packing {
  static constexpr int MR = MR_, NR = NR_;
  using Packed = uint16_t;
  static constexpr int64_t kpad(int64_t kc) { return round_up(kc, KPad); }
  template <class S>  // f32 (rounded as packed) or bf16 storage
  static void pack_a(bool k_contig, const S* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                     uint16_t* dst) {
    pack_bf16_pairs<MR, ALayout<MR>>(k_contig, X, ld, r0, rows, k0, kc, kpad(kc), dst);
  }
  template <class S>
  static void pack_b(bool k_contig, const S* X, int64_t ld, int64_t r0, int64_t rows, int64_t k0, int64_t kc,
                     uint16_t* dst) {
    pack_bf16_pairs<NR, PairsByK<NR>>(k_contig, X, ld, r0, rows, k0, kc, kpad(kc), dst);
  }
};

/// AVX512-BF16: `vdpbf16ps` adds two products of bf16 pairs into each f32 lane, 32 products per instruction (twice
/// an f32 FMA's, but on the Xeon it ran on it issues at a quarter of their rate: bench_peak). An MR x 32 tile of C in
/// 2 MR zmm accumulators; per pair of k, 2 loads of B and MR broadcasts of A.
struct Avx512Bf16Config : Bf16Packing<8, 32, PairsByK, 2> {
  static constexpr int64_t MC = 192, KC = 512, NC = 4096, KU = 8;
  struct ThreadScope {};
  TINYGPT_TARGET_AVX512 static void kernel(int64_t kcp, const uint16_t* __restrict a, const uint16_t* __restrict b,
                                           float* c, int64_t ldc, float alpha, float beta) {
    kernel_on(
        kcp, [a](int64_t kp, int i) { return a + (kp * MR + i) * 2; }, b, c, ldc, alpha, beta);
  }
  /// The kernel on op(A) where it lies, bf16 storage with k contiguous: row i at a + i * lda, its pair kp (k = 2 kp,
  /// 2 kp + 1) the 32-bit word at a + i * lda + 2 kp, which the kernel broadcasts as it would the packed one; kcp
  /// even, all MR rows readable. The same products in the same order: the same bits as packing first.
  TINYGPT_TARGET_AVX512 static void kernel_rows(int64_t kcp, const uint16_t* a, int64_t lda,
                                                const uint16_t* __restrict b, float* c, int64_t ldc, float alpha,
                                                float beta) {
    kernel_on(
        kcp, [a, lda](int64_t kp, int i) { return a + i * lda + 2 * kp; }, b, c, ldc, alpha, beta);
  }

 private:
  /// The MR x NR tile over kcp / 2 pairs, A's pair (kp, i) at a_at(kp, i).
  template <class AAt>
  TINYGPT_TARGET_AVX512 static void kernel_on(int64_t kcp, AAt a_at, const uint16_t* __restrict b, float* c,
                                              int64_t ldc, float alpha, float beta) {
    __m512 acc[MR][2];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int64_t kp = 0; kp < kcp / 2; ++kp) {
      const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + kp * 2 * NR);
      const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + kp * 2 * NR + NR);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        int32_t pair;
        std::memcpy(&pair, a_at(kp, i), sizeof pair);
        const __m512bh ai = (__m512bh)_mm512_set1_epi32(pair);
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
        acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
      }
    }
    alignas(64) float out[MR * NR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      _mm512_store_ps(out + i * NR, acc[i][0]);
      _mm512_store_ps(out + i * NR + 16, acc[i][1]);
    }
    store_tile<MR>(out, NR, c, ldc, alpha, beta);
  }
};

/// AMX's tile configuration (palette 1): for each of the 8 tiles its rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

/// Every tile 16 rows of 64 bytes: 16 x 16 f32, or 16 x 32 bf16.
inline constexpr TileConfig kAllTiles16x64 = [] {
  TileConfig c;
  for (int t = 0; t < 8; ++t) c.colsb[t] = 64, c.rows[t] = 16;
  return c;
}();

/// ldtilecfg. Not GCC 12's _tile_loadconfig: its asm operand tells the compiler it reads 8 bytes, so the stores
/// filling the other 56 of a local config could be dropped (they were, in an -march=x86-64-v3 build: the first
/// tilezero then faulted); this operand is the whole configuration.
TINYGPT_TARGET_AMX inline void load_tile_config(const TileConfig& cfg) {
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

/// tilerelease, callable from code compiled without AMX (GCC does not apply a target attribute written on an
/// out-of-class destructor, so the intrinsic cannot be inlined there).
TINYGPT_TARGET_AMX inline void release_tiles() { _tile_release(); }

/// AMX-BF16: `tdpbf16ps` multiplies a 16 x 32 bf16 tile by a 32 x 16 one (16 x 16 x 32 products) into a 16 x 16 f32
/// tile. A 32 x 32 tile of C in 4 tile registers, per 32 k: 2 A tiles, 2 B tiles, 4 products. Linux hands a process
/// the tile state only when asked (arch_prctl ARCH_REQ_XCOMP_PERM, done by the detection); a thread configures its
/// tiles once per call (ThreadScope) and releases them after.
struct AmxConfig : Bf16Packing<32, 32, PairsByRow, 32> {
  // KC 256: a 32-row op(A) block and a 32-column op(B) panel of one k block (16 KB each) share L1 (512 was slower on
  // the big 6-layer shapes, 128 mixed). MC 64: as good as any row block tried in bench_matmul --bf16, and a faster
  // 6-layer step than 256 (docs/RESULTS.md, "CPU matmul kernels" and "Measurements behind design decisions").
  // kLongKMC 256: the row block of products K >= 8 KC deep (weight gradients over the tokens): each op(B) panel then
  // serves 8 row tiles from L1 instead of 2, which sped up the 6-layer weight gradients (docs/RESULTS.md,
  // "Measurements behind design decisions").
  static constexpr int64_t MC = 64, KC = 256, NC = 4096, KU = 32, kLongKMC = 256;
  struct ThreadScope {
    TINYGPT_TARGET_AMX ThreadScope() { load_tile_config(kAllTiles16x64); }
    TINYGPT_TARGET_AMX ~ThreadScope() { _tile_release(); }
    ThreadScope(const ThreadScope&) = delete;
    ThreadScope& operator=(const ThreadScope&) = delete;
  };
  TINYGPT_TARGET_AMX static void kernel(int64_t kcp, const uint16_t* __restrict a, const uint16_t* __restrict b,
                                        float* c, int64_t ldc, float alpha, float beta);
};

/// c (32 x 32 f32, row stride ldc) = (c if `load`, else 0) + a (32 rows packed as AmxConfig's op(A)) @ b (32 columns
/// in the VNNI layout), kcp (a multiple of 32) deep. Tiles: 0-3 C (rows 0-15 / 16-31 x columns 0-15 / 16-31), 4-5
/// A, 6-7 B. C goes in and out of the tiles directly (tileloadd / tilestored), with no pass of vector code over it.
TINYGPT_TARGET_AMX inline void amx_product_32x32(int64_t kcp, const uint16_t* __restrict a,
                                                 const uint16_t* __restrict b, float* c, int64_t ldc, bool load) {
  constexpr int64_t MR = 32, NR = 32;
  const int64_t stride = ldc * int64_t(sizeof(float));
  if (load) {
    _tile_loadd(0, c, stride);
    _tile_loadd(1, c + 16, stride);
    _tile_loadd(2, c + 16 * ldc, stride);
    _tile_loadd(3, c + 16 * ldc + 16, stride);
  } else {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t k = 0; k < kcp; k += 32) {
    const uint16_t* at = a + k * MR;  // 32 rows x 32 k
    const uint16_t* bt = b + k * NR;  // 16 pairs x 32 columns x 2
    _tile_loadd(4, at, 64);
    _tile_loadd(5, at + 16 * 32, 64);
    _tile_loadd(6, bt, 4 * NR);
    _tile_loadd(7, bt + 32, 4 * NR);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, c, stride);
  _tile_stored(1, c + 16, stride);
  _tile_stored(2, c + 16 * ldc, stride);
  _tile_stored(3, c + 16 * ldc + 16, stride);
}

/// out (32 x 32 f32, rows of 32) = a @ b.
TINYGPT_TARGET_AMX inline void amx_product_32x32(int64_t kcp, const uint16_t* __restrict a,
                                                 const uint16_t* __restrict b, float* out) {
  amx_product_32x32(kcp, a, b, out, 32, false);
}

TINYGPT_TARGET_AMX inline void AmxConfig::kernel(int64_t kcp, const uint16_t* __restrict a,
                                                 const uint16_t* __restrict b, float* c, int64_t ldc, float alpha,
                                                 float beta) {
  if (alpha == 1.0f && (beta == 0.0f || beta == 1.0f)) return amx_product_32x32(kcp, a, b, c, ldc, beta == 1.0f);
  alignas(64) float out[MR * NR];
  amx_product_32x32(kcp, a, b, out);
  store_tile<MR>(out, NR, c, ldc, alpha, beta);
}

}  // namespace tinygpt::cpu::bf16_isa
#endif
