// Attention kernels: a naive reference and flash attention (forward and FlashAttention-2 backward).
//
// Flash tile products. Every product is one register-blocked micro-kernel, C (+)= A @ B with a kRows x kCols
// block of C in vector registers (6 x 16 floats in 12 AVX2 accumulators; 6 x 32 in 12 AVX-512 ones), A read
// through arbitrary strides and B by contiguous rows. Q, K, V and dO are therefore read in place through their strides; the only packing is
// a transposed copy of one operand per tile, chosen so that it is amortized over a whole task:
//   forward, parallel over (batch, head, query tile): Q^T is packed once; each key tile gives the key-major
//     score tile S^T = K Q^T (rows are keys, lanes are queries), the online softmax (running max m, running
//     sum l) runs on all query lanes at once, and O += P V reads P transposed out of S^T;
//   backward pass 1, parallel over (batch, kv head, key tile): K^T and V^T are packed once; for every head of
//     the group and every query tile that sees the key tile: S = Q K^T, dP = dO V^T (query-major),
//     P = exp(S * scale + mask - lse), dS = P * (dP - D) with D = rowsum(dO * O) precomputed,
//     dV += P^T dO, dK += dS^T Q;
//   backward pass 2, parallel over (batch, head, query tile): Q^T and dO^T are packed once; per key tile
//     S^T = K Q^T, dP^T = V dO^T (key-major), dS as above, dQ += dS K.
// Each gradient element is summed by exactly one task in a fixed order: no atomics, no per-thread copies, and
// the result does not depend on the number of threads. The price is that S and dP are computed in both
// passes (7 tile products per tile pair instead of 5).
//
// Tiles: Br = Bc = 64 for head dims up to 128 (measured on Zen 3: 32..128 all within noise, 64 x 64 never
// worse); beyond that 32 x 32 keeps the packed E x Br tile at 32 KiB. Causal with T <= 128: one register block
// (kCols: 16 with AVX2, 32 with AVX-512), as the diagonal tiles compute their masked half too (nanoGPT's CPU
// recipe, T = 64, E = 32, AVX2 vectors, forward + backward per training step: 64 x 64 6.3 ms, 32 x 32 5.3 ms,
// 16 x 16 5.1 ms). Per thread the scratch is a few tiles:
// O(Br * Bc + (Br + Bc) * (E + Ev)), no T x S buffer. Causal: key tiles entirely above the diagonal are never
// visited (forward and both backward passes); tiles crossing it are masked element by element.
//
// bf16 operands (AttentionMath::BF16, float only): every tile product goes through TileProducts, which rounds its
// operands to bf16 (Q, K, V, dO, and the P and dS tiles) and sums in f32, on AMX-BF16 tiles where the CPU has them
// (kernels/cpu/tile_bf16.h: each product packs its operands, so the tiles are larger there, see flash_tiles), else
// on rounded copies for the f32 micro-kernel. Softmax statistics, D and the outputs stay f32.
//
// exp() is a vectorized polynomial for float (see exp_vec); the naive reference uses std::exp.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "kernels/cpu/attention_kernels.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/tile_bf16.h"
#include "kernels/scalar_math.h"

namespace tinygpt::cpu {
namespace {

template <class T> constexpr T kNegInf = -std::numeric_limits<T>::infinity();

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Keys s < causal_end(g, t) (kernels/scalar_math.h) are visible to query t.

/// Index of attention element (b, h, t, s = 0) in the dropout hash (kernels/attention.h).
inline int64_t dropout_row(const AttentionGeom& g, int64_t b, int64_t h, int64_t t) { return ((b * g.NH + h) * g.T + t) * g.S; }

/// The dropout rows (DropoutRow) of a tile's queries t0 .. t0+n-1, as three arrays, so that a loop down a column of a
/// key-major tile (one key, the tile's queries) vectorizes.
struct DropoutRows {
  std::vector<uint32_t> lo0, key0, key1;

  explicit DropoutRows(int64_t n) : lo0(size_t(n)), key0(size_t(n)), key1(size_t(n)) {}
  void fill(const AttentionGeom& g, int64_t b, int64_t h, int64_t t0) {
    for (size_t i = 0; i < lo0.size(); ++i) {
      const DropoutRow r(g.dropout_seed, dropout_row(g, b, h, t0 + int64_t(i)));
      lo0[i] = r.lo0, key0[i] = r.key0, key1[i] = r.key1;
    }
  }
  /// dropout_keep of key s for query t0 + i.
  bool keep(int64_t i, int64_t s, float p) const {
    return DropoutRow::keep(lo0[size_t(i)], key0[size_t(i)], key1[size_t(i)], s, p);
  }
};

/// Row (i0, i1, i2) of a tensor read through three element strides (features contiguous).
template <class P> P at(P base, const int64_t* stride, int64_t i0, int64_t i1, int64_t i2) {
  return base + i0 * stride[0] + i1 * stride[1] + i2 * stride[2];
}

template <class T> T dot(const T* a, const T* b, int64_t n) {
  T acc = 0;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

template <class T> void axpy_row(T* y, T alpha, const T* x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// ---------------------------------------------------------------------------------------------------------------
// Tile products.

/// SIMD vectors as GCC/Clang vector extensions: the micro-kernel's accumulators must live in registers, which
/// plain loops over an accumulator array do not guarantee. As wide as the target's registers (AVX-512: 64 bytes,
/// AVX: 32; CPU recipe, attention forward + backward per step: 5.3 ms with 32-byte vectors and 16 x 16 tiles,
/// 4.2 ms with 64-byte vectors and 32 x 32 tiles).
#if defined(__AVX512F__)
constexpr int kVecBytes = 64;
#elif defined(__AVX__)
constexpr int kVecBytes = 32;
#else
constexpr int kVecBytes = 16;
#endif
template <class T> struct Simd;
template <> struct Simd<float> { typedef float V __attribute__((vector_size(kVecBytes))); };
template <> struct Simd<double> { typedef double V __attribute__((vector_size(kVecBytes))); };
template <class T> using Vec = typename Simd<T>::V;
template <class T> constexpr int64_t kLanes = int64_t(sizeof(Vec<T>) / sizeof(T));

template <class T> inline Vec<T> load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T> inline void store(T* p, Vec<T> v) { std::memcpy(p, &v, sizeof v); }
template <class T> inline Vec<T> splat(T x) { return Vec<T>{} + x; }
template <class T> inline T hsum(Vec<T> v) {
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
template <class T> int64_t pad_row(T* row, int64_t n) {
  const int64_t n_pad = round_up(n, kLanes<T>);
  std::fill(row + n, row + n_pad, kNegInf<T>);
  return n_pad;
}

/// Columns per register block: two vectors.
template <class T> constexpr int64_t kCols = 2 * kLanes<T>;
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
  for (; r + kRows <= M; r += kRows) matmul_rows<T, kRows>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate);
  if (r + 4 <= M) matmul_rows<T, 4>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate), r += 4;
  if (r + 2 <= M) matmul_rows<T, 2>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate), r += 2;
  if (r < M) matmul_rows<T, 1>(C + r * ldc, ldc, A + r * ars, ars, aks, B, ldb, K, N, accumulate);
}

/// dst[0, n) = src[0, n) rounded to bf16 (round_bf16 is branch-free, so the loop vectorizes).
inline void round_row(float* __restrict dst, const float* __restrict src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = round_bf16(src[i]);
}

/// The flash kernels' tile products, one per thread: matmul_tile, or with bf16 attention math (AttentionMath::BF16,
/// float only) each operand rounded to bf16 and the products summed in f32, as PyTorch's CPU autocast computes them:
/// on AMX-BF16 tiles where gemm's bf16 products run there (bf16_kernel()), else rounded into scratch for the f32 units.
template <class T>
class TileProducts {
 public:
  explicit TileProducts(const AttentionGeom& g) {
    if constexpr (std::is_same_v<T, float>) {
      if (g.math != AttentionMath::BF16) return;
      if (bf16_kernel() == Bf16Kernel::Amx) {
        amx_.emplace();
      } else {
        round_ = true;
      }
    }
  }

  /// C (M x N, row stride ldc) (+)= A (M x K, element (r, k) at A[r * ars + k * aks]; ars or aks is 1) @ B (K x N,
  /// row stride ldb).
  void operator()(T* C, int64_t ldc, const T* A, int64_t ars, int64_t aks, const T* B, int64_t ldb, int64_t M,
                  int64_t K, int64_t N, bool accumulate) {
    if constexpr (std::is_same_v<T, float>) {
      if (amx_) return amx_->product(C, ldc, A, ars, aks, B, ldb, M, K, N, accumulate);
      if (round_) {
        ra_.resize(size_t(M * K));
        rb_.resize(size_t(K * N));
        const bool k_contig = aks == 1;  // the rounded copy keeps A's orientation: rows of K, or columns of M
        if (k_contig) {
          for (int64_t r = 0; r < M; ++r) round_row(ra_.data() + r * K, A + r * ars, K);
        } else {
          for (int64_t k = 0; k < K; ++k) round_row(ra_.data() + k * M, A + k * aks, M);
        }
        for (int64_t k = 0; k < K; ++k) round_row(rb_.data() + k * N, B + k * ldb, N);
        return matmul_tile(C, ldc, ra_.data(), k_contig ? K : 1, k_contig ? 1 : M, rb_.data(), N, M, K, N, accumulate);
      }
    }
    matmul_tile(C, ldc, A, ars, aks, B, ldb, M, K, N, accumulate);
  }

 private:
  std::optional<AmxTiles> amx_;
  bool round_ = false;
  std::vector<T> ra_, rb_;
};

/// dst (D x ld) = rows [0, n) of src (row stride src_stride, D contiguous features) transposed; columns
/// [n, round_up(n, kCols)) are zeroed so the tile products can run whole register blocks.
template <class T>
void pack_transposed(T* dst, int64_t ld, const T* src, int64_t src_stride, int64_t n, int64_t D) {
  const int64_t n_pad = round_up(n, kCols<T>);
  for (int64_t s = 0; s < n; ++s) {
    const T* row = src + s * src_stride;
    for (int64_t d = 0; d < D; ++d) dst[d * ld + s] = row[d];
  }
  for (int64_t d = 0; d < D; ++d) std::fill(dst + d * ld + n, dst + d * ld + n_pad, T(0));
}

struct Tiles {
  int64_t Br, Bc;  // both multiples of kCols: query lanes and key columns are padded to whole register blocks
};

/// Tile sizes by head dim (see the header comment for the measurements).
inline Tiles flash_tiles(const AttentionGeom& g) {
  if (std::max(g.E, g.Ev) > 128) return Tiles{32, 32};
  // bf16 operands: every product packs its operands, so larger tiles pay (bench_attention --bf16 on AMX, fwd+bwd
  // against f32: B=12 NH=4 T=128 E=32 at 32 x 32 0.94x, 64 x 64 1.14x, 128 x 128 1.07x; B=64 NH=6 T=256 E=64 at
  // 64 x 64 1.35x, 128 x 128 1.57x).
  if (g.math == AttentionMath::BF16 && bf16_kernel() == Bf16Kernel::Amx)
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
                      int64_t s0, const T* mask, const uint8_t* kp, const AttentionGeom& g) {
  const T scale = T(g.scale);
  for (int64_t j = 0; j < nc; ++j) {
    T* row = st + j * ld;
    if (kp && kp[b * g.S + s0 + j]) {
      std::fill(row, row + n_pad, kNegInf<T>);
      continue;
    }
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
      const DropoutRow drop(g.dropout_seed, dropout_row(g, b, h, t) + s0);
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


// ---------------------------------------------------------------------------------------------------------------
// Score modifiers (kernels/score_mods.h). When any is on, the logits and gradients of a tile come from the two
// per-element functions below instead of the plain paths above; the naive kernels call the same two.

/// Row of query t of head (b, h) in a (B, NH, T, ...) array: lse, D, and the (B, NH, T, 2m + 1) ones below.
inline int64_t head_row(const AttentionGeom& g, int64_t b, int64_t h, int64_t t) { return (b * g.NH + h) * g.T + t; }

/// Shaw's relative positions per query row, (B, NH, T, 2m + 1) each, null when unused: R = Q A_K^T (forward and
/// backward), G = dO A_V^T and dR, the raw-product gradients summed per clipped distance (backward).
template <class T>
struct RelRows {
  const T* R = nullptr;
  const T* G = nullptr;
  T* dR = nullptr;
};

/// The (b, h) block of a tensor read through three strides: its first query row (rows follow at stride[2]).
template <class P> P head_block(P base, const int64_t* stride, int64_t bh, int64_t NH) {
  return base + bh / NH * stride[0] + bh % NH * stride[1];
}

/// out[row, c] = x_row . table[c] for every query row (b, h, t) of x (read through `stride`) and c < 2m + 1: one
/// GEMM per head, (T, D) @ (D, 2m + 1).
template <class T>
std::vector<T> rows_times_table(const T* x, const int64_t* stride, const T* table, int64_t D, const AttentionGeom& g) {
  const int64_t W = g.mods.rel_width(), heads = g.B * g.NH;
  std::vector<T> out(size_t(heads * g.T * W));
#pragma omp parallel for if (heads * g.T * W * D >= kParallelGrain)
  for (int64_t bh = 0; bh < heads; ++bh) {
    gemm(false, true, g.T, W, D, T(1), head_block(x, stride, bh, g.NH), stride[2], table, D, T(0), out.data() + bh * g.T * W, W);
  }
  return out;
}

/// y_row += coef[row] @ table for every query row of y (read through `stride`): dQ += dR A_K, O += Pbar A_V.
template <class T>
void add_rows_times_table(T* y, const int64_t* stride, const T* coef, const T* table, int64_t D, const AttentionGeom& g) {
  const int64_t W = g.mods.rel_width(), heads = g.B * g.NH;
#pragma omp parallel for if (heads * g.T * W * D >= kParallelGrain)
  for (int64_t bh = 0; bh < heads; ++bh) {
    gemm(false, false, g.T, D, W, T(1), coef + bh * g.T * W, W, table, D, T(1), head_block(y, stride, bh, g.NH), stride[2]);
  }
}

/// dtable += coef^T y over every query row: dA_K += dR^T Q, dA_V += Pbar^T dO. One GEMM per head, heads in order:
/// deterministic.
template <class T>
void add_table_grad(T* dtable, const T* coef, const T* y, const int64_t* stride, int64_t D, const AttentionGeom& g) {
  const int64_t W = g.mods.rel_width();
  for (int64_t bh = 0; bh < g.B * g.NH; ++bh) {
    gemm(true, false, W, D, g.T, T(1), coef + bh * g.T * W, W, head_block(y, stride, bh, g.NH), stride[2], T(1), dtable, D);
  }
}

/// The relative rows a kernel call needs, computed once per call. Forward: R. Backward: R, G, and dR when dQ or
/// dA_K is wanted; finish() then adds dR A_K to dQ, dR^T Q to dA_K and Pbar^T dO to dA_V.
template <class T>
struct RelBuffers {
  std::vector<T> R, G, dR;

  RelBuffers(const AttentionGeom& g, const T* q, const T* dout, bool want_dq) {
    const ScoreMods& m = g.mods;
    if (m.rel_k) R = rows_times_table(q, g.q_stride, static_cast<const T*>(m.rel_k), g.E, g);
    if (dout && m.rel_v) G = rows_times_table(dout, g.o_stride, static_cast<const T*>(m.rel_v), g.Ev, g);
    if (dout && m.rel_k && (want_dq || m.d_rel_k)) dR.assign(size_t(g.B * g.NH * g.T * m.rel_width()), T(0));
  }
  RelRows<T> rows() { return {R.empty() ? nullptr : R.data(), G.empty() ? nullptr : G.data(), dR.empty() ? nullptr : dR.data()}; }

  void finish(T* dq, const T* dout, const T* q, const AttentionGeom& g) const {
    const ScoreMods& m = g.mods;
    if (!dR.empty() && dq) add_rows_times_table(dq, g.q_stride, dR.data(), static_cast<const T*>(m.rel_k), g.E, g);
    if (!dR.empty() && m.d_rel_k) add_table_grad(static_cast<T*>(m.d_rel_k), dR.data(), q, g.q_stride, g.E, g);
    if (m.rel_v && m.d_rel_v) {
      add_table_grad(static_cast<T*>(m.d_rel_v), static_cast<const T*>(m.rel_probs), dout, g.o_stride, g.Ev, g);
    }
  }
};

/// The output's relative-value term after the attention proper: O += Pbar A_V.
template <class T>
void add_relative_values(T* out, const AttentionGeom& g) {
  if (g.mods.rel_v) {
    add_rows_times_table(out, g.o_stride, static_cast<const T*>(g.mods.rel_probs), static_cast<const T*>(g.mods.rel_v), g.Ev, g);
  }
}

/// The logit of (t, s) from its raw product x = q_t . k_s, -inf where the key is hidden; `bias` is
/// position_bias(g, h, s - tq) and `capped` receives the soft-capped scaled score (what the backward needs).
template <class T>
inline T modified_logit(const AttentionGeom& g, int64_t b, int64_t h, int64_t t, int64_t s, T x, T bias, const T* mask,
                        const uint8_t* kp, const RelRows<T>& rel, T& capped) {
  if (!mods_visible(g, b, t, s) || (kp && kp[b * g.S + s])) return kNegInf<T>;
  const ScoreMods& m = g.mods;
  if (rel.R) x += rel.R[head_row(g, b, h, t) * m.rel_width() + rel_column(s - (t + g.S - g.T), m.max_rel)];
  capped = softcap_forward(x * T(g.scale), m.softcap);
  T logit = capped + bias;
  if (mask) logit += at(mask, g.mask_stride, b, h, t)[s * g.mask_stride[3]];
  return logit;
}

/// One element of the backward: raw product x and dp = dO_t . v_s in, the dropped probability Pd and the raw
/// product's gradient dS out (both 0 where hidden). With `tables`, the learned tables' gradients are summed too:
/// into dR's row of t (owned by the caller) and dt5 (the caller's partial sum for head h, t5_buckets long).
template <class T>
inline void modified_element_backward(const AttentionGeom& g, int64_t b, int64_t h, int64_t t, int64_t s, T& x, T& dp,
                                      T bias, int32_t bucket, const T* lse, const T* D, const T* mask, const uint8_t* kp,
                                      const RelRows<T>& rel, bool tables, T* dt5) {
  const ScoreMods& m = g.mods;
  const int64_t row = head_row(g, b, h, t), col = rel_column(s - (t + g.S - g.T), m.max_rel);
  T capped = 0;
  const T logit = lse[row] == kNegInf<T> ? kNegInf<T> : modified_logit(g, b, h, t, s, x, bias, mask, kp, rel, capped);
  if (logit == kNegInf<T>) {
    x = dp = T(0);
    return;
  }
  const T p = std::exp(logit - lse[row]);
  if (rel.G) dp += rel.G[row * m.rel_width() + col];
  T f = 1;
  if (g.dropout_p > 0.0f) {
    f = dropout_keep(g.dropout_seed, dropout_row(g, b, h, t) + s, g.dropout_p) ? dropout_scale<T>(g.dropout_p) : T(0);
  }
  const T dlogit = p * (dp * f - D[row]);
  const T ds = dlogit * softcap_grad(capped, m.softcap) * T(g.scale);
  if (tables) {
    if (dt5) dt5[bucket] += dlogit;
    if (rel.dR) rel.dR[row * m.rel_width() + col] += ds;
  }
  x = p * f;
  dp = ds;
}

/// tanh of every lane, from exp_vec: sign(y) (1 - e) / (1 + e) with e = exp(-2 |y|) (absolute error a few ulp of 1).
inline Vec<float> tanh_vec(Vec<float> y) {
  const Vec<float> a = y < 0.0f ? -y : y;
  const Vec<float> e = exp_vec(a * -2.0f);
  const Vec<float> t = (1.0f - e) / (1.0f + e);
  return y < 0.0f ? -t : t;
}
inline Vec<double> tanh_vec(Vec<double> y) {
  for (int64_t i = 0; i < kLanes<double>; ++i) y[i] = std::tanh(y[i]);
  return y;
}

/// The biases after the cap (ALiBi, T5) of every head and distance d in [-(S - 1), T - 1], computed once per kernel
/// call, in both lane orders: fwd (d growing along a row: query-major rows) and rev (d falling: key-major rows),
/// with kCols zeros of slack at both ends for padded lanes; T5's buckets likewise, for its gradient.
template <class T>
struct PositionBias {
  bool on = false;
  int64_t dmin = 0, dmax = 0, stride = 0;
  std::vector<T> fwd, rev;                    // (NH, stride)
  std::vector<int32_t> bucket_fwd, bucket_rev;  // (stride)

  explicit PositionBias(const AttentionGeom& g) : on(g.mods.alibi || g.mods.t5_bias) {
    if (!on) return;
    dmin = -(g.S - 1), dmax = g.T - 1, stride = dmax - dmin + 1 + 2 * kCols<T>;
    fwd.assign(size_t(g.NH * stride), T(0));
    rev.assign(size_t(g.NH * stride), T(0));
    for (int64_t h = 0; h < g.NH; ++h) {
      for (int64_t d = dmin; d <= dmax; ++d) {
        const T x = position_bias<T>(g, h, d);
        fwd[size_t(h * stride + kCols<T> + d - dmin)] = x;
        rev[size_t(h * stride + kCols<T> + dmax - d)] = x;
      }
    }
    if (!g.mods.t5_bias) return;
    bucket_fwd.assign(size_t(stride), 0);
    bucket_rev.assign(size_t(stride), 0);
    for (int64_t d = dmin; d <= dmax; ++d) {
      const int32_t k = t5_bucket(d, g.mods.t5_buckets, g.mods.t5_max_distance, g.mods.t5_bidirectional);
      bucket_fwd[size_t(kCols<T> + d - dmin)] = k;
      bucket_rev[size_t(kCols<T> + dmax - d)] = k;
    }
  }
  /// Offsets of a row whose lane 0 has distance d: in fwd and bucket_fwd (d grows), rev and bucket_rev (d falls).
  int64_t at_fwd(int64_t d) const { return kCols<T> + d - dmin; }
  int64_t at_rev(int64_t d) const { return kCols<T> + dmax - d; }
};

/// Per-thread scratch of ModTile: the capped scores of a tile, which the soft-cap's gradient needs; for Shaw's
/// tables in key-major tiles, the first and last (clipped) columns of R, G and dR for the tile's queries, contiguous.
template <class T>
struct ModScratch {
  std::vector<T> capped;
  std::vector<T> R_ends, G_ends, dR_ends;  // (2, nr): column 0, then column 2m
  std::vector<T> pbar_ends;                // add_rel_probs's sums of the clipped lanes, likewise
};

/// The lanes [lo, hi) of a row split by Shaw's clipped column, lane l at distance d0 + l (query-major rows: lanes are
/// keys) or d0 - l (key-major: lanes are queries). [lo, a) and [b, hi) are clipped (query-major: to column 0, then
/// 2m; key-major: 2m, then 0), [a, b) is the band |d| < m, lane l in column d + m.
struct RelSplit {
  int64_t a, b;
};
inline RelSplit rel_split(int64_t lo, int64_t hi, int64_t d0, bool key_major, int64_t m) {
  if (!key_major) {
    const int64_t a = std::clamp(-m - d0 + 1, lo, hi);
    return {a, std::clamp(m - d0, a, hi)};
  }
  const int64_t a = std::clamp(d0 - m + 1, lo, hi);
  return {a, std::clamp(d0 + m, a, hi)};
}

/// The first and last columns of `table`'s rows first_row .. first_row + n - 1, as two contiguous runs of n.
template <class T>
void table_ends(std::vector<T>& ends, const T* table, int64_t first_row, int64_t n, int64_t W) {
  ends.resize(size_t(2 * n));
  for (int64_t i = 0; i < n; ++i) {
    ends[size_t(i)] = table[(first_row + i) * W];
    ends[size_t(n + i)] = table[(first_row + i) * W + W - 1];
  }
}

/// The modifiers over a tile of queries [t0, t0 + nr) and keys [s0, s0 + nc) of head (b, h), row by row with the
/// row's lanes contiguous: key-major tiles (row j = key s0 + j, lanes = queries) and query-major ones (row i = query
/// t0 + i, lanes = keys). Element (i, j) has distance d = c0 + j - i. The biases and T5 buckets depend on d only, so
/// they are computed once per tile, in both lane orders: bias_fwd[d - dmin] (query-major rows, d grows along the
/// lanes) and bias_rev[dmax - d] (key-major rows, d falls). Scaling, the soft-cap and the biases run on whole
/// vectors; Shaw's R, G and dR by runs of lanes (the lanes clipped to the first or last column, then the band
/// |d| < m); the mask, documents, padding and T5's gradient per visible element.
template <class T>
class ModTile {
 public:
  ModTile(const AttentionGeom& g, int64_t b, int64_t h, int64_t t0, int64_t nr, int64_t s0, int64_t nc,
          const RelRows<T>& rel, const PositionBias<T>& pb, ModScratch<T>& sc)
      : g_(g), m_(g.mods), b_(b), h_(h), t0_(t0), nr_(nr), s0_(s0), nc_(nc), c0_(s0 - t0 - (g.S - g.T)), rel_(rel),
        pb_(pb), sc_(sc) {}

  /// Key-major raw products st (row stride ld, lanes [0, lanes) computed) -> logits; hidden and padding lanes -inf.
  void logits_key_major(T* st, int64_t ld, int64_t lanes, const T* mask, const uint8_t* kp) {
    if (rel_.R) table_ends(sc_.R_ends, rel_.R, head_row(g_, b_, h_, t0_), nr_, m_.rel_width());
    for (int64_t j = 0; j < nc_; ++j) key_row(j, st + j * ld, lanes, mask, kp, capped_row(j, ld));
  }

  /// Key-major raw products st and dO.v products dpt -> Pd and dS (the raw product's gradient), with the tables'
  /// gradients: dR's rows, and with T5 the logits' gradients summed per distance into by_distance (laid out as
  /// PositionBias::rev; the caller folds it into buckets). lse_t and D_t per query lane (+inf for a query that sees
  /// nothing).
  void probs_and_ds_key_major(T* st, T* dpt, int64_t ld, int64_t lanes, const T* lse_t, const T* D_t, const T* mask,
                              const uint8_t* kp, T* by_distance) {
    const int64_t W = m_.rel_width(), row0 = head_row(g_, b_, h_, t0_);
    if (rel_.R) table_ends(sc_.R_ends, rel_.R, row0, nr_, W);
    if (rel_.G) table_ends(sc_.G_ends, rel_.G, row0, nr_, W);
    if (rel_.dR) sc_.dR_ends.assign(size_t(2 * nr_), T(0));
    for (int64_t j = 0; j < nc_; ++j) {
      T* capped = capped_row(j, ld);
      const Span v = key_row(j, st + j * ld, lanes, mask, kp, capped);
      backward_row(st + j * ld, dpt + j * ld, lanes, v, lse_t, D_t, true, capped, true,
                   by_distance ? by_distance + pb_.at_rev(c0_ + j) : nullptr, [&](int64_t l) { return Where{t0_ + l, s0_ + j}; });
    }
    for (int64_t i = 0; i < nr_ && rel_.dR; ++i) {  // the clipped lanes' sums into the first and last columns
      rel_.dR[(row0 + i) * W] += sc_.dR_ends[size_t(i)];
      rel_.dR[(row0 + i) * W + W - 1] += sc_.dR_ends[size_t(nr_ + i)];
    }
  }

  /// Query-major raw products s and dp (row stride ld, lanes [0, lanes)) -> Pd and dS; no table gradients.
  void probs_and_ds_query_major(T* s, T* dp, int64_t ld, int64_t lanes, const T* lse, const T* D, const T* mask,
                                const uint8_t* kp) {
    for (int64_t i = 0; i < nr_; ++i) {
      const int64_t t = t0_ + i, row = head_row(g_, b_, h_, t);
      T* x = s + i * ld;
      T* d = dp + i * ld;
      if (lse[row] == kNegInf<T>) {
        std::fill(x, x + lanes, T(0));
        std::fill(d, d + lanes, T(0));
        continue;
      }
      T* capped = m_.softcap > 0 ? scratch_capped(ld) + i * ld : nullptr;
      const Span v = span(std::clamp<int64_t>(key_begin(g_, t) - s0_, 0, nc_), std::clamp<int64_t>(key_end(g_, t) - s0_, 0, nc_));
      auto where = [&](int64_t l) { return Where{t, s0_ + l}; };
      forward_row(x, lanes, v, pb_.on ? pb_.fwd.data() + h_ * pb_.stride + pb_.at_fwd(c0_ - i) : nullptr, mask, kp, capped,
                  false, where);
      backward_row(x, d, lanes, v, lse + row, D + row, false, capped, false, nullptr, where);
    }
  }

 private:
  struct Where {
    int64_t t, s;
  };
  struct Span {
    int64_t lo, hi;  // visible lanes by position (causal, window): [lo, hi)
  };
  static Span span(int64_t lo, int64_t hi) { return {lo, std::max(lo, hi)}; }

  T* scratch_capped(int64_t ld) {
    const size_t need = size_t(std::max(nr_, nc_) * ld + kCols<T>);
    if (sc_.capped.size() < need) sc_.capped.resize(need);
    return sc_.capped.data();
  }
  T* capped_row(int64_t j, int64_t ld) { return m_.softcap > 0 ? scratch_capped(ld) + j * ld : nullptr; }

  /// One key-major row (key s0 + j): its visible queries, then forward_row.
  Span key_row(int64_t j, T* x, int64_t lanes, const T* mask, const uint8_t* kp, T* capped) {
    const int64_t s = s0_ + j;
    const Span v = span(std::clamp<int64_t>(query_begin(g_, s) - t0_, 0, nr_), std::clamp<int64_t>(query_end(g_, s) - t0_, 0, nr_));
    const T* bias = pb_.on ? pb_.rev.data() + h_ * pb_.stride + pb_.at_rev(c0_ + j) : nullptr;
    forward_row(x, lanes, v, bias, mask, kp, capped, true, [&](int64_t l) { return Where{t0_ + l, s}; });
    return v;
  }

  /// Raw products -> logits over one row's lanes: + Shaw's R, times scale, capped (kept in `capped`), + biases,
  /// + mask; -inf outside the visible span, for padded keys and for keys of other documents.
  template <class At>
  void forward_row(T* x, int64_t lanes, Span v, const T* bias, const T* mask, const uint8_t* kp, T* capped,
                   bool key_major, At where) {
    constexpr int64_t L = kLanes<T>;
    if (rel_.R) add_by_distance(x, v, rel_.R, sc_.R_ends, key_major, where(0));
    const Vec<T> scale = splat(T(g_.scale)), cap = splat(T(m_.softcap)), inv_cap = splat(T(m_.softcap > 0 ? 1.0 / m_.softcap : 0.0));
    for (int64_t l = 0; l < lanes; l += L) {
      Vec<T> y = load(x + l) * scale;
      if (m_.softcap > 0) {
        y = cap * tanh_vec(y * inv_cap);
        store(capped + l, y);
      }
      store(x + l, bias ? y + load(bias + l) : y);
    }
    for (int64_t l = v.lo; l < v.hi && mask; ++l) {
      const Where w = where(l);
      x[l] += at(mask, g_.mask_stride, b_, h_, w.t)[w.s * g_.mask_stride[3]];
    }
    // Padded keys and other documents: a key-major row has one key (and lanes of queries), a query-major row lanes of
    // keys; the lanes' ids are contiguous either way.
    const Where w0 = where(0);
    const uint8_t* kp_lanes = kp ? kp + b_ * g_.S + w0.s : nullptr;
    if (kp && key_major && kp_lanes[0]) v.hi = v.lo;  // the whole row is a padded key
    for (int64_t l = v.lo; l < v.hi && kp && !key_major; ++l) x[l] = kp_lanes[l] ? kNegInf<T> : x[l];
    if (m_.q_doc) {
      const int32_t* lane_doc = key_major ? m_.q_doc + b_ * g_.T + w0.t : m_.k_doc + b_ * g_.S + w0.s;
      const int32_t row_doc = key_major ? m_.k_doc[b_ * g_.S + w0.s] : m_.q_doc[b_ * g_.T + w0.t];
      for (int64_t l = v.lo; l < v.hi; ++l) x[l] = lane_doc[l] != row_doc ? kNegInf<T> : x[l];
    }
    std::fill(x, x + std::min(v.lo, lanes), kNegInf<T>);
    std::fill(x + std::min(v.hi, lanes), x + lanes, kNegInf<T>);
  }

  /// Logits x and dO.v products dp of one row -> Pd and dS (modified_element_backward's math on whole vectors).
  /// lse and D per lane (per_lane) or one value for the row. With `tables`, the learned tables' gradients too: dR's
  /// rows (owned by the caller's task) and, with by_distance, the logits' gradients added lane by lane.
  template <class At>
  void backward_row(T* x, T* dp, int64_t lanes, Span v, const T* lse, const T* D, bool per_lane, const T* capped,
                    bool tables, T* by_distance, At where) {
    const bool key_major = per_lane;  // key-major rows have a query (its lse and D) per lane
    constexpr int64_t L = kLanes<T>;
    const Vec<T> scale = splat(T(g_.scale)), inv_cap = splat(T(m_.softcap > 0 ? 1.0 / m_.softcap : 0.0));
    auto lse_at = [&](int64_t l) { return per_lane ? load(lse + l) : splat(*lse); };
    auto D_at = [&](int64_t l) { return per_lane ? load(D + l) : splat(*D); };
    auto ds_of = [&](Vec<T> dlogit, int64_t l) {  // the raw product's gradient from the logit's
      Vec<T> ds = dlogit * scale;
      if (capped) {
        const Vec<T> r = load(capped + l) * inv_cap;
        ds *= T(1) - r * r;
      }
      return ds;
    };
    if (rel_.G) add_by_distance(dp, v, rel_.G, sc_.G_ends, key_major, where(0));
    const bool t5 = tables && by_distance;
    if (g_.dropout_p <= 0.0f && !t5) {  // the common case: one pass over whole vectors
      for (int64_t l = 0; l < lanes; l += L) {
        const Vec<T> p = exp_vec(load(x + l) - lse_at(l));
        store(x + l, p);
        store(dp + l, ds_of(p * (load(dp + l) - D_at(l)), l));
      }
    } else {
      for (int64_t l = 0; l < lanes; l += L) store(x + l, exp_vec(load(x + l) - lse_at(l)));
    }
    if (g_.dropout_p > 0.0f) {
      const T keep_scale = dropout_scale<T>(g_.dropout_p);
      for (int64_t l = v.lo; l < v.hi; ++l) {
        const Where w = where(l);
        const T f = dropout_keep(g_.dropout_seed, dropout_row(g_, b_, h_, w.t) + w.s, g_.dropout_p) ? keep_scale : T(0);
        const T p = x[l];
        dp[l] = p * (dp[l] * f - (per_lane ? D[l] : *D));
        x[l] = p * f;
      }
    } else if (t5) {
      for (int64_t l = 0; l < lanes; l += L) store(dp + l, load(x + l) * (load(dp + l) - D_at(l)));
    }
    if (g_.dropout_p > 0.0f || t5) {  // dp holds the logits' gradients: T5's table takes them, then to dS
      std::fill(dp, dp + std::min(v.lo, lanes), T(0));  // lanes the dropout loop skipped
      std::fill(dp + std::min(v.hi, lanes), dp + lanes, T(0));
      if (t5) {  // every lane: hidden ones hold exactly 0 (p = 0)
        for (int64_t l = 0; l < lanes; l += L) store(by_distance + l, load(by_distance + l) + load(dp + l));
      }
      for (int64_t l = 0; l < lanes; l += L) store(dp + l, ds_of(load(dp + l), l));
    }
    if (tables && rel_.dR) {  // key-major rows (pass 2): the clipped lanes into dR_ends, flushed by the caller
      const Where w0 = where(0);
      const int64_t d0 = w0.s - (w0.t + g_.S - g_.T), m = m_.max_rel, W = m_.rel_width();
      const RelSplit r = rel_split(v.lo, v.hi, d0, true, m);
      T* last = sc_.dR_ends.data() + nr_;
      T* first = sc_.dR_ends.data();
      for (int64_t l = v.lo; l < r.a; ++l) last[l] += dp[l];
      const int64_t band = head_row(g_, b_, h_, t0_) * W + d0 + m;  // lane l: dR[band + l (W - 1)]
      for (int64_t l = r.a; l < r.b; ++l) rel_.dR[band + l * (W - 1)] += dp[l];
      for (int64_t l = r.b; l < v.hi; ++l) first[l] += dp[l];
    }
    // Lanes outside the visible span (and padding lanes): exactly zero.
    std::fill(dp, dp + std::min(v.lo, lanes), T(0));
    std::fill(dp + std::min(v.hi, lanes), dp + lanes, T(0));
    std::fill(x, x + std::min(v.lo, lanes), T(0));
    std::fill(x + std::min(v.hi, lanes), x + lanes, T(0));
  }

  /// x[l] += table[(query of lane l), clipped column of lane l] over the lanes of v (Shaw's R or G gathered by
  /// distance): the clipped lanes as whole runs, then the band |d| < m. w0: lane 0's query and key. Key-major rows
  /// (lanes are the tile's queries) read the clipped columns from `ends` (table_ends of the tile's queries).
  void add_by_distance(T* x, Span v, const T* table, const std::vector<T>& ends, bool key_major, Where w0) const {
    const int64_t d0 = w0.s - (w0.t + g_.S - g_.T), m = m_.max_rel, W = m_.rel_width();
    const RelSplit r = rel_split(v.lo, v.hi, d0, key_major, m);
    if (!key_major) {  // one query: its row of the table, the band contiguous
      const T* row = table + head_row(g_, b_, h_, w0.t) * W;
      const T first = row[0], last = row[W - 1];
      for (int64_t l = v.lo; l < r.a; ++l) x[l] += first;
      for (int64_t l = r.a; l < r.b; ++l) x[l] += row[d0 + l + m];
      for (int64_t l = r.b; l < v.hi; ++l) x[l] += last;
      return;
    }
    const T* first = ends.data();
    const T* last = ends.data() + nr_;
    for (int64_t l = v.lo; l < r.a; ++l) x[l] += last[l];
    const int64_t band = head_row(g_, b_, h_, t0_) * W + d0 + m;  // lane l: table[band + l (W - 1)]
    for (int64_t l = r.a; l < r.b; ++l) x[l] += table[band + l * (W - 1)];
    for (int64_t l = r.b; l < v.hi; ++l) x[l] += first[l];
  }

  const AttentionGeom& g_;
  const ScoreMods& m_;
  int64_t b_, h_, t0_, nr_, s0_, nc_, c0_;
  const RelRows<T>& rel_;
  const PositionBias<T>& pb_;
  ModScratch<T>& sc_;
};

/// pbar (nr x (2m + 1)) += the probabilities of a key-major tile (queries [t0, t0 + nr), keys [s0, s0 + nc), row
/// stride ld) summed per clipped distance.
/// The clipped lanes of each key-major row are summed per query in `ends` (2 nr) first, the band added lane by lane.
template <class T>
void add_rel_probs(T* pbar, const T* st, int64_t ld, int64_t t0, int64_t nr, int64_t s0, int64_t nc, const AttentionGeom& g,
                   std::vector<T>& ends) {
  const int64_t W = g.mods.rel_width(), m = g.mods.max_rel;
  ends.assign(size_t(2 * nr), T(0));
  T* first = ends.data();
  T* last = ends.data() + nr;
  for (int64_t j = 0; j < nc; ++j) {
    const T* row = st + j * ld;
    const int64_t d0 = s0 + j - (t0 + g.S - g.T);  // lane i (query t0 + i): distance d0 - i
    const RelSplit r = rel_split(0, nr, d0, true, m);
    for (int64_t i = 0; i < r.a; ++i) last[i] += row[i];
    for (int64_t i = r.a; i < r.b; ++i) pbar[i * W + d0 - i + m] += row[i];
    for (int64_t i = r.b; i < nr; ++i) first[i] += row[i];
  }
  for (int64_t i = 0; i < nr; ++i) {
    pbar[i * W] += first[i];
    pbar[i * W + W - 1] += last[i];
  }
}

/// Whether any query of [t0, t0 + nr) can share a document with any key of [s0, s0 + nc): false when their ranges
/// of ids do not meet, so the tile is skipped whole (packed documents have ascending ids).
inline bool docs_may_meet(const AttentionGeom& g, int64_t b, int64_t t0, int64_t nr, int64_t s0, int64_t nc) {
  const ScoreMods& m = g.mods;
  if (!m.q_doc) return true;
  const auto [q_lo, q_hi] = std::minmax_element(m.q_doc + b * g.T + t0, m.q_doc + b * g.T + t0 + nr);
  const auto [k_lo, k_hi] = std::minmax_element(m.k_doc + b * g.S + s0, m.k_doc + b * g.S + s0 + nc);
  return !(*q_hi < *k_lo || *k_hi < *q_lo);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// Naive reference.

template <class T>
void attention_naive_forward(T* out, T* weights, T* lse, const T* q, const T* k, const T* v, const T* mask,
                             const uint8_t* key_padding, const AttentionGeom& g) {
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV, W = g.mods.rel_width();
  const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
  const bool mods = g.mods.any();
  T* pbar = g.mods.rel_v ? static_cast<T*>(g.mods.rel_probs) : nullptr;
  if (pbar) std::fill_n(pbar, rows * W, T(0));
  RelBuffers<T> relative(g, q, nullptr, false);
  const RelRows<T> rel = relative.rows();
#pragma omp parallel if (rows * g.S * (g.E + g.Ev) >= kParallelGrain)
  {
    std::vector<T> scratch(weights ? 0 : size_t(g.S));
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T, kvh = h / group;
      T* p = weights ? weights + row * g.S : scratch.data();
      const T* qr = at(q, g.q_stride, b, h, t);
      const T* mr = mask ? at(mask, g.mask_stride, b, h, t) : nullptr;
      const int64_t end = causal_end(g, t);
      T mx = kNegInf<T>;
      for (int64_t s = 0; s < g.S; ++s) {
        T x = kNegInf<T>;
        if (mods) {
          T capped;
          x = modified_logit(g, b, h, t, s, dot(qr, at(k, g.k_stride, b, kvh, s), g.E),
                             position_bias<T>(g, h, s - (t + g.S - g.T)), mask, key_padding, rel, capped);
        } else if (s < end && !(key_padding && key_padding[b * g.S + s])) {
          x = scale * dot(qr, at(k, g.k_stride, b, kvh, s), g.E);
          if (mr) x += mr[s * g.mask_stride[3]];
        }
        p[s] = x;
        mx = std::max(mx, x);
      }
      T* o = at(out, g.o_stride, b, h, t);
      std::fill_n(o, g.Ev, T(0));
      if (mx == kNegInf<T>) {  // no visible key
        std::fill_n(p, g.S, T(0));
        lse[row] = kNegInf<T>;
        continue;
      }
      T sum = 0;
      for (int64_t s = 0; s < g.S; ++s) sum += p[s] = std::exp(p[s] - mx);
      for (int64_t s = 0; s < g.S; ++s) p[s] /= sum;
      lse[row] = mx + std::log(sum);
      const DropoutRow drop(g.dropout_seed, dropout_row(g, b, h, t));
      for (int64_t s = 0; s < g.S; ++s) {
        T w = p[s];
        if (g.dropout_p > 0.0f) w = drop.keep(s, g.dropout_p) ? w * keep_scale : T(0);
        if (w != T(0)) axpy_row(o, w, at(v, g.v_stride, b, kvh, s), g.Ev);
        if (pbar) pbar[row * W + rel_column(s - (t + g.S - g.T), g.mods.max_rel)] += w;
      }
    }
  }
  add_relative_values(out, g);
}

template <class T>
void attention_naive_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* mask, const uint8_t* key_padding, const AttentionGeom& g) {
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV;
  const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
  const bool parallel = rows * g.S * (g.E + g.Ev) >= kParallelGrain;
  const bool mods = g.mods.any();
  bool tables = false;  // element() also sums the tables' gradients (in the serial loop at the end only)
  RelBuffers<T> relative(g, q, dout, dq != nullptr);
  const RelRows<T> rel = relative.rows();
  std::vector<T> D(static_cast<size_t>(rows));  // rowsum(dO * O)
#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T;
    D[row] = dot(at(dout, g.o_stride, b, h, t), at(out, g.o_stride, b, h, t), g.Ev);
  }
  // P, dP and dS of element (b, h, t, s); false when the key is invisible to the query (or both are 0).
  auto element = [&](int64_t b, int64_t h, int64_t t, int64_t s, T& pd, T& ds) {
    const int64_t row = (b * g.NH + h) * g.T + t, kvh = h / group;
    if (mods) {
      pd = dot(at(q, g.q_stride, b, h, t), at(k, g.k_stride, b, kvh, s), g.E);
      ds = dot(at(dout, g.o_stride, b, h, t), at(v, g.v_stride, b, kvh, s), g.Ev);
      const int64_t d = s - (t + g.S - g.T);
      const int32_t bucket = g.mods.t5_bias ? t5_bucket(d, g.mods.t5_buckets, g.mods.t5_max_distance, g.mods.t5_bidirectional) : 0;
      T* dt5 = tables && g.mods.d_t5_bias ? static_cast<T*>(g.mods.d_t5_bias) + h * g.mods.t5_buckets : nullptr;
      modified_element_backward(g, b, h, t, s, pd, ds, position_bias<T>(g, h, d), bucket, lse, D.data(), mask,
                                key_padding, rel, tables, dt5);
      return pd != T(0) || ds != T(0);
    }
    if (lse[row] == kNegInf<T> || s >= causal_end(g, t) || (key_padding && key_padding[b * g.S + s])) return false;
    T x = scale * dot(at(q, g.q_stride, b, h, t), at(k, g.k_stride, b, kvh, s), g.E);
    if (mask) x += at(mask, g.mask_stride, b, h, t)[s * g.mask_stride[3]];
    const T p = std::exp(x - lse[row]);
    T f = 1;
    if (g.dropout_p > 0.0f) f = dropout_keep(g.dropout_seed, dropout_row(g, b, h, t) + s, g.dropout_p) ? keep_scale : T(0);
    const T dp = dot(at(dout, g.o_stride, b, h, t), at(v, g.v_stride, b, kvh, s), g.Ev) * f;
    pd = p * f;
    ds = p * (dp - D[row]) * scale;
    return true;
  };
  if (dq) {
#pragma omp parallel for if (parallel)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T, kvh = h / group;
      T* dqr = at(dq, g.q_stride, b, h, t);
      for (int64_t s = 0; s < g.S; ++s) {
        T pd, ds;
        if (element(b, h, t, s, pd, ds)) axpy_row(dqr, ds, at(k, g.k_stride, b, kvh, s), g.E);
      }
    }
  }
  if (dk || dv) {
    // One task per (batch, kv head, key): it owns dk and dv of that key and sums over the group's heads.
    const int64_t keys = g.B * g.NKV * g.S;
#pragma omp parallel for if (parallel)
    for (int64_t key = 0; key < keys; ++key) {
      const int64_t b = key / (g.NKV * g.S), kvh = key / g.S % g.NKV, s = key % g.S;
      T* dkr = dk ? at(dk, g.k_stride, b, kvh, s) : nullptr;
      T* dvr = dv ? at(dv, g.v_stride, b, kvh, s) : nullptr;
      for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int64_t t = 0; t < g.T; ++t) {
          T pd, ds;
          if (!element(b, h, t, s, pd, ds)) continue;
          if (dvr) axpy_row(dvr, pd, at(dout, g.o_stride, b, h, t), g.Ev);
          if (dkr) axpy_row(dkr, ds, at(q, g.q_stride, b, h, t), g.E);
        }
      }
    }
  }
  if (rel.dR || g.mods.d_t5_bias) {  // dR and the T5 table's gradient, one element at a time
    tables = true;
    for (int64_t row = 0; row < rows; ++row) {
      for (int64_t s = 0; s < g.S; ++s) {
        T pd, ds;
        element(row / (g.NH * g.T), row / g.T % g.NH, row % g.T, s, pd, ds);
      }
    }
  }
  relative.finish(dq, dout, q, g);
}

// ---------------------------------------------------------------------------------------------------------------
// Flash attention.

template <class T>
void attention_flash_forward(T* out, T* lse, const T* q, const T* k, const T* v, const T* mask,
                             const uint8_t* key_padding, const AttentionGeom& g) {
  const Tiles tiles = flash_tiles(g);
  const int64_t Br = tiles.Br, Bc = tiles.Bc;  // plain variables: clang 14 cannot capture structured bindings
  const int64_t group = g.NH / g.NKV, n_qtiles = ceil_div(g.T, Br), tasks = g.B * g.NH * n_qtiles;
  const T keep_scale = dropout_scale<T>(g.dropout_p);
  const bool dropout = g.dropout_p > 0.0f, mods = g.mods.any();
  T* const rel_probs = g.mods.rel_v ? static_cast<T*>(g.mods.rel_probs) : nullptr;
  const int64_t W = g.mods.rel_width();
  RelBuffers<T> relative(g, q, nullptr, false);
  const RelRows<T> rel = relative.rows();
  const PositionBias<T> position(g);
  constexpr int64_t L = kLanes<T>;
#pragma omp parallel if (g.B * g.NH * g.T * g.S * (g.E + g.Ev) >= kParallelGrain)
  {
    // Per thread: Q^T tile, key-major score tile, output accumulator, and per-query m, l, exp(m_old - m_new);
    // with modifiers, the biases per distance and the probabilities per clipped distance (Pbar, unnormalized).
    std::vector<T> qt(size_t(g.E * Br)), st(size_t(Bc * Br)), o(size_t(Br * g.Ev));
    std::vector<T> m(static_cast<size_t>(Br)), l(static_cast<size_t>(Br)), m_sub(static_cast<size_t>(Br)),
        alpha(static_cast<size_t>(Br)), sums(static_cast<size_t>(Br));
    std::vector<T> pbar(rel_probs ? size_t(Br * W) : 0);
    DropoutRows drop(dropout ? Br : 0);  // the tile's query rows
    ModScratch<T> scratch;
    TileProducts<T> product(g);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      // Last query tiles first: under a causal mask they see the most keys, so the dynamic schedule ends evenly.
      const int64_t b = task / (g.NH * n_qtiles), h = task / n_qtiles % g.NH;
      const int64_t t0 = (n_qtiles - 1 - task % n_qtiles) * Br;
      const int64_t kvh = h / group, nr = std::min(Br, g.T - t0), n_pad = round_up(nr, kCols<T>);
      drop.fill(g, b, h, t0);
      pack_transposed(qt.data(), Br, at(q, g.q_stride, b, h, t0), g.q_stride[2], nr, g.E);
      std::fill(o.begin(), o.end(), T(0));
      std::fill(m.begin(), m.end(), kNegInf<T>);
      std::fill(l.begin(), l.end(), T(0));
      std::fill(pbar.begin(), pbar.end(), T(0));
      // Keys no query of the tile sees (past the last row's diagonal, before the first row's window) are skipped.
      const int64_t s_begin = key_begin(g, t0), s_end = key_end(g, t0 + nr - 1);
      for (int64_t s0 = s_begin; s0 < s_end; s0 += Bc) {
        const int64_t nc = std::min(Bc, s_end - s0);
        if (!docs_may_meet(g, b, t0, nr, s0, nc)) continue;
        product(st.data(), Br, at(k, g.k_stride, b, kvh, s0), g.k_stride[2], int64_t(1), qt.data(), Br, nc, g.E,
                    n_pad, false);
        if (mods) {
          ModTile<T>(g, b, h, t0, nr, s0, nc, rel, position, scratch).logits_key_major(st.data(), Br, n_pad, mask, key_padding);
        } else {
          key_major_logits(st.data(), Br, nc, nr, n_pad, b, h, t0, s0, mask, key_padding, g);
        }
        // Online softmax, every query lane at once: new running max, rescale factor, exponentials, row sums.
        std::copy(m.begin(), m.end(), m_sub.begin());
        for (int64_t j = 0; j < nc; ++j) {
          const T* row = st.data() + j * Br;
          for (int64_t i = 0; i < n_pad; ++i) m_sub[i] = std::max(m_sub[i], row[i]);
        }
        for (int64_t i = 0; i < n_pad; ++i) {
          const T m_new = m_sub[i];
          m_sub[i] = m_new == kNegInf<T> ? T(0) : m_new;  // a query that sees nothing yet: exp(-inf - 0) = 0
          alpha[i] = m[i] - m_sub[i];
          m[i] = m_new;
          sums[i] = 0;
        }
        for (int64_t i = 0; i < n_pad; i += L) store(alpha.data() + i, exp_vec(load(alpha.data() + i)));
        for (int64_t j = 0; j < nc; ++j) {
          T* row = st.data() + j * Br;
          for (int64_t i = 0; i < n_pad; i += L) {
            const Vec<T> p = exp_vec(load(row + i) - load(m_sub.data() + i));
            store(row + i, p);
            store(sums.data() + i, load(sums.data() + i) + p);
          }
        }
        for (int64_t i = 0; i < nr; ++i) {
          l[i] = l[i] * alpha[i] + sums[i];
          if (alpha[i] != T(1)) {
            T* orow = o.data() + i * g.Ev;
            for (int64_t e = 0; e < g.Ev; ++e) orow[e] *= alpha[i];
            if (rel_probs) for (int64_t c = 0; c < W; ++c) pbar[size_t(i * W + c)] *= alpha[i];
          }
        }
        if (dropout) {
          for (int64_t j = 0; j < nc; ++j) {
            T* row = st.data() + j * Br;
            for (int64_t i = 0; i < nr; ++i) {
              row[i] = drop.keep(i, s0 + j, g.dropout_p) ? row[i] * keep_scale : T(0);
            }
          }
        }
        if (rel_probs) add_rel_probs(pbar.data(), st.data(), Br, t0, nr, s0, nc, g, scratch.pbar_ends);
        // O += P V, P read transposed out of the key-major tile.
        product(o.data(), g.Ev, st.data(), int64_t(1), Br, at(v, g.v_stride, b, kvh, s0), g.v_stride[2], nr, nc,
                    g.Ev, true);
      }
      for (int64_t i = 0; i < nr; ++i) {
        T* orow = at(out, g.o_stride, b, h, t0 + i);
        T& lse_i = lse[(b * g.NH + h) * g.T + t0 + i];
        if (l[i] > T(0)) {
          const T inv = T(1) / l[i];
          for (int64_t e = 0; e < g.Ev; ++e) orow[e] = o[size_t(i * g.Ev + e)] * inv;
          lse_i = m[i] + std::log(l[i]);
          if (rel_probs) {
            for (int64_t c = 0; c < W; ++c) rel_probs[head_row(g, b, h, t0 + i) * W + c] = pbar[size_t(i * W + c)] * inv;
          }
        } else {
          std::fill_n(orow, g.Ev, T(0));
          lse_i = kNegInf<T>;
          if (rel_probs) std::fill_n(rel_probs + head_row(g, b, h, t0 + i) * W, W, T(0));
        }
      }
    }
  }
  add_relative_values(out, g);
}

template <class T>
void attention_flash_backward(T* dq, T* dk, T* dv, const T* dout, const T* q, const T* k, const T* v, const T* out,
                              const T* lse, const T* mask, const uint8_t* key_padding, const AttentionGeom& g) {
  const Tiles tiles = flash_tiles(g);
  const int64_t Br = tiles.Br, Bc = tiles.Bc;  // plain variables: clang 14 cannot capture structured bindings
  const int64_t rows = g.B * g.NH * g.T, group = g.NH / g.NKV;
  const bool parallel = rows * g.S * (g.E + g.Ev) >= kParallelGrain, mods = g.mods.any();
  RelBuffers<T> relative(g, q, dout, dq != nullptr);
  const RelRows<T> rel = relative.rows();
  const PositionBias<T> position(g);
  std::vector<T> D(static_cast<size_t>(rows));  // rowsum(dO * O), (B, NH, T)
#pragma omp parallel for if (parallel)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t b = row / (g.NH * g.T), h = row / g.T % g.NH, t = row % g.T;
    D[size_t(row)] = dot(at(dout, g.o_stride, b, h, t), at(out, g.o_stride, b, h, t), g.Ev);
    if (g.grads_unwritten && dq) std::fill_n(at(dq, g.q_stride, b, h, t), g.E, T(0));  // the passes below add
  }
  if (g.grads_unwritten) {
#pragma omp parallel for if (parallel)
    for (int64_t row = 0; row < g.B * g.NKV * g.S; ++row) {
      const int64_t b = row / (g.NKV * g.S), h = row / g.S % g.NKV, s = row % g.S;
      if (dk) std::fill_n(at(dk, g.k_stride, b, h, s), g.E, T(0));
      if (dv) std::fill_n(at(dv, g.v_stride, b, h, s), g.Ev, T(0));
    }
  }
  const int64_t os = g.o_stride[2], qs = g.q_stride[2], ks = g.k_stride[2], vs = g.v_stride[2];

  if (dk || dv) {  // pass 1: dK, dV per (batch, kv head, key tile), query-major tiles
    const int64_t n_ktiles = ceil_div(g.S, Bc), tasks = g.B * g.NKV * n_ktiles;
#pragma omp parallel if (parallel)
    {
      std::vector<T> kt(size_t(g.E * Bc)), vt(size_t(g.Ev * Bc)), s(size_t(Br * Bc)), dp(size_t(Br * Bc));
      std::vector<T> dk_acc(size_t(Bc * g.E)), dv_acc(size_t(Bc * g.Ev));
      ModScratch<T> scratch;
      TileProducts<T> product(g);
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t b = task / (g.NKV * n_ktiles), kvh = task / n_ktiles % g.NKV, s0 = task % n_ktiles * Bc;
        const int64_t nc = std::min(Bc, g.S - s0), nc_pad = round_up(nc, kCols<T>);
        // The queries that see any key of the tile (causal: s0 <= t + S - T; window); other query tiles are skipped.
        const int64_t t_first = query_begin(g, s0), t_end = query_end(g, s0 + nc - 1);
        if (t_first >= t_end) continue;
        pack_transposed(kt.data(), Bc, at(k, g.k_stride, b, kvh, s0), ks, nc, g.E);
        pack_transposed(vt.data(), Bc, at(v, g.v_stride, b, kvh, s0), vs, nc, g.Ev);
        std::fill(dk_acc.begin(), dk_acc.end(), T(0));
        std::fill(dv_acc.begin(), dv_acc.end(), T(0));
        for (int64_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int64_t t0 = t_first / Br * Br; t0 < t_end; t0 += Br) {
            const int64_t nr = std::min(Br, g.T - t0);
            if (!docs_may_meet(g, b, t0, nr, s0, nc)) continue;
            const T* q0 = at(q, g.q_stride, b, h, t0);
            const T* do0 = at(dout, g.o_stride, b, h, t0);
            product(s.data(), Bc, q0, qs, int64_t(1), kt.data(), Bc, nr, g.E, nc_pad, false);
            product(dp.data(), Bc, do0, os, int64_t(1), vt.data(), Bc, nr, g.Ev, nc_pad, false);
            if (mods) {
              ModTile<T>(g, b, h, t0, nr, s0, nc, rel, position, scratch)
                  .probs_and_ds_query_major(s.data(), dp.data(), Bc, nc_pad, lse, D.data(), mask, key_padding);
            } else {
              query_major_probs_and_ds(s.data(), dp.data(), Bc, nr, nc, b, h, t0, s0, lse, D.data(), mask, key_padding, g);
            }
            // dV += Pd^T dO and dK += dS^T Q: the tiles read transposed.
            if (dv) product(dv_acc.data(), g.Ev, s.data(), int64_t(1), Bc, do0, os, nc, nr, g.Ev, true);
            if (dk) product(dk_acc.data(), g.E, dp.data(), int64_t(1), Bc, q0, qs, nc, nr, g.E, true);
          }
        }
        for (int64_t j = 0; j < nc; ++j) {
          if (dk) axpy_row(at(dk, g.k_stride, b, kvh, s0 + j), T(1), dk_acc.data() + j * g.E, g.E);
          if (dv) axpy_row(at(dv, g.v_stride, b, kvh, s0 + j), T(1), dv_acc.data() + j * g.Ev, g.Ev);
        }
      }
    }
  }

  // pass 2: dQ per (batch, head, query tile), key-major tiles; also the learned tables' gradients: a task owns
  // dR's rows of its queries and sums T5's into its own partial, added up in task order at the end.
  if (dq || rel.dR || g.mods.d_t5_bias) {
    const int64_t n_qtiles = ceil_div(g.T, Br), tasks = g.B * g.NH * n_qtiles, buckets = g.mods.t5_buckets;
    std::vector<T> t5_partial(g.mods.d_t5_bias ? size_t(tasks * buckets) : 0);
    const T scale = T(g.scale), keep_scale = dropout_scale<T>(g.dropout_p);
    const bool dropout = g.dropout_p > 0.0f;
    constexpr int64_t L = kLanes<T>;
#pragma omp parallel if (parallel)
    {
      std::vector<T> qt(size_t(g.E * Br)), dot_(size_t(g.Ev * Br)), st(size_t(Bc * Br)), dpt(size_t(Bc * Br));
      std::vector<T> dq_acc(size_t(Br * g.E)), lse_t(static_cast<size_t>(Br)), D_t(static_cast<size_t>(Br));
      std::vector<T> by_distance(g.mods.d_t5_bias ? size_t(position.stride) : 0);  // T5: logits' gradients per distance
      DropoutRows drop(dropout ? Br : 0);  // the tile's query rows
      ModScratch<T> scratch;
      TileProducts<T> product(g);
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t b = task / (g.NH * n_qtiles), h = task / n_qtiles % g.NH;
        const int64_t t0 = (n_qtiles - 1 - task % n_qtiles) * Br;  // heaviest first, as in the forward pass
        const int64_t kvh = h / group, nr = std::min(Br, g.T - t0), n_pad = round_up(nr, kCols<T>);
        const int64_t s_begin = key_begin(g, t0), s_end = key_end(g, t0 + nr - 1);
        if (s_begin >= s_end) continue;
        drop.fill(g, b, h, t0);
        T* const dt5 = t5_partial.empty() ? nullptr : t5_partial.data() + task * buckets;
        std::fill(by_distance.begin(), by_distance.end(), T(0));
        pack_transposed(qt.data(), Br, at(q, g.q_stride, b, h, t0), qs, nr, g.E);
        pack_transposed(dot_.data(), Br, at(dout, g.o_stride, b, h, t0), os, nr, g.Ev);
        for (int64_t i = 0; i < n_pad; ++i) {
          // +inf for a query with no visible key (and for padding lanes): exp(x - inf) = 0 whatever x is.
          const T L_i = i < nr ? lse[(b * g.NH + h) * g.T + t0 + i] : kNegInf<T>;
          lse_t[size_t(i)] = L_i == kNegInf<T> ? std::numeric_limits<T>::infinity() : L_i;
          D_t[size_t(i)] = i < nr ? D[size_t((b * g.NH + h) * g.T + t0 + i)] : T(0);
        }
        std::fill(dq_acc.begin(), dq_acc.end(), T(0));
        for (int64_t s0 = s_begin; s0 < s_end; s0 += Bc) {
          const int64_t nc = std::min(Bc, s_end - s0);
          if (!docs_may_meet(g, b, t0, nr, s0, nc)) continue;
          const T* k0 = at(k, g.k_stride, b, kvh, s0);
          product(st.data(), Br, k0, ks, int64_t(1), qt.data(), Br, nc, g.E, n_pad, false);
          product(dpt.data(), Br, at(v, g.v_stride, b, kvh, s0), vs, int64_t(1), dot_.data(), Br, nc, g.Ev, n_pad, false);
          if (mods) {
            ModTile<T>(g, b, h, t0, nr, s0, nc, rel, position, scratch)
                .probs_and_ds_key_major(st.data(), dpt.data(), Br, n_pad, lse_t.data(), D_t.data(), mask, key_padding,
                                        dt5 ? by_distance.data() : nullptr);
          } else {
            key_major_logits(st.data(), Br, nc, nr, n_pad, b, h, t0, s0, mask, key_padding, g);
            for (int64_t j = 0; j < nc; ++j) {
              T* row = st.data() + j * Br;
              T* drow = dpt.data() + j * Br;
              for (int64_t i = 0; i < n_pad; i += L) {
                const Vec<T> p = exp_vec(load(row + i) - load(lse_t.data() + i));
                store(row + i, p);
                if (!dropout) store(drow + i, p * (load(drow + i) - load(D_t.data() + i)) * scale);
              }
              if (dropout) {
                for (int64_t i = 0; i < nr; ++i) {
                  const bool keep = drop.keep(i, s0 + j, g.dropout_p);
                  drow[i] = row[i] * (drow[i] * (keep ? keep_scale : T(0)) - D_t[size_t(i)]) * scale;
                }
              }
            }
          }
          // dQ += dS K, dS read transposed out of the key-major tile.
          if (dq) product(dq_acc.data(), g.E, dpt.data(), int64_t(1), Br, k0, ks, nr, nc, g.E, true);
        }
        for (size_t k = 0; k < by_distance.size() && dt5; ++k) dt5[position.bucket_rev[k]] += by_distance[k];
        if (!dq) continue;
        for (int64_t i = 0; i < nr; ++i) axpy_row(at(dq, g.q_stride, b, h, t0 + i), T(1), dq_acc.data() + i * g.E, g.E);
      }
    }
    for (int64_t task = 0; task < tasks && !t5_partial.empty(); ++task) {
      const int64_t h = task / n_qtiles % g.NH;
      axpy_row(static_cast<T*>(g.mods.d_t5_bias) + h * buckets, T(1), t5_partial.data() + task * buckets, buckets);
    }
  }
  relative.finish(dq, dout, q, g);
}

#define TINYGPT_INSTANTIATE(T)                                                                                        \
  template void attention_naive_forward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const uint8_t*,       \
                                           const AttentionGeom&);                                                     \
  template void attention_naive_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,  \
                                            const T*, const uint8_t*, const AttentionGeom&);                          \
  template void attention_flash_forward<T>(T*, T*, const T*, const T*, const T*, const T*, const uint8_t*,           \
                                           const AttentionGeom&);                                                     \
  template void attention_flash_backward<T>(T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,  \
                                            const T*, const uint8_t*, const AttentionGeom&);
TINYGPT_INSTANTIATE(float)
TINYGPT_INSTANTIATE(double)
#undef TINYGPT_INSTANTIATE

}  // namespace tinygpt::cpu
