// Flash attention on the CPU, its building blocks (kernels/cpu/attention.cpp has the overview): dropout rows, the
// register-blocked tile products (TileProducts: f32, or bf16 operands on AMX tiles, AVX512-BF16 dot products or
// rounded copies), the tile sizes, and the softmax pieces of one tile in its two orientations. Only
// kernels/cpu/attention.cpp includes it.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "../attention.h"
#include "../scalar_math.h"
#include "bf16_rows.h"
#include "gemm.h"
#include "parallel.h"
#include "tile_bf16.h"

namespace tinygpt::cpu::attention_detail {

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Keys s < causal_end(g, t) (kernels/scalar_math.h) are visible to query t.

/// Index of attention element (b, h, t, s = 0) in the dropout hash (kernels/attention.h).
inline int64_t dropout_row(const AttentionGeom& g, int64_t b, int64_t h, int64_t t) {
  return ((b * g.NH + h) * g.T + t) * g.S;
}

/// The dropout rows (DropoutRow) of a tile's queries t0 .. t0+n-1, as three arrays, so that a loop down a column of a
/// key-major tile (one key, the tile's queries) vectorizes.
struct DropoutRows {
  std::vector<uint32_t> lo0, key0, key1;

  explicit DropoutRows(int64_t n) : lo0(size_t(n)), key0(size_t(n)), key1(size_t(n)) {}
  void fill(const AttentionGeom& g, int64_t b, int64_t h, int64_t t0) {
    for (size_t i = 0; i < lo0.size(); ++i) {
      const DropoutRow r(g.dropout_seed.value(), dropout_row(g, b, h, t0 + int64_t(i)));
      lo0[i] = r.lo0, key0[i] = r.key0, key1[i] = r.key1;
    }
  }
  /// dropout_keep of key s for query t0 + i.
  bool keep(int64_t i, int64_t s, float p) const {
    return DropoutRow::keep(lo0[size_t(i)], key0[size_t(i)], key1[size_t(i)], s, p);
  }
};

/// Row (i0, i1, i2) of a tensor read through three element strides (features contiguous).
template <class P>
P at(P base, const int64_t* stride, int64_t i0, int64_t i1, int64_t i2) {
  return base + i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
}

/// The dot product of two rows, summed in T; rows of bf16 storage (S) are widened as they are read.
template <class S, class T = compute_t<S>>
T dot(const S* a, const S* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += T(a[i]) * T(b[i]);
  return acc;
}

/// dot over bf16 storage in f32: widened 64 at a time, then summed in vector lanes (faster in the flash backward's D
/// than the generic loop converting element by element, timed call by call).
inline float dot(const bf16* a, const bf16* b, int64_t n) {
  float wa[64], wb[64], acc = 0;
  for (int64_t i = 0; i < n; i += 64) {
    const int64_t w = std::min<int64_t>(64, n - i);
    widen_range(wa, a + i, w);
    widen_range(wb, b + i, w);
#pragma omp simd reduction(+ : acc)
    for (int64_t j = 0; j < w; ++j) acc += wa[j] * wb[j];
  }
  return acc;
}

template <class T>
void axpy_row(T* y, T alpha, const T* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// ---------------------------------------------------------------------------------------------------------------
// Tile products.

/// SIMD vectors as GCC/Clang vector extensions: the micro-kernel's accumulators must live in registers, which
/// plain loops over an accumulator array do not guarantee. As wide as the target's registers (AVX-512: 64 bytes,
/// AVX: 32): wider vectors and the wider tiles they bring sped up attention on the CPU recipe (docs/RESULTS.md,
/// "Measurements behind design decisions").
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
template <class T>
struct Simd;
template <>
struct Simd<float> {
  typedef float V __attribute__((vector_size(kVecBytes)));
};
template <>
struct Simd<double> {
  typedef double V __attribute__((vector_size(kVecBytes)));
};
template <class T>
using Vec = typename Simd<T>::V;
template <class T>
constexpr int64_t kLanes = int64_t(sizeof(Vec<T>) / sizeof(T));

template <class T>
inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
inline void store(T* p, Vec<T> v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
inline Vec<T> splat(T x) {
  return Vec<T>{} + x;
}
template <class T>
inline T hsum(Vec<T> v) {
  T sum = 0;
  for (int64_t i = 0; i < kLanes<T>; ++i) sum += v[i];
  return sum;
}

/// exp of every lane, written on vectors so that no branch can appear (plain loops calling a scalar exp with
/// clamps were turned into control flow by jump threading and not vectorized). float: Cephes' 2^n * exp(r),
/// |r| <= ln2/2, degree-6 polynomial (about 1 ulp), n rounded with the 1.5 * 2^23 trick and 2^n built from
/// exponent bits; n <= -127 (x below about -87.7, -inf included) gives exactly 0, NaN stays NaN.
/// double: std::exp per lane (the f64 kernels are for checking, not speed).
inline Vec<float> exp_vec(Vec<float> x) {
  typedef int32_t VI __attribute__((vector_size(kVecBytes)));
  const Vec<float> lo = splat(-100.0f), hi = splat(88.0f), shift = splat(12582912.0f);
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const Vec<float> z = x * 1.44269504088896341f + shift;
  const Vec<float> n = z - shift;
  const Vec<float> r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Vec<float> y = splat(1.9875691500e-4f);
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * r * r + r + 1.0f;
  VI ni;
  std::memcpy(&ni, &z, sizeof ni);
  ni -= 0x4B400000;  // the bits of shift: what is left is n
  ni = ni < -127 ? VI{} - 127 : ni;
  ni = (ni + 127) << 23;
  Vec<float> pow2n;
  std::memcpy(&pow2n, &ni, sizeof pow2n);
  return y * pow2n;
}
inline Vec<double> exp_vec(Vec<double> x) {
  for (int64_t i = 0; i < kLanes<double>; ++i) x[i] = std::exp(x[i]);
  return x;
}

/// Lanes [n, round_up(n, kLanes)) of a row set to -inf, so whole vectors can run past n and give exp() = 0 there.
template <class T>
int64_t pad_row(T* row, int64_t n) {
  const int64_t n_pad = round_up(n, kLanes<T>);
  std::fill(row + n, row + n_pad, kNegInf<T>);
  return n_pad;
}

/// Columns per register block: two vectors.
template <class T>
constexpr int64_t kCols = 2 * kLanes<T>;
constexpr int64_t kRows = 6;  // 12 accumulators + 2 B vectors + 1 broadcast: 15 of the 16 AVX2 registers
                              // (AVX-512, 12 rows in 24 of 32 registers: no faster on the CPU recipe)

/// C[r, 0:N] (+)= sum_k A[r * ars + k * aks] * B[k * ldb + 0:N] for r < R: an R x kCols block of C is held
/// in 2R vector registers while k runs.
template <class T, int R>
inline void matmul_rows(T* __restrict C, int64_t ldc, const T* __restrict A, int64_t ars, int64_t aks,
                        const T* __restrict B, int64_t ldb, int64_t K, int64_t N, bool accumulate) {
  constexpr int64_t L = kLanes<T>;
  int64_t n0 = 0;
  for (; n0 + 2 * L <= N; n0 += 2 * L) {
    Vec<T> c[R][2];
    for (int r = 0; r < R; ++r) {
      c[r][0] = accumulate ? load(C + r * ldc + n0) : Vec<T>{};
      c[r][1] = accumulate ? load(C + r * ldc + n0 + L) : Vec<T>{};
    }
    for (int64_t k = 0; k < K; ++k) {
      const Vec<T> b0 = load(B + k * ldb + n0), b1 = load(B + k * ldb + n0 + L);
      for (int r = 0; r < R; ++r) {
        const T a = A[r * ars + k * aks];
        c[r][0] += a * b0;
        c[r][1] += a * b1;
      }
    }
    for (int r = 0; r < R; ++r) {
      store(C + r * ldc + n0, c[r][0]);
      store(C + r * ldc + n0 + L, c[r][1]);
    }
  }
  if (n0 < N) {  // fewer than kCols columns left (head dims that are not a multiple of kCols)
    const int64_t nw = N - n0;
    for (int r = 0; r < R; ++r) {
      T* c = C + r * ldc + n0;
      if (!accumulate) std::fill_n(c, nw, T(0));
      for (int64_t k = 0; k < K; ++k) axpy_row(c, A[r * ars + k * aks], B + k * ldb + n0, nw);
    }
  }
}

/// C (M x N, row stride ldc) (+)= A (M x K, element (r, k) at A[r * ars + k * aks]) @ B (K x N, row stride ldb).
template <class T>
void matmul_tile(T* C, int64_t ldc, const T* A, int64_t ars, int64_t aks, const T* B, int64_t ldb, int64_t M, int64_t K,
                 int64_t N, bool accumulate) {
  int64_t r = 0;
  for (; r + kRows <= M; r += kRows)
    matmul_rows<T, kRows>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate);
  if (r + 4 <= M) matmul_rows<T, 4>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate), r += 4;
  if (r + 2 <= M) matmul_rows<T, 2>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate), r += 2;
  if (r < M) matmul_rows<T, 1>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate);
}

/// dst[0, n) = src[0, n) rounded to bf16 (round_bf16 is branch-free, so the loop vectorizes).
inline void round_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = round_bf16(src[i]);
}

/// dst (D x ld) = rows [0, n) of src (row stride src_stride, D contiguous features) transposed; columns
/// [n, round_up(n, kCols)) are zeroed so the tile products can run whole register blocks. Rows of bf16 storage (S)
/// are widened as they are packed.
template <class T, class S>
void pack_transposed(T* dst, int64_t ld, const S* src, int64_t src_stride, int64_t n, int64_t D) {
  const int64_t n_pad = round_up(n, kCols<T>);
  for (int64_t s = 0; s < n; ++s) {
    const S* row = src + s * src_stride;
    for (int64_t d = 0; d < D; ++d) dst[d * ld + s] = T(row[d]);
  }
  for (int64_t d = 0; d < D; ++d) std::fill(dst + d * ld + n, dst + d * ld + n_pad, T(0));
}

/// An operand of a tile product read where it lies: element (r, c) at p[r * rs + c * cs]; rs or cs is 1.
template <class X>
struct Strided {
  const X* p;
  int64_t rs, cs;
};

/// The flash kernels' tile products, one per thread, on operands stored as S (T, or bf16 for f32 math): C (+)= A @ B,
/// A read where it lies (rows of Q, K, V or dO; a score tile), B either held (X^T of a tile of rows, prepared once
/// and used by several products) or rows of storage. With f32 math on bf16 operands (AttentionMath::BF16, float
/// only) each operand is rounded to bf16 and the products summed in f32, as PyTorch's CPU autocast computes them: on
/// the unit gemm's bf16 products run on (bf16_kernel(): AMX-BF16 or AVX512-BF16), packed straight from storage (bf16 as
/// it lies, f32 rounded as packed); else rounded (or widened from bf16) into scratch for the f32 micro-kernel.
template <class T, class S = T>
class TileProducts {
 public:
  static constexpr int kHeld = 3;  // B operands held at once; one more slot holds the B of a single product
  static_assert(kHeld + 1 == Bf16Tiles::kSlots);

  explicit TileProducts(const AttentionGeom& g) {
    if constexpr (std::is_same_v<T, float>) {
      if (g.math != AttentionMath::BF16) return;
      if (bf16_kernel() != Bf16Kernel::F32Units) {
        units_.emplace(bf16_kernel());
      } else {
        round_ = true;
      }
    }
  }

  /// Holds X^T as B operand `i` of the products that follow: X's rows [0, n) of `dim` features (row stride `stride`)
  /// as a dim x n_pad operand, columns [n, n_pad) zero.
  void hold_transposed(int i, const S* X, int64_t stride, int64_t n, int64_t n_pad, int64_t dim) {
    if constexpr (std::is_same_v<T, float>) {
      if (units_) return units_->pack_b(i, X, 1, stride, dim, n);
    }
    std::vector<T>& buf = held_[size_t(i)];
    buf.resize(size_t(dim * n_pad));
    pack_transposed(buf.data(), n_pad, X, stride, n, dim);
    if constexpr (std::is_same_v<S, T>) {
      if (round_)
        for (T& x : buf) x = round_bf16(x);
    }
    held_at_[size_t(i)] = buf.data();
    held_ld_[size_t(i)] = n_pad;
  }

  /// Holds X itself as B operand `i`: rows [0, K) of N features (row stride `stride`), a K x N operand.
  void hold_rows(int i, const S* X, int64_t stride, int64_t K, int64_t N) {
    if constexpr (std::is_same_v<T, float>) {
      if (units_) return units_->pack_b(i, X, stride, 1, K, N);
    }
    if constexpr (std::is_same_v<S, T>) {
      if (!round_) {  // read where it lies
        held_at_[size_t(i)] = X;
        held_ld_[size_t(i)] = stride;
        return;
      }
    }
    std::vector<T>& buf = held_[size_t(i)];
    buf.resize(size_t(K * N));
    round_rows(buf.data(), X, K, N, stride);
    held_at_[size_t(i)] = buf.data();
    held_ld_[size_t(i)] = N;
  }

  /// C (M x N, row stride ldc) (+)= A (M x K) @ held operand `i` (K x N); on a bf16 unit, the blocks `band` rules
  /// out are skipped.
  template <class X>
  void operator()(T* C, int64_t ldc, Strided<X> A, int i, int64_t M, int64_t K, int64_t N, bool accumulate,
                  Band band = {}) {
    if constexpr (std::is_same_v<T, float>) {
      if (units_) {
        units_->pack_a(A.p, A.rs, A.cs, M, K);
        return units_->run(C, ldc, i, M, K, N, accumulate, band);
      }
    }
    const Strided<T> a = math_a(A, M, K);
    matmul_tile(C, ldc, a.p, a.rs, a.cs, held_at_[size_t(i)], held_ld_[size_t(i)], M, K, N, accumulate);
  }

  /// C (M x N, row stride ldc) (+)= A (M x K) @ B (K x N, rows of storage: element (k, n) at B[k * ldb + n]), held
  /// for this product only.
  template <class X>
  void operator()(T* C, int64_t ldc, Strided<X> A, const S* B, int64_t ldb, int64_t M, int64_t K, int64_t N,
                  bool accumulate, Band band = {}) {
    hold_rows(kHeld, B, ldb, K, N);
    (*this)(C, ldc, A, kHeld, M, K, N, accumulate, band);
  }

 private:
  /// rows x n of src (row stride ld) into dst (row stride n): rounded to bf16 (f32 storage), widened (bf16).
  template <class X>
  static void round_rows(T* dst, const X* src, int64_t rows, int64_t n, int64_t ld) {
    for (int64_t r = 0; r < rows; ++r) {
      if constexpr (std::is_same_v<X, T>) {
        if constexpr (std::is_same_v<T, float>) round_row(dst + r * n, src + r * ld, n);  // round_ is float's only
      } else {
        widen_range(dst + r * n, src + r * ld, n);
      }
    }
  }

  /// A as the f32 micro-kernel reads it: where it lies, or rounded (widened) into scratch in its own orientation.
  template <class X>
  Strided<T> math_a(Strided<X> A, int64_t M, int64_t K) {
    if constexpr (std::is_same_v<X, T>) {
      if (!round_) return {A.p, A.rs, A.cs};
    }
    ra_.resize(size_t(M * K));
    if (A.cs == 1) {  // rows of K
      round_rows(ra_.data(), A.p, M, K, A.rs);
      return {ra_.data(), K, 1};
    }
    round_rows(ra_.data(), A.p, K, M, A.cs);  // columns of M
    return {ra_.data(), 1, M};
  }

  std::optional<Bf16Tiles> units_;  // AMX or AVX512-BF16
  bool round_ = false;
  std::array<std::vector<T>, kHeld + 1> held_;
  std::array<const T*, kHeld + 1> held_at_{};
  std::array<int64_t, kHeld + 1> held_ld_{};
  std::vector<T> ra_;
};

/// dst[0, n) += src[0, n) (or, without `add`, = src): in T, or for bf16 storage (S) widened, added and rounded once.
template <class T, class S>
void add_row(S* dst, const T* src, int64_t n, bool add = true) {
  if (!add) {
    if constexpr (std::is_same_v<S, T>) {
      std::copy_n(src, n, dst);
    } else {
      round_range(dst, src, n);
    }
    return;
  }
  if constexpr (std::is_same_v<S, T>) {
    axpy_row(dst, T(1), src, n);
  } else {  // in vector registers, 64 at a time (a loop over bf16 elements did not vectorize)
    float sum[64];
    for (int64_t i = 0; i < n; i += 64) {
      const int64_t w = std::min<int64_t>(64, n - i);
      widen_range(sum, dst + i, w);
      for (int64_t j = 0; j < w; ++j) sum[j] += src[i + j];
      round_range(dst + i, sum, w);
    }
  }
}

/// The causal triangle of a tile pair (queries from t0, keys from s0) as the Band of one of its products: key s0 + j
/// is visible from query t0 + i while j - i <= t0 + S - T - s0. `queries_first`: the product's first index (C's rows)
/// counts queries and its second (C's columns, or A's k with `on_k`) keys; else the other way round. Plain causal
/// attention only (`plain`: no score modifier, which masks on its own); else no band.
inline Band causal_band(const AttentionGeom& g, bool plain, int64_t t0, int64_t s0, bool queries_first, bool on_k) {
  if (!g.causal || !plain) return Band{};
  const int64_t reach = t0 + (g.S - g.T) - s0;  // key - query, in tile-local indices, is at most this
  return queries_first ? Band{-Band::kFar, reach, on_k} : Band{-reach, Band::kFar, on_k};
}

struct Tiles {
  int64_t Br, Bc;  // both multiples of kCols: query lanes and key columns are padded to whole register blocks
};

/// Tile sizes by head dim (the reasons: attention.cpp's header comment; the measurements: docs/RESULTS.md,
/// "Measurements behind design decisions").
inline Tiles flash_tiles(const AttentionGeom& g) {
  if (std::max(g.E, g.Ev) > 128) return Tiles{32, 32};
  // bf16 operands on a bf16 unit: products pack their operands (bar bf16 rows read in place), so larger tiles pay
  // (bench_attention --bf16; docs/RESULTS.md, "Measurements behind design decisions").
  if (g.math == AttentionMath::BF16 && bf16_kernel() != Bf16Kernel::F32Units)
    return g.causal && g.T <= 128 ? Tiles{64, 64} : Tiles{128, 128};
  return g.causal && g.T <= 128 ? Tiles{kCols<float>, kCols<float>} : Tiles{64, 64};
}

// ---------------------------------------------------------------------------------------------------------------
// Softmax pieces of one tile. Two orientations: key-major (rows are keys, lanes are queries: the forward pass and
// the dQ pass, which read K and V in place and pack Q^T once per query tile) and query-major (rows are queries:
// the dK/dV pass, which reads Q and dO in place and packs K^T and V^T once per key tile).

/// Key-major tile st (nc key rows of ld, lanes [0, n_pad) computed, queries [t0, t0 + nr) valid) of raw q.k
/// scores -> logits: times scale plus the additive mask, -inf where the key is masked (causal, padding).
template <class T>
void key_major_logits(T* st, int64_t ld, int64_t nc, int64_t nr, int64_t n_pad, int64_t b, int64_t h, int64_t t0,
                      int64_t s0, const T* mask, const uint8_t* kp, const AttentionGeom& g, bool scaled = true) {
  const T scale = T(g.scale);
  for (int64_t j = 0; j < nc; ++j) {
    T* row = st + j * ld;
    if (kp && kp[b * g.S + s0 + j]) {
      std::fill(row, row + n_pad, kNegInf<T>);
      continue;
    }
    if (scaled)
      for (int64_t i = 0; i < n_pad; ++i) row[i] *= scale;
    if (mask) {
      const T* m = at(mask, g.mask_stride, b, h, t0) + (s0 + j) * g.mask_stride[3];
      for (int64_t i = 0; i < nr; ++i) row[i] += m[i * g.mask_stride[2]];
    }
    if (g.causal) {  // key s0 + j is visible from query s0 + j - (S - T) on
      const int64_t first = std::clamp<int64_t>(s0 + j - (g.S - g.T) - t0, 0, n_pad);
      std::fill(row, row + first, kNegInf<T>);
    }
  }
}

/// The forward's online softmax over a key-major tile, every query lane at once: per query the running max m, the
/// running sum l of exp(logit - m), and for each new tile the factor exp(m_old - m_new) that rescales what was summed.
template <class T>
struct OnlineSoftmax {
  std::vector<T> m, l, m_sub, alpha, sums;

  explicit OnlineSoftmax(int64_t lanes)
      : m(size_t(lanes)), l(size_t(lanes)), m_sub(size_t(lanes)), alpha(size_t(lanes)), sums(size_t(lanes)) {}
  void reset() {
    std::fill(m.begin(), m.end(), kNegInf<T>);
    std::fill(l.begin(), l.end(), T(0));
  }
  /// Logits st (nc key rows of ld, lanes [0, n_pad)) -> exp(logit - new running max): the tile's probabilities,
  /// unnormalized; the new max, alpha and the tile's row sums kept.
  void update(T* st, int64_t ld, int64_t nc, int64_t n_pad, T scale = T(1)) {
    constexpr int64_t L = kLanes<T>;
    std::fill(m_sub.begin(), m_sub.end(), kNegInf<T>);
    for (int64_t j = 0; j < nc; ++j) {
      const T* row = st + j * ld;
      for (int64_t i = 0; i < n_pad; ++i) m_sub[size_t(i)] = std::max(m_sub[size_t(i)], row[i]);
    }
    for (int64_t i = 0; i < n_pad; ++i) {
      const T m_new = std::max(m[size_t(i)], m_sub[size_t(i)] * scale);
      m_sub[size_t(i)] = m_new == kNegInf<T> ? T(0) : m_new;  // a query that sees nothing yet: exp(-inf - 0) = 0
      alpha[size_t(i)] = m[size_t(i)] - m_sub[size_t(i)];
      m[size_t(i)] = m_new;
      sums[size_t(i)] = 0;
    }
    for (int64_t i = 0; i < n_pad; i += L) store(alpha.data() + i, exp_vec(load(alpha.data() + i)));
    const Vec<T> vs = splat(scale);
    for (int64_t j = 0; j < nc; ++j) {
      T* row = st + j * ld;
      for (int64_t i = 0; i < n_pad; i += L) {
        const Vec<T> p = exp_vec(load(row + i) * vs - load(m_sub.data() + i));
        store(row + i, p);
        store(sums.data() + i, load(sums.data() + i) + p);
      }
    }
  }
  /// l = l * alpha + the tile's sums for queries [0, nr); their output rows (o, ev wide) and, with pbar, their
  /// probabilities per clipped distance (w wide) times alpha.
  void rescale(int64_t nr, T* o, int64_t ev, T* pbar, int64_t w) {
    for (int64_t i = 0; i < nr; ++i) {
      const T a = alpha[size_t(i)];
      l[size_t(i)] = l[size_t(i)] * a + sums[size_t(i)];
      if (a == T(1)) continue;
      for (int64_t e = 0; e < ev; ++e) o[i * ev + e] *= a;
      if (pbar)
        for (int64_t c = 0; c < w; ++c) pbar[i * w + c] *= a;
    }
  }
};

/// Query-major tile of raw scores s and dO.v products dp, rows [t0, t0 + nr) of head (b, h), keys [s0, s0 + nc):
/// s becomes the dropped probabilities Pd and dp becomes dS * scale. Masked entries become 0.
template <class T>
void query_major_probs_and_ds(T* s, T* dp, int64_t ld, int64_t nr, int64_t nc, int64_t b, int64_t h, int64_t t0,
                              int64_t s0, const T* lse, const T* Drow, const T* mask, const uint8_t* kp,
                              const AttentionGeom& g) {
  const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
  const bool dropout = g.dropout_p > 0.0f;
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t t = t0 + i, row = (b * g.NH + h) * g.T + t;
    T* sr = s + i * ld;
    T* dr = dp + i * ld;
    const T L = lse[row], D = Drow[row];
    const int64_t lim = L == kNegInf<T> ? 0 : std::clamp<int64_t>(causal_end(g, t) - s0, 0, nc);
    if (!mask && !kp) {
      for (int64_t j = 0; j < lim; ++j) sr[j] = sr[j] * scale - L;
    } else {
      const T* mr = mask ? at(mask, g.mask_stride, b, h, t) + s0 * g.mask_stride[3] : nullptr;
      const uint8_t* kpr = kp ? kp + b * g.S + s0 : nullptr;
      for (int64_t j = 0; j < lim; ++j) {
        T x = sr[j] * scale;
        if (mr) x += mr[j * g.mask_stride[3]];
        if (kpr && kpr[j]) x = kNegInf<T>;
        sr[j] = x - L;
      }
    }
    const int64_t lim_pad = pad_row(sr, lim);  // <= nc rounded up to whole vectors, within the row
    for (int64_t j = 0; j < lim_pad; j += kLanes<T>) {
      const Vec<T> p = exp_vec(load(sr + j));
      store(sr + j, p);
      if (!dropout) store(dr + j, p * (load(dr + j) - D) * scale);
    }
    if (dropout) {
      const DropoutRow drop(g.dropout_seed.value(), dropout_row(g, b, h, t) + s0);
      for (int64_t j = 0; j < lim; ++j) {
        const T f = drop.keep(j, g.dropout_p) ? keep_scale : T(0);
        dr[j] = sr[j] * (dr[j] * f - D) * scale;
        sr[j] *= f;
      }
    }
    std::fill(sr + lim, sr + nc, T(0));
    std::fill(dr + lim, dr + nc, T(0));
  }
}

}  // namespace tinygpt::cpu::attention_detail
